//! Batched generation for any [`CausalLm`]: greedy or sampled decoding with a KV cache,
//! `transformers`' options (temperature, top-k, top-p, `max_new_tokens`, `min_new_tokens`,
//! EOS and pad ids) and trlX's per-token logit mask.
//!
//! **How a step decides** (the order of `transformers`' logits processors): the last
//! position's logits; the logit mask (trlX's `[vocab, vocab]` bool table, `true` = forbidden,
//! indexed by each row's last token) and `min_new_tokens` (EOS forbidden until that many tokens
//! were generated) in every mode; then, when sampling, temperature, top-k and top-p; then the
//! argmax (greedy) or a draw. A row that produced EOS is finished: it receives the pad id from
//! then on, and generation stops as soon as every row is finished (or after
//! `max_new_tokens`).
//!
//! **Sampling** happens on the tensors' device: the uniforms of every step are drawn up front
//! from a seeded [`Generator`] (one host-to-device copy), and each step inverts the
//! categorical CDF with `searchsorted`. The same seed gives the same tokens; the all-finished
//! check reads one flag per step on the CPU and one per 8 steps on other devices (a few
//! extra steps of padding are then computed and trimmed, with identical results).
//!
//! **Log-probs**: [`GenerationOutput::log_probs`] holds each generated token's log-probability
//! under the model's distribution at the sampling temperature (`log_softmax(logits / T)`,
//! before the mask, top-k and top-p: the distribution PPO and the KL penalty compare); 0 where
//! the response mask is 0.
//!
//! **Shared prompts** ([`GenerateOptions::prompt_groups`]): rows that come in consecutive
//! groups of identical prompts (GRPO's completions of one prompt) run the prompt pass once per
//! group; the KV cache is repeated to the group's rows, and decoding is as without it.
//!
//! **Finished rows** are compacted away: once at least a quarter of the decoded rows produced
//! EOS and two or more steps remain, the KV cache keeps only the live rows and later steps run
//! on them alone (the finished rows' tokens are the pad id either way). The outputs are the
//! same as decoding every row to the end, up to the rounding of a smaller matrix product;
//! [`GenerateOptions::keep_finished_rows`] turns it off.
//!
//! # Shapes
//! prompt `[B, P]` (left-padded, with its mask); `sequences` `[B, P + G]`; `response`,
//! `response_mask`, `log_probs` `[B, G]`, `G ≤ max_new_tokens`; `attention_mask` `[B, P + G]`.
//!
//! ```
//! use tch::{nn::VarStore, Device, Kind, Tensor};
//! use torchrl::modules::llm::{
//!     generate, generate_greedy, GenerateOptions, GenerationConfig, Gpt2Config, Gpt2Model,
//! };
//! use torchrl::Generator;
//! # fn main() -> torchrl::Result<()> {
//! tch::manual_seed(0);
//! let vs = VarStore::new(Device::Cpu);
//! let cfg = Gpt2Config::new(30).with_n_layer(2).with_n_embd(16).with_n_head(2).with_n_positions(32);
//! let model = Gpt2Model::new(&vs.root(), &cfg)?;
//! let prompt = Tensor::from_slice(&[0i64, 5, 6, 7, 8, 9]).view([2, 3]);
//! let mask = Tensor::from_slice(&[0i64, 1, 1, 1, 1, 1]).view([2, 3]); // row 0 left-padded
//! let gen_cfg = GenerationConfig::new(6).with_do_sample(true).with_top_k(10).with_pad_token_id(0);
//! let out = generate(&model, &prompt, Some(&mask), &gen_cfg, &mut Generator::new(7))?;
//! assert_eq!(out.sequences.size(), vec![2, 9]);
//! assert_eq!(out.log_probs.size(), vec![2, 6]);
//! // seeded: the same seed gives the same tokens
//! let again = generate(&model, &prompt, Some(&mask), &gen_cfg, &mut Generator::new(7))?;
//! assert!(out.sequences.equal(&again.sequences));
//! // greedy decoding draws nothing: no generator is needed
//! let opts = GenerateOptions::default();
//! let greedy = generate_greedy(&model, &prompt, Some(&mask), &GenerationConfig::new(4), &opts)?;
//! assert_eq!(greedy.sequences.size(), vec![2, 7]);
//! // a token id outside the vocabulary is an error, before any compute
//! assert!(generate(&model, &(prompt + 100), None, &gen_cfg, &mut Generator::new(7)).is_err());
//! # Ok(()) }
//! ```
//!
//! **Special ids** follow `transformers`: an EOS or pad id the config leaves unset is the
//! model's ([`LmFacts`](super::LmFacts): the checkpoint's `config.json`, overridden by a
//! `generation_config.json` beside it); the pad id then falls back to the EOS id, then 0.
//! [`GenerationConfig::with_model_defaults(false)`](GenerationConfig::with_model_defaults)
//! uses the config's ids alone.

