//! The heads trlX puts on a GPT trunk, each a [`TensorDictModule`] reading TorchRL's LLM
//! layout ([`LlmKeys`]):
//!
//! - [`MlpHead`]: trlX's `make_head(h, out)` (`Linear(h, 2h) → ReLU → Linear(2h, out)`,
//!   PyTorch's default init);
//! - [`CausalLmWithValueHead`] (trlX's `GPTHeadWithValueModel`): logits and one value per
//!   position from the same trunk pass;
//! - [`CausalLmWithHydraValueHead`] (trlX's `GPTHydraHeadWithValueModel(num_layers_unfrozen)`):
//!   the same plus the reference logits. With `k = num_layers_unfrozen > 0` the reference is a
//!   frozen [`ModelBranch`] (copies of the top `k` blocks and the final norm; its LM head is
//!   the policy's frozen token embedding) that starts from the policy's hidden state entering
//!   block `L − k`; the policy's lower trunk and embeddings are frozen, so the branch plus the
//!   shared trunk *is* the reference model, at about `k / L` of the blocks' parameter memory. With `k ≤ 0` the reference is a full
//!   frozen copy (`k = 0` freezes every block of the policy too, `k = -1` trains everything),
//!   as in trlX. The branch is frozen as a whole (trlX PR #140's bug is not repeated);
//! - [`IlqlHeads`] / [`CausalLmWithIlqlHeads`] (trlX's `CausalLMWithValueHeads`): V, Q1, Q2
//!   and frozen target-Q heads with Polyak sync, gathered at `states_ixs` / `actions_ixs`;
//! - [`Gpt2ScoreModel`] (`transformers`' `GPT2ForSequenceClassification` with one label, the
//!   weights load by its names): a scalar read at the last real token, the score network of
//!   [`RewardModelLoss`](crate::objectives::RewardModelLoss).
//!
//! **Log-probs** written under [`LlmKeys::log_probs`] follow TorchRL's layout: aligned with the
//! tokens, `log_probs[t] = log p(token[t] | tokens < t)`, 0 at `t = 0` and where the token or
//! the one before it is padding (trlX's `logprobs[i]` is this `log_probs[i + 1]`).
//!
//! ```
//! use tch::{nn::VarStore, Device, Tensor};
//! use torchrl::modules::llm::{CausalLmWithHydraValueHead, Gpt2Config, Gpt2Input};
//! # fn main() -> torchrl::Result<()> {
//! let vs = VarStore::new(Device::Cpu);
//! let cfg = Gpt2Config::new(40).with_n_layer(4).with_n_embd(16).with_n_head(2).with_n_positions(16);
//! let policy = CausalLmWithHydraValueHead::new(&vs.root(), &cfg, 1)?; // hydra, 1 unfrozen block
//! let ids = Tensor::from_slice(&[1i64, 2, 3, 4]).view([1, 4]);
//! let out = policy.forward(&Gpt2Input::new(&ids))?;
//! assert_eq!(out.values.size(), vec![1, 4]);
//! // at construction the reference equals the policy exactly
//! assert!(out.logits.equal(&out.ref_logits));
//! // and it holds a quarter of the blocks
//! assert!(policy.reference_parameter_bytes() < policy.full_copy_parameter_bytes() / 2);
//! # Ok(()) }
//! ```

use std::fmt;

use tch::nn::{Init, Path, VarStore};
use tch::{Kind, Tensor};

use super::config::Gpt2Config;
use super::gpt2::{
    copy_layer_norm, copy_tensor, run_blocks, Block, ForwardOptions, Gpt2Input, Gpt2Model,
    Gpt2Output, LayerNorm,
};
use crate::error::{Error, Result, ShapeFmt};
use crate::modules::TensorDictModule;
use crate::tensordict::{NestedKey, TensorDict};

// ------------------------------------------------------------------ keys

/// The tensordict keys the LLM heads read and write (TorchRL's LLM layout, §4.1 of the RLHF
/// reference). Every field can be changed.
#[derive(Debug, Clone, PartialEq)]
pub struct LlmKeys {
    /// Token ids `[B, T]`. Default `("tokens", "full")`.
    pub input_ids: NestedKey,
    /// Attention mask `[B, T]` (1 = real token). Default `("masks", "all_attention_mask")`.
    pub attention_mask: NestedKey,
    /// Logits `[B, T, vocab]`. Default `"logits"`.
    pub logits: NestedKey,
    /// Per-token log-probs `[B, T]` (see the [module docs](self)). Default `("log_probs",
    /// "full")`.
    pub log_probs: NestedKey,
    /// The reference model's per-token log-probs `[B, T]`. Default `("ref_log_probs",
    /// "full")`.
    pub ref_log_probs: NestedKey,
    /// Per-position values `[B, T]`. Default `"values"`.
    pub values: NestedKey,
    /// Per-sequence score `[B]`. Default `"score"`.
    pub score: NestedKey,
    /// ILQL: positions whose next token is an action `[B, A]`. Default `"actions_ixs"`.
    pub actions_ixs: NestedKey,
    /// ILQL: state positions `[B, S]`. Default `"states_ixs"`.
    pub states_ixs: NestedKey,
}

impl LlmKeys {
    /// The token ids and the attention mask: what every head reads.
    pub fn token_inputs(&self) -> Vec<NestedKey> {
        vec![self.input_ids.clone(), self.attention_mask.clone()]
    }
}

impl Default for LlmKeys {
    fn default() -> Self {
        LlmKeys {
            input_ids: ("tokens", "full").into(),
            attention_mask: ("masks", "all_attention_mask").into(),
            logits: "logits".into(),
            log_probs: ("log_probs", "full").into(),
            ref_log_probs: ("ref_log_probs", "full").into(),
            values: "values".into(),
            score: "score".into(),
            actions_ixs: "actions_ixs".into(),
            states_ixs: "states_ixs".into(),
        }
    }
}

