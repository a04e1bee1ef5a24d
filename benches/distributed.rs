//! W17 / W18: the distributed feature on 2 processes on loopback (c10d's `ProcessGroupGloo`
//! through the shim).
//!
//! - **W17** `ProcessGroup::all_reduce(Sum)` of a float32 tensor, the Rust half of the
//!   side-by-side with Python's `torch.distributed` on the same Gloo code
//!   (`benches/python/allreduce_baseline.py`: same sizes, repetitions and timing). Per size
//!   (4 KB, 1 MB, 16 MB): warm-up calls, then timed repetitions; before each one the tensor is
//!   refilled with ones (so the values stay finite) and a barrier lines the ranks up; the time
//!   is that of the one `all_reduce` call. Rank 0 prints
//!   `W17_allreduce_<size>\t<ops/s of the best repetition>\t# <GB/s> ...` (algorithmic
//!   bandwidth: the tensor's bytes / the time).
//! - **W18** scaling of a data-parallel PPO-RLHF iteration (`PpoRlhfTrainer::with_collective`)
//!   at a fixed global batch: W11's flagship shape (vocab 259, 2 blocks × 64, hydra with 1
//!   unfrozen block, 64 prompts of 5 bytes, 12 new tokens, 4 PPO epochs of minibatches of 32)
//!   on one process, then the same 64 rollouts and 32-row global minibatches split over the
//!   ranks (each generates 64 / N and trains on minibatches of 32 / N, gradients summed).
//!   One thread per process; a warm-up iteration, then timed ones, each after a barrier.
//!   Prints `W18_ppo_rlhf_iteration_1proc` / `_<N>proc` (iterations/s of the best one) and the
//!   scaling efficiency `t₁ / (N · t_N)` (1 = perfect), with the rollout / update split; the
//!   same for GPT-2 small's trunk (`W18_ppo_rlhf_iteration_gpt2s_*`).
//!
//! Run without `RANK` (as `cargo bench --features distributed --bench distributed` does), the
//! binary runs W18's one-process half itself, then starts N copies of itself with torchrun's
//! variables (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR=127.0.0.1`, `MASTER_PORT` = a
//! free port) and waits for them. Prints `W<name>\t<ops/s>` lines (the format
//! `scripts/bench.sh` pairs with the Python side) and `#` lines with the details. Env:
//! `TORCHRL_BENCH_WORLD` (processes, default 2), `TORCHRL_BENCH_DIST=allreduce|ppo|both`
//! (default `both`), `TORCHRL_BENCH_DIST_SHAPE=flagship|gpt2s|both` (W18's shapes, default
//! `both`; `gpt2s` is GPT-2 small's 12 × 768 trunk, byte vocabulary, on W12's batch of 8:
//! compute-bound), `TORCHRL_BENCH_ITERS` (timed PPO iterations, default 4 / 2).

mod common;
use common::env_or;

use std::net::TcpListener;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};
use torchrl::distributed::{InitOptions, ProcessGroup, ReduceOp};
use torchrl::envs::llm::{RewardModelScorer, TokenEnv, TokenEnvConfig};
use torchrl::modules::llm::{
    ByteTokenizer, CausalLmWithHydraValueHead, CausalLmWithScoreHead, Gpt2Config, Gpt2Model,
    TextTokenizer,
};
use torchrl::trainers::api::Callbacks;
use torchrl::trainers::config::{GenKwargs, ScaleReward, TrlConfig};
use torchrl::trainers::parallel::{rank_seed, Collective, SharedCollective};
use torchrl::trainers::ppo::PpoRlhfTrainer;
use torchrl::{Generator, Result};

/// (name, float32 elements, warm-up calls, timed repetitions); the same table as the Python side.
const SIZES: &[(&str, i64, usize, usize)] = &[
    ("4KB", 1024, 50, 1000),
    ("1MB", 262_144, 10, 200),
    ("16MB", 4_194_304, 3, 30),
];

/// How long the parent waits for its ranks before killing them.
const DEADLINE: Duration = Duration::from_secs(600);

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port on 127.0.0.1")
}

