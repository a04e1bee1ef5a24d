//! Rewards without Python: checkable-answer rewards for GRPO / PPO-RLHF (TRL's `reward_funcs`
//! with `reward_weights`, `trl/rewards/`), an external scorer program, and the [`Scorer`] that
//! combines them with reward models for [`TokenEnv`](super::env::TokenEnv).
//!
//! A [`RewardFunction`] scores a batch of [`RewardSample`]s (the decoded prompt and completion,
//! the completion's token ids, and the dataset row's other columns as `fields`, TRL's
//! `**kwargs`). The built-ins:
//!
//! - [`AnswerMatch`]: extracts an answer from the completion with an [`Extraction`] (the whole
//!   trimmed text, the last number, a regex's capture group, `\boxed{…}`, the text after a
//!   marker such as GSM8K's `####`) and compares it with a field of the row ([`Compare`]: exact
//!   text, or numbers within a tolerance); 1.0 or 0.0;
//! - [`FormatCheck`]: 1.0 when the completion matches a regex in full ([`FormatCheck::think`] is
//!   TRL's `think_format_reward`);
//! - [`SoftOverlongPunishment`] (TRL's `get_soft_overlong_punishment`, DAPO's eq. 13) and
//!   [`RepetitionPenalty`] (TRL's `get_repetition_penalty_reward`) on completion token ids;
//! - [`CommandReward`]: any program that reads JSON lines on stdin and prints one score per line;
//! - [`WeightedSum`]: several functions with weights (TRL's `reward_weights`).
//!
//! [`RewardScorer`] is the [`Scorer`]: it decodes each batch with a [`TextTokenizer`], finds
//! each prompt's dataset row by its token ids, runs every [`RewardPart`] (a function or a
//! [`RewardModelScorer`]) and returns the weighted sum. [`RewardsConfig`] is the TOML form
//! (`[[reward]]` tables) and [`build_parts`] turns it into parts.
//!
//! # Missing scores (TRL's `None`)
//! A function may return `NaN` for a sample it does not apply to (TRL turns a reward
//! function's `None` into NaN). Combined sums skip NaN parts (TRL's `nansum` over
//! `rewards_per_func * reward_weights`) and per-part means skip NaN samples (TRL's logged
//! `nanmean`); a sample that **every** part skipped is an error, since the env needs a number
//! for every sample (TRL marks such a row unscorable and zeroes its advantage). An infinite
//! score, or a function returning the wrong number of scores, is an error naming the function.
//!
//! ```
//! use serde_json::{json, Map, Value};
//! use torchrl::envs::llm::rewards::{
//!     AnswerMatch, Compare, Extraction, FormatCheck, RewardFunction, RewardSample, WeightedSum,
//! };
//! # fn main() -> torchrl::Result<()> {
//! let mut fields = Map::new();
//! fields.insert("answer".into(), json!("Natalia sold 48 / 2 = 24 clips in May. #### 72"));
//! let sample = |completion: &'static str| RewardSample {
//!     prompt: "How many clips?",
//!     completion,
//!     completion_ids: &[],
//!     fields: &fields,
//! };
//! let accuracy = AnswerMatch::new("answer", Extraction::LastNumber, Compare::numeric(1e-6)?)
//!     .with_reference_extraction(Extraction::After("####".into()));
//! let mut reward = WeightedSum::new()
//!     .with(accuracy, 1.0)?
//!     .with(FormatCheck::think()?, 0.5)?;
//! let scores = reward.score(&[
//!     sample("<think>48 + 24</think> She sold 72 clips."),
//!     sample("She sold 72."),
//!     sample("<think>hmm</think> 70"),
//! ])?;
//! assert_eq!(scores, vec![1.5, 1.0, 0.5]);
//! assert_eq!(reward.last_means()[0], ("answer_match", 2.0 / 3.0));
//! # Ok(()) }
//! ```

use std::collections::HashMap;
use std::fmt;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::str::FromStr;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use tch::{Device, Kind, Tensor};

use super::scorer::{check_lists, from_values, RewardModelScorer, ScoreInput, Scorer};
use crate::error::{Error, Result, ResultExt};
use crate::modules::llm::{CausalLmWithScoreHead, SpecialTokens, TextTokenizer};

// ------------------------------------------------------------------ the trait

/// One (prompt, completion) pair as a [`RewardFunction`] sees it (TRL passes `prompts`,
/// `completions`, `completion_ids` and the dataset's other columns as keyword arguments).
///
/// ```
/// use serde_json::{json, Map};
/// use torchrl::envs::llm::rewards::RewardSample;
/// let mut fields = Map::new();
/// fields.insert("answer".into(), json!("42"));
/// let s = RewardSample { prompt: "6*7=", completion: "42", completion_ids: &[52, 50], fields: &fields };
/// assert_eq!(s.fields["answer"], "42");
/// assert_eq!(s.completion_ids.len(), 2);
/// ```
#[derive(Debug, Clone, Copy)]
pub struct RewardSample<'a> {
    /// The prompt's text.
    pub prompt: &'a str,
    /// The completion's text (in [`RewardScorer`]: decoded with special tokens skipped, so
    /// without its EOS).
    pub completion: &'a str,
    /// The completion's token ids (in [`RewardScorer`]: with the EOS that ended it, as TRL's
    /// `completion_ids`).
    pub completion_ids: &'a [i64],
    /// The dataset row's other columns (`"answer"`, `"solution"`, …); empty when none.
    pub fields: &'a Map<String, Value>,
}

/// Scores a batch of [`RewardSample`]s: one `f64` per sample, in order; `NaN` means "does not
/// apply to this sample" (TRL's `None`, see the [module docs](self)).
///
/// ```
/// use serde_json::Map;
/// use torchrl::envs::llm::rewards::{RewardFunction, RewardSample};
/// /// 1.0 when the completion is short.
/// struct Short;
/// impl RewardFunction for Short {
///     fn name(&self) -> &str {
///         "short"
///     }
///     fn score(&mut self, samples: &[RewardSample<'_>]) -> torchrl::Result<Vec<f64>> {
///         Ok(samples.iter().map(|s| f64::from(u8::from(s.completion.len() < 10))).collect())
///     }
/// }
/// let fields = Map::new();
/// let s = RewardSample { prompt: "", completion: "ok", completion_ids: &[], fields: &fields };
/// assert_eq!(Short.score(&[s]).unwrap(), vec![1.0]);
/// ```
pub trait RewardFunction: Send {
    /// The name its mean is logged under (TRL logs `rewards/{name}/mean`).
    fn name(&self) -> &str;
    /// One score per sample, in order.
    fn score(&mut self, samples: &[RewardSample<'_>]) -> Result<Vec<f64>>;
}

impl fmt::Debug for dyn RewardFunction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RewardFunction({:?})", self.name())
    }
}

// ------------------------------------------------------------------ extraction

/// How an answer is taken out of a text. Written in configs as a string: `"trimmed"`,
/// `"last_number"`, `"boxed"`, `"after:MARKER"`, `"regex:PATTERN"` ([`FromStr`] /
/// [`Display`](fmt::Display) are each other's inverse).
///
/// ```
/// use torchrl::envs::llm::rewards::Extraction;
/// # fn main() -> torchrl::Result<()> {
/// let text = r"so 1,234 - 5 = \boxed{\frac{1}{2}} #### -1,229.5 ";
/// assert_eq!(Extraction::LastNumber.extract(text)?.as_deref(), Some("-1229.5"));
/// assert_eq!(Extraction::Boxed.extract(text)?.as_deref(), Some(r"\frac{1}{2}"));
/// assert_eq!("after:####".parse::<Extraction>()?.extract(text)?.as_deref(), Some("-1,229.5"));
/// assert_eq!(Extraction::regex(r"so (\d+)")?.extract(text)?.as_deref(), Some("1"));
/// assert_eq!(Extraction::Trimmed.extract("  x ")?.as_deref(), Some("x"));
/// assert_eq!(Extraction::LastNumber.extract("no digits")?, None);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub enum Extraction {
    /// The whole text, trimmed; `None` when that is empty.
    Trimmed,
    /// The last number in the text: an optional `-` (a sign only when not right after a letter
    /// or digit, so `5-3` gives `3`), digits with optional `,` thousands separators
    /// (`1,234`), an optional decimal part. Returned without separators (`-1234.5`).
    LastNumber,
    /// The content of the last balanced `\boxed{…}` (nested braces allowed), trimmed.
    Boxed,
    /// The text after the last occurrence of the marker, trimmed (GSM8K's `####`); `None`
    /// when the marker is absent or nothing follows it.
    After(String),
    /// Capture group 1 of the regex's **last** match in the text, trimmed (`None` when the
    /// regex does not match or group 1 did not take part). Build with [`Extraction::regex`].
    Regex(fancy_regex::Regex),
}

