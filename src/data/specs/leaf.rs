//! [`LeafSpec`]: what every leaf spec shares, written once.
//!
//! Each leaf spec states its shape, dtype, device and class name, how a value that passes the
//! dtype and shape rule can still fall outside its domain ([`LeafSpec::domain_violation`]), how
//! such a value is mapped in ([`LeafSpec::project_fitting`]), and how the spec is built at
//! another shape ([`LeafSpec::with_held`]). The trait's provided methods then give every leaf the
//! same `violation` / `is_in` / `check` / `project` preamble (dtype, then the shape rule, then
//! the domain), the same `zero` / `one`, and the same `squeeze` / `unsqueeze` / `expand` /
//! `index` shape rules; the public methods of each leaf struct forward to them.
//!
//! ```
//! use tch::{Kind, Tensor};
//! use torchrl::specs::{Binary, Unbounded};
//! # fn main() -> torchrl::Result<()> {
//! // the same preamble for every leaf: a wrong dtype is never in the spec
//! let x = Tensor::zeros([2, 3], (Kind::Double, tch::Device::Cpu));
//! assert!(!Unbounded::new().with_shape([3])?.is_in(&x)?);
//! assert!(!Binary::new(3)?.is_in(&x)?);
//! let err = Binary::new(3)?.check(&x, "obs").unwrap_err().to_string();
//! assert!(err.contains("\"obs\"") && err.contains("dtype mismatch"), "{err}");
//! # Ok(()) }
//! ```

use std::fmt;

use tch::{Device, Kind, Tensor};

use super::common;
use crate::error::{Error, Result, ShapeFmt};
use crate::tensordict::{AsKey, BatchIndex};

/// The shared behaviour of the leaf specs (everything but [`Composite`](super::Composite)).
pub(crate) trait LeafSpec: LeafFields + Clone + fmt::Display {
    /// True when the last dim holds the categories (OneHot, Binary, MultiCategorical,
    /// MultiOneHot): it cannot be squeezed, unsqueezed past, expanded or indexed.
    const PROTECTED_LAST: bool = false;

    /// The spec's shape.
    #[inline]
    fn spec_shape(&self) -> &[i64] {
        self.layout().0
    }

    /// The dtype values must have (`None`: any dtype).
    #[inline]
    fn spec_dtype(&self) -> Option<Kind> {
        self.layout().1
    }

    /// The spec's device.
    #[inline]
    fn spec_device(&self) -> Device {
        self.layout().2
    }

    /// Why a value whose dtype and shape fit is still outside the spec (bounds, classes, a
    /// mask), if it is. Called only after the dtype and shape checks passed.
    fn domain_violation(&self, _value: &Tensor) -> Result<Option<String>> {
        Ok(None)
    }

    /// Maps a value that is not in the spec but whose shape fits into the spec.
    fn project_fitting(&self, value: &Tensor) -> Result<Tensor>;

    /// The tensors the spec holds (bounds, a mask), each with the spec's index rows as leading
    /// dims (the whole shape, or all but a protected last dim); none by default.
    fn held(&self) -> Vec<&Tensor> {
        Vec::new()
    }

    /// The shape of the held tensors of a spec of shape `shape` (the shape itself, or
    /// `[*shape, n]` for a class mask).
    fn held_shape(&self, shape: &[i64]) -> Vec<i64> {
        shape.to_vec()
    }

    /// The same spec at `shape` holding `held` (in [`LeafSpec::held`]'s order, already of
    /// [`LeafSpec::held_shape`]). The caller has checked `shape`.
    fn with_held(&self, shape: Vec<i64>, held: Vec<Tensor>) -> Result<Self>;

    /// The shape the held tensors of a spec of shape `shape` are stored at: [`LeafSpec::held_shape`]
    /// with size 1 at dynamic (`-1`) dims (TorchRL's `_safe_shape`), so that they broadcast to
    /// any length there.
    fn held_safe_shape(&self, shape: &[i64]) -> Vec<i64> {
        common::safe_shape(&self.held_shape(shape))
    }

