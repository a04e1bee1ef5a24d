//! [`ProcessGroup`]: a handle on a c10d process group (Gloo; NCCL with the cargo feature
//! `nccl`; TCPStore rendezvous with rank 0 as the server), created from torchrun's environment
//! variables or explicit [`InitOptions`].

use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void, CString};
use std::fmt;
use std::ptr::NonNull;
use std::time::Duration;

use tch::{Device, Kind, Tensor};

use super::ffi;
use crate::error::{Error, Result};

/// torchrun's default `MASTER_PORT`.
pub const DEFAULT_MASTER_PORT: u16 = 29500;

/// The default timeout of rendezvous and of every collective: 30 minutes, c10d's default for
/// Gloo (`kBackendDefaultTimeout`). A peer that *exits* is noticed at once (its sockets
/// close); the timeout bounds the wait for a peer that is alive but never joins the call.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// The size of the buffer the shim writes C++ error messages into.
pub(crate) const ERR_LEN: usize = 4096;

/// The collective backend of a [`ProcessGroup`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Backend {
    /// c10d's `ProcessGroupGloo`: CPU tensors, over TCP.
    #[default]
    Gloo,
    /// c10d's `ProcessGroupNCCL`: CUDA tensors on device `LOCAL_RANK`. Built with the cargo
    /// feature `nccl` ([`nccl_built`]); without it [`ProcessGroup::new`] refuses it with an
    /// error saying so, and with it on a machine without a CUDA device it refuses with c10d's
    /// device count (docs/distributed.md).
    Nccl,
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Backend::Gloo => "gloo",
            Backend::Nccl => "nccl",
        })
    }
}

/// Whether this build holds c10d's NCCL path (the cargo feature `nccl`).
///
/// ```
/// assert_eq!(torchrl::distributed::nccl_built(), cfg!(feature = "nccl"));
/// ```
pub fn nccl_built() -> bool {
    // SAFETY: a pure function of how the shim was compiled.
    unsafe { ffi::trl_pg_nccl_built() != 0 }
}

/// How [`ProcessGroup::all_reduce`] combines the ranks' tensors element-wise.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// The sum over ranks.
    Sum,
    /// The mean over ranks: a sum, then a division by the world size on every rank (Gloo has
    /// no `AVG`). Floating-point tensors only.
    Mean,
    /// The element-wise maximum.
    Max,
    /// The element-wise minimum.
    Min,
    /// The element-wise product.
    Product,
}

/// How to create a [`ProcessGroup`]: `new(rank, world_size, master_addr, master_port)` plus
/// `with_*` setters, [`InitOptions::from_env`] for torchrun's variables, or
/// [`InitOptions::single_process`] for a world of one.
///
/// ```
/// use std::time::Duration;
/// use torchrl::distributed::{Backend, InitOptions};
/// let opts = InitOptions::new(1, 2, "10.0.0.1", 29501).with_timeout(Duration::from_secs(60));
/// assert_eq!((opts.rank, opts.world_size, opts.local_rank()), (1, 2, 1));
/// assert_eq!(opts.backend, Backend::Gloo);
/// assert!(opts.validate().is_ok());
/// assert!(InitOptions::new(2, 2, "10.0.0.1", 29501).validate().is_err()); // rank >= world size
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct InitOptions {
    /// This process's rank, in `0..world_size` (torchrun's `RANK`).
    pub rank: usize,
    /// The number of processes (torchrun's `WORLD_SIZE`), at least 1.
    pub world_size: usize,
    /// The rank on this machine (torchrun's `LOCAL_RANK`); `None` means `rank` (one machine).
    pub local_rank: Option<usize>,
    /// The address of rank 0, which serves the rendezvous store (torchrun's `MASTER_ADDR`).
    pub master_addr: String,
    /// The store's port on `master_addr` (torchrun's `MASTER_PORT`). `0` lets the OS choose,
    /// which only a world of one can use (the other ranks could not know the port).
    pub master_port: u16,
    /// The bound on rendezvous and on every collective; [`DEFAULT_TIMEOUT`] by default.
    pub timeout: Duration,
    /// The collective backend; [`Backend::Gloo`] by default.
    pub backend: Backend,
    /// The network interface Gloo binds to (torch's `GLOO_SOCKET_IFNAME`). `None`: a loopback
    /// `master_addr` binds to `127.0.0.1`, any other to the address this host's name resolves
    /// to (c10d's default device).
    pub interface: Option<String>,
}

