//! The kernel floor of the GPT-2 workloads: GPT-2's forward written as bare `tch` ops on the
//! model's own parameter tensors (no tensordict, no modules, no input checks, no `Result`
//! plumbing), so that a bench can time the same math issued from a plain loop beside ours.
//!
//! The ops are the ones our layer kit issues (one `addmm` per `Conv1D`, q/k/v from one
//! projection, `matmul` attention with the mask value, the softmax padded to 16 keys below 16
//! keys, tanh GELU, the tied LM head as `matmul` with the embedding transposed), so the floor
//! is what our code would cost with every non-kernel cost removed. Each bench that uses it
//! checks once that the bare loop and ours give the same outputs (same tokens for the same
//! uniforms; logits / losses to float rounding) before timing anything.
//!
//! Also here, for the floors built on this one (`bare_ilql.rs`, `bare_rlhf.rs`, `bare_ppo.rs`):
//! reading a block's parameters by name ([`BareBlock::from_vars`], [`param`], [`pair`]),
//! trlX's `MlpHead` ([`BareHead`]: the ILQL heads, the hydra's value head) and
//! [`gather_rows`].

#![allow(dead_code)] // each bench uses some of these

use std::collections::HashMap;

use tch::{Kind, Tensor};
use torchrl::modules::llm::{CausalLm, MlpHead};

/// The mask value of float32 scores (`transformers`' `finfo.min`).
pub const MASK: f64 = f32::MIN as f64;

/// The mask value of `kind`'s scores: its lowest finite value (as our attention uses).
pub fn mask_value(kind: Kind) -> f64 {
    match kind {
        Kind::Half => -65504.0,
        Kind::BFloat16 => -3.3895313892515355e38,
        _ => MASK,
    }
}
/// Below this many keys the CPU softmax is padded to it (as `nn/attention.rs` does).
const SOFTMAX_MIN_KEYS: i64 = 16;

/// `(weight, bias)` of a layer norm or a `Conv1D` (`[in, out]` weight).
pub type Pair = (Tensor, Tensor);

/// One GPT-2 block's parameters.
pub struct BareBlock {
    pub ln_1: Pair,
    pub c_attn: Pair,
    pub attn_proj: Pair,
    pub ln_2: Pair,
    pub c_fc: Pair,
    pub mlp_proj: Pair,
}

impl BareBlock {
    /// The block named `prefix` in `vars` (`{prefix}.ln_1.weight`, `{prefix}.attn.c_attn.bias`,
    /// … by `transformers`' names; `prefix` is `transformer.h.{i}` in a model, `h.{i}` in a
    /// hydra's reference branch).
    ///
    /// # Panics
    /// When a parameter is missing.
    pub fn from_vars(vars: &HashMap<String, Tensor>, prefix: &str) -> Self {
        let at = |name: &str| pair(vars, &format!("{prefix}.{name}"));
        BareBlock {
            ln_1: at("ln_1"),
            c_attn: at("attn.c_attn"),
            attn_proj: at("attn.c_proj"),
            ln_2: at("ln_2"),
            c_fc: at("mlp.c_fc"),
            mlp_proj: at("mlp.c_proj"),
        }
    }
}

/// `vars[name]`, shared (a shallow clone).
///
/// # Panics
/// When `vars` has no `name` (bench code: the model is built right there); the message lists
/// the names it has.
pub fn param(vars: &HashMap<String, Tensor>, name: &str) -> Tensor {
    vars.get(name)
        .unwrap_or_else(|| {
            let mut names: Vec<&String> = vars.keys().collect();
            names.sort();
            panic!("no parameter {name} in {names:?}")
        })
        .shallow_clone()
}

/// `(vars[prefix.weight], vars[prefix.bias])`, shared: a layer norm or a `Conv1D`.
///
/// # Panics
/// When either is missing.
pub fn pair(vars: &HashMap<String, Tensor>, prefix: &str) -> Pair {
    (
        param(vars, &format!("{prefix}.weight")),
        param(vars, &format!("{prefix}.bias")),
    )
}

