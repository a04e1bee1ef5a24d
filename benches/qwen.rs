//! W19–W22, W28: the Qwen2.5-0.5B shape (24 blocks × 896, 14 heads over 2 key-value heads, head 64,
//! MLP 4,864, vocabulary 151,936, tied embeddings, q/k/v biases, rope θ 10⁶), random init, the
//! Rust half of the side-by-side with `transformers` and TRL 1.16
//! (`benches/python/qwen_baseline.py`: same config, same shapes, same threads).
//!
//! - W19, generation (`generate`): 8 prompts of 16 random ids, 32 sampled new tokens
//!   (temperature 1, no top-k / top-p, no EOS), KV cache; tokens/s, best of 3 after a warm-up.
//! - W20, a policy + value + reference forward without gradient on 8 × 48 tokens: logits,
//!   values (trlX's two-layer value head) and the reference's logits. `hydra2`: the hydra
//!   reference (`num_layers_unfrozen` 2: one trunk pass up to block 22, the reference's two
//!   blocks and head beside the policy's); `full`: a full frozen copy, the same work as the
//!   Python side's policy + value head + separate reference. Forwards/s, best of 3 (2 each)
//!   after a warm-up.
//! - W21, one GRPO optimizer step including its generation round (`GrpoTrainer::iteration`):
//!   2 prompts of 8 random ids × `num_generations` 4 = 8 completions of at most 16 tokens, a
//!   rule reward on the token ids (the count of even ids; TRL's reward function computes the
//!   same), the rollout's and the reference's log-probs (β 0.04, k3), group advantages, one
//!   minibatch of 8 (DAPO loss, ε 0.2 / 0.28, grad clip 1, AdamW at 1e-6). Every parameter
//!   trains against a full frozen reference copy (`TORCHRL_BENCH_UNFROZEN=-1`, the default,
//!   TRL's design); `TORCHRL_BENCH_UNFROZEN=2` is the hydra with two trainable blocks.
//!   Seconds per step: best and median of `TORCHRL_BENCH_ITERS` (default 2) after a warm-up.
//! - W22, the same GRPO step with LoRA (`TORCHRL_BENCH_LORA=R`: rank `R`, `lora_alpha` 2R, on
//!   every linear layer of the blocks) and the adapters-off reference (no reference copy), TRL +
//!   PEFT's configuration; with `TORCHRL_BENCH_BF16=1` every variable is made in bfloat16 (AdamW
//!   trains the adapters and the value head through float32 masters). `TORCHRL_BENCH_CKPT=1` turns on gradient checkpointing (for the
//!   full-parameter step's memory with and without it).
//! - W28, one PPO-RLHF iteration (`PpoRlhfTrainer::iteration`, trlX's shape): 8 prompts of 8
//!   random letters, 16 sampled new tokens, the rollout's log-probs, values and reference
//!   log-probs, a reward model of the same shape with a score head (its own seed, frozen; TRL's
//!   `AutoModelForSequenceClassification`), KL-penalised rewards (β 0.05), GAE, then 4 PPO
//!   epochs of one minibatch of 8 (AdamW at 3e-6, TRL's default). The same variants as W22
//!   (`TORCHRL_BENCH_LORA`, `TORCHRL_BENCH_BF16`, `TORCHRL_BENCH_UNFROZEN`); the side by side
//!   is TRL 1.10's `PPOTrainer` (the last TRL with PPO) with PEFT, which keeps a separate value
//!   model of the policy's shape where ours is trlX's value head on the policy's trunk.
//!   Seconds per iteration after a warm-up one.
//!
//! `TORCHRL_BENCH_TRUNK_FROM_GEN=0` makes W21's hydra rollouts run the frozen trunk again in
//! their scoring pass instead of taking it from the generation
//! (`OnPolicyTrainer::with_trunk_from_generation`), for the A/B; `TORCHRL_BENCH_PACK_CACHE=0`
//! packs the frozen weights again at every rollout (`OnPolicyTrainer::with_packed_weight_cache`).
//! `TORCHRL_BENCH_FUSED=1` sets W21's `optimizer.kwargs.fused` (AdamW in one fused call).
//!
//! `TORCHRL_BENCH_KEEP_FREED=1` calls `torchrl::memory::keep_freed_memory` first (freed
//! memory kept by the allocator for reuse: no page zeroing each step).
//!
//! `TORCHRL_BENCH_QWEN=generate|forward|grpo|ppo` picks one workload (default all four; one per
//! process gives each its own peak RSS), `TORCHRL_BENCH_THREADS` (default 2). Prints
//! `W<name>\t<ops/s>` lines and `#` lines with the details and the peak RSS.

