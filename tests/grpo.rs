//! GRPO: group advantages, the token objective (rlhf.md §3.2, §4.4, §5.8) and the entropy
//! bonus, all hand-derived (the recorded upstream cases are in `tests/grpo_dpo_recorded.rs`).

use std::cell::Cell;
use std::rc::Rc;

use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};
use torchrl::modules::llm::{
    CausalLmWithHydraValueHead, CausalLmWithValueHead, Gpt2Config, LmInput, ScoreFn, ScoreRequest,
    ScoreTokens, TokenScores,
};
use torchrl::objectives::llm::{
    group_advantages, grpo_loss, grpo_loss_with_entropy, token_entropy, GroupScale,
    GrpoAggregation, GrpoConfig, GrpoLoss,
};
use torchrl::objectives::{LossModule, LossOutput};
use torchrl::{Error, TensorDict};

/// TorchRL's defaults without the entropy bonus (tested on its own below).
fn plain() -> GrpoConfig {
    GrpoConfig::new().with_entropy_coeff(None)
}

fn t(v: &[f64], shape: &[i64]) -> Tensor {
    Tensor::from_slice(v).view(shape)
}

/// Log-probs, values and entropy from one scorer call.
fn lve(m: &impl ScoreTokens, tokens: &Tensor, mask: &Tensor) -> (Tensor, Tensor, Option<Tensor>) {
    let s = m
        .score_tokens(tokens, mask, ScoreRequest::values_and_entropy())
        .unwrap();
    (s.log_probs, s.values.unwrap(), s.entropy)
}

fn vals(x: &Tensor) -> Vec<f64> {
    Vec::<f64>::try_from(x.reshape([-1])).unwrap()
}

fn close(got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{got:?} vs {want:?}");
    for (g, w) in got.iter().zip(want) {
        assert!((g - w).abs() < tol, "{got:?} vs {want:?}");
    }
}

fn scalar(x: &Tensor) -> f64 {
    x.double_value(&[])
}

// ------------------------------------------------------------------ advantages

#[test]
fn group_advantages_rlhf_5_8() {
    let r = t(&[1.0, 0.0, 0.0, 1.0], &[4]);
    let a = group_advantages(&r, 4, GroupScale::StdClampMin).unwrap();
    close(
        &vals(&a),
        &[0.8660254038, -0.8660254038, -0.8660254038, 0.8660254038],
        1e-10,
    );
    let a = group_advantages(&r, 4, GroupScale::StdPlusEps).unwrap();
    close(
        &vals(&a),
        &[0.8658754298, -0.8658754298, -0.8658754298, 0.8658754298],
        1e-10,
    );
    // one group: the batch std is the group std
    let a = group_advantages(&r, 4, GroupScale::BatchStdPlusEps).unwrap();
    close(
        &vals(&a),
        &[0.8658754298, -0.8658754298, -0.8658754298, 0.8658754298],
        1e-10,
    );
    let a = group_advantages(&r, 4, GroupScale::None).unwrap();
    close(&vals(&a), &[0.5, -0.5, -0.5, 0.5], 1e-15);
}

#[test]
fn group_advantages_two_groups_each_scale() {
    // groups [1, 0] (mean 0.5, std 1/√2) and [3, 3] (mean 3, std 0); batch std 1.5
    let r = t(&[1.0, 0.0, 3.0, 3.0], &[4, 1]);
    let s = std::f64::consts::FRAC_1_SQRT_2;
    let a = group_advantages(&r, 2, GroupScale::StdClampMin).unwrap();
    assert_eq!(a.size(), vec![4, 1]);
    close(&vals(&a), &[0.5 / s, -0.5 / s, 0.0, 0.0], 1e-12);
    let a = group_advantages(&r, 2, GroupScale::StdPlusEps).unwrap();
    close(
        &vals(&a),
        &[0.5 / (s + 1e-4), -0.5 / (s + 1e-4), 0.0, 0.0],
        1e-12,
    );
    let a = group_advantages(&r, 2, GroupScale::BatchStdPlusEps).unwrap();
    close(&vals(&a), &[0.5 / 1.5001, -0.5 / 1.5001, 0.0, 0.0], 1e-12);
    let a = group_advantages(&r, 2, GroupScale::None).unwrap();
    close(&vals(&a), &[0.5, -0.5, 0.0, 0.0], 1e-15);
    // a group of 1 needs no std when not scaling
    let a = group_advantages(&r, 1, GroupScale::None).unwrap();
    close(&vals(&a), &[0.0; 4], 1e-15);
}

#[test]
fn group_advantages_errors() {
    let r = t(&[1.0, 0.0, 0.0, 1.0], &[4]);
    assert!(group_advantages(&r, 3, GroupScale::StdClampMin).is_err());
    assert!(group_advantages(&r, 0, GroupScale::None).is_err());
    assert!(group_advantages(&r, 1, GroupScale::StdClampMin).is_err());
    assert!(group_advantages(&r, 1, GroupScale::StdPlusEps).is_err());
    assert!(group_advantages(&r.to_kind(Kind::Int64), 2, GroupScale::None).is_err());
    assert!(group_advantages(&r.view([2, 2]), 2, GroupScale::None).is_err());
    let one = t(&[1.0], &[1]);
    assert!(group_advantages(&one, 1, GroupScale::BatchStdPlusEps).is_err());
}