/// GPT-2's parameters, shared (shallow clones) with the model they were taken from, so that
/// gradients and optimizer steps reach the same tensors.
pub struct BareGpt2 {
    pub wte: Tensor,
    pub wpe: Tensor,
    pub blocks: Vec<BareBlock>,
    pub ln_f: Pair,
    pub n_head: i64,
    pub eps: f64,
}

/// One layer's cached keys and values `[B, H, S, D]`.
pub type Slot = Option<(Tensor, Tensor)>;

impl BareGpt2 {
    /// The parameters of `model` (a GPT-2 [`CausalLm`], by `transformers`' names).
    ///
    /// # Panics
    /// When a GPT-2 parameter is missing (bench code: the model is built right there).
    pub fn from_model(model: &dyn CausalLm, n_head: i64) -> Self {
        let vars: HashMap<String, Tensor> = model
            .named_parameters()
            .into_iter()
            .map(|(n, t)| (n, t.shallow_clone()))
            .collect();
        let n_layer = (0..)
            .take_while(|i| vars.contains_key(&format!("transformer.h.{i}.ln_1.weight")))
            .count();
        BareGpt2 {
            wte: param(&vars, "transformer.wte.weight"),
            wpe: param(&vars, "transformer.wpe.weight"),
            blocks: (0..n_layer)
                .map(|i| BareBlock::from_vars(&vars, &format!("transformer.h.{i}")))
                .collect(),
            ln_f: pair(&vars, "transformer.ln_f"),
            n_head,
            eps: 1e-5,
        }
    }

    /// Empty cache slots, one per block.
    pub fn new_cache(&self) -> Vec<Slot> {
        self.blocks.iter().map(|_| None).collect()
    }

    /// The token + position embeddings of `ids` `[B, T]` at `positions` `[B, T]`.
    pub fn embed(&self, ids: &Tensor, positions: &Tensor) -> Tensor {
        Tensor::embedding(&self.wte, ids, -1, false, false)
            + Tensor::embedding(&self.wpe, positions, -1, false, false)
    }

    /// Blocks `range` over `x` `[B, T, E]` (no final norm); with `cache`, the blocks' slots
    /// are appended to. `blocked`: `[B, 1, T, S]` bool, `true` = may not attend.
    pub fn blocks_forward(
        &self,
        mut x: Tensor,
        range: std::ops::Range<usize>,
        mut cache: Option<&mut [Slot]>,
        blocked: Option<&Tensor>,
    ) -> Tensor {
        for i in range {
            let slot = cache.as_deref_mut().and_then(|c| c.get_mut(i));
            x = self.block(i, x, slot, blocked);
        }
        x
    }

    /// Every block, then the final norm: the last hidden state `[B, T, E]`.
    pub fn hidden(
        &self,
        ids: &Tensor,
        positions: &Tensor,
        cache: Option<&mut [Slot]>,
        blocked: Option<&Tensor>,
    ) -> Tensor {
        let x = self.embed(ids, positions);
        let x = self.blocks_forward(x, 0..self.blocks.len(), cache, blocked);
        self.final_norm(&x)
    }

    /// The final layer norm.
    pub fn final_norm(&self, x: &Tensor) -> Tensor {
        layer_norm(x, &self.ln_f, self.eps)
    }

    /// The tied LM head: `h · wteᵀ`.
    pub fn logits(&self, h: &Tensor) -> Tensor {
        h.matmul(&self.wte.tr())
    }

