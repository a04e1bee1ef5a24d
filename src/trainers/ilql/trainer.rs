//! `IlqlTrainer`: trlX's `AccelerateILQLTrainer` on the trainer API ([`RlTrainer`]).
//!
//! `learn` makes `train.epochs` passes over the offline [`IlqlDataset`] in seeded shuffled
//! minibatches of `train.batch_size` (trlX's `n_updates_per_batch = 1`); each minibatch is one
//! [`IlqlLoss`] step (AdamW, global gradient clipping, cosine schedule), and every
//! `steps_for_target_q_sync` optimizer steps the target Q-heads take a Polyak step
//! (`target ← α·q + (1 − α)·target`). That is trlX b623d1b's per-step sync, which rlhf.md
//! §7.4 argues for; trlX HEAD only checks the interval once per epoch (a regression).
//! `evaluate` generates on the evaluation prompts at every β of `gen_kwargs.beta` (trlX's
//! sweep) and reports each β's mean reward as `metrics["reward@beta=<β>"]` (the first β's is
//! `mean_reward`); [`IlqlTrainer::evaluate_sweep`] returns the reports one per β.
//!
//! # Data-parallel ([`IlqlTrainer::with_collective`])
//! As trlX under `accelerate`: `train.batch_size` is per process, a step takes
//! `world_size × batch_size` samples of one shuffled order (rank 0's, broadcast each epoch)
//! and rank `r` forwards the `r`-th slice. Every ILQL term is a mean over real actions, so
//! each rank weights its loss by its share of the step's real actions and the gradients are
//! summed: the step is one process's on the whole global batch (global clipped norm,
//! identical AdamW steps and Polyak syncs on every rank). Where trlX averages the ranks'
//! means (equal only when every rank has as many actions), this is the exact global mean.
//! The step statistics are the global batch's (`awac_weight_max` the largest over ranks);
//! logging, evaluation and checkpoints run on rank 0. Every rank holds the same dataset.
//!
//! ```
//! use tch::nn::VarStore;
//! use tch::Device;
//! use torchrl::modules::llm::{ByteTokenizer, CausalLmWithIlqlHeads, Gpt2Config, Gpt2Model, TextTokenizer};
//! use torchrl::trainers::api::{Callbacks, RlTrainer};
//! use torchrl::trainers::ilql::data::{IlqlDataConfig, IlqlDataset, IlqlTokenSample};
//! use torchrl::trainers::ilql::{IlqlTrainer, IlqlTrlConfig};
//! # fn main() -> torchrl::Result<()> {
//! let tok = ByteTokenizer::new();
//! let cfg = Gpt2Config::new(tok.vocab_size()).with_n_layer(1).with_n_embd(16).with_n_head(2).with_n_positions(16);
//! let vs = VarStore::new(Device::Cpu);
//! let model = CausalLmWithIlqlHeads::from_model(&vs.root(), Gpt2Model::new(&vs.root(), &cfg)?, true, 0.001)?;
//! // responses rich in 'a' have the higher return
//! let samples: Vec<IlqlTokenSample> = (0..8)
//!     .map(|i| IlqlTokenSample::new(vec![98, 58], vec![97 + (i % 2), 97, 256], (1 - i % 2) as f64))
//!     .collect();
//! let data = IlqlDataset::from_token_rows(&samples, &IlqlDataConfig::new().with_seq_length(16))?;
//! let mut config = IlqlTrlConfig::default();
//! config.train.batch_size = 4;
//! config.train.epochs = 2;
//! config.train.checkpoint_dir = std::env::temp_dir().join("ilql-doc").display().to_string();
//! config.train.checkpoint_interval = 1000;
//! config.method.gen_kwargs.max_new_tokens = 3;
//! let mut trainer = IlqlTrainer::new(config, vs, model, data, Box::new(tok))?;
//! trainer.learn(&mut Callbacks::new())?;
//! assert_eq!(trainer.iter_count(), 4); // 2 epochs of 2 minibatches
//! # let _ = std::fs::remove_dir_all(std::env::temp_dir().join("ilql-doc"));
//! # Ok(()) }
//! ```

