//! The `torchrl` command line: train and run causal LMs from a model folder, a JSONL file and
//! a TOML config, without writing Rust (TRL's `trl sft|dpo|grpo …` is the model).
//!
//! ```text
//! torchrl sft      --model DIR --data FILE [--config FILE] --output DIR [--resume]
//! torchrl reward   --model DIR --data FILE [--config FILE] --output DIR [--resume]
//! torchrl ppo|grpo --model DIR --data FILE  --config FILE  --output DIR [--resume]
//! torchrl dpo|ilql --model DIR --data FILE [--config FILE] --output DIR [--resume]
//! torchrl generate --model DIR --data FILE [--config FILE] [--output FILE]
//! torchrl eval     --model DIR --data FILE  --config FILE  [--output FILE]
//! ```
//!
//! - `--model DIR`: a Hugging Face folder (`config.json`, `model.safetensors` or shards,
//!   `tokenizer.json`, optionally `tokenizer_config.json` / `chat_template.jinja` with a chat
//!   template and `generation_config.json`), of any architecture
//!   [`models::from_pretrained`](crate::modules::llm::models::from_pretrained) reads.
//!   `--from-scratch` builds the model its `config.json` describes with random weights instead
//!   (a folder without weights is then enough).
//! - `--data FILE`: a JSONL file in one of TRL's formats ([`crate::data::llm::dataset`]);
//!   conversational columns are rendered with the folder's chat template.
//! - `--config FILE`: TOML. `sft` and `reward` take TRL's `SFTConfig` / `RewardConfig` field
//!   names ([`sft::SftSettings`], [`sft::RewardSettings`]); `ppo`, `grpo`, `dpo` and `ilql` take
//!   trlX's `TRLConfig` sections (`[train]`, `[model]`, `[optimizer]`, `[scheduler]`,
//!   `[method]`, as [`TrlConfig`](crate::trainers::TrlConfig) reads them) plus `[data]` and,
//!   for `ppo` / `grpo` / `eval`, the rewards as `[[reward]]` tables. Unknown fields are
//!   refused by name.
//! - `--output DIR`: the trained model as a Hugging Face folder in `DIR/model` (weights,
//!   `config.json`, the tokenizer files and the chat template; with LoRA also the PEFT adapter
//!   in `DIR/adapter`), written to a temporary folder and renamed into place when training
//!   ends; `DIR/log.csv` and `DIR/curves.png` (updated at every logging step);
//!   `DIR/checkpoints/` (atomic, the last three kept). `--resume` continues from the last
//!   checkpoint. Bad input (data, config, template, model folder) is reported before `DIR` is
//!   created.
//!
//! The binary's entry point is [`main_with_args`]; every subcommand is also a function
//! ([`sft::run_sft`], …) that tests and programs can call.

pub mod generate;
pub mod log;
pub mod rl;
pub mod sft;

use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};

