//! [`OnPolicyTrainer`]: the one on-policy loop PPO-RLHF and GRPO share (burn's split between
//! the learner and the `TrainStep`). The loop owns what every on-policy RLHF method has: the
//! hydra model, the token env with its transforms, the tokenizer, the generation settings,
//! AdamW and its cosine schedule, the sampler's generator, the rollout store, the counters,
//! evaluation, history, the collective and the trunk cache. It writes once: rollouts in
//! `chunk_size` pieces, the epochs / passes of shuffled minibatches, the callbacks after each
//! step, the step budget, data-parallel joining, act / sample / evaluate, and checkpoints.
//!
//! A method ([`OnPolicyMethod`]) supplies what differs: how a store is prepared (PPO-RLHF: its
//! rollout statistics and the KL fed to the controller; GRPO: group advantages), the
//! optimizer step on a minibatch (through a [`Learner`]: the model, the collective and one
//! `step` that backpropagates, sums gradients over the ranks, clips, steps AdamW and the
//! schedule), and its hooks (before a rollout, after a pass, its own checkpoint state).
//! [`PpoRlhfTrainer`](super::ppo::PpoRlhfTrainer) and
//! [`GrpoTrainer`](super::grpo::GrpoTrainer) are this loop with their method.
//!
//! ```
//! use tch::nn::VarStore;
//! use torchrl::envs::llm::{TokenEnv, TokenEnvConfig, TokenScorer};
//! use torchrl::modules::llm::{ByteTokenizer, CausalLmWithHydraValueHead, Gpt2Config, TextTokenizer};
//! use torchrl::trainers::config::GenKwargs;
//! use torchrl::trainers::grpo::{GrpoTrainer, GrpoTrlConfig};
//! use torchrl::trainers::{Callbacks, RlTrainer};
//! # fn main() -> torchrl::Result<()> {
//! let tok = ByteTokenizer::new();
//! let gpt = Gpt2Config::new(tok.vocab_size()).with_n_positions(16).with_n_embd(8)
//!     .with_n_layer(2).with_n_head(2)
//!     .with_special_tokens(tok.bos_token_id(), tok.eos_token_id(), tok.pad_token_id());
//! let vs = VarStore::new(tch::Device::Cpu);
//! let model = CausalLmWithHydraValueHead::new(&vs.root(), &gpt, 1)?;
//! let env_cfg = TokenEnvConfig::for_model(&gpt.facts()).with_max_new_tokens(2)
//!     .with_batch_size(2).with_num_generations(2);
//! let scorer = TokenScorer::new(|_p: &[i64], r: &[i64]| r.len() as f64);
//! let env = TokenEnv::from_text(env_cfg, &tok, &["ab", "cd"], Box::new(scorer))?;
//! let mut config = GrpoTrlConfig::default();
//! config.method.num_rollouts = 2;
//! config.method.chunk_size = 2;
//! config.method.num_generations = 2;
//! config.method.gen_kwargs = GenKwargs { max_new_tokens: 2, ..GenKwargs::default() };
//! config.train.batch_size = 2;
//! config.train.total_steps = 2;
//! // the final step saves a checkpoint (default folder "ckpts"): keep it out of the way
//! let ckpts = std::env::temp_dir().join(format!("torchrl-on-policy-doc-{}", std::process::id()));
//! config.train.checkpoint_dir = ckpts.display().to_string();
//! let mut trainer = GrpoTrainer::new(config, model, env, Box::new(tok))?;
//! let stats = trainer.iteration(&mut Callbacks::new())?; // rollout, then the updates
//! assert_eq!(stats.iter_count, 1);                       // one minibatch of 2
//! trainer.learn(&mut Callbacks::new())?;                 // until the budget
//! assert_eq!(trainer.iter_count(), 2);
//! assert!(ckpts.join("latest").exists());
//! # std::fs::remove_dir_all(&ckpts).ok();
//! # Ok(()) }
//! ```

use std::fmt;
use std::time::Instant;

use serde::Serialize;
use serde_json::{json, Map, Value};
use tch::Tensor;

