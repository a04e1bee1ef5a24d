#!/usr/bin/env python
"""Record reference rollouts of the reward & episode transforms from TorchRL.

Run from the repository root:

    /root/.cache/torchrl-rs/venv/bin/python specs/record_transforms_reward.py

It writes ``specs/transforms_reward_cases.json``, which ``tests/transforms_reward.rs``
replays (Rust never runs Python).

The base env is ``Counter``, a Python mirror of the Rust ``CountingEnv``
(src/envs/builtin/counting.rs): observation float32 ``[*B, 1]`` counting the steps since
the last reset, reward 1.0 float32 ``[*B, 1]``, ``done = terminated = count >= max_steps``,
action ``Bounded(-1, 1, [*B, 1])`` (read but ignored), partial resets through ``"_reset"``.
Actions are random but never affect the data, so the Rust replay draws its own; the action
values are not recorded (only the key).

Case layout (one per line)::

    {"name": ..., "env": {"max_steps": int, "batch_size": [..]},
     "transforms": [{"class": "RewardScaling", ...kwargs}, ...],
     "rollout": {"max_steps": int, "break_when_any_done": bool},
     "expect": {"rollout": [[key, tensor], ...] | null,
                "keys": {"observation": [key..], "reward": [..], "done": [..],
                         "state": [..], "action": [..]},
                "specs": {group: [[key, spec], ...]}}}

or, for a case that fails in TorchRL, ``"expect": {"error": {"class", "message"}}``. Keys are
lists of strings; tensors are ``{"shape", "dtype", "data"}`` (row-major; float32 values written
as the exact double of the float); specs are ``{"class", "dtype", "shape"}`` plus ``low`` /
``high`` tensors for Bounded and ``n`` for Categorical.

A case may carry ``"note"``: a deliberate difference of the Rust port, asserted by the test.
"""

import json
import os
import platform
import sys
import warnings

warnings.filterwarnings("ignore")
os.environ.setdefault("RL_WARNINGS", "0")

import torch  # noqa: E402
import tensordict  # noqa: E402
import torchrl  # noqa: E402
from tensordict import TensorDict  # noqa: E402
from torchrl.data import Bounded, Categorical, Composite, Unbounded  # noqa: E402
from torchrl.envs import EnvBase, TransformedEnv  # noqa: E402
from torchrl.envs.transforms import (  # noqa: E402
    Compose,
    InitTracker,
    RewardClipping,
    RewardScaling,
    RewardSum,
    StepCounter,
    TensorDictPrimer,
)

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "transforms_reward_cases.json")
GENERATOR = "specs/record_transforms_reward.py"


class Counter(EnvBase):
    """Mirror of the Rust CountingEnv."""

    def __init__(self, max_steps, batch_size=()):
        super().__init__(batch_size=torch.Size(batch_size))
        b = tuple(batch_size)
        self.max_steps = max_steps
        self.observation_spec = Composite(observation=Unbounded((*b, 1)), shape=b)
        self.action_spec = Bounded(-1.0, 1.0, (*b, 1))
        self.reward_spec = Unbounded((*b, 1))
        self.count = torch.zeros((*b, 1))

    def _out(self, with_reward):
        done = self.count >= self.max_steps
        td = TensorDict(
            {
                "observation": self.count.clone(),
                "done": done.clone(),
                "terminated": done.clone(),
            },
            self.batch_size,
        )
        if with_reward:
            td["reward"] = torch.ones_like(self.count)
        return td

    def _reset(self, td):
        mask = None if td is None else td.get("_reset", None)
        if mask is None:
            self.count = torch.zeros_like(self.count)
        else:
            self.count = self.count.masked_fill(mask.reshape(self.count.shape), 0.0)
        return self._out(False)

    def _step(self, td):
        self.count = self.count + 1
        return self._out(True)

    def _set_seed(self, seed):
        return seed


# --------------------------------------------------------------------------- encoding

DTYPES = {
    torch.float32: "float32",
    torch.float64: "float64",
    torch.int64: "int64",
    torch.int32: "int32",
    torch.bool: "bool",
}