    /// The same spec at `shape` (same number of elements), its held tensors reshaped to match.
    fn relaid(&self, shape: Vec<i64>) -> Result<Self> {
        let target = self.held_safe_shape(&shape);
        let held = self
            .held()
            .into_iter()
            .map(|t| Ok(t.f_reshape(target.as_slice())?))
            .collect::<Result<Vec<_>>>()?;
        self.with_held(shape, held)
    }

    /// The spec expanded to `shape` (already checked against TorchRL's expand rule), its held
    /// tensors expanded to match.
    fn expanded(&self, shape: &[i64]) -> Result<Self> {
        let target = self.held_safe_shape(shape);
        let held = self
            .held()
            .into_iter()
            .map(|t| Ok(t.f_expand(target.as_slice(), false)?.f_contiguous()?))
            .collect::<Result<Vec<_>>>()?;
        self.with_held(shape.to_vec(), held)
    }

    /// Errors when the spec cannot take `dtype` beyond the kinds every leaf refuses (a class
    /// spec whose classes the dtype cannot hold exactly); any dtype by default.
    fn check_dtype(&self, _op: &'static str, _dtype: Kind) -> Result<()> {
        Ok(())
    }

    /// Writes what the repr shows after the dtype (`, low=-1, high=1`, `, n=3, masked`).
    fn fmt_extra(&self, _f: &mut fmt::Formatter<'_>) -> fmt::Result {
        Ok(())
    }

    /// The repr every leaf shares: `Class(shape=[..], dtype=Kind{extra}{, device=..})`.
    fn fmt_leaf(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (shape, dtype, device) = self.layout();
        write!(f, "{}(shape={}", Self::CLASS, ShapeFmt(shape))?;
        if let Some(k) = dtype {
            write!(f, ", dtype={k:?}")?;
        }
        self.fmt_extra(f)?;
        write!(f, "{})", common::fmt_device(device))
    }

    /// Checks a new `shape` for a spec whose last dim must stay `last` (`name` as TorchRL's
    /// message calls it: `n`, `'n'`, `sum(nvec)`); errors with [`Error::InvalidValue`] on the
    /// `shape` argument.
    fn check_last_dim(op: &'static str, shape: &[i64], name: &str, last: i64) -> Result<()> {
        common::check_shape(op, shape)?;
        if shape.last() != Some(&last) {
            return Err(Error::argument(
                op,
                "shape",
                format!(
                    "the last value of the shape to match {name} for {}",
                    Self::CLASS
                ),
                format!(
                    "{}={last} and shape={}",
                    name.trim_matches('\''),
                    ShapeFmt(shape)
                ),
            ));
        }
        Ok(())
    }

    /// The reason `value` is not in the spec: the dtype, then the shape rule, then the domain.
    #[inline]
    fn violation(&self, value: &Tensor) -> Result<Option<String>> {
        if let Some(r) = common::dtype_shape_violation(self.spec_shape(), self.spec_dtype(), value)
        {
            return Ok(Some(r));
        }
        self.domain_violation(value)
    }

    /// True when `value` is in the spec.
    #[inline]
    fn is_in(&self, value: &Tensor) -> Result<bool> {
        Ok(self.violation(value)?.is_none())
    }

    /// Like [`LeafSpec::is_in`] but errors with [`Error::NotInSpec`] naming `key` and the reason.
    #[inline]
    fn check(&self, value: &Tensor, key: impl AsKey) -> Result<()> {
        match self.violation(value)? {
            None => Ok(()),
            Some(reason) => Err(not_in_spec("check", key.to_nested_key(), self, reason)),
        }
    }

    /// The value unchanged when it is in the spec; otherwise [`LeafSpec::project_fitting`]
    /// when its shape fits (projection never reshapes), else an error.
    fn project(&self, value: &Tensor) -> Result<Tensor> {
        if self.violation(value)?.is_none() {
            return Ok(value.shallow_clone());
        }
        if !common::shape_fits(self.spec_shape(), &value.size()) {
            let reason = format!(
                "cannot project a value of shape {}: projection does not reshape",
                ShapeFmt(&value.size())
            );
            return Err(not_in_spec("project", "<value>", self, reason));
        }
        self.project_fitting(value)
    }

    /// Zeros (`false`) of shape `[*shape, *spec_shape]` (a spec without a dtype fills `Uint8`).
    fn zero(&self, shape: &[i64]) -> Result<Tensor> {
        self.filled(shape, false)
    }

