//! Tests of the reward & episode transforms: RewardScaling, RewardSum, StepCounter,
//! RewardClipping, InitTracker, TensorDictPrimer, ActionClamp.
//!
//! - spec rewriting: `check_env_specs` on `TransformedEnv(CountingEnv)` at batch `[]` and `[4]`,
//!   and the base env's specs unchanged after wrapping;
//! - data rewriting: replays `specs/transforms_reward_cases.json`, recorded from TorchRL 0.14.1
//!   by `specs/record_transforms_reward.py` with a Python mirror of `CountingEnv` (actions are
//!   random but never read by the counter, so only their key is compared); every recorded leaf
//!   is compared (exact for ints and bools, 1e-6 for floats), and so are the spec groups;
//! - hand-derived edge cases: partial resets on batched envs, errors and their messages.

use serde_json::Value;
use tch::{Device, Kind, Tensor};
use torchrl::envs::builtin::CountingEnv;
use torchrl::envs::transforms::{
    ActionClamp, InitTracker, NanPolicy, RewardClipping, RewardScaling, RewardSum, StepCounter,
    TensorDictPrimer, Transform, TransformedEnv,
};
use torchrl::envs::{check_env_specs, EnvBase, EnvSpecs, RolloutConfig};
use torchrl::specs::{Bounded, TensorSpec, Unbounded};
use torchrl::tensordict::KeysOptions;
use torchrl::{NestedKey, TensorDict};

type R<T> = Result<T, String>;

fn s<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

fn floats(t: &Tensor) -> Vec<f64> {
    Vec::<f64>::try_from(t.to_kind(Kind::Double).reshape([-1])).unwrap_or_default()
}

fn ints(t: &Tensor) -> Vec<i64> {
    Vec::<i64>::try_from(t.to_kind(Kind::Int64).reshape([-1])).unwrap_or_default()
}

fn env_with(
    batch: &[i64],
    max_steps: i64,
    ts: Vec<Box<dyn Transform>>,
) -> torchrl::Result<TransformedEnv<CountingEnv>> {
    let mut env = TransformedEnv::new(CountingEnv::new(max_steps, batch)?)?;
    for t in ts {
        env.append_boxed(t)?;
    }
    Ok(env)
}

// ------------------------------------------------------------------ transform factories

/// Builds the transforms of one configuration for an env of the given batch size.
type Factory = fn(&[i64]) -> torchrl::Result<Vec<Box<dyn Transform>>>;

/// Every transform configuration exercised by the spec tests.
fn factories() -> Vec<(&'static str, Factory)> {
    vec![
        ("reward_scaling", |_| {
            Ok(vec![Box::new(RewardScaling::new(0.5, 1.5)?)])
        }),
        ("reward_scaling_standard_normal_out_key", |_| {
            Ok(vec![Box::new(
                RewardScaling::new(0.5, 1.5)?
                    .with_standard_normal(true)
                    .with_out_keys(["scaled"]),
            )])
        }),
        ("reward_sum", |_| Ok(vec![Box::new(RewardSum::new())])),
        ("step_counter_max3", |_| {
            Ok(vec![Box::new(StepCounter::new().with_max_steps(3)?)])
        }),
        ("step_counter_no_max", |_| {
            Ok(vec![Box::new(StepCounter::new())])
        }),
        ("step_counter_no_update_done", |_| {
            Ok(vec![Box::new(
                StepCounter::new()
                    .with_max_steps(2)?
                    .with_update_done(false),
            )])
        }),
        ("reward_clipping", |_| {
            Ok(vec![Box::new(RewardClipping::new(-0.25, 0.75)?)])
        }),
        ("reward_clipping_out_key", |_| {
            Ok(vec![Box::new(
                RewardClipping::new(0.0, 0.5)?.with_out_keys(["clipped"]),
            )])
        }),
        ("init_tracker", |_| Ok(vec![Box::new(InitTracker::new())])),
        ("primer_expand", |_| {
            Ok(vec![Box::new(
                TensorDictPrimer::new()
                    .with_primer("hidden", Unbounded::new().with_shape([2, 3])?)
                    .with_primer(("rnn", "c"), Bounded::new(-1.0, 1.0, [3])?)
                    .with_expand_specs(true),
            )])
        }),
        ("primer_full_shape_random", |b| {
            let shape: Vec<i64> = [b, &[5]].concat();
            Ok(vec![Box::new(
                TensorDictPrimer::new()
                    .with_primer("noise", Bounded::new(0.0, 1.0, &shape)?)
                    .with_random(true)
                    .with_seed(7),
            )])
        }),
        ("action_clamp", |_| Ok(vec![Box::new(ActionClamp::new())])),
        ("full_stack", |_| {
            Ok(vec![
                Box::new(StepCounter::new().with_max_steps(3)?),
                Box::new(RewardScaling::new(0.5, 1.5)?),
                Box::new(RewardSum::new()),
                Box::new(InitTracker::new()),
                Box::new(
                    TensorDictPrimer::new()
                        .with_primer("h", Unbounded::new())
                        .with_expand_specs(true),
                ),
                Box::new(ActionClamp::new()),
                Box::new(RewardClipping::new(-10.0, 10.0)?),
            ])
        }),
    ]
}

