//! Leaf-wise operations on a [`TensorDict`]: deep clone, `apply`/`apply2`, device and dtype
//! casts, `detach`, `zero_`, `fill_`, and element-wise equality.
//!
//! ```
//! use tch::{Device, Kind, Tensor};
//! use torchrl::TensorDict;
//! # fn main() -> torchrl::Result<()> {
//! let td = TensorDict::new([2])?.with("x", Tensor::from_slice(&[1.0f32, 2.0]))?;
//! let doubled = td.apply(|t| Ok(Some(t * 2)))?;
//! assert_eq!(doubled.get("x").map(|t| t.double_value(&[1])), Some(4.0));
//! assert!(!td.eq(&doubled)?.all()?);
//! assert!(td.eq(&td.deep_clone()?)?.all()?);
//! # Ok(()) }
//! ```

use tch::{Device, Kind, Scalar, Tensor};

use super::{display_segments, starts_with, AsKey, Elements, Entry, KeysOptions, TensorDict};
use crate::error::{Error, Result};

impl TensorDict {
    /// Maps every leaf through `f`, building a new tensordict with the same structure and batch
    /// size. A leaf for which `f` returns `None` is dropped. Each result must keep the batch
    /// dims (checked).
    pub fn apply<F>(&self, mut f: F) -> Result<TensorDict>
    where
        F: FnMut(&Tensor) -> Result<Option<Tensor>>,
    {
        self.apply_rec("apply", &mut |t, _| f(t), None, &mut Vec::new())
    }

    /// Maps pairs of leaves (same key in `self` and `other`) through `f`. The key sets must be
    /// identical.
    pub fn apply2<F>(&self, other: &TensorDict, mut f: F) -> Result<TensorDict>
    where
        F: FnMut(&Tensor, &Tensor) -> Result<Option<Tensor>>,
    {
        self.check_same_keys("apply2", other)?;
        self.apply_rec(
            "apply2",
            &mut |t, o| match o {
                Some(o) => f(t, o),
                None => Ok(None),
            },
            Some(other),
            &mut Vec::new(),
        )
    }

