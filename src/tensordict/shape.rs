//! Shape operations on the batch dims of a [`TensorDict`]: indexing, expand, reshape, view,
//! (un)squeeze, permute, unbind, split, and the free functions [`stack`] and [`cat`].
//!
//! ```
//! use tch::{Device, Kind, Tensor};
//! use torchrl::{stack, BatchIndex, TensorDict};
//! # fn main() -> torchrl::Result<()> {
//! let td = TensorDict::new([3, 4])?
//!     .with("a", Tensor::zeros([3, 4, 5], (Kind::Float, Device::Cpu)))?;
//! assert_eq!(td.index(&[BatchIndex::Int(0)])?.batch_size(), &[4]);
//! assert_eq!(td.index(&[BatchIndex::Ellipsis, 0.into()])?.batch_size(), &[3]);
//! assert_eq!(td.reshape([-1])?.get("a").map(|t| t.size()), Some(vec![12, 5]));
//! let s = stack(&[td.clone(), td.clone()], 1)?;
//! assert_eq!(s.get("a").map(|t| t.size()), Some(vec![3, 2, 4, 5]));
//! # Ok(()) }
//! ```

use std::borrow::Borrow;

use tch::Tensor;

use super::index::{apply_plan, prepare_write, resolve, BatchIndex};
use super::{
    display_segments, refuse_negative_dims, Dims, Entry, KeysOptions, NestedKey, TensorDict,
};
use crate::error::{Error, Result, ShapeFmt};
use crate::host::stack::Reserve;
use crate::host::stack_plan::{self, Leaf};

/// Normalises `dim` (negative counts from the end) against `ndim` positions: the batch dims of
/// `batch`, or one more where a new dim is inserted (unsqueeze, stack). The error names `batch`.
fn norm_dim(op: &'static str, dim: i64, ndim: usize, batch: &[i64]) -> Result<usize> {
    super::wrap_dim(dim, ndim).ok_or_else(|| dim_error(op, dim, ndim, batch))
}

/// The error for a dim outside `-ndim..ndim`.
fn dim_error(op: &'static str, dim: i64, ndim: usize, batch: &[i64]) -> Error {
    let what = if ndim == batch.len() {
        "batch dims"
    } else {
        "new-dim positions"
    };
    Error::IndexOutOfRange {
        op,
        index: dim,
        what: format!("{what} (batch size {})", ShapeFmt(batch)),
        size: ndim as i64,
    }
}

/// Resolves `-1` in a target shape given the element count. The product of the sizes is
/// computed with overflow checks: a shape whose product does not fit in `i64` is an error.
fn infer_shape(op: &'static str, shape: &[i64], numel: i64, from: &[i64]) -> Result<Vec<i64>> {
    let mut unknown = shape
        .iter()
        .enumerate()
        .filter(|(_, d)| **d == -1)
        .map(|(i, _)| i);
    let first_unknown = unknown.next();
    if unknown.next().is_some() || shape.iter().any(|d| *d < -1) {
        return Err(Error::argument(
            op,
            "shape",
            "a valid shape: sizes >= -1, at most one of them -1",
            format!("invalid shape {}", ShapeFmt(shape)),
        ));
    }
    let mismatch = || Error::ShapeMismatch {
        op,
        key: "<batch>".into(),
        expected: from.to_vec(),
        actual: shape.to_vec(),
    };
    let known = shape
        .iter()
        .filter(|d| **d != -1)
        .try_fold(1i64, |acc, d| acc.checked_mul(*d))
        .ok_or_else(|| {
            Error::argument(
                op,
                "shape",
                format!(
                    "a shape whose element count fits in i64 (batch size {})",
                    ShapeFmt(from)
                ),
                format!(
                    "shape {}, which has more elements than fit in i64",
                    ShapeFmt(shape)
                ),
            )
        })?;
    let mut out = shape.to_vec();
    match first_unknown {
        Some(u) => {
            if known == 0 || numel % known != 0 {
                return Err(mismatch());
            }
            let slot = out.get_mut(u).ok_or_else(mismatch)?;
            *slot = numel / known;
        }
        None if known != numel => return Err(mismatch()),
        None => {}
    }
    Ok(out)
}

