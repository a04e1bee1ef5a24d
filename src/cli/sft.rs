//! `torchrl sft` and `torchrl reward`: the supervised stages, with TRL's `SFTConfig` /
//! `RewardConfig` field names in a flat TOML file ([`TrainSettings`]).
//!
//! Both run the same loop: the training examples are shuffled each epoch with `seed + epoch`
//! (so a resumed run draws the batches the first run would have), `per_device_train_batch_size`
//! examples a step, for `num_train_epochs` or `max_steps`; the learning rate follows
//! `lr_scheduler_type` (`"linear"` decay to 0 after `warmup_ratio` of the steps, TRL's default,
//! or `"constant"`); every `logging_steps` a row goes to `log.csv` (and `curves.png`), with
//! the held-out loss when `test_size` holds examples out; every `save_steps` a checkpoint.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::log::RunLog;
use super::{bar, fail, load_model, new_store, Inputs, Output, TrainArgs};
use crate::data::llm::prepare::SftRow;
use crate::data::llm::DatasetFormat;
use crate::error::{Error, Result};
use crate::modules::llm::{CausalLm, CausalLmWithScoreHead, TextTokenizer};
use crate::trainers::checkpoint::{Checkpoint, CheckpointStore};
use crate::trainers::reward::{PreferencePair, RewardModelTrainer, RewardTrainerConfig};
use crate::trainers::sft::{SftConfig, SftTrainer};

/// The settings of `torchrl sft` and `torchrl reward`, by TRL's `SFTConfig` / `RewardConfig`
/// names (a flat TOML file; unknown fields are refused by name). The defaults are TRL's but
/// where said.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrainSettings {
    /// AdamW's learning rate (TRL: `2e-5` for SFT, `1e-4` for the reward model; `None` here
    /// picks the command's).
    pub learning_rate: Option<f64>,
    /// Passes over the training examples (fractions allowed). Default `3`.
    pub num_train_epochs: f64,
    /// When positive, the number of steps (overrides the epochs). Default `-1`.
    pub max_steps: i64,
    /// Examples per step. Default `8`.
    pub per_device_train_batch_size: usize,
    /// Rows are truncated to this many tokens (TRL's `max_length`). Default `1024`.
    pub max_length: Option<usize>,
    /// Ours: examples whose tokens exceed this are dropped (and counted) instead of truncated.
    /// Default none.
    pub drop_longer_than: Option<usize>,
    /// SFT: train on the completion only of prompt-completion data (TRL: unset means yes for
    /// prompt-completion data).
    pub completion_only_loss: Option<bool>,
    /// SFT: train on the assistant turns only of conversations. Default `false`.
    pub assistant_only_loss: bool,
    /// Reward model: the centring term's coefficient (TRL's `center_rewards_coefficient`).
    pub center_rewards_coefficient: Option<f64>,
    /// Steps between log rows. Default `10`.
    pub logging_steps: usize,
    /// Steps between held-out evaluations (default: `logging_steps`).
    pub eval_steps: Option<usize>,
    /// Steps between checkpoints. Default `500`.
    pub save_steps: usize,
    /// AdamW's decoupled weight decay. Default `0`.
    pub weight_decay: f64,
    /// AdamW's β1 and β2. Defaults `0.9`, `0.999`.
    pub adam_beta1: f64,
    /// See `adam_beta1`.
    pub adam_beta2: f64,
    /// Global gradient-norm clip (0: none). Default `1`.
    pub max_grad_norm: f64,
    /// `"linear"` (TRL's default) or `"constant"`.
    pub lr_scheduler_type: String,
    /// Fraction of the steps with a linear warm-up. Default `0`.
    pub warmup_ratio: f64,
    /// The seed of the shuffles, the split and the heads' initialisation. Default `42`.
    pub seed: u64,
    /// Ours (`datasets`' name): the fraction (or, ≥ 1, the count) of examples held out for
    /// evaluation. Default `0`: none.
    pub test_size: f64,
}

