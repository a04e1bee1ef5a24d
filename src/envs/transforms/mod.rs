//! Transforms: composable rewrites of an environment's specs and step data.
//!
//! A [`Transform`] has no-op defaults for every hook; implement the ones you need:
//! - spec hooks ([`Transform::transform_output_spec`], [`Transform::transform_input_spec`], and
//!   the per-group conveniences) receive the parent's specs **by value** (a copy) and return
//!   new ones, so a transform can never alter its parent's specs;
//! - [`Transform::attach`] is called by [`TransformedEnv`] with the parent's (already
//!   transformed) specs before the spec hooks, so a transform can discover its keys lazily
//!   (reward keys, float64 keys, …). It may be called again when the stack changes;
//! - data hooks: [`Transform::step`] (sees the data at `t` and the parent's next tensordict),
//!   [`Transform::reset`], [`Transform::inv`] (actions and states going into the parent) and
//!   [`Transform::forward`] (offline data).
//!
//! ```
//! use torchrl::envs::transforms::Transform;
//! use torchrl::envs::EnvSpecs;
//! use torchrl::{Result, TensorDict};
//!
//! /// Doubles the reward.
//! struct Double;
//! impl Transform for Double {
//!     fn name(&self) -> String { "Double".into() }
//!     fn step(&mut self, _td: &TensorDict, mut next: TensorDict) -> Result<TensorDict> {
//!         let r = next.get_or_err("reward")? * 2.0;
//!         next.set("reward", r)?;
//!         Ok(next)
//!     }
//! }
//! # let _ = Double;
//! ```

mod compose;
mod transformed_env;

// reward & episode transforms
mod action_clamp;
mod clip;
mod frame_skip;
mod init_tracker;
mod reward_clipping;
mod reward_scaling;
mod reward_sum;
mod step_counter;
mod tensordict_primer;
mod vec_norm;
pub use action_clamp::{ActionClamp, NanPolicy};
pub use init_tracker::InitTracker;
pub use reward_clipping::RewardClipping;
pub use reward_scaling::RewardScaling;
pub use reward_sum::RewardSum;
pub use step_counter::StepCounter;
pub use tensordict_primer::TensorDictPrimer;
// end reward & episode transforms

// key, dtype and normalisation transforms
mod cat_tensors;
mod dtype_cast;
mod exclude;
mod observation_norm;
mod rename;
mod select;
mod unsqueeze;
pub use cat_tensors::CatTensors;
pub use dtype_cast::{DTypeCast, DoubleToFloat};
pub use exclude::ExcludeTransform;
pub use observation_norm::{InitStats, ObservationNorm};
pub use rename::RenameTransform;
pub use select::SelectTransform;
pub use unsqueeze::UnsqueezeTransform;
// end key, dtype and normalisation transforms

// KL reward
mod kl_reward;
pub use kl_reward::{DistributionSource, KLRewardTransform, DEFAULT_LOG_PROB_KEY};
// end KL reward

pub use clip::ClipTransform;
pub use compose::Compose;
pub use frame_skip::FrameSkipTransform;
pub use transformed_env::{TransformHandle, TransformedEnv};
pub use vec_norm::VecNorm;

use tch::Tensor;

use super::{EnvSpecs, SpecGroup};
use crate::data::specs::{Composite, TensorSpec};
use crate::error::{Error, Result};
use crate::tensordict::{fmt_key_list, KeysOptions, NestedKey, TensorDict};

