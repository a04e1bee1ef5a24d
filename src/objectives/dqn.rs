//! The DQN loss: [`DQNLoss`] (TorchRL's `DQNLoss`), with a target network (`delay_value`),
//! double DQN, L2 / smooth-L1 / L1 distances and one-hot or categorical actions.
//!
//! ```
//! use tch::{nn, Device, Kind, Tensor};
//! use torchrl::modules::{ActionSpace, QValueActor, TdModule};
//! use torchrl::objectives::{DQNConfig, DQNLoss, LossModule, SoftUpdate};
//! use torchrl::TensorDict;
//! # fn main() -> torchrl::Result<()> {
//! let vs = nn::VarStore::new(Device::Cpu);
//! let q = |p: &nn::Path| {
//!     let lin = nn::linear(p / "q", 3, 2, Default::default());
//!     QValueActor::new(TdModule::new(lin, ["observation"], ["action_value"])?, ActionSpace::Categorical)
//! };
//! let mut loss = DQNLoss::new(&vs.root(), q, DQNConfig::new(ActionSpace::Categorical))?;
//! loss.make_value_estimator(torchrl::objectives::ValueEstimators::TD0, 0.9)?;
//! let f = (Kind::Float, Device::Cpu);
//! let td = TensorDict::new([4])?
//!     .with("observation", Tensor::randn([4, 3], f))?
//!     .with("action", Tensor::from_slice(&[0i64, 1, 1, 0]))?
//!     .with(("next", "observation"), Tensor::randn([4, 3], f))?
//!     .with(("next", "reward"), Tensor::ones([4, 1], f))?
//!     .with(("next", "done"), Tensor::zeros([4, 1], (Kind::Bool, Device::Cpu)))?
//!     .with(("next", "terminated"), Tensor::zeros([4, 1], (Kind::Bool, Device::Cpu)))?;
//! let out = loss.forward(&td)?;
//! assert_eq!(out.loss.size(), Vec::<i64>::new());
//! assert_eq!(out.td_error.size(), vec![4, 1]);
//! let mut updater = SoftUpdate::new(&loss, None, Some(0.005))?; // the target network
//! updater.step()?;
//! # Ok(()) }
//! ```

use std::fmt;

use tch::nn;
use tch::Tensor;

use super::common::{LossModule, LossOutput, Reduction};
use super::off_policy::{
    boxed, estimate_with_next, forward_keys, next_td, priority_weights, push_unique, read, reduce,
    BoxedEstimator, DynModule, ValueEstimators, DEFAULT_GAMMA,
};
use super::ppo::CriticLossType;
use super::target::{TargetNetworks, TargetParams, WithTarget};
use crate::error::{Error, Result};
use crate::modules::{ActionSpace, TensorDictModule};
use crate::tensordict::{NestedKey, TensorDict};

crate::accepted_keys! {
    /// The keys of [`DQNLoss`] (TorchRL's `DQNLoss._AcceptedKeys`).
    pub struct DQNKeys {
        /// Forwarded to the value estimator. Defaults to `"advantage"`.
        advantage: "advantage",
        /// Forwarded to the value estimator. Defaults to `"value_target"`.
        value_target: "value_target",
        /// The chosen action's value (the estimator's value key). Defaults to
        /// `"chosen_action_value"`.
        value: "chosen_action_value",
        /// The Q-values of every action, `[*B, n]`. Defaults to `"action_value"`.
        action_value: "action_value",
        /// The action taken. Defaults to `"action"`.
        action: "action",
        /// Where TorchRL writes the priority (here: [`DQNLossOutput::td_error`]). Defaults
        /// to `"td_error"`.
        priority: "td_error",
        /// The reward, under `"next"`. Defaults to `"reward"`.
        reward: "reward",
        /// The done flag, under `"next"`. Defaults to `"done"`.
        done: "done",
        /// The terminated flag, under `"next"`. Defaults to `"terminated"`.
        terminated: "terminated",
        /// Importance weights of a prioritized replay buffer, used when present. Defaults to
        /// `"priority_weight"`.
        priority_weight: "priority_weight",
    }
}