impl fmt::Debug for Extraction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Extraction({self})")
    }
}

impl fmt::Display for Extraction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Extraction::Trimmed => f.write_str("trimmed"),
            Extraction::LastNumber => f.write_str("last_number"),
            Extraction::Boxed => f.write_str("boxed"),
            Extraction::After(m) => write!(f, "after:{m}"),
            Extraction::Regex(r) => write!(f, "regex:{}", r.as_str()),
        }
    }
}

impl PartialEq for Extraction {
    fn eq(&self, other: &Self) -> bool {
        self.to_string() == other.to_string()
    }
}

impl FromStr for Extraction {
    type Err = Error;

    /// Parses `"trimmed"`, `"last_number"`, `"boxed"`, `"after:MARKER"` (non-empty marker) or
    /// `"regex:PATTERN"` (a pattern with at least one capture group).
    fn from_str(s: &str) -> Result<Self> {
        const OP: &str = "Extraction::from_str";
        const EXPECTED: &str = "\"trimmed\", \"last_number\", \"boxed\", \"after:MARKER\" or \
                                \"regex:PATTERN\"";
        match s {
            "trimmed" => Ok(Extraction::Trimmed),
            "last_number" => Ok(Extraction::LastNumber),
            "boxed" => Ok(Extraction::Boxed),
            _ => {
                if let Some(marker) = s.strip_prefix("after:") {
                    if marker.is_empty() {
                        return Err(Error::argument(
                            OP,
                            "extraction",
                            "a non-empty marker after \"after:\"",
                            format!("{s:?}"),
                        ));
                    }
                    Ok(Extraction::After(marker.to_string()))
                } else if let Some(pattern) = s.strip_prefix("regex:") {
                    Extraction::regex(pattern)
                } else {
                    Err(Error::argument(
                        OP,
                        "extraction",
                        EXPECTED,
                        format!("{s:?}"),
                    ))
                }
            }
        }
    }
}

/// A run of digits and `,`-separated digit groups with an optional decimal part, the sign
/// before it optional: what [`Extraction::LastNumber`] looks at.
fn number_regex() -> Result<regex::Regex> {
    regex::Regex::new(r"-?\d+(?:,\d+)*(?:\.\d+)?")
        .map_err(|e| Error::invalid("Extraction::LastNumber", e.to_string()))
}

/// Compiles `pattern` (fancy-regex syntax: look-around allowed), naming `what` on error.
fn compile(op: &'static str, what: &str, pattern: &str) -> Result<fancy_regex::Regex> {
    fancy_regex::Regex::new(pattern).map_err(|e| {
        Error::argument(
            op,
            what,
            "a valid regular expression",
            format!("{pattern:?} ({e})"),
        )
    })
}

impl Extraction {
    /// [`Extraction::Regex`] from `pattern`, which needs at least one capture group (group 1 is
    /// the answer). Errors on an invalid pattern or one without a group.
    pub fn regex(pattern: &str) -> Result<Self> {
        const OP: &str = "Extraction::regex";
        let re = compile(OP, "pattern", pattern)?;
        if re.captures_len() < 2 {
            return Err(Error::argument(
                OP,
                "pattern",
                "a regular expression with a capture group (group 1 is the answer)",
                format!("{pattern:?}"),
            ));
        }
        Ok(Extraction::Regex(re))
    }

    /// The answer in `text`, or `None` when there is none. Errors only when a regex gives up
    /// (fancy-regex's backtracking limit).
    pub fn extract(&self, text: &str) -> Result<Option<String>> {
        let non_empty = |s: &str| {
            let s = s.trim();
            (!s.is_empty()).then(|| s.to_string())
        };
        Ok(match self {
            Extraction::Trimmed => non_empty(text),
            Extraction::LastNumber => last_number(text)?,
            Extraction::Boxed => last_boxed(text).and_then(non_empty),
            Extraction::After(marker) => text
                .rfind(marker.as_str())
                .and_then(|i| text.get(i + marker.len()..))
                .and_then(non_empty),
            Extraction::Regex(re) => {
                let mut last = None;
                for caps in re.captures_iter(text) {
                    let caps = caps.map_err(|e| {
                        Error::invalid(
                            "Extraction::extract",
                            format!("regex {:?} failed: {e}", re.as_str()),
                        )
                    })?;
                    if let Some(m) = caps.get(1) {
                        last = Some(m.as_str());
                    }
                }
                last.and_then(non_empty)
            }
        })
    }
}

/// The last number of `text`, separators removed. A run like `1,234,567.5` is one number; a
/// run whose groups are not thousands (`12,34`, `3,4,5`) is a list, whose last item counts.
fn last_number(text: &str) -> Result<Option<String>> {
    let re = number_regex()?;
    let Some(m) = re.find_iter(text).last() else {
        return Ok(None);
    };
    let s = m.as_str();
    let (sign, body) = match s.strip_prefix('-') {
        // `5-3`: a minus right after a letter or digit is no sign
        Some(rest)
            if text
                .get(..m.start())
                .and_then(|b| b.chars().last())
                .is_some_and(char::is_alphanumeric) =>
        {
            ("", rest)
        }
        Some(rest) => ("-", rest),
        None => ("", s),
    };
    let int = body.split('.').next().unwrap_or_default();
    let mut groups = int.split(',');
    let first = groups.next().unwrap_or_default();
    let thousands = first.len() <= 3 && groups.all(|g| g.len() == 3);
    Ok(Some(if thousands {
        format!("{sign}{}", body.replace(',', ""))
    } else {
        body.rsplit(',').next().unwrap_or_default().to_string()
    }))
}

/// The content of the last `\boxed{…}` whose braces balance.
fn last_boxed(text: &str) -> Option<&str> {
    const OPEN: &str = "\\boxed{";
    let mut end = text.len();
    while let Some(start) = text.get(..end).and_then(|t| t.rfind(OPEN)) {
        let body_start = start + OPEN.len();
        let mut depth = 1usize;
        for (i, c) in text.get(body_start..).unwrap_or_default().char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        return text.get(body_start..body_start + i);
                    }
                }
                _ => {}
            }
        }
        end = start;
    }
    None
}

/// Parses a number as it is written in answers: optional sign, digits with optional `,`
/// thousands separators, optional decimals and exponent (`-1,234.5`, `72`, `1e3`). `None` for
/// anything else (and for non-finite values).
///
/// ```
/// use torchrl::envs::llm::rewards::parse_number;
/// assert_eq!(parse_number(" -1,234.5 "), Some(-1234.5));
/// assert_eq!(parse_number("1e3"), Some(1000.0));
/// assert_eq!(parse_number("12,34"), None); // not a thousands grouping
/// assert_eq!(parse_number("1/2"), None);
/// ```
pub fn parse_number(text: &str) -> Option<f64> {
    let t = text.trim();
    let body = t.strip_prefix(['-', '+']).unwrap_or(t);
    let (mantissa, exponent) = match body.find(['e', 'E']) {
        Some(i) => (body.get(..i)?, Some(body.get(i + 1..)?)),
        None => (body, None),
    };
    let (int, frac) = match mantissa.split_once('.') {
        Some((i, f)) => (i, Some(f)),
        None => (mantissa, None),
    };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let int_ok = if int.contains(',') {
        let mut groups = int.split(',');
        let first = groups.next().unwrap_or_default();
        digits(first) && first.len() <= 3 && groups.all(|g| g.len() == 3 && digits(g))
    } else {
        int.is_empty() || digits(int)
    };
    let frac_ok = frac.is_none_or(digits);
    let exp_ok = exponent.is_none_or(|e| digits(e.strip_prefix(['-', '+']).unwrap_or(e)));
    if !(int_ok && frac_ok && exp_ok) || (int.is_empty() && frac.is_none()) {
        return None;
    }
    let v: f64 = t.replace(',', "").parse().ok()?;
    v.is_finite().then_some(v)
}

