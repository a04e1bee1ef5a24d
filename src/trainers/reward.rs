//! Reward-model training on pairwise preferences: a [`CausalLmWithScoreHead`] (GPT-2 trunk and
//! `transformers`' sequence-score head) trained with the Bradley-Terry
//! [`RewardModelLoss`] on `chosen` / `rejected` token batches, with accuracy and margin
//! logged and the optional centring term. The trained model then scores responses in the
//! token env (`envs::llm::scorer::RewardModelScorer`).
//!
//! **Batch layout** ([`collate_preferences`]): a tensordict of batch `[B]` with two
//! sub-tensordicts, `"chosen"` and `"rejected"`, each holding `("tokens", "full")` `[B, T]`
//! (left-padded, int64) and `("masks", "all_attention_mask")` `[B, T]` (1 = real) — the keys
//! [`CausalLmWithScoreHead`] reads ([`LlmKeys`](crate::modules::llm::LlmKeys)). The trainer writes
//! each side's `"score"` `[B]` with the score model and hands the tensordict to
//! [`RewardModelLoss`] (which reads the precomputed scores, as TorchRL's does without a score
//! network), so the loss's keys can be renamed with `set_keys` as usual.
//!
//! **Logged** ([`RewardStats`]): the loss, `accuracy` = mean(chosen > rejected) (strict, a
//! tie counts as wrong; TRL's and TorchRL's), `margin` = mean(chosen − rejected) (TRL's
//! `margin`), and the mean chosen / rejected scores.
//!
//! ```
//! use tch::{nn, Device};
//! use torchrl::modules::llm::{Gpt2Config, Gpt2Model, CausalLmWithScoreHead};
//! use torchrl::trainers::reward::{PreferencePair, RewardModelTrainer, RewardTrainerConfig};
//! # fn main() -> torchrl::Result<()> {
//! tch::manual_seed(0);
//! let vs = nn::VarStore::new(Device::Cpu);
//! let config = Gpt2Config::new(8).with_n_positions(8).with_n_embd(16).with_n_layer(1).with_n_head(2);
//! let rm = CausalLmWithScoreHead::from_model(&(vs.root() / "rm"), Gpt2Model::new(&vs.root(), &config)?)?;
//! // the hidden preference: rows ending in 3 beat rows ending in 4
//! let pairs: Vec<PreferencePair> = (0..8)
//!     .map(|i| PreferencePair::new(vec![1, i % 3, 3], vec![1, i % 3, 4]))
//!     .collect();
//! let mut trainer = RewardModelTrainer::new(rm, RewardTrainerConfig::default().with_lr(1e-2)?)?;
//! for _ in 0..20 {
//!     trainer.step(&pairs)?;
//! }
//! let stats = trainer.evaluate(&pairs)?;
//! assert_eq!(stats.accuracy, 1.0);
//! assert!(stats.margin > 0.0);
//! # Ok(()) }
//! ```

use tch::{Device, Kind, Tensor};

use super::checkpoint::{restore_supervised, supervised_checkpoint, Checkpoint};
use super::optim::{shallow_named, AdamW};
use super::parallel::{join_group, Collective, SharedCollective};
use crate::error::{Error, Result};
use crate::macros::setters;
use crate::modules::llm::{pad_rows, CausalLmWithScoreHead, PaddingSide};
use crate::modules::TensorDictModule;
use crate::objectives::{LossModule, LossOutput, RewardModelLoss};
use crate::tensordict::TensorDict;

/// One preference: the full token rows (prompt + response) of the preferred and the other
/// response to the same prompt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreferencePair {
    /// The preferred row.
    pub chosen: Vec<i64>,
    /// The other row.
    pub rejected: Vec<i64>,
}

impl PreferencePair {
    /// A pair.
    pub fn new(chosen: Vec<i64>, rejected: Vec<i64>) -> Self {
        PreferencePair { chosen, rejected }
    }
}