use std::fmt;

use serde_json::{json, Value};
use tch::nn::VarStore;
use tch::Tensor;

use super::config::IlqlTrlConfig;
use super::data::IlqlDataset;
use crate::error::{Error, Result};
use crate::modules::llm::{
    check_tokenizer_fits, ilql_generate, CausalLmWithIlqlHeads, IlqlGenerationConfig, TextTokenizer,
};
use crate::objectives::llm::{IlqlConfig, IlqlLoss};
use crate::objectives::{LossModule, LossOutput};
use crate::rng::Generator;
use crate::tensordict::TensorDict;
use crate::trainers::api::{
    counter_from_json, decode_masked, encode_prompts, in_component, rng_from_json, rng_to_json,
    take_component, Callbacks, Component, EvalReport, Evaluation, RlTrainer, Stats,
};
use crate::trainers::config::TrainConfig;
use crate::trainers::optim::{AdamW, CosineAnnealingLr};
use crate::trainers::parallel::{
    join_group, rank0_order, rank_slice, train_schedule_fields, Collective, SharedCollective,
};

/// An ILQL trainer (see the [module docs](self)).
pub struct IlqlTrainer {
    config: IlqlTrlConfig,
    vs: VarStore,
    model: CausalLmWithIlqlHeads,
    data: IlqlDataset,
    tokenizer: Box<dyn TextTokenizer>,
    loss_config: IlqlConfig,
    opt: AdamW,
    sched: CosineAnnealingLr,
    rng: Generator,
    iter_count: usize,
    epoch: usize,
    evaluation: Evaluation,
    collective: SharedCollective,
}

impl fmt::Debug for IlqlTrainer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IlqlTrainer")
            .field("iter_count", &self.iter_count)
            .field("epoch", &self.epoch)
            .field("samples", &self.data.len())
            .finish_non_exhaustive()
    }
}

impl IlqlTrainer {
    /// A trainer of `model` (whose variables live in `vs`: the trunk, the Q and V heads, and
    /// the frozen target Q-heads) on `data`. Errors on an invalid config, a model whose head
    /// count or Polyak rate differs from the config's, or a tokenizer whose vocabulary is not
    /// the model's.
    pub fn new(
        config: IlqlTrlConfig,
        vs: VarStore,
        model: CausalLmWithIlqlHeads,
        data: IlqlDataset,
        tokenizer: Box<dyn TextTokenizer>,
    ) -> Result<Self> {
        const OP: &str = "IlqlTrainer::new";
        config.validate()?;
        let m = &config.method;
        let heads = model.heads();
        if heads.n_qs() != if m.two_qs { 2 } else { 1 } {
            return Err(Error::config(
                OP,
                "method.two_qs",
                format!("the model's head count ({} Q heads)", heads.n_qs()),
                m.two_qs,
            ));
        }
        if (heads.alpha() - m.alpha).abs() > 1e-12 {
            return Err(Error::config(
                OP,
                "method.alpha",
                format!("the model's Polyak rate {}", heads.alpha()),
                m.alpha,
            ));
        }
        let vocab = model.model().facts().vocab_size;
        check_tokenizer_fits(OP, tokenizer.as_ref(), vocab)?;
        let loss_config = IlqlConfig::new()
            .with_tau(m.tau)
            .with_gamma(m.gamma)
            .with_cql_scale(m.cql_scale)
            .with_awac_scale(m.awac_scale)
            .with_beta(m.beta)
            .with_two_qs(m.two_qs);
        loss_config.validate()?;
        let k = &config.optimizer.kwargs;
        let opt = AdamW::from_var_store(&vs, k.lr)?
            .with_betas(k.betas)
            .with_eps(k.eps)
            .with_weight_decay(k.weight_decay);
        let sched = CosineAnnealingLr::from_kwargs(k.lr, &config.scheduler.kwargs)?;
        let rng = Generator::new(config.train.seed);
        Ok(IlqlTrainer {
            config,
            vs,
            model,
            data,
            tokenizer,
            loss_config,
            opt,
            sched,
            rng,
            iter_count: 0,
            epoch: 0,
            evaluation: Evaluation::default(),
            collective: SharedCollective::default(),
        })
    }

