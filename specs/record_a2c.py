#!/usr/bin/env python
"""Record reference cases for TorchRL 0.14.1's on-policy ``A2CLoss`` and ``ReinforceLoss``.

Run from the repository root:

    /root/.cache/torchrl-rs/venv/bin/python specs/record_a2c.py

It writes ``specs/a2c_cases.json``, which ``tests/ppo.rs`` replays (Rust never runs Python).
The networks, weights and batch are ``specs/record_ppo.py``'s (its ``build``): a Normal or
TanhNormal actor and an MLP critic, float64, seeded; the case layout is the same, with
``"loss"`` naming the class (``"a2c"`` or ``"reinforce"``), and a third actor, ``categorical``:
the actor MLP's output read as the logits of a ``Categorical`` over ``2 * act_dim`` actions
(int64 actions). ``grads`` are of the sum of the ``loss_*`` outputs w.r.t. the weights.
TorchRL's A2C multiplies a ``[B, A, 1]`` log-prob by a ``[B, 1]`` advantage, which fails for a
per-dimension ``Normal``, so A2C is recorded with the categorical actor (analytic entropy) and
with TanhNormal (summed log-prob; no analytic entropy, so ``entropy_bonus=False``).
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torchrl  # noqa: E402
import tensordict  # noqa: E402
from torchrl.objectives import A2CLoss, ReinforceLoss  # noqa: E402

from record_ppo import B, H, OBS, build, t2j  # noqa: E402
from tensordict.nn import TensorDictModule  # noqa: E402
from torchrl.modules import ProbabilisticActor  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "a2c_cases.json")


def build_categorical(act_dim, seed):
    """``build``'s weights and batch, with the actor's output read as the logits of a
    ``Categorical`` over ``2 * act_dim`` actions (analytic entropy, a ``[B]`` log-prob)."""
    w, _, critic, params, td = build("normal", act_dim, seed)
    lin1, lin2 = torch.nn.Linear(OBS, H), torch.nn.Linear(H, 2 * act_dim)
    lin1.weight, lin1.bias = params["actor_w1"], params["actor_b1"]
    lin2.weight, lin2.bias = params["actor_w2"], params["actor_b2"]
    net = torch.nn.Sequential(lin1, torch.nn.Tanh(), lin2)
    actor = ProbabilisticActor(
        TensorDictModule(net, in_keys=["observation"], out_keys=["logits"]),
        in_keys=["logits"], distribution_class=torch.distributions.Categorical, return_log_prob=True)
    g = torch.Generator().manual_seed(seed + 1000)
    td["action"] = torch.randint(0, 2 * act_dim, (B,), generator=g)
    return w, actor, critic, params, td


def record(name, loss_name, dist, act_dim, seed, kwargs):
    if dist == "categorical":
        w, actor, critic, params, td = build_categorical(act_dim, seed)
    else:
        w, actor, critic, params, td = build(dist, act_dim, seed)
    cls = A2CLoss if loss_name == "a2c" else ReinforceLoss
    loss = cls(actor, critic, functional=False, **kwargs)
    out = loss(td.clone())
    total = sum(v.sum() for k, v in out.items() if k.startswith("loss_"))
    grads = torch.autograd.grad(total, list(params.values()), allow_unused=True)
    expect = {k: t2j(v) for k, v in out.items()}
    expect["grads"] = {
        k: t2j(g if g is not None else torch.zeros_like(p)) for (k, p), g in zip(params.items(), grads)
    }
    return {
        "name": name,
        "loss": loss_name,
        "dist": dist,
        "act_dim": act_dim,
        "kwargs": kwargs,
        "weights": {k: t2j(v) for k, v in w.items()},
        # no "action_log_prob": neither loss reads the behaviour policy's log-prob
        "td": {k: t2j(td[k]) for k in ["observation", "action", "advantage", "value_target", "state_value"]},
        "expect": expect,
    }


CASES = [
    ("a2c_defaults", "a2c", "categorical", 2, 20, {}),
    ("a2c_l2_coeffs", "a2c", "categorical", 2, 21, {"loss_critic_type": "l2", "critic_coeff": 0.5, "entropy_coeff": 0.05}),
    ("a2c_clip_value", "a2c", "categorical", 1, 22, {"clip_value": 0.3}),
    ("a2c_sum", "a2c", "categorical", 2, 23, {"reduction": "sum"}),
    ("a2c_none_l1", "a2c", "categorical", 2, 24, {"reduction": "none", "loss_critic_type": "l1"}),
    ("a2c_tanh", "a2c", "tanh_normal", 2, 25, {"entropy_bonus": False}),
    ("reinforce_defaults", "reinforce", "normal", 2, 30, {}),
    ("reinforce_l2_clip_value", "reinforce", "categorical", 2, 31, {"loss_critic_type": "l2", "clip_value": 0.4}),
    ("reinforce_sum_tanh", "reinforce", "tanh_normal", 2, 32, {"reduction": "sum"}),
    ("reinforce_none", "reinforce", "categorical", 1, 33, {"reduction": "none"}),
]


def main():
    cases = [record(*c) for c in CASES]
    doc = {
        "generator": "specs/record_a2c.py",
        "versions": {"torch": torch.__version__, "torchrl": torchrl.__version__, "tensordict": tensordict.__version__},
        "cases": cases,
    }
    with open(OUT, "w") as f:
        f.write("{\n")
        f.write(f'"generator": {json.dumps(doc["generator"])},\n')
        f.write(f'"versions": {json.dumps(doc["versions"])},\n')
        f.write('"cases": [\n')
        f.write(",\n".join(json.dumps(c) for c in cases))
        f.write("\n]\n}\n")
    print(f"wrote {len(cases)} cases to {OUT}")


if __name__ == "__main__":
    main()
