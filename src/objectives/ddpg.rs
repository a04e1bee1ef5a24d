//! The DDPG loss: [`DDPGLoss`] (TorchRL's `DDPGLoss`): a deterministic actor trained to
//! maximise its critic, and a critic regressed to one-step targets from target copies.
//!
//! ```
//! use tch::{nn, Device, Kind, Tensor};
//! use torchrl::modules::{TdModule, TensorDictModule};
//! use torchrl::objectives::{DDPGConfig, DDPGLoss, LossModule, LossOutput};
//! use torchrl::TensorDict;
//! # fn main() -> torchrl::Result<()> {
//! let vs = nn::VarStore::new(Device::Cpu);
//! let actor = |p: &nn::Path| TdModule::new(nn::linear(p / "pi", 3, 1, Default::default()), ["observation"], ["action"]);
//! let critic = |p: &nn::Path| TdModule::new(nn::linear(p / "q", 4, 1, Default::default()), ["observation", "action"], ["state_action_value"]);
//! let loss = DDPGLoss::new(&vs.root(), actor, critic, DDPGConfig::new())?;
//! let f = (Kind::Float, Device::Cpu);
//! let td = TensorDict::new([5])?
//!     .with("observation", Tensor::randn([5, 3], f))?
//!     .with("action", Tensor::randn([5, 1], f))?
//!     .with(("next", "observation"), Tensor::randn([5, 3], f))?
//!     .with(("next", "reward"), Tensor::ones([5, 1], f))?
//!     .with(("next", "done"), Tensor::zeros([5, 1], (Kind::Bool, Device::Cpu)))?
//!     .with(("next", "terminated"), Tensor::zeros([5, 1], (Kind::Bool, Device::Cpu)))?;
//! let out = loss.forward(&td)?;
//! assert_eq!(out.loss_terms().len(), 2); // loss_actor, loss_value
//! assert_eq!(out.pred_value.size(), vec![5]);
//! # Ok(()) }
//! ```

use std::fmt;

use tch::nn;
use tch::Tensor;

use super::common::{LossModule, LossOutput, Reduction};
use super::off_policy::{
    boxed, estimate_with_next, forward_keys, next_td, priority_weights, push_unique, read, reduce,
    squeeze_last, BoxedEstimator, DynModule, ValueEstimators, DEFAULT_GAMMA,
};
use super::ppo::CriticLossType;
use super::target::{TargetNetworks, TargetParams, WithTarget};
use crate::error::Result;
use crate::modules::TensorDictModule;
use crate::tensordict::{NestedKey, TensorDict};

crate::accepted_keys! {
    /// The keys of [`DDPGLoss`] (TorchRL's `DDPGLoss._AcceptedKeys`).
    pub struct DDPGKeys {
        /// The critic's output `Q(s, a)`, `[*B, 1]` (the estimator's value key). Defaults to
        /// `"state_action_value"`.
        state_action_value: "state_action_value",
        /// Where TorchRL writes the priority (here: the output's `td_error`). Defaults to
        /// `"td_error"`.
        priority: "td_error",
        /// The reward, under `"next"`. Defaults to `"reward"`.
        reward: "reward",
        /// The done flag, under `"next"`. Defaults to `"done"`.
        done: "done",
        /// The terminated flag, under `"next"`. Defaults to `"terminated"`.
        terminated: "terminated",
        /// Importance weights, used when present. Defaults to `"priority_weight"`.
        priority_weight: "priority_weight",
    }
}

/// The options of [`DDPGLoss`], TorchRL's defaults in [`DDPGConfig::new`].
#[derive(Clone, Debug, PartialEq)]
pub struct DDPGConfig {
    /// The critic's distance (default L2).
    pub loss_function: CriticLossType,
    /// Whether the actor has a target copy (default `false`).
    pub delay_actor: bool,
    /// Whether the critic has a target copy (default `true`).
    pub delay_value: bool,
    /// The reduction (default mean).
    pub reduction: Reduction,
}

impl Default for DDPGConfig {
    fn default() -> Self {
        Self::new()
    }
}

