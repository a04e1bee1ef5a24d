//! Proximal policy optimisation: [`ClipPPOLoss`], TorchRL's clipped-surrogate PPO loss
//! (`torchrl.objectives.ClipPPOLoss`, 0.14.1), and [`KLPENPPOLoss`], its KL-penalty variant
//! (`torchrl.objectives.KLPENPPOLoss`), which replaces the clipped surrogate with
//! `-(exp(lw)·A - β·KL(π_old ‖ π))` and adapts `β` towards a target KL after every call.
//! Both share everything else (advantage handling, entropy bonus, critic loss, keys, value
//! estimator).
//!
//! For a batch of transitions collected by an older policy `π_old` (whose log-probabilities are
//! stored under `sample_log_prob`), with advantages `A`:
//!
//! - `log_weight = log π(a|s) - log π_old(a|s)` (one per sample, `[*B, 1]`);
//! - `loss_objective = -min(exp(lw)·A, exp(clamp(lw, ln(1-ε), ln(1+ε)))·A)`;
//! - `loss_entropy = -entropy_coeff · H(π(·|s))` (analytic entropy, or a Monte-Carlo estimate
//!   `-mean log π(x)` over reparameterised samples when the distribution has none);
//! - `loss_critic = critic_coeff · d(value_target, V(s))` with `d` smooth-L1 (default) or L2,
//!   optionally clipped around the stored value (`clip_value`, the pessimistic max of both);
//! - diagnostics (detached): `clip_fraction`, `entropy`, `ESS`, `kl_approx`, `max_ratio`,
//!   `mean_ratio`, `value_clip_fraction`, `explained_variance`.
//!
//! When the advantage is absent, the loss's value estimator (set with
//! [`ClipPPOLoss::make_value_estimator`], default GAE with γ=0.99, λ=0.95) computes it on a
//! copy of the input, with the critic's values (under `no_grad`) written under `value` and
//! `("next", value)` first.
//!
//! ```
//! use tch::{Kind, Tensor};
//! use torchrl::modules::{from_fn, DistributionBuilder, ProbabilisticActor};
//! use torchrl::objectives::{ClipPPOLoss, LossModule, LossOutput};
//! use torchrl::TensorDict;
//! # fn main() -> torchrl::Result<()> {
//! let f = (Kind::Double, tch::Device::Cpu);
//! // a Gaussian policy whose mean is a learnable scalar `w` times the observation
//! let w = Tensor::from_slice(&[0.5f64]).set_requires_grad(true);
//! let wc = w.shallow_clone();
//! let net = from_fn(["observation"], ["loc", "scale"], move |x: &[&Tensor]| {
//!     Ok(vec![x[0].f_mul(&wc)?, x[0].f_ones_like()?])
//! })?;
//! let actor = ProbabilisticActor::new(net, DistributionBuilder::normal("loc", "scale")?);
//! let critic = from_fn(["observation"], ["state_value"], |x: &[&Tensor]| Ok(vec![x[0].f_mul_scalar(2.0)?]))?;
//! let loss = ClipPPOLoss::new(actor, critic);
//!
//! let obs = Tensor::from_slice(&[1.0f64, -1.0, 0.5]).view([3, 1]);
//! let action = Tensor::from_slice(&[0.2f64, -0.7, 0.1]).view([3, 1]);
//! // log-probs under the current policy: every ratio is exactly 1
//! let old_lp = (action.f_sub(&obs.f_mul_scalar(0.5)?)?.square() * -0.5 - 0.5 * (2.0 * std::f64::consts::PI).ln()).detach();
//! let adv = Tensor::from_slice(&[1.0f64, -2.0, 0.5]).view([3, 1]);
//! let td = TensorDict::new([3])?
//!     .with("observation", obs)?
//!     .with("action", action)?
//!     .with("action_log_prob", old_lp)?
//!     .with("advantage", adv.shallow_clone())?
//!     .with("value_target", Tensor::zeros([3, 1], f))?;
//! let out = loss.forward(&td)?;
//! // ratio 1 everywhere: loss_objective = -mean(A), nothing clipped
//! assert!((out.loss_objective.double_value(&[]) - (-adv.mean(Kind::Double).double_value(&[]))).abs() < 1e-12);
//! assert_eq!(out.clip_fraction.double_value(&[]), 0.0);
//! out.total_loss()?.backward();
//! assert!(w.grad().abs().double_value(&[0]) > 0.0);
//! # Ok(()) }
//! ```

use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use tch::{Kind, Tensor};

use crate::error::{Error, Result, ShapeFmt};
use crate::modules::actors::ProbabilisticActor;
use crate::modules::distributions::{kl_divergence, Distribution};
use crate::modules::module::TensorDictModule;
use crate::rng::Generator;
use crate::tensordict::{NestedKey, TensorDict};

use super::common::{LossModule, LossOutput, Reduction};
use super::value::forward_value_estimator_keys;
use super::value::{Gae, ValueEstimator};

const NAME: &str = "ClipPPOLoss";
const KLPEN_NAME: &str = "KLPENPPOLoss";

crate::accepted_keys! {
    /// The keys of [`ClipPPOLoss`] (TorchRL's `PPOLoss._AcceptedKeys`, 0.14.1 defaults).
    pub struct PpoKeys {
        /// The advantage, `[*B, 1]`; computed by the value estimator when absent. Defaults to
        /// `"advantage"`.
        advantage: "advantage",
        /// The critic's regression target, `[*B, 1]`. Defaults to `"value_target"`.
        value_target: "value_target",
        /// The critic's output key (and, with `clip_value`, the stored old value). Defaults
        /// to `"state_value"`.
        value: "state_value",
        /// The behaviour policy's log-probability of the action. Defaults to
        /// `"action_log_prob"` (overridden by the actor's log-prob key at construction).
        sample_log_prob: "action_log_prob",
        /// The action. Defaults to `"action"` (overridden by the actor's action key at
        /// construction).
        action: "action",
        /// The reward, read under `"next"` by the value estimator. Defaults to `"reward"`.
        reward: "reward",
        /// The done flag, read under `"next"` by the value estimator. Defaults to `"done"`.
        done: "done",
        /// The terminated flag, read under `"next"` by the value estimator. Defaults to
        /// `"terminated"`.
        terminated: "terminated",
    }
}

/// The distance the critic regresses with (TorchRL's `loss_critic_type`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum CriticLossType {
    /// `smooth_l1_loss(target, value)` with β = 1 (the default).
    #[default]
    SmoothL1,
    /// `(target - value)²`.
    L2,
    /// `|target - value|`.
    L1,
}

impl CriticLossType {
    /// The element-wise distance between `target` and `value` (same shapes required).
    fn distance(self, op: &'static str, target: &Tensor, value: &Tensor) -> Result<Tensor> {
        let (ts, vs) = (target.size(), value.size());
        if ts != vs {
            return Err(Error::invalid(
                op,
                format!(
                    "the value target and the critic's value have shapes {} and {}, which \
                     are incompatible",
                    ShapeFmt(&ts),
                    ShapeFmt(&vs)
                ),
            ));
        }
        Ok(match self {
            CriticLossType::SmoothL1 => {
                target.f_smooth_l1_loss(value, tch::Reduction::None, 1.0)?
            }
            CriticLossType::L2 => target.f_mse_loss(value, tch::Reduction::None)?,
            CriticLossType::L1 => target.f_l1_loss(value, tch::Reduction::None)?,
        })
    }
}

