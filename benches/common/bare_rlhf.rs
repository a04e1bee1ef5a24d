//! Bare-`tch` floor pieces of the RLHF benches (GRPO, DPO, PPO-RLHF: `benches/grpo_dpo.rs`,
//! and `bare_ppo.rs` for `benches/rlhf.rs`), on top of `bare_gpt2.rs`'s GPT-2 forward: the
//! seeded models, the hydra model's passes (log-probs, reference log-probs and values, the
//! frozen trunk kept), per-token log-probs, a reward model's scores, sampling with EOS, the
//! trainers' minibatch permutation, GRPO's group advantages and DAPO loss, DPO's sigmoid loss
//! and left-padded collation. Each is the math our library computes for the same thing (the
//! library function is named on each item), as the bare ops that math needs, with the same
//! parameter tensors (shallow clones: gradients and optimizer steps reach the model's
//! tensors). They take and return tensors, so that any bench can compose them; a bench that
//! uses them checks once that its bare loop and ours give the same outputs.
//!
//! Where our code computes something the math does not need, these leave it out (each item
//! says what): e.g. the LM head and log-softmax run only on the positions whose next-token
//! log-prob is used (the final norm too), and no value head runs where no value is used.

#![allow(dead_code)] // each bench uses some of these

use std::collections::HashMap;

use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};
use torchrl::modules::llm::{
    CausalLmWithHydraValueHead, CausalLmWithScoreHead, Gpt2Config, Gpt2Model,
};
use torchrl::{Generator, Result};

use super::bare_gpt2::{
    gather_rows, padded_blocked, pair, positions_from_mask, sample_rows, BareBlock, BareGpt2,
    BareHead,
};

// ------------------------------------------------------------------------------ models

/// A hydra policy and a reward model with their stores (kept alive with the models).
pub type HydraAndRewardModel = (
    VarStore,
    CausalLmWithHydraValueHead,
    VarStore,
    CausalLmWithScoreHead,
);

/// The hydra policy of `cfg` (`unfrozen` trainable blocks, `num_layers_unfrozen`) and a GPT-2
/// reward model of the same config, random-init from `tch::manual_seed(0)`: every call gives
/// the same parameters, so that ours and a floor start from equal models.
///
/// # Errors
/// When a model cannot be built from `cfg`.
pub fn hydra_and_reward_model(cfg: &Gpt2Config, unfrozen: i64) -> Result<HydraAndRewardModel> {
    tch::manual_seed(0);
    let mut vs = VarStore::new(Device::Cpu);
    let mut rm_vs = VarStore::new(Device::Cpu);
    if super::env_or("TORCHRL_BENCH_BF16", 0u8) == 1 {
        // every variable made in bfloat16 (the benches' bf16 rows)
        vs.set_kind(tch::Kind::BFloat16);
        rm_vs.set_kind(tch::Kind::BFloat16);
    }
    let model = CausalLmWithHydraValueHead::new(&vs.root(), cfg, unfrozen)?;
    let rm = CausalLmWithScoreHead::from_model(&rm_vs.root(), Gpt2Model::new(&rm_vs.root(), cfg)?)?;
    Ok((vs, model, rm_vs, rm))
}

// ------------------------------------------------------------------------------ hydra

/// A hydra model (`CausalLmWithHydraValueHead` with a branch reference, `num_layers_unfrozen
/// ≥ 1`) as bare parameters: the policy GPT-2 and its value head, and the frozen reference
/// branch (copies of the top blocks and of the final norm, over the policy's frozen trunk).
pub struct BareHydra {
    /// The policy: every block, its final norm and the tied LM head (`wte`).
    pub policy: BareGpt2,
    /// The policy's value head (trlX's `MlpHead`, one output); only PPO-RLHF reads a value.
    pub v_head: BareHead,
    /// The reference branch as a [`BareGpt2`]: `blocks` are the branch's (block `i` replaces
    /// policy block `start + i`), `ln_f` is its own final norm, `wte` its LM head (the
    /// policy's frozen embedding, shared, unless the branch holds a copy); `wpe` is the
    /// policy's and unused.
    pub branch: BareGpt2,
    /// The first trainable policy block, where the frozen trunk ends and the branch starts
    /// (`CausalLmWithHydraValueHead::frozen_trunk_end`).
    pub start: usize,
}

