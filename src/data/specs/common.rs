//! Rules shared by every spec: the shape-compatibility rule of `is_in`, TorchRL's `expand` rule,
//! (un)squeezed shapes, dtype checks, value formatting, and leading-dim indexing.
//!
//! The `is_in` shape rule (TorchRL's): a value fits a spec of shape `S` when broadcasting `S`
//! against the value's shape gives the value's shape back, i.e. the value may carry extra leading
//! (batch) dims, and spec dims of size 1 may have any size in the value. A dynamic spec dim
//! (`-1`, TorchRL's "variable number of elements") takes any size, `0` included.
//!
//! ```
//! use tch::{Device, Kind, Tensor};
//! use torchrl::specs::Unbounded;
//! # fn main() -> torchrl::Result<()> {
//! let spec = Unbounded::new().with_shape([1])?;
//! assert!(spec.is_in(&Tensor::zeros([4, 3], (Kind::Float, Device::Cpu)))?);
//! let spec = Unbounded::new().with_shape([2])?;
//! assert!(!spec.is_in(&Tensor::zeros([3], (Kind::Float, Device::Cpu)))?);
//! # Ok(()) }
//! ```

use tch::{Device, Kind, Tensor};

use crate::error::{Error, Result, ShapeFmt};
use crate::tensordict::{BatchIndex, Elements, TensorDict};

pub(crate) use crate::kind::is_float;

/// Errors for kinds a spec cannot describe (complex, quantized, float8).
pub(crate) fn check_kind(op: &'static str, kind: Kind) -> Result<()> {
    match kind {
        Kind::Bool
        | Kind::Uint8
        | Kind::Int8
        | Kind::Int16
        | Kind::Int
        | Kind::Int64
        | Kind::Half
        | Kind::BFloat16
        | Kind::Float
        | Kind::Double => Ok(()),
        other => Err(Error::argument(
            op,
            "dtype",
            "a bool, integer or real floating kind (the kinds specs describe)",
            format!("unsupported dtype {other:?}"),
        )),
    }
}

/// Errors for a shape with a negative dim.
pub(crate) fn check_shape(op: &'static str, shape: &[i64]) -> Result<()> {
    if let Some(d) = shape.iter().find(|d| **d < 0) {
        return Err(Error::argument(
            op,
            "shape",
            "dims >= 0",
            format!("shape {} with a negative dimension {d}", ShapeFmt(shape)),
        ));
    }
    check_extent(op, shape)
}

/// Errors for a shape whose dims (zeros and dynamic dims counted as 1) times 8 bytes (the
/// widest dtype a spec describes) pass `i64::MAX`: libtorch's strides and byte sizes would
/// overflow, so `zero()` / `rand()` of such a spec could never succeed (`[0, i64::MAX, 0]`
/// has no elements but a stride past what libtorch accepts).
fn check_extent(op: &'static str, shape: &[i64]) -> Result<()> {
    let fits = shape
        .iter()
        .try_fold(8i64, |acc, &d| acc.checked_mul(d.max(1)))
        .is_some();
    if fits {
        return Ok(());
    }
    Err(Error::argument(
        op,
        "shape",
        "dims whose product (zeros counted as 1) times 8 bytes fits in i64",
        format!("shape {} (its element count overflows)", ShapeFmt(shape)),
    ))
}

/// Errors for a spec shape with a dim below `-1` (`-1` is a dynamic dim: any length).
pub(crate) fn check_spec_shape(op: &'static str, shape: &[i64]) -> Result<()> {
    if let Some(d) = shape.iter().find(|d| **d < -1) {
        return Err(Error::argument(
            op,
            "shape",
            "dims >= 0, or -1 for a dynamic dim (any length)",
            format!("shape {} with a dimension {d}", ShapeFmt(shape)),
        ));
    }
    check_extent(op, shape)
}

/// True when `shape` has a dynamic (`-1`) dim.
pub(crate) fn is_dynamic(shape: &[i64]) -> bool {
    shape.contains(&-1)
}

