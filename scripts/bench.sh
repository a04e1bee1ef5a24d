#!/usr/bin/env bash
# Side-by-side benchmark: runs the Rust benches and the Python baselines (TorchRL, transformers) in
# one go and prints a table of ops/s and ratios (Rust / Python). Needs the cached Python
# environment with torchrl and transformers (scripts/setup.sh with TORCHRL_WITH_PYTHON_REFS=1
# installs them).
set -euo pipefail
cd "$(dirname "$0")/.."
TORCHRL_WITH_PYTHON_REFS=1 ./scripts/setup.sh
PY="${TORCHRL_CACHE:-$HOME/.cache/torchrl-rs}/venv/bin/python"
rust_out=$(mktemp); py_out=$(mktemp)
trap 'rm -f "$rust_out" "$py_out"' EXIT
for b in $(ls benches/*.rs | xargs -n1 basename | sed 's/\.rs$//' | grep -vxE 'distributed|qwen'); do
  cargo bench --quiet --bench "$b" 2>/dev/null | grep -P '^W\w+\t' >> "$rust_out"
done
"$PY" benches/python/torchrl_baseline.py > "$py_out"
"$PY" benches/python/gpt2_baseline.py 2>/dev/null >> "$py_out"
"$PY" benches/python/ilql_baseline.py 2>/dev/null | grep -P '^W\w+\t' >> "$py_out"
# W11 / W12: a PPO-RLHF iteration against TRL 1.10's PPOTrainer (JSON -> the same tab format).
for cfg in flagship:W11_ppo_rlhf_iteration_flagship small:W12_ppo_rlhf_iteration_gpt2_small; do
  OMP_NUM_THREADS=1 "$PY" benches/python/rlhf_baseline.py --config "${cfg%%:*}" 2>/dev/null | tail -1 | \
    "$PY" -c "import json,sys; r=json.load(sys.stdin); print(f'${cfg#*:}\t{1/r[\"iteration_s_best\"]:.4f}\t# peak RSS {r[\"peak_rss_mib\"]:.0f} MiB')" >> "$py_out"
done
# W15 / W16: a GRPO / DPO optimizer step against TRL 1.16's GRPOTrainer / DPOTrainer (JSON -> tab lines),
# both training the same parameters (the top block and the final norm; TRL keeps its full reference copy).
for cfg in grpo:W15_grpo_step_flagship dpo:W16_dpo_step_flagship; do
  OMP_NUM_THREADS=1 "$PY" benches/python/grpo_dpo_baseline.py --workload "${cfg%%:*}" --unfrozen 1 2>/dev/null | tail -1 | \
    "$PY" -c "import json,sys; r=json.load(sys.stdin); print(f'${cfg#*:}\t{1/r[\"step_s_best\"]:.4f}\t# median {r[\"step_s_median\"]:.4f} s/step')" >> "$py_out"
done
# W23: 100k conversations read and tokenized through the chat template (the file benches/data.rs wrote),
# against datasets + transformers' batched apply_chat_template.
"$PY" benches/python/chat_baseline.py target/bench_data/conversations.jsonl specs/chat/chatml_qwen --batched 2>/dev/null | grep -P '^W\w+\t' >> "$py_out"
# W17: all_reduce(sum) between 2 processes on loopback, the Rust ProcessGroup against torch.distributed,
# both on libtorch's c10d Gloo; W18: a data-parallel PPO-RLHF iteration on 1 vs 2 processes at a fixed
# global batch (Rust only). The bench needs the `distributed` feature, so it is run here, not above.
cargo bench --quiet --features distributed --bench distributed 2>/dev/null | grep -P '^W\w+\t' >> "$rust_out"
"$PY" benches/python/allreduce_baseline.py 2>/dev/null | grep -P '^W\w+\t' >> "$py_out"
# W24-W26 (SAC / DQN updates, prioritized replay of 1M entries) ran above with the other benches;
# their TorchRL half, and W27: SAC on Pendulum until the deterministic mean return reaches -200
# (the example with --target-return; its "reached after F frames, S s" line -> 1/S).
"$PY" benches/python/offpolicy_baseline.py 2>/dev/null | grep -P '^W\w+\t' >> "$py_out"
cargo run --quiet --release --example sac_pendulum -- --target-return -200 --quiet 2>/dev/null | \
  "$PY" -c "import re,sys; m=re.search(r'reached after (\d+) frames, ([0-9.]+)s', sys.stdin.read()); print(f'W27_sac_pendulum_to_m200\t{1/float(m.group(2)):.4f}\t# {m.group(2)} s, {m.group(1)} frames' if m else 'W27_sac_pendulum_to_m200\t0\t# -200 not reached')" >> "$rust_out"
# A row `<name>_floor` from a Rust bench is the kernel floor of `<name>`: the same libtorch ops on
# the same shapes from a bare loop (benches/common/bare_*.rs). It is shown as two columns of its
# row: ours / floor and peer / floor, both as time ratios (1.00 = at the floor).
printf '%-34s %14s %14s %9s %14s %11s %11s\n' workload "rust ops/s" "peer ops/s" ratio "floor ops/s" "ours/floor" "peer/floor"
while IFS=$'\t' read -r name rust; do
  case "$name" in *_floor) continue ;; esac
  py=$(awk -F'\t' -v n="$name" '$1==n {print $2}' "$py_out")
  floor=$(awk -F'\t' -v n="${name}_floor" '$1==n {print $2}' "$rust_out")
  if [ -n "$py" ]; then
    ratio=$(awk -v a="$rust" -v b="$py" 'BEGIN {printf "%.1fx", a/b}')
  else
    py="-"; ratio="-"
  fi
  if [ -n "$floor" ]; then
    ours_floor=$(awk -v f="$floor" -v a="$rust" 'BEGIN {printf "%.2f", f/a}')
    peer_floor=$([ "$py" = "-" ] && echo "-" || awk -v f="$floor" -v b="$py" 'BEGIN {printf "%.2f", f/b}')
  else
    floor="-"; ours_floor="-"; peer_floor="-"
  fi
  printf '%-34s %14s %14s %9s %14s %11s %11s\n' "$name" "$rust" "$py" "$ratio" "$floor" "$ours_floor" "$peer_floor"
done < "$rust_out"