    /// Ones (`true`) of shape `[*shape, *spec_shape]`.
    fn one(&self, shape: &[i64]) -> Result<Tensor> {
        self.filled(shape, true)
    }

    /// Zeros or ones of shape `[*shape, *spec_shape]`.
    fn filled(&self, shape: &[i64], one: bool) -> Result<Tensor> {
        let kind = self.spec_dtype().unwrap_or(Kind::Uint8);
        common::filled(shape, self.spec_shape(), kind, self.spec_device(), one)
    }

    /// Removes dim `dim` if it has size 1, or every size-1 dim with `None` (the protected last
    /// dim excepted).
    fn squeeze(&self, dim: Option<i64>) -> Result<Self> {
        let shape = self.spec_shape();
        let squeezed = if Self::PROTECTED_LAST {
            common::squeezed_protected(Self::CLASS, shape, dim)?
        } else {
            common::squeezed(shape, dim)?
        };
        match squeezed {
            None => Ok(self.clone()),
            Some((shape, _)) => self.relaid(shape),
        }
    }

    /// Inserts a dim of size 1 at `dim` (never after a protected last dim).
    fn unsqueeze(&self, dim: i64) -> Result<Self> {
        let (shape, _) = if Self::PROTECTED_LAST {
            common::unsqueezed_protected(Self::CLASS, self.spec_shape(), dim)?
        } else {
            common::unsqueezed(self.spec_shape(), dim)?
        };
        self.relaid(shape)
    }

    /// The spec expanded to `shape` (TorchRL's trailing-dims rule; a protected last dim must
    /// stay).
    fn expand(&self, shape: &[i64]) -> Result<Self> {
        common::check_expand(Self::CLASS, self.spec_shape(), shape)?;
        if Self::PROTECTED_LAST && shape.last() != self.spec_shape().last() {
            return Err(common::final_dim_error("expand", Self::CLASS));
        }
        self.expanded(shape)
    }

    /// The spec indexed on its dims (the leading ones when the last is protected), its held
    /// tensors indexed the same way.
    fn index(&self, idx: &[BatchIndex]) -> Result<Self> {
        let shape = self.spec_shape();
        let held = self.held();
        if Self::PROTECTED_LAST {
            let (rows, held) = common::index_dynamic(common::lead(shape), &held, idx)?;
            let last = shape.last().copied().unwrap_or(0);
            self.with_held(common::concat(&rows, &[last]), held)
        } else {
            let (shape, held) = common::index_dynamic(shape, &held, idx)?;
            self.with_held(shape, held)
        }
    }

    /// True when the shape has a dynamic (`-1`) dim.
    fn is_dynamic(&self) -> bool {
        common::is_dynamic(self.spec_shape())
    }

    /// The spec with dim `dim` dynamic (TorchRL's `make_neg_dim`, without mutating): its held
    /// tensors are narrowed to size 1 there, which needs them to be the same at every position
    /// along `dim`. A protected last dim (the categories) cannot be dynamic.
    fn make_neg_dim(&self, dim: i64) -> Result<Self> {
        let shape = self.spec_shape();
        let d = common::norm_dim("make_neg_dim", dim, shape.len())?;
        if Self::PROTECTED_LAST && d + 1 == shape.len() {
            return Err(common::final_dim_error("make_neg_dim", Self::CLASS));
        }
        if shape.get(d) == Some(&-1) {
            return Ok(self.clone());
        }
        let mut new = shape.to_vec();
        if let Some(s) = new.get_mut(d) {
            *s = -1;
        }
        let held = self
            .held()
            .into_iter()
            .map(|t| common::collapse_dim(Self::CLASS, self.held_name(), t, d))
            .collect::<Result<Vec<_>>>()?;
        self.with_held(new, held)
    }

