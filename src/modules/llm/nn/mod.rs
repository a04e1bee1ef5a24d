//! The layer kit every causal LM here is built from (candle-nn / burn-nn's shape): each layer
//! owns its parameters under `transformers`' names, runs on any device and dtype, copies
//! itself (for a hydra branch or a frozen reference) and lists its parameters by name.
//!
//! - [`Linear`]: `transformers`' `nn.Linear` (`[out, in]` weights) or GPT-2's `Conv1D`
//!   (`[in, out]`, read as a transposed linear), optional bias, optional LoRA adapter
//!   ([`LoraAdapter`], following a model-wide [`LoraSwitch`]);
//! - [`LayerNorm`], [`RmsNorm`] and [`Norm`] (either);
//! - [`RotaryEmbedding`]: rotary position embeddings with the config's theta and scaling
//!   ([`RopeScaling`]: `default`, `linear`, `llama3`);
//! - [`Attention`]: causal self-attention with grouped / multi-query key-value heads, fused or
//!   separate q/k/v projections (optional biases), optional per-head q/k RMS norms, and the
//!   [`KvCache`] held outside the model;
//! - [`Mlp`] and [`GatedMlp`] (SwiGLU), as [`FeedForward`];
//! - [`DecoderBlock`] (pre-norm attention + feed-forward) and [`Decoder`] (the blocks, the final
//!   norm and the rotary table): the trunk every model file assembles, with optional gradient
//!   checkpointing per block ([`checkpoint`]);
//! - [`build_staged`]: a build (and its weight load) that adds its variables to the caller's
//!   store only when it succeeds, as every `from_pretrained` does.
//!
//! A model file (`super::models`) builds these under its own names and adds its embeddings
//! and LM head; see `docs/architecture.md` for adding an architecture.
//!
//! ```
//! use tch::{nn::VarStore, Device, Kind, Tensor};
//! use torchrl::modules::llm::nn::{RmsNorm, Linear, WeightLayout};
//! # fn main() -> torchrl::Result<()> {
//! let vs = VarStore::new(Device::Cpu);
//! let norm = RmsNorm::new(&vs.root(), "norm", 4, 1e-6)?;
//! let x = Tensor::from_slice(&[1.0f32, -1.0, 1.0, -1.0]).view([1, 4]);
//! // the root-mean-square of ±1 is 1: the norm leaves x as it is (unit weight)
//! assert!((norm.forward(&x)? - &x).abs().max().double_value(&[]) < 1e-5);
//! let lin = Linear::new(&vs.root(), "proj", 4, 2, true, WeightLayout::OutIn, 0.02)?;
//! assert_eq!(lin.forward(&x)?.size(), vec![1, 2]);
//! assert_eq!(lin.named_parameters()[0].0, "proj.weight");
//! # Ok(()) }
//! ```

pub mod attention;
pub mod block;
pub mod cache;
pub mod checkpoint;
pub mod init;
pub mod linear;
pub mod lora;
pub mod mlp;
pub mod norm;
pub mod packed;
pub mod rotary;
pub mod staged;

pub use attention::{attention_mask, Attention, AttentionShape, BlockContext, QkvProjection};
pub use block::{Decoder, DecoderBlock, DecoderOutput};
pub use cache::KvCache;
pub use init::{init_is_seeded, with_init_seed};
pub(crate) use init::{randn_var, uniform_var};
pub use linear::{Linear, WeightLayout};
pub use lora::{LoraAdapter, LoraSwitch};
pub use mlp::{Activation, FeedForward, GatedMlp, Mlp};
pub use norm::{LayerNorm, Norm, RmsNorm};
pub use rotary::{RopeScaling, RotaryEmbedding};
pub use staged::build_staged;

use tch::nn::Path;
use tch::{Kind, Tensor};

use crate::error::Result;

/// The lowest finite value of a float dtype: what masked attention scores are set to
/// (`torch.finfo(dtype).min`).
pub(crate) fn mask_value(kind: Kind) -> f64 {
    match kind {
        Kind::Half => -65504.0,
        Kind::BFloat16 => -3.3895313892515355e38,
        Kind::Double => f64::MIN,
        _ => f32::MIN as f64,
    }
}

/// `path` followed by the dot-separated segments of `name` (`"attn.c_attn"` →
/// `path / "attn" / "c_attn"`): `tch` paths refuse a dot inside one segment. Names are
/// written by the model files, never empty.
pub(crate) fn sub_path<'a>(path: &Path<'a>, name: &str) -> Path<'a> {
    let mut segments = name.split('.').filter(|s| !s.is_empty());
    let first = segments.next().unwrap_or("_");
    segments.fold(path.sub(first), |p, s| p.sub(s))
}

/// A new variable `name` under `path` holding a copy of `src` (same shape, dtype, values).
pub(crate) fn copy_var(path: &Path<'_>, name: &str, src: &Tensor) -> Result<Tensor> {
    let mut v = path.f_zeros(name, &src.size())?;
    let _guard = tch::no_grad_guard();
    v.f_copy_(src)?;
    Ok(v)
}

/// `(prefix + name, tensor)` for each pair: a layer's names under the block or model it sits in.
pub(crate) fn prefixed<'t>(
    prefix: &str,
    params: Vec<(String, &'t Tensor)>,
) -> Vec<(String, &'t Tensor)> {
    params
        .into_iter()
        .map(|(n, t)| (format!("{prefix}{n}"), t))
        .collect()
}
