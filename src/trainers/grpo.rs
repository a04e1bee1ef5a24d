//! GRPO (and its DAPO / Dr. GRPO variants) as a configuration of the trainer API: critic-free
//! on-policy RL in the shape of TRL's `GRPOTrainer` (rlhf.md §3.2), on the token env, the
//! hydra reference and TorchRL's [`GrpoLoss`].
//!
//! # One iteration
//! 1. **Rollout** ([`GrpoTrainer::make_experience`]): `chunk_size` completions at a time until
//!    `num_rollouts` are collected. The env ([`TokenEnvConfig::num_generations`] = the
//!    method's `num_generations`) serves each prompt in `G` consecutive rows; the policy
//!    samples, and one trunk pass of the hydra model gives the rollout's log-probs and the
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

use std::time::Instant;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tch::{Kind, Tensor};

use super::api::{
    rng_from_json, rng_to_json, take_component, Callbacks, Component, EvalReport, Evaluation,
    RlTrainer, Stats,
};
use super::config::{
    at_least, non_negative, positive, validate_gen, AdamWKwargs, CosineKwargs, GenKwargs,
    MethodConfig, ModelConfig, OptimizerConfig, SchedulerConfig, TokenizerConfig, TrainConfig,
    TrlConfigOf,
};
use super::optim::{AdamW, CosineAnnealingLr};
use super::parallel::{join_group, rank_seed, train_schedule_fields, Collective, SharedCollective};
use super::ppo::IterationStats;
use super::rollout::{
    check_store_rows, check_vocab, generate_text, generation_config, hydra_policy_step,
    permutation, policy_params, prompt_batch, prompt_state_json, reference_params,
    set_prompt_state_json, trainable_params, update_policy, StateFields,
};
use crate::envs::llm::moments::BatchMoments;
use crate::envs::llm::{TokenEnv, TokenEnvConfig};
use crate::envs::EnvBase;
use crate::error::{Error, Result};
use crate::modules::llm::keys::{ASSISTANT_MASK_KEY, FULL_LOG_PROBS_KEY, REF_LOG_PROBS_KEY};
use crate::modules::llm::{CausalLmWithHydraValueHead, GenerationConfig, TextTokenizer};
use crate::objectives::llm::{
    group_advantages, GroupScale, GrpoAggregation, GrpoConfig, GrpoKeys, GrpoLoss, TRL_STD_EPS,
};
use crate::objectives::{LossModule, LossOutput};
use crate::rng::Generator;
use crate::tensordict::{cat, BatchIndex, TensorDict};

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

/// A GRPO trainer (see the [module docs](self)).
pub struct GrpoTrainer {
    config: GrpoTrlConfig,
    model: CausalLmWithHydraValueHead,
    env: TokenEnv,
    tokenizer: Box<dyn TextTokenizer>,
    gen: GenerationConfig,
    loss_config: GrpoConfig,
    opt: AdamW,
    sched: CosineAnnealingLr,
    rng: Generator,
    store: Option<TensorDict>,
    iter_count: usize,
    epoch: usize,
    evaluation: Evaluation,
    history: Vec<IterationStats>,
    collective: SharedCollective,
    cache_trunk: bool,
}

impl std::fmt::Debug for GrpoTrainer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrpoTrainer")
            .field("iter_count", &self.iter_count)
            .field("epoch", &self.epoch)
            .field("loss", &self.loss_config)
            .finish_non_exhaustive()
    }
}

/// The keys the trainer hands [`GrpoLoss`]: TorchRL's, with the reference log-probs where
/// the hydra trunk pass writes them (`("ref_log_probs", "full")`).
fn loss_keys() -> GrpoKeys {
    GrpoKeys {
        ref_log_probs: REF_LOG_PROBS_KEY.into(),
        ..GrpoKeys::default()
    }
}

