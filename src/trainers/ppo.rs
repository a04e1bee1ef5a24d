//! PPO-RLHF in the shape of trlX's `AcceleratePPOTrainer` (rlhf.md §1): rollouts from the
//! token env, a per-token KL penalty against a hydra reference, masked GAE, clipped policy
//! and value losses, AdamW with a cosine schedule, an Adaptive or Fixed KL controller, and the
//! trainer API of [`RlTrainer`] (callbacks, evaluation, atomic checkpoints).
//!
//! # One iteration (trlX's `post_epoch_callback` + `learn` inner loops)
//! 1. **Rollout** ([`PpoRlhfTrainer::make_experience`]), `chunk_size` prompts at a time until
//!    `num_rollouts` are collected:
//!    - the env resets with the next prompts (left-padded);
//!    - the policy generates (`gen_experience_kwargs`, else `gen_kwargs`), then **one trunk
//!      pass** of [`CausalLmWithHydraValueHead`] over prompt + response gives the policy's
//!      log-probs (from raw logits, as trlX), the values and the frozen reference's log-probs
//!      (written under `("ref_log_probs", "full")`, so [`RetrieveLogProb::precomputed`] runs
//!      no second model);
//!    - the env step scores the response (the score sits at the last response token), then
//!      the env's transforms run: [`ScoreScaling`] (`cliprange_reward`, `scale_reward`) and
//!      [`RetrieveKL`] (k1 penalty per response token, `reward -= kl_coef · kl`).
//! 2. **Learn**: `ppo_epochs` passes over the rollouts in shuffled minibatches of
//!    `train.batch_size` (HEAD's order: every minibatch of one epoch, then the next epoch).
//!    Per minibatch, [`compute_ppo_rlhf_advantages`] (masked GAE, masked whitening over the
//!    minibatch's response tokens) and [`PpoRlhfLoss`] (clipped policy and value losses), then
//!    global gradient-norm clipping, AdamW and the cosine schedule. After each epoch the KL
//!    controller updates with the rollouts' mean sequence KL and `n_steps = batch_size`
//!    (trlX HEAD's `post_backward_callback`).
//!
//! # Reference bugs not copied (details and tests in [`crate::objectives::llm::ppo`])
//! - the rollout / learner off-by-one of trlX b623d1b: every tensor here is aligned with the
//!   tokens, so rollout values and learner values are the same positions;
//! - the controller is fed the mean **k1** sequence KL to the reference (§7.2), not trlX
//!   HEAD's inverted k3 `exp(lp − ref) − 1 − (lp − ref)`, nor b623d1b's policy drift
//!   `mean(sum(lp_new − lp_rollout))`; k3 in TRL's direction is logged as `policy/kl_k3`;
//! - padding takes no part in GAE or whitening (trlX whitens the whole `[B, T]` tensor,
//!   zeros included).
//!
//! # Logged statistics
//! Per optimizer step (`Stats`): `loss`, `loss/policy`, `loss/value`, `policy/approx_kl`,
//! `policy/clipfrac`, `values/clipfrac`, `values/error`, `ratio`, `padding_percentage`, `lr`,
//! `kl_coef`, `grad_norm`. Per iteration ([`IterationStats`]): the mean raw score, the mean KL
//! (k1, summed over the response, then averaged), k3, the KL coefficient, the mean response
//! length and the times of the rollout and the update.

use std::fmt;
use std::time::Instant;

use serde_json::{json, Value};
use tch::{Kind, Tensor};

