//! [`PpoConfig`]: every PPO setting in one value (burn's `Config` style: `Default`, `new`,
//! `with_*`), validated when a loss takes it.

use crate::error::{Error, Result};
use crate::macros::setters;
use crate::objectives::common::Reduction;

use super::CriticLossType;

/// The settings of [`ClipPPOLoss`](super::ClipPPOLoss) and
/// [`KLPENPPOLoss`](super::KLPENPPOLoss), with TorchRL 0.14.1's defaults.
///
/// The setters do not check; a loss checks the whole config when it takes it
/// ([`PpoLoss::with_config`](super::PpoLoss::with_config)), and a bad value is an
/// [`Error::InvalidConfig`] naming the field, the accepted range and the value. Each loss reads
/// the shared fields and its own (`clip_epsilon` for the clipped loss; `dtarg`, `beta`,
/// `increment`, `decrement`, `samples_mc_kl` for the KL-penalty loss).
///
/// ```
/// use torchrl::objectives::{CriticLossType, PpoConfig};
/// let cfg = PpoConfig::new()
///     .with_clip_epsilon(0.1)
///     .with_entropy_coeff(1e-3)
///     .with_loss_critic_type(CriticLossType::L2);
/// assert_eq!(cfg.clip_epsilon, 0.1);
/// assert_eq!(cfg.critic_coeff, 1.0); // TorchRL's default
/// assert!(cfg.validate_clip("ClipPPOLoss").is_ok());
/// let err = PpoConfig::new().with_clip_epsilon(1.5).validate_clip("ClipPPOLoss").unwrap_err();
/// assert!(matches!(err, torchrl::Error::InvalidConfig { field: "clip_epsilon", .. }));
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct PpoConfig {
    /// The clip ε of [`ClipPPOLoss`](super::ClipPPOLoss): log-weights are clamped to
    /// `[ln(1-ε), ln(1+ε)]`; in `(0, 1)`. Default 0.2.
    pub clip_epsilon: f64,
    /// Whether the entropy bonus is added. Default `true`.
    pub entropy_bonus: bool,
    /// The entropy coefficient; finite, `>= 0`. Default 0.01.
    pub entropy_coeff: f64,
    /// Samples of the Monte-Carlo entropy estimate (when the entropy has no closed form);
    /// `>= 1`. Default 1.
    pub samples_mc_entropy: i64,
    /// The critic coefficient (`0` disables the critic loss); finite, `>= 0`. Default 1.
    pub critic_coeff: f64,
    /// The critic's distance. Default [`CriticLossType::SmoothL1`].
    pub loss_critic_type: CriticLossType,
    /// Clips the value prediction to `old_value ± clip_value` (`None`: off); finite, `> 0`.
    /// TorchRL's `clip_value=True` is `Some(clip_epsilon)`. Default `None`.
    pub clip_value: Option<f64>,
    /// Whether the advantage is standardised before use. Default `false`.
    pub normalize_advantage: bool,
    /// The reduction of the `loss_*` terms. Default [`Reduction::Mean`].
    pub reduction: Reduction,
    /// The seed of the loss's own generator (Monte-Carlo entropy and KL). Default 0.
    pub seed: u64,
    /// The target KL of [`KLPENPPOLoss`](super::KLPENPPOLoss); finite, `>= 0`. Default 0.01.
    pub dtarg: f64,
    /// The initial KL coefficient β; finite, `>= 0`. Default 1.
    pub beta: f64,
    /// β's factor when the KL exceeds `1.5·dtarg`; finite, `>= 1`. Default 2.
    pub increment: f64,
    /// β's factor when the KL is below `dtarg/1.5`; in `[0, 1]`. Default 0.5.
    pub decrement: f64,
    /// Draws of the Monte-Carlo KL (pairs without a closed form); `>= 1`. Default 1.
    pub samples_mc_kl: i64,
    /// Refuses non-finite inputs (NaN / ±Inf in the advantage, value target, stored log-prob,
    /// reward, values) with an error naming the key, instead of returning a NaN loss. Costs a
    /// few reductions per forward. Default `false`.
    pub check_finite: bool,
}

impl Default for PpoConfig {
    fn default() -> Self {
        PpoConfig {
            clip_epsilon: 0.2,
            entropy_bonus: true,
            entropy_coeff: 0.01,
            samples_mc_entropy: 1,
            critic_coeff: 1.0,
            loss_critic_type: CriticLossType::SmoothL1,
            clip_value: None,
            normalize_advantage: false,
            reduction: Reduction::Mean,
            seed: 0,
            dtarg: 0.01,
            beta: 1.0,
            increment: 2.0,
            decrement: 0.5,
            samples_mc_kl: 1,
            check_finite: false,
        }
    }
}

