//! β-shaped generation for [`CausalLmWithIlqlHeads`] (trlX's ILQL `generate`): the LM's
//! log-probabilities shifted by β times the advantage the target Q-heads and the V head give
//! each next token, with the KV cache.
//!
//! **How a step decides** (trlX's loop): the last position's LM logits, target Q-logits and
//! value; the logit mask (trlX's `[vocab, vocab]` bool table, `true` = forbidden, indexed by
//! each row's last token) on the logits; then [`ilql_scores`]:
//! `scores = log_softmax(logits) + β·(min_i targetQ_i − V)` (the min over the two target
//! heads when there are two), and top-k (scores below the k-th largest become `-inf`; skipped
//! when `k = 0` or `k ≥ vocab`); then the argmax when the temperature is 0, else a draw from
//! `softmax(scores / T)`. A row that produced EOS is finished: it receives the pad id from
//! then on (as [`generate`](super::generate) does, where trlX writes EOS), and generation
//! stops as soon as every row is finished (or after `max_new_tokens`).
//!
//! **Sampling** draws the uniforms of every step up front from a seeded [`Generator`] and
//! inverts the categorical CDF, exactly as [`generate`](super::generate) does: with β = 0 and
//! top-k 0 the scores are `log_softmax(logits)`, whose `softmax(· / T)` is the plain
//! `softmax(logits / T)`, so both functions draw the same tokens from the same seed.
//!
//! # Shapes
//! prompt `[B, P]` (left-padded, with its mask); `sequences` `[B, P + G]`; `response`,
//! `response_mask`, `advantages` `[B, G]`, `G ≤ max_new_tokens`; `attention_mask`
//! `[B, P + G]`.
//!
//! ```
//! use tch::{nn::VarStore, Device, Tensor};
//! use torchrl::modules::llm::{
//!     ilql_generate, CausalLmWithIlqlHeads, Gpt2Config, Gpt2Model, IlqlGenerationConfig,
//! };
//! use torchrl::Generator;
//! # fn main() -> torchrl::Result<()> {
//! tch::manual_seed(0);
//! let vs = VarStore::new(Device::Cpu);
//! let cfg = Gpt2Config::new(30).with_n_layer(1).with_n_embd(16).with_n_head(2).with_n_positions(32);
//! let model = CausalLmWithIlqlHeads::from_model(&vs.root(), Gpt2Model::new(&vs.root(), &cfg)?, true, 0.001)?;
//! let prompt = Tensor::from_slice(&[0i64, 5, 6, 7, 8, 9]).view([2, 3]);
//! let mask = Tensor::from_slice(&[0i64, 1, 1, 1, 1, 1]).view([2, 3]); // row 0 left-padded
//! let gen_cfg = IlqlGenerationConfig::new(6).with_beta(2.0).with_log_advantages(true);
//! let out = ilql_generate(&model, &prompt, Some(&mask), &gen_cfg, &mut Generator::new(7))?;
//! assert_eq!(out.sequences.size(), vec![2, 9]);
//! assert_eq!(out.advantages.as_ref().map(|a| a.size()), Some(vec![2, 6]));
//! // seeded: the same seed gives the same tokens
//! let again = ilql_generate(&model, &prompt, Some(&mask), &gen_cfg, &mut Generator::new(7))?;
//! assert!(out.sequences.equal(&again.sequences));
//! // a negative temperature is an error, before any compute
//! let bad = gen_cfg.clone().with_temperature(-1.0);
//! assert!(ilql_generate(&model, &prompt, None, &bad, &mut Generator::new(7)).is_err());
//! # Ok(()) }
//! ```

use serde::{Deserialize, Serialize};
use tch::{Kind, Tensor};

use super::causal_lm::ForwardOptions;
use super::compaction::ActiveRows;
use super::decode::{DecodeState, Rows};
use super::generation::{
    apply_logit_mask, check_logit_mask, check_prompt, draw_uniforms, sample_rows,
    top_k as top_k_mask, GenerateOptions,
};
use super::heads::CausalLmWithIlqlHeads;
use super::nn::packed::PackedScope;
use crate::error::require;
use crate::error::{Error, Result, ShapeFmt};
use crate::macros::setters;
use crate::rng::Generator;

