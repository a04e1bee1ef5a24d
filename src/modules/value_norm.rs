//! Value normalisers (TorchRL's `torchrl.modules.value_norm`): running estimates of the
//! location and scale of the value targets a critic regresses on, for losses that rescale
//! their advantage ([`A2CLoss`](crate::objectives::A2CLoss) and the PPO losses'
//! `advantage_norm`) or a critic that works on a fixed scale.
//!
//! | type | statistics | `scale()` |
//! |---|---|---|
//! | [`PopArtValueNorm`] | EMA of the mean and of the mean of squares, debiased (`beta`) | `sqrt(max(E[x²] - E[x]², ε))` |
//! | [`RunningValueNorm`] | exact running mean and population variance (Chan / Welford) | `sqrt(max(M2 / max(n, 1), ε))` |
//! | [`PercentileValueNorm`] | EMA (`rate`) of a low and a high quantile (DreamerV3) | `max(high - low, min_scale)` |
//!
//! Every normaliser works on tensors whose trailing dims are its `shape` (default `[1]`): an
//! update reduces all the leading dims. The statistics live in buffers of the normaliser's
//! dtype (float32 unless [`with_kind`](PopArtValueNorm::with_kind) says otherwise); values of
//! another floating dtype are converted. Updates never record a graph.
//!
//! ```
//! use tch::{Device, Kind, Tensor};
//! use torchrl::modules::{PercentileValueNorm, ValueNorm};
//! # fn main() -> torchrl::Result<()> {
//! // TorchRL's docstring example: rate 1 takes the batch's 5 % and 95 % quantiles at once
//! let mut norm = PercentileValueNorm::new().with_rate(1.0)?;
//! let returns = Tensor::f_linspace(0.0, 100.0, 101, (Kind::Float, Device::Cpu))?.f_unsqueeze(-1)?;
//! norm.update(&returns)?;
//! assert!((norm.scale()?.double_value(&[0]) - 90.0).abs() < 1e-4);
//! let half = norm.normalize(&Tensor::from_slice(&[45.0f32]))?;
//! assert!((half.double_value(&[0]) - 0.5).abs() < 1e-6);
//! # Ok(()) }
//! ```

use std::fmt;

use tch::{Device, Kind, Tensor};

use crate::error::{require, Error, Result, ShapeFmt};

