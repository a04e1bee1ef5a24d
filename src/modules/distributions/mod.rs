//! Probability distributions for policies, with the values of `torch.distributions` and
//! TorchRL: [`Normal`], [`TanhNormal`], [`Categorical`] (optionally masked),
//! [`OneHotCategorical`] and [`Delta`], all behind the [`Distribution`] trait.
//!
//! - **Shapes** follow torch: a sample has shape `[*sample_shape, *batch_shape, *event_shape]`
//!   and `log_prob(value)` has shape `broadcast(value_batch, batch_shape)`, where the value's
//!   last dims must equal `event_shape` exactly and the dims before them broadcast with
//!   `batch_shape` (torch's `validate_args` rule).
//! - **Seeding**: sampling draws its noise from a [`Generator`] (on the CPU, in row-major
//!   order) and moves it to the parameters' device, so that the same seed gives the same
//!   samples, independently of libtorch's global RNG. Everything else runs on the parameters'
//!   device.
//! - **Autograd**: `log_prob`, `rsample`, `entropy`, `mean` and `mode` are differentiable
//!   w.r.t. the parameters (where the result is a float tensor); `sample` never carries a
//!   gradient. Distributions hold shallow clones of the parameter tensors, so gradients reach
//!   the tensors you passed in.
//! - **Validation**: constructors check dtypes, broadcastability and values that can be checked
//!   with one reduction (`scale > 0`, `probs >= 0`, a masked row keeps a class, `high > low`),
//!   and return a [`crate::Error`] that names the argument and its shape. Such checks read a
//!   few booleans back from the device.
//! - **KL divergence**: [`kl_divergence`] gives `KL(p ‖ q)` in closed form for the pairs torch
//!   registers (Normal, TanhNormal with equal bounds, Categorical, OneHotCategorical), and
//!   `None` otherwise (see [`kl`]).
//!
//! ```
//! use tch::{Kind, Tensor};
//! use torchrl::modules::distributions::{Categorical, Distribution, Normal, TanhNormal};
//! use torchrl::Generator;
//! # fn main() -> torchrl::Result<()> {
//! let mut rng = Generator::new(0);
//! // a diagonal Gaussian policy head over 2 action dims, for a batch of 4
//! let loc = Tensor::zeros([4, 2], (Kind::Float, tch::Device::Cpu)).set_requires_grad(true);
//! let scale = Tensor::ones([4, 2], (Kind::Float, tch::Device::Cpu));
//! let dist = TanhNormal::from_scalar_bounds(&loc, &scale, -2.0, 2.0)?;
//! assert_eq!((dist.batch_shape(), dist.event_shape()), (&[4i64][..], &[2i64][..]));
//! let (action, log_prob) = dist.rsample_and_log_prob(&mut rng, &[])?;
//! assert_eq!(log_prob.size(), vec![4]);
//! assert!(action.abs().max().double_value(&[]) < 2.0);
//! log_prob.sum(Kind::Float).backward();
//! assert!(loc.grad().defined());
//!
//! // a masked discrete policy: class 1 can never be drawn
//! let logits = Tensor::from_slice(&[0.0f32, 5.0, 0.0]);
//! let mask = Tensor::from_slice(&[true, false, true]);
//! let cat = Categorical::from_logits(&logits, Some(&mask))?;
//! let draws = cat.sample(&mut rng, &[100])?;
//! assert_eq!(draws.eq(1).sum(Kind::Int64).int64_value(&[]), 0);
//! # let _ = Normal::new(&loc, &scale)?;
//! # Ok(()) }
//! ```

