#!/usr/bin/env python
"""Record reference cases for ILQL: the offline data of ``torchrl::trainers::ilql::data`` and
the loss of ``torchrl::objectives::llm::ilql``.

Run from the repository root:

    /root/.cache/torchrl-rs/venv/bin/python specs/record_ilql.py

It writes ``specs/ilql_cases.json``, which ``tests/ilql_math.rs`` replays (Rust never runs
Python). Inputs are random but seeded (``torch.Generator().manual_seed``), float64 for the
loss, and written out in full; running the script twice gives the same file.

Where each expected value comes from (the ``source`` field of every case says it again):

* **Loss** (``kind: "loss"``): trlX is not pip-installable here, so the expected values are
  hand-derived from trlX's ILQLConfig.loss formula (rlhf.md §2.3), written below in trlX's
  own collated layout (``dones`` = the continuation mask, ``terminal_mask = dones[:, :-1]``,
  ``n = max(1, sum)``).
* **Data** (``kind: "data"``): hand-derived from trlX HEAD's ``tokenize_dialogue`` and
  ``make_experience`` (rlhf.md §2.2): per-segment encoding, EOS appended to the last
  segment, right truncation segment by segment to ``seq_length``, ``actions_ixs`` /
  ``states_ixs`` / ``dones``, rewards 0 but the last = the return normalised with the
  unbiased std and ``eps = finfo(float64).eps``. The tokenizer is a Python copy of
  ``ByteTokenizer`` (a byte per token, ``<|endoftext|>`` 256, ``<|pad|>`` 257, ``<|bos|>`` 258).
* **Cross-check** (optional): when a git snapshot of trlX is available (``TRLX_GIT``, default
  ``/work/.mirror/CarperAI+trlx/repo``), the script also executes trlX's own
  ``ILQLConfig.loss`` (``trlx/models/modeling_ilql.py``), ``tokenize_dialogue``
  (``trlx/pipeline/offline_pipeline.py``) and ``make_experience``
  (``trlx/trainer/accelerate_ilql_trainer.py``) from that snapshot on the same inputs and
  aborts if they differ from the hand derivations (1e-12 for numbers, exactly for ids). The
  file records which cross-checks ran. trlX's expectile weights ``(targetQ >= V).int() * tau``
  come out in torch's *default* dtype (float32) even on float64 inputs, so its loss is run
  with float64 as the default dtype; on float32 inputs nothing changes.

File: ``{"generator", "versions", "cross_checks", "cases": [{"name", "kind", "source", ...}]}``;
tensors are ``{"shape", "data"}`` (row-major, float64; integer tensors hold whole numbers).
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import types
import typing
import warnings
from dataclasses import dataclass
from functools import reduce

warnings.filterwarnings("ignore")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "ilql_cases.json")
TOL = 1e-12
LOSS_SOURCE = "hand-derived from trlX's ILQLConfig.loss formula (rlhf.md §2.3)"
DATA_SOURCE = "hand-derived from trlX HEAD's tokenize_dialogue + make_experience (rlhf.md §2.2)"


def t2j(t):
    t = torch.as_tensor(t).detach().to(torch.float64)
    return {"shape": list(t.shape), "data": [float(x) for x in t.reshape(-1).tolist()]}


def gen(seed):
    return torch.Generator().manual_seed(seed)


# ------------------------------------------------------------------ a Python ByteTokenizer

EOS, PAD, BOS = 256, 257, 258
SPECIALS = [("<|endoftext|>", EOS), ("<|pad|>", PAD), ("<|bos|>", BOS)]


def byte_encode(text):
    out, rest = [], text
    while rest:
        for s, i in SPECIALS:
            if rest.startswith(s):
                out.append(i)
                rest = rest[len(s):]
                break
        else:
            ch = rest[0]
            out.extend(ch.encode("utf-8"))
            rest = rest[1:]
    return out


class FakeTokenizer:
    """The subset of a HF tokenizer that trlX's tokenize_dialogue uses."""

    bos_token, eos_token = "<|bos|>", "<|endoftext|>"
    bos_token_id, eos_token_id = BOS, EOS
    truncation_side = "right"

    def __call__(self, text, add_special_tokens=False):
        return types.SimpleNamespace(input_ids=byte_encode(text))


