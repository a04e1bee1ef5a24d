//! Hostile `tokenizer.json` files (issue 29): what made the `tokenizers` crate abort or
//! panic, vocabularies with gaps, missing unknown tokens, runaway padding. Each test failed
//! (a process abort, a panic, or a wrong answer) before its fix.

use std::path::PathBuf;

use serde_json::{json, Value};
use torchrl::modules::llm::tokenizer::MAX_PIECE_BYTES;
use torchrl::modules::llm::{HfTokenizer, SpecialTokens, TextTokenizer};

fn spec_tokenizer() -> Value {
    let path: PathBuf = [
        env!("CARGO_MANIFEST_DIR"),
        "specs",
        "tokenizer",
        "tokenizer.json",
    ]
    .iter()
    .collect();
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn write(name: &str, v: &Value) -> PathBuf {
    let p = std::env::temp_dir().join(format!(
        "torchrl-hostile-tok-{name}-{}.json",
        std::process::id()
    ));
    std::fs::write(&p, serde_json::to_string(v).unwrap()).unwrap();
    p
}

fn load(name: &str, v: &Value) -> torchrl::Result<HfTokenizer> {
    let p = write(name, v);
    let out = HfTokenizer::from_file(&p);
    std::fs::remove_file(&p).ok();
    out
}

fn unigram(pieces: Vec<(String, f64)>, unk_id: Value) -> Value {
    json!({"version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": null, "pre_tokenizer": null, "post_processor": null, "decoder": null,
        "model": {"type": "Unigram", "unk_id": unk_id, "byte_fallback": false,
            "vocab": pieces.into_iter().map(|(p, s)| json!([p, s])).collect::<Vec<_>>()}})
}

#[test]
fn a_vocabulary_with_a_gap_counts_its_highest_id_and_names_ids_in_the_gap() {
    let mut v = spec_tokenizer();
    let before = load("nogap", &v).unwrap();
    let n = before.vocab_size();
    // the model's highest piece moved to id 400: ids n - 1 .. 400 are a gap
    let vocab = v["model"]["vocab"].as_object_mut().unwrap();
    let top = vocab
        .iter()
        .max_by_key(|(_, id)| id.as_i64().unwrap())
        .map(|(k, _)| k.clone())
        .unwrap();
    let text = before.decode(&[n - 1], SpecialTokens::Keep).unwrap();
    vocab.insert(top, json!(400));
    let tok = load("gap", &v).unwrap();
    assert_eq!(
        tok.vocab_size(),
        401,
        "highest id + 1, not the number of entries"
    );
    assert_eq!(tok.decode(&[400], SpecialTokens::Keep).unwrap(), text);
    let err = tok
        .decode(&[n - 1], SpecialTokens::Keep)
        .unwrap_err()
        .to_string();
    assert!(err.contains(&format!("id {}", n - 1)), "{err}");
    let err = tok.decode(&[401], SpecialTokens::Keep).unwrap_err();
    assert!(err.to_string().contains("401"), "{err}");
}

#[test]
fn a_unigram_piece_long_enough_to_overflow_the_stack_is_refused() {
    // before: loading succeeded and dropping the tokenizer overflowed the stack (an abort)
    let long = "a".repeat(4 << 20);
    let v = unigram(
        vec![("<unk>".into(), 0.0), ("b".into(), -1.0), (long, -2.0)],
        json!(0),
    );
    let err = load("long-piece", &v).unwrap_err().to_string();
    assert!(err.contains("model.vocab[2]"), "{err}");
    assert!(err.contains(&MAX_PIECE_BYTES.to_string()), "{err}");
    // a piece at the limit loads, encodes and drops on a small stack
    let ok = unigram(
        vec![
            ("<unk>".into(), 0.0),
            ("b".into(), -1.0),
            ("a".repeat(MAX_PIECE_BYTES), -2.0),
        ],
        json!(0),
    );
    let tok = load("limit-piece", &ok).unwrap();
    // encoded, cloned and dropped on a thread with the default 2 MiB stack (the parse runs
    // on the loader's own thread)
    let handle = std::thread::spawn(move || {
        assert_eq!(tok.encode("bb").unwrap(), vec![1, 1]);
        let copy = tok.inner().clone();
        drop(copy);
        drop(tok);
    });
    handle.join().unwrap();
}

#[test]
fn a_missing_unknown_token_is_refused_at_load() {
    // Unigram without unk_id (and no byte fallback): "c" could never be encoded
    let v = unigram(vec![("a".into(), -1.0), ("b".into(), -1.0)], Value::Null);
    let err = load("no-unk-id", &v).unwrap_err().to_string();
    assert!(err.contains("unk_id"), "{err}");
    let v = unigram(vec![("a".into(), -1.0)], json!(7));
    assert!(load("bad-unk-id", &v).is_err());
    // BPE naming an unknown token its vocabulary lacks
    let mut v = spec_tokenizer();
    v["model"]["unk_token"] = json!("<unk>");
    let err = load("bpe-unk", &v).unwrap_err().to_string();
    assert!(err.contains("unk_token") && err.contains("<unk>"), "{err}");
    // WordLevel likewise
    let v = json!({"version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": null, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null,
        "decoder": null, "model": {"type": "WordLevel", "vocab": {"a": 0, "b": 1},
        "unk_token": "[UNK]"}});
    let err = load("wordlevel-unk", &v).unwrap_err().to_string();
    assert!(err.contains("[UNK]"), "{err}");
}

#[test]
fn runaway_padding_is_refused_at_load() {
    // before: every encode tried to pad to 2^40 tokens (an allocation abort)
    for padding in [
        json!({"strategy": "BatchLongest", "direction": "Left", "pad_to_multiple_of": 1u64 << 40,
            "pad_id": 0, "pad_type_id": 0, "pad_token": "<pad>"}),
        json!({"strategy": {"Fixed": 1u64 << 40}, "direction": "Left", "pad_to_multiple_of": null,
            "pad_id": 0, "pad_type_id": 0, "pad_token": "<pad>"}),
        json!({"strategy": "BatchLongest", "direction": "Left",
            "pad_to_multiple_of": u64::MAX, "pad_id": 0, "pad_type_id": 0, "pad_token": "<pad>"}),
    ] {
        let mut v = spec_tokenizer();
        v["padding"] = padding;
        let err = load("padding", &v).unwrap_err().to_string();
        assert!(err.contains("padding."), "{err}");
    }
    // a sane multiple still loads and pads
    let mut v = spec_tokenizer();
    v["padding"] = json!({"strategy": "BatchLongest", "direction": "Left",
        "pad_to_multiple_of": 8, "pad_id": 1, "pad_type_id": 0, "pad_token": "<pad>"});
    let tok = load("padding-ok", &v).unwrap();
    assert_eq!(tok.encode("hello").unwrap().len() % 8, 0);
}

#[test]
fn a_panic_inside_the_tokenizers_crate_is_an_error() {
    // a stride past max_length trips an assert in the crate's truncation on long text
    let mut v = spec_tokenizer();
    v["truncation"] = json!({"direction": "Right", "max_length": 2, "strategy": "LongestFirst",
        "stride": 5});
    let tok = load("stride", &v).unwrap();
    let err = tok.encode("a longer text than two tokens").unwrap_err();
    assert!(err.to_string().contains("panicked"), "{err}");
    // the tokenizer stays usable
    assert_eq!(tok.encode("a").unwrap().len(), 1);
}

#[test]
fn deeply_nested_patterns_are_refused_at_load() {
    let mut v = spec_tokenizer();
    let pattern = format!("{}a{}", "(".repeat(100_000), ")".repeat(100_000));
    v["pre_tokenizer"] = json!({"type": "Split", "pattern": {"Regex": pattern},
        "behavior": "Isolated", "invert": false});
    let err = load("pattern", &v).unwrap_err().to_string();
    assert!(err.contains("Regex"), "{err}");
}

#[test]
fn a_padded_batch_too_large_for_memory_is_an_error_not_an_abort() {
    use torchrl::modules::llm::{pad_rows, PaddingSide};
    // before: Vec::with_capacity(rows * width) aborted the process (2^40 ids here) or
    // overflowed; each row is shared so the input itself is small
    let long = vec![1i64; 1 << 22];
    let mut rows = vec![long];
    rows.extend(std::iter::repeat_n(Vec::new(), (1 << 18) - 1));
    let err = pad_rows(&rows, 0, PaddingSide::Left).unwrap_err();
    assert!(err.to_string().contains("rows"), "{err}");
}

fn base64(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let mut acc = 0u32;
        for (i, &b) in chunk.iter().enumerate() {
            acc |= u32::from(b) << (16 - 8 * i);
        }
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(A[((acc >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[test]
fn a_precompiled_charsmap_whose_trie_length_passes_its_blob_is_refused() {
    // the crate reserves the declared trie length (up to 8 GiB) before reading it
    let mut blob = 0xFFFF_FFF0u32.to_le_bytes().to_vec();
    blob.extend([0u8; 8]);
    let mut v = spec_tokenizer();
    v["normalizer"] = json!({"type": "Precompiled", "precompiled_charsmap": base64(&blob)});
    let err = load("charsmap", &v).unwrap_err().to_string();
    assert!(err.contains("precompiled_charsmap"), "{err}");
    // a length that fits passes the check (the crate then judges the rest)
    let mut ok = 8u32.to_le_bytes().to_vec();
    ok.extend([0u8; 8]);
    ok.extend(b"a\0");
    v["normalizer"] = json!({"type": "Precompiled", "precompiled_charsmap": base64(&ok)});
    if let Err(e) = load("charsmap-ok", &v) {
        assert!(!e.to_string().contains("it must fit"), "{e}");
    }
}
