#!/usr/bin/env python
"""Record reference values of the policy modules from tensordict.nn / TorchRL.

Run from the repository root:

    /root/.cache/torchrl-rs/venv/bin/python specs/record_modules.py

It writes ``specs/module_cases.json``, which ``tests/modules.rs`` replays (Rust never runs
Python). The output is deterministic: weights come from ``torch.manual_seed`` before each
construction and are written out (every ``state_dict`` entry), inputs are literal, and nothing
random is recorded (the actor cases use the deterministic / mean exploration types).

Ops (one case per line)::

    {"name", "op": "mlp", "args": {"in_features", "out_features", "depth" | null,
        "num_cells": int | [int] | null, "activation": <torch.nn class name>,
        "activate_last_layer", "bias_last_layer", "state_dict": {name: tensor},
        "inputs": [tensor, ...]},
     "expect": {"layer_names": [state_dict names, in order], "output": tensor}}

    {"op": "normal_param_extractor", "args": {"scale_mapping", "scale_lb", "input"},
     "expect": {"loc", "scale"}}

    {"op": "actor", "args": {"dist": "TanhNormal" | "Normal" | "Categorical" |
        "OneHotCategorical" | "Delta", "params": {key: tensor} (what the parameter module
        writes, read from "observation"), "param_keys": [[..], ..], "mask": tensor | null,
        "low"/"high": number | tensor (TanhNormal), "exploration": "deterministic" | "mean" |
        "mode", "action_key": key, "observation": tensor, "given_action": tensor},
     "expect": {"in_keys", "out_keys", "log_prob_key", "action", "action_log_prob",
                "log_prob_given" (get_dist(td).log_prob(given_action))}}

    {"op": "sequential", "args": {"modules": [{"in_keys", "out_keys", "consts"}],
        "input": {key-string: tensor}, "select_out_keys": [key] | null},
     "expect": {"in_keys", "out_keys", "output": [[key, tensor], ...] (leaves, in order)}}
    Module i writes ``out_keys[j] = sum(inputs) + consts[j]``.

    {"op": "value_operator", "args": {"in_keys" | null, "out_keys" | null, "mlp": <mlp args>,
        "inputs": {key-string: tensor}},
     "expect": {"in_keys", "out_keys", "output": tensor}}

Tensors are ``{"shape", "dtype", "data"}`` (row-major; float32 values written as the exact
double of the float); keys are lists of strings.
"""

import json
import math
import os
import platform
import sys
import warnings

warnings.filterwarnings("ignore")
os.environ.setdefault("RL_WARNINGS", "0")

import tensordict  # noqa: E402
import torch  # noqa: E402
import torchrl  # noqa: E402
from tensordict import TensorDict  # noqa: E402
from tensordict.nn import (  # noqa: E402
    NormalParamExtractor,
    TensorDictModule,
    TensorDictSequential,
)
from torch import distributions as D  # noqa: E402
from torch import nn  # noqa: E402
from torchrl.envs.utils import ExplorationType, set_exploration_type  # noqa: E402
from torchrl.modules import (  # noqa: E402
    MLP,
    MaskedCategorical,
    OneHotCategorical,
    ProbabilisticActor,
    TanhNormal,
    ValueOperator,
)
from torchrl.modules.distributions import Delta  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "module_cases.json")
GENERATOR = "specs/record_modules.py"

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


def rt(t):
    """The tensor after an encode/decode round trip (checked exact)."""
    d = dec(enc(t))
    assert d.dtype == t.dtype and d.shape == t.shape and torch.equal(d, t.detach()), t
    return d


def key(k):
    return [k] if isinstance(k, str) else list(k)


def unkey(k):
    return k[0] if len(k) == 1 else tuple(k)


CASES = []


def add(name, op, args, expect):
    assert all(c["name"] != name for c in CASES), name
    CASES.append({"name": name, "op": op, "args": args, "expect": expect})


