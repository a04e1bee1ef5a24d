//! GRPO (and its DAPO / Dr. GRPO variants) as a configuration of the trainer API: critic-free
//! on-policy RL in the shape of TRL's `GRPOTrainer` (rlhf.md §3.2), on the token env, the
//! hydra reference and TorchRL's [`GrpoLoss`].
//!
//! # One iteration
//! 1. **Rollout** ([`GrpoTrainer::make_experience`]): `chunk_size` completions at a time until
//!    `num_rollouts` are collected. The env ([`TokenEnvConfig::num_generations`] = the
//!    method's `num_generations`) serves each prompt in `G` consecutive rows; the policy
//!    samples (each group's prompt pass runs once and its KV cache is repeated to the group's
//!    rows: [`GenerateOptions::prompt_groups`](crate::modules::llm::GenerateOptions::prompt_groups),
//!    see [`GrpoTrainer::with_shared_prompts`]), and one trunk pass of the hydra model gives
//!    the rollout's log-probs (or, when the sampler's are the policy's, only the reference's
//!    side runs and the sampler's are kept: [`GrpoTrainer::with_sampler_log_probs`]) and the
//!    frozen reference's (the same step as the PPO-RLHF trainer's); the env scores each
//!    completion.
//! 2. **Group advantages** over the whole rollout ([`group_advantages`]): each group of `G`
//!    completions of one prompt is centred on its mean and scaled as `scale_rewards` says
//!    (TRL's `(r − mean) / (std + 1e-4)` by default). No value model, no GAE: every token of
//!    a completion shares its completion's advantage.
//! 3. **Learn**: `num_iterations` passes (TRL's μ) over the rollout in shuffled minibatches
//!    of `train.batch_size`; per minibatch [`GrpoLoss`] (log-space ratio clamp
//!    `[1 − epsilon, 1 + epsilon_high]`, the `loss_type` aggregation, `beta · k3` KL to the
//!    reference when `beta > 0`), global gradient-norm clipping, AdamW and the schedule.
//!
//! # Data-parallel ([`GrpoTrainer::with_collective`])
//! As TRL under `accelerate`: `num_rollouts`, `chunk_size` and `train.batch_size` are per
//! process; each rank generates its own completions (whole groups of `G`, so group advantages
//! are local, as TRL's gathered ones are) from its own generator and prompts, and trains on
//! its own minibatches. Per step each loss term is weighted by the rank's share of the global
//! minibatch's unit (response tokens for `dapo` / `bnpo` / `token_mean` and the TRL-form
//! entropy; completions for `grpo` / `dr_grpo` / `prompt_mean`) and the gradients are summed,
//! so a step equals one process on the concatenated minibatch (clipped global norm, identical
//! AdamW steps). `scale_rewards = "batch"` divides by the std of every rank's scores; the
//! iteration's and the steps' statistics are global (`ESS` is the token-weighted mean of the
//! ranks'); logging, evaluation and checkpoints run on rank 0.
//!
//! # Defaults: TRL's where they differ from TorchRL's
//! [`GrpoTrlConfig::default`] is TRL 1.16's `GRPOConfig`: `num_generations = 8`,
//! `beta = 0` (no KL term; DeepSeek-R1 used 0.001), `epsilon = 0.2`, `epsilon_high` unset
//! (= `epsilon`; DAPO: 0.28), `loss_type = "dapo"`, `scale_rewards = "group"`,
//! `num_iterations = 1`, a batch of 8 completions, `max_completion_length = 512`
//! (`gen_kwargs.max_new_tokens`), temperature 1, AdamW with lr 1e-6, betas (0.9, 0.999), no
//! weight decay, `max_grad_norm = 1`, seed 42, every layer trained, no entropy bonus
//! (`entropy_coeff`; TorchRL's `GRPOLoss` adds one at 0.01). TorchRL's `GRPOLoss`
//! defaults to `aggregation="token_mean"` and `MCAdvantage`'s `std.clamp_min(1e-6)`; both are
//! available (`loss_type = "token_mean"`, `scale_rewards = "group_clamp_min"`). One
//! difference remains: TRL decays the rate linearly to 0, this crate has trlX's cosine
//! schedule only, so the default keeps the rate constant (`eta_min = lr`); set
//! `scheduler.kwargs.T_max` to the step budget and `eta_min = 0` for a decaying one.
//!
//! # Logged statistics
//! Per optimizer step ([`Stats`]): `loss`, `loss_objective`, `clip_fraction`, `kl_approx`,
//! `ESS` (TorchRL's names), `loss_kl_to_ref` / `kl_to_ref` when `beta > 0`, `lr`,
//! `grad_norm`. Per iteration ([`IterationStats`]): the mean raw score, the mean k1 and k3 KL
//! to the reference (summed over each completion), `beta` as `kl_coef`, the mean completion
//! length, and the rollout and update times.
//!
//! ```
//! use torchrl::trainers::grpo::{GrpoLossType, GrpoTrlConfig, ScaleRewards};
//! # fn main() -> torchrl::Result<()> {
//! let cfg = GrpoTrlConfig::from_toml_str(
//!     r#"
//!     [method]
//!     num_generations = 4
//!     beta = 0.04
//!     epsilon_high = 0.28
//!     loss_type = "dr_grpo"
//!     "#,
//! )?;
//! assert_eq!(cfg.method.loss_type, GrpoLossType::DrGrpo);
//! assert_eq!(cfg.method.scale_rewards, ScaleRewards::Group); // TRL's default
//! # Ok(()) }
//! ```

