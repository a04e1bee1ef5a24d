//! Tests of the built-in environments (`PendulumEnv`, `CartPoleEnv`,
//! `MountainCarContinuousEnv`, and `CountingEnv` for the generic checks).
//!
//! - Replays of gymnasium trajectories recorded by `specs/record_gym.py` into
//!   `specs/gym_cases.json`: each case resets our env to gymnasium's initial state, steps with
//!   the recorded actions (up to gymnasium's termination) and compares observations and
//!   rewards within 1e-5 (absolute) and the terminated flags exactly. Replayed one case at a
//!   time (batch `[]`) and all cases of an env at once (batch `[n_cases]`).
//! - `check_env_specs` at several batch sizes; seeding (same seed ⇒ bit-identical rollouts,
//!   different seeds ⇒ different starts); gymnasium's initial distributions; partial resets;
//!   a batch of 8 against 8 single envs; action / state validation errors; devices.

use std::collections::BTreeMap;

use serde_json::Value;
use tch::{Device, Kind, Tensor};
use torchrl::envs::builtin::{
    ActionEncoding, CartPoleEnv, CountingEnv, MountainCarContinuousEnv, PendulumEnv,
};
use torchrl::envs::transforms::RewardScaling;
use torchrl::envs::{check_env_specs, EnvBase, RolloutConfig, TransformedEnv};
use torchrl::tensordict::KeysOptions;
use torchrl::{Error, Generator, TensorDict};

const CPU: Device = Device::Cpu;
const TOL: f64 = 1e-5;

// ------------------------------------------------------------------ helpers

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Which {
    Pendulum,
    CartPole,
    CartPoleCategorical,
    MountainCar,
}

const ALL: [Which; 4] = [
    Which::Pendulum,
    Which::CartPole,
    Which::CartPoleCategorical,
    Which::MountainCar,
];

impl Which {
    fn make(self, batch: &[i64], device: Device) -> Box<dyn EnvBase> {
        match self {
            Which::Pendulum => Box::new(PendulumEnv::new(batch, device).expect("PendulumEnv")),
            Which::CartPole => Box::new(CartPoleEnv::new(batch, device).expect("CartPoleEnv")),
            Which::CartPoleCategorical => Box::new(
                CartPoleEnv::with_encoding(batch, device, ActionEncoding::Categorical)
                    .expect("CartPoleEnv"),
            ),
            Which::MountainCar => Box::new(
                MountainCarContinuousEnv::new(batch, device).expect("MountainCarContinuousEnv"),
            ),
        }
    }

    fn gym_id(self) -> &'static str {
        match self {
            Which::Pendulum => "Pendulum-v1",
            Which::CartPole | Which::CartPoleCategorical => "CartPole-v1",
            Which::MountainCar => "MountainCarContinuous-v0",
        }
    }

    fn state_dim(self) -> i64 {
        match self {
            Which::Pendulum | Which::MountainCar => 2,
            Which::CartPole | Which::CartPoleCategorical => 4,
        }
    }

    /// Gymnasium's initial distribution: per state variable, `[low, high]`.
    fn initial_ranges(self) -> Vec<(f64, f64)> {
        match self {
            Which::Pendulum => vec![(-std::f64::consts::PI, std::f64::consts::PI), (-1.0, 1.0)],
            Which::CartPole | Which::CartPoleCategorical => vec![(-0.05, 0.05); 4],
            Which::MountainCar => vec![(-0.6, -0.4), (0.0, 0.0)],
        }
    }

    /// The action tensor for one element: `[1]` float32, `[2]` int64 one-hot or `[]` int64.
    fn action(self, a: &Value) -> Tensor {
        match self {
            Which::Pendulum | Which::MountainCar => {
                let v = a
                    .as_array()
                    .and_then(|l| l.first())
                    .and_then(Value::as_f64)
                    .expect("continuous action");
                Tensor::from_slice(&[v as f32])
            }
            Which::CartPole => {
                let k = a.as_i64().expect("discrete action");
                Tensor::from_slice(&[1 - k, k])
            }
            Which::CartPoleCategorical => Tensor::from(a.as_i64().expect("discrete action")),
        }
    }
}

fn f64s(t: &Tensor) -> Vec<f64> {
    Vec::<f64>::try_from(&t.to_kind(Kind::Double).to_device(CPU).reshape([-1])).expect("values")
}

fn bools(t: &Tensor) -> Vec<bool> {
    Vec::<bool>::try_from(&t.to_kind(Kind::Bool).to_device(CPU).reshape([-1])).expect("values")
}

fn json_f64s(v: &Value) -> Vec<f64> {
    v.as_array()
        .expect("a list")
        .iter()
        .map(|x| x.as_f64().expect("a number"))
        .collect()
}

fn load_cases() -> Vec<Value> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/specs/gym_cases.json");
    let text = std::fs::read_to_string(path).expect("read specs/gym_cases.json");
    let root: Value = serde_json::from_str(&text).expect("parse specs/gym_cases.json");
    root["cases"].as_array().expect("cases").clone()
}

fn cases_for(which: Which) -> Vec<Value> {
    load_cases()
        .into_iter()
        .filter(|c| c["env"].as_str() == Some(which.gym_id()))
        .collect()
}

/// Largest absolute difference, with a NaN or length mismatch counting as infinite.
fn max_abs_diff(a: &[f64], b: &[f64]) -> f64 {
    if a.len() != b.len() {
        return f64::INFINITY;
    }
    a.iter()
        .zip(b)
        .map(|(x, y)| {
            let d = (x - y).abs();
            if d.is_nan() {
                f64::INFINITY
            } else {
                d
            }
        })
        .fold(0.0, f64::max)
}

fn state_td(batch: &[i64], state: Tensor) -> TensorDict {
    TensorDict::new(batch)
        .expect("td")
        .with("state", state)
        .expect("state")
}

// ------------------------------------------------------------------ gymnasium replays

