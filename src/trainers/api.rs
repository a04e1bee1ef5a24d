//! The trainer API, in the shape of trlX's `BaseRLModel` / `AccelerateRLModel`.
//!
//! A trainer implements [`RlTrainer`]: `act`, `sample`, `learn`, `evaluate`,
//! `get_components` / `set_components`, and says where its config and step count are. The
//! trait provides the rest: [`RlTrainer::intervals`] (trlX's `(step + 1) % interval == 0`
//! rule), [`RlTrainer::after_step`] (the periodic log / evaluate / save of trlX's learn loop,
//! calling the user's [`Callbacks`]), and [`RlTrainer::save`] / [`RlTrainer::load`] on top of
//! [atomic checkpoints](crate::trainers::checkpoint). The trait is object safe
//! (`Box<dyn RlTrainer>`).
//!
//! Components are named as trlX's `get_components()`: `model`, `opt`, `scheduler`; a trainer
//! adds its own state (the KL coefficient, running moments, the step count) as further
//! components. Each is a group of named tensors and a JSON value.
//!
//! ```
//! use torchrl::trainers::api::{intervals, Intervals};
//! use torchrl::trainers::config::TrainConfig;
//! let train = TrainConfig { log_interval: 2, eval_interval: 3, checkpoint_interval: 4, ..TrainConfig::default() };
//! // Step 0 is the first optimizer step: it is the 1st, so nothing is due.
//! assert_eq!(intervals(&train, 0), Intervals { do_log: false, do_eval: false, do_save: false });
//! // Step 11 is the 12th: a multiple of 2, 3 and 4.
//! assert_eq!(intervals(&train, 11), Intervals { do_log: true, do_eval: true, do_save: true });
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde_json::Value;
use tch::Tensor;

use crate::error::{Error, Result};
use crate::tensordict::TensorDict;
use crate::trainers::checkpoint::{Checkpoint, CheckpointStore};
use crate::trainers::config::TrainConfig;
use crate::trainers::optim::{AdamW, CosineAnnealingLr};

/// Named scalar statistics of one optimizer step (`loss`, `lr`, `policy/approx_kl`, …).
pub type Stats = BTreeMap<String, f64>;

/// What is due after an optimizer step (trlX's `intervals()` dict).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Intervals {
    /// `(step + 1) % log_interval == 0`.
    pub do_log: bool,
    /// `(step + 1) % eval_interval == 0`.
    pub do_eval: bool,
    /// `(step + 1) % checkpoint_interval == 0`.
    pub do_save: bool,
}

/// trlX's interval rule for the 0-based optimizer step `step`: each action is due when
/// `step + 1` is a multiple of its interval. An interval of 0 (refused by
/// [`TrlConfigOf::validate`](crate::trainers::config::TrlConfigOf::validate)) is never due.
pub fn intervals(train: &TrainConfig, step: usize) -> Intervals {
    let due = |interval: usize| interval > 0 && (step + 1).is_multiple_of(interval);
    Intervals {
        do_log: due(train.log_interval),
        do_eval: due(train.eval_interval),
        do_save: due(train.checkpoint_interval),
    }
}

/// The result of [`RlTrainer::evaluate`]: the samples, their rewards and mean, and named
/// metrics (trlX logs `mean_reward` and `metrics/<name>`).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct EvalReport {
    /// The generated evaluation samples.
    pub samples: Vec<String>,
    /// One reward per sample (empty without a reward function).
    pub rewards: Vec<f64>,
    /// The mean of `rewards` (`None` without a reward function).
    pub mean_reward: Option<f64>,
    /// Each metric function's mean over the samples, by name.
    pub metrics: BTreeMap<String, f64>,
}

/// A reward function: one reward per sample (trlX's `reward_fn(samples, …)`).
pub type RewardFn<'a> = dyn Fn(&[String]) -> Result<Vec<f64>> + 'a;

/// A metric function: one value per sample, reported as their mean (trlX's `metric_fn`
/// returns a dict of such lists; here each list has its own named function).
pub type MetricFn<'a> = dyn Fn(&[String]) -> Result<Vec<f64>> + 'a;

