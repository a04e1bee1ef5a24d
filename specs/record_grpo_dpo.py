#!/usr/bin/env python
"""Record fidelity cases for ``torchrl::objectives::llm::{grpo, dpo}`` from the upstream loss
functions themselves: TorchRL's ``GRPOLoss`` and ``MCAdvantage``, TRL's ``GRPOTrainer`` and
``DPOTrainer``.

Run from the repository root:

    /root/.cache/torchrl-rs/venv/bin/python specs/record_grpo_dpo.py

It writes ``specs/grpo_dpo_cases.json``, which ``tests/grpo_dpo_recorded.rs`` replays (Rust
never runs Python). Inputs are random but seeded (``torch.Generator().manual_seed``, seeds
other than rlhf.md §5.7 / §5.8's hand values), float64, and written out in full; running the
script twice gives the same file.

Where every expected number comes from (each case's ``source`` says it again):

* ``torchrl_grpo``: ``torchrl.objectives.llm.GRPOLoss.forward`` (torchrl 0.14.1), the real
  module, on a tensordict in its LLM layout (``("tokens", "full")``, ``("masks", ...)``,
  ``("log_probs", "full")``, ``("next", "ref_log_probs", "full")``, ``"advantage"``). Its
  actor is a minimal module whose ``get_dist`` returns TorchRL's own
  ``LLMMaskedCategorical`` over a ``[B, T, V]`` logits parameter (masked by the assistant
  mask), so GRPOLoss's current log-probs (``dist.log_prob``) and exact entropy
  (``dist.entropy``) are TorchRL's. The logits are stored in the causal-LM layout (position
  ``t`` predicts token ``t + 1``) and shifted by one for the distribution, which is what the
  Rust policy does. Outputs: every ``GRPOLossOutput`` field, and the gradients with respect
  to the logits of ``loss_objective + loss_entropy`` (summed under ``aggregation="none"``) and
  of ``loss_kl_to_ref``, from ``torch.autograd.grad``.
* ``torchrl_mc_advantage``: ``torchrl.objectives.llm.MCAdvantage.inv`` (its replay-buffer write
  hook), fed one-step trajectories of interleaved prompts; the groups it emits, in order.
* ``trl_grpo_advantages``: the statements of TRL 1.16's
  ``GRPOTrainer._generate_and_score_completions`` from ``unscorable_mask = ...`` through
  ``advantages = torch.nan_to_num(...)``, taken from the installed module's source with ``ast``
  and executed as they are (TRL keeps them inline in that method, which also generates and
  scores; there is no smaller upstream function), with ``self`` a stand-in carrying
  ``scale_rewards``, ``multi_objective_aggregation`` and ``reward_weights``, and one reward
  function's ``rewards_per_func``.
* ``trl_grpo_loss``: ``trl.GRPOTrainer._compute_loss`` (trl 1.16), called unbound on a stand-in
  ``self`` (the attributes it reads, ``model.training=False`` so no gradient-accumulation
  scaling, one process) whose ``_get_per_token_logps_and_entropies`` returns the recorded
  float64 per-token log-probs and entropies of the completion tokens; the loss TRL returns and
  its logged metrics (``kl``, ``entropy``, ``clip_ratio/region_mean``, ``policy_loss``).
* ``trl_dpo``: ``trl.DPOTrainer._compute_loss`` (trl 1.16), unbound on a stand-in ``self``
  (precomputed reference log-probs, ``f_divergence_type="reverse_kl"``) with a stand-in model
  returning what ``trl.trainer.utils.add_fused_lm_head`` returns (``log_probs`` /
  ``entropy`` / ``mean_logits`` / ``is_top1`` of the next-token labels, 0 where the label is
  ``-100``) in float64 from seeded logits; TRL's real fused kernel computes in float32, so
  the stand-in is checked against it on a tiny random ``transformers`` GPT-2 (to 1e-5) before
  anything is recorded. Loss and logged rewards / accuracies / margins of the batch, and of
  each pair alone (the per-pair values); for ``sigmoid``, also the batch with chosen and
  rejected swapped (``-log σ(-βΔ)``).

File: ``{"generator", "versions", "cases": [{"name", "kind", "source", ...}]}``; tensors are
``{"shape", "data"}`` (row-major, float64; integer tensors hold integral values).
"""