use clap::{Args, Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use tch::nn;

use crate::data::llm::chat::ChatTemplate;
use crate::data::llm::prepare::Encoder;
use crate::data::llm::Dataset;
use crate::error::{Error, Result};
use crate::modules::llm::{models, CausalLm, HfTokenizer, TextTokenizer};

/// `torchrl`: TorchRL's and TRL's trainers for causal LMs, from the command line.
#[derive(Debug, Parser)]
#[command(name = "torchrl", version, about, long_about = None)]
pub struct Cli {
    /// What to run.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Supervised fine-tuning on text, conversations or prompt-completion pairs (TRL's
    /// SFTTrainer).
    Sft(TrainArgs),
    /// Trains a reward model (a sequence classifier) on preference pairs (TRL's RewardTrainer).
    Reward(TrainArgs),
    /// PPO-RLHF on prompts, scored by the [[reward]] tables (trlX's PPO).
    Ppo(TrainArgs),
    /// GRPO on prompts, scored by the [[reward]] tables (TRL's GRPOTrainer).
    Grpo(TrainArgs),
    /// DPO on preference pairs (TRL's DPOTrainer).
    Dpo(TrainArgs),
    /// ILQL on scored prompt / completion samples (trlX's ILQL).
    Ilql(TrainArgs),
    /// Generates completions for the dataset's prompts (JSONL out).
    Generate(GenerateArgs),
    /// Generates for the dataset's prompts and scores the completions with the [[reward]]
    /// tables.
    Eval(GenerateArgs),
}

/// The arguments of the training subcommands.
#[derive(Debug, Clone, Args)]
pub struct TrainArgs {
    /// A Hugging Face model folder (config.json, weights, tokenizer.json).
    #[arg(long, value_name = "DIR")]
    pub model: PathBuf,
    /// A JSONL dataset in one of TRL's formats.
    #[arg(long, value_name = "FILE")]
    pub data: PathBuf,
    /// A TOML config (TRL's / trlX's field names; unknown fields are refused).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Where the trained model, the log, the curves and the checkpoints go.
    #[arg(long, short, value_name = "DIR")]
    pub output: PathBuf,
    /// Continue from the last checkpoint in OUTPUT/checkpoints.
    #[arg(long)]
    pub resume: bool,
    /// Build the model from config.json with random weights instead of loading them.
    #[arg(long)]
    pub from_scratch: bool,
    /// No progress bar, no per-step lines.
    #[arg(long)]
    pub quiet: bool,
    /// The dtype the model is made and trained in (TRL's `--dtype`): bfloat16 / float16 keep
    /// float32 master weights in AdamW and take log-probs, KL and losses in float32.
    #[arg(long, value_enum, default_value_t = Dtype::Float32)]
    pub dtype: Dtype,
    /// Keep memory that libtorch frees in the process for its next allocation instead of
    /// giving it back to the system (`torchrl::memory::keep_freed_memory`): faster steps on
    /// large models (no page zeroing each step), a resident set that never shrinks.
    #[arg(long)]
    pub keep_freed_memory: bool,
}

/// The arguments of `generate` and `eval`.
#[derive(Debug, Clone, Args)]
pub struct GenerateArgs {
    /// A Hugging Face model folder.
    #[arg(long, value_name = "DIR")]
    pub model: PathBuf,
    /// A JSONL dataset with a "prompt" column (any format but language modeling).
    #[arg(long, value_name = "FILE")]
    pub data: PathBuf,
    /// A TOML config: [generation] settings and, for eval, [[reward]] tables.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// A JSONL file for the samples (standard output when absent).
    #[arg(long, short, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Only the first N prompts.
    #[arg(long, value_name = "N")]
    pub limit: Option<usize>,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
    /// The dtype the model is made in (TRL's `--dtype`).
    #[arg(long, value_enum, default_value_t = Dtype::Float32)]
    pub dtype: Dtype,
}

/// Parses `args` (the program name first, as `std::env::args_os()` gives them) and runs the
/// subcommand. `--help` and `--version` print and return `Ok`.
///
/// ```
/// // a missing required argument is an error that names it
/// let err = torchrl::cli::main_with_args(["torchrl", "sft", "--data", "x.jsonl"]).unwrap_err();
/// assert!(err.to_string().contains("--model"), "{err}");
/// ```
///
/// # Errors
/// An argument error (clap's message), or the subcommand's error.
pub fn main_with_args<I, T>(args: I) -> Result<()>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
                print!("{e}");
                return Ok(());
            }
            return Err(Error::invalid(
                "torchrl",
                e.to_string().trim_end().to_string(),
            ));
        }
    };
    run(cli.command)
}

