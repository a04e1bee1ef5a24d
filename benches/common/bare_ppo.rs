//! Bare-`tch` floor pieces of the PPO-RLHF bench (`benches/rlhf.rs`, see `bare_gpt2.rs`): one
//! `PpoRlhfTrainer` iteration written as the `tch` ops our code path issues, on the hydra
//! model's own parameter tensors, with everything that does not reach the parameters left out.
//!
//! - [`generate_eos`]: our `generate` (RLHF sampling, CDF inversion at the same uniforms) with
//!   EOS: a finished row receives the pad id and stays in the batch, generation stops when
//!   every row finished; the per-step log-probs ours computes (and the trainer discards: it
//!   re-scores in the hydra pass) are left out.
//! - [`BareHydra::score`]: the rollout's one hydra pass: the frozen trunk (kept, as our
//!   `CachedTrunk` keeps it), the unfrozen blocks and the reference branch on it, the LM heads,
//!   log-softmax and value head on the `R` positions that predict response tokens only (ours
//!   runs them on all `P + R` positions and masks the prompt out afterwards).
//! - [`reward_model_score`]: the reward model on the full tokens, its final norm and score head
//!   on each row's last real token only.
//! - [`kl_rewards`], [`gae`], [`whiten`]: the score at the last response token clipped to
//!   `cliprange_reward`, minus `kl_coef · (lp − ref_lp)`; masked GAE; masked whitening (ours'
//!   `whiten_global_counted` on one rank). GAE is a per-row computation: it runs once per
//!   rollout here (ours runs it on every minibatch, with the same values).
//! - [`BareHydra::policy_forward`] + [`ppo_loss`]: an update's forward from the cached trunk and
//!   the clipped policy and value losses, without the logged statistics.
//! - [`BarePpoRlhf`]: the iteration: the generator draws of the trainer (the sampler's seed,
//!   then one Fisher-Yates permutation per PPO epoch, [`shuffled`]), the rollout, then the
//!   minibatch updates with [`BareAdamW`] and the cosine schedule's rate.
//!
//! Every tensor of an update is `[B, R]` over the response columns (ours is `[B, P + R]`; the
//! prompt columns are masked out of every sum there).

#![allow(dead_code)] // each bench uses some of these

use std::collections::HashMap;

use tch::{Device, Kind, Tensor};
use torchrl::modules::llm::{CausalLmWithHydraValueHead, CausalLmWithScoreHead};
use torchrl::Generator;

use super::bare_gpt2::{causal_blocked, padded_blocked, positions_from_mask, sample_rows};
use super::bare_gpt2::{BareBlock, BareGpt2};
use super::bare_optim::BareAdamW;

/// trlX's value head `Linear → ReLU → Linear` (`MlpHead`), its parameters shared.
pub struct BareValueHead {
    pub w1: Tensor,
    pub b1: Tensor,
    pub w2: Tensor,
    pub b2: Tensor,
}

impl BareValueHead {
    /// One value per position of `h` `[.., E]`: `[..]`.
    pub fn forward(&self, h: &Tensor) -> Tensor {
        h.linear(&self.w1, Some(&self.b1))
            .relu()
            .linear(&self.w2, Some(&self.b2))
            .squeeze_dim(-1)
    }
}

/// The hydra model's tensors: the policy trunk, the value head, and the reference branch (its
/// own copies of the top blocks and final norm, the policy's frozen tied LM head), sharing
/// storage with the model they were taken from.
pub struct BareHydra {
    pub policy: BareGpt2,
    pub v_head: BareValueHead,
    /// The branch: `blocks` are the copied top blocks, `ln_f` its norm, `wte` the policy's.
    pub reference: BareGpt2,
    /// The first unfrozen block (where the branch starts).
    pub start: usize,
}