def enc_tensor(t):
    t = t.detach().cpu()
    if t.dtype not in DTYPES:
        raise TypeError(f"unsupported dtype {t.dtype}")
    flat = t.reshape(-1)
    if t.dtype == torch.bool:
        data = [bool(x) for x in flat.tolist()]
    elif t.dtype.is_floating_point:
        data = [float(x) for x in flat.double().tolist()]
    else:
        data = [int(x) for x in flat.tolist()]
    return {"shape": list(t.shape), "dtype": DTYPES[t.dtype], "data": data}


def enc_key(k):
    return [k] if isinstance(k, str) else list(k)


def enc_spec(s):
    out = {"class": type(s).__name__, "dtype": DTYPES[s.dtype], "shape": list(s.shape)}
    if isinstance(s, Bounded):
        out["class"] = "Bounded"
        out["low"] = enc_tensor(s.space.low)
        out["high"] = enc_tensor(s.space.high)
    elif isinstance(s, Categorical):
        out["class"] = "Categorical"
        out["n"] = int(s.space.n)
    elif isinstance(s, Unbounded):
        out["class"] = "Unbounded"
    return out


def enc_group(c):
    return [[enc_key(k), enc_spec(c[k])] for k in c.keys(True, True)]


def enc_rollout(td):
    out = []
    for k in sorted(td.keys(True, True), key=lambda k: enc_key(k)):
        v = td.get(k)
        if enc_key(k) == ["action"]:
            # random, never read by the counter: only the key is recorded
            out.append([enc_key(k), None])
        else:
            out.append([enc_key(k), enc_tensor(v)])
    return out


# --------------------------------------------------------------------------- transforms

def build_transform(d):
    d = dict(d)
    cls = d.pop("class")
    if cls == "RewardScaling":
        return RewardScaling(**d)
    if cls == "RewardSum":
        return RewardSum(**d)
    if cls == "StepCounter":
        return StepCounter(**d)
    if cls == "RewardClipping":
        return RewardClipping(**d)
    if cls == "InitTracker":
        return InitTracker(**d)
    if cls == "TensorDictPrimer":
        primers = {k: Unbounded(tuple(shape)) for k, shape in d.pop("primers").items()}
        return TensorDictPrimer(primers=primers, **d)
    raise ValueError(cls)


def case(name, max_steps, batch_size, transforms, rollout_steps, break_when_any_done, note=None):
    return {
        "name": name,
        "env": {"max_steps": max_steps, "batch_size": list(batch_size)},
        "transforms": transforms,
        "rollout": {"max_steps": rollout_steps, "break_when_any_done": break_when_any_done},
        **({"note": note} if note else {}),
    }


