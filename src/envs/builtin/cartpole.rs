//! `CartPoleEnv`: gymnasium's `CartPole-v1` (balance a pole on a cart), batched and
//! tensor-native.
//!
//! | key | spec | shape | dtype |
//! |-----|------|-------|-------|
//! | `"observation"` | `Bounded(±[4.8, ∞, 0.419, ∞])`: `[x, ẋ, θ, θ̇]` | `[*B, 4]` | float32 |
//! | `"action"` | `OneHot(2)` (default) or `Categorical(2)`: 0 pushes left, 1 right | `[*B, 2]` / `[*B]` | int64 |
//! | `"reward"` | `Unbounded`: 1 per step | `[*B, 1]` | float32 |
//! | `"done"`, `"terminated"` | `|x| > 2.4` or `|θ| > 12°` | `[*B, 1]` | bool |
//! | `"state"` (state spec) | `Unbounded`: `[x, ẋ, θ, θ̇]` | `[*B, 4]` | float64 |
//!
//! The action is one-hot by default, as TorchRL's `GymEnv("CartPole-v1")` exposes it
//! (`categorical_action_encoding=False`); [`ActionEncoding::Categorical`] gives TorchRL's
//! `categorical_action_encoding=True` layout (class indices, shape `[*B]`). A one-hot action
//! pushes right when its argmax is 1; a categorical one when it equals 1 (gymnasium's
//! `force_mag if action == 1 else -force_mag`). Any integer or bool dtype is accepted; a float
//! dtype or another shape is an error.
//!
//! Dynamics (explicit Euler, `tau = 0.02`), thresholds, rewards and the initial distribution
//! (every state variable `~ U[-0.05, 0.05)`, drawn with [`EnvCore::generator`], so
//! [`EnvBase::set_seed`] makes resets reproducible) are gymnasium's. As in gymnasium, stepping
//! an element again after it terminated (without a reset) gives reward 0 when it is still
//! terminated. Gymnasium's `TimeLimit` (500 steps) is **not** part of the env: add a
//! `StepCounter` transform for it; there is no `"truncated"` entry until then.
//!
//! **State.** The observation *is* gymnasium's state, rounded to float32; the state itself is
//! kept in float64, as gymnasium keeps it, and written as `"state"` by every reset and step
//! (in the state spec, not the observation spec). `reset` with a tensordict holding `"state"`
//! (`[*B, 4]`, any float dtype) starts from it; with a `"_reset"` mask only the masked elements
//! are reset, to the given `"state"` or, without one, to fresh samples (see
//! [`PendulumEnv`](super::PendulumEnv)).
//!
//! ```
//! use tch::{Device, Tensor};
//! use torchrl::envs::builtin::{ActionEncoding, CartPoleEnv};
//! use torchrl::envs::{check_env_specs, EnvBase, RolloutConfig};
//! use torchrl::TensorDict;
//! # fn main() -> torchrl::Result<()> {
//! let mut env = CartPoleEnv::new(&[], Device::Cpu)?;
//! env.set_seed(0)?;
//! let traj = env.rollout(1000, None, &RolloutConfig::default())?;
//! let steps = traj.batch_size()[0];
//! assert!(steps < 1000, "random pushes drop the pole");
//! let done = traj.get_or_err(("next", "done"))?;
//! assert!(done.int64_value(&[steps - 1, 0]) == 1);
//!
//! // Categorical actions, batched, starting with the pole tilted past the threshold's edge:
//! let mut env = CartPoleEnv::with_encoding(&[2], Device::Cpu, ActionEncoding::Categorical)?;
//! let start = Tensor::from_slice(&[0.0f64, 0.0, 0.2, 1.0, 0.0, 0.0, 0.0, 0.0]).reshape([2, 4]);
//! let td = env.reset(Some(TensorDict::new([2])?.with("state", start)?))?;
//! let td = env.step(td.with("action", Tensor::from_slice(&[1i64, 0]))?)?;
//! let term = td.get_or_err(("next", "terminated"))?;
//! assert_eq!(Vec::<bool>::try_from(&term.reshape([-1]))?, vec![true, false]);
//! check_env_specs(&mut env, Some(0))?;
//! # Ok(()) }
//! ```

use tch::{Device, Kind, Tensor};

