//! [`Collector`]: TorchRL 0.14's `Collector` (formerly `SyncDataCollector`, kept here as a
//! deprecated alias), a policy run in one environment in the calling thread, handing out
//! batches of `frames_per_batch` transitions.
//!
//! Each batch has the env's batch dims followed by a time dim, `[*env_batch, T]` with
//! `T = frames_per_batch / env_batch.numel()`. Steps are taken with
//! [`EnvBase::step_and_maybe_reset`] under `tch::no_grad`: an episode that ends inside a batch
//! is reset there (only the batch elements that are done), and one still running at the end of
//! a batch goes on in the next batch (unless `reset_at_each_iter`). Collection stops once
//! `total_frames` frames have been handed out (rounded up to whole batches, as TorchRL does).
//!
//! **Exploration**: the policy runs under
//! [`set_exploration_type`](crate::modules::set_exploration_type) with the collector's
//! exploration type, [`ExplorationType::Random`] unless set with
//! [`Collector::with_exploration_type`] (TorchRL's `exploration_type=RANDOM` default): a
//! [`ProbabilisticActor`](crate::modules::ProbabilisticActor) samples its actions (and its
//! log-probs belong to the sampled action) whatever its own exploration type. Evaluate
//! deterministically outside the collector (or with `ExplorationType::Deterministic` here).
//!
//! **Trajectory ids**: every step carries `("collector", "traj_ids")` (int64, the env's batch
//! shape), as TorchRL's collector writes it: the envs start with ids `0..n_envs` (in batch
//! order), and an env whose step ends its episode (`done` or `truncated`) takes the next unused
//! id from its following step on; an episode running on into the next batch keeps its id. Ids
//! are never reused by one collector: a reset ([`Collector::reset`], `reset_at_each_iter`)
//! gives every env a new id (TorchRL keeps the old ids there).
//!
//! ```
//! use tch::{Device, Kind, Tensor};
//! use torchrl::collectors::Collector;
//! use torchrl::envs::builtin::CountingEnv;
//! use torchrl::TensorDict;
//! # fn main() -> torchrl::Result<()> {
//! let env = CountingEnv::new(100, &[])?; // episodes longer than a batch
//! let policy = |mut td: TensorDict| {
//!     td.set("action", Tensor::zeros([1], (Kind::Float, Device::Cpu)))?;
//!     Ok(td)
//! };
//! let mut collector = Collector::new(env, policy, 5, Some(10))?;
//! let batches: Vec<TensorDict> = collector.by_ref().collect::<torchrl::Result<_>>()?;
//! assert_eq!(batches.len(), 2); // total_frames reached after two batches of 5
//! assert_eq!(batches[0].batch_size(), &[5]);
//! // the episode continues across batches: the observation counts on
//! assert_eq!(batches[1].get_or_err("observation")?.double_value(&[0, 0]), 5.0);
//! assert_eq!(collector.frames(), 10);
//! // one trajectory so far: id 0 in both batches
//! let ids = batches[1].get_or_err(("collector", "traj_ids"))?;
//! assert_eq!(ids.int64_value(&[4]), 0);
//! # Ok(()) }
//! ```

use tch::{Kind, Tensor};

use crate::envs::EnvBase;
use crate::error::{Error, Result};
use crate::modules::{ExplorationGuard, ExplorationType};
use crate::tensordict::{stack, NestedKey, TensorDict};

/// The key under which the collector writes trajectory ids (TorchRL's).
const TRAJ_IDS: [&str; 2] = ["collector", "traj_ids"];

/// A policy owned by a collector: reads the current tensordict, returns it with actions.
pub type BoxedPolicy<'p> = Box<dyn FnMut(TensorDict) -> Result<TensorDict> + 'p>;

/// Runs a policy in an environment and yields batches of transitions (TorchRL 0.14's
/// `Collector`). See the module docs.
///
/// An [`Iterator`] of `Result<TensorDict>`: after an error it yields nothing more.
pub struct Collector<'p, E: EnvBase> {
    env: E,
    policy: BoxedPolicy<'p>,
    frames_per_batch: i64,
    steps_per_batch: usize,
    total_frames: Option<i64>,
    init_random_frames: i64,
    reset_at_each_iter: bool,
    exploration: ExplorationType,
    frames: i64,
    batches: usize,
    root: Option<TensorDict>,
    /// The current trajectory id of every env (`[*env_batch]`, int64).
    traj_ids: Option<Tensor>,
    /// The next unused trajectory id.
    next_traj_id: i64,
    finished: bool,
    /// The policy's output entries that random actions lack, as zeros (found by one dry run
    /// of the policy before the first random step; cleared by `update_policy`).
    policy_extras: Option<Vec<(NestedKey, Tensor)>>,
}

/// The old name of [`Collector`] (TorchRL renamed `SyncDataCollector` to `Collector` in 0.14).
#[deprecated(note = "renamed `Collector`, as in TorchRL 0.14")]
pub type SyncDataCollector<'p, E> = Collector<'p, E>;

