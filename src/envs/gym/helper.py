# The Python side of torchrl's GymEnv (src/envs/gym/mod.rs), run in the embedded interpreter.
# Data crosses as JSON-friendly lists: (key path, values as float list, shape, dtype name).
import json

import gymnasium as gym
import numpy as np


def _finite(a):
    # JSON has no infinities: an infinite bound is written as null
    return [float(x) if np.isfinite(x) else None for x in np.asarray(a, dtype=np.float64).reshape(-1)]


def _describe(space):
    if isinstance(space, gym.spaces.Dict):
        return {"type": "Dict", "spaces": {k: _describe(s) for k, s in space.spaces.items()}}
    if isinstance(space, gym.spaces.Box):
        return {"type": "Box", "shape": list(space.shape), "dtype": str(space.dtype),
                "low": _finite(space.low), "high": _finite(space.high)}
    if isinstance(space, gym.spaces.Discrete):
        return {"type": "Discrete", "n": int(space.n), "start": int(space.start), "dtype": str(space.dtype)}
    if isinstance(space, gym.spaces.MultiDiscrete):
        if space.nvec.ndim != 1:
            raise ValueError("only 1-D MultiDiscrete spaces are supported, got nvec of shape %s" % (space.nvec.shape,))
        return {"type": "MultiDiscrete", "nvec": space.nvec.astype(np.int64).tolist(),
                "start": space.start.astype(np.int64).tolist(), "dtype": str(space.dtype)}
    if isinstance(space, gym.spaces.MultiBinary):
        return {"type": "MultiBinary", "shape": list(np.atleast_1d(space.n).tolist()), "dtype": str(space.dtype)}
    raise TypeError("unsupported gymnasium space %r (Box, Discrete, MultiDiscrete, MultiBinary, Dict)" % (space,))


def _flatten(obs, prefix=()):
    if isinstance(obs, dict):
        out = []
        for k, v in obs.items():
            out.extend(_flatten(v, prefix + (k,)))
        return out
    a = np.asarray(obs)
    return [(list(prefix), a.astype(np.float64).reshape(-1).tolist(), list(a.shape), str(a.dtype))]


class Handle:
    def __init__(self, env_id, num_envs, kwargs_json):
        kwargs = json.loads(kwargs_json)
        self.vector = num_envs is not None
        if self.vector:
            from gymnasium.vector import AutoresetMode, SyncVectorEnv
            self.env = SyncVectorEnv([lambda: gym.make(env_id, **kwargs) for _ in range(num_envs)],
                                     autoreset_mode=AutoresetMode.DISABLED)
            self.obs_space = self.env.single_observation_space
            self.act_space = self.env.single_action_space
        else:
            self.env = gym.make(env_id, **kwargs)
            self.obs_space = self.env.observation_space
            self.act_space = self.env.action_space

    def describe(self):
        return json.dumps({"observation": _describe(self.obs_space), "action": _describe(self.act_space)})

    def reset(self, seed, mask):
        options = None
        if mask is not None and self.vector:
            options = {"reset_mask": np.asarray(mask, dtype=bool)}
        obs, _ = self.env.reset(seed=seed, options=options)
        return _flatten(obs)

    def step(self, values, shape, dtype):
        a = np.asarray(values, dtype=np.float64).reshape(shape).astype(dtype)
        if not self.vector and isinstance(self.act_space, gym.spaces.Discrete):
            a = a.item()
        obs, reward, terminated, truncated, _ = self.env.step(a)
        out = _flatten(obs)
        r = np.asarray(reward, dtype=np.float64).reshape(-1).tolist()
        te = np.asarray(terminated, dtype=np.float64).reshape(-1).tolist()
        tr = np.asarray(truncated, dtype=np.float64).reshape(-1).tolist()
        return out, r, te, tr

    def close(self):
        self.env.close()
