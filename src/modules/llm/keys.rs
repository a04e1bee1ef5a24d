//! The LLM tensordict layout, declared once (TorchRL's LLM layout: `tokens` / `masks` /
//! `log_probs` groups, each with `prompt` / `response` / `full` entries). The token env, the
//! generation policy, the heads, the KL transforms, the losses' default keys and the trainers
//! all name their entries through these constants (or [`LlmKeys`], the heads' settable copy of
//! them), so a rollout writes each key once, under one name.
//!
//! | constant | key | shape |
//! |---|---|---|
//! | [`PROMPT_KEY`] | `("tokens", "prompt")` | `[B, P]`, left-padded |
//! | [`PROMPT_MASK_KEY`] | `("masks", "prompt_attention_mask")` | `[B, P]` |
//! | [`RESPONSE_KEY`] | `("tokens", "response")` | `[B, R]`, right-padded |
//! | [`FULL_KEY`] | `("tokens", "full")` | `[B, P + R]` |
//! | [`ATTENTION_MASK_KEY`] | `("masks", "all_attention_mask")` | `[B, P + R]` |
//! | [`ASSISTANT_MASK_KEY`] | `("masks", "all_assistant_mask")` | `[B, P + R]` |
//! | [`RESPONSE_LOG_PROBS_KEY`] | `("log_probs", "response")` | `[B, R]` |
//! | [`FULL_LOG_PROBS_KEY`] | `("log_probs", "full")` | `[B, P + R]` |
//! | [`REF_LOG_PROBS_KEY`] | `("ref_log_probs", "full")` | `[B, P + R]` |
//! | [`LOGITS_KEY`] | `"logits"` | `[B, T, vocab]` |
//! | [`VALUES_KEY`] | `"values"` | `[B, T]` |
//! | [`SCORE_KEY`] | `"score"` | `[B]` |
//! | [`ACTIONS_IXS_KEY`], [`STATES_IXS_KEY`] | `"actions_ixs"`, `"states_ixs"` (ILQL) | `[B, A]`, `[B, S]` |
//!
//! ```
//! use torchrl::modules::llm::keys::{LlmKeys, FULL_KEY};
//! use torchrl::NestedKey;
//! assert_eq!(LlmKeys::default().input_ids, NestedKey::from(FULL_KEY));
//! assert_eq!(NestedKey::from(FULL_KEY), NestedKey::from(("tokens", "full")));
//! ```

use crate::tensordict::NestedKey;

/// `("tokens", "prompt")`.
pub const PROMPT_KEY: (&str, &str) = ("tokens", "prompt");
/// `("masks", "prompt_attention_mask")`.
pub const PROMPT_MASK_KEY: (&str, &str) = ("masks", "prompt_attention_mask");
/// `("tokens", "response")`.
pub const RESPONSE_KEY: (&str, &str) = ("tokens", "response");
/// `("tokens", "full")`.
pub const FULL_KEY: (&str, &str) = ("tokens", "full");
/// `("masks", "all_attention_mask")`.
pub const ATTENTION_MASK_KEY: (&str, &str) = ("masks", "all_attention_mask");
/// `("masks", "all_assistant_mask")`.
pub const ASSISTANT_MASK_KEY: (&str, &str) = ("masks", "all_assistant_mask");
/// `("log_probs", "response")`.
pub const RESPONSE_LOG_PROBS_KEY: (&str, &str) = ("log_probs", "response");
/// `("log_probs", "full")`.
pub const FULL_LOG_PROBS_KEY: (&str, &str) = ("log_probs", "full");
/// `("ref_log_probs", "full")`: the reference model's per-token log-probs.
pub const REF_LOG_PROBS_KEY: (&str, &str) = ("ref_log_probs", "full");
/// `"logits"`.
pub const LOGITS_KEY: &str = "logits";
/// `"values"`: per-token values.
pub const VALUES_KEY: &str = "values";
/// `"score"`: one score per sequence.
pub const SCORE_KEY: &str = "score";
/// `"actions_ixs"`: ILQL's action positions.
pub const ACTIONS_IXS_KEY: &str = "actions_ixs";
/// `"states_ixs"`: ILQL's state positions.
pub const STATES_IXS_KEY: &str = "states_ixs";

/// The tensordict keys the LLM heads read and write (TorchRL's LLM layout, §4.1 of the RLHF
/// reference). Every field can be changed.
#[derive(Debug, Clone, PartialEq)]
pub struct LlmKeys {
    /// Token ids `[B, T]`. Default `("tokens", "full")`.
    pub input_ids: NestedKey,
    /// Attention mask `[B, T]` (1 = real token). Default `("masks", "all_attention_mask")`.
    pub attention_mask: NestedKey,
    /// Logits `[B, T, vocab]`. Default `"logits"`.
    pub logits: NestedKey,
    /// Per-token log-probs `[B, T]` (see the [module docs](self)). Default `("log_probs",
    /// "full")`.
    pub log_probs: NestedKey,
    /// The reference model's per-token log-probs `[B, T]`. Default `("ref_log_probs",
    /// "full")`.
    pub ref_log_probs: NestedKey,
    /// Per-position values `[B, T]`. Default `"values"`.
    pub values: NestedKey,
    /// Per-sequence score `[B]`. Default `"score"`.
    pub score: NestedKey,
    /// ILQL: positions whose next token is an action `[B, A]`. Default `"actions_ixs"`.
    pub actions_ixs: NestedKey,
    /// ILQL: state positions `[B, S]`. Default `"states_ixs"`.
    pub states_ixs: NestedKey,
}

impl LlmKeys {
    /// The token ids and the attention mask: what every head reads.
    pub fn token_inputs(&self) -> Vec<NestedKey> {
        vec![self.input_ids.clone(), self.attention_mask.clone()]
    }
}

impl Default for LlmKeys {
    fn default() -> Self {
        LlmKeys {
            input_ids: FULL_KEY.into(),
            attention_mask: ATTENTION_MASK_KEY.into(),
            logits: LOGITS_KEY.into(),
            log_probs: FULL_LOG_PROBS_KEY.into(),
            ref_log_probs: REF_LOG_PROBS_KEY.into(),
            values: VALUES_KEY.into(),
            score: SCORE_KEY.into(),
            actions_ixs: ACTIONS_IXS_KEY.into(),
            states_ixs: STATES_IXS_KEY.into(),
        }
    }
}
