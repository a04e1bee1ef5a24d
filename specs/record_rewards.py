#!/usr/bin/env python
"""Record fidelity cases for ``torchrl::envs::llm::rewards`` from TRL's own reward functions.

Run from the repository root:

    /root/.cache/torchrl-rs/venv/bin/python specs/record_rewards.py

It writes ``specs/rewards_cases.json``, which ``tests/rewards.rs`` replays (Rust never runs
Python). Only TRL's pure-Python rewards are recorded (``accuracy_reward`` needs
``math_verify`` and is not what ``AnswerMatch`` does):

* ``think_format``: ``trl.rewards.think_format_reward`` on fixed completions (conversational
  form, ``[{"content": text}]``), one score each.
* ``soft_overlong``: ``trl.rewards.get_soft_overlong_punishment(max_completion_len,
  soft_punish_cache)`` on completions of every length from 0 to ``max + 2`` tokens.
* ``repetition_penalty``: ``trl.rewards.get_repetition_penalty_reward(ngram_size,
  max_penalty)`` on fixed token-id lists.

Inputs are fixed; running the script twice gives the same file.
"""

import json
import platform
import sys

import trl
from trl.rewards import get_repetition_penalty_reward, get_soft_overlong_punishment, think_format_reward

THINK_COMPLETIONS = [
    "<think>\nThis is my reasoning.\n</think>\nThis is my answer.",
    "<think>\nThis is my reasoning.\nThis is my answer.",
    "<think></think>",
    "<think>a</think>b</think>c",
    "<think>a<think>b</think>c",
    "<think>a</think>b<think>c",
    " <think>a</think>b",
    "\n<think>a</think>b",
    "answer first <think>a</think>",
    "<THINK>a</THINK>",
    "<think>a\n\n</think>\n\n",
    "<think>multi\nline\nreasoning</think>final\nanswer\n",
    "<think>unicode é 漢字 🙂</think>ok",
    "",
    "</think><think>",
    "<think>x</think",
    "<think>a</think>\n<think>",
]

SOFT_OVERLONG = [(100, 20), (10, 3), (8, 0), (5, 5), (1, 1), (0, 0), (7, 6)]

REPETITION = [
    (3, -1.0, [[], [1], [1, 2], [1, 2, 3], [1, 1, 1, 1], [1, 2, 1, 2, 1, 2], [1, 2, 3, 4, 5, 6, 7]]),
    (2, -1.0, [[1, 2, 3, 4], [5, 5, 5, 5, 5], [1, 2, 1, 3, 1, 2], [9, 9]]),
    (1, -0.5, [[4, 4, 4], [1, 2, 3], [1, 2, 2, 3, 3, 3], [7]]),
    (4, -2.0, [[1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4], [1, 2, 3], [0, 0, 0, 0, 0, 0, 0, 1]]),
    (2, 0.0, [[1, 1, 1], [1, 2]]),
]


def main():
    cases = []
    for text in THINK_COMPLETIONS:
        [score] = think_format_reward([[{"role": "assistant", "content": text}]])
        cases.append({"kind": "think_format", "completion": text, "score": score})
    for max_len, cache in SOFT_OVERLONG:
        f = get_soft_overlong_punishment(max_completion_len=max_len, soft_punish_cache=cache)
        lengths = list(range(0, max_len + 3))
        scores = f([[1] * n for n in lengths])
        cases.append(
            {
                "kind": "soft_overlong",
                "max_completion_len": max_len,
                "soft_punish_cache": cache,
                "lengths": lengths,
                "scores": [float(s) for s in scores],
            }
        )
    for n, penalty, ids in REPETITION:
        f = get_repetition_penalty_reward(ngram_size=n, max_penalty=penalty)
        cases.append(
            {
                "kind": "repetition_penalty",
                "ngram_size": n,
                "max_penalty": penalty,
                "completion_ids": ids,
                "scores": [float(s) for s in f(ids)],
            }
        )
    out = {
        "generator": "specs/record_rewards.py",
        "versions": {"trl": trl.__version__, "python": platform.python_version()},
        "cases": cases,
    }
    with open("specs/rewards_cases.json", "w") as fh:
        json.dump(out, fh, indent=1, ensure_ascii=False)
        fh.write("\n")
    print(f"wrote {len(cases)} cases to specs/rewards_cases.json", file=sys.stderr)


if __name__ == "__main__":
    main()
