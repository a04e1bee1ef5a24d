//! DPO as a configuration of the trainer API: preference optimisation without a reward
//! model, in the shape of TRL's `DPOTrainer` (rlhf.md §3.4), on the hydra model's frozen
//! reference and [`DpoLoss`].
//!
//! # Data
//! [`DpoPair`]s: a prompt and two completions of it, the preferred (`chosen`) and the other
//! (`rejected`) — TRL's `prompt` / `chosen` / `rejected` columns, as token ids.
//! [`collate_dpo_pairs`] lays a batch out as [`DpoLoss`] reads it: sub-tensordicts `"chosen"`
//! and `"rejected"`, each with `"input_ids"` (prompt + completion, left-padded),
//! `"attention_mask"` and `"completion_mask"` (1 on the completion's tokens).
//!
//! # One optimizer step ([`DpoTrainer::step`])
//! The reference's sequence log-probs of both sides come from the frozen branch of the hydra
//! model under no-grad — per batch, or once for the whole dataset when
//! `precompute_ref_log_probs` is set (TRL's option) — then [`DpoLoss`] runs the policy on both
//! sides with gradient and returns the loss and TRL's logged rewards; global gradient-norm
//! clipping, AdamW and the schedule follow. An epoch is one shuffled pass over the pairs in
//! batches of `train.batch_size`.
//!
//! # Defaults
//! [`DpoTrlConfig::default`] is TRL 1.16's `DPOConfig`: `beta = 0.1`,
//! `loss_type = "sigmoid"`, `label_smoothing = 0`, `precompute_ref_log_probs = false`, 3
//! epochs, a batch of 8 pairs, AdamW with lr 1e-6, betas (0.9, 0.999), no weight decay,
//! `max_grad_norm = 1`, seed 42, every layer trained (the reference is then a full frozen
//! copy, TRL's `ref_model`). As for GRPO, the rate is constant where TRL decays it linearly
//! ([`super::grpo`]'s docs say how to decay it).
//!
//! # Data-parallel ([`DpoTrainer::with_collective`])
//! As TRL under `accelerate`: `train.batch_size` is the per-process batch
//! (`per_device_train_batch_size`), a step takes `world_size × batch_size` pairs of one
//! shuffled order (rank 0's, broadcast each epoch) and rank `r` forwards the `r`-th slice; each
//! rank weights its mean loss by its share of the step's pairs and the gradients are summed,
//! so the step is one process's on the whole global batch (clipped global norm, identical
//! AdamW steps). Logged statistics are the global batch's; logging, evaluation and checkpoints
//! run on rank 0 ([`RlTrainer::is_main_process`]). Every rank holds the same pairs.
//!
//! # Logged statistics
//! Per step, TRL's names: `loss`, `rewards/chosen`, `rewards/rejected`,
//! `rewards/accuracies`, `rewards/margins`, `logps/chosen`, `logps/rejected`, `lr`,
//! `grad_norm`. [`DpoTrainer::evaluate_pairs`] gives the same (without `lr` / `grad_norm`) on
//! held-out pairs, and [`RlTrainer::evaluate`] scores samples of the evaluation prompts.
//!
//! ```
//! use torchrl::objectives::llm::DpoLossType;
//! use torchrl::trainers::dpo::{collate_dpo_pairs, DpoPair, DpoTrlConfig};
//! # fn main() -> torchrl::Result<()> {
//! let cfg = DpoTrlConfig::from_toml_str("[method]\nloss_type = \"ipo\"\nbeta = 0.5")?;
//! assert_eq!(cfg.method.loss_type, DpoLossType::Ipo);
//! assert_eq!((cfg.train.epochs, cfg.train.batch_size), (3, 8)); // TRL's
//! assert!(DpoTrlConfig::from_toml_str("[method]\nloss_type = \"nca\"").is_err());
//! let pairs = [
//!     DpoPair::new(vec![5, 6], vec![7], vec![8, 9]),
//!     DpoPair::new(vec![5], vec![7], vec![8]),
//! ];
//! // Each side is left-padded to its own longest row.
//! let td = collate_dpo_pairs(&pairs, 0, tch::Device::Cpu)?;
//! let ids = td.get_or_err(("rejected", "input_ids"))?;
//! assert_eq!(Vec::<i64>::try_from(ids.view([-1]))?, vec![5, 6, 8, 9, 0, 0, 5, 8]);
//! let attn = td.get_or_err(("chosen", "attention_mask"))?;
//! assert_eq!(Vec::<i64>::try_from(attn.view([-1]))?, vec![1, 1, 1, 0, 1, 1]);
//! let mask = td.get_or_err(("chosen", "completion_mask"))?;
//! assert_eq!(Vec::<i64>::try_from(mask.view([-1]))?, vec![0, 0, 1, 0, 0, 1]);
//! # Ok(()) }
//! ```

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{json, Value};
use tch::{Device, Kind, Tensor};

