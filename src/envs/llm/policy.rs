//! [`GenerationPolicy`]: a causal LM (any architecture) as the policy of a
//! [`TokenEnv`](super::env::TokenEnv).
//!
//! It reads `("tokens", "prompt")` `[B, P]` (left-padded) and `("masks",
//! "prompt_attention_mask")` (all ones when absent), runs the batched
//! [`generate_with`] (KV cache, left padding, the config's
//! sampling options, an owned seeded [`Generator`]; with
//! [`with_prompt_groups`](GenerationPolicy::with_prompt_groups), one prompt pass per group of
//! identical rows), pads the response to `max_new_tokens`,
//! and writes (see the [env's layout](super::env)):
//! - `("tokens", "response")` `[B, R]` (right-padded with the pad id) and `("tokens", "full")`
//!   `[B, P + R]`;
//! - `("masks", "all_attention_mask")` and `("masks", "all_assistant_mask")` `[B, P + R]`;
//! - `("log_probs", "response")` `[B, R]` and `("log_probs", "full")` `[B, P + R]`: each
//!   generated token's log-probability under the sampling distribution
//!   ([`GenerationOutput::log_probs`](crate::modules::llm::GenerationOutput)), aligned with
//!   the tokens (`lp[t] = log p(token[t] | tokens < t)`); 0 on the prompt and the padding
//!   (the full log-probs are those of the assistant tokens, no extra forward pass is run).
//!
//! It is a [`Policy`](crate::envs::Policy) through a closure: `&mut |td| policy.call(td)`.
//! The model is any [`ScoreTokens`] that has a model to generate with
//! ([`ScoreTokens::generating_model`]): a model of any architecture, the value-head wrappers,
//! or a reference to one of them.
//!
//! ```
//! use tch::{nn::VarStore, Device};
//! use torchrl::envs::llm::{GenerationPolicy, TokenEnv, TokenEnvConfig, TokenScorer};
//! use torchrl::envs::EnvBase;
//! use torchrl::modules::llm::{Gpt2Config, Gpt2Model};
//! # fn main() -> torchrl::Result<()> {
//! let vs = VarStore::new(Device::Cpu);
//! let model_cfg = Gpt2Config::new(12).with_n_layer(1).with_n_embd(8).with_n_head(2).with_n_positions(16);
//! let model = Gpt2Model::new(&vs.root(), &model_cfg)?;
//! let cfg = TokenEnvConfig::for_model(&model_cfg.facts()).with_batch_size(2).with_max_new_tokens(4)
//!     .with_eos_token_id(11).with_pad_token_id(10);
//! let mut policy = GenerationPolicy::new(&model, cfg.generation_config(), 0)?;
//! let scorer = TokenScorer::new(|_p: &[i64], r: &[i64]| r.len() as f64);
//! let mut env = TokenEnv::new(cfg, vec![vec![1, 2, 3], vec![4]], Box::new(scorer))?;
//! let td = policy.call(env.reset(None)?)?;
//! assert_eq!(td.get_or_err(("tokens", "full"))?.size(), vec![2, 7]);
//! let td = env.step(td)?;
//! assert_eq!(td.get_or_err(("next", "reward"))?.size(), vec![2, 7, 1]);
//! # Ok(()) }
//! ```

use std::fmt;

use tch::{Kind, Tensor};

use super::env::{
    ASSISTANT_MASK_KEY, ATTENTION_MASK_KEY, FULL_KEY, FULL_LOG_PROBS_KEY, PROMPT_KEY,
    PROMPT_MASK_KEY, RESPONSE_KEY, RESPONSE_LOG_PROBS_KEY,
};
use crate::error::{Error, Result, ShapeFmt};
use crate::modules::llm::nn::packed::PackedWeightCache;
use crate::modules::llm::{
    generate_with, CachedTrunk, CausalLm, GenerateOptions, GenerationConfig, LogitMask, ScoreTokens,
};
use crate::rng::Generator;
use crate::tensordict::TensorDict;

/// The model behind a scorer, or the error saying it has none (a closure scorer).
fn model_of<M: ScoreTokens + ?Sized>(model: &M) -> Result<&dyn CausalLm> {
    model.generating_model().ok_or_else(|| {
        Error::invalid(
            "GenerationPolicy",
            "the scorer has no model to generate with (ScoreTokens::generating_model is None)",
        )
    })
}

/// Generation as a policy. See the [module docs](self).
pub struct GenerationPolicy<M> {
    model: M,
    config: GenerationConfig,
    rng: Generator,
    logit_mask: Option<LogitMask>,
    full_log_probs: bool,
    prompt_groups: usize,
    trunk_block: Option<usize>,
    packed_weights: Option<PackedWeightCache>,
}

impl<M> fmt::Debug for GenerationPolicy<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GenerationPolicy")
            .field("config", &self.config)
            .field("logit_mask", &self.logit_mask.is_some())
            .field("prompt_groups", &self.prompt_groups)
            .field("trunk_block", &self.trunk_block)
            .finish_non_exhaustive()
    }
}

