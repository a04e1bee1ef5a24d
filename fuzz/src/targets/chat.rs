//! Chat templates (`torchrl::data::llm::ChatTemplate`): the recorded templates
//! (`specs/chat/*/chat_template.jinja`) and a few hand-written ones, mutated (byte edits and
//! splices of Jinja fragments: tags, loops, recursion, huge ranges, `tojson` arguments,
//! generation tags, the generation markers themselves) and rendered on mutated conversations
//! (odd roles, control and private-use characters, empty and long contents), from a string or
//! from a model folder with a mutated `tokenizer_config.json`. Every call must give `Ok` or a
//! named `Err`; an `Ok` mask must be as long as its ids, and the text it masks must be the
//! template's plain render.

use torchrl::data::llm::{ChatTemplate, Message};
use torchrl::modules::llm::{ByteTokenizer, TextTokenizer};

use super::{Outcome, State, named_err, plain_err, specs_dir};
use crate::mutate::{Rng, mutate_bytes, mutate_json_text};

const EXTRA_SEEDS: &[&str] = &[
    "{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}{{ m.content }}{% endgeneration %}{% else %}{{ m.content }}{% endif %}{% endfor %}",
    "{{ messages | tojson(indent=2) }}{% if add_generation_prompt %}<a>{% endif %}",
    "{% for m in messages %}{% if m.role not in ['user', 'assistant'] %}{{ raise_exception('bad role ' ~ m.role) }}{% endif %}{{ m.content.strip() }}{% endfor %}",
    "{{ bos_token }}{{ strftime_now('%d %b %Y') }}{% for m in messages %}{{ m.items() | list | tojson }}{% endfor %}",
];

const FRAGMENTS: &[&str] = &[
    "{% for m in messages %}",
    "{% endfor %}",
    "{% if add_generation_prompt %}",
    "{% endif %}",
    "{% else %}",
    "{{ ",
    " }}",
    "{%- ",
    " -%}",
    "{% generation %}",
    "{% endgeneration %}",
    "{%- generation -%}",
    "{% break %}",
    "{% continue %}",
    "{{ m.content }}",
    "{{ messages[0]['content'].strip() }}",
    "{{ messages[-1].role.startswith('a') }}",
    "{{ m | tojson(indent=-3, sort_keys=true) }}",
    "{{ messages | tojson(separators=(',', ':'), ensure_ascii=true) }}",
    "{{ none | tojson }}",
    "{{ raise_exception('stop') }}",
    "{{ strftime_now('%Y %Q %') }}",
    "{% set ns = namespace(n=0) %}{% set ns.n = ns.n + 1 %}",
    "{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}",
    "{% for i in range(1000000000) %}{% endfor %}",
    "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    "{{ 'x' * 99999999 }}",
    "{{ undefined_thing.attr }}",
    "{{ m.nope() }}",
    "{% filter trim %}",
    "{% endfilter %}",
    "{% set x %}",
    "{% endset %}",
    "\u{10FFFC}",
    "\u{10FFFD}",
    "{# ",
    " #}",
    "{% raw %}",
];

const ROLES: &[&str] = &[
    "user",
    "assistant",
    "system",
    "tool",
    "",
    "ASSISTANT",
    "\u{10FFFC}",
];

const CONTENTS: &[&str] = &[
    "Hello!",
    "",
    "  spaced  ",
    "Café — naïve?\nline ☕\n\n\t\"q\"",
    "日本語\u{0}\u{7f}",
    "{{ not a template }}",
    "<|im_end|><|endoftext|>",
    "x\u{10FFFD}y",
];

fn seeds() -> Vec<String> {
    let mut out: Vec<String> = EXTRA_SEEDS.iter().map(|s| s.to_string()).collect();
    if let Ok(dirs) = std::fs::read_dir(specs_dir().join("chat")) {
        let mut paths: Vec<_> = dirs.filter_map(|d| d.ok().map(|d| d.path())).collect();
        paths.sort();
        for p in paths {
            if let Ok(s) = std::fs::read_to_string(p.join("chat_template.jinja")) {
                out.push(s);
            }
        }
    }
    out
}