use super::api::{
    counter_from_json, in_component, rng_from_json, rng_to_json, Callbacks, Component, EvalReport,
    Evaluation, RlTrainer, Stats,
};
use super::config::{validate_gen, GenKwargs, MethodConfig, TrainConfig, TrlConfigOf};
use super::grpo::trl_defaults;
use super::optim::{AdamW, CosineAnnealingLr};
use super::parallel::{
    join_group, rank0_order, rank_slice, train_schedule_fields, Collective, SharedCollective,
};
use super::rollout::{
    generate_text, hydra_components, hydra_policy_step, policy_params, prepare_hydra_components,
    prompt_batch, reference_params, sample_prompts, shuffled, trainable_params, PolicyStep,
};
use crate::error::{Error, Result};
use crate::modules::llm::{
    check_tokenizer_fits, pad_rows, CachedTrunk, CausalLm, CausalLmWithHydraValueHead,
    CausalLmWithValueHead, GenerationConfig, HydraReference, PaddingSide, ScoreRequest,
    ScoreTokens, TextTokenizer, TokenScores,
};
use crate::objectives::llm::{sequence_log_probs, DpoConfig, DpoLoss, DpoLossOutput, DpoLossType};
use crate::objectives::{LossModule, LossOutput};
use crate::rng::Generator;
use crate::tensordict::TensorDict;

const OP: &str = "DpoTrainer";

// ------------------------------------------------------------------------------ config

/// The DPO method section, with TRL's `DPOConfig` names and defaults.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DpoMethodConfig {
    /// The method's name. Default `"DPOConfig"`.
    pub name: String,
    /// β, > 0. Default 0.1.
    pub beta: f64,
    /// TRL's `loss_type`: `"sigmoid"` (default), `"robust"`, `"hinge"` or `"ipo"`.
    #[serde(serialize_with = "ser_loss_type", deserialize_with = "de_loss_type")]
    pub loss_type: DpoLossType,
    /// Label smoothing ε (`sigmoid`'s cDPO form, `robust`). Default 0.
    pub label_smoothing: f64,
    /// Compute the reference's log-probs of every pair once, before training (TRL's option).
    /// Default `false`: per batch.
    pub precompute_ref_log_probs: bool,
    /// Generation for [`RlTrainer::evaluate`]'s samples (TRL's trainer does not generate):
    /// sampling at temperature 1, 40 new tokens by default.
    pub gen_kwargs: GenKwargs,
}

fn ser_loss_type<S: Serializer>(t: &DpoLossType, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_str(&t.to_string())
}

fn de_loss_type<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<DpoLossType, D::Error> {
    let name = String::deserialize(d)?;
    DpoLossType::from_str(&name).map_err(serde::de::Error::custom)
}

impl Default for DpoMethodConfig {
    fn default() -> Self {
        DpoMethodConfig {
            name: "DPOConfig".into(),
            beta: 0.1,
            loss_type: DpoLossType::Sigmoid,
            label_smoothing: 0.0,
            precompute_ref_log_probs: false,
            gen_kwargs: GenKwargs::default(),
        }
    }
}

impl DpoMethodConfig {
    /// The [`DpoConfig`] of the loss.
    pub fn loss_config(&self) -> DpoConfig {
        DpoConfig::new()
            .with_beta(self.beta)
            .with_loss_type(self.loss_type)
            .with_label_smoothing(self.label_smoothing)
    }
}

impl MethodConfig for DpoMethodConfig {
    fn default_config() -> TrlConfigOf<Self> {
        let mut cfg = trl_defaults("DPOTrainer", DpoMethodConfig::default());
        cfg.train.epochs = 3;
        cfg
    }

    fn validate(&self) -> Result<()> {
        self.loss_config().validate().map_err(|e| match e {
            Error::InvalidConfig {
                field,
                expected,
                got,
                ..
            } => Error::InvalidConfig {
                op: "TrlConfig::validate",
                field: match field {
                    "beta" => "method.beta",
                    "label_smoothing" => "method.label_smoothing",
                    other => other,
                },
                expected,
                got,
            },
            other => other,
        })?;
        validate_gen(
            &self.gen_kwargs,
            [
                "method.gen_kwargs.max_new_tokens",
                "method.gen_kwargs.top_p",
                "method.gen_kwargs.temperature",
            ],
        )
    }
}

