//! `ClipPPOLoss` and `KLPENPPOLoss` (`torchrl::objectives::ppo`).
//!
//! 1. Replays `specs/ppo_cases.json` (recorded by `specs/record_ppo.py` with TorchRL 0.14.1's
//!    `ClipPPOLoss`; Python is never run): a fixed-weight MLP actor (Normal, per-dim log-prob,
//!    or TanhNormal) and critic, a fixed batch, every loss output and the gradients of the
//!    summed `loss_*` terms w.r.t. the eight weight tensors. Values within 1e-5, gradients
//!    within 1e-4; shapes exact.
//! 2. Replays `specs/klpen_cases.json` (`specs/record_klpen.py`, TorchRL 0.14.1's
//!    `KLPENPPOLoss`): the same networks with the behaviour policy's `loc`/`scale` in the batch,
//!    two calls per case so that the adaptive β is checked before and after each; gradients
//!    are those of the reported loss (see the recorder on TorchRL's in-place β update).
//! 3. Replays `specs/a2c_cases.json` (`specs/record_a2c.py`, TorchRL 0.14.1's `A2CLoss` and
//!    `ReinforceLoss`): the same networks and batches (no behaviour log-prob), plus a
//!    categorical actor (the actor MLP's output as logits, analytic entropy), within the same
//!    tolerances; and the settings those losses do not have are refused by name.
//! 4. Hand-derived edge cases: ratio exactly 1, `set_keys` remaps end to end, missing keys,
//!    the outer-product guard, the estimator path and key forwarding.

use serde_json::Value;
use tch::{Kind, Tensor};
use torchrl::modules::{
    from_fn, DistributionBuilder, NormalParamExtractor, ProbabilisticActor, TensorDictModule,
    TensorDictSequential,
};
use torchrl::modules::{PercentileValueNorm, RunningValueNorm, ValueNorm};
use torchrl::objectives::value::{TD0Estimator, ValueEstimator, GAE};
use torchrl::objectives::{
    A2CLoss, ClipPPOLoss, CriticLossType, KLPENPPOLoss, LossModule, LossOutput, PpoLossOutput,
    Reduction, ReinforceLoss, SoftUpdate, TargetParams,
};
use torchrl::{NestedKey, TensorDict};

const VALUE_TOL: f64 = 1e-5;
const GRAD_TOL: f64 = 1e-4;
type R<T> = std::result::Result<T, String>;

fn tensor(v: &Value) -> R<Tensor> {
    let shape: Vec<i64> = v["shape"]
        .as_array()
        .ok_or("shape")?
        .iter()
        .map(|x| x.as_i64().ok_or("dim"))
        .collect::<Result<_, _>>()?;
    let data: Vec<f64> = v["data"]
        .as_array()
        .ok_or("data")?
        .iter()
        .map(|x| {
            x.as_f64()
                .or_else(|| x.as_bool().map(f64::from))
                .unwrap_or(f64::NAN)
        })
        .collect();
    Ok(Tensor::from_slice(&data).view(shape.as_slice()))
}

fn close(actual: &Tensor, expected: &Tensor, tol: f64, what: &str) -> R<()> {
    if actual.size() != expected.size() {
        return Err(format!(
            "{what}: shape {:?} != {:?}",
            actual.size(),
            expected.size()
        ));
    }
    let a = actual.to_kind(Kind::Double).view([-1]);
    let e = expected.view([-1]);
    let diff = (&a - &e).abs();
    let scale = e.abs().clamp_min(1.0);
    let worst = (diff / scale).max().double_value(&[]);
    if worst.is_nan() || worst > tol {
        return Err(format!("{what}: {a:?} vs {e:?} (worst {worst})"));
    }
    Ok(())
}

/// `Linear(3,4) -> Tanh -> Linear(4, out)` with the given weight leaves.
fn mlp(x: &Tensor, w1: &Tensor, b1: &Tensor, w2: &Tensor, b2: &Tensor) -> Tensor {
    (x.matmul(&w1.tr()) + b1).tanh().matmul(&w2.tr()) + b2
}

fn fetch(w: &Value, name: &str) -> R<Tensor> {
    Ok(tensor(&w[name])?.set_requires_grad(true))
}

const WEIGHTS: [&str; 8] = [
    "actor_w1",
    "actor_b1",
    "actor_w2",
    "actor_b2",
    "critic_w1",
    "critic_b1",
    "critic_w2",
    "critic_b2",
];

/// The case's actor (Normal or TanhNormal on an MLP + `NormalParamExtractor`), critic, and the
/// eight weight leaves.
fn networks(
    case: &Value,
) -> R<(
    ProbabilisticActor,
    impl TensorDictModule + 'static,
    Vec<Tensor>,
)> {
    let w = &case["weights"];
    let ws: Vec<Tensor> = WEIGHTS.iter().map(|n| fetch(w, n)).collect::<R<_>>()?;
    let [a1, ab1, a2, ab2, c1, cb1, c2, cb2] =
        [0, 1, 2, 3, 4, 5, 6, 7].map(|i| ws[i].shallow_clone());
    let net = from_fn(["observation"], ["param"], move |x: &[&Tensor]| {
        Ok(vec![mlp(x[0], &a1, &ab1, &a2, &ab2)])
    })
    .map_err(|e| e.to_string())?;
    let module = TensorDictSequential::new()
        .with(net)
        .with(NormalParamExtractor::new());
    let builder = match case["dist"].as_str() {
        Some("normal") => DistributionBuilder::normal("loc", "scale"),
        _ => DistributionBuilder::tanh_normal("loc", "scale", -1.0, 1.0),
    }
    .map_err(|e| e.to_string())?;
    let actor = ProbabilisticActor::new(module, builder);
    let critic = from_fn(["observation"], ["state_value"], move |x: &[&Tensor]| {
        Ok(vec![mlp(x[0], &c1, &cb1, &c2, &cb2)])
    })
    .map_err(|e| e.to_string())?;
    Ok((actor, critic, ws))
}

/// Applies the keyword arguments every PPO loss shares to `$loss`.
macro_rules! shared_kwargs {
    ($loss:expr, $kw:expr) => {{
        let (mut loss, kw) = ($loss, $kw);
        let e = |e: torchrl::Error| e.to_string();
        if let Some(v) = kw.get("entropy_bonus").and_then(Value::as_bool) {
            loss = loss.with_entropy_bonus(v);
        }
        if let Some(v) = kw.get("entropy_coeff").and_then(Value::as_f64) {
            loss = loss.with_entropy_coeff(v).map_err(e)?;
        }
        if let Some(v) = kw.get("critic_coeff").and_then(Value::as_f64) {
            loss = loss.with_critic_coeff(v).map_err(e)?;
        }
        if let Some(v) = kw.get("loss_critic_type").and_then(Value::as_str) {
            loss = loss.with_loss_critic_type(v.parse::<CriticLossType>().map_err(e)?);
        }
        if let Some(v) = kw.get("clip_value").and_then(Value::as_f64) {
            loss = loss.with_clip_value(Some(v)).map_err(e)?;
        }
        if let Some(v) = kw.get("normalize_advantage").and_then(Value::as_bool) {
            loss = loss.with_normalize_advantage(v);
        }
        if let Some(v) = kw.get("reduction").and_then(Value::as_str) {
            loss = loss.with_reduction(v.parse::<Reduction>().map_err(e)?);
        }
        loss
    }};
}

/// The recorded batch (every entry of `case["td"]`).
fn batch(case: &Value) -> R<TensorDict> {
    let mut td = TensorDict::new([6]).map_err(|e| e.to_string())?;
    for (k, v) in case["td"].as_object().ok_or("td")? {
        td.set(k.as_str(), tensor(v)?).map_err(|e| e.to_string())?;
    }
    Ok(td)
}

/// Every produced output equals the recorded one (and nothing is missing either way), metrics
/// are detached, and the gradients of the summed `loss_*` terms match `exp["grads"]`.
fn check_outputs(name: &str, out: &impl LossOutput, exp: &Value, ws: &[Tensor]) -> R<()> {
    let mut produced: Vec<(&str, &Tensor)> = out.loss_terms();
    produced.extend(out.metrics());
    for (k, v) in &produced {
        let ev = exp
            .get(*k)
            .ok_or_else(|| format!("{name}: produced {k}, not recorded"))?;
        close(v, &tensor(ev)?, VALUE_TOL, &format!("{name}.{k}"))?;
    }
    for k in exp.as_object().ok_or("expect")?.keys() {
        if k != "grads" && !produced.iter().any(|(p, _)| p == k) {
            return Err(format!("{name}: recorded {k}, not produced"));
        }
    }
    for (k, v) in out.metrics() {
        if v.requires_grad() {
            return Err(format!("{name}: metric {k} requires grad"));
        }
    }
    let total = out
        .loss_terms()
        .iter()
        .fold(Tensor::from(0.0f64), |acc, (_, t)| {
            acc + t.sum(Kind::Double)
        });
    let grads = Tensor::run_backward(&[total], ws, false, false);
    for (i, n) in WEIGHTS.iter().enumerate() {
        close(
            &grads[i],
            &tensor(&exp["grads"][*n])?,
            GRAD_TOL,
            &format!("{name}.grad.{n}"),
        )?;
    }
    Ok(())
}

