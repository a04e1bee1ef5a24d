//! [`OneHot`]: one-hot encoded classes along the last dim, which must equal `n`.
//!
//! The default shape is `[n]` and the default dtype `Bool`. The last dim holds the categories:
//! it cannot be indexed, squeezed or unsqueezed. An optional bool mask of the spec's shape
//! restricts which classes `rand` draws and `is_in` accepts.
//!
//! ```
//! use tch::Tensor;
//! use torchrl::{specs::OneHot, Generator};
//! # fn main() -> torchrl::Result<()> {
//! let spec = OneHot::new(3)?;
//! let x = spec.encode(&[2.0])?;
//! assert_eq!(Vec::<bool>::try_from(&x)?, vec![false, false, true]);
//! assert!(spec.is_in(&x)?);
//! assert_eq!(i64::try_from(&spec.to_categorical(&x)?)?, 2);
//! assert!(!spec.is_in(&Tensor::from_slice(&[true, true, false]))?);
//! let r = spec.rand(&mut Generator::new(1), &[4])?;
//! assert_eq!(r.size(), vec![4, 3]);
//! assert!(OneHot::new(4)?.with_shape([3]).is_err(), "the last dim must be n");
//! # Ok(()) }
//! ```

use std::fmt;

use tch::{Device, Kind, Tensor};

use super::classes::{class_indices, one_hot_violation, project_one_hot};
use super::common::{self, lead, to_dev, SpecTensor};
use super::leaf::{leaf_spec_api, LeafSpec};
use crate::error::{Error, Result, ShapeFmt};
use crate::rng::{build, Generator};
use crate::tensordict::{AsKey, BatchIndex, Elements};

/// A spec for one-hot encoded classes.
#[derive(Clone, PartialEq)]
pub struct OneHot {
    pub(crate) n: i64,
    pub(crate) shape: Vec<i64>,
    pub(crate) dtype: Kind,
    pub(crate) device: Device,
    /// Allowed classes, of the spec's shape, on `device`.
    pub(crate) mask: Option<SpecTensor>,
}

impl OneHot {
    /// `n` classes, shape `[n]`, dtype `Bool`, on the CPU, no mask. Errors when `n < 1`.
    pub fn new(n: i64) -> Result<Self> {
        Self::of_classes("OneHot::new", n, vec![n], Kind::Bool)
    }

    /// Sets the shape, whose last dim must be `n` (a mask is re-expanded to it).
    pub fn with_shape(mut self, shape: impl AsRef<[i64]>) -> Result<Self> {
        let op = "OneHot::with_shape";
        let shape = shape.as_ref();
        Self::check_last_dim(op, shape, "n", self.n)?;
        self.shape = shape.to_vec();
        if let Some(m) = self.mask.take() {
            self.mask = Some(self.prepared_mask(op, &m)?);
        }
        Ok(self)
    }

    /// Random one-hot values of shape `[*shape, *self.shape]`, among the allowed classes when
    /// masked. Errors when a mask row allows no class. Dynamic dims have size 1 (TorchRL 0.14's
    /// `OneHot.rand` raises there instead; this follows its other specs).
    pub fn rand(&self, gen: &mut Generator, shape: &[i64]) -> Result<Tensor> {
        let rows = common::sample_shape(shape, lead(&self.shape));
        let idx = gen.sample_categorical(&rows, self.n, self.mask.as_deref(), self.device)?;
        Ok(idx.f_one_hot(self.n)?.f_to_kind(self.dtype)?)
    }

    /// One-hot encodes class indices: one value per row (`shape[..-1]` elements), e.g.
    /// `encode(&[2.0])` on `n = 3` gives `[false, false, true]`. Errors on values that are not
    /// class indices.
    pub fn encode(&self, values: &[f64]) -> Result<Tensor> {
        let rows = lead(&self.shape);
        let count = common::checked_numel("encode", rows)?;
        common::check_index_count(values.len(), count as usize, &self.shape)?;
        let idx = class_indices("encode", values, self.n)?;
        let t = build(&idx, rows, Kind::Int64, self.device)?;
        Ok(t.f_one_hot(self.n)?.f_to_kind(self.dtype)?)
    }

    /// Class indices (int64, the last dim removed) from one-hot values (argmax).
    pub fn to_categorical(&self, value: &Tensor) -> Result<Tensor> {
        if value.size().last() != Some(&self.n) {
            return Err(Error::argument(
                "to_categorical",
                "value",
                format!("a last dim of n={}", self.n),
                format!("shape {}", ShapeFmt(&value.size())),
            ));
        }
        Ok(value.f_to_kind(Kind::Int64)?.f_argmax(-1, false)?)
    }
}

leaf_spec_api!(OneHot; dtype, with_dtype, project, index, masked, dynamic_shape);

impl LeafSpec for OneHot {
    fn held(&self) -> Vec<&Tensor> {
        self.mask.as_deref().into_iter().collect()
    }

    fn held_name(&self) -> &'static str {
        "mask"
    }

    fn with_held(&self, shape: Vec<i64>, mut held: Vec<Tensor>) -> Result<Self> {
        Ok(OneHot {
            shape,
            mask: held.pop().map(SpecTensor),
            ..self.clone()
        })
    }

    fn fmt_extra(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let masked = if self.mask.is_some() { ", masked" } else { "" };
        write!(f, ", n={}{masked}", self.n)
    }

    const PROTECTED_LAST: bool = true;

    fn domain_violation(&self, value: &Tensor) -> Result<Option<String>> {
        if let Some(r) = one_hot_violation(value, "one-hot")? {
            return Ok(Some(r));
        }
        if let (Some(m), true) = (&self.mask, value.elements() > 0) {
            let m = to_dev(m, value.device())?.f_broadcast_to(value.size().as_slice())?;
            let hot_allowed = value
                .f_ne(0)?
                .f_logical_and(&m)?
                .f_sum_dim_intlist([-1i64].as_slice(), false, Kind::Int64)?
                .f_eq(1)?;
            if !common::all_true(&hot_allowed)? {
                let (count, first) = common::first_false(&hot_allowed)?;
                return Ok(Some(format!(
                    "masked class: {count} rows select a class the mask forbids; first at index {:?}",
                    common::unravel(first.unwrap_or(0), &hot_allowed.size())
                )));
            }
        }
        Ok(None)
    }

    fn project_fitting(&self, value: &Tensor) -> Result<Tensor> {
        project_one_hot(value, self.n, self.mask.as_deref(), self.dtype)
    }
}
