//! PPO for RLHF on token-level data (trlX's `PPOConfig.loss` and
//! `get_advantages_and_returns`, TRL's masked statistics), in TorchRL's full-length layout.
//!
//! - Masked statistics: [`masked_mean`], [`masked_var`] (unbiased, Bessel as TRL),
//!   [`masked_whiten`] (TRL's `masked_whiten`, padding set to 0), and [`whiten`] (trlX's
//!   whole-tensor form, kept to show what the reference computes).
//! - [`gae_advantages_and_returns`]: GAE over tokens, restricted to the response mask.
//! - [`ppo_rlhf_loss`]: the clipped policy and clipped value loss of trlX with masks, as a
//!   typed [`PpoRlhfLossOutput`]; its settings are a [`PpoRlhfConfig`] (trlX HEAD defaults).
//! - [`PpoRlhfLoss`]: the same as a [`LossModule`] reading a rollout tensordict through
//!   settable [`PpoRlhfKeys`] and re-running the current policy and value through a
//!   [`ScoreTokens`] (implemented for [`CausalLmWithValueHead`] and
//!   [`CausalLmWithHydraValueHead`]); [`compute_ppo_rlhf_advantages`] writes the advantages
//!   and returns into the tensordict first.
//!
//! # Layout and its alignment with trlX's indices
//! Every tensor is full-length `[B, T]`, aligned with the tokens `("tokens", "full")`
//! (TorchRL's layout): the prompt is left-padded to `P` columns, the response right-padded to
//! `R`, `T = P + R`. The mask is the assistant (response) mask: 1 on real response tokens,
//! EOS included, 0 on the prompt and on padding.
//!
//! | quantity at column `t` (here) | meaning | trlX (response-sliced `[B, R]`, `i = t − P`) |
//! |---|---|---|
//! | `tokens[t]` | the token | `response[i]` |
//! | `log_probs[t]` | `log p(token[t] \| tokens < t)` | `logprobs[:, P−1:P−1+R][i]` (trlX's `logprobs[j]` is the log-prob of token `j+1`) |
//! | `values[t]` | `V(state before token t)` = the value head's output at `t − 1` | `values[:, :-1][:, P−1:P−1+R][i]` = head output at `P − 1 + i` |
//! | `mask[t]` | response token | `attention_mask[:, start+1:end+1][i]` (the mask of the *predicted* token) |
//! | `rewards[t]` | `−β·k1[t]`, plus the score at the last response token | `rewards[i]` |
//!
//! So any trlX response tensor `x[:, i]` is our `x[:, P + i]`, and trlX's algebra on an
//! unpadded row is ours on the masked columns. The shift of the values by one column is done
//! once, by [`align_values_to_tokens`], on the rollout side and on the learner side
//! ([`ScoreTokens`]), so the old and new values of a column always name the same state.
//!
//! **Reference bug (trlX b623d1b, rollout/learner off-by-one).** b623d1b's rollout stored
//! `v[:, P−1 : P+G−1]` (the value of the state *before* each response token), but its learner
//! compared them with `vpred[:, −G:]` = `v[:, P : P+G]`, the value of the state *after* each
//! token: the value loss clipped and regressed every prediction against its neighbour's old
//! value and return. HEAD slices both sides alike. Here both sides go through
//! [`align_values_to_tokens`]; on a fixed case the misaligned value loss is non-zero right
//! after the rollout (when the learner's values *are* the rollout's) while ours is that of
//! the true prediction error
//! (`tests/rlhf_math.rs::reference_bug_b623d1b_value_misalignment`).
//!
//! ```
//! use tch::Tensor;
//! use torchrl::objectives::llm::{gae_advantages_and_returns, masked_whiten};
//! # fn main() -> torchrl::Result<()> {
//! // one row: 2 prompt columns, then 3 response tokens (rlhf.md §5.2's values and rewards)
//! let values = Tensor::from_slice(&[9.0f64, 9.0, 0.5, 0.6, 0.7]).view([1, 5]);
//! let rewards = Tensor::from_slice(&[0.0f64, 0.0, 0.0, 0.0, 1.0]).view([1, 5]);
//! let mask = Tensor::from_slice(&[0i64, 0, 1, 1, 1]).view([1, 5]);
//! let (adv, ret) = gae_advantages_and_returns(&values, &rewards, &mask, 1.0, 0.95)?;
//! let adv = Vec::<f64>::try_from(adv.view([-1]))?;
//! let ret = Vec::<f64>::try_from(ret.view([-1]))?;
//! for (a, e) in adv.iter().zip([0.0, 0.0, 0.46575, 0.385, 0.3]) {
//!     assert!((a - e).abs() < 1e-12);
//! }
//! assert!((ret[2] - 0.96575).abs() < 1e-12 && ret[0] == 0.0);
//! let w = masked_whiten(&Tensor::from_slice(&adv).view([1, 5]), &mask, true)?;
//! assert!((w.double_value(&[0, 2]) - 0.99134365).abs() < 1e-8 && w.double_value(&[0, 0]) == 0.0);
//! # Ok(()) }
//! ```