/// The dims of `shape` after its first `nd`: a leaf's feature dims, or a nested level's extra
/// batch dims. A shape with fewer than `nd` dims breaks the tensordict's invariants (every
/// level's batch size is a prefix of its leaves' shapes): an error, not a panic.
fn dims_after<'a>(op: &'static str, shape: &'a [i64], nd: usize) -> Result<&'a [i64]> {
    shape.get(nd..).ok_or_else(|| {
        Error::invalid(
            op,
            format!(
                "internal: shape {} has fewer than the {nd} batch dims",
                ShapeFmt(shape)
            ),
        )
    })
}

impl TensorDict {
    /// Normalises batch dim `dim` (negative counts from the end) and returns it with its size.
    fn batch_dim(&self, op: &'static str, dim: i64) -> Result<(usize, i64)> {
        let bs = &self.batch_size;
        let d = norm_dim(op, dim, bs.len(), bs)?;
        let size = bs
            .get(d)
            .copied()
            .ok_or_else(|| dim_error(op, dim, bs.len(), bs))?;
        Ok((d, size))
    }

    /// An empty vector with room for `count` pieces of `self` (from unbind or split): an error
    /// naming the batch size, rather than an abort, when that much memory cannot be had (a
    /// tensordict without leaves can have a batch dim of any size).
    fn pieces<T>(&self, op: &'static str, count: i64) -> Result<Vec<T>> {
        let mut v = Vec::new();
        usize::try_from(count)
            .ok()
            .and_then(|n| v.try_reserve_exact(n).ok())
            .ok_or_else(|| {
                Error::invalid(
                    op,
                    format!(
                        "cannot allocate {count} pieces of batch size {}",
                        ShapeFmt(&self.batch_size)
                    ),
                )
            })?;
        Ok(v)
    }

    /// Rebuilds the tree with new root batch dims, mapping every leaf with `f`. Nested levels
    /// keep their extra batch dims after the new root ones.
    pub(crate) fn map_batch<F>(&self, new_batch: &[i64], f: &mut F) -> Result<TensorDict>
    where
        F: FnMut(&Tensor) -> Result<Tensor>,
    {
        self.map_batch_rec(self.batch_size.len(), new_batch, f)
    }

    fn map_batch_rec<F>(&self, root_nd: usize, new_root: &[i64], f: &mut F) -> Result<TensorDict>
    where
        F: FnMut(&Tensor) -> Result<Tensor>,
    {
        let mut batch: Dims = new_root.iter().copied().collect();
        batch.extend_from_slice(dims_after("map_batch", &self.batch_size, root_nd)?);
        rebuild(self, batch, |_, e| {
            Ok(match e {
                Entry::Tensor(t) => Entry::Tensor(f(t)?),
                Entry::Dict(d) => Entry::Dict(d.map_batch_rec(root_nd, new_root, f)?),
            })
        })
    }

    /// Indexes the batch dims (like `td[idx]` in Python). Indexing past the batch dims is an
    /// error. Integer and slice indices give views that share storage; masks and index tensors
    /// copy.
    pub fn index(&self, idx: &[BatchIndex]) -> Result<TensorDict> {
        let plan = resolve("index", idx, &self.batch_size)?;
        self.map_batch(&plan.batch, &mut |t| apply_plan(t, &plan))
    }

    /// Writes `value` into the batch region selected by `idx` (like `td[idx] = value`). `value`
    /// must have the indexed batch size and the same leaves with matching shapes. Everything
    /// (keys, shapes, and that every destination can be written in place) is checked before
    /// anything is written, so a failed call leaves `self` unchanged; writing into a leaf that
    /// is an expanded view (several elements sharing one memory location) is an error naming
    /// its key.
    pub fn set_at(&mut self, idx: &[BatchIndex], value: &TensorDict) -> Result<()> {
        let op = "set_at";
        let plan = resolve(op, idx, &self.batch_size)?;
        if value.batch_size.as_slice() != plan.batch.as_slice() {
            return Err(Error::ShapeMismatch {
                op,
                key: "<batch_size>".into(),
                expected: plan.batch.clone(),
                actual: value.batch_size.to_vec(),
            });
        }
        // Check leaf sets and shapes first.
        let mine = self.leaves();
        let theirs = value.leaves();
        let mk: Vec<&NestedKey> = mine.iter().map(|(k, _)| k).collect();
        let tk: Vec<&NestedKey> = theirs.iter().map(|(k, _)| k).collect();
        let only_first: Vec<String> = tk
            .iter()
            .filter(|k| !mk.contains(k))
            .map(|k| k.to_string())
            .collect();
        if !only_first.is_empty() {
            return Err(Error::KeySetMismatch {
                op,
                only_first,
                only_second: vec![],
            });
        }
        let nd = self.batch_size.len();
        let mut writes = Vec::with_capacity(theirs.len());
        for (k, src) in &theirs {
            let dest = self
                .get(k)
                .ok_or_else(|| self.lookup_error(op, &k.parts().collect::<Vec<_>>()))?;
            let mut expected = plan.batch.clone();
            expected.extend_from_slice(dims_after(op, &dest.size(), nd)?);
            let actual = src.size();
            if actual != expected {
                return Err(Error::ShapeMismatch {
                    op,
                    key: k.to_string(),
                    expected,
                    actual,
                });
            }
            writes.push(prepare_write(op, &k.to_string(), dest, &plan, src)?);
        }
        // Every destination was checked and every argument prepared: now write.
        let _guard = tch::no_grad_guard();
        for w in writes {
            w.run()?;
        }
        Ok(())
    }