impl GrpoTrainer {
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
        Ok(GrpoTrainer {
            rng: Generator::new(config.train.seed),
            config,
            model,
            env,
            tokenizer,
            gen,
            loss_config,
            opt,
            sched,
            store: None,
            iter_count: 0,
            epoch: 0,
            evaluation: Evaluation::default(),
            history: Vec::new(),
            collective: SharedCollective::default(),
            cache_trunk: true,
        })
    }

    /// Sets what [`RlTrainer::evaluate`] runs.
    pub fn with_evaluation(mut self, evaluation: Evaluation) -> Self {
        self.evaluation = evaluation;
        self
    }

    /// Makes this trainer one rank of a data-parallel group (see the
    /// [module docs](self#data-parallel-grpotrainerwith_collective)): checks that every rank
    /// has rank 0's schedule, copies rank 0's policy and reference parameters to every rank,
    /// and gives ranks `> 0` generators of their own ([`rank_seed`]). Every rank must call it;
    /// each rank's env should serve its own prompts.
    ///
    /// # Errors
    /// [`Error::Distributed`] when a rank's schedule differs from rank 0's (naming the
    /// fields), or the group fails.
    pub fn with_collective(mut self, collective: impl Collective + 'static) -> Result<Self> {
        let shared = SharedCollective::new(collective);
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
        let params = [policy_params(&self.model), reference_params(&self.model)];
        let params: Vec<&[(String, Tensor)]> = params.iter().map(Vec::as_slice).collect();
        join_group(
            &shared,
            "GrpoTrainer::with_collective",
            &fields,
            &params,
            &mut self.opt,
        )?;
        if shared.rank() > 0 {
            self.rng = Generator::new(rank_seed(self.config.train.seed, shared.rank()));
        }
        self.collective = shared;
        Ok(self)
    }

    /// Whether rollouts keep the frozen trunk's output (`true` by default) so that every
    /// update forward starts above the frozen blocks ([`CachedTrunk`]): the same log-probs and
    /// values up to rounding, without re-running `n_layer − num_layers_unfrozen` blocks per
    /// update. The cost is memory: `num_rollouts × T × n_embd` floats in the store (GPT-2
    /// small, 512 rollouts of 1,024 tokens: 1.6 GB). No effect with a full-copy reference.
    ///
    /// [`CachedTrunk`]: crate::objectives::llm::CachedTrunk
    pub fn with_trunk_cache(mut self, on: bool) -> Self {
        self.cache_trunk = on;
        self
    }

    /// The group this trainer is a rank of ([`SingleProcess`](super::parallel::SingleProcess)
    /// unless [`GrpoTrainer::with_collective`] was called).
    pub fn collective(&self) -> &SharedCollective {
        &self.collective
    }

    /// The whole config.
    pub fn config(&self) -> &GrpoTrlConfig {
        &self.config
    }

    /// The model (policy, unused value head, frozen reference).
    pub fn model(&self) -> &CausalLmWithHydraValueHead {
        &self.model
    }

    /// The loss settings derived from the method section.
    pub fn loss_config(&self) -> &GrpoConfig {
        &self.loss_config
    }

    /// Iterations finished, counting those of a loaded checkpoint.
    pub fn epoch(&self) -> usize {
        self.epoch
    }

    /// What each finished iteration measured.
    pub fn history(&self) -> &[IterationStats] {
        &self.history
    }

    /// The current rollout (after [`GrpoTrainer::make_experience`]), with its `"advantage"`
    /// `[B]`.
    pub fn store(&self) -> Option<&TensorDict> {
        self.store.as_ref()
    }

    /// The step budget ([`GrpoTrlConfig::total_steps`]).
    pub fn total_steps(&self) -> usize {
        self.config.total_steps()
    }

    /// Collects `num_rollouts` scored completions into the store (replacing the previous
    /// ones) and writes their group advantages. Returns the rollout's statistics.
    pub fn make_experience(&mut self) -> Result<IterationStats> {
        let start = Instant::now();
        let want = self.config.method.num_rollouts;
        let mut chunks = Vec::new();
        let mut have = 0usize;
        while have < want {
            let td = self.env.reset(None)?;
            let td =
                hydra_policy_step(&self.model, &mut self.rng, td, &self.gen, self.cache_trunk)?;
            let td = self.env.step(td)?;
            have += td.batch_size().first().copied().unwrap_or(0).max(1) as usize;
            chunks.push(td);
        }
        let mut store = cat(&chunks, 0)?;
        if have > want {
            store = store.index(&[BatchIndex::slice(None, Some(want as i64), 1)])?;
        }
        self.prepare_store(store, start)
    }

    /// The learning half of an iteration on a given rollout store (offline replay, or a fixed
    /// store for a reproducible step): its group advantages and statistics are computed, it
    /// replaces the current store, then `num_iterations` passes of shuffled minibatches with
    /// the callbacks that are due, as in [`GrpoTrainer::iteration`].
    ///
    /// The store needs what [`GrpoTrainer::make_experience`] writes: `("tokens", "full")`,
    /// `("masks", "all_attention_mask")`, `("masks", "all_assistant_mask")`,
    /// `("log_probs", "full")`, `("ref_log_probs", "full")` (all `[B, T]`) and
    /// `("next", "score")` `[B]`, its rows in groups of `num_generations` consecutive
    /// completions of one prompt. **Data-parallel**: each rank passes its own whole groups;
    /// when each minibatch is a rank's whole share, a run equals one process on the
    /// concatenated store (up to rounding).
    ///
    /// # Errors
    /// An empty store, a missing key, a batch that is not whole groups, or as
    /// [`GrpoTrainer::iteration`].
    pub fn learn_on(
        &mut self,
        store: TensorDict,
        callbacks: &mut Callbacks<'_>,
    ) -> Result<IterationStats> {
        check_store_rows("GrpoTrainer::learn_on", &store)?;
        let stats = self.prepare_store(store, Instant::now())?;
        self.update_phase(stats, callbacks)
    }

    /// The group advantages of `score` `[B]` (f64): TRL's rule; under `scale_rewards =
    /// "batch"` in a group, the std is that of every rank's scores (TRL scales the gathered
    /// rewards).
    fn advantages(&self, score: &Tensor) -> Result<Tensor> {
        let g = self.config.method.num_generations as i64;
        let scale = self.config.method.scale_rewards.group_scale();
        if self.collective.world_size() == 1 || scale != GroupScale::BatchStdPlusEps {
            return group_advantages(score, g, scale);
        }
        let centred = group_advantages(score, g, GroupScale::None)?;
        let global = self
            .collective
            .all_reduce_moments(&BatchMoments::of(score)?)?;
        let std = (global.m2() / (global.count() - 1.0).max(1.0)).sqrt();
        Ok(centred.f_div_scalar(std + TRL_STD_EPS)?)
    }

    /// Writes the store's advantages, computes its statistics (over every rank) and keeps it.
    fn prepare_store(&mut self, mut store: TensorDict, start: Instant) -> Result<IterationStats> {
        let score = store
            .get_or_err(("next", "score"))?
            .f_to_kind(Kind::Double)?;
        let advantage = self.advantages(&score)?;
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
        let [score, kl, kl_k3, response_length] = if self.collective.world_size() > 1 {
            let world = self.collective.world_size() as f64;
            let sums = self.collective.sum_scalars(&local)?;
            let at = |i: usize| sums.get(i).copied().unwrap_or(f64::NAN) / world;
            [at(0), at(1), at(2), at(3)]
        } else {
            local
        };
        let stats = IterationStats {
            iteration: self.epoch,
            iter_count: self.iter_count,
            score,
            kl,
            kl_k3,
            kl_coef: self.config.method.beta,
            response_length,
            update: Stats::new(),
            rollout_s: start.elapsed().as_secs_f64(),
            update_s: 0.0,
        };
        self.store = Some(store);
        Ok(stats)
    }

    /// This rank's shares of the global minibatch: `(response tokens, completions)`, each
    /// local / global (1 in one process).
    fn shares(&self, mb: &TensorDict) -> Result<(f64, f64)> {
        if self.collective.world_size() == 1 {
            return Ok((1.0, 1.0));
        }
        let tokens = mb
            .get_or_err(ASSISTANT_MASK_KEY)?
            .f_ne(0)?
            .f_count_nonzero(None::<i64>)?
            .int64_value(&[]) as f64;
        let rows = mb.batch_size().first().copied().unwrap_or(0) as f64;
        let global = self.collective.sum_scalars(&[tokens, rows])?;
        let share = |local: f64, i: usize| local / global.get(i).copied().unwrap_or(1.0).max(1.0);
        Ok((share(tokens, 0), share(rows, 1)))
    }

    /// One optimizer step on the minibatch `mb` of the store; returns its statistics (over
    /// every rank's minibatch in a group).
    fn train_step(&mut self, mb: &TensorDict) -> Result<Stats> {
        let loss = GrpoLoss::new(update_policy(&self.model, mb))
            .with_config(self.loss_config.clone())?
            .with_keys(loss_keys());
        let out = loss.forward(mb)?;
        let (token_share, row_share) = self.shares(mb)?;
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
        let total = if self.collective.world_size() == 1 {
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
        let c = self.collective.clone();
        let grad_norm =
            self.opt
                .backward_step_with(&total, self.config.train.max_grad_norm, |params| {
                    c.all_reduce_sum_gradients(params)
                })?;
        let lr = self.sched.step();
        self.opt.set_lr(lr);
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
        let mut stats: Stats = if self.collective.world_size() == 1 {
            named.into_iter().map(|(k, v, _)| (k, v)).collect()
        } else {
            let shares: Vec<f64> = named.iter().map(|(_, v, w)| v * w).collect();
            let sums = self.collective.sum_scalars(&shares)?;
            named.into_iter().map(|(k, ..)| k).zip(sums).collect()
        };
        stats.insert("lr".into(), lr);
        if let Some(norm) = grad_norm {
            stats.insert("grad_norm".into(), norm);
        }
        Ok(stats)
    }

    /// One iteration: a rollout, its group advantages, then `num_iterations` passes of
    /// minibatch updates, each step followed by the callbacks that are due.
    pub fn iteration(&mut self, callbacks: &mut Callbacks<'_>) -> Result<IterationStats> {
        let stats = self.make_experience()?;
        self.update_phase(stats, callbacks)
    }

    /// `num_iterations` passes of minibatch updates on the store, each step followed by the
    /// callbacks that are due.
    fn update_phase(
        &mut self,
        mut stats: IterationStats,
        callbacks: &mut Callbacks<'_>,
    ) -> Result<IterationStats> {
        let start = Instant::now();
        let store = match &self.store {
            Some(s) => s.clone(),
            None => return Err(Error::value(OP, "store", "rollouts", "none")),
        };
        let n = store.batch_size().first().copied().unwrap_or(0);
        let mb = (self.config.train.batch_size as i64).max(1);
        let total = self.total_steps();
        let mut sums = Stats::new();
        let mut steps = 0usize;
        'passes: for _ in 0..self.config.method.num_iterations {
            let perm = permutation(&mut self.rng, n, self.model.policy().model().device())?;
            let mut at = 0;
            while at < n {
                let len = mb.min(n - at);
                let idx = perm.f_narrow(0, at, len)?;
                at += len;
                let batch = store.index(&[BatchIndex::tensor(idx)])?;
                let step_stats = self.train_step(&batch)?;
                for (k, v) in &step_stats {
                    *sums.entry(k.clone()).or_insert(0.0) += v;
                }
                steps += 1;
                let step = self.iter_count;
                self.iter_count += 1;
                let last = self.iter_count >= total;
                self.after_step(step, &step_stats, last, callbacks)?;
                if last {
                    break 'passes;
                }
            }
        }
        for v in sums.values_mut() {
            *v /= steps.max(1) as f64;
        }
        stats.update = sums;
        stats.update_s = start.elapsed().as_secs_f64();
        stats.iter_count = self.iter_count;
        self.epoch += 1;
        self.history.push(stats.clone());
        Ok(stats)
    }

    fn encode_prompts(&self, prompts: &[String]) -> Result<TensorDict> {
        let pad = self.env.config().pad_id();
        let device = self.model.policy().model().device();
        prompt_batch(OP, self.tokenizer.as_ref(), prompts, pad, device)
    }
}

