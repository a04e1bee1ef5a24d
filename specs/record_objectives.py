#!/usr/bin/env python
"""Record reference cases for the objectives: the reward-model loss, GAE, TD(lambda), set_keys.

Run from the repository root:

    /root/.cache/torchrl-rs/venv/bin/python specs/record_objectives.py

It writes ``specs/objective_cases.json``, which ``tests/objectives.rs`` replays (Rust never
runs Python). The output is deterministic: every input is written out literally below or drawn
from ``torch.Generator().manual_seed(...)``, and recorded as it was run.

Where the numbers come from
---------------------------
- **Reward model.** TorchRL 0.14.1 does not ship ``RewardModelLoss`` (it lives in the open
  pytorch/rl PR #3923 as ``torchrl/objectives/llm/reward.py``). The seed document
  ``shared/seeds/001_2ce674d23ff153d3.txt`` is that file's source, which lost its indentation;
  it is re-indented below, statement for statement, as ``reward_model_loss`` /
  ``RewardModelLossOutput`` / ``RewardModelLoss``. The class subclasses TorchRL 0.14.1's real
  ``LossModule``, so ``set_keys`` (unknown key -> ValueError, ``None`` -> default) is TorchRL's
  own code.
- **Value estimators.** TorchRL 0.14.1 itself: ``generalized_advantage_estimate`` and
  ``td_lambda_return_estimate`` from ``torchrl.objectives.value.functional``, and the ``GAE`` /
  ``TDLambdaEstimator`` modules (``set_keys`` included).

Case layout (one per line)::

    {"name": ..., "op": ..., "args": {...}, "expect": {...} | {"error": {...}}}

ops:
- ``reward_model_loss_fn``: args ``chosen``, ``rejected`` (tensors), ``reduction`` (string);
  expect ``out`` and ``grads`` (of ``out.sum()`` w.r.t. ``chosen`` / ``rejected``).
- ``reward_model_loss``: args ``td`` (a tensordict), ``reduction``, ``center_coeff``
  (number or null), ``set_keys`` (list of ``[name, key | null]`` applied in order before the
  call), ``score_network`` (null, or ``{"in_key": key, "out": [[out_key, weight], ...]}``: a
  network writing ``out_key = td[in_key] @ weight`` for each pair), ``grad_leaves`` (keys of
  ``td`` leaves to differentiate w.r.t.); expect ``loss_reward_model``, ``loss_center``
  (tensor or null), ``accuracy``, ``in_keys``, and ``grads``: the gradients of
  ``(loss_reward_model + loss_center).sum()`` w.r.t. the ``grad_leaves`` (by key, joined with
  ``/``) and the network weights (``weight:<out_key>``).
- ``reward_model_ctor``: args ``reduction``, ``center_coeff``; expect an error.
- ``loss_set_keys``: args ``calls`` (a list of ``set_keys`` calls, each a list of
  ``[name, key | null]``); expect ``steps``: after each call either ``{"tensor_keys": {...},
  "in_keys": [...]}`` or ``{"error": ...}`` (the loss is unchanged by a failed call).
- ``gae_fn``: args ``gamma``, ``lmbda``, ``state_value``, ``next_state_value``, ``reward``,
  ``done``, ``terminated`` (or null), ``time_dim``; expect ``advantage``, ``value_target``.
- ``td_lambda_fn``: args ``gamma``, ``lmbda``, ``state_value``, ``next_state_value``,
  ``reward``, ``done``, ``terminated`` (or null), ``time_dim``; expect ``returns`` and
  ``advantage`` (``returns - state_value``).
- ``gae_module`` / ``td_lambda_module``: args ``gamma``, ``lmbda``, ``average`` (``average_gae``
  / ``average_rewards``), ``set_keys``, ``value_network`` (null, or ``{"in_key": key,
  "weight": [F] tensor, "bias": number}``: ``Linear(F, 1)``), ``td``; expect ``td``: the
  entries the module wrote (advantage, value_target, and with a network the values).
- ``estimator_set_keys``: args ``estimator`` (``"GAE"``), ``pairs``; expect an error.

Tensors are ``{"shape", "dtype", "data"}`` (row-major; float32 values written as the exact
double). Tensordicts are ``{"batch_size", "entries"}``; keys are lists of strings. Errors are
``{"class", "message", "facts"}``: ``facts`` are substrings the Rust message must contain.
"""

from __future__ import annotations

import json
import math
import os
import platform
import re
import sys
import warnings
from typing import Literal

