//! GRPO (Group Relative Policy Optimization) on token-level data: the group advantages of
//! TorchRL's `MCAdvantage` and TRL's `GRPOTrainer`, and TorchRL's `GRPOLoss` token objective
//! with TRL's loss aggregations (rlhf.md §3.2, §4.4).
//!
//! - [`group_advantages`]: `(r − mean_group) / scale` with the scale a [`GroupScale`]
//!   (TorchRL's `std.clamp_min(1e-6)`, TRL's `std + 1e-4` per group or over the batch, or
//!   none).
//! - [`grpo_loss`]: `−min(ρ·A, clip(ρ)·A)` with the clamp done in log space
//!   (`log ρ ∈ [log1p(−ε_lo), log1p(ε_hi)]`, symmetric or DAPO's asymmetric ε), aggregated as a
//!   [`GrpoAggregation`], plus TorchRL's optional k3 KL to a reference and entropy bonus;
//!   typed [`GrpoLossOutput`] with TorchRL's names. Settings: [`GrpoConfig`].
//!   [`grpo_loss_with_entropy`] takes the exact per-token entropy (from [`token_entropy`]).
//! - [`GrpoLoss`]: the same as a [`LossModule`] over a rollout tensordict with TorchRL's keys
//!   ([`GrpoKeys`]), re-running the policy through a [`ScoreTokens`] (its values are
//!   ignored; its entropy is used when it gives one).
//!
//! Fidelity: `tests/grpo_dpo_recorded.rs` replays TorchRL's `GRPOLoss` / `MCAdvantage` and
//! TRL's `GRPOTrainer` loss and advantages (`specs/record_grpo_dpo.py`); where the references
//! differ from each other or from us, the item's docs say how.
//!
//! Tensors are full-length `[B, T]` (TorchRL's layout, as in [`super::ppo`]); the mask is the
//! assistant mask (1 on real response tokens).
//!
//! ```
//! use tch::Tensor;
//! use torchrl::objectives::llm::{group_advantages, grpo_loss, GroupScale, GrpoConfig};
//! use torchrl::objectives::LossOutput;
//! # fn main() -> torchrl::Result<()> {
//! // two prompts, two completions each, one scalar reward per completion
//! let r = Tensor::from_slice(&[1.0f64, 0.0, 0.0, 1.0]);
//! let adv = group_advantages(&r, 2, GroupScale::StdClampMin)?; // [B] = [4]
//! let t = |v: &[f64]| Tensor::from_slice(v).view([4, 2]);
//! let lp = t(&[-1.0; 8]).set_requires_grad(true);
//! let mask = t(&[1.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0]);
//! let out = grpo_loss(&lp, &t(&[-1.0; 8]), &adv, &mask, None, &GrpoConfig::new())?;
//! // at the rollout policy: nothing clipped, ESS 1
//! assert_eq!(out.clip_fraction.double_value(&[]), 0.0);
//! assert!((out.ess.double_value(&[]) - 1.0).abs() < 1e-12);
//! // TorchRL's default entropy bonus, here its Monte-Carlo estimate −lp = 1 per token
//! assert!((out.entropy.as_ref().unwrap().double_value(&[]) - 1.0).abs() < 1e-12);
//! out.total_loss()?.backward();
//! assert!(lp.grad().defined());
//! # Ok(()) }
//! ```

pub use crate::modules::llm::token_entropy;
use std::fmt;

use tch::{Kind, Tensor};

use super::gae::first_masked_column;
use super::masked::floating;
use super::ppo::read_bt;
use crate::error::{Error, Result, ShapeFmt};
use crate::modules::llm::keys::{
    ASSISTANT_MASK_KEY, ATTENTION_MASK_KEY, FULL_KEY, FULL_LOG_PROBS_KEY,
};
use crate::modules::llm::{ScoreRequest, ScoreTokens};
use crate::objectives::common::{LossModule, LossOutput};
use crate::tensordict::{NestedKey, TensorDict};

/// TorchRL `MCAdvantage`'s floor on the group std (`std.clamp_min(1e-6)`).
pub const MC_ADVANTAGE_STD_MIN: f64 = 1e-6;

/// TRL `GRPOTrainer`'s epsilon added to the std (`std + 1e-4`).
pub const TRL_STD_EPS: f64 = 1e-4;

// ------------------------------------------------------------------------------ advantages

/// How [`group_advantages`] scales the group-centred rewards `r − mean_group(r)`. Every std
/// is the unbiased one (`torch.std`; TRL's `nanstd`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GroupScale {
    /// `/ std_group.clamp_min(1e-6)`: TorchRL's `MCAdvantage`
    /// (`torchrl/objectives/llm/grpo.py`). The default.
    #[default]
    StdClampMin,
    /// `/ (std_group + 1e-4)`: TRL's `scale_rewards="group"` (its default).
    StdPlusEps,
    /// `/ (std_batch + 1e-4)`, the std of every reward of the batch: TRL's
    /// `scale_rewards="batch"` (the mean is still the group's).
    BatchStdPlusEps,
    /// No scaling, `r − mean_group`: TRL's `scale_rewards="none"` (Dr. GRPO).
    None,
}

