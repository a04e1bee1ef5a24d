//! The flagship: the RLHF pipeline end to end, in Rust, on two CPU cores, in a few minutes.
//!
//! The task is embedded ([`task`]): prompts are three letters and a colon (`"kqz:"`),
//! responses are lowercase words, and a *hidden rule* (the fraction of vowels in the
//! response) decides which of two responses people "prefer". Nothing below sees the rule
//! except the preference labels and the final report.
//!
//! 1. **SFT**: a small GPT-2 (2 blocks × 64 wide, the byte-level tokenizer) learns the
//!    rule-blind corpus (`trainers::sft`). `--arch llama` makes it a Llama of the same size
//!    instead; `--model DIR` starts from a Hugging Face folder (any supported architecture,
//!    with its `tokenizer.json`) instead of a fresh model.
//! 2. **Reward model**: a sequence-score model of the same architecture (from scratch, or the
//!    folder's weights under a fresh score head, as TRL's reward trainer starts) learns the
//!    preference pairs (Bradley-Terry, `trainers::reward`); its held-out accuracy is reported.
//! 3. **PPO-RLHF** (`trainers::ppo`): the SFT model becomes a hydra policy (its top block and
//!    a value head train; the frozen copy of the top block is the KL reference), samples
//!    responses in the token env, the reward model scores them, a per-token KL penalty keeps
//!    it near the SFT model, and PPO updates it. Each iteration prints a row: the reward
//!    model's score, the true (hidden-rule) score, the KL to the reference, and how often
//!    the reward model orders two rollouts as the hidden rule does.
//!
//! 4. **ILQL** (`trainers::ilql`), offline: 2048 samples of the SFT policy scored by the
//!    hidden rule are the dataset; ILQL (two Q heads with Polyak targets, expectile V, CQL,
//!    AWAC) learns from them alone, and trlX's β sweep (`log π + β (Q − V)`, β ∈ {0, 1, 4, 16})
//!    generates on the held-out prompts.
//!
//! 5. **GRPO** (`trainers::grpo`): the SFT model again as a hydra policy, groups of 8
//!    completions per prompt scored by the reward model, TRL's group advantages, DAPO's loss
//!    with clip-higher and a k3 KL term to the reference; no value model.
//! 6. **DPO** (`trainers::dpo`): the SFT model trained directly on the preference pairs the
//!    reward model learned from; no reward model, no sampling.
//!
//! Before / after: the hidden-rule score of samples on held-out prompts from the SFT policy
//! and from the trained one; for ILQL, the behaviour data's mean score and each β's; then a
//! comparison table of SFT / PPO / GRPO / DPO / ILQL: hidden-rule score on the held-out
//! prompts, the exact KL of each trained sampler to the SFT model, and each stage's wall time
//! (`compare.rs`).
//!
//! Written to the output folder: `rlhf_log.csv` (one row per PPO iteration),
//! `rlhf_curves.png` (score and KL curves), `ilql_beta_sweep.png`, `sft/` and `reward_model/`
//! (`transformers`-layout folders) and `checkpoints/` (atomic PPO checkpoints).
//!
//! Run: `cargo run --release --example rlhf` (the README's first command runs it through
//! `scripts/demo.sh`). Options: `--out DIR` (default `target/rlhf`), `--iterations N`
//! (default 200; PPO's and GRPO's), `--seed S` (default 0), `--resume` (continue PPO from the
//! last checkpoint in `DIR/checkpoints`, reusing `DIR/sft` and `DIR/reward_model`; the later
//! stages run again), `--quiet`, `--arch gpt2|llama` (the embedded model's architecture;
//! default `gpt2`), `--model DIR` (a Hugging Face folder: `config.json`, the weights and
//! `tokenizer.json`; its `eos_token_id` / `pad_token_id`, or `generation_config.json`'s, name
//! the special tokens), `--lora R` (PPO, GRPO and DPO train LoRA adapters of rank R on every
//! linear layer of the blocks against the adapters-off base, instead of trlX's hydra). The
//! learning rates suit small models trained from scratch; a large pretrained folder wants
//! smaller ones.

mod compare;
mod task;

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};
use tch::{nn, Device, Kind, Tensor};
use torchrl::cli::log::register_font;
use torchrl::envs::llm::{RewardModelScorer, TokenEnv, TokenEnvConfig};
use torchrl::modules::llm::{
    generate, ilql_generate, models, pad_rows, ByteTokenizer, CausalLm, CausalLmConfig,
    CausalLmWithIlqlHeads, CausalLmWithScoreHead, GenerationConfig, Gpt2Config,
    IlqlGenerationConfig, LoraConfig, PaddingSide, SpecialTokens, TextTokenizer,
};
use torchrl::trainers::api::{Callbacks, Evaluation, RlTrainer};
use torchrl::trainers::checkpoint::CheckpointStore;
use torchrl::trainers::config::{GenKwargs, ModelConfig, ScaleReward, TrlConfig};
use torchrl::trainers::dpo::DpoPair;
use torchrl::trainers::ilql::data::{IlqlDataConfig, IlqlDataset, IlqlTokenSample};
use torchrl::trainers::ilql::{BetaSweep, IlqlTrainer, IlqlTrlConfig};
use torchrl::trainers::parallel::{rank_seed, Collective, SharedCollective};
use torchrl::trainers::policy::hydra_policy;
use torchrl::trainers::ppo::{IterationStats, PpoRlhfTrainer};
use torchrl::trainers::reward::{PreferencePair, RewardModelTrainer, RewardTrainerConfig};
use torchrl::trainers::sft::{SftConfig, SftTrainer};
use torchrl::{Error, Generator, Result};

/// Response lengths of the corpus and the pairs.
const MIN_WORD: usize = 4;
const MAX_WORD: usize = 10;
/// Tokens a response may take (a word and EOS fit).
const MAX_NEW_TOKENS: i64 = 12;

/// The architecture of the embedded model (trained from scratch on the byte tokenizer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// GPT-2: 2 blocks × 64 wide, 4 heads, learned positions, GELU MLP.
    Gpt2,
    /// Llama: 2 blocks × 64 wide, 4 heads over 2 key-value heads, rotary positions, RMSNorm,
    /// a SwiGLU MLP of about GPT-2's parameter count, tied embeddings.
    Llama,
}

impl Arch {
    /// The embedded model's config.
    pub fn config(self) -> Result<Box<dyn CausalLmConfig>> {
        let tok = ByteTokenizer::new();
        Ok(match self {
            Arch::Gpt2 => Box::new(
                Gpt2Config::new(tok.vocab_size())
                    .with_n_positions(32)
                    .with_n_embd(64)
                    .with_n_layer(2)
                    .with_n_head(4)
                    .with_special_tokens(
                        tok.bos_token_id(),
                        tok.eos_token_id(),
                        tok.pad_token_id(),
                    ),
            ),
            Arch::Llama => {
                let json = serde_json::json!({
                    "model_type": "llama", "vocab_size": tok.vocab_size(), "hidden_size": 64,
                    "intermediate_size": 176, "num_hidden_layers": 2,
                    "num_attention_heads": 4, "num_key_value_heads": 2,
                    "max_position_embeddings": 32, "tie_word_embeddings": true,
                    "initializer_range": 0.02, "rope_theta": 10000.0,
                    "bos_token_id": tok.bos_token_id(), "eos_token_id": tok.eos_token_id(),
                    "pad_token_id": tok.pad_token_id()
                });
                let cfg: models::llama::LlamaConfig = serde_json::from_value(json)
                    .map_err(|e| fail(format!("the embedded Llama config: {e}")))?;
                Box::new(cfg)
            }
        })
    }
}

