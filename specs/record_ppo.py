#!/usr/bin/env python
"""Record reference cases for PPO's clipped loss (TorchRL 0.14.1 ``ClipPPOLoss``).

Run from the repository root:

    /root/.cache/torchrl-rs/venv/bin/python specs/record_ppo.py

It writes ``specs/ppo_cases.json``, which ``tests/ppo.rs`` replays (Rust never runs Python).
Everything is float64 and deterministic: the weights and the batch are drawn from
``torch.Generator().manual_seed(...)`` and written out literally.

Networks (weights in each case, PyTorch ``Linear`` layout ``weight [out, in]``):

- actor: ``observation [B, 3] -> Linear(3, 4) -> Tanh -> Linear(4, 2A) -> "param"``, then
  ``NormalParamExtractor()`` (biased softplus 1.0, scale_lb 1e-4) -> ``loc``, ``scale``, then
  ``ProbabilisticActor`` with ``Normal`` (per-dim log-prob ``[B, A]``) or
  ``TanhNormal(low=-1, high=1)`` (summed over the action dim, ``[B]``);
- critic: ``observation -> Linear(3, 4) -> Tanh -> Linear(4, 1) -> "state_value"``.

Case layout (one JSON object per case)::

    {"name", "dist", "kwargs", "weights": {actor_w1, actor_b1, actor_w2, actor_b2,
     critic_w1, critic_b1, critic_w2, critic_b2}, "td": {entries}, "batch": B,
     "expect": {loss_objective, loss_entropy?, loss_critic?, clip_fraction, entropy?,
                ESS, kl_approx, max_ratio, mean_ratio, value_clip_fraction?,
                explained_variance?, grads: {name: tensor}}}

``grads`` are of the sum of the ``loss_*`` outputs (summed to a scalar) w.r.t. the weights.
TanhNormal has no analytic entropy (TorchRL falls back to a random Monte-Carlo estimate), so
its cases run with ``entropy_bonus=False``. Tensors are ``{"shape", "data"}`` (row-major).
"""

from __future__ import annotations

import json
import os
import warnings

warnings.filterwarnings("ignore")
os.environ.setdefault("RL_WARNINGS", "0")

import torch  # noqa: E402
import torchrl  # noqa: E402
import tensordict  # noqa: E402
from tensordict import TensorDict  # noqa: E402
from tensordict.nn import NormalParamExtractor, TensorDictModule, TensorDictSequential  # noqa: E402
from torchrl.modules import ProbabilisticActor, TanhNormal, ValueOperator  # noqa: E402
from torchrl.objectives import ClipPPOLoss  # noqa: E402

torch.set_default_dtype(torch.float64)
HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "ppo_cases.json")
B, OBS, H = 6, 3, 4


def t2j(t):
    t = t.detach().to(torch.float64)
    return {"shape": list(t.shape), "data": t.reshape(-1).tolist()}


