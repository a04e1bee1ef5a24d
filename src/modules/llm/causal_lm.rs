//! [`CausalLm`]: the one interface every causal language model here implements (GPT-2 today;
//! each architecture is one file in [`super::models`] on the [layer kit](super::nn)), and
//! what everything above the model (generation, heads, the token env, the KL transforms,
//! losses and trainers) takes.
//!
//! A model file provides four things: its embedding of token ids at positions, its
//! [`Decoder`] (blocks, final norm, rotary table), its LM head weight, and its parameters by
//! `transformers`' names (plus a copy of itself and its `config.json`). The forward, its input
//! checks, the KV cache, the forward from a block, the LM head and checkpoint files are
//! written once, here.
//!
//! - **Left padding**: `attention_mask` (1 = a real token) masks padded keys out; position ids
//!   default to `cumsum(mask) - 1` with pads set to 1, as `transformers`' `generate` sets them.
//!   Rows of padded queries attend uniformly (as `transformers`' eager attention): their
//!   outputs are meaningless but finite.
//! - **KV cache outside the model**: [`CausalLm::forward`] is `&self` and takes an optional
//!   `&mut` [`KvCache`], so one (frozen) model serves any number of generations; incremental
//!   decoding gives the logits of a full forward.
//! - **Any device and dtype**: the parameters'; masks use the dtype's lowest finite value.
//!
//! # Shapes
//! `input_ids` `[B, T]` (int64); `attention_mask` `[B, P + T]` where `P` is the cached
//! length (0 without a cache); `position_ids` `[B, T]`; logits `[B, T, vocab]`; hidden
//! states `[B, T, hidden]`.
//!
//! ```
//! use tch::{nn::VarStore, Device, Tensor};
//! use torchrl::modules::llm::{CausalLm, Gpt2Config, LmInput};
//! # fn main() -> torchrl::Result<()> {
//! tch::manual_seed(0);
//! let vs = VarStore::new(Device::Cpu);
//! let cfg = Gpt2Config::new(50).with_n_layer(2).with_n_embd(16).with_n_head(2).with_n_positions(32);
//! // any architecture's config builds a `Box<dyn CausalLm>`
//! let model: Box<dyn CausalLm> = cfg.build(&vs.root())?;
//! assert_eq!((model.facts().vocab_size, model.n_layer()), (50, 2));
//! let ids = Tensor::from_slice(&[5i64, 7, 9, 11]).view([1, 4]);
//! let full = model.forward(&LmInput::new(&ids), None)?.logits()?;
//! // the same logits, one token at a time through a cache
//! let mut cache = model.new_cache();
//! for t in 0..4 {
//!     let step = model.forward(&LmInput::new(&ids.narrow(1, t, 1)), Some(&mut cache))?.logits()?;
//!     let diff = (step.squeeze_dim(1) - full.select(1, t)).abs().max().double_value(&[]);
//!     assert!(diff < 1e-5, "{diff}");
//! }
//! // an id outside the vocabulary is an error naming it
//! assert!(model.forward(&LmInput::new(&Tensor::from_slice(&[50i64]).view([1, 1])), None).is_err());
//! # use torchrl::modules::llm::CausalLmConfig;
//! # Ok(()) }
//! ```

use std::fmt;
use std::path::Path as FsPath;

use tch::nn::Path;
use tch::{Device, Kind, Tensor};

use super::nn::{Decoder, KvCache};
use super::weights;
use crate::error::{Error, Result, ShapeFmt};

/// The facts about a model that the layers above it need, read from its config.
#[derive(Debug, Clone, PartialEq)]
pub struct LmFacts {
    /// `transformers`' `model_type` (`"gpt2"`, …).
    pub model_type: String,
    /// Vocabulary size (rows of the embedding and the LM head).
    pub vocab_size: i64,
    /// Width of the residual stream.
    pub hidden_size: i64,
    /// Number of blocks.
    pub n_layer: usize,
    /// Context length: positions must stay below it.
    pub max_positions: i64,
    /// Whether the LM head is the token embedding.
    pub tie_word_embeddings: bool,
    /// The std of the random init (`initializer_range`), used for new heads on the model.
    pub initializer_range: f64,
    /// Beginning-of-sequence id, if the config names one.
    pub bos_token_id: Option<i64>,
    /// End-of-sequence id, if the config names one.
    pub eos_token_id: Option<i64>,
    /// Padding id, if the config names one.
    pub pad_token_id: Option<i64>,
}