// ------------------------------------------------------------------ token objective

fn rlhf_5_8() -> (Tensor, Tensor, Tensor, Tensor) {
    let old = t(&[-1.0, -1.0, -1.0], &[1, 3]);
    let lp = (&old + t(&[0.3, -0.3, 0.05], &[1, 3])).set_requires_grad(true);
    let adv = t(&[1.0, -1.0, -1.0], &[1, 3]);
    let mask = Tensor::ones([1, 3], (Kind::Int64, Device::Cpu));
    (lp, old, adv, mask)
}

#[test]
fn token_objective_rlhf_5_8() {
    let (lp, old, adv, mask) = rlhf_5_8();
    let cfg = plain().with_aggregation(GrpoAggregation::None);
    let out = grpo_loss(&lp, &old, &adv, &mask, None, &cfg).unwrap();
    close(
        &vals(&out.loss_objective),
        &[-1.2, 0.8, 1.0512710964],
        1e-10,
    );
    let out = grpo_loss(&lp, &old, &adv, &mask, None, &plain()).unwrap();
    close(&[scalar(&out.loss_objective)], &[0.2170903655], 1e-10);
    // tokens 1 and 2 are outside [log 0.8, log 1.2]
    close(&[scalar(&out.clip_fraction)], &[2.0 / 3.0], 1e-12);
    close(
        &[scalar(&out.kl_approx)],
        &[-(0.3 - 0.3 + 0.05) / 3.0],
        1e-12,
    );
    assert!(out.loss_kl_to_ref.is_none() && out.kl_to_ref.is_none());
    let names: Vec<_> = out.metrics().iter().map(|(n, _)| *n).collect();
    assert_eq!(names, ["clip_fraction", "kl_approx", "ESS"]);
    out.total_loss().unwrap().backward();
    // only token 3 (unclipped, A = −1) has a gradient: −A·exp(0.05)/3
    close(&vals(&lp.grad()), &[0.0, 0.0, 0.05f64.exp() / 3.0], 1e-10);
}

/// A padded 2×3 batch at the rollout policy (ratio 1), A = [1, −2] per sequence:
/// ℓ = [[−1, −1, −1], [2, 2, pad]], Σ = 1 over n = 5 tokens.
fn padded() -> (Tensor, Tensor, Tensor, Tensor) {
    let old = t(&[-1.0, -2.0, -0.5, -1.0, -0.7, f64::NAN], &[2, 3]);
    let lp = t(&[-1.0, -2.0, -0.5, -1.0, -0.7, f64::NAN], &[2, 3]).set_requires_grad(true);
    let adv = t(&[1.0, -2.0], &[2]);
    let mask = t(&[1.0, 1.0, 1.0, 1.0, 1.0, 0.0], &[2, 3]);
    (lp, old, adv, mask)
}

#[test]
fn every_aggregation_on_a_padded_batch() {
    let (lp, old, adv, mask) = padded();
    let cases = [
        (GrpoAggregation::TokenMean, 0.2),
        (GrpoAggregation::Bnpo, 0.2),
        (
            GrpoAggregation::Dapo {
                active_tokens: None,
            },
            0.2,
        ),
        (
            GrpoAggregation::Dapo {
                active_tokens: Some(10.0),
            },
            0.1,
        ),
        (GrpoAggregation::PromptMean, 0.5),
        (GrpoAggregation::Grpo, 0.5),
        (
            GrpoAggregation::DrGrpo {
                max_completion_length: None,
            },
            1.0 / 6.0,
        ),
        (
            GrpoAggregation::DrGrpo {
                max_completion_length: Some(4),
            },
            1.0 / 8.0,
        ),
    ];
    for (agg, want) in cases {
        let cfg = plain().with_aggregation(agg);
        let out = grpo_loss(&lp, &old, &adv, &mask, None, &cfg).unwrap();
        close(&[scalar(&out.loss_objective)], &[want], 1e-12);
        assert_eq!(scalar(&out.clip_fraction), 0.0);
        assert_eq!(scalar(&out.kl_approx), 0.0);
        close(&[scalar(&out.ess)], &[1.0], 1e-12);
    }
    let cfg = plain().with_aggregation(GrpoAggregation::None);
    let out = grpo_loss(&lp, &old, &adv, &mask, None, &cfg).unwrap();
    assert_eq!(vals(&out.loss_objective), [-1.0, -1.0, -1.0, 2.0, 2.0, 0.0]);
    // the NaN in the padded slot does not leak into the gradient
    let cfg = plain().with_aggregation(GrpoAggregation::PromptMean);
    let out = grpo_loss(&lp, &old, &adv, &mask, None, &cfg).unwrap();
    out.total_loss().unwrap().backward();
    // d/dlp of −A·exp(lw) at lw = 0, /3 (row 1), /2 (row 2), /2 (batch mean)
    close(
        &vals(&lp.grad()),
        &[-1.0 / 6.0, -1.0 / 6.0, -1.0 / 6.0, 0.5, 0.5, 0.0],
        1e-12,
    );
}

