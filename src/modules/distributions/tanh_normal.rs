//! [`TanhNormal`]: TorchRL's `TanhNormal`, a [`Normal`](super::Normal) pushed through `tanh`
//! and the affine map `[-1, 1] → [low, high]`, the usual policy head for bounded continuous
//! actions.
//!
//! With `x ~ N(loc, scale²)`, `c = (high + low) / 2` and `h = (high - low) / 2`, a sample is
//! `y = c + h · tanh(x)` and
//! `log_prob(y) = Σ_event [ log N(x; loc, scale²) - 2 (ln 2 - x - softplus(-2x)) - ln h ]` with
//! `x = atanh((y - c) / h)`: the log-det corrections of tanh and of the affine map. As in
//! TorchRL, the last `event_dims` dims are the event (default `min(1, ndim)`: one action
//! vector per batch element), so `log_prob` sums over them.
//!
//! **Safety near the bounds** (TorchRL's `safe_tanh=True`, `eps = torch.finfo(dtype).resolution`:
//! 1e-6 for float32, 1e-15 for float64, 1e-3 for float16, 1e-2 for bfloat16):
//! - `log_prob` clamps `(y - c) / h` to `[-(1 - eps), 1 - eps]` before `atanh`, so values at or
//!   beyond the bounds get the finite log-probability of the nearest safe point (TorchRL's
//!   values exactly);
//! - sampling clamps `tanh(x)` to the same range, then clamps the result to
//!   `[nextafter(low, high), nextafter(high, low)]`, so that samples are strictly inside
//!   `(low, high)` even where float rounding of `c + h · tanh(x)` would land on a bound (for
//!   example `low = 100, high = 101` in float32);
//! - the clamps do not cut gradients: as in TorchRL's custom backward, the safe tanh has the
//!   gradient `1 - y²` of the clamped `y` (positive even where `tanh` rounds to ±1), the safe
//!   atanh has `1 / (1 - u²)` of the clamped `u`, and the final clamp passes the gradient
//!   through unchanged, so saturated actions still carry gradients.
//!
//! `low` and `high` are constants (detached, cast to `loc`'s dtype). `mean` and `entropy` have
//! no closed form: they return an error, and [`TanhNormal::mean_estimate`] /
//! [`TanhNormal::entropy_estimate`] give Monte-Carlo estimates that take a [`Generator`].
//! [`Distribution::mode`] returns TorchRL's `deterministic_sample`, `c + h · tanh(loc)` (the
//! image of the Normal's mode; TorchRL's `mode` property raises and its `get_mode` runs Adam),
//! which is not the maximum of the density in general.
//!
//! TorchRL's `tanh_loc`/`upscale` option is not ported: apply it to `loc` before construction.
//!
//! ```
//! use tch::{Kind, Tensor};
//! use torchrl::modules::distributions::{Distribution, TanhNormal};
//! use torchrl::Generator;
//! # fn main() -> torchrl::Result<()> {
//! let loc = Tensor::from_slice(&[0.0f32, 20.0]);
//! let scale = Tensor::from_slice(&[1.0f32, 0.1]);
//! let d = TanhNormal::from_scalar_bounds(&loc, &scale, 100.0, 101.0)?;
//! assert_eq!(d.event_shape(), &[2]);
//! let y = d.sample(&mut Generator::new(0), &[1000])?;
//! // strictly inside the bounds, even for the saturated second dim
//! assert!(y.gt(100.0).all().int64_value(&[]) == 1 && y.lt(101.0).all().int64_value(&[]) == 1);
//! assert_eq!(d.log_prob(&y)?.size(), vec![1000]);
//! // mode: TorchRL's deterministic_sample
//! let m = d.mode()?;
//! assert!((m.double_value(&[0]) - 100.5).abs() < 1e-5);
//! assert!(d.entropy().is_err() && d.mean().is_err());
//! let h = d.entropy_estimate(&mut Generator::new(1), 100)?; // Monte Carlo, shape []
//! assert_eq!(h.size(), Vec::<i64>::new());
//! # Ok(()) }
//! ```

