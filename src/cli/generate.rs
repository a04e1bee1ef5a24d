//! `torchrl generate` and `torchrl eval`: completions for a dataset's prompts, and their
//! rewards.
//!
//! The config's `[generation]` table takes `transformers`' `GenerationConfig` names
//! ([`GenerationSettings`]); `eval` scores every completion with the `[[reward]]` tables
//! ([`crate::envs::llm::rewards`]: verifiable answers read from the example's other columns, a
//! format check, a reward model, an external command, …) and prints each reward's mean. Both
//! write one JSON object a line: `prompt`, `completion`, the example's other columns, and for
//! `eval` the total `reward` and each part's score.

use std::fs;
use std::io::Write;
use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use tch::{nn, Device, Kind, Tensor};

use super::{
    bar, fail, load_data, load_model, load_template, load_tokenizer, new_store, GenerateArgs,
};
use crate::data::llm::prepare::Encoder;
use crate::envs::llm::rewards::{build_parts, RewardEntry, RewardScorer};
use crate::envs::llm::scorer::{ScoreInput, Scorer};
use crate::error::{Error, Result};
use crate::modules::llm::{
    generate, pad_rows, CausalLm, GenerationConfig, PaddingSide, SpecialTokens, TextTokenizer,
};
use crate::rng::Generator;

/// How `generate` / `eval` (and the held-out evaluation of `ppo` / `grpo`) sample, by
/// `transformers`' `GenerationConfig` names, plus the batch size and seed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GenerationSettings {
    /// The most tokens generated per prompt. Default `128`.
    pub max_new_tokens: i64,
    /// EOS is forbidden before this many tokens. Default `0`.
    pub min_new_tokens: i64,
    /// Sample (`true`) or decode greedily (`false`, the default).
    pub do_sample: bool,
    /// Sampling temperature. Default `1`.
    pub temperature: f64,
    /// Top-k filter (0: none). Default `0`.
    pub top_k: i64,
    /// Nucleus filter (1: none). Default `1`.
    pub top_p: f64,
    /// Ours: prompts per forward batch. Default `16`.
    pub batch_size: usize,
    /// Ours: the sampling seed. Default `0`.
    pub seed: u64,
}

impl Default for GenerationSettings {
    fn default() -> Self {
        GenerationSettings {
            max_new_tokens: 128,
            min_new_tokens: 0,
            do_sample: false,
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            batch_size: 16,
            seed: 0,
        }
    }
}

impl GenerationSettings {
    /// The generation config (EOS / pad from the model's config, as `transformers` does).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming a field out of range.
    pub fn to_config(&self) -> Result<GenerationConfig> {
        use crate::error::require;
        const OP: &str = "[generation]";
        require(
            self.max_new_tokens >= 1,
            OP,
            "max_new_tokens",
            ">= 1",
            self.max_new_tokens,
        )?;
        require(
            self.batch_size >= 1,
            OP,
            "batch_size",
            ">= 1",
            self.batch_size,
        )?;
        let config = GenerationConfig {
            max_new_tokens: self.max_new_tokens,
            min_new_tokens: self.min_new_tokens,
            do_sample: self.do_sample,
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            ..GenerationConfig::rlhf_sampling(self.max_new_tokens)
        };
        require(
            self.temperature.is_finite() && self.temperature > 0.0,
            OP,
            "temperature",
            "a finite value > 0",
            self.temperature,
        )?;
        require(self.top_k >= 0, OP, "top_k", ">= 0", self.top_k)?;
        require(
            self.top_p > 0.0 && self.top_p <= 1.0,
            OP,
            "top_p",
            "in (0, 1]",
            self.top_p,
        )?;
        require(
            (0..=self.max_new_tokens).contains(&self.min_new_tokens),
            OP,
            "min_new_tokens",
            "in [0, max_new_tokens]",
            self.min_new_tokens,
        )?;
        Ok(config)
    }
}

