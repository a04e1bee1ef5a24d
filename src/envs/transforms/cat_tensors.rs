//! `CatTensors`: concatenates several observation entries into one.
//!
//! - **Keys.** `in_keys` are **sorted** by default, as in TorchRL (nested keys compare by their
//!   segments joined with `"_-|-_"`), so `["b", "a"]` concatenates `a` then `b`;
//!   [`CatTensors::with_sort`]`(false)` keeps the given order. [`CatTensors::lazy`] takes every
//!   observation leaf with exactly one feature dim (found at attach, sorted). The result goes
//!   to `out_key` (default `"observation_vector"`); the inputs are deleted from the data and the
//!   spec unless [`CatTensors::with_del_keys`]`(false)`.
//! - **Dim.** `dim` (default `-1`) counts from the end when negative, and among the **feature**
//!   dims (after the batch dims) when non-negative. TorchRL counts a non-negative dim from the
//!   first batch dim, which makes its meaning depend on the env's batch size; here `dim = 0` is
//!   always the first feature dim.
//! - **Specs.** The out spec is `Unbounded`, with the inputs' shape except along `dim`, where
//!   the sizes are summed, and their dtype (bounds are lost, as in TorchRL). The inputs must be
//!   observation keys with the same dtype and the same shape except along `dim` (TorchRL takes the
//!   first key's dtype and lets `torch.cat` promote the data, so mixed dtypes break its own
//!   spec; here they are an error naming both keys: cast first). An out key that already exists
//!   in an output spec and is not an input is an error.
//! - **Data.** `step`, `reset` and `forward` concatenate; a missing input is an error naming it.
//!
//! ```
//! use tch::Tensor;
//! use torchrl::envs::transforms::{CatTensors, Transform};
//! use torchrl::TensorDict;
//! # fn main() -> torchrl::Result<()> {
//! let td = TensorDict::new([])?
//!     .with("b", Tensor::from_slice(&[1.0f32, 1.0]))?
//!     .with("a", Tensor::from_slice(&[0.0f32, 0.0, 0.0]))?;
//! let out = CatTensors::new(["b", "a"]).forward(td.clone())?;
//! let v: Vec<f32> = Vec::try_from(out.get_or_err("observation_vector")?)?;
//! assert_eq!(v, [0.0, 0.0, 0.0, 1.0, 1.0]); // sorted: a, then b
//! assert!(!out.contains("a") && !out.contains("b"));
//! let out = CatTensors::new(["b", "a"]).with_sort(false).forward(td)?;
//! let v: Vec<f32> = Vec::try_from(out.get_or_err("observation_vector")?)?;
//! assert_eq!(v, [1.0, 1.0, 0.0, 0.0, 0.0]);
//! # Ok(()) }
//! ```

use super::Transform;
use crate::data::specs::{TensorSpec, Unbounded};
use crate::envs::EnvSpecs;
use crate::error::{Error, Result};
use crate::macros::setters;
use crate::tensordict::{fmt_key_list, NestedKey, TensorDict};

const OP: &str = "CatTensors";

/// Concatenates entries into one. See the module docs.
pub struct CatTensors {
    in_keys: Option<Vec<NestedKey>>,
    out_key: NestedKey,
    dim: i64,
    del_keys: bool,
    sort: bool,
    /// Keys found by [`CatTensors::lazy`] at attach.
    found: Option<Vec<NestedKey>>,
}

/// TorchRL's `_sort_keys`: a nested key sorts as its segments joined with `"_-|-_"`.
fn sort_key(k: &NestedKey) -> String {
    k.parts().collect::<Vec<_>>().join("_-|-_")
}

fn sorted(mut keys: Vec<NestedKey>) -> Vec<NestedKey> {
    keys.sort_by_key(sort_key);
    keys
}

impl CatTensors {
    /// Concatenates `in_keys` (sorted) into `"observation_vector"` along the last dim, deleting
    /// the inputs.
    pub fn new<K: Into<NestedKey>>(in_keys: impl IntoIterator<Item = K>) -> Self {
        CatTensors {
            in_keys: Some(in_keys.into_iter().map(Into::into).collect()),
            out_key: "observation_vector".into(),
            dim: -1,
            del_keys: true,
            sort: true,
            found: None,
        }
    }

    /// In keys found at attach: every observation leaf with exactly one feature dim, sorted.
    /// Only `dim = -1` is allowed then (as in TorchRL).
    pub fn lazy() -> Self {
        CatTensors {
            in_keys: None,
            out_key: "observation_vector".into(),
            dim: -1,
            del_keys: true,
            sort: true,
            found: None,
        }
    }

    /// The in keys in concatenation order (`None` for a lazy transform not attached yet).
    pub fn in_keys(&self) -> Option<Vec<NestedKey>> {
        let keys = match (&self.in_keys, &self.found) {
            (Some(k), _) => k.clone(),
            (None, Some(f)) => f.clone(),
            (None, None) => return None,
        };
        Some(if self.sort { sorted(keys) } else { keys })
    }