/// Per-token log-probs aligned with `tokens` `[B, T]` from `logits` `[B, T, V]`, float32: 0 at
/// `t = 0` and, with a `mask`, wherever the token or the one before it is padding (the first
/// real token of a left-padded row has nothing real to be predicted from).
///
/// ```
/// use tch::{Kind, Tensor};
/// use torchrl::modules::llm::token_log_probs;
/// // uniform logits over 4 tokens: every log-prob is ln(1/4), except the first position
/// let logits = Tensor::zeros([1, 3, 4], (Kind::Float, tch::Device::Cpu));
/// let tokens = Tensor::from_slice(&[0i64, 1, 2]).view([1, 3]);
/// let lp = Vec::<f32>::try_from(token_log_probs(&logits, &tokens, None)?.view([-1]))?;
/// assert_eq!(lp[0], 0.0);
/// assert!((lp[1] - 0.25f32.ln()).abs() < 1e-6 && (lp[2] - 0.25f32.ln()).abs() < 1e-6);
/// # Ok::<(), torchrl::Error>(())
/// ```
pub fn token_log_probs(logits: &Tensor, tokens: &Tensor, mask: Option<&Tensor>) -> Result<Tensor> {
    let (b, t, _) = logits.size3()?;
    if tokens.size() != [b, t] {
        return Err(Error::ShapeMismatch {
            op: "token_log_probs",
            key: "tokens".into(),
            expected: vec![b, t],
            actual: tokens.size(),
        });
    }
    if t == 0 {
        return Ok(Tensor::f_zeros([b, 0], (Kind::Float, logits.device()))?);
    }
    let lp = logits
        .f_narrow(1, 0, t - 1)?
        .f_log_softmax(-1, Kind::Float)?
        .f_gather(-1, &tokens.f_narrow(1, 1, t - 1)?.f_unsqueeze(-1)?, false)?
        .f_squeeze_dim(-1)?;
    let first = Tensor::f_zeros([b, 1], (Kind::Float, logits.device()))?;
    let lp = Tensor::f_cat(&[&first, &lp], 1)?;
    match mask {
        Some(m) => {
            // a token counts when it and the token before it are real
            let m = m.f_to_kind(Kind::Float)?;
            let prev = Tensor::f_cat(&[&first, &m.f_narrow(1, 0, t - 1)?], 1)?;
            Ok(lp.f_mul(&m)?.f_mul(&prev)?)
        }
        None => Ok(lp),
    }
}

/// The per-token entropy of a causal LM's next-token distribution, aligned with the tokens as
/// [`token_log_probs`] is: `H[t] = −Σ_v p_v·log p_v`
/// of `softmax(logits[t − 1])`, the distribution `token[t]` is drawn from; 0 at `t = 0` and,
/// with a `mask`, wherever the token or the one before it is padding. Differentiable in the
/// logits; float64 logits give float64, other floating kinds float32 (as `token_log_probs`).
///
/// This is what [`GrpoConfig::entropy_coeff`]'s bonus uses when the policy gives it
/// ([`TokenPolicyValue::log_probs_values_entropy`]); TorchRL's `LLMMaskedCategorical.entropy`
/// and TRL's fused LM head compute the same quantity.
///
/// [`GrpoConfig::entropy_coeff`]: crate::objectives::llm::GrpoConfig::entropy_coeff
/// [`TokenPolicyValue::log_probs_values_entropy`]: crate::objectives::llm::TokenPolicyValue::log_probs_values_entropy
///
/// # Shapes
/// `logits` `[B, T, V]`, `mask` `[B, T]`; the output `[B, T]`.
///
/// # Errors
/// When `logits` is not a floating-point `[B, T, V]` tensor or `mask` is not `[B, T]`.
///
/// ```
/// use tch::{Kind, Tensor};
/// use torchrl::objectives::llm::token_entropy;
/// # fn main() -> torchrl::Result<()> {
/// // uniform logits over 4 tokens: log 4 everywhere but at t = 0; a one-hot row: 0
/// let logits = Tensor::zeros([1, 3, 4], (Kind::Double, tch::Device::Cpu));
/// let _ = logits.get(0).get(1).get(2).fill_(1e4);
/// let h = Vec::<f64>::try_from(token_entropy(&logits, None)?.view([-1]))?;
/// assert_eq!(h[0], 0.0);
/// assert!((h[1] - 4f64.ln()).abs() < 1e-12 && h[2].abs() < 1e-12);
/// # Ok(()) }
/// ```
pub fn token_entropy(logits: &Tensor, mask: Option<&Tensor>) -> Result<Tensor> {
    const OP: &str = "token_entropy";
    let size = logits.size();
    let (b, t) = match size.as_slice() {
        [b, t, _] if logits.is_floating_point() => (*b, *t),
        _ => {
            return Err(Error::value(
                OP,
                "logits",
                "a floating-point [B, T, V] tensor",
                format!("{:?} of shape {}", logits.kind(), ShapeFmt(&size)),
            ))
        }
    };
    if let Some(m) = mask {
        if m.size() != [b, t] {
            return Err(Error::ShapeMismatch {
                op: OP,
                key: "mask".into(),
                expected: vec![b, t],
                actual: m.size(),
            });
        }
    }
    let kind = if logits.kind() == Kind::Double {
        Kind::Double
    } else {
        Kind::Float
    };
    let first = Tensor::f_zeros([b, 1], (kind, logits.device()))?;
    if t == 0 {
        return Ok(Tensor::f_zeros([b, 0], (kind, logits.device()))?);
    }
    let floor = if kind == Kind::Double {
        f64::MIN
    } else {
        f64::from(f32::MIN)
    };
    // p·log p with log p floored, so a zero probability adds 0 rather than 0·(−∞)
    let logp = logits
        .f_narrow(1, 0, t - 1)?
        .f_log_softmax(-1, kind)?
        .f_clamp_min(floor)?;
    let h = logp
        .f_exp()?
        .f_mul(&logp)?
        .f_sum_dim_intlist(-1, false, None::<Kind>)?
        .f_neg()?;
    let h = Tensor::f_cat(&[&first, &h], 1)?;
    match mask {
        Some(m) => {
            let m = m.f_ne(0)?.f_to_kind(kind)?;
            let prev = Tensor::f_cat(&[&first, &m.f_narrow(1, 0, t - 1)?], 1)?;
            Ok(h.f_mul(&m)?.f_mul(&prev)?)
        }
        None => Ok(h),
    }
}

