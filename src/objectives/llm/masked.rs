//! Masked statistics on token-level data (TRL's and trlX's): [`masked_mean`], [`masked_var`]
//! (unbiased, Bessel as TRL), [`masked_whiten`] (TRL's `masked_whiten`, padding set to 0),
//! [`masked_whiten_global`] (the data-parallel form), and [`whiten`] (trlX's whole-tensor
//! form, kept to show what the reference computes).
//!
//! ```
//! use tch::Tensor;
//! use torchrl::objectives::llm::{masked_mean, masked_whiten};
//! # fn main() -> torchrl::Result<()> {
//! let x = Tensor::from_slice(&[9.0f64, 1.0, 2.0, 3.0]).view([1, 4]);
//! let m = Tensor::from_slice(&[0i64, 1, 1, 1]).view([1, 4]);
//! assert_eq!(masked_mean(&x, &m)?.double_value(&[]), 2.0); // the 9 is masked out
//! let w = masked_whiten(&x, &m, true)?;
//! assert_eq!((w.double_value(&[0, 0]), w.double_value(&[0, 2])), (0.0, 0.0));
//! # Ok(()) }
//! ```

use tch::{Kind, Tensor};

use crate::error::{Error, Result, ShapeFmt};

/// The variance floor of every whitening (`rsqrt(var + 1e-8)`, trlX and TRL).
pub const WHITEN_EPS: f64 = 1e-8;

// ------------------------------------------------------------------------------ checks

pub(crate) fn same_shape(op: &'static str, names: &str, tensors: &[&Tensor]) -> Result<Vec<i64>> {
    let first = tensors.first().map(|t| t.size()).unwrap_or_default();
    if tensors.iter().any(|t| t.size() != first) {
        let got: Vec<String> = tensors
            .iter()
            .map(|t| ShapeFmt(&t.size()).to_string())
            .collect();
        return Err(Error::value(
            op,
            names,
            "one shape for all of them",
            got.join(" / "),
        ));
    }
    Ok(first)
}

pub(crate) fn floating(op: &'static str, key: &str, t: &Tensor) -> Result<()> {
    if t.is_floating_point() {
        Ok(())
    } else {
        Err(Error::value(
            op,
            key,
            "a floating-point tensor",
            format!("{:?}", t.kind()),
        ))
    }
}

/// The number of non-zero mask entries (one host sync).
pub(crate) fn count(mask: &Tensor) -> Result<i64> {
    Ok(mask.f_count_nonzero(None::<i64>)?.int64_value(&[]))
}

pub(crate) fn at_least(op: &'static str, n: i64, min: i64, mask: &Tensor) -> Result<()> {
    if n >= min {
        return Ok(());
    }
    Err(Error::value(
        op,
        "mask",
        format!(
            "at least {min} non-zero entr{}",
            if min == 1 { "y" } else { "ies" }
        ),
        format!("{n} non-zero of {}", ShapeFmt(&mask.size())),
    ))
}

/// `(Σ x·m) / Σ m` with `m` the float mask; masked-out `x` must already be finite.
pub(crate) fn mean_of(x: &Tensor, m: &Tensor) -> Result<Tensor> {
    Ok(x.f_mul(m)?
        .f_sum(None::<Kind>)?
        .f_div(&m.f_sum(None::<Kind>)?)?)
}

/// `x` where `keep`, 0 elsewhere (NaN-safe: a masked-out NaN does not leak).
pub(crate) fn zero_out(x: &Tensor, keep: &Tensor) -> Result<Tensor> {
    Ok(x.f_where_scalarother(keep, 0.0)?)
}

/// Shape/dtype checks of a masked statistic; returns `(keep, float mask, x zeroed outside)`.
pub(crate) fn prepare_masked(
    op: &'static str,
    values: &Tensor,
    mask: &Tensor,
) -> Result<(Tensor, Tensor, Tensor)> {
    same_shape(op, "values, mask", &[values, mask])?;
    floating(op, "values", values)?;
    let keep = mask.f_ne(0)?;
    let m = keep.f_to_kind(values.kind())?;
    let x = zero_out(values, &keep)?;
    Ok((keep, m, x))
}