/// What [`BareHydra::score`] returns: the frozen trunk's output `[B, T, E]` (kept for the
/// updates, as our `CachedTrunk` keeps it) and, over the scored columns `from..T`, the
/// policy's and the reference's log-probs `[B, T − from]` and, when asked for, the values.
pub struct HydraScores {
    pub trunk: Tensor,
    pub log_probs: Tensor,
    pub ref_log_probs: Tensor,
    pub values: Option<Tensor>,
}

impl BareHydra {
    /// The parameters of `model` (GPT-2, `n_head` heads).
    ///
    /// # Panics
    /// When the reference is not a branch (`num_layers_unfrozen` 0 or -1: a full copy) or a
    /// parameter is missing (bench code: the model is built right there).
    pub fn from_model(model: &CausalLmWithHydraValueHead, n_head: i64) -> Self {
        let policy = BareGpt2::from_model(model.policy().model(), n_head);
        let start = model
            .frozen_trunk_end()
            .expect("a hydra model with a branch reference (num_layers_unfrozen >= 1)");
        let vars: HashMap<String, Tensor> = model.reference_store().variables();
        let blocks = (0..policy.blocks.len() - start)
            .map(|i| BareBlock::from_vars(&vars, &format!("h.{i}")))
            .collect();
        let head = vars
            .get("lm_head.weight")
            .map_or_else(|| policy.wte.shallow_clone(), Tensor::shallow_clone);
        let branch = BareGpt2 {
            wte: head,
            wpe: policy.wpe.shallow_clone(),
            blocks,
            ln_f: pair(&vars, "ln_f"),
            n_head,
            eps: policy.eps,
        };
        BareHydra {
            policy,
            v_head: BareHead::from_head(model.policy().v_head()),
            branch,
            start,
        }
    }

    /// The frozen trunk's output `[B, T, E]` for `tokens` `[B, T]` at `positions` under
    /// `blocked` (`padded_blocked`): the embeddings and blocks `0..start`, without gradient
    /// (what `HydraOutput::trunk` gives and `CachedTrunk` starts from).
    pub fn trunk(&self, tokens: &Tensor, positions: &Tensor, blocked: &Tensor) -> Tensor {
        let _guard = tch::no_grad_guard();
        let x = self.policy.embed(tokens, positions);
        self.policy
            .blocks_forward(x, 0..self.start, None, Some(blocked))
    }

    /// The policy's last hidden state at positions `from − 1 .. T − 1` (those that predict
    /// tokens `from..T`), `[B, T − from, E]`, from the trunk's output `[B, T, E]`: blocks
    /// `start..`, then the final norm on those positions only (with gradient when enabled;
    /// `CachedTrunk`'s forward, whose final norm runs on all `T` positions, without the value
    /// head: [`Self::policy_forward`] adds it).
    pub fn policy_hidden(&self, trunk: &Tensor, blocked: &Tensor, from: i64) -> Tensor {
        let n = self.policy.blocks.len();
        let x =
            self.policy
                .blocks_forward(trunk.shallow_clone(), self.start..n, None, Some(blocked));
        self.policy.final_norm(&predicting(&x, from))
    }

    /// The reference's last hidden state at positions `from − 1 .. T − 1`, `[B, T − from, E]`,
    /// from the trunk's output: the branch's blocks, then its final norm on those positions,
    /// without gradient (`ModelBranch::forward` before its LM head).
    pub fn reference_hidden(&self, trunk: &Tensor, blocked: &Tensor, from: i64) -> Tensor {
        let _guard = tch::no_grad_guard();
        let n = self.branch.blocks.len();
        let x = self
            .branch
            .blocks_forward(trunk.shallow_clone(), 0..n, None, Some(blocked));
        self.branch.final_norm(&predicting(&x, from))
    }

    /// An update's forward from the trunk's output: the policy's log-probs of `tokens`
    /// `[B, T]` at `from..T`, `[B, T − from]`, and with `with_values` the value head on the
    /// same positions (`[B, T − from]`), with gradient when enabled.
    pub fn policy_forward(
        &self,
        trunk: &Tensor,
        blocked: &Tensor,
        tokens: &Tensor,
        from: i64,
        with_values: bool,
    ) -> (Tensor, Option<Tensor>) {
        let hidden = self.policy_hidden(trunk, blocked, from);
        let log_probs = next_token_log_probs(&hidden, &self.policy.wte, tokens);
        let values = with_values.then(|| self.v_head.forward(&hidden).squeeze_dim(-1));
        (log_probs, values)
    }

