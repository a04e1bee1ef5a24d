#!/usr/bin/env python
"""Record reference cases for the RLHF maths of ``torchrl::objectives::llm`` and the TRL
options of ``RewardModelLoss``.

Run from the repository root:

    /root/.cache/torchrl-rs/venv/bin/python specs/record_rlhf.py

It writes ``specs/rlhf_cases.json``, which ``tests/rlhf_math.rs`` replays (Rust never runs
Python). Inputs are random but seeded (``torch.Generator().manual_seed``), float64, and
written out in full; running the script twice gives the same file.

Where each expected value comes from (the ``source`` field of every case says it again):

* **TRL RewardTrainer**: the real ``trl.RewardTrainer.compute_loss`` of the installed trl
  (1.16), called unbound on a stand-in ``self`` (args, accelerator, metric buffers) and a
  fake model whose ``logits`` are the recorded scores laid out ``[chosen; rejected]``. Loss,
  accuracy and margin are TRL's own.
* **TRL masked statistics** (``masked_mean`` / ``masked_var`` / ``masked_whiten``): trl 1.16
  no longer ships them (they moved to ``trl/experimental/ppo`` on TRL's main branch, which
  is not in the wheel). They are hand-derived from TRL's formulas (rlhf.md §3.1:
  ``masked_var`` unbiased with Bessel ``n/(n-1)``, ``rsqrt(var + 1e-8)``); the padding
  positions are then set to 0, as TRL's trainer does with ``masked_fill``.
* **trlX** (``AdaptiveKLController``, ``get_advantages_and_returns``, ``whiten``,
  ``PPOConfig.loss``): trlX is not pip-installable here, so each is hand-derived from trlX's
  formula (rlhf.md §1.5, §1.7, §1.8) below, written in trlX's own response-sliced ``[B, R]``
  index convention and embedded into the full-length layout only at the end.
* **Cross-check** (optional): when a git snapshot of TRL or trlX is available (``TRL_GIT`` /
  ``TRLX_GIT``, default ``/work/.mirror/huggingface+trl/repo`` and
  ``/work/.mirror/CarperAI+trlx/repo``), the script also executes the upstream functions
  from those snapshots (TRL's ``masked_*``; trlX's ``whiten``, ``AdaptiveKLController``,
  ``get_advantages_and_returns`` and ``loss``) on the same inputs and aborts if they differ
  from the hand derivations by more than 1e-12. The file records which cross-checks ran.

Layout (rlhf.md §7.1, the module docs of ``src/objectives/llm/ppo.rs``): full-length
``[B, T]``, ``T = P + R``; the prompt is left-padded, the response right-padded; trlX's
response tensor ``x[:, i]`` is our ``x[:, P + i]``; ``values[t]`` is the value head's output
at ``t - 1``.

File: ``{"generator", "versions", "cross_checks", "cases": [{"name", "kind", "source", ...}]}``;
tensors are ``{"shape", "data"}`` (row-major, float64).
"""

from __future__ import annotations

import ast
import json
import math
import os
import subprocess
import sys
import types
import warnings

warnings.filterwarnings("ignore")

import numpy as np  # noqa: E402
import torch  # noqa: E402

torch.set_default_dtype(torch.float64)
HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "rlhf_cases.json")
TOL = 1e-12


def t2j(t):
    t = torch.as_tensor(t, dtype=torch.float64).detach()
    return {"shape": list(t.shape), "data": [float(x) for x in t.reshape(-1).tolist()]}


def gen(seed):
    return torch.Generator().manual_seed(seed)


def randn(g, *shape):
    return torch.randn(*shape, generator=g)


def close(a, b, what):
    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    if a.shape != b.shape or not torch.allclose(a, b, atol=TOL, rtol=TOL):
        raise SystemExit(f"cross-check failed for {what}: {a} vs {b}")


# ------------------------------------------------------------------ optional upstream code

