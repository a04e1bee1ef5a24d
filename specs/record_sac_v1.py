#!/usr/bin/env python
"""Record reference cases for TorchRL 0.14.1's SAC v1 loss: ``SACLoss(..., value_network=V)``
(a separate state-value network, as in the first SAC paper).

Run from the repository root:

    /root/.cache/torchrl-rs/venv/bin/python specs/record_sac_v1.py

It writes ``specs/sac_v1_cases.json`` (Rust never runs Python). Everything is float64 and
deterministic: weights and batches are drawn from ``torch.Generator().manual_seed(...)`` and
written out literally. Tensors are ``{"shape", "dtype", "data"}``, tensordicts
``{"batch_size", "entries"}`` (``record_offpolicy``'s ``t2j`` / ``td2j``).

Networks, names and batch are ``record_offpolicy.py``'s (its ``record_sac``): every network is
``Linear(in, 4) -> Tanh -> Linear(4, out)`` with weights ``l0.weight, l0.bias, l1.weight,
l1.bias`` (PyTorch layout ``[out, in]``):

- actor (no prefix): ``observation [6, 3] -> MLP(3, 2) -> NormalParamExtractor`` (loc, scale =
  ``softplus(x + inv_softplus(0.99)) + 0.01``, floored at 1e-4) ``-> TanhNormal(low=-1,
  high=1)``, ``return_log_prob=False``; 1-d action;
- Q ensemble (``qvalue.0.`` / ``qvalue.1.``, ``num_qvalue_nets=2``): ``cat(observation,
  action) -> MLP(4, 1) -> "state_action_value"``;
- value network (``value.``): ``observation -> MLP(3, 1) -> "state_value"``.

``weights`` holds the online weights, ``target_weights`` the target copies (all *different*
from the online ones): ``qvalue.<i>.*`` always (``delay_qvalue=True``, TorchRL's default),
``value.*`` when ``delay_value=True``, the actor's (no prefix) when ``delay_actor=True``.
Without a target copy TorchRL uses the online parameters, detached. The value estimator is
``TD0`` with ``gamma = 0.9`` (``loss.make_value_estimator(ValueEstimators.TD0, gamma=0.9)``);
``action_spec = Bounded(-1, 1, (1,))`` so ``target_entropy = -1``; loss_function
``smooth_l1``; ``log_alpha = ln(alpha_init)`` (a parameter with auto alpha, a buffer with
``fixed_alpha``).

Reparameterised noise: TorchRL draws exactly two standard-normal tensors of shape ``[6, 1]``
per forward (``torch``'s ``_standard_normal`` is patched to return the recorded rows ``eps``,
as in ``record_offpolicy.record_sac``):

- ``eps[0]``: ``value_loss``'s action, sampled from the actor with the **target** actor
  parameters (= online, detached, unless ``delay_actor``) on the current ``observation``;
- ``eps[1]``: ``actor_loss``'s action, sampled from the online actor on the current
  ``observation``.

(``qvalue_v1_loss`` runs first and draws nothing: it evaluates the actor-critic wrapper on the
next observation in DETERMINISTIC mode, and only the value net's output is used.) A sample is
``u = loc + scale * eps``, ``a = tanh(u)``, ``log_prob = sum(Normal(loc, scale).log_prob(u) -
log(1 - tanh(u)^2))`` over the action dim (TorchRL's TanhNormal), ``[6]``.

Loss formulas (``forward`` order: Q loss, value loss, actor loss, alpha loss; means over the
6 rows; ``alpha = exp(log_alpha)`` taken without gradient):

- ``loss_qvalue``: ``y = r + gamma * (1 - terminated) * V_target(s')`` (target value params,
  no gradient; ``done`` without ``terminated`` still bootstraps); the batch is split in
  ``num_qvalue_nets`` contiguous chunks, Q-net ``i`` (online) is trained on chunk ``i`` only
  (rows 0-2 -> ``qvalue.0``, rows 3-5 -> ``qvalue.1``) with the *stored* action:
  ``loss_qvalue = mean_rows(smooth_l1(Q_i(s, a), y))``; the priority written to the input is
  ``td_error = (Q_i(s, a) - y)^2`` per row (``[6]``, recorded as ``td_error``).
- ``loss_value``: ``a0, lp0`` from ``eps[0]`` (target actor), ``target = min_i Q_i^target(s,
  a0) - alpha * lp0`` (no gradient reaches anything: target actor params detached, target Q
  params are buffers), ``loss_value = mean(smooth_l1(V_online(s), target))`` -> gradient only
  to ``value.*``.
- ``loss_actor``: ``a1, lp1`` from ``eps[1]`` (online actor), ``loss_actor = mean(alpha * lp1
  - min_i Q_i(s, a1))`` with the *online* Q params detached -> gradient only to the actor.
- ``loss_alpha``: ``mean(-log_alpha * (lp1.detach() + target_entropy))`` -> gradient only to
  ``log_alpha`` (none with ``fixed_alpha``).
- ``alpha = exp(log_alpha)``, ``entropy = -mean(lp1)``.

Case layout (``"op": "sac_v1"``)::

    {"name", "op": "sac_v1",
     "args": {"gamma", "fixed_alpha", "alpha_init", "delay_value", "delay_actor",
              "num_qvalue_nets": 2, "loss_function": "smooth_l1", "target_entropy",
              "eps": [tensor [6, 1], tensor [6, 1]],
              "weights": {name: tensor}, "target_weights": {name: tensor}, "td": tensordict},
     "expect": {"loss_actor", "loss_qvalue", "loss_value", "loss_alpha", "alpha", "entropy",
                "td_error": [6],
                "grads": {loss term: {name: d term / d weight}},  # every online weight and
                                                                  # "log_alpha" (auto alpha);
                                                                  # zeros where unreached
                "reached": {loss term: [names with a gradient]}}}
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
from torchrl.data import Bounded  # noqa: E402
from torchrl.modules import ValueOperator  # noqa: E402
from torchrl.objectives import SACLoss, ValueEstimators  # noqa: E402

from record_offpolicy import (  # noqa: E402
    B,
    GAMMA,
    OBS,
    Noise,
    batch,
    critic,
    fill,
    mlp,
    outputs,
    rust_name,
    sac_actor,
    t2j,
    td2j,
)

torch.set_default_dtype(torch.float64)
HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "sac_v1_cases.json")
Q = ["qvalue.0.", "qvalue.1."]
TERMS = ["loss_actor", "loss_qvalue", "loss_value", "loss_alpha"]


def named_leaves(loss):
    """(name, tensor, copy index or None) for every online weight the loss trains."""
    out = []
    for key, p in loss.actor_network_params.items(True, True):
        out.append((rust_name(key), p, None))
    for key, p in loss.qvalue_network_params.items(True, True):
        for i, pre in enumerate(Q):
            out.append((pre + rust_name(key), p, i))
    for key, p in loss.value_network_params.items(True, True):
        out.append(("value." + rust_name(key), p, None))
    if isinstance(loss.log_alpha, torch.nn.Parameter):
        out.append(("log_alpha", loss.log_alpha, None))
    return out


def term_grads(term, leaves):
    uniq = []
    for _, p, _ in leaves:
        if not any(p is q for q in uniq):
            uniq.append(p)
    if term.requires_grad:
        gs = torch.autograd.grad(term, uniq, allow_unused=True, retain_graph=True)
    else:
        gs = [None] * len(uniq)
    by_id = {id(p): gr for p, gr in zip(uniq, gs)}
    grads, reached = {}, []
    for name, p, i in leaves:
        gr = by_id[id(p)]
        if gr is not None:
            reached.append(name)
            gr = gr if i is None else gr[i]
        else:
            gr = torch.zeros_like(p if i is None else p[i])
        grads[name] = t2j(gr)
    return grads, reached


def record(name, seed, fixed_alpha, alpha_init, delay_value, delay_actor=False):
    g = torch.Generator().manual_seed(seed)
    spec = Bounded(-1.0, 1.0, shape=(1,))
    vnet = ValueOperator(mlp(OBS, 1), in_keys=["observation"])
    loss = SACLoss(sac_actor(), critic(), value_network=vnet, action_spec=spec, num_qvalue_nets=2,
                   fixed_alpha=fixed_alpha, alpha_init=alpha_init, delay_value=delay_value,
                   delay_actor=delay_actor)
    assert loss._version == 1
    loss.make_value_estimator(ValueEstimators.TD0, gamma=GAMMA)
    weights, target = {}, {}
    fill(loss.actor_network_params, g, "", weights)
    if delay_actor:
        fill(loss.target_actor_network_params, g, "", target)
    fill(loss.value_network_params, g, "value.", weights)
    if delay_value:
        fill(loss.target_value_network_params, g, "value.", target)
    fill(loss.qvalue_network_params, g, None, weights, expand_names=Q)
    fill(loss.target_qvalue_network_params, g, None, target, expand_names=Q)
    td = batch(g, torch.rand(B, 1, generator=g) * 1.6 - 0.8)
    inp = td2j(td)
    leaves = named_leaves(loss)
    with Noise(g) as noise:
        out = loss(td)
    assert len(noise.drawn) == 2 and all(list(e.shape) == [B, 1] for e in noise.drawn), noise.drawn
    expect = outputs(out)
    expect["td_error"] = t2j(td["td_error"])
    expect["grads"], expect["reached"] = {}, {}
    for term in TERMS:
        expect["grads"][term], expect["reached"][term] = term_grads(out[term], leaves)
    return {"name": name, "op": "sac_v1",
            "args": {"gamma": GAMMA, "fixed_alpha": fixed_alpha, "alpha_init": alpha_init,
                     "delay_value": delay_value, "delay_actor": delay_actor, "num_qvalue_nets": 2,
                     "loss_function": "smooth_l1", "target_entropy": float(loss.target_entropy),
                     "eps": [t2j(e) for e in noise.drawn],
                     "weights": weights, "target_weights": target, "td": inp},
            "expect": expect}


CASES = [
    ("sac_v1_auto_alpha_delay_value", 70, False, 0.8, True),
    ("sac_v1_fixed_alpha_delay_value", 71, True, 0.5, True),
    ("sac_v1_auto_alpha_no_delay_value", 72, False, 1.0, False),
    ("sac_v1_fixed_alpha_no_delay_value", 73, True, 0.3, False),
    ("sac_v1_auto_alpha_delay_value_delay_actor", 74, False, 0.7, True, True),
]


def main():
    cases = [record(*c) for c in CASES]
    doc = {
        "generator": "specs/record_sac_v1.py",
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
