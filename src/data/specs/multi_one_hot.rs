//! [`MultiOneHot`]: several one-hot groups concatenated along the last dim, group `i` of width
//! `nvec[i]`.
//!
//! `MultiOneHot::new(nvec)` has shape `[sum(nvec)]` and dtype `Bool`. Masks are not supported.
//! The last dim cannot be indexed, squeezed or unsqueezed.
//!
//! ```
//! use tch::Tensor;
//! use torchrl::{specs::MultiOneHot, Generator};
//! # fn main() -> torchrl::Result<()> {
//! let spec = MultiOneHot::new(vec![2, 3])?;
//! assert_eq!(spec.shape(), &[5]);
//! let x = spec.encode(&[1.0, 0.0])?;
//! assert_eq!(Vec::<bool>::try_from(&x)?, vec![false, true, true, false, false]);
//! assert!(spec.is_in(&x)?);
//! assert!(!spec.is_in(&Tensor::from_slice(&[true, true, false, true, false]))?);
//! assert_eq!(Vec::<i64>::try_from(&spec.to_categorical(&x)?)?, vec![1, 0]);
//! let r = spec.rand(&mut Generator::new(0), &[3])?;
//! assert!(spec.is_in(&r)?);
//! # Ok(()) }
//! ```

use std::fmt;

use tch::{Device, Kind, Tensor};

use super::classes::{check_nvec, class_indices, one_hot_violation, project_one_hot};
use super::common::{self, lead};
use super::leaf::{leaf_spec_api, not_in_spec, LeafSpec};
use crate::error::{Error, Result, ShapeFmt};
use crate::rng::{build, Generator};
use crate::tensordict::{AsKey, BatchIndex};

/// A spec for concatenated one-hot groups.
#[derive(Clone, PartialEq)]
pub struct MultiOneHot {
    pub(crate) nvec: Vec<i64>,
    pub(crate) shape: Vec<i64>,
    pub(crate) dtype: Kind,
    pub(crate) device: Device,
}

impl MultiOneHot {
    /// Groups of widths `nvec`: shape `[sum(nvec)]`, dtype `Bool`, on the CPU.
    pub fn new(nvec: Vec<i64>) -> Result<Self> {
        let op = "MultiOneHot::new";
        check_nvec(op, &nvec)?;
        let total = nvec
            .iter()
            .try_fold(0i64, |acc, n| acc.checked_add(*n))
            .ok_or_else(|| {
                Error::argument(
                    op,
                    "nvec",
                    "class counts whose sum fits in i64",
                    format!("nvec={nvec:?}, whose sum(nvec) overflows i64"),
                )
            })?;
        Ok(MultiOneHot {
            shape: vec![total],
            nvec,
            dtype: Kind::Bool,
            device: Device::Cpu,
        })
    }

    fn total(&self) -> i64 {
        self.nvec.iter().sum()
    }

    /// Sets the shape, whose last dim must be `sum(nvec)`.
    pub fn with_shape(mut self, shape: impl AsRef<[i64]>) -> Result<Self> {
        let op = "MultiOneHot::with_shape";
        let shape = shape.as_ref();
        Self::check_last_dim(op, shape, "sum(nvec)", self.total())?;
        self.shape = shape.to_vec();
        Ok(self)
    }

    /// The width of each group.
    pub fn nvec(&self) -> &[i64] {
        &self.nvec
    }

    /// Random values of shape `[*shape, *self.shape]`: one uniform hot entry per group. Dynamic
    /// dims have size 1 (TorchRL 0.14's `MultiOneHot.rand` raises there instead).
    pub fn rand(&self, gen: &mut Generator, shape: &[i64]) -> Result<Tensor> {
        common::check_shape("rand", shape)?;
        let full = common::sample_shape(shape, &self.shape);
        let total = self.total() as usize;
        let n = crate::rng::numel("rand", &full)?;
        let mut data = crate::rng::alloc("rand", n)?;
        data.resize(n, false);
        for row in data.chunks_mut(total.max(1)) {
            let mut offset = 0usize;
            for n in &self.nvec {
                let k = gen.below(*n as u64) as usize;
                if let Some(slot) = row.get_mut(offset + k) {
                    *slot = true;
                }
                offset += *n as usize;
            }
        }
        build(&data, &full, self.dtype, self.device)
    }

