//! [`RewardScorer`]: rewards (and reward models) as the token env's [`Scorer`], with each
//! prompt's dataset columns.

use std::collections::HashMap;
use std::fmt;

use serde_json::{Map, Value};
use tch::{Device, Kind, Tensor};

use crate::envs::llm::scorer::{check_lists, from_values, RewardModelScorer, ScoreInput, Scorer};
use crate::error::{Error, Result, ResultExt};
use crate::modules::llm::{SpecialTokens, TextTokenizer};

use super::*;
/// What a [`RewardPart`] runs.
///
/// ```
/// use torchrl::envs::llm::rewards::{RewardPart, RewardSource, SoftOverlongPunishment};
/// # fn main() -> torchrl::Result<()> {
/// let part = RewardPart::function(SoftOverlongPunishment::new(8, 2)?, 1.0)?;
/// assert!(matches!(part.source(), RewardSource::Function(f) if f.name() == "soft_overlong_punishment_reward"));
/// # Ok(()) }
/// ```
pub enum RewardSource {
    /// A reward function on the decoded batch.
    Function(Box<dyn RewardFunction>),
    /// A learned reward model on the batch's tokens.
    Model(Box<RewardModelScorer>),
}

impl fmt::Debug for RewardSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RewardSource::Function(func) => write!(f, "Function({:?})", func.name()),
            RewardSource::Model(m) => write!(f, "Model({m:?})"),
        }
    }
}

/// One weighted, named part of a [`RewardScorer`].
///
/// ```
/// use torchrl::envs::llm::rewards::{FormatCheck, RewardPart};
/// # fn main() -> torchrl::Result<()> {
/// let part = RewardPart::function(FormatCheck::think()?, 0.5)?;
/// assert_eq!((part.name(), part.weight()), ("think_format_reward", 0.5));
/// assert!(RewardPart::function(FormatCheck::think()?, f64::NAN).is_err());
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct RewardPart {
    name: String,
    weight: f64,
    source: RewardSource,
}

impl RewardPart {
    /// A reward function with `weight` (finite), named by the function.
    pub fn function(f: impl RewardFunction + 'static, weight: f64) -> Result<Self> {
        Self::boxed(Box::new(f), weight)
    }

    /// [`RewardPart::function`] for a boxed function.
    pub fn boxed(f: Box<dyn RewardFunction>, weight: f64) -> Result<Self> {
        let name = f.name().to_string();
        check_part("RewardPart::function", &[], &name, weight)?;
        Ok(RewardPart {
            name,
            weight,
            source: RewardSource::Function(f),
        })
    }

    /// A reward model with `weight` (finite), named `name`.
    pub fn model(name: impl Into<String>, scorer: RewardModelScorer, weight: f64) -> Result<Self> {
        let name = name.into();
        check_part("RewardPart::model", &[], &name, weight)?;
        Ok(RewardPart {
            name,
            weight,
            source: RewardSource::Model(Box::new(scorer)),
        })
    }

    /// Its name (what its mean is logged under).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its weight.
    pub fn weight(&self) -> f64 {
        self.weight
    }

    /// What it runs.
    pub fn source(&self) -> &RewardSource {
        &self.source
    }

    /// What it runs, to call or adjust directly.
    pub fn source_mut(&mut self) -> &mut RewardSource {
        &mut self.source
    }
}

