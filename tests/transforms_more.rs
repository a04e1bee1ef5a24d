//! FrameSkipTransform, VecNorm and ClipTransform (issue 26, item 7).
//!
//! - replays `specs/transforms_more_cases.json`, recorded from TorchRL 0.14.1 by
//!   `specs/record_transforms_more.py` on a Python mirror of `CountingEnv`: every rollout leaf
//!   (actions excepted: random and never read), every spec group, and VecNorm's statistics
//!   after the rollout;
//! - hand-derived: VecNorm statistics shared by two envs equal those of one batched env, the
//!   state survives save / load, freeze stops the updates; ClipTransform's inverse clamps
//!   actions; FrameSkipTransform refuses 0 and offline data; `check_env_specs` passes on each.

use serde_json::Value;
use tch::{Device, Kind, Tensor};
use torchrl::envs::builtin::{CountingEnv, PendulumEnv};
use torchrl::envs::transforms::{
    ClipTransform, FrameSkipTransform, StepCounter, Transform, TransformedEnv, VecNorm,
};
use torchrl::envs::{check_env_specs, EnvBase, RolloutConfig};
use torchrl::specs::TensorSpec;
use torchrl::tensordict::KeysOptions;
use torchrl::{NestedKey, TensorDict};

type R<T> = Result<T, String>;

fn s<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

fn floats(t: &Tensor) -> Vec<f64> {
    Vec::<f64>::try_from(t.to_kind(Kind::Double).reshape([-1])).unwrap_or_default()
}

fn kind_of(name: &str) -> R<Kind> {
    Ok(match name {
        "float32" => Kind::Float,
        "float64" => Kind::Double,
        "int64" => Kind::Int64,
        "bool" => Kind::Bool,
        other => return Err(format!("unknown dtype {other}")),
    })
}

/// Compares a tensor with its JSON encoding: dtype, shape, values (floats within 1e-6
/// relative, the others exactly).
fn check_tensor(t: &Tensor, v: &Value, what: &str) -> R<()> {
    let kind = kind_of(v["dtype"].as_str().ok_or("dtype")?)?;
    if t.kind() != kind {
        return Err(format!("{what}: dtype {:?}, expected {kind:?}", t.kind()));
    }
    let shape: Vec<i64> = v["shape"]
        .as_array()
        .ok_or("shape")?
        .iter()
        .filter_map(Value::as_i64)
        .collect();
    if t.size() != shape {
        return Err(format!("{what}: shape {:?}, expected {shape:?}", t.size()));
    }
    let got = floats(t);
    let data = v["data"].as_array().ok_or("data")?;
    if got.len() != data.len() {
        return Err(format!(
            "{what}: {} values, expected {}",
            got.len(),
            data.len()
        ));
    }
    for (i, (g, e)) in got.iter().zip(data).enumerate() {
        let e = match e {
            Value::Bool(b) => f64::from(u8::from(*b)),
            other => other.as_f64().ok_or("number")?,
        };
        let tol = if kind == Kind::Float || kind == Kind::Double {
            1e-6 * e.abs().max(1.0)
        } else {
            0.0
        };
        if (g - e).abs() > tol {
            return Err(format!(
                "{what}: element {i} is {g}, expected {e} (got {got:?})"
            ));
        }
    }
    Ok(())
}

fn load() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/specs/transforms_more_cases.json"
    );
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path} is not JSON: {e}"))
}

fn key_of(v: &Value) -> R<NestedKey> {
    let parts: Vec<&str> = v
        .as_array()
        .ok_or("key is not a list")?
        .iter()
        .map(|p| p.as_str().ok_or("key segment is not a string"))
        .collect::<Result<_, _>>()?;
    Ok(NestedKey::from(parts))
}

fn keys_of(v: &Value) -> Option<Vec<NestedKey>> {
    v.as_array().map(|a| {
        a.iter()
            .filter_map(|k| k.as_str().map(NestedKey::from))
            .collect()
    })
}