# ---------------------------------------------------------------- MLP

ACTIVATIONS = {
    "Tanh": nn.Tanh,
    "ReLU": nn.ReLU,
    "ELU": nn.ELU,
    "LeakyReLU": nn.LeakyReLU,
    "GELU": nn.GELU,
    "SiLU": nn.SiLU,
    "Sigmoid": nn.Sigmoid,
    "Softplus": nn.Softplus,
    "Mish": nn.Mish,
    "SELU": nn.SELU,
    "Identity": nn.Identity,
}


def build_mlp(seed, in_features, out_features, depth, num_cells, activation, last, bias_last):
    torch.manual_seed(seed)
    kwargs = {}
    if depth is not None:
        kwargs["depth"] = depth
    if num_cells is not None:
        kwargs["num_cells"] = num_cells
    m = MLP(
        in_features=in_features,
        out_features=out_features,
        activation_class=ACTIVATIONS[activation],
        activate_last_layer=last,
        bias_last_layer=bias_last,
        **kwargs,
    )
    # round the weights through the encoder so that what is stored is exactly what ran
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(rt(p))
    args = {
        "in_features": in_features,
        "out_features": out_features,
        "depth": depth,
        "num_cells": num_cells,
        "activation": activation,
        "activate_last_layer": last,
        "bias_last_layer": bias_last,
        "state_dict": {k: enc(v) for k, v in m.state_dict().items()},
    }
    return m, args


def mlp_case(name, seed, in_features, out_features, depth, num_cells, activation, inputs,
             last=False, bias_last=True):
    m, args = build_mlp(seed, in_features, out_features, depth, num_cells, activation, last,
                        bias_last)
    inputs = [rt(x) for x in inputs]
    with torch.no_grad():
        out = m(*inputs)
    args["inputs"] = [enc(x) for x in inputs]
    add(name, "mlp", args, {"layer_names": list(m.state_dict().keys()), "output": enc(out)})


def grid(*shape, scale=1.0, offset=0.0):
    n = 1
    for s in shape:
        n *= s
    return (torch.arange(n, dtype=torch.float32).reshape(shape) * scale + offset)


X43 = grid(4, 3, scale=0.37, offset=-2.1)
mlp_case("mlp_tanh_cells_list", 0, 3, 2, None, [4, 5], "Tanh", [X43])
mlp_case("mlp_tanh_depth_and_cells_list", 1, 3, 2, 2, [4, 5], "Tanh", [X43])
mlp_case("mlp_relu_width_last_activated", 2, 3, 4, 2, 6, "ReLU", [X43], last=True)
mlp_case("mlp_depth0_single_linear", 3, 3, 2, None, None, "Tanh", [X43])
mlp_case("mlp_depth_default_width", 4, 3, 2, 1, None, "Tanh", [X43])
mlp_case("mlp_no_bias_last", 5, 3, 2, 1, 4, "Tanh", [X43], bias_last=False)
mlp_case("mlp_two_inputs_concat", 6, 5, 2, 1, 4, "Tanh",
         [grid(2, 3, scale=0.5, offset=-1.0), grid(2, 2, scale=-0.3, offset=0.4)])
mlp_case("mlp_extra_batch_dims", 7, 3, 2, 1, 4, "ReLU", [grid(2, 3, 3, scale=0.2, offset=-1.5)])
X_ACT = grid(5, 2, scale=0.9, offset=-4.0)
for i, act in enumerate(
    ["ELU", "LeakyReLU", "GELU", "SiLU", "Sigmoid", "Softplus", "Mish", "SELU", "Identity"]
):
    mlp_case(f"mlp_activation_{act.lower()}", 10 + i, 2, 3, 1, 4, act, [X_ACT], last=True)


# ---------------------------------------------------------------- NormalParamExtractor

