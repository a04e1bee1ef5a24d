//! Chat templates (`torchrl::data::llm::ChatTemplate`) against `transformers`'
//! `apply_chat_template`: the cases recorded by `specs/record_chat_template.py` into
//! `specs/chat/<case>/` and `specs/chat_template_cases.json` (text and ids with and without
//! the generation prompt, assistant masks for the template with `{% generation %}` tags, the
//! exception a template raises), then the errors and hostile templates.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value as Json;
use torchrl::data::llm::{ChatTemplate, Message};
use torchrl::modules::llm::{ByteTokenizer, HfTokenizer, TextTokenizer};
use torchrl::Error;

fn specs() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("specs")
}

fn cases() -> Json {
    let text = std::fs::read_to_string(specs().join("chat_template_cases.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn messages(v: &Json) -> Vec<Message> {
    serde_json::from_value(v.clone()).unwrap()
}

fn ids(v: &Json) -> Vec<i64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_i64().unwrap())
        .collect()
}

fn load(case: &Json) -> (ChatTemplate, HfTokenizer) {
    let dir = specs().join(case["folder"].as_str().unwrap());
    let chat = ChatTemplate::from_model_dir(&dir).unwrap();
    let tok = HfTokenizer::from_file(dir.join("tokenizer.json")).unwrap();
    (chat, tok)
}

#[test]
fn every_case_renders_and_encodes_as_transformers() {
    let all = cases();
    let mut checked = 0;
    for (name, case) in all["cases"].as_object().unwrap() {
        let (chat, tok) = load(case);
        // the special tokens read from tokenizer_config.json are the tokenizer's
        for key in ["bos_token", "eos_token", "unk_token", "pad_token"] {
            assert_eq!(
                chat.special_token(key),
                case["special_tokens"][key].as_str(),
                "{name}: {key}"
            );
        }
        for (conv, rec) in case["conversations"].as_object().unwrap() {
            let msgs = messages(&rec["messages"]);
            for (key, gen) in [("plain", false), ("gen", true)] {
                let want_text = rec[key]["text"].as_str().unwrap();
                let text = chat.render(&msgs, gen).unwrap();
                assert_eq!(text, want_text, "{name}/{conv}/{key}: text");
                let got = chat.encode(&tok, &msgs, gen).unwrap();
                assert_eq!(got, ids(&rec[key]["ids"]), "{name}/{conv}/{key}: ids");
                checked += 1;
            }
        }
    }
    assert_eq!(checked, 5 * 5 * 2);
}

#[test]
fn generation_tag_masks_equal_transformers() {
    let all = cases();
    let case = &all["cases"]["chatml_generation"];
    let (chat, tok) = load(case);
    assert!(chat.has_generation_tags());
    let mut with_assistant = 0;
    for (conv, rec) in case["conversations"].as_object().unwrap() {
        let msgs = messages(&rec["messages"]);
        let (got_ids, mask) = chat.encode_with_assistant_mask(&tok, &msgs).unwrap();
        assert_eq!(got_ids, ids(&rec["plain"]["ids"]), "{conv}: ids");
        let want: Vec<bool> = ids(&rec["assistant_masks"])
            .iter()
            .map(|&m| m == 1)
            .collect();
        assert_eq!(mask, want, "{conv}: mask");
        with_assistant += usize::from(want.iter().any(|&m| m));
    }
    assert_eq!(
        with_assistant, 4,
        "every conversation but prompt_only has an assistant turn"
    );
}

/// The mask a reader derives by hand: for each assistant message, in order, the ids of what
/// the template writes for its reply (`reply(content)`) are found in the ids after the previous
/// match, and exactly those are marked.
fn hand_mask(
    tok: &HfTokenizer,
    ids: &[i64],
    msgs: &[Message],
    reply: impl Fn(&str) -> Vec<i64>,
) -> Vec<bool> {
    let _ = tok;
    let mut mask = vec![false; ids.len()];
    let mut from = 0;
    for m in msgs.iter().filter(|m| m.role == "assistant") {
        let needle = reply(&m.content);
        let at = (from..=ids.len() - needle.len())
            .find(|&i| ids[i..i + needle.len()] == needle[..])
            .unwrap_or_else(|| panic!("reply of {:?} not found in the ids", m.content));
        mask[at..at + needle.len()]
            .iter_mut()
            .for_each(|x| *x = true);
        from = at + needle.len();
    }
    mask
}

