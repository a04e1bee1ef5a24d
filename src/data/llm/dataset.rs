//! Datasets in TRL's formats, read from JSONL files (one JSON object a line).
//!
//! TRL tells a dataset's *type* by its columns, and so does [`Dataset::from_jsonl`]: every
//! line of a file must have the columns of one [`DatasetFormat`]; other columns are kept as the
//! example's [`Example::fields`] (a verifiable reward reads its `answer` there).
//!
//! | format | columns | used by |
//! |---|---|---|
//! | [`LanguageModeling`](DatasetFormat::LanguageModeling) | `text`, or `messages` | SFT |
//! | [`PromptOnly`](DatasetFormat::PromptOnly) | `prompt` | GRPO, PPO, generation |
//! | [`PromptCompletion`](DatasetFormat::PromptCompletion) | `prompt`, `completion` | SFT (completion-only loss), evaluation |
//! | [`Preference`](DatasetFormat::Preference) | `chosen`, `rejected`, optional `prompt` | reward model, DPO |
//! | [`Scored`](DatasetFormat::Scored) | `prompt`, `completion`, `reward` | ILQL |
//!
//! Each text column is either *standard* (a string) or *conversational* (a list of
//! `{"role", "content"}` messages, rendered by the model's chat template); `messages` is
//! always conversational. A preference example without `prompt` has an *implicit prompt*: in
//! conversational form it is the messages `chosen` and `rejected` share from the start (TRL's
//! `maybe_extract_prompt`), in standard form it is empty.
//!
//! Bad input is refused with the file, the line and the column: malformed JSON, a line that
//! is not an object, a missing column, a column of the wrong type, a message without `role`,
//! a line whose columns belong to another format than the file's first line.
//!
//! ```
//! use torchrl::data::llm::{Dataset, DatasetFormat, Text};
//! # fn main() -> torchrl::Result<()> {
//! let dir = std::env::temp_dir().join(format!("torchrl-dataset-doc-{}", std::process::id()));
//! std::fs::create_dir_all(&dir).unwrap();
//! let path = dir.join("math.jsonl");
//! std::fs::write(
//!     &path,
//!     "{\"prompt\": \"2 + 3 =\", \"answer\": \"5\"}\n\
//!      {\"prompt\": [{\"role\": \"user\", \"content\": \"7 - 4 =\"}], \"answer\": \"3\"}\n",
//! )
//! .unwrap();
//! let data = Dataset::from_jsonl(&path)?;
//! assert_eq!(data.format(), DatasetFormat::PromptOnly);
//! assert_eq!(data.len(), 2);
//! let first = &data.examples()[0];
//! assert_eq!(first.prompt(), Some(&Text::Plain("2 + 3 =".into())));
//! assert_eq!(first.fields["answer"], "5");
//! assert!(data.examples()[1].prompt().unwrap().is_conversational());
//! // a seeded split: 1 of 2 held out
//! let (train, test) = data.train_test_split(0.5, 0)?;
//! assert_eq!((train.len(), test.len()), (1, 1));
//! // a line of another format is refused with its number and the column
//! std::fs::write(&path, "{\"prompt\": \"a\"}\n{\"text\": \"b\"}\n").unwrap();
//! let err = Dataset::from_jsonl(&path).unwrap_err().to_string();
//! assert!(err.contains("line 2") && err.contains("prompt"), "{err}");
//! # std::fs::remove_dir_all(&dir).ok();
//! # Ok(()) }
//! ```

use std::fmt;
use std::path::Path;

use serde_json::{Map, Value};

use super::Message;
use crate::error::{Error, Result};
use crate::rng::Generator;

/// A text column: a plain string, or a conversation rendered by a chat template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Text {
    /// A standard (non-conversational) text.
    Plain(String),
    /// A list of messages.
    Chat(Vec<Message>),
}

impl Text {
    /// Whether this is a list of messages.
    pub fn is_conversational(&self) -> bool {
        matches!(self, Text::Chat(_))
    }

    /// The messages of a conversational text (`None` for a plain one).
    pub fn messages(&self) -> Option<&[Message]> {
        match self {
            Text::Chat(m) => Some(m),
            Text::Plain(_) => None,
        }
    }

    /// The string of a plain text (`None` for a conversational one).
    pub fn as_plain(&self) -> Option<&str> {
        match self {
            Text::Plain(s) => Some(s),
            Text::Chat(_) => None,
        }
    }
}

