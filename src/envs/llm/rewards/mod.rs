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

use std::fmt;

use serde_json::{Map, Value};

use crate::error::Result;

mod answer;
mod checks;
mod command;
mod config;
mod scorer;
mod weighted;

pub use answer::*;
pub use checks::*;
pub use command::*;
pub use config::*;
pub use scorer::*;
pub use weighted::*;

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
