#!/usr/bin/env bash
# The Qwen2.5-0.5B-shape side-by-side (W19 generation, W20 policy + value + reference forward,
# W21 GRPO step, then with LoRA r16 and bf16 the W22 GRPO step and the W28 PPO-RLHF iteration;
# benches/qwen.rs beside benches/python/qwen_baseline.py): each workload in its own process (its
# own peak RSS), the Rust and the Python side alternating, ROUNDS times (default 2). Needs the
# cached Python environment with transformers, trl, peft, datasets and TRL 1.10 for PPO
# (TORCHRL_WITH_PYTHON_REFS=1 ./scripts/setup.sh). About 20 minutes a round on 2 cores, 14 GiB
# of memory at the peak (the GRPO step with a full reference copy and AdamW state).
set -euo pipefail
cd "$(dirname "$0")/.."
TORCHRL_WITH_PYTHON_REFS=1 ./scripts/setup.sh
PY="${TORCHRL_CACHE:-$HOME/.cache/torchrl-rs}/venv/bin/python"
ROUNDS="${ROUNDS:-2}"
cargo bench --no-run --bench qwen 2>/dev/null
BIN=$(ls -t target/release/deps/qwen-* | grep -v '\.d$' | head -1)
# the Python side's JSON line as one `PY <name>\t<ops/s>\t# ...` row
py_row() {
  "$PY" benches/python/qwen_baseline.py "$@" 2>/dev/null | tail -1 | \
    "$PY" -c "import json,sys; r=json.load(sys.stdin); print(f'PY {r[\"name\"]}\t{r[\"ops_per_s\"]:.4f}\t# times {[round(t, 3) for t in r[\"times_s\"]]} peak RSS {r[\"peak_rss_mib\"]:.0f} MiB')"
}
for round in $(seq "$ROUNDS"); do
  echo "# round $round"
  for w in generate forward grpo grpo:2; do
    unfrozen=-1; name="${w%%:*}"; [ "$w" != "$name" ] && unfrozen="${w#*:}"
    TORCHRL_BENCH_QWEN="$name" TORCHRL_BENCH_UNFROZEN="$unfrozen" "$BIN"
    py_row --workload "$name" --unfrozen "$unfrozen"
  done
  for name in grpo ppo; do
    TORCHRL_BENCH_QWEN="$name" TORCHRL_BENCH_LORA=16 TORCHRL_BENCH_BF16=1 "$BIN"
    py_row --workload "$name" --lora 16 --bf16
  done
done
