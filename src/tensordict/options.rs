//! Options of [`TensorDict`](super::TensorDict) methods, named instead of positional
//! booleans: [`KeysOptions`] for `keys` / `items` (of tensordicts and of
//! [`Composite`](crate::specs::Composite) specs), [`Strict`] for `select`, [`IfExists`] for
//! `rename_key`. Each keeps TorchRL's meaning of the flag it replaces.
//!
//! ```
//! use tch::Tensor;
//! use torchrl::tensordict::{IfExists, KeysOptions, Strict};
//! use torchrl::TensorDict;
//! # fn main() -> torchrl::Result<()> {
//! let mut td = TensorDict::new([])?
//!     .with("a", Tensor::from(1.0))?
//!     .with(("next", "b"), Tensor::from(2.0))?;
//! // TorchRL's `keys(include_nested=True, leaves_only=True)`
//! assert_eq!(td.keys(KeysOptions::nested_leaves()).len(), 2);
//! assert_eq!(td.keys(KeysOptions::default()).len(), 2); // "a", "next"
//! assert_eq!(td.keys(KeysOptions::nested()).len(), 3); // "a", ("next", "b"), "next"
//! assert!(td.select(&["a", "missing"], Strict::Yes).is_err());
//! assert_eq!(td.select(&["a", "missing"], Strict::No)?.len(), 1);
//! assert!(td.rename_key("a", ("next", "b"), IfExists::Error).is_err());
//! td.rename_key("a", ("next", "b"), IfExists::Overwrite)?;
//! # Ok(()) }
//! ```

/// Which keys [`TensorDict::keys`](super::TensorDict::keys),
/// [`TensorDict::items`](super::TensorDict::items) and their
/// [`Composite`](crate::specs::Composite) twins list (TorchRL's `include_nested` and
/// `leaves_only`). The default is TorchRL's: the root level only, levels included.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct KeysOptions {
    /// List the keys of nested levels too (TorchRL's `include_nested`); a level's own key comes
    /// after its children's.
    pub nested: bool,
    /// Leave levels out, list leaves only (TorchRL's `leaves_only`).
    pub leaves_only: bool,
}

impl KeysOptions {
    /// Root-level keys, levels included (`include_nested=False, leaves_only=False`).
    pub const fn top_level() -> Self {
        KeysOptions {
            nested: false,
            leaves_only: false,
        }
    }

    /// Root-level leaves only (`include_nested=False, leaves_only=True`).
    pub const fn top_level_leaves() -> Self {
        KeysOptions {
            nested: false,
            leaves_only: true,
        }
    }

    /// Every key at any depth, levels included (`include_nested=True, leaves_only=False`).
    pub const fn nested() -> Self {
        KeysOptions {
            nested: true,
            leaves_only: false,
        }
    }

    /// Every leaf at any depth (`include_nested=True, leaves_only=True`).
    pub const fn nested_leaves() -> Self {
        KeysOptions {
            nested: true,
            leaves_only: true,
        }
    }
}

/// Whether [`TensorDict::select`](super::TensorDict::select) requires every key (TorchRL's
/// `strict`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Strict {
    /// A missing key is an error (`strict=True`).
    Yes,
    /// Missing keys are skipped (`strict=False`).
    No,
}

/// What [`TensorDict::rename_key`](super::TensorDict::rename_key) does when the new key is
/// already present (TorchRL's `safe`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IfExists {
    /// An error, and nothing changes (`safe=True`).
    Error,
    /// The existing entry is replaced (`safe=False`).
    Overwrite,
}