use super::api::{
    rng_from_json, rng_to_json, Callbacks, Component, EvalReport, Evaluation, RlTrainer, Stats,
};
use super::config::{ScaleReward as ConfigScaleReward, TrainConfig, TrlConfig};
use super::optim::{AdamW, CosineAnnealingLr};
use super::rollout::{
    check_vocab, generate_text, generation_config, hydra_policy_step, policy_params, prompt_batch,
    prompt_state_json, reference_params, set_prompt_state_json, trainable_params, StateFields,
};
use crate::envs::llm::{
    KLComputation, RetrieveKL, RetrieveLogProb, ScaleReward, ScoreScaling, TokenEnv,
};
use crate::envs::{EnvBase, TransformedEnv};
use crate::error::{Error, Result};
use crate::modules::llm::{CausalLmWithHydraValueHead, GenerationConfig, TextTokenizer};
use crate::objectives::llm::{
    compute_ppo_rlhf_advantages, AdaptiveKLController, FixedKLController, KlController,
    PpoRlhfConfig, PpoRlhfKeys, PpoRlhfLoss,
};
use crate::objectives::{LossModule, LossOutput};
use crate::rng::Generator;
use crate::tensordict::{cat, BatchIndex, TensorDict};

/// Index of the [`ScoreScaling`] transform in the trainer's env.
const SCALING: usize = 0;
/// Index of the [`RetrieveKL`] transform in the trainer's env.
const KL: usize = 1;
/// Where the trainer logs k3 (TRL's direction) per token, under `next`.
const K3_KEY: &str = "kl_k3";
/// The op named by errors of evaluation and sampling.
const OP_EVAL: &str = "PpoRlhfTrainer";

/// What one on-policy iteration (a rollout and its updates) measured: PPO-RLHF's, and
/// [`GrpoTrainer`](super::grpo::GrpoTrainer)'s (with `kl_coef` its `beta`).
#[derive(Debug, Clone, PartialEq)]
pub struct IterationStats {
    /// The 0-based iteration (trlX's outer epoch).
    pub iteration: usize,
    /// Optimizer steps taken after this iteration.
    pub iter_count: usize,
    /// The mean raw score of the rollouts (before clipping and scaling).
    pub score: f64,
    /// The mean of the per-sequence k1 KL to the reference, summed over response tokens.
    pub kl: f64,
    /// The same with the k3 estimator `exp(ref − lp) − 1 − (ref − lp)`.
    pub kl_k3: f64,
    /// The KL coefficient used for this rollout.
    pub kl_coef: f64,
    /// The mean response length in tokens (EOS included).
    pub response_length: f64,
    /// The mean of the step statistics of this iteration's updates.
    pub update: Stats,
    /// Seconds spent in the rollout.
    pub rollout_s: f64,
    /// Seconds spent in the updates.
    pub update_s: f64,
}

/// A PPO-RLHF trainer (see the [module docs](self)).
pub struct PpoRlhfTrainer {
    config: TrlConfig,
    model: CausalLmWithHydraValueHead,
    env: TransformedEnv<TokenEnv>,
    tokenizer: Box<dyn TextTokenizer>,
    rollout_gen: GenerationConfig,
    eval_gen: GenerationConfig,
    loss_config: PpoRlhfConfig,
    kl_ctl: KlController,
    opt: AdamW,
    sched: CosineAnnealingLr,
    max_grad_norm: Option<f64>,
    rng: Generator,
    store: Option<TensorDict>,
    mean_kl: f64,
    iter_count: usize,
    epoch: usize,
    evaluation: Evaluation,
    history: Vec<IterationStats>,
}

impl fmt::Debug for PpoRlhfTrainer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PpoRlhfTrainer")
            .field("iter_count", &self.iter_count)
            .field("epoch", &self.epoch)
            .field("kl_coef", &self.kl_ctl.value())
            .finish_non_exhaustive()
    }
}

fn scale_mode(mode: ConfigScaleReward) -> ScaleReward {
    match mode {
        ConfigScaleReward::Ignored => ScaleReward::Ignored,
        ConfigScaleReward::Running => ScaleReward::Running,
        ConfigScaleReward::Ref => ScaleReward::Ref,
    }
}

