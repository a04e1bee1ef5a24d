//! [`Gpt2Config`]: the shape of a GPT-2 model, read from and written to Hugging Face's
//! `config.json` (the `transformers` field names), built in burn's style
//! (`Gpt2Config::new(vocab).with_*()`), checked before any tensor is made.
//!
//! ```
//! use torchrl::modules::llm::nn::Activation;
//! use torchrl::modules::llm::Gpt2Config;
//! let cfg = Gpt2Config::new(259).with_n_layer(4).with_n_embd(128).with_n_head(4);
//! cfg.validate()?;
//! assert_eq!(cfg.inner_dim(), 512); // n_inner defaults to 4 * n_embd
//! assert_eq!(cfg.activation()?, Activation::GeluNew);
//! // a width that does not split into the heads is refused, naming the fields
//! let err = Gpt2Config::new(259).with_n_embd(130).with_n_head(4).validate().unwrap_err();
//! assert!(err.to_string().contains("n_embd"), "{err}");
//! # Ok::<(), torchrl::Error>(())
//! ```

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{require, Error, Result};
use crate::macros::setters;
use crate::modules::llm::causal_lm::LmFacts;
use crate::modules::llm::limits;
use crate::modules::llm::nn::Activation;
use crate::modules::llm::weights::{config_json, read_config};

fn default_n_positions() -> i64 {
    1024
}
fn default_n_embd() -> i64 {
    768
}
fn default_n_layer() -> i64 {
    12
}
fn default_n_head() -> i64 {
    12
}
fn default_eps() -> f64 {
    1e-5
}
fn default_activation() -> String {
    "gelu_new".to_string()
}
fn default_init_range() -> f64 {
    0.02
}
fn default_true() -> bool {
    true
}

/// A GPT-2 configuration, with `transformers`' `GPT2Config` field names and defaults
/// (GPT-2 small: 12 layers × 768 wide, 12 heads, 1024 positions; the vocabulary is required).
///
/// Fields of `config.json` that do not change the forward pass in evaluation (dropouts,
/// summary settings, `architectures`, …) are accepted and ignored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Gpt2Config {
    /// Vocabulary size (rows of the token embedding and of the tied LM head).
    pub vocab_size: i64,
    /// Context length (rows of the position embedding).
    #[serde(default = "default_n_positions")]
    pub n_positions: i64,
    /// Width of the residual stream.
    #[serde(default = "default_n_embd")]
    pub n_embd: i64,
    /// Number of transformer blocks.
    #[serde(default = "default_n_layer")]
    pub n_layer: i64,
    /// Number of attention heads (`n_embd` must be a multiple of it).
    #[serde(default = "default_n_head")]
    pub n_head: i64,
    /// Width of the MLP's hidden layer; `None` means `4 * n_embd`.
    #[serde(default)]
    pub n_inner: Option<i64>,
    /// Layer-norm epsilon.
    #[serde(default = "default_eps")]
    pub layer_norm_epsilon: f64,
    /// The MLP activation's `transformers` name (see [`Activation::from_name`]).
    #[serde(default = "default_activation")]
    pub activation_function: String,
    /// Standard deviation of the random initialisation (embeddings and projections).
    #[serde(default = "default_init_range")]
    pub initializer_range: f64,
    /// Divide attention scores by `sqrt(head_dim)` (GPT-2 does).
    #[serde(default = "default_true")]
    pub scale_attn_weights: bool,
    /// Also divide the scores of block `i` by `i + 1` (off in GPT-2).
    #[serde(default)]
    pub scale_attn_by_inverse_layer_idx: bool,
    /// Beginning-of-sequence token id, if the checkpoint names one.
    #[serde(default)]
    pub bos_token_id: Option<i64>,
    /// End-of-sequence token id, if the checkpoint names one.
    #[serde(default)]
    pub eos_token_id: Option<i64>,
    /// Padding token id, if the checkpoint names one.
    #[serde(default)]
    pub pad_token_id: Option<i64>,
    /// Whether the LM head shares the token embedding (GPT-2 ties them; only `true` is
    /// supported).
    #[serde(default = "default_true")]
    pub tie_word_embeddings: bool,
    /// `"gpt2"`, as `transformers` writes it.
    #[serde(default = "default_model_type")]
    pub model_type: String,
}

