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
//! Both are one generic loss, [`PpoLoss`], over a [`PpoObjective`] ([`Clip`], [`KlPen`]); every
//! setting is a field of [`PpoConfig`] (`loss.with_config(PpoConfig::new().with_*(..))?`, or
//! the loss's own `with_*` builders), checked when the loss takes it. The loss draws its
//! Monte-Carlo noise from its own generator ([`PpoConfig::seed`]), or from one passed to
//! [`PpoLoss::forward_with_generator`]. Built from an
//! [`ActorValueOperator`]
//! ([`PpoLoss::from_actor_value`]), the loss runs the shared trunk once per forward.
//!
//! When the advantage is absent, the loss's value estimator (set with
//! [`PpoLoss::make_value_estimator`], default GAE with γ=0.99, λ=0.95) computes it on a
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

mod a2c;
mod clip;
mod common;
mod config;
mod kl_pen;
mod reinforce;

use std::cell::{Ref, RefCell};
use std::fmt;
use std::str::FromStr;

use tch::Tensor;

use crate::error::{Error, Result, ShapeFmt};
use crate::modules::actors::ProbabilisticActor;
use crate::modules::module::TensorDictModule;
use crate::modules::value_norm::ValueNorm;
use crate::modules::ActorValueOperator;
use crate::objectives::common::{parse_named, LossModule, LossOutput, Reduction};
use crate::objectives::target::{TargetNetworks, TargetParams};
use crate::objectives::value::ValueEstimator;
use crate::rng::Generator;
use crate::tensordict::{NestedKey, TensorDict};

pub use a2c::{A2CLoss, A2CLossOutput, A2c};
pub use clip::{Clip, ClipPPOLoss, PpoLossOutput};
pub use common::PpoCommon;
pub use config::PpoConfig;
pub use kl_pen::{KLPENPPOLoss, KlPen, KlPenPpoLossOutput};
pub use reinforce::{Reinforce, ReinforceLoss, ReinforceLossOutput};