impl PpoRlhfTrainer {
    /// A trainer of `model` on the prompts and scorer of `env`, with `config` (trlX's fields;
    /// validated). The env gains the score scaling and the KL transforms. Errors on an
    /// invalid config, a tokenizer or env whose vocabulary differs from the model's, or
    /// generation settings the env cannot take.
    pub fn new(
        config: TrlConfig,
        model: CausalLmWithHydraValueHead,
        env: TokenEnv,
        tokenizer: Box<dyn TextTokenizer>,
    ) -> Result<Self> {
        const OP: &str = "PpoRlhfTrainer::new";
        config.validate()?;
        check_vocab(OP, &model, &env, tokenizer.as_ref())?;
        let m = &config.method;
        if env.config().batch_size != m.chunk_size as i64 {
            return Err(Error::config(
                OP,
                "method.chunk_size",
                format!(
                    "the env's batch size (prompts per reset), {}",
                    env.config().batch_size
                ),
                m.chunk_size,
            ));
        }
        if m.num_rollouts > m.chunk_size && env.prompt_width().is_none() {
            return Err(Error::config(
                OP,
                "method.num_rollouts",
                "at most chunk_size, or an env with a fixed TokenEnvConfig::prompt_width (chunks \
                 of rollouts are concatenated along the batch, so their prompts need one width)",
                m.num_rollouts,
            ));
        }
        let rollout_gen = generation_config(
            OP,
            "method.gen_experience_kwargs",
            m.experience_gen_kwargs(),
            &env,
        )?;
        let eval_gen = generation_config(OP, "method.gen_kwargs", &m.gen_kwargs, &env)?;
        let mut scaling = ScoreScaling::new(scale_mode(m.scale_reward))
            .with_cliprange_reward((m.cliprange_reward > 0.0).then_some(m.cliprange_reward))?;
        if let (Some(mean), Some(std)) = (m.ref_mean, m.ref_std) {
            scaling = scaling.with_ref_stats(mean, std)?;
        }
        let kl = RetrieveKL::from_parts(
            RetrieveLogProb::precomputed(),
            KLComputation::new()
                .with_coeff(m.init_kl_coef)
                .with_k3_key(K3_KEY),
        )?;
        let env = TransformedEnv::new(env)?.with(scaling)?.with(kl)?;
        let kl_ctl = match m.target {
            Some(target) => KlController::Adaptive(AdaptiveKLController::new(
                m.init_kl_coef,
                target,
                m.horizon as f64,
            )?),
            None => KlController::Fixed(FixedKLController::new(m.init_kl_coef)?),
        };
        let loss_config = PpoRlhfConfig::new()
            .with_cliprange(m.cliprange)
            .with_cliprange_value(m.cliprange_value)
            .with_vf_coef(m.vf_coef)
            .with_gamma(m.gamma)
            .with_lam(m.lam);
        loss_config.validate()?;
        let opt = AdamW::from_kwargs(trainable_params(&model, true), &config.optimizer.kwargs)?;
        let sched =
            CosineAnnealingLr::from_kwargs(config.optimizer.kwargs.lr, &config.scheduler.kwargs)?;
        let rng = Generator::new(config.train.seed);
        Ok(PpoRlhfTrainer {
            max_grad_norm: config.train.max_grad_norm,
            config,
            model,
            env,
            tokenizer,
            rollout_gen,
            eval_gen,
            loss_config,
            kl_ctl,
            opt,
            sched,
            rng,
            store: None,
            mean_kl: 0.0,
            iter_count: 0,
            epoch: 0,
            evaluation: Evaluation::default(),
            history: Vec::new(),
        })
    }

    /// Sets what [`RlTrainer::evaluate`] runs (trlX's `eval_prompts`, `reward_fn`,
    /// `metric_fn`): each function receives the decoded responses (special tokens skipped), in
    /// prompt order.
    pub fn with_evaluation(mut self, evaluation: Evaluation) -> Self {
        self.evaluation = evaluation;
        self
    }

    /// The whole config.
    pub fn config(&self) -> &TrlConfig {
        &self.config
    }

    /// The model being trained (policy, value head and frozen reference).
    pub fn model(&self) -> &CausalLmWithHydraValueHead {
        &self.model
    }

