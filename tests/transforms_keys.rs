//! Key, dtype and normalisation transforms: DTypeCast / DoubleToFloat, ObservationNorm,
//! CatTensors, RenameTransform, ExcludeTransform, SelectTransform, UnsqueezeTransform.
//!
//! - replay of `specs/transforms_keys_cases.json` (recorded from TorchRL 0.14.1 by
//!   `specs/record_transforms_keys.py` on a Python mirror of [`KeysEnv`]): key lists, transformed
//!   specs, rollouts, statistics and errors;
//! - `check_env_specs` on every transform at batch `[]` and `[4]`, and the base env's specs
//!   unchanged after wrapping;
//! - hand-derived edge cases.

mod common;

use std::collections::BTreeSet;

use common::{
    key_from_json, key_names, keys_from_json, kind_from_name, missing_facts, td_from_json,
    tensor_from_json, Case, Failures, Value,
};
use tch::{Device, Kind, Tensor};
use torchrl::envs::transforms::{
    CatTensors, DTypeCast, DoubleToFloat, ExcludeTransform, InitStats, ObservationNorm,
    RenameTransform, SelectTransform, Transform, TransformedEnv, UnsqueezeTransform,
};
use torchrl::envs::{EnvBase, EnvCore, EnvSpecs};
use torchrl::specs::{Bounded, Composite, TensorSpec, Unbounded};
use torchrl::tensordict::KeysOptions;
use torchrl::{check_env_specs, Error, NestedKey, Result, RolloutConfig, TensorDict};

// ====================================================================== the test env

/// The configuration of [`KeysEnv`] (the `env` object of the case file).
#[derive(Clone, Debug)]
struct EnvCfg {
    batch: Vec<i64>,
    max_steps: i64,
    dtype: Kind,
    act_dtype: Kind,
    obs_bounds: Option<(f64, f64)>,
}

impl EnvCfg {
    fn new(dtype: Kind) -> Self {
        EnvCfg {
            batch: vec![],
            max_steps: 100,
            dtype,
            act_dtype: dtype,
            obs_bounds: None,
        }
    }
    fn batch(mut self, b: &[i64]) -> Self {
        self.batch = b.to_vec();
        self
    }
    fn max_steps(mut self, n: i64) -> Self {
        self.max_steps = n;
        self
    }
    fn bounds(mut self, lo: f64, hi: f64) -> Self {
        self.obs_bounds = Some((lo, hi));
        self
    }
}

/// A counting env, mirrored by `KeysEnv` in `specs/record_transforms_keys.py`:
/// observations `observation` = count (`[*b, 1]`), `b` = count (`[*b, 2]`), `a` = -count
/// (`[*b, 3]`) of dtype `dtype`; action `Bounded(-1, 1, [*b, 1])` of dtype `act_dtype` (checked,
/// and returned as the reward); done = terminated = count >= max_steps.
struct KeysEnv {
    core: EnvCore,
    cfg: EnvCfg,
    count: Tensor,
}

impl KeysEnv {
    fn new(cfg: &EnvCfg) -> Result<Self> {
        let b = cfg.batch.as_slice();
        let shape = |n: i64| -> Vec<i64> { [b, &[n]].concat() };
        let obs: TensorSpec = match cfg.obs_bounds {
            None => Unbounded::new()
                .with_shape(shape(1))?
                .with_dtype(cfg.dtype)?
                .into(),
            Some((lo, hi)) => Bounded::new(lo, hi, shape(1))?
                .with_dtype(cfg.dtype)?
                .into(),
        };
        let specs = EnvSpecs::new(b)?
            .with_observation("observation", obs)?
            .with_observation(
                "b",
                Unbounded::new()
                    .with_shape(shape(2))?
                    .with_dtype(cfg.dtype)?,
            )?
            .with_observation(
                "a",
                Unbounded::new()
                    .with_shape(shape(3))?
                    .with_dtype(cfg.dtype)?,
            )?
            .with_action(
                "action",
                Bounded::new(-1.0, 1.0, shape(1))?.with_dtype(cfg.act_dtype)?,
            )?
            .with_reward(
                "reward",
                Unbounded::new()
                    .with_shape(shape(1))?
                    .with_dtype(cfg.dtype)?,
            )?;
        Ok(KeysEnv {
            core: EnvCore::new(specs)?,
            cfg: cfg.clone(),
            count: Tensor::f_zeros(shape(1), (Kind::Float, Device::Cpu))?,
        })
    }

    fn out(&self) -> Result<TensorDict> {
        let b = self.cfg.batch.as_slice();
        let dt = self.cfg.dtype;
        let done = self.count.f_ge(self.cfg.max_steps as f64)?;
        let rep = |t: &Tensor, n: i64| -> Result<Tensor> {
            Ok(t.f_expand([b, &[n]].concat(), false)?
                .f_to_kind(dt)?
                .f_contiguous()?)
        };
        TensorDict::new(b)?
            .with(
                "observation",
                self.count.f_to_kind(dt)?.f_contiguous()?.copy(),
            )?
            .with("b", rep(&self.count, 2)?)?
            .with("a", rep(&self.count.f_neg()?, 3)?)?
            .with("done", done.shallow_clone())?
            .with("terminated", done)
    }
}

impl EnvBase for KeysEnv {
    fn core(&self) -> &EnvCore {
        &self.core
    }
    fn core_mut(&mut self) -> &mut EnvCore {
        &mut self.core
    }
    fn reset_impl(&mut self, td: Option<&TensorDict>) -> Result<TensorDict> {
        match td.and_then(|t| t.get("_reset")) {
            Some(m) => {
                let m = m.f_reshape(self.count.size())?;
                self.count = self.count.f_masked_fill(&m, 0.0)?;
            }
            None => self.count = self.count.f_zeros_like()?,
        }
        self.out()
    }
    fn step_impl(&mut self, td: &TensorDict) -> Result<TensorDict> {
        let action = td.get_or_err("action")?;
        if action.kind() != self.cfg.act_dtype {
            return Err(Error::DtypeMismatch {
                op: "KeysEnv::step (the base env checks its action)",
                key: "\"action\"".into(),
                expected: self.cfg.act_dtype,
                actual: action.kind(),
            });
        }
        self.count = self.count.f_add_scalar(1.0)?;
        let reward = action
            .f_to_kind(self.cfg.dtype)?
            .f_reshape(self.count.size())?
            .copy();
        let mut out = self.out()?;
        out.set("reward", reward)?;
        Ok(out)
    }
}

fn base(cfg: &EnvCfg) -> Result<KeysEnv> {
    KeysEnv::new(cfg)
}

/// Sets every action key to 0.5 (shape and dtype of the action spec), as the recorder's policy.
fn rollout_half(env: &mut impl EnvBase, steps: usize) -> Result<TensorDict> {
    let specs = env.specs().clone();
    let mut policy = move |mut td: TensorDict| -> Result<TensorDict> {
        for (k, s) in specs.action.leaves() {
            let kind = s.dtype().unwrap_or(Kind::Float);
            td.set(&k, Tensor::f_full(s.shape(), 0.5, (kind, Device::Cpu))?)?;
        }
        Ok(td)
    };
    env.rollout(steps, Some(&mut policy), &RolloutConfig::default())
}

/// Wraps, checks the specs through `check_env_specs` at batch `[]` and `[4]`, and checks that
/// the base env's specs are unchanged.
fn check_both_batches<T: Transform + 'static>(
    cfg: EnvCfg,
    make: impl Fn() -> Result<T>,
) -> Result<()> {
    for b in [vec![], vec![4]] {
        let env = base(&cfg.clone().batch(&b))?;
        let before = env.specs().clone();
        let mut env = TransformedEnv::new(env)?.with(make()?)?;
        check_env_specs(&mut env, Some(0)).map_err(|e| Error::InvalidArgument {
            op: "test",
            message: format!("batch {b:?}: {e}"),
        })?;
        assert!(
            env.base().specs() == &before,
            "batch {b:?}: the base env's specs changed after wrapping"
        );
    }
    Ok(())
}

fn k(s: &str) -> NestedKey {
    NestedKey::from(s)
}

fn sorted(keys: Vec<NestedKey>) -> Vec<NestedKey> {
    let mut keys = keys;
    keys.sort();
    keys
}

fn values(t: &Tensor) -> Vec<f64> {
    let flat = t.to_kind(Kind::Double).reshape([-1]);
    Vec::<f64>::try_from(&flat).unwrap_or_default()
}

fn err_text<T>(r: Result<T>) -> String {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    }
}

// ====================================================================== replay

/// Compares a tensor with its encoding: dtype, shape, then values (exact for integers and
/// bools, within 1e-4 for floats).
fn check_tensor_close(
    actual: &Tensor,
    expected: &Value,
    path: &str,
) -> std::result::Result<(), String> {
    let exp = tensor_from_json(expected)?;
    if actual.kind() != exp.kind() {
        return Err(format!(
            "{path}: dtype {:?}, expected {:?}",
            actual.kind(),
            exp.kind()
        ));
    }
    if actual.size() != exp.size() {
        return Err(format!(
            "{path}: shape {:?}, expected {:?}",
            actual.size(),
            exp.size()
        ));
    }
    let (a, e) = (values(actual), values(&exp));
    for (i, (x, y)) in a.iter().zip(&e).enumerate() {
        let ok = if matches!(exp.kind(), Kind::Float | Kind::Double) {
            (x - y).abs() <= 1e-4 * (1.0 + y.abs()) || (x.is_nan() && y.is_nan())
        } else {
            x == y
        };
        if !ok {
            return Err(format!(
                "{path}: value #{i} is {x}, expected {y} (all: {a:?} vs {e:?})"
            ));
        }
    }
    Ok(())
}

