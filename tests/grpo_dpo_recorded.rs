//! Fidelity of GRPO and DPO to the upstream loss functions: replays
//! `specs/grpo_dpo_cases.json`, recorded by `specs/record_grpo_dpo.py` from TorchRL 0.14.1's
//! `GRPOLoss` / `MCAdvantage` and TRL 1.16's `GRPOTrainer` / `DPOTrainer` (Python is never
//! run here), through our API.
//!
//! Case families and tolerances (float64 inputs throughout; `TOL` is relative, with an
//! absolute floor of `TOL` for values below 1):
//!
//! 1. `torchrl_grpo`: `GrpoLoss` over TorchRL's LLM tensordict layout with a policy computing
//!    log-probs and the exact entropy ([`token_entropy`]) from the recorded logits; every
//!    `GRPOLossOutput` field and the gradients with respect to the logits, to `TOL`. TorchRL's
//!    `clip_fraction`, `kl_approx`, `entropy`, `kl_to_ref` and `loss_kl_to_ref` are means over
//!    all `B·T` positions, ours over the `n` response tokens: the test asserts
//!    `torchrl = ours · n / (B·T)` (the documented difference, `GrpoLossOutput`). The same
//!    inputs also go through `grpo_loss_with_entropy` with TorchRL's own log-probs and
//!    entropies, and, for the configs without entropy bonus, through `GrpoLoss` with a closure
//!    policy (`ScoreFn`).
//! 2. `torchrl_mc_advantage`: `group_advantages(.., GroupScale::StdClampMin)` on each group
//!    `MCAdvantage` emitted, to 1e-9 absolute (one group sits on the 1e-6 std floor, where the
//!    rounding of `r − mean` is magnified 10⁶ times).
//! 3. `trl_grpo_advantages`: `group_advantages` with `StdPlusEps` / `BatchStdPlusEps` /
//!    `None` for `scale_rewards` group / batch / none, to `TOL`.
//! 4. `trl_grpo_loss`: `grpo_loss_with_entropy` with TRL's aggregations, β > 0 and TRL's
//!    entropy bonus; `total_loss` = TRL's loss and our `kl_to_ref` / `entropy` = TRL's `kl` /
//!    `entropy` to `TOL`; TRL's `clip_ratio/*` (float32 in TRL) to 1e-6, derived from the
//!    inputs with TRL's definition and shown to be at most our `clip_fraction`.
//! 5. `trl_dpo`: `dpo_loss` and `DpoLoss` (closure policy) for sigmoid, hinge, ipo and robust;
//!    loss, logged rewards, accuracies and margins, batch and per pair, to `TOL`. TRL 1.16's
//!    `sigmoid` ignores `label_smoothing`, ours applies the conservative-DPO form: the test
//!    asserts ours at ε = 0 equals TRL's, and ours at ε equals
//!    `(1 − ε)·TRL(x) + ε·TRL(−x)` with `TRL(−x)` TRL's loss on the swapped pairs.

mod recorded;

use recorded::{f, int_tensor, opt_f, tensor};

use serde_json::Value;
use tch::{Device, Kind, Tensor};
use torchrl::modules::llm::{ScoreFn, ScoreRequest, ScoreTokens, TokenScores};
use torchrl::objectives::llm::{
    dpo_loss, group_advantages, grpo_loss_with_entropy, sequence_log_probs, token_entropy,
    DpoConfig, DpoLoss, DpoLossType, GroupScale, GrpoAggregation, GrpoConfig, GrpoLoss,
    GrpoLossOutput,
};
use torchrl::objectives::{LossModule, LossOutput};
use torchrl::TensorDict;

const FILE: &str = "grpo_dpo_cases.json";
const RECORDER: &str = "record_grpo_dpo.py";
const TOL: f64 = 1e-10;

fn cases(kind: &str) -> Vec<Value> {
    recorded::cases(FILE, RECORDER, kind)
}

fn vec64(t: &Tensor) -> Vec<f64> {
    Vec::<f64>::try_from(t.to_kind(Kind::Double).reshape([-1])).expect("f64 vector")
}

fn close(got: f64, want: f64, tol: f64, what: &str) {
    assert!(
        (got - want).abs() <= tol * want.abs().max(1.0),
        "{what}: {got} vs {want}"
    );
}

fn close_t(got: &Tensor, want: &Tensor, tol: f64, what: &str) {
    assert_eq!(got.size(), want.size(), "{what}: shape");
    for (i, (g, w)) in vec64(got).iter().zip(vec64(want)).enumerate() {
        close(*g, w, tol, &format!("{what}[{i}]"));
    }
}

