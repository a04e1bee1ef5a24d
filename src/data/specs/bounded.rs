//! [`Bounded`]: values in a box `[low, high]` (inclusive), with elementwise bounds.
//!
//! `low` and `high` are stored broadcast to the spec's full shape, in the spec's dtype and on its
//! device. A floating dtype makes the spec continuous (`rand` is uniform in `[low, high)`); an
//! integer dtype makes it discrete (`rand` is uniform over the integers of `[low, high]`).
//! `project` clamps.
//!
//! ```
//! use tch::Tensor;
//! use torchrl::{specs::Bounded, Generator};
//! # fn main() -> torchrl::Result<()> {
//! let spec = Bounded::new(-1.0, 1.0, [2])?;
//! assert_eq!(spec.to_string(), "Bounded(shape=[2], dtype=Float, low=-1, high=1)");
//! let p = spec.project(&Tensor::from_slice(&[-3.0f32, 2.0]))?;
//! assert_eq!(Vec::<f32>::try_from(&p)?, vec![-1.0, 1.0]);
//! let x = spec.rand(&mut Generator::new(0), &[5])?;
//! assert!(spec.is_in(&x)?);
//! // bounds can differ per element; the shape is inferred from them
//! let spec = Bounded::from_tensors(Tensor::from_slice(&[0.0f32, -1.0]), Tensor::from_slice(&[1.0f32, 2.0]))?;
//! assert_eq!(spec.shape(), &[2]);
//! # Ok(()) }
//! ```

use std::fmt;

use tch::{Device, Kind, Tensor};

use super::common::{self, is_float, to_dev, SpecTensor};
use super::leaf::{leaf_spec_api, LeafSpec};
use super::unbounded::encode_plain;
use crate::error::{ensure_kind, Error, Result, ShapeFmt};
use crate::rng::Generator;
use crate::tensordict::{fits_kind, full_f64, AsKey, BatchIndex, Elements};

/// A spec for values within elementwise bounds `low <= x <= high`.
#[derive(Clone)]
pub struct Bounded {
    pub(crate) low: SpecTensor,
    pub(crate) high: SpecTensor,
    pub(crate) shape: Vec<i64>,
    pub(crate) dtype: Kind,
    pub(crate) device: Device,
    /// `Some((low, high))` when the bounds are the same scalars everywhere (the common case for
    /// action specs): `rand` then samples without reading the bound tensors back.
    pub(crate) constant: Option<(f64, f64)>,
}

impl PartialEq for Bounded {
    fn eq(&self, other: &Self) -> bool {
        self.shape == other.shape
            && self.dtype == other.dtype
            && self.device == other.device
            && self.low == other.low
            && self.high == other.high
    }
}

/// Broadcasts two shapes (numpy rules), or `None`.
fn broadcast(a: &[i64], b: &[i64]) -> Option<Vec<i64>> {
    // Aligned from the last dim; a missing leading dim counts as 1.
    let n = a.len().max(b.len());
    let (mut xs, mut ys) = (a.iter().rev(), b.iter().rev());
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let x = xs.next().copied().unwrap_or(1);
        let y = ys.next().copied().unwrap_or(1);
        out.push(match (x, y) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => return None,
        });
    }
    out.reverse();
    Some(out)
}

impl Bounded {
    /// Scalar bounds broadcast to an explicit `shape`, dtype `Float`, on the CPU.
    ///
    /// Errors when `low > high`, a bound is NaN, or the shape has a negative dim (see
    /// `with_dynamic_shape` for `-1` dims).
    pub fn new(low: f64, high: f64, shape: impl AsRef<[i64]>) -> Result<Self> {
        let op = "Bounded::new";
        let shape = shape.as_ref();
        common::check_shape(op, shape)?;
        let held = shape;
        if low.is_nan() || high.is_nan() || low > high {
            return Err(Error::argument(
                op,
                "low, high",
                "low <= high (neither NaN)",
                format!("low={low}, high={high}"),
            ));
        }
        // Bounds beyond float32's range round to ±inf (as a cast does; libtorch's `full`
        // refuses them).
        Ok(Bounded {
            low: SpecTensor(full_f64(op, held, low, Kind::Float, Device::Cpu)?),
            high: SpecTensor(full_f64(op, held, high, Kind::Float, Device::Cpu)?),
            shape: shape.to_vec(),
            dtype: Kind::Float,
            device: Device::Cpu,
            constant: Some((low, high)),
        })
    }

