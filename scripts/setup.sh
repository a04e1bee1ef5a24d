#!/usr/bin/env bash
# Provisions libtorch (the PyPI wheel torch==2.13.0, which tch 0.26 expects) into a cached Python
# environment outside the clone, and points cargo at it through .cargo/config.toml.
# Idempotent: a present, version-checked environment is reused.
# `scripts/setup.sh --for DIR` also writes DIR/.cargo/config.toml: a crate of yours that depends
# on torchrl then builds with plain `cargo build` / `cargo run` (README, "Depending on torchrl").
# It installs gymnasium and MuJoCo for the `gym` feature's tests. With TORCHRL_WITH_PYTHON_REFS=1
# it also installs torchrl/tensordict and transformers / tokenizers, trl and peft (for
# specs/record*.py, the Python half of the benchmarks, and tests/transformers_loads.rs, which only
# the cargo feature `python-refs` builds; .ci/run sets it).
set -euo pipefail
FOR_DIRS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --for) [ $# -ge 2 ] || { echo "[setup] --for needs a folder" >&2; exit 2; }
           FOR_DIRS+=("$(cd "$2" && pwd)") || { echo "[setup] --for $2: no such folder" >&2; exit 2; }
           shift 2 ;;
    *) echo "[setup] unknown argument $1 (usage: scripts/setup.sh [--for DIR]...)" >&2; exit 2 ;;
  esac
done
cd "$(dirname "$0")/.."
CACHE="${TORCHRL_CACHE:-$HOME/.cache/torchrl-rs}"
VENV="$CACHE/venv"
PY="$VENV/bin/python"
TORCH_VERSION="2.13.0"
mkdir -p "$CACHE"
have_torch() { "$PY" -c "import torch,sys; sys.exit(0 if torch.__version__.split('+')[0]=='$TORCH_VERSION' else 1)" 2>/dev/null; }
if ! have_torch; then
  echo "[setup] installing torch==$TORCH_VERSION into $VENV (about 1.5 minutes, 4.7 GB)" >&2
  [ -x "$PY" ] || python3 -m venv "$VENV"
  "$PY" -m pip install -q --disable-pip-version-check "torch==$TORCH_VERSION"
  have_torch || { echo "[setup] torch $TORCH_VERSION did not install correctly" >&2; exit 1; }
fi
# gymnasium and MuJoCo (about 70 MB) for the cargo feature `gym` (`GymEnv`), whose tests
# scripts/test.sh runs when they import; a failed install only warns (those tests are then skipped,
# saying so, and the rest of the suite does not need Python).
"$PY" -c "import gymnasium, mujoco, imageio" 2>/dev/null || \
  "$PY" -m pip install -q --disable-pip-version-check gymnasium mujoco imageio >&2 || \
  echo "[setup] warning: could not install gymnasium / mujoco; the gym feature's tests will be skipped" >&2
if [ "${TORCHRL_WITH_PYTHON_REFS:-0}" = "1" ]; then
  "$PY" -c "import torchrl, tensordict, gymnasium, transformers, tokenizers" 2>/dev/null || \
    "$PY" -m pip install -q --disable-pip-version-check torchrl==0.14.1 tensordict gymnasium numpy \
      transformers==5.24.0 tokenizers safetensors
  # TRL for the recorded RLHF cases (trl 1.16) and, in a folder of its own, TRL 1.10: the last
  # release that ships PPOTrainer, the baseline of benches/python/rlhf_baseline.py.
  "$PY" -c "import trl, accelerate, datasets, peft" 2>/dev/null || \
    "$PY" -m pip install -q --disable-pip-version-check trl==1.16.0 accelerate datasets peft==0.21.2
  [ -d "$CACHE/trl110/trl/experimental/ppo" ] || \
    "$PY" -m pip install -q --disable-pip-version-check --no-deps --target "$CACHE/trl110" trl==1.10.0
fi
# The gloo headers that c10d's ProcessGroupGloo.hpp includes (the wheel ships c10d's headers but
# not gloo's): Debian's libgloo-dev, for the cargo feature `distributed` (docs/distributed.md).
# TORCHRL_GLOO_INCLUDE=<folder holding gloo/> skips this. Without apt-get it only warns: the
# default build does not need it, and `--features distributed` then fails naming what is missing.
if [ ! -d /usr/include/gloo ] && [ -z "${TORCHRL_GLOO_INCLUDE:-}" ]; then
  SUDO=""
  if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then SUDO="sudo"; fi
  if command -v apt-get >/dev/null 2>&1; then
    echo "[setup] installing libgloo-dev (gloo headers for the distributed feature)" >&2
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get install -y -q libgloo-dev >/dev/null 2>&1 || {
      $SUDO apt-get update -q >/dev/null 2>&1 || true
      $SUDO apt-get install -y -q libgloo-dev >/dev/null 2>&1
    } || echo "[setup] warning: could not install libgloo-dev; --features distributed will not build" >&2
  else
    echo "[setup] warning: no apt-get; install gloo's headers (Debian: libgloo-dev) for --features distributed" >&2
  fi
fi
TORCH_DIR=$("$PY" -c "import torch,os;print(os.path.dirname(torch.__file__))" 2>/dev/null)
# The CUDA headers c10d's ProcessGroupNCCL.hpp needs beyond the wheel's nvidia-* packages (CUDA's
# crt/ and nv/ headers: nvidia-cuda-crt and nvidia-cuda-cccl, ~3 MB, of the wheel's CUDA
# version), for the cargo feature `nccl`. A CPU-only libtorch skips this; a failed install only
# warns (the feature then fails to build, naming the missing header).
if [ -e "$TORCH_DIR/lib/libtorch_cuda.so" ] && \
   ! ls "$TORCH_DIR"/../nvidia/*/include/crt/host_config.h >/dev/null 2>&1; then
  CUDA_MM=$("$PY" -c "import torch;print(torch.version.cuda or '')" 2>/dev/null)
  if [ -n "$CUDA_MM" ]; then
    echo "[setup] installing CUDA $CUDA_MM headers (nvidia-cuda-crt, nvidia-cuda-cccl) for --features nccl" >&2
    "$PY" -m pip install -q --disable-pip-version-check --no-deps \
      "nvidia-cuda-crt==$CUDA_MM.*" "nvidia-cuda-cccl==$CUDA_MM.*" || \
      echo "[setup] warning: could not install the CUDA headers; --features nccl will not build" >&2
  fi
fi
for dir in . "${FOR_DIRS[@]}"; do
  mkdir -p "$dir/.cargo"
  cat > "$dir/.cargo/config.toml" <<CFG
# Written by torchrl's scripts/setup.sh: where libtorch lives on this machine. Not committed.
[env]
LIBTORCH = "$TORCH_DIR"
LIBTORCH_CXX11_ABI = "1"
CFG
done
