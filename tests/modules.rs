//! Policy modules (`torchrl::modules::{module, sequential, models, actors}`).
//!
//! 1. Replays `specs/module_cases.json` (recorded by `specs/record_modules.py` from torch 2.13 /
//!    tensordict 0.14.3 / TorchRL 0.14.1; Python is never run): TorchRL `MLP`s with recorded
//!    weights (copied in by `state_dict` name) and their outputs, `NormalParamExtractor`,
//!    `ProbabilisticActor` (keys, the deterministic / mean / mode action, the written
//!    `action_log_prob`, `get_dist(td).log_prob(given)`), `TensorDictSequential` key
//!    bookkeeping and outputs (with `select_out_keys`), and `ValueOperator`. Values within 1e-5
//!    (absolute below 1, relative above); infinities exact.
//! 2. Hand-derived values and properties: an MLP with hand-set weights, TdModule around tch
//!    modules (split outputs, train flag, panics turned into errors), error cases that name
//!    the key, sequential bookkeeping, seeded sampling, masks, rollouts with built-in envs.

mod common;

use common::{key_from_json, keys_from_json, load_cases, Case, Failures, Json};
use tch::nn::{self, VarStore};
use tch::{Device, Kind, Tensor};
use torchrl::envs::builtin::{CartPoleEnv, PendulumEnv};
use torchrl::envs::{EnvBase, RolloutConfig, SpecGroup};
use torchrl::modules::actors::{
    DistributionBuilder, ExplorationType, NormalParamExtractor, ProbabilisticActor, ScaleMapping,
};
use torchrl::modules::distributions::{Distribution, TanhNormal};
use torchrl::modules::models::{Activation, MlpConfig, NumCells, ValueOperator, MLP};
use torchrl::modules::module::{from_fn, TdModule, TensorDictModule, TensorModule};
use torchrl::modules::sequential::TensorDictSequential;
use torchrl::specs::{Bounded, TensorSpec, Unbounded};
use torchrl::{Error, Generator, NestedKey, TensorDict};

const TOL: f64 = 1e-5;

fn f32s(v: &[f32]) -> Tensor {
    Tensor::from_slice(v)
}

fn vals(t: &Tensor) -> Vec<f64> {
    Vec::<f64>::try_from(&t.to_kind(Kind::Double).reshape([-1])).expect("readable tensor")
}

fn keys(names: &[&str]) -> Vec<NestedKey> {
    names.iter().map(|n| NestedKey::from(*n)).collect()
}

fn assert_close(actual: &Tensor, expected: &[f64], tol: f64) {
    let a = vals(actual);
    assert_eq!(a.len(), expected.len(), "{a:?} vs {expected:?}");
    for (x, y) in a.iter().zip(expected) {
        assert!(
            (x - y).abs() <= tol * y.abs().max(1.0),
            "{a:?} vs {expected:?}"
        );
    }
}

// ------------------------------------------------------------------ decoding

fn number(v: &Json) -> Result<f64, String> {
    match v {
        Json::String(s) if s == "inf" => Ok(f64::INFINITY),
        Json::String(s) if s == "-inf" => Ok(f64::NEG_INFINITY),
        Json::String(s) if s == "nan" => Ok(f64::NAN),
        Json::Bool(b) => Ok(f64::from(u8::from(*b))),
        other => other.as_f64().ok_or_else(|| format!("bad number {other}")),
    }
}

/// Decodes `{"shape", "dtype", "data"}` (with `"inf"` / `"nan"` strings) into a CPU tensor.
fn decode(v: &Json) -> Result<Tensor, String> {
    let shape: Vec<i64> = v["shape"]
        .as_array()
        .and_then(|a| a.iter().map(Json::as_i64).collect())
        .ok_or_else(|| format!("bad shape in {v}"))?;
    let data = v["data"].as_array().ok_or("data is not a list")?;
    let t = match v["dtype"].as_str().ok_or("dtype is not a string")? {
        "float32" => {
            let d: Vec<f32> = data
                .iter()
                .map(|x| number(x).map(|f| f as f32))
                .collect::<Result<_, _>>()?;
            Tensor::from_slice(&d)
        }
        "float64" => Tensor::from_slice(&data.iter().map(number).collect::<Result<Vec<_>, _>>()?),
        "int64" => Tensor::from_slice(
            &data
                .iter()
                .map(|x| x.as_i64().ok_or_else(|| format!("bad int {x}")))
                .collect::<Result<Vec<_>, _>>()?,
        ),
        "bool" => Tensor::from_slice(
            &data
                .iter()
                .map(|x| x.as_bool().ok_or_else(|| format!("bad bool {x}")))
                .collect::<Result<Vec<_>, _>>()?,
        ),
        other => return Err(format!("unknown dtype {other}")),
    };
    t.f_reshape(shape.as_slice()).map_err(|e| e.to_string())
}

fn dtype_name(kind: Kind) -> &'static str {
    match kind {
        Kind::Float => "float32",
        Kind::Double => "float64",
        Kind::Int64 => "int64",
        Kind::Bool => "bool",
        _ => "other",
    }
}

/// Compares with an encoded tensor: dtype, shape, values within [`TOL`].
fn compare(actual: &Tensor, expected: &Json, what: &str) -> Result<(), String> {
    let exp = decode(expected)?;
    if Some(dtype_name(actual.kind())) != expected["dtype"].as_str() {
        return Err(format!(
            "{what}: dtype {:?}, expected {}",
            actual.kind(),
            expected["dtype"]
        ));
    }
    if actual.size() != exp.size() {
        return Err(format!(
            "{what}: shape {:?}, expected {:?}",
            actual.size(),
            exp.size()
        ));
    }
    let (a, e) = (vals(actual), vals(&exp));
    for (i, (x, y)) in a.iter().zip(&e).enumerate() {
        let ok = if y.is_nan() {
            x.is_nan()
        } else if y.is_infinite() {
            x == y
        } else {
            (x - y).abs() <= TOL * y.abs().max(1.0)
        };
        if !ok {
            return Err(format!("{what}: element {i} is {x}, expected {y}"));
        }
    }
    Ok(())
}

fn compare_keys(actual: &[NestedKey], expected: &Json, what: &str) -> Result<(), String> {
    let exp = keys_from_json(expected)?;
    if actual != exp.as_slice() {
        return Err(format!("{what}: {actual:?}, expected {exp:?}"));
    }
    Ok(())
}

fn lib<T>(r: torchrl::Result<T>) -> Result<T, String> {
    r.map_err(|e| e.to_string())
}

/// `"a/b"` → `("a", "b")`.
fn slash_key(s: &str) -> NestedKey {
    NestedKey::from(s.split('/').collect::<Vec<_>>())
}

fn cases(op: &str) -> Vec<Case> {
    let file = load_cases("module_cases.json");
    let out: Vec<Case> = file.cases.into_iter().filter(|c| c.op == op).collect();
    assert!(!out.is_empty(), "no {op} case in specs/module_cases.json");
    out
}

// ------------------------------------------------------------------ replay: MLP