def upstream(repo_env, default, path, names, extra_globals):
    """Executes the named top-level functions/classes of ``path`` in a git snapshot; None when
    the snapshot is missing."""
    repo = os.environ.get(repo_env, default)
    if not os.path.isdir(repo):
        return None, None
    try:
        src = subprocess.run(
            ["git", "--git-dir", repo, "show", f"HEAD:{path}"], capture_output=True, check=True, text=True
        ).stdout
        rev = subprocess.run(
            ["git", "--git-dir", repo, "rev-parse", "--short", "HEAD"], capture_output=True, check=True, text=True
        ).stdout.strip()
    except (subprocess.CalledProcessError, FileNotFoundError):
        return None, None
    tree = ast.parse(src)
    picked = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name in names]
    ns = dict(extra_globals)
    exec(compile(ast.Module(body=picked, type_ignores=[]), path, "exec"), ns)  # noqa: S102
    return ns, f"{os.path.basename(os.path.dirname(repo.rstrip('/')))}@{rev}:{path}"


def method_of(ns, cls, name):
    return ns[cls].__dict__[name]


import typing  # noqa: E402

TRL_NS, TRL_SRC = upstream(
    "TRL_GIT", "/work/.mirror/huggingface+trl/repo", "trl/experimental/ppo/ppo_trainer.py",
    {"masked_mean", "masked_var", "masked_whiten"}, {"torch": torch},
)
TRLX_UTILS, TRLX_UTILS_SRC = upstream(
    "TRLX_GIT", "/work/.mirror/CarperAI+trlx/repo", "trlx/utils/modeling.py",
    {"whiten", "get_tensor_stats", "flatten_dict"},
    {"torch": torch, "np": np, "dist": torch.distributed, "Dict": typing.Dict, "Tuple": typing.Tuple,
     "MutableMapping": __import__("collections.abc").abc.MutableMapping, "Any": typing.Any},
)
TRLX_PPO, TRLX_PPO_SRC = None, None
if TRLX_UTILS is not None:
    class _TT:
        def __class_getitem__(cls, _):
            return torch.Tensor
    TRLX_PPO, TRLX_PPO_SRC = upstream(
        "TRLX_GIT", "/work/.mirror/CarperAI+trlx/repo", "trlx/models/modeling_ppo.py",
        {"AdaptiveKLController", "FixedKLController"},
        {"np": np, "torch": torch},
    )
    # PPOConfig is a dataclass with decorators and imports; take its two methods only
    repo = os.environ.get("TRLX_GIT", "/work/.mirror/CarperAI+trlx/repo")
    src = subprocess.run(["git", "--git-dir", repo, "show", "HEAD:trlx/models/modeling_ppo.py"],
                         capture_output=True, check=True, text=True).stdout
    cls = next(n for n in ast.parse(src).body if isinstance(n, ast.ClassDef) and n.name == "PPOConfig")
    meths = [n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name in {"get_advantages_and_returns", "loss"}]
    for m in meths:
        m.decorator_list = []
    ns = {"torch": torch, "whiten": TRLX_UTILS["whiten"], "get_tensor_stats": TRLX_UTILS["get_tensor_stats"],
          "flatten_dict": TRLX_UTILS["flatten_dict"], "TensorType": _TT, "Optional": typing.Optional,
          "Tuple": typing.Tuple}
    exec(compile(ast.Module(body=meths, type_ignores=[]), "modeling_ppo.py", "exec"), ns)  # noqa: S102
    TRLX_PPO["get_advantages_and_returns"] = ns["get_advantages_and_returns"]
    TRLX_PPO["loss"] = ns["loss"]

CROSS = {"trl_masked": TRL_SRC, "trlx_utils": TRLX_UTILS_SRC, "trlx_ppo": TRLX_PPO_SRC}
print("cross-checks:", CROSS, file=sys.stderr)


# ------------------------------------------------------------------ hand derivations

def trl_masked_mean(x, m):
    return (x * m).sum() / m.sum()


def trl_masked_var(x, m, unbiased=True):
    mean = trl_masked_mean(x, m)
    var = trl_masked_mean((x - mean) ** 2, m)
    if unbiased:
        n = m.sum()
        var = var * n / (n - 1)
    return var


def trl_masked_whiten(x, m, shift_mean=True):
    mean, var = trl_masked_mean(x, m), trl_masked_var(x, m)
    w = (x - mean) * torch.rsqrt(var + 1e-8)
    if not shift_mean:
        w = w + mean
    return w


def trlx_whiten(x, shift_mean=True):
    var, mean = torch.var_mean(x)  # unbiased, whole tensor
    w = (x - mean) * torch.rsqrt(var + 1e-8)
    if not shift_mean:
        w = w + mean
    return w


