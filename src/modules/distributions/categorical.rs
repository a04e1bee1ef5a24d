//! [`Categorical`]: a distribution over class indices `0..n`, from logits or probabilities,
//! optionally masked (TorchRL's `MaskedCategorical` with a dense bool mask).
//!
//! Parameters have shape `[*batch_shape, n]`; samples and `log_prob` values are `Int64` class
//! indices of shape `[*sample_shape, *batch_shape]`; the event shape is `[]`. The values are
//! `torch.distributions.Categorical`'s:
//! - from logits: `logits - logsumexp(logits)` (normalised), `probs = softmax(logits)`;
//! - from probs: `probs / probs.sum(-1)`, `logits = ln(clamp(probs, eps, 1 - eps))` with
//!   `eps = torch.finfo(dtype).eps` (so a zero-probability class has log-probability `ln eps`,
//!   about -15.9 in float32, as in torch);
//! - `entropy = -Σ clamp(logits, finfo.min) · probs`, `mode = argmax(probs)`.
//!
//! **Masks** (bool, broadcastable to the logits' shape; `false` excludes a class) follow
//! TorchRL's `MaskedCategorical`: masked logits become `-inf` before normalisation, so a masked
//! class has log-probability `-inf`, probability 0, is never sampled and its logit gets no
//! gradient. With probs, masked probs become 0 and the rest is renormalised; the logits are
//! then those of the unmasked case (`ln(clamp(probs, eps, 1 - eps))`) with `-inf` where masked.
//! This equals TorchRL's values on every allowed class of positive probability, and unlike
//! TorchRL (which takes `ln` of the masked zeros) it keeps the gradients finite. A row with no
//! allowed class (or whose allowed probs sum to 0) is an error at construction.
//!
//! Sampling is inverse-CDF on the parameters' device (one uniform draw per row from the
//! [`Generator`], cumulative probs in float64); a class of probability 0 is never drawn. There
//! is no reparameterisation ([`Distribution::rsample`] errors) and no mean (the classes are
//! unordered: torch returns NaN, [`Distribution::mean`] errors).
//!
//! ```
//! use tch::{Kind, Tensor};
//! use torchrl::modules::distributions::{Categorical, Distribution};
//! use torchrl::Generator;
//! # fn main() -> torchrl::Result<()> {
//! let probs = Tensor::from_slice(&[0.25f32, 0.25, 0.5]);
//! let d = Categorical::from_probs(&probs, None)?;
//! let lp = d.log_prob(&Tensor::from_slice(&[2i64]))?;
//! assert!((lp.double_value(&[0]) - 0.5f64.ln()).abs() < 1e-6);
//! assert_eq!(d.mode()?.int64_value(&[]), 2);
//! // mask out the most likely class
//! let mask = Tensor::from_slice(&[true, true, false]);
//! let m = Categorical::from_probs(&probs, Some(&mask))?;
//! assert_eq!(m.log_prob(&Tensor::from_slice(&[2i64]))?.double_value(&[0]), f64::NEG_INFINITY);
//! let x = m.sample(&mut Generator::new(0), &[500])?;
//! assert_eq!(x.kind(), Kind::Int64);
//! assert_eq!(x.eq(2).sum(Kind::Int64).int64_value(&[]), 0);
//! // every class masked out: refused
//! let none = Tensor::from_slice(&[false, false, false]);
//! assert!(Categorical::from_probs(&probs, Some(&none)).is_err());
//! # Ok(()) }
//! ```

use tch::{Kind, Tensor};

use super::{
    broadcast_shapes, check_device, check_float, check_sample_shape, finfo_eps, finfo_min,
    first_true, is_integer, no_rsample, read_flags, to_device, value_batch_shape, Distribution,
};
use crate::error::{ensure_kind, Error, Result, ShapeFmt};
use crate::rng::Generator;

/// A categorical distribution over `0..n`, optionally masked (see the [module docs](self)).
#[derive(Debug)]
pub struct Categorical {
    /// Normalised logits, `[*batch_shape, n]`.
    logits: Tensor,
    /// Probabilities, `[*batch_shape, n]`.
    probs: Tensor,
    /// The mask broadcast to `[*batch_shape, n]`, if any.
    mask: Option<Tensor>,
    batch_shape: Vec<i64>,
    num_classes: i64,
}

