//! The LLM KL transforms (`envs::llm::{RetrieveLogProb, KLComputation, RetrieveKL,
//! KLRewardTransform}`), trlX's score scaling (`ScoreScaling`) and `RunningMoments`, on tiny
//! random GPT-2 models. Numbers come from rlhf.md §5.3 / §5.5, hand derivations written next
//! to the asserts, and `specs/llm_kl_cases.json` (`specs/record_llm_kl.py`).

mod common;

use std::sync::{Arc, Mutex};

use common::{load_cases, tensor_from_json};
use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};
use torchrl::data::specs::Unbounded;
use torchrl::envs::llm::{
    trlx_logged_kl, KLComputation, KLRewardTransform, KlEstimator, RetrieveKL, RetrieveLogProb,
    ScaleReward, ScoreScaling,
};
use torchrl::envs::transforms::{Compose, RewardScaling, Transform};
use torchrl::envs::EnvSpecs;
use torchrl::modules::llm::{
    token_log_probs, CausalLm, CausalLmWithHydraValueHead, Gpt2Config, Gpt2Model, HydraReference,
    LmInput, ScoreTokens,
};
use torchrl::modules::TensorDictModule;
use torchrl::objectives::llm::moments::{BatchMoments, RunningMoments};
use torchrl::{Error, TensorDict};

fn cfg() -> Gpt2Config {
    Gpt2Config::new(37)
        .with_n_layer(3)
        .with_n_embd(16)
        .with_n_head(2)
        .with_n_positions(16)
}

/// Two rows of 6 tokens: row 0 left-padded (one pad), prompts of 3 real tokens in row 1 and 2
/// in row 0, then 3 response tokens each.
fn batch() -> TensorDict {
    let ids = Tensor::from_slice(&[0i64, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]).view([2, 6]);
    let attn = Tensor::from_slice(&[0i64, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]).view([2, 6]);
    let asst = Tensor::from_slice(&[
        false, false, false, true, true, true, false, false, false, true, true, true,
    ])
    .view([2, 6]);
    let mut td = TensorDict::new([2]).unwrap();
    td.set(("tokens", "full"), ids).unwrap();
    td.set(("masks", "all_attention_mask"), attn).unwrap();
    td.set(("masks", "all_assistant_mask"), asst).unwrap();
    td
}

fn next_with_score(scores: &[f32; 2]) -> TensorDict {
    // the score at the last response token (position 5), 0 elsewhere
    let r = Tensor::zeros([2, 6, 1], (Kind::Float, Device::Cpu));
    r.select(1, 5)
        .copy_(&Tensor::from_slice(scores).view([2, 1]));
    let mut next = TensorDict::new([2]).unwrap();
    next.set("reward", r).unwrap();
    next
}

fn vec(t: &Tensor) -> Vec<f64> {
    Vec::<f64>::try_from(t.to_kind(Kind::Double).reshape([-1])).unwrap()
}

fn close(a: &[f64], b: &[f64], tol: f64) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() <= tol)
}

#[test]
fn retrieve_log_prob_is_token_log_probs_of_the_reference_logits() {
    tch::manual_seed(3);
    let vs = VarStore::new(Device::Cpu);
    let reference = Gpt2Model::new(&vs.root(), &cfg()).unwrap();
    let td = batch();
    let ids = td.get_or_err(("tokens", "full")).unwrap();
    let attn = td.get_or_err(("masks", "all_attention_mask")).unwrap();
    // by hand: logits → log_softmax → gather the next token, shifted to align with tokens
    let logits = reference
        .forward(&LmInput::new(ids).with_attention_mask(attn), None)
        .unwrap()
        .logits()
        .unwrap();
    let lsm = logits.log_softmax(-1, Kind::Float);
    let hand = Tensor::zeros([2, 6], (Kind::Float, Device::Cpu));
    for b in 0..2 {
        for t in 1..6 {
            // real token and real predecessor; only row 0 position 1 has a pad predecessor
            if b == 0 && t == 1 {
                continue;
            }
            let tok = ids.int64_value(&[b, t]);
            let v = lsm.double_value(&[b, t - 1, tok]);
            let _ = hand.get(b).get(t).fill_(v);
        }
    }
    let asst = td.get_or_err(("masks", "all_assistant_mask")).unwrap();
    let hand_masked = &hand * asst.to_kind(Kind::Float);

    let shared = Arc::new(Mutex::new(reference));
    let mut t = RetrieveLogProb::new(Arc::clone(&shared));
    let next = t.step(&td, TensorDict::new([2]).unwrap()).unwrap();
    let got = next.get_or_err(("ref_log_probs", "full")).unwrap();
    assert_eq!(got.size(), vec![2, 6]);
    assert!(close(&vec(got), &vec(&hand_masked), 1e-5));
    // response positions hold real (negative) log-probs, prompt positions 0
    assert!(vec(got)[3] < 0.0 && vec(got)[0] == 0.0 && vec(got)[2] == 0.0);

    // without assistant masking: every real position (and exactly the library's function)
    let mut t = RetrieveLogProb::new(Arc::clone(&shared)).with_assistant_only(false);
    let next = t.step(&td, TensorDict::new([2]).unwrap()).unwrap();
    let got = next.get_or_err(("ref_log_probs", "full")).unwrap();
    assert!(close(&vec(got), &vec(&hand), 1e-5));
    assert!(got.equal(&token_log_probs(&logits, ids, Some(attn)).unwrap()));

    // the trait on the shared handle gives the same thing
    assert!(shared.token_log_probs(ids, attn).unwrap().equal(got));
    // and runs under no_grad
    assert!(!got.requires_grad());
}