/// Builds the MLP of a case (`args` of an `mlp` case) and copies its recorded weights in by
/// `state_dict` name. Returns the MLP and the variable names of the VarStore.
fn mlp_from_args(vs: &VarStore, args: &Json) -> Result<(MLP, Vec<String>), String> {
    let int = |k: &str| args[k].as_i64().ok_or_else(|| format!("{k} is not an int"));
    let flag = |k: &str| {
        args[k]
            .as_bool()
            .ok_or_else(|| format!("{k} is not a bool"))
    };
    let act_name = args["activation"]
        .as_str()
        .ok_or("activation is not a string")?;
    let activation =
        Activation::from_name(act_name).ok_or_else(|| format!("unknown activation {act_name}"))?;
    let mut cfg = MlpConfig::new(int("in_features")?, int("out_features")?)
        .with_activation(activation)
        .with_activate_last_layer(flag("activate_last_layer")?)
        .with_bias_last_layer(flag("bias_last_layer")?);
    if let Some(d) = args["depth"].as_i64() {
        cfg = cfg.with_depth(d as usize);
    }
    match &args["num_cells"] {
        Json::Null => {}
        Json::Array(a) => {
            let v: Vec<i64> = a
                .iter()
                .map(Json::as_i64)
                .collect::<Option<_>>()
                .ok_or("bad num_cells")?;
            cfg = cfg.with_num_cells(v);
        }
        other => cfg = cfg.with_num_cells(other.as_i64().ok_or("bad num_cells")?),
    }
    let mlp = lib(MLP::new(&vs.root(), &cfg))?;
    let vars = vs.variables();
    let sd = args["state_dict"]
        .as_object()
        .ok_or("state_dict is not an object")?;
    let _guard = tch::no_grad_guard();
    for (name, value) in sd {
        let mut var = vars
            .get(name)
            .ok_or_else(|| format!("no variable {name}; have {:?}", vars.keys()))?
            .shallow_clone();
        var.f_copy_(&decode(value)?).map_err(|e| e.to_string())?;
    }
    let mut names: Vec<String> = vars.into_keys().collect();
    names.sort();
    Ok((mlp, names))
}

fn replay_mlp(c: &Case) -> Result<(), String> {
    let vs = VarStore::new(Device::Cpu);
    let (mlp, mut names) = mlp_from_args(&vs, &c.args)?;
    let mut expected: Vec<String> = c.expect["layer_names"]
        .as_array()
        .ok_or("layer_names")?
        .iter()
        .filter_map(|n| n.as_str().map(str::to_string))
        .collect();
    expected.sort();
    names.sort();
    if names != expected {
        return Err(format!("variables {names:?}, expected {expected:?}"));
    }
    let inputs: Vec<Tensor> = c.args["inputs"]
        .as_array()
        .ok_or("inputs")?
        .iter()
        .map(decode)
        .collect::<Result<_, _>>()?;
    let refs: Vec<&Tensor> = inputs.iter().collect();
    let out = lib(mlp.forward_cat(&refs))?;
    compare(&out, &c.expect["output"], "output")?;
    // the same through a TdModule (one key per input, concatenated)
    let in_keys: Vec<String> = (0..inputs.len()).map(|i| format!("x{i}")).collect();
    let batch = inputs[0].size()[0];
    let mut td = lib(TensorDict::new([batch]))?;
    for (k, x) in in_keys.iter().zip(&inputs) {
        lib(td.set(k.as_str(), x.shallow_clone()))?;
    }
    let module = lib(TdModule::new(
        mlp,
        in_keys.iter().map(String::as_str),
        ["y"],
    ))?;
    let td = lib(module.forward(td))?;
    compare(
        lib(td.get_or_err("y"))?,
        &c.expect["output"],
        "TdModule output",
    )
}

#[test]
fn reference_mlp() {
    let mut failures = Failures::default();
    let cases = cases("mlp");
    assert!(cases.len() >= 17);
    for c in &cases {
        failures.check(&c.name, replay_mlp(c));
    }
    failures.assert_none("mlp cases");
}

// ------------------------------------------------------------------ replay: NormalParamExtractor

fn mapping_from_name(name: &str) -> Result<ScaleMapping, String> {
    let num = |s: &str| s.parse::<f64>().map_err(|e| format!("{name}: {e}"));
    Ok(match name {
        "softplus" => ScaleMapping::Softplus,
        "exp" => ScaleMapping::Exp,
        "relu" => ScaleMapping::ReLU,
        _ => match name
            .strip_prefix("biased_softplus_")
            .map(|r| r.split('_').collect::<Vec<_>>())
            .as_deref()
        {
            Some([b]) => ScaleMapping::biased_softplus(num(b)?),
            Some([b, m]) => ScaleMapping::BiasedSoftplus {
                bias: num(b)?,
                min_val: num(m)?,
            },
            _ => return Err(format!("unknown mapping {name}")),
        },
    })
}

fn replay_npe(c: &Case) -> Result<(), String> {
    let mapping = mapping_from_name(c.args["scale_mapping"].as_str().ok_or("scale_mapping")?)?;
    let lb = c.args["scale_lb"].as_f64().ok_or("scale_lb")?;
    let ext = NormalParamExtractor::new()
        .with_scale_mapping(mapping)
        .with_scale_lb(lb);
    let x = decode(&c.args["input"])?;
    let (loc, scale) = lib(ext.extract(&x))?;
    compare(&loc, &c.expect["loc"], "loc")?;
    compare(&scale, &c.expect["scale"], "scale")?;
    // as a module
    let td = lib(TensorDict::new([x.size()[0]]).and_then(|t| t.with("param", x)))?;
    let td = lib(ext.forward(td))?;
    compare(
        lib(td.get_or_err("scale"))?,
        &c.expect["scale"],
        "module scale",
    )
}

#[test]
fn reference_normal_param_extractor() {
    let mut failures = Failures::default();
    for c in &cases("normal_param_extractor") {
        failures.check(&c.name, replay_npe(c));
    }
    failures.assert_none("normal_param_extractor cases");
}

// ------------------------------------------------------------------ replay: actors

fn bound(v: &Json) -> Result<Result<f64, Tensor>, String> {
    match v.as_f64() {
        Some(x) => Ok(Ok(x)),
        None => Ok(Err(decode(v)?)),
    }
}

fn replay_actor(c: &Case) -> Result<(), String> {
    let a = &c.args;
    let params_json = a["params"].as_object().ok_or("params")?;
    let names: Vec<String> = params_json.iter().map(|(k, _)| k.clone()).collect();
    let params: Vec<Tensor> = params_json
        .iter()
        .map(|(_, v)| decode(v))
        .collect::<Result<_, _>>()?;
    let module = lib(from_fn(
        ["observation"],
        names.iter().map(String::as_str),
        move |_x: &[&Tensor]| Ok(params.iter().map(Tensor::shallow_clone).collect()),
    ))?;
    let has_mask = !a["mask"].is_null();
    let builder = match a["dist"].as_str().ok_or("dist")? {
        "TanhNormal" => match (bound(&a["low"])?, bound(&a["high"])?) {
            (Ok(lo), Ok(hi)) => DistributionBuilder::tanh_normal("loc", "scale", lo, hi),
            (Err(lo), Err(hi)) => {
                DistributionBuilder::tanh_normal_with_bounds("loc", "scale", &lo, &hi)
            }
            _ => return Err("mixed bounds".into()),
        },
        "Normal" => DistributionBuilder::normal("loc", "scale"),
        "Categorical" if has_mask => DistributionBuilder::masked_categorical("logits", "mask"),
        "Categorical" => DistributionBuilder::categorical("logits"),
        "OneHotCategorical" => DistributionBuilder::one_hot_categorical("logits"),
        "Delta" => DistributionBuilder::delta("param"),
        other => return Err(format!("unknown dist {other}")),
    };
    let exploration = match a["exploration"].as_str().ok_or("exploration")? {
        "deterministic" => ExplorationType::Deterministic,
        "mean" => ExplorationType::Mean,
        "mode" => ExplorationType::Mode,
        other => return Err(format!("unknown exploration {other}")),
    };
    let actor = lib(ProbabilisticActor::new(module, lib(builder)?)
        .with_return_log_prob(true)
        .with_exploration_type(exploration)
        .with_action_key(key_from_json(&a["action_key"])?))?;
    compare_keys(&actor.in_keys(), &c.expect["in_keys"], "in_keys")?;
    compare_keys(&actor.out_keys(), &c.expect["out_keys"], "out_keys")?;
    let lp_key = key_from_json(&c.expect["log_prob_key"])?;
    if actor.log_prob_key() != lp_key {
        return Err(format!(
            "log_prob_key {}, expected {lp_key}",
            actor.log_prob_key()
        ));
    }
    let obs = decode(&a["observation"])?;
    let mut td = lib(TensorDict::new([obs.size()[0]]).and_then(|t| t.with("observation", obs)))?;
    if has_mask {
        lib(td.set("mask", decode(&a["mask"])?))?;
    }
    let out = lib(actor.forward(td.clone()))?;
    let action = lib(out.get_or_err(actor.action_key()))?;
    compare(action, &c.expect["action"], "action")?;
    let lp = lib(out.get_or_err(&lp_key))?;
    compare(lp, &c.expect["action_log_prob"], "action_log_prob")?;
    let given = decode(&a["given_action"])?;
    let dist = lib(actor.get_dist(&td))?;
    compare(
        &lib(dist.log_prob(&given))?,
        &c.expect["log_prob_given"],
        "log_prob(given)",
    )?;
    // the written log-prob is dist.log_prob(action)
    if vals(lp) != vals(&lib(dist.log_prob(action))?) {
        return Err("the written log-prob is not dist.log_prob(action)".into());
    }
    Ok(())
}

