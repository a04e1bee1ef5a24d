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
    ilql_generate, CausalLmWithIlqlHeads, IlqlGenerationConfig, TextTokenizer,
};
use crate::objectives::llm::{IlqlConfig, IlqlLoss};
use crate::objectives::{LossModule, LossOutput};
use crate::rng::Generator;
use crate::tensordict::TensorDict;
use crate::trainers::api::{
    decode_masked, encode_prompts, rng_from_json, rng_to_json, take_component, Callbacks,
    Component, EvalReport, Evaluation, RlTrainer, Stats,
};
use crate::trainers::config::TrainConfig;
use crate::trainers::optim::{AdamW, CosineAnnealingLr};

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
        let vocab = model.model().config().vocab_size;
        if tokenizer.vocab_size() != vocab {
            return Err(Error::argument(
                OP,
                "tokenizer",
                format!("the model's vocabulary size {vocab}"),
                format!("vocabulary size {}", tokenizer.vocab_size()),
            ));
        }
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

    /// `min(train.total_steps, epochs · minibatches per epoch)`.
    pub fn total_steps(&self) -> usize {
        let per_epoch = self
            .data
            .len()
            .div_ceil(self.config.train.batch_size.max(1));
        self.config
            .train
            .epochs
            .saturating_mul(per_epoch)
            .min(self.config.train.total_steps)
    }

    /// One optimizer step on a collated batch (the dataset's layout); syncs the targets when
    /// due. Returns the step's statistics.
    pub fn train_step(&mut self, batch: &TensorDict) -> Result<Stats> {
        let loss = IlqlLoss::new(&self.model).with_config(self.loss_config.clone())?;
        let out = loss.forward(batch)?;
        let norm = self
            .opt
            .backward_step(&out.loss, self.config.train.max_grad_norm)?;
        let lr = self.sched.step();
        self.opt.set_lr(lr);
        self.iter_count += 1;
        if self
            .iter_count
            .is_multiple_of(self.config.method.steps_for_target_q_sync)
        {
            self.model.heads().sync_target_q_heads()?;
        }
        let mut stats: Stats = out
            .loss_terms()
            .into_iter()
            .chain(out.metrics())
            .map(|(k, v)| (k.to_string(), v.double_value(&[])))
            .collect();
        stats.insert("loss".into(), out.loss.double_value(&[]));
        stats.insert("lr".into(), lr);
        if let Some(n) = norm {
            stats.insert("grad_norm".into(), n);
        }
        Ok(stats)
    }

    /// One pass over the dataset; returns the mean of the step statistics.
    pub fn train_epoch(&mut self, callbacks: &mut Callbacks<'_>) -> Result<Stats> {
        let total = self.total_steps();
        let mbs = self
            .data
            .shuffled_indices(self.config.train.batch_size, &mut self.rng)?;
        let mut sums = Stats::new();
        let mut steps = 0usize;
        for idx in mbs {
            if self.iter_count >= total {
                break;
            }
            let batch = self.data.batch(&idx)?;
            let stats = self.train_step(&batch)?;
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

    fn model_params(&self) -> Vec<(String, Tensor)> {
        let mut named: Vec<(String, Tensor)> = self.vs.variables().into_iter().collect();
        named.sort_by(|a, b| a.0.cmp(&b.0));
        named
    }
}

impl RlTrainer for IlqlTrainer {
    fn train_config(&self) -> &TrainConfig {
        &self.config.train
    }

    fn iter_count(&self) -> usize {
        self.iter_count
    }

    /// Runs the model's ILQL forward on a batch of the dataset's layout and returns it with
    /// the logits `[B, T, V]` under `"logits"`, each head's Q and target Q `[B, A, V]` under
    /// `"q1"`, `"target_q1"` (and `"q2"`, `"target_q2"`), and V `[B, S, 1]` under `"vs"`.
    fn act(&mut self, data: &TensorDict) -> Result<TensorDict> {
        use crate::objectives::llm::IlqlModel;
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

    fn set_components(&mut self, mut components: Vec<(String, Component)>) -> Result<()> {
        const OP: &str = "IlqlTrainer::load";
        take_component(&mut components, "model")?.copy_into(&self.model_params())?;
        let opt = take_component(&mut components, "opt")?;
        self.opt.load_state(&opt.tensors, &opt.state)?;
        let sched = take_component(&mut components, "scheduler")?;
        self.sched = CosineAnnealingLr::from_state_json(&sched.state)?;
        self.opt.set_lr(self.sched.lr());
        let state = take_component(&mut components, "trainer")?.state;
        let count = |name: &str| {
            state
                .get(name)
                .and_then(Value::as_u64)
                .map(|v| v as usize)
                .ok_or_else(|| {
                    Error::value(
                        OP,
                        "trainer state",
                        format!("{name} as an integer"),
                        state.to_string(),
                    )
                })
        };
        self.iter_count = count("iter_count")?;
        self.epoch = count("epoch")?;
        self.rng = rng_from_json(OP, state.get("rng"))?;
        Ok(())
    }
}