use std::fmt;

use tch::{Kind, Tensor};

use super::gae::{first_masked_column, mask_span};
use super::masked::{floating, same_shape, whiten_global_counted, zero_out, SumReduce};
#[allow(unused_imports)] // intra-doc links in the module docs
use super::{gae::gae_advantages_and_returns, masked::masked_whiten, masked::masked_whiten_global};
use crate::error::{Error, Result, ShapeFmt};
use crate::macros::setters;
use crate::modules::llm::keys::{
    ASSISTANT_MASK_KEY, ATTENTION_MASK_KEY, FULL_KEY, FULL_LOG_PROBS_KEY,
};
use crate::modules::llm::scoring::require_values;
use crate::modules::llm::{ScoreRequest, ScoreTokens};
use crate::objectives::common::{LossModule, LossOutput};
use crate::tensordict::{NestedKey, TensorDict};

// ------------------------------------------------------------------------------ config

/// The settings of the PPO-RLHF loss and its advantages, with trlX HEAD's defaults
/// (`default_ppo_config()`, rlhf.md §1.9).
///
/// The setters do not check; [`PpoRlhfLoss::with_config`] and [`ppo_rlhf_loss`] call
/// [`validate`](Self::validate), which names the field, its range and the value.
///
/// ```
/// use torchrl::objectives::llm::PpoRlhfConfig;
/// let cfg = PpoRlhfConfig::new().with_vf_coef(0.1).with_gamma(0.99);
/// assert_eq!((cfg.cliprange, cfg.cliprange_value, cfg.lam), (0.2, 0.2, 0.95));
/// assert!(cfg.validate().is_ok());
/// let err = PpoRlhfConfig::new().with_cliprange(-0.1).validate().unwrap_err();
/// assert!(matches!(err, torchrl::Error::InvalidConfig { field: "cliprange", .. }));
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct PpoRlhfConfig {
    /// The policy-ratio clip: `ratio` is clamped to `[1 − c, 1 + c]`; finite, `> 0`.
    /// Default 0.2.
    pub cliprange: f64,
    /// The value clip: predictions are clamped to `old_values ± c`; finite, `> 0`.
    /// Default 0.2.
    pub cliprange_value: f64,
    /// The value-loss coefficient (`loss = loss_pg + vf_coef · vf_loss`); finite, `>= 0`.
    /// Default 1 (b623d1b's yml used 2.3, TRL's new PPO uses 0.1).
    pub vf_coef: f64,
    /// The GAE discount γ; in `[0, 1]`. Default 1.
    pub gamma: f64,
    /// The GAE λ; in `[0, 1]`. Default 0.95.
    pub lam: f64,
    /// Whether [`compute_ppo_rlhf_advantages`] whitens the advantages ([`masked_whiten`]);
    /// trlX's `use_whitening`. Default `true`.
    pub whiten_advantages: bool,
    /// What [`ppo_rlhf_loss`] divides its masked sums by: `None` (the default) is this
    /// batch's response-token count `n = Σ mask`; `Some(N)` is a count given from outside,
    /// `N >= n`. **Data-parallel**: each rank passes the global count `N = Σ_ranks n_r`, so
    /// its loss is its share `Σ_local / N` of the global masked mean, and the **sum** of the
    /// ranks' gradients is exactly the gradient of one process on the concatenated batch.
    /// Every term (the losses and the token-mean diagnostics) uses it; summing them over the
    /// ranks gives the global means. Finite and `> 0`.
    pub token_normalizer: Option<f64>,
}

impl Default for PpoRlhfConfig {
    fn default() -> Self {
        PpoRlhfConfig {
            cliprange: 0.2,
            cliprange_value: 0.2,
            vf_coef: 1.0,
            gamma: 1.0,
            lam: 0.95,
            whiten_advantages: true,
            token_normalizer: None,
        }
    }
}

impl PpoRlhfConfig {
    /// The defaults.
    pub fn new() -> Self {
        Self::default()
    }

    setters! {
        /// Sets [`cliprange`](Self::cliprange).
        with_cliprange(cliprange: f64);
        /// Sets [`cliprange_value`](Self::cliprange_value).
        with_cliprange_value(cliprange_value: f64);
        /// Sets [`vf_coef`](Self::vf_coef).
        with_vf_coef(vf_coef: f64);
        /// Sets [`gamma`](Self::gamma).
        with_gamma(gamma: f64);
        /// Sets [`lam`](Self::lam).
        with_lam(lam: f64);
        /// Sets [`whiten_advantages`](Self::whiten_advantages).
        with_whiten_advantages(whiten_advantages: bool);
        /// Sets [`token_normalizer`](Self::token_normalizer).
        with_token_normalizer(token_normalizer: Option<f64>);
    }

