//! `torchrl ppo`, `grpo`, `dpo` and `ilql`: the trainers of [`crate::trainers`] driven from a
//! model folder, a JSONL file and a TOML config.
//!
//! The config is trlX's `TRLConfig` in TOML (`[train]`, `[model]`, `[optimizer]`,
//! `[scheduler]`, `[method]`; see [`TrlConfig`](crate::trainers::TrlConfig)) with three more
//! tables of ours:
//! - `[data]` ([`DataSettings`]): the held-out share of the dataset and a length limit;
//! - `[[reward]]` (`ppo` and `grpo`; [`RewardEntry`]): what scores the completions, read from
//!   each example's other columns where a reward needs them (an `answer` for `answer_match`);
//! - `[generation]` ([`GenerationSettings`]): how the held-out prompts are sampled when
//!   `ppo` / `grpo` evaluate (greedy by default).
//!
//! `train.checkpoint_dir` is `OUTPUT/checkpoints`; checkpoints are taken at iteration (PPO,
//! GRPO) or epoch (DPO, ILQL) boundaries once `train.checkpoint_interval` optimizer steps have
//! passed since the last one, and at the end. `model.peft_config` trains LoRA adapters; the
//! result is then written twice: the adapter (`OUTPUT/adapter`, PEFT's layout) and the base
//! with the adapter merged (`OUTPUT/model`).
//!
//! ```
//! use torchrl::cli::rl::RlConfig;
//! use torchrl::trainers::grpo::GrpoMethodConfig;
//! let text = r#"
//! [train]
//! epochs = 3
//! [method]
//! num_generations = 4
//! [data]
//! test_size = 0.1
//! [[reward]]
//! type = "answer_match"
//! field = "answer"
//! extract = "last_number"
//! "#;
//! let c = RlConfig::<GrpoMethodConfig>::from_toml_str(text, None).unwrap();
//! assert_eq!(c.trl.train.epochs, 3);
//! assert_eq!(c.trl.method.num_generations, 4);
//! assert_eq!(c.data.test_size, 0.1);
//! assert_eq!(c.reward.len(), 1);
//! // an unknown field is named, wherever it is
//! let err = RlConfig::<GrpoMethodConfig>::from_toml_str("[method]\nnum_generation = 4\n", None)
//!     .unwrap_err();
//! assert!(err.to_string().contains("num_generation"), "{err}");
//! ```

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Serialize};
use tch::Device;

use super::generate::{generate_all, score_samples, GenerationSettings};
use super::log::RunLog;
use super::{bar, fail, load_model, new_store, Inputs, Output, TrainArgs};
use crate::data::llm::prepare::Encoder;
use crate::data::llm::{Dataset, DatasetFormat};
use crate::envs::llm::rewards::{build_parts, RewardEntry, RewardScorer};
use crate::envs::llm::{TokenEnv, TokenEnvConfig};
use crate::error::{Error, Result};
use crate::modules::llm::lora::{load_adapter, merge_and_unload, save_adapter, LoraConfig};
use crate::modules::llm::{CausalLm, CausalLmWithIlqlHeads, HfTokenizer, TextTokenizer};
use crate::rng::Generator;
use crate::trainers::api::{Callbacks, RlTrainer};
use crate::trainers::checkpoint::CheckpointStore;
use crate::trainers::config::{MethodConfig, PpoMethodConfig, TrlConfigOf};
use crate::trainers::dpo::{DpoMethodConfig, DpoTrainer};
use crate::trainers::grpo::{GrpoMethodConfig, GrpoTrainer};
use crate::trainers::ilql::data::{IlqlDataConfig, IlqlDataset};
use crate::trainers::ilql::{IlqlMethodConfig, IlqlTrainer};
use crate::trainers::policy::hydra_policy;
use crate::trainers::ppo::PpoRlhfTrainer;

/// The `[data]` table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DataSettings {
    /// The fraction (or, ≥ 1, the count) of examples held out for evaluation (`datasets`'
    /// name). Default `0`: none.
    pub test_size: f64,
    /// Examples whose prompt (PPO, GRPO) or longest row (DPO, ILQL) has more tokens are
    /// dropped and counted. Default none (the model's context decides).
    pub drop_longer_than: Option<usize>,
}

impl Default for DataSettings {
    fn default() -> Self {
        DataSettings {
            test_size: 0.0,
            drop_longer_than: None,
        }
    }
}

