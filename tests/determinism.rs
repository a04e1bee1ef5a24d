//! Determinism: the same seed gives bit-identical rollouts (every leaf compared with
//! `Tensor::equal`, dtypes, shapes, batch sizes and the key order, levels included), for every
//! built-in env, single (batch `[]`) and batched (batch `[4]`), plain and through `SerialEnv` /
//! `ParallelEnv` of 3 workers (which must agree with each other bit for bit), with and without
//! a transform stack (RewardScaling, StepCounter with max_steps, RewardSum, a random
//! TensorDictPrimer, InitTracker) outside or inside the workers, in stop-on-done, stop-when-all-
//! done and non-stop rollouts long enough to cross several automatic resets. Different seeds give
//! different rollouts; reseeding mid-way reproduces the same continuation.

use tch::{Device, Kind, Tensor};
use torchrl::envs::batched::{ParallelEnv, SerialEnv};
use torchrl::envs::builtin::{CartPoleEnv, CountingEnv, MountainCarContinuousEnv, PendulumEnv};
use torchrl::envs::transforms::{
    InitTracker, RewardScaling, RewardSum, StepCounter, TensorDictPrimer, TransformedEnv,
};
use torchrl::envs::{EnvBase, RolloutConfig};
use torchrl::specs::Bounded;
use torchrl::tensordict::KeysOptions;
use torchrl::{Entry, TensorDict};

// ------------------------------------------------------------------ comparing rollouts

/// `Err(first difference)` unless `a` and `b` are bit-identical: batch sizes, keys in order
/// (levels included), every level's batch size, every leaf's dtype, shape, device and values.
fn identical(a: &TensorDict, b: &TensorDict) -> Result<(), String> {
    if a.batch_size() != b.batch_size() {
        return Err(format!(
            "batch sizes differ: {:?} vs {:?}",
            a.batch_size(),
            b.batch_size()
        ));
    }
    let ka: Vec<String> = a
        .keys(KeysOptions::nested())
        .iter()
        .map(|k| k.to_string())
        .collect();
    let kb: Vec<String> = b
        .keys(KeysOptions::nested())
        .iter()
        .map(|k| k.to_string())
        .collect();
    if ka != kb {
        return Err(format!("keys (in order) differ:\n  {ka:?}\n  {kb:?}"));
    }
    for ((k, ea), (_, eb)) in a
        .items(KeysOptions::nested())
        .into_iter()
        .zip(b.items(KeysOptions::nested()))
    {
        match (ea, eb) {
            (Entry::Tensor(x), Entry::Tensor(y)) => {
                if x.kind() != y.kind() || x.size() != y.size() || x.device() != y.device() {
                    return Err(format!(
                        "leaf {k}: {:?} {:?} {:?} vs {:?} {:?} {:?}",
                        x.kind(),
                        x.size(),
                        x.device(),
                        y.kind(),
                        y.size(),
                        y.device()
                    ));
                }
                if !x.equal(y) {
                    return Err(format!("leaf {k}: values differ"));
                }
            }
            (Entry::Dict(x), Entry::Dict(y)) => {
                if x.batch_size() != y.batch_size() {
                    return Err(format!(
                        "level {k}: batch sizes {:?} vs {:?}",
                        x.batch_size(),
                        y.batch_size()
                    ));
                }
            }
            _ => {
                return Err(format!(
                    "entry {k} is a leaf in one and a level in the other"
                ))
            }
        }
    }
    Ok(())
}

#[track_caller]
fn assert_identical(a: &TensorDict, b: &TensorDict, ctx: &str) {
    if let Err(e) = identical(a, b) {
        panic!("{ctx}: rollouts are not bit-identical: {e}");
    }
}

#[track_caller]
fn assert_different(a: &TensorDict, b: &TensorDict, ctx: &str) {
    assert!(
        identical(a, b).is_err(),
        "{ctx}: different seeds gave bit-identical rollouts"
    );
}

// ------------------------------------------------------------------ building envs

#[derive(Clone, Copy, Debug, PartialEq)]
enum Builtin {
    Counting,
    Pendulum,
    CartPole,
    MountainCar,
}

impl Builtin {
    const ALL: [Builtin; 4] = [
        Builtin::Counting,
        Builtin::Pendulum,
        Builtin::CartPole,
        Builtin::MountainCar,
    ];

    /// Whether the initial state is drawn from the env's generator (so that the seed shows in
    /// the observations, not only in the random actions).
    fn random_start(self) -> bool {
        self != Builtin::Counting
    }
}

/// How the env is wrapped.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Wrap {
    /// The env itself (transforms, if any, around it).
    Single,
    /// `SerialEnv` of 3 (transforms, if any, around the batched env).
    Serial,
    /// `ParallelEnv` of 3 (transforms, if any, around the batched env).
    Parallel,
    /// `SerialEnv` of 3 transformed envs.
    SerialInner,
    /// `ParallelEnv` of 3 transformed envs.
    ParallelInner,
}