use serde::{Deserialize, Serialize};
use tch::{Device, Kind, Tensor};

use super::causal_lm::{CausalLm, ForwardOptions, LmFacts};
use super::compaction::ActiveRows;
use super::decode::{BlockCapture, DecodeState, Rows};
use super::nn::packed::{PackedScope, PackedWeightCache};
use crate::error::require;
use crate::error::{Error, Result, ShapeFmt};
use crate::macros::setters;
use crate::rng::Generator;

/// How to generate (`transformers`' `GenerationConfig` names and defaults: greedy, 20 new
/// tokens, temperature 1, top-k 50 and top-p 1 when sampling).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GenerationConfig {
    /// The most tokens generated per row.
    pub max_new_tokens: i64,
    /// EOS is forbidden until this many tokens were generated.
    #[serde(default)]
    pub min_new_tokens: i64,
    /// Sample (`true`) or take the argmax (`false`).
    #[serde(default)]
    pub do_sample: bool,
    /// Divides the logits when sampling (must be > 0).
    #[serde(default = "one")]
    pub temperature: f64,
    /// Keep the `top_k` highest-scoring tokens when sampling (0: all).
    #[serde(default = "fifty")]
    pub top_k: i64,
    /// Keep the smallest set of tokens whose probability reaches `top_p` when sampling (1: all).
    #[serde(default = "one")]
    pub top_p: f64,
    /// The end-of-sequence id: a row that produces it is finished (`None`: the model's, see
    /// [`model_defaults`](Self::model_defaults)).
    #[serde(default)]
    pub eos_token_id: Option<i64>,
    /// The id written after a row finished (`None`: the model's, else the EOS id, as
    /// `transformers` does).
    #[serde(default)]
    pub pad_token_id: Option<i64>,
    /// Whether an unset `eos_token_id` / `pad_token_id` takes the model's
    /// ([`LmFacts`](super::LmFacts): the checkpoint's `config.json` / `generation_config.json`),
    /// as `transformers`' `generate` does (default `true`). `false`: unset means none (no EOS;
    /// pad 0).
    #[serde(default = "yes")]
    pub model_defaults: bool,
}

fn one() -> f64 {
    1.0
}
fn yes() -> bool {
    true
}
fn fifty() -> i64 {
    50
}

impl Default for GenerationConfig {
    fn default() -> Self {
        GenerationConfig::new(20)
    }
}

impl GenerationConfig {
    /// Greedy decoding of up to `max_new_tokens` tokens, `transformers`' other defaults.
    pub fn new(max_new_tokens: i64) -> Self {
        GenerationConfig {
            max_new_tokens,
            min_new_tokens: 0,
            do_sample: false,
            temperature: 1.0,
            top_k: 50,
            top_p: 1.0,
            eos_token_id: None,
            pad_token_id: None,
            model_defaults: true,
        }
    }

    /// Sampling from the model's full distribution (top-k 0, top-p 1, temperature 1): what
    /// RLHF rollouts want, so that the sampled tokens' log-probs are the policy's (TRL's PPO
    /// settings; top-k / top-p truncation is a known cause of negative KL).
    pub fn rlhf_sampling(max_new_tokens: i64) -> Self {
        GenerationConfig::new(max_new_tokens)
            .with_do_sample(true)
            .with_top_k(0)
    }

    setters! {
        /// Sets `min_new_tokens`.
        with_min_new_tokens(min_new_tokens: i64);
        /// Sets `do_sample`.
        with_do_sample(do_sample: bool);
        /// Sets the temperature.
        with_temperature(temperature: f64);
        /// Sets top-k (0 disables it).
        with_top_k(top_k: i64);
        /// Sets top-p (1 disables it).
        with_top_p(top_p: f64);
        /// Sets the EOS id.
        with_eos_token_id(id: i64) => eos_token_id = Some(id);
        /// Sets the pad id.
        with_pad_token_id(id: i64) => pad_token_id = Some(id);
        /// Sets whether unset EOS / pad ids take the model's (default `true`).
        with_model_defaults(on: bool) => model_defaults = on;
    }

    /// The pad id of this config alone: `pad_token_id`, else `eos_token_id`, else 0 (see
    /// [`resolved`](Self::resolved) for the ids a generation uses).
    pub fn pad_id(&self) -> i64 {
        self.pad_token_id.or(self.eos_token_id).unwrap_or(0)
    }

