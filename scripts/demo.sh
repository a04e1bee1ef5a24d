#!/usr/bin/env bash
# Runs the flagship example (examples/rlhf/: SFT, a reward model from preference pairs, then
# PPO-RLHF against a hydra KL reference) after making sure libtorch is provisioned. Extra
# arguments go to the example (`--out DIR`, `--iterations N`, `--seed S`, `--resume`).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
cargo run --release --example rlhf -- "$@"
