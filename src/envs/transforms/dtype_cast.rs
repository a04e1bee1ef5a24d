//! `DTypeCast`: casts entries from one dtype to another (TorchRL's `DTypeCastTransform`), and
//! [`DoubleToFloat`], the `Double -> Float` cast.
//!
//! **Keys.** With no keys given, [`Transform::attach`] discovers them from the parent's specs,
//! as TorchRL does: the forward keys are the observation leaves then the reward leaves whose
//! dtype is `from`; the inverse keys the action leaves then the state leaves whose dtype is
//! `from`. With explicit [`DTypeCast::with_in_keys`] and no [`DTypeCast::with_in_keys_inv`],
//! nothing is cast on the way in (TorchRL's `in_keys_inv = []`).
//!
//! **Data.** `step` and `reset` cast `next[in_key]` to `to` and write it at the matching out key
//! (the in key by default); the inverse casts the policy-side entry (`out_key_inv`) back to
//! `from` at `in_key_inv` before the parent sees it (the caller's tensordict keeps its value).
//! State entries that the parent returns (at reset or in `"next"`) are cast forward too, so they
//! match the transformed state spec. [`Transform::forward`] (offline data) casts the resolved keys,
//! or, for a transform never attached and given no keys, every leaf of dtype `from`.
//!
//! **Specs.** Each listed spec gets the new dtype (a `Bounded` spec's `low`/`high` are cast too).
//! A listed key whose spec dtype is not `from`, or that is in no spec it can be cast in
//! (observation / reward forward, action / state inverse), is an error naming the key.
//!
//! ```
//! use tch::Kind;
//! use torchrl::envs::builtin::CountingEnv;
//! use torchrl::envs::transforms::{DTypeCast, DoubleToFloat, Transform, TransformedEnv};
//! use torchrl::{EnvBase, RolloutConfig, TensorDict};
//! # fn main() -> torchrl::Result<()> {
//! // CountingEnv is float32; cast everything float32 to float64 (keys found automatically)
//! let mut env = TransformedEnv::new(CountingEnv::new(5, &[])?)?
//!     .with(DTypeCast::new(Kind::Float, Kind::Double))?;
//! assert_eq!(env.specs().observation.get("observation").and_then(|s| s.dtype()), Some(Kind::Double));
//! assert_eq!(env.specs().action.get("action").and_then(|s| s.dtype()), Some(Kind::Double));
//! let traj = env.rollout(3, None, &RolloutConfig::default())?;
//! assert_eq!(traj.get_or_err(("next", "observation"))?.kind(), Kind::Double);
//! assert_eq!(traj.get_or_err("action")?.kind(), Kind::Double);
//! assert_eq!(env.base().specs().observation.get("observation").and_then(|s| s.dtype()), Some(Kind::Float));
//!
//! // standalone, on offline data: every float64 leaf becomes float32
//! let td = TensorDict::new([])?.with("obs", tch::Tensor::from_slice(&[1.0f64]))?;
//! let out = DoubleToFloat::new().forward(td)?;
//! assert_eq!(out.get_or_err("obs")?.kind(), Kind::Float);
//! # Ok(()) }
//! ```

use tch::Kind;

use super::{added_keys, input_keys_available, key_pairs, map_key_pairs, Transform};
use crate::data::specs::{Composite, TensorSpec};
use crate::envs::{EnvSpecs, SpecGroup};
use crate::error::{Error, Result};
use crate::macros::setters;
use crate::tensordict::fmt_key_list;
use crate::tensordict::{NestedKey, TensorDict};

/// Casts entries from dtype `from` to dtype `to` on the way out of the env, and back on the way
/// in. See the module docs.
pub struct DTypeCast {
    from: Kind,
    to: Kind,
    in_keys: Option<Vec<NestedKey>>,
    out_keys: Option<Vec<NestedKey>>,
    in_keys_inv: Option<Vec<NestedKey>>,
    out_keys_inv: Option<Vec<NestedKey>>,
    resolved: Option<Resolved>,
}

/// Key pairs fixed at attach time.
#[derive(Clone, Debug, Default)]
struct Resolved {
    /// `(in_key, out_key)`: parent-side name, outside name.
    forward: Vec<(NestedKey, NestedKey)>,
    /// `(in_key_inv, out_key_inv)`: parent-side name, policy-side name.
    inverse: Vec<(NestedKey, NestedKey)>,
    /// The inverse pairs whose parent-side key is a state key (cast forward when returned).
    state: Vec<(NestedKey, NestedKey)>,
}

