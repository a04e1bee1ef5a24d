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
//! A checkpoint holds rank 0's state and, beside it, every rank's generator and prompt
//! position ([`RlTrainer::rank_states`], gathered when every rank calls
//! [`RlTrainer::save_to`]); on [`RlTrainer::load`] (every rank loads the same folder) each
//! rank takes its own back, so a resumed group is bitwise an uninterrupted one on every rank.
//! A checkpoint from one process (or a group of another size) gives ranks `> 0` a generator
//! derived from rank 0's.
//!
//! # Logged statistics
//! Per optimizer step (`Stats`): `loss`, `loss/policy`, `loss/value`, `policy/approx_kl`,
//! `policy/clipfrac`, `values/clipfrac`, `values/error`, `ratio`, `padding_percentage`, `lr`,
//! `kl_coef`, `grad_norm`. Per iteration ([`IterationStats`]): the mean raw score, the mean KL
//! (k1, summed over the response, then averaged), k3, the KL coefficient, the mean response
//! length and the times of the rollout and the update.

use serde_json::{json, Map, Value};
use tch::{Kind, Tensor};

use super::api::Stats;
use super::config::{ScaleReward as ConfigScaleReward, TrainConfig, TrlConfig};
pub use super::on_policy::IterationStats;
use super::on_policy::{Learner, OnPolicyMethod, OnPolicyTrainer, Parts};
use super::optim::{AdamW, CosineAnnealingLr};
use super::parallel::{train_schedule_fields, Collective, SharedCollective};
use super::rollout::{
    check_vocab, generation_config, trainable_params, update_policy, StateFields,
};
use crate::envs::llm::moments::{MomentsReduce, RunningMoments};
use crate::envs::llm::{
    KLComputation, RetrieveKL, RetrieveLogProb, ScaleReward, ScoreScaling, TokenEnv,
};
use crate::envs::transforms::TransformHandle;
use crate::envs::TransformedEnv;
use crate::error::{Error, Result};
use crate::modules::llm::keys::ASSISTANT_MASK_KEY;
use crate::modules::llm::{CausalLmWithHydraValueHead, TextTokenizer};
use crate::objectives::llm::ppo::compute_ppo_rlhf_advantages_counted;
use crate::objectives::llm::{
    AdaptiveKLController, FixedKLController, KlController, PpoRlhfConfig, PpoRlhfKeys, PpoRlhfLoss,
};
use crate::objectives::{LossModule, LossOutput};
use crate::tensordict::TensorDict;

/// Where the trainer logs k3 (TRL's direction) per token, under `next`.
const K3_KEY: &str = "kl_k3";

/// A PPO-RLHF trainer (see the [module docs](self)): the [on-policy loop](OnPolicyTrainer)
/// with [`PpoRlhfMethod`].
pub type PpoRlhfTrainer = OnPolicyTrainer<PpoRlhfMethod>;

/// PPO-RLHF's part of the on-policy loop: trlX's config, the loss settings, the KL
/// controller and the mean KL it is fed, and typed handles to the env's score scaling and KL
/// transforms.
#[derive(Debug)]
pub struct PpoRlhfMethod {
    config: TrlConfig,
    loss_config: PpoRlhfConfig,
    kl_ctl: KlController,
    mean_kl: f64,
    scaling: TransformHandle<ScoreScaling>,
    kl: TransformHandle<RetrieveKL>,
}

fn scale_mode(mode: ConfigScaleReward) -> ScaleReward {
    match mode {
        ConfigScaleReward::Ignored => ScaleReward::Ignored,
        ConfigScaleReward::Running => ScaleReward::Running,
        ConfigScaleReward::Ref => ScaleReward::Ref,
    }
}

impl OnPolicyTrainer<PpoRlhfMethod> {
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
        let (env, scaling) = TransformedEnv::new(env)?.with_handle(scaling)?;
        let (env, kl) = env.with_handle(kl)?;
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
        let method = PpoRlhfMethod {
            config,
            loss_config,
            kl_ctl,
            mean_kl: 0.0,
            scaling,
            kl,
        };
        let parts = Parts {
            model,
            env,
            tokenizer,
            rollout_gen,
            eval_gen,
            opt,
            sched,
        };
        Ok(OnPolicyTrainer::from_parts(method, parts))
    }

    /// The KL controller.
    pub fn kl_controller(&self) -> &KlController {
        &self.method.kl_ctl
    }
}

impl PpoRlhfMethod {
    fn minibatches_per_rollout(&self) -> usize {
        let mb = self.config.train.batch_size.max(1);
        self.config.method.num_rollouts.div_ceil(mb)
    }
}

impl OnPolicyMethod for PpoRlhfMethod {
    type Config = TrlConfig;
    const NAME: &'static str = "PpoRlhfTrainer";

    fn config(&self) -> &TrlConfig {
        &self.config
    }

    fn train(&self) -> &TrainConfig {
        &self.config.train
    }

    fn num_rollouts(&self) -> usize {
        self.config.method.num_rollouts
    }

    fn passes(&self) -> usize {
        self.config.method.ppo_epochs
    }

    /// trlX's total step budget: `min(train.total_steps, epochs · ppo_epochs · minibatches)`.
    fn total_steps(&self) -> usize {
        self.config.total_steps(self.minibatches_per_rollout())
    }