impl Default for InitOptions {
    /// A world of one on `127.0.0.1` with the OS choosing the port ([`Self::single_process`]).
    fn default() -> Self {
        InitOptions::single_process()
    }
}

impl InitOptions {
    /// Rank `rank` of `world_size`, meeting at `master_addr:master_port`, with the default
    /// timeout and backend.
    pub fn new(
        rank: usize,
        world_size: usize,
        master_addr: impl Into<String>,
        master_port: u16,
    ) -> Self {
        InitOptions {
            rank,
            world_size,
            local_rank: None,
            master_addr: master_addr.into(),
            master_port,
            timeout: DEFAULT_TIMEOUT,
            backend: Backend::Gloo,
            interface: None,
        }
    }

    /// A world of one: rank 0 of 1 on `127.0.0.1`, port chosen by the OS. Every collective is
    /// then the identity (a mean divides by 1), which makes single-process runs of
    /// data-parallel code and runnable examples possible.
    pub fn single_process() -> Self {
        InitOptions::new(0, 1, "127.0.0.1", 0)
    }

    /// From torchrun's environment variables: `RANK`, `WORLD_SIZE`, `MASTER_ADDR`,
    /// `MASTER_PORT` are required, `LOCAL_RANK` defaults to `RANK`, and `GLOO_SOCKET_IFNAME`
    /// (optional) names the interface Gloo binds to. A missing or unparsable variable is an
    /// [`Error::InvalidValue`] naming it.
    pub fn from_env() -> Result<Self> {
        Self::from_env_with(|name| std::env::var(name).ok())
    }

    /// [`Self::from_env`] with the variables looked up by `var` (for tests, or a launcher that
    /// holds the values in a map).
    ///
    /// ```
    /// use torchrl::distributed::InitOptions;
    /// let env = |k: &str| match k {
    ///     "RANK" => Some("1".to_string()),
    ///     "WORLD_SIZE" => Some("2".to_string()),
    ///     "MASTER_ADDR" => Some("127.0.0.1".to_string()),
    ///     "MASTER_PORT" => Some("29555".to_string()),
    ///     _ => None,
    /// };
    /// let opts = InitOptions::from_env_with(env)?;
    /// assert_eq!((opts.rank, opts.world_size, opts.local_rank(), opts.master_port), (1, 2, 1, 29555));
    /// let err = InitOptions::from_env_with(|k| if k == "RANK" { None } else { env(k) }).unwrap_err();
    /// assert!(err.to_string().contains("RANK"));
    /// # Ok::<(), torchrl::Error>(())
    /// ```
    pub fn from_env_with(var: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let rank: usize = parse_var(&var, "RANK", "a rank: an integer >= 0")?;
        let world_size: usize = parse_var(&var, "WORLD_SIZE", "a world size: an integer >= 1")?;
        let master_addr = match var("MASTER_ADDR") {
            Some(a) if !a.trim().is_empty() => a.trim().to_string(),
            other => return Err(env_error("MASTER_ADDR", "a host name or address", other)),
        };
        let master_port: u16 =
            parse_var(&var, "MASTER_PORT", "a TCP port: an integer in 0..=65535")?;
        let local_rank = match var("LOCAL_RANK") {
            None => None,
            Some(_) => Some(parse_var(
                &var,
                "LOCAL_RANK",
                "a local rank: an integer >= 0",
            )?),
        };
        let interface = var("GLOO_SOCKET_IFNAME").filter(|s| !s.trim().is_empty());
        let opts = InitOptions {
            local_rank,
            interface,
            ..InitOptions::new(rank, world_size, master_addr, master_port)
        };
        opts.validate()?;
        Ok(opts)
    }

