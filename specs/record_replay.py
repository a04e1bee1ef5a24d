#!/usr/bin/env python
"""Record prioritized-replay importance weights from TorchRL 0.14.1.

Run from the repository root:

    /root/.cache/torchrl-rs/venv/bin/python specs/record_replay.py

It writes ``specs/replay_cases.json``, replayed by ``tests/replay.rs``.

TorchRL's segment trees are C++ (``torchrl._torchrl``), and the 0.14.1 wheel's extension does
not load against torch 2.13 (``undefined symbol: torch::autograd::_wrap_outputs``), so
``PrioritizedSampler`` refuses to start ("SumSegmentTreeFp32 is not available"). This script
therefore installs ``PySegmentTree``, a line-by-line Python port of ``torchrl/csrc/segment_tree.h``
(float32 values, the same ``capacity``, ``Update``, ``Query`` and ``ScanLowerBound``), in place of
the four tree classes, and then runs TorchRL's own ``TensorDictPrioritizedReplayBuffer`` /
``PrioritizedSampler`` Python code unchanged: default priorities (``mark_update``), the
``(p + eps) ** alpha`` transform, ``_max_priority`` tracking, and the weights
``(tree[i] / p_min) ** -beta``.

Each case: a buffer of ``capacity``, ``alpha``, ``beta``, ``eps``; a list of operations
(``extend`` with ``n`` items, ``update_priority`` with indices and priorities); then a sample
of 512 items. Sampling draws from numpy's global generator, which the Rust side does not
share, so what is recorded is, for every storage index: the importance weight TorchRL gives it
(``weights``, ``None`` for an index never drawn), and its sampling probability
``tree[i] / p_sum`` (``probs``), plus the default priority after the operations.
"""

import json
import os
import platform
import warnings

warnings.filterwarnings("ignore")
os.environ.setdefault("RL_WARNINGS", "0")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import tensordict  # noqa: E402
import torchrl  # noqa: E402
from tensordict import TensorDict  # noqa: E402
import torchrl.data.replay_buffers.samplers.prioritized as prio  # noqa: E402
from torchrl.data import LazyTensorStorage, TensorDictPrioritizedReplayBuffer  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "replay_cases.json")
GENERATOR = "specs/record_replay.py"


class PySegmentTree:
    """torchrl/csrc/segment_tree.h in Python, float32."""

    def __init__(self, size, identity, op):
        self.size = size
        self.capacity = 1
        while self.capacity <= size:
            self.capacity <<= 1
        self.identity = np.float32(identity)
        self.op = op
        self.values = [self.identity] * (2 * self.capacity)

    def _update(self, index, value):
        index |= self.capacity
        self.values[index] = np.float32(value)
        while index > 1:
            self.values[index >> 1] = self.op(self.values[index], self.values[index ^ 1])
            index >>= 1

    def __setitem__(self, index, value):
        index = torch.as_tensor(index).reshape(-1).tolist()
        value = torch.as_tensor(value, dtype=torch.float32).reshape(-1).tolist()
        if len(value) == 1:
            value = value * len(index)
        for i, v in zip(index, value):
            self._update(int(i), np.float32(v))

    def __getitem__(self, index):
        if isinstance(index, int):
            return self.values[index | self.capacity]
        index = torch.as_tensor(index).reshape(-1).tolist()
        return np.array([self.values[int(i) | self.capacity] for i in index], dtype=np.float32)

    def query(self, l, r):
        if l <= 0 and r >= self.size:
            return self.values[1]
        ret = self.identity
        l |= self.capacity
        r |= self.capacity
        while l < r:
            if l & 1:
                ret = self.op(ret, self.values[l])
                l += 1
            if r & 1:
                r -= 1
                ret = self.op(ret, self.values[r])
            l >>= 1
            r >>= 1
        return ret

    def _scan(self, value):
        value = np.float32(value)
        if value > self.values[1]:
            return self.size
        index = 1
        current = value
        while index < self.capacity:
            index <<= 1
            left = self.values[index]
            if current > left:
                current = np.float32(current - left)
                index |= 1
        return index ^ self.capacity

    def scan_lower_bound(self, values):
        values = np.asarray(values, dtype=np.float32).reshape(-1)
        return np.array([self._scan(v) for v in values], dtype=np.int64)


