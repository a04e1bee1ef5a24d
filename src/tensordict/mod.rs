//! `TensorDict`: a nested, keyed container of tensors that share leading batch dimensions.
//!
//! A [`TensorDict`] maps names to [`Entry`]s (a `tch::Tensor` or a nested `TensorDict`), keeps
//! insertion order, and carries a `batch_size` that must be a prefix of every leaf's shape.
//! Nested dicts have a batch size that extends their parent's. Nested keys
//! ([`NestedKey`], or anything [`AsKey`]) address leaves at any depth: a nested get or set is one
//! hash lookup per level.
//!
//! ```
//! use tch::{Kind, Tensor};
//! use torchrl::TensorDict;
//!
//! # fn main() -> torchrl::Result<()> {
//! let mut td = TensorDict::new([4])?
//!     .with("obs", Tensor::zeros([4, 3], (Kind::Float, tch::Device::Cpu)))?
//!     .with(("next", "reward"), Tensor::ones([4, 1], (Kind::Float, tch::Device::Cpu)))?;
//! assert_eq!(td.batch_size(), &[4]);
//! assert_eq!(td.get(("next", "reward")).map(|t| t.size()), Some(vec![4, 1]));
//! // a value whose leading dims are not the batch size is refused, and nothing changes
//! assert!(td.set("bad", Tensor::zeros([3], (Kind::Float, tch::Device::Cpu))).is_err());
//! assert!(!td.contains("bad"));
//! # Ok(()) }
//! ```

mod display;
mod index;
mod io;
mod key;
mod ops;
mod options;
mod shape;
mod walk;

use std::hash::BuildHasherDefault;

use indexmap::IndexMap;
use rustc_hash::FxHasher;
use smallvec::SmallVec;
use tch::{Device, Tensor};

use crate::error::{Error, Result};
pub(crate) use crate::host::ffi::leading_dims_are;
pub(crate) use crate::host::Elements;
pub use index::BatchIndex;
pub(crate) use index::{norm_dim, wrap_dim};
pub(crate) use key::{collect_keys, display_segments, fmt_key_list};
pub use key::{AsKey, NestedKey, Segments};
pub(crate) use ops::{clamp_f64, fits_kind, full_f64};
pub use options::{IfExists, KeysOptions, Strict};
pub use shape::{cat, stack, StackReserve};
pub(crate) use walk::Levels;

pub(crate) type Map<V> = IndexMap<std::sync::Arc<str>, V, BuildHasherDefault<FxHasher>>;
pub(crate) type Dims = SmallVec<[i64; 4]>;

/// One value in a [`TensorDict`]: a leaf tensor or a nested tensordict.
#[derive(Debug)]
pub enum Entry {
    /// A leaf tensor.
    Tensor(Tensor),
    /// A nested level.
    Dict(TensorDict),
}

impl Entry {
    /// The tensor, if this is a leaf.
    pub fn as_tensor(&self) -> Option<&Tensor> {
        match self {
            Entry::Tensor(t) => Some(t),
            Entry::Dict(_) => None,
        }
    }

    /// The nested tensordict, if this is a level.
    pub fn as_dict(&self) -> Option<&TensorDict> {
        match self {
            Entry::Tensor(_) => None,
            Entry::Dict(d) => Some(d),
        }
    }

    /// True for a leaf tensor.
    pub fn is_tensor(&self) -> bool {
        matches!(self, Entry::Tensor(_))
    }

    pub(crate) fn kind_name(&self) -> &'static str {
        match self {
            Entry::Tensor(_) => "a tensor",
            Entry::Dict(_) => "a tensordict",
        }
    }
}

impl Clone for Entry {
    /// Shallow: tensors share storage.
    fn clone(&self) -> Self {
        match self {
            Entry::Tensor(t) => Entry::Tensor(t.shallow_clone()),
            Entry::Dict(d) => Entry::Dict(d.clone()),
        }
    }
}

impl From<Tensor> for Entry {
    fn from(value: Tensor) -> Self {
        Entry::Tensor(value)
    }
}

