#!/usr/bin/env python
"""Record chat-template fidelity cases from transformers' ``apply_chat_template``.

Run from the repository root:

    /root/.cache/torchrl-rs/venv/bin/python specs/record_chat_template.py

Each case is a small byte-level BPE tokenizer (``specs/tokenizer/tokenizer.json`` plus the
special tokens its template needs, added as special tokens) with a chat template written for
these tests in the style of a real model family (none is copied from a model repository):

- ``chatml_qwen``: ChatML as Qwen2.5 writes it (a default system message when the first
  message is not a system one, ``<|im_start|>`` / ``<|im_end|>``, string ``+``);
- ``llama3``: ``bos_token``, header ids, ``|trim``, ``<|eot_id|>``;
- ``mistral``: ``[INST]`` turns, ``raise_exception`` on roles that do not alternate,
  ``loop.index0``, ``namespace`` and ``.strip()``;
- ``chatml_generation``: ChatML with ``{% generation %}`` around the assistant replies, so that
  transformers returns an assistant mask (``return_assistant_tokens_mask=True``);
- ``json_tags``: ``tojson`` (plain and with ``indent``), ``.startswith`` and ``.items()``.

Each case's folder ``specs/chat/<case>/`` is what ``save_pretrained`` writes (tokenizer.json,
tokenizer_config.json, chat_template.jinja), and ``specs/chat_template_cases.json`` holds, per
case and conversation, the rendered text and ids with and without ``add_generation_prompt``
(``tokenize=False`` / ``tokenize=True``) and, for ``chatml_generation``, the assistant mask.
One error case records the exception the Mistral template raises on two user turns in a row.
The output is deterministic (no randomness is involved; the file is written with sorted keys).
Replayed by ``tests/chat_template.rs``.
"""

import json
import os
import shutil

import jinja2
import tokenizers
import transformers
from transformers import PreTrainedTokenizerFast

ROOT = os.path.dirname(os.path.abspath(__file__))
OUT_DIR = os.path.join(ROOT, "chat")

