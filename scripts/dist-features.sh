#!/usr/bin/env bash
# Prints the cargo feature the test suite and CI build the multi-process code with: `nccl` (the
# distributed feature plus c10d's NCCL path) when libtorch is a CUDA build and the CUDA headers
# scripts/setup.sh installs are present, else `distributed` (Gloo only). Run after setup.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
LIB=$(sed -n 's/^LIBTORCH = "\(.*\)"$/\1/p' .cargo/config.toml 2>/dev/null || true)
if [ -n "$LIB" ] && [ -e "$LIB/lib/libtorch_cuda.so" ] && \
   ls "$LIB"/../nvidia/*/include/crt/host_config.h >/dev/null 2>&1 && \
   ls "$LIB"/../nvidia/*/include/nccl.h >/dev/null 2>&1; then
  echo nccl
else
  echo distributed
fi