#[test]
fn hydra_reference_at_init_gives_zero_kl_both_paths() {
    tch::manual_seed(5);
    let vs = VarStore::new(Device::Cpu);
    let hydra = CausalLmWithHydraValueHead::new(&vs.root(), &cfg(), 1).unwrap();
    let hydra = Arc::new(Mutex::new(hydra));
    let td = batch();
    let ids = td.get_or_err(("tokens", "full")).unwrap();
    let attn = td.get_or_err(("masks", "all_attention_mask")).unwrap();

    // path 1: run the frozen branch (trlX's forward_hydra) in the transform
    let mut root = td.clone();
    root.set(
        ("log_probs", "full"),
        hydra.token_log_probs(ids, attn).unwrap(),
    )
    .unwrap();
    let mut kl = RetrieveKL::new(HydraReference::new(Arc::clone(&hydra))).with_coeff(0.5);
    let next = kl.step(&root, next_with_score(&[1.0, -2.0])).unwrap();
    let k = next.get_or_err("kl_penalty").unwrap();
    assert_eq!(k.size(), vec![2, 6]);
    assert_eq!(
        k.abs().max().double_value(&[]),
        0.0,
        "KL is exactly 0 at init"
    );
    assert!(next
        .get_or_err("reward")
        .unwrap()
        .equal(next_with_score(&[1.0, -2.0]).get_or_err("reward").unwrap()));
    let ran = next
        .get_or_err(("ref_log_probs", "full"))
        .unwrap()
        .shallow_clone();
    // the reference log-probs are real numbers on the response
    assert!(vec(&ran)[4] < 0.0);

    // path 2: the hydra policy wrote both log-probs in its own trunk pass; nothing runs
    let root = TensorDictModule::forward(&*hydra.lock().unwrap(), td.clone()).unwrap();
    let mut kl = RetrieveKL::precomputed().with_coeff(0.5);
    let next = kl.step(&root, next_with_score(&[1.0, -2.0])).unwrap();
    assert_eq!(
        next.get_or_err("kl_penalty")
            .unwrap()
            .abs()
            .max()
            .double_value(&[]),
        0.0
    );
    let pre = next.get_or_err(("ref_log_probs", "full")).unwrap();
    assert!(close(&vec(pre), &vec(&ran), 1e-6));

    // the borrowed view gives the same reference
    let guard = hydra.lock().unwrap();
    let borrowed = HydraReference::new(&*guard)
        .token_log_probs(ids, attn)
        .unwrap();
    let asst = td.get_or_err(("masks", "all_assistant_mask")).unwrap();
    assert!(close(
        &vec(&(borrowed * asst.to_kind(Kind::Float))),
        &vec(&ran),
        1e-6
    ));
}

