#!/usr/bin/env python
"""Record reference cases for the off-policy objectives of TorchRL 0.14.1.

Run from the repository root:

    /root/.cache/torchrl-rs/venv/bin/python specs/record_offpolicy.py

It writes ``specs/offpolicy_cases.json``, which ``tests/reference_offpolicy.rs`` replays
(Rust never runs Python). Everything is float64 and deterministic: weights and batches are
drawn from ``torch.Generator().manual_seed(...)`` and written out literally.

Networks are ``Linear(in, 4) -> Tanh -> Linear(4, out)``; their weights are named
``l0.weight``, ``l0.bias``, ``l1.weight``, ``l1.bias`` (PyTorch layout ``[out, in]``) and
prefixed as the Rust losses name them (``qvalue.<i>.``, ``actor.``, ``value.``). Online and
target copies are given *different* weights (``weights`` / ``target_weights``), so that the
cases check which copy each term uses. Critics over ``(observation, action)`` concatenate
their inputs.

Ops:

- ``dqn``: ``DQNLoss`` (plain / double, one-hot / categorical, l2 / smooth_l1, with or without
  ``priority_weight``): ``loss`` and the ``td_error`` priority.
- ``ddpg``: ``DDPGLoss``: every output term.
- ``td3``: ``TD3Loss`` with ``policy_noise=0`` (the smoothing noise is then exactly zero):
  every output term.
- ``sac``: ``SACLoss`` (v2; auto alpha or fixed alpha): every output term. The actor's
  reparameterised samples use recorded standard-normal noise ``eps`` (the next-state sample
  first, then the current-state one, as TorchRL draws them): ``torch``'s
  ``_standard_normal`` is patched to return them.
- ``discrete_sac``: ``DiscreteSACLoss`` (one-hot / categorical): every output term.
- ``soft_update`` / ``hard_update``: the target weights after ``n`` updater steps.
- ``td0`` / ``td1``: ``TD0Estimator`` / ``TD1Estimator`` targets and advantages on a
  ``[2, 4]`` batch with truncations and terminations.
"""

from __future__ import annotations

import json
import math
import os
import warnings

warnings.filterwarnings("ignore")
os.environ.setdefault("RL_WARNINGS", "0")

import torch  # noqa: E402
import torch.distributions.normal as tdn  # noqa: E402
import tensordict  # noqa: E402
import torchrl  # noqa: E402
from tensordict import TensorDict  # noqa: E402
from tensordict.nn import NormalParamExtractor, TensorDictModule, TensorDictSequential  # noqa: E402
from torchrl.data import Bounded, Categorical, OneHot  # noqa: E402
from torchrl.modules import ProbabilisticActor, QValueActor, TanhNormal, ValueOperator  # noqa: E402
from torchrl.modules.distributions import OneHotCategorical  # noqa: E402
from torchrl.objectives import (  # noqa: E402
    DDPGLoss,
    DiscreteSACLoss,
    DQNLoss,
    HardUpdate,
    SACLoss,
    SoftUpdate,
    TD3Loss,
    ValueEstimators,
)
from torchrl.objectives.value import TD0Estimator, TD1Estimator  # noqa: E402

torch.set_default_dtype(torch.float64)
HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "offpolicy_cases.json")
B, OBS, H, NA = 6, 3, 4, 2
GAMMA = 0.9

DTYPES = {torch.float64: "float64", torch.float32: "float32", torch.int64: "int64", torch.bool: "bool"}


def t2j(t):
    t = torch.as_tensor(t).detach()
    data = t.reshape(-1).tolist()
    return {"shape": list(t.shape), "dtype": DTYPES[t.dtype], "data": data}


def td2j(td):
    entries = {}
    for k, v in td.items():
        entries[k] = td2j(v) if isinstance(v, TensorDict) else t2j(v)
    return {"batch_size": list(td.batch_size), "entries": entries}


class Cat(torch.nn.Module):
    """Concatenates its inputs along the last dim before the MLP (a critic over (s, a))."""

    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, *xs):
        return self.net(torch.cat(xs, -1))


def mlp(n_in, n_out):
    return torch.nn.Sequential(torch.nn.Linear(n_in, H), torch.nn.Tanh(), torch.nn.Linear(H, n_out))