#[test]
fn asymmetric_clamp_dapo() {
    // lw = [0.24, 0.3, −0.3], A = [1, −1, 1]
    let old = t(&[0.0; 3], &[1, 3]);
    let lp = t(&[0.24, 0.3, -0.3], &[1, 3]);
    let adv = t(&[1.0, -1.0, 1.0], &[1, 3]);
    let mask = t(&[1.0; 3], &[1, 3]);
    let none = GrpoAggregation::None;
    let sym = plain().with_aggregation(none);
    let out = grpo_loss(&lp, &old, &adv, &mask, None, &sym).unwrap();
    close(
        &vals(&out.loss_objective),
        &[-1.2, 0.3f64.exp(), -(-0.3f64).exp()],
        1e-12,
    );
    close(&[scalar(&out.clip_fraction)], &[1.0], 1e-12);
    let dapo = sym.with_clip_epsilon_asymmetric(0.20, 0.28);
    let out = grpo_loss(&lp, &old, &adv, &mask, None, &dapo).unwrap();
    // 0.24 < log 1.28 is no longer clipped; 0.3 clips at 1.28 only where A > 0 matters
    close(
        &vals(&out.loss_objective),
        &[-(0.24f64.exp()), 0.3f64.exp(), -(-0.3f64).exp()],
        1e-12,
    );
    close(&[scalar(&out.clip_fraction)], &[2.0 / 3.0], 1e-12);
    let lp = t(&[0.3], &[1, 1]);
    let one = |a: f64| t(&[a], &[1, 1]);
    let out = grpo_loss(&lp, &one(0.0), &one(1.0), &one(1.0), None, &dapo).unwrap();
    close(&vals(&out.loss_objective), &[-1.28], 1e-12);
}

#[test]
fn ess_hand_case() {
    // weights exp(lw) = [1, 2] on two tokens, a padded third: (1 + 2)² / (1 + 4) / 2 = 0.9
    let old = t(&[0.0; 3], &[1, 3]);
    let lp = t(&[0.0, 2f64.ln(), 7.0], &[1, 3]);
    let adv = t(&[1.0], &[1]);
    let mask = t(&[1.0, 1.0, 0.0], &[1, 3]);
    let out = grpo_loss(&lp, &old, &adv, &mask, None, &plain()).unwrap();
    close(&[scalar(&out.ess)], &[0.9], 1e-12);
    close(&[scalar(&out.kl_approx)], &[-(2f64.ln()) / 2.0], 1e-12);
    close(&[scalar(&out.clip_fraction)], &[0.5], 1e-12);
}

#[test]
fn kl_to_ref_k3() {
    // rlhf.md §5.3: k3 = [0.01873075, 0.14872127, 0.01873075]
    let lp = t(&[-1.0, -2.0, -0.5], &[1, 3]).set_requires_grad(true);
    let reference = t(&[-1.2, -1.5, -0.7], &[1, 3]);
    let adv = t(&[0.0], &[1]);
    let mask = t(&[1.0; 3], &[1, 3]);
    let kl = (0.01873075307798 * 2.0 + 0.14872127070013) / 3.0;
    // logged only
    let out = grpo_loss(&lp, &lp.detach(), &adv, &mask, Some(&reference), &plain()).unwrap();
    close(&[scalar(out.kl_to_ref.as_ref().unwrap())], &[kl], 1e-10);
    assert!(out.loss_kl_to_ref.is_none());
    // in the loss
    let cfg = plain().with_kl_to_ref_coeff(Some(0.1));
    let out = grpo_loss(&lp, &lp.detach(), &adv, &mask, Some(&reference), &cfg).unwrap();
    close(
        &[scalar(out.loss_kl_to_ref.as_ref().unwrap())],
        &[0.1 * kl],
        1e-10,
    );
    let names: Vec<_> = out.loss_terms().iter().map(|(n, _)| *n).collect();
    assert_eq!(names, ["loss_objective", "loss_kl_to_ref"]);
    close(&[scalar(&out.total_loss().unwrap())], &[0.1 * kl], 1e-10);
    out.total_loss().unwrap().backward();
    // d/dlp of 0.1·mean(expm1(d) − d), d = ref − lp: 0.1·(1 − exp(d))/3
    let want: Vec<f64> = [-0.2f64, 0.5, -0.2]
        .iter()
        .map(|d| 0.1 * (1.0 - d.exp()) / 3.0)
        .collect();
    close(&vals(&lp.grad()), &want, 1e-10);
}

