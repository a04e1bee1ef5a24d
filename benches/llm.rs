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
//! - `TORCHRL_BENCH_COMPACTION=1` (alone, no peer): finished rows compacted away against every
//!   row decoded to the end (`GenerateOptions::keep_finished_rows`), GPT-2 small's shape, batch
//!   8, prompt 16, 64 greedy new tokens, with an EOS that ends the rows at different steps (the
//!   token that a probe decode without EOS emits in the most rows, earliest on ties): both
//!   decodes give the same tokens (checked), and the two are timed interleaved.
//!
//! Run: `cargo bench --bench llm` (`TORCHRL_BENCH_TINY_ONLY=1` stops after W8), or
//! `scripts/bench.sh` for the side-by-side table.

mod common;
use common::bare_gpt2::BareGpt2;
use common::{paired, print_floor, try_best_of};

use std::hint::black_box;

use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};
use torchrl::modules::llm::{
    generate, generate_greedy, CausalLm, CausalLmWithHydraValueHead, GenerateOptions,
    GenerationConfig, Gpt2Config, Gpt2Model, LmInput,
};
use torchrl::Generator;

/// W8 / W9: generated tokens per second, ours and the bare-`tch` floor
/// ([`BareGpt2::generate`]), their repetitions interleaved. The two are checked first to draw
/// the same tokens from the same uniforms.
fn tokens_per_s(
    name: &str,
    cfg: &Gpt2Config,
    batch: i64,
    prompt: i64,
    new: i64,
) -> torchrl::Result<f64> {
    tch::manual_seed(0);
    let mut vs = VarStore::new(Device::Cpu);
    if bf16() {
        // every variable made in bfloat16, as the Python side's `.to(bfloat16)`
        vs.set_kind(Kind::BFloat16);
    }
    let model = Gpt2Model::new(&vs.root(), cfg)?;
    if bf16() {
        report_bf16_drift(name, cfg, &mut vs, &model)?;
    }
    let ids = Tensor::f_randint_low(
        3,
        cfg.vocab_size,
        [batch, prompt],
        (Kind::Int64, Device::Cpu),
    )?;
    let gen_cfg = GenerationConfig::rlhf_sampling(new).with_model_defaults(false);
    let bare = BareGpt2::from_model(&model, cfg.n_head);
    // the same math: the same tokens from the same uniforms
    let ours = generate(&model, &ids, None, &gen_cfg, &mut Generator::new(7))?;
    let u = Generator::new(7).uniform(&[new, batch], 0.0, 1.0, Kind::Double, Device::Cpu)?;
    let (tokens, log_probs) = bare.generate(&ids, new, &u);
    assert!(
        ours.response.equal(&tokens),
        "{name}: the floor drew other tokens"
    );
    let diff = (&ours.log_probs - &log_probs).abs().max().double_value(&[]);
    assert!(diff < 1e-4, "{name}: log-probs differ by {diff}");

    let mut rng = Generator::new(0);
    let mut floor_rng = Generator::new(0);
    let (ours, floor) = paired(
        Box::new(|| {
            let out = generate(&model, &ids, None, &gen_cfg, &mut rng)?;
            black_box(&out.sequences);
            Ok(())
        }),
        Box::new(|| {
            let u = floor_rng.uniform(&[new, batch], 0.0, 1.0, Kind::Double, Device::Cpu)?;
            let _ = black_box(bare.generate(&ids, new, &u));
            Ok(())
        }),
    )?;
    let tokens = (batch * new) as f64;
    println!("{name}\t{:.1}", tokens / ours);
    print_floor(name, tokens, ours, floor);
    Ok(tokens / ours)
}

/// `TORCHRL_BENCH_BF16=1`: the GPT models are made in bfloat16 (both sides).
fn bf16() -> bool {
    common::env_or("TORCHRL_BENCH_BF16", 0u8) == 1
}