impl Default for TrainSettings {
    fn default() -> Self {
        TrainSettings {
            learning_rate: None,
            num_train_epochs: 3.0,
            max_steps: -1,
            per_device_train_batch_size: 8,
            max_length: Some(1024),
            drop_longer_than: None,
            completion_only_loss: None,
            assistant_only_loss: false,
            center_rewards_coefficient: None,
            logging_steps: 10,
            eval_steps: None,
            save_steps: 500,
            weight_decay: 0.0,
            adam_beta1: 0.9,
            adam_beta2: 0.999,
            max_grad_norm: 1.0,
            lr_scheduler_type: "linear".into(),
            warmup_ratio: 0.0,
            seed: 42,
            test_size: 0.0,
        }
    }
}

impl TrainSettings {
    /// Reads a TOML file (`None`: the defaults) and checks it.
    ///
    /// ```
    /// use torchrl::cli::sft::TrainSettings;
    /// let s = TrainSettings::from_toml_str("learning_rate = 1e-3\nmax_steps = 20\n").unwrap();
    /// assert_eq!((s.learning_rate, s.max_steps), (Some(1e-3), 20));
    /// let err = TrainSettings::from_toml_str("learning_rat = 1e-3\n").unwrap_err();
    /// assert!(err.to_string().contains("learning_rat"), "{err}");
    /// ```
    ///
    /// # Errors
    /// An unknown field or a value of the wrong type (named), or a value out of range.
    pub fn from_toml_str(text: &str) -> Result<Self> {
        let s: Self = super::parse_toml(text, None)?;
        s.validate()?;
        Ok(s)
    }

    fn from_file(path: Option<&Path>) -> Result<Self> {
        let s: Self = super::parse_toml(&super::read_config_text(path)?, path)?;
        s.validate()?;
        Ok(s)
    }

    /// Checks every field's range.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the field.
    pub fn validate(&self) -> Result<()> {
        use crate::error::require;
        const OP: &str = "TrainSettings";
        if let Some(lr) = self.learning_rate {
            require(
                lr.is_finite() && lr > 0.0,
                OP,
                "learning_rate",
                "a finite value > 0",
                lr,
            )?;
        }
        require(
            self.num_train_epochs.is_finite() && self.num_train_epochs > 0.0,
            OP,
            "num_train_epochs",
            "a finite value > 0",
            self.num_train_epochs,
        )?;
        require(
            self.per_device_train_batch_size >= 1,
            OP,
            "per_device_train_batch_size",
            ">= 1",
            self.per_device_train_batch_size,
        )?;
        require(
            self.max_length != Some(0) && self.max_length.is_none_or(|m| m >= 2),
            OP,
            "max_length",
            ">= 2 tokens",
            format!("{:?}", self.max_length),
        )?;
        require(
            self.logging_steps >= 1,
            OP,
            "logging_steps",
            ">= 1",
            self.logging_steps,
        )?;
        require(
            self.save_steps >= 1,
            OP,
            "save_steps",
            ">= 1",
            self.save_steps,
        )?;
        require(self.eval_steps != Some(0), OP, "eval_steps", ">= 1", 0)?;
        require(
            self.weight_decay.is_finite() && self.weight_decay >= 0.0,
            OP,
            "weight_decay",
            "a finite value >= 0",
            self.weight_decay,
        )?;
        require(
            (0.0..1.0).contains(&self.adam_beta1),
            OP,
            "adam_beta1",
            "in [0, 1)",
            self.adam_beta1,
        )?;
        require(
            (0.0..1.0).contains(&self.adam_beta2),
            OP,
            "adam_beta2",
            "in [0, 1)",
            self.adam_beta2,
        )?;
        require(
            self.max_grad_norm.is_finite() && self.max_grad_norm >= 0.0,
            OP,
            "max_grad_norm",
            "a finite value >= 0",
            self.max_grad_norm,
        )?;
        require(
            matches!(self.lr_scheduler_type.as_str(), "linear" | "constant"),
            OP,
            "lr_scheduler_type",
            "\"linear\" or \"constant\"",
            format!("{:?}", self.lr_scheduler_type),
        )?;
        require(
            (0.0..1.0).contains(&self.warmup_ratio),
            OP,
            "warmup_ratio",
            "in [0, 1)",
            self.warmup_ratio,
        )?;
        require(
            self.test_size.is_finite() && self.test_size >= 0.0,
            OP,
            "test_size",
            "0 (none), a fraction in (0, 1) or a count",
            self.test_size,
        )?;
        if let Some(c) = self.center_rewards_coefficient {
            require(
                c.is_finite() && c >= 0.0,
                OP,
                "center_rewards_coefficient",
                "a finite value >= 0",
                c,
            )?;
        }
        Ok(())
    }