/// Replays every recorded case of `which` one at a time on a batch-`[]` env; returns the
/// failures and the largest observed deviation.
fn replay_single(which: Which, device: Device) -> (Vec<String>, f64, usize) {
    let mut failures = Vec::new();
    let mut worst: f64 = 0.0;
    let cases = cases_for(which);
    for case in &cases {
        let name = case["name"].as_str().unwrap_or("?").to_string();
        let mut env = which.make(&[], device);
        let s0 = Tensor::from_slice(&json_f64s(&case["initial_state"]));
        let mut td = env
            .reset(Some(state_td(&[], s0)))
            .expect("reset from state");
        let obs0 = f64s(td.get("observation").expect("observation"));
        let d = max_abs_diff(&obs0, &json_f64s(&case["initial_observation"]));
        worst = worst.max(d);
        if d > TOL {
            failures.push(format!("{name}: initial observation off by {d:e}"));
        }
        let actions = case["actions"].as_array().expect("actions");
        let observations = case["observations"].as_array().expect("observations");
        let rewards = json_f64s(&case["rewards"]);
        let terminated = case["terminated"].as_array().expect("terminated");
        for (t, a) in actions.iter().enumerate() {
            let stepped = env
                .step(
                    td.with("action", which.action(a).to_device(device))
                        .expect("set"),
                )
                .expect("step");
            let obs = f64s(stepped.get(("next", "observation")).expect("next obs"));
            let rew = f64s(stepped.get(("next", "reward")).expect("next reward"));
            let term = bools(
                stepped
                    .get(("next", "terminated"))
                    .expect("next terminated"),
            );
            let done = bools(stepped.get(("next", "done")).expect("next done"));
            let d_obs = max_abs_diff(&obs, &json_f64s(&observations[t]));
            let d_rew = max_abs_diff(&rew, &[rewards[t]]);
            worst = worst.max(d_obs).max(d_rew);
            if d_obs > TOL {
                failures.push(format!(
                    "{name} step {t}: observation {obs:?} vs gymnasium {:?} (off by {d_obs:e})",
                    json_f64s(&observations[t])
                ));
            }
            if d_rew > TOL {
                failures.push(format!(
                    "{name} step {t}: reward {rew:?} vs gymnasium {} (off by {d_rew:e})",
                    rewards[t]
                ));
            }
            let want = terminated[t].as_bool().expect("bool");
            if term != vec![want] || done != vec![want] {
                failures.push(format!(
                    "{name} step {t}: terminated {term:?} / done {done:?} vs gymnasium {want}"
                ));
            }
            td = env.step_mdp(&stepped).expect("step_mdp");
        }
    }
    (failures, worst, cases.len())
}

/// Replays all recorded cases of `which` at once on a batch-`[n]` env (cases that terminated
/// early keep stepping with their last action; only recorded steps are compared).
fn replay_batched(which: Which) -> Vec<String> {
    let cases = cases_for(which);
    let n = cases.len() as i64;
    let mut failures = Vec::new();
    let mut env = which.make(&[n], CPU);
    let states: Vec<Tensor> = cases
        .iter()
        .map(|c| Tensor::from_slice(&json_f64s(&c["initial_state"])))
        .collect();
    let mut td = env
        .reset(Some(state_td(&[n], Tensor::stack(&states, 0))))
        .expect("reset from states");
    let horizon = cases
        .iter()
        .map(|c| c["actions"].as_array().map_or(0, Vec::len))
        .max()
        .unwrap_or(0);
    for t in 0..horizon {
        let actions: Vec<Tensor> = cases
            .iter()
            .map(|c| {
                let acts = c["actions"].as_array().expect("actions");
                which.action(&acts[t.min(acts.len() - 1)])
            })
            .collect();
        let stepped = env
            .step(td.with("action", Tensor::stack(&actions, 0)).expect("set"))
            .expect("step");
        let obs = stepped.get(("next", "observation")).expect("obs");
        let rew = stepped.get(("next", "reward")).expect("reward");
        let term = stepped.get(("next", "terminated")).expect("terminated");
        for (i, c) in cases.iter().enumerate() {
            let len = c["actions"].as_array().map_or(0, Vec::len);
            if t >= len {
                continue;
            }
            let name = c["name"].as_str().unwrap_or("?");
            let i = i as i64;
            let d_obs = max_abs_diff(&f64s(&obs.get(i)), &json_f64s(&c["observations"][t]));
            let d_rew = max_abs_diff(&f64s(&rew.get(i)), &[json_f64s(&c["rewards"])[t]]);
            let want = c["terminated"][t].as_bool().expect("bool");
            if d_obs > TOL || d_rew > TOL || bools(&term.get(i)) != vec![want] {
                failures.push(format!(
                    "batched {name} step {t}: obs off by {d_obs:e}, reward off by {d_rew:e}, \
                     terminated {:?} vs {want}",
                    bools(&term.get(i))
                ));
            }
        }
        td = env.step_mdp(&stepped).expect("step_mdp");
    }
    failures
}