impl FromStr for CriticLossType {
    type Err = Error;

    /// Parses `"smooth_l1"`, `"l2"` or `"l1"`.
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "smooth_l1" => Ok(CriticLossType::SmoothL1),
            "l2" => Ok(CriticLossType::L2),
            "l1" => Ok(CriticLossType::L1),
            other => Err(Error::invalid(
                NAME,
                format!("Unknown loss {other}: expected one of smooth_l1, l2, l1"),
            )),
        }
    }
}

/// The output of [`ClipPPOLoss`] (TorchRL's output tensordict, typed).
///
/// # Shapes
/// With [`Reduction::Mean`] / [`Reduction::Sum`] every `loss_*` is `[]`; with
/// [`Reduction::None`] they keep the per-sample shape with the trailing singleton squeezed
/// (`[*B]`, or `[*B, A]` for a per-dimension log-prob such as [`Normal`]'s). Metrics are `[]`
/// except `ess` (`log_weight.squeeze(-1)` reduced over dim 0: `[]` for a `[B, 1]` log-weight,
/// `[A]` for `[B, A, 1]`) and `explained_variance` (`[1]` for `[B, 1]` values).
///
/// [`Normal`]: crate::modules::distributions::Normal
#[derive(Debug)]
pub struct PpoLossOutput {
    /// The clipped surrogate, `-min(r·A, clip(r)·A)`, reduced.
    pub loss_objective: Tensor,
    /// `-entropy_coeff · entropy`, reduced; `None` without the entropy bonus.
    pub loss_entropy: Option<Tensor>,
    /// `critic_coeff · distance`, reduced; `None` without a critic (or with `critic_coeff = 0`).
    pub loss_critic: Option<Tensor>,
    /// The fraction of log-weights the clamp changed (detached).
    pub clip_fraction: Tensor,
    /// The mean entropy (detached); `None` without the entropy bonus.
    pub entropy: Option<Tensor>,
    /// The effective sample size of the importance weights divided by the batch size:
    /// `exp(2·lse(lw) - lse(2·lw)) / B` (detached).
    pub ess: Tensor,
    /// `mean(log π_old - log π)` (detached).
    pub kl_approx: Tensor,
    /// `max(exp(lw))` (detached).
    pub max_ratio: Tensor,
    /// `mean(exp(lw))` (detached).
    pub mean_ratio: Tensor,
    /// The fraction of values clipped by `clip_value` (detached); `None` without it.
    pub value_clip_fraction: Option<Tensor>,
    /// `1 - var(target - V) / (var(target) + eps)` over dim 0 (detached); `None` without a
    /// critic loss.
    pub explained_variance: Option<Tensor>,
}

impl LossOutput for PpoLossOutput {
    fn loss_terms(&self) -> Vec<(&'static str, &Tensor)> {
        named_some(
            vec![("loss_objective", &self.loss_objective)],
            [
                ("loss_entropy", &self.loss_entropy),
                ("loss_critic", &self.loss_critic),
            ],
        )
    }

    fn metrics(&self) -> Vec<(&'static str, &Tensor)> {
        let mut m = named_some(
            vec![("clip_fraction", &self.clip_fraction)],
            [
                ("entropy", &self.entropy),
                ("value_clip_fraction", &self.value_clip_fraction),
                ("explained_variance", &self.explained_variance),
            ],
        );
        m.push(("ESS", &self.ess));
        m.push(("kl_approx", &self.kl_approx));
        m.push(("max_ratio", &self.max_ratio));
        m.push(("mean_ratio", &self.mean_ratio));
        m
    }
}

/// `head` followed by the present entries of `optional`, in order.
fn named_some<'a, const N: usize>(
    mut head: Vec<(&'static str, &'a Tensor)>,
    optional: [(&'static str, &'a Option<Tensor>); N],
) -> Vec<(&'static str, &'a Tensor)> {
    head.extend(
        optional
            .into_iter()
            .filter_map(|(k, t)| t.as_ref().map(|t| (k, t))),
    );
    head
}

/// The output of [`KLPENPPOLoss`] (TorchRL's output tensordict, typed).
///
/// # Shapes
/// `loss_*` as in [`PpoLossOutput`]; `kl` unreduced, `[*B, 1]` (or `[*B, A, 1]`);
/// `kl_approx` and `entropy` `[]`; `explained_variance` `[1]` for `[B, 1]` values.
#[derive(Debug)]
pub struct KlPenPpoLossOutput {
    /// `-(exp(lw)·A - β·kl)`, reduced.
    pub loss_objective: Tensor,
    /// `-entropy_coeff · entropy`, reduced; `None` without the entropy bonus.
    pub loss_entropy: Option<Tensor>,
    /// `critic_coeff · distance`, reduced; `None` without a critic (or with `critic_coeff = 0`).
    pub loss_critic: Option<Tensor>,
    /// `KL(π_old ‖ π)` per sample (detached, not reduced).
    pub kl: Tensor,
    /// `mean(log π_old - log π)` (detached).
    pub kl_approx: Tensor,
    /// The mean entropy (detached); `None` without the entropy bonus.
    pub entropy: Option<Tensor>,
    /// The fraction of values clipped by `clip_value` (detached); `None` without it.
    pub value_clip_fraction: Option<Tensor>,
    /// `1 - var(target - V) / (var(target) + eps)` over dim 0 (detached); `None` without a
    /// critic loss.
    pub explained_variance: Option<Tensor>,
    /// The β this call used (the loss's β has since been adapted). Not one of TorchRL's
    /// outputs, so not in [`metrics`](LossOutput::metrics).
    pub beta: f64,
}

impl LossOutput for KlPenPpoLossOutput {
    fn loss_terms(&self) -> Vec<(&'static str, &Tensor)> {
        named_some(
            vec![("loss_objective", &self.loss_objective)],
            [
                ("loss_entropy", &self.loss_entropy),
                ("loss_critic", &self.loss_critic),
            ],
        )
    }

    fn metrics(&self) -> Vec<(&'static str, &Tensor)> {
        named_some(
            vec![("kl", &self.kl), ("kl_approx", &self.kl_approx)],
            [
                ("entropy", &self.entropy),
                ("value_clip_fraction", &self.value_clip_fraction),
                ("explained_variance", &self.explained_variance),
            ],
        )
    }
}