fn build_transform(v: &Value) -> R<Box<dyn Transform>> {
    let t: Box<dyn Transform> = match v["class"].as_str().ok_or("class")? {
        "FrameSkipTransform" => Box::new(
            FrameSkipTransform::new(v["frame_skip"].as_u64().ok_or("frame_skip")? as usize)
                .map_err(s)?,
        ),
        "StepCounter" => Box::new(StepCounter::new()),
        "VecNorm" => {
            let mut t = VecNorm::new();
            if let Some(d) = v["decay"].as_f64() {
                t = t.with_decay(d).map_err(s)?;
            }
            if let Some(e) = v["eps"].as_f64() {
                t = t.with_eps(e).map_err(s)?;
            }
            if let Some(k) = keys_of(&v["in_keys"]) {
                t = t.with_in_keys(k);
            }
            if let Some(k) = keys_of(&v["out_keys"]) {
                t = t.with_out_keys(k);
            }
            Box::new(t)
        }
        "ClipTransform" => {
            let mut t = ClipTransform::new(v["low"].as_f64(), v["high"].as_f64()).map_err(s)?;
            if let Some(k) = keys_of(&v["in_keys"]) {
                t = t.with_in_keys(k);
            }
            if let Some(k) = keys_of(&v["out_keys"]) {
                t = t.with_out_keys(k);
            }
            Box::new(t)
        }
        other => return Err(format!("unknown transform {other}")),
    };
    Ok(t)
}

fn check_spec(spec: &TensorSpec, v: &Value, what: &str) -> R<()> {
    let class = v["class"].as_str().ok_or("class")?;
    if spec.class_name() != class {
        return Err(format!(
            "{what}: class {}, expected {class}",
            spec.class_name()
        ));
    }
    let shape: Vec<i64> = v["shape"]
        .as_array()
        .ok_or("shape")?
        .iter()
        .filter_map(Value::as_i64)
        .collect();
    if spec.shape() != shape.as_slice() {
        return Err(format!(
            "{what}: shape {:?}, expected {shape:?}",
            spec.shape()
        ));
    }
    if let TensorSpec::Bounded(b) = spec {
        check_tensor(b.low(), &v["low"], &format!("{what}.low"))?;
        check_tensor(b.high(), &v["high"], &format!("{what}.high"))?;
    }
    Ok(())
}

fn replay(case: &Value) -> R<()> {
    let expect = &case["expect"];
    let max_steps = case["env"]["max_steps"].as_i64().ok_or("max_steps")?;
    let batch: Vec<i64> = case["env"]["batch_size"]
        .as_array()
        .ok_or("batch_size")?
        .iter()
        .filter_map(Value::as_i64)
        .collect();
    let mut env =
        TransformedEnv::new(CountingEnv::new(max_steps, &batch).map_err(s)?).map_err(s)?;
    let mut vecnorm: Option<VecNorm> = None;
    for t in case["transforms"].as_array().ok_or("transforms")? {
        let built = build_transform(t)?;
        if t["class"] == "VecNorm" {
            // keep a handle on the statistics
            let typed = built
                .as_any()
                .downcast_ref::<VecNorm>()
                .ok_or("VecNorm downcast")?;
            vecnorm = Some(typed.shared());
        }
        env.append_boxed(built).map_err(s)?;
    }
    let specs = env.specs().clone();
    for (group, comp) in [
        ("observation", &specs.observation),
        ("reward", &specs.reward),
        ("done", &specs.done),
        ("state", &specs.state),
        ("action", &specs.action),
    ] {
        let want = expect["specs"][group].as_array().ok_or("specs")?;
        let mut want_keys: Vec<NestedKey> = want.iter().map(|e| key_of(&e[0])).collect::<R<_>>()?;
        let mut got = comp.keys(KeysOptions::nested_leaves());
        want_keys.sort();
        got.sort();
        if want_keys != got {
            return Err(format!("{group} spec keys {got:?}, expected {want_keys:?}"));
        }
        for e in want {
            let k = key_of(&e[0])?;
            check_spec(
                comp.get(&k).ok_or("spec")?,
                &e[1],
                &format!("{group} spec {k}"),
            )?;
        }
    }
    let cfg = RolloutConfig {
        break_when_any_done: case["rollout"]["break_when_any_done"].as_bool(),
        ..Default::default()
    };
    env.set_seed(0).map_err(s)?;
    let steps = case["rollout"]["max_steps"].as_u64().ok_or("steps")? as usize;
    let traj = env.rollout(steps, None, &cfg).map_err(s)?;
    let want = expect["rollout"].as_array().ok_or("rollout")?;
    let mut want_keys: Vec<NestedKey> = want.iter().map(|e| key_of(&e[0])).collect::<R<_>>()?;
    let mut got = traj.keys(KeysOptions::nested_leaves());
    want_keys.sort();
    got.sort();
    if want_keys != got {
        return Err(format!("rollout keys {got:?}, expected {want_keys:?}"));
    }
    for e in want {
        if e[1].is_null() {
            continue;
        }
        let k = key_of(&e[0])?;
        check_tensor(traj.get(&k).ok_or("leaf")?, &e[1], &format!("rollout {k}"))?;
    }
    if let Some(state) = expect.get("vecnorm_state") {
        let vn = vecnorm.ok_or("a vecnorm_state without a VecNorm")?;
        let got = vn.state_dict().map_err(s)?;
        for e in state.as_array().ok_or("vecnorm_state")? {
            let k = key_of(&e[0])?;
            let t = got.get(&k).ok_or(format!("VecNorm state has no {k}"))?;
            check_tensor(t, &e[1], &format!("vecnorm state {k}"))?;
        }
    }
    Ok(())
}