/// Compares every leaf of `td` with the recorded `[[key, tensor], ...]` (key sets must match).
fn check_leaves(td: &TensorDict, expected: &Value, path: &str) -> std::result::Result<(), String> {
    let exp = expected.as_array().ok_or("leaves is not a list")?;
    let mut exp_keys = BTreeSet::new();
    for pair in exp {
        let p = pair.as_array().ok_or("leaf is not a pair")?;
        let (key, t) = match p {
            [key, t] => (key_from_json(key)?, t),
            _ => return Err("leaf is not a pair".into()),
        };
        exp_keys.insert(key.clone());
        let actual = td
            .get(&key)
            .ok_or_else(|| format!("{path}: missing leaf {key}"))?;
        check_tensor_close(actual, t, &format!("{path}[{key}]"))?;
    }
    let act_keys: BTreeSet<NestedKey> = td
        .keys(torchrl::tensordict::KeysOptions::nested_leaves())
        .into_iter()
        .collect();
    if act_keys != exp_keys {
        let only_a: Vec<_> = act_keys.difference(&exp_keys).collect();
        let only_e: Vec<_> = exp_keys.difference(&act_keys).collect();
        return Err(format!(
            "{path}: leaf keys differ; only in Rust: {only_a:?}, only in Python: {only_e:?}"
        ));
    }
    Ok(())
}

/// Compares a spec group with the recorded `[[key, spec], ...]`: key set, then class, shape,
/// dtype and (Bounded) bounds of each leaf.
fn check_group(c: &Composite, expected: &Value, path: &str) -> std::result::Result<(), String> {
    let exp = expected.as_array().ok_or("group is not a list")?;
    let mut exp_keys = BTreeSet::new();
    for pair in exp {
        let (key, s) = match pair.as_array().ok_or("not a pair")? {
            [key, s] => (key_from_json(key)?, s),
            _ => return Err("not a pair".into()),
        };
        exp_keys.insert(key.clone());
        let spec = c
            .get(&key)
            .ok_or_else(|| format!("{path}: no spec at {key}"))?;
        let class = s["class"].as_str().ok_or("class")?;
        if spec.class_name() != class {
            return Err(format!(
                "{path}[{key}]: class {}, expected {class}",
                spec.class_name()
            ));
        }
        let shape: Vec<i64> = s["shape"]
            .as_array()
            .ok_or("shape")?
            .iter()
            .filter_map(Value::as_i64)
            .collect();
        if spec.shape() != shape.as_slice() {
            return Err(format!(
                "{path}[{key}]: shape {:?}, expected {shape:?}",
                spec.shape()
            ));
        }
        let dtype = kind_from_name(s["dtype"].as_str().ok_or("dtype")?)?;
        if spec.dtype() != Some(dtype) {
            return Err(format!(
                "{path}[{key}]: dtype {:?}, expected {dtype:?}",
                spec.dtype()
            ));
        }
        if let TensorSpec::Bounded(b) = spec {
            check_tensor_close(b.low(), &s["low"], &format!("{path}[{key}].low"))?;
            check_tensor_close(b.high(), &s["high"], &format!("{path}[{key}].high"))?;
        }
    }
    let act: BTreeSet<NestedKey> = c.keys(KeysOptions::nested_leaves()).into_iter().collect();
    if act != exp_keys {
        return Err(format!("{path}: spec keys {act:?}, expected {exp_keys:?}"));
    }
    Ok(())
}

fn env_cfg_from_json(v: &Value) -> std::result::Result<EnvCfg, String> {
    let dtype = kind_from_name(v["dtype"].as_str().unwrap_or("float32"))?;
    let act_dtype = match v["act_dtype"].as_str() {
        Some(s) => kind_from_name(s)?,
        None => dtype,
    };
    let batch = match v["batch"].as_array() {
        Some(a) => a.iter().filter_map(Value::as_i64).collect(),
        None => vec![],
    };
    let obs_bounds = match v["obs_bounds"].as_array() {
        Some([lo, hi]) => Some((lo.as_f64().ok_or("lo")?, hi.as_f64().ok_or("hi")?)),
        _ => None,
    };
    Ok(EnvCfg {
        batch,
        max_steps: v["max_steps"].as_i64().unwrap_or(100),
        dtype,
        act_dtype,
        obs_bounds,
    })
}

fn opt_keys(v: &Value) -> std::result::Result<Option<Vec<NestedKey>>, String> {
    if v.is_null() {
        Ok(None)
    } else {
        keys_from_json(v).map(Some)
    }
}

fn init_from_json(v: &Value) -> std::result::Result<InitStats, String> {
    let mut cfg = InitStats::new(v["num_iter"].as_i64().ok_or("num_iter")? as usize);
    if let Some(a) = v["reduce_dim"].as_array() {
        cfg = cfg.with_reduce_dim(a.iter().filter_map(Value::as_i64).collect::<Vec<_>>());
    }
    if let Some(c) = v["cat_dim"].as_i64() {
        cfg = cfg.with_cat_dim(c);
    }
    if !v["key"].is_null() {
        cfg = cfg.with_key(key_from_json(&v["key"])?);
    }
    Ok(cfg)
}

/// What building a transform from its descriptor gave.
enum Built {
    /// A transform.
    T(Box<dyn Transform>),
    /// An uninitialised ObservationNorm with the options of its `init_stats` call.
    Init(Box<ObservationNorm>, InitStats),
}

/// The transform of a descriptor (the vocabulary of `make_transform` in the recorder). The
/// outer error is a malformed descriptor, the inner one the library's answer.
fn build_transform(d: &Value) -> std::result::Result<Result<Built>, String> {
    let class = d["class"].as_str().ok_or("class")?;
    let in_keys = opt_keys(&d["in_keys"])?;
    let in_keys_inv = opt_keys(&d["in_keys_inv"])?;
    let boxed = |t: Box<dyn Transform>| Ok(Ok(Built::T(t)));
    match class {
        "DoubleToFloat" => {
            let mut t = DoubleToFloat::new();
            if let Some(k) = in_keys {
                t = t.with_in_keys(k);
            }
            if let Some(k) = in_keys_inv {
                t = t.with_in_keys_inv(k);
            }
            boxed(Box::new(t))
        }
        "ObservationNorm" => {
            let keys = in_keys.unwrap_or_default();
            let t = match (d["loc"].as_f64(), d["scale"].as_f64()) {
                (Some(l), Some(s)) => ObservationNorm::new(l, s, keys),
                _ => ObservationNorm::uninitialized(keys),
            };
            let t = match t {
                Ok(t) => t,
                Err(e) => return Ok(Err(e)),
            };
            let mut t = t.with_standard_normal(d["standard_normal"].as_bool().unwrap_or(false));
            if let Some(k) = in_keys_inv {
                t = t.with_in_keys_inv(k);
            }
            if d["init"].is_null() {
                boxed(Box::new(t))
            } else {
                Ok(Ok(Built::Init(Box::new(t), init_from_json(&d["init"])?)))
            }
        }
        "CatTensors" => {
            let mut t = CatTensors::new(in_keys.ok_or("CatTensors needs in_keys")?)
                .with_dim(d["dim"].as_i64().unwrap_or(-1))
                .with_del_keys(d["del_keys"].as_bool().unwrap_or(true))
                .with_sort(d["sort"].as_bool().unwrap_or(true));
            if !d["out_key"].is_null() {
                t = t.with_out_key(key_from_json(&d["out_key"])?);
            }
            boxed(Box::new(t))
        }
        "RenameTransform" => {
            let outs = opt_keys(&d["out_keys"])?.unwrap_or_default();
            let t = RenameTransform::new(in_keys.unwrap_or_default(), outs).and_then(|t| {
                match (&in_keys_inv, opt_keys(&d["out_keys_inv"])) {
                    (Some(i), Ok(Some(o))) => t.with_inverse(i.clone(), o),
                    _ => Ok(t),
                }
            });
            Ok(t.map(|t| {
                Built::T(Box::new(
                    t.with_create_copy(d["create_copy"].as_bool().unwrap_or(false)),
                ))
            }))
        }
        "ExcludeTransform" => boxed(Box::new(ExcludeTransform::new(keys_from_json(&d["keys"])?))),
        "SelectTransform" => boxed(Box::new(
            SelectTransform::new(keys_from_json(&d["keys"])?)
                .with_keep_rewards(d["keep_rewards"].as_bool().unwrap_or(true))
                .with_keep_dones(d["keep_dones"].as_bool().unwrap_or(true)),
        )),
        "UnsqueezeTransform" => {
            let mut t = UnsqueezeTransform::new(
                d["dim"].as_i64().ok_or("dim")?,
                in_keys.unwrap_or_default(),
            );
            if let Some(k) = in_keys_inv {
                t = t.with_in_keys_inv(k);
            }
            boxed(Box::new(t))
        }
        other => Err(format!("unknown transform class {other}")),
    }
}

