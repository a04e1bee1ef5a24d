//! JSONL datasets in TRL's formats (`torchrl::data::llm::Dataset`): detection, every format in
//! both forms, the implicit prompt, seeded shuffles and splits, filtering, and every kind of
//! bad line refused with its line and column.

use serde_json::json;
use torchrl::data::llm::{Dataset, DatasetFormat, Example, ExampleData, Message, Text};
use torchrl::Error;

fn parse(text: &str) -> torchrl::Result<Dataset> {
    Dataset::from_jsonl_bytes(text.as_bytes(), "data.jsonl", None)
}

fn err(text: &str) -> String {
    match parse(text) {
        Ok(d) => panic!("accepted {text:?} as {:?}", d.format()),
        Err(e) => {
            assert!(matches!(e, Error::InvalidFile { .. }), "{e:?}");
            e.to_string()
        }
    }
}

fn user(s: &str) -> Message {
    Message::new("user", s)
}

fn assistant(s: &str) -> Message {
    Message::new("assistant", s)
}

#[test]
fn every_format_is_detected_in_both_forms() {
    let cases = [
        (r#"{"text": "abc"}"#, DatasetFormat::LanguageModeling, false),
        (
            r#"{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}"#,
            DatasetFormat::LanguageModeling,
            true,
        ),
        (r#"{"prompt": "p"}"#, DatasetFormat::PromptOnly, false),
        (
            r#"{"prompt": [{"role": "user", "content": "p"}]}"#,
            DatasetFormat::PromptOnly,
            true,
        ),
        (
            r#"{"prompt": "p", "completion": "c"}"#,
            DatasetFormat::PromptCompletion,
            false,
        ),
        (
            r#"{"prompt": "p", "chosen": "a", "rejected": "b"}"#,
            DatasetFormat::Preference,
            false,
        ),
        (
            r#"{"prompt": "p", "completion": "c", "reward": 0.5}"#,
            DatasetFormat::Scored,
            false,
        ),
    ];
    for (line, format, conversational) in cases {
        let d = parse(line).unwrap();
        assert_eq!(d.format(), format, "{line}");
        assert_eq!(d.is_conversational(), conversational, "{line}");
        assert_eq!(d.examples()[0].line, 1);
    }
}

#[test]
fn columns_are_read_and_the_rest_kept_as_fields() {
    let d = parse(
        "\u{feff}{\"prompt\": \"2+2=\", \"completion\": \" 4\", \"answer\": 4, \"id\": \"q1\"}\n\n\
         {\"prompt\": \"1+1=\", \"completion\": \" 2\", \"answer\": 2, \"id\": \"q2\"}\n",
    )
    .unwrap();
    assert_eq!(d.len(), 2);
    let e = &d.examples()[1];
    assert_eq!(e.line, 3, "the blank line 2 is skipped but counted");
    assert_eq!(
        e.data,
        ExampleData::PromptCompletion {
            prompt: Text::Plain("1+1=".into()),
            completion: Text::Plain(" 2".into()),
        }
    );
    assert_eq!(e.fields.len(), 2);
    assert_eq!(e.fields["answer"], json!(2));
    assert_eq!(e.fields["id"], json!("q2"));
    let s = parse(r#"{"prompt": "p", "completion": "c", "reward": -2}"#).unwrap();
    assert!(matches!(
        s.examples()[0].data,
        ExampleData::Scored { reward, .. } if reward == -2.0
    ));
}

#[test]
fn implicit_prompt_is_the_shared_leading_messages() {
    let d = parse(
        r#"{"chosen": [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}, {"role": "assistant", "content": "good"}], "rejected": [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}, {"role": "assistant", "content": "bad"}]}"#,
    )
    .unwrap();
    assert_eq!(
        d.examples()[0].data,
        ExampleData::Preference {
            prompt: Text::Chat(vec![Message::new("system", "s"), user("q")]),
            chosen: Text::Chat(vec![assistant("good")]),
            rejected: Text::Chat(vec![assistant("bad")]),
        }
    );
    // standard form: the implicit prompt is empty
    let d = parse(r#"{"chosen": "ab", "rejected": "cd"}"#).unwrap();
    assert_eq!(d.examples()[0].prompt(), Some(&Text::Plain(String::new())));
    // nothing shared: refused
    let e = err(
        r#"{"chosen": [{"role": "user", "content": "a"}], "rejected": [{"role": "user", "content": "b"}]}"#,
    );
    assert!(e.contains("line 1") && e.contains("implicit prompt"), "{e}");
}

#[test]
fn bad_lines_name_the_line_and_the_column() {
    let cases: [(&str, &[&str]); 12] = [
        (
            "{\"prompt\": \"a\"}\n{\"prompt\": ",
            &["line 2", "malformed JSON"],
        ),
        ("[1, 2]", &["line 1", "JSON object", "a list"]),
        (
            r#"{"question": "a"}"#,
            &["line 1", "question", "no dataset format"],
        ),
        (
            "{\"prompt\": \"a\"}\n{\"text\": \"b\"}",
            &["line 2", "prompt-only", "language modeling"],
        ),
        (
            "{\"prompt\": \"a\", \"completion\": \"b\"}\n{\"prompt\": \"c\"}",
            &["line 2", "prompt-only", "prompt-completion"],
        ),
        (r#"{"prompt": 3}"#, &["line 1", "\"prompt\"", "a number"]),
        (r#"{"prompt": []}"#, &["line 1", "\"prompt\"", "empty list"]),
        (
            r#"{"prompt": [{"role": "user"}]}"#,
            &["line 1", "message 0", "no field \"content\""],
        ),
        (
            r#"{"prompt": [{"role": "user", "content": 1}]}"#,
            &["message 0", "\"content\"", "a number"],
        ),
        (
            r#"{"prompt": "p", "completion": [{"role": "assistant", "content": "c"}]}"#,
            &["line 1", "mixes"],
        ),
        (
            r#"{"prompt": "p", "completion": "c", "reward": "high"}"#,
            &["line 1", "\"reward\"", "finite number"],
        ),
        (
            r#"{"messages": "hi"}"#,
            &["line 1", "\"messages\"", "list of messages"],
        ),
    ];
    for (text, needles) in cases {
        let e = err(text);
        assert!(e.contains("data.jsonl"), "{e}");
        for n in needles {
            assert!(e.contains(n), "{text:?}: {e:?} lacks {n:?}");
        }
    }
    // not UTF-8 on line 2
    let e = Dataset::from_jsonl_bytes(b"{\"text\": \"a\"}\n{\"text\": \"\xff\"}\n", "d", None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("line 2") && e.contains("UTF-8"), "{e}");
    // empty file
    let e = err("\n\n  \n");
    assert!(e.contains("no examples"), "{e}");
    // a missing file names the path
    let e = Dataset::from_jsonl("/nonexistent/torchrl/data.jsonl").unwrap_err();
    assert!(matches!(e, Error::Io { .. }), "{e:?}");
    assert!(e.to_string().contains("/nonexistent/torchrl/data.jsonl"));
}

#[test]
fn a_forced_format_keeps_other_columns_as_fields() {
    let text = "{\"prompt\": \"2+2=\", \"completion\": \"4\"}\n";
    let d =
        Dataset::from_jsonl_bytes(text.as_bytes(), "d", Some(DatasetFormat::PromptOnly)).unwrap();
    assert_eq!(d.format(), DatasetFormat::PromptOnly);
    assert_eq!(d.examples()[0].fields["completion"], json!("4"));
    let e = Dataset::from_jsonl_bytes(text.as_bytes(), "d", Some(DatasetFormat::Preference))
        .unwrap_err()
        .to_string();
    assert!(e.contains("no column \"chosen\""), "{e}");
}

#[test]
fn shuffle_and_split_are_seeded_permutations() {
    let lines: String = (0..100)
        .map(|i| format!("{{\"prompt\": \"p{i}\"}}\n"))
        .collect();
    let d = parse(&lines).unwrap();
    let ids = |d: &Dataset| -> Vec<usize> { d.examples().iter().map(|e| e.line).collect() };
    let mut a = d.clone();
    a.shuffle(7);
    let mut b = d.clone();
    b.shuffle(7);
    let mut c = d.clone();
    c.shuffle(8);
    assert_eq!(ids(&a), ids(&b));
    assert_ne!(ids(&a), ids(&c));
    assert_ne!(ids(&a), ids(&d));
    let mut sorted = ids(&a);
    sorted.sort_unstable();
    assert_eq!(sorted, (1..=100).collect::<Vec<_>>(), "a permutation");

    // datasets' rounding: ceil(0.15 * 100) = 15 test examples; a count is taken as is
    let (train, test) = d.train_test_split(0.15, 3).unwrap();
    assert_eq!((train.len(), test.len()), (85, 15));
    let mut all: Vec<usize> = ids(&train).into_iter().chain(ids(&test)).collect();
    all.sort_unstable();
    assert_eq!(all, (1..=100).collect::<Vec<_>>(), "disjoint and complete");
    assert_eq!(d.train_test_split(0.15, 3).unwrap().1, test, "seeded");
    let (train, test) = d.train_test_split(10.0, 3).unwrap();
    assert_eq!((train.len(), test.len()), (90, 10));
    for bad in [0.0, -0.5, f64::NAN, 100.0, 2.5] {
        assert!(d.train_test_split(bad, 0).is_err(), "{bad}");
    }
}

#[test]
fn retain_counts_what_it_drops_and_names_the_line_of_an_error() {
    let mut d = parse("{\"text\": \"a\"}\n{\"text\": \"bbbb\"}\n{\"text\": \"cc\"}\n").unwrap();
    let len = |e: &Example| match &e.data {
        ExampleData::LanguageModeling { text } => text.as_plain().map_or(0, str::len),
        _ => 0,
    };
    let dropped = d.retain(|e| Ok(len(e) <= 2)).unwrap();
    assert_eq!(dropped, 1);
    assert_eq!(d.len(), 2);
    let e = d
        .retain(|e| {
            if e.line == 3 {
                Err(Error::InvalidArgument {
                    op: "t",
                    message: "boom".into(),
                })
            } else {
                Ok(true)
            }
        })
        .unwrap_err()
        .to_string();
    assert!(e.contains("data.jsonl line 3") && e.contains("boom"), "{e}");
    // in-memory examples of another format are refused
    let ex = Example::new(ExampleData::PromptOnly {
        prompt: Text::Plain("p".into()),
    });
    assert!(Dataset::from_examples(DatasetFormat::PromptOnly, vec![ex.clone()]).is_ok());
    assert!(Dataset::from_examples(DatasetFormat::Scored, vec![ex]).is_err());
}

#[test]
fn batched_language_modeling_rows_equal_the_rows_one_by_one() {
    use torchrl::data::llm::prepare::Encoder;
    use torchrl::data::llm::ChatTemplate;
    use torchrl::modules::llm::HfTokenizer;
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let model = root.join("specs/chat/chatml_qwen");
    let tok = HfTokenizer::from_file(model.join("tokenizer.json")).unwrap();
    let template = ChatTemplate::from_model_dir(&model).unwrap();
    let chats: String = (0..40)
        .map(|i| {
            format!(
                "{{\"messages\": [{{\"role\": \"user\", \"content\": \"question {i} é\"}}, \
                 {{\"role\": \"assistant\", \"content\": \"answer {}\"}}]}}\n",
                i * 7
            )
        })
        .collect();
    let plain: String = (0..40)
        .map(|i| format!("{{\"text\": \"some text number {i}\"}}\n"))
        .collect();
    for (text, drop_some) in [(chats, true), (plain, false)] {
        let data = parse(&text).unwrap();
        // a limit at the shortest length drops the longer rows
        let mut lens: Vec<usize> = data
            .examples()
            .iter()
            .map(|e| {
                Encoder::new(&tok)
                    .with_chat_template(&template)
                    .sft_row(e)
                    .unwrap()
                    .ids
                    .len()
            })
            .collect();
        lens.sort_unstable();
        let limit = drop_some.then(|| lens[0]);
        let enc = Encoder::new(&tok)
            .with_chat_template(&template)
            .with_length_limit(limit);
        let (rows, dropped) = enc.sft_rows(&data).unwrap();
        let one_by_one: Vec<_> = data
            .examples()
            .iter()
            .map(|e| enc.sft_row(e).unwrap())
            .filter(|r| limit.is_none_or(|m| r.ids.len() <= m))
            .collect();
        assert_eq!(rows, one_by_one);
        assert_eq!(dropped, data.len() - one_by_one.len());
        assert_eq!(dropped > 0, drop_some);
        assert!(rows.iter().all(|r| r.loss_mask.iter().all(|&m| m)));
    }
}