/// The columns a dataset's examples carry (see the [module docs](self) for the table).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DatasetFormat {
    /// `text` (standard) or `messages` (conversational): SFT on whole sequences.
    LanguageModeling,
    /// `prompt`: prompts to sample completions for.
    PromptOnly,
    /// `prompt` and `completion`.
    PromptCompletion,
    /// `chosen` and `rejected`, with an optional (possibly implicit) `prompt`.
    Preference,
    /// `prompt`, `completion` and a numeric `reward` (ILQL's offline data).
    Scored,
}

impl DatasetFormat {
    /// Every format, in the order detection tries them.
    pub const ALL: [DatasetFormat; 5] = [
        DatasetFormat::Preference,
        DatasetFormat::Scored,
        DatasetFormat::PromptCompletion,
        DatasetFormat::PromptOnly,
        DatasetFormat::LanguageModeling,
    ];

    /// The format's name, as TRL's documentation writes it (`"prompt-completion"`, …).
    pub fn name(self) -> &'static str {
        match self {
            DatasetFormat::LanguageModeling => "language modeling",
            DatasetFormat::PromptOnly => "prompt-only",
            DatasetFormat::PromptCompletion => "prompt-completion",
            DatasetFormat::Preference => "preference",
            DatasetFormat::Scored => "scored (prompt / completion / reward)",
        }
    }

    /// The columns the format needs (`LanguageModeling`: `text` or `messages`).
    pub fn columns(self) -> &'static [&'static str] {
        match self {
            DatasetFormat::LanguageModeling => &["text | messages"],
            DatasetFormat::PromptOnly => &["prompt"],
            DatasetFormat::PromptCompletion => &["prompt", "completion"],
            DatasetFormat::Preference => &["chosen", "rejected"],
            DatasetFormat::Scored => &["prompt", "completion", "reward"],
        }
    }

    /// The format an object's keys belong to (TRL's rules: `chosen` + `rejected` is a
    /// preference; `reward` with `prompt` + `completion` is scored; `prompt` + `completion`;
    /// `prompt`; `text` or `messages`), or `None`.
    pub fn detect(keys: &Map<String, Value>) -> Option<DatasetFormat> {
        let has = |k: &str| keys.contains_key(k);
        Some(if has("chosen") && has("rejected") {
            DatasetFormat::Preference
        } else if has("prompt") && has("completion") && has("reward") {
            DatasetFormat::Scored
        } else if has("prompt") && has("completion") {
            DatasetFormat::PromptCompletion
        } else if has("prompt") {
            DatasetFormat::PromptOnly
        } else if has("text") || has("messages") {
            DatasetFormat::LanguageModeling
        } else {
            return None;
        })
    }
}

impl fmt::Display for DatasetFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What one example holds, by format.
#[derive(Debug, Clone, PartialEq)]
pub enum ExampleData {
    /// A whole sequence (`text` or `messages`).
    LanguageModeling {
        /// The sequence.
        text: Text,
    },
    /// A prompt.
    PromptOnly {
        /// The prompt.
        prompt: Text,
    },
    /// A prompt and its completion.
    PromptCompletion {
        /// The prompt.
        prompt: Text,
        /// The completion.
        completion: Text,
    },
    /// A preference pair.
    Preference {
        /// The prompt; an implicit one is empty (standard) or the shared leading messages
        /// (conversational, extracted when read).
        prompt: Text,
        /// The preferred completion.
        chosen: Text,
        /// The other completion.
        rejected: Text,
    },
    /// A scored sample.
    Scored {
        /// The prompt.
        prompt: Text,
        /// The completion.
        completion: Text,
        /// Its return.
        reward: f64,
    },
}

/// One example: its data, the other columns of its line, and where it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct Example {
    /// The line of the file (1-based; 0 for an example built in memory).
    pub line: usize,
    /// The columns its format reads.
    pub data: ExampleData,
    /// The line's other columns (an `answer` for a verifiable reward, an `id`, …).
    pub fields: Map<String, Value>,
}

impl Example {
    /// An in-memory example (line 0) without other columns.
    pub fn new(data: ExampleData) -> Self {
        Example {
            line: 0,
            data,
            fields: Map::new(),
        }
    }

