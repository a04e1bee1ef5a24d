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

use super::{display_segments, starts_with, Entry, Map, TensorDict};
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
        let mut out = TensorDict {
            entries: Map::default(),
            batch_size: self.batch_size.clone(),
            device: self.device,
        };
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
        let a = self.keys(true, true);
        let b = other.keys(true, true);
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

    /// Fills the leaf at `key` with `value`, in place.
    pub fn fill_(&self, key: impl super::AsKey, value: impl Into<Scalar>) -> Result<()> {
        let t = self.get_or_err(key)?;
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
            if t.numel() > 0 && t.f_all()?.int64_value(&[]) == 0 {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// True when any element of any leaf is non-zero.
    pub fn any(&self) -> Result<bool> {
        for (_, t) in self.leaves() {
            if t.numel() > 0 && t.f_any()?.int64_value(&[]) != 0 {
                return Ok(true);
            }
        }
        Ok(false)
    }
}
