//! The flagship's GRPO and DPO stages, and what the comparison table measures for every
//! method: the hidden-rule score on held-out prompts, the KL of the trained sampler to the
//! SFT reference, and the wall time.
//!
//! **KL to the reference.** For each held-out prompt the trained sampler draws one response;
//! along it, every response position contributes the exact per-state KL
//! `Σ_v π(v | s) (log π(v | s) − log π_ref(v | s))` (not a one-sample estimate); the table
//! shows the sum over the response, averaged over prompts. For PPO, GRPO and DPO `π` is the
//! hydra policy and `π_ref` its frozen reference (the SFT model); for ILQL `π` is the β-shaped,
//! top-k sampler `softmax(log π_lm + β (min Q̂ − V))` and `π_ref` the SFT model.

use std::path::Path;
use std::time::Instant;

use tch::{nn, Device, Kind, Tensor};
use torchrl::envs::llm::{RewardModelScorer, TokenEnv, TokenEnvConfig};
use torchrl::modules::llm::{
    ilql_scores, models, pad_rows, CausalLm, CausalLmWithHydraValueHead, CausalLmWithIlqlHeads,
    CausalLmWithScoreHead, LmInput, PaddingSide, TextTokenizer,
};
use torchrl::trainers::api::{Callbacks, Evaluation, RlTrainer};
use torchrl::trainers::config::GenKwargs;
use torchrl::trainers::dpo::{DpoPair, DpoTrainer, DpoTrlConfig};
use torchrl::trainers::grpo::{GrpoLossType, GrpoTrainer, GrpoTrlConfig, ScaleRewards};
use torchrl::trainers::parallel::{rank_seed, Collective, SharedCollective};
use torchrl::trainers::policy::hydra_policy;
use torchrl::{Result, TensorDict};

use super::{bar, task, Config, MAX_NEW_TOKENS};

/// One row of the comparison table.
#[derive(Debug, Clone, PartialEq)]
pub struct MethodRow {
    pub method: String,
    /// Hidden-rule score of samples on the held-out prompts.
    pub score: f64,
    /// The KL of the trained sampler to the SFT reference (see the module docs).
    pub kl: f64,
    /// Seconds the stage took (data collection, training and its evaluations); NaN for the
    /// SFT row (its time is the shared first stage's).
    pub seconds: f64,
}

impl MethodRow {
    /// The row of a stage that ran on a rank other than 0 (which evaluates for the group).
    fn not_measured(method: &str) -> Self {
        MethodRow {
            method: method.into(),
            score: f64::NAN,
            kl: f64::NAN,
            seconds: f64::NAN,
        }
    }
}

/// Sum over response positions of the exact per-state KL between two next-token log-prob
/// tensors `[B, T, V]` (position `t` predicts token `t + 1`), averaged over the rows;
/// `assistant` `[B, T]` marks the response tokens.
pub fn response_kl(logp: &Tensor, ref_logp: &Tensor, assistant: &Tensor) -> Result<f64> {
    let t = logp.size()[1];
    let per_state = logp
        .f_exp()?
        .f_mul(&logp.f_sub(ref_logp)?)?
        .f_nan_to_num(0.0, None, None)? // 0 · (−inf − x) on top-k-filtered tokens
        .f_sum_dim_intlist(-1, false, Kind::Double)?
        .f_narrow(1, 0, t - 1)?;
    let mask = assistant.f_narrow(1, 1, t - 1)?.f_to_kind(Kind::Double)?;
    Ok(per_state
        .f_mul(&mask)?
        .f_sum_dim_intlist(1, false, Kind::Double)?
        .f_mean(Kind::Double)?
        .double_value(&[]))
}