fn mutate_template(rng: &mut Rng, seed: &str) -> String {
    let mut text = seed.to_string();
    for _ in 0..1 + rng.below(4) {
        if rng.chance(0.3) {
            text = String::from_utf8_lossy(&mutate_bytes(rng, text.as_bytes())).into_owned();
        } else {
            // splice a fragment at a char boundary
            let cuts: Vec<usize> = text
                .char_indices()
                .map(|(i, _)| i)
                .chain([text.len()])
                .collect();
            let at = *rng.pick(&cuts);
            text.insert_str(at, *rng.pick(FRAGMENTS));
        }
    }
    text
}

fn conversation(rng: &mut Rng) -> Vec<Message> {
    let n = rng.below(6);
    (0..n)
        .map(|i| {
            let role = if rng.chance(0.8) {
                if i % 2 == 0 { "user" } else { "assistant" }
            } else {
                *rng.pick(ROLES)
            };
            let content = if rng.chance(0.05) {
                "long ".repeat(20_000)
            } else {
                rng.pick(CONTENTS).to_string()
            };
            Message::new(role, content)
        })
        .collect()
}

pub fn chat_template_case(st: &mut State, rng: &mut Rng) -> Outcome {
    let seeds = seeds();
    let seed = rng.pick(&seeds).clone();
    let source = if rng.chance(0.9) {
        mutate_template(rng, &seed)
    } else {
        seed
    };
    let chat = if rng.chance(0.3) {
        // from a model folder, with a (mutated) tokenizer_config.json
        let dir = st.case_dir();
        let config = serde_json::json!({
            "bos_token": "<s>",
            "eos_token": {"content": "</s>", "special": true},
            "chat_template": source,
        });
        let text = serde_json::to_vec(&config).expect("json");
        let text = if rng.chance(0.5) {
            mutate_json_text(rng, &text)
        } else {
            text
        };
        std::fs::write(dir.join("tokenizer_config.json"), &text).expect("case file");
        if rng.chance(0.3) {
            std::fs::write(dir.join("chat_template.jinja"), source.as_bytes()).expect("case file");
        }
        match ChatTemplate::from_model_dir(&dir) {
            Ok(c) => c,
            Err(e) => {
                return named_err(
                    e.to_string(),
                    &dir,
                    &["chat_template.jinja", "tokenizer_config.json", "template"],
                );
            }
        }
    } else {
        match ChatTemplate::new(&source, Some("<s>"), Some("<|endoftext|>")) {
            Ok(c) => c,
            Err(e) => return named_err(e.to_string(), std::path::Path::new("template"), &[]),
        }
    };
    let tok = ByteTokenizer::new();
    let msgs = conversation(rng);
    for prompt in [false, true] {
        match chat.encode(&tok, &msgs, prompt) {
            Ok(ids) => {
                if let Some(bad) = ids.iter().find(|&&i| !(0..tok.vocab_size()).contains(&i)) {
                    return Outcome::Defect("unusable", format!("encode gave id {bad}"));
                }
            }
            Err(e) => {
                if let o @ Outcome::Defect(..) = plain_err(e.to_string()) {
                    return o;
                }
            }
        }
    }
    match chat.encode_with_assistant_mask(&tok, &msgs) {
        Ok((ids, mask)) => {
            if ids.len() != mask.len() {
                return Outcome::Defect(
                    "unusable",
                    format!("{} ids but a mask of {}", ids.len(), mask.len()),
                );
            }
            match chat.render(&msgs, false) {
                Ok(text) => {
                    if tok.encode(&text).ok().as_ref() != Some(&ids) {
                        return Outcome::Defect(
                            "unusable",
                            "the masked ids are not the ids of the plain render".into(),
                        );
                    }
                }
                Err(e) => {
                    return Outcome::Defect(
                        "unusable",
                        format!("masked, but the plain render fails: {e}"),
                    );
                }
            }
        }
        Err(e) => return plain_err(e.to_string()),
    }
    Outcome::Ok
}
