//! W15 / W16: seconds per GRPO and DPO optimizer step at the RLHF flagship's config, the Rust
//! half of the side-by-side with TRL 1.16's `GRPOTrainer` and `DPOTrainer`
//! (`benches/python/grpo_dpo_baseline.py`: same model shape, batch, prompt and completion
//! lengths, steps per generation round; random-init models).
//!
//! Model: GPT-2 with vocabulary 259 (`ByteTokenizer`), context 32, 2 blocks × 64, 4 heads; hydra
//! with 1 unfrozen block (the flagship's; `TORCHRL_BENCH_UNFROZEN=-1` trains every block
//! against a full frozen copy, TRL's design).
//!
//! - W15, GRPO (`GrpoTrainer::iteration`): 8 prompts of 4 bytes × `num_generations` 8 = 64
//!   sampled completions of at most 12 tokens (temperature 1), the hydra pass for the
//!   rollout's and the reference's log-probs, a random-init GPT-2 reward model of the same
//!   shape, TRL's group advantages, then `num_iterations` 2 passes in minibatches of 32: 4
//!   optimizer steps (DAPO loss, ε 0.2 / 0.28, β 0.04 k3 KL, grad clip 1, AdamW 1e-3). One
//!   iteration's time / 4 is the reported s/step (generation included).
//! - W16, DPO (`DpoTrainer::step`): 32 random pairs (prompt 4 bytes, completions 5–11 bytes
//!   incl. EOS), reference log-probs per batch from the hydra branch
//!   (`precompute_ref_log_probs = false`), sigmoid loss at β 0.1, backward, clip, AdamW.
//!
//! Both: warm-up first (1 GRPO iteration, 3 DPO steps, as the Python side), then the best and
//! the median of the timed ones. Prints `W<name>\t<steps/s>` lines (the format
//! `scripts/bench.sh` pairs with the Python side) and `#` lines with the details. Env:
//! `TORCHRL_BENCH_GRPO_DPO=grpo|dpo|both` (default `both`), `TORCHRL_BENCH_ITERS` (timed GRPO
//! iterations, default 5), `TORCHRL_BENCH_DPO_STEPS` (timed DPO steps, default 20),
//! `TORCHRL_BENCH_THREADS` (default 1), `TORCHRL_BENCH_UNFROZEN` (default 1).

mod common;
use common::{best_median, env_or, peak_rss_mib};

use std::time::Instant;

use tch::nn::VarStore;
use tch::Device;
use torchrl::envs::llm::{RewardModelScorer, TokenEnv, TokenEnvConfig};
use torchrl::modules::llm::{
    ByteTokenizer, CausalLmWithHydraValueHead, CausalLmWithScoreHead, Gpt2Config, Gpt2Model,
    TextTokenizer,
};
use torchrl::trainers::api::Callbacks;
use torchrl::trainers::config::GenKwargs;
use torchrl::trainers::dpo::{DpoPair, DpoTrainer, DpoTrlConfig};
use torchrl::trainers::grpo::{GrpoLossType, GrpoTrainer, GrpoTrlConfig, ScaleRewards};
use torchrl::{Generator, Result};

const PROMPT_LEN: usize = 4;
const NEW_TOKENS: i64 = 12;
const ROLLOUTS: usize = 64;
const NUM_GENERATIONS: usize = 8;
const MINIBATCH: usize = 32;
const NUM_ITERATIONS: usize = 2;
const DPO_BATCH: usize = 32;
const DPO_WARMUP: usize = 3;

fn model_config() -> Gpt2Config {
    let tok = ByteTokenizer::new();
    Gpt2Config::new(tok.vocab_size())
        .with_n_positions(32)
        .with_n_embd(64)
        .with_n_layer(2)
        .with_n_head(4)
        .with_special_tokens(tok.bos_token_id(), tok.eos_token_id(), tok.pad_token_id())
}

/// `n` lowercase bytes (the Python side draws the same alphabet).
fn letters(rng: &mut Generator, n: usize) -> Vec<i64> {
    (0..n).map(|_| 97 + rng.below(26) as i64).collect()
}