use super::common::{classic_core, read_action, reset_state, state_output, ActionKind};
use crate::data::specs::{Bounded, Categorical, OneHot, TensorSpec, Unbounded};
use crate::envs::{EnvBase, EnvCore, EnvSpecs};
use crate::error::Result;
use crate::rng::Generator;
use crate::tensordict::TensorDict;

const GRAVITY: f64 = 9.8;
const MASSCART: f64 = 1.0;
const MASSPOLE: f64 = 0.1;
const TOTAL_MASS: f64 = MASSPOLE + MASSCART;
const LENGTH: f64 = 0.5;
const POLEMASS_LENGTH: f64 = MASSPOLE * LENGTH;
const FORCE_MAG: f64 = 10.0;
const TAU: f64 = 0.02;
const THETA_THRESHOLD: f64 = 12.0 * 2.0 * std::f64::consts::PI / 360.0;
const X_THRESHOLD: f64 = 2.4;

/// How [`CartPoleEnv`] encodes its discrete action.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ActionEncoding {
    /// `OneHot(2)`, shape `[*B, 2]`, int64: TorchRL's `GymEnv` default.
    #[default]
    OneHot,
    /// `Categorical(2)`, shape `[*B]`, int64 (TorchRL's `categorical_action_encoding=True`).
    Categorical,
}

/// Gymnasium's `CartPole-v1`, batched. See the module docs.
pub struct CartPoleEnv {
    core: EnvCore,
    encoding: ActionEncoding,
    /// `[*B, 4]` float64: `[x, ẋ, θ, θ̇]`.
    state: Tensor,
    /// `[*B, 1]` bool: terminated at some step since the last reset (gymnasium's
    /// `steps_beyond_terminated is not None`).
    was_terminated: Tensor,
}

impl CartPoleEnv {
    /// A cart-pole env with a one-hot action, batch size `batch_size` (`&[]` for one cart-pole)
    /// on `device`. Call [`EnvBase::reset`] (after [`EnvBase::set_seed`]) before stepping.
    pub fn new(batch_size: &[i64], device: Device) -> Result<Self> {
        Self::with_encoding(batch_size, device, ActionEncoding::OneHot)
    }

    /// Same, with the given action encoding.
    pub fn with_encoding(
        batch_size: &[i64],
        device: Device,
        encoding: ActionEncoding,
    ) -> Result<Self> {
        let b1: Vec<i64> = [batch_size, &[1]].concat();
        let b4: Vec<i64> = [batch_size, &[4]].concat();
        let high = Tensor::f_from_slice(&[
            (X_THRESHOLD * 2.0) as f32,
            f32::INFINITY,
            (THETA_THRESHOLD * 2.0) as f32,
            f32::INFINITY,
        ])?
        .f_expand(b4.as_slice(), false)?
        .f_contiguous()?;
        let low = high.f_neg()?;
        let action: TensorSpec = match encoding {
            ActionEncoding::OneHot => OneHot::new(2)?
                .with_shape([batch_size, &[2]].concat())?
                .with_dtype(Kind::Int64)?
                .into(),
            ActionEncoding::Categorical => Categorical::new(2)?.with_shape(batch_size)?.into(),
        };
        let specs = EnvSpecs::new(batch_size)?
            .with_observation("observation", Bounded::from_tensors(low, high)?)?
            .with_action("action", action)?
            .with_reward("reward", Unbounded::new().with_shape(&b1)?)?;
        let (core, state) = classic_core(specs, 4, device, Self::sample)?;
        let was_terminated = Tensor::f_zeros(&b1, (Kind::Bool, device))?;
        Ok(CartPoleEnv {
            core,
            encoding,
            state,
            was_terminated,
        })
    }

    /// The action encoding.
    pub fn encoding(&self) -> ActionEncoding {
        self.encoding
    }

    /// The current state `[x, ẋ, θ, θ̇]` (`[*B, 4]`, float64), a copy.
    pub fn state(&self) -> Result<Tensor> {
        Ok(self.state.f_detach_copy()?)
    }

    /// Gymnasium's initial distribution: every state variable `~ U[-0.05, 0.05)`.
    fn sample(gen: &mut Generator, batch: &[i64], device: Device) -> Result<Tensor> {
        let shape: Vec<i64> = [batch, &[4]].concat();
        gen.uniform(&shape, -0.05, 0.05, Kind::Double, device)
    }
}

