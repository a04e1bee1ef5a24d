//! The `EnvBase` trait: implementors provide specs and two methods that return fresh data;
//! everything else (reset with partial-reset masks, step, rollout, random actions, seeding,
//! key lists, fake data) is provided with TorchRL's semantics.
//!
//! ```
//! use tch::{Device, Kind, Tensor};
//! use torchrl::envs::{EnvBase, EnvCore, EnvSpecs, RolloutConfig};
//! use torchrl::specs::{Bounded, Unbounded};
//! use torchrl::TensorDict;
//!
//! /// Counts up by one per step; done after 5 steps.
//! struct Counter { core: EnvCore, count: f32 }
//!
//! impl EnvBase for Counter {
//!     fn core(&self) -> &EnvCore { &self.core }
//!     fn core_mut(&mut self) -> &mut EnvCore { &mut self.core }
//!     fn reset_impl(&mut self, _td: Option<&TensorDict>) -> torchrl::Result<TensorDict> {
//!         self.count = 0.0;
//!         TensorDict::new([])?.with("observation", Tensor::from_slice(&[0.0f32]))
//!     }
//!     fn step_impl(&mut self, _td: &TensorDict) -> torchrl::Result<TensorDict> {
//!         self.count += 1.0;
//!         TensorDict::new([])?
//!             .with("observation", Tensor::from_slice(&[self.count]))?
//!             .with("reward", Tensor::from_slice(&[1.0f32]))?
//!             .with("done", Tensor::from_slice(&[self.count >= 5.0]))
//!     }
//! }
//!
//! # fn main() -> torchrl::Result<()> {
//! let specs = EnvSpecs::new([])?
//!     .with_observation("observation", Unbounded::new())?
//!     .with_action("action", Bounded::new(-1.0, 1.0, [1])?)?
//!     .with_reward("reward", Unbounded::new())?;
//! let mut env = Counter { core: EnvCore::new(specs)?, count: 0.0 };
//! let traj = env.rollout(10, None, &RolloutConfig::default())?;
//! assert_eq!(traj.batch_size(), &[5]); // stopped when done
//! let obs = traj.get_or_err(("next", "observation"))?;
//! assert_eq!(obs.double_value(&[4, 0]), 5.0);
//! # Ok(()) }
//! ```

use tch::{Device, Kind, Tensor};

use super::utils::{any_of, any_true, complete_done, reshape_rewards, step_mdp, StepMdpOptions};
use super::{EnvKeys, EnvSpecs};
use crate::error::{Error, Result};
use crate::rng::Generator;
use crate::tensordict::{KeysOptions, NestedKey, StackReserve, Strict, TensorDict};

/// `EnvBase::core` and `EnvBase::core_mut` for an env that keeps its [`EnvCore`] in a field
/// named `core`, written once here instead of in every env: `env_core_field!();` inside the
/// `impl EnvBase`.
macro_rules! env_core_field {
    () => {
        fn core(&self) -> &$crate::envs::EnvCore {
            &self.core
        }

        fn core_mut(&mut self) -> &mut $crate::envs::EnvCore {
            &mut self.core
        }
    };
}
pub(crate) use env_core_field;

