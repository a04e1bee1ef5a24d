#!/usr/bin/env python
"""Record reference cases for the key, dtype and normalisation transforms.

Run from the repository root:

    /root/.cache/torchrl-rs/venv/bin/python specs/record_transforms_keys.py

It writes ``specs/transforms_keys_cases.json``, replayed by ``tests/transforms_keys.rs``
(which never runs Python). The encoders (tensors, specs, keys) are those of
``specs/record.py``; see specs/README.md for the encodings.

The Python test env ``KeysEnv`` mirrors the Rust one in ``tests/transforms_keys.rs``
exactly:

- batch size ``batch``; a float32 counter ``count`` of shape ``[*batch, 1]``, zeroed at
  reset (only where ``_reset`` is set, for partial resets), incremented by 1 per step;
- observations, in this order: ``observation`` = count (shape ``[*batch, 1]``, spec
  ``Unbounded`` or ``Bounded(lo, hi)``), ``b`` = count repeated (``[*batch, 2]``),
  ``a`` = -count repeated (``[*batch, 3]``), all of dtype ``dtype``;
- action ``Bounded(-1, 1, [*batch, 1])`` of dtype ``act_dtype``; the env checks the action's
  dtype and returns it as the reward (cast to ``dtype``), so inverse transforms are visible in
  the data;
- reward ``Unbounded([*batch, 1])`` of dtype ``dtype``;
- ``done = terminated = count >= max_steps``.

Every rollout uses the same deterministic policy: each action key is set to 0.5 (with the
action spec's shape and dtype).

Case kinds (``op``):

- ``env``: build the env, append the transforms, record the key lists, the transformed specs
  (leaf by leaf), an optional rollout (all leaves, flattened) and transform attributes
  (``extra``); or the error raised.
- ``forward``: a standalone transform applied to a tensordict (``Transform.forward``).
- ``init_stats_error``: ``ObservationNorm.init_stats`` raising.
"""

import logging
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import record as R  # noqa: E402  (shared encoders; importing it runs nothing)
import torch  # noqa: E402
from tensordict import TensorDict  # noqa: E402
from torchrl.data import Bounded, Composite, Unbounded  # noqa: E402
from torchrl.envs import EnvBase, TransformedEnv  # noqa: E402
from torchrl.envs.transforms import (  # noqa: E402
    CatTensors,
    DoubleToFloat,
    ExcludeTransform,
    ObservationNorm,
    RenameTransform,
    SelectTransform,
    UnsqueezeTransform,
)
from torchrl.envs.utils import check_env_specs  # noqa: E402

logging.getLogger("torchrl").setLevel(logging.WARNING)

GENERATOR = "specs/record_transforms_keys.py"
OUT = os.path.join(HERE, "transforms_keys_cases.json")


# --------------------------------------------------------------------------
# the test env (mirrored in tests/transforms_keys.rs)
# --------------------------------------------------------------------------


class KeysEnv(EnvBase):
    def __init__(self, batch=(), max_steps=100, dtype="float32", act_dtype=None, obs_bounds=None):
        super().__init__(batch_size=torch.Size(batch))
        b = tuple(batch)
        self.dtype = R.DTYPES[dtype]
        self.act_dtype = R.DTYPES[act_dtype or dtype]
        self.max_steps = max_steps
        if obs_bounds is None:
            obs = Unbounded((*b, 1), dtype=self.dtype)
        else:
            obs = Bounded(obs_bounds[0], obs_bounds[1], (*b, 1), dtype=self.dtype)
        self.observation_spec = Composite(
            observation=obs,
            b=Unbounded((*b, 2), dtype=self.dtype),
            a=Unbounded((*b, 3), dtype=self.dtype),
            shape=b,
        )
        self.action_spec = Bounded(-1.0, 1.0, (*b, 1), dtype=self.act_dtype)
        self.reward_spec = Unbounded((*b, 1), dtype=self.dtype)
        self.count = torch.zeros((*b, 1))

    def _out(self):
        bs = tuple(self.batch_size)
        done = self.count >= self.max_steps
        return TensorDict(
            {
                "observation": self.count.to(self.dtype).clone(),
                "b": self.count.expand(*bs, 2).to(self.dtype).clone(),
                "a": (-self.count).expand(*bs, 3).to(self.dtype).clone(),
                "done": done.clone(),
                "terminated": done.clone(),
            },
            batch_size=self.batch_size,
        )

    def _reset(self, td=None):
        if td is not None and "_reset" in td.keys():
            mask = td["_reset"].reshape(self.count.shape)
            self.count = self.count.masked_fill(mask, 0.0)
        else:
            self.count = torch.zeros_like(self.count)
        return self._out()

    def _step(self, td):
        action = td["action"]
        assert action.dtype == self.act_dtype, (action.dtype, self.act_dtype)
        self.count = self.count + 1
        out = self._out()
        out["reward"] = action.to(self.dtype).reshape(self.count.shape).clone()
        return out

    def _set_seed(self, seed):
        return seed


