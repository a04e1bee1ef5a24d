//! What the on-policy token trainers (PPO-RLHF, GRPO) and DPO share about a
//! [`CausalLmWithHydraValueHead`]: generation settings checked against the env, the policy
//! step of a rollout (generation, then one trunk pass for the policy's and the reference's
//! log-probs and the values; GRPO's shares its groups' prompt pass and, when exact, keeps the
//! sampler's log-probs and runs the reference's side only: [`PolicyStep`]), prompt batches
//! for evaluation, decoded responses, the per-side parameter lists of a checkpoint, and
//! trainer-state fields read back from JSON.

use serde_json::Value;
use tch::{Device, Kind, Tensor};

use super::api::{
    decode_masked, encode_prompts, in_component, take_component, Component, StagedCopy,
};
use super::config::GenKwargs;
use super::optim::shallow_named;
use super::optim::{AdamW, CosineAnnealingLr, PreparedAdamW};
use crate::envs::llm::{GenerationPolicy, PromptState, TokenEnv};
use crate::error::{Error, Result};
use crate::modules::llm::generation::decode_matches_forward;
use crate::modules::llm::keys::{
    ASSISTANT_MASK_KEY, ATTENTION_MASK_KEY, FULL_KEY, FULL_LOG_PROBS_KEY, PROMPT_KEY,
    PROMPT_MASK_KEY, REF_LOG_PROBS_KEY, RESPONSE_KEY,
};
use crate::modules::llm::nn::packed::PackedWeightCache;
use crate::modules::llm::{check_tokenizer_fits, CachedTrunk, ScoreTokens};
use crate::modules::llm::{CausalLmWithHydraValueHead, GenerationConfig, TextTokenizer};
use crate::rng::Generator;
use crate::tensordict::TensorDict;

/// The generation config of `kw` (a trainer's `gen_kwargs`) over the env's EOS / pad ids.
/// `field` names the kwargs in errors (`"method.gen_kwargs"`).
///
/// # Errors
/// When `max_new_tokens` differs from the env's response width.
pub(crate) fn generation_config(
    op: &'static str,
    field: &'static str,
    kw: &GenKwargs,
    env: &TokenEnv,
) -> Result<GenerationConfig> {
    let base = env.config().generation_config();
    let mut cfg = GenerationConfig {
        max_new_tokens: kw.max_new_tokens as i64,
        do_sample: kw.do_sample,
        temperature: kw.temperature,
        top_k: kw.top_k as i64,
        top_p: kw.top_p,
        ..base
    };
    if cfg.max_new_tokens != env.config().max_new_tokens {
        return Err(Error::config(
            op,
            field,
            format!(
                "max_new_tokens = the env's response width, {}",
                env.config().max_new_tokens
            ),
            cfg.max_new_tokens,
        ));
    }
    cfg.min_new_tokens = 0;
    Ok(cfg)
}

/// Errors unless the tokenizer and the env share the model's vocabulary.
pub(crate) fn check_vocab(
    op: &'static str,
    model: &CausalLmWithHydraValueHead,
    env: &TokenEnv,
    tokenizer: &dyn TextTokenizer,
) -> Result<()> {
    let vocab = model.policy().model().facts().vocab_size;
    check_tokenizer_fits(op, tokenizer, vocab)?;
    if env.config().vocab_size != vocab {
        return Err(Error::argument(
            op,
            "env",
            format!("a TokenEnv over the model's vocabulary size {vocab}"),
            format!("vocab_size {}", env.config().vocab_size),
        ));
    }
    Ok(())
}