fn scalar(t: &Tensor) -> f64 {
    t.double_value(&[])
}

#[test]
fn the_file_records_the_upstream_versions() {
    let v = recorded::file(FILE, RECORDER);
    assert_eq!(v["versions"]["torchrl"], "0.14.1");
    assert_eq!(v["versions"]["trl"], "1.16.0");
    assert!(v["trl_advantage_statements"]
        .as_str()
        .unwrap()
        .contains("std_rewards + 0.0001"));
}

// ------------------------------------------------------------------ 1. TorchRL GRPOLoss

/// A causal LM reduced to its logits `[B, T, V]` (position t predicts token t + 1): the
/// log-probs are gathered in float64, the entropy is [`token_entropy`].
struct LogitsPolicy {
    logits: Tensor,
}

impl LogitsPolicy {
    fn log_probs(&self, tokens: &Tensor) -> Tensor {
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
        let lp = self.log_probs(tokens);
        let entropy = if request.entropy {
            Some(token_entropy(&self.logits, Some(attention_mask))?)
        } else {
            None
        };
        Ok(TokenScores {
            values: Some(lp.zeros_like()),
            log_probs: lp,
            entropy,
        })
    }
}

fn torchrl_config(c: &Value) -> GrpoConfig {
    let eps = c["clip_epsilon"].as_array().unwrap();
    let agg = match c["aggregation"].as_str().unwrap() {
        "token_mean" => GrpoAggregation::TokenMean,
        "prompt_mean" => GrpoAggregation::PromptMean,
        "none" => GrpoAggregation::None,
        other => panic!("aggregation {other}"),
    };
    let entropy = if c["entropy_bonus"].as_bool().unwrap() {
        Some(f(&c["entropy_coeff"]))
    } else {
        None
    };
    GrpoConfig::new()
        .with_clip_epsilon_asymmetric(f(&eps[0]), f(&eps[1]))
        .with_aggregation(agg)
        .with_entropy_coeff(entropy)
        .with_kl_to_ref_coeff(opt_f(&c["kl_to_ref_coeff"]))
}

/// Our field `got` against TorchRL's `want` (a number, a `[B, T]` tensor or null); `scale`
/// maps ours to TorchRL's (1, or `n / (B·T)` for its all-position means).
fn check_field(got: Option<&Tensor>, want: &Value, scale: f64, what: &str) {
    match (got, want) {
        (None, Value::Null) => {}
        (Some(g), Value::Object(_)) => {
            close_t(&(g * scale), &tensor(want), TOL, what);
        }
        (Some(g), w) if w.is_number() => close(scalar(g) * scale, f(w), TOL, what),
        (g, w) => panic!("{what}: ours {g:?}, TorchRL's {w}"),
    }
}

fn check_torchrl_output(out: &GrpoLossOutput, expect: &Value, dilution: f64, what: &str) {
    let e = expect;
    check_field(
        Some(&out.loss_objective),
        &e["loss_objective"],
        1.0,
        &format!("{what} loss_objective"),
    );
    check_field(Some(&out.ess), &e["ESS"], 1.0, &format!("{what} ESS"));
    check_field(
        out.loss_entropy.as_ref(),
        &e["loss_entropy"],
        1.0,
        &format!("{what} loss_entropy"),
    );
    // TorchRL's means over all B·T positions
    check_field(
        Some(&out.clip_fraction),
        &e["clip_fraction"],
        dilution,
        &format!("{what} clip_fraction"),
    );
    check_field(
        Some(&out.kl_approx),
        &e["kl_approx"],
        dilution,
        &format!("{what} kl_approx"),
    );
    check_field(
        out.entropy.as_ref(),
        &e["entropy"],
        dilution,
        &format!("{what} entropy"),
    );
    check_field(
        out.kl_to_ref.as_ref(),
        &e["kl_to_ref"],
        dilution,
        &format!("{what} kl_to_ref"),
    );
    check_field(
        out.loss_kl_to_ref.as_ref(),
        &e["loss_kl_to_ref"],
        dilution,
        &format!("{what} loss_kl_to_ref"),
    );
}

