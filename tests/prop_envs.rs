//! Property-based campaign on transformed environments (the reliability issue: no panic on any
//! input, every failure a `torchrl::Error` naming the key, specs that the data keeps).
//!
//! A case is a built-in env (`CountingEnv`, `PendulumEnv`, `CartPoleEnv` with either action
//! encoding, `MountainCarContinuousEnv`) at batch `[]` or a random small batch, a random stack
//! of 0–4 transforms with random but plausible arguments (and some implausible ones), and a
//! random list of malformed actions. Properties:
//!
//! - appending a transform never panics; a refused one leaves the env's specs unchanged;
//! - for the accepted stack: `check_env_specs` passes and a short rollout succeeds;
//! - `step` on malformed actions (NaN, ±inf, out of bounds, wrong dtype, wrong shape, missing,
//!   wrong batch size) gives `Ok` or an error that names the action key (the batch-size error
//!   names the batch sizes); afterwards a reset and a rollout still succeed;
//! - `reset` with a malformed `"_reset"` mask (wrong dtype or shape) gives `Ok` or an error,
//!   and the env still rolls out afterwards;
//! - the base env's specs are unchanged by the wrapping and by everything run on the wrapper.
//!
//! CI runs `PROPTEST_CASES` cases per property (default below). Long campaign:
//! `PROPTEST_CASES=20000 cargo test --release --test prop_tensordict --test prop_specs --test prop_envs`.
//! Every input is generated; the bugs the campaign found are fixed and pinned by the
//! regression tests at the end of this file.

use std::panic::{catch_unwind, AssertUnwindSafe};

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError};
use tch::{Device, Kind, Tensor};
use torchrl::envs::builtin::{
    ActionEncoding, CartPoleEnv, CountingEnv, MountainCarContinuousEnv, PendulumEnv,
};
use torchrl::envs::transforms::{
    ActionClamp, CatTensors, DoubleToFloat, ExcludeTransform, InitTracker, NanPolicy,
    ObservationNorm, RenameTransform, RewardClipping, RewardScaling, RewardSum, SelectTransform,
    StepCounter, Transform, UnsqueezeTransform,
};
use torchrl::envs::{EnvBase, EnvSpecs, RolloutConfig, TransformedEnv};
use torchrl::tensordict::KeysOptions;
use torchrl::{check_env_specs, Entry, Error, NestedKey, TensorDict};

const CPU: Device = Device::Cpu;

/// Cases per property when `PROPTEST_CASES` is not set (keeps CI bounded in debug builds).
const DEFAULT_CASES: u32 = 1024;

fn config() -> Config {
    let mut c = Config {
        failure_persistence: None,
        ..Config::default()
    };
    if std::env::var("PROPTEST_CASES").is_err() {
        c.cases = DEFAULT_CASES;
    }
    c
}

// ------------------------------------------------------------------ generated arguments

#[derive(Clone, Copy, Debug)]
enum EnvKind {
    Counting(i64),
    Pendulum,
    CartPole(bool),
    MountainCar,
}

fn env_s() -> impl Strategy<Value = EnvKind> {
    prop_oneof![
        (1i64..6).prop_map(EnvKind::Counting),
        Just(EnvKind::Pendulum),
        any::<bool>().prop_map(EnvKind::CartPole),
        Just(EnvKind::MountainCar),
    ]
}

fn batch_s() -> impl Strategy<Value = Vec<i64>> {
    prop_oneof![
        2 => Just(vec![]),
        2 => (1i64..4).prop_map(|b| vec![b]),
        1 => (1i64..3, 1i64..3).prop_map(|(a, b)| vec![a, b]),
    ]
}

/// Keys transforms may name: the envs' own keys, keys other transforms add, and a missing one.
fn key_s() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => Just("observation"),
        2 => Just("reward"),
        1 => Just("action"),
        1 => Just("state"),
        1 => Just("done"),
        1 => Just("terminated"),
        1 => Just("truncated"),
        1 => Just("episode_reward"),
        1 => Just("step_count"),
        1 => Just("is_init"),
        1 => Just("obs_cat"),
        1 => Just("missing"),
    ]
    .prop_map(String::from)
}