use common::TrunkDone;

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
    pub(crate) fn distance(
        self,
        op: &'static str,
        target: &Tensor,
        value: &Tensor,
    ) -> Result<Tensor> {
        let (ts, vs) = (target.size(), value.size());
        if ts != vs {
            return Err(Error::InvalidValue {
                op,
                what: "values",
                key: "value target, critic's value".to_string(),
                expected: "shapes that match".to_string(),
                got: format!(
                    "shapes {} and {}, which are incompatible",
                    ShapeFmt(&ts),
                    ShapeFmt(&vs)
                ),
            });
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
        let table = [
            ("smooth_l1", CriticLossType::SmoothL1),
            ("l2", CriticLossType::L2),
            ("l1", CriticLossType::L1),
        ];
        parse_named("loss_critic_type", "Unknown loss", s, &table)
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

/// The `loss_*` terms of every PPO output: the objective, then the entropy and critic terms
/// when present.
fn ppo_loss_terms<'a>(
    objective: &'a Tensor,
    entropy: &'a Option<Tensor>,
    critic: &'a Option<Tensor>,
) -> Vec<(&'static str, &'a Tensor)> {
    let optional = [("loss_entropy", entropy), ("loss_critic", critic)];
    named_some(vec![("loss_objective", objective)], optional)
}

/// `head`, then the metrics every PPO output may have: `entropy`, `value_clip_fraction`,
/// `explained_variance` (when present).
fn ppo_metrics<'a>(
    head: Vec<(&'static str, &'a Tensor)>,
    [entropy, value_clip, explained]: [&'a Option<Tensor>; 3],
) -> Vec<(&'static str, &'a Tensor)> {
    let optional = [
        ("entropy", entropy),
        ("value_clip_fraction", value_clip),
        ("explained_variance", explained),
    ];
    named_some(head, optional)
}

/// The part of a PPO loss that differs between the clipped and the KL-penalty variants: its
/// name, its own settings and state, and its objective. [`PpoLoss`] does the rest.
///
/// Sealed: implemented by [`Clip`], [`KlPen`], [`A2c`] and [`Reinforce`] only (the shared terms they compute with are
/// crate-private).
pub trait PpoObjective: Send + sealed::Sealed {
    /// The typed output of the loss.
    type Output: LossOutput;
    /// The loss's name (`"ClipPPOLoss"`), used in errors.
    const NAME: &'static str;
    /// Whether the loss reads the behaviour policy's distribution parameters from the data
    /// (they become in keys).
    const READS_DIST_PARAMS: bool;
    /// Whether the loss reads the behaviour policy's log-prob (`sample_log_prob`, an in key):
    /// the PPO losses do, the on-policy A2C and REINFORCE do not.
    const READS_SAMPLE_LOG_PROB: bool = true;
    /// Whether TorchRL's loss takes an `advantage_norm` (the PPO losses and A2C do,
    /// REINFORCE does not).
    const TAKES_ADVANTAGE_NORM: bool = true;

    /// The loss's defaults (TorchRL's constructor defaults for it).
    fn default_config() -> PpoConfig {
        PpoConfig::default()
    }

    /// The objective's state for `config` (already validated).
    fn from_config(config: &PpoConfig) -> Self;

    /// Checks the fields of `config` this loss reads.
    fn validate(config: &PpoConfig) -> Result<()>;

    /// Carries the state of `previous` (the objective before a config change) over to `self`,
    /// built from the new config. The default keeps nothing.
    fn keep_state(&mut self, _previous: &Self) {}

    /// TorchRL's `out_keys` of the loss (build the shared part with
    /// [`PpoCommon::out_keys`]).
    fn out_keys(&self, common: &PpoCommon) -> Vec<&'static str>;

    /// Computes the loss on `td` with noise from `gen`.
    fn forward(
        &self,
        common: &PpoCommon,
        td: &TensorDict,
        gen: &mut Generator,
    ) -> Result<Self::Output>;
}

mod sealed {
    /// Keeps [`PpoObjective`](super::PpoObjective) to this crate's objectives.
    pub trait Sealed {}
    impl Sealed for super::Clip {}
    impl Sealed for super::KlPen {}
    impl Sealed for super::A2c {}
    impl Sealed for super::Reinforce {}
}

/// A PPO loss: the networks and settings every variant shares ([`PpoCommon`]) plus the
/// variant's objective `O`. Use the aliases [`ClipPPOLoss`], [`KLPENPPOLoss`], [`A2CLoss`]
/// and [`ReinforceLoss`].
pub struct PpoLoss<O: PpoObjective> {
    common: PpoCommon,
    objective: O,
}

impl<O: PpoObjective + fmt::Debug> fmt::Debug for PpoLoss<O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct(O::NAME);
        self.common.debug_fields(&mut d);
        d.field("objective", &self.objective)
            .finish_non_exhaustive()
    }
}

impl<O: PpoObjective> PpoLoss<O> {
    fn build(
        actor: ProbabilisticActor,
        critic: Option<Box<dyn TensorDictModule>>,
        trunk: Option<Box<dyn TensorDictModule>>,
    ) -> Self {
        let common = PpoCommon::new(
            O::NAME,
            actor,
            critic,
            trunk,
            O::READS_DIST_PARAMS,
            O::READS_SAMPLE_LOG_PROB,
            O::default_config(),
        );
        let objective = O::from_config(&common.config);
        PpoLoss { common, objective }
    }

    /// A loss with an actor and a critic (any module writing `state_value`), with TorchRL's
    /// defaults ([`PpoConfig::default`]). The `action` and `sample_log_prob` keys are taken
    /// from the actor.
    pub fn new(actor: ProbabilisticActor, critic: impl TensorDictModule + 'static) -> Self {
        Self::build(actor, Some(Box::new(critic)), None)
    }

    /// A loss without a critic: no `loss_critic`, and the advantage must be in the input.
    pub fn without_critic(actor: ProbabilisticActor) -> Self {
        Self::build(actor, None, None)
    }