def make_env(cfg):
    return KeysEnv(
        batch=cfg.get("batch", []),
        max_steps=cfg.get("max_steps", 100),
        dtype=cfg.get("dtype", "float32"),
        act_dtype=cfg.get("act_dtype"),
        obs_bounds=cfg.get("obs_bounds"),
    )


def key(k):
    """JSON key (list of strings) -> python key."""
    assert isinstance(k, list) and k, k
    return k[0] if len(k) == 1 else tuple(k)


def keys(ks):
    return None if ks is None else [key(k) for k in ks]


def make_transform(d):
    """A transform descriptor (JSON) -> a TorchRL transform (same vocabulary as the Rust
    replayer's `build_transform`)."""
    c = d["class"]
    if c == "DoubleToFloat":
        return DoubleToFloat(in_keys=keys(d.get("in_keys")), in_keys_inv=keys(d.get("in_keys_inv")))
    if c == "ObservationNorm":
        return ObservationNorm(
            loc=d.get("loc"),
            scale=d.get("scale"),
            in_keys=keys(d.get("in_keys")),
            in_keys_inv=keys(d.get("in_keys_inv")),
            standard_normal=d.get("standard_normal", False),
        )
    if c == "CatTensors":
        return CatTensors(
            in_keys=keys(d["in_keys"]),
            out_key=key(d.get("out_key", ["observation_vector"])),
            dim=d.get("dim", -1),
            del_keys=d.get("del_keys", True),
            sort=d.get("sort", True),
        )
    if c == "RenameTransform":
        return RenameTransform(
            keys(d["in_keys"]),
            keys(d["out_keys"]),
            keys(d.get("in_keys_inv")),
            keys(d.get("out_keys_inv")),
            create_copy=d.get("create_copy", False),
        )
    if c == "ExcludeTransform":
        return ExcludeTransform(*keys(d["keys"]))
    if c == "SelectTransform":
        return SelectTransform(
            *keys(d["keys"]),
            keep_rewards=d.get("keep_rewards", True),
            keep_dones=d.get("keep_dones", True),
        )
    if c == "UnsqueezeTransform":
        return UnsqueezeTransform(
            d["dim"],
            allow_positive_dim=d["dim"] >= 0,
            in_keys=keys(d.get("in_keys")),
            in_keys_inv=keys(d.get("in_keys_inv")),
        )
    raise ValueError(c)


def init_stats(t, env_cfg, init):
    t.init_stats(
        init["num_iter"],
        reduce_dim=init["reduce_dim"][0] if len(init.get("reduce_dim", [0])) == 1 else tuple(init["reduce_dim"]),
        cat_dim=init.get("cat_dim"),
        key=None if init.get("key") is None else key(init["key"]),
    )


def policy(env):
    def p(td):
        for k in env.action_keys:
            s = env.full_action_spec[k]
            td.set(k, torch.full(s.shape, 0.5, dtype=s.dtype))
        return td

    return p