/// GRPO's group-relative advantages: rewards of `G` groups of `group_size` consecutive
/// completions of one prompt (TRL's `rewards.view(-1, num_generations)`; TorchRL's
/// `MCAdvantage` writes one group at a time), centred on their group's mean and scaled as
/// `scale` says.
///
/// # Shapes
/// `rewards` `[B]` with `B = G · group_size` (a trailing `[B, 1]` is accepted); the output
/// has the input's shape and dtype, and is detached.
///
/// # Errors
/// When `rewards` is not floating point, not `[B]`/`[B, 1]`, `B` is not a positive multiple
/// of `group_size`, or a std is needed with fewer than 2 rewards to take it over.
///
/// ```
/// use tch::Tensor;
/// use torchrl::objectives::llm::{group_advantages, GroupScale};
/// // rlhf.md §5.8: one group, mean 0.5, unbiased std 0.5773502692
/// let r = Tensor::from_slice(&[1.0f64, 0.0, 0.0, 1.0]);
/// let torchrl = group_advantages(&r, 4, GroupScale::StdClampMin)?;
/// assert!((torchrl.double_value(&[0]) - 0.8660254038).abs() < 1e-10);
/// let trl = group_advantages(&r, 4, GroupScale::StdPlusEps)?;
/// assert!((trl.double_value(&[1]) + 0.8658754298).abs() < 1e-10);
/// assert!(group_advantages(&r, 3, GroupScale::None).is_err()); // 4 is not a multiple of 3
/// # Ok::<(), torchrl::Error>(())
/// ```
pub fn group_advantages(rewards: &Tensor, group_size: i64, scale: GroupScale) -> Result<Tensor> {
    const OP: &str = "group_advantages";
    floating(OP, "rewards", rewards)?;
    let size = rewards.size();
    let b = match size.as_slice() {
        [b] | [b, 1] => *b,
        _ => {
            return Err(Error::value(
                OP,
                "rewards",
                "a [B] or [B, 1] tensor",
                ShapeFmt(&size).to_string(),
            ))
        }
    };
    if group_size < 1 || b < 1 || b % group_size != 0 {
        return Err(Error::argument(
            OP,
            "group_size",
            format!("a positive divisor of the number of rewards ({b})"),
            group_size.to_string(),
        ));
    }
    let needs = match scale {
        GroupScale::StdClampMin | GroupScale::StdPlusEps => group_size,
        GroupScale::BatchStdPlusEps => b,
        GroupScale::None => 2,
    };
    if needs < 2 {
        return Err(Error::argument(
            OP,
            "group_size",
            format!("at least 2 rewards to take the std of for {scale:?}"),
            format!("{needs}"),
        ));
    }
    let _guard = tch::no_grad_guard();
    let grouped = rewards.f_detach()?.f_view([b / group_size, group_size])?;
    let mean = grouped.f_mean_dim(Some([1i64].as_slice()), true, None::<Kind>)?;
    let centred = grouped.f_sub(&mean)?;
    let group_std = || grouped.f_std_dim(Some([1i64].as_slice()), true, true);
    let adv = match scale {
        GroupScale::StdClampMin => {
            centred.f_div(&group_std()?.f_clamp_min(MC_ADVANTAGE_STD_MIN)?)?
        }
        GroupScale::StdPlusEps => centred.f_div(&group_std()?.f_add_scalar(TRL_STD_EPS)?)?,
        GroupScale::BatchStdPlusEps => {
            centred.f_div(&grouped.f_std(true)?.f_add_scalar(TRL_STD_EPS)?)?
        }
        GroupScale::None => centred,
    };
    Ok(adv.f_reshape(&size)?)
}

// ------------------------------------------------------------------------------ config

/// How [`grpo_loss`] reduces the per-token objective `ℓ[b, t]` (mask `m`, `n = Σ m`).
///
/// Within one batch `TokenMean`, `Bnpo` and `Dapo { active_tokens: None }` agree on the
/// objective, and so do `PromptMean` and `Grpo`; they are kept apart to name what each
/// reference calls them (TRL's differ across gradient accumulation and processes, which is
/// what `Dapo`'s and `DrGrpo`'s fields are for), and because the KL and entropy terms are
/// reduced as the named reference does it ([`grpo_loss_with_entropy`]): under `PromptMean`
/// the KL is a token mean (TorchRL), under `Grpo` a per-sequence mean like the objective (TRL).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum GrpoAggregation {
    /// `Σ ℓ·m / n`: TorchRL's `aggregation="token_mean"` (its default). The default.
    #[default]
    TokenMean,
    /// `mean_b(Σ_t ℓ·m / max(Σ_t m, 1))`: TorchRL's `"prompt_mean"`.
    PromptMean,
    /// No reduction: `ℓ·m` as `[B, T]` (0 outside the mask): TorchRL's `"none"`.
    None,
    /// TRL's `loss_type="grpo"`: per-sequence mean, then batch mean (the formula of
    /// `PromptMean`).
    Grpo,
    /// TRL's `"bnpo"`: token mean over the batch, `Σ ℓ·m / max(n, 1)`.
    Bnpo,
    /// TRL's `"dr_grpo"`: `Σ ℓ·m / (B · max_completion_length)`.
    DrGrpo {
        /// TRL's `max_completion_length`; `None` = the tensors' `T`.
        max_completion_length: Option<i64>,
    },
    /// TRL's `"dapo"` (its default): `Σ ℓ·m / N`, `N` the active tokens of the global
    /// accumulated batch.
    Dapo {
        /// `N` (TRL's `num_items_in_batch`); `None` = this batch's `n`.
        active_tokens: Option<f64>,
    },
}

impl GrpoAggregation {
    /// The reference's name (`"token_mean"`, …, `"dapo"`).
    pub fn name(&self) -> &'static str {
        match self {
            GrpoAggregation::TokenMean => "token_mean",
            GrpoAggregation::PromptMean => "prompt_mean",
            GrpoAggregation::None => "none",
            GrpoAggregation::Grpo => "grpo",
            GrpoAggregation::Bnpo => "bnpo",
            GrpoAggregation::DrGrpo { .. } => "dr_grpo",
            GrpoAggregation::Dapo { .. } => "dapo",
        }
    }

    /// Whether this is one of TRL's `loss_type`s (`Grpo`, `Bnpo`, `DrGrpo`, `Dapo`) rather
    /// than one of TorchRL's aggregations.
    pub fn is_trl(&self) -> bool {
        !matches!(
            self,
            GrpoAggregation::TokenMean | GrpoAggregation::PromptMean | GrpoAggregation::None
        )
    }
}