/// Builds the env of an `env` case; `extra` receives what the recorder lists under `extra`.
fn build_env(
    a: &Value,
    extra: &mut Vec<(String, Vec<NestedKey>, Option<Tensor>)>,
) -> std::result::Result<Result<(TransformedEnv<KeysEnv>, EnvSpecs)>, String> {
    let cfg = env_cfg_from_json(&a["env"])?;
    let b = match base(&cfg) {
        Ok(b) => b,
        Err(e) => return Ok(Err(e)),
    };
    let before = b.specs().clone();
    let mut env = match TransformedEnv::new(b) {
        Ok(e) => e,
        Err(e) => return Ok(Err(e)),
    };
    for (i, d) in a["transforms"]
        .as_array()
        .ok_or("transforms")?
        .iter()
        .enumerate()
    {
        let built = match build_transform(d)? {
            Ok(b) => b,
            Err(e) => return Ok(Err(e)),
        };
        // As the recorder: append, then (ObservationNorm without statistics) init_stats on the
        // appended transform, from rollouts of the env up to it.
        let r = match built {
            Built::T(t) => env.append_boxed(t),
            Built::Init(t, init) => env
                .append_boxed(t)
                .and_then(|()| ObservationNorm::init_stats_at(&mut env, i, &init)),
        };
        if let Err(e) = r {
            return Ok(Err(e));
        }
        // What the transform resolved (the recorder reads it back from the appended transform).
        let ts = env.transform();
        if let Some(t) = ts.get_as::<DTypeCast>(i) {
            extra.push((
                format!("{i}.in_keys"),
                t.in_keys().unwrap_or_default(),
                None,
            ));
            extra.push((
                format!("{i}.in_keys_inv"),
                t.in_keys_inv().unwrap_or_default(),
                None,
            ));
        }
        if let Some(t) = ts.get_as::<CatTensors>(i) {
            extra.push((
                format!("{i}.in_keys"),
                t.in_keys().unwrap_or_default(),
                None,
            ));
        }
        if let Some(t) = ts.get_as::<ObservationNorm>(i) {
            if let (Some(l), Some(s)) = (t.loc(), t.scale()) {
                extra.push((format!("{i}.loc"), vec![], Some(l.shallow_clone())));
                extra.push((format!("{i}.scale"), vec![], Some(s.shallow_clone())));
            }
        }
    }
    Ok(Ok((env, before)))
}

fn check_error<T>(case: &Case, r: Result<T>) -> std::result::Result<(), String> {
    let Some(exp) = case.expected_error() else {
        return match r {
            Ok(_) => Ok(()),
            Err(e) => Err(format!("unexpected error: {e}")),
        };
    };
    match r {
        Ok(_) => Err(format!(
            "expected a {} ({}), got success",
            exp.class, exp.message
        )),
        Err(e) => {
            let msg = e.to_string();
            let missing = missing_facts(&msg, &exp.facts, &key_names(&case.args));
            if missing.is_empty() {
                Ok(())
            } else {
                Err(format!(
                    "error message {msg:?} lacks {missing:?} (Python: {})",
                    exp.message
                ))
            }
        }
    }
}

fn replay_env(case: &Case) -> std::result::Result<(), String> {
    let mut extra = Vec::new();
    let built = build_env(&case.args, &mut extra)?;
    if case.expected_error().is_some() {
        return check_error(case, built.map(|_| ()));
    }
    let (mut env, before) = built.map_err(|e| format!("building the env failed: {e}"))?;
    let e = &case.expect;
    // key lists, in order: TorchRL sorts them by depth, then by dot-joined name
    let specs = env.specs().clone();
    for (name, got) in [
        ("observation", specs.observation_keys()),
        ("reward", specs.reward_keys()),
        ("done", specs.done_keys()),
        ("action", specs.action_keys()),
        ("state", specs.state_keys()),
    ] {
        let want = keys_from_json(&e["keys"][name])?;
        if got != want {
            return Err(format!(
                "{name} keys {got:?}, expected {want:?} (in this order)"
            ));
        }
    }
    for (name, c) in [
        ("observation", &specs.observation),
        ("reward", &specs.reward),
        ("done", &specs.done),
        ("action", &specs.action),
        ("state", &specs.state),
    ] {
        check_group(c, &e["specs"][name], &format!("specs.{name}"))?;
    }
    for (name, keys, t) in &extra {
        let want = &e["extra"][name.as_str()];
        if want.is_null() {
            return Err(format!("extra {name} was not recorded"));
        }
        match t {
            Some(t) => check_tensor_close(t, want, &format!("extra.{name}"))?,
            None => {
                let want = keys_from_json(want)?;
                if keys != &want {
                    return Err(format!("extra {name}: {keys:?}, expected {want:?}"));
                }
            }
        }
    }
    if let Some(steps) = case.args["rollout_steps"].as_i64() {
        let traj = rollout_half(&mut env, steps as usize).map_err(|e| format!("rollout: {e}"))?;
        let bs: Vec<i64> = e["rollout"]["batch_size"]
            .as_array()
            .ok_or("batch_size")?
            .iter()
            .filter_map(Value::as_i64)
            .collect();
        if traj.batch_size() != bs.as_slice() {
            return Err(format!(
                "rollout batch size {:?}, expected {bs:?}",
                traj.batch_size()
            ));
        }
        check_leaves(&traj, &e["rollout"]["leaves"], "rollout")?;
    }
    if e["python_check_env_specs"].as_bool() == Some(true) {
        check_env_specs(&mut env, Some(0)).map_err(|e| format!("check_env_specs: {e}"))?;
    }
    if env.base().specs() != &before {
        return Err("the base env's specs changed".into());
    }
    Ok(())
}

fn replay_forward(case: &Case) -> std::result::Result<(), String> {
    let td = td_from_json(case.arg("td")?).map_err(|e| format!("td: {e:?}"))?;
    let r = match build_transform(case.arg("transform")?)? {
        Ok(Built::T(mut t)) => t.forward(td),
        Ok(Built::Init(mut t, _)) => t.forward(td),
        Err(e) => Err(e),
    };
    if case.expected_error().is_some() {
        return check_error(case, r);
    }
    let out = r.map_err(|e| format!("forward: {e}"))?;
    check_leaves(&out, &case.expect["leaves"], "forward")
}

fn replay_init_stats_error(case: &Case) -> std::result::Result<(), String> {
    let cfg = env_cfg_from_json(case.arg("env")?)?;
    let init = init_from_json(case.arg("init")?)?;
    let d = case.arg("transform")?;
    let keys = keys_from_json(&d["in_keys"])?;
    let mut env =
        TransformedEnv::new(base(&cfg).map_err(|e| e.to_string())?).map_err(|e| e.to_string())?;
    let t = match (d["loc"].as_f64(), d["scale"].as_f64()) {
        (Some(l), Some(s)) => ObservationNorm::new(l, s, keys),
        _ => ObservationNorm::uninitialized(keys),
    };
    // As the recorder: the transform is in the env, then init_stats is called on it.
    let r = t
        .and_then(|t| env.append(t))
        .and_then(|()| ObservationNorm::init_stats_at(&mut env, 0, &init));
    check_error(case, r)
}

#[test]
fn reference_cases() {
    let file = common::load_cases("transforms_keys_cases.json");
    let mut failures = Failures::default();
    let mut ran = 0;
    for case in &file.cases {
        let r = match case.op.as_str() {
            "env" => replay_env(case),
            "forward" => replay_forward(case),
            "init_stats_error" => replay_init_stats_error(case),
            other => Err(format!("unknown op {other}")),
        };
        failures.check(&case.name, r);
        ran += 1;
    }
    assert!(ran >= 40, "only {ran} cases");
    failures.assert_none("transforms_keys reference cases");
}

// ====================================================================== check_env_specs

#[test]
fn dtype_cast_specs_check() -> Result<()> {
    let f64_env = EnvCfg::new(Kind::Double).max_steps(2);
    check_both_batches(f64_env.clone(), || Ok(DoubleToFloat::new()))?;
    check_both_batches(f64_env.clone(), || {
        Ok(DoubleToFloat::new().with_in_keys(["observation", "b"]))
    })?;
    check_both_batches(f64_env.clone(), || {
        Ok(DoubleToFloat::new()
            .with_in_keys(["observation"])
            .with_out_keys(["observation_f32"])
            .with_in_keys_inv(["action"])
            .with_out_keys_inv([("agent", "action")]))
    })?;
    check_both_batches(
        EnvCfg::new(Kind::Float).bounds(0.0, 5.0).max_steps(2),
        || Ok(DTypeCast::new(Kind::Float, Kind::Double)),
    )
}

#[test]
fn observation_norm_specs_check() -> Result<()> {
    let cfg = EnvCfg::new(Kind::Float).bounds(0.0, 10.0).max_steps(2);
    check_both_batches(cfg.clone(), || {
        ObservationNorm::new(1.0, 2.0, ["observation"])
    })?;
    check_both_batches(cfg.clone(), || {
        Ok(ObservationNorm::new(1.0, 2.0, ["observation", "a"])?.with_standard_normal(true))
    })?;
    check_both_batches(cfg.clone(), || {
        Ok(ObservationNorm::new(0.5, 4.0, ["observation"])?
            .with_out_keys(["obs_norm"])
            .with_in_keys_inv(["action"]))
    })?;
    check_both_batches(cfg.clone(), || {
        ObservationNorm::from_tensors(
            Tensor::from_slice(&[1.0f64, -1.0, 0.0]),
            Tensor::from_slice(&[1.0f64, 2.0, 3.0]),
            ["a"],
        )
    })?;
    // statistics computed from the env the transform joins
    for b in [vec![], vec![4]] {
        let mut env = TransformedEnv::new(base(&cfg.clone().batch(&b))?)?;
        let before = env.base().specs().clone();
        let mut norm = ObservationNorm::uninitialized(["b"])?;
        let reduce: Vec<i64> = (0..=b.len() as i64).collect();
        norm.init_stats_with(
            &mut env,
            &InitStats::new(12)
                .with_reduce_dim(reduce)
                .with_cat_dim(b.len() as i64),
        )?;
        env.append(norm)?;
        check_env_specs(&mut env, Some(0))?;
        assert!(env.base().specs() == &before);
    }
    Ok(())
}

