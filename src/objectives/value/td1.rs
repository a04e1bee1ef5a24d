//! Monte-Carlo returns bootstrapped at the end of a trajectory: [`TD1Estimator`] (TorchRL's
//! `TD1Estimator`).
//!
//! ```
//! use tch::{Kind, Tensor};
//! use torchrl::objectives::value::{TD1Estimator, ValueEstimator};
//! use torchrl::TensorDict;
//! # fn main() -> torchrl::Result<()> {
//! let f = (Kind::Double, tch::Device::Cpu);
//! // one trajectory of 3 steps, truncated (done, not terminated) at the end: bootstrap there
//! let mut td = TensorDict::new([1, 3])?
//!     .with("state_value", Tensor::zeros([1, 3, 1], f))?
//!     .with(("next", "state_value"), Tensor::full([1, 3, 1], 10.0, f))?
//!     .with(("next", "reward"), Tensor::ones([1, 3, 1], f))?
//!     .with(("next", "done"), Tensor::from_slice(&[false, false, true]).view([1, 3, 1]))?
//!     .with(("next", "terminated"), Tensor::zeros([1, 3, 1], (Kind::Bool, tch::Device::Cpu)))?;
//! TD1Estimator::new(0.5)?.forward(&mut td)?;
//! let target = Vec::<f64>::try_from(td.get_or_err("value_target")?.view([-1]))?;
//! // G_2 = 1 + 0.5·10 = 6, G_1 = 1 + 0.5·6 = 4, G_0 = 1 + 0.5·4 = 3
//! assert_eq!(target, vec![3.0, 4.0, 6.0]);
//! # Ok(()) }
//! ```

use crate::error::Result;
use crate::tensordict::TensorDict;

use super::functional::{standardize, td_lambda_time_last};
use super::{estimator_builders, Estimate, EstimatorCore};

/// TD(1) estimator (discounted returns to the end of each trajectory), TorchRL's
/// `TD1Estimator`: TD(λ) with `λ = 1`.
///
/// - `G_t = r_t + γ_t·(1 - terminated_t)·(done_t ? V(s_{t+1}) : G_{t+1})`, `G_T` bootstrapped
///   from the last next value: trajectories end on `done`, bootstrapping stops on
///   `terminated`;
/// - `value_target = G`, `advantage = G - V(s_t)`;
/// - with `average_rewards`, the rewards are first standardised.
///
/// # Shapes
/// As [`GAE`](super::GAE): a `[*B, T]` tensordict (time last unless set with
/// [`with_time_dim`](TD1Estimator::with_time_dim)), inputs and outputs `[*B, T, *F]`.
#[derive(Debug)]
#[allow(clippy::upper_case_acronyms)]
pub struct TD1Estimator {
    core: EstimatorCore,
    average_rewards: bool,
}

estimator_builders!(TD1Estimator, "TD1Estimator", with_average_rewards => average_rewards, gamma_only, needs_time = true);

impl TD1Estimator {
    /// `(advantage, value_target)` and the value writes, without touching `td`.
    fn estimate(&self, td: &TensorDict, need_value: bool) -> Result<Estimate> {
        let (_guard, x) = self.core.start(td, need_value)?;
        let reward = if self.average_rewards {
            standardize(&x.reward)?
        } else {
            x.reward.shallow_clone()
        };
        let target = td_lambda_time_last(
            &x.gamma(self.core.gamma),
            1.0,
            &x.next_value,
            &reward,
            &x.done,
            &x.terminated,
        )?;
        let adv = target.f_sub(&x.value)?;
        Ok(Estimate {
            advantage: x.restore(&adv)?,
            value_target: x.restore(&target)?,
            writes: self.core.value_writes(&x),
        })
    }
}
