//! [`Gpt2Model`]: GPT-2 (`transformers`' `GPT2LMHeadModel`) in `tch`: token and position
//! embeddings, pre-norm blocks (causal self-attention and an MLP), a final layer norm and the
//! LM head tied to the token embedding.
//!
//! - **Parameters** carry `transformers`' names (`transformer.h.0.attn.c_attn.weight`, …)
//!   under the [`tch::nn::Path`] the model is built on, with GPT-2's `Conv1D` layout (`[in,
//!   out]` weights, `y = x W + b`), so checkpoints load by name ([`super::weights`]).
//! - **Left padding**: `attention_mask` (1 = a real token) masks padded keys out; position ids
//!   default to `cumsum(mask) - 1` with pads set to 1, as `transformers`' `generate` sets them.
//!   Rows of padded queries attend uniformly (as `transformers`' eager attention): their
//!   outputs are meaningless but finite.
//! - **KV cache outside the model**: [`Gpt2Model::forward`] is `&self` and takes an optional
//!   `&mut` [`KvCache`], so one (frozen) model serves any number of generations; incremental
//!   decoding gives the logits of a full forward.
//! - **Any device and dtype**: the parameters' (`VarStore::set_kind` to `Half`/`BFloat16`);
//!   masks use the dtype's lowest finite value, as `transformers` does.
//!
//! # Shapes
//! `input_ids` `[B, T]` (int64); `attention_mask` `[B, P + T]` where `P` is the cached
//! length (0 without a cache); `position_ids` `[B, T]`; logits `[B, T, vocab]`; hidden
//! states `[B, T, n_embd]`.
//!
//! ```
//! use tch::{nn::VarStore, Device, Kind, Tensor};
//! use torchrl::modules::llm::{Gpt2Config, Gpt2Input, Gpt2Model, KvCache};
//! # fn main() -> torchrl::Result<()> {
//! tch::manual_seed(0);
//! let vs = VarStore::new(Device::Cpu);
//! let cfg = Gpt2Config::new(50).with_n_layer(2).with_n_embd(16).with_n_head(2).with_n_positions(32);
//! let model = Gpt2Model::new(&vs.root(), &cfg)?;
//! let ids = Tensor::from_slice(&[5i64, 7, 9, 11]).view([1, 4]);
//! let full = model.forward(&Gpt2Input::new(&ids), None)?.logits()?;
//! assert_eq!(full.size(), vec![1, 4, 50]);
//! // the same logits, one token at a time through a cache
//! let mut cache = KvCache::new(&cfg);
//! for t in 0..4 {
//!     let step = model.forward(&Gpt2Input::new(&ids.narrow(1, t, 1)), Some(&mut cache))?.logits()?;
//!     let diff = (step.squeeze_dim(1) - full.select(1, t)).abs().max().double_value(&[]);
//!     assert!(diff < 1e-5, "{diff}");
//! }
//! assert_eq!(cache.len(), 4);
//! // an id outside the vocabulary is an error naming it
//! assert!(model.forward(&Gpt2Input::new(&Tensor::from_slice(&[50i64]).view([1, 1])), None).is_err());
//! # Ok(()) }
//! ```

use std::fmt;

use tch::nn::{Init, Path};
use tch::{Device, Kind, Tensor};

use super::cache::KvCache;
use super::config::{Gpt2Activation, Gpt2Config};
use crate::error::{Error, Result, ShapeFmt};

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

/// Key lengths below this are padded up to it before the attention softmax on the CPU.
const SOFTMAX_MIN_KEYS: i64 = 16;

