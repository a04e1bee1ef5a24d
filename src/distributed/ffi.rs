//! The C ABI of `shim.cpp` (c10d's TCPStore + ProcessGroupGloo, and ProcessGroupNCCL with the
//! feature `nccl`). Every function catches every
//! C++ exception and reports it as a status code plus a message written into the caller's
//! buffer; no exception crosses this boundary.
//!
//! Tensors are passed as `*mut C_tensor`, which in torch-sys is a heap `torch::Tensor*` (an
//! `at::Tensor*`): the shim copies the handle (a reference count), so the storage stays alive
//! while c10d's worker thread uses it, even past an early return on timeout.

use std::ffi::{c_char, c_int, c_void};

/// The call succeeded.
pub(crate) const OK: c_int = 0;
/// c10d reported that the call did not finish within its timeout.
pub(crate) const TIMED_OUT: c_int = 2;

/// Reduce op codes understood by `trl_pg_allreduce`.
pub(crate) const OP_SUM: c_int = 0;
pub(crate) const OP_MAX: c_int = 1;
pub(crate) const OP_MIN: c_int = 2;
pub(crate) const OP_PRODUCT: c_int = 3;

extern "C" {
    pub(crate) fn trl_pg_new(
        addr: *const c_char,
        port: u16,
        rank: c_int,
        world_size: c_int,
        timeout_ms: i64,
        iface: *const c_char,
        out: *mut *mut c_void,
        err: *mut c_char,
        err_len: usize,
    ) -> c_int;
    #[cfg(feature = "nccl")]
    pub(crate) fn trl_pg_new_nccl(
        addr: *const c_char,
        port: u16,
        rank: c_int,
        world_size: c_int,
        timeout_ms: i64,
        device: c_int,
        out: *mut *mut c_void,
        err: *mut c_char,
        err_len: usize,
    ) -> c_int;
    pub(crate) fn trl_pg_nccl_built() -> c_int;
    pub(crate) fn trl_pg_port(group: *mut c_void) -> c_int;
    pub(crate) fn trl_pg_set_timeout(
        group: *mut c_void,
        timeout_ms: i64,
        err: *mut c_char,
        err_len: usize,
    ) -> c_int;
    pub(crate) fn trl_pg_free(group: *mut c_void);
    pub(crate) fn trl_reducer_new(
        group: *mut c_void,
        params: *const *mut c_void,
        n: c_int,
        bucket_bytes: i64,
        out: *mut *mut c_void,
        err: *mut c_char,
        err_len: usize,
    ) -> c_int;
    pub(crate) fn trl_reducer_prepare(
        reducer: *mut c_void,
        outputs: *const *mut c_void,
        n: c_int,
        err: *mut c_char,
        err_len: usize,
    ) -> c_int;
    pub(crate) fn trl_reducer_free(reducer: *mut c_void);
    pub(crate) fn trl_pg_allreduce(
        group: *mut c_void,
        tensor: *mut c_void,
        op: c_int,
        timeout_ms: i64,
        err: *mut c_char,
        err_len: usize,
    ) -> c_int;
    pub(crate) fn trl_pg_broadcast(
        group: *mut c_void,
        tensor: *mut c_void,
        src: c_int,
        timeout_ms: i64,
        err: *mut c_char,
        err_len: usize,
    ) -> c_int;
    pub(crate) fn trl_pg_allgather(
        group: *mut c_void,
        input: *mut c_void,
        outputs: *const *mut c_void,
        n_outputs: c_int,
        timeout_ms: i64,
        err: *mut c_char,
        err_len: usize,
    ) -> c_int;
    pub(crate) fn trl_pg_barrier(
        group: *mut c_void,
        timeout_ms: i64,
        err: *mut c_char,
        err_len: usize,
    ) -> c_int;
    pub(crate) fn trl_pg_monitored_barrier(
        group: *mut c_void,
        timeout_ms: i64,
        wait_all_ranks: c_int,
        err: *mut c_char,
        err_len: usize,
    ) -> c_int;
}