    /// Expands the batch dims to `shape`: the trailing dims of `shape` must equal the current
    /// batch size, or be expanded from 1 (leaves become `[*shape, *feature_dims]`). Sizes are
    /// explicit: a negative size (libtorch's "keep this dim") is an error.
    pub fn expand(&self, shape: impl AsRef<[i64]>) -> Result<TensorDict> {
        let shape = shape.as_ref();
        if shape.iter().any(|d| *d < 0) {
            let context = format!(" for batch size {}", ShapeFmt(&self.batch_size));
            refuse_negative_dims("expand", "shape", shape, &context)?;
        }
        let nd = self.batch_size.len();
        let ok = shape
            .len()
            .checked_sub(nd)
            .and_then(|lead| shape.get(lead..))
            .is_some_and(|tail| {
                tail.iter()
                    .zip(&self.batch_size)
                    .all(|(n, o)| n == o || *o == 1)
            });
        if !ok {
            return Err(Error::ShapeMismatch {
                op: "expand",
                key: "<batch_size>".into(),
                expected: self.batch_size.to_vec(),
                actual: shape.to_vec(),
            });
        }
        self.map_batch(shape, &mut |t| {
            let size = t.size();
            let mut target = shape.to_vec();
            target.extend_from_slice(dims_after("expand", &size, nd)?);
            Ok(t.f_expand(&target, false)?)
        })
    }

    fn reshape_impl(&self, op: &'static str, shape: &[i64], view: bool) -> Result<TensorDict> {
        let new = infer_shape(op, shape, self.numel(), &self.batch_size)?;
        let nd = self.batch_size.len();
        self.map_batch(&new, &mut |t| {
            let size = t.size();
            let mut target = new.clone();
            target.extend_from_slice(dims_after(op, &size, nd)?);
            Ok(if view {
                t.f_view(target.as_slice())?
            } else {
                t.f_reshape(&target)?
            })
        })
    }

    /// Reshapes the batch dims (one `-1` allowed); leaves keep their feature dims.
    pub fn reshape(&self, shape: impl AsRef<[i64]>) -> Result<TensorDict> {
        self.reshape_impl("reshape", shape.as_ref(), false)
    }

    /// Like [`TensorDict::reshape`] but never copies: errors when a leaf is not viewable.
    pub fn view(&self, shape: impl AsRef<[i64]>) -> Result<TensorDict> {
        self.reshape_impl("view", shape.as_ref(), true)
    }

    /// Inserts a batch dim of size 1 at `dim` (counted within the batch dims; negative counts
    /// from `batch_dims + 1`).
    pub fn unsqueeze(&self, dim: i64) -> Result<TensorDict> {
        let d = norm_dim(
            "unsqueeze",
            dim,
            self.batch_size.len() + 1,
            &self.batch_size,
        )?;
        let mut new = self.batch_size.to_vec();
        new.insert(d, 1);
        self.map_batch(&new, &mut |t| Ok(t.f_unsqueeze(d as i64)?))
    }

    /// Removes batch dim `dim` (which must have size 1), or every size-1 batch dim with `None`.
    pub fn squeeze(&self, dim: Option<i64>) -> Result<TensorDict> {
        let dims: Vec<usize> = match dim {
            Some(dim) => {
                let (d, size) = self.batch_dim("squeeze", dim)?;
                if size != 1 {
                    return Ok(self.clone());
                }
                vec![d]
            }
            None => self
                .batch_size
                .iter()
                .enumerate()
                .filter(|(_, n)| **n == 1)
                .map(|(i, _)| i)
                .collect(),
        };
        let new: Vec<i64> = self
            .batch_size
            .iter()
            .enumerate()
            .filter(|(i, _)| !dims.contains(i))
            .map(|(_, n)| *n)
            .collect();
        self.map_batch(&new, &mut |t| {
            let mut cur = t.shallow_clone();
            for d in dims.iter().rev() {
                cur = cur.f_squeeze_dim(*d as i64)?;
            }
            Ok(cur)
        })
    }