/// `softmax(scores, -1)` over the keys. libtorch 2.13's CPU softmax along a last dim shorter
/// than 16 takes a scalar path about 10× slower than along 16 (measured on `[64, 4, 15, 15]`:
/// 784 µs against 64 µs for `[64, 4, 16, 16]`), and short key lengths are what prompts, DPO
/// pairs and the first decoding steps have. There the scores are padded to 16 keys with the
/// mask value (whose exponential is exactly 0, so no probability moves) and the
/// probabilities narrowed back: the same values up to the summation order (≤ 5e-7 in float32).
fn attention_softmax(scores: &Tensor) -> Result<Tensor> {
    let keys = scores.size().last().copied().unwrap_or(0);
    if scores.device() != Device::Cpu || keys == 0 || keys >= SOFTMAX_MIN_KEYS {
        return Ok(scores.f_softmax(-1, None::<Kind>)?);
    }
    let padded = scores.f_pad(
        [0, SOFTMAX_MIN_KEYS - keys],
        "constant",
        mask_value(scores.kind()),
    )?;
    Ok(padded.f_softmax(-1, None::<Kind>)?.f_narrow(-1, 0, keys)?)
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

/// A layer norm's affine parameters.
#[derive(Debug)]
pub(crate) struct LayerNorm {
    pub(crate) weight: Tensor,
    pub(crate) bias: Tensor,
    pub(crate) eps: f64,
}

impl LayerNorm {
    fn new(p: &Path<'_>, dim: i64, eps: f64) -> Result<Self> {
        Ok(LayerNorm {
            weight: p.f_var("weight", &[dim], Init::Const(1.0))?,
            bias: p.f_var("bias", &[dim], Init::Const(0.0))?,
            eps,
        })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let dim = self.weight.size();
        Ok(x.f_layer_norm(dim, Some(&self.weight), Some(&self.bias), self.eps, true)?)
    }

    fn copy_to(&self, p: &Path<'_>) -> Result<Self> {
        Ok(LayerNorm {
            weight: copy_var(p, "weight", &self.weight)?,
            bias: copy_var(p, "bias", &self.bias)?,
            eps: self.eps,
        })
    }
}

/// GPT-2's `Conv1D`: `y = x W + b` with `W` of shape `[in, out]`.
#[derive(Debug)]
pub(crate) struct Conv1D {
    pub(crate) weight: Tensor,
    pub(crate) bias: Tensor,
}

impl Conv1D {
    fn new(p: &Path<'_>, n_in: i64, n_out: i64, std: f64) -> Result<Self> {
        Ok(Conv1D {
            weight: p.f_var(
                "weight",
                &[n_in, n_out],
                Init::Randn {
                    mean: 0.0,
                    stdev: std,
                },
            )?,
            bias: p.f_var("bias", &[n_out], Init::Const(0.0))?,
        })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut shape = x.size();
        let n_in = shape.last().copied().unwrap_or(0);
        let n_out = self.bias.size().first().copied().unwrap_or(0);
        if let Some(last) = shape.last_mut() {
            *last = n_out;
        }
        let y = self.bias.f_addmm(&x.f_reshape([-1, n_in])?, &self.weight)?;
        Ok(y.f_view(shape.as_slice())?)
    }

    fn copy_to(&self, p: &Path<'_>) -> Result<Self> {
        Ok(Conv1D {
            weight: copy_var(p, "weight", &self.weight)?,
            bias: copy_var(p, "bias", &self.bias)?,
        })
    }
}

/// A new variable under `p` holding a copy of `src` (same shape, dtype and values).
fn copy_var(p: &Path<'_>, name: &str, src: &Tensor) -> Result<Tensor> {
    let mut v = p.f_zeros(name, &src.size())?;
    let _guard = tch::no_grad_guard();
    v.f_copy_(src)?;
    Ok(v)
}

/// One pre-norm transformer block (`transformers`' `GPT2Block`).
#[derive(Debug)]
pub(crate) struct Block {
    ln_1: LayerNorm,
    c_attn: Conv1D,
    attn_proj: Conv1D,
    ln_2: LayerNorm,
    c_fc: Conv1D,
    mlp_proj: Conv1D,
    n_head: i64,
    /// Divides the attention scores (`sqrt(head_dim)` and the layer-index factor).
    score_divisor: f64,
    activation: Gpt2Activation,
}

/// The attention mask of one forward: `true` where a query may **not** attend a key,
/// `[B, 1, T, P + T]`, or `None` when every query may attend every earlier key.
pub(crate) type Blocked = Option<Tensor>;

impl Block {
    fn new(p: &Path<'_>, cfg: &Gpt2Config, index: i64) -> Result<Self> {
        let e = cfg.n_embd;
        let std = cfg.initializer_range;
        // GPT-2 scales the residual projections' init by 1/sqrt(2 * n_layer).
        let proj_std = std / (2.0 * cfg.n_layer as f64).sqrt();
        let mut score_divisor = 1.0;
        if cfg.scale_attn_weights {
            score_divisor *= (cfg.head_dim() as f64).sqrt();
        }
        if cfg.scale_attn_by_inverse_layer_idx {
            score_divisor *= (index + 1) as f64;
        }
        Ok(Block {
            ln_1: LayerNorm::new(&(p / "ln_1"), e, cfg.layer_norm_epsilon)?,
            c_attn: Conv1D::new(&(p / "attn" / "c_attn"), e, 3 * e, std)?,
            attn_proj: Conv1D::new(&(p / "attn" / "c_proj"), e, e, proj_std)?,
            ln_2: LayerNorm::new(&(p / "ln_2"), e, cfg.layer_norm_epsilon)?,
            c_fc: Conv1D::new(&(p / "mlp" / "c_fc"), e, cfg.inner_dim(), std)?,
            mlp_proj: Conv1D::new(&(p / "mlp" / "c_proj"), cfg.inner_dim(), e, proj_std)?,
            n_head: cfg.n_head,
            score_divisor,
            activation: cfg.activation()?,
        })
    }

    /// A copy of this block's parameters as new variables under `p`.
    pub(crate) fn copy_to(&self, p: &Path<'_>) -> Result<Self> {
        Ok(Block {
            ln_1: self.ln_1.copy_to(&(p / "ln_1"))?,
            c_attn: self.c_attn.copy_to(&(p / "attn" / "c_attn"))?,
            attn_proj: self.attn_proj.copy_to(&(p / "attn" / "c_proj"))?,
            ln_2: self.ln_2.copy_to(&(p / "ln_2"))?,
            c_fc: self.c_fc.copy_to(&(p / "mlp" / "c_fc"))?,
            mlp_proj: self.mlp_proj.copy_to(&(p / "mlp" / "c_proj"))?,
            n_head: self.n_head,
            score_divisor: self.score_divisor,
            activation: self.activation,
        })
    }

    /// `(name, parameter)` pairs, names relative to the block (`"attn.c_attn.weight"`, …).
    pub(crate) fn named_parameters(&self) -> Vec<(String, &Tensor)> {
        let layers: [(&str, [&Tensor; 2]); 6] = [
            ("ln_1", [&self.ln_1.weight, &self.ln_1.bias]),
            ("attn.c_attn", [&self.c_attn.weight, &self.c_attn.bias]),
            (
                "attn.c_proj",
                [&self.attn_proj.weight, &self.attn_proj.bias],
            ),
            ("ln_2", [&self.ln_2.weight, &self.ln_2.bias]),
            ("mlp.c_fc", [&self.c_fc.weight, &self.c_fc.bias]),
            ("mlp.c_proj", [&self.mlp_proj.weight, &self.mlp_proj.bias]),
        ];
        layers
            .into_iter()
            .flat_map(|(name, [w, b])| [(format!("{name}.weight"), w), (format!("{name}.bias"), b)])
            .collect()
    }

    fn activate(&self, x: &Tensor) -> Result<Tensor> {
        Ok(match self.activation {
            Gpt2Activation::GeluNew => x.f_gelu("tanh")?,
            Gpt2Activation::Gelu => x.f_gelu("none")?,
            Gpt2Activation::Relu => x.f_relu()?,
            Gpt2Activation::Silu => x.f_silu()?,
            Gpt2Activation::QuickGelu => x.f_mul(&x.f_mul_scalar(1.702)?.f_sigmoid()?)?,
        })
    }

    /// Runs the block on `x` `[B, T, E]`; with a cache layer, appends this step's keys and
    /// values to it and attends over all of them.
    pub(crate) fn forward(
        &self,
        x: &Tensor,
        blocked: &Blocked,
        layer_cache: Option<&mut Option<(Tensor, Tensor)>>,
    ) -> Result<Tensor> {
        let (b, t, e) = x.size3()?;
        let h = self.n_head;
        let d = e / h;
        let qkv = self.c_attn.forward(&self.ln_1.forward(x)?)?;
        // [B, T, 3E] -> [3, B, H, T, D]: one view and one permute for the three projections
        let qkv = qkv.f_view([b, t, 3, h, d])?.f_permute([2, 0, 3, 1, 4])?;
        let (q, mut k, mut v) = (
            qkv.f_select(0, 0)?,
            qkv.f_select(0, 1)?,
            qkv.f_select(0, 2)?,
        );
        if let Some(slot) = layer_cache {
            if let Some((pk, pv)) = slot.take() {
                k = Tensor::f_cat(&[&pk, &k], 2)?;
                v = Tensor::f_cat(&[&pv, &v], 2)?;
            }
            *slot = Some((k.shallow_clone(), v.shallow_clone()));
        }
        let mut scores = q.f_matmul(&k.f_transpose(-1, -2)?)?;
        if self.score_divisor != 1.0 {
            scores = scores.f_div_scalar(self.score_divisor)?;
        }
        if let Some(blocked) = blocked {
            scores = scores.f_masked_fill(blocked, mask_value(scores.kind()))?;
        }
        let probs = attention_softmax(&scores)?;
        let attn = probs
            .f_matmul(&v)?
            .f_transpose(1, 2)?
            .f_reshape([b, t, e])?;
        let x = x.f_add(&self.attn_proj.forward(&attn)?)?;
        let m = self
            .mlp_proj
            .forward(&self.activate(&self.c_fc.forward(&self.ln_2.forward(&x)?)?)?)?;
        Ok(x.f_add(&m)?)
    }
}

/// What one forward reads: token ids, and optionally the attention mask and position ids.
/// See the [module docs](self) for their shapes and defaults.
#[derive(Debug)]
pub struct Gpt2Input<'a> {
    /// Token ids, `[B, T]`, int64.
    pub input_ids: &'a Tensor,
    /// `[B, P + T]`, 1 for real tokens and 0 for padding (any integer, bool or float dtype);
    /// `None`: every token is real.
    pub attention_mask: Option<&'a Tensor>,
    /// `[B, T]`; `None`: from the mask (`cumsum - 1`, pads 1) or `P..P+T` without one.
    pub position_ids: Option<&'a Tensor>,
}

