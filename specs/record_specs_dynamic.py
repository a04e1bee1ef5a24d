#!/usr/bin/env python
"""Record how TorchRL 0.14 treats dynamic (``-1``) spec dims.

Run from the repository root:

    /root/.cache/torchrl-rs/venv/bin/python specs/record_specs_dynamic.py

It writes ``specs/specs_dynamic_cases.json``, replayed by ``tests/specs_dynamic.rs`` (which
never runs Python).

Each case is ``{"op", "spec", ...args, "expect"}``:

- ``spec``: ``{"class", "shape", ...}`` with the class's own arguments (``n``, ``nvec``,
  ``low``/``high``); its shape holds ``-1`` at the dynamic dims.
- ``is_in``: ``value`` is ``{"shape", "fill"}``, a tensor of the spec's dtype filled with
  ``fill`` (a number), or ``"onehot"`` (class 0 hot in every row, per group for MultiOneHot);
  ``expect`` is ``true`` / ``false``, or ``"error"`` when TorchRL raises.
- ``rand`` / ``zero`` / ``one``: ``batch`` is the leading shape; ``expect`` is the sample's
  shape, or ``"error"``.
- ``expand``: ``target``; ``expect`` is the new spec's shape or ``"error"``.
- ``index``: ``index`` is a list of items (``{"int": i}``, ``{"slice": [start, stop]}``,
  ``"..."``, ``"none"``, ``{"tensor": [..]}``); ``expect`` is the shape or ``"error"``.
- ``unsqueeze`` (``dim``), ``squeeze`` (``dim`` or null), ``stack`` (two equal specs, ``dim``):
  ``expect`` is the shape.
- ``kl_output_spec``: TorchRL 0.14's ``KLRewardTransform.transform_output_spec`` (the LLM
  one; the classic actor-based class was removed in 0.11) on an output spec of batch shape
  ``batch`` whose reward (case ``reward``) or observation ``in_key`` (case ``other``) has shape
  ``leaf_shape``; ``expect`` is the shape of the written spec (the reward spec's leaf, or the
  observation spec's ``out_key``). For a ``(*batch, T, 1)`` leaf, 0.14's
  ``(*batch, -1, 1)`` equals v0.10's classic ``(*S[:-2], -1, 1)``.
"""

import json
import os
import types
import warnings

warnings.filterwarnings("ignore")
os.environ.setdefault("RL_WARNINGS", "0")

import torch  # noqa: E402
import torchrl  # noqa: E402
from torchrl.data import (  # noqa: E402
    Binary,
    Bounded,
    Categorical,
    Composite,
    MultiCategorical,
    MultiOneHot,
    NonTensor,
    OneHot,
    Unbounded,
)

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "specs_dynamic_cases.json")


def build(desc):
    c, shape = desc["class"], tuple(desc["shape"])
    if c == "Unbounded":
        return Unbounded(shape=shape)
    if c == "Bounded":
        return Bounded(desc["low"], desc["high"], shape=shape)
    if c == "Categorical":
        return Categorical(desc["n"], shape=shape)
    if c == "OneHot":
        return OneHot(desc["n"], shape=shape)
    if c == "Binary":
        return Binary(shape[-1], shape=shape)
    if c == "MultiCategorical":
        return MultiCategorical(desc["nvec"], shape=shape)
    if c == "MultiOneHot":
        return MultiOneHot(desc["nvec"], shape=shape)
    if c == "NonTensor":
        return NonTensor(shape=shape)
    raise ValueError(c)


def value(spec, desc, v):
    shape = tuple(v["shape"])
    if v["fill"] == "onehot":
        t = torch.zeros(shape, dtype=spec.dtype)
        if desc["class"] == "MultiOneHot":
            off = 0
            for n in desc["nvec"]:
                t[..., off] = 1
                off += n
        else:
            t[..., 0] = 1
        return t
    return torch.full(shape, v["fill"]).to(spec.dtype)


def index_item(i):
    if i == "...":
        return Ellipsis
    if i == "none":
        return None
    if "int" in i:
        return i["int"]
    if "slice" in i:
        return slice(*i["slice"])
    if "tensor" in i:
        return torch.tensor(i["tensor"])
    raise ValueError(i)


def run(case):
    op, desc = case["op"], case.get("spec")
    spec = build(desc) if desc else None
    if op == "is_in":
        r = spec.is_in(value(spec, desc, case["value"]))
        return bool(r)
    if op in ("rand", "zero", "one"):
        return list(getattr(spec, op)(tuple(case["batch"])).shape)
    if op == "expand":
        return list(spec.expand(tuple(case["target"])).shape)
    if op == "index":
        items = tuple(index_item(i) for i in case["index"])
        return list(spec[items].shape)
    if op == "unsqueeze":
        return list(spec.unsqueeze(case["dim"]).shape)
    if op == "squeeze":
        return list(spec.squeeze(case["dim"]).shape)
    if op == "stack":
        return list(torch.stack([spec, spec.clone()], case["dim"]).shape)
    if op == "kl_output_spec":
        return kl_case(case)
    raise ValueError(op)


def kl_case(case):
    from torchrl.envs.llm.transforms.kl import KLRewardTransform

    batch, leaf = tuple(case["batch"]), tuple(case["leaf_shape"])
    in_key, out_key = case["in_key"], case["out_key"]
    reward = Composite(reward=Unbounded(shape=leaf), shape=batch)
    obs = Composite(shape=batch)
    if in_key != "reward":
        obs[in_key] = Unbounded(shape=leaf)
    output_spec = Composite(
        full_reward_spec=reward,
        full_observation_spec=obs,
        full_done_spec=Composite(done=Categorical(2, shape=(*batch, 1), dtype=torch.bool), shape=batch),
        shape=batch,
    )
    parent = types.SimpleNamespace(reward_keys=["reward"], reward_key="reward")
    fake = types.SimpleNamespace(in_keys=[in_key], out_keys=[out_key, "kl_penalty"], parent=parent)
    out = KLRewardTransform.transform_output_spec(fake, output_spec)
    if in_key == "reward" and out_key == "reward":
        return list(out["full_reward_spec", "reward"].shape)
    return list(out["full_observation_spec", out_key].shape)


