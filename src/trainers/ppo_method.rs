//! trlX's `PPOConfig`, the method section of [`TrlConfig`](super::config::TrlConfig)
//! ([`PpoMethodConfig`], re-exported from [`config`](super::config)), with its validation and
//! the PPO step budget of a [`TrlConfig`](super::config::TrlConfig). GRPO's, DPO's and ILQL's
//! method sections live beside their trainers in the same way.

use serde::{Deserialize, Serialize};

use super::config::{
    at_least, non_negative, positive, unit_closed, validate_gen, GenKwargs, MethodConfig,
    ModelConfig, OptimizerConfig, ScaleReward, SchedulerConfig, TokenizerConfig, TrainConfig,
    TrlConfigOf, OP,
};
use crate::error::{Error, Result};

/// trlX's `PPOConfig` (the method section).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PpoMethodConfig {
    /// The method's registry name. Default `"PPOConfig"`.
    pub name: String,
    /// Optimisation passes over each rollout batch, ≥ 1. Default 4.
    pub ppo_epochs: usize,
    /// Samples collected per rollout phase, ≥ 1. Default 128.
    pub num_rollouts: usize,
    /// Prompts generated at once while collecting, ≥ 1. Default 128.
    pub chunk_size: usize,
    /// Initial KL coefficient β, ≥ 0. Default 0.001.
    pub init_kl_coef: f64,
    /// Target KL: `Some` = adaptive controller, `None` = fixed β. Must be > 0. Default `None`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<f64>,
    /// Adaptive controller horizon in samples, ≥ 1. Default 10000.
    pub horizon: usize,
    /// Discount, in [0, 1]. Default 1.
    pub gamma: f64,
    /// GAE λ, in [0, 1]. Default 0.95.
    pub lam: f64,
    /// Policy ratio clip ε, > 0. Default 0.2.
    pub cliprange: f64,
    /// Value clip, > 0. Default 0.2.
    pub cliprange_value: f64,
    /// Value loss weight, ≥ 0. Default 1.
    pub vf_coef: f64,
    /// Score scaling. Default `"ignored"`.
    pub scale_reward: ScaleReward,
    /// Reference score mean (for `"ref"`). Default `None`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ref_mean: Option<f64>,
    /// Reference score std (for `"ref"`), > 0. Default `None`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ref_std: Option<f64>,
    /// Scores are clipped to `[-cliprange_reward, cliprange_reward]`, > 0. Default 10.
    pub cliprange_reward: f64,
    /// Generation for evaluation (and for rollouts unless `gen_experience_kwargs` is set).
    pub gen_kwargs: GenKwargs,
    /// Generation for rollouts only. Default `None` (= `gen_kwargs`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gen_experience_kwargs: Option<GenKwargs>,
    /// Trainable blocks of the value branch, ≥ 0. Default 0.
    pub num_value_layers_unfrozen: i64,
}

impl Default for PpoMethodConfig {
    fn default() -> Self {
        PpoMethodConfig {
            name: "PPOConfig".into(),
            ppo_epochs: 4,
            num_rollouts: 128,
            chunk_size: 128,
            init_kl_coef: 0.001,
            target: None,
            horizon: 10000,
            gamma: 1.0,
            lam: 0.95,
            cliprange: 0.2,
            cliprange_value: 0.2,
            vf_coef: 1.0,
            scale_reward: ScaleReward::Ignored,
            ref_mean: None,
            ref_std: None,
            cliprange_reward: 10.0,
            gen_kwargs: GenKwargs::default(),
            gen_experience_kwargs: None,
            num_value_layers_unfrozen: 0,
        }
    }
}

impl PpoMethodConfig {
    /// The generation arguments for rollouts: `gen_experience_kwargs` when set, else
    /// `gen_kwargs`.
    ///
    /// ```
    /// use torchrl::trainers::config::{GenKwargs, PpoMethodConfig};
    /// let mut m = PpoMethodConfig::default();
    /// assert_eq!(m.experience_gen_kwargs().max_new_tokens, 40);
    /// m.gen_experience_kwargs = Some(GenKwargs { max_new_tokens: 8, ..GenKwargs::default() });
    /// assert_eq!(m.experience_gen_kwargs().max_new_tokens, 8);
    /// ```
    pub fn experience_gen_kwargs(&self) -> &GenKwargs {
        self.gen_experience_kwargs
            .as_ref()
            .unwrap_or(&self.gen_kwargs)
    }
}

