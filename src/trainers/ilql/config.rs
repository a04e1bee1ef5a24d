//! trlX's `ILQLConfig` (the method section) and HEAD's `default_ilql_config()` (rlhf.md §2.5).
//!
//! ```
//! use torchrl::trainers::ilql::{BetaSweep, IlqlTrlConfig};
//! # fn main() -> torchrl::Result<()> {
//! let cfg = IlqlTrlConfig::default(); // trlX HEAD's default_ilql_config()
//! assert_eq!((cfg.method.tau, cfg.method.gamma, cfg.method.cql_scale), (0.7, 0.99, 0.1));
//! assert_eq!((cfg.method.alpha, cfg.method.steps_for_target_q_sync), (0.001, 5));
//! assert_eq!((cfg.train.seq_length, cfg.train.batch_size, cfg.train.total_steps), (64, 128, 1000));
//! assert_eq!(cfg.optimizer.kwargs.lr, 5e-5);
//! // trlX's evaluation sweep: a list of betas
//! let cfg = IlqlTrlConfig::from_toml_str("[method.gen_kwargs]\nbeta = [0, 1, 100]")?;
//! assert_eq!(cfg.method.gen_kwargs.beta, BetaSweep::Many(vec![0.0, 1.0, 100.0]));
//! assert_eq!(cfg.train.seq_length, 64); // ILQL's defaults fill the rest
//! let err = IlqlTrlConfig::from_toml_str("[method]\ntau = 1.5").unwrap_err();
//! assert!(err.to_string().contains("method.tau"));
//! # Ok(()) }
//! ```

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::trainers::config::{
    AdamWKwargs, CosineKwargs, MethodConfig, ModelConfig, OptimizerConfig, SchedulerConfig,
    TokenizerConfig, TrainConfig, TrlConfigOf,
};

/// trlX's `TRLConfig` with the ILQL method; [`Default`] is HEAD's `default_ilql_config()`.
pub type IlqlTrlConfig = TrlConfigOf<IlqlMethodConfig>;

/// One β or trlX's evaluation sweep over several (`beta: [0, 1, 100]`): generation at each,
/// reported side by side.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum BetaSweep {
    /// One β.
    One(f64),
    /// A sweep (evaluation generates once per value; training-time samples use the first).
    Many(Vec<f64>),
}

impl BetaSweep {
    /// The values, in order.
    pub fn values(&self) -> Vec<f64> {
        match self {
            BetaSweep::One(b) => vec![*b],
            BetaSweep::Many(v) => v.clone(),
        }
    }
}

/// ILQL's generation arguments (trlX HEAD `gen_kwargs`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct IlqlGenKwargs {
    /// Tokens to generate, ≥ 1. Default 56.
    pub max_new_tokens: usize,
    /// Keep the `top_k` best scores; 0 keeps all. Default 20.
    pub top_k: usize,
    /// The advantage weight(s) β of `log π + β (Q − V)`, finite. Default 1.
    pub beta: BetaSweep,
    /// Sampling temperature, ≥ 0 (0 = greedy). Default 1.
    pub temperature: f64,
}

impl Default for IlqlGenKwargs {
    fn default() -> Self {
        IlqlGenKwargs {
            max_new_tokens: 56,
            top_k: 20,
            beta: BetaSweep::One(1.0),
            temperature: 1.0,
        }
    }
}

/// trlX's `ILQLConfig` (the method section), HEAD's defaults.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct IlqlMethodConfig {
    /// The method's registry name. Default `"ILQLConfig"`.
    pub name: String,
    /// The expectile of the V loss, in (0, 1). Default 0.7.
    pub tau: f64,
    /// Discount, in [0, 1]. Default 0.99.
    pub gamma: f64,
    /// Weight of the CQL term, ≥ 0. Default 0.1.
    pub cql_scale: f64,
    /// Weight of the AWAC term, ≥ 0. Default 1.
    pub awac_scale: f64,
    /// Polyak rate of the target Q-heads, in (0, 1]. Default 0.001.
    pub alpha: f64,
    /// The AWAC advantage weight `exp(β (Q − V))`, finite. Default 0 (behaviour cloning).
    pub beta: f64,
    /// Optimizer steps between target syncs, ≥ 1. Default 5. Synced per optimizer step (rlhf.md
    /// §7.4), not trlX HEAD's once-per-epoch callback.
    pub steps_for_target_q_sync: usize,
    /// Two Q-heads (the min of their targets is used). Default `true`.
    pub two_qs: bool,
    /// Generation for evaluation.
    pub gen_kwargs: IlqlGenKwargs,
}