/// The whole DPO config, TRL's defaults.
pub type DpoTrlConfig = TrlConfigOf<DpoMethodConfig>;

impl DpoTrlConfig {
    /// Optimizer steps in one epoch over `pairs` pairs: `ceil(pairs / batch_size)`.
    pub fn steps_per_epoch(&self, pairs: usize) -> usize {
        pairs.div_ceil(self.train.batch_size.max(1))
    }
}

// ------------------------------------------------------------------------------ data

/// One preference: a prompt and two completions of it (token ids, without the prompt).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DpoPair {
    /// The prompt.
    pub prompt: Vec<i64>,
    /// The preferred completion.
    pub chosen: Vec<i64>,
    /// The other completion.
    pub rejected: Vec<i64>,
}

impl DpoPair {
    /// A pair.
    pub fn new(prompt: Vec<i64>, chosen: Vec<i64>, rejected: Vec<i64>) -> Self {
        DpoPair {
            prompt,
            chosen,
            rejected,
        }
    }
}

/// Collates `pairs` into [`DpoLoss`]'s layout (the [module docs](self)) on `device`,
/// left-padded with `pad`.
///
/// # Errors
/// On an empty list, an empty prompt or an empty completion (naming the pair).
pub fn collate_dpo_pairs(pairs: &[DpoPair], pad: i64, device: Device) -> Result<TensorDict> {
    const OP: &str = "collate_dpo_pairs";
    if pairs.is_empty() {
        return Err(Error::value(OP, "pairs", "at least one pair", "0 pairs"));
    }
    for (i, p) in pairs.iter().enumerate() {
        for (what, row) in [
            ("prompt", &p.prompt),
            ("chosen", &p.chosen),
            ("rejected", &p.rejected),
        ] {
            if row.is_empty() {
                return Err(Error::value(
                    OP,
                    format!("pairs[{i}].{what}"),
                    "at least one token",
                    "an empty row",
                ));
            }
        }
    }
    let mut td = TensorDict::new([pairs.len() as i64])?.with_device(device)?;
    for side in ["chosen", "rejected"] {
        let completion = |p: &DpoPair| {
            if side == "chosen" {
                p.chosen.clone()
            } else {
                p.rejected.clone()
            }
        };
        let rows: Vec<Vec<i64>> = pairs
            .iter()
            .map(|p| [p.prompt.clone(), completion(p)].concat())
            .collect();
        let marks: Vec<Vec<i64>> = pairs
            .iter()
            .map(|p| {
                std::iter::repeat_n(0i64, p.prompt.len())
                    .chain(std::iter::repeat_n(1, completion(p).len()))
                    .collect()
            })
            .collect();
        let enc = pad_rows(&rows, pad, PaddingSide::Left)?;
        let completion_mask = pad_rows(&marks, 0, PaddingSide::Left)?.input_ids;
        td.set((side, "input_ids"), enc.input_ids.f_to_device(device)?)?;
        td.set(
            (side, "attention_mask"),
            enc.attention_mask.f_to_device(device)?,
        )?;
        td.set(
            (side, "completion_mask"),
            completion_mask.f_to_device(device)?,
        )?;
    }
    Ok(td)
}

// ------------------------------------------------------------------------------ trainer

/// A DPO trainer (see the [module docs](self)).
pub struct DpoTrainer {
    config: DpoTrlConfig,
    model: CausalLmWithHydraValueHead,
    tokenizer: Box<dyn TextTokenizer>,
    pairs: Vec<DpoPair>,
    /// The reference's `(chosen, rejected)` sequence log-probs of each pair, when
    /// precomputed.
    ref_cache: Option<Vec<(f64, f64)>>,
    loss_config: DpoConfig,
    gen: GenerationConfig,
    opt: AdamW,
    sched: CosineAnnealingLr,
    rng: Generator,
    iter_count: usize,
    epoch: usize,
    evaluation: Evaluation,
    history: Vec<Stats>,
    collective: SharedCollective,
}

impl fmt::Debug for DpoTrainer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DpoTrainer")
            .field("pairs", &self.pairs.len())
            .field("iter_count", &self.iter_count)
            .field("epoch", &self.epoch)
            .field("loss", &self.loss_config)
            .finish_non_exhaustive()
    }
}

