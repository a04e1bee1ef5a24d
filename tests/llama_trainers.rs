//! The RLHF trainers on a Llama-family policy (a tiny Qwen3-shaped model: rotary, grouped-query
//! heads, q/k norms, untied head) as well as on GPT-2: GRPO learns the hidden rule and resumes
//! exactly, a PPO-RLHF iteration steps, DPO at init is ln 2 and resumes exactly, SFT's loss
//! falls, a reward model learns a preference, and ILQL spends its budget.

use tch::nn::VarStore;
use tch::{Device, Tensor};
use torchrl::envs::llm::TokenEnv;
use torchrl::modules::llm::models::llama::LlamaModel;
use torchrl::modules::llm::nn::with_init_seed;
use torchrl::modules::llm::{ByteTokenizer, CausalLmWithHydraValueHead, TextTokenizer};
use torchrl::trainers::api::{Callbacks, RlTrainer};
use torchrl::trainers::dpo::DpoTrainer;
use torchrl::trainers::grpo::GrpoTrainer;
use torchrl::trainers::ppo::PpoRlhfTrainer;
use torchrl::trainers::sft::{SftConfig, SftTrainer};

#[path = "common/llm.rs"]
mod llm_fixtures;
use llm_fixtures::{
    aa_over_zz_pairs, byte_qwen3, grpo_config, ilql_config, ilql_data, lowercase_env, max_abs_diff,
    scratch, seeded_hydra, tiny_dpo_config, tiny_ppo_config,
};

fn hydra(seed: u64, unfrozen: i64) -> (VarStore, CausalLmWithHydraValueHead) {
    seeded_hydra(&byte_qwen3(), seed, unfrozen)
}

fn params(m: &CausalLmWithHydraValueHead) -> Vec<Tensor> {
    m.policy()
        .named_parameters()
        .into_iter()
        .map(|(_, t)| t.detach().copy())
        .collect()
}

fn env(g: i64) -> TokenEnv {
    lowercase_env(&byte_qwen3(), g)
}

