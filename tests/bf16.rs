//! bfloat16 training: AdamW keeps a float32 master copy (and float32 moments) of every
//! half-precision parameter, so updates below bf16's resolution accumulate instead of being
//! rounded away; a bf16 model trains in the trainers (its log-probs, KL and losses in float32),
//! with LoRA adapters and the value head kept in float32 on a bf16 base, or all in bf16.

use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};
use torchrl::envs::llm::TokenEnv;
use torchrl::modules::llm::nn::with_init_seed;
use torchrl::modules::llm::{
    ByteTokenizer, CausalLmConfig, CausalLmWithHydraValueHead, LmInput, LoraConfig,
};
use torchrl::trainers::api::Callbacks;
use torchrl::trainers::config::ModelConfig;
use torchrl::trainers::grpo::{GrpoTrainer, GrpoTrlConfig};
use torchrl::trainers::optim::AdamW;
use torchrl::trainers::policy::hydra_policy;
use torchrl::trainers::ppo::PpoRlhfTrainer;

#[path = "common/llm.rs"]
mod llm_fixtures;
use llm_fixtures::{byte_qwen3, constant_lr, gen_kwargs, lowercase_env, tiny_ppo_config};

#[test]
fn adamw_accumulates_bf16_updates_in_a_float32_master() {
    // a constant gradient of 1: each Adam step moves the weight by exactly lr (m / sqrt(v) = 1
    // after bias correction), so 100 steps of 1e-4 take 1.0 to 0.99
    let p = Tensor::from_slice(&[1.0f32])
        .to_kind(Kind::BFloat16)
        .set_requires_grad(true);
    let mut opt = AdamW::new(vec![("p".into(), p.shallow_clone())], 1e-4)
        .unwrap()
        .with_weight_decay(0.0);
    for _ in 0..100 {
        opt.zero_grad();
        (&p * 1.0).sum(Kind::Float).backward();
        opt.step().unwrap();
    }
    let master = opt
        .state_tensors()
        .into_iter()
        .find(|(n, _)| n == "master.p")
        .unwrap()
        .1;
    assert_eq!(master.kind(), Kind::Float);
    // (float32 rounding over 100 additions: a few 1e-6)
    assert!((master.double_value(&[0]) - 0.99).abs() < 1e-5, "{master}");
    // the parameter is the master rounded to bf16: 0.99 lies between 253/256 and 254/256,
    // nearer 253/256
    assert_eq!(p.kind(), Kind::BFloat16);
    assert_eq!(p.double_value(&[0]), 253.0 / 256.0);
    // what bf16 alone would do: 1 - 1e-4 rounds back to 1 (the spacing below 1 is 2^-8)
    let alone = Tensor::from_slice(&[1.0f32]).to_kind(Kind::BFloat16) - 1e-4;
    assert_eq!(alone.to_kind(Kind::BFloat16).double_value(&[0]), 1.0);
}

#[test]
fn adamw_state_with_masters_round_trips_and_a_missing_master_is_named() {
    let p = Tensor::from_slice(&[0.5f32, -0.25])
        .to_kind(Kind::BFloat16)
        .set_requires_grad(true);
    let mut a = AdamW::new(vec![("p".into(), p.shallow_clone())], 1e-3).unwrap();
    for _ in 0..3 {
        a.zero_grad();
        (&p * &p).sum(Kind::Float).backward();
        a.step().unwrap();
    }
    let q = p.detach().copy().set_requires_grad(true);
    let mut b = AdamW::new(vec![("p".into(), q.shallow_clone())], 1e-3).unwrap();
    b.load_state(&a.state_tensors(), &a.state_json()).unwrap();
    for (x, y) in a.state_tensors().iter().zip(b.state_tensors()) {
        assert_eq!(x.0, y.0);
        assert_eq!((&x.1 - &y.1).abs().max().double_value(&[]), 0.0, "{}", x.0);
    }
    let without: Vec<(String, Tensor)> = a
        .state_tensors()
        .into_iter()
        .filter(|(n, _)| !n.starts_with("master."))
        .collect();
    let e = b
        .load_state(&without, &a.state_json())
        .unwrap_err()
        .to_string();
    assert!(e.contains("master.p"), "{e}");
}

fn env(g: i64) -> TokenEnv {
    lowercase_env(&byte_qwen3(), g)
}

/// A Qwen3-shaped base of `seed` in bf16, then the policy `model` says on it (adapters and
/// the value head are created after the cast: float32).
fn bf16_policy(seed: u64, model: &ModelConfig) -> (VarStore, CausalLmWithHydraValueHead) {
    with_init_seed(seed, || {
        let mut vs = VarStore::new(Device::Cpu);
        let base = byte_qwen3().build(&vs.root()).unwrap();
        vs.bfloat16();
        assert_eq!(base.kind(), Kind::BFloat16);
        let m = hydra_policy(&vs.root(), base, model).unwrap();
        (vs, m)
    })
}

#[test]
fn a_bf16_model_is_close_to_its_float32_self() {
    let mut vs = VarStore::new(Device::Cpu);
    let model = with_init_seed(1, || byte_qwen3().build(&vs.root())).unwrap();
    let ids = Tensor::from_slice(&[5i64, 60, 70, 80, 90, 100]).view([1, 6]);
    let f32_logits = model
        .forward(&LmInput::new(&ids), None)
        .unwrap()
        .logits()
        .unwrap();
    vs.bfloat16();
    let bf = model
        .forward(&LmInput::new(&ids), None)
        .unwrap()
        .logits()
        .unwrap();
    assert_eq!(bf.kind(), Kind::BFloat16);
    let d = (bf.to_kind(Kind::Float) - &f32_logits)
        .abs()
        .max()
        .double_value(&[]);
    let scale = f32_logits.abs().max().double_value(&[]);
    // bf16 keeps 8 significant bits: a relative error of a few 2^-8 through two blocks
    assert!(d < 0.05 * scale.max(1.0), "{d} (scale {scale})");
    assert!(d > 0.0);
}

