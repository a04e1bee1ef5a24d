"""The Python half of the side-by-side GRPO / DPO benchmark (W15 / W16): seconds per optimizer
step of Hugging Face TRL 1.16's real `trl.GRPOTrainer` and `trl.DPOTrainer`, on CPU, random-init
GPT-2 models of the RLHF flagship's shape, nothing downloaded.

- **W15 GRPO** (`--workload grpo`): the flagship's GRPO stage. Each generation round samples 64
  completions (8 prompts of 4 bytes x `num_generations` 8, at most 12 new tokens, temperature
  1, `transformers`' `generate` with its KV cache), scores them with a random-init
  `GPT2ForSequenceClassification` reward model of the same shape (TRL decodes the completions
  and re-tokenizes prompt + completion for it), computes the old policy's log-probs
  (`num_iterations` > 1) and the reference model's (`beta` 0.04: a full frozen copy), the group
  advantages, then trains `num_iterations` 2 passes over the 64 completions in minibatches of
  `per_device_train_batch_size` 32: 4 optimizer steps per generation round (TRL:
  `steps_per_generation` = 64 / 32 = 2, times `num_iterations`), DAPO's loss with
  clip-higher (epsilon 0.2 / 0.28), the k3 KL term, grad-norm clip 1, AdamW at 1e-3 constant.
  A round's steps are timed together and divided by 4, so each reported s/step carries a
  quarter of the generation and scoring (the first of the 4 steps runs them).
- **W16 DPO** (`--workload dpo`): one DPO step on 32 preference pairs (prompt 4 bytes,
  completions 4-10 bytes + EOS, `max_length` 32): TRL's concatenated chosen + rejected forward
  of the policy with gradient, the reference model's forward (full frozen copy,
  `precompute_ref_log_probs` False), the sigmoid loss at beta 0.1, backward, clip, AdamW.

Timing: a `TrainerCallback` stamps `on_train_begin` and every `on_step_end` (one per optimizer
step, gradient accumulation 1); the first `--warmup` rounds (GRPO) or steps (DPO) are dropped,
the rest give `step_s_best` / `step_s_median`. `--unfrozen 1` freezes the embeddings (tied LM
head) and the lower block, so TRL trains the same parameters as the Rust side's hydra with one
unfrozen block (TRL still runs a full reference copy); the default trains everything, TRL's
design.

Tokenizer: an offline character-level `tokenizers` WordLevel model whose ids are the Rust
`ByteTokenizer`'s (byte b -> id b through GPT-2's bytes-to-unicode map, `<eos>` 256, `<pad>` 257,
`<bos>` 258), so text round-trips to the same ids exactly. Prints one JSON object on stdout's
last line; everything else goes to stderr.
"""
import argparse
import contextlib
import json
import os
import random
import resource
import statistics
import sys
import tempfile
import time
import warnings

MODEL = dict(vocab_size=259, n_positions=32, n_embd=64, n_layer=2, n_head=4,
             resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
EOS, PAD, BOS = 256, 257, 258
PROMPT_LEN = 4
NEW_TOKENS = 12
ALPHABET = "abcdefghijklmnopqrstuvwxyz"

# GRPO: 8 prompts x 8 completions per round, minibatch 32, 2 passes -> 4 steps per round
GENERATION_BATCH = 64
NUM_GENERATIONS = 8
MINIBATCH = 32
NUM_ITERATIONS = 2
STEPS_PER_ROUND = NUM_ITERATIONS * GENERATION_BATCH // MINIBATCH
# DPO
DPO_BATCH = 32


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", choices=["grpo", "dpo"], default="grpo")
    p.add_argument("--rounds", type=int, default=None,
                   help="timed GRPO rounds (4 steps each) or DPO steps; default 5 / 20")
    p.add_argument("--warmup", type=int, default=None,
                   help="GRPO rounds or DPO steps dropped as warm-up; default 1 / 3")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    p.add_argument("--unfrozen", type=int, default=-1,
                   help="-1: train every parameter (TRL's design); 1: freeze the embeddings and "
                        "the lower block as the Rust hydra does")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--bf16", action="store_true",
                   help="policy, reference and reward model in bfloat16, TRL's bf16=True "
                        "(the Rust side's TORCHRL_BENCH_BF16=1)")
    return p.parse_args()