#[test]
fn reference_actors() {
    let mut failures = Failures::default();
    let cases = cases("actor");
    assert!(cases.len() >= 10);
    for c in &cases {
        failures.check(&c.name, replay_actor(c));
    }
    failures.assert_none("actor cases");
}

// ------------------------------------------------------------------ replay: sequential

/// The module of a sequential case: `out_keys[j] = sum(inputs) + consts[j]`.
fn sum_module(spec: &Json) -> Result<Box<dyn TensorDictModule>, String> {
    let in_keys = keys_from_json(&spec["in_keys"])?;
    let out_keys = keys_from_json(&spec["out_keys"])?;
    let consts: Vec<f64> = spec["consts"]
        .as_array()
        .and_then(|a| a.iter().map(Json::as_f64).collect())
        .ok_or("consts")?;
    let m = lib(from_fn(in_keys, out_keys, move |x: &[&Tensor]| {
        let mut s = x[0].shallow_clone();
        for t in &x[1..] {
            s = s.f_add(t)?;
        }
        consts
            .iter()
            .map(|c| Ok(s.f_add_scalar(*c)?))
            .collect::<torchrl::Result<Vec<_>>>()
    }))?;
    Ok(Box::new(m))
}

fn replay_sequential(c: &Case) -> Result<(), String> {
    let modules = c.args["modules"]
        .as_array()
        .ok_or("modules")?
        .iter()
        .map(sum_module)
        .collect::<Result<Vec<_>, _>>()?;
    let mut seq = TensorDictSequential::from_modules(modules);
    if !c.args["select_out_keys"].is_null() {
        seq = lib(seq.select_out_keys(keys_from_json(&c.args["select_out_keys"])?))?;
    }
    compare_keys(&seq.in_keys(), &c.expect["in_keys"], "in_keys")?;
    compare_keys(&seq.out_keys(), &c.expect["out_keys"], "out_keys")?;
    let mut td = lib(TensorDict::new([2]))?;
    for (k, v) in c.args["input"].as_object().ok_or("input")? {
        lib(td.set(slash_key(k), decode(v)?))?;
    }
    let out = lib(seq.forward(td))?;
    let leaves = out.leaves();
    let expected = c.expect["output"].as_array().ok_or("output")?;
    let got: Vec<String> = leaves.iter().map(|(k, _)| k.to_string()).collect();
    let want: Vec<String> = expected
        .iter()
        .map(|p| key_from_json(at(p, 0)).map(|k| k.to_string()))
        .collect::<Result<_, _>>()?;
    if got != want {
        return Err(format!("output keys {got:?}, expected {want:?}"));
    }
    for ((k, t), p) in leaves.iter().zip(expected) {
        compare(t, at(p, 1), &k.to_string())?;
    }
    Ok(())
}

/// The `i`-th item of a JSON list (`Null` when absent).
fn at(v: &Json, i: usize) -> &Json {
    static NULL: Json = Json::Null;
    v.as_array().and_then(|a| a.get(i)).unwrap_or(&NULL)
}

#[test]
fn reference_sequential() {
    let mut failures = Failures::default();
    for c in &cases("sequential") {
        failures.check(&c.name, replay_sequential(c));
    }
    failures.assert_none("sequential cases");
}

// ------------------------------------------------------------------ replay: value operator

fn replay_value(c: &Case) -> Result<(), String> {
    let vs = VarStore::new(Device::Cpu);
    let (mlp, _) = mlp_from_args(&vs, &c.args["mlp"])?;
    let mut v = ValueOperator::new(mlp);
    if !c.args["in_keys"].is_null() {
        v = lib(v.with_in_keys(keys_from_json(&c.args["in_keys"])?))?;
    }
    if !c.args["out_keys"].is_null() {
        let out = keys_from_json(&c.args["out_keys"])?;
        v = lib(v.with_out_key(&out[0]))?;
    }
    compare_keys(&v.in_keys(), &c.expect["in_keys"], "in_keys")?;
    compare_keys(&v.out_keys(), &c.expect["out_keys"], "out_keys")?;
    let mut td = lib(TensorDict::new([3]))?;
    for (k, x) in c.args["inputs"].as_object().ok_or("inputs")? {
        lib(td.set(slash_key(k), decode(x)?))?;
    }
    let td = lib(v.forward(td))?;
    compare(
        lib(td.get_or_err(lib(v.out_key())?))?,
        &c.expect["output"],
        "output",
    )
}

#[test]
fn reference_value_operator() {
    let mut failures = Failures::default();
    for c in &cases("value_operator") {
        failures.check(&c.name, replay_value(c));
    }
    failures.assert_none("value_operator cases");
}

// ------------------------------------------------------------------ MLP by hand

/// Sets a VarStore variable by name (under no_grad).
fn set_var(vs: &VarStore, name: &str, value: &Tensor) {
    let vars = vs.variables();
    let _guard = tch::no_grad_guard();
    vars[name].shallow_clone().copy_(value);
}

#[test]
fn mlp_with_hand_set_weights() {
    // 2 -> 2 (tanh) -> 1: y = tanh(x0 + x1) + tanh(x0 - x1) + 0.5
    let vs = VarStore::new(Device::Cpu);
    let mlp = MLP::new(&vs.root(), &MlpConfig::new(2, 1).with_num_cells([2])).unwrap();
    set_var(
        &vs,
        "0.weight",
        &f32s(&[1.0, 1.0, 1.0, -1.0]).reshape([2, 2]),
    );
    set_var(&vs, "0.bias", &f32s(&[0.0, 0.0]));
    set_var(&vs, "2.weight", &f32s(&[1.0, 1.0]).reshape([1, 2]));
    set_var(&vs, "2.bias", &f32s(&[0.5]));
    let x = f32s(&[0.5, -0.5, 1.0, 0.25]).reshape([2, 2]);
    let y = mlp.forward(&x).unwrap();
    assert_eq!(y.size(), vec![2, 1]);
    let expect = [
        0.0f64.tanh() + 1.0f64.tanh() + 0.5,
        1.25f64.tanh() + 0.75f64.tanh() + 0.5,
    ];
    assert_close(&y, &expect, 1e-6);

    // activate_last_layer with ReLU: relu(x0 - x1 - 1) for a 2 -> 1 single layer
    let vs = VarStore::new(Device::Cpu);
    let cfg = MlpConfig::new(2, 1)
        .with_activation(Activation::ReLU)
        .with_activate_last_layer(true);
    let mlp = MLP::new(&vs.root(), &cfg).unwrap();
    set_var(&vs, "0.weight", &f32s(&[1.0, -1.0]).reshape([1, 2]));
    set_var(&vs, "0.bias", &f32s(&[-1.0]));
    let y = mlp
        .forward(&f32s(&[3.0, 1.0, 0.0, 0.5]).reshape([2, 2]))
        .unwrap();
    assert_close(&y, &[1.0, 0.0], 1e-7);
}