fn real_s() -> impl Strategy<Value = f64> {
    prop_oneof![
        8 => -3.0f64..3.0,
        1 => Just(0.0),
        1 => prop_oneof![Just(f64::NAN), Just(f64::INFINITY), Just(-f64::INFINITY), Just(1e39), Just(-1e39)],
    ]
}

fn scale_s() -> impl Strategy<Value = f64> {
    prop_oneof![
        8 => 0.05f64..4.0,
        1 => prop_oneof![Just(0.0), Just(-1.0), Just(f64::NAN), Just(f64::INFINITY), Just(1e-30), Just(1e39)],
    ]
}

#[derive(Clone, Debug)]
enum TArg {
    RewardScaling {
        loc: f64,
        scale: f64,
        standard_normal: bool,
    },
    RewardSum,
    StepCounter {
        max_steps: Option<i64>,
    },
    RewardClipping {
        lo: f64,
        hi: f64,
    },
    InitTracker,
    DoubleToFloat,
    ObservationNorm {
        loc: f64,
        scale: f64,
        standard_normal: bool,
        key: String,
    },
    CatTensors {
        keys: Vec<String>,
        out: String,
        del: bool,
    },
    Rename {
        from: String,
        to: String,
        copy: bool,
    },
    Exclude {
        keys: Vec<String>,
    },
    Select {
        keys: Vec<String>,
    },
    Unsqueeze {
        dim: i64,
        key: String,
    },
    ActionClamp {
        nan_low: bool,
    },
}

fn transform_s() -> impl Strategy<Value = TArg> {
    prop_oneof![
        (real_s(), scale_s(), any::<bool>()).prop_map(|(loc, scale, standard_normal)| {
            TArg::RewardScaling {
                loc,
                scale,
                standard_normal,
            }
        }),
        Just(TArg::RewardSum),
        prop::option::of(prop_oneof![4 => 1i64..6, 1 => -1i64..1])
            .prop_map(|max_steps| TArg::StepCounter { max_steps }),
        (real_s(), real_s()).prop_map(|(a, b)| {
            let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
            TArg::RewardClipping { lo, hi }
        }),
        Just(TArg::InitTracker),
        Just(TArg::DoubleToFloat),
        (real_s(), scale_s(), any::<bool>(), key_s()).prop_map(
            |(loc, scale, standard_normal, key)| TArg::ObservationNorm {
                loc,
                scale,
                standard_normal,
                key
            }
        ),
        (
            prop::collection::vec(key_s(), 1..3),
            prop_oneof![Just("obs_cat"), Just("observation")].prop_map(String::from),
            any::<bool>()
        )
            .prop_map(|(keys, out, del)| TArg::CatTensors { keys, out, del }),
        (
            key_s(),
            prop_oneof![Just("renamed"), Just("obs2"), Just("reward")].prop_map(String::from),
            any::<bool>()
        )
            .prop_map(|(from, to, copy)| TArg::Rename { from, to, copy }),
        prop::collection::vec(key_s(), 1..3).prop_map(|keys| TArg::Exclude { keys }),
        prop::collection::vec(key_s(), 1..3).prop_map(|keys| TArg::Select { keys }),
        (-3i64..3, key_s()).prop_map(|(dim, key)| TArg::Unsqueeze { dim, key }),
        any::<bool>().prop_map(|nan_low| TArg::ActionClamp { nan_low }),
    ]
}

/// How an action is broken before `step`.
#[derive(Clone, Debug)]
enum BadAction {
    /// Every entry set to this value (NaN, ±inf, far out of bounds).
    Value(f64),
    /// Cast to another dtype.
    Kind(Kind),
    /// An extra trailing dim.
    ExtraDim,
    /// The last dim dropped.
    DropDim,
    /// No action at all.
    Missing,
    /// The tensordict's batch size differs from the env's.
    Batch,
}

