#!/usr/bin/env bash
# Runs the flagship example after making sure libtorch is provisioned.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
cargo run --release --example flagship "$@"
