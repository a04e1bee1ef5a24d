//! `InitTracker`: marks the first step of every episode.
//!
//! For every done group of the parent env (TorchRL's filtered reset keys), the transform writes a
//! bool entry `is_init` (the done leaves' shape) next to the group's done flags: true in the
//! tensordict returned by reset (for the batch elements being reset: the group's `"_reset"` mask,
//! or all of them without a mask), false in every step's output. Recurrent policies use it to
//! reset their hidden state. The key is declared as a `Categorical(2)` bool leaf of the
//! observation spec; a parent that already declares it (e.g. a second `InitTracker` with the
//! same key) is rejected when the transform joins the env.
//!
//! [`Transform::forward`] leaves offline data unchanged (the flag only exists along env steps).
//!
//! ```
//! use torchrl::envs::builtin::CountingEnv;
//! use torchrl::envs::transforms::{InitTracker, TransformedEnv};
//! use torchrl::envs::{EnvBase, RolloutConfig};
//! # fn main() -> torchrl::Result<()> {
//! let mut env = TransformedEnv::new(CountingEnv::new(3, &[])?)?.with(InitTracker::new())?;
//! let traj = env.rollout(7, None, &RolloutConfig::no_break())?;
//! let init = Vec::<bool>::try_from(traj.get_or_err("is_init")?.reshape([-1]))?;
//! assert_eq!(init, vec![true, false, false, true, false, false, true]);
//! # Ok(()) }
//! ```

use tch::{Device, Kind, Tensor};

use super::reward_sum::{done_shape, expand_right, required_reset_roots, reset_mask};
use super::{attached, refuse_taken_key, Transform, OUTPUT_GROUPS};
use crate::data::specs::Categorical;
use crate::envs::EnvSpecs;
use crate::error::{Error, Result};
use crate::macros::setters;
use crate::tensordict::{NestedKey, TensorDict};

/// Writes `is_init`: true right after a reset, false after a step. See the module docs.
#[derive(Clone, Debug)]
pub struct InitTracker {
    init_key: String,
    /// (done-group prefix, init key, done shape), resolved when joining an env.
    groups: Vec<(NestedKey, NestedKey, Vec<i64>)>,
    device: Device,
}

impl Default for InitTracker {
    fn default() -> Self {
        InitTracker {
            init_key: "is_init".into(),
            groups: Vec::new(),
            device: Device::Cpu,
        }
    }
}

impl InitTracker {
    /// Tracks episode starts in `is_init`.
    pub fn new() -> Self {
        InitTracker::default()
    }
}

setters!(InitTracker {
    /// The leaf name of the flag (default `"is_init"`), placed in each done group.
    with_init_key(name: impl Into<String>) => init_key = name.into();
});

impl Transform for InitTracker {
    fn name(&self) -> String {
        format!("InitTracker(init_key={:?})", self.init_key)
    }

    fn attach(&mut self, parent: &EnvSpecs) -> Result<()> {
        let op = "InitTracker::attach";
        let name = self.init_key.as_str();
        if name.is_empty() || name == "_reset" || name == "next" {
            return Err(Error::argument(
                op,
                "init_key",
                "a non-empty leaf name other than \"_reset\" and \"next\"",
                format!("{name:?}"),
            ));
        }
        let roots = required_reset_roots(parent, op, "to track resets for")?;
        let mut groups = Vec::with_capacity(roots.len());
        for root in roots {
            let shape = done_shape(parent, &root, op)?;
            let key = root.join(name);
            refuse_taken_key(
                op,
                parent,
                &OUTPUT_GROUPS,
                &key,
                "an init key that is new to the parent's specs",
            )?;
            groups.push((root, key, shape));
        }
        self.device = parent.device();
        self.groups = groups;
        Ok(())
    }

    fn new_output_keys(&self) -> Vec<NestedKey> {
        self.groups.iter().map(|(_, k, _)| k.clone()).collect()
    }

    fn transform_observation_spec(
        &self,
        mut spec: crate::data::specs::Composite,
    ) -> Result<crate::data::specs::Composite> {
        for (_, key, shape) in &self.groups {
            let leaf = Categorical::new(2)?
                .with_shape(shape)?
                .with_dtype(Kind::Bool)?
                .with_device(self.device)?;
            spec.set(key, leaf)?;
        }
        Ok(spec)
    }

    fn step(&mut self, _td: &TensorDict, mut next: TensorDict) -> Result<TensorDict> {
        attached("InitTracker::step", self, &self.groups)?;
        for (_, key, shape) in &self.groups {
            if next.get(key).is_none() {
                next.set(
                    key,
                    Tensor::f_zeros(shape.as_slice(), (Kind::Bool, self.device))?,
                )?;
            }
        }
        Ok(next)
    }

    fn reset(&mut self, td: &TensorDict, mut reset: TensorDict) -> Result<TensorDict> {
        let op = "InitTracker::reset";
        attached(op, self, &self.groups)?;
        for (root, key, shape) in &self.groups {
            let value = match reset_mask(td, root)? {
                Some(m) => expand_right(&m, shape, op, key)?
                    .f_to_device(self.device)?
                    .f_contiguous()?,
                None => Tensor::f_ones(shape.as_slice(), (Kind::Bool, self.device))?,
            };
            reset.set(key, value)?;
        }
        Ok(reset)
    }
}