impl RlTrainer for GrpoTrainer {
    fn train_config(&self) -> &TrainConfig {
        &self.config.train
    }

    fn iter_count(&self) -> usize {
        self.iter_count
    }

    fn is_main_process(&self) -> bool {
        self.collective.is_main()
    }

    fn sync_processes(&self, op: &'static str, ok: bool) -> Result<()> {
        self.collective.check_all_ok(op, ok)
    }

    /// Samples completions for the `("tokens", "prompt")` batch of `data` and writes the
    /// rollout's and the reference's log-probs (the rollout's policy step).
    fn act(&mut self, data: &TensorDict) -> Result<TensorDict> {
        hydra_policy_step(&self.model, &mut self.rng, data.clone(), &self.gen, false)
    }

    fn sample(
        &mut self,
        prompts: &[String],
        length: usize,
        n_samples: usize,
    ) -> Result<Vec<String>> {
        let repeated: Vec<String> = prompts
            .iter()
            .flat_map(|p| std::iter::repeat_n(p.clone(), n_samples))
            .collect();
        if repeated.is_empty() {
            return Ok(Vec::new());
        }
        let td = self.encode_prompts(&repeated)?;
        let gen = GenerationConfig {
            max_new_tokens: length as i64,
            ..self.gen.clone()
        };
        generate_text(&self.model, self.tokenizer.as_ref(), &mut self.rng, td, gen)
    }

