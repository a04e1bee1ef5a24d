//! `UnsqueezeTransform`: inserts a size-1 dim into entries coming out of the env, and (with
//! inverse keys) squeezes it out of entries going in.
//!
//! - **Dim.** A non-negative `dim` counts among the **feature** dims, after the batch dims
//!   (`0` puts the new dim right after them, whatever the batch size); a negative `dim` counts
//!   from the end of the result (`-1` appends a trailing dim). A dim that would land inside the
//!   batch dims, or past the end, is an error naming the key and its shape. TorchRL needs
//!   `allow_positive_dim=True` for non-negative dims and maps them the same way; here they are
//!   always allowed. On data, the batch dims are those of the tensordict being transformed (the
//!   env's at step and reset).
//! - **Specs.** The spec of each in key (in the done, reward or observation spec) is unsqueezed
//!   (a `Bounded` spec's bounds too) and written at its out key (default: the in key) in the same
//!   group. For inverse keys the parent-side action / state spec (`in_keys_inv`) is unsqueezed
//!   and registered at the policy-side key (`out_keys_inv`).
//! - **Data.** `step`, `reset` and `forward` unsqueeze; the inverse squeezes `out_keys_inv` into
//!   `in_keys_inv` and errors when the dim does not have size 1 (`torch.squeeze` would silently
//!   do nothing).
//!
//! ```
//! use torchrl::envs::builtin::CountingEnv;
//! use torchrl::envs::transforms::{TransformedEnv, UnsqueezeTransform};
//! use torchrl::{EnvBase, RolloutConfig};
//! # fn main() -> torchrl::Result<()> {
//! let mut env = TransformedEnv::new(CountingEnv::new(5, &[4])?)?
//!     .with(UnsqueezeTransform::new(-1, ["observation"]))?
//!     .with(UnsqueezeTransform::inverse(0, ["action"]))?;
//! assert_eq!(env.specs().observation.get("observation").map(|s| s.shape().to_vec()), Some(vec![4, 1, 1]));
//! assert_eq!(env.specs().action.get("action").map(|s| s.shape().to_vec()), Some(vec![4, 1, 1]));
//! let traj = env.rollout(3, None, &RolloutConfig::default())?;
//! assert_eq!(traj.get_or_err(("next", "observation"))?.size(), [4, 3, 1, 1]);
//! # Ok(()) }
//! ```

use super::reward_sum::{refuse_state_keys, IN_PLACE};
use super::{added_keys, map_input_specs, missing_key, output_keys_available, KeyMap, Transform};
use crate::data::specs::TensorSpec;
use crate::envs::EnvSpecs;
use crate::error::{Error, Result, ShapeFmt};
use crate::macros::setters;
use crate::tensordict::{collect_keys, fmt_key_list};
use crate::tensordict::{NestedKey, TensorDict};

const OP: &str = "UnsqueezeTransform";

/// Inserts a size-1 dim. See the module docs.
pub struct UnsqueezeTransform {
    dim: i64,
    keys: KeyMap,
    keys_inv: KeyMap,
}

impl UnsqueezeTransform {
    /// Unsqueezes `in_keys` at `dim` (see the module docs for the meaning of `dim`).
    pub fn new<K: Into<NestedKey>>(dim: i64, in_keys: impl IntoIterator<Item = K>) -> Self {
        UnsqueezeTransform {
            dim,
            keys: KeyMap::new(collect_keys(in_keys)),
            keys_inv: KeyMap::default(),
        }
    }

    /// Only inverse keys: the policy gives `in_keys_inv` with an extra size-1 dim at `dim`,
    /// squeezed out before the parent sees them.
    pub fn inverse<K: Into<NestedKey>>(dim: i64, in_keys_inv: impl IntoIterator<Item = K>) -> Self {
        UnsqueezeTransform::new(dim, Vec::<NestedKey>::new()).with_in_keys_inv(in_keys_inv)
    }

