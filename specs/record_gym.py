#!/usr/bin/env python
"""Record reference trajectories of gymnasium's classic-control environments.

Run from the repository root:

    /root/.cache/torchrl-rs/venv/bin/python specs/record_gym.py

It writes ``specs/gym_cases.json``, which ``tests/builtin_envs.rs`` replays against
``PendulumEnv``, ``CartPoleEnv`` and ``MountainCarContinuousEnv`` (the Rust tests never run
Python).

Each case:

1. makes the gymnasium env (``gymnasium.make(env_id)``) and resets it with ``seed``;
2. optionally overrides ``env.unwrapped.state`` with a hand-picked start (to reach a branch
   of the dynamics that random play rarely reaches: the cart leaving the track, the car
   hitting the left wall);
3. reads the initial state from ``env.unwrapped.state`` (float64) and the initial
   observation (recomputed from that state, as ``reset`` computes it);
4. applies the action sequence (random actions drawn from the action space with
   ``numpy.random.default_rng(seed)``, or a simple hand-written controller, still stored as
   a plain list of actions), stopping at the first ``terminated`` step;
5. stores the actions, the observations, rewards and terminated flags that ``step``
   returned.

Encodings: float32 values (observations, continuous actions) are written as the exact
double of the float32 value; states and rewards are float64 (gymnasium's own types).
Discrete CartPole actions are integers (0 = push left, 1 = push right).

The output is deterministic: running the script twice gives identical files. The script
aborts when a branch that the cases are meant to cover is not reached (see ``COVERAGE``).
"""

import json
import math
import os
import platform
import sys
import warnings

warnings.filterwarnings("ignore")

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gym_cases.json")
N_STEPS = 50

# Branches of the dynamics that at least one case must exercise.
COVERAGE = {
    "pendulum_speed_clip": False,  # |thdot| reaches max_speed = 8
    "pendulum_angle_wrap": False,  # |th| > pi (angle_normalize matters)
    "pendulum_action_clip": False,  # an action outside [-2, 2]
    "cartpole_theta_terminated": False,
    "cartpole_x_terminated": False,
    "cartpole_full_length": False,  # 50 steps without termination
    "mountaincar_goal": False,  # reaching the goal terminates (+100)
    "mountaincar_left_wall": False,  # position clipped to -1.2, velocity zeroed
    "mountaincar_action_clip": False,  # an action outside [-1, 1]
    "mountaincar_speed_clip": False,  # |velocity| reaches max_speed = 0.07
}


def f32(x):
    """The exact double of a float32 value."""
    return float(np.float32(x))


def f32_list(a):
    return [f32(v) for v in np.asarray(a, dtype=np.float32).reshape(-1)]


def f64_list(a):
    return [float(v) for v in np.asarray(a, dtype=np.float64).reshape(-1)]


def initial_obs(env_id, state):
    s = np.asarray(state, dtype=np.float64)
    if env_id == "Pendulum-v1":
        return np.array([np.cos(s[0]), np.sin(s[0]), s[1]], dtype=np.float32)
    return np.array(s, dtype=np.float32)


def record(name, env_id, seed, policy, start_state=None, max_steps=N_STEPS, note=""):
    """Runs one case. ``policy(t, state, rng)`` returns the action for step ``t``."""
    env = gym.make(env_id)
    obs0, _ = env.reset(seed=seed)
    if start_state is not None:
        env.unwrapped.state = np.array(start_state, dtype=np.float64)
    state0 = np.array(env.unwrapped.state, dtype=np.float64)
    init_obs = initial_obs(env_id, state0)
    if start_state is None:
        assert np.array_equal(init_obs, obs0), (name, init_obs, obs0)
    rng = np.random.default_rng(seed)
    actions, observations, rewards, terminated = [], [], [], []
    for t in range(max_steps):
        a = policy(t, np.array(env.unwrapped.state, dtype=np.float64), rng)
        obs, rew, term, trunc, _ = env.step(a)
        assert not trunc, f"{name}: unexpected truncation at step {t}"
        if env_id == "CartPole-v1":
            actions.append(int(a))
        else:
            actions.append(f32_list(a))
        observations.append(f32_list(obs))
        rewards.append(float(rew))
        terminated.append(bool(term))
        cover(env_id, a, obs, rew, term, np.array(env.unwrapped.state, dtype=np.float64))
        if term:
            break
    if env_id == "CartPole-v1" and not terminated[-1] and len(terminated) == N_STEPS:
        COVERAGE["cartpole_full_length"] = True
    env.close()
    return {
        "name": name,
        "env": env_id,
        "seed": seed,
        "note": note,
        "initial_state": f64_list(state0),
        "initial_observation": f32_list(init_obs),
        "actions": actions,
        "observations": observations,
        "rewards": rewards,
        "terminated": terminated,
    }


def cover(env_id, a, obs, rew, term, state):
    if env_id == "Pendulum-v1":
        if abs(state[1]) >= 8.0:
            COVERAGE["pendulum_speed_clip"] = True
        if abs(state[0]) > math.pi:
            COVERAGE["pendulum_angle_wrap"] = True
        if abs(float(np.asarray(a).reshape(-1)[0])) > 2.0:
            COVERAGE["pendulum_action_clip"] = True
    elif env_id == "CartPole-v1":
        if term and abs(state[2]) > 12 * 2 * math.pi / 360:
            COVERAGE["cartpole_theta_terminated"] = True
        if term and abs(state[0]) > 2.4:
            COVERAGE["cartpole_x_terminated"] = True
    else:
        if term and rew > 90:
            COVERAGE["mountaincar_goal"] = True
        if state[0] <= -1.2 and state[1] == 0.0:
            COVERAGE["mountaincar_left_wall"] = True
        if abs(float(np.asarray(a).reshape(-1)[0])) > 1.0:
            COVERAGE["mountaincar_action_clip"] = True
        if abs(state[1]) >= np.float32(0.07):
            COVERAGE["mountaincar_speed_clip"] = True


