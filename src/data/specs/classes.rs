//! The class-domain rules the discrete specs share: class ranges and masks (Categorical,
//! MultiCategorical, Binary), one-hot rows (OneHot, MultiOneHot), their projections, and class
//! indices for `encode`. The categorical and one-hot specs both build on this file instead of
//! on each other.
//!
//! ```
//! use tch::Tensor;
//! use torchrl::specs::{Categorical, OneHot};
//! # fn main() -> torchrl::Result<()> {
//! // the same class rule on both sides of a conversion
//! let spec = Categorical::new(3)?;
//! let hot = spec.to_one_hot(&Tensor::from_slice(&[2i64, 0]))?;
//! assert!(spec.to_one_hot_spec().is_in(&hot)?);
//! assert!(spec.to_one_hot(&Tensor::from_slice(&[3i64])).is_err());
//! assert_eq!(OneHot::new(3)?.to_categorical_spec(), spec);
//! # Ok(()) }
//! ```

use tch::{Kind, Tensor};

use super::common::{self, concat, is_float, to_dev};
use crate::error::{ensure, Error, Result, ShapeFmt};
use crate::rng::{build, read};
use crate::tensordict::Elements;

/// `0 <= value < n`, elementwise, compared in int64 (or float64 for floating values): libtorch
/// casts a scalar operand to the tensor's dtype, so `int8 < 128` would compare with -128.
pub(crate) fn in_class_range(value: &Tensor, n: i64) -> Result<Tensor> {
    let wide = match value.kind() {
        Kind::Int64 | Kind::Double => value.shallow_clone(),
        k if is_float(k) => value.f_to_kind(Kind::Double)?,
        _ => value.f_to_kind(Kind::Int64)?,
    };
    Ok(wide.f_ge(0)?.f_logical_and(&wide.f_lt(n)?)?)
}

/// Checks `0 <= v < n` (and the mask) for class values; shared by the categorical specs.
pub(crate) fn class_violation(
    value: &Tensor,
    n: i64,
    mask: Option<&Tensor>,
    kind: Kind,
) -> Result<Option<String>> {
    if value.elements() == 0 {
        return Ok(None);
    }
    let vshape = value.size();
    let ok = in_class_range(value, n)?;
    if !common::all_true(&ok)? {
        let (count, first) = common::first_false(&ok)?;
        let first = first.unwrap_or(0);
        let v = value.f_reshape([-1])?.f_double_value(&[first as i64])?;
        let range = common::value_range(value, kind)?;
        return Ok(Some(format!(
            "out of range: {count} of {} values outside [0, {}] ({range}); first at index {:?} \
             (value shape {}): {}",
            value.elements(),
            n - 1,
            common::unravel(first, &vshape),
            ShapeFmt(&vshape),
            common::fmt_scalar(v, kind)
        )));
    }
    if let Some(mask) = mask {
        let classes = value.f_to_kind(Kind::Int64)?;
        let target = concat(&vshape, &[n]);
        let m = to_dev(mask, value.device())?.f_broadcast_to(target.as_slice())?;
        let allowed = m
            .f_gather(-1, &classes.f_unsqueeze(-1)?, false)?
            .f_squeeze_dim(-1)?;
        if !common::all_true(&allowed)? {
            let (count, first) = common::first_false(&allowed)?;
            let first = first.unwrap_or(0);
            let class = classes.f_reshape([-1])?.f_int64_value(&[first as i64])?;
            return Ok(Some(format!(
                "masked class: {count} of {} values select a class the mask forbids; first at \
                 index {:?} (value shape {}): class {class}",
                value.elements(),
                common::unravel(first, &vshape),
                ShapeFmt(&vshape)
            )));
        }
    }
    Ok(None)
}

