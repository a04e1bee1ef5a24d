//! [`Gpt2Model`]: GPT-2 (`transformers`' `GPT2LMHeadModel`) as one model file on the
//! [layer kit](crate::modules::llm::nn): token and learned position embeddings, pre-norm
//! blocks (fused `c_attn` attention and an MLP, both `Conv1D`), a final layer norm and the LM
//! head tied to the token embedding. It is a [`CausalLm`]: the forward, the cache, the input
//! checks and checkpoint files come from there.
//!
//! - **Parameters** carry `transformers`' names (`transformer.h.0.attn.c_attn.weight`, …)
//!   under the [`tch::nn::Path`] the model is built on, with GPT-2's `Conv1D` layout (`[in,
//!   out]` weights, `y = x W + b`), so checkpoints load by name.
//! - **Left padding**: `attention_mask` (1 = a real token) masks padded keys out; position ids
//!   default to `cumsum(mask) - 1` with pads set to 1, as `transformers`' `generate` sets them.
//!   Rows of padded queries attend uniformly (as `transformers`' eager attention): their
//!   outputs are meaningless but finite.
//! - **KV cache outside the model**: [`CausalLm::forward`] is `&self` and takes an optional
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
//! use torchrl::modules::llm::{CausalLm, Gpt2Config, Gpt2Model, LmInput};
//! # fn main() -> torchrl::Result<()> {
//! tch::manual_seed(0);
//! let vs = VarStore::new(Device::Cpu);
//! let cfg = Gpt2Config::new(50).with_n_layer(2).with_n_embd(16).with_n_head(2).with_n_positions(32);
//! let model = Gpt2Model::new(&vs.root(), &cfg)?;
//! let ids = Tensor::from_slice(&[5i64, 7, 9, 11]).view([1, 4]);
//! let full = model.forward(&LmInput::new(&ids), None)?.logits()?;
//! assert_eq!(full.size(), vec![1, 4, 50]);
//! // the same logits, one token at a time through a cache
//! let mut cache = model.new_cache();
//! for t in 0..4 {
//!     let step = model.forward(&LmInput::new(&ids.narrow(1, t, 1)), Some(&mut cache))?.logits()?;
//!     let diff = (step.squeeze_dim(1) - full.select(1, t)).abs().max().double_value(&[]);
//!     assert!(diff < 1e-5, "{diff}");
//! }
//! assert_eq!(cache.len(), 4);
//! // an id outside the vocabulary is an error naming it
//! assert!(model.forward(&LmInput::new(&Tensor::from_slice(&[50i64]).view([1, 1])), None).is_err());
//! # Ok(()) }
//! ```

pub mod config;

use std::fmt;
use std::path::Path as FsPath;

use tch::nn::Path;
use tch::Tensor;

pub use self::config::Gpt2Config;
use crate::error::Result;
use crate::modules::llm::causal_lm::{CausalLm, CausalLmConfig, LmFacts};
use crate::modules::llm::nn::{
    copy_var, prefixed, randn_var, Attention, AttentionShape, Decoder, DecoderBlock, FeedForward,
    LayerNorm, Linear, Mlp, QkvProjection, WeightLayout,
};
use crate::modules::llm::scoring::{score_model, ScoreRequest, ScoreTokens, TokenScores};
use crate::modules::llm::weights::{check_folder_fits, CONFIG_FILE};

/// GPT-2's LM head and the token embedding it is tied to, by `transformers`' names.
pub(crate) const TIED_LM_HEAD: (&str, &str) = ("lm_head.weight", "transformer.wte.weight");

/// GPT-2 with its tied LM head. See the [module docs](self).
pub struct Gpt2Model {
    config: Gpt2Config,
    facts: LmFacts,
    wte: Tensor,
    wpe: Tensor,
    decoder: Decoder,
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

/// Block `index` under `p` (`transformer.h.{index}`), GPT-2's names and init.
fn block(p: &Path<'_>, cfg: &Gpt2Config, index: i64) -> Result<DecoderBlock> {
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
    let conv = |name: &str, n_in: i64, n_out: i64, std: f64| {
        Linear::new(p, name, n_in, n_out, true, WeightLayout::InOut, std)
    };
    let eps = cfg.layer_norm_epsilon;
    let ln_1 = LayerNorm::new(p, "ln_1", e, eps)?;
    let c_attn = conv("attn.c_attn", e, 3 * e, std)?;
    let c_proj = conv("attn.c_proj", e, e, proj_std)?;
    let ln_2 = LayerNorm::new(p, "ln_2", e, eps)?;
    let c_fc = conv("mlp.c_fc", e, cfg.inner_dim(), std)?;
    let mlp_proj = conv("mlp.c_proj", cfg.inner_dim(), e, proj_std)?;
    let shape = AttentionShape {
        n_head: cfg.n_head,
        n_kv_head: cfg.n_head,
        head_dim: cfg.head_dim(),
        score_divisor,
    };
    let attn = Attention::new(QkvProjection::Fused(c_attn), c_proj, shape)?;
    let mlp = FeedForward::Plain(Mlp::new(c_fc, mlp_proj, cfg.activation()?));
    Ok(DecoderBlock::new(ln_1.into(), attn, ln_2.into(), mlp))
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
        let (v, e, n) = (config.vocab_size, config.n_embd, config.n_positions);
        let wte = randn_var(&(&t / "wte"), "weight", &[v, e], 0.0, std)?;
        let wpe = randn_var(&(&t / "wpe"), "weight", &[n, e], 0.0, std)?;
        let blocks = (0..config.n_layer)
            .map(|i| block(&(&t / "h" / i), config, i))
            .collect::<Result<Vec<_>>>()?;
        let ln_f = LayerNorm::new(&t, "ln_f", config.n_embd, config.layer_norm_epsilon)?;
        Ok(Gpt2Model {
            facts: config.facts(),
            config: config.clone(),
            wte,
            wpe,
            decoder: Decoder::new(blocks, ln_f.into(), None),
        })
    }

