//! `MountainCarContinuousEnv`: gymnasium's `MountainCarContinuous-v0` (drive an
//! under-powered car up a hill), batched and tensor-native.
//!
//! | key | spec | shape | dtype |
//! |-----|------|-------|-------|
//! | `"observation"` | `Bounded([-1.2, -0.07], [0.6, 0.07])`: `[position, velocity]` | `[*B, 2]` | float32 |
//! | `"action"` | `Bounded(-1, 1)`: the engine force | `[*B, 1]` | float32 |
//! | `"reward"` | `Unbounded`: `100 · goal − 0.1 · action²` | `[*B, 1]` | float32 |
//! | `"done"`, `"terminated"` | `position ≥ 0.45` and `velocity ≥ 0` (the goal) | `[*B, 1]` | bool |
//! | `"state"` (state spec) | `Unbounded`: `[position, velocity]` | `[*B, 2]` | float64 |
//!
//! Dynamics, constants and the initial distribution (`position ~ U[-0.6, -0.4)`, velocity 0,
//! drawn with [`EnvCore::generator`], so [`EnvBase::set_seed`] makes resets reproducible) are
//! gymnasium's: the force is the action clipped to `[-1, 1]` (the reward's penalty uses the
//! unclipped action, as in gymnasium), the velocity is clipped to `±0.07`, the position to
//! `[-1.2, 0.6]`, and hitting the left wall stops the car. Gymnasium's `TimeLimit` (999 steps)
//! is **not** part of the env: add a `StepCounter` transform for it.
//!
//! **Actions** must have shape `[*B, 1]` and a float dtype (cast to float32, the dtype of
//! gymnasium's action space); another shape, an integer or bool dtype, or a missing
//! `"action"` is an error ([`Error::ShapeMismatch`](crate::error::Error::ShapeMismatch),
//! [`Error::DtypeMismatch`](crate::error::Error::DtypeMismatch), [`Error::KeyNotFound`](crate::error::Error::KeyNotFound)).
//!
//! **State.** The observation *is* gymnasium's state. The `"state"` entry (state spec, written
//! by every reset and step) holds it in float64: gymnasium's reset draws a float64 position
//! and each step stores the state as float32, and so does this env (the values after a step
//! are float32 values). `reset` with a tensordict holding `"state"` (`[*B, 2]`, any float
//! dtype) starts from it; with a `"_reset"` mask only the masked elements are reset, to the
//! given `"state"` or, without one, to fresh samples (see [`PendulumEnv`](super::PendulumEnv)).
//!
//! ```
//! use tch::{Device, Tensor};
//! use torchrl::envs::builtin::MountainCarContinuousEnv;
//! use torchrl::envs::{check_env_specs, EnvBase};
//! use torchrl::TensorDict;
//! # fn main() -> torchrl::Result<()> {
//! let mut env = MountainCarContinuousEnv::new(&[], Device::Cpu)?;
//! // Just below the goal, moving right, full throttle: reaches it.
//! let start = TensorDict::new([])?.with("state", Tensor::from_slice(&[0.44f64, 0.02]))?;
//! let td = env.reset(Some(start))?;
//! let td = env.step(td.with("action", Tensor::from_slice(&[1.0f32]))?)?;
//! assert_eq!(td.get_or_err(("next", "terminated"))?.int64_value(&[0]), 1);
//! let reward = td.get_or_err(("next", "reward"))?.double_value(&[0]);
//! assert!((reward - 99.9).abs() < 1e-5);
//!
//! let mut batched = MountainCarContinuousEnv::new(&[8], Device::Cpu)?;
//! check_env_specs(&mut batched, Some(0))?;
//! # Ok(()) }
//! ```

use tch::{Device, Kind, Tensor};

use super::common::{classic_core, read_action, reset_state, state_output, ActionKind};
use crate::data::specs::{Bounded, Unbounded};
use crate::envs::{EnvBase, EnvCore, EnvSpecs};
use crate::error::Result;
use crate::rng::Generator;
use crate::tensordict::TensorDict;

const MIN_ACTION: f64 = -1.0;
const MAX_ACTION: f64 = 1.0;
const MIN_POSITION: f64 = -1.2;
const MAX_POSITION: f64 = 0.6;
const MAX_SPEED: f64 = 0.07;
const GOAL_POSITION: f64 = 0.45;
const GOAL_VELOCITY: f64 = 0.0;
const POWER: f64 = 0.0015;

/// Gymnasium's `MountainCarContinuous-v0`, batched. See the module docs.
pub struct MountainCarContinuousEnv {
    core: EnvCore,
    /// `[*B, 2]` float64: `[position, velocity]`.
    state: Tensor,
}