fn rollout_td(c: &Value) -> TensorDict {
    let tokens = int_tensor(&c["tokens"]);
    let b = tokens.size()[0];
    TensorDict::new([b])
        .unwrap()
        .with(("tokens", "full"), tokens)
        .unwrap()
        .with(
            ("masks", "all_attention_mask"),
            int_tensor(&c["attention_mask"]),
        )
        .unwrap()
        .with(
            ("masks", "all_assistant_mask"),
            int_tensor(&c["assistant_mask"]).to_kind(Kind::Bool),
        )
        .unwrap()
        .with(("log_probs", "full"), tensor(&c["old_log_probs"]))
        .unwrap()
        .with(
            ("next", "ref_log_probs", "full"),
            tensor(&c["ref_log_probs"]),
        )
        .unwrap()
        .with("advantage", tensor(&c["advantage"]))
        .unwrap()
}

#[test]
fn replay_torchrl_grpo_loss() {
    let mut n_configs = 0;
    for c in cases("torchrl_grpo") {
        let name = c["name"].as_str().unwrap();
        let td = rollout_td(&c);
        let tokens = int_tensor(&c["tokens"]);
        let attention = int_tensor(&c["attention_mask"]);
        let asst = tensor(&c["assistant_mask"]);
        let (b, t) = (tokens.size()[0], tokens.size()[1]);
        let n = scalar(&asst.sum(Kind::Double));
        let dilution = n / (b * t) as f64;
        // our policy reproduces TorchRL's distribution on the response tokens
        let probe = LogitsPolicy {
            logits: tensor(&c["logits"]),
        };
        let scores = probe
            .score_tokens(&tokens, &attention, ScoreRequest::values_and_entropy())
            .unwrap();
        let (lp, h) = (scores.log_probs, scores.entropy);
        let torchrl_lp = tensor(&c["torchrl_log_probs"]);
        let torchrl_h = tensor(&c["torchrl_entropy"]);
        close_t(
            &(&lp * &asst),
            &torchrl_lp,
            TOL,
            &format!("{name} log_probs"),
        );
        close_t(
            &(h.unwrap() * &asst),
            &torchrl_h,
            TOL,
            &format!("{name} entropy"),
        );

        for cfg_case in c["configs"].as_array().unwrap() {
            n_configs += 1;
            let what = format!("{name}/{}", cfg_case["name"].as_str().unwrap());
            let cfg = torchrl_config(cfg_case);
            let expect = &cfg_case["expect"];

            // (a) the loss module with the logits policy: values and gradients
            let policy = LogitsPolicy {
                logits: tensor(&c["logits"]).set_requires_grad(true),
            };
            let loss = GrpoLoss::new(&policy).with_config(cfg.clone()).unwrap();
            let out = loss.forward(&td).unwrap();
            check_torchrl_output(&out, expect, dilution, &what);
            let mut main = out.loss_objective.sum(Kind::Double);
            if let Some(l) = &out.loss_entropy {
                main += l.sum(Kind::Double);
            }
            let g = Tensor::run_backward(&[&main], &[&policy.logits], true, false);
            close_t(
                &g[0],
                &tensor(&cfg_case["grad_objective_entropy"]),
                TOL,
                &format!("{what} d(loss_objective + loss_entropy)/dlogits"),
            );
            match (&out.loss_kl_to_ref, &cfg_case["grad_kl_to_ref"]) {
                (None, Value::Null) => {}
                (Some(kl), want) => {
                    let g = Tensor::run_backward(&[kl], &[&policy.logits], false, false);
                    close_t(
                        &(&g[0] * dilution),
                        &tensor(want),
                        TOL,
                        &format!("{what} d(loss_kl_to_ref)/dlogits"),
                    );
                }
                (None, w) => panic!("{what}: TorchRL has a KL gradient {w}"),
            }

            // (b) the function on TorchRL's own log-probs and entropies
            let out = grpo_loss_with_entropy(
                &torchrl_lp,
                &tensor(&c["old_log_probs"]),
                &tensor(&c["advantage"]).squeeze_dim(-1),
                &asst,
                cfg.kl_to_ref_coeff
                    .map(|_| tensor(&c["ref_log_probs"]))
                    .as_ref(),
                cfg.entropy_coeff.map(|_| &torchrl_h),
                &cfg,
            )
            .unwrap();
            check_torchrl_output(&out, expect, dilution, &format!("{what} (function)"));

            // (c) a closure policy, where no entropy is needed
            if cfg.entropy_coeff.is_none() {
                let lp = torchrl_lp.shallow_clone();
                let closure = ScoreFn(move |_t: &Tensor, _m: &Tensor| {
                    Ok((lp.shallow_clone(), Some(lp.zeros_like())))
                });
                let out = GrpoLoss::new(closure)
                    .with_config(cfg.clone())
                    .unwrap()
                    .forward(&td)
                    .unwrap();
                check_torchrl_output(&out, expect, dilution, &format!("{what} (closure)"));
            }
        }
    }
    assert_eq!(n_configs, 7);
}