use super::api::{
    counter_from_json, in_component, rng_from_json, rng_to_json, take_component, Callbacks,
    Component, EvalReport, Evaluation, RlTrainer, Stats, RANKS_COMPONENT,
};
use super::config::TrainConfig;
use super::optim::{AdamW, CosineAnnealingLr};
use super::parallel::{all_gather_json, join_group, rank_seed, Collective, SharedCollective};
use super::rollout::{
    check_store_rows, generate_text, hydra_components, hydra_policy_step, permutation,
    policy_params, prepare_hydra_components, prompt_batch, prompt_state_from_json,
    prompt_state_json, reference_params, sample_prompts, PolicyStep,
};
use crate::envs::llm::TokenEnv;
use crate::envs::{EnvBase, TransformedEnv};
use crate::error::{Error, Result};
use crate::modules::llm::nn::packed::PackedWeightCache;
use crate::modules::llm::{CausalLmWithHydraValueHead, GenerationConfig, TextTokenizer};
use crate::rng::Generator;
use crate::tensordict::{cat, BatchIndex, TensorDict};

/// What one on-policy iteration (a rollout and its updates) measured: PPO-RLHF's, and
/// GRPO's (with `kl_coef` its `beta`).
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

/// What a method's optimizer step works with: the model (read), the group, and one
/// [`Learner::step`] that applies a loss.
pub struct Learner<'a> {
    /// The model being trained.
    pub model: &'a CausalLmWithHydraValueHead,
    /// The group this trainer is a rank of.
    pub collective: &'a SharedCollective,
    opt: &'a mut AdamW,
    sched: &'a mut CosineAnnealingLr,
    max_grad_norm: Option<f64>,
}

impl fmt::Debug for Learner<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Learner")
            .field("max_grad_norm", &self.max_grad_norm)
            .finish_non_exhaustive()
    }
}

impl Learner<'_> {
    /// Backpropagates `loss`, sums the gradients over the ranks, clips their global norm to
    /// `train.max_grad_norm`, steps AdamW and the cosine schedule. Returns the new learning
    /// rate and the gradient norm before clipping (when clipping is on).
    ///
    /// # Errors
    /// As the backward pass, the collective or the optimizer.
    pub fn step(&mut self, loss: &Tensor) -> Result<(f64, Option<f64>)> {
        let c = self.collective.clone();
        let grad_norm = self
            .opt
            .backward_step_with(loss, self.max_grad_norm, |params| {
                c.all_reduce_sum_gradients(params)
            })?;
        let lr = self.sched.step();
        self.opt.set_lr(lr);
        Ok((lr, grad_norm))
    }
}

/// What an on-policy RLHF method supplies to the [`OnPolicyTrainer`] loop. See the
/// [module docs](self).
pub trait OnPolicyMethod {
    /// The whole config (trlX's / TRL's fields), saved in checkpoints.
    type Config: Serialize + fmt::Debug;

    /// The trainer's name in errors (`"PpoRlhfTrainer"`).
    const NAME: &'static str;

    /// The config.
    fn config(&self) -> &Self::Config;

    /// Its `train` section.
    fn train(&self) -> &TrainConfig;

    /// Rollouts per iteration (`method.num_rollouts`).
    fn num_rollouts(&self) -> usize;

    /// Passes of minibatch updates over each store (`ppo_epochs`, `num_iterations`).
    fn passes(&self) -> usize;

    /// The step budget.
    fn total_steps(&self) -> usize;

