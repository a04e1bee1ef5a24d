//! [`TokenEnvConfig`]: how a [`TokenEnv`](super::TokenEnv) runs (vocabulary, context,
//! response length, special ids, prompts per reset, shuffling, a fixed prompt width,
//! completions per prompt), checked before the env is built.
//!
//! ```
//! use torchrl::envs::llm::TokenEnvConfig;
//! let cfg = TokenEnvConfig::new(10, 16).with_max_new_tokens(3).with_batch_size(2);
//! cfg.validate()?;
//! assert_eq!(cfg.generation_config().max_new_tokens, 3);
//! # Ok::<(), torchrl::Error>(())
//! ```

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::macros::setters;
use crate::modules::llm::{GenerationConfig, LmFacts};

/// The most tokens one batch of a [`TokenEnvConfig`] may hold (`batch_size * n_positions`,
/// 2^26: 512 MiB per int64 `[B, P]` tensor, far above RLHF batches).
pub const MAX_BATCH_TOKENS: i64 = 1 << 26;

/// How a [`TokenEnv`](super::TokenEnv) runs. `new(vocab_size, n_positions)` plus `with_*` setters; serde
/// reads it from a file (fields other than `vocab_size` and `n_positions` default as in
/// `new`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenEnvConfig {
    /// The number of token ids (the model's vocabulary).
    pub vocab_size: i64,
    /// The context length: prompt width + `max_new_tokens` must fit in it.
    pub n_positions: i64,
    /// The response length limit `R` (default 20).
    #[serde(default = "twenty")]
    pub max_new_tokens: i64,
    /// The end-of-sequence id (`None`: no response terminates; every one is truncated).
    #[serde(default)]
    pub eos_token_id: Option<i64>,
    /// The pad id (`None`: the EOS id, else 0, as [`GenerationConfig::pad_id`]).
    #[serde(default)]
    pub pad_token_id: Option<i64>,
    /// Prompts per reset `B` (default 1).
    #[serde(default = "one")]
    pub batch_size: i64,
    /// Serve the prompts in a seeded random order, a new permutation per pass (default false).
    #[serde(default)]
    pub shuffle: bool,
    /// The seed of the prompt order (default 0; [`EnvBase::set_seed`] reseeds it too).
    #[serde(default)]
    pub seed: u64,
    /// A fixed padded prompt width `P` for every reset (`None`, the default: each reset pads
    /// to its batch's longest prompt). A trainer that concatenates chunks of rollouts along
    /// the batch wants one width: set it to at least the longest prompt.
    #[serde(default)]
    pub prompt_width: Option<i64>,
    /// Completions per prompt `G` (TRL's `num_generations`, TorchRL's `grpo_size`): each reset
    /// draws `batch_size / G` prompts and serves each `G` times in consecutive rows, the
    /// layout GRPO's group advantages read
    /// ([`group_advantages`](crate::objectives::llm::group_advantages)). Must divide
    /// `batch_size`. Default 1.
    #[serde(default = "one")]
    pub num_generations: i64,
}

fn twenty() -> i64 {
    20
}

fn one() -> i64 {
    1
}

impl TokenEnvConfig {
    /// A config for a model with `vocab_size` ids and `n_positions` positions; batch 1,
    /// `max_new_tokens` 20, no EOS, pad 0, prompts in order.
    pub fn new(vocab_size: i64, n_positions: i64) -> Self {
        TokenEnvConfig {
            vocab_size,
            n_positions,
            max_new_tokens: 20,
            eos_token_id: None,
            pad_token_id: None,
            batch_size: 1,
            shuffle: false,
            seed: 0,
            prompt_width: None,
            num_generations: 1,
        }
    }

    /// The vocabulary, context length and EOS / pad ids of a model (any architecture:
    /// `TokenEnvConfig::for_model(model.facts())`).
    pub fn for_model(facts: &LmFacts) -> Self {
        TokenEnvConfig {
            eos_token_id: facts.eos_token_id,
            pad_token_id: facts.pad_token_id,
            ..TokenEnvConfig::new(facts.vocab_size, facts.max_positions)
        }
    }

