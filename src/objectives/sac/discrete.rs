//! [`DiscreteSACLoss`] (TorchRL's `DiscreteSACLoss`): soft actor-critic over a categorical
//! or one-hot action, with the critics' values of every action; it shares
//! [`SACLossOutput`](super::SACLossOutput) and the critic builders of [`super`].

use std::fmt;

use tch::nn;
use tch::{Kind, Tensor};

use super::{build_critics, critics_at, SACLossOutput};
use crate::error::{require, Error, Result};
use crate::modules::distributions::{Categorical, Distribution, OneHotCategorical};
use crate::modules::{ActionSpace, ProbabilisticTensorDictModule, TensorDictModule};
use crate::objectives::common::{LossModule, Reduction};
use crate::objectives::off_policy::{
    estimate_with_next, forward_keys, next_td, priority_weights, push_unique, read, reduce,
    squeeze_last, Alpha, BoxedEstimator, DynModule, TargetEntropy, ValueEstimators, DEFAULT_GAMMA,
};
use crate::objectives::ppo::CriticLossType;
use crate::objectives::target::{TargetNetworks, TargetParams, WithTarget};
use crate::tensordict::{NestedKey, TensorDict};

crate::accepted_keys! {
    /// The keys of [`DiscreteSACLoss`] (TorchRL's `DiscreteSACLoss._AcceptedKeys`).
    pub struct DiscreteSACKeys {
        /// The action (one-hot or an index). Defaults to `"action"`.
        action: "action",
        /// The state value (the estimator's value key). Defaults to `"state_value"`.
        value: "state_value",
        /// The critics' Q-values of every action, `[*B, n]`. Defaults to `"action_value"`.
        action_value: "action_value",
        /// Where TorchRL writes the priority (here: the output's `td_error`). Defaults to
        /// `"td_error"`.
        priority: "td_error",
        /// The reward, under `"next"`. Defaults to `"reward"`.
        reward: "reward",
        /// The done flag, under `"next"`. Defaults to `"done"`.
        done: "done",
        /// The terminated flag, under `"next"`. Defaults to `"terminated"`.
        terminated: "terminated",
        /// Accepted as TorchRL's (not read). Defaults to `"log_prob"`.
        log_prob: "log_prob",
        /// Importance weights, used when present. Defaults to `"priority_weight"`.
        priority_weight: "priority_weight",
    }
}

/// The options of [`DiscreteSACLoss`], TorchRL's defaults in [`DiscreteSACConfig::new`].
#[derive(Clone, Debug, PartialEq)]
pub struct DiscreteSACConfig {
    /// How actions are written.
    pub action_space: ActionSpace,
    /// The number of actions (for the `Auto` target entropy).
    pub num_actions: Option<i64>,
    /// The number of critics (default 2).
    pub num_qvalue_nets: usize,
    /// The critics' distance (default smooth L1).
    pub loss_function: CriticLossType,
    /// α at the start (default 1).
    pub alpha_init: f64,
    /// The lower bound of α.
    pub min_alpha: Option<f64>,
    /// The upper bound of α.
    pub max_alpha: Option<f64>,
    /// Whether α stays at `alpha_init` (default `false`).
    pub fixed_alpha: bool,
    /// The weight of the `Auto` target entropy (default 0.98).
    pub target_entropy_weight: f64,
    /// The target entropy (default `Auto`: `-0.98·log(1/num_actions)`).
    pub target_entropy: TargetEntropy,
    /// Whether the critics have target copies (default `true`).
    pub delay_qvalue: bool,
    /// The reduction (default mean).
    pub reduction: Reduction,
}

impl DiscreteSACConfig {
    /// TorchRL's defaults, with `num_actions` for the `Auto` target entropy.
    pub fn new(action_space: ActionSpace, num_actions: i64) -> Self {
        DiscreteSACConfig {
            action_space,
            num_actions: Some(num_actions),
            num_qvalue_nets: 2,
            loss_function: CriticLossType::SmoothL1,
            alpha_init: 1.0,
            min_alpha: None,
            max_alpha: None,
            fixed_alpha: false,
            target_entropy_weight: 0.98,
            target_entropy: TargetEntropy::Auto,
            delay_qvalue: true,
            reduction: Reduction::Mean,
        }
    }