CHATML_QWEN = """{%- if messages[0]['role'] == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
{%- else %}
    {{- '<|im_start|>system\\nYou are a careful assistant.<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if not (loop.first and message['role'] == 'system') %}
        {{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

LLAMA3 = """{{- bos_token }}
{%- for message in messages %}
    {%- set body = message['content'] | trim %}
    {{- '<|start_header_id|>' ~ message['role'] ~ '<|end_header_id|>\\n\\n' ~ body ~ '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""

MISTRAL = """{%- if messages[0]['role'] == 'system' %}
    {%- set system_text = messages[0]['content'].strip() %}
    {%- set turns = messages[1:] %}
{%- else %}
    {%- set turns = messages %}
{%- endif %}
{%- set ns = namespace(users=0) %}
{{- bos_token }}
{%- for message in turns %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('Turns must alternate user/assistant/user/..., got ' ~ message['role'] ~ ' at turn ' ~ loop.index0) }}
    {%- endif %}
    {%- if message['role'] == 'user' %}
        {%- set ns.users = ns.users + 1 %}
        {%- if ns.users == 1 and system_text is defined %}
            {{- '[INST] ' + system_text + '\\n\\n' + message['content'].strip() + ' [/INST]' }}
        {%- else %}
            {{- '[INST] ' + message['content'].strip() + ' [/INST]' }}
        {%- endif %}
    {%- elif message['role'] == 'assistant' %}
        {{- ' ' + message['content'].strip() + eos_token }}
    {%- else %}
        {{- raise_exception('Unknown role: ' ~ message['role']) }}
    {%- endif %}
{%- endfor %}
"""

CHATML_GENERATION = """{% for message in messages %}
{% if message['role'] == 'assistant' %}
{{ '<|im_start|>assistant\\n' }}
{%- generation %}
{{- message['content'] + '<|im_end|>' }}
{%- endgeneration %}
{{ '\\n' }}
{%- else %}
{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}
{%- endif %}
{% endfor %}
{% if add_generation_prompt %}
{{ '<|im_start|>assistant\\n' }}
{%- endif %}
"""

JSON_TAGS = """{%- for message in messages %}
    {%- if message.role.startswith('sys') %}
        {{- '<|system|>' ~ (message.content | tojson) ~ '\\n' }}
    {%- else %}
        {{- '<|' ~ message.role ~ '|>' }}
        {%- for key, value in message.items() %}
            {%- if key != 'role' %}{{ key }}={{ value | tojson }};{% endif %}
        {%- endfor %}
        {{- {'turn': loop.index, 'text': message.content, 'tags': ['a', 1, none, true]} | tojson(indent=2) }}
        {{- eos_token ~ '\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|assistant|>' }}
{%- endif %}
"""

CASES = {
    "chatml_qwen": dict(template=CHATML_QWEN, special=dict(eos_token="<|im_end|>", pad_token="<|endoftext|>"),
                        extra=["<|im_start|>"]),
    "llama3": dict(template=LLAMA3, special=dict(bos_token="<|begin_of_text|>", eos_token="<|eot_id|>"),
                   extra=["<|start_header_id|>", "<|end_header_id|>"]),
    "mistral": dict(template=MISTRAL, special=dict(bos_token="<s>", eos_token="</s>", unk_token="<unk>"),
                    extra=[]),
    "chatml_generation": dict(template=CHATML_GENERATION, special=dict(eos_token="<|im_end|>"),
                              extra=["<|im_start|>"]),
    "json_tags": dict(template=JSON_TAGS, special=dict(eos_token="<|end|>"), extra=["<|system|>", "<|user|>"]),
}

CONVERSATIONS = {
    "single_turn": [
        {"role": "user", "content": "Hello there!"},
        {"role": "assistant", "content": "Hi! How can I help?"},
    ],
    "multi_turn": [
        {"role": "user", "content": "What is 2 + 2?"},
        {"role": "assistant", "content": "4."},
        {"role": "user", "content": "And times 3?"},
        {"role": "assistant", "content": "  12, of course.  "},
    ],
    "with_system": [
        {"role": "system", "content": "You answer in one word."},
        {"role": "user", "content": "Capital of France?"},
        {"role": "assistant", "content": "Paris"},
    ],
    "unicode_newlines": [
        {"role": "user", "content": "Caf\u00e9 \u2014 na\u00efve?\nSecond line \u2615\n\n\ttabbed \"quoted\""},
        {"role": "assistant", "content": "\u65e5\u672c\u8a9e\u3067\u3059\u3002\n\n- point \U0001F642\n- <tag> & \\ done"},
    ],
    "prompt_only": [
        {"role": "user", "content": "Tell me a joke."},
    ],
}

ERROR_CASES = {
    "mistral_two_users": dict(case="mistral", messages=[
        {"role": "user", "content": "First."},
        {"role": "user", "content": "Second."},
    ]),
}


def make_tokenizer(spec):
    base = tokenizers.Tokenizer.from_file(os.path.join(ROOT, "tokenizer", "tokenizer.json"))
    tok = PreTrainedTokenizerFast(tokenizer_object=base, **spec["special"])
    extra = [t for t in spec["extra"] if t not in tok.get_vocab()]
    if extra:
        tok.add_special_tokens({"additional_special_tokens": extra})
    tok.chat_template = spec["template"]
    return tok


def record_case(name, spec):
    tok = make_tokenizer(spec)
    folder = os.path.join(OUT_DIR, name)
    if os.path.exists(folder):
        shutil.rmtree(folder)
    tok.save_pretrained(folder)
    # only what a model folder needs for the chat template and the tokenizer
    for f in os.listdir(folder):
        if f not in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
            os.remove(os.path.join(folder, f))
    # what we replay is what a reader of the folder gets
    tok = PreTrainedTokenizerFast.from_pretrained(folder)
    convs = {}
    for cname, messages in CONVERSATIONS.items():
        rec = {"messages": messages}
        for gen in (False, True):
            key = "gen" if gen else "plain"
            text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)
            out = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=gen, return_dict=True)
            ids = list(out["input_ids"])
            assert ids == tok(text, add_special_tokens=False)["input_ids"], (name, cname)
            rec[key] = {"text": text, "ids": ids}
        if "{% generation %}" in spec["template"] or "{%- generation %}" in spec["template"]:
            out = tok.apply_chat_template(messages, tokenize=True, return_dict=True,
                                          return_assistant_tokens_mask=True)
            assert list(out["input_ids"]) == rec["plain"]["ids"]
            rec["assistant_masks"] = [int(x) for x in out["assistant_masks"]]
        convs[cname] = rec
    special = {k: getattr(tok, k) for k in ("bos_token", "eos_token", "unk_token", "pad_token")}
    return {"folder": f"chat/{name}", "special_tokens": special, "conversations": convs}


def record_error(name, spec):
    tok = PreTrainedTokenizerFast.from_pretrained(os.path.join(OUT_DIR, spec["case"]))
    try:
        tok.apply_chat_template(spec["messages"], tokenize=False)
    except jinja2.exceptions.TemplateError as e:
        return {"case": spec["case"], "messages": spec["messages"], "error_type": type(e).__name__,
                "message": str(e)}
    raise AssertionError(f"{name}: expected an error")


def main():
    os.makedirs(OUT_DIR, exist_ok=True)
    cases = {name: record_case(name, spec) for name, spec in CASES.items()}
    errors = {name: record_error(name, spec) for name, spec in ERROR_CASES.items()}
    out = {
        "generator": "specs/record_chat_template.py",
        "versions": {"transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
                     "jinja2": jinja2.__version__},
        "cases": cases,
        "errors": errors,
    }
    with open(os.path.join(ROOT, "chat_template_cases.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, indent=1, sort_keys=True, ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    main()