def cases():
    U = {"class": "Unbounded", "shape": [-1, 3]}
    B = {"class": "Bounded", "shape": [-1, 3], "low": -1.0, "high": 1.0}
    C = {"class": "Categorical", "shape": [-1], "n": 4}
    O = {"class": "OneHot", "shape": [-1, 3], "n": 3}
    Bi = {"class": "Binary", "shape": [-1, 3]}
    MC = {"class": "MultiCategorical", "shape": [-1, 2], "nvec": [2, 3]}
    MO = {"class": "MultiOneHot", "shape": [-1, 5], "nvec": [2, 3]}
    N = {"class": "NonTensor", "shape": [-1, 3]}
    T = {"class": "Unbounded", "shape": [2, -1]}  # the token env's ("tokens", "response")
    R = {"class": "Unbounded", "shape": [2, -1, 1]}  # the LLM reward (*batch, -1, 1)
    out = []
    for v in [[5, 3], [1, 3], [0, 3], [2, 5, 3], [3], [5, 1], [5, 4]]:
        out.append({"op": "is_in", "spec": U, "value": {"shape": v, "fill": 0.0}})
    for v, fill in [([5, 3], 0.0), ([5, 3], 2.0), ([2, 7, 3], 0.5), ([7, 3], -1.5)]:
        out.append({"op": "is_in", "spec": B, "value": {"shape": v, "fill": fill}})
    for v, fill in [([6], 3), ([0], 0), ([6], 4), ([2, 6], 1)]:
        out.append({"op": "is_in", "spec": C, "value": {"shape": v, "fill": fill}})
    for v in [[4, 3], [1, 3], [2, 4, 3]]:
        out.append({"op": "is_in", "spec": O, "value": {"shape": v, "fill": "onehot"}})
    out.append({"op": "is_in", "spec": O, "value": {"shape": [4, 3], "fill": 0}})
    for v, fill in [([4, 3], 1), ([4, 3], 2)]:
        out.append({"op": "is_in", "spec": Bi, "value": {"shape": v, "fill": fill}})
    for v, fill in [([4, 2], 1), ([4, 2], 2)]:
        out.append({"op": "is_in", "spec": MC, "value": {"shape": v, "fill": fill}})
    out.append({"op": "is_in", "spec": MO, "value": {"shape": [4, 5], "fill": "onehot"}})
    for v in [[2, 7], [2, 1], [2, 0], [3, 2, 9], [3, 7], [7]]:
        out.append({"op": "is_in", "spec": T, "value": {"shape": v, "fill": 0.0}})
    for v in [[2, 5, 1], [2, 1, 1], [2, 5, 2], [2, 5]]:
        out.append({"op": "is_in", "spec": R, "value": {"shape": v, "fill": 0.0}})
    for s in [U, B, C, O, Bi, MC, MO, N, T]:
        for op in ["rand", "zero", "one"]:
            for batch in [[], [2]]:
                out.append({"op": op, "spec": s, "batch": batch})
    for s in [U, B, C, O, Bi, MO, N]:
        out.append({"op": "expand", "spec": s, "target": [2, *s["shape"]]})
        out.append({"op": "expand", "spec": s, "target": [2, 5, *s["shape"][1:]]})
        out.append({"op": "index", "spec": s, "index": [{"int": 0}]})
        out.append({"op": "index", "spec": s, "index": [{"slice": [None, None]}]})
        out.append({"op": "index", "spec": s, "index": [{"slice": [None, 2]}]})
        out.append({"op": "index", "spec": s, "index": ["...", {"int": 0}]} if s["class"] not in ("OneHot", "Binary", "MultiOneHot") else {"op": "index", "spec": s, "index": ["..."]})
        out.append({"op": "unsqueeze", "spec": s, "dim": 0})
        out.append({"op": "stack", "spec": s, "dim": 0})
    out.append({"op": "expand", "spec": T, "target": [4, 2, -1]})
    out.append({"op": "expand", "spec": T, "target": [2, 5]})
    out.append({"op": "index", "spec": U, "index": [{"tensor": [0, 1]}]})
    out.append({"op": "index", "spec": T, "index": [{"int": 1}]})
    out.append({"op": "index", "spec": T, "index": ["none"]})
    out.append({"op": "index", "spec": T, "index": [{"slice": [None, None]}, {"int": 0}]})
    out.append({"op": "squeeze", "spec": U, "dim": None})
    out.append({"op": "squeeze", "spec": {"class": "Unbounded", "shape": [1, -1, 3]}, "dim": None})
    for in_key, out_key in [("reward", "reward"), ("reward", "reward_kl"), ("other", "other_kl")]:
        out.append({"op": "kl_output_spec", "batch": [2], "leaf_shape": [2, 5, 1], "in_key": in_key, "out_key": out_key})
    return out


def main():
    recorded = []
    for case in cases():
        try:
            expect = run(case)
        except Exception as e:  # noqa: BLE001 - what TorchRL raises is the recorded fact
            expect = "error"
            case["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
        case["expect"] = expect
        recorded.append(case)
    doc = {"torchrl": torchrl.__version__, "torch": torch.__version__.split("+")[0], "cases": recorded}
    with open(OUT, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print(f"wrote {len(recorded)} cases to {OUT}")


if __name__ == "__main__":
    main()
