//! Direct Preference Optimization (DPO): TRL's `DPOTrainer` loss (`_compute_loss`, TRL 1.16,
//! `f_divergence_type="reverse_kl"`), as a function ([`dpo_loss`]) and a loss module
//! ([`DpoLoss`]).
//!
//! DPO trains a policy π directly on preference pairs, without a reward model: with the
//! sequence log-probs of the chosen and rejected completions under the policy (`π_c`, `π_r`)
//! and under a frozen reference (`ref_c`, `ref_r`),
//! `Δ = (π_c − ref_c) − (π_r − ref_r)` and the default loss is `−log σ(βΔ)`.
//!
//! - [`sequence_log_probs`]: per-token log-probs summed over the completion, and the
//!   completion length.
//! - [`dpo_loss`]: the loss for a [`DpoLossType`] and its logged rewards, as a
//!   [`DpoLossOutput`]; its settings are a [`DpoConfig`] (TRL's defaults).
//! - [`DpoLoss`]: the same as a [`LossModule`] over a tensordict with `chosen` / `rejected`
//!   sub-tensordicts, running the policy through [`ScoreTokens`] (with gradient).
//!
//! Fidelity: `tests/grpo_dpo_recorded.rs` replays TRL 1.16's own `DPOTrainer._compute_loss`
//! (recorded by `specs/record_grpo_dpo.py`) for every loss type here: losses, per-pair
//! rewards, accuracies and margins agree to 1e-10; the one difference is
//! [`DpoLossType::Sigmoid`] with label smoothing, documented there.
//!
//! ```
//! use tch::Tensor;
//! use torchrl::objectives::llm::{dpo_loss, DpoConfig};
//! # fn main() -> torchrl::Result<()> {
//! // rlhf.md §5.7: Δ = [2, 0], β = 0.1
//! let t = |v: &[f64]| Tensor::from_slice(v);
//! let out = dpo_loss(
//!     &t(&[-10.0, -5.0]), &t(&[-12.0, -4.0]), // policy chosen / rejected
//!     &t(&[-11.0, -5.5]), &t(&[-11.0, -4.5]), // reference chosen / rejected
//!     None,
//!     &DpoConfig::new(),
//! )?;
//! assert!((out.loss_dpo.double_value(&[]) - 0.6456430250).abs() < 1e-9);
//! assert!((out.chosen_rewards.double_value(&[0]) - 0.1).abs() < 1e-12);
//! assert_eq!(out.accuracy.double_value(&[]), 0.5);
//! # Ok(()) }
//! ```

use std::fmt;
use std::str::FromStr;

use tch::{Kind, Tensor};

use super::gae::first_masked_column;
use crate::error::{Error, Result, ShapeFmt};
use crate::macros::setters;
use crate::modules::llm::{ScoreRequest, ScoreTokens};
use crate::objectives::common::{parse_named, LossModule, LossOutput};
use crate::tensordict::{AsKey, Entry, NestedKey, TensorDict};

const OP: &str = "dpo_loss";

// ------------------------------------------------------------------------------ sequence log-probs

