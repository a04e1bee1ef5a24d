//! [`TokenEnv`]: the token-level RLHF environment. One episode is one step: the reset serves a
//! batch of prompts, the policy answers with a response, and the step scores it.
//!
//! # Layout
//! Batch size `[B]`; every token tensor is int64. `P` is the padded prompt width and `R` the
//! response width.
//!
//! Written by the reset (and kept under `"next"` by the step):
//! - `("tokens", "prompt")` `[B, P]`: the prompts, **left**-padded with the pad id;
//! - `("masks", "prompt_attention_mask")` `[B, P]` int64, 1 on real prompt tokens (our own
//!   name: TorchRL keeps only full-length masks);
//! - `"score"` `[B]` float32: 0 at reset; under `"next"` the scorer's raw output (for logging).
//!
//! The action, written by the policy:
//! - `("tokens", "response")` `[B, R]`, **right**-padded with the pad id; every token after
//!   the first EOS counts as padding, and so do trailing pad tokens of a response without EOS;
//! - optionally `("log_probs", "response")` `[B, R]`.
//!
//! Written by [`GenerationPolicy`](super::policy::GenerationPolicy), built by the step from the
//! prompt and the response when absent (and checked against them when present):
//! - `("tokens", "full")` `[B, P + R]` = `cat(prompt, response)`;
//! - `("masks", "all_attention_mask")` `[B, P + R]` = `cat(prompt mask, response mask)`;
//! - `("masks", "all_assistant_mask")` `[B, P + R]`: 1 on the real response tokens (EOS
//!   included), 0 on the prompt and the padding. When present, its response part is the
//!   response mask the step uses;
//! - `("log_probs", "full")` `[B, P + R]`: `lp[t] = log p(token[t] | tokens < t)`, 0 where
//!   masked ([`token_log_probs`](crate::modules::llm::token_log_probs)'s convention).
//!
//! Written by the step under `"next"`:
//! - `"reward"` `[B, P + R, 1]` float32: the sequence score at the **last real response
//!   token** (the EOS when there is one; the last prompt token for an empty response), 0
//!   elsewhere. This is where TorchRL and trlX's `rewards[-1] += score` put it. (trlX's
//!   `ends = start + mask.sum() + 1` slice, with pad == EOS, lands the score one slot *after*
//!   the EOS token's log-prob — RLHF reference §1.4; we do not copy that placement.);
//! - `"done"` (always true: one step per episode), `"terminated"` (the response contains EOS),
//!   `"truncated"` (it does not: the length limit ended it), each `[B, 1]` bool;
//! - `"score"` `[B]` and the prompt keys, unchanged (TorchRL's `ChatEnv` makes the full
//!   sequence the next prompt; here the episode is over and the next reset serves new prompts).
//!
//! # Specs
//! Observation `("tokens", "prompt")` `Categorical(vocab)` `[B, P]`, its mask `Categorical(2)`
//! `[B, P]`, `"score"` `Unbounded` `[B]`; action `("tokens", "response")` `Categorical(vocab)`
//! `[B, R]`; reward `Unbounded` `[B, P + R, 1]`; `done` / `terminated` / `truncated` bool
//! `[B, 1]`. TorchRL declares the token dims as "any length" (`-1`). Our specs do not take
//! such dims yet, so the env uses fixed widths: `P` is the longest prompt of the source (or
//! [`TokenEnvConfig::prompt_width`]), `R` is `max_new_tokens`, and a response must be exactly
//! `R` wide (the [`GenerationPolicy`](super::policy::GenerationPolicy) pads to it). Each
//! shape is built in one private function, so switching to `-1` is one line per spec.
//!
//! # Prompts
//! A list of token-id prompts, served `batch_size` at a time, in order or shuffled (a new
//! seeded permutation per pass), cycling forever; or explicit prompts through
//! [`TokenEnv::reset_with_prompts`].
//!
//! ```
//! use tch::Kind;
//! use torchrl::envs::llm::{TokenEnv, TokenEnvConfig, TokenScorer};
//! use torchrl::envs::EnvBase;
//! use torchrl::TensorDict;
//! # fn main() -> torchrl::Result<()> {
//! let cfg = TokenEnvConfig::new(10, 16).with_batch_size(2).with_max_new_tokens(3)
//!     .with_eos_token_id(9).with_pad_token_id(0);
//! // score = response length (EOS excluded)
//! let scorer = TokenScorer::new(|_p: &[i64], r: &[i64]| r.len() as f64);
//! let mut env = TokenEnv::new(cfg, vec![vec![1, 2], vec![3]], Box::new(scorer))?;
//! let td = env.reset(None)?;
//! let prompt = td.get_or_err(("tokens", "prompt"))?;
//! assert_eq!(Vec::<i64>::try_from(prompt.view([-1]))?, vec![1, 2, 0, 3]); // left-padded
//! // row 0 answers [4, EOS, pad]; row 1 answers [5, 6, 7] (no EOS: truncated)
//! let response = tch::Tensor::from_slice(&[4i64, 9, 0, 5, 6, 7]).view([2, 3]);
//! let td = env.step(td.with(("tokens", "response"), response)?)?;
//! let reward = td.get_or_err(("next", "reward"))?.squeeze_dim(-1);
//! // P + R = 5 slots; the score sits at the last real response token
//! assert_eq!(Vec::<f32>::try_from(reward.view([-1]))?,
//!            vec![0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 3.0]);
//! let term = td.get_or_err(("next", "terminated"))?.view([-1]);
//! assert_eq!(Vec::<bool>::try_from(&term)?, vec![true, false]);
//! # Ok(()) }
//! ```

