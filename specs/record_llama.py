#!/usr/bin/env python
"""Record Llama-family fidelity cases from Hugging Face `transformers` (5.x).

Run from the repository root:

    /root/.cache/torchrl-rs/venv/bin/python specs/record_llama.py

For each tiny random-init model below it writes ``specs/llama/<name>/config.json`` and
``model.safetensors`` (``save_pretrained``: the real layout and names), and into
``specs/llama_cases.json`` per model:

- ``logits_plain``: logits ``[B, T, V]`` for fixed ``input_ids`` (no padding);
- ``logits_left_pad``: logits of a left-padded batch with the position ids ``generate`` uses
  (``cumsum(mask) - 1``, pads set to 1); only positions whose mask is 1 are meaningful;
- ``greedy``: ``generate(do_sample=False, max_new_tokens=8)`` on left-padded prompts (every
  step's top-1 / top-2 margin asserted >= 2e-3, so a float32 port within 1e-4 picks the same).

``qwen2_score`` is a ``Qwen2ForSequenceClassification(num_labels=1)`` (the reward-model shape):
its scores, read at each row's last non-pad token, for a left- and a right-padded batch.

The models cover what the family differs by: grouped-query and multi-query heads, ``llama3``
and ``linear`` rope scaling, attention and MLP biases (Llama), Qwen2's q/k/v biases, Qwen3's
q/k norms and a ``head_dim`` apart from ``hidden / heads``, tied and untied LM heads,
Mistral's (long) sliding window, a list of EOS ids. Biases and norm weights are randomised
(``transformers`` initialises them to 0 and 1) so that a port that skipped them would fail.
One config is rewritten in the 4.x form (``rope_theta`` + ``rope_scaling``) so that both forms
are read.
"""

import json
import os

import torch
from transformers import AutoConfig, AutoModelForCausalLM

ROOT = os.path.dirname(os.path.abspath(__file__))
PAD = 0

COMMON = dict(vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
              num_attention_heads=4, max_position_embeddings=64, rms_norm_eps=1e-5,
              initializer_range=0.1, bos_token_id=1, pad_token_id=PAD)

MODELS = {
    "llama_gqa_llama3": dict(model_type="llama", num_key_value_heads=2, eos_token_id=[2, 3],
                             tie_word_embeddings=False,
                             rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0,
                                              "factor": 8.0, "low_freq_factor": 1.0,
                                              "high_freq_factor": 4.0,
                                              "original_max_position_embeddings": 16},
                             seed=0),
    "llama_bias_linear_v4": dict(model_type="llama", num_key_value_heads=4, eos_token_id=2,
                                 attention_bias=True, mlp_bias=True, tie_word_embeddings=True,
                                 rope_parameters={"rope_type": "linear", "rope_theta": 10000.0,
                                                  "factor": 2.0},
                                 rewrite_v4=True, seed=1),
    "qwen2_mqa": dict(model_type="qwen2", num_key_value_heads=1, eos_token_id=2,
                      tie_word_embeddings=True, rope_parameters={"rope_type": "default",
                                                                 "rope_theta": 1000000.0},
                      seed=2),
    "qwen3_head_dim": dict(model_type="qwen3", num_key_value_heads=2, head_dim=16,
                           eos_token_id=2, tie_word_embeddings=False,
                           rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                           seed=3),
    "mistral_window": dict(model_type="mistral", num_key_value_heads=2, eos_token_id=2,
                           sliding_window=4096, tie_word_embeddings=False,
                           rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                           seed=5),
}


def tensor_json(t):
    t = t.detach().cpu()
    dtype = {torch.float32: "float32", torch.int64: "int64"}[t.dtype]
    return {"shape": list(t.shape), "dtype": dtype, "data": t.reshape(-1).tolist()}


def position_ids_for(mask):
    pos = mask.long().cumsum(-1) - 1
    return pos.masked_fill(mask == 0, 1)