/// The parts every trunk-plus-head wrapper shares: `Debug`, the key and trunk accessors, and
/// (with `new`) a random-init constructor that builds the trunk and calls `from_model`.
macro_rules! trunk_wrapper {
    ($ty:ident) => {
        impl fmt::Debug for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_struct(stringify!($ty))
                    .field("model", &self.model)
                    .finish_non_exhaustive()
            }
        }

        impl $ty {
            /// Replaces the tensordict keys.
            pub fn with_keys(mut self, keys: LlmKeys) -> Self {
                self.keys = keys;
                self
            }

            /// The tensordict keys.
            pub fn keys(&self) -> &LlmKeys {
                &self.keys
            }

            /// The trunk.
            pub fn model(&self) -> &Gpt2Model {
                &self.model
            }
        }
    };
    ($ty:ident, new: $doc:literal) => {
        trunk_wrapper!($ty);

        impl $ty {
            #[doc = $doc]
            pub fn new(path: &Path<'_>, config: &Gpt2Config) -> Result<Self> {
                let model = Gpt2Model::new(path, config)?;
                Self::from_model(path, model)
            }
        }
    };
}

trunk_wrapper!(
    CausalLmWithValueHead,
    new: "A random model and value head under `path` (`transformer.*`, `v_head.*`)."
);
trunk_wrapper!(CausalLmWithIlqlHeads);
trunk_wrapper!(
    Gpt2ScoreModel,
    new: "A random trunk and score head under `path` (`transformer.*`, `score.weight`)."
);

// ------------------------------------------------------------------ make_head

/// trlX's `make_head(n_embd, out)`: `Linear(n_embd, 2·n_embd) → ReLU → Linear(2·n_embd, out)`,
/// parameters named `0.weight`, `0.bias`, `2.weight`, `2.bias` (PyTorch's `nn.Sequential`
/// indices), initialised like `nn.Linear` (uniform in `±1/√fan_in`).
pub struct MlpHead {
    w1: Tensor,
    b1: Tensor,
    w2: Tensor,
    b2: Tensor,
}

impl fmt::Debug for MlpHead {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MlpHead({:?} -> {:?})", self.w1.size(), self.w2.size())
    }
}

impl MlpHead {
    /// A freshly initialised head under `path`.
    pub fn new(path: &Path<'_>, n_embd: i64, out: i64) -> Result<Self> {
        if n_embd <= 0 || out <= 0 {
            return Err(Error::value(
                "MlpHead::new",
                "sizes",
                "positive n_embd and out",
                format!("n_embd {n_embd}, out {out}"),
            ));
        }
        let hidden = 2 * n_embd;
        let uniform = |fan_in: i64| {
            let bound = 1.0 / (fan_in as f64).sqrt();
            Init::Uniform {
                lo: -bound,
                up: bound,
            }
        };
        let l0 = path / "0";
        let l2 = path / "2";
        Ok(MlpHead {
            w1: l0.f_var("weight", &[hidden, n_embd], uniform(n_embd))?,
            b1: l0.f_var("bias", &[hidden], uniform(n_embd))?,
            w2: l2.f_var("weight", &[out, hidden], uniform(hidden))?,
            b2: l2.f_var("bias", &[out], uniform(hidden))?,
        })
    }

    /// A copy of this head's parameters as new variables under `path`.
    pub fn copy_to(&self, path: &Path<'_>) -> Result<Self> {
        let l0 = path / "0";
        let l2 = path / "2";
        Ok(MlpHead {
            w1: copy_tensor(&l0, "weight", &self.w1)?,
            b1: copy_tensor(&l0, "bias", &self.b1)?,
            w2: copy_tensor(&l2, "weight", &self.w2)?,
            b2: copy_tensor(&l2, "bias", &self.b2)?,
        })
    }

    /// `[.., n_embd]` → `[.., out]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let h = x.f_linear(&self.w1, Some(&self.b1))?.f_relu()?;
        Ok(h.f_linear(&self.w2, Some(&self.b2))?)
    }

    /// The parameters, in `0.weight, 0.bias, 2.weight, 2.bias` order.
    pub fn parameters(&self) -> [&Tensor; 4] {
        [&self.w1, &self.b1, &self.w2, &self.b2]
    }

    /// Polyak update of `self` towards `source`: `self = α·source + (1 − α)·self`, without
    /// gradients.
    pub fn polyak_from(&self, source: &MlpHead, alpha: f64) -> Result<()> {
        let _guard = tch::no_grad_guard();
        for (t, s) in self.parameters().into_iter().zip(source.parameters()) {
            let mut t = t.shallow_clone();
            let _ = t.f_mul_scalar_(1.0 - alpha)?;
            let _ = t.f_add_(&s.f_mul_scalar(alpha)?)?;
        }
        Ok(())
    }
}

fn parameter_bytes<'a>(params: impl IntoIterator<Item = &'a Tensor>) -> i64 {
    params
        .into_iter()
        .map(|p| p.numel() as i64 * p.kind().elt_size_in_bytes() as i64)
        .sum()
}

fn freeze<'a>(params: impl IntoIterator<Item = &'a Tensor>) -> Result<()> {
    for p in params {
        let _ = p.f_set_requires_grad(false)?;
    }
    Ok(())
}

/// Reads the token ids and the mask from `td` under `keys`.
fn read_tokens<'a>(td: &'a TensorDict, keys: &LlmKeys) -> Result<(&'a Tensor, &'a Tensor)> {
    Ok((
        td.get_or_err(&keys.input_ids)?,
        td.get_or_err(&keys.attention_mask)?,
    ))
}

// ------------------------------------------------------------------ value head

/// What a policy-with-value forward returns.
#[derive(Debug)]
pub struct ValueOutput {
    /// `[B, T, vocab]`.
    pub logits: Tensor,
    /// One value per position, `[B, T]` (trlX's `v_head(h).squeeze(-1)`).
    pub values: Tensor,
    /// The final norm's output, `[B, T, n_embd]`.
    pub last_hidden: Tensor,
}