    /// The env with its transforms.
    pub fn env(&self) -> &TransformedEnv<TokenEnv> {
        &self.env
    }

    /// The KL controller.
    pub fn kl_controller(&self) -> &KlController {
        &self.kl_ctl
    }

    /// Iterations (rollout + updates) finished, counting those of a loaded checkpoint.
    pub fn epoch(&self) -> usize {
        self.epoch
    }

    /// What each finished iteration measured.
    pub fn history(&self) -> &[IterationStats] {
        &self.history
    }

    /// The current rollouts (after [`PpoRlhfTrainer::make_experience`]).
    pub fn store(&self) -> Option<&TensorDict> {
        self.store.as_ref()
    }

    /// trlX's total step budget: `min(train.total_steps, epochs · ppo_epochs · minibatches)`.
    pub fn total_steps(&self) -> usize {
        self.config.total_steps(self.minibatches_per_rollout())
    }

    fn minibatches_per_rollout(&self) -> usize {
        let mb = self.config.train.batch_size.max(1);
        self.config.method.num_rollouts.div_ceil(mb)
    }

    /// The policy's generation and the one trunk pass on a tensordict holding
    /// `("tokens", "prompt")` and its mask (the [module docs](self)' step 1).
    fn policy_step(&mut self, td: TensorDict, gen: &GenerationConfig) -> Result<TensorDict> {
        hydra_policy_step(&self.model, &mut self.rng, td, gen)
    }

    /// trlX's `make_experience(num_rollouts)`: collects `num_rollouts` scored responses
    /// (`chunk_size` at a time) into the store, replacing the previous rollouts. Returns the
    /// iteration's rollout statistics (score, KL, lengths).
    pub fn make_experience(&mut self) -> Result<IterationStats> {
        let start = Instant::now();
        let kl_coef = self.kl_ctl.value();
        if let Some(kl) = self.env.transform_mut().get_as_mut::<RetrieveKL>(KL) {
            kl.kl_mut().set_coeff(kl_coef);
        }
        let want = self.config.method.num_rollouts;
        let mut chunks = Vec::new();
        let mut have = 0usize;
        while have < want {
            let td = self.env.reset(None)?;
            let gen = self.rollout_gen.clone();
            let td = self.policy_step(td, &gen)?;
            let td = self.env.step(td)?;
            have += td.batch_size().first().copied().unwrap_or(0).max(1) as usize;
            chunks.push(td);
        }
        let store = cat(&chunks, 0)?;
        let store = if have > want {
            store.index(&[BatchIndex::slice(None, Some(want as i64), 1)])?
        } else {
            store
        };
        let assistant = store
            .get_or_err(("masks", "all_assistant_mask"))?
            .f_to_kind(Kind::Float)?;
        let kl = store.get_or_err(("next", "kl_penalty"))?;
        let k3 = store.get_or_err(("next", K3_KEY))?;
        let per_seq = |t: &Tensor| -> Result<f64> {
            Ok(t.f_mul(&assistant)?
                .f_sum_dim_intlist(1, false, Kind::Double)?
                .f_mean(Kind::Double)?
                .double_value(&[]))
        };
        self.mean_kl = per_seq(kl)?;
        let kl_k3 = per_seq(k3)?;
        let score = store
            .get_or_err(("next", "score"))?
            .f_mean(Kind::Double)?
            .double_value(&[]);
        let response_length = assistant
            .f_sum_dim_intlist(1, false, Kind::Double)?
            .f_mean(Kind::Double)?
            .double_value(&[]);
        self.store = Some(store);
        Ok(IterationStats {
            iteration: self.epoch,
            iter_count: self.iter_count,
            score,
            kl: self.mean_kl,
            kl_k3,
            kl_coef,
            response_length,
            update: Stats::new(),
            rollout_s: start.elapsed().as_secs_f64(),
            update_s: 0.0,
        })
    }