use std::fmt;

use serde::{Deserialize, Serialize};
use tch::{Device, Kind, Tensor};

use super::scorer::{ScoreInput, Scorer};
use crate::data::specs::{Categorical, Unbounded};
use crate::envs::{EnvBase, EnvCore, EnvSpecs};
use crate::error::{Error, Result, ShapeFmt};
use crate::macros::setters;
use crate::modules::llm::{GenerationConfig, Gpt2Config, TextTokenizer};
use crate::rng::Generator;
use crate::tensordict::TensorDict;

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

// ------------------------------------------------------------------ config

/// How a [`TokenEnv`] runs. `new(vocab_size, n_positions)` plus `with_*` setters; serde
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
    /// The padded prompt width `P` (`None`: the longest prompt of the source).
    #[serde(default)]
    pub prompt_width: Option<i64>,
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
        }
    }

    /// The vocabulary, context length and EOS / pad ids of a GPT-2 config.
    pub fn for_model(config: &Gpt2Config) -> Self {
        TokenEnvConfig {
            eos_token_id: config.eos_token_id,
            pad_token_id: config.pad_token_id,
            ..TokenEnvConfig::new(config.vocab_size, config.n_positions)
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
        /// Sets the padded prompt width.
        with_prompt_width(width: i64) => prompt_width = Some(width);
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
        let ids = format!("a token id in [0, vocab_size = {})", self.vocab_size);
        for (field, id) in [
            ("eos_token_id", self.eos_token_id),
            ("pad_token_id", self.pad_token_id),
        ] {
            if let Some(id) = id {
                need((0..self.vocab_size).contains(&id), field, ids.clone(), id)?;
            }
        }
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

// ------------------------------------------------------------------ prompt source

/// The prompts, served in order or in seeded per-pass permutations, cycling.
#[derive(Debug, Clone)]
struct PromptSource {
    prompts: Vec<Vec<i64>>,
    order: Vec<usize>,
    cursor: usize,
    shuffle: bool,
    rng: Generator,
}

impl PromptSource {
    fn new(prompts: Vec<Vec<i64>>, shuffle: bool, seed: u64) -> Self {
        let mut s = PromptSource {
            order: (0..prompts.len()).collect(),
            prompts,
            cursor: 0,
            shuffle,
            rng: Generator::new(seed),
        };
        s.reseed(seed);
        s
    }

    /// Restarts from the first pass with a new seed.
    fn reseed(&mut self, seed: u64) {
        self.rng = Generator::new(seed);
        self.cursor = 0;
        self.new_pass();
    }

    fn new_pass(&mut self) {
        self.order = (0..self.prompts.len()).collect();
        if self.shuffle {
            // Fisher–Yates with the seeded generator
            for i in (1..self.order.len()).rev() {
                let j = usize::try_from(self.rng.below(i as u64 + 1)).unwrap_or(i);
                self.order.swap(i, j);
            }
        }
        self.cursor = 0;
    }

    fn next_batch(&mut self, n: usize) -> Vec<Vec<i64>> {
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            if self.cursor >= self.order.len() {
                self.new_pass();
            }
            let next = self
                .order
                .get(self.cursor)
                .and_then(|&i| self.prompts.get(i));
            match next {
                Some(p) => out.push(p.clone()),
                None => break, // unreachable: the source is never empty
            }
            self.cursor += 1;
        }
        out
    }
}

// ------------------------------------------------------------------ specs

// One function per spec shape: when specs take "any length" (-1) dims, the token widths
// become -1 here and nowhere else.

fn prompt_shape(b: i64, p: i64) -> [i64; 2] {
    [b, p]
}

fn response_shape(b: i64, r: i64) -> [i64; 2] {
    [b, r]
}

fn reward_shape(b: i64, t: i64) -> [i64; 3] {
    [b, t, 1]
}

fn build_specs(cfg: &TokenEnvConfig, p: i64) -> Result<EnvSpecs> {
    let (b, r, v) = (cfg.batch_size, cfg.max_new_tokens, cfg.vocab_size);
    let flag = Categorical::new(2)?
        .with_shape([b, 1])?
        .with_dtype(Kind::Bool)?;
    EnvSpecs::new([b])?
        .with_observation(
            PROMPT_KEY,
            Categorical::new(v)?.with_shape(prompt_shape(b, p))?,
        )?
        .with_observation(
            PROMPT_MASK_KEY,
            Categorical::new(2)?.with_shape(prompt_shape(b, p))?,
        )?
        .with_observation("score", Unbounded::new().with_shape([b])?)?
        .with_action(
            RESPONSE_KEY,
            Categorical::new(v)?.with_shape(response_shape(b, r))?,
        )?
        .with_reward(
            "reward",
            Unbounded::new().with_shape(reward_shape(b, p + r))?,
        )?
        .with_done("done", flag.clone())?
        .with_done("terminated", flag.clone())?
        .with_done("truncated", flag)
}

// ------------------------------------------------------------------ env

/// The token-level environment. See the [module docs](self) for the keys and specs.
pub struct TokenEnv {
    core: EnvCore,
    config: TokenEnvConfig,
    prompt_width: i64,
    source: PromptSource,
    scorer: Box<dyn Scorer>,
    /// Prompts for the next reset, from [`TokenEnv::reset_with_prompts`].
    pending: Option<Vec<Vec<i64>>>,
}

impl fmt::Debug for TokenEnv {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenEnv")
            .field("config", &self.config)
            .field("prompt_width", &self.prompt_width)
            .field("prompts", &self.source.prompts.len())
            .finish_non_exhaustive()
    }
}

