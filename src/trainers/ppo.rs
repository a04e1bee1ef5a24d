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
//! # Data-parallel training
//! [`PpoRlhfTrainer::with_collective`] makes the trainer one rank of a group (a
//! [`Collective`]: `torchrl::distributed::ProcessGroup` with the cargo feature `distributed`,
//! [`SingleProcess`](super::parallel::SingleProcess) by default). Then:
//! - **per rank**: the env and its prompts, the rollouts (`num_rollouts` per rank, sampled with
//!   the rank's own generator), the minibatches (`train.batch_size` per rank: the global
//!   minibatch is `world_size ×` that), the GAE (per sequence);
//! - **global**: the start-up weights (broadcast from rank 0), the score moments of
//!   `scale_reward` (and the first batch's reference statistics), the whitening's mean and
//!   variance (over every rank's minibatch tokens), the mean KL fed to the controller and
//!   every logged statistic (the controller's `n_steps` is the global minibatch size,
//!   `world_size × train.batch_size`), the loss normalisation (each rank divides its masked sums by the
//!   **global** response-token count, [`PpoRlhfConfig::token_normalizer`]) and the
//!   gradients (**summed** over the ranks, so they are the gradient of the global masked mean:
//!   one process on the concatenated batch), hence the clipped norm and the AdamW steps, which
//!   are identical on every rank;
//! - **rank 0 only**: the log, evaluation and save callbacks and the checkpoint writes
//!   ([`RlTrainer::is_main_process`]); every rank waits for them
//!   ([`RlTrainer::sync_processes`]), and a failure there is an error on every rank.
//!   [`RlTrainer::evaluate`] called directly runs on the rank that calls it.
//!
//! A checkpoint holds rank 0's generator and prompt position; on [`RlTrainer::load`] (every
//! rank loads the same folder) rank 0 resumes exactly, other ranks derive a new generator from
//! it and keep their env's prompt position, so a resumed group is not bitwise an
//! uninterrupted one on ranks `> 0`.
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
use super::parallel::{join_group, rank_seed, train_schedule_fields, Collective, SharedCollective};
use super::rollout::{
    check_store_rows, check_vocab, generate_text, generation_config, hydra_policy_step,
    permutation, policy_params, prompt_batch, prompt_state_json, reference_params,
    set_prompt_state_json, trainable_params, update_policy, StateFields,
};
use crate::envs::llm::moments::MomentsReduce;
use crate::envs::llm::{
    KLComputation, RetrieveKL, RetrieveLogProb, ScaleReward, ScoreScaling, TokenEnv,
};
use crate::envs::{EnvBase, TransformedEnv};
use crate::error::{Error, Result};
use crate::modules::llm::keys::ASSISTANT_MASK_KEY;
use crate::modules::llm::{CausalLmWithHydraValueHead, GenerationConfig, TextTokenizer};
use crate::objectives::llm::ppo::compute_ppo_rlhf_advantages_counted;
use crate::objectives::llm::{
    AdaptiveKLController, FixedKLController, KlController, PpoRlhfConfig, PpoRlhfKeys, PpoRlhfLoss,
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
    collective: SharedCollective,
    cache_trunk: bool,
}