    /// Permutes the batch dims; `dims` must be a permutation of `0..batch_dims`.
    pub fn permute(&self, dims: impl AsRef<[i64]>) -> Result<TensorDict> {
        let dims = dims.as_ref();
        let nd = self.batch_size.len();
        let not_a_permutation = || {
            let all: Vec<i64> = (0..nd as i64).collect();
            Error::argument(
                "permute",
                "dims",
                format!(
                    "a permutation of {} (batch size {})",
                    ShapeFmt(&all),
                    ShapeFmt(&self.batch_size)
                ),
                format!("dims {}, which are not a permutation", ShapeFmt(dims)),
            )
        };
        if dims.len() != nd {
            return Err(not_a_permutation());
        }
        let mut norm = Vec::with_capacity(nd);
        for d in dims {
            norm.push(norm_dim("permute", *d, nd, &self.batch_size)?);
        }
        let mut sorted = norm.clone();
        sorted.sort_unstable();
        if sorted != (0..nd).collect::<Vec<_>>() {
            return Err(not_a_permutation());
        }
        let new = norm
            .iter()
            .map(|d| {
                self.batch_size
                    .get(*d)
                    .copied()
                    .ok_or_else(not_a_permutation)
            })
            .collect::<Result<Vec<i64>>>()?;
        self.map_batch(&new, &mut |t| {
            let mut perm: Vec<i64> = norm.iter().map(|d| *d as i64).collect();
            perm.extend((nd as i64)..(t.dim() as i64));
            Ok(t.f_permute(&perm)?)
        })
    }

    /// Splits along batch dim `dim` into `batch_size[dim]` tensordicts (views).
    pub fn unbind(&self, dim: i64) -> Result<Vec<TensorDict>> {
        let (d, size) = self.batch_dim("unbind", dim)?;
        let mut out = self.pieces("unbind", size)?;
        for i in 0..size {
            let mut idx: Vec<BatchIndex> = (0..d).map(|_| BatchIndex::full()).collect();
            idx.push(BatchIndex::Int(i));
            out.push(self.index(&idx)?);
        }
        Ok(out)
    }

    /// Splits along batch dim `dim` into pieces of the given sizes (which must sum to the dim).
    pub fn split(&self, sizes: &[i64], dim: i64) -> Result<Vec<TensorDict>> {
        let (d, size) = self.batch_dim("split", dim)?;
        // Checked: huge sizes must not overflow (a panic in debug builds).
        let total = sizes.iter().try_fold(
            0i64,
            |acc, s| if *s < 0 { None } else { acc.checked_add(*s) },
        );
        if total != Some(size) {
            return Err(Error::argument(
                "split",
                "sizes",
                format!(
                    "non-negative split sizes that sum to batch dim {d} of size {size} (batch size {})",
                    ShapeFmt(&self.batch_size)
                ),
                format!("split sizes {}", ShapeFmt(sizes)),
            ));
        }
        // The sizes are non-negative and their sum fits: no partial sum overflows.
        let mut out = self.pieces("split", sizes.len() as i64)?;
        let mut start = 0i64;
        for s in sizes {
            let end = start.saturating_add(*s);
            let mut idx: Vec<BatchIndex> = (0..d).map(|_| BatchIndex::full()).collect();
            idx.push(BatchIndex::slice(Some(start), Some(end), 1));
            start = end;
            out.push(self.index(&idx)?);
        }
        Ok(out)
    }

    /// Splits along batch dim `dim` into chunks of `size` (the last may be smaller).
    pub fn chunk_by(&self, size: i64, dim: i64) -> Result<Vec<TensorDict>> {
        let (_, n) = self.batch_dim("split", dim)?;
        if size < 1 {
            return Err(Error::argument(
                "split",
                "size",
                "a split size >= 1",
                size.to_string(),
            ));
        }
        let full = n / size;
        let rest = n % size;
        let mut sizes = self.pieces("split", full + i64::from(rest != 0))?;
        sizes.resize(full as usize, size);
        if rest != 0 {
            sizes.push(rest);
        }
        self.split(&sizes, dim)
    }
}