def enc_keys(ks):
    return [R.enc_key(k) for k in ks]


def enc_leaves(td):
    """Every leaf of a tensordict, flattened: [[key, tensor], ...] sorted by key."""
    items = [(R.enc_key(k), R.enc_tensor(v)) for k, v in td.items(True, True)]
    items.sort(key=lambda kv: kv[0])
    return [[k, v] for k, v in items]


def enc_group(spec):
    items = [(R.enc_key(k), R.enc_spec(v)) for k, v in spec.items(True, True)]
    items.sort(key=lambda kv: kv[0])
    return [[k, v] for k, v in items]


def run_env_case(a):
    torch.manual_seed(0)
    base = make_env(a["env"])
    env = TransformedEnv(base)
    before = base.full_observation_spec.clone()
    ts = []
    for d in a["transforms"]:
        t = make_transform(d)
        env.append_transform(t)
        if d.get("init") is not None:
            init_stats(t, a["env"], d["init"])
        ts.append(t)
    out = {
        "keys": {
            "observation": enc_keys(env.observation_keys),
            "reward": enc_keys(env.reward_keys),
            "done": enc_keys(env.done_keys),
            "action": enc_keys(env.action_keys),
            "state": enc_keys(env.state_keys),
        },
        "specs": {
            "observation": enc_group(env.full_observation_spec),
            "reward": enc_group(env.full_reward_spec),
            "done": enc_group(env.full_done_spec),
            "action": enc_group(env.full_action_spec),
            "state": enc_group(env.full_state_spec),
        },
    }
    assert bool(base.full_observation_spec == before), "the base env's specs changed"
    steps = a.get("rollout_steps")
    if steps is not None:
        torch.manual_seed(0)
        traj = env.rollout(steps, policy=policy(env))
        out["rollout"] = {"batch_size": list(traj.batch_size), "leaves": enc_leaves(traj)}
    extra = {}
    for i, (d, t) in enumerate(zip(a["transforms"], ts)):
        if d["class"] == "DoubleToFloat":
            extra[f"{i}.in_keys"] = enc_keys(t.in_keys)
            extra[f"{i}.in_keys_inv"] = enc_keys(t.in_keys_inv)
        if d["class"] == "ObservationNorm":
            extra[f"{i}.loc"] = R.enc_tensor(t.loc)
            extra[f"{i}.scale"] = R.enc_tensor(t.scale)
        if d["class"] == "CatTensors":
            extra[f"{i}.in_keys"] = enc_keys(t.in_keys)
    out["extra"] = extra
    try:
        check_env_specs(env, seed=0)
        out["python_check_env_specs"] = True
    except Exception as e:  # noqa: BLE001 (recorded, not fatal)
        out["python_check_env_specs"] = R.normalise(R.exc_message(e))[:200]
    return out


def run_forward_case(a):
    t = make_transform(a["transform"])
    td = R.dec_td(a["td"])
    res = t(td)
    return {"batch_size": list(res.batch_size), "leaves": enc_leaves(res)}


def run_init_stats_error(a):
    base = make_env(a["env"])
    t = make_transform(a["transform"])
    env = TransformedEnv(base, t)
    init_stats(t, a["env"], a["init"])
    return None


RUNNERS = {
    "env": run_env_case,
    "forward": run_forward_case,
    "init_stats_error": run_init_stats_error,
}


class Recorder:
    def __init__(self):
        self.cases = []
        self.names = set()

    def case(self, name, op, args, error=None, facts=()):
        """`error`: the expected exception class name (None: success expected)."""
        assert name not in self.names, name
        self.names.add(name)
        try:
            expect = RUNNERS[op](args)
            if error is not None:
                raise AssertionError(f"{name}: expected {error}, got success")
        except AssertionError:
            raise
        except Exception as e:  # noqa: BLE001
            if error is None or type(e).__name__ != error:
                raise AssertionError(f"{name}: unexpected {type(e).__name__}: {e}") from e
            msg = R.normalise(R.exc_message(e))
            for f in facts:
                assert f in msg, (name, f, msg)
            expect = {"error": {"class": type(e).__name__, "message": msg, "facts": list(facts)}}
        self.cases.append({"name": name, "op": op, "args": args, "expect": expect})