    /// This config with the special ids a generation on a model with `facts` uses: an unset
    /// `eos_token_id` / `pad_token_id` is the model's (when
    /// [`model_defaults`](Self::model_defaults)), and the pad id then falls back to the EOS id
    /// (`transformers`' `generate`).
    ///
    /// ```
    /// use torchrl::modules::llm::{GenerationConfig, Gpt2Config};
    /// let facts = Gpt2Config::new(30).with_special_tokens(None, Some(7), None).facts();
    /// let cfg = GenerationConfig::new(4).resolved(&facts);
    /// assert_eq!((cfg.eos_token_id, cfg.pad_id()), (Some(7), 7));
    /// // set ids win; model_defaults(false) ignores the model's
    /// let own = GenerationConfig::new(4).with_eos_token_id(3).resolved(&facts);
    /// assert_eq!((own.eos_token_id, own.pad_id()), (Some(3), 3));
    /// let none = GenerationConfig::new(4).with_model_defaults(false).resolved(&facts);
    /// assert_eq!((none.eos_token_id, none.pad_id()), (None, 0));
    /// // a checkpoint's id outside the vocabulary names no token (Llama's `pad_token_id: -1`)
    /// let odd = Gpt2Config::new(30).with_special_tokens(None, Some(7), Some(-1)).facts();
    /// assert_eq!(GenerationConfig::new(4).resolved(&odd).pad_id(), 7);
    /// ```
    pub fn resolved(&self, facts: &LmFacts) -> GenerationConfig {
        let mut out = self.clone();
        if self.model_defaults {
            // a checkpoint's id outside its vocabulary (early Llama conversions write
            // `"pad_token_id": -1`) names no token: it is no default
            let valid = |id: Option<i64>| id.filter(|id| (0..facts.vocab_size).contains(id));
            out.eos_token_id = self.eos_token_id.or(valid(facts.eos_token_id));
            out.pad_token_id = self.pad_token_id.or(valid(facts.pad_token_id));
        }
        out
    }

    /// Whether a generation with this config on `model` returns, in
    /// [`GenerationOutput::log_probs`], the log-probs a full forward of `model` over the
    /// sequences gives ([`token_log_probs`](super::token_log_probs) of its raw logits, what the
    /// RLHF trainers' policy pass recomputes), up to the rounding between the cached
    /// incremental pass and the full one. Conservative: all of
    /// - greedy decoding, or sampling at temperature exactly 1 (the log-probs are taken at the
    ///   sampling temperature; top-k, top-p, the logit mask and `min_new_tokens` act after
    ///   them and do not matter);
    /// - a float32 or float64 model (half-precision rounding between the two passes is not
    ///   negligible);
    /// - no active dropout: the only dropout in these models is LoRA's `lora_dropout`, active
    ///   while the adapters' switch is training ([`LoraSwitch::is_training`](super::LoraSwitch::is_training)).
    ///
    /// ```
    /// use tch::{nn::VarStore, Device, Kind};
    /// use torchrl::modules::llm::{CausalLmConfig, GenerationConfig, Gpt2Config};
    /// # fn main() -> torchrl::Result<()> {
    /// let mut vs = VarStore::new(Device::Cpu);
    /// let model = Gpt2Config::new(30).with_n_layer(1).with_n_embd(8).with_n_head(2).build(&vs.root())?;
    /// assert!(GenerationConfig::rlhf_sampling(4).log_probs_are_the_models(model.as_ref()));
    /// assert!(GenerationConfig::new(4).log_probs_are_the_models(model.as_ref())); // greedy
    /// let hot = GenerationConfig::rlhf_sampling(4).with_temperature(0.7);
    /// assert!(!hot.log_probs_are_the_models(model.as_ref()));
    /// vs.set_kind(Kind::BFloat16);
    /// assert!(!GenerationConfig::rlhf_sampling(4).log_probs_are_the_models(model.as_ref()));
    /// # Ok(()) }
    /// ```
    pub fn log_probs_are_the_models(&self, model: &dyn CausalLm) -> bool {
        let untempered = !self.do_sample || self.temperature == 1.0;
        untempered && decode_matches_forward(model)
    }

    /// Checks the fields on their own and against a vocabulary of `vocab` tokens.
    pub fn validate(&self, vocab: i64) -> Result<()> {
        let op = "GenerationConfig";
        let (max_new, min_new) = (self.max_new_tokens, self.min_new_tokens);
        require(max_new >= 0, op, "max_new_tokens", ">= 0", max_new)?;
        let range = format!("in [0, max_new_tokens = {max_new}]");
        require(
            (0..=max_new).contains(&min_new),
            op,
            "min_new_tokens",
            range,
            min_new,
        )?;
        let t = self.temperature;
        let positive = "a finite number > 0 (greedy decoding is do_sample = false)";
        require(t.is_finite() && t > 0.0, op, "temperature", positive, t)?;
        require(
            self.top_k >= 0,
            op,
            "top_k",
            ">= 0 (0 disables it)",
            self.top_k,
        )?;
        let p = self.top_p;
        require(p > 0.0 && p <= 1.0, op, "top_p", "in (0, 1]", p)?;
        for (field, id) in [
            ("eos_token_id", self.eos_token_id),
            ("pad_token_id", self.pad_token_id),
        ] {
            if let Some(id) = id {
                let ids = format!("a token id in [0, {vocab})");
                require((0..vocab).contains(&id), op, field, ids, id)?;
            }
        }
        Ok(())
    }
}

