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
//! [`VALUE_ESTIMATOR_KEYS`] that both sides accept) with [`forward_value_estimator_keys`]
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

use super::value::ValueEstimator;

// ------------------------------------------------------------------------------------- keys

/// A keys struct: named, typed [`NestedKey`] fields with defaults (TorchRL's `_AcceptedKeys`).
///
/// Implement it with [`accepted_keys!`](crate::accepted_keys); the by-name accessors make
/// [`set_loss_keys`] / [`set_estimator_keys`] generic over every loss and estimator.
pub trait AcceptedKeys: Clone + Default + fmt::Debug + PartialEq {
    /// The accepted names, in declaration order.
    const NAMES: &'static [&'static str];

    /// The key stored under `name`, or `None` for a name that is not accepted.
    fn key(&self, name: &str) -> Option<&NestedKey>;

    /// The key stored under `name`, mutably, or `None` for a name that is not accepted.
    fn key_mut(&mut self, name: &str) -> Option<&mut NestedKey>;

    /// The default of `name`, or `None` for a name that is not accepted.
    fn default_key(name: &str) -> Option<NestedKey> {
        Self::default().key(name).cloned()
    }

    /// `(name, key)` pairs in declaration order.
    fn entries(&self) -> Vec<(&'static str, &NestedKey)> {
        Self::NAMES
            .iter()
            .filter_map(|n| self.key(n).map(|k| (*n, k)))
            .collect()
    }
}

/// Declares a keys struct and its [`AcceptedKeys`] impl (TorchRL's `_AcceptedKeys` dataclass).
///
/// Every field is a public [`NestedKey`](crate::NestedKey) whose default is anything that
/// converts into one (`"reward"`, `("next", "reward")`, …). The struct derives `Clone`, `Debug`,
/// `PartialEq`, `Eq` and implements `Default`. Doc comments on the struct and the fields are kept.
///
/// ```
/// torchrl::accepted_keys! {
///     /// Keys of my loss.
///     pub struct MyKeys {
///         /// The action.
///         action: "action",
///     }
/// }
/// assert_eq!(MyKeys::default().action, torchrl::NestedKey::from("action"));
/// ```
#[macro_export]
macro_rules! accepted_keys {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident {
            $(
                $(#[$fmeta:meta])*
                $field:ident : $default:expr
            ),* $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Debug, PartialEq, Eq)]
        $vis struct $name {
            $(
                $(#[$fmeta])*
                pub $field: $crate::NestedKey,
            )*
        }

        impl ::core::default::Default for $name {
            fn default() -> Self {
                Self { $( $field: $crate::NestedKey::from($default), )* }
            }
        }

        impl $crate::objectives::AcceptedKeys for $name {
            const NAMES: &'static [&'static str] = &[$(stringify!($field)),*];

            fn key(&self, name: &str) -> ::core::option::Option<&$crate::NestedKey> {
                match name {
                    $( stringify!($field) => ::core::option::Option::Some(&self.$field), )*
                    _ => ::core::option::Option::None,
                }
            }

            fn key_mut(&mut self, name: &str) -> ::core::option::Option<&mut $crate::NestedKey> {
                match name {
                    $( stringify!($field) => ::core::option::Option::Some(&mut self.$field), )*
                    _ => ::core::option::Option::None,
                }
            }
        }
    };
}

/// Whose `set_keys` rules apply.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Flavour {
    /// Losses: `None` resets the key to its default.
    Loss,
    /// Value estimators: `None` is an error.
    Estimator,
}