// ------------------------------------------------------------------ answer match

/// How [`AnswerMatch`] compares the two extracted answers.
///
/// ```
/// use torchrl::envs::llm::rewards::Compare;
/// # fn main() -> torchrl::Result<()> {
/// assert_eq!(Compare::numeric(0.01)?, Compare::Numeric { tolerance: 0.01 });
/// assert_ne!(Compare::Exact, Compare::numeric(0.0)?);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Compare {
    /// The same text (both trimmed).
    Exact,
    /// Both parse as numbers ([`parse_number`]) and `|a − b| <= tolerance` (absolute).
    Numeric {
        /// The absolute tolerance, finite and ≥ 0.
        tolerance: f64,
    },
}

impl Compare {
    /// [`Compare::Numeric`]; errors unless `tolerance` is finite and ≥ 0.
    ///
    /// ```
    /// use torchrl::envs::llm::rewards::Compare;
    /// assert!(Compare::numeric(1e-6).is_ok());
    /// assert!(Compare::numeric(-1.0).is_err());
    /// ```
    pub fn numeric(tolerance: f64) -> Result<Self> {
        if !(tolerance.is_finite() && tolerance >= 0.0) {
            return Err(Error::config(
                "Compare::numeric",
                "tolerance",
                "a finite number >= 0",
                tolerance,
            ));
        }
        Ok(Compare::Numeric { tolerance })
    }
}

/// 1.0 when the answer extracted from the completion equals the dataset field's answer, else
/// 0.0 (TRL's `accuracy_reward`, with plain extraction instead of `math_verify`).
///
/// The field's value (a JSON string or number) goes through the reference extraction
/// ([`Extraction::Trimmed`] unless [`AnswerMatch::with_reference_extraction`]). A completion
/// with no answer scores 0. A sample without the field, a field that is neither a string nor
/// a number, or (for [`Compare::Numeric`]) a reference that is not a number is an error naming
/// the field and the sample: that is a dataset bug, not a wrong answer.
///
/// ```
/// use serde_json::{json, Map};
/// use torchrl::envs::llm::rewards::{AnswerMatch, Compare, Extraction, RewardFunction, RewardSample};
/// # fn main() -> torchrl::Result<()> {
/// let mut fields = Map::new();
/// fields.insert("answer".into(), json!(0.5));
/// let s = |completion| RewardSample { prompt: "", completion, completion_ids: &[], fields: &fields };
/// let mut f = AnswerMatch::new("answer", Extraction::Boxed, Compare::numeric(1e-9)?);
/// assert_eq!(f.score(&[s(r"\boxed{0.50}"), s(r"\boxed{1/2}"), s("0.5")])?, vec![1.0, 0.0, 0.0]);
/// let empty = Map::new();
/// let err = f.score(&[RewardSample { fields: &empty, ..s("x") }]).unwrap_err();
/// assert!(err.to_string().contains("\"answer\"") && err.to_string().contains("sample 0"));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct AnswerMatch {
    name: String,
    field: String,
    extract: Extraction,
    reference: Extraction,
    compare: Compare,
}

impl AnswerMatch {
    /// Compares `extract(completion)` with the row's `field` under `compare`; named
    /// `"answer_match"`.
    pub fn new(field: impl Into<String>, extract: Extraction, compare: Compare) -> Self {
        AnswerMatch {
            name: "answer_match".into(),
            field: field.into(),
            extract,
            reference: Extraction::Trimmed,
            compare,
        }
    }

    /// Extracts the reference answer from the field's text with `reference` (GSM8K's `answer`
    /// column is a worked solution ending in `#### 72`: `Extraction::After("####")`).
    pub fn with_reference_extraction(mut self, reference: Extraction) -> Self {
        self.reference = reference;
        self
    }

    /// Renames it (for logging, and to tell two of them apart in a [`WeightedSum`]).
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// The dataset field it reads.
    pub fn field(&self) -> &str {
        &self.field
    }

    fn score_one(&self, i: usize, s: &RewardSample<'_>) -> Result<f64> {
        const OP: &str = "AnswerMatch::score";
        let field = || format!("{:?} of sample {i}", self.field);
        let value = s.fields.get(&self.field).ok_or_else(|| {
            let mut keys: Vec<&str> = s.fields.keys().map(String::as_str).collect();
            keys.sort_unstable();
            Error::InvalidValue {
                op: OP,
                what: "field",
                key: field(),
                expected: "the field in the sample's dataset row".into(),
                got: format!("a row with fields {keys:?}"),
            }
        })?;
        let text = match value {
            Value::String(s) => s.clone(),
            Value::Number(n) => n.to_string(),
            other => {
                return Err(Error::InvalidValue {
                    op: OP,
                    what: "field",
                    key: field(),
                    expected: "a string or a number".into(),
                    got: other.to_string(),
                })
            }
        };
        let reference = self
            .reference
            .extract(&text)?
            .ok_or_else(|| Error::InvalidValue {
                op: OP,
                what: "field",
                key: field(),
                expected: format!("a reference answer under extraction {}", self.reference),
                got: format!("{text:?}"),
            })?;
        let Some(answer) = self.extract.extract(s.completion)? else {
            return Ok(0.0);
        };
        let hit = match self.compare {
            Compare::Exact => answer.trim() == reference.trim(),
            Compare::Numeric { tolerance } => {
                let r = parse_number(&reference).ok_or_else(|| Error::InvalidValue {
                    op: OP,
                    what: "field",
                    key: field(),
                    expected: "a number (compare = numeric)".into(),
                    got: format!("{reference:?}"),
                })?;
                parse_number(&answer).is_some_and(|a| (a - r).abs() <= tolerance)
            }
        };
        Ok(if hit { 1.0 } else { 0.0 })
    }
}

impl RewardFunction for AnswerMatch {
    fn name(&self) -> &str {
        &self.name
    }