/// The config file of `generate` / `eval`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GenerateConfig {
    /// How to sample.
    pub generation: GenerationSettings,
    /// The rewards (`eval` only).
    pub reward: Vec<RewardEntry>,
}

/// One generated sample.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// The prompt's index in the dataset.
    pub index: usize,
    /// The generated tokens, without EOS and padding.
    pub response: Vec<i64>,
    /// Whether the row ended with EOS (`false`: the length limit).
    pub ended_with_eos: bool,
}

/// Generates for every prompt of `prompts` in batches (left-padded).
///
/// # Errors
/// A failing forward, or a prompt that does not fit the model's context with the new tokens.
pub fn generate_all(
    model: &dyn CausalLm,
    prompts: &[(usize, Vec<i64>)],
    config: &GenerationConfig,
    batch_size: usize,
    pad: i64,
    rng: &mut Generator,
    progress: &indicatif::ProgressBar,
) -> Result<Vec<Sample>> {
    let _guard = tch::no_grad_guard();
    let mut out = Vec::with_capacity(prompts.len());
    for chunk in prompts.chunks(batch_size.max(1)) {
        let rows: Vec<Vec<i64>> = chunk.iter().map(|(_, p)| p.clone()).collect();
        let enc = pad_rows(&rows, pad, PaddingSide::Left)?;
        let device = model.device();
        let g = generate(
            model,
            &enc.input_ids.f_to_device(device)?,
            Some(&enc.attention_mask.f_to_device(device)?),
            config,
            rng,
        )?;
        let resp = Vec::<Vec<i64>>::try_from(&g.response.f_to_device(Device::Cpu)?)?;
        let mask = Vec::<Vec<i64>>::try_from(
            &g.response_mask
                .f_to_kind(Kind::Int64)?
                .f_to_device(Device::Cpu)?,
        )?;
        let eos = config.eos_token_id.or(model.facts().eos_token_id);
        for (((index, _), r), m) in chunk.iter().zip(resp).zip(mask) {
            let mut response: Vec<i64> = r
                .iter()
                .zip(&m)
                .filter(|(_, &k)| k != 0)
                .map(|(&t, _)| t)
                .collect();
            let ended = eos.is_some() && response.last() == eos.as_ref();
            if ended {
                response.pop();
            }
            out.push(Sample {
                index: *index,
                response,
                ended_with_eos: ended,
            });
        }
        progress.inc(chunk.len() as u64);
    }
    Ok(out)
}

/// Scores samples with `scorer` through the [`ScoreInput`] an env would give it.
///
/// # Errors
/// The scorer's error, or a score that is not one finite value per sample.
pub fn score_samples(
    scorer: &mut dyn Scorer,
    prompts: &[Vec<i64>],
    samples: &[Sample],
    pad: i64,
    eos: i64,
) -> Result<Vec<f64>> {
    let responses: Vec<Vec<i64>> = samples.iter().map(|s| s.response.clone()).collect();
    let ended: Vec<bool> = samples.iter().map(|s| s.ended_with_eos).collect();
    let with_eos: Vec<Vec<i64>> = samples
        .iter()
        .map(|s| {
            let mut r = s.response.clone();
            if s.ended_with_eos {
                r.push(eos);
            }
            r
        })
        .collect();
    let p = pad_rows(prompts, pad, PaddingSide::Left)?;
    let r = pad_rows(&with_eos, pad, PaddingSide::Right)?;
    let tokens = Tensor::f_cat(&[&p.input_ids, &r.input_ids], 1)?;
    let attention_mask = Tensor::f_cat(&[&p.attention_mask, &r.attention_mask], 1)?;
    let input = ScoreInput {
        prompts,
        responses: &responses,
        ended_with_eos: &ended,
        tokens: &tokens,
        attention_mask: &attention_mask,
        batch_size: samples.len() as i64,
    };
    let scores = scorer.score(&input)?;
    let v = Vec::<f64>::try_from(&scores.f_to_kind(Kind::Double)?.f_to_device(Device::Cpu)?)?;
    if v.len() != samples.len() {
        return Err(Error::invalid(
            "score_samples",
            format!("{} scores for {} samples", v.len(), samples.len()),
        ));
    }
    Ok(v)
}

