//! The RLHF maths of `torchrl::objectives::llm` and the TRL options of `RewardModelLoss`.
//!
//! 1. Replays `specs/rlhf_cases.json` (recorded by `specs/record_rlhf.py`; Python is never
//!    run): TRL's `RewardTrainer.compute_loss` itself; TRL's masked statistics, trlX's
//!    controller, GAE loop, `whiten` and `PPOConfig.loss`, hand-derived from their formulas
//!    (and cross-checked by the recorder against the upstream code when a snapshot is there).
//!    Inputs are full-length `[B, T]` with junk (or NaN) outside the mask, which must not
//!    matter.
//! 2. rlhf.md §5.1, §5.2, §5.3, §5.4 and §5.6, literally.
//! 3. The reference bugs (rlhf.md §1, §7), each showing the reference's number and ours.
//! 4. `PpoRlhfLoss` end to end on a tiny GPT-2 with a value head (and its hydra form): value
//!    alignment, keys, errors.

mod recorded;

use recorded::{f, tensor};

use serde_json::Value;
use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};
use torchrl::modules::llm::{
    CausalLmWithHydraValueHead, CausalLmWithValueHead, Gpt2Config, LmInput, ScoreFn, ScoreTokens,
};
use torchrl::objectives::llm::{
    align_values_to_tokens, compute_ppo_rlhf_advantages, gae_advantages_and_returns, masked_mean,
    masked_var, masked_whiten, mean_sequence_kl, ppo_rlhf_loss, whiten, AdaptiveKLController,
    FixedKLController, KlController, KlEstimator, PpoRlhfConfig, PpoRlhfInputs, PpoRlhfKeys,
    PpoRlhfLoss, PpoRlhfLossOutput,
};
use torchrl::objectives::{AcceptedKeys, Centering, LossModule, LossOutput, RewardModelLoss};
use torchrl::{Error, NestedKey, TensorDict};

const TOL: f64 = 1e-10;

// ------------------------------------------------------------------ helpers

fn cases(kind: &str) -> Vec<Value> {
    recorded::cases("rlhf_cases.json", "record_rlhf.py", kind)
}

fn vec64(t: &Tensor) -> Vec<f64> {
    Vec::<f64>::try_from(t.to_kind(Kind::Double).view([-1])).expect("f64 vector")
}

fn assert_close(got: &Tensor, want: &Tensor, tol: f64, what: &str) {
    assert_eq!(got.size(), want.size(), "{what}: shape");
    for (i, (g, w)) in vec64(got).iter().zip(vec64(want)).enumerate() {
        assert!(
            (g - w).abs() <= tol * w.abs().max(1.0),
            "{what}[{i}]: {g} vs {w}"
        );
    }
}

fn assert_scalar(got: &Tensor, want: f64, tol: f64, what: &str) {
    let g = got.double_value(&[]);
    assert!(
        (g - want).abs() <= tol * want.abs().max(1.0),
        "{what}: {g} vs {want}"
    );
}

fn row(v: &[f64]) -> Tensor {
    Tensor::from_slice(v).view([1, v.len() as i64])
}

// ------------------------------------------------------------------ 1. recorded cases

#[test]
fn replay_adaptive_kl_controller() {
    for c in cases("adaptive_kl") {
        let mut ctl =
            AdaptiveKLController::new(f(&c["init"]), f(&c["target"]), f(&c["horizon"])).unwrap();
        let n = c["n_steps"].as_u64().unwrap() as usize;
        for (cur, want) in c["currents"]
            .as_array()
            .unwrap()
            .iter()
            .zip(c["values"].as_array().unwrap())
        {
            ctl.update(f(cur), n).unwrap();
            assert!(
                (ctl.value() - f(want)).abs() < 1e-14,
                "{}: {} vs {}",
                c["name"],
                ctl.value(),
                want
            );
        }
    }
}

#[test]
fn replay_masked_statistics() {
    for c in cases("masked_stats") {
        let name = c["name"].as_str().unwrap();
        // NaN outside the mask (JSON has no NaN, so it is put back here) must not leak
        let x_finite = tensor(&c["x_finite"]);
        let m = tensor(&c["mask"]);
        let x = x_finite.where_scalarother(&m.ne(0), f64::NAN);
        let e = &c["expect"];
        assert_close(
            &masked_mean(&x, &m).unwrap(),
            &tensor(&e["mean"]),
            TOL,
            name,
        );
        assert_close(
            &masked_var(&x, &m, true).unwrap(),
            &tensor(&e["var_unbiased"]),
            TOL,
            name,
        );
        assert_close(
            &masked_var(&x, &m, false).unwrap(),
            &tensor(&e["var_biased"]),
            TOL,
            name,
        );
        assert_close(
            &masked_whiten(&x, &m, true).unwrap(),
            &tensor(&e["whiten"]),
            TOL,
            name,
        );
        assert_close(
            &masked_whiten(&x, &m, false).unwrap(),
            &tensor(&e["whiten_no_shift"]),
            TOL,
            name,
        );
        assert_close(
            &whiten(&x_finite, true).unwrap(),
            &tensor(&e["trlx_whiten"]),
            TOL,
            name,
        );
        assert_close(
            &whiten(&x_finite, false).unwrap(),
            &tensor(&e["trlx_whiten_no_shift"]),
            TOL,
            name,
        );
        // a bool mask gives the same
        assert_close(
            &masked_whiten(&x, &m.ne(0), true).unwrap(),
            &tensor(&e["whiten"]),
            TOL,
            name,
        );
    }
}

