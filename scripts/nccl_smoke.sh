#!/usr/bin/env bash
# The one-GPU NCCL smoke check (docs/distributed.md, "NCCL"): on a machine with a CUDA device,
# builds with the cargo feature `nccl` and runs tests/distributed.rs's NCCL test, which there
# creates an NCCL group of one on cuda:0, checks all_reduce / broadcast / all_gather / barrier on
# GPU tensors, the refusal of a CPU tensor, and one data-parallel SFT step on the GPU against a
# single-process one. On a machine without a CUDA device the same test checks the refusal.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
cargo test --release --features nccl --test distributed nccl -- --nocapture