/// A running estimate of the value targets' location and scale (TorchRL's `ValueNorm`).
///
/// `normalize` and `denormalize` are inverse maps; `scale` is the multiplicative part alone,
/// for quantities that must not be re-centred (an advantage, already centred by the value
/// baseline, is divided by it).
pub trait ValueNorm: fmt::Debug + Send {
    /// TorchRL's class name (for errors).
    fn name(&self) -> &'static str;
    /// The per-element shape the statistics have (the trailing dims of every input).
    fn shape(&self) -> &[i64];
    /// Folds a batch of value targets into the statistics (no graph is recorded). Errors when
    /// the trailing dims are not [`shape`](Self::shape) or the dtype is not floating.
    fn update(&mut self, value_target: &Tensor) -> Result<()>;
    /// `value_target` standardised with the current statistics.
    fn normalize(&self, value_target: &Tensor) -> Result<Tensor>;
    /// The inverse of [`normalize`](Self::normalize): real-scale values.
    fn denormalize(&self, normalized: &Tensor) -> Result<Tensor>;
    /// The multiplicative scale `normalize` divides by, of shape [`shape`](Self::shape).
    fn scale(&self) -> Result<Tensor>;
    /// The statistics by TorchRL's buffer names (`state_dict` order), for checkpoints and
    /// inspection.
    fn state(&self) -> Vec<(&'static str, &Tensor)>;
}

/// Checks the trailing dims of `x` against `shape` and returns the leading dims to reduce,
/// with `x` detached and converted to `kind`.
fn prepare(op: &'static str, shape: &[i64], kind: Kind, x: &Tensor) -> Result<(Tensor, Vec<i64>)> {
    let size = x.size();
    let n = shape.len();
    let trailing = size.len().checked_sub(n).and_then(|lead| size.get(lead..));
    if trailing != Some(shape) {
        return Err(Error::ShapeMismatch {
            op,
            key: format!(
                "value_target (trailing dims; the normaliser was made with shape {})",
                ShapeFmt(shape)
            ),
            expected: shape.to_vec(),
            actual: size,
        });
    }
    if !x.is_floating_point() {
        return Err(Error::invalid(
            op,
            format!(
                "value_target must be a floating-point tensor, got {:?}",
                x.kind()
            ),
        ));
    }
    let lead = (size.len() - n) as i64;
    Ok((x.f_detach()?.f_to_kind(kind)?, (0..lead).collect()))
}

/// `x` as `kind` (for normalize / denormalize inputs of another floating dtype).
fn floating(op: &'static str, kind: Kind, x: &Tensor) -> Result<Tensor> {
    if !x.is_floating_point() {
        return Err(Error::invalid(
            op,
            format!("expected a floating-point tensor, got {:?}", x.kind()),
        ));
    }
    Ok(x.f_to_kind(kind)?)
}

fn check_shape(op: &'static str, shape: &[i64]) -> Result<()> {
    require(
        !shape.is_empty() && shape.iter().all(|&d| d > 0),
        op,
        "shape",
        "at least one dim, every dim positive",
        ShapeFmt(shape),
    )
}

fn check_epsilon(op: &'static str, epsilon: f64) -> Result<()> {
    require(
        epsilon.is_finite() && epsilon >= 0.0,
        op,
        "epsilon",
        "a finite value >= 0",
        epsilon,
    )
}

/// Builder methods every normaliser shares: the shape, dtype and device of its statistics.
macro_rules! common_builders {
    () => {
        /// The per-element shape (default `[1]`); resets the statistics.
        pub fn with_shape(mut self, shape: &[i64]) -> Result<Self> {
            check_shape(Self::NAME, shape)?;
            self.shape = shape.to_vec();
            self.reset()?;
            Ok(self)
        }

        /// The dtype of the statistics (default float32, TorchRL's default dtype); resets them.
        pub fn with_kind(mut self, kind: Kind) -> Result<Self> {
            require(
                matches!(
                    kind,
                    Kind::Float | Kind::Double | Kind::Half | Kind::BFloat16
                ),
                Self::NAME,
                "kind",
                "a floating dtype",
                format!("{kind:?}"),
            )?;
            self.kind = kind;
            self.reset()?;
            Ok(self)
        }

        /// The device of the statistics (default CPU); resets them.
        pub fn with_device(mut self, device: Device) -> Result<Self> {
            self.device = device;
            self.reset()?;
            Ok(self)
        }
    };
}

/// PopArt's value normaliser (TorchRL's `PopArtValueNorm`; van Hasselt et al. 2019, MAPPO's):
/// exponential moving averages of the mean and of the mean of squares, debiased by the running
/// sum of the weights so the zero start does not bias early estimates.
///
/// An update with batch mean `m` and mean of squares `q`: `μ ← β·μ + (1-β)·m`,
/// `ν ← β·ν + (1-β)·q`, `d ← β·d + (1-β)`. With `d̂ = max(d, ε)`: mean `μ/d̂`, variance
/// `max(ν/d̂ - (μ/d̂)², ε)`; `normalize(x) = (x - mean) / sqrt(var)`.
///
/// ```
/// use tch::Tensor;
/// use torchrl::modules::{PopArtValueNorm, ValueNorm};
/// # fn main() -> torchrl::Result<()> {
/// let mut norm = PopArtValueNorm::new().with_beta(0.5)?;
/// norm.update(&Tensor::from_slice(&[1.0f32, 3.0]).view([2, 1]))?;
/// // one update: the debiased mean is the batch mean, the variance the batch's
/// assert!((norm.denormalize(&Tensor::from_slice(&[0.0f32]))?.double_value(&[0]) - 2.0).abs() < 1e-6);
/// assert!((norm.scale()?.double_value(&[0]) - 1.0).abs() < 1e-5);
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct PopArtValueNorm {
    shape: Vec<i64>,
    beta: f64,
    epsilon: f64,
    kind: Kind,
    device: Device,
    running_mean: Tensor,
    running_mean_sq: Tensor,
    debiasing_term: Tensor,
}

impl Default for PopArtValueNorm {
    fn default() -> Self {
        Self::new()
    }
}

impl PopArtValueNorm {
    const NAME: &'static str = "PopArtValueNorm";

