//! From [`Example`]s to the token rows each trainer takes, as TRL's trainers tokenize their
//! datasets: plain texts through the tokenizer, conversations through the model's
//! [`ChatTemplate`].
//!
//! | trainer | rows | how (standard / conversational) |
//! |---|---|---|
//! | SFT | [`SftRow`]: ids + loss mask | `text` + EOS / the rendered `messages`; prompt + completion with the prompt masked out under `completion_only_loss`; only assistant turns under `assistant_only_loss` |
//! | GRPO, PPO, generation | prompt ids | the prompt / the prompt rendered with the generation prompt |
//! | reward model | [`PreferencePair`] | prompt + chosen + EOS and prompt + rejected + EOS (whole rows) |
//! | DPO | [`DpoPair`] | prompt, chosen + EOS, rejected + EOS as separate ids (TRL's `tokenize_row`) |
//! | ILQL | [`IlqlTokenSample`] | prompt, completion + EOS and the reward |
//!
//! A conversational completion is the text the template adds after the prompt rendered with
//! its generation prompt (TRL's `apply_chat_template` on prompt + completion, minus the
//! prompt's text); EOS is appended unless the template's text already ends with it.
//! [`Encoder::with_length_limit`] drops rows longer than the limit; each `encode_*` over a dataset
//! returns how many it dropped, and an error when nothing is left.
//!
//! ```
//! use torchrl::data::llm::prepare::Encoder;
//! use torchrl::data::llm::{Dataset, DatasetFormat};
//! use torchrl::modules::llm::{ByteTokenizer, TextTokenizer};
//! # fn main() -> torchrl::Result<()> {
//! let tok = ByteTokenizer::new();
//! let jsonl = "{\"prompt\": \"1+1=\", \"completion\": \"2\"}\n{\"prompt\": \"20+20=\", \"completion\": \"40\"}\n";
//! let data = Dataset::from_jsonl_bytes(jsonl.as_bytes(), "math.jsonl", None)?;
//! let enc = Encoder::new(&tok).with_completion_only_loss(true).with_length_limit(Some(7));
//! let (rows, dropped) = enc.sft_rows(&data)?;
//! assert_eq!(dropped, 1); // "20+20=40" + EOS is 9 tokens
//! let row = &rows[0];
//! let mut expected = tok.encode("1+1=2")?;
//! expected.extend(tok.eos_token_id());
//! assert_eq!(row.ids, expected);
//! // the prompt "1+1=" is context, "2" and EOS are targets
//! assert_eq!(row.loss_mask, vec![false, false, false, false, true, true]);
//! # Ok(()) }
//! ```

use super::chat::ChatTemplate;
use super::dataset::{Dataset, DatasetFormat, Example, ExampleData, Text};
use super::Message;
use crate::error::{Error, Result, ResultExt};
use crate::modules::llm::TextTokenizer;
use crate::trainers::dpo::DpoPair;
use crate::trainers::ilql::data::IlqlTokenSample;
use crate::trainers::reward::PreferencePair;

/// A prompt's ids with the index of its example in the dataset.
pub type IndexedPrompt = (usize, Vec<i64>);

/// One SFT row: the token ids and which of them are targets (same length).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SftRow {
    /// The tokens.
    pub ids: Vec<i64>,
    /// `true` where the token is a target of the loss.
    pub loss_mask: Vec<bool>,
}

/// Turns examples into token rows (see the [module docs](self)).
#[derive(Clone, Copy)]
pub struct Encoder<'a> {
    tokenizer: &'a dyn TextTokenizer,
    template: Option<&'a ChatTemplate>,
    completion_only_loss: bool,
    assistant_only_loss: bool,
    max_length: Option<usize>,
}

impl std::fmt::Debug for Encoder<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Encoder")
            .field("template", &self.template.is_some())
            .field("completion_only_loss", &self.completion_only_loss)
            .field("assistant_only_loss", &self.assistant_only_loss)
            .field("max_length", &self.max_length)
            .finish_non_exhaustive()
    }
}