    /// Sets the rank.
    pub fn with_rank(mut self, rank: usize) -> Self {
        self.rank = rank;
        self
    }

    /// Sets the world size.
    pub fn with_world_size(mut self, world_size: usize) -> Self {
        self.world_size = world_size;
        self
    }

    /// Sets the local rank (the rank on this machine).
    pub fn with_local_rank(mut self, local_rank: usize) -> Self {
        self.local_rank = Some(local_rank);
        self
    }

    /// Sets rank 0's address.
    pub fn with_master_addr(mut self, addr: impl Into<String>) -> Self {
        self.master_addr = addr.into();
        self
    }

    /// Sets the store's port.
    pub fn with_master_port(mut self, port: u16) -> Self {
        self.master_port = port;
        self
    }

    /// Sets the timeout of rendezvous and of every collective.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Sets the backend.
    pub fn with_backend(mut self, backend: Backend) -> Self {
        self.backend = backend;
        self
    }

    /// Sets the network interface Gloo binds to (`"eth0"`, …).
    pub fn with_interface(mut self, interface: impl Into<String>) -> Self {
        self.interface = Some(interface.into());
        self
    }

    /// The local rank: [`Self::local_rank`](field@Self::local_rank) or, when unset, the rank.
    pub fn local_rank(&self) -> usize {
        self.local_rank.unwrap_or(self.rank)
    }

    /// Checks the options without creating anything: `world_size >= 1`, `rank < world_size`,
    /// a non-empty address without NUL bytes, port `0` only for a world of one, a timeout of at
    /// least 1 ms, and a backend that is built. Errors are [`Error::InvalidConfig`].
    pub fn validate(&self) -> Result<()> {
        let op = "InitOptions";
        if self.world_size == 0 || self.world_size > i32::MAX as usize {
            return Err(Error::config(
                op,
                "world_size",
                "an integer in 1..=2^31-1",
                self.world_size,
            ));
        }
        if self.rank >= self.world_size {
            return Err(Error::config(
                op,
                "rank",
                format!("a rank below the world size {}", self.world_size),
                self.rank,
            ));
        }
        if self.master_addr.trim().is_empty() || self.master_addr.contains('\0') {
            return Err(Error::config(
                op,
                "master_addr",
                "a host name or address",
                format!("{:?}", self.master_addr),
            ));
        }
        if self.master_port == 0 && self.world_size > 1 {
            return Err(Error::config(
                op,
                "master_port",
                "a fixed port (1..=65535): port 0 (the OS chooses) only works for a world of one",
                0,
            ));
        }
        if self.timeout < Duration::from_millis(1) || self.timeout.as_millis() > i64::MAX as u128 {
            return Err(Error::config(
                op,
                "timeout",
                "at least 1 ms",
                format!("{:?}", self.timeout),
            ));
        }
        if let Some(iface) = &self.interface {
            if iface.is_empty() || iface.contains('\0') {
                return Err(Error::config(
                    op,
                    "interface",
                    "a network interface name",
                    format!("{iface:?}"),
                ));
            }
        }
        if self.backend == Backend::Nccl && !cfg!(feature = "nccl") {
            return Err(Error::config(
                op,
                "backend",
                "Backend::Gloo (NCCL not built: build torchrl with the cargo feature `nccl`; \
                 docs/distributed.md)",
                "Backend::Nccl",
            ));
        }
        Ok(())
    }
}

fn env_error(name: &str, expected: &str, got: Option<String>) -> Error {
    Error::InvalidValue {
        op: "InitOptions::from_env",
        what: "environment variable",
        key: name.to_string(),
        expected: format!("{expected} (as torchrun sets it)"),
        got: match got {
            None => "unset".to_string(),
            Some(v) => format!("{v:?}"),
        },
    }
}

