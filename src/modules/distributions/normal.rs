//! [`Normal`]: the Gaussian `N(loc, scale²)`, elementwise, with `torch.distributions.Normal`'s
//! values.
//!
//! `loc` and `scale` broadcast together into the batch shape; the event shape is `[]`.
//! `log_prob(x) = -(x - loc)² / (2 scale²) - ln(scale) - ln(√(2π))`,
//! `entropy = ½ + ½ ln(2π) + ln(scale)`, `mean = mode = loc`. Samples are `loc + scale · ε`
//! with `ε` drawn by a [`Generator`], so [`Distribution::rsample`] is differentiable.
//!
//! ```
//! use tch::{Kind, Tensor};
//! use torchrl::modules::distributions::{Distribution, Normal};
//! use torchrl::Generator;
//! # fn main() -> torchrl::Result<()> {
//! let loc = Tensor::from_slice(&[0.0f32, 1.0]).set_requires_grad(true);
//! let scale = Tensor::from_slice(&[1.0f32, 2.0]);
//! let d = Normal::new(&loc, &scale)?;
//! let lp = d.log_prob(&Tensor::from_slice(&[0.0f32, 1.0]))?;
//! let expected = -0.918_938_5 - 2f64.ln(); // -ln(√(2π)) - ln(2)
//! assert!((lp.double_value(&[1]) - expected).abs() < 1e-6);
//! // reparameterised: d(sample)/d(loc) = 1
//! let x = d.rsample(&mut Generator::new(0), &[3])?;
//! assert_eq!(x.size(), vec![3, 2]);
//! x.sum(Kind::Float).backward();
//! assert_eq!(Vec::<f32>::try_from(&loc.grad())?, vec![3.0, 3.0]);
//! // invalid parameters are refused with the argument's name
//! let err = Normal::new(&loc, &Tensor::from_slice(&[1.0f32, 0.0])).unwrap_err();
//! assert!(err.to_string().contains("scale"));
//! # Ok(()) }
//! ```

use tch::Tensor;

use super::{
    broadcast_shapes, check_float, check_sample_shape, float_value, to_device, value_batch_shape,
    Distribution, LN_SQRT_2PI,
};
use crate::error::{ensure_kind, Error, Result, ShapeFmt};
use crate::rng::Generator;

/// The Gaussian distribution `N(loc, scale²)` (see the [module docs](self)).
#[derive(Debug)]
pub struct Normal {
    loc: Tensor,
    scale: Tensor,
    batch_shape: Vec<i64>,
}

impl Clone for Normal {
    /// A shallow clone: the parameters (and their autograd graph) are shared.
    fn clone(&self) -> Self {
        Normal {
            loc: self.loc.shallow_clone(),
            scale: self.scale.shallow_clone(),
            batch_shape: self.batch_shape.clone(),
        }
    }
}

/// `log N(x; loc, scale²)`, elementwise (torch's formula and operation order).
pub(crate) fn normal_log_prob(x: &Tensor, loc: &Tensor, scale: &Tensor) -> Result<Tensor> {
    let var = scale.f_square()?;
    let sq = x.f_sub(loc)?.f_square()?;
    Ok(sq
        .f_neg()?
        .f_div(&var.f_mul_scalar(2.0)?)?
        .f_sub(&scale.f_log()?)?
        .f_sub_scalar(LN_SQRT_2PI)?)
}