    /// Adds another column.
    pub fn with_field(mut self, key: impl Into<String>, value: impl Into<Value>) -> Self {
        self.fields.insert(key.into(), value.into());
        self
    }

    /// The example's format.
    pub fn format(&self) -> DatasetFormat {
        match self.data {
            ExampleData::LanguageModeling { .. } => DatasetFormat::LanguageModeling,
            ExampleData::PromptOnly { .. } => DatasetFormat::PromptOnly,
            ExampleData::PromptCompletion { .. } => DatasetFormat::PromptCompletion,
            ExampleData::Preference { .. } => DatasetFormat::Preference,
            ExampleData::Scored { .. } => DatasetFormat::Scored,
        }
    }

    /// The prompt, when the format has one (not language modeling).
    pub fn prompt(&self) -> Option<&Text> {
        match &self.data {
            ExampleData::LanguageModeling { .. } => None,
            ExampleData::PromptOnly { prompt }
            | ExampleData::PromptCompletion { prompt, .. }
            | ExampleData::Preference { prompt, .. }
            | ExampleData::Scored { prompt, .. } => Some(prompt),
        }
    }
}

/// Examples of one [`DatasetFormat`], read from a JSONL file or built in memory (see the
/// [module docs](self)).
#[derive(Debug, Clone, PartialEq)]
pub struct Dataset {
    format: DatasetFormat,
    examples: Vec<Example>,
    source: String,
}

/// The error for line `line` of `path`.
fn bad_line(path: &str, line: usize, reason: impl fmt::Display) -> Error {
    Error::InvalidFile {
        op: "Dataset::from_jsonl",
        path: path.to_string(),
        reason: format!("line {line}: {reason}"),
    }
}

/// A JSON value's type, as printed in errors.
fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// A text column: a string, or a non-empty list of `{role, content}` string messages.
fn parse_text(path: &str, line: usize, column: &str, v: &Value) -> Result<Text> {
    let expected = "a string or a list of {\"role\", \"content\"} messages";
    match v {
        Value::String(s) => Ok(Text::Plain(s.clone())),
        Value::Array(items) => {
            if items.is_empty() {
                return Err(bad_line(
                    path,
                    line,
                    format!("column {column:?}: an empty list of messages"),
                ));
            }
            let mut messages = Vec::with_capacity(items.len());
            for (i, item) in items.iter().enumerate() {
                let at = |what: String| {
                    bad_line(
                        path,
                        line,
                        format!("column {column:?}, message {i}: {what}"),
                    )
                };
                let Value::Object(m) = item else {
                    return Err(at(format!("expected an object, got {}", type_name(item))));
                };
                let field = |k: &str| -> Result<String> {
                    match m.get(k) {
                        Some(Value::String(s)) => Ok(s.clone()),
                        Some(other) => Err(at(format!(
                            "field {k:?}: expected a string, got {}",
                            type_name(other)
                        ))),
                        None => Err(at(format!("no field {k:?}"))),
                    }
                };
                let (role, content) = (field("role")?, field("content")?);
                if let Some(extra) = m.keys().find(|k| *k != "role" && *k != "content") {
                    return Err(at(format!(
                        "unknown field {extra:?} (a message has \"role\" and \"content\")"
                    )));
                }
                messages.push(Message { role, content });
            }
            Ok(Text::Chat(messages))
        }
        other => Err(bad_line(
            path,
            line,
            format!(
                "column {column:?}: expected {expected}, got {}",
                type_name(other)
            ),
        )),
    }
}

/// The implicit prompt of a conversational preference pair: the messages both start with
/// (at least one, and each side keeps at least one).
fn split_implicit(
    path: &str,
    line: usize,
    chosen: Vec<Message>,
    rejected: Vec<Message>,
) -> Result<(Text, Text, Text)> {
    let shared = chosen
        .iter()
        .zip(&rejected)
        .take_while(|(a, b)| a == b)
        .count()
        .min(chosen.len().saturating_sub(1))
        .min(rejected.len().saturating_sub(1));
    if shared == 0 {
        return Err(bad_line(
            path,
            line,
            "no \"prompt\" column, and \"chosen\" and \"rejected\" share no leading message to \
             take as the implicit prompt",
        ));
    }
    let prompt: Vec<Message> = chosen.iter().take(shared).cloned().collect();
    Ok((
        Text::Chat(prompt),
        Text::Chat(chosen.into_iter().skip(shared).collect()),
        Text::Chat(rejected.into_iter().skip(shared).collect()),
    ))
}

