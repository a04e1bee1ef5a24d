"""The Python half of the side-by-side ILQL benchmarks (W13, W14): a random-init
`transformers.GPT2LMHeadModel` with trlX-style ILQL heads written here, at the RLHF flagship's
config (vocab 259, 2 blocks x 64 wide, 4 heads, context 64), on CPU, nothing downloaded.

W13: beta-shaped generation (trlX's `generate` loop, rlhf.md section 2.4) with the KV cache,
batch 32 prompts of 5 tokens, 12 new tokens, beta 1, top-k 20, temperature 1 (trlX HEAD's
`gen_kwargs`), two target Q heads. As in trlX, each step runs the model's full forward (LM
logits and every head, online Q heads included, over the step's input positions) and keeps the
last position. Reported as generated tokens per second (batch x steps run).

W14: one ILQL optimizer step: trlX HEAD's loss (rlhf.md section 2.3: Q, expectile V, CQL and
AWAC terms; tau 0.7, gamma 0.99, cql_scale 0.1, awac_scale 1, beta 0) on 32 sequences of 18
tokens (bos + 5 prompt + 12 response) with actions over the last 12 positions, then
`backward` and an AdamW step (HEAD's lr 5e-5, betas 0.9/0.95, eps 1e-8, weight decay 1e-6).
The Polyak target sync is not part of the step. Reported as steps per second.

Best of 3 after a warm-up, on one thread unless `--threads`. Prints `name<TAB>ops/s` lines, or
one JSON object with `--json`; the settings go to stderr.
"""
import argparse
import copy
import inspect
import json
import sys
import time
from functools import reduce

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel

FLAGSHIP = dict(vocab_size=259, n_positions=64, n_embd=64, n_layer=2, n_head=4)
EOS, BOS = 256, 258
# transformers >= 5.2x renamed the forward's `past_key_values` argument to `cache`
CACHE_ARG = ("cache" if "cache" in inspect.signature(GPT2LMHeadModel.forward).parameters
             else "past_key_values")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--prompt-len", type=int, default=5)
    p.add_argument("--new-tokens", type=int, default=12)
    p.add_argument("--repeat", type=int, default=3, help="timed runs (best is reported)")
    p.add_argument("--inner", type=int, default=5, help="generations / steps per timed run")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="one JSON object instead of tab lines")
    return p.parse_args()


def best_rate(f, repeat):
    """The best of `repeat` runs of `f` (which returns its units of work), in units per second."""
    best = 0.0
    for _ in range(repeat):
        t0 = time.perf_counter()
        work = f()
        best = max(best, work / (time.perf_counter() - t0))
    return best


def make_head(n_embd, out):
    """trlX's `make_head`: Linear(h, 2h) -> ReLU -> Linear(2h, out)."""
    return nn.Sequential(nn.Linear(n_embd, 2 * n_embd), nn.ReLU(), nn.Linear(2 * n_embd, out))


def gather_positions(hs, ixs):
    """`hs` [B, T, H] at `ixs` [B, N] -> [B, N, H] (trlX's `batched_index_select`)."""
    return hs.gather(1, ixs.unsqueeze(-1).expand(-1, -1, hs.shape[-1]))


class IlqlHeads(nn.Module):
    """v head, two Q heads and their frozen target copies, as trlX HEAD's `ILQLHeads`."""

    def __init__(self, n_embd, vocab, n_qs=2):
        super().__init__()
        self.v_head = make_head(n_embd, 1)
        self.q_heads = nn.ModuleList(make_head(n_embd, vocab) for _ in range(n_qs))
        self.target_q_heads = nn.ModuleList(copy.deepcopy(q) for q in self.q_heads)
        for p in self.target_q_heads.parameters():
            p.requires_grad_(False)

    def forward(self, hs, states_ixs=None, actions_ixs=None):
        states_hs = hs if states_ixs is None else gather_positions(hs, states_ixs)
        actions_hs = hs if actions_ixs is None else gather_positions(hs, actions_ixs)
        qs = [q(actions_hs) for q in self.q_heads]
        target_qs = [q(actions_hs) for q in self.target_q_heads]
        return qs, target_qs, self.v_head(states_hs)