/// rlhf.md §5.3: lp `[-1, -2, -0.5]`, ref `[-1.2, -1.5, -0.7]`, kl_coef 0.1, score 2.0 on the
/// last token: rewards `[-0.02, 0.05, 1.98]`; here after one masked prompt position.
fn section_5_3() -> (TensorDict, TensorDict) {
    let mut td = TensorDict::new([1]).unwrap();
    td.set(
        ("log_probs", "full"),
        Tensor::from_slice(&[-0.3f64, -1.0, -2.0, -0.5]).view([1, 4]),
    )
    .unwrap();
    td.set(
        ("masks", "all_assistant_mask"),
        Tensor::from_slice(&[0i64, 1, 1, 1]).view([1, 4]),
    )
    .unwrap();
    let mut next = TensorDict::new([1]).unwrap();
    next.set(
        ("ref_log_probs", "full"),
        Tensor::from_slice(&[-4.0f64, -1.2, -1.5, -0.7]).view([1, 4]),
    )
    .unwrap();
    next.set(
        "reward",
        Tensor::from_slice(&[0.0f64, 0.0, 0.0, 2.0]).view([1, 4, 1]),
    )
    .unwrap();
    (td, next)
}

#[test]
fn section_5_3_rewards_k1_and_k3() {
    let (td, next) = section_5_3();
    let mut kl = KLComputation::new().with_coeff(0.1).with_k3_key("kl_k3");
    let next = kl.step(&td, next).unwrap();
    let r = vec(next.get_or_err("reward").unwrap());
    assert_eq!(next.get_or_err("reward").unwrap().size(), vec![1, 4, 1]);
    assert!(close(&r, &[0.0, -0.02, 0.05, 1.98], 1e-12), "{r:?}");
    let k1 = vec(next.get_or_err("kl_penalty").unwrap());
    assert!(close(&k1, &[0.0, 0.2, -0.5, 0.2], 1e-12), "{k1:?}");
    // k3 for logging, TRL's/TorchRL's direction; the prompt position is masked (its huge
    // log-ratio would give exp(-3.7) - 1 + 3.7 = 2.72 there otherwise)
    let k3 = vec(next.get_or_err("kl_k3").unwrap());
    assert!(
        close(&k3, &[0.0, 0.01873075, 0.14872127, 0.01873075], 1e-8),
        "{k3:?}"
    );

    // k2 as the estimator
    let (td, next) = section_5_3();
    let mut kl = KLComputation::new()
        .with_estimator(KlEstimator::K2)
        .with_add_to_reward(false);
    let next = kl.step(&td, next).unwrap();
    let k2 = vec(next.get_or_err("kl_penalty").unwrap());
    assert!(close(&k2, &[0.0, 0.02, 0.125, 0.02], 1e-12), "{k2:?}");
    // not added: the reward is the score alone
    assert!(close(
        &vec(next.get_or_err("reward").unwrap()),
        &[0.0, 0.0, 0.0, 2.0],
        0.0
    ));
}

#[test]
fn k3_direction_is_trl_not_trlx() {
    let lp = Tensor::from_slice(&[-1.0f64, -2.0, -0.5]);
    let rf = Tensor::from_slice(&[-1.2f64, -1.5, -0.7]);
    let ours = vec(&KlEstimator::K3.estimate(&lp, &rf).unwrap());
    assert!(close(&ours, &[0.01873075, 0.14872127, 0.01873075], 1e-8));
    let trlx = vec(&trlx_logged_kl(&lp, &rf).unwrap());
    assert!(close(&trlx, &[0.02140276, 0.10653066, 0.02140276], 1e-8));
    assert_eq!("k3".parse::<KlEstimator>().unwrap(), KlEstimator::K3);

    // Why: on samples from π, the mean of k3 is KL(π‖ref); trlX's form is not.
    // π = [0.6, 0.3, 0.1], ref = [0.2, 0.5, 0.3]: KL(π‖ref) = Σ π ln(π/ref)
    // = 0.6 ln 3 + 0.3 ln 0.6 + 0.1 ln(1/3) = 0.659167 − 0.153248 − 0.109861 = 0.3960585,
    // and E_π[exp(lp − ref) − 1 − (lp − ref)] = Σ π (π/ref) − 1 − KL = 1.0133333 − 0.3960585
    // = 0.6172749 (π/ref = [3, 0.6, 1/3]; Σ π·π/ref = 1.8 + 0.18 + 0.0333333 = 2.0133333).
    let pi = [0.6f64, 0.3, 0.1];
    let rq = [0.2f64, 0.5, 0.3];
    tch::manual_seed(0);
    let n = 400_000;
    let idx = Tensor::from_slice(&pi).multinomial(n, true);
    let lp_all = Tensor::from_slice(&pi).log().index_select(0, &idx);
    let rf_all = Tensor::from_slice(&rq).log().index_select(0, &idx);
    let k3_mean = KlEstimator::K3
        .estimate(&lp_all, &rf_all)
        .unwrap()
        .mean(Kind::Double)
        .double_value(&[]);
    let k1_mean = KlEstimator::K1
        .estimate(&lp_all, &rf_all)
        .unwrap()
        .mean(Kind::Double)
        .double_value(&[]);
    let inv_mean = trlx_logged_kl(&lp_all, &rf_all)
        .unwrap()
        .mean(Kind::Double)
        .double_value(&[]);
    assert!((k3_mean - 0.3960585).abs() < 0.01, "{k3_mean}");
    assert!((k1_mean - 0.3960585).abs() < 0.01, "{k1_mean}");
    assert!((inv_mean - 0.6172749).abs() < 0.01, "{inv_mean}");
}