/// Removes `column` from a line's object and parses it as a text column.
fn take_text(
    obj: &mut Map<String, Value>,
    path: &str,
    line: usize,
    format: DatasetFormat,
    column: &str,
) -> Result<Text> {
    let v = obj.remove(column).ok_or_else(|| {
        bad_line(
            path,
            line,
            format!(
                "no column {column:?} (the file is {format}, with columns {:?})",
                format.columns()
            ),
        )
    })?;
    parse_text(path, line, column, &v)
}

/// One line's object as an example of `format`.
fn parse_example(
    path: &str,
    line: usize,
    format: DatasetFormat,
    mut obj: Map<String, Value>,
) -> Result<Example> {
    let data = match format {
        DatasetFormat::LanguageModeling => {
            let (has_text, has_messages) = (obj.contains_key("text"), obj.contains_key("messages"));
            if has_text && has_messages {
                return Err(bad_line(
                    path,
                    line,
                    "both \"text\" and \"messages\": a language-modeling example has one",
                ));
            }
            let text = if has_messages {
                let t = take_text(&mut obj, path, line, format, "messages")?;
                if !t.is_conversational() {
                    return Err(bad_line(
                        path,
                        line,
                        "column \"messages\": expected a list of messages, got a string",
                    ));
                }
                t
            } else {
                let t = take_text(&mut obj, path, line, format, "text")?;
                if t.is_conversational() {
                    return Err(bad_line(
                        path,
                        line,
                        "column \"text\": expected a string (conversations go in \"messages\")",
                    ));
                }
                t
            };
            ExampleData::LanguageModeling { text }
        }
        DatasetFormat::PromptOnly => ExampleData::PromptOnly {
            prompt: take_text(&mut obj, path, line, format, "prompt")?,
        },
        DatasetFormat::PromptCompletion => ExampleData::PromptCompletion {
            prompt: take_text(&mut obj, path, line, format, "prompt")?,
            completion: take_text(&mut obj, path, line, format, "completion")?,
        },
        DatasetFormat::Preference => {
            let explicit = if obj.contains_key("prompt") {
                Some(take_text(&mut obj, path, line, format, "prompt")?)
            } else {
                None
            };
            let (chosen, rejected) = (
                take_text(&mut obj, path, line, format, "chosen")?,
                take_text(&mut obj, path, line, format, "rejected")?,
            );
            match (explicit, chosen, rejected) {
                (Some(prompt), chosen, rejected) => ExampleData::Preference {
                    prompt,
                    chosen,
                    rejected,
                },
                (None, Text::Chat(c), Text::Chat(r)) => {
                    let (prompt, chosen, rejected) = split_implicit(path, line, c, r)?;
                    ExampleData::Preference {
                        prompt,
                        chosen,
                        rejected,
                    }
                }
                (None, chosen @ Text::Plain(_), rejected @ Text::Plain(_)) => {
                    ExampleData::Preference {
                        prompt: Text::Plain(String::new()),
                        chosen,
                        rejected,
                    }
                }
                (None, _, _) => {
                    return Err(bad_line(
                        path,
                        line,
                        "\"chosen\" and \"rejected\" mix a string and a list of messages",
                    ))
                }
            }
        }
        DatasetFormat::Scored => {
            let prompt = take_text(&mut obj, path, line, format, "prompt")?;
            let completion = take_text(&mut obj, path, line, format, "completion")?;
            let reward = match obj.remove("reward") {
                Some(Value::Number(n)) => n.as_f64().filter(|r| r.is_finite()),
                _ => None,
            }
            .ok_or_else(|| bad_line(path, line, "column \"reward\": expected a finite number"))?;
            ExampleData::Scored {
                prompt,
                completion,
                reward,
            }
        }
    };
    // a text column of both forms within one example (a plain prompt and a conversational
    // completion) cannot be rendered consistently
    let texts: Vec<&Text> = match &data {
        ExampleData::PromptCompletion { prompt, completion }
        | ExampleData::Scored {
            prompt, completion, ..
        } => vec![prompt, completion],
        ExampleData::Preference {
            prompt,
            chosen,
            rejected,
        } if !matches!(prompt, Text::Plain(p) if p.is_empty()) => vec![prompt, chosen, rejected],
        _ => Vec::new(),
    };
    if texts
        .iter()
        .zip(texts.iter().skip(1))
        .any(|(a, b)| a.is_conversational() != b.is_conversational())
    {
        return Err(bad_line(
            path,
            line,
            "the example mixes string and conversational (list of messages) columns",
        ));
    }
    Ok(Example {
        line,
        data,
        fields: obj,
    })
}