/// The settings of [`grpo_loss`] / [`GrpoLoss`], with TorchRL `GRPOLoss`'s defaults
/// (`clip_epsilon=0.2`, `aggregation="token_mean"`, `kl_to_ref_coeff=None`,
/// `entropy_bonus=True` with `entropy_coeff=0.01`).
///
/// TRL's `GRPOConfig` differs: `beta=0.0` (no KL), `entropy_coef=0.0` (no entropy bonus),
/// `loss_type="dapo"`; `GrpoConfig::new().with_entropy_coeff(None).with_aggregation(
/// GrpoAggregation::Dapo { active_tokens: None })` is TRL's.
///
/// The setters do not check; [`grpo_loss`] and [`GrpoLoss::with_config`] call
/// [`validate`](Self::validate).
///
/// ```
/// use torchrl::objectives::llm::{GrpoAggregation, GrpoConfig};
/// // DAPO: asymmetric clip, token-level sum over the active tokens
/// let cfg = GrpoConfig::new()
///     .with_clip_epsilon_asymmetric(0.20, 0.28)
///     .with_aggregation(GrpoAggregation::Dapo { active_tokens: None });
/// assert_eq!((cfg.clip_epsilon_low, cfg.clip_epsilon_high), (0.20, 0.28));
/// assert!(cfg.validate().is_ok());
/// let err = GrpoConfig::new().with_clip_epsilon(1.0).validate().unwrap_err();
/// assert!(matches!(err, torchrl::Error::InvalidConfig { field: "clip_epsilon_low", .. }));
/// // TorchRL's entropy bonus is on by default; TRL's is off
/// assert_eq!(GrpoConfig::new().entropy_coeff, Some(0.01));
/// assert_eq!(GrpoConfig::new().with_entropy_coeff(None).entropy_coeff, None);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct GrpoConfig {
    /// `ε_lo`: `log ρ ≥ log1p(−ε_lo)`; in `(0, 1)`. Default 0.2.
    pub clip_epsilon_low: f64,
    /// `ε_hi`: `log ρ ≤ log1p(ε_hi)`; finite, `> 0`. Default 0.2 (DAPO: 0.28).
    pub clip_epsilon_high: f64,
    /// The reduction of the token objective. Default [`GrpoAggregation::TokenMean`].
    pub aggregation: GrpoAggregation,
    /// TorchRL's `kl_to_ref_coeff` (TRL's `beta`): when set, `loss_kl_to_ref = coeff · k3`
    /// reduced as [`grpo_loss_with_entropy`] says is a loss term and the reference log-probs
    /// are required; finite, `>= 0`. Default `None`.
    pub kl_to_ref_coeff: Option<f64>,
    /// The entropy bonus `loss_entropy = −coeff · H` (TorchRL's `entropy_bonus=True` with
    /// `entropy_coeff`, TRL's `entropy_coef`), `None` = off; finite, `>= 0`. Default
    /// `Some(0.01)`, TorchRL's default (its `entropy_bonus` defaults to `True`), so a TorchRL
    /// user's loss is the same here; TRL's default is off (`entropy_coef=0.0`). `H` is the
    /// exact per-token entropy of the policy's softmax when the policy gives it
    /// ([`grpo_loss_with_entropy`], [`ScoreRequest::entropy`]), otherwise
    /// a one-sample Monte-Carlo estimate (see [`grpo_loss_with_entropy`]).
    pub entropy_coeff: Option<f64>,
}

impl Default for GrpoConfig {
    fn default() -> Self {
        GrpoConfig {
            clip_epsilon_low: 0.2,
            clip_epsilon_high: 0.2,
            aggregation: GrpoAggregation::TokenMean,
            kl_to_ref_coeff: None,
            entropy_coeff: Some(0.01),
        }
    }
}

impl GrpoConfig {
    /// The defaults.
    pub fn new() -> Self {
        Self::default()
    }

    /// A symmetric clip, `ε_lo = ε_hi = eps` (TorchRL's `clip_epsilon=eps`).
    pub fn with_clip_epsilon(mut self, eps: f64) -> Self {
        self.clip_epsilon_low = eps;
        self.clip_epsilon_high = eps;
        self
    }

    /// An asymmetric clip (TorchRL's `clip_epsilon=(lo, hi)`, TRL's `epsilon`/`epsilon_high`;
    /// DAPO recommends `(0.20, 0.28)`).
    pub fn with_clip_epsilon_asymmetric(mut self, low: f64, high: f64) -> Self {
        self.clip_epsilon_low = low;
        self.clip_epsilon_high = high;
        self
    }

    /// Sets [`aggregation`](Self::aggregation).
    pub fn with_aggregation(mut self, aggregation: GrpoAggregation) -> Self {
        self.aggregation = aggregation;
        self
    }

    /// Sets [`kl_to_ref_coeff`](Self::kl_to_ref_coeff).
    pub fn with_kl_to_ref_coeff(mut self, coeff: Option<f64>) -> Self {
        self.kl_to_ref_coeff = coeff;
        self
    }

    /// Sets [`entropy_coeff`](Self::entropy_coeff) (`None` turns the entropy bonus off).
    pub fn with_entropy_coeff(mut self, coeff: Option<f64>) -> Self {
        self.entropy_coeff = coeff;
        self
    }