/// Pairs each in key with its out key (with itself when there are no out keys). When the
/// counts differ: an error under `op` naming the transform (`who`; its name is only formatted
/// for the error, since this runs every step) and both lists; `what`
/// qualifies the keys in the message (`""` or `"inverse "`).
pub(crate) fn key_pairs(
    op: &'static str,
    who: &dyn Transform,
    ins: &[NestedKey],
    outs: Option<&[NestedKey]>,
    what: &str,
) -> Result<Vec<(NestedKey, NestedKey)>> {
    match outs {
        None => Ok(ins.iter().map(|k| (k.clone(), k.clone())).collect()),
        Some(o) if o.len() == ins.len() => Ok(ins.iter().cloned().zip(o.iter().cloned()).collect()),
        Some(o) => Err(Error::config(
            op,
            if what.is_empty() {
                "out_keys"
            } else {
                "out_keys_inv"
            },
            format!(
                "{} {what}out keys, one per {what}in key {} (give one out key per in key)",
                ins.len(),
                fmt_key_list(ins)
            ),
            format_args!(
                "{}: {} {what}out keys {}",
                who.name(),
                o.len(),
                fmt_key_list(o)
            ),
        )),
    }
}

/// The floating-point `Unbounded` reward spec at `input` in `spec`, for a transform (`who`)
/// that only handles those; the errors name the key and the spec found, and `only` says what
/// the transform does instead (e.g. "it only clips Unbounded rewards").
/// A transform's in keys and optional out keys (one per in key; `None`: write back to the in
/// keys), for its forward or its inverse direction.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct KeyMap {
    /// The keys read.
    pub(crate) ins: Vec<NestedKey>,
    /// The keys written, when they differ from the in keys.
    pub(crate) outs: Option<Vec<NestedKey>>,
}

impl KeyMap {
    /// In keys `ins`, written back in place.
    pub(crate) fn new(ins: Vec<NestedKey>) -> Self {
        KeyMap { ins, outs: None }
    }

    /// `(in, out)` pairs (see [`key_pairs`]); `what` qualifies the keys in the message
    /// (`"inverse "`).
    pub(crate) fn pairs(
        &self,
        op: &'static str,
        who: &dyn Transform,
        what: &str,
    ) -> Result<Vec<(NestedKey, NestedKey)>> {
        key_pairs(op, who, &self.ins, self.outs.as_deref(), what)
    }
}

pub(crate) fn float_unbounded_reward(
    op: &'static str,
    who: &str,
    only: &str,
    spec: &Composite,
    input: &NestedKey,
) -> Result<crate::data::specs::Unbounded> {
    use crate::data::specs::TensorSpec;
    match spec.get(input) {
        Some(TensorSpec::Unbounded(u)) if !u.is_discrete() => Ok(u.clone()),
        Some(leaf @ TensorSpec::Unbounded(u)) => Err(Error::value(
            op,
            input,
            format!("a floating-point reward ({who} needs one)"),
            format!("a reward spec of dtype {:?} ({leaf})", u.dtype()),
        )),
        Some(other) => Err(Error::value(
            op,
            input,
            format!("an Unbounded reward spec ({who}: {only})"),
            format!(
                "the {} reward spec {other} ({who} is not implemented for it)",
                other.class_name()
            ),
        )),
        None => Err(Error::value(
            op,
            input,
            format!(
                "an in key of the reward spec (reward keys: {})",
                fmt_key_list(&spec.keys(KeysOptions::nested_leaves()))
            ),
            "an in key that is not in the reward spec",
        )),
    }
}

/// The error of a data hook of a transform that has not joined an environment yet (its keys
/// are discovered when it is attached).
#[cold]
fn not_attached(op: &'static str, who: &dyn Transform) -> Error {
    Error::invalid(
        op,
        format!(
            "{} has not joined an environment; add it to a TransformedEnv first",
            who.name()
        ),
    )
}

/// `slots`, what a transform resolved when it joined its environment, or the
/// [`not_attached`] error under `op` when there are none (it has not joined one yet).
#[inline]
pub(crate) fn attached<'a, T>(
    op: &'static str,
    who: &dyn Transform,
    slots: &'a [T],
) -> Result<&'a [T]> {
    if slots.is_empty() {
        return Err(not_attached(op, who));
    }
    Ok(slots)
}