/// The options of [`DQNLoss`], TorchRL's defaults in [`DQNConfig::new`].
#[derive(Clone, Debug, PartialEq)]
pub struct DQNConfig {
    /// How actions are written (one-hot or categorical).
    pub action_space: ActionSpace,
    /// The distance between the predicted and target values (default L2).
    pub loss_function: CriticLossType,
    /// Whether a target network is made (default `true`).
    pub delay_value: bool,
    /// Double DQN: the online network picks the next action, the target scores it (default
    /// `false`; requires `delay_value`).
    pub double_dqn: bool,
    /// The reduction of the loss (default mean).
    pub reduction: Reduction,
}

impl DQNConfig {
    /// TorchRL's defaults: L2, `delay_value = true`, no double DQN, mean.
    pub fn new(action_space: ActionSpace) -> Self {
        DQNConfig {
            action_space,
            loss_function: CriticLossType::L2,
            delay_value: true,
            double_dqn: false,
            reduction: Reduction::Mean,
        }
    }

    crate::macros::setters! {
        /// Sets `loss_function`.
        with_loss_function(loss_function: CriticLossType);
        /// Sets `delay_value`.
        with_delay_value(delay_value: bool);
        /// Sets `double_dqn`.
        with_double_dqn(double_dqn: bool);
        /// Sets `reduction`.
        with_reduction(reduction: Reduction);
    }
}

/// What [`DQNLoss::forward`] returns (TorchRL's output key `"loss"`), plus the per-sample
/// priority TorchRL writes into the input under `"td_error"`.
#[derive(Debug)]
pub struct DQNLossOutput {
    /// The reduced distance between `Q(s, a)` and its target.
    pub loss: Tensor,
    /// `(Q(s, a) - target)²`, detached, `[*B, 1]` (for a prioritized replay buffer).
    pub td_error: Tensor,
}

impl LossOutput for DQNLossOutput {
    fn loss_terms(&self) -> Vec<(&'static str, &Tensor)> {
        vec![("loss", &self.loss)]
    }
}

/// The DQN loss (TorchRL's `DQNLoss`).
///
/// - `Q(s, a)`: the value network's `action_value` at the taken action (a gather for
///   categorical actions, `Σ Q·a` for one-hot ones);
/// - the next value: the target network's `chosen_action_value` (its greedy value) on
///   `"next"`, or with double DQN the target's Q-value at the online network's greedy action;
///   without a target network the online network is used, without gradients;
/// - `target = value_estimate(...)` (TD(0) with `γ = 0.99` by default:
///   [`make_value_estimator`](Self::make_value_estimator));
/// - `loss = reduce(distance(Q(s, a), target))`, weighted by `"priority_weight"` when present.
///
/// The value network is built from a builder (once under the caller's path, once more for the
/// target copy: [`WithTarget`]); it must write `action_value`, and, for the plain target, the
/// chosen action's value (a [`QValueActor`](crate::modules::QValueActor) does both).
///
/// # Shapes
/// A `[*B]` tensordict: action `[*B, n]` (one-hot) or `[*B]` / `[*B, 1]` (categorical); the
/// loss is 0-dim (or `[*B]` unreduced); `td_error` is `[*B, 1]`.
#[allow(clippy::upper_case_acronyms)]
pub struct DQNLoss {
    value_network: WithTarget<DynModule>,
    config: DQNConfig,
    keys: DQNKeys,
    in_keys: Vec<NestedKey>,
    estimator: BoxedEstimator,
}

impl fmt::Debug for DQNLoss {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DQNLoss")
            .field("config", &self.config)
            .field("keys", &self.keys)
            .finish_non_exhaustive()
    }
}