/// TorchRL's `_safe_shape`: `shape` with every dynamic (`-1`) dim replaced by 1. The tensors a
/// spec holds (bounds, masks) and the placeholders it builds (`zero`, `one`, `rand`) have it.
pub(crate) fn safe_shape(shape: &[i64]) -> Vec<i64> {
    shape.iter().map(|d| if *d < 0 { 1 } else { *d }).collect()
}

/// `[*batch, *safe_shape(spec)]`: the shape of what `rand` / `zero` / `one` build.
pub(crate) fn sample_shape(batch: &[i64], spec: &[i64]) -> Vec<i64> {
    concat(batch, &safe_shape(spec))
}

/// The number of elements of `shape`, or an error when it overflows (a spec's shape may be
/// huge; its tensors are never built then) or has a dynamic dim (it has no element count).
pub(crate) fn checked_numel(op: &'static str, shape: &[i64]) -> Result<i64> {
    if is_dynamic(shape) {
        return Err(Error::argument(
            op,
            "shape",
            "a spec shape without dynamic (-1) dims (resolve them first with resolve_shape or \
             resolve_dynamic)",
            format!(
                "shape {}, which has no fixed element count",
                ShapeFmt(shape)
            ),
        ));
    }
    shape
        .iter()
        .try_fold(1i64, |acc, d| acc.checked_mul(*d))
        .ok_or_else(|| {
            Error::argument(
                op,
                "shape",
                "a shape whose element count fits in i64",
                format!(
                    "shape {}, which has more elements than an i64 counts",
                    ShapeFmt(shape)
                ),
            )
        })
}

/// Errors unless `given` class indices are the `needed` ones an encoding of a spec of `shape`
/// takes.
pub(crate) fn check_index_count(given: usize, needed: usize, shape: &[i64]) -> Result<()> {
    if given == needed {
        return Ok(());
    }
    Err(Error::argument(
        "encode",
        "values",
        format!(
            "{needed} class indices for the spec of shape {}",
            ShapeFmt(shape)
        ),
        format!("{given} (a shape mismatch)"),
    ))
}

/// `[*a, *b]`.
pub(crate) fn concat(a: &[i64], b: &[i64]) -> Vec<i64> {
    let mut out = Vec::with_capacity(a.len() + b.len());
    out.extend_from_slice(a);
    out.extend_from_slice(b);
    out
}

/// The shape without its last dim (empty for an empty shape).
pub(crate) fn lead(shape: &[i64]) -> &[i64] {
    shape.split_last().map(|(_, l)| l).unwrap_or(&[])
}

/// TorchRL's `is_in` shape rule: `broadcast(spec, value) == value`, a dynamic (`-1`) spec dim
/// matching any size.
pub(crate) fn shape_fits(spec: &[i64], value: &[i64]) -> bool {
    trailing(value, spec.len()).is_some_and(|tail| {
        spec.iter()
            .zip(tail)
            .all(|(s, v)| s == v || *s == 1 || *s == -1)
    })
}

/// The last `n` dims of `shape`, or `None` when it has fewer.
fn trailing(shape: &[i64], n: usize) -> Option<&[i64]> {
    shape.get(shape.len().checked_sub(n)?..)
}

/// Formats a shape as a Python tuple, `(3, 4)`, like TorchRL's messages.
pub(crate) fn tuple_fmt(shape: &[i64]) -> String {
    match shape {
        [one] => format!("({one},)"),
        _ => {
            let inner: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
            format!("({})", inner.join(", "))
        }
    }
}

/// TorchRL's expand rule: the trailing dims of `new` equal `old`, or the `old` dim is 1. A
/// dynamic (`-1`) spec dim stays dynamic: `new` has `-1` exactly there (a fixed dim never becomes
/// dynamic through `expand`; see `make_neg_dim`).
pub(crate) fn check_expand(class: &str, old: &[i64], new: &[i64]) -> Result<()> {
    if is_dynamic(old) {
        check_spec_shape("expand", new)?;
    } else {
        check_shape("expand", new)?;
    }
    let lead_len = new.len().saturating_sub(old.len());
    let fixed_lead = new.iter().take(lead_len).all(|d| *d >= 0);
    let ok = fixed_lead
        && trailing(new, old.len()).is_some_and(|tail| {
            old.iter()
                .zip(tail)
                .all(|(o, n)| o == n || (*o == 1 && *n >= 0))
        });
    if !ok {
        return Err(Error::argument(
            "expand",
            "shape",
            format!(
                "an expanded shape whose last {} dims match the shape {} of the {class} spec in \
                 expand() (a spec dim may only change when it is 1; a dynamic -1 dim stays -1)",
                old.len(),
                ShapeFmt(old)
            ),
            format!("the expanded shape {}", tuple_fmt(new)),
        ));
    }
    Ok(())
}