#[test]
fn check_env_specs_every_transform() {
    let mut failures = Vec::new();
    for batch in [vec![], vec![4]] {
        for max_steps in [2, 10] {
            for (name, make) in factories() {
                let r = (|| -> torchrl::Result<()> {
                    let mut env = env_with(&batch, max_steps, make(&batch)?)?;
                    check_env_specs(&mut env, Some(0))
                })();
                if let Err(e) = r {
                    failures.push(format!("{name} batch={batch:?} max_steps={max_steps}: {e}"));
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn base_specs_unchanged_after_wrapping() {
    let mut failures = Vec::new();
    for batch in [vec![], vec![4]] {
        for (name, make) in factories() {
            let r = (|| -> torchrl::Result<Option<String>> {
                let base = CountingEnv::new(5, &batch)?;
                let before: EnvSpecs = base.specs().clone();
                let mut env = TransformedEnv::new(base)?;
                for t in make(&batch)? {
                    env.append_boxed(t)?;
                }
                let _ = env.rollout(3, None, &RolloutConfig::no_break())?;
                if env.base().specs() != &before {
                    return Ok(Some(format!(
                        "base specs changed:\nbefore {before:?}\nafter {:?}",
                        env.base().specs()
                    )));
                }
                Ok(None)
            })();
            match r {
                Ok(None) => {}
                Ok(Some(m)) => failures.push(format!("{name} {batch:?}: {m}")),
                Err(e) => failures.push(format!("{name} {batch:?}: {e}")),
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

// ------------------------------------------------------------------ reference cases

fn load() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/specs/transforms_reward_cases.json"
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

fn shape_of(v: &Value) -> R<Vec<i64>> {
    v.as_array()
        .ok_or("shape is not a list")?
        .iter()
        .map(|d| {
            d.as_i64()
                .ok_or_else(|| "shape dim is not an int".to_string())
        })
        .collect()
}

fn kind_of(name: &str) -> R<Kind> {
    Ok(match name {
        "float32" => Kind::Float,
        "float64" => Kind::Double,
        "int64" => Kind::Int64,
        "int32" => Kind::Int,
        "bool" => Kind::Bool,
        other => return Err(format!("unknown dtype {other}")),
    })
}

/// Compares a tensor with its JSON encoding: dtype, shape, values.
fn check_tensor(t: &Tensor, v: &Value, what: &str) -> R<()> {
    let kind = kind_of(v["dtype"].as_str().ok_or("dtype")?)?;
    if t.kind() != kind {
        return Err(format!("{what}: dtype {:?}, expected {kind:?}", t.kind()));
    }
    let shape = shape_of(&v["shape"])?;
    if t.size() != shape {
        return Err(format!("{what}: shape {:?}, expected {shape:?}", t.size()));
    }
    let data = v["data"].as_array().ok_or("data")?;
    match kind {
        Kind::Float | Kind::Double => {
            let got = floats(t);
            for (i, (g, e)) in got.iter().zip(data).enumerate() {
                let e = e.as_f64().ok_or("float data")?;
                if (g - e).abs() > 1e-6 * e.abs().max(1.0) {
                    return Err(format!(
                        "{what}: element {i} is {g}, expected {e} (got {got:?})"
                    ));
                }
            }
        }
        Kind::Bool => {
            let got = ints(t);
            let want: Vec<i64> = data
                .iter()
                .map(|b| i64::from(b.as_bool().unwrap_or(false)))
                .collect();
            if got != want {
                return Err(format!("{what}: got {got:?}, expected {want:?}"));
            }
        }
        _ => {
            let got = ints(t);
            let want: Vec<i64> = data
                .iter()
                .map(|x| x.as_i64().unwrap_or(i64::MIN))
                .collect();
            if got != want {
                return Err(format!("{what}: got {got:?}, expected {want:?}"));
            }
        }
    }
    Ok(())
}

/// Compares a leaf spec with its JSON summary (class, dtype, shape, bounds, n).
fn check_spec(spec: &TensorSpec, v: &Value, what: &str) -> R<()> {
    let class = v["class"].as_str().ok_or("class")?;
    if spec.class_name() != class {
        return Err(format!(
            "{what}: class {}, expected {class}",
            spec.class_name()
        ));
    }
    let kind = kind_of(v["dtype"].as_str().ok_or("dtype")?)?;
    if spec.dtype() != Some(kind) {
        return Err(format!(
            "{what}: dtype {:?}, expected {kind:?}",
            spec.dtype()
        ));
    }
    let shape = shape_of(&v["shape"])?;
    if spec.shape() != shape.as_slice() {
        return Err(format!(
            "{what}: shape {:?}, expected {shape:?}",
            spec.shape()
        ));
    }
    match spec {
        TensorSpec::Bounded(b) => {
            check_tensor(b.low(), &v["low"], &format!("{what}.low"))?;
            check_tensor(b.high(), &v["high"], &format!("{what}.high"))?;
        }
        TensorSpec::Categorical(c) if Some(c.n()) != v["n"].as_i64() => {
            return Err(format!("{what}: n {}, expected {}", c.n(), v["n"]));
        }
        _ => {}
    }
    Ok(())
}

fn build_transform(v: &Value) -> R<Box<dyn Transform>> {
    let f = |k: &str| v[k].as_f64().ok_or(format!("{k} missing in {v}"));
    let b = |k: &str| v[k].as_bool().unwrap_or(false);
    let t: Box<dyn Transform> = match v["class"].as_str().ok_or("class")? {
        "RewardScaling" => {
            let mut t = RewardScaling::new(f("loc")?, f("scale")?)
                .map_err(s)?
                .with_standard_normal(b("standard_normal"));
            if let Some(outs) = v["out_keys"].as_array() {
                let keys: Vec<String> = outs
                    .iter()
                    .filter_map(|o| o.as_str().map(String::from))
                    .collect();
                t = t.with_out_keys(keys.iter().map(String::as_str));
            }
            Box::new(t)
        }
        "RewardSum" => Box::new(RewardSum::new().with_reward_spec(b("reward_spec"))),
        "StepCounter" => match v["max_steps"].as_i64() {
            Some(m) => Box::new(StepCounter::new().with_max_steps(m).map_err(s)?),
            None => Box::new(StepCounter::new()),
        },
        "RewardClipping" => {
            Box::new(RewardClipping::new(f("clamp_min")?, f("clamp_max")?).map_err(s)?)
        }
        "InitTracker" => Box::new(InitTracker::new()),
        "TensorDictPrimer" => {
            let mut t = TensorDictPrimer::new().with_expand_specs(b("expand_specs"));
            for (k, shape) in v["primers"].as_object().ok_or("primers")? {
                t = t.with_primer(
                    k.as_str(),
                    Unbounded::new().with_shape(shape_of(shape)?).map_err(s)?,
                );
            }
            Box::new(t)
        }
        other => return Err(format!("unknown transform {other}")),
    };
    Ok(t)
}

fn build_env(case: &Value) -> R<TransformedEnv<CountingEnv>> {
    let max_steps = case["env"]["max_steps"].as_i64().ok_or("max_steps")?;
    let batch = shape_of(&case["env"]["batch_size"])?;
    let mut ts = Vec::new();
    for t in case["transforms"].as_array().ok_or("transforms")? {
        ts.push(build_transform(t)?);
    }
    env_with(&batch, max_steps, ts).map_err(s)
}

fn check_specs(env: &TransformedEnv<CountingEnv>, expect: &Value) -> R<()> {
    let specs = env.specs();
    for (group, comp) in [
        ("observation", &specs.observation),
        ("reward", &specs.reward),
        ("done", &specs.done),
        ("state", &specs.state),
        ("action", &specs.action),
    ] {
        let want = expect["specs"][group]
            .as_array()
            .ok_or(format!("specs.{group}"))?;
        let mut want_keys: Vec<NestedKey> = want.iter().map(|e| key_of(&e[0])).collect::<R<_>>()?;
        let mut got_keys = comp.keys(KeysOptions::nested_leaves());
        want_keys.sort();
        got_keys.sort();
        if want_keys != got_keys {
            return Err(format!(
                "{group} spec keys {got_keys:?}, expected {want_keys:?}"
            ));
        }
        for e in want {
            let k = key_of(&e[0])?;
            let spec = comp.get(&k).ok_or(format!("{group} spec has no {k}"))?;
            check_spec(spec, &e[1], &format!("{group} spec {k}"))?;
        }
    }
    Ok(())
}

fn check_rollout(traj: &TensorDict, expect: &Value) -> R<()> {
    let want = expect["rollout"].as_array().ok_or("rollout")?;
    let mut want_keys: Vec<NestedKey> = want.iter().map(|e| key_of(&e[0])).collect::<R<_>>()?;
    let mut got_keys = traj.keys(torchrl::tensordict::KeysOptions::nested_leaves());
    want_keys.sort();
    got_keys.sort();
    if want_keys != got_keys {
        return Err(format!("rollout keys {got_keys:?}, expected {want_keys:?}"));
    }
    for e in want {
        if e[1].is_null() {
            continue; // the action: random, never read by the counter
        }
        let k = key_of(&e[0])?;
        let t = traj.get(&k).ok_or(format!("rollout has no {k}"))?;
        check_tensor(t, &e[1], &format!("rollout {k}"))?;
    }
    Ok(())
}

fn replay(case: &Value) -> R<()> {
    let name = case["name"].as_str().ok_or("name")?;
    let expect = &case["expect"];
    if let Some(err) = expect.get("error") {
        let r = build_env(case);
        let msg = match r {
            Ok(_) => return Err(format!("expected an error like TorchRL's {err}, got Ok")),
            Err(m) => m,
        };
        let facts: &[&str] = match name {
            "error_scaling_bounded_reward" => &["RewardScaling", "Bounded", "\"reward\""],
            "error_step_counter_zero_max" => {
                &["max_steps should have a value greater or equal to one"]
            }
            _ => &[],
        };
        for f in facts {
            if !msg.contains(f) {
                return Err(format!("error message {msg:?} lacks {f:?}"));
            }
        }
        return Ok(());
    }
    if name == "reward_scaling_zero_scale" {
        // Deliberate difference: TorchRL clamps the scale to 1e-6, we refuse it.
        return match build_env(case) {
            Ok(_) => Err("RewardScaling(0, 0) was accepted; it must be rejected".into()),
            Err(m) if m.contains("scale must be a finite number > 0, got 0") => Ok(()),
            Err(m) => Err(format!("unexpected message {m:?}")),
        };
    }
    let mut env = build_env(case)?;
    check_specs(&env, expect)?;
    let steps = case["rollout"]["max_steps"]
        .as_u64()
        .ok_or("rollout.max_steps")? as usize;
    let cfg = RolloutConfig {
        break_when_any_done: case["rollout"]["break_when_any_done"].as_bool(),
        ..Default::default()
    };
    env.set_seed(0).map_err(s)?;
    let traj = env.rollout(steps, None, &cfg).map_err(s)?;
    check_rollout(&traj, expect)
}

/// `RewardSum::with_reward_spec(true)`: replayed in full by [`reward_sum_reward_spec_rollout`]
/// (which also runs it through `check_env_specs` and a non-stop rollout).
const REPLAYED_SEPARATELY: &[&str] = &["reward_sum_reward_spec"];

#[test]
fn reference_cases_from_torchrl() {
    let root = load();
    let cases = root["cases"].as_array().expect("cases");
    assert!(cases.len() >= 20, "only {} cases", cases.len());
    let mut failures = Vec::new();
    for case in cases {
        let name = case["name"].as_str().unwrap_or("?");
        let r = if REPLAYED_SEPARATELY.contains(&name) {
            Ok(())
        } else {
            replay(case)
        };
        if let Err(e) = r {
            failures.push(format!("{name}: {e}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

/// TorchRL's `RewardSum(reward_spec=True)` case, replayed in full (specs and every rollout
/// value: `episode_reward` 0, 1, 2, 3 at the roots, 1, 2, 3, 4 under `"next"`), then
/// `check_env_specs` at batch `[]` and `[4]` and a non-stop rollout across a reset.
#[test]
fn reward_sum_reward_spec_rollout() -> torchrl::Result<()> {
    let root = load();
    let cases = root["cases"].as_array().expect("cases");
    let mut seen = 0;
    for case in cases {
        let name = case["name"].as_str().unwrap_or("?");
        if REPLAYED_SEPARATELY.contains(&name) {
            seen += 1;
            if let Err(e) = replay(case) {
                panic!("{name}: {e}");
            }
        }
    }
    assert_eq!(seen, REPLAYED_SEPARATELY.len());
    for batch in [vec![], vec![4]] {
        let mut env = env_with(
            &batch,
            3,
            vec![Box::new(RewardSum::new().with_reward_spec(true))],
        )?;
        check_env_specs(&mut env, Some(0))?;
        // CountingEnv(3) is done at the third step and reset: the sum starts again.
        let traj = env.rollout(5, None, &RolloutConfig::no_break())?;
        let sums = floats(traj.get_or_err(("next", "episode_reward"))?);
        let per_env: Vec<f64> = sums.iter().take(5).copied().collect();
        assert_eq!(per_env, vec![1.0, 2.0, 3.0, 1.0, 2.0], "batch {batch:?}");
    }
    Ok(())
}

// ------------------------------------------------------------------ hand-derived edge cases

/// Steps `env` `n` times from `td` (actions zero), returning the last next-root.
fn steps(
    env: &mut TransformedEnv<CountingEnv>,
    mut td: TensorDict,
    n: usize,
) -> torchrl::Result<TensorDict> {
    for _ in 0..n {
        let a = env.rand_action(Some(td))?;
        let stepped = env.step(a)?;
        td = env.step_mdp(&stepped)?;
    }
    Ok(td)
}

fn mask(vals: &[bool], trailing_one: bool) -> Tensor {
    let t = Tensor::from_slice(vals);
    if trailing_one {
        t.unsqueeze(-1)
    } else {
        t
    }
}

#[test]
fn reward_sum_partial_reset_batched() -> torchrl::Result<()> {
    let mut env = env_with(&[3], 100, vec![Box::new(RewardSum::new())])?;
    let td = env.reset(None)?;
    assert_eq!(floats(td.get_or_err("episode_reward")?), vec![0.0; 3]);
    let mut root = steps(&mut env, td, 2)?;
    assert_eq!(floats(root.get_or_err("episode_reward")?), vec![2.0; 3]);
    for (trailing, kept) in [(true, 2.0), (false, 3.0)] {
        let mut r = root.clone();
        r.set("_reset", mask(&[true, false, true], trailing))?;
        // the hook itself: zero where the mask is true, keep where false
        let base_out = env.base_mut().reset_next(Some(&r))?;
        let hooked = env.transform_mut().reset(&r, base_out)?;
        assert_eq!(
            floats(hooked.get_or_err("episode_reward")?),
            vec![0.0, kept, 0.0]
        );
        // through the env
        let out = env.reset(Some(r))?;
        assert_eq!(
            floats(out.get_or_err("episode_reward")?),
            vec![0.0, kept, 0.0]
        );
        assert!(!out.contains("_reset"));
        root = steps(&mut env, out, 1)?;
        assert_eq!(
            floats(root.get_or_err("episode_reward")?),
            vec![1.0, kept + 1.0, 1.0]
        );
    }
    Ok(())
}

#[test]
fn step_counter_partial_reset_batched() -> torchrl::Result<()> {
    let mut env = env_with(
        &[3],
        100,
        vec![Box::new(StepCounter::new().with_max_steps(3)?)],
    )?;
    let td = env.reset(None)?;
    assert_eq!(td.get_or_err("step_count")?.size(), vec![3, 1]);
    assert_eq!(td.get_or_err("step_count")?.kind(), Kind::Int64);
    let root = steps(&mut env, td, 2)?;
    assert_eq!(ints(root.get_or_err("step_count")?), vec![2, 2, 2]);
    let mut r = root.clone();
    r.set("_reset", mask(&[false, true, false], false))?;
    let base_out = env.base_mut().reset_next(Some(&r))?;
    let hooked = env.transform_mut().reset(&r, base_out)?;
    assert_eq!(ints(hooked.get_or_err("step_count")?), vec![2, 0, 2]);
    assert_eq!(ints(hooked.get_or_err("truncated")?), vec![0, 0, 0]);
    let out = env.reset(Some(r))?;
    assert_eq!(ints(out.get_or_err("step_count")?), vec![2, 0, 2]);
    // the next step truncates elements 0 and 2 only; terminated is untouched
    let a = env.rand_action(Some(out))?;
    let stepped = env.step(a)?;
    assert_eq!(
        ints(stepped.get_or_err(("next", "step_count"))?),
        vec![3, 1, 3]
    );
    assert_eq!(
        ints(stepped.get_or_err(("next", "truncated"))?),
        vec![1, 0, 1]
    );
    assert_eq!(ints(stepped.get_or_err(("next", "done"))?), vec![1, 0, 1]);
    assert_eq!(
        ints(stepped.get_or_err(("next", "terminated"))?),
        vec![0, 0, 0]
    );
    // the non-stop loop resets only the truncated elements
    let (_, root) = env.step_and_maybe_reset_prestepped(stepped)?;
    assert_eq!(ints(root.get_or_err("step_count")?), vec![0, 1, 0]);
    assert_eq!(ints(root.get_or_err("truncated")?), vec![0, 0, 0]);
    Ok(())
}

#[test]
fn step_counter_done_or_truncated_and_forward_error() -> torchrl::Result<()> {
    // base env done at 2 while the limit is 5: done from the base is kept, truncated false
    let mut env = env_with(
        &[2],
        2,
        vec![Box::new(StepCounter::new().with_max_steps(5)?)],
    )?;
    let traj = env.rollout(4, None, &RolloutConfig::default())?;
    assert_eq!(traj.batch_size(), &[2, 2]);
    assert_eq!(ints(traj.get_or_err(("next", "done"))?), vec![0, 1, 0, 1]);
    assert_eq!(
        ints(traj.get_or_err(("next", "truncated"))?),
        vec![0, 0, 0, 0]
    );
    // update_done=false: truncated set, done untouched, so a stopping rollout does not stop on done
    let mut env = env_with(
        &[],
        100,
        vec![Box::new(
            StepCounter::new()
                .with_max_steps(2)?
                .with_update_done(false),
        )],
    )?;
    let traj = env.rollout(5, None, &RolloutConfig::default())?;
    assert_eq!(traj.batch_size(), &[2]); // stops on truncated
    assert_eq!(ints(traj.get_or_err(("next", "done"))?), vec![0, 0]);
    assert_eq!(ints(traj.get_or_err(("next", "truncated"))?), vec![0, 1]);
    // errors
    let e = StepCounter::new()
        .with_max_steps(0)
        .unwrap_err()
        .to_string();
    assert!(e.contains("max_steps") && e.contains("got 0"), "{e}");
    let e = StepCounter::new()
        .forward(TensorDict::new([])?)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("StepCounter cannot be called independently"),
        "{e}"
    );
    // stepping without a step count in the input names the key
    let mut env = env_with(&[], 100, vec![Box::new(StepCounter::new())])?;
    let td = env.reset(None)?.exclude(&["step_count"]);
    let td = env.rand_action(Some(td))?;
    let e = env.step(td).unwrap_err().to_string();
    assert!(e.contains("\"step_count\"") && e.contains("missing"), "{e}");
    Ok(())
}

#[test]
fn step_counter_specs() -> torchrl::Result<()> {
    let env = env_with(
        &[4],
        10,
        vec![Box::new(StepCounter::new().with_max_steps(3)?)],
    )?;
    let sp = env.specs();
    for g in [&sp.observation, &sp.state] {
        match g.get("step_count") {
            Some(TensorSpec::Bounded(b)) => {
                assert_eq!(b.shape(), &[4, 1]);
                assert_eq!(b.dtype(), Kind::Int64);
                assert_eq!(ints(b.low()), vec![0; 4]);
                assert_eq!(ints(b.high()), vec![i64::MAX; 4]);
            }
            other => panic!("step_count spec {other:?}"),
        }
    }
    assert_eq!(sp.done_keys().len(), 3);
    assert_eq!(
        sp.done
            .get("truncated")
            .map(|s| (s.shape().to_vec(), s.dtype())),
        Some((vec![4, 1], Some(Kind::Bool)))
    );
    // without max_steps: no truncated key
    let env = env_with(&[], 10, vec![Box::new(StepCounter::new())])?;
    assert_eq!(env.specs().done_keys().len(), 2);
    Ok(())
}

#[test]
fn reward_scaling_errors_and_specs() -> torchrl::Result<()> {
    for bad in [0.0, -2.0, f64::NAN, f64::INFINITY] {
        let e = RewardScaling::new(1.0, bad).unwrap_err().to_string();
        assert!(e.contains("scale must be a finite number > 0"), "{e}");
        assert!(e.contains(&format!("got {bad}")), "{e}");
    }
    assert!(RewardScaling::new(f64::NAN, 1.0).is_err());
    // a Bounded reward spec is rejected, naming the key and the spec
    let mut env = env_with(&[], 10, vec![Box::new(RewardClipping::new(-1.0, 1.0)?)])?;
    let before = env.specs().clone();
    let e = env
        .append(RewardScaling::new(0.0, 2.0)?)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("\"reward\"") && e.contains("Bounded") && e.contains("RewardScaling"),
        "{e}"
    );
    assert_eq!(
        env.specs(),
        &before,
        "a failed append must leave the env unchanged"
    );
    // a missing in key is named
    let e = env_with(
        &[],
        10,
        vec![Box::new(
            RewardScaling::new(0.0, 2.0)?.with_in_keys(["bonus"]),
        )],
    )
    .err()
    .map(|e| e.to_string())
    .unwrap_or_default();
    assert!(e.contains("\"bonus\"") && e.contains("\"reward\""), "{e}");
    // mismatched out keys
    let e = env_with(
        &[],
        10,
        vec![Box::new(
            RewardScaling::new(0.0, 2.0)?.with_out_keys(["a", "b"]),
        )],
    )
    .err()
    .map(|e| e.to_string())
    .unwrap_or_default();
    assert!(e.contains("one out key per in key"), "{e}");
    // a different out key is a new reward key, the in key stays
    let env = env_with(
        &[4],
        10,
        vec![Box::new(
            RewardScaling::new(0.0, 2.0)?.with_out_keys(["scaled"]),
        )],
    )?;
    let keys: Vec<String> = env.reward_keys().iter().map(|k| k.to_string()).collect();
    assert_eq!(keys, vec!["\"reward\"", "\"scaled\""]);
    assert_eq!(
        env.specs().reward.get("scaled"),
        env.specs().reward.get("reward")
    );
    // standalone forward on offline data: [1, 2] -> [3, 5]; standard normal [1, 3] -> [0, 1]
    let mut t = RewardScaling::new(1.0, 2.0)?;
    let td =
        TensorDict::new([2])?.with("reward", Tensor::from_slice(&[1.0f32, 2.0]).unsqueeze(-1))?;
    assert_eq!(floats(t.forward(td)?.get_or_err("reward")?), vec![3.0, 5.0]);
    let mut t = RewardScaling::new(1.0, 2.0)?.with_standard_normal(true);
    let td =
        TensorDict::new([2])?.with("reward", Tensor::from_slice(&[1.0f32, 3.0]).unsqueeze(-1))?;
    assert_eq!(floats(t.forward(td)?.get_or_err("reward")?), vec![0.0, 1.0]);
    assert_eq!(
        RewardScaling::new(0.5, 1.5)?.name(),
        "RewardScaling(loc=0.5000, scale=1.5000, standard_normal=false, keys=[\"reward\"])"
    );
    Ok(())
}

#[test]
fn reward_clipping_specs_and_errors() -> torchrl::Result<()> {
    let env = env_with(&[4], 10, vec![Box::new(RewardClipping::new(-0.3, 0.7)?)])?;
    match env.specs().reward.get("reward") {
        Some(TensorSpec::Bounded(b)) => {
            assert_eq!(b.shape(), &[4, 1]);
            assert_eq!(b.dtype(), Kind::Float);
            // bounds in the reward dtype: a clamped float32 value is always inside
            assert_eq!(floats(b.high()), vec![f64::from(0.7f32); 4]);
            assert_eq!(floats(b.low()), vec![f64::from(-0.3f32); 4]);
        }
        other => panic!("reward spec {other:?}"),
    }
    assert!(RewardClipping::new(1.0, 0.0).is_err());
    assert!(RewardClipping::new(f64::NAN, 0.0).is_err());
    let e = env_with(
        &[],
        10,
        vec![
            Box::new(RewardClipping::new(0.0, 1.0)?),
            Box::new(RewardClipping::new(0.0, 1.0)?),
        ],
    )
    .err()
    .map(|e| e.to_string())
    .unwrap_or_default();
    assert!(
        e.contains("RewardClipping") && e.contains("Bounded") && e.contains("\"reward\""),
        "{e}"
    );
    let mut t = RewardClipping::new(-1.0, 1.0)?.with_in_keys([("next", "reward")]);
    let td = TensorDict::new([3])?.with(
        ("next", "reward"),
        Tensor::from_slice(&[-5.0f32, 0.5, 9.0]).unsqueeze(-1),
    )?;
    assert_eq!(
        floats(t.forward(td)?.get_or_err(("next", "reward"))?),
        vec![-1.0, 0.5, 1.0]
    );
    Ok(())
}

#[test]
fn reward_sum_specs_and_offline() -> torchrl::Result<()> {
    // default: observation + state, not reward
    let env = env_with(&[4], 10, vec![Box::new(RewardSum::new())])?;
    let sp = env.specs();
    assert_eq!(
        sp.observation.get("episode_reward"),
        sp.reward.get("reward")
    );
    assert_eq!(sp.state.get("episode_reward"), sp.reward.get("reward"));
    assert!(!sp.reward.contains("episode_reward"));
    // reward_spec=true: a reward key, not an observation; still a state
    let env = env_with(
        &[4],
        10,
        vec![Box::new(RewardSum::new().with_reward_spec(true))],
    )?;
    let sp = env.specs();
    assert!(sp.reward.contains("episode_reward"));
    assert!(!sp.observation.contains("episode_reward"));
    assert!(sp.state.contains("episode_reward"));
    // explicit keys
    let env = env_with(
        &[],
        10,
        vec![
            Box::new(RewardScaling::new(0.0, 2.0)?.with_out_keys(["scaled"])),
            Box::new(
                RewardSum::new()
                    .with_in_keys(["scaled"])
                    .with_out_keys(["total"]),
            ),
        ],
    )?;
    assert!(env.specs().observation.contains("total"));
    let e = env_with(
        &[],
        10,
        vec![Box::new(RewardSum::new().with_in_keys(["nope"]))],
    )
    .err()
    .map(|e| e.to_string())
    .unwrap_or_default();
    assert!(e.contains("\"nope\"") && e.contains("reward spec"), "{e}");
    let e = env_with(
        &[],
        10,
        vec![Box::new(RewardSum::new().with_out_keys(["a", "b"]))],
    )
    .err()
    .map(|e| e.to_string())
    .unwrap_or_default();
    assert!(e.contains("same number of input and output keys"), "{e}");
    // offline: cumulative sum along the given time dim
    let r = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 10.0, 20.0, 30.0]).reshape([2, 3, 1]);
    let td = TensorDict::new([2, 3])?.with("reward", r)?;
    let e = RewardSum::new()
        .forward(td.clone())
        .unwrap_err()
        .to_string();
    assert!(e.contains("with_time_dim"), "{e}");
    let out = RewardSum::new().with_time_dim(1).forward(td.clone())?;
    assert_eq!(
        floats(out.get_or_err("episode_reward")?),
        vec![1.0, 3.0, 6.0, 10.0, 30.0, 60.0]
    );
    let out = RewardSum::new().with_time_dim(-1).forward(td.clone())?;
    assert_eq!(
        floats(out.get_or_err("episode_reward")?),
        vec![1.0, 3.0, 6.0, 10.0, 30.0, 60.0]
    );
    let e = RewardSum::new()
        .with_time_dim(2)
        .forward(td)
        .unwrap_err()
        .to_string();
    assert!(e.contains("batch dims"), "{e}");
    Ok(())
}

#[test]
fn init_tracker_partial_reset_and_specs() -> torchrl::Result<()> {
    let mut env = env_with(&[2], 100, vec![Box::new(InitTracker::new())])?;
    let s = env.specs().observation.get("is_init").cloned();
    assert_eq!(
        s.as_ref()
            .map(|s| (s.class_name(), s.shape().to_vec(), s.dtype())),
        Some(("Categorical", vec![2, 1], Some(Kind::Bool)))
    );
    let td = env.reset(None)?;
    assert_eq!(ints(td.get_or_err("is_init")?), vec![1, 1]);
    let root = steps(&mut env, td, 2)?;
    assert_eq!(ints(root.get_or_err("is_init")?), vec![0, 0]);
    for trailing in [true, false] {
        let mut r = root.clone();
        r.set("_reset", mask(&[false, true], trailing))?;
        let base_out = env.base_mut().reset_next(Some(&r))?;
        let hooked = env.transform_mut().reset(&r, base_out)?;
        assert_eq!(hooked.get_or_err("is_init")?.size(), vec![2, 1]);
        assert_eq!(ints(hooked.get_or_err("is_init")?), vec![0, 1]);
        let out = env.reset(Some(r))?;
        assert_eq!(ints(out.get_or_err("is_init")?), vec![0, 1]);
    }
    Ok(())
}

#[test]
fn tensordict_primer_behaviour() -> torchrl::Result<()> {
    // full-shape spec, default value, partial reset
    let primer = TensorDictPrimer::new()
        .with_primer("h", Unbounded::new().with_shape([3, 2])?)
        .with_default_value(1.5);
    let mut env = env_with(&[3], 100, vec![Box::new(primer)])?;
    let td = env.reset(None)?;
    assert_eq!(floats(td.get_or_err("h")?), vec![1.5; 6]);
    // a policy writes a new value under "next"; otherwise the value is carried
    let a = env.rand_action(Some(td))?;
    let mut a = a;
    a.set(
        ("next", "h"),
        Tensor::full([3, 2], 7.0, (Kind::Float, Device::Cpu)),
    )?;
    let stepped = env.step(a)?;
    assert_eq!(floats(stepped.get_or_err(("next", "h"))?), vec![7.0; 6]);
    let root = env.step_mdp(&stepped)?;
    let a = env.rand_action(Some(root.clone()))?;
    let carried = env.step(a)?;
    assert_eq!(floats(carried.get_or_err(("next", "h"))?), vec![7.0; 6]);
    let mut r = root;
    r.set("_reset", mask(&[true, false, false], true))?;
    let base_out = env.base_mut().reset_next(Some(&r))?;
    let hooked = env.transform_mut().reset(&r, base_out)?;
    assert_eq!(
        floats(hooked.get_or_err("h")?),
        vec![1.5, 1.5, 7.0, 7.0, 7.0, 7.0]
    );
    // random primers: reproducible with a seed, inside the spec
    let make = |seed| -> torchrl::Result<TensorDictPrimer> {
        Ok(TensorDictPrimer::new()
            .with_primer("n", Bounded::new(2.0, 3.0, [4])?)
            .with_expand_specs(true)
            .with_random(true)
            .with_seed(seed))
    };
    let mut e1 = env_with(&[2], 10, vec![Box::new(make(3)?)])?;
    let mut e2 = env_with(&[2], 10, vec![Box::new(make(3)?)])?;
    let v1 = floats(e1.reset(None)?.get_or_err("n")?);
    let v2 = floats(e2.reset(None)?.get_or_err("n")?);
    assert_eq!(v1, v2);
    assert_eq!(v1.len(), 8);
    assert!(v1.iter().all(|x| (2.0..=3.0).contains(x)), "{v1:?}");
    // errors: default outside the spec, a shape without the batch dims, an existing key
    let e = env_with(
        &[],
        10,
        vec![Box::new(
            TensorDictPrimer::new().with_primer("b", Bounded::new(1.0, 2.0, [2])?),
        )],
    )
    .err()
    .map(|e| e.to_string())
    .unwrap_or_default();
    assert!(
        e.contains("\"b\"") && e.contains("not in its spec") && e.contains("with_default_value"),
        "{e}"
    );
    let e = env_with(
        &[4],
        10,
        vec![Box::new(
            TensorDictPrimer::new().with_primer("x", Unbounded::new().with_shape([2])?),
        )],
    )
    .err()
    .map(|e| e.to_string())
    .unwrap_or_default();
    assert!(
        e.contains("\"x\"") && e.contains("with_expand_specs") && e.contains("[4, 2]"),
        "{e}"
    );
    let e = env_with(
        &[],
        10,
        vec![Box::new(
            TensorDictPrimer::new().with_primer("observation", Unbounded::new()),
        )],
    )
    .err()
    .map(|e| e.to_string())
    .unwrap_or_default();
    assert!(
        e.contains("\"observation\"") && e.contains("already"),
        "{e}"
    );
    // offline: fills missing keys for the tensordict's batch
    let mut p = TensorDictPrimer::new()
        .with_primer("h", Unbounded::new().with_shape([2])?)
        .with_expand_specs(true);
    let out = p.forward(TensorDict::new([5, 3])?)?;
    assert_eq!(out.get_or_err("h")?.size(), vec![5, 3, 2]);
    Ok(())
}

#[test]
fn tensordict_primer_is_seeded_by_the_env() -> torchrl::Result<()> {
    let make = || -> torchrl::Result<TransformedEnv<CountingEnv>> {
        env_with(
            &[2],
            10,
            vec![
                Box::new(StepCounter::new()),
                Box::new(
                    TensorDictPrimer::new()
                        .with_primer("n", Bounded::new(0.0, 1.0, [3])?)
                        .with_expand_specs(true)
                        .with_random(true),
                ),
            ],
        )
    };
    let draw = |env: &mut TransformedEnv<CountingEnv>| -> torchrl::Result<Vec<f64>> {
        Ok(floats(env.reset(None)?.get_or_err("n")?))
    };
    let (mut e1, mut e2) = (make()?, make()?);
    e1.set_seed(11)?;
    e2.set_seed(11)?;
    let v1 = draw(&mut e1)?;
    assert_eq!(v1, draw(&mut e2)?, "same env seed, same primer values");
    assert_ne!(v1, draw(&mut e1)?, "consecutive resets draw new values");
    e1.set_seed(11)?;
    assert_eq!(draw(&mut e1)?, v1, "re-seeding the env replays the primer");
    e1.set_seed(12)?;
    assert_ne!(draw(&mut e1)?, v1, "another seed, other values");
    // the env seed reaches the primer, not only the base env: a seed given at construction is
    // replaced
    let mut e3 = make()?;
    e3.set_seed(11)?;
    e3.transform_mut()
        .get_as_mut::<TensorDictPrimer>(1)
        .map(|p| p.set_seed(99))
        .transpose()?;
    assert_ne!(draw(&mut e3)?, v1);
    // Transform::set_seed on the transform itself is with_seed
    let primer = |p: TensorDictPrimer| -> torchrl::Result<Vec<f64>> {
        let mut p = p
            .with_primer("n", Bounded::new(0.0, 1.0, [3])?)
            .with_expand_specs(true)
            .with_random(true);
        Ok(floats(p.forward(TensorDict::new([2])?)?.get_or_err("n")?))
    };
    let mut reseeded = TensorDictPrimer::new().with_seed(1);
    reseeded.set_seed(5)?;
    assert_eq!(
        primer(reseeded)?,
        primer(TensorDictPrimer::new().with_seed(5))?
    );
    Ok(())
}

#[test]
fn action_clamp_inverse() -> torchrl::Result<()> {
    let mut env = env_with(&[3], 10, vec![Box::new(ActionClamp::new())])?;
    assert_eq!(
        env.specs(),
        env.base().specs(),
        "ActionClamp leaves the specs unchanged"
    );
    let td = env.reset(None)?.with(
        "action",
        Tensor::from_slice(&[-4.0f32, 0.25, 9.0]).unsqueeze(-1),
    )?;
    let inner = env.transform_mut().inv(td.clone())?;
    assert_eq!(floats(inner.get_or_err("action")?), vec![-1.0, 0.25, 1.0]);
    let out = env.step(td)?;
    assert_eq!(
        floats(out.get_or_err("action")?),
        vec![-4.0, 0.25, 9.0],
        "the caller's td is untouched"
    );
    // NaN: error by default, low bound with NanPolicy::Low
    let td = env.reset(None)?.with(
        "action",
        Tensor::from_slice(&[f32::NAN, 0.0, 2.0]).unsqueeze(-1),
    )?;
    let e = env.step(td.clone()).unwrap_err().to_string();
    assert!(e.contains("\"action\"") && e.contains("1 NaN"), "{e}");
    let mut env = env_with(
        &[3],
        10,
        vec![Box::new(ActionClamp::new().with_nan_policy(NanPolicy::Low))],
    )?;
    let inner = env.transform_mut().inv(td)?;
    assert_eq!(floats(inner.get_or_err("action")?), vec![-1.0, 0.0, 1.0]);
    // a key that is not a Bounded action is named
    let e = env_with(
        &[],
        10,
        vec![Box::new(ActionClamp::new().with_keys(["observation"]))],
    )
    .err()
    .map(|e| e.to_string())
    .unwrap_or_default();
    assert!(
        e.contains("\"observation\"") && e.contains("action spec"),
        "{e}"
    );
    Ok(())
}

#[test]
fn transforms_compose_in_order() -> torchrl::Result<()> {
    // StepCounter truncation resets RewardSum; RewardScaling before RewardSum sums scaled rewards
    let mut env = env_with(
        &[2],
        100,
        vec![
            Box::new(StepCounter::new().with_max_steps(2)?),
            Box::new(RewardScaling::new(0.0, 10.0)?),
            Box::new(RewardSum::new()),
        ],
    )?;
    let traj = env.rollout(5, None, &RolloutConfig::no_break())?;
    assert_eq!(traj.batch_size(), &[2, 5]);
    assert_eq!(
        floats(traj.get_or_err(("next", "episode_reward"))?),
        vec![10.0, 20.0, 10.0, 20.0, 10.0, 10.0, 20.0, 10.0, 20.0, 10.0]
    );
    let names: Vec<String> = env.transform().iter().map(|t| t.name()).collect();
    assert!(names[0].starts_with("StepCounter(max_steps=2"), "{names:?}");
    assert!(names[2].contains("episode_reward"), "{names:?}");
    Ok(())
}

#[test]
fn pendulum_step_counter_and_full_stack() -> torchrl::Result<()> {
    use torchrl::envs::builtin::PendulumEnv;
    // TorchRL's StepCounter test_transform_env: Pendulum + StepCounter(10), 100 non-stop steps
    let mut env = TransformedEnv::new(PendulumEnv::new(&[], Device::Cpu)?)?
        .with(StepCounter::new().with_max_steps(10)?)?;
    let traj = env.rollout(100, None, &RolloutConfig::no_break())?;
    assert_eq!(traj.batch_size(), &[100]);
    assert_eq!(traj.get_or_err("step_count")?.max().int64_value(&[]), 9);
    assert_eq!(
        traj.get_or_err(("next", "truncated"))?
            .to_kind(Kind::Int64)
            .sum(Kind::Int64)
            .int64_value(&[]),
        10
    );
    // every transform on an env with a state spec and a [-2, 2] action
    for batch in [vec![], vec![4]] {
        let mut env = TransformedEnv::new(PendulumEnv::new(&batch, Device::Cpu)?)?
            .with(StepCounter::new().with_max_steps(3)?)?
            .with(RewardScaling::new(0.5, 1.5)?)?
            .with(RewardSum::new())?
            .with(InitTracker::new())?
            .with(
                TensorDictPrimer::new()
                    .with_primer("h", Unbounded::new())
                    .with_expand_specs(true),
            )?
            .with(ActionClamp::new())?
            .with(RewardClipping::new(-100.0, 100.0)?)?;
        let before = env.base().specs().clone();
        let base = PendulumEnv::new(&batch, Device::Cpu)?;
        assert_eq!(base.specs(), &before);
        // ActionClamp clamps into Pendulum's [-2, 2]
        let td = env.reset(None)?;
        let shape: Vec<i64> = [batch.as_slice(), &[1]].concat();
        let td = td.with(
            "action",
            Tensor::full(shape.as_slice(), 5.0, (Kind::Float, Device::Cpu)),
        )?;
        let inner = env.transform_mut().inv(td)?;
        assert!(floats(inner.get_or_err("action")?)
            .iter()
            .all(|a| *a == 2.0));
        check_env_specs(&mut env, Some(0))?;
    }
    Ok(())
}

#[test]
fn cuda_full_stack_when_available() -> torchrl::Result<()> {
    if !tch::Cuda::is_available() {
        eprintln!("cuda_full_stack_when_available: no CUDA device, nothing to check");
        return Ok(());
    }
    let dev = Device::Cuda(0);
    for batch in [vec![], vec![4]] {
        let mut env = TransformedEnv::new(CountingEnv::with_device(3, &batch, dev)?)?
            .with(StepCounter::new().with_max_steps(2)?)?
            .with(RewardScaling::new(0.5, 1.5)?)?
            .with(RewardSum::new())?
            .with(InitTracker::new())?
            .with(
                TensorDictPrimer::new()
                    .with_primer("h", Unbounded::new())
                    .with_expand_specs(true)
                    .with_random(true),
            )?
            .with(ActionClamp::new())?
            .with(RewardClipping::new(-10.0, 10.0)?)?;
        check_env_specs(&mut env, Some(0))?;
        let traj = env.rollout(5, None, &RolloutConfig::no_break())?;
        for (k, t) in traj.leaves() {
            assert_eq!(t.device(), dev, "{k} is on {:?}", t.device());
        }
        assert_eq!(
            ints(
                &traj
                    .get_or_err(("next", "step_count"))?
                    .to_device(Device::Cpu)
            )
            .iter()
            .take(5)
            .copied()
            .collect::<Vec<_>>(),
            vec![1, 2, 1, 2, 1]
        );
    }
    Ok(())
}

// ------------------------------------------------------------------ errors with context

/// A transform whose step checks the observation against a spec it does not fit.
struct ShapeStrict;

impl Transform for ShapeStrict {
    fn name(&self) -> String {
        "ShapeStrict".into()
    }

    fn step(&mut self, _td: &TensorDict, next: TensorDict) -> torchrl::Result<TensorDict> {
        let spec = Unbounded::new().with_shape([5])?;
        spec.check(next.get_or_err("observation")?, "observation")?;
        Ok(next)
    }
}

/// An error raised three layers down (TransformedEnv::step → Compose → the transform's step →
/// a spec check) names the transform, its position and hook, the key and the shapes, and
/// `root()` is the original variant.
#[test]
fn transform_error_names_transform_key_and_shapes() {
    let mut env = env_with(
        &[4],
        10,
        vec![
            Box::new(StepCounter::new()),
            Box::new(ShapeStrict),
            Box::new(RewardSum::new()),
        ],
    )
    .unwrap();
    let td = env.reset(None).unwrap();
    let obs_shape = td.get_or_err("observation").unwrap().size();
    let td = env.rand_action(Some(td)).unwrap();
    let err = env.step(td).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.starts_with("ShapeStrict (transform 2 of 3) in step: "),
        "{msg}"
    );
    assert!(msg.contains("\"observation\""), "{msg}");
    let shape = format!(
        "[{}]",
        obs_shape
            .iter()
            .map(|d| d.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    assert!(msg.contains(&shape) && msg.contains("[5]"), "{msg}");
    assert!(
        matches!(err.root(), torchrl::Error::NotInSpec { key, .. } if key == "\"observation\"")
    );
    assert_eq!(
        err.contexts(),
        vec!["ShapeStrict (transform 2 of 3) in step"]
    );
}
