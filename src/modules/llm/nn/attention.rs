//! [`Attention`]: causal self-attention over `n_head` query heads and `n_kv_head` key-value
//! heads (grouped-query when fewer, multi-query with one), with
//! - the q/k/v projections fused (GPT-2's `c_attn`) or separate (`q_proj`, `k_proj`, `v_proj`,
//!   with or without biases);
//! - optional per-head RMS norms on q and k (Qwen3's `q_norm` / `k_norm`), then rotary
//!   embeddings when the block is given a table;
//! - one [`KvCache`](super::KvCache) layer slot: this step's keys and values are appended and
//!   attended over (the cache holds the `n_kv_head` heads, not the repeated ones);
//! - masked scores set to the dtype's lowest finite value, as `transformers` does.
//!
//! # Shapes
//! `x` `[B, T, hidden]` → `[B, T, hidden]`; the blocked mask ([`attention_mask`]) `[B, 1, T,
//! P + T]`.
//!
//! ```
//! use tch::Tensor;
//! use torchrl::modules::llm::nn::attention_mask;
//! # fn main() -> torchrl::Result<()> {
//! // 2 cached keys, 1 new query, the first key is padding: only it is blocked
//! let mask = Tensor::from_slice(&[0i64, 1, 1]).view([1, 3]);
//! let blocked = attention_mask(Some(&mask), 2, 1, tch::Device::Cpu)?.unwrap();
//! assert_eq!(Vec::<bool>::try_from(blocked.view([-1]))?, vec![true, false, false]);
//! // without padding a single new query attends every key: no mask at all
//! assert!(attention_mask(None, 5, 1, tch::Device::Cpu)?.is_none());
//! # Ok(()) }
//! ```

use tch::nn::Path;
use tch::{Device, Kind, Tensor};

use super::linear::Linear;
use super::mask_value;
use super::norm::RmsNorm;
use super::rotary::RotaryEmbedding;
use crate::error::{Error, Result};

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

/// The blocked-attention mask for `t` new queries over `past + t` keys: `true` where a query
/// may **not** attend a key (a future key, or a key whose `mask` is 0), `[B, 1, t, past + t]`
/// (batch 1 without a mask); `None` when every query may attend every earlier key.
pub fn attention_mask(
    mask: Option<&Tensor>,
    past: i64,
    t: i64,
    device: Device,
) -> Result<Option<Tensor>> {
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

/// What every block of one forward shares: the blocked-attention mask and, for rotary models,
/// the `cos` / `sin` table of this forward's positions.
#[derive(Debug)]
pub struct BlockContext {
    /// `true` where a query may not attend a key, `[B, 1, T, P + T]`; `None`: no mask.
    pub blocked: Option<Tensor>,
    /// `cos`, `sin` `[B, 1, T, head_dim]`.
    pub rope: Option<(Tensor, Tensor)>,
}

/// The q/k/v projections.
#[derive(Debug)]
pub enum QkvProjection {
    /// One `[hidden, 3·hidden]` projection (GPT-2's `c_attn`); needs `n_kv_head == n_head`.
    Fused(Linear),
    /// Three projections (Llama's `q_proj`, `k_proj`, `v_proj`).
    Separate {
        /// `hidden → n_head · head_dim`.
        q: Linear,
        /// `hidden → n_kv_head · head_dim`.
        k: Linear,
        /// `hidden → n_kv_head · head_dim`.
        v: Linear,
    },
}

/// The head layout of an [`Attention`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionShape {
    /// Query heads.
    pub n_head: i64,
    /// Key-value heads (a divisor of `n_head`).
    pub n_kv_head: i64,
    /// The width of one head.
    pub head_dim: i64,
    /// What the scores `q·kᵀ` are divided by (`sqrt(head_dim)`, times GPT-2's layer-index
    /// factor when it is on; 1 when GPT-2's `scale_attn_weights` is off).
    pub score_divisor: f64,
}

/// Causal self-attention. See the [module docs](self).
#[derive(Debug)]
pub struct Attention {
    qkv: QkvProjection,
    o_proj: Linear,
    shape: AttentionShape,
    q_norm: Option<RmsNorm>,
    k_norm: Option<RmsNorm>,
}