/// How to generate with ILQL heads: trlX HEAD's `gen_kwargs` defaults (`max_new_tokens` 56,
/// β 1, top-k 20, temperature 1), no EOS.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IlqlGenerationConfig {
    /// The most tokens generated per row.
    pub max_new_tokens: i64,
    /// The weight of the advantage `min_i targetQ_i − V` added to the LM's log-probabilities
    /// (finite; 0: the LM alone).
    #[serde(default = "one")]
    pub beta: f64,
    /// Keep the `top_k` highest-scoring tokens (0, or at least the vocabulary: all).
    #[serde(default = "twenty")]
    pub top_k: i64,
    /// Divides the scores before sampling (finite, ≥ 0); 0 takes the argmax.
    #[serde(default = "one")]
    pub temperature: f64,
    /// The end-of-sequence id: a row that produces it is finished.
    #[serde(default)]
    pub eos_token_id: Option<i64>,
    /// The id written after a row finished (defaults to the EOS id).
    #[serde(default)]
    pub pad_token_id: Option<i64>,
    /// Also return each generated token's advantage (for logging).
    #[serde(default)]
    pub log_advantages: bool,
}

fn one() -> f64 {
    1.0
}
fn twenty() -> i64 {
    20
}

impl Default for IlqlGenerationConfig {
    fn default() -> Self {
        IlqlGenerationConfig::new(56)
    }
}

impl IlqlGenerationConfig {
    /// Up to `max_new_tokens` tokens with trlX's other defaults (β 1, top-k 20, temperature 1).
    ///
    /// ```
    /// use torchrl::modules::llm::IlqlGenerationConfig;
    /// let cfg = IlqlGenerationConfig::new(12).with_beta(4.0).with_temperature(0.0);
    /// assert_eq!((cfg.max_new_tokens, cfg.beta, cfg.top_k, cfg.temperature), (12, 4.0, 20, 0.0));
    /// assert!(cfg.validate(259).is_ok());
    /// assert!(cfg.with_beta(f64::NAN).validate(259).is_err());
    /// ```
    pub fn new(max_new_tokens: i64) -> Self {
        IlqlGenerationConfig {
            max_new_tokens,
            beta: 1.0,
            top_k: 20,
            temperature: 1.0,
            eos_token_id: None,
            pad_token_id: None,
            log_advantages: false,
        }
    }

    setters! {
        /// Sets β.
        with_beta(beta: f64);
        /// Sets top-k (0 disables it).
        with_top_k(top_k: i64);
        /// Sets the temperature (0: greedy).
        with_temperature(temperature: f64);
        /// Sets the EOS id.
        with_eos_token_id(id: i64) => eos_token_id = Some(id);
        /// Sets the pad id.
        with_pad_token_id(id: i64) => pad_token_id = Some(id);
        /// Sets `log_advantages`.
        with_log_advantages(log_advantages: bool);
    }

    /// The pad id used: `pad_token_id`, else `eos_token_id`, else 0.
    ///
    /// ```
    /// use torchrl::modules::llm::IlqlGenerationConfig;
    /// assert_eq!(IlqlGenerationConfig::new(4).with_eos_token_id(3).pad_id(), 3);
    /// ```
    pub fn pad_id(&self) -> i64 {
        self.pad_token_id.or(self.eos_token_id).unwrap_or(0)
    }