impl DQNLoss {
    /// Builds the value network (and its target copy when `delay_value`) with `build`.
    ///
    /// Errors when `double_dqn` is set without `delay_value` (TorchRL's rule) and when the
    /// builder fails.
    pub fn new<M, F>(path: &nn::Path<'_>, build: F, config: DQNConfig) -> Result<Self>
    where
        M: TensorDictModule + 'static,
        F: Fn(&nn::Path<'_>) -> Result<M>,
    {
        if config.double_dqn && !config.delay_value {
            return Err(Error::config(
                "DQNLoss",
                "double_dqn",
                "delay_value = true (double_dqn=True requires delay_value=True)",
                "delay_value = false",
            ));
        }
        let value_network = WithTarget::new(path, config.delay_value, boxed(build))?;
        let mut loss = DQNLoss {
            value_network,
            config,
            keys: DQNKeys::default(),
            in_keys: Vec::new(),
            estimator: ValueEstimators::TD0.build(DEFAULT_GAMMA)?,
        };
        loss.set_tensor_keys(DQNKeys::default())?;
        Ok(loss)
    }

    /// Replaces the value estimator (TorchRL's `make_value_estimator(value_type, gamma=…)`);
    /// the loss's keys are forwarded to it.
    pub fn make_value_estimator(&mut self, value_type: ValueEstimators, gamma: f64) -> Result<()> {
        self.set_value_estimator(value_type.build(gamma)?)
    }

    /// Uses `estimator` (TorchRL's `make_value_estimator(instance)`); the loss's keys are
    /// forwarded to it.
    pub fn set_value_estimator(&mut self, mut estimator: BoxedEstimator) -> Result<()> {
        let k = &self.keys;
        forward_keys(
            estimator.as_mut(),
            &k.value,
            &k.reward,
            &k.done,
            &k.terminated,
        )?;
        self.estimator = estimator;
        Ok(())
    }

    /// The value estimator.
    pub fn value_estimator(&self) -> &dyn super::value::ValueEstimator {
        self.estimator.as_ref()
    }

    /// The value network (online and target).
    pub fn value_network(&self) -> &WithTarget<DynModule> {
        &self.value_network
    }

    /// The options.
    pub fn config(&self) -> &DQNConfig {
        &self.config
    }

    /// `Q(s, a)` at the taken action, `[*B]`.
    fn chosen(&self, values: &Tensor, action: &Tensor) -> Result<Tensor> {
        let v = self.config.action_space.chosen_value(values, action)?;
        Ok(v.f_squeeze_dim(-1)?)
    }
}

impl LossModule for DQNLoss {
    type Keys = DQNKeys;
    type Output = DQNLossOutput;

    fn name(&self) -> &'static str {
        "DQNLoss"
    }

    fn tensor_keys(&self) -> &DQNKeys {
        &self.keys
    }

    fn set_tensor_keys(&mut self, keys: DQNKeys) -> Result<()> {
        forward_keys(
            self.estimator.as_mut(),
            &keys.value,
            &keys.reward,
            &keys.done,
            &keys.terminated,
        )?;
        let mut in_keys = vec![keys.action.clone()];
        for k in [&keys.reward, &keys.done, &keys.terminated] {
            push_unique(&mut in_keys, k.prefixed("next"));
        }
        let net_keys = self.value_network.online().in_keys();
        for k in &net_keys {
            push_unique(&mut in_keys, k.clone());
        }
        for k in &net_keys {
            push_unique(&mut in_keys, k.prefixed("next"));
        }
        self.in_keys = in_keys;
        self.keys = keys;
        Ok(())
    }

    fn in_keys(&self) -> &[NestedKey] {
        &self.in_keys
    }

    fn forward(&self, td: &TensorDict) -> Result<DQNLossOutput> {
        let op = "DQNLoss";
        let k = &self.keys;
        let out = self.value_network.online().forward(td.clone())?;
        let pred_all = read(op, &out, &k.action_value)?;
        let action = read(op, td, &k.action)?;
        let pred = self.chosen(&pred_all, &action)?;

        let next_value = {
            let _guard = tch::no_grad_guard();
            let next = next_td(op, td)?;
            if self.config.double_dqn {
                let online_next = self.value_network.online().forward(next.clone())?;
                let next_action = read(op, &online_next, &k.action)?;
                let target_next = self.value_network.target_or_online().forward(next)?;
                let next_av = read(op, &target_next, &k.action_value)?;
                self.config
                    .action_space
                    .chosen_value(&next_av, &next_action)?
            } else {
                let target_next = self.value_network.target_or_online().forward(next)?;
                read(op, &target_next, &k.value)?
            }
        };
        let target = estimate_with_next(self.estimator.as_ref(), td, next_value)?;
        let target = super::off_policy::squeeze_last(&target)?;
        let td_error = {
            let _guard = tch::no_grad_guard();
            pred.f_sub(&target)?
                .f_pow_tensor_scalar(2)?
                .f_unsqueeze(-1)?
        };
        let dist = self.config.loss_function.distance(op, &target, &pred)?;
        let w = priority_weights(td, &k.priority_weight);
        let loss = reduce(op, self.config.reduction, &dist, w.as_ref())?;
        Ok(DQNLossOutput { loss, td_error })
    }
}

impl TargetNetworks for DQNLoss {
    fn target_params(&self) -> Vec<&TargetParams> {
        self.value_network.target_params().into_iter().collect()
    }
}
