//! `torchrl::memory::keep_freed_memory`, alone in its own process: it changes the allocator
//! of the whole process, and its check counts the blocks glibc maps, which other tests
//! running beside it would change.

#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[test]
fn a_large_tensor_is_served_from_the_heap_after_the_call() {
    use tch::{Device, Kind, Tensor};
    use torchrl::memory::keep_freed_memory;

    /// The blocks glibc holds through `mmap`, as (count, bytes).
    fn mapped() -> (usize, usize) {
        // SAFETY: mallinfo2 only reads the allocator's counters.
        let info = unsafe { libc::mallinfo2() };
        (info.hblks, info.hblkhd)
    }

    // 40 MiB: above glibc's largest mmap threshold (32 MiB), below the 64 MiB heaps of the
    // per-thread arena this test thread may allocate from
    let n = 10 << 20;
    // before: glibc maps the block on its own and unmaps it when it is freed
    let before = mapped();
    let t = Tensor::zeros([n], (Kind::Float, Device::Cpu));
    let during = mapped();
    assert_eq!(during.0, before.0 + 1, "{before:?} -> {during:?}");
    assert!(
        during.1 >= before.1 + (40 << 20),
        "{before:?} -> {during:?}"
    );
    drop(t);
    assert_eq!(mapped(), before);
    // after: the same tensor comes from the heap (no new mapping), and computes as before
    assert!(keep_freed_memory());
    let t = Tensor::ones([n], (Kind::Float, Device::Cpu));
    assert_eq!(mapped(), before);
    assert_eq!(t.sum(Kind::Float).double_value(&[]), n as f64);
    drop(t);
    assert_eq!(mapped(), before);
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
#[test]
fn elsewhere_nothing_changes() {
    assert!(!torchrl::memory::keep_freed_memory());
}
