//! What every loss shares: the [`LossModule`] trait, its typed output ([`LossOutput`]), the
//! [`Reduction`] of per-element losses, and the keys machinery (TorchRL's `_AcceptedKeys`).
//!
//! Each loss (and each value estimator) has a keys struct: one public [`NestedKey`] field per
//! configurable tensordict key, with TorchRL's defaults as its [`Default`]. Rust callers set the
//! fields directly ([`LossModule::set_tensor_keys`]); generic code sets them by name with
//! [`LossModule::set_keys`], which validates every name before changing anything. The
//! [`accepted_keys!`](crate::accepted_keys) macro writes such a struct and its [`AcceptedKeys`]
//! impl.
//!
//! The two `set_keys` flavours follow TorchRL exactly:
//!
//! | | unknown name | `None` value |
//! |---|---|---|
//! | a loss ([`set_loss_keys`]) | error listing the accepted names | reset to the default |
//! | a value estimator ([`set_estimator_keys`]) | error listing the accepted names | error |
//!
//! A loss that owns a value estimator forwards its estimator-related keys (those named in
//! [`VALUE_ESTIMATOR_KEYS`](super::value::VALUE_ESTIMATOR_KEYS) that both sides accept) with [`forward_value_estimator_keys`](super::value::forward_value_estimator_keys)
//! whenever its keys change, and recomputes its `in_keys` (TorchRL PR #1144, issue #4371).
//!
//! ```
//! use torchrl::objectives::{set_loss_keys, AcceptedKeys};
//! use torchrl::NestedKey;
//!
//! torchrl::accepted_keys! {
//!     /// The keys of a toy loss.
//!     pub struct ToyKeys {
//!         /// Where the observation is read.
//!         observation: "obs",
//!         /// Where the reward is read.
//!         reward: ("next", "reward"),
//!     }
//! }
//!
//! let mut keys = ToyKeys::default();
//! assert_eq!(ToyKeys::NAMES, &["observation", "reward"]);
//! set_loss_keys(&mut keys, &[("observation", Some("pixels".into()))], "ToyLoss")?;
//! assert_eq!(keys.observation, NestedKey::from("pixels"));
//!
//! // An unknown name is an error that lists the accepted ones, and changes nothing.
//! let err = set_loss_keys(&mut keys, &[("reward", None), ("foo", None)], "ToyLoss").unwrap_err();
//! assert!(err.to_string().contains("foo is not an accepted tensordict key of ToyLoss"));
//! assert!(err.to_string().contains("[observation, reward]"));
//! assert_eq!(keys.observation, NestedKey::from("pixels"));
//!
//! // `None` resets a key to its default.
//! set_loss_keys(&mut keys, &[("observation", None)], "ToyLoss")?;
//! assert_eq!(keys, ToyKeys::default());
//! # Ok::<(), torchrl::Error>(())
//! ```

use std::fmt;
use std::str::FromStr;

use tch::Tensor;

use crate::error::{Error, Result};
use crate::tensordict::{NestedKey, TensorDict};

pub use super::keys::{set_estimator_keys, set_loss_keys, AcceptedKeys};

// -------------------------------------------------------------------------------- reduction

/// How per-element losses are reduced: TorchRL's `reduction` argument.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Reduction {
    /// The mean over every element (the default).
    #[default]
    Mean,
    /// The sum over every element.
    Sum,
    /// No reduction: the per-element losses.
    None,
}

impl Reduction {
    /// The names accepted by [`Reduction::from_str`]: `"mean"`, `"sum"`, `"none"`.
    pub const NAMES: [&'static str; 3] = ["mean", "sum", "none"];

    /// The name of this reduction.
    pub fn as_str(self) -> &'static str {
        match self {
            Reduction::Mean => "mean",
            Reduction::Sum => "sum",
            Reduction::None => "none",
        }
    }

    /// Applies the reduction: a 0-dim tensor for `Mean` and `Sum`, `t` itself for `None`.
    pub fn apply(self, t: &Tensor) -> Result<Tensor> {
        Ok(match self {
            Reduction::Mean => t.f_mean(None)?,
            Reduction::Sum => t.f_sum(None)?,
            Reduction::None => t.shallow_clone(),
        })
    }
}

impl fmt::Display for Reduction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Reduction {
    type Err = Error;

    /// Parses `"mean"`, `"sum"` or `"none"`; anything else is TorchRL's
    /// `ValueError("Invalid reduction: …")`.
    fn from_str(s: &str) -> Result<Self> {
        let table = [
            ("mean", Reduction::Mean),
            ("sum", Reduction::Sum),
            ("none", Reduction::None),
        ];
        parse_named("reduction", "Invalid reduction", s, &table)
    }
}