/// Checks the structure of `tds` for stack/cat: same key sets at every level, nested level
/// batch extensions equal, and returns nothing on success.
/// True when `a` and `b` have the same keys at every level, with leaves and levels in the
/// same places (allocation-free; the detailed error is built only on a mismatch).
fn same_structure(a: &TensorDict, b: &TensorDict) -> bool {
    a.entries.len() == b.entries.len()
        && a.entries.iter().all(|(k, e)| match (e, b.entries.get(k)) {
            (Entry::Tensor(_), Some(Entry::Tensor(_))) => true,
            (Entry::Dict(x), Some(Entry::Dict(y))) => same_structure(x, y),
            _ => false,
        })
}

fn check_structure(
    op: &'static str,
    first: &TensorDict,
    other: &TensorDict,
    i: usize,
) -> Result<()> {
    if same_structure(first, other) {
        return Ok(());
    }
    let a: Vec<NestedKey> = first.keys(KeysOptions::nested());
    let b: Vec<NestedKey> = other.keys(KeysOptions::nested());
    if a.len() != b.len() || a.iter().any(|k| !b.contains(k)) {
        return Err(Error::KeySetMismatch {
            op,
            only_first: a
                .iter()
                .filter(|k| !b.contains(k))
                .map(|k| k.to_string())
                .collect(),
            only_second: b
                .iter()
                .filter(|k| !a.contains(k))
                .map(|k| format!("{k} (in tensordict {i})"))
                .collect(),
        });
    }
    for (k, e) in first.items(KeysOptions::nested()) {
        let o = other.get_entry(&k);
        match (e, o) {
            (Entry::Tensor(_), Some(Entry::Tensor(_))) | (Entry::Dict(_), Some(Entry::Dict(_))) => {
            }
            (_, Some(o)) => {
                return Err(Error::WrongEntryKind {
                    op,
                    key: format!("{k} (in tensordict {i})"),
                    expected: e.kind_name(),
                    found: o.kind_name(),
                })
            }
            (_, None) => {}
        }
    }
    Ok(())
}

/// Stacks tensordicts along a new batch dim `dim` (in `-(n+1)..=n` for `n` batch dims).
///
/// TorchRL's strict dense stack: the batch sizes must be equal, the key sets identical and the
/// leaf shapes equal; each failure names the tensordict and key at fault. The result is dense.
///
/// Along a dim after the first, the leaves whose inputs are plain CPU data (contiguous, no
/// autograd) are computed on the host into **one allocation**: each such leaf of the result is
/// a contiguous view into a shared buffer, as after tensordict's `consolidate()`. Rollouts
/// return megabytes this way with one `malloc` instead of one per leaf (see
/// `docs/performance.md`); the buffer is freed when the last of these leaves is dropped.
///
/// ```
/// use tch::Tensor;
/// use torchrl::{stack, TensorDict};
/// # fn main() -> torchrl::Result<()> {
/// let step = |r: f32| -> torchrl::Result<TensorDict> {
///     TensorDict::new([2])?
///         .with("reward", Tensor::from_slice(&[r, r + 1.0]).view([2, 1]))?
///         .with("done", Tensor::from_slice(&[false, r > 5.0]).view([2, 1]))
/// };
/// // Two steps of a batch of 2, stacked along a time dim after the batch dim.
/// let traj = stack(&[step(0.0)?, step(10.0)?], 1)?;
/// assert_eq!(traj.batch_size(), &[2, 2]);
/// let r = traj.get_or_err("reward")?;
/// assert_eq!(r.size(), vec![2, 2, 1]);
/// assert_eq!(r.double_value(&[1, 0, 0]), 1.0); // batch element 1, step 0
/// assert_eq!(r.double_value(&[1, 1, 0]), 11.0); // batch element 1, step 1
/// assert!(r.is_contiguous());
/// assert!(traj.get_or_err("done")?.int64_value(&[1, 1, 0]) == 1);
/// # Ok(()) }
/// ```
pub fn stack<T: Borrow<TensorDict>>(tds: &[T], dim: i64) -> Result<TensorDict> {
    stack_reserved(tds, dim, None)
}