impl Dataset {
    /// Reads a JSONL file; the format is detected from the first example's columns and every
    /// line must have them (see the [module docs](self)). Blank lines are skipped.
    ///
    /// # Errors
    /// [`Error::Io`] when the file cannot be read; [`Error::InvalidFile`] naming the line and
    /// column for bad input (invalid UTF-8, malformed JSON, a non-object line, columns of no
    /// format or of another format than the first line's, a value of the wrong type), and for
    /// a file without examples.
    pub fn from_jsonl(path: impl AsRef<Path>) -> Result<Self> {
        Self::read(path.as_ref(), None)
    }

    /// Reads a JSONL file as `format` (columns of another format on a line are an error).
    pub fn from_jsonl_as(path: impl AsRef<Path>, format: DatasetFormat) -> Result<Self> {
        Self::read(path.as_ref(), Some(format))
    }

    fn read(path: &Path, format: Option<DatasetFormat>) -> Result<Self> {
        let shown = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|source| Error::Io {
            op: "Dataset::from_jsonl",
            path: shown.clone(),
            source,
        })?;
        Self::parse(&bytes, &shown, format)
    }

    /// Parses JSONL `bytes` (as [`Dataset::from_jsonl`] does a file's; `source` names them in
    /// errors).
    pub fn from_jsonl_bytes(
        bytes: &[u8],
        source: &str,
        format: Option<DatasetFormat>,
    ) -> Result<Self> {
        Self::parse(bytes, source, format)
    }

    fn parse(bytes: &[u8], path: &str, forced: Option<DatasetFormat>) -> Result<Self> {
        let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
        let mut format = forced;
        let mut examples = Vec::new();
        for (i, raw) in bytes.split(|&b| b == b'\n').enumerate() {
            let line = i + 1;
            let text = std::str::from_utf8(raw)
                .map_err(|e| bad_line(path, line, format!("not UTF-8 ({e})")))?;
            let text = text.trim();
            if text.is_empty() {
                continue;
            }
            let value: Value = serde_json::from_str(text)
                .map_err(|e| bad_line(path, line, format!("malformed JSON: {e}")))?;
            let Value::Object(obj) = value else {
                return Err(bad_line(
                    path,
                    line,
                    format!("expected a JSON object, got {}", type_name(&value)),
                ));
            };
            let found = DatasetFormat::detect(&obj);
            let fmt = match (format, found) {
                (Some(f), _) => f,
                (None, Some(f)) => {
                    format = Some(f);
                    f
                }
                (None, None) => {
                    let keys: Vec<&String> = obj.keys().collect();
                    return Err(bad_line(
                        path,
                        line,
                        format!(
                            "columns {keys:?} are no dataset format TRL knows: \"text\" or \
                             \"messages\"; \"prompt\"; \"prompt\" + \"completion\"; \"chosen\" + \
                             \"rejected\"; \"prompt\" + \"completion\" + \"reward\""
                        ),
                    ));
                }
            };
            // every line of a file has its first line's columns (a forced format reads its
            // own columns and keeps the rest as fields)
            if let (None, Some(other)) = (forced, found.filter(|f| *f != fmt)) {
                return Err(bad_line(
                    path,
                    line,
                    format!(
                        "the columns are a {other} example's, but the file is {fmt} (columns \
                         {:?}, as its first example says)",
                        fmt.columns()
                    ),
                ));
            }
            examples.push(parse_example(path, line, fmt, obj)?);
        }
        let Some(format) = format else {
            return Err(Error::InvalidFile {
                op: "Dataset::from_jsonl",
                path: path.to_string(),
                reason: "no examples (the file is empty or has only blank lines)".into(),
            });
        };
        if examples.is_empty() {
            return Err(Error::InvalidFile {
                op: "Dataset::from_jsonl",
                path: path.to_string(),
                reason: "no examples".into(),
            });
        }
        Ok(Dataset {
            format,
            examples,
            source: path.to_string(),
        })
    }

    /// A dataset of in-memory examples, all of `format`.
    ///
    /// # Errors
    /// [`Error::InvalidValue`] naming the first example of another format.
    pub fn from_examples(format: DatasetFormat, examples: Vec<Example>) -> Result<Self> {
        if let Some((i, e)) = examples
            .iter()
            .enumerate()
            .find(|(_, e)| e.format() != format)
        {
            return Err(Error::argument(
                "Dataset::from_examples",
                "examples",
                format!("{format} examples"),
                format!("example {i} is {}", e.format()),
            ));
        }
        Ok(Dataset {
            format,
            examples,
            source: "<memory>".into(),
        })
    }

    /// The examples' format.
    pub fn format(&self) -> DatasetFormat {
        self.format
    }

    /// The examples, in order.
    pub fn examples(&self) -> &[Example] {
        &self.examples
    }

    /// Consumes the dataset into its examples.
    pub fn into_examples(self) -> Vec<Example> {
        self.examples
    }

    /// The number of examples.
    pub fn len(&self) -> usize {
        self.examples.len()
    }

    /// Whether there is no example (only after filtering; a read dataset has one at least).
    pub fn is_empty(&self) -> bool {
        self.examples.is_empty()
    }

    /// The file the examples were read from (`"<memory>"` otherwise).
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Whether the text columns are conversational (lists of messages).
    pub fn is_conversational(&self) -> bool {
        self.examples.first().is_some_and(|e| match &e.data {
            ExampleData::LanguageModeling { text } => text.is_conversational(),
            ExampleData::Preference { chosen, .. } => chosen.is_conversational(),
            ExampleData::PromptOnly { prompt }
            | ExampleData::PromptCompletion { prompt, .. }
            | ExampleData::Scored { prompt, .. } => prompt.is_conversational(),
        })
    }

    /// Shuffles the examples in place with a seeded Fisher-Yates pass (the same seed gives the
    /// same order on every machine).
    pub fn shuffle(&mut self, seed: u64) {
        let mut rng = Generator::new(seed);
        for i in (1..self.examples.len()).rev() {
            let j = rng.below(i as u64 + 1) as usize;
            self.examples.swap(i, j);
        }
    }

    /// Splits into `(train, test)` as `datasets`' `train_test_split(test_size, seed=…)` does:
    /// the examples are shuffled with `seed`, and `test_size` is a fraction in `(0, 1)` of
    /// them (rounded up) or, when ≥ 1, a count.
    ///
    /// # Errors
    /// [`Error::InvalidValue`] when `test_size` is not finite and > 0, or either side would
    /// be empty.
    pub fn train_test_split(&self, test_size: f64, seed: u64) -> Result<(Dataset, Dataset)> {
        let n = self.examples.len();
        let n_test = if test_size.is_finite() && test_size > 0.0 && test_size < 1.0 {
            (test_size * n as f64).ceil() as usize
        } else if test_size.is_finite() && test_size >= 1.0 && test_size.fract() == 0.0 {
            test_size as usize
        } else {
            return Err(Error::argument(
                "Dataset::train_test_split",
                "test_size",
                "a fraction in (0, 1) or a whole count >= 1",
                test_size.to_string(),
            ));
        };
        if n_test == 0 || n_test >= n {
            return Err(Error::argument(
                "Dataset::train_test_split",
                "test_size",
                format!(
                    "a split of the {n} examples of {} that leaves both sides non-empty",
                    self.source
                ),
                format!("{test_size} ({n_test} test examples)"),
            ));
        }
        let mut shuffled = self.clone();
        shuffled.shuffle(seed);
        let test = shuffled.examples.split_off(n - n_test);
        Ok((
            shuffled,
            Dataset {
                format: self.format,
                examples: test,
                source: self.source.clone(),
            },
        ))
    }

    /// Keeps the examples `keep` accepts; returns how many were dropped. An error from `keep`
    /// is returned with the example's line.
    pub fn retain<F>(&mut self, mut keep: F) -> Result<usize>
    where
        F: FnMut(&Example) -> Result<bool>,
    {
        let before = self.examples.len();
        let mut kept = Vec::with_capacity(before);
        for e in self.examples.drain(..) {
            let line = e.line;
            let ok = keep(&e).map_err(|err| err.context(format!("{} line {line}", self.source)))?;
            if ok {
                kept.push(e);
            }
        }
        self.examples = kept;
        Ok(before - self.examples.len())
    }
}