    /// A loss over an actor-critic with a shared trunk: every forward runs the trunk once,
    /// then the policy head (for the log-weight and the entropy) and the value head (for the
    /// critic loss, and the estimator when the advantage is absent) on its output.
    pub fn from_actor_value(operator: ActorValueOperator) -> Self {
        let (trunk, policy, value) = operator.into_parts();
        Self::build(policy, Some(value), Some(trunk))
    }

    /// Takes every setting of `config`; errors ([`Error::InvalidConfig`], naming the field)
    /// when a field this loss reads is out of range, and then nothing changes.
    pub fn with_config(mut self, config: PpoConfig) -> Result<Self> {
        O::validate(&config)?;
        let mut objective = O::from_config(&config);
        objective.keep_state(&self.objective);
        self.objective = objective;
        self.common.set_config(config);
        Ok(self)
    }

    /// Applies `edit` to a copy of the config, validates it and takes it.
    fn edit(self, edit: impl FnOnce(&mut PpoConfig)) -> Result<Self> {
        let mut config = self.common.config.clone();
        edit(&mut config);
        self.with_config(config)
    }

    /// The settings.
    pub fn config(&self) -> &PpoConfig {
        &self.common.config
    }

    /// Whether the entropy bonus is added (default `true`).
    pub fn with_entropy_bonus(mut self, entropy_bonus: bool) -> Self {
        self.common.config.entropy_bonus = entropy_bonus;
        self
    }

    /// The entropy coefficient (TorchRL's `entropy_coeff`, default 0.01). Errors when
    /// negative or not finite.
    pub fn with_entropy_coeff(self, coeff: f64) -> Result<Self> {
        self.edit(|c| c.entropy_coeff = coeff)
    }

    /// The number of samples of the Monte-Carlo entropy estimate (default 1). Errors when
    /// `< 1`.
    pub fn with_samples_mc_entropy(self, n: i64) -> Result<Self> {
        self.edit(|c| c.samples_mc_entropy = n)
    }