/// The key-list getters of [`EnvBase`] (`action_keys`, …): each a copy of one of the lists
/// its [`EnvCore`] caches.
macro_rules! key_lists {
    ($($(#[$doc:meta])* $name:ident => $field:ident;)*) => {$(
        $(#[$doc])*
        fn $name(&self) -> Vec<NestedKey> {
            self.core().keys().$field.clone()
        }
    )*};
}

/// Errors ([`Error::ShapeMismatch`] under `op`, naming `what`) when a tensordict an env
/// returned does not have the env's batch size.
#[inline]
fn check_returned_batch(
    op: &'static str,
    what: &str,
    td: &TensorDict,
    specs: &EnvSpecs,
) -> Result<()> {
    if td.batch_size() == specs.batch_size() {
        return Ok(());
    }
    Err(Error::ShapeMismatch {
        op,
        key: what.into(),
        expected: specs.batch_size().to_vec(),
        actual: td.batch_size().to_vec(),
    })
}

/// The state every environment carries: its (finalized, locked) specs, a seedable generator
/// for random actions and initial states, and flags. Embed one in your env and return it from
/// [`EnvBase::core`] / [`EnvBase::core_mut`].
#[derive(Clone, Debug)]
pub struct EnvCore {
    specs: EnvSpecs,
    keys: EnvKeys,
    /// The env's random number generator (reseeded by [`EnvBase::set_seed`]).
    pub generator: Generator,
    /// Allow `done` to be true right after a reset (default false: an error).
    pub allow_done_after_reset: bool,
}

impl EnvCore {
    /// Finalizes `specs` (done completion, validation, locking) and seeds the generator with 0.
    pub fn new(specs: EnvSpecs) -> Result<Self> {
        let specs = specs.finalize()?;
        Ok(EnvCore {
            keys: EnvKeys::from_specs(&specs),
            specs,
            generator: Generator::new(0),
            allow_done_after_reset: false,
        })
    }

    /// The env's specs.
    pub fn specs(&self) -> &EnvSpecs {
        &self.specs
    }

    /// Replaces the specs (finalized again). For envs whose specs change over time.
    pub fn set_specs(&mut self, specs: EnvSpecs) -> Result<()> {
        self.specs = specs.finalize()?;
        self.keys = EnvKeys::from_specs(&self.specs);
        Ok(())
    }

    /// The env's key lists, derived from the specs once.
    pub fn keys(&self) -> &EnvKeys {
        &self.keys
    }

    /// Samples the action spec with the env's generator.
    pub(crate) fn sample_actions(&mut self) -> Result<TensorDict> {
        self.specs.action.rand(&mut self.generator, &[])
    }

    pub(crate) fn new_unfinalized(specs: EnvSpecs) -> Self {
        EnvCore {
            keys: EnvKeys::from_specs(&specs),
            specs,
            generator: Generator::new(0),
            allow_done_after_reset: false,
        }
    }

    pub(crate) fn replace_specs(&mut self, specs: EnvSpecs) {
        self.keys = EnvKeys::from_specs(&specs);
        self.specs = specs;
    }
}

/// How [`EnvBase::rollout`] runs.
#[derive(Debug, Default)]
pub struct RolloutConfig {
    /// Stop after the first step where any done flag is set (default when neither break flag
    /// is set: true, see [`RolloutConfig::breaks`]).
    pub break_when_any_done: Option<bool>,
    /// Stop once every batch element has been done at least once in a row of steps (partial
    /// resets keep the others going). Mutually exclusive with `break_when_any_done = true`.
    pub break_when_all_done: Option<bool>,
    /// Reset before the first step (default true when no start tensordict is given).
    pub auto_reset: Option<bool>,
    /// Start from this tensordict instead of a reset.
    pub tensordict: Option<TensorDict>,
    /// Mark the last step truncated (and done); needs a `truncated` done key.
    pub set_truncated: bool,
}

impl RolloutConfig {
    /// `(break_when_any_done, break_when_all_done)` after TorchRL's defaulting rules.
    pub fn breaks(&self) -> Result<(bool, bool)> {
        match (self.break_when_any_done, self.break_when_all_done) {
            (Some(true), Some(true)) => Err(Error::config(
                "rollout",
                "break_when_all_done",
                "not Some(true) together with break_when_any_done = Some(true) (they cannot both be true)",
                "Some(true)",
            )),
            (None, None) => Ok((true, false)),
            (any, all) => Ok((any.unwrap_or(false), all.unwrap_or(false))),
        }
    }

    /// Builder: never stop on done (episodes are reset automatically).
    pub fn no_break() -> Self {
        RolloutConfig {
            break_when_any_done: Some(false),
            ..Default::default()
        }
    }
}

/// A policy for [`EnvBase::rollout`]: reads the current tensordict, returns it with actions.
pub type Policy<'a> = &'a mut dyn FnMut(TensorDict) -> Result<TensorDict>;

/// An environment. Implement [`EnvBase::core`], [`EnvBase::core_mut`],
/// [`EnvBase::reset_impl`] and [`EnvBase::step_impl`]; the rest is provided.
pub trait EnvBase: Send {
    /// The env's state shared with the provided methods.
    fn core(&self) -> &EnvCore;
    /// The env's state, mutably.
    fn core_mut(&mut self) -> &mut EnvCore;

    /// Returns a **fresh** tensordict with the initial observations (and any done / state
    /// entries) for every batch element, or for those selected by the `"_reset"` masks of `td`
    /// (the provided [`EnvBase::reset`] keeps the old values of the others).
    fn reset_impl(&mut self, td: Option<&TensorDict>) -> Result<TensorDict>;

    /// Returns a **fresh** tensordict with the *next* observations, rewards and done flags for
    /// the actions in `td` (not nested under `"next"`).
    fn step_impl(&mut self, td: &TensorDict) -> Result<TensorDict>;

    /// Seeds env-specific randomness beyond [`EnvCore::generator`] (which is already reseeded).
    fn set_seed_impl(&mut self, _seed: u64) -> Result<()> {
        Ok(())
    }

    // ------------------------------------------------------------------ provided

    /// The env's specs.
    fn specs(&self) -> &EnvSpecs {
        self.core().specs()
    }

    /// The env's batch size.
    fn batch_size(&self) -> Vec<i64> {
        self.specs().batch_size().to_vec()
    }

    /// The env's device.
    fn device(&self) -> Device {
        self.specs().device()
    }

    key_lists! {
        /// Action leaf keys.
        action_keys => action;
        /// Reward leaf keys.
        reward_keys => reward;
        /// Done leaf keys.
        done_keys => done;
        /// Observation leaf keys.
        observation_keys => observation;
        /// State leaf keys.
        state_keys => state;
        /// `"_reset"` keys, one per done group.
        reset_keys => reset;
    }

    /// [`EnvBase::step_impl`] followed by reward reshaping and done completion: the next
    /// tensordict as the env's specs describe it. Wrappers call this on their inner env.
    fn step_next(&mut self, td: &TensorDict) -> Result<TensorDict> {
        let mut next = self.step_impl(td)?;
        check_returned_batch(
            "step (batch size of the returned tensordict)",
            "<next>",
            &next,
            self.specs(),
        )?;
        let keys = self.core().keys();
        reshape_rewards(&mut next, keys)?;
        complete_done(&mut next, keys)?;
        Ok(next)
    }

    /// [`EnvBase::reset_impl`] followed by done completion and the partial-reset merge.
    fn reset_next(&mut self, td: Option<&TensorDict>) -> Result<TensorDict> {
        let mut out = self.reset_impl(td)?;
        check_returned_batch(
            "reset (batch size of the returned tensordict)",
            "<reset>",
            &out,
            self.specs(),
        )?;
        complete_done(&mut out, self.core().keys())?;
        if let Some(prev) = td {
            out = merge_partial_reset(prev, out, self.core())?;
        }
        Ok(out)
    }

    /// Resets the env. With `td` holding `"_reset"` masks, only the selected batch elements are
    /// reset; the others keep their values from `td`. Returns `td` (without `"next"` and the
    /// masks) updated with the reset data. Errors when a done flag is set right after the reset
    /// (unless [`EnvCore::allow_done_after_reset`]).
    fn reset(&mut self, td: Option<TensorDict>) -> Result<TensorDict> {
        if let Some(t) = &td {
            check_batch("reset", t, self.specs())?;
        }
        let reset = self.reset_next(td.as_ref())?;
        let core = self.core();
        if !core.allow_done_after_reset {
            check_not_done_after_reset(&reset, td.as_ref(), core)?;
        }
        let mut out = match td {
            Some(t) => {
                let mut drop: Vec<NestedKey> = core.keys().reset.clone();
                drop.push("next".into());
                t.exclude(&drop)
            }
            None => TensorDict::new(core.specs().batch_size())?,
        };
        out.update(&reset)?;
        Ok(out)
    }

    /// Resets the batch elements whose `"_reset"` masks (in `root`) are set, TorchRL's
    /// `maybe_reset`: the env sees only the masks (so it cannot mistake the current data for a
    /// state to reset to), and the other elements keep their values from `root`.
    fn maybe_reset(&mut self, root: TensorDict) -> Result<TensorDict> {
        let reset_keys = self.core().keys().reset.clone();
        let masks = root.select(&reset_keys, Strict::No)?;
        let fresh = self.reset_next(Some(&masks))?;
        let core = self.core();
        let merged = merge_partial_reset(&root, fresh, core)?;
        if !core.allow_done_after_reset {
            check_not_done_after_reset(&merged, Some(&masks), core)?;
        }
        let mut out = root.exclude(&reset_keys);
        out.update(&merged)?;
        Ok(out)
    }

    /// Steps the env with the actions in `td`; writes the results under `"next"` and returns
    /// `td`. Every action present in `td` is first checked against its spec ([`read_action`]:
    /// shape `[*batch, *action_shape]`, dtype, device), so a wrong action is an error naming
    /// its key before the env sees it; a missing action, and the shape of an action whose spec
    /// has a dynamic (`-1`) dim, are left to the env.
    fn step(&mut self, mut td: TensorDict) -> Result<TensorDict> {
        check_batch("step", &td, self.specs())?;
        for (key, spec) in &self.core().keys().action_specs {
            if let Some(a) = td.get(key) {
                // A dynamic (-1) dim has a meaning only the env knows (a token env's response
                // width is 1..=max_new_tokens): such an action's shape is left to the env.
                let shape = !spec.shape().iter().any(|d| *d < 0);
                check_action_tensor("step", key, a, spec, shape)?;
            }
        }
        let mut next = self.step_next(&td)?;
        // Entries preset under "next" that the step did not produce are kept (TorchRL).
        if let Some(preset) = td.get_dict("next") {
            merge_missing(&mut next, preset)?;
        }
        td.set("next", next)?;
        Ok(td)
    }

    /// The root of the next step: `"next"` content plus other root entries; rewards dropped,
    /// actions kept (TorchRL's `env.step_mdp`).
    fn step_mdp(&self, td: &TensorDict) -> Result<TensorDict> {
        let keys = self.core().keys();
        let opts = StepMdpOptions {
            exclude_action: false,
            ..Default::default()
        };
        // Reward keys that are also state keys (an episode sum registered as a reward) carry
        // over to the next step, as in TorchRL: `mdp_rewards` leaves them out.
        step_mdp(td, &opts, &keys.mdp_rewards, &keys.done, &keys.action)
    }

    /// Steps, builds the next root, and resets the batch elements that are done (partial
    /// reset). Returns `(stepped td with "next", next root)`.
    fn step_and_maybe_reset(&mut self, td: TensorDict) -> Result<(TensorDict, TensorDict)> {
        let td = self.step(td)?;
        self.step_and_maybe_reset_prestepped(td)
    }

    /// Samples actions from the action spec with the env's generator and writes them into `td`
    /// (a new tensordict when `None`).
    fn rand_action(&mut self, td: Option<TensorDict>) -> Result<TensorDict> {
        let mut td = match td {
            Some(t) => t,
            None => TensorDict::new(self.specs().batch_size())?,
        };
        let actions = self.core_mut().sample_actions()?;
        // Samples are valid by construction: set the leaves directly (no staged update).
        actions.for_each_leaf(&mut |path, t| td.set(path, t.shallow_clone()))?;
        Ok(td)
    }

    /// Seeds the env (its generator and [`EnvBase::set_seed_impl`]); the same seed gives the
    /// same rollouts. Returns the next seed to use for another env.
    fn set_seed(&mut self, seed: u64) -> Result<u64> {
        self.core_mut().generator = Generator::new(seed);
        self.set_seed_impl(seed)?;
        Ok(Generator::new(seed).next_u64() >> 1)
    }

    /// A tensordict of zeros shaped like one step of this env: state and action, observations,
    /// done flags, and under `"next"` observations, rewards and done flags.
    fn fake_tensordict(&self) -> Result<TensorDict> {
        let s = self.specs();
        let mut td = s.state.zero(&[])?;
        td.update(&s.action.zero(&[])?)?;
        td.update(&s.observation.zero(&[])?)?;
        td.update(&s.done.zero(&[])?)?;
        let mut next = s.observation.zero(&[])?;
        next.update(&s.reward.zero(&[])?)?;
        next.update(&s.done.zero(&[])?)?;
        td.set("next", next)?;
        Ok(td)
    }

    /// Runs up to `max_steps` steps (random actions without a policy) and stacks the steps along
    /// a new time dim after the batch dims.
    fn rollout(
        &mut self,
        max_steps: usize,
        mut policy: Option<Policy<'_>>,
        cfg: &RolloutConfig,
    ) -> Result<TensorDict> {
        let (break_any, break_all) = cfg.breaks()?;
        let specs = self.specs().clone();
        let auto_reset = cfg.auto_reset.unwrap_or(cfg.tensordict.is_none());
        let mut td = match (&cfg.tensordict, auto_reset) {
            (Some(t), true) => self.reset(Some(t.clone()))?,
            (None, true) => self.reset(None)?,
            (Some(t), false) => t.clone(),
            (None, false) => {
                return Err(Error::config(
                    "rollout",
                    "tensordict",
                    "a start tensordict when auto_reset = Some(false)",
                    "None",
                ))
            }
        };
        let truncated_keys: Vec<NestedKey> = specs
            .done_keys()
            .into_iter()
            .filter(|k| k.last() == Some("truncated"))
            .collect();
        if cfg.set_truncated && truncated_keys.is_empty() {
            return Err(Error::config(
                "rollout",
                "set_truncated",
                "false for an env without a truncated done key (add one, e.g. with StepCounter)",
                true,
            ));
        }
        let stop_keys = self.core().keys().stop.clone();
        let nb = specs.batch_size().len();
        // reserved up to a bound: a huge max_steps (the loop stops at done) must not ask for
        // its whole length up front (an allocation failure aborts the process)
        let mut steps: Vec<TensorDict> = Vec::with_capacity(max_steps.min(1 << 12));
        // For break_when_all_done: which batch elements have finished at least once.
        let mut finished: Option<Tensor> = None;
        let mut reserve = StackReserve::none();
        for i in 0..max_steps {
            td = match policy.as_mut() {
                Some(p) => p(td)?,
                None => self.rand_action(Some(td))?,
            };
            let last = i + 1 == max_steps;
            if break_any || break_all {
                let mut stepped = self.step(td)?;
                if last && cfg.set_truncated {
                    mark_truncated(&mut stepped, &specs)?;
                }
                let next = stepped.get_dict("next").cloned();
                steps.push(stepped.clone());
                let next = next.unwrap_or(stepped.empty());
                if break_any && any_of(&next, &stop_keys)? {
                    break;
                }
                if break_all {
                    let now = done_mask(&next, &stop_keys, nb)?;
                    let f = match finished.take() {
                        Some(f) => f.f_logical_or(&now)?,
                        None => now,
                    };
                    let all = f.numel() == 0 || f.f_all()?.int64_value(&[]) != 0;
                    finished = Some(f);
                    if all {
                        break;
                    }
                    if !last && any_of(&next, &stop_keys)? {
                        let (_, root) = self.step_and_maybe_reset_prestepped(stepped)?;
                        td = root;
                        continue;
                    }
                }
                td = self.step_mdp(&stepped)?;
            } else {
                if last && cfg.set_truncated {
                    let mut stepped = self.step(td)?;
                    mark_truncated(&mut stepped, &specs)?;
                    steps.push(stepped);
                    break;
                }
                let (stepped, root) = self.step_and_maybe_reset(td)?;
                if i == 0 {
                    // Every step is kept: the stack's buffer is known now (see `StackReserve`).
                    reserve = StackReserve::new(&stepped, max_steps)?;
                }
                steps.push(stepped);
                td = root;
            }
        }
        if steps.is_empty() {
            return Err(Error::config(
                "rollout",
                "max_steps",
                "at least 1",
                max_steps,
            ));
        }
        reserve.stack(&steps, nb as i64).map_err(|e| match e {
            Error::KeySetMismatch { only_first, only_second, .. } => Error::invalid(
                "rollout",
                format!(
                    "steps of the rollout have different keys (only in the first step: [{}]; only in a \
                     later one: [{}]); the reset and step outputs must carry the same entries",
                    only_first.join(", "),
                    only_second.join(", ")
                ),
            ),
            other => other,
        })
    }

    /// Like [`EnvBase::step_and_maybe_reset`] for a tensordict that was already stepped.
    #[doc(hidden)]
    fn step_and_maybe_reset_prestepped(
        &mut self,
        td: TensorDict,
    ) -> Result<(TensorDict, TensorDict)> {
        let mut root = self.step_mdp(&td)?;
        let mut any = false;
        for g in &self.core().keys().groups {
            if let Some(done) = root.get(&g.done) {
                if any_true(done)? {
                    any = true;
                    let mask = done.f_to_kind(Kind::Bool)?;
                    root.set(&g.reset, mask)?;
                }
            }
        }
        if any {
            root = self.maybe_reset(root)?;
        }
        Ok((td, root))
    }

    /// True when an output of one batch element depends on the data of the others (running
    /// statistics updated by the whole batch, as [`VecNorm`](super::transforms::VecNorm)'s):
    /// a partial reset then legitimately changes what the unselected elements observe, and
    /// [`check_partial_reset`](super::check_partial_reset) has nothing it can compare (it
    /// returns `Ok`). Default false; [`TransformedEnv`](super::TransformedEnv) asks its base
    /// env and its transforms, `SerialEnv` / `ParallelEnv` their envs.
    fn couples_batch_elements(&self) -> bool {
        false
    }

    /// [`check_env_specs`](super::check_env_specs) on this env.
    fn check_env_specs(&mut self, seed: Option<u64>) -> Result<()>
    where
        Self: Sized,
    {
        super::check_env_specs(self, seed)
    }
}

/// Reads the action at `key` of `td` and checks it against the env's action spec for that key:
/// its shape must be the spec's (`[*batch, *action_shape]`; a dynamic `-1` dim of the spec
/// matches any size), its dtype the spec's (a discrete spec takes any integer or bool dtype),
/// its device the spec's. The check [`EnvBase::step`] runs on
/// every action, public for custom envs that read their actions in
/// [`EnvBase::step_impl`] (which wrappers may call without `step`).
///
/// # Errors
/// [`Error::KeyNotFound`] when `td` has no `key`; [`Error::InvalidValue`] when `key` is not an
/// action of `specs`; [`Error::ShapeMismatch`], [`Error::DtypeMismatch`] or
/// [`Error::DeviceMismatch`] naming the key, what the spec expects and what was given.
///
/// ```
/// use tch::{Device, Kind, Tensor};
/// use torchrl::envs::{read_action, EnvSpecs};
/// use torchrl::specs::Bounded;
/// use torchrl::{Error, TensorDict};
/// # fn main() -> torchrl::Result<()> {
/// let specs = EnvSpecs::new([4])?.with_action("action", Bounded::new(-1.0, 1.0, [4, 1])?)?;
/// let good = TensorDict::new([4])?.with("action", Tensor::zeros([4, 1], (Kind::Float, Device::Cpu)))?;
/// assert_eq!(read_action(&good, "action", &specs)?.size(), [4, 1]);
/// let flat = TensorDict::new([4])?.with("action", Tensor::zeros([4], (Kind::Float, Device::Cpu)))?;
/// let err = read_action(&flat, "action", &specs).unwrap_err();
/// assert!(matches!(err, Error::ShapeMismatch { .. }), "{err}");
/// let f64 = TensorDict::new([4])?.with("action", Tensor::zeros([4, 1], (Kind::Double, Device::Cpu)))?;
/// assert!(matches!(read_action(&f64, "action", &specs), Err(Error::DtypeMismatch { .. })));
/// # Ok(()) }
/// ```
pub fn read_action<'a>(
    td: &'a TensorDict,
    key: impl crate::tensordict::AsKey,
    specs: &EnvSpecs,
) -> Result<&'a Tensor> {
    let op = "read_action";
    let key = key.to_nested_key();
    let spec = specs.action.get(&key).ok_or_else(|| {
        Error::value(
            op,
            &key,
            format!(
                "an action key of the env (one of {:?})",
                specs.action_keys()
            ),
            "a key that is not in the action spec",
        )
    })?;
    let a = td.get_or_err(&key)?;
    check_action_tensor(op, &key, a, spec, true)?;
    Ok(a)
}

