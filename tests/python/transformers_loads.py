"""Loads folders torchrl wrote with `transformers` (and PEFT) and checks they are the same
models: no missing, unexpected or mis-shaped tensor, and the same logits / scores as torchrl
computed on the same left-padded batch. Run by tests/transformers_loads.rs (cargo feature
`python-refs`), which writes the folders and a `manifest.json`:

    {"cases": [{"name": ..., "kind": "causal" | "score" | "peft",
                "dir": folder, "base": base folder (peft only),
                "ours": safetensors file with input_ids, attention_mask and logits / score}]}

Exits 1 naming every case that failed.
"""
import json
import sys

import torch
from safetensors.torch import load_file

TOL = 1e-4


def position_ids_for(mask):
    pos = mask.long().cumsum(-1) - 1
    return pos.masked_fill(mask == 0, 1)


def strict_load(cls, folder):
    model, info = cls.from_pretrained(folder, dtype=torch.float32, output_loading_info=True)
    bad = {k: v for k, v in info.items() if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v}
    if bad:
        raise AssertionError(f"{folder}: loading info {bad}")
    return model.eval()


def check(case):
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    ours = load_file(case["ours"])
    ids, mask = ours["input_ids"], ours["attention_mask"]
    pos = position_ids_for(mask)
    kind = case["kind"]
    if kind == "causal":
        model = strict_load(AutoModelForCausalLM, case["dir"])
    elif kind == "score":
        model = strict_load(AutoModelForSequenceClassification, case["dir"])
    elif kind == "peft":
        from peft import PeftModel

        base = strict_load(AutoModelForCausalLM, case["base"])
        model = PeftModel.from_pretrained(base, case["dir"]).eval()
        for name, p in model.named_parameters():
            if "lora_B" in name and p.abs().max().item() == 0.0:
                raise AssertionError(f"{case['dir']}: {name} loaded as zeros")
    else:
        raise AssertionError(f"unknown kind {kind}")
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
    if kind == "score":
        theirs, want = out[:, 0], ours["score"]
        diff = (theirs - want).abs().max().item()
    else:
        want = ours["logits"]
        if out.shape != want.shape:
            raise AssertionError(f"logits {tuple(out.shape)} against ours {tuple(want.shape)}")
        valid = mask.bool()
        diff = (out - want).abs()[valid].max().item()
    return diff


def main():
    manifest = json.load(open(sys.argv[1]))
    failed = []
    for case in manifest["cases"]:
        try:
            diff = check(case)
            status = "ok" if diff <= TOL else f"FAILED (max |diff| {diff:.3g} > {TOL})"
            print(f"{case['name']}: max |diff| {diff:.3g} {status}")
            if diff > TOL:
                failed.append(case["name"])
        except Exception as e:  # noqa: BLE001 - every failure is reported by case
            print(f"{case['name']}: FAILED: {type(e).__name__}: {e}")
            failed.append(case["name"])
    if failed:
        print(f"{len(failed)} of {len(manifest['cases'])} cases failed: {', '.join(failed)}")
        sys.exit(1)
    print(f"all {len(manifest['cases'])} cases loaded and matched")


if __name__ == "__main__":
    main()
