//! The TD3 loss: [`TD3Loss`] (TorchRL's `TD3Loss`): twin critics, target policy smoothing
//! (clipped noise on the target action) and target copies of the actor and the critics.
//! TD3's delayed policy update is the training loop's choice (update the actor every
//! `policy_delay` critic steps), as in TorchRL.
//!
//! ```
//! use tch::{nn, Device, Kind, Tensor};
//! use torchrl::modules::TdModule;
//! use torchrl::objectives::{LossModule, TD3Config, TD3Loss};
//! use torchrl::TensorDict;
//! # fn main() -> torchrl::Result<()> {
//! let vs = nn::VarStore::new(Device::Cpu);
//! let actor = |p: &nn::Path| TdModule::new(nn::linear(p / "pi", 3, 1, Default::default()), ["observation"], ["action"]);
//! let critic = |p: &nn::Path| TdModule::new(nn::linear(p / "q", 4, 1, Default::default()), ["observation", "action"], ["state_action_value"]);
//! let loss = TD3Loss::new(&vs.root(), actor, critic, TD3Config::new(-1.0, 1.0))?;
//! let f = (Kind::Float, Device::Cpu);
//! let td = TensorDict::new([5])?
//!     .with("observation", Tensor::randn([5, 3], f))?
//!     .with("action", Tensor::randn([5, 1], f))?
//!     .with(("next", "observation"), Tensor::randn([5, 3], f))?
//!     .with(("next", "reward"), Tensor::ones([5, 1], f))?
//!     .with(("next", "done"), Tensor::zeros([5, 1], (Kind::Bool, Device::Cpu)))?
//!     .with(("next", "terminated"), Tensor::zeros([5, 1], (Kind::Bool, Device::Cpu)))?;
//! let out = loss.forward(&td)?;
//! assert_eq!(out.pred_value.size(), vec![2, 5]); // two critics
//! # Ok(()) }
//! ```

use std::cell::RefCell;
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
use crate::data::specs::TensorSpec;
use crate::error::{require, Error, Result};
use crate::modules::TensorDictModule;
use crate::rng::Generator;
use crate::tensordict::{NestedKey, TensorDict};

