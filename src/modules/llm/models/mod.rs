//! One file per architecture, each a [`CausalLm`] built on the [layer kit](super::nn) and read
//! from its Hugging Face config and weights by `transformers`' names: [`gpt2`], and [`llama`]
//! (Llama, Mistral, Qwen2, Qwen3: one shape, switched by `model_type`).
//! [`from_pretrained`] is `AutoModelForCausalLM`: it reads `config.json`, dispatches on its
//! `model_type`, and names an unsupported type with the list of supported ones.
//!
//! A new architecture is one file here (its config, its embedding, its blocks on the layer kit
//! under `transformers`' names, its LM head) plus a line in [`SUPPORTED`] and
//! [`from_pretrained`]; heads, generation, the env, losses and trainers need nothing.
//!
//! ```
//! use tch::{nn::VarStore, Device};
//! use torchrl::modules::llm::{models, CausalLm, Gpt2Config, Gpt2Model};
//! # fn main() -> torchrl::Result<()> {
//! let dir = std::env::temp_dir().join(format!("torchrl-auto-{}", std::process::id()));
//! let vs = VarStore::new(Device::Cpu);
//! let cfg = Gpt2Config::new(20).with_n_layer(1).with_n_embd(8).with_n_head(2).with_n_positions(8);
//! Gpt2Model::new(&vs.root(), &cfg)?.save_pretrained(&dir)?;
//! let vs2 = VarStore::new(Device::Cpu);
//! let model = models::from_pretrained(&vs2.root(), &dir)?;
//! assert_eq!(model.facts().model_type, "gpt2");
//! // the config alone (AutoConfig): sizes and ids without building a model
//! let facts = models::config_from_file(&dir.join("config.json"))?.facts();
//! assert_eq!((facts.vocab_size, facts.n_layer), (20, 1));
//! // an architecture not implemented is named, with the supported list
//! std::fs::write(dir.join("config.json"), r#"{"model_type": "falcon"}"#).unwrap();
//! let err = models::from_pretrained(&vs2.root(), &dir).unwrap_err().to_string();
//! assert!(err.contains("falcon") && err.contains("gpt2"), "{err}");
//! # std::fs::remove_dir_all(&dir).ok();
//! # Ok(()) }
//! ```

pub mod gpt2;
pub mod llama;

use std::collections::BTreeMap;
use std::path::Path as FsPath;

use tch::nn::Path;

use super::causal_lm::{CausalLm, CausalLmConfig};
use super::weights::{check_folder_fits, generation_ids, CONFIG_FILE};
use crate::error::{Error, Result};

/// The `model_type`s [`from_pretrained`] builds.
pub const SUPPORTED: &[&str] = &["gpt2", "llama", "mistral", "qwen2", "qwen3"];

/// The `model_type` of a `config.json`.
///
/// # Errors
/// An unreadable file, or one that is not a JSON object with a string `model_type`.
pub fn model_type(config_file: &FsPath) -> Result<String> {
    let op = "models::model_type";
    let text = std::fs::read_to_string(config_file).map_err(|source| Error::Io {
        op,
        path: config_file.display().to_string(),
        source,
    })?;
    let value: serde_json::Value = serde_json::from_str(&text).map_err(|e| Error::InvalidFile {
        op,
        path: config_file.display().to_string(),
        reason: format!("not JSON: {e}"),
    })?;
    match value.get("model_type").and_then(|v| v.as_str()) {
        Some(t) => Ok(t.to_string()),
        None => Err(Error::InvalidFile {
            op,
            path: config_file.display().to_string(),
            reason: "no string field \"model_type\"".into(),
        }),
    }
}

/// A `config.json` read and validated, by architecture (the special ids of a
/// `generation_config.json` beside it merged in).
pub(crate) enum AnyConfig {
    Gpt2(gpt2::Gpt2Config),
    Llama(llama::LlamaConfig),
}

impl AnyConfig {
    /// Reads `config_file` by its `model_type`.
    pub(crate) fn read(config_file: &FsPath) -> Result<Self> {
        let kind = model_type(config_file)?;
        // generation_config.json's special ids, when present beside the config, are the
        // defaults (as transformers' generate uses them)
        let ids = match config_file.parent() {
            Some(dir) => generation_ids(dir)?,
            None => None,
        };
        match kind.as_str() {
            "gpt2" => {
                let mut cfg = gpt2::Gpt2Config::from_json_file(config_file)?;
                if let Some([bos, eos, pad]) = ids {
                    cfg.bos_token_id = bos.or(cfg.bos_token_id);
                    cfg.eos_token_id = eos.or(cfg.eos_token_id);
                    cfg.pad_token_id = pad.or(cfg.pad_token_id);
                }
                Ok(AnyConfig::Gpt2(cfg))
            }
            "llama" | "mistral" | "qwen2" | "qwen3" => {
                let mut cfg = llama::LlamaConfig::from_json_file(config_file)?;
                if let Some([bos, eos, pad]) = ids {
                    let set = |v: Option<i64>, old: &mut Option<llama::TokenIds>| {
                        if let Some(v) = v {
                            *old = Some(llama::TokenIds::One(v));
                        }
                    };
                    set(bos, &mut cfg.bos_token_id);
                    set(eos, &mut cfg.eos_token_id);
                    set(pad, &mut cfg.pad_token_id);
                }
                Ok(AnyConfig::Llama(cfg))
            }
            other => Err(Error::InvalidFile {
                op: "models::from_config_file",
                path: config_file.display().to_string(),
                reason: format!(
                    "model_type {other:?} is not supported (supported: {})",
                    SUPPORTED.join(", ")
                ),
            }),
        }
    }

