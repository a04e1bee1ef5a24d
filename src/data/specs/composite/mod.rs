//! [`Composite`]: an ordered, nested map of specs, the spec of a [`TensorDict`].
//!
//! A Composite has a shape (the batch size of the tensordicts it describes) that must be a prefix
//! of every child's shape, and an optional device. Entries keep insertion order and may be `None`
//! (a key with no spec: skipped by `is_in`, `rand`, `zero`, `project`).
//!
//! - **Shapes.** Setting a spec whose leading dims are not the composite's shape is an
//!   [`Error::BatchSizeMismatch`] naming the key and both shapes. As in TorchRL, a child
//!   `Composite` (or `NonTensor`) whose shape is a strict prefix of the parent's is reshaped to
//!   the parent's shape (a Composite's own leaves must then fit it).
//! - **Devices.** With a device, a child on another device is an [`Error::DeviceMismatch`] and a
//!   device-less child Composite is moved to it. Without one, leaves may live anywhere.
//! - **Keys.** Nested keys address entries at any depth; `set` creates missing levels with the
//!   parent level's shape and device. `shape`, `device`, `dtype` and `space` are reserved
//!   ([`Error::InvalidKey`]).
//! - **Locking.** [`Composite::lock`] (recursive) makes `set`, `set_none`, `pop`, `remove` and
//!   `update` fail with [`Error::Locked`] without changing anything. Clones are unlocked.
//!
//! ```
//! use tch::{Device, Kind, Tensor};
//! use torchrl::specs::{Bounded, Categorical, Composite, Unbounded};
//! use torchrl::tensordict::KeysOptions;
//! use torchrl::{Error, Generator, TensorDict};
//! # fn main() -> torchrl::Result<()> {
//! let mut spec = Composite::new([3])?
//!     .with("obs", Bounded::new(0.0, 1.0, [3, 2])?)?
//!     .with(("next", "reward"), Unbounded::new().with_shape([3, 1])?)?;
//! let keys: Vec<String> = spec.keys(KeysOptions::nested()).iter().map(|k| k.to_string()).collect();
//! assert_eq!(keys, [r#""obs""#, r#"("next", "reward")"#, r#""next""#]);
//! // a missing key is an error naming it, not `false`
//! let td = TensorDict::new([3])?.with("obs", Tensor::zeros([3, 2], (Kind::Float, Device::Cpu)))?;
//! assert!(matches!(spec.is_in(&td), Err(Error::KeyNotFound { .. })));
//! // an out-of-bounds value is reported with the key and the offending values
//! let bad = spec.rand(&mut Generator::new(0), &[])?;
//! bad.fill_("obs", 2.0)?;
//! let err = spec.check(&bad).unwrap_err().to_string();
//! assert!(err.contains("\"obs\"") && err.contains("max=2"), "{err}");
//! spec.lock();
//! assert!(matches!(spec.set("act", Categorical::new(2)?.with_shape([3])?), Err(Error::Locked { .. })));
//! # Ok(()) }
//! ```

use std::fmt;

use indexmap::IndexMap;
use tch::Device;

use super::common::{self, concat};
use super::TensorSpec;
use crate::error::{Error, Result, ShapeFmt};
use crate::rng::Generator;
use crate::tensordict::{
    display_segments, AsKey, BatchIndex, Entry, KeysOptions, Levels, NestedKey, TensorDict,
};

// the values (sampling, checking) and the shape operations, each its own `impl Composite`
mod sampling;
mod shape_ops;

/// Keys a Composite refuses (they name attributes in TorchRL).
const RESERVED: [&str; 4] = ["shape", "device", "dtype", "space"];

/// Whether [`Composite::is_empty`] looks into nested Composites (TorchRL's `recurse`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Recurse {
    /// Count leaf specs at any depth (`recurse=True`).
    Yes,
    /// Count this level's entries (`recurse=False`).
    No,
}

