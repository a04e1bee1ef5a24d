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
//! `"action"` is an error ([`Error::ShapeMismatch`](crate::Error::ShapeMismatch),
//! [`Error::DtypeMismatch`](crate::Error::DtypeMismatch), [`Error::KeyNotFound`](crate::Error::KeyNotFound)).
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

use std::f64::consts::PI;

use tch::{Device, Kind, Tensor};

use crate::data::specs::{Bounded, Unbounded};
use crate::envs::{EnvBase, EnvCore, EnvSpecs};
use crate::error::{Error, Result};
use crate::rng::Generator;
use crate::tensordict::host::host_tensor;
use crate::tensordict::{NestedKey, TensorDict};

const MAX_SPEED: f64 = 8.0;
const MAX_TORQUE: f64 = 2.0;
const DT: f64 = 0.05;
const G: f64 = 10.0;
const M: f64 = 1.0;
const L: f64 = 1.0;

/// Gymnasium's `Pendulum-v1`, batched. See the module docs.
pub struct PendulumEnv {
    core: EnvCore,
    /// `[*B, 2]` float64: `[θ, θ̇]`.
    state: Tensor,
}

impl PendulumEnv {
    /// A pendulum env with batch size `batch_size` (`&[]` for a single pendulum) on `device`.
    /// The state starts as a sample of the initial distribution; call
    /// [`EnvBase::reset`] (after [`EnvBase::set_seed`]) before stepping.
    pub fn new(batch_size: &[i64], device: Device) -> Result<Self> {
        let b1: Vec<i64> = [batch_size, &[1]].concat();
        let b2: Vec<i64> = [batch_size, &[2]].concat();
        let b3: Vec<i64> = [batch_size, &[3]].concat();
        let high = Tensor::f_from_slice(&[1.0f32, 1.0, MAX_SPEED as f32])?
            .f_expand(b3.as_slice(), false)?
            .f_contiguous()?;
        let low = high.f_neg()?;
        let specs = EnvSpecs::new(batch_size)?
            .with_observation("observation", Bounded::from_tensors(low, high)?)?
            .with_action("action", Bounded::new(-MAX_TORQUE, MAX_TORQUE, &b1)?)?
            .with_reward("reward", Unbounded::new().with_shape(&b1)?)?
            .with_state(
                STATE_KEY,
                Unbounded::new().with_shape(&b2)?.with_dtype(Kind::Double)?,
            )?
            .with_device(device)?;
        let core = EnvCore::new(specs)?;
        let state = Self::sample(&mut core.generator.clone(), batch_size, device)?;
        Ok(PendulumEnv { core, state })
    }

    /// The current state `[θ, θ̇]` (`[*B, 2]`, float64), a copy.
    pub fn state(&self) -> Result<Tensor> {
        Ok(self.state.f_detach_copy()?)
    }

    /// Gymnasium's initial distribution: `θ ~ U[-π, π)`, `θ̇ ~ U[-1, 1)`.
    fn sample(gen: &mut Generator, batch: &[i64], device: Device) -> Result<Tensor> {
        let shape: Vec<i64> = [batch, &[2]].concat();
        let high = Tensor::f_from_slice(&[PI, 1.0])?.f_expand(shape.as_slice(), false)?;
        let low = high.f_neg()?;
        Ok(gen.uniform_tensor(&low, &high)?.f_to_device(device)?)
    }

    fn output(&self, reward: Option<Tensor>) -> Result<TensorDict> {
        let th = self.state.f_narrow(-1, 0, 1)?;
        let thdot = self.state.f_narrow(-1, 1, 1)?;
        let obs = Tensor::f_cat(&[th.f_cos()?, th.f_sin()?, thdot], -1)?.f_to_kind(Kind::Float)?;
        let done = Tensor::f_zeros(th.size(), (Kind::Bool, th.device()))?;
        let mut td = TensorDict::new(self.core.specs().batch_size())?
            .with("observation", obs)?
            .with(STATE_KEY, self.state.f_detach_copy()?)?
            .with("done", done.shallow_clone())?
            .with("terminated", done)?;
        if let Some(r) = reward {
            td.set("reward", r)?;
        }
        Ok(td)
    }
}