    crate::macros::setters! {
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
        /// Sets `target_entropy_weight`.
        with_target_entropy_weight(target_entropy_weight: f64);
        /// Sets `target_entropy`.
        with_target_entropy(target_entropy: TargetEntropy);
        /// Sets `delay_qvalue`.
        with_delay_qvalue(delay_qvalue: bool);
        /// Sets `reduction`.
        with_reduction(reduction: Reduction);
    }
}

/// The probabilities and (normalised) log-probabilities of a categorical actor's
/// distribution.
fn probs_logits(dist: &dyn Distribution) -> Result<(Tensor, Tensor)> {
    if let Some(any) = dist.as_any() {
        if let Some(c) = any.downcast_ref::<Categorical>() {
            return Ok((c.probs().shallow_clone(), c.logits().shallow_clone()));
        }
        if let Some(c) = any.downcast_ref::<OneHotCategorical>() {
            return Ok((c.probs().shallow_clone(), c.logits().shallow_clone()));
        }
    }
    Err(Error::invalid(
        "DiscreteSACLoss",
        "the actor's distribution must be a Categorical or a OneHotCategorical",
    ))
}

/// The soft actor-critic loss for discrete actions (TorchRL's `DiscreteSACLoss`).
///
/// With `π(·|s)` the actor's categorical probabilities (expectations are exact, no samples):
/// - critics: `V(s') = Σ_a π(a|s')·(min_i Q'_i(s', a) - α·log π(a|s'))`,
///   `target = value_estimate(V(s'))`, `loss_qvalue = reduce(Σ_i distance(Q_i(s, a), target))`;
/// - actor: `loss_actor = reduce(Σ_a π(a|s)·(α·log π(a|s) - min_i Q_i(s, a)))`, critics frozen;
/// - α: `loss_alpha = reduce(-log α·(Σ_a π log π + target_entropy))`.
///
/// The critics read the observation and write `"action_value"` (`[*B, n]`).
#[allow(clippy::upper_case_acronyms)]
pub struct DiscreteSACLoss {
    actor: Box<dyn ProbabilisticTensorDictModule>,
    qvalues: Vec<WithTarget<DynModule>>,
    alpha: Alpha,
    target_entropy: f64,
    config: DiscreteSACConfig,
    keys: DiscreteSACKeys,
    in_keys: Vec<NestedKey>,
    estimator: BoxedEstimator,
}

impl fmt::Debug for DiscreteSACLoss {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DiscreteSACLoss")
            .field("config", &self.config)
            .field("target_entropy", &self.target_entropy)
            .finish_non_exhaustive()
    }
}

