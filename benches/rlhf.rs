//! W11 / W12: seconds per PPO-RLHF iteration (rollout + update) of `PpoRlhfTrainer`, the Rust
//! half of the side-by-side with TRL 1.10's `PPOTrainer` (`benches/python/rlhf_baseline.py`,
//! same model shapes, batch, prompt and response lengths, PPO epochs and minibatches;
//! random-init models).
//!
//! - W11, the flagship's config: vocab 259, 2 blocks × 64, 4 heads; 64 prompts of 5 tokens,
//!   12 new tokens, 4 PPO epochs of 2 minibatches of 32; hydra reference with 1 block.
//! - W12, GPT-2-small's shape: vocab 50257, 12 blocks × 768, 12 heads; 8 prompts of 16
//!   tokens, 16 new tokens, 4 epochs of 1 minibatch; hydra reference with trlX's default 2
//!   blocks (TRL holds a full reference copy and a separate value model).
//!
//! Prints `W<name>\t<iterations/s>` lines (the format `scripts/bench.sh` pairs with the Python
//! side), then the peak resident memory (`VmHWM`) and the parameter bytes held.
//!
//! Then, for each config run, the kernel floor of the iteration: `W<name>_floor\t<iterations/s>`
//! and a `#` line with ours / floor (times), from a fresh trainer and the bare loop of
//! `common/bare_ppo.rs` on models of the same seed, their iterations interleaved
//! (`common::paired`: best of 3 after a warm-up). The bare loop is the same math as bare `tch`
//! ops on the same tensors (the trainer's generator draws, generation with EOS, one hydra pass
//! for the log-probs, reference log-probs and values with the frozen trunk kept, the reward
//! model, the KL-penalised rewards, GAE, per-minibatch whitening, the update forwards from the
//! kept trunk, the clipped losses, gradient clipping, AdamW), without what does not reach the
//! parameters (tensordicts, checks, logged statistics, the generation's own log-probs, LM head
//! and value head on prompt positions, GAE recomputed per minibatch). Before timing, the first
//! iteration of each is checked against the other: the same tokens, then scores, log-probs,
//! values, rewards, advantages, every update's loss, the updated parameters and the last
//! gradients to float rounding (a `#` line gives the differences). No floor with a full-copy
//! reference (`TORCHRL_BENCH_UNFROZEN` ≤ 0). Env:
//! `TORCHRL_BENCH_RLHF=flagship|small|both` (default `both`; each config in its own process
//! gives clean peak-memory numbers), `TORCHRL_BENCH_ITERS` (timed iterations, default 4 for
//! the flagship, 2 for small), `TORCHRL_BENCH_THREADS` (default 1), `TORCHRL_BENCH_UNFROZEN`
//! (the hydra split; `-1` trains every block against a full frozen copy, as TRL does).

mod common;
use common::bare_ppo::{whiten, BarePpoRlhf, LossSettings, PpoSettings};
use common::{paired, peak_rss_mib, print_floor};

use std::hint::black_box;
use std::time::Instant;

use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};
use torchrl::envs::llm::{RewardModelScorer, TokenEnv, TokenEnvConfig};
use torchrl::modules::llm::keys;
use torchrl::modules::llm::{
    ByteTokenizer, CausalLmWithHydraValueHead, CausalLmWithScoreHead, Gpt2Config, Gpt2Model,
    SpecialTokens, TextTokenizer,
};
use torchrl::objectives::llm::{compute_ppo_rlhf_advantages, PpoRlhfConfig, PpoRlhfKeys};
use torchrl::trainers::api::Callbacks;
use torchrl::trainers::config::{GenKwargs, ScaleReward, TrlConfig};
use torchrl::trainers::ppo::PpoRlhfTrainer;
use torchrl::{Generator, Result};

struct Shape {
    name: &'static str,
    vocab: i64,
    layers: i64,
    width: i64,
    heads: i64,
    prompts: usize,
    prompt_len: usize,
    new_tokens: i64,
    minibatch: usize,
    unfrozen: i64,
    iters: usize,
}