impl DpoTrainer {
    /// A trainer of `model`'s policy on `pairs`, with `config` (validated); the model's frozen
    /// reference branch is DPO's reference. Errors on an invalid config, no pairs, a pair with
    /// an empty row, ids outside the model's vocabulary, a row longer than its context, or a
    /// tokenizer of another vocabulary.
    pub fn new(
        config: DpoTrlConfig,
        model: CausalLmWithHydraValueHead,
        pairs: Vec<DpoPair>,
        tokenizer: Box<dyn TextTokenizer>,
    ) -> Result<Self> {
        config.validate()?;
        let mc = model.policy().model().facts().clone();
        check_tokenizer_fits(OP, tokenizer.as_ref(), mc.vocab_size)?;
        check_pairs(&pairs, mc.vocab_size, mc.max_positions)?;
        let kw = &config.method.gen_kwargs;
        let mut gen = GenerationConfig::rlhf_sampling(kw.max_new_tokens as i64);
        gen.do_sample = kw.do_sample;
        gen.temperature = kw.temperature;
        gen.top_k = kw.top_k as i64;
        gen.top_p = kw.top_p;
        gen.eos_token_id = mc.eos_token_id;
        gen.pad_token_id = Some(mc.pad_token_id.or(mc.eos_token_id).unwrap_or(0));
        let loss_config = config.method.loss_config();
        let opt = AdamW::from_kwargs(trainable_params(&model, false), &config.optimizer.kwargs)?;
        let sched =
            CosineAnnealingLr::from_kwargs(config.optimizer.kwargs.lr, &config.scheduler.kwargs)?;
        let mut trainer = DpoTrainer {
            rng: Generator::new(config.train.seed),
            config,
            model,
            tokenizer,
            pairs,
            ref_cache: None,
            loss_config,
            gen,
            opt,
            sched,
            iter_count: 0,
            epoch: 0,
            evaluation: Evaluation::default(),
            history: Vec::new(),
            collective: SharedCollective::default(),
        };
        if trainer.config.method.precompute_ref_log_probs {
            trainer.precompute_reference()?;
        }
        Ok(trainer)
    }

    /// Sets what [`RlTrainer::evaluate`] runs.
    pub fn with_evaluation(mut self, evaluation: Evaluation) -> Self {
        self.evaluation = evaluation;
        self
    }