/// Rounds a float32 model's weights into the bf16 model (whose variables `bf16_vs` holds),
/// then prints (as a `#` line) how far the bf16 logits are from the float32 ones on a
/// `[4, 16]` batch: the largest absolute difference of the log-probs and the mean
/// KL(f32 ‖ bf16) per position.
fn report_bf16_drift(
    name: &str,
    cfg: &Gpt2Config,
    bf16_vs: &mut VarStore,
    bf16_model: &Gpt2Model,
) -> torchrl::Result<()> {
    tch::manual_seed(0);
    let vs = VarStore::new(Device::Cpu);
    let f32_model = Gpt2Model::new(&vs.root(), cfg)?;
    // the bf16 model's weights become the float32 ones rounded
    bf16_vs.copy(&vs)?;
    let ids = Tensor::f_randint_low(3, cfg.vocab_size, [4, 16], (Kind::Int64, Device::Cpu))?;
    let _guard = tch::no_grad_guard();
    let exact = f32_model
        .forward(&LmInput::new(&ids), None)?
        .logits()?
        .log_softmax(-1, Kind::Float);
    let rounded = bf16_model
        .forward(&LmInput::new(&ids), None)?
        .logits()?
        .log_softmax(-1, Kind::Float);
    let max_diff = (&exact - &rounded).abs().max().double_value(&[]);
    let kl = (exact.exp() * (&exact - &rounded)).sum_dim_intlist(-1, false, Kind::Float);
    println!(
        "# {name} bf16: log-probs within {max_diff:.3e} of float32's, mean KL(f32 || bf16) {:.3e}",
        kl.mean(Kind::Float).double_value(&[])
    );
    Ok(())
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
    if common::env_or("TORCHRL_BENCH_COMPACTION", 0u8) == 1 {
        return compaction(&small, 8, 16, 64);
    }
    tokens_per_s("W8_gpt_generate_tiny", &tiny(), 16, 16, 32)?;
    if std::env::var_os("TORCHRL_BENCH_TINY_ONLY").is_some() {
        return Ok(());
    }
    tokens_per_s("W9_gpt_generate_gpt2_small", &small, 8, 16, 32)?;

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

/// `TORCHRL_BENCH_COMPACTION=1`: greedy decoding with rows that finish at different steps,
/// finished rows compacted away (the default) against every row decoded to the end.
fn compaction(cfg: &Gpt2Config, batch: i64, prompt: i64, new: i64) -> torchrl::Result<()> {
    tch::manual_seed(0);
    let vs = VarStore::new(Device::Cpu);
    let model = Gpt2Model::new(&vs.root(), cfg)?;
    let ids = Tensor::f_randint_low(
        3,
        cfg.vocab_size,
        [batch, prompt],
        (Kind::Int64, Device::Cpu),
    )?;
    let plain = GenerationConfig::new(new).with_model_defaults(false);
    let opts = GenerateOptions::default();
    // the EOS: the token the most rows emit, the earliest mean first step on ties
    let probe = generate_greedy(
        &model,
        &ids,
        None,
        &plain.clone().with_pad_token_id(0),
        &opts,
    )?;
    let rows = Vec::<Vec<i64>>::try_from(&probe.response)?;
    let mut first: std::collections::BTreeMap<i64, Vec<usize>> = Default::default();
    for row in &rows {
        let mut seen = std::collections::BTreeSet::new();
        for (step, &t) in row.iter().enumerate() {
            if seen.insert(t) {
                first.entry(t).or_default().push(step);
            }
        }
    }
    let (&eos, _) = first
        .iter()
        .max_by_key(|(_, steps)| (steps.len(), std::cmp::Reverse(steps.iter().sum::<usize>())))
        .expect("a token");
    let cfg_eos = plain.with_eos_token_id(eos).with_pad_token_id(0);
    let whole = opts.with_keep_finished_rows(true);
    let a = generate_greedy(&model, &ids, None, &cfg_eos, &opts)?;
    let b = generate_greedy(&model, &ids, None, &cfg_eos, &whole)?;
    assert!(
        a.sequences.equal(&b.sequences),
        "compaction changed the tokens"
    );
    let lengths = Vec::<i64>::try_from(&a.response_mask.sum_dim_intlist(1, false, Kind::Int64))?;
    let steps = a.response.size()[1];
    let (compacting, full) = paired(
        Box::new(|| {
            black_box(generate_greedy(&model, &ids, None, &cfg_eos, &opts)?);
            Ok(())
        }),
        Box::new(|| {
            black_box(generate_greedy(&model, &ids, None, &cfg_eos, &whole)?);
            Ok(())
        }),
    )?;
    let live: i64 = lengths.iter().sum();
    println!(
        "compaction_gpt2_small_greedy\t{:.1}",
        live as f64 / compacting
    );
    println!(
        "compaction_gpt2_small_greedy_whole\t{:.1}",
        live as f64 / full
    );
    println!(
        "# compaction: EOS {eos}; response lengths {lengths:?} ({live} live of {} row-steps, \
         {steps} steps); compacted {compacting:.3} s, every row to the end {full:.3} s: \
         {:.2}x faster (live tokens/s above)",
        batch * steps,
        full / compacting
    );
    Ok(())
}