    /// One optimizer step on the minibatch `mb` of the store; returns its statistics.
    fn train_step(&mut self, mut mb: TensorDict) -> Result<Stats> {
        let keys = PpoRlhfKeys::default();
        compute_ppo_rlhf_advantages(&mut mb, &keys, &self.loss_config)?;
        let loss = PpoRlhfLoss::new(self.model.policy()).with_config(self.loss_config.clone())?;
        let out = loss.forward(&mb)?;
        let grad_norm = self.opt.backward_step(&out.loss, self.max_grad_norm)?;
        let lr = self.sched.step();
        self.opt.set_lr(lr);
        let mut stats: Stats = out
            .loss_terms()
            .into_iter()
            .chain(out.metrics())
            .map(|(k, v)| (k.to_string(), v.double_value(&[])))
            .collect();
        stats.insert("loss".into(), out.loss.double_value(&[]));
        stats.insert("lr".into(), lr);
        stats.insert("kl_coef".into(), self.kl_ctl.value());
        if let Some(norm) = grad_norm {
            stats.insert("grad_norm".into(), norm);
        }
        Ok(stats)
    }

    /// One iteration: rollouts (unless the store already holds this iteration's), then
    /// `ppo_epochs` epochs of minibatch updates, each step followed by the callbacks that
    /// are due. Returns the iteration's statistics (also kept in
    /// [`PpoRlhfTrainer::history`]).
    pub fn iteration(&mut self, callbacks: &mut Callbacks<'_>) -> Result<IterationStats> {
        let mut stats = self.make_experience()?;
        let start = Instant::now();
        let store = match &self.store {
            Some(s) => s.clone(),
            None => return Err(Error::value("PpoRlhfTrainer", "store", "rollouts", "none")),
        };
        let n = store.batch_size().first().copied().unwrap_or(0);
        let mb = (self.config.train.batch_size as i64).max(1);
        let total = self.total_steps();
        let mut sums = Stats::new();
        let mut steps = 0usize;
        'epochs: for _ in 0..self.config.method.ppo_epochs {
            let perm = self.permutation(n)?;
            let mut at = 0;
            while at < n {
                let len = mb.min(n - at);
                let idx = perm.f_narrow(0, at, len)?;
                at += len;
                let batch = store.index(&[BatchIndex::tensor(idx)])?;
                let step_stats = self.train_step(batch)?;
                for (k, v) in &step_stats {
                    *sums.entry(k.clone()).or_insert(0.0) += v;
                }
                steps += 1;
                let step = self.iter_count;
                self.iter_count += 1;
                let last = self.iter_count >= total;
                self.after_step(step, &step_stats, last, callbacks)?;
                if last {
                    break 'epochs;
                }
            }
            // trlX HEAD's post_backward_callback, once per inner epoch
            self.kl_ctl
                .update(self.mean_kl, self.config.train.batch_size)?;
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

    fn permutation(&mut self, n: i64) -> Result<Tensor> {
        // Fisher-Yates on the trainer's own generator, so a resumed run draws the same
        // minibatches as an uninterrupted one.
        let mut idx: Vec<i64> = (0..n).collect();
        for i in (1..idx.len()).rev() {
            let j = self.rng.below(i as u64 + 1) as usize;
            idx.swap(i, j);
        }
        let device = self.model.policy().model().device();
        Ok(Tensor::f_from_slice(&idx)?.f_to_device(device)?)
    }

    /// Encodes `prompts` into a left-padded `("tokens", "prompt")` batch.
    fn encode_prompts(&self, prompts: &[String]) -> Result<TensorDict> {
        let pad = self.env.base().config().pad_id();
        let device = self.model.policy().model().device();
        prompt_batch(OP_EVAL, self.tokenizer.as_ref(), prompts, pad, device)
    }

    /// The trainer's own state (KL coefficient, counters, running moments, generator).
    fn state_json(&self) -> Value {
        let scaling = self.env.transform().get_as::<ScoreScaling>(SCALING);
        json!({
            "iter_count": self.iter_count,
            "epoch": self.epoch,
            "kl_coef": self.kl_ctl.value(),
            "mean_kl": self.mean_kl,
            "rng": rng_to_json(&self.rng),
            "prompts": prompt_state_json(self.env.base()),
            "running_moments": scaling.and_then(|s| serde_json::to_value(s.running_moments()).ok()),
            "ref_stats": scaling.and_then(ScoreScaling::ref_stats),
        })
    }

    fn set_state_json(&mut self, state: &Value) -> Result<()> {
        const OP: &str = "PpoRlhfTrainer::load";
        let fields = StateFields::new(OP, state);
        let field = |name: &str| fields.field(name);
        self.iter_count = fields.usize("iter_count")?;
        self.epoch = fields.usize("epoch")?;
        self.kl_ctl.set_value(fields.f64("kl_coef")?)?;
        self.mean_kl = fields.f64("mean_kl")?;
        self.rng = rng_from_json(OP, state.get("rng"))?;
        set_prompt_state_json(OP, self.env.base_mut(), state)?;
        let moments = field("running_moments")?.clone();
        let ref_stats = field("ref_stats")?.clone();
        if let Some(s) = self.env.transform_mut().get_as_mut::<ScoreScaling>(SCALING) {
            if !moments.is_null() {
                let m: crate::objectives::llm::RunningMoments = serde_json::from_value(moments)
                    .map_err(|e| {
                        Error::value(OP, "trainer state", "running_moments", e.to_string())
                    })?;
                s.set_running_moments(m);
            }
            let ref_stats: Option<(f64, f64)> = serde_json::from_value(ref_stats)
                .map_err(|e| Error::value(OP, "trainer state", "ref_stats", e.to_string()))?;
            s.set_ref_stats(ref_stats);
        }
        self.store = None;
        Ok(())
    }
}

impl RlTrainer for PpoRlhfTrainer {
    fn train_config(&self) -> &TrainConfig {
        &self.config.train
    }