/// The run's settings (the CLI knobs, and the sizes the smoke test shrinks).
#[derive(Debug, Clone)]
pub struct Config {
    /// A Hugging Face model folder to start from (`None`: the embedded model of `arch`).
    pub model: Option<PathBuf>,
    /// The embedded model's architecture (without `model`).
    pub arch: Arch,
    pub out: PathBuf,
    pub seed: u64,
    pub resume: bool,
    pub quiet: bool,
    /// SFT optimizer steps and corpus rows.
    pub sft_steps: usize,
    pub corpus: usize,
    /// Reward-model optimizer steps, training pairs and held-out pairs.
    pub rm_steps: usize,
    pub pairs: usize,
    pub test_pairs: usize,
    /// PPO iterations (rollout + updates) and rollouts per iteration.
    pub iterations: usize,
    pub rollouts: usize,
    /// Held-out prompts for the before / after report.
    pub eval_prompts: usize,
    /// Minibatch size (SFT, reward model and PPO).
    pub batch: usize,
    /// ILQL: behaviour samples (from the SFT policy, scored by the hidden rule) and passes
    /// over them.
    pub ilql_samples: usize,
    pub ilql_epochs: usize,
    /// DPO: passes over the reward model's training pairs.
    pub dpo_epochs: usize,
    /// PPO iterations between checkpoints (a resumed run continues from the last one).
    pub checkpoint_every: usize,
    /// Stops the run with an error at this point, as a kill would (tests of `--resume`).
    pub fail_at: Option<FailAt>,
    /// `--lora R`: PPO, GRPO and DPO train LoRA adapters of rank `R` on every linear layer
    /// (`lora_alpha = 2R`) with the base frozen and the adapters-off base as the reference,
    /// instead of trlX's hydra (the top block trains, its frozen copy is the reference).
    pub lora: Option<i64>,
}

/// Where [`Config::fail_at`] stops a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailAt {
    /// After this many SFT steps (before anything is saved).
    SftStep(usize),
    /// After this many PPO iterations (their CSV rows written).
    PpoIteration(usize),
    /// At the start of the GRPO stage (PPO and ILQL done).
    Grpo,
}

fn killed(at: FailAt) -> Error {
    fail(format!("stopped at {at:?} (Config::fail_at)"))
}

impl Default for Config {
    fn default() -> Self {
        Config {
            model: None,
            arch: Arch::Gpt2,
            out: PathBuf::from("target/rlhf"),
            seed: 0,
            resume: false,
            quiet: false,
            sft_steps: 300,
            corpus: 4096,
            rm_steps: 300,
            pairs: 4096,
            test_pairs: 512,
            iterations: 200,
            rollouts: 64,
            eval_prompts: 256,
            batch: 32,
            ilql_samples: 2048,
            ilql_epochs: 6,
            dpo_epochs: 2,
            checkpoint_every: 5,
            fail_at: None,
            lora: None,
        }
    }
}

fn fail(message: impl Into<String>) -> Error {
    Error::InvalidArgument {
        op: "rlhf",
        message: message.into(),
    }
}

/// The process group when the flagship runs under `torchrl-launch` (torchrun's `WORLD_SIZE`
/// is set), built with `--features distributed`; `None` in a plain run.
#[cfg(feature = "distributed")]
fn launched() -> Result<Option<torchrl::distributed::ProcessGroup>> {
    if std::env::var_os("WORLD_SIZE").is_none() {
        return Ok(None);
    }
    Ok(Some(torchrl::distributed::ProcessGroup::init_from_env()?))
}

/// Without the `distributed` feature there is no process group; a launch with
/// `WORLD_SIZE > 1` is refused rather than run N times independently.
#[cfg(not(feature = "distributed"))]
fn launched() -> Result<Option<torchrl::trainers::parallel::SingleProcess>> {
    match std::env::var("WORLD_SIZE").ok().and_then(|w| w.parse::<usize>().ok()) {
        Some(w) if w > 1 => Err(fail(format!(
            "WORLD_SIZE = {w}: build the flagship with `--features distributed` to run it on several processes"
        ))),
        _ => Ok(None),
    }
}

impl Config {
    pub fn from_args() -> Result<Self> {
        let mut cfg = Config::default();
        let mut args = std::env::args().skip(1);
        let usage = "usage: rlhf [--out DIR] [--iterations N] [--seed S] [--resume] [--quiet] \
                     [--arch gpt2|llama] [--model DIR] [--lora R]";
        while let Some(arg) = args.next() {
            match arg.as_str() {
                "--resume" => cfg.resume = true,
                "--quiet" => cfg.quiet = true,
                "--arch" | "--model" => {
                    let v = args
                        .next()
                        .ok_or_else(|| fail(format!("{arg} needs a value ({usage})")))?;
                    match (arg.as_str(), v.as_str()) {
                        ("--model", _) => cfg.model = Some(PathBuf::from(v)),
                        (_, "gpt2") => cfg.arch = Arch::Gpt2,
                        (_, "llama") => cfg.arch = Arch::Llama,
                        _ => return Err(fail(format!("--arch {v:?}: gpt2 or llama ({usage})"))),
                    }
                }
                "--lora" => {
                    let v = args
                        .next()
                        .ok_or_else(|| fail(format!("{arg} needs a value ({usage})")))?;
                    match v.parse::<i64>() {
                        Ok(r) if r >= 1 => cfg.lora = Some(r),
                        _ => return Err(fail(format!("--lora {v:?}: a rank >= 1 ({usage})"))),
                    }
                }
                "--out" | "--iterations" | "--seed" => {
                    let v = args
                        .next()
                        .ok_or_else(|| fail(format!("{arg} needs a value ({usage})")))?;
                    let bad = |e: std::num::ParseIntError| fail(format!("{arg} {v:?}: {e}"));
                    match arg.as_str() {
                        "--out" => cfg.out = PathBuf::from(&v),
                        "--iterations" => cfg.iterations = v.parse().map_err(bad)?,
                        _ => cfg.seed = v.parse().map_err(bad)?,
                    }
                }
                other => return Err(fail(format!("unknown argument {other:?} ({usage})"))),
            }
        }
        if cfg.iterations == 0 {
            return Err(fail("--iterations must be at least 1"));
        }
        Ok(cfg)
    }

