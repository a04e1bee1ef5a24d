//! `EnvSpecs`: what an environment reads and writes, held as TorchRL holds it.
//!
//! The output side is three [`Composite`]s (full observation, reward and done specs); the input
//! side two (full action and state specs). All have the env's batch size as their shape, and
//! every leaf's shape starts with it (`[*batch, *feature]`).
//!
//! ```
//! use torchrl::envs::EnvSpecs;
//! use torchrl::specs::{Bounded, Unbounded};
//! # fn main() -> torchrl::Result<()> {
//! let specs = EnvSpecs::new([])?
//!     .with_observation("observation", Unbounded::new().with_shape([3])?)?
//!     .with_action("action", Bounded::new(-2.0, 2.0, [1])?)?
//!     .with_reward("reward", Unbounded::new().with_shape([1])?)?
//!     .finalize()?;
//! // done specs are completed: `done` and `terminated`, bool, shape [*batch, 1]
//! assert_eq!(specs.done_keys().len(), 2);
//! assert_eq!(specs.reset_keys()[0].to_string(), "\"_reset\"");
//! # Ok(()) }
//! ```

use std::fmt;

use tch::{Device, Kind};

use crate::data::specs::{Categorical, Composite, TensorSpec};
use crate::error::{Error, Result, ShapeFmt};
use crate::tensordict::{AsKey, KeysOptions, NestedKey};

/// The five spec groups of an environment, plus its batch size and device.
#[derive(Clone, PartialEq)]
pub struct EnvSpecs {
    batch_size: Vec<i64>,
    device: Device,
    /// Full observation spec (TorchRL's `full_observation_spec`).
    pub observation: Composite,
    /// Full reward spec.
    pub reward: Composite,
    /// Full done spec (`done`, `terminated`, optionally `truncated`, per done group).
    pub done: Composite,
    /// Full action spec.
    pub action: Composite,
    /// Full state spec (inputs that are not actions, e.g. a state to reset to).
    pub state: Composite,
}

/// The spec groups, named, for errors and for transforms that move keys between groups.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpecGroup {
    /// `full_observation_spec`.
    Observation,
    /// `full_reward_spec`.
    Reward,
    /// `full_done_spec`.
    Done,
    /// `full_action_spec`.
    Action,
    /// `full_state_spec`.
    State,
}

impl fmt::Display for SpecGroup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SpecGroup::Observation => "observation",
            SpecGroup::Reward => "reward",
            SpecGroup::Done => "done",
            SpecGroup::Action => "action",
            SpecGroup::State => "state",
        })
    }
}

/// Sorts keys by depth (shallow first), then by their dot-joined name, as TorchRL does.
fn by_depth(mut keys: Vec<NestedKey>) -> Vec<NestedKey> {
    keys.sort_by_cached_key(|k| (k.len(), k.parts().collect::<Vec<_>>().join(".")));
    keys
}

impl EnvSpecs {
    /// Empty specs for an env with this batch size, on the CPU.
    pub fn new(batch_size: impl AsRef<[i64]>) -> Result<Self> {
        let bs = batch_size.as_ref().to_vec();
        let c = || Composite::new(&bs);
        Ok(EnvSpecs {
            observation: c()?,
            reward: c()?,
            done: c()?,
            action: c()?,
            state: c()?,
            batch_size: bs,
            device: Device::Cpu,
        })
    }

    /// Moves every spec to `device`.
    pub fn with_device(mut self, device: Device) -> Result<Self> {
        self.device = device;
        for g in self.groups_mut() {
            *g = g.to_device(device)?;
        }
        Ok(self)
    }

    /// The env's batch size.
    pub fn batch_size(&self) -> &[i64] {
        &self.batch_size
    }

    /// The env's device.
    pub fn device(&self) -> Device {
        self.device
    }

    fn groups_mut(&mut self) -> [&mut Composite; 5] {
        [
            &mut self.observation,
            &mut self.reward,
            &mut self.done,
            &mut self.action,
            &mut self.state,
        ]
    }