/// Validates a (loc, scale) pair: float dtypes, the same dtype, scale moved to loc's device,
/// broadcastable shapes, `scale > 0` and no NaN in either. Returns scale on loc's device and
/// the broadcast shape.
pub(crate) fn validate_loc_scale(
    op: &'static str,
    loc: &Tensor,
    scale: &Tensor,
    extra: &[(&str, &[i64])],
) -> Result<(Tensor, Vec<i64>)> {
    check_float(op, "loc", loc)?;
    check_float(op, "scale", scale)?;
    ensure_kind(op, "scale", loc.kind(), scale.kind())?;
    let scale = to_device(scale, loc.device())?;
    let (ls, ss) = (loc.size(), scale.size());
    let mut named: Vec<(&str, &[i64])> = vec![("loc", &ls), ("scale", &ss)];
    named.extend_from_slice(extra);
    let shape = broadcast_shapes(op, &named)?;
    // min(scale) and max(loc) in one read: both reductions propagate NaN, so `min > 0` fails
    // exactly when some scale is <= 0 or NaN, and `max` is NaN exactly when some loc is
    let (bad_scale, bad_loc) = if scale.numel() == 0 || loc.numel() == 0 {
        (false, false)
    } else {
        let _guard = tch::no_grad_guard();
        let both = Tensor::f_stack(&[scale.f_min()?, loc.f_max()?], 0)?;
        match crate::rng::read::<f64>(&both)?.as_slice() {
            [min_scale, max_loc] => (min_scale.is_nan() || *min_scale <= 0.0, max_loc.is_nan()),
            _ => (false, false),
        }
    };
    if bad_scale {
        let min = {
            let _guard = tch::no_grad_guard();
            scale.f_min()?.f_double_value(&[])?
        };
        return Err(Error::argument(
            op,
            "scale",
            "a scale that is > 0 and not NaN everywhere",
            format!("scale of shape {} with minimum {min}", ShapeFmt(&ss)),
        ));
    }
    if bad_loc {
        return Err(Error::argument(
            op,
            "loc",
            "a loc without NaN",
            format!("loc of shape {} that contains NaN", ShapeFmt(&ls)),
        ));
    }
    Ok((scale, shape))
}

impl Normal {
    /// `N(loc, scale²)`. `loc` and `scale` must be float tensors of the same dtype whose shapes
    /// broadcast (the batch shape); `scale` is moved to `loc`'s device. Errors when
    /// `scale <= 0` or NaN anywhere, or `loc` has a NaN.
    pub fn new(loc: &Tensor, scale: &Tensor) -> Result<Self> {
        let op = "Normal::new";
        let (scale, shape) = validate_loc_scale(op, loc, scale, &[])?;
        Ok(Normal {
            loc: loc.f_expand(shape.as_slice(), false)?,
            scale: scale.f_expand(shape.as_slice(), false)?,
            batch_shape: shape,
        })
    }

    /// The mean, broadcast to the batch shape.
    pub fn loc(&self) -> &Tensor {
        &self.loc
    }

    /// The standard deviation, broadcast to the batch shape.
    pub fn scale(&self) -> &Tensor {
        &self.scale
    }

    /// The variance `scale²`.
    pub fn variance(&self) -> Result<Tensor> {
        Ok(self.scale.f_square()?)
    }

    fn draw(&self, gen: &mut Generator, sample_shape: &[i64]) -> Result<Tensor> {
        check_sample_shape("Normal::sample", sample_shape)?;
        let shape = self.extended_shape(sample_shape);
        let eps = gen.normal(&shape, 0.0, 1.0, self.kind(), self.device())?;
        Ok(self.loc.f_add(&self.scale.f_mul(&eps)?)?)
    }
}

impl Distribution for Normal {
    accessors!(any, param: loc, batch: batch_shape, event: []);

    fn log_prob(&self, value: &Tensor) -> Result<Tensor> {
        let op = "Normal::log_prob";
        let value = float_value(op, value, self.kind(), self.device())?;
        value_batch_shape(op, &value.size(), &self.batch_shape, &[])?;
        normal_log_prob(&value, &self.loc, &self.scale)
    }

    fn sample(&self, gen: &mut Generator, sample_shape: &[i64]) -> Result<Tensor> {
        let _guard = tch::no_grad_guard();
        self.draw(gen, sample_shape)
    }

    fn has_rsample(&self) -> bool {
        true
    }

    fn rsample(&self, gen: &mut Generator, sample_shape: &[i64]) -> Result<Tensor> {
        self.draw(gen, sample_shape)
    }

    fn entropy(&self) -> Result<Tensor> {
        Ok(self.scale.f_log()?.f_add_scalar(0.5 + LN_SQRT_2PI)?)
    }

    fn mode(&self) -> Result<Tensor> {
        Ok(self.loc.shallow_clone())
    }

    fn mean(&self) -> Result<Tensor> {
        Ok(self.loc.shallow_clone())
    }
}