// Public so that each distribution's module docs (definitions, numerics, deviations from
// TorchRL) are rendered; the types are re-exported here.
/// The accessors every built-in distribution writes the same way, inside its
/// `impl Distribution`: `kind` and `device` from one parameter tensor, `as_any` (with `any`),
/// and (other arms)
/// `batch_shape` / `event_shape` from fields, or delegated to an inner distribution.
macro_rules! accessors {
    (any, $($rest:tt)*) => {
        fn as_any(&self) -> Option<&dyn std::any::Any> {
            Some(self)
        }

        accessors!($($rest)*);
    };
    (param: $p:ident) => {
        fn kind(&self) -> tch::Kind {
            self.$p.kind()
        }

        fn device(&self) -> tch::Device {
            self.$p.device()
        }
    };
    (param: $p:ident, batch: $b:ident, event: []) => {
        fn batch_shape(&self) -> &[i64] {
            &self.$b
        }

        fn event_shape(&self) -> &[i64] {
            &[]
        }

        accessors!(param: $p);
    };
    (param: $p:ident, batch: $b:ident, event: $e:ident) => {
        fn batch_shape(&self) -> &[i64] {
            &self.$b
        }

        fn event_shape(&self) -> &[i64] {
            &self.$e
        }

        accessors!(param: $p);
    };
    (inner: $c:ident, event: $e:ident) => {
        fn batch_shape(&self) -> &[i64] {
            self.$c.batch_shape()
        }

        fn event_shape(&self) -> &[i64] {
            &self.$e
        }

        accessors!(param: $c);
    };
}

pub mod categorical;
pub mod delta;
pub mod kl;
pub mod normal;
pub mod one_hot_categorical;
pub mod tanh_normal;

pub use categorical::Categorical;
pub use delta::Delta;
pub use kl::kl_divergence;
pub use normal::Normal;
pub use one_hot_categorical::OneHotCategorical;
pub use tanh_normal::{TanhBounds, TanhNormal};

use tch::{Device, Kind, Tensor};

use crate::error::{Error, Result, ShapeFmt};
use crate::rng::Generator;

/// A probability distribution over tensors, TorchRL's `torch.distributions.Distribution` API
/// in Rust.
///
/// The trait is object safe: a policy can hold a `Box<dyn Distribution>`.
pub trait Distribution {
    /// The batch shape: the shape over which parameters vary independently.
    fn batch_shape(&self) -> &[i64];

    /// The event shape: the shape of one draw (`[]` for scalar events, `[n]` for a one-hot
    /// draw or a `TanhNormal` over `n` action dims).
    fn event_shape(&self) -> &[i64];

    /// The dtype of the parameters (float). Samples of discrete distributions are `Int64`.
    fn kind(&self) -> Kind;

    /// The device of the parameters: every result lives there.
    fn device(&self) -> Device;

    /// `[*sample_shape, *batch_shape, *event_shape]`, the shape of a sample.
    fn extended_shape(&self, sample_shape: &[i64]) -> Vec<i64> {
        let mut s = sample_shape.to_vec();
        s.extend_from_slice(self.batch_shape());
        s.extend_from_slice(self.event_shape());
        s
    }

    /// The log-probability (log-density for continuous distributions) of `value`, of shape
    /// `broadcast(value_batch_dims, batch_shape)`; differentiable w.r.t. the parameters.
    fn log_prob(&self, value: &Tensor) -> Result<Tensor>;

    /// Draws samples of shape [`Distribution::extended_shape`] without gradient, with noise
    /// from `gen`.
    fn sample(&self, gen: &mut Generator, sample_shape: &[i64]) -> Result<Tensor>;

    /// A reparameterised sample and its log-probability (TorchRL's `rsample_and_log_prob`).
    /// Defaults to `log_prob(rsample())`; a distribution that can score its sample exactly
    /// (a [`TanhNormal`] at its pre-tanh value) overrides it.
    fn rsample_and_log_prob(
        &self,
        gen: &mut Generator,
        sample_shape: &[i64],
    ) -> Result<(Tensor, Tensor)> {
        let a = self.rsample(gen, sample_shape)?;
        let lp = self.log_prob(&a)?;
        Ok((a, lp))
    }

    /// Whether [`Distribution::rsample`] is supported.
    fn has_rsample(&self) -> bool;

