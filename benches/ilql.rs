//! W13 / W14: ILQL at the RLHF flagship's config (vocabulary 259, 2 blocks × 64 wide, 4 heads,
//! context 64, two Q heads), the Rust half of the side-by-side with
//! `benches/python/ilql_baseline.py` (trlX's formulas on `transformers`, same shapes):
//!
//! - W13: β-shaped generation (`ilql_generate`, KV cache, β = 1, top-k 20, temperature 1) of
//!   32 prompts of 5 tokens, 12 new tokens: generated tokens/s;
//! - W14: one ILQL optimizer step (`IlqlLoss` + AdamW) on 32 sequences of 18 tokens whose
//!   last 12 positions are actions: steps/s.
//!
//! Best of 3 after a warm-up (`TORCHRL_BENCH_REPEAT` for W14, e.g. for a profile), one libtorch
//! thread (`TORCHRL_BENCH_THREADS` to change).
//! Prints `W<name>\t<ops/s>` lines, the format `scripts/bench.sh` pairs with the Python side.

mod common;

use common::try_best_of;
use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};
use torchrl::modules::llm::{
    ilql_generate, CausalLmWithIlqlHeads, Gpt2Config, Gpt2Model, IlqlGenerationConfig,
};
use torchrl::objectives::llm::IlqlLoss;
use torchrl::objectives::LossModule;
use torchrl::trainers::ilql::data::{IlqlDataConfig, IlqlDataset, IlqlTokenSample};
use torchrl::trainers::optim::AdamW;
use torchrl::{Generator, Result};

const BATCH: i64 = 32;
const PROMPT: i64 = 5;
const NEW: i64 = 12;

fn main() -> Result<()> {
    let threads = std::env::var("TORCHRL_BENCH_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    tch::set_num_threads(threads);
    tch::manual_seed(0);
    let cfg = Gpt2Config::new(259)
        .with_n_positions(64)
        .with_n_embd(64)
        .with_n_layer(2)
        .with_n_head(4);
    let vs = VarStore::new(Device::Cpu);
    let model = CausalLmWithIlqlHeads::from_model(
        &vs.root(),
        Gpt2Model::new(&vs.root(), &cfg)?,
        true,
        0.001,
    )?;

    // W13: generation
    let prompt = Tensor::randint(256, [BATCH, PROMPT], (Kind::Int64, Device::Cpu));
    let gen = IlqlGenerationConfig::new(NEW);
    let mut rng = Generator::new(0);
    ilql_generate(&model, &prompt, None, &gen, &mut rng)?;
    let t = try_best_of(
        || {
            ilql_generate(&model, &prompt, None, &gen, &mut rng)?;
            Ok(())
        },
        3,
    )?;
    println!(
        "W13_ilql_generate_tokens_per_s\t{:.1}",
        (BATCH * NEW) as f64 / t
    );

    // W14: one optimizer step of the ILQL loss
    let mut g = Generator::new(1);
    let samples: Vec<IlqlTokenSample> = (0..BATCH)
        .map(|i| {
            let row = |n: i64, g: &mut Generator| (0..n).map(|_| g.below(256) as i64).collect();
            IlqlTokenSample::new(
                row(18 - NEW, &mut g),
                row(NEW, &mut g),
                f64::from(i as i32 % 3),
            )
        })
        .collect();
    let data = IlqlDataset::from_token_rows(
        &samples,
        &IlqlDataConfig::new()
            .with_seq_length(18)
            .with_add_eos(false),
    )?;
    let idx: Vec<usize> = (0..BATCH as usize).collect();
    let batch = data.batch(&idx)?;
    let mut opt = AdamW::from_var_store(&vs, 5e-5)?;
    let mut step = || -> Result<()> {
        let out = IlqlLoss::new(&model).forward(&batch)?;
        opt.backward_step(&out.loss, None)?;
        Ok(())
    };
    step()?;
    let repeat = std::env::var("TORCHRL_BENCH_REPEAT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let t = try_best_of(step, repeat)?;
    println!("W14_ilql_step_per_s\t{:.2}", 1.0 / t);
    Ok(())
}