impl<'p, E: EnvBase> Collector<'p, E> {
    /// A collector of `frames_per_batch` frames per batch, stopping after `total_frames`
    /// (`None`: never stops).
    ///
    /// # Errors
    /// When `frames_per_batch` is not positive or not divisible by the env's batch numel, or
    /// when `total_frames` is negative.
    pub fn new(
        env: E,
        policy: impl FnMut(TensorDict) -> Result<TensorDict> + 'p,
        frames_per_batch: i64,
        total_frames: Option<i64>,
    ) -> Result<Self> {
        let op = "Collector::new";
        if frames_per_batch < 1 {
            return Err(Error::config(
                op,
                "frames_per_batch",
                "at least 1",
                frames_per_batch,
            ));
        }
        if let Some(t) = total_frames {
            if t < 0 {
                return Err(Error::config(
                    op,
                    "total_frames",
                    "non-negative (None for no limit)",
                    t,
                ));
            }
        }
        let batch = env.batch_size();
        let numel: i64 = batch.iter().product();
        if numel < 1 || frames_per_batch % numel != 0 {
            return Err(Error::invalid(
                op,
                format!(
                    "frames_per_batch ({frames_per_batch}) must be a positive multiple of the env's \
                     batch numel ({numel}, batch size {batch:?})"
                ),
            ));
        }
        let steps_per_batch = usize::try_from(frames_per_batch / numel)
            .map_err(|e| Error::invalid(op, format!("frames_per_batch too large: {e}")))?;
        Ok(Collector {
            env,
            policy: Box::new(policy),
            frames_per_batch,
            steps_per_batch,
            total_frames,
            init_random_frames: 0,
            reset_at_each_iter: false,
            exploration: ExplorationType::Random,
            frames: 0,
            batches: 0,
            root: None,
            traj_ids: None,
            next_traj_id: 0,
            finished: false,
            policy_extras: None,
        })
    }

    /// Builder: the first batches, until `frames` frames have been collected, use random
    /// actions from the env's action spec instead of the policy (whole batches, as in TorchRL).
    /// Random steps carry the policy's other output entries (log-probs, distribution
    /// parameters, …) as zeros, found by running the policy once before the first random step,
    /// so that random and policy batches extend the same replay buffer.
    pub fn with_init_random_frames(mut self, frames: i64) -> Self {
        self.init_random_frames = frames.max(0);
        self
    }

    /// Builder: reset the env at the start of every batch (default false: episodes continue
    /// across batches).
    pub fn with_reset_at_each_iter(mut self, reset: bool) -> Self {
        self.reset_at_each_iter = reset;
        self
    }

    /// Builder: the exploration type the policy runs under while collecting (default
    /// [`ExplorationType::Random`], as TorchRL's collectors): set on the thread with
    /// [`set_exploration_type`](crate::modules::set_exploration_type) around every policy call,
    /// so it overrides the actors' own types.
    pub fn with_exploration_type(mut self, exploration: ExplorationType) -> Self {
        self.exploration = exploration;
        self
    }

    /// The exploration type the policy runs under while collecting.
    pub fn exploration_type(&self) -> ExplorationType {
        self.exploration
    }

    /// Replaces the policy (e.g. after a training step, or with a policy built from updated
    /// weights). The env's state and the running episodes are kept.
    pub fn update_policy(&mut self, policy: impl FnMut(TensorDict) -> Result<TensorDict> + 'p) {
        self.policy = Box::new(policy);
        self.policy_extras = None;
    }

    /// Frames collected so far.
    pub fn frames(&self) -> i64 {
        self.frames
    }

    /// Batches yielded so far.
    pub fn batches(&self) -> usize {
        self.batches
    }

    /// Frames per batch.
    pub fn frames_per_batch(&self) -> i64 {
        self.frames_per_batch
    }

    /// Steps per batch (the time dim `T` of every batch).
    pub fn steps_per_batch(&self) -> usize {
        self.steps_per_batch
    }

    /// The total frame budget (`None`: no limit).
    pub fn total_frames(&self) -> Option<i64> {
        self.total_frames
    }

    /// The environment.
    pub fn env(&self) -> &E {
        &self.env
    }

    /// The environment, mutably (e.g. to seed it). Changing its state by hand does not change
    /// the collector's current root; call [`Collector::reset`] afterwards if needed.
    pub fn env_mut(&mut self) -> &mut E {
        &mut self.env
    }

    /// Gives the environment back.
    pub fn into_env(self) -> E {
        self.env
    }

    /// Seeds the environment ([`EnvBase::set_seed`]) and returns the next seed.
    pub fn set_seed(&mut self, seed: u64) -> Result<u64> {
        self.env.set_seed(seed)
    }

    /// Resets the environment now: the next batch starts new episodes (with new trajectory
    /// ids).
    pub fn reset(&mut self) -> Result<()> {
        self.root = Some(self.env.reset(None)?);
        self.traj_ids = Some(self.fresh_traj_ids()?);
        Ok(())
    }