    /// The composite of a group.
    pub fn group(&self, g: SpecGroup) -> &Composite {
        match g {
            SpecGroup::Observation => &self.observation,
            SpecGroup::Reward => &self.reward,
            SpecGroup::Done => &self.done,
            SpecGroup::Action => &self.action,
            SpecGroup::State => &self.state,
        }
    }

    /// The composite of a group, mutably.
    pub fn group_mut(&mut self, g: SpecGroup) -> &mut Composite {
        match g {
            SpecGroup::Observation => &mut self.observation,
            SpecGroup::Reward => &mut self.reward,
            SpecGroup::Done => &mut self.done,
            SpecGroup::Action => &mut self.action,
            SpecGroup::State => &mut self.state,
        }
    }

    /// Which output group (done, reward, observation, in that order) holds `key`.
    pub fn output_group_of(&self, key: impl AsKey) -> Option<SpecGroup> {
        let segs = key.segments();
        [SpecGroup::Done, SpecGroup::Reward, SpecGroup::Observation]
            .into_iter()
            .find(|g| self.group(*g).contains(&segs[..]))
    }

    /// Which input group (action, then state) holds `key`.
    pub fn input_group_of(&self, key: impl AsKey) -> Option<SpecGroup> {
        let segs = key.segments();
        [SpecGroup::Action, SpecGroup::State]
            .into_iter()
            .find(|g| self.group(*g).contains(&segs[..]))
    }

    fn with_in(
        mut self,
        g: SpecGroup,
        key: impl AsKey,
        spec: impl Into<TensorSpec>,
    ) -> Result<Self> {
        let spec = spec.into().to_device(self.device)?;
        self.group_mut(g).set(key, spec)?;
        Ok(self)
    }

    /// Adds an observation leaf. As in TorchRL, a leaf's shape is `[*batch, *feature]`: it
    /// must start with the env's batch size (checked).
    pub fn with_observation(self, key: impl AsKey, spec: impl Into<TensorSpec>) -> Result<Self> {
        self.with_in(SpecGroup::Observation, key, spec)
    }

    /// Adds an action leaf (shape `[*batch, *feature]`).
    pub fn with_action(self, key: impl AsKey, spec: impl Into<TensorSpec>) -> Result<Self> {
        self.with_in(SpecGroup::Action, key, spec)
    }

    /// Adds a reward leaf (shape `[*batch, *feature]`).
    pub fn with_reward(self, key: impl AsKey, spec: impl Into<TensorSpec>) -> Result<Self> {
        self.with_in(SpecGroup::Reward, key, spec)
    }

    /// Adds a done leaf (shape `[*batch, *feature]`).
    pub fn with_done(self, key: impl AsKey, spec: impl Into<TensorSpec>) -> Result<Self> {
        self.with_in(SpecGroup::Done, key, spec)
    }

    /// Adds a state leaf (shape `[*batch, *feature]`).
    pub fn with_state(self, key: impl AsKey, spec: impl Into<TensorSpec>) -> Result<Self> {
        self.with_in(SpecGroup::State, key, spec)
    }

    /// Completes, validates and locks the specs, as TorchRL does after an env's `__init__`:
    /// - an empty done spec gets `done` and `terminated` (`Categorical(2)`, bool, `[*batch, 1]`);
    ///   a group with only `done` gets `terminated` (and vice versa) with the same spec;
    /// - every group shares the batch size; reward and done leaves have at least one feature dim;
    ///   leaves of one done group share a shape;
    /// - done, observation and reward keys are disjoint, and so are state and action keys.
    pub fn finalize(mut self) -> Result<Self> {
        self.unlock();
        self.complete_done_specs()?;
        self.validate()?;
        self.lock();
        Ok(self)
    }