/// Normalises `dim` for a shape of `ndim` dims (negative counts from the end).
pub(crate) fn norm_dim(op: &'static str, dim: i64, ndim: usize) -> Result<usize> {
    crate::tensordict::norm_dim(op, dim, ndim, || format!("spec dims (ndim {ndim})"))
}

/// The squeezed shape, or `None` when nothing changes. Like TorchRL, `dim = None` on a 1-d
/// shape is a no-op, and squeezing a dim whose size is not 1 is a no-op.
pub(crate) fn squeezed(shape: &[i64], dim: Option<i64>) -> Result<Option<(Vec<i64>, Vec<usize>)>> {
    match dim {
        None => {
            if shape.len() <= 1 || !shape.contains(&1) {
                return Ok(None);
            }
            let dims: Vec<usize> = size_one_dims(shape).collect();
            let new = shape.iter().copied().filter(|d| *d != 1).collect();
            Ok(Some((new, dims)))
        }
        Some(dim) => {
            let d = norm_dim("squeeze", dim, shape.len())?;
            if shape.get(d) != Some(&1) {
                return Ok(None);
            }
            let new = shape
                .iter()
                .enumerate()
                .filter(|(i, _)| *i != d)
                .map(|(_, s)| *s)
                .collect();
            Ok(Some((new, vec![d])))
        }
    }
}

/// The positions of the dims of size 1.
fn size_one_dims(shape: &[i64]) -> impl Iterator<Item = usize> + '_ {
    shape
        .iter()
        .enumerate()
        .filter(|(_, n)| **n == 1)
        .map(|(i, _)| i)
}

/// The unsqueezed shape and the normalised dim (`dim` in `[-(n+1), n]`).
pub(crate) fn unsqueezed(shape: &[i64], dim: i64) -> Result<(Vec<i64>, usize)> {
    let d = norm_dim("unsqueeze", dim, shape.len() + 1)?;
    let mut new = shape.to_vec();
    new.insert(d, 1);
    Ok((new, d))
}

/// Squeeze for specs whose last dim is protected: `None` squeezes only the leading dims, and an
/// explicit squeeze of the last dim is an error.
pub(crate) fn squeezed_protected(
    class: &str,
    shape: &[i64],
    dim: Option<i64>,
) -> Result<Option<(Vec<i64>, Vec<usize>)>> {
    let last = shape.len().saturating_sub(1);
    match dim {
        None => {
            let dims: Vec<usize> = size_one_dims(shape).filter(|i| *i < last).collect();
            if dims.is_empty() {
                return Ok(None);
            }
            let new = shape
                .iter()
                .enumerate()
                .filter(|(i, _)| !dims.contains(i))
                .map(|(_, s)| *s)
                .collect();
            Ok(Some((new, dims)))
        }
        Some(d) => {
            let nd = norm_dim("squeeze", d, shape.len())?;
            if nd == last {
                return Err(final_dim_error("squeeze", class));
            }
            squeezed(shape, Some(nd as i64))
        }
    }
}

/// Unsqueeze for specs whose last dim is protected: inserting at the end is an error.
pub(crate) fn unsqueezed_protected(
    class: &str,
    shape: &[i64],
    dim: i64,
) -> Result<(Vec<i64>, usize)> {
    let (new, d) = unsqueezed(shape, dim)?;
    if d == shape.len() {
        return Err(final_dim_error("unsqueeze", class));
    }
    Ok((new, d))
}

