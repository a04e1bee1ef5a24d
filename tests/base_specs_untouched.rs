//! Transforms never alter their base env's specs. For every transform exported by
//! `torchrl::envs::transforms` (the list is read from `src/envs/transforms/mod.rs`, so a new
//! transform fails this file until it is covered), wrapped around a built-in env it applies to,
//! the base env's `EnvSpecs` (observation / reward / done / action / state composites) are
//! identical — by `==`, by their `Display` strings (which also fix the key order), by the
//! values of every bound and mask tensor (deep copies taken up front, so an in-place write
//! through shared storage is caught) and by the cached key lists — before and after appending,
//! after rollouts, after `insert` / `pop` on the `TransformedEnv`, after `refresh_specs`, after
//! operations that fail and roll back, and after `into_parts`. Batched and nested bases too.

use std::collections::BTreeSet;

use tch::{Device, Kind, Tensor};
use torchrl::envs::batched::{ParallelEnv, SerialEnv};
use torchrl::envs::builtin::{CartPoleEnv, CountingEnv, MountainCarContinuousEnv, PendulumEnv};
use torchrl::envs::transforms::{
    ActionClamp, CatTensors, ClipTransform, Compose, DTypeCast, DoubleToFloat, ExcludeTransform,
    FrameSkipTransform, InitStats, InitTracker, ObservationNorm, RenameTransform, RewardClipping,
    RewardScaling, RewardSum, SelectTransform, StepCounter, TensorDictPrimer, Transform,
    TransformedEnv, UnsqueezeTransform, VecNorm,
};
use torchrl::envs::{EnvBase, EnvSpecs, RolloutConfig};
use torchrl::specs::{Bounded, Composite, TensorSpec};
use torchrl::tensordict::KeysOptions;
use torchrl::{Error, Result};

const CPU: Device = Device::Cpu;

// ------------------------------------------------------------------ snapshots

