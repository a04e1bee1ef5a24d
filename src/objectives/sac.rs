//! The soft actor-critic losses: [`SACLoss`] (TorchRL's `SACLoss`: version 2 by default,
//! version 1 with a state-value network) for continuous actions and [`DiscreteSACLoss`] (TorchRL's `DiscreteSACLoss`) for
//! discrete ones, with twin (or more) critics, their target copies, and an entropy
//! coefficient α that is learned towards a target entropy or fixed.
//!
//! ```
//! use tch::{nn, Device, Kind, Tensor};
//! use torchrl::modules::{DistributionBuilder, NormalParamExtractor, ProbabilisticActor, TdModule, TensorDictSequential};
//! use torchrl::objectives::{LossModule, SACConfig, SACLoss};
//! use torchrl::TensorDict;
//! # fn main() -> torchrl::Result<()> {
//! let vs = nn::VarStore::new(Device::Cpu);
//! let net = TensorDictSequential::new()
//!     .with(TdModule::new(nn::linear(vs.root() / "pi", 3, 2, Default::default()), ["observation"], ["param"])?)
//!     .with(NormalParamExtractor::new());
//! let actor = ProbabilisticActor::new(net, DistributionBuilder::tanh_normal("loc", "scale", -1.0, 1.0)?);
//! let critic = |p: &nn::Path| TdModule::new(nn::linear(p / "q", 4, 1, Default::default()), ["observation", "action"], ["state_action_value"]);
//! let loss = SACLoss::new(&vs.root(), actor, critic, SACConfig::new().with_action_dims(1))?;
//! let f = (Kind::Float, Device::Cpu);
//! let td = TensorDict::new([5])?
//!     .with("observation", Tensor::randn([5, 3], f))?
//!     .with("action", Tensor::rand([5, 1], f))?
//!     .with(("next", "observation"), Tensor::randn([5, 3], f))?
//!     .with(("next", "reward"), Tensor::ones([5, 1], f))?
//!     .with(("next", "done"), Tensor::zeros([5, 1], (Kind::Bool, Device::Cpu)))?
//!     .with(("next", "terminated"), Tensor::zeros([5, 1], (Kind::Bool, Device::Cpu)))?;
//! let out = loss.forward(&td)?;
//! assert_eq!(out.alpha.double_value(&[]), 1.0); // alpha_init
//! assert_eq!(loss.target_entropy(), -1.0); // "auto": -(action dims)
//! # Ok(()) }
//! ```

use std::cell::RefCell;
use std::fmt;

use tch::nn;
use tch::{Kind, Tensor};

use super::common::{LossModule, LossOutput, Reduction};
use super::off_policy::{
    boxed, estimate_with_next, forward_keys, next_td, priority_weights, push_unique, read, reduce,
    squeeze_last, Alpha, BoxedEstimator, DynModule, TargetEntropy, ValueEstimators, DEFAULT_GAMMA,
};
use super::ppo::CriticLossType;
use super::target::{TargetNetworks, TargetParams, WithTarget};
use crate::data::specs::TensorSpec;
use crate::error::{require, Error, Result};
use crate::modules::{ProbabilisticTensorDictModule, TensorDictModule};
use crate::rng::Generator;
use crate::tensordict::{NestedKey, TensorDict};

mod discrete;

pub use discrete::{DiscreteSACConfig, DiscreteSACKeys, DiscreteSACLoss};

