// The C ABI between `torchrl::distributed` and libtorch's c10d (TCPStore + ProcessGroupGloo, and
// ProcessGroupNCCL when compiled with TORCHRL_NCCL).
//
// Compiled by build.rs only with the cargo feature `distributed`, against the torch wheel's
// headers and Debian's `libgloo-dev` headers; the feature `nccl` adds TORCHRL_NCCL and the CUDA /
// NCCL headers the wheel's nvidia-* dependencies ship (plus nvidia-cuda-crt / -cccl, installed by
// scripts/setup.sh) (see docs/distributed.md for why that pairing is
// sound: c10d's class layout holds gloo objects only behind pointers, and this file makes no
// direct gloo call). Every entry point catches every C++ exception and reports it through a
// caller-owned message buffer: no exception ever crosses the FFI boundary.
//
// Status codes: 0 = ok, 1 = an error (message written), 2 = the collective did not finish
// within its timeout (message written).

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/comm.hpp>
#include <torch/csrc/distributed/c10d/reducer.hpp>
#ifdef TORCHRL_NCCL
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

namespace {

// Either backend, through c10d's common `Backend` interface (allreduce, broadcast, allgather,
// barrier, setTimeout are virtual there).
struct TrlGroup {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::Backend> pg;
};

// The rendezvous store: rank 0 serves a TCPStore at host:port; the group's keys live under a
// prefix.
c10::intrusive_ptr<c10d::TCPStore> make_store(const std::string& host, uint16_t port, int rank,
                                              int world_size, std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions sopts;
  sopts.port = port;
  sopts.isServer = rank == 0;
  sopts.numWorkers = static_cast<size_t>(world_size);
  sopts.waitWorkers = true;
  sopts.timeout = timeout;
  return c10::make_intrusive<c10d::TCPStore>(host, sopts);
}

void write_message(char* buf, size_t len, const std::string& msg) {
  if (buf == nullptr || len == 0) {
    return;
  }
  size_t n = msg.size() < len - 1 ? msg.size() : len - 1;
  std::memcpy(buf, msg.data(), n);
  buf[n] = '\0';
}

// c10::Error's what() carries a C++ backtrace after the message; keep the message only.
std::string describe(const std::exception& e) {
  if (auto* ce = dynamic_cast<const c10::Error*>(&e)) {
    return ce->what_without_backtrace();
  }
  return e.what();
}

bool is_timeout(const std::string& msg) {
  return msg.find("imed out") != std::string::npos ||
      msg.find("imeout") != std::string::npos;
}

template <typename F>
int guarded(char* err, size_t err_len, F&& f) {
  try {
    f();
    return 0;
  } catch (const std::exception& e) {
    std::string msg = describe(e);
    write_message(err, err_len, msg);
    return is_timeout(msg) ? 2 : 1;
  } catch (...) {
    write_message(err, err_len, "unknown C++ exception");
    return 1;
  }
}

// Waits for a work item within `timeout`: Work::wait rethrows the collective's exception and
// throws on timeout.
void wait_for(const c10::intrusive_ptr<c10d::Work>& work, std::chrono::milliseconds timeout) {
  if (!work->wait(timeout)) {
    throw std::runtime_error("the collective was aborted");
  }
}

c10d::ReduceOp reduce_op(int op) {
  switch (op) {
    case 0:
      return c10d::ReduceOp::SUM;
    case 1:
      return c10d::ReduceOp::MAX;
    case 2:
      return c10d::ReduceOp::MIN;
    case 3:
      return c10d::ReduceOp::PRODUCT;
    default:
      throw std::invalid_argument("unknown reduce op code " + std::to_string(op));
  }
}

// DDP's gradient reducer over one of our groups. c10d::Reducer hooks every parameter's gradient
// accumulator: once `prepare_for_backward` has armed it, each bucket is all-reduced (on the
// backend's worker threads) as soon as backward has produced all its gradients, while backward
// goes on with the rest, and the results are copied back into `.grad` before `backward`
// returns. The comm hook sums (DDP's default divides by the world size; our trainers pre-scale
// each rank's loss so that the sum is the global gradient).
class SumCommHook : public c10d::CppCommHookInterface<c10::intrusive_ptr<c10d::ProcessGroup>> {
 public:
  explicit SumCommHook(const c10::intrusive_ptr<c10d::ProcessGroup>& pg)
      : CppCommHookInterface(pg) {}
  c10::intrusive_ptr<c10::ivalue::Future> runHook(c10d::GradBucket& bucket) override {
    std::vector<at::Tensor> tensors{bucket.getBufferRef()};
    return state_->allreduce(tensors)->getFuture();
  }
};

struct TrlReducer {
  c10::intrusive_ptr<c10d::ProcessGroup> pg;
  std::shared_ptr<c10d::Reducer> reducer;
};

bool is_loopback(const std::string& addr) {
  return addr == "localhost" || addr.rfind("127.", 0) == 0 || addr == "::1";
}

}  // namespace