    /// The learning rate at step `step` (0-based) of `total`.
    pub fn lr_at(&self, base: f64, step: usize, total: usize) -> f64 {
        let warmup = (self.warmup_ratio * total as f64).ceil() as usize;
        if step < warmup {
            return base * (step + 1) as f64 / warmup as f64;
        }
        match self.lr_scheduler_type.as_str() {
            "constant" => base,
            _ => {
                let left = total.saturating_sub(step) as f64;
                base * left / total.saturating_sub(warmup).max(1) as f64
            }
        }
    }

    /// The number of steps for `n` training examples.
    pub fn total_steps(&self, n: usize) -> usize {
        if self.max_steps > 0 {
            return self.max_steps as usize;
        }
        let per_epoch = n.div_ceil(self.per_device_train_batch_size).max(1);
        ((self.num_train_epochs * per_epoch as f64).ceil() as usize).max(1)
    }

    fn refuse(&self, command: &str, fields: &[(&'static str, bool)]) -> Result<()> {
        match fields.iter().find(|(_, set)| *set) {
            Some((name, _)) => Err(Error::config(
                "TrainSettings",
                name,
                format!("no value: `torchrl {command}` does not use it"),
                "a value",
            )),
            None => Ok(()),
        }
    }
}

/// What a supervised run measured.
#[derive(Debug, Clone, PartialEq)]
pub struct SupervisedSummary {
    /// Steps taken in all (a resumed run counts the first run's).
    pub steps: usize,
    /// The first and last logged training loss of this process's run.
    pub first_loss: f64,
    /// See `first_loss`.
    pub last_loss: f64,
    /// The last held-out loss (`NaN` without `test_size`).
    pub eval_loss: f64,
    /// Reward model: the held-out accuracy (`NaN` for SFT or without `test_size`).
    pub eval_accuracy: f64,
    /// Examples dropped by `drop_longer_than` (training and held-out together).
    pub dropped: usize,
    /// The trained model's folder.
    pub model_dir: std::path::PathBuf,
}

/// The per-step part of a supervised trainer the loop drives.
trait Supervised {
    fn train_len(&self) -> usize;
    /// One step on the examples `batch` (indices) at `lr`; the training loss and, for the
    /// reward model, the batch accuracy.
    fn step(&mut self, batch: &[usize], lr: f64) -> Result<(f64, f64)>;
    /// Held-out loss and accuracy (`NaN` where not measured); `None` without held-out data.
    fn evaluate(&mut self) -> Result<Option<(f64, f64)>>;
    fn checkpoint(&self) -> Checkpoint;
    fn restore(&mut self, ckpt: &Checkpoint) -> Result<()>;
}

/// A seeded permutation of `0..n` for epoch `epoch`.
fn epoch_order(n: usize, seed: u64, epoch: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    let mut rng = crate::rng::Generator::new(seed.wrapping_add(epoch as u64));
    for i in (1..n).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        order.swap(i, j);
    }
    order
}

/// The loop (see the [module docs](self)).
fn supervised_loop(
    what: &str,
    settings: &TrainSettings,
    base_lr: f64,
    out: &Output,
    resume: bool,
    quiet: bool,
    trainer: &mut dyn Supervised,
) -> Result<(usize, f64, f64, f64, f64)> {
    let n = trainer.train_len();
    let total = settings.total_steps(n);
    let per_epoch = n.div_ceil(settings.per_device_train_batch_size).max(1);
    let store = CheckpointStore::new(out.checkpoints());
    let mut start = 0usize;
    if resume {
        if let Some(ckpt) = store.load_latest()? {
            trainer.restore(&ckpt)?;
            start = ckpt.step() as usize;
        }
    }
    let columns = [
        "step",
        "epoch",
        "loss",
        "accuracy",
        "learning_rate",
        "eval_loss",
        "eval_accuracy",
    ];
    let mut log = if resume {
        RunLog::resume(&out.dir, &columns, what, start as f64)?
    } else {
        RunLog::new(&out.dir, &columns, what)?
    };
    let pb = bar(total as u64, what, quiet);
    pb.set_position(start as u64);
    let eval_every = settings.eval_steps.unwrap_or(settings.logging_steps);
    let (mut first, mut last, mut eval_loss, mut eval_acc) =
        (f64::NAN, f64::NAN, f64::NAN, f64::NAN);
    let (mut sum, mut acc_sum, mut count) = (0.0, 0.0, 0usize);
    let mut order: Option<(usize, Vec<usize>)> = None;
    for step in start..total {
        let epoch = step / per_epoch;
        if order.as_ref().is_none_or(|(e, _)| *e != epoch) {
            order = Some((epoch, epoch_order(n, settings.seed, epoch)));
        }
        let idx = &order.as_ref().map_or(&[][..], |(_, o)| o.as_slice());
        let at = (step % per_epoch) * settings.per_device_train_batch_size;
        let batch: Vec<usize> = idx
            .iter()
            .skip(at)
            .take(settings.per_device_train_batch_size)
            .copied()
            .collect();
        let lr = settings.lr_at(base_lr, step, total);
        let (loss, acc) = trainer.step(&batch, lr)?;
        sum += loss;
        acc_sum += acc;
        count += 1;
        let done = step + 1;
        if done % eval_every == 0 || done == total {
            if let Some((l, a)) = trainer.evaluate()? {
                eval_loss = l;
                eval_acc = a;
            }
        }
        if done % settings.logging_steps == 0 || done == total {
            let mean = sum / count as f64;
            if first.is_nan() {
                first = mean;
            }
            last = mean;
            log.push(&[
                done as f64,
                done as f64 / per_epoch as f64,
                mean,
                acc_sum / count as f64,
                lr,
                eval_loss,
                eval_acc,
            ])?;
            if !quiet {
                pb.suspend(|| {
                    println!(
                        "step {done:>6}  loss {mean:.4}  lr {lr:.3e}  eval_loss {eval_loss:.4}"
                    )
                });
            }
            (sum, acc_sum, count) = (0.0, 0.0, 0);
        }
        if done % settings.save_steps == 0 || done == total {
            store.save(&trainer.checkpoint())?;
        }
        pb.set_message(format!("loss {loss:.4}"));
        pb.inc(1);
    }
    pb.finish();
    Ok((total, first, last, eval_loss, eval_acc))
}

fn truncate(mut row: SftRow, max: Option<usize>) -> SftRow {
    if let Some(m) = max {
        row.ids.truncate(m);
        row.loss_mask.truncate(m);
    }
    row
}

struct SftRun<'a> {
    model: &'a dyn CausalLm,
    trainer: SftTrainer,
    rows: Vec<SftRow>,
    test: Vec<SftRow>,
}