# ------------------------------------------------------------------ hand derivations

def hand_tokenize(sample, seq_length):
    """[(is_output, tokens)] as trlX HEAD's tokenize_dialogue with right truncation."""
    segs = ["<|bos|>", sample] if isinstance(sample, str) else list(sample)
    assert len(segs) % 2 == 0
    toks = [byte_encode(s) for s in segs]
    if not toks[-1] or toks[-1][-1] != EOS:
        toks[-1] = toks[-1] + [EOS]
    out, used = [], 0
    for i, t in enumerate(toks):
        keep = t[: max(seq_length - used, 0)]
        used += len(t)
        if keep:
            out.append((i % 2 == 1, keep))
    assert not out[0][0], "the first kept segment must be a prompt in these cases"
    return out


def hand_experience(segmented, returns):
    rows = []
    for segs in segmented:
        ids, actions, length = [], [], 0
        for is_out, t in segs:
            if is_out:
                actions.extend(range(length - 1, length + len(t) - 1))
            ids.extend(t)
            length += len(t)
        states = actions + [length - 1]
        dones = [1] * (len(states) - 1) + [0]
        rows.append(dict(input_ids=ids, actions_ixs=actions, states_ixs=states, dones=dones))
    r = torch.tensor(returns, dtype=torch.float64)
    r = r - r.mean()
    std = r.std()
    if not torch.isnan(std):
        r = r / (std + torch.finfo(torch.float64).eps)
    for row, ret in zip(rows, r.tolist()):
        row["rewards"] = [0.0] * (len(row["actions_ixs"]) - 1) + [ret]
        row["normalized_return"] = ret
    return rows


def pad(rows, width, value=0):
    return [list(r) + [value] * (width - len(r)) for r in rows]


def collate(rows):
    T = max(len(r["input_ids"]) for r in rows)
    A = max(len(r["actions_ixs"]) for r in rows)
    return dict(
        input_ids=torch.tensor(pad([r["input_ids"] for r in rows], T)),
        attention_mask=torch.tensor(pad([[1] * len(r["input_ids"]) for r in rows], T)),
        actions_ixs=torch.tensor(pad([r["actions_ixs"] for r in rows], A)),
        states_ixs=torch.tensor(pad([r["states_ixs"] for r in rows], A + 1)),
        dones=torch.tensor(pad([r["dones"] for r in rows], A + 1)),
        rewards=torch.tensor(pad([r["rewards"] for r in rows], A, 0.0), dtype=torch.float64),
    )


