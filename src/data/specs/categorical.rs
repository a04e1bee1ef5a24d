//! [`Categorical`]: class indices in `[0, n)`, with an optional mask of allowed classes.
//!
//! The default shape is `[]` (no implicit trailing 1) and the default dtype `Int64`, as in
//! TorchRL. A bool mask of shape `[*shape, n]` (anything that broadcasts to it) restricts
//! sampling: masked-out classes are never drawn, and `is_in` rejects them.
//!
//! ```
//! use tch::{Kind, Tensor};
//! use torchrl::{specs::Categorical, Generator};
//! # fn main() -> torchrl::Result<()> {
//! let spec = Categorical::new(3)?;
//! assert_eq!(spec.shape(), &[] as &[i64]);
//! let p = spec.project(&Tensor::from(5i64))?;
//! assert_eq!(i64::try_from(&p)?, 2);
//! assert!(!spec.is_in(&Tensor::from(1i32))?, "int32 is not the spec's dtype");
//! let masked = Categorical::new(3)?.with_shape([100])?.with_mask(Tensor::from_slice(&[true, false, true]))?;
//! let x = masked.rand(&mut Generator::new(0), &[])?;
//! assert!(masked.is_in(&x)?);
//! assert_eq!(x.eq(1).any().int64_value(&[]), 0, "class 1 is masked out");
//! # Ok(()) }
//! ```

use std::fmt;

use tch::{Device, Kind, Tensor};

use super::classes::{
    check_classes_fit, class_violation, nearest_allowed, project_classes, to_one_hot,
};
use super::common::{self, concat, to_dev, SpecTensor};
use super::leaf::{leaf_spec_api, LeafSpec};
use super::unbounded::encode_plain;
use crate::error::{Error, Result};
use crate::rng::Generator;
use crate::tensordict::{AsKey, BatchIndex};

/// A spec for class indices in `[0, n)`.
///
/// Its dtype is any integer, bool or floating kind that holds every class `0..n` exactly: e.g.
/// at most 128 classes for `Int8`, 2 for `Bool`, 2049 for `Half`.
#[derive(Clone, PartialEq)]
pub struct Categorical {
    pub(crate) n: i64,
    pub(crate) shape: Vec<i64>,
    pub(crate) dtype: Kind,
    pub(crate) device: Device,
    /// Allowed classes, `[*shape, n]`, on `device`.
    pub(crate) mask: Option<SpecTensor>,
}

impl Categorical {
    /// `n` classes, shape `[]`, dtype `Int64`, on the CPU, no mask. Errors when `n < 1`.
    pub fn new(n: i64) -> Result<Self> {
        Self::of_classes("Categorical::new", n, vec![], Kind::Int64)
    }

    /// Sets the shape (a mask is re-expanded to `[*shape, n]`, which must work).
    pub fn with_shape(mut self, shape: impl AsRef<[i64]>) -> Result<Self> {
        let shape = shape.as_ref();
        common::check_shape("Categorical::with_shape", shape)?;
        self.shape = shape.to_vec();
        if let Some(m) = self.mask.take() {
            self.mask = Some(self.prepared_mask("Categorical::with_shape", &m)?);
        }
        Ok(self)
    }

    /// Uniform classes of shape `[*shape, *self.shape]`, among the allowed ones when masked.
    /// Errors when a mask row allows no class. Dynamic dims have size 1 (as TorchRL).
    pub fn rand(&self, gen: &mut Generator, shape: &[i64]) -> Result<Tensor> {
        let full = common::sample_shape(shape, &self.shape);
        match &self.mask {
            None => gen.randint(&full, 0, self.n, self.dtype, self.device),
            Some(m) => Ok(gen
                .sample_categorical(&full, self.n, Some(m), self.device)?
                .f_to_kind(self.dtype)?),
        }
    }

    /// A tensor of the spec's dtype and shape holding `values` (no range check, as TorchRL).
    pub fn encode(&self, values: &[f64]) -> Result<Tensor> {
        encode_plain(&self.shape, self.dtype, self.device, values)
    }

    /// One-hot encodes class indices: `[..., ]` → bool `[..., n]`. Errors on values outside
    /// `[0, n)`.
    pub fn to_one_hot(&self, value: &Tensor) -> Result<Tensor> {
        to_one_hot(value, self.n)
    }
}

leaf_spec_api!(Categorical; dtype, with_dtype, project, index, masked, dynamic_shape);

impl LeafSpec for Categorical {
    fn check_dtype(&self, op: &'static str, dtype: Kind) -> Result<()> {
        check_classes_fit(op, self.n, dtype)
    }

    fn held(&self) -> Vec<&Tensor> {
        self.mask.as_deref().into_iter().collect()
    }

    fn held_name(&self) -> &'static str {
        "mask"
    }

    fn held_shape(&self, shape: &[i64]) -> Vec<i64> {
        concat(shape, &[self.n])
    }

    fn with_held(&self, shape: Vec<i64>, mut held: Vec<Tensor>) -> Result<Self> {
        Ok(Categorical {
            shape,
            mask: held.pop().map(SpecTensor),
            ..self.clone()
        })
    }

    fn fmt_extra(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let masked = if self.mask.is_some() { ", masked" } else { "" };
        write!(f, ", n={}{masked}", self.n)
    }

    fn domain_violation(&self, value: &Tensor) -> Result<Option<String>> {
        class_violation(value, self.n, self.mask.as_deref(), self.dtype)
    }

    fn project_fitting(&self, value: &Tensor) -> Result<Tensor> {
        let v = project_classes(value, &[self.n])?;
        let mut v = v.f_to_kind(self.dtype)?;
        if let Some(m) = &self.mask {
            v = nearest_allowed(&v, self.n, &to_dev(m, v.device())?)?;
        }
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_allowed_prefers_lower_on_ties() {
        let mask = Tensor::from_slice(&[true, false, true, false]);
        let v = Tensor::from_slice(&[1i64, 3, 0]);
        let out = nearest_allowed(&v, 4, &mask).unwrap();
        assert_eq!(Vec::<i64>::try_from(&out).unwrap(), vec![0, 2, 0]);
    }

    #[test]
    fn mask_reshaped_with_shape() {
        let spec = Categorical::new(3)
            .unwrap()
            .with_mask(Tensor::from_slice(&[true, false, true]))
            .unwrap()
            .with_shape([4])
            .unwrap();
        assert_eq!(spec.mask().map(|m| m.size()), Some(vec![4, 3]));
        let sq = spec.unsqueeze(0).unwrap();
        assert_eq!(sq.mask().map(|m| m.size()), Some(vec![1, 4, 3]));
    }
}