/// What the rollout's hydra pass keeps: the trunk output `[B, T, E]` and, over the response
/// columns, the policy's and the reference's log-probs and the values `[B, R]`.
pub struct Scored {
    pub trunk: Tensor,
    pub log_probs: Tensor,
    pub ref_log_probs: Tensor,
    pub values: Tensor,
}

impl BareHydra {
    /// The tensors of `model` (a GPT-2 hydra with a branch reference).
    ///
    /// # Panics
    /// When a parameter is missing or the reference is not a branch (bench code).
    pub fn from_model(model: &CausalLmWithHydraValueHead, n_head: i64) -> Self {
        let policy = BareGpt2::from_model(model.policy().model(), n_head);
        let [w1, b1, w2, b2] = model
            .policy()
            .v_head()
            .parameters()
            .map(Tensor::shallow_clone);
        let start = model
            .frozen_trunk_end()
            .expect("a hydra model with a branch reference");
        let vars: HashMap<String, Tensor> = model.reference_store().variables();
        let get = |name: &str| -> Tensor {
            vars.get(name)
                .unwrap_or_else(|| panic!("no reference variable {name} in {:?}", vars.keys()))
                .shallow_clone()
        };
        let pair = |p: &str| (get(&format!("{p}.weight")), get(&format!("{p}.bias")));
        let blocks = (0..policy.blocks.len() - start)
            .map(|i| BareBlock {
                ln_1: pair(&format!("h.{i}.ln_1")),
                c_attn: pair(&format!("h.{i}.attn.c_attn")),
                attn_proj: pair(&format!("h.{i}.attn.c_proj")),
                ln_2: pair(&format!("h.{i}.ln_2")),
                c_fc: pair(&format!("h.{i}.mlp.c_fc")),
                mlp_proj: pair(&format!("h.{i}.mlp.c_proj")),
            })
            .collect();
        let reference = BareGpt2 {
            wte: policy.wte.shallow_clone(),
            wpe: policy.wpe.shallow_clone(),
            blocks,
            ln_f: pair("ln_f"),
            n_head,
            eps: policy.eps,
        };
        BareHydra {
            policy,
            v_head: BareValueHead { w1, b1, w2, b2 },
            reference,
            start,
        }
    }

    /// The rollout's hydra pass over `full` `[B, P + R]` with its `mask` (int64, 1 = real):
    /// the trunk runs once; the unfrozen blocks and the branch run on its output.
    pub fn score(&self, full: &Tensor, mask: &Tensor, p: i64, r: i64) -> Scored {
        let _guard = tch::no_grad_guard();
        let blocked = padded_blocked(mask);
        let x = self.policy.embed(full, &positions_from_mask(mask));
        let n = self.policy.blocks.len();
        let trunk = self
            .policy
            .blocks_forward(x, 0..self.start, None, Some(&blocked));
        let h =
            self.policy
                .blocks_forward(trunk.shallow_clone(), self.start..n, None, Some(&blocked));
        let k = self.reference.blocks.len();
        let hr = self
            .reference
            .blocks_forward(trunk.shallow_clone(), 0..k, None, Some(&blocked));
        let targets = full.narrow(1, p, r).unsqueeze(-1);
        let h = self.policy.final_norm(&h.narrow(1, p - 1, r));
        let hr = self.reference.final_norm(&hr.narrow(1, p - 1, r));
        let gather = |logits: Tensor| {
            logits
                .log_softmax(-1, Kind::Float)
                .gather(-1, &targets, false)
                .squeeze_dim(-1)
        };
        Scored {
            log_probs: gather(self.policy.logits(&h)),
            ref_log_probs: gather(self.reference.logits(&hr)),
            values: self.v_head.forward(&h),
            trunk,
        }
    }