fn parse_var<T: std::str::FromStr>(
    var: &impl Fn(&str) -> Option<String>,
    name: &str,
    expected: &str,
) -> Result<T> {
    match var(name) {
        Some(v) => v
            .trim()
            .parse()
            .map_err(|_| env_error(name, expected, Some(v))),
        None => Err(env_error(name, expected, None)),
    }
}

/// A c10d process group (Gloo on CPU): rendezvous through a `TCPStore` served by rank 0, then
/// collectives over TCP between all ranks.
///
/// Every collective must be called by **every** rank, in the **same order**, with tensors of
/// the same shape and dtype on every rank (c10d's contract; a mismatch is an error from c10d
/// or, when sizes happen to agree, wrong values). Each call waits at most
/// [`Self::timeout`]: a peer that exited (crashed, was killed) is noticed as soon as its
/// sockets close, a peer that is alive but never joins the call after the timeout; either
/// gives an [`Error::Distributed`] naming the operation, this rank and the world size, and
/// c10d's message (which often names the peer's address). After such an error the group is
/// unusable (c10d's Gloo contexts are out of step): every later call fails at once with an
/// error naming the first failure; create a new group (with a new port) to continue.
///
/// # Thread safety
/// `ProcessGroup` is `Send` (the c10d objects are not tied to the thread that created them:
/// Gloo runs the collectives on its own worker threads) but not `Sync`: two threads issuing
/// collectives on one group could order them differently on different ranks. Move it to the
/// thread that drives training, or wrap it in a `Mutex` and keep the order the same on every
/// rank.
///
/// # Tensors
/// Collectives take dense, contiguous CPU tensors. [`Self::all_reduce`] and
/// [`Self::broadcast`] write into the tensor's storage in place (bypassing autograd; a leaf
/// that requires grad is fine). After an error the tensor's contents are unspecified, and after
/// a timeout c10d's worker thread may still write into it until Gloo's own timeout (the same
/// duration) expires: discard it rather than reuse it.
///
/// ```
/// use tch::Tensor;
/// use torchrl::distributed::{InitOptions, ProcessGroup, ReduceOp};
/// # fn main() -> torchrl::Result<()> {
/// let pg = ProcessGroup::new(InitOptions::single_process())?; // a valid group of one
/// assert_eq!((pg.rank(), pg.world_size(), pg.local_rank()), (0, 1, 0));
/// let mut t = Tensor::from_slice(&[1.0f32, 2.0, 3.0]);
/// pg.all_reduce(&mut t, ReduceOp::Sum)?;
/// assert_eq!(Vec::<f32>::try_from(&t).unwrap(), vec![1.0, 2.0, 3.0]);
/// let all = pg.all_gather(&t)?;
/// assert_eq!(all.len(), 1);
/// pg.barrier()?;
/// # Ok(()) }
/// ```
pub struct ProcessGroup {
    raw: NonNull<c_void>,
    rank: usize,
    world_size: usize,
    local_rank: usize,
    timeout: Duration,
    backend: Backend,
    master_addr: String,
    master_port: u16,
    /// The first c10d failure (op and message), after which the group refuses every call.
    failed: RefCell<Option<(&'static str, String)>>,
}

// SAFETY: the shim's group (a TCPStore and a ProcessGroupGloo behind an intrusive pointer) has
// no thread affinity: c10d's Gloo backend runs collectives on its own worker threads and guards
// its queue with a mutex, and the store is a socket client (plus, on rank 0, a server thread).
// Moving the handle to another thread is therefore sound. It is deliberately not `Sync`
// (`RefCell`, raw pointer): concurrent calls could order collectives differently per rank.
unsafe impl Send for ProcessGroup {}

impl fmt::Debug for ProcessGroup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProcessGroup")
            .field("backend", &self.backend)
            .field("rank", &self.rank)
            .field("world_size", &self.world_size)
            .field("local_rank", &self.local_rank)
            .field(
                "master",
                &format!("{}:{}", self.master_addr, self.master_port),
            )
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// A buffer for the shim's error message.
struct ErrBuf(Vec<u8>);

impl ErrBuf {
    fn new() -> Self {
        ErrBuf(vec![0u8; ERR_LEN])
    }