    fn score(&mut self, samples: &[RewardSample<'_>]) -> Result<Vec<f64>> {
        samples
            .iter()
            .enumerate()
            .map(|(i, s)| self.score_one(i, s))
            .collect()
    }
}

// ------------------------------------------------------------------ format

/// TRL's `think_format_reward` pattern, anchored in full: `<think>` first, no second
/// `<think>`, a `</think>` later, anything after.
///
/// ```
/// use torchrl::envs::llm::rewards::{FormatCheck, THINK_FORMAT};
/// # fn main() -> torchrl::Result<()> {
/// assert_eq!(FormatCheck::think()?.pattern(), THINK_FORMAT);
/// # Ok(()) }
/// ```
pub const THINK_FORMAT: &str = r"(?s)<think>(?!.*<think>).*?</think>.*";

/// 1.0 when the completion matches the regex **in full** (the pattern is wrapped as
/// `\A(?:pattern)\z`; put flags such as `(?s)` in the pattern), else 0.0. Patterns use
/// fancy-regex syntax, so look-around works; a match that exceeds fancy-regex's backtracking
/// limit is an error naming the sample.
///
/// ```
/// use serde_json::Map;
/// use torchrl::envs::llm::rewards::{FormatCheck, RewardFunction, RewardSample};
/// # fn main() -> torchrl::Result<()> {
/// let fields = Map::new();
/// let s = |completion| RewardSample { prompt: "", completion, completion_ids: &[], fields: &fields };
/// let mut think = FormatCheck::think()?; // TRL's think_format_reward
/// let ok = "<think>\nreasoning\n</think>\nanswer";
/// assert_eq!(think.score(&[s(ok), s("<think>no end"), s(" <think>x</think>")])?, vec![1.0, 0.0, 0.0]);
/// let mut digits = FormatCheck::new(r"\d+")?;
/// assert_eq!(digits.score(&[s("42"), s("42!")])?, vec![1.0, 0.0]);
/// assert!(FormatCheck::new("(unclosed").is_err());
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct FormatCheck {
    name: String,
    pattern: String,
    re: fancy_regex::Regex,
}

impl FormatCheck {
    /// Checks completions against `pattern` (in full); named `"format"`. Errors on an invalid
    /// pattern.
    pub fn new(pattern: &str) -> Result<Self> {
        let re = compile(
            "FormatCheck::new",
            "pattern",
            &format!(r"\A(?:{pattern})\z"),
        )?;
        // a pattern like `a)|(b` compiles once wrapped only by closing our group: refuse it
        compile("FormatCheck::new", "pattern", pattern)?;
        Ok(FormatCheck {
            name: "format".into(),
            pattern: pattern.to_string(),
            re,
        })
    }

    /// TRL's `think_format_reward` ([`THINK_FORMAT`]), named `"think_format_reward"`.
    pub fn think() -> Result<Self> {
        Ok(FormatCheck::new(THINK_FORMAT)?.with_name("think_format_reward"))
    }

    /// Renames it.
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// The pattern as given.
    pub fn pattern(&self) -> &str {
        &self.pattern
    }
}

impl RewardFunction for FormatCheck {
    fn name(&self) -> &str {
        &self.name
    }

    fn score(&mut self, samples: &[RewardSample<'_>]) -> Result<Vec<f64>> {
        samples
            .iter()
            .enumerate()
            .map(|(i, s)| match self.re.is_match(s.completion) {
                Ok(m) => Ok(if m { 1.0 } else { 0.0 }),
                Err(e) => Err(Error::invalid(
                    "FormatCheck::score",
                    format!("pattern {:?} failed on sample {i}: {e}", self.pattern),
                )),
            })
            .collect()
    }
}

// ------------------------------------------------------------------ length penalties

/// TRL's `get_soft_overlong_punishment(max_completion_len, soft_punish_cache)` (DAPO, eq. 13)
/// on the number `L` of completion token ids: 0 while `L <= max − cache`, then
/// `(max − cache − L) / cache` down to −1 at `L = max`, and −1 beyond. Named
/// `"soft_overlong_punishment_reward"` as TRL's.
///
/// ```
/// use serde_json::Map;
/// use torchrl::envs::llm::rewards::{RewardFunction, RewardSample, SoftOverlongPunishment};
/// # fn main() -> torchrl::Result<()> {
/// let fields = Map::new();
/// let ids = vec![1_i64; 101];
/// let s = |n: usize| RewardSample { prompt: "", completion: "", completion_ids: &ids[..n], fields: &fields };
/// let mut f = SoftOverlongPunishment::new(100, 20)?;
/// assert_eq!(f.score(&[s(80), s(90), s(100), s(101)])?, vec![0.0, -0.5, -1.0, -1.0]);
/// assert!(SoftOverlongPunishment::new(10, 11).is_err());
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct SoftOverlongPunishment {
    name: String,
    max_completion_len: usize,
    soft_punish_cache: usize,
}

impl SoftOverlongPunishment {
    /// The punishment for `max_completion_len` (`L_max`) and `soft_punish_cache`
    /// (`L_cache`); errors when `soft_punish_cache > max_completion_len`.
    pub fn new(max_completion_len: usize, soft_punish_cache: usize) -> Result<Self> {
        if soft_punish_cache > max_completion_len {
            return Err(Error::config(
                "SoftOverlongPunishment::new",
                "soft_punish_cache",
                format!("at most max_completion_len ({max_completion_len})"),
                soft_punish_cache,
            ));
        }
        Ok(SoftOverlongPunishment {
            name: "soft_overlong_punishment_reward".into(),
            max_completion_len,
            soft_punish_cache,
        })
    }

    /// Renames it.
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// The score of a completion of `len` tokens.
    pub fn value(&self, len: usize) -> f64 {
        let start = self.max_completion_len - self.soft_punish_cache;
        if len <= start {
            0.0
        } else if len <= self.max_completion_len {
            // exact in f64 for any realistic length, as Python's int / int
            (start as f64 - len as f64) / self.soft_punish_cache as f64
        } else {
            -1.0
        }
    }
}

impl RewardFunction for SoftOverlongPunishment {
    fn name(&self) -> &str {
        &self.name
    }

    fn score(&mut self, samples: &[RewardSample<'_>]) -> Result<Vec<f64>> {
        Ok(samples
            .iter()
            .map(|s| self.value(s.completion_ids.len()))
            .collect())
    }
}

/// TRL's `get_repetition_penalty_reward(ngram_size, max_penalty)` on completion token ids:
/// `(1 − unique n-grams / n-grams) · max_penalty`, 0 for a completion shorter than
/// `ngram_size`. Named `"repetition_penalty_reward"` as TRL's.
///
/// ```
/// use serde_json::Map;
/// use torchrl::envs::llm::rewards::{RepetitionPenalty, RewardFunction, RewardSample};
/// # fn main() -> torchrl::Result<()> {
/// let fields = Map::new();
/// let s = |ids| RewardSample { prompt: "", completion: "", completion_ids: ids, fields: &fields };
/// let mut f = RepetitionPenalty::new(2, -1.0)?;
/// assert_eq!(f.score(&[s(&[1, 2, 3, 4]), s(&[5, 5, 5, 5, 5]), s(&[7])])?, vec![0.0, -0.75, 0.0]);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct RepetitionPenalty {
    name: String,
    ngram_size: usize,
    max_penalty: f64,
}

impl RepetitionPenalty {
    /// Errors unless `ngram_size >= 1` and `max_penalty` is finite and ≤ 0.
    pub fn new(ngram_size: usize, max_penalty: f64) -> Result<Self> {
        const OP: &str = "RepetitionPenalty::new";
        crate::error::require(ngram_size >= 1, OP, "ngram_size", ">= 1", ngram_size)?;
        crate::error::require(
            max_penalty.is_finite() && max_penalty <= 0.0,
            OP,
            "max_penalty",
            "a finite number <= 0",
            max_penalty,
        )?;
        Ok(RepetitionPenalty {
            name: "repetition_penalty_reward".into(),
            ngram_size,
            max_penalty,
        })
    }

    /// Renames it.
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// The score of one completion.
    pub fn value(&self, ids: &[i64]) -> f64 {
        if ids.len() < self.ngram_size {
            return 0.0;
        }
        let total = ids.len() - self.ngram_size + 1;
        let unique: std::collections::HashSet<&[i64]> = ids.windows(self.ngram_size).collect();
        let scaling = 1.0 - unique.len() as f64 / total as f64;
        if scaling != 0.0 {
            scaling * self.max_penalty
        } else {
            0.0
        }
    }
}

impl RewardFunction for RepetitionPenalty {
    fn name(&self) -> &str {
        &self.name
    }