use serde::{Deserialize, Serialize};
use tch::{Kind, Tensor};

use super::api::Stats;
use super::config::{
    at_least, non_negative, positive, validate_gen, AdamWKwargs, CosineKwargs, GenKwargs,
    MethodConfig, ModelConfig, OptimizerConfig, SchedulerConfig, TokenizerConfig, TrainConfig,
    TrlConfigOf,
};
use super::on_policy::{IterationStats, Learner, OnPolicyMethod, OnPolicyTrainer, Parts};
use super::optim::{AdamW, CosineAnnealingLr};
use super::parallel::{train_schedule_fields, Collective, SharedCollective};
use super::rollout::{check_vocab, generation_config, trainable_params, update_policy};
use crate::envs::llm::moments::BatchMoments;
use crate::envs::llm::{TokenEnv, TokenEnvConfig};
use crate::envs::TransformedEnv;
use crate::error::{Error, Result};
use crate::modules::llm::keys::{ASSISTANT_MASK_KEY, FULL_LOG_PROBS_KEY, REF_LOG_PROBS_KEY};
use crate::modules::llm::{CausalLmWithHydraValueHead, TextTokenizer};
use crate::objectives::llm::{
    group_advantages, GroupScale, GrpoAggregation, GrpoConfig, GrpoKeys, GrpoLoss, TRL_STD_EPS,
};
use crate::objectives::{LossModule, LossOutput};
use crate::tensordict::TensorDict;

const OP: &str = "GrpoTrainer";

// ------------------------------------------------------------------------------ config

/// TRL's `loss_type` (and TorchRL's `aggregation`): how the token objective is reduced
/// ([`GrpoAggregation`]). Serialised as the references' strings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GrpoLossType {
    /// `"grpo"`: per-sequence mean, then batch mean.
    Grpo,
    /// `"bnpo"`: token mean over the minibatch.
    Bnpo,
    /// `"dr_grpo"`: sum / (B · `max_completion_length`).
    DrGrpo,
    /// `"dapo"` (TRL's default): sum / active tokens of the minibatch (one optimizer step
    /// here is one minibatch, TRL's accumulated batch).
    #[default]
    Dapo,
    /// `"token_mean"`: TorchRL's default aggregation.
    TokenMean,
    /// `"prompt_mean"`: TorchRL's per-prompt mean.
    PromptMean,
}

impl GrpoLossType {
    /// The [`GrpoAggregation`] for completions of at most `max_completion_length` tokens.
    pub fn aggregation(self, max_completion_length: i64) -> GrpoAggregation {
        match self {
            GrpoLossType::Grpo => GrpoAggregation::Grpo,
            GrpoLossType::Bnpo => GrpoAggregation::Bnpo,
            GrpoLossType::DrGrpo => GrpoAggregation::DrGrpo {
                max_completion_length: Some(max_completion_length),
            },
            GrpoLossType::Dapo => GrpoAggregation::Dapo {
                active_tokens: None,
            },
            GrpoLossType::TokenMean => GrpoAggregation::TokenMean,
            GrpoLossType::PromptMean => GrpoAggregation::PromptMean,
        }
    }
}

