// float32 tanh on CPUs with AVX2 and FMA, as an autograd function whose backward is libtorch's
// own `tanh_backward` (so gradients are formed exactly as for `at::tanh`, from the output).
// See src/modules/models/tanh.rs (`modules::models::tanh`, used by `Activation::Tanh`).
//
// Why: libtorch's CPU `tanh` calls MKL's `vsTanh`, which on AMD CPUs runs at 3.7-4.0 ns an
// element (2-core AMD EPYC, Zen 2), 13 % of a SAC-on-Pendulum run whose MLPs use Tanh, TorchRL's
// default activation. This kernel runs at about 1.05 ns an element there and is within 1 ulp of
// the correctly rounded result on every float32 input (tests/tanh.rs and the unit tests).
//
// The method, 8 lanes at a time, on a = |x| with the sign put back at the end:
// - a < 0.9: a + a^3 P(a^2), P a degree-6 polynomial fitted to (tanh(a) - a) / a^3 on
//   Chebyshev nodes of [0, 0.9] with relative weights (max relative error 1.1e-9);
// - a >= 0.9: 1 - 2 / (exp(2a) + 1), exp by Cody-Waite reduction to |r| <= ln(2)/2 and its
//   Taylor polynomial to r^7, a clamped to 10 (tanh(10) rounds to 1.0f); NaN propagates.
//
// Other tensors (not float32, not contiguous, not on the CPU, or a CPU without AVX2 / FMA) go
// to `at::tanh`; tanh.rs also leaves Intel CPUs to MKL unless asked (TORCHRL_TANH_KERNEL=1). Entry points catch every C++ exception and return 1 with the message in `err`.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>

#include "../../shims/guard.h"

#include <immintrin.h>

#include <cstdint>

namespace {

using torchrl_shim::guarded;

__attribute__((target("avx2,fma"))) inline __m256 tanh8(__m256 v) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256 one = _mm256_set1_ps(1.0f);
  __m256 sg = _mm256_and_ps(v, sign);
  __m256 a = _mm256_andnot_ps(sign, v);
  // a >= 0.9: 1 - 2 / (exp(2a) + 1); min(10, NaN) is NaN (the second operand)
  __m256 z = _mm256_mul_ps(_mm256_min_ps(_mm256_set1_ps(10.0f), a), _mm256_set1_ps(2.0f));
  const __m256 magic = _mm256_set1_ps(12582912.0f);  // 1.5 * 2^23: rounds to an integer
  __m256 t = _mm256_fmadd_ps(z, _mm256_set1_ps(1.44269504088896341f), magic);
  __m256 k = _mm256_sub_ps(t, magic);
  __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693359375f), z);  // ln 2, high part
  r = _mm256_fnmadd_ps(k, _mm256_set1_ps(-2.12194440e-4f), r);      // ln 2, low part
  __m256 r2 = _mm256_mul_ps(r, r);
  __m256 r4 = _mm256_mul_ps(r2, r2);
  __m256 c01 = _mm256_fmadd_ps(r, one, one);
  __m256 c23 = _mm256_fmadd_ps(r, _mm256_set1_ps(1.0f / 6.0f), _mm256_set1_ps(0.5f));
  __m256 c45 = _mm256_fmadd_ps(r, _mm256_set1_ps(1.0f / 120.0f), _mm256_set1_ps(1.0f / 24.0f));
  __m256 c67 = _mm256_fmadd_ps(r, _mm256_set1_ps(1.0f / 5040.0f), _mm256_set1_ps(1.0f / 720.0f));
  __m256 p = _mm256_fmadd_ps(r4, _mm256_fmadd_ps(r2, c67, c45), _mm256_fmadd_ps(r2, c23, c01));
  __m256i bits = _mm256_sub_epi32(_mm256_castps_si256(t), _mm256_castps_si256(magic));
  bits = _mm256_slli_epi32(_mm256_add_epi32(bits, _mm256_set1_epi32(127)), 23);  // 2^k
  __m256 e = _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
  __m256 big = _mm256_sub_ps(one, _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(e, one)));
  // a < 0.9: a + a^3 P(a^2)
  __m256 a2 = _mm256_mul_ps(a, a);
  __m256 q = _mm256_fmadd_ps(a2, _mm256_set1_ps(-0.0004571490975199474f),
                             _mm256_set1_ps(0.0025877210465798314f));
  q = _mm256_fmadd_ps(q, a2, _mm256_set1_ps(-0.008270527810932057f));
  q = _mm256_fmadd_ps(q, a2, _mm256_set1_ps(0.021667086180454244f));
  q = _mm256_fmadd_ps(q, a2, _mm256_set1_ps(-0.05393038737052358f));
  q = _mm256_fmadd_ps(q, a2, _mm256_set1_ps(0.13332994096846884f));
  q = _mm256_fmadd_ps(q, a2, _mm256_set1_ps(-0.33333323077672267f));
  __m256 small = _mm256_fmadd_ps(_mm256_mul_ps(q, a2), a, a);
  __m256 m = _mm256_cmp_ps(a, _mm256_set1_ps(0.9f), _CMP_LT_OQ);
  return _mm256_or_ps(_mm256_blendv_ps(big, small, m), sg);
}

