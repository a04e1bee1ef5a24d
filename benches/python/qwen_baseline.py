"""The Python half of the Qwen2.5-0.5B-shape benchmarks W19-W21 (see benches/qwen.rs for the
workloads): `transformers`' Qwen2ForCausalLM at the Qwen2.5-0.5B config (24 blocks x 896, 14
heads over 2 key-value heads, MLP 4864, vocabulary 151936, tied embeddings, rope theta 1e6),
random init, nothing downloaded, on `--threads` threads (default 2, as the Rust half).

- `--workload generate` (W19): `generate(do_sample=True, top_k=0, top_p=1)` with its KV cache,
  8 prompts of 16 random ids, 32 new tokens (min = max, no EOS); tokens/s, best of 3 after a
  warm-up.
- `--workload forward` (W20): policy forward with hidden states + trlX's value head
  (Linear(896, 1792), ReLU, Linear(1792, 1)) + a separate reference copy's forward, no
  gradient, 8 x 48 tokens; forwards/s, best of 3 (2 each) after a warm-up.
- `--workload grpo` (W21): TRL 1.16's `GRPOTrainer`: 2 prompts of 8 letters x `num_generations`
  4 = 8 completions of at most 16 tokens, a reward function counting the even ids of each
  completion (the Rust side's rule), the reference copy's log-probs (beta 0.04), group
  advantages, one optimizer step per round (minibatch 8, `num_iterations` 1, DAPO loss, epsilon
  0.2 / 0.28, grad clip 1, AdamW 1e-6 constant, no gradient checkpointing), every parameter
  training; seconds per step (round) after `--warmup` rounds.
- `--workload ppo` (W28): TRL 1.10's `PPOTrainer` (the last TRL with PPO, imported from
  `$TORCHRL_TRL_PPO_PATH` as rlhf_baseline.py does): 8 prompts of 8 letters, 16 sampled new
  tokens, a value model and a reward model of the policy's shape
  (`Qwen2ForSequenceClassification`, one label, their own seeds; TRL's PPO trains the value
  model whole), KL coefficient 0.05, 4 PPO epochs of one minibatch of 8, AdamW 3e-6 constant;
  with `--lora R` the policy is a PEFT LoRA and the reference is the policy with its adapter
  off (TRL's PEFT path), with `--bf16` all three models are made in bfloat16. Seconds per
  iteration after `--warmup` iterations.

Tokenizer (GRPO only): the character-level WordLevel tokenizer of grpo_dpo_baseline.py (ids of
the Rust `ByteTokenizer`: EOS 256, pad 257), inside the model's vocabulary. Prints one JSON
object on stdout's last line (with `peak_rss_mib`); everything else goes to stderr.
"""
import argparse
import contextlib
import json
import os
import resource
import random
import statistics
import sys
import tempfile
import time
import warnings

CONFIG = dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
              num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
              rms_norm_eps=1e-6, rope_theta=1e6, tie_word_embeddings=True,
              initializer_range=0.02, use_sliding_window=False)
EOS, PAD = 256, 257


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", choices=["generate", "forward", "grpo", "ppo"], required=True)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=2, help="timed GRPO rounds")
    p.add_argument("--warmup", type=int, default=1, help="GRPO rounds dropped as warm-up")
    p.add_argument("--lora", type=int, default=0,
                   help="GRPO with a PEFT LoRA of this rank on all linear layers (0: off)")
    p.add_argument("--bf16", action="store_true", help="GRPO with the policy in bfloat16")
    p.add_argument("--unfrozen", type=int, default=-1,
                   help="GRPO: -1 trains every parameter (TRL's design); k > 0 freezes the "
                        "embeddings (tied head) and all but the top k blocks, as the Rust "
                        "hydra with k unfrozen blocks does (TRL keeps its full reference)")
    return p.parse_args()