// ------------------------------------------------------------------------------ statistics

/// The mean of `values` over the positions where `mask` is non-zero (TRL's `masked_mean`).
///
/// Masked-out entries take no part, even when they are NaN (TRL's `values * mask` would
/// propagate them).
///
/// # Shapes
/// `values` and `mask` the same shape (no broadcasting); `mask` any dtype. Output `[]`.
///
/// # Errors
/// When the shapes differ, `values` is not floating point, or the mask is all zero.
///
/// ```
/// use tch::Tensor;
/// use torchrl::objectives::llm::masked_mean;
/// let x = Tensor::from_slice(&[1.0f64, 2.0, f64::NAN, 4.0]);
/// let m = Tensor::from_slice(&[1i64, 1, 0, 0]);
/// assert_eq!(masked_mean(&x, &m)?.double_value(&[]), 1.5);
/// assert!(masked_mean(&x, &m.zeros_like()).is_err());
/// # Ok::<(), torchrl::Error>(())
/// ```
pub fn masked_mean(values: &Tensor, mask: &Tensor) -> Result<Tensor> {
    const OP: &str = "masked_mean";
    let (_, m, x) = prepare_masked(OP, values, mask)?;
    at_least(OP, count(mask)?, 1, mask)?;
    mean_of(&x, &m)
}

/// The variance of `values` over the masked positions (TRL's `masked_var`): the masked mean
/// of the squared deviations, times `n / (n − 1)` when `unbiased` (Bessel, TRL's default).
///
/// # Shapes
/// As [`masked_mean`].
///
/// # Errors
/// As [`masked_mean`]; and when `unbiased` with fewer than 2 masked entries (TRL raises for 0
/// and returns NaN for 1).
///
/// ```
/// use tch::Tensor;
/// use torchrl::objectives::llm::masked_var;
/// let x = Tensor::from_slice(&[1.0f64, 2.0, 3.0, 100.0]);
/// let m = Tensor::from_slice(&[1.0f64, 1.0, 1.0, 0.0]);
/// assert!((masked_var(&x, &m, true)?.double_value(&[]) - 1.0).abs() < 1e-12);
/// assert!((masked_var(&x, &m, false)?.double_value(&[]) - 2.0 / 3.0).abs() < 1e-12);
/// # Ok::<(), torchrl::Error>(())
/// ```
pub fn masked_var(values: &Tensor, mask: &Tensor, unbiased: bool) -> Result<Tensor> {
    const OP: &str = "masked_var";
    let (keep, m, x) = prepare_masked(OP, values, mask)?;
    let n = count(mask)?;
    at_least(OP, n, if unbiased { 2 } else { 1 }, mask)?;
    var_of(&x, &keep, &m, n, unbiased)
}

pub(crate) fn var_of(
    x: &Tensor,
    keep: &Tensor,
    m: &Tensor,
    n: i64,
    unbiased: bool,
) -> Result<Tensor> {
    let mean = mean_of(x, m)?;
    let centered = zero_out(&x.f_sub(&mean)?, keep)?;
    let var = mean_of(&centered.f_square()?, m)?;
    if unbiased {
        let n = n as f64;
        Ok(var.f_mul_scalar(n / (n - 1.0))?)
    } else {
        Ok(var)
    }
}

