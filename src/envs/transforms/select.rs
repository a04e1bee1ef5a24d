//! `SelectTransform`: keeps only the given entries of what the env returns (the dual of
//! [`ExcludeTransform`](super::ExcludeTransform)).
//!
//! - **Data** (`step`, `reset`, `forward`): the selected keys, plus, by default, every reward
//!   and done key of the parent ([`SelectTransform::with_keep_rewards`],
//!   [`SelectTransform::with_keep_dones`]), plus the parent's state keys (as TorchRL, so state
//!   entries the parent returns survive). A selected key may name a nested level: everything
//!   under it is kept.
//! - **Specs**: observation leaves that are not selected are removed; reward and done leaves
//!   too when they are not kept.
//! - **Errors**: a selected key that is in none of the parent's specs (TorchRL ignores it; here
//!   a typo is reported with the keys that exist).
//!
//! Without a parent (offline [`Transform::forward`] on a transform never appended), the kept
//! extras are `"reward"` and `"done"`, as in TorchRL.
//!
//! ```
//! use torchrl::envs::builtin::CountingEnv;
//! use torchrl::envs::transforms::{SelectTransform, TransformedEnv};
//! use torchrl::{EnvBase, NestedKey, RolloutConfig};
//! # fn main() -> torchrl::Result<()> {
//! let mut env = TransformedEnv::new(CountingEnv::new(5, &[])?)?
//!     .with(SelectTransform::new(["observation", "done"]).with_keep_dones(false))?;
//! assert_eq!(env.done_keys(), [NestedKey::from("done")]); // "terminated" is gone
//! assert_eq!(env.reward_keys(), [NestedKey::from("reward")]);
//! let traj = env.rollout(3, None, &RolloutConfig::default())?;
//! assert!(traj.contains(("next", "observation")) && !traj.contains(("next", "terminated")));
//! # Ok(()) }
//! ```

use super::reward_sum::check_done_groups;
use super::Transform;
use crate::data::specs::Composite;
use crate::envs::{EnvSpecs, SpecGroup};
use crate::error::{Error, Result};
use crate::tensordict::{fmt_key_list, KeysOptions, NestedKey, TensorDict};

/// Keeps only the selected entries (plus rewards, dones and states). See the module docs.
pub struct SelectTransform {
    keys: Vec<NestedKey>,
    keep_rewards: bool,
    keep_dones: bool,
    /// Everything kept in the data, computed at attach.
    kept: Option<Vec<NestedKey>>,
}

impl SelectTransform {
    /// Keeps `keys` (plus rewards, dones and states by default).
    pub fn new<K: Into<NestedKey>>(keys: impl IntoIterator<Item = K>) -> Self {
        SelectTransform {
            keys: keys.into_iter().map(Into::into).collect(),
            keep_rewards: true,
            keep_dones: true,
            kept: None,
        }
    }

    /// Whether all reward keys are kept (default true); with `false` only selected ones are.
    pub fn with_keep_rewards(mut self, keep: bool) -> Self {
        self.keep_rewards = keep;
        self.kept = None;
        self
    }

    /// Whether all done keys are kept (default true); with `false` only selected ones are.
    pub fn with_keep_dones(mut self, keep: bool) -> Self {
        self.keep_dones = keep;
        self.kept = None;
        self
    }

    /// The selected keys.
    pub fn keys(&self) -> &[NestedKey] {
        &self.keys
    }

    fn selected(&self, key: &NestedKey) -> bool {
        self.keys.iter().any(|s| key.starts_with(s))
    }

    /// Removes the leaves of `c` that are not selected.
    fn prune(&self, c: &mut Composite) -> Result<()> {
        for k in c.keys(KeysOptions::nested_leaves()) {
            if !self.selected(&k) {
                c.remove(&k)?;
            }
        }
        Ok(())
    }

    fn kept(&self) -> Vec<NestedKey> {
        match &self.kept {
            Some(k) => k.clone(),
            None => {
                let mut k = self.keys.clone();
                if self.keep_rewards {
                    k.push("reward".into());
                }
                if self.keep_dones {
                    k.push("done".into());
                }
                k
            }
        }
    }

    fn select(&self, td: &TensorDict) -> Result<TensorDict> {
        td.select(&self.kept(), crate::tensordict::Strict::No)
    }
}

impl Transform for SelectTransform {
    fn name(&self) -> String {
        format!(
            "SelectTransform(keys={}, keep_rewards={}, keep_dones={})",
            fmt_key_list(&self.keys),
            self.keep_rewards,
            self.keep_dones
        )
    }

    fn attach(&mut self, parent: &EnvSpecs) -> Result<()> {
        let groups = [
            SpecGroup::Observation,
            SpecGroup::Reward,
            SpecGroup::Done,
            SpecGroup::Action,
            SpecGroup::State,
        ];
        for k in &self.keys {
            if !groups.iter().any(|g| parent.group(*g).contains(k)) {
                let available: Vec<String> = groups
                    .iter()
                    .flat_map(|g| parent.group(*g).keys(KeysOptions::nested_leaves()))
                    .map(|k| k.to_string())
                    .collect();
                return Err(Error::KeyNotFound {
                    op: "SelectTransform (selected keys are looked up in every spec of the env)",
                    key: k.to_string(),
                    available,
                });
            }
        }
        let mut kept = self.keys.clone();
        if self.keep_rewards {
            kept.extend(parent.reward_keys());
        }
        if self.keep_dones {
            kept.extend(parent.done_keys());
        }
        kept.extend(parent.state_keys());
        let mut unique: Vec<NestedKey> = Vec::with_capacity(kept.len());
        for k in kept {
            if !unique.contains(&k) {
                unique.push(k);
            }
        }
        self.kept = Some(unique);
        Ok(())
    }

    fn transform_output_spec(&self, mut specs: EnvSpecs) -> Result<EnvSpecs> {
        self.prune(&mut specs.observation)?;
        if !self.keep_rewards {
            self.prune(&mut specs.reward)?;
        }
        if !self.keep_dones {
            self.prune(&mut specs.done)?;
        }
        check_done_groups("SelectTransform", &self.name(), &specs)?;
        Ok(specs)
    }

    fn step(&mut self, _td: &TensorDict, next: TensorDict) -> Result<TensorDict> {
        self.select(&next)
    }

    fn reset(&mut self, _td: &TensorDict, reset: TensorDict) -> Result<TensorDict> {
        self.select(&reset)
    }

    fn forward(&mut self, td: TensorDict) -> Result<TensorDict> {
        self.select(&td)
    }
}