/// A `ppo` / `grpo` / `dpo` / `ilql` config file (see the [module docs](self)).
#[derive(Debug, Clone, PartialEq)]
pub struct RlConfig<M: MethodConfig> {
    /// trlX's sections.
    pub trl: TrlConfigOf<M>,
    /// `[data]`.
    pub data: DataSettings,
    /// `[[reward]]`.
    pub reward: Vec<RewardEntry>,
    /// `[generation]`.
    pub generation: GenerationSettings,
}

impl<M: MethodConfig> RlConfig<M> {
    /// Parses a config file's text (`path` names it in errors): our tables are taken out, the
    /// rest is trlX's config (validated).
    ///
    /// # Errors
    /// Invalid TOML, an unknown field (named, in any table), or an invalid value.
    pub fn from_toml_str(text: &str, path: Option<&Path>) -> Result<Self> {
        let shown = path.map_or_else(|| "<config>".to_string(), |p| p.display().to_string());
        let bad = |e: String| Error::InvalidFile {
            op: "torchrl: --config",
            path: shown.clone(),
            reason: e,
        };
        let mut table: toml::Table = toml::from_str(text).map_err(|e| bad(e.to_string()))?;
        let take = |t: &mut toml::Table, key: &str| t.remove(key);
        let data = match take(&mut table, "data") {
            Some(v) => v
                .try_into::<DataSettings>()
                .map_err(|e| bad(format!("[data]: {e}")))?,
            None => DataSettings::default(),
        };
        let reward = match take(&mut table, "reward") {
            Some(v) => v
                .try_into::<Vec<RewardEntry>>()
                .map_err(|e| bad(format!("[[reward]]: {e}")))?,
            None => Vec::new(),
        };
        let generation = match take(&mut table, "generation") {
            Some(v) => v
                .try_into::<GenerationSettings>()
                .map_err(|e| bad(format!("[generation]: {e}")))?,
            None => GenerationSettings::default(),
        };
        let rest = toml::to_string(&table).map_err(|e| bad(e.to_string()))?;
        let trl = TrlConfigOf::<M>::from_toml_str(&rest).map_err(|e| e.context(shown.clone()))?;
        generation.to_config()?;
        if !(data.test_size.is_finite() && data.test_size >= 0.0) {
            return Err(Error::config(
                "[data]",
                "test_size",
                "0 (none), a fraction in (0, 1) or a count",
                data.test_size,
            ));
        }
        Ok(RlConfig {
            trl,
            data,
            reward,
            generation,
        })
    }

    fn from_file(path: Option<&Path>) -> Result<Self> {
        let text = super::read_config_text(path)?;
        Self::from_toml_str(&text, path)
    }
}

/// What an RL run measured.
#[derive(Debug, Clone, PartialEq)]
pub struct RlSummary {
    /// Iterations (PPO, GRPO) or epochs (DPO, ILQL) in all.
    pub iterations: usize,
    /// Held-out mean reward before and after training (PPO, GRPO with `test_size`; `NaN`
    /// otherwise).
    pub eval_before: f64,
    /// See `eval_before`.
    pub eval_after: f64,
    /// The last training statistic: mean score (PPO, GRPO) or loss (DPO, ILQL).
    pub last: f64,
    /// Examples dropped for length.
    pub dropped: usize,
    /// The trained model's folder.
    pub model_dir: PathBuf,
}

/// The config and inputs shared by the four commands.
struct Common<M: MethodConfig> {
    config: RlConfig<M>,
    inputs: Inputs,
}

fn common<M: MethodConfig>(args: &TrainArgs) -> Result<Common<M>> {
    let mut config = RlConfig::<M>::from_file(args.config.as_deref())?;
    if args.from_scratch && config.trl.model.peft_config.is_some() {
        return Err(Error::config(
            "[model]",
            "peft_config",
            "no LoRA with --from-scratch: adapters train on the folder's pretrained weights, \
             and the merged model is those weights plus the adapter",
            "a peft_config",
        ));
    }
    let inputs = Inputs::load(args, config.data.test_size, config.trl.train.seed)?;
    // checkpoints go to the output folder, at iteration boundaries (see the module docs)
    config.trl.train.checkpoint_dir = args.output.join("checkpoints").display().to_string();
    Ok(Common { config, inputs })
}

impl<M: MethodConfig> Common<M> {
    fn encoder(&self) -> Encoder<'_> {
        self.inputs.encoder(self.config.data.drop_longer_than)
    }
}