    fn ptr(&mut self) -> *mut c_char {
        self.0.as_mut_ptr().cast()
    }

    fn message(&self) -> String {
        let end = self.0.iter().position(|&b| b == 0).unwrap_or(self.0.len());
        let bytes = self.0.get(..end).unwrap_or_default();
        let msg = String::from_utf8_lossy(bytes).trim().to_string();
        if msg.is_empty() {
            "c10d reported an error without a message".to_string()
        } else {
            msg
        }
    }
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX).max(1)
}

impl ProcessGroup {
    /// Joins the group `opts` describes: rank 0 starts the rendezvous store at
    /// `master_addr:master_port`, every rank connects to it, then Gloo connects every pair of
    /// ranks. Blocks until all `world_size` ranks have joined, or errors after
    /// `opts.timeout`.
    ///
    /// Errors: [`Error::InvalidConfig`] for bad options ([`InitOptions::validate`]),
    /// [`Error::Distributed`] (`op: "init"`) when c10d fails (port in use, peers that never
    /// came, an unreachable master).
    pub fn new(opts: InitOptions) -> Result<Self> {
        opts.validate()?;
        let dist_err = |message: String| Error::Distributed {
            op: "init",
            rank: opts.rank,
            world_size: opts.world_size,
            message,
        };
        let addr = CString::new(opts.master_addr.trim())
            .map_err(|_| dist_err("master_addr holds a NUL byte".into()))?;
        let iface = CString::new(opts.interface.clone().unwrap_or_default())
            .map_err(|_| dist_err("interface holds a NUL byte".into()))?;
        let timeout_ms = millis(opts.timeout);
        let mut raw: *mut c_void = std::ptr::null_mut();
        let mut err = ErrBuf::new();
        let status = match opts.backend {
            // SAFETY: the strings are NUL-terminated and outlive the call; `raw` is a valid
            // out pointer; the error buffer holds ERR_LEN writable bytes. Rank and world size
            // fit a c_int (validate checked world_size <= i32::MAX and rank < world_size).
            Backend::Gloo => unsafe {
                ffi::trl_pg_new(
                    addr.as_ptr(),
                    opts.master_port,
                    opts.rank as c_int,
                    opts.world_size as c_int,
                    timeout_ms,
                    iface.as_ptr(),
                    &mut raw,
                    err.ptr(),
                    ERR_LEN,
                )
            },
            #[cfg(feature = "nccl")]
            Backend::Nccl => {
                let device = c_int::try_from(opts.local_rank())
                    .map_err(|_| dist_err("LOCAL_RANK does not fit a CUDA device index".into()))?;
                // SAFETY: as for Gloo; `device` is checked against the device count by the
                // shim.
                unsafe {
                    ffi::trl_pg_new_nccl(
                        addr.as_ptr(),
                        opts.master_port,
                        opts.rank as c_int,
                        opts.world_size as c_int,
                        timeout_ms,
                        device,
                        &mut raw,
                        err.ptr(),
                        ERR_LEN,
                    )
                }
            }
            #[cfg(not(feature = "nccl"))]
            Backend::Nccl => return Err(dist_err("NCCL not built".into())),
        };
        if status != ffi::OK {
            return Err(dist_err(err.message()));
        }
        let raw = NonNull::new(raw).ok_or_else(|| dist_err("c10d returned no group".into()))?;
        // SAFETY: `raw` is the live group the shim just created.
        let port = unsafe { ffi::trl_pg_port(raw.as_ptr()) };
        Ok(ProcessGroup {
            raw,
            rank: opts.rank,
            world_size: opts.world_size,
            local_rank: opts.local_rank(),
            timeout: opts.timeout,
            backend: opts.backend,
            master_addr: opts.master_addr.trim().to_string(),
            master_port: u16::try_from(port).unwrap_or(opts.master_port),
            failed: RefCell::new(None),
        })
    }