/// trlX's logit mask: a `[vocab, vocab]` bool table whose row `i` marks the tokens that may
/// not follow token `i`.
#[derive(Debug)]
pub struct LogitMask(Tensor);

impl LogitMask {
    /// Wraps a `[vocab, vocab]` bool (or 0/1 integer) table.
    pub fn new(table: Tensor) -> Result<Self> {
        let size = table.size();
        if size.len() != 2 || size.first() != size.get(1) {
            return Err(Error::value(
                "LogitMask::new",
                "table",
                "a square [vocab, vocab] table",
                format!("shape {}", ShapeFmt(&size)),
            ));
        }
        Ok(LogitMask(table.f_to_kind(Kind::Bool)?))
    }

    /// The table.
    pub fn table(&self) -> &Tensor {
        &self.0
    }

    /// The forbidden-next-token rows for `last` `[B]`: `[B, vocab]`.
    pub fn forbidden(&self, last: &Tensor) -> Result<Tensor> {
        Ok(self.0.f_index_select(0, last)?)
    }
}

/// What [`generate`] returns. See the [module docs](self) for shapes.
#[derive(Debug)]
pub struct GenerationOutput {
    /// Prompt and response, `[B, P + G]`.
    pub sequences: Tensor,
    /// The generated part, `[B, G]` (pad id after a row finished).
    pub response: Tensor,
    /// `true` for generated tokens up to and including EOS, `[B, G]`.
    pub response_mask: Tensor,
    /// The log-probability of each generated token (see the [module docs](self)), float32,
    /// 0 where the response mask is `false`, `[B, G]`.
    pub log_probs: Tensor,
    /// The prompt's mask followed by the response mask, int64 `[B, P + G]`: what a later
    /// forward over `sequences` should attend to (`tokens != pad` is wrong when pad == EOS).
    pub attention_mask: Tensor,
    /// With [`GenerateOptions::capture_block_input`] `= Some(k)`: the hidden state entering
    /// block `k` at every position of `sequences` whose token the decode fed to the model,
    /// `[B, P + G, hidden]` in the model's dtype: what [`ForwardOptions::capture_block_input`]
    /// returns for a forward over `sequences` under `attention_mask`, up to rounding, at
    /// every position the mask keeps but each row's last one. A decode never feeds the token
    /// it sampled last (nor, once finished rows are compacted away, a row's EOS), so those
    /// positions hold zeros, as may the positions the mask drops. What a causal model computes
    /// for token `t` reads positions `< t` only, so every valid token's log-prob and value
    /// can be computed from it. `None` otherwise.
    pub block_input: Option<Tensor>,
}