/// `prompts` as a left-padded `("tokens", "prompt")` batch.
pub fn prompt_batch(tok: &dyn TextTokenizer, prompts: &[String]) -> Result<TensorDict> {
    let rows: Vec<Vec<i64>> = prompts
        .iter()
        .map(|p| tok.encode(p))
        .collect::<Result<_>>()?;
    let enc = pad_rows(&rows, tok.pad_token_id().unwrap_or(0), PaddingSide::Left)?;
    TensorDict::new([prompts.len() as i64])?
        .with(("tokens", "prompt"), enc.input_ids)?
        .with(("masks", "prompt_attention_mask"), enc.attention_mask)
}

/// The KL of a hydra policy's sampler to its frozen reference along the responses of `td`
/// (a trainer's `act` on a [`prompt_batch`]): one trunk pass for both distributions.
pub fn hydra_kl(model: &CausalLmWithHydraValueHead, td: &TensorDict) -> Result<f64> {
    let tokens = td.get_or_err(("tokens", "full"))?;
    let mask = td.get_or_err(("masks", "all_attention_mask"))?;
    let assistant = td.get_or_err(("masks", "all_assistant_mask"))?;
    let _guard = tch::no_grad_guard();
    let out = model.forward(&LmInput::new(tokens).with_attention_mask(mask))?;
    response_kl(
        &out.logits.f_log_softmax(-1, Kind::Float)?,
        &out.ref_logits.f_log_softmax(-1, Kind::Float)?,
        assistant,
    )
}

/// The KL of ILQL's β-shaped top-k sampler to the SFT model along `sequences` `[B, T]`
/// (`attention_mask`, and `response_mask` `[B, T]` on the response tokens).
pub fn ilql_kl(
    model: &CausalLmWithIlqlHeads,
    sft: &dyn CausalLm,
    sequences: &Tensor,
    attention_mask: &Tensor,
    response_mask: &Tensor,
    beta: f64,
    top_k: i64,
) -> Result<f64> {
    let _guard = tch::no_grad_guard();
    let (b, t) = sequences.size2()?;
    let all = Tensor::arange(t, (Kind::Int64, sequences.device()))
        .f_unsqueeze(0)?
        .f_expand([b, t], false)?
        .contiguous();
    let input = LmInput::new(sequences).with_attention_mask(attention_mask);
    let out = model.forward(&input, Some(&all), Some(&all))?;
    let v = out.heads.vs.f_reshape([b * t])?;
    let flat = |x: &Tensor| x.f_reshape([b * t, -1]);
    let target_qs = out
        .heads
        .target_qs
        .iter()
        .map(flat)
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let scores = ilql_scores(&flat(&out.logits)?, &target_qs, &v, beta, top_k)?;
    let logp = scores
        .probs(1.0)?
        .f_log()?
        .f_reshape([b, t, -1])?
        .f_to_kind(Kind::Float)?;
    let ref_logits = sft.forward(&input, None)?.logits()?;
    response_kl(
        &logp,
        &ref_logits.f_log_softmax(-1, Kind::Float)?,
        response_mask,
    )
}

fn grpo_config(cfg: &Config, world: usize) -> GrpoTrlConfig {
    let mut c = GrpoTrlConfig::default();
    c.train.seq_length = 32;
    c.train.epochs = cfg.iterations;
    c.train.total_steps = 1_000_000;
    c.train.batch_size = cfg.batch / world;
    c.train.log_interval = 1_000_000;
    c.train.eval_interval = 1_000_000;
    c.train.checkpoint_interval = 1_000_000;
    c.train.checkpoint_dir = cfg.out.join("grpo_checkpoints").display().to_string();
    c.train.seed = cfg.seed;
    c.model = cfg.model_config();
    // the flagship's rate (TRL's 1e-6 is for billion-parameter models)
    c.optimizer.kwargs.lr = cfg.policy_lr();
    c.scheduler.kwargs.eta_min = cfg.policy_lr();
    let m = &mut c.method;
    m.num_generations = 8;
    m.num_rollouts = cfg.rollouts / world;
    m.chunk_size = cfg.rollouts / world;
    m.num_iterations = 2;
    m.beta = 0.04;
    m.epsilon_high = Some(0.28); // DAPO's clip-higher
    m.loss_type = GrpoLossType::Dapo;
    m.scale_rewards = ScaleRewards::Group;
    m.gen_kwargs = GenKwargs {
        max_new_tokens: MAX_NEW_TOKENS as usize,
        ..GenKwargs::default()
    };
    c
}

