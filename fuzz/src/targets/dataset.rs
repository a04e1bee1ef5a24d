//! JSONL datasets (`torchrl::data::llm::Dataset`) and their tokenization
//! (`torchrl::data::llm::prepare::Encoder`): lines of every TRL format, standard and
//! conversational, mutated as bytes and as JSON (odd types, huge numbers, deep nesting, missing
//! and extra columns, control characters, BOMs, blank lines), read detected or as a forced
//! format, split with odd `test_size`s, and encoded for the trainer each format feeds (with a
//! chat template for conversations, and a length limit). Every call must give `Ok` or an error
//! naming the source (`"data.jsonl"`); an `Ok` dataset is non-empty, its split is a partition,
//! and an `Ok` encoding gives rows whose masks are as long as their ids.

use torchrl::data::llm::prepare::Encoder;
use torchrl::data::llm::{ChatTemplate, Dataset, DatasetFormat};
use torchrl::modules::llm::ByteTokenizer;

use super::{Outcome, State, named_err};
use crate::mutate::{Rng, mutate_bytes, mutate_json_text};

const SOURCE: &str = "data.jsonl";

const LINES: &[&str] = &[
    r#"{"text": "12+35=47"}"#,
    r#"{"messages": [{"role": "user", "content": "2+2="}, {"role": "assistant", "content": "4"}]}"#,
    r#"{"prompt": "3+4=", "answer": "7"}"#,
    r#"{"prompt": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "1+1="}]}"#,
    r#"{"prompt": "5+5=", "completion": "10"}"#,
    r#"{"prompt": [{"role": "user", "content": "9+1="}], "completion": [{"role": "assistant", "content": "10"}]}"#,
    r#"{"prompt": "1+2=", "chosen": "3", "rejected": "4"}"#,
    r#"{"chosen": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], "rejected": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "b"}]}"#,
    r#"{"prompt": "2+3=", "completion": "5", "reward": 1.0}"#,
    r#"{"prompt": "2+3=", "completion": "6", "reward": -1e308, "id": [1, {"x": null}]}"#,
];

const TEMPLATE: &str = "{% for m in messages %}<{{ m.role }}>{{ m.content }}</s>{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}";

fn file(rng: &mut Rng) -> Vec<u8> {
    let n = 1 + rng.below(6);
    let first = rng.below(LINES.len());
    let mut text = Vec::new();
    if rng.chance(0.05) {
        text.extend_from_slice(b"\xEF\xBB\xBF");
    }
    for i in 0..n {
        // mostly one format a file, sometimes a stray line of another
        let line = if i == 0 || rng.chance(0.8) {
            LINES[first]
        } else {
            *rng.pick(LINES)
        };
        let bytes = if rng.chance(0.4) {
            mutate_json_text(rng, line.as_bytes())
        } else {
            line.as_bytes().to_vec()
        };
        text.extend_from_slice(&bytes);
        text.push(b'\n');
        if rng.chance(0.1) {
            text.extend_from_slice(b"  \n");
        }
    }
    if rng.chance(0.3) {
        mutate_bytes(rng, &text)
    } else {
        text
    }
}

fn err(msg: String) -> Outcome {
    named_err(
        msg,
        std::path::Path::new(SOURCE),
        &[SOURCE, "Encoder", "train_test_split"],
    )
}

pub fn dataset_case(_st: &mut State, rng: &mut Rng) -> Outcome {
    let bytes = file(rng);
    let forced = rng.chance(0.2).then(|| *rng.pick(&DatasetFormat::ALL));
    let data = match Dataset::from_jsonl_bytes(&bytes, SOURCE, forced) {
        Ok(d) => d,
        Err(e) => return err(e.to_string()),
    };
    if data.is_empty() {
        return Outcome::Defect("empty-ok", "an Ok dataset without examples".into());
    }
    let sizes = [0.5, 0.0, 1.0, 2.0, 1e9, f64::NAN, -1.0, 0.999_999];
    let size = *rng.pick(&sizes);
    if let Ok((train, test)) = data.train_test_split(size, rng.next()) {
        if train.len() + test.len() != data.len() || train.is_empty() || test.is_empty() {
            return Outcome::Defect(
                "split",
                format!("{} + {} of {}", train.len(), test.len(), data.len()),
            );
        }
    }
    let tok = ByteTokenizer::new();
    let template = match ChatTemplate::new(TEMPLATE, None, Some("</s>")) {
        Ok(t) => t,
        Err(e) => return Outcome::Defect("seed-template", e.to_string()),
    };
    let mut enc = Encoder::new(&tok)
        .with_completion_only_loss(rng.chance(0.5))
        .with_length_limit(rng.chance(0.3).then(|| rng.below(40)));
    if rng.chance(0.8) {
        enc = enc.with_chat_template(&template);
    }
    let checked = match data.format() {
        DatasetFormat::LanguageModeling | DatasetFormat::PromptCompletion => enc
            .sft_rows(&data)
            .map(|(rows, _)| rows.iter().all(|r| r.ids.len() == r.loss_mask.len())),
        DatasetFormat::PromptOnly => enc.prompts(&data).map(|_| true),
        DatasetFormat::Preference => enc
            .dpo_pairs(&data)
            .and_then(|_| enc.preference_pairs(&data))
            .map(|_| true),
        DatasetFormat::Scored => enc.ilql_samples(&data).map(|_| true),
    };
    match checked {
        Ok(true) => Outcome::Ok,
        Ok(false) => Outcome::Defect("mask-length", "a loss mask not as long as its ids".into()),
        Err(e) => err(e.to_string()),
    }
}