/// How [`hydra_policy_step`] runs beyond the generation config.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct PolicyStep<'a> {
    /// Keep the frozen trunk's output under [`CachedTrunk::KEY`] (when the model has a frozen
    /// trunk), so that the updates can start above it ([`update_policy`]).
    pub(crate) keep_trunk: bool,
    /// The prompts come in consecutive groups of this many identical rows (GRPO's env):
    /// generation runs each group's prompt pass once
    /// ([`GenerateOptions::prompt_groups`](crate::modules::llm::GenerateOptions::prompt_groups)).
    /// 0 or 1: no groups.
    pub(crate) prompt_groups: usize,
    /// Take the policy's log-probs from the sampler when they are the model's
    /// ([`GenerationConfig::log_probs_are_the_models`]) and run only the reference's side of
    /// the hydra model ([`CausalLmWithHydraValueHead::forward_reference`]); no `"values"` are
    /// written then (for a method without a value head).
    pub(crate) sampler_log_probs: bool,
    /// Keep the frozen trunk's output from the generation
    /// ([`GenerateOptions::capture_block_input`](crate::modules::llm::GenerateOptions::capture_block_input))
    /// when the decode computes the model's own values ([`decode_matches_forward`]): the
    /// scoring pass then starts above the trunk instead of running it again over the
    /// sequences.
    pub(crate) trunk_from_generation: bool,
    /// Where the generation keeps its packed frozen weights across rollouts
    /// ([`GenerateOptions::packed_weights`](crate::modules::llm::GenerateOptions::packed_weights)).
    pub(crate) packed_weights: Option<&'a PackedWeightCache>,
}

/// The rollout's policy step on a tensordict holding `("tokens", "prompt")` and its mask:
/// the policy generates (seeded from `rng`; `step` says whether the prompts come in groups),
/// then **one pass** of the hydra model over prompt + response writes `("log_probs",
/// "full")` (the policy's, from raw logits), `("ref_log_probs", "full")` (the frozen
/// reference's) and `"values"`, all without gradient; with [`PolicyStep::keep_trunk`], also
/// the frozen trunk's output. Both log-probs are in
/// [`token_log_probs`](crate::modules::llm::token_log_probs)' layout on the response and 0
/// on the prompt: the LM heads run from the first response position on
/// ([`ScoreRequest::scored_from`](crate::modules::llm::ScoreRequest::scored_from)), as no
/// consumer of a rollout reads a prompt token's log-prob (the losses, the KL penalty and the
/// statistics take the assistant tokens).
///
/// With [`PolicyStep::sampler_log_probs`], when the sampler's log-probs are the model's
/// ([`GenerationConfig::log_probs_are_the_models`]: temperature 1 or greedy, a float32 /
/// float64 model, no dropout), `("log_probs", "full")` is the sampler's instead, in the same
/// layout;
/// the pass then runs the reference's side only
/// ([`CausalLmWithHydraValueHead::forward_reference`]: not the policy's upper blocks, LM head
/// or value head) and writes no `"values"`.
///
/// With [`PolicyStep::trunk_from_generation`], when the model has a frozen trunk and the decode
/// computes its own values ([`decode_matches_forward`]), the generation keeps the trunk's
/// output at every position it fed and the pass starts above it: the trunk does not run a
/// second time.
pub(crate) fn hydra_policy_step(
    model: &CausalLmWithHydraValueHead,
    rng: &mut Generator,
    td: TensorDict,
    gen: &GenerationConfig,
    step: PolicyStep<'_>,
) -> Result<TensorDict> {
    let seed = rng.next_u64();
    let lm = model.policy().model();
    let sampler = step.sampler_log_probs && gen.log_probs_are_the_models(lm);
    // the decode's frozen-trunk output, when it is the model's (as the sampler's log-probs)
    let capture = match model.frozen_trunk_end() {
        Some(end) if step.trunk_from_generation && decode_matches_forward(lm) => Some(end),
        _ => None,
    };
    let mut policy = GenerationPolicy::new(model.policy(), gen.clone(), seed)?
        .with_full_log_probs(sampler)
        .with_prompt_groups(step.prompt_groups)
        .with_trunk_capture(capture);
    if let Some(cache) = step.packed_weights {
        policy = policy.with_packed_weights(cache.clone());
    }
    let mut td = policy.call(td)?;
    let captured = take_trunk(&mut td);
    let _guard = tch::no_grad_guard();
    let tokens = td.get_or_err(FULL_KEY)?.shallow_clone();
    let mask = td.get_or_err(ATTENTION_MASK_KEY)?.shallow_clone();
    // every LM head from the first response position on (the prompts' width): no consumer
    // of a rollout reads a prompt token's log-prob
    let response_start = td
        .get_or_err(PROMPT_KEY)?
        .size()
        .get(1)
        .copied()
        .unwrap_or(0);
    let scores =
        model.rollout_scores(&tokens, &mask, response_start, !sampler, captured.as_ref())?;
    let lp = match scores.log_probs {
        Some(lp) => lp,
        None => mask_like_token_log_probs(td.get_or_err(FULL_LOG_PROBS_KEY)?, &mask)?,
    };
    td.set(FULL_LOG_PROBS_KEY, lp)?;
    td.set(REF_LOG_PROBS_KEY, scores.ref_log_probs)?;
    if let Some(values) = scores.values {
        td.set("values", values)?;
    }
    if let (true, Some(trunk)) = (step.keep_trunk, scores.trunk) {
        td.set(CachedTrunk::KEY, trunk)?;
    }
    Ok(td)
}