/// TRL's `scale_rewards` (plus TorchRL `MCAdvantage`'s rule): the divisor of the group-centred
/// rewards ([`GroupScale`]). Serialised as TRL's strings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScaleRewards {
    /// `"group"` (TRL's default): `/ (std_group + 1e-4)`.
    #[default]
    Group,
    /// `"batch"`: `/ (std_batch + 1e-4)`, over the whole rollout.
    Batch,
    /// `"none"`: no scaling (Dr. GRPO).
    None,
    /// `"group_clamp_min"`: `/ std_group.clamp_min(1e-6)`, TorchRL's `MCAdvantage`.
    GroupClampMin,
}

impl ScaleRewards {
    /// The [`GroupScale`] this names.
    pub fn group_scale(self) -> GroupScale {
        match self {
            ScaleRewards::Group => GroupScale::StdPlusEps,
            ScaleRewards::Batch => GroupScale::BatchStdPlusEps,
            ScaleRewards::None => GroupScale::None,
            ScaleRewards::GroupClampMin => GroupScale::StdClampMin,
        }
    }
}

/// The GRPO method section, with TRL's `GRPOConfig` names and defaults (the [module
/// docs](self) list them) and trlX's rollout fields.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GrpoMethodConfig {
    /// The method's name. Default `"GRPOConfig"`.
    pub name: String,
    /// Completions per prompt `G`, ≥ 2 (a group std needs two). Default 8.
    pub num_generations: usize,
    /// Completions collected per iteration (TRL's `generation_batch_size`), a multiple of
    /// `num_generations`. Default 8.
    pub num_rollouts: usize,
    /// Completions generated at once (the env's batch), a multiple of `num_generations`.
    /// Default 8.
    pub chunk_size: usize,
    /// Optimisation passes over each rollout (TRL's μ), ≥ 1. Default 1.
    pub num_iterations: usize,
    /// The k3 KL coefficient β in the loss, ≥ 0; 0 runs no KL term. Default 0.
    pub beta: f64,
    /// The lower clip ε: `ρ ≥ 1 − epsilon`, in (0, 1). Default 0.2.
    pub epsilon: f64,
    /// The upper clip: `ρ ≤ 1 + epsilon_high`, > 0; `None` = `epsilon` (DAPO: 0.28).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub epsilon_high: Option<f64>,
    /// The aggregation. Default `"dapo"`.
    pub loss_type: GrpoLossType,
    /// The advantage scaling. Default `"group"`.
    pub scale_rewards: ScaleRewards,
    /// The entropy bonus coefficient (`loss −= coeff · mean entropy`, the exact entropy of
    /// the policy's softmax), ≥ 0. Default `None`: no bonus, as TRL (TorchRL's `GRPOLoss`
    /// defaults to 0.01).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub entropy_coeff: Option<f64>,
    /// Generation for rollouts and evaluation (`max_new_tokens` is TRL's
    /// `max_completion_length`, default 512; temperature 1, no top-k / top-p).
    pub gen_kwargs: GenKwargs,
}

impl Default for GrpoMethodConfig {
    fn default() -> Self {
        GrpoMethodConfig {
            name: "GRPOConfig".into(),
            num_generations: 8,
            num_rollouts: 8,
            chunk_size: 8,
            num_iterations: 1,
            beta: 0.0,
            epsilon: 0.2,
            epsilon_high: None,
            loss_type: GrpoLossType::Dapo,
            scale_rewards: ScaleRewards::Group,
            entropy_coeff: None,
            gen_kwargs: GenKwargs {
                max_new_tokens: 512,
                ..GenKwargs::default()
            },
        }
    }
}

impl GrpoMethodConfig {
    /// The [`GrpoConfig`] of the loss.
    pub fn loss_config(&self) -> GrpoConfig {
        GrpoConfig::new()
            .with_clip_epsilon_asymmetric(self.epsilon, self.epsilon_high.unwrap_or(self.epsilon))
            .with_aggregation(
                self.loss_type
                    .aggregation(self.gen_kwargs.max_new_tokens as i64),
            )
            .with_kl_to_ref_coeff((self.beta > 0.0).then_some(self.beta))
            .with_entropy_coeff(self.entropy_coeff)
    }
}

