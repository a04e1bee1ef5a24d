//! Objectives (`torchrl::objectives`): the reward-model loss, GAE, TD(λ) and the keys machinery.
//!
//! 1. Replays `specs/objective_cases.json` (recorded by `specs/record_objectives.py`; Python is
//!    never run): the Bradley-Terry function and loss module (every reduction, centring off /
//!    `0` / positive, `[B]` and `[B, 1]` scores, score networks and the rule that picks their
//!    score key, renamed and nested keys, errors), `set_keys` sequences of a loss and of an
//!    estimator, the functional GAE / TD(λ) and the `GAE` / `TDLambdaEstimator` modules
//!    (terminations, truncations, missing `terminated`, `average_gae` / `average_rewards`,
//!    value networks, renamed keys, `steps_to_next_obs`). Values within 1e-5, gradients within
//!    1e-4 (absolute below 1, relative above); dtypes and shapes exact; errors must carry the
//!    recorded facts.
//! 2. Hand-derived checks: published reference numbers, closed-form gradients, the scan
//!    against a sequential loop on a real CartPole rollout, key forwarding from a loss to its
//!    estimator, error paths and atomicity.

use serde_json::Value;
use tch::{Device, Kind, Tensor};
use torchrl::envs::builtin::CartPoleEnv;
use torchrl::envs::transforms::StepCounter;
use torchrl::envs::{EnvBase, RolloutConfig, TransformedEnv};
use torchrl::objectives::value::functional::{
    generalized_advantage_estimate, td_lambda_advantage_estimate, td_lambda_return_estimate,
};
use torchrl::objectives::value::{
    TDLambdaEstimator, ValueEstimator, ValueEstimatorKeys, ValueNetwork, GAE,
};
use torchrl::objectives::{
    forward_value_estimator_keys, reward_model_loss, set_estimator_keys, set_loss_keys,
    AcceptedKeys, LossModule, LossOutput, Reduction, RewardModelKeys, RewardModelLoss, ScoreFn,
    VALUE_ESTIMATOR_KEYS,
};
use torchrl::{Error, NestedKey, TensorDict};

const VALUE_TOL: f64 = 1e-5;
const GRAD_TOL: f64 = 1e-4;

type R<T> = std::result::Result<T, String>;

// ================================================================================ decoding

fn load_cases() -> Vec<Value> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/specs/objective_cases.json");
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {path}: {e}"));
    let root: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"));
    root["cases"]
        .as_array()
        .unwrap_or_else(|| panic!("{path} has no cases"))
        .clone()
}

fn cases_of(op: &str) -> Vec<Value> {
    load_cases().into_iter().filter(|c| c["op"] == op).collect()
}

fn number(v: &Value) -> R<f64> {
    match v {
        Value::Number(n) => n.as_f64().ok_or_else(|| format!("bad number {n}")),
        Value::String(s) if s == "inf" => Ok(f64::INFINITY),
        Value::String(s) if s == "-inf" => Ok(f64::NEG_INFINITY),
        Value::String(s) if s == "nan" => Ok(f64::NAN),
        Value::Bool(b) => Ok(f64::from(u8::from(*b))),
        other => Err(format!("bad tensor element {other}")),
    }
}

fn shape_of(v: &Value) -> R<Vec<i64>> {
    v.as_array()
        .and_then(|a| a.iter().map(Value::as_i64).collect::<Option<Vec<_>>>())
        .ok_or_else(|| format!("bad shape {v}"))
}

fn tensor(v: &Value) -> R<Tensor> {
    let shape = shape_of(&v["shape"])?;
    let data = v["data"].as_array().ok_or("data is not a list")?;
    let t = match v["dtype"].as_str().ok_or("dtype is not a string")? {
        "float32" => {
            let d: Vec<f32> = data
                .iter()
                .map(|x| number(x).map(|f| f as f32))
                .collect::<R<_>>()?;
            Tensor::from_slice(&d)
        }
        "float64" => Tensor::from_slice(&data.iter().map(number).collect::<R<Vec<f64>>>()?),
        "int64" => Tensor::from_slice(
            &data
                .iter()
                .map(|x| x.as_i64().ok_or_else(|| format!("bad int {x}")))
                .collect::<R<Vec<i64>>>()?,
        ),
        "bool" => Tensor::from_slice(
            &data
                .iter()
                .map(|x| x.as_bool().ok_or_else(|| format!("bad bool {x}")))
                .collect::<R<Vec<bool>>>()?,
        ),
        other => return Err(format!("unknown dtype {other}")),
    };
    Ok(t.reshape(shape))
}

fn key(v: &Value) -> R<NestedKey> {
    let parts = v
        .as_array()
        .and_then(|a| a.iter().map(Value::as_str).collect::<Option<Vec<_>>>())
        .ok_or_else(|| format!("bad key {v}"))?;
    Ok(NestedKey::from(parts))
}

fn opt_key(v: &Value) -> R<Option<NestedKey>> {
    if v.is_null() {
        Ok(None)
    } else {
        key(v).map(Some)
    }
}

fn td(v: &Value) -> R<TensorDict> {
    let mut out = TensorDict::new(shape_of(&v["batch_size"])?).map_err(|e| e.to_string())?;
    let entries = v["entries"].as_object().ok_or("entries is not an object")?;
    for (k, e) in entries {
        if e.get("entries").is_some() {
            out.set(k.as_str(), td(e)?).map_err(|e| e.to_string())?;
        } else {
            out.set(k.as_str(), tensor(e)?).map_err(|e| e.to_string())?;
        }
    }
    Ok(out)
}

/// Every leaf of an encoded tensordict, as `(key, encoded tensor)`.
fn td_leaves(v: &Value, prefix: &[String], out: &mut Vec<(NestedKey, Value)>) -> R<()> {
    let entries = v["entries"].as_object().ok_or("entries is not an object")?;
    for (k, e) in entries {
        let mut path = prefix.to_vec();
        path.push(k.clone());
        if e.get("entries").is_some() {
            td_leaves(e, &path, out)?;
        } else {
            out.push((NestedKey::from(path), e.clone()));
        }
    }
    Ok(())
}

fn pairs(v: &Value) -> R<Pairs> {
    v.as_array()
        .ok_or("pairs is not a list")?
        .iter()
        .map(|p| {
            let name = p[0]
                .as_str()
                .ok_or("pair name is not a string")?
                .to_string();
            Ok((name, opt_key(&p[1])?))
        })
        .collect()
}

fn as_refs(p: &[(String, Option<NestedKey>)]) -> Vec<(&str, Option<NestedKey>)> {
    p.iter().map(|(n, k)| (n.as_str(), k.clone())).collect()
}

// ============================================================================= comparison

fn kind_name(k: Kind) -> &'static str {
    match k {
        Kind::Float => "float32",
        Kind::Double => "float64",
        Kind::Int64 => "int64",
        Kind::Bool => "bool",
        _ => "other",
    }
}

fn values_of(t: &Tensor) -> R<Vec<f64>> {
    let flat = t.detach().to_kind(Kind::Double).reshape([-1]).contiguous();
    Vec::<f64>::try_from(&flat).map_err(|e| e.to_string())
}