NPE_IN = rt(torch.tensor([[0.0, 1.5, -2.0, 0.0, 30.0, -30.0], [-0.7, 0.2, 5.0, -12.0, 0.3, 1.0]]))
for mapping in ["biased_softplus_1.0", "biased_softplus_0.5_0.1", "softplus", "exp", "relu"]:
    for lb in [1e-4, 0.05]:
        ext = NormalParamExtractor(scale_mapping=mapping, scale_lb=lb)
        loc, scale = ext(NPE_IN)
        add(
            f"npe_{mapping.replace('.', 'p')}_lb{str(lb).replace('.', 'p').replace('-', 'm')}",
            "normal_param_extractor",
            {"scale_mapping": mapping, "scale_lb": lb, "input": enc(NPE_IN)},
            {"loc": enc(loc), "scale": enc(scale)},
        )


# ---------------------------------------------------------------- ProbabilisticActor

EXPLORATION = {
    "deterministic": ExplorationType.DETERMINISTIC,
    "mean": ExplorationType.MEAN,
    "mode": ExplorationType.MODE,
}


def actor_case(name, dist, params, given, *, exploration="deterministic", mask=None,
               low=None, high=None, action_key="action"):
    params = {k: rt(v) for k, v in params.items()}
    given = rt(given)
    batch = next(iter(params.values())).shape[:1]
    obs = torch.zeros(*batch, 3)
    keys = list(params.keys())

    def f(o):
        outs = tuple(p + 0 * o[..., :1] if p.is_floating_point() else p for p in params.values())
        return outs if len(outs) > 1 else outs[0]

    module = TensorDictModule(f, in_keys=["observation"], out_keys=keys)
    in_keys = list(keys)
    kwargs = {}
    if dist == "TanhNormal":
        cls = TanhNormal
        kwargs = {"low": low if not torch.is_tensor(low) else rt(low),
                  "high": high if not torch.is_tensor(high) else rt(high)}
    elif dist == "Normal":
        cls = D.Normal
    elif dist == "Categorical":
        cls = MaskedCategorical if mask is not None else D.Categorical
    elif dist == "OneHotCategorical":
        cls = OneHotCategorical
    elif dist == "Delta":
        cls = Delta
    else:
        raise ValueError(dist)
    td = TensorDict({"observation": obs}, batch)
    if mask is not None:
        mask = rt(mask)
        td.set("mask", mask)
        in_keys = {**{k: k for k in keys}, "mask": "mask"}
    actor = ProbabilisticActor(
        module,
        in_keys=in_keys,
        out_keys=[unkey(key(action_key))],
        distribution_class=cls,
        distribution_kwargs=kwargs,
        return_log_prob=True,
    )
    with set_exploration_type(EXPLORATION[exploration]), torch.no_grad():
        out = actor(td.clone())
        lp_given = actor.get_dist(td.clone()).log_prob(given)
    lp_key = actor.log_prob_keys[0]
    args = {
        "dist": dist,
        "params": {k: enc(v) for k, v in params.items()},
        "mask": None if mask is None else enc(mask),
        "exploration": exploration,
        "action_key": key(action_key),
        "observation": enc(obs),
        "given_action": enc(given),
    }
    for nm, v in (("low", low), ("high", high)):
        if v is not None:
            args[nm] = enc(rt(v)) if torch.is_tensor(v) else v
    add(
        name,
        "actor",
        args,
        {
            "in_keys": [key(k) for k in actor.in_keys],
            "out_keys": [key(k) for k in actor.out_keys],
            "log_prob_key": key(lp_key),
            "action": enc(out.get(unkey(key(action_key)))),
            "action_log_prob": enc(out.get(lp_key)),
            "log_prob_given": enc(lp_given),
        },
    )