#[test]
fn cat_tensors_specs_check() -> Result<()> {
    let cfg = EnvCfg::new(Kind::Float).max_steps(2);
    check_both_batches(cfg.clone(), || {
        Ok(CatTensors::new(["b", "a", "observation"]))
    })?;
    check_both_batches(cfg.clone(), || {
        Ok(CatTensors::new(["b", "a"])
            .with_sort(false)
            .with_del_keys(false)
            .with_out_key(("nested", "vec")))
    })?;
    check_both_batches(cfg.clone(), || Ok(CatTensors::new(["a", "b"]).with_dim(0)))?;
    check_both_batches(cfg, || Ok(CatTensors::lazy()))
}

#[test]
fn rename_specs_check() -> Result<()> {
    let cfg = EnvCfg::new(Kind::Float).max_steps(2);
    check_both_batches(cfg.clone(), || {
        RenameTransform::new(["observation", "reward"], ["stuff", "bonus"])
    })?;
    check_both_batches(cfg.clone(), || {
        RenameTransform::new(
            [k("observation"), k("b")],
            [NestedKey::from(("agent", "obs")), k("c")],
        )
    })?;
    check_both_batches(cfg.clone(), || {
        RenameTransform::inverse(["action"], [("agent", "action")])
    })?;
    check_both_batches(cfg.clone(), || {
        Ok(
            RenameTransform::new(["observation", "reward"], ["stuff", "reward2"])?
                .with_create_copy(true),
        )
    })?;
    check_both_batches(cfg, || {
        Ok(RenameTransform::new(["a"], ["a2"])?
            .with_inverse(["action"], ["act"])?
            .with_create_copy(true))
    })
}

#[test]
fn exclude_specs_check() -> Result<()> {
    let cfg = EnvCfg::new(Kind::Float).max_steps(2);
    check_both_batches(cfg.clone(), || Ok(ExcludeTransform::new(["terminated"])))?;
    check_both_batches(cfg.clone(), || Ok(ExcludeTransform::new(["a", "b"])))?;
    check_both_batches(cfg, || Ok(ExcludeTransform::new(["reward"])))
}

#[test]
fn select_specs_check() -> Result<()> {
    let cfg = EnvCfg::new(Kind::Float).max_steps(2);
    check_both_batches(cfg.clone(), || Ok(SelectTransform::new(["observation"])))?;
    check_both_batches(cfg.clone(), || {
        Ok(SelectTransform::new(["observation", "done"]).with_keep_dones(false))
    })?;
    check_both_batches(cfg, || {
        Ok(SelectTransform::new(["a"]).with_keep_rewards(false))
    })
}

#[test]
fn unsqueeze_specs_check() -> Result<()> {
    let cfg = EnvCfg::new(Kind::Float).bounds(0.0, 10.0).max_steps(2);
    check_both_batches(cfg.clone(), || {
        Ok(UnsqueezeTransform::new(-1, ["observation"]))
    })?;
    check_both_batches(cfg.clone(), || {
        Ok(UnsqueezeTransform::new(0, ["b", "reward"]))
    })?;
    check_both_batches(cfg.clone(), || {
        Ok(UnsqueezeTransform::new(-2, ["a"]).with_out_keys(["a_col"]))
    })?;
    check_both_batches(cfg, || Ok(UnsqueezeTransform::inverse(-1, ["action"])))
}

#[test]
fn full_stack_specs_check() -> Result<()> {
    for b in [vec![], vec![4]] {
        let cfg = EnvCfg::new(Kind::Double)
            .bounds(0.0, 10.0)
            .max_steps(2)
            .batch(&b);
        let env = base(&cfg)?;
        let before = env.specs().clone();
        let mut env = TransformedEnv::new(env)?
            .with(DoubleToFloat::new())?
            .with(ObservationNorm::new(1.0, 2.0, ["observation"])?)?
            .with(RenameTransform::new(["observation"], ["obs"])?)?
            .with(UnsqueezeTransform::new(-1, ["a"]))?
            .with(ExcludeTransform::new(["terminated"]))?
            .with(CatTensors::new(["obs", "b"]).with_out_key("vec"))?
            .with(SelectTransform::new(["vec"]))?;
        check_env_specs(&mut env, Some(0))?;
        assert!(env.base().specs() == &before);
        assert_eq!(env.observation_keys(), [k("vec")]);
        assert_eq!(env.done_keys(), [k("done")]);
        let traj = rollout_half(&mut env, 3)?;
        let v = traj.get_or_err(("next", "vec"))?;
        assert_eq!(v.kind(), Kind::Float);
        // step 1: keys sorted, so b = [1, 1] then obs 1 -> 1*2+1 = 3
        let first: Vec<f64> = values(v).into_iter().take(3).collect();
        assert_eq!(first, [1.0, 1.0, 3.0], "batch {b:?}");
    }
    Ok(())
}

// ====================================================================== edge cases

#[test]
fn dtype_cast_auto_keys_and_inverse() -> Result<()> {
    let mut env =
        TransformedEnv::new(base(&EnvCfg::new(Kind::Double))?)?.with(DoubleToFloat::new())?;
    let s = env.specs();
    for key in ["observation", "b", "a"] {
        assert_eq!(
            s.observation.get(key).and_then(|x| x.dtype()),
            Some(Kind::Float)
        );
    }
    assert_eq!(
        s.reward.get("reward").and_then(|x| x.dtype()),
        Some(Kind::Float)
    );
    let TensorSpec::Bounded(act) = s.action.get_or_err("action")? else {
        panic!("action spec is not Bounded");
    };
    assert_eq!(
        (act.dtype(), act.low().kind(), act.high().kind()),
        (Kind::Float, Kind::Float, Kind::Float)
    );
    // the base still sees float64 actions (it errors otherwise) and its reward is the action
    let traj = rollout_half(&mut env, 2)?;
    assert_eq!(traj.get_or_err("action")?.kind(), Kind::Float);
    assert_eq!(values(traj.get_or_err(("next", "reward"))?), [0.5, 0.5]);
    assert_eq!(
        env.base()
            .specs()
            .action
            .get("action")
            .and_then(|x| x.dtype()),
        Some(Kind::Double)
    );
    assert!(DoubleToFloat::new().name().starts_with("DoubleToFloat("));
    assert!(DTypeCast::new(Kind::Float, Kind::Half)
        .name()
        .contains("Float -> Half"));
    Ok(())
}

#[test]
fn dtype_cast_explicit_keys_have_no_inverse() -> Result<()> {
    let t = DoubleToFloat::new().with_in_keys(["observation"]);
    assert_eq!(t.in_keys_inv(), Some(vec![]));
    let mut env = TransformedEnv::new(base(&EnvCfg::new(Kind::Double))?)?.with(t)?;
    let s = env.specs();
    assert_eq!(
        s.observation.get("observation").and_then(|x| x.dtype()),
        Some(Kind::Float)
    );
    assert_eq!(
        s.observation.get("b").and_then(|x| x.dtype()),
        Some(Kind::Double)
    );
    assert_eq!(
        s.reward.get("reward").and_then(|x| x.dtype()),
        Some(Kind::Double)
    );
    assert_eq!(
        s.action.get("action").and_then(|x| x.dtype()),
        Some(Kind::Double)
    );
    let traj = rollout_half(&mut env, 2)?;
    assert_eq!(traj.get_or_err("action")?.kind(), Kind::Double);
    Ok(())
}

