#!/usr/bin/env bash
# Runs the whole test suite (unit, integration, reference-case replay and doc tests; examples
# are built) after making sure libtorch is provisioned. Extra arguments go to `cargo test`.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
cargo test "$@"