warnings.filterwarnings("ignore")
os.environ.setdefault("RL_WARNINGS", "0")

import tensordict  # noqa: E402
import torch  # noqa: E402
import torchrl  # noqa: E402
from tensordict import NestedKey, TensorClass, TensorDict, TensorDictBase  # noqa: E402
from tensordict.nn import TensorDictModule  # noqa: E402
from torchrl.objectives.common import LossModule  # noqa: E402
from torchrl.objectives.value import GAE, TDLambdaEstimator  # noqa: E402
from torchrl.objectives.value.functional import (  # noqa: E402
    generalized_advantage_estimate,
    td_lambda_return_estimate,
)

from dataclasses import dataclass  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "objective_cases.json")
GENERATOR = "specs/record_objectives.py"

NOTES = {
    "reward_model": "TorchRL 0.14.1 has no RewardModelLoss; recorded from the seed "
    "(shared/seeds/001_2ce674d23ff153d3.txt, pytorch/rl PR #3923) re-indented in this script, "
    "on TorchRL 0.14.1's LossModule",
    "accuracy": "float32 whatever the score dtype ((chosen > rejected).float().mean())",
    "grads": "of (loss_reward_model + loss_center).sum(); loss_center only when center_coeff "
    "is set; an unused network weight has a zero gradient",
    "loss_set_keys": "a failed set_keys call is recorded, then rolled back: TorchRL applies the "
    "valid pairs before the unknown one, the Rust port validates every pair first and changes "
    "nothing",
}


# ====================================================================================
# The seed, re-indented (torchrl.objectives.llm.reward, pytorch/rl PR #3923)
# ====================================================================================

_REDUCTIONS = ("mean", "sum", "none")


def _validate_reduction(reduction: str) -> None:
    if reduction not in _REDUCTIONS:
        raise ValueError(f"Invalid reduction: {reduction}.")


def reward_model_loss(
    chosen_scores: torch.Tensor,
    rejected_scores: torch.Tensor,
    reduction: Literal["mean", "sum", "none"],
) -> torch.Tensor:
    _validate_reduction(reduction)
    if chosen_scores.shape != rejected_scores.shape:
        raise ValueError(
            f"chosen_scores and rejected_scores must have the same shape, got "
            f"{chosen_scores.shape} vs {rejected_scores.shape}. Mismatched shapes "
            f"(e.g. [B] vs [B, 1]) would broadcast to an all-pairs loss."
        )
    loss = -torch.nn.functional.logsigmoid(chosen_scores - rejected_scores)
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    return loss


class RewardModelLossOutput(TensorClass["nocast"]):
    loss_reward_model: torch.Tensor
    loss_center: torch.Tensor | None = None
    accuracy: torch.Tensor | None = None


class RewardModelLoss(LossModule):
    @dataclass
    class _AcceptedKeys:
        chosen: NestedKey = "chosen"
        rejected: NestedKey = "rejected"
        score: NestedKey = "score"

    default_keys = _AcceptedKeys
    tensor_keys: _AcceptedKeys

    def __init__(
        self,
        score_network: TensorDictModule | None = None,
        *,
        reduction: Literal["mean", "sum", "none"] = "mean",
        center_coeff: float | None = None,
    ):
        _validate_reduction(reduction)
        super().__init__()
        self.score_network = score_network
        self.reduction = reduction
        if center_coeff is not None and center_coeff < 0:
            raise ValueError("center_coeff must be non-negative.")
        self.center_coeff = center_coeff
        self._set_in_keys()

    def _set_in_keys(self) -> None:
        self.in_keys = [self.tensor_keys.chosen, self.tensor_keys.rejected]
        self.out_keys = []

    def _score(self, tensordict: TensorDictBase, key: NestedKey) -> torch.Tensor:
        sub_td = tensordict.get(key, default=None)
        if sub_td is None:
            raise KeyError(
                f"Could not find the sub-tensordict at key {key!r} in the input "
                f"tensordict with keys {set(tensordict.keys())}."
            )
        if self.score_network is not None:
            sub_td = self.score_network(sub_td.clone(False))
            score_keys = self.score_network.out_keys
            if self.tensor_keys.score in score_keys:
                score_key = self.tensor_keys.score
            elif self.default_keys().score in score_keys:
                score_key = self.default_keys().score
            elif len(score_keys) == 1:
                score_key = score_keys[0]
            else:
                raise KeyError(
                    "Could not identify the score_network output key: expected "
                    f"{self.tensor_keys.score!r} among {score_keys!r}."
                )
        else:
            score_key = self.tensor_keys.score
        score = sub_td.get(score_key, default=None)
        if score is None:
            raise KeyError(
                f"Could not find the score at key {score_key!r} under "
                f"{key!r}. If score_network is None, the scores must be precomputed."
            )
        # reduce a trailing singleton dimension (e.g. [B, 1] -> [B])
        if score.ndim > 1 and score.shape[-1] == 1:
            score = score.squeeze(-1)
        return score

    def forward(self, tensordict: TensorDictBase) -> RewardModelLossOutput:
        chosen_score = self._score(tensordict, self.tensor_keys.chosen)
        rejected_score = self._score(tensordict, self.tensor_keys.rejected)
        loss = reward_model_loss(chosen_score, rejected_score, self.reduction)
        loss_center = None
        if self.center_coeff is not None:
            center = chosen_score.pow(2) + rejected_score.pow(2)
            if self.reduction == "mean":
                center = center.mean()
            elif self.reduction == "sum":
                center = center.sum()
            loss_center = self.center_coeff * center
        with torch.no_grad():
            accuracy = (chosen_score > rejected_score).float().mean()
        return RewardModelLossOutput(
            loss_reward_model=loss,
            loss_center=loss_center,
            accuracy=accuracy,
        )


