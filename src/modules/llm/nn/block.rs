//! [`DecoderBlock`]: one pre-norm transformer block, `x + attn(norm₁(x))` then
//! `x + ffn(norm₂(x))` (GPT-2, Llama, Qwen and Mistral all have this shape), and [`Decoder`]:
//! the blocks, the final norm and the rotary table, with the one forward every model runs
//! (through a cache, capturing the hidden state entering a block) and the forward from a block
//! (hydra branches and cached trunks).
//!
//! # Shapes
//! Hidden states `[B, T, hidden]`; `attention_mask` `[B, P + T]` (1 = real token),
//! `position_ids` `[B, T]`.
//!
//! ```
//! use tch::{nn::VarStore, Device};
//! use torchrl::modules::llm::{CausalLm, Gpt2Config, Gpt2Model};
//! # fn main() -> torchrl::Result<()> {
//! let vs = VarStore::new(Device::Cpu);
//! let cfg = Gpt2Config::new(20).with_n_layer(2).with_n_embd(8).with_n_head(2).with_n_positions(8);
//! let model = Gpt2Model::new(&vs.root(), &cfg)?;
//! let decoder = model.decoder();
//! assert_eq!(decoder.blocks().len(), 2);
//! // the decoder's names are relative to a block: the model file prefixes them
//! let names: Vec<String> = decoder.blocks()[0].named_parameters().into_iter().map(|(n, _)| n).collect();
//! assert_eq!(names[0], "ln_1.weight");
//! assert!(names.contains(&"attn.c_attn.weight".to_string()));
//! # Ok(()) }
//! ```

use tch::nn::Path;
use tch::{Device, Kind, Tensor};

use super::attention::{attention_mask as blocked_mask, Attention, BlockContext};
use super::cache::KvCache;
use super::linear::Linear;
use super::mlp::FeedForward;
use super::norm::Norm;
use super::rotary::RotaryEmbedding;
use crate::error::{Error, Result};

/// One pre-norm block. See the [module docs](self).
#[derive(Debug)]
pub struct DecoderBlock {
    input_norm: Norm,
    attn: Attention,
    post_norm: Norm,
    mlp: FeedForward,
}

impl DecoderBlock {
    /// From its four parts (each already named under the block).
    pub fn new(input_norm: Norm, attn: Attention, post_norm: Norm, mlp: FeedForward) -> Self {
        DecoderBlock {
            input_norm,
            attn,
            post_norm,
            mlp,
        }
    }

    /// The attention.
    pub fn attention(&self) -> &Attention {
        &self.attn
    }

    /// The feed-forward layer.
    pub fn mlp(&self) -> &FeedForward {
        &self.mlp
    }

    /// Every linear layer of the block (attention projections, then the feed-forward's), by
    /// name relative to the block.
    pub fn linears(&self) -> Vec<&Linear> {
        let mut out = self.attn.linears();
        out.extend(self.mlp.linears());
        out
    }

    /// [`DecoderBlock::linears`], mutably (to attach adapters or merge them).
    pub fn linears_mut(&mut self) -> Vec<&mut Linear> {
        let mut out = self.attn.linears_mut();
        out.extend(self.mlp.linears_mut());
        out
    }

    /// Runs the block; with a cache slot, the attention appends to it.
    pub fn forward(
        &self,
        x: &Tensor,
        ctx: &BlockContext,
        slot: Option<&mut Option<(Tensor, Tensor)>>,
    ) -> Result<Tensor> {
        let a = self.attn.forward(&self.input_norm.forward(x)?, ctx, slot)?;
        let x = x.f_add(&a)?;
        let m = self.mlp.forward(&self.post_norm.forward(&x)?)?;
        Ok(x.f_add(&m)?)
    }

    /// `(name, parameter)` pairs relative to the block.
    pub fn named_parameters(&self) -> Vec<(String, &Tensor)> {
        let mut out = self.input_norm.named_parameters();
        out.extend(self.attn.named_parameters());
        out.extend(self.post_norm.named_parameters());
        out.extend(self.mlp.named_parameters());
        out
    }

    /// The same block sharing its tensors: what gradient checkpointing keeps to recompute it.
    pub(crate) fn shallow(&self) -> Self {
        DecoderBlock {
            input_norm: self.input_norm.shallow(),
            attn: self.attn.shallow(),
            post_norm: self.post_norm.shallow(),
            mlp: self.mlp.shallow(),
        }
    }

    /// A copy as new variables under `path` (same names below it).
    pub fn copy_to(&self, path: &Path<'_>) -> Result<Self> {
        Ok(DecoderBlock {
            input_norm: self.input_norm.copy_to(path)?,
            attn: self.attn.copy_to(path)?,
            post_norm: self.post_norm.copy_to(path)?,
            mlp: self.mlp.copy_to(path)?,
        })
    }
}

