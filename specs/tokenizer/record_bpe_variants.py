"""Trains the small byte-level BPE tokenizer of specs/tokenizer/qwen2_style/ with the
`tokenizers` library: Qwen2's pipeline (NFC normalizer, a Split pre-tokenizer on Qwen2's
pattern, then ByteLevel without its regex), 1,200 tokens learned from a seeded multilingual
corpus, and ChatML's added tokens. tests/tokenizer_fast.rs checks the lean byte-level encoder
(src/modules/llm/bpe.rs) against the tokenizers crate on it and on variants of it (GPT-2's
ByteLevel regex, ignore_merges, a prefix space, no normalizer, normalized added tokens).

Run: ~/.cache/torchrl-rs/venv/bin/python specs/tokenizer/record_bpe_variants.py
"""
import os
import random

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

WORDS = (
    "the model learns a policy from rewards and its value function estimates returns over many "
    "steps while critic is trained on rollouts I'm we've they're don't can't it's you'll he'd "
    "naïve café déjà vu über straße façade résumé 東京 大阪 学习 强化 Москва привет مرحبا "
    "λ π ∑ ≤ ≥ → 😀 🚀 x=1 y+2 f(x) [a,b] {k:v} 3.14 2024 1e-5 <tag> </tag> http://a.b/c "
    "def fn() return None; let mut x = 0; if a == b { } // comment # heading * item - dash"
).split()


def corpus(n, seed):
    rng = random.Random(seed)
    seps = [" ", " ", " ", "  ", "\n", "\n\n", "\t", " \n", "\r\n", ", ", ". "]
    for _ in range(n):
        k = rng.randint(4, 40)
        yield "".join(rng.choice(WORDS) + rng.choice(seps) for _ in range(k))


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    out = os.path.join(here, "qwen2_style")
    os.makedirs(out, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1200,
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        show_progress=False,
    )
    tok.train_from_iterator(corpus(3000, 0), trainer=trainer)
    tok.save(os.path.join(out, "tokenizer.json"))
    print("wrote", os.path.join(out, "tokenizer.json"), tok.get_vocab_size(), "tokens")


if __name__ == "__main__":
    main()