    setters! {
        /// Sets the response length limit.
        with_max_new_tokens(max_new_tokens: i64);
        /// Sets the EOS id.
        with_eos_token_id(id: i64) => eos_token_id = Some(id);
        /// Sets the pad id.
        with_pad_token_id(id: i64) => pad_token_id = Some(id);
        /// Sets the number of prompts per reset.
        with_batch_size(batch_size: i64);
        /// Shuffles the prompts (seeded).
        with_shuffle(shuffle: bool);
        /// Sets the seed of the prompt order.
        with_seed(seed: u64);
        /// Sets a fixed padded prompt width for every reset.
        with_prompt_width(width: i64) => prompt_width = Some(width);
        /// Sets the completions per prompt (each prompt fills `G` consecutive rows).
        with_num_generations(num_generations: i64);
    }

    /// The distinct prompts of one reset, `batch_size / num_generations`.
    pub fn prompts_per_reset(&self) -> i64 {
        self.batch_size / self.num_generations.max(1)
    }

    /// The pad id used: `pad_token_id`, else `eos_token_id`, else 0.
    pub fn pad_id(&self) -> i64 {
        self.pad_token_id.or(self.eos_token_id).unwrap_or(0)
    }

    /// RLHF sampling ([`GenerationConfig::rlhf_sampling`]) with this config's
    /// `max_new_tokens`, EOS and pad ids: a generation config that agrees with the env.
    pub fn generation_config(&self) -> GenerationConfig {
        let mut g = GenerationConfig::rlhf_sampling(self.max_new_tokens);
        g.eos_token_id = self.eos_token_id;
        g.pad_token_id = Some(self.pad_id());
        // the env's ids are the ones it scores and pads with: not the model's
        g.model_defaults = false;
        g
    }

    /// Checks the fields on their own and against each other.
    pub fn validate(&self) -> Result<()> {
        let op = "TokenEnvConfig";
        let need = |ok: bool, field: &'static str, expected: String, got: i64| {
            if ok {
                Ok(())
            } else {
                Err(Error::config(op, field, expected, got))
            }
        };
        need(
            self.vocab_size >= 1,
            "vocab_size",
            ">= 1".into(),
            self.vocab_size,
        )?;
        need(
            self.n_positions >= 2,
            "n_positions",
            ">= 2".into(),
            self.n_positions,
        )?;
        need(
            self.max_new_tokens >= 1 && self.max_new_tokens < self.n_positions,
            "max_new_tokens",
            format!(
                "in [1, n_positions = {}) (a prompt needs a token)",
                self.n_positions
            ),
            self.max_new_tokens,
        )?;
        need(
            self.batch_size >= 1,
            "batch_size",
            ">= 1".into(),
            self.batch_size,
        )?;
        // every reset and step holds [batch_size, n_positions] tokens on the host: an absurd
        // batch is refused here rather than aborting on an allocation
        let tokens = self.batch_size.checked_mul(self.n_positions);
        need(
            tokens.is_some_and(|t| t <= MAX_BATCH_TOKENS),
            "batch_size",
            format!(
                "batch_size * n_positions (= {}) at most {MAX_BATCH_TOKENS} tokens",
                self.n_positions
            ),
            self.batch_size,
        )?;
        let ids = format!("a token id in [0, vocab_size = {})", self.vocab_size);
        for (field, id) in [
            ("eos_token_id", self.eos_token_id),
            ("pad_token_id", self.pad_token_id),
        ] {
            if let Some(id) = id {
                need((0..self.vocab_size).contains(&id), field, ids.clone(), id)?;
            }
        }
        need(
            self.num_generations >= 1 && self.batch_size % self.num_generations == 0,
            "num_generations",
            format!(
                ">= 1 and a divisor of batch_size = {} (each prompt fills num_generations rows)",
                self.batch_size
            ),
            self.num_generations,
        )?;
        if let Some(w) = self.prompt_width {
            let room = self.n_positions - self.max_new_tokens;
            need(
                (1..=room).contains(&w),
                "prompt_width",
                format!(
                    "in [1, n_positions - max_new_tokens = {} - {} = {room}]",
                    self.n_positions, self.max_new_tokens
                ),
                w,
            )?;
        }
        Ok(())
    }
}