/// Checks one action tensor against its leaf spec (with `shape`: its shape, `-1` dims taking
/// any size; then dtype and device).
#[inline]
fn check_action_tensor(
    op: &'static str,
    key: &NestedKey,
    a: &Tensor,
    spec: &crate::data::specs::TensorSpec,
    shape: bool,
) -> Result<()> {
    if shape {
        let expected = spec.shape();
        let actual = a.size();
        let shape_ok = actual.len() == expected.len()
            && actual.iter().zip(expected).all(|(g, e)| *e < 0 || g == e);
        if !shape_ok {
            return Err(Error::ShapeMismatch {
                op,
                key: key.to_string(),
                expected: expected.to_vec(),
                actual,
            });
        }
    }
    if let Some(kind) = spec.dtype() {
        // Discrete actions may come in any integer or bool dtype (a bool one-hot, int32
        // indices: the envs cast them); floating actions must have the spec's dtype (a float64
        // action would turn a float32 env's state into float64).
        let int_or_bool = |k: Kind| k == Kind::Bool || crate::kind::is_integral(k);
        let discrete_ok = int_or_bool(kind) && int_or_bool(a.kind());
        if a.kind() != kind && !discrete_ok {
            return Err(Error::DtypeMismatch {
                op,
                key: key.to_string(),
                expected: kind,
                actual: a.kind(),
            });
        }
    }
    if let Some(device) = spec.device() {
        if a.device() != device {
            return Err(Error::DeviceMismatch {
                op,
                key: key.to_string(),
                expected: device,
                actual: a.device(),
            });
        }
    }
    Ok(())
}

