//! The KL-coefficient controllers of RLHF PPO (trlX's `AdaptiveKLController` and
//! `FixedKLController`, identical in trlX b623d1b, trlX HEAD and TRL ≤ 0.11), and the
//! per-token KL estimators whose mean sequence sum feeds them.
//!
//! The KL coefficient β scales the per-token KL penalty in the reward
//! (`reward[t] = -β · k1[t]`, plus the score at the last response token). An
//! [`AdaptiveKLController`] moves β towards a target KL:
//!
//! ```text
//! e = clip(current / target - 1, -0.2, 0.2)
//! β ← β · (1 + e · n_steps / horizon)
//! ```
//!
//! A [`FixedKLController`] never changes β. [`KlController`] holds either (trlX picks the
//! adaptive one iff `target` is set: [`KlController::new`]).
//!
//! # What the controller is fed
//! `current` should be the **mean over the batch of the per-sequence summed KL between the
//! policy and the reference** on response tokens ([`mean_sequence_kl`]), and `n_steps` the
//! batch size (trlX: `train.batch_size`; TRL ≤ 0.11: `batch_size · num_processes`).
//!
//! **Reference bug (trlX HEAD, inverted k3).** trlX HEAD's `make_experience` logs and feeds the
//! controller `exp(lr) - 1 - lr` with `lr = logprob - ref_logprob`. With tokens sampled from the
//! policy π, the unbiased, always-positive k3 estimator of KL(π‖ref) is `exp(-lr) - 1 + lr`
//! ([`KlEstimator::K3`], TRL's and TorchRL's form); trlX's is the estimator of the other
//! direction evaluated on the wrong samples. On rlhf.md §5.3's vectors, trlX sums to 0.1493
//! where the k3 of KL(π‖ref) sums to 0.1862; with a target between the two, trlX *lowers* β
//! while the KL is above target. Here the controller is fed [`mean_sequence_kl`] with the
//! estimator of your choice (k1 as in the reward, or k3), never the inverted form
//! (`tests/rlhf_math.rs::reference_bug_inverted_k3_moves_the_controller_the_wrong_way`).
//!
//! **Reference bug (trlX b623d1b, KL as policy drift).** b623d1b computed the controller's
//! input inside `loss()` as `mean(sum(logprob_new - logprob_rollout))`: the drift of the
//! policy from the rollout policy over one PPO step, which is 0 on the first update after each
//! rollout, whatever the KL to the reference. Fed that, the controller lowers β by the full
//! 20%-clip on every call. [`mean_sequence_kl`] takes the *reference* log-probs
//! (`tests/rlhf_math.rs::reference_bug_policy_drift_is_not_the_kl_to_the_reference`).
//!
//! ```
//! use torchrl::objectives::llm::{AdaptiveKLController, KlController};
//! # fn main() -> torchrl::Result<()> {
//! // rlhf.md §5.1: init 0.2, target 6, horizon 10000, batch 128
//! let mut ctl = KlController::new(0.2, Some(6.0), 10_000.0)?;
//! ctl.update(8.0, 128)?; // e = clip(8/6 - 1) = 0.2
//! assert!((ctl.value() - 0.200512).abs() < 1e-12);
//! let mut fixed = KlController::new(0.05, None, 10_000.0)?;
//! fixed.update(100.0, 128)?;
//! assert_eq!(fixed.value(), 0.05);
//! assert!(AdaptiveKLController::new(0.2, -1.0, 10_000.0).is_err());
//! # Ok(()) }
//! ```

use tch::{Kind, Tensor};

pub use crate::envs::llm::KlEstimator;
use crate::error::{Error, Result, ShapeFmt};

/// The clip of the proportional error `current / target - 1` (trlX: `np.clip(…, -0.2, 0.2)`).
pub const PROPORTIONAL_ERROR_CLIP: f64 = 0.2;

fn finite_non_negative(op: &'static str, field: &'static str, v: f64) -> Result<()> {
    if v.is_finite() && v >= 0.0 {
        Ok(())
    } else {
        Err(Error::config(op, field, "finite and >= 0", v))
    }
}

fn finite_positive(op: &'static str, field: &'static str, v: f64) -> Result<()> {
    if v.is_finite() && v > 0.0 {
        Ok(())
    } else {
        Err(Error::config(op, field, "finite and > 0", v))
    }
}

/// trlX's `AdaptiveKLController(init_kl_coef, target, horizon)` (Ziegler et al. 2019, §2.2).
///
/// ```
/// use torchrl::objectives::llm::AdaptiveKLController;
/// # fn main() -> torchrl::Result<()> {
/// let mut ctl = AdaptiveKLController::new(0.2, 6.0, 10_000.0)?;
/// ctl.update(5.4, 128)?; // e = 5.4/6 - 1 = -0.1
/// assert!((ctl.value() - 0.2 * (1.0 - 0.1 * 128.0 / 10_000.0)).abs() < 1e-15);
/// assert!(ctl.update(f64::NAN, 128).is_err());
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdaptiveKLController {
    value: f64,
    target: f64,
    horizon: f64,
}