fn groups(s: &EnvSpecs) -> [(&'static str, &Composite); 5] {
    [
        ("observation", &s.observation),
        ("reward", &s.reward),
        ("done", &s.done),
        ("action", &s.action),
        ("state", &s.state),
    ]
}

/// Deep copies of every tensor held by the specs (bounds and masks), named.
fn spec_tensors(s: &EnvSpecs) -> Vec<(String, Tensor)> {
    let mut out = Vec::new();
    for (g, c) in groups(s) {
        for (k, leaf) in c.leaves() {
            let name = |what: &str| format!("{g} {k} {what}");
            match leaf {
                TensorSpec::Bounded(b) => {
                    out.push((name("low"), b.low().copy()));
                    out.push((name("high"), b.high().copy()));
                }
                TensorSpec::Categorical(c) => {
                    if let Some(m) = c.mask() {
                        out.push((name("mask"), m.copy()));
                    }
                }
                TensorSpec::OneHot(o) => {
                    if let Some(m) = o.mask() {
                        out.push((name("mask"), m.copy()));
                    }
                }
                _ => {}
            }
        }
    }
    out
}

/// Everything observable about an env's specs, deep-copied.
struct Snapshot {
    specs: EnvSpecs,
    display: Vec<String>,
    locked: Vec<bool>,
    debug: String,
    keys: String,
    tensors: Vec<(String, Tensor)>,
}

impl Snapshot {
    fn take(env: &dyn EnvBase) -> Self {
        let s = env.specs();
        Snapshot {
            specs: s.clone(),
            display: groups(s).iter().map(|(_, c)| c.to_string()).collect(),
            locked: groups(s).iter().map(|(_, c)| c.is_locked()).collect(),
            debug: format!("{s:?}"),
            keys: format!("{:?}", env.core().keys()),
            tensors: spec_tensors(s),
        }
    }

    #[track_caller]
    fn check(&self, env: &dyn EnvBase, ctx: &str) {
        let s = env.specs();
        for ((g, now), (_, then)) in groups(s).iter().zip(groups(&self.specs)) {
            assert!(
                *now == then,
                "{ctx}: the base env's {g} spec changed (==):\n{now}\nwas\n{then}"
            );
        }
        assert!(
            *s == self.specs,
            "{ctx}: the base env's EnvSpecs changed (==)"
        );
        for ((g, c), was) in groups(s).iter().zip(&self.display) {
            assert_eq!(
                &c.to_string(),
                was,
                "{ctx}: the base env's {g} spec prints differently"
            );
        }
        for ((g, c), was) in groups(s).iter().zip(&self.locked) {
            assert_eq!(
                c.is_locked(),
                *was,
                "{ctx}: the base env's {g} spec lock changed"
            );
        }
        assert_eq!(
            format!("{s:?}"),
            self.debug,
            "{ctx}: EnvSpecs debug output changed"
        );
        assert_eq!(
            format!("{:?}", env.core().keys()),
            self.keys,
            "{ctx}: the base env's key lists changed"
        );
        let now = spec_tensors(s);
        assert_eq!(now.len(), self.tensors.len(), "{ctx}: spec tensors");
        for ((name, t), (_, was)) in now.iter().zip(&self.tensors) {
            assert!(
                t.kind() == was.kind() && t.size() == was.size() && t.equal(was),
                "{ctx}: the base env's {name} tensor changed (in place?)"
            );
        }
    }
}

// ------------------------------------------------------------------ helper transforms

/// Identity transform used to change the stack around the transform under test.
struct Probe;

impl Transform for Probe {
    fn name(&self) -> String {
        "Probe".into()
    }
}

/// A transform that cannot be attached: appending or inserting it fails and rolls back.
struct Unattachable;

impl Transform for Unattachable {
    fn name(&self) -> String {
        "Unattachable".into()
    }
    fn attach(&mut self, _parent: &EnvSpecs) -> Result<()> {
        Err(Error::InvalidArgument {
            op: "Unattachable::attach",
            message: "refused".into(),
        })
    }
}

/// A transform whose spec hook rewrites everything it is given (removes every observation,
/// replaces every reward spec): it works on copies, so the base must not notice.
struct Rewriter;

impl Transform for Rewriter {
    fn name(&self) -> String {
        "Rewriter".into()
    }
    fn transform_observation_spec(&self, mut spec: Composite) -> Result<Composite> {
        spec.unlock();
        for k in spec.keys(KeysOptions::top_level()) {
            spec.remove(&k)?;
        }
        Ok(spec)
    }
    fn transform_reward_spec(&self, mut spec: Composite) -> Result<Composite> {
        spec.unlock();
        for k in spec.keys(KeysOptions::nested_leaves()) {
            let shape = spec.get(&k).map(|s| s.shape().to_vec()).unwrap_or_default();
            spec.set(&k, Bounded::new(-3.0, 3.0, shape)?)?;
        }
        Ok(spec)
    }
}

// ------------------------------------------------------------------ the lifecycle

fn rollouts(env: &mut dyn EnvBase, ctx: &str) {
    env.set_seed(1).unwrap();
    env.rollout(6, None, &RolloutConfig::default())
        .unwrap_or_else(|e| panic!("{ctx}: rollout: {e}"));
    env.rollout(12, None, &RolloutConfig::no_break())
        .unwrap_or_else(|e| panic!("{ctx}: non-stop rollout: {e}"));
}

/// Wraps `base`, appends the transform and runs the lifecycle, checking the base's specs after
/// every step. `after_append` runs right after the transform is appended (e.g. to initialise
/// statistics).
fn check_untouched<E: EnvBase>(
    name: &str,
    base: E,
    transform: Box<dyn Transform>,
    after_append: &dyn Fn(&mut TransformedEnv<E>),
) {
    let snap = Snapshot::take(&base);
    let mut env = TransformedEnv::new(base).unwrap();
    snap.check(env.base(), &format!("{name}: TransformedEnv::new"));

    env.append_boxed(transform)
        .unwrap_or_else(|e| panic!("{name}: append: {e}"));
    snap.check(env.base(), &format!("{name}: append"));
    after_append(&mut env);
    snap.check(env.base(), &format!("{name}: after the append hook"));
    let transformed = Snapshot::take(&env);

    rollouts(&mut env, name);
    snap.check(env.base(), &format!("{name}: rollouts"));
    transformed.check(
        &env,
        &format!("{name}: the transformed specs after rollouts"),
    );

    // Insert before and after the transform under test (it is attached again), then pop both.
    env.insert(0, Probe).unwrap();
    snap.check(env.base(), &format!("{name}: insert(0)"));
    env.insert(env.transform().len(), Rewriter).unwrap();
    snap.check(
        env.base(),
        &format!("{name}: insert(end) of a rewriting transform"),
    );
    env.insert(1, Probe).unwrap();
    snap.check(env.base(), &format!("{name}: insert(1)"));
    rollouts(&mut env, name);
    snap.check(env.base(), &format!("{name}: rollouts with a longer stack"));
    let n = env.transform().len();
    env.pop(n - 1).unwrap();
    snap.check(env.base(), &format!("{name}: pop(last)"));
    env.pop(1).unwrap();
    snap.check(env.base(), &format!("{name}: pop(1)"));
    env.pop(0).unwrap();
    snap.check(env.base(), &format!("{name}: pop(0)"));
    transformed.check(
        &env,
        &format!("{name}: the transformed specs after insert/pop"),
    );

    env.refresh_specs().unwrap();
    snap.check(env.base(), &format!("{name}: refresh_specs"));
    transformed.check(
        &env,
        &format!("{name}: the transformed specs after refresh_specs"),
    );

    // Operations that fail roll back without touching anything.
    assert!(env.insert(0, Unattachable).is_err());
    snap.check(env.base(), &format!("{name}: failed insert"));
    assert!(env.append(Unattachable).is_err());
    snap.check(env.base(), &format!("{name}: failed append"));
    assert!(env.pop(10).is_err());
    snap.check(env.base(), &format!("{name}: failed pop"));
    transformed.check(
        &env,
        &format!("{name}: the transformed specs after failed edits"),
    );
    assert_eq!(env.transform().len(), 1, "{name}");

    // Popping the transform under test gives back the base's specs.
    let t = env.pop(0).unwrap();
    snap.check(
        env.base(),
        &format!("{name}: pop of the transform under test"),
    );
    snap.check(
        &env,
        &format!("{name}: an empty TransformedEnv has the base's specs"),
    );
    env.append_boxed(t).unwrap();
    snap.check(env.base(), &format!("{name}: append again"));
    transformed.check(
        &env,
        &format!("{name}: the transformed specs after re-appending"),
    );
    rollouts(&mut env, name);
    snap.check(env.base(), &format!("{name}: final rollouts"));

    let (base, _) = env.into_parts();
    snap.check(&base, &format!("{name}: into_parts"));
}

fn pendulum(batch: &[i64]) -> PendulumEnv {
    PendulumEnv::new(batch, CPU).unwrap()
}

fn cartpole(batch: &[i64]) -> CartPoleEnv {
    CartPoleEnv::new(batch, CPU).unwrap()
}

fn mountain_car(batch: &[i64]) -> MountainCarContinuousEnv {
    MountainCarContinuousEnv::new(batch, CPU).unwrap()
}

fn counting(batch: &[i64]) -> CountingEnv {
    CountingEnv::new(5, batch).unwrap()
}

// ------------------------------------------------------------------ one test per transform

/// The transforms covered below; checked against `src/envs/transforms/mod.rs`.
const COVERED: &[&str] = &[
    "ActionClamp",
    "InitTracker",
    "RewardClipping",
    "RewardScaling",
    "RewardSum",
    "StepCounter",
    "TensorDictPrimer",
    "CatTensors",
    "DTypeCast",
    "DoubleToFloat",
    "ExcludeTransform",
    "ObservationNorm",
    "RenameTransform",
    "SelectTransform",
    "UnsqueezeTransform",
    "Compose",
    "ClipTransform",
    "FrameSkipTransform",
    "VecNorm",
    // Needs an actor built on a VarStore: its base-spec check lives in tests/kl_reward.rs.
    "KLRewardTransform",
];

#[test]
fn every_exported_transform_is_covered() {
    let src = include_str!("../src/envs/transforms/mod.rs");
    let not_transforms = [
        "NanPolicy",
        "InitStats",
        "TransformedEnv",
        "TransformHandle",
        "DistributionSource",
        "DEFAULT_LOG_PROB_KEY",
    ];
    let mut exported = BTreeSet::new();
    for line in src.lines().map(str::trim) {
        let Some(rest) = line.strip_prefix("pub use ") else {
            continue;
        };
        let items = rest
            .trim_end_matches(';')
            .rsplit("::")
            .next()
            .unwrap()
            .trim_matches(|c| c == '{' || c == '}');
        for item in items.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            if !not_transforms.contains(&item) {
                exported.insert(item.to_string());
            }
        }
    }
    assert!(exported.len() >= 15, "parsed {exported:?}");
    let covered: BTreeSet<String> = COVERED.iter().map(|s| s.to_string()).collect();
    let missing: Vec<_> = exported.difference(&covered).collect();
    assert!(
        missing.is_empty(),
        "transforms without a base-spec test: {missing:?}"
    );
}

