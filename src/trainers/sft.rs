//! Supervised fine-tuning (SFT) of a causal LM: next-token cross-entropy on padded token
//! rows, the first stage of the RLHF pipeline (the model PPO later starts from and is kept
//! close to).
//!
//! The loss is the mean negative log-likelihood of every real token that has a real token
//! before it (the first token of a row has nothing to be predicted from), with
//! [`token_log_probs`]'s alignment: `lp[t] = log p(token[t] | tokens < t)`.
//!
//! ```
//! use tch::{nn, Device, Tensor};
//! use torchrl::modules::llm::{Gpt2Config, Gpt2Model};
//! use torchrl::trainers::sft::{causal_lm_loss, SftConfig, SftTrainer};
//! # fn main() -> torchrl::Result<()> {
//! tch::manual_seed(0);
//! let vs = nn::VarStore::new(Device::Cpu);
//! let config = Gpt2Config::new(16).with_n_positions(16).with_n_embd(16).with_n_layer(1).with_n_head(2);
//! let model = Gpt2Model::new(&vs.root(), &config)?;
//! // two rows that repeat a pattern; the model learns them
//! let rows = vec![vec![1i64, 2, 3, 1, 2, 3, 1, 2], vec![4, 5, 4, 5, 4, 5]];
//! let mut sft = SftTrainer::new(&model, SftConfig::default().with_lr(1e-2)?)?;
//! let first = sft.step(&model, &rows)?;
//! for _ in 0..30 {
//!     sft.step(&model, &rows)?;
//! }
//! let last = sft.evaluate(&model, &rows)?;
//! assert!(last < 0.5 * first, "{first} -> {last}");
//! // a uniform model's loss is ln(vocab)
//! let tokens = Tensor::from_slice(&[1i64, 2, 3]).view([1, 3]);
//! let mask = Tensor::ones([1, 3], (tch::Kind::Int64, Device::Cpu));
//! assert!(causal_lm_loss(&model, &tokens, &mask)?.double_value(&[]).is_finite());
//! # Ok(()) }
//! ```

use tch::{Kind, Tensor};

use super::checkpoint::{restore_supervised, supervised_checkpoint, Checkpoint};
use super::optim::{shallow_named, AdamW};
use super::parallel::{join_group, Collective, SharedCollective};
use crate::error::{Error, Result};
use crate::macros::setters;
use crate::modules::llm::{
    pad_rows, position_ids_from_mask, token_log_probs, CausalLm, LmInput, PaddingSide,
};

/// Mean next-token negative log-likelihood of `tokens` `[B, T]` under `model`, over the
/// positions whose token and previous token are real (`attention_mask` 1). An error when no
/// position qualifies.
pub fn causal_lm_loss(
    model: &dyn CausalLm,
    tokens: &Tensor,
    attention_mask: &Tensor,
) -> Result<Tensor> {
    let (sum, n) = causal_lm_nll(model, tokens, attention_mask)?;
    if n < 1.0 {
        return Err(no_predicted_token());
    }
    Ok(sum.f_div_scalar(n)?)
}