impl Supervised for SftRun<'_> {
    fn train_len(&self) -> usize {
        self.rows.len()
    }

    fn step(&mut self, batch: &[usize], lr: f64) -> Result<(f64, f64)> {
        self.trainer.set_lr(lr);
        let rows: Vec<&SftRow> = batch.iter().filter_map(|&i| self.rows.get(i)).collect();
        let ids: Vec<Vec<i64>> = rows.iter().map(|r| r.ids.clone()).collect();
        let masks: Vec<Vec<bool>> = rows.iter().map(|r| r.loss_mask.clone()).collect();
        Ok((
            self.trainer.step_masked(self.model, &ids, &masks)?,
            f64::NAN,
        ))
    }

    fn evaluate(&mut self) -> Result<Option<(f64, f64)>> {
        if self.test.is_empty() {
            return Ok(None);
        }
        let (mut sum, mut n) = (0.0, 0.0);
        for chunk in self.test.chunks(16) {
            let ids: Vec<Vec<i64>> = chunk.iter().map(|r| r.ids.clone()).collect();
            let masks: Vec<Vec<bool>> = chunk.iter().map(|r| r.loss_mask.clone()).collect();
            let w = masks.iter().flatten().filter(|&&b| b).count() as f64;
            if w > 0.0 {
                sum += self.trainer.evaluate_masked(self.model, &ids, &masks)? * w;
                n += w;
            }
        }
        Ok(Some((sum / n.max(1.0), f64::NAN)))
    }

    fn checkpoint(&self) -> Checkpoint {
        self.trainer.checkpoint()
    }

    fn restore(&mut self, ckpt: &Checkpoint) -> Result<()> {
        self.trainer.restore(ckpt)
    }
}