#[test]
fn dtype_cast_errors_name_keys() -> Result<()> {
    // a listed key whose spec dtype is not `from`
    let env = TransformedEnv::new(base(&EnvCfg::new(Kind::Float))?)?;
    let msg = err_text(env.with(DoubleToFloat::new().with_in_keys(["observation"])));
    assert!(
        msg.contains("\"observation\"") && msg.contains("Double") && msg.contains("Float"),
        "{msg}"
    );
    // a key in no spec
    let env = TransformedEnv::new(base(&EnvCfg::new(Kind::Double))?)?;
    let msg = err_text(env.with(DoubleToFloat::new().with_in_keys(["nope"])));
    assert!(msg.contains("\"nope\""), "{msg}");
    // an inverse key in neither the action nor the state spec
    let env = TransformedEnv::new(base(&EnvCfg::new(Kind::Double))?)?;
    let msg = err_text(
        env.with(
            DoubleToFloat::new()
                .with_in_keys(["observation"])
                .with_in_keys_inv(["observation"]),
        ),
    );
    assert!(
        msg.contains("\"observation\"") && msg.contains("action"),
        "{msg}"
    );
    // out keys need in keys; lengths must match; from != to
    let env = TransformedEnv::new(base(&EnvCfg::new(Kind::Double))?)?;
    assert!(err_text(env.with(DoubleToFloat::new().with_out_keys(["x"]))).contains("out_keys"));
    let env = TransformedEnv::new(base(&EnvCfg::new(Kind::Double))?)?;
    let msg = err_text(
        env.with(
            DoubleToFloat::new()
                .with_in_keys(["observation", "b"])
                .with_out_keys(["x"]),
        ),
    );
    assert!(msg.contains("\"x\""), "{msg}");
    let env = TransformedEnv::new(base(&EnvCfg::new(Kind::Double))?)?;
    assert!(
        err_text(env.with(DTypeCast::new(Kind::Double, Kind::Double))).contains("nothing to cast")
    );
    // auto keys need an env
    let td = TensorDict::new([])?.with("x", Tensor::from_slice(&[1.0f64]))?;
    let mut t = DoubleToFloat::new();
    let sink = DoubleToFloat::new();
    assert!(sink
        .transform_specs(base(&EnvCfg::new(Kind::Double))?.specs().clone())
        .is_err());
    assert_eq!(t.forward(td)?.get_or_err("x")?.kind(), Kind::Float);
    Ok(())
}

#[test]
fn dtype_cast_out_keys_add_entries() -> Result<()> {
    let mut env = TransformedEnv::new(base(&EnvCfg::new(Kind::Double))?)?.with(
        DoubleToFloat::new()
            .with_in_keys(["observation"])
            .with_out_keys(["obs32"]),
    )?;
    assert_eq!(
        env.specs().observation.get("obs32").and_then(|s| s.dtype()),
        Some(Kind::Float)
    );
    assert_eq!(
        env.specs()
            .observation
            .get("observation")
            .and_then(|s| s.dtype()),
        Some(Kind::Double)
    );
    let traj = rollout_half(&mut env, 2)?;
    assert_eq!(traj.get_or_err(("next", "obs32"))?.kind(), Kind::Float);
    assert_eq!(
        traj.get_or_err("obs32")?.kind(),
        Kind::Float,
        "the reset casts too"
    );
    assert_eq!(
        traj.get_or_err(("next", "observation"))?.kind(),
        Kind::Double
    );
    // standalone forward with explicit keys: a missing key is an error naming it
    let mut t = DoubleToFloat::new().with_in_keys(["observation"]);
    let msg = err_text(t.forward(TensorDict::new([])?));
    assert!(msg.contains("\"observation\""), "{msg}");
    Ok(())
}

#[test]
fn observation_norm_rejects_bad_scales() -> Result<()> {
    for s in [0.0, -2.0, f64::NAN, f64::INFINITY] {
        let msg = err_text(ObservationNorm::new(0.0, s, ["observation"]));
        assert!(msg.contains("scale"), "{s}: {msg}");
    }
    assert!(err_text(ObservationNorm::new(f64::NAN, 1.0, ["observation"])).contains("loc"));
    let msg = err_text(ObservationNorm::from_tensors(
        Tensor::from_slice(&[0.0f32, 0.0]),
        Tensor::from_slice(&[1.0f32, 0.0]),
        ["b"],
    ));
    assert!(msg.contains("scale must be > 0"), "{msg}");
    assert!(ObservationNorm::from_tensors(
        Tensor::from_slice(&[0i64]),
        Tensor::from_slice(&[1.0f32]),
        ["b"]
    )
    .is_err());
    assert!(err_text(ObservationNorm::new(0.0, 1.0, Vec::<NestedKey>::new())).contains("in_keys"));
    // a tiny positive scale is kept as given (no silent clamp)
    let t = ObservationNorm::new(0.0, 1e-8, ["observation"])?;
    let s = t.scale().map(|s| s.double_value(&[])).unwrap_or(0.0);
    assert!((s - 1e-8).abs() < 1e-12, "{s}");
    Ok(())
}

#[test]
fn observation_norm_appended_uninitialized() -> Result<()> {
    // appending is allowed (TorchRL's way); the specs are left as they are until the
    // statistics are known, and the env cannot be reset or stepped
    let cfg = EnvCfg::new(Kind::Float).bounds(0.0, 10.0);
    let mut env =
        TransformedEnv::new(base(&cfg)?)?.with(ObservationNorm::uninitialized(["observation"])?)?;
    assert_eq!(env.specs(), env.base().specs());
    let msg = err_text(env.reset(None));
    assert!(
        msg.contains("have not been initialized") && msg.contains("init_stats_at"),
        "{msg}"
    );
    assert!(env
        .transform()
        .iter()
        .any(|t| t.name().contains("uninitialized")));
    // the keys and dtypes are still checked at append
    let msg = err_text(
        TransformedEnv::new(base(&EnvCfg::new(Kind::Float))?)?
            .with(ObservationNorm::uninitialized(["nope"])?),
    );
    assert!(msg.contains("\"nope\""), "{msg}");
    let msg = err_text(
        TransformedEnv::new(base(&EnvCfg::new(Kind::Int64))?)?
            .with(ObservationNorm::uninitialized(["observation"])?),
    );
    assert!(msg.contains("floating"), "{msg}");
    // standalone
    let mut t = ObservationNorm::uninitialized(["observation"])?;
    assert!(!t.is_initialized());
    assert!(t.name().contains("uninitialized"));
    let td = TensorDict::new([])?.with("observation", Tensor::from_slice(&[1.0f32]))?;
    assert!(err_text(t.forward(td)).contains("have not been initialized"));
    Ok(())
}

/// The statistics of a norm read back from the env.
fn norm_stats(env: &TransformedEnv<KeysEnv>, i: usize) -> (Vec<f64>, Vec<f64>) {
    let n = env.transform().get_as::<ObservationNorm>(i);
    (
        n.and_then(|n| n.loc()).map(values).unwrap_or_default(),
        n.and_then(|n| n.scale()).map(values).unwrap_or_default(),
    )
}

#[test]
fn observation_norm_init_stats_at() -> Result<()> {
    let std0 = (55.0f64 / 6.0).sqrt(); // observations 0..9
    let close = |a: f64, b: f64| (a - b).abs() < 1e-5;
    // index 0, TorchRL's recorded values (obsnorm_init_stats): loc -1.4863, scale 0.3303; a
    // Bounded observation gets its mapped bounds once the statistics are known
    let cfg = EnvCfg::new(Kind::Float).bounds(0.0, 10.0);
    let mut env =
        TransformedEnv::new(base(&cfg)?)?.with(ObservationNorm::uninitialized(["observation"])?)?;
    ObservationNorm::init_stats_at(&mut env, 0, &InitStats::new(10))?;
    let (loc, scale) = norm_stats(&env, 0);
    assert!(
        close(loc[0], -4.5 / std0) && close(scale[0], 1.0 / std0),
        "{loc:?} {scale:?}"
    );
    let name = env.transform().get(0).map(|t| t.name()).unwrap_or_default();
    assert!(
        name.starts_with("ObservationNorm(loc=-1.4863, scale=0.3303"),
        "{name}"
    );
    let TensorSpec::Bounded(b) = env.specs().observation.get_or_err("observation")? else {
        panic!("not Bounded");
    };
    assert!(close(values(b.low())[0], -4.5 / std0));
    assert!(close(values(b.high())[0], 5.5 / std0));
    check_env_specs(&mut env, Some(0))?;
    let traj = rollout_half(&mut env, 3)?;
    assert!(close(
        values(traj.get_or_err("observation")?)[0],
        -4.5 / std0
    ));
    // already initialized
    let msg = err_text(ObservationNorm::init_stats_at(
        &mut env,
        0,
        &InitStats::new(10),
    ));
    assert!(msg.contains("are already initialized"), "{msg}");

    // index 1: the rollouts see the transform before (x -> 2x + 1: 1, 3, .., 19, mean 10, std
    // 2 std0), not the ones after (CatTensors removes "observation", so rolling out the whole
    // env could not find it)
    let mut env = TransformedEnv::new(base(&EnvCfg::new(Kind::Float))?)?
        .with(ObservationNorm::new(1.0, 2.0, ["observation"])?)?
        .with(ObservationNorm::uninitialized(["observation"])?)?
        .with(CatTensors::new(["observation", "b"]).with_out_key("vec"))?;
    let keys_before = env.observation_keys();
    ObservationNorm::init_stats_at(&mut env, 1, &InitStats::new(10))?;
    assert_eq!(env.transform().len(), 3);
    assert_eq!(env.observation_keys(), keys_before);
    let (loc, scale) = norm_stats(&env, 1);
    let s1 = 1.0 / (2.0 * std0);
    assert!(
        close(scale[0], s1) && close(loc[0], -10.0 * s1),
        "{loc:?} {scale:?}"
    );
    // the whole stack runs: "vec" = [b, b, normalised observation]; first root x = 0 -> 1 ->
    // (1 - 10) / (2 std0)
    let traj = rollout_half(&mut env, 2)?;
    let v = values(traj.get_or_err("vec")?);
    assert!(close(v[2], -9.0 * s1), "{v:?}");
    check_env_specs(&mut env, Some(0))?;

    // errors leave the env as it was, and the transform uninitialised
    let mut env = TransformedEnv::new(base(&EnvCfg::new(Kind::Float))?)?
        .with(ObservationNorm::uninitialized(["observation"])?)?
        .with(ObservationNorm::uninitialized(["b"])?)?
        .with(UnsqueezeTransform::new(-1, ["a"]))?;
    let specs = env.specs().clone();
    let unchanged = |env: &TransformedEnv<KeysEnv>| {
        env.transform().len() == 3
            && env.specs() == &specs
            && env.transform().get_as::<UnsqueezeTransform>(2).is_some()
            && (0..2).all(|i| {
                env.transform()
                    .get_as::<ObservationNorm>(i)
                    .is_some_and(|n| !n.is_initialized())
            })
    };
    let msg = err_text(ObservationNorm::init_stats_at(
        &mut env,
        1,
        &InitStats::new(10),
    ));
    assert!(msg.contains("initialized in the right order"), "{msg}");
    assert!(msg.contains("index 0"), "{msg}");
    assert!(unchanged(&env));
    let msg = err_text(ObservationNorm::init_stats_at(
        &mut env,
        2,
        &InitStats::new(10),
    ));
    assert!(msg.contains("UnsqueezeTransform") && msg.contains("not an ObservationNorm"));
    let msg = err_text(ObservationNorm::init_stats_at(
        &mut env,
        3,
        &InitStats::new(10),
    ));
    assert!(msg.contains("transforms of the env"), "{msg}");
    // one frame: a NaN standard deviation, found after the rollouts
    let msg = err_text(ObservationNorm::init_stats_at(
        &mut env,
        0,
        &InitStats::new(1),
    ));
    assert!(msg.contains("non-finite"), "{msg}");
    assert!(unchanged(&env));
    // then in order: both initialised, the env runs
    ObservationNorm::init_stats_at(&mut env, 0, &InitStats::new(10))?;
    ObservationNorm::init_stats_at(&mut env, 1, &InitStats::new(10))?;
    check_env_specs(&mut env, Some(0))?;
    // "b" = count on its 2 features: its statistics are those of 0..9 too
    let (loc, scale) = norm_stats(&env, 1);
    assert!(
        close(loc[0], -4.5 / std0) && close(scale[1], 1.0 / std0),
        "{loc:?} {scale:?}"
    );
    Ok(())
}