impl<M: ScoreTokens> GenerationPolicy<M> {
    /// Generates with `model` and `config`, sampling from a generator seeded with `seed`.
    /// Errors when the config does not fit the model's vocabulary.
    pub fn new(model: M, config: GenerationConfig, seed: u64) -> Result<Self> {
        config.validate(model_of(&model)?.facts().vocab_size)?;
        Ok(GenerationPolicy {
            model,
            config,
            rng: Generator::new(seed),
            logit_mask: None,
            full_log_probs: true,
            prompt_groups: 0,
            trunk_block: None,
            packed_weights: None,
        })
    }

    /// Whether the prompts come in consecutive groups of `g` identical rows (a
    /// [`TokenEnv`](super::env::TokenEnv) with [`num_generations`](super::TokenEnvConfig::num_generations)
    /// `= g` serves them so): each group's prompt pass then runs once
    /// ([`GenerateOptions::prompt_groups`]), with the same tokens and log-probs as without
    /// it. `0` or `1` (the default): no grouping. [`call`](Self::call) errors on a batch whose
    /// groups are not identical.
    ///
    /// ```
    /// use tch::{nn::VarStore, Device};
    /// use torchrl::envs::llm::{GenerationPolicy, TokenEnv, TokenEnvConfig, TokenScorer};
    /// use torchrl::envs::EnvBase;
    /// use torchrl::modules::llm::{Gpt2Config, Gpt2Model};
    /// # fn main() -> torchrl::Result<()> {
    /// let vs = VarStore::new(Device::Cpu);
    /// let model_cfg = Gpt2Config::new(12).with_n_layer(1).with_n_embd(8).with_n_head(2).with_n_positions(16);
    /// let model = Gpt2Model::new(&vs.root(), &model_cfg)?;
    /// // 2 prompts, each in 2 consecutive rows
    /// let cfg = TokenEnvConfig::for_model(&model_cfg.facts()).with_batch_size(4)
    ///     .with_num_generations(2).with_max_new_tokens(3).with_eos_token_id(11).with_pad_token_id(10);
    /// let gen_cfg = cfg.generation_config().with_do_sample(true);
    /// let scorer = TokenScorer::new(|_p: &[i64], r: &[i64]| r.len() as f64);
    /// let mut env = TokenEnv::new(cfg, vec![vec![1, 2, 3], vec![4]], Box::new(scorer))?;
    /// let td = env.reset(None)?;
    /// let mut shared = GenerationPolicy::new(&model, gen_cfg.clone(), 0)?.with_prompt_groups(2);
    /// let mut plain = GenerationPolicy::new(&model, gen_cfg, 0)?;
    /// let (a, b) = (shared.call(td.clone())?, plain.call(td)?);
    /// assert!(a.get_or_err(("tokens", "full"))?.equal(b.get_or_err(("tokens", "full"))?));
    /// # Ok(()) }
    /// ```
    pub fn with_prompt_groups(mut self, g: usize) -> Self {
        self.prompt_groups = g;
        self
    }

    /// Whether [`call`](Self::call) writes `("log_probs", "full")` (default `true`). A caller
    /// that scores the rollout itself in one pass of its model (the RLHF trainers' policy
    /// step) turns it off, so that the key is written once.
    pub fn with_full_log_probs(mut self, on: bool) -> Self {
        self.full_log_probs = on;
        self
    }

    /// Whether [`call`](Self::call) also writes the hidden state entering `block` at every
    /// position of `("tokens", "full")` under [`CachedTrunk::KEY`] (`[B, P + R, hidden]`,
    /// zeros on the right padding; [`GenerateOptions::capture_block_input`]), as the decode
    /// computed it. A hydra model's rollout passes its
    /// [`frozen_trunk_end`](crate::modules::llm::CausalLmWithHydraValueHead::frozen_trunk_end)
    /// so that the frozen trunk does not run again over the sequences. `None` (the default):
    /// nothing written.
    ///
    /// ```
    /// use tch::{nn::VarStore, Device};
    /// use torchrl::envs::llm::{GenerationPolicy, TokenEnv, TokenEnvConfig, TokenScorer};
    /// use torchrl::envs::EnvBase;
    /// use torchrl::modules::llm::{CachedTrunk, Gpt2Config, Gpt2Model};
    /// # fn main() -> torchrl::Result<()> {
    /// let vs = VarStore::new(Device::Cpu);
    /// let model_cfg = Gpt2Config::new(12).with_n_layer(2).with_n_embd(8).with_n_head(2).with_n_positions(16);
    /// let model = Gpt2Model::new(&vs.root(), &model_cfg)?;
    /// let cfg = TokenEnvConfig::for_model(&model_cfg.facts()).with_batch_size(2).with_max_new_tokens(4)
    ///     .with_eos_token_id(11).with_pad_token_id(10);
    /// let scorer = TokenScorer::new(|_p: &[i64], r: &[i64]| r.len() as f64);
    /// let mut env = TokenEnv::new(cfg.clone(), vec![vec![1, 2, 3], vec![4]], Box::new(scorer))?;
    /// let mut policy = GenerationPolicy::new(&model, cfg.generation_config(), 0)?.with_trunk_capture(Some(1));
    /// let td = policy.call(env.reset(None)?)?;
    /// assert_eq!(td.get_or_err(CachedTrunk::KEY)?.size(), vec![2, 7, 8]);
    /// # Ok(()) }
    /// ```
    pub fn with_trunk_capture(mut self, block: Option<usize>) -> Self {
        self.trunk_block = block;
        self
    }