def hand_loss(logits, qs, target_qs, vs, input_ids, actions_ixs, dones, rewards, cfg):
    """ILQLConfig.loss (rlhf.md §2.3), term by term."""
    tm = dones[:, :-1].double()
    n = max(1.0, float(tm.sum()))
    a = input_ids[:, 1:].gather(1, actions_ixs)
    pick = lambda q: q.gather(-1, a[..., None])[..., 0]  # noqa: E731
    Q = [pick(q) for q in qs]
    tQ = reduce(torch.minimum, [pick(q) for q in target_qs])
    V = vs[:, :-1, 0]
    Vnext = vs[:, 1:, 0] * dones[:, 1:].double()
    Qhat = rewards + cfg["gamma"] * Vnext
    loss_q = sum((((Qi - Qhat) * tm) ** 2).sum() / n for Qi in Q)
    d = tQ - V
    w = torch.where(d >= 0, torch.tensor(cfg["tau"], dtype=torch.float64),
                    torch.tensor(1 - cfg["tau"], dtype=torch.float64))
    loss_v = (w * d ** 2 * tm).sum() / n

    def ce(lg):  # [B, A, V] → [B, A]
        return -torch.log_softmax(lg, -1).gather(-1, a[..., None])[..., 0]

    cql = sum((ce(q) * tm).sum() / n for q in qs)
    idx = actions_ixs[..., None].expand(-1, -1, logits.shape[-1])
    awac_w = torch.exp(cfg["beta"] * (tQ - V))
    awac = (ce(logits.gather(1, idx)) * awac_w * tm).sum() / n
    loss = loss_q + loss_v + cfg["cql_scale"] * cql + cfg["awac_scale"] * awac
    mean = lambda x: (x * tm).sum() / n  # noqa: E731
    return dict(
        loss=float(loss), loss_q=float(loss_q), loss_v=float(loss_v), cql_loss=float(cql),
        awac_loss=float(awac), loss_cql=float(cfg["cql_scale"] * cql), loss_awac=float(cfg["awac_scale"] * awac),
        q_mean=[float(mean(q)) for q in Q], target_q_mean=float(mean(tQ)), v_mean=float(mean(V)),
        advantage_mean=float(mean(tQ - V)), awac_weight_mean=float(mean(awac_w)),
        awac_weight_max=float(torch.where(tm > 0, awac_w, 0.0).max()), n_actions=n,
    )


# ------------------------------------------------------------------ optional upstream code

REPO = os.environ.get("TRLX_GIT", "/work/.mirror/CarperAI+trlx/repo")


def git_show(path):
    try:
        src = subprocess.run(["git", "--git-dir", REPO, "show", f"HEAD:{path}"], capture_output=True, check=True,
                             text=True).stdout
        rev = subprocess.run(["git", "--git-dir", REPO, "rev-parse", "--short", "HEAD"], capture_output=True,
                             check=True, text=True).stdout.strip()
    except (subprocess.CalledProcessError, FileNotFoundError):
        return None, None
    return src, f"CarperAI+trlx@{rev}:{path}"


def pick_defs(src, names, cls=None):
    body = ast.parse(src).body
    if cls is not None:
        body = next(n for n in body if isinstance(n, ast.ClassDef) and n.name == cls).body
    picked = [n for n in body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name in names]
    for n in picked:
        n.decorator_list = []
    return ast.Module(body=picked, type_ignores=[])


@dataclass
class ILQLBatch:  # trlx/data/ilql_types.py's fields
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    rewards: torch.Tensor
    states_ixs: torch.Tensor
    actions_ixs: torch.Tensor
    dones: torch.Tensor


@dataclass
class DialogMessage:
    is_output: bool
    tokens: tuple


class _TT:
    def __class_getitem__(cls, _):
        return torch.Tensor


UP_LOSS = UP_TOK = UP_EXP = None
CROSS = {"trlx_loss": None, "trlx_tokenize_dialogue": None, "trlx_make_experience": None}
if os.path.isdir(REPO):
    src, where = git_show("trlx/models/modeling_ilql.py")
    if src is not None:
        ns = {"torch": torch, "F": F, "reduce": reduce, "np": np, "ILQLBatch": ILQLBatch,
              "get_tensor_stats": lambda xs, m, n: {}, "flatten_dict": lambda d: d, "TensorType": _TT}
        exec(compile(pick_defs(src, {"batched_index_select"}), where, "exec"), ns)  # noqa: S102
        exec(compile(pick_defs(src, {"loss"}, cls="ILQLConfig"), where, "exec"), ns)  # noqa: S102
        UP_LOSS, CROSS["trlx_loss"] = ns["loss"], where
    src, where = git_show("trlx/pipeline/offline_pipeline.py")
    if src is not None:
        ns = {"DialogMessage": DialogMessage, "Union": typing.Union, "Iterable": typing.Iterable,
              "PreTrainedTokenizer": object, "PreTrainedTokenizerFast": object, "List": typing.List}
        exec(compile(pick_defs(src, {"tokenize_dialogue"}), where, "exec"), ns)  # noqa: S102
        UP_TOK, CROSS["trlx_tokenize_dialogue"] = ns["tokenize_dialogue"], where
    src, where = git_show("trlx/trainer/accelerate_ilql_trainer.py")
    if src is not None:
        ns = {"torch": torch, "np": np, "os": os, "logger": types.SimpleNamespace(info=lambda *a: None),
              "ILQLRolloutStorage": lambda *a: a}
        exec(compile(pick_defs(src, {"make_experience"}), where, "exec"), ns)  # noqa: S102
        UP_EXP, CROSS["trlx_make_experience"] = ns["make_experience"], where