const WORKERS: usize = 3;
/// StepCounter's time limit in the transform stack.
const MAX_STEPS: i64 = 7;

/// RewardScaling, StepCounter(max_steps), RewardSum, a random TensorDictPrimer, InitTracker.
fn transformed<E: EnvBase>(env: E) -> TransformedEnv<E> {
    let primer = TensorDictPrimer::new()
        .with_primer("hidden", Bounded::new(-1.0, 1.0, [2]).unwrap())
        .with_expand_specs(true)
        .with_random(true);
    TransformedEnv::new(env)
        .unwrap()
        .with(RewardScaling::new(0.5, 2.0).unwrap())
        .unwrap()
        .with(StepCounter::new().with_max_steps(MAX_STEPS).unwrap())
        .unwrap()
        .with(RewardSum::new())
        .unwrap()
        .with(primer)
        .unwrap()
        .with(InitTracker::new())
        .unwrap()
}

fn wrap<E: EnvBase + 'static>(
    make: impl Fn() -> E,
    how: Wrap,
    transforms: bool,
) -> Box<dyn EnvBase> {
    let n = || (0..WORKERS).map(|_| make()).collect::<Vec<E>>();
    let n_inner = || {
        (0..WORKERS)
            .map(|_| transformed(make()))
            .collect::<Vec<_>>()
    };
    match (how, transforms) {
        (Wrap::Single, false) => Box::new(make()),
        (Wrap::Single, true) => Box::new(transformed(make())),
        (Wrap::Serial, false) => Box::new(SerialEnv::new(n()).unwrap()),
        (Wrap::Serial, true) => Box::new(transformed(SerialEnv::new(n()).unwrap())),
        (Wrap::Parallel, false) => Box::new(ParallelEnv::new(n()).unwrap()),
        (Wrap::Parallel, true) => Box::new(transformed(ParallelEnv::new(n()).unwrap())),
        (Wrap::SerialInner, _) => Box::new(SerialEnv::new(n_inner()).unwrap()),
        (Wrap::ParallelInner, _) => Box::new(ParallelEnv::new(n_inner()).unwrap()),
    }
}

fn build(kind: Builtin, batch: &[i64], how: Wrap, transforms: bool) -> Box<dyn EnvBase> {
    let b = batch.to_vec();
    match kind {
        Builtin::Counting => wrap(move || CountingEnv::new(6, &b).unwrap(), how, transforms),
        Builtin::Pendulum => wrap(
            move || PendulumEnv::new(&b, Device::Cpu).unwrap(),
            how,
            transforms,
        ),
        Builtin::CartPole => wrap(
            move || CartPoleEnv::new(&b, Device::Cpu).unwrap(),
            how,
            transforms,
        ),
        Builtin::MountainCar => wrap(
            move || MountainCarContinuousEnv::new(&b, Device::Cpu).unwrap(),
            how,
            transforms,
        ),
    }
}

// ------------------------------------------------------------------ rollout modes

#[derive(Clone, Copy, Debug)]
enum Mode {
    /// Stop at the first done (TorchRL's default).
    StopOnDone,
    /// Stop once every batch element was done at least once (partial resets in between).
    StopWhenAllDone,
    /// Never stop; done elements are reset automatically.
    NonStop,
}

const MODES: [Mode; 3] = [Mode::StopOnDone, Mode::StopWhenAllDone, Mode::NonStop];

fn cfg(mode: Mode) -> RolloutConfig {
    match mode {
        Mode::StopOnDone => RolloutConfig::default(),
        Mode::StopWhenAllDone => RolloutConfig {
            break_when_all_done: Some(true),
            ..Default::default()
        },
        Mode::NonStop => RolloutConfig::no_break(),
    }
}

/// Long enough for several automatic resets in the non-stop mode (CountingEnv ends every 6
/// steps, StepCounter truncates every 7, random CartPole episodes last ~10–40 steps).
const STEPS: usize = 30;

fn seeded_rollout(env: &mut dyn EnvBase, seed: u64, mode: Mode) -> TensorDict {
    env.set_seed(seed).unwrap();
    env.rollout(STEPS, None, &cfg(mode)).unwrap()
}

/// Number of steps (over all batch elements) where a done flag was set: how many resets a
/// non-stop rollout went through.
fn done_count(traj: &TensorDict) -> i64 {
    traj.get_or_err(("next", "done"))
        .unwrap()
        .to_kind(Kind::Int64)
        .sum(Kind::Int64)
        .int64_value(&[])
}

// ------------------------------------------------------------------ same seed, same rollout