def k(*parts):
    return list(parts)


def cases():
    r = Recorder()
    f64 = {"dtype": "float64"}
    f32 = {"dtype": "float32"}

    # ---------------------------------------------------------------- DoubleToFloat
    for b in ([], [2]):
        sfx = "" if not b else "_batched"
        r.case(f"d2f_auto{sfx}", "env", {
            "env": {**f64, "batch": b, "max_steps": 3},
            "transforms": [{"class": "DoubleToFloat"}],
            "rollout_steps": 4,
        })
    r.case("d2f_explicit_in_keys", "env", {
        "env": {**f64, "max_steps": 3},
        "transforms": [{"class": "DoubleToFloat", "in_keys": [k("observation")]}],
        "rollout_steps": 2,
    })
    r.case("d2f_explicit_with_inverse", "env", {
        "env": {**f64},
        "transforms": [{"class": "DoubleToFloat", "in_keys": [k("observation"), k("reward")],
                        "in_keys_inv": [k("action")]}],
        "rollout_steps": 2,
    })
    r.case("d2f_listed_key_wrong_dtype", "env", {
        "env": {**f32},
        "transforms": [{"class": "DoubleToFloat", "in_keys": [k("observation")]}],
    }, error="TypeError", facts=["observation"])

    # ---------------------------------------------------------------- ObservationNorm
    for std in (False, True):
        sfx = "_standard_normal" if std else ""
        r.case(f"obsnorm_bounded_spec{sfx}", "env", {
            "env": {**f32, "obs_bounds": [0.0, 1.0]},
            "transforms": [{"class": "ObservationNorm", "loc": 1.0, "scale": 2.0,
                            "in_keys": [k("observation")], "standard_normal": std}],
        })
        r.case(f"obsnorm_rollout{sfx}", "env", {
            "env": {**f32},
            "transforms": [{"class": "ObservationNorm", "loc": 1.0, "scale": 2.0,
                            "in_keys": [k("observation")], "standard_normal": std}],
            "rollout_steps": 3,
        })
        r.case(f"obsnorm_init_stats{sfx}", "env", {
            "env": {**f32},
            "transforms": [{"class": "ObservationNorm", "in_keys": [k("observation")],
                            "standard_normal": std,
                            "init": {"num_iter": 10, "reduce_dim": [0]}}],
            "rollout_steps": 3,
        })
    r.case("obsnorm_init_stats_batched", "env", {
        "env": {**f32, "batch": [2]},
        "transforms": [{"class": "ObservationNorm", "in_keys": [k("b")],
                        "init": {"num_iter": 10, "reduce_dim": [0, 1], "cat_dim": 1}}],
        "rollout_steps": 2,
    })
    r.case("obsnorm_init_stats_key", "env", {
        "env": {**f32},
        "transforms": [{"class": "ObservationNorm", "in_keys": [k("observation"), k("b")],
                        "init": {"num_iter": 6, "reduce_dim": [0], "key": k("observation")}}],
        "rollout_steps": 2,
    })
    r.case("obsnorm_inverse_action", "env", {
        "env": {**f32},
        "transforms": [{"class": "ObservationNorm", "loc": 1.0, "scale": 2.0,
                        "in_keys": [k("observation")], "in_keys_inv": [k("action")]}],
        "rollout_steps": 3,
    })
    r.case("obsnorm_no_in_keys", "env", {
        "env": {**f32},
        "transforms": [{"class": "ObservationNorm", "loc": 1.0, "scale": 2.0}],
    }, error="RuntimeError", facts=["in_keys"])
    r.case("obsnorm_init_stats_already_initialized", "init_stats_error", {
        "env": {**f32},
        "transform": {"class": "ObservationNorm", "loc": 0.0, "scale": 1.0, "in_keys": [k("observation")]},
        "init": {"num_iter": 10, "reduce_dim": [0]},
    }, error="RuntimeError", facts=["are already initialized"])
    r.case("obsnorm_init_stats_multiple_keys", "init_stats_error", {
        "env": {**f32},
        "transform": {"class": "ObservationNorm", "in_keys": [k("observation"), k("b")]},
        "init": {"num_iter": 10, "reduce_dim": [0]},
    }, error="RuntimeError", facts=["multiple in_keys"])
    r.case("obsnorm_init_stats_no_cat_dim", "init_stats_error", {
        "env": {**f32},
        "transform": {"class": "ObservationNorm", "in_keys": [k("observation")]},
        "init": {"num_iter": 10, "reduce_dim": [0, 1]},
    }, error="ValueError", facts=["cat_dim must be specified"])
    r.case("obsnorm_init_stats_cat_dim_not_reduced", "init_stats_error", {
        "env": {**f32},
        "transform": {"class": "ObservationNorm", "in_keys": [k("observation")]},
        "init": {"num_iter": 10, "reduce_dim": [0], "cat_dim": 1},
    }, error="ValueError", facts=["cat_dim must be part of or equal to reduce_dim"])
    r.case("obsnorm_forward_uninitialized", "forward", {
        "transform": {"class": "ObservationNorm", "in_keys": [k("observation")]},
        "td": R.enc_td(TensorDict({"observation": torch.zeros(1)}, [])),
    }, error="RuntimeError", facts=["have not been initialized"])

    # ---------------------------------------------------------------- CatTensors
    ab = R.enc_td(TensorDict({"a": torch.zeros(3), "b": torch.ones(2)}, []))
    r.case("cat_forward_sorted", "forward", {
        "transform": {"class": "CatTensors", "in_keys": [k("b"), k("a")]}, "td": ab})
    r.case("cat_forward_unsorted", "forward", {
        "transform": {"class": "CatTensors", "in_keys": [k("b"), k("a")], "sort": False}, "td": ab})
    for b in ([], [2]):
        sfx = "" if not b else "_batched"
        r.case(f"cat_env_sorted{sfx}", "env", {
            "env": {**f32, "batch": b, "max_steps": 2},
            "transforms": [{"class": "CatTensors", "in_keys": [k("b"), k("a"), k("observation")]}],
            "rollout_steps": 3,
        })
    r.case("cat_env_unsorted_keep_keys", "env", {
        "env": {**f32},
        "transforms": [{"class": "CatTensors", "in_keys": [k("b"), k("a")], "sort": False,
                        "del_keys": False, "out_key": k("nested", "cat")}],
        "rollout_steps": 2,
    })
    r.case("cat_env_missing_key", "env", {
        "env": {**f32},
        "transforms": [{"class": "CatTensors", "in_keys": [k("a"), k("zzz")]}],
    }, error="ValueError")

    # ---------------------------------------------------------------- RenameTransform
    # Renaming the reward to a nested key: specs and key lists only. (The Rust rollout of
    # this env fails in the core's step_mdp, which leaves an empty "nested" level at the root
    # after dropping the reward; see `rename_nested_reward_rollout` in the Rust tests.)
    r.case("rename_forward_nested_reward", "env", {
        "env": {**f32, "max_steps": 2},
        "transforms": [{"class": "RenameTransform", "in_keys": [k("observation"), k("reward")],
                        "out_keys": [k("stuff"), k("nested", "reward")]}],
    })
    r.case("rename_forward", "env", {
        "env": {**f32, "max_steps": 2},
        "transforms": [{"class": "RenameTransform", "in_keys": [k("observation"), k("reward"), k("b")],
                        "out_keys": [k("stuff"), k("bonus"), k("agent", "b")]}],
        "rollout_steps": 3,
    })
    r.case("rename_create_copy", "env", {
        "env": {**f32},
        "transforms": [{"class": "RenameTransform", "in_keys": [k("observation"), k("reward")],
                        "out_keys": [k("stuff"), k("reward2")], "create_copy": True}],
        "rollout_steps": 2,
    })
    r.case("rename_inverse_action", "env", {
        "env": {**f32},
        "transforms": [{"class": "RenameTransform", "in_keys": [], "out_keys": [],
                        "in_keys_inv": [k("action")], "out_keys_inv": [k("agent", "action")]}],
        "rollout_steps": 3,
    })
    r.case("rename_length_mismatch", "env", {
        "env": {**f32},
        "transforms": [{"class": "RenameTransform", "in_keys": [k("observation"), k("reward")],
                        "out_keys": [k("x")]}],
    }, error="ValueError", facts=["should match the number of"])
    r.case("rename_overlap", "env", {
        "env": {**f32},
        "transforms": [{"class": "RenameTransform", "in_keys": [k("a"), k("b")],
                        "out_keys": [k("b"), k("c")]}],
    }, error="ValueError", facts=["because order is unclear"])

    # ---------------------------------------------------------------- ExcludeTransform
    r.case("exclude_terminated", "env", {
        "env": {**f32, "max_steps": 2},
        "transforms": [{"class": "ExcludeTransform", "keys": [k("terminated")]}],
        "rollout_steps": 3,
    })
    r.case("exclude_observations", "env", {
        "env": {**f32},
        "transforms": [{"class": "ExcludeTransform", "keys": [k("a"), k("b")]}],
        "rollout_steps": 2,
    })
    r.case("exclude_nonexistent", "env", {
        "env": {**f32},
        "transforms": [{"class": "ExcludeTransform", "keys": [k("nonexistent")]}],
    }, error="KeyError", facts=["nonexistent"])

    # ---------------------------------------------------------------- SelectTransform
    r.case("select_observation", "env", {
        "env": {**f32, "max_steps": 2},
        "transforms": [{"class": "SelectTransform", "keys": [k("observation")]}],
        "rollout_steps": 3,
    })
    r.case("select_no_dones", "env", {
        "env": {**f32},
        "transforms": [{"class": "SelectTransform", "keys": [k("observation"), k("done")],
                        "keep_dones": False}],
        "rollout_steps": 2,
    })
    r.case("select_no_rewards", "env", {
        "env": {**f32, "batch": [2]},
        "transforms": [{"class": "SelectTransform", "keys": [k("a")], "keep_rewards": False}],
        "rollout_steps": 2,
    })

    # ---------------------------------------------------------------- UnsqueezeTransform
    r.case("unsqueeze_last", "env", {
        "env": {**f32, "obs_bounds": [0.0, 10.0]},
        "transforms": [{"class": "UnsqueezeTransform", "dim": -1, "in_keys": [k("observation")]}],
        "rollout_steps": 2,
    })
    r.case("unsqueeze_positive_batched", "env", {
        "env": {**f32, "batch": [2]},
        "transforms": [{"class": "UnsqueezeTransform", "dim": 0, "in_keys": [k("b"), k("reward")]}],
        "rollout_steps": 2,
    })
    r.case("unsqueeze_inverse_action", "env", {
        "env": {**f32},
        "transforms": [{"class": "UnsqueezeTransform", "dim": -1, "in_keys": [],
                        "in_keys_inv": [k("action")]}],
        "rollout_steps": 2,
    })

    # ---------------------------------------------------------------- stacks
    r.case("stack_d2f_rename_cat", "env", {
        "env": {**f64, "max_steps": 2},
        "transforms": [
            {"class": "DoubleToFloat"},
            {"class": "RenameTransform", "in_keys": [k("observation")], "out_keys": [k("obs")]},
            {"class": "CatTensors", "in_keys": [k("obs"), k("b")], "out_key": k("vec")},
        ],
        "rollout_steps": 3,
    })
    return r.cases


def write(path, cs):
    R.GENERATOR = GENERATOR
    R.write(path, cs)


if __name__ == "__main__":
    write(OUT, cases())