from __future__ import annotations

import ast
import inspect
import json
import os
import sys
import textwrap
import types
import warnings

warnings.filterwarnings("ignore")

import torch  # noqa: E402

torch.set_default_dtype(torch.float64)
HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "grpo_dpo_cases.json")

import tensordict  # noqa: E402
import torchrl  # noqa: E402
import transformers  # noqa: E402
import trl  # noqa: E402
from tensordict import NonTensorData, TensorDict  # noqa: E402
from torchrl.modules.distributions import LLMMaskedCategorical  # noqa: E402
from torchrl.objectives.llm import GRPOLoss, MCAdvantage  # noqa: E402
from trl import DPOTrainer, GRPOTrainer  # noqa: E402
from trl.trainer.utils import add_fused_lm_head, nanstd  # noqa: E402


def t2j(t):
    t = torch.as_tensor(t).detach().to(torch.float64)
    return {"shape": list(t.shape), "data": [float(x) for x in t.reshape(-1).tolist()]}


def gen(seed):
    return torch.Generator().manual_seed(seed)


def f(x):
    return float(torch.as_tensor(x).detach())


cases = []


def add(name, kind, source, **kw):
    cases.append({"name": name, "kind": kind, "source": source, **kw})


def shifted(model_logits):
    """The per-token distribution of token t is the causal LM's output at t - 1 (position 0
    gets a zero row; it is never in a mask)."""
    zero = torch.zeros_like(model_logits[:, :1])
    return torch.cat([zero, model_logits[:, :-1]], 1)