impl Clone for Categorical {
    /// A shallow clone: the tensors (and their autograd graph) are shared.
    fn clone(&self) -> Self {
        Categorical {
            logits: self.logits.shallow_clone(),
            probs: self.probs.shallow_clone(),
            mask: self.mask.as_ref().map(Tensor::shallow_clone),
            batch_shape: self.batch_shape.clone(),
            num_classes: self.num_classes,
        }
    }
}

/// Checks the parameter (float, at least 1-d, at least one class) and the mask (bool,
/// broadcastable); returns the mask on the parameter's device and the full shape.
fn prepare(
    op: &'static str,
    name: &str,
    param: &Tensor,
    mask: Option<&Tensor>,
) -> Result<(Option<Tensor>, Vec<i64>)> {
    check_float(op, name, param)?;
    let ps = param.size();
    if ps.last().copied().unwrap_or(0) < 1 {
        return Err(Error::argument(
            op,
            name,
            "at least one dim holding at least one class",
            format!("shape {}", ShapeFmt(&ps)),
        ));
    }
    let Some(mask) = mask else {
        return Ok((None, ps));
    };
    ensure_kind(op, "mask", Kind::Bool, mask.kind())?;
    let mask = to_device(mask, param.device())?;
    let ms = mask.size();
    let shape = broadcast_shapes(op, &[(name, &ps), ("mask", &ms)])?;
    if shape.last() != ps.last() {
        return Err(Error::argument(
            op,
            "mask",
            format!(
                "a mask that broadcasts to {name}'s class dim (shape {})",
                ShapeFmt(&ps)
            ),
            format!("mask of shape {}", ShapeFmt(&ms)),
        ));
    }
    Ok((Some(mask.f_expand(shape.as_slice(), false)?), shape))
}

/// The error for a row that keeps no class.
/// The error for the first row of `bad_rows` when `flags[1]` (any row empty) is set: `what`
/// is `(masked, unmasked)`, the description for a masked and an unmasked distribution.
fn check_empty_rows(
    op: &'static str,
    flags: &[bool],
    masked: bool,
    (with_mask, without): (&str, &str),
    bad_rows: &Tensor,
    batch: &[i64],
) -> Result<()> {
    if flags.get(1) != Some(&true) {
        return Ok(());
    }
    let what = if masked { with_mask } else { without };
    let row = first_true(bad_rows)?.unwrap_or(0);
    Err(Error::InvalidValue {
        op,
        what: "row",
        key: format!("{row} (flat index over batch_shape {})", ShapeFmt(batch)),
        expected: "a row that keeps at least one class".to_string(),
        got: format!("a row that {what}"),
    })
}

impl Categorical {
    /// A categorical distribution from unnormalised `logits` of shape `[*batch_shape, n]`
    /// (float), optionally masked by a bool `mask` broadcastable to it (`false` excludes a
    /// class; the mask is moved to the logits' device and may extend the batch shape).
    ///
    /// Errors for a non-float `logits`, a NaN or `+inf` logit, a non-bool or non-broadcastable
    /// mask, or a row with no allowed class (every class masked out, or every logit `-inf`).
    pub fn from_logits(logits: &Tensor, mask: Option<&Tensor>) -> Result<Self> {
        let op = "Categorical::from_logits";
        let (mask, shape) = prepare(op, "logits", logits, mask)?;
        let logits = logits.f_expand(shape.as_slice(), false)?;
        let masked = match &mask {
            Some(m) => logits.f_masked_fill(&m.f_logical_not()?, f64::NEG_INFINITY)?,
            None => logits,
        };
        let batch = shape
            .get(..shape.len().saturating_sub(1))
            .unwrap_or(&[])
            .to_vec();
        let (flags, empty) = {
            let _guard = tch::no_grad_guard();
            let bad = masked
                .f_isnan()?
                .f_logical_or(&masked.f_eq(f64::INFINITY)?)?
                .f_any()?;
            let empty = masked
                .f_gt(f64::NEG_INFINITY)?
                .f_any_dim(-1, false)?
                .f_logical_not()?;
            (read_flags(&[bad, empty.f_any()?])?, empty)
        };
        if flags.first() == Some(&true) {
            return Err(Error::argument(
                op,
                "logits",
                "logits without NaN or +inf",
                format!(
                    "logits (shape {}) that contain NaN or +inf",
                    ShapeFmt(&shape)
                ),
            ));
        }
        let what = (
            "allows no class: every class is masked out (or has logit -inf)",
            "has no finite logit: every logit is -inf",
        );
        check_empty_rows(op, &flags, mask.is_some(), what, &empty, &batch)?;
        let norm = masked.f_sub(&masked.f_logsumexp([-1i64].as_slice(), true)?)?;
        let probs = norm.f_softmax(-1, None::<Kind>)?;
        Ok(Categorical {
            num_classes: shape.last().copied().unwrap_or(1),
            logits: norm,
            probs,
            mask,
            batch_shape: batch,
        })
    }