    /// Makes this trainer one rank of a data-parallel group (see the
    /// [module docs](self#data-parallel-ilqltrainerwith_collective)): checks that every rank
    /// has rank 0's schedule and dataset size, and copies rank 0's variables (trunk, Q, V and
    /// target heads) into every rank's. Every rank must call it, with the same dataset.
    ///
    /// # Errors
    /// [`Error::Distributed`] when a rank's schedule or dataset size differs from rank 0's
    /// (naming the fields), or the group fails.
    pub fn with_collective(mut self, collective: impl Collective + 'static) -> Result<Self> {
        let shared = SharedCollective::new(collective);
        let t = &self.config.train;
        let m = &self.config.method;
        let mut fields = vec![("samples", self.data.len() as f64)];
        fields.extend(train_schedule_fields(t));
        fields.extend([
            (
                "method.steps_for_target_q_sync",
                m.steps_for_target_q_sync as f64,
            ),
            ("method.alpha", m.alpha),
        ]);
        let params = self.model_params();
        join_group(
            &shared,
            "IlqlTrainer::with_collective",
            &fields,
            &[&params],
            &mut self.opt,
        )?;
        self.collective = shared;
        Ok(self)
    }

    /// The group this trainer is a rank of ([`SingleProcess`](crate::trainers::parallel::SingleProcess)
    /// unless [`IlqlTrainer::with_collective`] was called).
    pub fn collective(&self) -> &SharedCollective {
        &self.collective
    }

    /// Samples per optimizer step over the whole group: `world_size × train.batch_size`.
    pub fn global_batch_size(&self) -> usize {
        self.config.train.batch_size.max(1) * self.collective.world_size()
    }

    /// Sets what [`RlTrainer::evaluate`] runs (trlX's `eval_prompts`, `reward_fn`,
    /// `metric_fn`): each function receives the decoded responses (special tokens skipped), in
    /// prompt order.
    pub fn with_evaluation(mut self, evaluation: Evaluation) -> Self {
        self.evaluation = evaluation;
        self
    }

    /// The whole config.
    pub fn config(&self) -> &IlqlTrlConfig {
        &self.config
    }

    /// The model being trained.
    pub fn model(&self) -> &CausalLmWithIlqlHeads {
        &self.model
    }

    /// Passes over the dataset finished.
    pub fn epoch(&self) -> usize {
        self.epoch
    }

    /// `min(train.total_steps, epochs · minibatches per epoch)`, a minibatch being
    /// [`IlqlTrainer::global_batch_size`] samples.
    pub fn total_steps(&self) -> usize {
        let per_epoch = self.data.len().div_ceil(self.global_batch_size());
        self.config
            .train
            .epochs
            .saturating_mul(per_epoch)
            .min(self.config.train.total_steps)
    }

    /// One optimizer step on a collated batch (the dataset's layout); syncs the targets when
    /// due. Returns the step's statistics. In a data-parallel group every rank calls it with
    /// its own batch, and the step and the statistics are those of one process on all of them
    /// (see the [module docs](self#data-parallel-ilqltrainerwith_collective)).
    ///
    /// # Errors
    /// On a batch of another layout, or a failing forward / backward or group.
    pub fn train_step(&mut self, batch: &TensorDict) -> Result<Stats> {
        self.train_step_weighted(batch, true)
    }