    /// The reference's log-probs of `tokens` `[B, T]` at `from..T`, `[B, T − from]`, from the
    /// trunk's output, without gradient.
    pub fn reference_log_probs(
        &self,
        trunk: &Tensor,
        blocked: &Tensor,
        tokens: &Tensor,
        from: i64,
    ) -> Tensor {
        let _guard = tch::no_grad_guard();
        let hidden = self.reference_hidden(trunk, blocked, from);
        next_token_log_probs(&hidden, &self.branch.wte, tokens)
    }

    /// A rollout's one hydra pass over `tokens` `[B, T]` (at `positions`, under `blocked`),
    /// without gradient: the frozen trunk once, then the policy's top blocks and the reference
    /// branch on it; the LM heads and log-softmax (and with `with_values` the value head) on
    /// the positions that predict tokens `from..T` only (ours runs them on all `T` positions
    /// and masks the prompt out afterwards).
    pub fn score(
        &self,
        tokens: &Tensor,
        positions: &Tensor,
        blocked: &Tensor,
        from: i64,
        with_values: bool,
    ) -> HydraScores {
        let _guard = tch::no_grad_guard();
        let trunk = self.trunk(tokens, positions, blocked);
        let (log_probs, values) = self.policy_forward(&trunk, blocked, tokens, from, with_values);
        let ref_log_probs = self.reference_log_probs(&trunk, blocked, tokens, from);
        HydraScores {
            trunk,
            log_probs,
            ref_log_probs,
            values,
        }
    }
}

/// `x` `[B, T, E]` at the positions `from − 1 .. T − 1` that predict tokens `from..T`.
fn predicting(x: &Tensor, from: i64) -> Tensor {
    let t = x.size()[1];
    x.narrow(1, from - 1, t - from)
}

/// The policy parameters our trainers' AdamW steps, in its order (`trainers::rollout::
/// trainable_params`): the policy's that require grad, by name, without the value head unless
/// `with_value_head` (PPO-RLHF trains it; GRPO and DPO do not).
pub fn trainable_params(model: &CausalLmWithHydraValueHead, with_value_head: bool) -> Vec<Tensor> {
    model
        .policy()
        .named_parameters()
        .into_iter()
        .filter(|(name, p)| p.requires_grad() && (with_value_head || !name.starts_with("v_head")))
        .map(|(_, p)| p.shallow_clone())
        .collect()
}

/// Every parameter of `model` (shallow clones): embeddings, each block's, the final norm.
pub fn gpt2_parameters(model: &BareGpt2) -> Vec<Tensor> {
    let mut out = vec![model.wte.shallow_clone(), model.wpe.shallow_clone()];
    for b in &model.blocks {
        for (w, bias) in [
            &b.ln_1,
            &b.c_attn,
            &b.attn_proj,
            &b.ln_2,
            &b.c_fc,
            &b.mlp_proj,
        ] {
            out.push(w.shallow_clone());
            out.push(bias.shallow_clone());
        }
    }
    out.push(model.ln_f.0.shallow_clone());
    out.push(model.ln_f.1.shallow_clone());
    out
}

// ------------------------------------------------------------------------------ log-probs

/// `log p(tokens[:, t] | tokens[:, < t])` for the last `L` columns `t` of `tokens` `[B, T]`,
/// `[B, L]` float32, from the last hidden state `hidden` `[B, L, E]` at the positions that
/// predict them (`T − L − 1 .. T − 1`: [`BareHydra::policy_hidden`]'s) and an LM head `head`
/// `[V, E]`. `token_log_probs`' math on the positions that are used: the head and the
/// log-softmax run on those `L` positions only (ours runs them on all `T` and then drops the
/// last and masks the prompt).
pub fn next_token_log_probs(hidden: &Tensor, head: &Tensor, tokens: &Tensor) -> Tensor {
    let t = tokens.size()[1];
    let n = hidden.size()[1];
    hidden
        .matmul(&head.tr())
        .log_softmax(-1, Kind::Float)
        .gather(-1, &tokens.narrow(1, t - n, n).unsqueeze(-1), false)
        .squeeze_dim(-1)
}