    /// Checks the fields on their own and against a vocabulary of `vocab` tokens.
    ///
    /// ```
    /// use torchrl::modules::llm::IlqlGenerationConfig;
    /// let err = IlqlGenerationConfig::new(4).with_temperature(-0.5).validate(10).unwrap_err();
    /// assert!(err.to_string().contains("temperature"));
    /// assert!(IlqlGenerationConfig::new(4).with_eos_token_id(10).validate(10).is_err());
    /// ```
    pub fn validate(&self, vocab: i64) -> Result<()> {
        let op = "IlqlGenerationConfig";
        let max_new = self.max_new_tokens;
        require(max_new >= 0, op, "max_new_tokens", ">= 0", max_new)?;
        require(
            self.beta.is_finite(),
            op,
            "beta",
            "a finite number",
            self.beta,
        )?;
        let t = self.temperature;
        let ok = t.is_finite() && t >= 0.0;
        require(ok, op, "temperature", "a finite number >= 0 (0: greedy)", t)?;
        let k = self.top_k;
        require(k >= 0, op, "top_k", ">= 0 (0 disables it)", k)?;
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

/// What [`ilql_generate`] returns: [`GenerationOutput`](super::GenerationOutput)'s tensors
/// (without log-probs) and, optionally, the advantages. See the [module docs](self) for
/// shapes.
#[derive(Debug)]
pub struct IlqlGenerationOutput {
    /// Prompt and response, `[B, P + G]`.
    pub sequences: Tensor,
    /// The generated part, `[B, G]` (pad id after a row finished).
    pub response: Tensor,
    /// `true` for generated tokens up to and including EOS, `[B, G]`.
    pub response_mask: Tensor,
    /// The prompt's mask followed by the response mask, int64 `[B, P + G]`.
    pub attention_mask: Tensor,
    /// With [`IlqlGenerationConfig::log_advantages`]: each generated token's advantage
    /// `min_i targetQ_i − V` at the step that chose it, float32 `[B, G]`, 0 where the response
    /// mask is `false`.
    pub advantages: Option<Tensor>,
}

/// One step's ILQL scores (see [`ilql_scores`]), float32 `[B, vocab]` each.
#[derive(Debug)]
pub struct IlqlScores {
    /// `min_i targetQ_i − V`.
    pub advantages: Tensor,
    /// `log_softmax(logits) + β·advantages`, before top-k.
    pub scores: Tensor,
    /// `scores` after top-k (`-inf` below the k-th largest).
    pub filtered: Tensor,
}

impl IlqlScores {
    /// The next-token distribution at `temperature`: `softmax(filtered / T)`, or the one-hot
    /// argmax of `filtered` when `T = 0`.
    ///
    /// ```
    /// use tch::Tensor;
    /// use torchrl::modules::llm::ilql_scores;
    /// # fn main() -> torchrl::Result<()> {
    /// let logits = Tensor::from_slice(&[0.0f32, 0.0]).view([1, 2]);
    /// let q = Tensor::from_slice(&[1.0f32, 0.0]).view([1, 2]);
    /// let s = ilql_scores(&logits, &[q], &Tensor::from_slice(&[0.0f32]), 1.0, 0)?;
    /// assert_eq!(Vec::<f32>::try_from(s.probs(0.0)?.view([-1]))?, vec![1.0, 0.0]);
    /// let p = Vec::<f32>::try_from(s.probs(1.0)?.view([-1]))?;
    /// assert!((p[0] - 1.0 / (1.0 + (-1.0f32).exp())).abs() < 1e-6);
    /// # Ok(()) }
    /// ```
    pub fn probs(&self, temperature: f64) -> Result<Tensor> {
        if !(temperature.is_finite() && temperature >= 0.0) {
            return Err(Error::config(
                "IlqlScores::probs",
                "temperature",
                "a finite number >= 0 (0: greedy)",
                temperature,
            ));
        }
        if temperature == 0.0 {
            let best = self.filtered.f_argmax(-1, true)?;
            let zeros = self.filtered.f_zeros_like()?;
            return Ok(zeros.f_scatter_value(-1, &best, 1.0)?);
        }
        Ok(scaled(&self.filtered, temperature)?.f_softmax(-1, None::<Kind>)?)
    }
}

fn scaled(scores: &Tensor, temperature: f64) -> Result<Tensor> {
    if temperature == 1.0 {
        Ok(scores.shallow_clone())
    } else {
        Ok(scores.f_div_scalar(temperature)?)
    }
}

/// One step's scores from the last position's LM `logits` `[B, vocab]`, the target Q-heads'
/// logits `target_qs` (one or two, each `[B, vocab]`) and the value `v` (`[B]` or `[B, 1]`):
/// `advantages = min_i target_qs_i − v`, `scores = log_softmax(logits) + β·advantages`, and
/// top-k (`top_k = 0` or `≥ vocab`: none). Apply a logit mask to `logits` before. Computed in
/// float32.
///
/// ```
/// use tch::Tensor;
/// use torchrl::modules::llm::ilql_scores;
/// # fn main() -> torchrl::Result<()> {
/// let logits = Tensor::from_slice(&[2.0f32, 1.0, 0.0, -1.0]).view([1, 4]);
/// let q1 = Tensor::from_slice(&[0.5f32, 0.1, 0.9, 0.0]).view([1, 4]);
/// let q2 = Tensor::from_slice(&[0.4f32, 0.3, 1.0, 2.0]).view([1, 4]);
/// let s = ilql_scores(&logits, &[q1, q2], &Tensor::from_slice(&[0.3f32]), 1.0, 2)?;
/// let adv = Vec::<f32>::try_from(s.advantages.view([-1]))?;
/// assert!((adv[2] - 0.6).abs() < 1e-6);
/// let pi = Vec::<f32>::try_from(s.probs(1.0)?.view([-1]))?;
/// assert!((pi[0] - 0.785_835).abs() < 1e-5 && pi[2] == 0.0 && pi[3] == 0.0);
/// // a value per row is required
/// assert!(ilql_scores(&logits, &[], &Tensor::from_slice(&[0.3f32]), 1.0, 2).is_err());
/// # Ok(()) }
/// ```
pub fn ilql_scores(
    logits: &Tensor,
    target_qs: &[Tensor],
    v: &Tensor,
    beta: f64,
    top_k: i64,
) -> Result<IlqlScores> {
    let op = "ilql_scores";
    let [b, vocab] = super::causal_lm::dims2(op, "logits", logits, "[batch, vocab]")?;
    if target_qs.is_empty() || target_qs.len() > 2 {
        return Err(Error::value(
            op,
            "target_qs",
            "one or two target Q-logit tensors",
            format!("{} tensors", target_qs.len()),
        ));
    }
    for q in target_qs {
        if q.size() != [b, vocab] {
            return Err(Error::ShapeMismatch {
                op,
                key: "target_qs".into(),
                expected: vec![b, vocab],
                actual: q.size(),
            });
        }
    }
    let v_size = v.size();
    if v_size != [b] && v_size != [b, 1] {
        return Err(Error::value(
            op,
            "v",
            format!("shape [{b}] or [{b}, 1] (one value per row)"),
            format!("shape {}", ShapeFmt(&v_size)),
        ));
    }
    if !beta.is_finite() {
        return Err(Error::config(op, "beta", "a finite number", beta));
    }
    if top_k < 0 {
        return Err(Error::config(op, "top_k", ">= 0 (0 disables it)", top_k));
    }
    let mut qs = target_qs.iter().map(|q| q.f_to_kind(Kind::Float));
    let mut q_min = match qs.next() {
        Some(q) => q?,
        None => return Err(Error::invalid(op, "no target Q-logits")),
    };
    for q in qs {
        q_min = q_min.f_minimum(&q?)?;
    }
    let v = v.f_to_kind(Kind::Float)?.f_view([b, 1])?;
    let advantages = q_min.f_sub(&v)?;
    let logp = logits
        .f_to_kind(Kind::Float)?
        .f_log_softmax(-1, None::<Kind>)?;
    let scores = logp.f_add(&advantages.f_mul_scalar(beta)?)?;
    let filtered = top_k_mask(scores.shallow_clone(), top_k, vocab)?;
    Ok(IlqlScores {
        advantages,
        scores,
        filtered,
    })
}

/// Generates continuations of `prompt` `[B, P]` (int64, left-padded, `attention_mask` 1 on
/// real tokens; `None`: no padding) with β-shaped scores. See the [module docs](self).
///
/// ```
/// use tch::{nn::VarStore, Device, Tensor};
/// use torchrl::modules::llm::{
///     generate, ilql_generate, CausalLmWithIlqlHeads, GenerationConfig, Gpt2Config, Gpt2Model,
///     IlqlGenerationConfig,
/// };
/// use torchrl::Generator;
/// # fn main() -> torchrl::Result<()> {
/// let vs = VarStore::new(Device::Cpu);
/// let cfg = Gpt2Config::new(12).with_n_layer(1).with_n_embd(8).with_n_head(2).with_n_positions(16);
/// let model = CausalLmWithIlqlHeads::from_model(&vs.root(), Gpt2Model::new(&vs.root(), &cfg)?, true, 0.01)?;
/// let prompt = Tensor::from_slice(&[1i64, 2, 3, 4]).view([2, 2]);
/// // β = 0 and temperature 0: the trunk's own greedy decoding
/// let greedy = IlqlGenerationConfig::new(5).with_beta(0.0).with_temperature(0.0);
/// let out = ilql_generate(&model, &prompt, None, &greedy, &mut Generator::new(0))?;
/// let plain = generate(model.model(), &prompt, None, &GenerationConfig::new(5), &mut Generator::new(0))?;
/// assert!(out.sequences.equal(&plain.sequences));
/// # Ok(()) }
/// ```
pub fn ilql_generate(
    model: &CausalLmWithIlqlHeads,
    prompt: &Tensor,
    attention_mask: Option<&Tensor>,
    config: &IlqlGenerationConfig,
    rng: &mut Generator,
) -> Result<IlqlGenerationOutput> {
    ilql_generate_with(
        model,
        prompt,
        attention_mask,
        config,
        &GenerateOptions::default(),
        rng,
    )
}

/// [`ilql_generate`] with a logit mask.
///
/// ```
/// use tch::{nn::VarStore, Device, Kind, Tensor};
/// use torchrl::modules::llm::{
///     ilql_generate_with, CausalLmWithIlqlHeads, GenerateOptions, Gpt2Config, Gpt2Model,
///     IlqlGenerationConfig, LogitMask,
/// };
/// use torchrl::Generator;
/// # fn main() -> torchrl::Result<()> {
/// let vs = VarStore::new(Device::Cpu);
/// let cfg = Gpt2Config::new(10).with_n_layer(1).with_n_embd(8).with_n_head(2).with_n_positions(16);
/// let model = CausalLmWithIlqlHeads::from_model(&vs.root(), Gpt2Model::new(&vs.root(), &cfg)?, false, 0.01)?;
/// // after token i only token (i + 1) mod 10 is allowed
/// let allowed = (Tensor::arange(10, (Kind::Int64, Device::Cpu)) + 1).remainder(10);
/// let table = Tensor::ones([10, 10], (Kind::Bool, Device::Cpu))
///     .scatter_value(1, &allowed.view([10, 1]), 0);
/// let mask = LogitMask::new(table)?;
/// let opts = GenerateOptions::default().with_logit_mask(&mask);
/// let prompt = Tensor::from_slice(&[7i64]).view([1, 1]);
/// let out = ilql_generate_with(&model, &prompt, None, &IlqlGenerationConfig::new(4), &opts, &mut Generator::new(0))?;
/// assert_eq!(Vec::<i64>::try_from(out.response.view([-1]))?, vec![8, 9, 0, 1]);
/// # Ok(()) }
/// ```
pub fn ilql_generate_with(
    model: &CausalLmWithIlqlHeads,
    prompt: &Tensor,
    attention_mask: Option<&Tensor>,
    config: &IlqlGenerationConfig,
    options: &GenerateOptions<'_>,
    rng: &mut Generator,
) -> Result<IlqlGenerationOutput> {
    ilql_generate_impl(model, prompt, attention_mask, config, options, rng).map(|(out, _)| out)
}

/// [`ilql_generate_with`], with the record of which rows were decoded.
pub(crate) fn ilql_generate_impl(
    model: &CausalLmWithIlqlHeads,
    prompt: &Tensor,
    attention_mask: Option<&Tensor>,
    config: &IlqlGenerationConfig,
    options: &GenerateOptions<'_>,
    rng: &mut Generator,
) -> Result<(IlqlGenerationOutput, ActiveRows)> {
    let _guard = tch::no_grad_guard();
    let op = "ilql_generate";
    let trunk = model.model();
    let vocab = trunk.facts().vocab_size;
    config.validate(vocab)?;
    let [b, p] = check_prompt(op, trunk, prompt, config.max_new_tokens)?;
    check_logit_mask(op, options.logit_mask, vocab)?;
    if let Some(block) = options.capture_block_input {
        return Err(Error::config(
            op,
            "capture_block_input",
            "None: ilql_generate keeps no block input (generate does)",
            block,
        ));
    }
    let (mut decoder, mut hidden, _) = DecodeState::start(
        trunk,
        prompt,
        attention_mask,
        [b, p],
        options.prompt_groups,
        None,
    )?;
    let steps = config.max_new_tokens;
    // every decode step multiplies `b` rows by every weight: pack them once (`nn::packed`)
    let _packed = PackedScope::for_decode(
        trunk.decoder(),
        trunk.lm_head_weight(),
        b,
        steps,
        options.packed_weights,
    )?;
    let greedy = config.temperature == 0.0;
    let uniforms = if greedy {
        None
    } else {
        draw_uniforms(rng, steps, b, decoder.device())?
    };
    let mut rows = Rows::new(
        b,
        steps,
        config.pad_id(),
        config.eos_token_id,
        decoder.device(),
    )?;
    let mut advantages = Vec::with_capacity(if config.log_advantages {
        rows.capacity()
    } else {
        0
    });
    let heads = model.heads();
    let hidden_only = ForwardOptions {
        logits: false,
        capture_block_input: None,
    };
    let mut active = ActiveRows::new(b, !options.keep_finished_rows);
    let zeros = Tensor::f_zeros([b], (Kind::Float, decoder.device()))?;
    for step in 0..steps {
        active.count_step();
        let logits = trunk.lm_head(&hidden)?;
        let logits = apply_logit_mask(logits, options.logit_mask, decoder.last_token())?;
        let target_qs = heads
            .target_q_heads()
            .iter()
            .map(|q| q.forward(&hidden))
            .collect::<Result<Vec<_>>>()?;
        let v = heads.v_head().forward(&hidden)?;
        let s = ilql_scores(&logits, &target_qs, &v, config.beta, config.top_k)?;
        let next = match &uniforms {
            None => s.filtered.f_argmax(-1, false)?,
            Some(u) => sample_rows(
                &scaled(&s.filtered, config.temperature)?,
                &active.select(&u.f_select(0, step)?)?,
            )?,
        };
        if config.log_advantages {
            let adv = s
                .advantages
                .f_gather(-1, &next.f_unsqueeze(-1)?, false)?
                .f_squeeze_dim(-1)?;
            let adv = active.scatter(&adv.f_to_kind(Kind::Float)?, &zeros)?;
            advantages.push(adv.f_mul(&rows.unfinished().f_to_kind(Kind::Float)?)?);
        }
        let next = rows.push(active.scatter(&next, rows.pad())?)?;
        if rows.done(step, steps)? {
            break;
        }
        if let Some(keep) = active.compact(rows.unfinished(), rows.live(), steps - step - 1)? {
            decoder.keep_rows(&keep)?;
        }
        hidden = decoder
            .step(active.select(&next)?, hidden_only)?
            .last_hidden
            .f_select(1, 0)?;
    }
    let done = rows.finish(decoder.prompt, decoder.prompt_mask)?;
    let advantages = if config.log_advantages {
        Some(done.trim(&advantages)?)
    } else {
        None
    };
    let output = IlqlGenerationOutput {
        sequences: done.sequences,
        response: done.response,
        response_mask: done.response_mask,
        attention_mask: done.attention_mask,
        advantages,
    };
    Ok((output, active))
}