    /// TorchRL's defaults: shape `[1]`, `beta = 0.99999`, `epsilon = 1e-5`, float32 on CPU.
    pub fn new() -> Self {
        let (kind, device) = (Kind::Float, Device::Cpu);
        PopArtValueNorm {
            shape: vec![1],
            beta: 0.99999,
            epsilon: 1e-5,
            kind,
            device,
            running_mean: Tensor::zeros([1], (kind, device)),
            running_mean_sq: Tensor::zeros([1], (kind, device)),
            debiasing_term: Tensor::zeros([0i64; 0], (kind, device)),
        }
    }

    fn reset(&mut self) -> Result<()> {
        let o = (self.kind, self.device);
        self.running_mean = Tensor::f_zeros(self.shape.as_slice(), o)?;
        self.running_mean_sq = Tensor::f_zeros(self.shape.as_slice(), o)?;
        self.debiasing_term = Tensor::f_zeros([0i64; 0], o)?;
        Ok(())
    }

    common_builders!();

    /// The EMA decay (default `0.99999`); in `[0, 1)`.
    pub fn with_beta(mut self, beta: f64) -> Result<Self> {
        require(
            (0.0..1.0).contains(&beta),
            Self::NAME,
            "beta",
            "in [0, 1)",
            beta,
        )?;
        self.beta = beta;
        Ok(self)
    }

    /// The floor of the variance and of the debiasing term (default `1e-5`).
    pub fn with_epsilon(mut self, epsilon: f64) -> Result<Self> {
        check_epsilon(Self::NAME, epsilon)?;
        self.epsilon = epsilon;
        Ok(self)
    }

    /// The debiased mean and the variance.
    fn stats(&self) -> Result<(Tensor, Tensor)> {
        let debias = self.debiasing_term.f_clamp_min(self.epsilon)?;
        let mean = self.running_mean.f_div(&debias)?;
        let mean_sq = self.running_mean_sq.f_div(&debias)?;
        let var = mean_sq
            .f_sub(&mean.f_square()?)?
            .f_clamp_min(self.epsilon)?;
        Ok((mean, var))
    }
}

impl ValueNorm for PopArtValueNorm {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn shape(&self) -> &[i64] {
        &self.shape
    }

    fn update(&mut self, value_target: &Tensor) -> Result<()> {
        let _guard = tch::no_grad_guard();
        let (x, dims) = prepare(Self::NAME, &self.shape, self.kind, value_target)?;
        let (mean, mean_sq) = if dims.is_empty() {
            (x.shallow_clone(), x.f_square()?)
        } else {
            (
                x.f_mean_dim(dims.as_slice(), false, None::<Kind>)?,
                x.f_square()?
                    .f_mean_dim(dims.as_slice(), false, None::<Kind>)?,
            )
        };
        let (b, w) = (self.beta, 1.0 - self.beta);
        self.running_mean = self
            .running_mean
            .f_mul_scalar(b)?
            .f_add(&mean.f_mul_scalar(w)?)?;
        self.running_mean_sq = self
            .running_mean_sq
            .f_mul_scalar(b)?
            .f_add(&mean_sq.f_mul_scalar(w)?)?;
        self.debiasing_term = self.debiasing_term.f_mul_scalar(b)?.f_add_scalar(w)?;
        Ok(())
    }