/// Same dtype, same shape, and every element within `tol` (absolute below 1, relative above).
fn check(actual: &Tensor, expected: &Value, tol: f64, what: &str) -> R<()> {
    let exp = tensor(expected)?;
    let dtype = expected["dtype"].as_str().unwrap_or("?");
    if kind_name(actual.kind()) != dtype {
        return Err(format!(
            "{what}: dtype {:?}, expected {dtype}",
            actual.kind()
        ));
    }
    if actual.size() != exp.size() {
        return Err(format!(
            "{what}: shape {:?}, expected {:?}",
            actual.size(),
            exp.size()
        ));
    }
    let (a, e) = (values_of(actual)?, values_of(&exp)?);
    for (i, (x, y)) in a.iter().zip(&e).enumerate() {
        let ok = if y.is_nan() {
            x.is_nan()
        } else {
            (x - y).abs() <= tol * y.abs().max(1.0)
        };
        if !ok {
            return Err(format!(
                "{what}[{i}]: {x} vs expected {y} (all: {a:?} vs {e:?})"
            ));
        }
    }
    Ok(())
}

fn grad_of(t: &Tensor) -> Tensor {
    let g = t.grad();
    if g.defined() {
        g
    } else {
        t.zeros_like()
    }
}

/// The result must be an error whose message contains every recorded fact.
fn check_error<T>(r: torchrl::Result<T>, expected: &Value) -> R<()> {
    let err = &expected["error"];
    match r {
        Ok(_) => Err(format!(
            "expected an error ({}), got success",
            err["message"]
        )),
        Err(e) => {
            let msg = e.to_string();
            for f in err["facts"].as_array().ok_or("facts is not a list")? {
                let f = f.as_str().ok_or("fact is not a string")?;
                if !msg.contains(f) {
                    return Err(format!(
                        "error {msg:?} lacks {f:?} (Python: {})",
                        err["message"]
                    ));
                }
            }
            Ok(())
        }
    }
}