fn rounded(times: &[f64]) -> Vec<f64> {
    times.iter().map(|t| (t * 1e4).round() / 1e4).collect()
}

fn grpo(iters: usize, unfrozen: i64) -> Result<()> {
    tch::manual_seed(0);
    let cfg = model_config();
    let vs = VarStore::new(Device::Cpu);
    let model = CausalLmWithHydraValueHead::new(&vs.root(), &cfg, unfrozen)?;
    let rm_vs = VarStore::new(Device::Cpu);
    let rm =
        CausalLmWithScoreHead::from_model(&rm_vs.root(), Gpt2Model::new(&rm_vs.root(), &cfg)?)?;
    let mut rng = Generator::new(0);
    let groups = ROLLOUTS / NUM_GENERATIONS;
    let prompts: Vec<Vec<i64>> = (0..groups * (iters + 1))
        .map(|_| letters(&mut rng, PROMPT_LEN))
        .collect();

    // the flagship's GRPO stage (examples/rlhf/compare.rs `grpo_config`)
    let mut c = GrpoTrlConfig::default();
    c.train.seq_length = 32;
    c.train.epochs = iters + 3; // never the last step: no final evaluate + save inside the timing
    c.train.total_steps = 1_000_000;
    c.train.batch_size = MINIBATCH;
    c.train.log_interval = 1_000_000;
    c.train.eval_interval = 1_000_000;
    c.train.checkpoint_interval = 1_000_000;
    c.train.seed = 0;
    c.optimizer.kwargs.lr = 1e-3;
    c.scheduler.kwargs.eta_min = 1e-3;
    let m = &mut c.method;
    m.num_generations = NUM_GENERATIONS;
    m.num_rollouts = ROLLOUTS;
    m.chunk_size = ROLLOUTS;
    m.num_iterations = NUM_ITERATIONS;
    m.beta = 0.04;
    m.epsilon_high = Some(0.28);
    m.loss_type = GrpoLossType::Dapo;
    m.scale_rewards = ScaleRewards::Group;
    m.gen_kwargs = GenKwargs {
        max_new_tokens: NEW_TOKENS as usize,
        ..GenKwargs::default()
    };
    let steps_per_iteration = c.steps_per_iteration();

    let env_cfg = TokenEnvConfig::for_model(&cfg.facts())
        .with_max_new_tokens(NEW_TOKENS)
        .with_batch_size(ROLLOUTS as i64)
        .with_num_generations(NUM_GENERATIONS as i64);
    let env = TokenEnv::new(env_cfg, prompts, Box::new(RewardModelScorer::new(rm)))?;
    let mut trainer = GrpoTrainer::new(c, model, env, Box::new(ByteTokenizer::new()))?;
    let mut callbacks = Callbacks::new();
    trainer.iteration(&mut callbacks)?; // warm-up, as the Python side
    let (mut per_step, mut rollout, mut update, mut lengths) = (vec![], vec![], vec![], vec![]);
    for _ in 0..iters {
        let t0 = Instant::now();
        let s = trainer.iteration(&mut callbacks)?;
        per_step.push(t0.elapsed().as_secs_f64() / steps_per_iteration as f64);
        rollout.push(s.rollout_s);
        update.push(s.update_s / steps_per_iteration as f64);
        lengths.push(s.response_length);
    }
    let (best, median) = best_median(&per_step);
    let (_, rollout_median) = best_median(&rollout);
    let (_, update_median) = best_median(&update);
    println!("W15_grpo_step_flagship\t{:.4}", 1.0 / best);
    println!(
        "# W15_grpo_step_flagship: num_layers_unfrozen {unfrozen}; {steps_per_iteration} steps \
         per iteration of {ROLLOUTS} completions; best {best:.4} / median {median:.4} s/step \
         over {:?}; per iteration: rollout (generate + hydra log-probs + reward model + \
         advantages) median {rollout_median:.4} s, update median {update_median:.4} s/step; \
         mean completion length {:.1}; peak RSS {:.0} MiB",
        rounded(&per_step),
        lengths.iter().sum::<f64>() / lengths.len().max(1) as f64,
        peak_rss_mib()
    );
    Ok(())
}