    /// Elementwise bounds; the shape is the broadcast of their shapes, the dtype theirs (they
    /// must share it) and the device `low`'s.
    ///
    /// Errors when the shapes do not broadcast, the dtypes differ, or `low > high` (or NaN)
    /// anywhere, naming the first offending position.
    pub fn from_tensors(low: Tensor, high: Tensor) -> Result<Self> {
        let op = "Bounded::from_tensors";
        common::check_kind(op, low.kind())?;
        ensure_kind(op, "<high>", low.kind(), high.kind())?;
        let shape = broadcast(&low.size(), &high.size()).ok_or_else(|| {
            Error::argument(
                op,
                "low, high",
                "bounds whose shapes broadcast",
                format!(
                    "low of shape {} and high of shape {}",
                    ShapeFmt(&low.size()),
                    ShapeFmt(&high.size())
                ),
            )
        })?;
        let device = low.device();
        let low = low.f_broadcast_to(shape.as_slice())?.f_contiguous()?;
        let high = to_dev(&high, device)?
            .f_broadcast_to(shape.as_slice())?
            .f_contiguous()?;
        check_ordered(op, &low, &high, &shape)?;
        Ok(Bounded {
            dtype: low.kind(),
            low: SpecTensor(low),
            high: SpecTensor(high),
            shape,
            device,
            constant: None,
        })
    }

    /// Casts the bounds to `dtype` (float bounds are truncated for integer dtypes).
    ///
    /// Errors for an integer or bool dtype when a bound is not finite or does not fit the dtype
    /// (a cast would wrap it, e.g. `-1` to `255` for `Uint8`, leaving `low > high`).
    pub fn with_dtype(mut self, dtype: Kind) -> Result<Self> {
        let op = "Bounded::with_dtype";
        common::check_kind(op, dtype)?;
        if !is_float(dtype) && self.low.elements() > 0 {
            let (lo, _) = common::min_max(&self.low)?.unwrap_or((0.0, 0.0));
            let (_, hi) = common::min_max(&self.high)?.unwrap_or((0.0, 0.0));
            for (name, v) in [("low", lo), ("high", hi)] {
                if !fits_kind(v, dtype) || (dtype == Kind::Bool && !(0.0..2.0).contains(&v)) {
                    return Err(Error::argument(
                        op,
                        "dtype",
                        format!("a dtype that fits the bounds of {self}"),
                        format!(
                            "{dtype:?}: {name}={} does not fit the dtype (cannot cast the bounds)",
                            common::fmt_scalar(v, self.dtype)
                        ),
                    ));
                }
            }
        }
        self.low = SpecTensor(self.low.f_to_kind(dtype)?);
        self.high = SpecTensor(self.high.f_to_kind(dtype)?);
        if is_float(dtype) && dtype != self.dtype && self.constant.is_some() {
            // Sample between the bounds as this dtype stores them (a float32 0.3 is not the
            // float64 0.3; samples between the two would fall outside the cast bounds).
            let first =
                |t: &Tensor| -> Result<f64> { Ok(t.f_reshape([-1])?.f_double_value(&[0])?) };
            if self.low.elements() > 0 {
                self.constant = Some((first(&self.low)?, first(&self.high)?));
            }
        }
        self.dtype = dtype;
        if !is_float(dtype) {
            self.constant = None;
        }
        Ok(self)
    }

    /// The lower bounds, of the spec's full shape (size 1 at dynamic dims).
    pub fn low(&self) -> &Tensor {
        &self.low
    }

    /// The upper bounds, of the spec's full shape (size 1 at dynamic dims).
    pub fn high(&self) -> &Tensor {
        &self.high
    }

    /// True for integer and bool dtypes (`BoundedDiscrete` in TorchRL).
    pub fn is_discrete(&self) -> bool {
        !is_float(self.dtype)
    }