/// The whole GRPO config (`train`, `model`, …, `method`), TRL's defaults.
pub type GrpoTrlConfig = TrlConfigOf<GrpoMethodConfig>;

/// TRL's `TrainingArguments` defaults shared by the GRPO and DPO configs: lr 1e-6, AdamW
/// betas (0.9, 0.999) without weight decay, a constant rate, `max_grad_norm = 1`, seed 42,
/// every layer trained, a batch of 8.
pub(crate) fn trl_defaults<M>(trainer: &str, method: M) -> TrlConfigOf<M> {
    let lr = 1e-6;
    TrlConfigOf {
        train: TrainConfig {
            batch_size: 8,
            seed: 42,
            max_grad_norm: Some(1.0),
            trainer: trainer.into(),
            ..TrainConfig::default()
        },
        model: ModelConfig {
            num_layers_unfrozen: -1,
            ..ModelConfig::default()
        },
        tokenizer: TokenizerConfig::default(),
        optimizer: OptimizerConfig {
            kwargs: AdamWKwargs {
                lr,
                betas: [0.9, 0.999],
                eps: 1e-8,
                weight_decay: 0.0,
                fused: false,
            },
            ..OptimizerConfig::default()
        },
        scheduler: SchedulerConfig {
            kwargs: CosineKwargs {
                t_max: 1e12,
                eta_min: lr,
            },
            ..SchedulerConfig::default()
        },
        method,
    }
}

impl MethodConfig for GrpoMethodConfig {
    fn default_config() -> TrlConfigOf<Self> {
        trl_defaults("GRPOTrainer", GrpoMethodConfig::default())
    }

    fn validate(&self) -> Result<()> {
        let m = self;
        at_least("method.num_generations", m.num_generations, 2)?;
        at_least("method.num_iterations", m.num_iterations, 1)?;
        for (field, n) in [
            ("method.num_rollouts", m.num_rollouts),
            ("method.chunk_size", m.chunk_size),
        ] {
            if n == 0 || n % m.num_generations != 0 {
                return Err(Error::config(
                    "TrlConfig::validate",
                    field,
                    format!(
                        "a positive multiple of method.num_generations = {} (whole groups)",
                        m.num_generations
                    ),
                    n,
                ));
            }
        }
        non_negative("method.beta", m.beta)?;
        if !(m.epsilon > 0.0 && m.epsilon < 1.0) {
            return Err(Error::config(
                "TrlConfig::validate",
                "method.epsilon",
                "a number in (0, 1)",
                m.epsilon,
            ));
        }
        if let Some(hi) = m.epsilon_high {
            positive("method.epsilon_high", hi)?;
        }
        if let Some(c) = m.entropy_coeff {
            non_negative("method.entropy_coeff", c)?;
        }
        validate_gen(
            &m.gen_kwargs,
            [
                "method.gen_kwargs.max_new_tokens",
                "method.gen_kwargs.top_p",
                "method.gen_kwargs.temperature",
            ],
        )
    }
}

impl GrpoTrlConfig {
    /// Optimizer steps per iteration: `num_iterations · ceil(num_rollouts / batch_size)`.
    pub fn steps_per_iteration(&self) -> usize {
        self.method.num_iterations.saturating_mul(
            self.method
                .num_rollouts
                .div_ceil(self.train.batch_size.max(1)),
        )
    }

    /// The step budget: `min(train.total_steps, epochs · steps_per_iteration)`.
    pub fn total_steps(&self) -> usize {
        self.train
            .epochs
            .saturating_mul(self.steps_per_iteration())
            .min(self.train.total_steps)
    }
}

// ------------------------------------------------------------------------------ trainer

/// A GRPO trainer (see the [module docs](self)): the [on-policy loop](OnPolicyTrainer) with
/// [`GrpoMethod`].
pub type GrpoTrainer = OnPolicyTrainer<GrpoMethod>;