LOC = torch.tensor([[0.3, -1.2], [2.0, 0.0], [-0.5, 4.0]])
SCALE = torch.tensor([[0.5, 1.5], [0.2, 1.0], [2.0, 0.1]])
actor_case(
    "actor_tanh_normal_vector_bounds", "TanhNormal", {"loc": LOC, "scale": SCALE},
    torch.tensor([[0.5, 0.0], [-0.9, 2.9], [0.0, -1.99]]),
    low=torch.tensor([-1.0, -2.0]), high=torch.tensor([1.0, 3.0]),
)
actor_case(
    "actor_tanh_normal_pendulum_bounds", "TanhNormal",
    {"loc": torch.tensor([[0.1], [-3.0], [0.8], [0.0]]),
     "scale": torch.tensor([[1.0], [0.3], [0.05], [2.0]])},
    torch.tensor([[1.0], [-1.999], [0.0], [1.5]]),
    low=-2.0, high=2.0,
)
actor_case(
    "actor_tanh_normal_nested_action_key", "TanhNormal", {"loc": LOC, "scale": SCALE},
    torch.tensor([[0.2, 0.1], [-0.3, 0.7], [0.05, -0.5]]),
    low=-1.0, high=1.0, action_key=("agent", "action"),
)
actor_case("actor_normal_deterministic", "Normal", {"loc": LOC, "scale": SCALE},
           torch.tensor([[0.0, 1.0], [2.5, -1.0], [0.0, 4.0]]))
actor_case("actor_normal_mean", "Normal", {"loc": LOC, "scale": SCALE},
           torch.tensor([[0.0, 1.0], [2.5, -1.0], [0.0, 4.0]]), exploration="mean")
actor_case("actor_normal_mode", "Normal", {"loc": LOC, "scale": SCALE},
           torch.tensor([[1.0, 1.0], [2.0, -1.0], [0.0, 0.0]]), exploration="mode")
LOGITS = torch.tensor([[0.1, 2.0, -1.0, 0.5], [3.0, 0.0, 2.9, -2.0], [0.0, 0.0, 0.0, 0.0]])
actor_case("actor_categorical", "Categorical", {"logits": LOGITS}, torch.tensor([1, 3, 2]))
actor_case(
    "actor_categorical_masked", "Categorical", {"logits": LOGITS}, torch.tensor([3, 2, 3]),
    mask=torch.tensor([[True, False, True, True], [False, True, True, True],
                       [False, False, False, True]]),
)
# no ties here: TorchRL's OneHotCategorical mode marks every tied maximum (a row of equal logits
# gives all ones), the port's mode is one_hot(argmax) (the first maximum)
LOGITS_NO_TIES = torch.tensor([[0.1, 2.0, -1.0, 0.5], [3.0, 0.0, 2.9, -2.0], [0.0, -1.0, 0.2, 0.1]])
actor_case("actor_one_hot_categorical", "OneHotCategorical", {"logits": LOGITS_NO_TIES},
           torch.tensor([[0, 0, 1, 0], [1, 0, 0, 0], [0, 0, 0, 1]]))
actor_case("actor_delta", "Delta", {"param": LOC}, LOC.clone())


# ---------------------------------------------------------------- TensorDictSequential


def sequential_case(name, modules, inputs, select=None):
    tdms = []
    for spec in modules:
        consts = spec["consts"]

        def f(*xs, consts=consts):
            s = xs[0]
            for x in xs[1:]:
                s = s + x
            outs = tuple(s + c for c in consts)
            return outs if len(outs) > 1 else outs[0]

        tdms.append(TensorDictModule(f, in_keys=[unkey(k) for k in spec["in_keys"]],
                                     out_keys=[unkey(k) for k in spec["out_keys"]]))
    seq = TensorDictSequential(*tdms)
    if select is not None:
        seq.select_out_keys(*[unkey(k) for k in select])
    td = TensorDict({}, [2])
    for k, v in inputs.items():
        td.set(unkey(k.split("/")), rt(v))
    out = seq(td.clone())
    add(
        name,
        "sequential",
        {"modules": modules, "input": {k: enc(v) for k, v in inputs.items()},
         "select_out_keys": select},
        {
            "in_keys": [key(k) for k in seq.in_keys],
            "out_keys": [key(k) for k in seq.out_keys],
            "output": [[key(k), enc(v)] for k, v in out.items(True, True)],
        },
    )