def build_model(seed, cls=None, dtype=None, **extra):
    """A random-init model of the Qwen2.5-0.5B config (`Qwen2ForCausalLM` unless `cls`), made
    directly in `dtype` (no float32 copy first) when given."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(**CONFIG, eos_token_id=EOS, pad_token_id=PAD, **extra)
    cls = cls or Qwen2ForCausalLM
    model = (cls._from_config(config, dtype=dtype) if dtype else cls(config)).eval()
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.eos_token_id = None
        model.generation_config.pad_token_id = PAD
    return model


def best_of(f, repeat=3):
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return times


def generate_workload():
    import torch
    model = build_model(0)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 50000, (8, 16), generator=g)
    kw = dict(attention_mask=torch.ones_like(ids), do_sample=True, top_k=0, top_p=1.0,
              max_new_tokens=32, min_new_tokens=32, pad_token_id=PAD)
    with torch.no_grad():
        model.generate(ids, **kw)
        times = best_of(lambda: model.generate(ids, **kw))
    return {"name": "W19_generate_qwen05b", "ops_per_s": 8 * 32 / min(times),
            "times_s": times}


def forward_workload():
    import torch
    policy = build_model(0)
    ref = build_model(0)
    torch.manual_seed(1)
    v_head = torch.nn.Sequential(torch.nn.Linear(896, 1792), torch.nn.ReLU(),
                                 torch.nn.Linear(1792, 1))
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 50000, (8, 48), generator=g)
    mask = torch.ones_like(ids)

    def forward():
        out = policy(input_ids=ids, attention_mask=mask, output_hidden_states=True)
        values = v_head(out.hidden_states[-1]).squeeze(-1)
        ref_logits = ref(input_ids=ids, attention_mask=mask).logits
        return out.logits, values, ref_logits

    n = 2
    with torch.no_grad():
        forward()
        times = best_of(lambda: [forward() for _ in range(n)])
    return {"name": "W20_policy_value_ref_forward_qwen05b", "ops_per_s": n / min(times),
            "times_s": [t / n for t in times]}


def build_tokenizer():
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from grpo_dpo_baseline import build_tokenizer as byte_tokenizer
    return byte_tokenizer()


def grpo_workload(args):
    import torch
    from datasets import Dataset
    from transformers import Qwen2ForCausalLM, TrainerCallback
    from transformers.trainer_callback import PrinterCallback, ProgressCallback
    from trl import GRPOConfig, GRPOTrainer

    stamps = []

    class StepTimer(TrainerCallback):
        def on_train_begin(self, *_, **__):
            stamps.append(time.perf_counter())

        def on_step_end(self, *_, **__):
            stamps.append(time.perf_counter())

    def even_ids(completion_ids, **_):
        return [float(sum(1 for t in ids if t % 2 == 0)) for ids in completion_ids]

    rounds = args.warmup + args.rounds
    tokenizer = build_tokenizer()
    rng = random.Random(2)
    prompts = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(8))
               for _ in range(2 * rounds)]
    with tempfile.TemporaryDirectory() as out_dir, contextlib.redirect_stdout(sys.stderr):
        # TRL builds its reference copy from the policy's path
        model = build_model(0)
        model.generation_config.eos_token_id = EOS
        model.save_pretrained(out_dir)
        tokenizer.save_pretrained(out_dir)
        del model
        dtype = torch.bfloat16 if args.bf16 else torch.float32
        policy = Qwen2ForCausalLM.from_pretrained(out_dir, dtype=dtype)
        peft_config = lora_config(args.lora) if args.lora > 0 else None
        policy.generation_config.eos_token_id = EOS
        policy.generation_config.pad_token_id = PAD
        if args.unfrozen > 0:
            n = CONFIG["num_hidden_layers"]
            keep = {f"model.layers.{i}." for i in range(n - args.unfrozen, n)} | {"model.norm."}
            for name, p in policy.named_parameters():
                p.requires_grad_(any(name.startswith(k) for k in keep))
        config = GRPOConfig(
            output_dir=out_dir, report_to="none", save_strategy="no", logging_strategy="no",
            disable_tqdm=True, use_cpu=True, bf16=args.bf16, fp16=False, seed=0,
            gradient_checkpointing=False, dataloader_num_workers=0,
            gradient_accumulation_steps=1, max_steps=rounds, learning_rate=1e-6,
            lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0,
            disable_dropout=True, per_device_train_batch_size=8, generation_batch_size=8,
            num_generations=4, num_iterations=1, max_completion_length=16, temperature=1.0,
            top_p=1.0, top_k=0, beta=0.04, epsilon=0.2, epsilon_high=0.28, loss_type="dapo",
            scale_rewards="group", use_vllm=False, log_completions=False,
        )
        trainer = GRPOTrainer(model=policy, reward_funcs=even_ids, args=config,
                              peft_config=peft_config,
                              train_dataset=Dataset.from_dict({"prompt": prompts}),
                              processing_class=tokenizer, callbacks=[StepTimer()])
        for cb in (PrinterCallback, ProgressCallback):
            trainer.remove_callback(cb)
        trainer.train()
    per_step = [b - a for a, b in zip(stamps, stamps[1:])]
    timed = per_step[args.warmup:] or per_step
    if args.lora > 0:
        name = f"W22_grpo_step_qwen05b_lora{args.lora}"
    else:
        name = "W21_grpo_step_qwen05b" + (f"_hydra{args.unfrozen}" if args.unfrozen > 0 else "")
    if args.bf16:
        name += "_bf16"
    return {"name": name, "ops_per_s": 1 / min(timed), "unfrozen": args.unfrozen,
            "trainable_params": sum(p.numel() for p in trainer.model.parameters()
                                    if p.requires_grad),
            "times_s": timed, "step_s_median": statistics.median(timed)}


def lora_config(rank):
    from peft import LoraConfig
    return LoraConfig(r=rank, lora_alpha=2 * rank, target_modules="all-linear",
                      lora_dropout=0.0, task_type="CAUSAL_LM")


def ppo_workload(args):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from rlhf_baseline import import_trl_ppo, iteration_timer
    trl, PPOConfig, PPOTrainer = import_trl_ppo()
    import numpy as np
    import torch
    from datasets import Dataset
    from transformers import Qwen2ForSequenceClassification
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    np.random.seed(0)  # TRL shuffles minibatches with np.random.permutation
    stamps = []

    iterations = args.warmup + args.rounds
    rng = random.Random(2)
    prompts = [[ord(rng.choice("abcdefghijklmnopqrstuvwxyz")) for _ in range(8)]
               for _ in range(8 * iterations)]
    dtype = torch.bfloat16 if args.bf16 else None
    policy = build_model(0, dtype=dtype)
    policy.generation_config.pad_token_id = PAD
    value = build_model(1, Qwen2ForSequenceClassification, dtype, num_labels=1)
    reward = build_model(2, Qwen2ForSequenceClassification, dtype, num_labels=1)
    ref = None
    if args.lora == 0:
        ref = build_model(0, dtype=dtype)  # a full copy of the initial policy
    with tempfile.TemporaryDirectory() as out_dir, contextlib.redirect_stdout(sys.stderr):
        config = PPOConfig(
            output_dir=out_dir, report_to="none", save_strategy="no", logging_strategy="no",
            disable_tqdm=True, use_cpu=True, bf16=args.bf16, fp16=False, seed=0,
            gradient_checkpointing=False, dataloader_num_workers=0, num_sample_generations=0,
            total_episodes=8 * iterations, per_device_train_batch_size=8,
            gradient_accumulation_steps=1, num_mini_batches=1, num_ppo_epochs=4,
            response_length=16, local_rollout_forward_batch_size=8, stop_token_id=EOS,
            temperature=1.0, missing_eos_penalty=None, kl_coef=0.05, learning_rate=3e-6,
            lr_scheduler_type="constant", warmup_steps=0,
        )
        trainer = PPOTrainer(args=config, processing_class=build_tokenizer(), model=policy,
                             ref_model=ref, reward_model=reward, value_model=value,
                             train_dataset=Dataset.from_dict({"input_ids": prompts}),
                             peft_config=lora_config(args.lora) if args.lora > 0 else None,
                             callbacks=[iteration_timer(stamps)])
        for cb in (PrinterCallback, ProgressCallback):
            trainer.remove_callback(cb)
        trainer.train()
    per_iter = [b - a for a, b in zip(stamps, stamps[1:])]
    timed = per_iter[args.warmup:] or per_iter
    name = "W28_ppo_iteration_qwen05b" + (f"_lora{args.lora}" if args.lora > 0 else "")
    if args.bf16:
        name += "_bf16"
    return {"name": name, "ops_per_s": 1 / min(timed), "times_s": timed,
            "iteration_s_median": statistics.median(timed),
            "trainable_params": sum(p.numel() for p in trainer.model.parameters()
                                    if p.requires_grad),
            "trl": trl.__version__}


def main():
    args = parse_args()
    warnings.filterwarnings("ignore")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    import torch
    import transformers
    transformers.logging.set_verbosity_error()
    torch.set_num_threads(args.threads)
    if args.workload == "generate":
        result = generate_workload()
    elif args.workload == "forward":
        result = forward_workload()
    elif args.workload == "ppo":
        result = ppo_workload(args)
    else:
        result = grpo_workload(args)
    result.update({
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "threads": args.threads, "torch": torch.__version__,
        "transformers": transformers.__version__,
    })
    if args.workload == "grpo":
        import trl
        result["trl"] = trl.__version__
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