/// An ordered, nested collection of specs sharing leading (batch) dims.
pub struct Composite {
    pub(crate) specs: IndexMap<String, Option<TensorSpec>>,
    pub(crate) shape: Vec<i64>,
    pub(crate) device: Option<Device>,
    pub(crate) locked: bool,
}

impl Clone for Composite {
    /// A copy of the tree (leaf tensors are shared); the clone and its sub-composites are
    /// unlocked, as in TorchRL.
    fn clone(&self) -> Self {
        self.copy(false)
    }
}

impl Levels for Composite {
    type Entry<'a> = Option<&'a TensorSpec>;

    #[inline]
    fn level_entries(&self) -> impl Iterator<Item = (&str, Option<&TensorSpec>)> {
        self.specs.iter().map(|(k, v)| (k.as_str(), v.as_ref()))
    }

    #[inline]
    fn as_level<'a>(entry: Self::Entry<'a>) -> Option<&'a Composite> {
        match entry {
            Some(TensorSpec::Composite(c)) => Some(c),
            _ => None,
        }
    }

    #[inline]
    fn child(&self, name: &str) -> Option<Option<&TensorSpec>> {
        self.specs.get(name).map(Option::as_ref)
    }

    #[inline]
    fn child_level_mut(&mut self, name: &str) -> Option<&mut Composite> {
        match self.specs.get_mut(name)? {
            Some(TensorSpec::Composite(c)) => Some(c),
            _ => None,
        }
    }
}

impl PartialEq for Composite {
    /// Same shape, device, key set (order-insensitive, as TorchRL) and equal children.
    fn eq(&self, other: &Self) -> bool {
        self.shape == other.shape
            && self.device == other.device
            && self.specs.len() == other.specs.len()
            && self
                .specs
                .iter()
                .all(|(k, v)| other.specs.get(k).is_some_and(|o| o == v))
    }
}

fn starts_with(shape: &[i64], prefix: &[i64]) -> bool {
    shape.starts_with(prefix)
}

fn check_segments(op: &'static str, segs: &[&str]) -> Result<()> {
    if segs.is_empty() {
        return Err(Error::InvalidKey {
            op,
            key: "()".into(),
            reason: "a key needs at least one segment".into(),
        });
    }
    if let Some(bad) = segs.iter().find(|s| RESERVED.contains(*s)) {
        return Err(Error::InvalidKey {
            op,
            key: display_segments(segs),
            reason: format!(
                "{bad:?} is reserved: Composite[{bad:?}] cannot be set (reserved names: shape, \
                 device, dtype, space)"
            ),
        });
    }
    Ok(())
}

/// Rewrites the key of an error raised on a sub-level so it names the full key.
fn rekey(mut err: Error, full: &str) -> Error {
    match &mut err {
        Error::BatchSizeMismatch { key, .. }
        | Error::DeviceMismatch { key, .. }
        | Error::NotInSpec { key, .. }
        | Error::Locked { key, .. } => *key = full.to_string(),
        _ => {}
    }
    err
}

/// Is the spec one whose last dim is protected from indexing?
fn protected_dims(spec: &TensorSpec) -> usize {
    match spec {
        TensorSpec::OneHot(_)
        | TensorSpec::Binary(_)
        | TensorSpec::MultiCategorical(_)
        | TensorSpec::MultiOneHot(_) => 1,
        _ => 0,
    }
}

impl Composite {
    /// An empty composite with the given shape (batch size) and no device.
    pub fn new(shape: impl AsRef<[i64]>) -> Result<Self> {
        common::check_shape("Composite::new", shape.as_ref())?;
        Ok(Composite {
            specs: IndexMap::new(),
            shape: shape.as_ref().to_vec(),
            device: None,
            locked: false,
        })
    }

    /// Builder-style [`Composite::set`].
    pub fn with(mut self, key: impl AsKey, spec: impl Into<TensorSpec>) -> Result<Self> {
        self.set(key, spec)?;
        Ok(self)
    }

    /// Builder-style [`Composite::set_none`].
    pub fn with_none(mut self, key: impl AsKey) -> Result<Self> {
        self.set_none(key)?;
        Ok(self)
    }