    /// The dim.
    pub fn dim(&self) -> i64 {
        self.dim
    }

    fn pairs(&self) -> Result<Vec<(NestedKey, NestedKey)>> {
        self.keys.pairs(OP, self, "")
    }

    fn pairs_inv(&self) -> Result<Vec<(NestedKey, NestedKey)>> {
        self.keys_inv.pairs(OP, self, "inverse ")
    }

    /// The index of the new dim in a shape of `ndim` dims (after unsqueezing) whose first `nb`
    /// are batch dims; `None` when it would fall among the batch dims or past the end.
    fn inserted_dim(&self, nb: usize, ndim: usize) -> Option<usize> {
        let (nb, ndim) = (nb as i64, ndim as i64);
        let p = if self.dim >= 0 {
            nb + self.dim
        } else {
            ndim + self.dim
        };
        (nb..ndim).contains(&p).then_some(p as usize)
    }

    /// Where the new dim goes in a shape of `ndim` dims (before unsqueezing) whose first `nb`
    /// are batch dims.
    fn position(&self, nb: usize, shape: &[i64], key: &NestedKey) -> Result<usize> {
        self.inserted_dim(nb, shape.len() + 1).ok_or_else(|| {
            let (ndim, nb_i) = (shape.len() as i64, nb as i64);
            Error::value(
                OP,
                key,
                format!(
                    "a dim that fits its shape {} ({nb} batch dims): the new dim must go after \
                     the batch dims, i.e. dim in [0, {}] or [{}, -1]",
                    ShapeFmt(shape),
                    ndim - nb_i,
                    nb_i - ndim - 1
                ),
                format!("{}: dim {}, which does not fit", self.name(), self.dim),
            )
        })
    }

    /// Where the dim to squeeze is in a shape (already unsqueezed) with `nb` batch dims.
    fn squeeze_position(&self, nb: usize, shape: &[i64], key: &NestedKey) -> Result<usize> {
        let p = self.inserted_dim(nb, shape.len()).ok_or_else(|| {
            Error::value(
                OP,
                key,
                format!(
                    "a dim that fits its shape {} ({nb} batch dims) for the inverse squeeze",
                    ShapeFmt(shape)
                ),
                format!("{}: dim {}, which does not fit", self.name(), self.dim),
            )
        })?;
        if shape.get(p) != Some(&1) {
            return Err(Error::value(
                OP,
                key,
                format!("a size-1 dim {p} for {} to squeeze out", self.name()),
                format!("shape {}, whose dim {p} is not 1", ShapeFmt(shape)),
            ));
        }
        Ok(p)
    }

    fn unsqueeze_spec(&self, nb: usize, key: &NestedKey, spec: &TensorSpec) -> Result<TensorSpec> {
        if spec.is_composite() {
            return Err(Error::value(
                OP,
                key,
                format!("a leaf spec for {}", self.name()),
                "a nested spec",
            ));
        }
        let p = self.position(nb, spec.shape(), key)?;
        spec.unsqueeze(p as i64)
    }

    fn unsqueeze_data(&self, td: &mut TensorDict, tolerant: bool, op: &'static str) -> Result<()> {
        let nb = td.batch_dims();
        for (src, dst) in self.pairs()? {
            let v = match td.get(&src) {
                Some(v) => {
                    let p = self.position(nb, &v.size(), &src)?;
                    v.f_unsqueeze(p as i64)?
                }
                None if tolerant => continue,
                None => return Err(missing_key(op, td, &src)),
            };
            td.set(&dst, v)?;
        }
        Ok(())
    }
}

setters!(UnsqueezeTransform {
    /// Where the results are written (one per in key; default: the in keys).
    with_out_keys(keys) => keys.outs [Some];
    /// Parent-side action / state keys: the policy gives them with the extra dim, which is
    /// squeezed out before the parent sees them.
    with_in_keys_inv(keys) => keys_inv.ins;
    /// Policy-side names of the inverse entries (default: the same names).
    with_out_keys_inv(keys) => keys_inv.outs [Some];
});