    fn learn(&mut self, callbacks: &mut Callbacks<'_>) -> Result<()> {
        let total = self.total_steps();
        while self.iter_count < total && self.epoch < self.config.train.epochs {
            self.iteration(callbacks)?;
        }
        Ok(())
    }

    fn evaluate(&mut self) -> Result<EvalReport> {
        if self.evaluation.prompts.is_empty() {
            return Ok(EvalReport::default());
        }
        let td = self.encode_prompts(&self.evaluation.prompts.clone())?;
        let gen = self.gen.clone();
        let samples = generate_text(&self.model, self.tokenizer.as_ref(), &mut self.rng, td, gen)?;
        self.evaluation.report(samples)
    }

    fn get_components(&self) -> Vec<(String, Component)> {
        vec![
            (
                "model".into(),
                Component::tensors(policy_params(&self.model)),
            ),
            (
                "reference".into(),
                Component::tensors(reference_params(&self.model)),
            ),
            ("opt".into(), Component::from_adamw(&self.opt)),
            ("scheduler".into(), Component::from_scheduler(&self.sched)),
            (
                "trainer".into(),
                Component::json(json!({
                    "iter_count": self.iter_count,
                    "epoch": self.epoch,
                    "rng": rng_to_json(&self.rng),
                    "prompts": prompt_state_json(&self.env),
                })),
            ),
            (
                "config".into(),
                Component::json(serde_json::to_value(&self.config).unwrap_or(Value::Null)),
            ),
        ]
    }