    /// An update's forward from the cached `trunk` `[B, T, E]`: the unfrozen blocks, then the
    /// final norm, LM head, log-softmax and value head on the response columns: log-probs of
    /// `targets` `[B, R]` and values, both `[B, R]`.
    pub fn policy_forward(
        &self,
        trunk: &Tensor,
        mask: &Tensor,
        targets: &Tensor,
        p: i64,
        r: i64,
    ) -> (Tensor, Tensor) {
        let blocked = padded_blocked(mask);
        let n = self.policy.blocks.len();
        let h =
            self.policy
                .blocks_forward(trunk.shallow_clone(), self.start..n, None, Some(&blocked));
        let h = self.policy.final_norm(&h.narrow(1, p - 1, r));
        let lp = self
            .policy
            .logits(&h)
            .log_softmax(-1, Kind::Float)
            .gather(-1, &targets.unsqueeze(-1), false)
            .squeeze_dim(-1);
        (lp, self.v_head.forward(&h))
    }
}

/// Samples up to `steps` tokens after the unpadded prompt `[B, P]` with the uniforms `u`
/// `[steps, B]` (float64) from the full distribution at temperature 1, with EOS: a row that
/// drew `eos` is finished and receives `pad` from then on (still fed to the model, as ours
/// does); generation stops once every row finished. Returns the response `[B, steps]` and its
/// mask `[B, steps]` (bool, EOS included), padded with `pad` / `false` after an early stop.
pub fn generate_eos(
    gpt: &BareGpt2,
    prompt: &Tensor,
    steps: i64,
    u: &Tensor,
    eos: i64,
    pad: i64,
) -> (Tensor, Tensor) {
    let _guard = tch::no_grad_guard();
    let (b, p) = prompt.size2().expect("[B, P]");
    let device = prompt.device();
    let mut cache = gpt.new_cache();
    let positions = Tensor::arange(p, (Kind::Int64, device)).expand([b, p], false);
    let h = gpt.hidden(
        prompt,
        &positions,
        Some(&mut cache),
        Some(&causal_blocked(p, device)),
    );
    let mut logits = gpt.logits(&h.select(1, p - 1));
    let pad_t = Tensor::full([b], pad, (Kind::Int64, device));
    let mut unfinished = Tensor::ones([b], (Kind::Bool, device));
    let mut tokens = Vec::with_capacity(steps as usize);
    let mut live = Vec::with_capacity(steps as usize);
    for step in 0..steps {
        let next = sample_rows(&logits, &u.select(0, step)).where_self(&unfinished, &pad_t);
        live.push(unfinished.shallow_clone());
        unfinished = unfinished.logical_and(&next.ne(eos));
        tokens.push(next.shallow_clone());
        if step + 1 == steps || !bool::try_from(unfinished.any()).unwrap_or(true) {
            break;
        }
        let pos = Tensor::full([b, 1], p + step, (Kind::Int64, device));
        let h = gpt.hidden(&next.unsqueeze(1), &pos, Some(&mut cache), None);
        logits = gpt.logits(&h.select(1, 0));
    }
    let mut response = Tensor::stack(&tokens, 1);
    let mut mask = Tensor::stack(&live, 1);
    let g = tokens.len() as i64;
    if g < steps {
        response = Tensor::cat(
            &[
                response,
                Tensor::full([b, steps - g], pad, (Kind::Int64, device)),
            ],
            1,
        );
        mask = Tensor::cat(
            &[mask, Tensor::zeros([b, steps - g], (Kind::Bool, device))],
            1,
        );
    }
    (response, mask)
}

/// The reward model's score of `full` `[B, T]` under `mask` (int64): the trunk over every
/// position, then the final norm and the score head `[1, E]` at each row's last real token.
pub fn reward_model_score(rm: &BareGpt2, score_w: &Tensor, full: &Tensor, mask: &Tensor) -> Tensor {
    let _guard = tch::no_grad_guard();
    let (b, t) = full.size2().expect("[B, T]");
    let e = rm.wte.size()[1];
    let x = rm.embed(full, &positions_from_mask(mask));
    let x = rm.blocks_forward(x, 0..rm.blocks.len(), None, Some(&padded_blocked(mask)));
    let last = (Tensor::arange(t, (Kind::Int64, full.device())) * mask).argmax(-1, false);
    let h = x
        .gather(1, &last.view([b, 1, 1]).expand([b, 1, e], false), false)
        .squeeze_dim(1);
    rm.final_norm(&h)
        .linear(score_w, None::<Tensor>)
        .squeeze_dim(-1)
}

