//! [`NonTensor`]: a placeholder for non-tensor data (strings, objects) in a spec tree.
//!
//! Our [`TensorDict`](crate::TensorDict) stores tensors only, so this spec is deliberately thin:
//!
//! - the default shape is `[1]` (as TorchRL) and there is no dtype unless one is set;
//! - `is_in` of a tensor checks the shape rule only (and the dtype when one is set): it cannot
//!   say anything about the data a tensor stands for;
//! - `rand`, `zero` and `one` all return a zero-filled placeholder tensor of shape
//!   `[*shape, *self.shape]` and of the spec's dtype (`Uint8` when none is set), so that a
//!   [`Composite`](super::Composite) sample keeps the key;
//! - `project` returns values that are in the spec and errors otherwise; `encode` errors.
//!
//! ```
//! use tch::{Device, Kind, Tensor};
//! use torchrl::{specs::NonTensor, Generator};
//! # fn main() -> torchrl::Result<()> {
//! let spec = NonTensor::new();
//! assert_eq!(spec.shape(), &[1]);
//! assert_eq!(spec.dtype(), None);
//! let x = spec.rand(&mut Generator::new(0), &[4])?;
//! assert_eq!((x.size(), x.kind()), (vec![4, 1], Kind::Uint8));
//! assert!(spec.is_in(&Tensor::zeros([4, 1], (Kind::Float, Device::Cpu)))?);
//! # Ok(()) }
//! ```

use tch::{Device, Kind, Tensor};

use super::common;
use super::leaf::{leaf_spec_api, not_in_spec, LeafSpec};
use crate::error::{Error, Result};
use crate::rng::Generator;
use crate::tensordict::{AsKey, BatchIndex};

/// A spec standing for non-tensor data.
#[derive(Clone, PartialEq)]
pub struct NonTensor {
    pub(crate) shape: Vec<i64>,
    pub(crate) dtype: Option<Kind>,
    pub(crate) device: Device,
}

impl Default for NonTensor {
    fn default() -> Self {
        Self::new()
    }
}

impl NonTensor {
    /// Shape `[1]`, no dtype, on the CPU.
    pub fn new() -> Self {
        NonTensor {
            shape: vec![1],
            dtype: None,
            device: Device::Cpu,
        }
    }

    /// Sets the shape (errors on a negative dim; see `with_dynamic_shape` for `-1` dims).
    pub fn with_shape(mut self, shape: impl AsRef<[i64]>) -> Result<Self> {
        common::check_shape("NonTensor::with_shape", shape.as_ref())?;
        self.shape = shape.as_ref().to_vec();
        Ok(self)
    }

    /// Sets a dtype: `is_in` then checks it, and placeholders use it.
    pub fn with_dtype(mut self, dtype: Kind) -> Result<Self> {
        common::check_kind("NonTensor::with_dtype", dtype)?;
        self.dtype = Some(dtype);
        Ok(self)
    }

    /// The dtype, if one was set.
    pub fn dtype(&self) -> Option<Kind> {
        self.dtype
    }

    /// A zero placeholder of shape `[*shape, *self.shape]` (no generator draws).
    pub fn rand(&self, _gen: &mut Generator, shape: &[i64]) -> Result<Tensor> {
        LeafSpec::zero(self, shape)
    }

    /// Returns a value that is in the spec; errors otherwise (non-tensor data cannot be
    /// projected).
    pub fn project(&self, value: &Tensor) -> Result<Tensor> {
        if LeafSpec::is_in(self, value)? {
            return Ok(value.shallow_clone());
        }
        self.project_fitting(value)
    }

    /// Always an error: a NonTensor spec has no numeric encoding.
    pub fn encode(&self, _values: &[f64]) -> Result<Tensor> {
        Err(Error::invalid(
            "encode",
            "a NonTensor spec describes non-tensor data and cannot encode numbers",
        ))
    }
}

leaf_spec_api!(NonTensor; index, dynamic_shape);

impl LeafSpec for NonTensor {
    fn project_fitting(&self, value: &Tensor) -> Result<Tensor> {
        let reason = LeafSpec::violation(self, value)?.unwrap_or_default();
        let reason = format!("cannot project onto a NonTensor spec: {reason}");
        Err(not_in_spec("project", "<value>", self, reason))
    }

    fn with_held(&self, shape: Vec<i64>, _held: Vec<Tensor>) -> Result<Self> {
        Ok(NonTensor {
            shape,
            ..self.clone()
        })
    }
}