/// Extra inputs of a generation beyond the config.
///
/// ```
/// use tch::{nn::VarStore, Device, Tensor};
/// use torchrl::modules::llm::{generate_with, GenerateOptions, GenerationConfig, Gpt2Config, Gpt2Model};
/// use torchrl::Generator;
/// # fn main() -> torchrl::Result<()> {
/// tch::manual_seed(0);
/// let vs = VarStore::new(Device::Cpu);
/// let cfg = Gpt2Config::new(30).with_n_layer(2).with_n_embd(16).with_n_head(2).with_n_positions(32);
/// let model = Gpt2Model::new(&vs.root(), &cfg)?;
/// // two prompts, each served in 3 consecutive rows (GRPO's groups)
/// let prompt = Tensor::from_slice(&[4i64, 5, 4, 5, 4, 5, 7, 8, 7, 8, 7, 8]).view([6, 2]);
/// let gen_cfg = GenerationConfig::rlhf_sampling(5).with_pad_token_id(0);
/// let shared = GenerateOptions::default().with_prompt_groups(3);
/// let out = generate_with(&model, &prompt, None, &gen_cfg, &shared, &mut Generator::new(1))?;
/// // the prompt pass ran on 2 rows, the decode on 6: the same tokens as without sharing
/// let plain = generate_with(&model, &prompt, None, &gen_cfg, &GenerateOptions::default(), &mut Generator::new(1))?;
/// assert!(out.sequences.equal(&plain.sequences));
/// // rows of a group that differ are an error, not a silent fallback
/// let mixed = Tensor::from_slice(&[4i64, 5, 4, 6, 4, 5, 7, 8, 7, 8, 7, 8]).view([6, 2]);
/// assert!(generate_with(&model, &mixed, None, &gen_cfg, &shared, &mut Generator::new(1)).is_err());
/// # Ok(()) }
/// ```
#[derive(Debug, Default, Clone, Copy)]
pub struct GenerateOptions<'a> {
    /// trlX's logit mask.
    pub logit_mask: Option<&'a LogitMask>,
    /// The rows come in consecutive groups of this many identical prompts (identical ids and
    /// attention masks: GRPO's `num_generations` completions of one prompt, as the
    /// [`TokenEnv`](crate::envs::llm::TokenEnv) serves them). The prompt pass then runs on
    /// one row per group and its KV cache (and last hidden state) is repeated to every row of
    /// the group before decoding, which proceeds over all `B` rows as without it: the same
    /// tokens (greedy, or sampled from the same seed: the uniforms are drawn as `[steps, B]`
    /// either way) and the same log-probs up to rounding. `0` (the default) and `1`: every
    /// row is its own prompt.
    ///
    /// # Errors
    /// A batch that is not a multiple of the group size, or a group whose rows differ
    /// (checked with one comparison and one host read; generation does not fall back).
    pub prompt_groups: usize,
    /// Decode every row to the end, finished or not. `false` (the default): once at least a
    /// quarter of the decoded rows produced EOS (and two or more steps remain), the decode
    /// continues on the live rows only ("Finished rows" in the [module docs](self)); the outputs keep
    /// their shapes and values (the same tokens, greedy or sampled from the same seed; the
    /// same log-probs up to the rounding of a smaller matrix product).
    pub keep_finished_rows: bool,
    /// Keep the hidden state entering this block (`0..=n_layer`) at every position the decode
    /// feeds, prompt and response, in [`GenerationOutput::block_input`]: the decode computes it
    /// anyway, nothing runs twice. A hydra model's rollout hands it to the reference branch
    /// and the updates instead of running the frozen trunk again over the sequences
    /// ([`CausalLmWithHydraValueHead::frozen_trunk_end`](super::CausalLmWithHydraValueHead::frozen_trunk_end)).
    /// `None` (the default): nothing kept.
    ///
    /// # Errors
    /// A block index above `n_layer`; [`ilql_generate`](super::ilql_generate) refuses it.
    pub capture_block_input: Option<usize>,
    /// Keep the packed copies of the model's frozen weights here across generations
    /// ([`PackedWeightCache`]: a CPU float32 decode multiplies through packed weights, and a
    /// frozen weight need not be packed again at each one). `None` (the default): every
    /// decode packs what it uses and frees it at the end.
    pub packed_weights: Option<&'a PackedWeightCache>,
}

impl<'a> GenerateOptions<'a> {
    /// Sets trlX's logit mask.
    pub fn with_logit_mask(mut self, mask: &'a LogitMask) -> Self {
        self.logit_mask = Some(mask);
        self
    }

    /// Sets [`prompt_groups`](Self::prompt_groups): the rows come in consecutive groups of `g`
    /// identical prompts, whose prompt pass runs once per group.
    pub fn with_prompt_groups(mut self, g: usize) -> Self {
        self.prompt_groups = g;
        self
    }

    /// Sets [`keep_finished_rows`](Self::keep_finished_rows): `true` decodes finished rows to
    /// the end instead of compacting them away.
    pub fn with_keep_finished_rows(mut self, keep: bool) -> Self {
        self.keep_finished_rows = keep;
        self
    }

    /// Sets [`capture_block_input`](Self::capture_block_input): keep the input of `block` at
    /// every position.
    ///
    /// ```
    /// use tch::{nn::VarStore, Device, Tensor};
    /// use torchrl::modules::llm::{generate_with, CausalLm, GenerateOptions, GenerationConfig, Gpt2Config, Gpt2Model, LmInput};
    /// use torchrl::Generator;
    /// # fn main() -> torchrl::Result<()> {
    /// tch::manual_seed(0);
    /// let vs = VarStore::new(Device::Cpu);
    /// let cfg = Gpt2Config::new(30).with_n_layer(3).with_n_embd(16).with_n_head(2).with_n_positions(32);
    /// let model = Gpt2Model::new(&vs.root(), &cfg)?;
    /// let prompt = Tensor::from_slice(&[0i64, 5, 6, 7, 8, 9]).view([2, 3]);
    /// let mask = Tensor::from_slice(&[0i64, 1, 1, 1, 1, 1]).view([2, 3]);
    /// let gen_cfg = GenerationConfig::rlhf_sampling(5).with_pad_token_id(0);
    /// let opts = GenerateOptions::default().with_capture_block_input(2);
    /// let out = generate_with(&model, &prompt, Some(&mask), &gen_cfg, &opts, &mut Generator::new(3))?;
    /// let kept = out.block_input.unwrap();
    /// assert_eq!(kept.size(), vec![2, 8, 16]);
    /// // the trunk over the finished sequences gives the same hidden states where the mask is
    /// // 1, but at the last token (no EOS here: the last position), which was never fed
    /// let input = LmInput::new(&out.sequences).with_attention_mask(&out.attention_mask);
    /// let again = model.forward_to_block(&input, 2)?;
    /// let fed = out.attention_mask.narrow(1, 0, 7).unsqueeze(-1);
    /// let d = ((kept.narrow(1, 0, 7) - again.narrow(1, 0, 7)) * fed).abs().max().double_value(&[]);
    /// assert!(d < 1e-5);
    /// assert_eq!(kept.select(1, 7).abs().max().double_value(&[]), 0.0);
    /// # Ok(()) }
    /// ```
    pub fn with_capture_block_input(mut self, block: usize) -> Self {
        self.capture_block_input = Some(block);
        self
    }