/// Removes the trunk [`GenerationPolicy::with_trunk_capture`] wrote (and its level, left
/// empty), so that the rollout's keys and their order are as without it.
fn take_trunk(td: &mut TensorDict) -> Option<Tensor> {
    let trunk = td.remove(CachedTrunk::KEY)?;
    let level = CachedTrunk::KEY.0;
    if td.get_dict(level).is_some_and(TensorDict::is_empty) {
        td.remove(level);
    }
    trunk.as_tensor().map(Tensor::shallow_clone)
}

/// `lp` `[B, T]` with [`token_log_probs`](crate::modules::llm::token_log_probs)' masking
/// under `mask` `[B, T]`: 0 at `t = 0` and
/// wherever the token or the one before it is padding.
fn mask_like_token_log_probs(lp: &Tensor, mask: &Tensor) -> Result<Tensor> {
    let (b, t) = mask.size2()?;
    if t == 0 {
        return Ok(lp.shallow_clone());
    }
    let m = mask.f_to_kind(Kind::Float)?;
    let first = Tensor::f_zeros([b, 1], (Kind::Float, m.device()))?;
    let prev = Tensor::f_cat(&[&first, &m.f_narrow(1, 0, t - 1)?], 1)?;
    Ok(lp.f_mul(&m)?.f_mul(&prev)?)
}

/// The policy an update step trains on the minibatch `mb`: continued from the rollout's
/// frozen-trunk output when `mb` holds it ([`CachedTrunk`]: the frozen blocks are not run
/// again), else the whole policy.
pub(crate) fn update_policy<'a>(
    model: &'a CausalLmWithHydraValueHead,
    mb: &TensorDict,
) -> Box<dyn ScoreTokens + 'a> {
    match (mb.get(CachedTrunk::KEY), model.frozen_trunk_end()) {
        (Some(hidden), Some(start)) => Box::new(CachedTrunk::new(
            model.policy(),
            hidden.shallow_clone(),
            start,
        )),
        _ => Box::new(model.policy()),
    }
}

/// `prompts` encoded and left-padded with `pad` into a `("tokens", "prompt")` batch with
/// its `("masks", "prompt_attention_mask")`, on `device`.
pub(crate) fn prompt_batch(
    op: &'static str,
    tokenizer: &dyn TextTokenizer,
    prompts: &[String],
    pad: i64,
    device: Device,
) -> Result<TensorDict> {
    let enc = encode_prompts(op, tokenizer, prompts, pad)?;
    TensorDict::new([prompts.len() as i64])?
        .with(PROMPT_KEY, enc.input_ids.f_to_device(device)?)?
        .with(PROMPT_MASK_KEY, enc.attention_mask.f_to_device(device)?)
}

/// Generates with the policy on a [`prompt_batch`] and decodes the responses (special tokens
/// skipped), in prompt order.
pub(crate) fn generate_text(
    model: &CausalLmWithHydraValueHead,
    tokenizer: &dyn TextTokenizer,
    rng: &mut Generator,
    td: TensorDict,
    gen: GenerationConfig,
) -> Result<Vec<String>> {
    let seed = rng.next_u64();
    let mut policy = GenerationPolicy::new(model.policy(), gen, seed)?;
    let td = policy.call(td)?;
    decode_responses(tokenizer, &td)
}