/// Memory set aside for a later [`stack`] of `n` tensordicts shaped like a given one, along a
/// dim after the first: [`StackReserve::stack`] computes its plain CPU leaves into this buffer
/// instead of allocating one then. A rollout reserves its buffer at its first step, before the
/// steps' own tensors are allocated, so that the allocator can place it where the previous
/// rollout's buffer was (warm pages instead of a page fault per 4 KiB; see
/// `docs/performance.md`). The result is the same as [`stack`]'s.
///
/// ```
/// use tch::{Device, Kind, Tensor};
/// use torchrl::tensordict::StackReserve;
/// use torchrl::{stack, TensorDict};
/// # fn main() -> torchrl::Result<()> {
/// let step = |v: f64| -> torchrl::Result<TensorDict> {
///     TensorDict::new([2])?.with("r", Tensor::full([2, 1], v, (Kind::Float, Device::Cpu)))
/// };
/// let steps = [step(0.0)?, step(1.0)?];
/// let reserve = StackReserve::new(&steps[0], steps.len())?;
/// let traj = reserve.stack(&steps, 1)?;
/// assert!(traj.get_or_err("r")?.equal(stack(&steps, 1)?.get_or_err("r")?));
/// // Without a reserve (or for another number of tensordicts) it is a plain `stack`.
/// assert_eq!(StackReserve::none().stack(&steps, 1)?.batch_size(), &[2, 2]);
/// # Ok(()) }
/// ```
pub struct StackReserve {
    reserve: Option<Reserve>,
    n: usize,
}

impl StackReserve {
    /// A buffer for stacking `n` tensordicts with `like`'s leaves (shapes and dtypes) along a
    /// dim after the first. Reserves nothing when none of `like`'s leaves is plain CPU data.
    pub fn new(like: &TensorDict, n: usize) -> Result<Self> {
        let each_leaf = |f: &mut dyn FnMut(&Tensor)| {
            like.for_each_leaf(&mut |_, t| {
                f(t);
                Ok(())
            })
        };
        Ok(StackReserve {
            reserve: crate::host::stack::reserve(each_leaf, n)?,
            n,
        })
    }

    /// No reserved memory: [`StackReserve::stack`] is then [`stack`].
    pub fn none() -> Self {
        StackReserve {
            reserve: None,
            n: 0,
        }
    }

    /// [`stack`] of `tds` along `dim`, into the reserved buffer when there are exactly the `n`
    /// tensordicts it was reserved for and it is big enough (else into a new one).
    pub fn stack<T: Borrow<TensorDict>>(self, tds: &[T], dim: i64) -> Result<TensorDict> {
        let reserve = self.reserve.filter(|_| tds.len() == self.n);
        stack_reserved(tds, dim, reserve)
    }
}

impl Default for StackReserve {
    fn default() -> Self {
        Self::none()
    }
}

impl std::fmt::Debug for StackReserve {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StackReserve")
            .field("n", &self.n)
            .field("reserved", &self.reserve.is_some())
            .finish()
    }
}

/// [`stack`], with the consolidated buffer taken from `reserve` when it is big enough.
fn stack_reserved<T: Borrow<TensorDict>>(
    tds: &[T],
    dim: i64,
    reserve: Option<Reserve>,
) -> Result<TensorDict> {
    let op = "stack";
    let first = first_td(op, tds)?;
    let nd = first.batch_size.len();
    let d = norm_dim(op, dim, nd + 1, &first.batch_size)?;
    for (i, td) in tds.iter().enumerate().skip(1) {
        let td = td.borrow();
        if td.batch_size != first.batch_size {
            return Err(Error::ShapeMismatch {
                op,
                key: format!("<batch_size of tensordict {i}>"),
                expected: first.batch_size.to_vec(),
                actual: td.batch_size.to_vec(),
            });
        }
        check_structure(op, first, td, i)?;
    }
    stack_level(tds, d, &mut Vec::new(), reserve)
}

fn stack_level<T: Borrow<TensorDict>>(
    tds: &[T],
    d: usize,
    path: &mut Vec<String>,
    reserve: Option<Reserve>,
) -> Result<TensorDict> {
    let tds: Vec<&TensorDict> = tds.iter().map(|t| t.borrow()).collect();
    let mut leaves = Vec::new();
    collect_leaves(&tds, path, &mut leaves)?;
    let n = tds.len() as i64;
    let mut outputs = stack_plan::stack_leaves(&leaves, d, reserve)?.into_iter();
    let first = first_td("stack", &tds)?;
    build_level(first, d, n, &mut outputs)
}