/// The GRPO stage: the SFT model as a hydra policy (top block trains, its frozen copy is the
/// reference), groups of 8 completions per prompt scored by the reward model, TRL's group
/// advantages, DAPO's loss with clip-higher and a k3 KL term. Returns its table row.
pub fn run_grpo(
    cfg: &Config,
    tok: &dyn TextTokenizer,
    sft_dir: &Path,
    rm_dir: &Path,
    prompts: &[String],
    eval_prompts: &[String],
    group: Option<&SharedCollective>,
) -> Result<MethodRow> {
    let start = Instant::now();
    let (rank, world) = group.map_or((0, 1), |g| (g.rank(), g.world_size()));
    tch::manual_seed(cfg.seed as i64 + 103); // the value head's init, the same on a resumed run
    let vs = nn::VarStore::new(Device::Cpu);
    let sft = models::from_pretrained(&vs.root(), sft_dir)?;
    let config = grpo_config(cfg, world);
    let model = hydra_policy(&vs.root(), sft, &config.model)?;
    let rm_vs = nn::VarStore::new(Device::Cpu);
    let rm = CausalLmWithScoreHead::from_pretrained(&rm_vs.root(), rm_dir)?;
    let prompt_refs: Vec<&str> = prompts.iter().map(String::as_str).collect();
    let env_config = TokenEnvConfig::for_model(model.policy().model().facts())
        .with_max_new_tokens(MAX_NEW_TOKENS)
        .with_batch_size((cfg.rollouts / world) as i64)
        .with_num_generations(config.method.num_generations as i64)
        .with_shuffle(true)
        .with_seed(rank_seed(cfg.seed + 3, rank));
    let env = TokenEnv::from_text(
        env_config,
        tok,
        &prompt_refs,
        Box::new(RewardModelScorer::new(rm)),
    )?;
    let hidden = |s: &[String]| Ok(s.iter().map(|x| task::hidden_score(x)).collect());
    let mut trainer = GrpoTrainer::new(config, model, env, cfg.tokenizer()?)?
        .with_evaluation(Evaluation::new(eval_prompts.to_vec()).with_reward_fn(hidden));
    if let Some(g) = group {
        trainer = trainer.with_collective(g.clone())?;
    }
    let pb = bar(cfg.iterations, "GRPO", cfg.quiet);
    let mut callbacks = Callbacks::new();
    for _ in 0..cfg.iterations {
        let s = trainer.iteration(&mut callbacks)?;
        pb.set_message(format!("rm score {:.3} KL {:.3}", s.score, s.kl));
        pb.inc(1);
    }
    pb.finish();
    if rank > 0 {
        return Ok(MethodRow::not_measured("GRPO"));
    }
    let score = trainer.evaluate()?.mean_reward.unwrap_or(f64::NAN);
    let td = trainer.act(&prompt_batch(tok, eval_prompts)?)?;
    let kl = hydra_kl(trainer.model(), &td)?;
    Ok(MethodRow {
        method: "GRPO".into(),
        score,
        kl,
        seconds: start.elapsed().as_secs_f64(),
    })
}

