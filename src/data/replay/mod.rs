//! Replay buffers (TorchRL's `torchrl.data.replay_buffers`): a fixed-capacity tensordict
//! storage written round-robin, and samplers that pick the indices of a batch.
//!
//! - [`ReplayBuffer`]: `extend` with any tensordict (split along its **first** batch dim, as
//!   TorchRL's storages: `[B, T]` stores `B` items of shape `[T]`; reshape to `[-1]` first to
//!   store transitions), `sample(batch_size)`, `len`, `clear`; FIFO overwrite once full. A batch
//!   whose keys differ from the stored ones is refused with both key lists and a `select` hint.
//! - [`PrioritizedSampler`]: sum / min trees, `alpha`, `beta`, `eps`, `update_priority`;
//!   samples carry `"index"` and `"priority_weight"` (TorchRL's `PrioritizedSampler`).
//! - [`LazyMemmapStorage`] ([`ReplayBuffer::with_memmap`]): items in memory-mapped files in a
//!   folder, made lazily from the first batch, reopened after a restart.
//! - [`SliceSampler`]: contiguous slices of stored trajectories (by `("collector",
//!   "traj_ids")`, `"episode"` or `("next", "done")`), `num_slices` or `slice_len`.
//! - [`RandomSampler`]: uniform, with replacement, seeded.
//! - [`SamplerWithoutReplacement`]: epoch-style (a fresh permutation per pass, optionally
//!   dropping the last partial minibatch), what PPO's minibatch loops use.
//!
//! ```
//! use tch::Tensor;
//! use torchrl::data::replay::{LastBatch, ReplayBuffer, SamplerWithoutReplacement};
//! use torchrl::TensorDict;
//! # fn main() -> torchrl::Result<()> {
//! let mut rb = ReplayBuffer::with_sampler(100, SamplerWithoutReplacement::new(0, LastBatch::Drop))?;
//! let batch = TensorDict::new([2, 8])?.with("obs", Tensor::arange(16, (tch::Kind::Float, tch::Device::Cpu)).reshape([2, 8, 1]))?;
//! rb.extend(&batch.reshape([-1])?)?; // 16 transitions (without the reshape: 2 items of [8])
//! assert_eq!(rb.len(), 16);
//! let mut seen = Vec::new();
//! for _ in 0..4 {
//!     let mb = rb.sample(4)?;
//!     assert_eq!(mb.batch_size(), &[4]);
//!     seen.extend(Vec::<f32>::try_from(mb.get_or_err("obs")?.reshape([-1]))?);
//! }
//! seen.sort_by(f32::total_cmp);
//! assert_eq!(seen, (0..16).map(|i| i as f32).collect::<Vec<_>>()); // one epoch: each once
//! # Ok(()) }
//! ```

pub mod buffer;
pub mod memmap;
mod packed;
pub mod prioritized;
pub mod samplers;
pub mod slice;

pub use buffer::ReplayBuffer;
pub use memmap::LazyMemmapStorage;
pub use prioritized::PrioritizedSampler;
pub use samplers::{LastBatch, RandomSampler, Sampled, Sampler, SamplerWithoutReplacement};
pub use slice::SliceSampler;