    /// The out key.
    pub fn out_key(&self) -> &NestedKey {
        &self.out_key
    }

    fn keys(&self) -> Result<Vec<NestedKey>> {
        let keys = self.in_keys().ok_or_else(|| {
            Error::config(
                OP,
                "in_keys",
                "in keys: a lazy CatTensors finds its keys in the env's specs: append it to a \
                 TransformedEnv first (or give in_keys)",
                "none yet (a lazy CatTensors that is in no env)",
            )
        })?;
        if keys.is_empty() {
            return Err(Error::config(
                OP,
                "in_keys",
                format!("at least one in key for {} to concatenate", self.name()),
                "none",
            ));
        }
        for (i, k) in keys.iter().enumerate() {
            if keys.iter().take(i).any(|x| x == k) {
                return Err(Error::value(
                    OP,
                    k,
                    format!("each in key of {} once", self.name()),
                    "a key listed twice",
                ));
            }
        }
        Ok(keys)
    }

    /// The keys to delete after concatenating.
    fn to_delete(&self, keys: &[NestedKey]) -> Vec<NestedKey> {
        if !self.del_keys {
            return Vec::new();
        }
        keys.iter()
            .filter(|k| **k != self.out_key)
            .cloned()
            .collect()
    }

    /// The dim in a tensor of `ndim` dims whose first `nb` are batch dims.
    fn tensor_dim(&self, nb: usize, ndim: usize, key: &NestedKey) -> Result<i64> {
        let feat = ndim.saturating_sub(nb) as i64;
        let f = if self.dim < 0 {
            self.dim + feat
        } else {
            self.dim
        };
        if f < 0 || f >= feat {
            return Err(Error::IndexOutOfRange {
                op: "CatTensors (dim among the feature dims)",
                index: self.dim,
                what: format!(
                    "feature dims of {key} ({} feature dims after {nb} batch dims)",
                    feat
                ),
                size: feat,
            });
        }
        Ok(nb as i64 + f)
    }

    fn cat(&self, mut td: TensorDict, op: &'static str) -> Result<TensorDict> {
        let keys = self.keys()?;
        let mut values = Vec::with_capacity(keys.len());
        for k in &keys {
            match td.get(k) {
                Some(v) => values.push(v.shallow_clone()),
                None => {
                    return Err(Error::KeyNotFound {
                        op,
                        key: k.to_string(),
                        available: sorted(td.keys(crate::tensordict::KeysOptions::nested_leaves()))
                            .into_iter()
                            .map(|k| k.to_string())
                            .collect(),
                    })
                }
            }
        }
        let nb = td.batch_dims();
        let (first_key, first) = match (keys.first(), values.first()) {
            (Some(k), Some(v)) => (k, v),
            _ => return Err(Error::invalid(OP, "no in keys")),
        };
        let d = self.tensor_dim(nb, first.dim(), first_key)?;
        let out = tch::Tensor::f_cat(&values, d)?;
        td.set(&self.out_key, out)?;
        for k in self.to_delete(&keys) {
            td.remove(&k);
        }
        Ok(td)
    }
}

setters!(CatTensors {
    /// Where the result is written (default `"observation_vector"`).
    with_out_key(key: impl Into<NestedKey>) => out_key = key.into();
    /// The dim to concatenate along (default `-1`; see the module docs for non-negative dims).
    with_dim(dim: i64);
    /// Whether the inputs are deleted (default true).
    with_del_keys(del_keys: bool);
    /// Whether the in keys are sorted (default true).
    with_sort(sort: bool);
});

impl Transform for CatTensors {
    fn name(&self) -> String {
        let keys = match self.in_keys() {
            Some(k) => fmt_key_list(&k),
            None => "lazy".into(),
        };
        format!(
            "CatTensors(in_keys={keys}, out_key={}, dim={})",
            self.out_key, self.dim
        )
    }