/// Decodes the responses of a policy step, special tokens skipped.
pub(crate) fn decode_responses(
    tokenizer: &dyn TextTokenizer,
    td: &TensorDict,
) -> Result<Vec<String>> {
    let resp = td.get_or_err(RESPONSE_KEY)?;
    let r = resp.size().last().copied().unwrap_or(0);
    let full_mask = td.get_or_err(ASSISTANT_MASK_KEY)?;
    let t = full_mask.size().last().copied().unwrap_or(0);
    decode_masked(tokenizer, resp, &full_mask.f_narrow(1, t - r, r)?)
}

/// Every policy parameter (trunk and value head) by name.
pub(crate) fn policy_params(model: &CausalLmWithHydraValueHead) -> Vec<(String, Tensor)> {
    shallow_named(model.policy().named_parameters())
}

/// The policy's trainable parameters (trunk blocks above the frozen ones and the value head)
/// by name; without the value head when `with_value_head` is false (GRPO, DPO).
pub(crate) fn trainable_params(
    model: &CausalLmWithHydraValueHead,
    with_value_head: bool,
) -> Vec<(String, Tensor)> {
    let mut named = policy_params(model);
    named.retain(|(name, p)| p.requires_grad() && (with_value_head || !name.starts_with("v_head")));
    named
}

/// The frozen reference branch's parameters, sorted by name.
pub(crate) fn reference_params(model: &CausalLmWithHydraValueHead) -> Vec<(String, Tensor)> {
    let mut named: Vec<(String, Tensor)> =
        model.reference_store().variables().into_iter().collect();
    named.sort_by(|a, b| a.0.cmp(&b.0));
    named
}

/// The env's prompt position as a trainer-state field.
pub(crate) fn prompt_state_json(env: &TokenEnv) -> Value {
    serde_json::to_value(env.prompt_state()).unwrap_or(Value::Null)
}

/// The prompt position saved by [`prompt_state_json`], read but not applied (`None` when
/// absent: a checkpoint written before it was saved leaves the env as it is).
pub(crate) fn prompt_state_from_json(
    op: &'static str,
    state: &Value,
) -> Result<Option<PromptState>> {
    match state.get("prompts") {
        None | Some(Value::Null) => Ok(None),
        Some(v) => serde_json::from_value(v.clone())
            .map(Some)
            .map_err(|e| Error::value(op, "trainer state", "prompts", e.to_string())),
    }
}

/// Reads fields of a trainer's saved JSON state, with errors naming the field.
pub(crate) struct StateFields<'a> {
    op: &'static str,
    state: &'a Value,
}

impl<'a> StateFields<'a> {
    pub(crate) fn new(op: &'static str, state: &'a Value) -> Self {
        StateFields { op, state }
    }

    pub(crate) fn field(&self, name: &str) -> Result<&'a Value> {
        self.state.get(name).ok_or_else(|| {
            Error::value(
                self.op,
                "trainer state",
                format!("a field {name:?}"),
                self.state.to_string(),
            )
        })
    }

    pub(crate) fn f64(&self, name: &str) -> Result<f64> {
        let v = self.field(name)?;
        v.as_f64().ok_or_else(|| {
            Error::value(
                self.op,
                "trainer state",
                format!("{name} as a number"),
                v.to_string(),
            )
        })
    }
}

/// `0..n` shuffled by Fisher-Yates on the trainer's own generator (so a resumed run draws the
/// same minibatches as an uninterrupted one).
pub(crate) fn shuffled(rng: &mut Generator, n: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        idx.swap(i, j);
    }
    idx
}

/// [`shuffled`] as an int64 index tensor on `device`.
pub(crate) fn permutation(rng: &mut Generator, n: i64, device: Device) -> Result<Tensor> {
    let idx: Vec<i64> = shuffled(rng, n.max(0) as usize)
        .into_iter()
        .map(|i| i as i64)
        .collect();
    Ok(Tensor::f_from_slice(&idx)?.f_to_device(device)?)
}

/// Errors (naming `op`) unless a rollout store handed to `learn_on` has at least one row.
pub(crate) fn check_store_rows(op: &'static str, store: &TensorDict) -> Result<()> {
    if store.batch_size().first().copied().unwrap_or(0) < 1 {
        return Err(Error::value(
            op,
            "store",
            "at least one rollout along the first batch dim",
            format!("batch size {:?}", store.batch_size()),
        ));
    }
    Ok(())
}

