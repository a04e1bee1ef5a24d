//! `PendulumEnv`: gymnasium's `Pendulum-v1` (inverted pendulum swing-up), batched and
//! tensor-native.
//!
//! | key | spec | shape | dtype |
//! |-----|------|-------|-------|
//! | `"observation"` | `Bounded([-1, -1, -8], [1, 1, 8])`: `[cos θ, sin θ, θ̇]` | `[*B, 3]` | float32 |
//! | `"action"` | `Bounded(-2, 2)`: the torque | `[*B, 1]` | float32 |
//! | `"reward"` | `Unbounded`: `-(norm(θ)² + 0.1 θ̇² + 0.001 u²)` | `[*B, 1]` | float32 |
//! | `"done"`, `"terminated"` | always false (Pendulum never terminates) | `[*B, 1]` | bool |
//! | `"state"` (state spec) | `Unbounded`: `[θ, θ̇]` | `[*B, 2]` | float64 |
//!
//! Dynamics, constants (`g = 10`, `m = l = 1`, `dt = 0.05`, `|θ̇| ≤ 8`, `|u| ≤ 2`, out-of-range
//! torques are clipped) and the initial distribution (`θ ~ U[-π, π)`, `θ̇ ~ U[-1, 1)`, drawn
//! with [`EnvCore::generator`], so [`EnvBase::set_seed`] makes resets reproducible) are
//! gymnasium's. Gymnasium's `TimeLimit` (200 steps) is **not** part of the env: add a
//! `StepCounter` transform for it.
//!
//! **Actions** must have shape `[*B, 1]` and a float dtype (cast to float32, the dtype of
//! gymnasium's action space); another shape, an integer or bool dtype, or a missing
//! `"action"` is an error ([`Error::ShapeMismatch`](crate::error::Error::ShapeMismatch),
//! [`Error::DtypeMismatch`](crate::error::Error::DtypeMismatch), [`Error::KeyNotFound`](crate::error::Error::KeyNotFound)).
//!
//! **State.** The physical state `[θ, θ̇]` is kept in float64, as gymnasium keeps it: the
//! pendulum amplifies rounding errors (near the upright position they grow by e^3.9 per
//! second), and float32 dynamics drift from gymnasium's by more than 1e-4 within 50 steps.
//! Observations, actions and rewards are float32, as gymnasium's spaces and TorchRL's
//! `GymEnv` have them. The state is written as `"state"` by every reset and step (not part of
//! the observation spec: `check_env_specs` ignores `("next", "state")`), so the root of each
//! rollout step holds the state that step started from.
//!
//! **Resetting to a given state.** `reset` with a tensordict holding `"state"` (`[*B, 2]`, any
//! float dtype) starts from that state instead of sampling. A `"_reset"` mask selects the
//! elements to reset: they start from the given `"state"` (its other elements are not read),
//! or from fresh samples when the tensordict has no `"state"`; the other elements keep their
//! state. The non-stop rollout loop (`step_and_maybe_reset`) hands the env only the masks, so
//! done elements get fresh samples there; to re-sample some elements yourself, pass the mask
//! without a `"state"` (a root returned by `step_mdp` carries the current state, which would
//! otherwise be the state those elements are reset to).
//!
//! ```
//! use tch::{Device, Tensor};
//! use torchrl::envs::builtin::PendulumEnv;
//! use torchrl::envs::{check_env_specs, EnvBase, RolloutConfig};
//! use torchrl::TensorDict;
//! # fn main() -> torchrl::Result<()> {
//! let mut env = PendulumEnv::new(&[4], Device::Cpu)?;
//! env.set_seed(0)?;
//! let traj = env.rollout(10, None, &RolloutConfig::default())?;
//! assert_eq!(traj.batch_size(), &[4, 10]); // never terminates
//! assert_eq!(traj.get_or_err(("next", "observation"))?.size(), vec![4, 10, 3]);
//! check_env_specs(&mut env, Some(0))?;
//!
//! // Upright and at rest, with no torque: stays there, reward 0.
//! let mut single = PendulumEnv::new(&[], Device::Cpu)?;
//! let start = TensorDict::new([])?.with("state", Tensor::from_slice(&[0.0f64, 0.0]))?;
//! let td = single.reset(Some(start))?;
//! let td = single.step(td.with("action", Tensor::from_slice(&[0.0f32]))?)?;
//! assert_eq!(td.get_or_err(("next", "reward"))?.double_value(&[0]), 0.0);
//! assert_eq!(td.get_or_err(("next", "observation"))?.double_value(&[0]), 1.0); // cos θ
//! # Ok(()) }
//! ```

mod dynamics;
mod host;

use std::f64::consts::PI;

use tch::{Device, Kind, Tensor};

use super::common::{classic_core, env_output, read_action, reset_state, ActionKind};
use crate::data::specs::{Bounded, Unbounded};
use crate::envs::{EnvBase, EnvCore, EnvSpecs};
use crate::error::Result;
use crate::host::pendulum::{MAX_SPEED, MAX_TORQUE};
use crate::rng::Generator;
use crate::tensordict::TensorDict;
use host::{HostState, Spare};

