//! Tensor specs: what an environment reads and writes, as TorchRL's `TensorSpec` family.
//!
//! A spec describes a tensor's shape, dtype, device and domain, and can draw samples in it
//! (`rand`, seeded through a [`Generator`]), build placeholders (`zero`, `one`), test values
//! (`is_in`, `check` with a reason), and map values into it (`project`). Leaf specs:
//!
//! | spec | domain | default shape / dtype |
//! |---|---|---|
//! | [`Unbounded`] | any value of the dtype | `[1]` / `Float` |
//! | [`Bounded`] | `low <= x <= high`, elementwise | explicit / `Float` |
//! | [`Categorical`] | class indices `0..n`, optional mask | `[]` / `Int64` |
//! | [`OneHot`] | one-hot along the last dim (`== n`) | `[n]` / `Bool` |
//! | [`Binary`] | 0/1 vectors | `[n]` / `Int8` |
//! | [`MultiCategorical`] | entry `i` in `0..nvec[i]` | `[len(nvec)]` / `Int64` |
//! | [`MultiOneHot`] | one-hot groups of widths `nvec` | `[sum(nvec)]` / `Bool` |
//! | [`NonTensor`] | a placeholder for non-tensor data | `[1]` / none |
//!
//! [`Composite`] nests specs by key, like a [`TensorDict`](crate::TensorDict) nests tensors; its
//! shape plays the role of the batch size. [`TensorSpec`] is the enum over all of them, and
//! [`stack_specs`] stacks identical specs along a new dim.
//!
//! **Shape rule of `is_in` / `check`** (TorchRL's, for every leaf): a value fits a spec of shape
//! `S` when broadcasting `S` against the value's shape gives the value's shape, i.e. extra leading
//! batch dims are allowed and spec dims of size 1 broadcast. A value of the wrong dtype or of a
//! shape that does not fit is not in the spec (`Ok(false)`; TorchRL's `Unbounded.is_in` raises
//! for non-broadcastable shapes instead); devices are not compared.
//!
//! **Projection** changes a value only when it is not in the spec, and casts it to the spec's
//! dtype, so that `is_in(project(x))` holds whenever `x`'s shape fits (TorchRL keeps the value's
//! dtype). It never reshapes. Discrete specs project deterministically (nearest allowed class,
//! argmax), where TorchRL samples at random. NaN has no nearest value: it projects to the lowest
//! one (`low` for [`Bounded`], class 0 for [`Categorical`], [`MultiCategorical`] and
//! [`Binary`]), and a NaN score never wins the argmax of [`OneHot`] / [`MultiOneHot`]; ±inf
//! clamp to the bounds. Only [`NonTensor`] (and a mask allowing no class) refuses with an
//! error.
//!
//! **Dynamic dims.** A dim of `-1` in a leaf's shape means "any length" (TorchRL's "variable
//! number of elements"), e.g. the `[B, -1]` tokens of a response or the `(*batch, -1, 1)` reward
//! of an LLM env. Dynamic dims are asked for explicitly: `with_dynamic_shape([B, -1])` (every
//! leaf) or `make_neg_dim(dim)` (TorchRL's name); `with_shape`, `Bounded::new` and `expand` keep
//! refusing negative dims, where TorchRL's constructors take `-1` directly. As in TorchRL 0.14:
//! - `is_in` / `check` / `project` accept any size (`0` included) at a dynamic dim; every other
//!   dim follows the shape rule above.
//! - `rand`, `zero` and `one` build size 1 there (TorchRL's `_safe_shape`; its `OneHot` and
//!   `MultiOneHot` `rand` raise instead). To draw at a chosen length, resolve the spec first:
//!   `resolve_shape(&[B, 7])` (leaves) or `resolve_dynamic(7)` (any spec, a Composite's leaves).
//! - Held tensors ([`Bounded`]'s bounds, a class mask) have size 1 at dynamic dims and broadcast
//!   along them: dynamic dims have the same bounds / mask at every position.
//!   [`Unbounded::make_neg_dim`] (TorchRL's `make_neg_dim`, on every leaf) makes a dim dynamic
//!   and errors when the held tensors differ along it.
//! - `expand` keeps a dynamic dim dynamic (the target has `-1` there; expanding it to a size is
//!   an error, as in TorchRL) and adds fixed leading dims. TorchRL would also turn a new
//!   leading or a size-1 dim into `-1`; use `make_neg_dim` for that.
//! - `index` keeps a dynamic dim under a full slice or `...`, removes it under an integer and
//!   replaces it under an index tensor; a partial slice or a mask over it is an error (its
//!   extent is unknown), as TorchRL's `_shape_indexing`.
//! - `squeeze` never removes a dynamic dim (it is not of size 1); `unsqueeze`, `==`,
//!   [`stack_specs`] (of identical specs) and `Display` (`shape=[-1, 3]`) treat `-1` as any
//!   other size. `encode` needs a concrete shape.
//! - A [`Composite`]'s own shape (its batch size) stays fixed: its leaves may have dynamic
//!   feature dims after the batch dims (TorchRL would also allow a `-1` batch dim).
//! - `is_dynamic()` tells whether a spec (or a Composite's leaf) has a dynamic dim.
//!
//! ```
//! use tch::{Device, Kind, Tensor};
//! use torchrl::specs::{Bounded, Composite, Unbounded};
//! use torchrl::Generator;
//! # fn main() -> torchrl::Result<()> {
//! let spec = Unbounded::new().with_dynamic_shape([2, -1])?;
//! assert!(spec.is_dynamic());
//! for len in [0, 1, 7] {
//!     assert!(spec.is_in(&Tensor::zeros([2, len], (Kind::Float, Device::Cpu)))?);
//! }
//! assert!(!spec.is_in(&Tensor::zeros([3, 7], (Kind::Float, Device::Cpu)))?, "fixed dim differs");
//! assert_eq!(spec.zero(&[])?.size(), vec![2, 1], "size 1 at the dynamic dim, as TorchRL");
//! assert_eq!(spec.expand(&[4, 2, -1])?.shape(), &[4, 2, -1]);
//! assert!(spec.expand(&[2, 5]).is_err(), "a dynamic dim stays dynamic");
//! // draw at a chosen length
//! let b = Bounded::new(0.0, 1.0, [2, 1])?.make_neg_dim(1)?;
//! let x = b.resolve_shape(&[2, 5])?.rand(&mut Generator::new(0), &[])?;
//! assert_eq!(x.size(), vec![2, 5]);
//! assert!(b.is_in(&x)?);
//! // a Composite keeps its batch dims fixed; its leaves may be dynamic
//! let c = Composite::new([2])?.with("tokens", spec)?;
//! assert!(c.is_dynamic());
//! let td = c.resolve_dynamic(3)?.rand(&mut Generator::new(0), &[])?;
//! assert_eq!(td.get("tokens").map(|t| t.size()), Some(vec![2, 3]));
//! assert!(c.is_in(&td)?);
//! # Ok(()) }
//! ```
//!
//! **Sampling** draws on the CPU from a seedable [`Generator`] and moves the result to the spec's
//! device: the same seed gives bit-identical samples on every device.
//!
//! ```
//! use tch::Kind;
//! use torchrl::specs::{Bounded, Categorical, Composite, TensorSpec, Unbounded};
//! use torchrl::Generator;
//! # fn main() -> torchrl::Result<()> {
//! let spec = Composite::new([4])?
//!     .with("observation", Bounded::new(-1.0, 1.0, [4, 3])?)?
//!     .with("action", Categorical::new(2)?.with_shape([4])?)?
//!     .with(("next", "reward"), Unbounded::new().with_shape([4, 1])?)?;
//! let td = spec.rand(&mut Generator::new(0), &[])?;
//! assert_eq!(td.batch_size(), &[4]);
//! assert!(spec.is_in(&td)?);
//! assert_eq!(spec.get(("next", "reward")).map(|s| s.shape().to_vec()), Some(vec![4, 1]));
//! let leaf: TensorSpec = Unbounded::new().with_dtype(Kind::Double)?.into();
//! assert_eq!(leaf.dtype(), Some(Kind::Double));
//! # Ok(()) }
//! ```