    /// Checks every field.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the first field out of range.
    pub fn validate(&self) -> Result<()> {
        const OP: &str = "PpoRlhfConfig";
        for (field, v) in [
            ("cliprange", self.cliprange),
            ("cliprange_value", self.cliprange_value),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return Err(Error::config(OP, field, "finite and > 0", v));
            }
        }
        if !(self.vf_coef.is_finite() && self.vf_coef >= 0.0) {
            return Err(Error::config(
                OP,
                "vf_coef",
                "finite and >= 0",
                self.vf_coef,
            ));
        }
        for (field, v) in [("gamma", self.gamma), ("lam", self.lam)] {
            if !(0.0..=1.0).contains(&v) {
                return Err(Error::config(OP, field, "in [0, 1]", v));
            }
        }
        if let Some(n) = self.token_normalizer {
            if !(n.is_finite() && n > 0.0) {
                return Err(Error::config(
                    OP,
                    "token_normalizer",
                    "None or a finite token count > 0",
                    n,
                ));
            }
        }
        Ok(())
    }
}

// ------------------------------------------------------------------------------ loss

/// The inputs of [`ppo_rlhf_loss`], all `[B, T]` and aligned as in the [module docs](self).
#[derive(Debug, Clone, Copy)]
pub struct PpoRlhfInputs<'a> {
    /// The current policy's log-probs (differentiable).
    pub log_probs: &'a Tensor,
    /// The current value predictions (differentiable).
    pub values: &'a Tensor,
    /// The rollout policy's log-probs.
    pub old_log_probs: &'a Tensor,
    /// The rollout values.
    pub old_values: &'a Tensor,
    /// The (whitened) advantages.
    pub advantages: &'a Tensor,
    /// The returns (value targets).
    pub returns: &'a Tensor,
    /// The response mask (any dtype; non-zero = a response token).
    pub mask: &'a Tensor,
}

/// The output of [`ppo_rlhf_loss`] / [`PpoRlhfLoss`]: trlX's `PPOConfig.loss` value and stats.
///
/// The differentiable terms are `loss_pg` and `loss_vf` ([`LossOutput::total_loss`] is
/// `loss`); the rest are detached 0-dim diagnostics. Every mean is over the `n = Σ mask`
/// response tokens.
///
/// # Shapes
/// Every field is `[]`.
#[derive(Debug)]
pub struct PpoRlhfLossOutput {
    /// `loss_pg + loss_vf` (trlX's `loss`, logged as `losses/total_loss`).
    pub loss: Tensor,
    /// The clipped policy loss `Σ max(−A·ρ, −A·clip(ρ, 1 ± c)) · mask / n` (trlX's `pg_loss`,
    /// `losses/policy_loss`).
    pub loss_pg: Tensor,
    /// `vf_coef · vf_loss`, the value term as it enters the loss (trlX's `vf_coef * vf_loss`).
    pub loss_vf: Tensor,
    /// trlX's unscaled `vf_loss = 0.5 · Σ max((V − R)², (V_clip − R)²) · mask / n`
    /// (`losses/value_loss`), detached.
    pub value_loss: Tensor,
    /// The fraction of response tokens whose policy term is clipped (`pg2 > pg1`).
    pub pg_clipfrac: Tensor,
    /// The fraction of response tokens whose value term is clipped (`vf2 > vf1`).
    pub vf_clipfrac: Tensor,
    /// k3 between the new and the rollout policy, `Σ ((ρ − 1) − log ρ) · mask / n`. trlX
    /// takes `mean` over the whole `[B, R]` tensor (padding counts as 0 in the numerator and
    /// 1 in the denominator); the two agree on unpadded batches.
    pub approx_kl: Tensor,
    /// `Σ ((V − R) · mask)² / n` (trlX's `values/values_error`).
    pub values_error: Tensor,
    /// The mean ratio `Σ ρ · mask / n` (trlX's `ratio`).
    pub ratio: Tensor,
    /// `1 − n / (B · R)`, with `R` the response span (the columns from the first to the last
    /// that any row's mask covers: trlX's collated response width).
    pub padding_percentage: Tensor,
}

impl LossOutput for PpoRlhfLossOutput {
    fn loss_terms(&self) -> Vec<(&'static str, &Tensor)> {
        vec![("loss_pg", &self.loss_pg), ("loss_vf", &self.loss_vf)]
    }