impl Attention {
    /// From its projections and head layout.
    ///
    /// # Errors
    /// Head counts that do not divide, or projections whose widths do not fit them.
    pub fn new(qkv: QkvProjection, o_proj: Linear, shape: AttentionShape) -> Result<Self> {
        let op = "Attention::new";
        let AttentionShape {
            n_head,
            n_kv_head,
            head_dim,
            ..
        } = shape;
        if n_head <= 0 || n_kv_head <= 0 || head_dim <= 0 || n_head % n_kv_head != 0 {
            return Err(Error::config(
                op,
                "num_key_value_heads",
                format!("a positive divisor of num_attention_heads = {n_head} (head_dim > 0)"),
                format!("{n_kv_head} (head_dim {head_dim})"),
            ));
        }
        let (q_out, kv_out) = (n_head * head_dim, n_kv_head * head_dim);
        let fits = match &qkv {
            QkvProjection::Fused(l) => n_kv_head == n_head && l.out_features() == 3 * q_out,
            QkvProjection::Separate { q, k, v } => {
                q.out_features() == q_out
                    && k.out_features() == kv_out
                    && v.out_features() == kv_out
            }
        };
        if !fits || o_proj.in_features() != q_out {
            return Err(Error::config(
                op,
                "projections",
                format!("q: {q_out} outputs, k / v: {kv_out} each, o: {q_out} inputs"),
                format!("{qkv:?}, {o_proj:?}"),
            ));
        }
        Ok(Attention {
            qkv,
            o_proj,
            shape,
            q_norm: None,
            k_norm: None,
        })
    }

    /// Adds per-head RMS norms on the queries and keys (Qwen3), each over `head_dim`.
    pub fn with_qk_norm(mut self, q_norm: RmsNorm, k_norm: RmsNorm) -> Self {
        self.q_norm = Some(q_norm);
        self.k_norm = Some(k_norm);
        self
    }

    /// The head layout.
    pub fn shape(&self) -> AttentionShape {
        self.shape
    }

    /// The projections (q/k/v or the fused one, then o), in `transformers`' order.
    pub fn linears(&self) -> Vec<&Linear> {
        let mut out = match &self.qkv {
            QkvProjection::Fused(l) => vec![l],
            QkvProjection::Separate { q, k, v } => vec![q, k, v],
        };
        out.push(&self.o_proj);
        out
    }

    /// The projections, mutably (to attach adapters), in the order of [`Attention::linears`].
    pub fn linears_mut(&mut self) -> Vec<&mut Linear> {
        let mut out = match &mut self.qkv {
            QkvProjection::Fused(l) => vec![l],
            QkvProjection::Separate { q, k, v } => vec![q, k, v],
        };
        out.push(&mut self.o_proj);
        out
    }

    /// The parameters by name, in `transformers`' order.
    pub fn named_parameters(&self) -> Vec<(String, &Tensor)> {
        let mut out = match &self.qkv {
            QkvProjection::Fused(l) => l.named_parameters(),
            QkvProjection::Separate { q, k, v } => [q, k, v]
                .into_iter()
                .flat_map(Linear::named_parameters)
                .collect(),
        };
        out.extend(self.o_proj.named_parameters());
        for n in [&self.q_norm, &self.k_norm].into_iter().flatten() {
            out.extend(n.named_parameters());
        }
        out
    }

    /// The same attention sharing its tensors.
    pub(crate) fn shallow(&self) -> Self {
        let qkv = match &self.qkv {
            QkvProjection::Fused(l) => QkvProjection::Fused(l.shallow()),
            QkvProjection::Separate { q, k, v } => QkvProjection::Separate {
                q: q.shallow(),
                k: k.shallow(),
                v: v.shallow(),
            },
        };
        Attention {
            qkv,
            o_proj: self.o_proj.shallow(),
            shape: self.shape,
            q_norm: self.q_norm.as_ref().map(RmsNorm::shallow),
            k_norm: self.k_norm.as_ref().map(RmsNorm::shallow),
        }
    }

