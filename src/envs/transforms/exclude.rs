//! `ExcludeTransform`: removes entries from what the env returns (at step and at reset) and from
//! its output specs.
//!
//! Each key is deleted from the done, reward and observation specs that hold it (a key naming a
//! nested level removes the whole level); a key in none of them is an error naming it, as in
//! TorchRL (`"Key ... not found in the environment outputs"`). Excluding `"terminated"` leaves
//! the done keys `["done"]`.
//!
//! With [`ExcludeTransform::with_inverse`]`(true)` the keys are instead removed from the data
//! going **into** the parent (the inverse path; the specs are unchanged, and the keys need not
//! be in any spec): use it to drop policy outputs the parent must not see.
//!
//! ```
//! use torchrl::envs::builtin::CountingEnv;
//! use torchrl::envs::transforms::{ExcludeTransform, TransformedEnv};
//! use torchrl::{EnvBase, NestedKey, RolloutConfig};
//! # fn main() -> torchrl::Result<()> {
//! let mut env = TransformedEnv::new(CountingEnv::new(5, &[])?)?
//!     .with(ExcludeTransform::new(["terminated"]))?;
//! assert_eq!(env.done_keys(), [NestedKey::from("done")]);
//! let traj = env.rollout(3, None, &RolloutConfig::default())?;
//! assert!(!traj.contains(("next", "terminated")) && !traj.contains("terminated"));
//! assert!(TransformedEnv::new(CountingEnv::new(5, &[])?)?
//!     .with(ExcludeTransform::new(["nonexistent"]))
//!     .is_err());
//! # Ok(()) }
//! ```

use super::reward_sum::{check_done_groups, refuse_state_keys};
use super::{output_keys_available, Transform};
use crate::envs::{EnvSpecs, SpecGroup};
use crate::error::{Error, Result};
use crate::macros::setters;
use crate::tensordict::{fmt_key_list, NestedKey, TensorDict};

/// Removes entries from the env's outputs (or, inverse, its inputs). See the module docs.
pub struct ExcludeTransform {
    keys: Vec<NestedKey>,
    inverse: bool,
}

impl ExcludeTransform {
    /// Excludes `keys` from the env's outputs.
    pub fn new<K: Into<NestedKey>>(keys: impl IntoIterator<Item = K>) -> Self {
        ExcludeTransform {
            keys: keys.into_iter().map(Into::into).collect(),
            inverse: false,
        }
    }

    /// The excluded keys.
    pub fn keys(&self) -> &[NestedKey] {
        &self.keys
    }

    fn drop_keys(&self, mut td: TensorDict) -> TensorDict {
        for k in &self.keys {
            td.remove(k);
        }
        td
    }
}

setters!(ExcludeTransform {
    /// With `true`, exclude the keys from the data going into the parent instead (specs
    /// unchanged).
    with_inverse(inverse: bool);
});

impl Transform for ExcludeTransform {
    fn name(&self) -> String {
        format!(
            "ExcludeTransform(keys={}{})",
            fmt_key_list(&self.keys),
            if self.inverse { ", inverse" } else { "" }
        )
    }

    fn transform_output_spec(&self, mut specs: EnvSpecs) -> Result<EnvSpecs> {
        if self.inverse {
            return Ok(specs);
        }
        for k in &self.keys {
            // The env reads state keys back at the next step (StepCounter's counts, RewardSum's
            // sums): removing them from the outputs would break the following step.
            refuse_state_keys(
                "ExcludeTransform",
                &self.name(),
                &specs,
                [k],
                (
                    "a key other than a state key",
                    "it cannot be excluded from the env's outputs",
                ),
            )?;
            let mut found = false;
            for g in [SpecGroup::Done, SpecGroup::Reward, SpecGroup::Observation] {
                if specs.group(g).contains(k) {
                    specs.group_mut(g).remove(k)?;
                    found = true;
                }
            }
            if !found {
                return Err(Error::KeyNotFound {
                    op: "ExcludeTransform (key not found in the environment outputs: done, reward \
                         and observation specs)",
                    key: k.to_string(),
                    available: output_keys_available(&specs),
                });
            }
        }
        check_done_groups("ExcludeTransform", &self.name(), &specs)?;
        Ok(specs)
    }

    fn step(&mut self, _td: &TensorDict, next: TensorDict) -> Result<TensorDict> {
        Ok(if self.inverse {
            next
        } else {
            self.drop_keys(next)
        })
    }

    fn reset(&mut self, _td: &TensorDict, reset: TensorDict) -> Result<TensorDict> {
        Ok(if self.inverse {
            reset
        } else {
            self.drop_keys(reset)
        })
    }

    fn inv(&mut self, td: TensorDict) -> Result<TensorDict> {
        Ok(if self.inverse { self.drop_keys(td) } else { td })
    }

    fn forward(&mut self, td: TensorDict) -> Result<TensorDict> {
        Ok(if self.inverse { td } else { self.drop_keys(td) })
    }
}