    fn attach(&mut self, parent: &EnvSpecs) -> Result<()> {
        if self.in_keys.is_none() {
            if self.dim != -1 {
                return Err(Error::config(
                    OP,
                    "dim",
                    "dim = -1 (the only dim a lazy CatTensors supports)",
                    self.dim,
                ));
            }
            let nb = parent.batch_size().len();
            let found: Vec<NestedKey> = parent
                .observation
                .leaves()
                .into_iter()
                .filter(|(_, s)| s.shape().len() == nb + 1)
                .map(|(k, _)| k)
                .collect();
            if found.is_empty() {
                return Err(Error::InvalidValue {
                    op: OP,
                    what: "spec",
                    key: "observation".to_string(),
                    expected: "an observation leaf with exactly one feature dim (for a lazy \
                               CatTensors)"
                        .to_string(),
                    got: format!(
                        "none: a lazy CatTensors found no observation leaf with exactly one \
                         feature dim (observation keys: {})",
                        fmt_key_list(&parent.observation_keys())
                    ),
                });
            }
            self.found = Some(found);
        }
        let keys = self.keys()?;
        let missing: Vec<NestedKey> = keys
            .iter()
            .filter(|k| !matches!(parent.observation.get(*k), Some(s) if !s.is_composite()))
            .cloned()
            .collect();
        if !missing.is_empty() {
            return Err(Error::config(
                OP,
                "in_keys",
                format!(
                    "observation leaves (the observation spec has {})",
                    fmt_key_list(&parent.observation_keys())
                ),
                format_args!(
                    "{}: keys {} are not observation leaves",
                    self.name(),
                    fmt_key_list(&missing)
                ),
            ));
        }
        // A key the env also reads back as a state (RewardSum's episode sum) cannot be deleted:
        // the state spec would still promise it and the next step would lose its value.
        let states: Vec<NestedKey> = self
            .to_delete(&keys)
            .into_iter()
            .filter(|k| parent.state.contains(k))
            .collect();
        if !states.is_empty() {
            return Err(Error::config(
                OP,
                "del_keys",
                "no deleted key in the state spec (inputs the env reads back, such as RewardSum's \
                 episode sums, cannot be deleted); use with_del_keys(false)",
                format_args!(
                    "{}: keys {} are also in the state spec",
                    self.name(),
                    fmt_key_list(&states)
                ),
            ));
        }
        if !keys.contains(&self.out_key) {
            if let Some(g) = parent.output_group_of(&self.out_key) {
                return Err(Error::value(
                    OP,
                    &self.out_key,
                    format!("an out key of {} that is new to the specs", self.name()),
                    format!("a key that already exists in the {g} spec; choose another out key"),
                ));
            }
        }
        Ok(())
    }

    fn new_output_keys(&self) -> Vec<NestedKey> {
        match self.in_keys() {
            Some(k) if k.contains(&self.out_key) => Vec::new(),
            _ => vec![self.out_key.clone()],
        }
    }

    fn transform_observation_spec(
        &self,
        mut spec: crate::data::specs::Composite,
    ) -> Result<crate::data::specs::Composite> {
        let keys = self.keys()?;
        let nb = spec.shape().len();
        let mut leaves: Vec<(&NestedKey, TensorSpec)> = Vec::with_capacity(keys.len());
        for k in &keys {
            leaves.push((k, spec.get_or_err(k)?.clone()));
        }
        let Some((k0, s0)) = leaves.first() else {
            return Err(Error::invalid(OP, "no in keys"));
        };
        let d = self.tensor_dim(nb, s0.ndim(), k0)? as usize;
        let dtype0 = s0.dtype();
        let mut shape = s0.shape().to_vec();
        let mut total = 0i64;
        for (k, s) in &leaves {
            if s.dtype() != dtype0 {
                return Err(Error::value(
                    OP,
                    k,
                    format!(
                        "the dtype {:?} of {k0}, the first in key of {} (cast them to one dtype \
                         first, with DTypeCast)",
                        dtype0,
                        self.name()
                    ),
                    format!("dtype {:?}", s.dtype()),
                ));
            }
            let same_rest = s.ndim() == s0.ndim()
                && s.shape()
                    .iter()
                    .zip(s0.shape())
                    .enumerate()
                    .all(|(i, (a, b))| i == d || a == b);
            if !same_rest {
                return Err(Error::ShapeMismatch {
                    op: "CatTensors (shapes must match except along the cat dim)",
                    key: format!("{k} (vs {k0}, cat dim {})", self.dim),
                    expected: s0.shape().to_vec(),
                    actual: s.shape().to_vec(),
                });
            }
            total += s.shape().get(d).copied().unwrap_or(1);
        }
        if let Some(x) = shape.get_mut(d) {
            *x = total;
        }
        let mut out = Unbounded::new().with_shape(&shape)?;
        if let Some(dt) = dtype0 {
            out = out.with_dtype(dt)?;
        }
        if let Some(dev) = s0.device() {
            out = out.with_device(dev)?;
        }
        spec.set(&self.out_key, out)?;
        for k in self.to_delete(&keys) {
            spec.remove(&k)?;
        }
        Ok(spec)
    }

    fn step(&mut self, _td: &TensorDict, next: TensorDict) -> Result<TensorDict> {
        self.cat(next, "CatTensors (step)")
    }

    fn reset(&mut self, _td: &TensorDict, reset: TensorDict) -> Result<TensorDict> {
        self.cat(reset, "CatTensors (reset)")
    }

    fn forward(&mut self, td: TensorDict) -> Result<TensorDict> {
        self.cat(td, "CatTensors (forward)")
    }
}
