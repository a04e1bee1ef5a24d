//! `ClipPPOLoss` (`torchrl::objectives::ppo`).
//!
//! 1. Replays `specs/ppo_cases.json` (recorded by `specs/record_ppo.py` with TorchRL 0.14.1's
//!    `ClipPPOLoss`; Python is never run): a fixed-weight MLP actor (Normal, per-dim log-prob,
//!    or TanhNormal) and critic, a fixed batch, every loss output and the gradients of the
//!    summed `loss_*` terms w.r.t. the eight weight tensors. Values within 1e-5, gradients
//!    within 1e-4; shapes exact.
//! 2. Hand-derived edge cases: ratio exactly 1, `set_keys` remaps end to end, missing keys,
//!    the outer-product guard, the estimator path and key forwarding.

use serde_json::Value;
use tch::{Kind, Tensor};
use torchrl::modules::{
    from_fn, DistributionBuilder, NormalParamExtractor, ProbabilisticActor, TensorDictModule,
    TensorDictSequential,
};
use torchrl::objectives::value::{Gae, ValueEstimator};
use torchrl::objectives::{
    ClipPPOLoss, CriticLossType, LossModule, LossOutput, PpoLossOutput, Reduction,
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
        .map(|x| x.as_f64().unwrap_or(f64::NAN))
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

fn replay(case: &Value) -> R<()> {
    let name = case["name"].as_str().ok_or("name")?;
    let w = &case["weights"];
    let ws: Vec<Tensor> = WEIGHTS.iter().map(|n| fetch(w, n)).collect::<R<_>>()?;
    let (a1, ab1, a2, ab2) = (
        ws[0].shallow_clone(),
        ws[1].shallow_clone(),
        ws[2].shallow_clone(),
        ws[3].shallow_clone(),
    );
    let (c1, cb1, c2, cb2) = (
        ws[4].shallow_clone(),
        ws[5].shallow_clone(),
        ws[6].shallow_clone(),
        ws[7].shallow_clone(),
    );
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

    let kw = &case["kwargs"];
    let mut loss = ClipPPOLoss::new(actor, critic);
    let e = |e: torchrl::Error| e.to_string();
    if let Some(v) = kw.get("clip_epsilon").and_then(Value::as_f64) {
        loss = loss.with_clip_epsilon(v).map_err(e)?;
    }
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

    let t = &case["td"];
    let mut td = TensorDict::new([6]).map_err(e)?;
    for k in [
        "observation",
        "action",
        "action_log_prob",
        "advantage",
        "value_target",
        "state_value",
    ] {
        td.set(k, tensor(&t[k])?).map_err(e)?;
    }
    let out = loss.forward(&td).map_err(e)?;
    let exp = &case["expect"];
    let mut produced: Vec<(&str, &Tensor)> = out.loss_terms();
    produced.extend(out.metrics());
    let expected_names: Vec<&String> = exp
        .as_object()
        .ok_or("expect")?
        .keys()
        .filter(|k| *k != "grads")
        .collect();
    for (k, v) in &produced {
        let ev = exp
            .get(*k)
            .ok_or_else(|| format!("{name}: produced {k}, not recorded"))?;
        close(v, &tensor(ev)?, VALUE_TOL, &format!("{name}.{k}"))?;
    }
    for k in expected_names {
        if !produced.iter().any(|(p, _)| p == k) {
            return Err(format!("{name}: recorded {k}, not produced"));
        }
    }
    // metrics are detached
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
    let grads = Tensor::run_backward(&[total], &ws, false, false);
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

#[test]
fn reference_cases() {
    let text =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/specs/ppo_cases.json"))
            .expect("specs/ppo_cases.json");
    let doc: Value = serde_json::from_str(&text).expect("json");
    let cases = doc["cases"].as_array().expect("cases");
    assert!(cases.len() >= 10);
    let failures: Vec<String> = cases.iter().filter_map(|c| replay(c).err()).collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
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
    loss.make_value_estimator(Box::new(Gae::new(0.9, 0.8).expect("gae")))
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
    loss.make_value_estimator(Box::new(Gae::new(0.9, 0.8).expect("gae")))
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
    let _ = ValueEstimator::name(&Gae::new(0.9, 0.9).expect("gae"));
}