#[test]
fn mlp_config_rules_and_errors() {
    let widths = |c: MlpConfig| c.hidden_widths();
    assert_eq!(widths(MlpConfig::new(3, 2)).unwrap(), Vec::<i64>::new());
    assert_eq!(
        widths(MlpConfig::new(3, 2).with_depth(2)).unwrap(),
        vec![32, 32]
    );
    assert_eq!(
        widths(MlpConfig::new(3, 2).with_depth(3).with_num_cells(8)).unwrap(),
        vec![8, 8, 8]
    );
    assert_eq!(
        widths(MlpConfig::new(3, 2).with_num_cells(vec![4, 5])).unwrap(),
        vec![4, 5]
    );
    let e = widths(MlpConfig::new(3, 2).with_num_cells(8)).unwrap_err();
    assert!(e.to_string().contains("no depth"), "{e}");
    let e = widths(MlpConfig::new(3, 2).with_depth(1).with_num_cells([4, 5])).unwrap_err();
    assert!(e.to_string().contains("depth 1"), "{e}");
    let e = widths(MlpConfig::new(0, 2)).unwrap_err();
    assert!(e.to_string().contains("in_features"), "{e}");
    let e = widths(MlpConfig::new(3, 2).with_num_cells([4, 0])).unwrap_err();
    assert!(e.to_string().contains("hidden width"), "{e}");
    assert_eq!(
        NumCells::from(&[1i64, 2][..]),
        NumCells::PerLayer(vec![1, 2])
    );
    assert!(MLP::new(&VarStore::new(Device::Cpu).root(), &MlpConfig::new(3, 0)).is_err());
}

#[test]
fn mlp_parameters_names_init_and_gradients() {
    let vs = VarStore::new(Device::Cpu);
    let cfg = MlpConfig::new(16, 3)
        .with_num_cells([64, 8])
        .with_bias_last_layer(false);
    let mlp = MLP::new(&vs.root().sub("pi"), &cfg).unwrap();
    let mut names: Vec<String> = vs.variables().into_keys().collect();
    names.sort();
    assert_eq!(
        names,
        [
            "pi.0.bias",
            "pi.0.weight",
            "pi.2.bias",
            "pi.2.weight",
            "pi.4.weight"
        ]
    );
    assert_eq!(mlp.depth(), 2);
    assert_eq!(vs.trainable_variables().len(), 5);
    // PyTorch's nn.Linear initialisation: uniform in ±1/sqrt(fan_in)
    for ((w, b), fan_in) in mlp.layers().into_iter().zip([16.0f64, 64.0, 8.0]) {
        let bound = 1.0 / fan_in.sqrt();
        assert!(w.abs().max().double_value(&[]) <= bound);
        assert!(w.abs().max().double_value(&[]) > 0.5 * bound);
        if let Some(b) = b {
            assert!(b.abs().max().double_value(&[]) <= bound);
        }
    }
    let x = Tensor::ones([4, 16], (Kind::Float, Device::Cpu));
    let y = mlp.forward(&x).unwrap();
    y.sum(Kind::Float).backward();
    for v in vs.trainable_variables() {
        assert!(v.grad().defined());
    }
    // wrong width: an error naming both widths, not a panic
    let e = mlp
        .forward(&Tensor::ones([4, 15], (Kind::Float, Device::Cpu)))
        .unwrap_err();
    assert!(
        e.to_string().contains("[4, 15]") && e.to_string().contains("16"),
        "{e}"
    );
    // concatenated inputs
    let a = Tensor::ones([4, 10], (Kind::Float, Device::Cpu));
    let b = Tensor::ones([4, 6], (Kind::Float, Device::Cpu));
    assert!(mlp.forward_cat(&[&a, &b]).unwrap().equal(&y.detach()));
    assert!(mlp.forward_cat(&[]).is_err());
    assert!(format!("{mlp:?}").contains("Linear(16 -> 64), Tanh"));
}

// ------------------------------------------------------------------ TdModule / FnModule

#[derive(Debug)]
struct TrainProbe;

impl nn::ModuleT for TrainProbe {
    fn forward_t(&self, xs: &Tensor, train: bool) -> Tensor {
        xs + if train { 1.0 } else { 0.0 }
    }
}

#[test]
fn td_module_wraps_tch_modules() {
    let vs = VarStore::new(Device::Cpu);
    let lin = nn::linear(vs.root(), 3, 4, Default::default());
    {
        let _guard = tch::no_grad_guard();
        lin.ws
            .shallow_clone()
            .copy_(&Tensor::eye(4, (Kind::Float, Device::Cpu)).narrow(1, 0, 3));
        let _ = lin.bs.as_ref().unwrap().shallow_clone().fill_(0.0);
    }
    // two in keys concatenated (1 + 2 features), output split into two keys
    let m = TdModule::new(lin, ["a", "b"], ["loc", "scale"]).unwrap();
    assert_eq!(m.in_keys(), keys(&["a", "b"]));
    assert_eq!(m.out_keys(), keys(&["loc", "scale"]));
    let td = TensorDict::new([2])
        .unwrap()
        .with("a", f32s(&[1.0, 2.0]).reshape([2, 1]))
        .unwrap()
        .with("b", f32s(&[3.0, 4.0, 5.0, 6.0]).reshape([2, 2]))
        .unwrap();
    let out = m.forward(td.clone()).unwrap();
    // y = [a, b0, b1, 0]
    assert_close(out.get("loc").unwrap(), &[1.0, 3.0, 2.0, 5.0], 1e-7);
    assert_close(out.get("scale").unwrap(), &[4.0, 0.0, 6.0, 0.0], 1e-7);
    // explicit split sizes
    let lin = m.into_module();
    let m = TdModule::new(
        lin,
        ["a", "b"],
        [NestedKey::from("x"), NestedKey::from(("nested", "y"))],
    )
    .unwrap()
    .with_split_sizes(vec![3, 1])
    .unwrap();
    let out = m.forward(td.clone()).unwrap();
    assert_eq!(out.get("x").unwrap().size(), vec![2, 3]);
    assert_eq!(out.get(("nested", "y")).unwrap().size(), vec![2, 1]);
    assert!(TdModule::new(m.into_module(), ["a"], ["x"])
        .unwrap()
        .with_split_sizes(vec![1, 2])
        .is_err());

    // a split that does not divide: an error naming the out keys
    let m = TdModule::new(nn::func(|x| x.shallow_clone()), ["b"], ["p", "q", "r"]).unwrap();
    let e = m.forward(td.clone()).unwrap_err();
    assert!(
        e.to_string().contains("\"p\", \"q\", \"r\"") && e.to_string().contains("multiple of 3"),
        "{e}"
    );

    // train flag: passed to ModuleT, default true, switched by set_train (and through containers)
    let mut m = TdModule::new(TrainProbe, ["a"], ["y"]).unwrap();
    assert!(m.train());
    assert_close(
        m.forward(td.clone()).unwrap().get("y").unwrap(),
        &[2.0, 3.0],
        0.0,
    );
    m.set_train(false);
    assert_close(
        m.forward(td.clone()).unwrap().get("y").unwrap(),
        &[1.0, 2.0],
        0.0,
    );
    let mut seq = TensorDictSequential::new().with(
        TdModule::new(TrainProbe, ["a"], ["y"])
            .unwrap()
            .with_train(false),
    );
    seq.set_train(true);
    assert_close(
        seq.forward(td.clone()).unwrap().get("y").unwrap(),
        &[2.0, 3.0],
        0.0,
    );
    assert!(TensorModule::forward_many(&TrainProbe, &[&f32s(&[1.0])], false).is_ok());
}

