#!/usr/bin/env bash
# The long fuzz campaign (docs/reliability.md, "Fuzz campaign"; fuzz/src/main.rs): every target,
# CASES cases each (default 120,000: with nine targets, over a million), in child processes of a
# release build with overflow checks and debug assertions on. Writes the outcome table to
# REPORT (default fuzz-report.md) and prints every finding as "<target> seed S case I: <class>";
# a finding re-runs alone with
#   fuzz/target/release/torchrl-fuzz case <target> <seed> <index>
# (or through `cargo run --release -- case ...` from fuzz/). Not run by CI (.ci/run runs a smoke
# version in a minute).
#
#   CASES=120000 SEED=1 JOBS=2 SECONDS_LIMIT=3600 scripts/fuzz_long.sh
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh --for fuzz
CASES="${CASES:-120000}"
SEED="${SEED:-1}"
JOBS="${JOBS:-$(nproc)}"
REPORT="${REPORT:-fuzz-report.md}"
TARGETS="${TARGETS:-}"
LIMIT=()
[ -n "${SECONDS_LIMIT:-}" ] && LIMIT=(--seconds "$SECONDS_LIMIT")
SEL=()
[ -n "$TARGETS" ] && SEL=(--targets "$TARGETS")
(cd fuzz && cargo build --release --quiet ${CARGO_TARGET_DIR:+--target-dir "$CARGO_TARGET_DIR"})
BIN="${CARGO_TARGET_DIR:-fuzz/target}/release/torchrl-fuzz"
"$BIN" run --seed "$SEED" --cases "$CASES" --jobs "$JOBS" --batch 2000 --timeout 60 \
  --report "$REPORT" "${LIMIT[@]}" "${SEL[@]}"