/// Per-sequence sums of token log-probs under a 0/1 mask of the same shape (`[B, L]` →
/// `[B]`): `sequence_log_probs`' sum.
pub fn sequence_sum(log_probs: &Tensor, mask: &Tensor) -> Tensor {
    (log_probs * mask.to_kind(log_probs.kind())).sum_dim_intlist(1, false, None::<Kind>)
}

// ------------------------------------------------------------------------------ generation

/// What [`generate_eos`] returns.
pub struct BareGeneration {
    /// The sampled tokens `[B, steps]` (int64): the pad id after a row's EOS, and on every
    /// step after all rows finished (ours pads the response to `max_new_tokens` the same way).
    pub response: Tensor,
    /// `[B, steps]` bool: the generated tokens up to and including EOS.
    pub live: Tensor,
    /// Each generated token's log-prob `[B, steps]` (0 where not live), when asked for.
    pub log_probs: Option<Tensor>,
    /// The steps actually run (generation stops once every row produced EOS).
    pub steps_run: i64,
}

/// Samples up to `steps` (≥ 1) tokens after `prompt` `[B, P]` (left-padded by `prompt_mask`, 1 on
/// real tokens; `None`: unpadded) with the uniforms `u` `[steps, B]` (float64), from the full
/// distribution at temperature 1, with EOS: our `generate`'s math for
/// `GenerationConfig::rlhf_sampling` with an EOS and a pad id (`Rows::push` / `Rows::done`: a
/// row that produced `eos` receives `pad` from then on, generation stops when every row
/// finished, checked every step as ours does on the CPU), bare. `with_log_probs`: also each
/// token's log-prob (ours always computes it; GRPO and PPO-RLHF rescore the rollout in the
/// hydra pass and never read it). `prompt_groups` > 1: the rows come in groups of that many
/// identical prompts, whose prompt pass runs once per group and whose KV cache is repeated to
/// the group (ours with `GenerateOptions::with_prompt_groups`, as the GRPO rollout runs).
#[allow(clippy::too_many_arguments)]
pub fn generate_eos(
    model: &BareGpt2,
    prompt: &Tensor,
    prompt_mask: Option<&Tensor>,
    steps: i64,
    u: &Tensor,
    eos: i64,
    pad: i64,
    with_log_probs: bool,
    prompt_groups: i64,
) -> BareGeneration {
    let _guard = tch::no_grad_guard();
    let (b, p) = prompt.size2().expect("[B, P]");
    let device = prompt.device();
    let mut mask = match prompt_mask {
        Some(m) => m.shallow_clone(),
        None => Tensor::ones([b, p], (Kind::Int64, device)),
    };
    // as ours: a prompt without padding needs no mask on the one-token steps
    let padded = prompt_mask.is_some() && !bool::try_from(mask.all()).unwrap_or(false);
    let positions = positions_from_mask(&mask);
    let blocked = padded_blocked(&mask);
    let mut cache = model.new_cache();
    let h = if prompt_groups > 1 {
        // one row per group through the prompt pass, then its cache repeated to the group
        let first = Tensor::arange_start_step(0, b, prompt_groups, (Kind::Int64, device));
        let one = |t: &Tensor| t.index_select(0, &first);
        let h = model.hidden(
            &one(prompt),
            &one(&positions),
            Some(&mut cache),
            Some(&one(&blocked)),
        );
        let repeat = Tensor::arange(b / prompt_groups, (Kind::Int64, device))
            .repeat_interleave_self_int(prompt_groups, 0, None);
        for (k, v) in cache.iter_mut().flatten() {
            *k = k.index_select(0, &repeat);
            *v = v.index_select(0, &repeat);
        }
        h.index_select(0, &repeat)
    } else {
        model.hidden(prompt, &positions, Some(&mut cache), Some(&blocked))
    };
    let mut logits = model.logits(&h.select(1, p - 1));
    let mut pos = positions.narrow(1, p - 1, 1);
    let ones = Tensor::ones([b, 1], (Kind::Int64, device));
    let pad_row = Tensor::full([b], pad, (Kind::Int64, device));
    let mut unfinished = Tensor::ones([b], (Kind::Bool, device));
    let cap = usize::try_from(steps).unwrap_or(0);
    let (mut tokens, mut live, mut log_probs) = (
        Vec::with_capacity(cap),
        Vec::with_capacity(cap),
        Vec::with_capacity(cap),
    );
    for step in 0..steps {
        let next = sample_rows(&logits, &u.select(0, step));
        if with_log_probs {
            let lp = logits
                .log_softmax(-1, Kind::Float)
                .gather(-1, &next.unsqueeze(-1), false)
                .squeeze_dim(-1);
            log_probs.push(lp * unfinished.to_kind(Kind::Float));
        }
        let next = next.where_self(&unfinished, &pad_row);
        live.push(unfinished.shallow_clone());
        tokens.push(next.shallow_clone());
        unfinished = unfinished.logical_and(&next.ne(eos));
        if step + 1 == steps || !bool::try_from(unfinished.any()).unwrap_or(true) {
            break;
        }
        pos = &pos + 1;
        let step_blocked = if padded {
            mask = Tensor::cat(&[&mask, &ones], 1);
            Some(mask.eq(0).view([b, 1, 1, -1]))
        } else {
            None
        };
        let h = model.hidden(
            &next.unsqueeze(1),
            &pos,
            Some(&mut cache),
            step_blocked.as_ref(),
        );
        logits = model.logits(&h.select(1, 0));
    }
    let g = tokens.len() as i64;
    let rest = steps - g;
    let finish = |parts: Vec<Tensor>, value: f64, kind: Kind| -> Tensor {
        let stacked = Tensor::stack(&parts, 1);
        if rest > 0 {
            Tensor::cat(
                &[stacked, Tensor::full([b, rest], value, (kind, device))],
                1,
            )
        } else {
            stacked
        }
    };
    let response = finish(tokens, pad as f64, Kind::Int64);
    let live = finish(live, 0.0, Kind::Bool);
    let log_probs = with_log_probs.then(|| finish(log_probs, 0.0, Kind::Float));
    BareGeneration {
        response,
        live,
        log_probs,
        steps_run: g,
    }
}