impl Transform for UnsqueezeTransform {
    fn name(&self) -> String {
        let mut s = format!(
            "UnsqueezeTransform(dim={}, in_keys={}",
            self.dim,
            fmt_key_list(&self.keys.ins)
        );
        if let Some(o) = &self.keys.outs {
            s += &format!(", out_keys={}", fmt_key_list(o));
        }
        if !self.keys_inv.ins.is_empty() {
            s += &format!(", in_keys_inv={}", fmt_key_list(&self.keys_inv.ins));
        }
        if let Some(o) = &self.keys_inv.outs {
            s += &format!(", out_keys_inv={}", fmt_key_list(o));
        }
        s + ")"
    }

    fn attach(&mut self, _parent: &EnvSpecs) -> Result<()> {
        if self.keys.ins.is_empty() && self.keys_inv.ins.is_empty() {
            return Err(Error::config(
                OP,
                "in_keys",
                "in_keys or in_keys_inv (without either there is nothing to unsqueeze)",
                "none",
            ));
        }
        self.pairs()?;
        self.pairs_inv()?;
        Ok(())
    }

    fn new_output_keys(&self) -> Vec<NestedKey> {
        self.pairs().map(|p| added_keys(&p)).unwrap_or_default()
    }

    fn transform_output_spec(&self, mut specs: EnvSpecs) -> Result<EnvSpecs> {
        let nb = specs.batch_size().len();
        let pairs = self.pairs()?;
        refuse_state_keys(
            OP,
            &self.name(),
            &specs,
            pairs.iter().filter(|(i, o)| i == o).map(|(i, _)| i),
            IN_PLACE,
        )?;
        for (in_key, out_key) in pairs {
            let Some(group) = specs.output_group_of(&in_key) else {
                return Err(Error::KeyNotFound {
                    op: "UnsqueezeTransform (in keys are looked up in the done, reward and observation specs)",
                    key: in_key.to_string(),
                    available: output_keys_available(&specs),
                });
            };
            let spec = specs.group(group).get_or_err(&in_key)?;
            let new = self.unsqueeze_spec(nb, &in_key, spec)?;
            specs.group_mut(group).set(&out_key, new)?;
        }
        Ok(specs)
    }

    fn transform_input_spec(&self, specs: EnvSpecs) -> Result<EnvSpecs> {
        let nb = specs.batch_size().len();
        map_input_specs(
            "UnsqueezeTransform (inverse in keys are looked up in the action, then the state spec)",
            specs,
            self.pairs_inv()?,
            |key, spec, _| self.unsqueeze_spec(nb, key, spec),
        )
    }

    fn step(&mut self, _td: &TensorDict, mut next: TensorDict) -> Result<TensorDict> {
        self.unsqueeze_data(&mut next, false, "UnsqueezeTransform (step)")?;
        Ok(next)
    }

    fn reset(&mut self, _td: &TensorDict, mut reset: TensorDict) -> Result<TensorDict> {
        self.unsqueeze_data(&mut reset, true, "UnsqueezeTransform (reset)")?;
        Ok(reset)
    }

    fn inv(&mut self, mut td: TensorDict) -> Result<TensorDict> {
        let nb = td.batch_dims();
        for (inner, outer) in self.pairs_inv()? {
            let v = td
                .get(&outer)
                .ok_or_else(|| missing_key("UnsqueezeTransform (inverse)", &td, &outer))?;
            let p = self.squeeze_position(nb, &v.size(), &outer)?;
            let v = v.f_squeeze_dim(p as i64)?;
            td.set(&inner, v)?;
        }
        Ok(td)
    }

    fn forward(&mut self, mut td: TensorDict) -> Result<TensorDict> {
        self.unsqueeze_data(&mut td, false, "UnsqueezeTransform (forward)")?;
        Ok(td)
    }
}
