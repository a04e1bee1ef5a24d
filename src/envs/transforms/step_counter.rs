//! `StepCounter`: counts the steps since the last reset and, optionally, truncates episodes.
//!
//! For every done group of the parent env (TorchRL's filtered reset keys: nested groups under
//! another group are left out), the transform keeps a `step_count` entry (int64, the done leaves'
//! shape) next to the group's done flags:
//! - reset: `step_count = 0` for the batch elements being reset (those whose `"_reset"` mask is
//!   true, or all of them without a mask); the others keep their count;
//! - step: `next.step_count = step_count + 1`.
//!
//! With [`StepCounter::with_max_steps`], `next.truncated = next.step_count >= max_steps` (or'ed
//! with any truncated flag the parent wrote) and, unless [`StepCounter::with_update_done`] is
//! false, `next.done |= truncated`; `terminated` is left untouched, so consumers can tell a
//! time-limit from a real termination. At reset, `truncated` (and `done`) are recomputed from the
//! reset count, as TorchRL does.
//!
//! Specs: `step_count` is `Bounded(0, i64::MAX)`, int64, with the done leaves' shape, in the
//! observation **and** state specs; with `max_steps`, `truncated` (and `done`) are declared as
//! `Categorical(2)` bool leaves of the done spec. Without `max_steps` no truncated key is added.
//!
//! [`Transform::forward`] errors, as in TorchRL: step counts need sequential env steps.
//!
//! ```
//! use torchrl::envs::builtin::CountingEnv;
//! use torchrl::envs::transforms::{StepCounter, TransformedEnv};
//! use torchrl::envs::{EnvBase, RolloutConfig};
//! # fn main() -> torchrl::Result<()> {
//! let mut env = TransformedEnv::new(CountingEnv::new(100, &[])?)?
//!     .with(StepCounter::new().with_max_steps(3)?)?;
//! assert!(env.specs().done.contains("truncated"));
//! let traj = env.rollout(10, None, &RolloutConfig::default())?;
//! assert_eq!(traj.batch_size(), &[3]); // truncated after 3 steps
//! let counts = Vec::<i64>::try_from(traj.get_or_err(("next", "step_count"))?.reshape([-1]))?;
//! assert_eq!(counts, vec![1, 2, 3]);
//! let term = traj.get_or_err(("next", "terminated"))?.any().int64_value(&[]);
//! assert_eq!(term, 0); // a truncation is not a termination
//! # Ok(()) }
//! ```

use tch::{Device, Kind, Tensor};

use super::reward_sum::{done_shape, expand_right, required_reset_roots, reset_mask};
use super::{attached, Transform};
use crate::data::specs::{Bounded, Categorical};
use crate::envs::EnvSpecs;
use crate::error::{Error, Result};
use crate::macros::setters;
use crate::tensordict::{fmt_key_list, NestedKey, TensorDict};

/// The keys of one done group, resolved when the transform joins an env.
#[derive(Clone, Debug)]
struct Group {
    root: NestedKey,
    step_count: NestedKey,
    truncated: NestedKey,
    done: NestedKey,
    shape: Vec<i64>,
}

/// Counts steps since reset; truncates at `max_steps`. See the module docs.
#[derive(Clone, Debug)]
pub struct StepCounter {
    max_steps: Option<i64>,
    truncated_key: String,
    step_count_key: String,
    update_done: bool,
    groups: Vec<Group>,
    device: Device,
}

impl Default for StepCounter {
    fn default() -> Self {
        StepCounter {
            max_steps: None,
            truncated_key: "truncated".into(),
            step_count_key: "step_count".into(),
            update_done: true,
            groups: Vec::new(),
            device: Device::Cpu,
        }
    }
}

impl StepCounter {
    /// Counts steps, without truncation.
    pub fn new() -> Self {
        StepCounter::default()
    }

