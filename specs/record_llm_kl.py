#!/usr/bin/env python
"""Record the LLM KL / running-moments cases replayed by `tests/llm_kl.rs`.

Run from the repository root:

    /root/.cache/torchrl-rs/venv/bin/python specs/record_llm_kl.py

It writes ``specs/llm_kl_cases.json`` (format in ``specs/README.md``) with

- ``running_moments`` cases: a sequence of ``update(xs)`` calls and, after each, the returned
  batch (mean, unbiased std) and the state (mean, var, std, count).
  TRL 1.16 (the installed version) no longer ships ``RunningMoments`` (it was removed with the
  legacy PPOTrainer after 0.11), so ``running_moments_reference`` below implements trlX's
  formula (HEAD ``trlx/utils/modeling.py``, rlhf.md §1.6) in torch float64; those cases say
  "hand-derived from trlX's formula" in ``source``. The script checks whether ``trl`` has the
  class and uses it when it does.
- ``kl_estimators`` cases: k1 = lp - ref, k2 = 0.5 (ref - lp)^2, k3 = exp(ref - lp) - 1 -
  (ref - lp) (TRL's ``kl_estimator="k3"`` expression, ``logr = ref_logprobs - logprobs``) and
  trlX's logged ``exp(lp - ref) - 1 - (lp - ref)``, on seeded random float64 inputs.

Deterministic: ``torch.manual_seed`` before each case.
"""

import importlib
import json
import platform

import torch

OUT = "specs/llm_kl_cases.json"


def trl_running_moments():
    """TRL's RunningMoments class when the installed trl still has it, else None."""
    for mod in ("trl.trainer.utils", "trl.core", "trl.experimental.ppo.ppo_trainer"):
        try:
            m = importlib.import_module(mod)
        except Exception:
            continue
        if hasattr(m, "RunningMoments"):
            return getattr(m, "RunningMoments")
    return None


class running_moments_reference:
    """trlX's RunningMoments (rlhf.md §1.6), in float64."""

    def __init__(self):
        self.mean, self.std, self.var, self.count = 0.0, 1.0, 1.0, 1e-24

    def update(self, xs):
        xs_var, xs_mean = torch.var_mean(xs, unbiased=False)
        xs_var, xs_mean = xs_var.item(), xs_mean.item()
        n = xs.numel()
        delta = xs_mean - self.mean
        tot = self.count + n
        old_sum = self.var * self.count + delta**2 * self.count * n / tot
        self.mean += delta * n / tot
        self.var = (old_sum + xs_var * n) / tot
        self.std = (self.var * tot / (tot - 1)) ** 0.5
        self.count = tot
        return xs_mean, (xs_var * n / (n - 1)) ** 0.5


def enc(t):
    t = t.detach().contiguous()
    return {"shape": list(t.shape), "dtype": "float64", "data": t.double().reshape(-1).tolist()}


def main():
    import trl

    cases = []
    trl_cls = trl_running_moments()
    if trl_cls is not None:
        source = f"trl {trl.__version__} RunningMoments"
    else:
        source = f"hand-derived from trlX's formula (trl {trl.__version__} has no RunningMoments)"

    seqs = {
        "running_moments_random": None,
        "running_moments_shifted": None,
        "running_moments_many_small": None,
    }
    for i, name in enumerate(seqs):
        torch.manual_seed(100 + i)
        if name == "running_moments_random":
            batches = [torch.randn(8, dtype=torch.float64) * 2 + 1 for _ in range(3)]
        elif name == "running_moments_shifted":
            batches = [torch.randn(5, dtype=torch.float64) + 10 * k for k in range(4)]
        else:
            batches = [torch.randn(2, dtype=torch.float64) for _ in range(6)]
        rm = trl_cls() if trl_cls is not None else running_moments_reference()
        steps = []
        for xs in batches:
            bm, bs = rm.update(xs)
            steps.append({
                "xs": enc(xs),
                "batch_mean": float(bm), "batch_std": float(bs),
                "mean": float(rm.mean), "var": float(rm.var), "std": float(rm.std),
                "count": float(rm.count),
            })
        cases.append({"name": name, "op": "running_moments", "source": source,
                      "args": {"steps": steps}, "expect": None})

    for i, (shape, scale) in enumerate([((3, 5), 1.0), ((2, 7), 0.3)]):
        torch.manual_seed(200 + i)
        lp = -torch.rand(*shape, dtype=torch.float64) * 3 * scale
        ref = lp + torch.randn(*shape, dtype=torch.float64) * scale
        logr = ref - lp
        cases.append({
            "name": f"kl_estimators_{i}", "op": "kl_estimators",
            "source": "TRL experimental PPO kl_estimator expressions and trlX HEAD make_experience",
            "args": {"log_probs": enc(lp), "ref_log_probs": enc(ref)},
            "expect": {"k1": enc(-logr), "k2": enc(0.5 * logr**2),
                       "k3": enc(torch.exp(logr) - 1 - logr),
                       "trlx_logged": enc(torch.exp(lp - ref) - 1 - (lp - ref))},
        })

    versions = {"torch": torch.__version__, "trl": trl.__version__, "python": platform.python_version()}
    with open(OUT, "w") as f:
        f.write("{\n")
        f.write(f'"generator": "specs/record_llm_kl.py",\n"versions": {json.dumps(versions)},\n"cases": [\n')
        f.write(",\n".join(json.dumps(c) for c in cases))
        f.write("\n]}\n")
    print(f"wrote {len(cases)} cases to {OUT} ({source})")


if __name__ == "__main__":
    main()
