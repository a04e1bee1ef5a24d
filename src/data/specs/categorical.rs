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

use super::common::{self, concat, is_float, to_dev};
use super::one_hot::OneHot;
use super::unbounded::encode_plain;
use crate::error::{ensure, Error, Result, ShapeFmt};
use crate::rng::{build, read, Generator};
use crate::tensordict::{AsKey, BatchIndex, Elements};

/// A spec for class indices in `[0, n)`.
pub struct Categorical {
    pub(crate) n: i64,
    pub(crate) shape: Vec<i64>,
    pub(crate) dtype: Kind,
    pub(crate) device: Device,
    /// Allowed classes, `[*shape, n]`, on `device`.
    pub(crate) mask: Option<Tensor>,
}

impl Clone for Categorical {
    /// Shallow: the mask tensor is shared (specs never modify it in place).
    fn clone(&self) -> Self {
        Categorical {
            n: self.n,
            shape: self.shape.clone(),
            dtype: self.dtype,
            device: self.device,
            mask: self.mask.as_ref().map(Tensor::shallow_clone),
        }
    }
}

impl PartialEq for Categorical {
    fn eq(&self, other: &Self) -> bool {
        self.n == other.n
            && self.shape == other.shape
            && self.dtype == other.dtype
            && self.device == other.device
            && common::opt_tensor_eq(self.mask.as_ref(), other.mask.as_ref())
    }
}

/// `0 <= value < n`, elementwise, compared in int64 (or float64 for floating values): libtorch
/// casts a scalar operand to the tensor's dtype, so `int8 < 128` would compare with -128.
pub(crate) fn in_class_range(value: &Tensor, n: i64) -> Result<Tensor> {
    let wide = match value.kind() {
        Kind::Int64 | Kind::Double => value.shallow_clone(),
        k if is_float(k) => value.f_to_kind(Kind::Double)?,
        _ => value.f_to_kind(Kind::Int64)?,
    };
    Ok(wide.f_ge(0)?.f_logical_and(&wide.f_lt(n)?)?)
}

/// Checks `0 <= v < n` (and the mask) for class values; shared by the categorical specs.
pub(crate) fn class_violation(
    value: &Tensor,
    n: i64,
    mask: Option<&Tensor>,
    kind: Kind,
) -> Result<Option<String>> {
    if value.elements() == 0 {
        return Ok(None);
    }
    let vshape = value.size();
    let ok = in_class_range(value, n)?;
    if !common::all_true(&ok)? {
        let (count, first) = common::first_false(&ok)?;
        let first = first.unwrap_or(0);
        let v = value.f_reshape([-1])?.f_double_value(&[first as i64])?;
        let range = match common::min_max(value)? {
            Some((lo, hi)) => format!(
                "value min={}, max={}",
                common::fmt_scalar(lo, kind),
                common::fmt_scalar(hi, kind)
            ),
            None => String::new(),
        };
        return Ok(Some(format!(
            "out of range: {count} of {} values outside [0, {}] ({range}); first at index {:?} \
             (value shape {}): {}",
            value.elements(),
            n - 1,
            common::unravel(first, &vshape),
            ShapeFmt(&vshape),
            common::fmt_scalar(v, kind)
        )));
    }
    if let Some(mask) = mask {
        let classes = value.f_to_kind(Kind::Int64)?;
        let target = concat(&vshape, &[n]);
        let m = to_dev(mask, value.device())?.f_broadcast_to(target.as_slice())?;
        let allowed = m
            .f_gather(-1, &classes.f_unsqueeze(-1)?, false)?
            .f_squeeze_dim(-1)?;
        if !common::all_true(&allowed)? {
            let (count, first) = common::first_false(&allowed)?;
            let first = first.unwrap_or(0);
            let class = classes.f_reshape([-1])?.f_int64_value(&[first as i64])?;
            return Ok(Some(format!(
                "masked class: {count} of {} values select a class the mask forbids; first at \
                 index {:?} (value shape {}): class {class}",
                value.elements(),
                common::unravel(first, &vshape),
                ShapeFmt(&vshape)
            )));
        }
    }
    Ok(None)
}