    /// A copy under `path`.
    pub fn copy_to(&self, path: &Path<'_>) -> Result<Self> {
        let qkv = match &self.qkv {
            QkvProjection::Fused(l) => QkvProjection::Fused(l.copy_to(path)?),
            QkvProjection::Separate { q, k, v } => QkvProjection::Separate {
                q: q.copy_to(path)?,
                k: k.copy_to(path)?,
                v: v.copy_to(path)?,
            },
        };
        let copy_norm = |n: &Option<RmsNorm>| n.as_ref().map(|n| n.copy_to(path)).transpose();
        Ok(Attention {
            qkv,
            o_proj: self.o_proj.copy_to(path)?,
            shape: self.shape,
            q_norm: copy_norm(&self.q_norm)?,
            k_norm: copy_norm(&self.k_norm)?,
        })
    }

    /// `[B, H, T, D]` queries, keys and values (keys and values with `n_kv_head` heads).
    fn project(&self, x: &Tensor, b: i64, t: i64) -> Result<(Tensor, Tensor, Tensor)> {
        let AttentionShape {
            n_head: h,
            n_kv_head: kv,
            head_dim: d,
            ..
        } = self.shape;
        match &self.qkv {
            QkvProjection::Fused(l) => {
                // [B, T, 3HD] -> [3, B, H, T, D]: one view and one permute for the three
                let qkv = l
                    .forward(x)?
                    .f_view([b, t, 3, h, d])?
                    .f_permute([2, 0, 3, 1, 4])?;
                Ok((
                    qkv.f_select(0, 0)?,
                    qkv.f_select(0, 1)?,
                    qkv.f_select(0, 2)?,
                ))
            }
            QkvProjection::Separate { q, k, v } => {
                let heads = |l: &Linear, n: i64| -> Result<Tensor> {
                    Ok(l.forward(x)?.f_view([b, t, n, d])?.f_transpose(1, 2)?)
                };
                Ok((heads(q, h)?, heads(k, kv)?, heads(v, kv)?))
            }
        }
    }

    /// Runs the attention on `x` `[B, T, hidden]`; with a cache slot, appends this step's keys
    /// and values to it and attends over all of them.
    pub fn forward(
        &self,
        x: &Tensor,
        ctx: &BlockContext,
        slot: Option<&mut Option<(Tensor, Tensor)>>,
    ) -> Result<Tensor> {
        let (b, t, _) = x.size3()?;
        let (mut q, mut k, mut v) = self.project(x, b, t)?;
        if let Some(n) = &self.q_norm {
            q = n.forward(&q)?;
        }
        if let Some(n) = &self.k_norm {
            k = n.forward(&k)?;
        }
        if let Some((cos, sin)) = &ctx.rope {
            q = RotaryEmbedding::apply(&q, cos, sin)?;
            k = RotaryEmbedding::apply(&k, cos, sin)?;
        }
        if let Some(slot) = slot {
            if let Some((pk, pv)) = slot.take() {
                k = Tensor::f_cat(&[&pk, &k], 2)?;
                v = Tensor::f_cat(&[&pv, &v], 2)?;
            }
            *slot = Some((k.shallow_clone(), v.shallow_clone()));
        }
        let AttentionShape {
            n_head: h,
            n_kv_head: kv,
            head_dim: d,
            score_divisor,
        } = self.shape;
        if kv != h {
            // each key-value head serves n_head / n_kv_head query heads
            let s = k.size().get(2).copied().unwrap_or(0);
            let repeat = |x: &Tensor| -> Result<Tensor> {
                Ok(x.f_unsqueeze(2)?
                    .f_expand([b, kv, h / kv, s, d], false)?
                    .f_reshape([b, h, s, d])?)
            };
            k = repeat(&k)?;
            v = repeat(&v)?;
        }
        let mut scores = q.f_matmul(&k.f_transpose(-1, -2)?)?;
        if score_divisor != 1.0 {
            scores = scores.f_div_scalar(score_divisor)?;
        }
        if let Some(blocked) = &ctx.blocked {
            scores = scores.f_masked_fill(blocked, mask_value(scores.kind()))?;
        }
        let probs = attention_softmax(&scores)?;
        let attn = probs
            .f_matmul(&v)?
            .f_transpose(1, 2)?
            .f_reshape([b, t, h * d])?;
        self.o_proj.forward(&attn)
    }
}