    fn score(&mut self, samples: &[RewardSample<'_>]) -> Result<Vec<f64>> {
        Ok(samples
            .iter()
            .map(|s| self.value(s.completion_ids))
            .collect())
    }
}

// ------------------------------------------------------------------ combining

/// The weighted NaN-skipping sum of `columns` (one per part, `n` scores each) and each part's
/// NaN-skipping mean; see the module docs.
fn combine(
    op: &'static str,
    names: &[&str],
    weights: &[f64],
    columns: &[Vec<f64>],
    n: usize,
) -> Result<(Vec<f64>, Vec<f64>)> {
    let mut total = vec![0.0; n];
    let mut seen = vec![false; n];
    let mut means = Vec::with_capacity(columns.len());
    for ((name, w), col) in names.iter().zip(weights).zip(columns) {
        if col.len() != n {
            return Err(Error::InvalidValue {
                op,
                what: "reward function",
                key: format!("{name:?}"),
                expected: format!("{n} scores (one per sample)"),
                got: format!("{} scores", col.len()),
            });
        }
        let (mut sum, mut count) = (0.0, 0usize);
        for (i, ((&v, t), s)) in col.iter().zip(&mut total).zip(&mut seen).enumerate() {
            if v.is_nan() {
                continue;
            }
            if v.is_infinite() {
                return Err(Error::InvalidValue {
                    op,
                    what: "reward function",
                    key: format!("{name:?}"),
                    expected: "finite scores (or NaN for \"does not apply\")".into(),
                    got: format!("{v} for sample {i}"),
                });
            }
            *t += w * v;
            *s = true;
            sum += v;
            count += 1;
        }
        means.push(if count == 0 {
            f64::NAN
        } else {
            sum / count as f64
        });
    }
    if let Some(i) = seen.iter().position(|s| !s) {
        return Err(Error::InvalidValue {
            op,
            what: "sample",
            key: i.to_string(),
            expected: "a score from at least one reward function".into(),
            got: format!("NaN (no score) from every one of {names:?}"),
        });
    }
    Ok((total, means))
}

/// Checks that `name` is not among `names` and `weight` is finite.
fn check_part(op: &'static str, names: &[&str], name: &str, weight: f64) -> Result<()> {
    if let Some(j) = names.iter().position(|n| *n == name) {
        return Err(Error::invalid(
            op,
            format!(
                "reward name {name:?} is already used by part {j}; give one of them another \
                 name (`with_name`, or `name = \"…\"` in the config)"
            ),
        ));
    }
    if !weight.is_finite() {
        return Err(Error::argument(
            op,
            "weight",
            format!("a finite weight for {name:?}"),
            weight.to_string(),
        ));
    }
    Ok(())
}

/// Several named [`RewardFunction`]s with weights: the NaN-skipping weighted sum per sample
/// (TRL's `reward_funcs` with `reward_weights`), and each part's NaN-skipping mean over the
/// last batch for logging ([`WeightedSum::last_means`]). Names must be unique. Itself a
/// [`RewardFunction`] named `"weighted_sum"`.
///
/// ```
/// use serde_json::Map;
/// use torchrl::envs::llm::rewards::{FormatCheck, RewardFunction, RewardSample, WeightedSum};
/// # fn main() -> torchrl::Result<()> {
/// let fields = Map::new();
/// let s = |completion| RewardSample { prompt: "", completion, completion_ids: &[], fields: &fields };
/// let mut sum = WeightedSum::new()
///     .with(FormatCheck::new("a.*")?.with_name("starts_a"), 2.0)?
///     .with(FormatCheck::new(".*z")?.with_name("ends_z"), -0.5)?;
/// assert_eq!(sum.score(&[s("abz"), s("ab"), s("z")])?, vec![1.5, 2.0, -0.5]);
/// assert_eq!(sum.last_means(), vec![("starts_a", 2.0 / 3.0), ("ends_z", 2.0 / 3.0)]);
/// assert!(sum.with(FormatCheck::new("x")?.with_name("ends_z"), 1.0).is_err()); // name taken
/// # Ok(()) }
/// ```
#[derive(Debug, Default)]
pub struct WeightedSum {
    parts: Vec<(Box<dyn RewardFunction>, f64)>,
    last_means: Vec<f64>,
}

impl WeightedSum {
    /// No parts (scores 0… until some are added; an empty sum is an error when scoring).
    pub fn new() -> Self {
        WeightedSum::default()
    }

    /// Adds `f` with `weight`; errors on a name already used or a non-finite weight.
    pub fn with(self, f: impl RewardFunction + 'static, weight: f64) -> Result<Self> {
        self.with_boxed(Box::new(f), weight)
    }

    /// [`WeightedSum::with`] for a boxed function.
    pub fn with_boxed(mut self, f: Box<dyn RewardFunction>, weight: f64) -> Result<Self> {
        let names: Vec<&str> = self.parts.iter().map(|(p, _)| p.name()).collect();
        check_part("WeightedSum::with", &names, f.name(), weight)?;
        self.parts.push((f, weight));
        self.last_means.push(f64::NAN);
        Ok(self)
    }

    /// Each part's name and mean score (NaN samples skipped; NaN before the first batch or when
    /// it skipped every sample), in the order added.
    pub fn last_means(&self) -> Vec<(&str, f64)> {
        self.parts
            .iter()
            .map(|(p, _)| p.name())
            .zip(self.last_means.iter().copied())
            .collect()
    }

    /// The number of parts.
    pub fn len(&self) -> usize {
        self.parts.len()
    }

    /// Whether it has no parts.
    pub fn is_empty(&self) -> bool {
        self.parts.is_empty()
    }
}

impl RewardFunction for WeightedSum {
    fn name(&self) -> &str {
        "weighted_sum"
    }

    fn score(&mut self, samples: &[RewardSample<'_>]) -> Result<Vec<f64>> {
        const OP: &str = "WeightedSum::score";
        if self.parts.is_empty() {
            return Err(Error::invalid(OP, "no reward functions to sum"));
        }
        let mut columns = Vec::with_capacity(self.parts.len());
        for (f, _) in &mut self.parts {
            let name = f.name().to_string();
            columns.push(
                f.score(samples)
                    .with_context(|| format!("reward function {name:?}"))?,
            );
        }
        let names: Vec<&str> = self.parts.iter().map(|(p, _)| p.name()).collect();
        let weights: Vec<f64> = self.parts.iter().map(|(_, w)| *w).collect();
        let (total, means) = combine(OP, &names, &weights, &columns, samples.len())?;
        self.last_means = means;
        Ok(total)
    }
}

// ------------------------------------------------------------------ external command

/// How many bytes of a failed command's stderr its error quotes (the end).
const STDERR_TAIL: usize = 2000;

/// An external program as a reward: spawned once per batch with `argv`, it reads one JSON
/// object per sample on stdin — `{"prompt": …, "completion": …, "completion_ids": […],
/// …fields}` (the row's fields never replace those three) — and writes one line per sample on
/// stdout, in order: a bare number (`0.5`, `-1`, `1e-3`), or a JSON object with a number
/// under `"score"` (or, without `"score"`, `"reward"`). `null` (bare or as that number) means
/// "does not apply" (TRL's `None`, NaN here). A final newline is optional; nothing else may
/// follow the last score.
///
/// Errors, each naming the command: it ran past the timeout (it is killed, on Linux with its
/// whole process group so that a `sleep` it started goes too, and waited for); it exited non-zero or by a signal (with the status and the tail of
/// its stderr); an output line is not a score, is NaN or infinite (naming the line number and
/// text), or the number of lines is not the number of samples. It never leaves a zombie:
/// every child is waited for. Stdin is written from a thread and stdout / stderr are read by
/// threads, so large batches do not deadlock.
///
/// A process per batch (and not one kept alive) keeps batches independent: a scorer that
/// crashed, hung or printed garbage leaves nothing behind for the next batch, there is no
/// framing to resync and no state leaks between batches; starting even a Python interpreter (~50 ms) is small next
/// to generating the batch. It inherits the working directory and environment.
///
/// ```
/// use std::time::Duration;
/// use serde_json::{json, Map};
/// use torchrl::envs::llm::rewards::{CommandReward, RewardFunction, RewardSample};
/// # fn main() -> torchrl::Result<()> {
/// // a scorer in sh: 1 when the completion line says "yes", else 0
/// let script = r#"while IFS= read -r l; do case "$l" in *'"completion":"yes"'*) echo 1;; *) echo '{"score": 0}';; esac; done"#;
/// let mut f = CommandReward::new(["sh", "-c", script], Duration::from_secs(5))?;
/// let mut fields = Map::new();
/// fields.insert("answer".into(), json!("yes"));
/// let s = |completion| RewardSample { prompt: "Q?", completion, completion_ids: &[], fields: &fields };
/// assert_eq!(f.score(&[s("yes"), s("no")])?, vec![1.0, 0.0]);
/// let mut failing = CommandReward::new(["sh", "-c", "echo oops >&2; exit 3"], Duration::from_secs(5))?;
/// let err = failing.score(&[s("yes")]).unwrap_err().to_string();
/// assert!(err.contains("exit status: 3") && err.contains("oops"));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct CommandReward {
    name: String,
    argv: Vec<String>,
    timeout: Duration,
}

impl CommandReward {
    /// Runs `argv` (program first) with `timeout` per batch; named `"command"`. Errors on an
    /// empty `argv` or a zero timeout.
    pub fn new<S: Into<String>>(
        argv: impl IntoIterator<Item = S>,
        timeout: Duration,
    ) -> Result<Self> {
        const OP: &str = "CommandReward::new";
        let argv: Vec<String> = argv.into_iter().map(Into::into).collect();
        if argv.first().is_none_or(|p| p.is_empty()) {
            return Err(Error::config(
                OP,
                "command",
                "a program and its arguments (a non-empty program)",
                format!("{argv:?}"),
            ));
        }
        if timeout.is_zero() {
            return Err(Error::config(OP, "timeout", "> 0", "0 s"));
        }
        Ok(CommandReward {
            name: "command".into(),
            argv,
            timeout,
        })
    }

