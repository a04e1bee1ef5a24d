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