const FLAGSHIP: Shape = Shape {
    name: "W11_ppo_rlhf_iteration_flagship",
    vocab: 259,
    layers: 2,
    width: 64,
    heads: 4,
    prompts: 64,
    prompt_len: 5,
    new_tokens: 12,
    minibatch: 32,
    unfrozen: 1,
    iters: 4,
};

const SMALL: Shape = Shape {
    name: "W12_ppo_rlhf_iteration_gpt2_small",
    vocab: 50257,
    layers: 12,
    width: 768,
    heads: 12,
    prompts: 8,
    prompt_len: 16,
    new_tokens: 16,
    minibatch: 8,
    unfrozen: 2,
    iters: 2,
};

/// A tokenizer whose ids are the model's (prompts are drawn as ids; decoding is only used
/// for logging, never here).
struct IdTokenizer {
    vocab: i64,
    eos: i64,
    pad: i64,
}

impl TextTokenizer for IdTokenizer {
    fn encode(&self, text: &str) -> Result<Vec<i64>> {
        Ok(text.split(' ').filter_map(|t| t.parse().ok()).collect())
    }
    fn decode(&self, ids: &[i64], _special: SpecialTokens) -> Result<String> {
        Ok(ids.iter().map(i64::to_string).collect::<Vec<_>>().join(" "))
    }
    fn vocab_size(&self) -> i64 {
        self.vocab
    }
    fn eos_token_id(&self) -> Option<i64> {
        Some(self.eos)
    }
    fn pad_token_id(&self) -> Option<i64> {
        Some(self.pad)
    }
    fn bos_token_id(&self) -> Option<i64> {
        None
    }
}

/// The special ids of a shape's vocabulary: the byte tokenizer's EOS and pad, or GPT-2's single
/// special id (as the Python side).
fn special_ids(shape: &Shape) -> (i64, i64) {
    if shape.vocab == 259 {
        let t = ByteTokenizer::new();
        (
            t.eos_token_id().unwrap_or(256),
            t.pad_token_id().unwrap_or(257),
        )
    } else {
        (50256, 50256)
    }
}

fn gpt2_config(shape: &Shape) -> Gpt2Config {
    let (eos, pad) = special_ids(shape);
    Gpt2Config::new(shape.vocab)
        .with_n_positions(if shape.vocab == 259 { 64 } else { 1024 })
        .with_n_embd(shape.width)
        .with_n_layer(shape.layers)
        .with_n_head(shape.heads)
        .with_special_tokens(None, eos, pad)
}

/// `TORCHRL_BENCH_UNFROZEN`, else the shape's hydra split.
fn unfrozen(shape: &Shape) -> i64 {
    std::env::var("TORCHRL_BENCH_UNFROZEN")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(shape.unfrozen)
}

/// The policy (hydra) and the reward model, random-init from `tch::manual_seed(0)`: the same
/// values on every call.
fn models(
    shape: &Shape,
) -> Result<(
    VarStore,
    CausalLmWithHydraValueHead,
    VarStore,
    CausalLmWithScoreHead,
)> {
    tch::manual_seed(0);
    let cfg = gpt2_config(shape);
    let vs = VarStore::new(Device::Cpu);
    let model = CausalLmWithHydraValueHead::new(&vs.root(), &cfg, unfrozen(shape))?;
    let rm_vs = VarStore::new(Device::Cpu);
    let rm =
        CausalLmWithScoreHead::from_model(&rm_vs.root(), Gpt2Model::new(&rm_vs.root(), &cfg)?)?;
    Ok((vs, model, rm_vs, rm))
}

/// `shape.prompts × (iters + 1)` random prompts of `shape.prompt_len` ids (no special id).
fn prompts(shape: &Shape, iters: usize) -> Vec<Vec<i64>> {
    let mut rng = Generator::new(0);
    let top = if shape.vocab == 259 { 256 } else { 50255 };
    (0..shape.prompts * (iters + 1))
        .map(|_| {
            (0..shape.prompt_len)
                .map(|_| rng.below(top) as i64)
                .collect()
        })
        .collect()
}