/// GRPO's part of the on-policy loop: TRL's config and the loss settings.
#[derive(Debug)]
pub struct GrpoMethod {
    config: GrpoTrlConfig,
    loss_config: GrpoConfig,
    share_prompts: bool,
    sampler_log_probs: bool,
}

/// The keys the trainer hands [`GrpoLoss`]: TorchRL's, with the reference log-probs where
/// the hydra trunk pass writes them (`("ref_log_probs", "full")`).
fn loss_keys() -> GrpoKeys {
    GrpoKeys {
        ref_log_probs: REF_LOG_PROBS_KEY.into(),
        ..GrpoKeys::default()
    }
}

impl OnPolicyTrainer<GrpoMethod> {
    /// A trainer of `model`'s policy on the prompts and scorer of `env`, with `config`
    /// (validated). The value head of the model is not trained; its frozen reference branch
    /// gives the KL term's log-probs. Errors on an invalid config, a tokenizer or env whose
    /// vocabulary differs from the model's, an env whose batch is not `chunk_size` or whose
    /// `num_generations` differs from the method's, or generation settings the env cannot
    /// take.
    pub fn new(
        config: GrpoTrlConfig,
        model: CausalLmWithHydraValueHead,
        env: TokenEnv,
        tokenizer: Box<dyn TextTokenizer>,
    ) -> Result<Self> {
        config.validate()?;
        check_vocab(OP, &model, &env, tokenizer.as_ref())?;
        let m = &config.method;
        let ec: &TokenEnvConfig = env.config();
        if ec.batch_size != m.chunk_size as i64 {
            return Err(Error::config(
                OP,
                "method.chunk_size",
                format!("the env's batch size, {}", ec.batch_size),
                m.chunk_size,
            ));
        }
        if ec.num_generations != m.num_generations as i64 {
            return Err(Error::config(
                OP,
                "method.num_generations",
                format!(
                    "the env's TokenEnvConfig::num_generations, {}",
                    ec.num_generations
                ),
                m.num_generations,
            ));
        }
        if m.num_rollouts > m.chunk_size && env.prompt_width().is_none() {
            return Err(Error::config(
                OP,
                "method.num_rollouts",
                "at most chunk_size, or an env with a fixed TokenEnvConfig::prompt_width \
                 (chunks of rollouts are concatenated along the batch)",
                m.num_rollouts,
            ));
        }
        let gen = generation_config(OP, "method.gen_kwargs", &m.gen_kwargs, &env)?;
        let loss_config = m.loss_config();
        loss_config.validate()?;
        let opt = AdamW::from_kwargs(trainable_params(&model, false), &config.optimizer.kwargs)?;
        let sched =
            CosineAnnealingLr::from_kwargs(config.optimizer.kwargs.lr, &config.scheduler.kwargs)?;
        let parts = Parts {
            model,
            env: TransformedEnv::new(env)?,
            tokenizer,
            rollout_gen: gen.clone(),
            eval_gen: gen,
            opt,
            sched,
        };
        let method = GrpoMethod {
            config,
            loss_config,
            share_prompts: true,
            sampler_log_probs: true,
        };
        Ok(OnPolicyTrainer::from_parts(method, parts))
    }

    /// The loss settings.
    pub fn loss_config(&self) -> &GrpoConfig {
        &self.method.loss_config
    }

    /// Whether the rollout runs the prompt pass of each group once (`true` by default): the
    /// env serves each prompt in `num_generations` consecutive rows, so generation computes
    /// the prompt's KV cache on one row per group and repeats it to the group
    /// ([`GenerateOptions::prompt_groups`](crate::modules::llm::GenerateOptions::prompt_groups)).
    /// The rollout is the same either way: the same tokens from the same seed and the same
    /// log-probs.
    pub fn with_shared_prompts(mut self, on: bool) -> Self {
        self.method.share_prompts = on;
        self
    }

