#!/usr/bin/env bash
# Runs the whole test suite (unit, integration, reference-case replay and doc tests; examples
# are built) after making sure libtorch is provisioned. Extra arguments go to `cargo test`.
# The suite is built once, with the `distributed` feature, so that the two-process c10d tests
# (tests/distributed.rs, on loopback) run with everything else; with `nccl` (which includes it)
# when libtorch is a CUDA build, so that c10d's NCCL path is compiled and checked too
# (scripts/dist-features.sh decides).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
cargo test --features "$(./scripts/dist-features.sh)" "$@"
# GymEnv (cargo feature `gym`, tests/gym.rs, a MuJoCo task included): built against the cached
# environment's Python, where setup.sh installed gymnasium and it has a shared libpython (pyo3
# embeds it); otherwise skipped, saying why.
PY="${TORCHRL_CACHE:-$HOME/.cache/torchrl-rs}/venv/bin/python"
if "$PY" -c "import gymnasium, sysconfig, sys; sys.exit(0 if sysconfig.get_config_var('Py_ENABLE_SHARED') else 1)" 2>/dev/null; then
  PYO3_PYTHON="$PY" cargo test --features "$(./scripts/dist-features.sh),gym" --test gym "$@"
else
  echo "[test] skipped tests/gym.rs: $PY lacks gymnasium or a shared libpython (scripts/setup.sh installs gymnasium)" >&2
fi
# `transformers` and PEFT load what we save (cargo feature `python-refs`,
# tests/transformers_loads.rs): where the cached environment has them (scripts/setup.sh with
# TORCHRL_WITH_PYTHON_REFS=1, which .ci/run uses); otherwise skipped, saying why.
if "$PY" -c "import transformers, peft, safetensors" 2>/dev/null; then
  TORCHRL_PYTHON="$PY" cargo test --features "$(./scripts/dist-features.sh),python-refs" \
    --test transformers_loads "$@"
else
  echo "[test] skipped tests/transformers_loads.rs: $PY lacks transformers / peft (scripts/setup.sh with TORCHRL_WITH_PYTHON_REFS=1 installs them)" >&2
fi