impl Default for IlqlMethodConfig {
    fn default() -> Self {
        IlqlMethodConfig {
            name: "ILQLConfig".into(),
            tau: 0.7,
            gamma: 0.99,
            cql_scale: 0.1,
            awac_scale: 1.0,
            alpha: 0.001,
            beta: 0.0,
            steps_for_target_q_sync: 5,
            two_qs: true,
            gen_kwargs: IlqlGenKwargs::default(),
        }
    }
}

fn bad(field: &'static str, expected: &str, value: impl std::fmt::Display) -> Error {
    Error::config("IlqlTrlConfig::validate", field, expected, value)
}

impl MethodConfig for IlqlMethodConfig {
    fn default_config() -> TrlConfigOf<Self> {
        TrlConfigOf {
            train: TrainConfig {
                seq_length: 64,
                epochs: 100,
                total_steps: 1000,
                batch_size: 128,
                checkpoint_interval: 1000,
                eval_interval: 100,
                trainer: "AccelerateILQLTrainer".into(),
                pipeline: "PromptPipeline".into(),
                ..TrainConfig::default()
            },
            model: ModelConfig {
                num_layers_unfrozen: -1,
                ..ModelConfig::default()
            },
            tokenizer: TokenizerConfig::default(),
            optimizer: OptimizerConfig {
                kwargs: AdamWKwargs {
                    lr: 5e-5,
                    ..AdamWKwargs::default()
                },
                ..OptimizerConfig::default()
            },
            scheduler: SchedulerConfig {
                kwargs: CosineKwargs {
                    t_max: 1e12,
                    eta_min: 5e-5,
                },
                ..SchedulerConfig::default()
            },
            method: IlqlMethodConfig::default(),
        }
    }

    fn validate(&self) -> Result<()> {
        if !(self.tau > 0.0 && self.tau < 1.0) {
            return Err(bad("method.tau", "in (0, 1)", self.tau));
        }
        if !(0.0..=1.0).contains(&self.gamma) {
            return Err(bad("method.gamma", "in [0, 1]", self.gamma));
        }
        for (field, v) in [
            ("method.cql_scale", self.cql_scale),
            ("method.awac_scale", self.awac_scale),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(bad(field, "finite and >= 0", v));
            }
        }
        if !(self.alpha > 0.0 && self.alpha <= 1.0) {
            return Err(bad("method.alpha", "in (0, 1]", self.alpha));
        }
        if !self.beta.is_finite() {
            return Err(bad("method.beta", "a finite number", self.beta));
        }
        if self.steps_for_target_q_sync == 0 {
            return Err(bad("method.steps_for_target_q_sync", ">= 1", 0));
        }
        let g = &self.gen_kwargs;
        if g.max_new_tokens == 0 {
            return Err(bad("method.gen_kwargs.max_new_tokens", ">= 1", 0));
        }
        if !(g.temperature.is_finite() && g.temperature >= 0.0) {
            return Err(bad(
                "method.gen_kwargs.temperature",
                "finite and >= 0 (0 = greedy)",
                g.temperature,
            ));
        }
        let betas = g.beta.values();
        if betas.is_empty() || betas.iter().any(|b| !b.is_finite()) {
            return Err(bad(
                "method.gen_kwargs.beta",
                "a finite number or a non-empty list of them",
                format!("{betas:?}"),
            ));
        }
        Ok(())
    }
}
