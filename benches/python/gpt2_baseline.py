"""The Python half of the side-by-side GPT benchmarks (see benches/llm.rs for the workloads):
`transformers`' GPT2LMHeadModel, random init, `generate(do_sample=True, top_k=0)` with its KV
cache, and a policy + value head + full reference copy forward. Best of 3, on
`TORCHRL_BENCH_THREADS` threads (default 2, as the Rust half). Prints `name<TAB>ops/s` lines; the reference's parameter bytes go to stderr."""
import os
import sys
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel

torch.set_num_threads(int(os.environ.get("TORCHRL_BENCH_THREADS", "2")))


def best_of(f, repeat=3):
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        f()
        best = min(best, time.perf_counter() - t0)
    return best


DEVICE = os.environ.get("TORCHRL_BENCH_DEVICE", "cpu")
DTYPE = torch.bfloat16 if os.environ.get("TORCHRL_BENCH_BF16") else torch.float32


def model_for(**kw):
    torch.manual_seed(0)
    cfg = GPT2Config(**kw)
    model = GPT2LMHeadModel(cfg).eval().to(DEVICE, DTYPE)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def tokens_per_s(model, vocab, batch, prompt, new):
    ids = torch.randint(3, vocab, (batch, prompt)).to(DEVICE)
    mask = torch.ones_like(ids)
    kw = dict(attention_mask=mask, do_sample=True, top_k=0, top_p=1.0, max_new_tokens=new,
              min_new_tokens=new, pad_token_id=0)
    with torch.no_grad():
        model.generate(ids, **kw)
        secs = best_of(lambda: model.generate(ids, **kw))
    return batch * new / secs


def main():
    tiny = model_for(vocab_size=259, n_layer=4, n_embd=128, n_head=4, n_positions=256)
    print(f"W8_gpt_generate_tiny\t{tokens_per_s(tiny, 259, 16, 16, 32):.0f}", flush=True)
    if os.environ.get("TORCHRL_BENCH_TINY_ONLY"):
        return
    small = model_for(vocab_size=50257)
    print(f"W9_gpt_generate_gpt2_small\t{tokens_per_s(small, 50257, 8, 16, 32):.1f}", flush=True)

    # policy + value head (trlX make_head) + full reference copy, no grad
    v_head = torch.nn.Sequential(torch.nn.Linear(768, 1536), torch.nn.ReLU(), torch.nn.Linear(1536, 1))
    ref = model_for(vocab_size=50257)
    ids = torch.randint(3, 50257, (8, 48))
    mask = torch.ones_like(ids)

    def forward():
        out = small(input_ids=ids, attention_mask=mask, output_hidden_states=True)
        values = v_head(out.hidden_states[-1]).squeeze(-1)
        ref_logits = ref(input_ids=ids, attention_mask=mask).logits
        return out.logits, values, ref_logits

    n = 5
    with torch.no_grad():
        forward()
        secs = best_of(lambda: [forward() for _ in range(n)])
    print(f"W10_gpt_policy_value_ref_forward\t{n / secs:.2f}", flush=True)
    ref_bytes = sum(p.numel() * p.element_size() for p in ref.parameters())
    print(f"reference parameters: {ref_bytes / 1e6:.1f} MB (full copy)", file=sys.stderr)


if __name__ == "__main__":
    main()