    /// [`IlqlTrainer::train_step`]; with `counts = false` the batch is a stand-in forwarded
    /// with weight 0 (a rank with no samples in a step's short tail still joins the sums).
    fn train_step_weighted(&mut self, batch: &TensorDict, counts: bool) -> Result<Stats> {
        let loss = IlqlLoss::new(&self.model).with_config(self.loss_config.clone())?;
        let out = loss.forward(batch)?;
        let mut stats: Stats = out
            .loss_terms()
            .into_iter()
            .chain(out.metrics())
            .map(|(k, v)| (k.to_string(), v.double_value(&[])))
            .collect();
        stats.insert("loss".into(), out.loss.double_value(&[]));
        let weight = if self.collective.world_size() > 1 {
            let actions = if counts {
                real_actions(batch, loss.tensor_keys())?
            } else {
                0.0
            };
            let (w, global) = self.global_stats(actions, &stats)?;
            stats = global;
            w
        } else {
            1.0
        };
        let total = if weight == 1.0 {
            out.loss.shallow_clone()
        } else {
            out.loss.f_mul_scalar(weight)?
        };
        let c = self.collective.clone();
        let norm =
            self.opt
                .backward_step_with(&total, self.config.train.max_grad_norm, |params| {
                    c.all_reduce_sum_gradients(params)
                })?;
        let lr = self.sched.step();
        self.opt.set_lr(lr);
        self.iter_count += 1;
        if self
            .iter_count
            .is_multiple_of(self.config.method.steps_for_target_q_sync)
        {
            self.model.heads().sync_target_q_heads()?;
        }
        stats.insert("lr".into(), lr);
        if let Some(n) = norm {
            stats.insert("grad_norm".into(), n);
        }
        Ok(stats)
    }

    /// One all-reduce: this rank's share of the step's real actions (its loss weight) and the
    /// global batch's statistics (action-weighted means; `awac_weight_max` the largest over
    /// the ranks with actions; `n_actions` the global count).
    fn global_stats(&self, actions: f64, stats: &Stats) -> Result<(f64, Stats)> {
        let c = &self.collective;
        let (world, rank) = (c.world_size(), c.rank());
        let names: Vec<&String> = stats.keys().collect();
        // [actions, actions·stat for each stat, one slot per rank for awac_weight_max]
        let mut local = Vec::with_capacity(1 + names.len() + world);
        local.push(actions);
        local.extend(stats.values().map(|v| v * actions));
        let max = stats.get("awac_weight_max").copied().unwrap_or(0.0);
        local.extend((0..world).map(|r| if r == rank && actions > 0.0 { max } else { 0.0 }));
        let sums = c.sum_scalars(&local)?;
        let n = sums.first().copied().unwrap_or(0.0);
        let mut global = Stats::new();
        for (name, v) in names.iter().zip(sums.iter().skip(1)) {
            global.insert((*name).clone(), if n > 0.0 { v / n } else { 0.0 });
        }
        let maxes = sums.iter().skip(1 + names.len());
        global.insert("awac_weight_max".into(), maxes.copied().fold(0.0, f64::max));
        global.insert("n_actions".into(), n.max(1.0));
        Ok((if n > 0.0 { actions / n } else { 0.0 }, global))
    }

    /// One pass over the dataset; returns the mean of the step statistics.
    pub fn train_epoch(&mut self, callbacks: &mut Callbacks<'_>) -> Result<Stats> {
        let total = self.total_steps();
        let global = self.global_batch_size();
        let mbs = self.data.shuffled_indices(global, &mut self.rng)?;
        let order = rank0_order(&self.collective, mbs.concat())?;
        let per_rank = self.config.train.batch_size.max(1);
        let rank = self.collective.rank();
        let mut sums = Stats::new();
        let mut steps = 0usize;
        for idx in order.chunks(global) {
            if self.iter_count >= total {
                break;
            }
            let (mine, local) = rank_slice(idx, rank, per_rank);
            let batch = self.data.batch(mine)?;
            let stats = self.train_step_weighted(&batch, local > 0)?;
            for (k, v) in &stats {
                *sums.entry(k.clone()).or_insert(0.0) += v;
            }
            steps += 1;
            let last = self.iter_count >= total;
            self.after_step(self.iter_count - 1, &stats, last, callbacks)?;
        }
        self.epoch += 1;
        for v in sums.values_mut() {
            *v /= steps.max(1) as f64;
        }
        Ok(sums)
    }

