//! Generates text with a GPT-2 model: a Hugging Face checkpoint folder (`config.json` +
//! `model.safetensors`) when `--model DIR` is given, otherwise a random-init model of the RLHF
//! example's size (4 layers × 128 wide over the byte tokenizer's 259 ids). Prints each
//! continuation and the generation speed in tokens per second.
//!
//! ```sh
//! cargo run --release --example generate
//! cargo run --release --example generate -- --tokenizer specs/tokenizer/tokenizer.json --prompt "the cat"
//! cargo run --release --example generate -- --model path/to/gpt2 --tokenizer path/to/gpt2/tokenizer.json --greedy
//! ```
//!
//! Options: `--model DIR`, `--tokenizer tokenizer.json` (default: bytes), `--prompt TEXT`
//! (repeatable), `--batch N` (copies of the prompts), `--max-new-tokens N`, `--greedy`,
//! `--temperature T`, `--top-k K`, `--top-p P`, `--seed S`. The tokenizer must fit the model's
//! vocabulary (a prompt id outside it is an error that names the id and the vocabulary).

use std::time::Instant;

use tch::nn::VarStore;
use tch::Device;
use torchrl::modules::llm::{
    generate, BatchEncodeOptions, ByteTokenizer, CausalLm, GenerationConfig, Gpt2Config, Gpt2Model,
    HfTokenizer, SpecialTokens, TextTokenizer,
};
use torchrl::{Error, Generator};

/// The example's options (see the module docs).
pub struct Args {
    /// A `transformers` checkpoint folder; `None`: a random model.
    pub model: Option<String>,
    /// A `tokenizer.json`; `None`: the byte tokenizer.
    pub tokenizer: Option<String>,
    /// The prompts; empty: two default prompts.
    pub prompts: Vec<String>,
    /// Copies of the prompts in the batch.
    pub batch: usize,
    /// New tokens per row.
    pub max_new_tokens: i64,
    /// Greedy decoding instead of sampling.
    pub greedy: bool,
    /// Sampling temperature.
    pub temperature: f64,
    /// Top-k (0: off).
    pub top_k: i64,
    /// Top-p (1: off).
    pub top_p: f64,
    /// Seed of the weights and of sampling.
    pub seed: u64,
}

impl Default for Args {
    fn default() -> Self {
        Args {
            model: None,
            tokenizer: None,
            prompts: Vec::new(),
            batch: 1,
            max_new_tokens: 32,
            greedy: false,
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            seed: 0,
        }
    }
}

fn parse() -> Result<Args, String> {
    let mut a = Args::default();
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--model" => a.model = Some(value()?),
            "--tokenizer" => a.tokenizer = Some(value()?),
            "--prompt" => a.prompts.push(value()?),
            "--batch" => a.batch = value()?.parse().map_err(|e| format!("--batch: {e}"))?,
            "--max-new-tokens" => {
                a.max_new_tokens = value()?
                    .parse()
                    .map_err(|e| format!("--max-new-tokens: {e}"))?
            }
            "--greedy" => a.greedy = true,
            "--temperature" => {
                a.temperature = value()?
                    .parse()
                    .map_err(|e| format!("--temperature: {e}"))?
            }
            "--top-k" => a.top_k = value()?.parse().map_err(|e| format!("--top-k: {e}"))?,
            "--top-p" => a.top_p = value()?.parse().map_err(|e| format!("--top-p: {e}"))?,
            "--seed" => a.seed = value()?.parse().map_err(|e| format!("--seed: {e}"))?,
            other => return Err(format!("unknown option {other} (see the example's docs)")),
        }
    }
    Ok(a)
}

/// What a run produced.
pub struct Summary {
    /// Prompt and continuation, per row.
    pub texts: Vec<(String, String)>,
    /// Tokens generated (response-mask ones).
    pub n_tokens: i64,
    /// Generation speed.
    pub tokens_per_s: f64,
}

fn main() -> torchrl::Result<()> {
    let args = parse().map_err(|m| Error::InvalidArgument {
        op: "examples/generate",
        message: m,
    })?;
    let summary = run(&args)?;
    for (prompt, response) in &summary.texts {
        println!("{prompt:?} -> {response:?}");
    }
    println!(
        "{} tokens generated: {:.0} tokens/s",
        summary.n_tokens, summary.tokens_per_s
    );
    Ok(())
}

/// Builds or loads the model and tokenizer, generates, and returns the texts and the speed.
pub fn run(args: &Args) -> torchrl::Result<Summary> {
    tch::manual_seed(args.seed as i64);
    let tokenizer: Box<dyn TextTokenizer> = match &args.tokenizer {
        Some(path) => Box::new(HfTokenizer::from_file(path)?),
        None => Box::new(ByteTokenizer::new()),
    };
    let vs = VarStore::new(Device::cuda_if_available());
    let model = match &args.model {
        Some(dir) => Gpt2Model::from_pretrained(&vs.root(), dir)?,
        None => {
            let cfg = Gpt2Config::new(tokenizer.vocab_size())
                .with_n_layer(4)
                .with_n_embd(128)
                .with_n_head(4)
                .with_n_positions(256);
            Gpt2Model::new(&vs.root(), &cfg)?
        }
    };
    println!(
        "model: {} layers x {} wide, vocab {}, {:.2}M parameters, on {:?}",
        model.config().n_layer,
        model.config().n_embd,
        model.config().vocab_size,
        model.num_parameters() as f64 / 1e6,
        model.device()
    );
    let defaults = vec!["The policy".to_string(), "A value head".to_string()];
    let prompts = if args.prompts.is_empty() {
        &defaults
    } else {
        &args.prompts
    };
    let texts: Vec<&str> = prompts
        .iter()
        .map(String::as_str)
        .cycle()
        .take(prompts.len() * args.batch.max(1))
        .collect();
    let batch = tokenizer.batch_encode(&texts, &BatchEncodeOptions::default())?;
    let mut cfg = GenerationConfig::new(args.max_new_tokens)
        .with_do_sample(!args.greedy)
        .with_temperature(args.temperature)
        .with_top_k(args.top_k)
        .with_top_p(args.top_p);
    if let Some(eos) = tokenizer.eos_token_id() {
        cfg = cfg.with_eos_token_id(eos);
    }
    if let Some(pad) = tokenizer.pad_token_id() {
        cfg = cfg.with_pad_token_id(pad);
    }
    let mut rng = Generator::new(args.seed);
    let t0 = Instant::now();
    let out = generate(
        &model,
        &batch.input_ids,
        Some(&batch.attention_mask),
        &cfg,
        &mut rng,
    )?;
    let secs = t0.elapsed().as_secs_f64();
    let n_tokens = i64::try_from(out.response_mask.sum(tch::Kind::Int64))?;
    let responses =
        tokenizer.batch_decode(&out.response, Some(&out.response_mask), SpecialTokens::Skip)?;
    Ok(Summary {
        texts: texts.iter().map(|t| t.to_string()).zip(responses).collect(),
        n_tokens,
        tokens_per_s: n_tokens as f64 / secs,
    })
}
