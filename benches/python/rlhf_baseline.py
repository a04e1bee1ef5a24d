"""The Python half of the side-by-side PPO-RLHF benchmark: seconds per PPO iteration (rollout +
update) of Hugging Face TRL 1.10's `trl.experimental.ppo.PPOTrainer`, on CPU, random-init GPT-2
models, nothing downloaded.

One iteration is one pass of the trainer's outer loop: sample `response_length` new tokens for a
batch of prompts with the policy, score them with the reference copy (KL), value model and reward
model, compute GAE, then `num_ppo_epochs` epochs of clipped-PPO minibatch updates of policy and
value. A `TrainerCallback` stamps `on_train_begin` and each `on_step_end` (TRL 1.10 fires it once
per iteration); the first iteration is warm-up, the rest give `iteration_s_best` / `_median`.
Each timed iteration includes TRL's own two `gc.collect()` calls (one trails the previous
`on_step_end`), a sizeable share of the tiny config's time; the warm-up iteration has only one.
Also reported: peak RSS of the process and the parameter bytes of policy + ref + value + reward.

TRL >= 1.11 no longer ships PPO, so TRL 1.10.0 is imported from a separate folder put first on
`sys.path`: `$TORCHRL_TRL_PPO_PATH`, default `~/.cache/torchrl-rs/trl110` (`pip install
--target`). Prints one JSON object on stdout's last line; everything else goes to stderr.
"""
import argparse
import contextlib
import json
import os
import resource
import statistics
import sys
import tempfile
import time
import warnings

CONFIGS = {
    # vocab 259 = 256 byte ids + eos 256 + pad 257 + bos 258
    "flagship": dict(model=dict(vocab_size=259, n_positions=64, n_embd=64, n_layer=2, n_head=4),
                     prompts=64, prompt_len=5, prompt_vocab=256, response=12, epochs=4,
                     mini_batches=2, eos=256, pad=257, bos=258),
    # GPT-2 small's shape; GPT-2's convention of one <|endoftext|> id for eos, pad and bos
    "small": dict(model=dict(vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12),
                  prompts=8, prompt_len=16, prompt_vocab=50256, response=16, epochs=4,
                  mini_batches=1, eos=50256, pad=50256, bos=50256),
}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", choices=sorted(CONFIGS), default="flagship")
    p.add_argument("--iterations", type=int, default=4, help="PPO iterations; the first is warm-up")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def import_trl_ppo():
    path = os.path.expanduser(os.environ.get("TORCHRL_TRL_PPO_PATH", "~/.cache/torchrl-rs/trl110"))
    sys.path.insert(0, path)
    try:
        import trl
        from trl.experimental.ppo import PPOConfig, PPOTrainer
    except Exception as e:  # noqa: BLE001 - any failure means "no PPO to compare against"
        print(json.dumps({"impl": "trl-1.10-ppo", "error": f"cannot import trl.experimental.ppo from "
                          f"{path} (set TORCHRL_TRL_PPO_PATH): {type(e).__name__}: {e}"}))
        sys.exit(2)
    return trl, PPOConfig, PPOTrainer


def iteration_timer(stamps):
    """A `TrainerCallback` that appends `time.perf_counter()` to `stamps` at `on_train_begin`
    and at each `on_step_end` (TRL 1.10's PPO: once per iteration, after the update)."""
    from transformers import TrainerCallback

    class IterationTimer(TrainerCallback):
        def on_train_begin(self, *_, **__):
            stamps.append(time.perf_counter())

        def on_step_end(self, *_, **__):
            stamps.append(time.perf_counter())

    return IterationTimer()