impl TokenEnv {
    /// An env over token-id `prompts` (at least one, each non-empty, ids in `[0, vocab)`, and
    /// each fitting with `max_new_tokens` in the context), scored by `scorer`.
    pub fn new(
        config: TokenEnvConfig,
        prompts: Vec<Vec<i64>>,
        scorer: Box<dyn Scorer>,
    ) -> Result<Self> {
        config.validate()?;
        let op = "TokenEnv::new";
        if prompts.is_empty() {
            return Err(Error::argument(
                op,
                "prompts",
                "at least one prompt",
                "an empty list",
            ));
        }
        let longest = prompts.iter().map(Vec::len).max().unwrap_or(0) as i64;
        let prompt_width = config.prompt_width.unwrap_or(longest);
        for (i, p) in prompts.iter().enumerate() {
            check_prompt(op, &config, prompt_width, i, p)?;
        }
        let specs = build_specs(&config, prompt_width)?;
        Ok(TokenEnv {
            core: EnvCore::new(specs)?,
            source: PromptSource::new(prompts, config.shuffle, config.seed),
            prompt_width,
            config,
            scorer,
            pending: None,
        })
    }

    /// An env over text prompts, encoded with `tokenizer` (no BOS or EOS added). Errors when
    /// the tokenizer's vocabulary size differs from `config.vocab_size` (the model's), or its
    /// EOS id from the config's, and on every error of [`TokenEnv::new`].
    pub fn from_text(
        config: TokenEnvConfig,
        tokenizer: &dyn TextTokenizer,
        prompts: &[&str],
        scorer: Box<dyn Scorer>,
    ) -> Result<Self> {
        let op = "TokenEnv::from_text";
        if tokenizer.vocab_size() != config.vocab_size {
            return Err(Error::argument(
                op,
                "tokenizer",
                format!(
                    "a tokenizer with the model's vocabulary size {} (TokenEnvConfig::vocab_size)",
                    config.vocab_size
                ),
                format!("vocabulary size {}", tokenizer.vocab_size()),
            ));
        }
        if let (Some(t), Some(c)) = (tokenizer.eos_token_id(), config.eos_token_id) {
            if t != c {
                return Err(Error::argument(
                    op,
                    "tokenizer",
                    format!("the config's EOS id {c}"),
                    format!("a tokenizer with EOS id {t}"),
                ));
            }
        }
        let ids = prompts
            .iter()
            .map(|p| tokenizer.encode(p))
            .collect::<Result<Vec<_>>>()?;
        Self::new(config, ids, scorer)
    }