fn mean_of(op: &'static str, what: &str, values: &[f64], n: usize) -> Result<f64> {
    if values.len() != n {
        return Err(Error::value(
            op,
            what,
            format!("one value per sample ({n})"),
            format!("{} values", values.len()),
        ));
    }
    if n == 0 {
        return Err(Error::value(op, what, "at least one sample", "none"));
    }
    // Sample counts are far below 2^53, so the conversion is exact.
    Ok(values.iter().sum::<f64>() / n as f64)
}

impl EvalReport {
    /// Scores `samples` with the reward function and the named metric functions.
    ///
    /// ```
    /// use torchrl::trainers::api::EvalReport;
    /// # fn main() -> torchrl::Result<()> {
    /// let samples = vec!["ab".to_string(), "abcd".to_string()];
    /// let len = |s: &[String]| Ok(s.iter().map(|x| x.len() as f64).collect());
    /// let has_c = |s: &[String]| Ok(s.iter().map(|x| f64::from(u8::from(x.contains('c')))).collect());
    /// let report = EvalReport::from_samples(samples, Some(&len), &[("has_c", &has_c)])?;
    /// assert_eq!(report.rewards, [2.0, 4.0]);
    /// assert_eq!(report.mean_reward, Some(3.0));
    /// assert_eq!(report.metrics["has_c"], 0.5);
    /// assert_eq!(report.to_stats()["metrics/has_c"], 0.5);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// When a function fails, returns a value count other than the sample count, or there are
    /// no samples to average.
    pub fn from_samples(
        samples: Vec<String>,
        reward_fn: Option<&RewardFn<'_>>,
        metric_fns: &[(&str, &MetricFn<'_>)],
    ) -> Result<Self> {
        const OP: &str = "EvalReport::from_samples";
        let n = samples.len();
        let (rewards, mean_reward) = match reward_fn {
            Some(f) => {
                let rewards = f(&samples)?;
                let mean = mean_of(OP, "reward_fn", &rewards, n)?;
                (rewards, Some(mean))
            }
            None => (Vec::new(), None),
        };
        let mut metrics = BTreeMap::new();
        for (name, f) in metric_fns {
            let values = f(&samples)?;
            metrics.insert((*name).to_string(), mean_of(OP, name, &values, n)?);
        }
        Ok(EvalReport {
            samples,
            rewards,
            mean_reward,
            metrics,
        })
    }

    /// The report as log statistics: `mean_reward` and `metrics/<name>`.
    pub fn to_stats(&self) -> Stats {
        let mut stats: Stats = self
            .metrics
            .iter()
            .map(|(k, v)| (format!("metrics/{k}"), *v))
            .collect();
        if let Some(m) = self.mean_reward {
            stats.insert("mean_reward".into(), m);
        }
        stats
    }
}

/// A log callback: the 0-based step and that step's statistics.
pub type LogFn<'a> = dyn FnMut(usize, &Stats) -> Result<()> + 'a;
/// An evaluation callback: the 0-based step and the report.
pub type EvalFn<'a> = dyn FnMut(usize, &EvalReport) -> Result<()> + 'a;
/// A save callback: the 0-based step and the checkpoint folder just written.
pub type SaveFn<'a> = dyn FnMut(usize, &Path) -> Result<()> + 'a;

/// The optional callbacks of [`RlTrainer::learn`] (trlX's `learn(log_fn, save_fn, eval_fn)`),
/// called by [`RlTrainer::after_step`] when their interval is due. An error from a callback
/// stops training.
///
/// ```
/// use torchrl::trainers::api::Callbacks;
/// let mut logged = Vec::new();
/// {
///     let mut cb = Callbacks::new().on_log(|step, _stats| {
///         logged.push(step);
///         Ok(())
///     });
///     cb.log(4, &Default::default()).unwrap();
///     cb.eval(4, &Default::default()).unwrap(); // no eval callback: nothing happens
/// }
/// assert_eq!(logged, [4]);
/// ```
#[derive(Default)]
pub struct Callbacks<'a> {
    log_fn: Option<Box<LogFn<'a>>>,
    eval_fn: Option<Box<EvalFn<'a>>>,
    save_fn: Option<Box<SaveFn<'a>>>,
}

impl fmt::Debug for Callbacks<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Callbacks")
            .field("log_fn", &self.log_fn.is_some())
            .field("eval_fn", &self.eval_fn.is_some())
            .field("save_fn", &self.save_fn.is_some())
            .finish()
    }
}