    /// Block `i` on `x` `[B, T, E]`.
    pub fn block(
        &self,
        i: usize,
        x: Tensor,
        slot: Option<&mut Slot>,
        blocked: Option<&Tensor>,
    ) -> Tensor {
        let blk = &self.blocks[i];
        let (b, t, e) = x.size3().expect("[B, T, E]");
        let h = self.n_head;
        let d = e / h;
        let qkv = conv1d(&layer_norm(&x, &blk.ln_1, self.eps), &blk.c_attn)
            .view([b, t, 3, h, d])
            .permute([2, 0, 3, 1, 4]);
        let q = qkv.select(0, 0);
        let mut k = qkv.select(0, 1);
        let mut v = qkv.select(0, 2);
        if let Some(slot) = slot {
            if let Some((pk, pv)) = slot.take() {
                k = Tensor::cat(&[&pk, &k], 2);
                v = Tensor::cat(&[&pv, &v], 2);
            }
            *slot = Some((k.shallow_clone(), v.shallow_clone()));
        }
        let mut scores = q.matmul(&k.transpose(-1, -2)) / (d as f64).sqrt();
        if let Some(blocked) = blocked {
            scores = scores.masked_fill(blocked, mask_value(scores.kind()));
        }
        let attn = softmax_keys(&scores)
            .matmul(&v)
            .transpose(1, 2)
            .reshape([b, t, e]);
        let x = x + conv1d(&attn, &blk.attn_proj);
        let m = conv1d(&layer_norm(&x, &blk.ln_2, self.eps), &blk.c_fc).gelu("tanh");
        &x + conv1d(&m, &blk.mlp_proj)
    }

    /// Samples `steps` tokens after the unpadded prompt `[B, P]` with the uniforms `u`
    /// `[steps, B]` (float64), from the full distribution at temperature 1, no EOS: the
    /// tokens `[B, steps]` and their log-probs (the logits taken in float32, as ours). Our
    /// `generate`'s math for `GenerationConfig::rlhf_sampling` on an unpadded prompt, bare.
    pub fn generate(&self, prompt: &Tensor, steps: i64, u: &Tensor) -> (Tensor, Tensor) {
        let _guard = tch::no_grad_guard();
        let (b, p) = prompt.size2().expect("[B, P]");
        let mut cache = self.new_cache();
        let positions = Tensor::arange(p, (Kind::Int64, prompt.device())).expand([b, p], false);
        let causal = causal_blocked(p, prompt.device());
        let h = self.hidden(prompt, &positions, Some(&mut cache), Some(&causal));
        let mut logits = self.logits(&h.select(1, p - 1)).to_kind(Kind::Float);
        let mut tokens = Vec::with_capacity(steps as usize);
        let mut log_probs = Vec::with_capacity(steps as usize);
        for step in 0..steps {
            let logp = logits.log_softmax(-1, None::<Kind>);
            let next = sample_rows(&logits, &u.select(0, step));
            log_probs.push(logp.gather(-1, &next.unsqueeze(-1), false).squeeze_dim(-1));
            tokens.push(next.shallow_clone());
            if step + 1 == steps {
                break;
            }
            let pos = Tensor::full([b, 1], p + step, (Kind::Int64, prompt.device()));
            let h = self.hidden(&next.unsqueeze(1), &pos, Some(&mut cache), None);
            logits = self.logits(&h.select(1, 0)).to_kind(Kind::Float);
        }
        (Tensor::stack(&tokens, 1), Tensor::stack(&log_probs, 1))
    }
}

/// `x` through a `Conv1D` `(weight [in, out], bias)`: one `addmm` over the flattened rows.
pub fn conv1d(x: &Tensor, (w, b): &Pair) -> Tensor {
    let mut shape = x.size();
    let n_in = *shape.last().expect("a feature dim");
    *shape.last_mut().expect("a feature dim") = w.size()[1];
    b.addmm(&x.reshape([-1, n_in]), w).view(shape.as_slice())
}

/// A layer norm over the last dim.
pub fn layer_norm(x: &Tensor, (w, b): &Pair, eps: f64) -> Tensor {
    let dim = *x.size().last().expect("a feature dim");
    x.layer_norm([dim], Some(w), Some(b), eps, true)
}

/// The causal mask of `t` queries over `t` keys, `[1, 1, t, t]`, `true` above the diagonal.
pub fn causal_blocked(t: i64, device: tch::Device) -> Tensor {
    Tensor::ones([t, t], (Kind::Bool, device))
        .triu(1)
        .view([1, 1, t, t])
}