/// The checkpoint components of a hydra-model trainer: the policy (`model`: trunk and value
/// head), the frozen `reference`, the optimizer, the schedule, and the trainer's own state.
pub(crate) fn hydra_components(
    model: &CausalLmWithHydraValueHead,
    opt: &AdamW,
    sched: &CosineAnnealingLr,
    trainer_state: Value,
) -> Vec<(String, Component)> {
    vec![
        ("model".into(), Component::tensors(policy_params(model))),
        (
            "reference".into(),
            Component::tensors(reference_params(model)),
        ),
        ("opt".into(), Component::from_adamw(opt)),
        ("scheduler".into(), Component::from_scheduler(sched)),
        ("trainer".into(), Component::json(trainer_state)),
    ]
}

/// [`hydra_components`]' model, reference, optimizer and schedule read from `components`
/// and checked, nothing written yet ([`HydraRestore::commit`] writes them), and the
/// trainer's own state for the caller to read and check before committing.
pub(crate) fn prepare_hydra_components(
    model: &CausalLmWithHydraValueHead,
    opt: &AdamW,
    components: &mut Vec<(String, Component)>,
) -> Result<(HydraRestore, Value)> {
    let named = |name: &'static str| move |e| in_component(name, e);
    let policy = take_component(components, "model")?
        .stage_into(&policy_params(model))
        .map_err(named("model"))?;
    let reference_params = reference_params(model);
    // an adapters-off reference owns no parameter: the checkpoint holds no such component
    // (a component without tensors or state is not written)
    let reference = if reference_params.is_empty() {
        take_component(components, "reference").unwrap_or_default()
    } else {
        take_component(components, "reference")?
    }
    .stage_into(&reference_params)
    .map_err(named("reference"))?;
    let o = take_component(components, "opt")?;
    let opt = opt
        .prepare_state(&o.tensors, &o.state)
        .map_err(named("opt"))?;
    let s = take_component(components, "scheduler")?;
    let sched = CosineAnnealingLr::from_state_json(&s.state).map_err(named("scheduler"))?;
    let state = take_component(components, "trainer")?.state;
    let restore = HydraRestore {
        policy,
        reference,
        opt,
        sched,
    };
    Ok((restore, state))
}

/// What [`prepare_hydra_components`] read and checked.
pub(crate) struct HydraRestore {
    policy: StagedCopy,
    reference: StagedCopy,
    opt: PreparedAdamW,
    sched: CosineAnnealingLr,
}

impl HydraRestore {
    /// Writes the parameters, the optimizer's state and the schedule (copies of checked,
    /// converted values: only libtorch's copy can fail).
    pub(crate) fn commit(self, opt: &mut AdamW, sched: &mut CosineAnnealingLr) -> Result<()> {
        self.policy.commit()?;
        self.reference.commit()?;
        opt.commit_state(self.opt)?;
        *sched = self.sched;
        opt.set_lr(sched.lr());
        Ok(())
    }
}

/// trlX's `sample(prompts, length, n_samples)` on a hydra policy: each prompt `n_samples`
/// times, left-padded with `pad`, `length` new tokens with `gen`'s other settings, decoded.
#[allow(clippy::too_many_arguments)]
pub(crate) fn sample_prompts(
    op: &'static str,
    model: &CausalLmWithHydraValueHead,
    tokenizer: &dyn TextTokenizer,
    rng: &mut Generator,
    prompts: &[String],
    length: usize,
    n_samples: usize,
    gen: &GenerationConfig,
    pad: i64,
) -> Result<Vec<String>> {
    let repeated: Vec<String> = prompts
        .iter()
        .flat_map(|p| std::iter::repeat_n(p.clone(), n_samples))
        .collect();
    if repeated.is_empty() {
        return Ok(Vec::new());
    }
    let device = model.policy().model().device();
    let td = prompt_batch(op, tokenizer, &repeated, pad, device)?;
    let gen = GenerationConfig {
        max_new_tokens: length as i64,
        ..gen.clone()
    };
    generate_text(model, tokenizer, rng, td, gen)
}
