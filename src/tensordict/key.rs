//! Nested keys: paths of string segments into a [`TensorDict`](super::TensorDict) or a
//! [`Composite`](crate::data::specs::Composite).
//!
//! Anything that implements [`AsKey`] can be used where a key is expected: `&str`, `String`,
//! tuples of 2–4 keys, arrays, slices and `Vec`s of keys, and [`NestedKey`] itself. Nested tuples
//! flatten (TorchRL's `unravel_key`): `("a", ("b", "c"))` is the same key as `("a", "b", "c")`.
//! Lookups borrow the segments and never allocate; [`NestedKey`] is the owned form, cheap to clone.
//!
//! ```
//! use torchrl::NestedKey;
//! let k: NestedKey = ("next", ("agent", "reward")).into();
//! assert_eq!(k, NestedKey::from(["next", "agent", "reward"]));
//! assert_eq!(k.to_string(), r#"("next", "agent", "reward")"#);
//! assert_eq!(NestedKey::from("reward").to_string(), r#""reward""#);
//! assert_eq!(NestedKey::from(("reward",)), NestedKey::from("reward"));
//! ```

use std::fmt;
use std::sync::Arc;

use smallvec::SmallVec;

/// Borrowed segments of a key, on the stack for keys of up to four segments.
pub type Segments<'a> = SmallVec<[&'a str; 4]>;

/// Something usable as a (possibly nested) key.
pub trait AsKey {
    /// Appends this key's segments to `out`, flattening nested keys.
    fn push_segments<'a>(&'a self, out: &mut Segments<'a>);

    /// The key's segments, borrowed.
    fn segments(&self) -> Segments<'_> {
        let mut out = Segments::new();
        self.push_segments(&mut out);
        out
    }

    /// The owned form of the key.
    fn to_nested_key(&self) -> NestedKey {
        NestedKey(
            self.segments()
                .iter()
                .map(|s| Arc::<str>::from(*s))
                .collect(),
        )
    }
}

impl AsKey for str {
    fn push_segments<'a>(&'a self, out: &mut Segments<'a>) {
        out.push(self);
    }
}

impl AsKey for String {
    fn push_segments<'a>(&'a self, out: &mut Segments<'a>) {
        out.push(self.as_str());
    }
}

impl<T: AsKey + ?Sized> AsKey for &T {
    fn push_segments<'a>(&'a self, out: &mut Segments<'a>) {
        (**self).push_segments(out)
    }
}

impl<T: AsKey> AsKey for [T] {
    fn push_segments<'a>(&'a self, out: &mut Segments<'a>) {
        for k in self {
            k.push_segments(out);
        }
    }
}

impl<T: AsKey, const N: usize> AsKey for [T; N] {
    fn push_segments<'a>(&'a self, out: &mut Segments<'a>) {
        self.as_slice().push_segments(out)
    }
}

impl<T: AsKey> AsKey for Vec<T> {
    fn push_segments<'a>(&'a self, out: &mut Segments<'a>) {
        self.as_slice().push_segments(out)
    }
}

impl AsKey for NestedKey {
    fn push_segments<'a>(&'a self, out: &mut Segments<'a>) {
        out.extend(self.0.iter().map(|s| &**s));
    }
}

macro_rules! tuple_key {
    ($($name:ident),+) => {
        impl<$($name: AsKey),+> AsKey for ($($name,)+) {
            #[allow(non_snake_case)]
            fn push_segments<'a>(&'a self, out: &mut Segments<'a>) {
                let ($($name,)+) = self;
                $($name.push_segments(out);)+
            }
        }
        impl<$($name: AsKey),+> From<($($name,)+)> for NestedKey {
            fn from(value: ($($name,)+)) -> Self {
                value.to_nested_key()
            }
        }
    };
}
tuple_key!(A);
tuple_key!(A, B);
tuple_key!(A, B, C);
tuple_key!(A, B, C, D);

/// An owned nested key: a path of one or more string segments.
///
/// Cheap to clone (segments are shared strings). Equality and hashing are by segments.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct NestedKey(SmallVec<[Arc<str>; 2]>);