# ====================================================================================
# encoding
# ====================================================================================

DTYPES = {
    torch.float32: "float32",
    torch.float64: "float64",
    torch.int64: "int64",
    torch.bool: "bool",
}


def enc_number(x, dtype):
    if dtype == torch.bool:
        return bool(x)
    if dtype == torch.int64:
        return int(x)
    x = float(x)
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return x


def enc(t):
    t = t.detach()
    if t.dtype not in DTYPES:
        raise TypeError(f"cannot encode dtype {t.dtype}")
    return {
        "shape": list(t.shape),
        "dtype": DTYPES[t.dtype],
        "data": [enc_number(x, t.dtype) for x in t.reshape(-1).tolist()],
    }


def dec(v):
    dtype = {name: dt for dt, name in DTYPES.items()}[v["dtype"]]
    data = [float(x) if isinstance(x, str) else x for x in v["data"]]
    return torch.tensor(data, dtype=dtype).reshape(v["shape"])


def enc_key(k):
    return [k] if isinstance(k, str) else list(k)


def dec_key(k):
    return k[0] if len(k) == 1 else tuple(k)


def enc_td(td):
    entries = {}
    for k, v in td.items():
        entries[k] = enc_td(v) if isinstance(v, TensorDictBase) else enc(v)
    return {"batch_size": list(td.batch_size), "entries": entries}


def dec_td(v):
    td = TensorDict({}, batch_size=v["batch_size"])
    for k, e in v["entries"].items():
        td.set(k, dec_td(e) if "entries" in e else dec(e))
    return td


def strip_addresses(msg):
    """Drops the `` at 0x...`` object addresses a dataclass Field repr carries (they change
    from run to run)."""
    return re.sub(r" at 0x[0-9a-fA-F]+", "", msg)


def normalise(msg):
    msg = msg.replace("torch.Size(", "").replace("])", "]")
    return msg


def enc_error(e, facts):
    cls = type(e).__name__
    msg = strip_addresses(e.args[0] if isinstance(e, KeyError) and e.args else str(e))
    norm = normalise(msg)
    for f in facts:
        assert f in norm, (f, norm)
    return {"error": {"class": cls, "message": msg, "facts": facts}}


CASES = []


def add(name, op, args, expect):
    CASES.append({"name": name, "op": op, "args": args, "expect": expect})


def gen(seed):
    return torch.Generator().manual_seed(seed)


def randn(*shape, seed, dtype=torch.float32):
    return torch.randn(*shape, generator=gen(seed), dtype=torch.float64).to(dtype)


# ====================================================================================
# reward model: the function
# ====================================================================================

C3 = torch.tensor([1.0, 0.5, -0.3], dtype=torch.float64)
R3 = torch.tensor([0.0, 1.0, -0.3], dtype=torch.float64)


def rm_fn_case(name, chosen, rejected, reduction, facts=None):
    args = {"chosen": enc(chosen), "rejected": enc(rejected), "reduction": reduction}
    c = dec(args["chosen"]).requires_grad_(True)
    r = dec(args["rejected"]).requires_grad_(True)
    try:
        out = reward_model_loss(c, r, reduction)
    except ValueError as e:
        assert facts is not None, (name, e)
        add(name, "reward_model_loss_fn", args, enc_error(e, facts))
        return
    assert facts is None, name
    gc, gr = torch.autograd.grad(out.sum(), [c, r])
    add(
        name,
        "reward_model_loss_fn",
        args,
        {"out": enc(out), "grads": {"chosen": enc(gc), "rejected": enc(gr)}},
    )