use tch::{Device, Kind, Tensor};

use super::normal::{normal_log_prob, validate_loc_scale};
use super::{
    broadcast_shapes, check_float, check_num_samples, check_sample_shape, float_value, read_flags,
    resolution, straight_through, sum_rightmost, to_device, value_batch_shape, Distribution,
};
use crate::error::{Error, Result, ShapeFmt};
use crate::rng::Generator;

/// TorchRL's `TanhNormal`: a Normal squashed by tanh into `(low, high)` (see the
/// [module docs](self)).
#[derive(Debug)]
pub struct TanhNormal {
    loc: Tensor,
    scale: Tensor,
    /// Expanded to the full shape.
    bounds: TanhBounds,
    event_dims: usize,
    shape: Vec<i64>,
}

impl Clone for TanhNormal {
    /// A shallow clone: the tensors (and their autograd graph) are shared.
    fn clone(&self) -> Self {
        TanhNormal {
            loc: self.loc.shallow_clone(),
            scale: self.scale.shallow_clone(),
            bounds: self.bounds.clone(),
            event_dims: self.event_dims,
            shape: self.shape.clone(),
        }
    }
}

/// The bounds of a [`TanhNormal`], checked once (finite, `high > low` everywhere) with what a
/// distribution over them derives: the center `(high + low) / 2`, the half-width
/// `(high − low) / 2` and the sampling clamp `nextafter(low, high)`, `nextafter(high, low)`.
/// [`TanhNormal::with_bounds`] builds distributions over them without redoing either;
/// [`DistributionBuilder::tanh_normal_with_bounds`](crate::modules::DistributionBuilder::tanh_normal_with_bounds)
/// keeps one for its actor's every call.
#[derive(Debug)]
pub struct TanhBounds {
    low: Tensor,
    high: Tensor,
    /// `(high + low) / 2`.
    center: Tensor,
    /// `(high - low) / 2`.
    half_width: Tensor,
    /// `nextafter(low, high)` / `nextafter(high, low)`: the sampling clamp.
    inner_low: Tensor,
    inner_high: Tensor,
}

impl Clone for TanhBounds {
    /// A shallow clone: the tensors are shared.
    fn clone(&self) -> Self {
        TanhBounds {
            low: self.low.shallow_clone(),
            high: self.high.shallow_clone(),
            center: self.center.shallow_clone(),
            half_width: self.half_width.shallow_clone(),
            inner_low: self.inner_low.shallow_clone(),
            inner_high: self.inner_high.shallow_clone(),
        }
    }
}

/// A bound detached, on `device`, of dtype `kind`.
fn cast_bound(t: &Tensor, kind: Kind, device: Device) -> Result<Tensor> {
    let t = to_device(&t.f_detach()?, device)?;
    Ok(if t.kind() == kind {
        t
    } else {
        t.f_to_kind(kind)?
    })
}

impl TanhBounds {
    /// `low` and `high` (broadcastable; detached, on `low`'s device, in `low`'s dtype when it
    /// is a float dtype, else float32).
    ///
    /// # Errors
    /// Shapes that do not broadcast, or bounds that are not finite with `high > low`
    /// everywhere.
    pub fn new(low: &Tensor, high: &Tensor) -> Result<Self> {
        let kind = if low.is_floating_point() {
            low.kind()
        } else {
            Kind::Float
        };
        let device = low.device();
        Self::checked(
            "TanhBounds::new",
            cast_bound(low, kind, device)?,
            cast_bound(high, kind, device)?,
        )
    }

    /// The lower bound.
    pub fn low(&self) -> &Tensor {
        &self.low
    }

    /// The upper bound.
    pub fn high(&self) -> &Tensor {
        &self.high
    }

