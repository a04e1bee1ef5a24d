//! [`Delta`]: TorchRL's `Delta`, all the mass on one point `param` (a deterministic policy
//! written as a distribution).
//!
//! The batch shape is `param`'s shape without its last dim and the event shape is its last dim
//! (both `[]` for a 0-d `param`). `log_prob(value)` is TorchRL's: `+inf` where the value
//! matches `param` (`|value - param| < atol + rtol · |param|` on every element of the event,
//! default `atol = rtol = 1e-6`) and `-inf` elsewhere, in the value's float dtype (it has no
//! gradient). `sample`, `rsample`, `mean` and `mode` all return `param` (expanded to the sample
//! shape; `rsample`, `mean` and `mode` keep its gradient). There is no entropy (TorchRL raises;
//! [`Distribution::entropy`] errors).
//!
//! ```
//! use tch::{Kind, Tensor};
//! use torchrl::modules::distributions::{Delta, Distribution};
//! use torchrl::Generator;
//! # fn main() -> torchrl::Result<()> {
//! let param = Tensor::from_slice(&[0.5f32, -1.0]).set_requires_grad(true);
//! let d = Delta::new(&param)?;
//! assert_eq!((d.batch_shape(), d.event_shape()), (&[][..], &[2i64][..]));
//! assert_eq!(d.log_prob(&Tensor::from_slice(&[0.5f32, -1.0]))?.double_value(&[]), f64::INFINITY);
//! assert_eq!(d.log_prob(&Tensor::from_slice(&[0.5f32, 0.0]))?.double_value(&[]), f64::NEG_INFINITY);
//! let x = d.rsample(&mut Generator::new(0), &[3])?;
//! assert_eq!(x.size(), vec![3, 2]);
//! x.sum(Kind::Float).backward();
//! assert_eq!(Vec::<f32>::try_from(&param.grad())?, vec![3.0, 3.0]);
//! assert!(d.entropy().is_err());
//! # Ok(()) }
//! ```

use tch::Tensor;

use super::{
    cat_shape, check_float, check_sample_shape, float_value, value_batch_shape, Distribution,
};
use crate::error::{Error, Result};
use crate::rng::Generator;

/// A point mass at `param` (see the [module docs](self)).
#[derive(Debug)]
pub struct Delta {
    param: Tensor,
    atol: f64,
    rtol: f64,
    batch_shape: Vec<i64>,
    event_shape: Vec<i64>,
}

impl Clone for Delta {
    /// A shallow clone: `param` (and its autograd graph) is shared.
    fn clone(&self) -> Self {
        Delta {
            param: self.param.shallow_clone(),
            atol: self.atol,
            rtol: self.rtol,
            batch_shape: self.batch_shape.clone(),
            event_shape: self.event_shape.clone(),
        }
    }
}

impl Delta {
    /// A point mass at `param` (a float tensor), with tolerances `atol = rtol = 1e-6`.
    pub fn new(param: &Tensor) -> Result<Self> {
        check_float("Delta::new", "param", param)?;
        let shape = param.size();
        let split = shape.len().saturating_sub(1);
        Ok(Delta {
            param: param.shallow_clone(),
            atol: 1e-6,
            rtol: 1e-6,
            batch_shape: shape.get(..split).unwrap_or(&[]).to_vec(),
            event_shape: shape.get(split..).unwrap_or(&[]).to_vec(),
        })
    }

    /// Sets the tolerances of `log_prob`'s match (finite and `>= 0`).
    pub fn with_tolerance(mut self, atol: f64, rtol: f64) -> Result<Self> {
        if !(atol.is_finite() && rtol.is_finite() && atol >= 0.0 && rtol >= 0.0) {
            return Err(Error::InvalidValue {
                op: "Delta::with_tolerance",
                what: "arguments",
                key: "atol, rtol".to_string(),
                expected: "finite values >= 0".to_string(),
                got: format!("atol={atol}, rtol={rtol}"),
            });
        }
        self.atol = atol;
        self.rtol = rtol;
        Ok(self)
    }

    /// The point.
    pub fn param(&self) -> &Tensor {
        &self.param
    }

    fn expanded(&self, sample_shape: &[i64]) -> Result<Tensor> {
        check_sample_shape("Delta::sample", sample_shape)?;
        let shape = cat_shape(sample_shape, &self.param.size());
        Ok(self.param.f_expand_copy(shape.as_slice(), false)?)
    }
}

impl Distribution for Delta {
    accessors!(param: param, batch: batch_shape, event: event_shape);

    /// `+inf` where `value` matches `param` on the whole event, `-inf` elsewhere.
    fn log_prob(&self, value: &Tensor) -> Result<Tensor> {
        let op = "Delta::log_prob";
        let value = float_value(op, value, self.kind(), self.device())?;
        value_batch_shape(op, &value.size(), &self.batch_shape, &self.event_shape)?;
        let _guard = tch::no_grad_guard();
        let tol = self
            .param
            .f_abs()?
            .f_mul_scalar(self.rtol)?
            .f_add_scalar(self.atol)?;
        let mut equal = value.f_sub(&self.param)?.f_abs()?.f_lt_tensor(&tol)?;
        for _ in 0..self.event_shape.len() {
            equal = equal.f_all_dim(-1, false)?;
        }
        let pos = Tensor::f_full([], f64::INFINITY, (value.kind(), value.device()))?;
        Ok(pos.f_where_scalarother(&equal, f64::NEG_INFINITY)?)
    }

    /// `param` expanded to `[*sample_shape, *param.shape]`, a fresh tensor without gradient.
    fn sample(&self, _gen: &mut Generator, sample_shape: &[i64]) -> Result<Tensor> {
        let _guard = tch::no_grad_guard();
        self.expanded(sample_shape)
    }

    fn has_rsample(&self) -> bool {
        true
    }

    /// `param` expanded to `[*sample_shape, *param.shape]`, with its gradient.
    fn rsample(&self, _gen: &mut Generator, sample_shape: &[i64]) -> Result<Tensor> {
        self.expanded(sample_shape)
    }

    /// Always an error: a point mass has no (finite) entropy.
    fn entropy(&self) -> Result<Tensor> {
        Err(Error::invalid(
            "Delta::entropy",
            "a Delta (point mass) has no entropy (TorchRL raises NotImplementedError)",
        ))
    }

    fn mode(&self) -> Result<Tensor> {
        Ok(self.param.shallow_clone())
    }

    fn mean(&self) -> Result<Tensor> {
        Ok(self.param.shallow_clone())
    }
}