def build(dist, act_dim, seed):
    g = torch.Generator().manual_seed(seed)
    w = {
        "actor_w1": torch.randn(H, OBS, generator=g) * 0.7,
        "actor_b1": torch.randn(H, generator=g) * 0.1,
        "actor_w2": torch.randn(2 * act_dim, H, generator=g) * 0.7,
        "actor_b2": torch.randn(2 * act_dim, generator=g) * 0.1,
        "critic_w1": torch.randn(H, OBS, generator=g) * 0.7,
        "critic_b1": torch.randn(H, generator=g) * 0.1,
        "critic_w2": torch.randn(1, H, generator=g) * 0.7,
        "critic_b2": torch.randn(1, generator=g) * 0.1,
    }
    a_net = torch.nn.Sequential(torch.nn.Linear(OBS, H), torch.nn.Tanh(), torch.nn.Linear(H, 2 * act_dim))
    c_net = torch.nn.Sequential(torch.nn.Linear(OBS, H), torch.nn.Tanh(), torch.nn.Linear(H, 1))
    with torch.no_grad():
        a_net[0].weight.copy_(w["actor_w1"]); a_net[0].bias.copy_(w["actor_b1"])
        a_net[2].weight.copy_(w["actor_w2"]); a_net[2].bias.copy_(w["actor_b2"])
        c_net[0].weight.copy_(w["critic_w1"]); c_net[0].bias.copy_(w["critic_b1"])
        c_net[2].weight.copy_(w["critic_w2"]); c_net[2].bias.copy_(w["critic_b2"])
    module = TensorDictSequential(
        TensorDictModule(a_net, in_keys=["observation"], out_keys=["param"]),
        TensorDictModule(NormalParamExtractor(), in_keys=["param"], out_keys=["loc", "scale"]),
    )
    if dist == "normal":
        actor = ProbabilisticActor(module, in_keys=["loc", "scale"], distribution_class=torch.distributions.Normal, return_log_prob=True)
    else:
        actor = ProbabilisticActor(module, in_keys=["loc", "scale"], distribution_class=TanhNormal,
                                   distribution_kwargs={"low": -1.0, "high": 1.0}, return_log_prob=True)
    critic = ValueOperator(c_net, in_keys=["observation"])
    params = {
        "actor_w1": a_net[0].weight, "actor_b1": a_net[0].bias, "actor_w2": a_net[2].weight, "actor_b2": a_net[2].bias,
        "critic_w1": c_net[0].weight, "critic_b1": c_net[0].bias, "critic_w2": c_net[2].weight, "critic_b2": c_net[2].bias,
    }
    # the batch: old log-probs are the current ones shifted, so that ratios spread around 1
    obs = torch.randn(B, OBS, generator=g)
    if dist == "normal":
        action = torch.randn(B, act_dim, generator=g)
    else:
        action = torch.rand(B, act_dim, generator=g) * 1.6 - 0.8
    td = TensorDict({"observation": obs, "action": action}, [B])
    with torch.no_grad():
        lp = actor.get_dist(td.clone()).log_prob(action)
    old_lp = lp + torch.randn(lp.shape, generator=g) * 0.3
    td["action_log_prob"] = old_lp
    td["advantage"] = torch.randn(B, 1, generator=g)
    td["value_target"] = torch.randn(B, 1, generator=g) * 1.5
    td["state_value"] = torch.randn(B, 1, generator=g) * 1.5  # the "old" values, for clip_value
    return w, actor, critic, params, td


def record(name, dist, act_dim, seed, kwargs):
    w, actor, critic, params, td = build(dist, act_dim, seed)
    loss = ClipPPOLoss(actor, critic, functional=False, **kwargs)
    out = loss(td.clone())
    total = sum(v.sum() for k, v in out.items() if k.startswith("loss_"))
    grads = torch.autograd.grad(total, list(params.values()), allow_unused=True)
    expect = {k: t2j(v) for k, v in out.items()}
    expect["grads"] = {
        k: t2j(g if g is not None else torch.zeros_like(p)) for (k, p), g in zip(params.items(), grads)
    }
    return {
        "name": name,
        "dist": dist,
        "act_dim": act_dim,
        "kwargs": kwargs,
        "weights": {k: t2j(v) for k, v in w.items()},
        "td": {k: t2j(td[k]) for k in ["observation", "action", "action_log_prob", "advantage", "value_target", "state_value"]},
        "expect": expect,
    }


CASES = [
    ("normal_defaults", "normal", 2, 0, {}),
    ("normal_eps_0.1", "normal", 2, 1, {"clip_epsilon": 0.1}),
    ("normal_no_clip", "normal", 2, 2, {"clip_epsilon": 0.99}),  # bounds (ln 0.01, ln 1.99) clip nothing here
    ("normal_norm_adv", "normal", 2, 3, {"normalize_advantage": True}),
    ("normal_l2", "normal", 2, 4, {"loss_critic_type": "l2", "critic_coeff": 0.5, "entropy_coeff": 0.05}),
    ("normal_clip_value", "normal", 2, 5, {"clip_value": 0.3}),
    ("normal_clip_value_l2_norm", "normal", 1, 6, {"clip_value": 0.5, "loss_critic_type": "l2", "normalize_advantage": True}),
    ("normal_sum", "normal", 2, 7, {"reduction": "sum"}),
    ("normal_none", "normal", 2, 8, {"reduction": "none", "clip_value": 0.2}),
    ("tanh_defaults", "tanh_normal", 2, 9, {"entropy_bonus": False}),
    ("tanh_norm_l2_clipv", "tanh_normal", 2, 10, {"entropy_bonus": False, "normalize_advantage": True,
                                                  "loss_critic_type": "l2", "clip_value": 0.25, "clip_epsilon": 0.15}),
]


def main():
    cases = [record(*c) for c in CASES]
    doc = {
        "generator": "specs/record_ppo.py",
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