#[test]
fn kl_is_masked_to_response_tokens_and_reward_updated() {
    tch::manual_seed(7);
    let vs_pol = VarStore::new(Device::Cpu);
    let vs_ref = VarStore::new(Device::Cpu);
    let policy = Gpt2Model::new(&vs_pol.root(), &cfg()).unwrap();
    let reference = Gpt2Model::new(&vs_ref.root(), &cfg()).unwrap();
    let mut td = batch();
    let ids = td.get_or_err(("tokens", "full")).unwrap().shallow_clone();
    let attn = td
        .get_or_err(("masks", "all_attention_mask"))
        .unwrap()
        .shallow_clone();
    let lp = policy.token_log_probs(&ids, &attn).unwrap();
    let rf = reference.token_log_probs(&ids, &attn).unwrap();
    td.set(("log_probs", "full"), lp.shallow_clone()).unwrap();
    let mut t = KLRewardTransform::new(reference, 0.2);
    let next = t.step(&td, next_with_score(&[3.0, 1.0])).unwrap();
    let k = vec(next.get_or_err("kl_penalty").unwrap());
    let (lpv, rfv) = (vec(&lp), vec(&rf));
    let asst = [0, 0, 0, 1, 1, 1, 0, 0, 0, 1, 1, 1];
    for i in 0..12 {
        if asst[i] == 1 {
            assert!((k[i] - (lpv[i] - rfv[i])).abs() < 1e-6);
            assert!(k[i] != 0.0, "different random models differ at {i}");
        } else {
            assert_eq!(k[i], 0.0, "prompt position {i} is masked out");
        }
    }
    // reward = score at the last token − 0.2·k1 on the response tokens
    let r = vec(next.get_or_err("reward").unwrap());
    for i in 0..12 {
        let score = match i {
            5 => 3.0,
            11 => 1.0,
            _ => 0.0,
        };
        assert!((r[i] - (score - 0.2 * k[i])).abs() < 1e-6);
    }
    assert!(t.name().starts_with("llm::KLRewardTransform"));
    t.set_coef(0.0);
    let next = t.step(&td, next_with_score(&[3.0, 1.0])).unwrap();
    assert!(close(
        &vec(next.get_or_err("reward").unwrap()),
        &vec(next_with_score(&[3.0, 1.0]).get_or_err("reward").unwrap()),
        0.0
    ));
}

#[test]
fn forward_on_offline_data_writes_under_next() {
    let (td, next) = section_5_3();
    let mut full = td.clone();
    full.set("next", next).unwrap();
    let mut kl = KLComputation::new().with_coeff(0.1);
    let out = kl.forward(full).unwrap();
    let r = vec(out.get_or_err(("next", "reward")).unwrap());
    assert!(close(&r, &[0.0, -0.02, 0.05, 1.98], 1e-12));
    // a flat tensordict (no "next"): read and written in place, as TorchRL's forward
    let (mut flat, next) = section_5_3();
    flat.update(&next).unwrap();
    let out = kl.forward(flat).unwrap();
    assert!(close(
        &vec(out.get_or_err("reward").unwrap()),
        &[0.0, -0.02, 0.05, 1.98],
        1e-12
    ));
}