/// The [`Scorer`] over [`RewardPart`]s: for each batch it decodes prompts and responses with
/// its tokenizer (special tokens skipped), looks up each prompt's dataset row by its token ids
/// (a prompt not in the table gets no fields), runs every part — functions on the
/// [`RewardSample`]s, reward models on the batch's tokens — and returns the weighted
/// NaN-skipping sum as a `[B]` float tensor on the tokens' device. [`RewardScorer::last_means`]
/// gives each part's mean over the last batch.
///
/// `completion_ids` are the response's tokens plus the EOS that ended it (TRL's
/// `completion_ids` count it), the EOS id being the tokenizer's unless
/// [`RewardScorer::with_eos_token_id`]; a response cut at the length limit has none.
///
/// ```
/// use serde_json::{json, Map};
/// use tch::{Device, Kind, Tensor};
/// use torchrl::envs::llm::rewards::{
///     AnswerMatch, Compare, Extraction, RewardPart, RewardScorer, SoftOverlongPunishment,
/// };
/// use torchrl::envs::llm::{ScoreInput, Scorer};
/// use torchrl::modules::llm::{ByteTokenizer, TextTokenizer};
/// # fn main() -> torchrl::Result<()> {
/// let tok = ByteTokenizer::new();
/// let q = tok.encode("2+2=")?;
/// let mut row = Map::new();
/// row.insert("answer".into(), json!(4));
/// let mut scorer = RewardScorer::new(
///     tok,
///     vec![
///         RewardPart::function(AnswerMatch::new("answer", Extraction::LastNumber, Compare::Exact), 1.0)?,
///         RewardPart::function(SoftOverlongPunishment::new(4, 2)?, 1.0)?,
///     ],
/// )?
/// .with_rows([(q.clone(), row)])?;
/// let (r1, r2) = (tok.encode("4")?, tok.encode("five")?);
/// let tokens = Tensor::zeros([2, 8], (Kind::Int64, Device::Cpu));
/// let input = ScoreInput {
///     prompts: &[q.clone(), q],
///     responses: &[r1, r2],
///     ended_with_eos: &[true, false],
///     tokens: &tokens,
///     attention_mask: &tokens,
///     batch_size: 2,
/// };
/// let score = scorer.score(&input)?;
/// // "4" + EOS = 2 tokens: 1 + 0; "five" = 4 tokens: 0 + (2 - 4) / 2
/// assert_eq!(Vec::<f32>::try_from(&score)?, vec![1.0, -1.0]);
/// assert_eq!(scorer.last_means()[0], ("answer_match", 0.5));
/// # Ok(()) }
/// ```
pub struct RewardScorer<T> {
    tokenizer: T,
    parts: Vec<RewardPart>,
    rows: Vec<Map<String, Value>>,
    rows_given: usize,
    index: HashMap<Vec<i64>, usize>,
    empty: Map<String, Value>,
    eos: Option<i64>,
    special: SpecialTokens,
    last_means: Vec<f64>,
}

impl<T> fmt::Debug for RewardScorer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RewardScorer")
            .field("parts", &self.parts)
            .field("rows", &self.rows.len())
            .field("eos", &self.eos)
            .finish_non_exhaustive()
    }
}

impl<T: TextTokenizer> RewardScorer<T> {
    /// Scores with `parts` (at least one, names unique), decoding with `tokenizer`; no dataset
    /// rows yet.
    pub fn new(tokenizer: T, parts: Vec<RewardPart>) -> Result<Self> {
        const OP: &str = "RewardScorer::new";
        if parts.is_empty() {
            return Err(Error::argument(
                OP,
                "parts",
                "at least one reward part",
                "none",
            ));
        }
        for (i, p) in parts.iter().enumerate() {
            let before: Vec<&str> = parts.iter().take(i).map(|q| q.name.as_str()).collect();
            check_part(OP, &before, &p.name, p.weight)?;
        }
        let eos = tokenizer.eos_token_id();
        let n = parts.len();
        Ok(RewardScorer {
            tokenizer,
            parts,
            rows: Vec::new(),
            rows_given: 0,
            index: HashMap::new(),
            empty: Map::new(),
            eos,
            special: SpecialTokens::Skip,
            last_means: vec![f64::NAN; n],
        })
    }

    /// Adds dataset rows: each prompt's token ids (exactly as the env serves them, without
    /// padding) with the row's other columns. The same ids twice with equal fields is one row;
    /// with different fields it is an error naming both rows (counted from 0 over every call).
    pub fn with_rows(
        mut self,
        rows: impl IntoIterator<Item = (Vec<i64>, Map<String, Value>)>,
    ) -> Result<Self> {
        for (ids, fields) in rows {
            let seen = self.rows_given;
            self.rows_given += 1;
            if let Some(&j) = self.index.get(&ids) {
                let known = self.rows.get(j).cloned().unwrap_or_default();
                if known != fields {
                    return Err(Error::invalid(
                        "RewardScorer::with_rows",
                        format!(
                            "rows {j} and {seen} have the same prompt token ids but different \
                             fields: {} vs {}",
                            Value::Object(known),
                            Value::Object(fields)
                        ),
                    ));
                }
            } else {
                self.index.insert(ids, self.rows.len());
                self.rows.push(fields);
            }
        }
        Ok(self)
    }