class AdaptiveKL:
    """trlX's AdaptiveKLController (rlhf.md §1.5)."""

    def __init__(self, init, target, horizon):
        self.value, self.target, self.horizon = init, target, horizon

    def update(self, current, n_steps):
        e = min(max(current / self.target - 1, -0.2), 0.2)
        self.value *= 1 + e * n_steps / self.horizon


def trlx_gae(values, rewards, gamma, lam):
    """trlX's loop on [B, R] response tensors (rlhf.md §1.7), without whitening."""
    R = values.shape[1]
    last, out = 0.0, []
    for t in reversed(range(R)):
        nxt = values[:, t + 1] if t < R - 1 else 0.0
        delta = rewards[:, t] + gamma * nxt - values[:, t]
        last = delta + gamma * lam * last
        out.append(last)
    adv = torch.stack(out[::-1], dim=1)
    return adv, adv + values


def trlx_loss(lp, v, olp, ov, adv, ret, mask, cliprange=0.2, cliprange_value=0.2, vf_coef=1.0):
    """trlX's PPOConfig.loss (rlhf.md §1.8) on [B, R] tensors; returns the loss and stats."""
    vc = torch.clamp(v, ov - cliprange_value, ov + cliprange_value)
    n = mask.sum()
    vf1, vf2 = (v - ret) ** 2, (vc - ret) ** 2
    vf_loss = 0.5 * torch.sum(torch.max(vf1, vf2) * mask) / n
    vf_clipfrac = torch.sum((vf2 > vf1).double() * mask) / n
    log_ratio = (lp - olp) * mask
    ratio = torch.exp(log_ratio)
    approx_kl_trlx = torch.mean((ratio - 1) - log_ratio)
    approx_kl_masked = torch.sum(((ratio - 1) - log_ratio) * mask) / n
    pg1 = -adv * ratio
    pg2 = -adv * torch.clamp(ratio, 1 - cliprange, 1 + cliprange)
    pg_loss = torch.sum(torch.max(pg1, pg2) * mask) / n
    pg_clipfrac = torch.sum((pg2 > pg1).double() * mask) / n
    loss = pg_loss + vf_coef * vf_loss
    return loss, {
        "pg_loss": pg_loss, "vf_loss": vf_loss, "pg_clipfrac": pg_clipfrac, "vf_clipfrac": vf_clipfrac,
        "approx_kl": approx_kl_masked, "approx_kl_trlx": approx_kl_trlx,
        "values_error": torch.sum(((v - ret) * mask) ** 2) / n,
        "ratio": (ratio * mask).sum() / n, "padding_percentage": 1 - n / mask.numel(),
    }


def layout(g, B, P, R, min_len=1):
    """Response lengths (right padding) and the full-length assistant mask [B, P + R]; one row
    always fills R (trlX's collated width)."""
    lens = torch.randint(min_len, R + 1, (B,), generator=g)
    lens[0] = R
    mask_r = (torch.arange(R)[None, :] < lens[:, None]).double()
    full = torch.cat([torch.zeros(B, P), mask_r], 1)
    return lens, mask_r, full


def embed(x_r, P):
    return torch.cat([torch.zeros(x_r.shape[0], P), x_r], 1)


def garbage(g, full_mask, x):
    """x with NaN-free junk outside the mask: must not matter."""
    return torch.where(full_mask > 0, x, 7.0 + randn(g, *x.shape))


cases = []


def add(name, kind, source, **kw):
    cases.append({"name": name, "kind": kind, "source": source, **kw})


# ------------------------------------------------------------------ KL controller

for seed, (init, target, horizon, n_steps) in enumerate([(0.2, 6.0, 10000.0, 128), (0.05, 1.5, 500.0, 64), (1.0, 0.3, 40.0, 8)]):
    g = gen(100 + seed)
    currents = (torch.rand(8, generator=g) * 3 * target).tolist()
    ctl = AdaptiveKL(init, target, horizon)
    vals = []
    for c in currents:
        ctl.update(c, n_steps)
        vals.append(ctl.value)
    if TRLX_PPO is not None:
        up = TRLX_PPO["AdaptiveKLController"](init, target, horizon)
        for c, want in zip(currents, vals):
            up.update(c, n_steps)
            close(up.value, want, "AdaptiveKLController")
    add(f"adaptive_kl_{seed}", "adaptive_kl", "hand-derived from trlX's formula (rlhf.md §1.5)",
        init=init, target=target, horizon=horizon, n_steps=n_steps, currents=currents, values=vals)