impl AdaptiveKLController {
    /// A controller starting at `init_kl_coef` (finite, `>= 0`) that steers the KL towards
    /// `target` (finite, `> 0`) with time constant `horizon` (finite, `> 0`), in samples.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the field, for a value out of range.
    pub fn new(init_kl_coef: f64, target: f64, horizon: f64) -> Result<Self> {
        const OP: &str = "AdaptiveKLController";
        finite_non_negative(OP, "init_kl_coef", init_kl_coef)?;
        finite_positive(OP, "target", target)?;
        finite_positive(OP, "horizon", horizon)?;
        Ok(AdaptiveKLController {
            value: init_kl_coef,
            target,
            horizon,
        })
    }

    /// The current coefficient β.
    pub fn value(&self) -> f64 {
        self.value
    }

    /// The target KL.
    pub fn target(&self) -> f64 {
        self.target
    }

    /// The horizon.
    pub fn horizon(&self) -> f64 {
        self.horizon
    }

    /// `β ← β · (1 + clip(current / target - 1, ±0.2) · n_steps / horizon)`.
    ///
    /// `current` is the mean sequence KL of the batch ([`mean_sequence_kl`]; it may be
    /// negative, as a k1 estimate can be), `n_steps` the number of samples it was measured on.
    ///
    /// # Errors
    /// When `current` is not finite (β is left unchanged).
    pub fn update(&mut self, current: f64, n_steps: usize) -> Result<()> {
        if !current.is_finite() {
            return Err(Error::argument(
                "AdaptiveKLController::update",
                "current",
                "a finite mean sequence KL",
                current.to_string(),
            ));
        }
        let e =
            (current / self.target - 1.0).clamp(-PROPORTIONAL_ERROR_CLIP, PROPORTIONAL_ERROR_CLIP);
        let mult = 1.0 + e * n_steps as f64 / self.horizon;
        self.value *= mult;
        Ok(())
    }
}

/// trlX's `FixedKLController(kl_coef)`: `update` does nothing.
///
/// ```
/// use torchrl::objectives::llm::FixedKLController;
/// # fn main() -> torchrl::Result<()> {
/// let mut ctl = FixedKLController::new(0.001)?;
/// ctl.update(3.0, 32)?;
/// assert_eq!(ctl.value(), 0.001);
/// assert!(FixedKLController::new(f64::INFINITY).is_err());
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FixedKLController {
    value: f64,
}

impl FixedKLController {
    /// A fixed coefficient (finite, `>= 0`).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a negative or non-finite `kl_coef`.
    pub fn new(kl_coef: f64) -> Result<Self> {
        finite_non_negative("FixedKLController", "kl_coef", kl_coef)?;
        Ok(FixedKLController { value: kl_coef })
    }

    /// The coefficient β.
    pub fn value(&self) -> f64 {
        self.value
    }

    /// A no-op (trlX's `FixedKLController.update`); never fails.
    pub fn update(&mut self, _current: f64, _n_steps: usize) -> Result<()> {
        Ok(())
    }
}

/// Either controller, as trlX's `PPOConfig` selects it.
///
/// ```
/// use torchrl::objectives::llm::KlController;
/// # fn main() -> torchrl::Result<()> {
/// let ctl = KlController::new(0.001, None, 10_000.0)?; // trlX HEAD's default: fixed
/// assert!(matches!(ctl, KlController::Fixed(_)));
/// assert_eq!(ctl.value(), 0.001);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KlController {
    /// [`AdaptiveKLController`].
    Adaptive(AdaptiveKLController),
    /// [`FixedKLController`].
    Fixed(FixedKLController),
}

impl KlController {
    /// Sets β (a checkpointed run resumes with the coefficient it had).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for a negative or non-finite `value`.
    pub fn set_value(&mut self, value: f64) -> Result<()> {
        finite_non_negative("KlController::set_value", "value", value)?;
        match self {
            KlController::Adaptive(c) => c.value = value,
            KlController::Fixed(c) => c.value = value,
        }
        Ok(())
    }

    /// trlX's rule: adaptive iff `target` is `Some`, else fixed at `init_kl_coef` (`horizon`
    /// is then unused, and not checked).
    ///
    /// # Errors
    /// As [`AdaptiveKLController::new`] / [`FixedKLController::new`].
    pub fn new(init_kl_coef: f64, target: Option<f64>, horizon: f64) -> Result<Self> {
        Ok(match target {
            Some(t) => KlController::Adaptive(AdaptiveKLController::new(init_kl_coef, t, horizon)?),
            None => KlController::Fixed(FixedKLController::new(init_kl_coef)?),
        })
    }