/// The state and the settings every PPO loss shares (TorchRL's `PPOLoss` base): the networks,
/// the entropy and critic terms, advantage handling, keys and the value estimator.
struct PpoBase {
    name: &'static str,
    actor: ProbabilisticActor,
    critic: Option<Box<dyn TensorDictModule>>,
    entropy_bonus: bool,
    entropy_coeff: f64,
    samples_mc_entropy: i64,
    critic_coeff: f64,
    loss_critic_type: CriticLossType,
    clip_value: Option<f64>,
    normalize_advantage: bool,
    reduction: Reduction,
    keys: PpoKeys,
    in_keys: Vec<NestedKey>,
    value_estimator: Option<Box<dyn ValueEstimator + Send>>,
    gen: Mutex<Generator>,
    /// Whether the distribution's parameter keys are inputs (KLPEN reads the behaviour
    /// policy's parameters from the data).
    reads_dist_params: bool,
}

impl PpoBase {
    fn new(
        name: &'static str,
        actor: ProbabilisticActor,
        critic: Option<Box<dyn TensorDictModule>>,
        reads_dist_params: bool,
    ) -> Self {
        let keys = PpoKeys {
            action: actor.action_key().clone(),
            sample_log_prob: actor.log_prob_key(),
            ..PpoKeys::default()
        };
        let mut base = PpoBase {
            name,
            actor,
            critic,
            entropy_bonus: true,
            entropy_coeff: 0.01,
            samples_mc_entropy: 1,
            critic_coeff: 1.0,
            loss_critic_type: CriticLossType::SmoothL1,
            clip_value: None,
            normalize_advantage: false,
            reduction: Reduction::Mean,
            keys,
            in_keys: Vec::new(),
            value_estimator: None,
            gen: Mutex::new(Generator::new(0)),
            reads_dist_params,
        };
        base.in_keys = base.compute_in_keys(&base.keys);
        base
    }

    fn bad(&self, message: impl Into<String>) -> Error {
        Error::invalid(self.name, message.into())
    }

    fn check_coeff(&self, what: &str, v: f64) -> Result<f64> {
        if v.is_finite() && v >= 0.0 {
            Ok(v)
        } else {
            Err(self.bad(format!("{what} must be finite and >= 0, got {v}")))
        }
    }

    fn debug_fields(&self, d: &mut fmt::DebugStruct<'_, '_>) {
        d.field("actor", &self.actor)
            .field("critic", &self.critic.as_ref().map(|c| c.out_keys()))
            .field("entropy_bonus", &self.entropy_bonus)
            .field("entropy_coeff", &self.entropy_coeff)
            .field("critic_coeff", &self.critic_coeff)
            .field("loss_critic_type", &self.loss_critic_type)
            .field("clip_value", &self.clip_value)
            .field("normalize_advantage", &self.normalize_advantage)
            .field("reduction", &self.reduction)
            .field("keys", &self.keys)
            .field(
                "value_estimator",
                &self.value_estimator.as_ref().map(|e| e.name()),
            );
    }

    fn has_critic(&self) -> bool {
        self.critic.is_some() && self.critic_coeff > 0.0
    }