#[test]
fn action_clamp() {
    check_untouched(
        "ActionClamp",
        pendulum(&[2]),
        Box::new(ActionClamp::new()),
        &|_| {},
    );
    check_untouched(
        "ActionClamp on MountainCar",
        mountain_car(&[]),
        Box::new(ActionClamp::new()),
        &|_| {},
    );
}

#[test]
fn clip_transform() {
    check_untouched(
        "ClipTransform",
        pendulum(&[2]),
        Box::new(
            ClipTransform::new(Some(-0.5), Some(0.5))
                .unwrap()
                .with_in_keys(["observation", "reward"])
                .with_in_keys_inv(["action"]),
        ),
        &|_| {},
    );
}

#[test]
fn frame_skip_transform() {
    check_untouched(
        "FrameSkipTransform",
        cartpole(&[3]),
        Box::new(FrameSkipTransform::new(3).unwrap()),
        &|_| {},
    );
}

#[test]
fn vec_norm() {
    check_untouched("VecNorm", pendulum(&[2]), Box::new(VecNorm::new()), &|_| {});
}

#[test]
fn init_tracker() {
    check_untouched(
        "InitTracker",
        counting(&[3]),
        Box::new(InitTracker::new()),
        &|_| {},
    );
}

#[test]
fn reward_clipping() {
    check_untouched(
        "RewardClipping",
        pendulum(&[]),
        Box::new(RewardClipping::new(-1.0, 1.0).unwrap()),
        &|_| {},
    );
}