#[test]
fn prefix_masks_cover_the_replies_and_their_end_of_turn() {
    let all = cases();
    for name in ["chatml_qwen", "llama3", "mistral"] {
        let case = &all["cases"][name];
        let (chat, tok) = load(case);
        assert!(!chat.has_generation_tags());
        let id = |s: &str| tok.inner().token_to_id(s).map(i64::from).unwrap();
        let enc = |s: &str| tok.encode(s).unwrap();
        for (conv, rec) in case["conversations"].as_object().unwrap() {
            let msgs = messages(&rec["messages"]);
            let (got_ids, mask) = chat.encode_with_assistant_mask(&tok, &msgs).unwrap();
            assert_eq!(got_ids, ids(&rec["plain"]["ids"]), "{name}/{conv}: ids");
            // what each template writes after the assistant header, read off the template
            let want = match name {
                // content, <|im_end|>, "\n"
                "chatml_qwen" => hand_mask(&tok, &got_ids, &msgs, |c| {
                    [enc(c), vec![id("<|im_end|>")], enc("\n")].concat()
                }),
                // trimmed content, <|eot_id|>
                "llama3" => hand_mask(&tok, &got_ids, &msgs, |c| {
                    [enc(c.trim()), vec![id("<|eot_id|>")]].concat()
                }),
                // " " + stripped content, </s>
                _ => hand_mask(&tok, &got_ids, &msgs, |c| {
                    [enc(&format!(" {}", c.trim())), vec![id("</s>")]].concat()
                }),
            };
            assert_eq!(mask, want, "{name}/{conv}: mask");
        }
    }
}

#[test]
fn raise_exception_surfaces_the_templates_message() {
    let all = cases();
    let rec = &all["errors"]["mistral_two_users"];
    let case = &all["cases"][rec["case"].as_str().unwrap()];
    let (chat, _) = load(case);
    let msgs = messages(&rec["messages"]);
    let err = chat.render(&msgs, false).unwrap_err();
    let text = err.to_string();
    let python = rec["message"].as_str().unwrap();
    assert!(text.contains(python), "{text} lacks {python:?}");
    // where it happened: the second message, a user one, and the template line
    assert!(text.contains("message 1 (role \"user\")"), "{text}");
    assert!(text.contains("line 11"), "{text}");
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err:?}");
}

#[test]
fn a_syntax_error_names_the_file_and_line() {
    let err = ChatTemplate::new(
        "{% for m in messages %}\n{{ m.content }\n{% endfor %}",
        None,
        None,
    )
    .unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, Error::InvalidFile { .. }), "{err:?}");
    assert!(
        text.contains("template") && text.contains("line 2"),
        "{text}"
    );

    let dir = tempdir("syntax");
    std::fs::write(dir.join("chat_template.jinja"), "ok\n\n{% if x %}no end").unwrap();
    let err = ChatTemplate::from_model_dir(&dir).unwrap_err();
    let text = err.to_string();
    assert!(text.contains("chat_template.jinja"), "{text}");
    assert!(text.contains("line 3"), "{text}");
}

fn tempdir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("torchrl-chat-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn a_folder_without_a_template_names_the_files_looked_at() {
    let dir = tempdir("missing");
    let err = ChatTemplate::from_model_dir(&dir).unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, Error::InvalidFile { .. }), "{err:?}");
    assert!(
        text.contains("chat_template.jinja") && text.contains("tokenizer_config.json"),
        "{text}"
    );
    std::fs::write(
        dir.join("tokenizer_config.json"),
        r#"{"eos_token": "</s>"}"#,
    )
    .unwrap();
    let text = ChatTemplate::from_model_dir(&dir).unwrap_err().to_string();
    assert!(text.contains("chat_template"), "{text}");
    std::fs::write(dir.join("tokenizer_config.json"), "{not json").unwrap();
    let text = ChatTemplate::from_model_dir(&dir).unwrap_err().to_string();
    assert!(
        text.contains("tokenizer_config.json") && text.contains("JSON"),
        "{text}"
    );
}

