//! The Llama family: [`LlamaModel`] for `transformers`' `LlamaForCausalLM` and the models that
//! share its shape, by `model_type`:
//! - `"llama"` (Llama 2 / 3 / 3.1 / 3.2, SmolLM, TinyLlama): RMSNorm, SwiGLU, rotary embeddings
//!   (`default`, `linear`, `llama3` scaling), grouped-query attention, `attention_bias` /
//!   `mlp_bias`, `head_dim` when given, tied or untied LM head;
//! - `"mistral"`: the same without biases; a `sliding_window` shorter than the context is
//!   refused by name (not implemented), a longer one is accepted (it never applies);
//! - `"qwen2"`: q/k/v biases (always), large rope theta, tied embeddings on the small sizes;
//! - `"qwen3"`: per-head RMS norms on q and k, `head_dim` independent of hidden / heads,
//!   `attention_bias`.
//!
//! [`LlamaConfig`] reads `config.json` in both forms found in the wild: `rope_theta` +
//! `rope_scaling` (`transformers` 4.x; `rope_type` or the older `type`) and `rope_parameters`
//! (5.x). A rope type or a field value this file does not implement is an error that names
//! it. Parameter names are `transformers`' (`model.layers.{i}.self_attn.q_proj.weight`, …).
//!
//! ```
//! use tch::{nn::VarStore, Device, Tensor};
//! use torchrl::modules::llm::models::llama::{LlamaConfig, LlamaModel};
//! use torchrl::modules::llm::{CausalLm, LmInput};
//! # fn main() -> torchrl::Result<()> {
//! let cfg: LlamaConfig = serde_json::from_str(r#"{"model_type": "qwen3", "vocab_size": 50,
//!     "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
//!     "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
//!     "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"}}"#).unwrap();
//! let vs = VarStore::new(Device::Cpu);
//! let model = LlamaModel::new(&vs.root(), &cfg)?;
//! let ids = Tensor::from_slice(&[1i64, 2, 3]).view([1, 3]);
//! assert_eq!(model.forward(&LmInput::new(&ids), None)?.logits()?.size(), vec![1, 3, 50]);
//! // an unimplemented rope type is refused by name
//! let bad: LlamaConfig = serde_json::from_str(r#"{"vocab_size": 50,
//!     "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}"#).unwrap();
//! assert!(bad.validate().unwrap_err().to_string().contains("yarn"));
//! # Ok(()) }
//! ```

use std::fmt;
use std::path::Path as FsPath;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tch::nn::Path;
use tch::Tensor;

use crate::error::{require, Error, Result};
use crate::modules::llm::causal_lm::{CausalLm, CausalLmConfig, LmFacts};
use crate::modules::llm::limits;
use crate::modules::llm::nn::{
    copy_var, prefixed, randn_var, Activation, Attention, AttentionShape, Decoder, DecoderBlock,
    FeedForward, GatedMlp, Linear, QkvProjection, RmsNorm, RopeScaling, RotaryEmbedding,
    WeightLayout,
};
use crate::modules::llm::scoring::{score_model, ScoreRequest, ScoreTokens, TokenScores};
use crate::modules::llm::weights::{check_folder_fits, config_json, read_config, CONFIG_FILE};

/// The `model_type`s this file builds.
pub const LLAMA_FAMILY: &[&str] = &["llama", "mistral", "qwen2", "qwen3"];

/// A special token id as `config.json` writes it: one id or a list (the first is used).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum TokenIds {
    /// One id.
    One(i64),
    /// Several ids (Llama 3's EOS list).
    Many(Vec<i64>),
}

impl TokenIds {
    /// The first id.
    pub fn first(&self) -> Option<i64> {
        match self {
            TokenIds::One(i) => Some(*i),
            TokenIds::Many(v) => v.first().copied(),
        }
    }
}

fn default_model_type() -> String {
    "llama".into()
}
fn d_hidden() -> i64 {
    4096
}
fn d_inter() -> i64 {
    11008
}
fn d_layers() -> i64 {
    32
}
fn d_heads() -> i64 {
    32
}
fn d_act() -> String {
    "silu".into()
}
fn d_ctx() -> i64 {
    2048
}
fn d_eps() -> f64 {
    1e-6
}
fn d_init() -> f64 {
    0.02
}