print("cross-checks:", CROSS, file=sys.stderr)


def close(a, b, what):
    if abs(a - b) > TOL * max(1.0, abs(b)):
        sys.exit(f"cross-check failed for {what}: hand {a} vs trlX {b}")


# ------------------------------------------------------------------ cases

cases = []


def add(name, kind, source, **kw):
    cases.append({"name": name, "kind": kind, "source": source, **kw})


# --- data: text samples through trlX's tokenize_dialogue + make_experience

DATA = [
    ("mixed", [("ab", 1.0), (["Q:", "x", " R:", "yz"], 0.0), ("hello", 3.5)], 64),
    ("truncated", [("abcdef", -1.0), (["pq", "rs", "tu", "vw"], 2.0), (["lp", "o"], 0.5), (["abcd", "efg"], 1.5)], 6),
    ("single", [(["hi", "there<|endoftext|>"], 7.0)], 64),
]
for name, samples, seq_length in DATA:
    texts = [s for s, _ in samples]
    returns = [r for _, r in samples]
    segmented = [hand_tokenize(s, seq_length) for s in texts]
    rows = hand_experience(segmented, returns)
    if UP_TOK is not None:
        tok = FakeTokenizer()
        up_segs = [UP_TOK(s, tok, seq_length) for s in texts]
        for mine, theirs in zip(segmented, up_segs):
            if [(o, list(t)) for o, t in mine] != [(m.is_output, list(m.tokens)) for m in theirs]:
                sys.exit(f"cross-check failed for tokenize_dialogue on {name}")
        ids, mask, rewards, states, actions, dones = UP_EXP(up_segs, returns, None, verbose=False)
        for i, r in enumerate(rows):
            for key, up in [("input_ids", ids), ("states_ixs", states), ("actions_ixs", actions), ("dones", dones)]:
                if r[key] != up[i].tolist():
                    sys.exit(f"cross-check failed for make_experience {key} on {name}")
            for a, b in zip(r["rewards"], rewards[i].tolist()):
                if abs(a - b) > 1e-6:  # trlX's rewards are float32
                    sys.exit(f"cross-check failed for make_experience rewards on {name}")
    add(f"data_{name}", "data", DATA_SOURCE,
        samples=[{"text": s} if isinstance(s, str) else {"dialogue": s} for s in texts],
        returns=returns, seq_length=seq_length, expect=rows)

# --- loss: seeded random heads on a collated batch


def random_batch(g, vocab, prompts, outputs):
    """Token dialogues of random ids with the given segment lengths, collated as trlX."""
    segmented = []
    for p_lens, o_lens in zip(prompts, outputs):
        segs = []
        for p, o in zip(p_lens, o_lens):
            segs.append((False, torch.randint(0, vocab, (p,), generator=g).tolist()))
            segs.append((True, torch.randint(0, vocab, (o,), generator=g).tolist()))
        segmented.append(segs)
    returns = (torch.randn(len(prompts), generator=g, dtype=torch.float64) * 2).tolist()
    return collate(hand_experience(segmented, returns))