fn default_model_type() -> String {
    "gpt2".to_string()
}

impl Default for Gpt2Config {
    /// GPT-2 small with GPT-2's vocabulary (50257).
    fn default() -> Self {
        Gpt2Config::new(50257)
    }
}

impl Gpt2Config {
    /// GPT-2 small's shape with the given vocabulary size.
    pub fn new(vocab_size: i64) -> Self {
        Gpt2Config {
            vocab_size,
            n_positions: default_n_positions(),
            n_embd: default_n_embd(),
            n_layer: default_n_layer(),
            n_head: default_n_head(),
            n_inner: None,
            layer_norm_epsilon: default_eps(),
            activation_function: default_activation(),
            initializer_range: default_init_range(),
            scale_attn_weights: true,
            scale_attn_by_inverse_layer_idx: false,
            bos_token_id: None,
            eos_token_id: None,
            pad_token_id: None,
            tie_word_embeddings: true,
            model_type: default_model_type(),
        }
    }

    setters! {
        /// Sets the context length.
        with_n_positions(n_positions: i64);
        /// Sets the width.
        with_n_embd(n_embd: i64);
        /// Sets the number of blocks.
        with_n_layer(n_layer: i64);
        /// Sets the number of heads.
        with_n_head(n_head: i64);
        /// Sets the layer-norm epsilon.
        with_layer_norm_epsilon(layer_norm_epsilon: f64);
        /// Sets the initialisation's standard deviation.
        with_initializer_range(initializer_range: f64);
        /// Sets the MLP's hidden width.
        with_n_inner(n: i64) => n_inner = Some(n);
        /// Sets the activation by its `transformers` name.
        with_activation_function(name: impl Into<String>) => activation_function = name.into();
    }

    /// Sets the special token ids (`None` leaves one unset).
    pub fn with_special_tokens(
        mut self,
        bos: impl Into<Option<i64>>,
        eos: impl Into<Option<i64>>,
        pad: impl Into<Option<i64>>,
    ) -> Self {
        self.bos_token_id = bos.into();
        self.eos_token_id = eos.into();
        self.pad_token_id = pad.into();
        self
    }

    /// The MLP's hidden width (`n_inner`, or `4 * n_embd`; saturating, so an absurd width
    /// gives a value [`Gpt2Config::validate`] refuses rather than an overflow).
    pub fn inner_dim(&self) -> i64 {
        self.n_inner.unwrap_or(self.n_embd.saturating_mul(4))
    }

    /// The width of one attention head.
    pub fn head_dim(&self) -> i64 {
        if self.n_head > 0 {
            self.n_embd / self.n_head
        } else {
            0
        }
    }

    /// The activation, or an error naming the unsupported name.
    pub fn activation(&self) -> Result<Activation> {
        Activation::from_name(&self.activation_function).ok_or_else(|| {
            Error::config(
                "Gpt2Config",
                "activation_function",
                format!("one of {}", Activation::NAMES),
                format!("{:?}", self.activation_function),
            )
        })
    }

    /// Checks every field (positive sizes, `n_embd` divisible by `n_head`, a finite positive
    /// epsilon, a known activation, tied embeddings). Special token ids are metadata here, as
    /// in `transformers` (GPT-2 configs often name 50256 over a smaller vocabulary); generation
    /// checks the ids it uses.
    pub fn validate(&self) -> Result<()> {
        let op = "Gpt2Config";
        let sized = [
            ("vocab_size", self.vocab_size, limits::MAX_DIM),
            ("n_positions", self.n_positions, limits::MAX_POSITIONS),
            ("n_embd", self.n_embd, limits::MAX_DIM),
            ("n_layer", self.n_layer, limits::MAX_LAYERS),
            ("n_head", self.n_head, limits::MAX_DIM),
        ];
        for (field, v, max) in sized {
            limits::size(op, field, v, max)?;
        }
        // n_inner defaults to 4 * n_embd: checked, so a wide n_embd is named, not overflowed
        match self.n_inner {
            Some(n) => limits::size(op, "n_inner", n, limits::MAX_DIM)?,
            None => {
                limits::product(op, "n_embd", 4, self.n_embd, limits::MAX_DIM)?;
            }
        }
        let multiple = format!("a multiple of n_head = {}", self.n_head);
        require(
            self.n_embd % self.n_head == 0,
            op,
            "n_embd",
            multiple,
            self.n_embd,
        )?;
        let eps = self.layer_norm_epsilon;
        require(
            eps.is_finite() && eps > 0.0,
            op,
            "layer_norm_epsilon",
            "a finite positive number",
            eps,
        )?;
        let std = self.initializer_range;
        require(
            std.is_finite() && std >= 0.0,
            op,
            "initializer_range",
            "a finite number >= 0",
            std,
        )?;
        let tied = "true (GPT-2's LM head is the token embedding)";
        require(
            self.tie_word_embeddings,
            op,
            "tie_word_embeddings",
            tied,
            false,
        )?;
        let model_type = format!("{:?}", self.model_type);
        require(
            self.model_type == "gpt2",
            op,
            "model_type",
            "\"gpt2\"",
            model_type,
        )?;
        self.activation()?;
        limits::parameter_count(op, "n_layer", self.weight_shapes().values())?;
        Ok(())
    }