def record_model(name, spec):
    spec = dict(spec)
    seed = spec.pop("seed")
    rewrite_v4 = spec.pop("rewrite_v4", False)
    model_type = spec.pop("model_type")
    torch.manual_seed(seed)
    cfg = AutoConfig.for_model(model_type, **COMMON, **spec)
    cfg._attn_implementation = "eager"
    model = AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.endswith(".bias"):
                p.uniform_(-0.5, 0.5)
            elif "norm" in pname:
                p.uniform_(0.5, 1.5)
    out_dir = os.path.join(ROOT, "llama", name)
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    size = os.path.getsize(os.path.join(out_dir, "model.safetensors"))
    assert size < 500_000, f"{name}: {size} bytes"
    if rewrite_v4:
        path = os.path.join(out_dir, "config.json")
        c = json.load(open(path))
        rp = c.pop("rope_parameters")
        c["rope_theta"] = rp.pop("rope_theta")
        c["rope_scaling"] = {"type": rp.pop("rope_type"), **rp}
        json.dump(c, open(path, "w"), indent=2, sort_keys=True)
        # transformers still reads it the same way
        again = AutoModelForCausalLM.from_pretrained(out_dir).eval()
        assert torch.equal(again.model.rotary_emb.inv_freq, model.model.rotary_emb.inv_freq)

    V = COMMON["vocab_size"]
    g = torch.Generator().manual_seed(100 + seed)
    cases = []
    with torch.no_grad():
        ids = torch.randint(3, V, (2, 9), generator=g)
        logits = model(input_ids=ids).logits
        cases.append({"name": f"{name}/logits_plain", "op": "logits",
                      "args": {"input_ids": tensor_json(ids), "attention_mask": None,
                               "position_ids": None},
                      "expect": {"logits": tensor_json(logits)}})
        ids = torch.randint(3, V, (3, 9), generator=g)
        mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1, 1], [1] * 9, [0, 0, 0, 0, 0, 1, 1, 1, 1]])
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
        out = model.generate(input_ids=prompt, attention_mask=pmask, do_sample=False,
                             max_new_tokens=8, eos_token_id=None, pad_token_id=PAD)
        full_mask = torch.cat([pmask, torch.ones(3, 8, dtype=pmask.dtype)], dim=1)
        logits = model(input_ids=out, attention_mask=full_mask,
                       position_ids=position_ids_for(full_mask)).logits
        for step in range(8):
            top2 = logits[:, 4 + step].topk(2, dim=-1).values
            margin = (top2[:, 0] - top2[:, 1]).min().item()
            assert margin >= 2e-3, f"{name}: greedy margin {margin} at step {step}"
        cases.append({"name": f"{name}/greedy", "op": "generate",
                      "args": {"input_ids": tensor_json(prompt),
                               "attention_mask": tensor_json(pmask), "max_new_tokens": 8},
                      "expect": {"sequences": tensor_json(out)}})
    return cases


def record_score():
    from transformers import Qwen2Config, Qwen2ForSequenceClassification
    torch.manual_seed(7)
    cfg = Qwen2Config(num_labels=1, num_key_value_heads=2, tie_word_embeddings=False,
                      rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                      **COMMON)
    cfg._attn_implementation = "eager"
    model = Qwen2ForSequenceClassification(cfg).eval()
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.endswith(".bias"):
                p.uniform_(-0.5, 0.5)
            elif "norm" in pname:
                p.uniform_(0.5, 1.5)
    out_dir = os.path.join(ROOT, "llama", "qwen2_score")
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    g = torch.Generator().manual_seed(107)
    cases = []
    with torch.no_grad():
        for which, mask in (("score_left_pad", [[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]]),
                            ("score_right_pad", [[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]])):
            mask = torch.tensor(mask)
            ids = torch.randint(3, COMMON["vocab_size"], (2, 6), generator=g)
            ids = ids.masked_fill(mask == 0, PAD)
            pos = position_ids_for(mask)
            score = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits[:, 0]
            cases.append({"name": f"qwen2_score/{which}", "op": "score",
                          "args": {"input_ids": tensor_json(ids),
                                   "attention_mask": tensor_json(mask)},
                          "expect": {"score": tensor_json(score)}})
    return cases


def main():
    import transformers
    cases = []
    for name, spec in MODELS.items():
        cases.extend(record_model(name, spec))
    cases.extend(record_score())
    out = {"recorded_with": {"transformers": transformers.__version__,
                             "torch": torch.__version__},
           "cases": cases}
    with open(os.path.join(ROOT, "llama_cases.json"), "w") as f:
        json.dump(out, f)
    print(f"wrote {len(cases)} cases")


if __name__ == "__main__":
    main()