    /// Generates one response per prompt with β-shaped scores at `beta` (the other settings
    /// from `gen_kwargs`), decoded with special tokens skipped.
    pub fn generate(&mut self, prompts: &[String], beta: f64) -> Result<Vec<String>> {
        const OP: &str = "IlqlTrainer::generate";
        if prompts.is_empty() {
            return Ok(Vec::new());
        }
        let eos = self.tokenizer.eos_token_id();
        let pad = self.tokenizer.pad_token_id().or(eos).unwrap_or(0);
        let enc = encode_prompts(OP, self.tokenizer.as_ref(), prompts, pad)?;
        let device = self.model.model().device();
        let g = &self.config.method.gen_kwargs;
        let mut gen = IlqlGenerationConfig::new(g.max_new_tokens as i64)
            .with_beta(beta)
            .with_top_k(g.top_k as i64)
            .with_temperature(g.temperature);
        gen.eos_token_id = eos;
        gen.pad_token_id = Some(pad);
        let out = ilql_generate(
            &self.model,
            &enc.input_ids.f_to_device(device)?,
            Some(&enc.attention_mask.f_to_device(device)?),
            &gen,
            &mut self.rng,
        )?;
        decode_masked(self.tokenizer.as_ref(), &out.response, &out.response_mask)
    }

    /// trlX's evaluation sweep: one report per β of `gen_kwargs.beta`, in order.
    pub fn evaluate_sweep(&mut self) -> Result<Vec<(f64, EvalReport)>> {
        let betas = self.config.method.gen_kwargs.beta.values();
        let prompts = self.evaluation.prompts.clone();
        let mut out = Vec::with_capacity(betas.len());
        for beta in betas {
            let samples = self.generate(&prompts, beta)?;
            let report = self.evaluation.report(samples)?;
            out.push((beta, report));
        }
        Ok(out)
    }

    /// Every variable of the model: the trunk, the Q and V heads (`vs`) and the frozen target
    /// Q heads (their own store, `target_q_heads.*`), sorted by name.
    fn model_params(&self) -> Vec<(String, Tensor)> {
        let mut named: Vec<(String, Tensor)> = self.vs.variables().into_iter().collect();
        named.extend(self.model.heads().target_store().variables());
        named.sort_by(|a, b| a.0.cmp(&b.0));
        named
    }
}

/// The real actions of a batch: `continues[:, :A] != 0` counted, `A` the width of
/// `actions_ixs` (the `m` every ILQL term is a mean over).
fn real_actions(batch: &TensorDict, keys: &crate::objectives::llm::IlqlKeys) -> Result<f64> {
    let a = batch
        .get_or_err(&keys.actions_ixs)?
        .size()
        .get(1)
        .copied()
        .unwrap_or(0);
    let cont = batch.get_or_err(&keys.continues)?;
    Ok(cont
        .f_narrow(1, 0, a)?
        .f_ne(0)?
        .f_sum(tch::Kind::Double)?
        .f_double_value(&[])?)
}

impl RlTrainer for IlqlTrainer {
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