pub(crate) fn final_dim_error(op: &'static str, class: &str) -> Error {
    Error::invalid(
        op,
        format!("Final dimension of {class} must remain unchanged (it holds the categories)"),
    )
}

/// Applies `idx` to the leading dims `lead` (as TensorDict batch dims) and to `tensors`, whose
/// shapes start with `lead`. Returns the indexed leading dims and tensors.
pub(crate) fn index_lead(
    lead: &[i64],
    tensors: &[&Tensor],
    idx: &[BatchIndex],
) -> Result<(Vec<i64>, Vec<Tensor>)> {
    let mut td = TensorDict::new(lead)?;
    let names: Vec<String> = (0..tensors.len()).map(|i| i.to_string()).collect();
    for (name, t) in names.iter().zip(tensors) {
        td.set(name.as_str(), t.shallow_clone())?;
    }
    let out = td.index(idx)?;
    let mut res = Vec::with_capacity(tensors.len());
    for name in &names {
        res.push(out.get_or_err(name.as_str())?.shallow_clone());
    }
    Ok((out.batch_size().to_vec(), res))
}

/// [`index_lead`] for leading dims `lead` that may be dynamic (`-1`), with TorchRL's rules
/// (`_shape_indexing`): a dynamic dim survives only a full slice (`..` or an ellipsis) and stays
/// dynamic; an integer removes it and an index tensor replaces it by the tensor's shape (both
/// pick a position of unknown range); a partial slice or a mask over it is an error (its extent
/// is unknown). The held `tensors` have size 1 at dynamic dims and are indexed at position 0
/// there. With dynamic dims, at most one index tensor or mask, not mixed with integers, is
/// supported (so that no advanced-indexing reordering applies).
pub(crate) fn index_dynamic(
    lead: &[i64],
    tensors: &[&Tensor],
    idx: &[BatchIndex],
) -> Result<(Vec<i64>, Vec<Tensor>)> {
    if !is_dynamic(lead) {
        return index_lead(lead, tensors, idx);
    }
    let op = "index";
    let unsupported = |what: String| {
        Error::argument(
            op,
            "index",
            format!(
                "an index that keeps the dynamic (-1) dims of the spec shape {} whole (a full \
                 slice or `...`), or picks one position of them (an integer or an index tensor)",
                ShapeFmt(lead)
            ),
            what,
        )
    };
    let advanced = idx
        .iter()
        .filter(|i| matches!(i, BatchIndex::Tensor(_) | BatchIndex::Mask(_)))
        .count();
    let ints = idx.iter().any(|i| matches!(i, BatchIndex::Int(_)));
    if advanced > 1 || (advanced == 1 && ints) {
        return Err(unsupported(
            "several index tensors / masks, or one mixed with integers, on a spec with dynamic \
             dims (not supported)"
                .into(),
        ));
    }
    let consumed = |i: &BatchIndex| match i {
        BatchIndex::Int(_) | BatchIndex::Slice { .. } | BatchIndex::Tensor(_) => 1,
        BatchIndex::Mask(m) => m.dim(),
        BatchIndex::NewAxis | BatchIndex::Ellipsis => 0,
    };
    let explicit: usize = idx.iter().map(consumed).sum();
    let fill = lead.len().saturating_sub(explicit);
    let dynamic_at = |d: usize| lead.get(d) == Some(&-1);
    let (mut d, mut out) = (0usize, 0usize);
    let mut dyn_out: Vec<usize> = Vec::new();
    let mut safe_idx: Vec<BatchIndex> = Vec::with_capacity(idx.len());
    for item in idx {
        match item {
            BatchIndex::Int(i) => {
                safe_idx.push(BatchIndex::Int(if dynamic_at(d) { 0 } else { *i }));
                d += 1;
            }
            BatchIndex::Slice { start, end, step } => {
                if dynamic_at(d) {
                    if start.is_some() || end.is_some() || *step != 1 {
                        return Err(unsupported(format!(
                            "the slice {}:{}:{step} on dynamic dim {d}: the extent of the \
                             dimension is unknown",
                            start.map(|v| v.to_string()).unwrap_or_default(),
                            end.map(|v| v.to_string()).unwrap_or_default(),
                        )));
                    }
                    dyn_out.push(out);
                }
                safe_idx.push(item.shallow_clone());
                d += 1;
                out += 1;
            }
            BatchIndex::Tensor(t) => {
                if dynamic_at(d) {
                    safe_idx.push(BatchIndex::Tensor(t.f_zeros_like()?));
                } else {
                    safe_idx.push(item.shallow_clone());
                }
                d += 1;
                out += t.dim();
            }
            BatchIndex::Mask(m) => {
                if (d..d + m.dim()).any(dynamic_at) {
                    return Err(unsupported(format!(
                        "a mask of shape {} over dims {d}..{} of which one is dynamic: its \
                         length is unknown",
                        ShapeFmt(&m.size()),
                        d + m.dim()
                    )));
                }
                safe_idx.push(item.shallow_clone());
                d += m.dim();
                out += 1;
            }
            BatchIndex::NewAxis => {
                safe_idx.push(BatchIndex::NewAxis);
                out += 1;
            }
            BatchIndex::Ellipsis => {
                dyn_out.extend((0..fill).filter(|j| dynamic_at(d + j)).map(|j| out + j));
                safe_idx.push(BatchIndex::Ellipsis);
                d += fill;
                out += fill;
            }
        }
    }
    dyn_out.extend(
        (d..lead.len())
            .filter(|j| dynamic_at(*j))
            .map(|j| out + (j - d)),
    );
    let (mut shape, held) = index_lead(&safe_shape(lead), tensors, &safe_idx)?;
    for p in dyn_out {
        if let Some(s) = shape.get_mut(p) {
            *s = -1;
        }
    }
    Ok((shape, held))
}