// ------------------------------------------------------------------ 2. TorchRL MCAdvantage

#[test]
fn replay_torchrl_mc_advantage() {
    for c in cases("torchrl_mc_advantage") {
        let name = c["name"].as_str().unwrap();
        let g = c["grpo_size"].as_i64().unwrap();
        let stream = c["stream"].as_array().unwrap();
        let groups = c["groups"].as_array().unwrap();
        assert_eq!(
            groups.len() as i64 * g,
            stream.len() as i64,
            "{name}: every group emitted"
        );
        let mut all_rewards = Vec::new();
        let mut all_adv = Vec::new();
        for group in groups {
            let q = group["query"].as_str().unwrap();
            // MCAdvantage groups by prompt, in arrival order: ours takes the group consecutive
            let mine: Vec<f64> = stream
                .iter()
                .filter(|s| s["query"] == q)
                .map(|s| f(&s["reward"]))
                .collect();
            let rewards = tensor(&group["rewards"]);
            assert_eq!(vec64(&rewards), mine, "{name}/{q}: the group's rewards");
            let adv = group_advantages(&rewards, g, GroupScale::StdClampMin).unwrap();
            let want = tensor(&group["advantages"]);
            for (a, w) in vec64(&adv).iter().zip(vec64(&want)) {
                assert!((a - w).abs() < 1e-9, "{name}/{q}: {a} vs {w}");
            }
            all_rewards.extend(mine);
            all_adv.extend(vec64(&want));
        }
        // all groups at once
        let adv = group_advantages(
            &Tensor::from_slice(&all_rewards),
            g,
            GroupScale::StdClampMin,
        )
        .unwrap();
        for (a, w) in vec64(&adv).iter().zip(&all_adv) {
            assert!((a - w).abs() < 1e-9, "{name} batched: {a} vs {w}");
        }
    }
}

// ------------------------------------------------------------------ 3. TRL advantages

#[test]
fn replay_trl_grpo_advantages() {
    let mut seen = Vec::new();
    for c in cases("trl_grpo_advantages") {
        let scale = match c["scale_rewards"].as_str().unwrap() {
            "group" => GroupScale::StdPlusEps,
            "batch" => GroupScale::BatchStdPlusEps,
            "none" => GroupScale::None,
            other => panic!("scale_rewards {other}"),
        };
        seen.push(scale);
        let g = c["num_generations"].as_i64().unwrap();
        let adv = group_advantages(&tensor(&c["rewards"]), g, scale).unwrap();
        close_t(
            &adv,
            &tensor(&c["advantages"]),
            TOL,
            c["name"].as_str().unwrap(),
        );
    }
    assert_eq!(seen.len(), 3);
}

// ------------------------------------------------------------------ 4. TRL GRPO loss

