//! EnvBase behaviour: replay of specs/env_cases.json (recorded from TorchRL 0.14.1 with a Python
//! counting env that mirrors `CountingEnv`) plus hand-derived checks of rollouts, partial
//! resets, step_and_maybe_reset, seeding, batched envs and check_env_specs errors.

mod common;

use common::{check_tensor, load_cases, Case};
use tch::{Device, Kind, Tensor};
use torchrl::envs::batched::{ParallelEnv, SerialEnv};
use torchrl::envs::builtin::CountingEnv;
use torchrl::envs::{check_env_specs, EnvBase, EnvCore, EnvSpecs, RolloutConfig};
use torchrl::specs::{Bounded, Unbounded};
use torchrl::tensordict::KeysOptions;
use torchrl::{Error, NestedKey, Result, TensorDict};

fn usize_arg(c: &Case, name: &str) -> usize {
    c.arg(name)
        .ok()
        .and_then(|v| v.as_i64())
        .unwrap_or_else(|| panic!("{}: {name}", c.name)) as usize
}

fn batch_arg(c: &Case) -> Vec<i64> {
    c.arg("batch_size")
        .ok()
        .and_then(|v| v.as_array())
        .map(|a| a.iter().filter_map(|x| x.as_i64()).collect())
        .unwrap_or_default()
}

fn keys_json(v: &common::Value) -> Vec<Vec<String>> {
    v.as_array()
        .unwrap_or(&[])
        .iter()
        .map(|k| {
            k.as_array()
                .unwrap_or(&[])
                .iter()
                .filter_map(|s| s.as_str().map(str::to_string))
                .collect()
        })
        .collect()
}

fn keys_rust(keys: &[NestedKey]) -> Vec<Vec<String>> {
    keys.iter()
        .map(|k| k.parts().map(str::to_string).collect())
        .collect()
}

fn sorted(mut v: Vec<Vec<String>>) -> Vec<Vec<String>> {
    v.sort();
    v
}

/// Our rollout stores actions too; the recorded leaf lists compare observations etc.
fn check_rollout(c: &Case, traj: &TensorDict) {
    let e = &c.expect;
    let bs: Vec<i64> = e["batch_size"]
        .as_array()
        .unwrap_or(&[])
        .iter()
        .filter_map(|x| x.as_i64())
        .collect();
    assert_eq!(traj.batch_size(), bs.as_slice(), "{}: batch size", c.name);
    assert_eq!(
        sorted(keys_rust(&traj.keys(KeysOptions::nested_leaves()))),
        keys_json(&e["keys"]),
        "{}: leaf keys",
        c.name
    );
    if let Some(values) = e["values"].as_object() {
        for (k, v) in values {
            let key: Vec<&str> = k.split('/').collect();
            let t = traj
                .get(&key[..])
                .unwrap_or_else(|| panic!("{}: missing {k}", c.name));
            check_tensor(t, v, &format!("{}: {k}", c.name)).unwrap_or_else(|m| panic!("{m}"));
        }
    }
}