/// What `eval` measured.
#[derive(Debug, Clone, PartialEq)]
pub struct EvalSummary {
    /// Samples scored.
    pub samples: usize,
    /// The mean total reward.
    pub mean_reward: f64,
    /// Each reward's name and mean.
    pub parts: Vec<(String, f64)>,
}

fn read_generate_config(path: Option<&Path>) -> Result<GenerateConfig> {
    super::parse_toml(&super::read_config_text(path)?, path)
}

struct Prepared {
    tokenizer: crate::modules::llm::HfTokenizer,
    model: Box<dyn CausalLm>,
    _vs: nn::VarStore,
    prompts: Vec<(usize, Vec<i64>)>,
    data: crate::data::llm::Dataset,
    config: GenerateConfig,
}

fn prepare(args: &GenerateArgs) -> Result<Prepared> {
    let config = read_generate_config(args.config.as_deref())?;
    config.generation.to_config()?;
    let data = load_data(&args.data)?;
    let tokenizer = load_tokenizer(&args.model)?;
    let template = load_template(&args.model)?;
    let mut enc = Encoder::new(&tokenizer);
    if let Some(t) = &template {
        enc = enc.with_chat_template(t);
    }
    let (mut prompts, _) = enc.prompts(&data)?;
    if let Some(n) = args.limit {
        prompts.truncate(n);
    }
    let vs = new_store(args.dtype);
    let model = load_model(&vs.root(), &args.model, false)?;
    Ok(Prepared {
        tokenizer,
        model,
        _vs: vs,
        prompts,
        data,
        config,
    })
}

fn write_lines(path: Option<&Path>, lines: &[Value]) -> Result<()> {
    let mut text = String::new();
    for l in lines {
        text.push_str(&l.to_string());
        text.push('\n');
    }
    match path {
        Some(p) => {
            let tmp = p.with_extension("jsonl.tmp");
            fs::write(&tmp, text).map_err(super::io_error("torchrl: --output", &tmp))?;
            fs::rename(&tmp, p).map_err(super::io_error("torchrl: --output", p))
        }
        None => std::io::stdout()
            .write_all(text.as_bytes())
            .map_err(super::io_error("torchrl: stdout", Path::new("-"))),
    }
}

fn sample_json(
    tok: &dyn TextTokenizer,
    data: &crate::data::llm::Dataset,
    prompt: &[i64],
    s: &Sample,
) -> Result<Map<String, Value>> {
    let mut obj = Map::new();
    obj.insert(
        "prompt".into(),
        Value::String(tok.decode(prompt, SpecialTokens::Keep)?),
    );
    obj.insert(
        "completion".into(),
        Value::String(tok.decode(&s.response, SpecialTokens::Skip)?),
    );
    if let Some(e) = data.examples().get(s.index) {
        for (k, v) in &e.fields {
            obj.entry(k.clone()).or_insert_with(|| v.clone());
        }
    }
    Ok(obj)
}

/// `torchrl generate`: completions for the dataset's prompts (see the [module docs](self)).
///
/// # Errors
/// Bad arguments, config, data or model folder; a failing generation.
pub fn run_generate(args: &GenerateArgs) -> Result<Vec<Sample>> {
    let p = prepare(args)?;
    if !p.config.reward.is_empty() {
        return Err(fail(
            "torchrl generate",
            "[[reward]] tables are for `torchrl eval`",
        ));
    }
    let gen_config = p.config.generation.to_config()?;
    let pad = p.tokenizer.pad_token_id().unwrap_or(0);
    let mut rng = Generator::new(p.config.generation.seed);
    let pb = bar(
        p.prompts.len() as u64,
        "generate",
        args.quiet || args.output.is_none(),
    );
    let samples = generate_all(
        p.model.as_ref(),
        &p.prompts,
        &gen_config,
        p.config.generation.batch_size,
        pad,
        &mut rng,
        &pb,
    )?;
    pb.finish();
    let lines = samples
        .iter()
        .zip(&p.prompts)
        .map(|(s, (_, prompt))| sample_json(&p.tokenizer, &p.data, prompt, s).map(Value::Object))
        .collect::<Result<Vec<_>>>()?;
    write_lines(args.output.as_deref(), &lines)?;
    Ok(samples)
}

