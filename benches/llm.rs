//! The Rust half of the side-by-side GPT benchmarks, measured as
//! `benches/python/gpt2_baseline.py` measures `transformers` (same random-init configs, batch,
//! prompt length and number of new tokens; sampled from the full distribution with a KV cache
//! on both sides; best of 3; libtorch on `TORCHRL_BENCH_THREADS` threads, default 2, on both
//! sides):
//!
//! - W8 `gpt_generate_tiny`: 4 layers × 128 wide, 4 heads, vocab 259 (the RLHF example's
//!   size), batch 16, prompt 16, 32 new tokens: generated tokens per second.
//! - W9 `gpt_generate_gpt2_small`: GPT-2 small's shape (12 × 768, 12 heads, vocab 50257),
//!   batch 8, prompt 16, 32 new tokens: generated tokens per second.
//! - W10 `gpt_policy_value_ref_forward`: GPT-2 small's shape, one no-grad forward of policy
//!   logits + values + reference logits over a `[8, 48]` batch (a rollout's scoring pass):
//!   forwards per second. Ours: the hydra model with 2 unfrozen blocks (the trunk runs once, the
//!   reference is a 2-block branch); `transformers`: the policy model with a value head and a
//!   full reference copy. The reference's parameter bytes are printed beside it.
//!
//! Run: `cargo bench --bench llm` (`TORCHRL_BENCH_TINY_ONLY=1` stops after W8), or
//! `scripts/bench.sh` for the side-by-side table.

mod common;
use common::try_best_of;

use std::hint::black_box;

use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};
use torchrl::modules::llm::{
    generate, CausalLmWithHydraValueHead, GenerationConfig, Gpt2Config, Gpt2Model, LmInput,
};
use torchrl::Generator;

fn tokens_per_s(cfg: &Gpt2Config, batch: i64, prompt: i64, new: i64) -> torchrl::Result<f64> {
    tch::manual_seed(0);
    let vs = VarStore::new(Device::Cpu);
    let model = Gpt2Model::new(&vs.root(), cfg)?;
    let ids = Tensor::f_randint_low(
        3,
        cfg.vocab_size,
        [batch, prompt],
        (Kind::Int64, Device::Cpu),
    )?;
    let gen_cfg = GenerationConfig::rlhf_sampling(new);
    let mut rng = Generator::new(0);
    // warm-up (allocator, kernels)
    generate(&model, &ids, None, &gen_cfg, &mut rng)?;
    let secs = try_best_of(
        || {
            let out = generate(&model, &ids, None, &gen_cfg, &mut rng)?;
            black_box(&out.sequences);
            Ok(())
        },
        3,
    )?;
    Ok((batch * new) as f64 / secs)
}

fn tiny() -> Gpt2Config {
    Gpt2Config::new(259)
        .with_n_layer(4)
        .with_n_embd(128)
        .with_n_head(4)
        .with_n_positions(256)
}

fn main() -> torchrl::Result<()> {
    let threads: i32 = std::env::var("TORCHRL_BENCH_THREADS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2);
    tch::set_num_threads(threads);
    let small = Gpt2Config::new(50257);
    let w8 = tokens_per_s(&tiny(), 16, 16, 32)?;
    println!("W8_gpt_generate_tiny\t{w8:.0}");
    if std::env::var_os("TORCHRL_BENCH_TINY_ONLY").is_some() {
        return Ok(());
    }
    let w9 = tokens_per_s(&small, 8, 16, 32)?;
    println!("W9_gpt_generate_gpt2_small\t{w9:.1}");

    tch::manual_seed(0);
    let vs = VarStore::new(Device::Cpu);
    let hydra = CausalLmWithHydraValueHead::new(&vs.root(), &small, 2)?;
    let ids = Tensor::f_randint_low(3, small.vocab_size, [8, 48], (Kind::Int64, Device::Cpu))?;
    let mask = Tensor::f_ones([8, 48], (Kind::Int64, Device::Cpu))?;
    let input = LmInput::new(&ids).with_attention_mask(&mask);
    let _guard = tch::no_grad_guard();
    hydra.forward(&input)?;
    let n = 5;
    let secs = try_best_of(
        || {
            for _ in 0..n {
                black_box(hydra.forward(&input)?);
            }
            Ok(())
        },
        3,
    )?;
    println!("W10_gpt_policy_value_ref_forward\t{:.2}", n as f64 / secs);
    eprintln!(
        "reference parameters: {:.1} MB (hydra, 2 blocks) vs {:.1} MB (full copy)",
        hydra.reference_parameter_bytes() as f64 / 1e6,
        hydra.full_copy_parameter_bytes() as f64 / 1e6
    );
    Ok(())
}