    /// Sets the device, moving every leaf to it.
    pub fn with_device(self, device: Device) -> Result<Self> {
        self.to_device(device)
    }

    fn copy(&self, keep_lock: bool) -> Composite {
        Composite {
            specs: self
                .specs
                .iter()
                .map(|(k, v)| {
                    let v = match v {
                        Some(TensorSpec::Composite(c)) => {
                            Some(TensorSpec::Composite(c.copy(keep_lock)))
                        }
                        other => other.clone(),
                    };
                    (k.clone(), v)
                })
                .collect(),
            shape: self.shape.clone(),
            device: self.device,
            locked: keep_lock && self.locked,
        }
    }

    /// The shape (the batch size of the described tensordicts).
    pub fn shape(&self) -> &[i64] {
        &self.shape
    }

    /// Number of dims of the shape.
    pub fn ndim(&self) -> usize {
        self.shape.len()
    }

    /// The device, if any.
    pub fn device(&self) -> Option<Device> {
        self.device
    }

    /// A composite with the same shape and device and no entries (unlocked).
    pub fn empty(&self) -> Composite {
        Composite {
            specs: IndexMap::new(),
            shape: self.shape.clone(),
            device: self.device,
            locked: false,
        }
    }

    // ------------------------------------------------------------------ locking

    /// Locks this composite and every nested one.
    pub fn lock(&mut self) {
        self.locked = true;
        for v in self.specs.values_mut() {
            if let Some(TensorSpec::Composite(c)) = v {
                c.lock();
            }
        }
    }

    /// Unlocks this composite and every nested one.
    pub fn unlock(&mut self) {
        self.locked = false;
        for v in self.specs.values_mut() {
            if let Some(TensorSpec::Composite(c)) = v {
                c.unlock();
            }
        }
    }

    /// True when locked.
    pub fn is_locked(&self) -> bool {
        self.locked
    }

    /// Errors with [`Error::Locked`] when a level on the path to `segs` is locked.
    fn ensure_unlocked(&self, op: &'static str, segs: &[&str]) -> Result<()> {
        let locked_err = || Error::Locked {
            op,
            what: "Composite",
            key: display_segments(segs),
        };
        let mut cur = self;
        if cur.locked {
            return Err(locked_err());
        }
        for seg in segs.iter().take(segs.len().saturating_sub(1)) {
            match cur.specs.get(*seg) {
                Some(Some(TensorSpec::Composite(c))) => {
                    cur = c;
                    if cur.locked {
                        return Err(locked_err());
                    }
                }
                _ => break,
            }
        }
        Ok(())
    }

    // ------------------------------------------------------------------ lookups

    /// The spec at `key`, or `None` when absent or when the entry is `None`.
    pub fn get(&self, key: impl AsKey) -> Option<&TensorSpec> {
        let segs = key.segments();
        let (last, prefix) = segs.split_last()?;
        self.level_at(prefix)?.specs.get(*last)?.as_ref()
    }

    /// The spec at `key`, mutably. The lock guards the key structure (`set`, `pop`, …), not
    /// in-place changes made through this reference.
    pub fn get_mut(&mut self, key: impl AsKey) -> Option<&mut TensorSpec> {
        let segs = key.segments();
        let (last, prefix) = segs.split_last()?;
        self.level_at_mut(prefix)?.specs.get_mut(*last)?.as_mut()
    }

    /// The spec at `key`, or an error: [`Error::KeyNotFound`] naming the available keys,
    /// [`Error::NotALevel`] when the path walks through a leaf, [`Error::WrongEntryKind`] when
    /// the entry is `None`.
    pub fn get_or_err(&self, key: impl AsKey) -> Result<&TensorSpec> {
        let segs = key.segments();
        check_segments("get", &segs)?;
        match self.get(&segs[..]) {
            Some(s) => Ok(s),
            None => Err(self.lookup_error("get", &segs)),
        }
    }