#[test]
fn shape_and_dtype_errors_name_both_keys() {
    // shape
    let (td, mut next) = section_5_3();
    next.set(
        ("ref_log_probs", "full"),
        Tensor::zeros([1, 3], (Kind::Double, Device::Cpu)),
    )
    .unwrap();
    let e = KLComputation::new().step(&td, next).unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch { .. }), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("ref_log_probs") && msg.contains("log_probs\", \"full"),
        "{msg}"
    );
    assert!(msg.contains("[1, 4]") && msg.contains("[1, 3]"), "{msg}");
    // dtype
    let (td, mut next) = section_5_3();
    next.set(
        ("ref_log_probs", "full"),
        Tensor::zeros([1, 4], (Kind::Float, Device::Cpu)),
    )
    .unwrap();
    let e = KLComputation::new().step(&td, next).unwrap_err();
    assert!(matches!(e, Error::DtypeMismatch { .. }), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("ref_log_probs") && msg.contains("log_probs\", \"full"),
        "{msg}"
    );
    // integer log-probs
    let (mut td, next) = section_5_3();
    td.set(
        ("log_probs", "full"),
        Tensor::zeros([1, 4], (Kind::Int64, Device::Cpu)),
    )
    .unwrap();
    let e = KLComputation::new().step(&td, next).unwrap_err();
    assert!(e.to_string().contains("floating-point"), "{e}");
    // reward without the trailing 1
    let (td, mut next) = section_5_3();
    next.set("reward", Tensor::zeros([1, 4], (Kind::Double, Device::Cpu)))
        .unwrap();
    let e = KLComputation::new().step(&td, next).unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("reward") && msg.contains("[1, 4, 1]"), "{msg}");
    // missing reference log-probs: both places named
    let (td, mut next) = section_5_3();
    next.remove(("ref_log_probs", "full"));
    let e = KLComputation::new().step(&td, next).unwrap_err();
    let msg = e.to_string();
    assert!(
        matches!(e, Error::KeyNotFound { .. }) && msg.contains("next"),
        "{msg}"
    );
    // precomputed reference log-probs that were never computed
    let e = RetrieveLogProb::precomputed()
        .step(&batch(), TensorDict::new([2]).unwrap())
        .unwrap_err();
    assert!(e.to_string().contains("precomputed"), "{e}");
    // a model on mismatched inputs
    tch::manual_seed(0);
    let vs = VarStore::new(Device::Cpu);
    let m = Gpt2Model::new(&vs.root(), &cfg()).unwrap();
    let mut td = batch();
    td.set(
        ("masks", "all_attention_mask"),
        Tensor::ones([2, 5], (Kind::Int64, Device::Cpu)),
    )
    .unwrap();
    let e = RetrieveLogProb::new(m)
        .step(&td, TensorDict::new([2]).unwrap())
        .unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch { .. }), "{e}");
    assert!(e.to_string().contains("all_attention_mask"), "{e}");
    // parse errors
    assert!("k4".parse::<KlEstimator>().is_err());
    assert!("normalize".parse::<ScaleReward>().is_err());
    assert!(ScoreScaling::new(ScaleReward::Running)
        .with_cliprange_reward(Some(0.0))
        .is_err());
}