def record_reward_fn():
    for red in _REDUCTIONS:
        rm_fn_case(f"rm_fn_bt_reference_{red}", C3, R3, red)
        rm_fn_case(
            f"rm_fn_random_f32_{red}", randn(6, seed=1), randn(6, seed=2), red
        )
    # extreme margins: logsigmoid must stay finite
    rm_fn_case(
        "rm_fn_extreme_margins",
        torch.tensor([40.0, -40.0, 0.0], dtype=torch.float32),
        torch.tensor([-40.0, 40.0, 0.0], dtype=torch.float32),
        "none",
    )
    # [B, 2] scores are accepted (the seed only checks that the shapes match)
    rm_fn_case("rm_fn_two_dims", randn(3, 2, seed=3), randn(3, 2, seed=4), "mean")
    rm_fn_case(
        "rm_fn_shape_mismatch_b_vs_b1",
        randn(4, seed=5),
        randn(4, 1, seed=6),
        "mean",
        facts=["must have the same shape", "[4] vs [4, 1]", "all-pairs"],
    )


# ====================================================================================
# reward model: the loss module
# ====================================================================================


class _LinearScores(torch.nn.Module):
    """out_k = x @ w_k for each output (a bias-free linear score head per output)."""

    def __init__(self, weights):
        super().__init__()
        self.ws = torch.nn.ParameterList([torch.nn.Parameter(w) for w in weights])

    def forward(self, x):
        outs = tuple(x @ w for w in self.ws)
        return outs[0] if len(outs) == 1 else outs


def rm_case(
    name,
    td,
    *,
    reduction="mean",
    center_coeff=None,
    set_keys=(),
    score_network=None,
    grad_leaves=(),
    facts=None,
):
    args = {
        "td": enc_td(td),
        "reduction": reduction,
        "center_coeff": center_coeff,
        "set_keys": [[n, None if k is None else enc_key(k)] for n, k in set_keys],
        "score_network": None,
        "grad_leaves": [enc_key(k) for k in grad_leaves],
    }
    td = dec_td(args["td"])
    leaves = {}
    for k in grad_leaves:
        t = td.get(k).clone().requires_grad_(True)
        td.set(k, t)
        leaves["/".join(enc_key(k))] = t
    net = None
    if score_network is not None:
        in_key, outs = score_network
        args["score_network"] = {
            "in_key": enc_key(in_key),
            "out": [[enc_key(k), enc(w)] for k, w in outs],
        }
        module = _LinearScores([dec(enc(w)) for _, w in outs])
        net = TensorDictModule(module, in_keys=[in_key], out_keys=[k for k, _ in outs])
        for (k, _), p in zip(outs, module.ws):
            leaves["weight:" + "/".join(enc_key(k))] = p
    try:
        loss = RewardModelLoss(net, reduction=reduction, center_coeff=center_coeff)
        for n, k in set_keys:
            loss.set_keys(**{n: k})
        out = loss(td)
    except (ValueError, KeyError) as e:
        assert facts is not None, (name, e)
        add(name, "reward_model_loss", args, enc_error(e, facts))
        return
    assert facts is None, name
    total = out.loss_reward_model
    if out.loss_center is not None:
        total = total + out.loss_center
    grads = {}
    if leaves:
        gs = torch.autograd.grad(total.sum(), list(leaves.values()), allow_unused=True)
        grads = {
            k: enc(torch.zeros_like(p) if g is None else g)
            for (k, p), g in zip(leaves.items(), gs)
        }
    add(
        name,
        "reward_model_loss",
        args,
        {
            "loss_reward_model": enc(out.loss_reward_model),
            "loss_center": None if out.loss_center is None else enc(out.loss_center),
            "accuracy": enc(out.accuracy),
            "in_keys": [enc_key(k) for k in loss.in_keys],
            "grads": grads,
        },
    )


def scores_td(chosen, rejected, chosen_key="chosen", rejected_key="rejected", score="score"):
    b = chosen.shape[0]
    td = TensorDict({}, batch_size=[b])
    td.set((chosen_key, score) if isinstance(chosen_key, str) else (*chosen_key, score), chosen)
    td.set(
        (rejected_key, score) if isinstance(rejected_key, str) else (*rejected_key, score),
        rejected,
    )
    return td


