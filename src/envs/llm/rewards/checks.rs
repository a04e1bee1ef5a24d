//! Format and length rewards: [`FormatCheck`] (TRL's think format), [`SoftOverlongPunishment`]
//! (DAPO's length penalty) and [`RepetitionPenalty`].

use crate::error::{Error, Result};

use super::*;
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