fn dpo_pairs(rng: &mut Generator, n: usize) -> Vec<DpoPair> {
    let eos = ByteTokenizer::new().eos_token_id().unwrap_or(256);
    let completion = |rng: &mut Generator| {
        let len = 4 + rng.below(7) as usize; // 4..=10 bytes, then EOS
        let mut c = letters(rng, len);
        c.push(eos);
        c
    };
    (0..n)
        .map(|_| {
            let prompt = letters(rng, PROMPT_LEN);
            let chosen = completion(rng);
            let rejected = completion(rng);
            DpoPair::new(prompt, chosen, rejected)
        })
        .collect()
}

fn dpo(steps: usize, unfrozen: i64) -> Result<()> {
    tch::manual_seed(0);
    let cfg = model_config();
    let vs = VarStore::new(Device::Cpu);
    let model = CausalLmWithHydraValueHead::new(&vs.root(), &cfg, unfrozen)?;
    let mut rng = Generator::new(1);
    let batches: Vec<Vec<DpoPair>> = (0..DPO_WARMUP + steps)
        .map(|_| dpo_pairs(&mut rng, DPO_BATCH))
        .collect();
    // the flagship's DPO stage (examples/rlhf/compare.rs `dpo_config`), the reference per batch
    let mut c = DpoTrlConfig::default();
    c.train.seq_length = 32;
    c.train.total_steps = 1_000_000;
    c.train.batch_size = DPO_BATCH;
    c.train.log_interval = 1_000_000;
    c.train.eval_interval = 1_000_000;
    c.train.checkpoint_interval = 1_000_000;
    c.train.seed = 0;
    c.optimizer.kwargs.lr = 1e-3;
    c.scheduler.kwargs.eta_min = 1e-3;
    c.method.beta = 0.1;
    c.method.precompute_ref_log_probs = false;
    let all: Vec<DpoPair> = batches.iter().flatten().cloned().collect();
    let mut trainer = DpoTrainer::new(c, model, all, Box::new(ByteTokenizer::new()))?;
    let mut times = Vec::with_capacity(steps);
    for (i, batch) in batches.iter().enumerate() {
        let t0 = Instant::now();
        trainer.step(batch)?;
        if i >= DPO_WARMUP {
            times.push(t0.elapsed().as_secs_f64());
        }
    }
    let (best, median) = best_median(&times);
    // where the time goes: the same batches' reference + policy forward without gradient
    let mut forward = Vec::with_capacity(steps);
    for batch in batches.iter().skip(DPO_WARMUP) {
        let t0 = Instant::now();
        trainer.evaluate_pairs(batch)?;
        forward.push(t0.elapsed().as_secs_f64());
    }
    let (_, forward_median) = best_median(&forward);
    println!("W16_dpo_step_flagship\t{:.4}", 1.0 / best);
    println!(
        "# W16_dpo_step_flagship: num_layers_unfrozen {unfrozen}; {DPO_BATCH} pairs per step; \
         best {best:.4} / median {median:.4} s/step over {:?}; the reference + policy forward \
         alone (no gradient, `evaluate_pairs`) median {forward_median:.4} s; peak RSS {:.0} MiB",
        rounded(&times),
        peak_rss_mib()
    );
    Ok(())
}

fn main() -> Result<()> {
    tch::set_num_threads(env_or("TORCHRL_BENCH_THREADS", 1));
    let which = std::env::var("TORCHRL_BENCH_GRPO_DPO").unwrap_or_else(|_| "both".into());
    let unfrozen = env_or("TORCHRL_BENCH_UNFROZEN", 1i64);
    if which == "grpo" || which == "both" {
        grpo(env_or("TORCHRL_BENCH_ITERS", 5usize).max(1), unfrozen)?;
    }
    if which == "dpo" || which == "both" {
        dpo(env_or("TORCHRL_BENCH_DPO_STEPS", 20usize).max(1), unfrozen)?;
    }
    Ok(())
}
