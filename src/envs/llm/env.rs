//! [`TokenEnv`]: the token-level RLHF environment. One episode is one step: the reset serves a
//! batch of prompts, the policy answers with a response, and the step scores it.
//!
//! # Layout
//! Batch size `[B]`; every token tensor is int64. `P` is the padded prompt width of the
//! reset (its batch's longest prompt, or [`TokenEnvConfig::prompt_width`] when set) and `R`
//! the response width (the policy's output width, `1 ≤ R ≤ max_new_tokens`); both may
//! change from one step to the next.
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
//! As TorchRL's, with "any length" (`-1`) token dims (see the [specs' dynamic
//! dims](crate::data::specs)): observation `("tokens", "prompt")` `Categorical(vocab)` `[B, -1]`,
//! its mask `Categorical(2)` `[B, -1]`, `"score"` `Unbounded` `[B]`; action `("tokens",
//! "response")` `Categorical(vocab)` `[B, -1]`; reward `Unbounded` `[B, -1, 1]` (`P + R` on
//! each step); `done` / `terminated` / `truncated` bool `[B, 1]`. The base env checks each
//! reward against its spec's rule instead of reshaping it, and
//! [`check_env_specs`](crate::envs::check_env_specs) checks such an env step by step.
//!
//! Without [`TokenEnvConfig::prompt_width`], each reset pads its batch to its own longest
//! prompt, so `P` varies between resets (a partial reset pads to the width of the rows it
//! keeps, and errors on a wider prompt). A trainer that concatenates chunks of rollouts along
//! the batch (e.g. the PPO-RLHF trainer's store, `trainers::ppo`) needs one
//! width: set `prompt_width` (at least the longest prompt), and have the policy pad its
//! responses to `max_new_tokens` (the [`GenerationPolicy`](super::policy::GenerationPolicy)
//! does).
//!
//! # Prompts
//! A list of token-id prompts, served `batch_size` at a time, in order or shuffled (a new
//! seeded permutation per pass), cycling forever; or explicit prompts through
//! [`TokenEnv::reset_with_prompts`]. With [`TokenEnvConfig::num_generations`] `G > 1` (GRPO's
//! groups), a reset draws `batch_size / G` prompts and serves each in `G` consecutive rows.
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
//! let reward_spec = env.specs().reward.get("reward").map(|s| s.shape().to_vec());
//! assert_eq!(reward_spec, Some(vec![2, -1, 1])); // any length: P + R of each step
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
use crate::modules::llm::{check_tokenizer_fits, TextTokenizer};
use crate::rng::Generator;
use crate::tensordict::TensorDict;

/// The layout's keys, declared once in [`crate::modules::llm::keys`].
pub use super::config::TokenEnvConfig;
pub use crate::modules::llm::keys::{
    ASSISTANT_MASK_KEY, ATTENTION_MASK_KEY, FULL_KEY, FULL_LOG_PROBS_KEY, PROMPT_KEY,
    PROMPT_MASK_KEY, RESPONSE_KEY, RESPONSE_LOG_PROBS_KEY,
};

// ------------------------------------------------------------------ prompt source

/// Where a [`TokenEnv`]'s prompt source stands: the current pass's order, the position in
/// it, and the shuffling generator. A trainer saves it with a checkpoint
/// ([`TokenEnv::prompt_state`]) so a resumed run serves the prompts an uninterrupted one
/// would.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PromptState {
    /// The order of the current pass (a permutation of the prompt indices).
    pub order: Vec<usize>,
    /// The next position in `order`.
    pub cursor: usize,
    /// The generator's state ([`Generator::state`]).
    pub rng: [u64; 4],
}

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

/// An "any length" spec dim (TorchRL's `-1`).
const ANY: i64 = -1;