    fn lookup_error(&self, op: &'static str, segs: &[&str]) -> Error {
        let key = display_segments(segs);
        let mut cur = self;
        for (i, seg) in segs.iter().enumerate() {
            let last = i + 1 == segs.len();
            match cur.specs.get(*seg) {
                None => return cur.key_not_found(op, key, segs.get(..i).unwrap_or(segs)),
                Some(Some(TensorSpec::Composite(c))) if !last => cur = c,
                Some(_) if !last => {
                    return Error::NotALevel {
                        op,
                        key,
                        at: display_segments(segs.get(..=i).unwrap_or(segs)),
                    }
                }
                Some(None) => {
                    return Error::WrongEntryKind {
                        op,
                        key,
                        expected: "a spec",
                        found: "None",
                    }
                }
                Some(Some(_)) => break,
            }
        }
        Error::KeyNotFound {
            op,
            key,
            available: vec![],
        }
    }

    /// True when `key` names an entry (a spec, a nested Composite, or `None`).
    pub fn contains(&self, key: impl AsKey) -> bool {
        let segs = key.segments();
        match segs.split_last() {
            Some((last, prefix)) => self
                .level_at(prefix)
                .is_some_and(|l| l.specs.contains_key(*last)),
            None => false,
        }
    }

    /// Keys in insertion order, chosen as [`TensorDict::keys`] chooses them: with
    /// [`KeysOptions::nested`], keys of nested Composites are listed too (a level's own key
    /// comes after its children's, as in TorchRL); with [`KeysOptions::leaves_only`],
    /// Composites themselves are left out (`None` entries count as leaves).
    pub fn keys(&self, options: KeysOptions) -> Vec<NestedKey> {
        self.items(options).into_iter().map(|(k, _)| k).collect()
    }

    /// `(key, spec)` pairs with the rules of [`Composite::keys`]; `None` entries give `None`.
    pub fn items(&self, options: KeysOptions) -> Vec<(NestedKey, Option<&TensorSpec>)> {
        self.nested_items(options)
    }

    /// Every non-`None` leaf spec with its full key, in order.
    pub fn leaves(&self) -> Vec<(NestedKey, &TensorSpec)> {
        self.items(KeysOptions::nested_leaves())
            .into_iter()
            .filter_map(|(k, s)| s.map(|s| (k, s)))
            .collect()
    }

    /// With [`Recurse::No`]: true when there are no entries at all. With [`Recurse::Yes`]: true
    /// when there is no leaf spec at any depth (`None` entries and empty sub-composites do not
    /// count), so `Composite(a=Composite())` is non-empty unless recursing (TorchRL's
    /// `is_empty(recurse)`).
    pub fn is_empty(&self, recurse: Recurse) -> bool {
        if recurse == Recurse::No {
            return self.specs.is_empty();
        }
        self.specs.values().all(|v| match v {
            None => true,
            Some(TensorSpec::Composite(c)) => c.is_empty(Recurse::Yes),
            Some(_) => false,
        })
    }

    // ------------------------------------------------------------------ writes

    /// Sets `key` to `spec`, creating missing intermediate levels (with the parent level's
    /// shape and device). Validated first; on error nothing changes.
    ///
    /// Errors: reserved or empty keys ([`Error::InvalidKey`]); a path through a leaf
    /// ([`Error::NotALevel`]); leading dims that are not the level's shape
    /// ([`Error::BatchSizeMismatch`]); a device other than the composite's
    /// ([`Error::DeviceMismatch`]); a locked composite ([`Error::Locked`]).
    pub fn set(&mut self, key: impl AsKey, spec: impl Into<TensorSpec>) -> Result<()> {
        let segs = key.segments();
        self.set_entry("set", &segs, Some(spec.into()))
    }

    /// Sets `key` to `None` (a key without a spec), creating missing levels.
    pub fn set_none(&mut self, key: impl AsKey) -> Result<()> {
        let segs = key.segments();
        self.set_entry("set_none", &segs, None)
    }