/// Walks `tds` in the first one's key order, checking the leaf shapes and nested batch sizes
/// (the key sets were checked by the caller), and appends every leaf.
fn collect_leaves<'a>(
    tds: &[&'a TensorDict],
    path: &mut Vec<String>,
    leaves: &mut Vec<Leaf<'a>>,
) -> Result<()> {
    let Some(first) = tds.first() else {
        return Ok(());
    };
    for (k, e) in &first.entries {
        path.push(k.to_string());
        match e {
            Entry::Tensor(t0) => {
                let shape0 = t0.size();
                let mut ts = Vec::with_capacity(tds.len());
                for (i, td) in tds.iter().enumerate() {
                    let t = match td.entries.get(k) {
                        Some(Entry::Tensor(t)) => t,
                        _ => return Err(missing(path, i)),
                    };
                    if i > 0 {
                        let s = t.size();
                        if s != shape0 {
                            return Err(Error::ShapeMismatch {
                                op: "stack",
                                key: format!("{} (in tensordict {i})", display_path(path)),
                                expected: shape0,
                                actual: s,
                            });
                        }
                    }
                    ts.push(t);
                }
                leaves.push(Leaf {
                    inputs: ts,
                    shape: shape0,
                });
            }
            Entry::Dict(_) => {
                let mut subs = Vec::with_capacity(tds.len());
                for (i, td) in tds.iter().enumerate() {
                    match td.entries.get(k) {
                        Some(Entry::Dict(s)) => subs.push(s),
                        _ => return Err(missing(path, i)),
                    }
                }
                let b0 = &first_sub(&subs, path)?.batch_size;
                if let Some((i, s)) = subs.iter().enumerate().find(|(_, s)| &s.batch_size != b0) {
                    return Err(Error::ShapeMismatch {
                        op: "stack",
                        key: format!("{} (batch size in tensordict {i})", display_path(path)),
                        expected: b0.to_vec(),
                        actual: s.batch_size.to_vec(),
                    });
                }
                collect_leaves(&subs, path, leaves)?;
            }
        }
        path.pop();
    }
    Ok(())
}

/// Rebuilds the tree of `first` with the stacked leaves, in `collect_leaves` order.
fn build_level(
    first: &TensorDict,
    d: usize,
    n: i64,
    outputs: &mut std::vec::IntoIter<Tensor>,
) -> Result<TensorDict> {
    let mut batch: Dims = first.batch_size.clone();
    batch.insert(d, n);
    rebuild(first, batch, |_, e| {
        Ok(match e {
            Entry::Tensor(_) => Entry::Tensor(outputs.next().ok_or_else(|| {
                Error::invalid("stack", "internal: fewer stacked leaves than leaves")
            })?),
            Entry::Dict(sub) => Entry::Dict(build_level(sub, d, n, outputs)?),
        })
    })
}

/// A level of batch dims `batch` on `src`'s device whose entries are `src`'s, in order, each
/// mapped by `f` (given its name and entry).
fn rebuild<F>(src: &TensorDict, batch: Dims, mut f: F) -> Result<TensorDict>
where
    F: FnMut(&std::sync::Arc<str>, &Entry) -> Result<Entry>,
{
    let mut out = TensorDict::empty_level(batch, src.device);
    for (k, e) in &src.entries {
        out.entries.insert(k.clone(), f(k, e)?);
    }
    Ok(out)
}

/// The first of the nested levels collected at `path` (there is one per input, and at least
/// one input).
fn first_sub<'a>(subs: &[&'a TensorDict], path: &[String]) -> Result<&'a TensorDict> {
    subs.first().copied().ok_or_else(|| missing(path, 0))
}

fn display_path(path: &[String]) -> String {
    let segs: Vec<&str> = path.iter().map(String::as_str).collect();
    display_segments(&segs)
}

fn missing(path: &[String], i: usize) -> Error {
    Error::KeyNotFound {
        op: "stack",
        key: format!("{} (in tensordict {i})", display_path(path)),
        available: vec![],
    }
}

/// The first of `tds`, or `op`'s error for an empty list.
fn first_td<'a, T: Borrow<TensorDict>>(op: &'static str, tds: &'a [T]) -> Result<&'a TensorDict> {
    let verb = if op == "cat" { "concatenate" } else { "stack" };
    tds.first().map(Borrow::borrow).ok_or_else(|| {
        Error::argument(
            op,
            "tds",
            format!("a non-empty list of tensordicts to {verb}"),
            format!("an empty list (cannot {verb} an empty list of tensordicts)"),
        )
    })
}

