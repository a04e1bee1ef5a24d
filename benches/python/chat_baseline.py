"""W23's Python half: read a JSONL file of conversations with `datasets` and tokenize every
conversation through `transformers`' `apply_chat_template` (the model folder's template and
tokenizer), as TRL's SFT preprocessing does. Prints `W23_chat_template_tokenize_100k\t<lines/s>`
and the peak RSS. Usage: chat_baseline.py FILE MODEL_DIR [--batched]."""

import resource
import sys
import time

from datasets import load_dataset
from transformers import AutoTokenizer


def main():
    path, model = sys.argv[1], sys.argv[2]
    batched = "--batched" in sys.argv
    tok = AutoTokenizer.from_pretrained(model)
    t0 = time.perf_counter()
    ds = load_dataset("json", data_files=path, split="train", keep_in_memory=True)
    # transformers 5 returns a BatchEncoding (input_ids + attention_mask) for tokenize=True
    if batched:
        out = ds.map(
            lambda b: {"input_ids": tok.apply_chat_template(b["messages"], tokenize=True)["input_ids"]},
            batched=True, batch_size=1000, remove_columns=ds.column_names,
            load_from_cache_file=False, keep_in_memory=True)
    else:
        out = ds.map(
            lambda e: {"input_ids": tok.apply_chat_template(e["messages"], tokenize=True)["input_ids"]},
            remove_columns=ds.column_names, load_from_cache_file=False, keep_in_memory=True)
    n = len(out)
    dt = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    kind = "batched" if batched else "per example"
    print(f"W23_chat_template_tokenize_100k\t{n / dt:.1f}\t# {kind}, {dt:.2f} s, peak RSS {rss:.0f} MiB")


if __name__ == "__main__":
    main()
