//! `ScoreRequest::scored_from`: a model scorer runs its LM head only on the positions that
//! predict the tokens the caller reads (TRL's `logits_to_keep`). The scores there must equal a
//! full forward's, the positions before must be 0, values must be untouched, and the GRPO,
//! PPO-RLHF and DPO losses (which ask for it from their response masks) must give the loss and
//! the gradients that full scoring gives.

use std::cell::Cell;

use tch::nn::VarStore;
use tch::{Kind, Tensor};
use torchrl::modules::llm::{
    CachedTrunk, CausalLm, CausalLmConfig, CausalLmWithHydraValueHead, LmInput, ScoreRequest,
    ScoreTokens, TokenScores,
};
use torchrl::objectives::llm::{DpoLoss, GrpoConfig, GrpoLoss, PpoRlhfConfig, PpoRlhfLoss};
use torchrl::objectives::{LossModule, LossOutput};
use torchrl::TensorDict;

#[path = "common/llm.rs"]
mod llm_fixtures;
use llm_fixtures::{byte_gpt2, seeded_hydra, tiny_qwen3};

/// A scorer that ignores `scored_from` (a full forward each time): what the losses gave
/// before they asked for it. It keeps the largest `scored_from` it was asked for.
struct Full<'a>(&'a CausalLmWithHydraValueHead, Cell<i64>);

impl ScoreTokens for Full<'_> {
    fn score_tokens(
        &self,
        t: &Tensor,
        m: &Tensor,
        r: ScoreRequest,
    ) -> torchrl::Result<TokenScores> {
        self.1.set(self.1.get().max(r.scored_from));
        self.0.score_tokens(
            t,
            m,
            ScoreRequest {
                scored_from: 0,
                ..r
            },
        )
    }
}

fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
    (a - b).abs().max().double_value(&[])
}

fn configs() -> Vec<(&'static str, Box<dyn CausalLmConfig>)> {
    vec![
        ("gpt2", Box::new(byte_gpt2())),
        ("qwen3", Box::new(tiny_qwen3(32, 2, 16, 0.3))),
    ]
}

/// Two rows of 8: the first left-padded by 2, the second right-padded by 1.
fn batch() -> (Tensor, Tensor) {
    let tokens = Tensor::from_slice(&[0i64, 0, 7, 8, 9, 10, 11, 12, 20, 21, 22, 23, 24, 25, 26, 0])
        .view([2, 8]);
    let mask =
        Tensor::from_slice(&[0i64, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0]).view([2, 8]);
    (tokens, mask)
}

/// `narrow` matches `full` from position `from` on (to `tol`) and is exactly 0 before it.
fn check_tail(name: &str, narrow: &Tensor, full: &Tensor, from: i64, tol: f64) {
    let t = full.size()[1];
    let from = from.clamp(0, t);
    assert_eq!(narrow.size(), full.size(), "{name}: shape");
    if from < t {
        let d = max_diff(
            &narrow.narrow(1, from, t - from),
            &full.narrow(1, from, t - from),
        );
        assert!(d <= tol, "{name}: positions {from}.. differ by {d}");
    }
    if from > 0 {
        let head = narrow
            .narrow(1, 0, from)
            .abs()
            .sum(Kind::Double)
            .double_value(&[]);
        assert_eq!(head, 0.0, "{name}: positions ..{from} are not 0");
    }
}

