//! The trainer config, in the shape of trlX's `TRLConfig`: six sections (`train`, `model`,
//! `tokenizer`, `optimizer`, `scheduler`, `method`) whose fields carry trlX's names, and whose
//! [`Default`] is trlX HEAD's `default_ppo_config()`.
//!
//! A config loads from a TOML or JSON file ([`TrlConfig::from_file`], by extension) or string
//! ([`TrlConfig::from_toml_str`], [`TrlConfig::from_json_str`]). A file may name only the fields
//! it changes: the others keep their defaults. Unknown fields are errors that name the field (a
//! typo never passes silently), and every loader runs [`TrlConfig::validate`], which returns
//! [`Error::InvalidConfig`](crate::Error::InvalidConfig) naming the field and its range, before
//! any compute starts.
//!
//! ```
//! use torchrl::trainers::config::{ScaleReward, TrlConfig};
//! # fn main() -> torchrl::Result<()> {
//! let cfg = TrlConfig::from_toml_str(
//!     r#"
//!     [train]
//!     batch_size = 8
//!     [method]
//!     target = 6.0
//!     scale_reward = "running"
//!     [optimizer.kwargs]
//!     lr = 1.0e-5
//!     "#,
//! )?;
//! assert_eq!(cfg.train.batch_size, 8);
//! assert_eq!(cfg.train.seq_length, 1024); // trlX's default, kept
//! assert_eq!(cfg.method.target, Some(6.0)); // Some = adaptive KL controller
//! assert_eq!(cfg.method.scale_reward, ScaleReward::Running);
//! assert_eq!(cfg.optimizer.kwargs.lr, 1.0e-5);
//! assert_eq!(cfg.optimizer.kwargs.betas, [0.9, 0.95]);
//!
//! // A typo names the field.
//! let err = TrlConfig::from_toml_str("[train]\nbatch_sise = 8").unwrap_err();
//! assert!(err.to_string().contains("batch_sise"));
//! // A bad value names the field and the range.
//! let err = TrlConfig::from_json_str(r#"{"method": {"gamma": 1.5}}"#).unwrap_err();
//! assert!(err.to_string().contains("method.gamma"));
//! # Ok(()) }
//! ```
//!
//! # Field names
//!
//! Fields are spelled as in trlX HEAD (`trlx/data/configs.py`, `trlx/models/modeling_ppo.py`);
//! the file layout is trlX's `to_dict()` (optimizer and scheduler arguments under `kwargs`).
//! Where ours differ from trlX, or where Hugging Face TRL names the same thing differently:
//!
//! | ours | trlX HEAD | TRL (`PPOConfig`) |
//! |---|---|---|
//! | `train.batch_size` | same | `per_device_train_batch_size` |
//! | `train.minibatch_size` | same | `gradient_accumulation_steps` (the inverse) |
//! | `train.total_steps` | same | `total_episodes` (counts samples) |
//! | `train.log_interval` | none (logs every step; b623d1b's `intervals()` read it) | `logging_steps` |
//! | `train.checkpoint_interval` | same | `save_steps` |
//! | `train.eval_interval` | same | `eval_steps` |
//! | `optimizer.kwargs.lr` | same (b623d1b: `train.learning_rate_init`) | `learning_rate` |
//! | `optimizer.kwargs.betas` | same (b623d1b: `train.opt_betas`) | `adam_beta1`, `adam_beta2` |
//! | `optimizer.kwargs.eps` | same | `adam_epsilon` |
//! | `scheduler.kwargs.eta_min` | same (b623d1b: `train.learning_rate_target`) | none (`lr_scheduler_type`) |
//! | `method.ppo_epochs` | same | `num_ppo_epochs` |
//! | `method.init_kl_coef` | same | `kl_coef` (legacy: `init_kl_coef`) |
//! | `method.target` | same (`None` = fixed) | legacy `target` with `adap_kl_ctrl` |
//! | `method.cliprange_reward` | same | legacy `score_clip` |
//! | `method.scale_reward` | same (`None` also means ignored) | legacy `use_score_scaling` |
//! | `method.gen_kwargs.max_new_tokens` | same | `response_length` |
//! | `method.num_value_layers_unfrozen` | same (in the method config, not `model`) | none |
//! | `train.max_grad_norm` | none (no clipping) | `max_grad_norm` (`TrainingArguments`) |
//!
//! trlX fields for tracking and distributed runs (`tracker`, `entity_name`, `peft_config`,
//! `trainer_kwargs`, `*_extra_configs`) are not part of this config.