    /// The current coefficient β.
    pub fn value(&self) -> f64 {
        match self {
            KlController::Adaptive(c) => c.value(),
            KlController::Fixed(c) => c.value(),
        }
    }

    /// Updates β from the batch's mean sequence KL measured on `n_steps` samples.
    ///
    /// # Errors
    /// As [`AdaptiveKLController::update`].
    pub fn update(&mut self, current: f64, n_steps: usize) -> Result<()> {
        match self {
            KlController::Adaptive(c) => c.update(current, n_steps),
            KlController::Fixed(c) => c.update(current, n_steps),
        }
    }
}

impl From<AdaptiveKLController> for KlController {
    fn from(c: AdaptiveKLController) -> Self {
        KlController::Adaptive(c)
    }
}

impl From<FixedKLController> for KlController {
    fn from(c: FixedKLController) -> Self {
        KlController::Fixed(c)
    }
}

/// The controller's input: the mean over the batch of the per-sequence sum of the per-token
/// KL between the policy and the reference, on the positions where `mask` is set.
///
/// Returns a detached 0-dim float64 tensor (read it with `double_value(&[])`).
///
/// # Shapes
/// `log_probs`, `ref_log_probs`, `mask`: `[B, T]` (any equal shape whose first dim is the
/// batch); `mask` any dtype (non-zero = counted).
///
/// # Errors
/// When the shapes differ, or a log-prob tensor is not floating point.
///
/// ```
/// use tch::Tensor;
/// use torchrl::objectives::llm::{mean_sequence_kl, KlEstimator};
/// # fn main() -> torchrl::Result<()> {
/// // rlhf.md §5.3: logp [-1, -2, -0.5], ref [-1.2, -1.5, -0.7]
/// let lp = Tensor::from_slice(&[-1.0f64, -2.0, -0.5]).view([1, 3]);
/// let rf = Tensor::from_slice(&[-1.2f64, -1.5, -0.7]).view([1, 3]);
/// let m = Tensor::from_slice(&[1i64, 1, 1]).view([1, 3]);
/// let k3 = mean_sequence_kl(&lp, &rf, &m, KlEstimator::K3)?.double_value(&[]);
/// assert!((k3 - (0.01873075307798 * 2.0 + 0.14872127070013)).abs() < 1e-10);
/// let k1 = mean_sequence_kl(&lp, &rf, &m, KlEstimator::K1)?.double_value(&[]);
/// assert!((k1 - (-0.1)).abs() < 1e-12);
/// # Ok(()) }
/// ```
pub fn mean_sequence_kl(
    log_probs: &Tensor,
    ref_log_probs: &Tensor,
    mask: &Tensor,
    estimator: KlEstimator,
) -> Result<Tensor> {
    const OP: &str = "mean_sequence_kl";
    let (a, b, m) = (log_probs.size(), ref_log_probs.size(), mask.size());
    if a != b || a != m || a.is_empty() {
        return Err(Error::value(
            OP,
            "log_probs, ref_log_probs, mask",
            "one shape [B, ...] for all three",
            format!("{} / {} / {}", ShapeFmt(&a), ShapeFmt(&b), ShapeFmt(&m)),
        ));
    }
    for (key, t) in [("log_probs", log_probs), ("ref_log_probs", ref_log_probs)] {
        if !t.is_floating_point() {
            return Err(Error::value(
                OP,
                key,
                "a floating-point tensor",
                format!("{:?}", t.kind()),
            ));
        }
    }
    let _guard = tch::no_grad_guard();
    let keep = mask.f_ne(0)?;
    let lr = log_probs
        .f_to_kind(Kind::Double)?
        .f_sub(&ref_log_probs.f_to_kind(Kind::Double)?)?;
    let zero = Tensor::f_zeros_like(&lr)?;
    let kl = estimator.per_token(&lr)?.f_where_self(&keep, &zero)?;
    let dims: Vec<i64> = (1..kl.dim() as i64).collect();
    let per_seq = if dims.is_empty() {
        kl
    } else {
        kl.f_sum_dim_intlist(dims.as_slice(), false, Kind::Double)?
    };
    Ok(per_seq.f_mean(Kind::Double)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clip_is_symmetric() {
        let mut a = AdaptiveKLController::new(1.0, 1.0, 100.0).unwrap();
        a.update(100.0, 10).unwrap();
        assert!((a.value() - 1.02).abs() < 1e-15);
        let mut b = AdaptiveKLController::new(1.0, 1.0, 100.0).unwrap();
        b.update(-100.0, 10).unwrap();
        assert!((b.value() - 0.98).abs() < 1e-15);
    }
}