#[test]
fn reward_scaling() {
    check_untouched(
        "RewardScaling",
        cartpole(&[3]),
        Box::new(RewardScaling::new(0.5, 2.0).unwrap()),
        &|_| {},
    );
    check_untouched(
        "RewardScaling standard_normal",
        pendulum(&[]),
        Box::new(
            RewardScaling::new(0.5, 2.0)
                .unwrap()
                .with_standard_normal(true),
        ),
        &|_| {},
    );
}

#[test]
fn reward_sum() {
    check_untouched(
        "RewardSum",
        cartpole(&[]),
        Box::new(RewardSum::new()),
        &|_| {},
    );
}

#[test]
fn step_counter() {
    check_untouched(
        "StepCounter",
        mountain_car(&[2]),
        Box::new(StepCounter::new().with_max_steps(5).unwrap()),
        &|_| {},
    );
    check_untouched(
        "StepCounter without max_steps",
        counting(&[]),
        Box::new(StepCounter::new()),
        &|_| {},
    );
}

#[test]
fn tensordict_primer() {
    let primer = TensorDictPrimer::new()
        .with_primer("hidden", Bounded::new(-1.0, 1.0, [3]).unwrap())
        .with_expand_specs(true)
        .with_random(true);
    check_untouched(
        "TensorDictPrimer",
        pendulum(&[2]),
        Box::new(primer),
        &|_| {},
    );
}