#[test]
fn replay_masked_gae_and_whitening() {
    for c in cases("gae") {
        let name = c["name"].as_str().unwrap();
        let (v, r, m) = (
            tensor(&c["values"]),
            tensor(&c["rewards"]),
            tensor(&c["mask"]),
        );
        let (gamma, lam) = (f(&c["gamma"]), f(&c["lam"]));
        let (adv, ret) = gae_advantages_and_returns(&v, &r, &m, gamma, lam).unwrap();
        assert_close(&adv, &tensor(&c["advantages"]), TOL, name);
        assert_close(&ret, &tensor(&c["returns"]), TOL, name);
        assert!(!adv.requires_grad() && !ret.requires_grad());
        // the one call a trainer makes: GAE, then masked whitening, into the tensordict
        let b = v.size()[0];
        let mut td = TensorDict::new([b])
            .unwrap()
            .with("values", v.shallow_clone())
            .unwrap()
            .with(("next", "reward"), r.unsqueeze(-1)) // TorchRL's [B, T, 1] reward
            .unwrap()
            .with(("masks", "all_assistant_mask"), m.shallow_clone())
            .unwrap();
        let cfg = PpoRlhfConfig::new().with_gamma(gamma).with_lam(lam);
        compute_ppo_rlhf_advantages(&mut td, &PpoRlhfKeys::default(), &cfg).unwrap();
        assert_close(
            td.get_or_err("advantage").unwrap(),
            &tensor(&c["advantages_whitened"]),
            1e-9,
            name,
        );
        assert_close(
            td.get_or_err("value_target").unwrap(),
            &tensor(&c["returns"]),
            TOL,
            name,
        );
    }
}

#[test]
fn replay_ppo_rlhf_loss_and_gradients() {
    for c in cases("ppo_loss") {
        let name = c["name"].as_str().unwrap();
        let cfg_v = &c["config"];
        let cfg = PpoRlhfConfig::new()
            .with_cliprange(f(&cfg_v["cliprange"]))
            .with_cliprange_value(f(&cfg_v["cliprange_value"]))
            .with_vf_coef(f(&cfg_v["vf_coef"]));
        let lp = tensor(&c["log_probs"]).set_requires_grad(true);
        let v = tensor(&c["values"]).set_requires_grad(true);
        let out = ppo_rlhf_loss(
            &PpoRlhfInputs {
                log_probs: &lp,
                values: &v,
                old_log_probs: &tensor(&c["old_log_probs"]),
                old_values: &tensor(&c["old_values"]),
                advantages: &tensor(&c["advantages"]),
                returns: &tensor(&c["returns"]),
                mask: &tensor(&c["mask"]),
            },
            &cfg,
        )
        .unwrap();
        let e = &c["expect"];
        let vf_coef = f(&cfg_v["vf_coef"]);
        assert_scalar(&out.loss, f(&e["loss"]), TOL, "loss");
        assert_scalar(&out.loss_pg, f(&e["pg_loss"]), TOL, "pg_loss");
        assert_scalar(&out.value_loss, f(&e["vf_loss"]), TOL, "vf_loss");
        assert_scalar(&out.loss_vf, vf_coef * f(&e["vf_loss"]), TOL, "loss_vf");
        assert_scalar(&out.pg_clipfrac, f(&e["pg_clipfrac"]), TOL, "pg_clipfrac");
        assert_scalar(&out.vf_clipfrac, f(&e["vf_clipfrac"]), TOL, "vf_clipfrac");
        assert_scalar(&out.approx_kl, f(&e["approx_kl"]), TOL, "approx_kl");
        assert_scalar(
            &out.values_error,
            f(&e["values_error"]),
            TOL,
            "values_error",
        );
        assert_scalar(&out.ratio, f(&e["ratio"]), TOL, "ratio");
        assert_scalar(
            &out.padding_percentage,
            f(&e["padding_percentage"]),
            TOL,
            "padding_percentage",
        );
        assert_scalar(&out.total_loss().unwrap(), f(&e["loss"]), TOL, name);
        out.total_loss().unwrap().backward();
        assert_close(
            &lp.grad(),
            &tensor(&c["grad_log_probs"]),
            1e-9,
            "grad log_probs",
        );
        assert_close(&v.grad(), &tensor(&c["grad_values"]), 1e-9, "grad values");
        for (_, t) in out.metrics() {
            assert!(!t.requires_grad(), "{name}: metrics are detached");
        }
    }
}

#[test]
fn replay_mean_sequence_kl() {
    for c in cases("sequence_kl") {
        let (lp, rf, m) = (
            tensor(&c["log_probs"]),
            tensor(&c["ref_log_probs"]),
            tensor(&c["mask"]),
        );
        let e = &c["expect"];
        for (est, key) in [
            (KlEstimator::K1, "k1"),
            (KlEstimator::K2, "k2"),
            (KlEstimator::K3, "k3"),
        ] {
            let got = mean_sequence_kl(&lp, &rf, &m, est).unwrap();
            assert_scalar(&got, f(&e[key]), TOL, key);
        }
        // the estimator trlX logs is k3 with the log-ratio's sign flipped: not ours
        let flipped = mean_sequence_kl(&rf, &lp, &m, KlEstimator::K3).unwrap();
        assert_scalar(&flipped, f(&e["trlx_inverted"]), TOL, "trlx_inverted");
        assert!((f(&e["trlx_inverted"]) - f(&e["k3"])).abs() > 1e-3);
    }
}