impl fmt::Debug for PpoRlhfTrainer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PpoRlhfTrainer")
            .field("iter_count", &self.iter_count)
            .field("epoch", &self.epoch)
            .field("kl_coef", &self.kl_ctl.value())
            .field("collective", &self.collective)
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
            collective: SharedCollective::default(),
            cache_trunk: true,
        })
    }

    /// Makes this trainer one rank of a data-parallel group (see the [module
    /// docs](self#data-parallel-training)). A collective call: every rank calls it once, with
    /// the same config, before training (or right after loading the same checkpoint).
    ///
    /// At attach time: checks that every rank has the same training schedule (batch size,
    /// rollouts, epochs, …: a mismatch would desynchronise the collectives), broadcasts rank
    /// 0's policy (trunk and value head) and frozen reference into every rank, gives ranks
    /// `> 0` their own generator ([`rank_seed`] of `train.seed`), and makes the score
    /// scaling's batch moments global.
    ///
    /// **Each rank's env should serve its own prompts** (a shard of the prompt set, or a
    /// different `TokenEnvConfig::seed` with `shuffle`, e.g. `seed + rank`): the trainer
    /// cannot tell, and ranks serving the same prompts only differ by their sampling.
    ///
    /// # Errors
    /// When the ranks' schedules differ (on every rank, naming the fields), or a collective
    /// fails.
    ///
    /// ```
    /// # use tch::nn::VarStore;
    /// # use torchrl::envs::llm::{TokenEnv, TokenEnvConfig, TokenScorer};
    /// # use torchrl::modules::llm::{ByteTokenizer, CausalLmWithHydraValueHead, Gpt2Config, TextTokenizer};
    /// # use torchrl::trainers::config::{GenKwargs, TrlConfig};
    /// use torchrl::trainers::parallel::{Collective, SingleProcess};
    /// use torchrl::trainers::ppo::PpoRlhfTrainer;
    /// # fn main() -> torchrl::Result<()> {
    /// # let tok = ByteTokenizer::new();
    /// # let gpt = Gpt2Config::new(tok.vocab_size()).with_n_positions(16).with_n_embd(8)
    /// #     .with_n_layer(1).with_n_head(2)
    /// #     .with_special_tokens(tok.bos_token_id(), tok.eos_token_id(), tok.pad_token_id());
    /// # let vs = VarStore::new(tch::Device::Cpu);
    /// # let model = CausalLmWithHydraValueHead::new(&vs.root(), &gpt, 1)?;
    /// # let env_cfg = TokenEnvConfig::for_model(&gpt.facts()).with_max_new_tokens(2).with_batch_size(2);
    /// # let scorer = TokenScorer::new(|_p: &[i64], r: &[i64]| r.len() as f64);
    /// # let env = TokenEnv::from_text(env_cfg, &tok, &["ab", "cd"], Box::new(scorer))?;
    /// # let mut config = TrlConfig::default();
    /// # config.method.num_rollouts = 2;
    /// # config.method.chunk_size = 2;
    /// # config.train.batch_size = 2;
    /// # config.method.gen_kwargs = GenKwargs { max_new_tokens: 2, ..GenKwargs::default() };
    /// // Under torchrl-launch: `.with_collective(ProcessGroup::init_from_env()?)`
    /// // (cargo feature `distributed`); a world of one runs anywhere.
    /// let trainer = PpoRlhfTrainer::new(config, model, env, Box::new(tok))?
    ///     .with_collective(SingleProcess)?;
    /// assert_eq!(trainer.collective().world_size(), 1);
    /// # Ok(()) }
    /// ```
    pub fn with_collective(mut self, collective: impl Collective + 'static) -> Result<Self> {
        let shared = SharedCollective::new(collective);
        let params = [policy_params(&self.model), reference_params(&self.model)];
        let params: Vec<&[(String, Tensor)]> = params.iter().map(Vec::as_slice).collect();
        let fields = schedule_fields(&self.config);
        join_group(
            &shared,
            "PpoRlhfTrainer::with_collective",
            &fields,
            &params,
            &mut self.opt,
        )?;
        if shared.rank() > 0 {
            self.rng = Generator::new(rank_seed(self.config.train.seed, shared.rank()));
        }
        if let Some(s) = self.env.transform_mut().get_as_mut::<ScoreScaling>(SCALING) {
            let c = shared.clone();
            s.set_moments_reduce(Some(MomentsReduce::new(move |b| c.all_reduce_moments(b))));
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
    /// unless [`PpoRlhfTrainer::with_collective`] was called).
    pub fn collective(&self) -> &SharedCollective {
        &self.collective
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
    fn policy_step(
        &mut self,
        td: TensorDict,
        gen: &GenerationConfig,
        keep_trunk: bool,
    ) -> Result<TensorDict> {
        hydra_policy_step(&self.model, &mut self.rng, td, gen, keep_trunk)
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
            let td = self.policy_step(td, &gen, self.cache_trunk)?;
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
        let stats = self.rollout_stats(&store, kl_coef, start)?;
        self.store = Some(store);
        Ok(stats)
    }

    /// The rollout statistics of `store` over every rank (means over all ranks' sequences;
    /// with one rank exactly the local means); sets the mean KL the controller is fed.
    fn rollout_stats(
        &mut self,
        store: &TensorDict,
        kl_coef: f64,
        start: Instant,
    ) -> Result<IterationStats> {
        let assistant = store
            .get_or_err(ASSISTANT_MASK_KEY)?
            .f_to_kind(Kind::Float)?;
        let kl = store.get_or_err(("next", "kl_penalty"))?;
        let k3 = store.get_or_err(("next", K3_KEY))?;
        let c = &self.collective;
        let per_seq = |t: &Tensor| -> Result<Tensor> {
            Ok(t.f_mul(&assistant)?
                .f_sum_dim_intlist(1, false, Kind::Double)?)
        };
        let series = [
            per_seq(kl)?,
            per_seq(k3)?,
            store.get_or_err(("next", "score"))?.shallow_clone(),
            assistant.f_sum_dim_intlist(1, false, Kind::Double)?,
        ];
        let means = if c.world_size() == 1 {
            series
                .iter()
                .map(|t| c.mean_over_ranks(t))
                .collect::<Result<Vec<f64>>>()?
        } else {
            // one all-reduce: every series' sum and element count
            let mut local = Vec::with_capacity(2 * series.len());
            for t in &series {
                local.push(t.f_sum(Kind::Double)?.f_double_value(&[])?);
                local.push(t.numel() as f64);
            }
            c.sum_scalars(&local)?
                .chunks(2)
                .map(|p| match p {
                    [s, n] if *n > 0.0 => Ok(s / n),
                    _ => Err(Error::argument(
                        "PpoRlhfTrainer",
                        "rollouts",
                        "at least one rollout on some rank",
                        "none on any rank",
                    )),
                })
                .collect::<Result<Vec<f64>>>()?
        };
        let [mean_kl, kl_k3, score, response_length] = means[..] else {
            return Err(Error::argument(
                "PpoRlhfTrainer",
                "rollout statistics",
                "four means",
                means.len().to_string(),
            ));
        };
        self.mean_kl = mean_kl;
        Ok(IterationStats {
            iteration: self.epoch,
            iter_count: self.iter_count,
            score,
            kl: mean_kl,
            kl_k3,
            kl_coef,
            response_length,
            update: Stats::new(),
            rollout_s: start.elapsed().as_secs_f64(),
            update_s: 0.0,
        })
    }

    /// One optimizer step on the minibatch `mb` of the store (this rank's share of the global
    /// minibatch); returns its statistics (global ones in a group).
    fn train_step(&mut self, mut mb: TensorDict) -> Result<Stats> {
        let keys = PpoRlhfKeys::default();
        let c = self.collective.clone();
        let reduce = |t: &mut Tensor| c.all_reduce_sum(t);
        let whitened_n =
            compute_ppo_rlhf_advantages_counted(&mut mb, &keys, &self.loss_config, &reduce)?;
        // The global response-token count: each rank's masked sums are divided by it, so the
        // sum of the ranks' gradients is the gradient of the global masked mean. The
        // whitening's first all-reduce already summed it; without whitening it takes one.
        let global_n = match whitened_n {
            Some(n) => n,
            None => {
                let local_n = mb
                    .get_or_err(&keys.assistant_mask)?
                    .f_count_nonzero(None::<i64>)?
                    .f_int64_value(&[])? as f64;
                c.sum_scalars(&[local_n])?
                    .first()
                    .copied()
                    .unwrap_or(local_n)
            }
        };
        let config = self
            .loss_config
            .clone()
            .with_token_normalizer(Some(global_n));
        let loss = PpoRlhfLoss::new(update_policy(&self.model, &mb)).with_config(config)?;
        let out = loss.forward(&mb)?;
        let grad_norm = self
            .opt
            .backward_step_with(&out.loss, self.max_grad_norm, |params| {
                c.all_reduce_sum_gradients(params)
            })?;
        let lr = self.sched.step();
        self.opt.set_lr(lr);
        // Every term is a local sum over the global count: their sums over the ranks are the
        // global values (padding_percentage, a local ratio, is averaged over the ranks).
        let world = c.world_size() as f64;
        let mut names = Vec::new();
        let mut values = Vec::new();
        for (k, v) in out.loss_terms().into_iter().chain(out.metrics()) {
            let v = v.f_double_value(&[])?;
            names.push(k.to_string());
            values.push(if k == "padding_percentage" {
                v / world
            } else {
                v
            });
        }
        names.push("loss".into());
        values.push(out.loss.f_double_value(&[])?);
        let values = c.sum_scalars(&values)?;
        let mut stats: Stats = names.into_iter().zip(values).collect();
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
        let stats = self.make_experience()?;
        self.update_phase(stats, callbacks)
    }

    /// The learning half of an iteration on a given rollout store (offline replay of saved
    /// rollouts, or a fixed store for a reproducible step): the store replaces the current
    /// one, its statistics are computed (the mean KL the controller is fed after each epoch,
    /// the score, the lengths; over every rank in a group), then `ppo_epochs` epochs of
    /// shuffled minibatches of `train.batch_size` with the callbacks that are due, as in
    /// [`PpoRlhfTrainer::iteration`]. Returns the iteration's statistics (also kept in
    /// [`PpoRlhfTrainer::history`]); `kl_coef` there is the controller's value at the start.
    ///
    /// The store needs what [`PpoRlhfTrainer::make_experience`] writes: `("tokens", "full")`,
    /// `("masks", "all_attention_mask")`, `("masks", "all_assistant_mask")`,
    /// `("log_probs", "full")`, `"values"`, `("next", "reward")` (the KL penalty already in
    /// it), `("next", "score")`, `("next", "kl_penalty")` and `("next", "kl_k3")`, all `[B,
    /// T]` (or `[B, T, 1]`) but the score.
    ///
    /// **Data-parallel**: each rank passes its own share of the global store; with
    /// `train.batch_size` per rank, rank `r`'s `k`-th minibatch is its share of the global
    /// `k`-th minibatch. Each rank shuffles its share with its own generator, so a run equals
    /// one process on the concatenated store exactly (up to rounding) when each minibatch
    /// is a rank's whole share (the order within a minibatch does not change its sums).
    ///
    /// # Errors
    /// An empty store, a missing key (naming what is there), or as
    /// [`PpoRlhfTrainer::iteration`].
    pub fn learn_on(
        &mut self,
        store: TensorDict,
        callbacks: &mut Callbacks<'_>,
    ) -> Result<IterationStats> {
        check_store_rows("PpoRlhfTrainer::learn_on", &store)?;
        let stats = self.rollout_stats(&store, self.kl_ctl.value(), Instant::now())?;
        self.store = Some(store);
        self.update_phase(stats, callbacks)
    }

    /// `ppo_epochs` epochs of minibatch updates on the store, each step followed by the
    /// callbacks that are due, each epoch by the KL controller's update.
    fn update_phase(
        &mut self,
        mut stats: IterationStats,
        callbacks: &mut Callbacks<'_>,
    ) -> Result<IterationStats> {
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
            let perm = permutation(&mut self.rng, n, self.model.policy().model().device())?;
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
            // trlX HEAD's post_backward_callback, once per inner epoch; n_steps is the
            // global minibatch (trlX passes its per-process batch_size), so N ranks move the
            // controller as one process on the N-times batch does
            let n_steps = self.config.train.batch_size * self.collective.world_size();
            self.kl_ctl.update(self.mean_kl, n_steps)?;
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
        let rank = self.collective.rank();
        if rank == 0 {
            set_prompt_state_json(OP, self.env.base_mut(), state)?;
        } else {
            // The checkpoint holds rank 0's generator and prompt position: other ranks draw
            // their own stream from it and keep their own env's prompt position.
            self.rng = Generator::new(rank_seed(self.rng.next_u64(), rank));
        }
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

    fn is_main_process(&self) -> bool {
        self.collective.is_main()
    }

    fn sync_processes(&self, op: &'static str, ok: bool) -> Result<()> {
        self.collective.check_all_ok(op, ok)
    }

    /// Generates responses for the `("tokens", "prompt")` batch of `data` (with its
    /// `("masks", "prompt_attention_mask")`) and writes the policy's log-probs, the values
    /// and the reference log-probs (the rollout's policy step).
    fn act(&mut self, data: &TensorDict) -> Result<TensorDict> {
        let gen = self.rollout_gen.clone();
        self.policy_step(data.clone(), &gen, false)
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

/// The fields every rank must share with rank 0 (what decides how many collectives each rank
/// makes): the train schedule and PPO's rollout / epoch / KL-controller settings.
fn schedule_fields(config: &TrlConfig) -> Vec<(&'static str, f64)> {
    let m = &config.method;
    let mut fields = train_schedule_fields(&config.train);
    fields.extend([
        ("method.num_rollouts", m.num_rollouts as f64),
        ("method.chunk_size", m.chunk_size as f64),
        ("method.ppo_epochs", m.ppo_epochs as f64),
        ("method.init_kl_coef", m.init_kl_coef),
        ("method.target", m.target.unwrap_or(-1.0)),
        ("method.horizon", m.horizon as f64),
    ]);
    fields
}
