#!/usr/bin/env python
"""Record reference cases for TorchRL 0.14.1's ``ReinforceLoss(delay_value=...)`` (a target
copy of the critic) and its ``SoftUpdate``.

Run from the repository root:

    /root/.cache/torchrl-rs/venv/bin/python specs/record_reinforce_delay.py

It writes ``specs/reinforce_delay_cases.json`` (Rust never runs Python). Everything is float64
and deterministic (seeded ``torch.Generator``s, values written out literally). Tensors are
``{"shape", "dtype", "data"}``, tensordicts ``{"batch_size", "entries"}`` (nested; from
``record_offpolicy``'s ``t2j`` / ``td2j``).

Networks, weights and names are ``record_a2c.py``'s (``record_ppo.build`` /
``record_a2c.build_categorical``): a ``Categorical`` actor (the actor MLP's ``2 * act_dim``
outputs as logits, int64 actions, ``[B]`` log-prob) or a per-dim ``Normal`` actor (``[B, A]``
log-prob), and the critic ``Linear(3, 4) -> Tanh -> Linear(4, 1) -> "state_value"``; weight
names ``actor_w1, actor_b1, actor_w2, actor_b2, critic_w1, critic_b1, critic_w2, critic_b2``.
``delay_value`` needs ``functional=True`` (TorchRL's default), so these losses are functional;
the target copy is TorchRL's ``loss.target_critic_network_params`` (a buffer copy, never
trained), recorded under ``target_weights`` with the critic's names and given values
*different* from the online critic's.

The batch is ``[6]``, one trajectory (the time dim is the batch dim): ``observation``,
``action``, ``next: {observation, reward, done, terminated}`` with a termination at row 1 and
a truncation (done, not terminated) at rows 3 and 5. It carries no ``advantage``, so the loss
runs its value estimator.

Case layout (``"op": "loss"``)::

    {"name", "op": "loss", "loss": "reinforce", "dist", "act_dim",
     "kwargs": {"delay_value": bool, ...},   # ReinforceLoss kwargs (functional=True)
     "estimator": {"type": "GAE", "gamma": 0.99, "lmbda": 0.95} | {"type": "TD0", "gamma": 0.9},
     "weights": {name: tensor}, "target_weights": {critic name: tensor} (delay_value only),
     "td": tensordict,
     "expect": {"loss_actor", "loss_value",
                "advantage", "value_target",         # what the estimator wrote, [6, 1]
                "state_value", "next_state_value",   # the V(s) / V(s') it used, [6, 1]
                "grads": {name: d(loss_actor + loss_value)/d weight}},
     "soft_update": {"tau": 0.1, "target_after": {critic name: tensor}}   (delay_value only)}

Semantics: the estimator evaluates ``V(s)`` with the *online* critic parameters detached and
``V(s')`` with ``target_critic_network_params`` (with ``delay_value=False``: the online
parameters, detached). GAE (gamma, lmbda): ``delta_t = r_t + gamma * (1 - terminated_t) *
V(s'_t) - V(s_t)``, ``A_t = delta_t + gamma * lmbda * (1 - done_t) * A_{t+1}`` (from the last
row back, ``A_6 = 0``), ``value_target = A + V(s)``. TD0: ``value_target = r + gamma *
(1 - terminated) * V(s')``, ``A = value_target - V(s)``. Then ``loss_actor = mean(-log_prob *
A)`` (``A`` detached; a ``[B]`` log-prob is unsqueezed to ``[B, 1]``, a per-dim ``[B, A]`` one
broadcasts against ``[B, 1]``) and ``loss_value = mean(smooth_l1(value_target, V_online(s)))``
with gradient through ``V_online(s)`` only (the target, built from detached / target values,
carries none). So ``delay_value`` changes only the bootstrap ``V(s')``; the value loss always
regresses the *online* critic. ``SoftUpdate(loss, tau)``: its constructor copies the online
critic into the target (``init_``); the recorder then overwrites the target with
``target_weights``, runs the loss, and calls ``step()`` once:
``target <- target + tau * (online - target)`` (``lerp_``); ``target_after`` is the result.

Other ops (``{"name", "op", "kwargs", "error"}``, the message contains ``error``):

- ``"ctor_error"``: ``ReinforceLoss(actor, critic, functional=False, delay_value=True)``
  raises ``RuntimeError``.
- ``"updater_error"``: ``SoftUpdate(ReinforceLoss(..., delay_value=False), tau=0.1)`` raises
  ``RuntimeError`` (no target parameters).
"""

from __future__ import annotations

import json
import os
import sys
import warnings

warnings.filterwarnings("ignore")
os.environ.setdefault("RL_WARNINGS", "0")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import tensordict  # noqa: E402
import torchrl  # noqa: E402
from tensordict import TensorDict  # noqa: E402
from torchrl.objectives import ReinforceLoss, SoftUpdate, ValueEstimators  # noqa: E402

from record_a2c import build_categorical  # noqa: E402
from record_offpolicy import t2j, td2j  # noqa: E402
from record_ppo import B, OBS, build  # noqa: E402

torch.set_default_dtype(torch.float64)
HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "reinforce_delay_cases.json")
TAU = 0.1
# TorchRL's key of each critic parameter inside ``(target_)critic_network_params``
CRITIC_KEYS = {
    ("module", "0", "weight"): "critic_w1",
    ("module", "0", "bias"): "critic_b1",
    ("module", "2", "weight"): "critic_w2",
    ("module", "2", "bias"): "critic_b2",
}