def rust_name(key):
    """("module", ..., "0", "weight") -> "l0.weight" (the Rust builder's names)."""
    idx, w = key[-2], key[-1]
    return {"0": "l0", "2": "l1"}[idx] + "." + w


def fill(params, g, prefix, out, expand_names=None, scale=0.6):
    """Overwrites every leaf of a parameter TensorDict with fixed values and records them.

    With ``expand_names`` (the Q-ensembles), the leading dim indexes the copies: copy ``i`` is
    recorded under ``expand_names[i]``.
    """
    for key, p in params.items(True, True):
        v = torch.randn(p.shape, generator=g) * scale
        p.data.copy_(v)
        key = key if isinstance(key, tuple) else (key,)
        name = rust_name(key)
        if expand_names is None:
            out[prefix + name] = t2j(v)
        else:
            for i, pre in enumerate(expand_names):
                out[pre + name] = t2j(v[i])


def batch(g, act, n=B):
    done = torch.tensor([False, True, False, True, False, False][:n]).unsqueeze(-1)
    term = torch.tensor([False, False, False, True, False, False][:n]).unsqueeze(-1)
    return TensorDict(
        {
            "observation": torch.randn(n, OBS, generator=g),
            "action": act,
            "next": {
                "observation": torch.randn(n, OBS, generator=g),
                "reward": torch.randn(n, 1, generator=g),
                "done": done,
                "terminated": term,
            },
        },
        [n],
    )


def outputs(td):
    return {k: t2j(v) for k, v in td.items() if isinstance(v, torch.Tensor)}


# ------------------------------------------------------------------------------- DQN

def record_dqn(name, seed, space, double, loss_function, weighted):
    g = torch.Generator().manual_seed(seed)
    spec = OneHot(NA) if space == "one_hot" else Categorical(NA)
    actor = QValueActor(mlp(OBS, NA), in_keys=["observation"], spec=spec)
    loss = DQNLoss(actor, action_space=spec, delay_value=True, double_dqn=double, loss_function=loss_function)
    loss.make_value_estimator(ValueEstimators.TD0, gamma=GAMMA)
    weights, target = {}, {}
    fill(loss.value_network_params, g, "", weights)
    fill(loss.target_value_network_params, g, "", target)
    idx = torch.randint(0, NA, (B,), generator=g)
    act = torch.nn.functional.one_hot(idx, NA) if space == "one_hot" else idx
    td = batch(g, act)
    if weighted:
        td["priority_weight"] = torch.rand(B, generator=g) + 0.5
    inp = td2j(td)
    out = loss(td)
    expect = outputs(out)
    expect["td_error"] = t2j(td["td_error"])
    return {
        "name": name,
        "op": "dqn",
        "args": {"space": space, "double_dqn": double, "loss_function": loss_function, "gamma": GAMMA,
                 "weights": weights, "target_weights": target, "td": inp},
        "expect": expect,
    }


# ---------------------------------------------------------------------------- DDPG / TD3

def det_actor():
    net = mlp(OBS, 1)
    return TensorDictSequential(TensorDictModule(net, ["observation"], ["param"]),
                                TensorDictModule(torch.tanh, ["param"], ["action"]))


def critic():
    return ValueOperator(Cat(mlp(OBS + 1, 1)), in_keys=["observation", "action"], out_keys=["state_action_value"])


def record_ddpg(name, seed):
    g = torch.Generator().manual_seed(seed)
    loss = DDPGLoss(det_actor(), critic(), delay_actor=True, delay_value=True)
    loss.make_value_estimator(ValueEstimators.TD0, gamma=GAMMA)
    weights, target = {}, {}
    fill(loss.actor_network_params, g, "actor.", weights)
    fill(loss.target_actor_network_params, g, "actor.", target)
    fill(loss.value_network_params, g, "value.", weights)
    fill(loss.target_value_network_params, g, "value.", target)
    td = batch(g, torch.rand(B, 1, generator=g) * 1.6 - 0.8)
    inp = td2j(td)
    out = loss(td)
    return {"name": name, "op": "ddpg",
            "args": {"gamma": GAMMA, "weights": weights, "target_weights": target, "td": inp},
            "expect": outputs(out)}