fn build_specs(cfg: &TokenEnvConfig) -> Result<EnvSpecs> {
    let (b, v) = (cfg.batch_size, cfg.vocab_size);
    let flag = Categorical::new(2)?
        .with_shape([b, 1])?
        .with_dtype(Kind::Bool)?;
    EnvSpecs::new([b])?
        .with_observation(
            PROMPT_KEY,
            Categorical::new(v)?.with_dynamic_shape([b, ANY])?,
        )?
        .with_observation(
            PROMPT_MASK_KEY,
            Categorical::new(2)?.with_dynamic_shape([b, ANY])?,
        )?
        .with_observation("score", Unbounded::new().with_shape([b])?)?
        .with_action(
            RESPONSE_KEY,
            Categorical::new(v)?.with_dynamic_shape([b, ANY])?,
        )?
        .with_reward("reward", Unbounded::new().with_dynamic_shape([b, ANY, 1])?)?
        .with_done("done", flag.clone())?
        .with_done("terminated", flag.clone())?
        .with_done("truncated", flag)
}

// ------------------------------------------------------------------ env

/// The token-level environment. See the [module docs](self) for the keys and specs.
pub struct TokenEnv {
    core: EnvCore,
    config: TokenEnvConfig,
    source: PromptSource,
    scorer: Box<dyn Scorer>,
    /// Prompts for the next reset, from [`TokenEnv::reset_with_prompts`].
    pending: Option<Vec<Vec<i64>>>,
}