#[test]
fn td_module_turns_a_tch_panic_into_an_error() {
    let vs = VarStore::new(Device::Cpu);
    let lin = nn::linear(vs.root(), 3, 2, Default::default());
    let m = TdModule::new(lin, ["obs"], ["out"]).unwrap();
    let td = TensorDict::new([5])
        .unwrap()
        .with("obs", Tensor::zeros([5, 4], (Kind::Float, Device::Cpu)))
        .unwrap();
    let e = m.forward(td).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }));
    assert!(
        e.to_string().contains("panicked") && e.to_string().contains("[5, 4]"),
        "{e}"
    );
}

#[test]
fn missing_in_keys_name_the_key_and_the_available_keys() {
    let td = TensorDict::new([2])
        .unwrap()
        .with(
            "observation",
            Tensor::zeros([2, 3], (Kind::Float, Device::Cpu)),
        )
        .unwrap()
        .with(
            ("agent", "obs"),
            Tensor::zeros([2, 3], (Kind::Float, Device::Cpu)),
        )
        .unwrap();
    let check = |e: Error, key: &str, op: &str| {
        let s = e.to_string();
        assert!(matches!(e, Error::KeyNotFound { .. }), "{s}");
        assert!(s.contains(key), "{s}");
        assert!(s.contains(op), "{s}");
    };
    let f = from_fn(["obs"], ["y"], |x: &[&Tensor]| {
        Ok(vec![x[0].shallow_clone()])
    })
    .unwrap();
    let e = f.forward(td.clone()).unwrap_err();
    check(e, "\"obs\"", "FnModule::forward");
    assert!(f
        .forward(td.clone())
        .unwrap_err()
        .to_string()
        .contains("\"observation\""));

    let vs = VarStore::new(Device::Cpu);
    let mlp = MLP::new(&vs.root(), &MlpConfig::new(3, 1)).unwrap();
    let m = TdModule::new(mlp, [("agent", "observation")], ["v"]).unwrap();
    let e = m.forward(td.clone()).unwrap_err();
    // the level that exists is listed with its keys
    check(e, "(\"agent\", \"observation\")", "TdModule::forward");
    assert!(m
        .forward(td.clone())
        .unwrap_err()
        .to_string()
        .contains("(\"agent\", \"obs\")"));

    let actor =
        ProbabilisticActor::from_params(DistributionBuilder::normal("loc", "scale").unwrap());
    let e = actor.forward(td.clone()).unwrap_err();
    check(e, "\"loc\"", "ProbabilisticActor::get_dist");

    let seq = TensorDictSequential::new().with(f);
    check(
        seq.forward(td.clone()).unwrap_err(),
        "\"obs\"",
        "FnModule::forward",
    );

    let npe = NormalParamExtractor::new();
    check(
        npe.forward(td).unwrap_err(),
        "\"param\"",
        "NormalParamExtractor::forward",
    );
}

#[test]
fn outputs_are_checked_against_the_batch_size() {
    let td = TensorDict::new([3])
        .unwrap()
        .with("x", Tensor::zeros([3, 2], (Kind::Float, Device::Cpu)))
        .unwrap();
    // a wrong leading dim: BatchSizeMismatch naming the out key; nothing is written
    let f = from_fn(["x"], ["ok", "bad"], |x: &[&Tensor]| {
        Ok(vec![x[0].shallow_clone(), x[0].f_narrow(0, 0, 2)?])
    })
    .unwrap();
    let e = f.forward(td.clone()).unwrap_err();
    assert!(matches!(e, Error::BatchSizeMismatch { .. }), "{e}");
    assert!(
        e.to_string().contains("\"bad\"") && e.to_string().contains("[2, 2]"),
        "{e}"
    );
    // the wrong number of outputs
    let f = from_fn(["x"], ["a", "b"], |x: &[&Tensor]| {
        Ok(vec![x[0].shallow_clone()])
    })
    .unwrap();
    let e = f.forward(td.clone()).unwrap_err();
    assert!(
        e.to_string()
            .contains("1 output(s) for 2 out key(s) [\"a\", \"b\"]"),
        "{e}"
    );
    // a scalar output for a batched td
    let f = from_fn(["x"], ["s"], |x: &[&Tensor]| {
        Ok(vec![x[0].sum(Kind::Float)])
    })
    .unwrap();
    assert!(matches!(
        f.forward(td).unwrap_err(),
        Error::BatchSizeMismatch { .. }
    ));
    // empty keys are refused at construction
    assert!(from_fn(
        Vec::<&str>::new(),
        [Vec::<&str>::new()],
        |_: &[&Tensor]| Ok(vec![])
    )
    .is_err());
    assert!(TdModule::new(nn::func(|x| x.shallow_clone()), Vec::<&str>::new(), ["y"]).is_err());
}

// ------------------------------------------------------------------ sequential

#[test]
fn sequential_key_bookkeeping() {
    let id = |i: &[&str], o: &[&str]| {
        let n = o.len();
        from_fn(i.to_vec(), o.to_vec(), move |x: &[&Tensor]| {
            Ok((0..n).map(|_| x[0].shallow_clone()).collect())
        })
        .unwrap()
    };
    let seq = TensorDictSequential::new()
        .with(id(&["obs"], &["h", "loc"]))
        .with(id(&["h", "extra", "obs"], &["loc"]))
        .with(id(&["loc", "extra", "mask"], &["action", "h"]));
    assert_eq!(seq.len(), 3);
    assert_eq!(seq.in_keys(), keys(&["obs", "extra", "mask"]));
    // each key once, at its last write
    assert_eq!(seq.out_keys(), keys(&["loc", "action", "h"]));
    let e = seq.select_out_keys(["nope"]).unwrap_err();
    assert!(matches!(e, Error::KeyNotFound { .. }));
    assert!(
        e.to_string().contains("\"nope\"") && e.to_string().contains("\"action\""),
        "{e}"
    );

    let mut seq = TensorDictSequential::new()
        .with(id(&["obs"], &["h"]))
        .with(id(&["h"], &["action"]))
        .select_out_keys(["action"])
        .unwrap();
    assert_eq!(seq.out_keys(), keys(&["action"]));
    assert_eq!(seq.all_out_keys(), keys(&["h", "action"]));
    let td = TensorDict::new([1])
        .unwrap()
        .with("obs", f32s(&[1.0]))
        .unwrap();
    let out = seq.forward(td.clone()).unwrap();
    assert_eq!(
        out.keys(torchrl::tensordict::KeysOptions::nested_leaves()),
        keys(&["obs", "action"])
    );
    seq.reset_out_keys();
    let out = seq.forward(td.clone()).unwrap();
    assert_eq!(
        out.keys(torchrl::tensordict::KeysOptions::nested_leaves()),
        keys(&["obs", "h", "action"])
    );
    // an empty sequence passes the tensordict through
    let empty = TensorDictSequential::new();
    assert!(empty.is_empty() && empty.in_keys().is_empty() && empty.out_keys().is_empty());
    assert_eq!(
        empty
            .forward(td)
            .unwrap()
            .keys(torchrl::tensordict::KeysOptions::nested_leaves()),
        keys(&["obs"])
    );
    // nested sequences
    let inner = TensorDictSequential::new().with(id(&["obs"], &["h"]));
    let outer = TensorDictSequential::new()
        .with(inner)
        .with(id(&["h"], &["a"]));
    assert_eq!(outer.in_keys(), keys(&["obs"]));
    assert!(format!("{outer:?}").contains("2 modules"));
}

// ------------------------------------------------------------------ actors

/// A module writing fixed `loc`/`scale` of batch 3 from `"observation"`.
fn fixed_loc_scale(loc: Tensor, scale: Tensor) -> impl TensorDictModule {
    from_fn(
        ["observation"],
        ["loc", "scale"],
        move |_x: &[&Tensor]| Ok(vec![loc.shallow_clone(), scale.shallow_clone()]),
    )
    .unwrap()
}

fn obs_td(batch: i64) -> TensorDict {
    TensorDict::new([batch])
        .unwrap()
        .with(
            "observation",
            Tensor::zeros([batch, 3], (Kind::Float, Device::Cpu)),
        )
        .unwrap()
}