/// The trainer of the bench: the models of [`models`], the prompts of [`prompts`], the Python
/// side's config, `epochs` iterations before the step budget ends (keep it above the
/// iterations run: the last step would evaluate and save), a log every `log_interval` steps.
fn build(
    shape: &Shape,
    iters: usize,
    epochs: usize,
    log_interval: usize,
) -> Result<(PpoRlhfTrainer, VarStore, VarStore)> {
    let (eos, pad) = special_ids(shape);
    let cfg = gpt2_config(shape);
    let (vs, model, rm_vs, rm) = models(shape)?;
    let env_cfg = TokenEnvConfig::for_model(&cfg.facts())
        .with_max_new_tokens(shape.new_tokens)
        .with_batch_size(shape.prompts as i64);
    let env = TokenEnv::new(
        env_cfg,
        prompts(shape, iters),
        Box::new(RewardModelScorer::new(rm)),
    )?;
    let mut c = TrlConfig::default();
    c.train.batch_size = shape.minibatch;
    c.train.epochs = epochs;
    c.train.log_interval = log_interval;
    c.train.eval_interval = 1_000_000;
    c.train.checkpoint_interval = 1_000_000;
    c.method.num_rollouts = shape.prompts;
    c.method.chunk_size = shape.prompts;
    c.method.ppo_epochs = 4;
    c.method.scale_reward = ScaleReward::Ignored;
    c.method.gen_kwargs = GenKwargs {
        max_new_tokens: shape.new_tokens as usize,
        top_k: 0,
        top_p: 1.0,
        do_sample: true,
        temperature: 1.0,
    };
    let tok = IdTokenizer {
        vocab: shape.vocab,
        eos,
        pad,
    };
    let trainer = PpoRlhfTrainer::new(c, model, env, Box::new(tok))?;
    Ok((trainer, vs, rm_vs))
}

fn run(shape: &Shape, iters: usize) -> Result<()> {
    let unfrozen = unfrozen(shape);
    // never the last step: no final evaluate + save inside the timing
    let (mut trainer, vs, rm_vs) = build(shape, iters, iters + 2, 1_000_000)?;
    let mut callbacks = Callbacks::new();
    trainer.iteration(&mut callbacks)?; // warm-up, as the Python side
    let mut times = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t0 = Instant::now();
        trainer.iteration(&mut callbacks)?;
        times.push(t0.elapsed().as_secs_f64());
    }
    let best = times.iter().copied().fold(f64::INFINITY, f64::min);
    let params: i64 = vs
        .variables()
        .values()
        .chain(rm_vs.variables().values())
        .chain(trainer.model().reference_store().variables().values())
        .map(|t| t.numel() as i64 * t.kind().elt_size_in_bytes() as i64)
        .sum();
    println!("{}\t{:.4}", shape.name, 1.0 / best);
    println!(
        "# {}: num_layers_unfrozen {unfrozen}; best {:.4} s/iteration over {:?}; peak RSS {:.0} \
         MiB; parameters held {:.1} MiB (policy + value head + hydra reference + reward model)",
        shape.name,
        best,
        times
            .iter()
            .map(|t| (t * 1e4).round() / 1e4)
            .collect::<Vec<_>>(),
        peak_rss_mib(),
        params as f64 / (1024.0 * 1024.0)
    );
    drop(trainer);
    if unfrozen > 0 {
        floor(shape, iters)?;
    } else {
        println!("# {}: no floor with a full-copy reference", shape.name);
    }
    Ok(())
}

/// The floor settings of `trainer`'s config.
fn floor_settings(shape: &Shape, trainer: &PpoRlhfTrainer) -> PpoSettings {
    let c = trainer.config();
    let (eos, pad) = special_ids(shape);
    let (m, sched) = (&c.method, &c.scheduler.kwargs);
    PpoSettings {
        new_tokens: shape.new_tokens,
        eos,
        pad,
        kl_coef: m.init_kl_coef,
        cliprange_reward: m.cliprange_reward,
        gamma: m.gamma,
        lam: m.lam,
        loss: LossSettings {
            cliprange: m.cliprange,
            cliprange_value: m.cliprange_value,
            vf_coef: m.vf_coef,
        },
        ppo_epochs: m.ppo_epochs,
        minibatch: c.train.batch_size as i64,
        max_grad_norm: c.train.max_grad_norm,
        lr: (c.optimizer.kwargs.lr, sched.t_max, sched.eta_min),
    }
}