def make_batch(g, dist, act_dim):
    td = TensorDict({"observation": torch.randn(B, OBS, generator=g)}, [B])
    if dist == "categorical":
        td["action"] = torch.randint(0, 2 * act_dim, (B,), generator=g)
    else:
        td["action"] = torch.randn(B, act_dim, generator=g)
    td["next"] = TensorDict({
        "observation": torch.randn(B, OBS, generator=g),
        "reward": torch.randn(B, 1, generator=g) * 1.5 + 0.3,
        "done": torch.tensor([False, True, False, True, False, True]).unsqueeze(-1),
        "terminated": torch.tensor([False, True, False, False, False, False]).unsqueeze(-1),
    }, [B])
    return td


def critic_params(tdp):
    return {CRITIC_KEYS[k]: v for k, v in tdp.items(True, True)}


def record(name, dist, act_dim, seed, delay_value, estimator, kwargs=None):
    kwargs = dict(kwargs or {})
    if dist == "categorical":
        w, actor, critic, params, _ = build_categorical(act_dim, seed)
    else:
        w, actor, critic, params, _ = build(dist, act_dim, seed)
    loss = ReinforceLoss(actor, critic, delay_value=delay_value, **kwargs)
    if estimator["type"] == "TD0":
        loss.make_value_estimator(ValueEstimators.TD0, gamma=estimator["gamma"])
    # the loss holds the very Parameter objects of the modules ``build`` filled
    for k, p in critic_params(loss.critic_network_params).items():
        assert p is params[k], k
    g = torch.Generator().manual_seed(seed + 700)  # the target weights
    updater = SoftUpdate(loss, tau=TAU) if delay_value else None  # init_: target <- online
    target = None
    if delay_value:
        target = {}
        with torch.no_grad():
            for k, p in critic_params(loss.target_critic_network_params).items():
                v = params[k].detach() + torch.randn(p.shape, generator=g) * 0.5
                p.copy_(v)
                target[k] = t2j(v)
    # the batch has its own generator: same seed, same batch with or without the target copy
    td = make_batch(torch.Generator().manual_seed(seed + 800), dist, act_dim)
    inp = td2j(td)
    work = td.clone()
    out = loss(work)  # ReinforceLoss writes the estimator's outputs into its input
    total = sum(v.sum() for k, v in out.items() if k.startswith("loss_"))
    grads = torch.autograd.grad(total, list(params.values()), allow_unused=True)
    expect = {k: t2j(v.detach()) for k, v in out.items()}
    for k in ("advantage", "value_target", "state_value"):
        expect[k] = t2j(work[k].detach())
    expect["next_state_value"] = t2j(work["next", "state_value"].detach())
    expect["grads"] = {
        k: t2j(gr if gr is not None else torch.zeros_like(p)) for (k, p), gr in zip(params.items(), grads)
    }
    case = {
        "name": name,
        "op": "loss",
        "loss": "reinforce",
        "dist": dist,
        "act_dim": act_dim,
        "kwargs": {"delay_value": delay_value, **kwargs},
        "estimator": estimator,
        "weights": {k: t2j(v) for k, v in w.items()},
    }
    if target is not None:
        case["target_weights"] = target
    case["td"] = inp
    case["expect"] = expect
    if updater is not None:
        updater.step()
        case["soft_update"] = {
            "tau": TAU,
            "target_after": {k: t2j(v.detach().clone()) for k, v in
                             critic_params(loss.target_critic_network_params).items()},
        }
    return case


def record_errors():
    _, actor, critic, _, _ = build_categorical(2, 0)
    cases = []
    msg = "delay_value and ~functional are incompatible"
    try:
        ReinforceLoss(actor, critic, functional=False, delay_value=True)
    except RuntimeError as e:
        assert msg in str(e), str(e)
    else:
        raise AssertionError("no error")
    cases.append({"name": "delay_value_not_functional", "op": "ctor_error",
                  "kwargs": {"functional": False, "delay_value": True}, "error": msg})
    msg = "Did not find any target parameters or buffers in the loss module."
    try:
        SoftUpdate(ReinforceLoss(actor, critic, delay_value=False), tau=TAU)
    except RuntimeError as e:
        assert msg in str(e), str(e)
    else:
        raise AssertionError("no error")
    cases.append({"name": "soft_update_without_delay_value", "op": "updater_error",
                  "kwargs": {"delay_value": False}, "error": msg})
    return cases


GAE = {"type": "GAE", "gamma": 0.99, "lmbda": 0.95}
TD0 = {"type": "TD0", "gamma": 0.9}
CASES = [
    # same seed: same online weights and batch, with and without the target copy
    ("categorical_gae_delay", "categorical", 2, 40, True, GAE),
    ("categorical_gae_no_delay", "categorical", 2, 40, False, GAE),
    ("normal_td0_delay", "normal", 2, 41, True, TD0),
    ("normal_td0_no_delay", "normal", 2, 41, False, TD0),
    ("categorical_gae_delay_l2_sum", "categorical", 1, 42, True, GAE, {"loss_critic_type": "l2", "reduction": "sum"}),
]


def main():
    cases = [record(*c) for c in CASES] + record_errors()
    doc = {
        "generator": "specs/record_reinforce_delay.py",
        "versions": {"torch": torch.__version__, "torchrl": torchrl.__version__, "tensordict": tensordict.__version__},
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