    /// What the held tensors are, for messages (`"bounds"`, `"mask"`).
    fn held_name(&self) -> &'static str {
        "held tensors"
    }

    /// The spec at the concrete `shape` ([`common::check_resolves`]): its held tensors are
    /// expanded there.
    fn resolve_shape(&self, shape: &[i64]) -> Result<Self> {
        common::check_resolves(Self::CLASS, self.spec_shape(), shape)?;
        self.expanded(shape)
    }

    /// The spec with every dynamic dim set to `size`.
    fn resolve_dynamic(&self, size: i64) -> Result<Self> {
        let shape = common::resolved_with(self.spec_shape(), size)?;
        self.expanded(&shape)
    }

    /// The spec made dynamic at every `-1` of `shape` (the spec already has the concrete
    /// `safe_shape(shape)`): [`LeafSpec::make_neg_dim`] dim by dim.
    fn dynamic_at(self, shape: &[i64]) -> Result<Self> {
        common::check_spec_shape("with_dynamic_shape", shape)?;
        let mut out = self;
        for (d, _) in shape.iter().enumerate().filter(|(_, s)| **s == -1) {
            out = out.make_neg_dim(d as i64)?;
        }
        Ok(out)
    }

    /// The spec and its held tensors on `device`.
    fn moved_to(&self, device: Device) -> Result<Self> {
        let held = self
            .held()
            .into_iter()
            .map(|t| common::to_dev(t, device))
            .collect::<Result<Vec<_>>>()?;
        self.with_held(self.spec_shape().to_vec(), held)
    }
}

/// The fields every leaf spec has, implemented by [`leaf_spec_api`] from the struct's `shape`,
/// `dtype` and `device` fields.
pub(crate) trait LeafFields {
    /// The TorchRL class name, used in messages (`"OneHot"`).
    const CLASS: &'static str;
    /// The spec's shape, the dtype values must have (`None`: any dtype) and its device.
    fn layout(&self) -> (&[i64], Option<Kind>, Device);
}

/// A spec's `dtype` field as an optional dtype (NonTensor's may be unset).
pub(crate) trait OptKind {
    /// The dtype, if any.
    fn opt(self) -> Option<Kind>;
}

impl OptKind for Kind {
    fn opt(self) -> Option<Kind> {
        Some(self)
    }
}

impl OptKind for Option<Kind> {
    fn opt(self) -> Option<Kind> {
        self
    }
}

/// [`Error::NotInSpec`] for `spec` at `key`.
pub(crate) fn not_in_spec(
    op: &'static str,
    key: impl fmt::Display,
    spec: &impl fmt::Display,
    reason: String,
) -> Error {
    Error::NotInSpec {
        op,
        key: key.to_string(),
        spec: spec.to_string(),
        reason,
    }
}