/// What [`Decoder::forward`] returns.
#[derive(Debug)]
pub struct DecoderOutput {
    /// The final norm's output, `[B, T, hidden]`.
    pub last_hidden: Tensor,
    /// The hidden state entering the requested block (the final norm's input for `n_layer`).
    pub block_input: Option<Tensor>,
}

/// The blocks, the final norm and (for rotary models) the rotary table. See the
/// [module docs](self).
#[derive(Debug)]
pub struct Decoder {
    blocks: Vec<DecoderBlock>,
    norm: Norm,
    rotary: Option<RotaryEmbedding>,
    gradient_checkpointing: bool,
}

impl Decoder {
    /// From its blocks, final norm and optional rotary table.
    pub fn new(blocks: Vec<DecoderBlock>, norm: Norm, rotary: Option<RotaryEmbedding>) -> Self {
        Decoder {
            blocks,
            norm,
            rotary,
            gradient_checkpointing: false,
        }
    }

    /// Turns gradient checkpointing on or off (see [`super::checkpoint`]): while on, a forward
    /// with grad enabled and no cache keeps only the blocks' inputs and recomputes them in
    /// [`super::checkpoint::backward_pending`].
    pub fn set_gradient_checkpointing(&mut self, on: bool) {
        self.gradient_checkpointing = on;
    }

    /// Whether gradient checkpointing is on.
    pub fn gradient_checkpointing(&self) -> bool {
        self.gradient_checkpointing
    }

    /// Whether this forward checkpoints: switched on, grad mode on, no cache.
    fn checkpoints(&self, cached: bool) -> bool {
        self.gradient_checkpointing && !cached && crate::host::ffi::grad_enabled()
    }

    /// The blocks.
    pub fn blocks(&self) -> &[DecoderBlock] {
        &self.blocks
    }

    /// The blocks, mutably (to attach adapters or merge them).
    pub fn blocks_mut(&mut self) -> &mut [DecoderBlock] {
        &mut self.blocks
    }

    /// The final norm.
    pub fn norm(&self) -> &Norm {
        &self.norm
    }

    /// The rotary table, if the model uses one.
    pub fn rotary(&self) -> Option<&RotaryEmbedding> {
        self.rotary.as_ref()
    }

    /// The context of a forward of `t` new tokens after `past` cached ones at `position_ids`
    /// `[B, t]` (needed by a rotary decoder only), under `attention_mask` `[B, past + t]`
    /// (`None`: all real), with activations of dtype `kind`.
    ///
    /// # Errors
    /// A rotary decoder given no position ids.
    pub fn context(
        &self,
        attention_mask: Option<&Tensor>,
        position_ids: Option<&Tensor>,
        past: i64,
        t: i64,
        device: Device,
        kind: Kind,
    ) -> Result<BlockContext> {
        let blocked = blocked_mask(attention_mask, past, t, device)?;
        let rope = match (&self.rotary, position_ids) {
            (Some(r), Some(p)) => Some(r.cos_sin(p, kind)?),
            (Some(_), None) => {
                return Err(Error::invalid(
                    "Decoder::context",
                    "a rotary decoder needs the position ids",
                ))
            }
            (None, _) => None,
        };
        Ok(BlockContext { blocked, rope })
    }

    /// Every block on `x` (a cache gets this step's keys and values; it is advanced by the
    /// caller), then the final norm; captures the input of block `capture` (`n_layer`: the
    /// final norm's input).
    pub fn forward(
        &self,
        x: Tensor,
        ctx: &BlockContext,
        mut cache: Option<&mut KvCache>,
        capture: Option<usize>,
    ) -> Result<DecoderOutput> {
        if self.checkpoints(cache.is_some()) {
            let (last, block_input) = self.forward_checkpointed(0, x, ctx, capture)?;
            return Ok(DecoderOutput {
                last_hidden: self.norm.forward(&last)?,
                block_input,
            });
        }
        let mut x = x;
        let mut block_input = None;
        for (i, block) in self.blocks.iter().enumerate() {
            if capture == Some(i) {
                block_input = Some(x.shallow_clone());
            }
            let slot = match cache.as_deref_mut() {
                Some(c) => Some(c.slot(i)?),
                None => None,
            };
            x = block.forward(&x, ctx, slot)?;
        }
        if capture == Some(self.blocks.len()) {
            block_input = Some(x.shallow_clone());
        }
        Ok(DecoderOutput {
            last_hidden: self.norm.forward(&x)?,
            block_input,
        })
    }