#[test]
fn token_objective_errors() {
    let (lp, old, adv, mask) = rlhf_5_8();
    let cfg = plain();
    let bad_cfg = |c: GrpoConfig, field: &str| {
        let e = grpo_loss(&lp, &old, &adv, &mask, None, &c).unwrap_err();
        assert!(
            matches!(e, Error::InvalidConfig { field: f, .. } if f == field),
            "{e}"
        );
    };
    bad_cfg(cfg.clone().with_clip_epsilon(1.0), "clip_epsilon_low");
    bad_cfg(cfg.clone().with_clip_epsilon(0.0), "clip_epsilon_low");
    bad_cfg(
        cfg.clone().with_clip_epsilon_asymmetric(0.2, f64::INFINITY),
        "clip_epsilon_high",
    );
    bad_cfg(
        cfg.clone().with_kl_to_ref_coeff(Some(-1.0)),
        "kl_to_ref_coeff",
    );
    bad_cfg(cfg.clone().with_entropy_coeff(Some(-0.01)), "entropy_coeff");
    bad_cfg(
        cfg.clone().with_entropy_coeff(Some(f64::NAN)),
        "entropy_coeff",
    );
    let dr = GrpoAggregation::DrGrpo {
        max_completion_length: Some(0),
    };
    bad_cfg(cfg.clone().with_aggregation(dr), "aggregation");
    let dapo = GrpoAggregation::Dapo {
        active_tokens: Some(0.0),
    };
    bad_cfg(cfg.clone().with_aggregation(dapo), "aggregation");
    // KL coefficient without reference log-probs
    let kl = cfg.clone().with_kl_to_ref_coeff(Some(0.1));
    assert!(grpo_loss(&lp, &old, &adv, &mask, None, &kl).is_err());
    // shapes
    assert!(grpo_loss(&lp, &old.view([3, 1]), &adv, &mask, None, &cfg).is_err());
    assert!(grpo_loss(&lp.view([3]), &old.view([3]), &adv, &mask, None, &cfg).is_err());
    assert!(grpo_loss(&lp, &old, &t(&[1.0, 2.0], &[2]), &mask, None, &cfg).is_err());
    assert!(grpo_loss(&lp, &old, &adv, &mask, Some(&t(&[0.0], &[1, 1])), &cfg).is_err());
    // dtype and an all-zero mask
    let ints = adv.to_kind(Kind::Int64);
    assert!(grpo_loss(&lp, &old, &ints, &mask, None, &cfg).is_err());
    assert!(grpo_loss(&lp, &old, &adv, &mask.zeros_like(), None, &cfg).is_err());
}

// ------------------------------------------------------------------ loss module

fn rollout() -> TensorDict {
    let row = |v: &[f64]| t(v, &[1, 3]);
    TensorDict::new([1])
        .unwrap()
        .with(
            ("tokens", "full"),
            Tensor::from_slice(&[5i64, 6, 7]).view([1, 3]),
        )
        .unwrap()
        .with(
            ("masks", "all_attention_mask"),
            Tensor::ones([1, 3], (Kind::Int64, Device::Cpu)),
        )
        .unwrap()
        .with(("masks", "all_assistant_mask"), row(&[0.0, 1.0, 1.0]))
        .unwrap()
        .with(("log_probs", "full"), row(&[0.0, -1.0, -1.0]))
        .unwrap()
        .with(("next", "ref_log_probs", "full"), row(&[0.0, -1.2, -0.5]))
        .unwrap()
        .with("advantage", t(&[0.5], &[1, 1]))
        .unwrap()
}

#[test]
fn loss_module_keys_and_kl() {
    let theta = t(&[0.0, -1.0, -1.0], &[1, 3]).set_requires_grad(true);
    let th = theta.shallow_clone();
    let policy =
        ScoreFn(move |_t: &Tensor, _m: &Tensor| Ok((th.shallow_clone(), Some(th.zeros_like()))));
    let loss = GrpoLoss::new(policy);
    assert_eq!(loss.in_keys().len(), 5);
    let td = rollout();
    let out = loss.forward(&td).unwrap();
    close(&[scalar(&out.loss_objective)], &[-0.5], 1e-12);
    assert!(out.kl_to_ref.is_none());

    let mut loss = loss
        .with_config(plain().with_kl_to_ref_coeff(Some(1.0)))
        .unwrap();
    assert_eq!(loss.in_keys().len(), 6);
    let out = loss.forward(&td).unwrap();
    // d = ref − lp on the response: [−0.2, 0.5]
    let kl = ((-0.2f64).exp_m1() + 0.2 + 0.5f64.exp_m1() - 0.5) / 2.0;
    close(&[scalar(out.kl_to_ref.as_ref().unwrap())], &[kl], 1e-12);
    out.total_loss().unwrap().backward();
    assert!(theta.grad().defined());

    // set_keys: a renamed reference entry
    let td2 = rollout()
        .with("my_ref", t(&[0.0, -1.2, -0.5], &[1, 3]))
        .unwrap();
    loss.set_keys(&[("ref_log_probs", Some("my_ref".into()))])
        .unwrap();
    let my_ref: torchrl::tensordict::NestedKey = "my_ref".into();
    assert!(loss.in_keys().contains(&my_ref));
    let out2 = loss.forward(&td2).unwrap();
    close(&[scalar(out2.kl_to_ref.as_ref().unwrap())], &[kl], 1e-12);
    assert!(loss.set_keys(&[("no_such_key", None)]).is_err());
    loss.set_keys(&[("advantage", Some("adv".into()))]).unwrap();
    assert!(loss.forward(&td).is_err());
    // back to the default
    loss.set_keys(&[("advantage", None), ("ref_log_probs", None)])
        .unwrap();
    assert!(loss.forward(&td).is_ok());
}