impl From<TensorDict> for Entry {
    fn from(value: TensorDict) -> Self {
        Entry::Dict(value)
    }
}

/// A nested, keyed container of tensors sharing leading batch dimensions.
///
/// `Clone` is shallow (tensors share storage, the key structure is copied), like Python's
/// `td.clone(False)`; [`TensorDict::deep_clone`] copies the data.
///
/// # Shapes
/// For every leaf `t` reachable at depth `d`, `t.size()` starts with the batch size of the
/// level that holds it, and every level's batch size starts with its parent's.
pub struct TensorDict {
    pub(crate) entries: Map<Entry>,
    pub(crate) batch_size: Dims,
    pub(crate) device: Option<Device>,
}

impl Clone for TensorDict {
    fn clone(&self) -> Self {
        TensorDict {
            entries: self
                .entries
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            batch_size: self.batch_size.clone(),
            device: self.device,
        }
    }
}

pub(crate) fn check_key<'a>(op: &'static str, segs: &Segments<'a>) -> Result<()> {
    if segs.is_empty() {
        return Err(Error::InvalidKey {
            op,
            key: "()".into(),
            reason: "a key needs at least one segment".into(),
        });
    }
    Ok(())
}

pub(crate) fn starts_with(shape: &[i64], prefix: &[i64]) -> bool {
    shape.starts_with(prefix)
}

/// String equality inlined for short keys (a call to `memcmp` costs more than the comparison).
#[inline]
fn short_str_eq(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).all(|(x, y)| x == y)
}

impl TensorDict {
    /// An empty tensordict with the given batch size and no device.
    ///
    /// Errors when a dimension is negative.
    pub fn new(batch_size: impl AsRef<[i64]>) -> Result<Self> {
        let bs = batch_size.as_ref();
        refuse_negative_dims("TensorDict::new", "batch_size", bs, "")?;
        Ok(TensorDict::empty_level(bs.iter().copied().collect(), None))
    }

    /// An empty level with these batch dims and device, unchecked: for batch sizes derived
    /// from valid ones.
    #[inline]
    pub(crate) fn empty_level(batch_size: Dims, device: Option<Device>) -> TensorDict {
        TensorDict {
            entries: Map::default(),
            batch_size,
            device,
        }
    }

    /// Sets the device: every leaf (already present or inserted later) is moved to it, and
    /// nested levels inherit it.
    pub fn with_device(mut self, device: Device) -> Result<Self> {
        self.set_device(Some(device))?;
        Ok(self)
    }

    /// Builder-style [`TensorDict::set`].
    pub fn with(mut self, key: impl AsKey, value: impl Into<Entry>) -> Result<Self> {
        self.set(key, value)?;
        Ok(self)
    }

    /// The batch size.
    pub fn batch_size(&self) -> &[i64] {
        &self.batch_size
    }

    /// Number of batch dims.
    pub fn batch_dims(&self) -> usize {
        self.batch_size.len()
    }

    /// Product of the batch size (`i64::MAX` when it overflows: a tensordict without leaves
    /// may have any batch size).
    pub fn numel(&self) -> i64 {
        self.batch_size
            .iter()
            .try_fold(1i64, |acc, d| acc.checked_mul(*d))
            .unwrap_or(i64::MAX)
    }

    /// The device, if the tensordict has one.
    pub fn device(&self) -> Option<Device> {
        self.device
    }

    /// Number of direct entries (leaves and levels at this level).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when there are no leaves, at any depth (a tree of empty levels is empty).
    pub fn is_empty(&self) -> bool {
        self.entries.values().all(|e| match e {
            Entry::Tensor(_) => false,
            Entry::Dict(d) => d.is_empty(),
        })
    }

    /// A tensordict with the same batch size and device and no entries.
    pub fn empty(&self) -> TensorDict {
        TensorDict::empty_level(self.batch_size.clone(), self.device)
    }