#[test]
fn deterministic_tanh_normal_actor_gives_the_mode() {
    // c + h tanh(loc) with low = [-1, 0], high = [1, 4]: c = [0, 2], h = [1, 2]
    let loc = f32s(&[0.5, -1.0, 0.0, 2.0, -3.0, 0.25]).reshape([3, 2]);
    let scale = f32s(&[1.0; 6]).reshape([3, 2]);
    let builder = DistributionBuilder::tanh_normal_with_bounds(
        "loc",
        "scale",
        &f32s(&[-1.0, 0.0]),
        &f32s(&[1.0, 4.0]),
    )
    .unwrap();
    let actor =
        ProbabilisticActor::new(fixed_loc_scale(loc, scale), builder).with_return_log_prob(true);
    assert_eq!(actor.exploration_type(), ExplorationType::Deterministic);
    let out = actor.forward(obs_td(3)).unwrap();
    let l = [0.5f64, -1.0, 0.0, 2.0, -3.0, 0.25];
    let expect: Vec<f64> = l
        .iter()
        .enumerate()
        .map(|(i, x)| {
            if i % 2 == 0 {
                x.tanh()
            } else {
                2.0 + 2.0 * x.tanh()
            }
        })
        .collect();
    let action = out.get("action").unwrap();
    assert_close(action, &expect, 1e-6);
    // the written log-prob is dist.log_prob(action), summed over the action dim
    let dist = actor.get_dist(&out).unwrap();
    assert_eq!(dist.event_shape(), &[2]);
    let lp = out.get("action_log_prob").unwrap();
    assert_eq!(lp.size(), vec![3]);
    assert!(lp.equal(&dist.log_prob(action).unwrap()));
    assert!(actor.log_prob(&out).unwrap().equal(lp));
    // Mode is the same for a TanhNormal; Mean has no closed form -> Monte Carlo estimate
    let mode = actor
        .forward_with(obs_td(3), ExplorationType::Mode, &mut Generator::new(0))
        .unwrap();
    assert!(mode.get("action").unwrap().equal(action));
    let mean = actor
        .forward_with(obs_td(3), ExplorationType::Mean, &mut Generator::new(0))
        .unwrap();
    let mc = TanhNormal::new(
        &f32s(&[0.5, -1.0, 0.0, 2.0, -3.0, 0.25]).reshape([3, 2]),
        &f32s(&[1.0; 6]).reshape([3, 2]),
        &f32s(&[-1.0, 0.0]),
        &f32s(&[1.0, 4.0]),
    )
    .unwrap()
    .mean_estimate(&mut Generator::new(0), 1000)
    .unwrap();
    assert!(mean.get("action").unwrap().allclose(&mc, 1e-6, 1e-6, false));
    assert!(actor.with_n_empirical_estimate(0).is_err());
}

#[test]
fn random_actor_is_seeded_and_reparameterised() {
    let vs = VarStore::new(Device::Cpu);
    let mlp = MLP::new(
        &vs.root(),
        &MlpConfig::new(3, 4).with_depth(1).with_num_cells(8),
    )
    .unwrap();
    let net = TensorDictSequential::new()
        .with(TdModule::new(mlp, ["observation"], ["param"]).unwrap())
        .with(NormalParamExtractor::new());
    let mut actor = ProbabilisticActor::new(
        net,
        DistributionBuilder::tanh_normal("loc", "scale", -1.0, 1.0).unwrap(),
    )
    .with_exploration_type(ExplorationType::Random)
    .with_return_log_prob(true)
    .with_seed(7);
    assert_eq!(actor.in_keys(), keys(&["observation"]));
    assert_eq!(
        actor.out_keys(),
        keys(&["param", "loc", "scale", "action", "action_log_prob"])
    );
    let obs = |b| {
        TensorDict::new([b])
            .unwrap()
            .with(
                "observation",
                Tensor::ones([b, 3], (Kind::Float, Device::Cpu)),
            )
            .unwrap()
    };
    let x1 = actor.forward(obs(64)).unwrap();
    let a_tensor = x1.get("action").unwrap().shallow_clone();
    // the generator advances between calls
    let x2 = actor.forward(obs(64)).unwrap();
    assert!(!x2.get("action").unwrap().equal(&a_tensor));
    // same seed, same actions (reseeded, or an external generator)
    actor.set_seed(7);
    let again = actor.forward(obs(64)).unwrap();
    assert!(again.get("action").unwrap().equal(&a_tensor));
    let ext = actor
        .forward_with(obs(64), ExplorationType::Random, &mut Generator::new(7))
        .unwrap();
    assert!(ext.get("action").unwrap().equal(&a_tensor));
    let other = actor
        .forward_with(obs(64), ExplorationType::Random, &mut Generator::new(8))
        .unwrap();
    assert!(!other.get("action").unwrap().equal(&a_tensor));
    // in bounds, log-prob = dist.log_prob(action)
    assert!(a_tensor.abs().max().double_value(&[]) < 1.0);
    let dist = actor.get_dist(&x1).unwrap();
    assert!(dist
        .log_prob(&a_tensor)
        .unwrap()
        .equal(x1.get("action_log_prob").unwrap()));
    // forward keeps gradients (rsample, as TorchRL); as_policy does not build a graph
    assert!(a_tensor.requires_grad());
    assert!(x1.get("action_log_prob").unwrap().requires_grad());
    let mut policy = actor.as_policy();
    let p = policy(obs(4)).unwrap();
    assert!(!p.get("action").unwrap().requires_grad());
    assert!(!p.get("action_log_prob").unwrap().requires_grad());
}

#[test]
fn categorical_actors_respect_masks() {
    let logits = f32s(&[5.0, 0.0, 0.0, 1.0])
        .reshape([1, 4])
        .expand([2000, 4], false);
    let mask_row = [false, true, true, true];
    let mask = Tensor::from_slice(&mask_row)
        .reshape([1, 4])
        .expand([2000, 4], false);
    let module = {
        let (l, m) = (logits.shallow_clone(), mask.shallow_clone());
        from_fn(
            ["observation"],
            ["logits", "mask"],
            move |_x: &[&Tensor]| Ok(vec![l.shallow_clone(), m.shallow_clone()]),
        )
        .unwrap()
    };
    let actor = ProbabilisticActor::new(
        module,
        DistributionBuilder::masked_categorical("logits", "mask").unwrap(),
    )
    .with_exploration_type(ExplorationType::Random)
    .with_return_log_prob(true)
    .with_seed(3);
    let out = actor.forward(obs_td(2000)).unwrap();
    let a = out.get("action").unwrap();
    assert_eq!(a.kind(), Kind::Int64);
    assert_eq!(a.size(), vec![2000]);
    // class 0 (the largest logit) is masked out: never drawn
    assert_eq!(a.eq(0).sum(Kind::Int64).int64_value(&[]), 0);
    // class 3 has probability e / (e + 2)
    let frac = a
        .eq(3)
        .to_kind(Kind::Double)
        .mean(Kind::Double)
        .double_value(&[]);
    let p3 = std::f64::consts::E / (std::f64::consts::E + 2.0);
    assert!((frac - p3).abs() < 0.04, "{frac} vs {p3}");
    let lp = out.get("action_log_prob").unwrap();
    assert!(lp.le(0.0).all().int64_value(&[]) == 1 && lp.isfinite().all().int64_value(&[]) == 1);
    // deterministic: the best allowed class
    let det = actor
        .forward_with(
            obs_td(2000),
            ExplorationType::Deterministic,
            &mut Generator::new(0),
        )
        .unwrap();
    assert_eq!(det.get("action").unwrap().eq(3).all().int64_value(&[]), 1);
    // Mean has no meaning for classes: an error, not a Monte-Carlo estimate
    assert!(actor
        .forward_with(obs_td(2000), ExplorationType::Mean, &mut Generator::new(0))
        .is_err());

    // one-hot: one-hot rows, masked classes never set
    let actor = ProbabilisticActor::from_params(
        DistributionBuilder::masked_one_hot_categorical("logits", "mask").unwrap(),
    )
    .with_exploration_type(ExplorationType::Random);
    assert_eq!(actor.in_keys(), keys(&["logits", "mask"]));
    let td = TensorDict::new([2000])
        .unwrap()
        .with("logits", logits)
        .unwrap()
        .with("mask", mask)
        .unwrap();
    let a = actor
        .forward(td)
        .unwrap()
        .get("action")
        .unwrap()
        .shallow_clone();
    assert_eq!(a.size(), vec![2000, 4]);
    assert_eq!(
        a.sum_dim_intlist(-1, false, Kind::Int64)
            .eq(1)
            .all()
            .int64_value(&[]),
        1
    );
    assert_eq!(a.select(1, 0).sum(Kind::Int64).int64_value(&[]), 0);
}