    /// The model, randomly initialised under `path`.
    pub(crate) fn build(&self, path: &Path<'_>) -> Result<Box<dyn CausalLm>> {
        Ok(match self {
            AnyConfig::Gpt2(cfg) => Box::new(gpt2::Gpt2Model::new(path, cfg)?),
            AnyConfig::Llama(cfg) => Box::new(llama::LlamaModel::new(path, cfg)?),
        })
    }

    /// Every tensor's shape by `transformers`' name, and the tied LM head (its name and the
    /// embedding it is tied to), without building the model.
    #[allow(clippy::type_complexity)]
    pub(crate) fn weight_shapes(
        &self,
    ) -> (
        BTreeMap<String, Vec<i64>>,
        Option<(&'static str, &'static str)>,
    ) {
        match self {
            AnyConfig::Gpt2(cfg) => (cfg.weight_shapes(), Some(gpt2::TIED_LM_HEAD)),
            AnyConfig::Llama(cfg) => (cfg.weight_shapes(), cfg.tied_lm_head()),
        }
    }

    /// The width of the residual stream.
    pub(crate) fn hidden_size(&self) -> i64 {
        match self {
            AnyConfig::Gpt2(cfg) => cfg.n_embd,
            AnyConfig::Llama(cfg) => cfg.hidden_size,
        }
    }

    /// Checks the weights of `dir` against this config (headers only), naming both files.
    pub(crate) fn check_weights(&self, op: &'static str, dir: &FsPath) -> Result<()> {
        let (shapes, tied) = self.weight_shapes();
        check_folder_fits(op, dir, &dir.join(CONFIG_FILE), &shapes, tied)
    }
}

/// The config a `config.json` holds, by its `model_type` (`AutoConfig.from_pretrained`), with
/// `generation_config.json`'s special ids, when that file sits beside it, as the defaults (as
/// `transformers`' `generate` uses them), validated. Nothing is built: [`CausalLmConfig::facts`]
/// gives the sizes and ids, [`CausalLmConfig::build`] the model.
///
/// # Errors
/// An unsupported `model_type` (named, with [`SUPPORTED`]); an invalid config.
pub fn config_from_file(config_file: &FsPath) -> Result<Box<dyn CausalLmConfig>> {
    Ok(match AnyConfig::read(config_file)? {
        AnyConfig::Gpt2(cfg) => Box::new(cfg),
        AnyConfig::Llama(cfg) => Box::new(cfg),
    })
}

/// A randomly initialised model of the architecture and shape a `config.json` names, under
/// `path` (no weights read).
///
/// # Errors
/// An unsupported `model_type` (named, with [`SUPPORTED`]); an invalid config.
pub fn from_config_file(path: &Path<'_>, config_file: &FsPath) -> Result<Box<dyn CausalLm>> {
    AnyConfig::read(config_file)?.build(path)
}

/// Builds the model of a `transformers` folder (`config.json` + `model.safetensors`, or the
/// shards of `model.safetensors.index.json`; `generation_config.json`'s special ids as
/// defaults) under `path`, by its `model_type` (`AutoModelForCausalLM.from_pretrained`).
/// The config is checked against the weight files' headers before any module is built (see
/// [`limits`](super::limits) for the sizes a config may ask for).
///
/// # Errors
/// An unsupported `model_type` (named, with [`SUPPORTED`]); an invalid config; a config that
/// disagrees with the weights' headers (naming both files); weights that do not fit.
pub fn from_pretrained(path: &Path<'_>, dir: impl AsRef<FsPath>) -> Result<Box<dyn CausalLm>> {
    let dir = dir.as_ref();
    let config = AnyConfig::read(&dir.join(CONFIG_FILE))?;
    config.check_weights("models::from_pretrained", dir)?;
    // built and loaded aside: a late failure adds nothing to the caller's store
    crate::modules::llm::nn::build_staged(path, |path| {
        let model = config.build(path)?;
        model.load_folder(dir)?;
        Ok(model)
    })
}