    fn apply_rec<'a, F>(
        &'a self,
        op: &'static str,
        f: &mut F,
        other: Option<&TensorDict>,
        path: &mut Vec<&'a str>,
    ) -> Result<TensorDict>
    where
        F: FnMut(&Tensor, Option<&Tensor>) -> Result<Option<Tensor>>,
    {
        let mut out = self.empty();
        for (k, e) in &self.entries {
            path.push(k);
            let o = other.and_then(|o| o.entries.get(k));
            match e {
                Entry::Tensor(t) => {
                    if let Some(r) = f(t, o.and_then(Entry::as_tensor))? {
                        let shape = r.size();
                        if !starts_with(&shape, &self.batch_size) {
                            return Err(Error::BatchSizeMismatch {
                                op,
                                key: display_segments(path),
                                batch_size: self.batch_size.to_vec(),
                                shape,
                            });
                        }
                        let r = match self.device {
                            Some(dev) if r.device() != dev => r.f_to_device(dev)?,
                            _ => r,
                        };
                        out.entries.insert(k.clone(), Entry::Tensor(r));
                    }
                }
                Entry::Dict(d) => {
                    let sub = d.apply_rec(op, f, o.and_then(Entry::as_dict), path)?;
                    out.entries.insert(k.clone(), Entry::Dict(sub));
                }
            }
            path.pop();
        }
        Ok(out)
    }

    fn check_same_keys(&self, op: &'static str, other: &TensorDict) -> Result<()> {
        let a = self.keys(KeysOptions::nested_leaves());
        let b = other.keys(KeysOptions::nested_leaves());
        let only_first: Vec<String> = a
            .iter()
            .filter(|k| !b.contains(k))
            .map(|k| k.to_string())
            .collect();
        let only_second: Vec<String> = b
            .iter()
            .filter(|k| !a.contains(k))
            .map(|k| k.to_string())
            .collect();
        if only_first.is_empty() && only_second.is_empty() {
            Ok(())
        } else {
            Err(Error::KeySetMismatch {
                op,
                only_first,
                only_second,
            })
        }
    }

    /// A copy whose leaves own new storage (differentiable copies, like Python's `clone()`).
    pub fn deep_clone(&self) -> Result<TensorDict> {
        self.apply(|t| {
            let mut c = t.f_empty_like()?;
            c.f_copy_(t)?;
            Ok(Some(c))
        })
    }

    /// A copy on `device` (leaves already there are shared, not copied); the result's device is
    /// `device`.
    pub fn to_device(&self, device: Device) -> Result<TensorDict> {
        let mut out = self.apply(|t| Ok(Some(t.f_to_device(device)?)))?;
        out.set_device_flag(device);
        Ok(out)
    }

    fn set_device_flag(&mut self, device: Device) {
        self.device = Some(device);
        for e in self.entries.values_mut() {
            if let Entry::Dict(d) = e {
                d.set_device_flag(device);
            }
        }
    }

    /// A copy with every leaf cast to `kind`.
    pub fn to_kind(&self, kind: Kind) -> Result<TensorDict> {
        self.apply(|t| Ok(Some(t.f_to_kind(kind)?)))
    }

    /// A copy whose leaves are detached from the autograd graph (sharing storage).
    pub fn detach(&self) -> Result<TensorDict> {
        self.apply(|t| Ok(Some(t.f_detach()?)))
    }

    /// Zeroes every leaf in place.
    pub fn zero_(&self) -> Result<()> {
        let _guard = tch::no_grad_guard();
        for (_, t) in self.leaves() {
            let mut t = t.shallow_clone();
            let _ = t.f_zero_()?;
        }
        Ok(())
    }

    /// Fills the leaf at `key` with `value`, in place. Errors (naming the key) when the leaf's
    /// dtype cannot hold the value (e.g. 300 for `Uint8`, 1e39 or NaN for an integer dtype).
    pub fn fill_(&self, key: impl AsKey, value: impl Into<Scalar>) -> Result<()> {
        let segs = key.segments();
        let t = self.get_or_err(&segs[..])?;
        let value: Scalar = value.into();
        // libtorch refuses values the dtype cannot hold, and tch panics (instead of returning
        // the error) when an op taking a `Scalar` fails: check first.
        let v = value.to_float()?;
        if !fits_kind(v, t.kind()) {
            return Err(Error::value(
                "fill_",
                display_segments(&segs),
                format!("a fill value its dtype {:?} can hold", t.kind()),
                v.to_string(),
            ));
        }
        let _guard = tch::no_grad_guard();
        let mut t = t.shallow_clone();
        let _ = t.f_fill_(value)?;
        Ok(())
    }

    /// Element-wise equality: a tensordict of bool tensors with the same structure. The key
    /// sets must match; shapes must broadcast.
    pub fn eq(&self, other: &TensorDict) -> Result<TensorDict> {
        self.apply2(other, |a, b| Ok(Some(a.f_eq_tensor(b)?)))
    }

    /// Element-wise equality with a scalar.
    pub fn eq_scalar(&self, value: impl Into<Scalar> + Copy) -> Result<TensorDict> {
        self.apply(|t| Ok(Some(t.f_eq(value.into())?)))
    }

    /// True when every element of every leaf is non-zero (true for no leaves).
    pub fn all(&self) -> Result<bool> {
        for (_, t) in self.leaves() {
            if t.elements() > 0 && t.f_all()?.int64_value(&[]) == 0 {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// True when any element of any leaf is non-zero.
    pub fn any(&self) -> Result<bool> {
        for (_, t) in self.leaves() {
            if t.elements() > 0 && t.f_any()?.int64_value(&[]) != 0 {
                return Ok(true);
            }
        }
        Ok(false)
    }
}

// ------------------------------------------------------------------ scalar helpers
//
// tch's fallible ops that take a `Scalar` argument (`f_full`, `f_clamp`, `f_fill_`,
// `f_masked_fill`, ...) panic instead of returning the error when libtorch raises one: the
// temporary `Scalar` is dropped, and its destructor unwraps the pending error. libtorch raises
// for values a dtype cannot hold (`full(1e39)` as float32, `clamp(0, 300)` on uint8). These
// helpers take `f64` values, never hand libtorch a value it would refuse, and return errors.

/// The range of values a kind holds: `(min, max, integral)`; `None` for kinds without one
/// (complex, quantized).
pub(crate) fn kind_range(kind: Kind) -> Option<(f64, f64, bool)> {
    Some(match kind {
        Kind::Bool => (0.0, 1.0, true),
        Kind::Uint8 => (0.0, 255.0, true),
        Kind::Int8 => (-128.0, 127.0, true),
        Kind::Int16 => (-32768.0, 32767.0, true),
        Kind::Int => (-2147483648.0, 2147483647.0, true),
        // 2^63 - 1 is not an f64; the largest f64 below 2^63.
        Kind::Int64 => (-9223372036854775808.0, 9223372036854774784.0, true),
        Kind::Half => (-65504.0, 65504.0, false),
        Kind::BFloat16 => (-3.3895313892515355e38, 3.3895313892515355e38, false),
        Kind::Float => (f64::from(f32::MIN), f64::from(f32::MAX), false),
        Kind::Double => (f64::MIN, f64::MAX, false),
        _ => return None,
    })
}

/// True when a `kind` tensor can hold `v` as libtorch's checked conversion sees it: any value
/// (including NaN and ±inf) for bool, finite values in range for integers (fractions are
/// truncated), values in the finite range or non-finite for floats.
pub(crate) fn fits_kind(v: f64, kind: Kind) -> bool {
    match (kind, kind_range(kind)) {
        (Kind::Bool, _) => true,
        (_, Some((lo, hi, true))) => v.is_finite() && v.trunc() >= lo && v.trunc() <= hi,
        (_, Some((lo, hi, false))) => !v.is_finite() || (v >= lo && v <= hi),
        (_, None) => false,
    }
}

/// A 0-d tensor of `kind` holding `v` (a cast: no range check).
fn scalar_tensor(v: f64, kind: Kind, device: Device) -> Result<Tensor> {
    let t = Tensor::f_from_slice(&[v])?.f_reshape([0i64; 0])?;
    let t = if kind == Kind::Double {
        t
    } else {
        t.f_to_kind(kind)?
    };
    Ok(if device == Device::Cpu {
        t
    } else {
        t.f_to_device(device)?
    })
}

/// `Tensor::full(shape, value)` without the tch panic: for a floating kind a value beyond its
/// range becomes ±inf (IEEE rounding, as a cast), for an integer or bool kind a value it cannot
/// hold (NaN, ±inf, out of range) is an error naming `op`, the value and the dtype.
pub(crate) fn full_f64(
    op: &'static str,
    shape: &[i64],
    value: f64,
    kind: Kind,
    device: Device,
) -> Result<Tensor> {
    let float = matches!(kind_range(kind), Some((_, _, false)));
    if !float && !fits_kind(value, kind) {
        return Err(Error::argument(
            op,
            "value",
            format!("a value dtype {kind:?} can hold"),
            value.to_string(),
        ));
    }
    super::refuse_negative_dims(op, "shape", shape, "")?;
    Ok(scalar_tensor(value, kind, device)?
        .f_expand(shape, false)?
        .f_contiguous()?)
}

/// `t.clamp(lo, hi)` with `f64` bounds (`None`: unbounded on that side) without the tch panic.
/// Bounds beyond the dtype's range are brought into it (for a floating dtype they round to
/// ±inf; for an integer dtype `lo` is rounded up and `hi` down, then clipped to the range).
/// Errors on a NaN bound, on a bool tensor, and on integer bounds that leave no value of the
/// dtype (e.g. `[300, 400]` for uint8).
pub(crate) fn clamp_f64(
    op: &'static str,
    t: &Tensor,
    lo: Option<f64>,
    hi: Option<f64>,
) -> Result<Tensor> {
    let kind = t.kind();
    if lo.is_some_and(f64::is_nan) || hi.is_some_and(f64::is_nan) {
        return Err(Error::argument(
            op,
            "clamp bounds",
            "bounds that are not NaN",
            format!("[{lo:?}, {hi:?}]"),
        ));
    }
    let Some((min, max, integral)) = kind_range(kind).filter(|_| kind != Kind::Bool) else {
        return Err(Error::argument(
            op,
            "tensor",
            "a tensor of a numeric, non-bool dtype",
            format!("dtype {kind:?} (cannot clamp a tensor of dtype {kind:?})"),
        ));
    };
    let (lo, hi) = if integral {
        let lo = lo.map(f64::ceil);
        let hi = hi.map(f64::floor);
        if lo.is_some_and(|l| l > max) || hi.is_some_and(|h| h < min) {
            return Err(Error::argument(
                op,
                "bounds",
                format!("clamp bounds that leave a value of dtype {kind:?} (range [{min}, {max}])"),
                format!("clamp bounds [{lo:?}, {hi:?}], which leave no value of dtype {kind:?}"),
            ));
        }
        (lo.map(|l| l.max(min)), hi.map(|h| h.min(max)))
    } else {
        (lo, hi)
    };
    let device = t.device();
    let lo = lo.map(|v| scalar_tensor(v, kind, device)).transpose()?;
    let hi = hi.map(|v| scalar_tensor(v, kind, device)).transpose()?;
    if lo.is_none() && hi.is_none() {
        return Ok(t.shallow_clone());
    }
    Ok(t.f_clamp_tensor(lo.as_ref(), hi.as_ref())?)
}

#[cfg(test)]
mod scalar_tests {
    use super::*;

    #[test]
    fn full_and_clamp_never_hand_libtorch_a_value_it_refuses() {
        let cpu = Device::Cpu;
        let t = full_f64("t", &[2], 1e39, Kind::Float, cpu).unwrap();
        assert!(t.double_value(&[0]).is_infinite());
        assert!(full_f64("t", &[2], 300.0, Kind::Uint8, cpu).is_err());
        assert!(full_f64("t", &[2], f64::NAN, Kind::Int64, cpu).is_err());
        assert_eq!(
            full_f64("t", &[], 7.0, Kind::Int, cpu)
                .unwrap()
                .int64_value(&[]),
            7
        );
        let u = Tensor::from_slice(&[0u8, 200, 255]);
        let c = clamp_f64("t", &u, Some(1.0), Some(300.0)).unwrap();
        assert_eq!(Vec::<u8>::try_from(&c).unwrap(), vec![1, 200, 255]);
        assert!(clamp_f64("t", &u, Some(300.0), Some(400.0)).is_err());
        let f = Tensor::from_slice(&[0.0f32, 5.0]);
        let c = clamp_f64("t", &f, Some(1e39), None).unwrap();
        assert!(c.double_value(&[0]).is_infinite());
        let h = Tensor::from_slice(&[0.0f32, 5.0]).to_kind(Kind::Half);
        assert!(clamp_f64("t", &h, Some(-1e5), Some(1e5)).is_ok());
        assert!(clamp_f64("t", &f, Some(f64::NAN), None).is_err());
        assert!(fits_kind(-128.0, Kind::Int8) && !fits_kind(128.0, Kind::Int8));
        assert!(!fits_kind(9223372036854775808.0, Kind::Int64));
    }
}