/// The per-token rewards `[B, R]`: `score` clipped to `±clip` at each row's last response token
/// (`keep` `[B, R]` bool), minus `kl_coef · (lp − ref_lp)` on the response tokens.
pub fn kl_rewards(
    score: &Tensor,
    log_probs: &Tensor,
    ref_log_probs: &Tensor,
    keep: &Tensor,
    kl_coef: f64,
    clip: f64,
) -> Tensor {
    let last = keep.sum_dim_intlist(1, true, Kind::Int64) - 1;
    let kl = (log_probs - ref_log_probs).where_scalarother(keep, 0.0);
    log_probs
        .zeros_like()
        .scatter(1, &last, &score.clamp(-clip, clip).unsqueeze(1))
        - kl * kl_coef
}

/// Masked GAE over the response columns (ours' `gae_advantages_and_returns`): advantages and
/// returns `[B, R]`, 0 off the mask.
pub fn gae(
    values: &Tensor,
    rewards: &Tensor,
    keep: &Tensor,
    gamma: f64,
    lam: f64,
) -> (Tensor, Tensor) {
    let _guard = tch::no_grad_guard();
    let (b, r) = values.size2().expect("[B, R]");
    let mut next_value = Tensor::zeros([b], (values.kind(), values.device()));
    let mut last_gae = next_value.zeros_like();
    let mut reversed = Vec::with_capacity(r as usize);
    for col in (0..r).rev() {
        let v = values.select(1, col);
        let k = keep.select(1, col);
        let delta = rewards.select(1, col) + &next_value * gamma - &v;
        let g = delta + &last_gae * (gamma * lam);
        reversed.push(g.where_scalarother(&k, 0.0));
        last_gae = g.where_self(&k, &last_gae);
        next_value = v.where_self(&k, &next_value);
    }
    reversed.reverse();
    let advantages = Tensor::stack(&reversed, 1);
    let returns = (&advantages + values).where_scalarother(keep, 0.0);
    (advantages, returns)
}

/// Masked whitening (mean 0, unbiased variance 1 over `keep`, 0 off it) of `x` (0 off `keep`)
/// and the token count as a tensor.
pub fn whiten(x: &Tensor, keep: &Tensor) -> (Tensor, Tensor) {
    let _guard = tch::no_grad_guard();
    let m = keep.to_kind(x.kind());
    let count = m.sum(x.kind());
    let n = count.double_value(&[]);
    let mean = (x * &m).sum(x.kind()) / &count;
    let centered = (x - &mean).where_scalarother(keep, 0.0);
    let var = (centered.square() * &m).sum(x.kind()) / &count * (n / (n - 1.0));
    let w = (x - &mean) * (var + 1e-8).rsqrt();
    (w.where_scalarother(keep, 0.0), count)
}

/// PPO-RLHF's loss settings.
#[derive(Clone, Copy, Debug)]
pub struct LossSettings {
    pub cliprange: f64,
    pub cliprange_value: f64,
    pub vf_coef: f64,
}