/// Runs one subcommand.
///
/// # Errors
/// The subcommand's error.
pub fn run(command: Command) -> Result<()> {
    if let Command::Sft(a)
    | Command::Reward(a)
    | Command::Ppo(a)
    | Command::Grpo(a)
    | Command::Dpo(a)
    | Command::Ilql(a) = &command
    {
        if a.keep_freed_memory {
            crate::memory::keep_freed_memory();
        }
    }
    match command {
        Command::Sft(a) => sft::run_sft(&a).map(drop),
        Command::Reward(a) => sft::run_reward(&a).map(drop),
        Command::Ppo(a) => rl::run_ppo(&a).map(drop),
        Command::Grpo(a) => rl::run_grpo(&a).map(drop),
        Command::Dpo(a) => rl::run_dpo(&a).map(drop),
        Command::Ilql(a) => rl::run_ilql(&a).map(drop),
        Command::Generate(a) => generate::run_generate(&a).map(drop),
        Command::Eval(a) => generate::run_eval(&a).map(drop),
    }
}

pub(crate) fn fail(op: &'static str, message: impl Into<String>) -> Error {
    Error::invalid(op, message)
}

pub(crate) fn io_error(op: &'static str, path: &Path) -> impl Fn(std::io::Error) -> Error {
    let path = path.display().to_string();
    move |source| Error::Io {
        op,
        path: path.clone(),
        source,
    }
}

/// A TOML file's text (`None`: the empty config, every field its default).
pub(crate) fn read_config_text(path: Option<&Path>) -> Result<String> {
    match path {
        None => Ok(String::new()),
        Some(p) => fs::read_to_string(p).map_err(io_error("torchrl: --config", p)),
    }
}

/// Parses a settings struct from TOML, naming the file on error.
pub(crate) fn parse_toml<T: serde::de::DeserializeOwned>(
    text: &str,
    path: Option<&Path>,
) -> Result<T> {
    toml::from_str(text).map_err(|e| Error::InvalidFile {
        op: "torchrl: --config",
        path: path.map_or_else(|| "<defaults>".into(), |p| p.display().to_string()),
        reason: e.to_string().trim_end().to_string(),
    })
}

/// The tokenizer of a model folder: `tokenizer.json`, with EOS / BOS / pad set to the ids its
/// `config.json` (or `generation_config.json`) names; pad falls back to the tokenizer's, then
/// EOS.
///
/// # Errors
/// A missing or invalid `tokenizer.json`, a special id the tokenizer lacks, or no EOS.
pub fn load_tokenizer(dir: &Path) -> Result<HfTokenizer> {
    let op = "torchrl::cli::load_tokenizer";
    let mut tok = HfTokenizer::from_file(dir.join("tokenizer.json"))?;
    let facts = models::config_from_file(&dir.join("config.json"))?.facts();
    let token = |tok: &HfTokenizer, id: i64| -> Result<String> {
        u32::try_from(id)
            .ok()
            .and_then(|i| tok.inner().id_to_token(i))
            .ok_or_else(|| {
                fail(
                    op,
                    format!(
                        "{}: the config's special id {id} is not in tokenizer.json",
                        dir.display()
                    ),
                )
            })
    };
    if let Some(id) = facts.eos_token_id {
        let t = token(&tok, id)?;
        tok = tok.with_eos_token(&t)?;
    }
    if let Some(id) = facts.bos_token_id {
        let t = token(&tok, id)?;
        tok = tok.with_bos_token(&t)?;
    }
    if let Some(id) = facts
        .pad_token_id
        .or(tok.pad_token_id())
        .or(facts.eos_token_id)
    {
        let t = token(&tok, id)?;
        tok = tok.with_pad_token(&t)?;
    }
    if tok.eos_token_id().is_none() {
        return Err(fail(
            op,
            format!(
                "{}: no EOS token (set eos_token_id in config.json or generation_config.json)",
                dir.display()
            ),
        ));
    }
    Ok(tok)
}

/// The folder's chat template, if it has one (`None` when it has none; an error when it has
/// one that does not compile).
pub(crate) fn load_template(dir: &Path) -> Result<Option<ChatTemplate>> {
    let has = dir.join("chat_template.jinja").exists()
        || fs::read_to_string(dir.join("tokenizer_config.json"))
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
            .is_some_and(|v| v.get("chat_template").is_some());
    if has {
        ChatTemplate::from_model_dir(dir).map(Some)
    } else {
        Ok(None)
    }
}