    /// Checks `low` and `high` (the same dtype and device) and derives the rest.
    fn checked(op: &'static str, low: Tensor, high: Tensor) -> Result<Self> {
        let (lo_s, hi_s) = (low.size(), high.size());
        broadcast_shapes(op, &[("low", &lo_s), ("high", &hi_s)])?;
        let bad = {
            let _guard = tch::no_grad_guard();
            let bad = high
                .f_le_tensor(&low)?
                .f_logical_or(&low.f_isfinite()?.f_logical_not()?)?
                .f_logical_or(&high.f_isfinite()?.f_logical_not()?)?
                .f_any()?;
            read_flags(&[bad])?.first() == Some(&true)
        };
        if bad {
            return Err(Error::InvalidValue {
                op,
                what: "arguments",
                key: "low, high".to_string(),
                expected: "bounds that are finite with high > low everywhere".to_string(),
                got: format!(
                    "bounds that are not (low of shape {}, high of shape {})",
                    ShapeFmt(&lo_s),
                    ShapeFmt(&hi_s)
                ),
            });
        }
        Ok(TanhBounds {
            center: high.f_add(&low)?.f_div_scalar(2.0)?,
            half_width: high.f_sub(&low)?.f_div_scalar(2.0)?,
            inner_low: low.f_nextafter(&high)?,
            inner_high: high.f_nextafter(&low)?,
            low,
            high,
        })
    }
}

/// TorchRL's `safe_tanh`: `clamp(tanh(x), -lim, lim)` in value, with the gradient
/// `1 - clamp(tanh(x))²` (TorchRL's custom backward), which stays positive where `tanh`
/// rounds to ±1, so saturated samples keep a (small) gradient.
fn safe_tanh(x: &Tensor, lim: f64) -> Result<Tensor> {
    if !x.requires_grad() {
        return Ok(x.f_tanh()?.f_clamp(-lim, lim)?);
    }
    let (y, dy) = {
        let _guard = tch::no_grad_guard();
        let y = x.f_tanh()?.f_clamp(-lim, lim)?;
        let dy = y.f_square()?.f_neg()?.f_add_scalar(1.0)?;
        (y, dy)
    };
    // (x - x.detach()) is exactly 0 in value and carries x's gradient.
    Ok(y.f_add(&x.f_sub(&x.f_detach()?)?.f_mul(&dy)?)?)
}

impl TanhNormal {
    /// A TanhNormal over `(low, high)`.
    ///
    /// `loc` and `scale` are float tensors of the same dtype (`scale` is moved to `loc`'s
    /// device); `low` and `high` are tensors of any numeric dtype, cast to `loc`'s dtype, moved
    /// to its device and detached. All four shapes broadcast into the full shape
    /// `[*batch_shape, *event_shape]`, whose last `min(1, ndim)` dims are the event (change with
    /// [`TanhNormal::with_event_dims`]). Errors when `scale <= 0` or NaN, `loc` has a NaN, or
    /// the bounds are not finite with `high > low` everywhere.
    pub fn new(loc: &Tensor, scale: &Tensor, low: &Tensor, high: &Tensor) -> Result<Self> {
        let op = "TanhNormal::new";
        check_float(op, "loc", loc)?;
        let bounds = TanhBounds::checked(
            op,
            cast_bound(low, loc.kind(), loc.device())?,
            cast_bound(high, loc.kind(), loc.device())?,
        )?;
        Self::over(op, loc, scale, &bounds)
    }