fn replay(case: &Value) -> R<()> {
    let name = case["name"].as_str().ok_or("name")?;
    let (actor, critic, ws) = networks(case)?;
    let kw = &case["kwargs"];
    let mut loss = shared_kwargs!(ClipPPOLoss::new(actor, critic), kw);
    if let Some(v) = kw.get("clip_epsilon").and_then(Value::as_f64) {
        loss = loss.with_clip_epsilon(v).map_err(|e| e.to_string())?;
    }
    let td = batch(case)?;
    let out = loss.forward(&td).map_err(|e| e.to_string())?;
    check_outputs(name, &out, &case["expect"], &ws)
}

fn load(file: &str) -> Vec<Value> {
    let path = format!("{}/specs/{file}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).expect("spec file");
    let doc: Value = serde_json::from_str(&text).expect("json");
    doc["cases"].as_array().expect("cases").clone()
}

#[test]
fn reference_cases() {
    let cases = load("ppo_cases.json");
    assert!(cases.len() >= 10);
    let failures: Vec<String> = cases.iter().filter_map(|c| replay(c).err()).collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Two calls of one `KLPENPPOLoss` on the same batch: outputs, gradients, and β before and
/// after each call (the adaptive update).
fn replay_klpen(case: &Value) -> R<()> {
    let name = case["name"].as_str().ok_or("name")?;
    let (actor, critic, ws) = networks(case)?;
    let kw = &case["kwargs"];
    let e = |e: torchrl::Error| e.to_string();
    let mut loss = shared_kwargs!(KLPENPPOLoss::new(actor, critic), kw);
    if let Some(v) = kw.get("dtarg").and_then(Value::as_f64) {
        loss = loss.with_dtarg(v).map_err(e)?;
    }
    if let Some(v) = kw.get("beta").and_then(Value::as_f64) {
        loss = loss.with_beta(v).map_err(e)?;
    }
    if let Some(v) = kw.get("increment").and_then(Value::as_f64) {
        loss = loss.with_increment(v).map_err(e)?;
    }
    if let Some(v) = kw.get("decrement").and_then(Value::as_f64) {
        loss = loss.with_decrement(v).map_err(e)?;
    }
    let td = batch(case)?;
    for (i, call) in case["calls"].as_array().ok_or("calls")?.iter().enumerate() {
        let what = format!("{name}[call {i}]");
        let beta = call["beta"].as_f64().ok_or("beta")?;
        if (loss.beta() - beta).abs() > 1e-12 {
            return Err(format!(
                "{what}: beta {} before the call, recorded {beta}",
                loss.beta()
            ));
        }
        let out = loss.forward(&td).map_err(e)?;
        if out.beta != beta {
            return Err(format!("{what}: the output's beta {} != {beta}", out.beta));
        }
        let after = call["beta_after"].as_f64().ok_or("beta_after")?;
        if (loss.beta() - after).abs() > 1e-12 {
            return Err(format!(
                "{what}: beta {} after the call, recorded {after}",
                loss.beta()
            ));
        }
        check_outputs(&what, &out, &call["expect"], &ws)?;
    }
    loss.reset();
    let beta0 = kw.get("beta").and_then(Value::as_f64).unwrap_or(1.0);
    if loss.beta() != beta0 {
        return Err(format!(
            "{name}: reset gives beta {}, not {beta0}",
            loss.beta()
        ));
    }
    Ok(())
}

#[test]
fn klpen_reference_cases() {
    let cases = load("klpen_cases.json");
    assert!(cases.len() >= 7);
    let failures: Vec<String> = cases.iter().filter_map(|c| replay_klpen(c).err()).collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// `networks`, with the actor's MLP output read as the logits of a categorical policy for
/// `dist = "categorical"`.
fn on_policy_networks(
    case: &Value,
) -> R<(ProbabilisticActor, Box<dyn TensorDictModule>, Vec<Tensor>)> {
    if case["dist"].as_str() != Some("categorical") {
        let (actor, critic, ws) = networks(case)?;
        return Ok((actor, Box::new(critic), ws));
    }
    let w = &case["weights"];
    let ws: Vec<Tensor> = WEIGHTS.iter().map(|n| fetch(w, n)).collect::<R<_>>()?;
    let [a1, ab1, a2, ab2, c1, cb1, c2, cb2] =
        [0, 1, 2, 3, 4, 5, 6, 7].map(|i| ws[i].shallow_clone());
    let net = from_fn(["observation"], ["logits"], move |x: &[&Tensor]| {
        Ok(vec![mlp(x[0], &a1, &ab1, &a2, &ab2)])
    })
    .map_err(|e| e.to_string())?;
    let builder = DistributionBuilder::categorical("logits").map_err(|e| e.to_string())?;
    let actor = ProbabilisticActor::new(net, builder);
    let critic = from_fn(["observation"], ["state_value"], move |x: &[&Tensor]| {
        Ok(vec![mlp(x[0], &c1, &cb1, &c2, &cb2)])
    })
    .map_err(|e| e.to_string())?;
    Ok((actor, Box::new(critic), ws))
}

fn replay_on_policy(case: &Value) -> R<()> {
    let name = case["name"].as_str().ok_or("name")?;
    let (actor, critic, ws) = on_policy_networks(case)?;
    let kw = &case["kwargs"];
    let mut td = batch(case)?;
    if case["dist"].as_str() == Some("categorical") {
        let a = td.get("action").ok_or("action")?.to_kind(Kind::Int64);
        td.set("action", a).map_err(|e| e.to_string())?;
    }
    let e = |e: torchrl::Error| e.to_string();
    match case["loss"].as_str() {
        Some("a2c") => {
            let loss = shared_kwargs!(A2CLoss::new(actor, critic), kw);
            let out = loss.forward(&td).map_err(e)?;
            check_outputs(name, &out, &case["expect"], &ws)
        }
        Some("reinforce") => {
            let loss = shared_kwargs!(ReinforceLoss::new(actor, critic), kw);
            let out = loss.forward(&td).map_err(e)?;
            check_outputs(name, &out, &case["expect"], &ws)
        }
        other => Err(format!("{name}: unknown loss {other:?}")),
    }
}

#[test]
fn a2c_and_reinforce_reference_cases() {
    let cases = load("a2c_cases.json");
    assert!(cases.len() >= 10);
    let failures: Vec<String> = cases
        .iter()
        .filter_map(|c| replay_on_policy(c).err())
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A2C and REINFORCE read no behaviour log-prob, keep TorchRL's out keys, and refuse the
/// settings TorchRL's classes do not have, naming them.
#[test]
fn a2c_and_reinforce_keys_and_refusals() {
    let case = &load("a2c_cases.json")[0];
    let (actor, critic, _) = on_policy_networks(case).unwrap();
    let a2c = A2CLoss::new(actor, critic);
    assert!(!a2c.in_keys().contains(&NestedKey::from("action_log_prob")));
    assert_eq!(
        a2c.out_keys(),
        ["loss_objective", "loss_critic", "entropy", "loss_entropy"]
    );
    let err = a2c.with_normalize_advantage(true);
    let mut td = batch(case).unwrap();
    let a = td.get("action").unwrap().to_kind(Kind::Int64);
    td.set("action", a).unwrap();
    let msg = err.forward(&td).unwrap_err().to_string();
    assert!(msg.contains("normalize_advantage"), "{msg}");

    let (actor, critic, _) = on_policy_networks(case).unwrap();
    let reinforce = ReinforceLoss::new(actor, critic);
    assert_eq!(reinforce.out_keys(), ["loss_actor", "loss_value"]);
    assert!(!reinforce.config().entropy_bonus);
    let msg = reinforce.with_critic_coeff(0.5).unwrap_err().to_string();
    assert!(msg.contains("critic_coeff"), "{msg}");
    let (actor, critic, _) = on_policy_networks(case).unwrap();
    let msg = ReinforceLoss::new(actor, critic)
        .with_entropy_coeff(0.1)
        .map(|l| l.with_entropy_bonus(true))
        .unwrap()
        .forward(&td)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("entropy_bonus"), "{msg}");
    // without the stored action, the error names it
    let (actor, critic, _) = on_policy_networks(case).unwrap();
    let msg = A2CLoss::new(actor, critic)
        .forward(&td.exclude(&["action"]))
        .unwrap_err()
        .to_string();
    assert!(msg.contains("action"), "{msg}");
}

// ------------------------------------------------------------------------ hand-derived

/// A Gaussian actor `loc = w·obs`, `scale = 1` over one action dim, and its weight.
fn toy_actor() -> (ProbabilisticActor, Tensor) {
    let w = Tensor::from_slice(&[0.5f64]).set_requires_grad(true);
    let wc = w.shallow_clone();
    let net = from_fn(["obs"], ["loc", "scale"], move |x: &[&Tensor]| {
        Ok(vec![x[0].f_mul(&wc)?, x[0].f_ones_like()?])
    })
    .expect("module");
    let actor = ProbabilisticActor::new(
        net,
        DistributionBuilder::normal("loc", "scale").expect("builder"),
    );
    (actor, w)
}

fn toy_critic() -> impl TensorDictModule {
    from_fn(["obs"], ["state_value"], |x: &[&Tensor]| {
        Ok(vec![x[0].f_mul_scalar(2.0)?])
    })
    .expect("critic")
}

/// obs, action, the current log-probs (ratio 1) and advantages for 4 samples.
fn toy_batch() -> TensorDict {
    let obs = Tensor::from_slice(&[1.0f64, -1.0, 0.5, 2.0]).view([4, 1]);
    let action = Tensor::from_slice(&[0.2f64, -0.7, 0.1, 1.5]).view([4, 1]);
    let lp = (&action - &obs * 0.5).square() * -0.5 - 0.5 * (2.0 * std::f64::consts::PI).ln();
    TensorDict::new([4])
        .and_then(|t| t.with("obs", obs))
        .and_then(|t| t.with("action", action))
        .and_then(|t| t.with("action_log_prob", lp))
        .and_then(|t| {
            t.with(
                "advantage",
                Tensor::from_slice(&[1.0f64, -2.0, 0.5, 3.0]).view([4, 1]),
            )
        })
        .and_then(|t| {
            t.with(
                "value_target",
                Tensor::zeros([4, 1], (Kind::Double, tch::Device::Cpu)),
            )
        })
        .expect("td")
}

#[test]
fn ratio_one_gives_minus_mean_advantage() {
    let (actor, w) = toy_actor();
    let loss = ClipPPOLoss::new(actor, toy_critic());
    let out: PpoLossOutput = loss.forward(&toy_batch()).expect("forward");
    assert!((out.loss_objective.double_value(&[]) + 0.625).abs() < 1e-12);
    assert_eq!(out.clip_fraction.double_value(&[]), 0.0);
    assert!((out.ess.double_value(&[]) - 1.0).abs() < 1e-12);
    assert!(out.kl_approx.double_value(&[]).abs() < 1e-12);
    assert!((out.max_ratio.double_value(&[]) - 1.0).abs() < 1e-12);
    // entropy of N(·, 1): 0.5 ln(2πe)
    let h = 0.5 * (2.0 * std::f64::consts::PI * std::f64::consts::E).ln();
    let ent = out.entropy.as_ref().expect("entropy").double_value(&[]);
    assert!((ent - h).abs() < 1e-12);
    let le = out
        .loss_entropy
        .as_ref()
        .expect("loss_entropy")
        .double_value(&[]);
    assert!((le + 0.01 * h).abs() < 1e-12);
    // critic: smooth-L1 of 2·obs against 0: |2|→1.5, |−2|→1.5, |1|→0.5, |4|→3.5, mean 1.75
    let lc = out
        .loss_critic
        .as_ref()
        .expect("loss_critic")
        .double_value(&[]);
    assert!((lc - 1.75).abs() < 1e-12);
    // d/dw of -mean(A·exp(lp(w) - lp_old)) at ratio 1 = -mean(A·(a - w·o)·o)
    out.total_loss().expect("total").backward();
    let g: f64 = [
        (1.0, 0.2, 1.0),
        (-2.0, -0.7, -1.0),
        (0.5, 0.1, 0.5),
        (3.0, 1.5, 2.0),
    ]
    .iter()
    .map(|(a, x, o)| -a * (x - 0.5 * o) * o / 4.0)
    .sum();
    // the entropy of a unit-scale Normal does not depend on w
    assert!((w.grad().double_value(&[0]) - g).abs() < 1e-10);
}

#[test]
fn clip_fraction_and_clip_bound() {
    // old log-probs 1 nat below the current ones: ratio e > 1.2, all clipped
    let (actor, _) = toy_actor();
    let loss = ClipPPOLoss::new(actor, toy_critic());
    let mut td = toy_batch();
    let lp = td.get("action_log_prob").expect("lp") - 1.0;
    td.set("action_log_prob", lp).expect("set");
    let out = loss.forward(&td).expect("forward");
    assert_eq!(out.clip_fraction.double_value(&[]), 1.0);
    // positive A: min(e·A, 1.2·A) = 1.2·A; negative A: min(−2e, −2.4) = −2e
    let expected = -(1.2 * 1.0 - 2.0 * std::f64::consts::E + 1.2 * 0.5 + 1.2 * 3.0) / 4.0;
    assert!((out.loss_objective.double_value(&[]) - expected).abs() < 1e-12);
}

#[test]
fn set_keys_remaps_end_to_end() {
    let (actor, _) = toy_actor();
    let mut loss = ClipPPOLoss::new(actor, toy_critic());
    loss.set_keys(&[
        ("advantage", Some("adv2".into())),
        ("value_target", Some(("vt", "x").into())),
        ("sample_log_prob", Some("old_lp".into())),
        ("action", Some("act".into())),
    ])
    .expect("set_keys");
    assert!(loss.in_keys().contains(&NestedKey::from("old_lp")));
    assert!(loss.in_keys().contains(&NestedKey::from("act")));
    let td = toy_batch();
    let remapped = TensorDict::new([4])
        .and_then(|t| t.with("obs", td.get("obs").expect("obs").shallow_clone()))
        .and_then(|t| t.with("act", td.get("action").expect("a").shallow_clone()))
        .and_then(|t| {
            t.with(
                "old_lp",
                td.get("action_log_prob").expect("l").shallow_clone(),
            )
        })
        .and_then(|t| t.with("adv2", td.get("advantage").expect("adv").shallow_clone()))
        .and_then(|t| {
            t.with(
                ("vt", "x"),
                td.get("value_target").expect("vt").shallow_clone(),
            )
        })
        .expect("td");
    // the actor's parameters need only "obs"; the loss reads the action under "act"
    let out = loss.forward(&remapped).expect("forward");
    assert!((out.loss_objective.double_value(&[]) + 0.625).abs() < 1e-12);
    // the default-named input now misses the renamed keys
    let err = loss.forward(&td).expect_err("missing");
    assert!(err.to_string().contains("adv2") || err.to_string().contains("old_lp"));
    // None resets; an unknown name is refused and changes nothing
    loss.set_keys(&[("advantage", None)]).expect("reset");
    assert_eq!(loss.tensor_keys().advantage, NestedKey::from("advantage"));
    assert!(loss.set_keys(&[("foo", Some("x".into()))]).is_err());
    assert_eq!(loss.tensor_keys().action, NestedKey::from("act"));
}

#[test]
fn missing_keys_are_named() {
    let (actor, _) = toy_actor();
    let loss = ClipPPOLoss::new(actor, toy_critic());
    for k in ["action_log_prob", "value_target", "action"] {
        let mut td = toy_batch();
        td.remove(k).expect("del");
        let err = loss.forward(&td).expect_err(k).to_string();
        assert!(err.contains(k), "{k}: {err}");
    }
    // clip_value needs the stored value
    let (actor, _) = toy_actor();
    let loss = ClipPPOLoss::new(actor, toy_critic())
        .with_clip_value(Some(0.2))
        .expect("clip");
    let err = loss.forward(&toy_batch()).expect_err("value").to_string();
    assert!(err.contains("state_value"), "{err}");
    // no advantage and no "next": the error names the advantage
    let (actor, _) = toy_actor();
    let loss = ClipPPOLoss::new(actor, toy_critic());
    let mut td = toy_batch();
    td.remove("advantage").expect("del");
    let err = loss.forward(&td).expect_err("adv").to_string();
    assert!(err.contains("advantage"), "{err}");
    // a stored log-prob with grad is refused
    let mut td = toy_batch();
    let lp = td
        .get("action_log_prob")
        .expect("lp")
        .detach()
        .set_requires_grad(true);
    td.set("action_log_prob", lp).expect("set");
    assert!(loss.forward(&td).is_err());
}

#[test]
fn outer_product_broadcast_is_refused() {
    let (actor, _) = toy_actor();
    let loss = ClipPPOLoss::new(actor, toy_critic());
    let mut td = toy_batch();
    // log-prob [4] (scalar events squeezed) against a flat [4] advantage: [4,1] vs [4] → [4,4]
    let lp = td.get("action_log_prob").expect("lp").view([4]);
    td.set("action_log_prob", lp).expect("set");
    let act = td.get("action").expect("a").view([4]);
    td.set("action", act).expect("set");
    let obs = td.get("obs").expect("o").view([4]);
    td.set("obs", obs).expect("set");
    let adv = td.get("advantage").expect("adv").view([4]);
    td.set("advantage", adv).expect("set");
    let err = loss.forward(&td).expect_err("outer").to_string();
    assert!(err.contains("outer product"), "{err}");
}

#[test]
fn estimator_path_and_key_forwarding() {
    let (actor, _) = toy_actor();
    let mut loss = ClipPPOLoss::new(actor, toy_critic());
    loss.make_value_estimator(Box::new(GAE::new(0.9, 0.8).expect("gae").with_time_dim(0)))
        .expect("make");
    loss.set_keys(&[
        ("advantage", Some("adv_new".into())),
        ("value", Some("sv".into())),
        ("reward", Some("r2".into())),
        ("done", Some(("d", "done").into())),
    ])
    .expect("set_keys");
    let k = loss.value_estimator().expect("est").tensor_keys().clone();
    assert_eq!(k.advantage, NestedKey::from("adv_new"));
    assert_eq!(k.value, NestedKey::from("sv"));
    assert_eq!(k.reward, NestedKey::from("r2"));
    assert_eq!(k.done, NestedKey::from(("d", "done")));
    assert!(loss.in_keys().contains(&NestedKey::from(("next", "r2"))));
    assert!(loss.in_keys().contains(&NestedKey::from(("next", "obs"))));

    // a critic writing "sv"
    let (actor, _) = toy_actor();
    let critic = from_fn(["obs"], ["sv"], |x: &[&Tensor]| {
        Ok(vec![x[0].f_mul_scalar(2.0)?])
    })
    .expect("critic");
    let mut loss = ClipPPOLoss::new(actor, critic);
    loss.make_value_estimator(Box::new(GAE::new(0.9, 0.8).expect("gae").with_time_dim(0)))
        .expect("make");
    loss.set_keys(&[("value", Some("sv".into())), ("reward", Some("r2".into()))])
        .expect("set_keys");
    let mut td = toy_batch();
    td.remove("advantage").expect("del");
    let f = (Kind::Double, tch::Device::Cpu);
    let next_obs = Tensor::from_slice(&[0.0f64, 0.0, 0.0, 0.0]).view([4, 1]);
    td.set(("next", "obs"), next_obs).expect("set");
    td.set(("next", "r2"), Tensor::ones([4, 1], f))
        .expect("set");
    td.set(
        ("next", "done"),
        Tensor::ones([4, 1], (Kind::Bool, tch::Device::Cpu)),
    )
    .expect("set");
    let out = loss.forward(&td).expect("forward");
    // every step done and next value 0: A = r - V(s) = 1 - 2·obs = [-1, 3, 0, -3], ratio 1
    assert!((out.loss_objective.double_value(&[]) - 0.25).abs() < 1e-12);
}

#[test]
fn reductions_and_out_keys() {
    let (actor, _) = toy_actor();
    let loss = ClipPPOLoss::new(actor, toy_critic()).with_reduction(Reduction::None);
    let out = loss.forward(&toy_batch()).expect("forward");
    // Normal over [4, 1]: per-dim log-prob [4, 1], log-weight [4, 1, 1]
    assert_eq!(out.loss_objective.size(), vec![4, 1]);
    assert_eq!(out.loss_critic.as_ref().expect("critic").size(), vec![4]);
    assert_eq!(
        loss.out_keys(),
        [
            "loss_objective",
            "clip_fraction",
            "entropy",
            "loss_entropy",
            "loss_critic",
            "ESS",
            "kl_approx",
            "max_ratio",
            "mean_ratio"
        ]
    );
    let td = out.to_tensordict().expect("td");
    assert!(td.contains("ESS") && td.contains("loss_objective"));
    assert!(ClipPPOLoss::new(toy_actor().0, toy_critic())
        .with_clip_epsilon(1.0)
        .is_err());
    let no_critic = ClipPPOLoss::without_critic(toy_actor().0);
    let out = no_critic.forward(&toy_batch()).expect("forward");
    assert!(out.loss_critic.is_none() && out.explained_variance.is_none());
}

#[test]
fn monte_carlo_entropy_for_tanh_normal() {
    let w = Tensor::from_slice(&[0.3f64]).set_requires_grad(true);
    let wc = w.shallow_clone();
    let net = from_fn(["obs"], ["loc", "scale"], move |x: &[&Tensor]| {
        Ok(vec![
            x[0].f_mul(&wc)?,
            x[0].f_ones_like()?.f_mul_scalar(0.5)?,
        ])
    })
    .expect("net");
    let actor = ProbabilisticActor::new(
        net,
        DistributionBuilder::tanh_normal("loc", "scale", -1.0, 1.0).expect("b"),
    );
    let loss = ClipPPOLoss::without_critic(actor)
        .with_samples_mc_entropy(2000)
        .expect("mc");
    let mut td = toy_batch();
    let obs = td.get("obs").expect("o").expand([4, 2], false);
    td.set("obs", obs.contiguous()).expect("set");
    let act = Tensor::from_slice(&[0.1f64, -0.2, 0.3, 0.0, -0.5, 0.4, 0.2, 0.2]).view([4, 2]);
    td.set("action", act).expect("set");
    td.set(
        "action_log_prob",
        Tensor::zeros([4], (Kind::Double, tch::Device::Cpu)),
    )
    .expect("set");
    let out = loss.forward(&td).expect("forward");
    let h = out.entropy.as_ref().expect("entropy").double_value(&[]);
    // the entropy of tanh(N(μ, 0.5²)) per dim is below that of N(μ, 0.5²) (0.726) and finite
    assert!(h.is_finite() && h < 2.0 * 0.73 && h > -2.0, "{h}");
    let le = out.loss_entropy.as_ref().expect("le");
    assert!(le.requires_grad()); // reparameterised samples carry gradients to w
    le.backward();
    assert!(w.grad().double_value(&[0]).is_finite());
}

#[test]
fn critic_loss_types_parse() {
    assert_eq!(
        "l2".parse::<CriticLossType>().ok(),
        Some(CriticLossType::L2)
    );
    assert_eq!(
        "smooth_l1".parse::<CriticLossType>().ok(),
        Some(CriticLossType::SmoothL1)
    );
    assert!("huber".parse::<CriticLossType>().is_err());
    let _ = ValueEstimator::name(&GAE::new(0.9, 0.9).expect("gae"));
}

// ------------------------------------------------------------------ KLPENPPOLoss, hand-derived

/// A Normal with no closed-form KL: hides the `as_any` of the Normal it wraps.
struct Opaque(torchrl::modules::distributions::Normal);

impl torchrl::modules::distributions::Distribution for Opaque {
    fn batch_shape(&self) -> &[i64] {
        self.0.batch_shape()
    }
    fn event_shape(&self) -> &[i64] {
        self.0.event_shape()
    }
    fn kind(&self) -> Kind {
        self.0.kind()
    }
    fn device(&self) -> tch::Device {
        self.0.device()
    }
    fn log_prob(&self, value: &Tensor) -> torchrl::Result<Tensor> {
        self.0.log_prob(value)
    }
    fn sample(&self, gen: &mut torchrl::rng::Generator, s: &[i64]) -> torchrl::Result<Tensor> {
        self.0.sample(gen, s)
    }
    fn has_rsample(&self) -> bool {
        true
    }
    fn rsample(&self, gen: &mut torchrl::rng::Generator, s: &[i64]) -> torchrl::Result<Tensor> {
        self.0.rsample(gen, s)
    }
    fn entropy(&self) -> torchrl::Result<Tensor> {
        self.0.entropy()
    }
    fn mode(&self) -> torchrl::Result<Tensor> {
        self.0.mode()
    }
    fn mean(&self) -> torchrl::Result<Tensor> {
        self.0.mean()
    }
}

/// The toy batch with the behaviour policy `loc = 0.5·obs + 0.2`, `scale = 1.5` stored.
fn klpen_batch() -> TensorDict {
    let mut td = toy_batch();
    let obs = td.get("obs").expect("obs").shallow_clone();
    td.set("loc", &obs * 0.5 + 0.2).expect("loc");
    td.set("scale", obs.ones_like() * 1.5).expect("scale");
    td
}

#[test]
fn klpen_analytic_kl_and_monte_carlo_fallback() {
    // KL(N(μ+0.2, 1.5) ‖ N(μ, 1)) = ½(2.25 + 0.04 - 1 - ln 2.25), the same for every sample
    let expected = 0.5 * (2.25 + 0.04 - 1.0 - 2.25f64.ln());
    let (actor, _) = toy_actor();
    let loss = KLPENPPOLoss::new(actor, toy_critic());
    let out = loss.forward(&klpen_batch()).expect("forward");
    assert_eq!(out.kl.size(), vec![4, 1, 1]);
    for i in 0..4 {
        assert!((out.kl.double_value(&[i, 0, 0]) - expected).abs() < 1e-12);
    }

    // the same policy behind a distribution without a closed form: Monte-Carlo estimate
    let w = Tensor::from_slice(&[0.5f64]).set_requires_grad(true);
    let wc = w.shallow_clone();
    let net = from_fn(["obs"], ["loc", "scale"], move |x: &[&Tensor]| {
        Ok(vec![x[0].f_mul(&wc)?, x[0].f_ones_like()?])
    })
    .expect("module");
    let builder = DistributionBuilder::custom("opaque", ["loc", "scale"], |td: &TensorDict| {
        let n = torchrl::modules::distributions::Normal::new(
            td.get_or_err("loc")?,
            td.get_or_err("scale")?,
        )?;
        Ok(Box::new(Opaque(n)) as Box<dyn torchrl::modules::distributions::Distribution>)
    })
    .expect("builder");
    let loss = KLPENPPOLoss::new(ProbabilisticActor::new(net, builder), toy_critic())
        .with_samples_mc_kl(20_000)
        .expect("samples")
        .with_seed(3);
    let out = loss.forward(&klpen_batch()).expect("forward");
    assert_eq!(out.kl.size(), vec![4, 1, 1]);
    let mc = out.kl.mean(Kind::Double).double_value(&[]);
    assert!((mc - expected).abs() < 0.02, "{mc} vs {expected}");
    // the penalty is differentiable through the current policy's log-prob
    out.total_loss().expect("total").backward();
    assert!(w.grad().abs().double_value(&[0]) > 0.0);
}

#[test]
fn klpen_beta_adapts_and_resets() {
    let (actor, _) = toy_actor();
    // KL ≈ 0.24 per sample: above 1.5 · 0.05 → β × 3; below 0.5/1.5 → β × 0.25
    let loss = KLPENPPOLoss::new(actor, toy_critic())
        .with_dtarg(0.05)
        .and_then(|l| l.with_beta(0.5))
        .and_then(|l| l.with_increment(3.0))
        .expect("config");
    let td = klpen_batch();
    let first = loss.forward(&td).expect("forward");
    assert_eq!(first.beta, 0.5);
    assert!((loss.beta() - 1.5).abs() < 1e-15);
    let second = loss.forward(&td).expect("forward");
    assert!((second.beta - 1.5).abs() < 1e-15);
    // the objective moved by Δβ · mean(kl)
    let kl = first.kl.mean(Kind::Double).double_value(&[]);
    let delta = second.loss_objective.double_value(&[]) - first.loss_objective.double_value(&[]);
    assert!((delta - 1.0 * kl).abs() < 1e-12);
    loss.reset();
    assert_eq!(loss.beta(), 0.5);

    let (actor, _) = toy_actor();
    let loss = KLPENPPOLoss::new(actor, toy_critic())
        .with_dtarg(0.5)
        .and_then(|l| l.with_decrement(0.25))
        .expect("config");
    loss.forward(&td).expect("forward");
    assert_eq!(loss.beta(), 0.25);
}

#[test]
fn klpen_config_keys_and_errors() {
    let (actor, _) = toy_actor();
    let loss = KLPENPPOLoss::new(actor, toy_critic());
    assert_eq!(
        loss.out_keys(),
        vec![
            "loss_objective",
            "kl",
            "entropy",
            "loss_entropy",
            "loss_critic"
        ]
    );
    // the behaviour policy's parameters are inputs
    for k in ["loc", "scale", "action_log_prob", "obs"] {
        assert!(loss.in_keys().contains(&NestedKey::from(k)), "{k}");
    }
    assert_eq!((loss.dtarg(), loss.beta()), (0.01, 1.0));
    // missing parameters are named
    let mut td = klpen_batch();
    td.remove("scale");
    let err = loss.forward(&td).expect_err("no scale").to_string();
    assert!(
        err.contains("scale") && err.contains("KLPENPPOLoss"),
        "{err}"
    );
    // TorchRL's bounds on the adaptation factors
    let (actor, _) = toy_actor();
    assert!(KLPENPPOLoss::without_critic(actor)
        .with_increment(0.9)
        .is_err());
    let (actor, _) = toy_actor();
    assert!(KLPENPPOLoss::without_critic(actor)
        .with_decrement(1.1)
        .is_err());
    let (actor, _) = toy_actor();
    let l = KLPENPPOLoss::without_critic(actor);
    assert!(l.with_samples_mc_kl(0).is_err());
    let (actor, _) = toy_actor();
    assert!(KLPENPPOLoss::without_critic(actor).with_beta(-1.0).is_err());
    // without a critic: no loss_critic
    let (actor, _) = toy_actor();
    let out = KLPENPPOLoss::without_critic(actor)
        .forward(&klpen_batch())
        .expect("forward");
    assert!(out.loss_critic.is_none() && out.explained_variance.is_none());
}

/// `compute_advantage` on a 3-step trajectory: the critic `V = 2·obs` at the root and in
/// "next", then GAE with γ = λ = 0.5, derived by hand:
/// δ = r + γ·V'·(1 − terminated) − V = [1 + 2 − 2, 1 + 3 − 4, 1 − 6] = [1, 0, −5];
/// A₂ = −5, A₁ = 0 + 0.25·(−5) = −1.25, A₀ = 1 + 0.25·(−1.25) = 0.6875;
/// value_target = A + V = [2.6875, 2.75, 1].
#[test]
fn compute_advantage_runs_the_critic_and_the_estimator() {
    let (actor, _) = toy_actor();
    let mut loss = ClipPPOLoss::new(actor, toy_critic());
    loss.make_value_estimator(Box::new(GAE::new(0.5, 0.5).expect("gae").with_time_dim(0)))
        .expect("estimator");
    let col = |v: &[f64]| Tensor::from_slice(v).view([-1, 1]);
    let flags = |v: &[bool]| Tensor::from_slice(v).view([-1, 1]);
    let mut td = TensorDict::new([3])
        .and_then(|t| t.with("obs", col(&[1.0, 2.0, 3.0])))
        .and_then(|t| t.with(("next", "obs"), col(&[2.0, 3.0, 4.0])))
        .and_then(|t| t.with(("next", "reward"), col(&[1.0, 1.0, 1.0])))
        .and_then(|t| t.with(("next", "done"), flags(&[false, false, true])))
        .and_then(|t| t.with(("next", "terminated"), flags(&[false, false, true])))
        .expect("td");
    loss.compute_advantage(&mut td).expect("advantage");
    let get = |k: &[&str]| -> Vec<f64> {
        Vec::<f64>::try_from(td.get(k).expect("entry").view([-1])).expect("values")
    };
    assert_eq!(get(&["state_value"]), vec![2.0, 4.0, 6.0]);
    assert_eq!(get(&["next", "state_value"]), vec![4.0, 6.0, 8.0]);
    assert_eq!(get(&["advantage"]), vec![0.6875, -1.25, -5.0]);
    assert_eq!(get(&["value_target"]), vec![2.6875, 2.75, 1.0]);
    // Without "next" the error says what is missing.
    let mut bare = TensorDict::new([3])
        .and_then(|t| t.with("obs", col(&[1.0, 2.0, 3.0])))
        .expect("td");
    let err = loss.compute_advantage(&mut bare).expect_err("no next");
    assert!(err.to_string().contains("\"next\""), "{err}");
}

// ------------------------------------------------- shared trunk, PpoConfig, trait objects

/// An actor-critic over a counting identity trunk (`hidden = obs`) whose heads are the toy
/// actor and critic: `loc = w·hidden`, `scale = 1`, `V = 2·hidden`.
fn shared_toy() -> (
    torchrl::modules::ActorValueOperator,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let calls = std::sync::Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let trunk = from_fn(["obs"], ["hidden"], move |x: &[&Tensor]| {
        c.fetch_add(1, Ordering::SeqCst);
        Ok(vec![x[0].shallow_clone()])
    })
    .expect("trunk");
    let w = Tensor::from_slice(&[0.5f64]).set_requires_grad(true);
    let head = from_fn(["hidden"], ["loc", "scale"], move |x: &[&Tensor]| {
        Ok(vec![x[0].f_mul(&w)?, x[0].f_ones_like()?])
    })
    .expect("policy head");
    let policy = ProbabilisticActor::new(
        head,
        DistributionBuilder::normal("loc", "scale").expect("builder"),
    );
    let value = from_fn(["hidden"], ["state_value"], |x: &[&Tensor]| {
        Ok(vec![x[0].f_mul_scalar(2.0)?])
    })
    .expect("value head");
    (
        torchrl::modules::ActorValueOperator::new(trunk, policy, value),
        calls,
    )
}

#[test]
fn actor_value_operator_runs_the_trunk_once_per_forward() {
    use std::sync::atomic::Ordering;
    let (op, calls) = shared_toy();
    let loss = ClipPPOLoss::from_actor_value(op);
    // the trunk's output is not an input of the loss; its input is
    assert!(loss.in_keys().contains(&NestedKey::from("obs")));
    assert!(!loss.in_keys().contains(&NestedKey::from("hidden")));
    let out = loss.forward(&toy_batch()).expect("forward");
    assert_eq!(calls.load(Ordering::SeqCst), 1, "one trunk run per forward");
    // the same numbers as the separate toy actor and critic on "obs"
    let (actor, _) = toy_actor();
    let separate = ClipPPOLoss::new(actor, toy_critic())
        .forward(&toy_batch())
        .expect("forward");
    assert!((out.loss_objective.double_value(&[]) + 0.625).abs() < 1e-12);
    for (name, a, b) in [
        ("objective", &out.loss_objective, &separate.loss_objective),
        (
            "critic",
            out.loss_critic.as_ref().expect("critic"),
            separate.loss_critic.as_ref().expect("critic"),
        ),
        (
            "entropy",
            out.loss_entropy.as_ref().expect("entropy"),
            separate.loss_entropy.as_ref().expect("entropy"),
        ),
    ] {
        assert_eq!(a.double_value(&[]), b.double_value(&[]), "{name}");
    }

    // the estimator path: the trunk runs once on the root and once on "next"
    let col = |v: &[f64]| Tensor::from_slice(v).view([-1, 1]);
    let mut td = TensorDict::new([3])
        .and_then(|t| t.with("obs", col(&[1.0, 2.0, 3.0])))
        .and_then(|t| t.with(("next", "obs"), col(&[2.0, 3.0, 4.0])))
        .and_then(|t| t.with(("next", "reward"), col(&[1.0, 1.0, 1.0])))
        .and_then(|t| {
            t.with(
                ("next", "done"),
                Tensor::from_slice(&[false, false, true]).view([-1, 1]),
            )
        })
        .expect("td");
    let mut loss = loss;
    loss.make_value_estimator(Box::new(GAE::new(0.5, 0.5).expect("gae").with_time_dim(0)))
        .expect("estimator");
    let before = calls.load(Ordering::SeqCst);
    loss.compute_advantage(&mut td).expect("advantage");
    assert_eq!(calls.load(Ordering::SeqCst) - before, 2);
    // the same hand-derived GAE as compute_advantage_runs_the_critic_and_the_estimator
    let adv = Vec::<f64>::try_from(td.get("advantage").expect("adv").view([-1])).expect("v");
    assert_eq!(adv, vec![0.6875, -1.25, -5.0]);
}

#[test]
fn ppo_config_is_validated_at_construction() {
    use torchrl::objectives::PpoConfig;
    use torchrl::Error;
    let cfg = PpoConfig::new()
        .with_clip_epsilon(0.1)
        .with_entropy_coeff(0.0)
        .with_critic_coeff(0.5)
        .with_loss_critic_type(CriticLossType::L2);
    let (actor, _) = toy_actor();
    let loss = ClipPPOLoss::new(actor, toy_critic())
        .with_config(cfg.clone())
        .expect("valid");
    assert_eq!(loss.clip_epsilon(), 0.1);
    assert_eq!(loss.critic_coeff(), 0.5);
    assert_eq!(loss.config(), &cfg);
    // ratio 1: the objective is -mean(A) whatever ε; the L2 critic: 0.5 · mean((2·obs)²)
    let out = loss.forward(&toy_batch()).expect("forward");
    assert!((out.loss_objective.double_value(&[]) + 0.625).abs() < 1e-12);
    let want = 0.5 * (4.0 + 4.0 + 1.0 + 16.0) / 4.0;
    let got = out.loss_critic.as_ref().expect("critic").double_value(&[]);
    assert!((got - want).abs() < 1e-12, "{got}");

    let bad: [(&str, PpoConfig); 6] = [
        ("clip_epsilon", PpoConfig::new().with_clip_epsilon(1.0)),
        ("entropy_coeff", PpoConfig::new().with_entropy_coeff(-1.0)),
        ("critic_coeff", PpoConfig::new().with_critic_coeff(f64::NAN)),
        (
            "samples_mc_entropy",
            PpoConfig::new().with_samples_mc_entropy(0),
        ),
        ("clip_value", PpoConfig::new().with_clip_value(Some(0.0))),
        (
            "entropy_coeff",
            PpoConfig::new().with_entropy_coeff(f64::INFINITY),
        ),
    ];
    for (field, cfg) in bad {
        let (actor, _) = toy_actor();
        match ClipPPOLoss::new(actor, toy_critic()).with_config(cfg) {
            Err(Error::InvalidConfig { field: f, op, .. }) => {
                assert_eq!((f, op), (field, "ClipPPOLoss"))
            }
            other => panic!("{field}: expected InvalidConfig, got {other:?}"),
        }
    }
    // the builders report the same variant
    let (actor, _) = toy_actor();
    let err = ClipPPOLoss::new(actor, toy_critic())
        .with_clip_epsilon(-0.1)
        .expect_err("bad epsilon");
    assert!(matches!(
        err,
        Error::InvalidConfig {
            field: "clip_epsilon",
            ..
        }
    ));
    assert!(err.to_string().contains("(0, 1)"), "{err}");

    // the KL-penalty loss checks its own fields, not the clipped loss's
    let kl_bad: [(&str, PpoConfig); 4] = [
        ("increment", PpoConfig::new().with_increment(0.5)),
        ("decrement", PpoConfig::new().with_decrement(1.5)),
        ("beta", PpoConfig::new().with_beta(-1.0)),
        ("samples_mc_kl", PpoConfig::new().with_samples_mc_kl(0)),
    ];
    for (field, cfg) in kl_bad {
        let (actor, _) = toy_actor();
        match KLPENPPOLoss::without_critic(actor).with_config(cfg) {
            Err(Error::InvalidConfig { field: f, op, .. }) => {
                assert_eq!((f, op), (field, "KLPENPPOLoss"))
            }
            other => panic!("{field}: expected InvalidConfig, got {other:?}"),
        }
    }
    let (actor, _) = toy_actor();
    let mut loss = KLPENPPOLoss::new(actor, toy_critic())
        .with_config(PpoConfig::new().with_beta(0.5).with_clip_epsilon(7.0))
        .expect("clip_epsilon is not read by KLPEN");
    assert_eq!(loss.beta(), 0.5);
    // β is ordinary state: set through &mut self, reset to the configured initial value
    loss.set_beta(3.0);
    assert_eq!(loss.beta(), 3.0);
    loss.reset();
    assert_eq!(loss.beta(), 0.5);
}

#[test]
fn losses_are_trait_objects_and_the_generator_is_explicit() {
    use torchrl::objectives::{DynLossModule, PpoKeys, RewardModelLoss};
    use torchrl::Generator;
    // LossModule with its types named
    let (actor, _) = toy_actor();
    let typed: Box<dyn LossModule<Keys = PpoKeys, Output = PpoLossOutput>> =
        Box::new(ClipPPOLoss::new(actor, toy_critic()));
    let out = typed.forward(&toy_batch()).expect("forward");
    assert!((out.loss_objective.double_value(&[]) + 0.625).abs() < 1e-12);

    // every loss behind one type-erased trait
    let (a1, _) = toy_actor();
    let (a2, _) = toy_actor();
    let mut losses: Vec<Box<dyn DynLossModule>> = vec![
        Box::new(ClipPPOLoss::new(a1, toy_critic())),
        Box::new(KLPENPPOLoss::new(a2, toy_critic())),
        Box::new(RewardModelLoss::new()),
    ];
    let names: Vec<&str> = losses.iter().map(|l| l.loss_name()).collect();
    assert_eq!(names, ["ClipPPOLoss", "KLPENPPOLoss", "RewardModelLoss"]);
    let clip = losses[0].forward_dyn(&toy_batch()).expect("clip");
    let (actor, _) = toy_actor();
    let direct = ClipPPOLoss::new(actor, toy_critic())
        .forward(&toy_batch())
        .expect("direct")
        .total_loss()
        .expect("total");
    assert_eq!(
        clip.total_loss().expect("total").double_value(&[]),
        direct.double_value(&[])
    );
    let kl = losses[1].forward_dyn(&klpen_batch()).expect("klpen");
    assert!(kl.loss_terms().iter().any(|(n, _)| *n == "loss_objective"));
    losses[0]
        .set_keys_by_name(&[("advantage", Some("adv2".into()))])
        .expect("set_keys");
    assert!(losses[0].loss_in_keys().iter().all(|k| *k != "advantage"));
    assert!(losses[0].forward_dyn(&toy_batch()).is_err()); // "adv2" is missing

    // an explicit generator gives the draws of a loss seeded with the same seed
    let tanh_actor = || {
        let net = from_fn(["obs"], ["loc", "scale"], |x: &[&Tensor]| {
            Ok(vec![x[0].f_mul_scalar(0.5)?, x[0].f_ones_like()?])
        })
        .expect("net");
        ProbabilisticActor::new(
            net,
            DistributionBuilder::tanh_normal("loc", "scale", -1.0, 1.0).expect("builder"),
        )
    };
    let td = toy_batch()
        .with(
            "action",
            Tensor::from_slice(&[0.1f64, -0.2, 0.3, 0.0]).view([4, 1]),
        )
        .and_then(|t| {
            t.with(
                "loc",
                Tensor::from_slice(&[0.5f64, -0.5, 0.25, 1.0]).view([4, 1]),
            )
        })
        .and_then(|t| {
            t.with(
                "scale",
                Tensor::ones([4, 1], (Kind::Double, tch::Device::Cpu)),
            )
        })
        // a TanhNormal's log-prob sums over the action dim: [4], not toy_batch's [4, 1]
        .and_then(|t| {
            t.with(
                "action_log_prob",
                Tensor::zeros([4], (Kind::Double, tch::Device::Cpu)),
            )
        })
        .expect("td");
    let h = |o: &torchrl::objectives::KlPenPpoLossOutput| {
        o.entropy.as_ref().expect("entropy").double_value(&[])
    };
    // TanhNormal has no closed-form entropy: a Monte-Carlo estimate from the generator
    let seeded = KLPENPPOLoss::without_critic(tanh_actor()).with_seed(7);
    let c = seeded.forward(&td).expect("forward");
    let explicit = KLPENPPOLoss::without_critic(tanh_actor());
    let mut gen = Generator::new(7);
    let b = explicit
        .forward_with_generator(&td, &mut gen)
        .expect("forward");
    assert_eq!(h(&b), h(&c), "same seed, same Monte-Carlo entropy");
    // the loss's own generator (seed 0) did not move with the explicit one: its first draw
    // is the first draw of a fresh seed-0 generator
    let d = explicit.forward(&td).expect("forward");
    let e = explicit
        .forward_with_generator(&td, &mut Generator::new(0))
        .expect("forward");
    assert_eq!(h(&d), h(&e));
    assert_ne!(h(&d), h(&c));
}

#[test]
fn klpen_beta_survives_other_config_changes() {
    let (actor, _) = toy_actor();
    let loss = KLPENPPOLoss::new(actor, toy_critic());
    loss.forward(&klpen_batch()).expect("forward");
    let adapted = loss.beta();
    assert_ne!(adapted, 1.0);
    // a change that keeps the initial β keeps the adapted one
    let loss = loss.with_entropy_coeff(0.0).expect("coeff");
    assert_eq!(loss.beta(), adapted);
    // a new initial β sets it, even to the same value
    let loss = loss.with_beta(1.0).expect("beta");
    assert_eq!(loss.beta(), 1.0);
}

// ------------------------------------------------ advantage_norm and REINFORCE's delay_value

/// A recorded tensordict (`{"batch_size", "entries"}`, nested; bool / int64 dtypes kept).
fn td_json(v: &Value) -> R<TensorDict> {
    let batch: Vec<i64> = v["batch_size"]
        .as_array()
        .ok_or("batch_size")?
        .iter()
        .filter_map(Value::as_i64)
        .collect();
    let mut td = TensorDict::new(batch.as_slice()).map_err(|e| e.to_string())?;
    for (k, e) in v["entries"].as_object().ok_or("entries")? {
        if e.get("data").is_some() {
            let t = tensor(e)?;
            let t = match e["dtype"].as_str() {
                Some("bool") => t.to_kind(Kind::Bool),
                Some("int64") => t.to_kind(Kind::Int64),
                _ => t,
            };
            td.set(k.as_str(), t).map_err(|e| e.to_string())?;
        } else {
            td.set(k.as_str(), td_json(e)?).map_err(|e| e.to_string())?;
        }
    }
    Ok(td)
}

/// The recorded normaliser (float64 statistics).
fn value_norm(v: &Value) -> R<Box<dyn ValueNorm>> {
    let kw = &v["kwargs"];
    let e = |e: torchrl::Error| e.to_string();
    Ok(match v["class"].as_str() {
        Some("RunningValueNorm") => {
            Box::new(RunningValueNorm::new().with_kind(Kind::Double).map_err(e)?)
        }
        Some("PercentileValueNorm") => {
            let mut n = PercentileValueNorm::new()
                .with_kind(Kind::Double)
                .map_err(e)?;
            if let Some(r) = kw.get("rate").and_then(Value::as_f64) {
                n = n.with_rate(r).map_err(e)?;
            }
            if let Some(m) = kw.get("min_scale").and_then(Value::as_f64) {
                n = n.with_min_scale(m).map_err(e)?;
            }
            Box::new(n)
        }
        other => return Err(format!("unknown normaliser {other:?}")),
    })
}

/// Boxed normalisers pass through `with_advantage_norm` as themselves.
#[derive(Debug)]
struct Boxed(Box<dyn ValueNorm>);

impl ValueNorm for Boxed {
    fn name(&self) -> &'static str {
        self.0.name()
    }
    fn shape(&self) -> &[i64] {
        self.0.shape()
    }
    fn update(&mut self, v: &Tensor) -> torchrl::Result<()> {
        self.0.update(v)
    }
    fn normalize(&self, v: &Tensor) -> torchrl::Result<Tensor> {
        self.0.normalize(v)
    }
    fn denormalize(&self, v: &Tensor) -> torchrl::Result<Tensor> {
        self.0.denormalize(v)
    }
    fn scale(&self) -> torchrl::Result<Tensor> {
        self.0.scale()
    }
    fn state(&self) -> Vec<(&'static str, &Tensor)> {
        self.0.state()
    }
}

fn check_norm(norm: &dyn ValueNorm, state: &Value, scale: &Value, what: &str) -> R<()> {
    for (name, t) in norm.state() {
        close(t, &tensor(&state[name])?, 1e-10, &format!("{what}.{name}"))?;
    }
    close(
        &norm.scale().map_err(|e| e.to_string())?,
        &tensor(scale)?,
        1e-10,
        &format!("{what}.scale"),
    )
}

/// GAE as recorded: γ = 0.99, λ = 0.95, the flat `[6]` batch read as one trajectory.
fn gae_one_trajectory() -> Box<dyn ValueEstimator + Send> {
    Box::new(GAE::new(0.99, 0.95).unwrap().with_time_dim(0))
}

/// One A2C / ClipPPO loss with an `advantage_norm`, called twice: outputs and gradients, the
/// normaliser's statistics and scale after each call.
fn replay_advantage_norm(case: &Value) -> R<()> {
    let name = case["name"].as_str().ok_or("name")?;
    let (actor, critic, ws) = on_policy_networks(case)?;
    let mut norm = value_norm(&case["norm"])?;
    if !case["pre_update"].is_null() {
        norm.update(&tensor(&case["pre_update"])?)
            .map_err(|e| e.to_string())?;
    }
    let kw = &case["kwargs"];
    let e = |e: torchrl::Error| format!("{name}: {e}");
    // TorchRL masks its loss means with ("collector", "mask"); our losses do not, so that case
    // checks only what the mask does to the normaliser
    let masked = name.contains("collector_mask");
    let calls = case["calls"].as_array().ok_or("calls")?;
    match case["loss"].as_str() {
        Some("a2c") => {
            let mut loss = shared_kwargs!(A2CLoss::new(actor, critic), kw)
                .with_advantage_norm(Boxed(norm))
                .map_err(e)?;
            loss.make_value_estimator(gae_one_trajectory()).map_err(e)?;
            for (i, call) in calls.iter().enumerate() {
                let what = format!("{name}[call {i}]");
                let mut td = td_json(&call["td"])?;
                let a = td.get("action").ok_or("action")?.to_kind(Kind::Int64);
                td.set("action", a).map_err(e)?;
                let out = loss.forward(&td).map_err(e)?;
                if !masked {
                    check_outputs(&what, &out, &call["expect"], &ws)?;
                }
                let n = loss.advantage_norm().ok_or("norm")?;
                check_norm(n.as_ref(), &call["norm_state"], &call["scale"], &what)?;
            }
        }
        Some("ppo") => {
            let mut loss = shared_kwargs!(ClipPPOLoss::new(actor, critic), kw);
            if let Some(v) = kw.get("clip_epsilon").and_then(Value::as_f64) {
                loss = loss.with_clip_epsilon(v).map_err(e)?;
            }
            let mut loss = loss.with_advantage_norm(Boxed(norm)).map_err(e)?;
            loss.make_value_estimator(gae_one_trajectory()).map_err(e)?;
            for (i, call) in calls.iter().enumerate() {
                let what = format!("{name}[call {i}]");
                let td = td_json(&call["td"])?;
                let out = loss.forward(&td).map_err(e)?;
                check_outputs(&what, &out, &call["expect"], &ws)?;
                let n = loss.advantage_norm().ok_or("norm")?;
                check_norm(n.as_ref(), &call["norm_state"], &call["scale"], &what)?;
            }
        }
        other => return Err(format!("{name}: unknown loss {other:?}")),
    }
    Ok(())
}

#[test]
fn advantage_norm_reference_cases() {
    let cases = load("advantage_norm_cases.json");
    // TorchRL's eval mode (statistics frozen) has no counterpart here: the losses have no
    // train / eval switch, so the normaliser updates whenever the loss estimates the advantage
    let replayed: Vec<&Value> = cases
        .iter()
        .filter(|c| c["op"] == "loss" && c["training"] == true)
        .collect();
    assert_eq!(replayed.len(), 9);
    let failures: Vec<String> = replayed
        .iter()
        .filter_map(|c| replay_advantage_norm(c).err())
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // TorchRL refuses normalize_advantage with an advantage_norm; here forward does, by name
    let ppo = cases
        .iter()
        .find(|c| c["name"] == "ppo_running_estimated")
        .unwrap();
    for case in cases.iter().filter(|c| c["op"] == "ctor_error") {
        let (actor, critic, _) = on_policy_networks(ppo).unwrap();
        let mut loss = ClipPPOLoss::new(actor, critic)
            .with_normalize_advantage(true)
            .with_advantage_norm(Boxed(value_norm(&case["norm"]).unwrap()))
            .unwrap();
        loss.make_value_estimator(gae_one_trajectory()).unwrap();
        let td = td_json(&ppo["calls"][0]["td"]).unwrap();
        let err = loss.forward(&td).unwrap_err().to_string();
        assert!(
            err.contains("normalize_advantage") && err.contains("mutually exclusive"),
            "{err}"
        );
    }
    // REINFORCE takes none (TorchRL's ReinforceLoss has no advantage_norm)
    let (actor, critic, _) = on_policy_networks(ppo).unwrap();
    let err = ReinforceLoss::new(actor, critic)
        .with_advantage_norm(RunningValueNorm::new())
        .unwrap_err()
        .to_string();
    assert!(err.contains("advantage_norm"), "{err}");
}

/// REINFORCE with and without `delay_value`: the estimator's advantage, value target and
/// values, the two losses and their gradients, and the target after one soft update.
fn replay_reinforce_delay(case: &Value) -> R<()> {
    let name = case["name"].as_str().ok_or("name")?;
    let e = |e: torchrl::Error| format!("{name}: {e}");
    let (actor, critic, ws) = on_policy_networks(case)?;
    let kw = &case["kwargs"];
    let delay = kw.get("delay_value").and_then(Value::as_bool) == Some(true);
    let mut loss = shared_kwargs!(ReinforceLoss::new(actor, critic), kw);
    let mut target_leaves = Vec::new();
    let mut updater = None;
    if delay {
        let tw = &case["target_weights"];
        let names = ["critic_w1", "critic_b1", "critic_w2", "critic_b2"];
        let leaves: Vec<Tensor> = names.iter().map(|n| tensor(&tw[*n])).collect::<R<_>>()?;
        let [c1, cb1, c2, cb2] = [0, 1, 2, 3].map(|i| leaves[i].shallow_clone());
        let target = from_fn(["observation"], ["state_value"], move |x: &[&Tensor]| {
            Ok(vec![mlp(x[0], &c1, &cb1, &c2, &cb2)])
        })
        .map_err(e)?;
        let pairs = names
            .iter()
            .zip(&leaves)
            .map(|(n, t)| {
                let online = ws[WEIGHTS.iter().position(|w| w == n).unwrap()].shallow_clone();
                (n.to_string(), online, t.shallow_clone())
            })
            .collect();
        let params = TargetParams::new(pairs).map_err(e)?;
        loss = loss.with_target_critic(target, params).map_err(e)?;
        // the updater is made first (its init copies the online values in, as TorchRL's
        // `init_`); the case then gives the target values of its own
        if let Some(su) = case.get("soft_update") {
            let tau = su["tau"].as_f64().ok_or("tau")?;
            updater = Some(SoftUpdate::new(&loss, None, Some(tau)).map_err(e)?);
        }
        tch::no_grad(|| {
            for (leaf, n) in leaves.iter().zip(names) {
                leaf.shallow_clone().copy_(&tensor(&tw[n]).unwrap());
            }
        });
        target_leaves = leaves;
    }
    let estimator: Box<dyn ValueEstimator + Send> = match case["estimator"]["type"].as_str() {
        Some("TD0") => Box::new(
            TD0Estimator::new(case["estimator"]["gamma"].as_f64().ok_or("gamma")?)
                .map_err(e)?
                .with_time_dim(0),
        ),
        _ => gae_one_trajectory(),
    };
    loss.make_value_estimator(estimator).map_err(e)?;
    let mut td = td_json(&case["td"])?;
    if case["dist"].as_str() == Some("categorical") {
        let a = td.get("action").ok_or("action")?.to_kind(Kind::Int64);
        td.set("action", a).map_err(e)?;
    }
    let exp = &case["expect"];
    // what the estimator computes, through the loss's own entry point
    let mut est = td.clone();
    loss.compute_advantage(&mut est).map_err(e)?;
    for (key, rec) in [
        (NestedKey::from("state_value"), "state_value"),
        (NestedKey::from(["next", "state_value"]), "next_state_value"),
        (NestedKey::from("advantage"), "advantage"),
        (NestedKey::from("value_target"), "value_target"),
    ] {
        let t = est.get(&key).ok_or_else(|| format!("{name}: no {key}"))?;
        close(t, &tensor(&exp[rec])?, VALUE_TOL, &format!("{name}.{rec}"))?;
    }
    let out = loss.forward(&td).map_err(e)?;
    close(
        &out.loss_actor,
        &tensor(&exp["loss_actor"])?,
        VALUE_TOL,
        &format!("{name}.loss_actor"),
    )?;
    let value = out.loss_value.as_ref().ok_or("loss_value")?;
    close(
        value,
        &tensor(&exp["loss_value"])?,
        VALUE_TOL,
        &format!("{name}.loss_value"),
    )?;
    let total = out.loss_actor.sum(Kind::Double) + value.sum(Kind::Double);
    let grads = Tensor::run_backward(&[total], &ws, false, false);
    for (i, n) in WEIGHTS.iter().enumerate() {
        close(
            &grads[i],
            &tensor(&exp["grads"][*n])?,
            GRAD_TOL,
            &format!("{name}.grad.{n}"),
        )?;
    }
    if let Some(su) = case.get("soft_update") {
        let updater = updater
            .as_mut()
            .ok_or("a soft_update case without delay_value")?;
        updater.step().map_err(e)?;
        for (leaf, n) in
            target_leaves
                .iter()
                .zip(["critic_w1", "critic_b1", "critic_w2", "critic_b2"])
        {
            close(
                leaf,
                &tensor(&su["target_after"][n])?,
                1e-12,
                &format!("{name}.target.{n}"),
            )?;
        }
    }
    Ok(())
}

#[test]
fn reinforce_delay_value_reference_cases() {
    let cases = load("reinforce_delay_cases.json");
    let losses: Vec<&Value> = cases.iter().filter(|c| c["op"] == "loss").collect();
    assert_eq!(losses.len(), 5);
    let failures: Vec<String> = losses
        .iter()
        .filter_map(|c| replay_reinforce_delay(c).err())
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // as TorchRL's updater, an updater over a loss without a target critic is refused
    let (actor, critic, _) = on_policy_networks(losses[0]).unwrap();
    let loss = ReinforceLoss::new(actor, critic);
    let err = SoftUpdate::new(&loss, None, Some(0.1))
        .unwrap_err()
        .to_string();
    assert!(err.contains("target"), "{err}");
}