    /// [`Self::new`] from torchrun's variables ([`InitOptions::from_env`]) with the default
    /// timeout; use `ProcessGroup::new(InitOptions::from_env()?.with_timeout(..))` to change
    /// it.
    pub fn init_from_env() -> Result<Self> {
        Self::new(InitOptions::from_env()?)
    }

    /// This process's rank, in `0..world_size`.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of processes in the group.
    pub fn world_size(&self) -> usize {
        self.world_size
    }

    /// The rank on this machine (torchrun's `LOCAL_RANK`).
    pub fn local_rank(&self) -> usize {
        self.local_rank
    }

    /// Whether this is rank 0 (the one that logs and writes checkpoints).
    pub fn is_main(&self) -> bool {
        self.rank == 0
    }

    /// The backend.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The device this group's collectives take tensors on: the CPU for Gloo,
    /// `Device::Cuda(local_rank)` for NCCL.
    pub fn device(&self) -> Device {
        match self.backend {
            Backend::Gloo => Device::Cpu,
            Backend::Nccl => Device::Cuda(self.local_rank),
        }
    }

    /// Rank 0's address.
    pub fn master_addr(&self) -> &str {
        &self.master_addr
    }

    /// The store's port (the one the OS chose when `master_port` was 0).
    pub fn master_port(&self) -> u16 {
        self.master_port
    }

    /// The bound on every collective.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Changes the bound on every later collective (and Gloo's own socket timeout). Errors on
    /// a timeout below 1 ms.
    pub fn set_timeout(&mut self, timeout: Duration) -> Result<()> {
        if timeout < Duration::from_millis(1) {
            return Err(Error::config(
                "ProcessGroup::set_timeout",
                "timeout",
                "at least 1 ms",
                format!("{timeout:?}"),
            ));
        }
        self.call("set_timeout", |raw, err| {
            // SAFETY: `raw` is this group's live handle; `err` holds ERR_LEN bytes.
            unsafe { ffi::trl_pg_set_timeout(raw, millis(timeout), err, ERR_LEN) }
        })?;
        self.timeout = timeout;
        Ok(())
    }

    /// Reduces `tensor` across all ranks in place: afterwards every rank holds the
    /// element-wise sum / mean / max / min / product of all ranks' tensors.
    ///
    /// `tensor` must be a defined, dense, contiguous CPU tensor of the same shape and dtype on
    /// every rank; [`ReduceOp::Mean`] needs a floating-point dtype.
    pub fn all_reduce(&self, tensor: &mut Tensor, op: ReduceOp) -> Result<()> {
        let name = "all_reduce";
        check_tensor(name, "tensor", tensor, true, self.device())?;
        let code = match op {
            ReduceOp::Sum | ReduceOp::Mean => ffi::OP_SUM,
            ReduceOp::Max => ffi::OP_MAX,
            ReduceOp::Min => ffi::OP_MIN,
            ReduceOp::Product => ffi::OP_PRODUCT,
        };
        if op == ReduceOp::Mean {
            let kind = tensor.f_kind()?;
            if !crate::kind::is_float(kind) {
                return Err(Error::argument(
                    name,
                    "tensor",
                    "a floating-point tensor for ReduceOp::Mean (use Sum for integers)",
                    format!("{kind:?}"),
                ));
            }
        }
        let ptr = tensor.as_mut_ptr().cast::<c_void>();
        let timeout_ms = millis(self.timeout);
        self.call(name, |raw, err| {
            // SAFETY: `raw` is this group's live handle; `ptr` is the `at::Tensor*` of a
            // tensor borrowed mutably for this call (the shim copies the handle); `err` holds
            // ERR_LEN bytes.
            unsafe { ffi::trl_pg_allreduce(raw, ptr, code, timeout_ms, err, ERR_LEN) }
        })?;
        if op == ReduceOp::Mean && self.world_size > 1 {
            let _guard = tch::no_grad_guard();
            let _ = tensor.f_div_scalar_(self.world_size as f64)?;
        }
        Ok(())
    }