/// Checks that `concrete` resolves the spec shape `spec`: same ndim, the same size at every
/// fixed dim, any size `>= 0` at a dynamic dim.
pub(crate) fn check_resolves(class: &str, spec: &[i64], concrete: &[i64]) -> Result<()> {
    check_shape("resolve_shape", concrete)?;
    let ok =
        spec.len() == concrete.len() && spec.iter().zip(concrete).all(|(s, c)| *s == -1 || s == c);
    if !ok {
        return Err(Error::argument(
            "resolve_shape",
            "shape",
            format!(
                "a shape of {} dims equal to the {class} spec shape {} at its fixed dims (a \
                 dynamic -1 dim takes any size >= 0)",
                spec.len(),
                ShapeFmt(spec)
            ),
            format!("the shape {}", ShapeFmt(concrete)),
        ));
    }
    Ok(())
}

/// `spec` with every dynamic (`-1`) dim set to `size` (which must be `>= 0`).
pub(crate) fn resolved_with(spec: &[i64], size: i64) -> Result<Vec<i64>> {
    if size < 0 {
        return Err(Error::argument(
            "resolve_dynamic",
            "size",
            "a size >= 0 for the dynamic (-1) dims",
            size.to_string(),
        ));
    }
    Ok(spec
        .iter()
        .map(|d| if *d == -1 { size } else { *d })
        .collect())
}

/// `t` narrowed to size 1 along `dim`, or an error when its values differ along `dim` (a held
/// tensor of a spec whose dim `dim` becomes dynamic must be the same at every position).
pub(crate) fn collapse_dim(class: &str, what: &str, t: &Tensor, dim: usize) -> Result<Tensor> {
    let d = dim as i64;
    let size = t.size().get(dim).copied().unwrap_or(1);
    if size == 1 {
        return Ok(t.shallow_clone());
    }
    let differs = || {
        Error::argument(
            "make_neg_dim",
            "dim",
            format!(
                "a dim along which the {what} of the {class} spec are the same at every position \
                 (a dynamic dim holds one {what} row, broadcast to any length)"
            ),
            format!(
                "dim {dim}, along which the {what} (shape {}) {}",
                ShapeFmt(&t.size()),
                if size == 0 {
                    "have no row to keep"
                } else {
                    "differ"
                }
            ),
        )
    };
    if size == 0 {
        return Err(differs());
    }
    let first = t.f_narrow(d, 0, 1)?;
    if !tensor_eq(&first.f_expand_as(t)?.f_contiguous()?, t) {
        return Err(differs());
    }
    Ok(first.f_contiguous()?)
}

