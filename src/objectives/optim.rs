//! Optimisation helpers: global gradient-norm clipping as `torch.nn.utils.clip_grad_norm_`,
//! and [`FusedAdam`], PyTorch's `Adam(fused=True)` in one libtorch call per step.
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

pub use super::fused_adam::FusedAdam;

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
        norms.push(norm_f64(g)?);
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

/// Elements of a gradient converted to float64 at a time by [`norm_f64`].
const NORM_CHUNK: i64 = 1 << 20;

/// The 2-norm of `g` taken in float64, as a 0-d float64 tensor. A large gradient is taken in
/// slices of [`NORM_CHUNK`] elements (the norm of the slices' norms), so the float64 copy is
/// at most 8 MiB: converting a whole gradient made a fresh copy twice its size on every step
/// (4 GB of new pages a step for the 494 M float32 gradients of a Qwen2.5-0.5B-sized model,
/// `docs/performance.md`).
fn norm_f64(g: &Tensor) -> Result<Tensor> {
    // Element counts of real tensors fit in i64.
    let n = g.numel() as i64;
    if n <= NORM_CHUNK || g.kind() == Kind::Double {
        return Ok(g.f_to_kind(Kind::Double)?.f_norm()?);
    }
    let flat = g.f_reshape([-1])?;
    let mut parts = Vec::with_capacity(usize::try_from(n / NORM_CHUNK + 1).unwrap_or(0));
    let mut start = 0;
    while start < n {
        let len = NORM_CHUNK.min(n - start);
        parts.push(
            flat.f_narrow(0, start, len)?
                .f_to_kind(Kind::Double)?
                .f_norm()?,
        );
        start += len;
    }
    Ok(Tensor::f_stack(&parts, 0)?.f_norm()?)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_large_gradient_is_normed_in_slices_as_a_whole() {
        // 3 slices and a tail of 6; values whose squares sum exactly in float64
        let n = 3 * NORM_CHUNK + 6;
        let g = Tensor::arange(n, (Kind::Float, tch::Device::Cpu))
            .remainder(7)
            .f_sub_scalar(3.0)
            .unwrap()
            .reshape([n / 2, 2]);
        let hand: f64 = (0..n)
            .map(|i| ((i % 7) as f64 - 3.0).powi(2))
            .sum::<f64>()
            .sqrt();
        let sliced = norm_f64(&g).unwrap();
        assert_eq!(sliced.kind(), Kind::Double);
        let sliced = sliced.double_value(&[]);
        assert!((sliced - hand).abs() <= 1e-12 * hand, "{sliced} vs {hand}");
        let whole = g.to_kind(Kind::Double).norm().double_value(&[]);
        assert!(
            (sliced - whole).abs() <= 1e-12 * hand,
            "{sliced} vs {whole}"
        );
        // small gradients take the one-piece path, with the same answer
        let small = Tensor::from_slice(&[3.0f32, -4.0]);
        assert_eq!(norm_f64(&small).unwrap().double_value(&[]), 5.0);
    }
}