/// The policy's output folders: the model (merged when LoRA is on) and the adapter.
fn save_policy(
    out: &Output,
    args: &TrainArgs,
    policy: &dyn CausalLm,
    peft: Option<&LoraConfig>,
) -> Result<PathBuf> {
    match peft {
        None => out.save_folder("model", &args.model, |dir| policy.save_pretrained(dir)),
        Some(lora) => {
            let adapter = out.save_folder("adapter", &args.model, |dir| {
                save_adapter(policy, lora, dir)
            })?;
            // the merged model: the base again, the saved adapter loaded and folded in
            out.save_folder("model", &args.model, |dir| {
                let vs = new_store(args.dtype);
                let mut base = load_model(&vs.root(), &args.model, false)?;
                load_adapter(base.as_mut(), &(vs.root() / "lora"), &adapter)?;
                merge_and_unload(base.as_mut())?;
                base.save_pretrained(dir)
            })
        }
    }
}

/// Held-out mean reward of `model`'s greedy (or `[generation]`) completions.
fn held_out_reward(
    model: &dyn CausalLm,
    prompts: &[(usize, Vec<i64>)],
    scorer: &mut RewardScorer<HfTokenizer>,
    settings: &GenerationSettings,
    max_new_tokens: i64,
    pad: i64,
    eos: i64,
) -> Result<f64> {
    if prompts.is_empty() {
        return Ok(f64::NAN);
    }
    let mut gen_config = settings.to_config()?;
    gen_config.max_new_tokens = max_new_tokens;
    let mut rng = Generator::new(settings.seed);
    let samples = generate_all(
        model,
        prompts,
        &gen_config,
        settings.batch_size,
        pad,
        &mut rng,
        &indicatif::ProgressBar::hidden(),
    )?;
    let ids: Vec<Vec<i64>> = prompts.iter().map(|(_, p)| p.clone()).collect();
    let scores = score_samples(scorer, &ids, &samples, pad, eos)?;
    let finite: Vec<f64> = scores.into_iter().filter(|s| s.is_finite()).collect();
    Ok(finite.iter().sum::<f64>() / finite.len().max(1) as f64)
}

/// Which on-policy method runs.
enum OnPolicy {
    Ppo(Box<PpoRlhfTrainer>),
    Grpo(Box<GrpoTrainer>),
}

impl OnPolicy {
    fn trainer(&mut self) -> &mut dyn RlTrainer {
        match self {
            OnPolicy::Ppo(t) => t.as_mut(),
            OnPolicy::Grpo(t) => t.as_mut(),
        }
    }

    fn iteration(&mut self) -> Result<crate::trainers::ppo::IterationStats> {
        let mut cb = Callbacks::new();
        match self {
            OnPolicy::Ppo(t) => t.iteration(&mut cb),
            OnPolicy::Grpo(t) => t.iteration(&mut cb),
        }
    }

    fn epoch(&self) -> usize {
        match self {
            OnPolicy::Ppo(t) => t.epoch(),
            OnPolicy::Grpo(t) => t.epoch(),
        }
    }

    fn policy(&self) -> &dyn CausalLm {
        match self {
            OnPolicy::Ppo(t) => t.model().policy().model(),
            OnPolicy::Grpo(t) => t.model().policy().model(),
        }
    }
}

/// The reward scorer of the `[[reward]]` tables, knowing each prompt's other columns.
fn scorer_for(
    entries: &[RewardEntry],
    tokenizer: &HfTokenizer,
    data: &Dataset,
    prompts: &[(usize, Vec<i64>)],
) -> Result<RewardScorer<HfTokenizer>> {
    if entries.is_empty() {
        return Err(fail(
            "torchrl",
            "the config has no [[reward]] table: ppo and grpo need a reward (answer_match, \
             format, reward_model, command, …)",
        ));
    }
    let parts = build_parts(entries, Device::Cpu)?;
    let rows = prompts.iter().map(|(i, ids)| {
        (
            ids.clone(),
            data.examples()
                .get(*i)
                .map(|e| e.fields.clone())
                .unwrap_or_default(),
        )
    });
    Ok(RewardScorer::new(tokenizer.clone(), parts)?
        .with_rows(rows)?
        .with_eos_token_id(tokenizer.eos_token_id().unwrap_or(0)))
}