impl<'a> Callbacks<'a> {
    /// No callbacks.
    pub fn new() -> Self {
        Callbacks::default()
    }

    /// Sets the log callback.
    pub fn on_log(mut self, f: impl FnMut(usize, &Stats) -> Result<()> + 'a) -> Self {
        self.log_fn = Some(Box::new(f));
        self
    }

    /// Sets the evaluation callback.
    pub fn on_eval(mut self, f: impl FnMut(usize, &EvalReport) -> Result<()> + 'a) -> Self {
        self.eval_fn = Some(Box::new(f));
        self
    }

    /// Sets the save callback.
    pub fn on_save(mut self, f: impl FnMut(usize, &Path) -> Result<()> + 'a) -> Self {
        self.save_fn = Some(Box::new(f));
        self
    }

    /// Calls the log callback, if any.
    pub fn log(&mut self, step: usize, stats: &Stats) -> Result<()> {
        self.log_fn.as_mut().map_or(Ok(()), |f| f(step, stats))
    }

    /// Calls the evaluation callback, if any.
    pub fn eval(&mut self, step: usize, report: &EvalReport) -> Result<()> {
        self.eval_fn.as_mut().map_or(Ok(()), |f| f(step, report))
    }

    /// Calls the save callback, if any.
    pub fn save(&mut self, step: usize, dir: &Path) -> Result<()> {
        self.save_fn.as_mut().map_or(Ok(()), |f| f(step, dir))
    }
}

/// One checkpointable part of a trainer (trlX's `get_components()` values): named tensors
/// (weights, optimizer moments) and a JSON state (step counts, hyper-parameters, a KL
/// coefficient).
#[derive(Debug, Default)]
pub struct Component {
    /// Named tensors, saved as `<component>.safetensors` (none: no file).
    pub tensors: Vec<(String, Tensor)>,
    /// JSON state, saved as `<component>.json` (`Null`: no file).
    pub state: Value,
}

impl Component {
    /// A component of named tensors only (a model's parameters, shallow clones).
    pub fn tensors(tensors: Vec<(String, Tensor)>) -> Self {
        Component {
            tensors,
            state: Value::Null,
        }
    }

    /// A component of JSON state only.
    pub fn json(state: Value) -> Self {
        Component {
            tensors: Vec::new(),
            state,
        }
    }

    /// An optimizer's moments and state ([`AdamW::state_tensors`], [`AdamW::state_json`]).
    pub fn from_adamw(opt: &AdamW) -> Self {
        Component {
            tensors: opt.state_tensors(),
            state: opt.state_json(),
        }
    }

    /// A schedule's state ([`CosineAnnealingLr::state_json`]).
    pub fn from_scheduler(sched: &CosineAnnealingLr) -> Self {
        Component::json(sched.state_json())
    }

    /// Copies this component's tensors into `params` by name, under `no_grad`, converting
    /// dtype and device to the destination's.
    ///
    /// ```
    /// use tch::{Kind, Tensor};
    /// use torchrl::trainers::api::Component;
    /// # fn main() -> torchrl::Result<()> {
    /// let saved = Component::tensors(vec![("w".into(), Tensor::from_slice(&[1.0f32, 2.0]))]);
    /// let w = Tensor::zeros([2], (Kind::Float, tch::Device::Cpu));
    /// saved.copy_into(&[("w".into(), w.shallow_clone())])?;
    /// assert_eq!(Vec::<f32>::try_from(&w)?, [1.0, 2.0]);
    /// let other = Tensor::zeros([3], (Kind::Float, tch::Device::Cpu));
    /// assert!(saved.copy_into(&[("w".into(), other)]).is_err()); // shape [3] vs [2]
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// Before copying anything: [`Error::KeyNotFound`] for a parameter the component lacks,
    /// [`Error::ShapeMismatch`] for a mis-shaped one, [`Error::InvalidValue`] for a tensor
    /// the parameters lack.
    pub fn copy_into(&self, params: &[(String, Tensor)]) -> Result<()> {
        self.stage_into(params)?.commit()
    }