#[test]
fn replay_env_cases() {
    let file = load_cases("env_cases.json");
    let mut replayed = 0;
    for c in &file.cases {
        match c.op.as_str() {
            "rollout" => {
                let mut env =
                    CountingEnv::new(usize_arg(c, "max_steps") as i64, &batch_arg(c)).unwrap();
                let cfg = RolloutConfig {
                    break_when_any_done: c
                        .args
                        .get("break_when_any_done")
                        .and_then(|v| v.as_bool()),
                    ..Default::default()
                };
                let traj = env.rollout(usize_arg(c, "steps"), None, &cfg).unwrap();
                check_rollout(c, &traj);
            }
            "keys" => {
                let env = CountingEnv::new(5, &[]).unwrap();
                let e = &c.expect;
                assert_eq!(keys_rust(&env.done_keys()), keys_json(&e["done_keys"]));
                assert_eq!(keys_rust(&env.reset_keys()), keys_json(&e["reset_keys"]));
                assert_eq!(keys_rust(&env.action_keys()), keys_json(&e["action_keys"]));
                assert_eq!(keys_rust(&env.reward_keys()), keys_json(&e["reward_keys"]));
                assert_eq!(
                    keys_rust(&env.observation_keys()),
                    keys_json(&e["observation_keys"])
                );
                let fake = env.fake_tensordict().unwrap();
                assert_eq!(
                    sorted(keys_rust(&fake.keys(KeysOptions::nested_leaves()))),
                    keys_json(&e["fake_keys"])
                );
            }
            "step_mdp" => {
                let mut env = CountingEnv::new(5, &[]).unwrap();
                let td = env.reset(None).unwrap();
                let td = env.rand_action(Some(td)).unwrap();
                let td = env.step(td).unwrap();
                let root = env.step_mdp(&td).unwrap();
                assert_eq!(
                    sorted(keys_rust(&root.keys(KeysOptions::nested_leaves()))),
                    keys_json(&c.expect["keys"])
                );
                check_tensor(
                    root.get("observation").unwrap(),
                    &c.expect["observation"],
                    &c.name,
                )
                .unwrap();
            }
            "partial_reset" => {
                let mut env = CountingEnv::new(10, &[3]).unwrap();
                let mut td = env.reset(None).unwrap();
                for _ in 0..usize_arg(c, "steps_before") {
                    let stepped = {
                        let a = env.rand_action(Some(td)).unwrap();
                        env.step(a)
                    }
                    .unwrap();
                    td = env.step_mdp(&stepped).unwrap();
                }
                td.set(
                    "_reset",
                    Tensor::from_slice(&[true, false, true]).view([3, 1]),
                )
                .unwrap();
                let out = env.reset(Some(td)).unwrap();
                check_tensor(
                    out.get("observation").unwrap(),
                    &c.expect["observation"],
                    &c.name,
                )
                .unwrap();
                check_tensor(out.get("done").unwrap(), &c.expect["done"], &c.name).unwrap();
                assert!(!out.contains("_reset"), "the mask is consumed by reset");
            }
            "rollout_error" => {
                let mut env = CountingEnv::new(5, &[]).unwrap();
                let cfg = RolloutConfig {
                    set_truncated: true,
                    ..Default::default()
                };
                let err = env.rollout(3, None, &cfg).unwrap_err().to_string();
                assert_facts(c, &err);
            }
            "reset_error" => {
                // max_steps = 0 is refused by the constructor; build an env that starts done.
                let mut env = StartsDone::new(false).unwrap();
                let err = env.reset(None).unwrap_err().to_string();
                assert_facts(c, &err);
                let mut allowed = StartsDone::new(true).unwrap();
                assert!(
                    allowed.reset(None).is_ok(),
                    "allow_done_after_reset lifts the check"
                );
            }
            "check_error" => {
                let variant = c.arg("variant").ok().and_then(|v| v.as_str()).unwrap_or("");
                let mut env = Broken::new(variant).unwrap();
                let err = check_env_specs(&mut env, Some(0)).unwrap_err().to_string();
                assert_facts(c, &err);
            }
            other => panic!("{}: unknown op {other}", c.name),
        }
        replayed += 1;
    }
    assert_eq!(replayed, file.cases.len());
    assert!(replayed >= 11);
}

fn assert_facts(c: &Case, msg: &str) {
    let facts = c.expect["facts"].as_array().unwrap_or(&[]).to_vec();
    assert!(!facts.is_empty(), "{}: no facts recorded", c.name);
    for f in facts {
        let f = f.as_str().unwrap_or_default();
        assert!(msg.contains(f), "{}: error {msg:?} lacks {f:?}", c.name);
    }
}

/// An env whose reset reports done.
struct StartsDone {
    core: EnvCore,
}