fn apply_pairs<K: AcceptedKeys>(
    keys: &mut K,
    pairs: &[(&str, Option<NestedKey>)],
    owner: &str,
    flavour: Flavour,
) -> Result<()> {
    // Validate everything first so that an error leaves `keys` untouched.
    for (name, value) in pairs {
        if keys.key(name).is_none() {
            let accepted = format!("[{}]", K::NAMES.join(", "));
            let message = match flavour {
                Flavour::Loss => format!(
                    "{name} is not an accepted tensordict key of {owner}. \
                     Accepted keys are: {accepted}"
                ),
                Flavour::Estimator => format!(
                    "{name} is not an accepted tensordict key for advantages ({owner}). \
                     Accepted keys are: {accepted}"
                ),
            };
            return Err(Error::invalid("set_keys", message));
        }
        match value {
            None if flavour == Flavour::Estimator => {
                return Err(Error::invalid(
                    "set_keys",
                    format!(
                        "tensordict keys cannot be None (got None for {name} of {owner}); \
                         an estimator's keys have no reset, pass the key to use"
                    ),
                ));
            }
            Some(k) if k.is_empty() => {
                return Err(Error::InvalidKey {
                    op: "set_keys",
                    key: format!("{name} of {owner}"),
                    reason: "a tensordict key needs at least one segment".into(),
                });
            }
            _ => {}
        }
    }
    let defaults = K::default();
    for (name, value) in pairs {
        let new = match value {
            Some(k) => k.clone(),
            None => defaults.key(name).cloned().unwrap_or_default(),
        };
        if let Some(slot) = keys.key_mut(name) {
            *slot = new;
        }
    }
    Ok(())
}

/// Sets keys of a loss by name, with TorchRL's `LossModule.set_keys` semantics.
///
/// Every name must be one of `K::NAMES` (otherwise the error names the offending key and lists
/// the accepted ones); a `None` value resets that key to its default; an empty key is refused.
/// All pairs are validated before any is applied, so on error `keys` is unchanged. `owner` (the
/// loss's name) appears in error messages.
pub fn set_loss_keys<K: AcceptedKeys>(
    keys: &mut K,
    pairs: &[(&str, Option<NestedKey>)],
    owner: &str,
) -> Result<()> {
    apply_pairs(keys, pairs, owner, Flavour::Loss)
}

/// Sets keys of a value estimator by name, with TorchRL's `ValueEstimatorBase.set_keys`
/// semantics: an unknown name is an error listing the accepted ones, and so is a `None` value
/// (an estimator has no "reset to default"). On error `keys` is unchanged.
pub fn set_estimator_keys<K: AcceptedKeys>(
    keys: &mut K,
    pairs: &[(&str, Option<NestedKey>)],
    owner: &str,
) -> Result<()> {
    apply_pairs(keys, pairs, owner, Flavour::Estimator)
}

/// The key names a loss forwards to its value estimator (TorchRL's
/// `_value_estimator_default_keys`).
pub const VALUE_ESTIMATOR_KEYS: [&str; 6] = [
    "advantage",
    "value_target",
    "value",
    "reward",
    "done",
    "terminated",
];

/// Forwards a loss's estimator-related keys to its value estimator (TorchRL's
/// `_forward_value_estimator_keys`).
///
/// Only names in [`VALUE_ESTIMATOR_KEYS`] that the loss's keys define *and* the estimator
/// accepts are forwarded (TorchRL issue #4371: forwarding a name the estimator does not accept
/// broke `set_keys`). The loss's current values are sent, so a key the loss just reset to its
/// default reaches the estimator as that default.
pub fn forward_value_estimator_keys<K: AcceptedKeys>(
    keys: &K,
    estimator: &mut dyn ValueEstimator,
) -> Result<()> {
    let pairs: Vec<(&str, Option<NestedKey>)> = VALUE_ESTIMATOR_KEYS
        .iter()
        .filter(|name| estimator.accepts_key(name))
        .filter_map(|name| keys.key(name).map(|k| (*name, Some(k.clone()))))
        .collect();
    if pairs.is_empty() {
        return Ok(());
    }
    estimator.set_keys(&pairs)
}

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
        match s {
            "mean" => Ok(Reduction::Mean),
            "sum" => Ok(Reduction::Sum),
            "none" => Ok(Reduction::None),
            other => Err(Error::invalid(
                "reduction",
                format!(
                    "Invalid reduction: {other}. Expected one of {:?}",
                    Reduction::NAMES
                ),
            )),
        }
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
/// forwards the estimator's keys with [`forward_value_estimator_keys`] (before committing, so
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