    /// Draws reparameterised samples (differentiable w.r.t. the parameters), or an error for
    /// distributions that have no reparameterisation.
    fn rsample(&self, gen: &mut Generator, sample_shape: &[i64]) -> Result<Tensor>;

    /// The entropy, of shape `batch_shape` (closed form), or an error when there is none.
    fn entropy(&self) -> Result<Tensor>;

    /// The mode, of shape `[*batch_shape, *event_shape]` (see each distribution for its
    /// definition when the mode has no closed form).
    fn mode(&self) -> Result<Tensor>;

    /// The mean, of shape `[*batch_shape, *event_shape]`, or an error when it has no closed
    /// form or no meaning.
    fn mean(&self) -> Result<Tensor>;

    /// TorchRL's `deterministic_sample`: the action a deterministic policy takes. Defaults to
    /// [`Distribution::mode`].
    fn deterministic_sample(&self) -> Result<Tensor> {
        self.mode()
    }

    /// The distribution as [`Any`](std::any::Any), so that [`kl_divergence`] can find the
    /// closed form of a pair of built-in distributions. Defaults to `None` (no closed-form
    /// KL: callers fall back to a Monte-Carlo estimate).
    fn as_any(&self) -> Option<&dyn std::any::Any> {
        None
    }
}

// ------------------------------------------------------------------ shared helpers

/// `0.5 * ln(2π)`.
pub(crate) const LN_SQRT_2PI: f64 = 0.918_938_533_204_672_8;

pub(crate) use crate::kind::is_float;

/// True for the integer kinds (bool excluded).
pub(crate) fn is_integer(kind: Kind) -> bool {
    matches!(
        kind,
        Kind::Uint8 | Kind::Int8 | Kind::Int16 | Kind::Int | Kind::Int64
    )
}

/// `torch.finfo(kind).resolution`: the eps of TorchRL's safe tanh / atanh clamps.
pub(crate) fn resolution(kind: Kind) -> f64 {
    match kind {
        Kind::Half => 1e-3,
        Kind::BFloat16 => 1e-2,
        Kind::Double => 1e-15,
        _ => 1e-6,
    }
}

/// `torch.finfo(kind).eps`: the clamp of `probs_to_logits`.
pub(crate) fn finfo_eps(kind: Kind) -> f64 {
    match kind {
        Kind::Half => 0.000_976_562_5,
        Kind::BFloat16 => 0.007_812_5,
        Kind::Double => f64::EPSILON,
        _ => f64::from(f32::EPSILON),
    }
}

/// `torch.finfo(kind).min`: the clamp of the categorical entropy.
pub(crate) fn finfo_min(kind: Kind) -> f64 {
    match kind {
        Kind::Half => -65504.0,
        Kind::BFloat16 => -3.389_531_389_251_535_5e38,
        Kind::Double => f64::MIN,
        _ => f64::from(f32::MIN),
    }
}

/// Checks that `t` has a floating dtype.
pub(crate) fn check_float(op: &'static str, name: &str, t: &Tensor) -> Result<()> {
    let kind = t.kind();
    if is_float(kind) {
        Ok(())
    } else {
        Err(Error::argument(
            op,
            name,
            "a floating dtype",
            format!("{kind:?} ({name} of shape {})", ShapeFmt(&t.size())),
        ))
    }
}

/// Moves `t` to `device` (no-op when it is there already; autograd flows through the copy).
pub(crate) fn to_device(t: &Tensor, device: Device) -> Result<Tensor> {
    if t.device() == device {
        Ok(t.shallow_clone())
    } else {
        Ok(t.f_to_device(device)?)
    }
}

/// Checks that `value` lives on `device`.
pub(crate) fn check_device(op: &'static str, value: &Tensor, device: Device) -> Result<()> {
    if value.device() == device {
        Ok(())
    } else {
        Err(Error::DeviceMismatch {
            op,
            key: "value".into(),
            expected: device,
            actual: value.device(),
        })
    }
}