impl StartsDone {
    fn new(allow: bool) -> Result<Self> {
        let mut core = EnvCore::new(
            EnvSpecs::new([])?
                .with_observation("observation", Unbounded::new())?
                .with_action("action", Bounded::new(-1.0, 1.0, [1])?)?
                .with_reward("reward", Unbounded::new())?,
        )?;
        core.allow_done_after_reset = allow;
        Ok(StartsDone { core })
    }
}

impl EnvBase for StartsDone {
    fn core(&self) -> &EnvCore {
        &self.core
    }
    fn core_mut(&mut self) -> &mut EnvCore {
        &mut self.core
    }
    fn reset_impl(&mut self, _: Option<&TensorDict>) -> Result<TensorDict> {
        TensorDict::new([])?
            .with("observation", Tensor::from_slice(&[0.0f32]))?
            .with("done", Tensor::from_slice(&[true]))
    }
    fn step_impl(&mut self, _: &TensorDict) -> Result<TensorDict> {
        self.reset_impl(None)
    }
}

/// A counting env that breaks its contract in a chosen way.
struct Broken {
    core: EnvCore,
    variant: String,
    count: f32,
}

impl Broken {
    fn new(variant: &str) -> Result<Self> {
        let mut specs = EnvSpecs::new([])?
            .with_observation("observation", Unbounded::new())?
            .with_action("action", Bounded::new(-1.0, 1.0, [1])?)?
            .with_reward("reward", Unbounded::new())?;
        if variant == "bounded_obs" {
            specs = EnvSpecs::new([])?
                .with_observation("observation", Bounded::new(0.0, 2.0, [1])?)?
                .with_action("action", Bounded::new(-1.0, 1.0, [1])?)?
                .with_reward("reward", Unbounded::new())?;
        }
        Ok(Broken {
            core: EnvCore::new(specs)?,
            variant: variant.into(),
            count: 0.0,
        })
    }
    fn out(&self, reward: bool) -> Result<TensorDict> {
        let mut td = TensorDict::new([])?;
        if self.variant != "omit_obs" {
            let obs = Tensor::from_slice(&[self.count]);
            let obs = if self.variant == "double_obs" {
                obs.to_kind(Kind::Double)
            } else {
                obs
            };
            td.set("observation", obs)?;
        }
        if reward {
            td.set("reward", Tensor::from_slice(&[1.0f32]))?;
            if self.variant == "extra" {
                td.set("extra", Tensor::from_slice(&[0.0f32]))?;
            }
        }
        Ok(td)
    }
}

impl EnvBase for Broken {
    fn core(&self) -> &EnvCore {
        &self.core
    }
    fn core_mut(&mut self) -> &mut EnvCore {
        &mut self.core
    }
    fn reset_impl(&mut self, _: Option<&TensorDict>) -> Result<TensorDict> {
        self.count = 0.0;
        self.out(false)
    }
    fn step_impl(&mut self, _: &TensorDict) -> Result<TensorDict> {
        self.count += 1.0;
        self.out(true)
    }
}

#[test]
fn check_env_specs_names_dtype_and_bounds_failures() {
    let err = check_env_specs(&mut Broken::new("double_obs").unwrap(), Some(0)).unwrap_err();
    assert!(matches!(err, Error::DtypeMismatch { .. }), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("observation") && msg.contains("Float") && msg.contains("Double"),
        "{msg}"
    );
    // Bounded(0, 2) observation reaching 3 fails the containment check on the last step.
    let err = check_env_specs(&mut Broken::new("bounded_obs").unwrap(), Some(0)).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("observation") && msg.contains("Bounded"),
        "{msg}"
    );
    check_env_specs(&mut Broken::new("").unwrap(), Some(0)).unwrap();
}