/// `DTypeCast(Double -> Float)`, TorchRL's `DoubleToFloat`.
///
/// A constructor only: [`DoubleToFloat::new`] returns the [`DTypeCast`].
pub struct DoubleToFloat;

impl DoubleToFloat {
    /// `DTypeCast::new(Kind::Double, Kind::Float)` (keys discovered at attach).
    #[allow(clippy::new_ret_no_self)]
    pub fn new() -> DTypeCast {
        DTypeCast::new(Kind::Double, Kind::Float)
    }
}

/// The spec with another dtype (a `Bounded` spec's bounds are cast too).
fn cast_spec(op: &'static str, key: &NestedKey, spec: &TensorSpec, to: Kind) -> Result<TensorSpec> {
    Ok(match spec.clone() {
        TensorSpec::Unbounded(s) => s.with_dtype(to)?.into(),
        TensorSpec::Bounded(s) => s.with_dtype(to)?.into(),
        TensorSpec::Categorical(s) => s.with_dtype(to)?.into(),
        TensorSpec::OneHot(s) => s.with_dtype(to)?.into(),
        TensorSpec::Binary(s) => s.with_dtype(to)?.into(),
        TensorSpec::MultiCategorical(s) => s.with_dtype(to)?.into(),
        TensorSpec::MultiOneHot(s) => s.with_dtype(to)?.into(),
        TensorSpec::NonTensor(s) => s.with_dtype(to)?.into(),
        TensorSpec::Composite(_) => {
            return Err(Error::value(
                op,
                key,
                "a leaf spec (list the leaves of a nested spec)",
                "a nested spec (a Composite)",
            ))
        }
    })
}

impl DTypeCast {
    /// Casts `from` to `to`; keys are discovered from the parent's specs when the transform is
    /// appended (see the module docs).
    pub fn new(from: Kind, to: Kind) -> Self {
        DTypeCast {
            from,
            to,
            in_keys: None,
            out_keys: None,
            in_keys_inv: None,
            out_keys_inv: None,
            resolved: None,
        }
    }

    /// `DTypeCast::new(Kind::Double, Kind::Float)`.
    pub fn double_to_float() -> Self {
        DTypeCast::new(Kind::Double, Kind::Float)
    }

    /// The source dtype.
    pub fn from_kind(&self) -> Kind {
        self.from
    }

    /// The target dtype.
    pub fn to_kind(&self) -> Kind {
        self.to
    }

    /// The forward in keys: explicit ones, or those discovered at attach (`None` before).
    pub fn in_keys(&self) -> Option<Vec<NestedKey>> {
        match (&self.resolved, &self.in_keys) {
            (Some(r), _) => Some(r.forward.iter().map(|(i, _)| i.clone()).collect()),
            (None, Some(k)) => Some(k.clone()),
            (None, None) => None,
        }
    }

    /// The inverse in keys (parent-side names): explicit ones, `[]` when only forward keys were
    /// given, or those discovered at attach (`None` before).
    pub fn in_keys_inv(&self) -> Option<Vec<NestedKey>> {
        match (&self.resolved, &self.in_keys_inv, &self.in_keys) {
            (Some(r), _, _) => Some(r.inverse.iter().map(|(i, _)| i.clone()).collect()),
            (None, Some(k), _) => Some(k.clone()),
            (None, None, Some(_)) => Some(Vec::new()),
            (None, None, None) => None,
        }
    }