fn run_all(op: &str, expected_count: usize, f: impl Fn(&Value) -> R<()>) {
    let cases = cases_of(op);
    assert_eq!(cases.len(), expected_count, "number of {op} cases");
    let failures: Vec<String> = cases
        .iter()
        .filter_map(|c| f(c).err().map(|e| format!("{}: {e}", c["name"])))
        .collect();
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

fn s(e: Error) -> String {
    e.to_string()
}

// ========================================================================== replay: reward

#[test]
fn replay_reward_model_loss_function() {
    run_all("reward_model_loss_fn", 9, |c| {
        let a = &c["args"];
        let chosen = tensor(&a["chosen"])?.set_requires_grad(true);
        let rejected = tensor(&a["rejected"])?.set_requires_grad(true);
        let reduction: Reduction = a["reduction"]
            .as_str()
            .ok_or("reduction")?
            .parse()
            .map_err(s)?;
        let out = reward_model_loss(&chosen, &rejected, reduction);
        let exp = &c["expect"];
        if exp.get("error").is_some() {
            return check_error(out, exp);
        }
        let out = out.map_err(s)?;
        check(&out, &exp["out"], VALUE_TOL, "out")?;
        out.sum(None).backward();
        check(
            &grad_of(&chosen),
            &exp["grads"]["chosen"],
            GRAD_TOL,
            "grad chosen",
        )?;
        check(
            &grad_of(&rejected),
            &exp["grads"]["rejected"],
            GRAD_TOL,
            "grad rejected",
        )
    });
}

fn build_reward_loss(a: &Value) -> R<(RewardModelLoss, Vec<(String, Tensor)>)> {
    let reduction: Reduction = a["reduction"]
        .as_str()
        .ok_or("reduction")?
        .parse()
        .map_err(s)?;
    let mut loss = RewardModelLoss::new().with_reduction(reduction);
    if let Some(cc) = a["center_coeff"].as_f64() {
        loss = loss.with_center_coeff(cc).map_err(s)?;
    }
    let mut params = Vec::new();
    if !a["score_network"].is_null() {
        let net = &a["score_network"];
        let in_key = key(&net["in_key"])?;
        let mut outs: Vec<(NestedKey, Tensor)> = Vec::new();
        for o in net["out"].as_array().ok_or("out")? {
            let k = key(&o[0])?;
            let w = tensor(&o[1])?.set_requires_grad(true);
            let name = format!("weight:{}", k.parts().collect::<Vec<_>>().join("/"));
            params.push((name, w.shallow_clone()));
            outs.push((k, w));
        }
        let out_keys: Vec<NestedKey> = outs.iter().map(|(k, _)| k.clone()).collect();
        loss = loss.with_score_network(ScoreFn::new(out_keys, move |td: &mut TensorDict| {
            let x = td.get_or_err(&in_key)?.shallow_clone();
            for (k, w) in &outs {
                td.set(k, x.f_matmul(w)?)?;
            }
            Ok(())
        }));
    }
    for (name, k) in pairs(&a["set_keys"])? {
        loss.set_keys(&[(name.as_str(), k)]).map_err(s)?;
    }
    Ok((loss, params))
}

#[test]
fn replay_reward_model_loss_module() {
    run_all("reward_model_loss", 29, |c| {
        let a = &c["args"];
        let mut input = td(&a["td"])?;
        let mut params = Vec::new();
        for k in a["grad_leaves"].as_array().ok_or("grad_leaves")? {
            let k = key(k)?;
            let t = input
                .get_or_err(&k)
                .map_err(s)?
                .detach()
                .set_requires_grad(true);
            input.set(&k, t.shallow_clone()).map_err(s)?;
            params.push((k.parts().collect::<Vec<_>>().join("/"), t));
        }
        let (loss, net_params) = build_reward_loss(a)?;
        params.extend(net_params);
        let out = loss.forward(&input);
        let exp = &c["expect"];
        if exp.get("error").is_some() {
            return check_error(out, exp);
        }
        let out = out.map_err(s)?;
        check(
            &out.loss_reward_model,
            &exp["loss_reward_model"],
            VALUE_TOL,
            "loss_reward_model",
        )?;
        match (&out.loss_center, exp["loss_center"].is_null()) {
            (None, true) => {}
            (Some(t), false) => check(t, &exp["loss_center"], VALUE_TOL, "loss_center")?,
            (got, _) => return Err(format!("loss_center presence differs: {got:?}")),
        }
        check(&out.accuracy, &exp["accuracy"], VALUE_TOL, "accuracy")?;
        if out.accuracy.requires_grad() {
            return Err("accuracy must be detached".into());
        }
        let in_keys: Vec<NestedKey> = exp["in_keys"]
            .as_array()
            .ok_or("in_keys")?
            .iter()
            .map(key)
            .collect::<R<_>>()?;
        if loss.in_keys() != in_keys.as_slice() {
            return Err(format!(
                "in_keys {:?}, expected {in_keys:?}",
                loss.in_keys()
            ));
        }
        let grads = exp["grads"].as_object().ok_or("grads")?;
        if grads.len() != params.len() {
            return Err(format!(
                "{} grads recorded, {} params",
                grads.len(),
                params.len()
            ));
        }
        out.total_loss().map_err(s)?.sum(None).backward();
        for (name, p) in &params {
            let g = grads
                .get(name)
                .ok_or_else(|| format!("no grad recorded for {name}"))?;
            check(&grad_of(p), g, GRAD_TOL, &format!("grad {name}"))?;
        }
        Ok(())
    });
}

#[test]
fn replay_reward_model_constructor_errors() {
    run_all("reward_model_ctor", 2, |c| {
        let a = &c["args"];
        let r = a["reduction"]
            .as_str()
            .ok_or("reduction")?
            .parse::<Reduction>()
            .and_then(|red| {
                let loss = RewardModelLoss::new().with_reduction(red);
                match a["center_coeff"].as_f64() {
                    Some(cc) => loss.with_center_coeff(cc),
                    None => Ok(loss),
                }
            });
        check_error(r, &c["expect"])
    });
}

fn keys_state(loss: &RewardModelLoss, expected: &Value) -> R<()> {
    for (name, k) in loss.tensor_keys().entries() {
        let want = key(&expected["tensor_keys"][name])?;
        if *k != want {
            return Err(format!("key {name} = {k}, expected {want}"));
        }
    }
    let in_keys: Vec<NestedKey> = expected["in_keys"]
        .as_array()
        .ok_or("in_keys")?
        .iter()
        .map(key)
        .collect::<R<_>>()?;
    if loss.in_keys() != in_keys.as_slice() {
        return Err(format!(
            "in_keys {:?}, expected {in_keys:?}",
            loss.in_keys()
        ));
    }
    Ok(())
}

#[test]
fn replay_loss_set_keys() {
    run_all("loss_set_keys", 1, |c| {
        let mut loss = RewardModelLoss::new();
        let calls = c["args"]["calls"].as_array().ok_or("calls")?;
        let steps = c["expect"]["steps"].as_array().ok_or("steps")?;
        for (i, (call, step)) in calls.iter().zip(steps).enumerate() {
            let before = loss.tensor_keys().clone();
            let p = pairs(call)?;
            let r = loss.set_keys(&as_refs(&p));
            if step.get("error").is_some() {
                check_error(r, step).map_err(|e| format!("step {i}: {e}"))?;
                // validated before anything changes
                if *loss.tensor_keys() != before {
                    return Err(format!("step {i}: a failed set_keys changed the keys"));
                }
            } else {
                r.map_err(s)?;
                keys_state(&loss, step).map_err(|e| format!("step {i}: {e}"))?;
            }
        }
        Ok(())
    });
}

// =========================================================================== replay: value

fn opt_tensor(v: &Value) -> R<Option<Tensor>> {
    if v.is_null() {
        Ok(None)
    } else {
        tensor(v).map(Some)
    }
}

#[test]
fn replay_gae_functional() {
    run_all("gae_fn", 11, |c| {
        let a = &c["args"];
        let term = opt_tensor(&a["terminated"])?;
        let (adv, target) = generalized_advantage_estimate(
            a["gamma"].as_f64().ok_or("gamma")?,
            a["lmbda"].as_f64().ok_or("lmbda")?,
            &tensor(&a["state_value"])?,
            &tensor(&a["next_state_value"])?,
            &tensor(&a["reward"])?,
            &tensor(&a["done"])?,
            term.as_ref(),
            a["time_dim"].as_i64().ok_or("time_dim")?,
        )
        .map_err(s)?;
        check(&adv, &c["expect"]["advantage"], VALUE_TOL, "advantage")?;
        check(
            &target,
            &c["expect"]["value_target"],
            VALUE_TOL,
            "value_target",
        )
    });
}

#[test]
fn replay_td_lambda_functional() {
    run_all("td_lambda_fn", 7, |c| {
        let a = &c["args"];
        let term = opt_tensor(&a["terminated"])?;
        let (gamma, lmbda) = (
            a["gamma"].as_f64().ok_or("gamma")?,
            a["lmbda"].as_f64().ok_or("lmbda")?,
        );
        let (v, nv, r, d) = (
            tensor(&a["state_value"])?,
            tensor(&a["next_state_value"])?,
            tensor(&a["reward"])?,
            tensor(&a["done"])?,
        );
        let time_dim = a["time_dim"].as_i64().ok_or("time_dim")?;
        let ret = td_lambda_return_estimate(gamma, lmbda, &nv, &r, &d, term.as_ref(), time_dim)
            .map_err(s)?;
        check(&ret, &c["expect"]["returns"], VALUE_TOL, "returns")?;
        let adv =
            td_lambda_advantage_estimate(gamma, lmbda, &v, &nv, &r, &d, term.as_ref(), time_dim)
                .map_err(s)?;
        check(&adv, &c["expect"]["advantage"], VALUE_TOL, "advantage")
    });
}

fn linear_value_network(net: &Value) -> R<ValueNetwork> {
    let in_key = key(&net["in_key"])?;
    let w = tensor(&net["weight"])?.view([-1, 1]);
    let b = net["bias"].as_f64().ok_or("bias")?;
    let k = in_key.clone();
    Ok(ValueNetwork::new([in_key], move |td: &TensorDict| {
        Ok(td.get_or_err(&k)?.f_matmul(&w)?.f_add_scalar(b)?)
    }))
}

fn replay_estimator(c: &Value, est: &dyn ValueEstimator) -> R<()> {
    let mut input = td(&c["args"]["td"])?;
    let before: Vec<NestedKey> = input.keys(torchrl::tensordict::KeysOptions::nested_leaves());
    est.forward(&mut input).map_err(s)?;
    let mut expected = Vec::new();
    td_leaves(&c["expect"]["td"], &[], &mut expected)?;
    let mut written: Vec<NestedKey> = input
        .keys(torchrl::tensordict::KeysOptions::nested_leaves())
        .into_iter()
        .filter(|k| !before.contains(k))
        .collect();
    for (k, v) in &expected {
        let t = input.get(k).ok_or_else(|| format!("{k} was not written"))?;
        check(t, v, VALUE_TOL, &k.to_string())?;
        written.retain(|w| w != k);
    }
    if !written.is_empty() {
        return Err(format!("unexpected entries written: {written:?}"));
    }
    Ok(())
}

type Pairs = Vec<(String, Option<NestedKey>)>;

fn estimator_config(a: &Value) -> R<(f64, f64, bool, Pairs)> {
    Ok((
        a["gamma"].as_f64().ok_or("gamma")?,
        a["lmbda"].as_f64().ok_or("lmbda")?,
        a["average"].as_bool().ok_or("average")?,
        pairs(&a["set_keys"])?,
    ))
}

#[test]
fn replay_gae_module() {
    run_all("gae_module", 7, |c| {
        let a = &c["args"];
        let (gamma, lmbda, average, keys) = estimator_config(a)?;
        let mut gae = GAE::new(gamma, lmbda).map_err(s)?.with_average_gae(average);
        if !a["value_network"].is_null() {
            gae = gae.with_value_network(linear_value_network(&a["value_network"])?);
        }
        gae.set_keys(&as_refs(&keys)).map_err(s)?;
        replay_estimator(c, &gae)
    });
}

#[test]
fn replay_td_lambda_module() {
    run_all("td_lambda_module", 7, |c| {
        let a = &c["args"];
        let (gamma, lmbda, average, keys) = estimator_config(a)?;
        let mut est = TDLambdaEstimator::new(gamma, lmbda)
            .map_err(s)?
            .with_average_rewards(average);
        if !a["value_network"].is_null() {
            est = est.with_value_network(linear_value_network(&a["value_network"])?);
        }
        est.set_keys(&as_refs(&keys)).map_err(s)?;
        replay_estimator(c, &est)
    });
}

#[test]
fn replay_estimator_set_keys_errors() {
    run_all("estimator_set_keys", 2, |c| {
        let mut gae = GAE::new(0.9, 0.9).map_err(s)?;
        let p = pairs(&c["args"]["pairs"])?;
        let r = gae.set_keys(&as_refs(&p));
        check_error(r, &c["expect"])?;
        if *gae.tensor_keys() != ValueEstimatorKeys::default() {
            return Err("a failed set_keys changed the keys".into());
        }
        Ok(())
    });
}

// ================================================================ hand-derived: reward model

fn f64s(t: &Tensor) -> Vec<f64> {
    values_of(t).unwrap_or_else(|e| panic!("{e}"))
}

fn scores(chosen: &[f64], rejected: &[f64]) -> TensorDict {
    let n = i64::try_from(chosen.len()).unwrap_or(0);
    TensorDict::new([n])
        .and_then(|t| t.with(("chosen", "score"), Tensor::from_slice(chosen)))
        .and_then(|t| t.with(("rejected", "score"), Tensor::from_slice(rejected)))
        .unwrap_or_else(|e| panic!("{e}"))
}

/// rlhf.md §5.6: chosen [1, 0.5, -0.3], rejected [0, 1, -0.3].
/// Per pair `-ln σ(c - r)` = [-ln σ(1), -ln σ(-0.5), ln 2] = [0.3132616875, 0.9740769842,
/// 0.6931471806]; mean 0.6601619508, sum 1.9804858523; accuracy 1/3 (the tie counts as wrong);
/// TorchRL centring 0.01 · mean(c² + r²) = 0.01 · (1 + 1.25 + 0.18)/3 = 0.0081.
#[test]
fn bradley_terry_reference_numbers() -> torchrl::Result<()> {
    let c = [1.0, 0.5, -0.3];
    let r = [0.0, 1.0, -0.3];
    let per = reward_model_loss(
        &Tensor::from_slice(&c),
        &Tensor::from_slice(&r),
        Reduction::None,
    )?;
    for (got, want) in f64s(&per)
        .iter()
        .zip([0.3132616875, 0.9740769842, std::f64::consts::LN_2])
    {
        assert!((got - want).abs() < 1e-9, "{got} vs {want}");
    }
    let sum = RewardModelLoss::new()
        .with_reduction(Reduction::Sum)
        .forward(&scores(&c, &r))?;
    assert!((sum.loss_reward_model.double_value(&[]) - 1.9804858523).abs() < 1e-9);
    let out = RewardModelLoss::new()
        .with_center_coeff(0.01)?
        .forward(&scores(&c, &r))?;
    assert!((out.loss_reward_model.double_value(&[]) - 0.6601619508).abs() < 1e-9);
    let center = out.loss_center.as_ref().map(|t| t.double_value(&[]));
    assert!((center.unwrap_or(f64::NAN) - 0.0081).abs() < 1e-12);
    assert_eq!(out.accuracy.kind(), Kind::Float);
    assert!((out.accuracy.double_value(&[]) - 1.0 / 3.0).abs() < 1e-7);
    // total = loss + centring
    let total = out.total_loss()?.double_value(&[]);
    assert!((total - (0.6601619508 + 0.0081)).abs() < 1e-9);
    let logged = out.to_tensordict()?;
    assert_eq!(logged.batch_size(), &[] as &[i64]);
    assert!(logged.contains("loss_center") && logged.contains("accuracy"));
    Ok(())
}

/// d/dc [-ln σ(c - r)] = -(1 - σ(c - r)) = -σ(r - c), and d/dr = σ(r - c); with the mean over
/// B pairs, each divided by B. The centring term adds `coeff · 2c / B` and `coeff · 2r / B`.
#[test]
fn bradley_terry_gradients_in_closed_form() -> torchrl::Result<()> {
    let c = [0.3f64, -1.2, 2.0, 0.0];
    let r = [0.1f64, 0.4, -0.5, 0.0];
    let coeff = 0.25;
    let ct = Tensor::from_slice(&c).set_requires_grad(true);
    let rt = Tensor::from_slice(&r).set_requires_grad(true);
    let td = TensorDict::new([4])?
        .with(("chosen", "score"), ct.shallow_clone())?
        .with(("rejected", "score"), rt.shallow_clone())?;
    let out = RewardModelLoss::new()
        .with_center_coeff(coeff)?
        .forward(&td)?;
    out.total_loss()?.backward();
    let sig = |x: f64| 1.0 / (1.0 + (-x).exp());
    let (gc, gr) = (f64s(&ct.grad()), f64s(&rt.grad()));
    for i in 0..4 {
        let want_c = (-sig(r[i] - c[i]) + coeff * 2.0 * c[i]) / 4.0;
        let want_r = (sig(r[i] - c[i]) + coeff * 2.0 * r[i]) / 4.0;
        assert!((gc[i] - want_c).abs() < 1e-12, "{i}: {} vs {want_c}", gc[i]);
        assert!((gr[i] - want_r).abs() < 1e-12, "{i}: {} vs {want_r}", gr[i]);
    }
    Ok(())
}

#[test]
fn centring_with_zero_coefficient_is_present_and_zero() -> torchrl::Result<()> {
    let out = RewardModelLoss::new()
        .with_center_coeff(0.0)?
        .with_reduction(Reduction::None)
        .forward(&scores(&[1.0, 2.0], &[3.0, 4.0]))?;
    let center = out.loss_center.as_ref().map(f64s);
    assert_eq!(center, Some(vec![0.0, 0.0]));
    assert_eq!(out.loss_terms().len(), 2);
    let none = RewardModelLoss::new().forward(&scores(&[1.0], &[3.0]))?;
    assert!(none.loss_center.is_none());
    assert_eq!(none.loss_terms().len(), 1);
    Ok(())
}

#[test]
fn invalid_reductions_and_coefficients_are_refused() {
    let err = "avg".parse::<Reduction>().unwrap_err();
    assert!(err.to_string().contains("Invalid reduction: avg"));
    assert!(Reduction::try_from("MEAN").is_err());
    assert_eq!("none".parse::<Reduction>().ok(), Some(Reduction::None));
    assert_eq!(Reduction::default(), Reduction::Mean);
    assert_eq!(Reduction::Sum.to_string(), "sum");
    for bad in [-1e-9, f64::NAN, -1.0] {
        let err = RewardModelLoss::new().with_center_coeff(bad).unwrap_err();
        assert!(
            err.to_string()
                .contains("center_coeff must be non-negative"),
            "{err}"
        );
    }
}

#[test]
fn score_network_runs_on_a_copy_and_shares_weights() -> torchrl::Result<()> {
    let w = Tensor::from_slice(&[1.0f32, -1.0]).set_requires_grad(true);
    let wc = w.shallow_clone();
    let net = ScoreFn::new(["score"], move |td: &mut TensorDict| {
        let x = td.get_or_err("x")?.f_matmul(&wc)?;
        td.set("score", x)
    });
    let x_c = Tensor::from_slice(&[2.0f32, 0.0, 0.0, 1.0]).view([2, 2]);
    let x_r = Tensor::from_slice(&[0.0f32, 0.0, 1.0, 0.0]).view([2, 2]);
    let input = TensorDict::new([2])?
        .with(("chosen", "x"), x_c)?
        .with(("rejected", "x"), x_r)?;
    let loss = RewardModelLoss::new().with_score_network(net);
    let out = loss.forward(&input)?;
    // the input is untouched: the network wrote into shallow copies
    assert!(!input.contains(("chosen", "score")) && !input.contains(("rejected", "score")));
    // chosen scores [2, -1], rejected [0, 1] -> margins [2, -2]
    let want = (-(1.0f64 / (1.0 + (-2.0f64).exp())).ln() - (1.0 / (1.0 + 2.0f64.exp())).ln()) / 2.0;
    assert!((out.loss_reward_model.double_value(&[]) - want).abs() < 1e-6);
    assert_eq!(out.accuracy.double_value(&[]), 0.5);
    out.total_loss()?.backward();
    // one set of weights serves both sides: gradients from both accumulate into `w`
    assert!(w.grad().defined());
    Ok(())
}

#[test]
fn reward_model_key_errors_name_the_key() -> torchrl::Result<()> {
    let loss = RewardModelLoss::new();
    // a side that is a tensor, not a sub-tensordict
    let td = TensorDict::new([2])?
        .with("chosen", Tensor::zeros([2], (Kind::Float, Device::Cpu)))?
        .with(
            ("rejected", "score"),
            Tensor::zeros([2], (Kind::Float, Device::Cpu)),
        )?;
    let err = loss.forward(&td).unwrap_err();
    assert!(matches!(err, Error::WrongEntryKind { .. }), "{err}");
    // a missing side lists what is there
    let td = TensorDict::new([2])?.with(
        ("rejected", "score"),
        Tensor::zeros([2], (Kind::Float, Device::Cpu)),
    )?;
    let err = loss.forward(&td).unwrap_err();
    assert!(matches!(err, Error::KeyNotFound { .. }), "{err}");
    assert!(err.to_string().contains("\"chosen\"") && err.to_string().contains("\"rejected\""));
    // a missing score says the scores must be precomputed
    let td = TensorDict::new([2])?
        .with(
            ("chosen", "score"),
            Tensor::zeros([2], (Kind::Float, Device::Cpu)),
        )?
        .with(
            ("rejected", "logit"),
            Tensor::zeros([2], (Kind::Float, Device::Cpu)),
        )?;
    let err = loss.forward(&td).unwrap_err();
    assert!(err.to_string().contains("precomputed"), "{err}");
    assert!(
        err.to_string().contains("(\"rejected\", \"score\")"),
        "{err}"
    );
    Ok(())
}

#[test]
fn reward_model_keys_typed_and_by_name_agree() -> torchrl::Result<()> {
    assert_eq!(RewardModelKeys::NAMES, &["chosen", "rejected", "score"]);
    let keys = RewardModelKeys {
        chosen: "chosen_data".into(),
        ..RewardModelKeys::default()
    };
    let typed = RewardModelLoss::new().with_keys(keys.clone());
    let mut by_name = RewardModelLoss::new();
    by_name.set_keys(&[("chosen", Some("chosen_data".into()))])?;
    assert_eq!(typed.tensor_keys(), by_name.tensor_keys());
    assert_eq!(typed.in_keys(), by_name.in_keys());
    let mut set = RewardModelLoss::new();
    set.set_tensor_keys(keys)?;
    assert_eq!(set.in_keys()[0], NestedKey::from("chosen_data"));
    // an empty key is refused
    assert!(by_name
        .set_keys(&[("score", Some(NestedKey::default()))])
        .is_err());
    Ok(())
}

#[test]
fn losses_and_estimators_are_send() {
    fn send<T: Send>() {}
    send::<RewardModelLoss>();
    send::<GAE>();
    send::<TDLambdaEstimator>();
}

// ======================================================================= hand-derived: value

/// torchrl.md §5.3 (γ=0.9, λ=0.8, V=[1,2,3], V'=[2,3,4], r=1) and rlhf.md §5.2
/// (V=[0.5,0.6,0.7], r=[0,0,1], no bootstrap after the end, γ=1, λ=0.95).
#[test]
fn gae_reference_numbers() -> torchrl::Result<()> {
    let t = |v: &[f64]| Tensor::from_slice(v).view([-1, 1]);
    let done = Tensor::from_slice(&[false, false, true]).view([-1, 1]);
    let (adv, target) = generalized_advantage_estimate(
        0.9,
        0.8,
        &t(&[1.0, 2.0, 3.0]),
        &t(&[2.0, 3.0, 4.0]),
        &t(&[1.0, 1.0, 1.0]),
        &done,
        None,
        -2,
    )?;
    assert_close(&f64s(&adv), &[1.9872, 0.26, -2.0], 1e-12);
    assert_close(&f64s(&target), &[2.9872, 2.26, 1.0], 1e-12);
    let (adv, _) = generalized_advantage_estimate(
        0.9,
        0.8,
        &t(&[1.0, 2.0, 3.0]),
        &t(&[2.0, 3.0, 4.0]),
        &t(&[1.0, 1.0, 1.0]),
        &done,
        Some(&done.zeros_like()),
        -2,
    )?;
    assert_close(&f64s(&adv), &[3.85344, 2.852, 1.6], 1e-12);

    let mut td = TensorDict::new([3])?
        .with("state_value", t(&[0.5, 0.6, 0.7]))?
        .with(("next", "state_value"), t(&[0.6, 0.7, 0.0]))?
        .with(("next", "reward"), t(&[0.0, 0.0, 1.0]))?
        .with(("next", "done"), done.shallow_clone())?;
    GAE::new(1.0, 0.95)?.with_time_dim(0).forward(&mut td)?; // one trajectory [T]
    assert_close(
        &f64s(td.get_or_err("advantage")?),
        &[0.46575, 0.385, 0.3],
        1e-12,
    );
    assert_close(
        &f64s(td.get_or_err("value_target")?),
        &[0.96575, 0.985, 1.0],
        1e-12,
    );
    // standardised: (A - mean) / std (unbiased). The reference numbers are trlX's whiten,
    // which adds 1e-8 to the variance (≈ 0.00687): a relative difference of 1e-8 / (2 · var)
    // ≈ 7.3e-7, hence the tolerance.
    GAE::new(1.0, 0.95)?
        .with_average_gae(true)
        .with_time_dim(0)
        .forward(&mut td)?;
    assert_close(
        &f64s(td.get_or_err("advantage")?),
        &[0.99134365, 0.01709213, -1.00843578],
        1e-6,
    );
    Ok(())
}

fn assert_close(got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{got:?} vs {want:?}");
    for (g, w) in got.iter().zip(want) {
        assert!((g - w).abs() <= tol, "{got:?} vs {want:?}");
    }
}

/// The per-step recursions of TorchRL's non-vectorised functional code, in plain f64.
fn loop_gae(
    g: f64,
    l: f64,
    v: &[f64],
    nv: &[f64],
    r: &[f64],
    d: &[bool],
    term: &[bool],
) -> Vec<f64> {
    let mut adv = vec![0.0; v.len()];
    let mut prev = 0.0;
    for t in (0..v.len()).rev() {
        let nt = if term[t] { 0.0 } else { 1.0 };
        let nd = if d[t] { 0.0 } else { 1.0 };
        let delta = r[t] + g * nt * nv[t] - v[t];
        prev = delta + g * l * nd * prev;
        adv[t] = prev;
    }
    adv
}

fn loop_td_lambda(g: f64, l: f64, nv: &[f64], r: &[f64], d: &[bool], term: &[bool]) -> Vec<f64> {
    let nv: Vec<f64> = nv
        .iter()
        .zip(term)
        .map(|(x, t)| if *t { 0.0 } else { *x })
        .collect();
    let mut ret = vec![0.0; nv.len()];
    let mut acc = nv.last().copied().unwrap_or(0.0);
    for t in (0..nv.len()).rev() {
        if d[t] {
            acc = nv[t];
        }
        acc = r[t] + g * ((1.0 - l) * nv[t] + l * acc);
        ret[t] = acc;
    }
    ret
}

/// A CartPole rollout that keeps going through terminations (partial resets) and is truncated
/// every 25 steps by a StepCounter: the vectorised estimators must equal the sequential loops,
/// row by row, with a value network (`V(s) = w·s + b`) evaluated on `td` and `td["next"]`.
#[test]
fn estimators_match_sequential_loops_on_a_cartpole_rollout() -> torchrl::Result<()> {
    let mut env = TransformedEnv::new(CartPoleEnv::new(&[3], Device::Cpu)?)?
        .with(StepCounter::new().with_max_steps(25)?)?;
    env.set_seed(7)?;
    let cfg = RolloutConfig {
        break_when_any_done: Some(false),
        ..RolloutConfig::default()
    };
    let mut td = env.rollout(80, None, &cfg)?;
    assert_eq!(td.batch_size(), &[3, 80]);
    let done = td.get_or_err(("next", "done"))?.shallow_clone();
    let term = td.get_or_err(("next", "terminated"))?.shallow_clone();
    let n_done = done.to_kind(Kind::Int64).sum(None).int64_value(&[]);
    let n_term = term.to_kind(Kind::Int64).sum(None).int64_value(&[]);
    assert!(
        n_term > 0 && n_done > n_term,
        "want terminations and truncations: {n_done} {n_term}"
    );

    let w = Tensor::from_slice(&[0.5f32, -1.0, 2.0, 0.25]).view([4, 1]);
    let net = move || {
        let w = w.shallow_clone();
        ValueNetwork::new(["observation"], move |td: &TensorDict| {
            Ok(td
                .get_or_err("observation")?
                .f_matmul(&w)?
                .f_add_scalar(0.1)?)
        })
    };
    let (g, l) = (0.97, 0.9);
    let gae = GAE::new(g, l)?.with_value_network(net());
    let mut td_l = td.clone();
    gae.forward(&mut td)?;
    TDLambdaEstimator::new(g, l)?
        .with_value_network(net())
        .forward(&mut td_l)?;

    let rows = |k: (&str, &str)| -> torchrl::Result<Vec<Vec<f64>>> {
        let t = td.get_or_err(k)?.to_kind(Kind::Double).view([3, 80]);
        (0..3)
            .map(|i| Ok(Vec::<f64>::try_from(&t.get(i))?))
            .collect()
    };
    let flags = |t: &Tensor| -> torchrl::Result<Vec<Vec<bool>>> {
        let t = t.view([3, 80]);
        (0..3)
            .map(|i| Ok(Vec::<bool>::try_from(&t.get(i))?))
            .collect()
    };
    let v = {
        let t = td
            .get_or_err("state_value")?
            .to_kind(Kind::Double)
            .view([3, 80]);
        (0..3)
            .map(|i| Ok(Vec::<f64>::try_from(&t.get(i))?))
            .collect::<torchrl::Result<Vec<_>>>()?
    };
    let nv = rows(("next", "state_value"))?;
    let r = rows(("next", "reward"))?;
    let (d, te) = (flags(&done)?, flags(&term)?);
    let adv = td
        .get_or_err("advantage")?
        .to_kind(Kind::Double)
        .view([3, 80]);
    let ret = td_l
        .get_or_err("value_target")?
        .to_kind(Kind::Double)
        .view([3, 80]);
    for i in 0..3 {
        let want = loop_gae(g, l, &v[i], &nv[i], &r[i], &d[i], &te[i]);
        let got = Vec::<f64>::try_from(&adv.get(i as i64))?;
        assert_close(&got, &want, 1e-4);
        let want = loop_td_lambda(g, l, &nv[i], &r[i], &d[i], &te[i]);
        let got = Vec::<f64>::try_from(&ret.get(i as i64))?;
        assert_close(&got, &want, 1e-4);
    }
    Ok(())
}

#[test]
fn truncation_bootstraps_and_termination_does_not() -> torchrl::Result<()> {
    // One step, r = 1, V = 0, V' = 10, γ = 0.5.
    let mk = |terminated: bool| -> torchrl::Result<TensorDict> {
        TensorDict::new([1])?
            .with(
                "state_value",
                Tensor::zeros([1, 1], (Kind::Double, Device::Cpu)),
            )?
            .with(
                ("next", "state_value"),
                Tensor::full([1, 1], 10.0, (Kind::Double, Device::Cpu)),
            )?
            .with(
                ("next", "reward"),
                Tensor::ones([1, 1], (Kind::Double, Device::Cpu)),
            )?
            .with(
                ("next", "done"),
                Tensor::ones([1, 1], (Kind::Bool, Device::Cpu)),
            )?
            .with(
                ("next", "terminated"),
                Tensor::full([1, 1], i64::from(terminated), (Kind::Bool, Device::Cpu)),
            )
    };
    for (terminated, want) in [(true, 1.0), (false, 6.0)] {
        let mut td = mk(terminated)?;
        GAE::new(0.5, 0.7)?.with_time_dim(0).forward(&mut td)?;
        assert_eq!(td.get_or_err("advantage")?.double_value(&[0, 0]), want);
        let mut td = mk(terminated)?;
        TDLambdaEstimator::new(0.5, 0.7)?
            .with_time_dim(0)
            .forward(&mut td)?;
        assert_eq!(td.get_or_err("value_target")?.double_value(&[0, 0]), want);
    }
    Ok(())
}

fn small_td() -> torchrl::Result<TensorDict> {
    let f = (Kind::Float, Device::Cpu);
    TensorDict::new([2, 4])?
        .with("state_value", Tensor::zeros([2, 4, 1], f))?
        .with(("next", "state_value"), Tensor::ones([2, 4, 1], f))?
        .with(("next", "reward"), Tensor::ones([2, 4, 1], f))?
        .with(
            ("next", "done"),
            Tensor::zeros([2, 4, 1], (Kind::Bool, Device::Cpu)),
        )
}

#[test]
fn estimator_errors_and_atomic_writes() -> torchrl::Result<()> {
    let gae = GAE::new(0.9, 0.9)?;
    // no time dim
    let mut flat = TensorDict::new([])?;
    assert!(gae.forward(&mut flat).is_err());
    // a missing value with no network
    let mut td = small_td()?;
    td.remove("state_value");
    let err = gae.forward(&mut td).unwrap_err();
    assert!(err.to_string().contains("no value network"), "{err}");
    // mismatched shapes name both sides
    let mut td = small_td()?;
    td.set(
        "state_value",
        Tensor::zeros([2, 4, 2], (Kind::Float, Device::Cpu)),
    )?;
    let err = gae.forward(&mut td).unwrap_err();
    assert!(err.to_string().contains("[2, 4, 2]"), "{err}");
    // time_dim out of range
    let mut td = small_td()?;
    assert!(GAE::new(0.9, 0.9)?
        .with_time_dim(2)
        .forward(&mut td)
        .is_err());
    assert!(GAE::new(f64::NAN, 0.9).is_err());
    // a write that fails half-way leaves the tensordict as it was: "value_target" is
    // written under "reward/..." which walks through the reward leaf
    let mut td = small_td()?;
    let mut bad = GAE::new(0.9, 0.9)?;
    bad.set_keys(&[("value_target", Some(("next", "reward", "x").into()))])?;
    let before = td.keys(torchrl::tensordict::KeysOptions::nested_leaves());
    assert!(bad.forward(&mut td).is_err());
    assert_eq!(
        td.keys(torchrl::tensordict::KeysOptions::nested_leaves()),
        before
    );
    Ok(())
}

#[test]
fn time_dim_can_be_an_earlier_batch_dim() -> torchrl::Result<()> {
    // [T, B] layout with time_dim 0 equals the [B, T] layout with the default
    let td = small_td()?;
    let mut bt = td.clone();
    bt.set(("next", "done"), {
        let d = Tensor::zeros([2, 4, 1], (Kind::Bool, Device::Cpu));
        let _ = d.get(0).get(1).fill_(1);
        d
    })?;
    let mut tb = bt.permute([1, 0])?;
    let gae = GAE::new(0.8, 0.5)?;
    gae.forward(&mut bt)?;
    gae.with_time_dim(0).forward(&mut tb)?;
    let a = bt.get_or_err("advantage")?;
    let b = tb.get_or_err("advantage")?.permute([1, 0, 2]);
    assert!(a.allclose(&b, 1e-6, 1e-6, false));
    Ok(())
}

#[test]
fn differentiable_estimates_carry_gradients() -> torchrl::Result<()> {
    let v = Tensor::zeros([1, 3, 1], (Kind::Double, Device::Cpu)).set_requires_grad(true);
    let mk = || -> torchrl::Result<TensorDict> {
        TensorDict::new([1, 3])?
            .with("state_value", v.shallow_clone())?
            .with(
                ("next", "state_value"),
                Tensor::ones([1, 3, 1], (Kind::Double, Device::Cpu)),
            )?
            .with(
                ("next", "reward"),
                Tensor::ones([1, 3, 1], (Kind::Double, Device::Cpu)),
            )?
            .with(
                ("next", "done"),
                Tensor::zeros([1, 3, 1], (Kind::Bool, Device::Cpu)),
            )
    };
    let mut td = mk()?;
    GAE::new(0.9, 0.5)?.forward(&mut td)?;
    assert!(!td.get_or_err("advantage")?.requires_grad());
    let mut td = mk()?;
    GAE::new(0.9, 0.5)?
        .with_differentiable(true)
        .forward(&mut td)?;
    let adv = td.get_or_err("advantage")?;
    adv.sum(None).backward();
    // dA_t/dV_t = -1 for every t (A_s depends on V_t only through delta_t = ... - V_t)
    // sum_s dA_s/dV_t = -(γλ)^(t-s) summed over s <= t
    let gl: f64 = 0.45;
    let want: Vec<f64> = (0..3)
        .map(|t| -(0..=t).map(|k| gl.powi(k)).sum::<f64>())
        .collect();
    assert_close(&f64s(&v.grad()), &want, 1e-12);
    Ok(())
}

// ====================================================================== keys machinery

#[test]
fn estimator_set_keys_rules() -> torchrl::Result<()> {
    let mut gae = GAE::new(0.9, 0.9)?;
    gae.set_keys(&[("reward", Some(("agents", "reward").into()))])?;
    assert_eq!(
        gae.tensor_keys().reward,
        NestedKey::from(("agents", "reward"))
    );
    assert!(gae
        .in_keys()
        .contains(&NestedKey::from(("next", "agents", "reward"))));
    // None is an error for an estimator (a loss resets instead)
    let err = gae.set_keys(&[("reward", None)]).unwrap_err();
    assert!(err.to_string().contains("cannot be None"), "{err}");
    assert_eq!(
        gae.tensor_keys().reward,
        NestedKey::from(("agents", "reward"))
    );
    let err = gae
        .set_keys(&[("advantage", Some("a".into())), ("nope", Some("b".into()))])
        .unwrap_err();
    assert!(err
        .to_string()
        .contains("nope is not an accepted tensordict key for advantages (GAE)"));
    for name in ValueEstimatorKeys::NAMES {
        assert!(err.to_string().contains(name), "{err} lacks {name}");
    }
    assert_eq!(gae.tensor_keys().advantage, NestedKey::from("advantage"));
    assert_eq!(
        gae.out_keys(),
        vec![
            NestedKey::from("advantage"),
            NestedKey::from("value_target")
        ]
    );
    // the free functions behave alike
    let mut keys = ValueEstimatorKeys::default();
    assert!(set_estimator_keys(&mut keys, &[("value", None)], "X").is_err());
    set_loss_keys(&mut keys, &[("value", None)], "X")?;
    assert_eq!(keys, ValueEstimatorKeys::default());
    Ok(())
}

torchrl::accepted_keys! {
    /// Keys of the critic loss below.
    struct CriticKeys {
        /// The state value.
        value: "state_value",
        /// The value target.
        value_target: "value_target",
        /// The advantage.
        advantage: "advantage",
        /// The reward.
        reward: "reward",
        /// The done flag.
        done: "done",
        /// The terminated flag.
        terminated: "terminated",
        /// Not an estimator key: never forwarded.
        observation: "observation",
    }
}

/// A minimal critic loss that owns a value estimator: `loss_critic = mean((V - target)²)`.
struct CriticLoss {
    keys: CriticKeys,
    in_keys: Vec<NestedKey>,
    estimator: Box<dyn ValueEstimator + Send>,
}

struct CriticOutput {
    loss_critic: Tensor,
}

impl LossOutput for CriticOutput {
    fn loss_terms(&self) -> Vec<(&'static str, &Tensor)> {
        vec![("loss_critic", &self.loss_critic)]
    }
}

impl CriticLoss {
    fn new(estimator: Box<dyn ValueEstimator + Send>) -> torchrl::Result<Self> {
        let mut loss = CriticLoss {
            keys: CriticKeys::default(),
            in_keys: Vec::new(),
            estimator,
        };
        loss.set_tensor_keys(CriticKeys::default())?;
        Ok(loss)
    }
}

impl LossModule for CriticLoss {
    type Keys = CriticKeys;
    type Output = CriticOutput;

    fn name(&self) -> &'static str {
        "CriticLoss"
    }

    fn tensor_keys(&self) -> &CriticKeys {
        &self.keys
    }

    fn set_tensor_keys(&mut self, keys: CriticKeys) -> torchrl::Result<()> {
        forward_value_estimator_keys(&keys, self.estimator.as_mut())?;
        let mut in_keys = vec![keys.observation.clone()];
        in_keys.extend(self.estimator.in_keys());
        self.in_keys = in_keys;
        self.keys = keys;
        Ok(())
    }

    fn in_keys(&self) -> &[NestedKey] {
        &self.in_keys
    }

    fn forward(&self, td: &TensorDict) -> torchrl::Result<CriticOutput> {
        let mut td = td.clone();
        if !td.contains(&self.keys.value_target) {
            self.estimator.forward(&mut td)?;
        }
        let v = td.get_or_err(&self.keys.value)?;
        let target = td.get_or_err(&self.keys.value_target)?;
        Ok(CriticOutput {
            loss_critic: v.f_sub(target)?.f_pow_tensor_scalar(2)?.f_mean(None)?,
        })
    }
}