    fn metrics(&self) -> Vec<(&'static str, &Tensor)> {
        vec![
            ("value_loss", &self.value_loss),
            ("pg_clipfrac", &self.pg_clipfrac),
            ("vf_clipfrac", &self.vf_clipfrac),
            ("approx_kl", &self.approx_kl),
            ("values_error", &self.values_error),
            ("ratio", &self.ratio),
            ("padding_percentage", &self.padding_percentage),
        ]
    }
}

/// trlX's PPO loss (`PPOConfig.loss`, rlhf.md §1.8) on masked `[B, T]` tensors:
///
/// ```text
/// n        = Σ mask
/// V_clip   = clamp(V, V_old − c_v, V_old + c_v)
/// vf_loss  = 0.5 · Σ max((V − R)², (V_clip − R)²) · mask / n
/// ρ        = exp((lp − lp_old) · mask)
/// pg_loss  = Σ max(−A·ρ, −A·clamp(ρ, 1 − c, 1 + c)) · mask / n
/// loss     = pg_loss + vf_coef · vf_loss
/// ```
///
/// No entropy bonus and no KL term (the KL is in the reward). Masked-out positions take no
/// part even when they hold NaN or TRL's `INVALID_LOGPROB`.
///
/// # Shapes
/// Every input `[B, T]` (any equal 2-D shape); see [`PpoRlhfLossOutput`].
///
/// # Errors
/// When the shapes differ or are not 2-D, a tensor other than the mask is not floating point,
/// the mask is all zero, or the config is invalid.
///
/// ```
/// use tch::Tensor;
/// use torchrl::objectives::llm::{ppo_rlhf_loss, PpoRlhfConfig, PpoRlhfInputs};
/// use torchrl::objectives::LossOutput;
/// # fn main() -> torchrl::Result<()> {
/// // rlhf.md §5.4
/// let t = |v: &[f64]| Tensor::from_slice(v).view([1, 3]);
/// let lp = t(&[-0.5, -1.0, -2.0]).set_requires_grad(true);
/// let (v, mask) = (t(&[0.9, 0.2, 1.5]), t(&[1.0, 1.0, 1.0]));
/// let out = ppo_rlhf_loss(
///     &PpoRlhfInputs {
///         log_probs: &lp,
///         values: &v,
///         old_log_probs: &t(&[-0.7, -1.0, -1.5]),
///         old_values: &t(&[0.5, 0.3, 1.0]),
///         advantages: &t(&[1.0, -0.5, 2.0]),
///         returns: &t(&[1.0, 0.0, 1.2]),
///         mask: &mask,
///     },
///     &PpoRlhfConfig::new(),
/// )?;
/// assert!((out.loss_pg.double_value(&[]) + 0.637687106475089).abs() < 1e-12);
/// assert!((out.loss.double_value(&[]) + 0.6010204398084223).abs() < 1e-12);
/// assert!((out.approx_kl.double_value(&[]) - 0.04264447262426777).abs() < 1e-12);
/// out.total_loss()?.backward();
/// assert!(lp.grad().defined());
/// # Ok(()) }
/// ```
pub fn ppo_rlhf_loss(
    inputs: &PpoRlhfInputs<'_>,
    config: &PpoRlhfConfig,
) -> Result<PpoRlhfLossOutput> {
    const OP: &str = "ppo_rlhf_loss";
    config.validate()?;
    let PpoRlhfInputs {
        log_probs,
        values,
        old_log_probs,
        old_values,
        advantages,
        returns,
        mask,
    } = *inputs;
    let shape = same_shape(
        OP,
        "log_probs, values, old_log_probs, old_values, advantages, returns, mask",
        &[
            log_probs,
            values,
            old_log_probs,
            old_values,
            advantages,
            returns,
            mask,
        ],
    )?;
    let [b, _] = shape.as_slice() else {
        return Err(Error::value(
            OP,
            "log_probs",
            "[B, T] tensors",
            ShapeFmt(&shape).to_string(),
        ));
    };
    for (key, t) in [
        ("log_probs", log_probs),
        ("values", values),
        ("old_log_probs", old_log_probs),
        ("old_values", old_values),
        ("advantages", advantages),
        ("returns", returns),
    ] {
        floating(OP, key, t)?;
    }
    let keep = mask.f_ne(0)?;
    let Some((lo, hi)) = mask_span(&keep)? else {
        return Err(Error::value(
            OP,
            "mask",
            "at least one response token",
            format!("an all-zero mask of shape {}", ShapeFmt(&shape)),
        ));
    };
    let z = |t: &Tensor| zero_out(t, &keep);
    let (lp, v) = (z(log_probs)?, z(values)?);
    let (olp, ov) = (z(&old_log_probs.f_detach()?)?, z(&old_values.f_detach()?)?);
    let (adv, ret) = (z(&advantages.f_detach()?)?, z(&returns.f_detach()?)?);
    let m = keep.f_to_kind(lp.kind())?;
    let local_n = m.f_sum(None::<Kind>)?;
    let n = match config.token_normalizer {
        None => local_n.shallow_clone(),
        Some(global) => {
            let have = local_n.f_double_value(&[])?;
            if global < have {
                return Err(Error::value(
                    OP,
                    "token_normalizer",
                    format!(
                        "a token count of at least this batch's {have} response tokens (the \
                         global count over every rank)"
                    ),
                    global.to_string(),
                ));
            }
            Tensor::f_scalar_tensor(global, (m.kind(), m.device()))?
        }
    };
    let masked_sum_over_n =
        |x: &Tensor| -> Result<Tensor> { Ok(x.f_mul(&m)?.f_sum(None::<Kind>)?.f_div(&n)?) };

    let cv = config.cliprange_value;
    let v_clipped = v.f_clamp_tensor(Some(&ov.f_sub_scalar(cv)?), Some(&ov.f_add_scalar(cv)?))?;
    let vf1 = v.f_sub(&ret)?.f_square()?;
    let vf2 = v_clipped.f_sub(&ret)?.f_square()?;
    let vf_loss = masked_sum_over_n(&vf1.f_maximum(&vf2)?)?.f_mul_scalar(0.5)?;

    let log_ratio = lp.f_sub(&olp)?.f_mul(&m)?;
    let ratio = log_ratio.f_exp()?;
    let c = config.cliprange;
    let pg1 = adv.f_neg()?.f_mul(&ratio)?;
    let pg2 = adv.f_neg()?.f_mul(&ratio.f_clamp(1.0 - c, 1.0 + c)?)?;
    let loss_pg = masked_sum_over_n(&pg1.f_maximum(&pg2)?)?;
    let loss_vf = vf_loss.f_mul_scalar(config.vf_coef)?;
    let loss = loss_pg.f_add(&loss_vf)?;

    let _guard = tch::no_grad_guard();
    let frac = |a: &Tensor, b: &Tensor| -> Result<Tensor> {
        masked_sum_over_n(&a.f_gt_tensor(b)?.f_to_kind(m.kind())?)
    };
    let ratio_d = ratio.f_detach()?;
    let log_ratio_d = log_ratio.f_detach()?;
    let n_d = local_n.f_detach()?;
    let width = (b * (hi - lo + 1)) as f64;
    Ok(PpoRlhfLossOutput {
        value_loss: vf_loss.f_detach()?,
        pg_clipfrac: frac(&pg2, &pg1)?.f_detach()?,
        vf_clipfrac: frac(&vf2, &vf1)?.f_detach()?,
        approx_kl: masked_sum_over_n(&ratio_d.f_sub_scalar(1.0)?.f_sub(&log_ratio_d)?)?,
        values_error: masked_sum_over_n(&v.f_detach()?.f_sub(&ret)?.f_mul(&m)?.f_square()?)?,
        ratio: masked_sum_over_n(&ratio_d)?,
        padding_percentage: n_d.f_div_scalar(width)?.f_neg()?.f_add_scalar(1.0)?,
        loss,
        loss_pg,
        loss_vf,
    })
}