#[test]
fn every_model_scorer_matches_a_full_forward_from_scored_from_on() {
    let (tokens, mask) = batch();
    for (arch, config) in configs() {
        let (_vs, hydra) = seeded_hydra(config.as_ref(), 5, 1);
        let request = ScoreRequest::values_and_entropy();
        let full = hydra.score_tokens(&tokens, &mask, request).unwrap();
        let model: &dyn CausalLm = hydra.policy().model();
        let bare_full = model
            .score_tokens(&tokens, &mask, ScoreRequest::log_probs())
            .unwrap();
        // the frozen trunk's output, as the trainers cache it
        let out = tch::no_grad(|| hydra.forward(&LmInput::new(&tokens).with_attention_mask(&mask)))
            .unwrap();
        let cached = CachedTrunk::new(
            hydra.policy(),
            out.trunk.unwrap(),
            hydra.frozen_trunk_end().unwrap(),
        );
        let cached_full = cached.score_tokens(&tokens, &mask, request).unwrap();
        // 0 and 1: the whole head (bitwise the full scores); past the end: nothing to score
        for from in [0i64, 1, 2, 5, 7, 8, 11] {
            let name = format!("{arch}, scored_from {from}");
            let r = request.scored_from(from);
            let s = hydra.score_tokens(&tokens, &mask, r).unwrap();
            let tol = if from <= 1 { 0.0 } else { 1e-6 };
            check_tail(
                &format!("{name}, log-probs"),
                &s.log_probs,
                &full.log_probs,
                from,
                tol,
            );
            check_tail(
                &format!("{name}, entropy"),
                s.entropy.as_ref().unwrap(),
                full.entropy.as_ref().unwrap(),
                from,
                tol,
            );
            // values are given at every position, as without it
            assert_eq!(
                max_diff(s.values.as_ref().unwrap(), full.values.as_ref().unwrap()),
                0.0,
                "{name}: values"
            );
            let bare = model
                .score_tokens(&tokens, &mask, ScoreRequest::log_probs().scored_from(from))
                .unwrap();
            assert!(bare.values.is_none() && bare.entropy.is_none());
            check_tail(
                &format!("{name}, bare model"),
                &bare.log_probs,
                &bare_full.log_probs,
                from,
                tol,
            );
            let c = cached.score_tokens(&tokens, &mask, r).unwrap();
            check_tail(
                &format!("{name}, cached trunk"),
                &c.log_probs,
                &cached_full.log_probs,
                from,
                tol,
            );
            check_tail(
                &format!("{name}, cached trunk entropy"),
                c.entropy.as_ref().unwrap(),
                cached_full.entropy.as_ref().unwrap(),
                from,
                tol,
            );
            assert_eq!(
                max_diff(
                    c.values.as_ref().unwrap(),
                    cached_full.values.as_ref().unwrap()
                ),
                0.0,
                "{name}: cached values"
            );
        }
    }
}

/// A PPO-RLHF / GRPO rollout on `batch()`: prompts end at position 4, responses after.
fn rollout(policy: &CausalLmWithHydraValueHead) -> TensorDict {
    let (tokens, attn) = batch();
    let assistant =
        Tensor::from_slice(&[0i64, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 0]).view([2, 8]);
    let (lp, v) = tch::no_grad(|| policy.log_probs_and_values(&tokens, &attn)).unwrap();
    // as if the policy had moved since the rollout: ratios away from 1
    let old = &lp
        + Tensor::from_slice(&[0.1f32, -0.2, 0.05, 0.3, -0.1, 0.2, -0.3, 0.1])
            .repeat([2])
            .view([2, 8]);
    let rewards = Tensor::from_slice(&[
        0.0f32, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.5, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -0.5, 0.0,
    ])
    .view([2, 8]);
    TensorDict::new([2])
        .unwrap()
        .with(("tokens", "full"), tokens)
        .unwrap()
        .with(("masks", "all_attention_mask"), attn)
        .unwrap()
        .with(("masks", "all_assistant_mask"), assistant)
        .unwrap()
        .with(("log_probs", "full"), old)
        .unwrap()
        .with("values", v)
        .unwrap()
        .with(("next", "reward"), rewards)
        .unwrap()
        .with(
            "advantage",
            Tensor::from_slice(&[0.7f32, -0.4]).view([2, 1]),
        )
        .unwrap()
}

/// The loss and the gradient of every trainable parameter from `f` (gradients zeroed first).
fn loss_and_grads(vs: &VarStore, f: impl Fn() -> Tensor) -> (f64, Vec<Tensor>) {
    let params = vs.trainable_variables();
    for p in &params {
        let mut g = p.grad();
        if g.defined() {
            let _ = g.zero_();
        }
    }
    let loss = f();
    loss.backward();
    let grads = params
        .iter()
        .map(|p| {
            let g = p.grad();
            if g.defined() {
                g.copy()
            } else {
                p.zeros_like()
            }
        })
        .collect();
    (loss.double_value(&[]), grads)
}