fn dpo_config(cfg: &Config, world: usize) -> DpoTrlConfig {
    let mut c = DpoTrlConfig::default();
    c.train.seq_length = 32;
    c.train.epochs = cfg.dpo_epochs;
    c.train.total_steps = 1_000_000;
    c.train.batch_size = cfg.batch / world;
    c.train.log_interval = 1_000_000;
    c.train.eval_interval = 1_000_000;
    c.train.checkpoint_interval = 1_000_000;
    c.train.checkpoint_dir = cfg.out.join("dpo_checkpoints").display().to_string();
    c.train.seed = cfg.seed;
    c.model = cfg.model_config();
    c.optimizer.kwargs.lr = cfg.policy_lr();
    c.scheduler.kwargs.eta_min = cfg.policy_lr();
    c.method.beta = 0.1;
    c.method.precompute_ref_log_probs = true;
    c.method.gen_kwargs.max_new_tokens = MAX_NEW_TOKENS as usize;
    c
}

/// The DPO stage: the SFT model as a hydra policy (top block trains, its frozen copy is the
/// reference) trained on the preference pairs the reward model learned from, no reward model
/// and no sampling during training. Returns its table row and the held-out pairs' accuracy.
pub fn run_dpo(
    cfg: &Config,
    tok: &dyn TextTokenizer,
    sft_dir: &Path,
    pairs: Vec<DpoPair>,
    test_pairs: &[DpoPair],
    eval_prompts: &[String],
    group: Option<&SharedCollective>,
) -> Result<(MethodRow, f64)> {
    let start = Instant::now();
    let (rank, world) = group.map_or((0, 1), |g| (g.rank(), g.world_size()));
    tch::manual_seed(cfg.seed as i64 + 104); // the value head's init, the same on a resumed run
    let vs = nn::VarStore::new(Device::Cpu);
    let sft = models::from_pretrained(&vs.root(), sft_dir)?;
    let config = dpo_config(cfg, world);
    let model = hydra_policy(&vs.root(), sft, &config.model)?;
    let hidden = |s: &[String]| Ok(s.iter().map(|x| task::hidden_score(x)).collect());
    let mut trainer = DpoTrainer::new(config, model, pairs, cfg.tokenizer()?)?
        .with_evaluation(Evaluation::new(eval_prompts.to_vec()).with_reward_fn(hidden));
    if let Some(g) = group {
        trainer = trainer.with_collective(g.clone())?;
    }
    let pb = bar(cfg.dpo_epochs, "DPO", cfg.quiet);
    let mut callbacks = Callbacks::new();
    for _ in 0..cfg.dpo_epochs {
        let s = trainer.train_epoch(&mut callbacks)?;
        pb.set_message(format!(
            "loss {:.3} acc {:.2}",
            s.get("loss").copied().unwrap_or(f64::NAN),
            s.get("rewards/accuracies").copied().unwrap_or(f64::NAN)
        ));
        pb.inc(1);
    }
    pb.finish();
    if rank > 0 {
        return Ok((MethodRow::not_measured("DPO"), f64::NAN));
    }
    let held_out = trainer.evaluate_pairs(test_pairs)?;
    let score = trainer.evaluate()?.mean_reward.unwrap_or(f64::NAN);
    let td = trainer.act(&prompt_batch(tok, eval_prompts)?)?;
    let kl = hydra_kl(trainer.model(), &td)?;
    let row = MethodRow {
        method: "DPO".into(),
        score,
        kl,
        seconds: start.elapsed().as_secs_f64(),
    };
    Ok((
        row,
        held_out
            .get("rewards/accuracies")
            .copied()
            .unwrap_or(f64::NAN),
    ))
}

/// Prints the comparison table.
pub fn print_table(rows: &[MethodRow]) {
    println!(
        "{:<22} {:>18} {:>14} {:>8}",
        "method", "hidden-rule score", "KL to SFT ref", "time s"
    );
    for r in rows {
        let seconds = if r.seconds.is_finite() {
            format!("{:.1}", r.seconds)
        } else {
            "-".to_string()
        };
        println!(
            "{:<22} {:>18.3} {:>14.3} {:>8}",
            r.method, r.score, r.kl, seconds
        );
    }
}
