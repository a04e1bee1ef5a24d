// The C ABI over libtorch's fused Adam and AdamW steps (`aten::_fused_adam_` /
// `aten::_fused_adamw_`, what `torch.optim.Adam(fused=True)` / `AdamW(fused=True)` call; the
// CPU kernel updates every parameter in one pass) and the `_foreach_` ops around them, reached
// through the dispatcher by name (tch's generated API does not bind tensor-list ops). See
// src/objectives/fused_adam.rs (FusedAdam, and the trainers' AdamW with `fused`).
//
// Tensors cross as arrays of `at::Tensor*` (torch-sys's `C_tensor`). Every entry point catches
// C++ exceptions and returns 1 with the message in `err` (truncated to `len`), 0 on success.
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include "../shims/guard.h"

#include <cstring>
#include <exception>
#include <optional>
#include <vector>

namespace {

using torchrl_shim::guarded;

std::vector<at::Tensor> tensors(void** p, size_t n) {
  std::vector<at::Tensor> v;
  v.reserve(n);
  for (size_t i = 0; i < n; ++i) v.push_back(*static_cast<at::Tensor*>(p[i]));
  return v;
}

using FusedAdamFn = void(at::TensorList, at::TensorList, at::TensorList, at::TensorList,
                         at::TensorList, at::TensorList, double, double, double, double, double,
                         bool, bool, const std::optional<at::Tensor>&,
                         const std::optional<at::Tensor>&);
using ForeachAddScalarFn = void(at::TensorList, const at::Scalar&);
using ForeachZeroFn = void(at::TensorList);

}  // namespace

extern "C" {

// One Adam step (no amsgrad) over `n` parameters through `aten::_fused_adam_` (`decoupled` 0:
// L2 weight decay added to the gradient) or `aten::_fused_adamw_` (`decoupled` 1: AdamW's
// decay of the weights), updating `params`, `exp_avgs` and `exp_avg_sqs` in place from `grads`.
// `steps` are float32 scalars holding each parameter's step count: with `increment` 1 they are
// incremented first (`_foreach_add_`), as torch.optim does; with 0 they already hold this
// step's count.
int trl_fused_adam(void** params, void** grads, void** exp_avgs, void** exp_avg_sqs,
                   void** steps, size_t n, double lr, double beta1, double beta2,
                   double weight_decay, double eps, int decoupled, int increment, char* err,
                   size_t len) {
  return guarded(err, len, [&] {
    static auto add = c10::Dispatcher::singleton()
                          .findSchemaOrThrow("aten::_foreach_add_", "Scalar")
                          .typed<ForeachAddScalarFn>();
    static auto adam = c10::Dispatcher::singleton()
                           .findSchemaOrThrow("aten::_fused_adam_", "")
                           .typed<FusedAdamFn>();
    static auto adamw = c10::Dispatcher::singleton()
                            .findSchemaOrThrow("aten::_fused_adamw_", "")
                            .typed<FusedAdamFn>();
    auto s = tensors(steps, n);
    if (increment != 0) add.call(s, at::Scalar(1.0));
    std::vector<at::Tensor> none;
    auto& op = decoupled != 0 ? adamw : adam;
    op.call(tensors(params, n), tensors(grads, n), tensors(exp_avgs, n),
            tensors(exp_avg_sqs, n), none, s, lr, beta1, beta2, weight_decay, eps, false, false,
            std::nullopt, std::nullopt);
  });
}

// Zeroes `n` tensors in place (`aten::_foreach_zero_`).
int trl_foreach_zero(void** ts, size_t n, char* err, size_t len) {
  return guarded(err, len, [&] {
    static auto zero = c10::Dispatcher::singleton()
                           .findSchemaOrThrow("aten::_foreach_zero_", "")
                           .typed<ForeachZeroFn>();
    zero.call(tensors(ts, n));
  });
}

}  // extern "C"