/// The public methods every leaf spec shares, forwarding to [`LeafSpec`]: `shape`, `device`,
/// `with_device`, `to_device`, `zero`, `one`, `is_in`, `check`, `expand`, `squeeze`, `unsqueeze`,
/// `is_dynamic`, `make_neg_dim`, `resolve_shape`, `resolve_dynamic`, `Display` (see
/// [`LeafSpec::fmt_leaf`]) and `Debug` (as `Display`); and [`LeafFields`] from the struct's fields. Optional extras:
/// `dtype` (a spec with a fixed dtype), `with_dtype` (its setter, checked by
/// [`LeafSpec::check_dtype`]), `project`, `index` (a spec whose own version needs
/// nothing more than [`LeafSpec`]'s), `masked` (`n`, `mask`, `with_mask`, `update_mask` of
/// a class spec with a mask).
macro_rules! leaf_spec_api {
    ($t:ident $(; $($extra:ident),+)?) => {
        impl $crate::data::specs::leaf::LeafFields for $t {
            const CLASS: &'static str = stringify!($t);

            fn layout(&self) -> (&[i64], Option<Kind>, Device) {
                use $crate::data::specs::leaf::OptKind;
                (&self.shape, self.dtype.opt(), self.device)
            }
        }

        impl $t {
            /// Moves the spec to `device` (see `to_device`).
            pub fn with_device(self, device: Device) -> Result<Self> {
                self.to_device(device)
            }

            /// The spec (and the tensors it holds: bounds, a mask) on another device.
            pub fn to_device(&self, device: Device) -> Result<Self> {
                Ok($t {
                    device,
                    ..LeafSpec::moved_to(self, device)?
                })
            }

            /// The shape.
            pub fn shape(&self) -> &[i64] {
                &self.shape
            }

            /// The device.
            pub fn device(&self) -> Device {
                self.device
            }

            /// Zeros (`false` for bool) of shape `[*shape, *self.shape]` (size 1 at dynamic
            /// dims, as TorchRL); not necessarily in the spec (as in TorchRL).
            pub fn zero(&self, shape: &[i64]) -> Result<Tensor> {
                LeafSpec::zero(self, shape)
            }

            /// Ones (`true` for bool) of shape `[*shape, *self.shape]` (size 1 at dynamic dims);
            /// not necessarily in the spec (as in TorchRL).
            pub fn one(&self, shape: &[i64]) -> Result<Tensor> {
                LeafSpec::one(self, shape)
            }

            /// True when `value` is in the spec: its dtype matches, its shape fits (the shape
            /// rule of [`crate::data::specs`]) and its values are in the spec's domain (see the type's
            /// docs).
            pub fn is_in(&self, value: &Tensor) -> Result<bool> {
                LeafSpec::is_in(self, value)
            }

            #[doc = concat!("Like [`", stringify!($t), "::is_in`] but errors with ")]
            /// [`Error::NotInSpec`](crate::Error::NotInSpec) naming `key`, the spec and the
            /// reason (for a domain violation: how many values are out and the first one).
            pub fn check(&self, value: &Tensor, key: impl AsKey) -> Result<()> {
                LeafSpec::check(self, value, key)
            }

            /// The spec expanded to `shape` (TorchRL's rule: the trailing dims of `shape` equal
            /// the spec's, or the spec dim is 1; a last dim holding categories must stay). A
            /// dynamic (`-1`) dim stays dynamic (`shape` has `-1` there); other dims of `shape`
            /// are `>= 0`.
            pub fn expand(&self, shape: &[i64]) -> Result<Self> {
                LeafSpec::expand(self, shape)
            }

            /// True when the shape has a dynamic (`-1`) dim, one of any length (see
            /// [`crate::data::specs`], "Dynamic dims").
            pub fn is_dynamic(&self) -> bool {
                LeafSpec::is_dynamic(self)
            }

            /// The spec with dim `dim` dynamic (`-1`), TorchRL's `make_neg_dim` returning a new
            /// spec. Held bounds or masks keep one row there, so they must be the same at every
            /// position along `dim` (else an error); a last dim holding categories cannot be
            /// dynamic.
            pub fn make_neg_dim(&self, dim: i64) -> Result<Self> {
                LeafSpec::make_neg_dim(self, dim)
            }

            /// The spec at the concrete `shape`: same ndim, equal at every fixed dim, any size
            /// `>= 0` at a dynamic dim (held bounds or masks are broadcast there). Use it to draw
            /// (`rand`, `zero`) at a chosen length.
            pub fn resolve_shape(&self, shape: &[i64]) -> Result<Self> {
                LeafSpec::resolve_shape(self, shape)
            }

            /// The spec with every dynamic (`-1`) dim set to `size` (`>= 0`); a spec without
            /// dynamic dims is returned as is.
            pub fn resolve_dynamic(&self, size: i64) -> Result<Self> {
                LeafSpec::resolve_dynamic(self, size)
            }

            /// Removes dim `dim` if it has size 1, or every size-1 dim with `None` (a 1-d spec
            /// is left as is, like TorchRL; a last dim holding categories is never removed).
            pub fn squeeze(&self, dim: Option<i64>) -> Result<Self> {
                LeafSpec::squeeze(self, dim)
            }

            /// Inserts a dim of size 1 at `dim` (never after a last dim holding categories).
            pub fn unsqueeze(&self, dim: i64) -> Result<Self> {
                LeafSpec::unsqueeze(self, dim)
            }
        }
        impl std::fmt::Display for $t {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                LeafSpec::fmt_leaf(self, f)
            }
        }
        $($($crate::data::specs::leaf::leaf_spec_api!(@ $extra $t);)+)?
        $crate::data::specs::leaf::debug_as_display!($t);
    };
    (@ dtype $t:ident) => {
        impl $t {
            /// The dtype.
            pub fn dtype(&self) -> Kind {
                self.dtype
            }
        }
    };
    (@ with_dtype $t:ident) => {
        impl $t {
            /// Sets the dtype. Errors on complex or quantized kinds, and for a class spec on a
            /// kind that cannot hold every class exactly (see the type's docs).
            pub fn with_dtype(mut self, dtype: Kind) -> Result<Self> {
                let op = concat!(stringify!($t), "::with_dtype");
                $crate::data::specs::common::check_kind(op, dtype)?;
                LeafSpec::check_dtype(&self, op, dtype)?;
                self.dtype = dtype;
                Ok(self)
            }
        }
    };
    (@ project $t:ident) => {
        impl $t {
            /// The value unchanged when it is in the spec; otherwise the value mapped into the
            /// spec (see the type's docs) and cast to its dtype. The shape must fit: projection
            /// never reshapes.
            pub fn project(&self, value: &Tensor) -> Result<Tensor> {
                LeafSpec::project(self, value)
            }
        }
    };
    (@ dynamic_shape $t:ident) => {
        impl $t {
            /// Like `with_shape`, where each `-1` dim of `shape` is dynamic (any length; see
            /// [`crate::data::specs`], "Dynamic dims"): the spec is set to `shape` with size 1 there,
            /// then [`make_neg_dim`](Self::make_neg_dim) marks those dims. Errors on dims below
            /// -1 and on a `-1` last dim that holds the categories.
            pub fn with_dynamic_shape(self, shape: impl AsRef<[i64]>) -> Result<Self> {
                let shape = shape.as_ref();
                $crate::data::specs::common::check_spec_shape("with_dynamic_shape", shape)?;
                self.with_shape($crate::data::specs::common::safe_shape(shape))?
                    .dynamic_at(shape)
            }
        }
    };
    (@ masked $t:ident) => {
        impl $t {
            /// `n` classes at `shape` with `dtype`, on the CPU, no mask; errors under `op` when
            /// `n < 1`.
            fn of_classes(op: &'static str, n: i64, shape: Vec<i64>, dtype: Kind) -> Result<Self> {
                if n < 1 {
                    return Err(Error::argument(op, "n", "n >= 1", n.to_string()));
                }
                Ok($t {
                    n,
                    shape,
                    dtype,
                    device: Device::Cpu,
                    mask: None,
                })
            }

            /// The number of classes.
            pub fn n(&self) -> i64 {
                self.n
            }

            /// The mask of allowed classes, expanded to the spec's mask shape (`[*shape, n]`
            /// for a Categorical, the shape for a OneHot; size 1 at dynamic dims), if any.
            pub fn mask(&self) -> Option<&Tensor> {
                self.mask.as_deref()
            }

            /// Sets the mask of allowed classes (see `update_mask`).
            pub fn with_mask(mut self, mask: Tensor) -> Result<Self> {
                self.update_mask(Some(mask))?;
                Ok(self)
            }

            /// Sets (`Some`) or clears (`None`) the mask: a bool tensor that broadcasts to the
            /// spec's mask shape, `false` excluding a class. On error the spec is unchanged.
            pub fn update_mask(&mut self, mask: Option<Tensor>) -> Result<()> {
                self.mask = match mask {
                    None => None,
                    Some(m) => Some(self.prepared_mask(concat!(stringify!($t), "::update_mask"), &m)?),
                };
                Ok(())
            }

            /// `mask` checked and expanded to the spec's mask shape, on the spec's device.
            fn prepared_mask(
                &self,
                op: &'static str,
                mask: &Tensor,
            ) -> Result<$crate::data::specs::common::SpecTensor> {
                let target = LeafSpec::held_safe_shape(self, &self.shape);
                $crate::data::specs::common::prepare_mask(op, mask, &target, self.n, self.device)
            }
        }
    };
    (@ index $t:ident) => {
        impl $t {
            /// The spec indexed on its dims like a tensor of its shape (on the leading dims
            /// when the last one holds categories); held tensors (bounds, a mask) are indexed
            /// the same way.
            pub fn index(&self, idx: &[BatchIndex]) -> Result<Self> {
                LeafSpec::index(self, idx)
            }
        }
    };
}
pub(crate) use leaf_spec_api;

/// `Debug` as `Display` for spec types (their `Display` is their TorchRL-like repr).
macro_rules! debug_as_display {
    ($($t:ty),+ $(,)?) => {$(
        impl std::fmt::Debug for $t {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                std::fmt::Display::fmt(self, f)
            }
        }
    )+};
}
pub(crate) use debug_as_display;