/// An estimator that does not accept `terminated` (TorchRL issue #4371: a loss must forward
/// only the keys its estimator accepts).
struct NoTerminated(GAE);

impl ValueEstimator for NoTerminated {
    fn name(&self) -> &'static str {
        "NoTerminated"
    }
    fn tensor_keys(&self) -> &ValueEstimatorKeys {
        self.0.tensor_keys()
    }
    fn set_tensor_keys(&mut self, keys: ValueEstimatorKeys) -> torchrl::Result<()> {
        self.0.set_tensor_keys(keys)
    }
    fn accepts_key(&self, name: &str) -> bool {
        name != "terminated" && ValueEstimatorKeys::NAMES.contains(&name)
    }
    fn set_keys(&mut self, pairs: &[(&str, Option<NestedKey>)]) -> torchrl::Result<()> {
        if let Some((n, _)) = pairs.iter().find(|(n, _)| !self.accepts_key(n)) {
            return Err(Error::InvalidArgument {
                op: "set_keys",
                message: format!("{n} is not an accepted tensordict key for advantages"),
            });
        }
        self.0.set_keys(pairs)
    }
    fn in_keys(&self) -> Vec<NestedKey> {
        self.0.in_keys()
    }
    fn forward(&self, td: &mut TensorDict) -> torchrl::Result<()> {
        self.0.forward(td)
    }
    fn value_estimate(&self, td: &TensorDict) -> torchrl::Result<Tensor> {
        self.0.value_estimate(td)
    }
}