# ------------------------------------------------------------------ masked statistics

for seed, (shape, p_keep) in enumerate([((3, 7), 0.6), ((2, 5), 0.8), ((4, 9), 0.4), ((1, 6), 1.0)]):
    g = gen(200 + seed)
    x = randn(g, *shape) * 2 + 0.5
    m = (torch.rand(*shape, generator=g) < p_keep).double()
    m.view(-1)[:2] = 1.0  # at least two
    expect = {
        "mean": trl_masked_mean(x, m), "var_unbiased": trl_masked_var(x, m), "var_biased": trl_masked_var(x, m, False),
        "whiten": torch.where(m > 0, trl_masked_whiten(x, m), 0.0),
        "whiten_no_shift": torch.where(m > 0, trl_masked_whiten(x, m, False), 0.0),
        "trlx_whiten": trlx_whiten(x), "trlx_whiten_no_shift": trlx_whiten(x, False),
    }
    if TRL_NS is not None:
        close(TRL_NS["masked_mean"](x, m), expect["mean"], "masked_mean")
        close(TRL_NS["masked_var"](x, m), expect["var_unbiased"], "masked_var")
        close(TRL_NS["masked_var"](x, m, False), expect["var_biased"], "masked_var biased")
        close(torch.where(m > 0, TRL_NS["masked_whiten"](x, m), 0.0), expect["whiten"], "masked_whiten")
        close(torch.where(m > 0, TRL_NS["masked_whiten"](x, m, False), 0.0), expect["whiten_no_shift"], "masked_whiten")
    if TRLX_UTILS is not None:
        close(TRLX_UTILS["whiten"](x, distributed=False), expect["trlx_whiten"], "trlx whiten")
        close(TRLX_UTILS["whiten"](x, shift_mean=False, distributed=False), expect["trlx_whiten_no_shift"], "trlx whiten")
    add(f"masked_stats_{seed}", "masked_stats",
        "hand-derived from TRL's masked_mean/masked_var/masked_whiten (rlhf.md §3.1), padding then set to 0 "
        "as TRL's trainer does; trlx_whiten hand-derived from trlX's whiten (rlhf.md §1.7), run on the input "
        "as recorded (the replay also puts NaN outside the mask, which must not leak)",
        x_finite=t2j(x), mask=t2j(m), expect={k: t2j(v) for k, v in expect.items()})

# ------------------------------------------------------------------ GAE

for seed, (B, P, R, gamma, lam) in enumerate([(3, 2, 5, 1.0, 0.95), (4, 3, 6, 0.99, 0.95), (2, 1, 4, 0.9, 0.5), (3, 4, 3, 1.0, 1.0)]):
    g = gen(300 + seed)
    lens, mask_r, full = layout(g, B, P, R)
    v_r, r_r = randn(g, B, R), randn(g, B, R) * 0.3
    adv = torch.zeros(B, R)
    ret = torch.zeros(B, R)
    for b in range(B):
        L = int(lens[b])
        a, rt = trlx_gae(v_r[b:b + 1, :L], r_r[b:b + 1, :L], gamma, lam)  # trlX's loop on the unpadded row
        if TRLX_PPO is not None:
            cfg = types.SimpleNamespace(gamma=gamma, lam=lam)
            ua, urt = TRLX_PPO["get_advantages_and_returns"](cfg, v_r[b:b + 1, :L], r_r[b:b + 1, :L], L, use_whitening=False)
            close(ua, a, "trlx GAE")
            close(urt, rt, "trlx GAE returns")
        adv[b, :L], ret[b, :L] = a[0], rt[0]
    full_v, full_r = garbage(g, full, embed(v_r, P)), garbage(g, full, embed(r_r, P))
    adv_full, ret_full = embed(adv, P), embed(ret, P)
    whitened = torch.where(full > 0, trl_masked_whiten(adv_full, full), 0.0)
    add(f"gae_{seed}", "gae",
        "hand-derived from trlX's GAE loop (rlhf.md §1.7) run on each unpadded response row; whitened with "
        "TRL's masked_whiten formula (rlhf.md §3.1), padding 0",
        gamma=gamma, lam=lam, values=t2j(full_v), rewards=t2j(full_r), mask=t2j(full),
        advantages=t2j(adv_full), returns=t2j(ret_full), advantages_whitened=t2j(whitened))