crate::accepted_keys! {
    /// The keys of [`SACLoss`] (TorchRL's `SACLoss._AcceptedKeys`).
    pub struct SACKeys {
        /// The action. Defaults to `"action"`.
        action: "action",
        /// The state value (the estimator's value key: the next state's soft value is
        /// written there, under `"next"`). Defaults to `"state_value"`.
        value: "state_value",
        /// The critics' output `Q(s, a)`, `[*B, 1]`. Defaults to `"state_action_value"`.
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

/// The options of [`SACLoss`], TorchRL's defaults in [`SACConfig::new`].
#[derive(Clone, Debug, PartialEq)]
pub struct SACConfig {
    /// The number of critics (default 2).
    pub num_qvalue_nets: usize,
    /// The critics' distance (default smooth L1).
    pub loss_function: CriticLossType,
    /// α at the start (default 1).
    pub alpha_init: f64,
    /// The lower bound of α (default none).
    pub min_alpha: Option<f64>,
    /// The upper bound of α (default none).
    pub max_alpha: Option<f64>,
    /// Whether α stays at `alpha_init` (default `false`: α is learned).
    pub fixed_alpha: bool,
    /// The target entropy (default `Auto`: `-(number of action features)`, which needs
    /// [`with_action_spec`](Self::with_action_spec) or [`with_action_dims`](Self::with_action_dims)).
    pub target_entropy: TargetEntropy,
    /// The number of action features for `Auto` (`prod(action shape)`).
    pub action_numel: Option<i64>,
    /// Whether the critics have target copies (default `true`).
    pub delay_qvalue: bool,
    /// Whether the state-value network of version 1 (see
    /// [`SACLoss::with_value_network`]) has a target copy (default `true`).
    pub delay_value: bool,
    /// The reduction (default mean).
    pub reduction: Reduction,
    /// The seed of the actor's samples in the loss (default 0).
    pub seed: u64,
}

impl Default for SACConfig {
    fn default() -> Self {
        Self::new()
    }
}

impl SACConfig {
    /// TorchRL's defaults.
    pub fn new() -> Self {
        SACConfig {
            num_qvalue_nets: 2,
            loss_function: CriticLossType::SmoothL1,
            alpha_init: 1.0,
            min_alpha: None,
            max_alpha: None,
            fixed_alpha: false,
            target_entropy: TargetEntropy::Auto,
            action_numel: None,
            delay_qvalue: true,
            delay_value: true,
            reduction: Reduction::Mean,
            seed: 0,
        }
    }

    /// The action's feature count for the `Auto` target entropy, from its spec: the product
    /// of the spec's dims after the first `batch_dims` (an env's action spec carries the env's
    /// batch dims in front).
    pub fn with_action_spec(mut self, spec: &TensorSpec, batch_dims: usize) -> Self {
        self.action_numel = Some(spec.shape().iter().skip(batch_dims).product());
        self
    }

    crate::macros::setters! {
        /// The action's feature count for the `Auto` target entropy.
        with_action_dims(n: i64) => action_numel = Some(n);
        /// Sets `num_qvalue_nets`.
        with_num_qvalue_nets(num_qvalue_nets: usize);
        /// Sets `loss_function`.
        with_loss_function(loss_function: CriticLossType);
        /// Sets `alpha_init`.
        with_alpha_init(alpha_init: f64);
        /// Sets `min_alpha`.
        with_min_alpha(min_alpha: f64) => min_alpha = Some(min_alpha);
        /// Sets `max_alpha`.
        with_max_alpha(max_alpha: f64) => max_alpha = Some(max_alpha);
        /// Sets `fixed_alpha`.
        with_fixed_alpha(fixed_alpha: bool);
        /// Sets `target_entropy`.
        with_target_entropy(target_entropy: TargetEntropy);
        /// Sets `delay_qvalue`.
        with_delay_qvalue(delay_qvalue: bool);
        /// Sets `delay_value` (version 1's value network).
        with_delay_value(delay_value: bool);
        /// Sets `reduction`.
        with_reduction(reduction: Reduction);
        /// Sets `seed`.
        with_seed(seed: u64);
    }
}

/// What [`SACLoss::forward`] and [`DiscreteSACLoss::forward`] return (TorchRL's keys).
#[derive(Debug)]
pub struct SACLossOutput {
    /// `α·log π(ã|s) - min_i Q_i(s, ã)`, reduced (the critics held out of the graph).
    pub loss_actor: Tensor,
    /// `Σ_i distance(Q_i(s, a), target)`, reduced.
    pub loss_qvalue: Tensor,
    /// `-log α·(log π + target_entropy)`, reduced (zero gradient when α is fixed).
    pub loss_alpha: Tensor,
    /// α, detached.
    pub alpha: Tensor,
    /// `-mean(log π)`, detached.
    pub entropy: Tensor,
    /// `max_i |Q_i(s, a) - target|`, `[*B]` (TorchRL's priority); with a value network
    /// (version 1) `(Q_i(s, a) - target)²` of the critic that saw each element.
    pub td_error: Tensor,
    /// Version 1 only ([`SACLoss::with_value_network`]): `distance(V(s), min_i Q'_i(s, ã) -
    /// α·log π(ã|s))`, reduced.
    pub loss_value: Option<Tensor>,
}

impl LossOutput for SACLossOutput {
    fn loss_terms(&self) -> Vec<(&'static str, &Tensor)> {
        vec![
            ("loss_actor", &self.loss_actor),
            ("loss_qvalue", &self.loss_qvalue),
            ("loss_alpha", &self.loss_alpha),
        ]
        .into_iter()
        .chain(self.loss_value.as_ref().map(|v| ("loss_value", v)))
        .collect()
    }

    fn metrics(&self) -> Vec<(&'static str, &Tensor)> {
        vec![("alpha", &self.alpha), ("entropy", &self.entropy)]
    }
}

/// The critics of a SAC loss: `num_qvalue_nets` copies built at `path / "qvalue" / i`.
fn build_critics<Q, FQ>(
    path: &nn::Path<'_>,
    build: FQ,
    n: usize,
    delay: bool,
) -> Result<Vec<WithTarget<DynModule>>>
where
    Q: TensorDictModule + 'static,
    FQ: Fn(&nn::Path<'_>) -> Result<Q>,
{
    let qpath = path.sub("qvalue");
    let build = boxed(build);
    (0..n)
        .map(|i| WithTarget::new(&qpath.sub(i), delay, &build))
        .collect()
}

/// `[num_q, *B, *F]` outputs at `key` of every critic (online or target) on `td`.
fn critics_at(
    op: &'static str,
    critics: &[WithTarget<DynModule>],
    td: &TensorDict,
    key: &NestedKey,
    target: bool,
    frozen: bool,
) -> Result<Tensor> {
    let mut vals = Vec::with_capacity(critics.len());
    for q in critics {
        let run = || -> Result<Tensor> {
            let net = if target {
                q.target_or_online()
            } else {
                q.online()
            };
            read(op, &net.forward(td.clone())?, key)
        };
        vals.push(if frozen { q.frozen(run)? } else { run()? });
    }
    Ok(Tensor::f_stack(&vals, 0)?)
}

/// The soft actor-critic loss (TorchRL's `SACLoss`): version 2 by default, version 1 with
/// [`with_value_network`](SACLoss::with_value_network).
///
/// With `ã ~ π(·|s)` reparameterised and `ã' ~ π(·|s')`:
/// - critics: `V(s') = min_i Q'_i(s', ã') - α·log π(ã'|s')` (target critics, no gradient),
///   `target = value_estimate(V(s'))` (TD(0), `γ = 0.99` by default),
///   `loss_qvalue = reduce(Σ_i distance(Q_i(s, a), target))`;
/// - actor: `loss_actor = reduce(α·log π(ã|s) - min_i Q_i(s, ã))`, the critics frozen;
/// - α: `loss_alpha = reduce(-log α·(log π(ã|s) + target_entropy))`.
///
/// The actor is any [`ProbabilisticTensorDictModule`] (its parameters in the caller's var
/// store; TorchRL's default `delay_actor = false`); the critics are built from a builder
/// (`num_qvalue_nets` copies, each initialised afresh), read the observation and the action
/// and write `"state_action_value"`. A learned `log α` is a variable `path / "log_alpha"` of
/// the caller's var store. TorchRL's optional state-value network (SAC version 1) is added
/// with [`with_value_network`](SACLoss::with_value_network).
#[allow(clippy::upper_case_acronyms)]
pub struct SACLoss {
    actor: Box<dyn ProbabilisticTensorDictModule>,
    qvalues: Vec<WithTarget<DynModule>>,
    /// Version 1's state-value network `V(s)` (and its target copy).
    value: Option<WithTarget<DynModule>>,
    alpha: Alpha,
    target_entropy: f64,
    config: SACConfig,
    keys: SACKeys,
    in_keys: Vec<NestedKey>,
    estimator: BoxedEstimator,
    gen: RefCell<Generator>,
}

impl fmt::Debug for SACLoss {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SACLoss")
            .field("config", &self.config)
            .field("target_entropy", &self.target_entropy)
            .field("keys", &self.keys)
            .finish_non_exhaustive()
    }
}

impl SACLoss {
    /// The actor, the critic builder and the options. Errors when the target entropy is
    /// `Auto` without an action size, on a bad option, or when a builder fails.
    pub fn new<Q, FQ>(
        path: &nn::Path<'_>,
        actor: impl ProbabilisticTensorDictModule + 'static,
        qvalue: FQ,
        config: SACConfig,
    ) -> Result<Self>
    where
        Q: TensorDictModule + 'static,
        FQ: Fn(&nn::Path<'_>) -> Result<Q>,
    {
        let op = "SACLoss";
        require(
            config.num_qvalue_nets >= 1,
            op,
            "num_qvalue_nets",
            "at least 1",
            config.num_qvalue_nets,
        )?;
        let target_entropy = match config.target_entropy {
            TargetEntropy::Value(v) => v,
            TargetEntropy::Auto => match config.action_numel {
                Some(n) => -(n as f64),
                None => {
                    return Err(Error::config(
                        op,
                        "target_entropy",
                        "an action size for \"auto\" (with_action_spec / with_action_dims), or a target entropy",
                        "auto without an action size",
                    ))
                }
            },
        };
        let alpha = Alpha::new(
            op,
            path,
            config.alpha_init,
            config.min_alpha,
            config.max_alpha,
            config.fixed_alpha,
        )?;
        let qvalues = build_critics(path, qvalue, config.num_qvalue_nets, config.delay_qvalue)?;
        let mut loss = SACLoss {
            actor: Box::new(actor),
            qvalues,
            value: None,
            alpha,
            target_entropy,
            gen: RefCell::new(Generator::new(config.seed)),
            config,
            keys: SACKeys::default(),
            in_keys: Vec::new(),
            estimator: ValueEstimators::TD0.build(DEFAULT_GAMMA)?,
        };
        let keys = SACKeys {
            action: loss.actor.action_key().clone(),
            ..SACKeys::default()
        };
        loss.set_tensor_keys(keys)?;
        Ok(loss)
    }

    /// TorchRL's `value_network`: SAC version 1 (Haarnoja et al. 2018), with a state-value
    /// network `V(s)` built at `path / "value"` (a target copy too with
    /// [`delay_value`](SACConfig::delay_value), the default), reading the observation and
    /// writing the loss's `value` key (`"state_value"`). Then:
    /// - critics: `target = value_estimate(V'(s'))` (the target copy, no gradient; TD(0) by
    ///   default), and the batch is cut into `num_qvalue_nets` equal chunks along its first
    ///   dim, critic `i` regressing on chunk `i` only (TorchRL's independent critics; the
    ///   batch must divide evenly); `loss_qvalue = reduce(distance(Q_i(s, a), target))` over
    ///   the batch, `td_error = (Q_i(s, a) - target)²`;
    /// - value: `loss_value = reduce(distance(V(s), min_i Q'_i(s, ã) - α·log π(ã|s)))`, the
    ///   action drawn from the actor without gradient and scored by the target critics;
    /// - actor and α as version 2.
    ///
    /// ```
    /// use tch::{nn, Device, Kind, Tensor};
    /// use torchrl::modules::{DistributionBuilder, NormalParamExtractor, ProbabilisticActor, TdModule, TensorDictSequential};
    /// use torchrl::objectives::{LossModule, LossOutput, SACConfig, SACLoss, SoftUpdate, TargetNetworks};
    /// use torchrl::TensorDict;
    /// # fn main() -> torchrl::Result<()> {
    /// let vs = nn::VarStore::new(Device::Cpu);
    /// let net = TensorDictSequential::new()
    ///     .with(TdModule::new(nn::linear(vs.root() / "pi", 3, 2, Default::default()), ["observation"], ["param"])?)
    ///     .with(NormalParamExtractor::new());
    /// let actor = ProbabilisticActor::new(net, DistributionBuilder::tanh_normal("loc", "scale", -1.0, 1.0)?);
    /// let critic = |p: &nn::Path| TdModule::new(nn::linear(p / "q", 4, 1, Default::default()), ["observation", "action"], ["state_action_value"]);
    /// let value = |p: &nn::Path| TdModule::new(nn::linear(p / "v", 3, 1, Default::default()), ["observation"], ["state_value"]);
    /// let loss = SACLoss::new(&vs.root(), actor, critic, SACConfig::new().with_action_dims(1))?
    ///     .with_value_network(&vs.root(), value)?;
    /// let f = (Kind::Float, Device::Cpu);
    /// let td = TensorDict::new([4])?
    ///     .with("observation", Tensor::randn([4, 3], f))?
    ///     .with("action", Tensor::rand([4, 1], f))?
    ///     .with(("next", "observation"), Tensor::randn([4, 3], f))?
    ///     .with(("next", "reward"), Tensor::ones([4, 1], f))?
    ///     .with(("next", "done"), Tensor::zeros([4, 1], (Kind::Bool, Device::Cpu)))?
    ///     .with(("next", "terminated"), Tensor::zeros([4, 1], (Kind::Bool, Device::Cpu)))?;
    /// let out = loss.forward(&td)?;
    /// assert!(out.loss_value.is_some());
    /// assert_eq!(out.loss_terms().len(), 4); // actor, qvalue, alpha, value
    /// // an updater moves the target copies of both critics and of the value network
    /// assert_eq!(loss.target_params().len(), 3);
    /// let mut updater = SoftUpdate::new(&loss, None, Some(0.005))?;
    /// updater.step()?;
    /// // an odd batch cannot be split between two critics
    /// let odd = td.split(&[3, 1], 0)?.remove(0);
    /// assert!(loss.forward(&odd).unwrap_err().to_string().contains("num_qvalue_nets"));
    /// # Ok(()) }
    /// ```
    pub fn with_value_network<V, FV>(mut self, path: &nn::Path<'_>, build: FV) -> Result<Self>
    where
        V: TensorDictModule + 'static,
        FV: Fn(&nn::Path<'_>) -> Result<V>,
    {
        let value = WithTarget::new(&path.sub("value"), self.config.delay_value, boxed(build))?;
        self.value = Some(value);
        let keys = self.keys.clone();
        self.set_tensor_keys(keys)?;
        Ok(self)
    }

    /// Version 1's state-value network (online and target), if any.
    pub fn value_network(&self) -> Option<&WithTarget<DynModule>> {
        self.value.as_ref()
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
            &k.value,
            &k.reward,
            &k.done,
            &k.terminated,
        )?;
        self.estimator = estimator;
        Ok(())
    }

    /// The target entropy in use.
    pub fn target_entropy(&self) -> f64 {
        self.target_entropy
    }

    /// `log α` (a variable of the caller's var store unless α is fixed).
    pub fn log_alpha(&self) -> &Tensor {
        &self.alpha.log_alpha
    }

    /// The critics (online and target).
    pub fn qvalue_networks(&self) -> &[WithTarget<DynModule>] {
        &self.qvalues
    }

    /// The actor.
    pub fn actor(&self) -> &dyn ProbabilisticTensorDictModule {
        self.actor.as_ref()
    }

    /// A reparameterised action and its log-probability for `td`.
    fn sample(&self, td: &TensorDict) -> Result<(Tensor, Tensor)> {
        let dist = self.actor.get_dist(td)?;
        let out = dist.rsample_and_log_prob(&mut self.gen.borrow_mut(), &[]);
        out
    }
}

impl LossModule for SACLoss {
    type Keys = SACKeys;
    type Output = SACLossOutput;

    fn name(&self) -> &'static str {
        "SACLoss"
    }

    fn tensor_keys(&self) -> &SACKeys {
        &self.keys
    }

    fn set_tensor_keys(&mut self, keys: SACKeys) -> Result<()> {
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
        let q_keys = self
            .qvalues
            .first()
            .map(|q| q.online().in_keys())
            .unwrap_or_default();
        let v_keys = self
            .value
            .as_ref()
            .map(|v| v.online().in_keys())
            .unwrap_or_default();
        for k in self.actor.in_keys().into_iter().chain(q_keys).chain(v_keys) {
            if k != keys.action {
                push_unique(&mut in_keys, k.prefixed("next"));
            }
            push_unique(&mut in_keys, k);
        }
        self.in_keys = in_keys;
        self.keys = keys;
        Ok(())
    }

    fn in_keys(&self) -> &[NestedKey] {
        &self.in_keys
    }

    fn forward(&self, td: &TensorDict) -> Result<SACLossOutput> {
        let op = "SACLoss";
        let k = &self.keys;
        let c = &self.config;
        let w = priority_weights(td, &k.priority_weight);
        let alpha = self.alpha.alpha()?;
        // the critics first, then (version 1) the value network, then the actor: TorchRL's
        // order, which is also the order of the actor's draws
        let (loss_qvalue, td_error, loss_value) = match &self.value {
            None => {
                let (loss, td_error) = self.qvalue_v2_loss(td, &alpha, w.as_ref())?;
                (loss, td_error, None)
            }
            Some(value) => {
                let (loss, td_error) = self.qvalue_v1_loss(value, td, w.as_ref())?;
                let loss_value = self.value_loss(value, td, &alpha, w.as_ref())?;
                (loss, td_error, Some(loss_value))
            }
        };
        // actor
        let (a, log_prob) = self.sample(td)?;
        let mut with_a = td.clone();
        with_a.set(&k.action, a)?;
        let q_pi = squeeze_last(&critics_at(
            op,
            &self.qvalues,
            &with_a,
            &k.state_action_value,
            false,
            true,
        )?)?;
        let min_q = q_pi.f_min_dim(0, false)?.0;
        let loss_actor = reduce(
            op,
            c.reduction,
            &log_prob.f_mul(&alpha)?.f_sub(&min_q)?,
            w.as_ref(),
        )?;
        let loss_alpha = reduce(
            op,
            c.reduction,
            &self.alpha.loss(&log_prob, self.target_entropy)?,
            w.as_ref(),
        )?;
        Ok(SACLossOutput {
            loss_actor,
            loss_qvalue,
            loss_alpha,
            alpha,
            entropy: log_prob.f_detach()?.f_mean(None)?.f_neg()?,
            td_error,
            loss_value,
        })
    }
}

impl SACLoss {
    /// Version 2's critic loss and priority: the soft value of the next state from the target
    /// critics and a fresh action, every critic on the whole batch.
    fn qvalue_v2_loss(
        &self,
        td: &TensorDict,
        alpha: &Tensor,
        w: Option<&Tensor>,
    ) -> Result<(Tensor, Tensor)> {
        let op = "SACLoss";
        let k = &self.keys;
        let next_value = {
            let _guard = tch::no_grad_guard();
            let mut next = next_td(op, td)?;
            let (a, lp) = self.sample(&next)?;
            next.set(&k.action, a)?;
            let q = critics_at(op, &self.qvalues, &next, &k.state_action_value, true, false)?;
            let lp = if q.dim() > lp.dim() + 1 {
                lp.f_unsqueeze(-1)?
            } else {
                lp
            };
            let v = q.f_sub(&lp.f_mul(alpha)?)?;
            v.f_min_dim(0, false)?.0
        };
        let target = squeeze_last(&estimate_with_next(
            self.estimator.as_ref(),
            td,
            next_value,
        )?)?;
        let pred = squeeze_last(&critics_at(
            op,
            &self.qvalues,
            td,
            &k.state_action_value,
            false,
            false,
        )?)?;
        let dist = self
            .config
            .loss_function
            .distance(op, &target.f_expand_as(&pred)?, &pred)?
            .f_sum_dim_intlist(0, false, None::<Kind>)?;
        let loss = reduce(op, self.config.reduction, &dist, w)?;
        let _guard = tch::no_grad_guard();
        let td_error = pred
            .f_detach()?
            .f_sub(&target)?
            .f_abs()?
            .f_max_dim(0, false)?
            .0;
        Ok((loss, td_error))
    }

    /// Version 1's critic loss and priority: the target is bootstrapped from the (target)
    /// value network at the next state; critic `i` regresses on the `i`-th chunk of the batch.
    fn qvalue_v1_loss(
        &self,
        value: &WithTarget<DynModule>,
        td: &TensorDict,
        w: Option<&Tensor>,
    ) -> Result<(Tensor, Tensor)> {
        let op = "SACLoss";
        let k = &self.keys;
        let n = self.qvalues.len() as i64;
        let batch = td.batch_size().first().copied().unwrap_or(0);
        if td.batch_size().is_empty() || batch % n != 0 {
            return Err(Error::config(
                op,
                "num_qvalue_nets",
                format!(
                    "a divisor of the batch's first dim (version 1 trains each of the {n} \
                     critics on its own chunk of the batch)"
                ),
                format!("{n} for a batch of size {:?}", td.batch_size()),
            ));
        }
        let next_value = {
            let _guard = tch::no_grad_guard();
            let next = next_td(op, td)?;
            read(op, &value.target_or_online().forward(next)?, &k.value)?
        };
        let target = squeeze_last(&estimate_with_next(
            self.estimator.as_ref(),
            td,
            next_value,
        )?)?;
        let chunk = batch / n;
        let pieces = td.chunk_by(chunk, 0)?;
        let mut preds = Vec::with_capacity(self.qvalues.len());
        for (q, piece) in self.qvalues.iter().zip(pieces) {
            let out = q.online().forward(piece)?;
            preds.push(squeeze_last(&read(op, &out, &k.state_action_value)?)?);
        }
        let pred = Tensor::f_cat(&preds, 0)?;
        let dist = self.config.loss_function.distance(op, &target, &pred)?;
        let loss = reduce(op, self.config.reduction, &dist, w)?;
        let _guard = tch::no_grad_guard();
        let td_error = pred.f_detach()?.f_sub(&target)?.f_square()?;
        Ok((loss, td_error))
    }

    /// Version 1's value loss: `V(s)` against the target critics' soft value of a fresh
    /// action, which carries no gradient.
    fn value_loss(
        &self,
        value: &WithTarget<DynModule>,
        td: &TensorDict,
        alpha: &Tensor,
        w: Option<&Tensor>,
    ) -> Result<Tensor> {
        let op = "SACLoss";
        let k = &self.keys;
        let pred = squeeze_last(&read(op, &value.online().forward(td.detach()?)?, &k.value)?)?;
        let target = {
            let _guard = tch::no_grad_guard();
            let (a, log_prob) = self.sample(td)?;
            let mut with_a = td.clone();
            with_a.set(&k.action, a)?;
            let q = squeeze_last(&critics_at(
                op,
                &self.qvalues,
                &with_a,
                &k.state_action_value,
                true,
                false,
            )?)?;
            q.f_min_dim(0, false)?.0.f_sub(&log_prob.f_mul(alpha)?)?
        };
        let dist = self.config.loss_function.distance(op, &target, &pred)?;
        reduce(op, self.config.reduction, &dist, w)
    }
}

impl TargetNetworks for SACLoss {
    fn target_params(&self) -> Vec<&TargetParams> {
        self.qvalues
            .iter()
            .chain(self.value.as_ref())
            .filter_map(|q| q.target_params())
            .collect()
    }
}