def record_reward_loss():
    c = randn(5, seed=11)
    r = randn(5, seed=12)
    r[2] = c[2]  # a tie: counts as wrong
    for red in _REDUCTIONS:
        for cc_name, cc in (("nocenter", None), ("center0", 0.0), ("center05", 0.5)):
            for shape_name, shape in (("b", (5,)), ("b1", (5, 1))):
                rm_case(
                    f"rm_loss_{red}_{cc_name}_{shape_name}",
                    scores_td(c.reshape(shape), r.reshape(shape)),
                    reduction=red,
                    center_coeff=cc,
                    grad_leaves=[("chosen", "score"), ("rejected", "score")],
                )
    rm_case(
        "rm_loss_bt_reference_center001",
        scores_td(C3, R3),
        center_coeff=0.01,
        grad_leaves=[("chosen", "score"), ("rejected", "score")],
    )
    # one side [B, 1], the other [B]: the squeeze makes them match
    rm_case(
        "rm_loss_mixed_b1_and_b",
        scores_td(c.reshape(5, 1), r),
        grad_leaves=[("chosen", "score"), ("rejected", "score")],
    )
    # renamed and nested keys
    rm_case(
        "rm_loss_set_keys_nested",
        scores_td(c, r, chosen_key="chosen_data", rejected_key=("pair", "rejected"), score="end_scores"),
        set_keys=[("chosen", "chosen_data"), ("rejected", ("pair", "rejected")), ("score", "end_scores")],
        center_coeff=0.1,
        grad_leaves=[("chosen_data", "end_scores"), ("pair", "rejected", "end_scores")],
    )
    # errors
    rm_case(
        "rm_loss_shape_mismatch",
        scores_td(randn(3, 2, seed=13), randn(3, seed=14)),
        facts=["must have the same shape", "[3, 2] vs [3]"],
    )
    td = scores_td(c, r)
    del td["rejected"]
    rm_case("rm_loss_missing_rejected", td, facts=["rejected"])
    td = scores_td(c, r)
    td["rejected"] = td["rejected"].rename_key_("score", "other")
    rm_case("rm_loss_missing_score", td, facts=["score", "rejected"])

    # score networks: x [B, 4] -> score
    x_c = randn(5, 4, seed=21)
    x_r = randn(5, 4, seed=22)
    w1 = randn(4, seed=23)
    w2 = randn(4, 1, seed=24)

    def feats():
        return TensorDict(
            {"chosen": {"x": x_c}, "rejected": {"x": x_r}}, batch_size=[5]
        )

    rm_case(
        "rm_net_default_score_key",
        feats(),
        score_network=("x", [("score", w1)]),
        center_coeff=0.05,
    )
    rm_case(
        "rm_net_set_score_key_among_outputs",
        feats(),
        score_network=("x", [("rewards", w1), ("end_scores", w2)]),
        set_keys=[("score", "end_scores")],
    )
    rm_case(
        "rm_net_falls_back_to_default_score",
        feats(),
        score_network=("x", [("score", w1), ("aux", w2)]),
        set_keys=[("score", "not_an_output")],
        reduction="sum",
    )
    rm_case(
        "rm_net_single_output_used",
        feats(),
        score_network=("x", [("my_score", w2)]),
        reduction="none",
        center_coeff=0.2,
    )
    rm_case(
        "rm_net_ambiguous_outputs",
        feats(),
        score_network=("x", [("a", w1), ("b", w2)]),
        facts=["Could not identify the score_network output key", "score"],
    )
    # constructor errors
    for name, red, cc, facts in (
        ("rm_ctor_bad_reduction", "avg", None, ["Invalid reduction: avg"]),
        ("rm_ctor_negative_center", "mean", -0.1, ["center_coeff must be non-negative"]),
    ):
        args = {"reduction": red, "center_coeff": cc}
        try:
            RewardModelLoss(reduction=red, center_coeff=cc)
        except ValueError as e:
            add(name, "reward_model_ctor", args, enc_error(e, facts))
        else:
            raise AssertionError(name)


def keys_state(loss):
    return {
        "tensor_keys": {
            f: enc_key(getattr(loss.tensor_keys, f))
            for f in loss._AcceptedKeys.__dataclass_fields__
        },
        "in_keys": [enc_key(k) for k in loss.in_keys],
    }