# ------------------------------------------------------------------ PPO loss

for seed, (B, P, R, cfg) in enumerate([
    (3, 2, 5, dict(cliprange=0.2, cliprange_value=0.2, vf_coef=1.0)),
    (2, 3, 4, dict(cliprange=0.1, cliprange_value=0.5, vf_coef=0.1)),
    (4, 1, 6, dict(cliprange=0.3, cliprange_value=0.05, vf_coef=2.3)),
    (2, 2, 3, dict(cliprange=0.2, cliprange_value=0.2, vf_coef=1.0)),
]):
    g = gen(400 + seed)
    lens, mask_r, full = layout(g, B, P, R)
    if seed == 3:
        mask_r = torch.ones(B, R)
        full = embed(mask_r, P)
    olp = -torch.rand(B, R, generator=g) * 3
    lp = (olp + randn(g, B, R) * 0.3).requires_grad_(True)
    ov = randn(g, B, R)
    v = (ov + randn(g, B, R) * 0.4).requires_grad_(True)
    adv, ret = randn(g, B, R), ov + randn(g, B, R) * 0.5
    loss, st = trlx_loss(lp, v, olp, ov, adv, ret, mask_r, **cfg)
    if TRLX_PPO is not None:
        up_loss, up_st = TRLX_PPO["loss"](types.SimpleNamespace(**cfg), lp, v, olp, ov, adv, ret, mask_r)
        close(up_loss, loss, "trlx loss")
        close(up_st["policy/approx_kl"], st["approx_kl_trlx"], "trlx approx_kl")
        close(up_st["values/values_error"], st["values_error"], "trlx values_error")
        close(up_st["ratio"], st["ratio"], "trlx ratio")
        close(up_st["padding_percentage"], st["padding_percentage"], "trlx padding")
    if TRL_NS is not None:  # TRL's experimental PPO: the same terms through masked_mean
        mm = TRL_NS["masked_mean"]
        ratio = torch.exp((lp - olp) * mask_r)
        pg = torch.max(-adv * ratio, -adv * torch.clamp(ratio, 1 - cfg["cliprange"], 1 + cfg["cliprange"]))
        close(mm(pg, mask_r), st["pg_loss"], "TRL pg_loss")
    lp_g, v_g = torch.autograd.grad(loss, [lp, v])
    full_in = lambda x: garbage(g, full, embed(x.detach(), P))  # noqa: E731
    add(f"ppo_loss_{seed}", "ppo_loss",
        "hand-derived from trlX's PPOConfig.loss (rlhf.md §1.8) on the [B, R] response slice; approx_kl is the "
        "masked mean (approx_kl_trlx: trlX's mean over [B, R]); grads by torch.autograd",
        config=cfg, log_probs=t2j(full_in(lp)), values=t2j(full_in(v)), old_log_probs=t2j(full_in(olp)),
        old_values=t2j(full_in(ov)), advantages=t2j(full_in(adv)), returns=t2j(full_in(ret)), mask=t2j(full),
        expect={"loss": float(loss), **{k: float(x) for k, x in st.items()}},
        grad_log_probs=t2j(embed(lp_g, P)), grad_values=t2j(embed(v_g, P)))

# ------------------------------------------------------------------ sequence KL

for seed, (B, T) in enumerate([(3, 6), (2, 4)]):
    g = gen(500 + seed)
    lp, ref = -torch.rand(B, T, generator=g) * 2, -torch.rand(B, T, generator=g) * 2
    m = (torch.rand(B, T, generator=g) < 0.7).double()
    lr = lp - ref
    est = {"k1": lr, "k2": 0.5 * lr ** 2, "k3": torch.exp(-lr) - 1 + lr, "trlx_inverted": torch.exp(lr) - 1 - lr}
    add(f"sequence_kl_{seed}", "sequence_kl",
        "hand-derived: TRL's kl estimators with logr = ref - lp (rlhf.md §3.1); trlx_inverted is trlX HEAD's "
        "logged exp(lp - ref) - 1 - (lp - ref) (rlhf.md §1.4)",
        log_probs=t2j(lp), ref_log_probs=t2j(ref), mask=t2j(m),
        expect={k: float((e * m).sum(1).mean()) for k, e in est.items()})

# ------------------------------------------------------------------ reward model (real TRL)

from trl import RewardTrainer  # noqa: E402