use std::fmt;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::macros::setters;
use crate::modules::llm::lora::LoraConfig;

pub use super::ppo_method::PpoMethodConfig;

/// The whole config: trlX's `TRLConfig`, generic over its method section ([`TrlConfig`] for
/// PPO, [`IlqlTrlConfig`](super::ilql::IlqlTrlConfig) for ILQL).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(
    deny_unknown_fields,
    default,
    bound(serialize = "M: Serialize", deserialize = "M: MethodConfig")
)]
pub struct TrlConfigOf<M> {
    /// The training loop: lengths, intervals, checkpoints, seed.
    pub train: TrainConfig,
    /// The model to fine-tune and how much of it trains.
    pub model: ModelConfig,
    /// The tokenizer and its padding / truncation sides.
    pub tokenizer: TokenizerConfig,
    /// The optimizer (AdamW) and its arguments.
    pub optimizer: OptimizerConfig,
    /// The learning-rate schedule (cosine annealing) and its arguments.
    pub scheduler: SchedulerConfig,
    /// The method: [`PpoMethodConfig`] by default (rollouts, KL penalty, GAE, clipping,
    /// generation), or another [`MethodConfig`] (ILQL's).
    pub method: M,
}

/// trlX's `TRLConfig` with the PPO method (HEAD's `default_ppo_config()`): the config of
/// [`PpoRlhfTrainer`](super::ppo::PpoRlhfTrainer).
pub type TrlConfig = TrlConfigOf<PpoMethodConfig>;

/// What a method section provides: trlX's defaults and its own validation (errors name the
/// field as `method.<field>`).
pub trait MethodConfig:
    Clone + fmt::Debug + PartialEq + Default + Serialize + for<'de> Deserialize<'de>
{
    /// The whole config with this method's defaults in every section (trlX's
    /// `default_ppo_config()` / `default_ilql_config()`): what a file's missing fields take.
    fn default_config() -> TrlConfigOf<Self>;

    /// Checks the method's fields.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the first bad field.
    fn validate(&self) -> Result<()>;
}

impl<M: MethodConfig> Default for TrlConfigOf<M> {
    fn default() -> Self {
        M::default_config()
    }
}