    /// Copies rank `src`'s `tensor` into every other rank's `tensor`, in place.
    ///
    /// `tensor` must be a defined, dense, contiguous CPU tensor of the same shape and dtype on
    /// every rank; `src < world_size`.
    pub fn broadcast(&self, tensor: &mut Tensor, src: usize) -> Result<()> {
        let name = "broadcast";
        check_tensor(name, "tensor", tensor, true, self.device())?;
        self.check_rank(name, "src", src)?;
        let ptr = tensor.as_mut_ptr().cast::<c_void>();
        let timeout_ms = millis(self.timeout);
        self.call(name, |raw, err| {
            // SAFETY: as in `all_reduce`; `src` fits a c_int (checked against world_size).
            unsafe { ffi::trl_pg_broadcast(raw, ptr, src as c_int, timeout_ms, err, ERR_LEN) }
        })
    }

    /// Every rank's `tensor`, in rank order (`result[r]` is rank `r`'s), on every rank.
    ///
    /// `tensor` must be a defined, dense CPU tensor of the same shape and dtype on every rank
    /// (a non-contiguous one is copied first). The result tensors are fresh, contiguous and
    /// have `tensor`'s shape and dtype.
    pub fn all_gather(&self, tensor: &Tensor) -> Result<Vec<Tensor>> {
        let name = "all_gather";
        check_tensor(name, "tensor", tensor, false, self.device())?;
        let input = if tensor.is_contiguous() {
            tensor.shallow_clone()
        } else {
            tensor.f_contiguous()?
        };
        let outputs = (0..self.world_size)
            .map(|_| input.f_empty_like())
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let in_ptr = input.as_ptr() as *mut c_void;
        let out_ptrs: Vec<*mut c_void> =
            outputs.iter().map(|t| t.as_ptr() as *mut c_void).collect();
        let timeout_ms = millis(self.timeout);
        self.call(name, |raw, err| {
            // SAFETY: `in_ptr` and `out_ptrs` are `at::Tensor*`s of tensors alive for this
            // call (the shim copies the handles). c10d only reads the input; the outputs are
            // fresh tensors owned by this function, so writing them through a pointer derived
            // from `&Tensor` aliases nothing the caller sees. `out_ptrs` holds world_size
            // pointers, which fits a c_int.
            unsafe {
                ffi::trl_pg_allgather(
                    raw,
                    in_ptr,
                    out_ptrs.as_ptr(),
                    out_ptrs.len() as c_int,
                    timeout_ms,
                    err,
                    ERR_LEN,
                )
            }
        })?;
        Ok(outputs)
    }

    /// Waits until every rank has called `barrier` (and every earlier collective of this rank
    /// has finished).
    pub fn barrier(&self) -> Result<()> {
        let timeout_ms = millis(self.timeout);
        self.call("barrier", |raw, err| {
            // SAFETY: `raw` is this group's live handle; `err` holds ERR_LEN bytes.
            unsafe { ffi::trl_pg_barrier(raw, timeout_ms, err, ERR_LEN) }
        })
    }