class _Acc:
    def gather_for_metrics(self, x):
        return x

    def gather(self, x):
        return x


class _Metrics(dict):
    def __missing__(self, k):
        self[k] = []
        return self[k]


def trl_reward(chosen, rejected, margin=None, coef=None):
    logits = torch.cat([chosen, rejected]).unsqueeze(-1)
    fake_self = types.SimpleNamespace(
        model=types.SimpleNamespace(training=False), args=types.SimpleNamespace(center_rewards_coefficient=coef),
        accelerator=_Acc(), _metrics={"eval": _Metrics(), "train": _Metrics()}, _total_train_tokens=0, _tp_size=1,
    )
    inputs = {"input_ids": torch.zeros(2 * len(chosen), 1, dtype=torch.long), "attention_mask": torch.ones(2 * len(chosen), 1)}
    if margin is not None:
        inputs["margin"] = margin

    def model(**kw):
        return types.SimpleNamespace(logits=logits)

    loss = RewardTrainer.compute_loss(fake_self, model, inputs)
    met = fake_self._metrics["eval"]
    return float(loss), met["accuracy"][-1], met["margin"][-1]


for seed, (B, use_margin, coef) in enumerate([(5, False, None), (6, True, None), (4, False, 0.01), (7, True, 0.05), (3, False, 0.0)]):
    g = gen(600 + seed)
    c, r = randn(g, B), randn(g, B)
    r[0] = c[0]  # a tie: counts as wrong
    margin = torch.rand(B, generator=g) if use_margin else None
    loss, acc, mar = trl_reward(c, r, margin, coef)
    # the Bradley-Terry part alone, to split TRL's single loss into our two terms
    bt, _, _ = trl_reward(c, r, margin, None)
    add(f"trl_reward_{seed}", "trl_reward",
        "trl.RewardTrainer.compute_loss (trl " + __import__("trl").__version__ + ") called on a fake model",
        chosen=t2j(c), rejected=t2j(r), margin=t2j(margin) if margin is not None else None,
        center_rewards_coefficient=coef,
        expect={"loss": loss, "loss_bradley_terry": bt, "accuracy": acc, "margin": mar})

# ------------------------------------------------------------------ reference bugs

# (a) b623d1b's rollout/learner off-by-one: head outputs h [B, T]; rollout values h_old[:, P-1:P+G-1];
# b623d1b's learner vpred[:, -G:] = h_new[:, P:P+G]; HEAD and ours h_new[:, P-1:P+G-1].
g = gen(700)
B, P, G = 2, 3, 4
h_old = randn(g, B, P + G)
h_new = h_old + randn(g, B, P + G) * 0.05
ret_r = h_old[:, P - 1:P + G - 1] + randn(g, B, G) * 0.3
mask_r = torch.ones(B, G)
lp_r = -torch.rand(B, G, generator=g)
adv_r = randn(g, B, G)
ours, st_ours = trlx_loss(lp_r, h_new[:, P - 1:P + G - 1], lp_r, h_old[:, P - 1:P + G - 1], adv_r, ret_r, mask_r)
bug, st_bug = trlx_loss(lp_r, h_new[:, P:P + G], lp_r, h_old[:, P - 1:P + G - 1], adv_r, ret_r, mask_r)
at_rollout_bug, st_at = trlx_loss(lp_r, h_old[:, P:P + G], lp_r, h_old[:, P - 1:P + G - 1], adv_r, ret_r, mask_r)
_, st_at_ours = trlx_loss(lp_r, h_old[:, P - 1:P + G - 1], lp_r, h_old[:, P - 1:P + G - 1], adv_r, ret_r, mask_r)
add("bug_value_alignment", "bug_value_alignment",
    "hand-derived from trlX's PPOConfig.loss (rlhf.md §1.8) with b623d1b's vpred[:, -gen_len:] slice (rlhf.md §1.8, "
    "§7.1) vs HEAD's [P-1, P+G-1) slice",
    prompt_len=P, head_values_old=t2j(h_old), head_values_new=t2j(h_new), log_probs=t2j(embed(lp_r, P)),
    advantages=t2j(embed(adv_r, P)), returns=t2j(embed(ret_r, P)), mask=t2j(embed(mask_r, P)),
    expect={"ours_vf_loss": float(st_ours["vf_loss"]), "b623d1b_vf_loss": float(st_bug["vf_loss"]),
            "ours_vf_clipfrac": float(st_ours["vf_clipfrac"]), "b623d1b_vf_clipfrac": float(st_bug["vf_clipfrac"]),
            "ours_vf_loss_at_rollout": float(st_at_ours["vf_loss"]),
            "b623d1b_vf_loss_at_rollout": float(st_at["vf_loss"])})