/// trlX's `TrainConfig`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrainConfig {
    /// Number of tokens of context (the tokenizer's max length). Default 1024.
    pub seq_length: usize,
    /// Passes over the rollouts (for PPO: rounds of collecting `num_rollouts` and learning on
    /// them). Default 100.
    pub epochs: usize,
    /// Upper bound on optimizer steps (see [`TrlConfig::total_steps`]). Default 10000.
    pub total_steps: usize,
    /// Samples per optimizer step. Default 32.
    pub batch_size: usize,
    /// Samples per forward pass (gradient accumulation over `batch_size / minibatch_size`
    /// micro-batches); must divide `batch_size`. Default `None` (= `batch_size`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub minibatch_size: Option<usize>,
    /// Save a checkpoint every this many optimizer steps. Default 10000.
    pub checkpoint_interval: usize,
    /// Evaluate every this many optimizer steps. Default 100.
    pub eval_interval: usize,
    /// Log every this many optimizer steps. Ours: trlX HEAD logs every step (the default, 1);
    /// trlX b623d1b's `intervals()` read a `log_interval` its config never defined.
    pub log_interval: usize,
    /// Folder that holds the checkpoints. Default `"ckpts"`.
    pub checkpoint_dir: String,
    /// Keep the checkpoint with the best mean reward too. Default `true`.
    pub save_best: bool,
    /// Store the optimizer and scheduler state in checkpoints. Default `true`.
    pub save_optimizer: bool,
    /// Checkpoint folder to resume from. Default `None`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resume_from_checkpoint: Option<String>,
    /// Random seed. Default 1000.
    pub seed: u64,
    /// Global gradient-norm clip before each optimizer step; `None`: no clipping. Default
    /// `Some(1.0)`. trlX has no such field (its accelerate runs leave gradients unclipped);
    /// the name and default are Hugging Face `TrainingArguments`' (TRL's). `None` is written
    /// `false` (TOML has no null, and an absent field means the default); `false` and `null`
    /// read as `None`.
    #[serde(
        serialize_with = "grad_norm::serialize",
        deserialize_with = "grad_norm::deserialize"
    )]
    pub max_grad_norm: Option<f64>,
    /// The prompt pipeline's name (trlX's registry key). Default `"PromptPipeline"`.
    pub pipeline: String,
    /// The trainer's name (trlX's registry key). Default `"AcceleratePPOTrainer"`.
    pub trainer: String,
    /// Project name for logs. Default `"trlx"`.
    pub project_name: String,
    /// Run name for logs. Default `None`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run_name: Option<String>,
    /// Folder for logs (CSV, plots). Default `None`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logging_dir: Option<String>,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            seq_length: 1024,
            epochs: 100,
            total_steps: 10000,
            batch_size: 32,
            minibatch_size: None,
            checkpoint_interval: 10000,
            eval_interval: 100,
            log_interval: 1,
            checkpoint_dir: "ckpts".into(),
            save_best: true,
            save_optimizer: true,
            resume_from_checkpoint: None,
            seed: 1000,
            max_grad_norm: Some(1.0),
            pipeline: "PromptPipeline".into(),
            trainer: "AcceleratePPOTrainer".into(),
            project_name: "trlx".into(),
            run_name: None,
            logging_dir: None,
        }
    }
}

/// trlX's `ModelConfig`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ModelConfig {
    /// Model folder or hub name. Default `"lvwerra/gpt2-imdb"`.
    pub model_path: String,
    /// `"causal"` or `"seq2seq"`. Default `"causal"`.
    pub model_arch_type: String,
    /// Trainable top blocks: `-1` all, `0` none (heads only), `k > 0` the last `k`. Default 2.
    /// Not read with `peft_config` (the adapters train; the base is frozen).
    pub num_layers_unfrozen: i64,
    /// trlX's `peft_config`: LoRA adapters on the policy, PEFT's `LoraConfig` fields
    /// ([`LoraConfig`]); `None` (default): no adapters.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peft_config: Option<LoraConfig>,
    /// Where the reference log-probs come from (see [`ReferenceModel`]). Default `"auto"`.
    pub reference: ReferenceModel,
    /// Gradient checkpointing per block (TRL's `gradient_checkpointing`): training forwards
    /// keep only the blocks' inputs and recompute the blocks in the backward. Default `false`.
    pub gradient_checkpointing: bool,
}

impl Default for ModelConfig {
    fn default() -> Self {
        ModelConfig {
            model_path: "lvwerra/gpt2-imdb".into(),
            model_arch_type: "causal".into(),
            num_layers_unfrozen: 2,
            peft_config: None,
            reference: ReferenceModel::Auto,
            gradient_checkpointing: false,
        }
    }
}

/// The reference model of PPO-RLHF, GRPO and DPO ([`ModelConfig::reference`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReferenceModel {
    /// `"auto"`: adapters off with `peft_config` (TRL's PEFT path), the hydra reference of
    /// `num_layers_unfrozen` without.
    Auto,
    /// `"adapters_off"`: the policy's weights with its LoRA adapters disabled; no reference
    /// copy exists. Needs `peft_config`.
    AdaptersOff,
    /// `"hydra"`: trlX's frozen copy (the top `num_layers_unfrozen` blocks as a branch, or the
    /// whole model for `-1` / `0`). With `peft_config`, `num_layers_unfrozen` must be `-1` (a
    /// full copy: every block's adapters train, so no lower trunk stays frozen).
    Hydra,
}