/// trlX's `GPTHeadWithValueModel`: a [`Gpt2Model`] and an [`MlpHead`] value head on its last
/// hidden state, both from one trunk pass. As a [`TensorDictModule`] it reads
/// [`LlmKeys::input_ids`] and [`LlmKeys::attention_mask`] and writes logits, log-probs and
/// values.
pub struct CausalLmWithValueHead {
    model: Gpt2Model,
    v_head: MlpHead,
    keys: LlmKeys,
}

impl CausalLmWithValueHead {
    /// A value head under `path` (`v_head.*`) on an existing model (e.g. loaded with
    /// [`Gpt2Model::from_pretrained`] under the same path).
    pub fn from_model(path: &Path<'_>, model: Gpt2Model) -> Result<Self> {
        let v_head = MlpHead::new(&(path / "v_head"), model.config().n_embd, 1)?;
        Ok(CausalLmWithValueHead {
            model,
            v_head,
            keys: LlmKeys::default(),
        })
    }

    /// The value head.
    pub fn v_head(&self) -> &MlpHead {
        &self.v_head
    }

    /// The trunk's parameters by `transformers` name, then the value head's as trlX names
    /// them (`v_head.0.weight`, `v_head.0.bias`, `v_head.2.weight`, `v_head.2.bias`: its
    /// `Sequential(Linear, ReLU, Linear)`).
    pub fn named_parameters(&self) -> Vec<(String, &Tensor)> {
        let mut out = self.model.named_parameters();
        let names = [
            "v_head.0.weight",
            "v_head.0.bias",
            "v_head.2.weight",
            "v_head.2.bias",
        ];
        out.extend(
            names
                .iter()
                .map(|n| n.to_string())
                .zip(self.v_head.parameters()),
        );
        out
    }

    /// Logits and values from one trunk pass.
    pub fn forward(&self, input: &Gpt2Input<'_>) -> Result<ValueOutput> {
        let out = self.model.forward(input, None)?;
        self.finish(out)
    }

    /// [`CausalLmWithValueHead::forward`] from the hidden state entering block `start`
    /// ([`Gpt2Model::forward_from_block`]), the value head on its final hidden state.
    ///
    /// # Errors
    /// As [`Gpt2Model::forward_from_block`].
    pub fn forward_from_block(
        &self,
        hidden: &Tensor,
        start: usize,
        attention_mask: Option<&Tensor>,
    ) -> Result<ValueOutput> {
        let out = self
            .model
            .forward_from_block(hidden, start, attention_mask)?;
        self.finish(out)
    }

    fn finish(&self, out: Gpt2Output) -> Result<ValueOutput> {
        let values = self.v_head.forward(&out.last_hidden)?.f_squeeze_dim(-1)?;
        Ok(ValueOutput {
            logits: out
                .logits
                .ok_or_else(|| Error::invalid("CausalLmWithValueHead", "no logits"))?,
            values,
            last_hidden: out.last_hidden,
        })
    }
}

impl TensorDictModule for CausalLmWithValueHead {
    fn in_keys(&self) -> Vec<NestedKey> {
        self.keys.token_inputs()
    }

    fn out_keys(&self) -> Vec<NestedKey> {
        vec![
            self.keys.logits.clone(),
            self.keys.log_probs.clone(),
            self.keys.values.clone(),
        ]
    }

    fn forward(&self, mut td: TensorDict) -> Result<TensorDict> {
        let (ids, mask) = read_tokens(&td, &self.keys)?;
        let out =
            CausalLmWithValueHead::forward(self, &Gpt2Input::new(ids).with_attention_mask(mask))?;
        let lp = token_log_probs(&out.logits, ids, Some(mask))?;
        td.set(&self.keys.logits, out.logits)?;
        td.set(&self.keys.log_probs, lp)?;
        td.set(&self.keys.values, out.values)?;
        Ok(td)
    }
}

// ------------------------------------------------------------------ hydra

/// trlX's `ModelBranch`: frozen copies of the top `k` blocks, the final norm and the LM head,
/// taken when the branch is built. It computes reference logits from the hidden state entering
/// block `L − k`.
///
/// The LM head is GPT-2's token embedding. When the model's embedding is already frozen (as a
/// hydra policy freezes it) the branch shares it instead of copying it: it cannot change, and
/// on GPT-2 small that saves 154 MB (trlX deep-copies it).
pub struct ModelBranch {
    blocks: Vec<Block>,
    ln_f: LayerNorm,
    lm_head: Tensor,
    shares_lm_head: bool,
    start: usize,
}

impl fmt::Debug for ModelBranch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (start, n) = (self.start, self.blocks.len());
        write!(f, "ModelBranch(start_block={start}, blocks={n})")
    }
}

impl ModelBranch {
    /// Copies the top `k` blocks, `ln_f` and the LM head of `model` under `path` (not frozen:
    /// freeze the store it lives in).
    pub fn new(path: &Path<'_>, model: &Gpt2Model, k: usize) -> Result<Self> {
        let n = model.n_layer();
        if k == 0 || k > n {
            return Err(Error::value(
                "ModelBranch::new",
                "num_layers_unfrozen",
                format!("between 1 and n_layer = {n}"),
                k.to_string(),
            ));
        }
        let start = n - k;
        let blocks = model
            .blocks()
            .iter()
            .skip(start)
            .enumerate()
            .map(|(i, b)| b.copy_to(&(path / "h" / i)))
            .collect::<Result<Vec<_>>>()?;
        let shares_lm_head = !model.wte().requires_grad();
        let lm_head = if shares_lm_head {
            model.wte().shallow_clone()
        } else {
            copy_tensor(&(path / "lm_head"), "weight", model.wte())?
        };
        Ok(ModelBranch {
            blocks,
            ln_f: copy_layer_norm(model.ln_f(), &(path / "ln_f"))?,
            lm_head,
            shares_lm_head,
            start,
        })
    }

    /// The index of the first policy block the branch replaces (`L − k`).
    pub fn start_block(&self) -> usize {
        self.start
    }