/// The largest `n` for which every class `0..n` is exactly representable in `kind`.
fn max_classes(kind: Kind) -> i64 {
    match kind {
        Kind::Bool => 2,
        Kind::Uint8 => 256,
        Kind::Int8 => 128,
        Kind::Int16 => 32768,
        Kind::Int => 1 << 31,
        Kind::Half => (1 << 11) + 1,
        Kind::BFloat16 => (1 << 8) + 1,
        Kind::Float => (1 << 24) + 1,
        Kind::Double => (1 << 53) + 1,
        _ => i64::MAX,
    }
}

/// Errors when `kind` cannot hold every class in `0..n` exactly (a cast would wrap or round
/// a class out of range, so that samples and projections would not be in the spec).
pub(crate) fn check_classes_fit(op: &'static str, n: i64, kind: Kind) -> Result<()> {
    let max = max_classes(kind);
    ensure!(
        n <= max,
        op,
        "{n} classes do not fit dtype {kind:?}, which holds the classes 0..{max} exactly"
    );
    Ok(())
}

/// Class indices (int64) from arbitrary values: floats are rounded, NaN becomes class 0 (as
/// a Bounded spec projects NaN to `low`), and entry `i` along the last dim is clamped to
/// `[0, nvec[i] - 1]` (`nvec` of length 1 applies to every entry).
pub(crate) fn project_classes(value: &Tensor, nvec: &[i64]) -> Result<Tensor> {
    let mut v = value.shallow_clone();
    let maxes: Vec<i64> = nvec.iter().map(|n| n - 1).collect();
    // One bound for every entry is a 0-d tensor, so that clamping never grows a 0-d value.
    let bshape: Vec<i64> = if maxes.len() == 1 {
        vec![]
    } else {
        vec![maxes.len() as i64]
    };
    if is_float(v.kind()) {
        // Clamp while floating: ±inf and huge values have no integer cast.
        let hi = build(&maxes, &bshape, Kind::Double, v.device())?.f_to_kind(v.kind())?;
        let lo = hi.f_zeros_like()?;
        v = v
            .f_nan_to_num(0.0, None, None)?
            .f_round()?
            .f_clamp_tensor(Some(&lo), Some(&hi))?;
    }
    let v = v.f_to_kind(Kind::Int64)?;
    let hi = build(&maxes, &bshape, Kind::Int64, v.device())?;
    let lo = hi.f_zeros_like()?;
    Ok(v.f_clamp_tensor(Some(&lo), Some(&hi))?)
}

/// Replaces classes the mask forbids by the nearest allowed class (ties: the lower one).
pub(crate) fn nearest_allowed(value: &Tensor, n: i64, mask: &Tensor) -> Result<Tensor> {
    let vshape = value.size();
    let target = concat(&vshape, &[n]);
    let m = mask.f_broadcast_to(target.as_slice())?;
    let allowed = read::<bool>(&m)?;
    let mut classes = read::<i64>(value)?;
    let nu = n as usize;
    for (r, c) in classes.iter_mut().enumerate() {
        let row = allowed.get(r * nu..(r + 1) * nu).unwrap_or(&[]);
        let ok = |k: i64| k >= 0 && k < n && row.get(k as usize).copied().unwrap_or(false);
        if ok(*c) {
            continue;
        }
        let found = (1..=n).find_map(|d| {
            if ok(*c - d) {
                Some(*c - d)
            } else if ok(*c + d) {
                Some(*c + d)
            } else {
                None
            }
        });
        match found {
            Some(k) => *c = k,
            None => {
                return Err(Error::invalid(
                    "project",
                    format!(
                        "the mask allows no class at index {:?}",
                        common::unravel(r, &vshape)
                    ),
                ))
            }
        }
    }
    build(&classes, &vshape, value.kind(), value.device())
}