    /// The `out_keys` every PPO loss shares, after its own leading ones.
    fn out_keys(&self, mut k: Vec<&'static str>) -> Vec<&'static str> {
        if self.entropy_bonus {
            k.extend(["entropy", "loss_entropy"]);
        }
        if self.has_critic() {
            k.push("loss_critic");
        }
        if self.clip_value.is_some() {
            k.push("value_clip_fraction");
        }
        k
    }

    fn forward_keys(keys: &PpoKeys, estimator: &mut dyn ValueEstimator) -> Result<()> {
        forward_value_estimator_keys(keys, estimator)?;
        if estimator.accepts_key("sample_log_prob") {
            estimator.set_keys(&[("sample_log_prob", Some(keys.sample_log_prob.clone()))])?;
        }
        Ok(())
    }

    fn make_value_estimator(
        &mut self,
        mut estimator: Box<dyn ValueEstimator + Send>,
    ) -> Result<()> {
        Self::forward_keys(&self.keys, estimator.as_mut())?;
        self.value_estimator = Some(estimator);
        Ok(())
    }

    fn set_tensor_keys(&mut self, keys: PpoKeys) -> Result<()> {
        if let Some(est) = &mut self.value_estimator {
            // validate on a scratch copy of the estimator's keys first, so an error changes
            // nothing
            let saved = est.tensor_keys().clone();
            if let Err(e) = Self::forward_keys(&keys, est.as_mut()) {
                est.set_tensor_keys(saved)?;
                return Err(e);
            }
        }
        self.in_keys = self.compute_in_keys(&keys);
        self.keys = keys;
        Ok(())
    }

    /// TorchRL's `_set_in_keys` (first occurrence order, no duplicates).
    fn compute_in_keys(&self, keys: &PpoKeys) -> Vec<NestedKey> {
        let mut out: Vec<NestedKey> = Vec::new();
        let mut push = |k: NestedKey| {
            if !out.contains(&k) {
                out.push(k);
            }
        };
        let actor_in = self.actor.in_keys();
        for k in &actor_in {
            push(k.clone());
        }
        for k in &actor_in {
            push(k.prefixed("next"));
        }
        if let Some(c) = &self.critic {
            for k in c.in_keys() {
                push(k);
            }
        }
        push(keys.action.clone());
        push(keys.sample_log_prob.clone());
        push(keys.reward.prefixed("next"));
        push(keys.done.prefixed("next"));
        push(keys.terminated.prefixed("next"));
        if self.reads_dist_params {
            for k in self.actor.builder().in_keys() {
                push(k.clone());
            }
        }
        out
    }

    fn entry<'a>(&self, td: &'a TensorDict, key: &NestedKey) -> Result<&'a Tensor> {
        td.get(key).ok_or_else(|| {
            let available = td
                .keys(true, true)
                .iter()
                .map(ToString::to_string)
                .collect();
            Error::KeyNotFound {
                op: self.name,
                key: key.to_string(),
                available,
            }
        })
    }

    /// Runs the critic on a copy of `td` and returns its `value` output.
    fn critic_value(&self, critic: &dyn TensorDictModule, td: &TensorDict) -> Result<Tensor> {
        let out = critic.forward(td.clone())?;
        out.get(&self.keys.value)
            .map(Tensor::shallow_clone)
            .ok_or_else(|| {
                self.bad(format!(
                    "the key {} was not found in the critic output tensordict; the critic \
                     writes [{}]. Make sure the value key is accurate",
                    self.keys.value,
                    critic
                        .out_keys()
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            })
    }

    /// Computes the advantage with the value estimator on `td` (modified in place).
    fn estimate_advantage(&self, td: &mut TensorDict) -> Result<Tensor> {
        let Some(critic) = &self.critic else {
            return Err(self.bad(format!(
                "the advantage ({}) is missing and there is no critic network to compute it",
                self.keys.advantage
            )));
        };
        {
            // TorchRL runs the estimator with detached critic parameters.
            let _guard = tch::no_grad_guard();
            let v = self.critic_value(critic.as_ref(), td)?.f_detach()?;
            let next = td.get_dict("next").ok_or_else(|| {
                self.bad(format!(
                    "the advantage ({}) is missing and the \"next\" sub-tensordict the value \
                     estimator needs is absent",
                    self.keys.advantage
                ))
            })?;
            let nv = self.critic_value(critic.as_ref(), next)?.f_detach()?;
            td.set(&self.keys.value, v)?;
            td.set(self.keys.value.prefixed("next"), nv)?;
        }
        match &self.value_estimator {
            Some(est) => est.forward(td)?,
            None => {
                let mut gae = Gae::new(0.99, 0.95)?;
                Self::forward_keys(&self.keys, &mut gae)?;
                gae.forward(td)?;
            }
        }
        Ok(self.entry(td, &self.keys.advantage)?.shallow_clone())
    }

    /// The advantage (read, or estimated on `td`), standardised with `normalize_advantage`.
    fn advantage(&self, td: &mut TensorDict) -> Result<Tensor> {
        let advantage = match td.get(&self.keys.advantage) {
            Some(a) => a.shallow_clone(),
            None => self.estimate_advantage(td)?,
        };
        if self.normalize_advantage && advantage.numel() > 1 {
            let mean = advantage.f_mean(None)?;
            let std = advantage.f_std(true)?.f_clamp_min(1e-6)?;
            Ok(advantage.f_sub(&mean)?.f_div(&std)?)
        } else {
            Ok(advantage)
        }
    }

    /// TorchRL's `_log_weight`: `(log_weight, current distribution, kl_approx)`, the first and
    /// last `[*B, 1]` (or `[*B, A, 1]`).
    fn log_weight(&self, td: &TensorDict) -> Result<(Tensor, Box<dyn Distribution>, Tensor)> {
        let prev_log_prob = self.entry(td, &self.keys.sample_log_prob)?;
        if prev_log_prob.requires_grad() {
            return Err(self.bad(format!(
                "tensordict stored {} requires grad",
                self.keys.sample_log_prob
            )));
        }
        let dist = self.actor.get_dist(td)?;
        let action = self.entry(td, &self.keys.action)?;
        let log_prob = dist.log_prob(action)?;
        let log_weight = log_prob.f_sub(prev_log_prob)?.f_unsqueeze(-1)?;
        let kl_approx = prev_log_prob.f_sub(&log_prob)?.f_unsqueeze(-1)?;
        Ok((log_weight, dist, kl_approx))
    }

    /// What every PPO forward starts with: a shallow copy of the input (the estimator may
    /// write to it), the advantage, and the log-weight with the current distribution.
    fn prepare(&self, td: &TensorDict) -> Result<Prepared> {
        let mut td = td.clone();
        let advantage = self.advantage(&mut td)?;
        let (log_weight, dist, kl_approx) = self.log_weight(&td)?;
        let advantage = self.broadcast_advantage(&advantage, &log_weight)?;
        Ok(Prepared {
            td,
            advantage,
            log_weight,
            dist,
            kl_approx,
        })
    }

    /// The advantage broadcast to the log-weight's shape (see [`broadcast_advantage`]), with
    /// the outer-product guard.
    fn broadcast_advantage(&self, advantage: &Tensor, log_weight: &Tensor) -> Result<Tensor> {
        let advantage = broadcast_advantage(advantage, log_weight)?;
        self.check_advantage_broadcast(&advantage, log_weight)?;
        Ok(advantage)
    }

    /// TorchRL's `_check_advantage_broadcast`: refuses a broadcast that would form an outer
    /// product over samples.
    fn check_advantage_broadcast(&self, advantage: &Tensor, log_weight: &Tensor) -> Result<()> {
        let (a, l) = (advantage.size(), log_weight.size());
        let Ok(b) = Tensor::f_broadcast_tensors(&[advantage, log_weight]) else {
            return Ok(());
        };
        let Some(first) = b.first() else {
            return Ok(());
        };
        let numel = |s: &[i64]| s.iter().product::<i64>();
        if numel(&first.size()) > numel(&a).max(numel(&l)) {
            return Err(self.bad(format!(
                "The advantage (shape={}) and the log-weight (shape={}) would broadcast to {}, \
                 turning the PPO objective into an outer product over samples. This usually \
                 means the advantage is missing its trailing value dimension: reshape it to \
                 batch shape + (1,) (e.g. advantage.unsqueeze(-1)).",
                ShapeFmt(&a),
                ShapeFmt(&l),
                ShapeFmt(&first.size())
            )));
        }
        Ok(())
    }

    fn lock_gen(&self) -> Result<std::sync::MutexGuard<'_, Generator>> {
        self.gen
            .lock()
            .map_err(|_| self.bad("the Monte-Carlo generator lock is poisoned"))
    }

    /// The entropy of `dist`, `[*batch]`: analytic when available and finite, else the
    /// Monte-Carlo estimate `-mean_k log π(x_k)`.
    fn entropy(&self, dist: &dyn Distribution) -> Result<Tensor> {
        if let Ok(h) = dist.entropy() {
            let finite = h.f_isfinite()?.f_all()?.int64_value(&[]) != 0;
            if finite {
                return Ok(h);
            }
        }
        let mut gen = self.lock_gen()?;
        let n = [self.samples_mc_entropy];
        let x = if dist.has_rsample() {
            dist.rsample(&mut gen, &n)?
        } else {
            dist.sample(&mut gen, &n)?
        };
        Ok(dist
            .log_prob(&x)?
            .f_mean_dim([0i64].as_slice(), false, None::<Kind>)?
            .f_neg()?)
    }

    /// Reduces a `loss_*` term, then squeezes its trailing singleton dim.
    fn reduce(&self, t: &Tensor) -> Result<Tensor> {
        let r = self.reduction.apply(t)?;
        if r.dim() > 0 {
            Ok(r.f_squeeze_dim(-1)?)
        } else {
            Ok(r)
        }
    }

    /// `(loss_entropy, entropy)`, both `None` without the entropy bonus.
    fn entropy_terms(&self, dist: &dyn Distribution) -> Result<(Option<Tensor>, Option<Tensor>)> {
        if !self.entropy_bonus {
            return Ok((None, None));
        }
        let h = self.entropy(dist)?.f_unsqueeze(-1)?;
        let mean_h = h.f_detach()?.f_mean(None)?;
        let loss = self.reduce(&h.f_mul_scalar(-self.entropy_coeff)?)?;
        Ok((Some(loss), Some(mean_h)))
    }

    /// `(loss_critic, value_clip_fraction, explained_variance)`; all `None` without a critic
    /// loss.
    fn critic_terms(&self, td: &TensorDict) -> Result<CriticTerms> {
        match &self.critic {
            Some(critic) if self.has_critic() => {
                let (l, vcf, ev) = self.critic_loss(critic.as_ref(), td)?;
                Ok((Some(self.reduce(&l)?), vcf, Some(ev)))
            }
            _ => Ok((None, None, None)),
        }
    }

    /// TorchRL's `loss_critic`: `(critic_coeff · distance, value_clip_fraction,
    /// explained_variance)`, unreduced.
    fn critic_loss(
        &self,
        critic: &dyn TensorDictModule,
        td: &TensorDict,
    ) -> Result<(Tensor, Option<Tensor>, Tensor)> {
        let target = self.entry(td, &self.keys.value_target)?;
        let old_value = match self.clip_value {
            Some(_) => Some(self.entry(td, &self.keys.value)?.shallow_clone()),
            None => None,
        };
        let value = self.critic_value(critic, td)?;
        let distance = |t: &Tensor, v: &Tensor| self.loss_critic_type.distance(self.name, t, v);
        let mut loss = distance(target, &value)?;
        let mut clip_fraction = None;
        if let (Some(c), Some(old)) = (self.clip_value, &old_value) {
            let pre = value.f_sub(old)?;
            let clipped = pre.f_clamp(-c, c)?;
            clip_fraction = Some(detached_fraction(
                &pre.f_ne_tensor(&clipped)?,
                value.kind(),
            )?);
            let value_clipped = old.f_add(&clipped)?;
            loss = loss.f_maximum(&distance(target, &value_clipped)?)?;
        }
        let explained_variance = {
            let _guard = tch::no_grad_guard();
            let t = target.f_detach()?;
            let p = value.f_detach()?;
            let eps = match t.kind() {
                Kind::Double => f64::EPSILON,
                Kind::Half => 0.000_976_562_5,
                Kind::BFloat16 => 0.007_812_5,
                _ => f64::from(f32::EPSILON),
            };
            let dim0 = [0i64];
            let resid = t
                .f_sub(&p)?
                .f_var_correction(Some(dim0.as_slice()), 0, false)?;
            let total = t.f_var_correction(Some(dim0.as_slice()), 0, false)?;
            resid
                .f_div(&total.f_add_scalar(eps)?)?
                .f_neg()?
                .f_add_scalar(1.0)?
        };
        Ok((
            loss.f_mul_scalar(self.critic_coeff)?,
            clip_fraction,
            explained_variance,
        ))
    }
}

