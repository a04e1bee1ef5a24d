//! Indices over batch dimensions, shared by [`TensorDict`](super::TensorDict) and the specs.

use std::ops::{Range, RangeFrom, RangeFull, RangeInclusive, RangeTo};

use tch::{Kind, Tensor};

use super::Elements;
use crate::error::{ensure_kind, Error, Result, ShapeFmt};

/// One index item over batch dims, like one element of a Python index tuple.
///
/// ```
/// use torchrl::BatchIndex;
/// let idx: Vec<BatchIndex> = vec![0.into(), (1..3).into(), (..).into()];
/// assert_eq!(idx.len(), 3);
/// ```
#[derive(Debug)]
pub enum BatchIndex {
    /// Selects one position, removing the dim (`td[2]`). Negative counts from the end.
    Int(i64),
    /// A Python-style slice `start:end:step` (bounds clamp; negative bounds count from the end).
    Slice {
        /// First position (default 0).
        start: Option<i64>,
        /// One past the last position (default: the dim size).
        end: Option<i64>,
        /// Step, at least 1.
        step: i64,
    },
    /// `...`: as many full slices as needed to cover the remaining batch dims.
    Ellipsis,
    /// `None`: inserts a new batch dim of size 1.
    NewAxis,
    /// A boolean mask over the next `mask.dim()` batch dims (which it must match); they are
    /// replaced by one dim counting the true entries.
    Mask(Tensor),
    /// An integer index tensor over the next batch dim; that dim is replaced by the index
    /// tensor's shape.
    Tensor(Tensor),
}

impl BatchIndex {
    /// A full slice, `..`.
    pub fn full() -> Self {
        BatchIndex::Slice {
            start: None,
            end: None,
            step: 1,
        }
    }

    /// A slice with a step.
    pub fn slice(start: Option<i64>, end: Option<i64>, step: i64) -> Self {
        BatchIndex::Slice { start, end, step }
    }

    /// A mask or an index tensor, chosen by the tensor's dtype.
    pub fn tensor(t: Tensor) -> Self {
        if t.kind() == Kind::Bool {
            BatchIndex::Mask(t)
        } else {
            BatchIndex::Tensor(t)
        }
    }

    pub(crate) fn shallow_clone(&self) -> Self {
        match self {
            BatchIndex::Int(i) => BatchIndex::Int(*i),
            BatchIndex::Slice { start, end, step } => BatchIndex::Slice {
                start: *start,
                end: *end,
                step: *step,
            },
            BatchIndex::Ellipsis => BatchIndex::Ellipsis,
            BatchIndex::NewAxis => BatchIndex::NewAxis,
            BatchIndex::Mask(t) => BatchIndex::Mask(t.shallow_clone()),
            BatchIndex::Tensor(t) => BatchIndex::Tensor(t.shallow_clone()),
        }
    }
}

impl From<i64> for BatchIndex {
    fn from(value: i64) -> Self {
        BatchIndex::Int(value)
    }
}

impl From<Range<i64>> for BatchIndex {
    fn from(r: Range<i64>) -> Self {
        BatchIndex::slice(Some(r.start), Some(r.end), 1)
    }
}

impl From<RangeInclusive<i64>> for BatchIndex {
    fn from(r: RangeInclusive<i64>) -> Self {
        BatchIndex::slice(Some(*r.start()), Some(*r.end() + 1), 1)
    }
}

impl From<RangeFrom<i64>> for BatchIndex {
    fn from(r: RangeFrom<i64>) -> Self {
        BatchIndex::slice(Some(r.start), None, 1)
    }
}

impl From<RangeTo<i64>> for BatchIndex {
    fn from(r: RangeTo<i64>) -> Self {
        BatchIndex::slice(None, Some(r.end), 1)
    }
}

impl From<RangeFull> for BatchIndex {
    fn from(_: RangeFull) -> Self {
        BatchIndex::full()
    }
}

impl From<Tensor> for BatchIndex {
    fn from(t: Tensor) -> Self {
        BatchIndex::tensor(t)
    }
}