    /// Reseeds the loss's generator of the Monte-Carlo estimates (default seed 0).
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.common.reseed(seed);
        self
    }

    /// The critic coefficient (TorchRL's `critic_coeff`, default 1.0); `0` disables the
    /// critic loss. Errors when negative or not finite.
    pub fn with_critic_coeff(self, coeff: f64) -> Result<Self> {
        self.edit(|c| c.critic_coeff = coeff)
    }

    /// The critic's distance (default [`CriticLossType::SmoothL1`]).
    pub fn with_loss_critic_type(mut self, t: CriticLossType) -> Self {
        self.common.config.loss_critic_type = t;
        self
    }

    /// Clips the value prediction to `old_value ± clip_value` and keeps the larger of the
    /// clipped and unclipped losses (`None`, the default, disables it). TorchRL's
    /// `clip_value=True` is `with_clip_value(Some(clip_epsilon))`. Errors unless positive
    /// and finite.
    pub fn with_clip_value(self, clip_value: Option<f64>) -> Result<Self> {
        self.edit(|c| c.clip_value = clip_value)
    }

    /// TorchRL's `advantage_norm`: a running normaliser of the value targets (e.g.
    /// [`PercentileValueNorm`](crate::modules::PercentileValueNorm), DreamerV3's return
    /// scaling) whose [`scale`](ValueNorm::scale) divides the advantage, without re-centring
    /// it. When the loss estimates the advantage itself (the input has none), it first folds
    /// that batch's value target into the normaliser; an advantage read from the input is
    /// only rescaled. Errors when the loss does not take one (REINFORCE), and at `forward`
    /// when `normalize_advantage` is also on (TorchRL: mutually exclusive).
    ///
    /// ```
    /// use tch::Tensor;
    /// use torchrl::modules::{from_fn, DistributionBuilder, ProbabilisticActor, RunningValueNorm, ValueNorm};
    /// use torchrl::objectives::{A2CLoss, LossModule};
    /// use torchrl::TensorDict;
    /// # fn main() -> torchrl::Result<()> {
    /// let net = from_fn(["observation"], ["loc", "scale"], |x: &[&Tensor]| {
    ///     Ok(vec![x[0].f_zeros_like()?, x[0].f_ones_like()?])
    /// })?;
    /// let actor = ProbabilisticActor::new(net, DistributionBuilder::normal("loc", "scale")?);
    /// let critic = from_fn(["observation"], ["state_value"], |x: &[&Tensor]| {
    ///     Ok(vec![x[0].f_zeros_like()?])
    /// })?;
    /// let mut norm = RunningValueNorm::new().with_kind(tch::Kind::Double)?;
    /// // returns seen so far: 0 and 4 (population std 2)
    /// norm.update(&Tensor::from_slice(&[0.0f64, 4.0]).view([2, 1]))?;
    /// let loss = A2CLoss::new(actor, critic)
    ///     .with_entropy_bonus(false)
    ///     .with_advantage_norm(norm)?;
    /// let td = TensorDict::new([1])?
    ///     .with("observation", Tensor::from_slice(&[0.3f64]).view([1, 1]))?
    ///     .with("action", Tensor::from_slice(&[0.0f64]).view([1, 1]))?
    ///     .with("advantage", Tensor::from_slice(&[2.0f64]).view([1, 1]))?
    ///     .with("value_target", Tensor::from_slice(&[3.0f64]).view([1, 1]))?;
    /// let out = loss.forward(&td)?;
    /// // the advantage 2 is divided by the scale 2: -log N(0; 0, 1) · 1 = ½ ln 2π
    /// let expected = 0.5 * (2.0 * std::f64::consts::PI).ln();
    /// assert!((out.loss_objective.double_value(&[]) - expected).abs() < 1e-12);
    /// // an advantage read from the input leaves the statistics alone
    /// let norm = loss.advantage_norm().expect("set");
    /// assert_eq!(norm.state()[2].1.double_value(&[]), 2.0); // count
    /// # Ok(()) }
    /// ```
    pub fn with_advantage_norm(mut self, norm: impl ValueNorm + 'static) -> Result<Self> {
        if !O::TAKES_ADVANTAGE_NORM {
            return Err(Error::config(
                O::NAME,
                "advantage_norm",
                format!("none ({}: TorchRL's loss has no advantage_norm)", O::NAME),
                norm.name(),
            ));
        }
        self.common.advantage_norm = Some(RefCell::new(Box::new(norm)));
        Ok(self)
    }

    /// The `advantage_norm`, if any (borrowed; do not hold it across a `forward`).
    pub fn advantage_norm(&self) -> Option<Ref<'_, Box<dyn ValueNorm>>> {
        self.common.advantage_norm.as_ref().map(RefCell::borrow)
    }

    /// Standardises the advantage before use (default `false`).
    pub fn with_normalize_advantage(mut self, normalize: bool) -> Self {
        self.common.config.normalize_advantage = normalize;
        self
    }

    /// Refuses non-finite inputs (default `false`): with it on, a NaN / ±Inf in the
    /// advantage, value target, stored log-prob, `("next", reward)` or value entries of the
    /// input (and in an advantage the estimator computes) is an error naming the key, not a
    /// NaN loss. See [`PpoConfig::check_finite`].
    pub fn with_check_finite(mut self, check_finite: bool) -> Self {
        self.common.config.check_finite = check_finite;
        self
    }

    /// The reduction of the `loss_*` terms (default [`Reduction::Mean`]).
    pub fn with_reduction(mut self, reduction: Reduction) -> Self {
        self.common.config.reduction = reduction;
        self
    }

    /// Sets the value estimator used when the advantage is absent, and forwards the loss's
    /// keys to it (`advantage`, `value_target`, `value`, `reward`, `done`, `terminated`,
    /// `sample_log_prob`). Without one, a default GAE (γ = 0.99, λ = 0.95) is used.
    pub fn make_value_estimator(
        &mut self,
        estimator: Box<dyn ValueEstimator + Send>,
    ) -> Result<()> {
        self.common.make_value_estimator(estimator)
    }

    /// The value estimator set with [`make_value_estimator`](Self::make_value_estimator).
    pub fn value_estimator(&self) -> Option<&(dyn ValueEstimator + Send)> {
        self.common.value_estimator.as_deref()
    }

    /// Computes the advantage on a whole batch in place (TorchRL's `loss.value_estimator(td)`):
    /// the critic's values (after the shared trunk, if any), under `no_grad`, under the
    /// `value` key at the root and in `"next"`, then the value estimator (default GAE,
    /// γ = 0.99, λ = 0.95) writes `advantage` and `value_target`. Run it on the collected
    /// `[*B, T]` batch before cutting it into minibatches. Errors without a critic or without
    /// `"next"`.
    pub fn compute_advantage(&self, td: &mut TensorDict) -> Result<()> {
        self.common.estimate_advantage(td, TrunkDone::No).map(drop)
    }

    /// [`forward`](LossModule::forward) with noise from `gen` instead of the loss's own
    /// generator (which does not move).
    pub fn forward_with_generator(
        &self,
        td: &TensorDict,
        gen: &mut Generator,
    ) -> Result<O::Output> {
        self.objective.forward(&self.common, td, gen)
    }

    /// The actor (with a shared trunk: the policy head, which reads the trunk's output).
    pub fn actor(&self) -> &ProbabilisticActor {
        &self.common.actor
    }

    /// The critic, if any (with a shared trunk: the value head).
    pub fn critic(&self) -> Option<&dyn TensorDictModule> {
        self.common.critic.as_deref()
    }

    /// The shared trunk, for a loss built with [`from_actor_value`](Self::from_actor_value).
    pub fn trunk(&self) -> Option<&dyn TensorDictModule> {
        self.common.trunk.as_deref()
    }

    /// A rollout policy: the trunk (if any) then the actor, under `no_grad`.
    pub fn as_policy(&self) -> impl FnMut(TensorDict) -> Result<TensorDict> + '_ {
        move |td| {
            let _guard = tch::no_grad_guard();
            self.common.actor.forward(self.common.run_trunk(td)?)
        }
    }

    /// The entropy coefficient.
    pub fn entropy_coeff(&self) -> f64 {
        self.common.config.entropy_coeff
    }

    /// The critic coefficient.
    pub fn critic_coeff(&self) -> f64 {
        self.common.config.critic_coeff
    }

    /// The value-clipping radius, if any.
    pub fn clip_value(&self) -> Option<f64> {
        self.common.config.clip_value
    }

    /// The reduction.
    pub fn reduction(&self) -> Reduction {
        self.common.config.reduction
    }

    /// TorchRL's `out_keys`.
    pub fn out_keys(&self) -> Vec<&'static str> {
        self.objective.out_keys(&self.common)
    }
}