// ------------------------------------------------------------------------------ reward model

/// A reward model (`CausalLmWithScoreHead` on GPT-2) as bare parameters.
pub struct BareRewardModel {
    /// The GPT-2 trunk (its LM head unused).
    pub trunk: BareGpt2,
    /// The score head's weight `[1, E]` (no bias).
    pub score: Tensor,
}

impl BareRewardModel {
    /// The parameters of `rm` (`n_head` heads).
    ///
    /// # Panics
    /// When the score head's weight is missing.
    pub fn from_model(rm: &CausalLmWithScoreHead, n_head: i64) -> Self {
        let score = rm
            .named_parameters()
            .into_iter()
            .find(|(n, _)| n == "score.weight")
            .map(|(_, t)| t.shallow_clone())
            .expect("the score head's weight");
        BareRewardModel {
            trunk: BareGpt2::from_model(rm.model(), n_head),
            score,
        }
    }

    /// The scores `[B]` of `tokens` `[B, T]` under `mask` (1 = real token), with the
    /// `positions` and `blocked` mask of that `mask` (a caller that already built them for
    /// the same tokens passes them): every block, then the final norm and the score head at
    /// each row's last real token, without gradient (`CausalLmWithScoreHead::forward`, whose
    /// final norm runs on every position).
    pub fn scores(
        &self,
        tokens: &Tensor,
        mask: &Tensor,
        positions: &Tensor,
        blocked: &Tensor,
    ) -> Tensor {
        let _guard = tch::no_grad_guard();
        let m = &self.trunk;
        let x = m.embed(tokens, positions);
        let x = m.blocks_forward(x, 0..m.blocks.len(), None, Some(blocked));
        let t = x.size()[1];
        let last = (Tensor::arange(t, (Kind::Int64, mask.device())) * mask).argmax(-1, true);
        let h = gather_rows(&x, &last).squeeze_dim(1);
        m.final_norm(&h)
            .linear(&self.score, None::<Tensor>)
            .squeeze_dim(-1)
    }