    /// The tokenizer: the byte tokenizer for the embedded model; the folder's
    /// `tokenizer.json` otherwise, its EOS / pad / BOS set to the ids the model's config names
    /// (pad falls back to EOS).
    pub fn tokenizer(&self) -> Result<Box<dyn TextTokenizer>> {
        match &self.model {
            None => Ok(Box::new(ByteTokenizer::new())),
            Some(dir) => Ok(Box::new(torchrl::cli::load_tokenizer(dir)?)),
        }
    }

    /// The policy section of the PPO / GRPO / DPO configs: trlX's hydra with one trainable
    /// block, or LoRA adapters (`--lora R`) with the adapters-off reference.
    pub fn model_config(&self) -> ModelConfig {
        let mut m = ModelConfig {
            num_layers_unfrozen: 1,
            ..ModelConfig::default()
        };
        if let Some(r) = self.lora {
            m.peft_config = Some(
                LoraConfig::new(r)
                    .with_lora_alpha(2.0 * r as f64)
                    .with_all_linear(),
            );
        }
        m
    }

    /// The learning rate of the PPO / GRPO / DPO stages: LoRA's adapters start at zero and
    /// take a larger rate than full fine-tuning (as PEFT's examples do).
    pub fn policy_lr(&self) -> f64 {
        if self.lora.is_some() {
            5e-3
        } else {
            1e-3
        }
    }

    /// The model SFT starts from (and the reward model's trunk): a fresh embedded model, or
    /// the folder's weights.
    fn base_model(&self, root: &nn::Path<'_>) -> Result<Box<dyn CausalLm>> {
        match &self.model {
            Some(dir) => models::from_pretrained(root, dir),
            None => self.arch.config()?.build(root),
        }
    }

    /// Copies the folder's tokenizer files into `dir` (a saved model), so that it loads on its
    /// own; nothing for the embedded model.
    fn copy_tokenizer(&self, dir: &Path) -> Result<()> {
        let Some(src) = &self.model else {
            return Ok(());
        };
        for name in [
            "tokenizer.json",
            "tokenizer_config.json",
            "special_tokens_map.json",
        ] {
            let from = src.join(name);
            if from.exists() {
                fs::copy(&from, dir.join(name)).map_err(|source| Error::Io {
                    op: "rlhf",
                    path: from.display().to_string(),
                    source,
                })?;
            }
        }
        Ok(())
    }
}

/// One row of the per-iteration table (and of the CSV).
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub iteration: usize,
    /// The reward model's mean score of the rollouts.
    pub rm_score: f64,
    /// The hidden rule's mean score of the rollouts.
    pub true_score: f64,
    /// Mean per-sequence KL to the reference (k1) and the coefficient used.
    pub kl: f64,
    pub kl_coef: f64,
    /// How often the reward model orders two rollouts as the hidden rule does.
    pub rm_agreement: f64,
    pub response_length: f64,
    pub loss: f64,
    pub seconds: f64,
}

/// What a run measured.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    pub sft_loss_first: f64,
    pub sft_loss_last: f64,
    pub rm_test_accuracy: f64,
    /// Hidden-rule score on held-out prompts: SFT policy, and after PPO.
    pub score_before: f64,
    pub score_after: f64,
    pub rows: Vec<Row>,
    /// ILQL: the behaviour data's mean hidden-rule score, and the held-out score at each β.
    pub ilql_behaviour_score: f64,
    pub ilql_sweep: Vec<(f64, f64)>,
    /// DPO: accuracy of its implicit reward on the held-out pairs.
    pub dpo_test_accuracy: f64,
    /// The comparison table: SFT, PPO, GRPO, DPO, ILQL.
    pub methods: Vec<compare::MethodRow>,
    pub seconds: f64,
}

fn bar(n: usize, what: &str, quiet: bool) -> ProgressBar {
    if quiet {
        return ProgressBar::hidden();
    }
    let template = format!("{what:>13} [{{bar:24}}] {{pos:>4}}/{{len}} | {{msg}} | {{elapsed}}");
    match ProgressStyle::with_template(&template) {
        Ok(style) => ProgressBar::new(n as u64).with_style(style.progress_chars("=> ")),
        Err(_) => ProgressBar::new(n as u64),
    }
}

/// The SFT corpus: `prompt response EOS` rows of rule-blind words.
fn corpus(rng: &mut Generator, tok: &dyn TextTokenizer, n: usize) -> Result<Vec<Vec<i64>>> {
    let eos = tok.eos_token_id().unwrap_or(0);
    (0..n)
        .map(|_| {
            let text = format!(
                "{}{}",
                task::prompt(rng),
                task::response(rng, MIN_WORD, MAX_WORD)
            );
            let mut ids = tok.encode(&text)?;
            ids.push(eos);
            Ok(ids)
        })
        .collect()
}

/// `n` preference pairs, in both layouts: full rows for the reward model, and prompt /
/// completions for DPO (the same pairs).
fn pairs(
    rng: &mut Generator,
    tok: &dyn TextTokenizer,
    n: usize,
) -> Result<(Vec<PreferencePair>, Vec<DpoPair>)> {
    let eos = tok.eos_token_id().unwrap_or(0);
    let mut rm = Vec::with_capacity(n);
    let mut dpo = Vec::with_capacity(n);
    for _ in 0..n {
        let (p, chosen, rejected) = task::preference(rng, MIN_WORD, MAX_WORD);
        let completion = |r: &str| -> Result<Vec<i64>> {
            let mut ids = tok.encode(r)?;
            ids.push(eos);
            Ok(ids)
        };
        let prompt = tok.encode(&p)?;
        let (c, r) = (completion(&chosen)?, completion(&rejected)?);
        rm.push(PreferencePair::new(
            [prompt.clone(), c.clone()].concat(),
            [prompt.clone(), r.clone()].concat(),
        ));
        dpo.push(DpoPair::new(prompt, c, r));
    }
    Ok((rm, dpo))
}

/// This rank's slice of a global minibatch of `n` draws from `rng`: every rank draws the same
/// `n` indices (so the generators stay in step, and one process draws what it always drew)
/// and keeps the `rank`-th of `world` equal slices.
fn my_draws(
    rng: &mut Generator,
    len: usize,
    n: usize,
    group: Option<&SharedCollective>,
) -> Vec<usize> {
    let all: Vec<usize> = (0..n).map(|_| rng.below(len as u64) as usize).collect();
    let (rank, world) = group.map_or((0, 1), |g| (g.rank(), g.world_size()));
    let per = n / world;
    all.into_iter().skip(rank * per).take(per).collect()
}

