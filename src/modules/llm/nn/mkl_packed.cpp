// The C ABI over libtorch's MKL packed-weight linear (`mkl::_mkl_reorder_linear_weight`,
// `mkl::_mkl_linear`): the ops PyTorch's CPU inference freezing uses, registered in
// libtorch_cpu but not in the generated ATen API that tch binds, so they are reached through
// the dispatcher by name. See src/modules/llm/nn/packed.rs.
//
// Tensors cross as `at::Tensor*` (torch-sys's `C_tensor`); a result is a new heap tensor the
// Rust side owns. Every entry point catches C++ exceptions and returns 1 with the message in
// `err` (truncated to `len`), 0 on success.
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include "../../../shims/guard.h"

#include <cstring>
#include <exception>
#include <optional>
#include <string>

namespace {

using torchrl_shim::guarded;

using ReorderFn = at::Tensor(const at::Tensor&, int64_t);
using LinearFn = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                            const std::optional<at::Tensor>&, int64_t);

bool has_cpu_kernel(const char* name) {
  auto op = c10::Dispatcher::singleton().findOp(c10::OperatorName(name, ""));
  return op.has_value() && op->hasKernelForDispatchKey(c10::DispatchKey::CPU);
}

}  // namespace

extern "C" {

// 1 when this libtorch has both ops with a CPU kernel (an MKL build), else 0.
int trl_mkl_packed_available() {
  try {
    return has_cpu_kernel("mkl::_mkl_reorder_linear_weight") && has_cpu_kernel("mkl::_mkl_linear")
               ? 1
               : 0;
  } catch (...) {
    return 0;
  }
}

// Packs `weight` ([out, in], float32, CPU) for products with `batch` rows into *out.
int trl_mkl_pack(void* weight, int64_t batch, void** out, char* err, size_t len) {
  return guarded(err, len, [&] {
    static auto op = c10::Dispatcher::singleton()
                         .findSchemaOrThrow("mkl::_mkl_reorder_linear_weight", "")
                         .typed<ReorderFn>();
    at::Tensor packed = op.call(*static_cast<at::Tensor*>(weight), batch);
    *out = new at::Tensor(std::move(packed));
  });
}

// x · weightᵀ (+ bias) through the packed weight when x has `batch` rows (the op falls back to
// the plain product with `weight` otherwise). `bias` may be null.
int trl_mkl_linear(void* x, void* packed, void* weight, void* bias, int64_t batch, void** out,
                   char* err, size_t len) {
  return guarded(err, len, [&] {
    static auto op =
        c10::Dispatcher::singleton().findSchemaOrThrow("mkl::_mkl_linear", "").typed<LinearFn>();
    std::optional<at::Tensor> b;
    if (bias != nullptr) b = *static_cast<at::Tensor*>(bias);
    at::Tensor y = op.call(*static_cast<at::Tensor*>(x), *static_cast<at::Tensor*>(packed),
                           *static_cast<at::Tensor*>(weight), b, batch);
    *out = new at::Tensor(std::move(y));
  });
}

// The version counter of `t` (bumped by every in-place write to its storage), or -1 when it
// has none (an inference tensor) or reading it fails.
int64_t trl_tensor_version(void* t) {
  try {
    return static_cast<int64_t>(static_cast<at::Tensor*>(t)->_version());
  } catch (...) {
    return -1;
  }
}

}  // extern "C"
