#!/usr/bin/env python
"""Record LoRA fidelity cases from PEFT on tiny random-init models.

Run from the repository root:

    /root/.cache/torchrl-rs/venv/bin/python specs/record_peft.py

For each case below it loads a base model already recorded by ``record_llama.py`` /
``record_gpt2.py`` (``specs/llama/<base>`` or ``specs/gpt2/<base>``), wraps it with
``peft.get_peft_model(LoraConfig(...))``, sets every ``lora_B`` to seeded random values
(PEFT initialises B to zero, so an adapter that is not applied would go unnoticed) and writes:

- ``specs/peft/<case>/adapter_config.json`` + ``adapter_model.safetensors``
  (``save_pretrained``: PEFT's own names and fields);
- into ``specs/peft_cases.json``: the logits with the adapter on, with it disabled
  (``disable_adapter()``: must equal the base model's), and after ``merge_and_unload()``, for
  fixed ``input_ids``; the adapter's tensor names and shapes; the merged model's weights for the
  targeted modules are not stored (the logits check them).

The cases cover the PEFT options we implement: explicit ``target_modules`` and
``"all-linear"``, ``use_rslora`` (scaling alpha / sqrt(r) instead of alpha / r), GPT-2's
``Conv1D`` (``fan_in_fan_out``) and grouped-query attention with q/k/v biases.
"""

import json
import os

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

ROOT = os.path.dirname(os.path.abspath(__file__))

CASES = {
    "qwen3_all_linear": dict(base="llama/qwen3_head_dim", seed=10,
                             lora=dict(r=4, lora_alpha=8, target_modules="all-linear")),
    "qwen2_qv_rslora": dict(base="llama/qwen2_mqa", seed=11,
                            lora=dict(r=2, lora_alpha=16, target_modules=["q_proj", "v_proj"],
                                      use_rslora=True)),
    "gpt2_attn_fc": dict(base="gpt2/tiny_v101", seed=12,
                         lora=dict(r=4, lora_alpha=4, target_modules=["c_attn", "c_fc"],
                                   fan_in_fan_out=True)),
}


def tensor_json(t):
    t = t.detach().to(torch.float64).contiguous()
    return {"shape": list(t.shape), "data": t.reshape(-1).tolist()}


def record_case(name, spec):
    torch.manual_seed(spec["seed"])
    base_dir = os.path.join(ROOT, spec["base"])
    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32).eval()
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (2, 7))
    with torch.no_grad():
        base_logits = model(input_ids=ids).logits
    peft_model = get_peft_model(model, LoraConfig(lora_dropout=0.0, **spec["lora"])).eval()
    gen = torch.Generator().manual_seed(spec["seed"] + 100)
    with torch.no_grad():
        for n, p in peft_model.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
    out_dir = os.path.join(ROOT, "peft", name)
    peft_model.save_pretrained(out_dir)
    # the model card is not needed, and the base's path is written relative to specs/
    os.remove(os.path.join(out_dir, "README.md"))
    cfg_file = os.path.join(out_dir, "adapter_config.json")
    with open(cfg_file) as f:
        cfg = json.load(f)
    cfg["base_model_name_or_path"] = spec["base"]
    with open(cfg_file, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
    with torch.no_grad():
        on = peft_model(input_ids=ids).logits
        with peft_model.disable_adapter():
            off = peft_model(input_ids=ids).logits
        assert torch.allclose(off, base_logits, atol=1e-6)
        assert (on - off).abs().max() > 1e-2, "the adapter must move the logits"
        merged = peft_model.merge_and_unload()
        merged_logits = merged(input_ids=ids).logits
    from safetensors import safe_open
    with safe_open(os.path.join(out_dir, "adapter_model.safetensors"), "pt") as f:
        names = {k: list(f.get_tensor(k).shape) for k in f.keys()}
    return {
        "base": spec["base"],
        "input_ids": tensor_json(ids),
        "logits_adapter": tensor_json(on),
        "logits_disabled": tensor_json(off),
        "logits_merged": tensor_json(merged_logits),
        "adapter_tensors": names,
    }


def main():
    cases = {name: record_case(name, spec) for name, spec in CASES.items()}
    with open(os.path.join(ROOT, "peft_cases.json"), "w") as f:
        json.dump({"peft": __import__("peft").__version__,
                   "transformers": __import__("transformers").__version__,
                   "cases": cases}, f)
    print("wrote", len(cases), "cases")


if __name__ == "__main__":
    main()