fn on_policy<M: MethodConfig>(
    args: &TrainArgs,
    what: &'static str,
    build: impl FnOnce(
        &RlConfig<M>,
        crate::modules::llm::CausalLmWithHydraValueHead,
        TokenEnv,
        Box<dyn TextTokenizer>,
    ) -> Result<OnPolicy>,
    env_config: impl FnOnce(&RlConfig<M>, TokenEnvConfig) -> (TokenEnvConfig, i64),
    peft: impl Fn(&RlConfig<M>) -> Option<LoraConfig>,
) -> Result<RlSummary> {
    let c = common::<M>(args)?;
    let fmt = c.inputs.train.format();
    if fmt == DatasetFormat::LanguageModeling {
        return Err(fail(
            "torchrl",
            format!(
                "{what} samples completions for prompts: {} has no \"prompt\" column",
                args.data.display()
            ),
        ));
    }
    let enc = c.encoder();
    let (prompts, test_prompts, dropped) = c.inputs.rows(|d| enc.prompts(d))?;
    let scorer = scorer_for(
        &c.config.reward,
        &c.inputs.tokenizer,
        &c.inputs.train,
        &prompts,
    )?;
    let mut eval_scorer = match &c.inputs.test {
        Some(t) => Some(scorer_for(
            &c.config.reward,
            &c.inputs.tokenizer,
            t,
            &test_prompts,
        )?),
        None => None,
    };
    tch::manual_seed(c.config.trl.train.seed as i64);
    let vs = new_store(args.dtype);
    let base = load_model(&vs.root(), &args.model, args.from_scratch)?;
    let model = hydra_policy(&vs.root(), base, &c.config.trl.model)?;
    let (env_cfg, max_new) = env_config(
        &c.config,
        TokenEnvConfig::for_model(model.policy().model().facts())
            .with_shuffle(true)
            .with_seed(c.config.trl.train.seed),
    );
    let ids: Vec<Vec<i64>> = prompts.iter().map(|(_, p)| p.clone()).collect();
    let env = TokenEnv::new(env_cfg, ids, Box::new(scorer))?;
    let mut run = build(&c.config, model, env, Box::new(c.inputs.tokenizer.clone()))?;
    let pad = c.inputs.tokenizer.pad_token_id().unwrap_or(0);
    let eos = c.inputs.tokenizer.eos_token_id().unwrap_or(0);
    let out = Output::create(&args.output)?;
    out.guard(|| {
        let store = CheckpointStore::new(out.checkpoints());
        let mut eval_before = f64::NAN;
        if let Some(s) = eval_scorer.as_mut() {
            eval_before = held_out_reward(
                run.policy(),
                &test_prompts,
                s,
                &c.config.generation,
                max_new,
                pad,
                eos,
            )?;
        }
        if args.resume {
            if let Some(ckpt) = store.load_latest()? {
                run.trainer().load_checkpoint(ckpt)?;
            }
        }
        let columns = [
            "step",
            "score",
            "kl",
            "kl_coef",
            "response_length",
            "loss",
            "eval_reward",
            "seconds",
        ];
        let start = run.epoch();
        let mut log = if args.resume {
            RunLog::resume(&out.dir, &columns, what, start as f64)?
        } else {
            RunLog::new(&out.dir, &columns, what)?
        };
        let epochs = c.config.trl.train.epochs;
        let pb = bar(epochs as u64, what, args.quiet);
        pb.set_position(start as u64);
        let every = c.config.trl.train.checkpoint_interval.max(1);
        let eval_every = c.config.trl.train.eval_interval.max(1);
        let (mut last_ckpt, mut last_eval) =
            (run.trainer().iter_count(), run.trainer().iter_count());
        let mut last = f64::NAN;
        let mut eval_reward = eval_before;
        for _ in start..epochs {
            let t0 = Instant::now();
            let s = run.iteration()?;
            last = s.score;
            let steps = run.trainer().iter_count();
            let mut eval_now = f64::NAN;
            if let Some(sc) = eval_scorer.as_mut() {
                if steps - last_eval >= eval_every || run.epoch() == epochs {
                    eval_reward = held_out_reward(
                        run.policy(),
                        &test_prompts,
                        sc,
                        &c.config.generation,
                        max_new,
                        pad,
                        eos,
                    )?;
                    eval_now = eval_reward;
                    last_eval = steps;
                }
            }
            log.push(&[
                run.epoch() as f64,
                s.score,
                s.kl,
                s.kl_coef,
                s.response_length,
                s.update.get("loss").copied().unwrap_or(f64::NAN),
                eval_now,
                t0.elapsed().as_secs_f64(),
            ])?;
            if !args.quiet {
                pb.suspend(|| {
                    println!(
                        "iteration {:>4}  score {:.4}  KL {:.4}  eval reward {:.4}",
                        run.epoch(),
                        s.score,
                        s.kl,
                        eval_reward
                    )
                });
            }
            if steps - last_ckpt >= every || run.epoch() == epochs {
                run.trainer().save(&out.checkpoints())?;
                last_ckpt = steps;
            }
            pb.set_message(format!("score {:.3}", s.score));
            pb.inc(1);
        }
        pb.finish();
        let lora = peft(&c.config);
        let model_dir = save_policy(&out, args, run.policy(), lora.as_ref())?;
        if !args.quiet {
            println!(
                "{what}: held-out reward {eval_before:.4} -> {eval_reward:.4}; wrote {}",
                model_dir.display()
            );
        }
        Ok(RlSummary {
            iterations: run.epoch(),
            eval_before,
            eval_after: eval_reward,
            last,
            dropped,
            model_dir,
        })
    })
}

