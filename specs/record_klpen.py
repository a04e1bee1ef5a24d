#!/usr/bin/env python
"""Record reference cases for PPO's KL-penalty loss (TorchRL 0.14.1 ``KLPENPPOLoss``).

Run from the repository root:

    /root/.cache/torchrl-rs/venv/bin/python specs/record_klpen.py

It writes ``specs/klpen_cases.json``, which ``tests/ppo.rs`` replays (Rust never runs Python).
Networks, weights and batch come from ``specs/record_ppo.py``'s ``build`` (float64, seeded),
plus the behaviour policy's distribution parameters ``loc``/``scale`` (the current ones,
perturbed) and ``action_log_prob`` recomputed under that behaviour policy.

Each case runs the *same* loss twice on the same batch, so that the adaptive ``beta`` (doubled
or halved after each call) is exercised: ``calls[i]`` holds ``beta`` before call ``i``, the
outputs, and the gradients of the summed ``loss_*`` outputs w.r.t. the eight weights.

Gradients: TorchRL 0.14.1 updates its ``beta`` buffer in place (``beta.data *= increment``)
after ``beta * kl`` entered the graph, so ``autograd`` multiplies the KL gradient by the
*updated* beta while the reported loss used the old one. ``grads`` are therefore taken from a
twin loss with the same beta frozen (``increment = decrement = 1``), whose outputs are checked
to equal the adaptive loss's: they are the gradients of the reported loss. TorchRL's own
(post-update-beta) gradients are kept as ``grads_torchrl_autograd`` for the record.

Case layout: ``{"name", "dist", "act_dim", "kwargs", "weights", "td", "calls": [{"beta",
"beta_after", "expect": {outputs..., "grads"}, "grads_torchrl_autograd"}]}``; tensors are
``{"shape", "data"}`` (row-major).
"""

from __future__ import annotations

import json
import os
import sys
import warnings

warnings.filterwarnings("ignore")
os.environ.setdefault("RL_WARNINGS", "0")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402
import torchrl  # noqa: E402
import tensordict  # noqa: E402
from torchrl.modules import TanhNormal  # noqa: E402
from torchrl.objectives import KLPENPPOLoss  # noqa: E402

from record_ppo import build, t2j  # noqa: E402

torch.set_default_dtype(torch.float64)
OUT = os.path.join(HERE, "klpen_cases.json")
KEYS = ["observation", "action", "action_log_prob", "advantage", "value_target", "state_value", "loc", "scale"]


def behaviour(td, actor, dist, seed, shift):
    g = torch.Generator().manual_seed(1000 + seed)
    with torch.no_grad():
        d = actor.get_dist(td.clone())
        loc = d.loc if dist == "normal" else d.base_dist.base_dist.loc
        scale = d.scale if dist == "normal" else d.base_dist.base_dist.scale
        old_loc = loc + shift * torch.randn(loc.shape, generator=g)
        old_scale = scale * torch.exp(0.5 * shift * torch.randn(scale.shape, generator=g))
        if dist == "normal":
            old = torch.distributions.Normal(old_loc, old_scale)
        else:
            old = TanhNormal(old_loc, old_scale, low=-1.0, high=1.0)
        td["loc"], td["scale"] = old_loc, old_scale
        td["action_log_prob"] = old.log_prob(td["action"])


def grads_of(out, params):
    total = sum(v.sum() for k, v in out.items() if k.startswith("loss_"))
    gs = torch.autograd.grad(total, list(params.values()), allow_unused=True)
    return {k: t2j(g if g is not None else torch.zeros_like(p)) for (k, p), g in zip(params.items(), gs)}


def record(name, dist, act_dim, seed, shift, kwargs):
    w, actor, critic, params, td = build(dist, act_dim, seed)
    behaviour(td, actor, dist, seed, shift)
    loss = KLPENPPOLoss(actor, critic, functional=False, **kwargs)
    calls = []
    for _ in range(2):
        beta = float(loss.beta)
        frozen = dict(kwargs, beta=beta, increment=1.0, decrement=1.0)
        twin = KLPENPPOLoss(actor, critic, functional=False, **frozen)
        out = loss(td.clone())
        twin_out = twin(td.clone())
        for k, v in out.items():
            assert torch.allclose(v, twin_out[k], atol=1e-12), (name, k)
        expect = {k: t2j(v) for k, v in out.items()}
        expect["grads"] = grads_of(twin_out, params)
        calls.append({
            "beta": beta,
            "beta_after": float(loss.beta),
            "expect": expect,
            "grads_torchrl_autograd": grads_of(out, params),
        })
    return {
        "name": name,
        "dist": dist,
        "act_dim": act_dim,
        "kwargs": kwargs,
        "weights": {k: t2j(v) for k, v in w.items()},
        "td": {k: t2j(td[k]) for k in KEYS},
        "calls": calls,
    }


CASES = [
    # large KL: beta doubles after each call
    ("normal_defaults", "normal", 2, 0, 0.3, {}),
    # small KL against a loose target: beta shrinks (custom decrement), l2 critic, clip_value
    ("normal_decrement", "normal", 2, 1, 0.05, {"dtarg": 0.5, "beta": 0.7, "decrement": 0.8, "increment": 1.5,
                                                 "loss_critic_type": "l2", "clip_value": 0.3}),
    # KL inside [dtarg/1.5, dtarg*1.5]: beta stays
    ("normal_in_band", "normal", 1, 2, 0.1, {"dtarg": 0.02, "beta": 2.0, "entropy_coeff": 0.05}),
    ("normal_none_norm_adv", "normal", 2, 3, 0.2, {"reduction": "none", "normalize_advantage": True}),
    ("normal_sum", "normal", 2, 4, 0.2, {"reduction": "sum", "critic_coeff": 0.5}),
    # TanhNormal: closed-form KL of the pre-tanh Gaussians (same bounds), no analytic entropy
    ("tanh_defaults", "tanh_normal", 2, 5, 0.3, {"entropy_bonus": False}),
    ("tanh_norm_l2", "tanh_normal", 2, 6, 0.1, {"entropy_bonus": False, "normalize_advantage": True,
                                                "loss_critic_type": "l2", "dtarg": 0.05, "increment": 3.0}),
]


def main():
    cases = [record(*c) for c in CASES]
    for c in cases:
        print(c["name"], [(k["beta"], k["beta_after"]) for k in c["calls"]])
    versions = {"torch": torch.__version__, "torchrl": torchrl.__version__, "tensordict": tensordict.__version__}
    with open(OUT, "w") as f:
        f.write("{\n")
        f.write('"generator": "specs/record_klpen.py",\n')
        f.write(f'"versions": {json.dumps(versions)},\n')
        f.write('"cases": [\n')
        f.write(",\n".join(json.dumps(c) for c in cases))
        f.write("\n]\n}\n")
    print(f"wrote {len(cases)} cases to {OUT}")


if __name__ == "__main__":
    main()