/// `torchrl sft`: supervised fine-tuning (see the [module docs](self)).
///
/// # Errors
/// Bad arguments, data, config or model folder (before the output folder is created), or a
/// failing step.
pub fn run_sft(args: &TrainArgs) -> Result<SupervisedSummary> {
    let settings = TrainSettings::from_file(args.config.as_deref())?;
    settings.refuse(
        "sft",
        &[(
            "center_rewards_coefficient",
            settings.center_rewards_coefficient.is_some(),
        )],
    )?;
    let lr = settings.learning_rate.unwrap_or(2e-5);
    let inp = Inputs::load(args, settings.test_size, settings.seed)?;
    let fmt = inp.train.format();
    if !matches!(
        fmt,
        DatasetFormat::LanguageModeling | DatasetFormat::PromptCompletion
    ) {
        return Err(fail(
            "torchrl sft",
            format!(
                "{}: SFT takes language-modeling (\"text\" / \"messages\") or prompt-completion \
                 data, not {fmt}",
                args.data.display()
            ),
        ));
    }
    let enc = inp
        .encoder(settings.drop_longer_than)
        .with_completion_only_loss(settings.completion_only_loss.unwrap_or(true))
        .with_assistant_only_loss(settings.assistant_only_loss);
    let (rows, test, dropped) = inp.rows(|d| enc.sft_rows(d))?;
    let rows: Vec<SftRow> = rows
        .into_iter()
        .map(|r| truncate(r, settings.max_length))
        .collect();
    let test: Vec<SftRow> = test
        .into_iter()
        .map(|r| truncate(r, settings.max_length))
        .collect();
    tch::manual_seed(settings.seed as i64);
    let vs = new_store(args.dtype);
    let model = load_model(&vs.root(), &args.model, args.from_scratch)?;
    let context = model.facts().max_positions;
    if let Some(r) = rows
        .iter()
        .chain(&test)
        .find(|r| r.ids.len() as i64 > context)
    {
        return Err(fail(
            "torchrl sft",
            format!(
                "a row of {} tokens is longer than the model's context ({context}): set \
                 max_length or drop_longer_than",
                r.ids.len()
            ),
        ));
    }
    let config = SftConfig::default()
        .with_lr(lr)?
        .with_weight_decay(settings.weight_decay)
        .with_max_grad_norm((settings.max_grad_norm > 0.0).then_some(settings.max_grad_norm))
        .with_pad_token_id(inp.tokenizer.pad_token_id().unwrap_or(0));
    let config = SftConfig {
        betas: (settings.adam_beta1, settings.adam_beta2),
        ..config
    };
    let trainer = SftTrainer::new(model.as_ref(), config)?;
    let out = Output::create(&args.output)?;
    if !args.quiet {
        println!(
            "sft: {} training rows ({} held out, {dropped} dropped as longer than drop_longer_than), {} steps",
            rows.len(),
            test.len(),
            settings.total_steps(rows.len())
        );
    }
    out.guard(|| {
        let mut run = SftRun {
            model: model.as_ref(),
            trainer,
            rows,
            test,
        };
        let (steps, first, last, eval_loss, _) = supervised_loop(
            "sft",
            &settings,
            lr,
            &out,
            args.resume,
            args.quiet,
            &mut run,
        )?;
        let model_dir = out.save_folder("model", &args.model, |dir| model.save_pretrained(dir))?;
        if !args.quiet {
            println!(
                "sft: loss {first:.4} -> {last:.4}; wrote {}",
                model_dir.display()
            );
        }
        Ok(SupervisedSummary {
            steps,
            first_loss: first,
            last_loss: last,
            eval_loss,
            eval_accuracy: f64::NAN,
            dropped,
            model_dir,
        })
    })
}

struct RewardRun {
    trainer: RewardModelTrainer,
    pairs: Vec<PreferencePair>,
    test: Vec<PreferencePair>,
}

impl Supervised for RewardRun {
    fn train_len(&self) -> usize {
        self.pairs.len()
    }