/// A malformed `"_reset"` mask given to `reset`.
#[derive(Clone, Debug)]
enum BadReset {
    /// The right shape (`[*batch, 1]`), another dtype.
    Kind(Kind),
    /// A bool mask of `[*batch]` plus these trailing dims.
    Shape(Vec<i64>),
    /// A bool mask of a wrong leading shape.
    Lead(Vec<i64>),
}

fn bad_reset_s() -> impl Strategy<Value = BadReset> {
    prop_oneof![
        prop_oneof![
            Just(Kind::Int64),
            Just(Kind::Float),
            Just(Kind::Uint8),
            Just(Kind::Bool)
        ]
        .prop_map(BadReset::Kind),
        prop::collection::vec(0i64..3, 0..3).prop_map(BadReset::Shape),
        prop::collection::vec(0i64..4, 0..3).prop_map(BadReset::Lead),
    ]
}

fn bad_action_s() -> impl Strategy<Value = BadAction> {
    prop_oneof![
        3 => prop_oneof![Just(f64::NAN), Just(f64::INFINITY), Just(-f64::INFINITY), Just(1e6), Just(-7.0), Just(3.0), Just(0.5)]
            .prop_map(BadAction::Value),
        2 => prop_oneof![Just(Kind::Float), Just(Kind::Double), Just(Kind::Int64), Just(Kind::Int), Just(Kind::Bool), Just(Kind::Uint8), Just(Kind::Half)]
            .prop_map(BadAction::Kind),
        1 => Just(BadAction::ExtraDim),
        1 => Just(BadAction::DropDim),
        1 => Just(BadAction::Missing),
        1 => Just(BadAction::Batch),
    ]
}

// ------------------------------------------------------------------ building

fn keys(v: &[String]) -> Vec<NestedKey> {
    v.iter().map(|k| NestedKey::from(k.as_str())).collect()
}

fn build_transform(a: &TArg) -> torchrl::Result<Box<dyn Transform>> {
    Ok(match a {
        TArg::RewardScaling {
            loc,
            scale,
            standard_normal,
        } => Box::new(RewardScaling::new(*loc, *scale)?.with_standard_normal(*standard_normal)),
        TArg::RewardSum => Box::new(RewardSum::new()),
        TArg::StepCounter { max_steps } => Box::new(match max_steps {
            Some(m) => StepCounter::new().with_max_steps(*m)?,
            None => StepCounter::new(),
        }),
        TArg::RewardClipping { lo, hi } => Box::new(RewardClipping::new(*lo, *hi)?),
        TArg::InitTracker => Box::new(InitTracker::new()),
        TArg::DoubleToFloat => Box::new(DoubleToFloat::new()),
        TArg::ObservationNorm {
            loc,
            scale,
            standard_normal,
            key,
        } => Box::new(
            ObservationNorm::new(*loc, *scale, [key.as_str()])?
                .with_standard_normal(*standard_normal),
        ),
        TArg::CatTensors { keys: k, out, del } => Box::new(
            CatTensors::new(keys(k))
                .with_out_key(out.as_str())
                .with_del_keys(*del),
        ),
        TArg::Rename { from, to, copy } => {
            Box::new(RenameTransform::new([from.as_str()], [to.as_str()])?.with_create_copy(*copy))
        }
        TArg::Exclude { keys: k } => Box::new(ExcludeTransform::new(keys(k))),
        TArg::Select { keys: k } => Box::new(SelectTransform::new(keys(k))),
        TArg::Unsqueeze { dim, key } => Box::new(UnsqueezeTransform::new(*dim, [key.as_str()])),
        TArg::ActionClamp { nan_low } => {
            Box::new(ActionClamp::new().with_nan_policy(if *nan_low {
                NanPolicy::Low
            } else {
                NanPolicy::Error
            }))
        }
    })
}

// ------------------------------------------------------------------ checks

type Check = Result<(), String>;

fn catch<T>(what: &str, f: impl FnOnce() -> T) -> Result<T, String> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|p| {
        let msg = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        format!("{what} panicked: {msg}")
    })
}