#[test]
fn replay_trl_reward_trainer_loss() {
    for c in cases("trl_reward") {
        let name = c["name"].as_str().unwrap();
        let (ch, rj) = (tensor(&c["chosen"]), tensor(&c["rejected"]));
        let b = ch.size()[0];
        let mut td = TensorDict::new([b])
            .unwrap()
            .with(("chosen", "score"), ch.unsqueeze(-1)) // [B, 1] is squeezed
            .unwrap()
            .with(("rejected", "score"), rj.shallow_clone())
            .unwrap();
        let mut loss = RewardModelLoss::new();
        if !c["margin"].is_null() {
            td.set("margin", tensor(&c["margin"])).unwrap();
            loss = loss.with_margin_key("margin");
            assert_eq!(loss.in_keys().last(), Some(&NestedKey::from("margin")));
        }
        if let Some(coef) = c["center_rewards_coefficient"].as_f64() {
            loss = loss.with_center_rewards_coefficient(coef).unwrap();
            assert_eq!(loss.centering(), Centering::SquaredSum);
        }
        let out = loss.forward(&td).unwrap();
        let e = &c["expect"];
        assert_scalar(
            &out.loss_reward_model,
            f(&e["loss_bradley_terry"]),
            TOL,
            name,
        );
        // TRL's single loss = Bradley-Terry + centring = our total
        assert_scalar(&out.total_loss().unwrap(), f(&e["loss"]), TOL, name);
        assert_scalar(&out.accuracy, f(&e["accuracy"]), 1e-7, "accuracy");
        assert_scalar(&out.margin, f(&e["margin"]), TOL, "margin");
        assert!(out.to_tensordict().unwrap().contains("margin"));
    }
}

// ------------------------------------------------------------------ 2. rlhf.md §5, literally

/// §5.1: init 0.2, target 6, horizon 10000, n_steps 128, applied sequentially.
#[test]
fn section_5_1_adaptive_kl_controller_sequence() {
    let mut ctl = KlController::new(0.2, Some(6.0), 10_000.0).unwrap();
    for (current, want) in [
        (8.0, 0.200512),
        (5.4, 0.20025534464),
        (6.0, 0.20025534464),
        (0.0, 0.1997426909577216),
        (12.0, 0.20025403224657334),
    ] {
        ctl.update(current, 128).unwrap();
        assert!(
            (ctl.value() - want).abs() < 1e-15,
            "after {current}: {} vs {want}",
            ctl.value()
        );
    }
}

/// §5.2: values [0.5, 0.6, 0.7], rewards [0, 0, 1].
#[test]
fn section_5_2_gae_and_whitening() {
    let (v, r, m) = (
        row(&[0.5, 0.6, 0.7]),
        row(&[0.0, 0.0, 1.0]),
        row(&[1.0, 1.0, 1.0]),
    );
    let (adv, ret) = gae_advantages_and_returns(&v, &r, &m, 1.0, 0.95).unwrap();
    assert_close(&adv, &row(&[0.46575, 0.385, 0.3]), 1e-12, "advantages");
    assert_close(&ret, &row(&[0.96575, 0.985, 1.0]), 1e-12, "returns");
    let w = row(&[0.99134365, 0.01709213, -1.00843578]);
    assert_close(&whiten(&adv, true).unwrap(), &w, 1e-7, "trlX whiten");
    assert_close(
        &masked_whiten(&adv, &m, true).unwrap(),
        &w,
        1e-7,
        "masked whiten",
    );
    let (adv, ret) = gae_advantages_and_returns(&v, &r, &m, 0.99, 0.95).unwrap();
    assert_close(
        &adv,
        &row(&[0.446828575, 0.37515, 0.3]),
        1e-12,
        "advantages γ=0.99",
    );
    assert_close(
        &ret,
        &row(&[0.946828575, 0.97515, 1.0]),
        1e-12,
        "returns γ=0.99",
    );
    // the same row in the full-length layout: 2 prompt columns and 2 padding columns
    let v = row(&[3.0, -1.0, 0.5, 0.6, 0.7, 9.0, 9.0]);
    let r = row(&[5.0, 5.0, 0.0, 0.0, 1.0, 5.0, 5.0]);
    let m = row(&[0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0]);
    let (adv, ret) = gae_advantages_and_returns(&v, &r, &m, 1.0, 0.95).unwrap();
    assert_close(
        &adv,
        &row(&[0.0, 0.0, 0.46575, 0.385, 0.3, 0.0, 0.0]),
        1e-12,
        "full-length advantages",
    );
    assert_close(
        &ret,
        &row(&[0.0, 0.0, 0.96575, 0.985, 1.0, 0.0, 0.0]),
        1e-12,
        "full-length returns",
    );
}

/// §5.3: the per-token KL reward and the three estimators.
#[test]
fn section_5_3_kl_estimators() {
    let (lp, rf, m) = (
        row(&[-1.0, -2.0, -0.5]),
        row(&[-1.2, -1.5, -0.7]),
        row(&[1.0, 1.0, 1.0]),
    );
    // rewards = -0.1 * k1, plus the score 2.0 at the last token
    let k1 = KlEstimator::K1.per_token(&(&lp - &rf)).unwrap();
    let rewards = k1.f_mul_scalar(-0.1).unwrap() + row(&[0.0, 0.0, 2.0]);
    assert_close(&rewards, &row(&[-0.02, 0.05, 1.98]), 1e-12, "rewards");
    assert_close(
        &KlEstimator::K2.per_token(&(&lp - &rf)).unwrap(),
        &row(&[0.02, 0.125, 0.02]),
        1e-12,
        "k2",
    );
    let k3 = KlEstimator::K3.per_token(&(&lp - &rf)).unwrap();
    assert_close(&k3, &row(&[0.01873075, 0.14872127, 0.01873075]), 1e-7, "k3");
    let seq = mean_sequence_kl(&lp, &rf, &m, KlEstimator::K3).unwrap();
    assert_scalar(
        &seq,
        0.01873075307798 * 2.0 + 0.14872127070013,
        1e-10,
        "sequence k3",
    );
}