    fn set_entry(
        &mut self,
        op: &'static str,
        segs: &[&str],
        value: Option<TensorSpec>,
    ) -> Result<()> {
        check_segments(op, segs)?;
        self.ensure_unlocked(op, segs)?;
        let Some((last, prefix)) = segs.split_last() else {
            return Ok(());
        };
        // The deepest existing level on the path gives the shape and device of the target.
        let mut cur: &Composite = self;
        for (i, seg) in prefix.iter().enumerate() {
            match cur.specs.get(*seg) {
                None => break,
                Some(Some(TensorSpec::Composite(c))) => cur = c,
                Some(_) => {
                    return Err(Error::NotALevel {
                        op,
                        key: display_segments(segs),
                        at: display_segments(segs.get(..=i).unwrap_or(segs)),
                    })
                }
            }
        }
        let key = display_segments(segs);
        let prepared = match value {
            None => None,
            Some(spec) => Some(prepare(op, &key, spec, &cur.shape, cur.device)?),
        };
        let mut cur: &mut Composite = self;
        for seg in prefix {
            let template = cur.empty();
            let entry = cur
                .specs
                .entry((*seg).to_string())
                .or_insert_with(|| Some(TensorSpec::Composite(template)));
            cur = match entry {
                Some(TensorSpec::Composite(c)) => c,
                // Rejected above; keep the tree intact anyway.
                _ => return Err(Error::invalid(op, "internal: path walks through a leaf")),
            };
        }
        cur.specs.insert((*last).to_string(), prepared);
        Ok(())
    }

    /// Removes and returns the entry at `key` (`Ok(None)` for a `None` entry). Errors when the
    /// key is absent (naming the available keys) or the composite is locked. Parent levels stay.
    pub fn pop(&mut self, key: impl AsKey) -> Result<Option<TensorSpec>> {
        let segs = key.segments();
        check_segments("pop", &segs)?;
        self.ensure_unlocked("pop", &segs)?;
        let Some((last, prefix)) = segs.split_last() else {
            return Err(self.lookup_error("pop", &segs));
        };
        let found = self
            .level_at_mut(prefix)
            .and_then(|l| l.specs.shift_remove(*last));
        match found {
            Some(v) => Ok(v),
            None => Err(self.lookup_error("pop", &segs)),
        }
    }

    /// Removes the entry at `key`: `Ok(true)` when it existed, `Ok(false)` when absent; errors
    /// when the composite is locked.
    pub fn remove(&mut self, key: impl AsKey) -> Result<bool> {
        let segs = key.segments();
        check_segments("remove", &segs)?;
        self.ensure_unlocked("remove", &segs)?;
        let Some((last, prefix)) = segs.split_last() else {
            return Ok(false);
        };
        Ok(self
            .level_at_mut(prefix)
            .and_then(|l| l.specs.shift_remove(*last))
            .is_some())
    }

    /// Merges `other` into `self`, recursively: where both hold a Composite at a key they are
    /// merged, otherwise `other`'s entry replaces (or adds) ours. Leaves on another device are
    /// moved to this composite's device (as TorchRL). On error nothing changes.
    pub fn update(&mut self, other: &Composite) -> Result<()> {
        if self.locked {
            let key = other
                .specs
                .keys()
                .next()
                .map(|k| display_segments(&[k.as_str()]))
                .unwrap_or_default();
            return Err(Error::Locked {
                op: "update",
                what: "Composite",
                key,
            });
        }
        let mut staged = self.copy(true);
        staged.update_inner(other, &NestedKey::default())?;
        *self = staged;
        Ok(())
    }

    fn update_inner(&mut self, other: &Composite, prefix: &NestedKey) -> Result<()> {
        for (k, v) in &other.specs {
            let key = prefix.join(k.as_str());
            if let (Some(TensorSpec::Composite(theirs)), Some(Some(TensorSpec::Composite(mine)))) =
                (v, self.specs.get_mut(k.as_str()))
            {
                if mine.locked {
                    return Err(Error::Locked {
                        op: "update",
                        what: "Composite",
                        key: key.to_string(),
                    });
                }
                mine.update_inner(theirs, &key)?;
                continue;
            }
            let value = match (v, self.device) {
                (Some(spec), Some(dev)) if spec.device().is_some_and(|d| d != dev) => {
                    Some(spec.to_device(dev)?)
                }
                (v, _) => v.clone(),
            };
            self.set_entry("update", &[k.as_str()], value)
                .map_err(|e| rekey(e, &key.to_string()))?;
        }
        Ok(())
    }