// y[i] = tanh(x[i]) for i < n; four vectors a step so that their dependency chains overlap.
__attribute__((target("avx2,fma"))) void tanh_avx2(const float* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m256 a = tanh8(_mm256_loadu_ps(x + i));
    __m256 b = tanh8(_mm256_loadu_ps(x + i + 8));
    __m256 c = tanh8(_mm256_loadu_ps(x + i + 16));
    __m256 d = tanh8(_mm256_loadu_ps(x + i + 24));
    _mm256_storeu_ps(y + i, a);
    _mm256_storeu_ps(y + i + 8, b);
    _mm256_storeu_ps(y + i + 16, c);
    _mm256_storeu_ps(y + i + 24, d);
  }
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, tanh8(_mm256_loadu_ps(x + i)));
  if (i < n) {
    alignas(32) float bx[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    alignas(32) float by[8];
    for (int64_t j = i; j < n; ++j) bx[j - i] = x[j];
    _mm256_store_ps(by, tanh8(_mm256_load_ps(bx)));
    for (int64_t j = i; j < n; ++j) y[j] = by[j - i];
  }
}

bool cpu_has_avx2_fma() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  }();
  return has;
}

bool uses_kernel(const at::Tensor& x) {
  return cpu_has_avx2_fma() && x.device().is_cpu() && x.scalar_type() == at::kFloat &&
         x.layout() == at::kStrided && x.is_contiguous() && !x.is_neg() && !x.is_conj();
}

// The kernel over a contiguous float32 CPU tensor (no autograd), split like ATen's unary ops.
at::Tensor tanh_values(const at::Tensor& x) {
  at::Tensor y = at::empty_like(x, at::MemoryFormat::Contiguous);
  const float* src = x.const_data_ptr<float>();
  float* dst = y.mutable_data_ptr<float>();
  at::parallel_for(0, x.numel(), 32768, [&](int64_t begin, int64_t end) {
    tanh_avx2(src + begin, dst + begin, end - begin);
  });
  return y;
}

struct TanhFn : public torch::autograd::Function<TanhFn> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x) {
    at::Tensor y = tanh_values(x);
    ctx->save_for_backward({y});
    return y;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    at::Tensor y = ctx->get_saved_variables()[0];
    return {at::tanh_backward(grads[0], y)};
  }
};

}  // namespace

extern "C" {

// 0 where the kernel cannot run on this CPU (no AVX2 or FMA), 2 where it can and the CPU is
// Intel's (where MKL takes its own optimized code paths), 1 where it can on another vendor's.
int trl_tanh_kernel_cpu() {
  if (!cpu_has_avx2_fma()) return 0;
  return __builtin_cpu_is("intel") ? 2 : 1;
}

// `*out` = tanh(x), a new heap tensor: with `kernel` 1, the kernel for a contiguous float32 CPU
// tensor on a CPU that can run it (through the autograd function when grad mode is on and x
// requires grad); `at::tanh` otherwise.
int trl_tanh(void* x, int kernel, void** out, char* err, size_t len) {
  return guarded(err, len, [&] {
    const at::Tensor& t = *static_cast<at::Tensor*>(x);
    at::Tensor y;
    if (kernel == 0 || !uses_kernel(t)) {
      y = at::tanh(t);
    } else if (t.requires_grad() && at::GradMode::is_enabled()) {
      y = TanhFn::apply(t);
    } else {
      y = tanh_values(t);
    }
    *out = new at::Tensor(std::move(y));
  });
}

}  // extern "C"