    fn complete_done_specs(&mut self) -> Result<()> {
        if self.done.keys(KeysOptions::nested_leaves()).is_empty() {
            let mut shape = self.batch_size.clone();
            shape.push(1);
            let spec = Categorical::new(2)?
                .with_shape(&shape)?
                .with_dtype(Kind::Bool)?
                .with_device(self.device)?;
            self.done.set("done", spec.clone())?;
            self.done.set("terminated", spec)?;
            return Ok(());
        }
        for prefix in self.done_group_prefixes() {
            let done = prefix.join("done");
            let term = prefix.join("terminated");
            let (has_done, has_term) = (self.done.contains(&done), self.done.contains(&term));
            if has_done && !has_term {
                let s = self.done.get_or_err(&done)?.clone();
                self.done.set(&term, s)?;
            } else if has_term && !has_done {
                let s = self.done.get_or_err(&term)?.clone();
                self.done.set(&done, s)?;
            }
        }
        Ok(())
    }

    /// The prefixes of the done groups: `[]` for the root group, `["agents"]` for a nested one.
    pub fn done_group_prefixes(&self) -> Vec<NestedKey> {
        let mut out: Vec<NestedKey> = Vec::new();
        for k in self.done.keys(KeysOptions::nested_leaves()) {
            let prefix: NestedKey = k
                .parts()
                .take(k.len().saturating_sub(1))
                .collect::<Vec<_>>()
                .into();
            if !out.contains(&prefix) {
                out.push(prefix);
            }
        }
        out
    }

    pub(crate) fn validate(&self) -> Result<()> {
        for (name, g) in [
            (SpecGroup::Observation, &self.observation),
            (SpecGroup::Reward, &self.reward),
            (SpecGroup::Done, &self.done),
            (SpecGroup::Action, &self.action),
            (SpecGroup::State, &self.state),
        ] {
            if g.shape() != self.batch_size.as_slice() {
                return Err(Error::ShapeMismatch {
                    op: "EnvSpecs::finalize",
                    key: format!("<{name} spec>"),
                    expected: self.batch_size.clone(),
                    actual: g.shape().to_vec(),
                });
            }
        }
        let nb = self.batch_size.len();
        for (g, what) in [(&self.reward, "reward"), (&self.done, "done")] {
            for (k, s) in g.leaves() {
                if s.shape().len() <= nb {
                    return Err(Error::value(
                        "EnvSpecs::finalize",
                        &k,
                        format!(
                            "a {what} spec leaf with a feature dim after the batch size {}; use \
                             e.g. {}",
                            ShapeFmt(&self.batch_size),
                            ShapeFmt(&[self.batch_size.as_slice(), &[1]].concat())
                        ),
                        format!(
                            "shape {}, which has no feature dim after the batch size",
                            ShapeFmt(s.shape())
                        ),
                    ));
                }
            }
        }
        for prefix in self.done_group_prefixes() {
            let leaves: Vec<(NestedKey, Vec<i64>)> = self
                .done
                .leaves()
                .into_iter()
                .filter(|(k, _)| k.len() == prefix.len() + 1 && k.starts_with(&prefix))
                .map(|(k, s)| (k, s.shape().to_vec()))
                .collect();
            if let Some((k0, s0)) = leaves.first() {
                if let Some((k, s)) = leaves.iter().find(|(_, s)| s != s0) {
                    return Err(Error::ShapeMismatch {
                        op: "EnvSpecs::finalize",
                        key: format!("{k} (done leaves of one group share a shape, like {k0})"),
                        expected: s0.clone(),
                        actual: s.clone(),
                    });
                }
            }
        }
        let collide = |a: &Composite, b: &Composite| -> Option<NestedKey> {
            let bk = b.keys(KeysOptions::nested_leaves());
            a.keys(KeysOptions::nested_leaves())
                .into_iter()
                .find(|k| bk.contains(k))
        };
        let pairs = [
            (&self.done, &self.observation, "done", "observation"),
            (&self.done, &self.reward, "done", "reward"),
            (&self.observation, &self.reward, "observation", "reward"),
            (&self.state, &self.action, "state", "action"),
        ];
        for (a, b, an, bn) in pairs {
            if let Some(k) = collide(a, b) {
                return Err(Error::value(
                    "EnvSpecs::finalize",
                    &k,
                    "a key in one spec only (a key belongs to one spec)",
                    format!("key {k} is in both the {an} spec and the {bn} spec"),
                ));
            }
        }
        Ok(())
    }