/// The sequence log-probs `Σ_t lp[t]·mask[t]` `[B]` and the completion lengths `Σ_t mask[t]`
/// `[B]` (both in the log-probs' dtype) of per-token log-probs `token_log_probs` `[B, T]`
/// (aligned as [`token_log_probs`]: `lp[t] = log
/// p(token[t] | tokens < t)`) over a `completion_mask` `[B, T]` (1 on completion tokens, any
/// numeric or bool dtype). Differentiable in the log-probs.
///
/// # Errors
/// When the log-probs are not floating point or not `[B, T]`, or the mask's shape differs.
///
/// ```
/// use tch::Tensor;
/// use torchrl::objectives::llm::sequence_log_probs;
/// let lp = Tensor::from_slice(&[0.0f64, -1.0, -2.0, -3.0]).view([2, 2]);
/// let mask = Tensor::from_slice(&[0i64, 1, 1, 1]).view([2, 2]);
/// let (seq, len) = sequence_log_probs(&lp, &mask)?;
/// assert_eq!(Vec::<f64>::try_from(seq)?, vec![-1.0, -5.0]);
/// assert_eq!(Vec::<f64>::try_from(len)?, vec![1.0, 2.0]);
/// # Ok::<(), torchrl::Error>(())
/// ```
pub fn sequence_log_probs(
    token_log_probs: &Tensor,
    completion_mask: &Tensor,
) -> Result<(Tensor, Tensor)> {
    const OP: &str = "sequence_log_probs";
    if token_log_probs.dim() != 2 || !token_log_probs.is_floating_point() {
        return Err(Error::argument(
            OP,
            "token_log_probs",
            "a floating-point [B, T] tensor",
            format!(
                "{:?} of shape {}",
                token_log_probs.kind(),
                ShapeFmt(&token_log_probs.size())
            ),
        ));
    }
    if completion_mask.size() != token_log_probs.size() {
        return Err(Error::ShapeMismatch {
            op: OP,
            key: "completion_mask".into(),
            expected: token_log_probs.size(),
            actual: completion_mask.size(),
        });
    }
    let mask = completion_mask.f_to_kind(token_log_probs.kind())?;
    let seq = token_log_probs
        .f_mul(&mask)?
        .f_sum_dim_intlist(1, false, None::<Kind>)?;
    let len = mask.f_sum_dim_intlist(1, false, None::<Kind>)?;
    Ok((seq, len))
}

// ------------------------------------------------------------------------------ config

/// The DPO loss variants (TRL's `loss_type`), per pair, with `x = βΔ`.
///
/// ```
/// use torchrl::objectives::llm::DpoLossType;
/// assert_eq!("ipo".parse::<DpoLossType>()?, DpoLossType::Ipo);
/// assert_eq!(DpoLossType::default(), DpoLossType::Sigmoid);
/// assert_eq!(DpoLossType::Robust.to_string(), "robust");
/// assert!("nca_pair".parse::<DpoLossType>().is_err());
/// # Ok::<(), torchrl::Error>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum DpoLossType {
    /// `−(1 − ε)·log σ(x) − ε·log σ(−x)` with ε the label smoothing: plain `−log σ(x)` (TRL's
    /// default) at ε = 0, the conservative DPO (cDPO) form for ε > 0. TRL 1.16's `sigmoid`
    /// ignores `label_smoothing` (it is always `−log σ(x)`); the cDPO form is TRL's earlier
    /// `sigmoid` (and its `aot` losses'). Identical to TRL at the default ε = 0.
    #[default]
    Sigmoid,
    /// TRL's `robust` (Chowdhury et al. 2024, unbiased under label noise ε):
    /// `(−(1 − ε)·log σ(x) + ε·log σ(−x)) / (1 − 2ε)`; ε must be in `[0, 0.5)`.
    Robust,
    /// TRL's `hinge` (SLiC): `relu(1 − x)`.
    Hinge,
    /// TRL's `ipo`, length-normalised as TRL: `((Δ_c/len_c − Δ_r/len_r) − 1/(2β))²` with
    /// `Δ_c = π_c − ref_c`, `Δ_r = π_r − ref_r` and the completion lengths clamped to `>= 1`.
    Ipo,
}

const LOSS_TYPES: [(&str, DpoLossType); 4] = [
    ("sigmoid", DpoLossType::Sigmoid),
    ("robust", DpoLossType::Robust),
    ("hinge", DpoLossType::Hinge),
    ("ipo", DpoLossType::Ipo),
];

impl FromStr for DpoLossType {
    type Err = Error;

    /// Parses TRL's names `"sigmoid"`, `"robust"`, `"hinge"`, `"ipo"`.
    fn from_str(s: &str) -> Result<Self> {
        parse_named("loss_type", "Invalid DPO loss type", s, &LOSS_TYPES)
    }
}

impl fmt::Display for DpoLossType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = LOSS_TYPES
            .iter()
            .find(|(_, t)| t == self)
            .map_or("?", |(n, _)| *n);
        f.write_str(name)
    }
}

