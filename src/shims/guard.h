// What every C++ shim (src/modules/llm/nn/mkl_packed.cpp, src/objectives/fused_adam.cpp,
// src/modules/models/tanh.cpp) does around a libtorch call: catch every C++ exception and hand
// its message back through the caller's buffer, so nothing unwinds into Rust.
#pragma once

#include <cstddef>
#include <cstring>
#include <exception>

namespace torchrl_shim {

// Copies `msg` into `err` (at most `len - 1` bytes, NUL-terminated).
inline void set_err(char* err, size_t len, const char* msg) {
  if (err == nullptr || len == 0) return;
  std::strncpy(err, msg, len - 1);
  err[len - 1] = '\0';
}

// Runs `f`, turning any C++ exception into status 1 and its message; 0 on success.
template <typename F>
int guarded(char* err, size_t len, F f) {
  try {
    f();
    return 0;
  } catch (const std::exception& e) {
    set_err(err, len, e.what());
    return 1;
  } catch (...) {
    set_err(err, len, "unknown C++ exception");
    return 1;
  }
}

}  // namespace torchrl_shim