/// `torchrl ppo`: trlX's PPO-RLHF on the dataset's prompts (see the [module docs](self)).
///
/// # Errors
/// Bad arguments, data, config or model folder (before the output folder is created); no
/// `[[reward]]`; a failing iteration.
pub fn run_ppo(args: &TrainArgs) -> Result<RlSummary> {
    on_policy::<PpoMethodConfig>(
        args,
        "ppo",
        |c, model, env, tok| {
            Ok(OnPolicy::Ppo(Box::new(PpoRlhfTrainer::new(
                c.trl.clone(),
                model,
                env,
                tok,
            )?)))
        },
        |c, e| {
            let m = &c.trl.method;
            let max_new = m.experience_gen_kwargs().max_new_tokens as i64;
            (
                e.with_max_new_tokens(max_new)
                    .with_batch_size(m.chunk_size as i64),
                max_new,
            )
        },
        |c| c.trl.model.peft_config.clone(),
    )
}

/// `torchrl grpo`: TRL's GRPO on the dataset's prompts (see the [module docs](self)).
///
/// # Errors
/// As [`run_ppo`].
pub fn run_grpo(args: &TrainArgs) -> Result<RlSummary> {
    on_policy::<GrpoMethodConfig>(
        args,
        "grpo",
        |c, model, env, tok| {
            Ok(OnPolicy::Grpo(Box::new(GrpoTrainer::new(
                c.trl.clone(),
                model,
                env,
                tok,
            )?)))
        },
        |c, e| {
            let m = &c.trl.method;
            let max_new = m.gen_kwargs.max_new_tokens as i64;
            (
                e.with_max_new_tokens(max_new)
                    .with_batch_size(m.chunk_size as i64)
                    .with_num_generations(m.num_generations as i64),
                max_new,
            )
        },
        |c| c.trl.model.peft_config.clone(),
    )
}

/// Epoch-based training shared by DPO and ILQL: `epochs` calls of `epoch`, a log row and a
/// checkpoint after each as due.
#[allow(clippy::too_many_arguments)]
fn epochs_loop<T: RlTrainer>(
    what: &str,
    args: &TrainArgs,
    out: &Output,
    trainer: &mut T,
    epochs: usize,
    every: usize,
    current_epoch: impl Fn(&T) -> usize,
    mut epoch: impl FnMut(&mut T) -> Result<(f64, f64)>,
) -> Result<f64> {
    let store = CheckpointStore::new(out.checkpoints());
    if args.resume {
        if let Some(ckpt) = store.load_latest()? {
            trainer.load_checkpoint(ckpt)?;
        }
    }
    let start = current_epoch(trainer);
    let columns = ["epoch", "loss", "eval", "seconds"];
    let mut log = if args.resume {
        RunLog::resume(&out.dir, &columns, what, start as f64)?
    } else {
        RunLog::new(&out.dir, &columns, what)?
    };
    let pb = bar(epochs as u64, what, args.quiet);
    pb.set_position(start as u64);
    let mut last_ckpt = trainer.iter_count();
    let mut last = f64::NAN;
    for _ in start..epochs {
        let t0 = Instant::now();
        let (loss, eval) = epoch(trainer)?;
        last = loss;
        let e = current_epoch(trainer);
        log.push(&[e as f64, loss, eval, t0.elapsed().as_secs_f64()])?;
        if !args.quiet {
            pb.suspend(|| println!("epoch {e:>4}  loss {loss:.4}  eval {eval:.4}"));
        }
        let steps = trainer.iter_count();
        if steps - last_ckpt >= every || e == epochs {
            trainer.save(&out.checkpoints())?;
            last_ckpt = steps;
        }
        pb.set_message(format!("loss {loss:.4}"));
        pb.inc(1);
    }
    pb.finish();
    Ok(last)
}