def build_tokenizer(cfg):
    """An offline WordLevel tokenizer: one token per id, with eos/pad/bos at the config's ids."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    names = {cfg["eos"]: "<eos>", cfg["pad"]: "<pad>", cfg["bos"]: "<bos>"}
    if len({cfg["eos"], cfg["pad"], cfg["bos"]}) == 1:
        names = {cfg["eos"]: "<|endoftext|>"}
    vocab = {names.get(i, f"t{i}"): i for i in range(cfg["model"]["vocab_size"])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="t0"))
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=names[cfg["eos"]],
                                   pad_token=names[cfg["pad"]], bos_token=names[cfg["bos"]],
                                   unk_token="t0")


def build_models(cfg, seed):
    import torch
    from transformers import GPT2Config, GPT2ForSequenceClassification, GPT2LMHeadModel

    ids = dict(eos_token_id=cfg["eos"], pad_token_id=cfg["pad"], bos_token_id=cfg["bos"])
    torch.manual_seed(seed)
    policy = GPT2LMHeadModel(GPT2Config(**cfg["model"], **ids))
    ref = GPT2LMHeadModel(policy.config)
    ref.load_state_dict(policy.state_dict())  # the reference is a full copy of the initial policy
    policy.generation_config.pad_token_id = cfg["pad"]
    torch.manual_seed(seed + 1)
    value = GPT2ForSequenceClassification(GPT2Config(**cfg["model"], **ids, num_labels=1))
    torch.manual_seed(seed + 2)
    reward = GPT2ForSequenceClassification(GPT2Config(**cfg["model"], **ids, num_labels=1))
    return policy, ref, value, reward


def main():
    args = parse_args()
    cfg = CONFIGS[args.config]
    warnings.filterwarnings("ignore")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    trl, PPOConfig, PPOTrainer = import_trl_ppo()

    import numpy as np
    import torch
    import transformers
    from datasets import Dataset
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    transformers.logging.set_verbosity_error()
    torch.set_num_threads(args.threads)
    np.random.seed(args.seed)  # TRL shuffles minibatches with np.random.permutation

    policy, ref, value, reward = build_models(cfg, args.seed)
    tokenizer = build_tokenizer(cfg)
    g = torch.Generator().manual_seed(args.seed)
    episodes = cfg["prompts"] * args.iterations
    prompts = torch.randint(0, cfg["prompt_vocab"], (episodes, cfg["prompt_len"]), generator=g)
    dataset = Dataset.from_dict({"input_ids": prompts.tolist()})

    stamps = []

    with tempfile.TemporaryDirectory() as out_dir, contextlib.redirect_stdout(sys.stderr):
        config = PPOConfig(
            output_dir=out_dir, report_to="none", save_strategy="no", logging_strategy="no",
            disable_tqdm=True, use_cpu=True, bf16=False, fp16=False, seed=args.seed,
            gradient_checkpointing=False,  # TRL's base config defaults it to True
            dataloader_num_workers=0, num_sample_generations=0,
            total_episodes=episodes,
            per_device_train_batch_size=cfg["prompts"],  # TRL 1.10: the rollout batch per device
            gradient_accumulation_steps=1, num_mini_batches=cfg["mini_batches"],
            num_ppo_epochs=cfg["epochs"], response_length=cfg["response"],
            local_rollout_forward_batch_size=cfg["prompts"],
            stop_token_id=cfg["eos"], temperature=1.0, missing_eos_penalty=None,
        )
        trainer = PPOTrainer(args=config, processing_class=tokenizer, model=policy, ref_model=ref,
                             reward_model=reward, value_model=value, train_dataset=dataset,
                             callbacks=[iteration_timer(stamps)])
        for cb in (PrinterCallback, ProgressCallback):
            trainer.remove_callback(cb)
        trainer.train()

    per_iter = [b - a for a, b in zip(stamps, stamps[1:])]
    timed = per_iter[1:] or per_iter  # drop the warm-up iteration when there is more than one
    param_bytes = sum(p.numel() * p.element_size()
                      for m in (policy, ref, value, reward) for p in m.parameters())
    print(json.dumps({
        "impl": "trl-1.10-ppo", "config": args.config, "iterations": args.iterations,
        "iteration_s_best": min(timed), "iteration_s_median": statistics.median(timed),
        "per_iteration_s": per_iter,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "model_param_mib": param_bytes / 2**20, "threads": args.threads,
        "torch": torch.__version__, "trl": trl.__version__,
    }), flush=True)


if __name__ == "__main__":
    main()
