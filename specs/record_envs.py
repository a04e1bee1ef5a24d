"""Records EnvBase reference cases from TorchRL 0.14.1 into specs/env_cases.json.

A Python counting env mirrors torchrl::envs::builtin::CountingEnv exactly (observation float32
[*B, 1] counting steps since reset, reward 1.0 [*B, 1], done = terminated = count >= max_steps,
action Bounded(-1, 1, [*B, 1])). Run: ~/.cache/torchrl-rs/venv/bin/python specs/record_envs.py
"""
import json, os, warnings
warnings.filterwarnings("ignore")
import torch
import torchrl
from tensordict import TensorDict
from torchrl.data import Bounded, Composite, Unbounded
from torchrl.envs import EnvBase
from torchrl.envs.utils import check_env_specs

torch.manual_seed(0)


class Counter(EnvBase):
    def __init__(self, max_steps=5, batch_size=(), omit_obs=False, extra=False):
        super().__init__(batch_size=torch.Size(batch_size))
        b = tuple(batch_size)
        self.observation_spec = Composite(observation=Unbounded(b + (1,)), shape=b)
        self.action_spec = Bounded(-1, 1, b + (1,))
        self.reward_spec = Unbounded(b + (1,))
        self.max_steps, self.omit_obs, self.extra = max_steps, omit_obs, extra
        self.count = torch.zeros(b + (1,))

    def _out(self, reward):
        done = self.count >= self.max_steps
        d = {"done": done, "terminated": done.clone()}
        if not self.omit_obs:
            d["observation"] = self.count.clone()
        if reward:
            d["reward"] = torch.ones_like(self.count)
            if self.extra:
                d["extra"] = torch.zeros_like(self.count)
        return TensorDict(d, batch_size=self.batch_size)

    def _reset(self, td=None, **kw):
        if td is not None and "_reset" in td.keys():
            self.count = self.count.masked_fill(td["_reset"].view_as(self.count), 0)
        else:
            self.count = torch.zeros_like(self.count)
        return self._out(False)

    def _step(self, td):
        self.count = self.count + 1
        return self._out(True)

    def _set_seed(self, seed):
        pass


def enc(t):
    t = t.detach()
    return {"shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", ""),
            "data": t.reshape(-1).tolist()}


def key(k):
    return [k] if isinstance(k, str) else list(k)


def err(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001
        return {"class": type(e).__name__, "message": str(e)}
    return None


cases = []
LEAVES = [("observation",), ("next", "observation"), ("next", "reward"), ("next", "done"),
          ("next", "terminated"), ("done",)]


def rollout_case(name, max_steps, batch, steps, **kw):
    env = Counter(max_steps, batch)
    r = env.rollout(steps, **kw)
    cases.append({"name": name, "op": "rollout",
                  "args": {"max_steps": max_steps, "batch_size": list(batch), "steps": steps,
                           **{k: v for k, v in kw.items()}},
                  "expect": {"batch_size": list(r.batch_size),
                             "keys": sorted(key(k) for k in r.keys(True, True)),
                             "values": {"/".join(k): enc(r[k]) for k in LEAVES}}})


rollout_case("rollout_breaks_on_done", 5, (), 10)
rollout_case("rollout_no_break_auto_resets", 5, (), 12, break_when_any_done=False)
rollout_case("rollout_batched_no_break", 3, (2,), 7, break_when_any_done=False)
rollout_case("rollout_batched_breaks", 3, (2,), 7)

env = Counter(5, ())
cases.append({"name": "key_lists", "op": "keys", "args": {"max_steps": 5, "batch_size": []},
              "expect": {"done_keys": [key(k) for k in env.done_keys],
                         "reset_keys": [key(k) for k in env.reset_keys],
                         "action_keys": [key(k) for k in env.action_keys],
                         "reward_keys": [key(k) for k in env.reward_keys],
                         "observation_keys": [key(k) for k in env.observation_keys],
                         "fake_keys": sorted(key(k) for k in env.fake_tensordict().keys(True, True))}})
td = env.step(env.rand_action(env.reset()))
cases.append({"name": "step_mdp_keys", "op": "step_mdp", "args": {"max_steps": 5, "batch_size": []},
              "expect": {"keys": sorted(key(k) for k in env.step_mdp(td).keys(True, True)),
                         "observation": enc(env.step_mdp(td)["observation"])}})

# Partial reset on a batched env: run 2 steps, then reset only element 0.
env = Counter(10, (3,))
td = env.reset()
for _ in range(2):
    td = env.step_mdp(env.step(env.rand_action(td)))
td["_reset"] = torch.tensor([[True], [False], [True]])
out = env.reset(td)
cases.append({"name": "partial_reset", "op": "partial_reset",
              "args": {"max_steps": 10, "batch_size": [3], "steps_before": 2, "mask": [True, False, True]},
              "expect": {"observation": enc(out["observation"]), "done": enc(out["done"])}})

cases.append({"name": "error_set_truncated_without_key", "op": "rollout_error",
              "args": {"max_steps": 5, "batch_size": [], "steps": 3, "set_truncated": True},
              "expect": {"error": err(lambda: Counter(5, ()).rollout(3, set_truncated=True)),
                         "facts": ["truncated"]}})
cases.append({"name": "error_done_after_reset", "op": "reset_error",
              "args": {"max_steps": 0, "batch_size": []},
              "expect": {"error": err(lambda: Counter(0, ()).reset()), "facts": ["done", "reset"]}})
cases.append({"name": "check_env_specs_missing_observation", "op": "check_error",
              "args": {"variant": "omit_obs"},
              "expect": {"error": err(lambda: check_env_specs(Counter(5, (), omit_obs=True))),
                         "facts": ["observation"]}})
cases.append({"name": "check_env_specs_extra_key", "op": "check_error",
              "args": {"variant": "extra"},
              "expect": {"error": err(lambda: check_env_specs(Counter(5, (), extra=True))),
                         "facts": ["extra"]}})

out = {"generator": "specs/record_envs.py",
       "versions": {"torch": torch.__version__, "torchrl": torchrl.__version__},
       "cases": cases}
path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "env_cases.json")
with open(path, "w") as f:
    json.dump(out, f, indent=1)
print(f"wrote {len(cases)} cases to {path}")