    /// A categorical distribution from (unnormalised) `probs` of shape `[*batch_shape, n]`
    /// (float, non-negative, finite), optionally masked by a bool `mask` (see
    /// [`Categorical::from_logits`]).
    ///
    /// Errors for a negative, NaN or infinite prob, a row whose (allowed) probs sum to 0, or a
    /// bad mask.
    pub fn from_probs(probs: &Tensor, mask: Option<&Tensor>) -> Result<Self> {
        let op = "Categorical::from_probs";
        let (mask, shape) = prepare(op, "probs", probs, mask)?;
        let probs = probs.f_expand(shape.as_slice(), false)?;
        let batch = shape
            .get(..shape.len().saturating_sub(1))
            .unwrap_or(&[])
            .to_vec();
        let masked = match &mask {
            Some(m) => probs.f_masked_fill(&m.f_logical_not()?, 0.0)?,
            None => probs.shallow_clone(),
        };
        let total = masked.f_sum_dim_intlist([-1i64].as_slice(), true, None::<Kind>)?;
        let (flags, empty) = {
            let _guard = tch::no_grad_guard();
            let bad = masked
                .f_lt(0.0)?
                .f_logical_or(&masked.f_isfinite()?.f_logical_not()?)?
                .f_any()?;
            let empty = total.f_le(0.0)?.f_squeeze_dim(-1)?;
            (read_flags(&[bad, empty.f_any()?])?, empty)
        };
        if flags.first() == Some(&true) {
            return Err(Error::argument(
                op,
                "probs",
                "probs that are finite and >= 0 everywhere",
                format!(
                    "probs (shape {}) with a negative or non-finite entry",
                    ShapeFmt(&shape)
                ),
            ));
        }
        let what = (
            "allows no class: its allowed probs sum to 0",
            "has probs summing to 0",
        );
        check_empty_rows(op, &flags, mask.is_some(), what, &empty, &batch)?;
        // torch's Categorical on the masked, renormalised probs: probs kept,
        // logits = ln(clamp_probs(probs)); masked logits then set to -inf.
        let normalised = masked.f_div(&total)?;
        let eps = finfo_eps(normalised.kind());
        let logits = normalised.f_clamp(eps, 1.0 - eps)?.f_log()?;
        let logits = match &mask {
            Some(m) => logits.f_masked_fill(&m.f_logical_not()?, f64::NEG_INFINITY)?,
            None => logits,
        };
        let probs = normalised;
        Ok(Categorical {
            num_classes: shape.last().copied().unwrap_or(1),
            logits,
            probs,
            mask,
            batch_shape: batch,
        })
    }

    /// The normalised logits (log-probabilities), `[*batch_shape, n]`; `-inf` where masked.
    pub fn logits(&self) -> &Tensor {
        &self.logits
    }

    /// The probabilities, `[*batch_shape, n]`; 0 where masked.
    pub fn probs(&self) -> &Tensor {
        &self.probs
    }

    /// The mask broadcast to `[*batch_shape, n]`, if any.
    pub fn mask(&self) -> Option<&Tensor> {
        self.mask.as_ref()
    }

    /// The number of classes `n`.
    pub fn num_classes(&self) -> i64 {
        self.num_classes
    }

    /// `log_prob` of int64 indices already known to be in range, with `out_shape` the
    /// broadcast of their shape and the batch shape.
    pub(crate) fn log_prob_indices(&self, idx: &Tensor, out_shape: &[i64]) -> Result<Tensor> {
        let mut full = out_shape.to_vec();
        full.push(self.num_classes);
        let mut one = out_shape.to_vec();
        one.push(1);
        let idx = idx.f_unsqueeze(-1)?.f_expand(one.as_slice(), false)?;
        let logits = self.logits.f_expand(full.as_slice(), false)?;
        Ok(logits.f_gather(-1, &idx, false)?.f_squeeze_dim(-1)?)
    }