crate::accepted_keys! {
    /// The keys of [`TD3Loss`] (TorchRL's `TD3Loss._AcceptedKeys`).
    pub struct TD3Keys {
        /// The action. Defaults to `"action"`.
        action: "action",
        /// The critics' output `Q(s, a)`, `[*B, 1]` (the estimator's value key). Defaults to
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

/// The options of [`TD3Loss`], TorchRL's defaults in [`TD3Config::new`].
#[derive(Clone, Debug, PartialEq)]
pub struct TD3Config {
    /// The lower action bound (TorchRL's `bounds` / the action spec's `low`).
    pub min_action: f64,
    /// The upper action bound.
    pub max_action: f64,
    /// The number of critics (default 2).
    pub num_qvalue_nets: usize,
    /// The std of the target policy's smoothing noise (default 0.2).
    pub policy_noise: f64,
    /// The noise is clamped to `[-noise_clip, noise_clip]` (default 0.5).
    pub noise_clip: f64,
    /// The critics' distance (default smooth L1).
    pub loss_function: CriticLossType,
    /// Whether the actor has a target copy (default `true`).
    pub delay_actor: bool,
    /// Whether the critics have target copies (default `true`).
    pub delay_qvalue: bool,
    /// The reduction (default mean).
    pub reduction: Reduction,
    /// The seed of the smoothing noise (default 0).
    pub seed: u64,
}

impl TD3Config {
    /// TorchRL's defaults with the action bounds `[min_action, max_action]`.
    pub fn new(min_action: f64, max_action: f64) -> Self {
        TD3Config {
            min_action,
            max_action,
            num_qvalue_nets: 2,
            policy_noise: 0.2,
            noise_clip: 0.5,
            loss_function: CriticLossType::SmoothL1,
            delay_actor: true,
            delay_qvalue: true,
            reduction: Reduction::Mean,
            seed: 0,
        }
    }

    /// The bounds of a [`Bounded`](TensorSpec::Bounded) action spec (its smallest low and
    /// largest high), TorchRL's `action_spec=`.
    pub fn from_spec(spec: &TensorSpec) -> Result<Self> {
        match spec {
            TensorSpec::Bounded(b) => Ok(Self::new(
                b.low().f_min()?.f_double_value(&[])?,
                b.high().f_max()?.f_double_value(&[])?,
            )),
            other => Err(Error::argument(
                "TD3Config::from_spec",
                "spec",
                "a Bounded action spec",
                format!("a {} spec", other.class_name()),
            )),
        }
    }

    crate::macros::setters! {
        /// Sets `num_qvalue_nets`.
        with_num_qvalue_nets(num_qvalue_nets: usize);
        /// Sets `policy_noise`.
        with_policy_noise(policy_noise: f64);
        /// Sets `noise_clip`.
        with_noise_clip(noise_clip: f64);
        /// Sets `loss_function`.
        with_loss_function(loss_function: CriticLossType);
        /// Sets `delay_actor`.
        with_delay_actor(delay_actor: bool);
        /// Sets `delay_qvalue`.
        with_delay_qvalue(delay_qvalue: bool);
        /// Sets `reduction`.
        with_reduction(reduction: Reduction);
        /// Sets `seed`.
        with_seed(seed: u64);
    }
}

/// What [`TD3Loss::forward`] returns (TorchRL's keys).
#[derive(Debug)]
pub struct TD3LossOutput {
    /// `-Q_1(s, μ(s))`, reduced (the critics held out of the graph).
    pub loss_actor: Tensor,
    /// `Σ_i distance(Q_i(s, a), target)`, reduced.
    pub loss_qvalue: Tensor,
    /// `Q_i(s, μ(s))`, `[num_qvalue_nets, *B]`, detached.
    pub state_action_value_actor: Tensor,
    /// `min_i Q'_i(s', ã')`, `[*B]`, detached.
    pub next_state_value: Tensor,
    /// `Q_i(s, a)`, `[num_qvalue_nets, *B]`, detached.
    pub pred_value: Tensor,
    /// The targets, `[*B]`.
    pub target_value: Tensor,
    /// `max_i (Q_i(s, a) - target)²`, `[*B]` (TorchRL's priority).
    pub td_error: Tensor,
}

impl LossOutput for TD3LossOutput {
    fn loss_terms(&self) -> Vec<(&'static str, &Tensor)> {
        vec![
            ("loss_actor", &self.loss_actor),
            ("loss_qvalue", &self.loss_qvalue),
        ]
    }
}

/// The TD3 loss (TorchRL's `TD3Loss`).
///
/// - actor: `loss_actor = reduce(-Q_1(s, μ(s)))`;
/// - critics: `ã' = clamp(μ'(s') + clamp(σ·N(0, 1), -c, c), low, high)`,
///   `target = value_estimate(min_i Q'_i(s', ã'))` (TD(0), `γ = 0.99` by default),
///   `loss_qvalue = reduce(Σ_i distance(Q_i(s, a), target))`.
///
/// The critics are built `num_qvalue_nets` times (`path / "qvalue" / i`), each with its own
/// initialisation, like TorchRL's re-sampled copies.
#[allow(clippy::upper_case_acronyms)]
pub struct TD3Loss {
    actor: WithTarget<DynModule>,
    qvalues: Vec<WithTarget<DynModule>>,
    config: TD3Config,
    keys: TD3Keys,
    in_keys: Vec<NestedKey>,
    estimator: BoxedEstimator,
    gen: RefCell<Generator>,
}

impl fmt::Debug for TD3Loss {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TD3Loss")
            .field("config", &self.config)
            .field("keys", &self.keys)
            .finish_non_exhaustive()
    }
}

impl TD3Loss {
    /// Builds the actor (`path / "actor"`) and the critics (`path / "qvalue" / i`), with their
    /// target copies per the config.
    pub fn new<A, Q, FA, FQ>(
        path: &nn::Path<'_>,
        actor: FA,
        qvalue: FQ,
        config: TD3Config,
    ) -> Result<Self>
    where
        A: TensorDictModule + 'static,
        Q: TensorDictModule + 'static,
        FA: Fn(&nn::Path<'_>) -> Result<A>,
        FQ: Fn(&nn::Path<'_>) -> Result<Q>,
    {
        let op = "TD3Loss";
        require(
            config.num_qvalue_nets >= 1,
            op,
            "num_qvalue_nets",
            "at least 1",
            config.num_qvalue_nets,
        )?;
        require(
            config.min_action <= config.max_action,
            op,
            "min_action",
            "min_action <= max_action",
            config.min_action,
        )?;
        require(
            config.policy_noise >= 0.0,
            op,
            "policy_noise",
            "a non-negative std",
            config.policy_noise,
        )?;
        require(
            config.noise_clip >= 0.0,
            op,
            "noise_clip",
            "a non-negative clip",
            config.noise_clip,
        )?;
        let actor = WithTarget::new(&path.sub("actor"), config.delay_actor, boxed(actor))?;
        let qpath = path.sub("qvalue");
        let build_q = boxed(qvalue);
        let qvalues = (0..config.num_qvalue_nets)
            .map(|i| WithTarget::new(&qpath.sub(i), config.delay_qvalue, &build_q))
            .collect::<Result<Vec<_>>>()?;
        let gen = RefCell::new(Generator::new(config.seed));
        let mut loss = TD3Loss {
            actor,
            qvalues,
            config,
            keys: TD3Keys::default(),
            in_keys: Vec::new(),
            estimator: ValueEstimators::TD0.build(DEFAULT_GAMMA)?,
            gen,
        };
        loss.set_tensor_keys(TD3Keys::default())?;
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

    /// The critics (online and target).
    pub fn qvalue_networks(&self) -> &[WithTarget<DynModule>] {
        &self.qvalues
    }

    /// `[num_q, *B]` values of every critic (online or target) on `td`.
    fn q_all(&self, td: &TensorDict, target: bool, frozen: bool) -> Result<Tensor> {
        let op = "TD3Loss";
        let mut vals = Vec::with_capacity(self.qvalues.len());
        for q in &self.qvalues {
            let run = || -> Result<Tensor> {
                let net = if target {
                    q.target_or_online()
                } else {
                    q.online()
                };
                let out = net.forward(td.clone())?;
                squeeze_last(&read(op, &out, &self.keys.state_action_value)?)
            };
            vals.push(if frozen { q.frozen(run)? } else { run()? });
        }
        Ok(Tensor::f_stack(&vals, 0)?)
    }
}

impl LossModule for TD3Loss {
    type Keys = TD3Keys;
    type Output = TD3LossOutput;

    fn name(&self) -> &'static str {
        "TD3Loss"
    }

    fn tensor_keys(&self) -> &TD3Keys {
        &self.keys
    }

    fn set_tensor_keys(&mut self, keys: TD3Keys) -> Result<()> {
        forward_keys(
            self.estimator.as_mut(),
            &keys.state_action_value,
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
        for k in self.actor.online().in_keys().into_iter().chain(q_keys) {
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

    fn forward(&self, td: &TensorDict) -> Result<TD3LossOutput> {
        let op = "TD3Loss";
        let k = &self.keys;
        let c = &self.config;
        let w = priority_weights(td, &k.priority_weight);
        // actor: -Q_1(s, μ(s)), the critics frozen
        let with_pi = self.actor.online().forward(td.clone())?;
        let q_pi = self.q_all(&with_pi, false, true)?;
        let first = q_pi.f_select(0, 0)?;
        let loss_actor = reduce(op, c.reduction, &first.f_neg()?, w.as_ref())?;
        // critics
        let act = read(op, td, &k.action)?;
        let (next_value, next_min) = {
            let _guard = tch::no_grad_guard();
            let noise = self
                .gen
                .borrow_mut()
                .normal(&act.size(), 0.0, 1.0, act.kind(), act.device())?
                .f_mul_scalar(c.policy_noise)?
                .f_clamp(-c.noise_clip, c.noise_clip)?;
            let mut next = self.actor.target_or_online().forward(next_td(op, td)?)?;
            let next_action = read(op, &next, &k.action)?
                .f_add(&noise)?
                .f_clamp(c.min_action, c.max_action)?;
            next.set(&k.action, next_action)?;
            let q_next = self.q_all(&next, true, false)?;
            let (min, _) = q_next.f_min_dim(0, false)?;
            (min.f_unsqueeze(-1)?, min)
        };
        let target = squeeze_last(&estimate_with_next(
            self.estimator.as_ref(),
            td,
            next_value,
        )?)?;
        let pred = self.q_all(td, false, false)?;
        let target_x = target.f_expand_as(&pred)?;
        let dist = c
            .loss_function
            .distance(op, &target_x, &pred)?
            .f_sum_dim_intlist(0, false, None::<tch::Kind>)?;
        let loss_qvalue = reduce(op, c.reduction, &dist, w.as_ref())?;
        let _guard = tch::no_grad_guard();
        let pred_d = pred.f_detach()?;
        let (td_error, _) = pred_d
            .f_sub(&target)?
            .f_pow_tensor_scalar(2)?
            .f_max_dim(0, false)?;
        Ok(TD3LossOutput {
            loss_actor,
            loss_qvalue,
            state_action_value_actor: q_pi.f_detach()?,
            next_state_value: next_min,
            pred_value: pred_d,
            target_value: target,
            td_error,
        })
    }
}

impl TargetNetworks for TD3Loss {
    fn target_params(&self) -> Vec<&TargetParams> {
        self.actor
            .target_params()
            .into_iter()
            .chain(self.qvalues.iter().filter_map(|q| q.target_params()))
            .collect()
    }
}