impl PendulumEnv {
    /// The step for small batches on the CPU: the same arithmetic as the tensor path (float64
    /// dynamics, gymnasium's float32 rounding points), done on host values. One read of the
    /// actions and the state and four tensor constructions replace ~25 libtorch ops, whose
    /// fixed per-op cost (about 1.5 µs each here) dominates a step of a handful of pendulums.
    fn step_host(&mut self, action: &Tensor) -> Result<TensorDict> {
        let specs = self.core.specs();
        let batch = specs.batch_size().to_vec();
        let u: Vec<f32> = Vec::<f32>::try_from(action.f_reshape([-1])?)?;
        let st: Vec<f64> = Vec::<f64>::try_from(self.state.f_reshape([-1])?)?;
        let n = u.len();
        let mut state = Vec::with_capacity(2 * n);
        let mut obs = Vec::with_capacity(3 * n);
        let mut reward = Vec::with_capacity(n);
        for (ui, s) in u.iter().zip(st.chunks_exact(2)) {
            let [th, thdot] = [s[0], s[1]];
            let ui = ui.clamp(-MAX_TORQUE as f32, MAX_TORQUE as f32);
            let torque_term = f64::from(ui * (3.0 / (M * L * L)) as f32);
            let torque_cost = f64::from(ui * ui * 0.001f32);
            let norm = (th + PI).rem_euclid(2.0 * PI) - PI;
            let cost = norm * norm + thdot * thdot * 0.1 + torque_cost;
            let accel = th.sin() * (3.0 * G / (2.0 * L)) + torque_term;
            let new_thdot = (thdot + accel * DT).clamp(-MAX_SPEED, MAX_SPEED);
            let new_th = th + new_thdot * DT;
            state.extend_from_slice(&[new_th, new_thdot]);
            obs.extend_from_slice(&[new_th.cos() as f32, new_th.sin() as f32, new_thdot as f32]);
            reward.push(-cost as f32);
        }
        let b1: Vec<i64> = [batch.as_slice(), &[1]].concat();
        let b2: Vec<i64> = [batch.as_slice(), &[2]].concat();
        let b3: Vec<i64> = [batch.as_slice(), &[3]].concat();
        self.state = host_tensor(&state, &b2)?;
        let done = host_tensor(&vec![false; n], &b1)?;
        TensorDict::new(&batch)?
            .with("observation", host_tensor(&obs, &b3)?)?
            .with(STATE_KEY, host_tensor(&state, &b2)?)?
            .with("done", done.shallow_clone())?
            .with("terminated", done)?
            .with("reward", host_tensor(&reward, &b1)?)
    }
}

/// Batches of at most this many pendulums on the CPU step on host values (see
/// `PendulumEnv::step_host`); larger batches and other devices step with tensor ops.
const HOST_PATH_MAX: usize = 64;

impl EnvBase for PendulumEnv {
    fn core(&self) -> &EnvCore {
        &self.core
    }

    fn core_mut(&mut self) -> &mut EnvCore {
        &mut self.core
    }

    fn reset_impl(&mut self, td: Option<&TensorDict>) -> Result<TensorDict> {
        let op = "PendulumEnv::reset";
        let batch = self.core.specs().batch_size().to_vec();
        let device = self.core.specs().device();
        let plan = reset_plan(op, td, &batch, 2, device)?;
        let fresh = if plan.needs_sample() {
            Some(Self::sample(&mut self.core.generator, &batch, device)?)
        } else {
            None
        };
        self.state = plan.new_state(&self.state, fresh)?;
        self.output(None)
    }

    fn step_impl(&mut self, td: &TensorDict) -> Result<TensorDict> {
        let op = "PendulumEnv::step";
        let specs = self.core.specs();
        let b1: Vec<i64> = [specs.batch_size(), &[1]].concat();
        let a = read_action(op, td, &b1, ActionKind::Continuous, specs.device())?;
        if specs.device() == Device::Cpu && a.numel() <= HOST_PATH_MAX {
            return self.step_host(&a);
        }
        // gymnasium: u = clip(u, -2, 2) is float32, and so are 3.0 * u and 0.001 * u**2.
        let u = a.f_clamp(-MAX_TORQUE, MAX_TORQUE)?;
        let torque_term = u.f_mul_scalar(3.0 / (M * L * L))?.f_to_kind(Kind::Double)?;
        let torque_cost = u.f_square()?.f_mul_scalar(0.001)?.f_to_kind(Kind::Double)?;
        let th = self.state.f_narrow(-1, 0, 1)?;
        let thdot = self.state.f_narrow(-1, 1, 1)?;
        // angle_normalize(th) = ((th + pi) % (2 pi)) - pi
        let norm = th
            .f_add_scalar(PI)?
            .f_remainder(2.0 * PI)?
            .f_sub_scalar(PI)?;
        let costs = norm
            .f_square()?
            .f_add(&thdot.f_square()?.f_mul_scalar(0.1)?)?
            .f_add(&torque_cost)?;
        let accel = th
            .f_sin()?
            .f_mul_scalar(3.0 * G / (2.0 * L))?
            .f_add(&torque_term)?;
        let new_thdot = thdot
            .f_add(&accel.f_mul_scalar(DT)?)?
            .f_clamp(-MAX_SPEED, MAX_SPEED)?;
        let new_th = th.f_add(&new_thdot.f_mul_scalar(DT)?)?;
        self.state = Tensor::f_cat(&[new_th, new_thdot], -1)?;
        let reward = costs.f_neg()?.f_to_kind(Kind::Float)?;
        self.output(Some(reward))
    }
}

// ------------------------------------------------------------------ shared by the builtin envs

/// The state-spec key under which the classic-control envs read and write their state.
pub(super) const STATE_KEY: &str = "state";

