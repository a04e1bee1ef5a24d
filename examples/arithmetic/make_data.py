#!/usr/bin/env python3
"""Writes the worked example of the `torchrl` CLI (README, "The command line"): two-digit
additions with checkable answers, and the folder of a tiny Llama with a character tokenizer.

Standard library only; seeded, so the files are the same on every run. Run from anywhere:
`python3 examples/arithmetic/make_data.py`.

- `sft.jsonl`: 3000 prompt-completion examples (`{"prompt": "12+35=", "completion": "47"}`);
- `grpo.jsonl`: 1000 prompt-only examples with an `answer` column, for GRPO's reward;
- `test.jsonl`: 200 held-out questions (no pair of numbers in it appears in the other two);
- `model/config.json` (a 2-block, 64-wide Llama; the CLI's `--from-scratch` builds it with
  random weights) and `model/tokenizer.json` (one token per character).
"""

import json
import os
import random

HERE = os.path.dirname(os.path.abspath(__file__))
MAX = 50  # operands in [0, 50)


def write_jsonl(name, rows):
    with open(os.path.join(HERE, name), "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def main():
    rng = random.Random(2026)
    pairs = [(a, b) for a in range(MAX) for b in range(MAX)]
    rng.shuffle(pairs)
    test, rest = pairs[:200], pairs[200:]
    sft = [rng.choice(rest) for _ in range(3000)]
    grpo = [rng.choice(rest) for _ in range(1000)]
    write_jsonl("sft.jsonl", [{"prompt": f"{a}+{b}=", "completion": str(a + b)} for a, b in sft])
    write_jsonl("grpo.jsonl", [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a, b in grpo])
    write_jsonl("test.jsonl", [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a, b in test])

    specials = ["<pad>", "<eos>", "<unk>"]
    chars = list("0123456789+=")
    vocab = {t: i for i, t in enumerate(specials + chars)}
    added = [
        {"id": vocab[t], "content": t, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True}
        for t in specials
    ]
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "."}, "behavior": "Isolated",
                          "invert": False},
        "post_processor": None,
        "decoder": {"type": "Fuse"},
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"},
    }
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": len(vocab),
        "hidden_size": 64,
        "intermediate_size": 176,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 16,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": True,
        "initializer_range": 0.02,
        "eos_token_id": vocab["<eos>"],
        "pad_token_id": vocab["<pad>"],
        "torch_dtype": "float32",
    }
    os.makedirs(os.path.join(HERE, "model"), exist_ok=True)
    with open(os.path.join(HERE, "model", "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer, f, indent=1)
        f.write("\n")
    with open(os.path.join(HERE, "model", "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
