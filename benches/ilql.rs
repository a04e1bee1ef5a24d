//! W13 / W14: ILQL at the RLHF flagship's config (vocabulary 259, 2 blocks × 64 wide, 4 heads,
//! context 64, two Q heads), the Rust half of the side-by-side with
//! `benches/python/ilql_baseline.py` (trlX's formulas on `transformers`, same shapes):
//!
//! - W13: β-shaped generation (`ilql_generate`, KV cache, β = 1, top-k 20, temperature 1) of
//!   32 prompts of 5 tokens, 12 new tokens: generated tokens/s;
//! - W14: one ILQL optimizer step (`IlqlLoss` + AdamW) on 32 sequences of 18 tokens whose
//!   last 12 positions are actions: steps/s.
//!
//! Each row has its kernel floor (`W13_…_floor`, `W14_…_floor`, with a `#` line giving ours /
//! floor): the same math as bare `tch` ops from a plain loop (`benches/common/bare_ilql.rs`,
//! on `bare_gpt2.rs`), without tensordicts, modules, checks or statistics:
//!
//! - W13's floor: `BareIlql::generate` on the model's own tensors (the LM logits, the two
//!   target Q heads and the V head on the last hidden state, `log_softmax + β·(min Q − V)`,
//!   top-k, CDF inversion of the same uniforms), checked first to draw the same tokens as ours
//!   from the same seed;
//! - W14's floor: `BareIlql::loss` (Q, expectile V, CQL and AWAC terms) on a second model built
//!   from the same seed, backward and `BareAdamW` (our AdamW's ops: lr 5e-5, betas (0.9,
//!   0.999), eps 1e-8, weight decay 0.01), checked first against ours from identical
//!   parameters (two steps: the losses, every gradient and every updated parameter). The
//!   floor leaves out what does not reach the parameters: the LM logits away from the action
//!   positions, the target Q heads' outputs other than the taken action's, the statistics.
//!
//! Ours and the floor alternate, best of 3 after a warm-up (`TORCHRL_BENCH_REPEAT` adds
//! repetitions of ours to W14, e.g. for a profile), one libtorch thread
//! (`TORCHRL_BENCH_THREADS` to change).
//! Prints `W<name>\t<ops/s>` lines, the format `scripts/bench.sh` pairs with the Python side.

mod common;

use std::hint::black_box;

use common::bare_ilql::{BareIlql, BareIlqlBatch};
use common::bare_optim::BareAdamW;
use common::{paired, print_floor, try_best_of};
use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};
use torchrl::modules::llm::{
    ilql_generate, CausalLmWithIlqlHeads, Gpt2Config, Gpt2Model, IlqlGenerationConfig,
};
use torchrl::objectives::llm::{IlqlConfig, IlqlLoss};
use torchrl::objectives::LossModule;
use torchrl::tensordict::TensorDict;
use torchrl::trainers::ilql::data::{IlqlDataConfig, IlqlDataset, IlqlTokenSample};
use torchrl::trainers::optim::AdamW;
use torchrl::{Generator, Result};

const BATCH: i64 = 32;
const PROMPT: i64 = 5;
const NEW: i64 = 12;
const N_HEAD: i64 = 4;
const LR: f64 = 5e-5;
/// `AdamW::new`'s default weight decay (what `AdamW::from_var_store` uses).
const WEIGHT_DECAY: f64 = 0.01;

fn config() -> Gpt2Config {
    Gpt2Config::new(259)
        .with_n_positions(64)
        .with_n_embd(64)
        .with_n_layer(2)
        .with_n_head(N_HEAD)
}

/// The bench's model: GPT-2 with two Q heads (Polyak rate 0.001).
fn build() -> Result<(VarStore, CausalLmWithIlqlHeads)> {
    let vs = VarStore::new(Device::Cpu);
    let model = CausalLmWithIlqlHeads::from_model(
        &vs.root(),
        Gpt2Model::new(&vs.root(), &config())?,
        true,
        0.001,
    )?;
    Ok((vs, model))
}

/// The largest absolute difference between two tensors.
fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
    (a - b).abs().max().double_value(&[])
}

/// W13's check: the floor draws the same tokens as ours from the same uniforms.
fn check_generate(model: &CausalLmWithIlqlHeads, bare: &BareIlql, prompt: &Tensor) -> Result<()> {
    let gen = IlqlGenerationConfig::new(NEW);
    let ours = ilql_generate(model, prompt, None, &gen, &mut Generator::new(7))?;
    let u = Generator::new(7).uniform(&[NEW, BATCH], 0.0, 1.0, Kind::Double, Device::Cpu)?;
    let tokens = bare.generate(prompt, NEW, &u, gen.beta, gen.top_k, gen.temperature);
    assert!(
        ours.response.equal(&tokens),
        "W13: the floor drew other tokens"
    );
    Ok(())
}