class CausalLmWithIlqlHeads(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.base = GPT2LMHeadModel(cfg)
        self.heads = IlqlHeads(cfg.n_embd, cfg.vocab_size)

    def forward(self, input_ids, attention_mask, position_ids=None, past_key_values=None,
                states_ixs=None, actions_ixs=None):
        out = self.base(input_ids=input_ids, attention_mask=attention_mask,
                        position_ids=position_ids, **{CACHE_ARG: past_key_values},
                        use_cache=past_key_values is not None or not self.training,
                        output_hidden_states=True)
        qs, target_qs, vs = self.heads(out.hidden_states[-1], states_ixs, actions_ixs)
        cache = out.get("cache", out.get("past_key_values"))
        return out.logits, qs, target_qs, vs, cache


def topk_mask(xs, k):
    if k <= 0 or k >= xs.shape[-1]:
        return xs
    kth = torch.topk(xs, k)[0][:, -1:]
    return xs.masked_fill(xs < kth, float("-inf"))


@torch.no_grad()
def ilql_generate(model, input_ids, attention_mask, beta=1.0, max_new_tokens=12, temperature=1.0,
                  top_k=20, eos_token_id=EOS):
    """trlX's loop: KV cache, scores = log_softmax(logits) + beta * (min target Q - V), top-k,
    argmax (T = 0) or a multinomial draw; finished rows emit EOS. Returns (samples, steps)."""
    position_ids = (attention_mask.cumsum(-1) - 1).masked_fill(attention_mask == 0, 0)
    samples = input_ids
    past = None
    finished = torch.zeros(input_ids.shape[0], 1, dtype=torch.long)
    steps = 0
    for _ in range(max_new_tokens):
        logits, _, target_qs, vs, past = model(input_ids, attention_mask, position_ids, past)
        qs = reduce(torch.minimum, [q[:, -1] for q in target_qs])
        adv = qs - vs[:, -1]
        scores = topk_mask(F.log_softmax(logits[:, -1], -1) + beta * adv, top_k)
        if temperature == 0.0:
            input_ids = scores.argmax(-1, keepdim=True)
        else:
            input_ids = torch.multinomial(F.softmax(scores / temperature, -1), 1)
        input_ids = (1 - finished) * input_ids + finished * eos_token_id
        finished = (input_ids == eos_token_id).long()
        samples = torch.cat((samples, input_ids), -1)
        attention_mask = torch.cat((attention_mask, (input_ids != eos_token_id).long()), -1)
        position_ids = position_ids[:, -1:] + 1
        steps += 1
        if torch.all(finished):
            break
    return samples, steps


def ilql_loss(logits, qs, target_qs, vs, input_ids, actions_ixs, dones, rewards,
              gamma=0.99, tau=0.7, cql_scale=0.1, awac_scale=1.0, beta=0.0):
    """trlX HEAD's `ILQLConfig.loss` (rlhf.md section 2.3)."""
    terminal_mask = dones[:, :-1]
    n = terminal_mask.sum().clamp(min=1)
    actions = input_ids[:, 1:].gather(1, actions_ixs).unsqueeze(-1)
    b, n_actions = actions.shape[:2]
    vocab = logits.shape[-1]
    q = [qi.gather(-1, actions).squeeze(-1) for qi in qs]
    target_q = reduce(torch.minimum, [t.gather(-1, actions).squeeze(-1) for t in target_qs]).detach()
    v = vs[:, :-1, 0]
    v_next = vs[:, 1:, 0] * dones[:, 1:]
    q_target = rewards + gamma * v_next.detach()
    loss_q = sum((((qi - q_target) * terminal_mask) ** 2).sum() / n for qi in q)
    diff2 = (target_q - v) ** 2
    expectile = torch.where(target_q >= v, tau * diff2, (1 - tau) * diff2)
    loss_v = (expectile * terminal_mask).sum() / n

    def ce(x):
        return F.cross_entropy(x.reshape(-1, vocab), actions.reshape(-1),
                               reduction="none").reshape(b, n_actions)

    loss_cql = sum((ce(qi) * terminal_mask).sum() / n for qi in qs)
    action_logits = logits.gather(1, actions_ixs.unsqueeze(-1).expand(-1, -1, vocab))
    awac_weight = torch.exp(beta * (target_q - v)).detach()
    loss_awac = (ce(action_logits) * awac_weight * terminal_mask).sum() / n
    return loss_q + loss_v + cql_scale * loss_cql + awac_scale * loss_awac


def main():
    args = parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    cfg = GPT2Config(**FLAGSHIP, bos_token_id=BOS, eos_token_id=EOS)
    model = CausalLmWithIlqlHeads(cfg)
    b, p, g = args.batch, args.prompt_len, args.new_tokens
    print(f"flagship {FLAGSHIP}, batch {b}, prompt {p}, new {g}, threads {args.threads}",
          file=sys.stderr)
    results = {}

    # W13: generation
    model.eval()
    prompts = torch.randint(0, 256, (b, p))
    mask = torch.ones_like(prompts)
    ran = []

    def generate_n():
        steps = [ilql_generate(model, prompts, mask, max_new_tokens=g)[1] for _ in range(args.inner)]
        ran.extend(steps)
        return b * sum(steps)

    generate_n()
    results["W13_ilql_generate_tokens_per_s"] = best_rate(generate_n, args.repeat)
    print(f"generation steps run: min {min(ran)}, max {max(ran)} of {g}", file=sys.stderr)

    # W14: one ILQL optimizer step on offline sequences bos + prompt + response
    model.train()
    length = 1 + p + g
    ids = torch.cat([torch.full((b, 1), BOS), torch.randint(0, 256, (b, length - 1))], 1)
    attn = torch.ones_like(ids)
    start = 1 + p  # the response starts here
    actions_ixs = torch.arange(start - 1, start + g - 1).repeat(b, 1)
    states_ixs = torch.cat([actions_ixs, torch.full((b, 1), length - 1)], 1)
    dones = torch.cat([torch.ones(b, g), torch.zeros(b, 1)], 1)
    rewards = torch.zeros(b, g)
    rewards[:, -1] = torch.randn(b)
    params = [q for q in model.parameters() if q.requires_grad]
    opt = torch.optim.AdamW(params, lr=5e-5, betas=(0.9, 0.95), eps=1e-8, weight_decay=1e-6)

    def step():
        logits, qs, target_qs, vs, _ = model(ids, attn, states_ixs=states_ixs,
                                             actions_ixs=actions_ixs)
        loss = ilql_loss(logits, qs, target_qs, vs, ids, actions_ixs, dones, rewards)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    def steps_n():
        for _ in range(args.inner):
            step()
        return args.inner

    steps_n()
    results["W14_ilql_step_per_s"] = best_rate(steps_n, args.repeat)

    if args.json:
        print(json.dumps(dict(impl="torch-transformers-ilql", threads=args.threads, **results)))
    else:
        for k, v in results.items():
            print(f"{k}\t{v:.1f}", flush=True)


if __name__ == "__main__":
    main()
