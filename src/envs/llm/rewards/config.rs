//! The `[[reward]]` TOML form ([`RewardEntry`], [`RewardsConfig`]) and [`build_parts`].

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tch::Device;

use crate::envs::llm::scorer::RewardModelScorer;
use crate::error::{Error, Result, ResultExt};
use crate::modules::llm::CausalLmWithScoreHead;

use super::*;
pub(super) fn default_weight() -> f64 {
    1.0
}
pub(super) fn default_extract() -> String {
    "trimmed".into()
}
pub(super) fn default_compare() -> String {
    "exact".into()
}
pub(super) fn default_timeout() -> f64 {
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
            let names: Vec<&str> = parts.iter().map(|q| q.name()).collect();
            check_part("build_parts", &names, p.name(), p.weight())?;
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
pub(super) fn named<F: RewardFunction + 'static>(
    f: F,
    name: &Option<String>,
    rename: impl FnOnce(F, String) -> F,
) -> Box<dyn RewardFunction> {
    match name {
        Some(n) => Box::new(rename(f, n.clone())),
        None => Box::new(f),
    }
}

pub(super) fn build_entry(entry: &RewardEntry, device: Device) -> Result<RewardPart> {
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

pub(super) fn entry_name(entry: &RewardEntry) -> Option<&str> {
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