    /// Whether the rollout's policy log-probs are the sampler's when they are the model's
    /// (`true` by default): then the rollout's hydra pass computes only the reference's
    /// log-probs (and the frozen trunk's output), not the policy's upper blocks and LM head
    /// over every sequence again. The condition
    /// ([`GenerationConfig::log_probs_are_the_models`](crate::modules::llm::GenerationConfig::log_probs_are_the_models))
    /// is conservative: greedy decoding or temperature 1, a float32 / float64 model, no active
    /// LoRA dropout; otherwise the pass recomputes them as with `false`. The stored
    /// `("log_probs", "full")` then equal the recomputed ones up to float rounding on the
    /// response tokens (the loss and statistics read no others; the prompt's are 0), and the
    /// store holds no `"values"` (GRPO trains no value head).
    pub fn with_sampler_log_probs(mut self, on: bool) -> Self {
        self.method.sampler_log_probs = on;
        self
    }
}

impl GrpoMethod {
    /// The group advantages of `score` `[B]` (f64): TRL's rule; under `scale_rewards =
    /// "batch"` in a group, the std is that of every rank's scores (TRL scales the gathered
    /// rewards).
    fn advantages(&self, score: &Tensor, collective: &SharedCollective) -> Result<Tensor> {
        let g = self.config.method.num_generations as i64;
        let scale = self.config.method.scale_rewards.group_scale();
        if collective.world_size() == 1 || scale != GroupScale::BatchStdPlusEps {
            return group_advantages(score, g, scale);
        }
        let centred = group_advantages(score, g, GroupScale::None)?;
        let global = collective.all_reduce_moments(&BatchMoments::of(score)?)?;
        let std = (global.m2() / (global.count() - 1.0).max(1.0)).sqrt();
        Ok(centred.f_div_scalar(std + TRL_STD_EPS)?)
    }

    /// This rank's shares of the global minibatch: `(response tokens, completions)`, each
    /// local / global (1 in one process).
    fn shares(mb: &TensorDict, collective: &SharedCollective) -> Result<(f64, f64)> {
        if collective.world_size() == 1 {
            return Ok((1.0, 1.0));
        }
        let tokens = mb
            .get_or_err(ASSISTANT_MASK_KEY)?
            .f_ne(0)?
            .f_count_nonzero(None::<i64>)?
            .int64_value(&[]) as f64;
        let rows = mb.batch_size().first().copied().unwrap_or(0) as f64;
        let global = collective.sum_scalars(&[tokens, rows])?;
        let share = |local: f64, i: usize| local / global.get(i).copied().unwrap_or(1.0).max(1.0);
        Ok((share(tokens, 0), share(rows, 1)))
    }
}

impl OnPolicyMethod for GrpoMethod {
    type Config = GrpoTrlConfig;
    const NAME: &'static str = "GrpoTrainer";

    fn config(&self) -> &GrpoTrlConfig {
        &self.config
    }

    fn train(&self) -> &TrainConfig {
        &self.config.train
    }

    fn num_rollouts(&self) -> usize {
        self.config.method.num_rollouts
    }

    fn passes(&self) -> usize {
        self.config.method.num_iterations
    }

    /// `num_generations` (the env serves each prompt in that many consecutive rows), unless
    /// [`with_shared_prompts(false)`](OnPolicyTrainer::with_shared_prompts).
    fn prompt_groups(&self) -> usize {
        if self.share_prompts {
            self.config.method.num_generations
        } else {
            1
        }
    }

    /// `true`, unless [`with_sampler_log_probs(false)`](OnPolicyTrainer::with_sampler_log_probs).
    fn sampler_log_probs(&self) -> bool {
        self.sampler_log_probs
    }

    /// [`GrpoTrlConfig::total_steps`].
    fn total_steps(&self) -> usize {
        self.config.total_steps()
    }

    fn schedule_fields(&self) -> Vec<(&'static str, f64)> {
        let t = &self.config.train;
        let m = &self.config.method;
        let mut fields = train_schedule_fields(t);
        fields.extend([
            ("method.num_rollouts", m.num_rollouts as f64),
            ("method.chunk_size", m.chunk_size as f64),
            ("method.num_generations", m.num_generations as f64),
            ("method.num_iterations", m.num_iterations as f64),
            ("method.beta", m.beta),
        ]);
        fields
    }