/// A Llama-family configuration with `transformers`' field names and defaults (Llama 2 7B's
/// shape; the vocabulary is required). Fields that do not change the forward pass
/// (dropouts, `use_cache`, `architectures`, …) are accepted and ignored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LlamaConfig {
    /// `"llama"`, `"mistral"`, `"qwen2"` or `"qwen3"`.
    #[serde(default = "default_model_type")]
    pub model_type: String,
    /// Vocabulary size.
    pub vocab_size: i64,
    /// Width of the residual stream.
    #[serde(default = "d_hidden")]
    pub hidden_size: i64,
    /// Width of the MLP.
    #[serde(default = "d_inter")]
    pub intermediate_size: i64,
    /// Number of blocks.
    #[serde(default = "d_layers")]
    pub num_hidden_layers: i64,
    /// Query heads.
    #[serde(default = "d_heads")]
    pub num_attention_heads: i64,
    /// Key-value heads (`None`: as many as the query heads).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_key_value_heads: Option<i64>,
    /// Width of a head (`None`: `hidden_size / num_attention_heads`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_dim: Option<i64>,
    /// The MLP activation (`"silu"`).
    #[serde(default = "d_act")]
    pub hidden_act: String,
    /// Context length.
    #[serde(default = "d_ctx")]
    pub max_position_embeddings: i64,
    /// RMSNorm epsilon.
    #[serde(default = "d_eps")]
    pub rms_norm_eps: f64,
    /// The rotary base (4.x form; 5.x puts it in `rope_parameters`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_theta: Option<f64>,
    /// The rotary scaling (4.x form).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_scaling: Option<Value>,
    /// The rotary base and scaling (5.x form).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_parameters: Option<Value>,
    /// Biases on the attention projections (Llama, Qwen3; Qwen2's q/k/v always have them).
    #[serde(default)]
    pub attention_bias: bool,
    /// Biases on the MLP projections (Llama).
    #[serde(default)]
    pub mlp_bias: bool,
    /// Whether the LM head is the token embedding.
    #[serde(default)]
    pub tie_word_embeddings: bool,
    /// The std of the random initialisation.
    #[serde(default = "d_init")]
    pub initializer_range: f64,
    /// Beginning-of-sequence id(s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bos_token_id: Option<TokenIds>,
    /// End-of-sequence id(s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eos_token_id: Option<TokenIds>,
    /// Padding id(s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pad_token_id: Option<TokenIds>,
    /// Mistral's / Qwen's sliding attention window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sliding_window: Option<i64>,
    /// Qwen's switch for the sliding window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub use_sliding_window: Option<bool>,
}

/// A finite positive number from a rope table, or the error naming it.
fn rope_number(table: &Value, field: &'static str, default: Option<f64>) -> Result<f64> {
    match (table.get(field), default) {
        (Some(v), _) => v
            .as_f64()
            .ok_or_else(|| Error::config("LlamaConfig", field, "a number", v.to_string())),
        (None, Some(d)) => Ok(d),
        (None, None) => Err(Error::config(
            "LlamaConfig",
            field,
            "a value in the rope table",
            "none",
        )),
    }
}

impl LlamaConfig {
    /// The width of a head.
    pub fn head_dim(&self) -> i64 {
        self.head_dim.unwrap_or_else(|| {
            if self.num_attention_heads > 0 {
                self.hidden_size / self.num_attention_heads
            } else {
                0
            }
        })
    }

    /// The key-value head count.
    pub fn kv_heads(&self) -> i64 {
        self.num_key_value_heads.unwrap_or(self.num_attention_heads)
    }