#[test]
fn tokenizer_config_forms() {
    let dir = tempdir("forms");
    let msgs = [Message::new("user", "x")];
    // a list of named templates: "default" is taken; AddedToken objects for the tokens
    std::fs::write(
        dir.join("tokenizer_config.json"),
        r#"{"bos_token": {"content": "<s>", "lstrip": false, "__type": "AddedToken"},
            "eos_token": "</s>", "unk_token": null,
            "chat_template": [{"name": "tool_use", "template": "tools"},
                              {"name": "default", "template": "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}"}]}"#,
    )
    .unwrap();
    let chat = ChatTemplate::from_model_dir(&dir).unwrap();
    assert_eq!(chat.render(&msgs, false).unwrap(), "<s>x</s>");
    assert_eq!(chat.special_token("unk_token"), None);
    // chat_template.jinja wins over the config's field, and the config's tokens still apply
    std::fs::write(dir.join("chat_template.jinja"), "[{{ eos_token }}]").unwrap();
    let chat = ChatTemplate::from_model_dir(&dir).unwrap();
    assert_eq!(chat.render(&msgs, false).unwrap(), "[</s>]");
    std::fs::remove_file(dir.join("chat_template.jinja")).unwrap();
    // a list without "default" names what it has
    std::fs::write(
        dir.join("tokenizer_config.json"),
        r#"{"chat_template": [{"name": "rag", "template": "x"}]}"#,
    )
    .unwrap();
    let text = ChatTemplate::from_model_dir(&dir).unwrap_err().to_string();
    assert!(text.contains("default") && text.contains("rag"), "{text}");
    std::fs::write(dir.join("tokenizer_config.json"), r#"{"chat_template": 3}"#).unwrap();
    assert!(ChatTemplate::from_model_dir(&dir).is_err());
}

