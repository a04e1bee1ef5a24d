//! [`Unbounded`]: any value of the right dtype and shape.
//!
//! The default shape is `[1]` (not `[]`) and the default dtype `Float`, as in TorchRL. A floating
//! dtype makes it continuous (`rand` draws standard normals); an integer or bool dtype makes it
//! discrete (`rand` draws uniformly over `[0, max]` of the dtype, like `torch.random_()`).
//! `is_in` checks the dtype and the shape rule only, never the values.
//!
//! ```
//! use tch::Kind;
//! use torchrl::{specs::Unbounded, Generator};
//! # fn main() -> torchrl::Result<()> {
//! let spec = Unbounded::new().with_shape([3])?;
//! assert_eq!(spec.shape(), &[3]);
//! assert!(!spec.is_discrete());
//! let x = spec.rand(&mut Generator::new(0), &[2])?;
//! assert_eq!(x.size(), vec![2, 3]);
//! assert!(spec.is_in(&x)?);
//! assert!(!spec.is_in(&x.to_kind(Kind::Double))?, "dtype differs");
//! assert!(Unbounded::new().with_dtype(Kind::Int64)?.is_discrete());
//! # Ok(()) }
//! ```

use tch::{Device, Kind, Tensor};

use super::common::{self, is_float};
use super::leaf::{leaf_spec_api, LeafSpec};
use crate::error::{Error, Result, ShapeFmt};
use crate::rng::{build, Generator};
use crate::tensordict::{AsKey, BatchIndex};

/// A spec for values with no bounds beyond their dtype.
#[derive(Clone, PartialEq)]
pub struct Unbounded {
    pub(crate) shape: Vec<i64>,
    pub(crate) dtype: Kind,
    pub(crate) device: Device,
}

impl Default for Unbounded {
    fn default() -> Self {
        Self::new()
    }
}

impl Unbounded {
    /// Shape `[1]`, dtype `Float`, on the CPU.
    pub fn new() -> Self {
        Unbounded {
            shape: vec![1],
            dtype: Kind::Float,
            device: Device::Cpu,
        }
    }

    /// Sets the shape (errors on a negative dim; see `with_dynamic_shape` for `-1` dims).
    pub fn with_shape(mut self, shape: impl AsRef<[i64]>) -> Result<Self> {
        common::check_shape("Unbounded::with_shape", shape.as_ref())?;
        self.shape = shape.as_ref().to_vec();
        Ok(self)
    }

    /// True for integer and bool dtypes (`UnboundedDiscrete` in TorchRL).
    pub fn is_discrete(&self) -> bool {
        !is_float(self.dtype)
    }

    /// A random value of shape `[*shape, *self.shape]` (size 1 at dynamic dims, as TorchRL):
    /// standard normal for floats, uniform over `[0, max]` of the dtype for integers,
    /// `{false, true}` for bool.
    pub fn rand(&self, gen: &mut Generator, shape: &[i64]) -> Result<Tensor> {
        let full = common::sample_shape(shape, &self.shape);
        let (kind, device) = (self.dtype, self.device);
        match kind {
            k if is_float(k) => gen.normal(&full, 0.0, 1.0, k, device),
            Kind::Bool => gen.randint(&full, 0, 2, kind, device),
            Kind::Int64 => {
                let n = crate::rng::numel("rand", &full)?;
                let mut data: Vec<i64> = crate::rng::alloc("rand", n)?;
                data.extend((0..n).map(|_| (gen.next_u64() >> 1) as i64));
                build(&data, &full, kind, device)
            }
            _ => {
                let max = match kind {
                    Kind::Uint8 => i64::from(u8::MAX),
                    Kind::Int8 => i64::from(i8::MAX),
                    Kind::Int16 => i64::from(i16::MAX),
                    _ => i64::from(i32::MAX),
                };
                gen.randint(&full, 0, max + 1, kind, device)
            }
        }
    }

    /// A tensor of the spec's dtype and shape holding `values` (row-major; their count must be
    /// the spec's number of elements). Values are not checked.
    pub fn encode(&self, values: &[f64]) -> Result<Tensor> {
        encode_plain(&self.shape, self.dtype, self.device, values)
    }
}

leaf_spec_api!(Unbounded; dtype, with_dtype, project, index, dynamic_shape);

impl LeafSpec for Unbounded {
    fn project_fitting(&self, value: &Tensor) -> Result<Tensor> {
        Ok(value.f_to_kind(self.dtype)?)
    }

    fn with_held(&self, shape: Vec<i64>, _held: Vec<Tensor>) -> Result<Self> {
        Ok(Unbounded {
            shape,
            ..self.clone()
        })
    }
}

/// Builds `values` into a tensor of `shape` (no range check).
pub(crate) fn encode_plain(
    shape: &[i64],
    kind: Kind,
    device: Device,
    values: &[f64],
) -> Result<Tensor> {
    let n = common::checked_numel("encode", shape)?;
    if values.len() as i64 != n {
        return Err(Error::invalid(
            "encode",
            format!(
                "Shape mismatch: the value has shape [{}] which is incompatible with the spec shape {}",
                values.len(),
                ShapeFmt(shape)
            ),
        ));
    }
    build(values, shape, kind, device)
}