#[test]
fn cat_tensors() {
    check_untouched(
        "CatTensors",
        cartpole(&[2]),
        Box::new(CatTensors::new(["observation"]).with_out_key("obs_vec")),
        &|_| {},
    );
    check_untouched(
        "CatTensors keeping its inputs",
        pendulum(&[]),
        Box::new(
            CatTensors::new(["observation"])
                .with_out_key("obs_vec")
                .with_del_keys(false),
        ),
        &|_| {},
    );
}

#[test]
fn dtype_cast() {
    check_untouched(
        "DTypeCast float64 -> float32",
        pendulum(&[]),
        Box::new(DTypeCast::new(Kind::Double, Kind::Float)),
        &|_| {},
    );
    check_untouched(
        "DTypeCast float32 -> float64",
        mountain_car(&[2]),
        Box::new(DTypeCast::new(Kind::Float, Kind::Double)),
        &|_| {},
    );
}

#[test]
fn double_to_float() {
    check_untouched(
        "DoubleToFloat",
        mountain_car(&[]),
        Box::new(DoubleToFloat::new()),
        &|_| {},
    );
}

#[test]
fn exclude_transform() {
    check_untouched(
        "ExcludeTransform",
        counting(&[3]),
        Box::new(ExcludeTransform::new(["terminated"])),
        &|_| {},
    );
}

#[test]
fn observation_norm() {
    // A Bounded observation: its bounds are mapped, on copies.
    check_untouched(
        "ObservationNorm",
        pendulum(&[2]),
        Box::new(ObservationNorm::new(0.5, 2.0, ["observation"]).unwrap()),
        &|_| {},
    );
    check_untouched(
        "ObservationNorm standard_normal",
        cartpole(&[]),
        Box::new(
            ObservationNorm::new(0.5, 2.0, ["observation"])
                .unwrap()
                .with_standard_normal(true),
        ),
        &|_| {},
    );
    // Statistics computed on the env after the transform joined it (rolls the base out).
    check_untouched(
        "ObservationNorm init_stats_at",
        pendulum(&[]),
        Box::new(ObservationNorm::uninitialized(["observation"]).unwrap()),
        &|env| ObservationNorm::init_stats_at(env, 0, &InitStats::new(20)).unwrap(),
    );
}

#[test]
fn rename_transform() {
    check_untouched(
        "RenameTransform",
        cartpole(&[]),
        Box::new(RenameTransform::new(["observation", "reward"], ["obs", "bonus"]).unwrap()),
        &|_| {},
    );
    check_untouched(
        "RenameTransform inverse",
        pendulum(&[2]),
        Box::new(RenameTransform::inverse(["action"], [("agent", "action")]).unwrap()),
        &|_| {},
    );
}

#[test]
fn select_transform() {
    check_untouched(
        "SelectTransform",
        mountain_car(&[2]),
        Box::new(SelectTransform::new(["observation"])),
        &|_| {},
    );
}

#[test]
fn unsqueeze_transform() {
    check_untouched(
        "UnsqueezeTransform",
        counting(&[4]),
        Box::new(UnsqueezeTransform::new(-1, ["observation"])),
        &|_| {},
    );
    check_untouched(
        "UnsqueezeTransform inverse",
        counting(&[4]),
        Box::new(UnsqueezeTransform::inverse(0, ["action"])),
        &|_| {},
    );
}