    /// The rotary base and scaling, from either form of `config.json`.
    ///
    /// # Errors
    /// A rope type other than `default`, `linear`, `llama3` (named), or a missing factor.
    pub fn rope(&self) -> Result<(f64, RopeScaling)> {
        let table = self.rope_parameters.as_ref().or(self.rope_scaling.as_ref());
        let default_theta = if self.model_type.starts_with("qwen") {
            1_000_000.0
        } else {
            10_000.0
        };
        let theta = match (&self.rope_parameters, self.rope_theta) {
            (Some(p), _) if p.get("rope_theta").is_some() => rope_number(p, "rope_theta", None)?,
            (_, Some(t)) => t,
            _ => default_theta,
        };
        let Some(table) = table.filter(|t| !t.is_null()) else {
            return Ok((theta, RopeScaling::Default));
        };
        let kind = table
            .get("rope_type")
            .or_else(|| table.get("type"))
            .and_then(Value::as_str)
            .unwrap_or("default");
        let scaling =
            match kind {
                "default" => RopeScaling::Default,
                "linear" => RopeScaling::Linear {
                    factor: rope_number(table, "factor", None)?,
                },
                "llama3" => RopeScaling::Llama3 {
                    factor: rope_number(table, "factor", None)?,
                    low_freq_factor: rope_number(table, "low_freq_factor", None)?,
                    high_freq_factor: rope_number(table, "high_freq_factor", None)?,
                    original_max_position_embeddings: rope_number(
                        table,
                        "original_max_position_embeddings",
                        None,
                    )?,
                },
                other => return Err(Error::config(
                    "LlamaConfig",
                    "rope_type",
                    "\"default\", \"linear\" or \"llama3\" (other rope types are not implemented)",
                    format!("{other:?}"),
                )),
            };
        Ok((theta, scaling))
    }

    /// Checks every field this file reads (sizes, head counts, the activation, the rope table,
    /// the sliding window), naming the first that does not fit.
    pub fn validate(&self) -> Result<()> {
        let op = "LlamaConfig";
        require(
            LLAMA_FAMILY.contains(&self.model_type.as_str()),
            op,
            "model_type",
            format!("one of {}", LLAMA_FAMILY.join(", ")),
            format!("{:?}", self.model_type),
        )?;
        for (field, v, max) in [
            ("vocab_size", self.vocab_size, limits::MAX_DIM),
            ("hidden_size", self.hidden_size, limits::MAX_DIM),
            ("intermediate_size", self.intermediate_size, limits::MAX_DIM),
            (
                "num_hidden_layers",
                self.num_hidden_layers,
                limits::MAX_LAYERS,
            ),
            (
                "num_attention_heads",
                self.num_attention_heads,
                limits::MAX_DIM,
            ),
            ("num_key_value_heads", self.kv_heads(), limits::MAX_DIM),
            (
                "max_position_embeddings",
                self.max_position_embeddings,
                limits::MAX_POSITIONS,
            ),
        ] {
            limits::size(op, field, v, max)?;
        }
        require(
            self.num_attention_heads % self.kv_heads() == 0,
            op,
            "num_key_value_heads",
            format!(
                "a divisor of num_attention_heads = {}",
                self.num_attention_heads
            ),
            self.kv_heads(),
        )?;
        let hd = self.head_dim();
        require(
            hd > 0 && hd % 2 == 0 && hd <= limits::MAX_DIM,
            op,
            "head_dim",
            format!("a positive even width of at most {}", limits::MAX_DIM),
            hd,
        )?;
        // the projections' widths: checked before any layer is sized by them
        let heads = self.num_attention_heads;
        limits::product(op, "head_dim", heads, hd, limits::MAX_DIM)?;
        let eps = self.rms_norm_eps;
        require(
            eps.is_finite() && eps > 0.0,
            op,
            "rms_norm_eps",
            "a finite number > 0",
            eps,
        )?;
        // the random init's std (a model built from the config alone uses it), as GPT-2's
        let std = self.initializer_range;
        require(
            std.is_finite() && std >= 0.0,
            op,
            "initializer_range",
            "a finite number >= 0",
            std,
        )?;
        if Activation::from_name(&self.hidden_act).is_none() {
            return Err(Error::config(
                op,
                "hidden_act",
                format!("one of {}", Activation::NAMES),
                format!("{:?}", self.hidden_act),
            ));
        }
        let sliding = match self.model_type.as_str() {
            "mistral" => self.sliding_window,
            _ if self.use_sliding_window == Some(true) => self.sliding_window,
            _ => None,
        };
        if let Some(w) = sliding {
            require(
                w >= self.max_position_embeddings,
                op,
                "sliding_window",
                format!(
                    "at least max_position_embeddings = {} (a shorter window is not implemented)",
                    self.max_position_embeddings
                ),
                w,
            )?;
        }
        let (theta, scaling) = self.rope()?;
        // the rotary table's own check, before any block is built
        RotaryEmbedding::check(hd, theta, &scaling)?;
        limits::parameter_count(op, "num_hidden_layers", self.weight_shapes().values())?;
        Ok(())
    }