    /// Makes this trainer one rank of a data-parallel group (see the
    /// [module docs](self#data-parallel-dpotrainerwith_collective)): checks that every rank
    /// has rank 0's schedule and pair count, copies rank 0's policy and reference parameters to
    /// every rank (and recomputes precomputed reference log-probs from them). Every rank must
    /// call it, with the same pairs.
    ///
    /// ```
    /// # use tch::nn::VarStore;
    /// # use torchrl::modules::llm::{ByteTokenizer, CausalLmWithHydraValueHead, Gpt2Config, TextTokenizer};
    /// # use torchrl::trainers::dpo::{DpoPair, DpoTrainer, DpoTrlConfig};
    /// use torchrl::trainers::parallel::{Collective, SingleProcess};
    /// # fn main() -> torchrl::Result<()> {
    /// # let tok = ByteTokenizer::new();
    /// # let gpt = Gpt2Config::new(tok.vocab_size()).with_n_positions(16).with_n_embd(8)
    /// #     .with_n_layer(1).with_n_head(2)
    /// #     .with_special_tokens(tok.bos_token_id(), tok.eos_token_id(), tok.pad_token_id());
    /// # let vs = VarStore::new(tch::Device::Cpu);
    /// # let model = CausalLmWithHydraValueHead::new(&vs.root(), &gpt, 1)?;
    /// let pairs = vec![DpoPair::new(vec![97], vec![98], vec![99]); 3];
    /// // Under torchrl-launch: `.with_collective(ProcessGroup::init_from_env()?)`
    /// // (cargo feature `distributed`); a world of one runs anywhere.
    /// let trainer = DpoTrainer::new(DpoTrlConfig::default(), model, pairs, Box::new(tok))?
    ///     .with_collective(SingleProcess)?;
    /// assert_eq!(trainer.collective().world_size(), 1);
    /// assert_eq!(trainer.total_steps(), 3); // 3 epochs of one batch of 8 pairs
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::Distributed`] when a rank's schedule or pair count differs from rank 0's
    /// (naming the fields), or the group fails.
    pub fn with_collective(mut self, collective: impl Collective + 'static) -> Result<Self> {
        let shared = SharedCollective::new(collective);
        let t = &self.config.train;
        let m = &self.config.method;
        let mut fields = vec![("pairs", self.pairs.len() as f64)];
        fields.extend(train_schedule_fields(t));
        fields.push((
            "method.precompute_ref_log_probs",
            f64::from(u8::from(m.precompute_ref_log_probs)),
        ));
        let params = [policy_params(&self.model), reference_params(&self.model)];
        let params: Vec<&[(String, Tensor)]> = params.iter().map(Vec::as_slice).collect();
        join_group(
            &shared,
            "DpoTrainer::with_collective",
            &fields,
            &params,
            &mut self.opt,
        )?;
        self.collective = shared;
        if self.config.method.precompute_ref_log_probs {
            self.precompute_reference()?;
        }
        Ok(self)
    }

    /// The group this trainer is a rank of ([`SingleProcess`](super::parallel::SingleProcess)
    /// unless [`DpoTrainer::with_collective`] was called).
    pub fn collective(&self) -> &SharedCollective {
        &self.collective
    }

    /// Pairs per optimizer step over the whole group: `world_size × train.batch_size`.
    pub fn global_batch_size(&self) -> usize {
        self.config.train.batch_size.max(1) * self.collective.world_size()
    }

    /// The whole config.
    pub fn config(&self) -> &DpoTrlConfig {
        &self.config
    }

    /// The model (policy, unused value head, frozen reference).
    pub fn model(&self) -> &CausalLmWithHydraValueHead {
        &self.model
    }

    /// Epochs finished, counting those of a loaded checkpoint.
    pub fn epoch(&self) -> usize {
        self.epoch
    }

    /// The mean step statistics of each finished epoch.
    pub fn history(&self) -> &[Stats] {
        &self.history
    }

    /// The step budget: `min(train.total_steps, epochs · steps per epoch)`, an epoch being
    /// `ceil(pairs / global_batch_size)` steps ([`DpoTrlConfig::steps_per_epoch`] in one
    /// process).
    pub fn total_steps(&self) -> usize {
        self.config
            .train
            .epochs
            .saturating_mul(self.pairs.len().div_ceil(self.global_batch_size()))
            .min(self.config.train.total_steps)
    }

    fn pad(&self) -> i64 {
        let mc = self.model.policy().model().facts();
        mc.pad_token_id.or(mc.eos_token_id).unwrap_or(0)
    }

    fn device(&self) -> Device {
        self.model.policy().model().device()
    }

    /// The reference's sequence log-probs of both sides of a collated batch, `[B]` each, and
    /// each side's frozen-trunk output (with a branch reference; the policy's forward on the
    /// side continues from it, see [`SidePolicy`]).
    fn reference_log_probs(&self, td: &TensorDict) -> Result<(Tensor, Tensor, Vec<SideTrunk>)> {
        let reference = HydraReference::new(&self.model);
        let mut trunks = Vec::with_capacity(2);
        let mut side = |s: &str| -> Result<Tensor> {
            let tokens = td.get_or_err((s, "input_ids"))?;
            let mask = td.get_or_err((s, "attention_mask"))?;
            let (lp, trunk) = reference.log_probs_and_trunk(tokens, mask)?;
            if let Some(hidden) = trunk {
                trunks.push(SideTrunk {
                    tokens: tokens.shallow_clone(),
                    mask: mask.shallow_clone(),
                    hidden,
                });
            }
            Ok(sequence_log_probs(&lp, td.get_or_err((s, "completion_mask"))?)?.0)
        };
        let chosen = side("chosen")?;
        let rejected = side("rejected")?;
        Ok((chosen, rejected, trunks))
    }

    fn precompute_reference(&mut self) -> Result<()> {
        let mb = self.config.train.batch_size.max(1);
        let mut cache = Vec::with_capacity(self.pairs.len());
        for chunk in self.pairs.chunks(mb) {
            let td = collate_dpo_pairs(chunk, self.pad(), self.device())?;
            let (c, r, _) = self.reference_log_probs(&td)?;
            let c = Vec::<f64>::try_from(c.f_to_kind(Kind::Double)?.f_to_device(Device::Cpu)?)?;
            let r = Vec::<f64>::try_from(r.f_to_kind(Kind::Double)?.f_to_device(Device::Cpu)?)?;
            cache.extend(c.into_iter().zip(r));
        }
        self.ref_cache = Some(cache);
        Ok(())
    }

    /// The collated batch of `pairs`, with the reference's log-probs written
    /// under `(side, "ref_log_probs")`, and the sides' frozen-trunk outputs when the reference
    /// was run here (not `cached`) from a branch.
    fn batch(
        &self,
        pairs: &[DpoPair],
        cached: Option<Vec<(f64, f64)>>,
    ) -> Result<(TensorDict, Vec<SideTrunk>)> {
        let mut td = collate_dpo_pairs(pairs, self.pad(), self.device())?;
        let kind = self.model.policy().model().kind();
        let (c, r, trunks) = match cached {
            Some(refs) => {
                let (c, r): (Vec<f64>, Vec<f64>) = refs.into_iter().unzip();
                (Tensor::from_slice(&c), Tensor::from_slice(&r), Vec::new())
            }
            None => self.reference_log_probs(&td)?,
        };
        let device = self.device();
        td.set(
            ("chosen", "ref_log_probs"),
            c.f_to_kind(kind)?.f_to_device(device)?,
        )?;
        td.set(
            ("rejected", "ref_log_probs"),
            r.f_to_kind(kind)?.f_to_device(device)?,
        )?;
        Ok((td, trunks))
    }

    /// The loss over the policy continued from `trunks` where a side has one.
    fn loss(&self, trunks: Vec<SideTrunk>) -> Result<DpoLoss<SidePolicy<'_>>> {
        let policy = SidePolicy {
            policy: self.model.policy(),
            start: self.model.frozen_trunk_end().unwrap_or(0),
            trunks,
        };
        DpoLoss::new(policy).with_config(self.loss_config.clone())
    }

    /// One optimizer step on `pairs` (any count ≥ 1); returns TRL's logged statistics. In a
    /// data-parallel group every rank calls it with its own pairs, and the step is that of one
    /// process on all of them together (the statistics are theirs too).
    ///
    /// # Errors
    /// On an invalid pair, or a failing forward / backward or group.
    pub fn step(&mut self, pairs: &[DpoPair]) -> Result<Stats> {
        let mc = self.model.policy().model().facts();
        check_pairs(pairs, mc.vocab_size, mc.max_positions)?;
        self.step_cached(pairs, None, pairs.len())
    }

    /// One step on `pairs`, of which the first `local` count (0 when this rank has no pairs
    /// in the step's tail: `pairs` is then a stand-in forwarded with weight 0, so that the
    /// rank still joins the gradient sum).
    fn step_cached(
        &mut self,
        pairs: &[DpoPair],
        cached: Option<Vec<(f64, f64)>>,
        local: usize,
    ) -> Result<Stats> {
        let (td, trunks) = self.batch(pairs, cached)?;
        let out = self.loss(trunks)?.forward(&td)?;
        let global = self
            .collective
            .sum_scalars(&[local as f64])?
            .first()
            .copied()
            .unwrap_or(0.0);
        // this rank's share of the global mean (1 in one process)
        let weight = local as f64 / global.max(1.0);
        let total = out.total_loss()?.f_mul_scalar(weight)?;
        let c = self.collective.clone();
        let grad_norm =
            self.opt
                .backward_step_with(&total, self.config.train.max_grad_norm, |params| {
                    c.all_reduce_sum_gradients(params)
                })?;
        let lr = self.sched.step();
        self.opt.set_lr(lr);
        let mut stats = trl_stats(&out, &td, self.loss_config.beta)?;
        if self.collective.world_size() > 1 {
            let names: Vec<String> = stats.keys().cloned().collect();
            let shares: Vec<f64> = stats.values().map(|v| v * weight).collect();
            let sums = self.collective.sum_scalars(&shares)?;
            stats = names.into_iter().zip(sums).collect();
        }
        stats.insert("lr".into(), lr);
        if let Some(norm) = grad_norm {
            stats.insert("grad_norm".into(), norm);
        }
        Ok(stats)
    }

    /// The loss and TRL's statistics on `pairs` (e.g. held-out ones), without gradient, in
    /// batches of `train.batch_size`; averaged over the pairs.
    ///
    /// # Errors
    /// On an invalid pair or a failing forward.
    pub fn evaluate_pairs(&self, pairs: &[DpoPair]) -> Result<Stats> {
        let mc = self.model.policy().model().facts();
        check_pairs(pairs, mc.vocab_size, mc.max_positions)?;
        let _guard = tch::no_grad_guard();
        let mut sums = Stats::new();
        for chunk in pairs.chunks(self.config.train.batch_size.max(1)) {
            let (td, trunks) = self.batch(chunk, None)?;
            let out = self.loss(trunks)?.forward(&td)?;
            for (k, v) in trl_stats(&out, &td, self.loss_config.beta)? {
                *sums.entry(k).or_insert(0.0) += v * chunk.len() as f64;
            }
        }
        for v in sums.values_mut() {
            *v /= pairs.len() as f64;
        }
        Ok(sums)
    }

    /// One shuffled pass over the pairs in batches of `train.batch_size` (stopping at the step
    /// budget), each step followed by the callbacks that are due; returns the mean step
    /// statistics (also kept in [`DpoTrainer::history`]).
    ///
    /// # Errors
    /// As [`DpoTrainer::step`] and the callbacks.
    pub fn train_epoch(&mut self, callbacks: &mut Callbacks<'_>) -> Result<Stats> {
        // a load replaced the reference: its log-probs are computed again
        if self.config.method.precompute_ref_log_probs && self.ref_cache.is_none() {
            self.precompute_reference()?;
        }
        let order = rank0_order(&self.collective, shuffled(&mut self.rng, self.pairs.len()))?;
        let total = self.total_steps();
        let per_rank = self.config.train.batch_size.max(1);
        let rank = self.collective.rank();
        let mut sums = Stats::new();
        let mut steps = 0usize;
        for step_idx in order.chunks(self.global_batch_size()) {
            if self.iter_count >= total {
                break;
            }
            let (idx, local) = rank_slice(step_idx, rank, per_rank);
            // the indices are a permutation of 0..n
            let batch: Vec<DpoPair> = idx
                .iter()
                .filter_map(|&i| self.pairs.get(i).cloned())
                .collect();
            let cached = self
                .ref_cache
                .as_ref()
                .map(|c| idx.iter().filter_map(|&i| c.get(i).copied()).collect());
            let stats = self.step_cached(&batch, cached, local)?;
            for (k, v) in &stats {
                *sums.entry(k.clone()).or_insert(0.0) += v;
            }
            steps += 1;
            let step = self.iter_count;
            self.iter_count += 1;
            self.after_step(step, &stats, self.iter_count >= total, callbacks)?;
        }
        for v in sums.values_mut() {
            *v /= steps.max(1) as f64;
        }
        self.epoch += 1;
        self.history.push(sums.clone());
        Ok(sums)
    }

    fn encode_prompts(&self, prompts: &[String]) -> Result<TensorDict> {
        prompt_batch(
            OP,
            self.tokenizer.as_ref(),
            prompts,
            self.pad(),
            self.device(),
        )
    }
}

/// TRL's logged DPO statistics of one batch: the loss, the metrics of [`DpoLossOutput`]
/// (`rewards/*`), and the policy's mean sequence log-probs `logps/chosen` / `logps/rejected`
/// (`π = rewards / β + ref`).
fn trl_stats(out: &DpoLossOutput, td: &TensorDict, beta: f64) -> Result<Stats> {
    let mut stats: Stats = out
        .metrics()
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.double_value(&[])))
        .collect();
    stats.insert("loss".into(), out.loss_dpo.double_value(&[]));
    for (side, rewards) in [
        ("chosen", &out.chosen_rewards),
        ("rejected", &out.rejected_rewards),
    ] {
        let reference = td.get_or_err((side, "ref_log_probs"))?;
        let policy = rewards
            .f_div_scalar(beta)?
            .f_add(&reference.f_to_kind(rewards.kind())?)?;
        stats.insert(
            format!("logps/{side}"),
            policy.f_mean(Kind::Double)?.double_value(&[]),
        );
    }
    Ok(stats)
}

/// Errors on an empty list, an empty row, ids outside `[0, vocab)`, or a prompt + completion
/// longer than `n_positions`, naming the pair.
fn check_pairs(pairs: &[DpoPair], vocab: i64, n_positions: i64) -> Result<()> {
    if pairs.is_empty() {
        return Err(Error::argument(OP, "pairs", "at least one pair", "0 pairs"));
    }
    for (i, p) in pairs.iter().enumerate() {
        for (what, completion) in [("chosen", &p.chosen), ("rejected", &p.rejected)] {
            let name = format!("pairs[{i}].{what}");
            if p.prompt.is_empty() || completion.is_empty() {
                return Err(Error::argument(
                    OP,
                    &name,
                    "a non-empty prompt and completion",
                    "an empty row",
                ));
            }
            if let Some(bad) = p
                .prompt
                .iter()
                .chain(completion.iter())
                .find(|t| !(0..vocab).contains(*t))
            {
                return Err(Error::argument(
                    OP,
                    &name,
                    format!("token ids in [0, vocab_size = {vocab})"),
                    format!("token id {bad}"),
                ));
            }
            let len = (p.prompt.len() + completion.len()) as i64;
            if len > n_positions {
                return Err(Error::argument(
                    OP,
                    &name,
                    format!("prompt + completion of at most n_positions = {n_positions} tokens"),
                    format!("{len} tokens"),
                ));
            }
        }
    }
    Ok(())
}

impl RlTrainer for DpoTrainer {
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

    /// Samples responses for the `("tokens", "prompt")` batch of `data` and writes the
    /// policy's and the reference's log-probs.
    fn act(&mut self, data: &TensorDict) -> Result<TensorDict> {
        let step = PolicyStep::default();
        hydra_policy_step(&self.model, &mut self.rng, data.clone(), &self.gen, step)
    }

    fn sample(
        &mut self,
        prompts: &[String],
        length: usize,
        n_samples: usize,
    ) -> Result<Vec<String>> {
        let pad = self.pad();
        sample_prompts(
            OP,
            &self.model,
            self.tokenizer.as_ref(),
            &mut self.rng,
            prompts,
            length,
            n_samples,
            &self.gen,
            pad,
        )
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
        let td = self.encode_prompts(&self.evaluation.prompts.clone())?;
        let gen = self.gen.clone();
        let samples = generate_text(&self.model, self.tokenizer.as_ref(), &mut self.rng, td, gen)?;
        self.evaluation.report(samples)
    }

    fn get_components(&self) -> Vec<(String, Component)> {
        let state = json!({
            "iter_count": self.iter_count,
            "epoch": self.epoch,
            "rng": rng_to_json(&self.rng),
        });
        let mut components = hydra_components(&self.model, &self.opt, &self.sched, state);
        components.push((
            "config".into(),
            Component::json(serde_json::to_value(&self.config).unwrap_or(Value::Null)),
        ));
        components
    }

    /// All or nothing: every component and the trainer's counters and generator are read
    /// and checked before anything is written; after an `Err` the trainer is as it was.
    fn set_components(&mut self, mut components: Vec<(String, Component)>) -> Result<()> {
        const LOAD: &str = "DpoTrainer::load";
        let (restore, state) = prepare_hydra_components(&self.model, &self.opt, &mut components)?;
        let read_state = || -> Result<_> {
            let iter_count = counter_from_json(LOAD, &state, "iter_count")?;
            let epoch = counter_from_json(LOAD, &state, "epoch")?;
            let rng = rng_from_json(LOAD, state.get("rng"))?;
            Ok((iter_count, epoch, rng))
        };
        let (iter_count, epoch, rng) = read_state().map_err(|e| in_component("trainer", e))?;
        restore.commit(&mut self.opt, &mut self.sched)?;
        self.iter_count = iter_count;
        self.epoch = epoch;
        self.rng = rng;
        // the precomputed reference log-probs were the old reference's
        self.ref_cache = None;
        Ok(())
    }
}

/// One side of a DPO batch (its token ids and mask) and its frozen-trunk output, computed by
/// the reference branch's pass.
struct SideTrunk {
    tokens: Tensor,
    mask: Tensor,
    hidden: Tensor,
}

/// The policy a DPO step trains: on a side whose frozen-trunk output the reference pass kept,
/// continued from it ([`CachedTrunk`]: the trunk is frozen, so the log-probs are those of the
/// whole policy and the trunk runs once per side instead of twice); the whole policy otherwise
/// (precomputed reference log-probs, a full-copy or adapters-off reference).
struct SidePolicy<'a> {
    policy: &'a CausalLmWithValueHead,
    start: usize,
    trunks: Vec<SideTrunk>,
}

impl fmt::Debug for SidePolicy<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "SidePolicy(start {}, {} trunks)",
            self.start,
            self.trunks.len()
        )
    }
}

impl ScoreTokens for SidePolicy<'_> {
    fn score_tokens(&self, t: &Tensor, m: &Tensor, r: ScoreRequest) -> Result<TokenScores> {
        for side in &self.trunks {
            if side.tokens.size() == t.size()
                && side.mask.size() == m.size()
                && side.tokens.equal(t)
                && side.mask.equal(m)
            {
                let cached = CachedTrunk::new(self.policy, side.hidden.shallow_clone(), self.start);
                return cached.score_tokens(t, m, r);
            }
        }
        self.policy.score_tokens(t, m, r)
    }

    fn generating_model(&self) -> Option<&dyn CausalLm> {
        Some(self.policy.model())
    }
}