/// Concatenates tensordicts along existing batch dim `dim`. Key sets must be identical and all
/// other batch dims equal.
pub fn cat<T: Borrow<TensorDict>>(tds: &[T], dim: i64) -> Result<TensorDict> {
    let op = "cat";
    let first = first_td(op, tds)?;
    let nd = first.batch_size.len();
    let d = norm_dim(op, dim, nd, &first.batch_size)?;
    let mut total = 0i64;
    for (i, td) in tds.iter().enumerate() {
        let td = td.borrow();
        let same_rank = td.batch_size.len() == nd;
        let others_equal = same_rank
            && td
                .batch_size
                .iter()
                .zip(&first.batch_size)
                .enumerate()
                .all(|(j, (a, b))| j == d || a == b);
        let size = td.batch_size.get(d).copied();
        let Some(size) = size.filter(|_| others_equal) else {
            return Err(Error::ShapeMismatch {
                op,
                key: format!("<batch_size of tensordict {i}> (all dims but {d} must match)"),
                expected: first.batch_size.to_vec(),
                actual: td.batch_size.to_vec(),
            });
        };
        if i > 0 {
            check_structure(op, first, td, i)?;
        }
        // Checked: tensordicts without leaves can have batch dims of any size.
        total = total.checked_add(size).ok_or_else(|| {
            Error::argument(
                op,
                "tds",
                format!("tensordicts whose batch dims {d} sum to at most i64::MAX"),
                format!(
                    "the concatenated batch dim {d} has more than i64::MAX entries (at tensordict {i}, batch size {})",
                    ShapeFmt(&td.batch_size)
                ),
            )
        })?;
    }
    cat_level(tds, d, total)
}

fn cat_level<T: Borrow<TensorDict>>(tds: &[T], d: usize, total: i64) -> Result<TensorDict> {
    let first = first_td("cat", tds)?;
    let mut batch = first.batch_size.clone();
    match batch.get_mut(d) {
        Some(slot) => *slot = total,
        None => return Err(dim_error("cat", d as i64, batch.len(), &batch)),
    }
    rebuild(first, batch, |k, e| {
        Ok(match e {
            Entry::Tensor(_) => {
                let ts: Vec<&Tensor> = tds
                    .iter()
                    .filter_map(|td| td.borrow().entries.get(k).and_then(Entry::as_tensor))
                    .collect();
                Entry::Tensor(Tensor::f_cat(&ts, d as i64).map_err(|err| {
                    Error::value(
                        "cat",
                        display_segments(&[k]),
                        "leaves that can be concatenated",
                        format!("cannot concatenate key {}: {err}", display_segments(&[k])),
                    )
                })?)
            }
            Entry::Dict(_) => {
                let subs: Vec<&TensorDict> = tds
                    .iter()
                    .filter_map(|td| td.borrow().entries.get(k).and_then(Entry::as_dict))
                    .collect();
                Entry::Dict(cat_level(&subs, d, total)?)
            }
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Device, Kind};

    fn td34() -> TensorDict {
        TensorDict::new([3, 4])
            .unwrap()
            .with(
                "a",
                Tensor::arange(60, (Kind::Float, Device::Cpu)).view([3, 4, 5]),
            )
            .unwrap()
    }

    #[test]
    fn index_shapes() {
        let td = td34();
        let mask = Tensor::from_slice(&[true, false, true]);
        assert_eq!(
            td.index(&[BatchIndex::Mask(mask)]).unwrap().batch_size(),
            &[2, 4]
        );
        assert_eq!(
            td.index(&[BatchIndex::NewAxis]).unwrap().batch_size(),
            &[1, 3, 4]
        );
        assert!(td.index(&[0.into(), 0.into(), 0.into()]).is_err());
        assert_eq!(
            td.index(&[(..).into(), (1..3).into()])
                .unwrap()
                .batch_size(),
            &[3, 2]
        );
    }

    #[test]
    fn set_at_writes_in_place() {
        let mut td = td34();
        let row = td
            .index(&[1.into()])
            .unwrap()
            .apply(|t| Ok(Some(t.zeros_like())))
            .unwrap();
        td.set_at(&[0.into()], &row).unwrap();
        let a = td.get("a").unwrap();
        assert_eq!(a.get(0).sum(Kind::Float).double_value(&[]), 0.0);
        assert!(a.get(1).sum(Kind::Float).double_value(&[]) > 0.0);
    }
}