    /// Reference logits `[B, T, vocab]` from `hidden` `[B, T, n_embd]`, the hidden state that
    /// enters block [`ModelBranch::start_block`] (mask as in the policy's forward, without a
    /// cache).
    pub fn forward(&self, hidden: &Tensor, attention_mask: Option<&Tensor>) -> Result<Tensor> {
        let h = run_blocks(&self.blocks, &self.ln_f, hidden, attention_mask)?;
        Ok(h.f_matmul(&self.lm_head.f_transpose(0, 1)?)?)
    }

    /// Whether the LM head is the model's (frozen) token embedding rather than a copy.
    pub fn shares_lm_head(&self) -> bool {
        self.shares_lm_head
    }

    /// The parameters the branch owns (the shared LM head is not counted).
    fn parameters(&self) -> Vec<&Tensor> {
        let mut out: Vec<&Tensor> = self
            .blocks
            .iter()
            .flat_map(|b| b.named_parameters().into_iter().map(|(_, p)| p))
            .collect();
        out.extend([&self.ln_f.weight, &self.ln_f.bias]);
        if !self.shares_lm_head {
            out.push(&self.lm_head);
        }
        out
    }
}

/// The reference model of a [`CausalLmWithHydraValueHead`].
enum Reference {
    Branch(ModelBranch),
    Full(Gpt2Model),
}

/// What a hydra forward returns: the policy's logits and values and the reference logits,
/// from one pass over the shared trunk.
#[derive(Debug)]
pub struct HydraOutput {
    /// Policy logits `[B, T, vocab]`.
    pub logits: Tensor,
    /// Values `[B, T]`.
    pub values: Tensor,
    /// Reference logits `[B, T, vocab]`, detached.
    pub ref_logits: Tensor,
    /// The frozen trunk's output `[B, T, n_embd]` (the hidden state entering block
    /// [`CausalLmWithHydraValueHead::frozen_trunk_end`]), detached; `None` for a full-copy
    /// reference (nothing is frozen then).
    pub trunk: Option<Tensor>,
}

/// trlX's `GPTHydraHeadWithValueModel(config, num_layers_unfrozen)`: a policy with a value
/// head and a frozen reference (see the [module docs](self) for the `num_layers_unfrozen`
/// rules). The reference's parameters live in a store of their own, frozen as a whole.
///
/// As a [`TensorDictModule`] it writes logits, log-probs, values and the reference log-probs
/// ([`LlmKeys::ref_log_probs`]).
pub struct CausalLmWithHydraValueHead {
    policy: CausalLmWithValueHead,
    reference: Reference,
    ref_store: VarStore,
    num_layers_unfrozen: i64,
}

impl fmt::Debug for CausalLmWithHydraValueHead {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CausalLmWithHydraValueHead")
            .field("policy", &self.policy)
            .field("num_layers_unfrozen", &self.num_layers_unfrozen)
            .field(
                "reference_parameter_bytes",
                &self.reference_parameter_bytes(),
            )
            .finish()
    }
}

impl CausalLmWithHydraValueHead {
    /// A random policy under `path` with its reference (see [`Self::from_model`]).
    pub fn new(path: &Path<'_>, config: &Gpt2Config, num_layers_unfrozen: i64) -> Result<Self> {
        let model = Gpt2Model::new(path, config)?;
        Self::from_model(path, model, num_layers_unfrozen)
    }

    /// A value head under `path` on `model`, the reference taken from `model` as it is now,
    /// and the policy's frozen parts frozen: `k > 0` freezes the embeddings and blocks
    /// `0..L−k`, `k = 0` the embeddings and every block, `k = -1` nothing.
    pub fn from_model(path: &Path<'_>, model: Gpt2Model, num_layers_unfrozen: i64) -> Result<Self> {
        let n = model.n_layer() as i64;
        if !(-1..=n).contains(&num_layers_unfrozen) {
            return Err(Error::value(
                "CausalLmWithHydraValueHead::from_model",
                "num_layers_unfrozen",
                format!("-1 (train everything), 0 (freeze every block) or 1..={n}"),
                num_layers_unfrozen.to_string(),
            ));
        }
        match num_layers_unfrozen {
            -1 => {}
            0 => freeze(model.lower_trunk_parameters(model.n_layer()))?,
            k => freeze(model.lower_trunk_parameters(model.n_layer() - k as usize))?,
        }
        let mut ref_store = VarStore::new(model.device());
        let reference = match usize::try_from(num_layers_unfrozen) {
            Ok(k) if k > 0 => Reference::Branch(ModelBranch::new(&ref_store.root(), &model, k)?),
            _ => {
                let copy = Gpt2Model::new(&ref_store.root(), model.config())?;
                let _guard = tch::no_grad_guard();
                for ((_, dst), (_, src)) in copy
                    .named_parameters()
                    .into_iter()
                    .zip(model.named_parameters())
                {
                    dst.shallow_clone().f_copy_(src)?;
                }
                Reference::Full(copy)
            }
        };
        ref_store.freeze();
        Ok(CausalLmWithHydraValueHead {
            policy: CausalLmWithValueHead::from_model(path, model)?,
            reference,
            ref_store,
            num_layers_unfrozen,
        })
    }

    /// Replaces the tensordict keys.
    pub fn with_keys(mut self, keys: LlmKeys) -> Self {
        self.policy.keys = keys;
        self
    }

    /// The policy (trunk and value head).
    pub fn policy(&self) -> &CausalLmWithValueHead {
        &self.policy
    }

    /// `num_layers_unfrozen` as given.
    pub fn num_layers_unfrozen(&self) -> i64 {
        self.num_layers_unfrozen
    }

    /// The store holding the reference's (frozen) parameters.
    pub fn reference_store(&self) -> &VarStore {
        &self.ref_store
    }

    /// Bytes of parameters the reference holds of its own (a branch: `k` blocks and `ln_f`,
    /// its LM head being the policy's frozen embedding; a full copy: the whole model).
    pub fn reference_parameter_bytes(&self) -> i64 {
        match &self.reference {
            Reference::Branch(b) => parameter_bytes(b.parameters()),
            Reference::Full(m) => parameter_bytes(m.named_parameters().into_iter().map(|(_, p)| p)),
        }
    }