/// What kind of action an env reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ActionKind {
    /// Any floating dtype, cast to float32.
    Continuous,
    /// Any integer or bool dtype, cast to int64.
    Discrete,
}

fn is_float(kind: Kind) -> bool {
    matches!(
        kind,
        Kind::Half | Kind::BFloat16 | Kind::Float | Kind::Double
    )
}

fn is_integral(kind: Kind) -> bool {
    matches!(
        kind,
        Kind::Uint8 | Kind::Int8 | Kind::Int16 | Kind::Int | Kind::Int64 | Kind::Bool
    )
}

/// Reads `td["action"]`, checks its shape (exactly `shape`) and dtype family, and returns it on
/// `device` as float32 (continuous) or int64 (discrete).
pub(super) fn read_action(
    op: &'static str,
    td: &TensorDict,
    shape: &[i64],
    kind: ActionKind,
    device: Device,
) -> Result<Tensor> {
    let a = td.get_or_err("action")?;
    let key = NestedKey::from("action").to_string();
    if a.size() != shape {
        return Err(Error::ShapeMismatch {
            op,
            key,
            expected: shape.to_vec(),
            actual: a.size(),
        });
    }
    let (ok, target) = match kind {
        ActionKind::Continuous => (is_float(a.kind()), Kind::Float),
        ActionKind::Discrete => (is_integral(a.kind()), Kind::Int64),
    };
    if !ok {
        return Err(Error::DtypeMismatch {
            op,
            key,
            expected: target,
            actual: a.kind(),
        });
    }
    Ok(a.f_to_device(device)?.f_to_kind(target)?)
}

/// How a reset sets the state: the elements it selects (those of the `"_reset"` mask, or all of
/// them without one) start from the given state when there is one, else from fresh samples;
/// the other elements keep their state.
pub(super) struct ResetPlan {
    /// `[*B, 1]` bool on the env's device; `None`: every element.
    pub(super) mask: Option<Tensor>,
    /// `[*B, n]` float64 on the env's device (a fresh copy); `None`: sample.
    pub(super) state: Option<Tensor>,
}

impl ResetPlan {
    /// Whether the env must draw fresh samples (no state was given).
    pub(super) fn needs_sample(&self) -> bool {
        self.state.is_none()
    }

    /// The state after the reset: the given state (or `fresh`, required when none was given)
    /// where the plan selects, `current` elsewhere.
    pub(super) fn new_state(&self, current: &Tensor, fresh: Option<Tensor>) -> Result<Tensor> {
        let target = match (&self.state, fresh) {
            (Some(s), _) => s.shallow_clone(),
            (None, Some(f)) => f,
            (None, None) => {
                return Err(Error::invalid(
                    "reset",
                    "internal: no state given and no fresh sample drawn",
                ))
            }
        };
        Ok(match &self.mask {
            Some(m) => target.f_where_self(m, current)?,
            None => target,
        })
    }
}

/// Decides how to reset from the tensordict given to `reset`. A `"_reset"` entry (shape `[*B]`
/// or `[*B, ...]`, reduced with `any` over the trailing dims) selects the elements to reset
/// (all of them without one); a `"state"` entry of shape `[*B, state_dim]` (any float dtype)
/// is the state those elements start from (its other elements are not read); without it they
/// are sampled. `step_and_maybe_reset` hands the env only the masks, so the current state it
/// carries is never mistaken for a state to reset to.
pub(super) fn reset_plan(
    op: &'static str,
    td: Option<&TensorDict>,
    batch: &[i64],
    state_dim: i64,
    device: Device,
) -> Result<ResetPlan> {
    let Some(td) = td else {
        return Ok(ResetPlan {
            mask: None,
            state: None,
        });
    };
    let mask = match td.get("_reset") {
        Some(m) => {
            let size = m.size();
            if size.get(..batch.len()) != Some(batch) {
                return Err(Error::ShapeMismatch {
                    op,
                    key: NestedKey::from("_reset").to_string(),
                    expected: batch.to_vec(),
                    actual: size,
                });
            }
            let mut m = m.f_to_device(device)?.f_to_kind(Kind::Bool)?;
            while m.dim() > batch.len() {
                m = m.f_any_dim(-1, false)?;
            }
            Some(m.f_unsqueeze(-1)?)
        }
        None => None,
    };
    let Some(s) = td.get(STATE_KEY) else {
        return Ok(ResetPlan { mask, state: None });
    };
    let key = NestedKey::from(STATE_KEY).to_string();
    let shape: Vec<i64> = [batch, &[state_dim]].concat();
    if s.size() != shape {
        return Err(Error::ShapeMismatch {
            op,
            key,
            expected: shape,
            actual: s.size(),
        });
    }
    if !is_float(s.kind()) {
        return Err(Error::DtypeMismatch {
            op,
            key,
            expected: Kind::Double,
            actual: s.kind(),
        });
    }
    let state = s
        .f_to_device(device)?
        .f_to_kind(Kind::Double)?
        .f_detach_copy()?;
    Ok(ResetPlan {
        mask,
        state: Some(state),
    })
}