// ------------------------------------------------------------------------------ loss module

crate::accepted_keys! {
    /// The keys of [`PpoRlhfLoss`] and [`compute_ppo_rlhf_advantages`] (TorchRL's LLM names,
    /// rlhf.md §4.1). Every tensor is `[B, T]`, aligned with the tokens.
    pub struct PpoRlhfKeys {
        /// Prompt and response token ids (int64). Default `("tokens", "full")`.
        tokens: FULL_KEY,
        /// 1 on every real token (prompt and response). Default
        /// `("masks", "all_attention_mask")`.
        attention_mask: ATTENTION_MASK_KEY,
        /// 1 on real response tokens, EOS included: the mask of every PPO term. Default
        /// `("masks", "all_assistant_mask")`.
        assistant_mask: ASSISTANT_MASK_KEY,
        /// The rollout policy's log-probs. Default `("log_probs", "full")`.
        log_probs: FULL_LOG_PROBS_KEY,
        /// The rollout values (already aligned with [`align_values_to_tokens`]). Default
        /// `"values"`.
        values: "values",
        /// The advantages (written by [`compute_ppo_rlhf_advantages`]). Default `"advantage"`.
        advantage: "advantage",
        /// The returns (written by [`compute_ppo_rlhf_advantages`]). Default `"value_target"`.
        value_target: "value_target",
        /// Per-token rewards `[B, T]` or `[B, T, 1]` (read by
        /// [`compute_ppo_rlhf_advantages`] only). Default `("next", "reward")`.
        reward: ("next", "reward"),
    }
}