    /// Everything [`Component::copy_into`] checks, and the values converted to each
    /// parameter's dtype and device, without writing any parameter: a load checks every
    /// component this way first and only then [`StagedCopy::commit`]s them, so that a bad
    /// component leaves the trainer as it was.
    ///
    /// # Errors
    /// As [`Component::copy_into`].
    pub(crate) fn stage_into(&self, params: &[(String, Tensor)]) -> Result<StagedCopy> {
        const OP: &str = "Component::copy_into";
        let given: BTreeMap<&str, &Tensor> =
            self.tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
        let mut pairs = Vec::with_capacity(params.len());
        for (name, p) in params {
            let src = given.get(name.as_str()).ok_or_else(|| Error::KeyNotFound {
                op: OP,
                key: format!("{name:?}"),
                available: given.keys().map(|k| format!("{k:?}")).collect(),
            })?;
            if src.size() != p.size() {
                return Err(Error::ShapeMismatch {
                    op: OP,
                    key: name.clone(),
                    expected: p.size(),
                    actual: src.size(),
                });
            }
            pairs.push((p, *src));
        }
        if let Some(extra) = given
            .keys()
            .find(|k| !params.iter().any(|(n, _)| n.as_str() == **k))
        {
            return Err(Error::value(
                OP,
                format!("{extra:?}"),
                "only tensors of the given parameters",
                "a tensor no parameter has",
            ));
        }
        let _guard = tch::no_grad_guard();
        let mut copies = Vec::with_capacity(pairs.len());
        for ((name, _), (p, src)) in params.iter().zip(pairs) {
            let value = src
                .f_to_kind(p.kind())?
                .f_to_device(p.device())?
                .f_detach()?;
            // a trainer never saves a NaN / inf parameter it could train on; one that is (or
            // that overflows the parameter's dtype) would only surface later as a NaN loss
            if crate::kind::is_float(p.kind()) && !bool::try_from(value.f_isfinite()?.f_all()?)? {
                return Err(Error::value(
                    OP,
                    format!("{name:?}"),
                    format!("finite values in the parameter's dtype {:?}", p.kind()),
                    "NaN or infinite values",
                ));
            }
            copies.push((p.shallow_clone(), value));
        }
        Ok(StagedCopy { copies })
    }
}

/// Parameter values checked and converted by [`Component::stage_into`], not yet written.
#[derive(Debug)]
pub(crate) struct StagedCopy {
    copies: Vec<(Tensor, Tensor)>,
}

impl StagedCopy {
    /// Writes the values into the parameters (same shapes, dtypes and devices: only
    /// libtorch's copy can fail here).
    pub(crate) fn commit(self) -> Result<()> {
        let _guard = tch::no_grad_guard();
        for (mut dst, value) in self.copies {
            dst.f_copy_(&value)?;
        }
        Ok(())
    }
}

/// Names of trlX's components.
pub mod names {
    /// The model's parameters.
    pub const MODEL: &str = "model";
    /// The optimizer's state.
    pub const OPT: &str = "opt";
    /// The schedule's state.
    pub const SCHEDULER: &str = "scheduler";
}

/// A trainer in the shape of trlX's `BaseRLModel` / `AccelerateRLModel`.
///
/// Required: the train config, the step count, `act`, `sample`, `learn`, `evaluate`, and the
/// components. Provided: interval checks, the periodic log / evaluate / save after each step,
/// and save / load through [`CheckpointStore`]. See `tests/trainers_api.rs` for a complete
/// (toy) trainer.
pub trait RlTrainer {
    /// The `train` section of the trainer's config (trlX's `config.train`): intervals,
    /// checkpoint folder, seed.
    fn train_config(&self) -> &TrainConfig;

    /// Optimizer steps taken so far (trlX's `iter_count`); the step saved checkpoints carry.
    fn iter_count(&self) -> usize;