    /// [`scores`](Self::scores) for rows in consecutive groups of `g` (GRPO's completions of
    /// one prompt), as `CausalLmWithScoreHead::forward_grouped`: the longest prefix on which
    /// every group's rows agree (ids and mask, and before every row's last real token) runs
    /// once per group, its cache is repeated to the rows, and the rest runs on every row.
    pub fn scores_grouped(
        &self,
        tokens: &Tensor,
        mask: &Tensor,
        positions: &Tensor,
        blocked: &Tensor,
        g: i64,
    ) -> Tensor {
        let _guard = tch::no_grad_guard();
        let m = &self.trunk;
        let (b, t) = tokens.size2().expect("[B, T]");
        let device = tokens.device();
        let first_rows = Tensor::arange_start_step(0, b, g, (Kind::Int64, device));
        let group =
            Tensor::arange(b / g, (Kind::Int64, device)).repeat_interleave_self_int(g, 0, b);
        let heads = first_rows.index_select(0, &group);
        let agrees = |x: &Tensor| x.eq_tensor(&x.index_select(0, &heads));
        let same = agrees(tokens).logical_and(&agrees(mask)).all_dim(0, false);
        let common = same
            .to_kind(Kind::Int64)
            .cumprod(0, Kind::Int64)
            .sum(Kind::Int64);
        let last = (Tensor::arange(t, (Kind::Int64, device)) * mask).argmax(-1, false);
        let bounds = Vec::<i64>::try_from(&Tensor::stack(&[common, last.min()], 0)).expect("two");
        let shared = bounds.into_iter().min().unwrap_or(0);
        if shared < 1 {
            return self.scores(tokens, mask, positions, blocked);
        }
        let mut cache = m.new_cache();
        let prefix = |x: &Tensor| x.index_select(0, &first_rows).narrow(1, 0, shared);
        let x = m.embed(&prefix(tokens), &prefix(positions));
        let prefix_blocked = padded_blocked(&prefix(mask));
        let _ = m.blocks_forward(
            x,
            0..m.blocks.len(),
            Some(&mut cache),
            Some(&prefix_blocked),
        );
        for (k, v) in cache.iter_mut().flatten() {
            *k = k.index_select(0, &group);
            *v = v.index_select(0, &group);
        }
        let rest = |x: &Tensor| x.narrow(1, shared, t - shared);
        let x = m.embed(&rest(tokens), &rest(positions));
        let rest_blocked = blocked.narrow(2, shared, t - shared);
        let x = m.blocks_forward(x, 0..m.blocks.len(), Some(&mut cache), Some(&rest_blocked));
        let h = gather_rows(&x, &(last - shared).unsqueeze(1)).squeeze_dim(1);
        m.final_norm(&h)
            .linear(&self.score, None::<Tensor>)
            .squeeze_dim(-1)
    }
}

// ------------------------------------------------------------------------------ minibatches

/// `0..n` shuffled by Fisher-Yates on `rng`: the draw of our trainers' minibatch permutation
/// (`trainers::rollout::shuffled`), so a floor reproduces the same minibatches.
pub fn shuffled(rng: &mut Generator, n: usize) -> Vec<i64> {
    let mut idx: Vec<i64> = (0..n as i64).collect();
    for i in (1..n).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        idx.swap(i, j);
    }
    idx
}

// ------------------------------------------------------------------------------ GRPO

/// TRL's group advantages (`group_advantages` with `GroupScale::StdPlusEps`): each group of
/// `g` consecutive scores `[B]` centred on its mean and divided by its (unbiased) std + `eps`.
pub fn group_advantages(scores: &Tensor, g: i64, eps: f64) -> Tensor {
    let b = scores.size()[0];
    let grouped = scores.view([b / g, g]);
    let mean = grouped.mean_dim(Some([1i64].as_slice()), true, None::<Kind>);
    let std = grouped.std_dim(Some([1i64].as_slice()), true, true);
    ((grouped - mean) / (std + eps)).reshape([b])
}