/// One resolved indexing step, applied to a tensor at a known dim.
#[derive(Debug)]
pub(crate) enum Step {
    Select {
        dim: i64,
        index: i64,
    },
    Slice {
        dim: i64,
        start: i64,
        end: i64,
        step: i64,
    },
    Unsqueeze {
        dim: i64,
    },
    /// Flattens `k` dims at `dim` and gathers `linear` positions along the flattened dim.
    Mask {
        dim: i64,
        k: i64,
        linear: Tensor,
        mask: Tensor,
    },
    /// Gathers `index` (flattened) along `dim` and unflattens to `shape`.
    Gather {
        dim: i64,
        index: Tensor,
        shape: Vec<i64>,
    },
}

/// An index resolved against a batch size: the steps to apply to every leaf and the new batch.
#[derive(Debug)]
pub(crate) struct Plan {
    pub steps: Vec<Step>,
    pub batch: Vec<i64>,
}

fn norm_bound(b: Option<i64>, size: i64, default: i64) -> i64 {
    match b {
        None => default,
        Some(v) if v < 0 => (v + size).max(0),
        Some(v) => v.min(size),
    }
}

/// Resolves `idx` against `batch`. `op` names the caller in errors.
pub(crate) fn resolve(op: &'static str, idx: &[BatchIndex], batch: &[i64]) -> Result<Plan> {
    let consumes = |i: &BatchIndex| -> usize {
        match i {
            BatchIndex::Int(_) | BatchIndex::Slice { .. } | BatchIndex::Tensor(_) => 1,
            BatchIndex::Mask(m) => m.dim(),
            BatchIndex::Ellipsis | BatchIndex::NewAxis => 0,
        }
    };
    let explicit: usize = idx.iter().map(consumes).sum();
    let n_ellipsis = idx
        .iter()
        .filter(|i| matches!(i, BatchIndex::Ellipsis))
        .count();
    if n_ellipsis > 1 {
        return Err(Error::argument(
            op,
            "index",
            "at most one ellipsis (an index can only have a single ellipsis)",
            format!("an index with {n_ellipsis} ellipses"),
        ));
    }
    if explicit > batch.len() {
        return Err(Error::IndexOutOfRange {
            op,
            index: explicit as i64,
            what: format!(
                "batch dims (too many indices: {explicit} for a batch size of {})",
                ShapeFmt(batch)
            ),
            size: batch.len() as i64,
        });
    }
    let n_adv = idx
        .iter()
        .filter(|i| matches!(i, BatchIndex::Mask(_) | BatchIndex::Tensor(_)))
        .count();
    if n_adv > 1 {
        return Err(Error::argument(
            op,
            "index",
            "at most one mask or index tensor (at most one is supported per index)",
            format!("an index with {n_adv} masks or index tensors"),
        ));
    }
    // Source batch dims `range` (in range: `explicit <= batch.len()` was checked; an error
    // rather than a panic all the same).
    let past_the_dims = |end: usize| Error::IndexOutOfRange {
        op,
        index: end as i64 - 1,
        what: format!("batch dims (batch size {})", ShapeFmt(batch)),
        size: batch.len() as i64,
    };
    let dims = |range: Range<usize>| {
        let end = range.end;
        batch.get(range).ok_or_else(|| past_the_dims(end))
    };
    let dim_size = |src: usize| {
        batch
            .get(src)
            .copied()
            .ok_or_else(|| past_the_dims(src + 1))
    };
    let mut steps = Vec::new();
    let mut out_batch = Vec::new();
    let mut src = 0usize; // next source batch dim
    let mut dim = 0i64; // current dim in the partially-indexed tensor
    for item in idx {
        match item {
            BatchIndex::Int(i) => {
                let size = dim_size(src)?;
                let j = if *i < 0 { i + size } else { *i };
                if j < 0 || j >= size {
                    return Err(Error::IndexOutOfRange {
                        op,
                        index: *i,
                        what: format!("batch dim {src}"),
                        size,
                    });
                }
                steps.push(Step::Select { dim, index: j });
                src += 1;
            }
            BatchIndex::Slice { start, end, step } => {
                if *step < 1 {
                    return Err(Error::argument(
                        op,
                        "index",
                        "a slice step >= 1",
                        format!("slice step {step}"),
                    ));
                }
                let size = dim_size(src)?;
                let s = norm_bound(*start, size, 0);
                let e = norm_bound(*end, size, size).max(s);
                // ceil((e - s) / step) without overflow for huge steps.
                let len = if e > s { (e - s - 1) / step + 1 } else { 0 };
                if !(s == 0 && e == size && *step == 1) {
                    // A slice of at most one element is passed with step 1: libtorch computes
                    // the length as `end - start + step - 1`, which overflows for huge steps.
                    let (end, step) = if len <= 1 { (s + len, 1) } else { (e, *step) };
                    steps.push(Step::Slice {
                        dim,
                        start: s,
                        end,
                        step,
                    });
                }
                out_batch.push(len);
                src += 1;
                dim += 1;
            }
            BatchIndex::NewAxis => {
                steps.push(Step::Unsqueeze { dim });
                out_batch.push(1);
                dim += 1;
            }
            BatchIndex::Ellipsis => {
                let n = batch.len() - explicit;
                out_batch.extend_from_slice(dims(src..src + n)?);
                src += n;
                dim += n as i64;
            }
            BatchIndex::Mask(m) => {
                let k = m.dim();
                let expected = dims(src..src + k)?;
                let actual = m.size();
                ensure_kind(op, "<mask>", Kind::Bool, m.kind())?;
                if k == 0 {
                    // A 0-d mask consumes no dim and inserts one of size 1 (true) or 0 (false),
                    // as in PyTorch: a new axis, sliced to nothing when false.
                    let keep = m.f_to_kind(Kind::Int64)?.f_int64_value(&[])? != 0;
                    steps.push(Step::Unsqueeze { dim });
                    if !keep {
                        steps.push(Step::Slice {
                            dim,
                            start: 0,
                            end: 0,
                            step: 1,
                        });
                    }
                    out_batch.push(i64::from(keep));
                    dim += 1;
                    continue;
                }
                if actual != expected {
                    return Err(Error::ShapeMismatch {
                        op,
                        key: "<mask>".into(),
                        expected: expected.to_vec(),
                        actual,
                    });
                }
                let flat = m.f_reshape([-1])?;
                let linear = flat.f_nonzero()?.f_reshape([-1])?;
                let count = linear.size().first().copied().unwrap_or(0);
                steps.push(Step::Mask {
                    dim,
                    k: k as i64,
                    linear,
                    mask: m.shallow_clone(),
                });
                out_batch.push(count);
                src += k;
                dim += 1;
            }
            BatchIndex::Tensor(t) => {
                if !matches!(
                    t.kind(),
                    Kind::Int64 | Kind::Int | Kind::Int16 | Kind::Int8 | Kind::Uint8
                ) {
                    return Err(Error::DtypeMismatch {
                        op,
                        key: "<index>".into(),
                        expected: Kind::Int64,
                        actual: t.kind(),
                    });
                }
                let size = dim_size(src)?;
                let flat = t.f_reshape([-1])?.f_to_kind(Kind::Int64)?;
                let wrapped = flat.f_remainder(size.max(1))?;
                if flat.elements() > 0 {
                    let lo = flat.f_min()?.int64_value(&[]);
                    let hi = flat.f_max()?.int64_value(&[]);
                    for v in [lo, hi] {
                        if v < -size || v >= size {
                            return Err(Error::IndexOutOfRange {
                                op,
                                index: v,
                                what: format!("batch dim {src}"),
                                size,
                            });
                        }
                    }
                }
                let shape = t.size();
                out_batch.extend_from_slice(&shape);
                steps.push(Step::Gather {
                    dim,
                    index: wrapped,
                    shape: shape.clone(),
                });
                src += 1;
                dim += shape.len() as i64;
            }
        }
    }
    // Dims not mentioned are kept.
    out_batch.extend_from_slice(dims(src..batch.len())?);
    Ok(Plan {
        steps,
        batch: out_batch,
    })
}