mod binary;
mod bounded;
mod categorical;
mod classes;
mod common;
mod composite;
mod conversions;
mod leaf;
mod multi_categorical;
mod multi_one_hot;
mod non_tensor;
mod one_hot;
mod stack;
mod unbounded;

use std::fmt;

use tch::{Device, Kind, Tensor};

pub use binary::Binary;
pub use bounded::Bounded;
pub use categorical::Categorical;
pub use composite::{Composite, Recurse};
pub use multi_categorical::MultiCategorical;
pub use multi_one_hot::MultiOneHot;
pub use non_tensor::NonTensor;
pub use one_hot::OneHot;
pub use stack::stack_specs;
pub use unbounded::Unbounded;

use crate::error::{Error, Result, ShapeFmt};
use crate::rng::Generator;
use crate::tensordict::{AsKey, BatchIndex, Entry};
use leaf::LeafSpec;

/// Any spec: one of the leaf specs, or a [`Composite`] of specs.
///
/// The methods dispatch to the variant; the leaf structs have the same methods with concrete
/// types (`Tensor` instead of [`Entry`]).
#[derive(Clone, PartialEq)]
pub enum TensorSpec {
    /// See [`Unbounded`].
    Unbounded(Unbounded),
    /// See [`Bounded`].
    Bounded(Bounded),
    /// See [`Categorical`].
    Categorical(Categorical),
    /// See [`OneHot`].
    OneHot(OneHot),
    /// See [`Binary`].
    Binary(Binary),
    /// See [`MultiCategorical`].
    MultiCategorical(MultiCategorical),
    /// See [`MultiOneHot`].
    MultiOneHot(MultiOneHot),
    /// See [`NonTensor`].
    NonTensor(NonTensor),
    /// See [`Composite`].
    Composite(Composite),
}

