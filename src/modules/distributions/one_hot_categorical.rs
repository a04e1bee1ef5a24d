//! [`OneHotCategorical`]: a [`Categorical`] that reads and writes one-hot encodings
//! (TorchRL's `OneHotCategorical`, with `torch.distributions.OneHotCategorical`'s shapes).
//!
//! Parameters have shape `[*batch_shape, n]`, the event shape is `[n]`. Samples and the mode
//! are `Int64` one-hot tensors of shape `[*sample_shape, *batch_shape, n]`; `log_prob` reads
//! the class of a value with `argmax` over its last dim (as TorchRL; the value is not checked
//! to be one-hot). `entropy` is the categorical one, `mean` is `probs` (torch's
//! `OneHotCategorical`; TorchRL's subclass of `Categorical` returns NaN). Masks work as in
//! [`Categorical`].
//!
//! [`Distribution::rsample`] is TorchRL's default `ReparamGradientStrategy.PassThrough`: a
//! one-hot sample whose gradient is that of `probs` (straight-through). Unlike TorchRL's
//! `sample + probs - probs.detach()`, the value is computed as
//! `sample + (probs - probs.detach())`, so it is exactly one-hot (float, `probs`' dtype).
//! Differences from TorchRL: the mode is the one-hot of the first maximum (TorchRL marks every
//! tied maximum), and TorchRL's squeezing of a trailing dim of size 1 is not reproduced.
//!
//! ```
//! use tch::{Kind, Tensor};
//! use torchrl::modules::distributions::{Distribution, OneHotCategorical};
//! use torchrl::Generator;
//! # fn main() -> torchrl::Result<()> {
//! let logits = Tensor::from_slice(&[0.0f32, 1.0, 2.0]).set_requires_grad(true);
//! let d = OneHotCategorical::from_logits(&logits, None)?;
//! assert_eq!(d.event_shape(), &[3]);
//! assert_eq!(Vec::<i64>::try_from(&d.mode()?)?, vec![0, 0, 1]);
//! let x = d.sample(&mut Generator::new(0), &[4])?;
//! assert_eq!((x.size(), x.kind()), (vec![4, 3], Kind::Int64));
//! assert!(x.sum_dim_intlist(-1, false, Kind::Int64).eq(1).all().int64_value(&[]) == 1);
//! // straight-through: one-hot values, gradients of probs
//! let r = d.rsample(&mut Generator::new(0), &[])?;
//! assert_eq!(r.sum(Kind::Float).double_value(&[]), 1.0);
//! (r * Tensor::from_slice(&[1.0f32, 2.0, 3.0])).sum(Kind::Float).backward();
//! assert!(logits.grad().abs().sum(Kind::Float).double_value(&[]) > 0.0);
//! # Ok(()) }
//! ```

use tch::Tensor;

use super::categorical::Categorical;
use super::{check_device, value_batch_shape, Distribution};
use crate::error::Result;
use crate::rng::Generator;

/// A one-hot categorical distribution (see the [module docs](self)).
#[derive(Debug, Clone)]
pub struct OneHotCategorical {
    cat: Categorical,
    event_shape: [i64; 1],
}

impl OneHotCategorical {
    /// From unnormalised `logits` of shape `[*batch_shape, n]`, optionally masked; see
    /// [`Categorical::from_logits`].
    pub fn from_logits(logits: &Tensor, mask: Option<&Tensor>) -> Result<Self> {
        Ok(Self::wrap(Categorical::from_logits(logits, mask)?))
    }

    /// From (unnormalised) `probs` of shape `[*batch_shape, n]`, optionally masked; see
    /// [`Categorical::from_probs`].
    pub fn from_probs(probs: &Tensor, mask: Option<&Tensor>) -> Result<Self> {
        Ok(Self::wrap(Categorical::from_probs(probs, mask)?))
    }

    fn wrap(cat: Categorical) -> Self {
        let n = cat.num_classes();
        OneHotCategorical {
            cat,
            event_shape: [n],
        }
    }

    /// The underlying categorical distribution over class indices.
    pub fn categorical(&self) -> &Categorical {
        &self.cat
    }

    /// The normalised logits, `[*batch_shape, n]`.
    pub fn logits(&self) -> &Tensor {
        self.cat.logits()
    }

    /// The probabilities, `[*batch_shape, n]`.
    pub fn probs(&self) -> &Tensor {
        self.cat.probs()
    }

    /// The number of classes `n`.
    pub fn num_classes(&self) -> i64 {
        self.cat.num_classes()
    }
}

impl Distribution for OneHotCategorical {
    accessors!(any, inner: cat, event: event_shape);

    /// The log-probability of the class `argmax(value, -1)`; `value`'s last dim must be `n`
    /// and the dims before it must broadcast with the batch shape.
    fn log_prob(&self, value: &Tensor) -> Result<Tensor> {
        let op = "OneHotCategorical::log_prob";
        check_device(op, value, self.device())?;
        let out_shape =
            value_batch_shape(op, &value.size(), self.batch_shape(), &self.event_shape)?;
        let idx = value.f_argmax(-1, false)?;
        self.cat.log_prob_indices(&idx, &out_shape)
    }

    fn sample(&self, gen: &mut Generator, sample_shape: &[i64]) -> Result<Tensor> {
        let idx = self.cat.sample_indices(gen, sample_shape)?;
        Ok(idx.f_one_hot(self.num_classes())?)
    }

    fn has_rsample(&self) -> bool {
        true
    }

    /// A one-hot sample in `probs`' dtype with the straight-through gradient of `probs`.
    fn rsample(&self, gen: &mut Generator, sample_shape: &[i64]) -> Result<Tensor> {
        let probs = self.probs();
        let hard = self.sample(gen, sample_shape)?.f_to_kind(probs.kind())?;
        Ok(hard.f_add(&probs.f_sub(&probs.f_detach()?)?)?)
    }

    fn entropy(&self) -> Result<Tensor> {
        self.cat.entropy()
    }

    /// The one-hot (int64) of `argmax(probs)`.
    fn mode(&self) -> Result<Tensor> {
        Ok(self.cat.mode()?.f_one_hot(self.num_classes())?)
    }

    /// `probs`.
    fn mean(&self) -> Result<Tensor> {
        Ok(self.probs().shallow_clone())
    }
}