    /// Changes the device (moving every leaf), or removes it (`None`: leaves stay where they are).
    pub fn set_device(&mut self, device: Option<Device>) -> Result<()> {
        if let Some(dev) = device {
            let moved = self.to_device(dev)?;
            *self = moved;
        } else {
            self.device = None;
            for e in self.entries.values_mut() {
                if let Entry::Dict(d) = e {
                    d.set_device(None)?;
                }
            }
        }
        Ok(())
    }

    /// Sets a new batch size, validated against every leaf and nested level. Shrinking
    /// (`[3, 4]` → `[3]`) is always allowed when the new size is a prefix.
    pub fn set_batch_size(&mut self, batch_size: impl AsRef<[i64]>) -> Result<()> {
        let bs = batch_size.as_ref();
        refuse_negative_dims("set_batch_size", "batch_size", bs, "")?;
        for (k, e) in &self.entries {
            let shape = match e {
                Entry::Tensor(t) => t.size(),
                Entry::Dict(d) => d.batch_size.to_vec(),
            };
            if !starts_with(&shape, bs) {
                return Err(Error::BatchSizeMismatch {
                    op: "set_batch_size",
                    key: display_segments(&[k]),
                    batch_size: bs.to_vec(),
                    shape,
                });
            }
        }
        self.batch_size = bs.iter().copied().collect();
        Ok(())
    }

    // ---------------------------------------------------------------- lookups

    /// Position of the direct entry `seg`. Small levels (the common case: a handful of keys)
    /// are scanned linearly, which beats hashing the key; larger ones use the hash index.
    #[inline]
    fn find(&self, seg: &str) -> Option<usize> {
        if self.entries.len() <= 8 {
            self.entries.keys().position(|k| short_str_eq(k, seg))
        } else {
            self.entries.get_index_of(seg)
        }
    }

    #[inline]
    fn entry_at(&self, seg: &str) -> Option<&Entry> {
        self.find(seg)
            .and_then(|i| self.entries.get_index(i))
            .map(|(_, e)| e)
    }

    #[inline]
    fn entry_at_mut(&mut self, seg: &str) -> Option<&mut Entry> {
        let i = self.find(seg)?;
        self.entries.get_index_mut(i).map(|(_, e)| e)
    }

    /// The entry (leaf or level) at `key`, or `None`.
    pub fn get_entry(&self, key: impl AsKey) -> Option<&Entry> {
        let segs = key.segments();
        let (last, prefix) = segs.split_last()?;
        self.level_at(prefix)?.entry_at(last)
    }

    /// The leaf tensor at `key`, or `None` when absent or when `key` names a nested level.
    pub fn get(&self, key: impl AsKey) -> Option<&Tensor> {
        self.get_entry(key).and_then(Entry::as_tensor)
    }

    /// The nested tensordict at `key`, or `None`.
    pub fn get_dict(&self, key: impl AsKey) -> Option<&TensorDict> {
        self.get_entry(key).and_then(Entry::as_dict)
    }

    /// The nested tensordict at `key`, mutably, or `None`.
    pub fn get_dict_mut(&mut self, key: impl AsKey) -> Option<&mut TensorDict> {
        let segs = key.segments();
        self.level_at_mut(&segs).filter(|_| !segs.is_empty())
    }

    /// Builds the error for a failed lookup of `segs`: which level failed and what it holds.
    pub(crate) fn lookup_error(&self, op: &'static str, segs: &[&str]) -> Error {
        let key = display_segments(segs);
        let mut cur = self;
        for (i, seg) in segs.iter().enumerate() {
            match cur.entries.get(*seg) {
                None => return cur.key_not_found(op, key, segs.get(..i).unwrap_or(segs)),
                Some(Entry::Tensor(_)) if i + 1 < segs.len() => {
                    return Error::NotALevel {
                        op,
                        key,
                        at: display_segments(segs.get(..=i).unwrap_or(segs)),
                    };
                }
                Some(Entry::Tensor(_)) => break,
                Some(Entry::Dict(d)) => cur = d,
            }
        }
        Error::WrongEntryKind {
            op,
            key,
            expected: "a tensor",
            found: "a tensordict",
        }
    }