    /// Renames it.
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// The program and its arguments.
    pub fn argv(&self) -> &[String] {
        &self.argv
    }

    /// The time a batch may take.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The input lines for `samples`.
    fn input(samples: &[RewardSample<'_>]) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        for s in samples {
            let mut obj = s.fields.clone();
            obj.insert("prompt".into(), Value::String(s.prompt.to_string()));
            obj.insert("completion".into(), Value::String(s.completion.to_string()));
            obj.insert(
                "completion_ids".into(),
                Value::Array(s.completion_ids.iter().map(|&i| Value::from(i)).collect()),
            );
            serde_json::to_writer(&mut out, &Value::Object(obj)).map_err(|e| {
                Error::invalid("CommandReward::score", format!("JSON encoding: {e}"))
            })?;
            out.push(b'\n');
        }
        Ok(out)
    }

    fn describe(&self) -> String {
        format!("{:?}", self.argv)
    }

    /// Kills the child's process group (and the child), then waits for it.
    fn kill(child: &mut Child) {
        #[cfg(target_os = "linux")]
        if let Ok(pid) = i32::try_from(child.id()) {
            // SAFETY: kill(2) with a negative pid signals the process group whose id is the
            // child's pid (the child was started as its own group leader with
            // `process_group(0)`, and is not yet waited for, so the id is not reused); it
            // touches no memory of ours.
            unsafe {
                libc::kill(-pid, libc::SIGKILL);
            }
        }
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Runs the command on `input`: its stdout, or the error.
    fn run(&self, input: Vec<u8>) -> Result<Vec<u8>> {
        const OP: &str = "CommandReward::score";
        let (program, args) = self
            .argv
            .split_first()
            .ok_or_else(|| Error::invalid(OP, "empty command"))?;
        let mut cmd = Command::new(program);
        cmd.args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        #[cfg(unix)]
        {
            use std::os::unix::process::CommandExt;
            cmd.process_group(0);
        }
        let mut child = cmd.spawn().map_err(|e| {
            Error::invalid(
                OP,
                format!("could not start command {}: {e}", self.describe()),
            )
        })?;
        let deadline = Instant::now() + self.timeout;
        let (stdin, stdout, stderr) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take());
        // stdin from a thread (a child that exits early gives EPIPE: ignored, its status says
        // what happened); stdout / stderr read to EOF by threads, so no pipe fills up
        if let Some(mut stdin) = stdin {
            std::thread::spawn(move || {
                let _ = stdin.write_all(&input);
            });
        }
        let reader = |pipe: Option<Box<dyn Read + Send>>| {
            let (tx, rx) = mpsc::channel();
            if let Some(mut pipe) = pipe {
                std::thread::spawn(move || {
                    let mut buf = Vec::new();
                    let r = pipe.read_to_end(&mut buf).map(|_| buf);
                    let _ = tx.send(r);
                });
            }
            rx
        };
        let out_rx = reader(stdout.map(|p| Box::new(p) as Box<dyn Read + Send>));
        let err_rx = reader(stderr.map(|p| Box::new(p) as Box<dyn Read + Send>));
        let timed_out = |child: &mut Child| {
            Self::kill(child);
            Error::invalid(
                OP,
                format!(
                    "command {} did not finish within the timeout of {:?}; killed",
                    self.describe(),
                    self.timeout
                ),
            )
        };
        let left = |d: Instant| d.saturating_duration_since(Instant::now());
        // stdout to EOF, then the exit status, then stderr, all before the deadline
        let stdout = match out_rx.recv_timeout(left(deadline)) {
            Ok(Ok(buf)) => buf,
            Ok(Err(e)) => {
                Self::kill(&mut child);
                return Err(Error::invalid(
                    OP,
                    format!("reading the stdout of command {}: {e}", self.describe()),
                ));
            }
            Err(mpsc::RecvTimeoutError::Timeout) => return Err(timed_out(&mut child)),
            Err(mpsc::RecvTimeoutError::Disconnected) => Vec::new(),
        };
        let status: ExitStatus = loop {
            match child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if Instant::now() >= deadline => return Err(timed_out(&mut child)),
                Ok(None) => std::thread::sleep(Duration::from_millis(2)),
                Err(e) => {
                    Self::kill(&mut child);
                    return Err(Error::invalid(
                        OP,
                        format!("waiting for command {}: {e}", self.describe()),
                    ));
                }
            }
        };
        // the child is reaped; a leftover grandchild may still hold stderr open: wait for it
        // until the deadline (at least a moment), then go without
        let grace = left(deadline).max(Duration::from_millis(50));
        let stderr = match err_rx.recv_timeout(grace) {
            Ok(Ok(buf)) => buf,
            _ => Vec::new(),
        };
        if !status.success() {
            let text = String::from_utf8_lossy(&stderr);
            let text = text.trim_end();
            let mut start = text.len().saturating_sub(STDERR_TAIL);
            while !text.is_char_boundary(start) {
                start += 1;
            }
            let tail = text.get(start..).unwrap_or_default();
            return Err(Error::invalid(
                OP,
                format!(
                    "command {} failed ({status}); the end of its stderr:\n{}{tail}",
                    self.describe(),
                    if start > 0 { "…" } else { "" }
                ),
            ));
        }
        Ok(stdout)
    }