    /// Class indices (int64) of shape `[*sample_shape, *batch_shape]`, without gradient.
    pub(crate) fn sample_indices(
        &self,
        gen: &mut Generator,
        sample_shape: &[i64],
    ) -> Result<Tensor> {
        check_sample_shape("Categorical::sample", sample_shape)?;
        let _guard = tch::no_grad_guard();
        let n = self.num_classes;
        let p = self.probs.f_to_kind(Kind::Double)?;
        let cdf = p.f_cumsum(-1, Kind::Double)?;
        let total = cdf.f_narrow(-1, n - 1, 1)?;
        let mut shape = sample_shape.to_vec();
        shape.extend_from_slice(&self.batch_shape);
        shape.push(1);
        let u = gen
            .uniform(&shape, 0.0, 1.0, Kind::Double, self.device())?
            .f_mul(&total)?;
        // the number of classes whose cumulative prob is <= u: the drawn class
        let idx = cdf
            .f_le_tensor(&u)?
            .f_sum_dim_intlist([-1i64].as_slice(), false, Kind::Int64)?;
        // rounding can push u to the total: fall back to the last class of positive prob
        let last = p
            .f_gt(0.0)?
            .f_flip([-1i64].as_slice())?
            .f_to_kind(Kind::Int64)?
            .f_argmax(-1, false)?
            .f_neg()?
            .f_add_scalar(n - 1)?;
        Ok(idx.f_minimum(&last)?)
    }
}

impl Distribution for Categorical {
    accessors!(any, param: logits, batch: batch_shape, event: []);

    /// The log-probability of integer class indices (any integer dtype) whose shape
    /// broadcasts with the batch shape; `-inf` for masked classes. Errors for a non-integer
    /// value or an index outside `0..n`.
    fn log_prob(&self, value: &Tensor) -> Result<Tensor> {
        let op = "Categorical::log_prob";
        check_device(op, value, self.device())?;
        if !is_integer(value.kind()) {
            return Err(Error::argument(
                op,
                "value",
                "integer class indices",
                format!(
                    "dtype {:?} (value of shape {})",
                    value.kind(),
                    ShapeFmt(&value.size())
                ),
            ));
        }
        let out_shape = value_batch_shape(op, &value.size(), &self.batch_shape, &[])?;
        let idx = value.f_to_kind(Kind::Int64)?;
        let out_of_range = {
            let _guard = tch::no_grad_guard();
            let bad = idx
                .f_lt(0)?
                .f_logical_or(&idx.f_ge(self.num_classes)?)?
                .f_any()?;
            read_flags(&[bad])?.first() == Some(&true)
        };
        if out_of_range {
            let (lo, hi) = {
                let _guard = tch::no_grad_guard();
                (
                    idx.f_min()?.f_int64_value(&[])?,
                    idx.f_max()?.f_int64_value(&[])?,
                )
            };
            return Err(Error::argument(
                op,
                "value",
                format!("class indices in 0..{}", self.num_classes),
                format!(
                    "class indices in [{lo}, {hi}], outside 0..{} (value of shape {})",
                    self.num_classes,
                    ShapeFmt(&value.size())
                ),
            ));
        }
        self.log_prob_indices(&idx, &out_shape)
    }

    fn sample(&self, gen: &mut Generator, sample_shape: &[i64]) -> Result<Tensor> {
        self.sample_indices(gen, sample_shape)
    }

    fn has_rsample(&self) -> bool {
        false
    }

    /// Always an error: class indices have no reparameterisation.
    fn rsample(&self, _gen: &mut Generator, _sample_shape: &[i64]) -> Result<Tensor> {
        Err(no_rsample("Categorical::rsample", "Categorical"))
    }

    fn entropy(&self) -> Result<Tensor> {
        let min_real = finfo_min(self.kind());
        let p_log_p = self.logits.f_clamp_min(min_real)?.f_mul(&self.probs)?;
        Ok(p_log_p
            .f_sum_dim_intlist([-1i64].as_slice(), false, None::<Kind>)?
            .f_neg()?)
    }

    /// `argmax(probs)` (the first maximum on ties), int64 of shape `batch_shape`.
    fn mode(&self) -> Result<Tensor> {
        Ok(self.probs.f_argmax(-1, false)?)
    }

    /// Always an error: the classes are unordered (torch returns NaN).
    fn mean(&self) -> Result<Tensor> {
        Err(Error::invalid(
            "Categorical::mean",
            "a Categorical has no mean: its classes are unordered (torch returns NaN); use \
             probs() or OneHotCategorical, whose mean is probs",
        ))
    }
}