/// Rewrites the `(parent-side, policy-side)` key pairs `pairs` of `td`: each source entry (the
/// parent-side one, or with `inverse` the policy-side one) mapped by `f` (given the entry and
/// its key) and written at the other key. A missing source is skipped when `tolerant`, else a
/// [`missing_key`] error under `op`.
#[inline]
pub(crate) fn map_key_pairs(
    td: &mut TensorDict,
    pairs: &[(NestedKey, NestedKey)],
    inverse: bool,
    tolerant: bool,
    op: &'static str,
    mut f: impl FnMut(&Tensor, &NestedKey) -> Result<Tensor>,
) -> Result<()> {
    for (a, b) in pairs {
        let (src, dst) = if inverse { (b, a) } else { (a, b) };
        let v = match td.get(src) {
            Some(v) => f(v, src)?,
            None if tolerant => continue,
            None => return Err(missing_key(op, td, src)),
        };
        td.set(dst, v)?;
    }
    Ok(())
}

/// [`Error::KeyNotFound`] for `key`, missing from `td`, listing the keys `td` has.
#[cold]
pub(crate) fn missing_key(op: &'static str, td: &TensorDict, key: &NestedKey) -> Error {
    Error::KeyNotFound {
        op,
        key: key.to_string(),
        available: td
            .keys(crate::tensordict::KeysOptions::nested_leaves())
            .into_iter()
            .map(|k| k.to_string())
            .collect(),
    }
}

/// Writes `f(reward)` at `output` for each `(input, output)` reward pair of `td`; a missing
/// reward is an error naming `who` and the keys `td` has.
pub(crate) fn map_rewards(
    op: &'static str,
    who: &dyn Transform,
    pairs: Vec<(NestedKey, NestedKey)>,
    mut td: TensorDict,
    mut f: impl FnMut(&NestedKey, &tch::Tensor) -> Result<tch::Tensor>,
) -> Result<TensorDict> {
    for (input, output) in pairs {
        let r = td.get(&input).ok_or_else(|| Error::KeyNotFound {
            op,
            key: format!("{input} (the reward {} reads)", who.name()),
            available: td
                .keys(crate::tensordict::KeysOptions::nested_leaves())
                .iter()
                .map(ToString::to_string)
                .collect(),
        })?;
        let v = f(&input, r)?;
        td.set(&output, v)?;
    }
    Ok(td)
}

/// The keys an env outputs (done, reward, observation), as printed, for a
/// [`Error::KeyNotFound`] naming what is available.
pub(crate) fn output_keys_available(specs: &EnvSpecs) -> Vec<String> {
    specs
        .done_keys()
        .into_iter()
        .chain(specs.reward_keys())
        .chain(specs.observation_keys())
        .map(|k| k.to_string())
        .collect()
}

/// The keys an env reads (action, state), as printed, for a [`Error::KeyNotFound`] naming
/// what is available.
pub(crate) fn input_keys_available(specs: &EnvSpecs) -> Vec<String> {
    specs
        .action_keys()
        .into_iter()
        .chain(specs.state_keys())
        .map(|k| k.to_string())
        .collect()
}

/// Rewrites the reward spec of each `(input, output)` pair: `f` gets the pair and the input's
/// float [`Unbounded`](crate::data::specs::Unbounded) spec (any other spec is an error naming
/// `who` and what it supports, `only`) and returns the spec to set at `output`, if any.
pub(crate) fn map_reward_specs(
    op: &'static str,
    who: &str,
    only: &str,
    pairs: Vec<(NestedKey, NestedKey)>,
    mut spec: Composite,
    mut f: impl FnMut(
        &NestedKey,
        &NestedKey,
        crate::data::specs::Unbounded,
    ) -> Result<Option<crate::data::specs::TensorSpec>>,
) -> Result<Composite> {
    for (input, output) in pairs {
        let u = float_unbounded_reward(op, who, only, &spec, &input)?;
        if let Some(new) = f(&input, &output, u)? {
            spec.set(&output, new)?;
        }
    }
    Ok(spec)
}