    /// The scores in `stdout`, `n` of them.
    fn parse(&self, stdout: &[u8], n: usize) -> Result<Vec<f64>> {
        const OP: &str = "CommandReward::score";
        let text = std::str::from_utf8(stdout).map_err(|e| {
            Error::invalid(
                OP,
                format!(
                    "the output of command {} is not UTF-8: {e}",
                    self.describe()
                ),
            )
        })?;
        let text = text.strip_suffix('\n').unwrap_or(text);
        let lines: Vec<&str> = if text.is_empty() {
            Vec::new()
        } else {
            text.split('\n').collect()
        };
        let mut scores = Vec::with_capacity(n);
        for (i, raw) in lines.iter().enumerate() {
            let line = raw.strip_suffix('\r').unwrap_or(raw);
            let bad = |why: &str| {
                let shown: String = line.chars().take(200).collect();
                Error::invalid(
                    OP,
                    format!(
                        "command {}: output line {} {shown:?} {why}",
                        self.describe(),
                        i + 1
                    ),
                )
            };
            match parse_score(line) {
                Ok(v) if v.is_infinite() => return Err(bad("is infinite")),
                Ok(v) => scores.push(v),
                Err(why) => return Err(bad(why)),
            }
        }
        if scores.len() != n {
            return Err(Error::invalid(
                OP,
                format!(
                    "command {} printed {} score lines for {n} samples{}",
                    self.describe(),
                    scores.len(),
                    lines
                        .last()
                        .map(|l| format!(
                            " (last line {:?})",
                            l.chars().take(200).collect::<String>()
                        ))
                        .unwrap_or_default()
                ),
            ));
        }
        Ok(scores)
    }
}

/// One output line of a [`CommandReward`]: its score (NaN for `null`), or why it is not one.
fn parse_score(line: &str) -> std::result::Result<f64, &'static str> {
    const NOT: &str = "is not a score (a number, null, or an object with a \"score\" / \
                       \"reward\" number)";
    let t = line.trim();
    let value: Value = serde_json::from_str(t).map_err(|_| NOT)?;
    let v = match &value {
        Value::Object(o) => o.get("score").or_else(|| o.get("reward")).ok_or(NOT)?,
        v => v,
    };
    match v {
        Value::Null => Ok(f64::NAN),
        Value::Number(n) => n.as_f64().ok_or(NOT),
        _ => Err(NOT),
    }
}

impl RewardFunction for CommandReward {
    fn name(&self) -> &str {
        &self.name
    }

    fn score(&mut self, samples: &[RewardSample<'_>]) -> Result<Vec<f64>> {
        if samples.is_empty() {
            return Ok(Vec::new());
        }
        let stdout = self.run(Self::input(samples)?)?;
        self.parse(&stdout, samples.len())
    }
}

// ------------------------------------------------------------------ the scorer

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

// ------------------------------------------------------------------ config

fn default_weight() -> f64 {
    1.0
}
fn default_extract() -> String {
    "trimmed".into()
}
fn default_compare() -> String {
    "exact".into()
}
fn default_timeout() -> f64 {
    60.0
}

/// One `[[reward]]` table of a [`RewardsConfig`], tagged by `type`. Every entry takes an
/// optional `name` (the default is the function's) and `weight` (default 1.0).
///
/// ```
/// use torchrl::envs::llm::rewards::{RewardEntry, RewardsConfig};
/// # fn main() -> torchrl::Result<()> {
/// let cfg = RewardsConfig::from_toml_str(
///     r#"
/// [[reward]]
/// type = "answer_match"
/// field = "answer"
/// extract = "last_number"
/// reference_extract = "after:####"
/// compare = "numeric"
///
/// [[reward]]
/// type = "soft_overlong"
/// max_completion_len = 256
/// soft_punish_cache = 32
/// weight = 0.5
/// "#,
/// )?;
/// assert!(matches!(&cfg.reward[1], RewardEntry::SoftOverlong { max_completion_len: 256, .. }));
/// let err = RewardsConfig::from_toml_str("[[reward]]\ntype = \"format\"\npatern = \"x\"").unwrap_err();
/// assert!(err.to_string().contains("reward[0]") && err.to_string().contains("patern"));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum RewardEntry {
    /// [`AnswerMatch`].
    AnswerMatch {
        /// Its name (default `"answer_match"`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        name: Option<String>,
        /// The dataset field holding the reference answer.
        field: String,
        /// The completion's [`Extraction`] (default `"trimmed"`).
        #[serde(default = "default_extract")]
        extract: String,
        /// The reference's [`Extraction`] (default `"trimmed"`).
        #[serde(default = "default_extract")]
        reference_extract: String,
        /// `"exact"` (default) or `"numeric"`.
        #[serde(default = "default_compare")]
        compare: String,
        /// The absolute tolerance of `compare = "numeric"` (default 1e-6; not allowed with
        /// `"exact"`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tolerance: Option<f64>,
        /// Its weight (default 1.0).
        #[serde(default = "default_weight")]
        weight: f64,
    },
    /// [`FormatCheck::new`] with `pattern`.
    Format {
        /// Its name (default `"format"`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        name: Option<String>,
        /// The regex the whole completion must match.
        pattern: String,
        /// Its weight (default 1.0).
        #[serde(default = "default_weight")]
        weight: f64,
    },
    /// [`FormatCheck::think`] (TRL's `think_format_reward`).
    ThinkFormat {
        /// Its name (default `"think_format_reward"`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        name: Option<String>,
        /// Its weight (default 1.0).
        #[serde(default = "default_weight")]
        weight: f64,
    },
    /// [`SoftOverlongPunishment`].
    SoftOverlong {
        /// Its name (default `"soft_overlong_punishment_reward"`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        name: Option<String>,
        /// `L_max`, in tokens.
        max_completion_len: usize,
        /// `L_cache`, in tokens (≤ `max_completion_len`).
        soft_punish_cache: usize,
        /// Its weight (default 1.0).
        #[serde(default = "default_weight")]
        weight: f64,
    },
    /// [`RepetitionPenalty`].
    RepetitionPenalty {
        /// Its name (default `"repetition_penalty_reward"`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        name: Option<String>,
        /// The n-gram size (≥ 1).
        ngram_size: usize,
        /// The penalty of a fully repetitive completion (≤ 0).
        max_penalty: f64,
        /// Its weight (default 1.0).
        #[serde(default = "default_weight")]
        weight: f64,
    },
    /// [`CommandReward`].
    Command {
        /// Its name (default `"command"`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        name: Option<String>,
        /// The program and its arguments.
        command: Vec<String>,
        /// Seconds a batch may take (default 60).
        #[serde(default = "default_timeout")]
        timeout_s: f64,
        /// Its weight (default 1.0).
        #[serde(default = "default_weight")]
        weight: f64,
    },
    /// A [`RewardModelScorer`] on a [`CausalLmWithScoreHead::from_pretrained`] folder.
    RewardModel {
        /// Its name (default: the folder's name, as TRL names a model by its id).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        name: Option<String>,
        /// The folder (`config.json`, `model.safetensors`).
        path: PathBuf,
        /// Clip the scores to `[-clip, clip]` (trlX's `cliprange_reward`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        clip: Option<f64>,
        /// Its weight (default 1.0).
        #[serde(default = "default_weight")]
        weight: f64,
    },
}

/// The rewards section of a TOML config: `[[reward]]` tables ([`RewardEntry`]).
///
/// ```
/// use torchrl::envs::llm::rewards::RewardsConfig;
/// # fn main() -> torchrl::Result<()> {
/// let cfg = RewardsConfig::from_toml_str("[[reward]]\ntype = \"think_format\"\nweight = 0.2\n")?;
/// let parts = cfg.build(tch::Device::Cpu)?;
/// assert_eq!((parts[0].name(), parts[0].weight()), ("think_format_reward", 0.2));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RewardsConfig {
    /// The parts, in order.
    #[serde(default)]
    pub reward: Vec<RewardEntry>,
}

impl RewardsConfig {
    /// Parses TOML; an error names the entry (`reward[i]`) and the field when it can.
    pub fn from_toml_str(text: &str) -> Result<Self> {
        const OP: &str = "RewardsConfig::from_toml_str";
        let e = match toml::from_str(text) {
            Ok(cfg) => return Ok(cfg),
            Err(e) => e,
        };
        // the entry: the first that fails on its own (spans inside an internally tagged enum
        // cover the whole array); the field: the key without which the entry's error changes
        // (a missing field's error names it already)
        let place = toml::from_str::<toml::Table>(text)
            .ok()
            .and_then(|doc| {
                let entries = doc.get("reward")?.as_array()?.clone();
                entries.into_iter().enumerate().find_map(|(i, entry)| {
                    let table = entry.as_table()?.clone();
                    let error = entry.try_into::<RewardEntry>().err()?.message().to_string();
                    let field = if error.starts_with("missing field `type`") {
                        Some("type".to_string())
                    } else if error.starts_with("missing field") {
                        None // it names the field already
                    } else if error.contains("variant") {
                        Some("type".to_string())
                    } else {
                        table
                            .keys()
                            .filter(|k| *k != "type")
                            .find(|k| {
                                let mut without = table.clone();
                                without.remove(k.as_str());
                                toml::Value::Table(without)
                                    .try_into::<RewardEntry>()
                                    .map_or_else(|e| e.message() != error, |_| true)
                            })
                            .cloned()
                    };
                    Some(match field {
                        Some(k) => format!("reward[{i}].{k}: "),
                        None => format!("reward[{i}]: "),
                    })
                })
            })
            .unwrap_or_default();
        Err(Error::invalid(
            OP,
            format!("{place}{}", e.message().trim_end()),
        ))
    }