/// The largest `n` for which every class `0..n` is exactly representable in `kind`.
fn max_classes(kind: Kind) -> i64 {
    match kind {
        Kind::Bool => 2,
        Kind::Uint8 => 256,
        Kind::Int8 => 128,
        Kind::Int16 => 32768,
        Kind::Int => 1 << 31,
        Kind::Half => (1 << 11) + 1,
        Kind::BFloat16 => (1 << 8) + 1,
        Kind::Float => (1 << 24) + 1,
        Kind::Double => (1 << 53) + 1,
        _ => i64::MAX,
    }
}

/// Errors when `kind` cannot hold every class in `0..n` exactly (a cast would wrap or round
/// a class out of range, so that samples and projections would not be in the spec).
pub(crate) fn check_classes_fit(op: &'static str, n: i64, kind: Kind) -> Result<()> {
    let max = max_classes(kind);
    ensure!(
        n <= max,
        op,
        "{n} classes do not fit dtype {kind:?}, which holds the classes 0..{max} exactly"
    );
    Ok(())
}

/// Class indices (int64) from arbitrary values: floats are rounded, NaN becomes class 0 (as
/// a Bounded spec projects NaN to `low`), and entry `i` along the last dim is clamped to
/// `[0, nvec[i] - 1]` (`nvec` of length 1 applies to every entry).
pub(crate) fn project_classes(value: &Tensor, nvec: &[i64]) -> Result<Tensor> {
    let mut v = value.shallow_clone();
    let maxes: Vec<i64> = nvec.iter().map(|n| n - 1).collect();
    // One bound for every entry is a 0-d tensor, so that clamping never grows a 0-d value.
    let bshape: Vec<i64> = if maxes.len() == 1 {
        vec![]
    } else {
        vec![maxes.len() as i64]
    };
    if is_float(v.kind()) {
        // Clamp while floating: ±inf and huge values have no integer cast.
        let hi = build(&maxes, &bshape, Kind::Double, v.device())?.f_to_kind(v.kind())?;
        let lo = hi.f_zeros_like()?;
        v = v
            .f_nan_to_num(0.0, None, None)?
            .f_round()?
            .f_clamp_tensor(Some(&lo), Some(&hi))?;
    }
    let v = v.f_to_kind(Kind::Int64)?;
    let hi = build(&maxes, &bshape, Kind::Int64, v.device())?;
    let lo = hi.f_zeros_like()?;
    Ok(v.f_clamp_tensor(Some(&lo), Some(&hi))?)
}

/// Replaces classes the mask forbids by the nearest allowed class (ties: the lower one).
pub(crate) fn nearest_allowed(value: &Tensor, n: i64, mask: &Tensor) -> Result<Tensor> {
    let vshape = value.size();
    let target = concat(&vshape, &[n]);
    let m = mask.f_broadcast_to(target.as_slice())?;
    let allowed = read::<bool>(&m)?;
    let mut classes = read::<i64>(value)?;
    let nu = n as usize;
    for (r, c) in classes.iter_mut().enumerate() {
        let row = allowed.get(r * nu..(r + 1) * nu).unwrap_or(&[]);
        let ok = |k: i64| k >= 0 && k < n && row.get(k as usize).copied().unwrap_or(false);
        if ok(*c) {
            continue;
        }
        let found = (1..=n).find_map(|d| {
            if ok(*c - d) {
                Some(*c - d)
            } else if ok(*c + d) {
                Some(*c + d)
            } else {
                None
            }
        });
        match found {
            Some(k) => *c = k,
            None => {
                return Err(Error::invalid(
                    "project",
                    format!(
                        "the mask allows no class at index {:?}",
                        common::unravel(r, &vshape)
                    ),
                ))
            }
        }
    }
    build(&classes, &vshape, value.kind(), value.device())
}