    /// [`RewardScorer::with_rows`] with prompts as text, encoded with the tokenizer (only
    /// right when the env's prompts are that same plain encoding, no chat template or BOS).
    pub fn with_text_rows<'s>(
        self,
        rows: impl IntoIterator<Item = (&'s str, Map<String, Value>)>,
    ) -> Result<Self> {
        let mut encoded = Vec::new();
        for (text, fields) in rows {
            encoded.push((self.tokenizer.encode(text)?, fields));
        }
        self.with_rows(encoded)
    }

    /// Uses `eos` as the id appended to `completion_ids` of responses that ended with EOS.
    pub fn with_eos_token_id(mut self, eos: i64) -> Self {
        self.eos = Some(eos);
        self
    }

    /// Keeps (or skips, the default) special tokens in the decoded text.
    pub fn with_special_tokens(mut self, special: SpecialTokens) -> Self {
        self.special = special;
        self
    }

    /// The fields of the row whose prompt is `ids`, if any.
    pub fn fields(&self, ids: &[i64]) -> Option<&Map<String, Value>> {
        self.index.get(ids).and_then(|&i| self.rows.get(i))
    }

    /// The parts.
    pub fn parts(&self) -> &[RewardPart] {
        &self.parts
    }

    /// Each part's name and mean score over the last batch (NaN samples skipped; NaN before
    /// the first batch), in order.
    pub fn last_means(&self) -> Vec<(&str, f64)> {
        self.parts
            .iter()
            .map(|p| p.name.as_str())
            .zip(self.last_means.iter().copied())
            .collect()
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &T {
        &self.tokenizer
    }
}

impl<T: TextTokenizer> Scorer for RewardScorer<T> {
    fn score(&mut self, input: &ScoreInput<'_>) -> Result<Tensor> {
        const OP: &str = "RewardScorer::score";
        check_lists(OP, input)?;
        let n = input.prompts.len();
        let mut prompts = Vec::with_capacity(n);
        let mut completions = Vec::with_capacity(n);
        let mut ids = Vec::with_capacity(n);
        for ((p, r), &eos) in input
            .prompts
            .iter()
            .zip(input.responses)
            .zip(input.ended_with_eos)
        {
            prompts.push(self.tokenizer.decode(p, self.special)?);
            completions.push(self.tokenizer.decode(r, self.special)?);
            let mut c = r.clone();
            if let (true, Some(e)) = (eos, self.eos) {
                c.push(e);
            }
            ids.push(c);
        }
        let samples: Vec<RewardSample<'_>> = (0..n)
            .filter_map(|i| {
                Some(RewardSample {
                    prompt: prompts.get(i)?,
                    completion: completions.get(i)?,
                    completion_ids: ids.get(i)?,
                    fields: input
                        .prompts
                        .get(i)
                        .and_then(|p| self.index.get(p))
                        .and_then(|&j| self.rows.get(j))
                        .unwrap_or(&self.empty),
                })
            })
            .collect();
        let mut columns = Vec::with_capacity(self.parts.len());
        for part in &mut self.parts {
            let name = part.name.clone();
            let col = match &mut part.source {
                RewardSource::Function(f) => f.score(&samples),
                RewardSource::Model(m) => m.score(input).and_then(|t| {
                    let t = t
                        .f_to_kind(Kind::Double)?
                        .f_to_device(Device::Cpu)?
                        .f_reshape([-1])?;
                    let v = Vec::<f64>::try_from(&t)?;
                    // a model has no "does not apply": NaN there is a broken model
                    match v.iter().position(|x| !x.is_finite()) {
                        Some(i) => Err(Error::InvalidValue {
                            op: OP,
                            what: "sample",
                            key: i.to_string(),
                            expected: "a finite reward-model score".into(),
                            got: v.get(i).copied().unwrap_or(f64::NAN).to_string(),
                        }),
                        None => Ok(v),
                    }
                }),
            }
            .with_context(|| format!("reward part {name:?}"))?;
            columns.push(col);
        }
        let names: Vec<&str> = self.parts.iter().map(|p| p.name.as_str()).collect();
        let weights: Vec<f64> = self.parts.iter().map(|p| p.weight).collect();
        let (total, means) = combine(OP, &names, &weights, &columns, n)?;
        self.last_means = means;
        from_values(&total, input)
    }
}