#[test]
fn loss_keys_are_forwarded_to_its_estimator() -> torchrl::Result<()> {
    let mut loss = CriticLoss::new(Box::new(GAE::new(0.9, 0.8)?))?;
    assert!(loss
        .in_keys()
        .contains(&NestedKey::from(("next", "reward"))));
    loss.set_keys(&[
        ("reward", Some("r2".into())),
        ("done", Some(("d", "done").into())),
        ("value", Some("v".into())),
        ("observation", Some("pixels".into())),
    ])?;
    let est = loss.estimator.tensor_keys();
    assert_eq!(est.reward, NestedKey::from("r2"));
    assert_eq!(est.done, NestedKey::from(("d", "done")));
    assert_eq!(est.value, NestedKey::from("v"));
    // in_keys recomputed from both the loss's and the estimator's keys
    for k in [
        NestedKey::from("pixels"),
        NestedKey::from(("next", "r2")),
        NestedKey::from(("next", "d", "done")),
        NestedKey::from("v"),
    ] {
        assert!(
            loss.in_keys().contains(&k),
            "{k} not in {:?}",
            loss.in_keys()
        );
    }
    // None resets the loss's key to its default, and the default reaches the estimator
    loss.set_keys(&[("reward", None)])?;
    assert_eq!(loss.tensor_keys().reward, NestedKey::from("reward"));
    assert_eq!(
        loss.estimator.tensor_keys().reward,
        NestedKey::from("reward")
    );
    // an unknown name changes neither side
    let err = loss
        .set_keys(&[("value", None), ("foo", Some("x".into()))])
        .unwrap_err();
    assert!(err
        .to_string()
        .contains("foo is not an accepted tensordict key of CriticLoss"));
    assert_eq!(loss.tensor_keys().value, NestedKey::from("v"));
    assert_eq!(loss.estimator.tensor_keys().value, NestedKey::from("v"));

    // the forwarded keys are the ones the estimator reads
    let f = (Kind::Float, Device::Cpu);
    let td = TensorDict::new([1, 2])?
        .with("v", Tensor::zeros([1, 2, 1], f))?
        .with(("next", "v"), Tensor::ones([1, 2, 1], f))?
        .with(("next", "reward"), Tensor::ones([1, 2, 1], f))?
        .with(
            ("next", "d", "done"),
            Tensor::zeros([1, 2, 1], (Kind::Bool, Device::Cpu)),
        )?;
    let out = loss.forward(&td)?;
    // delta_t = 1 + 0.9·1 - 0 = 1.9; A_1 = 1.9, A_0 = 1.9 + 0.72·1.9 = 3.268 (= the targets)
    let want = (1.9f64.powi(2) + 3.268f64.powi(2)) / 2.0;
    assert!((out.total_loss()?.double_value(&[]) - want).abs() < 1e-5);
    Ok(())
}

#[test]
fn only_keys_the_estimator_accepts_are_forwarded() -> torchrl::Result<()> {
    let mut loss = CriticLoss::new(Box::new(NoTerminated(GAE::new(0.9, 0.8)?)))?;
    loss.set_keys(&[
        ("terminated", Some("term2".into())),
        ("done", Some("done2".into())),
    ])?;
    assert_eq!(loss.tensor_keys().terminated, NestedKey::from("term2"));
    assert_eq!(
        loss.estimator.tensor_keys().terminated,
        NestedKey::from("terminated")
    );
    assert_eq!(loss.estimator.tensor_keys().done, NestedKey::from("done2"));
    assert_eq!(VALUE_ESTIMATOR_KEYS.len(), 6);
    assert!(!VALUE_ESTIMATOR_KEYS.contains(&"observation"));
    Ok(())
}