#[test]
fn compose() {
    let mut c = Compose::new();
    c.push(RewardScaling::new(0.0, 0.1).unwrap());
    c.push(StepCounter::new().with_max_steps(4).unwrap());
    c.push(RewardSum::new());
    c.push(ObservationNorm::new(1.0, 3.0, ["observation"]).unwrap());
    c.push(InitTracker::new());
    check_untouched("Compose", pendulum(&[2]), Box::new(c), &|_| {});
}

// ------------------------------------------------------------------ other bases

#[test]
fn batched_and_nested_bases_are_untouched() {
    let serial = SerialEnv::new(vec![pendulum(&[]), pendulum(&[])]).unwrap();
    check_untouched(
        "ObservationNorm on SerialEnv",
        serial,
        Box::new(ObservationNorm::new(0.5, 2.0, ["observation"]).unwrap()),
        &|_| {},
    );
    let parallel = ParallelEnv::new(vec![cartpole(&[2]), cartpole(&[2])]).unwrap();
    check_untouched(
        "RenameTransform on ParallelEnv",
        parallel,
        Box::new(RenameTransform::new(["observation"], ["obs"]).unwrap()),
        &|_| {},
    );
    // A transformed env as the base: its (transformed) specs and its own base's are untouched.
    let inner = TransformedEnv::new(pendulum(&[2]))
        .unwrap()
        .with(ObservationNorm::new(0.5, 2.0, ["observation"]).unwrap())
        .unwrap()
        .with(StepCounter::new().with_max_steps(5).unwrap())
        .unwrap();
    let innermost = Snapshot::take(inner.base());
    let mut c = Compose::new();
    c.push(ObservationNorm::new(-1.0, 0.5, ["observation"]).unwrap());
    c.push(RewardSum::new());
    let snap = Snapshot::take(&inner);
    let mut env = TransformedEnv::new(inner).unwrap().with(c).unwrap();
    rollouts(&mut env, "nested");
    // A failed insert (the Rewriter removes the observation the ObservationNorm needs) rolls
    // back; an insert at the end works.
    assert!(env.insert(0, Rewriter).is_err());
    snap.check(env.base(), "nested: failed insert");
    env.insert(1, Rewriter).unwrap();
    rollouts(&mut env, "nested with a rewriter");
    env.pop(1).unwrap();
    env.refresh_specs().unwrap();
    snap.check(env.base(), "nested: the inner TransformedEnv");
    innermost.check(env.base().base(), "nested: the innermost base");
    // Transformed envs inside a batched env: each worker's base is untouched.
    let workers: Vec<_> = (0..2)
        .map(|_| {
            TransformedEnv::new(mountain_car(&[]))
                .unwrap()
                .with(DoubleToFloat::new())
                .unwrap()
        })
        .collect();
    let snaps: Vec<_> = workers.iter().map(|w| Snapshot::take(w.base())).collect();
    let mut serial = SerialEnv::new(workers).unwrap();
    rollouts(&mut serial, "serial of transformed envs");
    for (w, s) in serial.envs().iter().zip(&snaps) {
        s.check(w.base(), "a SerialEnv worker's base");
    }
}

#[test]
fn the_checks_catch_an_in_place_change() {
    // The snapshot must see a change made through shared storage (what `==` on a shallow
    // clone would miss).
    let env = pendulum(&[]);
    let snap = Snapshot::take(&env);
    let high = match env.specs().observation.get("observation") {
        Some(TensorSpec::Bounded(b)) => b.high().shallow_clone(),
        _ => panic!("Pendulum's observation is Bounded"),
    };
    let mut h = high;
    let _ = h.f_add_scalar_(1.0).unwrap();
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        snap.check(&env, "in-place change")
    }));
    assert!(
        caught.is_err(),
        "an in-place change of a bound went unnoticed"
    );
}