mod common;
use common::{best_median, env_or, peak_rss_mib};

use std::hint::black_box;
use std::time::Instant;

use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};
use torchrl::envs::llm::{RewardModelScorer, TokenEnv, TokenEnvConfig, TokenScorer};
use torchrl::modules::llm::models::llama::LlamaConfig;
use torchrl::modules::llm::{
    generate, ByteTokenizer, CausalLmConfig, CausalLmWithHydraValueHead, CausalLmWithScoreHead,
    GenerationConfig, LmInput, LoraConfig,
};
use torchrl::trainers::api::Callbacks;
use torchrl::trainers::config::{GenKwargs, ModelConfig, ScaleReward, TrlConfig};
use torchrl::trainers::grpo::{GrpoLossType, GrpoTrainer, GrpoTrlConfig, ScaleRewards};
use torchrl::trainers::on_policy::IterationStats;
use torchrl::trainers::policy::hydra_policy;
use torchrl::trainers::ppo::PpoRlhfTrainer;
use torchrl::{Generator, Result};

const VOCAB: i64 = 151_936;
/// The special ids both sides use (inside the vocabulary; the byte tokenizer's EOS / pad).
const EOS: i64 = 256;
const PAD: i64 = 257;

fn qwen05b() -> LlamaConfig {
    let json = serde_json::json!({
        "model_type": "qwen2", "vocab_size": VOCAB, "hidden_size": 896,
        "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
        "num_key_value_heads": 2, "max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
        "rope_theta": 1_000_000.0, "tie_word_embeddings": true, "initializer_range": 0.02,
        "eos_token_id": EOS, "pad_token_id": PAD
    });
    serde_json::from_value(json).expect("the Qwen2.5-0.5B config parses")
}

fn timed(repeat: usize, mut f: impl FnMut() -> Result<()>) -> Result<Vec<f64>> {
    let mut times = Vec::with_capacity(repeat);
    for _ in 0..repeat {
        let t0 = Instant::now();
        f()?;
        times.push(t0.elapsed().as_secs_f64());
    }
    Ok(times)
}

/// `[rows, len]` ids in `[3, 50_000)` from a seeded generator (the Python side draws its own).
fn random_ids(rng: &mut Generator, rows: i64, len: i64) -> Result<Tensor> {
    let ids: Vec<i64> = (0..rows * len)
        .map(|_| 3 + rng.below(49_997) as i64)
        .collect();
    Ok(Tensor::from_slice(&ids).f_reshape([rows, len])?)
}

fn w19_generate() -> Result<()> {
    tch::manual_seed(0);
    let vs = VarStore::new(Device::Cpu);
    let t0 = Instant::now();
    let model = qwen05b().build(&vs.root())?;
    let init_s = t0.elapsed().as_secs_f64();
    let (batch, prompt, new) = (8, 16, 32);
    let ids = random_ids(&mut Generator::new(0), batch, prompt)?;
    let gen_cfg = GenerationConfig::rlhf_sampling(new).with_min_new_tokens(new);
    let mut rng = Generator::new(0);
    let _guard = tch::no_grad_guard();
    generate(model.as_ref(), &ids, None, &gen_cfg, &mut rng)?; // warm-up
    let times = timed(3, || {
        let out = generate(model.as_ref(), &ids, None, &gen_cfg, &mut rng)?;
        black_box(&out.sequences);
        Ok(())
    })?;
    let (best, median) = best_median(&times);
    println!("W19_generate_qwen05b\t{:.1}", (batch * new) as f64 / best);
    println!(
        "# W19_generate_qwen05b: {batch} x ({prompt} prompt + {new} new) tokens; best {best:.3} \
         / median {median:.3} s per generate over {times:.3?}; model init {init_s:.1} s; \
         {:.0} M parameters; peak RSS {:.0} MiB",
        model
            .named_parameters()
            .iter()
            .map(|(_, p)| p.numel())
            .sum::<usize>() as f64
            / 1e6,
        peak_rss_mib()
    );
    Ok(())
}