def sum_tree(size):
    return PySegmentTree(size, 0.0, lambda a, b: np.float32(a + b))


def min_tree(size):
    return PySegmentTree(size, np.finfo(np.float32).max, lambda a, b: np.float32(min(a, b)))


prio.SumSegmentTreeFp32 = sum_tree
prio.MinSegmentTreeFp32 = min_tree
prio.SumSegmentTreeFp64 = sum_tree
prio.MinSegmentTreeFp64 = min_tree

SAMPLES = 512


def case(name, capacity, alpha, beta, ops, eps=1e-8):
    return {"name": name, "capacity": capacity, "alpha": alpha, "beta": beta, "eps": eps, "ops": ops}


CASES = [
    case("uniform_default_priority", 8, 0.7, 0.5, [{"extend": 5}]),
    case("alpha1_beta1", 8, 1.0, 1.0,
         [{"extend": 4}, {"update_priority": [[0, 1, 2, 3], [1.0, 1.0, 1.0, 4.0]]}]),
    case("alpha07_beta05_then_default", 10, 0.7, 0.5,
         [{"extend": 4}, {"update_priority": [[0, 1, 2, 3], [0.5, 2.0, 0.1, 1.0]]}, {"extend": 2}]),
    case("alpha06_beta04_wrap", 6, 0.6, 0.4,
         [{"extend": 6}, {"update_priority": [[0, 1, 2, 3, 4, 5], [3.0, 0.2, 0.7, 1.5, 0.05, 9.0]]},
          {"extend": 2}, {"update_priority": [[2], [0.3]]}]),
    case("zero_priority_eps", 5, 0.5, 0.8,
         [{"extend": 5}, {"update_priority": [[0, 1, 2, 3, 4], [0.0, 1.0, 2.0, 0.5, 0.25]]}], eps=1e-2),
    case("alpha0_uniform", 6, 0.0, 0.9,
         [{"extend": 6}, {"update_priority": [[0, 1, 2, 3, 4, 5], [5.0, 1.0, 2.0, 3.0, 4.0, 0.5]]}]),
]


def run(c):
    np.random.seed(0)
    torch.manual_seed(0)
    rb = TensorDictPrioritizedReplayBuffer(
        alpha=c["alpha"], beta=c["beta"], eps=c["eps"], storage=LazyTensorStorage(c["capacity"]),
        batch_size=SAMPLES,
    )
    counter = 0
    for op in c["ops"]:
        if "extend" in op:
            n = op["extend"]
            rb.extend(TensorDict({"x": torch.arange(counter, counter + n, dtype=torch.float32)}, [n]))
            counter += n
        else:
            idx, pr = op["update_priority"]
            rb.update_priority(torch.tensor(idx), torch.tensor(pr))
    s = rb.sample()
    sampler = rb._sampler
    n = len(rb)
    weights = [None] * n
    for i, w in zip(s["index"].tolist(), s["priority_weight"].tolist()):
        weights[i] = w
    p_sum = float(sampler._sum_tree.query(0, n))
    probs = [float(sampler._sum_tree[i]) / p_sum for i in range(n)]
    stored = rb[:n]["x"].tolist()
    mp = sampler.default_priority
    return {
        "len": n,
        "weights": weights,
        "probs": probs,
        "stored_x": stored,
        "default_priority": float(mp),
        "weight_dtype": str(s["priority_weight"].dtype).replace("torch.", ""),
        "index_dtype": str(s["index"].dtype).replace("torch.", ""),
    }


def main():
    out = []
    for c in CASES:
        c = dict(c)
        c["expect"] = run(c)
        out.append(c)
    versions = {
        "torch": torch.__version__,
        "torchrl": torchrl.__version__,
        "tensordict": tensordict.__version__,
        "python": platform.python_version(),
    }
    lines = ['{"generator": ' + json.dumps(GENERATOR) + ",", ' "versions": ' + json.dumps(versions) + ",",
             ' "cases": [']
    for i, c in enumerate(out):
        lines.append("  " + json.dumps(c) + ("," if i + 1 < len(out) else ""))
    lines.append(" ]}")
    with open(OUT, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {len(out)} cases to {os.path.relpath(OUT)}")


if __name__ == "__main__":
    main()