#[test]
fn step_validates_batch_size_and_reshapes_rewards() {
    let mut env = CountingEnv::new(5, &[2]).unwrap();
    let wrong = TensorDict::new([3]).unwrap();
    let err = env.step(wrong).unwrap_err().to_string();
    assert!(err.contains("[2]") && err.contains("[3]"), "{err}");
    // done, terminated are completed; reward has the spec's shape.
    let td = env.reset(None).unwrap();
    let td = {
        let a = env.rand_action(Some(td)).unwrap();
        env.step(a)
    }
    .unwrap();
    assert_eq!(td.get(("next", "reward")).unwrap().size(), vec![2, 1]);
    assert!(td.contains(("next", "terminated")));
}

#[test]
fn step_and_maybe_reset_resets_only_done_elements() {
    let mut env = CountingEnv::new(2, &[2]).unwrap();
    let mut td = env.reset(None).unwrap();
    // Make element 1 one step ahead: reset only element 0 after one step.
    let stepped = {
        let a = env.rand_action(Some(td)).unwrap();
        env.step(a)
    }
    .unwrap();
    td = env.step_mdp(&stepped).unwrap();
    td.set("_reset", Tensor::from_slice(&[true, false]).view([2, 1]))
        .unwrap();
    td = env.reset(Some(td)).unwrap();
    assert_eq!(
        Vec::<f32>::try_from(td.get("observation").unwrap().view([-1])).unwrap(),
        vec![0.0, 1.0]
    );
    let (stepped, root) = {
        let a = env.rand_action(Some(td)).unwrap();
        env.step_and_maybe_reset(a)
    }
    .unwrap();
    // element 1 reached 2 = max_steps and was reset; element 0 is at 1.
    assert_eq!(
        Vec::<f32>::try_from(stepped.get(("next", "observation")).unwrap().view([-1])).unwrap(),
        vec![1.0, 2.0]
    );
    assert_eq!(
        Vec::<f32>::try_from(root.get("observation").unwrap().view([-1])).unwrap(),
        vec![1.0, 0.0]
    );
    assert!(!root.contains("_reset"));
}

#[test]
fn rollout_options() {
    let mut env = CountingEnv::new(3, &[]).unwrap();
    // Both break flags set: error.
    let cfg = RolloutConfig {
        break_when_any_done: Some(true),
        break_when_all_done: Some(true),
        ..Default::default()
    };
    assert!(env.rollout(5, None, &cfg).is_err());
    // auto_reset = false without a start tensordict: error; with one: starts from it.
    let cfg = RolloutConfig {
        auto_reset: Some(false),
        ..Default::default()
    };
    assert!(env.rollout(5, None, &cfg).is_err());
    let start = env.reset(None).unwrap();
    let cfg = RolloutConfig {
        auto_reset: Some(false),
        tensordict: Some(start),
        break_when_any_done: Some(false),
        ..Default::default()
    };
    let traj = env.rollout(4, None, &cfg).unwrap();
    assert_eq!(traj.batch_size(), &[4]);
    // A policy closure sees every step's tensordict.
    let mut calls = 0;
    let mut policy = |mut td: TensorDict| -> Result<TensorDict> {
        calls += 1;
        td.set("action", Tensor::zeros([1], (Kind::Float, Device::Cpu)))?;
        Ok(td)
    };
    let traj = env
        .rollout(10, Some(&mut policy), &RolloutConfig::default())
        .unwrap();
    assert_eq!(traj.batch_size(), &[3]);
    assert_eq!(calls, 3);
    // break_when_all_done on a batch where elements finish at different times: counts start
    // at [1, 0] with max_steps 3, so element 0 is done after 2 steps and element 1 after 3.
    let staggered = || -> (CountingEnv, TensorDict) {
        let mut env = CountingEnv::new(3, &[2]).unwrap();
        let td = env.reset(None).unwrap();
        let a = env.rand_action(Some(td)).unwrap();
        let stepped = env.step(a).unwrap();
        let mut td = env.step_mdp(&stepped).unwrap();
        td.set("_reset", Tensor::from_slice(&[false, true]).view([2, 1]))
            .unwrap();
        let td = env.reset(Some(td)).unwrap();
        (env, td)
    };
    for (all, expected_len) in [(true, 3), (false, 2)] {
        let (mut env, td) = staggered();
        assert_eq!(
            Vec::<f32>::try_from(td.get("observation").unwrap().view([-1])).unwrap(),
            vec![1.0, 0.0]
        );
        let cfg = RolloutConfig {
            break_when_all_done: Some(all),
            break_when_any_done: Some(!all),
            auto_reset: Some(false),
            tensordict: Some(td),
            ..Default::default()
        };
        let traj = env.rollout(10, None, &cfg).unwrap();
        assert_eq!(
            traj.batch_size(),
            &[2, expected_len],
            "break_when_all_done={all}"
        );
    }
}