impl DDPGConfig {
    /// TorchRL's defaults.
    pub fn new() -> Self {
        DDPGConfig {
            loss_function: CriticLossType::L2,
            delay_actor: false,
            delay_value: true,
            reduction: Reduction::Mean,
        }
    }

    crate::macros::setters! {
        /// Sets `loss_function`.
        with_loss_function(loss_function: CriticLossType);
        /// Sets `delay_actor`.
        with_delay_actor(delay_actor: bool);
        /// Sets `delay_value`.
        with_delay_value(delay_value: bool);
        /// Sets `reduction`.
        with_reduction(reduction: Reduction);
    }
}

/// What [`DDPGLoss::forward`] returns (TorchRL's keys).
#[derive(Debug)]
pub struct DDPGLossOutput {
    /// `-Q(s, μ(s))`, reduced (gradients reach the actor only).
    pub loss_actor: Tensor,
    /// `distance(Q(s, a), target)`, reduced.
    pub loss_value: Tensor,
    /// `Q(s, a)`, `[*B]`, detached.
    pub pred_value: Tensor,
    /// The targets, `[*B]`, detached.
    pub target_value: Tensor,
    /// `max Q(s, a)`.
    pub pred_value_max: Tensor,
    /// `max target`.
    pub target_value_max: Tensor,
    /// `(Q(s, a) - target)²`, `[*B]`, detached.
    pub td_error: Tensor,
}

impl LossOutput for DDPGLossOutput {
    fn loss_terms(&self) -> Vec<(&'static str, &Tensor)> {
        vec![
            ("loss_actor", &self.loss_actor),
            ("loss_value", &self.loss_value),
        ]
    }

    fn metrics(&self) -> Vec<(&'static str, &Tensor)> {
        vec![
            ("pred_value_max", &self.pred_value_max),
            ("target_value_max", &self.target_value_max),
        ]
    }
}

/// The DDPG loss (TorchRL's `DDPGLoss`).
///
/// - actor: `loss_actor = reduce(-Q(s, μ(s)))`, the critic's parameters held out of the graph;
/// - critic: `target = value_estimate(Q'(s', μ'(s')))` (TD(0), `γ = 0.99` by default) with the
///   target actor μ' (the online actor unless `delay_actor`) and target critic Q' (the
///   online critic unless `delay_value`), `loss_value = reduce(distance(Q(s, a), target))`.
///
/// The actor writes the action (`"action"`); the critic reads the observation and the action
/// and writes `"state_action_value"`.
#[allow(clippy::upper_case_acronyms)]
pub struct DDPGLoss {
    actor: WithTarget<DynModule>,
    value: WithTarget<DynModule>,
    config: DDPGConfig,
    keys: DDPGKeys,
    in_keys: Vec<NestedKey>,
    estimator: BoxedEstimator,
}

impl fmt::Debug for DDPGLoss {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DDPGLoss")
            .field("config", &self.config)
            .field("keys", &self.keys)
            .finish_non_exhaustive()
    }
}

