//! Code that is here for speed only, behind one seam.
//!
//! Everything in this module exists because a measured hot path needed it, and nothing in it
//! changes what the crate computes: the domain modules (`tensordict`, `envs::builtin`) call it
//! through the small safe API below and would give the same results without it.
//!
//! - [`ffi`]: the one direct call into `torch_sys` (a tensor's shape into a stack buffer).
//! - [`out`]: CPU tensors written in place from host values ([`HostOut`], [`HostBuf`]), and
//!   the replay buffer's packed rows gathered into leaves and written from them by row copies.
//! - [`stack`]: `stack` along a dim after the first as host copies into one consolidated
//!   buffer, and the reserve of that buffer for a rollout.
//! - [`stack_plan`]: which leaves of a stack are copies or shifts of another leaf's stack.
//! - [`pages`]: allocator and page tricks (glibc-specific parts behind
//!   `cfg(target_env = "gnu")`, with a portable fallback).
//! - [`pendulum`]: the Pendulum host step's loops, with AVX2/FMA copies picked at run time.
//! - [`mmap`]: memory-mapped files of the disk-backed replay storage (not a speed trick: the
//!   one `unsafe` call, mapping a file, lives here by the same rule).
//!
//! Rules: every `unsafe` block carries a `// SAFETY:` comment (the crate denies
//! `clippy::undocumented_unsafe_blocks`); a kernel that meets an input it cannot handle
//! reports it (a `debug_assert!` plus an error, or the slow path), never skips it silently.
//! How fast each piece is, and why, is in `docs/performance.md`.
//!
//! The public face of this module is [`StackReserve`](crate::tensordict::StackReserve):
//!
//! ```
//! use tch::{Device, Kind, Tensor};
//! use torchrl::tensordict::StackReserve;
//! use torchrl::TensorDict;
//! # fn main() -> torchrl::Result<()> {
//! let step = |v: f64| -> torchrl::Result<TensorDict> {
//!     TensorDict::new([4])?.with("obs", Tensor::full([4, 3], v, (Kind::Float, Device::Cpu)))
//! };
//! let first = step(0.0)?;
//! // A buffer for 3 steps like `first`, reserved before the steps are computed.
//! let reserve = StackReserve::new(&first, 3)?;
//! let steps = [first, step(1.0)?, step(2.0)?];
//! let traj = reserve.stack(&steps, 1)?;
//! assert_eq!(traj.batch_size(), &[4, 3]);
//! assert_eq!(traj.get_or_err("obs")?.double_value(&[0, 2, 0]), 2.0);
//! # Ok(()) }
//! ```

pub(crate) mod ffi;
pub(crate) mod mmap;
pub(crate) mod out;
pub(crate) mod pages;
pub(crate) mod pendulum;
pub(crate) mod stack;
pub(crate) mod stack_plan;

pub(crate) use out::{HostBuf, HostOut};

use tch::Tensor;

/// Asks the CPU to bring the cache line of `value` in (a hint: nothing is read or written, and
/// no value changes). For loops over a batch of independent pointer chases (the prioritized
/// sampler's tree descents), where the line is read a whole pass over the batch later.
#[inline(always)]
pub(crate) fn prefetch<T>(value: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `_mm_prefetch` needs SSE, part of every x86_64 target; a prefetch never faults
    // and here points at a live reference.
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(
            std::ptr::from_ref(value).cast::<i8>(),
        );
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = value;
}

/// `Tensor::numel` without its overflow: tch multiplies the dims in order, which overflows (a
/// panic in debug builds) for a shape with no elements such as `[2, i64::MAX, 0]`.
pub(crate) trait Elements {
    /// The number of elements (`usize::MAX` when it does not fit).
    fn elements(&self) -> usize;
}

impl Elements for Tensor {
    #[inline]
    fn elements(&self) -> usize {
        let size = self.size();
        if size.contains(&0) {
            return 0;
        }
        size.iter()
            .try_fold(1usize, |acc, d| acc.checked_mul(usize::try_from(*d).ok()?))
            .unwrap_or(usize::MAX)
    }
}