    /// Checks every field.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the first field out of range.
    pub fn validate(&self) -> Result<()> {
        const OP: &str = "GrpoConfig";
        let lo = self.clip_epsilon_low;
        if !(lo > 0.0 && lo < 1.0) {
            return Err(Error::config(OP, "clip_epsilon_low", "in (0, 1)", lo));
        }
        let hi = self.clip_epsilon_high;
        if !(hi.is_finite() && hi > 0.0) {
            return Err(Error::config(OP, "clip_epsilon_high", "finite and > 0", hi));
        }
        if let Some(c) = self.kl_to_ref_coeff {
            if !(c.is_finite() && c >= 0.0) {
                return Err(Error::config(OP, "kl_to_ref_coeff", "finite and >= 0", c));
            }
        }
        if let Some(c) = self.entropy_coeff {
            if !(c.is_finite() && c >= 0.0) {
                return Err(Error::config(OP, "entropy_coeff", "finite and >= 0", c));
            }
        }
        match self.aggregation {
            GrpoAggregation::DrGrpo {
                max_completion_length: Some(l),
            } if l < 1 => Err(Error::config(
                OP,
                "aggregation",
                "max_completion_length >= 1",
                l,
            )),
            GrpoAggregation::Dapo {
                active_tokens: Some(n),
            } if !(n.is_finite() && n > 0.0) => Err(Error::config(
                OP,
                "aggregation",
                "active_tokens finite and > 0",
                n,
            )),
            _ => Ok(()),
        }
    }
}

// ------------------------------------------------------------------------------ loss

/// The output of [`grpo_loss`] / [`GrpoLoss`], with TorchRL `GRPOLossOutput`'s names.
///
/// The differentiable terms ([`LossOutput::loss_terms`], summed by `total_loss`) are
/// `loss_objective`, `loss_entropy` (when [`GrpoConfig::entropy_coeff`] is set) and
/// `loss_kl_to_ref` (when [`GrpoConfig::kl_to_ref_coeff`] is set); the other fields are
/// detached means over the `n = Σ mask` tokens.
///
/// # Differences from the references
/// - TorchRL's `GRPOLoss` logs `clip_fraction`, `kl_approx`, `entropy` and `kl_to_ref`, and
///   computes its `loss_kl_to_ref` term, as the mean over **every** position of its `[B, T]`
///   tensors, the zeroed prompt and padding positions included: each of those is ours times
///   `n / (B·T)`, so TorchRL's shrink as prompts and padding grow. Ours are over the response
///   tokens only, as TRL's metrics are (`loss_objective`, `loss_entropy` and `ESS` are
///   TorchRL's exactly). TorchRL's KL term is ours with `kl_to_ref_coeff · n / (B·T)`.
/// - TRL logs `clip_ratio/region_mean`, the fraction of tokens whose clamp is active in the
///   gradient (`ρ < 1 − ε_lo` with `A < 0`, or `ρ > 1 + ε_hi` with `A > 0`);
///   `clip_fraction` counts every clamped token (TorchRL's definition), so it is at least
///   TRL's.
///
/// # Shapes
/// Every field `[]`, except `loss_objective` and `loss_entropy` under
/// [`GrpoAggregation::None`] (`[B, T]`).
#[derive(Debug)]
pub struct GrpoLossOutput {
    /// The aggregated `−min(ρ·A, clip(ρ)·A)`.
    pub loss_objective: Tensor,
    /// The fraction of tokens whose log-ratio is clamped.
    pub clip_fraction: Tensor,
    /// TorchRL's `kl_approx`: the k1 estimate `mean(lp_old − lp)`.
    pub kl_approx: Tensor,
    /// TorchRL's `ESS` (logged under that name):
    /// `exp(2·logsumexp(lw) − logsumexp(2·lw)) / n`, 1 when every weight is equal.
    pub ess: Tensor,
    /// The mean per-token entropy `Σ H·m / n` (detached; TRL's logged `entropy`), when the
    /// entropy bonus is on or an entropy was given.
    pub entropy: Option<Tensor>,
    /// `−entropy_coeff · H` reduced as [`grpo_loss_with_entropy`] says, when
    /// [`GrpoConfig::entropy_coeff`] is set.
    pub loss_entropy: Option<Tensor>,
    /// `kl_to_ref_coeff · k3` reduced as [`grpo_loss_with_entropy`] says, when
    /// [`GrpoConfig::kl_to_ref_coeff`] is set.
    pub loss_kl_to_ref: Option<Tensor>,
    /// The k3 KL to the reference `mean(expm1(ref − lp) − (ref − lp))` (detached; TRL's logged
    /// `kl`), when reference log-probs were given.
    pub kl_to_ref: Option<Tensor>,
}

impl LossOutput for GrpoLossOutput {
    fn loss_terms(&self) -> Vec<(&'static str, &Tensor)> {
        let mut terms = vec![("loss_objective", &self.loss_objective)];
        if let Some(t) = &self.loss_entropy {
            terms.push(("loss_entropy", t));
        }
        if let Some(t) = &self.loss_kl_to_ref {
            terms.push(("loss_kl_to_ref", t));
        }
        terms
    }

    fn metrics(&self) -> Vec<(&'static str, &Tensor)> {
        let mut m = vec![
            ("clip_fraction", &self.clip_fraction),
            ("kl_approx", &self.kl_approx),
            ("ESS", &self.ess),
        ];
        if let Some(t) = &self.entropy {
            m.push(("entropy", t));
        }
        if let Some(t) = &self.kl_to_ref {
            m.push(("kl_to_ref", t));
        }
        m
    }
}

fn check_shape(op: &'static str, key: &str, t: &Tensor, shape: &[i64]) -> Result<()> {
    if t.size() == shape {
        Ok(())
    } else {
        Err(Error::ShapeMismatch {
            op,
            key: key.into(),
            expected: shape.to_vec(),
            actual: t.size(),
        })
    }
}

/// The advantages as `[B, 1]` or `[B, T]` (from `[B]`, `[B, 1]`, `[B, 1, 1]`, `[B, T]` or
/// `[B, T, 1]`).
fn advantages_2d(op: &'static str, adv: &Tensor, b: i64, t: i64) -> Result<Tensor> {
    let size = adv.size();
    match size.as_slice() {
        [x] if *x == b => Ok(adv.f_view([b, 1])?),
        [x, 1] if *x == b => Ok(adv.shallow_clone()),
        [x, 1, 1] if *x == b => Ok(adv.f_view([b, 1])?),
        [x, y] if *x == b && *y == t => Ok(adv.shallow_clone()),
        [x, y, 1] if *x == b && *y == t => Ok(adv.f_view([b, t])?),
        _ => Err(Error::value(
            op,
            "advantages",
            format!("[{b}], [{b}, 1], [{b}, 1, 1], [{b}, {t}] or [{b}, {t}, 1]"),
            ShapeFmt(&size).to_string(),
        )),
    }
}