extern "C" {

// Creates the store (rank 0 serves it at addr:port; port 0 asks the OS for one, meaningful only
// when world_size == 1) and the Gloo process group. `iface`, when non-empty, names the network
// interface Gloo binds to; otherwise a loopback master address binds Gloo to 127.0.0.1 and any
// other address uses c10d's default device (this host's resolved hostname).
int trl_pg_new(const char* addr, uint16_t port, int rank, int world_size, int64_t timeout_ms,
               const char* iface, void** out, char* err, size_t err_len) {
  *out = nullptr;
  return guarded(err, err_len, [&] {
    auto timeout = std::chrono::milliseconds(timeout_ms);
    std::string host(addr);
    auto tcp = make_store(host, port, rank, world_size, timeout);
    c10::intrusive_ptr<c10d::Store> store =
        c10::make_intrusive<c10d::PrefixStore>("torchrl/default_pg", tcp);

    auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
    std::string ifname(iface);
    if (!ifname.empty()) {
      opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(ifname));
    } else if (is_loopback(host)) {
      opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
    } else {
      opts->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
    }
    auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world_size, opts);
    *out = new TrlGroup{tcp, pg};
  });
}

// 1 when this shim was compiled with ProcessGroupNCCL (the cargo feature `nccl`), else 0.
int trl_pg_nccl_built() {
#ifdef TORCHRL_NCCL
  return 1;
#else
  return 0;
#endif
}

#ifdef TORCHRL_NCCL
// As trl_pg_new, with c10d's ProcessGroupNCCL bound to CUDA device `device` (the rank's
// LOCAL_RANK). Refused with a message when no CUDA device is visible or `device` is not one.
// Collectives wait on the host with their timeout (TORCH_NCCL_BLOCKING_WAIT=1 unless the
// environment sets it), so a vanished peer is an error, not the watchdog's abort.
int trl_pg_new_nccl(const char* addr, uint16_t port, int rank, int world_size, int64_t timeout_ms,
                    int device, void** out, char* err, size_t err_len) {
  *out = nullptr;
  return guarded(err, err_len, [&] {
    auto count = static_cast<int>(c10::cuda::device_count());
    if (count == 0) {
      throw std::runtime_error(
          "NCCL needs a CUDA device, and none is visible to this process "
          "(c10::cuda::device_count() = 0); use Backend::Gloo on CPU");
    }
    if (device < 0 || device >= count) {
      throw std::runtime_error("CUDA device " + std::to_string(device) +
                               " (LOCAL_RANK) does not exist: " + std::to_string(count) +
                               " device(s) are visible");
    }
    setenv("TORCH_NCCL_BLOCKING_WAIT", "1", 0);
    c10::cuda::set_device(static_cast<c10::DeviceIndex>(device));
    auto timeout = std::chrono::milliseconds(timeout_ms);
    std::string host(addr);
    auto tcp = make_store(host, port, rank, world_size, timeout);
    c10::intrusive_ptr<c10d::Store> store =
        c10::make_intrusive<c10d::PrefixStore>("torchrl/default_pg", tcp);
    auto opts = c10d::ProcessGroupNCCL::Options::create();
    opts->timeout = timeout;
    auto pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, world_size, opts);
    pg->setBoundDeviceId(at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(device)));
    *out = new TrlGroup{tcp, pg};
  });
}
#endif

// The port the store listens on (the one the OS chose when port 0 was asked for).
int trl_pg_port(void* group) {
  auto* g = static_cast<TrlGroup*>(group);
  auto* tcp = dynamic_cast<c10d::TCPStore*>(g->store.get());
  return tcp == nullptr ? -1 : static_cast<int>(tcp->getPort());
}

// Sets the default timeout of the group's Gloo contexts (each call also passes its own).
int trl_pg_set_timeout(void* group, int64_t timeout_ms, char* err, size_t err_len) {
  return guarded(err, err_len, [&] {
    static_cast<TrlGroup*>(group)->pg->setTimeout(std::chrono::milliseconds(timeout_ms));
  });
}

// A gradient reducer (TrlReducer) over `group` for `params` (leaf tensors that require grad,
// in the same order on every rank), in buckets of at most `bucket_bytes`, the last parameters
// first (backward produces their gradients first). Parameters that get no gradient in a
// backward pass are allowed (DDP's find_unused_parameters).
int trl_reducer_new(void* group, void* const* params, int n, int64_t bucket_bytes, void** out,
                    char* err, size_t err_len) {
  *out = nullptr;
  return guarded(err, err_len, [&] {
    auto* g = static_cast<TrlGroup*>(group);
    if (n <= 0) {
      throw std::invalid_argument("no parameters to reduce");
    }
    std::vector<at::Tensor> ps;
    ps.reserve(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) {
      ps.push_back(*static_cast<at::Tensor*>(params[i]));
    }
    auto pg = c10::make_intrusive<c10d::ProcessGroup>(g->store, g->pg->getRank(), g->pg->getSize());
    bool nccl = g->pg->getBackendName() == "nccl";
    auto type = nccl ? c10d::ProcessGroup::BackendType::NCCL : c10d::ProcessGroup::BackendType::GLOO;
    pg->setBackend(nccl ? c10::DeviceType::CUDA : c10::DeviceType::CPU, type, g->pg);
    pg->setDefaultBackend(type);
    std::vector<bool> sparse(ps.size(), false);
    auto cap = static_cast<size_t>(bucket_bytes);
    auto assigned = c10d::compute_bucket_assignment_by_size(ps, {cap}, sparse);
    auto buckets = std::get<0>(assigned);
    std::reverse(buckets.begin(), buckets.end());
    auto reducer = std::make_shared<c10d::Reducer>(
        ps, buckets, pg, sparse, bucket_bytes, /*find_unused_parameters=*/true,
        /*gradient_as_bucket_view=*/false, std::unordered_map<size_t, std::string>{},
        /*first_bucket_bytes_cap=*/bucket_bytes, /*skip_all_reduce_unused_params=*/false,
        /*use_python_reducer=*/false, std::vector<int64_t>{});
    reducer->register_comm_hook(std::make_unique<SumCommHook>(pg));
    *out = new TrlReducer{pg, reducer};
  });
}