    /// Runs the policy on a batch (trlX's `act(data: RLElement) -> RLElement`).
    ///
    /// # Errors
    /// When the batch lacks the keys or shapes the policy reads.
    fn act(&mut self, data: &TensorDict) -> Result<TensorDict>;

    /// Generates `n_samples` continuations of up to `length` tokens for each prompt.
    ///
    /// # Errors
    /// When generation fails.
    fn sample(
        &mut self,
        prompts: &[String],
        length: usize,
        n_samples: usize,
    ) -> Result<Vec<String>>;

    /// Trains until the step budget is spent, calling [`RlTrainer::after_step`] after every
    /// optimizer step, so `callbacks` run when their intervals are due.
    ///
    /// # Errors
    /// When a step, an evaluation, a save or a callback fails.
    fn learn(&mut self, callbacks: &mut Callbacks<'_>) -> Result<()>;

    /// Generates on the evaluation prompts and scores the samples.
    ///
    /// # Errors
    /// When generation or a scoring function fails.
    fn evaluate(&mut self) -> Result<EvalReport>;

    /// The checkpointable parts, by name: `model`, `opt`, `scheduler` (as trlX) and any state
    /// of the trainer's own. Tensors are shallow clones.
    fn get_components(&self) -> Vec<(String, Component)>;

    /// Restores the parts [`RlTrainer::get_components`] returned (from a checkpoint).
    ///
    /// # Errors
    /// When a part is missing or does not fit this trainer.
    fn set_components(&mut self, components: Vec<(String, Component)>) -> Result<()>;

    /// trlX's interval rule for this trainer's `train` config (see [`intervals`]).
    fn intervals(&self, step: usize) -> Intervals {
        intervals(self.train_config(), step)
    }

    /// Where periodic saves go: the `train.checkpoint_dir` store, keeping 3.
    fn checkpoint_store(&self) -> CheckpointStore {
        CheckpointStore::new(&self.train_config().checkpoint_dir)
    }

    /// Whether this process is the main one of a data-parallel group (rank 0): the one that
    /// runs the log and evaluation callbacks and writes checkpoints. `true` by default (one
    /// process); data-parallel trainers answer from their
    /// [`Collective`](crate::trainers::parallel::Collective).
    fn is_main_process(&self) -> bool {
        true
    }

    /// The barrier after main-process-only work (`op`: `"evaluate"`, `"save"`): every process
    /// waits here, and gets an error when another process failed (`ok` is whether this one
    /// succeeded). A no-op by default (one process); data-parallel trainers call
    /// [`Collective::check_all_ok`](crate::trainers::parallel::Collective::check_all_ok).
    ///
    /// # Errors
    /// When another process failed at `op`, or the group failed.
    fn sync_processes(&self, op: &'static str, ok: bool) -> Result<()> {
        let _ = (op, ok);
        Ok(())
    }

    /// The periodic work after the 0-based optimizer step `step` (what trlX's learn loop does
    /// after `scheduler.step()`): logs `stats` when due; evaluates (and logs the report's
    /// statistics) when due or on the `last` step; saves to [`RlTrainer::checkpoint_store`]
    /// when due or on the `last` step. Returns what was due by the interval rule alone.
    ///
    /// In a data-parallel group ([`RlTrainer::is_main_process`]) only the main process logs,
    /// evaluates and saves (and runs those callbacks); every process then meets the others in
    /// [`RlTrainer::sync_processes`], so none races ahead of a save and a failure on the main
    /// process stops them all.
    ///
    /// # Errors
    /// When evaluating, saving or a callback fails (on another process too, in a group).
    fn after_step(
        &mut self,
        step: usize,
        stats: &Stats,
        last: bool,
        callbacks: &mut Callbacks<'_>,
    ) -> Result<Intervals> {
        let due = self.intervals(step);
        let main = self.is_main_process();
        if due.do_log && main {
            callbacks.log(step, stats)?;
        }
        if due.do_eval || last {
            let done = if main {
                self.evaluate()
                    .and_then(|report| callbacks.eval(step, &report))
            } else {
                Ok(())
            };
            self.sync_processes("evaluate", done.is_ok())?;
            done?;
        }
        if due.do_save || last {
            let dir = self.save_to(&self.checkpoint_store())?;
            if main {
                callbacks.save(step, &dir)?;
            }
        }
        Ok(due)
    }

    /// The components as one [`Checkpoint`] at [`RlTrainer::iter_count`].
    fn checkpoint(&self) -> Checkpoint {
        // Step counts are far below 2^64.
        let mut ckpt = Checkpoint::new(self.iter_count() as u64);
        for (name, c) in self.get_components() {
            if !c.tensors.is_empty() {
                ckpt = ckpt.with_tensors(name.clone(), c.tensors);
            }
            if !c.state.is_null() {
                ckpt = ckpt.with_json(name, c.state);
            }
        }
        ckpt
    }

    /// In a data-parallel group, every rank's own state (what differs between ranks: its
    /// generator, its env's prompt position), gathered on every rank, for
    /// [`save_to`](Self::save_to) to write beside rank 0's checkpoint (the `"ranks"`
    /// component), so that each rank resumes exactly where it was. A collective call:
    /// `save_to` makes it on every rank. `None` (the default) when the ranks hold nothing of
    /// their own, or in a world of one.
    ///
    /// # Errors
    /// When the collective fails.
    fn rank_states(&self) -> Result<Option<Vec<Value>>> {
        Ok(None)
    }

    /// Saves a checkpoint into `store` (atomically) and returns its folder. In a
    /// data-parallel group only the main process writes; the others return the folder it
    /// writes ([`CheckpointStore::path_of`] the step), and all meet in
    /// [`RlTrainer::sync_processes`] after the write.
    ///
    /// # Errors
    /// As [`CheckpointStore::save`] (on the main process, reported on every process).
    fn save_to(&self, store: &CheckpointStore) -> Result<PathBuf> {
        // every rank takes part: the ranks' own states travel to the main process
        let ranks = self.rank_states()?;
        let saved = if self.is_main_process() {
            let mut ckpt = self.checkpoint();
            if let Some(ranks) = ranks {
                ckpt = ckpt.with_json(RANKS_COMPONENT, Value::Array(ranks));
            }
            store.save(&ckpt)
        } else {
            Ok(store.path_of(self.iter_count() as u64))
        };
        self.sync_processes("save", saved.is_ok())?;
        saved
    }

    /// Saves a checkpoint into the store at `dir` (keeping its last 3) and returns its folder
    /// (trlX's `save(directory)`).
    ///
    /// # Errors
    /// As [`CheckpointStore::save`].
    fn save(&self, dir: &Path) -> Result<PathBuf> {
        self.save_to(&CheckpointStore::new(dir))
    }

    /// Restores the components from a loaded checkpoint.
    ///
    /// # Errors
    /// As [`RlTrainer::set_components`].
    fn load_checkpoint(&mut self, ckpt: Checkpoint) -> Result<()> {
        let mut names: Vec<String> = ckpt
            .tensor_groups()
            .into_iter()
            .chain(ckpt.json_names())
            .map(str::to_string)
            .collect();
        names.sort();
        names.dedup();
        let mut components = Vec::with_capacity(names.len());
        for name in names {
            let tensors = match ckpt.tensors(&name) {
                Ok(t) => t
                    .iter()
                    .map(|(n, t)| (n.clone(), t.shallow_clone()))
                    .collect(),
                Err(_) => Vec::new(),
            };
            let state = ckpt.json(&name).cloned().unwrap_or(Value::Null);
            components.push((name, Component { tensors, state }));
        }
        self.set_components(components)
    }

    /// Loads the latest complete checkpoint of the store at `dir` (trlX's `load(directory)`).
    ///
    /// # Errors
    /// When the store holds no checkpoint, a file is missing or corrupt (naming its path), or
    /// a component does not fit.
    fn load(&mut self, dir: &Path) -> Result<()> {
        let folder = CheckpointStore::new(dir)
            .latest()?
            .ok_or_else(|| Error::Io {
                op: "RlTrainer::load",
                path: dir.display().to_string(),
                source: std::io::Error::new(std::io::ErrorKind::NotFound, "no checkpoint here"),
            })?;
        let ckpt = Checkpoint::load(&folder)?;
        // a component that does not fit is named by the trainer; the folder here
        self.load_checkpoint(ckpt)
            .map_err(|e| e.context(format!("RlTrainer::load: checkpoint {}", folder.display())))
    }
}

/// The checkpoint component that holds every rank's own state
/// ([`RlTrainer::rank_states`]): a JSON array, rank `i`'s state at index `i`.
pub const RANKS_COMPONENT: &str = "ranks";

/// `err` with the component it came from: `component "opt" (opt.safetensors, opt.json)`,
/// the files a [`CheckpointStore`] writes for it.
pub(crate) fn in_component(name: &str, err: Error) -> Error {
    err.context(format!(
        "component {name:?} ({name}.safetensors, {name}.json)"
    ))
}

/// The component named `name`, taken out of `components`.
///
/// # Errors
/// [`Error::KeyNotFound`] listing the names present.
pub fn take_component(components: &mut Vec<(String, Component)>, name: &str) -> Result<Component> {
    let pos = components.iter().position(|(n, _)| n == name);
    match pos {
        Some(i) => Ok(components.swap_remove(i).1),
        None => Err(Error::KeyNotFound {
            op: "take_component",
            key: format!("{name:?}"),
            available: components.iter().map(|(n, _)| format!("{n:?}")).collect(),
        }),
    }
}

/// The evaluation a trainer runs (trlX's `eval_prompts`, `reward_fn`, `metric_fn`): prompts,
/// a reward function and named metric functions over the decoded responses.
#[derive(Default)]
pub struct Evaluation {
    /// The evaluation prompts.
    pub prompts: Vec<String>,
    /// One reward per response.
    pub reward_fn: Option<Box<RewardFn<'static>>>,
    /// Named metrics, each one value per response.
    pub metric_fns: Vec<(String, Box<MetricFn<'static>>)>,
}

impl fmt::Debug for Evaluation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Evaluation")
            .field("prompts", &self.prompts.len())
            .field("reward_fn", &self.reward_fn.is_some())
            .field(
                "metric_fns",
                &self.metric_fns.iter().map(|(n, _)| n).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl Evaluation {
    /// An evaluation on `prompts`, with no reward or metric function yet.
    ///
    /// ```
    /// use torchrl::trainers::api::Evaluation;
    /// # fn main() -> torchrl::Result<()> {
    /// let eval = Evaluation::new(vec!["a".into()])
    ///     .with_reward_fn(|s: &[String]| Ok(s.iter().map(|x| x.len() as f64).collect()))
    ///     .with_metric("has_b", |s: &[String]| Ok(s.iter().map(|x| f64::from(u8::from(x.contains('b')))).collect()));
    /// let report = eval.report(vec!["ab".into()])?;
    /// assert_eq!((report.mean_reward, report.metrics["has_b"]), (Some(2.0), 1.0));
    /// # Ok(()) }
    /// ```
    pub fn new(prompts: Vec<String>) -> Self {
        Evaluation {
            prompts,
            ..Evaluation::default()
        }
    }

    /// Sets the reward function (one reward per response).
    pub fn with_reward_fn(mut self, f: impl Fn(&[String]) -> Result<Vec<f64>> + 'static) -> Self {
        self.reward_fn = Some(Box::new(f));
        self
    }

    /// Adds a named metric function (one value per response; the report holds the mean).
    pub fn with_metric(
        mut self,
        name: impl Into<String>,
        f: impl Fn(&[String]) -> Result<Vec<f64>> + 'static,
    ) -> Self {
        self.metric_fns.push((name.into(), Box::new(f)));
        self
    }

    /// Scores `samples` ([`EvalReport::from_samples`]).
    ///
    /// # Errors
    /// As [`EvalReport::from_samples`].
    pub fn report(&self, samples: Vec<String>) -> Result<EvalReport> {
        let metrics: Vec<(&str, &MetricFn<'static>)> = self
            .metric_fns
            .iter()
            .map(|(n, f)| (n.as_str(), f.as_ref()))
            .collect();
        EvalReport::from_samples(samples, self.reward_fn.as_deref(), &metrics)
    }
}

/// Encodes `prompts` with `tokenizer` into one left-padded batch (`input_ids`,
/// `attention_mask`, on the CPU). An empty prompt is an error naming its index.
pub(crate) fn encode_prompts(
    op: &'static str,
    tokenizer: &dyn crate::modules::llm::TextTokenizer,
    prompts: &[String],
    pad: i64,
) -> Result<crate::modules::llm::Encoded> {
    let mut rows = Vec::with_capacity(prompts.len());
    for (i, p) in prompts.iter().enumerate() {
        let ids = tokenizer.encode(p)?;
        if ids.is_empty() {
            return Err(Error::value(
                op,
                "prompts",
                "non-empty prompts",
                format!("prompt {i} encodes to no tokens"),
            ));
        }
        rows.push(ids);
    }
    crate::modules::llm::pad_rows(&rows, pad, crate::modules::llm::PaddingSide::Left)
}

/// Decodes each row of `response` `[B, R]` keeping the tokens where `mask` `[B, R]` is set,
/// special tokens skipped.
pub(crate) fn decode_masked(
    tokenizer: &dyn crate::modules::llm::TextTokenizer,
    response: &Tensor,
    mask: &Tensor,
) -> Result<Vec<String>> {
    let (b, r) = response.size2()?;
    let cpu = tch::Device::Cpu;
    let ids = Vec::<i64>::try_from(response.f_to_device(cpu)?.f_reshape([-1])?)?;
    let keep = Vec::<i64>::try_from(
        mask.f_to_device(cpu)?
            .f_to_kind(tch::Kind::Int64)?
            .f_reshape([-1])?,
    )?;
    let width = r.max(1) as usize;
    let mut out = Vec::with_capacity(b as usize);
    for (row, mrow) in ids.chunks(width).zip(keep.chunks(width)) {
        let kept: Vec<i64> = row
            .iter()
            .zip(mrow)
            .filter(|(_, m)| **m != 0)
            .map(|(t, _)| *t)
            .collect();
        out.push(tokenizer.decode(&kept, crate::modules::llm::SpecialTokens::Skip)?);
    }
    Ok(out)
}

/// A generator's state as JSON (four decimal strings: JSON numbers lose 64-bit precision).
pub(crate) fn rng_to_json(rng: &crate::rng::Generator) -> Value {
    Value::Array(
        rng.state()
            .iter()
            .map(|w| Value::String(w.to_string()))
            .collect(),
    )
}

/// A step or epoch counter of a saved trainer state, range-checked: at most
/// [`MAX_STEPS`](crate::trainers::optim::MAX_STEPS) (2^53), so that counting on from it never
/// overflows and it converts to `f64` exactly.
pub(crate) fn counter_from_json(op: &'static str, state: &Value, name: &str) -> Result<usize> {
    let max = crate::trainers::optim::MAX_STEPS;
    let v = state.get(name).ok_or_else(|| {
        Error::value(
            op,
            "trainer state",
            format!("a field {name:?}"),
            state.to_string(),
        )
    })?;
    v.as_u64()
        .filter(|n| *n <= max)
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(|| {
            Error::value(
                op,
                format!("trainer state {name}"),
                format!("a count in [0, {max}]"),
                v.to_string(),
            )
        })
}

/// The generator saved by [`rng_to_json`]; an error names `op` when `value` is not four words.
pub(crate) fn rng_from_json(
    op: &'static str,
    value: Option<&Value>,
) -> Result<crate::rng::Generator> {
    let words: Vec<u64> = value
        .and_then(Value::as_array)
        // every entry must be a word: a mutated entry is not skipped over
        .map(|a| a.iter().map_while(|w| w.as_str()?.parse().ok()).collect())
        .unwrap_or_default();
    let state: [u64; 4] = words.try_into().map_err(|w: Vec<u64>| {
        Error::value(
            op,
            "trainer state",
            "rng as 4 words",
            format!("{} words", w.len()),
        )
    })?;
    Ok(crate::rng::Generator::from_state(state))
}
