//! Answer checks: extracting an answer from a completion ([`Extraction`], [`parse_number`]) and
//! comparing it with a dataset column ([`AnswerMatch`], [`Compare`]).

use std::fmt;
use std::str::FromStr;

use serde_json::Value;

use crate::error::{Error, Result};

use super::*;
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
pub(super) fn number_regex() -> Result<regex::Regex> {
    regex::Regex::new(r"-?\d+(?:,\d+)*(?:\.\d+)?")
        .map_err(|e| Error::invalid("Extraction::LastNumber", e.to_string()))
}

/// Compiles `pattern` (fancy-regex syntax: look-around allowed), naming `what` on error.
pub(super) fn compile(op: &'static str, what: &str, pattern: &str) -> Result<fancy_regex::Regex> {
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
pub(super) fn last_number(text: &str) -> Result<Option<String>> {
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
pub(super) fn last_boxed(text: &str) -> Option<&str> {
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