    /// Uniform samples of shape `[*shape, *self.shape]`: in `[low, high)` for floats, over the
    /// integers of `[low, high]` for integer dtypes. Errors on infinite float bounds. Dynamic
    /// dims have size 1 (as TorchRL; see `resolve_shape` to draw at another length).
    pub fn rand(&self, gen: &mut Generator, shape: &[i64]) -> Result<Tensor> {
        common::check_shape("rand", shape)?;
        let full = common::sample_shape(shape, &self.shape);
        if let (Some((l, h)), true) = (self.constant, is_float(self.dtype)) {
            return gen.uniform(&full, l, h, self.dtype, self.device);
        }
        let low = self.low.f_expand(full.as_slice(), false)?;
        let high = self.high.f_expand(full.as_slice(), false)?;
        gen.uniform_tensor(&low, &high)
    }

    /// The spec expanded to `safe_shape(shape)` (size 1 at each `-1` of `shape`, TorchRL's
    /// expand rule otherwise), then dynamic at each `-1` of `shape` (any length; see
    /// [`crate::data::specs`], "Dynamic dims"): `Bounded::new(-1.0, 1.0, [1])?.with_dynamic_shape([4,
    /// -1])` has shape `[4, -1]`. The bounds must be the same along the dims made dynamic.
    pub fn with_dynamic_shape(self, shape: impl AsRef<[i64]>) -> Result<Self> {
        let shape = shape.as_ref();
        common::check_spec_shape("with_dynamic_shape", shape)?;
        self.expand(&common::safe_shape(shape))?.dynamic_at(shape)
    }

    /// A tensor of the spec's dtype and shape holding `values` (no range check, as TorchRL).
    pub fn encode(&self, values: &[f64]) -> Result<Tensor> {
        encode_plain(&self.shape, self.dtype, self.device, values)
    }

    /// This spec with other bound tensors (of `shape`).
    fn with_bounds(&self, low: Tensor, high: Tensor, shape: Vec<i64>) -> Result<Self> {
        Ok(Bounded {
            low: SpecTensor(low),
            high: SpecTensor(high),
            shape,
            dtype: self.dtype,
            device: self.device,
            constant: self.constant,
        })
    }
}

leaf_spec_api!(Bounded; dtype, project, index);

impl LeafSpec for Bounded {
    fn held(&self) -> Vec<&Tensor> {
        vec![&self.low, &self.high]
    }

    fn held_name(&self) -> &'static str {
        "bounds"
    }

    fn with_held(&self, shape: Vec<i64>, mut held: Vec<Tensor>) -> Result<Self> {
        match (held.pop(), held.pop()) {
            (Some(high), Some(low)) => self.with_bounds(low, high, shape),
            _ => Err(Error::invalid(
                "index",
                "internal: bounds lost while indexing",
            )),
        }
    }

    fn fmt_extra(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            ", low={}, high={}",
            common::fmt_bound(&self.low),
            common::fmt_bound(&self.high)
        )
    }

    fn domain_violation(&self, value: &Tensor) -> Result<Option<String>> {
        if value.elements() == 0 {
            return Ok(None);
        }
        let dev = value.device();
        let (low, high) = (to_dev(&self.low, dev)?, to_dev(&self.high, dev)?);
        let ok = value
            .f_ge_tensor(&low)?
            .f_logical_and(&value.f_le_tensor(&high)?)?;
        if common::all_true(&ok)? {
            return Ok(None);
        }
        let vshape = value.size();
        let (count, first) = common::first_false(&ok)?;
        let first = first.unwrap_or(0);
        let flat = |t: &Tensor| -> Result<f64> {
            Ok(t.f_expand(vshape.as_slice(), false)?
                .f_reshape([-1])?
                .f_double_value(&[first as i64])?)
        };
        let (v, l) = (flat(value)?, flat(&low)?);
        let k = self.dtype;
        let at = |t: &Tensor| common::fmt_element(t, &vshape, first as i64, k);
        // an integer value below low, compared exactly (f64 rounds near i64::MAX)
        let below = if is_float(value.kind()) || is_float(low.kind()) {
            v < l
        } else {
            let flat_i = |t: &Tensor| -> Result<i64> {
                Ok(t.f_expand(vshape.as_slice(), false)?
                    .f_reshape([-1])?
                    .f_int64_value(&[first as i64])?)
            };
            flat_i(value)? < flat_i(&low)?
        };
        let side = if v.is_nan() {
            "is NaN".to_string()
        } else if below {
            format!("< low {}", at(&low)?)
        } else {
            format!("> high {}", at(&high)?)
        };
        let range = common::value_range(value, k)?;
        Ok(Some(format!(
            "out of bounds: {count} of {} values outside [low, high] ({range}; spec low={}, high={}); \
             first at index {:?} (value shape {}): {} {side}",
            value.elements(),
            common::fmt_bound(&self.low),
            common::fmt_bound(&self.high),
            common::unravel(first, &vshape),
            ShapeFmt(&vshape),
            at(value)?,
        )))
    }

    fn project_fitting(&self, value: &Tensor) -> Result<Tensor> {
        let dev = value.device();
        let (low, high) = (to_dev(&self.low, dev)?, to_dev(&self.high, dev)?);
        let mut v = value.shallow_clone();
        if !is_float(self.dtype) && is_float(v.kind()) {
            // NaN and values beyond the integer range have no integer cast: replace NaN by low
            // and clamp while still floating, then round and cast.
            let (lo, hi) = (low.f_to_kind(v.kind())?, high.f_to_kind(v.kind())?);
            let nan = v.f_isnan()?;
            v = lo
                .f_expand_as(&v)?
                .f_where_self(&nan, &v)?
                .f_clamp_tensor(Some(&lo), Some(&hi))?
                .f_round()?;
        }
        // libtorch has no clamp for bool: work in int64 for a bool spec.
        let work = if self.dtype == Kind::Bool {
            Kind::Int64
        } else {
            self.dtype
        };
        let (low, high) = if work == self.dtype {
            (low, high)
        } else {
            (low.f_to_kind(work)?, high.f_to_kind(work)?)
        };
        if v.kind() != work {
            v = v.f_to_kind(work)?;
        }
        if is_float(work) {
            let nan = v.f_isnan()?;
            v = low.f_expand_as(&v)?.f_where_self(&nan, &v)?;
        }
        let v = v.f_clamp_tensor(Some(&low), Some(&high))?;
        Ok(if work == self.dtype {
            v
        } else {
            v.f_to_kind(self.dtype)?
        })
    }
}