    fn set_components(&mut self, mut components: Vec<(String, Component)>) -> Result<()> {
        const LOAD: &str = "GrpoTrainer::load";
        take_component(&mut components, "model")?.copy_into(&policy_params(&self.model))?;
        take_component(&mut components, "reference")?.copy_into(&reference_params(&self.model))?;
        let opt = take_component(&mut components, "opt")?;
        self.opt.load_state(&opt.tensors, &opt.state)?;
        let sched = take_component(&mut components, "scheduler")?;
        self.sched = CosineAnnealingLr::from_state_json(&sched.state)?;
        self.opt.set_lr(self.sched.lr());
        let trainer = take_component(&mut components, "trainer")?;
        let fields = StateFields::new(LOAD, &trainer.state);
        self.iter_count = fields.usize("iter_count")?;
        self.epoch = fields.usize("epoch")?;
        self.rng = rng_from_json(LOAD, trainer.state.get("rng"))?;
        let rank = self.collective.rank();
        if rank == 0 {
            set_prompt_state_json(LOAD, &mut self.env, &trainer.state)?;
        } else {
            // The checkpoint holds rank 0's generator and prompt position: other ranks draw
            // their own stream from it and keep their own env's prompt position.
            self.rng = Generator::new(rank_seed(self.rng.next_u64(), rank));
        }
        self.store = None;
        Ok(())
    }
}
