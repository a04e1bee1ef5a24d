#!/usr/bin/env python
"""Record GPT-2 fidelity cases from Hugging Face `transformers` (and a tokenizer from `tokenizers`).

Run from the repository root:

    /root/.cache/torchrl-rs/venv/bin/python specs/record_gpt2.py

It writes, for each model below, ``specs/gpt2/<name>/config.json`` and
``specs/gpt2/<name>/model.safetensors`` (saved by ``save_pretrained``: the real Hugging Face
layout and parameter names, GPT-2's ``Conv1D`` weights as ``[in, out]``), plus
``specs/gpt2_cases.json`` with, per model:

- ``logits_plain``: logits ``[B, T, V]`` for fixed ``input_ids`` (no padding);
- ``logits_left_pad``: logits for a left-padded batch, with ``attention_mask`` and the position
  ids ``transformers``' ``generate`` uses (``cumsum(mask) - 1``, pads set to 1); only positions
  where the mask is 1 are meaningful (Rust compares those);
- ``greedy``: ``generate(do_sample=False)`` tokens for left-padded prompts;
- ``greedy_eos``: the same with an EOS id (the token row 0 emits at step 2, so that row stops
  early and is padded with the pad id) and ``min_new_tokens=0``;
- ``greedy_eos_min``: the same EOS with ``min_new_tokens=6`` (EOS is suppressed for 6 tokens).

Models are random-init (``torch.manual_seed``) with ``initializer_range=0.1`` so that greedy
choices are well separated; the script asserts that every greedy step's top-1 / top-2 logit
margin is at least 2e-3, so that a float32 port within 1e-4 must pick the same tokens.

It also trains a small byte-level BPE tokenizer (deterministic) on a fixed corpus, saves it as
``specs/tokenizer/tokenizer.json`` and records the ids of a few strings (and their decoding)
into ``specs/tokenizer_cases.json``.

Finally ``specs/gpt2/score_v90/`` holds a ``GPT2ForSequenceClassification(num_labels=1)`` reward
model, with its scores for a right-padded and a left-padded batch (``score``: read at each
row's last non-pad token; pad id 0 never occurs inside a row).
"""

import json
import os
import sys

import torch
import transformers
from transformers import GPT2Config, GPT2LMHeadModel

ROOT = os.path.dirname(os.path.abspath(__file__))

MODELS = {
    # vocab not a multiple of 8, default activation (gelu_new), 2 layers
    "tiny_v101": dict(vocab_size=101, n_positions=32, n_embd=32, n_layer=2, n_head=4,
                      activation_function="gelu_new", layer_norm_epsilon=1e-5, seed=0),
    # exact-erf gelu, non-default inner width and epsilon, 3 layers, 2 heads
    "small_v64_gelu": dict(vocab_size=64, n_positions=48, n_embd=24, n_layer=3, n_head=2,
                           n_inner=80, activation_function="gelu", layer_norm_epsilon=1e-6,
                           seed=1),
}

PAD = 0


def tensor_json(t):
    t = t.detach().cpu()
    dtype = {torch.float32: "float32", torch.int64: "int64", torch.bool: "bool"}[t.dtype]
    data = t.reshape(-1).tolist()
    return {"shape": list(t.shape), "dtype": dtype, "data": data}


def position_ids_for(mask):
    pos = mask.long().cumsum(-1) - 1
    return pos.masked_fill(mask == 0, 1)


def check_margins(model, prompt, mask, out_tokens, n_prompt):
    """Asserts that each greedy choice beats the runner-up by at least 2e-3."""
    with torch.no_grad():
        seq = out_tokens
        full_mask = torch.cat(
            [mask, torch.ones(seq.shape[0], seq.shape[1] - n_prompt, dtype=mask.dtype)], dim=1)
        logits = model(input_ids=seq, attention_mask=full_mask,
                       position_ids=position_ids_for(full_mask)).logits
        for step in range(seq.shape[1] - n_prompt):
            row_logits = logits[:, n_prompt - 1 + step]
            top2 = row_logits.topk(2, dim=-1).values
            margin = (top2[:, 0] - top2[:, 1]).min().item()
            if margin < 2e-3:
                sys.exit(f"greedy margin {margin} too small at step {step}; change the seed")