    /// Truncates episodes after `max_steps` steps. Errors when `max_steps < 1`.
    pub fn with_max_steps(mut self, max_steps: i64) -> Result<Self> {
        if max_steps < 1 {
            return Err(Error::config(
                "StepCounter::with_max_steps",
                "max_steps",
                "a value >= 1 (max_steps should have a value greater or equal to one)",
                max_steps,
            ));
        }
        self.max_steps = Some(max_steps);
        Ok(self)
    }

    /// The maximum number of steps, if any.
    pub fn max_steps(&self) -> Option<i64> {
        self.max_steps
    }

    fn step_count_spec(&self, shape: &[i64]) -> Result<Bounded> {
        let opts = (Kind::Int64, self.device);
        Bounded::from_tensors(
            Tensor::f_zeros(shape, opts)?,
            Tensor::f_full(shape, i64::MAX, opts)?,
        )
    }

    fn flag_spec(&self, shape: &[i64]) -> Result<Categorical> {
        Categorical::new(2)?
            .with_shape(shape)?
            .with_dtype(Kind::Bool)?
            .with_device(self.device)
    }

    fn check_name(op: &'static str, what: &'static str, name: &str) -> Result<()> {
        if name.is_empty() || name == "_reset" || name == "next" {
            return Err(Error::config(
                op,
                what,
                "a non-empty leaf name other than \"_reset\" and \"next\"",
                format!("{name:?}"),
            ));
        }
        Ok(())
    }
}

setters!(StepCounter {
    /// The leaf name of the truncated flags (default `"truncated"`), placed in each done group.
    with_truncated_key(name: impl Into<String>) => truncated_key = name.into();
    /// The leaf name of the counters (default `"step_count"`), placed in each done group.
    with_step_count_key(name: impl Into<String>) => step_count_key = name.into();
    /// Whether a truncation also sets `done` (default true).
    with_update_done(update_done: bool);
});

/// `t` as a bool tensor.
fn as_bool(t: &Tensor) -> Result<Tensor> {
    Ok(t.f_to_kind(Kind::Bool)?)
}

impl Transform for StepCounter {
    fn name(&self) -> String {
        match self.max_steps {
            Some(m) => format!("StepCounter(max_steps={m}, key={:?})", self.step_count_key),
            None => format!("StepCounter(key={:?})", self.step_count_key),
        }
    }

    fn attach(&mut self, parent: &EnvSpecs) -> Result<()> {
        let op = "StepCounter::attach";
        Self::check_name(op, "the step count key", &self.step_count_key)?;
        Self::check_name(op, "the truncated key", &self.truncated_key)?;
        let roots = required_reset_roots(parent, op, "to count steps for")?;
        let mut groups = Vec::with_capacity(roots.len());
        for root in roots {
            let shape = done_shape(parent, &root, op)?;
            groups.push(Group {
                step_count: root.join(self.step_count_key.as_str()),
                truncated: root.join(self.truncated_key.as_str()),
                done: root.join("done"),
                root,
                shape,
            });
        }
        for g in &groups {
            for (what, c) in [("reward", &parent.reward), ("action", &parent.action)] {
                if c.contains(&g.step_count) {
                    return Err(Error::value(
                        op,
                        &g.step_count,
                        "a step count key that is new to the parent's specs",
                        format!("a key already in the parent's {what} spec"),
                    ));
                }
            }
        }
        if self.max_steps.is_some() {
            // With truncations, "done" alone cannot tell them from terminations: done
            // completion needs "terminated" in the group (it refuses "done" and "truncated"
            // without it at every step).
            for g in &groups {
                let terminated = g.root.join("terminated");
                if !parent.done.contains(&terminated) {
                    return Err(Error::InvalidValue {
                        op,
                        what: "done group of",
                        key: g.done.to_string(),
                        expected: format!(
                            "a {terminated} entry (truncating its episodes needs one)"
                        ),
                        got: format!(
                            "no {terminated} entry (done keys: {}; was it renamed or excluded?)",
                            fmt_key_list(&parent.done_keys())
                        ),
                    });
                }
            }
        }
        self.device = parent.device();
        self.groups = groups;
        Ok(())
    }

