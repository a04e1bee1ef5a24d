//! GRPO: group advantages and the token objective (rlhf.md §3.2, §4.4, §5.8).

use tch::{Device, Kind, Tensor};
use torchrl::objectives::llm::{
    group_advantages, grpo_loss, GroupScale, GrpoAggregation, GrpoConfig, GrpoLoss, PolicyValueFn,
};
use torchrl::objectives::{LossModule, LossOutput};
use torchrl::{Error, TensorDict};

fn t(v: &[f64], shape: &[i64]) -> Tensor {
    Tensor::from_slice(v).view(shape)
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
    let cfg = GrpoConfig::new().with_aggregation(GrpoAggregation::None);
    let out = grpo_loss(&lp, &old, &adv, &mask, None, &cfg).unwrap();
    close(
        &vals(&out.loss_objective),
        &[-1.2, 0.8, 1.0512710964],
        1e-10,
    );
    let out = grpo_loss(&lp, &old, &adv, &mask, None, &GrpoConfig::new()).unwrap();
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
        let cfg = GrpoConfig::new().with_aggregation(agg);
        let out = grpo_loss(&lp, &old, &adv, &mask, None, &cfg).unwrap();
        close(&[scalar(&out.loss_objective)], &[want], 1e-12);
        assert_eq!(scalar(&out.clip_fraction), 0.0);
        assert_eq!(scalar(&out.kl_approx), 0.0);
        close(&[scalar(&out.ess)], &[1.0], 1e-12);
    }
    let cfg = GrpoConfig::new().with_aggregation(GrpoAggregation::None);
    let out = grpo_loss(&lp, &old, &adv, &mask, None, &cfg).unwrap();
    assert_eq!(vals(&out.loss_objective), [-1.0, -1.0, -1.0, 2.0, 2.0, 0.0]);
    // the NaN in the padded slot does not leak into the gradient
    let cfg = GrpoConfig::new().with_aggregation(GrpoAggregation::PromptMean);
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
    let sym = GrpoConfig::new().with_aggregation(none);
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
    let out = grpo_loss(&lp, &old, &adv, &mask, None, &GrpoConfig::new()).unwrap();
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
    let out = grpo_loss(
        &lp,
        &lp.detach(),
        &adv,
        &mask,
        Some(&reference),
        &GrpoConfig::new(),
    )
    .unwrap();
    close(&[scalar(out.kl_to_ref.as_ref().unwrap())], &[kl], 1e-10);
    assert!(out.loss_kl_to_ref.is_none());
    // in the loss
    let cfg = GrpoConfig::new().with_kl_to_ref_coeff(Some(0.1));
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
    let cfg = GrpoConfig::new();
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
        PolicyValueFn(move |_t: &Tensor, _m: &Tensor| Ok((th.shallow_clone(), th.zeros_like())));
    let loss = GrpoLoss::new(policy);
    assert_eq!(loss.in_keys().len(), 5);
    let td = rollout();
    let out = loss.forward(&td).unwrap();
    close(&[scalar(&out.loss_objective)], &[-0.5], 1e-12);
    assert!(out.kl_to_ref.is_none());

    let mut loss = loss
        .with_config(GrpoConfig::new().with_kl_to_ref_coeff(Some(1.0)))
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
    let policy = PolicyValueFn(|_t: &Tensor, _m: &Tensor| {
        let z = Tensor::zeros([1, 2], (Kind::Double, Device::Cpu));
        Ok((z.shallow_clone(), z))
    });
    let loss = GrpoLoss::new(policy);
    assert!(loss.forward(&rollout()).is_err());
    let e = GrpoLoss::new(PolicyValueFn(
        |_t: &Tensor, _m: &Tensor| -> torchrl::Result<(Tensor, Tensor)> { unreachable!() },
    ))
    .with_config(GrpoConfig::new().with_clip_epsilon(-0.1));
    assert!(e.is_err());
}