    /// Blocks `start..` on `hidden` (the hidden state entering block `start`), then the final
    /// norm, without a cache.
    ///
    /// # Errors
    /// `start > n_layer`.
    pub fn forward_from(
        &self,
        start: usize,
        hidden: &Tensor,
        ctx: &BlockContext,
    ) -> Result<Tensor> {
        let n = self.blocks.len();
        let blocks = self.blocks.get(start..).ok_or_else(|| {
            Error::value(
                "Decoder::forward_from",
                "start",
                format!("a block index of at most n_layer = {n}"),
                start.to_string(),
            )
        })?;
        if self.checkpoints(false) {
            let (last, _) = self.forward_checkpointed(start, hidden.shallow_clone(), ctx, None)?;
            return self.norm.forward(&last);
        }
        let mut x = hidden.shallow_clone();
        for b in blocks {
            x = b.forward(&x, ctx, None)?;
        }
        self.norm.forward(&x)
    }

    /// Blocks `..end` on `x` (the embedding's output), without a cache, checkpointing or the
    /// final norm: the hidden state entering block `end` (what [`Decoder::forward`] captures
    /// for it).
    ///
    /// # Errors
    /// `end > n_layer`.
    pub fn forward_to(&self, end: usize, x: Tensor, ctx: &BlockContext) -> Result<Tensor> {
        let n = self.blocks.len();
        let blocks = self.blocks.get(..end).ok_or_else(|| {
            Error::value(
                "Decoder::forward_to",
                "end",
                format!("a block index of at most n_layer = {n}"),
                end.to_string(),
            )
        })?;
        let mut x = x;
        for b in blocks {
            x = b.forward(&x, ctx, None)?;
        }
        Ok(x)
    }

    /// Blocks `start..` checkpointed (see [`super::checkpoint`]): the last block's output (a
    /// leaf requiring grad) and, when `capture` asks for it, the input of that block
    /// (detached).
    fn forward_checkpointed(
        &self,
        start: usize,
        x: Tensor,
        ctx: &BlockContext,
        capture: Option<usize>,
    ) -> Result<(Tensor, Option<Tensor>)> {
        let blocks = self.blocks.get(start..).unwrap_or_default();
        match capture {
            // the input of block c is the output of blocks ..c: split the segment there
            Some(c) if c >= start && c <= self.blocks.len() => {
                let (lower, upper) = blocks.split_at(c - start);
                let mid = if lower.is_empty() {
                    x
                } else {
                    super::checkpoint::forward(lower, x, ctx)?
                };
                let captured = mid.f_detach()?;
                let last = if upper.is_empty() {
                    mid
                } else {
                    super::checkpoint::forward(upper, mid, ctx)?
                };
                Ok((last, Some(captured)))
            }
            _ => Ok((super::checkpoint::forward(blocks, x, ctx)?, None)),
        }
    }

    /// A copy of the whole decoder: block `i` under `blocks / i`, the final norm under `norm`
    /// (by its own name), the rotary table shared. What a model file's `copy_to` uses.
    ///
    /// # Errors
    /// As the variables' creation.
    pub fn copy_to(&self, blocks: &Path<'_>, norm: &Path<'_>) -> Result<Decoder> {
        self.copy_from(0, blocks, norm)
    }

    /// Blocks `start..` copied under `blocks / (i - start)`, the norm under `norm`.
    fn copy_from(&self, start: usize, blocks: &Path<'_>, norm: &Path<'_>) -> Result<Decoder> {
        let copies = self
            .blocks
            .iter()
            .skip(start)
            .enumerate()
            .map(|(i, b)| b.copy_to(&(blocks / i)))
            .collect::<Result<Vec<_>>>()?;
        Ok(Decoder {
            blocks: copies,
            norm: self.norm.copy_to(norm)?,
            rotary: self.rotary.as_ref().map(RotaryEmbedding::share),
            gradient_checkpointing: self.gradient_checkpointing,
        })
    }

    /// Copies of the top `k` blocks (under `path / "h" / i`) and the final norm (under `path`),
    /// sharing the rotary table: a hydra branch's trunk.
    ///
    /// # Errors
    /// `k` is 0 or more than the block count.
    pub fn copy_top(&self, path: &Path<'_>, k: usize) -> Result<Decoder> {
        let n = self.blocks.len();
        if k == 0 || k > n {
            return Err(Error::value(
                "Decoder::copy_top",
                "num_layers_unfrozen",
                format!("between 1 and n_layer = {n}"),
                k.to_string(),
            ));
        }
        self.copy_from(n - k, &(path / "h"), path)
    }

    /// The parameters of blocks `0..n`.
    pub(crate) fn block_parameters(&self, n: usize) -> Vec<&Tensor> {
        self.blocks
            .iter()
            .take(n)
            .flat_map(|b| b.named_parameters().into_iter().map(|(_, p)| p))
            .collect()
    }
}