// Arms the reducer for the next backward pass from `outputs` (which it walks to find the
// parameters that will get no gradient).
int trl_reducer_prepare(void* reducer, void* const* outputs, int n, char* err, size_t err_len) {
  return guarded(err, err_len, [&] {
    std::vector<at::Tensor> outs;
    for (int i = 0; i < n; ++i) {
      outs.push_back(*static_cast<at::Tensor*>(outputs[i]));
    }
    static_cast<TrlReducer*>(reducer)->reducer->prepare_for_backward(outs);
  });
}

void trl_reducer_free(void* reducer) {
  try {
    delete static_cast<TrlReducer*>(reducer);
  } catch (...) {
    // ~Reducer may throw (noexcept(false)) after a failed backward; the process goes on.
  }
}

void trl_pg_free(void* group) {
  try {
    delete static_cast<TrlGroup*>(group);
  } catch (...) {
    // A destructor that throws is a c10d bug; swallowing it keeps the process alive.
  }
}

int trl_pg_allreduce(void* group, void* tensor, int op, int64_t timeout_ms, char* err,
                     size_t err_len) {
  return guarded(err, err_len, [&] {
    auto* g = static_cast<TrlGroup*>(group);
    std::vector<at::Tensor> tensors{*static_cast<at::Tensor*>(tensor)};
    c10d::AllreduceOptions opts;
    opts.reduceOp = reduce_op(op);
    opts.timeout = std::chrono::milliseconds(timeout_ms);
    wait_for(g->pg->allreduce(tensors, opts), opts.timeout);
  });
}

int trl_pg_broadcast(void* group, void* tensor, int src, int64_t timeout_ms, char* err,
                     size_t err_len) {
  return guarded(err, err_len, [&] {
    auto* g = static_cast<TrlGroup*>(group);
    std::vector<at::Tensor> tensors{*static_cast<at::Tensor*>(tensor)};
    c10d::BroadcastOptions opts;
    opts.rootRank = src;
    opts.rootTensor = 0;
    opts.timeout = std::chrono::milliseconds(timeout_ms);
    wait_for(g->pg->broadcast(tensors, opts), opts.timeout);
  });
}

// `outputs` holds world_size tensors allocated by the caller like `input`.
int trl_pg_allgather(void* group, void* input, void* const* outputs, int n_outputs,
                     int64_t timeout_ms, char* err, size_t err_len) {
  return guarded(err, err_len, [&] {
    auto* g = static_cast<TrlGroup*>(group);
    std::vector<at::Tensor> inputs{*static_cast<at::Tensor*>(input)};
    std::vector<std::vector<at::Tensor>> outs(1);
    outs[0].reserve(static_cast<size_t>(n_outputs));
    for (int i = 0; i < n_outputs; ++i) {
      outs[0].push_back(*static_cast<at::Tensor*>(outputs[i]));
    }
    c10d::AllgatherOptions opts;
    opts.timeout = std::chrono::milliseconds(timeout_ms);
    wait_for(g->pg->allgather(outs, inputs, opts), opts.timeout);
  });
}

int trl_pg_barrier(void* group, int64_t timeout_ms, char* err, size_t err_len) {
  return guarded(err, err_len, [&] {
    auto* g = static_cast<TrlGroup*>(group);
    c10d::BarrierOptions opts;
    opts.timeout = std::chrono::milliseconds(timeout_ms);
    wait_for(g->pg->barrier(opts), opts.timeout);
  });
}

// c10d's monitored barrier: rank 0 waits for every other rank and names the ones that did not
// arrive within the timeout.
int trl_pg_monitored_barrier(void* group, int64_t timeout_ms, int wait_all_ranks, char* err,
                             size_t err_len) {
  return guarded(err, err_len, [&] {
    auto* g = static_cast<TrlGroup*>(group);
    c10d::BarrierOptions opts;
    opts.timeout = std::chrono::milliseconds(timeout_ms);
    g->pg->monitoredBarrier(opts, wait_all_ranks != 0);
  });
}

}  // extern "C"