    /// Writes the store's advantages and computes its statistics (over every rank).
    fn prepare_store(
        &mut self,
        store: &mut TensorDict,
        collective: &SharedCollective,
    ) -> Result<IterationStats> {
        let score = store
            .get_or_err(("next", "score"))?
            .f_to_kind(Kind::Double)?;
        let advantage = self.advantages(&score, collective)?;
        store.set("advantage", advantage.f_to_kind(Kind::Float)?)?;
        let assistant = store
            .get_or_err(ASSISTANT_MASK_KEY)?
            .f_to_kind(Kind::Double)?;
        let d = store
            .get_or_err(REF_LOG_PROBS_KEY)?
            .f_sub(store.get_or_err(FULL_LOG_PROBS_KEY)?)?
            .f_to_kind(Kind::Double)?;
        let per_seq = |t: Tensor| -> Result<f64> {
            Ok(t.f_mul(&assistant)?
                .f_sum_dim_intlist(1, false, Kind::Double)?
                .f_mean(Kind::Double)?
                .double_value(&[]))
        };
        let local = [
            score.f_mean(Kind::Double)?.double_value(&[]),
            per_seq(d.f_neg()?)?,
            per_seq(d.f_expm1()?.f_sub(&d)?)?,
            per_seq(assistant.ones_like())?,
        ];
        // every rank holds num_rollouts completions: the global means are the ranks' mean
        let [score, kl, kl_k3, response_length] = if collective.world_size() > 1 {
            let world = collective.world_size() as f64;
            let sums = collective.sum_scalars(&local)?;
            let at = |i: usize| sums.get(i).copied().unwrap_or(f64::NAN) / world;
            [at(0), at(1), at(2), at(3)]
        } else {
            local
        };
        Ok(IterationStats {
            iteration: 0,
            iter_count: 0,
            score,
            kl,
            kl_k3,
            kl_coef: self.config.method.beta,
            response_length,
            update: Stats::new(),
            rollout_s: 0.0,
            update_s: 0.0,
        })
    }

    /// One optimizer step on the minibatch `mb` of the store; returns its statistics (over
    /// every rank's minibatch in a group).
    fn train_step(&mut self, learner: &mut Learner<'_>, mb: TensorDict) -> Result<Stats> {
        let collective = learner.collective;
        let loss = GrpoLoss::new(update_policy(learner.model, &mb))
            .with_config(self.loss_config.clone())?
            .with_keys(loss_keys());
        let out = loss.forward(&mb)?;
        let (token_share, row_share) = Self::shares(&mb, collective)?;
        let per_completion = matches!(
            self.loss_config.aggregation,
            GrpoAggregation::Grpo | GrpoAggregation::PromptMean | GrpoAggregation::DrGrpo { .. }
        );
        let unit_share = if per_completion {
            row_share
        } else {
            token_share
        };
        let trl = self.loss_config.aggregation.is_trl();
        // the term's weight: its denominator's share (grpo_loss: the TRL-form entropy and the
        // TorchRL-form KL are token means, the rest follow the aggregation)
        let share = |name: &str| match name {
            "loss_entropy" if trl => token_share,
            "loss_kl_to_ref" if !trl => token_share,
            _ => unit_share,
        };
        let total = if collective.world_size() == 1 {
            out.total_loss()?
        } else {
            let mut total: Option<Tensor> = None;
            for (name, term) in out.loss_terms() {
                let w = term.f_mul_scalar(share(name))?;
                total = Some(match total {
                    Some(t) => t.f_add(&w)?,
                    None => w,
                });
            }
            total.ok_or_else(|| Error::invalid(OP, "the loss has no terms"))?
        };
        let (lr, grad_norm) = learner.step(&total)?;
        let mut named: Vec<(String, f64, f64)> = out
            .loss_terms()
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.double_value(&[]), share(k)))
            .chain(
                out.metrics()
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), v.double_value(&[]), token_share)),
            )
            .collect();
        named.push(("loss".into(), total.double_value(&[]), 1.0));
        let mut stats: Stats = if collective.world_size() == 1 {
            named.into_iter().map(|(k, v, _)| (k, v)).collect()
        } else {
            let shares: Vec<f64> = named.iter().map(|(_, v, w)| v * w).collect();
            let sums = collective.sum_scalars(&shares)?;
            named.into_iter().map(|(k, ..)| k).zip(sums).collect()
        };
        stats.insert("lr".into(), lr);
        if let Some(norm) = grad_norm {
            stats.insert("grad_norm".into(), norm);
        }
        Ok(stats)
    }
}