/// Which side a tokenizer pads or truncates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Side {
    /// `"left"`.
    Left,
    /// `"right"`.
    Right,
}

/// trlX's `TokenizerConfig`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TokenizerConfig {
    /// Tokenizer folder or hub name. Default `"gpt2"`.
    pub tokenizer_path: String,
    /// Default `"left"` (prompts end where generation starts).
    pub padding_side: Side,
    /// Default `"right"`.
    pub truncation_side: Side,
}

impl Default for TokenizerConfig {
    fn default() -> Self {
        TokenizerConfig {
            tokenizer_path: "gpt2".into(),
            padding_side: Side::Left,
            truncation_side: Side::Right,
        }
    }
}

/// The optimizers this crate implements (trlX's `OptimizerName`, serialised as its strings).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum OptimizerName {
    /// `"adamw"`: [`AdamW`](crate::trainers::optim::AdamW).
    #[default]
    #[serde(rename = "adamw")]
    AdamW,
}

/// trlX's `OptimizerConfig`: a name and the optimizer's keyword arguments.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OptimizerConfig {
    /// Default `"adamw"`.
    pub name: OptimizerName,
    /// The optimizer's arguments.
    pub kwargs: AdamWKwargs,
}

/// The arguments of `torch.optim.AdamW` that trlX sets.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdamWKwargs {
    /// Learning rate, > 0. Default 3e-5.
    pub lr: f64,
    /// Moment decay rates, each in [0, 1). Default (0.9, 0.95).
    pub betas: [f64; 2],
    /// Added to the root of the second moment, > 0. Default 1e-8.
    pub eps: f64,
    /// Decoupled weight decay, ≥ 0. Default 1e-6.
    pub weight_decay: f64,
    /// `torch.optim.AdamW`'s `fused`: one fused libtorch call per step for the float32 /
    /// float64 parameters ([`AdamW::with_fused`](crate::trainers::optim::AdamW::with_fused)).
    /// Default `false` (the per-tensor step, bit for bit PyTorch's default).
    pub fused: bool,
}

impl Default for AdamWKwargs {
    fn default() -> Self {
        AdamWKwargs {
            lr: 3e-5,
            betas: [0.9, 0.95],
            eps: 1e-8,
            weight_decay: 1e-6,
            fused: false,
        }
    }
}

/// The schedules this crate implements (trlX's `SchedulerName`, serialised as its strings).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum SchedulerName {
    /// `"cosine_annealing"`: [`CosineAnnealingLr`](crate::trainers::optim::CosineAnnealingLr).
    #[default]
    #[serde(rename = "cosine_annealing")]
    CosineAnnealing,
}

/// trlX's `SchedulerConfig`: a name and the schedule's keyword arguments.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SchedulerConfig {
    /// Default `"cosine_annealing"`.
    pub name: SchedulerName,
    /// The schedule's arguments.
    pub kwargs: CosineKwargs,
}

/// The arguments of `torch.optim.lr_scheduler.CosineAnnealingLR`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CosineKwargs {
    /// Half-period in scheduler steps, > 0. Default 1e12 (a constant rate in practice).
    #[serde(rename = "T_max")]
    pub t_max: f64,
    /// The lowest rate, ≥ 0. Default 3e-5.
    pub eta_min: f64,
}

impl Default for CosineKwargs {
    fn default() -> Self {
        CosineKwargs {
            t_max: 1e12,
            eta_min: 3e-5,
        }
    }
}

/// How PPO scales scores before the KL penalty (trlX's `scale_reward`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ScaleReward {
    /// `"ignored"`: scores as they come.
    #[default]
    Ignored,
    /// `"running"`: divided by the running standard deviation of all scores so far.
    Running,
    /// `"ref"`: divided by `ref_std` (taken from the first rollout when not set).
    Ref,
}