/// What one forward reads: token ids, and optionally the attention mask and position ids.
/// See the [module docs](self) for their shapes and defaults.
#[derive(Debug)]
pub struct LmInput<'a> {
    /// Token ids, `[B, T]`, int64.
    pub input_ids: &'a Tensor,
    /// `[B, P + T]`, 1 for real tokens and 0 for padding (any integer, bool or float dtype);
    /// `None`: every token is real.
    pub attention_mask: Option<&'a Tensor>,
    /// `[B, T]`; `None`: from the mask (`cumsum - 1`, pads 1) or `P..P+T` without one.
    pub position_ids: Option<&'a Tensor>,
}

impl<'a> LmInput<'a> {
    /// Ids only.
    pub fn new(input_ids: &'a Tensor) -> Self {
        LmInput {
            input_ids,
            attention_mask: None,
            position_ids: None,
        }
    }

    /// Sets the attention mask.
    pub fn with_attention_mask(mut self, mask: &'a Tensor) -> Self {
        self.attention_mask = Some(mask);
        self
    }

    /// Sets the position ids.
    pub fn with_position_ids(mut self, position_ids: &'a Tensor) -> Self {
        self.position_ids = Some(position_ids);
        self
    }
}

/// What to compute besides the last hidden state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ForwardOptions {
    /// Run the LM head (default `true`).
    pub logits: bool,
    /// Keep the hidden state entering this block (`n_layer`: the final norm's input).
    pub capture_block_input: Option<usize>,
}

impl Default for ForwardOptions {
    fn default() -> Self {
        ForwardOptions {
            logits: true,
            capture_block_input: None,
        }
    }
}

/// What a forward returns.
#[derive(Debug)]
pub struct LmOutput {
    /// `[B, T, vocab]`, unless [`ForwardOptions::logits`] was off.
    pub logits: Option<Tensor>,
    /// The final norm's output, `[B, T, hidden]` (`transformers`' `hidden_states[-1]`).
    pub last_hidden: Tensor,
    /// The hidden state entering the requested block, `[B, T, hidden]`.
    pub block_input: Option<Tensor>,
}

impl LmOutput {
    /// The logits, or an error if the forward skipped them.
    pub fn logits(self) -> Result<Tensor> {
        self.logits.ok_or_else(|| {
            Error::invalid(
                "LmOutput::logits",
                "the forward ran with ForwardOptions { logits: false, .. }",
            )
        })
    }
}

/// Position ids for a left-padded mask `[B, S]`: `cumsum(mask) - 1`, with pads set to 1 (as
/// `transformers`' `generate` and trlX set them), int64.
///
/// ```
/// use tch::Tensor;
/// use torchrl::modules::llm::position_ids_from_mask;
/// let mask = Tensor::from_slice(&[0i64, 0, 1, 1, 1, 1]).view([2, 3]);
/// let pos = position_ids_from_mask(&mask)?;
/// assert_eq!(Vec::<i64>::try_from(pos.view([-1]))?, vec![1, 1, 0, 0, 1, 2]);
/// # Ok::<(), torchrl::Error>(())
/// ```
pub fn position_ids_from_mask(mask: &Tensor) -> Result<Tensor> {
    let m = mask.f_to_kind(Kind::Int64)?;
    let pos = m.f_cumsum(-1, Kind::Int64)?.f_sub_scalar(1)?;
    Ok(pos.f_masked_fill(&m.f_eq(0)?, 1)?)
}

/// The two dims of a `[batch, time]`-shaped tensor, or an error naming `key` and `expected`.
pub(crate) fn dims2(op: &'static str, key: &str, t: &Tensor, expected: &str) -> Result<[i64; 2]> {
    let size = t.size();
    <[i64; 2]>::try_from(size.as_slice()).map_err(|_| {
        Error::value(
            op,
            key,
            format!("shape {expected}"),
            ShapeFmt(&size).to_string(),
        )
    })
}