impl DiscreteSACLoss {
    /// The actor (a categorical or one-hot categorical policy), the critic builder and the
    /// options.
    pub fn new<Q, FQ>(
        path: &nn::Path<'_>,
        actor: impl ProbabilisticTensorDictModule + 'static,
        qvalue: FQ,
        config: DiscreteSACConfig,
    ) -> Result<Self>
    where
        Q: TensorDictModule + 'static,
        FQ: Fn(&nn::Path<'_>) -> Result<Q>,
    {
        let op = "DiscreteSACLoss";
        require(
            config.num_qvalue_nets >= 1,
            op,
            "num_qvalue_nets",
            "at least 1",
            config.num_qvalue_nets,
        )?;
        let target_entropy = match (config.target_entropy, config.num_actions) {
            (TargetEntropy::Value(v), _) => v,
            (TargetEntropy::Auto, Some(n)) if n > 0 => {
                -((1.0 / n as f64).ln() * config.target_entropy_weight)
            }
            (TargetEntropy::Auto, n) => {
                return Err(Error::config(
                    op,
                    "num_actions",
                    "a positive number of actions for target_entropy \"auto\"",
                    format!("{n:?}"),
                ))
            }
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
        let mut loss = DiscreteSACLoss {
            actor: Box::new(actor),
            qvalues,
            alpha,
            target_entropy,
            config,
            keys: DiscreteSACKeys::default(),
            in_keys: Vec::new(),
            estimator: ValueEstimators::TD0.build(DEFAULT_GAMMA)?,
        };
        loss.set_tensor_keys(DiscreteSACKeys::default())?;
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

    /// `log α`.
    pub fn log_alpha(&self) -> &Tensor {
        &self.alpha.log_alpha
    }

    /// The critics (online and target).
    pub fn qvalue_networks(&self) -> &[WithTarget<DynModule>] {
        &self.qvalues
    }
}

impl LossModule for DiscreteSACLoss {
    type Keys = DiscreteSACKeys;
    type Output = SACLossOutput;

    fn name(&self) -> &'static str {
        "DiscreteSACLoss"
    }

    fn tensor_keys(&self) -> &DiscreteSACKeys {
        &self.keys
    }

    fn set_tensor_keys(&mut self, keys: DiscreteSACKeys) -> Result<()> {
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
        for k in self.actor.in_keys() {
            push_unique(&mut in_keys, k.clone());
            push_unique(&mut in_keys, k.prefixed("next"));
        }
        if let Some(q) = self.qvalues.first() {
            for k in q.online().in_keys() {
                push_unique(&mut in_keys, k);
            }
        }
        self.in_keys = in_keys;
        self.keys = keys;
        Ok(())
    }

    fn in_keys(&self) -> &[NestedKey] {
        &self.in_keys
    }

    fn forward(&self, td: &TensorDict) -> Result<SACLossOutput> {
        let op = "DiscreteSACLoss";
        let k = &self.keys;
        let c = &self.config;
        let w = priority_weights(td, &k.priority_weight);
        let alpha = self.alpha.alpha()?;
        let next_value = {
            let _guard = tch::no_grad_guard();
            let next = next_td(op, td)?;
            let (p, _) = probs_logits(self.actor.get_dist(&next)?.as_ref())?;
            let one = Tensor::f_full(&[] as &[i64], 1e-8, (p.kind(), p.device()))?;
            let logp = one.f_where_self(&p.f_eq(0.0)?, &p)?.f_log()?;
            let q = critics_at(op, &self.qvalues, &next, &k.action_value, true, false)?;
            let v = q.f_min_dim(0, false)?.0.f_sub(&logp.f_mul(&alpha)?)?;
            p.f_mul(&v)?.f_sum_dim_intlist(-1, true, None::<Kind>)?
        };
        let target = squeeze_last(&estimate_with_next(
            self.estimator.as_ref(),
            td,
            next_value,
        )?)?;
        let q_all = critics_at(op, &self.qvalues, td, &k.action_value, false, false)?;
        let action = read(op, td, &k.action)?;
        let mut chosen = Vec::with_capacity(self.qvalues.len());
        for i in 0..self.qvalues.len() as i64 {
            let qi = q_all.f_select(0, i)?;
            chosen.push(
                c.action_space
                    .chosen_value(&qi, &action)?
                    .f_squeeze_dim(-1)?,
            );
        }
        let pred = Tensor::f_stack(&chosen, 0)?;
        let dist = c
            .loss_function
            .distance(op, &target.f_expand_as(&pred)?, &pred)?
            .f_sum_dim_intlist(0, false, None::<Kind>)?;
        let loss_qvalue = reduce(op, c.reduction, &dist, w.as_ref())?;
        // actor
        let (prob, logp) = probs_logits(self.actor.get_dist(td)?.as_ref())?;
        let q_pi = critics_at(op, &self.qvalues, td, &k.action_value, false, true)?;
        let min_q = q_pi.f_min_dim(0, false)?.0;
        let per = prob
            .f_mul(&logp.f_mul(&alpha)?.f_sub(&min_q)?)?
            .f_sum_dim_intlist(-1, false, None::<Kind>)?;
        let loss_actor = reduce(op, c.reduction, &per, w.as_ref())?;
        let log_prob = logp
            .f_mul(&prob)?
            .f_sum_dim_intlist(-1, false, None::<Kind>)?
            .f_detach()?;
        let loss_alpha = reduce(
            op,
            c.reduction,
            &self.alpha.loss(&log_prob, self.target_entropy)?,
            w.as_ref(),
        )?;
        let _guard = tch::no_grad_guard();
        let td_error = pred
            .f_detach()?
            .f_sub(&target)?
            .f_abs()?
            .f_max_dim(0, false)?
            .0;
        Ok(SACLossOutput {
            loss_actor,
            loss_qvalue,
            loss_alpha,
            alpha,
            entropy: log_prob.f_mean(None)?.f_neg()?,
            td_error,
            loss_value: None,
        })
    }
}

impl TargetNetworks for DiscreteSACLoss {
    fn target_params(&self) -> Vec<&TargetParams> {
        self.qvalues
            .iter()
            .filter_map(|q| q.target_params())
            .collect()
    }
}