    fn normalize(&self, value_target: &Tensor) -> Result<Tensor> {
        let (mean, var) = self.stats()?;
        let x = floating(Self::NAME, self.kind, value_target)?;
        Ok(x.f_sub(&mean)?.f_div(&var.f_sqrt()?)?)
    }

    fn denormalize(&self, normalized: &Tensor) -> Result<Tensor> {
        let (mean, var) = self.stats()?;
        let x = floating(Self::NAME, self.kind, normalized)?;
        Ok(x.f_mul(&var.f_sqrt()?)?.f_add(&mean)?)
    }

    fn scale(&self) -> Result<Tensor> {
        Ok(self.stats()?.1.f_sqrt()?)
    }

    fn state(&self) -> Vec<(&'static str, &Tensor)> {
        vec![
            ("running_mean", &self.running_mean),
            ("running_mean_sq", &self.running_mean_sq),
            ("debiasing_term", &self.debiasing_term),
        ]
    }
}

/// The exact running mean and population variance of every target seen, no decay (TorchRL's
/// `RunningValueNorm`): Chan et al.'s parallel update of `(mean, M2, count)`.
///
/// A batch of `n` elements with mean `m` and population variance `v`: with `δ = m - mean` and
/// `N = count + n`, `mean ← mean + δ·n/N`, `M2 ← M2 + v·n + δ²·count·n/N`, `count ← N`. The
/// variance is `max(M2 / max(count, 1), ε)`.
///
/// ```
/// use tch::Tensor;
/// use torchrl::modules::{RunningValueNorm, ValueNorm};
/// # fn main() -> torchrl::Result<()> {
/// let mut norm = RunningValueNorm::new();
/// norm.update(&Tensor::from_slice(&[1.0f32, 3.0]).view([2, 1]))?;
/// norm.update(&Tensor::from_slice(&[5.0f32, 7.0]).view([2, 1]))?;
/// // mean 4, population variance 5 over the four values
/// let z = norm.normalize(&Tensor::from_slice(&[4.0f32 + 5f32.sqrt()]))?;
/// assert!((z.double_value(&[0]) - 1.0).abs() < 1e-5);
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct RunningValueNorm {
    shape: Vec<i64>,
    epsilon: f64,
    kind: Kind,
    device: Device,
    mean: Tensor,
    m2: Tensor,
    count: Tensor,
}

impl Default for RunningValueNorm {
    fn default() -> Self {
        Self::new()
    }
}

impl RunningValueNorm {
    const NAME: &'static str = "RunningValueNorm";

    /// TorchRL's defaults: shape `[1]`, `epsilon = 1e-5`, float32 on CPU.
    pub fn new() -> Self {
        let (kind, device) = (Kind::Float, Device::Cpu);
        RunningValueNorm {
            shape: vec![1],
            epsilon: 1e-5,
            kind,
            device,
            mean: Tensor::zeros([1], (kind, device)),
            m2: Tensor::zeros([1], (kind, device)),
            count: Tensor::zeros([0i64; 0], (kind, device)),
        }
    }

    fn reset(&mut self) -> Result<()> {
        let o = (self.kind, self.device);
        self.mean = Tensor::f_zeros(self.shape.as_slice(), o)?;
        self.m2 = Tensor::f_zeros(self.shape.as_slice(), o)?;
        self.count = Tensor::f_zeros([0i64; 0], o)?;
        Ok(())
    }

    common_builders!();

    /// The floor of the variance (default `1e-5`).
    pub fn with_epsilon(mut self, epsilon: f64) -> Result<Self> {
        check_epsilon(Self::NAME, epsilon)?;
        self.epsilon = epsilon;
        Ok(self)
    }

    fn var(&self) -> Result<Tensor> {
        let denom = self.count.f_clamp_min(1.0)?;
        Ok(self.m2.f_div(&denom)?.f_clamp_min(self.epsilon)?)
    }
}

impl ValueNorm for RunningValueNorm {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn shape(&self) -> &[i64] {
        &self.shape
    }