impl<O: PpoObjective> LossModule for PpoLoss<O> {
    type Keys = PpoKeys;
    type Output = O::Output;

    fn name(&self) -> &'static str {
        O::NAME
    }

    fn tensor_keys(&self) -> &PpoKeys {
        &self.common.keys
    }

    fn set_tensor_keys(&mut self, keys: PpoKeys) -> Result<()> {
        self.common.set_tensor_keys(keys)
    }

    fn in_keys(&self) -> &[NestedKey] {
        &self.common.in_keys
    }

    /// Computes the loss, drawing Monte-Carlo noise (entropy, KL) from the loss's own
    /// generator.
    fn forward(&self, td: &TensorDict) -> Result<O::Output> {
        let mut gen = self.common.gen.try_borrow_mut().map_err(|_| {
            Error::invalid(
                O::NAME,
                "the loss's generator is in use (a re-entrant forward)",
            )
        })?;
        self.objective.forward(&self.common, td, &mut gen)
    }
}

impl<O: PpoObjective> TargetNetworks for PpoLoss<O> {
    /// The target critic's parameters ([`PpoLoss::with_target_critic`], REINFORCE's
    /// `delay_value`); none otherwise.
    fn target_params(&self) -> Vec<&TargetParams> {
        self.common
            .target_critic
            .iter()
            .map(|(_, params)| params)
            .collect()
    }
}
