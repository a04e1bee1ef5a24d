//! `CountingEnv`: the smallest useful environment, for tests and examples.
//!
//! The observation counts steps since the last reset (`observation += 1` per step), the reward
//! is 1 per step, and an episode terminates once the count reaches `max_steps`. Batched, with
//! partial resets through `"_reset"`, on any device. Actions are read but do not matter.
//!
//! ```
//! use torchrl::envs::builtin::CountingEnv;
//! use torchrl::envs::{check_env_specs, EnvBase, RolloutConfig};
//! # fn main() -> torchrl::Result<()> {
//! let mut env = CountingEnv::new(5, &[])?;
//! let traj = env.rollout(10, None, &RolloutConfig::default())?;
//! assert_eq!(traj.batch_size(), &[5]);
//! let mut batched = CountingEnv::new(3, &[4])?;
//! check_env_specs(&mut batched, Some(0))?;
//! # Ok(()) }
//! ```

use tch::{Device, Kind, Tensor};

use crate::data::specs::{Bounded, Unbounded};
use crate::envs::{EnvBase, EnvCore, EnvSpecs};
use crate::error::{Error, Result};
use crate::tensordict::{Elements, NestedKey, TensorDict};

/// Counts steps; terminates at `max_steps`. See the module docs.
pub struct CountingEnv {
    core: EnvCore,
    max_steps: i64,
    count: Tensor,
}

impl CountingEnv {
    /// A counting env with the given episode length and batch size, on the CPU.
    pub fn new(max_steps: i64, batch_size: &[i64]) -> Result<Self> {
        Self::with_device(max_steps, batch_size, Device::Cpu)
    }

    /// Same, on `device`.
    pub fn with_device(max_steps: i64, batch_size: &[i64], device: Device) -> Result<Self> {
        crate::error::ensure!(
            max_steps >= 1,
            "CountingEnv::new",
            "max_steps must be at least 1, got {max_steps}"
        );
        let one: Vec<i64> = [batch_size, &[1]].concat();
        let specs = EnvSpecs::new(batch_size)?
            .with_observation("observation", Unbounded::new().with_shape(&one)?)?
            .with_action("action", Bounded::new(-1.0, 1.0, &one)?)?
            .with_reward("reward", Unbounded::new().with_shape(&one)?)?
            .with_device(device)?;
        Ok(CountingEnv {
            core: EnvCore::new(specs)?,
            max_steps,
            count: Tensor::f_zeros(&one, (Kind::Float, device))?,
        })
    }

    fn out(&self, with_reward: bool) -> Result<TensorDict> {
        let done = self.count.f_ge(self.max_steps as f64)?;
        let mut td = TensorDict::new(self.core.specs().batch_size())?
            .with("observation", self.count.copy())?
            .with("done", done.shallow_clone())?
            .with("terminated", done)?;
        if with_reward {
            td.set("reward", self.count.f_ones_like()?)?;
        }
        Ok(td)
    }
}

impl EnvBase for CountingEnv {
    crate::envs::base::env_core_field!();

    fn reset_impl(&mut self, td: Option<&TensorDict>) -> Result<TensorDict> {
        match td.and_then(|t| t.get("_reset")) {
            Some(mask) => {
                // One flag per env (of shape `[*batch]` or `[*batch, 1]`, any dtype: nonzero
                // means reset). It is cast to bool first: libtorch refuses other masks, and tch
                // panics on that error in `masked_fill` instead of returning it.
                let expected = self.count.size();
                if mask.elements() != self.count.elements() {
                    return Err(Error::ShapeMismatch {
                        op: "CountingEnv::reset",
                        key: NestedKey::from("_reset").to_string(),
                        expected,
                        actual: mask.size(),
                    });
                }
                let m = mask
                    .f_to_device(self.count.device())?
                    .f_to_kind(Kind::Bool)?
                    .f_reshape(&expected)?;
                self.count = self.count.f_masked_fill(&m, 0.0)?;
            }
            None => self.count = self.count.f_zeros_like()?,
        }
        self.out(false)
    }

    fn step_impl(&mut self, _td: &TensorDict) -> Result<TensorDict> {
        self.count = self.count.f_add_scalar(1.0)?;
        self.out(true)
    }
}