/// A zero-filled (or one-filled) tensor of shape `[*batch, *shape]`.
pub(crate) fn filled(
    batch: &[i64],
    shape: &[i64],
    kind: Kind,
    device: Device,
    one: bool,
) -> Result<Tensor> {
    check_shape("zero", batch)?;
    let full = sample_shape(batch, shape);
    Ok(if one {
        Tensor::f_ones(full.as_slice(), (kind, device))?
    } else {
        Tensor::f_zeros(full.as_slice(), (kind, device))?
    })
}

/// The reason a value fails the dtype or the shape rule, if it does.
pub(crate) fn dtype_shape_violation(
    spec_shape: &[i64],
    kind: Option<Kind>,
    value: &Tensor,
) -> Option<String> {
    let vshape = value.size();
    if let Some(kind) = kind {
        if value.kind() != kind {
            return Some(format!(
                "dtype mismatch: the value has dtype {:?} (shape {}), the spec expects {kind:?}",
                value.kind(),
                ShapeFmt(&vshape)
            ));
        }
    }
    if !shape_fits(spec_shape, &vshape) {
        let dynamic = if is_dynamic(spec_shape) {
            ", dynamic -1 dims take any size"
        } else {
            ""
        };
        return Some(format!(
            "shape mismatch: the value has shape {} which does not fit the spec shape {} (the \
             value's trailing dims must equal the spec's, spec dims of size 1 broadcast{dynamic}, \
             extra leading batch dims are allowed)",
            ShapeFmt(&vshape),
            ShapeFmt(spec_shape)
        ));
    }
    None
}

/// `(value == 0) | (value == 1)` everywhere.
pub(crate) fn all_binary(value: &Tensor) -> Result<bool> {
    all_true(&value.f_eq(0)?.f_logical_or(&value.f_eq(1)?)?)
}

/// True when every element of a bool tensor is true.
pub(crate) fn all_true(t: &Tensor) -> Result<bool> {
    let all = t.f_all()?;
    Ok(i64::try_from(&all)? != 0)
}

/// `"value min=…, max=…"` of `value`, in the notation of `kind` (`""` when it is empty): the
/// range an out-of-spec message reports.
pub(crate) fn value_range(value: &Tensor, kind: Kind) -> Result<String> {
    if value.elements() == 0 {
        return Ok(String::new());
    }
    if crate::kind::is_integral(value.kind()) {
        // exact: an int64 near i64::MAX has no f64 of its own
        let (lo, hi) = (value.f_min()?, value.f_max()?);
        return Ok(format!(
            "value min={}, max={}",
            lo.f_int64_value(&[])?,
            hi.f_int64_value(&[])?
        ));
    }
    Ok(match min_max(value)? {
        Some((lo, hi)) => format!(
            "value min={}, max={}",
            fmt_scalar(lo, kind),
            fmt_scalar(hi, kind)
        ),
        None => String::new(),
    })
}

/// Element `i` of `t` (row-major, after expanding to `shape`) formatted for a spec of `kind`:
/// integer tensors exactly (read as int64), floats as [`fmt_scalar`].
pub(crate) fn fmt_element(t: &Tensor, shape: &[i64], i: i64, kind: Kind) -> Result<String> {
    let flat = t.f_expand(shape, false)?.f_reshape([-1])?;
    Ok(if crate::kind::is_integral(t.kind()) {
        flat.f_int64_value(&[i])?.to_string()
    } else {
        fmt_scalar(flat.f_double_value(&[i])?, kind)
    })
}

/// Min and max of a tensor (as f64), `None` when empty.
pub(crate) fn min_max(t: &Tensor) -> Result<Option<(f64, f64)>> {
    if t.elements() == 0 {
        return Ok(None);
    }
    let d = t.f_to_kind(Kind::Double)?;
    Ok(Some((
        f64::try_from(&d.f_min()?)?,
        f64::try_from(&d.f_max()?)?,
    )))
}