impl<'a> Gpt2Input<'a> {
    /// Token ids only.
    pub fn new(input_ids: &'a Tensor) -> Self {
        Gpt2Input {
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

/// What a forward computes besides the last hidden state (see [`Gpt2Model::forward_with`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ForwardOptions {
    /// Compute the LM logits (skip them for a value or score head over a large vocabulary).
    pub logits: bool,
    /// Also return the hidden state that enters block `i` (`0`: the embeddings; `n_layer`:
    /// the last block's output before the final norm): where a hydra branch starts.
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

/// The result of a forward.
#[derive(Debug)]
pub struct Gpt2Output {
    /// `[B, T, vocab]`, in the model's dtype; `None` when not asked for.
    pub logits: Option<Tensor>,
    /// The final layer norm's output, `[B, T, n_embd]` (`transformers`' `hidden_states[-1]`).
    pub last_hidden: Tensor,
    /// The hidden state entering the requested block, `[B, T, n_embd]`.
    pub block_input: Option<Tensor>,
}

impl Gpt2Output {
    /// The logits, or an error if the forward skipped them.
    pub fn logits(self) -> Result<Tensor> {
        self.logits.ok_or_else(|| {
            Error::invalid(
                "Gpt2Output::logits",
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

/// GPT-2 with its tied LM head. See the [module docs](self).
pub struct Gpt2Model {
    config: Gpt2Config,
    wte: Tensor,
    wpe: Tensor,
    blocks: Vec<Block>,
    ln_f: LayerNorm,
}

impl fmt::Debug for Gpt2Model {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gpt2Model")
            .field("n_layer", &self.config.n_layer)
            .field("n_embd", &self.config.n_embd)
            .field("n_head", &self.config.n_head)
            .field("vocab_size", &self.config.vocab_size)
            .field("kind", &self.kind())
            .field("device", &self.device())
            .finish()
    }
}

impl Gpt2Model {
    /// A randomly initialised model (normal with `initializer_range` std, GPT-2's scaled
    /// residual projections, unit layer norms, zero biases: `transformers`' init) whose
    /// variables are created under `path` with `transformers`' names. Seed with
    /// `tch::manual_seed` for reproducible weights.
    pub fn new(path: &Path<'_>, config: &Gpt2Config) -> Result<Self> {
        config.validate()?;
        let t = path / "transformer";
        let std = config.initializer_range;
        let normal = Init::Randn {
            mean: 0.0,
            stdev: std,
        };
        let wte = (&t / "wte").f_var("weight", &[config.vocab_size, config.n_embd], normal)?;
        let wpe = (&t / "wpe").f_var("weight", &[config.n_positions, config.n_embd], normal)?;
        let blocks = (0..config.n_layer)
            .map(|i| Block::new(&(&t / "h" / i), config, i))
            .collect::<Result<Vec<_>>>()?;
        let ln_f = LayerNorm::new(&(&t / "ln_f"), config.n_embd, config.layer_norm_epsilon)?;
        Ok(Gpt2Model {
            config: config.clone(),
            wte,
            wpe,
            blocks,
            ln_f,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &Gpt2Config {
        &self.config
    }

    /// The parameters' device.
    pub fn device(&self) -> Device {
        self.wte.device()
    }

    /// The parameters' dtype.
    pub fn kind(&self) -> Kind {
        self.wte.kind()
    }

    /// The token embedding, `[vocab, n_embd]` (also the LM head's weight).
    pub fn wte(&self) -> &Tensor {
        &self.wte
    }

    /// The number of blocks.
    pub fn n_layer(&self) -> usize {
        self.blocks.len()
    }

    pub(crate) fn blocks(&self) -> &[Block] {
        &self.blocks
    }

    pub(crate) fn ln_f(&self) -> &LayerNorm {
        &self.ln_f
    }

    /// `(transformers name, parameter)` pairs, in `transformers`' order (`transformer.wte.weight`,
    /// `transformer.wpe.weight`, the blocks, `transformer.ln_f.*`). The LM head is the token
    /// embedding and is not listed twice.
    pub fn named_parameters(&self) -> Vec<(String, &Tensor)> {
        let mut out = vec![
            ("transformer.wte.weight".to_string(), &self.wte),
            ("transformer.wpe.weight".to_string(), &self.wpe),
        ];
        for (i, b) in self.blocks.iter().enumerate() {
            for (n, p) in b.named_parameters() {
                out.push((format!("transformer.h.{i}.{n}"), p));
            }
        }
        out.push(("transformer.ln_f.weight".to_string(), &self.ln_f.weight));
        out.push(("transformer.ln_f.bias".to_string(), &self.ln_f.bias));
        out
    }

    /// The parameters of the embeddings (token, position) and of blocks `0..n` (the lower
    /// trunk a hydra policy freezes).
    pub(crate) fn lower_trunk_parameters(&self, n: usize) -> Vec<&Tensor> {
        let mut out = vec![&self.wte, &self.wpe];
        for b in self.blocks.iter().take(n) {
            out.extend(b.named_parameters().into_iter().map(|(_, p)| p));
        }
        out
    }

    /// The number of parameters (the tied LM head counted once).
    pub fn num_parameters(&self) -> i64 {
        self.named_parameters()
            .iter()
            .map(|(_, p)| p.numel() as i64)
            .sum()
    }

    /// Logits for a hidden state `[.., n_embd]` through the tied LM head.
    pub fn lm_head(&self, hidden: &Tensor) -> Result<Tensor> {
        Ok(hidden.f_matmul(&self.wte.f_transpose(0, 1)?)?)
    }

    /// The forward from the hidden state entering block `start` (what
    /// [`ForwardOptions::capture_block_input`] returns for it): blocks `start..`, the final
    /// norm and the logits, without a cache. A hydra model's frozen trunk gives the same
    /// `hidden` at every update of a rollout, so its updates can start here (see
    /// [`CachedTrunk`](crate::objectives::llm::CachedTrunk)).
    ///
    /// ```
    /// use tch::nn::VarStore;
    /// use tch::{Kind, Tensor};
    /// use torchrl::modules::llm::{ForwardOptions, Gpt2Config, Gpt2Input, Gpt2Model};
    /// # fn main() -> torchrl::Result<()> {
    /// let cfg = Gpt2Config::new(20).with_n_layer(2).with_n_embd(8).with_n_head(2).with_n_positions(8);
    /// let vs = VarStore::new(tch::Device::Cpu);
    /// let model = Gpt2Model::new(&vs.root(), &cfg)?;
    /// let ids = Tensor::from_slice(&[0i64, 3, 4, 5]).view([1, 4]);
    /// let mask = Tensor::from_slice(&[0i64, 1, 1, 1]).view([1, 4]);
    /// let input = Gpt2Input::new(&ids).with_attention_mask(&mask);
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
    /// `start > n_layer`, a `hidden` that is not `[B, T, n_embd]`, or a mask that is not
    /// `[B, T]`.
    pub fn forward_from_block(
        &self,
        hidden: &Tensor,
        start: usize,
        attention_mask: Option<&Tensor>,
    ) -> Result<Gpt2Output> {
        const OP: &str = "Gpt2Model::forward_from_block";
        let n = self.blocks.len();
        if start > n {
            return Err(Error::value(
                OP,
                "start",
                format!("a block index of at most n_layer = {n}"),
                start.to_string(),
            ));
        }
        let size = hidden.size();
        let fits = size.len() == 3 && size.get(2) == Some(&self.config.n_embd);
        if !fits {
            return Err(Error::value(
                OP,
                "hidden",
                format!("[B, T, n_embd = {}]", self.config.n_embd),
                ShapeFmt(&size).to_string(),
            ));
        }
        let bt = size.get(..2).unwrap_or(&[]);
        if let Some(m) = attention_mask {
            if m.size() != bt {
                return Err(Error::value(
                    OP,
                    "attention_mask",
                    format!("the hidden state's [B, T] = {}", ShapeFmt(bt)),
                    ShapeFmt(&m.size()).to_string(),
                ));
            }
        }
        let blocks = self.blocks.get(start..).unwrap_or(&[]);
        let last_hidden = run_blocks(blocks, &self.ln_f, hidden, attention_mask)?;
        let logits = self.lm_head(&last_hidden)?;
        Ok(Gpt2Output {
            logits: Some(logits),
            last_hidden,
            block_input: None,
        })
    }

    /// [`Gpt2Model::forward_with`] with the default options (logits on, no captured block).
    pub fn forward(
        &self,
        input: &Gpt2Input<'_>,
        cache: Option<&mut KvCache>,
    ) -> Result<Gpt2Output> {
        self.forward_with(input, cache, ForwardOptions::default())
    }

    /// The forward pass. Checks the ids (int64 `[B, T]`, inside the vocabulary), the mask
    /// (`[B, P + T]`), the position ids (`[B, T]`, inside the context) and the cache (one made
    /// for this model, holding `B` rows) before computing.
    pub fn forward_with(
        &self,
        input: &Gpt2Input<'_>,
        cache: Option<&mut KvCache>,
        options: ForwardOptions,
    ) -> Result<Gpt2Output> {
        self.check_input(input, cache.as_deref())?;
        self.forward_unchecked(input, cache, options)
    }

    fn check_input(&self, input: &Gpt2Input<'_>, cache: Option<&KvCache>) -> Result<()> {
        let op = "Gpt2Model::forward";
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
            if lo < 0 || hi >= self.config.vocab_size {
                let bad = if lo < 0 { lo } else { hi };
                return Err(Error::value(
                    op,
                    "input_ids",
                    format!("token ids in [0, {})", self.config.vocab_size),
                    format!("id {bad}"),
                ));
            }
        }
        let past = match cache {
            Some(c) => {
                if c.n_layer() != self.blocks.len() {
                    return Err(Error::value(
                        op,
                        "cache",
                        format!("a KvCache for {} layers", self.blocks.len()),
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
        if past + t > self.config.n_positions {
            return Err(Error::value(
                op,
                "input_ids",
                format!(
                    "at most n_positions = {} tokens including the cache",
                    self.config.n_positions
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
                if lo < 0 || hi >= self.config.n_positions {
                    return Err(Error::value(
                        op,
                        "position_ids",
                        format!("positions in [0, {})", self.config.n_positions),
                        format!("[{lo}, {hi}]"),
                    ));
                }
            }
        }
        Ok(())
    }

    /// The blocked-attention mask for `t` new queries over `past + t` keys.
    pub(crate) fn blocked(
        mask: Option<&Tensor>,
        past: i64,
        t: i64,
        device: Device,
    ) -> Result<Blocked> {
        let s = past + t;
        // One new query with no padding may attend every key: no mask at all.
        if mask.is_none() && t == 1 {
            return Ok(None);
        }
        let opts = (Kind::Int64, device);
        let keys = Tensor::f_arange(s, opts)?.f_view([1, s])?;
        let queries = Tensor::f_arange_start(past, s, opts)?.f_view([t, 1])?;
        let mut blocked = keys.f_gt_tensor(&queries)?.f_view([1, 1, t, s])?; // future keys
        if let Some(m) = mask {
            let pad = m.f_eq(0)?.f_view([-1, 1, 1, s])?;
            blocked = blocked.f_logical_or(&pad)?;
        }
        Ok(Some(blocked))
    }

    /// Position ids for `input` with `past` cached tokens.
    fn positions(&self, input: &Gpt2Input<'_>, past: i64, t: i64) -> Result<Tensor> {
        if let Some(p) = input.position_ids {
            return Ok(p.f_to_kind(Kind::Int64)?);
        }
        match input.attention_mask {
            Some(m) => Ok(position_ids_from_mask(m)?.f_narrow(1, past, t)?),
            None => Ok(
                Tensor::f_arange_start(past, past + t, (Kind::Int64, self.device()))?
                    .f_view([1, t])?,
            ),
        }
    }

    /// The forward without input checks: for callers that built the inputs themselves
    /// (generation, heads).
    pub(crate) fn forward_unchecked(
        &self,
        input: &Gpt2Input<'_>,
        mut cache: Option<&mut KvCache>,
        options: ForwardOptions,
    ) -> Result<Gpt2Output> {
        let t = input.input_ids.size().get(1).copied().unwrap_or(0);
        let past = cache.as_ref().map_or(0, |c| c.len());
        let pos = self.positions(input, past, t)?;
        let emb = Tensor::f_embedding(&self.wte, input.input_ids, -1, false, false)?;
        let mut x = emb.f_add(&Tensor::f_embedding(&self.wpe, &pos, -1, false, false)?)?;
        let blocked = Self::blocked(input.attention_mask, past, t, self.device())?;
        let mut block_input = None;
        for (i, block) in self.blocks.iter().enumerate() {
            if options.capture_block_input == Some(i) {
                block_input = Some(x.shallow_clone());
            }
            let slot = match cache.as_deref_mut() {
                Some(c) => Some(c.slot(i)?),
                None => None,
            };
            x = block.forward(&x, &blocked, slot)?;
        }
        if options.capture_block_input == Some(self.blocks.len()) {
            block_input = Some(x.shallow_clone());
        }
        if let Some(c) = cache {
            c.advance(t, input.input_ids.size().first().copied().unwrap_or(0));
        }
        let last_hidden = self.ln_f.forward(&x)?;
        let logits = if options.logits {
            Some(self.lm_head(&last_hidden)?)
        } else {
            None
        };
        Ok(Gpt2Output {
            logits,
            last_hidden,
            block_input,
        })
    }
}

/// Runs `blocks` then `ln_f` on a hidden state: the upper trunk of a hydra branch.
pub(crate) fn run_blocks(
    blocks: &[Block],
    ln_f: &LayerNorm,
    hidden: &Tensor,
    attention_mask: Option<&Tensor>,
) -> Result<Tensor> {
    let t = hidden.size().get(1).copied().unwrap_or(0);
    let blocked = Gpt2Model::blocked(attention_mask, 0, t, hidden.device())?;
    let mut x = hidden.shallow_clone();
    for b in blocks {
        x = b.forward(&x, &blocked, None)?;
    }
    ln_f.forward(&x)
}

/// A copy of a layer norm under `p` (for a hydra branch).
pub(crate) fn copy_layer_norm(ln: &LayerNorm, p: &Path<'_>) -> Result<LayerNorm> {
    ln.copy_to(p)
}

/// A new variable under `p` holding a copy of `src`.
pub(crate) fn copy_tensor(p: &Path<'_>, name: &str, src: &Tensor) -> Result<Tensor> {
    copy_var(p, name, src)
}
