//! [`MultiCategorical`]: a vector of class indices, entry `i` in `[0, nvec[i])`.
//!
//! `MultiCategorical::new(nvec)` has shape `[nvec.len()]` and dtype `Int64`; with a batched
//! shape the same `nvec` applies to every row (TorchRL's per-row heterogeneous `nvec` and its
//! masks are not supported). The last dim cannot be indexed, squeezed or unsqueezed.
//!
//! ```
//! use tch::Tensor;
//! use torchrl::{specs::MultiCategorical, Generator};
//! # fn main() -> torchrl::Result<()> {
//! let spec = MultiCategorical::new(vec![3, 4])?;
//! assert_eq!(spec.shape(), &[2]);
//! assert!(spec.is_in(&Tensor::from_slice(&[2i64, 3]))?);
//! assert!(!spec.is_in(&Tensor::from_slice(&[3i64, 3]))?);
//! let p = spec.project(&Tensor::from_slice(&[5i64, -1]))?;
//! assert_eq!(Vec::<i64>::try_from(&p)?, vec![2, 0]);
//! let x = spec.rand(&mut Generator::new(0), &[10])?;
//! assert!(spec.is_in(&x)?);
//! assert_eq!(spec.to_one_hot(&x)?.size(), vec![10, 7]);
//! # Ok(()) }
//! ```

use std::fmt;

use tch::{Device, Kind, Tensor};

use super::classes::{check_classes_fit, check_nvec, project_classes, to_one_hot};
use super::common::{self, lead};
use super::leaf::{leaf_spec_api, LeafSpec};
use super::unbounded::encode_plain;
use crate::error::{Error, Result, ShapeFmt};
use crate::rng::{build, Generator};
use crate::tensordict::{AsKey, BatchIndex, Elements};

/// A spec for vectors of class indices with per-entry cardinalities `nvec`.
///
/// Its dtype must hold every class of every entry exactly (as for a
/// [`Categorical`](super::Categorical)).
#[derive(Clone, PartialEq)]
pub struct MultiCategorical {
    pub(crate) nvec: Vec<i64>,
    pub(crate) shape: Vec<i64>,
    pub(crate) dtype: Kind,
    pub(crate) device: Device,
}

impl MultiCategorical {
    /// Cardinalities `nvec`: shape `[nvec.len()]`, dtype `Int64`, on the CPU.
    pub fn new(nvec: Vec<i64>) -> Result<Self> {
        check_nvec("MultiCategorical::new", &nvec)?;
        Ok(MultiCategorical {
            shape: vec![nvec.len() as i64],
            nvec,
            dtype: Kind::Int64,
            device: Device::Cpu,
        })
    }

    /// Sets the shape, whose last dim must be `nvec.len()`.
    pub fn with_shape(mut self, shape: impl AsRef<[i64]>) -> Result<Self> {
        let op = "MultiCategorical::with_shape";
        let shape = shape.as_ref();
        Self::check_last_dim(op, shape, "len(nvec)", self.nvec.len() as i64)?;
        self.shape = shape.to_vec();
        Ok(self)
    }

    /// The cardinality of each entry.
    pub fn nvec(&self) -> &[i64] {
        &self.nvec
    }

    fn nvec_tensor(&self, device: Device) -> Result<Tensor> {
        build(&self.nvec, &[self.nvec.len() as i64], Kind::Int64, device)
    }

    /// Uniform indices of shape `[*shape, *self.shape]` (size 1 at dynamic dims), entry `i` in
    /// `[0, nvec[i])`.
    pub fn rand(&self, gen: &mut Generator, shape: &[i64]) -> Result<Tensor> {
        common::check_shape("rand", shape)?;
        let full = common::sample_shape(shape, &self.shape);
        let rows = crate::rng::numel("rand", &common::sample_shape(shape, lead(&self.shape)))?;
        let total = crate::rng::numel("rand", &full)?;
        let mut data = crate::rng::alloc("rand", total)?;
        for _ in 0..rows {
            for n in &self.nvec {
                data.push(gen.below(*n as u64) as i64);
            }
        }
        build(&data, &full, self.dtype, self.device)
    }

    /// A tensor of the spec's dtype and shape holding `values` (no range check).
    pub fn encode(&self, values: &[f64]) -> Result<Tensor> {
        encode_plain(&self.shape, self.dtype, self.device, values)
    }

    /// One-hot encodes each entry and concatenates: `[..., k]` → bool `[..., sum(nvec)]`.
    pub fn to_one_hot(&self, value: &Tensor) -> Result<Tensor> {
        if value.size().last() != Some(&(self.nvec.len() as i64)) {
            return Err(Error::argument(
                "to_one_hot",
                "value",
                format!("a last dim of len(nvec)={}", self.nvec.len()),
                format!("shape {}", ShapeFmt(&value.size())),
            ));
        }
        let mut parts = Vec::with_capacity(self.nvec.len());
        for (i, n) in self.nvec.iter().enumerate() {
            let col = value.f_select(-1, i as i64)?;
            parts.push(to_one_hot(&col, *n)?);
        }
        Ok(Tensor::f_cat(&parts, -1)?)
    }
}

leaf_spec_api!(MultiCategorical; dtype, with_dtype, project, index, dynamic_shape);

impl LeafSpec for MultiCategorical {
    fn check_dtype(&self, op: &'static str, dtype: Kind) -> Result<()> {
        check_classes_fit(op, self.nvec.iter().copied().max().unwrap_or(1), dtype)
    }

    fn fmt_extra(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, ", nvec={:?}", self.nvec)
    }

    const PROTECTED_LAST: bool = true;

    fn domain_violation(&self, value: &Tensor) -> Result<Option<String>> {
        if value.elements() == 0 {
            return Ok(None);
        }
        let nv = self.nvec_tensor(value.device())?;
        // compare in float64 for floating values: promoting nvec to a narrow float (257 in
        // bfloat16 is 256) would refuse the largest class
        let value = if value.is_floating_point() {
            value.f_to_kind(Kind::Double)?
        } else {
            value.shallow_clone()
        };
        let ok = value.f_ge(0)?.f_logical_and(&value.f_lt_tensor(&nv)?)?;
        if common::all_true(&ok)? {
            return Ok(None);
        }
        let vshape = value.size();
        let (count, first) = common::first_false(&ok)?;
        let first = first.unwrap_or(0);
        let idx = common::unravel(first, &vshape);
        let col = idx.last().copied().unwrap_or(0) as usize;
        let v = value.f_reshape([-1])?.f_double_value(&[first as i64])?;
        let n = self
            .nvec
            .get(col)
            .or(self.nvec.first())
            .copied()
            .unwrap_or(0);
        Ok(Some(format!(
            "out of range: {count} of {} values outside [0, nvec[i]) for nvec={:?}; first at index \
             {idx:?} (value shape {}): {} not in [0, {n})",
            value.elements(),
            self.nvec,
            ShapeFmt(&vshape),
            common::fmt_scalar(v, self.dtype)
        )))
    }

    fn project_fitting(&self, value: &Tensor) -> Result<Tensor> {
        Ok(project_classes(value, &self.nvec)?.f_to_kind(self.dtype)?)
    }

    fn with_held(&self, shape: Vec<i64>, _held: Vec<Tensor>) -> Result<Self> {
        Ok(MultiCategorical {
            shape,
            ..self.clone()
        })
    }
}