/// For each batch shape, transform setting and rollout mode: two fresh instances seeded alike
/// agree; the same instance reseeded agrees; another seed differs; SerialEnv and ParallelEnv
/// agree with each other (transforms around them or inside their workers).
fn check_kind(kind: Builtin) {
    const SEED: u64 = 42;
    const OTHER: u64 = 7;
    for batch in [&[][..], &[4][..]] {
        for transforms in [false, true] {
            for mode in MODES {
                let mut per_wrap: Vec<(Wrap, TensorDict)> = Vec::new();
                let mut wraps = vec![Wrap::Single, Wrap::Serial, Wrap::Parallel];
                if transforms {
                    wraps.extend([Wrap::SerialInner, Wrap::ParallelInner]);
                }
                for how in wraps {
                    let ctx = format!(
                        "{kind:?} batch={batch:?} {how:?} transforms={transforms} {mode:?}"
                    );
                    let mut env = build(kind, batch, how, transforms);
                    let mut twin = build(kind, batch, how, transforms);
                    let a = seeded_rollout(env.as_mut(), SEED, mode);
                    let b = seeded_rollout(twin.as_mut(), SEED, mode);
                    assert_identical(&a, &b, &format!("{ctx}: two fresh instances"));
                    // The same instance, after a rollout, reseeded: the same rollout again.
                    let c = seeded_rollout(env.as_mut(), SEED, mode);
                    assert_identical(&a, &c, &format!("{ctx}: reseeded instance"));
                    let d = seeded_rollout(twin.as_mut(), OTHER, mode);
                    assert_different(&a, &d, &ctx);
                    if kind.random_start() {
                        // The seed reaches the env's initial state, not only the actions.
                        let oa = a.get_or_err("observation").unwrap();
                        let od = d.get_or_err("observation").unwrap();
                        let first = |t: &Tensor| t.narrow(a.batch_dims() as i64 - 1, 0, 1);
                        assert!(
                            !first(oa).equal(&first(od)),
                            "{ctx}: the first observation does not depend on the seed"
                        );
                    }
                    if matches!(mode, Mode::NonStop) {
                        // Several automatic resets per batch element: CountingEnv ends every 6
                        // steps and StepCounter truncates every 7; random CartPole episodes
                        // end too. Pendulum never terminates and MountainCar rarely does.
                        let numel: i64 = a.batch_size()[..a.batch_dims() - 1].iter().product();
                        let want = if transforms || kind == Builtin::Counting {
                            3 * numel
                        } else if kind == Builtin::CartPole {
                            1
                        } else {
                            0
                        };
                        assert!(
                            done_count(&a) >= want,
                            "{ctx}: the non-stop rollout crossed too few resets ({} dones, want {want})",
                            done_count(&a)
                        );
                    }
                    per_wrap.push((how, a));
                }
                // SerialEnv and ParallelEnv (same seed) agree bit for bit.
                let get = |w: Wrap| per_wrap.iter().find(|(h, _)| *h == w).map(|(_, t)| t);
                let ctx = format!("{kind:?} batch={batch:?} transforms={transforms} {mode:?}");
                assert_identical(
                    get(Wrap::Serial).unwrap(),
                    get(Wrap::Parallel).unwrap(),
                    &format!("{ctx}: SerialEnv vs ParallelEnv"),
                );
                if transforms {
                    assert_identical(
                        get(Wrap::SerialInner).unwrap(),
                        get(Wrap::ParallelInner).unwrap(),
                        &format!("{ctx}: SerialEnv vs ParallelEnv of transformed envs"),
                    );
                }
            }
        }
    }
}

#[test]
fn counting_env_same_seed_same_rollout() {
    check_kind(Builtin::Counting);
}

#[test]
fn pendulum_same_seed_same_rollout() {
    check_kind(Builtin::Pendulum);
}

#[test]
fn cartpole_same_seed_same_rollout() {
    check_kind(Builtin::CartPole);
}

#[test]
fn mountain_car_same_seed_same_rollout() {
    check_kind(Builtin::MountainCar);
}

// ------------------------------------------------------------------ reseeding mid-way

/// Steps `n` times from `td` with random actions (auto-resetting done elements); returns the
/// root for the next step.
fn advance(env: &mut dyn EnvBase, mut td: TensorDict, n: usize) -> TensorDict {
    for _ in 0..n {
        let with_action = env.rand_action(Some(td)).unwrap();
        let (_, root) = env.step_and_maybe_reset(with_action).unwrap();
        td = root;
    }
    td
}

fn from(td: &TensorDict) -> RolloutConfig {
    RolloutConfig {
        break_when_any_done: Some(false),
        auto_reset: Some(false),
        tensordict: Some(td.clone()),
        ..Default::default()
    }
}