    /// The train schedule and PPO's rollout / epoch / KL-controller settings.
    fn schedule_fields(&self) -> Vec<(&'static str, f64)> {
        let m = &self.config.method;
        let mut fields = train_schedule_fields(&self.config.train);
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

    /// Makes the score scaling's batch moments global.
    fn join(
        &mut self,
        env: &mut TransformedEnv<TokenEnv>,
        collective: &SharedCollective,
    ) -> Result<()> {
        if let Some(s) = env.transform_by_mut(&self.scaling) {
            let c = collective.clone();
            s.set_moments_reduce(Some(MomentsReduce::new(move |b| c.all_reduce_moments(b))));
        }
        Ok(())
    }

    /// The controller's coefficient into the KL transform.
    fn before_rollout(&mut self, env: &mut TransformedEnv<TokenEnv>) -> Result<()> {
        let kl_coef = self.kl_ctl.value();
        if let Some(kl) = env.transform_by_mut(&self.kl) {
            kl.kl_mut().set_coeff(kl_coef);
        }
        Ok(())
    }

    /// The rollout statistics of `store` over every rank (means over all ranks' sequences;
    /// with one rank exactly the local means); sets the mean KL the controller is fed.
    fn prepare_store(
        &mut self,
        store: &mut TensorDict,
        c: &SharedCollective,
    ) -> Result<IterationStats> {
        let kl_coef = self.kl_ctl.value();
        let assistant = store
            .get_or_err(ASSISTANT_MASK_KEY)?
            .f_to_kind(Kind::Float)?;
        let kl = store.get_or_err(("next", "kl_penalty"))?;
        let k3 = store.get_or_err(("next", K3_KEY))?;
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
                        Self::NAME,
                        "rollouts",
                        "at least one rollout on some rank",
                        "none on any rank",
                    )),
                })
                .collect::<Result<Vec<f64>>>()?
        };
        let [mean_kl, kl_k3, score, response_length] = means[..] else {
            return Err(Error::argument(
                Self::NAME,
                "rollout statistics",
                "four means",
                means.len().to_string(),
            ));
        };
        self.mean_kl = mean_kl;
        Ok(IterationStats {
            iteration: 0,
            iter_count: 0,
            score,
            kl: mean_kl,
            kl_k3,
            kl_coef,
            response_length,
            update: Stats::new(),
            rollout_s: 0.0,
            update_s: 0.0,
        })
    }

    fn train_step(&mut self, learner: &mut Learner<'_>, mut mb: TensorDict) -> Result<Stats> {
        let keys = PpoRlhfKeys::default();
        let c = learner.collective.clone();
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
        let out = PpoRlhfLoss::new(update_policy(learner.model, &mb))
            .with_config(config)?
            .forward(&mb)?;
        let (lr, grad_norm) = learner.step(&out.loss)?;
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

    /// trlX HEAD's post_backward_callback, once per inner epoch; n_steps is the global
    /// minibatch (trlX passes its per-process batch_size), so N ranks move the controller as
    /// one process on the N-times batch does.
    fn after_pass(&mut self, collective: &SharedCollective) -> Result<()> {
        let n_steps = self.config.train.batch_size * collective.world_size();
        self.kl_ctl.update(self.mean_kl, n_steps)
    }

    /// The KL coefficient, the mean KL, the score scaling's running moments and reference
    /// statistics.
    fn state_json(&self, env: &TransformedEnv<TokenEnv>) -> Map<String, Value> {
        let scaling = env.transform_by(&self.scaling);
        let mut m = Map::new();
        m.insert("kl_coef".into(), json!(self.kl_ctl.value()));
        m.insert("mean_kl".into(), json!(self.mean_kl));
        m.insert(
            "running_moments".into(),
            json!(scaling.and_then(|s| serde_json::to_value(s.running_moments()).ok())),
        );
        m.insert(
            "ref_stats".into(),
            json!(scaling.and_then(ScoreScaling::ref_stats)),
        );
        m
    }

    fn set_state_json(&mut self, env: &mut TransformedEnv<TokenEnv>, state: &Value) -> Result<()> {
        const OP: &str = "PpoRlhfTrainer::load";
        // every field read and checked first, then all applied (the trainer's load needs
        // all or nothing)
        let fields = StateFields::new(OP, state);
        let mut kl_ctl = self.kl_ctl;
        kl_ctl.set_value(fields.f64("kl_coef")?)?;
        let mean_kl = fields.f64("mean_kl")?;
        if !mean_kl.is_finite() {
            let got = mean_kl.to_string();
            return Err(Error::value(
                OP,
                "trainer state mean_kl",
                "a finite number",
                got,
            ));
        }
        let moments = fields.field("running_moments")?.clone();
        let ref_stats = fields.field("ref_stats")?.clone();
        let moments: Option<RunningMoments> = if moments.is_null() {
            None
        } else {
            let m: RunningMoments = serde_json::from_value(moments)
                .map_err(|e| Error::value(OP, "trainer state", "running_moments", e.to_string()))?;
            if !m.is_valid() {
                let got = format!("{m:?}");
                let want = "finite moments with var, std and count >= 0";
                return Err(Error::value(OP, "trainer state running_moments", want, got));
            }
            Some(m)
        };
        let ref_stats: Option<(f64, f64)> = serde_json::from_value(ref_stats)
            .map_err(|e| Error::value(OP, "trainer state", "ref_stats", e.to_string()))?;
        if ref_stats.is_some_and(|(m, s)| !(m.is_finite() && s.is_finite() && s >= 0.0)) {
            let got = format!("{ref_stats:?}");
            let want = "a finite mean and std >= 0";
            return Err(Error::value(OP, "trainer state ref_stats", want, got));
        }
        self.kl_ctl = kl_ctl;
        self.mean_kl = mean_kl;
        if let Some(s) = env.transform_by_mut(&self.scaling) {
            if let Some(m) = moments {
                s.set_running_moments(m);
            }
            s.set_ref_stats(ref_stats);
        }
        Ok(())
    }
}