/// The parent: spawns the ranks, waits for all of them; when one fails, kills the others.
fn launch(world: usize, extra: &[(String, String)]) -> i32 {
    let exe = std::env::current_exe().expect("current_exe");
    let port = free_port();
    let mut children: Vec<(usize, Child)> = (0..world)
        .map(|rank| {
            let child = Command::new(&exe)
                .env("RANK", rank.to_string())
                .env("LOCAL_RANK", rank.to_string())
                .env("WORLD_SIZE", world.to_string())
                .env("LOCAL_WORLD_SIZE", world.to_string())
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", port.to_string())
                .envs(extra.iter().map(|(k, v)| (k.as_str(), v.as_str())))
                .spawn()
                .expect("spawn a rank");
            (rank, child)
        })
        .collect();
    let start = Instant::now();
    let mut code = 0;
    let mut running = world;
    let mut done = vec![false; world];
    while running > 0 {
        for (i, (rank, child)) in children.iter_mut().enumerate() {
            if done[i] {
                continue;
            }
            if let Ok(Some(status)) = child.try_wait() {
                done[i] = true;
                running -= 1;
                if !status.success() {
                    eprintln!("distributed bench: rank {rank} failed: {status}");
                    code = 1;
                }
            }
        }
        if code != 0 || start.elapsed() > DEADLINE {
            if code == 0 {
                eprintln!("distributed bench: ranks still running after {DEADLINE:?}");
                code = 1;
            }
            for (i, (_, child)) in children.iter_mut().enumerate() {
                if !done[i] {
                    let _ = child.kill();
                    let _ = child.wait();
                }
            }
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    code
}

fn median(sorted: &[f64]) -> f64 {
    let n = sorted.len();
    if n % 2 == 1 {
        sorted[n / 2]
    } else {
        0.5 * (sorted[n / 2 - 1] + sorted[n / 2])
    }
}

/// W17 on one rank: times every size and, on rank 0, prints the lines.
fn allreduce(pg: &ProcessGroup) -> Result<()> {
    let world = pg.world_size() as f64;
    for &(name, numel, warmup, reps) in SIZES {
        let mut t = Tensor::ones([numel], (Kind::Float, Device::Cpu));
        for i in 0..warmup {
            let _ = t.fill_(1.0);
            pg.all_reduce(&mut t, ReduceOp::Sum)?;
            if i == 0 {
                // Every element is the world size after one sum of ones.
                let (lo, hi) = (t.min().double_value(&[]), t.max().double_value(&[]));
                assert!(
                    lo == world && hi == world,
                    "all_reduce of ones gave [{lo}, {hi}], expected {world}"
                );
            }
        }
        let mut times = Vec::with_capacity(reps);
        for _ in 0..reps {
            let _ = t.fill_(1.0);
            pg.barrier()?;
            let t0 = Instant::now();
            pg.all_reduce(&mut t, ReduceOp::Sum)?;
            times.push(t0.elapsed().as_secs_f64());
        }
        times.sort_by(f64::total_cmp);
        let (best, med) = (times[0], median(&times));
        if pg.is_main() {
            let bytes = (numel * 4) as f64;
            println!(
                "W17_allreduce_{name}\t{:.2}\t# {:.3} GB/s best, {:.3} GB/s median ({:.1} us best, \
                 {:.1} us median over {reps} reps, {} ranks, Rust ProcessGroup/Gloo)",
                1.0 / best,
                bytes / best / 1e9,
                bytes / med / 1e9,
                best * 1e6,
                med * 1e6,
                pg.world_size(),
            );
        }
    }
    pg.barrier()
}

/// W18's shapes: the model and the global batch (rollouts per iteration, PPO minibatch).
struct Shape {
    name: &'static str,
    layers: i64,
    width: i64,
    heads: i64,
    unfrozen: i64,
    rollouts: usize,
    minibatch: usize,
    prompt_len: usize,
    new_tokens: i64,
    iters: usize,
}

/// W11's flagship shape: 2 blocks × 64, 64 rollouts, minibatches of 32.
const FLAGSHIP: Shape = Shape {
    name: "W18_ppo_rlhf_iteration",
    layers: 2,
    width: 64,
    heads: 4,
    unfrozen: 1,
    rollouts: 64,
    minibatch: 32,
    prompt_len: 5,
    new_tokens: 12,
    iters: 4,
};

/// GPT-2 small's trunk (12 × 768, 12 heads; the byte vocabulary), W12's batch: 8 rollouts of
/// 16 + 16 tokens, minibatches of 8, hydra with 2 unfrozen blocks. Compute-bound, unlike the
/// flagship's shape, where the collectives' latency is a large share of a step.
const GPT2_SMALL: Shape = Shape {
    name: "W18_ppo_rlhf_iteration_gpt2s",
    layers: 12,
    width: 768,
    heads: 12,
    unfrozen: 2,
    rollouts: 8,
    minibatch: 8,
    prompt_len: 16,
    new_tokens: 16,
    iters: 2,
};

/// Best and median seconds per iteration, and the median rollout and update seconds.
struct PpoTimes {
    best: f64,
    median: f64,
    rollout: f64,
    update: f64,
}

/// W18 on one rank (`group` = `None`: the one-process run): a PPO-RLHF iteration of `shape`
/// with this rank's share of the global batch.
fn ppo_on(shape: &Shape, group: Option<SharedCollective>) -> Result<PpoTimes> {
    let iters = iters_of(shape);
    let (rank, world) = group
        .as_ref()
        .map_or((0, 1), |g| (g.rank(), g.world_size()));
    tch::manual_seed(0);
    let tok = ByteTokenizer::new();
    let cfg = Gpt2Config::new(tok.vocab_size())
        .with_n_positions(64)
        .with_n_embd(shape.width)
        .with_n_layer(shape.layers)
        .with_n_head(shape.heads)
        .with_special_tokens(None, tok.eos_token_id(), tok.pad_token_id());
    let vs = VarStore::new(Device::Cpu);
    let model = CausalLmWithHydraValueHead::new(&vs.root(), &cfg, shape.unfrozen)?;
    let rm_vs = VarStore::new(Device::Cpu);
    let rm =
        CausalLmWithScoreHead::from_model(&rm_vs.root(), Gpt2Model::new(&rm_vs.root(), &cfg)?)?;
    let local = shape.rollouts / world;
    let mut rng = Generator::new(rank_seed(0, rank));
    let prompts: Vec<Vec<i64>> = (0..local * (iters + 2))
        .map(|_| {
            (0..shape.prompt_len)
                .map(|_| 97 + rng.below(26) as i64)
                .collect()
        })
        .collect();
    let env_cfg = TokenEnvConfig::for_model(&cfg.facts())
        .with_max_new_tokens(shape.new_tokens)
        .with_batch_size(local as i64);
    let env = TokenEnv::new(env_cfg, prompts, Box::new(RewardModelScorer::new(rm)))?;
    let mut c = TrlConfig::default();
    c.train.batch_size = shape.minibatch / world;
    c.train.epochs = iters + 2; // never the last step: no final evaluate + save inside the timing
    c.train.log_interval = 1_000_000;
    c.train.eval_interval = 1_000_000;
    c.train.checkpoint_interval = 1_000_000;
    c.method.num_rollouts = local;
    c.method.chunk_size = local;
    c.method.ppo_epochs = 4;
    c.method.scale_reward = ScaleReward::Ignored;
    c.method.gen_kwargs = GenKwargs {
        max_new_tokens: shape.new_tokens as usize,
        top_k: 0,
        top_p: 1.0,
        do_sample: true,
        temperature: 1.0,
    };
    let mut trainer = PpoRlhfTrainer::new(c, model, env, Box::new(tok))?;
    if let Some(g) = group {
        trainer = trainer.with_collective(g)?;
    }
    let mut callbacks = Callbacks::new();
    trainer.iteration(&mut callbacks)?; // warm-up
    let (mut times, mut rollout, mut update) = (vec![], vec![], vec![]);
    for _ in 0..iters {
        trainer.collective().barrier()?;
        let t0 = Instant::now();
        let s = trainer.iteration(&mut callbacks)?;
        times.push(t0.elapsed().as_secs_f64());
        rollout.push(s.rollout_s);
        update.push(s.update_s);
    }
    trainer.collective().barrier()?;
    let sorted = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v
    };
    let (times, rollout, update) = (sorted(times), sorted(rollout), sorted(update));
    Ok(PpoTimes {
        best: times[0],
        median: median(&times),
        rollout: median(&rollout),
        update: median(&update),
    })
}

fn print_ppo(shape: &Shape, world: usize, t: &PpoTimes, one: Option<f64>) {
    let name = shape.name;
    println!("{name}_{world}proc\t{:.4}", 1.0 / t.best);
    let efficiency = one.map_or(String::new(), |t1| {
        format!(
            "; speed-up {:.2}x, scaling efficiency t1/({world}*t{world}) = {:.2}",
            t1 / t.best,
            t1 / (world as f64 * t.best)
        )
    });
    println!(
        "# {name}_{world}proc: {} x {} blocks, {} rollouts, global minibatch {}, {world} \
         process(es) x 1 thread; best {:.4} / median {:.4} s/iteration; median rollout {:.4} s, \
         update {:.4} s{efficiency}",
        shape.layers,
        shape.width,
        shape.rollouts,
        shape.minibatch,
        t.best,
        t.median,
        t.rollout,
        t.update
    );
}

/// The shapes `TORCHRL_BENCH_DIST_SHAPE` names (`flagship`, `gpt2s` or `both`, the default).
fn shapes() -> Vec<&'static Shape> {
    match std::env::var("TORCHRL_BENCH_DIST_SHAPE").as_deref() {
        Ok("flagship") => vec![&FLAGSHIP],
        Ok("gpt2s") => vec![&GPT2_SMALL],
        _ => vec![&FLAGSHIP, &GPT2_SMALL],
    }
}