/// The parts of [`causal_lm_loss`]: the summed next-token negative log-likelihood (a
/// differentiable 0-dim tensor) and the number of predicted positions it sums over (0 is
/// allowed here: the sum is then 0). Data-parallel SFT divides every rank's sum by the
/// positions of all ranks together.
///
/// ```
/// use tch::{nn, Device, Kind, Tensor};
/// use torchrl::modules::llm::{Gpt2Config, Gpt2Model};
/// use torchrl::trainers::sft::{causal_lm_loss, causal_lm_nll};
/// # fn main() -> torchrl::Result<()> {
/// let vs = nn::VarStore::new(Device::Cpu);
/// let config = Gpt2Config::new(8).with_n_positions(8).with_n_embd(8).with_n_layer(1).with_n_head(2);
/// let model = Gpt2Model::new(&vs.root(), &config)?;
/// let tokens = Tensor::from_slice(&[1i64, 2, 3, 0]).view([1, 4]);
/// let mask = Tensor::from_slice(&[1i64, 1, 1, 0]).view([1, 4]);
/// let (sum, n) = causal_lm_nll(&model, &tokens, &mask)?;
/// assert_eq!(n, 2.0); // tokens 2 and 3 are predicted
/// let mean = causal_lm_loss(&model, &tokens, &mask)?;
/// assert!((sum.double_value(&[]) / n - mean.double_value(&[])).abs() < 1e-6);
/// # Ok(()) }
/// ```
pub fn causal_lm_nll(
    model: &dyn CausalLm,
    tokens: &Tensor,
    attention_mask: &Tensor,
) -> Result<(Tensor, f64)> {
    nll(model, tokens, attention_mask, None)
}

/// [`causal_lm_nll`] over the positions where `loss_mask` `[B, T]` is also nonzero: TRL's
/// completion-only and assistant-only losses (`completion_only_loss`, `assistant_only_loss`),
/// where the prompt's or the user's tokens are context but not targets. A position counts when
/// its token and the one before it are real and its own `loss_mask` is set.
///
/// ```
/// use tch::{nn, Device, Tensor};
/// use torchrl::modules::llm::{Gpt2Config, Gpt2Model};
/// use torchrl::trainers::sft::{causal_lm_nll, causal_lm_nll_masked};
/// # fn main() -> torchrl::Result<()> {
/// let vs = nn::VarStore::new(Device::Cpu);
/// let config = Gpt2Config::new(8).with_n_positions(8).with_n_embd(8).with_n_layer(1).with_n_head(2);
/// let model = Gpt2Model::new(&vs.root(), &config)?;
/// let tokens = Tensor::from_slice(&[1i64, 2, 3, 4]).view([1, 4]);
/// let mask = Tensor::from_slice(&[1i64, 1, 1, 1]).view([1, 4]);
/// // the first two tokens are the prompt: only tokens 3 and 4 are targets
/// let completion = Tensor::from_slice(&[0i64, 0, 1, 1]).view([1, 4]);
/// let (part, n) = causal_lm_nll_masked(&model, &tokens, &mask, &completion)?;
/// assert_eq!(n, 2.0);
/// let (all, n_all) = causal_lm_nll(&model, &tokens, &mask)?;
/// assert_eq!(n_all, 3.0);
/// assert!(part.double_value(&[]) < all.double_value(&[]));
/// # Ok(()) }
/// ```
///
/// # Errors
/// [`Error::ShapeMismatch`] when `loss_mask` is not the tokens' shape; as [`causal_lm_nll`].
pub fn causal_lm_nll_masked(
    model: &dyn CausalLm,
    tokens: &Tensor,
    attention_mask: &Tensor,
    loss_mask: &Tensor,
) -> Result<(Tensor, f64)> {
    if loss_mask.size() != tokens.size() {
        return Err(Error::ShapeMismatch {
            op: "causal_lm_nll_masked",
            key: "loss_mask".into(),
            expected: tokens.size(),
            actual: loss_mask.size(),
        });
    }
    nll(model, tokens, attention_mask, Some(loss_mask))
}