#[test]
fn loss_module_rejects_a_policy_of_the_wrong_shape() {
    let policy = ScoreFn(|_t: &Tensor, _m: &Tensor| {
        let z = Tensor::zeros([1, 2], (Kind::Double, Device::Cpu));
        Ok((z.shallow_clone(), Some(z)))
    });
    let loss = GrpoLoss::new(policy);
    assert!(loss.forward(&rollout()).is_err());
    let e = GrpoLoss::new(ScoreFn(
        |_t: &Tensor, _m: &Tensor| -> torchrl::Result<(Tensor, Option<Tensor>)> { unreachable!() },
    ))
    .with_config(plain().with_clip_epsilon(-0.1));
    assert!(e.is_err());
}

// ------------------------------------------------------------------ entropy

/// `−Σ p ln p` of `softmax(z)`, by hand.
fn entropy_of(z: &[f64]) -> f64 {
    let s: f64 = z.iter().map(|x| x.exp()).sum();
    z.iter()
        .map(|x| {
            let p = x.exp() / s;
            -p * p.ln()
        })
        .sum()
}

#[test]
fn token_entropy_uniform_is_log_v_and_aligned_with_the_tokens() {
    // uniform logits over V = 6: log 6 at every t >= 1, 0 at t = 0
    let uniform = Tensor::zeros([2, 4, 6], (Kind::Double, Device::Cpu));
    let h = token_entropy(&uniform, None).unwrap();
    assert_eq!(h.size(), [2, 4]);
    assert_eq!(h.kind(), Kind::Double);
    let l6 = 6f64.ln();
    close(&vals(&h), &[0.0, l6, l6, l6, 0.0, l6, l6, l6], 1e-12);
    // a left-padded second row: 0 where the token or the one before it is padding
    let mask = t(&[1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0], &[2, 4]);
    let h = token_entropy(&uniform, Some(&mask)).unwrap();
    close(&vals(&h), &[0.0, l6, l6, l6, 0.0, 0.0, 0.0, l6], 1e-12);
    // H[t] is the entropy of the logits at t − 1: [ln 1, ln 2, ln 3] at position 0, a
    // near-one-hot row at position 1
    let z = [0.0, 2f64.ln(), 3f64.ln()];
    let logits = t(
        &[z[0], z[1], z[2], 30.0, 0.0, 0.0, 0.0, 0.0, 0.0],
        &[1, 3, 3],
    )
    .set_requires_grad(true);
    let h = token_entropy(&logits, None).unwrap();
    let hz = entropy_of(&z);
    close(&vals(&h), &[0.0, hz, entropy_of(&[30.0, 0.0, 0.0])], 1e-12);
    assert!((hz - 1.0114042647073518).abs() < 1e-12);
    // dH/dz_i = −p_i (ln p_i + H); the last position's logits predict nothing
    h.sum(Kind::Double).backward();
    let p: [f64; 3] = [1.0 / 6.0, 2.0 / 6.0, 3.0 / 6.0];
    let g: Vec<f64> = p.iter().map(|p| -p * (p.ln() + hz)).collect();
    let got = vals(&logits.grad());
    close(&got[..3], &g, 1e-12);
    close(&got[6..], &[0.0; 3], 1e-15);
    // float32 in, float32 out
    let h32 = token_entropy(&uniform.to_kind(Kind::Float), None).unwrap();
    assert_eq!(h32.kind(), Kind::Float);
    // errors name the argument
    let e = token_entropy(&uniform.sum_dim_intlist(-1, false, None::<Kind>), None).unwrap_err();
    assert!(e.to_string().contains("logits"), "{e}");
    assert!(token_entropy(&uniform.to_kind(Kind::Int64), None).is_err());
    let e = token_entropy(&uniform, Some(&t(&[1.0; 4], &[1, 4]))).unwrap_err();
    assert!(e.to_string().contains("mask"), "{e}");
}

/// A padded 2×3 batch at the rollout policy with A = 0 (objective 0), an entropy per token and
/// a reference: rows of 3 and 2 response tokens.
fn entropy_batch() -> (Tensor, Tensor, Tensor, Tensor, Tensor) {
    let lp = t(&[-1.0, -2.0, -0.5, -1.5, -0.25, f64::NAN], &[2, 3]).set_requires_grad(true);
    let adv = t(&[0.0, 0.0], &[2]);
    let mask = t(&[1.0, 1.0, 1.0, 1.0, 1.0, 0.0], &[2, 3]);
    let h = t(&[0.6, 1.2, 0.3, 2.0, 1.0, f64::NAN], &[2, 3]).set_requires_grad(true);
    let reference = t(&[-1.2, -1.5, -0.5, -1.0, -0.5, 0.0], &[2, 3]);
    (lp, adv, mask, h, reference)
}