    /// The leaf tensor at `key`, or an error naming the key and the available keys.
    pub fn get_or_err(&self, key: impl AsKey) -> Result<&Tensor> {
        let segs = key.segments();
        check_key("get", &segs)?;
        match self.get(&segs[..]) {
            Some(t) => Ok(t),
            None => Err(self.lookup_error("get", &segs)),
        }
    }

    /// True when `key` names a leaf or a level.
    pub fn contains(&self, key: impl AsKey) -> bool {
        self.get_entry(key).is_some()
    }

    // ---------------------------------------------------------------- writes

    /// Validates `value` for insertion into this level (which receives it directly or through
    /// new, empty levels) and prepares it (device cast). `segs` is only used in errors.
    fn validate(&self, op: &'static str, segs: &[&str], value: Entry) -> Result<Entry> {
        let batch = &self.batch_size[..];
        match value {
            Entry::Tensor(t) => {
                if !leading_dims_are(&t, batch) {
                    return Err(Error::BatchSizeMismatch {
                        op,
                        key: display_segments(segs),
                        batch_size: batch.to_vec(),
                        shape: t.size(),
                    });
                }
                match self.device {
                    Some(dev) if t.device() != dev => Ok(Entry::Tensor(t.f_to_device(dev)?)),
                    _ => Ok(Entry::Tensor(t)),
                }
            }
            Entry::Dict(mut d) => {
                if !starts_with(&d.batch_size, batch) {
                    return Err(Error::BatchSizeMismatch {
                        op,
                        key: display_segments(segs),
                        batch_size: batch.to_vec(),
                        shape: d.batch_size.to_vec(),
                    });
                }
                if let Some(dev) = self.device {
                    if d.device != Some(dev) {
                        d = d.to_device(dev)?;
                    }
                }
                Ok(Entry::Dict(d))
            }
        }
    }

    /// Sets `key` to a tensor or a nested tensordict, creating intermediate levels.
    ///
    /// The value's leading dims must equal the batch size of the level that receives it; a
    /// nested tensordict's batch size must start with it. On error nothing changes.
    pub fn set(&mut self, key: impl AsKey, value: impl Into<Entry>) -> Result<()> {
        let segs = key.segments();
        self.set_segments("set", &segs, value.into())
    }

    /// `set` with borrowed segments: one hash lookup per existing level, then validation against
    /// the receiving level, then creation of missing levels and the insert.
    pub(crate) fn set_segments(
        &mut self,
        op: &'static str,
        segs: &[&str],
        value: Entry,
    ) -> Result<()> {
        let Some((last, prefix)) = segs.split_last() else {
            return Err(Error::InvalidKey {
                op,
                key: "()".into(),
                reason: "a key needs at least one segment".into(),
            });
        };
        let mut cur: &mut TensorDict = self;
        // The levels still to walk (then to create).
        let mut rest = prefix;
        while let Some((seg, tail)) = rest.split_first() {
            let Some(i) = cur.find(seg) else {
                break;
            };
            cur = match cur.entries.get_index_mut(i) {
                Some((_, Entry::Dict(d))) => d,
                _ => {
                    let depth = prefix.len() - tail.len();
                    return Err(Error::NotALevel {
                        op,
                        key: display_segments(segs),
                        at: display_segments(segs.get(..depth).unwrap_or(segs)),
                    });
                }
            };
            rest = tail;
        }
        let value = cur.validate(op, segs, value)?;
        for seg in rest {
            let level = cur.empty();
            cur.entries
                .insert(std::sync::Arc::from(*seg), Entry::Dict(level));
            cur = match cur.entries.last_mut() {
                Some((_, Entry::Dict(d))) => d,
                _ => return Ok(()),
            };
        }
        match cur.entry_at_mut(last) {
            Some(slot) => *slot = value,
            None => {
                cur.entries.insert(std::sync::Arc::from(*last), value);
            }
        }
        Ok(())
    }