/// GRPO's loss with DAPO's aggregation (`grpo_loss` with `GrpoAggregation::Dapo`): the
/// clipped token objective (log-space ratio clamp `[ln(1 − eps_low), ln(1 + eps_high)]`) plus,
/// when `ref_log_probs` is given, `beta ·` the k3 KL to the reference, each summed over the
/// masked tokens and divided by their count. `log_probs`, `old_log_probs`, `ref_log_probs`,
/// `mask` (float 0/1) `[B, L]`; `advantages` `[B]`. Ours also zeroes every input outside the
/// mask with `where` first and computes its statistics (clip fraction, ESS, the KL metric);
/// here the mask multiplies each term, which is the same for the finite inputs it gets.
#[allow(clippy::too_many_arguments)]
pub fn grpo_dapo_loss(
    log_probs: &Tensor,
    old_log_probs: &Tensor,
    advantages: &Tensor,
    mask: &Tensor,
    ref_log_probs: Option<&Tensor>,
    eps_low: f64,
    eps_high: f64,
    beta: f64,
) -> Tensor {
    let n = mask.sum(None::<Kind>);
    let adv = advantages.view([-1, 1]);
    let lw = log_probs - old_log_probs.detach();
    let lw_clip = lw.clamp((-eps_low).ln_1p(), eps_high.ln_1p());
    let gain = lw.exp() * &adv;
    let gain_clip = lw_clip.exp() * &adv;
    let objective = (gain.minimum(&gain_clip).neg() * mask).sum(None::<Kind>) / &n;
    match ref_log_probs {
        Some(r) => {
            let d = r.detach() - log_probs;
            let k3 = (d.expm1() - &d) * mask;
            objective + (k3.sum(None::<Kind>) / &n) * beta
        }
        None => objective,
    }
}

// ------------------------------------------------------------------------------ DPO

/// DPO's sigmoid loss (`dpo_loss` with `DpoLossType::Sigmoid`, no label smoothing) from
/// sequence log-probs `[B]`: `mean(−log σ(β · ((πc − rc) − (πr − rr))))`, without the
/// reward statistics.
pub fn dpo_sigmoid_loss(
    policy_chosen: &Tensor,
    policy_rejected: &Tensor,
    ref_chosen: &Tensor,
    ref_rejected: &Tensor,
    beta: f64,
) -> Tensor {
    let chosen = policy_chosen - ref_chosen.detach();
    let rejected = policy_rejected - ref_rejected.detach();
    ((chosen - rejected) * beta)
        .log_sigmoid()
        .g_mul_scalar(-1.0)
        .mean(None::<Kind>)
}

/// Rows `prompt ++ completion`, left-padded with `pad` to the longest (as
/// `collate_dpo_pairs`): the ids `[B, T]`, the attention mask and the completion mask
/// (int64 `[B, T]`), and the longest completion (so a caller can score only the last
/// positions).
pub fn collate_left(prompts: &[&[i64]], completions: &[&[i64]], pad: i64) -> CollatedRows {
    let lens: Vec<usize> = prompts
        .iter()
        .zip(completions)
        .map(|(p, c)| p.len() + c.len())
        .collect();
    let t = lens.iter().copied().max().unwrap_or(0);
    let longest = completions.iter().map(|c| c.len()).max().unwrap_or(0);
    let b = prompts.len();
    let (mut ids, mut attn, mut comp) = (
        Vec::with_capacity(b * t),
        Vec::with_capacity(b * t),
        Vec::with_capacity(b * t),
    );
    for ((p, c), len) in prompts.iter().zip(completions).zip(&lens) {
        let n_pad = t - len;
        ids.extend(std::iter::repeat_n(pad, n_pad));
        ids.extend_from_slice(p);
        ids.extend_from_slice(c);
        attn.extend(std::iter::repeat_n(0i64, n_pad).chain(std::iter::repeat_n(1, *len)));
        comp.extend(
            std::iter::repeat_n(0i64, n_pad + p.len()).chain(std::iter::repeat_n(1, c.len())),
        );
    }
    let shape = [b as i64, t as i64];
    CollatedRows {
        ids: Tensor::from_slice(&ids).view(shape),
        attention_mask: Tensor::from_slice(&attn).view(shape),
        completion_mask: Tensor::from_slice(&comp).view(shape),
        longest_completion: longest as i64,
    }
}

/// What [`collate_left`] returns.
pub struct CollatedRows {
    /// `[B, T]` int64.
    pub ids: Tensor,
    /// `[B, T]` int64, 1 on real tokens.
    pub attention_mask: Tensor,
    /// `[B, T]` int64, 1 on completion tokens.
    pub completion_mask: Tensor,
    /// The longest completion, in tokens.
    pub longest_completion: i64,
}