/// The settings of the DPO loss, with TRL's `DPOConfig` defaults (β 0.1, `sigmoid`, label
/// smoothing 0).
///
/// The setters do not check; [`dpo_loss`] and [`DpoLoss::with_config`] call
/// [`validate`](Self::validate).
///
/// ```
/// use torchrl::objectives::llm::{DpoConfig, DpoLossType};
/// let cfg = DpoConfig::new().with_beta(0.5).with_loss_type(DpoLossType::Hinge);
/// assert_eq!((cfg.beta, cfg.label_smoothing), (0.5, 0.0));
/// assert!(cfg.validate().is_ok());
/// let err = DpoConfig::new().with_beta(0.0).validate().unwrap_err();
/// assert!(matches!(err, torchrl::Error::InvalidConfig { field: "beta", .. }));
/// let robust = DpoConfig::new().with_loss_type(DpoLossType::Robust).with_label_smoothing(0.5);
/// assert!(robust.validate().is_err()); // 1 − 2ε would be 0
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct DpoConfig {
    /// The KL strength β (IPO's τ); finite, `> 0`. Default 0.1.
    pub beta: f64,
    /// The loss variant. Default [`DpoLossType::Sigmoid`].
    pub loss_type: DpoLossType,
    /// The label smoothing ε (the assumed probability that a pair's label is flipped), read
    /// by [`DpoLossType::Sigmoid`] and [`DpoLossType::Robust`], ignored by the others; in
    /// `[0, 0.5]` (`[0, 0.5)` for `Robust`, as TRL checks). Default 0.
    pub label_smoothing: f64,
}

impl Default for DpoConfig {
    fn default() -> Self {
        DpoConfig {
            beta: 0.1,
            loss_type: DpoLossType::Sigmoid,
            label_smoothing: 0.0,
        }
    }
}

impl DpoConfig {
    /// The defaults.
    pub fn new() -> Self {
        Self::default()
    }

    setters! {
        /// Sets [`beta`](Self::beta).
        with_beta(beta: f64);
        /// Sets [`loss_type`](Self::loss_type).
        with_loss_type(loss_type: DpoLossType);
        /// Sets [`label_smoothing`](Self::label_smoothing).
        with_label_smoothing(label_smoothing: f64);
    }

    /// Checks every field.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the first field out of range.
    pub fn validate(&self) -> Result<()> {
        const OP: &str = "DpoConfig";
        if !(self.beta.is_finite() && self.beta > 0.0) {
            return Err(Error::config(OP, "beta", "finite and > 0", self.beta));
        }
        let eps = self.label_smoothing;
        if self.loss_type == DpoLossType::Robust {
            if !(0.0..0.5).contains(&eps) {
                return Err(Error::config(
                    OP,
                    "label_smoothing",
                    "in [0, 0.5) for the robust loss",
                    eps,
                ));
            }
        } else if !(0.0..=0.5).contains(&eps) {
            return Err(Error::config(OP, "label_smoothing", "in [0, 0.5]", eps));
        }
        Ok(())
    }
}

// ------------------------------------------------------------------------------ loss

/// The output of [`dpo_loss`] and [`DpoLoss`].
///
/// The differentiable total is `loss_dpo` ([`LossOutput::total_loss`]); the rest is detached,
/// in the inputs' dtype (the accuracy is float32), TRL's logged metrics.
///
/// # Shapes
/// `chosen_rewards`, `rejected_rewards` and `per_pair_loss` are `[B]`; every other field `[]`.
#[derive(Debug)]
pub struct DpoLossOutput {
    /// The mean of `per_pair_loss` (TRL's `per_sequence_loss.mean()`).
    pub loss_dpo: Tensor,
    /// The unreduced loss, `[B]` (differentiable).
    pub per_pair_loss: Tensor,
    /// `β·(π_c − ref_c)` per pair.
    pub chosen_rewards: Tensor,
    /// `β·(π_r − ref_r)` per pair.
    pub rejected_rewards: Tensor,
    /// The mean of `chosen_rewards` (TRL's `rewards/chosen`).
    pub rewards_chosen: Tensor,
    /// The mean of `rejected_rewards` (TRL's `rewards/rejected`).
    pub rewards_rejected: Tensor,
    /// `mean(chosen_rewards > rejected_rewards)`, float32 (a tie counts as wrong; TRL's
    /// `rewards/accuracies`).
    pub accuracy: Tensor,
    /// `mean(chosen_rewards − rejected_rewards)` (TRL's `rewards/margins`).
    pub margin: Tensor,
}