/// Applies a resolved plan to one tensor (whose leading dims are the indexed batch dims).
pub(crate) fn apply_plan(t: &Tensor, plan: &Plan) -> Result<Tensor> {
    let mut cur = t.shallow_clone();
    for step in &plan.steps {
        cur = apply_step(&cur, step)?;
    }
    Ok(cur)
}

pub(crate) fn apply_step(cur: &Tensor, step: &Step) -> Result<Tensor> {
    Ok(match step {
        Step::Select { dim, index } => cur.f_select(*dim, *index)?,
        Step::Slice {
            dim,
            start,
            end,
            step,
        } => cur.f_slice(*dim, *start, *end, *step)?,
        Step::Unsqueeze { dim } => cur.f_unsqueeze(*dim)?,
        Step::Mask { dim, k, linear, .. } => {
            let flat = if *k == 1 {
                cur.shallow_clone()
            } else {
                cur.f_flatten(*dim, dim + k - 1)?
            };
            flat.f_index_select(*dim, &linear.f_to_device(cur.device())?)?
        }
        Step::Gather { dim, index, shape } => {
            let g = cur.f_index_select(*dim, &index.f_to_device(cur.device())?)?;
            let mut sizes = g.size();
            let d = *dim as usize;
            if d >= sizes.len() {
                return Err(Error::invalid(
                    "index",
                    format!(
                        "internal: gather dim {d} past the dims of {}",
                        ShapeFmt(&sizes)
                    ),
                ));
            }
            sizes.splice(d..=d, shape.iter().copied());
            g.f_reshape(&sizes)?
        }
    })
}