fn section_5_4(vf_coef: f64) -> PpoRlhfLossOutput {
    let lp = row(&[-0.5, -1.0, -2.0]);
    ppo_rlhf_loss(
        &PpoRlhfInputs {
            log_probs: &lp,
            values: &row(&[0.9, 0.2, 1.5]),
            old_log_probs: &row(&[-0.7, -1.0, -1.5]),
            old_values: &row(&[0.5, 0.3, 1.0]),
            advantages: &row(&[1.0, -0.5, 2.0]),
            returns: &row(&[1.0, 0.0, 1.2]),
            mask: &row(&[1.0, 1.0, 1.0]),
        },
        &PpoRlhfConfig::new().with_vf_coef(vf_coef),
    )
    .unwrap()
}

/// §5.4: trlX's `PPOConfig.loss`, cliprange 0.2, cliprange_value 0.2, vf_coef 1, mask all 1.
#[test]
fn section_5_4_ppo_loss() {
    let out = section_5_4(1.0);
    assert_scalar(&out.loss_pg, -0.637687106475089, 1e-13, "pg_loss");
    assert_scalar(&out.value_loss, 0.0366666667, 1e-9, "vf_loss");
    assert_scalar(&out.loss_vf, 0.0366666667, 1e-9, "loss_vf");
    assert_scalar(&out.loss, -0.6010204398084223, 1e-13, "loss");
    assert_scalar(&out.pg_clipfrac, 1.0 / 3.0, 1e-15, "pg_clipfrac");
    assert_scalar(&out.vf_clipfrac, 1.0 / 3.0, 1e-15, "vf_clipfrac");
    assert_scalar(&out.approx_kl, 0.04264447262426777, 1e-13, "approx_kl");
    assert_scalar(&out.padding_percentage, 0.0, 1e-15, "padding_percentage");
    // vf_coef scales the value term only
    let half = section_5_4(0.5);
    assert_scalar(
        &half.loss,
        -0.637687106475089 + 0.5 * 0.0366666667,
        1e-9,
        "vf_coef 0.5",
    );
    assert_scalar(&half.value_loss, 0.0366666667, 1e-9, "unscaled vf_loss");
}

fn bt_scores(c: &[f64], r: &[f64]) -> TensorDict {
    TensorDict::new([c.len() as i64])
        .unwrap()
        .with(("chosen", "score"), Tensor::from_slice(c))
        .unwrap()
        .with(("rejected", "score"), Tensor::from_slice(r))
        .unwrap()
}

/// §5.6: chosen [1, 0.5, -0.3], rejected [0, 1, -0.3].
#[test]
fn section_5_6_bradley_terry_torchrl_and_trl() {
    let (c, r) = ([1.0, 0.5, -0.3], [0.0, 1.0, -0.3]);
    let td = bt_scores(&c, &r);
    let base = RewardModelLoss::new().forward(&td).unwrap();
    assert_scalar(&base.loss_reward_model, 0.6601619508, 1e-9, "mean");
    assert_scalar(&base.accuracy, 1.0 / 3.0, 1e-7, "accuracy");
    assert_scalar(&base.margin, (1.0 - 0.5 + 0.0) / 3.0, 1e-12, "margin");
    let torchrl = RewardModelLoss::new()
        .with_center_coeff(0.01)
        .unwrap()
        .forward(&td)
        .unwrap();
    assert_scalar(
        torchrl.loss_center.as_ref().unwrap(),
        0.0081,
        1e-12,
        "TorchRL centring",
    );
    let trl = RewardModelLoss::new()
        .with_center_rewards_coefficient(0.01)
        .unwrap()
        .forward(&td)
        .unwrap();
    assert_scalar(
        trl.loss_center.as_ref().unwrap(),
        0.0120333333,
        1e-9,
        "TRL centring",
    );
    // TRL with margin [0.5, 0, 0.2]
    let td = td
        .with("margin", Tensor::from_slice(&[0.5f64, 0.0, 0.2]))
        .unwrap();
    let with_margin = RewardModelLoss::new()
        .with_margin_key("margin")
        .forward(&td)
        .unwrap();
    assert_scalar(
        &with_margin.loss_reward_model,
        0.7487642792,
        1e-9,
        "margin loss",
    );
    // the accuracy and the logged margin ignore the margin input
    assert_scalar(
        &with_margin.accuracy,
        1.0 / 3.0,
        1e-7,
        "accuracy with margin",
    );
    assert_scalar(&with_margin.margin, 0.5 / 3.0, 1e-12, "logged margin");
    // the last centring call wins
    let both = RewardModelLoss::new()
        .with_center_rewards_coefficient(0.01)
        .unwrap()
        .with_center_coeff(0.01)
        .unwrap();
    assert_eq!(both.centering(), Centering::SumOfSquares);
}

// ------------------------------------------------------------------ 3. reference bugs

