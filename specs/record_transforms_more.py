#!/usr/bin/env python
"""Record reference rollouts of FrameSkipTransform, VecNorm and ClipTransform from TorchRL.

Run from the repository root:

    /root/.cache/torchrl-rs/venv/bin/python specs/record_transforms_more.py

It writes ``specs/transforms_more_cases.json``, which ``tests/transforms_more.rs`` replays
(Rust never runs Python). The base env is ``Counter`` from ``record_transforms_reward.py``
(a Python mirror of the Rust ``CountingEnv``: observation float32 ``[*B, 1]`` counting the
steps since the last reset, reward 1.0, ``done = terminated = count >= max_steps``, partial
resets through ``"_reset"``); the encoding helpers are that script's too. Actions are random
but never read by the counter, so only their key is recorded.

``VecNorm`` is TorchRL's ``VecNorm`` with ``new_api=False`` (0.14's default); its statistics
(``VecNorm._td``: ``<key>_sum``, ``<key>_ssq``, ``<key>_count``) after the rollout are recorded
under ``"vecnorm_state"``.

Case layout (one per line): the layout of ``transforms_reward_cases.json`` plus
``"vecnorm_state": [[key, tensor], ...]`` for the VecNorm cases.
"""

import json
import os
import platform
import sys
import warnings

warnings.filterwarnings("ignore")
os.environ.setdefault("RL_WARNINGS", "0")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402
import tensordict  # noqa: E402
import torchrl  # noqa: E402
from torchrl.envs import TransformedEnv  # noqa: E402
from torchrl.envs.transforms import (  # noqa: E402
    ClipTransform,
    Compose,
    FrameSkipTransform,
    StepCounter,
    VecNorm,
)

from record_transforms_reward import (  # noqa: E402
    Counter,
    case,
    enc_group,
    enc_key,
    enc_rollout,
    enc_tensor,
)

OUT = os.path.join(HERE, "transforms_more_cases.json")
GENERATOR = "specs/record_transforms_more.py"


def build_transform(d):
    d = dict(d)
    cls = d.pop("class")
    if cls == "FrameSkipTransform":
        return FrameSkipTransform(**d)
    if cls == "VecNorm":
        return VecNorm(new_api=False, **d)
    if cls == "ClipTransform":
        return ClipTransform(**d)
    if cls == "StepCounter":
        return StepCounter(**d)
    raise ValueError(cls)


CASES = [
    case("frame_skip_3", 100, [], [{"class": "FrameSkipTransform", "frame_skip": 3}], 4, True),
    case("frame_skip_1", 100, [], [{"class": "FrameSkipTransform", "frame_skip": 1}], 3, True),
    # done on an inner frame: TorchRL keeps stepping to the end of the skip
    case("frame_skip_past_done", 4, [], [{"class": "FrameSkipTransform", "frame_skip": 3}], 5, True),
    case("frame_skip_nonstop_batched", 5, [2], [{"class": "FrameSkipTransform", "frame_skip": 2}], 6, False),
    # the frame skip drives a parent that has a transform of its own
    case("frame_skip_after_step_counter", 100, [],
         [{"class": "StepCounter"}, {"class": "FrameSkipTransform", "frame_skip": 2}], 3, True),
    case("vecnorm_defaults", 100, [], [{"class": "VecNorm"}], 5, True),
    case("vecnorm_decay_batched_nonstop", 3, [3],
         [{"class": "VecNorm", "in_keys": ["observation"], "decay": 0.9, "eps": 1e-4}], 7, False),
    case("vecnorm_reward_only", 100, [2], [{"class": "VecNorm", "in_keys": ["reward"], "decay": 0.5}], 4, True),
    case("vecnorm_out_keys", 100, [], [{"class": "VecNorm", "in_keys": ["observation"],
                                        "out_keys": ["obs_norm"], "decay": 0.99}], 4, True),
    case("clip_observation", 100, [], [{"class": "ClipTransform", "in_keys": ["observation"],
                                        "low": 0.5, "high": 2.5}], 4, True),
    case("clip_reward_high_only", 100, [2], [{"class": "ClipTransform", "in_keys": ["reward"], "high": 0.3}], 3, True),
    case("clip_low_only_out_key", 100, [], [{"class": "ClipTransform", "in_keys": ["observation"],
                                             "out_keys": ["obs_clipped"], "low": 1.5}], 3, True),
    case("clip_observation_and_reward", 3, [2], [{"class": "ClipTransform", "in_keys": ["observation", "reward"],
                                                  "low": -0.1, "high": 1.7}], 6, False),
]


def run(c):
    torch.manual_seed(0)
    ts = [build_transform(t) for t in c["transforms"]]
    env = TransformedEnv(Counter(c["env"]["max_steps"], c["env"]["batch_size"]), Compose(*ts))
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
    out = {"rollout": enc_rollout(td), "keys": keys, "specs": specs}
    for t in ts:
        if isinstance(t, VecNorm):
            st = t._td
            out["vecnorm_state"] = [[enc_key(k), enc_tensor(st.get(k))] for k in sorted(st.keys(True, True))]
    return out


def main():
    out_cases = []
    for c in CASES:
        c = dict(c)
        c["expect"] = run(c)
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