/// The value named `s` in `table`, or an [`Error::InvalidValue`] for argument `key` that lists
/// the names (`what` prefixes the name given, e.g. TorchRL's `"Invalid reduction"`).
/// Errors when a floating tensor holds NaN or ±Inf: an [`Error::InvalidValue`] under `op`
/// naming `key`, with how many values are NaN and how many infinite (the losses'
/// `check_finite`, and `check_env_specs`' report). Integer and bool tensors always pass.
///
/// ```
/// use tch::Tensor;
/// use torchrl::objectives::ensure_finite;
/// assert!(ensure_finite("demo", "reward", &Tensor::from_slice(&[1.0f32, 2.0])).is_ok());
/// let err = ensure_finite("demo", "reward", &Tensor::from_slice(&[1.0f32, f32::NAN])).unwrap_err();
/// assert!(err.to_string().contains("reward") && err.to_string().contains("1 NaN"), "{err}");
/// ```
pub fn ensure_finite(op: &'static str, key: impl fmt::Display, t: &Tensor) -> Result<()> {
    if !crate::kind::is_float(t.kind()) || t.numel() == 0 {
        return Ok(());
    }
    let not_finite = t.f_isfinite()?.f_logical_not()?;
    let bad = not_finite.f_sum(tch::Kind::Int64)?.f_int64_value(&[])?;
    if bad == 0 {
        return Ok(());
    }
    let nan = t.f_isnan()?.f_sum(tch::Kind::Int64)?.f_int64_value(&[])?;
    Err(Error::value(
        op,
        key,
        "finite values",
        format!(
            "{bad} non-finite of {} values ({nan} NaN, {} ±Inf; shape {})",
            t.numel(),
            bad - nan,
            crate::error::ShapeFmt(&t.size())
        ),
    ))
}