    /// The config.
    pub fn config(&self) -> &TokenEnvConfig {
        &self.config
    }

    /// The padded prompt width `P`.
    pub fn prompt_width(&self) -> i64 {
        self.prompt_width
    }

    /// Resets with these prompts (exactly `batch_size` of them, checked like the source's)
    /// instead of the source's next ones; the source does not advance.
    pub fn reset_with_prompts(&mut self, prompts: &[Vec<i64>]) -> Result<TensorDict> {
        let op = "TokenEnv::reset_with_prompts";
        let b = self.config.batch_size;
        if prompts.len() as i64 != b {
            return Err(Error::argument(
                op,
                "prompts",
                format!("{b} prompts (the env's batch size)"),
                format!("{} prompts", prompts.len()),
            ));
        }
        for (i, p) in prompts.iter().enumerate() {
            check_prompt(op, &self.config, self.prompt_width, i, p)?;
        }
        self.pending = Some(prompts.to_vec());
        let out = self.reset(None);
        self.pending = None;
        out
    }

    /// The prompts, left-padded to `[B, P]`, with their mask.
    fn pad_prompts(&self, prompts: &[Vec<i64>]) -> Result<(Tensor, Tensor)> {
        let (b, w, pad) = (
            self.config.batch_size,
            self.prompt_width,
            self.config.pad_id(),
        );
        let wu = usize::try_from(w).unwrap_or(0);
        let mut ids = Vec::with_capacity(prompts.len() * wu);
        let mut mask = Vec::with_capacity(ids.capacity());
        for p in prompts {
            let n_pad = wu.saturating_sub(p.len());
            ids.extend(std::iter::repeat_n(pad, n_pad).chain(p.iter().copied()));
            mask.extend(std::iter::repeat_n(0i64, n_pad).chain(std::iter::repeat_n(1, p.len())));
        }
        let device = self.core.specs().device();
        Ok((
            Tensor::from_slice(&ids)
                .f_view([b, w])?
                .f_to_device(device)?,
            Tensor::from_slice(&mask)
                .f_view([b, w])?
                .f_to_device(device)?,
        ))
    }
}