/// TorchRL's `GRPOLoss` token objective (rlhf.md §4.4), with TRL's aggregations (§3.2),
/// without an exact entropy: [`grpo_loss_with_entropy`] with `entropy = None` (so the entropy
/// bonus, on by default, uses its Monte-Carlo estimate).
///
/// # Shapes
/// `log_probs`, `old_log_probs`, `mask`, `ref_log_probs`: `[B, T]`; `advantages` `[B]`
/// (one per sequence, broadcast over tokens), `[B, 1]`, `[B, 1, 1]`, `[B, T]` or
/// `[B, T, 1]`. See [`GrpoLossOutput`].
///
/// # Errors
/// As [`grpo_loss_with_entropy`].
///
/// ```
/// use tch::Tensor;
/// use torchrl::objectives::llm::{grpo_loss, GrpoAggregation, GrpoConfig};
/// # fn main() -> torchrl::Result<()> {
/// // rlhf.md §5.8: log-ratio [0.3, −0.3, 0.05], A [1, −1, −1], ε = 0.2
/// let old = Tensor::from_slice(&[-1.0f64, -1.0, -1.0]).view([1, 3]);
/// let lp = old.f_add(&Tensor::from_slice(&[0.3f64, -0.3, 0.05]).view([1, 3]))?;
/// let adv = Tensor::from_slice(&[1.0f64, -1.0, -1.0]).view([1, 3]);
/// let mask = Tensor::from_slice(&[1i64, 1, 1]).view([1, 3]);
/// let out = grpo_loss(&lp, &old, &adv, &mask, None, &GrpoConfig::new())?;
/// assert!((out.loss_objective.double_value(&[]) - 0.2170903655).abs() < 1e-10);
/// assert!((out.clip_fraction.double_value(&[]) - 2.0 / 3.0).abs() < 1e-12);
/// let per_token = GrpoConfig::new().with_aggregation(GrpoAggregation::None);
/// let l = grpo_loss(&lp, &old, &adv, &mask, None, &per_token)?.loss_objective;
/// assert!((l.double_value(&[0, 2]) - 1.0512710964).abs() < 1e-10);
/// # Ok(()) }
/// ```
pub fn grpo_loss(
    log_probs: &Tensor,
    old_log_probs: &Tensor,
    advantages: &Tensor,
    mask: &Tensor,
    ref_log_probs: Option<&Tensor>,
    config: &GrpoConfig,
) -> Result<GrpoLossOutput> {
    grpo_loss_with_entropy(
        log_probs,
        old_log_probs,
        advantages,
        mask,
        ref_log_probs,
        None,
        config,
    )
}