    /// Sets [`packed_weights`](Self::packed_weights): the frozen weights' packed copies are
    /// kept in `cache` across generations.
    pub fn with_packed_weights(mut self, cache: &'a PackedWeightCache) -> Self {
        self.packed_weights = Some(cache);
        self
    }
}

/// Generates continuations of `prompt` `[B, P]` (int64, left-padded, `attention_mask` 1 on
/// real tokens; `None`: no padding), sampling from `rng` when `config.do_sample` (greedy
/// decoding draws nothing from it; [`generate_greedy`] needs none). Unset EOS / pad ids are
/// the model's ([`GenerationConfig::resolved`]). See the [module docs](self).
///
/// # Errors
/// An invalid config (ids outside the vocabulary included), a prompt that does not fit the
/// context, or token ids outside the vocabulary.
pub fn generate(
    model: &dyn CausalLm,
    prompt: &Tensor,
    attention_mask: Option<&Tensor>,
    config: &GenerationConfig,
    rng: &mut Generator,
) -> Result<GenerationOutput> {
    generate_impl(
        model,
        prompt,
        attention_mask,
        config,
        &GenerateOptions::default(),
        Some(rng),
    )
    .map(|(out, _)| out)
}

/// [`generate`] with a logit mask.
pub fn generate_with(
    model: &dyn CausalLm,
    prompt: &Tensor,
    attention_mask: Option<&Tensor>,
    config: &GenerationConfig,
    options: &GenerateOptions<'_>,
    rng: &mut Generator,
) -> Result<GenerationOutput> {
    generate_impl(model, prompt, attention_mask, config, options, Some(rng)).map(|(out, _)| out)
}

/// Greedy decoding ([`generate`] with `do_sample = false`), which needs no generator.
///
/// # Errors
/// As [`generate`]; and a config with `do_sample = true` (sampling needs a [`Generator`]:
/// call [`generate`]).
pub fn generate_greedy(
    model: &dyn CausalLm,
    prompt: &Tensor,
    attention_mask: Option<&Tensor>,
    config: &GenerationConfig,
    options: &GenerateOptions<'_>,
) -> Result<GenerationOutput> {
    generate_impl(model, prompt, attention_mask, config, options, None).map(|(out, _)| out)
}