    /// Copies `value` into the existing leaf at `key`, in place (the storage is shared with
    /// every clone). Errors when the key is missing or the shapes differ.
    pub fn set_(&mut self, key: impl AsKey, value: &Tensor) -> Result<()> {
        let segs = key.segments();
        check_key("set_", &segs)?;
        let dest = match self.get(&segs[..]) {
            Some(t) => t,
            None => return Err(self.lookup_error("set_", &segs)),
        };
        let (expected, actual) = (dest.size(), value.size());
        if expected != actual {
            return Err(Error::ShapeMismatch {
                op: "set_",
                key: display_segments(&segs),
                expected,
                actual,
            });
        }
        let _guard = tch::no_grad_guard();
        let mut dest = dest.shallow_clone();
        dest.f_copy_(value).map_err(|e| {
            Error::invalid(
                "set_",
                format!(
                    "cannot copy a value of dtype {:?} into key {} (shape {}, dtype {:?}): {e}",
                    value.kind(),
                    display_segments(&segs),
                    crate::error::ShapeFmt(&expected),
                    dest.kind()
                ),
            )
        })?;
        Ok(())
    }

    /// Removes and returns the entry at `key`; errors (naming the available keys) when absent.
    pub fn pop(&mut self, key: impl AsKey) -> Result<Entry> {
        let segs = key.segments();
        check_key("pop", &segs)?;
        match self.remove(&segs[..]) {
            Some(e) => Ok(e),
            None => Err(self.lookup_error("pop", &segs)),
        }
    }

    /// Removes and returns the entry at `key`, or `None` when absent. Parent levels stay
    /// (possibly empty), as in TorchRL.
    pub fn remove(&mut self, key: impl AsKey) -> Option<Entry> {
        let segs = key.segments();
        let (last, prefix) = segs.split_last()?;
        self.level_at_mut(prefix)?.entries.shift_remove(*last)
    }

    /// Returns the leaf at `key`, first inserting `default` when the key is absent.
    pub fn setdefault(&mut self, key: impl AsKey, default: Tensor) -> Result<&Tensor> {
        let segs = key.segments();
        check_key("setdefault", &segs)?;
        if self.get_entry(&segs[..]).is_none() {
            self.set(&segs[..], default)?;
        }
        self.get_or_err(&segs[..])
    }

    /// Merges `other` into `self`, recursively: nested levels are merged, leaves replaced.
    /// Every value is validated like [`TensorDict::set`]; on error nothing changes.
    pub fn update(&mut self, other: &TensorDict) -> Result<()> {
        let mut staged = self.clone();
        staged.update_inner(other, &mut Vec::new())?;
        *self = staged;
        Ok(())
    }

