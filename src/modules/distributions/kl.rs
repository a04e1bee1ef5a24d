//! Closed-form KL divergences between built-in distributions (the pairs PyTorch registers in
//! `torch.distributions.kl` and TorchRL's `has_analytic_kl` finds).
//!
//! | `p`, `q` | `KL(p ‖ q)` | shape |
//! |---|---|---|
//! | [`Normal`], [`Normal`] | `½(σp²/σq² + (μp-μq)²/σq² - 1 - ln(σp²/σq²))` | `batch_shape` |
//! | [`TanhNormal`], [`TanhNormal`] (same bounds and event dims) | the Normal KL of the pre-tanh Gaussians, summed over the event dims | `batch_shape` |
//! | [`Categorical`], [`Categorical`] | `Σ p·(log p - log q)` (`+inf` where `q = 0 < p`, 0 where `p = 0`) | `batch_shape` |
//! | [`OneHotCategorical`], [`OneHotCategorical`] | as [`Categorical`] | `batch_shape` |
//!
//! Any other pair (a [`Delta`](super::Delta), a custom distribution, two `TanhNormal`s with
//! different bounds) has no closed form: [`kl_divergence`] returns `Ok(None)` and callers fall
//! back to a Monte-Carlo estimate, as TorchRL does.
//!
//! ```
//! use tch::Tensor;
//! use torchrl::modules::distributions::{kl_divergence, Categorical, Delta, Normal};
//! # fn main() -> torchrl::Result<()> {
//! let p = Normal::new(&Tensor::from_slice(&[0.0f64]), &Tensor::from_slice(&[1.0f64]))?;
//! let q = Normal::new(&Tensor::from_slice(&[1.0f64]), &Tensor::from_slice(&[2.0f64]))?;
//! let kl = kl_divergence(&p, &q)?.expect("Normal-Normal has a closed form");
//! // ½(1/4 + 1/4 - 1 - ln(1/4)) = ln 2 - 1/4
//! assert!((kl.double_value(&[0]) - (std::f64::consts::LN_2 - 0.25)).abs() < 1e-12);
//! assert!(kl_divergence(&p, &p)?.expect("closed form").double_value(&[0]).abs() < 1e-12);
//!
//! let d = Delta::new(&Tensor::from_slice(&[0.5f64]))?;
//! assert!(kl_divergence(&d, &d)?.is_none()); // no closed form
//! let c = Categorical::from_logits(&Tensor::from_slice(&[0.0f64, 0.0]), None)?;
//! assert!(kl_divergence(&c, &p)?.is_none()); // mixed pair
//! # Ok(()) }
//! ```

use tch::Tensor;

use super::{sum_rightmost, Categorical, Distribution, Normal, OneHotCategorical, TanhNormal};
use crate::error::Result;

/// `KL(p ‖ q)` in closed form, or `None` when the pair has none (see the
/// [module docs](self) for the supported pairs). Differentiable w.r.t. both sides' parameters.
///
/// # Errors
/// A libtorch error (e.g. parameters that do not broadcast together).
pub fn kl_divergence(p: &dyn Distribution, q: &dyn Distribution) -> Result<Option<Tensor>> {
    let (Some(pa), Some(qa)) = (p.as_any(), q.as_any()) else {
        return Ok(None);
    };
    if let (Some(p), Some(q)) = (pa.downcast_ref::<Normal>(), qa.downcast_ref::<Normal>()) {
        return normal_kl(p.loc(), p.scale(), q.loc(), q.scale()).map(Some);
    }
    if let (Some(p), Some(q)) = (
        pa.downcast_ref::<TanhNormal>(),
        qa.downcast_ref::<TanhNormal>(),
    ) {
        if p.event_dims() != q.event_dims()
            || !same(p.low(), q.low())?
            || !same(p.high(), q.high())?
        {
            return Ok(None);
        }
        let kl = normal_kl(p.loc(), p.scale(), q.loc(), q.scale())?;
        return sum_rightmost(&kl, p.event_dims()).map(Some);
    }
    if let (Some(p), Some(q)) = (
        pa.downcast_ref::<Categorical>(),
        qa.downcast_ref::<Categorical>(),
    ) {
        return categorical_kl(p, q).map(Some);
    }
    if let (Some(p), Some(q)) = (
        pa.downcast_ref::<OneHotCategorical>(),
        qa.downcast_ref::<OneHotCategorical>(),
    ) {
        return categorical_kl(p.categorical(), q.categorical()).map(Some);
    }
    Ok(None)
}

/// Equal shapes and values.
fn same(a: &Tensor, b: &Tensor) -> Result<bool> {
    Ok(a.size() == b.size() && a.f_equal(b)?)
}

fn normal_kl(lp: &Tensor, sp: &Tensor, lq: &Tensor, sq: &Tensor) -> Result<Tensor> {
    let var_ratio = sp.f_div(sq)?.f_square()?;
    let t1 = lp.f_sub(lq)?.f_div(sq)?.f_square()?;
    Ok(var_ratio
        .f_add(&t1)?
        .f_sub_scalar(1.0)?
        .f_sub(&var_ratio.f_log()?)?
        .f_mul_scalar(0.5)?)
}

fn categorical_kl(p: &Categorical, q: &Categorical) -> Result<Tensor> {
    let t = p.probs().f_mul(&p.logits().f_sub(q.logits())?)?;
    let inf = Tensor::f_scalar_tensor(f64::INFINITY, (t.kind(), t.device()))?;
    let zero = Tensor::f_scalar_tensor(0.0, (t.kind(), t.device()))?;
    let t = t.f_where_self(&q.probs().f_ne(0.0)?, &inf)?;
    let t = t.f_where_self(&p.probs().f_ne(0.0)?, &zero)?;
    Ok(t.f_sum_dim_intlist([-1i64].as_slice(), false, None::<tch::Kind>)?)
}