    fn step(&mut self, batch: &[usize], lr: f64) -> Result<(f64, f64)> {
        self.trainer.set_lr(lr);
        let pairs: Vec<PreferencePair> = batch
            .iter()
            .filter_map(|&i| self.pairs.get(i).cloned())
            .collect();
        let s = self.trainer.step(&pairs)?;
        Ok((s.loss, s.accuracy))
    }

    fn evaluate(&mut self) -> Result<Option<(f64, f64)>> {
        if self.test.is_empty() {
            return Ok(None);
        }
        let (mut loss, mut acc, mut n) = (0.0, 0.0, 0.0);
        for chunk in self.test.chunks(16) {
            let s = self.trainer.evaluate(chunk)?;
            let w = chunk.len() as f64;
            loss += s.loss * w;
            acc += s.accuracy * w;
            n += w;
        }
        Ok(Some((loss / n, acc / n)))
    }

    fn checkpoint(&self) -> Checkpoint {
        self.trainer.checkpoint()
    }

    fn restore(&mut self, ckpt: &Checkpoint) -> Result<()> {
        self.trainer.restore(ckpt)
    }
}

/// `torchrl reward`: a reward model (the folder's model under a fresh score head, as TRL's
/// `AutoModelForSequenceClassification` starts) trained on preference pairs (see the [module
/// docs](self)).
///
/// # Errors
/// As [`run_sft`]; data that is not preference pairs.
pub fn run_reward(args: &TrainArgs) -> Result<SupervisedSummary> {
    let settings = TrainSettings::from_file(args.config.as_deref())?;
    settings.refuse(
        "reward",
        &[
            (
                "completion_only_loss",
                settings.completion_only_loss.is_some(),
            ),
            ("assistant_only_loss", settings.assistant_only_loss),
        ],
    )?;
    let lr = settings.learning_rate.unwrap_or(1e-4);
    let inp = Inputs::load(args, settings.test_size, settings.seed)?;
    let enc = inp.encoder(settings.drop_longer_than);
    let (pairs, test, dropped) = inp.rows(|d| enc.preference_pairs(d))?;
    let cut = |p: PreferencePair| match settings.max_length {
        Some(m) => PreferencePair::new(
            p.chosen.into_iter().take(m).collect(),
            p.rejected.into_iter().take(m).collect(),
        ),
        None => p,
    };
    let pairs: Vec<PreferencePair> = pairs.into_iter().map(cut).collect();
    let test: Vec<PreferencePair> = test.into_iter().map(cut).collect();
    tch::manual_seed(settings.seed as i64);
    let vs = new_store(args.dtype);
    let trunk = load_model(&vs.root(), &args.model, args.from_scratch)?;
    let rm = CausalLmWithScoreHead::from_model(&vs.root(), trunk)?;
    let mut config = RewardTrainerConfig::default()
        .with_lr(lr)?
        .with_pad_token_id(inp.tokenizer.pad_token_id().unwrap_or(0));
    config.weight_decay = settings.weight_decay;
    config.max_grad_norm = (settings.max_grad_norm > 0.0).then_some(settings.max_grad_norm);
    if let Some(c) = settings.center_rewards_coefficient {
        config = config.with_center_coeff(c);
    }
    let trainer = RewardModelTrainer::new(rm, config)?;
    let out = Output::create(&args.output)?;
    if !args.quiet {
        println!(
            "reward: {} training pairs ({} held out, {dropped} dropped), {} steps",
            pairs.len(),
            test.len(),
            settings.total_steps(pairs.len())
        );
    }
    out.guard(|| {
        let mut run = RewardRun {
            trainer,
            pairs,
            test,
        };
        let (steps, first, last, eval_loss, eval_accuracy) =
            supervised_loop("reward", &settings, lr, &out, args.resume, args.quiet, &mut run)?;
        let rm = run.trainer.into_model();
        let model_dir = out.save_folder("model", &args.model, |dir| rm.save_pretrained(dir))?;
        if !args.quiet {
            println!(
                "reward: loss {first:.4} -> {last:.4}, held-out accuracy {eval_accuracy:.3}; wrote {}",
                model_dir.display()
            );
        }
        Ok(SupervisedSummary {
            steps,
            first_loss: first,
            last_loss: last,
            eval_loss,
            eval_accuracy,
            dropped,
            model_dir,
        })
    })
}