/// Generation arguments (the subset of Hugging Face `generate` kwargs that trlX sets).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GenKwargs {
    /// Tokens to generate after the prompt, ≥ 1. Default 40.
    pub max_new_tokens: usize,
    /// Keep the `top_k` most likely tokens; 0 keeps all. Default 0.
    pub top_k: usize,
    /// Nucleus sampling mass, in (0, 1]. Default 1.0.
    pub top_p: f64,
    /// Sample (`true`) or decode greedily. Default `true`.
    pub do_sample: bool,
    /// Logit temperature, > 0. Default 1.0.
    pub temperature: f64,
}

impl Default for GenKwargs {
    fn default() -> Self {
        GenKwargs {
            max_new_tokens: 40,
            top_k: 0,
            top_p: 1.0,
            do_sample: true,
            temperature: 1.0,
        }
    }
}

setters!(TrlConfig {
    /// Replaces the `train` section.
    with_train(train: TrainConfig);
    /// Replaces the `model` section.
    with_model(model: ModelConfig);
    /// Replaces the `tokenizer` section.
    with_tokenizer(tokenizer: TokenizerConfig);
    /// Replaces the `optimizer` section.
    with_optimizer(optimizer: OptimizerConfig);
    /// Replaces the `scheduler` section.
    with_scheduler(scheduler: SchedulerConfig);
    /// Replaces the `method` section.
    with_method(method: PpoMethodConfig);
});

pub(crate) const OP: &str = "TrlConfig::validate";

/// `" at field <path>"` for a JSON parse error of `text` (serde names the type, this the
/// field), empty for a syntax error at the top level.
fn json_where(text: &str, e: &serde_json::Error) -> String {
    match crate::error::json_path_at(text, e.line(), e.column()).as_str() {
        "<root>" => String::new(),
        path => format!(" at field {path}"),
    }
}

/// `" at field <section.key>"` for a TOML parse error of `text`, when it points at a key.
fn toml_where(text: &str, e: &toml::de::Error) -> String {
    e.span()
        .and_then(|span| crate::error::toml_path_at(text, span.start))
        .map_or_else(String::new, |path| format!(" at field {path}"))
}

/// `train.max_grad_norm` on disk: a number, or `false` for `None` (TOML has no null; an
/// absent field is the default, `Some(1.0)`, so `None` must be written to survive a round
/// trip). `null` is read as `None` too.
mod grad_norm {
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(v: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(x) => s.serialize_f64(*x),
            None => s.serialize_bool(false),
        }
    }

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Repr {
        Number(f64),
        Flag(bool),
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
        match Option::<Repr>::deserialize(d)? {
            Some(Repr::Number(x)) => Ok(Some(x)),
            None | Some(Repr::Flag(false)) => Ok(None),
            Some(Repr::Flag(true)) => Err(serde::de::Error::custom(
                "max_grad_norm: a number, or false / null for no clipping (not true)",
            )),
        }
    }
}

pub(crate) fn at_least(field: &'static str, value: usize, min: usize) -> Result<()> {
    if value < min {
        return Err(Error::config(OP, field, format!(">= {min}"), value));
    }
    Ok(())
}

pub(crate) fn positive(field: &'static str, value: f64) -> Result<()> {
    if !(value.is_finite() && value > 0.0) {
        return Err(Error::config(OP, field, "a finite number > 0", value));
    }
    Ok(())
}

pub(crate) fn non_negative(field: &'static str, value: f64) -> Result<()> {
    if !(value.is_finite() && value >= 0.0) {
        return Err(Error::config(OP, field, "a finite number >= 0", value));
    }
    Ok(())
}

pub(crate) fn unit_closed(field: &'static str, value: f64) -> Result<()> {
    if !(0.0..=1.0).contains(&value) {
        return Err(Error::config(OP, field, "a number in [0, 1]", value));
    }
    Ok(())
}