def record_td3(name, seed):
    g = torch.Generator().manual_seed(seed)
    spec = Bounded(-1.0, 1.0, shape=(1,))
    loss = TD3Loss(det_actor(), critic(), action_spec=spec, policy_noise=0.0, noise_clip=0.5)
    loss.make_value_estimator(ValueEstimators.TD0, gamma=GAMMA)
    weights, target = {}, {}
    fill(loss.actor_network_params, g, "actor.", weights)
    fill(loss.target_actor_network_params, g, "actor.", target)
    q = ["qvalue.0.", "qvalue.1."]
    fill(loss.qvalue_network_params, g, None, weights, expand_names=q)
    fill(loss.target_qvalue_network_params, g, None, target, expand_names=q)
    td = batch(g, torch.rand(B, 1, generator=g) * 1.6 - 0.8)
    inp = td2j(td)
    out = loss(td)
    return {"name": name, "op": "td3",
            "args": {"gamma": GAMMA, "weights": weights, "target_weights": target, "td": inp},
            "expect": outputs(out)}


# -------------------------------------------------------------------------------- SAC

class Noise:
    """Replaces torch's standard-normal draws by recorded ones."""

    def __init__(self, g):
        self.g = g
        self.drawn = []
        self.orig = tdn._standard_normal

    def __call__(self, shape, dtype=None, device=None):
        e = torch.randn(shape, generator=self.g)
        self.drawn.append(e.clone())
        return e.to(dtype or torch.get_default_dtype())

    def __enter__(self):
        tdn._standard_normal = self
        return self

    def __exit__(self, *a):
        tdn._standard_normal = self.orig


def sac_actor():
    net = mlp(OBS, 2)
    module = TensorDictSequential(
        TensorDictModule(net, ["observation"], ["param"]),
        TensorDictModule(NormalParamExtractor(), ["param"], ["loc", "scale"]),
    )
    return ProbabilisticActor(module, in_keys=["loc", "scale"], distribution_class=TanhNormal,
                              distribution_kwargs={"low": -1.0, "high": 1.0}, return_log_prob=False)


def record_sac(name, seed, fixed_alpha, alpha_init):
    g = torch.Generator().manual_seed(seed)
    spec = Bounded(-1.0, 1.0, shape=(1,))
    loss = SACLoss(sac_actor(), critic(), action_spec=spec, fixed_alpha=fixed_alpha, alpha_init=alpha_init)
    loss.make_value_estimator(ValueEstimators.TD0, gamma=GAMMA)
    weights, target = {}, {}
    fill(loss.actor_network_params, g, "", weights)
    q = ["qvalue.0.", "qvalue.1."]
    fill(loss.qvalue_network_params, g, None, weights, expand_names=q)
    fill(loss.target_qvalue_network_params, g, None, target, expand_names=q)
    td = batch(g, torch.rand(B, 1, generator=g) * 1.6 - 0.8)
    inp = td2j(td)
    with Noise(g) as noise:
        out = loss(td)
    return {"name": name, "op": "sac",
            "args": {"gamma": GAMMA, "fixed_alpha": fixed_alpha, "alpha_init": alpha_init,
                     "target_entropy": float(loss.target_entropy),
                     "eps": [t2j(e) for e in noise.drawn],
                     "weights": weights, "target_weights": target, "td": inp},
            "expect": outputs(out)}


def record_discrete_sac(name, seed, space):
    g = torch.Generator().manual_seed(seed)
    module = TensorDictModule(mlp(OBS, NA), ["observation"], ["logits"])
    if space == "one_hot":
        actor = ProbabilisticActor(module, in_keys=["logits"], distribution_class=OneHotCategorical)
    else:
        actor = ProbabilisticActor(module, in_keys=["logits"], distribution_class=torch.distributions.Categorical)
    qnet = ValueOperator(mlp(OBS, NA), in_keys=["observation"], out_keys=["action_value"])
    spec = OneHot(NA) if space == "one_hot" else Categorical(NA)
    loss = DiscreteSACLoss(actor, qnet, action_space=spec, num_actions=NA)
    loss.make_value_estimator(ValueEstimators.TD0, gamma=GAMMA)
    weights, target = {}, {}
    fill(loss.actor_network_params, g, "", weights)
    q = ["qvalue.0.", "qvalue.1."]
    fill(loss.qvalue_network_params, g, None, weights, expand_names=q)
    fill(loss.target_qvalue_network_params, g, None, target, expand_names=q)
    idx = torch.randint(0, NA, (B,), generator=g)
    act = torch.nn.functional.one_hot(idx, NA) if space == "one_hot" else idx
    td = batch(g, act)
    inp = td2j(td)
    out = loss(td)
    return {"name": name, "op": "discrete_sac",
            "args": {"gamma": GAMMA, "space": space, "target_entropy": float(loss.target_entropy),
                     "weights": weights, "target_weights": target, "td": inp},
            "expect": outputs(out)}