#[test]
fn reference_cases_from_torchrl() {
    let root = load();
    let cases = root["cases"].as_array().expect("cases");
    assert!(cases.len() >= 13, "only {} cases", cases.len());
    let failures: Vec<String> = cases
        .iter()
        .filter_map(|c| replay(c).err().map(|e| format!("{}: {e}", c["name"])))
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

fn counting(batch: &[i64]) -> TransformedEnv<CountingEnv> {
    TransformedEnv::new(CountingEnv::new(3, batch).unwrap()).unwrap()
}

#[test]
fn vecnorm_shared_by_two_envs_equals_one_batched_env() {
    // one env of batch [2] ...
    let one = VecNorm::new().with_decay(0.9).unwrap();
    let one_stats = one.shared();
    let mut env = counting(&[2]).with(one).unwrap();
    env.rollout(5, None, &RolloutConfig::no_break()).unwrap();
    // ... and two envs of batch [1] sharing one statistics (decay 1: plain sums)
    let a = VecNorm::new().with_decay(1.0).unwrap();
    let stats = a.shared();
    let b = a.shared();
    let mut e1 = counting(&[1]).with(a).unwrap();
    let mut e2 = counting(&[1]).with(b).unwrap();
    for e in [&mut e1, &mut e2] {
        e.rollout(5, None, &RolloutConfig::no_break()).unwrap();
    }
    // Each env (max_steps 3, no break) updates the statistics 7 times with one element: the
    // reset (obs 0), steps 1, 2, 3 (done), the partial reset that follows (obs 0), steps 1, 2.
    let st = stats.state_dict().unwrap();
    let count = st.get("observation_count").unwrap().double_value(&[0]);
    let sum = st.get("observation_sum").unwrap().double_value(&[0]);
    let ssq = st.get("observation_ssq").unwrap().double_value(&[0]);
    assert_eq!(count, 14.0); // 2 envs × (1 reset + 5 steps + 1 partial reset)
    assert_eq!(sum, 2.0 * (0.0 + 1.0 + 2.0 + 3.0 + 0.0 + 1.0 + 2.0));
    assert_eq!(ssq, 2.0 * (0.0 + 1.0 + 4.0 + 9.0 + 0.0 + 1.0 + 4.0));
    // the batched env saw the same values per element with decay 0.9: 7 updates of 2
    let c = one_stats
        .state_dict()
        .unwrap()
        .get("observation_count")
        .unwrap()
        .double_value(&[0]);
    let want: f64 = (0..7).map(|i| 2.0 * 0.9f64.powi(i)).sum();
    assert!((c - want).abs() < 1e-5, "{c} vs {want}");
}

#[test]
fn vecnorm_state_saved_loaded_and_frozen() {
    let t = VecNorm::new().with_in_keys(["observation"]);
    let stats = t.shared();
    let mut env = counting(&[3]).with(t).unwrap();
    env.rollout(4, None, &RolloutConfig::no_break()).unwrap();
    let dir = std::env::temp_dir().join(format!("vecnorm_{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("stats.safetensors");
    stats.save(&path).unwrap();
    let fresh = VecNorm::new().with_in_keys(["observation"]);
    fresh.load(&path).unwrap();
    let (a, b) = (stats.state_dict().unwrap(), fresh.state_dict().unwrap());
    for k in ["observation_sum", "observation_ssq", "observation_count"] {
        assert!(a.get(k).unwrap().equal(b.get(k).unwrap()), "{k}");
    }
    // the loaded transform normalizes as the original: same loc / scale
    let (l1, s1) = stats.loc_scale("observation").unwrap();
    let (l2, s2) = fresh.loc_scale("observation").unwrap();
    assert!(l1.equal(&l2) && s1.equal(&s2));
    // a frozen copy does not move
    let mut frozen = stats.frozen_copy().unwrap();
    let before = frozen.state_dict().unwrap();
    let td = TensorDict::new([3])
        .unwrap()
        .with(
            "observation",
            Tensor::ones([3, 1], (Kind::Float, Device::Cpu)) * 50.0,
        )
        .unwrap();
    let out = frozen.forward(td).unwrap();
    let after = frozen.state_dict().unwrap();
    assert!(before
        .get("observation_sum")
        .unwrap()
        .equal(after.get("observation_sum").unwrap()));
    // normalized with the frozen statistics: (50 - loc) / scale
    let want = (Tensor::from(50.0f32) - &l1) / s1.clamp_min(1e-4);
    let got = out.get("observation").unwrap().select(0, 0);
    assert!((got - want).abs().max().double_value(&[]) < 1e-5);
    // loading statistics without an in key's entries is an error naming it
    let empty = TensorDict::new(Vec::<i64>::new()).unwrap();
    let err = fresh.load_state_dict(&empty).unwrap_err().to_string();
    assert!(err.contains("observation_sum"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn clip_inverse_clamps_actions_and_checks_pass() {
    let mut clip = ClipTransform::new(Some(-0.5), Some(0.5))
        .unwrap()
        .with_in_keys_inv(["action"]);
    let a = Tensor::from_slice(&[-2.0f32, 0.25, 3.0]).reshape([3, 1]);
    let td = TensorDict::new([3]).unwrap().with("action", a).unwrap();
    let out = clip.inv(td).unwrap();
    let got = Vec::<f32>::try_from(out.get("action").unwrap().reshape([-1])).unwrap();
    assert_eq!(got, vec![-0.5, 0.25, 0.5]);
    // both bounds missing, or low >= high, are refused
    assert!(ClipTransform::new(None, None).is_err());
    assert!(ClipTransform::new(Some(1.0), Some(1.0)).is_err());
    // a clipped Pendulum keeps its specs' word
    let mut env = TransformedEnv::new(PendulumEnv::new(&[4], Device::Cpu).unwrap())
        .unwrap()
        .with(
            ClipTransform::new(Some(-0.5), Some(0.5))
                .unwrap()
                .with_in_keys(["observation", "reward"])
                .with_in_keys_inv(["action"]),
        )
        .unwrap();
    check_env_specs(&mut env, Some(0)).unwrap();
    // an in key in neither the observation nor the reward spec is refused at append
    let bad = ClipTransform::new(Some(0.0), None)
        .unwrap()
        .with_in_keys(["nope"]);
    let err = TransformedEnv::new(PendulumEnv::new(&[], Device::Cpu).unwrap())
        .unwrap()
        .with(bad)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(err.contains("nope"), "{err}");
}

#[test]
fn frame_skip_checks_and_refusals() {
    assert!(FrameSkipTransform::new(0).is_err());
    let mut fs = FrameSkipTransform::new(2).unwrap();
    assert!(fs.forward(TensorDict::new([2]).unwrap()).is_err());
    for batch in [vec![], vec![3]] {
        let mut env = counting(&batch)
            .with(FrameSkipTransform::new(2).unwrap())
            .unwrap();
        check_env_specs(&mut env, Some(0)).unwrap();
    }
    // with VecNorm after it: the normalized reward is the sum over frames normalized once
    let mut env = TransformedEnv::new(PendulumEnv::new(&[2], Device::Cpu).unwrap())
        .unwrap()
        .with(FrameSkipTransform::new(4).unwrap())
        .unwrap()
        .with(VecNorm::new())
        .unwrap();
    check_env_specs(&mut env, Some(0)).unwrap();
}

#[test]
fn partial_reset_check_skips_envs_coupled_by_vecnorm_only() {
    use torchrl::envs::batched::{ParallelEnv, SerialEnv};
    use torchrl::envs::check_partial_reset;
    let wrapped = || counting(&[2]).with(VecNorm::new()).unwrap();
    assert!(wrapped().couples_batch_elements());
    let mut frozen_norm = VecNorm::new();
    frozen_norm.freeze();
    assert!(!counting(&[2])
        .with(frozen_norm)
        .unwrap()
        .couples_batch_elements());
    assert!(SerialEnv::new(vec![wrapped(), wrapped()])
        .unwrap()
        .couples_batch_elements());
    assert!(ParallelEnv::new(vec![wrapped(), wrapped()])
        .unwrap()
        .couples_batch_elements());
    assert!(!SerialEnv::new(vec![counting(&[2]), counting(&[2])])
        .unwrap()
        .couples_batch_elements());
    // an updating VecNorm changes every element's output at a partial reset: skipped, Ok
    check_partial_reset(&mut wrapped(), 0).unwrap();
}
