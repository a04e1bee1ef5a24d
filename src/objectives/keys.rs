//! The keys machinery of losses and value estimators (TorchRL's `_AcceptedKeys`): keys
//! structs ([`AcceptedKeys`], written by [`accepted_keys!`](crate::accepted_keys)) and the two
//! `set_keys` flavours ([`set_loss_keys`], [`set_estimator_keys`]).
//!
//! This module depends on nothing else in `objectives`, so that both the losses
//! ([`common`](super::common)) and the value estimators ([`value`](super::value)) can use it
//! without depending on each other. See [`common`](super::common) for the rules and an example.
//!
//! ```
//! torchrl::accepted_keys! {
//!     /// Keys of a toy estimator.
//!     pub struct ToyKeys {
//!         /// The reward.
//!         reward: ("next", "reward"),
//!     }
//! }
//! let mut keys = ToyKeys::default();
//! // an estimator's keys have no reset: `None` is an error, and nothing changes
//! assert!(torchrl::objectives::set_estimator_keys(&mut keys, &[("reward", None)], "Toy").is_err());
//! assert_eq!(keys.reward, torchrl::NestedKey::from(("next", "reward")));
//! ```

use std::fmt;

use crate::error::{Error, Result};
use crate::tensordict::NestedKey;

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
            // said once (TorchRL's wording): the key, whose keys, and the accepted ones
            return Err(Error::invalid("set_keys", message));
        }
        match value {
            None if flavour == Flavour::Estimator => {
                return Err(Error::argument(
                    "set_keys",
                    name,
                    "a key (an estimator's keys have no reset, pass the key to use)",
                    format!(
                        "None (tensordict keys cannot be None; got None for {name} of {owner})"
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

/// `(name, key)` pairs for `set_keys`: `None` asks a loss to reset the key to its default.
pub type KeyPairs<'a> = [(&'a str, Option<NestedKey>)];

/// Sets keys of a loss by name, with TorchRL's `LossModule.set_keys` semantics.
///
/// Every name must be one of `K::NAMES` (otherwise the error names the offending key and lists
/// the accepted ones); a `None` value resets that key to its default; an empty key is refused.
/// All pairs are validated before any is applied, so on error `keys` is unchanged. `owner` (the
/// loss's name) appears in error messages.
pub fn set_loss_keys<K: AcceptedKeys>(keys: &mut K, pairs: &KeyPairs, owner: &str) -> Result<()> {
    apply_pairs(keys, pairs, owner, Flavour::Loss)
}

/// Sets keys of a value estimator by name, with TorchRL's `ValueEstimatorBase.set_keys`
/// semantics: an unknown name is an error listing the accepted ones, and so is a `None` value
/// (an estimator has no "reset to default"). On error `keys` is unchanged.
pub fn set_estimator_keys<K: AcceptedKeys>(
    keys: &mut K,
    pairs: &KeyPairs,
    owner: &str,
) -> Result<()> {
    apply_pairs(keys, pairs, owner, Flavour::Estimator)
}