    /// The fields every rank must share with rank 0 (what decides how many collectives each
    /// rank makes).
    fn schedule_fields(&self) -> Vec<(&'static str, f64)>;

    /// The rollout's prompts come in consecutive groups of this many identical rows (the
    /// env's [`num_generations`](crate::envs::llm::TokenEnvConfig::num_generations)): the
    /// policy step then runs each group's prompt pass once
    /// ([`GenerateOptions::prompt_groups`](crate::modules::llm::GenerateOptions::prompt_groups);
    /// the same tokens and log-probs). Default 1: no groups.
    fn prompt_groups(&self) -> usize {
        1
    }

    /// Whether the rollout's policy log-probs come from the sampler when they are the
    /// model's ([`GenerationConfig::log_probs_are_the_models`]), so that the policy step's
    /// pass runs the reference's side only
    /// ([`CausalLmWithHydraValueHead::forward_reference`]) and writes no `"values"`. Default
    /// `false` (PPO-RLHF's value head needs the policy's whole pass).
    fn sampler_log_probs(&self) -> bool {
        false
    }

    /// Called when the trainer joins a group (after the parameter broadcast).
    ///
    /// # Errors
    /// The method's own.
    fn join(
        &mut self,
        env: &mut TransformedEnv<TokenEnv>,
        collective: &SharedCollective,
    ) -> Result<()> {
        let _ = (env, collective);
        Ok(())
    }

    /// Called before each rollout.
    ///
    /// # Errors
    /// The method's own.
    fn before_rollout(&mut self, env: &mut TransformedEnv<TokenEnv>) -> Result<()> {
        let _ = env;
        Ok(())
    }

    /// Makes a rollout store (fresh or given) the one the updates read (writing what they
    /// need, such as advantages) and returns its statistics (`iteration`, `iter_count` and
    /// the times are filled by the loop).
    ///
    /// # Errors
    /// A store without the keys the method reads.
    fn prepare_store(
        &mut self,
        store: &mut TensorDict,
        collective: &SharedCollective,
    ) -> Result<IterationStats>;

    /// One optimizer step on the minibatch `mb` (this rank's share of the global minibatch);
    /// returns its statistics (global ones in a group).
    ///
    /// # Errors
    /// As the loss and [`Learner::step`].
    fn train_step(&mut self, learner: &mut Learner<'_>, mb: TensorDict) -> Result<Stats>;

    /// Called after each full pass over the store.
    ///
    /// # Errors
    /// The method's own.
    fn after_pass(&mut self, collective: &SharedCollective) -> Result<()> {
        let _ = collective;
        Ok(())
    }

    /// The method's own trainer state, merged into the checkpoint's `trainer` entry.
    fn state_json(&self, env: &TransformedEnv<TokenEnv>) -> Map<String, Value> {
        let _ = env;
        Map::new()
    }

    /// Restores [`state_json`](Self::state_json)'s fields: all of them, or (on an error)
    /// none, as the trainer's load requires.
    ///
    /// # Errors
    /// A missing or malformed field, named.
    fn set_state_json(&mut self, env: &mut TransformedEnv<TokenEnv>, state: &Value) -> Result<()> {
        let _ = (env, state);
        Ok(())
    }
}

/// The on-policy loop around a method `M`. See the [module docs](self).
pub struct OnPolicyTrainer<M: OnPolicyMethod> {
    pub(crate) method: M,
    pub(crate) model: CausalLmWithHydraValueHead,
    pub(crate) env: TransformedEnv<TokenEnv>,
    pub(crate) tokenizer: Box<dyn TextTokenizer>,
    pub(crate) rollout_gen: GenerationConfig,
    pub(crate) eval_gen: GenerationConfig,
    pub(crate) opt: AdamW,
    pub(crate) sched: CosineAnnealingLr,
    pub(crate) rng: Generator,
    pub(crate) store: Option<TensorDict>,
    pub(crate) iter_count: usize,
    pub(crate) epoch: usize,
    pub(crate) evaluation: Evaluation,
    pub(crate) history: Vec<IterationStats>,
    pub(crate) collective: SharedCollective,
    pub(crate) cache_trunk: bool,
    trunk_from_generation: bool,
    packed_weights: Option<PackedWeightCache>,
}

impl<M: OnPolicyMethod> fmt::Debug for OnPolicyTrainer<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct(M::NAME)
            .field("iter_count", &self.iter_count)
            .field("epoch", &self.epoch)
            .field("collective", &self.collective)
            .finish_non_exhaustive()
    }
}

/// The parts a method's constructor checked and built, from which the loop is made.
pub(crate) struct Parts {
    pub(crate) model: CausalLmWithHydraValueHead,
    pub(crate) env: TransformedEnv<TokenEnv>,
    pub(crate) tokenizer: Box<dyn TextTokenizer>,
    pub(crate) rollout_gen: GenerationConfig,
    pub(crate) eval_gen: GenerationConfig,
    pub(crate) opt: AdamW,
    pub(crate) sched: CosineAnnealingLr,
}