    fn update(&mut self, value_target: &Tensor) -> Result<()> {
        let _guard = tch::no_grad_guard();
        let (x, dims) = prepare(Self::NAME, &self.shape, self.kind, value_target)?;
        let (n, mean, var) = if dims.is_empty() {
            (1.0, x.shallow_clone(), x.f_zeros_like()?)
        } else {
            let size = x.size();
            let n: i64 = dims.iter().filter_map(|&d| size.get(d as usize)).product();
            (
                n as f64,
                x.f_mean_dim(dims.as_slice(), false, None::<Kind>)?,
                x.f_var_correction(dims.as_slice(), 0i64, false)?,
            )
        };
        let delta = mean.f_sub(&self.mean)?;
        let total = self.count.f_add_scalar(n)?;
        let new_mean = self
            .mean
            .f_add(&delta.f_mul(&total.f_reciprocal()?.f_mul_scalar(n)?)?)?;
        let cross = self.count.f_mul_scalar(n)?.f_div(&total)?;
        let new_m2 = self
            .m2
            .f_add(&var.f_mul_scalar(n)?)?
            .f_add(&delta.f_square()?.f_mul(&cross)?)?;
        self.mean = new_mean;
        self.m2 = new_m2;
        self.count = total;
        Ok(())
    }

    fn normalize(&self, value_target: &Tensor) -> Result<Tensor> {
        let x = floating(Self::NAME, self.kind, value_target)?;
        Ok(x.f_sub(&self.mean)?.f_div(&self.var()?.f_sqrt()?)?)
    }

    fn denormalize(&self, normalized: &Tensor) -> Result<Tensor> {
        let x = floating(Self::NAME, self.kind, normalized)?;
        Ok(x.f_mul(&self.var()?.f_sqrt()?)?.f_add(&self.mean)?)
    }

    fn scale(&self) -> Result<Tensor> {
        Ok(self.var()?.f_sqrt()?)
    }

    fn state(&self) -> Vec<(&'static str, &Tensor)> {
        vec![
            ("mean", &self.mean),
            ("m2", &self.m2),
            ("count", &self.count),
        ]
    }
}

/// DreamerV3's return normaliser (TorchRL's `PercentileValueNorm`; Hafner et al. 2023): EMAs
/// of a low and a high quantile of the targets; the scale is their span clamped from below,
/// so large returns are scaled down and small or noisy ones are not amplified.
///
/// An update moves `low` and `high` towards the batch's quantiles (linear interpolation, as
/// `torch.quantile`) at `rate`: `low ← low + rate·(q_low - low)`. `scale = max(high - low,
/// min_scale)`; `normalize(x) = x / scale`, or `(x - low) / scale` with `center`.
#[derive(Debug)]
pub struct PercentileValueNorm {
    shape: Vec<i64>,
    quantiles: (f64, f64),
    rate: f64,
    min_scale: f64,
    center: bool,
    epsilon: f64,
    kind: Kind,
    device: Device,
    low: Tensor,
    high: Tensor,
}

impl Default for PercentileValueNorm {
    fn default() -> Self {
        Self::new()
    }
}

impl PercentileValueNorm {
    const NAME: &'static str = "PercentileValueNorm";

    /// TorchRL's defaults: shape `[1]`, quantiles `(0.05, 0.95)`, `rate = 0.01`,
    /// `min_scale = 1`, not centred, float32 on CPU.
    pub fn new() -> Self {
        let (kind, device) = (Kind::Float, Device::Cpu);
        PercentileValueNorm {
            shape: vec![1],
            quantiles: (0.05, 0.95),
            rate: 0.01,
            min_scale: 1.0,
            center: false,
            epsilon: 1e-5,
            kind,
            device,
            low: Tensor::zeros([1], (kind, device)),
            high: Tensor::zeros([1], (kind, device)),
        }
    }