#[test]
fn specs_get_llm_shapes() {
    let specs = EnvSpecs::new([2])
        .unwrap()
        .with_observation(
            ("tokens", "full"),
            Unbounded::new()
                .with_dtype(Kind::Int64)
                .unwrap()
                .with_shape([2, 6])
                .unwrap(),
        )
        .unwrap()
        .with_reward("reward", Unbounded::new().with_shape([2, 1]).unwrap())
        .unwrap();
    let out = RetrieveKL::precomputed()
        .transform_output_spec(specs.clone())
        .unwrap();
    // TorchRL: reward (*batch, -1, 1), kl_penalty / ref_log_probs.full (*batch, -1): "any
    // length" dims, whatever the parent's token length (6 here)
    let reward = out.reward.get("reward").unwrap();
    assert_eq!(reward.shape(), &[2, -1, 1]);
    assert!(reward.is_dynamic());
    assert_eq!(reward.dtype(), Some(Kind::Float));
    let kl = out.observation.get("kl_penalty").unwrap();
    assert_eq!(kl.shape(), &[2, -1]);
    assert!(kl.is_dynamic());
    let rf = out.observation.get(("ref_log_probs", "full")).unwrap();
    assert_eq!(rf.shape(), &[2, -1]);
    assert!(rf.is_dynamic());
    // any length is in the specs, the batch dim stays fixed
    let fits = |spec: &torchrl::specs::TensorSpec, shape: &[i64]| {
        let v = Tensor::zeros(shape, (Kind::Float, Device::Cpu));
        spec.is_in(&torchrl::Entry::Tensor(v)).unwrap()
    };
    for t in [1, 6, 9] {
        assert!(fits(reward, &[2, t, 1]), "reward of length {t}");
        assert!(fits(kl, &[2, t]), "kl_penalty of length {t}");
        assert!(fits(rf, &[2, t]), "ref_log_probs of length {t}");
    }
    assert!(!fits(kl, &[3, 6]), "the batch dim is fixed");
    let t = RetrieveKL::precomputed();
    let keys: Vec<String> = t.new_output_keys().iter().map(|k| k.to_string()).collect();
    assert_eq!(keys.len(), 2, "{keys:?}");
    // without add_to_reward the reward spec is the parent's
    let out = KLComputation::new()
        .with_add_to_reward(false)
        .transform_output_spec(specs)
        .unwrap();
    assert_eq!(out.reward.get("reward").unwrap().shape(), &[2, 1]);
    // the parent needs no token spec any more (the length is -1), and a double reward keeps
    // its dtype
    let bare = EnvSpecs::new([2])
        .unwrap()
        .with_reward(
            "reward",
            Unbounded::new()
                .with_dtype(Kind::Double)
                .unwrap()
                .with_shape([2, 1])
                .unwrap(),
        )
        .unwrap();
    let out = KLComputation::new().transform_output_spec(bare).unwrap();
    let reward = out.reward.get("reward").unwrap();
    assert_eq!(reward.shape(), &[2, -1, 1]);
    assert_eq!(reward.dtype(), Some(Kind::Double));
    assert_eq!(out.observation.get("kl_penalty").unwrap().shape(), &[2, -1]);
}

#[test]
fn reward_scaling_acts_elementwise_on_token_rewards() {
    // (B, T, 1) rewards: r * scale + loc at every position
    let mut td = TensorDict::new([2]).unwrap();
    td.set(
        "reward",
        Tensor::from_slice(&[0.0f32, 0.0, 1.0, 0.0, 0.0, -2.0]).view([2, 3, 1]),
    )
    .unwrap();
    let mut t = RewardScaling::new(0.5, 2.0).unwrap();
    let out = t.forward(td).unwrap();
    let r = vec(out.get_or_err("reward").unwrap());
    assert_eq!(out.get_or_err("reward").unwrap().size(), vec![2, 3, 1]);
    assert_eq!(r, vec![0.5, 0.5, 2.5, 0.5, 0.5, -3.5]);
    // the (B, T, 1) reward spec is kept, fixed or "any length"
    let spec = torchrl::data::specs::Composite::new([2])
        .unwrap()
        .with("reward", Unbounded::new().with_shape([2, 3, 1]).unwrap())
        .unwrap();
    let out = t.transform_reward_spec(spec).unwrap();
    assert_eq!(out.get("reward").unwrap().shape(), &[2, 3, 1]);
    let spec = torchrl::data::specs::Composite::new([2])
        .unwrap()
        .with(
            "reward",
            Unbounded::new().with_dynamic_shape([2, -1, 1]).unwrap(),
        )
        .unwrap();
    let out = t.transform_reward_spec(spec).unwrap();
    assert_eq!(out.get("reward").unwrap().shape(), &[2, -1, 1]);
}

fn scaling_step(s: &mut ScoreScaling, scores: &[f32]) -> Vec<f64> {
    let b = scores.len() as i64;
    let r = Tensor::zeros([b, 3, 1], (Kind::Float, Device::Cpu));
    r.select(1, 2)
        .copy_(&Tensor::from_slice(scores).view([b, 1]));
    let mut next = TensorDict::new([b]).unwrap();
    next.set("reward", r).unwrap();
    let next = s.step(&TensorDict::new([b]).unwrap(), next).unwrap();
    let out = next.get_or_err("reward").unwrap();
    // only the score position is ever non-zero
    assert_eq!(
        out.select(1, 0).abs().sum(Kind::Double).double_value(&[]),
        0.0
    );
    vec(&out.select(1, 2))
}