    /// A TanhNormal over bounds checked beforehand ([`TanhBounds`]): what an actor that builds
    /// a distribution at every call uses, so that the bounds are checked, and their center,
    /// half-width and sampling clamp derived, once. Equal to [`TanhNormal::new`] over the same
    /// bounds (bounds of another dtype or device than `loc` are cast, and checked again, as
    /// there).
    ///
    /// ```
    /// use tch::Tensor;
    /// use torchrl::modules::distributions::{Distribution, TanhBounds, TanhNormal};
    /// # fn main() -> torchrl::Result<()> {
    /// let (low, high) = (Tensor::from_slice(&[-2.0f32, 0.0]), Tensor::from_slice(&[2.0f32, 1.0]));
    /// let bounds = TanhBounds::new(&low, &high)?;
    /// let (loc, scale) = (Tensor::from_slice(&[0.3f32, -0.1]), Tensor::from_slice(&[0.5f32, 1.5]));
    /// let a = TanhNormal::with_bounds(&loc, &scale, &bounds)?;
    /// let b = TanhNormal::new(&loc, &scale, &low, &high)?;
    /// assert!(a.mode()?.equal(&b.mode()?));
    /// assert!(TanhBounds::new(&high, &low).is_err()); // high > low is checked here
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`TanhNormal::new`].
    pub fn with_bounds(loc: &Tensor, scale: &Tensor, bounds: &TanhBounds) -> Result<Self> {
        let op = "TanhNormal::with_bounds";
        check_float(op, "loc", loc)?;
        Self::over(op, loc, scale, bounds)
    }

    /// The distribution over `bounds`, cast to `loc`'s dtype and device when they differ.
    fn over(op: &'static str, loc: &Tensor, scale: &Tensor, bounds: &TanhBounds) -> Result<Self> {
        let (kind, device) = (loc.kind(), loc.device());
        let cast;
        let b = if bounds.low.kind() == kind && bounds.low.device() == device {
            bounds
        } else {
            cast = TanhBounds::checked(
                op,
                cast_bound(&bounds.low, kind, device)?,
                cast_bound(&bounds.high, kind, device)?,
            )?;
            &cast
        };
        let (lo_s, hi_s) = (b.low.size(), b.high.size());
        let (scale, shape) =
            validate_loc_scale(op, loc, scale, &[("low", &lo_s), ("high", &hi_s)])?;
        let s = shape.as_slice();
        let expand = |t: &Tensor| t.f_expand(s, false);
        Ok(TanhNormal {
            loc: expand(loc)?,
            scale: expand(&scale)?,
            bounds: TanhBounds {
                low: expand(&b.low)?,
                high: expand(&b.high)?,
                center: expand(&b.center)?,
                half_width: expand(&b.half_width)?,
                inner_low: expand(&b.inner_low)?,
                inner_high: expand(&b.inner_high)?,
            },
            event_dims: shape.len().min(1),
            shape,
        })
    }

    /// [`TanhNormal::new`] with scalar bounds.
    pub fn from_scalar_bounds(loc: &Tensor, scale: &Tensor, low: f64, high: f64) -> Result<Self> {
        let opts = (Kind::Double, Device::Cpu);
        TanhNormal::new(
            loc,
            scale,
            &Tensor::f_full([], low, opts)?,
            &Tensor::f_full([], high, opts)?,
        )
    }

    /// Sets how many trailing dims form the event (TorchRL's `event_dims`; at most the number
    /// of dims of the full shape). `log_prob` sums over them.
    pub fn with_event_dims(mut self, event_dims: usize) -> Result<Self> {
        if event_dims > self.shape.len() {
            return Err(Error::argument(
                "TanhNormal::with_event_dims",
                "event_dims",
                format!(
                    "at most the number of dims of the shape {} ({})",
                    ShapeFmt(&self.shape),
                    self.shape.len()
                ),
                format!("{event_dims}, which exceeds it"),
            ));
        }
        self.event_dims = event_dims;
        Ok(self)
    }

    /// The Normal's location, broadcast to the full shape.
    pub fn loc(&self) -> &Tensor {
        &self.loc
    }

    /// The Normal's scale, broadcast to the full shape.
    pub fn scale(&self) -> &Tensor {
        &self.scale
    }

    /// The lower bound, broadcast to the full shape (detached, `loc`'s dtype).
    pub fn low(&self) -> &Tensor {
        &self.bounds.low
    }

    /// The upper bound, broadcast to the full shape (detached, `loc`'s dtype).
    pub fn high(&self) -> &Tensor {
        &self.bounds.high
    }

    /// The number of trailing dims that form the event.
    pub fn event_dims(&self) -> usize {
        self.event_dims
    }

    fn split(&self) -> usize {
        self.shape.len() - self.event_dims.min(self.shape.len())
    }

    /// `c + h · safe_tanh(x)`, clamped strictly inside `(low, high)` (straight-through).
    fn push_forward(&self, x: &Tensor) -> Result<Tensor> {
        let t = safe_tanh(x, 1.0 - resolution(self.kind()))?;
        let y = self
            .bounds
            .center
            .f_add(&self.bounds.half_width.f_mul(&t)?)?;
        straight_through(&y, |y| {
            Ok(y.f_clamp_tensor(Some(&self.bounds.inner_low), Some(&self.bounds.inner_high))?)
        })
    }

    /// `log N(x) - log|det J|(x)`, summed over the event dims.
    fn log_prob_pre_tanh(&self, x: &Tensor) -> Result<Tensor> {
        let base = normal_log_prob(x, &self.loc, &self.scale)?;
        // TanhTransform.log_abs_det_jacobian: 2 (ln 2 - x - softplus(-2x)); plus ln h.
        let ladj_tanh = x
            .f_neg()?
            .f_sub(&x.f_mul_scalar(-2.0)?.f_softplus()?)?
            .f_add_scalar(std::f64::consts::LN_2)?
            .f_mul_scalar(2.0)?;
        let ladj = ladj_tanh.f_add(&self.bounds.half_width.f_abs()?.f_log()?)?;
        Ok(
            sum_rightmost(&base, self.event_dims)?
                .f_sub(&sum_rightmost(&ladj, self.event_dims)?)?,
        )
    }

    fn pre_tanh_noise(&self, gen: &mut Generator, sample_shape: &[i64]) -> Result<Tensor> {
        check_sample_shape("TanhNormal::sample", sample_shape)?;
        let shape = self.extended_shape(sample_shape);
        let eps = gen.normal(&shape, 0.0, 1.0, self.kind(), self.device())?;
        Ok(self.loc.f_add(&self.scale.f_mul(&eps)?)?)
    }

    /// A reparameterised sample and its log-probability, scored at the exact pre-tanh value
    /// (TorchRL's `rsample_and_log_prob`): unlike `log_prob(rsample())`, it does not invert a
    /// rounded (possibly saturated) action. Shapes: [`Distribution::extended_shape`] and
    /// `[*sample_shape, *batch_shape]`.
    pub fn rsample_and_log_prob(
        &self,
        gen: &mut Generator,
        sample_shape: &[i64],
    ) -> Result<(Tensor, Tensor)> {
        let x = self.pre_tanh_noise(gen, sample_shape)?;
        Ok((self.push_forward(&x)?, self.log_prob_pre_tanh(&x)?))
    }

    /// A sample without gradient and its log-probability with score-function gradients
    /// (TorchRL's `sample_and_log_prob`), scored at the exact pre-tanh value.
    pub fn sample_and_log_prob(
        &self,
        gen: &mut Generator,
        sample_shape: &[i64],
    ) -> Result<(Tensor, Tensor)> {
        let (x, y) = {
            let _guard = tch::no_grad_guard();
            let x = self.pre_tanh_noise(gen, sample_shape)?;
            let y = self.push_forward(&x)?;
            (x, y)
        };
        Ok((y, self.log_prob_pre_tanh(&x)?))
    }

    /// A Monte-Carlo estimate of the entropy, `-mean(log_prob)` over `num_samples`
    /// reparameterised samples (differentiable w.r.t. `loc` and `scale`), of shape
    /// `batch_shape`. There is no closed form, which is why [`Distribution::entropy`] errors.
    pub fn entropy_estimate(&self, gen: &mut Generator, num_samples: i64) -> Result<Tensor> {
        check_num_samples("TanhNormal::entropy_estimate", num_samples)?;
        let (_, lp) = self.rsample_and_log_prob(gen, &[num_samples])?;
        Ok(lp
            .f_mean_dim([0i64].as_slice(), false, None::<Kind>)?
            .f_neg()?)
    }

    /// A Monte-Carlo estimate of the mean over `num_samples` reparameterised samples
    /// (differentiable), of shape `[*batch_shape, *event_shape]`. There is no closed form,
    /// which is why [`Distribution::mean`] errors.
    pub fn mean_estimate(&self, gen: &mut Generator, num_samples: i64) -> Result<Tensor> {
        check_num_samples("TanhNormal::mean_estimate", num_samples)?;
        let y = self.rsample(gen, &[num_samples])?;
        Ok(y.f_mean_dim([0i64].as_slice(), false, None::<Kind>)?)
    }
}