#[test]
fn exact_entropy_bonus_under_every_aggregation() {
    let (lp, adv, mask, h, _) = entropy_batch();
    let old = lp.detach();
    let c = 0.1;
    let token_mean = (0.6 + 1.2 + 0.3 + 2.0 + 1.0) / 5.0;
    let prompt_mean = ((0.6 + 1.2 + 0.3) / 3.0 + (2.0 + 1.0) / 2.0) / 2.0;
    let cases = [
        (GrpoAggregation::TokenMean, -c * token_mean),
        (GrpoAggregation::PromptMean, -c * prompt_mean),
        // TRL's bonus is the token mean whatever the loss type
        (GrpoAggregation::Grpo, -c * token_mean),
        (GrpoAggregation::Bnpo, -c * token_mean),
        (
            GrpoAggregation::DrGrpo {
                max_completion_length: Some(8),
            },
            -c * token_mean,
        ),
        (
            GrpoAggregation::Dapo {
                active_tokens: Some(50.0),
            },
            -c * token_mean,
        ),
    ];
    for (agg, want) in cases {
        let cfg = GrpoConfig::new()
            .with_entropy_coeff(Some(c))
            .with_aggregation(agg);
        let out = grpo_loss_with_entropy(&lp, &old, &adv, &mask, None, Some(&h), &cfg).unwrap();
        close(
            &[scalar(out.loss_entropy.as_ref().unwrap())],
            &[want],
            1e-12,
        );
        close(
            &[scalar(out.entropy.as_ref().unwrap())],
            &[token_mean],
            1e-12,
        );
        let names: Vec<_> = out.loss_terms().iter().map(|(n, _)| *n).collect();
        assert_eq!(names, ["loss_objective", "loss_entropy"], "{agg:?}");
        assert!(out.metrics().iter().any(|(n, _)| *n == "entropy"));
        close(&[scalar(&out.total_loss().unwrap())], &[want], 1e-12);
    }
    // none: per token, −c·H on the mask and 0 (not NaN) outside
    let cfg = GrpoConfig::new()
        .with_entropy_coeff(Some(c))
        .with_aggregation(GrpoAggregation::None);
    let out = grpo_loss_with_entropy(&lp, &old, &adv, &mask, None, Some(&h), &cfg).unwrap();
    close(
        &vals(out.loss_entropy.as_ref().unwrap()),
        &[-0.06, -0.12, -0.03, -0.2, -0.1, 0.0],
        1e-12,
    );
    // the gradient reaches the entropy (−c/n per masked token), never the padded NaN
    let cfg = GrpoConfig::new().with_entropy_coeff(Some(c));
    let out = grpo_loss_with_entropy(&lp, &old, &adv, &mask, None, Some(&h), &cfg).unwrap();
    out.total_loss().unwrap().backward();
    close(
        &vals(&h.grad()),
        &[-0.02, -0.02, -0.02, -0.02, -0.02, 0.0],
        1e-12,
    );
    // the entropy is logged without the bonus when given; nothing without either
    let out = grpo_loss_with_entropy(&lp, &old, &adv, &mask, None, Some(&h), &plain()).unwrap();
    close(
        &[scalar(out.entropy.as_ref().unwrap())],
        &[token_mean],
        1e-12,
    );
    assert!(out.loss_entropy.is_none());
    let out = grpo_loss(&lp, &old, &adv, &mask, None, &plain()).unwrap();
    assert!(out.entropy.is_none() && out.loss_entropy.is_none());
    // shape and dtype of the entropy
    let cfg = GrpoConfig::new();
    let bad = t(&[1.0; 3], &[1, 3]);
    let e = grpo_loss_with_entropy(&lp, &old, &adv, &mask, None, Some(&bad), &cfg).unwrap_err();
    assert!(e.to_string().contains("entropy"), "{e}");
    let ints = h.detach().to_kind(Kind::Int64);
    assert!(grpo_loss_with_entropy(&lp, &old, &adv, &mask, None, Some(&ints), &cfg).is_err());
}

#[test]
fn monte_carlo_entropy_without_an_exact_one() {
    // TorchRL's default coefficient 0.01; H ≈ −lp at the rollout's tokens
    let (lp, adv, mask, _, _) = entropy_batch();
    let out = grpo_loss(&lp, &lp.detach(), &adv, &mask, None, &GrpoConfig::new()).unwrap();
    let mc = (1.0 + 2.0 + 0.5 + 1.5 + 0.25) / 5.0;
    close(&[scalar(out.entropy.as_ref().unwrap())], &[mc], 1e-12);
    close(
        &[scalar(out.loss_entropy.as_ref().unwrap())],
        &[-0.01 * mc],
        1e-12,
    );
    // its gradient is the score: d(−0.01·mean(−lp))/dlp = 0.01/n (A = 0: no objective term)
    out.total_loss().unwrap().backward();
    close(
        &vals(&lp.grad()),
        &[0.002, 0.002, 0.002, 0.002, 0.002, 0.0],
        1e-12,
    );
}