fn assert_same(name: &str, a: (f64, Vec<Tensor>), b: (f64, Vec<Tensor>)) {
    assert!(
        (a.0 - b.0).abs() <= 1e-6 * b.0.abs().max(1.0),
        "{name}: loss {} against {}",
        a.0,
        b.0
    );
    assert!(a.0 != 0.0, "{name}: a zero loss tests nothing");
    let mut moved = 0;
    for (i, (ga, gb)) in a.1.iter().zip(&b.1).enumerate() {
        let d = max_diff(ga, gb);
        let scale = gb.abs().max().double_value(&[]).max(1e-3);
        assert!(
            d <= 1e-5 * scale,
            "{name}: gradient {i} differs by {d} (scale {scale})"
        );
        moved += usize::from(scale > 1e-3);
    }
    assert!(moved > 0, "{name}: no gradient reached the parameters");
}

#[test]
fn the_losses_give_full_scoring_s_loss_and_gradients() {
    for (arch, config) in configs() {
        let (vs, hydra) = seeded_hydra(config.as_ref(), 9, 1);
        let mut td = rollout(&hydra);
        // PPO-RLHF: log-probs and values
        let cfg = PpoRlhfConfig::new().with_vf_coef(0.1);
        let narrow = PpoRlhfLoss::new(&hydra).with_config(cfg.clone()).unwrap();
        narrow.compute_advantages(&mut td).unwrap();
        let full_scores = Full(&hydra, Cell::new(0));
        let full = PpoRlhfLoss::new(&full_scores).with_config(cfg).unwrap();
        let a = loss_and_grads(&vs, || narrow.forward(&td).unwrap().loss);
        let b = loss_and_grads(&vs, || full.forward(&td).unwrap().loss);
        assert_same(&format!("{arch}: PPO-RLHF"), a, b);
        // the loss asked for the first response position (4)
        assert_eq!(
            full_scores.1.replace(0),
            4,
            "{arch}: PPO-RLHF's scored_from"
        );

        // GRPO with the entropy bonus and the KL to a reference
        let cfg = GrpoConfig::default()
            .with_entropy_coeff(Some(0.01))
            .with_kl_to_ref_coeff(Some(0.05));
        let old = td.get(("log_probs", "full")).unwrap().shallow_clone();
        let td = td
            .with(("next", "ref_log_probs", "full"), old - 0.05)
            .unwrap();
        let narrow = GrpoLoss::new(&hydra).with_config(cfg.clone()).unwrap();
        let full = GrpoLoss::new(&full_scores).with_config(cfg).unwrap();
        let a = loss_and_grads(&vs, || narrow.forward(&td).unwrap().total_loss().unwrap());
        let b = loss_and_grads(&vs, || full.forward(&td).unwrap().total_loss().unwrap());
        assert_same(&format!("{arch}: GRPO"), a, b);
        assert_eq!(full_scores.1.get(), 4, "{arch}: GRPO's scored_from");
    }
}

#[test]
fn dpo_gives_full_scoring_s_loss_and_gradients() {
    let (tokens, attn) = batch();
    // chosen and rejected share the prompt (positions ..4) and differ in the completion
    let rejected = tokens.copy();
    let _ = rejected.narrow(1, 5, 2).fill_(30);
    let completion =
        Tensor::from_slice(&[0i64, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 0]).view([2, 8]);
    for (arch, config) in configs() {
        let (vs, hydra) = seeded_hydra(config.as_ref(), 13, 1);
        let side = |t: &Tensor| {
            let lp = tch::no_grad(|| hydra.token_log_probs(t, &attn)).unwrap();
            let reference =
                (lp * completion.to_kind(Kind::Float)).sum_dim_intlist(1, false, None::<Kind>)
                    - 0.1;
            TensorDict::new([2])
                .unwrap()
                .with("input_ids", t.shallow_clone())
                .unwrap()
                .with("attention_mask", attn.shallow_clone())
                .unwrap()
                .with("completion_mask", completion.shallow_clone())
                .unwrap()
                .with("ref_log_probs", reference)
                .unwrap()
        };
        let td = TensorDict::new([2])
            .unwrap()
            .with("chosen", side(&tokens))
            .unwrap()
            .with("rejected", side(&rejected))
            .unwrap();
        let full_scores = Full(&hydra, Cell::new(0));
        let narrow = DpoLoss::new(&hydra);
        let full = DpoLoss::new(&full_scores);
        let a = loss_and_grads(&vs, || narrow.forward(&td).unwrap().loss_dpo);
        let b = loss_and_grads(&vs, || full.forward(&td).unwrap().loss_dpo);
        assert_same(&format!("{arch}: DPO"), a, b);
        assert_eq!(full_scores.1.get(), 4, "{arch}: DPO's scored_from");
    }
}