CASES = [
    case("reward_scaling_affine", 10, [], [{"class": "RewardScaling", "loc": 0.5, "scale": 1.5}], 4, True),
    case("reward_scaling_standard_normal", 10, [],
         [{"class": "RewardScaling", "loc": 0.5, "scale": 1.5, "standard_normal": True}], 4, True),
    case("reward_scaling_out_key", 10, [],
         [{"class": "RewardScaling", "loc": 0.5, "scale": 1.5, "out_keys": ["scaled_reward"]}], 3, True),
    case("reward_scaling_batched", 10, [4], [{"class": "RewardScaling", "loc": -1.0, "scale": 3.0}], 3, True),
    case("reward_scaling_zero_scale", 10, [], [{"class": "RewardScaling", "loc": 0.0, "scale": 0.0}], 2, True,
         note="TorchRL clamps the scale to 1e-6; the Rust port rejects scale <= 0 at construction"),
    case("reward_sum_stop", 10, [], [{"class": "RewardSum"}], 4, True),
    case("reward_sum_nonstop_done3", 3, [], [{"class": "RewardSum"}], 8, False),
    case("reward_sum_nonstop_done3_batched", 3, [2], [{"class": "RewardSum"}], 8, False),
    case("reward_sum_reward_spec", 10, [], [{"class": "RewardSum", "reward_spec": True}], 4, True),
    case("step_counter_stop", 100, [], [{"class": "StepCounter", "max_steps": 3}], 10, True),
    case("step_counter_nonstop", 100, [], [{"class": "StepCounter", "max_steps": 3}], 8, False),
    case("step_counter_nonstop_batched", 100, [4], [{"class": "StepCounter", "max_steps": 3}], 8, False),
    case("step_counter_no_max", 100, [], [{"class": "StepCounter"}], 5, True),
    case("step_counter_base_done_first", 2, [], [{"class": "StepCounter", "max_steps": 3}], 7, False),
    case("step_counter_double", 100, [],
         [{"class": "StepCounter", "max_steps": 2}, {"class": "StepCounter", "max_steps": 3}], 10, False),
    case("reward_clipping", 10, [], [{"class": "RewardClipping", "clamp_min": -0.25, "clamp_max": 0.75}], 3, True),
    case("reward_clipping_batched", 10, [4],
         [{"class": "RewardClipping", "clamp_min": 0.0, "clamp_max": 2.0}], 3, True),
    case("init_tracker_nonstop", 3, [], [{"class": "InitTracker"}], 8, False),
    case("init_tracker_batched", 3, [2], [{"class": "InitTracker"}], 5, False),
    case("step_counter_reward_sum", 100, [],
         [{"class": "StepCounter", "max_steps": 3}, {"class": "RewardSum"}], 8, False),
    case("tensordict_primer", 3, [], [{"class": "TensorDictPrimer", "primers": {"hidden": [2]}, "expand_specs": True}],
         5, False),
    case("full_stack", 5, [],
         [{"class": "StepCounter", "max_steps": 3},
          {"class": "RewardScaling", "loc": 0.5, "scale": 1.5},
          {"class": "RewardSum"},
          {"class": "InitTracker"}], 10, False),
    case("error_scaling_bounded_reward", 10, [],
         [{"class": "RewardClipping", "clamp_min": -1.0, "clamp_max": 1.0},
          {"class": "RewardScaling", "loc": 0.0, "scale": 2.0}], 3, True),
    case("error_step_counter_zero_max", 10, [], [{"class": "StepCounter", "max_steps": 0}], 3, True),
]


def run(c):
    torch.manual_seed(0)
    try:
        ts = [build_transform(t) for t in c["transforms"]]
        env = TransformedEnv(Counter(c["env"]["max_steps"], c["env"]["batch_size"]), Compose(*ts))
        env.output_spec  # noqa: B018 (spec errors surface here)
        env.input_spec  # noqa: B018
    except Exception as e:  # noqa: BLE001
        msg = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
        return {"error": {"class": type(e).__name__, "message": str(msg)}}
    keys = {
        "observation": [enc_key(k) for k in env.full_observation_spec.keys(True, True)],
        "reward": [enc_key(k) for k in env.full_reward_spec.keys(True, True)],
        "done": [enc_key(k) for k in env.full_done_spec.keys(True, True)],
        "state": [enc_key(k) for k in env.full_state_spec.keys(True, True)],
        "action": [enc_key(k) for k in env.full_action_spec.keys(True, True)],
    }
    specs = {
        "observation": enc_group(env.full_observation_spec),
        "reward": enc_group(env.full_reward_spec),
        "done": enc_group(env.full_done_spec),
        "state": enc_group(env.full_state_spec),
        "action": enc_group(env.full_action_spec),
    }
    r = c["rollout"]
    td = env.rollout(r["max_steps"], break_when_any_done=r["break_when_any_done"])
    return {"rollout": enc_rollout(td), "keys": keys, "specs": specs}


def main():
    out_cases = []
    for c in CASES:
        c = dict(c)
        c["expect"] = run(c)
        expect_error = c["name"].startswith("error_")
        if expect_error != ("error" in c["expect"]):
            sys.exit(f"case {c['name']}: unexpected outcome {c['expect']}")
        out_cases.append(c)
    versions = {
        "torch": torch.__version__,
        "torchrl": torchrl.__version__,
        "tensordict": tensordict.__version__,
        "python": platform.python_version(),
    }
    lines = ['{"generator": ' + json.dumps(GENERATOR) + ",",
             ' "versions": ' + json.dumps(versions) + ",",
             ' "cases": [']
    for i, c in enumerate(out_cases):
        sep = "," if i + 1 < len(out_cases) else ""
        lines.append("  " + json.dumps(c) + sep)
    lines.append(" ]}")
    with open(OUT, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {len(out_cases)} cases to {os.path.relpath(OUT)}")


if __name__ == "__main__":
    main()