/// Every group of the specs, printed (the Composite `==` ignores key order; this does not).
fn specs_text(s: &EnvSpecs) -> String {
    format!(
        "batch {:?}\nobservation {}\nreward {}\ndone {}\naction {}\nstate {}",
        s.batch_size(),
        s.observation,
        s.reward,
        s.done,
        s.action,
        s.state
    )
}

/// Batch sizes are prefixes of every leaf's shape at every level.
fn invariants(td: &TensorDict) -> Check {
    let bs = td.batch_size();
    for (k, e) in td.items(KeysOptions::top_level()) {
        match e {
            Entry::Tensor(t) => {
                let s = t.size();
                if s.len() < bs.len() || s[..bs.len()] != *bs {
                    return Err(format!("leaf {k} of shape {s:?} under batch {bs:?}"));
                }
            }
            Entry::Dict(d) => {
                if d.batch_size().len() < bs.len() || d.batch_size()[..bs.len()] != *bs {
                    return Err(format!(
                        "level {k} of batch {:?} under {bs:?}",
                        d.batch_size()
                    ));
                }
                invariants(d)?;
            }
        }
    }
    Ok(())
}

/// The action key(s) of the env, as printed in errors.
fn action_names(env: &dyn EnvBase) -> Vec<String> {
    env.action_keys().iter().map(|k| k.to_string()).collect()
}

/// A random action for `env`, broken as `bad` says.
fn bad_step_input(
    env: &mut dyn EnvBase,
    root: &TensorDict,
    bad: &BadAction,
) -> Result<TensorDict, String> {
    let td = env
        .rand_action(Some(root.clone()))
        .map_err(|e| format!("rand_action failed: {e}"))?;
    let mut td = td;
    let Some(key) = env.action_keys().first().cloned() else {
        return Ok(td);
    };
    let Some(a) = td.get(&key).map(|t| t.shallow_clone()) else {
        return Ok(td);
    };
    let replaced = match bad {
        BadAction::Value(v) => {
            let t = Tensor::from_slice(&[*v])
                .reshape([0i64; 0])
                .expand(a.size(), false)
                .contiguous();
            // Keep the action's dtype when it can hold the value; a float64 tensor otherwise.
            let fits = a.is_floating_point()
                || (v.is_finite() && v.fract() == 0.0 && a.kind() != Kind::Bool);
            Some(if fits { t.to_kind(a.kind()) } else { t })
        }
        BadAction::Kind(k) => Some(a.to_kind(*k)),
        BadAction::ExtraDim => Some(a.unsqueeze(-1)),
        BadAction::DropDim => (a.dim() > td.batch_dims()).then(|| a.select(-1, 0)),
        BadAction::Missing => {
            let _ = td.remove(&key);
            None
        }
        BadAction::Batch => {
            return td
                .unsqueeze(0)
                .map_err(|e| format!("unsqueeze failed: {e}"));
        }
    };
    if let Some(t) = replaced {
        td.set(&key, t)
            .map_err(|e| format!("setting the broken action failed: {e}"))?;
    }
    Ok(td)
}

/// `reset` with a malformed `"_reset"` mask: `Ok` or an error, never a panic; the env works
/// afterwards.
fn bad_reset(env: &mut dyn EnvBase, bad: &BadReset, ctx: &str) -> Check {
    let bs = env.batch_size();
    let mask = match bad {
        BadReset::Kind(k) => Tensor::ones([bs.as_slice(), &[1]].concat().as_slice(), (*k, CPU)),
        BadReset::Shape(extra) => Tensor::ones(
            [bs.as_slice(), extra.as_slice()].concat().as_slice(),
            (Kind::Bool, CPU),
        ),
        BadReset::Lead(lead) => Tensor::ones(lead.as_slice(), (Kind::Bool, CPU)),
    };
    let mut td = TensorDict::new(&bs).map_err(|e| e.to_string())?;
    if td.set("_reset", mask).is_err() {
        return Ok(());
    }
    match catch(&format!("reset with {bad:?}"), || env.reset(Some(td)))? {
        Ok(out) => invariants(&out).map_err(|m| format!("{ctx}: reset with {bad:?}: {m}"))?,
        Err(e) => {
            if e.to_string().trim().is_empty() {
                return Err(format!("{ctx}: reset with {bad:?}: empty error"));
            }
        }
    }
    let cfg = RolloutConfig::default();
    if let Err(e) = catch("rollout after a bad reset", || env.rollout(2, None, &cfg))? {
        return Err(format!(
            "{ctx}: rollout after a reset with {bad:?} failed: {e}"
        ));
    }
    Ok(())
}