CONFIGS = {
    "default": dict(tau=0.7, gamma=0.99, cql_scale=0.1, awac_scale=1.0, beta=0.0, two_qs=True),
    "one_q": dict(tau=0.7, gamma=0.99, cql_scale=0.1, awac_scale=1.0, beta=0.0, two_qs=False),
    "beta": dict(tau=0.6, gamma=0.9, cql_scale=0.3, awac_scale=0.7, beta=0.5, two_qs=True),
    "beta_one_q": dict(tau=0.85, gamma=1.0, cql_scale=0.0, awac_scale=2.0, beta=1.5, two_qs=False),
}
LAYOUTS = [
    # (vocab, per-row prompt lengths, per-row output lengths)
    (7, [[2], [1], [3]], [[3], [1], [2]]),
    (5, [[1, 2], [2]], [[2, 1], [4]]),
    (11, [[4]], [[5]]),
]
seed = 100
for cfg_name, cfg in CONFIGS.items():
    for li, (vocab, prompts, outputs) in enumerate(LAYOUTS):
        seed += 1
        g = gen(seed)
        b = random_batch(g, vocab, prompts, outputs)
        B, T = b["input_ids"].shape
        A = b["actions_ixs"].shape[1]
        n_qs = 2 if cfg["two_qs"] else 1
        r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
        logits = r(B, T, vocab) * 1.5
        qs = [r(B, A, vocab) for _ in range(n_qs)]
        target_qs = [q + 0.3 * r(B, A, vocab) for q in qs]
        vs = r(B, A + 1, 1)
        expect = hand_loss(logits, qs, target_qs, vs, b["input_ids"], b["actions_ixs"], b["dones"], b["rewards"], cfg)
        if UP_LOSS is not None:
            this = types.SimpleNamespace(**cfg)
            labels = ILQLBatch(b["input_ids"], b["attention_mask"], b["rewards"], b["states_ixs"],
                               b["actions_ixs"], b["dones"])
            # trlX's `(targetQ >= V).int() * tau` promotes to the *default* dtype: run it with
            # float64 as the default so that its expectile weights are those of float64 inputs
            torch.set_default_dtype(torch.float64)
            loss, stats = UP_LOSS(this, (logits, (qs, target_qs, vs)), labels)
            torch.set_default_dtype(torch.float32)
            close(expect["loss"], float(loss), f"loss ({cfg_name}, layout {li})")
            for k in ["loss_q", "loss_v"]:
                close(expect[k], stats["losses"][k], f"{k} ({cfg_name}, layout {li})")
            close(expect["cql_loss"], stats["losses"]["loss_cql"], f"loss_cql ({cfg_name}, layout {li})")
            close(expect["awac_loss"], stats["losses"]["loss_awac"], f"loss_awac ({cfg_name}, layout {li})")
        add(f"loss_{cfg_name}_{li}", "loss", LOSS_SOURCE, config=cfg,
            logits=t2j(logits), qs=[t2j(q) for q in qs], target_qs=[t2j(q) for q in target_qs], vs=t2j(vs),
            input_ids=t2j(b["input_ids"]), actions_ixs=t2j(b["actions_ixs"]), states_ixs=t2j(b["states_ixs"]),
            dones=t2j(b["dones"]), rewards=t2j(b["rewards"]), expect=expect)

# ------------------------------------------------------------------ write

versions = {"torch": torch.__version__, "numpy": np.__version__, "python": sys.version.split()[0]}
with open(OUT, "w") as f:
    f.write("{\n")
    f.write(f' "generator": "specs/record_ilql.py",\n "versions": {json.dumps(versions)},\n')
    f.write(f' "cross_checks": {json.dumps(CROSS)},\n "cases": [\n')
    f.write(",\n".join("  " + json.dumps(c) for c in cases))
    f.write("\n ]\n}\n")
print(f"wrote {len(cases)} cases to {OUT}", file=sys.stderr)