/// TRL's `masked_whiten`: `(x − mean) · rsqrt(var + 1e-8)` with the masked mean and the
/// unbiased masked variance; with `shift_mean = false` the mean is added back. Masked-out
/// positions are set to 0 (TRL's trainer does this with a `masked_fill` after the call).
///
/// # Shapes
/// As [`masked_mean`]; the output has the input's shape.
///
/// # Errors
/// As [`masked_var`] (at least 2 masked entries).
///
/// **Reference bug (trlX, padding in whitening).** trlX's [`whiten`] runs over the whole
/// `[B, R]` tensor, so the zeros of right-padded rows pull the mean towards 0 and shrink the
/// variance, and the padding positions come out non-zero. On a padded batch the whitened
/// advantages of the real tokens differ from the masked ones
/// (`tests/rlhf_math.rs::reference_bug_padding_in_whitening`).
///
/// ```
/// use tch::Tensor;
/// use torchrl::objectives::llm::{masked_whiten, whiten};
/// // rlhf.md §5.2's advantages, one padded slot
/// let a = Tensor::from_slice(&[0.46575f64, 0.385, 0.3, 0.0]).view([1, 4]);
/// let m = Tensor::from_slice(&[1i64, 1, 1, 0]).view([1, 4]);
/// let ours = masked_whiten(&a, &m, true)?;
/// assert!((ours.double_value(&[0, 0]) - 0.99134365).abs() < 1e-8);
/// assert_eq!(ours.double_value(&[0, 3]), 0.0);
/// let trlx = whiten(&a, true)?; // the padded zero takes part
/// assert!((trlx.double_value(&[0, 0]) - 0.99134365).abs() > 0.1);
/// # Ok::<(), torchrl::Error>(())
/// ```
pub fn masked_whiten(values: &Tensor, mask: &Tensor, shift_mean: bool) -> Result<Tensor> {
    const OP: &str = "masked_whiten";
    let (keep, m, x) = prepare_masked(OP, values, mask)?;
    let n = count(mask)?;
    at_least(OP, n, 2, mask)?;
    whiten_masked(&x, &keep, &m, n, shift_mean)
}

pub(crate) fn whiten_masked(
    x: &Tensor,
    keep: &Tensor,
    m: &Tensor,
    n: i64,
    shift_mean: bool,
) -> Result<Tensor> {
    let mean = mean_of(x, m)?;
    let var = var_of(x, keep, m, n, true)?;
    let mut w = x
        .f_sub(&mean)?
        .f_mul(&var.f_add_scalar(WHITEN_EPS)?.f_rsqrt()?)?;
    if !shift_mean {
        w = w.f_add(&mean)?;
    }
    zero_out(&w, keep)
}

/// A sum all-reduce over the processes of a data-parallel group, in place (e.g.
/// `|t| collective.all_reduce_sum(t)` with a
/// [`Collective`](crate::trainers::parallel::Collective)); the identity in one process.
pub type SumReduce<'a> = dyn Fn(&mut Tensor) -> Result<()> + 'a;

/// [`masked_whiten`] with the mean and variance of every process's masked values together
/// (trlX's `whiten(..., distributed=True)`: `get_global_statistics` sums `(Σx, n)`, then
/// `Σ(x − mean)²`; two calls of `reduce_sum`), each process whitening its own values with
/// them. With the identity (`&|_| Ok(())`) the result is bitwise [`masked_whiten`]'s.
///
/// # Errors
/// As [`masked_whiten`], with the count taken globally (at least 2 masked entries over all
/// processes); what `reduce_sum` returns.
///
/// ```
/// use tch::Tensor;
/// use torchrl::objectives::llm::masked_whiten;
/// use torchrl::objectives::llm::masked_whiten_global;
/// # fn main() -> torchrl::Result<()> {
/// let a = Tensor::from_slice(&[0.46575f64, 0.385, 0.3, 0.0]).view([1, 4]);
/// let m = Tensor::from_slice(&[1i64, 1, 1, 0]).view([1, 4]);
/// let one = masked_whiten_global(&a, &m, true, &|_| Ok(()))?;
/// assert!(one.equal(&masked_whiten(&a, &m, true)?));
/// // a stand-in for two processes holding the same values (the sums double): the mean of
/// // the 6 values is unchanged, their unbiased variance is 2·m2 / 5
/// let two = masked_whiten_global(&a, &m, true, &|t| { let _ = t.f_mul_scalar_(2.0)?; Ok(()) })?;
/// let x = [0.46575f64, 0.385, 0.3];
/// let mean = x.iter().sum::<f64>() / 3.0;
/// let m2: f64 = x.iter().map(|v| (v - mean).powi(2)).sum();
/// let want = (x[0] - mean) / (2.0 * m2 / 5.0 + 1e-8).sqrt();
/// assert!((two.double_value(&[0, 0]) - want).abs() < 1e-9);
/// # Ok(()) }
/// ```
pub fn masked_whiten_global(
    values: &Tensor,
    mask: &Tensor,
    shift_mean: bool,
    reduce_sum: &SumReduce<'_>,
) -> Result<Tensor> {
    Ok(whiten_global_counted(values, mask, shift_mean, reduce_sum)?.0)
}