#[test]
fn grpo_on_a_llama_family_policy_learns_and_resumes_exactly() {
    let dir = scratch("llama-tr", "grpo");
    // 16 rollouts per iteration at a constant 1e-2, DAPO's clip-higher
    let mut c = grpo_config(&dir, 1e-2, 16);
    c.method.epsilon_high = Some(0.28);
    let (_vs, m) = hydra(4, -1);
    let mut t = GrpoTrainer::new(c.clone(), m, env(4), Box::new(ByteTokenizer::new())).unwrap();
    let mut cb = Callbacks::new();
    let mut scores = Vec::new();
    for _ in 0..40 {
        scores.push(t.iteration(&mut cb).unwrap().score);
    }
    let first: f64 = scores[..5].iter().sum::<f64>() / 5.0;
    let last: f64 = scores[35..].iter().sum::<f64>() / 5.0;
    assert!(last > first + 1.0, "{first} -> {last}: {scores:?}");
    // resume: a fresh trainer (other weights) loads the checkpoint and continues identically
    t.save(&dir.join("resume")).unwrap();
    let next_a = t.iteration(&mut cb).unwrap();
    let (_vs2, m2) = hydra(5, -1);
    let mut b = GrpoTrainer::new(c, m2, env(4), Box::new(ByteTokenizer::new())).unwrap();
    b.load(&dir.join("resume")).unwrap();
    let next_b = b.iteration(&mut cb).unwrap();
    assert_eq!(next_a.score, next_b.score);
    assert!(max_abs_diff(&params(t.model()), &params(b.model())) < 1e-6);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn ppo_rlhf_iteration_on_a_llama_family_hydra() {
    let dir = scratch("llama-tr", "ppo");
    let c = tiny_ppo_config(&dir);
    // one unfrozen block: the hydra branch copies a rotary block, the updates start from the
    // cached trunk
    let (_vs, m) = hydra(6, 1);
    let before = params(&m);
    let mut t = PpoRlhfTrainer::new(c, m, env(1), Box::new(ByteTokenizer::new())).unwrap();
    let s = t.iteration(&mut Callbacks::new()).unwrap();
    assert_eq!(s.iter_count, 4); // 2 epochs x 2 minibatches
    assert!(
        s.kl.abs() < 1e-5,
        "the first rollout is at the reference: {}",
        s.kl
    );
    assert!(max_abs_diff(&before, &params(t.model())) > 0.0);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn dpo_on_a_llama_family_policy_starts_at_ln2_and_resumes_exactly() {
    let dir = scratch("llama-tr", "dpo");
    let pairs = aa_over_zz_pairs();
    let c = tiny_dpo_config(&dir);
    let (_vs, m) = hydra(7, 1);
    let mut a =
        DpoTrainer::new(c.clone(), m, pairs.clone(), Box::new(ByteTokenizer::new())).unwrap();
    let mut logs = Vec::new();
    {
        let mut cb = Callbacks::new().on_log(|_, s| {
            logs.push(s.clone());
            Ok(())
        });
        a.train_epoch(&mut cb).unwrap();
    }
    // the first step is at the reference: the sigmoid loss is ln 2
    assert!((logs[0]["loss"] - 2f64.ln()).abs() < 1e-6, "{:?}", logs[0]);
    a.save(&dir.join("resume")).unwrap();
    let mut cb = Callbacks::new();
    let next_a = a.train_epoch(&mut cb).unwrap();
    let (_vs2, m2) = hydra(8, 1);
    let mut b = DpoTrainer::new(c, m2, pairs, Box::new(ByteTokenizer::new())).unwrap();
    b.load(&dir.join("resume")).unwrap();
    let next_b = b.train_epoch(&mut cb).unwrap();
    assert_eq!(next_a["loss"], next_b["loss"]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sft_on_a_llama_family_model_lowers_its_loss() {
    let vs = VarStore::new(Device::Cpu);
    let model = with_init_seed(9, || LlamaModel::new(&vs.root(), &byte_qwen3())).unwrap();
    let tok = ByteTokenizer::new();
    let rows: Vec<Vec<i64>> = ["abab", "cdcd", "efef"]
        .iter()
        .map(|s| tok.encode(s).unwrap())
        .collect();
    let mut t = SftTrainer::new(&model, SftConfig::default().with_lr(1e-2).unwrap()).unwrap();
    let first = t.evaluate(&model, &rows).unwrap();
    for _ in 0..30 {
        t.step(&model, &rows).unwrap();
    }
    let last = t.evaluate(&model, &rows).unwrap();
    assert!(last < first - 0.5, "{first} -> {last}");
}

#[test]
fn a_llama_family_reward_model_learns_the_preference() {
    use torchrl::modules::llm::CausalLmWithScoreHead;
    use torchrl::trainers::reward::{PreferencePair, RewardModelTrainer, RewardTrainerConfig};
    let vs = VarStore::new(Device::Cpu);
    let rm = with_init_seed(10, || CausalLmWithScoreHead::new(&vs.root(), &byte_qwen3())).unwrap();
    let tok = ByteTokenizer::new();
    // chosen completions end in 'a', rejected in 'z'
    let pairs: Vec<PreferencePair> = ["ab", "cd", "ef", "gh"]
        .iter()
        .map(|p| {
            PreferencePair::new(
                tok.encode(&format!("{p}a")).unwrap(),
                tok.encode(&format!("{p}z")).unwrap(),
            )
        })
        .collect();
    let pad = tok.pad_token_id().unwrap();
    let mut t =
        RewardModelTrainer::new(rm, RewardTrainerConfig::default().with_pad_token_id(pad)).unwrap();
    let first = t.evaluate(&pairs).unwrap();
    for _ in 0..40 {
        t.step(&pairs).unwrap();
    }
    let last = t.evaluate(&pairs).unwrap();
    assert!(last.loss < first.loss, "{} -> {}", first.loss, last.loss);
    assert_eq!(last.accuracy, 1.0);
}

#[test]
fn ilql_on_a_llama_family_model_spends_its_budget() {
    use torchrl::modules::llm::CausalLmWithIlqlHeads;
    use torchrl::trainers::ilql::IlqlTrainer;
    let dir = scratch("llama-tr", "ilql");
    let vs = VarStore::new(Device::Cpu);
    let model = with_init_seed(11, || {
        CausalLmWithIlqlHeads::from_model(
            &vs.root(),
            LlamaModel::new(&vs.root(), &byte_qwen3())?,
            true,
            0.5,
        )
    })
    .unwrap();
    let c = ilql_config(&dir);
    let mut t =
        IlqlTrainer::new(c, vs, model, ilql_data(8), Box::new(ByteTokenizer::new())).unwrap();
    let mut losses = Vec::new();
    {
        let mut cb = Callbacks::new().on_log(|_, s| {
            losses.push(s["loss"]);
            Ok(())
        });
        t.learn(&mut cb).unwrap();
    }
    assert_eq!(t.iter_count(), 6); // 3 epochs of 2 minibatches
    assert!(losses.iter().all(|l| l.is_finite()));
    let _ = std::fs::remove_dir_all(&dir);
}