/// Errors for an empty prompt, ids outside `[0, vocab)`, or a prompt wider than the env's
/// prompt width / the context.
fn check_prompt(
    op: &'static str,
    cfg: &TokenEnvConfig,
    width: i64,
    i: usize,
    p: &[i64],
) -> Result<()> {
    let name = format!("prompts[{i}]");
    if p.is_empty() {
        return Err(Error::argument(
            op,
            &name,
            "at least one token",
            "an empty prompt",
        ));
    }
    if let Some(bad) = p.iter().find(|t| !(0..cfg.vocab_size).contains(*t)) {
        return Err(Error::argument(
            op,
            &name,
            format!("token ids in [0, vocab_size = {})", cfg.vocab_size),
            format!("token id {bad}"),
        ));
    }
    let n = p.len() as i64;
    if n + cfg.max_new_tokens > cfg.n_positions {
        return Err(Error::argument(
            op,
            &name,
            format!(
                "prompt length + max_new_tokens <= n_positions = {} (at most {} prompt tokens)",
                cfg.n_positions,
                cfg.n_positions - cfg.max_new_tokens
            ),
            format!("{n} tokens + max_new_tokens {}", cfg.max_new_tokens),
        ));
    }
    if n > width {
        return Err(Error::argument(
            op,
            &name,
            format!(
                "at most the env's prompt width {width} tokens (the longest prompt of its source, \
                 or TokenEnvConfig::prompt_width; fixed until specs take any-length dims)"
            ),
            format!("{n} tokens"),
        ));
    }
    Ok(())
}

/// `t` as int64 of shape `expected`, or an error naming `key`.
fn int_tensor(op: &'static str, key: (&str, &str), t: &Tensor, expected: &[i64]) -> Result<Tensor> {
    let name = format!("(\"{}\", \"{}\")", key.0, key.1);
    if t.size() != expected {
        return Err(Error::ShapeMismatch {
            op,
            key: name,
            expected: expected.to_vec(),
            actual: t.size(),
        });
    }
    match t.kind() {
        Kind::Int64 => Ok(t.shallow_clone()),
        Kind::Bool | Kind::Int | Kind::Int16 | Kind::Int8 | Kind::Uint8 if key.0 == "masks" => {
            Ok(t.f_to_kind(Kind::Int64)?)
        }
        other => Err(Error::DtypeMismatch {
            op,
            key: name,
            expected: Kind::Int64,
            actual: other,
        }),
    }
}

/// Errors when an id of `t` is outside `[0, vocab)`.
fn check_ids(op: &'static str, key: (&str, &str), t: &Tensor, vocab: i64) -> Result<()> {
    if t.numel() == 0 {
        return Ok(());
    }
    let lo = t.f_min()?.f_int64_value(&[])?;
    let hi = t.f_max()?.f_int64_value(&[])?;
    if lo < 0 || hi >= vocab {
        return Err(Error::value(
            op,
            format!("(\"{}\", \"{}\")", key.0, key.1),
            format!("token ids in [0, vocab_size = {vocab})"),
            format!("ids in [{lo}, {hi}]"),
        ));
    }
    Ok(())
}

/// Errors unless `given` (at `key`) equals `built`.
fn check_same(op: &'static str, key: (&str, &str), given: &Tensor, built: &Tensor) -> Result<()> {
    let name = format!("(\"{}\", \"{}\")", key.0, key.1);
    if given.size() != built.size() {
        return Err(Error::ShapeMismatch {
            op,
            key: name,
            expected: built.size(),
            actual: given.size(),
        });
    }
    let same = given
        .f_to_kind(Kind::Int64)?
        .f_to_device(built.device())?
        .f_equal(built)?;
    if !same {
        return Err(Error::value(
            op,
            name,
            "the same values as built from the prompt and the response",
            "different values",
        ));
    }
    Ok(())
}

/// The rows of `t` `[B, T]` where `mask` is 1, on the host.
fn masked_rows(t: &Tensor, mask: &Tensor) -> Result<Vec<Vec<i64>>> {
    let (b, w) = t.size2()?;
    let ids = Vec::<i64>::try_from(t.f_reshape([-1])?.f_to_device(Device::Cpu)?)?;
    let m = Vec::<i64>::try_from(mask.f_reshape([-1])?.f_to_device(Device::Cpu)?)?;
    let wu = usize::try_from(w).unwrap_or(0);
    let mut out = Vec::with_capacity(usize::try_from(b).unwrap_or(0));
    if wu == 0 {
        out.resize(usize::try_from(b).unwrap_or(0), Vec::new());
        return Ok(out);
    }
    for (row, mrow) in ids.chunks(wu).zip(m.chunks(wu)) {
        out.push(
            row.iter()
                .zip(mrow)
                .filter(|(_, m)| **m != 0)
                .map(|(t, _)| *t)
                .collect(),
        );
    }
    Ok(out)
}