fn nll(
    model: &dyn CausalLm,
    tokens: &Tensor,
    attention_mask: &Tensor,
    loss_mask: Option<&Tensor>,
) -> Result<(Tensor, f64)> {
    let t = tokens.size().last().copied().unwrap_or(0);
    if t < 2 {
        return Err(Error::value(
            "causal_lm_loss",
            "tokens",
            "rows of at least 2 tokens",
            format!("{:?}", tokens.size()),
        ));
    }
    let positions = position_ids_from_mask(attention_mask)?;
    let input = LmInput::new(tokens)
        .with_attention_mask(attention_mask)
        .with_position_ids(&positions);
    let logits = model.forward(&input, None)?.logits()?;
    let mut lp = token_log_probs(&logits, tokens, Some(attention_mask))?;
    let m = attention_mask.f_to_kind(Kind::Float)?;
    let mut predicted = m.f_narrow(1, 1, t - 1)?.f_mul(&m.f_narrow(1, 0, t - 1)?)?;
    if let Some(lm) = loss_mask {
        let lm = lm.f_ne(0)?.f_to_kind(Kind::Float)?;
        predicted = predicted.f_mul(&lm.f_narrow(1, 1, t - 1)?)?;
        lp = lp.f_mul(&lm.f_to_kind(lp.kind())?)?;
    }
    let n = predicted.f_sum(Kind::Float)?.double_value(&[]);
    // summed in the model's precision (float64 models keep float64)
    Ok((lp.f_sum(lp.kind())?.f_neg()?, n))
}

fn no_predicted_token() -> Error {
    Error::value(
        "causal_lm_loss",
        "attention_mask",
        "at least one real token after a real token",
        "none",
    )
}

/// Hyper-parameters of [`SftTrainer`].
#[derive(Debug, Clone, PartialEq)]
pub struct SftConfig {
    /// AdamW learning rate. Default `1e-3`.
    pub lr: f64,
    /// AdamW `(β1, β2)`. Default `(0.9, 0.95)` (trlX's).
    pub betas: (f64, f64),
    /// AdamW decoupled weight decay. Default `1e-6` (trlX's).
    pub weight_decay: f64,
    /// Global gradient-norm clip; `None`: no clipping. Default `Some(1.0)`.
    pub max_grad_norm: Option<f64>,
    /// Pad id of the batches. Default `0` (masked out either way).
    pub pad_token_id: i64,
}

impl Default for SftConfig {
    fn default() -> Self {
        SftConfig {
            lr: 1e-3,
            betas: (0.9, 0.95),
            weight_decay: 1e-6,
            max_grad_norm: Some(1.0),
            pad_token_id: 0,
        }
    }
}

impl SftConfig {
    /// Sets the learning rate (finite, > 0).
    pub fn with_lr(mut self, lr: f64) -> Result<Self> {
        if !(lr.is_finite() && lr > 0.0) {
            return Err(Error::config("SftConfig", "lr", "a finite value > 0", lr));
        }
        self.lr = lr;
        Ok(self)
    }

    setters! {
        /// Sets the global gradient-norm clip.
        with_max_grad_norm(max_grad_norm: Option<f64>);
        /// Sets the pad id used to batch rows.
        with_pad_token_id(pad_token_id: i64);
        /// Sets the weight decay.
        with_weight_decay(weight_decay: f64);
    }
}

/// Trains a [`Gpt2Model`]'s parameters on token rows with AdamW (see the [module
/// docs](self)).
///
/// # Data-parallel ([`SftTrainer::with_collective`])
/// Every rank calls [`SftTrainer::step`] with its own rows; each rank divides its summed
/// negative log-likelihood by the predicted positions of **all** ranks' rows and the
/// gradients are summed, so a step is one process's on every rank's rows together (the
/// clipped norm is the global one, the AdamW steps are identical) and the returned loss is
/// theirs. A rank may have rows without a predicted position, as long as some rank has one.
#[derive(Debug)]
pub struct SftTrainer {
    opt: AdamW,
    config: SftConfig,
    steps: usize,
    collective: SharedCollective,
}

impl SftTrainer {
    /// A trainer of every parameter of `model`.
    pub fn new(model: &dyn CausalLm, config: SftConfig) -> Result<Self> {
        let opt = AdamW::new(shallow_named(model.named_parameters()), config.lr)?
            .with_betas([config.betas.0, config.betas.1])
            .with_weight_decay(config.weight_decay);
        Ok(SftTrainer {
            opt,
            config,
            steps: 0,
            collective: SharedCollective::default(),
        })
    }