pub(crate) fn generate_impl(
    model: &dyn CausalLm,
    prompt: &Tensor,
    attention_mask: Option<&Tensor>,
    config: &GenerationConfig,
    options: &GenerateOptions<'_>,
    rng: Option<&mut Generator>,
) -> Result<(GenerationOutput, ActiveRows)> {
    let _guard = tch::no_grad_guard();
    let op = "generate";
    let vocab = model.facts().vocab_size;
    let config = &config.resolved(model.facts());
    config.validate(vocab)?;
    if config.do_sample && rng.is_none() {
        return Err(Error::invalid(
            "generate_greedy",
            "do_sample = true needs a Generator: call generate (greedy decoding is \
             do_sample = false)",
        ));
    }
    let [b, p] = check_prompt(op, model, prompt, config.max_new_tokens)?;
    check_logit_mask(op, options.logit_mask, vocab)?;
    let capture_block = options.capture_block_input;
    if let Some(block) = capture_block {
        let n = model.n_layer();
        if block > n {
            return Err(Error::config(
                op,
                "capture_block_input",
                format!("a block index of at most n_layer = {n}"),
                block,
            ));
        }
    }
    let (mut decoder, first, prompt_block_input) = DecodeState::start(
        model,
        prompt,
        attention_mask,
        [b, p],
        options.prompt_groups,
        capture_block,
    )?;
    let steps = config.max_new_tokens;
    let mut capture = match capture_block {
        Some(block) => Some(BlockCapture::new(block, prompt_block_input, steps)?),
        None => None,
    };
    // every decode step multiplies `b` rows by every weight: pack them once (`nn::packed`)
    let _packed = PackedScope::for_decode(
        model.decoder(),
        model.lm_head_weight(),
        b,
        steps,
        options.packed_weights,
    )?;
    let mut last_logits = model.lm_head(&first)?;
    let uniforms = match rng {
        Some(rng) if config.do_sample => draw_uniforms(rng, steps, b, decoder.device())?,
        _ => None,
    };
    let mut rows = Rows::new(
        b,
        steps,
        config.pad_id(),
        config.eos_token_id,
        decoder.device(),
    )?;
    let mut active = ActiveRows::new(b, !options.keep_finished_rows);
    let zeros = Tensor::f_zeros([b], (Kind::Float, decoder.device()))?;
    let mut log_probs = Vec::with_capacity(rows.capacity());
    for step in 0..steps {
        active.count_step();
        let logits = last_logits.f_to_kind(Kind::Float)?;
        let scaled = if config.do_sample && config.temperature != 1.0 {
            logits.f_div_scalar(config.temperature)?
        } else {
            logits
        };
        let logp = scaled.f_log_softmax(-1, None::<Kind>)?;
        let scores = process(&scaled, config, options, decoder.last_token(), step, vocab)?;
        let next = match &uniforms {
            None => scores.f_argmax(-1, false)?,
            Some(u) => sample_rows(&scores, &active.select(&u.f_select(0, step)?)?)?,
        };
        let lp = logp
            .f_gather(-1, &next.f_unsqueeze(-1)?, false)?
            .f_squeeze_dim(-1)?;
        let lp = active.scatter(&lp, &zeros)?;
        log_probs.push(lp.f_mul(&rows.unfinished().f_to_kind(Kind::Float)?)?);
        let next = rows.push(active.scatter(&next, rows.pad())?)?;
        if rows.done(step, steps)? {
            break;
        }
        if let Some(keep) = active.compact(rows.unfinished(), rows.live(), steps - step - 1)? {
            decoder.keep_rows(&keep)?;
        }
        let step_options = match &capture {
            Some(c) => ForwardOptions {
                logits: true,
                ..c.options()
            },
            None => ForwardOptions::default(),
        };
        let out = decoder.step(active.select(&next)?, step_options)?;
        if let Some(c) = capture.as_mut() {
            c.push(&active, &out)?;
        }
        last_logits = out.logits()?.f_select(1, 0)?;
    }
    let done = rows.finish(decoder.prompt, decoder.prompt_mask)?;
    let block_input = match capture {
        Some(c) => Some(c.finish(done.steps())?),
        None => None,
    };
    let log_probs = done.trim(&log_probs)?;
    let output = GenerationOutput {
        sequences: done.sequences,
        response: done.response,
        response_mask: done.response_mask,
        log_probs,
        attention_mask: done.attention_mask,
        block_input,
    };
    Ok((output, active))
}

/// Whether `model`'s KV-cached decode computes its full forward's values up to rounding: a
/// float32 / float64 model (half-precision rounding between an incremental decode and a full
/// forward is not negligible) without active dropout (LoRA's `lora_dropout` while the
/// adapters' switch is training).
pub(crate) fn decode_matches_forward(model: &dyn CausalLm) -> bool {
    let full_precision = matches!(model.kind(), Kind::Float | Kind::Double);
    let no_dropout = super::lora::lora_switch(model).is_none_or(|s| !s.is_training());
    full_precision && no_dropout
}

// ------------------------------------------------------------------ shared with ILQL generation

/// Checks a prompt `[B, P]` (`P ≥ 1`) and that `P + max_new_tokens` fits `model`'s context.
pub(crate) fn check_prompt(
    op: &'static str,
    model: &dyn CausalLm,
    prompt: &Tensor,
    max_new_tokens: i64,
) -> Result<[i64; 2]> {
    let [b, p] = super::causal_lm::dims2(op, "prompt", prompt, "[batch, prompt_len]")?;
    if p == 0 {
        return Err(Error::value(
            op,
            "prompt",
            "at least one token per row",
            "0 tokens",
        ));
    }
    let n_pos = model.facts().max_positions;
    // checked: an i64::MAX budget is refused, not overflowed
    if p.checked_add(max_new_tokens).is_none_or(|end| end > n_pos) {
        return Err(Error::config(
            op,
            "max_new_tokens",
            format!("prompt length {p} + max_new_tokens <= n_positions = {n_pos}"),
            max_new_tokens,
        ));
    }
    Ok([b, p])
}