impl LossOutput for DpoLossOutput {
    fn loss_terms(&self) -> Vec<(&'static str, &Tensor)> {
        vec![("loss_dpo", &self.loss_dpo)]
    }

    fn metrics(&self) -> Vec<(&'static str, &Tensor)> {
        vec![
            ("rewards/chosen", &self.rewards_chosen),
            ("rewards/rejected", &self.rewards_rejected),
            ("rewards/accuracies", &self.accuracy),
            ("rewards/margins", &self.margin),
        ]
    }
}

/// Checks `t` is a floating-point `[B]` tensor of `shape` (the first argument's, when given).
fn check_seq(name: &str, t: &Tensor, shape: Option<&[i64]>) -> Result<()> {
    let ok = t.is_floating_point()
        && match shape {
            Some(s) => t.size() == s,
            None => t.dim() == 1,
        };
    if ok {
        return Ok(());
    }
    Err(Error::argument(
        OP,
        name,
        match shape {
            Some(s) => format!(
                "a floating-point tensor of policy_chosen's shape {}",
                ShapeFmt(s)
            ),
            None => "a floating-point [B] tensor of sequence log-probs".to_string(),
        },
        format!("{:?} of shape {}", t.kind(), ShapeFmt(&t.size())),
    ))
}

/// The DPO loss of sequence log-probs (TRL's `DPOTrainer._compute_loss`, reverse KL).
///
/// With `Δ_c = π_c − ref_c`, `Δ_r = π_r − ref_r`, `Δ = Δ_c − Δ_r` and `x = βΔ`, the per-pair
/// loss is [`config.loss_type`](DpoConfig::loss_type)'s (see [`DpoLossType`]), reduced by the
/// mean. The logged rewards are `β·Δ_c` and `β·Δ_r` (detached).
///
/// `lengths` = `(len_c, len_r)`, the completion lengths `[B]` (from [`sequence_log_probs`]),
/// is required by [`DpoLossType::Ipo`] and ignored by the others.
///
/// # Shapes
/// Every input `[B]`; see [`DpoLossOutput`].
///
/// # Errors
/// An invalid config, inputs that are not floating-point `[B]` of one shape, or
/// [`DpoLossType::Ipo`] without lengths.
///
/// ```
/// use tch::Tensor;
/// use torchrl::objectives::llm::{dpo_loss, DpoConfig, DpoLossType};
/// # fn main() -> torchrl::Result<()> {
/// let t = |v: &[f64]| Tensor::from_slice(v);
/// let (pc, pr, rc, rr) = (t(&[-10.0, -5.0]), t(&[-12.0, -4.0]), t(&[-11.0, -5.5]), t(&[-11.0, -4.5]));
/// // hinge: mean(relu(1 − 0.1·[2, 0])) = mean([0.8, 1])
/// let hinge = DpoConfig::new().with_loss_type(DpoLossType::Hinge);
/// let out = dpo_loss(&pc, &pr, &rc, &rr, None, &hinge)?;
/// assert!((out.loss_dpo.double_value(&[]) - 0.9).abs() < 1e-12);
/// // IPO needs the completion lengths
/// let ipo = DpoConfig::new().with_loss_type(DpoLossType::Ipo);
/// assert!(dpo_loss(&pc, &pr, &rc, &rr, None, &ipo).is_err());
/// let (lc, lr) = (t(&[2.0, 1.0]), t(&[4.0, 5.0]));
/// let out = dpo_loss(&pc, &pr, &rc, &rr, Some((&lc, &lr)), &ipo)?;
/// // ([0.5, 0.5] − [−0.25, 0.1] − 5)² = [18.0625, 21.16]
/// assert!((out.loss_dpo.double_value(&[]) - 19.61125).abs() < 1e-9);
/// # Ok(()) }
/// ```
pub fn dpo_loss(
    policy_chosen: &Tensor,
    policy_rejected: &Tensor,
    ref_chosen: &Tensor,
    ref_rejected: &Tensor,
    lengths: Option<(&Tensor, &Tensor)>,
    config: &DpoConfig,
) -> Result<DpoLossOutput> {
    config.validate()?;
    check_seq("policy_chosen", policy_chosen, None)?;
    let shape = policy_chosen.size();
    check_seq("policy_rejected", policy_rejected, Some(&shape))?;
    check_seq("ref_chosen", ref_chosen, Some(&shape))?;
    check_seq("ref_rejected", ref_rejected, Some(&shape))?;
    let beta = config.beta;
    let eps = config.label_smoothing;
    let chosen_ratio = policy_chosen.f_sub(&ref_chosen.f_detach()?)?;
    let rejected_ratio = policy_rejected.f_sub(&ref_rejected.f_detach()?)?;
    let delta = chosen_ratio.f_sub(&rejected_ratio)?;
    let x = delta.f_mul_scalar(beta)?;
    let per_pair_loss = match config.loss_type {
        DpoLossType::Sigmoid => {
            let clean = x.f_log_sigmoid()?.f_mul_scalar(-(1.0 - eps))?;
            if eps == 0.0 {
                clean
            } else {
                clean.f_sub(&x.f_neg()?.f_log_sigmoid()?.f_mul_scalar(eps)?)?
            }
        }
        DpoLossType::Robust => {
            let clean = x.f_log_sigmoid()?.f_mul_scalar(-(1.0 - eps))?;
            let flipped = x.f_neg()?.f_log_sigmoid()?.f_mul_scalar(-eps)?;
            clean.f_sub(&flipped)?.f_div_scalar(1.0 - 2.0 * eps)?
        }
        DpoLossType::Hinge => x.f_neg()?.f_add_scalar(1.0)?.f_relu()?,
        DpoLossType::Ipo => {
            let Some((len_c, len_r)) = lengths else {
                return Err(Error::argument(
                    OP,
                    "lengths",
                    "the completion lengths (len_chosen, len_rejected) for the ipo loss",
                    "None",
                ));
            };
            check_seq("chosen_lengths", len_c, Some(&shape))?;
            check_seq("rejected_lengths", len_r, Some(&shape))?;
            let c = chosen_ratio.f_div(&len_c.f_clamp_min(1.0)?)?;
            let r = rejected_ratio.f_div(&len_r.f_clamp_min(1.0)?)?;
            c.f_sub(&r)?
                .f_sub_scalar(1.0 / (2.0 * beta))?
                .f_pow_tensor_scalar(2)?
        }
    };
    let loss_dpo = per_pair_loss.f_mean(None::<Kind>)?;
    let _guard = tch::no_grad_guard();
    let chosen_rewards = chosen_ratio.f_detach()?.f_mul_scalar(beta)?;
    let rejected_rewards = rejected_ratio.f_detach()?.f_mul_scalar(beta)?;
    Ok(DpoLossOutput {
        loss_dpo,
        per_pair_loss,
        rewards_chosen: chosen_rewards.f_mean(None::<Kind>)?,
        rewards_rejected: rejected_rewards.f_mean(None::<Kind>)?,
        accuracy: chosen_rewards
            .f_gt_tensor(&rejected_rewards)?
            .f_mean(Kind::Float)?,
        margin: chosen_rewards
            .f_sub(&rejected_rewards)?
            .f_mean(None::<Kind>)?,
        chosen_rewards,
        rejected_rewards,
    })
}