#[test]
fn observation_norm_spec_and_data() -> Result<()> {
    let cfg = EnvCfg::new(Kind::Float).bounds(0.0, 1.0);
    let env =
        TransformedEnv::new(base(&cfg)?)?.with(ObservationNorm::new(1.0, 2.0, ["observation"])?)?;
    let TensorSpec::Bounded(b) = env.specs().observation.get_or_err("observation")? else {
        panic!("not Bounded");
    };
    assert_eq!((values(b.low()), values(b.high())), (vec![1.0], vec![3.0]));
    let env = TransformedEnv::new(base(&cfg)?)?
        .with(ObservationNorm::new(1.0, 2.0, ["observation"])?.with_standard_normal(true))?;
    let TensorSpec::Bounded(b) = env.specs().observation.get_or_err("observation")? else {
        panic!("not Bounded");
    };
    assert_eq!((values(b.low()), values(b.high())), (vec![-0.5], vec![0.0]));
    // the inverse maps the action spec forward and the data back
    let mut env = TransformedEnv::new(base(&EnvCfg::new(Kind::Float))?)?
        .with(ObservationNorm::new(1.0, 2.0, ["observation"])?.with_in_keys_inv(["action"]))?;
    let TensorSpec::Bounded(a) = env.specs().action.get_or_err("action")? else {
        panic!("not Bounded");
    };
    assert_eq!((values(a.low()), values(a.high())), (vec![-1.0], vec![3.0]));
    let traj = rollout_half(&mut env, 2)?;
    assert_eq!(values(traj.get_or_err(("next", "reward"))?), [-0.25, -0.25]);
    assert_eq!(
        values(traj.get_or_err("action")?),
        [0.5, 0.5],
        "the caller's action is untouched"
    );
    // float64 statistics keep a float32 observation float32
    let mut env = TransformedEnv::new(base(&EnvCfg::new(Kind::Float))?)?.with(
        ObservationNorm::from_tensors(
            Tensor::from_slice(&[1.0f64, 2.0]),
            Tensor::from_slice(&[2.0f64, 2.0]),
            ["b"],
        )?,
    )?;
    let traj = rollout_half(&mut env, 1)?;
    let nb = traj.get_or_err(("next", "b"))?;
    assert_eq!((nb.kind(), values(nb)), (Kind::Float, vec![3.0, 4.0]));
    // statistics that do not broadcast to the entry: error at append (Bounded) or at step
    let msg = err_text(
        TransformedEnv::new(base(&cfg)?)?.with(ObservationNorm::from_tensors(
            Tensor::from_slice(&[0.0f32, 0.0]),
            Tensor::from_slice(&[1.0f32, 1.0]),
            ["observation"],
        )?),
    );
    assert!(msg.contains("\"observation\""), "{msg}");
    let mut env = TransformedEnv::new(base(&EnvCfg::new(Kind::Float))?)?.with(
        ObservationNorm::from_tensors(
            Tensor::from_slice(&[0.0f32, 0.0]),
            Tensor::from_slice(&[1.0f32, 1.0]),
            ["observation"],
        )?,
    )?;
    assert!(err_text(env.rollout(2, None, &RolloutConfig::default())).contains("\"observation\""));
    // an in key that is not an observation
    let msg = err_text(TransformedEnv::new(base(&cfg)?)?.with(ObservationNorm::new(
        0.0,
        1.0,
        ["reward"],
    )?));
    assert!(msg.contains("\"reward\""), "{msg}");
    Ok(())
}

#[test]
fn observation_norm_init_stats() -> Result<()> {
    let cfg = EnvCfg::new(Kind::Float);
    // hand-derived: observations 0..9, mean 4.5, unbiased std sqrt(55/6)
    let std = (55.0f64 / 6.0).sqrt();
    let mut env = TransformedEnv::new(base(&cfg)?)?;
    let mut norm = ObservationNorm::uninitialized(["observation"])?;
    norm.init_stats(&mut env, 10)?;
    let (loc, scale) = (norm.loc().map(values), norm.scale().map(values));
    assert!((scale.clone().unwrap_or_default()[0] - 1.0 / std).abs() < 1e-5);
    assert!((loc.unwrap_or_default()[0] + 4.5 / std).abs() < 1e-5);
    assert!(
        norm.name()
            .starts_with("ObservationNorm(loc=-1.4863, scale=0.3303"),
        "{}",
        norm.name()
    );
    // already initialized
    assert!(err_text(norm.init_stats(&mut env, 10)).contains("are already initialized"));
    env.append(norm)?;
    let traj = env.rollout(3, None, &RolloutConfig::default())?;
    let obs = values(traj.get_or_err("observation")?);
    assert!((obs[0] + 4.5 / std).abs() < 1e-5, "{obs:?}");
    // standard_normal keeps the raw statistics
    let mut env = TransformedEnv::new(base(&cfg)?)?;
    let mut norm = ObservationNorm::uninitialized(["observation"])?.with_standard_normal(true);
    norm.init_stats(&mut env, 10)?;
    assert!((norm.loc().map(values).unwrap_or_default()[0] - 4.5).abs() < 1e-6);
    assert!((norm.scale().map(values).unwrap_or_default()[0] - std).abs() < 1e-5);
    // keep_dims keeps reduced dims as size-1 dims
    let mut norm = ObservationNorm::uninitialized(["b"])?;
    norm.init_stats_with(&mut env, &InitStats::new(10).with_keep_dims([0]))?;
    assert_eq!(norm.loc().map(|l| l.size()), Some(vec![1, 2]));
    // errors leave the transform uninitialized
    let mut norm = ObservationNorm::uninitialized(["observation"])?;
    assert!(
        err_text(norm.init_stats(&mut env, 1)).contains("non-finite"),
        "one frame: NaN std"
    );
    assert!(!norm.is_initialized());
    assert!(err_text(norm.init_stats(&mut env, 0)).contains("num_iter"));
    let msg = err_text(norm.init_stats_with(&mut env, &InitStats::new(5).with_keep_dims([1])));
    assert!(msg.contains("keep_dims"), "{msg}");
    let msg = err_text(norm.init_stats_with(&mut env, &InitStats::new(5).with_key("nope")));
    assert!(msg.contains("\"nope\""), "{msg}");
    let mut two = ObservationNorm::uninitialized(["observation", "b"])?;
    assert!(err_text(two.init_stats(&mut env, 5)).contains("multiple in_keys"));
    two.init_stats_with(&mut env, &InitStats::new(5).with_key("observation"))?;
    assert!(two.is_initialized());
    // a constant feature: std 0 is floored by eps ("b" repeats one value on its 2 features;
    // reduce over the feature dim: 4 frames give 4 statistics)
    let cfg4 = InitStats::new(4).with_reduce_dim([1]);
    let mut norm = ObservationNorm::uninitialized(["b"])?.with_eps(1e-3);
    norm.init_stats_with(&mut env, &cfg4)?;
    let close = |a: Vec<f64>, b: &[f64]| {
        a.len() == b.len()
            && a.iter()
                .zip(b)
                .all(|(x, y)| (x - y).abs() <= 1e-3 * (1.0 + y.abs()))
    };
    assert!(close(
        norm.scale().map(values).unwrap_or_default(),
        &[1000.0; 4]
    ));
    assert!(close(
        norm.loc().map(values).unwrap_or_default(),
        &[0.0, -1000.0, -2000.0, -3000.0]
    ));
    let mut norm = ObservationNorm::uninitialized(["b"])?
        .with_eps(1e-3)
        .with_standard_normal(true);
    norm.init_stats_with(&mut env, &cfg4)?;
    let sc = norm.scale().map(values).unwrap_or_default();
    assert!(sc.iter().all(|x| (x - 1e-3).abs() < 1e-9), "{sc:?}");
    // a non-floating entry
    let mut c = ObservationNorm::uninitialized(["done"])?;
    assert!(err_text(c.init_stats(&mut env, 3)).contains("floating"));
    assert!(!c.is_initialized());
    Ok(())
}