#[test]
fn jinja2_semantics_that_templates_rely_on() {
    let m = [
        Message::new("system", "S"),
        Message::new("user", "  Hello, World  "),
    ];
    let r = |src: &str| {
        ChatTemplate::new(src, Some("<s>"), None)
            .unwrap()
            .render(&m, true)
    };
    // undefined prints empty; attribute access on undefined is an error
    assert_eq!(
        r("a{{ nothing }}b{{ messages[0].missing }}c").unwrap(),
        "abc"
    );
    assert!(r("{{ nothing.attr }}").is_err());
    assert!(r("{{ nothing.strip() }}").is_err());
    // tools / documents are passed as None
    assert_eq!(
        r("{{ tools is none }} {{ tools is defined }} {{ documents }}").unwrap(),
        "True True None"
    );
    // Python methods
    assert_eq!(
        r("{{ messages[1].content.strip().lower() }}|{{ messages[1].content.split(',')[1].strip() }}|{{ messages[0].role.startswith('sys') }}")
            .unwrap(),
        "hello, world|World|True"
    );
    assert_eq!(
        r("{% for k, v in messages[0].items() %}{{ k }}={{ v }};{% endfor %}").unwrap(),
        "role=system;content=S;"
    );
    // loop controls, namespace, slicing
    assert_eq!(
        r("{% set ns = namespace(n=0) %}{% for x in messages[1:] %}{% set ns.n = ns.n + 1 %}{% break %}{% endfor %}{{ ns.n }}")
            .unwrap(),
        "1"
    );
    // tojson as json.dumps: ensure_ascii False, ", " / ": " separators, indent, sort_keys
    assert_eq!(
        r(r#"{{ {"b": "é\n", "a": [1, 2.5, none, true]} | tojson }}"#).unwrap(),
        r#"{"b": "é\n", "a": [1, 2.5, null, true]}"#
    );
    assert_eq!(
        r(r#"{{ {"b": 1, "a": []} | tojson(indent=1, sort_keys=true) }}"#).unwrap(),
        "{\n \"a\": [],\n \"b\": 1\n}"
    );
    assert_eq!(
        r(r#"{{ "é" | tojson(ensure_ascii=true) }}"#).unwrap(),
        r#""\u00e9""#
    );
    assert_eq!(
        r(r#"{{ [1, 2] | tojson(separators=(",", ":")) }}"#).unwrap(),
        "[1,2]"
    );
    // strftime_now writes the current year
    let year = r("{{ strftime_now('%Y') }}").unwrap();
    assert!(year.len() == 4 && year.starts_with('2'), "{year}");
    // trim_blocks / lstrip_blocks
    assert_eq!(r("  {% if true %}\nx\n  {% endif %}\ny").unwrap(), "x\ny");
}

#[test]
fn templates_that_are_not_prefix_stable_are_refused_for_masks() {
    // drops the content of earlier assistant turns (as reasoning templates do)
    let chat = ChatTemplate::new(
        "{% for m in messages %}{% if m.role == 'assistant' and not loop.last %}<a>{% else %}\
         <{{ m.role }}>{{ m.content }}{% endif %}{% endfor %}{% if add_generation_prompt %}<g>{% endif %}",
        None,
        None,
    )
    .unwrap();
    let msgs = [
        Message::new("user", "q"),
        Message::new("assistant", "a"),
        Message::new("user", "q2"),
        Message::new("assistant", "a2"),
    ];
    let err = chat
        .encode_with_assistant_mask(&ByteTokenizer::new(), &msgs)
        .unwrap_err();
    assert!(err.to_string().contains("prefix-stable"), "{err}");
}

#[test]
fn generation_markers_in_content_are_refused() {
    let chat = ChatTemplate::new(
        "{% for m in messages %}{% generation %}{{ m.content }}{% endgeneration %}{% endfor %}",
        None,
        None,
    )
    .unwrap();
    let msgs = [Message::new("assistant", "x\u{10FFFC}y")];
    assert!(chat
        .encode_with_assistant_mask(&ByteTokenizer::new(), &msgs)
        .is_err());
    // a plain render does not need the markers
    assert_eq!(chat.render(&msgs, false).unwrap(), "x\u{10FFFC}y");
}

fn quick_err(src: &str) -> String {
    let start = Instant::now();
    let msgs = [Message::new("user", "hi")];
    let err = match ChatTemplate::new(src, None, None) {
        Ok(chat) => chat.render(&msgs, false).unwrap_err(),
        Err(e) => e,
    };
    assert!(start.elapsed() < Duration::from_secs(60), "{src}: too slow");
    err.to_string()
}

#[test]
fn hostile_templates_fail_with_errors() {
    // unbounded recursion
    let text = quick_err("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
    assert!(text.contains("recursion"), "{text}");
    // a huge range
    let text = quick_err("{% for i in range(1000000000) %}x{% endfor %}");
    assert!(!text.is_empty());
    // nested loops that would run for hours
    let text =
        quick_err("{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}");
    assert!(text.contains("fuel"), "{text}");
    // output that would be gigabytes
    let text = quick_err("{% for i in range(99999) %}{{ 'x' * 99999999 }}{% endfor %}");
    assert!(!text.is_empty());
    // deep nesting in the source
    let deep = "{% if true %}".repeat(5000) + &"{% endif %}".repeat(5000);
    let text = quick_err(&deep);
    assert!(!text.is_empty());
    let deep = "{{ ".to_string() + &"(".repeat(10000) + "1" + &")".repeat(10000) + " }}";
    let text = quick_err(&deep);
    assert!(!text.is_empty());
}

#[test]
fn generation_blocks_whose_output_is_transformed_are_refused() {
    // the block's output is trimmed after rendering: markers would change the text
    let chat = ChatTemplate::new(
        "{% for m in messages %}{% filter trim %}{% generation %} {{ m.content }} {% endgeneration %}{% endfilter %}{% endfor %}",
        None,
        None,
    )
    .unwrap();
    let msgs = [Message::new("assistant", "x")];
    assert_eq!(chat.render(&msgs, false).unwrap(), "x");
    let err = chat
        .encode_with_assistant_mask(&ByteTokenizer::new(), &msgs)
        .unwrap_err();
    assert!(err.to_string().contains("cannot be tracked"), "{err}");
}