    /// Locks every group (mutations error until [`EnvSpecs::unlock`]).
    pub fn lock(&mut self) {
        for g in self.groups_mut() {
            g.lock();
        }
    }

    /// Unlocks every group.
    pub fn unlock(&mut self) {
        for g in self.groups_mut() {
            g.unlock();
        }
    }

    /// Action leaf keys, shallow first.
    pub fn action_keys(&self) -> Vec<NestedKey> {
        by_depth(self.action.keys(KeysOptions::nested_leaves()))
    }
    /// Reward leaf keys, shallow first.
    pub fn reward_keys(&self) -> Vec<NestedKey> {
        by_depth(self.reward.keys(KeysOptions::nested_leaves()))
    }
    /// Done leaf keys (`done`, `terminated`, `truncated`, …), shallow first.
    pub fn done_keys(&self) -> Vec<NestedKey> {
        by_depth(self.done.keys(KeysOptions::nested_leaves()))
    }
    /// Observation leaf keys, shallow first.
    pub fn observation_keys(&self) -> Vec<NestedKey> {
        by_depth(self.observation.keys(KeysOptions::nested_leaves()))
    }
    /// State leaf keys, shallow first.
    pub fn state_keys(&self) -> Vec<NestedKey> {
        by_depth(self.state.keys(KeysOptions::nested_leaves()))
    }
    /// One `(*prefix, "_reset")` key per done group.
    pub fn reset_keys(&self) -> Vec<NestedKey> {
        self.done_group_prefixes()
            .into_iter()
            .map(|p| p.join("_reset"))
            .collect()
    }

    /// The single action key; errors when there are none or several.
    pub fn action_key(&self) -> Result<NestedKey> {
        single("action", self.action_keys())
    }
    /// The single reward key; errors when there are none or several.
    pub fn reward_key(&self) -> Result<NestedKey> {
        single("reward", self.reward_keys())
    }

    /// TorchRL's `output_spec`: `{full_observation_spec, full_reward_spec, full_done_spec}`.
    pub fn output_spec(&self) -> Result<Composite> {
        Composite::new(&self.batch_size)?
            .with("full_observation_spec", self.observation.clone())?
            .with("full_reward_spec", self.reward.clone())?
            .with("full_done_spec", self.done.clone())
    }

    /// TorchRL's `input_spec`: `{full_state_spec, full_action_spec}`.
    pub fn input_spec(&self) -> Result<Composite> {
        Composite::new(&self.batch_size)?
            .with("full_state_spec", self.state.clone())?
            .with("full_action_spec", self.action.clone())
    }
}

fn single(what: &'static str, keys: Vec<NestedKey>) -> Result<NestedKey> {
    match keys.as_slice() {
        [one] => Ok(one.clone()),
        _ => Err(Error::InvalidValue {
            op: "EnvSpecs",
            what: "spec",
            key: what.to_string(),
            expected: format!("exactly one {what} key"),
            got: format!(
                "{} {what} keys: [{}]",
                keys.len(),
                keys.iter()
                    .map(|k| k.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }),
    }
}

impl fmt::Debug for EnvSpecs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "EnvSpecs(batch_size={}, device={:?})",
            ShapeFmt(&self.batch_size),
            self.device
        )?;
        for g in [
            SpecGroup::Observation,
            SpecGroup::Reward,
            SpecGroup::Done,
            SpecGroup::Action,
            SpecGroup::State,
        ] {
            writeln!(f, "  {g}: {}", self.group(g))?;
        }
        Ok(())
    }
}
