//! W23: reading and tokenizing 100,000 conversations (`Dataset::from_jsonl`, the chat template
//! and the tokenizer, as `torchrl sft` prepares them) against `datasets` with `transformers`'
//! `apply_chat_template` (`benches/python/chat_baseline.py`) on the same file, with the same
//! template and tokenizer (`specs/chat/chatml_qwen`). Prints lines/s and the peak RSS of the
//! process. The file is written once (seeded) to `target/bench_data/conversations.jsonl`; its
//! path and the model folder are printed for the Python half (scripts/bench.sh runs both).

use std::fs;
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use torchrl::data::llm::prepare::Encoder;
use torchrl::data::llm::{ChatTemplate, Dataset};
use torchrl::modules::llm::HfTokenizer;
use torchrl::Generator;

const WORDS: [&str; 24] = [
    "the",
    "model",
    "learns",
    "a",
    "policy",
    "from",
    "rewards",
    "and",
    "its",
    "value",
    "function",
    "estimates",
    "returns",
    "over",
    "many",
    "steps",
    "while",
    "the",
    "critic",
    "is",
    "trained",
    "on",
    "rollouts",
    "é",
];

fn sentence(rng: &mut Generator, n: usize) -> String {
    (0..n)
        .map(|_| WORDS[rng.below(WORDS.len() as u64) as usize])
        .collect::<Vec<_>>()
        .join(" ")
}

fn write_file(path: &PathBuf, lines: usize) {
    let mut rng = Generator::new(23);
    let mut f = std::io::BufWriter::new(fs::File::create(path).expect("create the bench file"));
    for _ in 0..lines {
        let turns = 1 + rng.below(3) as usize;
        let mut messages =
            vec![serde_json::json!({"role": "system", "content": "You are a helpful assistant."})];
        for _ in 0..turns {
            let q = 8 + rng.below(24) as usize;
            let a = 16 + rng.below(48) as usize;
            messages.push(serde_json::json!({"role": "user", "content": sentence(&mut rng, q)}));
            messages
                .push(serde_json::json!({"role": "assistant", "content": sentence(&mut rng, a)}));
        }
        writeln!(f, "{}", serde_json::json!({ "messages": messages })).expect("write");
    }
}

fn peak_rss_mib() -> f64 {
    let status = fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<f64>().ok())
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

fn main() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let dir = root.join("target/bench_data");
    fs::create_dir_all(&dir).expect("bench folder");
    let file = dir.join("conversations.jsonl");
    let lines = 100_000;
    if !file.exists() {
        write_file(&file, lines);
    }
    let model = root.join("specs/chat/chatml_qwen");
    // TORCHRL_BENCH_FAST_TOKENIZER=0: every text through the tokenizers crate (the A/B of the
    // lean byte-level encoder)
    let fast = std::env::var("TORCHRL_BENCH_FAST_TOKENIZER").map_or(true, |v| v != "0");
    let tok = HfTokenizer::from_file(model.join("tokenizer.json"))
        .expect("tokenizer")
        .with_fast_encoder(fast);
    let template = ChatTemplate::from_model_dir(&model).expect("template");
    let t0 = Instant::now();
    let data = Dataset::from_jsonl(&file).expect("dataset");
    let enc = Encoder::new(&tok).with_chat_template(&template);
    let (rows, _) = enc.sft_rows(&data).expect("rows");
    let dt = t0.elapsed().as_secs_f64();
    let tokens: usize = rows.iter().map(|r| r.ids.len()).sum();
    println!(
        "W23_chat_template_tokenize_100k\t{:.1}\t# {:.2} s, {tokens} tokens, peak RSS {:.0} MiB, lean encoder {} (file {}, model {})",
        rows.len() as f64 / dt,
        dt,
        peak_rss_mib(),
        if tok.has_fast_encoder() { "on" } else { "off" },
        file.display(),
        model.display()
    );
}