macro_rules! from_leaf {
    ($($v:ident),+) => {$(
        impl From<$v> for TensorSpec {
            fn from(value: $v) -> Self {
                TensorSpec::$v(value)
            }
        }
    )+};
}
from_leaf!(
    Unbounded,
    Bounded,
    Categorical,
    OneHot,
    Binary,
    MultiCategorical,
    MultiOneHot,
    NonTensor,
    Composite
);

/// Applies `$e` to the leaf inside `$self` (bound as `$s`), or evaluates `$c` for a Composite.
macro_rules! dispatch {
    ($self:expr, $s:ident => $e:expr, $c:ident => $ce:expr) => {
        match $self {
            TensorSpec::Unbounded($s) => $e,
            TensorSpec::Bounded($s) => $e,
            TensorSpec::Categorical($s) => $e,
            TensorSpec::OneHot($s) => $e,
            TensorSpec::Binary($s) => $e,
            TensorSpec::MultiCategorical($s) => $e,
            TensorSpec::MultiOneHot($s) => $e,
            TensorSpec::NonTensor($s) => $e,
            TensorSpec::Composite($c) => $ce,
        }
    };
}

/// Like `dispatch!`, rewrapping a leaf result into the same variant.
macro_rules! map_spec {
    ($self:expr, $s:ident => $e:expr) => {
        Ok(match $self {
            TensorSpec::Unbounded($s) => TensorSpec::Unbounded($e?),
            TensorSpec::Bounded($s) => TensorSpec::Bounded($e?),
            TensorSpec::Categorical($s) => TensorSpec::Categorical($e?),
            TensorSpec::OneHot($s) => TensorSpec::OneHot($e?),
            TensorSpec::Binary($s) => TensorSpec::Binary($e?),
            TensorSpec::MultiCategorical($s) => TensorSpec::MultiCategorical($e?),
            TensorSpec::MultiOneHot($s) => TensorSpec::MultiOneHot($e?),
            TensorSpec::NonTensor($s) => TensorSpec::NonTensor($e?),
            TensorSpec::Composite($s) => TensorSpec::Composite($e?),
        })
    };
}