/// `torchrl dpo`: DPO on preference pairs (see the [module docs](self)); with `test_size`,
/// the held-out implicit-reward accuracy is logged each epoch.
///
/// # Errors
/// As [`run_ppo`]; data that is not preference pairs.
pub fn run_dpo(args: &TrainArgs) -> Result<RlSummary> {
    let c = common::<DpoMethodConfig>(args)?;
    let enc = c.encoder();
    let (pairs, test, dropped) = c.inputs.rows(|d| enc.dpo_pairs(d))?;
    tch::manual_seed(c.config.trl.train.seed as i64);
    let vs = new_store(args.dtype);
    let base = load_model(&vs.root(), &args.model, args.from_scratch)?;
    let model = hydra_policy(&vs.root(), base, &c.config.trl.model)?;
    let mut trainer = DpoTrainer::new(
        c.config.trl.clone(),
        model,
        pairs,
        Box::new(c.inputs.tokenizer.clone()),
    )?;
    let out = Output::create(&args.output)?;
    out.guard(|| {
        let last = epochs_loop(
            "dpo",
            args,
            &out,
            &mut trainer,
            c.config.trl.train.epochs,
            c.config.trl.train.checkpoint_interval.max(1),
            |t| t.epoch(),
            |t| {
                let s = t.train_epoch(&mut Callbacks::new())?;
                let eval = if test.is_empty() {
                    f64::NAN
                } else {
                    t.evaluate_pairs(&test)?
                        .get("rewards/accuracies")
                        .copied()
                        .unwrap_or(f64::NAN)
                };
                Ok((s.get("loss").copied().unwrap_or(f64::NAN), eval))
            },
        )?;
        let peft = c.config.trl.model.peft_config.clone();
        let model_dir = save_policy(&out, args, trainer.model().policy().model(), peft.as_ref())?;
        Ok(RlSummary {
            iterations: trainer.epoch(),
            eval_before: f64::NAN,
            eval_after: f64::NAN,
            last,
            dropped,
            model_dir,
        })
    })
}

/// `torchrl ilql`: ILQL on scored samples (see the [module docs](self)). `OUTPUT/model` is the
/// trained language model; the Q / V heads that β-shaped generation adds are in the
/// checkpoints.
///
/// # Errors
/// As [`run_ppo`]; data that is not scored samples.
pub fn run_ilql(args: &TrainArgs) -> Result<RlSummary> {
    let c = common::<IlqlMethodConfig>(args)?;
    if c.inputs.test.is_some() {
        return Err(Error::config(
            "[data]",
            "test_size",
            "0 for ilql (it trains offline on every scored sample)",
            c.config.data.test_size,
        ));
    }
    let enc = c.encoder();
    let (samples, dropped) = enc.ilql_samples(&c.inputs.train)?;
    let data = IlqlDataset::from_token_rows(
        &samples,
        &IlqlDataConfig::new().with_seq_length(c.config.trl.train.seq_length),
    )?;
    tch::manual_seed(c.config.trl.train.seed as i64);
    let vs = new_store(args.dtype);
    let trunk = load_model(&vs.root(), &args.model, args.from_scratch)?;
    let m = &c.config.trl.method;
    let model = CausalLmWithIlqlHeads::from_model(&vs.root(), trunk, m.two_qs, m.alpha)?;
    let mut trainer = IlqlTrainer::new(
        c.config.trl.clone(),
        vs,
        model,
        data,
        Box::new(c.inputs.tokenizer.clone()),
    )?;
    let out = Output::create(&args.output)?;
    out.guard(|| {
        let last = epochs_loop(
            "ilql",
            args,
            &out,
            &mut trainer,
            c.config.trl.train.epochs,
            c.config.trl.train.checkpoint_interval.max(1),
            |t| t.epoch(),
            |t| {
                let s = t.train_epoch(&mut Callbacks::new())?;
                Ok((s.get("loss").copied().unwrap_or(f64::NAN), f64::NAN))
            },
        )?;
        let model_dir = out.save_folder("model", &args.model, |dir| {
            trainer.model().model().save_pretrained(dir)
        })?;
        Ok(RlSummary {
            iterations: trainer.epoch(),
            eval_before: f64::NAN,
            eval_after: f64::NAN,
            last,
            dropped,
            model_dir,
        })
    })
}