impl fmt::Debug for TokenEnv {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenEnv")
            .field("config", &self.config)
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
        for (i, p) in prompts.iter().enumerate() {
            check_prompt(op, &config, i, p)?;
        }
        let specs = build_specs(&config)?;
        Ok(TokenEnv {
            core: EnvCore::new(specs)?,
            source: PromptSource::new(prompts, config.shuffle, config.seed),
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
        check_tokenizer_fits(op, tokenizer, config.vocab_size)?;
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

    /// The fixed padded prompt width of every reset ([`TokenEnvConfig::prompt_width`]);
    /// `None` when each reset pads to its batch's longest prompt.
    pub fn prompt_width(&self) -> Option<i64> {
        self.config.prompt_width
    }

    /// Resets with these prompts (exactly `batch_size / num_generations` of them, checked like
    /// the source's; each fills `num_generations` consecutive rows) instead of the source's
    /// next ones; the source does not advance.
    pub fn reset_with_prompts(&mut self, prompts: &[Vec<i64>]) -> Result<TensorDict> {
        let op = "TokenEnv::reset_with_prompts";
        let (b, g) = (self.config.batch_size, self.config.num_generations);
        let n = self.config.prompts_per_reset();
        if prompts.len() as i64 != n {
            return Err(Error::argument(
                op,
                "prompts",
                format!("{n} prompts (the env's batch size {b} / num_generations {g})"),
                format!("{} prompts", prompts.len()),
            ));
        }
        for (i, p) in prompts.iter().enumerate() {
            check_prompt(op, &self.config, i, p)?;
        }
        self.pending = Some(repeat_rows(prompts, g));
        let out = self.reset(None);
        self.pending = None;
        out
    }

    /// Where the prompt source stands, to save with a checkpoint.
    pub fn prompt_state(&self) -> PromptState {
        PromptState {
            order: self.source.order.clone(),
            cursor: self.source.cursor,
            rng: self.source.rng.state(),
        }
    }

    /// Restores a [`PromptState`] saved by [`TokenEnv::prompt_state`] of an env over the same
    /// prompts.
    ///
    /// # Errors
    /// When `order` is not a permutation of this env's prompt indices or `cursor` is past
    /// its end; nothing changes then.
    pub fn set_prompt_state(&mut self, state: PromptState) -> Result<()> {
        let n = self.source.prompts.len();
        let mut seen = vec![false; n];
        let is_permutation = state.order.len() == n
            && state
                .order
                .iter()
                .all(|&i| seen.get_mut(i).is_some_and(|s| !std::mem::replace(s, true)));
        if !is_permutation || state.cursor > n {
            return Err(Error::value(
                "TokenEnv::set_prompt_state",
                "state",
                format!("an order over this env's {n} prompts and a cursor <= {n}"),
                format!(
                    "an order of {} indices, cursor {}",
                    state.order.len(),
                    state.cursor
                ),
            ));
        }
        self.source.order = state.order;
        self.source.cursor = state.cursor;
        self.source.rng = Generator::from_state(state.rng);
        Ok(())
    }

    /// The prompts, left-padded to `[B, P]`, with their mask. `P`: the fixed prompt width,
    /// else `keep` (the width of the rows a partial reset keeps), else the longest prompt.
    fn pad_prompts(&self, prompts: &[Vec<i64>], keep: Option<i64>) -> Result<(Tensor, Tensor)> {
        let longest = prompts.iter().map(Vec::len).max().unwrap_or(0) as i64;
        let (b, w, pad) = (
            self.config.batch_size,
            self.config.prompt_width.or(keep).unwrap_or(longest),
            self.config.pad_id(),
        );
        if longest > w {
            return Err(Error::value(
                "TokenEnv::reset",
                "(\"tokens\", \"prompt\")",
                format!(
                    "prompts of at most {w} tokens: a partial reset keeps its other rows at their \
                     width {w} (set TokenEnvConfig::prompt_width to give every reset one width)"
                ),
                format!("a prompt of {longest} tokens"),
            ));
        }
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

/// Each of `prompts` `g` times in consecutive rows.
fn repeat_rows(prompts: &[Vec<i64>], g: i64) -> Vec<Vec<i64>> {
    let g = usize::try_from(g).unwrap_or(1).max(1);
    prompts
        .iter()
        .flat_map(|p| std::iter::repeat_n(p, g).cloned())
        .collect()
}

/// The prompt width of the rows a partial reset keeps: `td`'s `[B, P]` prompt when its
/// `"_reset"` mask leaves a row out; `None` for a full reset.
fn partial_reset_width(td: &TensorDict) -> Result<Option<i64>> {
    let (Some(reset), Some(prompt)) = (td.get("_reset"), td.get(PROMPT_KEY)) else {
        return Ok(None);
    };
    let keeps_a_row = crate::envs::utils::any_true(&reset.f_to_kind(Kind::Bool)?.f_logical_not()?)?;
    Ok(match prompt.size().as_slice() {
        [_, p] if keeps_a_row => Some(*p),
        _ => None,
    })
}

/// Errors for an empty prompt, ids outside `[0, vocab)`, or a prompt wider than the context /
/// the config's fixed prompt width.
fn check_prompt(op: &'static str, cfg: &TokenEnvConfig, i: usize, p: &[i64]) -> Result<()> {
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
    if let Some(width) = cfg.prompt_width.filter(|w| n > *w) {
        return Err(Error::argument(
            op,
            &name,
            format!("at most the env's fixed prompt width {width} tokens (TokenEnvConfig::prompt_width)"),
            format!("{n} tokens"),
        ));
    }
    Ok(())
}

/// The width `P` of a step's `[B, P]` prompt: 2-D with the env's batch, at least one token,
/// room for `max_new_tokens` in the context, and the config's fixed width when it has one.
fn prompt_width_of(op: &'static str, cfg: &TokenEnvConfig, prompt: &Tensor) -> Result<i64> {
    let (b, room) = (cfg.batch_size, cfg.n_positions - cfg.max_new_tokens);
    let size = prompt.size();
    let (fits, want) = match cfg.prompt_width {
        Some(w) => (
            size == [b, w],
            format!("[{b}, {w}] (batch, TokenEnvConfig::prompt_width)"),
        ),
        None => (
            matches!(size.as_slice(), [pb, p] if *pb == b && (1..=room).contains(p)),
            format!("[{b}, P] with 1 <= P <= n_positions - max_new_tokens = {room}"),
        ),
    };
    match (fits, size.as_slice()) {
        (true, [_, p]) => Ok(*p),
        _ => Err(Error::value(
            op,
            "(\"tokens\", \"prompt\")",
            format!("a prompt of shape {want}"),
            format!("shape {}", ShapeFmt(&size)),
        )),
    }
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

/// The `[B, P + R]` tensor under `key`: the policy's, when it wrote one, after checking that
/// its two parts are `prefix` `[B, P]` and `suffix` `[B, R]` (compared in place, nothing is
/// rebuilt); else built once from them.
fn joined(
    op: &'static str,
    td: &TensorDict,
    key: (&str, &str),
    prefix: &Tensor,
    suffix: &Tensor,
) -> Result<Tensor> {
    let Some(given) = td.get(key) else {
        return Ok(Tensor::f_cat(&[prefix, suffix], 1)?);
    };
    let name = format!("(\"{}\", \"{}\")", key.0, key.1);
    let (p, r) = (
        prefix.size().get(1).copied().unwrap_or(0),
        suffix.size().get(1).copied().unwrap_or(0),
    );
    let b = prefix.size().first().copied().unwrap_or(0);
    if given.size() != [b, p + r] {
        return Err(Error::ShapeMismatch {
            op,
            key: name,
            expected: vec![b, p + r],
            actual: given.size(),
        });
    }
    let given = given.f_to_kind(Kind::Int64)?.f_to_device(prefix.device())?;
    let same =
        given.f_narrow(1, 0, p)?.f_equal(prefix)? && given.f_narrow(1, p, r)?.f_equal(suffix)?;
    if !same {
        return Err(Error::value(
            op,
            name,
            "the same values as built from the prompt and the response",
            "different values",
        ));
    }
    Ok(given)
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
    /// A partial reset draws a full batch too, padded to the width of the prompts it is given
    /// (an error when a new prompt is wider and no fixed width is set); the base env keeps
    /// the old rows it does not reset.
    fn reset_impl(&mut self, td: Option<&TensorDict>) -> Result<TensorDict> {
        let b = self.config.batch_size;
        let keep = match td {
            Some(td) => partial_reset_width(td)?,
            None => None,
        };
        let prompts = match self.pending.take() {
            Some(p) => p,
            None => {
                let n = usize::try_from(self.config.prompts_per_reset()).unwrap_or(0);
                repeat_rows(&self.source.next_batch(n), self.config.num_generations)
            }
        };
        let (ids, mask) = self.pad_prompts(&prompts, keep)?;
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
        let (b, max_r) = (cfg.batch_size, cfg.max_new_tokens);
        let device = self.core.specs().device();
        let prompt = td.get_or_err(PROMPT_KEY)?;
        let p = prompt_width_of(op, cfg, prompt)?;
        let prompt = int_tensor(op, PROMPT_KEY, prompt, &[b, p])?.f_to_device(device)?;
        let prompt_mask = int_tensor(
            op,
            PROMPT_MASK_KEY,
            td.get_or_err(PROMPT_MASK_KEY)?,
            &[b, p],
        )?
        .f_to_device(device)?;
        let want =
            format!("[{b}, R] with 1 <= R <= max_new_tokens = {max_r} (batch, response width)");
        let Some(response) = td.get(RESPONSE_KEY) else {
            return Err(Error::value(
                op,
                "(\"tokens\", \"response\")",
                format!("the policy's response, int64 {want}"),
                "no such entry",
            ));
        };
        let r = match response.size().as_slice() {
            [rb, r] if *rb == b && (1..=max_r).contains(r) => *r,
            other => {
                return Err(Error::value(
                    op,
                    "(\"tokens\", \"response\")",
                    format!("a response of shape {want}"),
                    format!("shape {}", ShapeFmt(other)),
                ))
            }
        };
        let response = int_tensor(op, RESPONSE_KEY, response, &[b, r])?.f_to_device(device)?;
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
        // the policy's full tokens and mask when it wrote them (checked, not rebuilt)
        let full = joined(op, td, FULL_KEY, &prompt, &response)?;
        let attention = joined(op, td, ATTENTION_MASK_KEY, &prompt_mask, &resp_mask)?;

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