impl<M: OnPolicyMethod> OnPolicyTrainer<M> {
    /// The loop around `method` with the checked parts.
    pub(crate) fn from_parts(method: M, parts: Parts) -> Self {
        OnPolicyTrainer {
            rng: Generator::new(method.train().seed),
            method,
            model: parts.model,
            env: parts.env,
            tokenizer: parts.tokenizer,
            rollout_gen: parts.rollout_gen,
            eval_gen: parts.eval_gen,
            opt: parts.opt,
            sched: parts.sched,
            store: None,
            iter_count: 0,
            epoch: 0,
            evaluation: Evaluation::default(),
            history: Vec::new(),
            collective: SharedCollective::default(),
            cache_trunk: true,
            trunk_from_generation: true,
            packed_weights: Some(PackedWeightCache::new()),
        }
    }

    /// Makes this trainer one rank of a data-parallel group. A collective call: every rank
    /// calls it once, with the same config, before training and before loading a checkpoint
    /// (a rank then takes its own generator and prompt position from it; joining after a
    /// load would give ranks `> 0` a fresh generator again). It checks that every rank has rank 0's schedule (a mismatch would
    /// desynchronise the collectives), broadcasts rank 0's policy (trunk and value head) and
    /// frozen reference into every rank, gives ranks `> 0` their own generator
    /// ([`rank_seed`] of `train.seed`), and lets the method join (PPO-RLHF makes its score
    /// scaling's batch moments global). **Each rank's env should serve its own prompts.**
    ///
    /// # Errors
    /// When the ranks' schedules differ (on every rank, naming the fields), or a collective
    /// fails.
    pub fn with_collective(mut self, collective: impl Collective + 'static) -> Result<Self> {
        let shared = SharedCollective::new(collective);
        let params = [policy_params(&self.model), reference_params(&self.model)];
        let params: Vec<&[(String, Tensor)]> = params.iter().map(Vec::as_slice).collect();
        let fields = self.method.schedule_fields();
        join_group(&shared, M::NAME, &fields, &params, &mut self.opt)?;
        if shared.rank() > 0 {
            self.rng = Generator::new(rank_seed(self.method.train().seed, shared.rank()));
        }
        self.method.join(&mut self.env, &shared)?;
        self.collective = shared;
        Ok(self)
    }

    /// Whether rollouts keep the frozen trunk's output (`true` by default) so that every
    /// update forward starts above the frozen blocks
    /// ([`CachedTrunk`](crate::modules::llm::CachedTrunk)): the same log-probs and values up
    /// to rounding, without re-running `n_layer − num_layers_unfrozen` blocks per update. The
    /// cost is memory: `num_rollouts × T × hidden` floats in the store (GPT-2 small, 512
    /// rollouts of 1,024 tokens: 1.6 GB). No effect with a full-copy reference.
    pub fn with_trunk_cache(mut self, on: bool) -> Self {
        self.cache_trunk = on;
        self
    }

    /// Whether a rollout takes the frozen trunk's output from its generation (`true` by
    /// default): the decode computes the hidden state entering the first unfrozen block at
    /// every position anyway
    /// ([`GenerateOptions::capture_block_input`](crate::modules::llm::GenerateOptions::capture_block_input)),
    /// so the rollout's scoring pass (reference log-probs, values) starts above the trunk
    /// instead of running `n_layer − num_layers_unfrozen` blocks again over every sequence.
    /// The scores agree with the recomputed ones up to rounding. Used only when the decode
    /// computes the model's own values (a float32 / float64 model without active dropout,
    /// as [`GenerationConfig::log_probs_are_the_models`](crate::modules::llm::GenerationConfig::log_probs_are_the_models));
    /// no effect with a full-copy reference.
    pub fn with_trunk_from_generation(mut self, on: bool) -> Self {
        self.trunk_from_generation = on;
        self
    }

    /// Whether rollouts keep the packed copies of the model's frozen weights across
    /// generations (`true` by default;
    /// [`PackedWeightCache`](crate::modules::llm::nn::packed::PackedWeightCache)): a CPU
    /// float32 decode multiplies through packed weights, and a hydra policy's frozen trunk and
    /// tied head need not be packed again at every rollout (0.48 s a rollout at the
    /// Qwen2.5-0.5B shape). The cost is memory: the packed copies (as many bytes as the frozen
    /// float32 weights) stay held between rollouts instead of only during a generation. No
    /// effect on other devices or dtypes, or on models too small to pack.
    pub fn with_packed_weight_cache(mut self, on: bool) -> Self {
        self.packed_weights = on.then(PackedWeightCache::new);
        self
    }