#[test]
fn same_seed_same_rollout_serial_and_parallel_agree() {
    let make = || {
        (0..3)
            .map(|_| CountingEnv::new(4, &[2]))
            .collect::<Result<Vec<_>>>()
            .unwrap()
    };
    let mut serial = SerialEnv::new(make()).unwrap();
    let mut parallel = ParallelEnv::new(make()).unwrap();
    assert_eq!(serial.batch_size(), vec![3, 2]);
    serial.set_seed(11).unwrap();
    parallel.set_seed(11).unwrap();
    let a = serial.rollout(9, None, &RolloutConfig::no_break()).unwrap();
    let b = parallel
        .rollout(9, None, &RolloutConfig::no_break())
        .unwrap();
    assert_eq!(a.batch_size(), &[3, 2, 9]);
    assert!(a
        .get("observation")
        .unwrap()
        .equal(b.get("observation").unwrap()));
    serial.set_seed(11).unwrap();
    let c = serial.rollout(9, None, &RolloutConfig::no_break()).unwrap();
    assert!(
        a.eq(&c).unwrap().all().unwrap(),
        "same seed gives the same rollout (actions included)"
    );
    check_env_specs(&mut serial, Some(0)).unwrap();
    check_env_specs(&mut parallel, Some(0)).unwrap();
}

/// Fails on the `fail_at`-th step, by error or by panic.
struct Faulty {
    inner: CountingEnv,
    steps: usize,
    fail_at: usize,
    panic: bool,
}

impl EnvBase for Faulty {
    fn core(&self) -> &EnvCore {
        self.inner.core()
    }
    fn core_mut(&mut self) -> &mut EnvCore {
        self.inner.core_mut()
    }
    fn reset_impl(&mut self, td: Option<&TensorDict>) -> Result<TensorDict> {
        self.inner.reset_impl(td)
    }
    fn step_impl(&mut self, td: &TensorDict) -> Result<TensorDict> {
        self.steps += 1;
        if self.steps == self.fail_at {
            if self.panic {
                panic!("simulated crash in the env");
            }
            return Err(Error::InvalidArgument {
                op: "step",
                message: "simulated failure".into(),
            });
        }
        self.inner.step_impl(td)
    }
}

#[test]
fn parallel_worker_faults_surface_with_index() {
    for panic in [false, true] {
        let envs: Vec<Faulty> = (0..3)
            .map(|i| Faulty {
                inner: CountingEnv::new(100, &[]).unwrap(),
                steps: 0,
                fail_at: if i == 1 { 2 } else { usize::MAX },
                panic,
            })
            .collect();
        let mut env = ParallelEnv::new(envs).unwrap();
        let err = env
            .rollout(5, None, &RolloutConfig::no_break())
            .unwrap_err();
        match &err {
            Error::Worker { index, message, .. } => {
                assert_eq!(*index, 1);
                assert!(
                    message.contains(if panic {
                        "simulated crash"
                    } else {
                        "simulated failure"
                    }),
                    "{message}"
                );
            }
            other => panic!("expected a worker error, got {other}"),
        }
        if panic {
            // The worker is gone: the next call errors too, promptly.
            let err = env.reset(None).unwrap_err();
            assert!(matches!(err, Error::Worker { index: 1, .. }), "{err}");
        }
    }
}
