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
    for (i, spec) in rest.iter().enumerate() {
        let i = i + 1;
        if std::mem::discriminant(spec) != std::mem::discriminant(first) {
            return Err(Error::invalid(
                op,
                format!(
                    "Stacking specs cannot occur: Found more than one type of specs in the list \
                     ({} at position 0, {} at position {i})",
                    first.class_name(),
                    spec.class_name()
                ),
            ));
        }
        if spec.device() != first.device() {
            return Err(Error::invalid(
                op,
                format!(
                    "Devices differ, got {:?} and {:?} (position {i})",
                    first.device(),
                    spec.device()
                ),
            ));
        }
        if spec.dtype() != first.dtype() {
            let fmt = |k: Option<tch::Kind>| k.map_or("None".to_string(), |k| format!("{k:?}"));
            return Err(Error::invalid(
                op,
                format!(
                    "Dtypes differ, got {} and {} (position {i}): specs whose dtypes differ \
                     cannot be stacked",
                    fmt(first.dtype()),
                    fmt(spec.dtype())
                ),
            ));
        }
        if spec.ndim() != first.ndim() {
            return Err(Error::invalid(
                op,
                format!(
                    "Ndims differ, got {} and {} (position {i}): specs whose ndims differ cannot \
                     be stacked",
                    first.ndim(),
                    spec.ndim()
                ),
            ));
        }
        if spec.shape() != first.shape() {
            return Err(Error::invalid(
                op,
                format!(
                    "Shapes differ, got {} and {} (position {i}): heterogeneous specs would need \
                     a lazy stack (TorchRL's Stacked), which is not implemented",
                    ShapeFmt(first.shape()),
                    ShapeFmt(spec.shape())
                ),
            ));
        }
        if spec != first {
            return Err(Error::invalid(
                op,
                format!(
                    "the specs differ ({first} at position 0, {spec} at position {i}): \
                     heterogeneous specs would need a lazy stack (TorchRL's Stacked / \
                     StackedComposite), which is not implemented"
                ),
            ));
        }
    }
    let (mut shape, d) = common::unsqueezed(first.shape(), dim)?;
    if let Some(s) = shape.get_mut(d) {
        *s = specs.len() as i64;
    }
    let unsq = first.unsqueeze(d as i64)?;
    unsq.expand(&shape).map_err(|e| {
        Error::invalid(
            op,
            format!(
                "cannot expand the stacked spec to {}: {e}",
                tuple_fmt(&shape)
            ),
        )
    })
}