    fn reset(&mut self) -> Result<()> {
        let o = (self.kind, self.device);
        self.low = Tensor::f_zeros(self.shape.as_slice(), o)?;
        self.high = Tensor::f_zeros(self.shape.as_slice(), o)?;
        Ok(())
    }

    common_builders!();

    /// The low and high quantiles tracked (default `(0.05, 0.95)`); `0 <= low < high <= 1`.
    pub fn with_quantiles(mut self, low: f64, high: f64) -> Result<Self> {
        require(
            (0.0..high).contains(&low) && high <= 1.0,
            Self::NAME,
            "quantiles",
            "0 <= low < high <= 1",
            format!("({low}, {high})"),
        )?;
        self.quantiles = (low, high);
        Ok(self)
    }

    /// The EMA rate towards the batch quantiles (default `0.01`); in `[0, 1]`.
    pub fn with_rate(mut self, rate: f64) -> Result<Self> {
        require(
            (0.0..=1.0).contains(&rate),
            Self::NAME,
            "rate",
            "in [0, 1]",
            rate,
        )?;
        self.rate = rate;
        Ok(self)
    }

    /// The lower bound of the scale (default `1`); positive.
    pub fn with_min_scale(mut self, min_scale: f64) -> Result<Self> {
        require(
            min_scale > 0.0 && min_scale.is_finite(),
            Self::NAME,
            "min_scale",
            "a finite value > 0",
            min_scale,
        )?;
        self.min_scale = min_scale;
        Ok(self)
    }

    /// Whether `normalize` also subtracts the low quantile (default `false`).
    pub fn with_center(mut self, center: bool) -> Self {
        self.center = center;
        self
    }

    /// Kept for parity with TorchRL's signature; unused (`min_scale` bounds the divisor).
    pub fn with_epsilon(mut self, epsilon: f64) -> Result<Self> {
        check_epsilon(Self::NAME, epsilon)?;
        self.epsilon = epsilon;
        Ok(self)
    }
}

impl ValueNorm for PercentileValueNorm {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn shape(&self) -> &[i64] {
        &self.shape
    }

    fn update(&mut self, value_target: &Tensor) -> Result<()> {
        let _guard = tch::no_grad_guard();
        let (x, _) = prepare(Self::NAME, &self.shape, self.kind, value_target)?;
        let mut flat_shape = vec![-1];
        flat_shape.extend_from_slice(&self.shape);
        let flat = x.f_reshape(flat_shape.as_slice())?;
        if flat.size().first().copied().unwrap_or(0) == 0 {
            return Err(Error::invalid(
                Self::NAME,
                "value_target is empty: a quantile needs at least one element",
            ));
        }
        let q = Tensor::f_from_slice(&[self.quantiles.0, self.quantiles.1])?
            .f_to_kind(self.kind)?
            .f_to_device(flat.device())?;
        let qs = flat.f_quantile(&q, Some(0), false, "linear")?;
        let (batch_low, batch_high) = (qs.f_get(0)?, qs.f_get(1)?);
        self.low = self.low.f_lerp(&batch_low, self.rate)?;
        self.high = self.high.f_lerp(&batch_high, self.rate)?;
        Ok(())
    }

    fn normalize(&self, value_target: &Tensor) -> Result<Tensor> {
        let x = floating(Self::NAME, self.kind, value_target)?;
        let x = if self.center { x.f_sub(&self.low)? } else { x };
        Ok(x.f_div(&self.scale()?)?)
    }

    fn denormalize(&self, normalized: &Tensor) -> Result<Tensor> {
        let x = floating(Self::NAME, self.kind, normalized)?.f_mul(&self.scale()?)?;
        Ok(if self.center { x.f_add(&self.low)? } else { x })
    }

    fn scale(&self) -> Result<Tensor> {
        Ok(self.high.f_sub(&self.low)?.f_clamp_min(self.min_scale)?)
    }

    fn state(&self) -> Vec<(&'static str, &Tensor)> {
        vec![("low", &self.low), ("high", &self.high)]
    }
}