/// What a training command reads and checks before it creates its output folder: the
/// dataset (split when `test_size` holds examples out), the model folder's tokenizer and its
/// chat template (required when the data is conversational).
pub(crate) struct Inputs {
    pub(crate) tokenizer: HfTokenizer,
    pub(crate) template: Option<ChatTemplate>,
    pub(crate) train: Dataset,
    pub(crate) test: Option<Dataset>,
}

impl Inputs {
    /// Reads `args.data` and `args.model`'s tokenizer and template; holds out `test_size`
    /// examples (0: none) with `seed`.
    pub(crate) fn load(args: &TrainArgs, test_size: f64, seed: u64) -> Result<Self> {
        let data = load_data(&args.data)?;
        let tokenizer = load_tokenizer(&args.model)?;
        let template = load_template(&args.model)?;
        if data.is_conversational() && template.is_none() {
            return Err(fail(
                "torchrl",
                format!(
                    "{} is conversational and {} has no chat template (chat_template.jinja or \
                     tokenizer_config.json's chat_template)",
                    args.data.display(),
                    args.model.display()
                ),
            ));
        }
        let (train, test) = if test_size > 0.0 {
            let (a, b) = data.train_test_split(test_size, seed)?;
            (a, Some(b))
        } else {
            (data, None)
        };
        Ok(Inputs {
            tokenizer,
            template,
            train,
            test,
        })
    }

    /// An encoder over the tokenizer and template, dropping rows over `limit` tokens.
    pub(crate) fn encoder(&self, limit: Option<usize>) -> Encoder<'_> {
        let enc = Encoder::new(&self.tokenizer).with_length_limit(limit);
        match &self.template {
            Some(t) => enc.with_chat_template(t),
            None => enc,
        }
    }

    /// `encode` over the training and the held-out data: their rows (none held out: empty)
    /// and the examples dropped from both.
    pub(crate) fn rows<T>(
        &self,
        encode: impl Fn(&Dataset) -> Result<(Vec<T>, usize)>,
    ) -> Result<(Vec<T>, Vec<T>, usize)> {
        let (train, dropped) = encode(&self.train)?;
        match &self.test {
            Some(t) => {
                let (test, d) = encode(t)?;
                Ok((train, test, dropped + d))
            }
            None => Ok((train, Vec::new(), dropped)),
        }
    }
}

/// The dtype a command makes its model in (`--dtype`; TRL's `ModelConfig.dtype` values).
/// Weights stored in another dtype are converted on load; the saved model keeps this dtype.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Dtype {
    /// `float32` (the default).
    #[default]
    Float32,
    /// `bfloat16`: half the memory of float32; fast matrix products on CPUs with AVX-512
    /// BF16 or AMX, and on recent GPUs.
    Bfloat16,
    /// `float16`.
    Float16,
}

impl Dtype {
    /// The libtorch kind.
    ///
    /// ```
    /// use torchrl::cli::Dtype;
    /// assert_eq!(Dtype::Bfloat16.kind(), tch::Kind::BFloat16);
    /// assert_eq!(Dtype::default().kind(), tch::Kind::Float);
    /// ```
    pub fn kind(self) -> tch::Kind {
        match self {
            Dtype::Float32 => tch::Kind::Float,
            Dtype::Bfloat16 => tch::Kind::BFloat16,
            Dtype::Float16 => tch::Kind::Half,
        }
    }
}

/// An empty variable store on the CPU whose variables are made in `dtype`.
pub(crate) fn new_store(dtype: Dtype) -> nn::VarStore {
    let mut vs = nn::VarStore::new(tch::Device::Cpu);
    vs.set_kind(dtype.kind());
    vs
}

/// The model of a folder: its weights, or (`from_scratch`) a random one of its config.
pub(crate) fn load_model(
    root: &nn::Path<'_>,
    dir: &Path,
    from_scratch: bool,
) -> Result<Box<dyn CausalLm>> {
    if from_scratch {
        models::config_from_file(&dir.join("config.json"))?.build(root)
    } else {
        models::from_pretrained(root, dir)
    }
}