    /// The shape of every tensor of a model of this config, by `transformers`' name
    /// (`GPT2LMHeadModel`'s; the tied LM head is not listed), computed without building the
    /// model: what a weight file's header is checked against before anything is allocated.
    /// Call it on a validated config (sizes saturate otherwise).
    pub fn weight_shapes(&self) -> std::collections::BTreeMap<String, Vec<i64>> {
        let (v, p, e, i) = (
            self.vocab_size,
            self.n_positions,
            self.n_embd,
            self.inner_dim(),
        );
        let mut out = std::collections::BTreeMap::new();
        out.insert("transformer.wte.weight".to_string(), vec![v, e]);
        out.insert("transformer.wpe.weight".to_string(), vec![p, e]);
        for l in 0..self.n_layer.clamp(0, limits::MAX_LAYERS) {
            let h = format!("transformer.h.{l}.");
            let e3 = e.saturating_mul(3);
            for (name, shape) in [
                ("ln_1.weight", vec![e]),
                ("ln_1.bias", vec![e]),
                ("attn.c_attn.weight", vec![e, e3]),
                ("attn.c_attn.bias", vec![e3]),
                ("attn.c_proj.weight", vec![e, e]),
                ("attn.c_proj.bias", vec![e]),
                ("ln_2.weight", vec![e]),
                ("ln_2.bias", vec![e]),
                ("mlp.c_fc.weight", vec![e, i]),
                ("mlp.c_fc.bias", vec![i]),
                ("mlp.c_proj.weight", vec![i, e]),
                ("mlp.c_proj.bias", vec![e]),
            ] {
                out.insert(format!("{h}{name}"), shape);
            }
        }
        out.insert("transformer.ln_f.weight".to_string(), vec![e]);
        out.insert("transformer.ln_f.bias".to_string(), vec![e]);
        out
    }

    /// The facts a model of this config has (what the layers above a model read).
    pub fn facts(&self) -> LmFacts {
        LmFacts {
            model_type: self.model_type.clone(),
            vocab_size: self.vocab_size,
            hidden_size: self.n_embd,
            n_layer: usize::try_from(self.n_layer).unwrap_or(0),
            max_positions: self.n_positions,
            tie_word_embeddings: true,
            initializer_range: self.initializer_range,
            bos_token_id: self.bos_token_id,
            eos_token_id: self.eos_token_id,
            pad_token_id: self.pad_token_id,
        }
    }

    /// Reads a `transformers` `config.json` and validates it.
    pub fn from_json_file(path: impl AsRef<Path>) -> Result<Self> {
        let (op, path) = ("Gpt2Config::from_json_file", path.as_ref());
        let cfg: Gpt2Config = read_config(op, path, "GPT-2")?;
        // the field is named by validate, the file here
        cfg.validate()
            .map_err(|e| e.context(format!("{op}: {}", path.display())))?;
        Ok(cfg)
    }

    /// The config as `transformers` writes it (`config.json`), with `architectures` set to
    /// `["GPT2LMHeadModel"]`.
    pub fn to_json_string(&self) -> Result<String> {
        config_json("Gpt2Config::to_json_string", self, "GPT2LMHeadModel", &[])
    }
}