    /// New trajectory ids for every env: the next `n_envs` unused ids, in batch order.
    fn fresh_traj_ids(&mut self) -> Result<Tensor> {
        let batch = self.env.batch_size();
        let n: i64 = batch.iter().product();
        let start = self.next_traj_id;
        self.next_traj_id += n;
        Ok(
            Tensor::f_arange_start(start, start + n, (Kind::Int64, self.env.device()))?
                .f_reshape(&batch)?,
        )
    }

    /// After a step: the envs whose episode ended (any `done` / `truncated` leaf under
    /// `"next"` of `stepped`) take the next unused ids.
    fn update_traj_ids(&mut self, stepped: &TensorDict, ids: Tensor) -> Result<Tensor> {
        let stop: Vec<NestedKey> = self
            .env
            .done_keys()
            .into_iter()
            .filter(|k| matches!(k.last(), Some("done") | Some("truncated")))
            .map(|k| k.prefixed("next"))
            .collect();
        let nb = self.env.batch_size().len();
        let Some(ended) = crate::envs::base::end_of_traj_mask(stepped, &stop, nb)? else {
            return Ok(ids);
        };
        let ended = ended.f_to_device(ids.device())?;
        let n = ended.f_sum(Kind::Int64)?.int64_value(&[]);
        if n == 0 {
            return Ok(ids);
        }
        let start = self.next_traj_id;
        self.next_traj_id += n;
        let new = Tensor::f_arange_start(start, start + n, (Kind::Int64, ids.device()))?;
        Ok(ids.f_masked_scatter(&ended, &new)?)
    }

    /// Collects one batch (ignoring `total_frames`), TorchRL's `collector.rollout()`.
    pub fn rollout(&mut self) -> Result<TensorDict> {
        let _guard = tch::no_grad_guard();
        let _exploration = ExplorationGuard::new(self.exploration);
        let random = self.frames < self.init_random_frames;
        let (mut root, mut ids) = match (self.root.take(), self.traj_ids.take()) {
            (Some(r), Some(ids)) if !self.reset_at_each_iter => (r, ids),
            _ => (self.env.reset(None)?, self.fresh_traj_ids()?),
        };
        // reserved up to a bound (an allocation failure would abort the process)
        let mut steps = Vec::with_capacity(self.steps_per_batch.min(1 << 12));
        for _ in 0..self.steps_per_batch {
            root = if random {
                self.random_step(root)?
            } else {
                (self.policy)(root)?
            };
            root.set(TRAJ_IDS, ids.shallow_clone())?;
            let (stepped, next) = self.env.step_and_maybe_reset(root)?;
            ids = self.update_traj_ids(&stepped, ids)?;
            steps.push(stepped);
            root = next;
        }
        self.root = Some(root);
        self.traj_ids = Some(ids);
        let nb = self.env.batch_size().len() as i64;
        let batch = stack(&steps, nb)?;
        self.frames += self.frames_per_batch;
        self.batches += 1;
        Ok(batch)
    }

    /// Random actions from the env's action spec, plus the policy's other output entries as
    /// zeros, so that random batches have the keys of policy batches (TorchRL fills its rollout
    /// buffer from a dry run of the policy the same way): a replay buffer takes both.
    fn random_step(&mut self, root: TensorDict) -> Result<TensorDict> {
        if self.policy_extras.is_none() {
            let have = root.keys(crate::tensordict::KeysOptions::nested_leaves());
            let actions = self.env.action_keys();
            let probe = (self.policy)(root.clone())?;
            let mut extras = Vec::new();
            for (k, t) in probe.leaves() {
                if !have.contains(&k) && !actions.contains(&k) {
                    extras.push((k, t.f_zeros_like()?));
                }
            }
            self.policy_extras = Some(extras);
        }
        let mut root = self.env.rand_action(Some(root))?;
        for (k, z) in self.policy_extras.iter().flatten() {
            root.set(k, z.shallow_clone())?;
        }
        Ok(root)
    }

    fn exhausted(&self) -> bool {
        self.total_frames.is_some_and(|t| self.frames >= t)
    }
}

impl<E: EnvBase> Iterator for Collector<'_, E> {
    type Item = Result<TensorDict>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.finished || self.exhausted() {
            return None;
        }
        let out = self.rollout();
        if out.is_err() {
            self.finished = true;
        }
        Some(out)
    }
}

impl<E: EnvBase> std::fmt::Debug for Collector<'_, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Collector")
            .field("env_batch_size", &self.env.batch_size())
            .field("frames_per_batch", &self.frames_per_batch)
            .field("total_frames", &self.total_frames)
            .field("init_random_frames", &self.init_random_frames)
            .field("reset_at_each_iter", &self.reset_at_each_iter)
            .field("exploration_type", &self.exploration)
            .field("frames", &self.frames)
            .finish_non_exhaustive()
    }
}