/// W14's check: two steps of ours and two of the floor from identical parameters (two models
/// from one seed) give the same losses, gradients and updated parameters. Two steps, because
/// AdamW's first step does not depend on the betas. Where a gradient is within a few eps
/// (1e-8) of 0, Adam's `g / (|g| + eps)` amplifies the gradients' rounding differences into
/// a fraction of `lr`: those elements are held to 1e-4 only, the others to 2e-7 (about an
/// ulp of the unit layer-norm weights, below their decay `lr · 0.01` = 5e-7 a step).
fn check_step(batch: &TensorDict) -> Result<()> {
    tch::manual_seed(1);
    let (vs_ours, ours) = build()?;
    tch::manual_seed(1);
    let (vs_floor, floor) = build()?;
    let p_floor = vs_floor.variables();
    let p_ours: Vec<(String, Tensor)> = vs_ours
        .variables()
        .into_iter()
        .filter(|(_, p)| p.requires_grad())
        .collect();
    assert_eq!(p_ours.len(), vs_floor.trainable_variables().len());
    for (name, p) in &p_ours {
        assert!(
            p.equal(&p_floor[name]),
            "W14: {name} differs before the step"
        );
    }
    let mut opt = AdamW::from_var_store(&vs_ours, LR)?;
    let bare = BareIlql::from_model(&floor, N_HEAD);
    let bare_batch = BareIlqlBatch::from_td(batch);
    let mut bare_opt = BareAdamW::new(vs_floor.trainable_variables(), LR, WEIGHT_DECAY);
    // elements whose gradient is well above eps at every step
    let mut clear: Vec<Tensor> = p_ours.iter().map(|(_, p)| p.ones_like()).collect();
    for step in 0..2 {
        let loss_ours = IlqlLoss::new(&ours).forward(batch)?.loss;
        opt.backward_step(&loss_ours, None)?;
        let loss_floor = bare.loss(&bare_batch, &IlqlConfig::new());
        bare_opt.backward_step(&loss_floor, None);
        let (lo, lf) = (loss_ours.double_value(&[]), loss_floor.double_value(&[]));
        assert!(
            (lo - lf).abs() <= 1e-5 * lo.abs(),
            "W14 step {step}: loss {lo} (ours) vs {lf} (floor)"
        );
        for ((name, p), clear) in p_ours.iter().zip(&mut clear) {
            let (g, gf) = (p.grad(), p_floor[name].grad());
            let scale = g.abs().max().double_value(&[]);
            let dg = max_diff(&g, &gf);
            assert!(
                dg <= 1e-4 * scale + 1e-7,
                "W14 step {step}: the gradient of {name} differs by {dg} (max |g| {scale})"
            );
            *clear = clear.logical_and(&g.abs().gt(1e-6));
        }
    }
    for ((name, p), clear) in p_ours.iter().zip(&clear) {
        let diff = (p - &p_floor[name]).abs();
        let all = diff.max().double_value(&[]);
        let clear_max = diff.where_scalarother(clear, 0.0).max().double_value(&[]);
        assert!(
            all <= 1e-4 && clear_max <= 2e-7,
            "W14: {name} differs by {clear_max} ({all} with |g| near eps) after two steps"
        );
    }
    Ok(())
}

fn main() -> Result<()> {
    let threads = std::env::var("TORCHRL_BENCH_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    tch::set_num_threads(threads);
    tch::manual_seed(0);
    let (vs, model) = build()?;

    // W13: generation
    let prompt = Tensor::randint(256, [BATCH, PROMPT], (Kind::Int64, Device::Cpu));
    let gen = IlqlGenerationConfig::new(NEW);
    let bare = BareIlql::from_model(&model, N_HEAD);
    check_generate(&model, &bare, &prompt)?;
    let mut rng = Generator::new(0);
    let mut floor_rng = Generator::new(0);
    let (ours, floor) = paired(
        Box::new(|| {
            let out = ilql_generate(&model, &prompt, None, &gen, &mut rng)?;
            black_box(&out.sequences);
            Ok(())
        }),
        Box::new(|| {
            let u = floor_rng.uniform(&[NEW, BATCH], 0.0, 1.0, Kind::Double, Device::Cpu)?;
            let (beta, k, temp) = (gen.beta, gen.top_k, gen.temperature);
            let _ = black_box(bare.generate(&prompt, NEW, &u, beta, k, temp));
            Ok(())
        }),
    )?;
    let tokens = (BATCH * NEW) as f64;
    println!("W13_ilql_generate_tokens_per_s\t{:.1}", tokens / ours);
    print_floor("W13_ilql_generate_tokens_per_s", tokens, ours, floor);

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
    check_step(&batch)?;

    let mut opt = AdamW::from_var_store(&vs, LR)?;
    let mut step = || -> Result<()> {
        let out = IlqlLoss::new(&model).forward(&batch)?;
        opt.backward_step(&out.loss, None)?;
        Ok(())
    };
    // the floor trains a second model from the same seed (its own optimizer state)
    tch::manual_seed(0);
    let (floor_vs, floor_model) = build()?;
    let floor_bare = BareIlql::from_model(&floor_model, N_HEAD);
    let mut floor_opt = BareAdamW::new(floor_vs.trainable_variables(), LR, WEIGHT_DECAY);
    let floor_batch = BareIlqlBatch::from_td(&batch);
    let ilql = IlqlConfig::new();
    let (mut ours, floor) = paired(
        Box::new(&mut step),
        Box::new(|| {
            let loss = floor_bare.loss(&floor_batch, &ilql);
            floor_opt.backward_step(&loss, None);
            Ok(())
        }),
    )?;
    let repeat: usize = std::env::var("TORCHRL_BENCH_REPEAT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    if repeat > 3 {
        ours = ours.min(try_best_of(&mut step, repeat - 3)?);
    }
    println!("W14_ilql_step_per_s\t{:.2}", 1.0 / ours);
    print_floor("W14_ilql_step_per_s", 1.0, ours, floor);
    Ok(())
}