/// `torchrl eval`: generation for the dataset's prompts, scored by the `[[reward]]` tables
/// (see the [module docs](self)).
///
/// # Errors
/// As [`run_generate`]; no `[[reward]]` table; a failing reward.
pub fn run_eval(args: &GenerateArgs) -> Result<EvalSummary> {
    let p = prepare(args)?;
    if p.config.reward.is_empty() {
        return Err(fail(
            "torchrl eval",
            "the config has no [[reward]] table to score the completions with",
        ));
    }
    let parts = build_parts(&p.config.reward, Device::Cpu)?;
    let rows = p.prompts.iter().map(|(i, ids)| {
        (
            ids.clone(),
            p.data
                .examples()
                .get(*i)
                .map(|e| e.fields.clone())
                .unwrap_or_default(),
        )
    });
    let eos = p.tokenizer.eos_token_id().unwrap_or(0);
    let mut scorer = RewardScorer::new(p.tokenizer.clone(), parts)?
        .with_rows(rows)?
        .with_eos_token_id(eos);
    let gen_config = p.config.generation.to_config()?;
    let pad = p.tokenizer.pad_token_id().unwrap_or(0);
    let mut rng = Generator::new(p.config.generation.seed);
    let pb = bar(p.prompts.len() as u64, "eval", args.quiet);
    let mut lines = Vec::with_capacity(p.prompts.len());
    let (mut total, mut n) = (0.0, 0usize);
    let mut part_sums: Vec<(String, f64, usize)> = Vec::new();
    for chunk in p.prompts.chunks(p.config.generation.batch_size.max(1) * 4) {
        let samples = generate_all(
            p.model.as_ref(),
            chunk,
            &gen_config,
            p.config.generation.batch_size,
            pad,
            &mut rng,
            &pb,
        )?;
        let ids: Vec<Vec<i64>> = chunk.iter().map(|(_, x)| x.clone()).collect();
        let scores = score_samples(&mut scorer, &ids, &samples, pad, eos)?;
        let means = scorer.last_means();
        if part_sums.is_empty() {
            part_sums = means.iter().map(|(k, _)| (k.to_string(), 0.0, 0)).collect();
        }
        for ((_, sum, count), (_, m)) in part_sums.iter_mut().zip(&means) {
            if m.is_finite() {
                *sum += m * samples.len() as f64;
                *count += samples.len();
            }
        }
        for ((s, prompt), score) in samples.iter().zip(&ids).zip(&scores) {
            let mut obj = sample_json(&p.tokenizer, &p.data, prompt, s)?;
            obj.insert("reward".into(), serde_json::json!(score));
            lines.push(Value::Object(obj));
            if score.is_finite() {
                total += score;
                n += 1;
            }
        }
    }
    pb.finish();
    let parts: Vec<(String, f64)> = part_sums
        .into_iter()
        .map(|(k, s, c)| (k, if c > 0 { s / c as f64 } else { f64::NAN }))
        .collect();
    let summary = EvalSummary {
        samples: lines.len(),
        mean_reward: if n > 0 { total / n as f64 } else { f64::NAN },
        parts,
    };
    if let Some(path) = args.output.as_deref() {
        write_lines(Some(path), &lines)?;
    }
    if !args.quiet || args.output.is_none() {
        println!(
            "eval: {} samples, mean reward {:.4}",
            summary.samples, summary.mean_reward
        );
        for (k, m) in &summary.parts {
            println!("  {k}: {m:.4}");
        }
    }
    Ok(summary)
}