/// Runs one case on a concrete base env.
fn case<E: EnvBase + 'static>(
    base: E,
    stack: &[TArg],
    seed: u64,
    bad: &[BadAction],
    resets: &[BadReset],
) -> Check {
    let base_specs = base.specs().clone();
    let base_text = specs_text(&base_specs);
    let mut env = catch("TransformedEnv::new", || TransformedEnv::new(base))?
        .map_err(|e| format!("TransformedEnv::new failed: {e}"))?;
    let mut accepted = Vec::new();
    for t in stack {
        let built = catch(&format!("building {t:?}"), || build_transform(t))?;
        let boxed = match built {
            Ok(b) => b,
            Err(e) => {
                if e.to_string().trim().is_empty() {
                    return Err(format!("{t:?}: empty constructor error"));
                }
                continue;
            }
        };
        let before = specs_text(env.specs());
        match catch(&format!("append {t:?}"), || env.append_boxed(boxed))? {
            Ok(()) => accepted.push(t.clone()),
            Err(e) => {
                if e.to_string().trim().is_empty() {
                    return Err(format!("append {t:?}: empty error"));
                }
                if specs_text(env.specs()) != before {
                    return Err(format!("append {t:?} failed ({e}) but changed the specs"));
                }
            }
        }
    }
    let ctx = format!("accepted stack {accepted:?}");
    if env.base().specs() != &base_specs || specs_text(env.base().specs()) != base_text {
        return Err(format!("{ctx}: wrapping changed the base env's specs"));
    }
    // The accepted stack keeps its specs.
    match catch("check_env_specs", || check_env_specs(&mut env, Some(seed)))? {
        Ok(()) => {}
        Err(e) => return Err(format!("{ctx}: check_env_specs failed: {e}")),
    }
    let cfg = RolloutConfig::default();
    let traj = match catch("rollout", || env.rollout(4, None, &cfg))? {
        Ok(t) => t,
        Err(e) => return Err(format!("{ctx}: rollout failed: {e}")),
    };
    invariants(&traj).map_err(|m| format!("{ctx}: rollout: {m}"))?;
    // Malformed actions.
    let names = action_names(&env);
    for b in bad {
        let root = match catch("reset", || env.reset(None))? {
            Ok(r) => r,
            Err(e) => return Err(format!("{ctx}: reset failed: {e}")),
        };
        let input = catch("building a bad action", || {
            bad_step_input(&mut env, &root, b)
        })??;
        match catch(&format!("step with {b:?}"), || env.step(input))? {
            Ok(out) => invariants(&out).map_err(|m| format!("{ctx}: step with {b:?}: {m}"))?,
            Err(e) => {
                let msg = e.to_string();
                if msg.trim().is_empty() {
                    return Err(format!("{ctx}: step with {b:?}: empty error"));
                }
                let keyed = !matches!(b, BadAction::Batch);
                if keyed && !names.iter().any(|n| msg.contains(n.as_str())) {
                    return Err(format!(
                        "{ctx}: step with {b:?}: the error does not name the action key {names:?}: {msg}"
                    ));
                }
                if matches!(e, Error::Torch(_)) {
                    return Err(format!(
                        "{ctx}: step with {b:?}: a raw libtorch error: {msg}"
                    ));
                }
            }
        }
        // The env still works.
        if let Err(e) = catch("rollout after a bad step", || env.rollout(2, None, &cfg))? {
            return Err(format!(
                "{ctx}: rollout after a step with {b:?} failed: {e}"
            ));
        }
    }
    for r in resets {
        bad_reset(&mut env, r, &ctx)?;
    }
    if env.base().specs() != &base_specs || specs_text(env.base().specs()) != base_text {
        return Err(format!(
            "{ctx}: running the wrapper changed the base env's specs"
        ));
    }
    Ok(())
}