/// Collates `pairs` into the [batch layout](self) on `device`, left-padded with `pad`. Errors
/// on an empty list or an empty row.
pub fn collate_preferences(
    pairs: &[PreferencePair],
    pad: i64,
    device: Device,
) -> Result<TensorDict> {
    let op = "collate_preferences";
    if pairs.is_empty() {
        return Err(Error::value(op, "pairs", "at least one pair", "0 pairs"));
    }
    if let Some(i) = pairs
        .iter()
        .position(|p| p.chosen.is_empty() || p.rejected.is_empty())
    {
        return Err(Error::value(
            op,
            "pairs",
            "non-empty chosen and rejected rows",
            format!("pair {i} has an empty row"),
        ));
    }
    let b = pairs.len() as i64;
    let mut td = TensorDict::new([b])?.with_device(device)?;
    for (side, rows) in [
        (
            "chosen",
            pairs.iter().map(|p| p.chosen.clone()).collect::<Vec<_>>(),
        ),
        (
            "rejected",
            pairs.iter().map(|p| p.rejected.clone()).collect(),
        ),
    ] {
        let enc = pad_rows(&rows, pad, PaddingSide::Left)?;
        td.set((side, "tokens", "full"), enc.input_ids.f_to_device(device)?)?;
        td.set(
            (side, "masks", "all_attention_mask"),
            enc.attention_mask.f_to_device(device)?,
        )?;
    }
    Ok(td)
}

/// Hyper-parameters of [`RewardModelTrainer`].
#[derive(Debug, Clone, PartialEq)]
pub struct RewardTrainerConfig {
    /// AdamW learning rate. Default `1e-4` (TRL's `RewardConfig`).
    pub lr: f64,
    /// AdamW weight decay. Default `0.0`.
    pub weight_decay: f64,
    /// Global gradient-norm clip. Default `Some(1.0)` (TorchRL's recipe's `clip_grad`).
    pub max_grad_norm: Option<f64>,
    /// The centring coefficient (TorchRL's `center_coeff`, `c² + r²`); `None`: no centring.
    /// Default `None`.
    pub center_coeff: Option<f64>,
    /// Pad id of the batches. Default `0` (masked out either way).
    pub pad_token_id: i64,
}

impl Default for RewardTrainerConfig {
    fn default() -> Self {
        RewardTrainerConfig {
            lr: 1e-4,
            weight_decay: 0.0,
            max_grad_norm: Some(1.0),
            center_coeff: None,
            pad_token_id: 0,
        }
    }
}

impl RewardTrainerConfig {
    /// Sets the learning rate (finite, > 0).
    pub fn with_lr(mut self, lr: f64) -> Result<Self> {
        if !(lr.is_finite() && lr > 0.0) {
            return Err(Error::config(
                "RewardTrainerConfig",
                "lr",
                "a finite value > 0",
                lr,
            ));
        }
        self.lr = lr;
        Ok(self)
    }

    setters! {
        /// Sets the centring coefficient.
        with_center_coeff(c: f64) => center_coeff = Some(c);
        /// Sets the global gradient-norm clip.
        with_max_grad_norm(max_grad_norm: Option<f64>);
        /// Sets the pad id.
        with_pad_token_id(pad_token_id: i64);
        /// Sets the weight decay.
        with_weight_decay(weight_decay: f64);
    }
}

/// What one step or an evaluation measured (see the [module docs](self)).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RewardStats {
    /// The total loss (Bradley-Terry plus centring).
    pub loss: f64,
    /// mean(chosen > rejected).
    pub accuracy: f64,
    /// mean(chosen − rejected).
    pub margin: f64,
    /// mean chosen score.
    pub chosen: f64,
    /// mean rejected score.
    pub rejected: f64,
}

/// Trains a [`CausalLmWithScoreHead`] on [`PreferencePair`]s (see the [module docs](self)).
///
/// # Data-parallel ([`RewardModelTrainer::with_collective`])
/// Every rank calls [`RewardModelTrainer::step`] with its own pairs; each rank weights its
/// mean loss (Bradley-Terry and centring are both means over pairs) by its share of all
/// ranks' pairs and the gradients are summed, so a step is one process's on every rank's
/// pairs together (global clipped norm, identical AdamW steps), and the returned statistics
/// are theirs. [`RewardModelTrainer::evaluate`] stays local.
pub struct RewardModelTrainer {
    model: CausalLmWithScoreHead,
    loss: RewardModelLoss,
    opt: AdamW,
    config: RewardTrainerConfig,
    steps: usize,
    collective: SharedCollective,
}

impl std::fmt::Debug for RewardModelTrainer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RewardModelTrainer")
            .field("config", &self.config)
            .field("steps", &self.steps)
            .finish_non_exhaustive()
    }
}