/// Formats a scalar of a spec's kind: integers without a decimal point, floats at their own
/// precision (`0.1` for a float32 0.1).
pub(crate) fn fmt_scalar(v: f64, kind: Kind) -> String {
    match kind {
        Kind::Float | Kind::Half | Kind::BFloat16 => format!("{}", v as f32),
        _ => format!("{v}"),
    }
}

/// Formats a bound tensor: one number when uniform, a list when short, else its range.
/// Integer bounds print exactly (`9223372036854775807`, not a rounded f64).
pub(crate) fn fmt_bound(t: &Tensor) -> String {
    let kind = t.kind();
    if crate::kind::is_integral(kind) {
        return match crate::rng::read::<i64>(t) {
            Ok(v) => fmt_list(&v, |x| x.to_string()),
            Err(_) => "?".into(),
        };
    }
    match crate::rng::read::<f64>(t) {
        // NaN bounds are refused at construction; the range below skips them anyway
        Ok(v) => fmt_list(&v, |x| fmt_scalar(x, kind)),
        Err(_) => "?".into(),
    }
}

/// One value when all are equal, the list when short, else `[min..max]`.
fn fmt_list<T: Copy + PartialOrd>(values: &[T], show: impl Fn(T) -> String) -> String {
    match values.split_first() {
        None => "[]".into(),
        Some((first, rest)) if rest.iter().all(|v| v == first) => show(*first),
        Some(_) if values.len() <= 6 => {
            let inner: Vec<String> = values.iter().map(|v| show(*v)).collect();
            format!("[{}]", inner.join(", "))
        }
        Some((first, rest)) => {
            let (mut lo, mut hi) = (*first, *first);
            for v in rest {
                if *v < lo {
                    lo = *v;
                }
                if *v > hi {
                    hi = *v;
                }
            }
            format!("[{}..{}]", show(lo), show(hi))
        }
    }
}

/// Unravels a flat row-major index into a multi-index for `shape`.
pub(crate) fn unravel(mut flat: usize, shape: &[i64]) -> Vec<i64> {
    let mut out = vec![0; shape.len()];
    for (o, d) in out.iter_mut().zip(shape).rev() {
        let d = (*d).max(1) as usize;
        *o = (flat % d) as i64;
        flat /= d;
    }
    out
}

/// A tensor a spec holds (bounds, class masks). `Clone` shares the storage (specs never modify
/// these tensors in place) and `==` compares kind, shape and values (devices may differ), so
/// the specs that hold one derive `Clone` and `PartialEq`.
pub(crate) struct SpecTensor(pub(crate) Tensor);

impl Clone for SpecTensor {
    fn clone(&self) -> Self {
        SpecTensor(self.0.shallow_clone())
    }
}

impl PartialEq for SpecTensor {
    fn eq(&self, other: &Self) -> bool {
        tensor_eq(&self.0, &other.0)
    }
}

impl std::ops::Deref for SpecTensor {
    type Target = Tensor;

    fn deref(&self) -> &Tensor {
        &self.0
    }
}

impl From<Tensor> for SpecTensor {
    fn from(t: Tensor) -> Self {
        SpecTensor(t)
    }
}

/// Same kind, shape and values (devices may differ).
pub(crate) fn tensor_eq(a: &Tensor, b: &Tensor) -> bool {
    if a.kind() != b.kind() || a.size() != b.size() {
        return false;
    }
    match b.f_to_device(a.device()) {
        Ok(b) => a.f_equal(&b).unwrap_or(false),
        Err(_) => false,
    }
}

/// Moves a tensor to `device` unless it is already there.
pub(crate) fn to_dev(t: &Tensor, device: Device) -> Result<Tensor> {
    if t.device() == device {
        Ok(t.shallow_clone())
    } else {
        Ok(t.f_to_device(device)?)
    }
}

/// Formats a device for `Display`: nothing for the CPU, `, device=Cuda(0)` otherwise.
pub(crate) fn fmt_device(device: Device) -> String {
    match device {
        Device::Cpu => String::new(),
        other => format!(", device={other:?}"),
    }
}