impl TensorSpec {
    /// The TorchRL class name: `"Unbounded"`, `"Bounded"`, …, `"Composite"`.
    pub fn class_name(&self) -> &'static str {
        match self {
            TensorSpec::Unbounded(_) => "Unbounded",
            TensorSpec::Bounded(_) => "Bounded",
            TensorSpec::Categorical(_) => "Categorical",
            TensorSpec::OneHot(_) => "OneHot",
            TensorSpec::Binary(_) => "Binary",
            TensorSpec::MultiCategorical(_) => "MultiCategorical",
            TensorSpec::MultiOneHot(_) => "MultiOneHot",
            TensorSpec::NonTensor(_) => "NonTensor",
            TensorSpec::Composite(_) => "Composite",
        }
    }

    /// The shape (for a Composite, its batch shape).
    pub fn shape(&self) -> &[i64] {
        dispatch!(self, s => s.shape(), c => c.shape())
    }

    /// Number of dims of the shape.
    pub fn ndim(&self) -> usize {
        self.shape().len()
    }

    /// The dtype; `None` for a Composite and for a NonTensor without one.
    pub fn dtype(&self) -> Option<Kind> {
        match self {
            TensorSpec::Unbounded(s) => Some(s.dtype()),
            TensorSpec::Bounded(s) => Some(s.dtype()),
            TensorSpec::Categorical(s) => Some(s.dtype()),
            TensorSpec::OneHot(s) => Some(s.dtype()),
            TensorSpec::Binary(s) => Some(s.dtype()),
            TensorSpec::MultiCategorical(s) => Some(s.dtype()),
            TensorSpec::MultiOneHot(s) => Some(s.dtype()),
            TensorSpec::NonTensor(s) => s.dtype(),
            TensorSpec::Composite(_) => None,
        }
    }

    /// The device; leaves always have one, a Composite may have none.
    pub fn device(&self) -> Option<Device> {
        dispatch!(self, s => Some(s.device()), c => c.device())
    }

    /// True for discrete leaves: the categorical family, and Unbounded / Bounded with an
    /// integer or bool dtype.
    pub fn is_discrete(&self) -> bool {
        match self {
            TensorSpec::Unbounded(s) => s.is_discrete(),
            TensorSpec::Bounded(s) => s.is_discrete(),
            TensorSpec::Categorical(_)
            | TensorSpec::OneHot(_)
            | TensorSpec::Binary(_)
            | TensorSpec::MultiCategorical(_)
            | TensorSpec::MultiOneHot(_) => true,
            TensorSpec::NonTensor(_) | TensorSpec::Composite(_) => false,
        }
    }

    /// True for a [`Composite`].
    pub fn is_composite(&self) -> bool {
        matches!(self, TensorSpec::Composite(_))
    }

    /// The Composite, if this is one.
    pub fn as_composite(&self) -> Option<&Composite> {
        match self {
            TensorSpec::Composite(c) => Some(c),
            _ => None,
        }
    }

    /// The Composite, mutably, if this is one.
    pub fn as_composite_mut(&mut self) -> Option<&mut Composite> {
        match self {
            TensorSpec::Composite(c) => Some(c),
            _ => None,
        }
    }

    /// A random sample: a tensor of shape `[*shape, *self.shape]` for a leaf, a tensordict with
    /// batch size `[*shape, *self.shape]` for a Composite. Always `is_in` the spec.
    pub fn rand(&self, gen: &mut Generator, shape: &[i64]) -> Result<Entry> {
        dispatch!(self, s => Ok(Entry::Tensor(s.rand(gen, shape)?)), c => Ok(Entry::Dict(c.rand(gen, shape)?)))
    }

    /// Zeros (`false` for bool) with the shapes of [`TensorSpec::rand`]; not necessarily in the
    /// spec (e.g. a Bounded spec excluding 0), as in TorchRL.
    pub fn zero(&self, shape: &[i64]) -> Result<Entry> {
        dispatch!(self, s => Ok(Entry::Tensor(s.zero(shape)?)), c => Ok(Entry::Dict(c.zero(shape)?)))
    }

    /// Ones (`true` for bool) with the shapes of [`TensorSpec::rand`].
    pub fn one(&self, shape: &[i64]) -> Result<Entry> {
        dispatch!(self, s => Ok(Entry::Tensor(s.one(shape)?)), c => Ok(Entry::Dict(c.one(shape)?)))
    }

    /// The reason a tensor is not in a leaf spec (a Composite never holds a tensor).
    pub(crate) fn violation(&self, value: &Tensor) -> Result<Option<String>> {
        dispatch!(self, s => LeafSpec::violation(s, value), _c => Ok(Some(format!(
            "expected a tensordict (a nested level), got a tensor of shape {} and dtype {:?}",
            ShapeFmt(&value.size()),
            value.kind()
        ))))
    }

    /// True when `value` is in the spec (see the module docs for the shape rule). A tensor for
    /// a Composite or a tensordict for a leaf gives `Ok(false)`. For a Composite, a missing key
    /// is an error ([`Composite::is_in`]).
    pub fn is_in(&self, value: &Entry) -> Result<bool> {
        match (self, value) {
            (TensorSpec::Composite(c), Entry::Dict(d)) => c.is_in(d),
            (TensorSpec::Composite(_), Entry::Tensor(_)) => Ok(false),
            (_, Entry::Dict(_)) => Ok(false),
            (leaf, Entry::Tensor(t)) => Ok(leaf.violation(t)?.is_none()),
        }
    }

    /// Like [`TensorSpec::is_in`] but errors with [`Error::NotInSpec`] naming `key`, the spec
    /// and the reason (or [`Error::KeyNotFound`] for a key missing under a Composite).
    pub fn check(&self, value: &Entry, key: impl AsKey) -> Result<()> {
        let key = key.to_nested_key();
        match (self, value) {
            (TensorSpec::Composite(c), Entry::Dict(d)) => c.check_at(d, &key),
            (spec, Entry::Dict(d)) => Err(Error::NotInSpec {
                op: "check",
                key: key.to_string(),
                spec: spec.to_string(),
                reason: format!(
                    "expected a tensor, got a tensordict with batch size {}",
                    ShapeFmt(d.batch_size())
                ),
            }),
            (spec, Entry::Tensor(t)) => match spec.violation(t)? {
                None => Ok(()),
                Some(reason) => Err(Error::NotInSpec {
                    op: "check",
                    key: key.to_string(),
                    spec: spec.to_string(),
                    reason,
                }),
            },
        }
    }

    /// Maps `value` into the spec, changing it only when it is not already in (see each
    /// spec's `project`). The kind of entry must match the spec.
    pub fn project(&self, value: &Entry) -> Result<Entry> {
        match (self, value) {
            (TensorSpec::Composite(c), Entry::Dict(d)) => Ok(Entry::Dict(c.project(d)?)),
            (TensorSpec::Composite(_), Entry::Tensor(_)) | (_, Entry::Dict(_)) => {
                Err(Error::NotInSpec {
                    op: "project",
                    key: "<value>".into(),
                    spec: self.to_string(),
                    reason: format!("cannot project {} onto this spec", value.kind_name()),
                })
            }
            (spec, Entry::Tensor(t)) => Ok(Entry::Tensor(dispatch!(
                spec,
                s => s.project(t)?,
                _c => t.shallow_clone()
            ))),
        }
    }

    /// A tensor of the spec's dtype and shape built from `values` (row-major). For [`OneHot`]
    /// and [`MultiOneHot`] the values are class indices. Errors for a Composite.
    pub fn encode(&self, values: &[f64]) -> Result<Tensor> {
        dispatch!(self, s => s.encode(values), _c => Err(Error::invalid(
            "encode",
            "a Composite cannot encode a flat list of numbers; encode its leaves one by one",
        )))
    }

    /// The spec expanded to `shape` (TorchRL's rule: the trailing dims of `shape` equal the
    /// spec's shape, or the spec dim is 1).
    pub fn expand(&self, shape: &[i64]) -> Result<Self> {
        map_spec!(self, s => s.expand(shape))
    }

    /// The spec indexed on its (leading) dims like a tensor of its shape; [`OneHot`],
    /// [`Binary`], [`MultiCategorical`] and [`MultiOneHot`] protect their last dim.
    pub fn index(&self, idx: &[BatchIndex]) -> Result<Self> {
        map_spec!(self, s => s.index(idx))
    }

    /// Removes size-1 dims (see each spec's `squeeze`).
    pub fn squeeze(&self, dim: Option<i64>) -> Result<Self> {
        map_spec!(self, s => s.squeeze(dim))
    }

    /// Inserts a size-1 dim at `dim`.
    pub fn unsqueeze(&self, dim: i64) -> Result<Self> {
        map_spec!(self, s => s.unsqueeze(dim))
    }

    /// True when the spec (for a Composite: one of its leaves) has a dynamic (`-1`) dim.
    pub fn is_dynamic(&self) -> bool {
        dispatch!(self, s => s.is_dynamic(), c => c.is_dynamic())
    }

    /// The leaf spec with dim `dim` dynamic (see each leaf's `make_neg_dim`). Errors for a
    /// Composite: its dims (the batch size) stay fixed.
    pub fn make_neg_dim(&self, dim: i64) -> Result<Self> {
        dispatch!(self, s => Ok(s.make_neg_dim(dim)?.into()), c => Err(Error::argument(
            "make_neg_dim",
            "spec",
            "a leaf spec (a Composite's dims, its batch size, stay fixed)",
            format!("a Composite of shape {}", ShapeFmt(c.shape())),
        )))
    }

    /// The leaf spec at the concrete `shape` (see each leaf's `resolve_shape`). Errors for a
    /// Composite (use [`TensorSpec::resolve_dynamic`]).
    pub fn resolve_shape(&self, shape: &[i64]) -> Result<Self> {
        dispatch!(self, s => Ok(s.resolve_shape(shape)?.into()), c => Err(Error::argument(
            "resolve_shape",
            "spec",
            "a leaf spec (a Composite resolves its leaves with resolve_dynamic)",
            format!("a Composite of shape {}", ShapeFmt(c.shape())),
        )))
    }

    /// The spec with every dynamic (`-1`) dim set to `size` (a Composite: in every leaf).
    pub fn resolve_dynamic(&self, size: i64) -> Result<Self> {
        map_spec!(self, s => s.resolve_dynamic(size))
    }

    /// The spec on another device (a Composite moves every leaf).
    pub fn to_device(&self, device: Device) -> Result<Self> {
        map_spec!(self, s => s.to_device(device))
    }
}

impl fmt::Display for TensorSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        dispatch!(self, s => fmt::Display::fmt(s, f), c => fmt::Display::fmt(c, f))
    }
}

impl fmt::Debug for TensorSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}