    /// Bytes of parameters a full reference copy of the trunk holds (for comparison).
    pub fn full_copy_parameter_bytes(&self) -> i64 {
        parameter_bytes(
            self.policy
                .model()
                .named_parameters()
                .into_iter()
                .map(|(_, p)| p),
        )
    }

    /// The policy parameters that train (`requires_grad`): what an optimizer should step.
    pub fn trainable_parameters(&self) -> Vec<Tensor> {
        let mut out: Vec<Tensor> = self
            .policy
            .model()
            .named_parameters()
            .into_iter()
            .map(|(_, p)| p)
            .chain(self.policy.v_head().parameters())
            .filter(|p| p.requires_grad())
            .map(|p| p.shallow_clone())
            .collect();
        out.shrink_to_fit();
        out
    }

    /// Policy logits, values and reference logits; the shared trunk runs once.
    pub fn forward(&self, input: &Gpt2Input<'_>) -> Result<HydraOutput> {
        let model = self.policy.model();
        let capture = match &self.reference {
            Reference::Branch(b) => Some(b.start_block()),
            Reference::Full(_) => None,
        };
        let out = model.forward_with(
            input,
            None,
            ForwardOptions {
                logits: true,
                capture_block_input: capture,
            },
        )?;
        let branch_input = out.block_input.as_ref().map(|h| h.shallow_clone());
        let trunk = match &branch_input {
            Some(h) => Some(h.f_detach()?),
            None => None,
        };
        let ref_logits = self.reference_logits(input, branch_input)?;
        let policy = self.policy.finish(out)?;
        Ok(HydraOutput {
            logits: policy.logits,
            values: policy.values,
            ref_logits,
            trunk,
        })
    }

    /// Where the frozen trunk ends: the first trainable policy block (`n_layer −
    /// num_layers_unfrozen`), whose input [`HydraOutput::trunk`] is; `None` for a full-copy
    /// reference.
    pub fn frozen_trunk_end(&self) -> Option<usize> {
        match &self.reference {
            Reference::Branch(b) => Some(b.start_block()),
            Reference::Full(_) => None,
        }
    }

    /// The reference logits only (trlX's `forward_hydra`).
    pub fn forward_hydra(&self, input: &Gpt2Input<'_>) -> Result<Tensor> {
        match &self.reference {
            Reference::Branch(b) => {
                let out = self.policy.model().forward_with(
                    input,
                    None,
                    ForwardOptions {
                        logits: false,
                        capture_block_input: Some(b.start_block()),
                    },
                )?;
                self.reference_logits(input, out.block_input)
            }
            Reference::Full(_) => self.reference_logits(input, None),
        }
    }

    fn reference_logits(
        &self,
        input: &Gpt2Input<'_>,
        branch_input: Option<Tensor>,
    ) -> Result<Tensor> {
        let _guard = tch::no_grad_guard();
        let logits = match (&self.reference, branch_input) {
            (Reference::Branch(b), Some(h)) => b.forward(&h.f_detach()?, input.attention_mask)?,
            (Reference::Full(m), _) => m.forward(input, None)?.logits()?,
            (Reference::Branch(_), None) => {
                return Err(Error::invalid(
                    "CausalLmWithHydraValueHead",
                    "the trunk did not return the branch's input",
                ))
            }
        };
        Ok(logits)
    }
}

impl TensorDictModule for CausalLmWithHydraValueHead {
    fn in_keys(&self) -> Vec<NestedKey> {
        self.policy.in_keys()
    }

    fn out_keys(&self) -> Vec<NestedKey> {
        let mut keys = self.policy.out_keys();
        keys.push(self.policy.keys.ref_log_probs.clone());
        keys
    }

    fn forward(&self, mut td: TensorDict) -> Result<TensorDict> {
        let keys = &self.policy.keys;
        let (ids, mask) = read_tokens(&td, keys)?;
        let out = CausalLmWithHydraValueHead::forward(
            self,
            &Gpt2Input::new(ids).with_attention_mask(mask),
        )?;
        let lp = token_log_probs(&out.logits, ids, Some(mask))?;
        let ref_lp = token_log_probs(&out.ref_logits, ids, Some(mask))?;
        td.set(&keys.logits, out.logits)?;
        td.set(&keys.log_probs, lp)?;
        td.set(&keys.values, out.values)?;
        td.set(&keys.ref_log_probs, ref_lp)?;
        Ok(td)
    }
}

// ------------------------------------------------------------------ ILQL

/// `hs` `[B, T, H]` gathered at `ixs` `[B, N]` → `[B, N, H]` (trlX's `batched_index_select`).
pub fn batched_index_select(hs: &Tensor, ixs: &Tensor) -> Result<Tensor> {
    let (b, t, h) = hs.size3()?;
    let expected = format!("[{b}, N] (positions < {t})");
    let [rows, _] = super::gpt2::dims2("batched_index_select", "ixs", ixs, &expected)?;
    if rows != b {
        return Err(Error::value(
            "batched_index_select",
            "ixs",
            format!("shape {expected}"),
            format!("{rows} rows"),
        ));
    }
    let idx = ixs
        .f_to_kind(Kind::Int64)?
        .f_unsqueeze(-1)?
        .f_expand([-1, -1, h], false)?;
    Ok(hs.f_gather(1, &idx, false)?)
}

/// What [`IlqlHeads::forward`] returns.
#[derive(Debug)]
pub struct IlqlHeadsOutput {
    /// Q-logits per Q head at the action positions, `[B, A, vocab]` each.
    pub qs: Vec<Tensor>,
    /// The frozen target heads' Q-logits at the action positions (detached).
    pub target_qs: Vec<Tensor>,
    /// Values at the state positions, `[B, S, 1]`.
    pub vs: Tensor,
}