# (b) trlX's inverted k3 feeding the controller; (c) b623d1b's policy drift as the KL.
g = gen(800)
B, T = 4, 6
m = torch.ones(B, T)
m[1, 4:] = 0
m[3, 2:] = 0
rollout = -torch.rand(B, T, generator=g) * 2
ref = rollout - 0.25 + randn(g, B, T) * 0.3  # the policy has drifted from the reference
lr = rollout - ref
k3 = float(((torch.exp(-lr) - 1 + lr) * m).sum(1).mean())
inv = float(((torch.exp(lr) - 1 - lr) * m).sum(1).mean())
k1 = float((lr * m).sum(1).mean())
target = 0.5 * (k3 + inv)
ctl_k3, ctl_inv = AdaptiveKL(0.2, target, 100.0), AdaptiveKL(0.2, target, 100.0)
ctl_k3.update(k3, 16)
ctl_inv.update(inv, 16)
add("bug_inverted_k3", "bug_inverted_k3",
    "hand-derived: trlX HEAD's exp(lr)-1-lr (rlhf.md §1.4, §5.3) vs k3 exp(-lr)-1+lr, each fed to trlX's "
    "AdaptiveKLController formula (rlhf.md §1.5)",
    log_probs=t2j(rollout), ref_log_probs=t2j(ref), mask=t2j(m), init=0.2, target=target, horizon=100.0, n_steps=16,
    expect={"k3": k3, "trlx_inverted": inv, "value_k3": ctl_k3.value, "value_trlx_inverted": ctl_inv.value})

new = rollout + randn(g, B, T) * 0.01  # the first PPO step after the rollout
drift = float(((new - rollout) * m).sum(1).mean())
ctl_drift, ctl_k1 = AdaptiveKL(0.2, 1.0, 100.0), AdaptiveKL(0.2, 1.0, 100.0)
ctl_drift.update(drift, 16)
ctl_k1.update(k1, 16)
add("bug_policy_drift", "bug_policy_drift",
    "hand-derived: b623d1b's mean(sum(logprob_new - logprob_rollout)) (rlhf.md §1.5) vs the mean sequence k1 to the "
    "reference, each fed to trlX's AdaptiveKLController formula (rlhf.md §1.5)",
    new_log_probs=t2j(new), log_probs=t2j(rollout), ref_log_probs=t2j(ref), mask=t2j(m), init=0.2, target=1.0,
    horizon=100.0, n_steps=16,
    expect={"b623d1b_drift": drift, "k1": k1, "value_b623d1b": ctl_drift.value, "value_k1": ctl_k1.value})

# (d) padding in whitening
g = gen(900)
B, R = 3, 5
lens = torch.tensor([5, 2, 3])
mask_r = (torch.arange(R)[None, :] < lens[:, None]).double()
adv = randn(g, B, R) * mask_r + 0.8 * mask_r  # collated: 0 on padding
add("bug_padded_whitening", "bug_padded_whitening",
    "hand-derived: trlX's whiten over the whole [B, R] (rlhf.md §1.7) vs TRL's masked_whiten (rlhf.md §3.1), padding 0",
    advantages=t2j(adv), mask=t2j(mask_r),
    expect={"trlx": t2j(trlx_whiten(adv)), "ours": t2j(torch.where(mask_r > 0, trl_masked_whiten(adv, mask_r), 0.0))})

# ------------------------------------------------------------------ write

versions = {"torch": torch.__version__, "trl": __import__("trl").__version__, "numpy": np.__version__,
            "python": sys.version.split()[0]}
with open(OUT, "w") as f:
    f.write("{\n")
    f.write(f' "generator": "specs/record_rlhf.py",\n "versions": {json.dumps(versions)},\n')
    f.write(f' "cross_checks": {json.dumps(CROSS)},\n "cases": [\n')
    f.write(",\n".join("  " + json.dumps(c) for c in cases))
    f.write("\n ]\n}\n")
print(f"wrote {len(cases)} cases to {OUT}", file=sys.stderr)