#[test]
fn actor_keys_and_builders() {
    let actor = ProbabilisticActor::from_params(DistributionBuilder::delta("param").unwrap())
        .with_action_key(("agent", "action"))
        .unwrap()
        .with_return_log_prob(true);
    assert_eq!(
        actor.log_prob_key(),
        NestedKey::from(("agent", "action_log_prob"))
    );
    assert_eq!(
        actor.out_keys(),
        vec![
            NestedKey::from(("agent", "action")),
            NestedKey::from(("agent", "action_log_prob"))
        ]
    );
    let actor = actor.with_log_prob_key("lp").unwrap();
    assert_eq!(actor.log_prob_key(), NestedKey::from("lp"));
    let td = TensorDict::new([2])
        .unwrap()
        .with("param", f32s(&[0.5, -0.5]).reshape([2, 1]))
        .unwrap();
    let out = actor.forward(td).unwrap();
    assert_close(out.get(("agent", "action")).unwrap(), &[0.5, -0.5], 0.0);
    // a point mass: +inf at its own value, one per batch element (the last dim is the event)
    assert_eq!(vals(out.get("lp").unwrap()), vec![f64::INFINITY; 2]);
    assert!(out.contains("lp"));
    assert!(actor.with_action_key(Vec::<&str>::new()).is_err());

    // Normal: deterministic = loc, log_prob per dim (scalar events)
    let actor =
        ProbabilisticActor::from_params(DistributionBuilder::normal("loc", "scale").unwrap())
            .with_return_log_prob(true);
    let td = TensorDict::new([1])
        .unwrap()
        .with("loc", f32s(&[1.0, 2.0]).reshape([1, 2]))
        .unwrap()
        .with("scale", f32s(&[1.0, 2.0]).reshape([1, 2]))
        .unwrap();
    let out = actor.forward(td).unwrap();
    assert_close(out.get("action").unwrap(), &[1.0, 2.0], 0.0);
    let ln_sqrt_2pi = 0.5 * (2.0 * std::f64::consts::PI).ln();
    assert_close(
        out.get("action_log_prob").unwrap(),
        &[-ln_sqrt_2pi, -ln_sqrt_2pi - 2.0f64.ln()],
        1e-6,
    );

    // a custom builder
    let b = DistributionBuilder::custom("Fixed", ["loc"], |td: &TensorDict| {
        let loc = td.get_or_err("loc")?;
        Ok(Box::new(torchrl::modules::distributions::Normal::new(
            loc,
            &loc.ones_like(),
        )?) as Box<dyn Distribution>)
    })
    .unwrap();
    assert_eq!(b.name(), "Fixed");
    assert!(format!("{b:?}").contains("Fixed(in_keys=[\"loc\"])"));

    // tanh_normal bounds are validated
    assert!(DistributionBuilder::tanh_normal("loc", "scale", 1.0, 1.0).is_err());
    assert!(DistributionBuilder::tanh_normal("loc", "scale", 0.0, f64::INFINITY).is_err());
}

#[test]
fn tanh_normal_from_spec_strips_batch_dims() {
    let env = PendulumEnv::new(&[4], Device::Cpu).unwrap();
    let spec = env
        .specs()
        .group(SpecGroup::Action)
        .get_or_err("action")
        .unwrap();
    assert_eq!(spec.shape(), &[4, 1]);
    let b = DistributionBuilder::tanh_normal_from_spec("loc", "scale", spec, 1).unwrap();
    // loc of any batch shape, e.g. a rollout's [4, 10, 1]
    let td = TensorDict::new([4, 10])
        .unwrap()
        .with(
            "loc",
            Tensor::full([4, 10, 1], 30.0, (Kind::Float, Device::Cpu)),
        )
        .unwrap()
        .with(
            "scale",
            Tensor::ones([4, 10, 1], (Kind::Float, Device::Cpu)),
        )
        .unwrap();
    let d = b.build(&td).unwrap();
    let m = d.mode().unwrap();
    assert_eq!(m.size(), vec![4, 10, 1]);
    assert!(m.lt(2.0).all().int64_value(&[]) == 1 && m.gt(1.99).all().int64_value(&[]) == 1);
    // errors: not Bounded, too many batch dims, bounds that differ across the batch
    let unb = TensorSpec::from(Unbounded::new().with_shape([4, 1]).unwrap());
    let e = DistributionBuilder::tanh_normal_from_spec("loc", "scale", &unb, 1).unwrap_err();
    assert!(e.to_string().contains("Unbounded"), "{e}");
    assert!(DistributionBuilder::tanh_normal_from_spec("loc", "scale", spec, 3).is_err());
    let varying = TensorSpec::from(
        Bounded::from_tensors(
            f32s(&[-1.0, -2.0]).reshape([2, 1]),
            f32s(&[1.0, 2.0]).reshape([2, 1]),
        )
        .unwrap(),
    );
    let e = DistributionBuilder::tanh_normal_from_spec("loc", "scale", &varying, 1).unwrap_err();
    assert!(e.to_string().contains("differ"), "{e}");
    // with no batch dim dropped, per-element bounds are kept
    assert!(DistributionBuilder::tanh_normal_from_spec("loc", "scale", &varying, 0).is_ok());
}

#[test]
fn normal_param_extractor_module_and_errors() {
    let npe = NormalParamExtractor::new()
        .with_keys(("agent", "param"), "mu", ("agent", "sigma"))
        .unwrap();
    assert_eq!(npe.in_keys(), vec![NestedKey::from(("agent", "param"))]);
    assert_eq!(
        npe.out_keys(),
        vec![NestedKey::from("mu"), NestedKey::from(("agent", "sigma"))]
    );
    let td = TensorDict::new([1])
        .unwrap()
        .with(("agent", "param"), f32s(&[0.3, 0.0]).reshape([1, 2]))
        .unwrap();
    let out = npe.forward(td).unwrap();
    assert_close(out.get("mu").unwrap(), &[0.3], 1e-7);
    assert_close(out.get(("agent", "sigma")).unwrap(), &[1.0], 1e-6);
    let e = NormalParamExtractor::new()
        .extract(&f32s(&[1.0, 2.0, 3.0]))
        .unwrap_err();
    assert!(
        e.to_string().contains("[3]") && e.to_string().contains("even"),
        "{e}"
    );
    assert!(NormalParamExtractor::new()
        .with_keys("p", "x", "x")
        .is_err());
    // the lower bound applies
    let (_, s) = NormalParamExtractor::new()
        .with_scale_mapping(ScaleMapping::ReLU)
        .with_scale_lb(0.1)
        .extract(&f32s(&[0.0, -5.0]))
        .unwrap();
    assert_close(&s, &[0.1], 1e-7);
}