impl EnvBase for CartPoleEnv {
    crate::envs::base::env_core_field!();

    fn reset_impl(&mut self, td: Option<&TensorDict>) -> Result<TensorDict> {
        let op = "CartPoleEnv::reset";
        let (state, mask) = reset_state(op, &mut self.core, td, 4, &self.state, Self::sample)?;
        self.state = state;
        self.was_terminated = match &mask {
            Some(m) => self.was_terminated.f_masked_fill(m, 0i64)?,
            None => self.was_terminated.f_zeros_like()?,
        };
        let terminated = self.was_terminated.f_zeros_like()?;
        state_output(&self.core, &self.state, terminated, None)
    }

    fn step_impl(&mut self, td: &TensorDict) -> Result<TensorDict> {
        let op = "CartPoleEnv::step";
        let specs = self.core.specs();
        let batch = specs.batch_size();
        let push_right = match self.encoding {
            ActionEncoding::OneHot => {
                let shape: Vec<i64> = [batch, &[2]].concat();
                read_action(op, td, &shape, ActionKind::Discrete, specs.device())?
                    .f_argmax(-1, true)?
                    .f_eq(1)?
            }
            ActionEncoding::Categorical => {
                read_action(op, td, batch, ActionKind::Discrete, specs.device())?
                    .f_eq(1)?
                    .f_unsqueeze(-1)?
            }
        };
        // force = force_mag if action == 1 else -force_mag
        let force = push_right
            .f_to_kind(Kind::Double)?
            .f_mul_scalar(2.0 * FORCE_MAG)?
            .f_sub_scalar(FORCE_MAG)?;
        let x = self.state.f_narrow(-1, 0, 1)?;
        let x_dot = self.state.f_narrow(-1, 1, 1)?;
        let theta = self.state.f_narrow(-1, 2, 1)?;
        let theta_dot = self.state.f_narrow(-1, 3, 1)?;
        let costheta = theta.f_cos()?;
        let sintheta = theta.f_sin()?;
        // Same operation order as gymnasium (float64 throughout).
        let temp = theta_dot
            .f_square()?
            .f_mul_scalar(POLEMASS_LENGTH)?
            .f_mul(&sintheta)?
            .f_add(&force)?
            .f_div_scalar(TOTAL_MASS)?;
        let denom = costheta
            .f_square()?
            .f_mul_scalar(MASSPOLE)?
            .f_div_scalar(TOTAL_MASS)?
            .f_neg()?
            .f_add_scalar(4.0 / 3.0)?
            .f_mul_scalar(LENGTH)?;
        let thetaacc = sintheta
            .f_mul_scalar(GRAVITY)?
            .f_sub(&costheta.f_mul(&temp)?)?
            .f_div(&denom)?;
        let xacc = temp.f_sub(
            &thetaacc
                .f_mul_scalar(POLEMASS_LENGTH)?
                .f_mul(&costheta)?
                .f_div_scalar(TOTAL_MASS)?,
        )?;
        let new_x = x.f_add(&x_dot.f_mul_scalar(TAU)?)?;
        let new_x_dot = x_dot.f_add(&xacc.f_mul_scalar(TAU)?)?;
        let new_theta = theta.f_add(&theta_dot.f_mul_scalar(TAU)?)?;
        let new_theta_dot = theta_dot.f_add(&thetaacc.f_mul_scalar(TAU)?)?;
        let terminated = new_x
            .f_abs()?
            .f_gt(X_THRESHOLD)?
            .f_logical_or(&new_theta.f_abs()?.f_gt(THETA_THRESHOLD)?)?;
        self.state = Tensor::f_cat(&[new_x, new_x_dot, new_theta, new_theta_dot], -1)?;
        // 1 per step, but 0 when terminated again after an earlier termination.
        let reward = terminated
            .f_logical_and(&self.was_terminated)?
            .f_logical_not()?
            .f_to_kind(Kind::Float)?;
        self.was_terminated = self.was_terminated.f_logical_or(&terminated)?;
        state_output(&self.core, &self.state, terminated, Some(reward))
    }
}