    fn new_output_keys(&self) -> Vec<NestedKey> {
        let mut keys: Vec<NestedKey> = self.groups.iter().map(|g| g.step_count.clone()).collect();
        if self.max_steps.is_some() {
            keys.extend(self.groups.iter().map(|g| g.truncated.clone()));
        }
        keys
    }

    fn transform_output_spec(&self, mut specs: EnvSpecs) -> Result<EnvSpecs> {
        for g in &self.groups {
            specs
                .observation
                .set(&g.step_count, self.step_count_spec(&g.shape)?)?;
            if self.max_steps.is_some() {
                specs.done.set(&g.truncated, self.flag_spec(&g.shape)?)?;
                if self.update_done {
                    specs.done.set(&g.done, self.flag_spec(&g.shape)?)?;
                }
            }
        }
        Ok(specs)
    }

    fn transform_input_spec(&self, mut specs: EnvSpecs) -> Result<EnvSpecs> {
        for g in &self.groups {
            specs
                .state
                .set(&g.step_count, self.step_count_spec(&g.shape)?)?;
        }
        Ok(specs)
    }

    fn step(&mut self, td: &TensorDict, mut next: TensorDict) -> Result<TensorDict> {
        let op = "StepCounter::step";
        for g in attached(op, self, &self.groups)? {
            let count = td.get(&g.step_count).ok_or_else(|| {
                Error::value(
                    op,
                    &g.step_count,
                    "the step count in the input tensordict (step from the tensordict returned \
                     by reset or by the previous step)",
                    format!(
                        "nothing: it is missing (keys: {})",
                        fmt_key_list(&td.keys(crate::tensordict::KeysOptions::nested_leaves()))
                    ),
                )
            })?;
            let next_count = count.f_add_scalar(1)?;
            if let Some(max) = self.max_steps {
                let mut truncated = next_count.f_ge(max)?;
                if let Some(prev) = next.get(&g.truncated) {
                    truncated = truncated.f_logical_or(&as_bool(prev)?)?;
                }
                if self.update_done {
                    let done = match next.get(&g.done) {
                        Some(d) => as_bool(d)?.f_logical_or(&truncated)?,
                        None => truncated.shallow_clone(),
                    };
                    next.set(&g.done, done)?;
                }
                next.set(&g.truncated, truncated)?;
            }
            next.set(&g.step_count, next_count)?;
        }
        Ok(next)
    }

    fn reset(&mut self, td: &TensorDict, mut reset: TensorDict) -> Result<TensorDict> {
        let op = "StepCounter::reset";
        for g in attached(op, self, &self.groups)? {
            let mask = reset_mask(td, &g.root)?;
            let count = match (td.get(&g.step_count), mask) {
                (Some(old), Some(m)) => {
                    let m = expand_right(&m, &old.size(), op, &g.step_count)?;
                    old.f_to_kind(Kind::Int64)?.f_masked_fill(&m, 0)?
                }
                _ => Tensor::f_zeros(g.shape.as_slice(), (Kind::Int64, self.device))?,
            };
            if let Some(max) = self.max_steps {
                let mut truncated = count.f_ge(max)?;
                if let Some(prev) = reset.get(&g.truncated) {
                    truncated = truncated.f_logical_or(&as_bool(prev)?)?;
                }
                if self.update_done {
                    reset.set(&g.done, truncated.shallow_clone())?;
                }
                reset.set(&g.truncated, truncated)?;
            }
            reset.set(&g.step_count, count)?;
        }
        Ok(reset)
    }

    fn forward(&mut self, _td: TensorDict) -> Result<TensorDict> {
        Err(Error::invalid(
            "StepCounter::forward",
            "StepCounter cannot be called independently, only its step and reset methods are \
             functional: step counts need sequential env steps, which offline data (a replay \
             buffer, a dataset) does not provide",
        ))
    }
}