    /// Builds the model under `path` from a `transformers` folder: `config.json` and
    /// `model.safetensors`.
    ///
    /// # Errors
    /// A missing or invalid config, or weights that do not fit it (named).
    pub fn from_pretrained(path: &Path<'_>, dir: impl AsRef<FsPath>) -> Result<Self> {
        let dir = dir.as_ref();
        let config_file = dir.join(CONFIG_FILE);
        let config = Gpt2Config::from_json_file(&config_file)?;
        let op = "Gpt2Model::from_pretrained";
        let shapes = config.weight_shapes();
        check_folder_fits(op, dir, &config_file, &shapes, Some(TIED_LM_HEAD))?;
        // built and loaded aside: a late failure adds nothing to the caller's store
        crate::modules::llm::nn::build_staged(path, |path| {
            let model = Gpt2Model::new(path, &config)?;
            model.load_folder(dir)?;
            Ok(model)
        })
    }

    /// The configuration.
    pub fn config(&self) -> &Gpt2Config {
        &self.config
    }

    /// The token embedding, `[vocab, n_embd]` (also the LM head's weight).
    pub fn wte(&self) -> &Tensor {
        &self.wte
    }

    /// The position embedding, `[n_positions, n_embd]`.
    pub fn wpe(&self) -> &Tensor {
        &self.wpe
    }
}

impl CausalLm for Gpt2Model {
    fn facts(&self) -> &LmFacts {
        &self.facts
    }

    fn decoder(&self) -> &Decoder {
        &self.decoder
    }

    fn decoder_mut(&mut self) -> &mut Decoder {
        &mut self.decoder
    }

    /// `transformer.h.{index}`.
    fn block_name(&self, index: usize) -> String {
        format!("transformer.h.{index}")
    }

    fn embed(&self, input_ids: &Tensor, position_ids: &Tensor) -> Result<Tensor> {
        let tok = Tensor::f_embedding(&self.wte, input_ids, -1, false, false)?;
        Ok(tok.f_add(&Tensor::f_embedding(
            &self.wpe,
            position_ids,
            -1,
            false,
            false,
        )?)?)
    }

    fn lm_head_weight(&self) -> &Tensor {
        &self.wte
    }

    fn embedding_parameters(&self) -> Vec<&Tensor> {
        vec![&self.wte, &self.wpe]
    }

    /// `transformer.wte.weight`, `transformer.wpe.weight`, the blocks (`transformer.h.{i}.*`),
    /// `transformer.ln_f.*`. The LM head is the token embedding and is not listed twice.
    fn named_parameters(&self) -> Vec<(String, &Tensor)> {
        let mut out = vec![
            ("transformer.wte.weight".to_string(), &self.wte),
            ("transformer.wpe.weight".to_string(), &self.wpe),
        ];
        for (i, b) in self.decoder.blocks().iter().enumerate() {
            out.extend(prefixed(
                &format!("transformer.h.{i}."),
                b.named_parameters(),
            ));
        }
        out.extend(prefixed(
            "transformer.",
            self.decoder.norm().named_parameters(),
        ));
        out
    }

    fn copy_to(&self, path: &Path<'_>) -> Result<Box<dyn CausalLm>> {
        let t = path / "transformer";
        Ok(Box::new(Gpt2Model {
            config: self.config.clone(),
            facts: self.facts.clone(),
            wte: copy_var(&(&t / "wte"), "weight", &self.wte)?,
            wpe: copy_var(&(&t / "wpe"), "weight", &self.wpe)?,
            decoder: self.decoder.copy_to(&(&t / "h"), &t)?,
        }))
    }

    fn config_json(&self) -> Result<String> {
        self.config.to_json_string()
    }
}

impl ScoreTokens for Gpt2Model {
    fn score_tokens(&self, t: &Tensor, m: &Tensor, r: ScoreRequest) -> Result<TokenScores> {
        score_model(self, t, m, r)
    }

    fn generating_model(&self) -> Option<&dyn CausalLm> {
        Some(self)
    }
}

impl CausalLmConfig for Gpt2Config {
    fn build(&self, path: &Path<'_>) -> Result<Box<dyn CausalLm>> {
        Ok(Box::new(Gpt2Model::new(path, self)?))
    }
    fn facts(&self) -> LmFacts {
        Gpt2Config::facts(self)
    }
}
