//! Data collectors (TorchRL's `torchrl.collectors`): run a policy in an environment and hand
//! out fixed-size batches of transitions.
//!
//! - [`Collector`] (TorchRL 0.14's name; `SyncDataCollector` remains as a deprecated alias):
//!   one environment (any [`EnvBase`](crate::EnvBase), batched or not), one policy, in the
//!   calling thread; an iterator of `[*env_batch, T]` batches. Like TorchRL's, it runs the
//!   policy with [`ExplorationType::Random`](crate::modules::ExplorationType::Random) unless
//!   told otherwise ([`Collector::with_exploration_type`]), and writes
//!   `("collector", "traj_ids")` on every step.
//!
//! ```
//! use torchrl::collectors::Collector;
//! use torchrl::envs::builtin::CountingEnv;
//! use torchrl::EnvBase;
//! # fn main() -> torchrl::Result<()> {
//! let mut env = CountingEnv::new(100, &[2])?;
//! env.set_seed(0)?;
//! // a policy that writes a zero action (any `FnMut(TensorDict) -> Result<TensorDict>`)
//! let policy = |mut td: torchrl::TensorDict| {
//!     td.set("action", tch::Tensor::zeros([2, 1], (tch::Kind::Float, tch::Device::Cpu)))?;
//!     Ok(td)
//! };
//! let collector = Collector::new(env, policy, 8, Some(24))?;
//! let batches = collector.collect::<torchrl::Result<Vec<_>>>()?;
//! assert_eq!(batches.len(), 3);
//! assert_eq!(batches[0].batch_size(), &[2, 4]); // 8 frames over 2 envs
//! # Ok(()) }
//! ```

pub mod sync;

#[allow(deprecated)]
pub use sync::SyncDataCollector;
pub use sync::{BoxedPolicy, Collector};