#[test]
fn grpo_with_lora_on_a_bf16_base_learns_and_keeps_the_base() {
    let dir = std::env::temp_dir().join(format!("torchrl-bf16-grpo-{}", std::process::id()));
    let mut c = GrpoTrlConfig::default();
    c.train.batch_size = 8;
    c.train.checkpoint_interval = 1000;
    c.train.checkpoint_dir = dir.display().to_string();
    c.train.seed = 3;
    c.model = ModelConfig {
        peft_config: Some(LoraConfig::new(4).with_lora_alpha(16.0).with_all_linear()),
        ..ModelConfig::default()
    };
    constant_lr(&mut c, 3e-2);
    c.method.num_generations = 4;
    c.method.num_rollouts = 16;
    c.method.chunk_size = 8;
    c.method.gen_kwargs = gen_kwargs(4);
    let (_vs, m) = bf16_policy(4, &c.model);
    let base: Vec<Tensor> = m
        .policy()
        .model()
        .named_parameters()
        .iter()
        .map(|(_, p)| p.copy())
        .collect();
    assert!(m
        .policy()
        .model()
        .adapter_parameters()
        .iter()
        .all(|(_, p)| p.kind() == Kind::Float));
    let mut t = GrpoTrainer::new(c, m, env(4), Box::new(ByteTokenizer::new())).unwrap();
    let mut cb = Callbacks::new();
    let mut scores = Vec::new();
    for _ in 0..30 {
        let s = t.iteration(&mut cb).unwrap();
        assert!(
            s.kl.is_finite() && s.update.values().all(|v| v.is_finite()),
            "{s:?}"
        );
        scores.push(s.score);
    }
    let first: f64 = scores[..5].iter().sum::<f64>() / 5.0;
    let last: f64 = scores[25..].iter().sum::<f64>() / 5.0;
    assert!(last > first + 0.2, "{first} -> {last}: {scores:?}");
    for ((_, p), before) in t
        .model()
        .policy()
        .model()
        .named_parameters()
        .iter()
        .zip(&base)
    {
        assert_eq!((*p - before).abs().max().double_value(&[]), 0.0);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn ppo_rlhf_trains_a_bf16_model_through_float32_masters() {
    let dir = std::env::temp_dir().join(format!("torchrl-bf16-ppo-{}", std::process::id()));
    let mut c = tiny_ppo_config(&dir);
    c.model = ModelConfig {
        num_layers_unfrozen: -1,
        ..ModelConfig::default()
    };
    let (_vs, m) = bf16_policy(6, &c.model);
    let before: Vec<Tensor> = m
        .policy()
        .named_parameters()
        .iter()
        .map(|(_, p)| p.copy())
        .collect();
    let mut t = PpoRlhfTrainer::new(c, m, env(1), Box::new(ByteTokenizer::new())).unwrap();
    let s = t.iteration(&mut Callbacks::new()).unwrap();
    // the first rollout is at the reference; in bf16 the sampler's cached incremental
    // log-probs and the reference's full forward differ by bf16 rounding (float32: < 1e-6)
    assert!(s.kl.abs() < 1e-2, "{}", s.kl);
    assert!(s.update.values().all(|v| v.is_finite()), "{s:?}");
    let after = t.model().policy().named_parameters();
    assert_eq!(after[0].1.kind(), Kind::BFloat16);
    let moved = after
        .iter()
        .zip(&before)
        .filter(|((_, a), b)| (*a - *b).abs().max().double_value(&[]) > 0.0)
        .count();
    assert!(moved > after.len() / 2, "{moved} of {} moved", after.len());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_bf16_hydra_reference_is_made_in_bf16_and_starts_equal_to_the_policy() {
    // the hydra branch and the full reference copy live in a store of their own: made in the
    // policy's dtype, a bf16 policy's reference runs (no float32 / bf16 mix in a product) and
    // starts as the policy's exact copy
    let ids = Tensor::from_slice(&[5i64, 60, 70, 80, 90, 100]).view([1, 6]);
    let input = LmInput::new(&ids);
    for unfrozen in [1, 2, -1] {
        let (_vs, hydra) = with_init_seed(3, || {
            let mut vs = VarStore::new(Device::Cpu);
            vs.set_kind(Kind::BFloat16);
            let base = byte_qwen3().build(&vs.root()).unwrap();
            let hydra = CausalLmWithHydraValueHead::from_model(&vs.root(), base, unfrozen).unwrap();
            (vs, hydra)
        });
        for (name, p) in hydra.reference_store().variables() {
            assert_eq!(p.kind(), Kind::BFloat16, "{unfrozen}: {name}");
        }
        let out = hydra.forward(&input).unwrap();
        assert_eq!(out.ref_logits.kind(), Kind::BFloat16);
        assert!(out.ref_logits.equal(&out.logits), "{unfrozen}");
        assert!(hydra
            .forward_reference(&input)
            .unwrap()
            .ref_logits
            .equal(&out.ref_logits));
    }
}