    /// Sets what [`RlTrainer::evaluate`] runs (trlX's `eval_prompts`, `reward_fn`,
    /// `metric_fn`): each function receives the decoded responses (special tokens skipped), in
    /// prompt order.
    pub fn with_evaluation(mut self, evaluation: Evaluation) -> Self {
        self.evaluation = evaluation;
        self
    }

    /// The group this trainer is a rank of ([`SingleProcess`](super::parallel::SingleProcess)
    /// unless [`OnPolicyTrainer::with_collective`] was called).
    pub fn collective(&self) -> &SharedCollective {
        &self.collective
    }

    /// The whole config.
    pub fn config(&self) -> &M::Config {
        self.method.config()
    }

    /// The method (its loss settings and state).
    pub fn method(&self) -> &M {
        &self.method
    }

    /// The model being trained (policy, value head and frozen reference).
    pub fn model(&self) -> &CausalLmWithHydraValueHead {
        &self.model
    }

    /// The env with its transforms.
    pub fn env(&self) -> &TransformedEnv<TokenEnv> {
        &self.env
    }

    /// Iterations (rollout + updates) finished, counting those of a loaded checkpoint.
    pub fn epoch(&self) -> usize {
        self.epoch
    }

    /// What each finished iteration measured.
    pub fn history(&self) -> &[IterationStats] {
        &self.history
    }

    /// The current rollouts (after [`OnPolicyTrainer::make_experience`]).
    pub fn store(&self) -> Option<&TensorDict> {
        self.store.as_ref()
    }

    /// The step budget.
    pub fn total_steps(&self) -> usize {
        self.method.total_steps()
    }

    /// trlX's `make_experience(num_rollouts)`: collects `num_rollouts` scored responses
    /// (`chunk_size` at a time) into the store, replacing the previous rollouts, and lets the
    /// method prepare it. Returns the iteration's rollout statistics.
    ///
    /// # Errors
    /// As the env, generation and the method.
    pub fn make_experience(&mut self) -> Result<IterationStats> {
        let start = Instant::now();
        self.method.before_rollout(&mut self.env)?;
        let want = self.method.num_rollouts();
        let mut chunks = Vec::new();
        let mut have = 0usize;
        while have < want {
            let td = self.env.reset(None)?;
            let step = PolicyStep {
                keep_trunk: self.cache_trunk,
                prompt_groups: self.method.prompt_groups(),
                sampler_log_probs: self.method.sampler_log_probs(),
                trunk_from_generation: self.trunk_from_generation,
                packed_weights: self.packed_weights.as_ref(),
            };
            let td = hydra_policy_step(&self.model, &mut self.rng, td, &self.rollout_gen, step)?;
            let td = self.env.step(td)?;
            have += td.batch_size().first().copied().unwrap_or(0).max(1) as usize;
            chunks.push(td);
        }
        let mut store = cat(&chunks, 0)?;
        if have > want {
            store = store.index(&[BatchIndex::slice(None, Some(want as i64), 1)])?;
        }
        self.prepare(store, start)
    }

    /// The method's preparation of `store`, which then becomes the current one.
    fn prepare(&mut self, mut store: TensorDict, start: Instant) -> Result<IterationStats> {
        let mut stats = self.method.prepare_store(&mut store, &self.collective)?;
        stats.iteration = self.epoch;
        stats.iter_count = self.iter_count;
        stats.rollout_s = start.elapsed().as_secs_f64();
        self.store = Some(store);
        Ok(stats)
    }

    /// One iteration: a rollout ([`OnPolicyTrainer::make_experience`]), then the method's
    /// passes of minibatch updates, each step followed by the callbacks that are due. Returns
    /// the iteration's statistics (also kept in [`OnPolicyTrainer::history`]).
    ///
    /// # Errors
    /// As the rollout, the steps and the callbacks.
    pub fn iteration(&mut self, callbacks: &mut Callbacks<'_>) -> Result<IterationStats> {
        let stats = self.make_experience()?;
        self.update_phase(stats, callbacks)
    }