    /// The shape of every tensor of a model of this config, by `transformers`' name (the LM
    /// head only when untied), computed without building the model: what a weight file's
    /// header is checked against before anything is allocated. Call it on a validated config
    /// (sizes saturate otherwise).
    pub fn weight_shapes(&self) -> std::collections::BTreeMap<String, Vec<i64>> {
        let (v, e, i) = (self.vocab_size, self.hidden_size, self.intermediate_size);
        let d = self.head_dim();
        let (q, kv) = (
            self.num_attention_heads.saturating_mul(d),
            self.kv_heads().saturating_mul(d),
        );
        let qkv_bias = self.attention_bias || self.model_type == "qwen2";
        let o_bias = self.attention_bias && self.model_type != "qwen2";
        let mut out = std::collections::BTreeMap::new();
        out.insert("model.embed_tokens.weight".to_string(), vec![v, e]);
        for l in 0..self.num_hidden_layers.clamp(0, limits::MAX_LAYERS) {
            let p = format!("model.layers.{l}.");
            let mut add = |name: &str, shape: Vec<i64>| {
                out.insert(format!("{p}{name}"), shape);
            };
            for (name, n_out) in [("q_proj", q), ("k_proj", kv), ("v_proj", kv)] {
                add(&format!("self_attn.{name}.weight"), vec![n_out, e]);
                if qkv_bias {
                    add(&format!("self_attn.{name}.bias"), vec![n_out]);
                }
            }
            add("self_attn.o_proj.weight", vec![e, q]);
            if o_bias {
                add("self_attn.o_proj.bias", vec![e]);
            }
            if self.model_type == "qwen3" {
                add("self_attn.q_norm.weight", vec![d]);
                add("self_attn.k_norm.weight", vec![d]);
            }
            for (name, shape) in [
                ("mlp.gate_proj", vec![i, e]),
                ("mlp.up_proj", vec![i, e]),
                ("mlp.down_proj", vec![e, i]),
            ] {
                let rows = shape.first().copied().unwrap_or(0);
                add(&format!("{name}.weight"), shape);
                if self.mlp_bias {
                    add(&format!("{name}.bias"), vec![rows]);
                }
            }
            add("input_layernorm.weight", vec![e]);
            add("post_attention_layernorm.weight", vec![e]);
        }
        out.insert("model.norm.weight".to_string(), vec![e]);
        if !self.tie_word_embeddings {
            out.insert("lm_head.weight".to_string(), vec![v, e]);
        }
        out
    }

    /// Reads a `transformers` `config.json` and validates it.
    ///
    /// # Errors
    /// An unreadable file, JSON that is not a Llama-family config, or an invalid field.
    pub fn from_json_file(path: impl AsRef<FsPath>) -> Result<Self> {
        let (op, path) = ("LlamaConfig::from_json_file", path.as_ref());
        let cfg: LlamaConfig = read_config(op, path, "Llama-family")?;
        // the field is named by validate, the file here
        cfg.validate()
            .map_err(|e| e.context(format!("{op}: {}", path.display())))?;
        Ok(cfg)
    }

    /// The facts a model of this config has.
    pub fn facts(&self) -> LmFacts {
        LmFacts {
            model_type: self.model_type.clone(),
            vocab_size: self.vocab_size,
            hidden_size: self.hidden_size,
            n_layer: usize::try_from(self.num_hidden_layers).unwrap_or(0),
            max_positions: self.max_position_embeddings,
            tie_word_embeddings: self.tie_word_embeddings,
            initializer_range: self.initializer_range,
            bos_token_id: self.bos_token_id.as_ref().and_then(TokenIds::first),
            eos_token_id: self.eos_token_id.as_ref().and_then(TokenIds::first),
            pad_token_id: self.pad_token_id.as_ref().and_then(TokenIds::first),
        }
    }

    /// The tied LM head and the embedding it is tied to, when tied.
    pub(crate) fn tied_lm_head(&self) -> Option<(&'static str, &'static str)> {
        self.tie_word_embeddings
            .then_some(("lm_head.weight", "model.embed_tokens.weight"))
    }

    fn architecture(&self) -> &'static str {
        match self.model_type.as_str() {
            "mistral" => "MistralForCausalLM",
            "qwen2" => "Qwen2ForCausalLM",
            "qwen3" => "Qwen3ForCausalLM",
            _ => "LlamaForCausalLM",
        }
    }
}