impl DDPGLoss {
    /// Builds the actor and the critic under `path / "actor"` and `path / "value"` (and their
    /// target copies per the config).
    pub fn new<A, Q, FA, FQ>(
        path: &nn::Path<'_>,
        actor: FA,
        value: FQ,
        config: DDPGConfig,
    ) -> Result<Self>
    where
        A: TensorDictModule + 'static,
        Q: TensorDictModule + 'static,
        FA: Fn(&nn::Path<'_>) -> Result<A>,
        FQ: Fn(&nn::Path<'_>) -> Result<Q>,
    {
        let actor = WithTarget::new(&path.sub("actor"), config.delay_actor, boxed(actor))?;
        let value = WithTarget::new(&path.sub("value"), config.delay_value, boxed(value))?;
        let mut loss = DDPGLoss {
            actor,
            value,
            config,
            keys: DDPGKeys::default(),
            in_keys: Vec::new(),
            estimator: ValueEstimators::TD0.build(DEFAULT_GAMMA)?,
        };
        loss.set_tensor_keys(DDPGKeys::default())?;
        Ok(loss)
    }

    /// Replaces the value estimator (default TD(0), `γ = 0.99`).
    pub fn make_value_estimator(&mut self, value_type: ValueEstimators, gamma: f64) -> Result<()> {
        self.set_value_estimator(value_type.build(gamma)?)
    }

    /// Uses `estimator`; the loss's keys are forwarded to it.
    pub fn set_value_estimator(&mut self, mut estimator: BoxedEstimator) -> Result<()> {
        let k = &self.keys;
        forward_keys(
            estimator.as_mut(),
            &k.state_action_value,
            &k.reward,
            &k.done,
            &k.terminated,
        )?;
        self.estimator = estimator;
        Ok(())
    }

    /// The actor (online and target).
    pub fn actor(&self) -> &WithTarget<DynModule> {
        &self.actor
    }

    /// The critic (online and target).
    pub fn value_network(&self) -> &WithTarget<DynModule> {
        &self.value
    }
}

impl LossModule for DDPGLoss {
    type Keys = DDPGKeys;
    type Output = DDPGLossOutput;

    fn name(&self) -> &'static str {
        "DDPGLoss"
    }

    fn tensor_keys(&self) -> &DDPGKeys {
        &self.keys
    }

    fn set_tensor_keys(&mut self, keys: DDPGKeys) -> Result<()> {
        forward_keys(
            self.estimator.as_mut(),
            &keys.state_action_value,
            &keys.reward,
            &keys.done,
            &keys.terminated,
        )?;
        let mut in_keys = Vec::new();
        for k in [&keys.reward, &keys.done, &keys.terminated] {
            push_unique(&mut in_keys, k.prefixed("next"));
        }
        for k in self
            .actor
            .online()
            .in_keys()
            .into_iter()
            .chain(self.value.online().in_keys())
        {
            push_unique(&mut in_keys, k.prefixed("next"));
            push_unique(&mut in_keys, k);
        }
        self.in_keys = in_keys;
        self.keys = keys;
        Ok(())
    }

    fn in_keys(&self) -> &[NestedKey] {
        &self.in_keys
    }

    fn forward(&self, td: &TensorDict) -> Result<DDPGLossOutput> {
        let op = "DDPGLoss";
        let k = &self.keys;
        let w = priority_weights(td, &k.priority_weight);
        // actor: -Q(s, μ(s)), the critic held out of the graph
        let with_action = self.actor.online().forward(td.clone())?;
        let q_pi = self
            .value
            .frozen(|| self.value.online().forward(with_action))?;
        let q_pi = squeeze_last(&read(op, &q_pi, &k.state_action_value)?)?;
        let loss_actor = reduce(op, self.config.reduction, &q_pi.f_neg()?, w.as_ref())?;
        // critic
        let pred = self.value.online().forward(td.clone())?;
        let pred = squeeze_last(&read(op, &pred, &k.state_action_value)?)?;
        let next_value = {
            let _guard = tch::no_grad_guard();
            let next = self.actor.target_or_online().forward(next_td(op, td)?)?;
            let next = self.value.target_or_online().forward(next)?;
            read(op, &next, &k.state_action_value)?
        };
        let target = squeeze_last(&estimate_with_next(
            self.estimator.as_ref(),
            td,
            next_value,
        )?)?;
        let dist = self.config.loss_function.distance(op, &target, &pred)?;
        let loss_value = reduce(op, self.config.reduction, &dist, w.as_ref())?;
        let _guard = tch::no_grad_guard();
        let pred_d = pred.f_detach()?;
        let td_error = pred_d.f_sub(&target)?.f_pow_tensor_scalar(2)?;
        Ok(DDPGLossOutput {
            loss_actor,
            loss_value,
            pred_value_max: pred_d.f_max()?,
            target_value_max: target.f_max()?,
            pred_value: pred_d,
            target_value: target,
            td_error,
        })
    }
}

impl TargetNetworks for DDPGLoss {
    fn target_params(&self) -> Vec<&TargetParams> {
        self.actor
            .target_params()
            .into_iter()
            .chain(self.value.target_params())
            .collect()
    }
}