/// A float version of `value` for continuous distributions: float values are used as they
/// are, integer and bool values are cast to `kind`.
pub(crate) fn float_value(
    op: &'static str,
    value: &Tensor,
    kind: Kind,
    device: Device,
) -> Result<Tensor> {
    check_device(op, value, device)?;
    if is_float(value.kind()) {
        Ok(value.shallow_clone())
    } else {
        Ok(value.f_to_kind(kind)?)
    }
}

/// The broadcast of the named shapes (numpy rules), or an error naming every argument.
pub(crate) fn broadcast_shapes(op: &'static str, shapes: &[(&str, &[i64])]) -> Result<Vec<i64>> {
    let nd = shapes.iter().map(|(_, s)| s.len()).max().unwrap_or(0);
    let mut out = vec![1i64; nd];
    for (_, s) in shapes {
        let off = nd - s.len();
        for (o, d) in out.iter_mut().skip(off).zip(s.iter()) {
            if *o == 1 {
                *o = *d;
            } else if *d != 1 && *d != *o {
                let list: Vec<String> = shapes
                    .iter()
                    .map(|(n, s)| format!("{n} of shape {}", ShapeFmt(s)))
                    .collect();
                let names: Vec<&str> = shapes.iter().map(|(n, _)| *n).collect();
                return Err(Error::InvalidValue {
                    op,
                    what: "arguments",
                    key: names.join(", "),
                    expected: "shapes that broadcast together".to_string(),
                    got: format!("shapes that do not broadcast: {}", list.join(", ")),
                });
            }
        }
    }
    Ok(out)
}

/// The shape of `log_prob(value)`: the value's last dims must equal `event` exactly and the
/// dims before them must broadcast with `batch` (torch's `_validate_sample`).
pub(crate) fn value_batch_shape(
    op: &'static str,
    value_shape: &[i64],
    batch: &[i64],
    event: &[i64],
) -> Result<Vec<i64>> {
    let mismatch = || {
        Error::argument(
            op,
            "value",
            format!(
                "a value that matches batch_shape {} + event_shape {}: its last dims must equal \
                 the event shape and the dims before them must broadcast with the batch shape",
                ShapeFmt(batch),
                ShapeFmt(event)
            ),
            format!("value of shape {}", ShapeFmt(value_shape)),
        )
    };
    let split = value_shape
        .len()
        .checked_sub(event.len())
        .ok_or_else(mismatch)?;
    let (vb, ve) = (
        value_shape.get(..split).ok_or_else(mismatch)?,
        value_shape.get(split..).ok_or_else(mismatch)?,
    );
    if ve != event {
        return Err(mismatch());
    }
    broadcast_shapes(op, &[("value", vb), ("batch_shape", batch)]).map_err(|_| mismatch())
}

/// Sums the last `n` dims of `t` (`_sum_rightmost`).
pub(crate) fn sum_rightmost(t: &Tensor, n: usize) -> Result<Tensor> {
    if n == 0 {
        return Ok(t.shallow_clone());
    }
    let dims: Vec<i64> = (1..=n as i64).map(|i| -i).collect();
    Ok(t.f_sum_dim_intlist(dims.as_slice(), false, None::<Kind>)?)
}

/// `[*a, *b]`.
pub(crate) fn cat_shape(a: &[i64], b: &[i64]) -> Vec<i64> {
    let mut s = a.to_vec();
    s.extend_from_slice(b);
    s
}

/// Checks a sample shape (no negative dims).
pub(crate) fn check_sample_shape(op: &'static str, sample_shape: &[i64]) -> Result<()> {
    if sample_shape.iter().any(|d| *d < 0) {
        return Err(Error::argument(
            op,
            "sample_shape",
            "no negative dimension",
            format!(
                "sample_shape {}, which has a negative dimension",
                ShapeFmt(sample_shape)
            ),
        ));
    }
    Ok(())
}