impl RewardModelTrainer {
    /// A trainer of every parameter of `model`.
    pub fn new(model: CausalLmWithScoreHead, config: RewardTrainerConfig) -> Result<Self> {
        let opt = AdamW::new(shallow_named(model.named_parameters()), config.lr)?
            .with_weight_decay(config.weight_decay);
        let mut loss = RewardModelLoss::new();
        if let Some(c) = config.center_coeff {
            loss = loss.with_center_coeff(c)?;
        }
        Ok(RewardModelTrainer {
            model,
            loss,
            opt,
            config,
            steps: 0,
            collective: SharedCollective::default(),
        })
    }

    /// Makes this trainer one rank of a data-parallel group (see the [type's
    /// docs](RewardModelTrainer#data-parallel-rewardmodeltrainerwith_collective)): checks that
    /// every rank has rank 0's settings and step count, and copies rank 0's parameters into
    /// every rank's model. Every rank must call it.
    ///
    /// ```
    /// use tch::{nn, Device};
    /// use torchrl::modules::llm::{Gpt2Config, Gpt2Model, CausalLmWithScoreHead};
    /// use torchrl::trainers::parallel::{Collective, SingleProcess};
    /// use torchrl::trainers::reward::{PreferencePair, RewardModelTrainer, RewardTrainerConfig};
    /// # fn main() -> torchrl::Result<()> {
    /// let vs = nn::VarStore::new(Device::Cpu);
    /// let config = Gpt2Config::new(8).with_n_positions(8).with_n_embd(8).with_n_layer(1).with_n_head(2);
    /// let rm = CausalLmWithScoreHead::from_model(&vs.root(), Gpt2Model::new(&vs.root(), &config)?)?;
    /// // Under torchrl-launch: `.with_collective(ProcessGroup::init_from_env()?)`
    /// // (cargo feature `distributed`); a world of one runs anywhere.
    /// let mut trainer = RewardModelTrainer::new(rm, RewardTrainerConfig::default())?
    ///     .with_collective(SingleProcess)?;
    /// assert_eq!(trainer.collective().world_size(), 1);
    /// let s = trainer.step(&[PreferencePair::new(vec![1, 3], vec![1, 4])])?;
    /// assert!(s.accuracy == 0.0 || s.accuracy == 1.0);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::Distributed`] when a rank's settings differ from rank 0's (naming them), or
    /// the group fails.
    pub fn with_collective(mut self, collective: impl Collective + 'static) -> Result<Self> {
        let shared = SharedCollective::new(collective);
        let fields = [
            ("steps", self.steps as f64),
            ("lr", self.config.lr),
            ("max_grad_norm", self.config.max_grad_norm.unwrap_or(-1.0)),
            ("center_coeff", self.config.center_coeff.unwrap_or(-1.0)),
        ];
        let params = self.opt.named_params();
        join_group(
            &shared,
            "RewardModelTrainer::with_collective",
            &fields,
            &[&params],
            &mut self.opt,
        )?;
        self.collective = shared;
        Ok(self)
    }

    /// The group this trainer is a rank of ([`SingleProcess`](super::parallel::SingleProcess)
    /// unless [`RewardModelTrainer::with_collective`] was called).
    pub fn collective(&self) -> &SharedCollective {
        &self.collective
    }

    /// The loss (rename its keys with `set_keys` to read other sub-tensordicts).
    pub fn loss_mut(&mut self) -> &mut RewardModelLoss {
        &mut self.loss
    }

    /// The model being trained.
    pub fn model(&self) -> &CausalLmWithScoreHead {
        &self.model
    }

    /// The trained model (to plug into the token env as its scorer).
    pub fn into_model(self) -> CausalLmWithScoreHead {
        self.model
    }

    /// This trainer's state and its model's parameters as a [`Checkpoint`] (groups
    /// `"model"`, `"opt"`, and the step count), resumed with [`RewardModelTrainer::restore`].
    pub fn checkpoint(&self) -> Checkpoint {
        supervised_checkpoint(self.steps, &self.opt.named_params(), &self.opt)
    }