/// TorchRL's `GRPOLoss` (rlhf.md §4.4) with TRL's aggregations (§3.2), an optional k3 KL to
/// a reference and an optional entropy bonus:
///
/// ```text
/// lw       = lp − lp_old                         (on masked tokens)
/// lw_clip  = clamp(lw, log1p(−ε_lo), log1p(ε_hi))
/// ℓ        = −min(exp(lw)·A, exp(lw_clip)·A)
/// loss_objective = aggregate(ℓ, mask)                          (GrpoAggregation)
/// loss_entropy   = −entropy_coeff · reduce_H(H)
/// loss_kl_to_ref = kl_to_ref_coeff · reduce_KL(k3),  k3 = expm1(ref − lp) − (ref − lp)
/// ```
///
/// How the two extra terms are reduced follows the reference each aggregation is named after:
///
/// - TorchRL's `TokenMean`, `PromptMean`, `None`: `reduce_H` is the objective's aggregation
///   (TorchRL aggregates every `loss_*` term), `reduce_KL` the masked token mean;
/// - TRL's `Grpo`, `Bnpo`, `DrGrpo`, `Dapo`: `reduce_H` is the masked token mean (TRL's
///   bonus is the mean per-token entropy whatever the loss type), `reduce_KL` the
///   objective's aggregation (TRL adds `β·k3` to the per-token loss before reducing it);
///
/// so under TRL's names the total is TRL's `GRPOTrainer` loss (of one micro-batch on one
/// process, before gradient-accumulation scaling), and under TorchRL's it is TorchRL's, up
/// to TorchRL's KL term (see [`GrpoLossOutput`]).
///
/// `H` is `entropy` `[B, T]` when given: the exact per-token entropy of the policy's softmax
/// ([`token_entropy`]), differentiable. Without it, the entropy bonus uses the one-sample
/// Monte-Carlo estimate `H ≈ −lp` at the rollout's tokens. TorchRL's fallback (for
/// distributions without a closed-form entropy, `samples_mc_entropy=1`) is also `−log π` of
/// one sample, but draws the sample afresh from the current policy, which takes the logits;
/// the rollout's token was drawn from the rollout policy, so `−lp` estimates the entropy there
/// (exactly in expectation when `π = π_old`, the first epoch). As TorchRL's, its gradient is
/// the score `−∇lp`, zero in expectation under the sampling policy: it logs the entropy well
/// but barely regularises. Give the exact entropy to regularise.
///
/// `old_log_probs`, `advantages` and `ref_log_probs` are detached. Masked-out positions take
/// no part even when they hold NaN. `ref_log_probs` is required when
/// [`GrpoConfig::kl_to_ref_coeff`] is set; given without it, only `kl_to_ref` is logged (and
/// likewise `entropy` for an entropy given with the bonus off).
///
/// # Shapes
/// `log_probs`, `old_log_probs`, `mask`, `ref_log_probs`, `entropy`: `[B, T]`; `advantages`
/// `[B]` (one per sequence, broadcast over tokens), `[B, 1]`, `[B, 1, 1]`, `[B, T]` or
/// `[B, T, 1]`. See [`GrpoLossOutput`].
///
/// # Errors
/// When shapes differ or are not 2-D, a tensor other than the mask is not floating point,
/// the mask is all zero, `ref_log_probs` is missing while a KL coefficient is set, or the
/// config is invalid.
///
/// ```
/// use tch::{Kind, Tensor};
/// use torchrl::objectives::llm::{grpo_loss_with_entropy, token_entropy, GrpoConfig};
/// use torchrl::objectives::LossOutput;
/// # fn main() -> torchrl::Result<()> {
/// // uniform logits over V = 8 tokens: H = log 8 on each of the 2 response tokens
/// let logits = Tensor::zeros([1, 3, 8], (Kind::Double, tch::Device::Cpu)).set_requires_grad(true);
/// let h = token_entropy(&logits, None)?;
/// let lp = Tensor::full([1, 3], -(8f64.ln()), (Kind::Double, tch::Device::Cpu));
/// let mask = Tensor::from_slice(&[0.0f64, 1.0, 1.0]).view([1, 3]);
/// let adv = Tensor::from_slice(&[1.0f64]);
/// let cfg = GrpoConfig::new().with_entropy_coeff(Some(0.5));
/// let out = grpo_loss_with_entropy(&lp, &lp, &adv, &mask, None, Some(&h), &cfg)?;
/// assert!((out.entropy.as_ref().unwrap().double_value(&[]) - 8f64.ln()).abs() < 1e-12);
/// let bonus = out.loss_entropy.as_ref().unwrap().double_value(&[]);
/// assert!((bonus + 0.5 * 8f64.ln()).abs() < 1e-12);
/// out.total_loss()?.backward(); // the entropy's gradient reaches the logits
/// assert!(logits.grad().defined());
/// # Ok(()) }
/// ```
pub fn grpo_loss_with_entropy(
    log_probs: &Tensor,
    old_log_probs: &Tensor,
    advantages: &Tensor,
    mask: &Tensor,
    ref_log_probs: Option<&Tensor>,
    entropy: Option<&Tensor>,
    config: &GrpoConfig,
) -> Result<GrpoLossOutput> {
    const OP: &str = "grpo_loss";
    config.validate()?;
    let shape = log_probs.size();
    let [b, t] = shape.as_slice() else {
        return Err(Error::value(
            OP,
            "log_probs",
            "a [B, T] tensor",
            ShapeFmt(&shape).to_string(),
        ));
    };
    let (b, t) = (*b, *t);
    check_shape(OP, "old_log_probs", old_log_probs, &shape)?;
    check_shape(OP, "mask", mask, &shape)?;
    floating(OP, "log_probs", log_probs)?;
    floating(OP, "old_log_probs", old_log_probs)?;
    floating(OP, "advantages", advantages)?;
    if let Some(r) = ref_log_probs {
        check_shape(OP, "ref_log_probs", r, &shape)?;
        floating(OP, "ref_log_probs", r)?;
    }
    if let Some(h) = entropy {
        check_shape(OP, "entropy", h, &shape)?;
        floating(OP, "entropy", h)?;
    }
    if config.kl_to_ref_coeff.is_some() && ref_log_probs.is_none() {
        return Err(Error::invalid(
            OP,
            "kl_to_ref_coeff is set but no ref_log_probs were given",
        ));
    }
    let adv = advantages_2d(OP, advantages, b, t)?.f_detach()?;
    let keep = mask.f_ne(0)?;
    let n_tokens = keep.f_count_nonzero(None::<i64>)?.int64_value(&[]);
    if n_tokens == 0 {
        return Err(Error::value(
            OP,
            "mask",
            "at least one response token",
            format!("an all-zero mask of shape {}", ShapeFmt(&shape)),
        ));
    }
    let kind = log_probs.kind();
    let m = keep.f_to_kind(kind)?;
    let n = m.f_sum(None::<Kind>)?;
    let z = |x: &Tensor| x.f_where_scalarother(&keep, 0.0);
    let lp = z(log_probs)?;
    let olp = z(&old_log_probs.f_detach()?)?;
    let adv = z(&adv.f_to_kind(kind)?.f_expand(&shape, false)?)?;
    let masked_mean =
        |x: &Tensor| -> Result<Tensor> { Ok(x.f_mul(&m)?.f_sum(None::<Kind>)?.f_div(&n)?) };
    // the aggregation of a per-token tensor that is 0 outside the mask
    let aggregate = |x: &Tensor| -> Result<Tensor> {
        let total = || x.f_sum(None::<Kind>);
        Ok(match config.aggregation {
            GrpoAggregation::TokenMean | GrpoAggregation::Bnpo => total()?.f_div(&n)?,
            GrpoAggregation::PromptMean | GrpoAggregation::Grpo => {
                let dim = Some([1i64].as_slice());
                let lens = m
                    .f_sum_dim_intlist(dim, false, None::<Kind>)?
                    .f_clamp_min(1.0)?;
                x.f_sum_dim_intlist(dim, false, None::<Kind>)?
                    .f_div(&lens)?
                    .f_mean(None::<Kind>)?
            }
            GrpoAggregation::None => x.shallow_clone(),
            GrpoAggregation::DrGrpo {
                max_completion_length,
            } => total()?.f_div_scalar((b * max_completion_length.unwrap_or(t)) as f64)?,
            GrpoAggregation::Dapo { active_tokens } => match active_tokens {
                Some(n_global) => total()?.f_div_scalar(n_global)?,
                None => total()?.f_div(&n)?,
            },
        })
    };
    let trl_named = config.aggregation.is_trl();

    let lw = lp.f_sub(&olp)?;
    let (lo, hi) = (
        (-config.clip_epsilon_low).ln_1p(),
        config.clip_epsilon_high.ln_1p(),
    );
    let lw_clip = lw.f_clamp(lo, hi)?;
    let gain = lw.f_exp()?.f_mul(&adv)?;
    let gain_clip = lw_clip.f_exp()?.f_mul(&adv)?;
    let per_token = gain.f_minimum(&gain_clip)?.f_neg()?.f_mul(&m)?;
    let loss_objective = aggregate(&per_token)?;

    let h = match (entropy, config.entropy_coeff) {
        (Some(h), _) => Some(z(&h.f_to_kind(kind)?)?.f_mul(&m)?),
        // the one-sample Monte-Carlo estimate at the rollout's tokens
        (None, Some(_)) => Some(lp.f_neg()?.f_mul(&m)?),
        (None, None) => None,
    };
    let (loss_entropy, entropy_mean) = match h {
        Some(h) => {
            let loss = match config.entropy_coeff {
                Some(c) if trl_named => Some(masked_mean(&h)?.f_mul_scalar(-c)?),
                Some(c) => Some(aggregate(&h)?.f_mul_scalar(-c)?),
                None => None,
            };
            (loss, Some(masked_mean(&h)?.f_detach()?))
        }
        None => (None, None),
    };

    let (loss_kl_to_ref, kl_to_ref) = match ref_log_probs {
        Some(r) => {
            let d = z(&r.f_detach()?.f_to_kind(kind)?)?.f_sub(&lp)?;
            let k3 = d.f_expm1()?.f_sub(&d)?.f_mul(&m)?;
            let kl = masked_mean(&k3)?;
            let loss = match config.kl_to_ref_coeff {
                Some(c) if trl_named => Some(aggregate(&k3)?.f_mul_scalar(c)?),
                Some(c) => Some(kl.f_mul_scalar(c)?),
                None => None,
            };
            (loss, Some(kl.f_detach()?))
        }
        None => (None, None),
    };

    let _guard = tch::no_grad_guard();
    let lw_d = lw.f_detach()?;
    let clipped = lw_d.f_ne_tensor(&lw_clip.f_detach()?)?.f_to_kind(kind)?;
    let neg_inf = |x: &Tensor| x.f_where_scalarother(&keep, f64::NEG_INFINITY);
    let dims = [0i64, 1];
    let lse1 = neg_inf(&lw_d)?.f_logsumexp(dims, false)?;
    let lse2 = neg_inf(&lw_d.f_mul_scalar(2.0)?)?.f_logsumexp(dims, false)?;
    let ess = lse1
        .f_mul_scalar(2.0)?
        .f_sub(&lse2)?
        .f_exp()?
        .f_div_scalar(n_tokens as f64)?;
    Ok(GrpoLossOutput {
        loss_objective,
        clip_fraction: masked_mean(&clipped)?,
        kl_approx: masked_mean(&lw_d.f_neg()?)?,
        ess,
        entropy: entropy_mean,
        loss_entropy,
        loss_kl_to_ref,
        kl_to_ref,
    })
}