fn w20_forward(unfrozen: i64, name: &str) -> Result<()> {
    tch::manual_seed(0);
    let vs = VarStore::new(Device::Cpu);
    let hydra = CausalLmWithHydraValueHead::new(&vs.root(), &qwen05b(), unfrozen)?;
    let ids = random_ids(&mut Generator::new(1), 8, 48)?;
    let mask = Tensor::f_ones([8, 48], (Kind::Int64, Device::Cpu))?;
    let input = LmInput::new(&ids).with_attention_mask(&mask);
    let _guard = tch::no_grad_guard();
    hydra.forward(&input)?; // warm-up
    let n = 2;
    let times = timed(3, || {
        for _ in 0..n {
            black_box(hydra.forward(&input)?);
        }
        Ok(())
    })?;
    let (best, median) = best_median(&times);
    println!(
        "W20_policy_value_ref_forward_qwen05b_{name}\t{:.3}",
        n as f64 / best
    );
    println!(
        "# W20_policy_value_ref_forward_qwen05b_{name}: num_layers_unfrozen {unfrozen}; 8 x 48 \
         tokens; best {:.3} / median {:.3} s per forward; reference parameters {:.0} MB; peak \
         RSS {:.0} MiB",
        best / n as f64,
        median / n as f64,
        hydra.reference_parameter_bytes() as f64 / 1e6,
        peak_rss_mib()
    );
    Ok(())
}

/// What varies between the GRPO rows: LoRA rank (0: off), a bf16 base, checkpointing.
#[derive(Debug, Clone, Copy)]
struct Variant {
    lora: i64,
    bf16: bool,
    checkpointing: bool,
}

/// The policy of the W21 / W22 / W28 rows: the Qwen shape from `tch::manual_seed(0)` (every
/// variable made in bfloat16 when `v.bf16`: no float32 copy of the model ever exists; the
/// adapters and the value head too, trained through AdamW's float32 masters), with LoRA, the
/// hydra split and checkpointing as `v` and `unfrozen` say.
fn policy(unfrozen: i64, v: Variant) -> Result<(VarStore, CausalLmWithHydraValueHead)> {
    tch::manual_seed(0);
    let mut vs = VarStore::new(Device::Cpu);
    if v.bf16 {
        vs.set_kind(Kind::BFloat16);
    }
    let base = qwen05b().build(&vs.root())?;
    let model_cfg = ModelConfig {
        num_layers_unfrozen: unfrozen,
        peft_config: (v.lora > 0).then(|| {
            LoraConfig::new(v.lora)
                .with_lora_alpha(2.0 * v.lora as f64)
                .with_all_linear()
        }),
        gradient_checkpointing: v.checkpointing,
        ..ModelConfig::default()
    };
    let model = hydra_policy(&vs.root(), base, &model_cfg)?;
    Ok((vs, model))
}

/// `prefix` with the variant's suffixes (`_lora16`, `_hydra2`, `_bf16`, `_ckpt`).
fn row_name(prefix: &str, unfrozen: i64, v: Variant) -> String {
    let mut name = prefix.to_string();
    if v.lora > 0 {
        name.push_str(&format!("_lora{}", v.lora));
    } else if unfrozen >= 0 {
        name.push_str(&format!("_hydra{unfrozen}"));
    }
    if v.bf16 {
        name.push_str("_bf16");
    }
    if v.checkpointing {
        name.push_str("_ckpt");
    }
    name
}

/// `count` prompts of 8 lowercase letters (the Python side's prompts, as byte ids).
fn letter_prompts(count: usize) -> Vec<Vec<i64>> {
    let mut rng = Generator::new(2);
    (0..count)
        .map(|_| (0..8).map(|_| 97 + rng.below(26) as i64).collect())
        .collect()
}

/// Runs `iters` timed iterations after a warm-up one; per optimizer step (`steps` per
/// iteration): the times, the rollout times and the update times.
fn time_iterations(
    iters: usize,
    steps: usize,
    mut iteration: impl FnMut() -> Result<IterationStats>,
) -> Result<[Vec<f64>; 3]> {
    iteration()?; // warm-up, as the Python side
    let (mut per_step, mut rollout, mut update) = (vec![], vec![], vec![]);
    for _ in 0..iters {
        let t0 = Instant::now();
        let s = iteration()?;
        per_step.push(t0.elapsed().as_secs_f64() / steps as f64);
        rollout.push(s.rollout_s);
        update.push(s.update_s / steps as f64);
    }
    Ok([per_step, rollout, update])
}