/// A config that builds its model: what the heads' `new` constructors take, so that one call
/// makes a head on any architecture.
pub trait CausalLmConfig {
    /// A randomly initialised model (`transformers`' init) with its variables under `path`
    /// by `transformers`' names.
    ///
    /// # Errors
    /// An invalid config, named by field.
    fn build(&self, path: &Path<'_>) -> Result<Box<dyn CausalLm>>;

    /// What the model built from this config will report as its [`CausalLm::facts`]: sizes
    /// and special ids, read without building anything.
    fn facts(&self) -> LmFacts;
}

/// A causal language model. See the [module docs](self).
///
/// Required: [`facts`](Self::facts), [`decoder`](Self::decoder),
/// [`decoder_mut`](Self::decoder_mut), [`block_name`](Self::block_name), [`embed`](Self::embed),
/// [`lm_head_weight`](Self::lm_head_weight), [`embedding_parameters`](Self::embedding_parameters),
/// [`named_parameters`](Self::named_parameters), [`copy_to`](Self::copy_to) and
/// [`config_json`](Self::config_json). Everything else is provided.
pub trait CausalLm: Send + fmt::Debug {
    /// The config facts the layers above need.
    fn facts(&self) -> &LmFacts;

    /// The blocks, the final norm and the rotary table.
    fn decoder(&self) -> &Decoder;

    /// The decoder, mutably: what attaching and merging LoRA adapters
    /// ([`crate::modules::llm::lora`]) walks.
    fn decoder_mut(&mut self) -> &mut Decoder;

    /// The module name of block `index` under `transformers`' names, without a trailing dot
    /// (`"model.layers.3"`, GPT-2's `"transformer.h.3"`): the prefix of the block's parameter
    /// names and of PEFT's module names.
    fn block_name(&self, index: usize) -> String;

    /// The embedding of `input_ids` `[B, T]` at `position_ids` `[B, T]` (token embedding, plus
    /// GPT-2's learned positions), `[B, T, hidden]`. Inputs are checked by the caller.
    fn embed(&self, input_ids: &Tensor, position_ids: &Tensor) -> Result<Tensor>;

    /// The LM head's weight, `[vocab, hidden]` (the token embedding when tied).
    fn lm_head_weight(&self) -> &Tensor;

    /// The embeddings' parameters (what a hydra policy freezes besides its lower blocks).
    fn embedding_parameters(&self) -> Vec<&Tensor>;

    /// `(transformers name, parameter)` pairs in `transformers`' order; a tied LM head is not
    /// listed twice.
    fn named_parameters(&self) -> Vec<(String, &Tensor)>;