#[test]
fn kl_is_reduced_as_the_named_reference_does() {
    let (lp, adv, mask, _, reference) = entropy_batch();
    let old = lp.detach();
    let k3 = |d: f64| d.exp_m1() - d;
    // d = ref − lp on the mask
    let rows = [vec![k3(-0.2), k3(0.5), k3(0.0)], vec![k3(0.5), k3(-0.25)]];
    let sum: f64 = rows.iter().flatten().sum();
    let token_mean = sum / 5.0;
    let per_row = (rows[0].iter().sum::<f64>() / 3.0 + rows[1].iter().sum::<f64>() / 2.0) / 2.0;
    let beta = 0.04;
    let cases = [
        // TorchRL's names: a token mean (whatever the objective's reduction)
        (GrpoAggregation::TokenMean, token_mean),
        (GrpoAggregation::PromptMean, token_mean),
        (GrpoAggregation::None, token_mean),
        // TRL's: β·k3 is part of the per-token loss, reduced with it
        (GrpoAggregation::Grpo, per_row),
        (GrpoAggregation::Bnpo, token_mean),
        (
            GrpoAggregation::DrGrpo {
                max_completion_length: Some(8),
            },
            sum / 16.0,
        ),
        (
            GrpoAggregation::Dapo {
                active_tokens: Some(20.0),
            },
            sum / 20.0,
        ),
        (
            GrpoAggregation::Dapo {
                active_tokens: None,
            },
            token_mean,
        ),
    ];
    for (agg, want) in cases {
        let cfg = plain()
            .with_kl_to_ref_coeff(Some(beta))
            .with_aggregation(agg);
        let out = grpo_loss(&lp, &old, &adv, &mask, Some(&reference), &cfg).unwrap();
        close(
            &[scalar(out.loss_kl_to_ref.as_ref().unwrap())],
            &[beta * want],
            1e-12,
        );
        // the logged KL is always the token mean (TRL's `kl`)
        close(
            &[scalar(out.kl_to_ref.as_ref().unwrap())],
            &[token_mean],
            1e-12,
        );
    }
}

#[test]
fn advantages_in_torchrl_reward_layout() {
    // TorchRL's LLM rewards (and MCAdvantage's output) are [B, 1, 1]
    let (lp, old, adv, mask) = rlhf_5_8();
    let per_seq = t(&[0.5], &[1, 1, 1]);
    let a = grpo_loss(&lp, &old, &per_seq, &mask, None, &plain()).unwrap();
    let b = grpo_loss(&lp, &old, &t(&[0.5], &[1]), &mask, None, &plain()).unwrap();
    close(
        &[scalar(&a.loss_objective)],
        &[scalar(&b.loss_objective)],
        1e-15,
    );
    assert!(grpo_loss(&lp, &old, &adv.view([1, 3, 1]), &mask, None, &plain()).is_ok());
    assert!(grpo_loss(
        &lp,
        &old,
        &t(&[0.5, 0.5], &[1, 2, 1]),
        &mask,
        None,
        &plain()
    )
    .is_err());
}

// ------------------------------------------------------------------ entropy through policies

/// A policy whose causal-LM logits `[B, T, V]` are a tensor; counts which method ran.
struct LogitsPolicy {
    logits: Tensor,
    plain_calls: Cell<usize>,
    entropy_calls: Cell<usize>,
}

impl LogitsPolicy {
    fn new(logits: Tensor) -> Self {
        LogitsPolicy {
            logits,
            plain_calls: Cell::new(0),
            entropy_calls: Cell::new(0),
        }
    }

    fn lp(&self, tokens: &Tensor) -> Tensor {
        let (b, t, _) = self.logits.size3().unwrap();
        let lp = self
            .logits
            .narrow(1, 0, t - 1)
            .log_softmax(-1, Kind::Double)
            .gather(-1, &tokens.narrow(1, 1, t - 1).unsqueeze(-1), false)
            .squeeze_dim(-1);
        Tensor::cat(
            &[&Tensor::zeros([b, 1], (Kind::Double, Device::Cpu)), &lp],
            1,
        )
    }
}

impl ScoreTokens for LogitsPolicy {
    fn score_tokens(
        &self,
        tokens: &Tensor,
        attention_mask: &Tensor,
        request: ScoreRequest,
    ) -> torchrl::Result<TokenScores> {
        let lp = self.lp(tokens);
        let entropy = if request.entropy {
            self.entropy_calls.set(self.entropy_calls.get() + 1);
            Some(token_entropy(&self.logits, Some(attention_mask))?)
        } else {
            self.plain_calls.set(self.plain_calls.get() + 1);
            None
        };
        Ok(TokenScores {
            values: Some(lp.zeros_like()),
            log_probs: lp,
            entropy,
        })
    }
}

#[test]
fn loss_module_uses_the_exact_entropy_when_the_policy_gives_it() {
    // uniform logits over V = 8: H = log 8 on the two response tokens, whatever the tokens
    let policy = LogitsPolicy::new(Tensor::zeros([1, 3, 8], (Kind::Double, Device::Cpu)));
    let loss = GrpoLoss::new(&policy);
    let td = rollout();
    let out = loss.forward(&td).unwrap();
    assert_eq!(
        (policy.plain_calls.get(), policy.entropy_calls.get()),
        (0, 1)
    );
    close(
        &[scalar(out.entropy.as_ref().unwrap())],
        &[8f64.ln()],
        1e-12,
    );
    close(
        &[scalar(out.loss_entropy.as_ref().unwrap())],
        &[-0.01 * 8f64.ln()],
        1e-12,
    );
    // the bonus off: the plain method, no entropy
    let loss = GrpoLoss::new(&policy).with_config(plain()).unwrap();
    let out = loss.forward(&td).unwrap();
    assert_eq!(
        (policy.plain_calls.get(), policy.entropy_calls.get()),
        (1, 1)
    );
    assert!(out.entropy.is_none() && out.loss_entropy.is_none());
    // Box, Rc and references forward the entropy method, not the provided default
    let boxed: Box<dyn ScoreTokens> = Box::new(LogitsPolicy::new(Tensor::zeros(
        [1, 3, 8],
        (Kind::Double, Device::Cpu),
    )));
    let out = GrpoLoss::new(boxed).forward(&td).unwrap();
    close(
        &[scalar(out.entropy.as_ref().unwrap())],
        &[8f64.ln()],
        1e-12,
    );
    let shared = Rc::new(LogitsPolicy::new(Tensor::zeros(
        [1, 3, 8],
        (Kind::Double, Device::Cpu),
    )));
    let out = GrpoLoss::new(Rc::clone(&shared)).forward(&td).unwrap();
    close(
        &[scalar(out.entropy.as_ref().unwrap())],
        &[8f64.ln()],
        1e-12,
    );
    assert_eq!(shared.entropy_calls.get(), 1);
    // a closure policy: the Monte-Carlo estimate −lp = mean(1, 1) on the response
    let th = t(&[0.0, -1.0, -1.0], &[1, 3]);
    let f =
        ScoreFn(move |_t: &Tensor, _m: &Tensor| Ok((th.shallow_clone(), Some(th.zeros_like()))));
    let out = GrpoLoss::new(f).forward(&td).unwrap();
    close(&[scalar(out.entropy.as_ref().unwrap())], &[1.0], 1e-12);
}