// ------------------------------------------------------------------------------ loss module

crate::accepted_keys! {
    /// The keys of [`DpoLoss`]: two sub-tensordict keys, and the keys of the entries inside
    /// each (TRL's column names).
    pub struct DpoKeys {
        /// The chosen completions' sub-tensordict. Default `"chosen"`.
        chosen: "chosen",
        /// The rejected completions' sub-tensordict. Default `"rejected"`.
        rejected: "rejected",
        /// Inside each side: prompt + completion token ids `[B, T]` (int64). Default
        /// `"input_ids"`.
        tokens: "input_ids",
        /// Inside each side: 1 on every real token `[B, T]`. Default `"attention_mask"`.
        attention_mask: "attention_mask",
        /// Inside each side: 1 on completion tokens `[B, T]` (the log-probs summed). Default
        /// `"completion_mask"`.
        completion_mask: "completion_mask",
        /// Inside each side: the reference's precomputed sequence log-probs `[B]` (TRL's
        /// `precompute_ref_log_probs`). Default `"ref_log_probs"`.
        ref_log_probs: "ref_log_probs",
    }
}

/// The DPO loss as a [`LossModule`]: for each side (`chosen`, `rejected`) it runs the policy
/// ([`ScoreTokens`]) on the tokens, sums the log-probs over the completion mask
/// ([`sequence_log_probs`]), reads the reference's precomputed sequence log-probs, and returns
/// [`dpo_loss`]'s [`DpoLossOutput`] (the completion lengths feed [`DpoLossType::Ipo`]).
///
/// `M` is the policy, owned or borrowed (`DpoLoss::new(&model)`).
///
/// # Keys
/// `in_keys()` = for each side, `(side, tokens)`, `(side, attention_mask)`, `(side,
/// completion_mask)`, `(side, ref_log_probs)` ([`DpoKeys`]); settable with
/// [`LossModule::set_keys`].
///
/// # Shapes
/// Tokens and masks `[B, T]` (`T` may differ between the sides), reference log-probs `[B]`.
///
/// ```
/// use tch::{Kind, Tensor};
/// use torchrl::modules::llm::ScoreFn;
/// use torchrl::objectives::llm::DpoLoss;
/// use torchrl::objectives::{LossModule, LossOutput};
/// use torchrl::TensorDict;
/// # fn main() -> torchrl::Result<()> {
/// // a "policy" whose per-token log-probs are a parameter broadcast over the rows
/// let theta = Tensor::from_slice(&[0.0f64, -1.0, -2.0]).view([1, 3]).set_requires_grad(true);
/// let th = theta.shallow_clone();
/// let mut loss = DpoLoss::new(ScoreFn(move |t: &Tensor, _m: &Tensor| {
///     Ok((th.f_expand(t.size(), false)?.f_mul_scalar(1.0)?, None))
/// }));
/// let side = |ref_lp: f64| -> torchrl::Result<TensorDict> {
///     TensorDict::new([1])?
///         .with("input_ids", Tensor::from_slice(&[1i64, 2, 3]).view([1, 3]))?
///         .with("attention_mask", Tensor::ones([1, 3], (Kind::Int64, tch::Device::Cpu)))?
///         .with("completion_mask", Tensor::from_slice(&[0i64, 1, 1]).view([1, 3]))?
///         .with("ref_log_probs", Tensor::from_slice(&[ref_lp]))
/// };
/// let td = TensorDict::new([1])?.with("chosen", side(-4.0)?)?.with("rejected", side(-2.0)?)?;
/// let out = loss.forward(&td)?;
/// // π_c = π_r = −3, so Δ = (−3 + 4) − (−3 + 2) = 2: −log σ(0.2)
/// assert!((out.loss_dpo.double_value(&[]) - 0.5981388694).abs() < 1e-9);
/// out.total_loss()?.backward();
/// assert!(theta.grad().defined());
/// loss.set_keys(&[("ref_log_probs", Some("ref".into()))])?;
/// assert!(loss.forward(&td).is_err()); // ("chosen", "ref") is not there
/// # Ok(()) }
/// ```
pub struct DpoLoss<M> {
    model: M,
    config: DpoConfig,
    keys: DpoKeys,
    in_keys: Vec<NestedKey>,
}

