//! Generalized advantage estimation as a tensordict module: [`GAE`] (TorchRL's `GAE`).
//!
//! ```
//! use tch::{Kind, Tensor};
//! use torchrl::objectives::value::{GAE, ValueEstimator, ValueNetwork};
//! use torchrl::TensorDict;
//! # fn main() -> torchrl::Result<()> {
//! // V(s) = 2·obs, a 4-step truncated trajectory (done, not terminated, at the end)
//! let obs = Tensor::from_slice(&[0.0f32, 1.0, 2.0, 3.0]).view([4, 1]);
//! let mut td = TensorDict::new([4])?
//!     .with("obs", obs.shallow_clone())?
//!     .with(("next", "obs"), obs.f_add_scalar(1.0)?)?
//!     .with(("next", "reward"), Tensor::zeros([4, 1], (Kind::Float, tch::Device::Cpu)))?
//!     .with(("next", "done"), Tensor::from_slice(&[false, false, false, true]).view([4, 1]))?
//!     .with(("next", "terminated"), Tensor::zeros([4, 1], (Kind::Bool, tch::Device::Cpu)))?;
//! let net = ValueNetwork::new(["obs"], |td: &TensorDict| Ok(td.get_or_err("obs")?.f_mul_scalar(2.0)?));
//! // one trajectory of 4 steps: its time dim named explicitly
//! let gae = GAE::new(1.0, 1.0)?.with_value_network(net).with_time_dim(0);
//! gae.forward(&mut td)?;
//! // γ=λ=1, no reward, bootstrapped at truncation: A_t = V(s_4) - V(s_t) = 8 - 2t
//! let adv = Vec::<f32>::try_from(td.get_or_err("advantage")?.view([-1]))?;
//! assert_eq!(adv, vec![8.0, 6.0, 4.0, 2.0]);
//! assert!(td.contains(("next", "state_value"))); // the network's values are written back
//! # Ok(()) }
//! ```

use crate::error::Result;
use crate::tensordict::TensorDict;

use super::functional::{gae_time_last, standardize};
use super::{estimator_builders, Estimate, EstimatorCore};

/// Generalized advantage estimation (Schulman et al. 2016), TorchRL's `GAE`.
///
/// - `delta_t = r_t + γ_t·(1 - terminated_t)·V(s_{t+1}) - V(s_t)`
/// - `A_t = delta_t + γ_t·λ·(1 - done_t)·A_{t+1}`
/// - `value_target = A + V(s_t)` (computed before any standardisation)
/// - with `average_gae`, `A ← (A - mean(A)) / max(std(A), 1e-4)` over every element
///
/// where `γ_t = γ^steps_to_next_obs` when that entry is present and `γ` otherwise.
///
/// # Shapes
/// - input: a tensordict of batch size `[*B, T]` (time at the last batch dim unless set with
///   [`with_time_dim`](GAE::with_time_dim)); value, next value, `("next", reward)`,
///   `("next", done)` and `("next", terminated)` all of one shape `[*B, T, *F]` (typically
///   `[*B, T, 1]`).
/// - output: `advantage` and `value_target`, `[*B, T, *F]`.
#[derive(Debug)]
#[doc(alias = "Gae")]
#[allow(clippy::upper_case_acronyms)]
pub struct GAE {
    core: EstimatorCore,
    average_gae: bool,
}

estimator_builders!(GAE, "GAE", with_average_gae => average_gae);

impl GAE {
    /// `(advantage, value_target)` and the value writes, without touching `td`.
    /// GAE's target is `A + V(s_t)`: `V(s_t)` is read even for a value estimate.
    fn estimate(&self, td: &TensorDict, _need_value: bool) -> Result<Estimate> {
        let (_guard, x) = self.core.start(td, true)?;
        let (adv, target) = gae_time_last(
            &x.gamma(self.core.gamma),
            self.core.lmbda,
            &x.value,
            &x.next_value,
            &x.reward,
            &x.done,
            &x.terminated,
        )?;
        let adv = if self.average_gae {
            standardize(&adv)?
        } else {
            adv
        };
        Ok(Estimate {
            advantage: x.restore(&adv)?,
            value_target: x.restore(&target)?,
            writes: self.core.value_writes(&x),
        })
    }
}

/// The former name of [`GAE`] (renamed to TorchRL's spelling; see `docs/architecture.md`,
/// "Naming").
#[deprecated(note = "renamed to `GAE`, TorchRL's spelling")]
pub type Gae = GAE;
