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

use rustc_hash::FxHashMap;
use tch::{Device, Kind, Tensor};

use super::host_stack::{self, Layout, Reserve, Source};
use super::index::{apply_plan, prepare_write, resolve, BatchIndex};
use super::{display_segments, Dims, Entry, Map, NestedKey, TensorDict};
use crate::error::{Error, Result, ShapeFmt};

/// Normalises `dim` (negative counts from the end) against `ndim` positions: the batch dims of
/// `batch`, or one more where a new dim is inserted (unsqueeze, stack). The error names `batch`.
fn norm_dim(op: &'static str, dim: i64, ndim: usize, batch: &[i64]) -> Result<usize> {
    let n = ndim as i64;
    let d = if dim < 0 { dim + n } else { dim };
    if d < 0 || d >= n {
        return Err(dim_error(op, dim, ndim, batch));
    }
    Ok(d as usize)
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
        return Err(Error::invalid(
            op,
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
            Error::invalid(
                op,
                format!(
                    "shape {} has more elements than fit in i64 (batch size {})",
                    ShapeFmt(shape),
                    ShapeFmt(from)
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
    fn map_batch<F>(&self, new_batch: &[i64], f: &mut F) -> Result<TensorDict>
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
        let mut out = TensorDict {
            entries: Map::default(),
            batch_size: batch,
            device: self.device,
        };
        for (k, e) in &self.entries {
            let ne = match e {
                Entry::Tensor(t) => Entry::Tensor(f(t)?),
                Entry::Dict(d) => Entry::Dict(d.map_batch_rec(root_nd, new_root, f)?),
            };
            out.entries.insert(k.clone(), ne);
        }
        Ok(out)
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
        if let Some(d) = shape.iter().find(|d| **d < 0) {
            return Err(Error::invalid(
                "expand",
                format!(
                    "shape {} has a negative dimension {d} (batch size {})",
                    ShapeFmt(shape),
                    ShapeFmt(&self.batch_size)
                ),
            ));
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
            Error::invalid(
                "permute",
                format!(
                    "dims {} are not a permutation of {} (batch size {})",
                    ShapeFmt(dims),
                    ShapeFmt(&all),
                    ShapeFmt(&self.batch_size)
                ),
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
            return Err(Error::invalid(
                "split",
                format!(
                    "split sizes {} must be non-negative and sum to batch dim {d} of size {size} (batch size {})",
                    ShapeFmt(sizes),
                    ShapeFmt(&self.batch_size)
                ),
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
            return Err(Error::invalid(
                "split",
                format!("split size must be >= 1, got {size}"),
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
    let a: Vec<NestedKey> = first.keys(true, false);
    let b: Vec<NestedKey> = other.keys(true, false);
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
    for (k, e) in first.items(true, false) {
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

/// [`stack`], with the consolidated buffer taken from `reserve` when it is big enough (see
/// [`host_stack::reserve`]).
pub(crate) fn stack_reserved<T: Borrow<TensorDict>>(
    tds: &[T],
    dim: i64,
    reserve: Option<Reserve>,
) -> Result<TensorDict> {
    let op = "stack";
    let first = match tds.first() {
        Some(f) => f.borrow(),
        None => {
            return Err(Error::invalid(
                op,
                "cannot stack an empty list of tensordicts",
            ))
        }
    };
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
    let plans = plan_leaves(&leaves)?;
    let dim = d as i64;
    let n = tds.len() as i64;
    let mut outputs: Vec<Option<Tensor>> = consolidated_leaves(&leaves, &plans, d, reserve)?;
    for (leaf, (plan, out)) in leaves.iter().zip(plans.iter().zip(outputs.iter_mut())) {
        if out.is_none() && *plan == LeafPlan::Stack {
            *out = Some(Tensor::f_stack(&leaf.inputs, dim)?);
        }
    }
    let internal = || Error::invalid("stack", "internal: a leaf derived from an unstacked one");
    for (j, (leaf, plan)) in leaves.iter().zip(&plans).enumerate() {
        if outputs.get(j).is_some_and(Option::is_some) {
            continue;
        }
        let source = |k: usize| outputs.get(k).and_then(Option::as_ref).ok_or_else(internal);
        let derived = match *plan {
            LeafPlan::Stack => return Err(internal()),
            LeafPlan::Copy(k) => source(k)?.f_detach_copy()?,
            LeafPlan::Shift(k) => {
                let src = source(k)?;
                let first = leaf.inputs.first().ok_or_else(internal)?;
                let out = src.f_empty_like()?;
                out.f_select(dim, 0)?.f_copy_(first)?;
                out.f_narrow(dim, 1, n - 1)?
                    .f_copy_(&src.f_narrow(dim, 0, n - 1)?)?;
                out
            }
        };
        if let Some(o) = outputs.get_mut(j) {
            *o = Some(derived);
        }
    }
    let mut outputs = outputs
        .into_iter()
        .map(|o| o.ok_or_else(internal))
        .collect::<Result<Vec<Tensor>>>()?
        .into_iter();
    let first = tds
        .first()
        .ok_or_else(|| Error::invalid("stack", "cannot stack an empty list of tensordicts"))?;
    build_level(first, d, n, &mut outputs)
}

/// The leaves that [`host_stack`](super::host_stack) computes, in one consolidated buffer
/// (`None` for the others): the stacked leaves whose inputs are plain CPU data (along a dim
/// after the first), and the copies and shifts of those whose first input is plain too.
fn consolidated_leaves(
    leaves: &[Leaf<'_>],
    plans: &[LeafPlan],
    d: usize,
    reserve: Option<Reserve>,
) -> Result<Vec<Option<Tensor>>> {
    let layouts: Vec<Option<Layout>> = leaves
        .iter()
        .zip(plans)
        .map(|(leaf, plan)| match plan {
            LeafPlan::Stack => host_stack::layout(&leaf.inputs, d),
            _ => None,
        })
        .collect();
    let mut jobs = Vec::new();
    let mut job_of = vec![None; leaves.len()];
    for (j, ((leaf, plan), l)) in leaves.iter().zip(plans).zip(&layouts).enumerate() {
        let job = match (plan, l) {
            (LeafPlan::Stack, Some(l)) => Some((l.clone(), Source::Stack(&leaf.inputs[..]))),
            (LeafPlan::Copy(k) | LeafPlan::Shift(k), _) => {
                let (Some(Some(l)), Some(first)) = (layouts.get(*k), leaf.inputs.first()) else {
                    continue;
                };
                match plan {
                    LeafPlan::Copy(_) => Some((l.clone(), Source::Copy(*k))),
                    _ if host_stack::is_plain(first, first.kind(), &leaf.shape) => {
                        Some((l.clone(), Source::Shift(*k, first)))
                    }
                    _ => None,
                }
            }
            _ => None,
        };
        if let (Some(job), Some(slot)) = (job, job_of.get_mut(j)) {
            *slot = Some(jobs.len());
            jobs.push(job);
        }
    }
    let mut out: Vec<Option<Tensor>> = (0..leaves.len()).map(|_| None).collect();
    if jobs.is_empty() {
        return Ok(out);
    }
    // Sources name leaves; the host stack names jobs.
    let remap = |k: usize| job_of.get(k).copied().flatten();
    for (_, src) in jobs.iter_mut() {
        match src {
            Source::Copy(k) | Source::Shift(k, _) => {
                *k = remap(*k).ok_or_else(|| {
                    Error::invalid("stack", "internal: a leaf derived from an unstacked one")
                })?
            }
            Source::Stack(_) => {}
        }
    }
    let mut tensors = host_stack::stack_consolidated(&jobs, reserve)?.into_iter();
    for (slot, job) in out.iter_mut().zip(&job_of) {
        if job.is_some() {
            *slot = tensors.next();
        }
    }
    Ok(out)
}

/// One leaf of a stack: its tensor in every input, and its shape (the same in all).
struct Leaf<'a> {
    inputs: Vec<&'a Tensor>,
    shape: Vec<i64>,
}

/// How a leaf of a stack is computed.
///
/// `Tensor::stack` along a dim after the batch dims copies one small block per (row, input):
/// ~2 ns each, ~25 µs per step of a 200-step rollout of 1024 pendulums (10 leaves), the
/// largest cost of that rollout after the steps themselves. Copying an already stacked leaf is
/// one bulk copy. So a leaf whose inputs are, input by input, views of another leaf's inputs
/// is copied from that leaf's stack. In a rollout, each step's root `observation`, `state`,
/// `done` and `terminated` are the previous step's `"next"` tensors (moved there by
/// `step_mdp`), and `terminated` is often the very tensor of `done`: 5 of the 10 leaves, which
/// brings that stack from ~25 µs to ~12 µs per step. The values are those of the stack:
/// the same memory viewed the same way, at the time of the stack.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LeafPlan {
    /// `Tensor::stack` of its inputs.
    Stack,
    /// In every input, the same view as leaf `k`: a copy of leaf `k`'s stack.
    Copy(usize),
    /// In every input but the first, the same view as leaf `k` in the previous input: its
    /// first input, then leaf `k`'s stack without its last entry.
    Shift(usize),
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

/// Decides how each leaf is computed (see [`LeafPlan`]). Candidates come from the data
/// pointers of the first two inputs, and are taken only when every input matches (same data
/// pointer, strides and conj/neg bits, the shapes being equal), from a source leaf that has no
/// candidates itself (so it is stacked), with one dtype and device across both leaves' inputs
/// and no input that requires grad (a copy would not carry the stack's autograd graph).
fn plan_leaves(leaves: &[Leaf<'_>]) -> Result<Vec<LeafPlan>> {
    let count = leaves.len();
    let n = leaves.first().map_or(0, |l| l.inputs.len());
    if n == 0 || count < 2 {
        return Ok(vec![LeafPlan::Stack; count]);
    }
    // The data pointer of input `i` of a leaf (every leaf has `n` inputs).
    let ptr = |l: &Leaf<'_>, i: usize| l.inputs.get(i).map(|t| t.data_ptr() as usize);
    // Leaves by the data pointer of their first input: the candidate sources of leaf `j` share
    // it with `j`'s first input (a copy) or second input (a shift).
    let mut by_ptr: FxHashMap<usize, Vec<usize>> = FxHashMap::default();
    for (k, l) in leaves.iter().enumerate() {
        if let Some(p) = ptr(l, 0) {
            by_ptr.entry(p).or_default().push(k);
        }
    }
    let shape = |k: usize| leaves.get(k).map(|l| &l.shape);
    let by_ptr = &by_ptr;
    let with_ptr = move |p: Option<usize>, j: usize| {
        p.and_then(|p| by_ptr.get(&p))
            .into_iter()
            .flatten()
            .copied()
            .filter(move |k| *k != j && shape(*k) == shape(j))
    };
    let candidates: Vec<Vec<LeafPlan>> = leaves
        .iter()
        .enumerate()
        .map(|(j, l)| {
            let copies = with_ptr(ptr(l, 0), j)
                .filter(|k| *k < j)
                .map(LeafPlan::Copy);
            let mut c: Vec<LeafPlan> = copies.collect();
            if n > 1 {
                c.extend(with_ptr(ptr(l, 1), j).map(LeafPlan::Shift));
            }
            c
        })
        .collect();
    let mut uniform: Vec<Option<Option<(Kind, Device)>>> = vec![None; count];
    let mut plans = Vec::with_capacity(count);
    for (j, (leaf, cands)) in leaves.iter().zip(&candidates).enumerate() {
        let mut chosen = LeafPlan::Stack;
        for &plan in cands {
            let (k, shift) = match plan {
                LeafPlan::Copy(k) => (k, 0),
                LeafPlan::Shift(k) => (k, 1),
                LeafPlan::Stack => continue,
            };
            // The source must be stacked itself (no candidates of its own).
            let (Some(source), Some(true)) = (leaves.get(k), candidates.get(k).map(Vec::is_empty))
            else {
                continue;
            };
            let uj = uniform_kind(leaves, j, &mut uniform)?;
            if uj.is_none() || uj != uniform_kind(leaves, k, &mut uniform)? {
                continue;
            }
            // Input `i` of leaf `j` against input `i - shift` of the source, for `i` in
            // `shift..n`.
            let mut all = true;
            for (a, b) in leaf.inputs.iter().skip(shift).zip(&source.inputs) {
                if !same_view(a, b)? {
                    all = false;
                    break;
                }
            }
            if all {
                chosen = plan;
                break;
            }
        }
        plans.push(chosen);
    }
    Ok(plans)
}

/// The dtype and device shared by all inputs of leaf `j`, when they share one and none
/// requires grad (memoized in `memo`).
fn uniform_kind(
    leaves: &[Leaf<'_>],
    j: usize,
    memo: &mut [Option<Option<(Kind, Device)>>],
) -> Result<Option<(Kind, Device)>> {
    if let Some(Some(u)) = memo.get(j) {
        return Ok(*u);
    }
    let Some(first) = leaves.get(j).and_then(|l| l.inputs.first()) else {
        return Ok(None);
    };
    let first_kind = (first.f_kind()?, first.device());
    let mut u = Some(first_kind);
    for t in leaves.get(j).map_or(&[][..], |l| &l.inputs[..]) {
        if t.requires_grad() || (t.f_kind()?, t.device()) != first_kind {
            u = None;
            break;
        }
    }
    if let Some(m) = memo.get_mut(j) {
        *m = Some(u);
    }
    Ok(u)
}

/// Whether `a` and `b` view the same memory the same way (their shapes being equal).
fn same_view(a: &Tensor, b: &Tensor) -> Result<bool> {
    Ok(a.data_ptr() == b.data_ptr()
        && a.stride() == b.stride()
        && a.f_is_conj()? == b.f_is_conj()?
        && a.f_is_neg()? == b.f_is_neg()?)
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
    let mut out = TensorDict {
        entries: Map::default(),
        batch_size: batch,
        device: first.device,
    };
    for (k, e) in &first.entries {
        let ne = match e {
            Entry::Tensor(_) => Entry::Tensor(outputs.next().ok_or_else(|| {
                Error::invalid("stack", "internal: fewer stacked leaves than leaves")
            })?),
            Entry::Dict(sub) => Entry::Dict(build_level(sub, d, n, outputs)?),
        };
        out.entries.insert(k.clone(), ne);
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

/// Concatenates tensordicts along existing batch dim `dim`. Key sets must be identical and all
/// other batch dims equal.
pub fn cat<T: Borrow<TensorDict>>(tds: &[T], dim: i64) -> Result<TensorDict> {
    let op = "cat";
    let first = match tds.first() {
        Some(f) => f.borrow(),
        None => {
            return Err(Error::invalid(
                op,
                "cannot concatenate an empty list of tensordicts",
            ))
        }
    };
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
            Error::invalid(
                op,
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
    let Some(first) = tds.first().map(Borrow::borrow) else {
        return Err(Error::invalid(
            "cat",
            "cannot concatenate an empty list of tensordicts",
        ));
    };
    let mut batch = first.batch_size.clone();
    match batch.get_mut(d) {
        Some(slot) => *slot = total,
        None => return Err(dim_error("cat", d as i64, batch.len(), &batch)),
    }
    let mut out = TensorDict {
        entries: Map::default(),
        batch_size: batch,
        device: first.device,
    };
    for (k, e) in &first.entries {
        let ne = match e {
            Entry::Tensor(_) => {
                let ts: Vec<&Tensor> = tds
                    .iter()
                    .filter_map(|td| td.borrow().entries.get(k).and_then(Entry::as_tensor))
                    .collect();
                Entry::Tensor(Tensor::f_cat(&ts, d as i64).map_err(|err| {
                    Error::invalid(
                        "cat",
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
        };
        out.entries.insert(k.clone(), ne);
    }
    Ok(out)
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