/// The causal mask with left / right padding: `[B, 1, T, T]`, `true` where query `i` may not
/// attend key `j` (a future key or a padded one).
pub fn padded_blocked(mask: &Tensor) -> Tensor {
    let (b, t) = mask.size2().expect("[B, T]");
    let pad = mask.eq(0).view([b, 1, 1, t]);
    causal_blocked(t, mask.device()).logical_or(&pad)
}

/// Position ids from a mask: `cumsum - 1`, 1 on pads (`transformers`' `generate`).
pub fn positions_from_mask(mask: &Tensor) -> Tensor {
    (mask.cumsum(-1, Kind::Int64) - 1).masked_fill(&mask.eq(0), 1)
}

/// The attention softmax, padded to 16 keys below 16 keys (libtorch's CPU softmax is ~10×
/// slower along a last dim shorter than 16).
pub fn softmax_keys(scores: &Tensor) -> Tensor {
    let keys = *scores.size().last().expect("keys");
    if keys >= SOFTMAX_MIN_KEYS {
        return scores.softmax(-1, None::<Kind>);
    }
    scores
        .pad(
            [0, SOFTMAX_MIN_KEYS - keys],
            "constant",
            mask_value(scores.kind()),
        )
        .softmax(-1, None::<Kind>)
        .narrow(-1, 0, keys)
}

/// One draw per row from `softmax(scores)` by inverting the CDF at `u` `[B]` (our sampler's
/// math: cumulative sum in float64, `searchsorted` on the right).
pub fn sample_rows(scores: &Tensor, u: &Tensor) -> Tensor {
    let cdf = scores.softmax(-1, None::<Kind>).cumsum(-1, Kind::Double);
    let vocab = *cdf.size().last().expect("vocab");
    let target = u.unsqueeze(-1) * cdf.narrow(-1, vocab - 1, 1);
    target
        .searchsorted(&cdf, false, true, "right", None::<Tensor>)
        .clamp_max(vocab - 1)
        .squeeze_dim(-1)
}

/// `hs` `[B, T, H]` at `ixs` `[B, N]` → `[B, N, H]` (`batched_index_select`).
pub fn gather_rows(hs: &Tensor, ixs: &Tensor) -> Tensor {
    let h = *hs.size().last().expect("[B, T, H]");
    hs.gather(1, &ixs.unsqueeze(-1).expand([-1, -1, h], false), false)
}

/// trlX's head on the trunk, an `MlpHead` (`Linear(h, 2h) → ReLU → Linear(2h, out)`, `[out,
/// in]` weights): the ILQL heads, the hydra's value head; its parameters shared with the head.
pub struct BareHead {
    pub w1: Tensor,
    pub b1: Tensor,
    pub w2: Tensor,
    pub b2: Tensor,
}

impl BareHead {
    /// The parameters of `head` (shallow clones).
    pub fn from_head(head: &MlpHead) -> Self {
        let [w1, b1, w2, b2] = head.parameters().map(Tensor::shallow_clone);
        BareHead { w1, b1, w2, b2 }
    }

    /// The hidden layer, `relu(x·w1ᵀ + b1)`.
    pub fn hidden(&self, x: &Tensor) -> Tensor {
        x.linear(&self.w1, Some(&self.b1)).relu()
    }

    /// `[.., n_embd]` → `[.., out]`.
    pub fn forward(&self, x: &Tensor) -> Tensor {
        self.hidden(x).linear(&self.w2, Some(&self.b2))
    }

    /// Output `idx` of each row only: `x` `[.., n_embd]`, `idx` `[..]` (int64) → `[..]` (the
    /// rows of the output layer gathered, not the full output).
    pub fn forward_at(&self, x: &Tensor, idx: &Tensor) -> Tensor {
        let w = Tensor::embedding(&self.w2, idx, -1, false, false);
        let b = Tensor::embedding(&self.b2.unsqueeze(-1), idx, -1, false, false).squeeze_dim(-1);
        (self.hidden(x) * w).sum_dim_intlist(-1, false, Kind::Float) + b
    }
}