    /// A copy of the model (same config and values) as new variables under `path`.
    ///
    /// # Errors
    /// As the variables' creation.
    fn copy_to(&self, path: &Path<'_>) -> Result<Box<dyn CausalLm>>;

    /// The config as `transformers` writes `config.json`.
    ///
    /// # Errors
    /// When it cannot be serialised.
    fn config_json(&self) -> Result<String>;

    /// The LoRA adapters' tensors by module name (`model.layers.0.self_attn.q_proj.lora_A.weight`,
    /// then `….lora_B.weight`, in block order; PEFT's names without its `base_model.model.`
    /// prefix); empty without adapters. See [`crate::modules::llm::lora`].
    fn adapter_parameters(&self) -> Vec<(String, &Tensor)> {
        let mut out = Vec::new();
        for (b, block) in self.decoder().blocks().iter().enumerate() {
            let prefix = self.block_name(b);
            for lin in block.linears() {
                if let Some(a) = lin.lora() {
                    out.push((format!("{prefix}.{}.lora_A.weight", lin.name()), a.a()));
                    out.push((format!("{prefix}.{}.lora_B.weight", lin.name()), a.b()));
                }
            }
        }
        out
    }

    /// Turns gradient checkpointing per block on (`transformers`' name): training forwards
    /// keep only the blocks' inputs and recompute each block in the backward (see
    /// [`crate::modules::llm::nn::checkpoint`]; the optimizer's step runs the second phase).
    fn gradient_checkpointing_enable(&mut self) {
        self.decoder_mut().set_gradient_checkpointing(true);
    }

    /// Turns gradient checkpointing off.
    fn gradient_checkpointing_disable(&mut self) {
        self.decoder_mut().set_gradient_checkpointing(false);
    }

    /// The parameters' device.
    fn device(&self) -> Device {
        self.lm_head_weight().device()
    }

    /// The parameters' dtype.
    fn kind(&self) -> Kind {
        self.lm_head_weight().kind()
    }

    /// The number of blocks.
    fn n_layer(&self) -> usize {
        self.decoder().blocks().len()
    }

    /// An empty cache of this model's depth.
    fn new_cache(&self) -> KvCache {
        KvCache::new(self.n_layer())
    }

    /// The number of parameters (a tied LM head counted once).
    fn num_parameters(&self) -> i64 {
        self.named_parameters()
            .iter()
            .map(|(_, p)| p.numel() as i64)
            .sum()
    }

    /// The embeddings' parameters and those of blocks `0..n` (the lower trunk a hydra policy
    /// freezes).
    fn lower_trunk_parameters(&self, n: usize) -> Vec<&Tensor> {
        let mut out = self.embedding_parameters();
        out.extend(self.decoder().block_parameters(n));
        out
    }

    /// Logits for a hidden state `[.., hidden]` through the LM head.
    fn lm_head(&self, hidden: &Tensor) -> Result<Tensor> {
        // a decode's packed copy of the head (`nn::packed`), when one is active
        if let Some(y) = super::nn::packed::linear(hidden, self.lm_head_weight(), None)? {
            return Ok(y);
        }
        Ok(hidden.f_matmul(&self.lm_head_weight().f_transpose(0, 1)?)?)
    }

    /// [`CausalLm::forward_with`] with the default options (logits on, no captured block).
    fn forward(&self, input: &LmInput<'_>, cache: Option<&mut KvCache>) -> Result<LmOutput> {
        self.forward_with(input, cache, ForwardOptions::default())
    }

    /// The forward pass. Checks the ids (int64 `[B, T]`, inside the vocabulary), the mask
    /// (`[B, P + T]`), the position ids (`[B, T]`, inside the context) and the cache (one made
    /// for this model, holding `B` rows) before computing.
    fn forward_with(
        &self,
        input: &LmInput<'_>,
        cache: Option<&mut KvCache>,
        options: ForwardOptions,
    ) -> Result<LmOutput> {
        check_input(self.facts(), input, cache.as_deref())?;
        self.forward_unchecked(input, cache, options)
    }

    /// The forward without input checks, for callers that built the inputs themselves
    /// (generation, heads). Bad inputs give libtorch's errors rather than named ones.
    fn forward_unchecked(
        &self,
        input: &LmInput<'_>,
        mut cache: Option<&mut KvCache>,
        options: ForwardOptions,
    ) -> Result<LmOutput> {
        let [b, t] = dims2("CausalLm::forward", "input_ids", input.input_ids, "[B, T]")?;
        let past = cache.as_ref().map_or(0, |c| c.len());
        let device = self.device();
        let pos = positions(input, past, t, device)?;
        let x = self.embed(input.input_ids, &pos)?;
        let decoder = self.decoder();
        let ctx = decoder.context(input.attention_mask, Some(&pos), past, t, device, x.kind())?;
        let out = decoder.forward(x, &ctx, cache.as_deref_mut(), options.capture_block_input)?;
        if let Some(c) = cache {
            c.advance(t, b);
        }
        let logits = if options.logits {
            Some(self.lm_head(&out.last_hidden)?)
        } else {
            None
        };
        Ok(LmOutput {
            logits,
            last_hidden: out.last_hidden,
            block_input: out.block_input,
        })
    }

    /// The forward from the hidden state entering block `start` (what
    /// [`ForwardOptions::capture_block_input`] returns for it): blocks `start..`, the final
    /// norm and the logits, without a cache. A hydra model's frozen trunk gives the same
    /// `hidden` at every update of a rollout, so its updates can start here (see
    /// [`CachedTrunk`](crate::modules::llm::CachedTrunk)). Positions (for rotary models) come
    /// from the mask as in the full forward.
    ///
    /// ```
    /// use tch::nn::VarStore;
    /// use tch::{Kind, Tensor};
    /// use torchrl::modules::llm::{CausalLm, ForwardOptions, Gpt2Config, Gpt2Model, LmInput};
    /// # fn main() -> torchrl::Result<()> {
    /// let cfg = Gpt2Config::new(20).with_n_layer(2).with_n_embd(8).with_n_head(2).with_n_positions(8);
    /// let vs = VarStore::new(tch::Device::Cpu);
    /// let model = Gpt2Model::new(&vs.root(), &cfg)?;
    /// let ids = Tensor::from_slice(&[0i64, 3, 4, 5]).view([1, 4]);
    /// let mask = Tensor::from_slice(&[0i64, 1, 1, 1]).view([1, 4]);
    /// let input = LmInput::new(&ids).with_attention_mask(&mask);
    /// let full = model.forward_with(&input, None, ForwardOptions { logits: true, capture_block_input: Some(1) })?;
    /// let hidden = full.block_input.as_ref().unwrap();
    /// let upper = model.forward_from_block(hidden, 1, Some(&mask))?;
    /// let d = (full.logits.unwrap() - upper.logits.unwrap()).abs().max().double_value(&[]);
    /// assert!(d < 1e-6);
    /// assert!(model.forward_from_block(hidden, 3, Some(&mask)).is_err()); // 2 blocks
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// `start > n_layer`, a `hidden` that is not `[B, T, hidden]`, or a mask that is not
    /// `[B, T]`.
    fn forward_from_block(
        &self,
        hidden: &Tensor,
        start: usize,
        attention_mask: Option<&Tensor>,
    ) -> Result<LmOutput> {
        let last_hidden = run_from_block(
            self.facts().hidden_size,
            self.decoder(),
            hidden,
            start,
            attention_mask,
        )?;
        let logits = self.lm_head(&last_hidden)?;
        Ok(LmOutput {
            logits: Some(logits),
            last_hidden,
            block_input: None,
        })
    }

    /// The hidden state entering block `end` (`[B, T, hidden]`, what
    /// [`ForwardOptions::capture_block_input`] returns for it), running the embedding and
    /// blocks `..end` only: not the blocks above, the final norm or the LM head. What a
    /// hydra model's reference branch starts from, without the policy's upper blocks
    /// ([`CausalLmWithHydraValueHead::forward_reference`](crate::modules::llm::CausalLmWithHydraValueHead::forward_reference)).
    /// Checks the input as [`CausalLm::forward_with`] does; no cache, no gradient
    /// checkpointing.
    ///
    /// ```
    /// use tch::nn::VarStore;
    /// use tch::Tensor;
    /// use torchrl::modules::llm::{CausalLm, ForwardOptions, Gpt2Config, Gpt2Model, LmInput};
    /// # fn main() -> torchrl::Result<()> {
    /// let cfg = Gpt2Config::new(20).with_n_layer(3).with_n_embd(8).with_n_head(2).with_n_positions(8);
    /// let vs = VarStore::new(tch::Device::Cpu);
    /// let model = Gpt2Model::new(&vs.root(), &cfg)?;
    /// let ids = Tensor::from_slice(&[0i64, 3, 4, 5]).view([1, 4]);
    /// let mask = Tensor::from_slice(&[0i64, 1, 1, 1]).view([1, 4]);
    /// let input = LmInput::new(&ids).with_attention_mask(&mask);
    /// let full = model.forward_with(&input, None, ForwardOptions { logits: false, capture_block_input: Some(2) })?;
    /// let lower = model.forward_to_block(&input, 2)?;
    /// assert!(lower.equal(full.block_input.as_ref().unwrap()));
    /// assert!(model.forward_to_block(&input, 4).is_err()); // 3 blocks
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`CausalLm::forward_with`]'s input checks; `end > n_layer`.
    fn forward_to_block(&self, input: &LmInput<'_>, end: usize) -> Result<Tensor> {
        check_input(self.facts(), input, None)?;
        let [_, t] = dims2("CausalLm::forward", "input_ids", input.input_ids, "[B, T]")?;
        let device = self.device();
        let pos = positions(input, 0, t, device)?;
        let x = self.embed(input.input_ids, &pos)?;
        let decoder = self.decoder();
        let ctx = decoder.context(input.attention_mask, Some(&pos), 0, t, device, x.kind())?;
        decoder.forward_to(end, x, &ctx)
    }