fn train_sft(
    cfg: &Config,
    rng: &mut Generator,
    tok: &dyn TextTokenizer,
    vs: &nn::VarStore,
    group: Option<&SharedCollective>,
) -> Result<(Box<dyn CausalLm>, f64, f64)> {
    let model = cfg.base_model(&vs.root())?;
    let rows = corpus(rng, tok, cfg.corpus)?;
    let sft_config = SftConfig::default()
        .with_lr(3e-3)?
        .with_pad_token_id(tok.pad_token_id().unwrap_or(0));
    let mut sft = SftTrainer::new(model.as_ref(), sft_config)?;
    if let Some(g) = group {
        sft = sft.with_collective(g.clone())?;
    }
    let pb = bar(cfg.sft_steps, "SFT", cfg.quiet);
    let (mut first, mut last) = (f64::NAN, f64::NAN);
    for step in 0..cfg.sft_steps {
        let batch: Vec<Vec<i64>> = my_draws(rng, rows.len(), cfg.batch, group)
            .into_iter()
            .map(|i| rows[i].clone())
            .collect();
        last = sft.step(model.as_ref(), &batch)?;
        if step == 0 {
            first = last;
        }
        if cfg.fail_at == Some(FailAt::SftStep(step + 1)) {
            return Err(killed(FailAt::SftStep(step + 1)));
        }
        pb.set_message(format!("loss {last:.3}"));
        pb.inc(1);
    }
    pb.finish();
    Ok((model, first, last))
}

fn train_reward_model(
    cfg: &Config,
    rng: &mut Generator,
    tok: &dyn TextTokenizer,
    vs: &nn::VarStore,
    train: &[PreferencePair],
    test: &[PreferencePair],
    group: Option<&SharedCollective>,
) -> Result<(CausalLmWithScoreHead, f64)> {
    let trunk = cfg.base_model(&vs.root())?;
    let rm = CausalLmWithScoreHead::from_model(&vs.root(), trunk)?;
    let rm_config = RewardTrainerConfig::default()
        .with_lr(1e-3)?
        .with_center_coeff(0.01)
        .with_pad_token_id(tok.pad_token_id().unwrap_or(0));
    let mut trainer = RewardModelTrainer::new(rm, rm_config)?;
    if let Some(g) = group {
        trainer = trainer.with_collective(g.clone())?;
    }
    let pb = bar(cfg.rm_steps, "reward model", cfg.quiet);
    for _ in 0..cfg.rm_steps {
        let batch: Vec<PreferencePair> = my_draws(rng, train.len(), cfg.batch, group)
            .into_iter()
            .map(|i| train[i].clone())
            .collect();
        let s = trainer.step(&batch)?;
        pb.set_message(format!("loss {:.3} acc {:.2}", s.loss, s.accuracy));
        pb.inc(1);
    }
    pb.finish();
    let held_out = trainer.evaluate(test)?;
    Ok((trainer.into_model(), held_out.accuracy))
}

/// The PPO config for one of `world` ranks: each collects and learns on its share of the
/// rollouts and of each minibatch (the global sizes are the flagship's).
fn ppo_config(cfg: &Config, world: usize) -> TrlConfig {
    let mut c = TrlConfig::default();
    c.train.seq_length = 32;
    c.train.epochs = cfg.iterations;
    c.train.total_steps = 1_000_000;
    c.train.batch_size = cfg.batch / world;
    c.train.log_interval = 1_000_000;
    c.train.eval_interval = 1_000_000;
    // checkpoints at iteration boundaries, by the flagship's loop (`Config::checkpoint_every`):
    // a step-interval one lands inside an iteration's updates, which a resume cannot continue
    c.train.checkpoint_interval = usize::MAX;
    c.train.checkpoint_dir = cfg.out.join("checkpoints").display().to_string();
    c.train.seed = cfg.seed;
    c.model = cfg.model_config();
    c.optimizer.kwargs.lr = cfg.policy_lr();
    c.scheduler.kwargs.t_max = 1e12;
    c.scheduler.kwargs.eta_min = cfg.policy_lr();
    let m = &mut c.method;
    m.num_rollouts = cfg.rollouts / world;
    m.chunk_size = cfg.rollouts / world;
    m.ppo_epochs = 4;
    m.init_kl_coef = 0.05;
    m.target = None;
    m.scale_reward = ScaleReward::Running;
    m.cliprange_reward = 10.0;
    m.vf_coef = 1.0;
    m.gen_kwargs = GenKwargs {
        max_new_tokens: MAX_NEW_TOKENS as usize,
        top_k: 0,
        top_p: 1.0,
        do_sample: true,
        temperature: 1.0,
    };
    c
}

/// The hidden-rule scores and the reward model's agreement with them on the store's
/// rollouts.
fn rollout_truth(trainer: &PpoRlhfTrainer, tok: &dyn TextTokenizer) -> Result<(f64, f64)> {
    let store = trainer
        .store()
        .ok_or_else(|| fail("no rollouts after an iteration"))?;
    let resp = store.get_or_err(("tokens", "response"))?;
    let rm = Vec::<f64>::try_from(store.get_or_err(("next", "score"))?.to_kind(Kind::Double))?;
    let (b, r) = resp.size2()?;
    let ids = Vec::<i64>::try_from(resp.reshape([-1]))?;
    let mut truth = Vec::with_capacity(b as usize);
    for row in ids.chunks(r as usize) {
        truth.push(task::hidden_score(&tok.decode(row, SpecialTokens::Skip)?));
    }
    let mut agree = (0usize, 0usize);
    for i in 0..truth.len() {
        for j in (i + 1)..truth.len() {
            if truth[i] != truth[j] {
                agree.1 += 1;
                if (truth[i] > truth[j]) == (rm[i] > rm[j]) {
                    agree.0 += 1;
                }
            }
        }
    }
    let mean = truth.iter().sum::<f64>() / truth.len().max(1) as f64;
    Ok((mean, agree.0 as f64 / agree.1.max(1) as f64))
}

/// Writes the rows to `path` through a temporary file renamed into place (a kill leaves the
/// old file or the new one).
fn write_csv(path: &Path, rows: &[Row]) -> Result<()> {
    let io = |e: std::io::Error| Error::Io {
        op: "rlhf",
        path: path.display().to_string(),
        source: e,
    };
    let tmp = path.with_extension("csv.tmp");
    let mut f = fs::File::create(&tmp).map_err(io)?;
    writeln!(
        f,
        "iteration,rm_score,true_score,kl,kl_coef,rm_agreement,response_length,loss,seconds"
    )
    .map_err(io)?;
    for r in rows {
        writeln!(
            f,
            // shortest exact decimals: a resumed run reads the rows back bit for bit
            "{},{},{},{},{},{},{},{},{}",
            r.iteration,
            r.rm_score,
            r.true_score,
            r.kl,
            r.kl_coef,
            r.rm_agreement,
            r.response_length,
            r.loss,
            r.seconds
        )
        .map_err(io)?;
    }
    f.sync_all().map_err(io)?;
    drop(f);
    fs::rename(&tmp, path).map_err(io)
}