#[test]
fn loss_module_rejects_an_entropy_of_the_wrong_shape() {
    struct Bad;
    impl ScoreTokens for Bad {
        fn score_tokens(
            &self,
            t: &Tensor,
            _m: &Tensor,
            _r: ScoreRequest,
        ) -> torchrl::Result<TokenScores> {
            let z = t.zeros_like().to_kind(Kind::Double);
            Ok(TokenScores {
                log_probs: z.shallow_clone(),
                values: Some(z),
                entropy: Some(Tensor::zeros([1, 2], (Kind::Double, Device::Cpu))),
            })
        }
    }
    let e = GrpoLoss::new(Bad).forward(&rollout()).unwrap_err();
    assert!(e.to_string().contains("entropy"), "{e}");
}

fn tiny_config() -> Gpt2Config {
    Gpt2Config::new(20)
        .with_n_layer(2)
        .with_n_embd(16)
        .with_n_head(2)
        .with_n_positions(16)
}

#[test]
fn gpt2_value_head_gives_the_entropy_of_its_own_logits() {
    tch::manual_seed(3);
    let vs = VarStore::new(Device::Cpu);
    let model = CausalLmWithValueHead::new(&vs.root(), &tiny_config()).unwrap();
    let tokens = Tensor::from_slice(&[0i64, 3, 4, 5, 6, 7, 8, 9]).view([2, 4]);
    let mask = t(&[0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0], &[2, 4]).to_kind(Kind::Int64);
    let (lp, v, h) = lve(&model, &tokens, &mask);
    let (lp2, v2) = model.log_probs_and_values(&tokens, &mask).unwrap();
    assert!(lp.equal(&lp2) && v.equal(&v2));
    let h = h.expect("the value-head model gives its entropy");
    let logits = model
        .forward(&LmInput::new(&tokens).with_attention_mask(&mask))
        .unwrap()
        .logits;
    let want = token_entropy(&logits, Some(&mask)).unwrap();
    assert_eq!(h.kind(), lp.kind());
    close(
        &vals(&h.to_kind(Kind::Double)),
        &vals(&want.to_kind(Kind::Double)),
        1e-6,
    );
    // the padded slot, and the first real token of the left-padded row, have none
    assert_eq!(vals(&h.to_kind(Kind::Double))[..2], [0.0, 0.0]);
    let hv = vals(&h.to_kind(Kind::Double));
    assert!(hv[2] > 0.0 && hv[2] <= 20f64.ln() + 1e-6);
    // the hydra model forwards to its policy side
    let vs = VarStore::new(Device::Cpu);
    let hydra = CausalLmWithHydraValueHead::new(&vs.root(), &tiny_config(), 1).unwrap();
    let (_, _, h) = lve(&hydra, &tokens, &mask);
    let (_, _, h_policy) = lve(hydra.policy(), &tokens, &mask);
    assert!(h.unwrap().equal(&h_policy.unwrap()));
}

#[test]
fn gpt2_with_zero_output_embeddings_has_entropy_log_v() {
    // the LM head is tied to the token embeddings: zero them and every logit is 0, so every
    // real next-token distribution is uniform over V = 20
    tch::manual_seed(4);
    let vs = VarStore::new(Device::Cpu);
    let model = CausalLmWithValueHead::new(&vs.root(), &tiny_config()).unwrap();
    tch::no_grad(|| {
        for (name, mut var) in vs.variables() {
            if name.contains("wte") {
                let _ = var.zero_();
            }
        }
    });
    let tokens = Tensor::from_slice(&[1i64, 2, 3, 4]).view([1, 4]);
    let mask = tokens.ones_like();
    let (lp, _, h) = lve(&model, &tokens, &mask);
    let l20 = 20f64.ln();
    close(
        &vals(&h.unwrap().to_kind(Kind::Double)),
        &[0.0, l20, l20, l20],
        1e-5,
    );
    close(
        &vals(&lp.to_kind(Kind::Double)),
        &[0.0, -l20, -l20, -l20],
        1e-5,
    );
}
