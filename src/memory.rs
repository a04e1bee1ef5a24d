//! Process-wide memory settings for training large models on the CPU.
//!
//! libtorch allocates CPU tensors through the C allocator. glibc's allocator serves every
//! block above 32 MiB with a fresh `mmap` and gives it back with `munmap` when the tensor is
//! freed, so a training step that makes logit-, activation- and gradient-sized tensors again
//! on every step has the kernel map and zero those pages again on every step. At the
//! Qwen2.5-0.5B shape (`docs/performance.md`, W21) that page zeroing was a quarter of a
//! full-parameter GRPO step's cycles. [`keep_freed_memory`] makes the allocator keep freed
//! memory in the process for the next allocation instead: the step then reuses pages that are
//! already mapped. It is opt-in because it is process-wide and the memory it keeps is not
//! returned to the system until the process ends.

/// Makes the C allocator keep freed memory for reuse instead of returning it to the system:
/// no `mmap` for large blocks (`M_MMAP_MAX` 0) and no trimming of the heap
/// (`M_TRIM_THRESHOLD` −1), glibc's `MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=…` set from
/// inside the process. Call it once at start-up, before the model is built (blocks mapped
/// before the call are still unmapped when freed). Returns whether it applied: `true` on
/// Linux with glibc, `false` elsewhere (other allocators, other systems: nothing changes).
/// Threads other than the main one allocate from glibc's per-thread arenas, whose heaps are
/// 64 MiB: blocks larger than that are still mapped there (the trainers allocate on the
/// thread that runs them).
///
/// Measured at the Qwen2.5-0.5B shape on a 2-core Xeon (`docs/performance.md`, "Keeping
/// freed memory"): a full-parameter float32 GRPO step 11.7–11.9 → 8.9–9.0 s at 1–2 % more
/// peak RSS; the LoRA bf16 GRPO step 3.36 → 3.09 s at 9 % more; the LoRA bf16 PPO-RLHF
/// iteration 6.07 → 5.76 s at 1.5 % more. The cost is that the resident set never shrinks:
/// memory freed at the end of a phase (generation, evaluation) stays with the process. The
/// `torchrl` command's `--keep-freed-memory` calls it.
///
/// ```
/// let applied = torchrl::memory::keep_freed_memory();
/// assert_eq!(applied, cfg!(all(target_os = "linux", target_env = "gnu")));
/// // tensors are made and freed as before
/// let t = tch::Tensor::zeros([1 << 24], (tch::Kind::Float, tch::Device::Cpu));
/// assert_eq!(t.numel(), 1 << 24);
/// ```
pub fn keep_freed_memory() -> bool {
    crate::host::pages::keep_freed_memory()
}
