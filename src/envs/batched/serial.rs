//! `SerialEnv`: N copies of an env stepped in turn in the calling thread.

use super::{batched_specs, common_specs, split_workers, stack_resets, workers_to_reset};
use crate::envs::{EnvBase, EnvCore};
use crate::error::Result;
use crate::tensordict::{stack, TensorDict};

/// N identical envs behind one batched env of batch size `[N, *sub_batch]`.
pub struct SerialEnv<E: EnvBase> {
    envs: Vec<E>,
    core: EnvCore,
}

impl<E: EnvBase> SerialEnv<E> {
    /// Batches `envs` (which must have identical specs).
    pub fn new(envs: Vec<E>) -> Result<Self> {
        let sub = common_specs(&envs)?;
        let specs = batched_specs(&sub, envs.len())?;
        Ok(SerialEnv {
            core: EnvCore::from_transformed(specs)?,
            envs,
        })
    }

    /// The sub-envs.
    pub fn envs(&self) -> &[E] {
        &self.envs
    }

    /// The sub-envs, mutably.
    pub fn envs_mut(&mut self) -> &mut [E] {
        &mut self.envs
    }
}

impl<E: EnvBase> EnvBase for SerialEnv<E> {
    crate::envs::base::env_core_field!();

    fn couples_batch_elements(&self) -> bool {
        self.envs.iter().any(|e| e.couples_batch_elements())
    }

    fn reset_impl(&mut self, td: Option<&TensorDict>) -> Result<TensorDict> {
        let which = workers_to_reset(td, self.envs.len())?;
        let subs = match td {
            Some(t) => split_workers(t)?.into_iter().map(Some).collect(),
            None => vec![None; self.envs.len()],
        };
        let mut outs = Vec::with_capacity(self.envs.len());
        for ((env, sub), reset) in self.envs.iter_mut().zip(subs).zip(which) {
            outs.push(if reset {
                Some(env.reset_next(sub.as_ref())?)
            } else {
                None
            });
        }
        stack_resets(outs)
    }

    fn step_impl(&mut self, td: &TensorDict) -> Result<TensorDict> {
        let subs = split_workers(td)?;
        let mut outs = Vec::with_capacity(self.envs.len());
        for (env, sub) in self.envs.iter_mut().zip(subs) {
            outs.push(env.step_next(&sub)?);
        }
        stack(&outs, 0)
    }

    /// Seeds worker `i` with the seed returned by worker `i - 1` (worker 0 gets `seed`), as
    /// TorchRL does.
    fn set_seed_impl(&mut self, seed: u64) -> Result<()> {
        let mut s = seed;
        for env in &mut self.envs {
            s = env.set_seed(s)?;
        }
        Ok(())
    }
}