/// trlX's ILQL heads: `v_head = make_head(h, 1)`, `q_heads = make_head(h, vocab)` (two with
/// `two_qs`), and target Q heads that start as copies and follow by Polyak averaging
/// (`target = α·q + (1 − α)·target`, [`IlqlHeads::sync_target_q_heads`]). The target heads
/// live in a frozen store of their own.
pub struct IlqlHeads {
    v_head: MlpHead,
    q_heads: Vec<MlpHead>,
    target_q_heads: Vec<MlpHead>,
    target_store: VarStore,
    alpha: f64,
}

impl fmt::Debug for IlqlHeads {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IlqlHeads")
            .field("n_qs", &self.q_heads.len())
            .field("alpha", &self.alpha)
            .finish()
    }
}

impl IlqlHeads {
    /// Heads under `path` (`v_head.*`, `q_heads.{i}.*`) for a trunk of width `n_embd` over
    /// `vocab` tokens; `two_qs` gives two Q heads; `alpha` is the Polyak rate in `[0, 1]`.
    pub fn new(path: &Path<'_>, n_embd: i64, vocab: i64, two_qs: bool, alpha: f64) -> Result<Self> {
        if !(0.0..=1.0).contains(&alpha) {
            return Err(Error::config("IlqlHeads", "alpha", "in [0, 1]", alpha));
        }
        let n_qs = if two_qs { 2 } else { 1 };
        let v_head = MlpHead::new(&(path / "v_head"), n_embd, 1)?;
        let q_heads = (0..n_qs)
            .map(|i| MlpHead::new(&(path / "q_heads" / i), n_embd, vocab))
            .collect::<Result<Vec<_>>>()?;
        let mut target_store = VarStore::new(path.device());
        let target_q_heads = q_heads
            .iter()
            .enumerate()
            .map(|(i, q)| q.copy_to(&(target_store.root() / "target_q_heads" / i)))
            .collect::<Result<Vec<_>>>()?;
        target_store.freeze();
        Ok(IlqlHeads {
            v_head,
            q_heads,
            target_q_heads,
            target_store,
            alpha,
        })
    }

    /// The Polyak rate.
    pub fn alpha(&self) -> f64 {
        self.alpha
    }

    /// The number of Q heads (1 or 2).
    pub fn n_qs(&self) -> usize {
        self.q_heads.len()
    }

    /// The store of the (frozen) target heads.
    pub fn target_store(&self) -> &VarStore {
        &self.target_store
    }

    /// The V head.
    pub fn v_head(&self) -> &MlpHead {
        &self.v_head
    }

    /// The Q heads.
    pub fn q_heads(&self) -> &[MlpHead] {
        &self.q_heads
    }

    /// The target Q heads.
    pub fn target_q_heads(&self) -> &[MlpHead] {
        &self.target_q_heads
    }

    /// Q, target-Q and V from the last hidden state `hs` `[B, T, H]`, gathered at the action
    /// and state positions (all positions where `None`).
    pub fn forward(
        &self,
        hs: &Tensor,
        states_ixs: Option<&Tensor>,
        actions_ixs: Option<&Tensor>,
    ) -> Result<IlqlHeadsOutput> {
        let actions_hs = match actions_ixs {
            Some(ix) => batched_index_select(hs, ix)?,
            None => hs.shallow_clone(),
        };
        let states_hs = match states_ixs {
            Some(ix) => batched_index_select(hs, ix)?,
            None => hs.shallow_clone(),
        };
        let qs = self
            .q_heads
            .iter()
            .map(|q| q.forward(&actions_hs))
            .collect::<Result<Vec<_>>>()?;
        let target_qs = {
            let _guard = tch::no_grad_guard();
            let detached = actions_hs.f_detach()?;
            self.target_q_heads
                .iter()
                .map(|q| q.forward(&detached))
                .collect::<Result<Vec<_>>>()?
        };
        Ok(IlqlHeadsOutput {
            qs,
            target_qs,
            vs: self.v_head.forward(&states_hs)?,
        })
    }

    /// One Polyak step of every target head towards its Q head.
    pub fn sync_target_q_heads(&self) -> Result<()> {
        for (t, q) in self.target_q_heads.iter().zip(&self.q_heads) {
            t.polyak_from(q, self.alpha)?;
        }
        Ok(())
    }
}

/// What [`CausalLmWithIlqlHeads::forward`] returns (trlX's `(logits, qs, target_qs, vs)`).
#[derive(Debug)]
pub struct IlqlOutput {
    /// LM logits over **all** positions, `[B, T, vocab]`.
    pub logits: Tensor,
    /// The heads' outputs.
    pub heads: IlqlHeadsOutput,
}

/// trlX's `CausalLMWithValueHeads`: a [`Gpt2Model`] with [`IlqlHeads`] on its last hidden
/// state. As a [`TensorDictModule`] it reads the tokens, the mask, `actions_ixs` and
/// `states_ixs`, and writes `logits`, `qs` / `target_qs` (`[B, A, n_qs, vocab]`) and `vs`
/// (`[B, S, 1]`).
pub struct CausalLmWithIlqlHeads {
    model: Gpt2Model,
    heads: IlqlHeads,
    keys: LlmKeys,
}

impl CausalLmWithIlqlHeads {
    /// ILQL heads under `path` (`ilql_heads.*`) on `model`.
    pub fn from_model(path: &Path<'_>, model: Gpt2Model, two_qs: bool, alpha: f64) -> Result<Self> {
        let cfg = model.config();
        let heads = IlqlHeads::new(
            &(path / "ilql_heads"),
            cfg.n_embd,
            cfg.vocab_size,
            two_qs,
            alpha,
        )?;
        Ok(CausalLmWithIlqlHeads {
            model,
            heads,
            keys: LlmKeys::default(),
        })
    }

    /// The heads.
    pub fn heads(&self) -> &IlqlHeads {
        &self.heads
    }

    /// Logits over all positions and the heads at the given positions, one trunk pass.
    pub fn forward(
        &self,
        input: &Gpt2Input<'_>,
        states_ixs: Option<&Tensor>,
        actions_ixs: Option<&Tensor>,
    ) -> Result<IlqlOutput> {
        let out = self.model.forward(input, None)?;
        let heads = self
            .heads
            .forward(&out.last_hidden, states_ixs, actions_ixs)?;
        Ok(IlqlOutput {
            logits: out.logits()?,
            heads,
        })
    }
}