#[test]
fn replay_trl_grpo_loss() {
    for c in cases("trl_grpo_loss") {
        let mask = tensor(&c["completion_mask"]);
        let lp = tensor(&c["log_probs"]);
        let old = tensor(&c["old_log_probs"]);
        let reference = tensor(&c["ref_log_probs"]);
        let adv = tensor(&c["advantages"]);
        let h = tensor(&c["entropy"]);
        let n = scalar(&mask.sum(Kind::Double));
        let mut types = Vec::new();
        for cfg_case in c["configs"].as_array().unwrap() {
            let loss_type = cfg_case["loss_type"].as_str().unwrap();
            types.push(loss_type);
            let agg = match loss_type {
                "grpo" => GrpoAggregation::Grpo,
                "bnpo" => GrpoAggregation::Bnpo,
                "dr_grpo" => GrpoAggregation::DrGrpo {
                    max_completion_length: Some(
                        cfg_case["max_completion_length"].as_i64().unwrap(),
                    ),
                },
                "dapo" => GrpoAggregation::Dapo {
                    active_tokens: Some(f(&cfg_case["num_items_in_batch"])),
                },
                other => panic!("loss_type {other}"),
            };
            let ent = f(&cfg_case["entropy_coef"]);
            let (lo, hi) = (f(&cfg_case["epsilon_low"]), f(&cfg_case["epsilon_high"]));
            let cfg = GrpoConfig::new()
                .with_clip_epsilon_asymmetric(lo, hi)
                .with_aggregation(agg)
                .with_kl_to_ref_coeff(Some(f(&cfg_case["beta"])))
                .with_entropy_coeff((ent != 0.0).then_some(ent));
            let what = format!("{loss_type} (entropy_coef {ent})");
            let out =
                grpo_loss_with_entropy(&lp, &old, &adv, &mask, Some(&reference), Some(&h), &cfg)
                    .unwrap();
            close(
                scalar(&out.total_loss().unwrap()),
                f(&cfg_case["loss"]),
                TOL,
                &what,
            );
            let m = &cfg_case["metrics"];
            close(
                scalar(out.kl_to_ref.as_ref().unwrap()),
                f(&m["kl"]),
                TOL,
                &format!("{what} kl"),
            );
            close(
                scalar(out.entropy.as_ref().unwrap()),
                f(&m["entropy"]),
                TOL,
                &format!("{what} entropy"),
            );
            if let Some(p) = m.get("policy_loss") {
                // TRL's loss before the entropy bonus
                let policy =
                    scalar(&out.loss_objective) + scalar(out.loss_kl_to_ref.as_ref().unwrap());
                close(policy, f(p), TOL, &format!("{what} policy_loss"));
            }
            if loss_type == "dapo" && f(&cfg_case["num_items_in_batch"]) == n {
                // with this batch's token count, `active_tokens: None` is the same
                let local = cfg.clone().with_aggregation(GrpoAggregation::Dapo {
                    active_tokens: None,
                });
                let o = grpo_loss_with_entropy(
                    &lp,
                    &old,
                    &adv,
                    &mask,
                    Some(&reference),
                    Some(&h),
                    &local,
                )
                .unwrap();
                close(
                    scalar(&o.total_loss().unwrap()),
                    f(&cfg_case["loss"]),
                    TOL,
                    &what,
                );
            }
            // TRL's clip ratios count the tokens whose clamp is active in the gradient
            let ratio = (&lp - &old).exp();
            let a = adv.view([-1, 1]);
            let low = ratio.lt(1.0 - lo).logical_and(&a.lt(0.0));
            let high = ratio.gt(1.0 + hi).logical_and(&a.gt(0.0));
            let mean =
                |x: &Tensor| scalar(&(x.to_kind(Kind::Double) * &mask).sum(Kind::Double)) / n;
            close(
                mean(&low),
                f(&m["clip_ratio/low_mean"]),
                1e-6,
                &format!("{what} low clip"),
            );
            close(
                mean(&high),
                f(&m["clip_ratio/high_mean"]),
                1e-6,
                &format!("{what} high clip"),
            );
            let region = mean(&low.logical_or(&high));
            close(
                region,
                f(&m["clip_ratio/region_mean"]),
                1e-6,
                &format!("{what} region clip"),
            );
            assert!(
                scalar(&out.clip_fraction) >= region,
                "{what}: ours counts every clamp"
            );
        }
        assert_eq!(
            types,
            ["grpo", "grpo", "bnpo", "dr_grpo", "dr_grpo", "dapo", "dapo"]
        );
    }
}

// ------------------------------------------------------------------ 5. TRL DPO