def record_loss_set_keys():
    calls = [
        [["chosen", ["chosen_data"]]],
        [["rejected", ["pair", "rejected"]], ["score", ["end_scores"]]],
        [["foo", ["bar"]]],
        [["score", ["x"]], ["foo", ["bar"]]],
        [["chosen", None]],
        [["rejected", None], ["score", None]],
    ]
    loss = RewardModelLoss()
    steps = []
    for call in calls:
        before = keys_state(loss)
        try:
            loss.set_keys(**{n: (None if k is None else dec_key(k)) for n, k in call})
        except ValueError as e:
            facts = [
                f"{call[-1][0]} is not an accepted tensordict key",
                "Accepted keys are",
                "chosen",
                "rejected",
                "score",
            ]
            steps.append(enc_error(e, facts))
            # TorchRL applies the valid pairs that come before the bad one; the Rust port
            # validates first and changes nothing. Record TorchRL's state, then roll back so
            # that the following steps start from the same keys on both sides.
            for f, k in before["tensor_keys"].items():
                setattr(loss.tensor_keys, f, dec_key(k))
            loss._set_in_keys()
            continue
        steps.append(keys_state(loss))
    add("loss_set_keys_reward_model", "loss_set_keys", {"calls": calls}, {"steps": steps})


# ====================================================================================
# value estimators: the functional forms
# ====================================================================================


def trajectories(seed, batch=(2,), T=6, F=(1,), dtype=torch.float32):
    """Values, rewards and flags with terminations and truncations at fixed places."""
    shape = (*batch, T, *F)
    v = randn(*shape, seed=seed, dtype=dtype)
    nv = randn(*shape, seed=seed + 1, dtype=dtype)
    r = randn(*shape, seed=seed + 2, dtype=dtype)
    done = torch.zeros(shape, dtype=torch.bool)
    term = torch.zeros(shape, dtype=torch.bool)
    flat_done = done.reshape(-1, T, *F)
    flat_term = term.reshape(-1, T, *F)
    n = flat_done.shape[0]
    for i in range(n):
        pattern = i % 3
        if pattern == 0:  # terminated at 2, truncated at the end
            flat_done[i, 2] = True
            flat_term[i, 2] = True
            flat_done[i, T - 1] = True
        elif pattern == 1:  # truncated at 1, terminated at 4, cut (not done) at the end
            flat_done[i, 1] = True
            flat_done[i, 4] = True
            flat_term[i, 4] = True
        else:  # terminated at the end only
            flat_done[i, T - 1] = True
            flat_term[i, T - 1] = True
    return v, nv, r, done, term


def gae_fn_case(name, gamma, lmbda, v, nv, r, done, term, time_dim=-2):
    args = {
        "gamma": gamma,
        "lmbda": lmbda,
        "state_value": enc(v),
        "next_state_value": enc(nv),
        "reward": enc(r),
        "done": enc(done),
        "terminated": None if term is None else enc(term),
        "time_dim": time_dim,
    }
    adv, vt = generalized_advantage_estimate(
        gamma,
        lmbda,
        dec(args["state_value"]),
        dec(args["next_state_value"]),
        dec(args["reward"]),
        dec(args["done"]),
        None if term is None else dec(args["terminated"]),
        time_dim=time_dim,
    )
    add(name, "gae_fn", args, {"advantage": enc(adv), "value_target": enc(vt)})


def td_lambda_fn_case(name, gamma, lmbda, v, nv, r, done, term, time_dim=-2):
    args = {
        "gamma": gamma,
        "lmbda": lmbda,
        "state_value": enc(v),
        "next_state_value": enc(nv),
        "reward": enc(r),
        "done": enc(done),
        "terminated": None if term is None else enc(term),
        "time_dim": time_dim,
    }
    ret = td_lambda_return_estimate(
        gamma,
        lmbda,
        dec(args["next_state_value"]),
        dec(args["reward"]),
        dec(args["done"]),
        None if term is None else dec(args["terminated"]),
        time_dim=time_dim,
    )
    add(
        name,
        "td_lambda_fn",
        args,
        {"returns": enc(ret), "advantage": enc(ret - dec(args["state_value"]))},
    )