/// (a) b623d1b's learner read `vpred[:, -G:]` (the value after each response token) against
/// rollout values `v[:, P-1 : P+G-1]` (before it). Ours shifts both sides through
/// `align_values_to_tokens`, so old and new values name the same state.
#[test]
fn reference_bug_b623d1b_value_misalignment() {
    let c = &cases("bug_value_alignment")[0];
    let e = &c["expect"];
    let p = c["prompt_len"].as_i64().unwrap();
    let (h_old, h_new) = (tensor(&c["head_values_old"]), tensor(&c["head_values_new"]));
    let (lp, adv, ret, m) = (
        tensor(&c["log_probs"]),
        tensor(&c["advantages"]),
        tensor(&c["returns"]),
        tensor(&c["mask"]),
    );
    let t = h_old.size()[1];
    let g = t - p;
    let cfg = PpoRlhfConfig::new();
    let loss = |values: &Tensor, old_values: &Tensor, sl: &dyn Fn(&Tensor) -> Tensor| {
        ppo_rlhf_loss(
            &PpoRlhfInputs {
                log_probs: &sl(&lp),
                values,
                old_log_probs: &sl(&lp),
                old_values,
                advantages: &sl(&adv),
                returns: &sl(&ret),
                mask: &sl(&m),
            },
            &cfg,
        )
        .unwrap()
    };
    let full = |x: &Tensor| x.shallow_clone();
    // ours: full-length, both sides aligned
    let ours = loss(
        &align_values_to_tokens(&h_new).unwrap(),
        &align_values_to_tokens(&h_old).unwrap(),
        &full,
    );
    assert_scalar(&ours.value_loss, f(&e["ours_vf_loss"]), TOL, "ours");
    assert_scalar(
        &ours.vf_clipfrac,
        f(&e["ours_vf_clipfrac"]),
        TOL,
        "ours clipfrac",
    );
    // b623d1b: response-sliced, learner values one column late
    let resp = |x: &Tensor| x.narrow(1, p, g);
    let bug = loss(&h_new.narrow(1, p, g), &h_old.narrow(1, p - 1, g), &resp);
    assert_scalar(&bug.value_loss, f(&e["b623d1b_vf_loss"]), TOL, "b623d1b");
    // right after the rollout (new = old) ours regresses the true error, b623d1b a neighbour's
    let ours0 = loss(
        &align_values_to_tokens(&h_old).unwrap(),
        &align_values_to_tokens(&h_old).unwrap(),
        &full,
    );
    let bug0 = loss(&h_old.narrow(1, p, g), &h_old.narrow(1, p - 1, g), &resp);
    assert_scalar(
        &ours0.value_loss,
        f(&e["ours_vf_loss_at_rollout"]),
        TOL,
        "ours at rollout",
    );
    assert_scalar(
        &bug0.value_loss,
        f(&e["b623d1b_vf_loss_at_rollout"]),
        TOL,
        "b623d1b at rollout",
    );
    assert!(bug0.value_loss.double_value(&[]) > 10.0 * ours0.value_loss.double_value(&[]));
}

/// (b) trlX HEAD feeds its controller `exp(lr) − 1 − lr`; the k3 of KL(π‖ref) is
/// `exp(−lr) − 1 + lr`. With the target between the two, they move β in opposite directions.
#[test]
fn reference_bug_inverted_k3_moves_the_controller_the_wrong_way() {
    // rlhf.md §5.3's vectors: ours 0.18618, trlX's 0.14934; target 0.17
    let (lp, rf, m) = (
        row(&[-1.0, -2.0, -0.5]),
        row(&[-1.2, -1.5, -0.7]),
        row(&[1.0, 1.0, 1.0]),
    );
    let ours = mean_sequence_kl(&lp, &rf, &m, KlEstimator::K3)
        .unwrap()
        .double_value(&[]);
    let trlx: f64 = [0.02140276, 0.10653066, 0.02140276].iter().sum();
    assert!((ours - 0.18618277).abs() < 1e-7);
    let (mut a, mut b) = (
        AdaptiveKLController::new(0.2, 0.17, 10_000.0).unwrap(),
        AdaptiveKLController::new(0.2, 0.17, 10_000.0).unwrap(),
    );
    a.update(ours, 128).unwrap();
    b.update(trlx, 128).unwrap();
    assert!((a.value() - 0.2 * (1.0 + (0.18618277 / 0.17 - 1.0) * 0.0128)).abs() < 1e-9);
    assert!((b.value() - 0.2 * (1.0 + (0.14933618 / 0.17 - 1.0) * 0.0128)).abs() < 1e-9);
    assert!(
        a.value() > 0.2 && b.value() < 0.2,
        "the KL is above target: β must rise"
    );

    let c = &cases("bug_inverted_k3")[0];
    let e = &c["expect"];
    let (lp, rf, m) = (
        tensor(&c["log_probs"]),
        tensor(&c["ref_log_probs"]),
        tensor(&c["mask"]),
    );
    let k3 = mean_sequence_kl(&lp, &rf, &m, KlEstimator::K3)
        .unwrap()
        .double_value(&[]);
    assert!((k3 - f(&e["k3"])).abs() < TOL);
    let new = |init| AdaptiveKLController::new(init, f(&c["target"]), f(&c["horizon"])).unwrap();
    let n = c["n_steps"].as_u64().unwrap() as usize;
    let (mut ctl_ours, mut ctl_trlx) = (new(f(&c["init"])), new(f(&c["init"])));
    ctl_ours.update(k3, n).unwrap();
    ctl_trlx.update(f(&e["trlx_inverted"]), n).unwrap();
    assert!((ctl_ours.value() - f(&e["value_k3"])).abs() < 1e-14);
    assert!((ctl_trlx.value() - f(&e["value_trlx_inverted"])).abs() < 1e-14);
    assert!(
        (ctl_ours.value() - 0.2) * (ctl_trlx.value() - 0.2) < 0.0,
        "opposite directions"
    );
}