/// Gymnasium's `Pendulum-v1`, batched. See the module docs.
pub struct PendulumEnv {
    core: EnvCore,
    /// `[θ, θ̇]`: a tensor after a reset or a tensor step, host values after a host step.
    state: State,
    /// Buffers the host step reuses from one step to the next (no allocation per step).
    spare: Spare,
}

/// Where the current state `[θ, θ̇]` lives. The host step keeps it as host values only (a
/// state tensor per step that nothing reads would cost a tensor construction); a tensor is
/// built from them when something needs one ([`PendulumEnv::state_tensor`]).
enum State {
    /// `[*B, 2]` float64. Never written in place (each step and reset sets a new tensor).
    Tensor(Tensor),
    /// The host step's state.
    Host(HostState),
}

impl PendulumEnv {
    /// A pendulum env with batch size `batch_size` (`&[]` for a single pendulum) on `device`.
    /// The state starts as a sample of the initial distribution; call
    /// [`EnvBase::reset`] (after [`EnvBase::set_seed`]) before stepping.
    pub fn new(batch_size: &[i64], device: Device) -> Result<Self> {
        let b1: Vec<i64> = [batch_size, &[1]].concat();
        let b3: Vec<i64> = [batch_size, &[3]].concat();
        let high = Tensor::f_from_slice(&[1.0f32, 1.0, MAX_SPEED as f32])?
            .f_expand(b3.as_slice(), false)?
            .f_contiguous()?;
        let low = high.f_neg()?;
        let specs = EnvSpecs::new(batch_size)?
            .with_observation("observation", Bounded::from_tensors(low, high)?)?
            .with_action("action", Bounded::new(-MAX_TORQUE, MAX_TORQUE, &b1)?)?
            .with_reward("reward", Unbounded::new().with_shape(&b1)?)?;
        let (core, state) = classic_core(specs, 2, device, Self::sample)?;
        let n = batch_size.iter().product::<i64>().max(0) as usize;
        Ok(PendulumEnv {
            core,
            state: State::Tensor(state),
            spare: if device == Device::Cpu && n <= HOST_PATH_MAX {
                Spare::for_batch(n)
            } else {
                Spare::default()
            },
        })
    }

    /// The current state `[θ, θ̇]` (`[*B, 2]`, float64), a copy.
    pub fn state(&self) -> Result<Tensor> {
        match &self.state {
            State::Tensor(t) => Ok(t.f_detach_copy()?),
            State::Host(h) => h.tensor(self.core.specs().batch_size()),
        }
    }

    /// The current state as a tensor (`[*B, 2]` float64, shared with the env: not to be written
    /// in place), built from the host values after a host step.
    fn state_tensor(&self) -> Result<Tensor> {
        match &self.state {
            State::Tensor(t) => Ok(t.shallow_clone()),
            State::Host(h) => h.tensor(self.core.specs().batch_size()),
        }
    }

    /// Gymnasium's initial distribution: `θ ~ U[-π, π)`, `θ̇ ~ U[-1, 1)`.
    fn sample(gen: &mut Generator, batch: &[i64], device: Device) -> Result<Tensor> {
        let shape: Vec<i64> = [batch, &[2]].concat();
        let high = Tensor::f_from_slice(&[PI, 1.0])?.f_expand(shape.as_slice(), false)?;
        let low = high.f_neg()?;
        Ok(gen.uniform_tensor(&low, &high)?.f_to_device(device)?)
    }

    fn output(&self, reward: Option<Tensor>) -> Result<TensorDict> {
        let state = self.state_tensor()?;
        let th = state.f_narrow(-1, 0, 1)?;
        let thdot = state.f_narrow(-1, 1, 1)?;
        let obs = Tensor::f_cat(&[th.f_cos()?, th.f_sin()?, thdot], -1)?.f_to_kind(Kind::Float)?;
        let done = Tensor::f_zeros(th.size(), (Kind::Bool, th.device()))?;
        let batch = self.core.specs().batch_size();
        env_output(batch, obs, state.f_detach_copy()?, done, reward)
    }
}

/// CPU batches of at most this many pendulums step on host values (`PendulumEnv::step_host`);
/// larger batches and other devices step with tensor ops (`PendulumEnv::step_tensor`).
const HOST_PATH_MAX: usize = 32_768;

impl EnvBase for PendulumEnv {
    crate::envs::base::env_core_field!();

    fn reset_impl(&mut self, td: Option<&TensorDict>) -> Result<TensorDict> {
        let op = "PendulumEnv::reset";
        let current = self.state_tensor()?;
        let (state, _) = reset_state(op, &mut self.core, td, 2, &current, Self::sample)?;
        let old = std::mem::replace(&mut self.state, State::Tensor(state));
        self.spare.recycle(old);
        self.output(None)
    }

    fn step_impl(&mut self, td: &TensorDict) -> Result<TensorDict> {
        let op = "PendulumEnv::step";
        let specs = self.core.specs();
        let b1: Vec<i64> = [specs.batch_size(), &[1]].concat();
        let a = read_action(op, td, &b1, ActionKind::Continuous, specs.device())?;
        if specs.device() == Device::Cpu && a.numel() <= HOST_PATH_MAX {
            self.step_host(&a)
        } else {
            self.step_tensor(&a)
        }
    }
}