/// The dataset, read before anything is created.
pub(crate) fn load_data(path: &Path) -> Result<Dataset> {
    Dataset::from_jsonl(path)
}

/// A progress bar (hidden when quiet).
pub(crate) fn bar(n: u64, what: &str, quiet: bool) -> ProgressBar {
    if quiet {
        return ProgressBar::hidden();
    }
    let template = format!("{what:>8} [{{bar:30}}] {{pos:>5}}/{{len}} | {{msg}} | {{elapsed}}");
    match ProgressStyle::with_template(&template) {
        Ok(style) => ProgressBar::new(n).with_style(style.progress_chars("=> ")),
        Err(_) => ProgressBar::new(n),
    }
}

/// The files of a model folder a saved model needs beside its weights and config (the
/// tokenizer and its chat template).
const TOKENIZER_FILES: [&str; 5] = [
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "generation_config.json",
];

/// The output folder of a training run: created only once the inputs were checked; the model
/// folder is written to `.model.tmp` and renamed into place; a run that fails before writing
/// anything removes the folder it created.
#[derive(Debug)]
pub(crate) struct Output {
    pub(crate) dir: PathBuf,
    created: bool,
}

impl Output {
    /// Creates `dir` (and its `checkpoints/`), remembering whether it existed.
    pub(crate) fn create(dir: &Path) -> Result<Self> {
        let created = !dir.exists();
        fs::create_dir_all(dir.join("checkpoints")).map_err(io_error("torchrl: --output", dir))?;
        Ok(Output {
            dir: dir.to_path_buf(),
            created,
        })
    }

    pub(crate) fn checkpoints(&self) -> PathBuf {
        self.dir.join("checkpoints")
    }

    /// Runs `body`; on an error, removes the folder if this run created it and nothing but
    /// empty folders is in it (a checkpoint, kept for `--resume`, keeps it).
    pub(crate) fn guard<T>(&self, body: impl FnOnce() -> Result<T>) -> Result<T> {
        let out = body();
        if out.is_err() && self.created && is_empty_tree(&self.dir) {
            let _ = fs::remove_dir_all(&self.dir);
        }
        out
    }

    /// Writes a Hugging Face folder at `name` under the output through `save` (into a
    /// temporary folder), copies the tokenizer files of `source`, and renames it into place
    /// (replacing an older one).
    pub(crate) fn save_folder(
        &self,
        name: &str,
        source: &Path,
        save: impl FnOnce(&Path) -> Result<()>,
    ) -> Result<PathBuf> {
        let op = "torchrl: --output";
        let tmp = self.dir.join(format!(".{name}.tmp"));
        let dest = self.dir.join(name);
        if tmp.exists() {
            fs::remove_dir_all(&tmp).map_err(io_error(op, &tmp))?;
        }
        fs::create_dir_all(&tmp).map_err(io_error(op, &tmp))?;
        let written = save(&tmp).and_then(|()| {
            for file in TOKENIZER_FILES {
                let from = source.join(file);
                if from.exists() && !tmp.join(file).exists() {
                    fs::copy(&from, tmp.join(file)).map_err(io_error(op, &from))?;
                }
            }
            Ok(())
        });
        if let Err(e) = written {
            let _ = fs::remove_dir_all(&tmp);
            return Err(e);
        }
        if dest.exists() {
            fs::remove_dir_all(&dest).map_err(io_error(op, &dest))?;
        }
        fs::rename(&tmp, &dest).map_err(io_error(op, &dest))?;
        Ok(dest)
    }
}

fn is_empty_tree(dir: &Path) -> bool {
    match fs::read_dir(dir) {
        Ok(entries) => entries.flatten().all(|e| {
            let p = e.path();
            p.is_dir() && is_empty_tree(&p)
        }),
        Err(_) => false,
    }
}
