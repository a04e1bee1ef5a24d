//! Partial resets (issue 26, item 4): `check_partial_reset` (also run by `check_env_specs`)
//! catches an env that re-samples every element's state under a `"_reset"` mask (what
//! `examples/custom_env.rs` did), passes one that resets only the masked elements, and passes
//! the built-in, batched and transformed envs. The rollout test counts, as the issue did, the
//! steps that did not start from the state the previous step observed, recomputing the
//! dynamics by hand.

use tch::{Device, Kind, Tensor};
use torchrl::envs::batched::{ParallelEnv, SerialEnv};
use torchrl::envs::builtin::{CartPoleEnv, CountingEnv, PendulumEnv};
use torchrl::envs::transforms::StepCounter;
use torchrl::envs::{
    check_env_specs, check_partial_reset, EnvBase, EnvCore, EnvSpecs, RolloutConfig, TransformedEnv,
};
use torchrl::specs::{Bounded, Unbounded};
use torchrl::{Error, Result, TensorDict};

/// The point mass of `examples/custom_env.rs`; `reset_all` is the old example's reset (every
/// element re-sampled whatever the mask says).
struct PointMass {
    core: EnvCore,
    state: Tensor,
    reset_all: bool,
}

const DT: f64 = 0.1;

impl PointMass {
    fn new(batch: &[i64], reset_all: bool) -> Result<Self> {
        let shape = |f: i64| [batch, &[f]].concat();
        let specs = EnvSpecs::new(batch)?
            .with_observation("observation", Unbounded::new().with_shape(shape(2))?)?
            .with_action("action", Bounded::new(-1.0, 1.0, shape(1))?)?
            .with_reward("reward", Unbounded::new().with_shape(shape(1))?)?;
        Ok(PointMass {
            core: EnvCore::new(specs)?,
            state: Tensor::f_zeros(shape(2), (Kind::Float, Device::Cpu))?,
            reset_all,
        })
    }
}

impl EnvBase for PointMass {
    fn core(&self) -> &EnvCore {
        &self.core
    }
    fn core_mut(&mut self) -> &mut EnvCore {
        &mut self.core
    }
    fn reset_impl(&mut self, td: Option<&TensorDict>) -> Result<TensorDict> {
        let batch = self.core.specs().batch_size().to_vec();
        let ps = [batch.as_slice(), &[1]].concat();
        let pos = self
            .core
            .generator
            .uniform(&ps, -1.0, 1.0, Kind::Float, Device::Cpu)?;
        let fresh = Tensor::f_cat(
            &[pos, Tensor::f_zeros(&ps, (Kind::Float, Device::Cpu))?],
            -1,
        )?;
        self.state = match td.and_then(|t| t.get("_reset")) {
            Some(m) if !self.reset_all => {
                let m = m
                    .f_to_kind(Kind::Bool)?
                    .f_reshape([batch.as_slice(), &[-1]].concat())?
                    .f_any_dim(-1, true)?;
                fresh.f_where_self(&m, &self.state)?
            }
            _ => fresh,
        };
        TensorDict::new(batch)?.with("observation", self.state.copy())
    }
    fn step_impl(&mut self, td: &TensorDict) -> Result<TensorDict> {
        let force = td.get_or_err("action")?.f_clamp(-1.0, 1.0)?;
        let pos = self.state.f_narrow(-1, 0, 1)?;
        let vel = self
            .state
            .f_narrow(-1, 1, 1)?
            .f_add(&force.f_mul_scalar(DT)?)?;
        let pos = pos.f_add(&vel.f_mul_scalar(DT)?)?;
        self.state = Tensor::f_cat(&[&pos, &vel], -1)?;
        TensorDict::new(self.core.specs().batch_size())?
            .with("observation", self.state.copy())?
            .with("reward", pos.f_square()?.f_neg()?)?
            .with("terminated", pos.f_abs()?.f_gt(0.6)?)
    }
}