/// Rewrites the input specs of inverse `(in_key, out_key)` pairs: each in key (parent side)
/// is looked up in the action spec, then the state spec (else a [`Error::KeyNotFound`] under
/// `op` listing the input keys), its spec mapped by `f` (given the key, the spec and its group)
/// and set at the out key, the in key's entry removed when the two differ.
pub(crate) fn map_input_specs(
    op: &'static str,
    mut specs: EnvSpecs,
    pairs: Vec<(NestedKey, NestedKey)>,
    mut f: impl FnMut(&NestedKey, &TensorSpec, SpecGroup) -> Result<TensorSpec>,
) -> Result<EnvSpecs> {
    for (in_key, out_key) in pairs {
        let Some(group) = specs.input_group_of(&in_key) else {
            return Err(Error::KeyNotFound {
                op,
                key: in_key.to_string(),
                available: input_keys_available(&specs),
            });
        };
        let mapped = f(&in_key, specs.group(group).get_or_err(&in_key)?, group)?;
        let g = specs.group_mut(group);
        if in_key != out_key {
            g.remove(&in_key)?;
        }
        g.set(&out_key, mapped)?;
    }
    Ok(specs)
}

/// The spec groups an env outputs (observation, reward, done), for [`refuse_taken_key`].
pub(crate) const OUTPUT_GROUPS: [SpecGroup; 3] =
    [SpecGroup::Observation, SpecGroup::Reward, SpecGroup::Done];

/// Errors ([`Error::InvalidValue`] on `key` under `op`) when one of the parent's `groups`
/// already holds `key`, a key the transform means to add; `expected` says what it should be.
pub(crate) fn refuse_taken_key(
    op: &'static str,
    parent: &EnvSpecs,
    groups: &[SpecGroup],
    key: &NestedKey,
    expected: &str,
) -> Result<()> {
    match groups.iter().find(|g| parent.group(**g).contains(key)) {
        None => Ok(()),
        Some(g) => Err(Error::value(
            op,
            key,
            expected,
            format!("a key already in the parent's {g} spec"),
        )),
    }
}

/// The out keys of `pairs` that differ from their in keys (the keys a transform adds).
pub(crate) fn added_keys(pairs: &[(NestedKey, NestedKey)]) -> Vec<NestedKey> {
    pairs
        .iter()
        .filter(|(i, o)| i != o)
        .map(|(_, o)| o.clone())
        .collect()
}

/// Access to a transform's concrete type once it is boxed in a [`Compose`] (see
/// [`Compose::get_as`]). Implemented for every `'static` type; never implement it by hand.
pub trait AsAny {
    /// `self` as `&dyn Any`.
    fn as_any(&self) -> &dyn std::any::Any;
    /// `self` as `&mut dyn Any`.
    fn as_any_mut(&mut self) -> &mut dyn std::any::Any;
}

impl<T: std::any::Any> AsAny for T {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }
}

/// The step of a transform's parent: the base env and the transforms before the transform,
/// handed to [`Transform::step_with_parent`].
pub trait ParentStep {
    /// Steps the parent once more with the actions in `td` (the tensordict the env's step
    /// received, after the inverse transforms) and returns its next tensordict (not nested
    /// under `"next"`), as the transform's [`Transform::step`] would have received it.
    fn step(&mut self, td: &TensorDict) -> Result<TensorDict>;
}

/// A composable rewrite of an environment's specs and data. Every hook defaults to a no-op.
pub trait Transform: Send + AsAny {
    /// A short name used in error messages (`"RewardScaling(loc=0, scale=0.1)"`).
    fn name(&self) -> String;

    /// Receives the parent's (already transformed) specs when the transform joins an env, and
    /// whenever the stack before it changes. Discover lazy keys here.
    fn attach(&mut self, _parent: &EnvSpecs) -> Result<()> {
        Ok(())
    }

    /// Keys this transform writes that the parent does not have; [`TransformedEnv`] checks that
    /// each one is registered in the transformed output specs (TorchRL's "unaccounted for"
    /// check).
    fn new_output_keys(&self) -> Vec<NestedKey> {
        Vec::new()
    }