/// The largest absolute difference of two tensors (float64).
fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
    (a.to_kind(Kind::Double) - b.to_kind(Kind::Double))
        .abs()
        .max()
        .double_value(&[])
}

/// The floor row of `shape`: a fresh trainer and the bare loop ([`BarePpoRlhf`]) on models of
/// the same seed, checked on their first iteration (same tokens, scores, log-probs, values,
/// rewards, advantages, losses and updated parameters), then timed, their iterations
/// interleaved.
fn floor(shape: &Shape, iters: usize) -> Result<()> {
    let name = shape.name;
    // ours: the check iteration, a warm-up and 3 timed ones before the step budget's end
    let (mut trainer, _vs, _rm_vs) = build(shape, iters, 7, 1)?;
    let (_fvs, model, _frm_vs, rm) = models(shape)?;
    let c = trainer.config().clone();
    let kw = &c.optimizer.kwargs;
    let mut bare = BarePpoRlhf::new(
        &model,
        &rm,
        shape.heads,
        floor_settings(shape, &trainer),
        (kw.betas[0], kw.betas[1]),
        kw.eps,
        kw.weight_decay,
        c.train.seed,
    );
    // the env serves the prompts in order, cycling
    let all = prompts(shape, iters);
    let b = shape.prompts;
    let batches: Vec<Tensor> = (0..all.len() / b)
        .map(|i| {
            let flat: Vec<i64> = all[i * b..(i + 1) * b].concat();
            Tensor::from_slice(&flat).view([b as i64, shape.prompt_len as i64])
        })
        .collect();

    // ---- the check: one iteration of each from the same parameters and generator
    let before: Vec<Tensor> = bare.opt_params().iter().map(Tensor::copy).collect();
    let mut ours_losses = Vec::new();
    {
        let mut cb = Callbacks::new().on_log(|_, stats| {
            ours_losses.push(stats.get("loss").copied().unwrap_or(f64::NAN));
            Ok(())
        });
        trainer.iteration(&mut cb)?;
    }
    let (exp, floor_losses) = bare.iteration(&batches[0]);
    let store = trainer.store().expect("the rollouts");
    let (p, r) = (exp.p, exp.r);
    let resp = |t: &Tensor| t.narrow(1, p, r);
    let keep = &exp.keep;
    let on_keep = |t: &Tensor| t.where_scalarother(keep, 0.0);
    assert!(
        store.get_or_err(keys::FULL_KEY)?.equal(&exp.full),
        "{name}: the floor generates other tokens than ours from the same uniforms"
    );
    assert!(
        store.get_or_err(keys::ATTENTION_MASK_KEY)?.equal(&exp.mask),
        "{name}: the floor's response mask differs from ours"
    );
    let mut td = store.clone();
    let loss_cfg = PpoRlhfConfig::new()
        .with_gamma(c.method.gamma)
        .with_lam(c.method.lam);
    compute_ppo_rlhf_advantages(&mut td, &PpoRlhfKeys::default(), &loss_cfg)?;
    let (whitened, _) = whiten(&exp.advantages, keep);
    let reward = store.get_or_err(("next", "reward"))?.squeeze_dim(-1);
    let checks = [
        (
            "score",
            max_diff(store.get_or_err(("next", "score"))?, &exp.score),
        ),
        (
            "log-probs",
            max_diff(
                &resp(store.get_or_err(keys::FULL_LOG_PROBS_KEY)?),
                &on_keep(&exp.scored.log_probs),
            ),
        ),
        (
            "reference log-probs",
            max_diff(
                &resp(store.get_or_err(keys::REF_LOG_PROBS_KEY)?),
                &on_keep(&exp.scored.ref_log_probs),
            ),
        ),
        (
            "values",
            max_diff(
                &on_keep(&resp(store.get_or_err("values")?)),
                &on_keep(&exp.scored.values),
            ),
        ),
        (
            "rewards",
            max_diff(&on_keep(&resp(&reward)), &on_keep(&exp.rewards)),
        ),
        (
            "advantages",
            max_diff(&resp(td.get_or_err("advantage")?), &whitened),
        ),
        (
            "returns",
            max_diff(&resp(td.get_or_err("value_target")?), &exp.returns),
        ),
    ];
    for (what, d) in checks {
        assert!(
            d <= 1e-4,
            "{name}: the floor's {what} differ from ours by {d:e}"
        );
    }
    assert_eq!(
        ours_losses.len(),
        floor_losses.len(),
        "{name}: update count"
    );
    let loss_rel = ours_losses
        .iter()
        .zip(&floor_losses)
        .map(|(o, f)| (o - f.double_value(&[])).abs() / o.abs().max(1e-6))
        .fold(0.0, f64::max);
    assert!(
        loss_rel <= 1e-4,
        "{name}: the floor's losses {:?} differ from ours {ours_losses:?} (relative {loss_rel:e})",
        floor_losses
            .iter()
            .map(|l| l.double_value(&[]))
            .collect::<Vec<_>>()
    );
    // the parameters after the 4 × 2 updates, their moves, and the last update's gradients
    let ours_params: Vec<Tensor> = trainer
        .model()
        .policy()
        .named_parameters()
        .into_iter()
        .filter(|(_, p)| p.requires_grad())
        .map(|(_, p)| p.shallow_clone())
        .collect();
    let (mut param_d, mut move_d, mut move_n, mut grad_d, mut grad_n) =
        (0f64, 0f64, 0f64, 0f64, 0f64);
    for ((o, f), init) in ours_params.iter().zip(bare.opt_params()).zip(&before) {
        param_d = param_d.max(max_diff(o, f));
        move_d = move_d.max(max_diff(&(o - init), &(f - init)));
        move_n = move_n.max((o - init).abs().max().double_value(&[]));
        grad_d = grad_d.max(max_diff(&o.grad(), &f.grad()));
        grad_n = grad_n.max(o.grad().abs().max().double_value(&[]));
    }
    assert!(
        param_d <= 1e-4 && grad_d <= 1e-3 * grad_n,
        "{name}: after one iteration the floor's parameters differ from ours by {param_d:e}, \
         the last update's gradients by {grad_d:e} (largest {grad_n:e})"
    );
    println!(
        "# {name}: floor checked on one iteration: same tokens; scores, log-probs, values, \
         rewards, advantages within {:.1e}; losses within {loss_rel:.1e} (relative); parameters \
         within {param_d:.1e} (largest move {move_n:.1e}, moves within {move_d:.1e}); last \
         gradients within {grad_d:.1e} (largest {grad_n:.1e})",
        checks.iter().map(|(_, d)| *d).fold(0.0, f64::max)
    );

    // ---- the timing, interleaved
    let mut next = 1usize;
    let (ours_s, floor_s) = paired(
        Box::new(|| {
            black_box(trainer.iteration(&mut Callbacks::new())?);
            Ok(())
        }),
        Box::new(|| {
            let prompt = &batches[next % batches.len()];
            next += 1;
            black_box(bare.iteration(prompt));
            Ok(())
        }),
    )?;
    print_floor(name, 1.0, ours_s, floor_s);
    Ok(())
}

fn main() -> Result<()> {
    let threads = std::env::var("TORCHRL_BENCH_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    tch::set_num_threads(threads);
    let which = std::env::var("TORCHRL_BENCH_RLHF").unwrap_or_else(|_| "both".into());
    let iters = |d: usize| {
        std::env::var("TORCHRL_BENCH_ITERS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    if which == "flagship" || which == "both" {
        run(&FLAGSHIP, iters(FLAGSHIP.iters))?;
    }
    if which == "small" || which == "both" {
        run(&SMALL, iters(SMALL.iters))?;
    }
    Ok(())
}