def bytes_to_unicode():
    """GPT-2's printable stand-in for each byte."""
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
          + list(range(ord("®"), ord("ÿ") + 1)))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def build_tokenizer():
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    b2u = bytes_to_unicode()
    vocab = {b2u[i]: i for i in range(256)}
    vocab.update({"<eos>": EOS, "<pad>": PAD, "<bos>": BOS})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>",
                                   bos_token="<bos>")


def build_policy(seed, tokenizer, out_dir, unfrozen, bf16=False):
    """A random-init policy saved to `out_dir` and loaded back, so TRL can build its reference
    from that path (TRL creates the reference model from the policy's `_name_or_path`)."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(**MODEL, eos_token_id=EOS, pad_token_id=PAD, bos_token_id=BOS)
    GPT2LMHeadModel(config).save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    # TRL builds the reference from the path in the policy's dtype
    policy = GPT2LMHeadModel.from_pretrained(
        out_dir, dtype=torch.bfloat16 if bf16 else torch.float32)
    policy.generation_config.pad_token_id = PAD
    policy.generation_config.eos_token_id = EOS
    if unfrozen > 0:
        keep = {f"transformer.h.{i}." for i in range(MODEL["n_layer"] - unfrozen, MODEL["n_layer"])}
        keep.add("transformer.ln_f.")
        for name, p in policy.named_parameters():
            p.requires_grad_(any(name.startswith(k) for k in keep))
    return policy


def common_args(out_dir, seed, max_steps, bf16=False):
    return dict(
        output_dir=out_dir, report_to="none", save_strategy="no", logging_strategy="no",
        disable_tqdm=True, use_cpu=True, bf16=bf16, fp16=False, seed=seed,
        gradient_checkpointing=False,  # TRL's base config defaults it to True
        dataloader_num_workers=0, gradient_accumulation_steps=1, max_steps=max_steps,
        learning_rate=1e-3, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
        max_grad_norm=1.0, disable_dropout=True,
    )


def run_grpo(args, tokenizer, out_dir, stamps_cb):
    import torch
    from datasets import Dataset
    from transformers import GPT2Config, GPT2ForSequenceClassification
    from trl import GRPOConfig, GRPOTrainer

    rounds = args.warmup + args.rounds
    policy = build_policy(args.seed, tokenizer, out_dir, args.unfrozen, args.bf16)
    torch.manual_seed(args.seed + 2)
    reward = GPT2ForSequenceClassification(
        GPT2Config(**MODEL, eos_token_id=EOS, pad_token_id=PAD, bos_token_id=BOS, num_labels=1))
    reward.eval()
    if args.bf16:
        reward.to(torch.bfloat16)
    rng = random.Random(args.seed)
    n_prompts = rounds * GENERATION_BATCH // NUM_GENERATIONS
    prompts = ["".join(rng.choice(ALPHABET) for _ in range(PROMPT_LEN)) for _ in range(n_prompts)]
    config = GRPOConfig(
        **common_args(out_dir, args.seed, rounds * STEPS_PER_ROUND, args.bf16),
        per_device_train_batch_size=MINIBATCH, generation_batch_size=GENERATION_BATCH,
        num_generations=NUM_GENERATIONS, num_iterations=NUM_ITERATIONS,
        max_completion_length=NEW_TOKENS, temperature=1.0, top_p=1.0, top_k=0,
        beta=0.04, epsilon=0.2, epsilon_high=0.28, loss_type="dapo", scale_rewards="group",
        use_vllm=False, log_completions=False, shuffle_dataset=True,
    )
    trainer = GRPOTrainer(model=policy, reward_funcs=reward, args=config,
                          train_dataset=Dataset.from_dict({"prompt": prompts}),
                          processing_class=tokenizer, reward_processing_classes=tokenizer,
                          callbacks=[stamps_cb])
    return trainer, policy, [trainer.ref_model, reward]


def run_dpo(args, tokenizer, out_dir, stamps_cb):
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    steps = args.warmup + args.rounds
    policy = build_policy(args.seed, tokenizer, out_dir, args.unfrozen, args.bf16)
    rng = random.Random(args.seed)

    def text(lo, hi):
        return "".join(rng.choice(ALPHABET) for _ in range(rng.randint(lo, hi)))

    n = steps * DPO_BATCH
    # completions of 4-10 bytes; TRL appends the EOS (5-11 tokens, as the Rust pairs)
    data = {"prompt": [text(PROMPT_LEN, PROMPT_LEN) for _ in range(n)],
            "chosen": [text(4, 10) for _ in range(n)],
            "rejected": [text(4, 10) for _ in range(n)]}
    config = DPOConfig(
        **common_args(out_dir, args.seed, steps, args.bf16),
        per_device_train_batch_size=DPO_BATCH, max_length=32, beta=0.1, loss_type=["sigmoid"],
        precompute_ref_log_probs=False,
    )
    trainer = DPOTrainer(model=policy, args=config, train_dataset=Dataset.from_dict(data),
                         processing_class=tokenizer, callbacks=[stamps_cb])
    return trainer, policy, [trainer.ref_model]


def main():
    args = parse_args()
    if args.rounds is None:
        args.rounds = 5 if args.workload == "grpo" else 20
    if args.warmup is None:
        args.warmup = 1 if args.workload == "grpo" else 3
    warnings.filterwarnings("ignore")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")

    import torch
    import transformers
    import trl
    from transformers import TrainerCallback
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    transformers.logging.set_verbosity_error()
    torch.set_num_threads(args.threads)

    stamps = []

    class StepTimer(TrainerCallback):
        def on_train_begin(self, *_, **__):
            stamps.append(time.perf_counter())

        def on_step_end(self, *_, **__):  # once per optimizer step (no gradient accumulation)
            stamps.append(time.perf_counter())

    tokenizer = build_tokenizer()
    with tempfile.TemporaryDirectory() as out_dir, contextlib.redirect_stdout(sys.stderr):
        build = run_grpo if args.workload == "grpo" else run_dpo
        trainer, policy, others = build(args, tokenizer, out_dir, StepTimer())
        for cb in (PrinterCallback, ProgressCallback):
            trainer.remove_callback(cb)
        trainer.train()

    per_step = [b - a for a, b in zip(stamps, stamps[1:])]
    group = STEPS_PER_ROUND if args.workload == "grpo" else 1
    windows = [sum(per_step[i:i + group]) / group for i in range(0, len(per_step), group)]
    timed = windows[args.warmup:] or windows
    result = {
        "impl": f"trl-{trl.__version__}-{args.workload}", "workload": args.workload,
        "unfrozen": args.unfrozen, "warmup": args.warmup, "bf16": args.bf16,
        "step_s_best": min(timed), "step_s_median": statistics.median(timed),
        "timed_step_s": timed, "per_step_s": per_step,
        "trainable_params": sum(p.numel() for p in policy.parameters() if p.requires_grad),
        "model_param_mib": sum(p.numel() * p.element_size()
                               for m in [policy, *others] if m is not None
                               for p in m.parameters()) / 2**20,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "threads": args.threads, "torch": torch.__version__, "trl": trl.__version__,
        "transformers": transformers.__version__,
    }
    if args.workload == "grpo":
        # the first step of each round generates, scores and runs the old-policy and reference
        # passes; the other three only train
        rounds = [per_step[i:i + group] for i in range(0, len(per_step), group)][args.warmup:]
        result["generate_step_s_median"] = statistics.median(r[0] for r in rounds)
        result["update_step_s_median"] = statistics.median(s for r in rounds for s in r[1:])
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