/// Validates and prepares a class mask: bool, broadcastable to `target` (`[*lead, n]`); a mask
/// with exactly `n` elements is first reshaped to `[n]` (as TorchRL). Returns the mask expanded
/// to `target` (contiguous) on `device`.
pub(crate) fn prepare_mask(
    op: &'static str,
    mask: &Tensor,
    target: &[i64],
    n: i64,
    device: Device,
) -> Result<SpecTensor> {
    crate::rng::bool_mask(op, mask)?;
    let m = if mask.elements() as i64 == n && mask.size().as_slice() != [n] && mask.dim() <= 1 {
        mask.f_reshape([n])?
    } else {
        mask.shallow_clone()
    };
    let expanded = m.f_broadcast_to(target).map_err(|_| {
        Error::argument(
            op,
            "mask",
            format!(
                "a mask that expands to the spec's mask shape {}",
                ShapeFmt(target)
            ),
            format!("a mask of shape {}", ShapeFmt(&mask.size())),
        )
    })?;
    Ok(SpecTensor(to_dev(&expanded.f_contiguous()?, device)?))
}

/// The `(count, first offending flat index)` of false entries in a bool tensor.
pub(crate) fn first_false(ok: &Tensor) -> Result<(usize, Option<usize>)> {
    let v = crate::rng::read::<bool>(ok)?;
    let count = v.iter().filter(|b| !**b).count();
    Ok((count, v.iter().position(|b| !*b)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shape_rule() {
        assert!(shape_fits(&[2], &[2]));
        assert!(shape_fits(&[2], &[4, 2]));
        assert!(shape_fits(&[1], &[3]));
        assert!(shape_fits(&[], &[5]));
        assert!(!shape_fits(&[2], &[3]));
        assert!(!shape_fits(&[2, 2], &[2]));
        assert!(!shape_fits(&[3], &[1]));
    }

    #[test]
    fn expand_rule() {
        assert!(check_expand("Unbounded", &[2], &[3, 2]).is_ok());
        assert!(check_expand("Unbounded", &[1, 2], &[3, 2]).is_ok());
        let err = check_expand("Unbounded", &[2], &[3, 4]).unwrap_err();
        assert!(err.to_string().contains("(3, 4)"), "{err}");
        assert!(err.to_string().contains("[2]"), "{err}");
        assert!(check_expand("Unbounded", &[2, 2], &[2]).is_err());
    }

    #[test]
    fn squeeze_rules() {
        assert_eq!(squeezed(&[2, 1], None).unwrap().map(|s| s.0), Some(vec![2]));
        assert_eq!(squeezed(&[1], None).unwrap(), None);
        assert_eq!(squeezed(&[2, 1], Some(0)).unwrap(), None);
        assert_eq!(
            squeezed(&[1, 2, 1], Some(-1)).unwrap().map(|s| s.0),
            Some(vec![1, 2])
        );
        assert!(squeezed(&[2], Some(3)).is_err());
        assert_eq!(unsqueezed(&[2], -1).unwrap(), (vec![2, 1], 1));
        assert_eq!(unsqueezed(&[2], 0).unwrap(), (vec![1, 2], 0));
        assert!(unsqueezed(&[2], 3).is_err());
        assert!(unsqueezed_protected("OneHot", &[4], -1).is_err());
        assert!(squeezed_protected("OneHot", &[1], Some(0)).is_err());
        assert_eq!(
            squeezed_protected("OneHot", &[1, 1], None)
                .unwrap()
                .map(|s| s.0),
            Some(vec![1])
        );
    }

    #[test]
    fn unravel_index() {
        assert_eq!(unravel(5, &[2, 3]), vec![1, 2]);
        assert_eq!(unravel(0, &[]), Vec::<i64>::new());
    }

    #[test]
    fn tuple_format() {
        assert_eq!(tuple_fmt(&[3, 4]), "(3, 4)");
        assert_eq!(tuple_fmt(&[3]), "(3,)");
        assert_eq!(tuple_fmt(&[]), "()");
    }
}