#[test]
fn score_scaling_running_and_ref_match_section_5_5() {
    // running: divided by the running std of all totals seen (rlhf.md §5.5)
    let mut s = ScoreScaling::new(ScaleReward::Running);
    let first = scaling_step(&mut s, &[1.0, 2.0, 3.0, 4.0]);
    let std1 = 1.2909944487;
    assert!(close(
        &first,
        &[1.0 / std1, 2.0 / std1, 3.0 / std1, 4.0 / std1],
        1e-6
    ));
    let second = scaling_step(&mut s, &[5.0, 6.0]);
    let std2 = 1.8708286934;
    assert!(close(&second, &[5.0 / std2, 6.0 / std2], 1e-6));
    let m = s.running_moments();
    assert!((m.mean() - 3.5).abs() < 1e-12 && (m.var() - 2.9166666667).abs() < 1e-9);
    // "scale_reward=running turns a score of 2.0 into 1.0690449676"
    assert!((2.0 / m.std() - 1.0690449676).abs() < 1e-9);
    let (bm, bs) = s.last_batch_stats().unwrap();
    assert!(
        (bm - 5.5).abs() < 1e-12 && (bs - std::f64::consts::FRAC_1_SQRT_2).abs() < 1e-9 /* §5.5: 0.7071067812 */
    );

    // ref: the first batch's std, for ever
    let mut s = ScoreScaling::new(ScaleReward::Ref);
    let first = scaling_step(&mut s, &[1.0, 2.0, 3.0, 4.0]);
    assert!(close(
        &first,
        &[1.0 / std1, 2.0 / std1, 3.0 / std1, 4.0 / std1],
        1e-6
    ));
    let second = scaling_step(&mut s, &[5.0, 6.0]);
    assert!(close(&second, &[5.0 / std1, 6.0 / std1], 1e-6));
    let (rm, rs) = s.ref_stats().unwrap();
    assert!((rm - 2.5).abs() < 1e-12 && (rs - std1).abs() < 1e-9);

    // ignored + clipping at trlX's default 10: only the clip acts
    let mut s = ScoreScaling::new(ScaleReward::Ignored);
    assert_eq!(
        scaling_step(&mut s, &[12.0, -30.0, 3.0]),
        vec![10.0, -10.0, 3.0]
    );
    // clipping happens before the statistics: the totals were [10, -10, 3]
    assert!((s.running_moments().mean() - 1.0).abs() < 1e-12);
    // no clipping
    let mut s = ScoreScaling::new(ScaleReward::Ignored)
        .with_cliprange_reward(None)
        .unwrap();
    assert_eq!(scaling_step(&mut s, &[12.0, -30.0]), vec![12.0, -30.0]);
    // preset ref_std (trlX's config ref_std)
    let mut s = ScoreScaling::new(ScaleReward::Ref)
        .with_ref_stats(0.0, 4.0)
        .unwrap();
    assert_eq!(scaling_step(&mut s, &[2.0, 8.0]), vec![0.5, 2.0]);
    // a first batch of one sample has no std: an error, not NaN rewards
    let mut s = ScoreScaling::new(ScaleReward::Running);
    let mut next = TensorDict::new([1]).unwrap();
    next.set(
        "reward",
        Tensor::ones([1, 3, 1], (Kind::Float, Device::Cpu)),
    )
    .unwrap();
    let e = s.step(&TensorDict::new([1]).unwrap(), next).unwrap_err();
    assert!(e.to_string().contains("std"), "{e}");
}

#[test]
fn score_scaling_runs_before_the_kl_in_a_compose() {
    // trlX: rewards = -kl_coef·k1 + scaled score. ScoreScaling first, then KLComputation.
    let (td, _) = section_5_3();
    let mut c = Compose::new();
    c.push(
        ScoreScaling::new(ScaleReward::Ref)
            .with_ref_stats(0.0, 4.0)
            .unwrap(),
    );
    c.push(KLComputation::new().with_coeff(0.1));
    let (_, next) = section_5_3();
    let next = c.step(&td, next).unwrap();
    // score 2.0 / 4 = 0.5 at the last token; then −0.1·k1 = [−0.02, 0.05, −0.02]
    let r = vec(next.get_or_err("reward").unwrap());
    assert!(close(&r, &[0.0, -0.02, 0.05, 0.48], 1e-12), "{r:?}");
}