fn run_case(
    kind: EnvKind,
    batch: &[i64],
    stack: &[TArg],
    seed: u64,
    bad: &[BadAction],
    resets: &[BadReset],
) -> Check {
    let built = catch("building the env", || -> torchrl::Result<Check> {
        let r = resets;
        Ok(match kind {
            EnvKind::Counting(m) => case(CountingEnv::new(m, batch)?, stack, seed, bad, r),
            EnvKind::Pendulum => case(PendulumEnv::new(batch, CPU)?, stack, seed, bad, r),
            EnvKind::CartPole(cat) => {
                let enc = if cat {
                    ActionEncoding::Categorical
                } else {
                    ActionEncoding::OneHot
                };
                case(
                    CartPoleEnv::with_encoding(batch, CPU, enc)?,
                    stack,
                    seed,
                    bad,
                    r,
                )
            }
            EnvKind::MountainCar => case(
                MountainCarContinuousEnv::new(batch, CPU)?,
                stack,
                seed,
                bad,
                r,
            ),
        })
    })?;
    match built {
        Ok(r) => r,
        Err(e) => Err(format!("building {kind:?} at batch {batch:?} failed: {e}")),
    }
}

proptest! {
    #![proptest_config(config())]

    /// Random transform stacks over the built-in envs, and malformed actions.
    #[test]
    fn transformed_envs(
        kind in env_s(),
        batch in batch_s(),
        stack in prop::collection::vec(transform_s(), 0..=4),
        seed in any::<u64>(),
        bad in prop::collection::vec(bad_action_s(), 0..4),
        resets in prop::collection::vec(bad_reset_s(), 0..3),
    ) {
        run_case(kind, &batch, &stack, seed, &bad, &resets).map_err(TestCaseError::fail)?;
    }
}

// ------------------------------------------------------------------ regressions

fn counting() -> TransformedEnv<CountingEnv> {
    TransformedEnv::new(CountingEnv::new(5, &[]).unwrap()).unwrap()
}

/// Fixed (reward_clipping.rs): `RewardClipping::new(0, 1e39)` panicked when appended (tch's
/// `f_full`/`f_clamp` panic instead of returning libtorch's "cannot be converted to type float
/// without overflow"; see `regression_bounded_huge_bounds` in `prop_specs.rs`).
#[test]
fn regression_reward_clipping_huge_bound() {
    let mut env = counting()
        .with(RewardClipping::new(0.0, 1e39).unwrap())
        .unwrap();
    check_env_specs(&mut env, Some(0)).unwrap();
}

/// Fixed (reward_sum.rs): the episode-sum spec was a clone of the reward spec; after
/// RewardClipping the reward spec is Bounded, and the sum leaves those bounds after a few steps,
/// so `check_env_specs` failed on the transformed env. A non-Unbounded reward spec now gives an
/// Unbounded episode spec of the same shape and dtype.
#[test]
fn regression_reward_sum_of_clipped_rewards() {
    let mut env = counting()
        .with(RewardClipping::new(0.0, 2.1).unwrap())
        .unwrap()
        .with(RewardSum::new())
        .unwrap();
    check_env_specs(&mut env, Some(0)).unwrap();
    let spec = env.specs().observation.get("episode_reward").unwrap();
    assert_eq!(spec.class_name(), "Unbounded");
}

/// Fixed (cat_tensors.rs): `CatTensors` with `del_keys` deleted a key the env reads back as a
/// state (RewardSum's episode sum); the stack was accepted and every rollout then failed
/// `check_env_specs` (and the sum restarted each step). Appending it is now an error naming the
/// key.
#[test]
fn regression_cat_tensors_refuses_deleting_state_keys() {
    let err = counting()
        .with(RewardSum::new())
        .unwrap()
        .with(
            CatTensors::new(["episode_reward"])
                .with_out_key("obs_cat")
                .with_del_keys(true),
        )
        .err()
        .expect("refused");
    assert!(err.to_string().contains("episode_reward"), "{err}");
}