/// One-hot encodes integer classes in `[0, n)` as bool `[..., n]`.
pub(crate) fn to_one_hot(value: &Tensor, n: i64) -> Result<Tensor> {
    if value.elements() > 0 {
        let ok = in_class_range(value, n)?;
        if !common::all_true(&ok)? {
            let (lo, hi) = common::min_max(value)?.unwrap_or((0.0, 0.0));
            return Err(Error::argument(
                "to_one_hot",
                "value",
                format!("class indices in [0, {n})"),
                format!("values in [{lo}, {hi}]"),
            ));
        }
    }
    Ok(value
        .f_to_kind(Kind::Int64)?
        .f_one_hot(n)?
        .f_to_kind(Kind::Bool)?)
}

/// The reason a value is not one-hot along its last dim (values in {0, 1}, one 1 per row).
pub(crate) fn one_hot_violation(value: &Tensor, what: &str) -> Result<Option<String>> {
    if value.elements() == 0 {
        return Ok(None);
    }
    if !common::all_binary(value)? {
        let (lo, hi) = common::min_max(value)?.unwrap_or((0.0, 0.0));
        return Ok(Some(format!(
            "not {what}: values must be 0 or 1, got values in [{lo}, {hi}]"
        )));
    }
    let sums = value.f_sum_dim_intlist([-1i64].as_slice(), false, Kind::Int64)?;
    let ok = sums.f_eq(1)?;
    if !common::all_true(&ok)? {
        let (count, first) = common::first_false(&ok)?;
        let first = first.unwrap_or(0);
        let s = sums.f_reshape([-1])?.f_int64_value(&[first as i64])?;
        return Ok(Some(format!(
            "not {what}: {count} of {} rows do not have exactly one 1 along the last dim; first at \
             index {:?} (value shape {}) has {s}",
            sums.elements(),
            common::unravel(first, &sums.size()),
            ShapeFmt(&value.size())
        )));
    }
    Ok(None)
}

/// Argmax one-hot projection of scores along the last dim, restricted to `mask`.
pub(crate) fn project_one_hot(
    value: &Tensor,
    n: i64,
    mask: Option<&Tensor>,
    kind: Kind,
) -> Result<Tensor> {
    // NaN scores lose to every number, ±inf become the extreme finite values: a masked-out
    // class (-inf below) then never wins, even against -inf or NaN scores.
    let mut scores = value
        .f_to_kind(Kind::Double)?
        .f_nan_to_num(-f64::MAX, f64::MAX, -f64::MAX)?;
    if let Some(m) = mask {
        let m = to_dev(m, value.device())?.f_broadcast_to(value.size().as_slice())?;
        let rows_ok = m
            .f_sum_dim_intlist([-1i64].as_slice(), false, Kind::Int64)?
            .f_ge(1)?;
        if !common::all_true(&rows_ok)? {
            return Err(Error::invalid(
                "project",
                "the mask allows no class in some row: cannot project",
            ));
        }
        scores = scores.f_masked_fill(&m.f_logical_not()?, f64::NEG_INFINITY)?;
    }
    Ok(scores.f_argmax(-1, false)?.f_one_hot(n)?.f_to_kind(kind)?)
}

/// Class indices from `values` (integral, in `[0, n)`), or an error.
pub(crate) fn class_indices(op: &'static str, values: &[f64], n: i64) -> Result<Vec<i64>> {
    values
        .iter()
        .map(|v| {
            if v.fract() == 0.0 && *v >= 0.0 && *v < n as f64 {
                Ok(*v as i64)
            } else {
                Err(Error::argument(
                    op,
                    "value",
                    format!("a class index in [0, {n})"),
                    v.to_string(),
                ))
            }
        })
        .collect()
}

/// Validates an `nvec` (non-empty, every entry >= 1).
pub(crate) fn check_nvec(op: &'static str, nvec: &[i64]) -> Result<()> {
    if nvec.is_empty() || nvec.iter().any(|n| *n < 1) {
        return Err(Error::argument(
            op,
            "nvec",
            "a non-empty nvec with every entry >= 1",
            format!("{nvec:?}"),
        ));
    }
    Ok(())
}