/// Reads `key` as a `[B, T]` tensor of `td` (a trailing singleton dim is squeezed), of
/// `shape` when given; shared by the token-level losses.
pub(crate) fn read_bt(
    op: &'static str,
    td: &TensorDict,
    key: &NestedKey,
    shape: Option<&[i64]>,
) -> Result<Tensor> {
    let t = td.get_or_err(key)?;
    let t = if t.dim() == 3 && t.size().last() == Some(&1) {
        t.f_squeeze_dim(-1)?
    } else {
        t.shallow_clone()
    };
    let ok = match shape {
        Some(s) => t.size() == s,
        None => t.dim() == 2,
    };
    if !ok {
        return Err(Error::value(
            op,
            key,
            match shape {
                Some(s) => format!("shape {} (aligned with the tokens)", ShapeFmt(s)),
                None => "a [B, T] tensor".to_string(),
            },
            ShapeFmt(&t.size()).to_string(),
        ));
    }
    Ok(t)
}

/// Writes the advantages and returns of a rollout into `td`: [`gae_advantages_and_returns`]
/// on `keys.values`, `keys.reward`, `keys.assistant_mask` with the config's γ and λ, then
/// (when `config.whiten_advantages`) [`masked_whiten`] of the advantages, stored under
/// `keys.advantage` and `keys.value_target`. Both are detached, 0 outside the mask.
///
/// # Errors
/// A missing key (the error lists what is there), shapes that differ from the values' `[B,
/// T]`, an invalid config, or fewer than 2 response tokens when whitening.
///
/// ```
/// use tch::Tensor;
/// use torchrl::objectives::llm::{compute_ppo_rlhf_advantages, PpoRlhfConfig, PpoRlhfKeys};
/// use torchrl::TensorDict;
/// # fn main() -> torchrl::Result<()> {
/// let row = |v: &[f64]| Tensor::from_slice(v).view([1, 4]);
/// let mut td = TensorDict::new([1])?
///     .with("values", row(&[0.0, 0.5, 0.6, 0.7]))?
///     .with(("next", "reward"), row(&[0.0, 0.0, 0.0, 1.0]))?
///     .with(("masks", "all_assistant_mask"), row(&[0.0, 1.0, 1.0, 1.0]))?;
/// let cfg = PpoRlhfConfig::new().with_whiten_advantages(false);
/// compute_ppo_rlhf_advantages(&mut td, &PpoRlhfKeys::default(), &cfg)?;
/// assert!((td.get_or_err("advantage")?.double_value(&[0, 1]) - 0.46575).abs() < 1e-12);
/// assert!((td.get_or_err("value_target")?.double_value(&[0, 3]) - 1.0).abs() < 1e-12);
/// # Ok(()) }
/// ```
pub fn compute_ppo_rlhf_advantages(
    td: &mut TensorDict,
    keys: &PpoRlhfKeys,
    config: &PpoRlhfConfig,
) -> Result<()> {
    advantages_impl(td, keys, config, None).map(|_| ())
}

/// [`compute_ppo_rlhf_advantages`] for one process of a data-parallel group: the GAE is per
/// sequence (local), the whitening uses the mean and variance of every process's response
/// tokens ([`masked_whiten_global`] with `reduce_sum`). With the identity the result is
/// bitwise [`compute_ppo_rlhf_advantages`]'s.
///
/// # Errors
/// As [`compute_ppo_rlhf_advantages`] (the count of response tokens taken globally); what
/// `reduce_sum` returns.
///
/// ```
/// use tch::Tensor;
/// use torchrl::objectives::llm::ppo::compute_ppo_rlhf_advantages_with;
/// use torchrl::objectives::llm::{PpoRlhfConfig, PpoRlhfKeys};
/// use torchrl::TensorDict;
/// # fn main() -> torchrl::Result<()> {
/// let row = |v: &[f64]| Tensor::from_slice(v).view([1, 4]);
/// let mut td = TensorDict::new([1])?
///     .with("values", row(&[0.0, 0.5, 0.6, 0.7]))?
///     .with(("next", "reward"), row(&[0.0, 0.0, 0.0, 1.0]))?
///     .with(("masks", "all_assistant_mask"), row(&[0.0, 1.0, 1.0, 1.0]))?;
/// let single = |_: &mut Tensor| Ok(());
/// compute_ppo_rlhf_advantages_with(&mut td, &PpoRlhfKeys::default(), &PpoRlhfConfig::new(), &single)?;
/// assert_eq!(td.get_or_err("advantage")?.double_value(&[0, 0]), 0.0); // prompt token
/// # Ok(()) }
/// ```
pub fn compute_ppo_rlhf_advantages_with(
    td: &mut TensorDict,
    keys: &PpoRlhfKeys,
    config: &PpoRlhfConfig,
    reduce_sum: &SumReduce<'_>,
) -> Result<()> {
    advantages_impl(td, keys, config, Some(reduce_sum)).map(|_| ())
}