/// The rows of a CSV [`write_csv`] wrote.
fn read_csv(path: &Path) -> Result<Vec<Row>> {
    let text = fs::read_to_string(path).map_err(|source| Error::Io {
        op: "rlhf",
        path: path.display().to_string(),
        source,
    })?;
    let bad = |line: usize, what: &str| fail(format!("{}: line {line}: {what}", path.display()));
    let mut rows = Vec::new();
    for (i, line) in text.lines().enumerate().skip(1) {
        let f: Vec<&str> = line.split(',').collect();
        let [it, rm, truth, kl, coef, agree, len, loss, secs] = f.as_slice() else {
            return Err(bad(i + 1, "expected 9 fields"));
        };
        let num = |s: &str| {
            s.parse::<f64>()
                .map_err(|e| bad(i + 1, &format!("{s:?}: {e}")))
        };
        rows.push(Row {
            iteration: it
                .parse()
                .map_err(|e| bad(i + 1, &format!("iteration {it:?}: {e}")))?,
            rm_score: num(rm)?,
            true_score: num(truth)?,
            kl: num(kl)?,
            kl_coef: num(coef)?,
            rm_agreement: num(agree)?,
            response_length: num(len)?,
            loss: num(loss)?,
            seconds: num(secs)?,
        });
    }
    Ok(rows)
}

/// Saves SFT's first and last loss and the reward model's held-out accuracy beside their
/// folders (a resumed run reports them).
fn write_stage_stats(path: &Path, stats: [f64; 3]) -> Result<()> {
    let json = serde_json::json!({
        "sft_loss_first": stats[0], "sft_loss_last": stats[1], "rm_test_accuracy": stats[2]
    });
    fs::write(path, json.to_string()).map_err(|source| Error::Io {
        op: "rlhf",
        path: path.display().to_string(),
        source,
    })
}

fn read_stage_stats(path: &Path) -> Result<[f64; 3]> {
    let text = fs::read_to_string(path).map_err(|source| Error::Io {
        op: "rlhf",
        path: path.display().to_string(),
        source,
    })?;
    let json: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| fail(format!("{}: {e}", path.display())))?;
    let field = |k: &str| {
        json.get(k)
            .and_then(serde_json::Value::as_f64)
            .ok_or_else(|| fail(format!("{}: no number {k:?}", path.display())))
    };
    Ok([
        field("sft_loss_first")?,
        field("sft_loss_last")?,
        field("rm_test_accuracy")?,
    ])
}

/// One panel of the plot: a title and one named curve.
struct Panel {
    title: &'static str,
    label: &'static str,
    color: plotters::style::RGBColor,
    points: Vec<(f64, f64)>,
}

fn plot(path: &Path, rows: &[Row]) -> std::result::Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;
    let text = register_font();
    let root = BitMapBackend::new(path, (1000, 420)).into_drawing_area();
    root.fill(&WHITE)?;
    let (left, right) = root.split_horizontally(500);
    let x0 = rows.first().map_or(0.0, |r| r.iteration as f64);
    let x1 = rows
        .last()
        .map_or(1.0, |r| r.iteration as f64)
        .max(x0 + 1.0);
    let panels = [
        Panel {
            title: "hidden-rule score of the rollouts",
            label: "true score",
            color: BLUE,
            points: rows
                .iter()
                .map(|r| (r.iteration as f64, r.true_score))
                .collect(),
        },
        Panel {
            title: "KL to the reference (k1, per sequence)",
            label: "KL",
            color: RED,
            points: rows.iter().map(|r| (r.iteration as f64, r.kl)).collect(),
        },
    ];
    for (area, panel) in [&left, &right].into_iter().zip(panels) {
        let (lo, hi) = panel
            .points
            .iter()
            .fold((0.0f64, 1e-3f64), |(a, b), p| (a.min(p.1), b.max(p.1)));
        let mut builder = ChartBuilder::on(area);
        builder
            .margin(12)
            .x_label_area_size(if text { 30 } else { 5 })
            .y_label_area_size(if text { 45 } else { 5 });
        if text {
            builder.caption(panel.title, ("sans-serif", 18));
        }
        let mut chart = builder.build_cartesian_2d(x0..x1, lo..hi * 1.1)?;
        let mut mesh = chart.configure_mesh();
        if text {
            mesh.x_desc("iteration");
        } else {
            mesh.x_labels(0).y_labels(0);
        }
        mesh.draw()?;
        let color = panel.color;
        let series = chart.draw_series(LineSeries::new(panel.points, color.stroke_width(2)))?;
        if text {
            series
                .label(panel.label)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], color));
            chart.configure_series_labels().border_style(BLACK).draw()?;
        }
    }
    root.present()?;
    Ok(())
}