/// The inputs of a PPO objective (see [`PpoBase::prepare`]).
struct Prepared {
    td: TensorDict,
    advantage: Tensor,
    log_weight: Tensor,
    dist: Box<dyn Distribution>,
    kl_approx: Tensor,
}

/// `(loss_critic, value_clip_fraction, explained_variance)`.
type CriticTerms = (Option<Tensor>, Option<Tensor>, Option<Tensor>);

/// The mean of a boolean mask as `kind`, without gradient.
fn detached_fraction(mask: &Tensor, kind: Kind) -> Result<Tensor> {
    let _guard = tch::no_grad_guard();
    Ok(mask.f_to_kind(kind)?.f_mean(None)?.f_detach()?)
}

/// TorchRL's `_broadcast_advantage_to_log_weight`: a `[*B, 1]` advantage is expanded over the
/// per-token dims of a `[*B, *T, 1]` log-weight.
fn broadcast_advantage(advantage: &Tensor, log_weight: &Tensor) -> Result<Tensor> {
    let (a, l) = (advantage.size(), log_weight.size());
    let Some((&1, batch)) = a.split_last() else {
        return Ok(advantage.shallow_clone());
    };
    if a == l || a.len() < 2 || l.last() != Some(&1) || l.len() <= a.len() {
        return Ok(advantage.shallow_clone());
    }
    if l.get(..batch.len()) != Some(batch) {
        return Ok(advantage.shallow_clone());
    }
    let token_dims = l.get(batch.len()..l.len() - 1).unwrap_or_default();
    let mut view: Vec<i64> = batch.to_vec();
    view.extend(vec![1; token_dims.len()]);
    view.push(1);
    let mut expand: Vec<i64> = batch.to_vec();
    expand.extend_from_slice(token_dims);
    expand.push(1);
    Ok(advantage.f_reshape(&view)?.f_expand(&expand, false)?)
}

/// The builder methods and accessors every PPO loss shares, delegating to `self.base`.
macro_rules! ppo_shared_methods {
    () => {
        /// Whether the entropy bonus is added (default `true`).
        pub fn with_entropy_bonus(mut self, entropy_bonus: bool) -> Self {
            self.base.entropy_bonus = entropy_bonus;
            self
        }

        /// The entropy coefficient (TorchRL's `entropy_coeff`, default 0.01). Errors when
        /// negative or not finite.
        pub fn with_entropy_coeff(mut self, coeff: f64) -> Result<Self> {
            self.base.entropy_coeff = self.base.check_coeff("entropy_coeff", coeff)?;
            Ok(self)
        }

        /// The number of samples of the Monte-Carlo entropy estimate (default 1). Errors when
        /// `< 1`.
        pub fn with_samples_mc_entropy(mut self, n: i64) -> Result<Self> {
            if n < 1 {
                return Err(self
                    .base
                    .bad(format!("samples_mc_entropy must be >= 1, got {n}")));
            }
            self.base.samples_mc_entropy = n;
            Ok(self)
        }

        /// Reseeds the generator of the Monte-Carlo estimates (default seed 0).
        pub fn with_seed(mut self, seed: u64) -> Self {
            self.base.gen = Mutex::new(Generator::new(seed));
            self
        }

        /// The critic coefficient (TorchRL's `critic_coeff`, default 1.0); `0` disables the
        /// critic loss. Errors when negative or not finite.
        pub fn with_critic_coeff(mut self, coeff: f64) -> Result<Self> {
            self.base.critic_coeff = self.base.check_coeff("critic_coeff", coeff)?;
            Ok(self)
        }

        /// The critic's distance (default [`CriticLossType::SmoothL1`]).
        pub fn with_loss_critic_type(mut self, t: CriticLossType) -> Self {
            self.base.loss_critic_type = t;
            self
        }

        /// Clips the value prediction to `old_value ± clip_value` and keeps the larger of the
        /// clipped and unclipped losses (`None`, the default, disables it). TorchRL's
        /// `clip_value=True` is `with_clip_value(Some(clip_epsilon))`. Errors unless positive
        /// and finite.
        pub fn with_clip_value(mut self, clip_value: Option<f64>) -> Result<Self> {
            if let Some(v) = clip_value {
                if !v.is_finite() || v <= 0.0 {
                    return Err(self
                        .base
                        .bad(format!("clip_value must be finite and > 0, got {v}")));
                }
            }
            self.base.clip_value = clip_value;
            Ok(self)
        }

        /// Standardises the advantage before use (default `false`).
        pub fn with_normalize_advantage(mut self, normalize: bool) -> Self {
            self.base.normalize_advantage = normalize;
            self
        }

        /// The reduction of the `loss_*` terms (default [`Reduction::Mean`]).
        pub fn with_reduction(mut self, reduction: Reduction) -> Self {
            self.base.reduction = reduction;
            self
        }

        /// Sets the value estimator used when the advantage is absent, and forwards the
        /// loss's keys to it (`advantage`, `value_target`, `value`, `reward`, `done`,
        /// `terminated`, `sample_log_prob`). Without one, a default GAE (γ = 0.99, λ = 0.95)
        /// is used.
        pub fn make_value_estimator(
            &mut self,
            estimator: Box<dyn ValueEstimator + Send>,
        ) -> Result<()> {
            self.base.make_value_estimator(estimator)
        }

        /// The value estimator set with [`make_value_estimator`](Self::make_value_estimator).
        pub fn value_estimator(&self) -> Option<&(dyn ValueEstimator + Send)> {
            self.base.value_estimator.as_deref()
        }

        /// Computes the advantage on a whole batch in place (TorchRL's
        /// `loss.value_estimator(td)`): the critic's values, under `no_grad`, under the
        /// `value` key at the root and in `"next"`, then the value estimator (default GAE,
        /// γ = 0.99, λ = 0.95) writes `advantage` and `value_target`. Run it on the collected
        /// `[*B, T]` batch before cutting it into minibatches. Errors without a critic or
        /// without `"next"`.
        pub fn compute_advantage(&self, td: &mut TensorDict) -> Result<()> {
            self.base.estimate_advantage(td).map(drop)
        }

        /// The actor.
        pub fn actor(&self) -> &ProbabilisticActor {
            &self.base.actor
        }

        /// The critic, if any.
        pub fn critic(&self) -> Option<&dyn TensorDictModule> {
            self.base.critic.as_deref()
        }

        /// The entropy coefficient.
        pub fn entropy_coeff(&self) -> f64 {
            self.base.entropy_coeff
        }

        /// The critic coefficient.
        pub fn critic_coeff(&self) -> f64 {
            self.base.critic_coeff
        }

        /// The value-clipping radius, if any.
        pub fn clip_value(&self) -> Option<f64> {
            self.base.clip_value
        }

        /// The reduction.
        pub fn reduction(&self) -> Reduction {
            self.base.reduction
        }
    };
}