/// A Llama-family causal LM. See the [module docs](self).
pub struct LlamaModel {
    config: LlamaConfig,
    facts: LmFacts,
    embed_tokens: Tensor,
    decoder: Decoder,
    lm_head: Option<Tensor>,
}

impl fmt::Debug for LlamaModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LlamaModel")
            .field("model_type", &self.config.model_type)
            .field("layers", &self.config.num_hidden_layers)
            .field("hidden_size", &self.config.hidden_size)
            .finish_non_exhaustive()
    }
}

/// Block `index` under `p` (`model.layers.{index}`), `transformers`' names and init.
fn block(p: &Path<'_>, cfg: &LlamaConfig) -> Result<DecoderBlock> {
    let (e, h, kv, d) = (
        cfg.hidden_size,
        cfg.num_attention_heads,
        cfg.kv_heads(),
        cfg.head_dim(),
    );
    let std = cfg.initializer_range;
    let lin = |name: &str, n_in: i64, n_out: i64, bias: bool| {
        Linear::new(p, name, n_in, n_out, bias, WeightLayout::OutIn, std)
    };
    let qkv_bias = cfg.attention_bias || cfg.model_type == "qwen2";
    let o_bias = cfg.attention_bias && cfg.model_type != "qwen2";
    let qkv = QkvProjection::Separate {
        q: lin("self_attn.q_proj", e, h * d, qkv_bias)?,
        k: lin("self_attn.k_proj", e, kv * d, qkv_bias)?,
        v: lin("self_attn.v_proj", e, kv * d, qkv_bias)?,
    };
    let shape = AttentionShape {
        n_head: h,
        n_kv_head: kv,
        head_dim: d,
        score_divisor: (d as f64).sqrt(),
    };
    let mut attn = Attention::new(qkv, lin("self_attn.o_proj", h * d, e, o_bias)?, shape)?;
    if cfg.model_type == "qwen3" {
        attn = attn.with_qk_norm(
            RmsNorm::new(p, "self_attn.q_norm", d, cfg.rms_norm_eps)?,
            RmsNorm::new(p, "self_attn.k_norm", d, cfg.rms_norm_eps)?,
        );
    }
    let act = Activation::from_name(&cfg.hidden_act).unwrap_or(Activation::Silu);
    let i = cfg.intermediate_size;
    let mlp = FeedForward::Gated(GatedMlp::new(
        lin("mlp.gate_proj", e, i, cfg.mlp_bias)?,
        lin("mlp.up_proj", e, i, cfg.mlp_bias)?,
        lin("mlp.down_proj", i, e, cfg.mlp_bias)?,
        act,
    ));
    let eps = cfg.rms_norm_eps;
    Ok(DecoderBlock::new(
        RmsNorm::new(p, "input_layernorm", e, eps)?.into(),
        attn,
        RmsNorm::new(p, "post_attention_layernorm", e, eps)?.into(),
        mlp,
    ))
}

impl LlamaModel {
    /// A randomly initialised model (normal with `initializer_range` std, unit norms, zero
    /// biases: `transformers`' init) under `path` with `transformers`' names.
    ///
    /// # Errors
    /// An invalid config (named by field).
    pub fn new(path: &Path<'_>, config: &LlamaConfig) -> Result<Self> {
        config.validate()?;
        let (theta, scaling) = config.rope()?;
        let m = path / "model";
        let std = config.initializer_range;
        let (v, e) = (config.vocab_size, config.hidden_size);
        let embed_tokens = randn_var(&(&m / "embed_tokens"), "weight", &[v, e], 0.0, std)?;
        let blocks = (0..config.num_hidden_layers)
            .map(|i| block(&(&m / "layers" / i), config))
            .collect::<Result<Vec<_>>>()?;
        let norm = RmsNorm::new(&m, "norm", e, config.rms_norm_eps)?;
        let rope = RotaryEmbedding::new(config.head_dim(), theta, &scaling, path.device())?;
        let lm_head = if config.tie_word_embeddings {
            None
        } else {
            Some(randn_var(&(path / "lm_head"), "weight", &[v, e], 0.0, std)?)
        };
        Ok(LlamaModel {
            facts: config.facts(),
            config: config.clone(),
            embed_tokens,
            decoder: Decoder::new(blocks, norm.into(), Some(rope)),
            lm_head,
        })
    }

