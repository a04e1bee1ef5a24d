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
//! side), then the peak resident memory (`VmHWM`) and the parameter bytes held. Env:
//! `TORCHRL_BENCH_RLHF=flagship|small|both` (default `both`; each config in its own process
//! gives clean peak-memory numbers), `TORCHRL_BENCH_ITERS` (timed iterations, default 4 for
//! the flagship, 2 for small), `TORCHRL_BENCH_THREADS` (default 1), `TORCHRL_BENCH_UNFROZEN`
//! (the hydra split; `-1` trains every block against a full frozen copy, as TRL does).

mod common;
use common::peak_rss_mib;

use std::time::Instant;

use tch::nn::VarStore;
use tch::Device;
use torchrl::envs::llm::{RewardModelScorer, TokenEnv, TokenEnvConfig};
use torchrl::modules::llm::{
    ByteTokenizer, CausalLmWithHydraValueHead, CausalLmWithScoreHead, Gpt2Config, Gpt2Model,
    SpecialTokens, TextTokenizer,
};
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

fn run(shape: &Shape, iters: usize) -> Result<()> {
    tch::manual_seed(0);
    let (eos, pad) = if shape.vocab == 259 {
        let t = ByteTokenizer::new();
        (
            t.eos_token_id().unwrap_or(256),
            t.pad_token_id().unwrap_or(257),
        )
    } else {
        (50256, 50256) // GPT-2's single special id, as the Python side
    };
    let cfg = Gpt2Config::new(shape.vocab)
        .with_n_positions(if shape.vocab == 259 { 64 } else { 1024 })
        .with_n_embd(shape.width)
        .with_n_layer(shape.layers)
        .with_n_head(shape.heads)
        .with_special_tokens(None, eos, pad);
    let vs = VarStore::new(Device::Cpu);
    let unfrozen = std::env::var("TORCHRL_BENCH_UNFROZEN")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(shape.unfrozen);
    let model = CausalLmWithHydraValueHead::new(&vs.root(), &cfg, unfrozen)?;
    let rm_vs = VarStore::new(Device::Cpu);
    let rm =
        CausalLmWithScoreHead::from_model(&rm_vs.root(), Gpt2Model::new(&rm_vs.root(), &cfg)?)?;
    let mut rng = Generator::new(0);
    let top = if shape.vocab == 259 { 256 } else { 50255 };
    let prompts: Vec<Vec<i64>> = (0..shape.prompts * (iters + 1))
        .map(|_| {
            (0..shape.prompt_len)
                .map(|_| rng.below(top) as i64)
                .collect()
        })
        .collect();
    let env_cfg = TokenEnvConfig::for_model(&cfg.facts())
        .with_max_new_tokens(shape.new_tokens)
        .with_batch_size(shape.prompts as i64);
    let env = TokenEnv::new(env_cfg, prompts, Box::new(RewardModelScorer::new(rm)))?;
    let mut c = TrlConfig::default();
    c.train.batch_size = shape.minibatch;
    c.train.epochs = iters + 2; // never the last step: no final evaluate + save inside the timing
    c.train.log_interval = 1_000_000;
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
    let mut trainer = PpoRlhfTrainer::new(c, model, env, Box::new(tok))?;
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