def record_value_fn():
    # torchrl.md §5.3: V=[1,2,3], V'=[2,3,4], r=1, gamma=0.9, lambda=0.8
    v = torch.tensor([1.0, 2.0, 3.0]).view(3, 1)
    nv = torch.tensor([2.0, 3.0, 4.0]).view(3, 1)
    r = torch.ones(3, 1)
    d = torch.tensor([False, False, True]).view(3, 1)
    gae_fn_case("gae_fn_reference_terminated", 0.9, 0.8, v, nv, r, d, d)
    gae_fn_case("gae_fn_reference_truncated", 0.9, 0.8, v, nv, r, d, torch.zeros_like(d))
    # rlhf.md §5.2 (trlX's GAE: no bootstrap after the last token)
    v = torch.tensor([0.5, 0.6, 0.7], dtype=torch.float64).view(1, 3, 1)
    nv = torch.tensor([0.6, 0.7, 0.0], dtype=torch.float64).view(1, 3, 1)
    r = torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64).view(1, 3, 1)
    d = torch.tensor([False, False, True]).view(1, 3, 1)
    gae_fn_case("gae_fn_trlx_gamma1", 1.0, 0.95, v, nv, r, d, d)
    gae_fn_case("gae_fn_trlx_gamma099", 0.99, 0.95, v, nv, r, d, d)

    for gamma, lmbda in ((0.99, 0.95), (0.9, 0.0), (0.97, 1.0)):
        tag = f"g{gamma}_l{lmbda}".replace(".", "")
        v, nv, r, done, term = trajectories(100)
        gae_fn_case(f"gae_fn_mixed_{tag}", gamma, lmbda, v, nv, r, done, term)
        td_lambda_fn_case(f"td_lambda_fn_mixed_{tag}", gamma, lmbda, v, nv, r, done, term)
    # terminated omitted: defaults to done
    v, nv, r, done, term = trajectories(110, dtype=torch.float64)
    gae_fn_case("gae_fn_no_terminated_f64", 0.95, 0.9, v, nv, r, done, None)
    td_lambda_fn_case("td_lambda_fn_no_terminated_f64", 0.95, 0.9, v, nv, r, done, None)
    # no feature dim: time is the last dim
    v, nv, r, done, term = trajectories(120, batch=(3,), T=7, F=())
    gae_fn_case("gae_fn_time_last", 0.99, 0.9, v, nv, r, done, term, time_dim=-1)
    td_lambda_fn_case("td_lambda_fn_time_last", 0.99, 0.9, v, nv, r, done, term, time_dim=-1)
    # two feature dims ([B, T, 2]), time_dim given as a positive index
    v, nv, r, done, term = trajectories(130, batch=(2,), T=5, F=(2,))
    gae_fn_case("gae_fn_two_features", 0.9, 0.7, v, nv, r, done, term, time_dim=1)
    td_lambda_fn_case("td_lambda_fn_two_features", 0.9, 0.7, v, nv, r, done, term, time_dim=1)
    # a long trajectory (the scan's many rounds), a termination every 17 steps
    T = 100
    v = randn(1, T, 1, seed=140)
    nv = randn(1, T, 1, seed=141)
    r = randn(1, T, 1, seed=142)
    done = torch.zeros(1, T, 1, dtype=torch.bool)
    done[0, 16::17] = True
    term = done.clone()
    term[0, 33] = False  # one truncation
    gae_fn_case("gae_fn_long", 0.99, 0.95, v, nv, r, done, term)
    td_lambda_fn_case("td_lambda_fn_long", 0.99, 0.95, v, nv, r, done, term)


# ====================================================================================
# value estimators: the modules
# ====================================================================================


def module_case(op, name, gamma, lmbda, td, *, average=False, set_keys=(), value_network=None):
    args = {
        "gamma": gamma,
        "lmbda": lmbda,
        "average": average,
        "set_keys": [[n, enc_key(k)] for n, k in set_keys],
        "value_network": None,
        "td": enc_td(td),
    }
    net = None
    if value_network is not None:
        in_key, w, b = value_network
        args["value_network"] = {"in_key": enc_key(in_key), "weight": enc(w), "bias": b}
        lin = torch.nn.Linear(w.shape[0], 1)
        with torch.no_grad():
            lin.weight.copy_(dec(enc(w)).view(1, -1))
            lin.bias.fill_(b)
        net = TensorDictModule(lin, in_keys=[in_key], out_keys=["state_value"])
    if op == "gae_module":
        est = GAE(gamma=gamma, lmbda=lmbda, value_network=net, average_gae=average)
    else:
        est = TDLambdaEstimator(
            gamma=gamma, lmbda=lmbda, value_network=net, average_rewards=average
        )
    if set_keys:
        est.set_keys(**{n: k for n, k in set_keys})
    td_in = dec_td(args["td"])
    before = set(td_in.keys(True, True))
    out = est(td_in)
    written = TensorDict({}, batch_size=out.batch_size)
    for k in out.keys(True, True):
        if k not in before:
            written.set(k, out.get(k))
    add(name, op, args, {"td": enc_td(written)})