/// Errors when `low > high` (or either is NaN) anywhere, naming the first position.
fn check_ordered(op: &'static str, low: &Tensor, high: &Tensor, shape: &[i64]) -> Result<()> {
    if low.elements() == 0 {
        return Ok(());
    }
    let ok = low.f_le_tensor(high)?;
    if common::all_true(&ok)? {
        return Ok(());
    }
    let (count, first) = common::first_false(&ok)?;
    let first = first.unwrap_or(0);
    let l = low.f_reshape([-1])?.f_double_value(&[first as i64])?;
    let h = high.f_reshape([-1])?.f_double_value(&[first as i64])?;
    Err(Error::InvalidValue {
        op,
        what: "arguments",
        key: "low, high".to_string(),
        expected: "low <= high everywhere".to_string(),
        got: format!(
            "{count} position(s) that violate it, first at index {:?} of shape {}: low={l}, \
             high={h}",
            common::unravel(first, shape),
            ShapeFmt(shape)
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcast_shapes() {
        assert_eq!(broadcast(&[2], &[]), Some(vec![2]));
        assert_eq!(broadcast(&[3, 1], &[2]), Some(vec![3, 2]));
        assert_eq!(broadcast(&[3], &[2]), None);
    }

    #[test]
    fn ordered_check_names_position() {
        let low = Tensor::from_slice(&[0.0f32, 2.0]);
        let high = Tensor::from_slice(&[1.0f32, 1.0]);
        let err = Bounded::from_tensors(low, high).unwrap_err().to_string();
        assert!(err.contains("[1]") && err.contains("low=2"), "{err}");
    }

    #[test]
    fn violation_reports_min_max_and_first() {
        let spec = Bounded::new(-1.0, 1.0, [2]).unwrap();
        let v = Tensor::from_slice(&[-3.0f32, 0.5, 0.0, 2.0]).reshape([2, 2]);
        let reason = spec.violation(&v).unwrap().unwrap();
        assert!(reason.contains("2 of 4"), "{reason}");
        assert!(
            reason.contains("min=-3") && reason.contains("max=2"),
            "{reason}"
        );
        assert!(
            reason.contains("[0, 0]") && reason.contains("< low -1"),
            "{reason}"
        );
    }
}