def token_log_probs(model_logits, tokens):
    lp = torch.log_softmax(shifted(model_logits), -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    lp[:, 0] = 0.0
    return lp


def left_right_layout(g, prompt_lens, response_lens, P, R, V):
    """Tokens [B, P + R]: prompt left-padded into P, response right-padded into R; the
    attention and assistant masks."""
    B = len(prompt_lens)
    T = P + R
    tokens = torch.randint(0, V, (B, T), generator=g)
    attn = torch.zeros(B, T, dtype=torch.bool)
    asst = torch.zeros(B, T, dtype=torch.bool)
    for b, (p, r) in enumerate(zip(prompt_lens, response_lens)):
        attn[b, P - p:P + r] = True
        asst[b, P:P + r] = True
    tokens = torch.where(attn, tokens, torch.full_like(tokens, V - 1))  # pad id V - 1
    return tokens, attn, asst


# ------------------------------------------------------------------ TorchRL GRPOLoss


class LogitsActor(torch.nn.Module):
    """A policy whose logits are a parameter ([B, T, V], causal-LM layout); its distribution is
    TorchRL's LLMMaskedCategorical over the assistant tokens."""

    def __init__(self, model_logits):
        super().__init__()
        self.logits = torch.nn.Parameter(model_logits.clone())

    def get_dist(self, tensordict, logits_key="logits", **kwargs):
        mask = tensordict.get(("masks", "all_assistant_mask"))
        return LLMMaskedCategorical(logits=shifted(self.logits), mask=mask)


def torchrl_grpo_inputs(seed, per_token_adv, noise):
    g = gen(seed)
    B, P, R, V = 3, 3, 4, 5
    tokens, attn, asst = left_right_layout(g, [2, 3, 1], [4, 2, 3], P, R, V)
    model_logits = torch.randn(B, P + R, V, generator=g) * 1.5
    cur = token_log_probs(model_logits, tokens)
    garbage = -3.0 * torch.rand(B, P + R, generator=g)
    old = torch.where(asst, cur + noise * torch.randn(B, P + R, generator=g), garbage)
    ref = torch.where(asst, cur + 0.3 * torch.randn(B, P + R, generator=g) - 0.1, garbage)
    if per_token_adv:
        adv = torch.randn(B, P + R, 1, generator=g)
    else:
        adv = torch.randn(B, 1, 1, generator=g)
    return dict(tokens=tokens, attn=attn, asst=asst, logits=model_logits, old=old, ref=ref, adv=adv)


def run_torchrl_grpo(inp, clip_epsilon, aggregation, entropy_bonus, entropy_coeff, kl_to_ref_coeff):
    actor = LogitsActor(inp["logits"])
    B = inp["tokens"].shape[0]
    td = TensorDict(
        {
            "tokens": {"full": inp["tokens"]},
            "masks": {"all_attention_mask": inp["attn"], "all_assistant_mask": inp["asst"]},
            "log_probs": {"full": inp["old"]},
            "next": {"ref_log_probs": {"full": inp["ref"]}},
            "advantage": inp["adv"],
        },
        batch_size=[B],
    )
    loss = GRPOLoss(
        actor,
        clip_epsilon=clip_epsilon,
        aggregation=aggregation,
        entropy_bonus=entropy_bonus,
        entropy_coeff=entropy_coeff,
        kl_to_ref_coeff=kl_to_ref_coeff,
    )
    out = loss(td)
    expect = {}
    for k in ["loss_objective", "clip_fraction", "kl_approx", "ESS", "entropy", "loss_entropy",
              "loss_kl_to_ref", "kl_to_ref"]:
        v = getattr(out, k)
        if v is None:
            expect[k] = None
        elif v.numel() == 1:  # prompt_mean's loss is [1]
            expect[k] = f(v)
        else:
            expect[k] = t2j(v.squeeze(-1))
    main = out.loss_objective
    if out.loss_entropy is not None:
        main = main + out.loss_entropy
    (grad_main,) = torch.autograd.grad(main.sum(), actor.logits, retain_graph=True)
    grad_kl = None
    if out.loss_kl_to_ref is not None:
        (grad_kl,) = torch.autograd.grad(out.loss_kl_to_ref, actor.logits)
    # what TorchRL's distribution gave (for the Rust policy's own check)
    dist = actor.get_dist(td)
    lp = dist.log_prob(inp["tokens"]).detach()
    ent = dist.entropy().detach()
    return expect, t2j(grad_main), (None if grad_kl is None else t2j(grad_kl)), lp, ent


TORCHRL_CONFIGS = {
    # name: (clip_epsilon, aggregation, entropy_bonus, entropy_coeff, kl_to_ref_coeff)
    "sym_token_mean_entropy": (0.2, "token_mean", True, 0.01, None),
    "dapo_token_mean_kl": ((0.20, 0.28), "token_mean", False, 0.01, 0.05),
    "sym_prompt_mean_entropy_kl": (0.2, "prompt_mean", True, 0.05, 0.1),
    "sym_none_entropy": (0.2, "none", True, 0.01, None),
    "dapo_token_mean_entropy_kl": ((0.20, 0.28), "token_mean", True, 0.01, 0.1),
    "dapo_prompt_mean": ((0.20, 0.28), "prompt_mean", False, 0.01, None),
    "dapo_none_entropy_kl": ((0.20, 0.28), "none", True, 0.02, 0.02),
}
TORCHRL_SETS = {
    "per_sequence_adv": (1101, False, 0.25, ["sym_token_mean_entropy", "dapo_token_mean_kl",
                                             "sym_prompt_mean_entropy_kl", "sym_none_entropy"]),
    "per_token_adv": (1202, True, 0.4, ["dapo_token_mean_entropy_kl", "dapo_prompt_mean",
                                        "dapo_none_entropy_kl"]),
}

for set_name, (seed, per_token, noise, names) in TORCHRL_SETS.items():
    inp = torchrl_grpo_inputs(seed, per_token, noise)
    configs = []
    lp = ent = None
    for name in names:
        eps, agg, ent_on, coeff, kl = TORCHRL_CONFIGS[name]
        expect, grad_main, grad_kl, lp, ent = run_torchrl_grpo(inp, eps, agg, ent_on, coeff, kl)
        lo, hi = (eps, eps) if isinstance(eps, float) else eps
        configs.append({
            "name": name,
            "clip_epsilon": [lo, hi], "aggregation": agg, "entropy_bonus": ent_on,
            "entropy_coeff": coeff, "kl_to_ref_coeff": kl,
            "expect": expect, "grad_objective_entropy": grad_main, "grad_kl_to_ref": grad_kl,
        })
    add(f"torchrl_grpo_{set_name}", "torchrl_grpo",
        f"torchrl.objectives.llm.GRPOLoss.forward (torchrl {torchrl.__version__}) with an actor whose "
        "get_dist is torchrl's LLMMaskedCategorical over shifted logits (assistant mask); gradients by "
        "torch.autograd.grad",
        tokens=t2j(inp["tokens"]), attention_mask=t2j(inp["attn"]), assistant_mask=t2j(inp["asst"]),
        logits=t2j(inp["logits"]), old_log_probs=t2j(inp["old"]), ref_log_probs=t2j(inp["ref"]),
        advantage=t2j(inp["adv"]), torchrl_log_probs=t2j(lp), torchrl_entropy=t2j(ent),
        configs=configs)

# ------------------------------------------------------------------ TorchRL MCAdvantage


def mc_traj(query, reward):
    return TensorDict(
        query=NonTensorData(query, batch_size=[1]),
        next=TensorDict(reward=torch.tensor([[reward]]), done=torch.tensor([[True]]), batch_size=[1]),
        batch_size=[1],
    )


def run_mc(grpo_size, stream):
    t = MCAdvantage(grpo_size=grpo_size)
    groups = []
    for query, reward in stream:
        out = t.inv(mc_traj(query, reward))
        if out is not None:
            groups.append({
                "query": out[0]["query"],
                "rewards": t2j(out.get(("next", "reward")).reshape(-1)),
                "advantages": t2j(out.get("advantage").reshape(-1)),
            })
    return groups


g = gen(1303)
stream = []
rewards = {"p0": torch.randn(4, generator=g), "p1": torch.tensor([1.0, 0.0, 0.0, 1.0]) * 0.5 + 0.25,
           "p2": torch.full((4,), 0.7), "p3": 2.0 + 1e-8 * torch.arange(4.0)}
for i in range(4):  # interleaved: one completion of each prompt in turn
    for q in ["p0", "p1", "p2", "p3"]:
        stream.append((q, float(rewards[q][i])))
add("torchrl_mc_advantage_interleaved", "torchrl_mc_advantage",
    f"torchrl.objectives.llm.MCAdvantage(grpo_size=4).inv (torchrl {torchrl.__version__}) on one-step "
    "trajectories; p2's rewards are all equal (std 0), p3's spread is below the 1e-6 std floor",
    grpo_size=4, stream=[{"query": q, "reward": r} for q, r in stream], groups=run_mc(4, stream))
g = gen(1304)
stream = [(f"q{i % 3}", float(x)) for i, x in enumerate(torch.rand(9, generator=g))]
add("torchrl_mc_advantage_groups_of_3", "torchrl_mc_advantage",
    f"torchrl.objectives.llm.MCAdvantage(grpo_size=3).inv (torchrl {torchrl.__version__}) on one-step trajectories",
    grpo_size=3, stream=[{"query": q, "reward": r} for q, r in stream], groups=run_mc(3, stream))

# ------------------------------------------------------------------ TRL GRPO advantages


def trl_advantage_block():
    src = textwrap.dedent(inspect.getsource(GRPOTrainer._generate_and_score_completions))
    fn = ast.parse(src).body[0]
    first = last = None
    for i, node in enumerate(fn.body):
        seg = ast.get_source_segment(src, node) or ""
        if first is None and seg.startswith("unscorable_mask ="):
            first = i
        if first is not None and seg.startswith("advantages = torch.nan_to_num("):
            last = i
            break
    if first is None or last is None:
        raise SystemExit("could not find TRL's advantage statements in _generate_and_score_completions")
    module = ast.Module(body=fn.body[first:last + 1], type_ignores=[])
    return compile(module, inspect.getsourcefile(GRPOTrainer), "exec"), ast.unparse(module)


TRL_ADV_CODE, TRL_ADV_SRC = trl_advantage_block()


def trl_advantages(rewards, num_generations, scale_rewards):
    ns = {
        "torch": torch, "nanstd": nanstd, "device": "cpu", "num_generations": num_generations,
        "rewards_per_func": rewards.reshape(-1, 1).clone(),
        "self": types.SimpleNamespace(scale_rewards=scale_rewards, multi_objective_aggregation="sum_then_normalize",
                                      reward_weights=torch.tensor([1.0])),
    }
    exec(TRL_ADV_CODE, ns)  # noqa: S102
    return ns["advantages"]


g = gen(1405)
adv_rewards = torch.cat([torch.randn(4, generator=g), torch.tensor([1.0, 0.0, 0.0, 1.0]), torch.full((4,), 0.3),
                         torch.rand(4, generator=g)])
for scale in ["group", "batch", "none"]:
    add(f"trl_grpo_advantages_{scale}", "trl_grpo_advantages",
        f"trl.GRPOTrainer._generate_and_score_completions (trl {trl.__version__}): its advantage statements "
        f"executed from the installed source, scale_rewards={scale!r}, one reward function",
        rewards=t2j(adv_rewards), num_generations=4, scale_rewards=scale,
        advantages=t2j(trl_advantages(adv_rewards, 4, scale)))

# ------------------------------------------------------------------ TRL GRPO loss


class _Acc:
    num_processes = 1
    sync_gradients = True
    device = "cpu"

    def gather(self, x):
        return x

    def gather_for_metrics(self, x):
        return x

    def reduce(self, x, reduction="sum"):
        return x


class _Metrics(dict):
    def __missing__(self, k):
        self[k] = []
        return self[k]


g = gen(1506)
B, C, V = 4, 5, 6
comp_lens = torch.tensor([5, 3, 1, 4])
comp_mask = (torch.arange(C)[None, :] < comp_lens[:, None]).long()
comp_ids = torch.randint(0, V, (B, C), generator=g)
comp_logits = torch.randn(B, C, V, generator=g) * 1.5
trl_lp = torch.log_softmax(comp_logits, -1).gather(-1, comp_ids.unsqueeze(-1)).squeeze(-1) * comp_mask
p = torch.softmax(comp_logits, -1)
trl_entropy = -(p * torch.log_softmax(comp_logits, -1)).sum(-1) * comp_mask
trl_old = (trl_lp + 0.3 * torch.randn(B, C, generator=g)) * comp_mask
trl_ref = (trl_lp + 0.25 * torch.randn(B, C, generator=g) - 0.05) * comp_mask
trl_adv = torch.randn(B, generator=g)
n_local = int(comp_mask.sum())


def trl_grpo_loss(loss_type, beta, eps_lo, eps_hi, max_completion_length, num_items_in_batch, entropy_coef):
    def logps_and_entropies(model, input_ids, attention_mask, logits_to_keep, compute_entropy=False, **kw):
        assert logits_to_keep == C and input_ids.shape == (B, 2 + C)
        return trl_lp.clone(), (trl_entropy.clone() if compute_entropy else None), None

    fake_self = types.SimpleNamespace(
        _get_per_token_logps_and_entropies=logps_and_entropies,
        aux_loss_enabled=False, top_entropy_quantile=1.0, off_policy_mask_threshold=None,
        importance_sampling_level="token", beta=beta, loss_type=loss_type,
        epsilon_low=eps_lo, epsilon_high=eps_hi, use_vllm=False, vllm_importance_sampling_correction=False,
        args=types.SimpleNamespace(use_bias_correction_kl=False, delta=None, steps_per_generation=1),
        model=types.SimpleNamespace(training=False), current_gradient_accumulation_steps=1,
        max_completion_length=max_completion_length, accelerator=_Acc(),
        _entropy_bonus_enabled=entropy_coef != 0.0, entropy_coef=entropy_coef, use_adaptive_entropy=False,
        _metrics={"train": _Metrics(), "eval": _Metrics()},
    )
    inputs = {
        "prompt_ids": torch.zeros(B, 2, dtype=torch.long), "prompt_mask": torch.ones(B, 2, dtype=torch.long),
        "completion_ids": comp_ids, "completion_mask": comp_mask, "advantages": trl_adv.clone(),
        "old_per_token_logps": trl_old.clone(), "ref_per_token_logps": trl_ref.clone(),
        "num_items_in_batch": torch.tensor(float(num_items_in_batch)),
    }
    loss = GRPOTrainer._compute_loss(fake_self, None, inputs)
    met = fake_self._metrics["eval"]
    metrics = {k: float(v[-1]) for k, v in met.items() if k in
               ["kl", "entropy", "clip_ratio/region_mean", "clip_ratio/low_mean", "clip_ratio/high_mean",
                "policy_loss"]}
    return f(loss), metrics


trl_configs = []
for loss_type, eps_hi, mcl, nib, ent in [
    ("grpo", 0.2, 8, n_local, 0.0),
    ("grpo", 0.2, 8, n_local, 0.01),
    ("bnpo", 0.2, 8, n_local, 0.0),
    ("dr_grpo", 0.2, 8, n_local, 0.0),
    ("dr_grpo", 0.28, 5, n_local, 0.05),
    ("dapo", 0.28, 8, n_local, 0.0),
    ("dapo", 0.28, 8, 2 * n_local + 3, 0.01),
]:
    loss, metrics = trl_grpo_loss(loss_type, 0.04, 0.2, eps_hi, mcl, nib, ent)
    trl_configs.append({"loss_type": loss_type, "beta": 0.04, "epsilon_low": 0.2, "epsilon_high": eps_hi,
                        "max_completion_length": mcl, "num_items_in_batch": nib, "entropy_coef": ent,
                        "loss": loss, "metrics": metrics})
add("trl_grpo_loss_per_loss_type", "trl_grpo_loss",
    f"trl.GRPOTrainer._compute_loss (trl {trl.__version__}) unbound on a stand-in self (eval mode, one process) "
    "whose _get_per_token_logps_and_entropies returns the recorded completion log-probs and entropies",
    completion_mask=t2j(comp_mask), log_probs=t2j(trl_lp), old_log_probs=t2j(trl_old),
    ref_log_probs=t2j(trl_ref), advantages=t2j(trl_adv), entropy=t2j(trl_entropy), configs=trl_configs)

# ------------------------------------------------------------------ TRL DPO


def fused_outputs(logits, input_ids, labels):
    """What add_fused_lm_head's forward returns, from full logits [N, T, V] (float64)."""
    lab = labels[:, 1:]
    mask = lab != -100
    logp = torch.log_softmax(logits[:, :-1], -1)
    tok = lab.clamp(min=0).unsqueeze(-1)
    log_probs = logp.gather(-1, tok).squeeze(-1)
    entropy = -(logp.exp() * logp).sum(-1)
    mean_logits = logits[:, :-1].mean(-1)
    is_top1 = logits[:, :-1].argmax(-1) == lab
    z = lambda x: x.masked_fill(~mask, 0)  # noqa: E731
    return types.SimpleNamespace(log_probs=z(log_probs), entropy=z(entropy), mean_logits=z(mean_logits),
                                 is_top1=is_top1 & mask, aux_loss=None)


def check_stand_in_against_fused_head():
    torch.manual_seed(7)
    cfg = transformers.GPT2Config(vocab_size=11, n_positions=16, n_embd=8, n_layer=1, n_head=2,
                                  bos_token_id=0, eos_token_id=0)
    m = transformers.GPT2LMHeadModel(cfg).float().eval()
    ids = torch.randint(0, 11, (3, 6))
    am = torch.ones(3, 6, dtype=torch.long)
    labels = ids.masked_fill(torch.tensor([[1, 1, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0], [1, 0, 0, 0, 0, 0]]) == 1, -100)
    with torch.no_grad():
        logits = m(input_ids=ids, attention_mask=am).logits.double()
        add_fused_lm_head(m, outputs=("log_probs", "entropy", "mean_logits", "is_top1"))
        real = m(input_ids=ids, attention_mask=am, labels=labels, fused_lm_head=True, use_cache=False)
    mine = fused_outputs(logits, ids, labels)
    for k in ["log_probs", "entropy", "mean_logits"]:
        a, b = getattr(real, k).double(), getattr(mine, k)
        if not torch.allclose(a, b, atol=1e-5, rtol=1e-5):
            raise SystemExit(f"stand-in fused head differs from trl's add_fused_lm_head on {k}: {a} vs {b}")
    if not torch.equal(real.is_top1.bool(), mine.is_top1):
        raise SystemExit("stand-in fused head differs from trl's add_fused_lm_head on is_top1")


check_stand_in_against_fused_head()


def trl_dpo(logits, ids, attn, comp, ref_c, ref_r, loss_type, beta, label_smoothing):
    def model(input_ids, attention_mask, labels, fused_lm_head, use_cache):
        assert fused_lm_head and torch.equal(input_ids, ids)
        return fused_outputs(logits, input_ids, labels)

    fake_self = types.SimpleNamespace(
        model=types.SimpleNamespace(training=False), accelerator=_Acc(), aux_loss_enabled=False,
        ld_alpha=None, precompute_ref_logps=True, f_divergence_type="reverse_kl", beta=beta,
        loss_types=[loss_type], loss_weights=[1.0], label_smoothing=label_smoothing, use_weighting=False,
        _metrics={"train": _Metrics(), "eval": _Metrics()}, _total_train_tokens=0, _tp_size=1,
        args=types.SimpleNamespace(gradient_checkpointing_kwargs=None),
    )
    inputs = {"input_ids": ids, "attention_mask": attn, "completion_mask": comp,
              "ref_chosen_logps": ref_c, "ref_rejected_logps": ref_r}
    loss = DPOTrainer._compute_loss(fake_self, model, inputs, return_outputs=False)
    met = fake_self._metrics["eval"]
    return f(loss), {k: float(met[k][-1]) for k in
                     ["rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins"]}


g = gen(1607)
NP, P, R, V = 4, 2, 4, 7
T = P + R


def side(lens):
    ids = torch.randint(0, V - 1, (NP, T), generator=g)
    attn = torch.zeros(NP, T, dtype=torch.long)
    comp = torch.zeros(NP, T, dtype=torch.long)
    for b, r in enumerate(lens):
        attn[b, :P + r] = 1
        comp[b, P:P + r] = 1
    ids = torch.where(attn == 1, ids, torch.full_like(ids, V - 1))  # right padding, pad id V - 1
    return ids, attn, comp


c_ids, c_attn, c_comp = side([4, 2, 3, 1])
r_ids, r_attn, r_comp = side([3, 4, 1, 2])
r_ids[:, :P] = c_ids[:, :P]  # same prompt
logits = torch.randn(2 * NP, T, V, generator=g) * 2.0
ids = torch.cat([c_ids, r_ids])
attn = torch.cat([c_attn, r_attn])
comp = torch.cat([c_comp, r_comp])
# our alignment: lp[t] = log p(token t | < t), masked by the completion mask
ours_lp = torch.zeros(2 * NP, T)
ours_lp[:, 1:] = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
seq = (ours_lp * comp).sum(1)
pol_c, pol_r = seq.chunk(2)
# reference log-probs with Δ = (π_c - ref_c) - (π_r - ref_r) of signs [+, -, +, -]: half the pairs right
shift_c = 1.5 * torch.randn(NP, generator=g)
gap = (0.5 + torch.rand(NP, generator=g)) * torch.tensor([1.0, -1.0, 1.0, -1.0])
ref_c = pol_c - shift_c
ref_r = pol_r - (shift_c - gap)

dpo_configs = []
for loss_type, beta, ls in [("sigmoid", 0.1, 0.0), ("sigmoid", 0.1, 0.1), ("hinge", 0.5, 0.0), ("ipo", 0.1, 0.0),
                            ("ipo", 0.5, 0.0), ("robust", 0.1, 0.1), ("robust", 0.2, 0.3)]:
    loss, metrics = trl_dpo(logits, ids, attn, comp, ref_c, ref_r, loss_type, beta, ls)
    per_pair = []
    for b in range(NP):
        sel = torch.tensor([b, NP + b])
        lb, mb = trl_dpo(logits[sel], ids[sel], attn[sel], comp[sel], ref_c[b:b + 1], ref_r[b:b + 1],
                         loss_type, beta, ls)
        per_pair.append({"loss": lb, "chosen_reward": mb["rewards/chosen"], "rejected_reward": mb["rewards/rejected"],
                         "accuracy": mb["rewards/accuracies"]})
    cfg = {"loss_type": loss_type, "beta": beta, "label_smoothing": ls, "loss": loss, "metrics": metrics,
           "per_pair": per_pair}
    if loss_type == "sigmoid":
        swapped = torch.cat([r_ids, c_ids])
        sw_logits = torch.cat([logits[NP:], logits[:NP]])
        cfg["loss_swapped"], _ = trl_dpo(sw_logits, swapped, torch.cat([r_attn, c_attn]), torch.cat([r_comp, c_comp]),
                                         ref_r, ref_c, loss_type, beta, ls)
    dpo_configs.append(cfg)
add("trl_dpo_per_loss_type", "trl_dpo",
    f"trl.DPOTrainer._compute_loss (trl {trl.__version__}) unbound on a stand-in self (precomputed reference "
    "log-probs, reverse KL) and a float64 stand-in for add_fused_lm_head's outputs (checked against the real one)",
    chosen={"input_ids": t2j(c_ids), "attention_mask": t2j(c_attn), "completion_mask": t2j(c_comp),
            "token_log_probs": t2j(ours_lp[:NP]), "ref_log_probs": t2j(ref_c)},
    rejected={"input_ids": t2j(r_ids), "attention_mask": t2j(r_attn), "completion_mask": t2j(r_comp),
              "token_log_probs": t2j(ours_lp[NP:]), "ref_log_probs": t2j(ref_r)},
    configs=dpo_configs)

# ------------------------------------------------------------------ write

versions = {"torch": torch.__version__, "torchrl": torchrl.__version__, "tensordict": tensordict.__version__,
            "trl": trl.__version__, "transformers": transformers.__version__, "python": sys.version.split()[0]}
with open(OUT, "w") as fh:
    fh.write("{\n")
    fh.write(f' "generator": "specs/record_grpo_dpo.py",\n "versions": {json.dumps(versions)},\n')
    fh.write(f' "trl_advantage_statements": {json.dumps(TRL_ADV_SRC)},\n "cases": [\n')
    fh.write(",\n".join("  " + json.dumps(c) for c in cases))
    fh.write("\n ]\n}\n")
print(f"wrote {len(cases)} cases to {OUT} ({os.path.getsize(OUT)} bytes)", file=sys.stderr)