fn check_batch(op: &'static str, td: &TensorDict, specs: &EnvSpecs) -> Result<()> {
    if td.batch_size() != specs.batch_size() {
        return Err(Error::ShapeMismatch {
            op,
            key: "<batch_size of the input tensordict>".into(),
            expected: specs.batch_size().to_vec(),
            actual: td.batch_size().to_vec(),
        });
    }
    Ok(())
}

/// The `"_reset"` mask that governs done key `k` (same prefix), if `td` has one.
fn reset_mask_for(td: &TensorDict, k: &NestedKey) -> Option<Tensor> {
    let prefix: Vec<&str> = k.parts().take(k.len().saturating_sub(1)).collect();
    let mut key: Vec<&str> = prefix;
    key.push("_reset");
    td.get(&key[..]).and_then(|t| t.f_to_kind(Kind::Bool).ok())
}

/// Per-batch-element mask of the elements whose trajectory ended (any of the `keys` leaves
/// present in `td`, reduced over feature dims); `None` when `td` has none of them.
pub(crate) fn end_of_traj_mask(
    td: &TensorDict,
    keys: &[NestedKey],
    nb: usize,
) -> Result<Option<Tensor>> {
    if keys.iter().any(|k| td.contains(k)) {
        Ok(Some(done_mask(td, keys, nb)?))
    } else {
        Ok(None)
    }
}