impl Categorical {
    /// `n` classes, shape `[]`, dtype `Int64`, on the CPU, no mask. Errors when `n < 1`.
    pub fn new(n: i64) -> Result<Self> {
        ensure!(n >= 1, "Categorical::new", "n must be >= 1, got {n}");
        Ok(Categorical {
            n,
            shape: vec![],
            dtype: Kind::Int64,
            device: Device::Cpu,
            mask: None,
        })
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

    /// Sets the dtype (any integer, bool or floating kind that holds every class `0..n`
    /// exactly: e.g. at most 128 classes for `Int8`, 2 for `Bool`, 2049 for `Half`).
    pub fn with_dtype(mut self, dtype: Kind) -> Result<Self> {
        let op = "Categorical::with_dtype";
        common::check_kind(op, dtype)?;
        check_classes_fit(op, self.n, dtype)?;
        self.dtype = dtype;
        Ok(self)
    }

    /// Sets the device (the mask moves too).
    pub fn with_device(self, device: Device) -> Result<Self> {
        self.to_device(device)
    }

    /// Sets the mask of allowed classes (see [`Categorical::update_mask`]).
    pub fn with_mask(mut self, mask: Tensor) -> Result<Self> {
        self.update_mask(Some(mask))?;
        Ok(self)
    }

    fn prepared_mask(&self, op: &'static str, mask: &Tensor) -> Result<Tensor> {
        let target = concat(&self.shape, &[self.n]);
        common::prepare_mask(op, mask, &target, self.n, self.device)
    }

    /// Sets (`Some`) or clears (`None`) the mask: a bool tensor that broadcasts to
    /// `[*shape, n]`, `false` excluding a class. On error the spec is unchanged.
    pub fn update_mask(&mut self, mask: Option<Tensor>) -> Result<()> {
        self.mask = match mask {
            None => None,
            Some(m) => Some(self.prepared_mask("Categorical::update_mask", &m)?),
        };
        Ok(())
    }

    /// The number of classes.
    pub fn n(&self) -> i64 {
        self.n
    }

    /// The mask, expanded to `[*shape, n]`, if any.
    pub fn mask(&self) -> Option<&Tensor> {
        self.mask.as_ref()
    }

    /// The shape.
    pub fn shape(&self) -> &[i64] {
        &self.shape
    }

    /// The dtype.
    pub fn dtype(&self) -> Kind {
        self.dtype
    }

    /// The device.
    pub fn device(&self) -> Device {
        self.device
    }

    /// Uniform classes of shape `[*shape, *self.shape]`, among the allowed ones when masked.
    /// Errors when a mask row allows no class.
    pub fn rand(&self, gen: &mut Generator, shape: &[i64]) -> Result<Tensor> {
        let full = concat(shape, &self.shape);
        match &self.mask {
            None => gen.randint(&full, 0, self.n, self.dtype, self.device),
            Some(m) => Ok(gen
                .sample_categorical(&full, self.n, Some(m), self.device)?
                .f_to_kind(self.dtype)?),
        }
    }

    /// Zeros of shape `[*shape, *self.shape]`.
    pub fn zero(&self, shape: &[i64]) -> Result<Tensor> {
        common::filled(shape, &self.shape, self.dtype, self.device, false)
    }

    /// Ones of shape `[*shape, *self.shape]`.
    pub fn one(&self, shape: &[i64]) -> Result<Tensor> {
        common::filled(shape, &self.shape, self.dtype, self.device, true)
    }

    pub(crate) fn violation(&self, value: &Tensor) -> Result<Option<String>> {
        if let Some(r) = common::dtype_shape_violation(&self.shape, Some(self.dtype), value) {
            return Ok(Some(r));
        }
        class_violation(value, self.n, self.mask.as_ref(), self.dtype)
    }

    /// True when the dtype matches, the shape fits, `0 <= value < n`, and the mask allows it.
    /// A float-dtype spec accepts non-integral values in range (as TorchRL).
    pub fn is_in(&self, value: &Tensor) -> Result<bool> {
        Ok(self.violation(value)?.is_none())
    }

    /// Like [`Categorical::is_in`] but errors with [`Error::NotInSpec`] saying why.
    pub fn check(&self, value: &Tensor, key: impl AsKey) -> Result<()> {
        match self.violation(value)? {
            None => Ok(()),
            Some(reason) => Err(Error::NotInSpec {
                op: "check",
                key: key.to_nested_key().to_string(),
                spec: self.to_string(),
                reason,
            }),
        }
    }

    /// Returns the value unchanged when it is in the spec; otherwise rounds floats, clamps to
    /// `[0, n-1]`, casts to the spec's dtype, and (when masked) replaces forbidden classes by
    /// the nearest allowed one (TorchRL resamples them at random instead).
    pub fn project(&self, value: &Tensor) -> Result<Tensor> {
        if self.violation(value)?.is_none() {
            return Ok(value.shallow_clone());
        }
        if !common::shape_fits(&self.shape, &value.size()) {
            return Err(Error::NotInSpec {
                op: "project",
                key: "<value>".into(),
                spec: self.to_string(),
                reason: format!(
                    "cannot project a value of shape {}: projection does not reshape",
                    ShapeFmt(&value.size())
                ),
            });
        }
        let v = project_classes(value, &[self.n])?;
        let mut v = v.f_to_kind(self.dtype)?;
        if let Some(m) = &self.mask {
            v = nearest_allowed(&v, self.n, &to_dev(m, v.device())?)?;
        }
        Ok(v)
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

    /// The equivalent [`OneHot`] spec: shape `[*shape, n]`, dtype `Bool`, same mask.
    pub fn to_one_hot_spec(&self) -> OneHot {
        OneHot {
            n: self.n,
            shape: concat(&self.shape, &[self.n]),
            dtype: Kind::Bool,
            device: self.device,
            mask: self.mask.as_ref().map(Tensor::shallow_clone),
        }
    }

    /// The spec expanded to `shape` (TorchRL's trailing-dims rule); the mask is expanded too.
    pub fn expand(&self, shape: &[i64]) -> Result<Self> {
        common::check_expand("Categorical", &self.shape, shape)?;
        let mask = match &self.mask {
            None => None,
            Some(m) => Some(
                m.f_expand(concat(shape, &[self.n]).as_slice(), false)?
                    .f_contiguous()?,
            ),
        };
        Ok(Categorical {
            shape: shape.to_vec(),
            mask,
            ..self.clone()
        })
    }

    /// The spec indexed on its dims (the mask is indexed the same way).
    pub fn index(&self, idx: &[BatchIndex]) -> Result<Self> {
        let tensors: Vec<&Tensor> = self.mask.iter().collect();
        let (shape, mut t) = common::index_lead(&self.shape, &tensors, idx)?;
        Ok(Categorical {
            shape,
            mask: t.pop(),
            ..self.clone()
        })
    }

    /// Removes dim `dim` if it has size 1, or every size-1 dim with `None`.
    pub fn squeeze(&self, dim: Option<i64>) -> Result<Self> {
        let Some((shape, _)) = common::squeezed(&self.shape, dim)? else {
            return Ok(self.clone());
        };
        self.reshaped(shape)
    }

    /// Inserts a dim of size 1 at `dim`.
    pub fn unsqueeze(&self, dim: i64) -> Result<Self> {
        let (shape, _) = common::unsqueezed(&self.shape, dim)?;
        self.reshaped(shape)
    }

    fn reshaped(&self, shape: Vec<i64>) -> Result<Self> {
        let mask = match &self.mask {
            None => None,
            Some(m) => Some(m.f_reshape(concat(&shape, &[self.n]).as_slice())?),
        };
        Ok(Categorical {
            shape,
            mask,
            ..self.clone()
        })
    }

    /// The spec (and its mask) on another device.
    pub fn to_device(&self, device: Device) -> Result<Self> {
        let mask = match &self.mask {
            None => None,
            Some(m) => Some(to_dev(m, device)?),
        };
        Ok(Categorical {
            device,
            mask,
            ..self.clone()
        })
    }
}

/// One-hot encodes integer classes in `[0, n)` as bool `[..., n]`.
pub(crate) fn to_one_hot(value: &Tensor, n: i64) -> Result<Tensor> {
    if value.elements() > 0 {
        let ok = in_class_range(value, n)?;
        if !common::all_true(&ok)? {
            let (lo, hi) = common::min_max(value)?.unwrap_or((0.0, 0.0));
            return Err(Error::invalid(
                "to_one_hot",
                format!("class indices must be in [0, {n}), got values in [{lo}, {hi}]"),
            ));
        }
    }
    Ok(value
        .f_to_kind(Kind::Int64)?
        .f_one_hot(n)?
        .f_to_kind(Kind::Bool)?)
}

impl fmt::Display for Categorical {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Categorical(shape={}, dtype={:?}, n={}{}{})",
            ShapeFmt(&self.shape),
            self.dtype,
            self.n,
            if self.mask.is_some() { ", masked" } else { "" },
            common::fmt_device(self.device)
        )
    }
}

impl fmt::Debug for Categorical {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
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
