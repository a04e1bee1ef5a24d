//! Optimisation helpers: global gradient-norm clipping as `torch.nn.utils.clip_grad_norm_`.
//!
//! `tch`'s `Optimizer::backward_step_clip` clips each gradient *value*; TorchRL's training
//! loops (PPO, the RLHF losses) clip the *global L2 norm* of all gradients together and log
//! the norm before clipping. [`clip_grad_norm`] does that and returns the norm;
//! [`step_with_grad_norm`] is the zero-grad / backward / clip / step sequence.
//!
//! ```
//! use tch::nn::{self, OptimizerConfig};
//! use tch::{Device, Kind, Tensor};
//! use torchrl::objectives::optim::{clip_grad_norm, step_with_grad_norm};
//! # fn main() -> torchrl::Result<()> {
//! let vs = nn::VarStore::new(Device::Cpu);
//! let w = vs.root().zeros("w", &[2]);
//! // d/dw of w·[3, 4] is [3, 4]: norm 5
//! (&w * Tensor::from_slice(&[3.0f32, 4.0])).sum(Kind::Float).backward();
//! let norm = clip_grad_norm(&vs, 1.0)?;
//! assert!((norm - 5.0).abs() < 1e-6); // the norm before clipping
//! let g = Vec::<f32>::try_from(w.grad())?;
//! assert!((g[0] - 0.6).abs() < 1e-5 && (g[1] - 0.8).abs() < 1e-5); // scaled to norm 1
//!
//! let mut opt = nn::Sgd::default().build(&vs, 0.1)?;
//! let loss = (&w * Tensor::from_slice(&[3.0f32, 4.0])).sum(Kind::Float);
//! let norm = step_with_grad_norm(&mut opt, &vs, &loss, 1.0)?;
//! assert!((norm - 5.0).abs() < 1e-6);
//! assert!((w.double_value(&[1]) + 0.08).abs() < 1e-6); // w -= 0.1 * 0.8
//! # Ok(()) }
//! ```

use tch::{nn, Kind, Tensor};

use crate::error::{Error, Result};

/// Clips the global L2 norm of the gradients of `vs`'s trainable variables to `max_norm`, as
/// `torch.nn.utils.clip_grad_norm_(params, max_norm)`: every gradient is scaled by
/// `max_norm / (total_norm + 1e-6)` when that is below 1. Variables without a gradient are
/// skipped. Returns the total norm **before** clipping (0 when no variable has a gradient).
///
/// As in PyTorch (`error_if_nonfinite=False`), a non-finite total norm is returned as is and
/// the gradients are scaled anyway (check the returned norm to skip such a step).
///
/// # Errors
/// When `max_norm` is negative or NaN, or on a libtorch error.
pub fn clip_grad_norm(vs: &nn::VarStore, max_norm: f64) -> Result<f64> {
    clip_grad_norm_tensors(&vs.trainable_variables(), max_norm)
}

/// [`clip_grad_norm`] over explicit parameters.
pub fn clip_grad_norm_tensors(params: &[Tensor], max_norm: f64) -> Result<f64> {
    if max_norm.is_nan() || max_norm < 0.0 {
        return Err(Error::argument(
            "clip_grad_norm",
            "max_norm",
            "a non-negative number (max_norm must be non-negative)",
            max_norm.to_string(),
        ));
    }
    let _guard = tch::no_grad_guard();
    let mut grads = Vec::with_capacity(params.len());
    for p in params {
        let g = p.f_grad()?;
        if g.defined() {
            grads.push(g);
        }
    }
    if grads.is_empty() {
        return Ok(0.0);
    }
    let mut norms = Vec::with_capacity(grads.len());
    for g in &grads {
        norms.push(g.f_to_kind(Kind::Double)?.f_norm()?);
    }
    let total = Tensor::f_stack(&norms, 0)?.f_norm()?.f_double_value(&[])?;
    let coef = max_norm / (total + 1e-6);
    if coef < 1.0 || coef.is_nan() {
        for g in &mut grads {
            let _ = g.f_mul_scalar_(coef)?;
        }
    }
    Ok(total)
}

/// One optimisation step with global gradient-norm clipping: zeroes the gradients, runs
/// `loss.backward()`, clips with [`clip_grad_norm`] and steps `opt`. Returns the gradient norm
/// before clipping. (`tch`'s `backward_step_clip` clips values instead, and returns nothing.)
///
/// `opt` must have been built on `vs`.
pub fn step_with_grad_norm(
    opt: &mut nn::Optimizer,
    vs: &nn::VarStore,
    loss: &Tensor,
    max_norm: f64,
) -> Result<f64> {
    opt.zero_grad();
    loss.f_backward()?;
    let norm = clip_grad_norm(vs, max_norm)?;
    opt.step();
    Ok(norm)
}