impl<'a> Encoder<'a> {
    /// An encoder over `tokenizer`, without a chat template (conversational examples are then
    /// refused), training on every token (TRL's defaults but `completion_only_loss`, which TRL
    /// turns on for prompt-completion data: set it with
    /// [`Encoder::with_completion_only_loss`]), with no length limit.
    pub fn new(tokenizer: &'a dyn TextTokenizer) -> Self {
        Encoder {
            tokenizer,
            template: None,
            completion_only_loss: false,
            assistant_only_loss: false,
            max_length: None,
        }
    }

    /// Renders conversational columns with `template`.
    pub fn with_chat_template(mut self, template: &'a ChatTemplate) -> Self {
        self.template = Some(template);
        self
    }

    /// SFT on prompt-completion examples trains on the completion only (TRL's
    /// `completion_only_loss`).
    pub fn with_completion_only_loss(mut self, on: bool) -> Self {
        self.completion_only_loss = on;
        self
    }

    /// SFT on conversations trains on the assistant turns only (TRL's `assistant_only_loss`).
    pub fn with_assistant_only_loss(mut self, on: bool) -> Self {
        self.assistant_only_loss = on;
        self
    }

    /// Rows longer than `limit` tokens are dropped (and counted); `None`: no limit. (TRL's
    /// `max_length` truncates instead; the CLI offers both.)
    pub fn with_length_limit(mut self, limit: Option<usize>) -> Self {
        self.max_length = limit;
        self
    }

    /// The length limit.
    pub fn length_limit(&self) -> Option<usize> {
        self.max_length
    }