// ------------------------------------------------------------------------------ loss module

crate::accepted_keys! {
    /// The keys of [`GrpoLoss`] (TorchRL `GRPOLoss`'s `_AcceptedKeys`, plus the masks of
    /// its LLM layout, rlhf.md §4.1).
    pub struct GrpoKeys {
        /// The advantages, `[B]`, `[B, 1]`, `[B, T]` or `[B, T, 1]`. Default `"advantage"`.
        advantage: "advantage",
        /// The prompt and response token ids `[B, T]` (int64). Default `("tokens", "full")`.
        action: FULL_KEY,
        /// The rollout policy's log-probs `[B, T]`. Default `("log_probs", "full")`.
        sample_log_prob: FULL_LOG_PROBS_KEY,
        /// The reference log-probs `[B, T]`, read only when a KL coefficient is set. Default
        /// `("next", "ref_log_probs", "full")`.
        ref_log_probs: ("next", "ref_log_probs", "full"),
        /// 1 on every real token, given to the policy. Default
        /// `("masks", "all_attention_mask")`.
        attention_mask: ATTENTION_MASK_KEY,
        /// 1 on real response tokens: the mask of every term. Default
        /// `("masks", "all_assistant_mask")`.
        assistant_mask: ASSISTANT_MASK_KEY,
    }
}

