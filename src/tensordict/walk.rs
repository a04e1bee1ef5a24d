//! The nested walk behind `keys` / `items`, written once for every tree of named levels: a
//! [`TensorDict`](super::TensorDict) (entries are tensors or tensordicts) and a
//! [`Composite`](crate::specs::Composite) (entries are specs, Composites or `None`) list their
//! keys by the same rules (TorchRL's `include_nested` / `leaves_only`, a level's own key after
//! its children's) and find the level a key's prefix names the same way.

use super::{AsKey, KeysOptions, NestedKey};
use crate::error::Error;

/// A level of a nested map: its entries in order, some of which are levels themselves.
/// Implementors get [`Levels::nested_items`], [`Levels::level_at`] and
/// [`Levels::level_at_mut`].
pub(crate) trait Levels {
    /// How an entry is lent out (a reference, or an `Option` of one).
    type Entry<'a>: Copy
    where
        Self: 'a;

    /// This level's `(name, entry)` pairs, in insertion order.
    fn level_entries(&self) -> impl Iterator<Item = (&str, Self::Entry<'_>)>;

    /// The level an entry is, or `None` for a leaf.
    fn as_level<'a>(entry: Self::Entry<'a>) -> Option<&'a Self>;

    /// The entry named `name` at this level.
    fn child(&self, name: &str) -> Option<Self::Entry<'_>>;

    /// The level named `name` at this level, mutably (`None`: absent or a leaf).
    fn child_level_mut(&mut self, name: &str) -> Option<&mut Self>;

    /// [`Error::KeyNotFound`] for `key`, looked up in this level under `prefix`: the
    /// available keys are this level's keys at any depth, with `prefix` in front.
    fn key_not_found(&self, op: &'static str, key: String, prefix: impl AsKey) -> Error {
        let prefix = prefix.segments();
        let available = self
            .nested_items(KeysOptions::nested())
            .into_iter()
            .map(|(k, _)| k.prefixed(&prefix[..]).to_string())
            .collect();
        Error::KeyNotFound { op, key, available }
    }

    /// The level that `prefix` names (`[]`: this one), or `None` when a segment is absent or
    /// a leaf.
    #[inline]
    fn level_at(&self, prefix: &[&str]) -> Option<&Self> {
        let mut cur = self;
        for seg in prefix {
            cur = Self::as_level(cur.child(seg)?)?;
        }
        Some(cur)
    }

    /// [`Levels::level_at`], mutably.
    #[inline]
    fn level_at_mut(&mut self, prefix: &[&str]) -> Option<&mut Self> {
        let mut cur = self;
        for seg in prefix {
            cur = cur.child_level_mut(seg)?;
        }
        Some(cur)
    }

    /// `(key, entry)` pairs chosen by `options`: the root level's entries; with
    /// [`KeysOptions::nested`], nested levels' entries too, each level's own key after its
    /// children's; with [`KeysOptions::leaves_only`], levels left out.
    fn nested_items(&self, options: KeysOptions) -> Vec<(NestedKey, Self::Entry<'_>)> {
        let mut out = Vec::new();
        visit(self, &NestedKey::default(), options, &mut out);
        out
    }
}

fn visit<'a, L: Levels + ?Sized>(
    level: &'a L,
    prefix: &NestedKey,
    options: KeysOptions,
    out: &mut Vec<(NestedKey, L::Entry<'a>)>,
) {
    for (name, entry) in level.level_entries() {
        let key = prefix.join(name);
        match L::as_level(entry) {
            None => out.push((key, entry)),
            Some(sub) => {
                if options.nested {
                    visit(sub, &key, options, out);
                }
                if !options.leaves_only {
                    out.push((key, entry));
                }
            }
        }
    }
}