#[test]
fn replay_trl_dpo() {
    for c in cases("trl_dpo") {
        let side = |s: &str| -> (Tensor, Tensor, Tensor, Tensor, Tensor) {
            let v = &c[s];
            (
                int_tensor(&v["input_ids"]),
                int_tensor(&v["attention_mask"]),
                int_tensor(&v["completion_mask"]),
                tensor(&v["token_log_probs"]),
                tensor(&v["ref_log_probs"]),
            )
        };
        let (c_ids, c_attn, c_comp, c_lp, c_ref) = side("chosen");
        let (r_ids, r_attn, r_comp, r_lp, r_ref) = side("rejected");
        let (pc, lc) = sequence_log_probs(&c_lp, &c_comp).unwrap();
        let (pr, lr) = sequence_log_probs(&r_lp, &r_comp).unwrap();
        let b = c_ids.size()[0];
        let sub = |ids: &Tensor, attn: &Tensor, comp: &Tensor, reference: &Tensor| {
            TensorDict::new([b])
                .unwrap()
                .with("input_ids", ids.shallow_clone())
                .unwrap()
                .with("attention_mask", attn.shallow_clone())
                .unwrap()
                .with("completion_mask", comp.shallow_clone())
                .unwrap()
                .with("ref_log_probs", reference.shallow_clone())
                .unwrap()
        };
        let td = TensorDict::new([b])
            .unwrap()
            .with("chosen", sub(&c_ids, &c_attn, &c_comp, &c_ref))
            .unwrap()
            .with("rejected", sub(&r_ids, &r_attn, &r_comp, &r_ref))
            .unwrap();
        let (chosen_ids, chosen_lp, rejected_lp) = (
            c_ids.shallow_clone(),
            c_lp.shallow_clone(),
            r_lp.shallow_clone(),
        );
        let policy = ScoreFn(move |tokens: &Tensor, _m: &Tensor| {
            let lp = if tokens.equal(&chosen_ids) {
                chosen_lp.shallow_clone()
            } else {
                rejected_lp.shallow_clone()
            };
            Ok((lp, None))
        });
        let mut loss = DpoLoss::new(policy);

        let mut seen = Vec::new();
        for cfg_case in c["configs"].as_array().unwrap() {
            let loss_type: DpoLossType = cfg_case["loss_type"].as_str().unwrap().parse().unwrap();
            let beta = f(&cfg_case["beta"]);
            let eps = f(&cfg_case["label_smoothing"]);
            seen.push(loss_type);
            let what = format!("{loss_type} β={beta} ε={eps}");
            let cfg = DpoConfig::new()
                .with_beta(beta)
                .with_loss_type(loss_type)
                .with_label_smoothing(eps);
            // TRL 1.16's sigmoid ignores the label smoothing: compare ours at ε = 0
            let trl_cfg = if loss_type == DpoLossType::Sigmoid {
                cfg.clone().with_label_smoothing(0.0)
            } else {
                cfg.clone()
            };
            let out = dpo_loss(&pc, &pr, &c_ref, &r_ref, Some((&lc, &lr)), &trl_cfg).unwrap();
            loss = loss.with_config(trl_cfg.clone()).unwrap();
            let module_out = loss.forward(&td).unwrap();
            for (o, via) in [(&out, "dpo_loss"), (&module_out, "DpoLoss")] {
                let w = format!("{what} ({via})");
                close(
                    scalar(&o.total_loss().unwrap()),
                    f(&cfg_case["loss"]),
                    TOL,
                    &w,
                );
                let m = &cfg_case["metrics"];
                close(scalar(&o.rewards_chosen), f(&m["rewards/chosen"]), TOL, &w);
                close(
                    scalar(&o.rewards_rejected),
                    f(&m["rewards/rejected"]),
                    TOL,
                    &w,
                );
                close(scalar(&o.accuracy), f(&m["rewards/accuracies"]), 1e-7, &w);
                close(scalar(&o.margin), f(&m["rewards/margins"]), TOL, &w);
                for (i, p) in cfg_case["per_pair"].as_array().unwrap().iter().enumerate() {
                    let i = i as i64;
                    close(o.per_pair_loss.double_value(&[i]), f(&p["loss"]), TOL, &w);
                    close(
                        o.chosen_rewards.double_value(&[i]),
                        f(&p["chosen_reward"]),
                        TOL,
                        &w,
                    );
                    close(
                        o.rejected_rewards.double_value(&[i]),
                        f(&p["rejected_reward"]),
                        TOL,
                        &w,
                    );
                    let right =
                        o.chosen_rewards.double_value(&[i]) > o.rejected_rewards.double_value(&[i]);
                    assert_eq!(
                        f64::from(u8::from(right)),
                        f(&p["accuracy"]),
                        "{w} pair {i}"
                    );
                }
            }
            if loss_type == DpoLossType::Sigmoid {
                // conservative DPO: (1 − ε)·(−log σ(x)) + ε·(−log σ(−x)), the second TRL's
                // loss on the swapped pairs
                let ours = dpo_loss(&pc, &pr, &c_ref, &r_ref, None, &cfg).unwrap();
                let want = (1.0 - eps) * f(&cfg_case["loss"]) + eps * f(&cfg_case["loss_swapped"]);
                close(scalar(&ours.loss_dpo), want, TOL, &format!("{what} cDPO"));
            }
        }
        assert_eq!(seen.len(), 7);
        for t in [
            DpoLossType::Sigmoid,
            DpoLossType::Hinge,
            DpoLossType::Ipo,
            DpoLossType::Robust,
        ] {
            assert!(seen.contains(&t), "{t} recorded");
        }
    }
}