    fn update_inner<'a>(&mut self, other: &'a TensorDict, path: &mut Vec<&'a str>) -> Result<()> {
        for (k, v) in &other.entries {
            path.push(k);
            match v {
                Entry::Dict(sub) if matches!(self.entries.get(&**k), Some(Entry::Dict(_))) => {
                    if let Some(Entry::Dict(mine)) = self.entries.get_mut(&**k) {
                        mine.update_inner(sub, path)?;
                    }
                }
                _ => {
                    self.set_segments("update", &[&**k], v.clone())
                        .map_err(|e| rekey(e, path))?;
                }
            }
            path.pop();
        }
        Ok(())
    }

    /// A new tensordict with only `keys` (and the levels that lead to them). With
    /// [`Strict::Yes`], a missing key is an error; with [`Strict::No`] it is skipped.
    pub fn select<K: AsKey>(&self, keys: &[K], strict: Strict) -> Result<TensorDict> {
        let mut out = self.empty();
        for key in keys {
            let segs = key.segments();
            check_key("select", &segs)?;
            match self.get_entry(&segs[..]) {
                Some(e) => {
                    // Recreate the levels on the way with their own batch sizes.
                    for parent in (1..segs.len()).filter_map(|i| segs.get(..i)) {
                        if out.get_entry(parent).is_none() {
                            if let Some(level) = self.get_dict(parent) {
                                out.set_segments("select", parent, Entry::Dict(level.empty()))?;
                            }
                        }
                    }
                    out.set_segments("select", &segs, e.clone())?;
                }
                None if strict == Strict::Yes => return Err(self.lookup_error("select", &segs)),
                None => {}
            }
        }
        Ok(out)
    }

    /// A new tensordict without `keys`; missing keys are ignored. Excluding a nested leaf keeps
    /// its (possibly now empty) parent level.
    pub fn exclude<K: AsKey>(&self, keys: &[K]) -> TensorDict {
        let mut out = self.clone();
        for key in keys {
            out.remove(key);
        }
        out
    }

    /// Moves the entry at `old` to `new` (across levels allowed). An existing `new` is an error
    /// with [`IfExists::Error`] (TorchRL's `safe=True`) and replaced with
    /// [`IfExists::Overwrite`]. On error nothing changes.
    pub fn rename_key(
        &mut self,
        old: impl AsKey,
        new: impl AsKey,
        if_exists: IfExists,
    ) -> Result<()> {
        let (old, new) = (old.segments(), new.segments());
        check_key("rename_key", &old)?;
        check_key("rename_key", &new)?;
        if old == new {
            return match self.get_entry(&old[..]) {
                Some(_) => Ok(()),
                None => Err(self.lookup_error("rename_key", &old)),
            };
        }
        if if_exists == IfExists::Error && self.contains(&new[..]) {
            return Err(Error::KeyExists {
                op: "rename_key",
                key: display_segments(&new),
            });
        }
        let mut staged = self.clone();
        let value = staged
            .pop(&old[..])
            .map_err(|_| self.lookup_error("rename_key", &old))?;
        staged
            .set_segments("rename_key", &new, value)
            .map_err(|e| rekey(e, &new))?;
        *self = staged;
        Ok(())
    }

    /// Keys, in insertion order. With [`KeysOptions::nested`], keys of nested levels are listed
    /// too (a level's own key comes after its children's, as in TorchRL); with
    /// [`KeysOptions::leaves_only`], levels themselves are left out.
    pub fn keys(&self, options: KeysOptions) -> Vec<NestedKey> {
        self.items(options).into_iter().map(|(k, _)| k).collect()
    }

    /// `(key, entry)` pairs with the same rules as [`TensorDict::keys`].
    pub fn items(&self, options: KeysOptions) -> Vec<(NestedKey, &Entry)> {
        self.nested_items(options)
    }

    /// Calls `f(path, tensor)` for every leaf, in order, with the path as borrowed segments
    /// (no key is allocated: this is the walk for hot paths).
    pub(crate) fn for_each_leaf<'a, F>(&'a self, f: &mut F) -> Result<()>
    where
        F: FnMut(&[&'a str], &'a Tensor) -> Result<()>,
    {
        let mut path: Vec<&'a str> = Vec::with_capacity(4);
        self.for_each_leaf_rec(&mut path, f)
    }

    fn for_each_leaf_rec<'a, F>(&'a self, path: &mut Vec<&'a str>, f: &mut F) -> Result<()>
    where
        F: FnMut(&[&'a str], &'a Tensor) -> Result<()>,
    {
        for (k, e) in &self.entries {
            path.push(&**k);
            match e {
                Entry::Tensor(t) => f(path, t)?,
                Entry::Dict(d) => d.for_each_leaf_rec(path, f)?,
            }
            path.pop();
        }
        Ok(())
    }

    /// Every leaf tensor with its full key, in order.
    pub fn leaves(&self) -> Vec<(NestedKey, &Tensor)> {
        self.items(KeysOptions::nested_leaves())
            .into_iter()
            .filter_map(|(k, e)| e.as_tensor().map(|t| (k, t)))
            .collect()
    }

    /// The leaf tensors, in order.
    pub fn values(&self) -> Vec<&Tensor> {
        self.leaves().into_iter().map(|(_, t)| t).collect()
    }

    /// A one-level tensordict whose keys are the nested keys joined with `sep`.
    /// Errors when two keys collide after joining.
    pub fn flatten_keys(&self, sep: &str) -> Result<TensorDict> {
        let mut out = self.empty();
        for (k, t) in self.leaves() {
            let name = k.parts().collect::<Vec<_>>().join(sep);
            if out.entries.contains_key(name.as_str()) {
                return Err(Error::KeyExists {
                    op: "flatten_keys",
                    key: display_segments(&[&name]),
                });
            }
            out.entries
                .insert(std::sync::Arc::from(name), Entry::Tensor(t.shallow_clone()));
        }
        Ok(out)
    }

    /// Inverse of [`TensorDict::flatten_keys`]: splits each top-level key on `sep`.
    pub fn unflatten_keys(&self, sep: &str) -> Result<TensorDict> {
        let mut out = self.empty();
        for (k, e) in &self.entries {
            let segs: Segments<'_> = k.split(sep).collect();
            if segs.iter().any(|s| s.is_empty()) {
                return Err(Error::InvalidKey {
                    op: "unflatten_keys",
                    key: display_segments(&[k]),
                    reason: format!("splitting on {sep:?} gives an empty segment"),
                });
            }
            if out.contains(&segs[..]) {
                return Err(Error::KeyExists {
                    op: "unflatten_keys",
                    key: display_segments(&segs),
                });
            }
            out.set(&segs[..], e.clone())?;
        }
        Ok(out)
    }
}

impl Levels for TensorDict {
    type Entry<'a> = &'a Entry;

    #[inline]
    fn level_entries(&self) -> impl Iterator<Item = (&str, &Entry)> {
        self.entries.iter().map(|(k, e)| (&**k, e))
    }

    #[inline]
    fn as_level<'a>(entry: Self::Entry<'a>) -> Option<&'a TensorDict> {
        entry.as_dict()
    }

    #[inline]
    fn child(&self, name: &str) -> Option<&Entry> {
        self.entry_at(name)
    }

    #[inline]
    fn child_level_mut(&mut self, name: &str) -> Option<&mut TensorDict> {
        match self.entry_at_mut(name)? {
            Entry::Dict(d) => Some(d),
            Entry::Tensor(_) => None,
        }
    }
}