impl Distribution for TanhNormal {
    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }

    fn batch_shape(&self) -> &[i64] {
        self.shape.get(..self.split()).unwrap_or(&[])
    }

    fn event_shape(&self) -> &[i64] {
        self.shape.get(self.split()..).unwrap_or(&[])
    }

    accessors!(param: loc);

    /// The log-density of `value` (any point, clamped as described in the
    /// [module docs](self)).
    fn log_prob(&self, value: &Tensor) -> Result<Tensor> {
        let op = "TanhNormal::log_prob";
        let value = float_value(op, value, self.kind(), self.device())?;
        value_batch_shape(op, &value.size(), self.batch_shape(), self.event_shape())?;
        let lim = 1.0 - resolution(self.kind());
        let u = value
            .f_sub(&self.bounds.center)?
            .f_div(&self.bounds.half_width)?;
        let x = straight_through(&u, |u| Ok(u.f_clamp(-lim, lim)?))?.f_atanh()?;
        self.log_prob_pre_tanh(&x)
    }

    fn sample(&self, gen: &mut Generator, sample_shape: &[i64]) -> Result<Tensor> {
        let _guard = tch::no_grad_guard();
        let x = self.pre_tanh_noise(gen, sample_shape)?;
        self.push_forward(&x)
    }

    fn has_rsample(&self) -> bool {
        true
    }

    fn rsample(&self, gen: &mut Generator, sample_shape: &[i64]) -> Result<Tensor> {
        let x = self.pre_tanh_noise(gen, sample_shape)?;
        self.push_forward(&x)
    }

    fn rsample_and_log_prob(
        &self,
        gen: &mut Generator,
        sample_shape: &[i64],
    ) -> Result<(Tensor, Tensor)> {
        TanhNormal::rsample_and_log_prob(self, gen, sample_shape)
    }

    /// Always an error: the entropy of a TanhNormal has no closed form. Use
    /// [`TanhNormal::entropy_estimate`].
    fn entropy(&self) -> Result<Tensor> {
        Err(Error::invalid(
            "TanhNormal::entropy",
            "a TanhNormal has no closed-form entropy; use TanhNormal::entropy_estimate(gen, n) \
             (Monte Carlo) or -log_prob of samples",
        ))
    }

    /// TorchRL's `deterministic_sample`: `c + h · tanh(loc)`, the image of the Normal's mode
    /// (clamped like a sample). Differentiable w.r.t. `loc`.
    fn mode(&self) -> Result<Tensor> {
        self.push_forward(&self.loc)
    }

    /// Always an error: the mean of a TanhNormal has no closed form. Use
    /// [`TanhNormal::mean_estimate`].
    fn mean(&self) -> Result<Tensor> {
        Err(Error::invalid(
            "TanhNormal::mean",
            "a TanhNormal has no closed-form mean; use TanhNormal::mean_estimate(gen, n) \
             (Monte Carlo), or mode() for TorchRL's deterministic_sample",
        ))
    }
}
