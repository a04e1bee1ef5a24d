#!/usr/bin/env python
"""Record reference cases for ``advantage_norm=`` (a stateful ``ValueNorm``) in TorchRL
0.14.1's ``A2CLoss`` and ``ClipPPOLoss``.

Run from the repository root:

    /root/.cache/torchrl-rs/venv/bin/python specs/record_advantage_norm.py

It writes ``specs/advantage_norm_cases.json`` (Rust never runs Python). Everything is float64
and deterministic (seeded ``torch.Generator``s, values written out literally). Tensors are
``{"shape", "dtype", "data"}``, tensordicts ``{"batch_size", "entries"}`` (nested; both from
``record_offpolicy``'s ``t2j`` / ``td2j``).

Networks and weights are ``record_ppo.build``'s (``"normal"`` actor, per-dim log-prob, for
PPO) and ``record_a2c.build_categorical``'s (``Categorical`` over ``2 * act_dim`` logits, for
A2C); weight names ``actor_w1, actor_b1, actor_w2, actor_b2, critic_w1, critic_b1,
critic_w2, critic_b2`` (PyTorch ``Linear`` layout). The losses are built with
``functional=False`` like ``record_ppo`` / ``record_a2c``, with default coefficients
(A2C: entropy_coeff 0.01, critic_coeff 1.0, smooth_l1; PPO: clip 0.2, entropy_coeff 0.01,
critic_coeff 1.0, smooth_l1) plus the case's ``kwargs``. Batches are ``[6]`` (one trajectory:
the time dim is the batch dim) and are drawn per call (the weights do not change between
calls).

Case layout (``"op": "loss"``)::

    {"name", "op": "loss", "loss": "a2c" | "ppo", "dist": "categorical" | "normal",
     "act_dim", "kwargs": {loss kwargs other than advantage_norm},
     "norm": {"class", "kwargs"},            # the ValueNorm passed as advantage_norm
     "training": bool,                       # False: loss.eval() before the calls
     "estimator": {"type": "GAE", "gamma": 0.99, "lmbda": 0.95},  # the loss's default one
     "weights": {name: tensor},
     "pre_update": tensor | null,            # norm.update(pre_update) before the first call
     "initial_state": {buffer: tensor},      # the norm's state_dict before the first call
     "calls": [                              # two consecutive forward calls
        {"td": tensordict,                   # the input
         "estimated": {"advantage", "value_target"} | null,
                                             # what the loss's GAE writes (advantage absent)
         "expect": {every output of the loss (loss_*, entropy, ESS, clip_fraction, ...),
                    "grads": {weight name: d(sum of the loss_* outputs)/d weight}},
         "norm_state": {buffer: tensor},     # the norm's state_dict after the call
         "scale": tensor}                    # norm.scale() after the call (= the divisor)
     ]}

Semantics (TorchRL ``_scale_advantage``): if the input has no ``"advantage"``, the loss runs
its value estimator (GAE, gamma 0.99, lmbda 0.95, critic evaluated without gradient on
``observation`` and ``("next", "observation")``), which writes ``advantage`` and
``value_target = advantage + V(s)``; then, *only in that case and only in training mode*,
``norm.update(value_target[valid])`` where ``valid`` is the AND of the validity masks found
in the input (``("collector", "mask")``, ``"shifted_valid"``; trailing singleton dims squeezed;
no mask: all rows; here ``value_target`` is ``[6, 1]`` so the update sees ``[k, 1]``). In every
case (update or not) the advantage used by the objective is ``advantage / norm.scale()``
(no re-centering). An input that already carries ``"advantage"`` never updates the norm.
The critic loss is unaffected (it regresses on the unnormalised ``value_target``). With a
``("collector", "mask")`` the ``loss_*`` means are over the valid rows only
(``sum(where(mask, loss, 0)) / max(sum(mask), 1)``).

Other ops:

- ``"ctor_error"``: ``{"name", "op", "loss", "kwargs", "norm", "error"}``: building the loss
  with ``kwargs`` and ``advantage_norm=<norm>`` raises ``ValueError`` containing ``error``
  (``ClipPPOLoss(normalize_advantage=True, advantage_norm=...)``).
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
from torchrl.modules.value_norm import PercentileValueNorm, RunningValueNorm  # noqa: E402
from torchrl.objectives import A2CLoss, ClipPPOLoss  # noqa: E402

from record_a2c import build_categorical  # noqa: E402
from record_offpolicy import t2j, td2j  # noqa: E402
from record_ppo import B, OBS, build  # noqa: E402

torch.set_default_dtype(torch.float64)
HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "advantage_norm_cases.json")
NORMS = {"RunningValueNorm": RunningValueNorm, "PercentileValueNorm": PercentileValueNorm}
DONE = [False, True, False, False, False, True]
TERM = [False, True, False, False, False, False]


def make_batch(g, loss_name, actor, act_dim, with_adv, mask):
    """A fresh ``[B]`` batch: one trajectory (a termination at row 1, a truncation at the
    last row), with ``advantage`` / ``value_target`` (and PPO's old ``state_value``) when
    ``with_adv``, else the ``next`` entries GAE needs."""
    obs = torch.randn(B, OBS, generator=g)
    if loss_name == "a2c":
        action = torch.randint(0, 2 * act_dim, (B,), generator=g)
    else:
        action = torch.randn(B, act_dim, generator=g)
    td = TensorDict({"observation": obs, "action": action}, [B])
    if loss_name == "ppo":
        with torch.no_grad():
            lp = actor.get_dist(td.clone()).log_prob(action)
        td["action_log_prob"] = lp + torch.randn(lp.shape, generator=g) * 0.3
    if with_adv:
        td["advantage"] = torch.randn(B, 1, generator=g) * 2.0
        td["value_target"] = torch.randn(B, 1, generator=g) * 1.5
    else:
        td["next"] = TensorDict({
            "observation": torch.randn(B, OBS, generator=g),
            "reward": torch.randn(B, 1, generator=g) * 1.5 + 0.5,
            "done": torch.tensor(DONE).unsqueeze(-1),
            "terminated": torch.tensor(TERM).unsqueeze(-1),
        }, [B])
    if mask is not None:
        td["collector"] = TensorDict({"mask": torch.tensor(mask)}, [B])
    return td


def state_of(norm):
    return {k: t2j(v) for k, v in norm.state_dict().items()}


def record(name, loss_name, act_dim, seed, kwargs, norm_cls, norm_kwargs, with_adv,
           pre_update=False, training=True, mask=None):
    if loss_name == "a2c":
        dist = "categorical"
        w, actor, critic, params, _ = build_categorical(act_dim, seed)
    else:
        dist = "normal"
        w, actor, critic, params, _ = build("normal", act_dim, seed)
    norm = NORMS[norm_cls](**norm_kwargs)
    cls = A2CLoss if loss_name == "a2c" else ClipPPOLoss
    loss = cls(actor, critic, functional=False, advantage_norm=norm, **kwargs)
    if not training:
        loss.eval()
    g = torch.Generator().manual_seed(seed + 500)
    pre = None
    if pre_update:
        pre = torch.randn(8, 1, generator=g) * 2.5 + 1.0
        norm.update(pre)
    initial = state_of(norm)
    calls = []
    for _ in range(2):
        td = make_batch(g, loss_name, actor, act_dim, with_adv, mask)
        estimated = None
        if not with_adv:
            tmp = td.clone()
            with torch.no_grad():
                loss.value_estimator(tmp)
            estimated = {"advantage": t2j(tmp["advantage"]), "value_target": t2j(tmp["value_target"])}
        before = {k: v.clone() for k, v in norm.state_dict().items()}
        out = loss(td.clone())
        updated = any(not torch.equal(v, before[k]) for k, v in norm.state_dict().items())
        assert updated == (not with_adv and training), (name, updated)
        total = sum(v.sum() for k, v in out.items() if k.startswith("loss_"))
        grads = torch.autograd.grad(total, list(params.values()), allow_unused=True)
        expect = {k: t2j(v.detach()) for k, v in out.items()}
        expect["grads"] = {
            k: t2j(gr if gr is not None else torch.zeros_like(p)) for (k, p), gr in zip(params.items(), grads)
        }
        calls.append({"td": td2j(td), "estimated": estimated, "expect": expect,
                      "norm_state": state_of(norm), "scale": t2j(norm.scale())})
    return {
        "name": name,
        "op": "loss",
        "loss": loss_name,
        "dist": dist,
        "act_dim": act_dim,
        "kwargs": kwargs,
        "norm": {"class": norm_cls, "kwargs": norm_kwargs},
        "training": training,
        "estimator": {"type": "GAE", "gamma": 0.99, "lmbda": 0.95},
        "weights": {k: t2j(v) for k, v in w.items()},
        "pre_update": None if pre is None else t2j(pre),
        "initial_state": initial,
        "calls": calls,
    }


def record_ctor_error(name, loss_name, kwargs, norm_cls, norm_kwargs, msg):
    _, actor, critic, _, _ = build("normal", 2, 0)
    cls = A2CLoss if loss_name == "a2c" else ClipPPOLoss
    try:
        cls(actor, critic, functional=False, advantage_norm=NORMS[norm_cls](**norm_kwargs), **kwargs)
    except ValueError as e:
        assert msg in str(e), (str(e), msg)
    else:
        raise AssertionError(f"{name}: no error")
    return {"name": name, "op": "ctor_error", "loss": loss_name, "kwargs": kwargs,
            "norm": {"class": norm_cls, "kwargs": norm_kwargs}, "error": msg}


PCT = {"rate": 0.5, "min_scale": 0.1}
LOSS_CASES = [
    # (name, loss, act_dim, seed, kwargs, norm class, norm kwargs, advantage given, extra)
    ("a2c_running_estimated", "a2c", 2, 200, {}, "RunningValueNorm", {}, False, {}),
    ("a2c_percentile_estimated", "a2c", 2, 201, {}, "PercentileValueNorm", PCT, False, {}),
    ("a2c_running_given", "a2c", 2, 202, {}, "RunningValueNorm", {}, True, {"pre_update": True}),
    ("a2c_percentile_given", "a2c", 2, 203, {"entropy_coeff": 0.05}, "PercentileValueNorm", PCT, True,
     {"pre_update": True}),
    ("a2c_running_estimated_eval", "a2c", 2, 204, {}, "RunningValueNorm", {}, False,
     {"pre_update": True, "training": False}),
    ("a2c_running_estimated_collector_mask", "a2c", 2, 205, {}, "RunningValueNorm", {}, False,
     {"mask": [True, True, False, True, False, True]}),
    ("ppo_running_estimated", "ppo", 2, 210, {}, "RunningValueNorm", {}, False, {}),
    ("ppo_percentile_estimated", "ppo", 2, 211, {"loss_critic_type": "l2"}, "PercentileValueNorm", PCT, False, {}),
    ("ppo_running_given", "ppo", 2, 212, {"clip_epsilon": 0.1}, "RunningValueNorm", {}, True, {"pre_update": True}),
    ("ppo_percentile_given", "ppo", 2, 213, {}, "PercentileValueNorm", PCT, True, {"pre_update": True}),
]

ERROR_CASES = [
    ("ppo_normalize_advantage_and_norm", "ppo", {"normalize_advantage": True}, "RunningValueNorm", {},
     "normalize_advantage=True and advantage_norm are mutually exclusive"),
    ("ppo_normalize_advantage_and_percentile", "ppo", {"normalize_advantage": True}, "PercentileValueNorm", PCT,
     "normalize_advantage=True and advantage_norm are mutually exclusive"),
]


def main():
    cases = [record(*c[:8], **c[8]) for c in LOSS_CASES] + [record_ctor_error(*c) for c in ERROR_CASES]
    doc = {
        "generator": "specs/record_advantage_norm.py",
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