#[test]
fn reseeding_mid_way_reproduces_the_continuation() {
    const S: u64 = 3;
    const T: u64 = 1234;
    for kind in Builtin::ALL {
        for (how, transforms) in [
            (Wrap::Single, false),
            (Wrap::Single, true),
            (Wrap::Serial, true),
            (Wrap::Parallel, true),
        ] {
            let batch: &[i64] = if how == Wrap::Single { &[4] } else { &[] };
            let ctx = format!("{kind:?} {how:?} transforms={transforms}");
            let mk = || build(kind, batch, how, transforms);

            // A rollout, a reseed, a second rollout (it resets first).
            let mut e1 = mk();
            e1.set_seed(S).unwrap();
            let r1a = e1.rollout(17, None, &RolloutConfig::no_break()).unwrap();
            e1.set_seed(T).unwrap();
            let r1b = e1.rollout(23, None, &RolloutConfig::no_break()).unwrap();

            let mut e2 = mk();
            e2.set_seed(S).unwrap();
            let r2a = e2.rollout(17, None, &RolloutConfig::no_break()).unwrap();
            assert_identical(&r1a, &r2a, &format!("{ctx}: first part"));
            e2.set_seed(T).unwrap();
            let r2b = e2.rollout(23, None, &RolloutConfig::no_break()).unwrap();
            assert_identical(&r1b, &r2b, &format!("{ctx}: continuation after reseed"));

            // What came before the reseed does not matter once the env resets: another seed,
            // another length, another rollout mode, then the same reseed.
            let mut e3 = mk();
            e3.set_seed(99).unwrap();
            e3.rollout(9, None, &RolloutConfig::default()).unwrap();
            e3.set_seed(T).unwrap();
            let r3b = e3.rollout(23, None, &RolloutConfig::no_break()).unwrap();
            assert_identical(
                &r1b,
                &r3b,
                &format!("{ctx}: continuation after another history"),
            );
            // And the same instance, reseeded once more.
            e3.set_seed(T).unwrap();
            let r3c = e3.rollout(23, None, &RolloutConfig::no_break()).unwrap();
            assert_identical(&r1b, &r3c, &format!("{ctx}: reseeded again"));

            // Mid-episode: reseed without resetting and continue from the current data.
            let mut runs = Vec::new();
            for _ in 0..2 {
                let mut e = mk();
                e.set_seed(S).unwrap();
                let td = e.reset(None).unwrap();
                let td = advance(e.as_mut(), td, 5);
                e.set_seed(T).unwrap();
                let cont = e.rollout(12, None, &from(&td)).unwrap();
                runs.push((td, cont));
            }
            assert_identical(
                &runs[0].0,
                &runs[1].0,
                &format!("{ctx}: state at the reseed"),
            );
            assert_identical(
                &runs[0].1,
                &runs[1].1,
                &format!("{ctx}: continuation mid-episode"),
            );
            // The continuation starts from the given data (no hidden reset).
            let start = runs[0].0.get_or_err("observation").unwrap();
            let first = runs[0]
                .1
                .get_or_err("observation")
                .unwrap()
                .select(start.dim() as i64 - 1, 0);
            assert!(
                first.equal(start),
                "{ctx}: the continuation did not start from the given tensordict"
            );
            // A different seed at the same point gives a different continuation (actions).
            let mut e = mk();
            e.set_seed(S).unwrap();
            let td = e.reset(None).unwrap();
            let td = advance(e.as_mut(), td, 5);
            e.set_seed(T + 1).unwrap();
            let other = e.rollout(12, None, &from(&td)).unwrap();
            assert_different(&runs[0].1, &other, &format!("{ctx}: mid-episode"));
        }
    }
}

/// Partial resets through `"_reset"` masks are deterministic too, and a batched env resets only
/// the masked workers the same way serially and in parallel.
#[test]
fn partial_resets_are_deterministic_serial_and_parallel() {
    for kind in Builtin::ALL {
        let mut outs = Vec::new();
        for how in [Wrap::Serial, Wrap::Parallel] {
            let mut env = build(kind, &[2], how, true);
            env.set_seed(5).unwrap();
            let td = env.reset(None).unwrap();
            let td = advance(env.as_mut(), td, 3);
            let mask =
                Tensor::from_slice(&[true, false, false, false, false, true]).reshape([3, 2, 1]);
            let reset = env
                .reset(Some(td.clone().with("_reset", mask).unwrap()))
                .unwrap();
            let after = advance(env.as_mut(), reset.clone(), 4);
            outs.push((reset, after));
        }
        assert_identical(&outs[0].0, &outs[1].0, &format!("{kind:?}: partial reset"));
        assert_identical(&outs[0].1, &outs[1].1, &format!("{kind:?}: steps after it"));
    }
}