/// Checks that a logit mask is `[vocab, vocab]`.
pub(crate) fn check_logit_mask(
    op: &'static str,
    mask: Option<&LogitMask>,
    vocab: i64,
) -> Result<()> {
    match mask {
        Some(m) if m.table().size() != [vocab, vocab] => Err(Error::ShapeMismatch {
            op,
            key: "logit_mask".into(),
            expected: vec![vocab, vocab],
            actual: m.table().size(),
        }),
        _ => Ok(()),
    }
}

/// `scores` with the tokens that `mask` forbids after `last_token` `[B]` set to `-inf`.
pub(crate) fn apply_logit_mask(
    scores: Tensor,
    mask: Option<&LogitMask>,
    last_token: &Tensor,
) -> Result<Tensor> {
    match mask {
        Some(m) => Ok(scores.f_masked_fill(&m.forbidden(last_token)?, f64::NEG_INFINITY)?),
        None => Ok(scores),
    }
}

/// The uniforms of every sampled step, `[steps, B]` float64, drawn up front (one host-to-device
/// copy); `None` when there is no step.
pub(crate) fn draw_uniforms(
    rng: &mut Generator,
    steps: i64,
    b: i64,
    device: Device,
) -> Result<Option<Tensor>> {
    if steps > 0 {
        Ok(Some(rng.uniform(
            &[steps, b],
            0.0,
            1.0,
            Kind::Double,
            device,
        )?))
    } else {
        Ok(None)
    }
}

/// The scores a step chooses from: masks always, temperature-scaled warpers when sampling.
fn process(
    scaled: &Tensor,
    config: &GenerationConfig,
    options: &GenerateOptions<'_>,
    last_token: &Tensor,
    step: i64,
    vocab: i64,
) -> Result<Tensor> {
    let neg_inf = f64::NEG_INFINITY;
    let mut scores = apply_logit_mask(scaled.shallow_clone(), options.logit_mask, last_token)?;
    if let Some(eos) = config.eos_token_id {
        if step < config.min_new_tokens {
            let idx = Tensor::f_from_slice(&[eos])?.f_to_device(scores.device())?;
            scores = scores.f_index_fill(1, &idx, neg_inf)?;
        }
    }
    if config.do_sample {
        scores = top_k(scores, config.top_k, vocab)?;
        if config.top_p < 1.0 {
            scores = top_p_filter(&scores, config.top_p)?;
        }
    }
    Ok(scores)
}

/// [`top_k_filter`] when `0 < k < vocab`; `scores` unchanged otherwise (0 disables it, and
/// `k ≥ vocab` keeps every token).
pub(crate) fn top_k(scores: Tensor, k: i64, vocab: i64) -> Result<Tensor> {
    if k > 0 && k < vocab {
        top_k_filter(&scores, k)
    } else {
        Ok(scores)
    }
}

/// Scores below the k-th largest of each row become `-inf`.
pub(crate) fn top_k_filter(scores: &Tensor, k: i64) -> Result<Tensor> {
    let (values, _) = scores.f_topk(k, -1, true, true)?;
    let kth = values.f_narrow(-1, k - 1, 1)?;
    Ok(scores.f_masked_fill(&scores.f_lt_tensor(&kth)?, f64::NEG_INFINITY)?)
}

/// `transformers`' top-p: sort ascending, drop the tokens whose cumulative probability is at
/// most `1 - p` (always keeping the most likely one).
fn top_p_filter(scores: &Tensor, p: f64) -> Result<Tensor> {
    let (sorted, order) = scores.f_sort(-1, false)?;
    let cum = sorted
        .f_softmax(-1, None::<Kind>)?
        .f_cumsum(-1, None::<Kind>)?;
    let vocab = scores.size().last().copied().unwrap_or(0);
    let remove = cum.f_le(1.0 - p)?;
    let _ = remove.f_narrow(-1, vocab - 1, 1)?.f_fill_(0)?;
    let remove = remove.f_scatter(-1, &order, &remove)?;
    Ok(scores.f_masked_fill(&remove, f64::NEG_INFINITY)?)
}

/// One draw per row from `softmax(scores)` by inverting the CDF at `u` `[B]` in `[0, 1)`: the
/// first token whose cumulative probability exceeds `u` times the total (so a token of
/// probability 0 is never drawn).
pub(crate) fn sample_rows(scores: &Tensor, u: &Tensor) -> Result<Tensor> {
    let probs = scores.f_softmax(-1, None::<Kind>)?;
    let cdf = probs.f_cumsum(-1, Kind::Double)?;
    let vocab = cdf.size().last().copied().unwrap_or(1);
    let total = cdf.f_narrow(-1, vocab - 1, 1)?;
    let target = u.f_unsqueeze(-1)?.f_mul(&total)?;
    let idx = target.f_searchsorted(&cdf, false, true, "right", None::<Tensor>)?;
    Ok(idx.f_clamp_max(vocab - 1)?.f_squeeze_dim(-1)?)
}