fn w21_grpo(iters: usize, unfrozen: i64, v: Variant) -> Result<()> {
    const GENERATIONS: usize = 4;
    const ROLLOUTS: usize = 8;
    const NEW_TOKENS: usize = 16;
    let cfg = qwen05b();
    let (_vs, model) = policy(unfrozen, v)?;
    let prompts = letter_prompts(ROLLOUTS / GENERATIONS * (iters + 3));
    let mut c = GrpoTrlConfig::default();
    c.train.seq_length = 24;
    c.train.epochs = iters + 3; // never the last step: no final evaluate + save inside the timing
    c.train.total_steps = 1_000_000;
    c.train.batch_size = ROLLOUTS;
    c.train.log_interval = 1_000_000;
    c.train.eval_interval = 1_000_000;
    c.train.checkpoint_interval = 1_000_000;
    c.train.seed = 0;
    c.optimizer.kwargs.lr = 1e-6;
    c.optimizer.kwargs.fused = env_or("TORCHRL_BENCH_FUSED", 0i64) != 0;
    c.scheduler.kwargs.eta_min = 1e-6;
    let m = &mut c.method;
    m.num_generations = GENERATIONS;
    m.num_rollouts = ROLLOUTS;
    m.chunk_size = ROLLOUTS;
    m.num_iterations = 1;
    m.beta = 0.04;
    m.epsilon_high = Some(0.28);
    m.loss_type = GrpoLossType::Dapo;
    m.scale_rewards = ScaleRewards::Group;
    m.gen_kwargs = GenKwargs {
        max_new_tokens: NEW_TOKENS,
        ..GenKwargs::default()
    };
    let steps_per_iteration = c.steps_per_iteration();
    let env_cfg = TokenEnvConfig::for_model(&cfg.facts())
        .with_max_new_tokens(NEW_TOKENS as i64)
        .with_batch_size(ROLLOUTS as i64)
        .with_num_generations(GENERATIONS as i64);
    // the rule reward both sides compute: the number of even ids in the completion
    let even = |_: &[i64], response: &[i64]| response.iter().filter(|t| *t % 2 == 0).count() as f64;
    let env = TokenEnv::new(env_cfg, prompts, Box::new(TokenScorer::new(even)))?;
    let from_generation = env_or("TORCHRL_BENCH_TRUNK_FROM_GEN", 1i64) != 0;
    let pack_cache = env_or("TORCHRL_BENCH_PACK_CACHE", 1i64) != 0;
    let mut trainer = GrpoTrainer::new(c, model, env, Box::new(ByteTokenizer::new()))?
        .with_trunk_from_generation(from_generation)
        .with_packed_weight_cache(pack_cache);
    let mut callbacks = Callbacks::new();
    let [per_step, rollout, update] = time_iterations(iters, steps_per_iteration, || {
        trainer.iteration(&mut callbacks)
    })?;
    let (best, median) = best_median(&per_step);
    let prefix = if v.lora > 0 {
        "W22_grpo_step_qwen05b"
    } else {
        "W21_grpo_step_qwen05b"
    };
    let name = row_name(prefix, unfrozen, v);
    println!("{name}\t{:.4}", 1.0 / best);
    println!(
        "# {name}: num_layers_unfrozen {unfrozen}; {v:?}; trunk from the generation \
         {from_generation}; packed weight cache {pack_cache}; {steps_per_iteration} step(s) per round of \
         {ROLLOUTS} completions; best {best:.2} / median {median:.2} s/step over {per_step:.2?}; \
         rollout (generate + log-probs + reference + reward) {rollout:.2?} s, update \
         {update:.2?} s; peak RSS {:.0} MiB",
        peak_rss_mib()
    );
    Ok(())
}