    fn op(&self) -> &'static str {
        "DTypeCast"
    }

    /// Resolves the key pairs against the parent's specs (`None`: no parent, explicit keys
    /// only).
    fn resolve(&self, parent: Option<&EnvSpecs>) -> Result<Resolved> {
        let op = self.op();
        if self.from == self.to {
            return Err(Error::config(
                op,
                "to",
                format!(
                    "a dtype other than from for {} (with from == to there is nothing to cast)",
                    self.name()
                ),
                format!("{:?}", self.to),
            ));
        }
        if self.in_keys.is_none() && self.out_keys.is_some() {
            return Err(Error::config(
                op,
                "out_keys",
                format!(
                    "in_keys with the out_keys of {} (the order of automatically found keys is \
                     not something to pair out keys with)",
                    self.name()
                ),
                "out_keys without in_keys",
            ));
        }
        if self.in_keys_inv.is_none() && self.out_keys_inv.is_some() {
            return Err(Error::config(
                op,
                "out_keys_inv",
                format!("in_keys_inv with the out_keys_inv of {}", self.name()),
                "out_keys_inv without in_keys_inv",
            ));
        }
        let of_dtype = |c: &Composite| -> Vec<NestedKey> {
            c.leaves()
                .into_iter()
                .filter(|(_, s)| s.dtype() == Some(self.from))
                .map(|(k, _)| k)
                .collect()
        };
        let no_parent = || {
            Error::config(
                op,
                "in_keys",
                "in keys: they are found from the env's specs, so without keys the transform must \
                 be appended to a TransformedEnv first (or given in_keys)",
                format_args!("none yet ({} is in no env)", self.name()),
            )
        };
        let fwd_in = match (&self.in_keys, parent) {
            (Some(k), _) => k.clone(),
            (None, Some(p)) => {
                let mut keys = of_dtype(&p.observation);
                keys.extend(of_dtype(&p.reward));
                keys
            }
            (None, None) => return Err(no_parent()),
        };
        let inv_in = match (&self.in_keys_inv, &self.in_keys, parent) {
            (Some(k), _, _) => k.clone(),
            (None, Some(_), _) => Vec::new(),
            (None, None, Some(p)) => {
                let mut keys = of_dtype(&p.action);
                keys.extend(of_dtype(&p.state));
                keys
            }
            (None, None, None) => return Err(no_parent()),
        };
        let forward = key_pairs(op, self, &fwd_in, self.out_keys.as_deref(), "")?;
        let inverse = key_pairs(op, self, &inv_in, self.out_keys_inv.as_deref(), "inverse ")?;
        let state = match parent {
            Some(p) => inverse
                .iter()
                .filter(|(i, _)| p.state.contains(i))
                .cloned()
                .collect(),
            None => Vec::new(),
        };
        Ok(Resolved {
            forward,
            inverse,
            state,
        })
    }

    fn resolved(&self) -> Result<Resolved> {
        match &self.resolved {
            Some(r) => Ok(r.clone()),
            None => self.resolve(None),
        }
    }

    fn check_dtype(&self, key: &NestedKey, spec: &TensorSpec, group: SpecGroup) -> Result<()> {
        match spec.dtype() {
            Some(k) if k == self.from => Ok(()),
            Some(k) => Err(Error::DtypeMismatch {
                op: "DTypeCast (spec)",
                key: format!("{key} (in the {group} spec, listed for {})", self.name()),
                expected: self.from,
                actual: k,
            }),
            None => Err(Error::value(
                self.op(),
                key,
                format!("a {group} spec with a dtype for {}", self.name()),
                "a nested level or a dtype-less NonTensor",
            )),
        }
    }

    /// Casts the `(parent-side, policy-side)` key pairs `pairs` in `td`: on the way out each
    /// parent-side entry to `to`, written at its policy-side key; with `inverse`, each
    /// policy-side entry to `from`, written at its parent-side key (`tolerant`: skip missing
    /// keys).
    fn cast_pairs(
        &self,
        td: &mut TensorDict,
        pairs: &[(NestedKey, NestedKey)],
        inverse: bool,
        tolerant: bool,
        op: &'static str,
    ) -> Result<()> {
        let to = if inverse { self.from } else { self.to };
        map_key_pairs(
            td,
            pairs,
            inverse,
            tolerant,
            op,
            |v, _| Ok(v.f_to_kind(to)?),
        )
    }

    fn cast_out(&self, mut td: TensorDict, tolerant: bool, op: &'static str) -> Result<TensorDict> {
        let r = self.resolved()?;
        // The output entries, then the state entries returned by the parent (cast to the
        // transformed state spec; they may be absent).
        for (pairs, tolerant) in [(&r.forward, tolerant), (&r.state, true)] {
            self.cast_pairs(&mut td, pairs, false, tolerant, op)?;
        }
        for (i, o) in &r.state {
            if i != o && td.get(o).is_some() {
                td.remove(i);
            }
        }
        Ok(td)
    }
}

setters!(DTypeCast {
    /// Casts only these output entries (observation or reward keys). Without
    /// [`DTypeCast::with_in_keys_inv`], nothing is cast on the way in.
    with_in_keys(keys) => in_keys [Some], clears resolved;
    /// Where the cast values are written (one per in key; default: the in keys). Needs explicit
    /// in keys (checked when the transform is attached).
    with_out_keys(keys) => out_keys [Some], clears resolved;
    /// Parent-side names of the entries cast back to `from` on the way in (action or state
    /// keys).
    with_in_keys_inv(keys) => in_keys_inv [Some], clears resolved;
    /// Policy-side names of the inverse entries (one per inverse in key; default: the same
    /// names). Needs explicit inverse in keys.
    with_out_keys_inv(keys) => out_keys_inv [Some], clears resolved;
});