impl MountainCarContinuousEnv {
    /// A mountain-car env with batch size `batch_size` (`&[]` for one car) on `device`. Call
    /// [`EnvBase::reset`] (after [`EnvBase::set_seed`]) before stepping.
    pub fn new(batch_size: &[i64], device: Device) -> Result<Self> {
        let b1: Vec<i64> = [batch_size, &[1]].concat();
        let b2: Vec<i64> = [batch_size, &[2]].concat();
        let low = Tensor::f_from_slice(&[MIN_POSITION as f32, -MAX_SPEED as f32])?
            .f_expand(b2.as_slice(), false)?
            .f_contiguous()?;
        let high = Tensor::f_from_slice(&[MAX_POSITION as f32, MAX_SPEED as f32])?
            .f_expand(b2.as_slice(), false)?
            .f_contiguous()?;
        let specs = EnvSpecs::new(batch_size)?
            .with_observation("observation", Bounded::from_tensors(low, high)?)?
            .with_action("action", Bounded::new(MIN_ACTION, MAX_ACTION, &b1)?)?
            .with_reward("reward", Unbounded::new().with_shape(&b1)?)?;
        let (core, state) = classic_core(specs, 2, device, Self::sample)?;
        Ok(MountainCarContinuousEnv { core, state })
    }

    /// The current state `[position, velocity]` (`[*B, 2]`, float64), a copy.
    pub fn state(&self) -> Result<Tensor> {
        Ok(self.state.f_detach_copy()?)
    }

    /// Gymnasium's initial distribution: `position ~ U[-0.6, -0.4)`, velocity 0.
    fn sample(gen: &mut Generator, batch: &[i64], device: Device) -> Result<Tensor> {
        let shape: Vec<i64> = [batch, &[1]].concat();
        let position = gen.uniform(&shape, -0.6, -0.4, Kind::Double, device)?;
        let velocity = position.f_zeros_like()?;
        Ok(Tensor::f_cat(&[position, velocity], -1)?)
    }
}

impl EnvBase for MountainCarContinuousEnv {
    crate::envs::base::env_core_field!();

    fn reset_impl(&mut self, td: Option<&TensorDict>) -> Result<TensorDict> {
        let op = "MountainCarContinuousEnv::reset";
        let (state, _) = reset_state(op, &mut self.core, td, 2, &self.state, Self::sample)?;
        self.state = state;
        let specs = self.core.specs();
        let b1: Vec<i64> = [specs.batch_size(), &[1]].concat();
        let terminated = Tensor::f_zeros(&b1, (Kind::Bool, specs.device()))?;
        state_output(&self.core, &self.state, terminated, None)
    }

    fn step_impl(&mut self, td: &TensorDict) -> Result<TensorDict> {
        let op = "MountainCarContinuousEnv::step";
        let specs = self.core.specs();
        let b1: Vec<i64> = [specs.batch_size(), &[1]].concat();
        let action = read_action(op, td, &b1, ActionKind::Continuous, specs.device())?;
        // gymnasium: force * power is float32 arithmetic.
        let push = action
            .f_clamp(MIN_ACTION, MAX_ACTION)?
            .f_mul_scalar(POWER)?
            .f_to_kind(Kind::Double)?;
        let position = self.state.f_narrow(-1, 0, 1)?;
        let velocity = self.state.f_narrow(-1, 1, 1)?;
        let slope = position.f_mul_scalar(3.0)?.f_cos()?.f_mul_scalar(0.0025)?;
        let velocity = velocity
            .f_add(&push.f_sub(&slope)?)?
            .f_clamp(-MAX_SPEED, MAX_SPEED)?;
        let position = position
            .f_add(&velocity)?
            .f_clamp(MIN_POSITION, MAX_POSITION)?;
        // The left wall stops the car.
        let at_wall = position
            .f_le(MIN_POSITION)?
            .f_logical_and(&velocity.f_lt(0.0)?)?;
        let velocity = velocity.f_masked_fill(&at_wall, 0.0)?;
        // gymnasium stores the state as float32, and compares it in float32.
        let obs = Tensor::f_cat(&[position, velocity], -1)?.f_to_kind(Kind::Float)?;
        let terminated = obs
            .f_narrow(-1, 0, 1)?
            .f_ge(GOAL_POSITION)?
            .f_logical_and(&obs.f_narrow(-1, 1, 1)?.f_ge(GOAL_VELOCITY)?)?;
        let penalty = action
            .f_to_kind(Kind::Double)?
            .f_square()?
            .f_mul_scalar(0.1)?;
        let reward = terminated
            .f_to_kind(Kind::Double)?
            .f_mul_scalar(100.0)?
            .f_sub(&penalty)?
            .f_to_kind(Kind::Float)?;
        self.state = obs.f_to_kind(Kind::Double)?;
        state_output(&self.core, &self.state, terminated, Some(reward))
    }
}