impl TensorDictModule for CausalLmWithIlqlHeads {
    fn in_keys(&self) -> Vec<NestedKey> {
        vec![
            self.keys.input_ids.clone(),
            self.keys.attention_mask.clone(),
            self.keys.actions_ixs.clone(),
            self.keys.states_ixs.clone(),
        ]
    }

    fn out_keys(&self) -> Vec<NestedKey> {
        vec![
            self.keys.logits.clone(),
            "qs".into(),
            "target_qs".into(),
            "vs".into(),
        ]
    }

    fn forward(&self, mut td: TensorDict) -> Result<TensorDict> {
        let (ids, mask) = read_tokens(&td, &self.keys)?;
        let actions = td.get_or_err(&self.keys.actions_ixs)?;
        let states = td.get_or_err(&self.keys.states_ixs)?;
        let out = CausalLmWithIlqlHeads::forward(
            self,
            &Gpt2Input::new(ids).with_attention_mask(mask),
            Some(states),
            Some(actions),
        )?;
        let qs = Tensor::f_stack(&out.heads.qs, 2)?;
        let target_qs = Tensor::f_stack(&out.heads.target_qs, 2)?;
        td.set(&self.keys.logits, out.logits)?;
        td.set("qs", qs)?;
        td.set("target_qs", target_qs)?;
        td.set("vs", out.heads.vs)?;
        Ok(td)
    }
}

// ------------------------------------------------------------------ sequence score

/// The index of each row's last real token, from a mask `[B, T]` (left or right padding):
/// `argmax(arange(T) · mask)`.
pub fn last_token_index(mask: &Tensor) -> Result<Tensor> {
    let t = mask.size().last().copied().unwrap_or(0);
    let pos = Tensor::f_arange(t, (Kind::Int64, mask.device()))?;
    Ok(pos
        .f_mul(&mask.f_to_kind(Kind::Int64)?)?
        .f_argmax(-1, false)?)
}

/// A reward model: a [`Gpt2Model`] trunk and `transformers`' `GPT2ForSequenceClassification`
/// score head with one label (`score.weight` `[1, n_embd]`, no bias), read at each row's last
/// real token. As a [`TensorDictModule`] it reads the tokens and the mask and writes
/// [`LlmKeys::score`] `[B]`: plug it into
/// [`RewardModelLoss`](crate::objectives::RewardModelLoss) as the score network (it runs on
/// the `chosen` and `rejected` sub-tensordicts).
pub struct Gpt2ScoreModel {
    model: Gpt2Model,
    score: Tensor,
    keys: LlmKeys,
}

impl Gpt2ScoreModel {
    /// A score head under `path` on `model` (normal init with `initializer_range` std).
    pub fn from_model(path: &Path<'_>, model: Gpt2Model) -> Result<Self> {
        let std = model.config().initializer_range;
        let score = (path / "score").f_var(
            "weight",
            &[1, model.config().n_embd],
            Init::Randn {
                mean: 0.0,
                stdev: std,
            },
        )?;
        Ok(Gpt2ScoreModel {
            model,
            score,
            keys: LlmKeys::default(),
        })
    }

    /// Builds from a `transformers` `GPT2ForSequenceClassification` folder (`config.json` and
    /// `model.safetensors` with `transformer.*` and `score.weight`).
    pub fn from_pretrained(path: &Path<'_>, dir: impl AsRef<std::path::Path>) -> Result<Self> {
        let op = "Gpt2ScoreModel::from_pretrained";
        let dir = dir.as_ref();
        let config = Gpt2Config::from_json_file(dir.join(super::weights::CONFIG_FILE))?;
        let this = Self::new(path, &config)?;
        let file = dir.join(super::weights::WEIGHTS_FILE);
        let tensors = super::weights::read_tensors(op, &file)?;
        super::weights::load_into(op, &file, &this.named_parameters(), tensors, None)?;
        Ok(this)
    }

    /// Writes `config.json` and `model.safetensors` (the trunk's and `score.weight`).
    pub fn save_pretrained(&self, dir: impl AsRef<std::path::Path>) -> Result<()> {
        super::weights::save_folder(
            "Gpt2ScoreModel::save_pretrained",
            dir.as_ref(),
            self.model.config(),
            &self.named_parameters(),
        )
    }

    /// The trunk's parameters and `score.weight`, by `transformers` name.
    pub fn named_parameters(&self) -> Vec<(String, &Tensor)> {
        let mut out = self.model.named_parameters();
        out.push(("score.weight".to_string(), &self.score));
        out
    }

    /// One score per row, `[B]`, read at the last token whose mask is 1.
    pub fn forward(&self, input: &Gpt2Input<'_>) -> Result<Tensor> {
        let out = self.model.forward_with(
            input,
            None,
            ForwardOptions {
                logits: false,
                capture_block_input: None,
            },
        )?;
        let (b, t, _) = out.last_hidden.size3()?;
        let last = match input.attention_mask {
            Some(m) => last_token_index(m)?,
            None => Tensor::f_full([b], t - 1, (Kind::Int64, out.last_hidden.device()))?,
        };
        let h = batched_index_select(&out.last_hidden, &last.f_unsqueeze(1)?)?.f_squeeze_dim(1)?;
        Ok(h.f_linear(&self.score, None::<Tensor>)?.f_squeeze_dim(-1)?)
    }
}

impl TensorDictModule for Gpt2ScoreModel {
    fn in_keys(&self) -> Vec<NestedKey> {
        self.keys.token_inputs()
    }

    fn out_keys(&self) -> Vec<NestedKey> {
        vec![self.keys.score.clone()]
    }

    fn forward(&self, mut td: TensorDict) -> Result<TensorDict> {
        let (ids, mask) = read_tokens(&td, &self.keys)?;
        let score = Gpt2ScoreModel::forward(self, &Gpt2Input::new(ids).with_attention_mask(mask))?;
        td.set(&self.keys.score, score)?;
        Ok(td)
    }
}