    /// The learning half of an iteration on a given rollout store (offline replay of saved
    /// rollouts, or a fixed store for a reproducible step): the method prepares it (its
    /// statistics over every rank in a group), it replaces the current store, then the
    /// passes of shuffled minibatches of `train.batch_size` with the callbacks that are due,
    /// as in [`OnPolicyTrainer::iteration`].
    ///
    /// **Data-parallel**: each rank passes its own share of the global store; with
    /// `train.batch_size` per rank, rank `r`'s `k`-th minibatch is its share of the global
    /// `k`-th minibatch. Each rank shuffles its share with its own generator, so a run equals
    /// one process on the concatenated store (up to rounding) when each minibatch is a rank's
    /// whole share.
    ///
    /// # Errors
    /// An empty store, a missing key (naming what is there), or as
    /// [`OnPolicyTrainer::iteration`].
    pub fn learn_on(
        &mut self,
        store: TensorDict,
        callbacks: &mut Callbacks<'_>,
    ) -> Result<IterationStats> {
        check_store_rows(M::NAME, &store)
            .map_err(|e| e.context(format!("{}::learn_on", M::NAME)))?;
        let stats = self.prepare(store, Instant::now())?;
        self.update_phase(stats, callbacks)
    }

    /// The passes of minibatch updates on the store, each step followed by the callbacks that
    /// are due, each pass by the method's `after_pass`.
    fn update_phase(
        &mut self,
        mut stats: IterationStats,
        callbacks: &mut Callbacks<'_>,
    ) -> Result<IterationStats> {
        let start = Instant::now();
        let store = match &self.store {
            Some(s) => s.clone(),
            None => return Err(Error::value(M::NAME, "store", "rollouts", "none")),
        };
        let n = store.batch_size().first().copied().unwrap_or(0);
        let mb = (self.method.train().batch_size as i64).max(1);
        let total = self.total_steps();
        let device = self.model.policy().model().device();
        let mut sums = Stats::new();
        let mut steps = 0usize;
        'passes: for _ in 0..self.method.passes() {
            let perm = permutation(&mut self.rng, n, device)?;
            let mut at = 0;
            while at < n {
                let len = mb.min(n - at);
                let idx = perm.f_narrow(0, at, len)?;
                at += len;
                let batch = store.index(&[BatchIndex::tensor(idx)])?;
                let mut learner = Learner {
                    model: &self.model,
                    collective: &self.collective,
                    opt: &mut self.opt,
                    sched: &mut self.sched,
                    max_grad_norm: self.method.train().max_grad_norm,
                };
                let step_stats = self.method.train_step(&mut learner, batch)?;
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
            self.method.after_pass(&self.collective)?;
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
        prompt_batch(M::NAME, self.tokenizer.as_ref(), prompts, pad, device)
    }

    /// The trainer's state: counters, generator, prompt position and the method's own.
    fn state_json(&self) -> Value {
        let mut state = Map::new();
        state.insert("iter_count".into(), json!(self.iter_count));
        state.insert("epoch".into(), json!(self.epoch));
        state.insert("rng".into(), rng_to_json(&self.rng));
        state.insert("prompts".into(), prompt_state_json(self.env.base()));
        state.extend(self.method.state_json(&self.env));
        Value::Object(state)
    }

    /// This rank's own state: its generator and its env's prompt position (what differs
    /// between the ranks of a group).
    fn rank_state_json(&self) -> Value {
        json!({
            "rng": rng_to_json(&self.rng),
            "prompts": prompt_state_json(self.env.base()),
        })
    }

    /// Restores [`state_json`](Self::state_json): every field is read and checked before
    /// any changes; the prompt position and the method's state (each all-or-nothing) are
    /// applied last, the prompt position put back if the method refuses its state.
    ///
    /// A rank `> 0` takes its own generator and prompt position from `ranks` (the
    /// checkpoint's [`RANKS_COMPONENT`], one entry per rank of the group that saved it), so
    /// the resumed group is bitwise the uninterrupted one on every rank. A checkpoint without
    /// them (written by one process, or before they were saved) or from a group of another
    /// size gives ranks `> 0` a generator derived from rank 0's, and they keep their env's
    /// prompt position.
    fn set_state_json(&mut self, state: &Value, ranks: Option<&Value>) -> Result<()> {
        let iter_count = counter_from_json(M::NAME, state, "iter_count")?;
        let epoch = counter_from_json(M::NAME, state, "epoch")?;
        let mut rng = rng_from_json(M::NAME, state.get("rng"))?;
        let rank = self.collective.rank();
        let world = self.collective.world_size();
        let own = ranks
            .and_then(Value::as_array)
            .filter(|all| all.len() == world)
            .and_then(|all| all.get(rank));
        let prompts = if rank == 0 {
            prompt_state_from_json(M::NAME, state)?
        } else if let Some(own) = own {
            rng = rng_from_json(M::NAME, own.get("rng"))
                .map_err(|e| e.context(format!("the {RANKS_COMPONENT} component, rank {rank}")))?;
            prompt_state_from_json(M::NAME, own)
                .map_err(|e| e.context(format!("the {RANKS_COMPONENT} component, rank {rank}")))?
        } else {
            // Rank 0's generator and prompt position only: other ranks draw their own stream
            // from it and keep their own env's prompt position.
            rng = Generator::new(rank_seed(rng.next_u64(), rank));
            None
        };
        let old_prompts = self.env.base().prompt_state();
        if let Some(ps) = prompts {
            self.env.base_mut().set_prompt_state(ps)?;
        }
        if let Err(e) = self.method.set_state_json(&mut self.env, state) {
            // the position saved a moment ago fits this env
            self.env.base_mut().set_prompt_state(old_prompts)?;
            return Err(e);
        }
        self.iter_count = iter_count;
        self.epoch = epoch;
        self.rng = rng;
        self.store = None;
        Ok(())
    }
}

impl<M: OnPolicyMethod> RlTrainer for OnPolicyTrainer<M> {
    fn train_config(&self) -> &TrainConfig {
        self.method.train()
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
        let step = PolicyStep {
            trunk_from_generation: self.trunk_from_generation,
            packed_weights: self.packed_weights.as_ref(),
            ..PolicyStep::default()
        };
        hydra_policy_step(
            &self.model,
            &mut self.rng,
            data.clone(),
            &self.rollout_gen,
            step,
        )
    }