/// Errors ([`Error::InvalidValue`] on the argument `name`) when `dims` has a negative
/// dimension; `context` is appended to the dims in the message (`""`, or e.g. the batch size).
#[inline]
pub(crate) fn refuse_negative_dims(
    op: &'static str,
    name: &str,
    dims: &[i64],
    context: &str,
) -> Result<()> {
    match dims.iter().find(|d| **d < 0) {
        None => Ok(()),
        Some(d) => Err(Error::argument(
            op,
            name,
            "no negative dimension",
            format!("{} (dimension {d}){context}", crate::error::ShapeFmt(dims)),
        )),
    }
}

/// Rewrites the key of an error raised on a sub-level so it names the full path.
fn rekey(mut err: Error, path: &[&str]) -> Error {
    if let Error::BatchSizeMismatch { key, .. } = &mut err {
        *key = display_segments(path);
    }
    err
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Kind;

    fn z(shape: &[i64]) -> Tensor {
        Tensor::zeros(shape, (Kind::Float, Device::Cpu))
    }

    #[test]
    fn set_validates_before_creating_levels() {
        let mut td = TensorDict::new([3]).unwrap();
        assert!(td.set(("a", "b"), z(&[4])).is_err());
        assert!(!td.contains("a"), "no half-written level");
        td.set(("a", "b"), z(&[3, 2])).unwrap();
        assert_eq!(td.get_dict("a").unwrap().batch_size(), &[3]);
    }

    #[test]
    fn keys_order_matches_torchrl() {
        let td = TensorDict::new([])
            .unwrap()
            .with("a", z(&[1]))
            .unwrap()
            .with(("b", "c"), z(&[1]))
            .unwrap();
        let keys: Vec<String> = td
            .keys(KeysOptions::nested())
            .iter()
            .map(|k| k.to_string())
            .collect();
        assert_eq!(keys, vec![r#""a""#, r#"("b", "c")"#, r#""b""#]);
        assert_eq!(td.keys(KeysOptions::nested_leaves()).len(), 2);
        assert_eq!(td.keys(KeysOptions::top_level_leaves()).len(), 1);
    }
}
