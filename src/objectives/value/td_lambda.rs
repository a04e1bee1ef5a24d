//! TD(λ) value targets as a tensordict module: [`TDLambdaEstimator`] (TorchRL's
//! `TDLambdaEstimator`).
//!
//! ```
//! use tch::{Kind, Tensor};
//! use torchrl::objectives::value::{TDLambdaEstimator, ValueEstimator};
//! use torchrl::TensorDict;
//! # fn main() -> torchrl::Result<()> {
//! let f = (Kind::Double, tch::Device::Cpu);
//! // λ = 1 and no termination: the target is the discounted return bootstrapped at the end
//! let mut td = TensorDict::new([3])?
//!     .with("state_value", Tensor::zeros([3, 1], f))?
//!     .with(("next", "state_value"), Tensor::full([3, 1], 10.0, f))?
//!     .with(("next", "reward"), Tensor::ones([3, 1], f))?
//!     .with(("next", "done"), Tensor::zeros([3, 1], (Kind::Bool, tch::Device::Cpu)))?;
//! TDLambdaEstimator::new(0.5, 1.0)?.with_time_dim(0).forward(&mut td)?; // one trajectory [T]
//! let target = Vec::<f64>::try_from(td.get_or_err("value_target")?.view([-1]))?;
//! // G_2 = 1 + 0.5·10 = 6, G_1 = 1 + 0.5·6 = 4, G_0 = 1 + 0.5·4 = 3
//! assert_eq!(target, vec![3.0, 4.0, 6.0]);
//! # Ok(()) }
//! ```

use crate::error::Result;
use crate::tensordict::TensorDict;

use super::functional::{standardize, td_lambda_time_last};
use super::{estimator_builders, Estimate, EstimatorCore};

/// TD(λ) estimator, TorchRL's `TDLambdaEstimator`.
///
/// - `value_target_t = G_t = r_t + γ_t·[(1-λ)·V'_t + λ·(done_t ? V'_t : G_{t+1})]`, with
///   `V'_t = (1 - terminated_t)·V(s_{t+1})` and `G_T = V'_{T-1}` after the last step;
/// - `advantage = value_target - V(s_t)`;
/// - with `average_rewards`, the rewards are first standardised:
///   `r ← (r - mean(r)) / max(std(r), 1e-4)`.
///
/// where `γ_t = γ^steps_to_next_obs` when that entry is present and `γ` otherwise.
///
/// # Shapes
/// As [`GAE`](super::GAE): a `[*B, T]` tensordict, inputs and outputs `[*B, T, *F]`.
#[derive(Debug)]
#[doc(alias = "TdLambdaEstimator")]
#[allow(clippy::upper_case_acronyms)]
pub struct TDLambdaEstimator {
    core: EstimatorCore,
    average_rewards: bool,
}

estimator_builders!(TDLambdaEstimator, "TDLambdaEstimator", with_average_rewards => average_rewards);

impl TDLambdaEstimator {
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
            self.core.lmbda,
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

/// The former name of [`TDLambdaEstimator`] (renamed to TorchRL's spelling; see
/// `docs/architecture.md`, "Naming").
#[deprecated(note = "renamed to `TDLambdaEstimator`, TorchRL's spelling")]
pub type TdLambdaEstimator = TDLambdaEstimator;