def record_model(name, spec):
    spec = dict(spec)
    seed = spec.pop("seed")
    torch.manual_seed(seed)
    cfg = GPT2Config(initializer_range=0.1, bos_token_id=1, eos_token_id=2, pad_token_id=PAD,
                     **spec)
    cfg._attn_implementation = "eager"
    model = GPT2LMHeadModel(cfg).eval()
    out_dir = os.path.join(ROOT, "gpt2", name)
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    size = os.path.getsize(os.path.join(out_dir, "model.safetensors"))
    assert size < 1_000_000, f"{name}: {size} bytes"

    V = spec["vocab_size"]
    g = torch.Generator().manual_seed(100 + seed)
    cases = []
    with torch.no_grad():
        ids = torch.randint(3, V, (2, 7), generator=g)
        logits = model(input_ids=ids).logits
        cases.append({"name": f"{name}/logits_plain", "op": "logits",
                      "args": {"input_ids": tensor_json(ids), "attention_mask": None,
                               "position_ids": None},
                      "expect": {"logits": tensor_json(logits)}})

        ids = torch.randint(3, V, (3, 7), generator=g)
        mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1], [0, 0, 0, 0, 1, 1, 1]])
        ids = ids.masked_fill(mask == 0, PAD)
        pos = position_ids_for(mask)
        logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
        cases.append({"name": f"{name}/logits_left_pad", "op": "logits",
                      "args": {"input_ids": tensor_json(ids), "attention_mask": tensor_json(mask),
                               "position_ids": tensor_json(pos)},
                      "expect": {"logits": tensor_json(logits)}})

        prompt = torch.randint(3, V, (3, 5), generator=g)
        pmask = torch.tensor([[0, 1, 1, 1, 1], [1, 1, 1, 1, 1], [0, 0, 0, 1, 1]])
        prompt = prompt.masked_fill(pmask == 0, PAD)
        common = dict(input_ids=prompt, attention_mask=pmask, do_sample=False, pad_token_id=PAD)
        out = model.generate(max_new_tokens=10, eos_token_id=None, **common)
        check_margins(model, prompt, pmask, out, 5)
        cases.append({"name": f"{name}/greedy", "op": "generate",
                      "args": {"input_ids": tensor_json(prompt), "attention_mask": tensor_json(pmask),
                               "max_new_tokens": 10, "min_new_tokens": 0, "eos_token_id": None,
                               "pad_token_id": PAD},
                      "expect": {"sequences": tensor_json(out)}})
        eos = int(out[0, 5 + 2])
        for case, min_new in (("greedy_eos", 0), ("greedy_eos_min", 6)):
            out = model.generate(max_new_tokens=10, min_new_tokens=min_new, eos_token_id=eos,
                                 **common)
            cases.append({"name": f"{name}/{case}", "op": "generate",
                          "args": {"input_ids": tensor_json(prompt),
                                   "attention_mask": tensor_json(pmask), "max_new_tokens": 10,
                                   "min_new_tokens": min_new, "eos_token_id": eos,
                                   "pad_token_id": PAD},
                          "expect": {"sequences": tensor_json(out)}})
    return cases


CORPUS = [
    "the cat sat on the mat.",
    "The quick brown fox jumps over the lazy dog!",
    "reinforcement learning from human feedback",
    "a policy, a value head and a frozen reference",
    "tokens are bytes, bytes are tokens; 1234 5678",
] * 20

TEXTS = ["the cat sat", "Reinforcement learning!", "héllo wörld 42", "", "fox<|endoftext|>dog"]


def record_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=["<|endoftext|>", "<pad>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(CORPUS, trainer=trainer)
    out_dir = os.path.join(ROOT, "tokenizer")
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "tokenizer.json")
    tok.save(path)
    tok = Tokenizer.from_file(path)
    cases = []
    for text in TEXTS:
        enc = tok.encode(text)
        cases.append({"text": text, "ids": enc.ids,
                      "decoded": tok.decode(enc.ids, skip_special_tokens=False)})
    return {"vocab_size": tok.get_vocab_size(), "eos": tok.token_to_id("<|endoftext|>"),
            "pad": tok.token_to_id("<pad>"), "cases": cases}


def record_score_model():
    """A GPT2ForSequenceClassification(num_labels=1) reward model and its scores."""
    from transformers import GPT2ForSequenceClassification
    torch.manual_seed(2)
    cfg = GPT2Config(vocab_size=90, n_positions=24, n_embd=16, n_layer=2, n_head=2,
                     initializer_range=0.1, pad_token_id=PAD, num_labels=1)
    cfg._attn_implementation = "eager"
    model = GPT2ForSequenceClassification(cfg).eval()
    out_dir = os.path.join(ROOT, "gpt2", "score_v90")
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    g = torch.Generator().manual_seed(7)
    cases = []
    with torch.no_grad():
        for case, mask in (
            ("score_right_pad", [[1, 1, 1, 1, 1, 0], [1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1]]),
            ("score_left_pad", [[0, 1, 1, 1, 1, 1], [0, 0, 0, 1, 1, 1], [1, 1, 1, 1, 1, 1]]),
        ):
            mask = torch.tensor(mask)
            ids = torch.randint(3, 90, (3, 6), generator=g).masked_fill(mask == 0, PAD)
            kw = {}
            if case == "score_left_pad":
                kw["position_ids"] = position_ids_for(mask)
            scores = model(input_ids=ids, attention_mask=mask, **kw).logits.squeeze(-1)
            cases.append({"name": f"score_v90/{case}", "op": "score",
                          "args": {"input_ids": tensor_json(ids), "attention_mask": tensor_json(mask),
                                   "position_ids": tensor_json(kw["position_ids"]) if kw else None},
                          "expect": {"scores": tensor_json(scores)}})
    return cases


def main():
    cases = []
    for name, spec in MODELS.items():
        cases.extend(record_model(name, spec))
    cases.extend(record_score_model())
    versions = {"torch": torch.__version__, "transformers": transformers.__version__,
                "python": sys.version.split()[0]}
    with open(os.path.join(ROOT, "gpt2_cases.json"), "w") as f:
        f.write('{"generator": "specs/record_gpt2.py", "versions": ' + json.dumps(versions)
                + ', "cases": [\n')
        f.write(",\n".join(json.dumps(c) for c in cases))
        f.write("\n]}\n")
    tokenizer = record_tokenizer()
    import tokenizers
    tokenizer["versions"] = {"tokenizers": tokenizers.__version__}
    with open(os.path.join(ROOT, "tokenizer_cases.json"), "w") as f:
        json.dump(tokenizer, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"wrote {len(cases)} GPT-2 cases and {len(tokenizer['cases'])} tokenizer cases")


if __name__ == "__main__":
    main()