/// Checks generation arguments; `fields` name `max_new_tokens`, `top_p` and `temperature`.
pub(crate) fn validate_gen(g: &GenKwargs, fields: [&'static str; 3]) -> Result<()> {
    let [max_new_tokens, top_p, temperature] = fields;
    at_least(max_new_tokens, g.max_new_tokens, 1)?;
    if !(g.top_p > 0.0 && g.top_p <= 1.0) {
        return Err(Error::config(OP, top_p, "a number in (0, 1]", g.top_p));
    }
    positive(temperature, g.temperature)
}

impl<M: MethodConfig> TrlConfigOf<M> {
    /// Checks every field's range and the fields that depend on each other; the error names
    /// the first bad field as `section.field` with the accepted range.
    ///
    /// ```
    /// use torchrl::{trainers::config::TrlConfig, Error};
    /// let mut cfg = TrlConfig::default();
    /// assert!(cfg.validate().is_ok());
    /// cfg.optimizer.kwargs.betas = [0.9, 1.0];
    /// let err = cfg.validate().unwrap_err();
    /// assert!(matches!(err, Error::InvalidConfig { field: "optimizer.kwargs.betas", .. }));
    /// ```
    pub fn validate(&self) -> Result<()> {
        let t = &self.train;
        at_least("train.seq_length", t.seq_length, 1)?;
        at_least("train.epochs", t.epochs, 1)?;
        at_least("train.total_steps", t.total_steps, 1)?;
        at_least("train.batch_size", t.batch_size, 1)?;
        if let Some(mb) = t.minibatch_size {
            if mb == 0 || mb > t.batch_size || !t.batch_size.is_multiple_of(mb) {
                return Err(Error::config(
                    OP,
                    "train.minibatch_size",
                    format!("a divisor of train.batch_size ({})", t.batch_size),
                    mb,
                ));
            }
        }
        at_least("train.checkpoint_interval", t.checkpoint_interval, 1)?;
        at_least("train.eval_interval", t.eval_interval, 1)?;
        at_least("train.log_interval", t.log_interval, 1)?;
        if let Some(c) = t.max_grad_norm {
            if !(c.is_finite() && c > 0.0) {
                return Err(Error::config(
                    OP,
                    "train.max_grad_norm",
                    "a finite value > 0 (or null: no clipping)",
                    c,
                ));
            }
        }
        if t.checkpoint_dir.is_empty() {
            return Err(Error::config(
                OP,
                "train.checkpoint_dir",
                "a non-empty path",
                "\"\"",
            ));
        }

        if self.model.num_layers_unfrozen < -1 {
            return Err(Error::config(
                OP,
                "model.num_layers_unfrozen",
                "-1 (all), 0 (none) or a positive count",
                self.model.num_layers_unfrozen,
            ));
        }
        if let Some(peft) = &self.model.peft_config {
            peft.validate()
                .map_err(|e| e.context(format!("{OP}: model.peft_config")))?;
        }
        match (self.model.reference, &self.model.peft_config) {
            (ReferenceModel::AdaptersOff, None) => {
                return Err(Error::config(
                    OP,
                    "model.reference",
                    "\"adapters_off\" only with a model.peft_config (LoRA adapters to turn off)",
                    "\"adapters_off\" without peft_config",
                ))
            }
            (ReferenceModel::Hydra, Some(_)) if self.model.num_layers_unfrozen != -1 => {
                return Err(Error::config(
                    OP,
                    "model.num_layers_unfrozen",
                    "-1 with peft_config and reference = \"hydra\" (every block's adapters train: \
                     the reference is a full frozen copy)",
                    self.model.num_layers_unfrozen,
                ))
            }
            _ => {}
        }
        if !matches!(self.model.model_arch_type.as_str(), "causal" | "seq2seq") {
            return Err(Error::config(
                OP,
                "model.model_arch_type",
                "\"causal\" or \"seq2seq\"",
                format!("{:?}", self.model.model_arch_type),
            ));
        }

        let o = &self.optimizer.kwargs;
        positive("optimizer.kwargs.lr", o.lr)?;
        for b in o.betas {
            if !(0.0..1.0).contains(&b) {
                return Err(Error::config(
                    OP,
                    "optimizer.kwargs.betas",
                    "two numbers in [0, 1)",
                    format!("{:?}", o.betas),
                ));
            }
        }
        positive("optimizer.kwargs.eps", o.eps)?;
        non_negative("optimizer.kwargs.weight_decay", o.weight_decay)?;

        // the schedule's own check (also the optimizer's lr as its base rate): no step of it
        // yields a non-finite rate
        let k = &self.scheduler.kwargs;
        let fields = [
            "optimizer.kwargs.lr",
            "scheduler.kwargs.T_max",
            "scheduler.kwargs.eta_min",
        ];
        check_cosine(OP, fields, o.lr, k.t_max, k.eta_min)?;

        self.method.validate()
    }

    /// Parses TOML (only the fields that differ from the defaults are needed) and validates.
    ///
    /// ```
    /// use torchrl::trainers::config::TrlConfig;
    /// let cfg = TrlConfig::from_toml_str("[scheduler.kwargs]\nT_max = 500").unwrap();
    /// assert_eq!(cfg.scheduler.kwargs.t_max, 500.0);
    /// ```
    pub fn from_toml_str(text: &str) -> Result<Self> {
        let cfg: TrlConfigOf<M> = toml::from_str(text).map_err(|e| {
            Error::invalid(
                "TrlConfig::from_toml_str",
                format!("invalid TOML config{}: {e}", toml_where(text, &e)),
            )
        })?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Parses JSON (trlX's `to_dict()` layout; only the fields that differ from the defaults are
    /// needed) and validates.
    ///
    /// ```
    /// use torchrl::trainers::config::TrlConfig;
    /// let cfg = TrlConfig::from_json_str(r#"{"train": {"seed": 7}}"#).unwrap();
    /// assert_eq!(cfg.train.seed, 7);
    /// ```
    pub fn from_json_str(text: &str) -> Result<Self> {
        let cfg: TrlConfigOf<M> = serde_json::from_str(text).map_err(|e| {
            Error::invalid(
                "TrlConfig::from_json_str",
                format!("invalid JSON config{}: {e}", json_where(text, &e)),
            )
        })?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Reads a `.toml` or `.json` file (chosen by extension) and validates it; errors name the
    /// path.
    ///
    /// ```
    /// use torchrl::trainers::config::TrlConfig;
    /// # fn main() -> torchrl::Result<()> {
    /// let path = std::env::temp_dir().join(format!("trl-doc-{}.toml", std::process::id()));
    /// let mut cfg = TrlConfig::default();
    /// cfg.method.target = Some(6.0);
    /// cfg.to_file(&path)?;
    /// assert_eq!(TrlConfig::from_file(&path)?, cfg);
    /// std::fs::remove_file(&path).ok();
    /// # Ok(()) }
    /// ```
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        const OP_FILE: &str = "TrlConfig::from_file";
        let path = path.as_ref();
        let format = Format::of(OP_FILE, path)?;
        let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
            op: OP_FILE,
            path: path.display().to_string(),
            source,
        })?;
        let parsed = match format {
            Format::Toml => toml::from_str::<TrlConfigOf<M>>(&text)
                .map_err(|e| format!("{}{e}", toml_where(&text, &e))),
            Format::Json => serde_json::from_str::<TrlConfigOf<M>>(&text)
                .map_err(|e| format!("{}{e}", json_where(&text, &e))),
        };
        let cfg = parsed.map_err(|reason| Error::InvalidFile {
            op: OP_FILE,
            path: path.display().to_string(),
            reason,
        })?;
        // a field out of range is named by validate; the file is named here
        cfg.validate()
            .map_err(|e| e.context(format!("{OP_FILE}: {}", path.display())))?;
        Ok(cfg)
    }

    /// Writes the config to a `.toml` or `.json` file (chosen by extension).
    pub fn to_file(&self, path: impl AsRef<Path>) -> Result<()> {
        const OP_FILE: &str = "TrlConfig::to_file";
        let path = path.as_ref();
        let text = match Format::of(OP_FILE, path)? {
            Format::Toml => self.to_toml()?,
            Format::Json => self.to_json()?,
        };
        std::fs::write(path, text).map_err(|source| Error::Io {
            op: OP_FILE,
            path: path.display().to_string(),
            source,
        })
    }

    /// The config as pretty-printed JSON (every field, `None`s left out).
    ///
    /// ```
    /// use torchrl::trainers::config::TrlConfig;
    /// let cfg = TrlConfig::default();
    /// assert_eq!(TrlConfig::from_json_str(&cfg.to_json().unwrap()).unwrap(), cfg);
    /// ```
    pub fn to_json(&self) -> Result<String> {
        serde_json::to_string_pretty(self)
            .map_err(|e| Error::invalid("TrlConfig::to_json", e.to_string()))
    }

    /// The config as TOML (every field, `None`s left out).
    ///
    /// ```
    /// use torchrl::trainers::config::TrlConfig;
    /// let cfg = TrlConfig::default();
    /// let text = cfg.to_toml().unwrap();
    /// assert!(text.contains("[method.gen_kwargs]"));
    /// assert_eq!(TrlConfig::from_toml_str(&text).unwrap(), cfg);
    /// ```
    pub fn to_toml(&self) -> Result<String> {
        toml::to_string(self).map_err(|e| Error::invalid("TrlConfig::to_toml", e.to_string()))
    }
}

enum Format {
    Toml,
    Json,
}

impl Format {
    fn of(op: &'static str, path: &Path) -> Result<Self> {
        match path.extension().and_then(|e| e.to_str()) {
            Some(e) if e.eq_ignore_ascii_case("toml") => Ok(Format::Toml),
            Some(e) if e.eq_ignore_ascii_case("json") => Ok(Format::Json),
            _ => Err(Error::argument(
                op,
                "path",
                "a file ending in .toml or .json",
                path.display().to_string(),
            )),
        }
    }
}

/// The most steps a step counter may hold (AdamW's per-parameter steps, a schedule's
/// `last_epoch`): 2^53, where `f64` still counts exactly. A checkpoint with more is refused.
pub const MAX_STEPS: u64 = 1 << 53;

/// The largest rate a schedule takes: above it `(base_lr - eta_min)·(1 + cos)` could
/// overflow to infinity.
pub const MAX_LR: f64 = 1e300;

/// The one check of a cosine schedule (the constructor's, a loaded state's and
/// `TrlConfig::validate`'s; `fields` name `base_lr`, `T_max` and `eta_min` as the caller
/// knows them): rates finite in `(0, MAX_LR]` (`eta_min` may be 0), and a `T_max` large
/// enough that the phase `π·e / T_max` stays finite for every step count `e <= MAX_STEPS`,
/// so that no step yields a non-finite rate (`T_max = 5e-324` gives `π / T_max = inf` and a
/// NaN rate at step 1).
pub(crate) fn check_cosine(
    op: &'static str,
    fields: [&'static str; 3],
    base_lr: f64,
    t_max: f64,
    eta_min: f64,
) -> Result<()> {
    let [base_field, t_max_field, eta_field] = fields;
    if !(base_lr > 0.0 && base_lr <= MAX_LR) {
        let want = format!("a finite number in (0, {MAX_LR:e}]");
        return Err(Error::config(op, base_field, want, base_lr));
    }
    let phase = std::f64::consts::PI * MAX_STEPS as f64 / t_max;
    if !(t_max.is_finite() && t_max > 0.0 && phase.is_finite()) {
        let least = std::f64::consts::PI * MAX_STEPS as f64 / f64::MAX;
        let want = format!(
            "a finite number >= {least:e} (the phase of {MAX_STEPS} steps must stay finite)"
        );
        return Err(Error::config(op, t_max_field, want, t_max));
    }
    if !(0.0..=MAX_LR).contains(&eta_min) {
        let want = format!("a finite number in [0, {MAX_LR:e}]");
        return Err(Error::config(op, eta_field, want, eta_min));
    }
    Ok(())
}