/// (c) b623d1b fed its controller `mean(sum(logprob_new − logprob_rollout))`, the drift over
/// one PPO step (≈ 0 right after a rollout), not the KL to the reference.
#[test]
fn reference_bug_policy_drift_is_not_the_kl_to_the_reference() {
    let c = &cases("bug_policy_drift")[0];
    let e = &c["expect"];
    let (new_lp, lp, rf, m) = (
        tensor(&c["new_log_probs"]),
        tensor(&c["log_probs"]),
        tensor(&c["ref_log_probs"]),
        tensor(&c["mask"]),
    );
    // b623d1b's number is a "KL" of the new policy to the rollout one (k1, per sequence)
    let drift = mean_sequence_kl(&new_lp, &lp, &m, KlEstimator::K1)
        .unwrap()
        .double_value(&[]);
    assert!((drift - f(&e["b623d1b_drift"])).abs() < TOL);
    let ours = mean_sequence_kl(&lp, &rf, &m, KlEstimator::K1)
        .unwrap()
        .double_value(&[]);
    assert!((ours - f(&e["k1"])).abs() < TOL);
    let n = c["n_steps"].as_u64().unwrap() as usize;
    let mk = || KlController::new(f(&c["init"]), Some(f(&c["target"])), f(&c["horizon"])).unwrap();
    let (mut bug, mut good) = (mk(), mk());
    bug.update(drift, n).unwrap();
    good.update(ours, n).unwrap();
    assert!((bug.value() - f(&e["value_b623d1b"])).abs() < 1e-14);
    assert!((good.value() - f(&e["value_k1"])).abs() < 1e-14);
    // the drift is ~0 so β falls by the full clip; the KL is above target so it should rise
    assert!((bug.value() - 0.2 * (1.0 - 0.2 * 16.0 / 100.0)).abs() < 1e-14);
    assert!(good.value() > 0.2);
}

/// (d) trlX whitens the whole `[B, R]` advantages, zero padding included; ours only the
/// masked ones.
#[test]
fn reference_bug_padding_in_whitening() {
    let c = &cases("bug_padded_whitening")[0];
    let (adv, m) = (tensor(&c["advantages"]), tensor(&c["mask"]));
    let trlx = whiten(&adv, true).unwrap();
    let ours = masked_whiten(&adv, &m, true).unwrap();
    assert_close(&trlx, &tensor(&c["expect"]["trlx"]), TOL, "trlX");
    assert_close(&ours, &tensor(&c["expect"]["ours"]), TOL, "ours");
    // ours: mean 0, unbiased variance ≈ 1 over the real tokens, 0 on padding
    assert!(masked_mean(&ours, &m).unwrap().double_value(&[]).abs() < 1e-12);
    assert!((masked_var(&ours, &m, true).unwrap().double_value(&[]) - 1.0).abs() < 1e-6);
    assert_eq!(
        vec64(&ours.where_scalarother(&m.eq(0), 0.0))
            .iter()
            .map(|x| x.abs())
            .sum::<f64>(),
        0.0
    );
    // trlX's padding comes out non-zero and its real tokens are not standardised
    assert!(vec64(&trlx.where_scalarother(&m.eq(0), 0.0))
        .iter()
        .any(|x| x.abs() > 0.1));
    assert!(masked_mean(&trlx, &m).unwrap().double_value(&[]).abs() > 0.1);
}

// ------------------------------------------------------------------ 4. the loss module

fn tiny_config() -> Gpt2Config {
    Gpt2Config::new(20)
        .with_n_layer(2)
        .with_n_embd(16)
        .with_n_head(2)
        .with_n_positions(16)
}

/// Two rows, P = 3 (left-padded), R = 4 (right-padded), pad id 0.
fn rollout_td<M: ScoreTokens>(policy: &M) -> TensorDict {
    let tokens = Tensor::from_slice(&[0i64, 5, 6, 7, 8, 9, 1, 3, 4, 5, 6, 7, 0, 0]).view([2, 7]);
    let attn = Tensor::from_slice(&[0i64, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0]).view([2, 7]);
    let assistant = Tensor::from_slice(&[0i64, 0, 0, 1, 1, 1, 1, 0, 0, 0, 1, 1, 0, 0]).view([2, 7]);
    let (lp, v) = tch::no_grad(|| policy.log_probs_and_values(&tokens, &attn)).unwrap();
    // k1-free toy rewards: the score at the last response token
    let rewards = Tensor::from_slice(&[
        0.0f64, 0.0, 0.0, 0.0, 0.0, 0.0, 1.5, 0.0, 0.0, 0.0, 0.0, -0.5, 0.0, 0.0,
    ])
    .view([2, 7])
    .to_kind(Kind::Float);
    TensorDict::new([2])
        .unwrap()
        .with(("tokens", "full"), tokens)
        .unwrap()
        .with(("masks", "all_attention_mask"), attn)
        .unwrap()
        .with(("masks", "all_assistant_mask"), assistant)
        .unwrap()
        .with(("log_probs", "full"), lp)
        .unwrap()
        .with("values", v)
        .unwrap()
        .with(("next", "reward"), rewards)
        .unwrap()
}