    fn iter_count(&self) -> usize {
        self.iter_count
    }

    /// Generates responses for the `("tokens", "prompt")` batch of `data` (with its
    /// `("masks", "prompt_attention_mask")`) and writes the policy's log-probs, the values
    /// and the reference log-probs (the rollout's policy step).
    fn act(&mut self, data: &TensorDict) -> Result<TensorDict> {
        let gen = self.rollout_gen.clone();
        self.policy_step(data.clone(), &gen)
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
            ..self.eval_gen.clone()
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
        let gen = self.eval_gen.clone();
        let samples = generate_text(&self.model, self.tokenizer.as_ref(), &mut self.rng, td, gen)?;
        self.evaluation.report(samples)
    }

    fn get_components(&self) -> Vec<(String, Component)> {
        vec![
            (
                "model".to_string(),
                Component::tensors(policy_params(&self.model)),
            ),
            (
                "reference".to_string(),
                Component::tensors(reference_params(&self.model)),
            ),
            ("opt".to_string(), Component::from_adamw(&self.opt)),
            (
                "scheduler".to_string(),
                Component::from_scheduler(&self.sched),
            ),
            ("trainer".to_string(), Component::json(self.state_json())),
            (
                "config".to_string(),
                Component::json(serde_json::to_value(&self.config).unwrap_or(Value::Null)),
            ),
        ]
    }

    fn set_components(&mut self, mut components: Vec<(String, Component)>) -> Result<()> {
        use super::api::take_component;
        let model = take_component(&mut components, "model")?;
        model.copy_into(&policy_params(&self.model))?;
        let reference = take_component(&mut components, "reference")?;
        reference.copy_into(&reference_params(&self.model))?;
        let opt = take_component(&mut components, "opt")?;
        self.opt.load_state(&opt.tensors, &opt.state)?;
        let sched = take_component(&mut components, "scheduler")?;
        self.sched = CosineAnnealingLr::from_state_json(&sched.state)?;
        self.opt.set_lr(self.sched.lr());
        let trainer = take_component(&mut components, "trainer")?;
        self.set_state_json(&trainer.state)
    }
}