fn w28_ppo(iters: usize, unfrozen: i64, v: Variant) -> Result<()> {
    const ROLLOUTS: usize = 8;
    const NEW_TOKENS: usize = 16;
    let cfg = qwen05b();
    let (_vs, model) = policy(unfrozen, v)?;
    // the reward model: the same shape with a score head, its own seed, frozen, in the
    // policy's dtype (TRL's reward model is an `AutoModelForSequenceClassification`)
    tch::manual_seed(2);
    let mut rm_vs = VarStore::new(Device::Cpu);
    if v.bf16 {
        rm_vs.set_kind(Kind::BFloat16);
    }
    let rm = CausalLmWithScoreHead::from_model(&rm_vs.root(), cfg.build(&rm_vs.root())?)?;
    rm_vs.freeze();
    let mut c = TrlConfig::default();
    c.train.seq_length = 8 + NEW_TOKENS;
    c.train.epochs = iters + 3; // never the last step: no final evaluate + save inside the timing
    c.train.total_steps = 1_000_000;
    c.train.batch_size = ROLLOUTS; // one minibatch per PPO epoch
    c.train.log_interval = 1_000_000;
    c.train.eval_interval = 1_000_000;
    c.train.checkpoint_interval = 1_000_000;
    c.train.seed = 0;
    c.optimizer.kwargs.lr = 3e-6; // TRL's PPOConfig default
    c.scheduler.kwargs.eta_min = 3e-6;
    let m = &mut c.method;
    m.num_rollouts = ROLLOUTS;
    m.chunk_size = ROLLOUTS;
    m.ppo_epochs = 4;
    m.init_kl_coef = 0.05;
    m.scale_reward = ScaleReward::Ignored;
    m.gen_kwargs = GenKwargs {
        max_new_tokens: NEW_TOKENS,
        top_k: 0,
        top_p: 1.0,
        do_sample: true,
        temperature: 1.0,
    };
    let steps = c.method.ppo_epochs; // optimizer steps per iteration: one per epoch
    let env_cfg = TokenEnvConfig::for_model(&cfg.facts())
        .with_max_new_tokens(NEW_TOKENS as i64)
        .with_batch_size(ROLLOUTS as i64);
    let env = TokenEnv::new(
        env_cfg,
        letter_prompts(ROLLOUTS * (iters + 3)),
        Box::new(RewardModelScorer::new(rm)),
    )?;
    let mut trainer = PpoRlhfTrainer::new(c, model, env, Box::new(ByteTokenizer::new()))?;
    let mut callbacks = Callbacks::new();
    let [per_step, rollout, update] =
        time_iterations(iters, 1, || trainer.iteration(&mut callbacks))?;
    let (best, median) = best_median(&per_step);
    let name = row_name("W28_ppo_iteration_qwen05b", unfrozen, v);
    println!("{name}\t{:.4}", 1.0 / best);
    println!(
        "# {name}: num_layers_unfrozen {unfrozen}; {v:?}; {ROLLOUTS} rollouts of {NEW_TOKENS} \
         tokens, {steps} PPO epochs of one minibatch; best {best:.2} / median {median:.2} \
         s/iteration over {per_step:.2?}; rollout (generate + log-probs + reference + values + \
         reward model) {rollout:.2?} s, update {update:.2?} s; peak RSS {:.0} MiB",
        peak_rss_mib()
    );
    Ok(())
}

fn main() -> Result<()> {
    if env_or("TORCHRL_BENCH_KEEP_FREED", 0u8) == 1 {
        // before anything is allocated, as `torchrl --keep-freed-memory` does
        println!(
            "# keep_freed_memory: {}",
            torchrl::memory::keep_freed_memory()
        );
    }
    tch::set_num_threads(env_or("TORCHRL_BENCH_THREADS", 2));
    let which = std::env::var("TORCHRL_BENCH_QWEN").unwrap_or_else(|_| "all".into());
    let all = which == "all";
    if all || which == "generate" {
        w19_generate()?;
    }
    if all || which == "forward" {
        w20_forward(2, "hydra2")?;
        w20_forward(-1, "full")?;
    }
    let iters = env_or("TORCHRL_BENCH_ITERS", 2usize).max(1);
    let unfrozen = env_or("TORCHRL_BENCH_UNFROZEN", -1i64);
    let variant = Variant {
        lora: env_or("TORCHRL_BENCH_LORA", 0i64),
        bf16: env_or("TORCHRL_BENCH_BF16", 0u8) == 1,
        checkpointing: env_or("TORCHRL_BENCH_CKPT", 0u8) == 1,
    };
    if all || which == "grpo" {
        w21_grpo(iters, unfrozen, variant)?;
    }
    if all || which == "ppo" {
        w28_ppo(iters, unfrozen, variant)?;
    }
    Ok(())
}