    /// The composite with a new, longer shape extending the current one (children must fit).
    fn reshape_batch(&self, op: &'static str, new: &[i64]) -> Result<Composite> {
        let mut out = self.copy(true);
        out.shape = new.to_vec();
        for (k, v) in out.specs.iter_mut() {
            match v {
                Some(TensorSpec::Composite(c)) if !starts_with(&c.shape, new) => {
                    *c = c.reshape_batch(op, new)?;
                }
                Some(spec) if !starts_with(spec.shape(), new) => {
                    return Err(Error::BatchSizeMismatch {
                        op,
                        key: display_segments(&[k.as_str()]),
                        batch_size: new.to_vec(),
                        shape: spec.shape().to_vec(),
                    });
                }
                _ => {}
            }
        }
        Ok(out)
    }

    /// Moves the composite and every leaf to `device`.
    pub fn to_device(&self, device: Device) -> Result<Composite> {
        let mut out = self.copy(false);
        out.device = Some(device);
        for spec in out.specs.values_mut().flatten() {
            *spec = spec.to_device(device)?;
        }
        Ok(out)
    }
}

/// Validates `spec` for insertion at a level of shape `shape` and device `device`.
fn prepare(
    op: &'static str,
    key: &str,
    spec: TensorSpec,
    shape: &[i64],
    device: Option<Device>,
) -> Result<TensorSpec> {
    let mut spec = spec;
    if let Some(dev) = device {
        match spec.device() {
            None => spec = spec.to_device(dev)?,
            Some(d) if d != dev => {
                return Err(Error::DeviceMismatch {
                    op,
                    key: key.to_string(),
                    expected: dev,
                    actual: d,
                })
            }
            Some(_) => {}
        }
    }
    let sshape = spec.shape().to_vec();
    if !starts_with(&sshape, shape) {
        let extendable = sshape.len() < shape.len() && starts_with(shape, &sshape);
        spec = match spec {
            TensorSpec::Composite(c) if extendable => {
                TensorSpec::Composite(c.reshape_batch(op, shape).map_err(|e| match e {
                    Error::BatchSizeMismatch {
                        op,
                        key: sub,
                        batch_size,
                        shape,
                    } => Error::BatchSizeMismatch {
                        op,
                        key: format!("{key} (child {sub})"),
                        batch_size,
                        shape,
                    },
                    other => other,
                })?)
            }
            TensorSpec::NonTensor(n) if extendable => TensorSpec::NonTensor(n.with_shape(shape)?),
            _ => {
                return Err(Error::BatchSizeMismatch {
                    op,
                    key: key.to_string(),
                    batch_size: shape.to_vec(),
                    shape: sshape,
                })
            }
        };
    }
    Ok(spec)
}

impl Composite {
    /// Writes the tree: the header line, then one line per entry indented by `indent + 4`
    /// spaces (nested Composites recursively, leaves with their one-line `Display`).
    fn fmt_tree(&self, f: &mut fmt::Formatter<'_>, indent: usize) -> fmt::Result {
        write!(f, "Composite(shape={}", ShapeFmt(&self.shape))?;
        if let Some(d) = self.device {
            write!(f, ", device={d:?}")?;
        }
        write!(f, ")")?;
        let pad = indent + 4;
        for (k, v) in &self.specs {
            write!(f, "\n{:pad$}{k}: ", "")?;
            match v {
                Some(TensorSpec::Composite(c)) => c.fmt_tree(f, pad)?,
                Some(s) => write!(f, "{s}")?,
                None => write!(f, "None")?,
            }
        }
        Ok(())
    }
}