/// The ILQL stage: behaviour samples from the SFT policy on the training prompts, scored by
/// the hidden rule (the returns), ILQL on them, then trlX's β sweep on the held-out prompts.
/// Returns the behaviour data's mean score, the sweep and the comparison table's row. In a
/// group every rank builds the same behaviour data and trains on its slice of each minibatch;
/// rank 0 alone evaluates (the others get `None`).
fn run_ilql(
    cfg: &Config,
    tok: &dyn TextTokenizer,
    sft_dir: &Path,
    prompts: &[String],
    group: Option<&SharedCollective>,
) -> Result<Option<IlqlStage>> {
    let ilql_start = Instant::now();
    tch::manual_seed(cfg.seed as i64 + 102); // the heads' init: the same on a resumed run
    let vs = nn::VarStore::new(Device::Cpu);
    let trunk = models::from_pretrained(&vs.root(), sft_dir)?;
    let mut config = IlqlTrlConfig::default();
    config.train.seq_length = 32;
    let world = group.map_or(1, |g| g.world_size());
    // the global minibatch is the one-process one: each rank takes its share
    config.train.batch_size = (64.min(cfg.ilql_samples.max(1)) / world).max(1);
    config.train.epochs = cfg.ilql_epochs;
    config.train.total_steps = 1_000_000;
    config.train.eval_interval = 1_000_000;
    config.train.checkpoint_interval = 1_000_000;
    config.train.checkpoint_dir = cfg.out.join("ilql_checkpoints").display().to_string();
    config.train.seed = cfg.seed;
    config.optimizer.kwargs.lr = 1e-3;
    config.scheduler.kwargs.eta_min = 1e-3;
    config.method.alpha = 0.01;
    config.method.steps_for_target_q_sync = 1;
    config.method.gen_kwargs.max_new_tokens = MAX_NEW_TOKENS as usize;
    config.method.gen_kwargs.beta = BetaSweep::Many(vec![0.0, 1.0, 4.0, 16.0]);
    let model = CausalLmWithIlqlHeads::from_model(&vs.root(), trunk, true, config.method.alpha)?;

    // behaviour data: sampled from the SFT policy (β = 0, no top-k: the LM itself)
    let mut rng = Generator::new(cfg.seed + 7);
    let eos = tok.eos_token_id().unwrap_or(0);
    let pad = tok.pad_token_id().unwrap_or(0);
    let behaviour = GenerationConfig {
        eos_token_id: Some(eos),
        pad_token_id: Some(pad),
        ..GenerationConfig::rlhf_sampling(MAX_NEW_TOKENS)
    };
    let mut samples = Vec::with_capacity(cfg.ilql_samples);
    let mut returns = Vec::with_capacity(cfg.ilql_samples);
    let chunk = 256usize;
    let mut at = 0usize;
    while samples.len() < cfg.ilql_samples {
        let n = chunk.min(cfg.ilql_samples - samples.len());
        let rows: Vec<Vec<i64>> = (0..n)
            .map(|i| tok.encode(&prompts[(at + i) % prompts.len()]))
            .collect::<Result<_>>()?;
        at += n;
        let enc = pad_rows(&rows, pad, PaddingSide::Left)?;
        let out = generate(
            model.model(),
            &enc.input_ids,
            Some(&enc.attention_mask),
            &behaviour,
            &mut rng,
        )?;
        let (_, r) = out.response.size2()?;
        let resp = Vec::<i64>::try_from(out.response.reshape([-1]))?;
        let mask = Vec::<bool>::try_from(out.response_mask.reshape([-1]))?;
        for ((prompt, row), m) in rows
            .into_iter()
            .zip(resp.chunks(r as usize))
            .zip(mask.chunks(r as usize))
        {
            let response: Vec<i64> = row
                .iter()
                .zip(m)
                .filter(|(_, m)| **m)
                .map(|(t, _)| *t)
                .collect();
            if response.is_empty() {
                continue;
            }
            returns.push(task::hidden_score(
                &tok.decode(&response, SpecialTokens::Skip)?,
            ));
            samples.push(IlqlTokenSample::new(
                prompt,
                response,
                *returns.last().unwrap_or(&0.0),
            ));
        }
    }
    let behaviour_score = returns.iter().sum::<f64>() / returns.len().max(1) as f64;
    let data = IlqlDataset::from_token_rows(
        &samples,
        &IlqlDataConfig::new().with_seq_length(config.train.seq_length),
    )?;
    let eval_prompts = task::prompts(&mut Generator::new(cfg.seed + 1_000_003), cfg.eval_prompts);
    let hidden = |s: &[String]| Ok(s.iter().map(|x| task::hidden_score(x)).collect());
    let mut trainer = IlqlTrainer::new(config, vs, model, data, cfg.tokenizer()?)?
        .with_evaluation(Evaluation::new(eval_prompts).with_reward_fn(hidden));
    if let Some(g) = group {
        trainer = trainer.with_collective(g.clone())?;
    }
    let pb = bar(cfg.ilql_epochs, "ILQL", cfg.quiet);
    let mut callbacks = Callbacks::new();
    for _ in 0..cfg.ilql_epochs {
        let stats = trainer.train_epoch(&mut callbacks)?;
        pb.set_message(format!(
            "loss {:.3}",
            stats.get("loss").copied().unwrap_or(f64::NAN)
        ));
        pb.inc(1);
    }
    pb.finish();
    if !trainer.is_main_process() {
        return Ok(None);
    }
    let sweep: Vec<(f64, f64)> = trainer
        .evaluate_sweep()?
        .into_iter()
        .map(|(beta, r)| (beta, r.mean_reward.unwrap_or(f64::NAN)))
        .collect();
    // the table's row: the best β, and its sampler's KL to the SFT model
    let (best_beta, best_score) = sweep
        .iter()
        .copied()
        .filter(|(_, score)| score.is_finite())
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .unwrap_or((0.0, f64::NAN));
    let ref_vs = nn::VarStore::new(Device::Cpu);
    let sft = models::from_pretrained(&ref_vs.root(), sft_dir)?;
    let eval_rows: Vec<Vec<i64>> =
        task::prompts(&mut Generator::new(cfg.seed + 1_000_003), cfg.eval_prompts)
            .iter()
            .map(|p| tok.encode(p))
            .collect::<Result<_>>()?;
    let enc = pad_rows(&eval_rows, pad, PaddingSide::Left)?;
    let top_k = trainer.config().method.gen_kwargs.top_k as i64;
    let gen_cfg = IlqlGenerationConfig::new(MAX_NEW_TOKENS)
        .with_beta(best_beta)
        .with_top_k(top_k)
        .with_eos_token_id(eos)
        .with_pad_token_id(pad);
    let out = ilql_generate(
        trainer.model(),
        &enc.input_ids,
        Some(&enc.attention_mask),
        &gen_cfg,
        &mut rng,
    )?;
    let p = enc.input_ids.size()[1];
    let kind = out.attention_mask.kind();
    let response_mask = Tensor::cat(
        &[
            out.attention_mask.narrow(1, 0, p).zeros_like(),
            out.response_mask.to_kind(kind),
        ],
        1,
    );
    let kl = compare::ilql_kl(
        trainer.model(),
        sft.as_ref(),
        &out.sequences,
        &out.attention_mask,
        &response_mask,
        best_beta,
        top_k,
    )?;
    let row = compare::MethodRow {
        method: format!("ILQL (offline, β = {best_beta})"),
        score: best_score,
        kl,
        seconds: ilql_start.elapsed().as_secs_f64(),
    };
    let png = cfg.out.join("ilql_beta_sweep.png");
    if let Err(e) = plot_sweep(&png, &sweep, behaviour_score) {
        return Err(fail(format!("plotting {}: {e}", png.display())));
    }
    Ok(Some(IlqlStage {
        behaviour_score,
        sweep,
        row,
    }))
}

/// What the ILQL stage measured.
struct IlqlStage {
    /// The behaviour data's mean hidden-rule score.
    behaviour_score: f64,
    /// `(β, held-out score)` per β of the sweep.
    sweep: Vec<(f64, f64)>,
    /// The comparison table's row (the best β).
    row: compare::MethodRow,
}

/// The β sweep: held-out hidden-rule score per β, beside the behaviour data's mean.
fn plot_sweep(
    path: &Path,
    sweep: &[(f64, f64)],
    behaviour: f64,
) -> std::result::Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;
    let text = register_font();
    let root = BitMapBackend::new(path, (600, 420)).into_drawing_area();
    root.fill(&WHITE)?;
    // β on a log-like axis: position i for the i-th β, labelled by value
    let hi = sweep
        .iter()
        .map(|p| p.1)
        .fold(behaviour, f64::max)
        .max(1e-3)
        * 1.15;
    let mut builder = ChartBuilder::on(&root);
    builder
        .margin(12)
        .x_label_area_size(if text { 30 } else { 5 })
        .y_label_area_size(if text { 45 } else { 5 });
    if text {
        builder.caption("ILQL: hidden-rule score per β", ("sans-serif", 18));
    }
    let n = sweep.len().max(1) as f64;
    let mut chart = builder.build_cartesian_2d(-0.5..n - 0.5, 0.0..hi)?;
    let labels: Vec<String> = sweep.iter().map(|p| format!("β={}", p.0)).collect();
    let label_of = |x: &f64| {
        let i = x.round();
        if (x - i).abs() < 1e-6 && i >= 0.0 {
            labels.get(i as usize).cloned().unwrap_or_default()
        } else {
            String::new()
        }
    };
    let mut mesh = chart.configure_mesh();
    if text {
        mesh.x_labels(sweep.len()).x_label_formatter(&label_of);
    } else {
        mesh.x_labels(0).y_labels(0);
    }
    mesh.draw()?;
    let points: Vec<(f64, f64)> = sweep
        .iter()
        .enumerate()
        .map(|(i, p)| (i as f64, p.1))
        .collect();
    chart.draw_series(points.iter().map(|p| Circle::new(*p, 4, BLUE.filled())))?;
    let level = vec![(-0.5, behaviour), (n - 0.5, behaviour)];
    if text {
        chart
            .draw_series(LineSeries::new(points, BLUE.stroke_width(2)))?
            .label("ILQL")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], BLUE));
        chart
            .draw_series(LineSeries::new(level, RED.stroke_width(1)))?
            .label("behaviour data")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], RED));
        chart.configure_series_labels().border_style(BLACK).draw()?;
    } else {
        chart.draw_series(LineSeries::new(points, BLUE.stroke_width(2)))?;
        chart.draw_series(LineSeries::new(level, RED.stroke_width(1)))?;
    }
    root.present()?;
    Ok(())
}