    /// Keeps the packed copies of the model's frozen weights in `cache` across calls
    /// ([`GenerateOptions::packed_weights`]); without it each call packs what its decode
    /// uses.
    pub fn with_packed_weights(mut self, cache: PackedWeightCache) -> Self {
        self.packed_weights = Some(cache);
        self
    }

    /// Adds trlX's logit mask.
    pub fn with_logit_mask(mut self, mask: LogitMask) -> Self {
        self.logit_mask = Some(mask);
        self
    }

    /// Reseeds the sampling generator.
    pub fn set_seed(&mut self, seed: u64) {
        self.rng = Generator::new(seed);
    }

    /// The model.
    pub fn model(&self) -> &M {
        &self.model
    }

    /// The generation config.
    pub fn config(&self) -> &GenerationConfig {
        &self.config
    }

    /// Generates responses for the prompts of `td` and writes them (and the full tokens,
    /// masks and log-probs) into it. Errors when the prompt is missing, not int64 `[B, P]`,
    /// or its mask has another shape.
    pub fn call(&mut self, mut td: TensorDict) -> Result<TensorDict> {
        let op = "GenerationPolicy::call";
        let prompt = td.get_or_err(PROMPT_KEY)?.shallow_clone();
        if prompt.dim() != 2 || prompt.kind() != Kind::Int64 {
            return Err(Error::value(
                op,
                "(\"tokens\", \"prompt\")",
                "int64 token ids of shape [batch, prompt_len]",
                format!("{:?} of shape {}", prompt.kind(), ShapeFmt(&prompt.size())),
            ));
        }
        let device = prompt.device();
        let mask = match td.get(PROMPT_MASK_KEY) {
            Some(m) if m.size() != prompt.size() => {
                return Err(Error::ShapeMismatch {
                    op,
                    key: "(\"masks\", \"prompt_attention_mask\")".into(),
                    expected: prompt.size(),
                    actual: m.size(),
                })
            }
            Some(m) => m.f_to_kind(Kind::Int64)?,
            None => prompt.f_ones_like()?,
        };
        let options = GenerateOptions {
            logit_mask: self.logit_mask.as_ref(),
            prompt_groups: self.prompt_groups,
            keep_finished_rows: false,
            capture_block_input: self.trunk_block,
            packed_weights: self.packed_weights.as_ref(),
        };
        let out = generate_with(
            model_of(&self.model)?,
            &prompt,
            Some(&mask),
            &self.config,
            &options,
            &mut self.rng,
        )?;
        let (b, g) = out.response.size2()?;
        let extra = (self.config.max_new_tokens - g).max(0);
        let pad_right = |t: &Tensor, value: f64| -> Result<Tensor> {
            let t = t.f_to_device(device)?;
            if extra == 0 {
                return Ok(t);
            }
            let fill = Tensor::f_full([b, extra], value, (t.kind(), device))?;
            Ok(Tensor::f_cat(&[&t, &fill], 1)?)
        };
        let response = pad_right(&out.response, self.config.pad_id() as f64)?;
        let resp_mask = pad_right(&out.response_mask.f_to_kind(Kind::Int64)?, 0.0)?;
        let resp_lp = pad_right(&out.log_probs, 0.0)?;
        let prompt_zeros = mask.f_zeros_like()?;
        let full = Tensor::f_cat(&[&prompt, &response], 1)?;
        let attention = Tensor::f_cat(&[&mask, &resp_mask], 1)?;
        let assistant = Tensor::f_cat(&[&prompt_zeros, &resp_mask], 1)?;
        td.set(RESPONSE_KEY, response)?;
        td.set(FULL_KEY, full)?;
        td.set(ATTENTION_MASK_KEY, attention)?;
        td.set(ASSISTANT_MASK_KEY, assistant)?;
        if self.full_log_probs {
            let zeros = prompt_zeros.f_to_kind(resp_lp.kind())?;
            td.set(FULL_LOG_PROBS_KEY, Tensor::f_cat(&[&zeros, &resp_lp], 1)?)?;
        }
        td.set(RESPONSE_LOG_PROBS_KEY, resp_lp)?;
        if let Some(hidden) = &out.block_input {
            td.set(
                CachedTrunk::KEY,
                pad_right_rows(hidden, extra)?.f_to_device(device)?,
            )?;
        }
        Ok(td)
    }
}

/// `hidden` `[B, T, H]` followed by `extra` positions of zeros.
fn pad_right_rows(hidden: &Tensor, extra: i64) -> Result<Tensor> {
    if extra == 0 {
        return Ok(hidden.shallow_clone());
    }
    let (b, _, h) = hidden.size3()?;
    let zeros = Tensor::f_zeros([b, extra, h], (hidden.kind(), hidden.device()))?;
    Ok(Tensor::f_cat(&[hidden, &zeros], 1)?)
}