impl fmt::Display for Composite {
    /// A readable tree: `Composite(shape=[..])` (with the device when set), then one line per
    /// entry, `key: <spec>`, nested Composites indented by 4 more spaces, leaves on one line
    /// with their own `Display`, and `key: None` for entries without a spec.
    ///
    /// ```
    /// use torchrl::specs::{Categorical, Composite, Unbounded};
    /// # fn main() -> torchrl::Result<()> {
    /// let spec = Composite::new([3])?
    ///     .with("obs", Unbounded::new().with_shape([3, 2])?)?
    ///     .with_none("info")?
    ///     .with(("next", "action"), Categorical::new(4)?.with_shape([3])?)?;
    /// assert_eq!(
    ///     spec.to_string(),
    ///     "Composite(shape=[3])\n\
    ///      \x20   obs: Unbounded(shape=[3, 2], dtype=Float)\n\
    ///      \x20   info: None\n\
    ///      \x20   next: Composite(shape=[3])\n\
    ///      \x20       action: Categorical(shape=[3], dtype=Int64, n=4)"
    /// );
    /// # Ok(()) }
    /// ```
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.fmt_tree(f, 0)
    }
}

impl fmt::Debug for Composite {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::specs::{NonTensor, Unbounded};

    fn leaf(shape: &[i64]) -> TensorSpec {
        Unbounded::new().with_shape(shape).unwrap().into()
    }

    #[test]
    fn prepare_extends_prefix_composites_and_non_tensors() {
        let child = Composite::new([])
            .unwrap()
            .with("x", leaf(&[3, 2]))
            .unwrap();
        let out = prepare("set", "\"c\"", child.into(), &[3], None).unwrap();
        assert_eq!(out.shape(), &[3]);
        let nt = NonTensor::new().with_shape([]).unwrap();
        let out = prepare("set", "\"n\"", nt.into(), &[3], None).unwrap();
        assert_eq!(out.shape(), &[3]);
        // a leaf is never reshaped
        let err = prepare("set", "\"l\"", leaf(&[]), &[3], None).unwrap_err();
        assert!(matches!(err, Error::BatchSizeMismatch { .. }));
        // a child whose own leaves do not fit names the child key
        let bad = Composite::new([]).unwrap().with("x", leaf(&[2])).unwrap();
        let err = prepare("set", "\"c\"", bad.into(), &[3], None).unwrap_err();
        assert!(err.to_string().contains("\"x\""), "{err}");
    }

    #[test]
    fn rekey_names_full_key() {
        let e = Error::NotInSpec {
            op: "project",
            key: "<value>".into(),
            spec: "s".into(),
            reason: "r".into(),
        };
        assert!(rekey(e, "(\"a\", \"b\")")
            .to_string()
            .contains("(\"a\", \"b\")"));
    }

    #[test]
    fn protected_dims_of_each_class() {
        assert_eq!(protected_dims(&leaf(&[2])), 0);
        let oh: TensorSpec = crate::data::specs::OneHot::new(2).unwrap().into();
        assert_eq!(protected_dims(&oh), 1);
    }

    #[test]
    fn update_preserves_nested_locks() {
        let mut c = Composite::new([]).unwrap();
        let mut sub = Composite::new([]).unwrap().with("x", leaf(&[1])).unwrap();
        sub.lock();
        c.set("sub", sub).unwrap();
        c.set("y", leaf(&[1])).unwrap();
        let other = Composite::new([]).unwrap().with("y", leaf(&[2])).unwrap();
        c.update(&other).unwrap();
        assert!(c
            .get("sub")
            .and_then(|s| s.as_composite())
            .is_some_and(|s| s.is_locked()));
        // merging into the locked child fails and changes nothing
        let into_sub = Composite::new([])
            .unwrap()
            .with(("sub", "z"), leaf(&[1]))
            .unwrap();
        let before = c.clone();
        assert!(matches!(c.update(&into_sub), Err(Error::Locked { .. })));
        assert_eq!(c, before);
    }
}