fn assert_replay(which: Which) {
    let (failures, worst, n) = replay_single(which, CPU);
    assert!(
        n >= 3,
        "{which:?}: expected at least 3 recorded cases, found {n}"
    );
    eprintln!("{which:?}: {n} gymnasium cases, largest deviation {worst:e}");
    let batched = replay_batched(which);
    assert!(
        failures.is_empty() && batched.is_empty(),
        "{} failures:\n{}",
        failures.len() + batched.len(),
        failures
            .iter()
            .chain(&batched)
            .take(20)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
fn pendulum_matches_gymnasium() {
    assert_replay(Which::Pendulum);
}

#[test]
fn cartpole_matches_gymnasium() {
    assert_replay(Which::CartPole);
}

#[test]
fn cartpole_categorical_matches_gymnasium() {
    assert_replay(Which::CartPoleCategorical);
}

#[test]
fn mountain_car_matches_gymnasium() {
    assert_replay(Which::MountainCar);
}

#[test]
fn recorded_cases_cover_the_interesting_branches() {
    let cases = load_cases();
    let mut per_env: BTreeMap<String, usize> = BTreeMap::new();
    for c in &cases {
        *per_env
            .entry(c["env"].as_str().unwrap_or("?").to_string())
            .or_default() += 1;
    }
    assert_eq!(per_env.len(), 3, "{per_env:?}");
    let terminated = |env: &str| {
        cases.iter().any(|c| {
            c["env"].as_str() == Some(env)
                && c["terminated"]
                    .as_array()
                    .is_some_and(|t| t.iter().any(|x| x.as_bool() == Some(true)))
        })
    };
    assert!(terminated("CartPole-v1"), "a CartPole case must terminate");
    assert!(
        terminated("MountainCarContinuous-v0"),
        "a MountainCar case must reach the goal"
    );
    assert!(!terminated("Pendulum-v1"), "Pendulum never terminates");
    let goal_reward = cases.iter().any(|c| {
        c["env"].as_str() == Some("MountainCarContinuous-v0")
            && json_f64s(&c["rewards"]).iter().any(|r| *r > 90.0)
    });
    assert!(goal_reward, "the goal gives +100");
}

// ------------------------------------------------------------------ specs

#[test]
fn check_env_specs_passes_for_every_env_and_batch_size() {
    for which in ALL {
        for batch in [&[][..], &[8], &[2, 3]] {
            let mut env = which.make(batch, CPU);
            check_env_specs(env.as_mut(), Some(0))
                .unwrap_or_else(|e| panic!("{which:?} batch {batch:?}: {e}"));
            check_env_specs(env.as_mut(), None)
                .unwrap_or_else(|e| panic!("{which:?} batch {batch:?} unseeded: {e}"));
        }
    }
    for batch in [&[][..], &[8]] {
        let mut env = CountingEnv::new(3, batch).expect("CountingEnv");
        check_env_specs(&mut env, Some(0))
            .unwrap_or_else(|e| panic!("CountingEnv batch {batch:?}: {e}"));
    }
}

#[test]
fn specs_have_torchrl_keys_shapes_and_dtypes() {
    for which in ALL {
        let env = which.make(&[5], CPU);
        let s = env.specs();
        let key = |k: &torchrl::NestedKey| k.to_string();
        assert_eq!(
            s.observation_keys().iter().map(key).collect::<Vec<_>>(),
            vec!["\"observation\""]
        );
        assert_eq!(
            s.action_keys().iter().map(key).collect::<Vec<_>>(),
            vec!["\"action\""]
        );
        assert_eq!(
            s.reward_keys().iter().map(key).collect::<Vec<_>>(),
            vec!["\"reward\""]
        );
        assert_eq!(
            s.done_keys().iter().map(key).collect::<Vec<_>>(),
            vec!["\"done\"", "\"terminated\""]
        );
        assert_eq!(
            s.state_keys().iter().map(key).collect::<Vec<_>>(),
            vec!["\"state\""]
        );
        let obs_dim = match which {
            Which::Pendulum => 3,
            Which::MountainCar => 2,
            _ => 4,
        };
        let obs = s.observation.get("observation").expect("obs spec");
        assert_eq!(obs.shape(), &[5, obs_dim]);
        assert_eq!(obs.dtype(), Some(Kind::Float));
        let reward = s.reward.get("reward").expect("reward spec");
        assert_eq!(
            (reward.shape(), reward.dtype()),
            (&[5, 1][..], Some(Kind::Float))
        );
        let state = s.state.get("state").expect("state spec");
        assert_eq!(state.shape(), &[5, which.state_dim()]);
        assert_eq!(state.dtype(), Some(Kind::Double));
        let action = s.action.get("action").expect("action spec");
        let (shape, dtype): (&[i64], Kind) = match which {
            Which::Pendulum | Which::MountainCar => (&[5, 1], Kind::Float),
            Which::CartPole => (&[5, 2], Kind::Int64),
            Which::CartPoleCategorical => (&[5], Kind::Int64),
        };
        assert_eq!(
            (action.shape(), action.dtype()),
            (shape, Some(dtype)),
            "{which:?}"
        );
    }
    // Gymnasium's action bounds.
    let env = PendulumEnv::new(&[], CPU).expect("env");
    let a = env
        .specs()
        .action
        .get("action")
        .expect("action")
        .to_string();
    assert!(a.contains("low=-2") && a.contains("high=2"), "{a}");
    let env = MountainCarContinuousEnv::new(&[], CPU).expect("env");
    let a = env
        .specs()
        .action
        .get("action")
        .expect("action")
        .to_string();
    assert!(a.contains("low=-1") && a.contains("high=1"), "{a}");
}

#[test]
fn pendulum_never_terminates() {
    let mut env = PendulumEnv::new(&[3], CPU).expect("env");
    env.set_seed(3).expect("seed");
    let traj = env
        .rollout(200, None, &RolloutConfig::default())
        .expect("rollout");
    assert_eq!(traj.batch_size(), &[3, 200]);
    assert!(!bools(traj.get(("next", "done")).expect("done"))
        .iter()
        .any(|d| *d));
}

// ------------------------------------------------------------------ seeding

fn seeded_rollout(which: Which, seed: u64, cfg: &RolloutConfig) -> TensorDict {
    let mut env = which.make(&[4], CPU);
    env.set_seed(seed).expect("seed");
    env.rollout(40, None, cfg).expect("rollout")
}

#[test]
fn same_seed_gives_bit_identical_rollouts() {
    for which in ALL {
        for cfg in [RolloutConfig::no_break(), RolloutConfig::default()] {
            let a = seeded_rollout(which, 11, &cfg);
            let b = seeded_rollout(which, 11, &cfg);
            assert_eq!(a.batch_size(), b.batch_size(), "{which:?}");
            assert!(
                a.eq(&b).expect("eq").all().expect("all"),
                "{which:?}: same seed, different rollouts"
            );
            let c = seeded_rollout(which, 12, &cfg);
            let differs =
                a.batch_size() != c.batch_size() || !a.eq(&c).expect("eq").all().expect("all");
            assert!(differs, "{which:?}: different seeds, same rollouts");
        }
    }
}

#[test]
fn set_seed_then_reset_is_reproducible_and_seeds_differ() {
    for which in ALL {
        let mut env = which.make(&[6], CPU);
        env.set_seed(1).expect("seed");
        let s1 = env
            .reset(None)
            .expect("reset")
            .get("state")
            .expect("state")
            .copy();
        env.set_seed(1).expect("seed");
        let s1b = env
            .reset(None)
            .expect("reset")
            .get("state")
            .expect("state")
            .copy();
        env.set_seed(2).expect("seed");
        let s2 = env
            .reset(None)
            .expect("reset")
            .get("state")
            .expect("state")
            .copy();
        assert!(
            s1.equal(&s1b),
            "{which:?}: same seed, different initial states"
        );
        assert!(
            !s1.equal(&s2),
            "{which:?}: seeds 1 and 2 gave the same initial states"
        );
        // Consecutive resets draw new states.
        let s3 = env
            .reset(None)
            .expect("reset")
            .get("state")
            .expect("state")
            .copy();
        assert!(!s2.equal(&s3), "{which:?}: two resets gave the same states");
    }
}

#[test]
fn initial_states_follow_gymnasium_distribution() {
    for which in ALL {
        let mut env = which.make(&[2000], CPU);
        env.set_seed(5).expect("seed");
        let td = env.reset(None).expect("reset");
        let state = td.get("state").expect("state");
        assert_eq!(state.kind(), Kind::Double);
        for (j, (lo, hi)) in which.initial_ranges().into_iter().enumerate() {
            let col = f64s(&state.select(1, j as i64));
            let min = col.iter().cloned().fold(f64::INFINITY, f64::min);
            let max = col.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            assert!(
                min >= lo && max <= hi,
                "{which:?} var {j}: [{min}, {max}] not in [{lo}, {hi}]"
            );
            // Spread over the range (2000 uniform draws come within 1% of both ends).
            let slack = 0.01 * (hi - lo);
            assert!(
                min <= lo + slack && max >= hi - slack,
                "{which:?} var {j}: [{min}, {max}] does not cover [{lo}, {hi}]"
            );
            let mean = col.iter().sum::<f64>() / col.len() as f64;
            assert!(
                (mean - (lo + hi) / 2.0).abs() <= 0.05 * (hi - lo).max(1e-9),
                "{which:?} var {j}: mean {mean}"
            );
        }
        // The observation is derived from the state.
        let obs = td.get("observation").expect("observation");
        assert_eq!(obs.kind(), Kind::Float);
        if which != Which::Pendulum {
            assert!(obs.equal(&state.to_kind(Kind::Float)));
        } else {
            let th = state.select(1, 0);
            let expect = Tensor::stack(&[th.cos(), th.sin(), state.select(1, 1)], 1);
            assert!(obs.equal(&expect.to_kind(Kind::Float)));
        }
    }
}

// ------------------------------------------------------------------ resets

/// A valid, non-terminal state for every env (row `i` is `0.01 * (i + 1)` everywhere).
fn small_state(which: Which, batch: i64) -> Tensor {
    let n = which.state_dim();
    (Tensor::arange(batch, (Kind::Double, CPU)) + 1.0)
        .f_mul_scalar(0.01)
        .expect("mul")
        .unsqueeze(-1)
        .expand([batch, n], false)
        .contiguous()
}

#[test]
fn partial_reset_keeps_the_other_elements() {
    for which in ALL {
        for mask_shape in [&[4][..], &[4, 1]] {
            // `given`: the masked elements start from a state given with the mask; otherwise
            // (no "state" in the tensordict) they are re-sampled.
            for given in [false, true] {
                let what = format!("{which:?} mask {mask_shape:?} given {given}");
                let mut env = which.make(&[4], CPU);
                env.set_seed(21).expect("seed");
                let mut td = env.reset(None).expect("reset");
                for _ in 0..3 {
                    let with_action = env.rand_action(Some(td)).expect("rand");
                    let stepped = env.step(with_action).expect("step");
                    td = env.step_mdp(&stepped).expect("step_mdp");
                }
                let before_state = td.get("state").expect("state").copy();
                let before_obs = td.get("observation").expect("obs").copy();
                let target = small_state(which, 4);
                let mask = Tensor::from_slice(&[true, false, true, false]).reshape(mask_shape);
                let rows = Tensor::from_slice(&[true, false, true, false]).unsqueeze(-1);
                let request = if given {
                    // the current state, with the rows to reset replaced
                    td.with("state", target.where_self(&rows, &before_state))
                        .expect("state")
                } else {
                    td.exclude(&["state"])
                };
                let td = env
                    .reset(Some(request.with("_reset", mask).expect("mask")))
                    .expect("partial reset");
                assert!(!td.contains("_reset"), "{what}: the mask is consumed");
                let state = td.get("state").expect("state");
                let obs = td.get("observation").expect("obs");
                for i in [1i64, 3] {
                    assert!(
                        state.get(i).equal(&before_state.get(i)),
                        "{what}: element {i} changed"
                    );
                    assert!(
                        obs.get(i).equal(&before_obs.get(i)),
                        "{what}: obs {i} changed"
                    );
                }
                for i in [0i64, 2] {
                    if given {
                        assert!(
                            state.get(i).equal(&target.get(i)),
                            "{what}: element {i} is not the given state"
                        );
                        continue;
                    }
                    assert!(
                        !state.get(i).equal(&before_state.get(i)),
                        "{what}: element {i} was not reset"
                    );
                    let s = f64s(&state.get(i));
                    for (v, (lo, hi)) in s.iter().zip(which.initial_ranges()) {
                        assert!(*v >= lo && *v <= hi, "{what}: reset element {i} = {s:?}");
                    }
                }
                // The env's own state is what the tensordict says (the next step continues
                // from it).
                let with_action = env.rand_action(Some(td.clone())).expect("rand");
                let next = env.step(with_action).expect("step");
                let mut fresh = which.make(&[4], CPU);
                let replay = fresh
                    .reset(Some(state_td(&[4], state.copy())))
                    .expect("reset from state")
                    .with("action", next.get("action").expect("action").copy())
                    .expect("action");
                let replay = fresh.step(replay).expect("step");
                assert!(
                    next.get(("next", "state"))
                        .expect("state")
                        .equal(replay.get(("next", "state")).expect("state")),
                    "{what}: the env's state after the partial reset differs from the returned one"
                );
            }
        }
    }
}

#[test]
fn reset_to_a_given_state() {
    for which in ALL {
        let n = which.state_dim();
        let mut env = which.make(&[3], CPU);
        let given = Tensor::arange(3 * n, (Kind::Double, CPU))
            .reshape([3, n])
            .f_mul_scalar(0.01)
            .expect("mul");
        let td = env
            .reset(Some(state_td(&[3], given.copy())))
            .expect("reset");
        assert!(td.get("state").expect("state").equal(&given));
        // Any float dtype is accepted (cast to float64).
        let td = env
            .reset(Some(state_td(&[3], given.to_kind(Kind::Float))))
            .expect("float32 state");
        assert!(td
            .get("state")
            .expect("state")
            .equal(&given.to_kind(Kind::Float).to_kind(Kind::Double)));
        // Wrong shape or dtype: a clear error.
        let err = env
            .reset(Some(state_td(
                &[3],
                Tensor::zeros([3, n + 1], (Kind::Double, CPU)),
            )))
            .expect_err("wrong state shape");
        assert!(
            matches!(err, Error::ShapeMismatch { ref key, .. } if key.contains("state")),
            "{err}"
        );
        let err = env
            .reset(Some(state_td(
                &[3],
                Tensor::zeros([3, n], (Kind::Int64, CPU)),
            )))
            .expect_err("integer state");
        assert!(matches!(err, Error::DtypeMismatch { .. }), "{err}");
        // With a "_reset" mask, the masked elements start from the given state (its other rows
        // are not read) and nothing is sampled; the others keep their state.
        let target = small_state(which, 3);
        let rows = Tensor::from_slice(&[true, false, true]);
        let garbage = target.where_self(&rows.unsqueeze(-1), &target.full_like(1e9));
        let expected = target.where_self(&rows.unsqueeze(-1), &given);
        let mut a = which.make(&[3], CPU);
        a.reset(Some(state_td(&[3], given.copy()))).expect("reset");
        a.set_seed(5).expect("seed");
        let masked = state_td(&[3], garbage)
            .with("_reset", rows.copy())
            .expect("mask");
        let ta = a.reset(Some(masked)).expect("partial reset");
        for i in [0i64, 2] {
            assert!(
                ta.get("state").expect("state").get(i).equal(&target.get(i)),
                "{which:?}: element {i} is not the given state"
            );
        }
        // the env's own state is `expected`: stepping it equals stepping an env reset to it
        let mut b = which.make(&[3], CPU);
        let tb = b.reset(Some(state_td(&[3], expected))).expect("reset");
        let act = b
            .rand_action(None)
            .expect("rand")
            .get("action")
            .expect("action")
            .copy();
        let sa = a
            .step(ta.with("action", act.copy()).expect("action"))
            .expect("step");
        let sb = b
            .step(tb.with("action", act).expect("action"))
            .expect("step");
        assert!(
            sa.get(("next", "state"))
                .expect("state")
                .equal(sb.get(("next", "state")).expect("state")),
            "{which:?}: the env's state after a masked reset to a given state"
        );
        // no sample was drawn: the next full reset is the seed's first draw
        let drawn = a.reset(None).expect("reset");
        let mut seeded = which.make(&[3], CPU);
        seeded.set_seed(5).expect("seed");
        let first = seeded.reset(None).expect("reset");
        assert!(
            drawn
                .get("state")
                .expect("state")
                .equal(first.get("state").expect("state")),
            "{which:?}: a masked reset to a given state drew samples"
        );
    }
}

#[test]
fn rollout_auto_resets_terminated_elements_with_fresh_states() {
    // CartPole terminates within a few dozen random steps; with break_when_any_done=false the
    // done elements are reset (partial reset), to fresh samples.
    let mut env = CartPoleEnv::new(&[3], CPU).expect("env");
    env.set_seed(4).expect("seed");
    let traj = env
        .rollout(300, None, &RolloutConfig::no_break())
        .expect("rollout");
    let done = traj.get(("next", "done")).expect("done");
    let obs = traj.get("observation").expect("obs");
    let mut resets = 0;
    for i in 0..3i64 {
        let d = bools(&done.get(i));
        for (t, _) in d.iter().enumerate().take(299).filter(|(_, d)| **d) {
            resets += 1;
            let o = f64s(&obs.get(i).get(t as i64 + 1));
            assert!(
                o.iter().all(|v| v.abs() <= 0.05),
                "element {i} after done at {t}: {o:?}"
            );
        }
    }
    assert!(resets >= 3, "expected several terminations, got {resets}");
}

// ------------------------------------------------------------------ batching

#[test]
fn batch_of_eight_equals_eight_single_envs() {
    for which in ALL {
        let mut batched = which.make(&[8], CPU);
        batched.set_seed(9).expect("seed");
        let mut td = batched.reset(None).expect("reset");
        let start = td.get("state").expect("state").copy();
        let mut singles: Vec<Box<dyn EnvBase>> = (0..8).map(|_| which.make(&[], CPU)).collect();
        let mut single_tds: Vec<TensorDict> = singles
            .iter_mut()
            .enumerate()
            .map(|(i, e)| {
                e.reset(Some(state_td(&[], start.get(i as i64))))
                    .expect("reset")
            })
            .collect();
        let mut gen = Generator::new(77);
        for t in 0..30 {
            let actions = batched.specs().action.rand(&mut gen, &[]).expect("rand");
            let action = actions.get("action").expect("action").copy();
            let stepped = batched
                .step(td.with("action", action.copy()).expect("set"))
                .expect("step");
            for (i, (env, std)) in singles.iter_mut().zip(single_tds.iter_mut()).enumerate() {
                let i = i as i64;
                let s = env
                    .step(std.clone().with("action", action.get(i)).expect("set"))
                    .expect("step");
                for key in ["observation", "reward", "done", "terminated", "state"] {
                    let a = stepped.get(("next", key)).expect("batched").get(i);
                    let b = s.get(("next", key)).expect("single");
                    assert!(
                        a.equal(b),
                        "{which:?} step {t} element {i} key {key}: {a:?} vs {b:?}"
                    );
                }
                *std = env.step_mdp(&s).expect("step_mdp");
            }
            td = batched.step_mdp(&stepped).expect("step_mdp");
        }
    }
}

// ------------------------------------------------------------------ validation

#[test]
fn wrong_actions_are_clear_errors() {
    for which in ALL {
        let mut env = which.make(&[4], CPU);
        env.set_seed(0).expect("seed");
        let td = env.reset(None).expect("reset");
        let state = td.get("state").expect("state").copy();
        let (bad_dtype, bad_shape): (Tensor, Tensor) = match which {
            Which::Pendulum | Which::MountainCar => (
                Tensor::zeros([4, 1], (Kind::Int64, CPU)),
                Tensor::zeros([4], (Kind::Float, CPU)),
            ),
            Which::CartPole => (
                Tensor::zeros([4, 2], (Kind::Float, CPU)),
                Tensor::zeros([4], (Kind::Int64, CPU)),
            ),
            Which::CartPoleCategorical => (
                Tensor::zeros([4], (Kind::Float, CPU)),
                Tensor::zeros([4, 1], (Kind::Int64, CPU)),
            ),
        };
        let err = env
            .step(td.clone().with("action", bad_dtype).expect("set"))
            .expect_err("wrong dtype");
        assert!(
            matches!(err, Error::DtypeMismatch { ref key, .. } if key.contains("action")),
            "{which:?}: {err}"
        );
        let err = env
            .step(td.clone().with("action", bad_shape).expect("set"))
            .expect_err("wrong shape");
        assert!(
            matches!(err, Error::ShapeMismatch { ref key, .. } if key.contains("action")),
            "{which:?}: {err}"
        );
        let err = env.step(td.clone()).expect_err("no action");
        assert!(matches!(err, Error::KeyNotFound { .. }), "{which:?}: {err}");
        env.set_seed(0).expect("seed");
        let td = env.reset(None).expect("reset");
        // Failed steps leave the env untouched.
        assert!(td.get("state").expect("state").equal(&state));
        let with_action = env.rand_action(Some(td)).expect("rand");
        let stepped = env.step(with_action);
        assert!(stepped.is_ok(), "{which:?}");
    }
}

#[test]
fn bool_and_int32_discrete_actions_are_accepted() {
    let mut env = CartPoleEnv::new(&[2], CPU).expect("env");
    let start = Tensor::zeros([2, 4], (Kind::Double, CPU));
    let td = env
        .reset(Some(state_td(&[2], start.copy())))
        .expect("reset");
    let one_hot = Tensor::from_slice(&[false, true, true, false]).reshape([2, 2]);
    let a = env
        .step(td.with("action", one_hot).expect("set"))
        .expect("bool one-hot");
    let mut env2 = CartPoleEnv::with_encoding(&[2], CPU, ActionEncoding::Categorical).expect("env");
    let td = env2.reset(Some(state_td(&[2], start))).expect("reset");
    let b = env2
        .step(
            td.with("action", Tensor::from_slice(&[1i32, 0]))
                .expect("set"),
        )
        .expect("int32 categorical");
    let xa = f64s(a.get(("next", "state")).expect("state"));
    let xb = f64s(b.get(("next", "state")).expect("state"));
    assert_eq!(xa, xb);
    // Pushing right accelerates the cart to the right (x_dot > 0), left to the left.
    assert!(xa[1] > 0.0 && xa[5] < 0.0, "{xa:?}");
}

#[test]
fn cartpole_reward_is_zero_when_stepping_on_after_termination() {
    let mut env = CartPoleEnv::with_encoding(&[], CPU, ActionEncoding::Categorical).expect("env");
    let td = env
        .reset(Some(state_td(
            &[],
            Tensor::from_slice(&[0.0f64, 0.0, 0.2, 1.0]),
        )))
        .expect("reset");
    let s = env
        .step(td.with("action", Tensor::from(1i64)).expect("set"))
        .expect("step");
    assert_eq!(f64s(s.get(("next", "reward")).expect("r")), vec![1.0]);
    assert_eq!(bools(s.get(("next", "terminated")).expect("t")), vec![true]);
    let td = env.step_mdp(&s).expect("step_mdp");
    let s = env
        .step(td.with("action", Tensor::from(1i64)).expect("set"))
        .expect("step");
    assert_eq!(f64s(s.get(("next", "reward")).expect("r")), vec![0.0]);
    // A reset clears it.
    let td = env.reset(None).expect("reset");
    let s = env
        .step(td.with("action", Tensor::from(1i64)).expect("set"))
        .expect("step");
    assert_eq!(f64s(s.get(("next", "reward")).expect("r")), vec![1.0]);
}

// ------------------------------------------------------------------ devices

#[test]
fn envs_run_on_cuda_when_available() {
    if !tch::Cuda::is_available() {
        eprintln!("CUDA not available: skipped");
        return;
    }
    let cuda = Device::Cuda(0);
    for which in ALL {
        for batch in [&[][..], &[8]] {
            let mut env = which.make(batch, cuda);
            check_env_specs(env.as_mut(), Some(0))
                .unwrap_or_else(|e| panic!("{which:?} on CUDA, batch {batch:?}: {e}"));
            let td = env.reset(None).expect("reset");
            for (k, t) in td.leaves() {
                assert_eq!(t.device(), cuda, "{which:?}: {k} not on CUDA");
            }
        }
        // The same seed gives the same initial states on both devices; the gymnasium replays
        // hold on CUDA too.
        let mut a = which.make(&[5], CPU);
        let mut b = which.make(&[5], cuda);
        a.set_seed(3).expect("seed");
        b.set_seed(3).expect("seed");
        let sa = a
            .reset(None)
            .expect("reset")
            .get("state")
            .expect("state")
            .copy();
        let sb = b
            .reset(None)
            .expect("reset")
            .get("state")
            .expect("state")
            .to_device(CPU);
        assert!(
            sa.equal(&sb),
            "{which:?}: CPU and CUDA initial states differ"
        );
        let (failures, worst, n) = replay_single(which, cuda);
        eprintln!("{which:?} on CUDA: {n} cases, largest deviation {worst:e}");
        assert!(
            failures.is_empty(),
            "{which:?} on CUDA:\n{}",
            failures.join("\n")
        );
    }
}

// ------------------------------------------------------------------ Pendulum step paths

/// Largest absolute difference between two tensors (NaN counts as a mismatch: the comparison
/// with a tolerance fails).
fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
    assert_eq!(a.size(), b.size(), "shapes differ");
    if a.numel() == 0 {
        return 0.0;
    }
    (a.to_kind(Kind::Double) - b.to_kind(Kind::Double))
        .abs()
        .max()
        .double_value(&[])
}

/// `n` Pendulum start states: gymnasium's range and wound-up angles, exact odd multiples of π
/// (where `angle_normalize` wraps), speeds at and beyond the ±8 clip, and far-off angles.
fn pendulum_states(n: i64, gen: &mut Generator) -> Tensor {
    let th = gen
        .uniform(&[n, 1], -60.0, 60.0, Kind::Double, CPU)
        .expect("uniform");
    let thdot = gen
        .uniform(&[n, 1], -10.0, 10.0, Kind::Double, CPU)
        .expect("uniform");
    let states = Tensor::cat(&[th, thdot], -1);
    let pi = std::f64::consts::PI;
    let special = [
        [pi, 0.0],
        [-pi, 0.0],
        [3.0 * pi, 8.0],
        [-3.0 * pi, -8.0],
        [0.0, 0.0],
        [2.0 * pi, 8.5],
        [-2.0 * pi, -8.5],
        [1e6, 1.0],
        [-1e6, -1.0],
        [pi.next_up(), 7.9],
        [(-pi).next_down(), -7.9],
    ];
    for (i, s) in special.iter().enumerate() {
        states.get(i as i64).copy_(&Tensor::from_slice(s));
    }
    states
}

/// `n` torques, beyond the ±2 clip too, with the clip points themselves.
fn pendulum_actions(n: i64, gen: &mut Generator) -> Tensor {
    let a = gen
        .uniform(&[n, 1], -3.0, 3.0, Kind::Float, CPU)
        .expect("uniform");
    for (i, v) in [2.0f32, -2.0, 2.5, -2.5, 0.0].iter().enumerate() {
        a.get(i as i64).copy_(&Tensor::from_slice(&[*v]));
    }
    a
}

/// Per step, `("next", "state")`, `("next", "observation")` and `("next", "reward")` of a
/// Pendulum of `len` elements started from `states[lo..lo + len]` and stepped with the same
/// rows of `actions`.
fn pendulum_steps(
    states: &Tensor,
    actions: &[Tensor],
    lo: i64,
    len: i64,
) -> Vec<(Tensor, Tensor, Tensor)> {
    let mut env = PendulumEnv::new(&[len], CPU).expect("env");
    let start = TensorDict::new([len])
        .expect("td")
        .with("state", states.narrow(0, lo, len))
        .expect("set");
    let mut td = env.reset(Some(start)).expect("reset");
    let mut out = Vec::new();
    for a in actions {
        let stepped = env
            .step(td.with("action", a.narrow(0, lo, len)).expect("set"))
            .expect("step");
        let get = |k: &str| stepped.get(("next", k)).expect("next entry").copy();
        out.push((get("state"), get("observation"), get("reward")));
        td = env.step_mdp(&stepped).expect("step_mdp");
    }
    out
}

#[test]
fn pendulum_tensor_step_matches_host_step() {
    // CPU batches above `HOST_PATH_MAX` (32768 pendulums, src/envs/builtin/pendulum.rs) step
    // with tensor ops; smaller ones on host values, with libtorch's vectorized sin/cos above
    // 64 pendulums and libm's up to 64. Several steps, so the host step's cached sin θ is used
    // too.
    const BIG: i64 = 40_000;
    let mut gen = Generator::new(11);
    let states = pendulum_states(BIG, &mut gen);
    let actions: Vec<Tensor> = (0..5).map(|_| pendulum_actions(BIG, &mut gen)).collect();
    let tensor = pendulum_steps(&states, &actions, 0, BIG);
    for (lo, len) in [(0, 20_000), (20_000, 20_000), (0, 65), (0, 64), (7, 1)] {
        let host = pendulum_steps(&states, &actions, lo, len);
        for (t, ((ts, to, tr), (hs, ho, hr))) in tensor.iter().zip(&host).enumerate() {
            let (ts, to, tr) = (
                ts.narrow(0, lo, len),
                to.narrow(0, lo, len),
                tr.narrow(0, lo, len),
            );
            let (ds, d_o, dr) = (max_diff(&ts, hs), max_diff(&to, ho), max_diff(&tr, hr));
            assert!(
                ds <= 1e-9 && d_o <= 1e-6 && dr <= 1e-6,
                "host batch {len} at {lo}, step {t}: state off by {ds:e}, observation by \
                 {d_o:e}, reward by {dr:e}"
            );
            assert_eq!(
                (hs.kind(), ho.kind(), hr.kind()),
                (Kind::Double, Kind::Float, Kind::Float)
            );
        }
    }
}

// ------------------------------------------------------------------ rollout stacking

#[test]
fn rollout_stacks_like_a_plain_stack() {
    // W2's setup, smaller: a batched Pendulum with RewardScaling, no auto reset. The stack
    // copies each step's root observation/state/done/terminated from the previous step's
    // "next" entries (the same tensors) instead of stacking them again; the result must be
    // what stacking every leaf of the steps gives.
    let make = || {
        TransformedEnv::new(PendulumEnv::new(&[300], CPU).expect("env"))
            .expect("transformed")
            .with(RewardScaling::new(0.0, 0.1).expect("transform"))
            .expect("with")
    };
    let steps_n = 30;
    let mut env = make();
    env.set_seed(5).expect("seed");
    let cfg = RolloutConfig {
        auto_reset: Some(false),
        break_when_any_done: Some(false),
        tensordict: Some(env.reset(None).expect("reset")),
        ..Default::default()
    };
    let traj = env.rollout(steps_n, None, &cfg).expect("rollout");
    // The same steps by hand.
    let mut env = make();
    env.set_seed(5).expect("seed");
    let mut td = env.reset(None).expect("reset");
    let mut steps = Vec::new();
    for _ in 0..steps_n {
        td = env.rand_action(Some(td)).expect("rand_action");
        let (stepped, root) = env.step_and_maybe_reset(td).expect("step");
        steps.push(stepped);
        td = root;
    }
    assert_eq!(traj.batch_size(), &[300, steps_n as i64]);
    assert_eq!(
        traj.keys(KeysOptions::nested()),
        steps[0].keys(KeysOptions::nested())
    );
    for (key, got) in traj.leaves() {
        let parts: Vec<Tensor> = steps
            .iter()
            .map(|s| s.get(&key).expect("leaf").shallow_clone())
            .collect();
        let want = Tensor::stack(&parts, 1);
        assert!(got.is_contiguous(), "{key} is not contiguous");
        assert_eq!(
            (got.size(), got.kind()),
            (want.size(), want.kind()),
            "{key}"
        );
        assert!(got.equal(&want), "{key} differs from a plain stack");
    }
    // Copied leaves are tensors of their own.
    let done = traj.get("done").expect("done").shallow_clone();
    let _ = done.shallow_clone().fill_(1);
    for key in [("next", "done"), ("next", "terminated")] {
        assert_eq!(
            bools(traj.get(key).expect("flag")),
            vec![false; 300 * steps_n]
        );
    }
    assert_eq!(
        bools(traj.get("terminated").expect("flag")),
        vec![false; 300 * steps_n]
    );
}

#[test]
fn stack_copies_only_leaves_that_are_the_same_views() {
    // Tensordicts shaped like rollout steps: "prev" is the previous input's "x" (a shift),
    // "alias" is "x" itself (a copy). The look-alikes must be stacked as usual: a transposed
    // view of the same memory, a leaf whose first input has another dtype, leaves that
    // require grad, and a shift that breaks at the last input.
    let n = 5;
    let x: Vec<Tensor> = (0..n)
        .map(|i| Tensor::arange(9, (Kind::Float, CPU)).view([3, 3]) * (i + 1) as f64)
        .collect();
    let g: Vec<Tensor> = (0..n)
        .map(|i| (Tensor::ones([3, 3], (Kind::Float, CPU)) * i as f64).set_requires_grad(true))
        .collect();
    let fresh = || Tensor::full([3, 3], -1.0, (Kind::Float, CPU));
    let tds: Vec<TensorDict> = (0..n)
        .map(|i| {
            let prev = |v: &Vec<Tensor>| {
                if i == 0 {
                    fresh()
                } else {
                    v[i - 1].shallow_clone()
                }
            };
            let mixed = if i == 0 {
                Tensor::full([3, 3], 0.1, (Kind::Double, CPU))
            } else {
                x[i - 1].shallow_clone()
            };
            let broken = if i == n - 1 { fresh() } else { prev(&x) };
            TensorDict::new([3])
                .expect("td")
                .with("x", x[i].shallow_clone())
                .expect("set")
                .with(("sub", "prev"), prev(&x))
                .expect("set")
                .with("alias", x[i].shallow_clone())
                .expect("set")
                .with("transposed", x[i].tr())
                .expect("set")
                .with("mixed", mixed)
                .expect("set")
                .with("g", g[i].shallow_clone())
                .expect("set")
                .with("g_prev", prev(&g))
                .expect("set")
                .with("broken", broken)
                .expect("set")
        })
        .collect();
    for dim in [0, 1, -1] {
        let got = torchrl::stack(&tds, dim).expect("stack");
        let d = if dim < 0 { dim + 2 } else { dim };
        for key in got.keys(KeysOptions::nested_leaves()) {
            let parts: Vec<Tensor> = tds
                .iter()
                .map(|t| t.get(&key).expect("leaf").shallow_clone())
                .collect();
            let want = Tensor::stack(&parts, d);
            let t = got.get(&key).expect("leaf");
            assert_eq!(
                (t.size(), t.kind()),
                (want.size(), want.kind()),
                "{key}, dim {dim}"
            );
            assert!(t.is_contiguous(), "{key}, dim {dim}: not contiguous");
            assert_eq!(t.requires_grad(), want.requires_grad(), "{key}, dim {dim}");
            assert!(
                t.equal(&want),
                "{key}, dim {dim}: differs from a plain stack"
            );
        }
        // The copy does not share memory with its source.
        let alias = got.get("alias").expect("alias").shallow_clone();
        let _ = alias.shallow_clone().fill_(7.0);
        assert!(!got.get("x").expect("x").equal(&alias));
    }
}

#[test]
fn pendulum_state_after_host_steps_is_the_last_returned_state() {
    // The host step keeps the state as host values only; `state()` builds it on demand and
    // must be the "state" the last step returned, a tensor of its own.
    for n in [3i64, 1024] {
        let mut env = PendulumEnv::new(&[n], CPU).expect("env");
        env.set_seed(11).expect("seed");
        let mut td = env.reset(None).expect("reset");
        assert!(env
            .state()
            .expect("state")
            .equal(td.get("state").expect("state")));
        for _ in 0..3 {
            td = env.rand_action(Some(td)).expect("rand");
            let stepped = env.step(td).expect("step");
            let returned = stepped.get(("next", "state")).expect("next state").copy();
            let state = env.state().expect("state");
            assert_eq!(state.size(), vec![n, 2]);
            assert!(
                state.equal(&returned),
                "batch {n}: state() differs from the step's"
            );
            let _ = state.shallow_clone().fill_(0.0);
            assert!(
                env.state().expect("state").equal(&returned),
                "state() aliases the env"
            );
            td = env.step_mdp(&stepped).expect("step_mdp");
        }
    }
}