# ---------------------------------------------------------------- policies


def uniform_box(low, high):
    def policy(t, state, rng):
        return rng.uniform(low, high, size=(1,)).astype(np.float32)

    return policy


def pendulum_pump(t, state, rng):
    # Energy pumping: torque along the angular velocity, full strength (and beyond, to hit
    # the action clip), which spins the pendulum up to the speed limit.
    direction = 1.0 if state[1] >= 0 else -1.0
    return np.array([direction * (2.0 if t % 3 else 2.5)], dtype=np.float32)


def cartpole_random(t, state, rng):
    return int(rng.integers(0, 2))


def cartpole_balance(t, state, rng):
    # A PD controller on the pole angle: keeps the pole up for the whole sequence.
    x, x_dot, theta, theta_dot = state
    return int(theta + 0.5 * theta_dot + 0.01 * x + 0.05 * x_dot > 0)


def cartpole_right(t, state, rng):
    return 1


def mountaincar_pump(t, state, rng):
    # Push along the velocity (energy pumping) with random strength in [0.8, 1.5]: reaches
    # the goal; strengths above 1 exercise the force clip (the reward penalty is unclipped).
    direction = 1.0 if state[1] >= 0 else -1.0
    return np.array([direction * rng.uniform(0.8, 1.5)], dtype=np.float32)


def mountaincar_wall_then_right(t, state, rng):
    # Push left into the wall, then full right (towards the goal).
    return np.array([-1.0 if t < 6 else 1.0], dtype=np.float32)


def mountaincar_right(t, state, rng):
    return np.array([1.0], dtype=np.float32)


def main():
    cases = []
    # Pendulum-v1: random torques in the action space, from gymnasium's own reset.
    for seed in (0, 1, 7, 123):
        cases.append(
            record(f"pendulum_random_seed{seed}", "Pendulum-v1", seed, uniform_box(-2.0, 2.0),
                   note="uniform actions in [-2, 2]")
        )
    cases.append(
        record("pendulum_out_of_range_actions", "Pendulum-v1", 5, uniform_box(-3.0, 3.0),
               note="uniform actions in [-3, 3]: torques are clipped to [-2, 2]")
    )
    cases.append(
        record("pendulum_pump", "Pendulum-v1", 11, pendulum_pump,
               note="energy pumping: speed clip at 8 and angle wrap-around")
    )
    # CartPole-v1: random pushes terminate by the pole angle within the sequence.
    for seed in (0, 1, 2, 3):
        cases.append(
            record(f"cartpole_random_seed{seed}", "CartPole-v1", seed, cartpole_random,
                   note="uniform random pushes until terminated")
        )
    cases.append(
        record("cartpole_balance", "CartPole-v1", 4, cartpole_balance,
               note="PD controller: 50 steps without termination")
    )
    cases.append(
        record("cartpole_always_right", "CartPole-v1", 5, cartpole_right,
               note="always push right: the pole falls (theta threshold)")
    )
    cases.append(
        record("cartpole_off_track", "CartPole-v1", 6, cartpole_balance,
               start_state=[2.3, 1.5, 0.0, 0.0],
               note="starts near the right end of the track moving right: x threshold")
    )
    # MountainCarContinuous-v0.
    for seed in (0, 1, 2):
        cases.append(
            record(f"mountaincar_random_seed{seed}", "MountainCarContinuous-v0", seed,
                   uniform_box(-1.0, 1.0), note="uniform actions in [-1, 1]")
        )
    cases.append(
        record("mountaincar_pump_to_goal", "MountainCarContinuous-v0", 3, mountaincar_pump,
               max_steps=200,
               note="energy pumping with strengths in [0.8, 1.5] until the goal (+100)")
    )
    cases.append(
        record("mountaincar_left_wall", "MountainCarContinuous-v0", 4, mountaincar_wall_then_right,
               start_state=[-1.1, -0.06],
               note="starts near the left wall moving left: position clip, velocity zeroed; "
                    "then full right")
    )
    cases.append(
        record("mountaincar_speed_limit", "MountainCarContinuous-v0", 5, mountaincar_right,
               start_state=[-0.6, 0.0695],
               note="starts fast in the valley, full right: speed clip at 0.07, then the goal")
    )
    missing = [k for k, v in COVERAGE.items() if not v]
    if missing:
        sys.exit(f"record_gym.py: branches not covered: {missing}")
    header = {
        "generator": "specs/record_gym.py",
        "versions": {
            "gymnasium": gym.__version__,
            "numpy": np.__version__,
            "python": platform.python_version(),
        },
    }
    lines = ['{"generator": ' + json.dumps(header["generator"]) + ",",
             ' "versions": ' + json.dumps(header["versions"]) + ",",
             ' "cases": [']
    for i, c in enumerate(cases):
        lines.append("  " + json.dumps(c) + ("," if i + 1 < len(cases) else ""))
    lines.append(" ]}")
    with open(OUT, "w") as f:
        f.write("\n".join(lines) + "\n")
    size = os.path.getsize(OUT)
    print(f"wrote {len(cases)} cases to {OUT} ({size} bytes)")
    for c in cases:
        print(f"  {c['name']}: {len(c['actions'])} steps, terminated={c['terminated'][-1]}")


if __name__ == "__main__":
    main()