/// The clipped policy loss plus `vf_coef ×` the clipped value loss, masked sums over `n`
/// tokens (`m`: the float mask). Every input but `lp` / `v` is data; off the mask the
/// advantages and returns are 0 and the log-ratio is masked, so nothing there counts.
#[allow(clippy::too_many_arguments)]
pub fn ppo_loss(
    lp: &Tensor,
    v: &Tensor,
    old_lp: &Tensor,
    old_v: &Tensor,
    adv: &Tensor,
    ret: &Tensor,
    m: &Tensor,
    n: &Tensor,
    s: LossSettings,
) -> Tensor {
    let masked_mean = |x: Tensor| (x * m).sum(Kind::Float) / n;
    let cv = s.cliprange_value;
    let v_clipped = v.clamp_tensor(Some(&(old_v - cv)), Some(&(old_v + cv)));
    let vf1 = (v - ret).square();
    let vf2 = (v_clipped - ret).square();
    let vf_loss = masked_mean(vf1.maximum(&vf2)) * 0.5;
    let ratio = ((lp - old_lp) * m).exp();
    let c = s.cliprange;
    let neg_adv = -adv;
    let pg1 = &neg_adv * &ratio;
    let pg2 = &neg_adv * ratio.clamp(1.0 - c, 1.0 + c);
    masked_mean(pg1.maximum(&pg2)) + vf_loss * s.vf_coef
}

/// `0..n` shuffled by Fisher-Yates on `rng`: the trainer's minibatch order
/// (`trainers::rollout::shuffled`).
pub fn shuffled(rng: &mut Generator, n: usize) -> Vec<i64> {
    let mut idx: Vec<i64> = (0..n as i64).collect();
    for i in (1..n).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        idx.swap(i, j);
    }
    idx
}

/// One iteration's settings (the trainer's config, as the bench sets it).
#[derive(Clone, Copy, Debug)]
pub struct PpoSettings {
    pub new_tokens: i64,
    pub eos: i64,
    pub pad: i64,
    pub kl_coef: f64,
    pub cliprange_reward: f64,
    pub gamma: f64,
    pub lam: f64,
    pub loss: LossSettings,
    pub ppo_epochs: usize,
    pub minibatch: i64,
    pub max_grad_norm: Option<f64>,
    /// The cosine schedule: base rate, `T_max`, `eta_min`.
    pub lr: (f64, f64, f64),
}

/// One rollout's data, rows in prompt order; `[B, R]` tensors over the response columns.
pub struct Experience {
    pub full: Tensor,
    pub mask: Tensor,
    pub keep: Tensor,
    pub targets: Tensor,
    pub scored: Scored,
    pub score: Tensor,
    pub rewards: Tensor,
    pub advantages: Tensor,
    pub returns: Tensor,
    pub p: i64,
    pub r: i64,
}

/// The floor of a `PpoRlhfTrainer` iteration: the hydra model's and the reward model's tensors,
/// AdamW over the trainable ones, and the trainer's generator.
pub struct BarePpoRlhf {
    pub hydra: BareHydra,
    pub rm: BareGpt2,
    pub rm_score: Tensor,
    pub opt: BareAdamW,
    /// The tensors `opt` steps (shallow clones of the model's).
    pub trainable: Vec<Tensor>,
    pub rng: Generator,
    pub s: PpoSettings,
    /// Optimizer steps taken (the cosine schedule's epoch).
    pub steps: u64,
}