#[test]
fn cat_tensors_edge_cases() -> Result<()> {
    // nested keys sort by their joined segments: ("x", "a") -> "x_-|-_a" after "b"
    let t = CatTensors::new([NestedKey::from(("x", "a")), k("b")]);
    assert_eq!(t.in_keys(), Some(vec![k("b"), NestedKey::from(("x", "a"))]));
    assert_eq!(
        CatTensors::new(["b", "a"]).with_sort(false).in_keys(),
        Some(vec![k("b"), k("a")])
    );
    let cfg = EnvCfg::new(Kind::Float);
    // lazy: every observation leaf with one feature dim, sorted (read from the appended
    // transform)
    assert_eq!(CatTensors::lazy().in_keys(), None);
    let env = TransformedEnv::new(base(&cfg.clone().batch(&[4]))?)?.with(CatTensors::lazy())?;
    assert_eq!(
        env.transform()
            .get_as::<CatTensors>(0)
            .and_then(|t| t.in_keys()),
        Some(vec![k("a"), k("b"), k("observation")])
    );
    let msg = err_text(TransformedEnv::new(base(&cfg)?)?.with(CatTensors::lazy().with_dim(0)));
    assert!(msg.contains("dim = -1"), "{msg}");
    // output spec: Unbounded, sizes summed, first dtype; inputs deleted
    let env = TransformedEnv::new(base(&cfg.clone().bounds(0.0, 1.0).batch(&[4]))?)?
        .with(CatTensors::new(["observation", "a"]))?;
    let out = env.specs().observation.get_or_err("observation_vector")?;
    assert_eq!(
        (out.class_name(), out.shape().to_vec()),
        ("Unbounded", vec![4, 4])
    );
    assert!(!env.specs().observation.contains("a") && env.specs().observation.contains("b"));
    // errors: missing key, dtype mismatch, shape mismatch, out key collision, duplicates
    let msg = err_text(TransformedEnv::new(base(&cfg)?)?.with(CatTensors::new(["a", "zzz"])));
    assert!(msg.contains("\"zzz\""), "{msg}");
    let msg = err_text(
        TransformedEnv::new(base(&cfg)?)?
            .with(DTypeCast::new(Kind::Float, Kind::Double).with_in_keys(["a"]))?
            .with(CatTensors::new(["a", "b"])),
    );
    assert!(
        msg.contains("\"a\"") && msg.contains("\"b\"") && msg.contains("dtype"),
        "{msg}"
    );
    let msg = err_text(
        TransformedEnv::new(base(&cfg)?)?
            .with(UnsqueezeTransform::new(-1, ["a"]))?
            .with(CatTensors::new(["a", "b"])),
    );
    assert!(msg.contains("\"b\""), "{msg}");
    let msg = err_text(
        TransformedEnv::new(base(&cfg)?)?.with(CatTensors::new(["a", "b"]).with_out_key("reward")),
    );
    assert!(msg.contains("already exists in the reward spec"), "{msg}");
    assert!(
        err_text(TransformedEnv::new(base(&cfg)?)?.with(CatTensors::new(["a", "a"])))
            .contains("twice")
    );
    assert!(err_text(
        TransformedEnv::new(base(&cfg)?)?.with(CatTensors::new(["a", "b"]).with_dim(1))
    )
    .contains("feature dims"));
    // forward: a missing key is an error naming it
    let td = TensorDict::new([])?.with("a", Tensor::from_slice(&[0.0f32]))?;
    assert!(err_text(CatTensors::new(["a", "b"]).forward(td)).contains("\"b\""));
    // non-negative dims count among the feature dims, whatever the batch size
    let td = TensorDict::new([2])?
        .with("a", Tensor::zeros([2, 3], (Kind::Float, Device::Cpu)))?
        .with("b", Tensor::ones([2, 2], (Kind::Float, Device::Cpu)))?;
    let out = CatTensors::new(["a", "b"]).with_dim(0).forward(td)?;
    assert_eq!(out.get_or_err("observation_vector")?.size(), [2, 5]);
    Ok(())
}

#[test]
fn rename_edge_cases() -> Result<()> {
    assert!(
        err_text(RenameTransform::new(["a", "b"], ["x"])).contains("should match the number of")
    );
    assert!(
        err_text(RenameTransform::new(["a", "b"], ["b", "c"])).contains("because order is unclear")
    );
    assert!(err_text(RenameTransform::new(["a", "a"], ["b", "c"])).contains("twice"));
    assert!(err_text(RenameTransform::inverse(["action"], ["x", "y"])).contains("inverse"));
    let cfg = EnvCfg::new(Kind::Float);
    let msg =
        err_text(TransformedEnv::new(base(&cfg)?)?.with(RenameTransform::new(["nope"], ["x"])?));
    assert!(msg.contains("\"nope\""), "{msg}");
    let msg = err_text(TransformedEnv::new(base(&cfg)?)?.with(RenameTransform::new(["a"], ["b"])?));
    assert!(
        msg.contains("\"b\"") && msg.contains("already exists"),
        "{msg}"
    );
    let msg = err_text(
        TransformedEnv::new(base(&cfg)?)?.with(RenameTransform::inverse(["nope"], ["x"])?),
    );
    assert!(msg.contains("\"nope\""), "{msg}");
    // a renamed reward stays a reward, a renamed done flag a done flag
    let env = TransformedEnv::new(base(&cfg)?)?.with(RenameTransform::new(
        ["reward", "terminated"],
        ["r", "term"],
    )?)?;
    assert_eq!(env.reward_keys(), [k("r")]);
    assert_eq!(env.done_keys(), [k("done"), k("term")]);
    // the inverse renames the parent's copy only: the caller keeps its key
    let mut env = TransformedEnv::new(base(&cfg)?)?
        .with(RenameTransform::inverse(["action"], [("agent", "action")])?)?;
    let td = env.reset(None)?;
    let td = env.rand_action(Some(td))?;
    let td = env.step(td)?;
    assert!(td.contains(("agent", "action")) && !td.contains("action"));
    // renaming a nested level moves everything under it
    let env = TransformedEnv::new(base(&cfg)?)?
        .with(RenameTransform::new(["reward"], [("agent", "reward")])?)?
        .with(RenameTransform::new(["agent"], ["team"])?)?;
    assert_eq!(env.reward_keys(), [NestedKey::from(("team", "reward"))]);
    assert!(env.specs().reward.get("agent").is_none());
    Ok(())
}

#[test]
fn exclude_and_select_edge_cases() -> Result<()> {
    let cfg = EnvCfg::new(Kind::Float);
    let msg =
        err_text(TransformedEnv::new(base(&cfg)?)?.with(ExcludeTransform::new(["nonexistent"])));
    assert!(
        msg.contains("\"nonexistent\"") && msg.contains("environment outputs"),
        "{msg}"
    );
    let msg = err_text(TransformedEnv::new(base(&cfg)?)?.with(ExcludeTransform::new(["action"])));
    assert!(msg.contains("\"action\""), "{msg}");
    // excluding a nested level removes it from the specs and the data
    let mut env = TransformedEnv::new(base(&cfg)?)?
        .with(RenameTransform::new(["reward"], [("agent", "reward")])?)?
        .with(ExcludeTransform::new(["agent"]))?;
    assert!(env.reward_keys().is_empty());
    let traj = rollout_half(&mut env, 2)?;
    assert!(!traj.contains(("next", "agent", "reward")));
    // inverse mode: the parent does not see the key, specs unchanged
    let mut env = TransformedEnv::new(base(&cfg)?)?
        .with(ExcludeTransform::new(["action"]).with_inverse(true))?;
    assert_eq!(env.action_keys(), [k("action")]);
    assert!(
        err_text(rollout_half(&mut env, 1)).contains("\"action\""),
        "the base needs its action"
    );
    // select: unknown key, nested prefix
    let msg = err_text(TransformedEnv::new(base(&cfg)?)?.with(SelectTransform::new(["zzz"])));
    assert!(msg.contains("\"zzz\""), "{msg}");
    let mut env = TransformedEnv::new(base(&cfg)?)?
        .with(RenameTransform::new(["a"], [("agent", "a")])?)?
        .with(SelectTransform::new(["agent"]))?;
    assert_eq!(env.observation_keys(), [NestedKey::from(("agent", "a"))]);
    let traj = rollout_half(&mut env, 2)?;
    assert!(traj.contains(("next", "agent", "a")) && !traj.contains(("next", "b")));
    assert!(traj.contains(("next", "reward")) && traj.contains(("next", "terminated")));
    // standalone: rewards and dones are kept by their default names
    let td = TensorDict::new([])?
        .with("x", Tensor::from_slice(&[1.0f32]))?
        .with("y", Tensor::from_slice(&[1.0f32]))?
        .with("reward", Tensor::from_slice(&[1.0f32]))?;
    let out = SelectTransform::new(["x"]).forward(td)?;
    assert_eq!(
        sorted(out.keys(torchrl::tensordict::KeysOptions::nested_leaves())),
        [k("reward"), k("x")]
    );
    Ok(())
}