SEQ = [
    {"in_keys": [["observation"]], "out_keys": [["loc"], ["scale"]], "consts": [1.0, 2.0]},
    {"in_keys": [["loc"]], "out_keys": [["hidden", "z"]], "consts": [10.0]},
    {"in_keys": [["hidden", "z"], ["other"]], "out_keys": [["loc"]], "consts": [100.0]},
]
SEQ_IN = {"observation": torch.tensor([[1.0, 2.0], [3.0, 4.0]]),
          "other": torch.tensor([[0.5, 0.5], [-1.0, 1.0]])}
sequential_case("sequential_keys_and_values", SEQ, SEQ_IN)
sequential_case("sequential_select_out_keys", SEQ, SEQ_IN, select=[["loc"]])
sequential_case("sequential_select_nested", SEQ, SEQ_IN, select=[["hidden", "z"], ["scale"]])
SEQ_OVERWRITE = [
    {"in_keys": [["observation"]], "out_keys": [["observation"]], "consts": [1.0]},
    {"in_keys": [["observation"]], "out_keys": [["tmp"]], "consts": [5.0]},
]
sequential_case("sequential_select_keeps_overwritten_inputs", SEQ_OVERWRITE,
                {"observation": torch.tensor([[1.0], [2.0]])}, select=[["tmp"]])


# ---------------------------------------------------------------- ValueOperator


def value_case(name, seed, in_keys, out_keys, inputs, in_features):
    m, margs = build_mlp(seed, in_features, 1, 1, 4, "Tanh", False, True)
    kwargs = {}
    if in_keys is not None:
        kwargs["in_keys"] = [unkey(k) for k in in_keys]
    if out_keys is not None:
        kwargs["out_keys"] = [unkey(k) for k in out_keys]
    v = ValueOperator(m, **kwargs)
    td = TensorDict({}, [3])
    for k, x in inputs.items():
        td.set(unkey(k.split("/")), rt(x))
    with torch.no_grad():
        out = v(td.clone())
    add(
        name,
        "value_operator",
        {"in_keys": in_keys, "out_keys": out_keys, "mlp": margs,
         "inputs": {k: enc(x) for k, x in inputs.items()}},
        {
            "in_keys": [key(k) for k in v.in_keys],
            "out_keys": [key(k) for k in v.out_keys],
            "output": enc(out.get(v.out_keys[0])),
        },
    )


OBS = grid(3, 3, scale=0.4, offset=-1.7)
ACT = grid(3, 1, scale=-0.6, offset=0.5)
value_case("value_operator_default_keys", 30, None, None, {"observation": OBS}, 3)
value_case("value_operator_state_action", 31, [["observation"], ["action"]], None,
           {"observation": OBS, "action": ACT}, 4)
value_case("value_operator_custom_keys", 32, [["agent", "obs"]], [["agent", "value"]],
           {"agent/obs": OBS}, 3)


# ---------------------------------------------------------------- write

root = {
    "generator": GENERATOR,
    "versions": {
        "torch": torch.__version__,
        "torchrl": torchrl.__version__,
        "tensordict": tensordict.__version__,
        "python": platform.python_version(),
    },
    "cases": CASES,
}
with open(OUT, "w") as f:
    f.write("{\n")
    f.write(f' "generator": {json.dumps(root["generator"])},\n')
    f.write(f' "versions": {json.dumps(root["versions"])},\n')
    f.write(' "cases": [\n')
    for i, c in enumerate(CASES):
        f.write("  " + json.dumps(c) + ("," if i + 1 < len(CASES) else "") + "\n")
    f.write(" ]\n}\n")
print(f"wrote {len(CASES)} cases to {os.path.relpath(OUT)}", file=sys.stderr)
