//! One-step bootstrapped targets as a tensordict module: [`TD0Estimator`] (TorchRL's
//! `TD0Estimator`), the default estimator of the off-policy losses.
//!
//! ```
//! use tch::{Kind, Tensor};
//! use torchrl::objectives::value::{TD0Estimator, ValueEstimator};
//! use torchrl::TensorDict;
//! # fn main() -> torchrl::Result<()> {
//! let f = (Kind::Float, tch::Device::Cpu);
//! // three transitions (a flat minibatch: TD(0) needs no time dim); the last one terminates
//! let mut td = TensorDict::new([3])?
//!     .with("state_value", Tensor::zeros([3, 1], f))?
//!     .with(("next", "state_value"), Tensor::full([3, 1], 10.0, f))?
//!     .with(("next", "reward"), Tensor::ones([3, 1], f))?
//!     .with(("next", "done"), Tensor::from_slice(&[false, true, true]).view([3, 1]))?
//!     .with(("next", "terminated"), Tensor::from_slice(&[false, false, true]).view([3, 1]))?;
//! TD0Estimator::new(0.5)?.forward(&mut td)?;
//! let target = Vec::<f32>::try_from(td.get_or_err("value_target")?.view([-1]))?;
//! // r + γ·(1 - terminated)·V': a truncation (done, not terminated) still bootstraps
//! assert_eq!(target, vec![6.0, 6.0, 1.0]);
//! # Ok(()) }
//! ```

use crate::error::Result;
use crate::tensordict::TensorDict;

use super::functional::{flag01, standardize};
use super::{estimator_builders, Estimate, EstimatorCore};

/// TD(0) estimator (the bootstrapped one-step return), TorchRL's `TD0Estimator`.
///
/// - `value_target = r + γ_t·(1 - terminated)·V(s_{t+1})` (`done` is not read: a truncated
///   step bootstraps like any other);
/// - `advantage = value_target - V(s_t)`;
/// - with `average_rewards`, the rewards are first standardised over the batch.
///
/// where `γ_t = γ^steps_to_next_obs` when that entry is present and `γ` otherwise.
///
/// Unlike GAE and TD(λ), TD(0) reads no time dim: any tensordict with at least one batch dim
/// (a flat minibatch of transitions included) is accepted. A value estimate
/// ([`ValueEstimator::value_estimate`](super::ValueEstimator::value_estimate)) reads
/// `("next", value)` only.
///
/// # Shapes
/// A `[*B]` tensordict; value, next value, `("next", reward)`, `("next", terminated)` of one
/// shape `[*B, *F]` (typically `[*B, 1]`); outputs of that shape.
#[derive(Debug)]
#[allow(clippy::upper_case_acronyms)]
pub struct TD0Estimator {
    core: EstimatorCore,
    average_rewards: bool,
}

estimator_builders!(TD0Estimator, "TD0Estimator", with_average_rewards => average_rewards, gamma_only, needs_time = false);

impl TD0Estimator {
    /// `(advantage, value_target)` and the value writes, without touching `td`.
    fn estimate(&self, td: &TensorDict, need_value: bool) -> Result<Estimate> {
        let (_guard, x) = self.core.start(td, need_value)?;
        let reward = if self.average_rewards {
            standardize(&x.reward)?
        } else {
            x.reward.shallow_clone()
        };
        let not_terminated = flag01(&x.terminated, x.next_value.kind())?.f_rsub_scalar(1.0)?;
        let boot = x.gamma(self.core.gamma).mul(&not_terminated)?;
        let target = reward.f_add(&boot.f_mul(&x.next_value)?)?;
        let adv = target.f_sub(&x.value)?;
        Ok(Estimate {
            advantage: x.restore(&adv)?,
            value_target: x.restore(&target)?,
            writes: self.core.value_writes(&x),
        })
    }
}