/// Per-batch-element done mask (any done leaf, reduced over feature dims).
fn done_mask(td: &TensorDict, keys: &[NestedKey], nb: usize) -> Result<Tensor> {
    let mut acc: Option<Tensor> = None;
    for k in keys {
        if let Some(t) = td.get(k) {
            let mut v = t.f_to_kind(Kind::Bool)?;
            while v.dim() > nb {
                v = v.f_any_dim(-1, false)?;
            }
            acc = Some(match acc {
                Some(a) => a.f_logical_or(&v)?,
                None => v,
            });
        }
    }
    match acc {
        Some(a) => Ok(a),
        None => Ok(Tensor::f_zeros(td.batch_size(), (Kind::Bool, Device::Cpu))?),
    }
}

/// Errors when a done leaf of `reset` is set where the matching `"_reset"` mask of `td` is set
/// (everywhere when there is no mask).
fn check_not_done_after_reset(
    reset: &TensorDict,
    td: Option<&TensorDict>,
    core: &EnvCore,
) -> Result<()> {
    let nb = core.specs().batch_size().len();
    for k in &core.keys().done {
        let Some(v) = reset.get(k) else { continue };
        let v = v.f_to_kind(Kind::Bool)?;
        let hit = match td.and_then(|t| reset_mask_for(t, k)) {
            Some(m) => {
                let m = batch_mask(&m, nb, v.dim())?.f_to_device(v.device())?;
                v.f_logical_and(&m)?
            }
            None => v,
        };
        if hit.numel() > 0 && hit.f_any()?.int64_value(&[]) != 0 {
            return Err(Error::value(
                "reset",
                k,
                "a done entry that is false right after reset: an env must start undone (set \
                 EnvCore::allow_done_after_reset to allow it)",
                format!("done entry {k} was (partially) true right after reset"),
            ));
        }
    }
    Ok(())
}

