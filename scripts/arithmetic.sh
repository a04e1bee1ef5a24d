#!/usr/bin/env bash
# The command line's worked example (docs/cli.md, README "The command line"): SFT of a tiny
# Llama from scratch on two-digit additions, its accuracy on 200 held-out questions, GRPO with
# the answer as the reward, and the accuracy again. A few minutes on 2 cores.
# Options: OUT=DIR (default target/arith).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
cargo build --release --bin torchrl
OUT="${OUT:-target/arith}"
T=target/release/torchrl
EX=examples/arithmetic
rm -rf "$OUT"
$T sft  --model $EX/model --from-scratch --data $EX/sft.jsonl --config $EX/sft.toml --output "$OUT/sft"
echo "== held-out accuracy after SFT"
$T eval --model "$OUT/sft/model" --data $EX/test.jsonl --config $EX/eval.toml --output "$OUT/eval_sft.jsonl"
$T grpo --model "$OUT/sft/model" --data $EX/grpo.jsonl --config $EX/grpo.toml --output "$OUT/grpo"
echo "== held-out accuracy after GRPO"
$T eval --model "$OUT/grpo/model" --data $EX/test.jsonl --config $EX/eval.toml --output "$OUT/eval_grpo.jsonl"