fn t1_var(shape: &Shape) -> String {
    format!("TORCHRL_BENCH_T1_{}", shape.name)
}

fn iters_of(shape: &Shape) -> usize {
    env_or("TORCHRL_BENCH_ITERS", shape.iters).max(1)
}

/// One rank of the launched group.
fn worker(which: &str) -> Result<()> {
    tch::set_num_threads(1);
    let opts = InitOptions::from_env()?.with_timeout(Duration::from_secs(300));
    let pg = ProcessGroup::new(opts)?;
    if which != "ppo" {
        allreduce(&pg)?;
    }
    if which != "allreduce" {
        let shared = SharedCollective::new(pg);
        for shape in shapes() {
            let (main, world) = (shared.is_main(), shared.world_size());
            let t = ppo_on(shape, Some(shared.clone()))?;
            if main {
                let t1 = std::env::var(t1_var(shape))
                    .ok()
                    .and_then(|v| v.parse().ok());
                print_ppo(shape, world, &t, t1);
            }
        }
    }
    Ok(())
}

fn main() {
    let which = std::env::var("TORCHRL_BENCH_DIST").unwrap_or_else(|_| "both".into());
    if std::env::var_os("RANK").is_some() {
        if let Err(e) = worker(&which) {
            eprintln!("distributed bench: {e}");
            std::process::exit(1);
        }
        return;
    }
    let mut extra = Vec::new();
    if which != "allreduce" {
        tch::set_num_threads(1);
        for shape in shapes() {
            match ppo_on(shape, None) {
                Ok(t) => {
                    print_ppo(shape, 1, &t, None);
                    extra.push((t1_var(shape), t.best.to_string()));
                }
                Err(e) => {
                    eprintln!("distributed bench: one-process PPO: {e}");
                    std::process::exit(1);
                }
            }
        }
    }
    std::process::exit(launch(env_or("TORCHRL_BENCH_WORLD", 2), &extra));
}