impl<M> fmt::Debug for DpoLoss<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DpoLoss")
            .field("config", &self.config)
            .field("keys", &self.keys)
            .finish_non_exhaustive()
    }
}

/// One side's sequence log-probs, lengths and reference log-probs.
struct Side {
    policy: Tensor,
    lengths: Tensor,
    reference: Tensor,
}

impl<M: ScoreTokens> DpoLoss<M> {
    /// A loss over `model` with the default [`DpoConfig`] and keys.
    pub fn new(model: M) -> Self {
        let keys = DpoKeys::default();
        DpoLoss {
            model,
            config: DpoConfig::default(),
            in_keys: Self::compute_in_keys(&keys),
            keys,
        }
    }

    /// Replaces the config, after [`DpoConfig::validate`].
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the bad field.
    pub fn with_config(mut self, config: DpoConfig) -> Result<Self> {
        config.validate()?;
        self.config = config;
        Ok(self)
    }

    /// Builder form of [`LossModule::set_tensor_keys`].
    pub fn with_keys(mut self, keys: DpoKeys) -> Self {
        self.in_keys = Self::compute_in_keys(&keys);
        self.keys = keys;
        self
    }

    /// The config.
    pub fn config(&self) -> &DpoConfig {
        &self.config
    }

    /// The policy.
    pub fn model(&self) -> &M {
        &self.model
    }