    /// [`build_parts`] on these entries.
    pub fn build(&self, device: Device) -> Result<Vec<RewardPart>> {
        build_parts(&self.reward, device)
    }
}

/// The [`RewardPart`]s of `entries`, in order; reward models load on `device` (frozen). An
/// invalid field (a bad extraction or regex, a tolerance out of range, a missing folder, a
/// repeated name) is an error whose context names the entry (`reward[i] (type)`) and whose
/// inner error names the field.
///
/// ```
/// use torchrl::envs::llm::rewards::{build_parts, RewardEntry};
/// let bad = RewardEntry::Format { name: None, pattern: "(".into(), weight: 1.0 };
/// let err = build_parts(&[bad], tch::Device::Cpu).unwrap_err().to_string();
/// assert!(err.starts_with("reward[0] (format)") && err.contains("pattern"));
/// ```
pub fn build_parts(entries: &[RewardEntry], device: Device) -> Result<Vec<RewardPart>> {
    let mut parts: Vec<RewardPart> = Vec::with_capacity(entries.len());
    for (i, entry) in entries.iter().enumerate() {
        let part = build_entry(entry, device).and_then(|p| {
            let names: Vec<&str> = parts.iter().map(|q| q.name.as_str()).collect();
            check_part("build_parts", &names, &p.name, p.weight)?;
            Ok(p)
        });
        parts.push(part.with_context(|| format!("reward[{i}] ({})", entry.type_name()))?);
    }
    Ok(parts)
}

impl RewardEntry {
    /// The `type` string of the entry.
    pub fn type_name(&self) -> &'static str {
        match self {
            RewardEntry::AnswerMatch { .. } => "answer_match",
            RewardEntry::Format { .. } => "format",
            RewardEntry::ThinkFormat { .. } => "think_format",
            RewardEntry::SoftOverlong { .. } => "soft_overlong",
            RewardEntry::RepetitionPenalty { .. } => "repetition_penalty",
            RewardEntry::Command { .. } => "command",
            RewardEntry::RewardModel { .. } => "reward_model",
        }
    }
}

/// `f`, renamed when `name` is set.
fn named<F: RewardFunction + 'static>(
    f: F,
    name: &Option<String>,
    rename: impl FnOnce(F, String) -> F,
) -> Box<dyn RewardFunction> {
    match name {
        Some(n) => Box::new(rename(f, n.clone())),
        None => Box::new(f),
    }
}

fn build_entry(entry: &RewardEntry, device: Device) -> Result<RewardPart> {
    const OP: &str = "RewardEntry";
    let field_err = |field: &'static str, e: Error| match e {
        Error::InvalidValue { expected, got, .. } | Error::InvalidConfig { expected, got, .. } => {
            Error::config(OP, field, expected, got)
        }
        other => other,
    };
    if let Some(name) = entry_name(entry) {
        if name.is_empty() {
            return Err(Error::config(OP, "name", "a non-empty name", "\"\""));
        }
    }
    match entry {
        RewardEntry::AnswerMatch {
            name,
            field,
            extract,
            reference_extract,
            compare,
            tolerance,
            weight,
        } => {
            let extract: Extraction = extract.parse().map_err(|e| field_err("extract", e))?;
            let reference: Extraction = reference_extract
                .parse()
                .map_err(|e| field_err("reference_extract", e))?;
            let compare = match (compare.as_str(), tolerance) {
                ("exact", None) => Compare::Exact,
                ("exact", Some(t)) => {
                    return Err(Error::config(
                        OP,
                        "tolerance",
                        "no tolerance with compare = \"exact\" (set compare = \"numeric\")",
                        t,
                    ))
                }
                ("numeric", t) => {
                    Compare::numeric(t.unwrap_or(1e-6)).map_err(|e| field_err("tolerance", e))?
                }
                (other, _) => {
                    return Err(Error::config(
                        OP,
                        "compare",
                        "\"exact\" or \"numeric\"",
                        format!("{other:?}"),
                    ))
                }
            };
            if field.is_empty() {
                return Err(Error::config(OP, "field", "a non-empty field name", "\"\""));
            }
            let f = AnswerMatch::new(field.clone(), extract, compare)
                .with_reference_extraction(reference);
            RewardPart::boxed(named(f, name, AnswerMatch::with_name), *weight)
        }
        RewardEntry::Format {
            name,
            pattern,
            weight,
        } => {
            let f = FormatCheck::new(pattern).map_err(|e| field_err("pattern", e))?;
            RewardPart::boxed(named(f, name, FormatCheck::with_name), *weight)
        }
        RewardEntry::ThinkFormat { name, weight } => RewardPart::boxed(
            named(FormatCheck::think()?, name, FormatCheck::with_name),
            *weight,
        ),
        RewardEntry::SoftOverlong {
            name,
            max_completion_len,
            soft_punish_cache,
            weight,
        } => {
            let f = SoftOverlongPunishment::new(*max_completion_len, *soft_punish_cache)?;
            RewardPart::boxed(named(f, name, SoftOverlongPunishment::with_name), *weight)
        }
        RewardEntry::RepetitionPenalty {
            name,
            ngram_size,
            max_penalty,
            weight,
        } => {
            let f = RepetitionPenalty::new(*ngram_size, *max_penalty)?;
            RewardPart::boxed(named(f, name, RepetitionPenalty::with_name), *weight)
        }
        RewardEntry::Command {
            name,
            command,
            timeout_s,
            weight,
        } => {
            if !(timeout_s.is_finite() && *timeout_s > 0.0 && *timeout_s < 1e9) {
                return Err(Error::config(
                    OP,
                    "timeout_s",
                    "a finite number of seconds > 0",
                    timeout_s,
                ));
            }
            let f = CommandReward::new(command.clone(), Duration::from_secs_f64(*timeout_s))?;
            RewardPart::boxed(named(f, name, CommandReward::with_name), *weight)
        }
        RewardEntry::RewardModel {
            name,
            path,
            clip,
            weight,
        } => {
            let vs = tch::nn::VarStore::new(device);
            let model = CausalLmWithScoreHead::from_pretrained(&vs.root(), path)
                .map_err(|e| e.context(format!("field path ({})", path.display())))?;
            let mut vs = vs;
            vs.freeze();
            let mut scorer = RewardModelScorer::new(model);
            if let Some(c) = clip {
                scorer = scorer.with_clip(*c)?;
            }
            let name = name.clone().unwrap_or_else(|| {
                path.file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .filter(|n| !n.is_empty())
                    .unwrap_or_else(|| "reward_model".into())
            });
            RewardPart::model(name, scorer, *weight)
        }
    }
    .map_err(|e| match e {
        Error::InvalidValue { ref key, .. } if key == "weight" => field_err("weight", e),
        other => other,
    })
}

fn entry_name(entry: &RewardEntry) -> Option<&str> {
    match entry {
        RewardEntry::AnswerMatch { name, .. }
        | RewardEntry::Format { name, .. }
        | RewardEntry::ThinkFormat { name, .. }
        | RewardEntry::SoftOverlong { name, .. }
        | RewardEntry::RepetitionPenalty { name, .. }
        | RewardEntry::Command { name, .. }
        | RewardEntry::RewardModel { name, .. } => name.as_deref(),
    }
}
