//! [`stack_specs`]: `torch.stack` for specs.
//!
//! Identical specs stack into the same spec with a new dim of size `len(specs)` inserted at `dim`
//! (a dense stack). Specs that differ are rejected: TorchRL would build a lazy `Stacked` /
//! `StackedComposite`, which this crate does not implement. The checks, in TorchRL's order:
//! classes (`"more than one type of specs"`), devices, dtypes (`"Dtypes differ"`), ndims
//! (`"Ndims differ"`), then any other difference (shape, bounds, `n`, mask, children).
//!
//! ```
//! use tch::Kind;
//! use torchrl::specs::{stack_specs, Bounded, TensorSpec, Unbounded};
//! # fn main() -> torchrl::Result<()> {
//! let b: TensorSpec = Bounded::new(-1.0, 1.0, [2])?.into();
//! let s = stack_specs(&[b.clone(), b.clone(), b], 0)?;
//! assert_eq!(s.shape(), &[3, 2]);
//! let f: TensorSpec = Unbounded::new().with_shape([2])?.into();
//! let d: TensorSpec = Unbounded::new().with_shape([2])?.with_dtype(Kind::Double)?.into();
//! let err = stack_specs(&[f, d], 0).unwrap_err().to_string();
//! assert!(err.contains("Dtypes differ"), "{err}");
//! # Ok(()) }
//! ```

use std::fmt;

use super::common::{self, tuple_fmt};
use super::TensorSpec;
use crate::error::{Error, Result, ShapeFmt};

/// Stacks identical specs along a new dim `dim` (in `[-(ndim+1), ndim]`).
///
/// Errors on an empty list, on specs of different classes, devices, dtypes or ndims, and on
/// specs that differ otherwise (a lazy stack of heterogeneous specs is not implemented).
pub fn stack_specs(specs: &[TensorSpec], dim: i64) -> Result<TensorSpec> {
    let op = "stack_specs";
    let Some((first, rest)) = specs.split_first() else {
        return Err(Error::invalid(op, "Cannot stack an empty list of specs."));
    };
    let kind = |k: Option<tch::Kind>| k.map_or("None".to_string(), |k| format!("{k:?}"));
    for (i, spec) in rest.iter().enumerate() {
        let i = i + 1;
        let (a, b) = (first, spec);
        if std::mem::discriminant(b) != std::mem::discriminant(a) {
            let why = "stacking specs cannot occur: found more than one type of specs in the list";
            return Err(differ("Classes", a.class_name(), b.class_name(), i, why));
        }
        if b.device() != a.device() {
            let (da, db) = (format!("{:?}", a.device()), format!("{:?}", b.device()));
            return Err(differ("Devices", da, db, i, "specs on one device"));
        }
        if b.dtype() != a.dtype() {
            let why = "specs whose dtypes differ cannot be stacked";
            return Err(differ("Dtypes", kind(a.dtype()), kind(b.dtype()), i, why));
        }
        if b.ndim() != a.ndim() {
            let why = "specs whose ndims differ cannot be stacked";
            return Err(differ("Ndims", a.ndim(), b.ndim(), i, why));
        }
        let lazy = "heterogeneous specs would need a lazy stack (TorchRL's Stacked / \
                    StackedComposite), which is not implemented";
        if b.shape() != a.shape() {
            let (sa, sb) = (ShapeFmt(a.shape()), ShapeFmt(b.shape()));
            return Err(differ("Shapes", sa, sb, i, lazy));
        }
        if b != a {
            return Err(differ("Specs", a, b, i, lazy));
        }
    }
    let (mut shape, d) = common::unsqueezed(first.shape(), dim)?;
    if let Some(s) = shape.get_mut(d) {
        *s = specs.len() as i64;
    }
    let unsq = first.unsqueeze(d as i64)?;
    unsq.expand(&shape).map_err(|e| {
        e.context(format!(
            "{op}: cannot expand the stacked spec to {}",
            tuple_fmt(&shape)
        ))
    })
}

/// `specs[i]` differs from `specs[0]` in `what` (`"Dtypes"`, …): `a` against `b`; `why` says
/// what stacking needs.
#[cold]
fn differ(what: &str, a: impl fmt::Display, b: impl fmt::Display, i: usize, why: &str) -> Error {
    Error::argument(
        "stack_specs",
        "specs",
        format!("specs that can be stacked ({why})"),
        format!("{what} differ, got {a} and {b} (position {i})"),
    )
}