/// TorchRL's `GRPOLoss` as a [`LossModule`]: reads a rollout through [`GrpoKeys`], re-runs
/// the policy on the tokens ([`ScoreTokens`]; the values it returns are ignored) and
/// returns [`grpo_loss_with_entropy`]'s [`GrpoLossOutput`].
///
/// With the entropy bonus on ([`GrpoConfig::entropy_coeff`], TorchRL's default) the policy is
/// run through [`ScoreRequest::entropy`]: a policy that gives the exact
/// per-token entropy from the same forward pass ([`CausalLmWithValueHead`],
/// [`CausalLmWithHydraValueHead`]; TorchRL's closed-form `LLMMaskedCategorical.entropy`) gets
/// the exact bonus, any other (a closure [`ScoreFn`]) the Monte-Carlo estimate
/// [`grpo_loss_with_entropy`] describes.
///
/// Not ported: TorchRL's `kl_mask_threshold`, `kl_to_inference` and the `masking_strategy`
/// choice (the assistant mask is always used).
///
/// [`CausalLmWithValueHead`]: crate::modules::llm::CausalLmWithValueHead
/// [`CausalLmWithHydraValueHead`]: crate::modules::llm::CausalLmWithHydraValueHead
/// [`ScoreFn`]: crate::modules::llm::ScoreFn
///
/// # Keys
/// `in_keys()` = `action`, `attention_mask`, `assistant_mask`, `sample_log_prob`,
/// `advantage`, plus `ref_log_probs` when a KL coefficient is set; settable with
/// [`LossModule::set_keys`].
///
/// ```
/// use tch::{Kind, Tensor};
/// use torchrl::modules::llm::ScoreFn;
/// use torchrl::objectives::llm::GrpoLoss;
/// use torchrl::objectives::{LossModule, LossOutput};
/// use torchrl::TensorDict;
/// # fn main() -> torchrl::Result<()> {
/// let theta = Tensor::from_slice(&[0.0f64, -1.0, -1.0]).view([1, 3]).set_requires_grad(true);
/// let th = theta.shallow_clone();
/// let policy = ScoreFn(move |_t: &Tensor, _m: &Tensor| Ok((th.shallow_clone(), None)));
/// let mut loss = GrpoLoss::new(policy);
/// let row = |v: &[f64]| Tensor::from_slice(v).view([1, 3]);
/// let td = TensorDict::new([1])?
///     .with(("tokens", "full"), Tensor::from_slice(&[5i64, 6, 7]).view([1, 3]))?
///     .with(("masks", "all_attention_mask"), Tensor::ones([1, 3], (Kind::Int64, tch::Device::Cpu)))?
///     .with(("masks", "all_assistant_mask"), row(&[0.0, 1.0, 1.0]))?
///     .with(("log_probs", "full"), row(&[0.0, -1.0, -1.0]))?
///     .with("advantage", Tensor::from_slice(&[0.5f64]))?;
/// let out = loss.forward(&td)?;
/// assert!((out.loss_objective.double_value(&[]) + 0.5).abs() < 1e-12);
/// out.total_loss()?.backward();
/// assert!(theta.grad().defined());
/// loss.set_keys(&[("advantage", Some("adv".into()))])?;
/// assert!(loss.forward(&td).is_err()); // "adv" is not there
/// # Ok(()) }
/// ```
pub struct GrpoLoss<M> {
    model: M,
    config: GrpoConfig,
    keys: GrpoKeys,
    in_keys: Vec<NestedKey>,
}

impl<M> fmt::Debug for GrpoLoss<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GrpoLoss")
            .field("config", &self.config)
            .field("keys", &self.keys)
            .finish_non_exhaustive()
    }
}

impl<M: ScoreTokens> GrpoLoss<M> {
    /// A loss over `model` with the default [`GrpoConfig`] and keys.
    pub fn new(model: M) -> Self {
        let keys = GrpoKeys::default();
        let config = GrpoConfig::default();
        GrpoLoss {
            model,
            in_keys: Self::compute_in_keys(&keys, &config),
            config,
            keys,
        }
    }

    /// Replaces the config, after [`GrpoConfig::validate`].
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the bad field.
    pub fn with_config(mut self, config: GrpoConfig) -> Result<Self> {
        config.validate()?;
        self.in_keys = Self::compute_in_keys(&self.keys, &config);
        self.config = config;
        Ok(self)
    }

    /// Builder form of [`LossModule::set_tensor_keys`].
    pub fn with_keys(mut self, keys: GrpoKeys) -> Self {
        self.in_keys = Self::compute_in_keys(&keys, &self.config);
        self.keys = keys;
        self
    }

    /// The config.
    pub fn config(&self) -> &GrpoConfig {
        &self.config
    }

    /// The policy.
    pub fn model(&self) -> &M {
        &self.model
    }

    fn compute_in_keys(keys: &GrpoKeys, config: &GrpoConfig) -> Vec<NestedKey> {
        let mut k = vec![
            keys.action.clone(),
            keys.attention_mask.clone(),
            keys.assistant_mask.clone(),
            keys.sample_log_prob.clone(),
            keys.advantage.clone(),
        ];
        if config.kl_to_ref_coeff.is_some() {
            k.push(keys.ref_log_probs.clone());
        }
        k
    }
}

impl<M: ScoreTokens> LossModule for GrpoLoss<M> {
    type Keys = GrpoKeys;
    type Output = GrpoLossOutput;

    fn name(&self) -> &'static str {
        "GrpoLoss"
    }

    fn tensor_keys(&self) -> &GrpoKeys {
        &self.keys
    }

    fn set_tensor_keys(&mut self, keys: GrpoKeys) -> Result<()> {
        self.in_keys = Self::compute_in_keys(&keys, &self.config);
        self.keys = keys;
        Ok(())
    }

    fn in_keys(&self) -> &[NestedKey] {
        &self.in_keys
    }

    fn forward(&self, td: &TensorDict) -> Result<GrpoLossOutput> {
        const OP: &str = "GrpoLoss";
        let k = &self.keys;
        let tokens = read_bt(OP, td, &k.action, None)?;
        let shape = tokens.size();
        let s = Some(shape.as_slice());
        let attention_mask = read_bt(OP, td, &k.attention_mask, s)?;
        let mask = read_bt(OP, td, &k.assistant_mask, s)?;
        let old_log_probs = read_bt(OP, td, &k.sample_log_prob, s)?;
        let advantages = td.get_or_err(&k.advantage)?;
        let ref_log_probs = match self.config.kl_to_ref_coeff {
            Some(_) => Some(read_bt(OP, td, &k.ref_log_probs, s)?),
            None => None,
        };
        // the LM head runs from the first response token on (TRL's `logits_to_keep`): the
        // loss reads no position before it
        let request = ScoreRequest {
            values: false,
            entropy: self.config.entropy_coeff.is_some(),
            scored_from: first_masked_column(&mask)?,
        };
        let scores = self.model.score_tokens(&tokens, &attention_mask, request)?;
        let (log_probs, entropy) = (scores.log_probs, scores.entropy);
        check_shape(OP, "policy log_probs", &log_probs, &shape)?;
        if let Some(h) = &entropy {
            check_shape(OP, "policy entropy", h, &shape)?;
        }
        grpo_loss_with_entropy(
            &log_probs,
            &old_log_probs,
            advantages,
            &mask,
            ref_log_probs.as_ref(),
            entropy.as_ref(),
            &self.config,
        )
    }
}