/// Reads 0-d bool tensors back in one transfer.
pub(crate) fn read_flags(flags: &[Tensor]) -> Result<Vec<bool>> {
    if flags.is_empty() {
        return Ok(Vec::new());
    }
    let stacked = Tensor::f_stack(flags, 0)?;
    crate::rng::read::<bool>(&stacked)
}

/// The flat index of the first `true` of a bool tensor, if any (error paths only: one sync).
pub(crate) fn first_true(t: &Tensor) -> Result<Option<i64>> {
    let flat = crate::rng::read::<bool>(t)?;
    Ok(flat.iter().position(|b| *b).map(|i| i as i64))
}

/// `f(a)` in value, with `a`'s gradient (a straight-through estimator), so that the safety
/// clamps of [`TanhNormal`] never cut the gradient (TorchRL's safe tanh/atanh backward).
/// Without a gradient to keep, just `f(a)`.
pub(crate) fn straight_through(
    a: &Tensor,
    f: impl FnOnce(&Tensor) -> Result<Tensor>,
) -> Result<Tensor> {
    if !a.requires_grad() {
        return f(a);
    }
    let value = {
        let _guard = tch::no_grad_guard();
        f(a)?
    };
    // value + (a - a.detach()): the second term is exactly 0 in value and has a's gradient.
    Ok(value.f_add(&a.f_sub(&a.f_detach()?)?)?)
}

/// Checks the number of Monte-Carlo samples.
pub(crate) fn check_num_samples(op: &'static str, n: i64) -> Result<()> {
    if n < 1 {
        return Err(Error::argument(op, "num_samples", ">= 1", n.to_string()));
    }
    Ok(())
}

/// The error of `rsample` for distributions without a reparameterisation.
pub(crate) fn no_rsample(op: &'static str, what: &str) -> Error {
    Error::invalid(
        op,
        format!("{what} has no reparameterised sampler (rsample); use sample and score-function (log_prob) gradients"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcast_rules() {
        let op = "t";
        assert_eq!(
            broadcast_shapes(op, &[("a", &[2, 1]), ("b", &[3])]).unwrap(),
            vec![2, 3]
        );
        assert_eq!(
            broadcast_shapes(op, &[("a", &[]), ("b", &[])]).unwrap(),
            Vec::<i64>::new()
        );
        assert_eq!(
            broadcast_shapes(op, &[("a", &[0]), ("b", &[1])]).unwrap(),
            vec![0]
        );
        let e = broadcast_shapes(op, &[("loc", &[3]), ("scale", &[4])]).unwrap_err();
        assert!(e.to_string().contains("loc of shape [3]"), "{e}");
        assert!(e.to_string().contains("scale of shape [4]"), "{e}");
    }

    #[test]
    fn value_shapes() {
        let op = "t";
        assert_eq!(
            value_batch_shape(op, &[5, 3, 2], &[3], &[2]).unwrap(),
            vec![5, 3]
        );
        assert_eq!(value_batch_shape(op, &[2], &[3], &[2]).unwrap(), vec![3]);
        assert!(value_batch_shape(op, &[3, 3], &[3], &[2]).is_err());
        assert!(value_batch_shape(op, &[], &[3], &[2]).is_err());
        assert!(value_batch_shape(op, &[4, 2], &[3], &[2]).is_err());
        assert_eq!(
            value_batch_shape(op, &[], &[], &[]).unwrap(),
            Vec::<i64>::new()
        );
    }

    #[test]
    fn straight_through_keeps_value_and_gradient() {
        let a = Tensor::from_slice(&[0.5f32, 2.0]).set_requires_grad(true);
        let y = straight_through(&a, |t| Ok(t.f_clamp(-1.0, 1.0)?)).unwrap();
        assert_eq!(Vec::<f32>::try_from(&y).unwrap(), vec![0.5, 1.0]);
        y.sum(Kind::Float).backward();
        assert_eq!(Vec::<f32>::try_from(&a.grad()).unwrap(), vec![1.0, 1.0]);
    }
}
