//! [`SyncDataCollector`]: TorchRL's `SyncDataCollector`, a policy run in one environment in the
//! calling thread, handing out batches of `frames_per_batch` transitions.
//!
//! Each batch has the env's batch dims followed by a time dim, `[*env_batch, T]` with
//! `T = frames_per_batch / env_batch.numel()`. Steps are taken with
//! [`EnvBase::step_and_maybe_reset`] under `tch::no_grad`: an episode that ends inside a batch
//! is reset there (only the batch elements that are done), and one still running at the end of
//! a batch goes on in the next batch (unless `reset_at_each_iter`). Collection stops once
//! `total_frames` frames have been handed out (rounded up to whole batches, as TorchRL does).
//!
//! ```
//! use tch::{Device, Kind, Tensor};
//! use torchrl::collectors::SyncDataCollector;
//! use torchrl::envs::builtin::CountingEnv;
//! use torchrl::TensorDict;
//! # fn main() -> torchrl::Result<()> {
//! let env = CountingEnv::new(100, &[])?; // episodes longer than a batch
//! let policy = |mut td: TensorDict| {
//!     td.set("action", Tensor::zeros([1], (Kind::Float, Device::Cpu)))?;
//!     Ok(td)
//! };
//! let mut collector = SyncDataCollector::new(env, policy, 5, Some(10))?;
//! let batches: Vec<TensorDict> = collector.by_ref().collect::<torchrl::Result<_>>()?;
//! assert_eq!(batches.len(), 2); // total_frames reached after two batches of 5
//! assert_eq!(batches[0].batch_size(), &[5]);
//! // the episode continues across batches: the observation counts on
//! assert_eq!(batches[1].get_or_err("observation")?.double_value(&[0, 0]), 5.0);
//! assert_eq!(collector.frames(), 10);
//! # Ok(()) }
//! ```

use crate::envs::EnvBase;
use crate::error::{Error, Result};
use crate::tensordict::{stack, TensorDict};

/// A policy owned by a collector: reads the current tensordict, returns it with actions.
pub type BoxedPolicy<'p> = Box<dyn FnMut(TensorDict) -> Result<TensorDict> + 'p>;

/// Runs a policy in an environment and yields batches of transitions. See the module docs.
///
/// An [`Iterator`] of `Result<TensorDict>`: after an error it yields nothing more.
pub struct SyncDataCollector<'p, E: EnvBase> {
    env: E,
    policy: BoxedPolicy<'p>,
    frames_per_batch: i64,
    steps_per_batch: usize,
    total_frames: Option<i64>,
    init_random_frames: i64,
    reset_at_each_iter: bool,
    frames: i64,
    batches: usize,
    root: Option<TensorDict>,
    finished: bool,
}

impl<'p, E: EnvBase> SyncDataCollector<'p, E> {
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
        let op = "SyncDataCollector::new";
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
        Ok(SyncDataCollector {
            env,
            policy: Box::new(policy),
            frames_per_batch,
            steps_per_batch,
            total_frames,
            init_random_frames: 0,
            reset_at_each_iter: false,
            frames: 0,
            batches: 0,
            root: None,
            finished: false,
        })
    }

    /// Builder: the first batches, until `frames` frames have been collected, use random
    /// actions from the env's action spec instead of the policy (whole batches, as in TorchRL).
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

    /// Replaces the policy (e.g. after a training step, or with a policy built from updated
    /// weights). The env's state and the running episodes are kept.
    pub fn update_policy(&mut self, policy: impl FnMut(TensorDict) -> Result<TensorDict> + 'p) {
        self.policy = Box::new(policy);
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
    /// the collector's current root; call [`SyncDataCollector::reset`] afterwards if needed.
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

    /// Resets the environment now: the next batch starts new episodes.
    pub fn reset(&mut self) -> Result<()> {
        self.root = Some(self.env.reset(None)?);
        Ok(())
    }

    /// Collects one batch (ignoring `total_frames`), TorchRL's `collector.rollout()`.
    pub fn rollout(&mut self) -> Result<TensorDict> {
        let _guard = tch::no_grad_guard();
        let random = self.frames < self.init_random_frames;
        let mut root = match self.root.take() {
            Some(r) if !self.reset_at_each_iter => r,
            _ => self.env.reset(None)?,
        };
        // reserved up to a bound (an allocation failure would abort the process)
        let mut steps = Vec::with_capacity(self.steps_per_batch.min(1 << 12));
        for _ in 0..self.steps_per_batch {
            root = if random {
                self.env.rand_action(Some(root))?
            } else {
                (self.policy)(root)?
            };
            let (stepped, next) = self.env.step_and_maybe_reset(root)?;
            steps.push(stepped);
            root = next;
        }
        self.root = Some(root);
        let nb = self.env.batch_size().len() as i64;
        let batch = stack(&steps, nb)?;
        self.frames += self.frames_per_batch;
        self.batches += 1;
        Ok(batch)
    }

    fn exhausted(&self) -> bool {
        self.total_frames.is_some_and(|t| self.frames >= t)
    }
}

impl<E: EnvBase> Iterator for SyncDataCollector<'_, E> {
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

impl<E: EnvBase> std::fmt::Debug for SyncDataCollector<'_, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SyncDataCollector")
            .field("env_batch_size", &self.env.batch_size())
            .field("frames_per_batch", &self.frames_per_batch)
            .field("total_frames", &self.total_frames)
            .field("init_random_frames", &self.init_random_frames)
            .field("reset_at_each_iter", &self.reset_at_each_iter)
            .field("frames", &self.frames)
            .finish_non_exhaustive()
    }
}