    /// Loads `model.safetensors` (by `transformers`' names; a tied `lm_head.weight` is checked
    /// and skipped; buffers ignored). Nothing is written unless every tensor fits.
    ///
    /// # Errors
    /// A missing, extra or mis-shaped tensor, listed by name; an unreadable file.
    fn load_safetensors(&self, file: &FsPath) -> Result<()> {
        let op = "CausalLm::load_safetensors";
        let tensors = weights::read_tensors(op, file)?;
        let params = self.named_parameters();
        let tied = if self.facts().tie_word_embeddings {
            Some(("lm_head.weight", self.lm_head_weight()))
        } else {
            None
        };
        weights::load_into(op, file, &params, tensors, tied)
    }

    /// Loads a model folder's weights: `model.safetensors`, or the shards of
    /// `model.safetensors.index.json`. Everything is read and checked before any parameter
    /// changes.
    ///
    /// # Errors
    /// A missing or unreadable file or shard (named), or tensors that do not fit.
    fn load_folder(&self, dir: &FsPath) -> Result<()> {
        let op = "CausalLm::load_folder";
        let (file, tensors) = weights::read_folder(op, dir)?;
        let params = self.named_parameters();
        let tied = if self.facts().tie_word_embeddings {
            Some(("lm_head.weight", self.lm_head_weight()))
        } else {
            None
        };
        weights::load_into(op, &file, &params, tensors, tied)
    }

