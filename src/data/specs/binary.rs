//! [`Binary`]: vectors of 0/1 values; unlike [`OneHot`](super::OneHot), any number of entries
//! may be 1.
//!
//! `Binary::new(n)` has shape `[n]` and dtype `Int8`. The constructor's `n` is the vector length
//! (the last dim, [`Binary::length`]), as TorchRL's constructor argument; [`Binary::n`] is 2, the
//! number of values per entry, as TorchRL's `Binary.n` attribute (a `Binary` is a `Categorical`
//! with `n = 2` there). The last dim cannot be indexed, squeezed or unsqueezed.
//!
//! ```
//! use tch::{Kind, Tensor};
//! use torchrl::{specs::Binary, Generator};
//! # fn main() -> torchrl::Result<()> {
//! let spec = Binary::new(3)?;
//! assert_eq!((spec.shape(), spec.dtype()), (&[3i64][..], Kind::Int8));
//! assert_eq!((spec.n(), spec.length()), (2, 3));
//! assert!(spec.is_in(&Tensor::from_slice(&[1i8, 1, 0]))?);
//! assert!(!spec.is_in(&Tensor::from_slice(&[0i8, 1, 2]))?);
//! let p = spec.project(&Tensor::from_slice(&[0i8, 1, 2]))?;
//! assert_eq!(Vec::<i8>::try_from(&p)?, vec![0, 1, 1]);
//! let x = spec.rand(&mut Generator::new(2), &[8])?;
//! assert!(spec.is_in(&x)?);
//! # Ok(()) }
//! ```

use tch::{Device, Kind, Tensor};

use super::classes::project_classes;
use super::common;
use super::leaf::{leaf_spec_api, LeafSpec};
use super::unbounded::encode_plain;
use crate::error::{Error, Result};
use crate::rng::Generator;
use crate::tensordict::{AsKey, BatchIndex, Elements};

/// A spec for vectors of 0/1 values (a `Bool` dtype gives `false`/`true`).
#[derive(Clone, PartialEq)]
pub struct Binary {
    pub(crate) shape: Vec<i64>,
    pub(crate) dtype: Kind,
    pub(crate) device: Device,
}

impl Binary {
    /// Vectors of length `n`: shape `[n]`, dtype `Int8`, on the CPU. Errors when `n < 0`.
    pub fn new(n: i64) -> Result<Self> {
        if n < 0 {
            return Err(Error::argument("Binary::new", "n", "n >= 0", n.to_string()));
        }
        Ok(Binary {
            shape: vec![n],
            dtype: Kind::Int8,
            device: Device::Cpu,
        })
    }

    /// Sets the shape, whose last dim must equal the current [`length`](Self::length).
    pub fn with_shape(mut self, shape: impl AsRef<[i64]>) -> Result<Self> {
        let op = "Binary::with_shape";
        let shape = shape.as_ref();
        Self::check_last_dim(op, shape, "'n'", self.length())?;
        self.shape = shape.to_vec();
        Ok(self)
    }

    /// The number of values each entry takes: always 2, as TorchRL's `Binary.n` (a `Binary` is
    /// a `Categorical` with `n = 2` there). The vector length is [`length`](Self::length).
    pub fn n(&self) -> i64 {
        2
    }

    /// The vector length (the last dim; the `n` given to [`Binary::new`]).
    #[doc(alias = "len")]
    pub fn length(&self) -> i64 {
        self.shape.last().copied().unwrap_or(0)
    }

    /// Independent fair 0/1 draws of shape `[*shape, *self.shape]` (size 1 at dynamic dims).
    pub fn rand(&self, gen: &mut Generator, shape: &[i64]) -> Result<Tensor> {
        let full = common::sample_shape(shape, &self.shape);
        gen.randint(&full, 0, 2, self.dtype, self.device)
    }

    /// A tensor of the spec's dtype and shape holding `values` (no range check).
    pub fn encode(&self, values: &[f64]) -> Result<Tensor> {
        encode_plain(&self.shape, self.dtype, self.device, values)
    }
}

leaf_spec_api!(Binary; dtype, with_dtype, project, index, dynamic_shape);

impl LeafSpec for Binary {
    const PROTECTED_LAST: bool = true;

    fn domain_violation(&self, value: &Tensor) -> Result<Option<String>> {
        if value.elements() > 0 && !common::all_binary(value)? {
            let ok = value.f_eq(0)?.f_logical_or(&value.f_eq(1)?)?;
            let (count, first) = common::first_false(&ok)?;
            let (lo, hi) = common::min_max(value)?.unwrap_or((0.0, 0.0));
            return Ok(Some(format!(
                "not binary: {count} of {} values are not 0 or 1 (value min={lo}, max={hi}); \
                 first at index {:?}",
                value.elements(),
                common::unravel(first.unwrap_or(0), &value.size())
            )));
        }
        Ok(None)
    }

    fn project_fitting(&self, value: &Tensor) -> Result<Tensor> {
        if value.kind() == Kind::Bool {
            return Ok(value.f_to_kind(self.dtype)?);
        }
        // Rounded and clamped to {0, 1}; NaN becomes 0.
        Ok(project_classes(value, &[2])?.f_to_kind(self.dtype)?)
    }

    fn with_held(&self, shape: Vec<i64>, _held: Vec<Tensor>) -> Result<Self> {
        Ok(Binary {
            shape,
            ..self.clone()
        })
    }
}