/// The response mask `[B, R]` int64 from the tokens alone: everything up to and including the
/// first EOS; without EOS, everything up to the last non-pad token.
fn response_mask(resp: &Tensor, eos: Option<i64>, pad: i64) -> Result<Tensor> {
    let (b, r) = resp.size2()?;
    let device = resp.device();
    let is_eos = match eos {
        Some(e) => resp.f_eq(e)?,
        None => Tensor::f_zeros([b, r], (Kind::Bool, device))?,
    };
    let pos1 = Tensor::f_arange_start(1, r + 1, (Kind::Int64, device))?;
    // without EOS: 1 + the last index of a non-pad token (0 when all pad)
    let non_pad = resp.f_ne(pad)?.f_logical_or(&is_eos)?;
    let len_no_eos = pos1
        .f_mul(&non_pad.f_to_kind(Kind::Int64)?)?
        .f_amax([1i64].as_slice(), false)?;
    // with EOS: 1 + the first EOS index
    let has_eos = is_eos.f_any_dim(1, false)?;
    let first_eos = is_eos.f_to_kind(Kind::Int64)?.f_argmax(1, false)?;
    let len = first_eos
        .f_add_scalar(1)?
        .f_where_self(&has_eos, &len_no_eos)?;
    let pos0 = Tensor::f_arange(r, (Kind::Int64, device))?;
    Ok(pos0
        .f_unsqueeze(0)?
        .f_lt_tensor(&len.f_unsqueeze(1)?)?
        .f_to_kind(Kind::Int64)?)
}

impl EnvBase for TokenEnv {
    crate::envs::base::env_core_field!();

    /// Serves the next `batch_size` prompts (or those of [`TokenEnv::reset_with_prompts`]).
    /// A partial reset draws a full batch too; the base env keeps the old rows it does not
    /// reset.
    fn reset_impl(&mut self, _td: Option<&TensorDict>) -> Result<TensorDict> {
        let b = self.config.batch_size;
        let prompts = match self.pending.take() {
            Some(p) => p,
            None => self.source.next_batch(usize::try_from(b).unwrap_or(0)),
        };
        let (ids, mask) = self.pad_prompts(&prompts)?;
        let device = self.core.specs().device();
        let no = Tensor::f_zeros([b, 1], (Kind::Bool, device))?;
        TensorDict::new([b])?
            .with(PROMPT_KEY, ids)?
            .with(PROMPT_MASK_KEY, mask)?
            .with("score", Tensor::f_zeros([b], (Kind::Float, device))?)?
            .with("done", no.shallow_clone())?
            .with("terminated", no.shallow_clone())?
            .with("truncated", no)
    }