/// [`compute_ppo_rlhf_advantages_with`], also returning the global count of masked tokens when
/// the whitening computed it (its first all-reduce sums it), so that a data-parallel trainer
/// needs no all-reduce of its own for the loss's token normaliser; `None` without whitening.
pub(crate) fn compute_ppo_rlhf_advantages_counted(
    td: &mut TensorDict,
    keys: &PpoRlhfKeys,
    config: &PpoRlhfConfig,
    reduce_sum: &SumReduce<'_>,
) -> Result<Option<f64>> {
    advantages_impl(td, keys, config, Some(reduce_sum))
}

fn advantages_impl(
    td: &mut TensorDict,
    keys: &PpoRlhfKeys,
    config: &PpoRlhfConfig,
    reduce_sum: Option<&SumReduce<'_>>,
) -> Result<Option<f64>> {
    const OP: &str = "compute_ppo_rlhf_advantages";
    config.validate()?;
    let values = read_bt(OP, td, &keys.values, None)?;
    let shape = values.size();
    let rewards = read_bt(OP, td, &keys.reward, Some(&shape))?;
    let mask = read_bt(OP, td, &keys.assistant_mask, Some(&shape))?;
    let (advantages, returns) =
        gae_advantages_and_returns(&values, &rewards, &mask, config.gamma, config.lam)?;
    let (advantages, count) = if config.whiten_advantages {
        let _guard = tch::no_grad_guard();
        match reduce_sum {
            None => (masked_whiten(&advantages, &mask, true)?, None),
            Some(reduce) => {
                let (w, n) = whiten_global_counted(&advantages, &mask, true, reduce)?;
                (w, Some(n))
            }
        }
    } else {
        (advantages, None)
    };
    td.set(&keys.advantage, advantages)?;
    td.set(&keys.value_target, returns)?;
    Ok(count)
}

/// The PPO-RLHF loss as a [`LossModule`]: reads a rollout through [`PpoRlhfKeys`], re-runs
/// the current policy and value ([`ScoreTokens`]) on the tokens and returns
/// [`ppo_rlhf_loss`]'s [`PpoRlhfLossOutput`].
///
/// `M` is the policy, owned or borrowed (`PpoRlhfLoss::new(&model)`; the trainer keeps the
/// model and its optimizer).
///
/// # Keys
/// `in_keys()` = `tokens`, `attention_mask`, `assistant_mask`, `log_probs`, `values`,
/// `advantage`, `value_target` (the `reward` key is read by
/// [`compute_advantages`](Self::compute_advantages) only); settable with
/// [`LossModule::set_keys`].
///
/// # Shapes
/// Every entry `[B, T]`; the output is 0-dim.
///
/// ```
/// use tch::{Kind, Tensor};
/// use torchrl::modules::llm::ScoreFn;
/// use torchrl::objectives::llm::PpoRlhfLoss;
/// use torchrl::objectives::{LossModule, LossOutput};
/// use torchrl::TensorDict;
/// # fn main() -> torchrl::Result<()> {
/// // a "policy" whose log-probs and values are a parameter (shape [1, 4])
/// let theta = Tensor::from_slice(&[0.0f64, -1.0, -1.0, -1.0]).view([1, 4]).set_requires_grad(true);
/// let th = theta.shallow_clone();
/// let policy = ScoreFn(move |_t: &Tensor, _m: &Tensor| Ok((th.shallow_clone(), Some(th.f_mul_scalar(0.0)?))));
/// let mut loss = PpoRlhfLoss::new(policy);
/// let row = |v: &[f64]| Tensor::from_slice(v).view([1, 4]);
/// let mut td = TensorDict::new([1])?
///     .with(("tokens", "full"), Tensor::from_slice(&[5i64, 6, 7, 8]).view([1, 4]))?
///     .with(("masks", "all_attention_mask"), Tensor::ones([1, 4], (Kind::Int64, tch::Device::Cpu)))?
///     .with(("masks", "all_assistant_mask"), row(&[0.0, 1.0, 1.0, 1.0]))?
///     .with(("log_probs", "full"), row(&[0.0, -1.0, -1.0, -1.0]))?
///     .with("values", row(&[0.0, 0.5, 0.6, 0.7]))?
///     .with(("next", "reward"), row(&[0.0, 0.0, 0.0, 1.0]))?;
/// loss.compute_advantages(&mut td)?;
/// let out = loss.forward(&td)?;
/// // at the rollout policy the ratio is 1 and nothing is clipped
/// assert!((out.ratio.double_value(&[]) - 1.0).abs() < 1e-12);
/// assert_eq!(out.pg_clipfrac.double_value(&[]), 0.0);
/// out.total_loss()?.backward();
/// assert!(theta.grad().defined());
/// // keys are settable by name
/// loss.set_keys(&[("advantage", Some("adv".into()))])?;
/// assert!(loss.forward(&td).is_err()); // "adv" is not there
/// # Ok(()) }
/// ```
pub struct PpoRlhfLoss<M> {
    model: M,
    config: PpoRlhfConfig,
    keys: PpoRlhfKeys,
    in_keys: Vec<NestedKey>,
}