/// [`masked_whiten_global`] and the global count of masked entries.
pub(crate) fn whiten_global_counted(
    values: &Tensor,
    mask: &Tensor,
    shift_mean: bool,
    reduce_sum: &SumReduce<'_>,
) -> Result<(Tensor, f64)> {
    const OP: &str = "masked_whiten_global";
    let (keep, m, x) = prepare_masked(OP, values, mask)?;
    let mut sums = Tensor::f_stack(
        &[x.f_mul(&m)?.f_sum(None::<Kind>)?, m.f_sum(None::<Kind>)?],
        0,
    )?;
    reduce_sum(&mut sums)?;
    let total = sums.f_select(0, 0)?;
    let count = sums.f_select(0, 1)?;
    let n = count.f_double_value(&[])?.round() as i64;
    at_least(OP, n, 2, mask)?;
    let mean = total.f_div(&count)?;
    let centered = zero_out(&x.f_sub(&mean)?, &keep)?;
    let mut sq = centered.f_square()?.f_mul(&m)?.f_sum(None::<Kind>)?;
    reduce_sum(&mut sq)?;
    let nf = n as f64;
    let var = sq.f_div(&count)?.f_mul_scalar(nf / (nf - 1.0))?;
    let mut w = x
        .f_sub(&mean)?
        .f_mul(&var.f_add_scalar(WHITEN_EPS)?.f_rsqrt()?)?;
    if !shift_mean {
        w = w.f_add(&mean)?;
    }
    Ok((zero_out(&w, &keep)?, nf))
}

/// trlX's `whiten(xs, shift_mean)`: `(x − mean) · rsqrt(var + 1e-8)` over **every** element
/// (`torch.var_mean`, unbiased), padding included. Kept to show the reference's numbers; use
/// [`masked_whiten`] on padded batches.
///
/// # Errors
/// When `values` is not floating point or has fewer than 2 elements.
///
/// ```
/// use tch::Tensor;
/// use torchrl::objectives::llm::whiten;
/// // rlhf.md §5.2
/// let w = whiten(&Tensor::from_slice(&[0.46575f64, 0.385, 0.3]), true)?;
/// assert!((w.double_value(&[2]) + 1.00843578).abs() < 1e-8);
/// # Ok::<(), torchrl::Error>(())
/// ```
pub fn whiten(values: &Tensor, shift_mean: bool) -> Result<Tensor> {
    const OP: &str = "whiten";
    floating(OP, "values", values)?;
    if values.numel() < 2 {
        return Err(Error::value(
            OP,
            "values",
            "at least 2 elements",
            ShapeFmt(&values.size()).to_string(),
        ));
    }
    let (var, mean) = values.f_var_mean(true)?;
    let mut w = values
        .f_sub(&mean)?
        .f_mul(&var.f_add_scalar(WHITEN_EPS)?.f_rsqrt()?)?;
    if !shift_mean {
        w = w.f_add(&mean)?;
    }
    Ok(w)
}