impl BarePpoRlhf {
    /// The floor over `model` and `rm` (trainable: the policy parameters that require grad,
    /// in our optimizer's order), AdamW with `betas`, `eps`, `weight_decay`, the trainer's
    /// generator seeded with `seed`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        model: &CausalLmWithHydraValueHead,
        rm: &CausalLmWithScoreHead,
        n_head: i64,
        s: PpoSettings,
        betas: (f64, f64),
        eps: f64,
        weight_decay: f64,
        seed: u64,
    ) -> Self {
        let trainable: Vec<Tensor> = model
            .policy()
            .named_parameters()
            .into_iter()
            .filter(|(_, p)| p.requires_grad())
            .map(|(_, p)| p.shallow_clone())
            .collect();
        let mut opt = BareAdamW::new(
            trainable.iter().map(Tensor::shallow_clone).collect(),
            s.lr.0,
            weight_decay,
        );
        opt.betas = betas;
        opt.eps = eps;
        let rm_score = rm
            .named_parameters()
            .into_iter()
            .find(|(n, _)| n == "score.weight")
            .map(|(_, t)| t.shallow_clone())
            .expect("score.weight");
        BarePpoRlhf {
            hydra: BareHydra::from_model(model, n_head),
            rm: BareGpt2::from_model(rm.model(), n_head),
            rm_score,
            opt,
            trainable,
            rng: Generator::new(seed),
            s,
            steps: 0,
        }
    }

    /// The tensors the optimizer steps, in its order.
    pub fn opt_params(&self) -> &[Tensor] {
        &self.trainable
    }

    /// The rollout of `prompt` `[B, P]` (unpadded): the sampler seeded from the generator,
    /// generation, the hydra pass, the reward model, the KL-penalised rewards and GAE.
    pub fn rollout(&mut self, prompt: &Tensor) -> Experience {
        let s = self.s;
        let (b, p) = prompt.size2().expect("[B, P]");
        let seed = self.rng.next_u64();
        let u = Generator::new(seed)
            .uniform(&[s.new_tokens, b], 0.0, 1.0, Kind::Double, Device::Cpu)
            .expect("uniforms");
        let (response, keep) =
            generate_eos(&self.hydra.policy, prompt, s.new_tokens, &u, s.eos, s.pad);
        let r = s.new_tokens;
        let full = Tensor::cat(&[prompt, &response], 1);
        let mask = Tensor::cat(&[prompt.ones_like(), keep.to_kind(Kind::Int64)], 1);
        let scored = self.hydra.score(&full, &mask, p, r);
        let score = reward_model_score(&self.rm, &self.rm_score, &full, &mask);
        let rewards = kl_rewards(
            &score,
            &scored.log_probs,
            &scored.ref_log_probs,
            &keep,
            s.kl_coef,
            s.cliprange_reward,
        );
        let (advantages, returns) = gae(&scored.values, &rewards, &keep, s.gamma, s.lam);
        Experience {
            targets: response,
            full,
            mask,
            keep,
            scored,
            score,
            rewards,
            advantages,
            returns,
            p,
            r,
        }
    }

    /// `ppo_epochs` passes of shuffled minibatches over `exp`, one AdamW step each; the
    /// losses (detached).
    pub fn learn(&mut self, exp: &Experience) -> Vec<Tensor> {
        let s = self.s;
        let n = exp.full.size()[0];
        let mut losses = Vec::new();
        for _ in 0..s.ppo_epochs {
            let perm = shuffled(&mut self.rng, n as usize);
            for chunk in perm.chunks(s.minibatch as usize) {
                let idx = Tensor::from_slice(chunk);
                let pick = |t: &Tensor| t.index_select(0, &idx);
                let keep = pick(&exp.keep);
                let (adv, count) = whiten(&pick(&exp.advantages), &keep);
                let (lp, v) = self.hydra.policy_forward(
                    &pick(&exp.scored.trunk),
                    &pick(&exp.mask),
                    &pick(&exp.targets),
                    exp.p,
                    exp.r,
                );
                let loss = ppo_loss(
                    &lp,
                    &v,
                    &pick(&exp.scored.log_probs),
                    &pick(&exp.scored.values),
                    &adv,
                    &pick(&exp.returns),
                    &keep.to_kind(Kind::Float),
                    &count,
                    s.loss,
                );
                self.opt.backward_step(&loss, s.max_grad_norm);
                self.steps += 1;
                let (base, t_max, eta_min) = s.lr;
                self.opt.lr = eta_min
                    + (base - eta_min)
                        * (1.0 + (std::f64::consts::PI * self.steps as f64 / t_max).cos())
                        / 2.0;
                losses.push(loss.detach());
            }
        }
        losses
    }

    /// One iteration on `prompt`: the rollout, then the updates.
    pub fn iteration(&mut self, prompt: &Tensor) -> (Experience, Vec<Tensor>) {
        let exp = self.rollout(prompt);
        let losses = self.learn(&exp);
        (exp, losses)
    }
}