#[test]
fn unsqueeze_edge_cases() -> Result<()> {
    let cfg = EnvCfg::new(Kind::Float).batch(&[4]);
    // dims that would land in the batch dims or past the end
    for dim in [2, -3] {
        let msg = err_text(
            TransformedEnv::new(base(&cfg)?)?.with(UnsqueezeTransform::new(dim, ["observation"])),
        );
        assert!(
            msg.contains("\"observation\"") && msg.contains("[4, 1]"),
            "{dim}: {msg}"
        );
    }
    // dim 1 on [4, 1]: after the only feature dim
    let env =
        TransformedEnv::new(base(&cfg)?)?.with(UnsqueezeTransform::new(1, ["observation"]))?;
    assert_eq!(
        env.specs().observation.get_or_err("observation")?.shape(),
        [4, 1, 1]
    );
    assert!(err_text(
        TransformedEnv::new(base(&cfg)?)?.with(UnsqueezeTransform::new(-1, Vec::<&str>::new()))
    )
    .contains("nothing"));
    assert!(
        err_text(TransformedEnv::new(base(&cfg)?)?.with(UnsqueezeTransform::new(-1, ["zzz"])))
            .contains("\"zzz\"")
    );
    // the inverse refuses to squeeze a dim of size != 1
    let mut t = UnsqueezeTransform::inverse(0, ["action"]);
    let td = TensorDict::new([4])?.with(
        "action",
        Tensor::zeros([4, 2, 1], (Kind::Float, Device::Cpu)),
    )?;
    let msg = err_text(t.inv(td));
    assert!(msg.contains("\"action\"") && msg.contains("not 1"), "{msg}");
    let td = TensorDict::new([4])?.with(
        "action",
        Tensor::zeros([4, 1, 2], (Kind::Float, Device::Cpu)),
    )?;
    assert_eq!(t.inv(td)?.get_or_err("action")?.size(), [4, 2]);
    // forward counts positive dims after the tensordict's batch dims
    let td =
        TensorDict::new([3, 4])?.with("x", Tensor::zeros([3, 4, 5], (Kind::Float, Device::Cpu)))?;
    let out = UnsqueezeTransform::new(0, ["x"]).forward(td)?;
    assert_eq!(out.get_or_err("x")?.size(), [3, 4, 1, 5]);
    // the reward stays a reward with its new shape
    let env = TransformedEnv::new(base(&cfg)?)?.with(UnsqueezeTransform::new(-1, ["reward"]))?;
    assert_eq!(env.specs().reward.get_or_err("reward")?.shape(), [4, 1, 1]);
    Ok(())
}

#[test]
fn transforms_register_new_keys_and_have_names() -> Result<()> {
    let cfg = EnvCfg::new(Kind::Float);
    let env = TransformedEnv::new(base(&cfg)?)?
        .with(CatTensors::new(["a", "b"]).with_out_key(("deep", "v")))?
        .with(RenameTransform::new(["observation"], ["o"])?)?
        .with(UnsqueezeTransform::new(-1, ["o"]).with_out_keys(["o2"]))?
        .with(ObservationNorm::new(0.0, 1.0, ["o2"])?.with_out_keys(["o3"]))?;
    // by depth, then by name (TorchRL's order)
    assert_eq!(
        env.observation_keys(),
        [k("o"), k("o2"), k("o3"), NestedKey::from(("deep", "v"))]
    );
    let names: Vec<String> = env.transform().iter().map(|t| t.name()).collect();
    assert!(
        names[0].starts_with("CatTensors(in_keys=[\"a\", \"b\"]"),
        "{names:?}"
    );
    assert!(names[1].starts_with("RenameTransform("), "{names:?}");
    assert!(
        names[2].starts_with("UnsqueezeTransform(dim=-1"),
        "{names:?}"
    );
    assert!(
        names[3].starts_with("ObservationNorm(loc=0.0000, scale=1.0000"),
        "{names:?}"
    );
    assert!(ExcludeTransform::new(["a"]).name().contains("\"a\""));
    assert!(SelectTransform::new(["a"])
        .name()
        .contains("keep_rewards=true"));
    Ok(())
}

/// TorchRL's case of §4.4: renaming `"reward"` to `("nested", "reward")` keeps it a reward
/// (the key lists are replayed by `rename_forward_nested_reward` in `reference_cases`), and the
/// env rolls out: `step_mdp` drops the nested reward together with the `"nested"` level it
/// empties, so every root has the reset root's structure.
#[test]
fn rename_nested_reward_rollout() -> Result<()> {
    for b in [vec![], vec![4]] {
        let cfg = EnvCfg::new(Kind::Float).max_steps(2).batch(&b);
        let mut env = TransformedEnv::new(base(&cfg)?)?.with(RenameTransform::new(
            [k("reward")],
            [NestedKey::from(("nested", "reward"))],
        )?)?;
        assert_eq!(env.reward_keys(), [NestedKey::from(("nested", "reward"))]);
        let traj = rollout_half(&mut env, 3)?;
        // done at the second step: the rollout stops there
        let t: Vec<i64> = [b.as_slice(), &[2]].concat();
        assert_eq!(traj.batch_size(), t.as_slice());
        let n = b.first().copied().unwrap_or(1) as usize;
        let reward = traj.get_or_err(("next", "nested", "reward"))?;
        assert_eq!(reward.size(), [t.as_slice(), &[1]].concat());
        assert_eq!(values(reward), vec![0.5; 2 * n]);
        assert_eq!(
            values(traj.get_or_err("observation")?),
            [0.0, 1.0].repeat(n)
        );
        assert_eq!(
            values(traj.get_or_err(("next", "observation"))?),
            [1.0, 2.0].repeat(n)
        );
        assert!(!traj.contains("reward") && !traj.contains(("next", "reward")));
        assert!(
            !traj.contains("nested"),
            "the root of a step has no \"nested\" level"
        );
        // the root after a step has the reset root's keys
        let td = env.reset(None)?;
        let reset_keys = sorted(td.keys(torchrl::tensordict::KeysOptions::nested_leaves()));
        let with_action = env.rand_action(Some(td))?;
        let stepped = env.step(with_action)?;
        let root = env.step_mdp(&stepped)?.exclude(&["action"]);
        assert_eq!(
            sorted(root.keys(torchrl::tensordict::KeysOptions::nested_leaves())),
            reset_keys
        );
        check_env_specs(&mut env, Some(0))?;
    }
    Ok(())
}

/// Adds a float64 state entry `"hidden"` (state spec, reset and step outputs) and checks that
/// it comes back as float64 on the way in.
struct HiddenState;

impl Transform for HiddenState {
    fn name(&self) -> String {
        "HiddenState".into()
    }
    fn transform_state_spec(&self, mut spec: Composite) -> Result<Composite> {
        let shape = [spec.shape(), &[2]].concat();
        spec.set(
            "hidden",
            Unbounded::new()
                .with_shape(shape)?
                .with_dtype(Kind::Double)?,
        )?;
        Ok(spec)
    }
    fn reset(&mut self, _td: &TensorDict, mut reset: TensorDict) -> Result<TensorDict> {
        let shape = [reset.batch_size(), &[2]].concat();
        reset.set(
            "hidden",
            Tensor::f_full(shape, 7.0, (Kind::Double, Device::Cpu))?,
        )?;
        Ok(reset)
    }
    fn step(&mut self, _td: &TensorDict, mut next: TensorDict) -> Result<TensorDict> {
        let shape = [next.batch_size(), &[2]].concat();
        next.set(
            "hidden",
            Tensor::f_full(shape, 8.0, (Kind::Double, Device::Cpu))?,
        )?;
        Ok(next)
    }
    fn inv(&mut self, td: TensorDict) -> Result<TensorDict> {
        match td.get("hidden") {
            Some(h) if h.kind() != Kind::Double => Err(Error::DtypeMismatch {
                op: "HiddenState::inv",
                key: "\"hidden\"".into(),
                expected: Kind::Double,
                actual: h.kind(),
            }),
            _ => Ok(td),
        }
    }
}

#[test]
fn dtype_cast_state_keys_both_ways() -> Result<()> {
    for b in [vec![], vec![4]] {
        let cfg = EnvCfg::new(Kind::Double).max_steps(2).batch(&b);
        let mut env = TransformedEnv::new(base(&cfg)?)?
            .with(HiddenState)?
            .with(DoubleToFloat::new())?;
        assert_eq!(env.state_keys(), [k("hidden")]);
        assert_eq!(
            env.specs().state.get("hidden").and_then(|s| s.dtype()),
            Some(Kind::Float)
        );
        // the state is cast forward at reset and step, and back (checked by HiddenState) on the
        // way in
        let traj = rollout_half(&mut env, 3)?;
        let h = traj.get_or_err("hidden")?;
        assert_eq!(h.kind(), Kind::Float);
        assert_eq!(values(h).first().copied(), Some(7.0));
        check_env_specs(&mut env, Some(0))?;
    }
    Ok(())
}
