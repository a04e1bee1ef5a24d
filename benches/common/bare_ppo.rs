//! Bare-`tch` floor pieces of the PPO-RLHF bench (`benches/rlhf.rs`, see `bare_gpt2.rs`): one
//! `PpoRlhfTrainer` iteration written as the `tch` ops our code path issues, on the hydra
//! model's own parameter tensors, with everything that does not reach the parameters left out.
//! The pieces it shares with the GRPO / DPO floors are `bare_rlhf.rs`'s:
//!
//! - `generate_eos`: our `generate` (RLHF sampling, CDF inversion at the same uniforms) with
//!   EOS: a finished row receives the pad id and stays in the batch, generation stops when
//!   every row finished; the per-step log-probs ours computes (and the trainer discards: it
//!   re-scores in the hydra pass) are left out.
//! - `BareHydra::score`: the rollout's one hydra pass: the frozen trunk (kept, as our
//!   `CachedTrunk` keeps it), the unfrozen blocks and the reference branch on it, the final
//!   norms, LM heads, log-softmax and value head on the `R` positions that predict response
//!   tokens only (ours runs them on all `P + R` positions and masks the prompt out afterwards).
//! - `BareRewardModel::scores`: the reward model on the full tokens, its final norm and score
//!   head on each row's last real token only.
//! - `BareHydra::policy_forward`: an update's forward from the cached trunk.
//! - `shuffled`: the trainer's minibatch permutation (one per PPO epoch).
//!
//! This file adds the PPO-RLHF math:
//!
//! - [`kl_rewards`], [`gae`], [`whiten`]: the score at the last response token clipped to
//!   `cliprange_reward`, minus `kl_coef · (lp − ref_lp)`; masked GAE; masked whitening (ours'
//!   `whiten_global_counted` on one rank). GAE is a per-row computation: it runs once per
//!   rollout here (ours runs it on every minibatch, with the same values).
//! - [`ppo_loss`]: the clipped policy and value losses, without the logged statistics.
//! - [`BarePpoRlhf`]: the iteration: the generator draws of the trainer (the sampler's seed,
//!   then one Fisher-Yates permutation per PPO epoch), the rollout, then the minibatch updates
//!   with [`BareAdamW`] and the cosine schedule's rate.
//!
//! Every tensor of an update is `[B, R]` over the response columns (ours is `[B, P + R]`; the
//! prompt columns are masked out of every sum there).

#![allow(dead_code)] // each bench uses some of these

use tch::{Device, Kind, Tensor};
use torchrl::modules::llm::{CausalLmWithHydraValueHead, CausalLmWithScoreHead};
use torchrl::Generator;

use super::bare_gpt2::{padded_blocked, positions_from_mask};
use super::bare_optim::BareAdamW;
use super::bare_rlhf::{
    generate_eos, shuffled, trainable_params, BareHydra, BareRewardModel, HydraScores,
};

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
    /// Prompt and response `[B, P + R]`, its attention mask (int64) and the attention's
    /// `padded_blocked` mask.
    pub full: Tensor,
    pub mask: Tensor,
    pub blocked: Tensor,
    /// The live response tokens (bool, EOS included).
    pub keep: Tensor,
    /// The frozen trunk's output `[B, P + R, E]`, where the updates start.
    pub trunk: Tensor,
    pub log_probs: Tensor,
    pub ref_log_probs: Tensor,
    pub values: Tensor,
    /// The reward model's score `[B]`.
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
    pub rm: BareRewardModel,
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
    /// the value head's included, in our optimizer's order), AdamW with `betas`, `eps`,
    /// `weight_decay`, the trainer's generator seeded with `seed`.
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
        let trainable = trainable_params(model, true);
        let mut opt = BareAdamW::new(
            trainable.iter().map(Tensor::shallow_clone).collect(),
            s.lr.0,
            weight_decay,
        );
        opt.betas = betas;
        opt.eps = eps;
        BarePpoRlhf {
            hydra: BareHydra::from_model(model, n_head),
            rm: BareRewardModel::from_model(rm, n_head),
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
        let gen = generate_eos(
            &self.hydra.policy,
            prompt,
            None,
            s.new_tokens,
            &u,
            s.eos,
            s.pad,
            false,
            1,
        );
        let (r, keep) = (s.new_tokens, gen.live);
        let full = Tensor::cat(&[prompt, &gen.response], 1);
        let mask = Tensor::cat(&[prompt.ones_like(), keep.to_kind(Kind::Int64)], 1);
        let positions = positions_from_mask(&mask);
        let blocked = padded_blocked(&mask);
        let HydraScores {
            trunk,
            log_probs,
            ref_log_probs,
            values,
        } = self.hydra.score(&full, &positions, &blocked, p, true);
        let values = values.expect("the values");
        let score = self.rm.scores(&full, &mask, &positions, &blocked);
        let rewards = kl_rewards(
            &score,
            &log_probs,
            &ref_log_probs,
            &keep,
            s.kl_coef,
            s.cliprange_reward,
        );
        let (advantages, returns) = gae(&values, &rewards, &keep, s.gamma, s.lam);
        Experience {
            full,
            mask,
            blocked,
            keep,
            trunk,
            log_probs,
            ref_log_probs,
            values,
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
                    &pick(&exp.trunk),
                    &pick(&exp.blocked),
                    &pick(&exp.full),
                    exp.p,
                    true,
                );
                let loss = ppo_loss(
                    &lp,
                    &v.expect("the values"),
                    &pick(&exp.log_probs),
                    &pick(&exp.values),
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