/// `new` (with the given doc) and `without_critic`, both through `Self::build`.
macro_rules! ppo_constructors {
    ($new_doc:expr) => {
        #[doc = $new_doc]
        pub fn new(actor: ProbabilisticActor, critic: impl TensorDictModule + 'static) -> Self {
            Self::build(actor, Some(Box::new(critic)))
        }

        /// A loss without a critic: no `loss_critic`, and the advantage must be in the input.
        pub fn without_critic(actor: ProbabilisticActor) -> Self {
            Self::build(actor, None)
        }
    };
}

/// The [`LossModule`] key plumbing every PPO loss shares, delegating to `self.base`.
macro_rules! ppo_loss_module_keys {
    () => {
        type Keys = PpoKeys;

        fn name(&self) -> &'static str {
            self.base.name
        }

        fn tensor_keys(&self) -> &PpoKeys {
            &self.base.keys
        }

        fn set_tensor_keys(&mut self, keys: PpoKeys) -> Result<()> {
            self.base.set_tensor_keys(keys)
        }

        fn in_keys(&self) -> &[NestedKey] {
            &self.base.in_keys
        }
    };
}

// ------------------------------------------------------------------------------ ClipPPOLoss

/// TorchRL's `ClipPPOLoss` (see the [module docs](self)).
///
/// What [`forward`](LossModule::forward) does:
/// 1. Reads the advantage, or runs the value estimator on a copy of the input (see
///    [`ClipPPOLoss::make_value_estimator`]).
/// 2. With `normalize_advantage` (and more than one element):
///    `A ← (A - mean(A)) / max(std(A), 1e-6)` (unbiased std, every element).
/// 3. `lw = (actor.get_dist(td).log_prob(td[action]) - td[sample_log_prob]).unsqueeze(-1)`;
///    a `[*B, 1]` advantage is expanded over extra per-token dims of `lw`, and a broadcast
///    that would form an outer product (a `[B]` advantage against `[B, 1]`) is an error.
/// 4. The clipped surrogate, the entropy bonus, the critic loss and the diagnostics; each
///    `loss_*` is reduced with the reduction, then its trailing singleton dim squeezed.
///
/// # Shapes
/// - input: a tensordict of batch size `[*B]` with the actor's and critic's inputs, `action`,
///   `sample_log_prob` (`[*B]`, or `[*B, A]` for a per-dimension log-prob), `advantage` and
///   `value_target` (`[*B, 1]`), and with `clip_value` the old `value` (`[*B, 1]`).
/// - output: see [`PpoLossOutput`].
///
/// # Errors
/// A missing entry (the error names the key), a stored log-prob that requires grad, a critic
/// that does not write `value`, value/target shape mismatch, or an outer-product broadcast.
pub struct ClipPPOLoss {
    base: PpoBase,
    clip_epsilon: f64,
}

impl fmt::Debug for ClipPPOLoss {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct(NAME);
        self.base.debug_fields(&mut d);
        d.field("clip_epsilon", &self.clip_epsilon)
            .finish_non_exhaustive()
    }
}

impl ClipPPOLoss {
    ppo_constructors!(
        "A loss with an actor and a critic (any module writing `state_value`), with TorchRL's \
         defaults: `clip_epsilon = 0.2`, entropy bonus on with `entropy_coeff = 0.01` (one \
         Monte-Carlo sample when the entropy has no closed form), `critic_coeff = 1.0`, \
         smooth-L1 critic loss, no value clipping, no advantage normalisation, \
         [`Reduction::Mean`]. The `action` and `sample_log_prob` keys are taken from the actor."
    );

    fn build(actor: ProbabilisticActor, critic: Option<Box<dyn TensorDictModule>>) -> Self {
        ClipPPOLoss {
            base: PpoBase::new(NAME, actor, critic, false),
            clip_epsilon: 0.2,
        }
    }

    /// The clip ε: log-weights are clamped to `[ln(1-ε), ln(1+ε)]`. Errors unless
    /// `0 < ε < 1` (ε ≥ 1 makes the lower bound `ln(≤0)`, NaN in TorchRL).
    pub fn with_clip_epsilon(mut self, clip_epsilon: f64) -> Result<Self> {
        if clip_epsilon.is_nan() || clip_epsilon <= 0.0 || clip_epsilon >= 1.0 {
            return Err(self.base.bad(format!(
                "clip_epsilon must be in (0, 1), got {clip_epsilon}"
            )));
        }
        self.clip_epsilon = clip_epsilon;
        Ok(self)
    }

    ppo_shared_methods!();

    /// The clip ε.
    pub fn clip_epsilon(&self) -> f64 {
        self.clip_epsilon
    }

    /// TorchRL's `out_keys`.
    pub fn out_keys(&self) -> Vec<&'static str> {
        let mut k = self.base.out_keys(vec!["loss_objective", "clip_fraction"]);
        k.extend(["ESS", "kl_approx", "max_ratio", "mean_ratio"]);
        k
    }
}

impl LossModule for ClipPPOLoss {
    type Output = PpoLossOutput;

    ppo_loss_module_keys!();