#[test]
fn value_head_values_are_aligned_with_the_tokens() {
    tch::manual_seed(0);
    let vs = VarStore::new(Device::Cpu);
    let model = CausalLmWithValueHead::new(&vs.root(), &tiny_config()).unwrap();
    let tokens = Tensor::from_slice(&[3i64, 4, 5, 6]).view([1, 4]);
    let mask = tokens.ones_like();
    let (lp, v) = model.log_probs_and_values(&tokens, &mask).unwrap();
    let out = model
        .forward(&LmInput::new(&tokens).with_attention_mask(&mask))
        .unwrap();
    // values[t] = head output at t - 1: the value of the state before token t
    assert_eq!(v.double_value(&[0, 0]), 0.0);
    for t in 1..4 {
        assert!((v.double_value(&[0, t]) - out.values.double_value(&[0, t - 1])).abs() < 1e-6);
    }
    // log_probs[t] = log p(token[t] | < t)
    let lsm = out.logits.log_softmax(-1, Kind::Float);
    for t in 1..4 {
        let tok = tokens.int64_value(&[0, t]);
        assert!((lp.double_value(&[0, t]) - lsm.double_value(&[0, t - 1, tok])).abs() < 1e-6);
    }
}

#[test]
fn ppo_rlhf_loss_module_on_a_value_head_policy() {
    tch::manual_seed(1);
    let vs = VarStore::new(Device::Cpu);
    let model = CausalLmWithValueHead::new(&vs.root(), &tiny_config()).unwrap();
    let mut td = rollout_td(&model);
    let loss = PpoRlhfLoss::new(&model);
    assert_eq!(loss.in_keys().len(), 7);
    loss.compute_advantages(&mut td).unwrap();
    let adv = td.get_or_err("advantage").unwrap();
    let m = td.get_or_err(("masks", "all_assistant_mask")).unwrap();
    // whitened over the 6 response tokens, 0 elsewhere
    assert!(masked_mean(adv, m).unwrap().double_value(&[]).abs() < 1e-6);
    assert_eq!(adv.double_value(&[0, 1]), 0.0);
    assert_eq!(adv.double_value(&[1, 6]), 0.0);
    let out = loss.forward(&td).unwrap();
    // at the rollout policy: ratio 1, no clipping, approx_kl 0, loss_pg = -mean(A) = 0
    assert_scalar(&out.ratio, 1.0, 1e-6, "ratio");
    assert_scalar(&out.approx_kl, 0.0, 1e-6, "approx_kl");
    assert_eq!(out.pg_clipfrac.double_value(&[]), 0.0);
    assert_eq!(out.vf_clipfrac.double_value(&[]), 0.0);
    assert_scalar(&out.loss_pg, 0.0, 1e-6, "loss_pg");
    // 6 response tokens in a 2 × 4 response span
    assert_scalar(&out.padding_percentage, 0.25, 1e-7, "padding_percentage");
    // the value loss is 0.5 · mean((V − R)²) over the response tokens
    let (v, ret) = (
        td.get_or_err("values").unwrap(),
        td.get_or_err("value_target").unwrap(),
    );
    let want = 0.5
        * masked_mean(&(v - ret).square(), m)
            .unwrap()
            .double_value(&[]);
    assert_scalar(&out.loss_vf, want, 1e-5, "loss_vf");
    out.total_loss().unwrap().backward();
    let trained = vs
        .trainable_variables()
        .iter()
        .filter(|p| p.grad().defined())
        .count();
    assert!(trained > 0, "gradients reach the policy");
}

#[test]
fn ppo_rlhf_loss_module_on_a_hydra_policy_runs_the_policy_side() {
    tch::manual_seed(2);
    let vs = VarStore::new(Device::Cpu);
    let hydra = CausalLmWithHydraValueHead::new(&vs.root(), &tiny_config(), 1).unwrap();
    let mut td = rollout_td(&hydra);
    let loss = PpoRlhfLoss::new(&hydra)
        .with_config(PpoRlhfConfig::new().with_vf_coef(0.1))
        .unwrap();
    loss.compute_advantages(&mut td).unwrap();
    let out = loss.forward(&td).unwrap();
    let direct = PpoRlhfLoss::new(hydra.policy())
        .with_config(loss.config().clone())
        .unwrap()
        .forward(&td)
        .unwrap();
    assert_eq!(out.loss.double_value(&[]), direct.loss.double_value(&[]));
    assert_scalar(
        &out.loss_vf,
        0.1 * out.value_loss.double_value(&[]),
        1e-6,
        "vf_coef",
    );
}