    /// Builds the model under `path` from a `transformers` folder (`config.json`,
    /// `model.safetensors`).
    ///
    /// # Errors
    /// A missing or invalid config, or weights that do not fit it (named).
    pub fn from_pretrained(path: &Path<'_>, dir: impl AsRef<FsPath>) -> Result<Self> {
        let dir = dir.as_ref();
        let config_file = dir.join(CONFIG_FILE);
        let config = LlamaConfig::from_json_file(&config_file)?;
        let op = "LlamaModel::from_pretrained";
        let shapes = config.weight_shapes();
        check_folder_fits(op, dir, &config_file, &shapes, config.tied_lm_head())?;
        // built and loaded aside: a late failure adds nothing to the caller's store
        crate::modules::llm::nn::build_staged(path, |path| {
            let model = LlamaModel::new(path, &config)?;
            model.load_folder(dir)?;
            Ok(model)
        })
    }

    /// The configuration.
    pub fn config(&self) -> &LlamaConfig {
        &self.config
    }
}

impl CausalLm for LlamaModel {
    fn facts(&self) -> &LmFacts {
        &self.facts
    }

    fn decoder(&self) -> &Decoder {
        &self.decoder
    }

    fn decoder_mut(&mut self) -> &mut Decoder {
        &mut self.decoder
    }

    /// `model.layers.{index}`.
    fn block_name(&self, index: usize) -> String {
        format!("model.layers.{index}")
    }

    /// The token embedding (positions enter through the rotary table).
    fn embed(&self, input_ids: &Tensor, _position_ids: &Tensor) -> Result<Tensor> {
        Ok(Tensor::f_embedding(
            &self.embed_tokens,
            input_ids,
            -1,
            false,
            false,
        )?)
    }

    fn lm_head_weight(&self) -> &Tensor {
        self.lm_head.as_ref().unwrap_or(&self.embed_tokens)
    }

    fn embedding_parameters(&self) -> Vec<&Tensor> {
        vec![&self.embed_tokens]
    }

    /// `model.embed_tokens.weight`, `model.layers.{i}.*`, `model.norm.weight`, and
    /// `lm_head.weight` when untied.
    fn named_parameters(&self) -> Vec<(String, &Tensor)> {
        let mut out = vec![("model.embed_tokens.weight".to_string(), &self.embed_tokens)];
        for (i, b) in self.decoder.blocks().iter().enumerate() {
            out.extend(prefixed(
                &format!("model.layers.{i}."),
                b.named_parameters(),
            ));
        }
        out.extend(prefixed("model.", self.decoder.norm().named_parameters()));
        if let Some(h) = &self.lm_head {
            out.push(("lm_head.weight".to_string(), h));
        }
        out
    }

    fn copy_to(&self, path: &Path<'_>) -> Result<Box<dyn CausalLm>> {
        let m = path / "model";
        Ok(Box::new(LlamaModel {
            config: self.config.clone(),
            facts: self.facts.clone(),
            embed_tokens: copy_var(&(&m / "embed_tokens"), "weight", &self.embed_tokens)?,
            decoder: self.decoder.copy_to(&(&m / "layers"), &m)?,
            lm_head: match &self.lm_head {
                Some(h) => Some(copy_var(&(path / "lm_head"), "weight", h)?),
                None => None,
            },
        }))
    }

    /// The config, with `architectures` and the resolved head layout (so that every reader
    /// sees the same shape; no nulls: `transformers`' Qwen2 refuses `"head_dim": null`).
    fn config_json(&self) -> Result<String> {
        config_json(
            "LlamaConfig::to_json_string",
            &self.config,
            self.config.architecture(),
            &[
                ("head_dim", Value::from(self.config.head_dim())),
                ("num_key_value_heads", Value::from(self.config.kv_heads())),
            ],
        )
    }
}

impl ScoreTokens for LlamaModel {
    fn score_tokens(&self, t: &Tensor, m: &Tensor, r: ScoreRequest) -> Result<TokenScores> {
        score_model(self, t, m, r)
    }

    fn generating_model(&self) -> Option<&dyn CausalLm> {
        Some(self)
    }
}

impl CausalLmConfig for LlamaConfig {
    fn build(&self, path: &Path<'_>) -> Result<Box<dyn CausalLm>> {
        Ok(Box::new(LlamaModel::new(path, self)?))
    }
    fn facts(&self) -> LmFacts {
        LlamaConfig::facts(self)
    }
}