impl TrlConfigOf<PpoMethodConfig> {
    /// Optimizer steps in one pass over a rollout: trlX's `len(store.create_loader(batch_size))`,
    /// `ceil(num_rollouts / batch_size)` (the last batch may be short).
    ///
    /// ```
    /// use torchrl::trainers::config::TrlConfig;
    /// let mut cfg = TrlConfig::default(); // 128 rollouts, batches of 32
    /// assert_eq!(cfg.batches_per_rollout(), 4);
    /// cfg.train.batch_size = 48;
    /// assert_eq!(cfg.batches_per_rollout(), 3);
    /// ```
    pub fn batches_per_rollout(&self) -> usize {
        self.method
            .num_rollouts
            .div_ceil(self.train.batch_size.max(1))
    }

    /// trlX's step budget: `min(train.total_steps, epochs * ppo_epochs * batches_per_rollout)`
    /// (`AcceleratePPOTrainer.prepare_learning`).
    ///
    /// ```
    /// use torchrl::trainers::config::TrlConfig;
    /// let cfg = TrlConfig::default();
    /// assert_eq!(cfg.total_steps(4), 1600); // 100 epochs * 4 ppo epochs * 4 batches < 10000
    /// assert_eq!(cfg.total_steps(100), 10000); // capped by train.total_steps
    /// ```
    pub fn total_steps(&self, batches_per_rollout: usize) -> usize {
        self.train
            .epochs
            .saturating_mul(self.method.ppo_epochs)
            .saturating_mul(batches_per_rollout)
            .min(self.train.total_steps)
    }
}

impl MethodConfig for PpoMethodConfig {
    fn default_config() -> TrlConfigOf<Self> {
        TrlConfigOf {
            train: TrainConfig::default(),
            model: ModelConfig::default(),
            tokenizer: TokenizerConfig::default(),
            optimizer: OptimizerConfig::default(),
            scheduler: SchedulerConfig::default(),
            method: PpoMethodConfig::default(),
        }
    }

    fn validate(&self) -> Result<()> {
        let m = self;
        at_least("method.ppo_epochs", m.ppo_epochs, 1)?;
        at_least("method.num_rollouts", m.num_rollouts, 1)?;
        at_least("method.chunk_size", m.chunk_size, 1)?;
        non_negative("method.init_kl_coef", m.init_kl_coef)?;
        if let Some(target) = m.target {
            positive("method.target", target)?;
        }
        at_least("method.horizon", m.horizon, 1)?;
        unit_closed("method.gamma", m.gamma)?;
        unit_closed("method.lam", m.lam)?;
        positive("method.cliprange", m.cliprange)?;
        positive("method.cliprange_value", m.cliprange_value)?;
        non_negative("method.vf_coef", m.vf_coef)?;
        if let Some(mean) = m.ref_mean {
            if !mean.is_finite() {
                return Err(Error::config(
                    OP,
                    "method.ref_mean",
                    "a finite number",
                    mean,
                ));
            }
        }
        if let Some(std) = m.ref_std {
            positive("method.ref_std", std)?;
        }
        positive("method.cliprange_reward", m.cliprange_reward)?;
        validate_gen(
            &m.gen_kwargs,
            [
                "method.gen_kwargs.max_new_tokens",
                "method.gen_kwargs.top_p",
                "method.gen_kwargs.temperature",
            ],
        )?;
        if let Some(g) = &m.gen_experience_kwargs {
            validate_gen(
                g,
                [
                    "method.gen_experience_kwargs.max_new_tokens",
                    "method.gen_experience_kwargs.top_p",
                    "method.gen_experience_kwargs.temperature",
                ],
            )?;
        }
        if m.num_value_layers_unfrozen < 0 {
            return Err(Error::config(
                OP,
                "method.num_value_layers_unfrozen",
                ">= 0",
                m.num_value_layers_unfrozen,
            ));
        }
        Ok(())
    }
}
