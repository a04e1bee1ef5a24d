//! Helpers shared by the classic-control envs (Pendulum, CartPole, MountainCarContinuous):
//! the `"state"` key, reading and checking actions, and resets to a given state or from
//! fresh samples under a `"_reset"` mask.
//!
//! ```
//! use tch::{Device, Tensor};
//! use torchrl::envs::builtin::MountainCarContinuousEnv;
//! use torchrl::envs::EnvBase;
//! use torchrl::TensorDict;
//! # fn main() -> torchrl::Result<()> {
//! // Every classic-control env resets to a given `"state"` through these helpers.
//! let mut env = MountainCarContinuousEnv::new(&[], Device::Cpu)?;
//! let start = TensorDict::new([])?.with("state", Tensor::from_slice(&[-0.5f64, 0.0]))?;
//! let td = env.reset(Some(start))?;
//! assert_eq!(td.get_or_err("state")?.double_value(&[0]), -0.5);
//! // An action of the wrong shape (`[2]` instead of `[1]`) is refused.
//! assert!(env.step(td.with("action", Tensor::from_slice(&[0.0f32, 1.0]))?).is_err());
//! # Ok(()) }
//! ```

use tch::{Device, Kind, Tensor};

use crate::data::specs::Unbounded;
use crate::envs::{EnvCore, EnvSpecs};
use crate::error::{Error, Result};
use crate::kind::is_float;
use crate::rng::Generator;
use crate::tensordict::{NestedKey, TensorDict};

/// The state-spec key under which the classic-control envs read and write their state.
const STATE_KEY: &str = "state";

/// What kind of action an env reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ActionKind {
    /// Any floating dtype, cast to float32.
    Continuous,
    /// Any integer or bool dtype, cast to int64.
    Discrete,
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
struct ResetPlan {
    /// `[*B, 1]` bool on the env's device; `None`: every element.
    mask: Option<Tensor>,
    /// `[*B, n]` float64 on the env's device (a fresh copy); `None`: sample.
    state: Option<Tensor>,
}

impl ResetPlan {
    /// The state after the reset: the given state (or a fresh one from `sample`, called only
    /// when no state was given) where the plan selects, `current` elsewhere.
    fn new_state(
        &self,
        current: &Tensor,
        sample: impl FnOnce() -> Result<Tensor>,
    ) -> Result<Tensor> {
        let target = match &self.state {
            Some(s) => s.shallow_clone(),
            None => sample()?,
        };
        Ok(match &self.mask {
            Some(m) => target.f_where_self(m, current)?,
            None => target,
        })
    }
}

/// The outputs of a classic-control env's reset or step: `observation`, `state`, `done` and
/// `terminated` (the same tensor), and the reward when given (a step; a reset has none).
pub(super) fn env_output(
    batch: &[i64],
    observation: Tensor,
    state: Tensor,
    terminated: Tensor,
    reward: Option<Tensor>,
) -> Result<TensorDict> {
    let mut td = TensorDict::new(batch)?
        .with("observation", observation)?
        .with(STATE_KEY, state)?
        .with("done", terminated.shallow_clone())?
        .with("terminated", terminated)?;
    if let Some(r) = reward {
        td.set("reward", r)?;
    }
    Ok(td)
}

/// [`env_output`] for an env whose observation is its float64 physical state cast to float32
/// (CartPole, MountainCarContinuous); the state is a copy.
pub(super) fn state_output(
    core: &EnvCore,
    state: &Tensor,
    terminated: Tensor,
    reward: Option<Tensor>,
) -> Result<TensorDict> {
    let observation = state.f_to_kind(Kind::Float)?;
    let batch = core.specs().batch_size();
    env_output(
        batch,
        observation,
        state.f_detach_copy()?,
        terminated,
        reward,
    )
}

/// Draws a classic-control env's initial state: `(generator, batch size, device)` to a
/// `[*B, state_dim]` float64 tensor.
pub(super) type SampleFn = fn(&mut Generator, &[i64], Device) -> Result<Tensor>;

/// The core of a classic-control env and its first state: `specs` (observation, action and
/// reward set) completed with the float64 `"state"` spec of shape `[*B, state_dim]` and the
/// device, and a state drawn with `sample` from a copy of the core's generator (so that the
/// env's own stream starts where a fresh core's does).
pub(super) fn classic_core(
    specs: EnvSpecs,
    state_dim: i64,
    device: Device,
    sample: SampleFn,
) -> Result<(EnvCore, Tensor)> {
    let batch = specs.batch_size().to_vec();
    let shape: Vec<i64> = [batch.as_slice(), &[state_dim]].concat();
    let state_spec = Unbounded::new()
        .with_shape(&shape)?
        .with_dtype(Kind::Double)?;
    let specs = specs
        .with_state(STATE_KEY, state_spec)?
        .with_device(device)?;
    let core = EnvCore::new(specs)?;
    let state = sample(&mut core.generator.clone(), &batch, device)?;
    Ok((core, state))
}

/// The state after a reset of an env with `state_dim` state variables per element and the
/// current state `current`, following [`reset_plan`] (the elements it selects start from the
/// given state or from `sample(generator, batch, device)`, the others keep theirs), and the
/// plan's mask (`None`: every element was reset).
pub(super) fn reset_state(
    op: &'static str,
    core: &mut EnvCore,
    td: Option<&TensorDict>,
    state_dim: i64,
    current: &Tensor,
    sample: SampleFn,
) -> Result<(Tensor, Option<Tensor>)> {
    let batch = core.specs().batch_size().to_vec();
    let device = core.specs().device();
    let plan = reset_plan(op, td, &batch, state_dim, device)?;
    let gen = &mut core.generator;
    let state = plan.new_state(current, || sample(gen, &batch, device))?;
    Ok((state, plan.mask))
}

/// Decides how to reset from the tensordict given to `reset`. A `"_reset"` entry (shape `[*B]`
/// or `[*B, ...]`, reduced with `any` over the trailing dims) selects the elements to reset
/// (all of them without one); a `"state"` entry of shape `[*B, state_dim]` (any float dtype)
/// is the state those elements start from (its other elements are not read); without it they
/// are sampled. `step_and_maybe_reset` hands the env only the masks, so the current state it
/// carries is never mistaken for a state to reset to.
fn reset_plan(
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
