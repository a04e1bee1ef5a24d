//! Allocator and page tricks for the consolidated stack buffer: a slack that lets glibc place
//! the next buffer where the previous one was, and mapping a fresh buffer's pages in one
//! system call. glibc-specific heuristics are behind `cfg(target_env = "gnu")`, Linux system
//! calls behind `cfg(target_os = "linux")`; elsewhere the portable fallbacks do nothing
//! (contents and results are the same either way; only page faults differ).

use tch::{Device, Kind, Tensor};

use crate::error::Result;

/// Extra bytes for the next reserved buffer: 64 KiB, then 128 bytes less at each reserve,
/// back to 64 KiB after 512 of them (glibc; 0 with other allocators).
///
/// Why: libtorch allocates with `posix_memalign`, and glibc serves an aligned request of `n`
/// bytes only from a free chunk of at least `n` plus the alignment plus a minimum chunk. A
/// rollout's output structures are allocated after its buffer, often right above it, and
/// freed into glibc's per-thread cache, where they stay allocated as far as the heap is
/// concerned; the freed buffer is then a chunk of exactly its size that cannot merge upwards,
/// and a request of the same size does not fit in it. A request 128 bytes smaller than the
/// previous one always fits in the previous chunk. The slack (at most 64 KiB) is unused.
/// See `docs/performance.md` (W2, "Memory reuse made dependable").
#[cfg(target_env = "gnu")]
pub(crate) fn reserve_slack() -> usize {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static COUNT: AtomicUsize = AtomicUsize::new(0);
    const STEPS: usize = 512;
    const STEP: usize = 128;
    let k = COUNT.fetch_add(1, Ordering::Relaxed) % STEPS;
    (STEPS - k) * STEP
}

/// Extra bytes for the next reserved buffer: none (the slack is a glibc heuristic).
#[cfg(not(target_env = "gnu"))]
pub(crate) fn reserve_slack() -> usize {
    0
}

/// An uninitialised CPU byte buffer of `size` bytes, its pages mapped by [`prefault`].
pub(crate) fn fresh_buffer(size: i64) -> Result<Tensor> {
    let buf = Tensor::f_empty([size], (Kind::Uint8, Device::Cpu))?;
    if let Ok(len) = usize::try_from(size) {
        prefault(buf.data_ptr() as usize, len);
    }
    Ok(buf)
}

/// Maps the pages of the `len` bytes at `addr` (an allocation of ours) in one system call,
/// when they are not mapped yet: a buffer that the allocator just took from the kernel would
/// otherwise take a page fault per 4 KiB as the stack writes it. Reused memory is detected by
/// asking `mincore` about its first and last page, and left alone. Linux only (5.14 or later
/// for the populate call); elsewhere, or when a call fails, nothing happens and the pages
/// fault in as they are written. Contents are unaffected either way: mapped pages stay as
/// they are, and new anonymous pages are zeros, as they would be when first written.
#[cfg(target_os = "linux")]
fn prefault(addr: usize, len: usize) {
    use std::sync::OnceLock;
    static PAGE: OnceLock<usize> = OnceLock::new();
    // SAFETY: sysconf reads a constant of the system.
    let page = *PAGE.get_or_init(|| match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
        p if p > 0 => p as usize,
        _ => 4096,
    });
    let Some(start) = addr.checked_next_multiple_of(page) else {
        return;
    };
    let end = addr.saturating_add(len) / page * page;
    if end < start + 2 * page {
        return;
    }
    let (mut first, mut last) = (0u8, 0u8);
    // SAFETY: mincore only reads this process's page tables; each range is one page-aligned
    // page inside our allocation, and each result pointer is valid for the one byte it gets.
    let mapped = unsafe {
        libc::mincore(start as *mut libc::c_void, page, &mut first) == 0
            && libc::mincore((end - page) as *mut libc::c_void, page, &mut last) == 0
    };
    if mapped && first & 1 == 1 && last & 1 == 1 {
        return;
    }
    // SAFETY: [start, end) is page-aligned and inside our own writable allocation;
    // MADV_POPULATE_WRITE only faults those pages in, leaving the contents as described above.
    // An error (an older kernel) is ignored: the pages then fault in when written.
    let _ = unsafe {
        libc::madvise(
            start as *mut libc::c_void,
            end - start,
            libc::MADV_POPULATE_WRITE,
        )
    };
}

/// Portable fallback: the pages fault in as they are written.
#[cfg(not(target_os = "linux"))]
fn prefault(_addr: usize, _len: usize) {}

/// Makes glibc keep freed memory for reuse: `M_MMAP_MAX` 0 (no `mmap` for large blocks) and
/// `M_TRIM_THRESHOLD` −1 (never trim the heap; mallopt(3)). `true` when both applied.
/// The public entry point and its measurements: [`crate::memory::keep_freed_memory`].
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub(crate) fn keep_freed_memory() -> bool {
    // glibc's <malloc.h>
    const M_TRIM_THRESHOLD: libc::c_int = -1;
    const M_MMAP_MAX: libc::c_int = -4;
    // SAFETY: mallopt only sets allocator parameters (1 when accepted, 0 when refused);
    // blocks already handed out stay valid.
    unsafe { libc::mallopt(M_MMAP_MAX, 0) == 1 && libc::mallopt(M_TRIM_THRESHOLD, -1) == 1 }
}

/// Keeping freed memory is a glibc setting: elsewhere nothing changes.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub(crate) fn keep_freed_memory() -> bool {
    false
}