pub(crate) fn parse_named<T: Copy>(
    key: &'static str,
    what: &str,
    s: &str,
    table: &[(&'static str, T)],
) -> Result<T> {
    match table.iter().find(|(name, _)| *name == s) {
        Some((_, v)) => Ok(*v),
        None => Err(Error::InvalidValue {
            op: key,
            what: "argument",
            key: key.into(),
            expected: format!(
                "one of {:?}",
                table.iter().map(|(n, _)| *n).collect::<Vec<_>>()
            ),
            got: format!("{s} ({what}: {s})"),
        }),
    }
}

impl TryFrom<&str> for Reduction {
    type Error = Error;

    fn try_from(s: &str) -> Result<Self> {
        s.parse()
    }
}

// ------------------------------------------------------------------------------ loss module

/// The typed output of a loss: differentiable `loss_*` terms plus detached metrics.
pub trait LossOutput {
    /// The differentiable terms, named `loss_*`; their sum is the loss to backpropagate.
    fn loss_terms(&self) -> Vec<(&'static str, &Tensor)>;

    /// Detached diagnostics (accuracy, clip fraction, …), not to be backpropagated.
    fn metrics(&self) -> Vec<(&'static str, &Tensor)> {
        Vec::new()
    }

    /// The sum of [`loss_terms`](LossOutput::loss_terms) (element-wise when unreduced).
    ///
    /// Errors when there is no term or when the terms do not broadcast.
    fn total_loss(&self) -> Result<Tensor> {
        let terms = self.loss_terms();
        let mut iter = terms.iter();
        let Some((_, first)) = iter.next() else {
            return Err(Error::invalid(
                "total_loss",
                "the loss output has no loss_* term",
            ));
        };
        let mut total = first.shallow_clone();
        for (_, t) in iter {
            total = total.f_add(t)?;
        }
        Ok(total)
    }

    /// Every term and metric in a tensordict with an empty batch size (the form TorchRL's
    /// trainers log).
    fn to_tensordict(&self) -> Result<TensorDict> {
        let mut td = TensorDict::new([])?;
        for (name, t) in self.loss_terms().into_iter().chain(self.metrics()) {
            td.set(name, t.shallow_clone())?;
        }
        Ok(td)
    }
}

/// A loss: reads a tensordict through settable keys and returns a typed [`LossOutput`].
///
/// Implementors hold their keys struct and their `in_keys`; [`set_tensor_keys`] is the one
/// place keys change, so it recomputes `in_keys` and, for a loss that owns a value estimator,
/// forwards the estimator's keys with [`forward_value_estimator_keys`](super::value::forward_value_estimator_keys) (before committing, so
/// an error changes nothing). [`set_keys`] (by name) is provided on top of it.
///
/// [`set_tensor_keys`]: LossModule::set_tensor_keys
/// [`set_keys`]: LossModule::set_keys
pub trait LossModule {
    /// The keys struct (TorchRL's `_AcceptedKeys`).
    type Keys: AcceptedKeys;
    /// The typed output of [`forward`](LossModule::forward).
    type Output: LossOutput;

    /// The loss's name, used in error messages (`"RewardModelLoss"`).
    fn name(&self) -> &'static str;

    /// The current keys (TorchRL's `tensor_keys`).
    fn tensor_keys(&self) -> &Self::Keys;

    /// Replaces every key at once; recomputes `in_keys` and forwards the estimator's keys.
    fn set_tensor_keys(&mut self, keys: Self::Keys) -> Result<()>;

    /// The tensordict entries [`forward`](LossModule::forward) reads, for the current keys.
    fn in_keys(&self) -> &[NestedKey];

    /// Computes the loss from `td` (which is not modified).
    fn forward(&self, td: &TensorDict) -> Result<Self::Output>;

    /// Sets keys by name (TorchRL's `set_keys(**kwargs)`): see [`set_loss_keys`] for the rules
    /// (unknown name → error listing the accepted ones, `None` → the default). On error
    /// nothing changes.
    fn set_keys(&mut self, pairs: &[(&str, Option<NestedKey>)]) -> Result<()> {
        let mut keys = self.tensor_keys().clone();
        set_loss_keys(&mut keys, pairs, self.name())?;
        self.set_tensor_keys(keys)
    }
}

/// [`LossModule`] with its types erased, for code that holds losses of different kinds
/// (a trainer's `Box<dyn DynLossModule>`). Every [`LossModule`] whose output is `'static`
/// implements it.
///
/// [`LossModule`] itself is object safe once its types are named
/// (`Box<dyn LossModule<Keys = PpoKeys, Output = PpoLossOutput>>`); this trait also erases
/// them: keys are set by name and the output is a `Box<dyn LossOutput>`. Its methods have
/// their own names so that both traits can be in scope.
///
/// ```
/// use tch::Tensor;
/// use torchrl::objectives::{DynLossModule, RewardModelLoss};
/// use torchrl::{NestedKey, TensorDict};
/// # fn main() -> torchrl::Result<()> {
/// let mut losses: Vec<Box<dyn DynLossModule>> = vec![Box::new(RewardModelLoss::new())];
/// losses[0].set_keys_by_name(&[("chosen", Some("a".into()))])?;
/// assert_eq!(losses[0].loss_in_keys(), &[NestedKey::from("a"), NestedKey::from("rejected")]);
/// let td = TensorDict::new([1])?
///     .with(("a", "score"), Tensor::from_slice(&[1.0f32]))?
///     .with(("rejected", "score"), Tensor::from_slice(&[1.0f32]))?;
/// let out = losses[0].forward_dyn(&td)?;
/// // -log σ(0) = ln 2
/// assert!((out.total_loss()?.double_value(&[]) - std::f64::consts::LN_2).abs() < 1e-6);
/// assert_eq!(losses[0].loss_name(), "RewardModelLoss");
/// # Ok(()) }
/// ```
pub trait DynLossModule: Send {
    /// [`LossModule::name`].
    fn loss_name(&self) -> &'static str;

    /// [`LossModule::in_keys`].
    fn loss_in_keys(&self) -> &[NestedKey];

    /// [`LossModule::set_keys`]: keys by name, TorchRL's rules.
    fn set_keys_by_name(&mut self, pairs: &[(&str, Option<NestedKey>)]) -> Result<()>;

    /// [`LossModule::forward`], its output boxed.
    fn forward_dyn(&self, td: &TensorDict) -> Result<Box<dyn LossOutput>>;
}

impl<L> DynLossModule for L
where
    L: LossModule + Send,
    L::Output: 'static,
{
    fn loss_name(&self) -> &'static str {
        self.name()
    }

    fn loss_in_keys(&self) -> &[NestedKey] {
        self.in_keys()
    }

    fn set_keys_by_name(&mut self, pairs: &[(&str, Option<NestedKey>)]) -> Result<()> {
        self.set_keys(pairs)
    }

    fn forward_dyn(&self, td: &TensorDict) -> Result<Box<dyn LossOutput>> {
        Ok(Box::new(self.forward(td)?))
    }
}