    /// Rewrites all of the specs: the input side, then the output side. [`Compose`] overrides it
    /// to fold its children in order; there is rarely a reason to override it elsewhere.
    fn transform_specs(&self, specs: EnvSpecs) -> Result<EnvSpecs> {
        let specs = self.transform_input_spec(specs)?;
        self.transform_output_spec(specs)
    }

    /// Rewrites the output side (observation, reward, done). The default applies the three
    /// per-group hooks.
    fn transform_output_spec(&self, mut specs: EnvSpecs) -> Result<EnvSpecs> {
        specs.observation = self.transform_observation_spec(specs.observation)?;
        specs.reward = self.transform_reward_spec(specs.reward)?;
        specs.done = self.transform_done_spec(specs.done)?;
        Ok(specs)
    }

    /// Rewrites the input side (action, state). The default applies the two per-group hooks.
    fn transform_input_spec(&self, mut specs: EnvSpecs) -> Result<EnvSpecs> {
        specs.action = self.transform_action_spec(specs.action)?;
        specs.state = self.transform_state_spec(specs.state)?;
        Ok(specs)
    }

    /// Rewrites the full observation spec.
    fn transform_observation_spec(&self, spec: Composite) -> Result<Composite> {
        Ok(spec)
    }
    /// Rewrites the full reward spec.
    fn transform_reward_spec(&self, spec: Composite) -> Result<Composite> {
        Ok(spec)
    }
    /// Rewrites the full done spec.
    fn transform_done_spec(&self, spec: Composite) -> Result<Composite> {
        Ok(spec)
    }
    /// Rewrites the full action spec.
    fn transform_action_spec(&self, spec: Composite) -> Result<Composite> {
        Ok(spec)
    }
    /// Rewrites the full state spec.
    fn transform_state_spec(&self, spec: Composite) -> Result<Composite> {
        Ok(spec)
    }

    /// Step hook: `td` is the data at time `t` (as the parent saw it), `next` the parent's next
    /// tensordict. Returns the transformed next tensordict.
    fn step(&mut self, _td: &TensorDict, next: TensorDict) -> Result<TensorDict> {
        Ok(next)
    }

    /// Step hook with access to the parent's step, for a transform that must step its parent
    /// more than once per step of the env (a frame skip): `parent.step(td)` runs the base env
    /// and the transforms before this one once more and returns their next tensordict. The
    /// default ignores `parent` and calls [`Transform::step`]; [`TransformedEnv`] calls this
    /// hook, a bare [`Compose`] used on offline data calls [`Transform::step`].
    fn step_with_parent(
        &mut self,
        td: &TensorDict,
        next: TensorDict,
        _parent: &mut dyn ParentStep,
    ) -> Result<TensorDict> {
        self.step(td, next)
    }

    /// Reset hook: `td` is the tensordict given to reset (empty when none, possibly with
    /// `"_reset"` masks), `reset` the parent's reset output. Returns the transformed output.
    fn reset(&mut self, _td: &TensorDict, reset: TensorDict) -> Result<TensorDict> {
        Ok(reset)
    }

    /// Inverse hook: rewrites actions / states on their way into the parent env. Receives a
    /// shallow copy, so renaming keys here does not change the caller's tensordict.
    fn inv(&mut self, td: TensorDict) -> Result<TensorDict> {
        Ok(td)
    }

    /// True when the transform makes one batch element's output depend on the others' data
    /// (running statistics over the batch, as [`VecNorm`]'s); see
    /// [`EnvBase::couples_batch_elements`](crate::envs::EnvBase::couples_batch_elements).
    fn couples_batch_elements(&self) -> bool {
        false
    }

    /// Seeds the transform's own randomness (called by `TransformedEnv::set_seed` after the
    /// base env is seeded).
    fn set_seed(&mut self, _seed: u64) -> Result<()> {
        Ok(())
    }

    /// Applies the transform to offline data (a tensordict from a buffer, not an env step).
    fn forward(&mut self, td: TensorDict) -> Result<TensorDict> {
        Ok(td)
    }
}