/// Reduces a reset mask to the batch dims (any over extra dims), then shapes it to broadcast
/// over a leaf with `leaf_dim` dims.
fn batch_mask(mask: &Tensor, nb: usize, leaf_dim: usize) -> Result<Tensor> {
    let mut m = mask.f_to_kind(Kind::Bool)?;
    while m.dim() > nb {
        m = m.f_any_dim(-1, false)?;
    }
    let shape: Vec<i64> = [m.size(), vec![1; leaf_dim.saturating_sub(m.dim())]].concat();
    Ok(m.f_reshape(shape)?)
}

/// Adds to `next` the leaves of `preset` it does not have.
pub(crate) fn merge_missing(next: &mut TensorDict, preset: &TensorDict) -> Result<()> {
    for (k, e) in preset.items(KeysOptions::nested_leaves()) {
        if !next.contains(&k) {
            next.set(&k, e.clone())?;
        }
    }
    Ok(())
}

/// Sets every `truncated` and `done` leaf under `"next"` to true.
fn mark_truncated(td: &mut TensorDict, specs: &EnvSpecs) -> Result<()> {
    for k in specs.done_keys() {
        if matches!(k.last(), Some("truncated") | Some("done")) {
            let key = k.prefixed("next");
            if let Some(t) = td.get(&key) {
                let ones = t.f_ones_like()?;
                td.set(&key, ones)?;
            }
        }
    }
    Ok(())
}

/// Keeps `prev`'s values where the reset mask of a key's done group is false.
fn merge_partial_reset(prev: &TensorDict, reset: TensorDict, core: &EnvCore) -> Result<TensorDict> {
    let nb = core.specs().batch_size().len();
    let mut out = reset.clone();
    for (k, new) in reset.leaves() {
        let Some(mask) = reset_mask_for(prev, &k).or_else(|| {
            // A key outside any done group follows the root group's mask.
            prev.get("_reset")
                .and_then(|m| m.f_to_kind(Kind::Bool).ok())
        }) else {
            continue;
        };
        let Some(old) = prev.get(&k) else { continue };
        if old.size() != new.size() {
            continue;
        }
        let m = batch_mask(&mask, nb, new.dim())?.f_to_device(new.device())?;
        let merged = new.f_where_self(&m, &old.f_to_kind(new.kind())?)?;
        out.set(&k, merged)?;
    }
    Ok(out)
}