    /// Writes `config.json` and `model.safetensors` into `dir` (created if needed), each
    /// atomically, as `transformers`' `save_pretrained` lays them out.
    ///
    /// # Errors
    /// Any I/O failure, naming the file.
    fn save_pretrained(&self, dir: &FsPath) -> Result<()> {
        weights::save_folder(
            "CausalLm::save_pretrained",
            dir,
            &self.config_json()?,
            &self.named_parameters(),
        )
    }
}

/// Checks a forward's inputs against the model's facts and the cache.
fn check_input(facts: &LmFacts, input: &LmInput<'_>, cache: Option<&KvCache>) -> Result<()> {
    let op = "CausalLm::forward";
    let ids = input.input_ids;
    let [b, t] = dims2(op, "input_ids", ids, "[batch, time]")?;
    if ids.kind() != Kind::Int64 {
        let (key, expected, actual) = ("input_ids".to_string(), Kind::Int64, ids.kind());
        return Err(Error::DtypeMismatch {
            op,
            key,
            expected,
            actual,
        });
    }
    if b * t > 0 {
        let lo = ids.f_min()?.int64_value(&[]);
        let hi = ids.f_max()?.int64_value(&[]);
        if lo < 0 || hi >= facts.vocab_size {
            let bad = if lo < 0 { lo } else { hi };
            return Err(Error::value(
                op,
                "input_ids",
                format!("token ids in [0, {})", facts.vocab_size),
                format!("id {bad}"),
            ));
        }
    }
    let past = match cache {
        Some(c) => {
            if c.n_layer() != facts.n_layer {
                return Err(Error::value(
                    op,
                    "cache",
                    format!("a KvCache for {} layers", facts.n_layer),
                    format!("one for {} layers", c.n_layer()),
                ));
            }
            if let Some(rows) = c.batch_size() {
                if rows != b {
                    return Err(Error::value(
                        op,
                        "cache",
                        format!("a KvCache holding {b} rows (the batch of input_ids)"),
                        format!("one holding {rows} rows"),
                    ));
                }
            }
            c.len()
        }
        None => 0,
    };
    if past.saturating_add(t) > facts.max_positions {
        return Err(Error::value(
            op,
            "input_ids",
            format!(
                "at most {} tokens (the context length) including the cache",
                facts.max_positions
            ),
            format!("{past} cached + {t} new"),
        ));
    }
    if let Some(mask) = input.attention_mask {
        if mask.size() != [b, past + t] {
            return Err(Error::ShapeMismatch {
                op,
                key: "attention_mask".into(),
                expected: vec![b, past + t],
                actual: mask.size(),
            });
        }
    }
    if let Some(pos) = input.position_ids {
        if pos.size() != [b, t] {
            return Err(Error::ShapeMismatch {
                op,
                key: "position_ids".into(),
                expected: vec![b, t],
                actual: pos.size(),
            });
        }
        if b * t > 0 {
            let lo = pos.f_min()?.int64_value(&[]);
            let hi = pos.f_max()?.int64_value(&[]);
            if lo < 0 || hi >= facts.max_positions {
                return Err(Error::value(
                    op,
                    "position_ids",
                    format!("positions in [0, {})", facts.max_positions),
                    format!("[{lo}, {hi}]"),
                ));
            }
        }
    }
    Ok(())
}

/// Position ids for `input` with `past` cached tokens.
fn positions(input: &LmInput<'_>, past: i64, t: i64, device: Device) -> Result<Tensor> {
    if let Some(p) = input.position_ids {
        return Ok(p.f_to_kind(Kind::Int64)?);
    }
    default_positions(input.attention_mask, past, t, device)
}

/// Position ids of `t` tokens after `past` cached ones: from the mask (`cumsum - 1`, pads 1)
/// or `past..past + t` without one.
fn default_positions(mask: Option<&Tensor>, past: i64, t: i64, device: Device) -> Result<Tensor> {
    match mask {
        Some(m) => Ok(position_ids_from_mask(m)?.f_narrow(1, past, t)?),
        None => Ok(Tensor::f_arange_start(past, past + t, (Kind::Int64, device))?.f_view([1, t])?),
    }
}

/// Blocks `start..` of `decoder` and its final norm on `hidden`, after checking the shapes
/// (the forward from a block of a model, and of a hydra branch).
pub(crate) fn run_from_block(
    hidden_size: i64,
    decoder: &Decoder,
    hidden: &Tensor,
    start: usize,
    attention_mask: Option<&Tensor>,
) -> Result<Tensor> {
    const OP: &str = "CausalLm::forward_from_block";
    let n = decoder.blocks().len();
    if start > n {
        return Err(Error::value(
            OP,
            "start",
            format!("a block index of at most n_layer = {n}"),
            start.to_string(),
        ));
    }
    let size = hidden.size();
    let (b, t) = match size.as_slice() {
        [b, t, h] if *h == hidden_size => (*b, *t),
        _ => {
            return Err(Error::value(
                OP,
                "hidden",
                format!("[B, T, hidden = {hidden_size}]"),
                ShapeFmt(&size).to_string(),
            ))
        }
    };
    if let Some(m) = attention_mask {
        if m.size() != [b, t] {
            return Err(Error::value(
                OP,
                "attention_mask",
                format!("the hidden state's [B, T] = {}", ShapeFmt(&[b, t])),
                ShapeFmt(&m.size()).to_string(),
            ));
        }
    }
    // positions only matter to a rotary table (GPT-2's entered with the embedding)
    let pos = match decoder.rotary() {
        Some(_) => Some(default_positions(attention_mask, 0, t, hidden.device())?),
        None => None,
    };
    let ctx = decoder.context(
        attention_mask,
        pos.as_ref(),
        0,
        t,
        hidden.device(),
        hidden.kind(),
    )?;
    decoder.forward_from(start, hidden, &ctx)
}

impl From<Box<dyn CausalLm>> for ModelBox {
    fn from(m: Box<dyn CausalLm>) -> Self {
        ModelBox(m)
    }
}

/// An owned model of any architecture, as the heads hold it: built from a concrete model
/// (`Gpt2Model`) or a `Box<dyn CausalLm>` (what [`CausalLmConfig::build`] and
/// [`super::models::from_pretrained`] return).
#[derive(Debug)]
pub struct ModelBox(pub Box<dyn CausalLm>);

impl<M: CausalLm + 'static> From<M> for ModelBox {
    fn from(m: M) -> Self {
        ModelBox(Box::new(m))
    }
}