    fn forward(&self, td: &TensorDict) -> Result<PpoLossOutput> {
        let b = &self.base;
        let Prepared {
            td,
            advantage,
            log_weight,
            dist,
            kl_approx,
        } = b.prepare(td)?;

        let (ess, max_ratio, mean_ratio, kl) = {
            let _guard = tch::no_grad_guard();
            let lw = log_weight.f_detach()?.f_squeeze_dim(-1)?;
            let dim0 = [0i64];
            let ess = lw
                .f_logsumexp(dim0.as_slice(), false)?
                .f_mul_scalar(2.0)?
                .f_sub(&lw.f_mul_scalar(2.0)?.f_logsumexp(dim0.as_slice(), false)?)?
                .f_exp()?;
            let batch = log_weight.size().first().copied().unwrap_or(1);
            let ratio = log_weight.f_detach()?.f_exp()?;
            (
                ess.f_div_scalar(batch as f64)?,
                ratio.f_max()?,
                ratio.f_mean(None)?,
                kl_approx.f_detach()?.f_mean(None)?,
            )
        };

        let gain1 = log_weight.f_exp()?.f_mul(&advantage)?;
        let lo = (-self.clip_epsilon).ln_1p();
        let hi = self.clip_epsilon.ln_1p();
        let log_weight_clip = log_weight.f_clamp(lo, hi)?;
        let clip_fraction = detached_fraction(
            &log_weight_clip.f_ne_tensor(&log_weight)?,
            log_weight.kind(),
        )?;
        let gain2 = log_weight_clip.f_exp()?.f_mul(&advantage)?;
        let (gain, _) = Tensor::f_stack(&[gain1, gain2], -1)?.f_min_dim(-1, false)?;
        let loss_objective = b.reduce(&gain.f_neg()?)?;

        let (loss_entropy, entropy) = b.entropy_terms(dist.as_ref())?;
        let (loss_critic, value_clip_fraction, explained_variance) = b.critic_terms(&td)?;

        Ok(PpoLossOutput {
            loss_objective,
            loss_entropy,
            loss_critic,
            clip_fraction,
            entropy,
            ess,
            kl_approx: kl,
            max_ratio,
            mean_ratio,
            value_clip_fraction,
            explained_variance,
        })
    }
}

// ----------------------------------------------------------------------------- KLPENPPOLoss

/// TorchRL's `KLPENPPOLoss`: PPO with an adaptive KL penalty instead of a clipped ratio (see
/// the [module docs](self)).
///
/// What [`forward`](LossModule::forward) does:
/// 1. Builds the behaviour policy's distribution `π_old` from the parameters stored in the
///    input (the actor's distribution keys, e.g. `loc`/`scale`: TorchRL's
///    `build_dist_from_params`); an error names them when absent.
/// 2. Reads or estimates the advantage (optionally standardised) and computes
///    `lw = log π(a|s) - log π_old(a|s)` exactly as [`ClipPPOLoss`] does.
/// 3. `kl = KL(π_old ‖ π)` in closed form when the pair has one ([`kl_divergence`]: Normal,
///    TanhNormal, Categorical, OneHotCategorical), else the Monte-Carlo estimate
///    `mean_k (log π_old(x_k) - log π(x_k))` over `samples_mc_kl` draws `x_k ~ π_old`; then
///    `unsqueeze(-1)`.
/// 4. `loss_objective = reduce(-(exp(lw)·A - β·kl))` with the current `β`.
/// 5. Adapts `β` for the next call: `β ← β·increment` if `mean(kl) > 1.5·dtarg`,
///    `β ← β·decrement` if `mean(kl) < dtarg/1.5` (unchanged otherwise, or when the KL is NaN;
///    TorchRL sets no bounds on β).
/// 6. The entropy bonus and the critic loss as in [`ClipPPOLoss`].
///
/// `β` lives in the loss behind an atomic (forward takes `&self`); [`beta`](Self::beta)
/// reads it and [`reset`](Self::reset) restores the initial value.
///
/// **Divergence from TorchRL 0.14.1** (deliberate): TorchRL updates its `beta` buffer in
/// place (`beta.data *= increment`) after the penalty `beta * kl` entered the autograd graph,
/// so its backward pass multiplies the KL gradient by the *updated* `β` while the reported
/// loss used the old one. Here the gradient is the gradient of the reported loss (old `β`);
/// values are identical.
///
/// # Shapes
/// As [`ClipPPOLoss`]; `kl` is per sample, `[*B, 1]` (or `[*B, A, 1]` for a per-dimension
/// log-prob such as [`Normal`](crate::modules::distributions::Normal)'s), not reduced.
///
/// # Errors
/// Those of [`ClipPPOLoss`], plus missing distribution parameters.
///
/// ```
/// use tch::{Kind, Tensor};
/// use torchrl::modules::{from_fn, DistributionBuilder, ProbabilisticActor};
/// use torchrl::objectives::{KLPENPPOLoss, LossModule, LossOutput};
/// use torchrl::TensorDict;
/// # fn main() -> torchrl::Result<()> {
/// // a unit-variance Gaussian policy with a learnable mean `w · obs`
/// let w = Tensor::from_slice(&[0.5f64]).set_requires_grad(true);
/// let wc = w.shallow_clone();
/// let net = from_fn(["observation"], ["loc", "scale"], move |x: &[&Tensor]| {
///     Ok(vec![x[0].f_mul(&wc)?, x[0].f_ones_like()?])
/// })?;
/// let actor = ProbabilisticActor::new(net, DistributionBuilder::normal("loc", "scale")?);
/// let mut loss = KLPENPPOLoss::without_critic(actor).with_entropy_bonus(false);
///
/// let obs = Tensor::from_slice(&[1.0f64, -1.0]).view([2, 1]);
/// let action = Tensor::from_slice(&[0.5f64, -0.5]).view([2, 1]);
/// // the behaviour policy: loc = 0.5·obs + 0.3 (stored), so KL = ½·0.3² per sample
/// let old_loc = obs.f_mul_scalar(0.5)?.f_add_scalar(0.3)?;
/// let old_lp = (action.f_sub(&old_loc)?.square() * -0.5 - 0.5 * (2.0 * std::f64::consts::PI).ln()).detach();
/// let td = TensorDict::new([2])?
///     .with("observation", obs)?
///     .with("action", action)?
///     .with("loc", old_loc)?
///     .with("scale", Tensor::ones([2, 1], (Kind::Double, tch::Device::Cpu)))?
///     .with("action_log_prob", old_lp)?
///     .with("advantage", Tensor::zeros([2, 1], (Kind::Double, tch::Device::Cpu)))?;
/// let out = loss.forward(&td)?;
/// // zero advantage: loss_objective = β·mean(kl) with β = 1
/// assert!((out.loss_objective.double_value(&[]) - 0.045).abs() < 1e-12);
/// assert_eq!(out.kl.size(), vec![2, 1, 1]);
/// assert_eq!(out.beta, 1.0);
/// // mean(kl) = 0.045 > 1.5 · dtarg (0.01): β doubles for the next call
/// assert_eq!(loss.beta(), 2.0);
/// out.total_loss()?.backward();
/// assert!(w.grad().abs().double_value(&[0]) > 0.0);
/// loss.reset();
/// assert_eq!(loss.beta(), 1.0);
/// # Ok(()) }
/// ```
pub struct KLPENPPOLoss {
    base: PpoBase,
    dtarg: f64,
    beta_init: f64,
    /// `β` as `f64` bits.
    beta: AtomicU64,
    increment: f64,
    decrement: f64,
    samples_mc_kl: i64,
}