/// A write into one leaf, checked by [`prepare_write`]: running it only calls libtorch's
/// in-place copy (`copy_` for basic indices, `index_put_` for a mask or an index tensor) on
/// arguments that were checked to be writable, so that a caller writing several leaves can
/// check all of them before writing any.
pub(crate) struct PreparedWrite {
    /// The destination region (basic steps applied), or the tensor to index into.
    view: Tensor,
    /// The advanced index (`None` for the leading dims), when the plan ends with one.
    index: Option<Vec<Option<Tensor>>>,
    /// The value, cast to the destination's dtype and moved to its device.
    value: Tensor,
}

impl PreparedWrite {
    /// Performs the write.
    pub(crate) fn run(self) -> Result<()> {
        let mut view = self.view;
        match &self.index {
            Some(idx) => {
                let _ = view.f_index_put_(idx, &self.value, false)?;
            }
            None => {
                view.f_copy_(&self.value)?;
            }
        }
        Ok(())
    }
}

/// The dim of `t` in which several elements share one memory location (stride 0, size > 1),
/// if any: libtorch refuses to write into such a tensor (an expanded view) in place.
fn overlapping_dim(t: &Tensor) -> Option<(usize, i64)> {
    t.size()
        .into_iter()
        .zip(t.stride())
        .enumerate()
        .find(|(_, (n, s))| *n > 1 && *s == 0)
        .map(|(d, (n, _))| (d, n))
}

/// The byte range `[lo, hi)` that `t`'s elements occupy (`None` when it has none).
fn byte_range(t: &Tensor) -> Option<(usize, usize)> {
    let size = t.size();
    if size.contains(&0) {
        return None;
    }
    let es = t.f_kind().ok()?.elt_size_in_bytes() as i128;
    let (mut lo, mut hi) = (0i128, 0i128);
    for (n, s) in size.iter().zip(t.stride()) {
        let reach = i128::from(n - 1) * i128::from(s) * es;
        if reach < 0 {
            lo += reach;
        } else {
            hi += reach;
        }
    }
    let p = t.data_ptr() as usize as i128;
    let lo = usize::try_from(p + lo).ok()?;
    let hi = usize::try_from(p + hi + es).ok()?;
    Some((lo, hi))
}