# -------------------------------------------------------------------------- updaters

def record_updater(name, seed, kind, n, param):
    g = torch.Generator().manual_seed(seed)
    actor = QValueActor(mlp(OBS, NA), in_keys=["observation"], spec=OneHot(NA))
    loss = DQNLoss(actor, action_space="one-hot", delay_value=True)
    weights = {}
    fill(loss.value_network_params, g, "", weights)
    if kind == "soft":
        up = SoftUpdate(loss, tau=param)
    else:
        up = HardUpdate(loss, value_network_update_interval=param)
    # after init_ the targets equal the online weights; move the online weights each step
    steps = []
    for i in range(n):
        with torch.no_grad():
            for _, p in loss.value_network_params.items(True, True):
                p.data.add_(torch.randn(p.shape, generator=g) * 0.1)
        online = {}
        for key, p in loss.value_network_params.items(True, True):
            online[rust_name(key if isinstance(key, tuple) else (key,))] = t2j(p.data.clone())
        up.step()
        tgt = {}
        for key, p in loss.target_value_network_params.items(True, True):
            tgt[rust_name(key if isinstance(key, tuple) else (key,))] = t2j(p.data.clone())
        steps.append({"online": online, "target": tgt})
    return {"name": name, "op": kind + "_update", "args": {"param": param, "weights": weights, "steps": steps},
            "expect": {}}


# ------------------------------------------------------------------------ TD0 / TD1

def record_estimator(name, seed, which):
    g = torch.Generator().manual_seed(seed)
    shape = (2, 4, 1)
    done = torch.tensor([[False, True, False, True], [False, False, True, False]]).unsqueeze(-1)
    term = torch.tensor([[False, False, False, True], [False, False, True, False]]).unsqueeze(-1)
    td = TensorDict({
        "state_value": torch.randn(shape, generator=g),
        "next": {"state_value": torch.randn(shape, generator=g), "reward": torch.randn(shape, generator=g),
                 "done": done, "terminated": term},
    }, [2, 4])
    inp = td2j(td)
    est = TD0Estimator(gamma=GAMMA, value_network=None) if which == "td0" else TD1Estimator(gamma=GAMMA, value_network=None)
    out = est(td.clone())
    vt = est.value_estimate(td.clone())
    return {"name": name, "op": which, "args": {"gamma": GAMMA, "td": inp},
            "expect": {"advantage": t2j(out["advantage"]), "value_target": t2j(out["value_target"]),
                       "value_estimate": t2j(vt)}}


def main():
    cases = [
        record_dqn("dqn_onehot_l2", 1, "one_hot", False, "l2", False),
        record_dqn("dqn_categorical_smooth_l1", 2, "categorical", False, "smooth_l1", False),
        record_dqn("dqn_double_categorical", 3, "categorical", True, "l2", False),
        record_dqn("dqn_double_onehot_weighted", 4, "one_hot", True, "l2", True),
        record_ddpg("ddpg", 10),
        record_td3("td3_no_noise", 20),
        record_sac("sac_auto_alpha", 30, False, 1.0),
        record_sac("sac_fixed_alpha", 31, True, 0.5),
        record_discrete_sac("discrete_sac_onehot", 40, "one_hot"),
        record_discrete_sac("discrete_sac_categorical", 41, "categorical"),
        record_updater("soft_update_tau_0.2", 50, "soft", 3, 0.2),
        record_updater("hard_update_interval_2", 51, "hard", 5, 2),
        record_estimator("td0", 60, "td0"),
        record_estimator("td1", 61, "td1"),
    ]
    doc = {
        "generator": "specs/record_offpolicy.py",
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
