//! The lean byte-level BPE encoder of `HfTokenizer` (src/modules/llm/bpe.rs) against the
//! `tokenizers` crate it stands in for: on every byte-level `tokenizer.json` of the repo and on
//! variants of `specs/tokenizer/qwen2_style` (trained by `specs/tokenizer/record_bpe_variants.py`:
//! Qwen2's NFC + Split + ByteLevel pipeline), seeded random texts built from the pieces that
//! pre-tokenizers and BPE treat specially must give the crate's ids, one by one and in parallel
//! batches. Files the encoder does not reproduce must report it and still encode.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};
use torchrl::modules::llm::{HfTokenizer, TextTokenizer};
use torchrl::Generator;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).expect("read")).expect("json")
}

/// Writes `json` to a fresh folder and loads it.
fn load(json: &Value, name: &str) -> HfTokenizer {
    let dir = std::env::temp_dir().join(format!("torchrl_tok_fast_{}_{name}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join("tokenizer.json");
    std::fs::write(&path, serde_json::to_string(json).expect("json")).expect("write");
    let tok = HfTokenizer::from_file(&path).expect("load");
    let _ = std::fs::remove_dir_all(&dir);
    tok
}

const PIECES: &[&str] = &[
    "the",
    "The",
    "THE",
    "model",
    " policy",
    "rewards",
    "a",
    "I",
    "x",
    "naïve",
    "café",
    "déjà",
    "e\u{301}",
    "Straße",
    "東京",
    "学习",
    "привет",
    "مرحبا",
    "😀",
    "🚀",
    "λ",
    "∑",
    "≤",
    "→",
    "'s",
    "'S",
    "'t",
    "'re",
    "'VE",
    "'m",
    "'ll",
    "'d",
    "'",
    "don't",
    "we've",
    "1",
    "12",
    "123",
    "2024",
    "3.14",
    "1e-5",
    "0",
    " ",
    "  ",
    "   ",
    "\t",
    "\n",
    "\n\n",
    "\r\n",
    " \n",
    "\u{a0}",
    "\u{200b}",
    ",",
    ".",
    "!?",
    "...",
    "(",
    ")",
    "[a,b]",
    "{k:v}",
    "<tag>",
    "</tag>",
    "<|",
    "|>",
    "<|im_",
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "http://a.b/c",
    "f(x)",
    "==",
    "//",
    "#",
    "-",
    "_",
    "$",
    "\u{0}",
    "\u{7f}",
];

/// A seeded random text of `n` pieces, sometimes with a long run of letters (the heap merge).
fn text(rng: &mut Generator, n: usize) -> String {
    let mut s = String::new();
    for _ in 0..n {
        match rng.below(40) {
            0 => {
                let len = 40 + rng.below(80) as usize;
                s.extend((0..len).map(|i| {
                    if i % 7 == 3 {
                        'é'
                    } else {
                        (b'a' + (i % 26) as u8) as char
                    }
                }));
            }
            1 => s.push_str(&"ab".repeat(30 + rng.below(20) as usize)),
            _ => s.push_str(PIECES[rng.below(PIECES.len() as u64) as usize]),
        }
    }
    s
}

/// The lean encoder is on for `tok` and gives the crate's ids on 300 random texts, alone and
/// in a batch.
fn agrees(tok: &HfTokenizer, what: &str, seed: u64) {
    assert!(tok.has_fast_encoder(), "{what}: the lean encoder is off");
    let reference = tok.clone().with_fast_encoder(false);
    assert!(!reference.has_fast_encoder());
    let mut rng = Generator::new(seed);
    let texts: Vec<String> = (0..300)
        .map(|i| text(&mut rng, if i == 0 { 0 } else { 1 + i % 60 }))
        .collect();
    let mut want = Vec::new();
    for t in &texts {
        let ours = tok.encode(t).expect("encode");
        let theirs = reference.encode(t).expect("crate encode");
        assert_eq!(ours, theirs, "{what}: {t:?}");
        want.push(theirs);
    }
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    assert_eq!(
        tok.encode_many(&refs).expect("encode_many"),
        want,
        "{what}: encode_many"
    );
    // the tokens are not just bytes: merges happened
    let bytes: usize = texts.iter().map(String::len).sum();
    let tokens: usize = want.iter().map(Vec::len).sum();
    assert!(tokens < bytes, "{what}: {tokens} tokens for {bytes} bytes");
}

fn qwen2_style() -> Value {
    read(&root().join("specs/tokenizer/qwen2_style/tokenizer.json"))
}

#[test]
fn repo_byte_level_files_agree() {
    for (i, dir) in [
        "chatml_qwen",
        "chatml_generation",
        "llama3",
        "mistral",
        "json_tags",
    ]
    .iter()
    .enumerate()
    {
        let tok =
            HfTokenizer::from_file(root().join("specs/chat").join(dir).join("tokenizer.json"))
                .expect("load");
        agrees(&tok, dir, i as u64);
    }
    let tok = HfTokenizer::from_file(root().join("specs/tokenizer/tokenizer.json")).expect("load");
    agrees(&tok, "specs/tokenizer", 9);
}

#[test]
fn qwen2_pipeline_agrees() {
    agrees(
        &load(&qwen2_style(), "qwen2"),
        "qwen2_style (NFC, Split, ByteLevel)",
        11,
    );
}

#[test]
fn variants_agree() {
    let mut no_norm = qwen2_style();
    no_norm["normalizer"] = Value::Null;
    agrees(&load(&no_norm, "nonorm"), "no normalizer", 12);

    let mut ignore = qwen2_style();
    ignore["model"]["ignore_merges"] = json!(true);
    agrees(&load(&ignore, "ignore"), "ignore_merges", 13);

    let mut gpt2 = qwen2_style();
    gpt2["pre_tokenizer"] = json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true});
    agrees(&load(&gpt2, "gpt2"), "GPT-2's ByteLevel regex", 14);

    let mut prefix = qwen2_style();
    prefix["pre_tokenizer"]["pretokenizers"][1]["add_prefix_space"] = json!(true);
    agrees(&load(&prefix, "prefix"), "a prefix space", 15);

    let mut llama3 = qwen2_style();
    let pattern = llama3["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"]
        .as_str()
        .expect("pattern")
        .replace(r"\p{N}|", r"\p{N}{1,3}|");
    llama3["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = json!(pattern);
    agrees(&load(&llama3, "llama3"), "Llama 3's digit groups", 16);

    let mut normalized = qwen2_style();
    for t in normalized["added_tokens"].as_array_mut().expect("added") {
        t["normalized"] = json!(true);
    }
    agrees(
        &load(&normalized, "normalized"),
        "normalized added tokens",
        17,
    );

    let mut legacy = qwen2_style();
    let merges: Vec<Value> = legacy["model"]["merges"]
        .as_array()
        .expect("merges")
        .iter()
        .map(|m| {
            json!(format!(
                "{} {}",
                m[0].as_str().unwrap(),
                m[1].as_str().unwrap()
            ))
        })
        .collect();
    legacy["model"]["merges"] = json!(merges);
    agrees(&load(&legacy, "legacy"), "merges as strings", 18);
}

/// An edit of a `tokenizer.json`.
type Edit = Box<dyn Fn(&mut Value)>;

#[test]
fn other_pipelines_go_to_the_crate() {
    let base = qwen2_style();
    let cases: Vec<(&str, Edit)> = vec![
        (
            "lowercase",
            Box::new(|j| j["normalizer"] = json!({"type": "Lowercase"})),
        ),
        (
            "byte_fallback",
            Box::new(|j| j["model"]["byte_fallback"] = json!(true)),
        ),
        (
            "lstrip",
            Box::new(|j| j["added_tokens"][1]["lstrip"] = json!(true)),
        ),
        (
            "metaspace",
            Box::new(
                |j| j["pre_tokenizer"] = json!({"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": true}),
            ),
        ),
        (
            "truncation",
            Box::new(
                |j| j["truncation"] = json!({"direction": "Right", "max_length": 8, "strategy": "LongestFirst", "stride": 0}),
            ),
        ),
        (
            "merged split",
            Box::new(|j| {
                j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = json!("MergedWithPrevious")
            }),
        ),
    ];
    for (name, edit) in cases {
        let mut j = base.clone();
        edit(&mut j);
        let tok = load(&j, name);
        assert!(
            !tok.has_fast_encoder(),
            "{name}: the lean encoder should be off"
        );
        let ids = tok.encode("Hello world, 東京!").expect("the crate encodes");
        assert!(!ids.is_empty(), "{name}");
    }
}

#[test]
fn nfc_text_that_changes_goes_to_the_crate() {
    let tok = load(&qwen2_style(), "nfc");
    let reference = tok.clone().with_fast_encoder(false);
    // "e" + combining acute composes to "é" under NFC: the crate's ids, as if written "é"
    let decomposed = "cafe\u{301} and cafe\u{301}s";
    assert_eq!(
        tok.encode(decomposed).unwrap(),
        reference.encode(decomposed).unwrap()
    );
    assert_eq!(
        tok.encode(decomposed).unwrap(),
        reference.encode("café and cafés").unwrap()
    );
}