/// Whether `a` and `b` may share memory (same device, intersecting byte ranges).
fn may_overlap(a: &Tensor, b: &Tensor) -> bool {
    if a.device() != b.device() {
        return false;
    }
    match (byte_range(a), byte_range(b)) {
        (Some((a0, a1)), Some((b0, b1))) => a0 < b1 && b0 < a1,
        _ => false,
    }
}

/// Checks and prepares writing `value` into the region of `dest` (the leaf at `key`) selected
/// by `plan`, without writing anything. The value is cast to the destination's dtype (`copy_`
/// casts; `index_put_` requires equal dtypes, so both paths behave the same) and moved to its
/// device; a value or index that shares memory with the destination is copied first (libtorch
/// refuses overlapping arguments). A destination in which several elements share one memory
/// location (an expanded view) is refused with an error naming `key`.
pub(crate) fn prepare_write(
    op: &'static str,
    key: &str,
    dest: &Tensor,
    plan: &Plan,
    value: &Tensor,
) -> Result<PreparedWrite> {
    // Basic steps are views; an advanced step (mask/gather) must be the last one.
    let mut view = dest.shallow_clone();
    let mut index = None;
    let n = plan.steps.len();
    for (i, step) in plan.steps.iter().enumerate() {
        match step {
            Step::Mask { dim, mask, .. } => {
                ensure_last(op, i, n)?;
                let mut idx: Vec<Option<Tensor>> = (0..*dim).map(|_| None).collect();
                idx.push(Some(mask.f_to_device(view.device())?));
                index = Some(idx);
            }
            Step::Gather {
                dim,
                index: ix,
                shape,
            } => {
                ensure_last(op, i, n)?;
                let mut idx: Vec<Option<Tensor>> = (0..*dim).map(|_| None).collect();
                idx.push(Some(
                    ix.f_reshape(shape.as_slice())?.f_to_device(view.device())?,
                ));
                index = Some(idx);
            }
            _ => view = apply_step(&view, step)?,
        }
    }
    if let Some((d, size)) = overlapping_dim(&view) {
        return Err(Error::value(
            op,
            key,
            "a leaf that can be written in place (clone it first)",
            format!(
                "an expanded view: dim {d} of its written region, of size {size}, has stride 0, \
                 so its elements share one memory location (cannot write into key {key} in place)"
            ),
        ));
    }
    let mut value = value
        .f_to_device(view.device())?
        .f_to_kind(view.f_kind()?)?;
    if may_overlap(&value, &view) {
        value = value.f_detach_copy()?;
    }
    if let Some(idx) = index.as_mut() {
        for t in idx.iter_mut().flatten() {
            if may_overlap(t, &view) {
                *t = t.f_detach_copy()?;
            }
        }
    }
    Ok(PreparedWrite { view, index, value })
}

fn ensure_last(op: &'static str, i: usize, n: usize) -> Result<()> {
    if i + 1 != n {
        return Err(Error::argument(
            op,
            "index",
            "a mask or index tensor only as the last indexing step (when writing through an \
             index)",
            format!("a mask or index tensor at step {} of {n}", i + 1),
        ));
    }
    Ok(())
}
/// `dim` (negative counts from the end) as an index into `ndim` dims, if it is one.
#[inline]
pub(crate) fn wrap_dim(dim: i64, ndim: usize) -> Option<usize> {
    let n = i64::try_from(ndim).ok()?;
    let d = if dim < 0 { dim + n } else { dim };
    if (0..n).contains(&d) {
        usize::try_from(d).ok()
    } else {
        None
    }
}

/// [`wrap_dim`], or an [`Error::IndexOutOfRange`] under `op` naming `dim` and what the `ndim`
/// dims are (`what`, only formatted on error).
#[inline]
pub(crate) fn norm_dim(
    op: &'static str,
    dim: i64,
    ndim: usize,
    what: impl FnOnce() -> String,
) -> Result<usize> {
    wrap_dim(dim, ndim).ok_or_else(|| Error::IndexOutOfRange {
        op,
        index: dim,
        what: what(),
        size: i64::try_from(ndim).unwrap_or(i64::MAX),
    })
}