impl Transform for DTypeCast {
    fn name(&self) -> String {
        let keys = |k: Option<Vec<NestedKey>>| match k {
            Some(k) => fmt_key_list(&k),
            None => "auto".to_string(),
        };
        let head = if self.from == Kind::Double && self.to == Kind::Float {
            "DoubleToFloat(".to_string()
        } else {
            format!("DTypeCast({:?} -> {:?}, ", self.from, self.to)
        };
        format!(
            "{head}in_keys={}, in_keys_inv={})",
            keys(self.in_keys()),
            keys(self.in_keys_inv())
        )
    }

    fn attach(&mut self, parent: &EnvSpecs) -> Result<()> {
        self.resolved = None;
        self.resolved = Some(self.resolve(Some(parent))?);
        Ok(())
    }

    fn new_output_keys(&self) -> Vec<NestedKey> {
        self.resolved
            .as_ref()
            .map(|r| added_keys(&r.forward))
            .unwrap_or_default()
    }

    fn transform_output_spec(&self, mut specs: EnvSpecs) -> Result<EnvSpecs> {
        let r = self.resolved()?;
        for (in_key, out_key) in &r.forward {
            let group = if specs.reward.contains(in_key) {
                SpecGroup::Reward
            } else if specs.observation.contains(in_key) {
                SpecGroup::Observation
            } else {
                return Err(Error::KeyNotFound {
                    op: "DTypeCast (output specs)",
                    key: in_key.to_string(),
                    available: specs
                        .observation_keys()
                        .into_iter()
                        .chain(specs.reward_keys())
                        .map(|k| k.to_string())
                        .collect(),
                });
            };
            let spec = specs.group(group).get_or_err(in_key)?;
            self.check_dtype(in_key, spec, group)?;
            let cast = cast_spec(self.op(), in_key, spec, self.to)?;
            specs.group_mut(group).set(out_key, cast)?;
        }
        Ok(specs)
    }

    fn transform_input_spec(&self, mut specs: EnvSpecs) -> Result<EnvSpecs> {
        let r = self.resolved()?;
        for (in_key, out_key) in &r.inverse {
            let group = match specs.input_group_of(in_key) {
                Some(g) => g,
                None => {
                    return Err(Error::KeyNotFound {
                        op: "DTypeCast (input specs: inverse keys are looked up in the action, then the state spec)",
                        key: in_key.to_string(),
                        available: input_keys_available(&specs),
                    })
                }
            };
            let spec = specs.group(group).get_or_err(in_key)?;
            self.check_dtype(in_key, spec, group)?;
            let cast = cast_spec(self.op(), in_key, spec, self.to)?;
            let g = specs.group_mut(group);
            if in_key != out_key {
                g.remove(in_key)?;
            }
            g.set(out_key, cast)?;
        }
        Ok(specs)
    }

    fn step(&mut self, _td: &TensorDict, next: TensorDict) -> Result<TensorDict> {
        self.cast_out(next, false, "DTypeCast (step)")
    }

    fn reset(&mut self, _td: &TensorDict, reset: TensorDict) -> Result<TensorDict> {
        self.cast_out(reset, true, "DTypeCast (reset)")
    }

    fn inv(&mut self, mut td: TensorDict) -> Result<TensorDict> {
        let r = self.resolved()?;
        self.cast_pairs(&mut td, &r.inverse, true, false, "DTypeCast (inverse)")?;
        Ok(td)
    }

    fn forward(&mut self, mut td: TensorDict) -> Result<TensorDict> {
        if self.resolved.is_none() && self.in_keys.is_none() {
            if self.out_keys.is_some() {
                return Err(Error::config(
                    self.op(),
                    "out_keys",
                    format!("in_keys with the out_keys of {}", self.name()),
                    "out_keys without in_keys",
                ));
            }
            // No env and no keys: every leaf of dtype `from`.
            let keys: Vec<NestedKey> = td
                .leaves()
                .into_iter()
                .filter(|(_, t)| t.kind() == self.from)
                .map(|(k, _)| k)
                .collect();
            for k in keys {
                let v = td.get_or_err(&k)?.f_to_kind(self.to)?;
                td.set(&k, v)?;
            }
            return Ok(td);
        }
        let r = self.resolved()?;
        self.cast_pairs(&mut td, &r.forward, false, false, "DTypeCast (forward)")?;
        Ok(td)
    }
}