def rollout_td(seed, batch=(2,), T=6, obs_dim=3, with_values=True, terminated=True):
    v, nv, r, done, term = trajectories(seed, batch=batch, T=T)
    td = TensorDict({}, batch_size=[*batch, T])
    obs = randn(*batch, T, obs_dim, seed=seed + 10)
    td.set("observation", obs)
    td.set(("next", "observation"), randn(*batch, T, obs_dim, seed=seed + 11))
    td.set(("next", "reward"), r)
    td.set(("next", "done"), done)
    if terminated:
        td.set(("next", "terminated"), term)
    if with_values:
        td.set("state_value", v)
        td.set(("next", "state_value"), nv)
    return td


def record_value_modules():
    for op in ("gae_module", "td_lambda_module"):
        short = "gae" if op == "gae_module" else "tdl"
        module_case(op, f"{short}_mod_precomputed", 0.99, 0.95, rollout_td(200))
        module_case(op, f"{short}_mod_average", 0.99, 0.95, rollout_td(200), average=True)
        module_case(
            op, f"{short}_mod_no_terminated", 0.9, 0.8, rollout_td(210, terminated=False)
        )
        module_case(
            op, f"{short}_mod_batch_2x3", 0.98, 0.9, rollout_td(220, batch=(2, 3), T=5)
        )
        module_case(
            op,
            f"{short}_mod_value_network",
            0.99,
            0.95,
            rollout_td(230, with_values=False),
            value_network=("observation", randn(3, seed=231), 0.25),
        )
        # renamed keys (nested reward, custom value / done / terminated / outputs)
        td = rollout_td(240)
        td.rename_key_("state_value", "v")
        td.rename_key_(("next", "state_value"), ("next", "v"))
        td.rename_key_(("next", "reward"), ("next", "agent", "reward"))
        td.rename_key_(("next", "done"), ("next", "d"))
        td.rename_key_(("next", "terminated"), ("next", "t"))
        module_case(
            op,
            f"{short}_mod_set_keys",
            0.95,
            0.9,
            td,
            set_keys=[
                ("value", "v"),
                ("reward", ("agent", "reward")),
                ("done", "d"),
                ("terminated", "t"),
                ("advantage", "adv"),
                ("value_target", ("targets", "vt")),
            ],
        )
        # multi-step returns: gamma ** steps_to_next_obs
        td = rollout_td(250)
        steps = torch.tensor([1, 2, 3, 1, 1, 2, 3, 3, 1, 2, 1, 1]).view(2, 6, 1)
        td.set("steps_to_next_obs", steps)
        module_case(op, f"{short}_mod_steps_to_next_obs", 0.9, 0.8, td)

    # set_keys errors of an estimator
    for name, pairs, exc, facts in (
        (
            "estimator_set_keys_unknown",
            [["foo", ["bar"]]],
            KeyError,
            ["foo is not an accepted tensordict key for advantages"],
        ),
        ("estimator_set_keys_none", [["value", None]], ValueError, ["tensordict keys cannot be None"]),
    ):
        est = GAE(gamma=0.9, lmbda=0.9, value_network=None)
        try:
            est.set_keys(**{n: (None if k is None else dec_key(k)) for n, k in pairs})
        except exc as e:
            add(name, "estimator_set_keys", {"estimator": "GAE", "pairs": pairs}, enc_error(e, facts))
        else:
            raise AssertionError(name)


def main():
    record_reward_fn()
    record_reward_loss()
    record_loss_set_keys()
    record_value_fn()
    record_value_modules()
    names = [c["name"] for c in CASES]
    assert len(names) == len(set(names)), "case names must be unique"
    versions = {
        "torch": torch.__version__,
        "torchrl": torchrl.__version__,
        "tensordict": tensordict.__version__,
        "python": platform.python_version(),
    }
    lines = [
        "{",
        f'"generator": {json.dumps(GENERATOR)},',
        f'"versions": {json.dumps(versions)},',
        f'"notes": {json.dumps(NOTES)},',
        '"cases": [',
    ]
    lines.append(",\n".join(json.dumps(c, allow_nan=False) for c in CASES))
    lines.append("]}")
    text = "\n".join(lines) + "\n"
    json.loads(text)
    with open(OUT, "w") as f:
        f.write(text)
    print(f"wrote {len(CASES)} cases to {os.path.relpath(OUT)}", file=sys.stderr)


if __name__ == "__main__":
    main()