#[test]
fn resetting_every_element_fails_the_check_and_check_env_specs() {
    let mut env = PointMass::new(&[4], true).unwrap();
    let err = check_partial_reset(&mut env, 0).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, Error::InvalidValue { .. }), "{msg}");
    assert!(msg.contains("check_partial_reset"), "{msg}");
    assert!(msg.contains("observation"), "{msg}");
    // check_env_specs runs it too
    let err = check_env_specs(&mut env, Some(0)).unwrap_err();
    assert!(err.to_string().contains("check_partial_reset"), "{err}");
}

#[test]
fn resetting_only_masked_elements_passes() {
    for batch in [vec![2], vec![4], vec![2, 3]] {
        let mut env = PointMass::new(&batch, false).unwrap();
        check_partial_reset(&mut env, 3).unwrap();
        check_env_specs(&mut env, Some(0)).unwrap();
    }
}

#[test]
fn single_element_envs_have_nothing_to_check() {
    // one element: a partial reset cannot leave another element alone; even the old reset passes
    let mut env = PointMass::new(&[1], true).unwrap();
    check_partial_reset(&mut env, 0).unwrap();
    let mut env = PointMass::new(&[], true).unwrap();
    check_partial_reset(&mut env, 0).unwrap();
}

/// Counts the steps of a 16-env, 60-step rollout (auto-reset on done) whose next observation is
/// not the dynamics applied to the observation the step started from: the steps that started
/// from a state other than the one observed.
fn steps_from_unobserved_state(reset_all: bool) -> i64 {
    let mut env = PointMass::new(&[16], reset_all).unwrap();
    env.set_seed(1).unwrap();
    let traj = env.rollout(60, None, &RolloutConfig::no_break()).unwrap();
    let obs = traj.get_or_err("observation").unwrap();
    let next = traj.get_or_err(("next", "observation")).unwrap();
    let a = traj.get_or_err("action").unwrap().clamp(-1.0, 1.0);
    let vel = obs.narrow(-1, 1, 1) + a * DT;
    let pos = obs.narrow(-1, 0, 1) + &vel * DT;
    let expected = Tensor::cat(&[pos, vel], -1);
    let wrong = (next - expected).abs().gt(1e-5).any_dim(-1, false);
    wrong.sum(Kind::Int64).int64_value(&[])
}

#[test]
fn rollout_steps_start_from_the_observed_state() {
    assert_eq!(steps_from_unobserved_state(false), 0);
    // the old example: many steps continue from a re-sampled, never observed state
    let wrong = steps_from_unobserved_state(true);
    assert!(wrong > 100, "{wrong}");
}

#[test]
fn builtin_batched_and_transformed_envs_reset_only_masked_elements() {
    check_partial_reset(&mut PendulumEnv::new(&[4], Device::Cpu).unwrap(), 0).unwrap();
    check_partial_reset(&mut CartPoleEnv::new(&[3], Device::Cpu).unwrap(), 5).unwrap();
    check_partial_reset(&mut CountingEnv::new(2, &[2, 2]).unwrap(), 0).unwrap();
    let mk = || {
        (0..2)
            .map(|_| PendulumEnv::new(&[2], Device::Cpu))
            .collect::<Result<Vec<_>>>()
    };
    check_partial_reset(&mut SerialEnv::new(mk().unwrap()).unwrap(), 0).unwrap();
    check_partial_reset(&mut ParallelEnv::new(mk().unwrap()).unwrap(), 0).unwrap();
    let mut t = TransformedEnv::new(PointMass::new(&[3], false).unwrap())
        .unwrap()
        .with(StepCounter::new())
        .unwrap();
    check_partial_reset(&mut t, 0).unwrap();
    let mut bad = TransformedEnv::new(PointMass::new(&[3], true).unwrap())
        .unwrap()
        .with(StepCounter::new())
        .unwrap();
    assert!(check_partial_reset(&mut bad, 0).is_err());
}