#[test]
fn ppo_rlhf_keys_are_settable_and_errors_name_the_key() {
    let theta = row(&[0.0, -1.0, -1.0, -1.0]).set_requires_grad(true);
    let th = theta.shallow_clone();
    let policy =
        ScoreFn(move |_t: &Tensor, _m: &Tensor| Ok((th.shallow_clone(), Some(th.zeros_like()))));
    let mut loss = PpoRlhfLoss::new(policy);
    assert_eq!(PpoRlhfKeys::NAMES.len(), 8);
    let r = |v: &[f64]| row(v);
    let mut td = TensorDict::new([1])
        .unwrap()
        .with("tok", Tensor::from_slice(&[1i64, 2, 3, 4]).view([1, 4]))
        .unwrap()
        .with(("masks", "all_attention_mask"), r(&[1.0, 1.0, 1.0, 1.0]))
        .unwrap()
        .with(("masks", "all_assistant_mask"), r(&[0.0, 1.0, 1.0, 1.0]))
        .unwrap()
        .with(("log_probs", "full"), r(&[0.0, -1.0, -1.2, -0.8]))
        .unwrap()
        .with("values", r(&[0.0, 0.1, 0.2, 0.3]))
        .unwrap()
        .with("rew", r(&[0.0, 0.0, 0.0, 1.0]))
        .unwrap();
    // the default tokens key is missing: the error says which
    let err = loss.forward(&td).unwrap_err();
    assert!(err.to_string().contains("tokens"), "{err}");
    loss.set_keys(&[
        ("tokens", Some("tok".into())),
        ("reward", Some("rew".into())),
    ])
    .unwrap();
    assert_eq!(loss.in_keys()[0], NestedKey::from("tok"));
    loss.compute_advantages(&mut td).unwrap();
    let out = loss.forward(&td).unwrap();
    // ratio exp(lp - old) on the 3 response tokens: [1, e^0.2, e^-0.2] (mean)
    let want = (1.0 + 0.2f64.exp() + (-0.2f64).exp()) / 3.0;
    assert_scalar(&out.ratio, want, 1e-12, "ratio");
    // unknown name, and reset to the default
    assert!(loss.set_keys(&[("action", None)]).is_err());
    loss.set_keys(&[("tokens", None)]).unwrap();
    assert_eq!(
        loss.tensor_keys().tokens,
        NestedKey::from(("tokens", "full"))
    );
    // a mis-shaped entry names its key and shapes
    loss.set_keys(&[("tokens", Some("tok".into()))]).unwrap();
    td.set("values", Tensor::zeros([1, 3], (Kind::Double, Device::Cpu)))
        .unwrap();
    let err = loss.forward(&td).unwrap_err();
    assert!(
        err.to_string().contains("values") && err.to_string().contains("[1, 3]"),
        "{err}"
    );
}

#[test]
fn bad_inputs_and_configs_are_refused() {
    let x = row(&[1.0, 2.0, 3.0]);
    // shapes
    let err = masked_mean(&x, &Tensor::ones([3], (Kind::Double, Device::Cpu))).unwrap_err();
    assert!(
        err.to_string().contains("[1, 3]") && err.to_string().contains("[3]"),
        "{err}"
    );
    // empty / too small masks
    assert!(masked_mean(&x, &x.zeros_like()).is_err());
    let one = row(&[1.0, 0.0, 0.0]);
    assert!(masked_var(&x, &one, true).is_err());
    assert!(masked_var(&x, &one, false).is_ok());
    assert!(masked_whiten(&x, &one, true).is_err());
    // integer values
    assert!(masked_mean(
        &Tensor::from_slice(&[1i64, 2]),
        &Tensor::from_slice(&[1i64, 1])
    )
    .is_err());
    // GAE: γ, λ and shapes
    let m = x.ones_like();
    assert!(gae_advantages_and_returns(&x, &x, &m, 1.1, 0.95).is_err());
    assert!(gae_advantages_and_returns(&x, &x, &m, 1.0, -0.1).is_err());
    assert!(
        gae_advantages_and_returns(&x.view([3]), &x.view([3]), &m.view([3]), 1.0, 0.95).is_err()
    );
    // an empty mask gives zero advantages
    let (a, r) = gae_advantages_and_returns(&x, &x, &x.zeros_like(), 1.0, 0.95).unwrap();
    assert_eq!(vec64(&a), [0.0; 3]);
    assert_eq!(vec64(&r), [0.0; 3]);
    // the loss: an all-zero mask
    let z = x.zeros_like();
    let inputs = PpoRlhfInputs {
        log_probs: &x,
        values: &x,
        old_log_probs: &x,
        old_values: &x,
        advantages: &x,
        returns: &x,
        mask: &z,
    };
    let err = ppo_rlhf_loss(&inputs, &PpoRlhfConfig::new()).unwrap_err();
    assert!(err.to_string().contains("mask"), "{err}");
    // configs
    for (cfg, field) in [
        (PpoRlhfConfig::new().with_cliprange(0.0), "cliprange"),
        (
            PpoRlhfConfig::new().with_cliprange_value(f64::NAN),
            "cliprange_value",
        ),
        (PpoRlhfConfig::new().with_vf_coef(-1.0), "vf_coef"),
        (PpoRlhfConfig::new().with_gamma(1.5), "gamma"),
        (PpoRlhfConfig::new().with_lam(-0.5), "lam"),
    ] {
        match cfg.validate() {
            Err(Error::InvalidConfig { field: f, .. }) => assert_eq!(f, field),
            other => panic!("{field}: {other:?}"),
        }
    }
    // controllers
    assert!(AdaptiveKLController::new(-0.1, 6.0, 1e4).is_err());
    assert!(AdaptiveKLController::new(0.1, 0.0, 1e4).is_err());
    assert!(AdaptiveKLController::new(0.1, 6.0, f64::INFINITY).is_err());
    assert!(AdaptiveKLController::new(f64::NAN, 6.0, 1e4).is_err());
    assert!(FixedKLController::new(-1.0).is_err());
    assert!(KlController::new(0.1, Some(-6.0), 1e4).is_err());
    let mut ctl = KlController::new(0.1, Some(6.0), 1e4).unwrap();
    assert!(ctl.update(f64::INFINITY, 8).is_err());
    assert_eq!(ctl.value(), 0.1);
    // the reward model's TRL options
    assert!(RewardModelLoss::new()
        .with_center_rewards_coefficient(-0.01)
        .is_err());
    let td = bt_scores(&[1.0, 2.0], &[0.0, 0.0])
        .with("margin", Tensor::zeros([2, 2], (Kind::Double, Device::Cpu)))
        .unwrap();
    let err = RewardModelLoss::new()
        .with_margin_key("margin")
        .forward(&td)
        .unwrap_err();
    assert!(
        err.to_string().contains("margin") && err.to_string().contains("[2, 2]"),
        "{err}"
    );
}