/// Fixed (exclude.rs, rename.rs): excluding or renaming a key the env reads back as a state
/// (StepCounter's count) was accepted, and every step then failed ("the step count is missing
/// from the input tensordict"). Both are now refused when appended, naming the key.
#[test]
fn regression_state_keys_cannot_be_excluded_or_renamed() {
    let err = counting()
        .with(StepCounter::new())
        .unwrap()
        .with(ExcludeTransform::new(["step_count"]))
        .err()
        .expect("refused");
    assert!(err.to_string().contains("step_count"), "{err}");
    let err = counting()
        .with(StepCounter::new())
        .unwrap()
        .with(RenameTransform::new(["step_count"], ["renamed"]).unwrap())
        .err()
        .expect("refused");
    assert!(err.to_string().contains("step_count"), "{err}");
    // a copy is fine
    let mut env = counting()
        .with(StepCounter::new())
        .unwrap()
        .with(
            RenameTransform::new(["step_count"], ["renamed"])
                .unwrap()
                .with_create_copy(true),
        )
        .unwrap();
    check_env_specs(&mut env, Some(0)).unwrap();
}

/// Fixed (step_counter.rs, exclude.rs, rename.rs, select.rs): a done group left with "done"
/// and "truncated" but no "terminated" (StepCounter truncating after "terminated" was renamed
/// or excluded, or "terminated" excluded after StepCounter) was accepted, and every step then
/// failed in done completion ("cannot infer terminated when only done and truncated are
/// present"). Such stacks are now refused when appended.
#[test]
fn regression_truncation_needs_terminated() {
    let err = counting()
        .with(RenameTransform::new(["terminated"], ["renamed"]).unwrap())
        .unwrap()
        .with(StepCounter::new().with_max_steps(1).unwrap())
        .err()
        .expect("refused");
    assert!(err.to_string().contains("terminated"), "{err}");
    let err = counting()
        .with(StepCounter::new().with_max_steps(1).unwrap())
        .unwrap()
        .with(ExcludeTransform::new(["terminated"]))
        .err()
        .expect("refused");
    assert!(err.to_string().contains("terminated"), "{err}");
    // without truncation, excluding "terminated" is fine (done completion infers it)
    let mut env = counting()
        .with(ExcludeTransform::new(["terminated"]))
        .unwrap();
    check_env_specs(&mut env, Some(0)).unwrap();
}

/// Fixed (action_clamp.rs): an action of the wrong shape reached libtorch's broadcasting (a raw
/// "expanded size" error without the key, or a silently grown action), and an integer action
/// was clamped into bounds cast to its dtype (wrapping). Both are now errors naming the key.
#[test]
fn regression_action_clamp_checks_shape_and_dtype() {
    let mut env = TransformedEnv::new(PendulumEnv::new(&[2], CPU).unwrap())
        .unwrap()
        .with(ActionClamp::new())
        .unwrap();
    let root = env.reset(None).unwrap();
    let td = root
        .clone()
        .with("action", Tensor::zeros([2, 1, 1], (Kind::Float, CPU)))
        .unwrap();
    let err = env.step(td).unwrap_err();
    assert!(err.to_string().contains("\"action\""), "{err}");
    assert!(!matches!(err.root(), Error::Torch(_)), "{err}");
    let td = root
        .with("action", Tensor::zeros([2, 1], (Kind::Int64, CPU)))
        .unwrap();
    let err = env.step(td).unwrap_err();
    assert!(matches!(err.root(), Error::DtypeMismatch { .. }), "{err}");
    assert!(err.to_string().contains("\"action\""), "{err}");
}