impl fmt::Debug for KLPENPPOLoss {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct(KLPEN_NAME);
        self.base.debug_fields(&mut d);
        d.field("dtarg", &self.dtarg)
            .field("beta", &self.beta())
            .field("increment", &self.increment)
            .field("decrement", &self.decrement)
            .field("samples_mc_kl", &self.samples_mc_kl)
            .finish_non_exhaustive()
    }
}

impl KLPENPPOLoss {
    ppo_constructors!(
        "A loss with an actor and a critic, with TorchRL's defaults: `dtarg = 0.01`, \
         `beta = 1.0`, `increment = 2.0`, `decrement = 0.5`, `samples_mc_kl = 1`, and the \
         shared PPO defaults of [`ClipPPOLoss::new`]."
    );

    fn build(actor: ProbabilisticActor, critic: Option<Box<dyn TensorDictModule>>) -> Self {
        KLPENPPOLoss {
            base: PpoBase::new(KLPEN_NAME, actor, critic, true),
            dtarg: 0.01,
            beta_init: 1.0,
            beta: AtomicU64::new(1.0f64.to_bits()),
            increment: 2.0,
            decrement: 0.5,
            samples_mc_kl: 1,
        }
    }

    /// The target KL (TorchRL's `dtarg`, default 0.01). Errors when negative or not finite.
    pub fn with_dtarg(mut self, dtarg: f64) -> Result<Self> {
        self.dtarg = self.base.check_coeff("dtarg", dtarg)?;
        Ok(self)
    }

    /// The initial KL coefficient β (default 1.0); also the value [`reset`](Self::reset)
    /// restores. Errors when negative or not finite.
    pub fn with_beta(mut self, beta: f64) -> Result<Self> {
        self.beta_init = self.base.check_coeff("beta", beta)?;
        self.beta = AtomicU64::new(self.beta_init.to_bits());
        Ok(self)
    }

    /// The factor β is multiplied by when the KL exceeds `1.5·dtarg` (default 2.0). Errors
    /// unless finite and `>= 1` (TorchRL: "increment should be >= 1.0").
    pub fn with_increment(mut self, increment: f64) -> Result<Self> {
        if !increment.is_finite() || increment < 1.0 {
            return Err(self.base.bad(format!(
                "increment should be >= 1.0 in KLPENPPOLoss, got {increment:.4}"
            )));
        }
        self.increment = increment;
        Ok(self)
    }

    /// The factor β is multiplied by when the KL is below `dtarg/1.5` (default 0.5). Errors
    /// unless in `[0, 1]` (TorchRL: "decrement should be <= 1.0").
    pub fn with_decrement(mut self, decrement: f64) -> Result<Self> {
        if decrement.is_nan() || !(0.0..=1.0).contains(&decrement) {
            return Err(self.base.bad(format!(
                "decrement should be <= 1.0 (and >= 0) in KLPENPPOLoss, got {decrement:.4}"
            )));
        }
        self.decrement = decrement;
        Ok(self)
    }

    /// The number of draws of the Monte-Carlo KL estimate, used when the distribution pair has
    /// no closed form (default 1). Errors when `< 1`.
    pub fn with_samples_mc_kl(mut self, n: i64) -> Result<Self> {
        if n < 1 {
            return Err(self
                .base
                .bad(format!("samples_mc_kl must be >= 1, got {n}")));
        }
        self.samples_mc_kl = n;
        Ok(self)
    }

    ppo_shared_methods!();

    /// The current KL coefficient β (the one the next forward uses).
    pub fn beta(&self) -> f64 {
        f64::from_bits(self.beta.load(Ordering::Relaxed))
    }

    /// Restores β to its initial value (TorchRL's `reset`).
    pub fn reset(&self) {
        self.beta.store(self.beta_init.to_bits(), Ordering::Relaxed);
    }

    /// The target KL.
    pub fn dtarg(&self) -> f64 {
        self.dtarg
    }

    /// TorchRL's `out_keys`.
    pub fn out_keys(&self) -> Vec<&'static str> {
        self.base.out_keys(vec!["loss_objective", "kl"])
    }

    /// `β`'s update after a forward whose mean KL is `kl`.
    fn adapt_beta(&self, kl: f64) {
        let factor = if kl > self.dtarg * 1.5 {
            self.increment
        } else if kl < self.dtarg / 1.5 {
            self.decrement
        } else {
            return;
        };
        self.beta
            .store((self.beta() * factor).to_bits(), Ordering::Relaxed);
    }

    /// `KL(previous ‖ current)`, `[*B]` (or `[*B, A]`): closed form or Monte-Carlo.
    fn kl(&self, previous: &dyn Distribution, current: &dyn Distribution) -> Result<Tensor> {
        if let Some(kl) = kl_divergence(previous, current)? {
            return Ok(kl);
        }
        let (x, previous_lp) = {
            let mut gen = self.base.lock_gen()?;
            let x = previous.sample(&mut gen, &[self.samples_mc_kl])?;
            (x.shallow_clone(), previous.log_prob(&x)?)
        };
        let current_lp = current.log_prob(&x)?;
        Ok(previous_lp
            .f_sub(&current_lp)?
            .f_mean_dim([0i64].as_slice(), false, None::<Kind>)?)
    }

    /// TorchRL's `build_dist_from_params`: the behaviour policy from the stored parameters.
    fn previous_dist(&self, td: &TensorDict) -> Result<Box<dyn Distribution>> {
        let builder = self.base.actor.builder();
        if let Some(missing) = builder.in_keys().iter().find(|k| td.get(*k).is_none()) {
            return Err(self.base.bad(format!(
                "The parameters of the distribution were not found ({missing} is missing; the \
                 distribution reads [{}]). Make sure they are provided to KLPENPPOLoss.",
                builder
                    .in_keys()
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        builder.build(td)
    }
}

impl LossModule for KLPENPPOLoss {
    type Output = KlPenPpoLossOutput;

    ppo_loss_module_keys!();

    fn forward(&self, td: &TensorDict) -> Result<KlPenPpoLossOutput> {
        let b = &self.base;
        let previous = self.previous_dist(td)?;
        let p = b.prepare(td)?;
        let (td, advantage, log_weight, dist) = (p.td, p.advantage, p.log_weight, p.dist);

        let kl = self.kl(previous.as_ref(), dist.as_ref())?.f_unsqueeze(-1)?;
        let beta = self.beta();
        let neg_loss = log_weight
            .f_exp()?
            .f_mul(&advantage)?
            .f_sub(&kl.f_mul_scalar(beta)?)?;
        let kl = kl.f_detach()?;
        self.adapt_beta(kl.f_mean(None)?.f_double_value(&[])?);
        let loss_objective = b.reduce(&neg_loss.f_neg()?)?;
        let kl_approx = p.kl_approx.f_detach()?.f_mean(None)?;

        let (loss_entropy, entropy) = b.entropy_terms(dist.as_ref())?;
        let (loss_critic, value_clip_fraction, explained_variance) = b.critic_terms(&td)?;

        Ok(KlPenPpoLossOutput {
            loss_objective,
            loss_entropy,
            loss_critic,
            kl,
            kl_approx,
            entropy,
            value_clip_fraction,
            explained_variance,
            beta,
        })
    }
}