#[test]
fn running_moments_section_5_5() {
    let mut m = RunningMoments::new();
    assert_eq!(
        (m.mean(), m.var(), m.std(), m.count()),
        (0.0, 1.0, 1.0, 1e-24)
    );
    let (bm, bs) = m
        .update(&Tensor::from_slice(&[1.0f64, 2.0, 3.0, 4.0]))
        .unwrap();
    assert!((bm - 2.5).abs() < 1e-12 && (bs - 1.2909944487).abs() < 1e-9);
    assert!((m.mean() - 2.5).abs() < 1e-12);
    assert!((m.var() - 1.25).abs() < 1e-12);
    assert!((m.std() - 1.2909944487).abs() < 1e-9);
    assert_eq!(m.count(), 4.0);
    let (bm, bs) = m.update(&Tensor::from_slice(&[5.0f64, 6.0])).unwrap();
    assert!(
        (bm - 5.5).abs() < 1e-12 && (bs - std::f64::consts::FRAC_1_SQRT_2).abs() < 1e-9 /* §5.5: 0.7071067812 */
    );
    assert!((m.mean() - 3.5).abs() < 1e-12);
    assert!((m.var() - 2.9166666667).abs() < 1e-9);
    assert!((m.std() - 1.8708286934).abs() < 1e-9);
    assert_eq!(m.count(), 6.0);
    assert!(m
        .update(&Tensor::zeros([0], (Kind::Float, Device::Cpu)))
        .is_err());
}

#[test]
fn merged_batch_moments_update_like_one_batch() {
    // what an all-reduce would do: two processes' moments merged, then one update
    let a = Tensor::from_slice(&[0.5f64, -1.0, 2.0]);
    let b = Tensor::from_slice(&[3.0f64, 4.5]);
    let mut one = RunningMoments::new();
    one.update(&Tensor::from_slice(&[9.0f64, 7.0])).unwrap();
    let mut two = one;
    let r1 = one.update(&Tensor::cat(&[&a, &b], 0)).unwrap();
    let merged = BatchMoments::of(&a)
        .unwrap()
        .merge(&BatchMoments::of(&b).unwrap());
    let r2 = two.update_with(&merged);
    assert!((r1.0 - r2.0).abs() < 1e-12 && (r1.1 - r2.1).abs() < 1e-12);
    assert!((one.mean() - two.mean()).abs() < 1e-12);
    assert!((one.var() - two.var()).abs() < 1e-12);
    assert!((one.std() - two.std()).abs() < 1e-12);
    assert_eq!(one.count(), two.count());
}

#[test]
fn recorded_cases_replay() {
    let file = load_cases("llm_kl_cases.json");
    let mut n_rm = 0;
    let mut n_kl = 0;
    for case in &file.cases {
        match case.op.as_str() {
            "running_moments" => {
                n_rm += 1;
                let mut m = RunningMoments::new();
                let steps = case.arg("steps").unwrap().as_array().unwrap();
                for (i, s) in steps.iter().enumerate() {
                    let xs = tensor_from_json(s.get("xs").unwrap()).unwrap();
                    let (bm, bs) = m.update(&xs).unwrap();
                    let f = |k: &str| s.get(k).unwrap().as_f64().unwrap();
                    let ctx = format!("{} step {i}", case.name);
                    assert!((bm - f("batch_mean")).abs() < 1e-12, "{ctx}");
                    assert!((bs - f("batch_std")).abs() < 1e-12, "{ctx}");
                    assert!((m.mean() - f("mean")).abs() < 1e-10, "{ctx}");
                    assert!((m.var() - f("var")).abs() < 1e-10, "{ctx}");
                    assert!((m.std() - f("std")).abs() < 1e-10, "{ctx}");
                    assert!((m.count() - f("count")).abs() < 1e-12, "{ctx}");
                }
            }
            "kl_estimators" => {
                n_kl += 1;
                let lp = tensor_from_json(case.arg("log_probs").unwrap()).unwrap();
                let rf = tensor_from_json(case.arg("ref_log_probs").unwrap()).unwrap();
                let want = |k: &str| vec(&tensor_from_json(case.expect.get(k).unwrap()).unwrap());
                for (name, est) in [
                    ("k1", KlEstimator::K1),
                    ("k2", KlEstimator::K2),
                    ("k3", KlEstimator::K3),
                ] {
                    let got = vec(&est.estimate(&lp, &rf).unwrap());
                    assert!(close(&got, &want(name), 1e-12), "{} {name}", case.name);
                }
                let got = vec(&trlx_logged_kl(&lp, &rf).unwrap());
                assert!(close(&got, &want("trlx_logged"), 1e-12), "{}", case.name);
            }
            other => panic!("unknown op {other}"),
        }
    }
    assert_eq!((n_rm, n_kl), (3, 2));
}