    fn compute_in_keys(keys: &DpoKeys) -> Vec<NestedKey> {
        [&keys.chosen, &keys.rejected]
            .into_iter()
            .flat_map(|side| {
                [
                    &keys.tokens,
                    &keys.attention_mask,
                    &keys.completion_mask,
                    &keys.ref_log_probs,
                ]
                .into_iter()
                .map(move |k| side.join(k))
            })
            .collect()
    }

    /// Runs one side: the policy's sequence log-probs and lengths, and the reference's.
    fn side(&self, td: &TensorDict, side: &NestedKey) -> Result<Side> {
        const OP: &str = "DpoLoss";
        let sub = match td.get_entry(side) {
            Some(Entry::Dict(d)) => d,
            Some(Entry::Tensor(_)) => {
                return Err(Error::WrongEntryKind {
                    op: OP,
                    key: side.to_string(),
                    expected: "a sub-tensordict",
                    found: "a tensor",
                })
            }
            None => return Err(td.lookup_error(OP, &side.segments())),
        };
        let get = |k: &NestedKey| -> Result<&Tensor> {
            sub.get(k).ok_or_else(|| Error::KeyNotFound {
                op: OP,
                key: side.join(k).to_string(),
                available: sub
                    .keys(crate::tensordict::KeysOptions::nested())
                    .into_iter()
                    .map(|key| key.prefixed(side).to_string())
                    .collect(),
            })
        };
        let tokens = get(&self.keys.tokens)?;
        let attention_mask = get(&self.keys.attention_mask)?;
        let completion_mask = get(&self.keys.completion_mask)?;
        let reference = get(&self.keys.ref_log_probs)?;
        let reference = if reference.dim() == 2 && reference.size().last() == Some(&1) {
            reference.f_squeeze_dim(-1)?
        } else {
            reference.shallow_clone()
        };
        // the LM head runs from the first completion token on (TRL's `logits_to_keep`)
        let first = first_masked_column(completion_mask)?;
        let lp = self
            .model
            .score_tokens(
                tokens,
                attention_mask,
                ScoreRequest::log_probs().scored_from(first),
            )?
            .log_probs;
        let (policy, lengths) = sequence_log_probs(&lp, completion_mask)?;
        Ok(Side {
            policy,
            lengths,
            reference: reference.f_to_kind(lp.kind())?,
        })
    }
}

impl<M: ScoreTokens> LossModule for DpoLoss<M> {
    type Keys = DpoKeys;
    type Output = DpoLossOutput;

    fn name(&self) -> &'static str {
        "DpoLoss"
    }

    fn tensor_keys(&self) -> &DpoKeys {
        &self.keys
    }

    fn set_tensor_keys(&mut self, keys: DpoKeys) -> Result<()> {
        self.in_keys = Self::compute_in_keys(&keys);
        self.keys = keys;
        Ok(())
    }

    fn in_keys(&self) -> &[NestedKey] {
        &self.in_keys
    }

    fn forward(&self, td: &TensorDict) -> Result<DpoLossOutput> {
        let c = self.side(td, &self.keys.chosen)?;
        let r = self.side(td, &self.keys.rejected)?;
        dpo_loss(
            &c.policy,
            &r.policy,
            &c.reference,
            &r.reference,
            Some((&c.lengths, &r.lengths)),
            &self.config,
        )
    }
}