    /// Runs the model's ILQL forward on a batch of the dataset's layout and returns it with
    /// the logits `[B, T, V]` under `"logits"`, each head's Q and target Q `[B, A, V]` under
    /// `"q1"`, `"target_q1"` (and `"q2"`, `"target_q2"`), and V `[B, S, 1]` under `"vs"`.
    fn act(&mut self, data: &TensorDict) -> Result<TensorDict> {
        let _guard = tch::no_grad_guard();
        let keys = crate::objectives::llm::IlqlKeys::default();
        let out = self.model.ilql_forward(
            data.get_or_err(&keys.tokens)?,
            data.get_or_err(&keys.attention_mask)?,
            data.get_or_err(&keys.actions_ixs)?,
            data.get_or_err(&keys.states_ixs)?,
        )?;
        let mut td = data.clone();
        td.set("logits", out.logits)?;
        td.set("vs", out.heads.vs)?;
        // one key per head, batch-leading: "q1", "q2", "target_q1", "target_q2"
        for (i, (q, t)) in out
            .heads
            .qs
            .into_iter()
            .zip(out.heads.target_qs)
            .enumerate()
        {
            td.set(format!("q{}", i + 1).as_str(), q)?;
            td.set(format!("target_q{}", i + 1).as_str(), t)?;
        }
        Ok(td)
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
        let beta = self
            .config
            .method
            .gen_kwargs
            .beta
            .values()
            .first()
            .copied()
            .unwrap_or(1.0);
        let saved = self.config.method.gen_kwargs.max_new_tokens;
        self.config.method.gen_kwargs.max_new_tokens = length.max(1);
        let out = self.generate(&repeated, beta);
        self.config.method.gen_kwargs.max_new_tokens = saved;
        out
    }

    fn learn(&mut self, callbacks: &mut Callbacks<'_>) -> Result<()> {
        let total = self.total_steps();
        while self.iter_count < total && self.epoch < self.config.train.epochs {
            self.train_epoch(callbacks)?;
        }
        Ok(())
    }

    fn evaluate(&mut self) -> Result<EvalReport> {
        if self.evaluation.prompts.is_empty() {
            return Ok(EvalReport::default());
        }
        let sweep = self.evaluate_sweep()?;
        let mut first: Option<EvalReport> = None;
        let mut extra = Vec::new();
        for (beta, report) in sweep {
            if let Some(m) = report.mean_reward {
                extra.push((format!("reward@beta={beta}"), m));
            }
            if first.is_none() {
                first = Some(report);
            }
        }
        let mut report = first.unwrap_or_default();
        report.metrics.extend(extra);
        Ok(report)
    }

    fn get_components(&self) -> Vec<(String, Component)> {
        vec![
            ("model".to_string(), Component::tensors(self.model_params())),
            ("opt".to_string(), Component::from_adamw(&self.opt)),
            (
                "scheduler".to_string(),
                Component::from_scheduler(&self.sched),
            ),
            (
                "trainer".to_string(),
                Component::json(json!({
                    "iter_count": self.iter_count,
                    "epoch": self.epoch,
                    "rng": rng_to_json(&self.rng),
                })),
            ),
            (
                "config".to_string(),
                Component::json(serde_json::to_value(&self.config).unwrap_or(Value::Null)),
            ),
        ]
    }

    /// All or nothing: every component and the trainer's counters and generator are read
    /// and checked (tensors converted) before anything is written; after an `Err` the
    /// trainer is as it was.
    fn set_components(&mut self, mut components: Vec<(String, Component)>) -> Result<()> {
        const OP: &str = "IlqlTrainer::load";
        let named = |name: &'static str| move |e| in_component(name, e);
        let model = take_component(&mut components, "model")?
            .stage_into(&self.model_params())
            .map_err(named("model"))?;
        let opt = take_component(&mut components, "opt")?;
        let opt = self
            .opt
            .prepare_state(&opt.tensors, &opt.state)
            .map_err(named("opt"))?;
        let sched = take_component(&mut components, "scheduler")?;
        let sched = CosineAnnealingLr::from_state_json(&sched.state).map_err(named("scheduler"))?;
        let state = take_component(&mut components, "trainer")?.state;
        let read_state = || -> Result<_> {
            let iter_count = counter_from_json(OP, &state, "iter_count")?;
            let epoch = counter_from_json(OP, &state, "epoch")?;
            let rng = rng_from_json(OP, state.get("rng"))?;
            Ok((iter_count, epoch, rng))
        };
        let (iter_count, epoch, rng) = read_state().map_err(named("trainer"))?;
        model.commit()?;
        self.opt.commit_state(opt)?;
        self.sched = sched;
        self.opt.set_lr(self.sched.lr());
        self.iter_count = iter_count;
        self.epoch = epoch;
        self.rng = rng;
        Ok(())
    }
}