/// The whole pipeline (see the [module docs](self)).
pub fn run(cfg: &Config) -> Result<Summary> {
    let start = Instant::now();
    tch::manual_seed(cfg.seed as i64);
    tch::set_num_threads(1); // tiny matrices: intra-op threads only cost synchronisation
    let io = |path: &Path| {
        let path = path.display().to_string();
        move |e: std::io::Error| Error::Io {
            op: "rlhf",
            path: path.clone(),
            source: e,
        }
    };
    // Under torchrl-launch every stage is data-parallel over the ranks (each learns on its
    // share of each minibatch; PPO and GRPO ranks generate their own rollouts); rank 0 alone
    // writes files, prints and evaluates.
    let group = launched()?.map(SharedCollective::new);
    let (rank, world) = group
        .as_ref()
        .map_or((0, 1), |g| (g.rank(), g.world_size()));
    if !cfg.rollouts.is_multiple_of(world) || !cfg.batch.is_multiple_of(world) {
        return Err(fail(format!(
            "{world} processes: the rollouts ({}) and the minibatch ({}) must divide evenly",
            cfg.rollouts, cfg.batch
        )));
    }
    let is_main = rank == 0;
    let cfg = &Config {
        quiet: cfg.quiet || !is_main,
        ..cfg.clone()
    };
    fs::create_dir_all(&cfg.out).map_err(io(&cfg.out))?;
    let tok = cfg.tokenizer()?;
    let tok = tok.as_ref();
    let mut rng = Generator::new(cfg.seed);
    let (sft_dir, rm_dir) = (cfg.out.join("sft"), cfg.out.join("reward_model"));
    // the preference data (its own generator: the same pairs on --resume, for DPO)
    let mut pair_rng = Generator::new(cfg.seed + 5);
    let (rm_train, dpo_train) = pairs(&mut pair_rng, tok, cfg.pairs)?;
    let (rm_test, dpo_test) = pairs(&mut pair_rng, tok, cfg.test_pairs)?;

    // 1-2. SFT and reward model (or, on --resume, the ones the first run saved: both folders
    // appear at once, renamed into place after the run that trained them saved both).
    let policy_vs = nn::VarStore::new(Device::Cpu);
    let rm_vs = nn::VarStore::new(Device::Cpu);
    let stats_file = cfg.out.join("sft_reward_model.json");
    let saved = sft_dir.exists() && rm_dir.exists() && stats_file.exists();
    let (sft, sft_first, sft_last, rm, rm_accuracy) = if cfg.resume && saved {
        let sft = models::from_pretrained(&policy_vs.root(), &sft_dir)?;
        let rm = CausalLmWithScoreHead::from_pretrained(&rm_vs.root(), &rm_dir)?;
        let [first, last, acc] = read_stage_stats(&stats_file)?;
        (sft, first, last, rm, acc)
    } else {
        // data-parallel: each rank trains on its slice of every minibatch; rank 0 saves
        let g = group.as_ref();
        let (sft, first, last) = train_sft(cfg, &mut rng, tok, &policy_vs, g)?;
        let (rm, acc) = train_reward_model(cfg, &mut rng, tok, &rm_vs, &rm_train, &rm_test, g)?;
        if is_main {
            let (sft_tmp, rm_tmp) = (cfg.out.join("sft.tmp"), cfg.out.join("reward_model.tmp"));
            for dir in [&sft_tmp, &rm_tmp, &sft_dir, &rm_dir] {
                if dir.exists() {
                    fs::remove_dir_all(dir).map_err(io(dir))?;
                }
            }
            sft.save_pretrained(&sft_tmp)?;
            rm.save_pretrained(&rm_tmp)?;
            cfg.copy_tokenizer(&sft_tmp)?;
            cfg.copy_tokenizer(&rm_tmp)?;
            fs::rename(&sft_tmp, &sft_dir).map_err(io(&sft_dir))?;
            fs::rename(&rm_tmp, &rm_dir).map_err(io(&rm_dir))?;
            write_stage_stats(&stats_file, [first, last, acc])?;
        }
        (sft, first, last, rm, acc)
    };
    if !cfg.quiet {
        println!("SFT loss {sft_first:.3} -> {sft_last:.3}; reward model held-out accuracy {rm_accuracy:.3}");
    }

    // 3. PPO against the SFT model (hydra: the top block and the value head train). Each stage
    // seeds libtorch's generator (the heads' init) and draws its prompts from a generator of
    // its own, so a resumed run that skips SFT builds what an uninterrupted one does.
    let ppo_start = Instant::now();
    tch::manual_seed(cfg.seed as i64 + 101);
    let ppo_cfg = ppo_config(cfg, world);
    let model = hydra_policy(&policy_vs.root(), sft, &ppo_cfg.model)?;
    let prompts: Vec<String> = task::prompts(&mut Generator::new(cfg.seed + 11), 1024);
    let prompt_refs: Vec<&str> = prompts.iter().map(String::as_str).collect();
    let env_config = TokenEnvConfig::for_model(model.policy().model().facts())
        .with_max_new_tokens(MAX_NEW_TOKENS)
        .with_batch_size((cfg.rollouts / world) as i64)
        .with_shuffle(true)
        .with_seed(rank_seed(cfg.seed, rank));
    let scorer = RewardModelScorer::new(rm);
    let env = TokenEnv::from_text(env_config, tok, &prompt_refs, Box::new(scorer))?;
    let eval_prompts = task::prompts(&mut Generator::new(cfg.seed + 1_000_003), cfg.eval_prompts);
    let hidden = |samples: &[String]| Ok(samples.iter().map(|s| task::hidden_score(s)).collect());
    let mut trainer = PpoRlhfTrainer::new(ppo_cfg, model, env, cfg.tokenizer()?)?
        .with_evaluation(Evaluation::new(eval_prompts.clone()).with_reward_fn(hidden));
    if let Some(g) = &group {
        trainer = trainer.with_collective(g.clone())?;
    }
    // the SFT policy's score, before a checkpoint replaces it (the load restores the sampler)
    let score_before = trainer.evaluate()?.mean_reward.unwrap_or(f64::NAN);
    let ckpt_dir = cfg.out.join("checkpoints");
    let csv_path = cfg.out.join("rlhf_log.csv");
    let mut rows = Vec::new();
    if cfg.resume {
        if let Some(ckpt) = CheckpointStore::new(&ckpt_dir).load_latest()? {
            trainer.load_checkpoint(ckpt)?;
        }
        // the rows the first run logged up to the checkpoint (those after it run again)
        if csv_path.exists() {
            rows = read_csv(&csv_path)?;
            rows.retain(|r| r.iteration < trainer.epoch());
        }
    }

    let pb = bar(cfg.iterations, "PPO", cfg.quiet);
    pb.set_position(trainer.epoch() as u64);
    if !cfg.quiet {
        pb.suspend(|| {
            println!(
                "{:>4} {:>9} {:>10} {:>7} {:>7} {:>9} {:>6} {:>8} {:>6}",
                "iter", "rm score", "true score", "KL", "β", "rm agree", "len", "loss", "s"
            )
        });
    }
    let mut callbacks = Callbacks::new();
    for _ in trainer.epoch()..cfg.iterations {
        let t0 = Instant::now();
        let stats: IterationStats = trainer.iteration(&mut callbacks)?;
        let (true_score, rm_agreement) = rollout_truth(&trainer, tok)?;
        let row = Row {
            iteration: stats.iteration,
            rm_score: stats.score,
            true_score,
            kl: stats.kl,
            kl_coef: stats.kl_coef,
            rm_agreement,
            response_length: stats.response_length,
            loss: stats.update.get("loss").copied().unwrap_or(f64::NAN),
            seconds: t0.elapsed().as_secs_f64(),
        };
        if !cfg.quiet {
            pb.suspend(|| {
                println!(
                    "{:>4} {:>9.3} {:>10.3} {:>7.3} {:>7.3} {:>9.3} {:>6.1} {:>8.3} {:>6.2}",
                    row.iteration,
                    row.rm_score,
                    row.true_score,
                    row.kl,
                    row.kl_coef,
                    row.rm_agreement,
                    row.response_length,
                    row.loss,
                    row.seconds
                )
            });
        }
        pb.set_message(format!("true score {true_score:.3}"));
        pb.inc(1);
        rows.push(row);
        if is_main {
            write_csv(&csv_path, &rows)?;
        }
        if trainer.epoch().is_multiple_of(cfg.checkpoint_every.max(1)) {
            trainer.save(&ckpt_dir)?;
        }
        if cfg.fail_at == Some(FailAt::PpoIteration(rows.len())) {
            return Err(killed(FailAt::PpoIteration(rows.len())));
        }
    }
    pb.finish();
    trainer.save(&ckpt_dir)?;
    let score_after = trainer.evaluate()?.mean_reward.unwrap_or(f64::NAN);
    let td = trainer.act(&compare::prompt_batch(tok, &eval_prompts)?)?;
    let ppo_row = compare::MethodRow {
        method: "PPO (trlX)".into(),
        score: score_after,
        kl: compare::hydra_kl(trainer.model(), &td)?,
        seconds: ppo_start.elapsed().as_secs_f64(),
    };
    // 4. ILQL on offline data (the SFT policy's samples scored by the hidden rule); rank 0
    // evaluates while the others go on to GRPO and wait for it in its first collective.
    let ilql = run_ilql(cfg, tok, &sft_dir, &prompts, group.as_ref())?;
    // 5. GRPO against the reward model; 6. DPO on the reward model's own pairs (every rank).
    if cfg.fail_at == Some(FailAt::Grpo) {
        return Err(killed(FailAt::Grpo));
    }
    let grpo_row = compare::run_grpo(
        cfg,
        tok,
        &sft_dir,
        &rm_dir,
        &prompts,
        &eval_prompts,
        group.as_ref(),
    )?;
    let (dpo_row, dpo_test_accuracy) = compare::run_dpo(
        cfg,
        tok,
        &sft_dir,
        dpo_train,
        &dpo_test,
        &eval_prompts,
        group.as_ref(),
    )?;
    let Some(ilql) = ilql else {
        // ILQL (offline) and the reports are rank 0's
        return Ok(Summary {
            sft_loss_first: sft_first,
            sft_loss_last: sft_last,
            rm_test_accuracy: rm_accuracy,
            score_before,
            score_after,
            rows,
            ilql_behaviour_score: f64::NAN,
            ilql_sweep: Vec::new(),
            dpo_test_accuracy,
            methods: vec![ppo_row, grpo_row, dpo_row],
            seconds: start.elapsed().as_secs_f64(),
        });
    };
    if let Err(e) = plot(&cfg.out.join("rlhf_curves.png"), &rows) {
        return Err(fail(format!(
            "plotting {}: {e}",
            cfg.out.join("rlhf_curves.png").display()
        )));
    }
    let IlqlStage {
        behaviour_score: ilql_behaviour_score,
        sweep: ilql_sweep,
        row: ilql_row,
    } = ilql;
    let methods = vec![
        compare::MethodRow {
            method: "SFT (the reference)".into(),
            score: score_before,
            kl: 0.0,
            seconds: f64::NAN,
        },
        ppo_row,
        grpo_row,
        dpo_row,
        ilql_row,
    ];
    let summary = Summary {
        sft_loss_first: sft_first,
        sft_loss_last: sft_last,
        rm_test_accuracy: rm_accuracy,
        score_before,
        score_after,
        rows,
        ilql_behaviour_score,
        ilql_sweep,
        dpo_test_accuracy,
        methods,
        seconds: start.elapsed().as_secs_f64(),
    };
    if !cfg.quiet {
        let mut report = BTreeMap::new();
        report.insert(
            "hidden-rule score on held-out prompts, SFT policy",
            score_before,
        );
        report.insert(
            "hidden-rule score on held-out prompts, after PPO",
            score_after,
        );
        for (k, v) in report {
            println!("{k}: {v:.3}");
        }
        println!(
            "ILQL (offline, behaviour data from the SFT policy, mean score {:.3}):",
            summary.ilql_behaviour_score
        );
        println!("{:>8} {:>12}", "β", "true score");
        for (beta, score) in &summary.ilql_sweep {
            println!("{beta:>8} {score:>12.3}");
        }
        println!("DPO: implicit-reward accuracy on held-out pairs {dpo_test_accuracy:.3}");
        println!("comparison on held-out prompts (KL: exact per-token KL to the SFT model, summed over the response):");
        compare::print_table(&summary.methods);
        println!(
            "wrote {}/rlhf_log.csv, rlhf_curves.png, ilql_beta_sweep.png, sft/, reward_model/, checkpoints/ ({:.0} s)",
            cfg.out.display(),
            summary.seconds
        );
    }
    Ok(summary)
}

fn main() -> Result<()> {
    let cfg = Config::from_args()?;
    run(&cfg)?;
    Ok(())
}