#[test]
fn value_operator_keys() {
    let vs = VarStore::new(Device::Cpu);
    let v = ValueOperator::new(MLP::new(&vs.root(), &MlpConfig::new(4, 1)).unwrap());
    assert_eq!(v.in_keys(), keys(&["observation"]));
    assert_eq!(v.out_keys(), keys(&["state_value"]));
    let v = v.with_in_keys(["observation", "action"]).unwrap();
    assert_eq!(v.out_keys(), keys(&["state_action_value"]));
    let v = v
        .with_out_key("q")
        .unwrap()
        .with_in_keys(["observation", "action"])
        .unwrap();
    assert_eq!(v.out_keys(), keys(&["q"]), "an explicit out key is kept");
    assert!(v.with_in_keys(Vec::<&str>::new()).is_err());
    let v = ValueOperator::new(MLP::new(&vs.root().sub("v"), &MlpConfig::new(3, 1)).unwrap());
    let td = obs_td(5);
    let out = v.forward(td).unwrap();
    assert_eq!(out.get("state_value").unwrap().size(), vec![5, 1]);
    assert_eq!(v.module().in_features(), 3);
}

// ------------------------------------------------------------------ rollouts

#[test]
fn pendulum_rollout_with_a_tanh_normal_actor() {
    let mut env = PendulumEnv::new(&[3], Device::Cpu).unwrap();
    env.set_seed(1).unwrap();
    let vs = VarStore::new(Device::Cpu);
    let mlp = MLP::new(
        &vs.root(),
        &MlpConfig::new(3, 2).with_depth(2).with_num_cells(16),
    )
    .unwrap();
    let ext = NormalParamExtractor::new();
    let net = from_fn(["observation"], ["loc", "scale"], move |x: &[&Tensor]| {
        let (loc, scale) = ext.extract(&mlp.forward(x[0])?)?;
        Ok(vec![loc, scale])
    })
    .unwrap();
    let spec = env
        .specs()
        .group(SpecGroup::Action)
        .get_or_err("action")
        .unwrap()
        .clone();
    let actor = ProbabilisticActor::new(
        net,
        DistributionBuilder::tanh_normal_from_spec("loc", "scale", &spec, 1).unwrap(),
    )
    .with_exploration_type(ExplorationType::Random)
    .with_return_log_prob(true)
    .with_seed(5);
    let traj = {
        let mut policy = actor.as_policy();
        env.rollout(30, Some(&mut policy), &RolloutConfig::default())
            .unwrap()
    };
    assert_eq!(traj.batch_size(), &[3, 30]);
    let a = traj.get("action").unwrap();
    assert!(a.abs().max().double_value(&[]) < 2.0);
    // every action is in the spec (after dropping the time dim into the batch)
    let flat = a.permute([1, 0, 2]).contiguous();
    for t in 0..30 {
        assert!(spec.is_in(&flat.get(t).into()).unwrap());
    }
    // deterministic rollouts are reproducible
    let mut actor = actor;
    actor.set_exploration_type(ExplorationType::Deterministic);
    let mut run = || {
        env.set_seed(2).unwrap();
        let mut policy = actor.as_policy();
        env.rollout(10, Some(&mut policy), &RolloutConfig::default())
            .unwrap()
    };
    let (r1, r2) = (run(), run());
    assert!(r1.get("action").unwrap().equal(r2.get("action").unwrap()));
}

#[test]
fn cartpole_rollout_with_a_one_hot_actor() {
    let mut env = CartPoleEnv::new(&[4], Device::Cpu).unwrap();
    env.set_seed(0).unwrap();
    let vs = VarStore::new(Device::Cpu);
    let mlp = MLP::new(
        &vs.root(),
        &MlpConfig::new(4, 2).with_depth(1).with_num_cells(8),
    )
    .unwrap();
    let actor = ProbabilisticActor::new(
        TdModule::new(mlp, ["observation"], ["logits"]).unwrap(),
        DistributionBuilder::one_hot_categorical("logits").unwrap(),
    )
    .with_exploration_type(ExplorationType::Random)
    .with_return_log_prob(true);
    let mut policy = actor.as_policy();
    let traj = env
        .rollout(20, Some(&mut policy), &RolloutConfig::no_break())
        .unwrap();
    let a = traj.get("action").unwrap();
    assert_eq!((a.size(), a.kind()), (vec![4, 20, 2], Kind::Int64));
    assert_eq!(
        a.sum_dim_intlist(-1, false, Kind::Int64)
            .eq(1)
            .all()
            .int64_value(&[]),
        1
    );
    // the loss view: log-probs of the stored actions under the current weights, with gradients
    let lp = actor.log_prob(&traj).unwrap();
    assert_eq!(lp.size(), vec![4, 20]);
    assert!(lp.requires_grad());
    assert!(lp.allclose(traj.get("action_log_prob").unwrap(), 1e-5, 1e-5, false));
    lp.sum(Kind::Float).backward();
    assert!(vs.trainable_variables().iter().all(|v| v.grad().defined()));
}

// ------------------------------------------------------------- the probabilistic family

/// An `ActorValueOperator` runs its trunk once for both heads; its policy side is a
/// `ProbabilisticTensorDictModule` like the actor, usable behind `dyn`.
#[test]
fn actor_value_operator_and_the_probabilistic_trait() -> torchrl::Result<()> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use torchrl::modules::{ActorValueOperator, ProbabilisticTensorDictModule};
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    // hidden = obs + 1
    let trunk = from_fn(["obs"], ["hidden"], move |x: &[&Tensor]| {
        c.fetch_add(1, Ordering::SeqCst);
        Ok(vec![x[0].f_add_scalar(1.0)?])
    })?;
    let head = from_fn(["hidden"], ["loc", "scale"], |x: &[&Tensor]| {
        Ok(vec![
            x[0].shallow_clone(),
            x[0].f_ones_like()?.f_mul_scalar(2.0)?,
        ])
    })?;
    let policy = ProbabilisticActor::new(head, DistributionBuilder::normal("loc", "scale")?)
        .with_return_log_prob(true);
    let value = from_fn(["hidden"], ["state_value"], |x: &[&Tensor]| {
        Ok(vec![x[0].f_mul_scalar(-1.0)?])
    })?;
    let op = ActorValueOperator::new(trunk, policy, value);
    assert_eq!(op.in_keys(), vec![NestedKey::from("obs")]);
    let td = TensorDict::new([2])?.with("obs", Tensor::from_slice(&[0.0f64, 2.0]))?;

    let out = op.forward(td.clone())?;
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(vals(out.get_or_err("action")?), vec![1.0, 3.0]); // deterministic: the mean
    assert_eq!(vals(out.get_or_err("state_value")?), vec![-1.0, -3.0]);
    // log N(μ; μ, 2) = -ln 2 - ½ ln 2π
    let lp = -(2.0f64).ln() - 0.5 * (2.0 * std::f64::consts::PI).ln();
    for v in vals(out.get_or_err("action_log_prob")?) {
        assert!((v - lp).abs() < 1e-12);
    }

    // the policy operator alone: the trunk, then the policy head (no value)
    let pol = op.forward_policy(td.clone())?;
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert!(pol.contains("action") && !pol.contains("state_value"));

    // behind the trait object: distribution keys, log-probs and entropy
    let as_dyn: &dyn ProbabilisticTensorDictModule = &op;
    assert_eq!(
        as_dyn.dist_keys(),
        vec![NestedKey::from("loc"), NestedKey::from("scale")]
    );
    let scored = td
        .clone()
        .with("action", Tensor::from_slice(&[1.0f64, 3.0]))?;
    for v in vals(&as_dyn.log_prob(&scored)?) {
        assert!((v - lp).abs() < 1e-12);
    }
    let h = 0.5 * (2.0 * std::f64::consts::PI * std::f64::consts::E).ln() + (2.0f64).ln();
    for v in vals(&as_dyn.entropy(&td)?) {
        assert!((v - h).abs() < 1e-12);
    }
    let mut gen = Generator::new(0);
    let sampled = as_dyn.forward_with(td, ExplorationType::Random, &mut gen)?;
    assert_eq!(sampled.get_or_err("action")?.size(), vec![2]);
    Ok(())
}