    /// c10d's monitored barrier: like [`Self::barrier`], but rank 0 checks in with every other
    /// rank and, when some do not arrive within the timeout, its error names them (the first
    /// one, or all of them with `wait_all_ranks`). Use it to find which rank is stuck.
    pub fn monitored_barrier(&self, wait_all_ranks: bool) -> Result<()> {
        let timeout_ms = millis(self.timeout);
        self.call("monitored_barrier", |raw, err| {
            // SAFETY: `raw` is this group's live handle; `err` holds ERR_LEN bytes.
            unsafe {
                ffi::trl_pg_monitored_barrier(
                    raw,
                    timeout_ms,
                    c_int::from(wait_all_ranks),
                    err,
                    ERR_LEN,
                )
            }
        })
    }

    fn check_rank(&self, op: &'static str, name: &str, r: usize) -> Result<()> {
        if r >= self.world_size {
            return Err(Error::argument(
                op,
                name,
                format!("a rank below the world size {}", self.world_size),
                r.to_string(),
            ));
        }
        Ok(())
    }

    /// Runs one shim call, turning a failure into an [`Error::Distributed`] and marking the
    /// group as failed; refuses at once when an earlier call failed.
    pub(crate) fn call(
        &self,
        op: &'static str,
        f: impl FnOnce(*mut c_void, *mut c_char) -> c_int,
    ) -> Result<()> {
        if let Some((first_op, first_msg)) = self.failed.borrow().as_ref() {
            return Err(self.error(
                op,
                format!(
                    "the group is unusable after an earlier failure of {first_op} ({first_msg}); \
                     create a new ProcessGroup"
                ),
            ));
        }
        let mut err = ErrBuf::new();
        let status = f(self.raw.as_ptr(), err.ptr());
        if status == ffi::OK {
            return Ok(());
        }
        let mut message = err.message();
        if status == ffi::TIMED_OUT {
            message = format!(
                "no answer within the timeout of {:?} (a peer is gone, stuck, or calling a \
                 different collective): {message}",
                self.timeout
            );
        }
        *self.failed.borrow_mut() = Some((op, message.clone()));
        Err(self.error(op, message))
    }

    fn error(&self, op: &'static str, message: String) -> Error {
        Error::Distributed {
            op,
            rank: self.rank,
            world_size: self.world_size,
            message,
        }
    }
}

impl Drop for ProcessGroup {
    /// Waits for the group's queued collectives (each bounded by the timeout), then closes the
    /// connections; rank 0 also stops the store.
    fn drop(&mut self) {
        // SAFETY: `raw` was created by `trl_pg_new` (or `trl_pg_new_nccl`) and is freed
        // exactly once, here.
        unsafe { ffi::trl_pg_free(self.raw.as_ptr()) }
    }
}

/// Checks what the group's backend needs of a tensor (on `expected`: the CPU for Gloo, the
/// rank's GPU for NCCL), with errors that say what to do.
pub(crate) fn check_tensor(
    op: &'static str,
    name: &str,
    t: &Tensor,
    need_contiguous: bool,
    expected: Device,
) -> Result<()> {
    if !t.defined() {
        return Err(Error::argument(
            op,
            name,
            "a defined tensor",
            "an undefined tensor",
        ));
    }
    let device = t.device();
    if device != expected {
        return Err(Error::DeviceMismatch {
            op,
            key: name.to_string(),
            expected,
            actual: device,
        });
    }
    if t.is_sparse() {
        return Err(Error::argument(
            op,
            name,
            "a dense tensor",
            "a sparse tensor",
        ));
    }
    if need_contiguous && !t.is_contiguous() {
        return Err(Error::argument(
            op,
            name,
            "a contiguous tensor (in-place collectives write the storage; call .contiguous() \
             and copy back)",
            format!(
                "a non-contiguous tensor of shape {:?}, strides {:?}",
                t.size(),
                t.stride()
            ),
        ));
    }
    let kind = t.f_kind()?;
    if matches!(
        kind,
        Kind::ComplexHalf | Kind::ComplexFloat | Kind::ComplexDouble
    ) {
        return Err(Error::argument(
            op,
            name,
            "a real dtype (view complex tensors as real first)",
            format!("{kind:?}"),
        ));
    }
    Ok(())
}