    fn split(&self, value: &Tensor) -> Result<Vec<Tensor>> {
        Ok(value.f_split_with_sizes(self.nvec.as_slice(), -1)?)
    }

    /// One-hot encodes class indices, `len(nvec)` per row (row-major), e.g. `nvec = [2, 3]` and
    /// `encode(&[1.0, 0.0])` gives `[F, T, T, F, F]`.
    pub fn encode(&self, values: &[f64]) -> Result<Tensor> {
        let rows = lead(&self.shape);
        let k = self.nvec.len();
        let count = (common::checked_numel("encode", rows)? as usize)
            .checked_mul(k)
            .ok_or_else(|| Error::invalid("encode", "too many class indices"))?;
        common::check_index_count(values.len(), count, &self.shape)?;
        let total = self.total() as usize;
        let n = (count / k.max(1))
            .checked_mul(total)
            .ok_or_else(|| Error::invalid("encode", "the encoded values have too many elements"))?;
        let mut data = crate::rng::alloc("encode", n)?;
        data.resize(n, false);
        for (r, chunk) in values.chunks(k.max(1)).enumerate() {
            let mut offset = 0usize;
            for (v, n) in chunk.iter().zip(&self.nvec) {
                let c = class_indices("encode", &[*v], *n)?;
                if let Some(s) = c
                    .first()
                    .and_then(|c| data.get_mut(r * total + offset + *c as usize))
                {
                    *s = true;
                }
                offset += *n as usize;
            }
        }
        build(&data, &self.shape, self.dtype, self.device)
    }

    /// Class indices per group (int64 `[..., len(nvec)]`) from the concatenated one-hot values.
    pub fn to_categorical(&self, value: &Tensor) -> Result<Tensor> {
        if value.size().last() != Some(&self.total()) {
            return Err(Error::argument(
                "to_categorical",
                "value",
                format!("a last dim of sum(nvec)={}", self.total()),
                format!("shape {}", ShapeFmt(&value.size())),
            ));
        }
        let mut parts = Vec::with_capacity(self.nvec.len());
        for part in self.split(value)? {
            parts.push(part.f_to_kind(Kind::Int64)?.f_argmax(-1, false)?);
        }
        Ok(Tensor::f_stack(&parts, -1)?)
    }
}

leaf_spec_api!(MultiOneHot; dtype, with_dtype, project, index, dynamic_shape);

impl LeafSpec for MultiOneHot {
    fn fmt_extra(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, ", nvec={:?}", self.nvec)
    }

    const PROTECTED_LAST: bool = true;

    fn domain_violation(&self, value: &Tensor) -> Result<Option<String>> {
        if value.size().last() != Some(&self.total()) {
            return Ok(Some(format!(
                "shape mismatch: the value's last dim must be sum(nvec)={}, got shape {}",
                self.total(),
                ShapeFmt(&value.size())
            )));
        }
        for (i, part) in self.split(value)?.iter().enumerate() {
            if let Some(r) = one_hot_violation(part, &format!("one-hot in group {i}"))? {
                return Ok(Some(r));
            }
        }
        Ok(None)
    }

    fn project_fitting(&self, value: &Tensor) -> Result<Tensor> {
        if value.size().last() != Some(&self.total()) {
            let reason = format!(
                "cannot project a value of shape {}: projection does not reshape",
                ShapeFmt(&value.size())
            );
            return Err(not_in_spec("project", "<value>", self, reason));
        }
        let mut parts = Vec::with_capacity(self.nvec.len());
        for (part, n) in self.split(value)?.iter().zip(&self.nvec) {
            parts.push(project_one_hot(part, *n, None, self.dtype)?);
        }
        Ok(Tensor::f_cat(&parts, -1)?)
    }

    fn with_held(&self, shape: Vec<i64>, _held: Vec<Tensor>) -> Result<Self> {
        Ok(MultiOneHot {
            shape,
            ..self.clone()
        })
    }
}