    fn sample(
        &mut self,
        prompts: &[String],
        length: usize,
        n_samples: usize,
    ) -> Result<Vec<String>> {
        let pad = self.env.base().config().pad_id();
        sample_prompts(
            M::NAME,
            &self.model,
            self.tokenizer.as_ref(),
            &mut self.rng,
            prompts,
            length,
            n_samples,
            &self.eval_gen,
            pad,
        )
    }

    fn learn(&mut self, callbacks: &mut Callbacks<'_>) -> Result<()> {
        let total = self.total_steps();
        while self.iter_count < total && self.epoch < self.method.train().epochs {
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

    /// Every rank's generator and prompt position, gathered on every rank (`None` in a
    /// world of one).
    fn rank_states(&self) -> Result<Option<Vec<Value>>> {
        if self.collective.world_size() == 1 {
            return Ok(None);
        }
        all_gather_json(&self.collective, &self.rank_state_json()).map(Some)
    }

    fn get_components(&self) -> Vec<(String, Component)> {
        let mut components =
            hydra_components(&self.model, &self.opt, &self.sched, self.state_json());
        components.push((
            "config".to_string(),
            Component::json(serde_json::to_value(self.method.config()).unwrap_or(Value::Null)),
        ));
        components
    }

    /// All or nothing: every component is read and checked (and the tensors converted)
    /// first, then the trainer's JSON state is applied (itself all or nothing), then the
    /// tensors are copied in. After an `Err`, parameters, optimizer state, schedule,
    /// counters and generators are as they were (only a libtorch failure of the final
    /// copies, such as a device out of memory, could interrupt them).
    fn set_components(&mut self, mut components: Vec<(String, Component)>) -> Result<()> {
        let ranks = take_component(&mut components, RANKS_COMPONENT)
            .ok()
            .map(|c| c.state);
        let (restore, state) = prepare_hydra_components(&self.model, &self.opt, &mut components)?;
        self.set_state_json(&state, ranks.as_ref())
            .map_err(|e| in_component("trainer", e))?;
        restore.commit(&mut self.opt, &mut self.sched)
    }
}