impl PpoConfig {
    /// TorchRL's defaults (the same as [`Default`]).
    pub fn new() -> Self {
        PpoConfig::default()
    }

    setters! {
        /// Sets [`clip_epsilon`](Self::clip_epsilon).
        with_clip_epsilon(clip_epsilon: f64);
        /// Sets [`entropy_bonus`](Self::entropy_bonus).
        with_entropy_bonus(entropy_bonus: bool);
        /// Sets [`entropy_coeff`](Self::entropy_coeff).
        with_entropy_coeff(entropy_coeff: f64);
        /// Sets [`samples_mc_entropy`](Self::samples_mc_entropy).
        with_samples_mc_entropy(samples_mc_entropy: i64);
        /// Sets [`critic_coeff`](Self::critic_coeff).
        with_critic_coeff(critic_coeff: f64);
        /// Sets [`loss_critic_type`](Self::loss_critic_type).
        with_loss_critic_type(loss_critic_type: CriticLossType);
        /// Sets [`clip_value`](Self::clip_value).
        with_clip_value(clip_value: Option<f64>);
        /// Sets [`normalize_advantage`](Self::normalize_advantage).
        with_normalize_advantage(normalize_advantage: bool);
        /// Sets [`reduction`](Self::reduction).
        with_reduction(reduction: Reduction);
        /// Sets [`seed`](Self::seed).
        with_seed(seed: u64);
        /// Sets [`dtarg`](Self::dtarg).
        with_dtarg(dtarg: f64);
        /// Sets [`beta`](Self::beta).
        with_beta(beta: f64);
        /// Sets [`increment`](Self::increment).
        with_increment(increment: f64);
        /// Sets [`decrement`](Self::decrement).
        with_decrement(decrement: f64);
        /// Sets [`samples_mc_kl`](Self::samples_mc_kl).
        with_samples_mc_kl(samples_mc_kl: i64);
        /// Sets [`check_finite`](Self::check_finite).
        with_check_finite(check_finite: bool);
    }

    /// Checks the fields every PPO loss reads; `op` names the loss in the error.
    pub fn validate_shared(&self, op: &'static str) -> Result<()> {
        non_negative(op, "entropy_coeff", self.entropy_coeff)?;
        non_negative(op, "critic_coeff", self.critic_coeff)?;
        at_least_one(op, "samples_mc_entropy", self.samples_mc_entropy)?;
        if let Some(v) = self.clip_value {
            if !v.is_finite() || v <= 0.0 {
                return Err(Error::config(op, "clip_value", "finite and > 0", v));
            }
        }
        Ok(())
    }

    /// Checks the fields of the clipped loss (the shared ones and `clip_epsilon`).
    pub fn validate_clip(&self, op: &'static str) -> Result<()> {
        self.validate_shared(op)?;
        let e = self.clip_epsilon;
        // ε ≥ 1 makes the lower bound ln(≤ 0), NaN in TorchRL
        if e.is_nan() || e <= 0.0 || e >= 1.0 {
            return Err(Error::config(op, "clip_epsilon", "in (0, 1)", e));
        }
        Ok(())
    }

    /// Checks the fields of the KL-penalty loss (the shared ones and the KL ones).
    pub fn validate_kl_pen(&self, op: &'static str) -> Result<()> {
        self.validate_shared(op)?;
        non_negative(op, "dtarg", self.dtarg)?;
        non_negative(op, "beta", self.beta)?;
        if !self.increment.is_finite() || self.increment < 1.0 {
            return Err(Error::config(
                op,
                "increment",
                "finite and >= 1.0",
                self.increment,
            ));
        }
        if self.decrement.is_nan() || !(0.0..=1.0).contains(&self.decrement) {
            return Err(Error::config(op, "decrement", "in [0, 1]", self.decrement));
        }
        at_least_one(op, "samples_mc_kl", self.samples_mc_kl)
    }
}

fn non_negative(op: &'static str, field: &'static str, v: f64) -> Result<()> {
    if v.is_finite() && v >= 0.0 {
        Ok(())
    } else {
        Err(Error::config(op, field, "finite and >= 0", v))
    }
}

fn at_least_one(op: &'static str, field: &'static str, n: i64) -> Result<()> {
    if n >= 1 {
        Ok(())
    } else {
        Err(Error::config(op, field, ">= 1", n))
    }
}