    /// Makes this trainer one rank of a data-parallel group (see the [type's
    /// docs](SftTrainer#data-parallel-sfttrainerwith_collective)): checks that every rank has
    /// rank 0's clip and step count, and copies rank 0's parameters into every rank's model.
    /// Every rank must call it.
    ///
    /// ```
    /// use tch::{nn, Device};
    /// use torchrl::modules::llm::{Gpt2Config, Gpt2Model};
    /// use torchrl::trainers::parallel::{Collective, SingleProcess};
    /// use torchrl::trainers::sft::{SftConfig, SftTrainer};
    /// # fn main() -> torchrl::Result<()> {
    /// let vs = nn::VarStore::new(Device::Cpu);
    /// let config = Gpt2Config::new(8).with_n_positions(8).with_n_embd(8).with_n_layer(1).with_n_head(2);
    /// let model = Gpt2Model::new(&vs.root(), &config)?;
    /// // Under torchrl-launch: `.with_collective(ProcessGroup::init_from_env()?)`
    /// // (cargo feature `distributed`); a world of one runs anywhere.
    /// let mut sft = SftTrainer::new(&model, SftConfig::default())?.with_collective(SingleProcess)?;
    /// assert_eq!(sft.collective().world_size(), 1);
    /// assert!(sft.step(&model, &[vec![1, 2, 3]])?.is_finite());
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
            ("max_grad_norm", self.config.max_grad_norm.unwrap_or(-1.0)),
            ("lr", self.config.lr),
        ];
        let params = self.opt.named_params();
        join_group(
            &shared,
            "SftTrainer::with_collective",
            &fields,
            &[&params],
            &mut self.opt,
        )?;
        self.collective = shared;
        Ok(self)
    }

    /// The group this trainer is a rank of ([`SingleProcess`](super::parallel::SingleProcess)
    /// unless [`SftTrainer::with_collective`] was called).
    pub fn collective(&self) -> &SharedCollective {
        &self.collective
    }

    /// Sets the optimizer's learning rate for the next steps (a schedule run by the caller).
    pub fn set_lr(&mut self, lr: f64) {
        self.opt.set_lr(lr);
    }

    /// The optimizer steps taken.
    pub fn steps(&self) -> usize {
        self.steps
    }

    /// This trainer's state and its model's parameters as a [`Checkpoint`] (groups `"model"`,
    /// `"opt"`, and the step count), to save with a
    /// [`CheckpointStore`](super::checkpoint::CheckpointStore) and resume with
    /// [`SftTrainer::restore`].
    ///
    /// ```
    /// use tch::{nn, Device};
    /// use torchrl::modules::llm::{CausalLm, Gpt2Config, Gpt2Model};
    /// use torchrl::trainers::sft::{SftConfig, SftTrainer};
    /// # fn main() -> torchrl::Result<()> {
    /// let config = Gpt2Config::new(8).with_n_positions(8).with_n_embd(8).with_n_layer(1).with_n_head(2);
    /// let vs = nn::VarStore::new(Device::Cpu);
    /// let model = Gpt2Model::new(&vs.root(), &config)?;
    /// let mut sft = SftTrainer::new(&model, SftConfig::default())?;
    /// sft.step(&model, &[vec![1, 2, 3]])?;
    /// let ckpt = sft.checkpoint();
    /// // a fresh model and trainer continue exactly where this one stopped
    /// let vs2 = nn::VarStore::new(Device::Cpu);
    /// let model2 = Gpt2Model::new(&vs2.root(), &config)?;
    /// let mut sft2 = SftTrainer::new(&model2, SftConfig::default())?;
    /// sft2.restore(&ckpt)?;
    /// assert_eq!(sft2.steps(), 1);
    /// assert_eq!(sft.step(&model, &[vec![3, 2, 1]])?, sft2.step(&model2, &[vec![3, 2, 1]])?);
    /// # Ok(()) }
    /// ```
    pub fn checkpoint(&self) -> Checkpoint {
        supervised_checkpoint(self.steps, &self.opt.named_params(), &self.opt)
    }

    /// Restores a [`SftTrainer::checkpoint`] into the model and this trainer. Everything is
    /// checked first (parameter names and shapes, finite values, the optimizer's state): on
    /// an error neither changed.
    ///
    /// # Errors
    /// [`Error::KeyNotFound`] / [`Error::ShapeMismatch`] / [`Error::InvalidValue`] naming the
    /// component and tensor that do not fit.
    pub fn restore(&mut self, checkpoint: &Checkpoint) -> Result<()> {
        let params = self.opt.named_params();
        self.steps = restore_supervised("SftTrainer::restore", checkpoint, &params, &mut self.opt)?;
        Ok(())
    }

    /// One optimizer step on `rows` (right-padded into one batch); returns the loss before
    /// the step. In a data-parallel group every rank calls it with its own rows, and the step
    /// and the loss are those of one process on all of them.
    ///
    /// # Errors
    /// On no rows, a row longer than the model's context, no predicted position (on any rank),
    /// or a failing forward / backward or group.
    pub fn step(&mut self, model: &dyn CausalLm, rows: &[Vec<i64>]) -> Result<f64> {
        self.step_with(model, rows, None)
    }

    /// [`SftTrainer::step`] with a loss mask per row (its length): only the tokens whose mask
    /// is `true` are targets (TRL's completion-only / assistant-only loss; see
    /// [`causal_lm_nll_masked`]). A data-parallel step divides by the targets of every rank.
    ///
    /// ```
    /// use tch::{nn, Device};
    /// use torchrl::modules::llm::{Gpt2Config, Gpt2Model};
    /// use torchrl::trainers::sft::{SftConfig, SftTrainer};
    /// # fn main() -> torchrl::Result<()> {
    /// tch::manual_seed(0);
    /// let vs = nn::VarStore::new(Device::Cpu);
    /// let config = Gpt2Config::new(16).with_n_positions(8).with_n_embd(16).with_n_layer(1).with_n_head(2);
    /// let model = Gpt2Model::new(&vs.root(), &config)?;
    /// // prompt 1 2 3, completion 9: only the completion is learned
    /// let rows = vec![vec![1i64, 2, 3, 9]];
    /// let masks = vec![vec![false, false, false, true]];
    /// let mut sft = SftTrainer::new(&model, SftConfig::default().with_lr(1e-2)?)?;
    /// let first = sft.step_masked(&model, &rows, &masks)?;
    /// for _ in 0..20 {
    ///     sft.step_masked(&model, &rows, &masks)?;
    /// }
    /// assert!(sft.evaluate_masked(&model, &rows, &masks)? < 0.2 * first);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`SftTrainer::step`], and [`Error::InvalidValue`] when the masks are not one per
    /// row of its length, or no row has a target (on any rank).
    pub fn step_masked(
        &mut self,
        model: &dyn CausalLm,
        rows: &[Vec<i64>],
        loss_masks: &[Vec<bool>],
    ) -> Result<f64> {
        self.step_with(model, rows, Some(loss_masks))
    }

    fn step_with(
        &mut self,
        model: &dyn CausalLm,
        rows: &[Vec<i64>],
        loss_masks: Option<&[Vec<bool>]>,
    ) -> Result<f64> {
        let (tokens, mask) = self.batch(model, rows)?;
        let (sum, n) = match loss_masks {
            Some(lm) => {
                causal_lm_nll_masked(model, &tokens, &mask, &self.loss_mask(model, rows, lm)?)?
            }
            None => causal_lm_nll(model, &tokens, &mask)?,
        };
        // one all-reduce: the positions and the summed loss of every rank
        let local_sum = sum.double_value(&[]);
        let global = self.collective.sum_scalars(&[n, local_sum])?;
        let (n_all, sum_all) = match global.as_slice() {
            [n, s] => (*n, *s),
            _ => (n, local_sum),
        };
        if n_all < 1.0 {
            return Err(no_predicted_token());
        }
        let loss = sum.f_div_scalar(n_all)?;
        let c = self.collective.clone();
        self.opt
            .backward_step_with(&loss, self.config.max_grad_norm, |params| {
                c.all_reduce_sum_gradients(params)
            })?;
        self.steps += 1;
        Ok(sum_all / n_all)
    }

    /// The loss on `rows` without a step (this rank's rows only; no collective).
    pub fn evaluate(&self, model: &dyn CausalLm, rows: &[Vec<i64>]) -> Result<f64> {
        let _guard = tch::no_grad_guard();
        let (tokens, mask) = self.batch(model, rows)?;
        Ok(causal_lm_loss(model, &tokens, &mask)?.double_value(&[]))
    }

    /// The masked loss of [`SftTrainer::step_masked`] on `rows` without a step.
    pub fn evaluate_masked(
        &self,
        model: &dyn CausalLm,
        rows: &[Vec<i64>],
        loss_masks: &[Vec<bool>],
    ) -> Result<f64> {
        let _guard = tch::no_grad_guard();
        let (tokens, mask) = self.batch(model, rows)?;
        let lm = self.loss_mask(model, rows, loss_masks)?;
        let (sum, n) = causal_lm_nll_masked(model, &tokens, &mask, &lm)?;
        if n < 1.0 {
            return Err(no_predicted_token());
        }
        Ok(sum.double_value(&[]) / n)
    }

    /// The loss masks as one right-padded `[B, T]` tensor on the model's device.
    fn loss_mask(
        &self,
        model: &dyn CausalLm,
        rows: &[Vec<i64>],
        loss_masks: &[Vec<bool>],
    ) -> Result<Tensor> {
        if loss_masks.len() != rows.len() {
            return Err(Error::value(
                "SftTrainer",
                "loss_masks",
                format!("one mask per row ({} rows)", rows.len()),
                format!("{} masks", loss_masks.len()),
            ));
        }
        if let Some((i, (r, m))) = rows
            .iter()
            .zip(loss_masks)
            .enumerate()
            .find(|(_, (r, m))| r.len() != m.len())
        {
            return Err(Error::value(
                "SftTrainer",
                "loss_masks",
                format!("mask {i} as long as row {i} ({} tokens)", r.len()),
                format!("{} entries", m.len()),
            ));
        }
        let as_ids: Vec<Vec<i64>> = loss_masks
            .iter()
            .map(|m| m.iter().map(|&b| i64::from(b)).collect())
            .collect();
        let enc = pad_rows(&as_ids, 0, PaddingSide::Right)?;
        Ok(enc.input_ids.f_to_device(model.device())?)
    }

    fn batch(&self, model: &dyn CausalLm, rows: &[Vec<i64>]) -> Result<(Tensor, Tensor)> {
        if rows.is_empty() {
            return Err(Error::value(
                "SftTrainer",
                "rows",
                "at least one row",
                "0 rows",
            ));
        }
        let n_pos = model.facts().max_positions;
        if let Some((i, r)) = rows
            .iter()
            .enumerate()
            .find(|(_, r)| r.len() as i64 > n_pos)
        {
            return Err(Error::value(
                "SftTrainer",
                "rows",
                format!("rows of at most n_positions = {n_pos} tokens"),
                format!("row {i} has {} tokens", r.len()),
            ));
        }
        let enc = pad_rows(rows, self.config.pad_token_id, PaddingSide::Right)?;
        let device = model.device();
        Ok((
            enc.input_ids.f_to_device(device)?,
            enc.attention_mask.f_to_device(device)?,
        ))
    }
}