    /// Restores a [`RewardModelTrainer::checkpoint`] into the model and this trainer, checking
    /// everything first: on an error neither changed.
    ///
    /// # Errors
    /// [`Error::KeyNotFound`] / [`Error::ShapeMismatch`] / [`Error::InvalidValue`] naming the
    /// component and tensor that do not fit.
    pub fn restore(&mut self, checkpoint: &Checkpoint) -> Result<()> {
        let params = self.opt.named_params();
        self.steps = restore_supervised(
            "RewardModelTrainer::restore",
            checkpoint,
            &params,
            &mut self.opt,
        )?;
        Ok(())
    }

    /// Sets the optimizer's learning rate for the next steps (a schedule run by the caller).
    pub fn set_lr(&mut self, lr: f64) {
        self.opt.set_lr(lr);
    }

    /// The optimizer steps taken.
    pub fn steps(&self) -> usize {
        self.steps
    }

    /// One optimizer step on `pairs`; the statistics are those before the step. In a
    /// data-parallel group every rank calls it with its own pairs (see the [type's
    /// docs](RewardModelTrainer#data-parallel-rewardmodeltrainerwith_collective)).
    pub fn step(&mut self, pairs: &[PreferencePair]) -> Result<RewardStats> {
        let td = self.batch(pairs)?;
        self.step_on(td)
    }

    /// One optimizer step on an already collated batch ([`collate_preferences`]'s layout
    /// under the loss's keys).
    pub fn step_on(&mut self, td: TensorDict) -> Result<RewardStats> {
        let pairs = td.batch_size().first().copied().unwrap_or(0) as f64;
        let (total, stats) = self.forward(td)?;
        // one all-reduce: every rank's pair count and pair-weighted statistics
        let local = [
            pairs,
            pairs * stats.loss,
            pairs * stats.accuracy,
            pairs * stats.margin,
            pairs * stats.chosen,
            pairs * stats.rejected,
        ];
        let (weight, stats) = match self.collective.sum_scalars(&local)?.as_slice() {
            [n, loss, accuracy, margin, chosen, rejected] if self.collective.world_size() > 1 => (
                pairs / n.max(1.0),
                RewardStats {
                    loss: loss / n,
                    accuracy: accuracy / n,
                    margin: margin / n,
                    chosen: chosen / n,
                    rejected: rejected / n,
                },
            ),
            _ => (1.0, stats),
        };
        let total = total.f_mul_scalar(weight)?;
        let c = self.collective.clone();
        self.opt
            .backward_step_with(&total, self.config.max_grad_norm, |params| {
                c.all_reduce_sum_gradients(params)
            })?;
        self.steps += 1;
        Ok(stats)
    }

    /// The statistics on `pairs` without a step (this rank's pairs only; no collective).
    pub fn evaluate(&self, pairs: &[PreferencePair]) -> Result<RewardStats> {
        let _guard = tch::no_grad_guard();
        let td = self.batch(pairs)?;
        Ok(self.forward(td)?.1)
    }

    fn batch(&self, pairs: &[PreferencePair]) -> Result<TensorDict> {
        collate_preferences(pairs, self.config.pad_token_id, self.device())
    }

    fn device(&self) -> Device {
        self.opt
            .params()
            .first()
            .map_or(Device::Cpu, Tensor::device)
    }

    fn forward(&self, td: TensorDict) -> Result<(Tensor, RewardStats)> {
        let keys = self.loss.tensor_keys().clone();
        let mut td = td;
        for side in [&keys.chosen, &keys.rejected] {
            let sub = match td.get_dict(side) {
                Some(sub) => sub.clone(),
                None => {
                    return Err(Error::KeyNotFound {
                        op: "RewardModelTrainer",
                        key: side.to_string(),
                        available: td
                            .keys(crate::tensordict::KeysOptions::default())
                            .iter()
                            .map(ToString::to_string)
                            .collect(),
                    })
                }
            };
            let scored = TensorDictModule::forward(&self.model, sub)?;
            td.set(side, scored)?;
        }
        let out = self.loss.forward(&td)?;
        let total = out.total_loss()?;
        let c = td.get_or_err(keys.chosen.join(&keys.score))?;
        let r = td.get_or_err(keys.rejected.join(&keys.score))?;
        let stats = RewardStats {
            loss: total.double_value(&[]),
            accuracy: out.accuracy.double_value(&[]),
            margin: out.margin.double_value(&[]),
            chosen: c.f_mean(Kind::Double)?.double_value(&[]),
            rejected: r.f_mean(Kind::Double)?.double_value(&[]),
        };
        Ok((total, stats))
    }
}