impl NestedKey {
    /// The key's segments.
    pub fn parts(&self) -> impl ExactSizeIterator<Item = &str> + '_ {
        self.0.iter().map(|s| &**s)
    }

    /// Number of segments.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True for the empty key (which no container accepts).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The last segment (the leaf name), if any.
    pub fn last(&self) -> Option<&str> {
        self.0.last().map(|s| &**s)
    }

    /// A new key with `segment` appended.
    pub fn join(&self, segment: impl AsKey) -> NestedKey {
        let mut out = self.clone();
        out.0
            .extend(segment.segments().iter().map(|s| Arc::<str>::from(*s)));
        out
    }

    /// A new key with `prefix` prepended.
    pub fn prefixed(&self, prefix: impl AsKey) -> NestedKey {
        let mut out: SmallVec<[Arc<str>; 2]> = prefix
            .segments()
            .iter()
            .map(|s| Arc::<str>::from(*s))
            .collect();
        out.extend(self.0.iter().cloned());
        NestedKey(out)
    }

    /// The key without its first segment, or `None` for a one-segment key.
    pub fn strip_first(&self) -> Option<NestedKey> {
        if self.0.len() < 2 {
            return None;
        }
        Some(NestedKey(self.0.iter().skip(1).cloned().collect()))
    }

    /// The first segment, if any.
    pub fn first(&self) -> Option<&str> {
        self.0.first().map(|s| &**s)
    }

    /// True when `prefix` is this key or a level above it (segment-wise, not string-wise).
    ///
    /// ```
    /// use torchrl::NestedKey;
    /// let k = NestedKey::from(("next", "reward"));
    /// assert!(k.starts_with(&NestedKey::from("next")));
    /// assert!(k.starts_with(&k));
    /// assert!(!k.starts_with(&NestedKey::from("ne")));
    /// assert!(!NestedKey::from("next").starts_with(&k));
    /// ```
    pub fn starts_with(&self, prefix: &NestedKey) -> bool {
        self.0.len() >= prefix.0.len() && self.0.iter().zip(&prefix.0).all(|(a, b)| a == b)
    }
}

/// Displays segments the way [`NestedKey`] does.
pub(crate) fn display_segments(segs: &[&str]) -> String {
    match segs {
        [one] => format!("{one:?}"),
        _ => {
            let inner: Vec<String> = segs.iter().map(|s| format!("{s:?}")).collect();
            format!("({})", inner.join(", "))
        }
    }
}

impl fmt::Display for NestedKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let segs: Vec<&str> = self.parts().collect();
        f.write_str(&display_segments(&segs))
    }
}

impl fmt::Debug for NestedKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl From<&str> for NestedKey {
    fn from(value: &str) -> Self {
        value.to_nested_key()
    }
}

impl From<String> for NestedKey {
    fn from(value: String) -> Self {
        value.to_nested_key()
    }
}

impl From<&String> for NestedKey {
    fn from(value: &String) -> Self {
        value.to_nested_key()
    }
}

impl From<&NestedKey> for NestedKey {
    fn from(value: &NestedKey) -> Self {
        value.clone()
    }
}

impl<T: AsKey, const N: usize> From<[T; N]> for NestedKey {
    fn from(value: [T; N]) -> Self {
        value.to_nested_key()
    }
}

impl<T: AsKey> From<&[T]> for NestedKey {
    fn from(value: &[T]) -> Self {
        value.to_nested_key()
    }
}

impl<T: AsKey> From<Vec<T>> for NestedKey {
    fn from(value: Vec<T>) -> Self {
        value.to_nested_key()
    }
}

impl PartialEq<str> for NestedKey {
    fn eq(&self, other: &str) -> bool {
        matches!(self.0.as_slice(), [only] if &**only == other)
    }
}

impl PartialEq<&str> for NestedKey {
    fn eq(&self, other: &&str) -> bool {
        self == *other
    }
}

/// Formats keys as `["a", ("b", "c")]`, for error messages.
pub(crate) fn fmt_key_list(keys: &[NestedKey]) -> String {
    let names: Vec<String> = keys.iter().map(ToString::to_string).collect();
    format!("[{}]", names.join(", "))
}

/// Keys from anything convertible into [`NestedKey`]s.
pub(crate) fn collect_keys<K: Into<NestedKey>>(
    keys: impl IntoIterator<Item = K>,
) -> Vec<NestedKey> {
    keys.into_iter().map(Into::into).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn conversions_agree() {
        let a: NestedKey = ("next", "reward").into();
        let b: NestedKey = ["next", "reward"].into();
        let c: NestedKey = vec!["next".to_string(), "reward".to_string()].into();
        let d: NestedKey = (("next",), ("reward",)).into();
        let e: NestedKey = (&["next", "reward"][..]).into();
        assert_eq!(a, b);
        assert_eq!(a, c);
        assert_eq!(a, d);
        assert_eq!(a, e);
        let set: HashSet<NestedKey> = [a, b, c].into_iter().collect();
        assert_eq!(set.len(), 1);
    }

    #[test]
    fn join_and_strip() {
        let k = NestedKey::from("next").join(("a", "b"));
        assert_eq!(k, NestedKey::from(("next", "a", "b")));
        assert_eq!(k.strip_first(), Some(NestedKey::from(("a", "b"))));
        assert_eq!(NestedKey::from("x").strip_first(), None);
        assert_eq!(k.last(), Some("b"));
        assert_eq!(
            NestedKey::from("r").prefixed("next"),
            NestedKey::from(("next", "r"))
        );
    }
}