    fn template(&self, column: &str) -> Result<&'a ChatTemplate> {
        self.template.ok_or_else(|| {
            Error::invalid(
                "Encoder",
                format!(
                    "column {column:?} is conversational (a list of messages), and no chat \
                     template was given (the model folder has none: add chat_template.jinja, or \
                     use plain-text columns)"
                ),
            )
        })
    }

    fn plain(&self, text: &str) -> Result<Vec<i64>> {
        self.tokenizer.encode(text)
    }

    fn with_eos(&self, mut ids: Vec<i64>) -> Vec<i64> {
        if let Some(eos) = self.tokenizer.eos_token_id() {
            if ids.last() != Some(&eos) {
                ids.push(eos);
            }
        }
        ids
    }

    /// The ids of a prompt: the plain text, or the conversation rendered with the template's
    /// generation prompt.
    pub fn prompt_ids(&self, prompt: &Text) -> Result<Vec<i64>> {
        match prompt {
            Text::Plain(s) => self.plain(s),
            Text::Chat(m) => self.template("prompt")?.encode(self.tokenizer, m, true),
        }
    }

    /// `(prompt ids, completion ids)`: the completion with EOS; a conversational completion is
    /// what the template renders after the prompt's generation prompt.
    pub fn prompt_completion_ids(
        &self,
        prompt: &Text,
        completion: &Text,
        column: &str,
    ) -> Result<(Vec<i64>, Vec<i64>)> {
        match (prompt, completion) {
            (Text::Plain(p), Text::Plain(c)) => Ok((self.plain(p)?, self.with_eos(self.plain(c)?))),
            (Text::Chat(p), Text::Chat(c)) => {
                let template = self.template(column)?;
                let head = template.render(p, true)?;
                let all: Vec<Message> = p.iter().chain(c).cloned().collect();
                let full = template.render(&all, false)?;
                let tail = full.strip_prefix(head.as_str()).ok_or_else(|| {
                    Error::invalid(
                        "Encoder",
                        format!(
                            "column {column:?}: the chat template renders the prompt with its \
                             generation prompt as {head:?}, which does not start the rendering \
                             of prompt + {column} ({full:?}); this template cannot split a \
                             prompt from its completion"
                        ),
                    )
                })?;
                Ok((
                    self.tokenizer.encode(&head)?,
                    self.with_eos(self.tokenizer.encode(tail)?),
                ))
            }
            _ => Err(Error::invalid(
                "Encoder",
                format!("prompt and {column:?} mix plain text and messages"),
            )),
        }
    }

    fn fits(&self, len: usize) -> bool {
        self.max_length.is_none_or(|m| len <= m)
    }

    /// One SFT row of a language-modeling or prompt-completion example.
    pub fn sft_row(&self, example: &Example) -> Result<SftRow> {
        match &example.data {
            ExampleData::LanguageModeling {
                text: Text::Plain(s),
            } => {
                let ids = self.with_eos(self.plain(s)?);
                Ok(SftRow {
                    loss_mask: vec![true; ids.len()],
                    ids,
                })
            }
            ExampleData::LanguageModeling {
                text: Text::Chat(m),
            } => {
                let template = self.template("messages")?;
                if self.assistant_only_loss {
                    let (ids, loss_mask) =
                        template.encode_with_assistant_mask(self.tokenizer, m)?;
                    Ok(SftRow { ids, loss_mask })
                } else {
                    let ids = template.encode(self.tokenizer, m, false)?;
                    Ok(SftRow {
                        loss_mask: vec![true; ids.len()],
                        ids,
                    })
                }
            }
            ExampleData::PromptCompletion { prompt, completion } => {
                let (p, c) = self.prompt_completion_ids(prompt, completion, "completion")?;
                let mut loss_mask = vec![!self.completion_only_loss; p.len()];
                loss_mask.extend(std::iter::repeat_n(true, c.len()));
                Ok(SftRow {
                    ids: [p, c].concat(),
                    loss_mask,
                })
            }
            _ => Err(wrong_format(
                "SFT",
                example.format(),
                &[
                    DatasetFormat::LanguageModeling,
                    DatasetFormat::PromptCompletion,
                ],
            )),
        }
    }

    /// The SFT rows of `data` and how many were dropped for length.
    ///
    /// # Errors
    /// On a data format SFT cannot use, an example that does not encode (with its line), or
    /// no row left.
    pub fn sft_rows(&self, data: &Dataset) -> Result<(Vec<SftRow>, usize)> {
        if data.format() == DatasetFormat::LanguageModeling && !self.assistant_only_loss {
            return self.language_modeling_rows(data);
        }
        self.collect(data, "SFT", |e| {
            let row = self.sft_row(e)?;
            Ok((row.ids.len(), row))
        })
    }

    /// [`Encoder::sft_rows`] of language-modeling data trained on every token: the texts are
    /// rendered first, then tokenized together in chunks ([`TextTokenizer::encode_many`],
    /// parallel for [`HfTokenizer`](crate::modules::llm::HfTokenizer)); the same rows as
    /// [`Encoder::sft_row`] one by one.
    fn language_modeling_rows(&self, data: &Dataset) -> Result<(Vec<SftRow>, usize)> {
        const CHUNK: usize = 2048;
        let mut rows = Vec::with_capacity(data.len());
        let mut dropped = 0usize;
        for chunk in data.examples().chunks(CHUNK) {
            let mut texts = Vec::with_capacity(chunk.len());
            for e in chunk {
                let at = || format!("{} line {}", data.source(), e.line);
                let text = match &e.data {
                    ExampleData::LanguageModeling {
                        text: Text::Plain(s),
                    } => s.clone(),
                    ExampleData::LanguageModeling {
                        text: Text::Chat(m),
                    } => self
                        .template("messages")
                        .and_then(|t| t.render(m, false))
                        .context(at())?,
                    _ => {
                        return Err(wrong_format(
                            "SFT",
                            e.format(),
                            &[DatasetFormat::LanguageModeling],
                        ))
                    }
                };
                texts.push(text);
            }
            let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
            let encoded = match self.tokenizer.encode_many(&refs) {
                Ok(ids) => ids,
                // one by one, to name the example that does not encode
                Err(_) => chunk
                    .iter()
                    .zip(&refs)
                    .map(|(e, t)| {
                        self.tokenizer.encode(t).context(format!(
                            "{} line {}",
                            data.source(),
                            e.line
                        ))
                    })
                    .collect::<Result<_>>()?,
            };
            for (e, ids) in chunk.iter().zip(encoded) {
                let ids = match &e.data {
                    ExampleData::LanguageModeling {
                        text: Text::Plain(_),
                    } => self.with_eos(ids),
                    _ => ids,
                };
                if self.fits(ids.len()) {
                    rows.push(SftRow {
                        loss_mask: vec![true; ids.len()],
                        ids,
                    });
                } else {
                    dropped += 1;
                }
            }
        }
        if rows.is_empty() {
            return Err(nothing_left("SFT", data, dropped, self.max_length));
        }
        Ok((rows, dropped))
    }

    /// The prompt ids of every example with a prompt (any format but language modeling), and
    /// how many were dropped for length. Each prompt keeps its example's index in `data`.
    pub fn prompts(&self, data: &Dataset) -> Result<(Vec<IndexedPrompt>, usize)> {
        let mut i = 0usize;
        self.collect(data, "prompts", |e| {
            let at = i;
            i += 1;
            let prompt = e.prompt().ok_or_else(|| {
                wrong_format(
                    "prompts",
                    e.format(),
                    &[DatasetFormat::PromptOnly, DatasetFormat::PromptCompletion],
                )
            })?;
            let ids = self.prompt_ids(prompt)?;
            Ok((ids.len(), (at, ids)))
        })
    }

    fn preference_ids(&self, e: &Example) -> Result<(Vec<i64>, Vec<i64>, Vec<i64>)> {
        let ExampleData::Preference {
            prompt,
            chosen,
            rejected,
        } = &e.data
        else {
            return Err(wrong_format(
                "preference pairs",
                e.format(),
                &[DatasetFormat::Preference],
            ));
        };
        let (p, c) = self.prompt_completion_ids(prompt, chosen, "chosen")?;
        let (_, r) = self.prompt_completion_ids(prompt, rejected, "rejected")?;
        Ok((p, c, r))
    }

    /// The reward model's pairs (whole rows) and how many were dropped for length (the longer
    /// row counts).
    pub fn preference_pairs(&self, data: &Dataset) -> Result<(Vec<PreferencePair>, usize)> {
        self.collect(data, "reward model", |e| {
            let (p, c, r) = self.preference_ids(e)?;
            let len = p.len() + c.len().max(r.len());
            Ok((
                len,
                PreferencePair::new([&p[..], &c].concat(), [&p[..], &r].concat()),
            ))
        })
    }

    /// DPO's pairs and how many were dropped for length (the longer row counts).
    pub fn dpo_pairs(&self, data: &Dataset) -> Result<(Vec<DpoPair>, usize)> {
        self.collect(data, "DPO", |e| {
            let (p, c, r) = self.preference_ids(e)?;
            let len = p.len() + c.len().max(r.len());
            Ok((len, DpoPair::new(p, c, r)))
        })
    }

    /// ILQL's scored samples and how many were dropped for length.
    pub fn ilql_samples(&self, data: &Dataset) -> Result<(Vec<IlqlTokenSample>, usize)> {
        self.collect(data, "ILQL", |e| {
            let ExampleData::Scored {
                prompt,
                completion,
                reward,
            } = &e.data
            else {
                return Err(wrong_format("ILQL", e.format(), &[DatasetFormat::Scored]));
            };
            let (p, c) = self.prompt_completion_ids(prompt, completion, "completion")?;
            Ok((p.len() + c.len(), IlqlTokenSample::new(p, c, *reward)))
        })
    }

    /// Encodes every example with `f` (its length and its row), dropping the rows over the
    /// limit; errors carry the example's file and line.
    fn collect<T, F>(&self, data: &Dataset, what: &str, mut f: F) -> Result<(Vec<T>, usize)>
    where
        F: FnMut(&Example) -> Result<(usize, T)>,
    {
        let mut rows = Vec::with_capacity(data.len());
        let mut dropped = 0usize;
        for e in data.examples() {
            let (len, row) = f(e).context(format!("{} line {}", data.source(), e.line))?;
            if self.fits(len) {
                rows.push(row);
            } else {
                dropped += 1;
            }
        }
        if rows.is_empty() {
            return Err(nothing_left(what, data, dropped, self.max_length));
        }
        Ok((rows, dropped))
    }
}

fn nothing_left(what: &str, data: &Dataset, dropped: usize, limit: Option<usize>) -> Error {
    Error::invalid(
        "Encoder",
        format!(
            "{what}: no example of {} is left: all {dropped} are longer than the length limit, \
             {} tokens",
            data.source(),
            limit.unwrap_or(usize::MAX)
        ),
    )
}

fn wrong_format(what: &str, got: DatasetFormat, accepted: &[DatasetFormat]) -> Error {
    let names: Vec<&str> = accepted.iter().map(|f| f.name()).collect();
    Error::invalid(
        "Encoder",
        format!("{what} takes {} data, not {got}", names.join(" or ")),
    )
}