/// Fixed (unsqueeze.rs, observation_norm.rs): rewriting a state key in place (unsqueezing
/// StepCounter's count, normalising RewardSum's sum) was accepted; the env then read the
/// rewritten value back at the next step (here the count grew a dim every step and
/// `check_env_specs` failed on the shape of `("next", "done")`). Both are refused when
/// appended; writing to another out key is fine.
#[test]
fn regression_state_keys_are_not_rewritten_in_place() {
    let err = counting()
        .with(StepCounter::new().with_max_steps(1).unwrap())
        .unwrap()
        .with(UnsqueezeTransform::new(0, ["step_count"]))
        .err()
        .expect("refused");
    assert!(err.to_string().contains("step_count"), "{err}");
    let err = counting()
        .with(RewardSum::new())
        .unwrap()
        .with(ObservationNorm::new(0.0, 2.0, ["episode_reward"]).unwrap())
        .err()
        .expect("refused");
    assert!(err.to_string().contains("episode_reward"), "{err}");
    let mut env = counting()
        .with(StepCounter::new().with_max_steps(1).unwrap())
        .unwrap()
        .with(UnsqueezeTransform::new(0, ["step_count"]).with_out_keys(["step_count_u"]))
        .unwrap();
    check_env_specs(&mut env, Some(0)).unwrap();
}

/// Fixed (src/envs/builtin/counting.rs): `CountingEnv::reset` with a `"_reset"` mask that is
/// not bool (e.g. an int64 mask of the right shape) panicked: it called `f_masked_fill` with
/// the mask as given, libtorch refused a non-bool mask, and tch panicked instead of returning
/// the error (its temporary `Scalar`'s destructor unwraps the pending libtorch error). The mask
/// is now cast to bool (nonzero resets), as `reset_plan` does for the other built-in envs, and
/// a mask with the wrong number of flags is an error naming `"_reset"`.
#[test]
fn regression_counting_reset_with_int_mask() {
    let mut env = CountingEnv::new(5, &[2]).unwrap();
    let mut root = env.reset(None).unwrap();
    for _ in 0..2 {
        let td = env.rand_action(Some(root)).unwrap();
        let td = env.step(td).unwrap();
        root = env.step_mdp(&td).unwrap();
    }
    let obs = root.get("observation").unwrap().reshape([-1]);
    assert_eq!(Vec::<f32>::try_from(obs).unwrap(), vec![2.0, 2.0]);
    let mask = Tensor::from_slice(&[0i64, 3]).reshape([2, 1]);
    root.set("_reset", mask).unwrap();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| env.reset(Some(root))));
    let out = r.expect("reset panicked").unwrap();
    let obs = out.get("observation").unwrap().reshape([-1]);
    assert_eq!(Vec::<f32>::try_from(obs).unwrap(), vec![2.0, 0.0]);
    let bad = TensorDict::new([2])
        .unwrap()
        .with("_reset", Tensor::ones([2, 3], (Kind::Float, CPU)))
        .unwrap();
    let err = env.reset(Some(bad)).unwrap_err();
    assert!(err.to_string().contains("\"_reset\""), "{err}");
}

/// Fixed (reward_scaling.rs): `RewardScaling::new` checks that loc and scale are finite as f64,
/// but the reward is float32: loc = scale = 1e39 are inf there, the scaled reward was NaN
/// (inf - inf, or 0 * inf), and a RewardClipping after it then failed `check_env_specs` (NaN is
/// in no bounds). Found by the long campaign after 60 513 cases. Appending such a RewardScaling
/// is now an error naming the reward's dtype.
#[test]
fn regression_reward_scaling_overflowing_the_reward_dtype() {
    let err = counting()
        .with(
            RewardScaling::new(1e39, 1e39)
                .unwrap()
                .with_standard_normal(true),
        )
        .err()
        .expect("refused");
    assert!(err.to_string().contains("Float"), "{err}");
    assert!(counting()
        .with(RewardScaling::new(0.0, 1e-50).unwrap())
        .is_err());
    let mut env = counting()
        .with(RewardScaling::new(1e30, 1e-30).unwrap())
        .unwrap()
        .with(RewardClipping::new(0.0, 0.0).unwrap())
        .unwrap();
    check_env_specs(&mut env, Some(0)).unwrap();
}
