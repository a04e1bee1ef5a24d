//! Multi-process training on libtorch's own collectives (c10d), behind the cargo feature
//! `distributed`: a [`ProcessGroup`] (Gloo on CPU; NCCL on GPU with the feature `nccl`)
//! created from torchrun's environment variables or explicit [`InitOptions`], with
//! `all_reduce`, `broadcast`, `all_gather` and `barrier` bounded by a timeout, and the
//! data-parallel helpers built on it
//! ([`broadcast_parameters`], [`all_reduce_gradients`], [`all_reduce_moments`]).
//!
//! The group is c10d's `TCPStore` (served by rank 0 at `MASTER_ADDR:MASTER_PORT`) and
//! `ProcessGroupGloo`, reached through a small C++ shim (`shim.cpp`) compiled by `build.rs`
//! against the torch wheel's headers; the `torchrl-launch` binary starts N local processes
//! with torchrun's variables. See `docs/distributed.md` for how it works, how to launch, and
//! the limits (the NCCL path compiles and refuses a machine without a CUDA device clearly, but
//! has not yet run on a GPU).
//!
//! A world of one is a valid group, so data-parallel code runs unchanged in one process:
//!
//! ```
//! use tch::Tensor;
//! use torchrl::distributed::{InitOptions, ProcessGroup, ReduceOp};
//! # fn main() -> torchrl::Result<()> {
//! let pg = ProcessGroup::new(InitOptions::single_process())?;
//! assert_eq!(pg.world_size(), 1);
//! let mut x = Tensor::from_slice(&[2.0f64, 4.0]);
//! pg.all_reduce(&mut x, ReduceOp::Mean)?;
//! assert_eq!(Vec::<f64>::try_from(&x).unwrap(), vec![2.0, 4.0]);
//! let mut y = Tensor::from_slice(&[7i64]);
//! pg.broadcast(&mut y, 0)?;
//! assert_eq!(y.int64_value(&[0]), 7);
//! # Ok(()) }
//! ```

mod data_parallel;
mod ffi;
mod process_group;

pub use data_parallel::{
    all_reduce_gradients, all_reduce_gradients_with, all_reduce_moments, all_reduce_scalars,
    broadcast_parameters, gradient_hooks, GradientHooks, DEFAULT_BUCKET_BYTES,
};
pub use process_group::{
    nccl_built, Backend, InitOptions, ProcessGroup, ReduceOp, DEFAULT_MASTER_PORT, DEFAULT_TIMEOUT,
};

/// The chapter's code, compiled and run as doc tests so that it stays true to the API.
#[doc = include_str!("../../docs/distributed.md")]
#[cfg(doctest)]
pub struct DistributedDocDoctests;