impl<M> fmt::Debug for PpoRlhfLoss<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PpoRlhfLoss")
            .field("config", &self.config)
            .field("keys", &self.keys)
            .finish_non_exhaustive()
    }
}

impl<M: ScoreTokens> PpoRlhfLoss<M> {
    /// A loss over `model` with the default [`PpoRlhfConfig`] and keys.
    pub fn new(model: M) -> Self {
        let keys = PpoRlhfKeys::default();
        PpoRlhfLoss {
            model,
            config: PpoRlhfConfig::default(),
            in_keys: Self::compute_in_keys(&keys),
            keys,
        }
    }

    /// Replaces the config, after [`PpoRlhfConfig::validate`].
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the bad field.
    pub fn with_config(mut self, config: PpoRlhfConfig) -> Result<Self> {
        config.validate()?;
        self.config = config;
        Ok(self)
    }

    /// Builder form of [`LossModule::set_tensor_keys`].
    pub fn with_keys(mut self, keys: PpoRlhfKeys) -> Self {
        self.in_keys = Self::compute_in_keys(&keys);
        self.keys = keys;
        self
    }

    /// The config.
    pub fn config(&self) -> &PpoRlhfConfig {
        &self.config
    }

    /// The policy.
    pub fn model(&self) -> &M {
        &self.model
    }

    /// [`compute_ppo_rlhf_advantages`] with this loss's keys and config: call it once per
    /// rollout, before the PPO epochs.
    ///
    /// # Errors
    /// As [`compute_ppo_rlhf_advantages`].
    pub fn compute_advantages(&self, td: &mut TensorDict) -> Result<()> {
        compute_ppo_rlhf_advantages(td, &self.keys, &self.config)
    }

    fn compute_in_keys(keys: &PpoRlhfKeys) -> Vec<NestedKey> {
        vec![
            keys.tokens.clone(),
            keys.attention_mask.clone(),
            keys.assistant_mask.clone(),
            keys.log_probs.clone(),
            keys.values.clone(),
            keys.advantage.clone(),
            keys.value_target.clone(),
        ]
    }
}

impl<M: ScoreTokens> LossModule for PpoRlhfLoss<M> {
    type Keys = PpoRlhfKeys;
    type Output = PpoRlhfLossOutput;

    fn name(&self) -> &'static str {
        "PpoRlhfLoss"
    }

    fn tensor_keys(&self) -> &PpoRlhfKeys {
        &self.keys
    }

    fn set_tensor_keys(&mut self, keys: PpoRlhfKeys) -> Result<()> {
        self.in_keys = Self::compute_in_keys(&keys);
        self.keys = keys;
        Ok(())
    }

    fn in_keys(&self) -> &[NestedKey] {
        &self.in_keys
    }

    fn forward(&self, td: &TensorDict) -> Result<PpoRlhfLossOutput> {
        const OP: &str = "PpoRlhfLoss";
        let k = &self.keys;
        let tokens = read_bt(OP, td, &k.tokens, None)?;
        let shape = tokens.size();
        let s = Some(shape.as_slice());
        let attention_mask = read_bt(OP, td, &k.attention_mask, s)?;
        let mask = read_bt(OP, td, &k.assistant_mask, s)?;
        let old_log_probs = read_bt(OP, td, &k.log_probs, s)?;
        let old_values = read_bt(OP, td, &k.values, s)?;
        let advantages = read_bt(OP, td, &k.advantage, s)?;
        let returns = read_bt(OP, td, &k.value_target, s)?;
        // the LM head runs from the first response token on: the loss reads no position before
        let first = first_masked_column(&mask)?;
        let scores = self.model.score_tokens(
            &tokens,
            &attention_mask,
            ScoreRequest::values().scored_from(first),
        )?;
        let (log_probs, values) = (scores.log_probs, require_values(scores.values)?);
        for (key, t) in [("policy log_probs", &log_probs), ("policy values", &values)] {
            if t.size() != shape {
                return Err(Error::ShapeMismatch {
                    op: OP,
                    key: key.into(),
                    expected: shape.clone(),
                    actual: t.size(),
                });
            }
        }
        ppo_rlhf_loss(
            &PpoRlhfInputs {
                log_probs: &log_probs,
                values: &values,
                old_log_probs: &old_log_probs,
                old_values: &old_values,
                advantages: &advantages,
                returns: &returns,
                mask: &mask,
            },
            &self.config,
        )
    }
}