    fn step_impl(&mut self, td: &TensorDict) -> Result<TensorDict> {
        let op = "TokenEnv::step";
        let cfg = &self.config;
        let (b, p, r) = (cfg.batch_size, self.prompt_width, cfg.max_new_tokens);
        let device = self.core.specs().device();
        let prompt =
            int_tensor(op, PROMPT_KEY, td.get_or_err(PROMPT_KEY)?, &[b, p])?.f_to_device(device)?;
        let prompt_mask = int_tensor(
            op,
            PROMPT_MASK_KEY,
            td.get_or_err(PROMPT_MASK_KEY)?,
            &[b, p],
        )?
        .f_to_device(device)?;
        let Some(response) = td.get(RESPONSE_KEY) else {
            return Err(Error::value(
                op,
                "(\"tokens\", \"response\")",
                format!("the policy's response, int64 [{b}, {r}] (batch, max_new_tokens)"),
                "no such entry",
            ));
        };
        if response.dim() != 2 || response.size().first() != Some(&b) {
            return Err(Error::value(
                op,
                "(\"tokens\", \"response\")",
                format!("a response of shape [{b}, {r}] (batch, max_new_tokens)"),
                format!("shape {}", ShapeFmt(&response.size())),
            ));
        }
        // Fixed width until specs take any-length dims (see the module docs).
        let response =
            int_tensor(op, RESPONSE_KEY, response, &response_shape(b, r))?.f_to_device(device)?;
        check_ids(op, PROMPT_KEY, &prompt, cfg.vocab_size)?;
        check_ids(op, RESPONSE_KEY, &response, cfg.vocab_size)?;

        let resp_mask = match td.get(ASSISTANT_MASK_KEY) {
            Some(m) => {
                let m = int_tensor(op, ASSISTANT_MASK_KEY, m, &[b, p + r])?.f_to_device(device)?;
                let on_prompt = m.f_narrow(1, 0, p)?.f_any()?.f_int64_value(&[])? != 0;
                if on_prompt {
                    return Err(Error::value(
                        op,
                        "(\"masks\", \"all_assistant_mask\")",
                        "0 on the prompt positions (1 only on real response tokens)",
                        "1 on a prompt position",
                    ));
                }
                m.f_narrow(1, p, r)?
            }
            None => response_mask(&response, cfg.eos_token_id, cfg.pad_id())?,
        };
        let full = Tensor::f_cat(&[&prompt, &response], 1)?;
        let attention = Tensor::f_cat(&[&prompt_mask, &resp_mask], 1)?;
        if let Some(given) = td.get(FULL_KEY) {
            check_same(op, FULL_KEY, given, &full)?;
        }
        if let Some(given) = td.get(ATTENTION_MASK_KEY) {
            check_same(op, ATTENTION_MASK_KEY, given, &attention)?;
        }

        let live = resp_mask.f_ne(0)?;
        let terminated = match cfg.eos_token_id {
            Some(e) => response.f_eq(e)?.f_logical_and(&live)?.f_any_dim(1, true)?,
            None => Tensor::f_zeros([b, 1], (Kind::Bool, device))?,
        };
        let truncated = terminated.f_logical_not()?;
        let done = Tensor::f_ones([b, 1], (Kind::Bool, device))?;

        // the scorer's view: unpadded lists, the response without its EOS
        let prompts = masked_rows(&prompt, &prompt_mask)?;
        let mut responses = masked_rows(&response, &resp_mask)?;
        let ended = Vec::<bool>::try_from(terminated.f_reshape([-1])?.f_to_device(Device::Cpu)?)?;
        for (resp, e) in responses.iter_mut().zip(&ended) {
            if *e {
                resp.pop();
            }
        }
        let input = ScoreInput {
            prompts: &prompts,
            responses: &responses,
            ended_with_eos: &ended,
            tokens: &full,
            attention_mask: &attention,
            batch_size: b,
        };
        let score = self.scorer.score(&input)?;
        if score.size() != [b] {
            return Err(Error::ShapeMismatch {
                op: "TokenEnv::step (scorer output)",
                key: "score".into(),
                expected: vec![b],
                actual: score.size(),
            });
        }
        if !score.is_floating_point() {
            return Err(Error::DtypeMismatch {
                op: "TokenEnv::step (scorer output)",
                key: "score".into(),
                expected: Kind::Float,
                actual: score.kind(),
            });
        }
        let score = score
            .f_to_kind(Kind::Float)?
            .f_to_device(device)?
            .f_detach()?;

        // the score at the last real response token: index P + L - 1
        let len = resp_mask.f_sum_dim_intlist([1i64].as_slice(), true, Kind::Int64)?;
        let at = len.f_add_scalar(p - 1)?;
        let reward = Tensor::f_zeros([b, p + r], (Kind::Float, device))?
            .f_scatter(1, &at, &score.f_unsqueeze(1)?)?
            .f_unsqueeze(-1)?;

        TensorDict::new([b])?
            .with(PROMPT_KEY, prompt)?
            .with(PROMPT_MASK_KEY, prompt_mask)?
            .with("score", score)?
            .with("reward", reward)?
            .with("done", done)?
            .with("terminated", terminated)?
            .with("truncated", truncated)
    }

    fn set_seed_impl(&mut self, seed: u64) -> Result<()> {
        self.source.reseed(seed);
        Ok(())
    }
}
