//! What every PPO loss shares ([`PpoCommon`]): the networks, the settings, the keys, the
//! value estimator and the loss's own generator, and the computations both objectives start
//! from (advantage, log-weight, entropy bonus, critic loss).

use std::cell::RefCell;
use std::fmt;

use tch::{Kind, Tensor};

use crate::error::{Error, Result, ShapeFmt};
use crate::modules::actors::ProbabilisticActor;
use crate::modules::distributions::Distribution;
use crate::modules::module::TensorDictModule;
use crate::modules::sequential::chain_in_keys;
use crate::modules::value_norm::ValueNorm;
use crate::modules::ProbabilisticTensorDictModule;
use crate::objectives::common::ensure_finite;
use crate::objectives::target::TargetParams;
use crate::objectives::value::{forward_value_estimator_keys, ValueEstimator, GAE};
use crate::rng::Generator;
use crate::tensordict::{NestedKey, TensorDict};

use super::{PpoConfig, PpoKeys};

/// The state every PPO loss shares (TorchRL's `PPOLoss` base): the actor, the critic, the
/// shared trunk of an [`ActorValueOperator`](crate::modules::ActorValueOperator), the
/// [`PpoConfig`], the keys, the value estimator and the generator of the Monte-Carlo
/// estimates. Reached through [`PpoLoss`](super::PpoLoss); public only because
/// [`PpoObjective`](super::PpoObjective) implementations receive it.
pub struct PpoCommon {
    pub(crate) name: &'static str,
    pub(crate) actor: ProbabilisticActor,
    pub(crate) critic: Option<Box<dyn TensorDictModule>>,
    /// The trunk shared by actor and critic: runs once per forward, before both.
    pub(crate) trunk: Option<Box<dyn TensorDictModule>>,
    pub(crate) config: PpoConfig,
    pub(crate) keys: PpoKeys,
    pub(crate) in_keys: Vec<NestedKey>,
    pub(crate) value_estimator: Option<Box<dyn ValueEstimator + Send>>,
    /// The generator `forward` draws from (`forward_with_generator` takes one instead).
    pub(crate) gen: RefCell<Generator>,
    /// Whether the distribution's parameter keys are inputs (KLPEN reads the behaviour
    /// policy's parameters from the data).
    pub(crate) reads_dist_params: bool,
    /// Whether the behaviour policy's log-prob is an input (the PPO losses' importance
    /// weights; A2C and REINFORCE are on-policy and do not read it).
    pub(crate) reads_sample_log_prob: bool,
    /// TorchRL's `advantage_norm`: a running normaliser of the value targets whose scale
    /// divides the advantage (updated when the loss estimates the advantage itself).
    pub(crate) advantage_norm: Option<RefCell<Box<dyn ValueNorm>>>,
    /// TorchRL's `delay_value` (REINFORCE): a target copy of the critic that gives the value
    /// estimator the next state's value, with the parameter pairs an updater moves.
    pub(crate) target_critic: Option<(Box<dyn TensorDictModule>, TargetParams)>,
}

/// Whether the trunk has already run on the tensordict handed to the estimator.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum TrunkDone {
    /// The trunk's outputs are in the tensordict.
    Yes,
    /// They are not: run it first.
    No,
}

impl PpoCommon {
    pub(crate) fn new(
        name: &'static str,
        actor: ProbabilisticActor,
        critic: Option<Box<dyn TensorDictModule>>,
        trunk: Option<Box<dyn TensorDictModule>>,
        reads_dist_params: bool,
        reads_sample_log_prob: bool,
        config: PpoConfig,
    ) -> Self {
        let keys = PpoKeys {
            action: actor.action_key().clone(),
            sample_log_prob: actor.log_prob_key(),
            ..PpoKeys::default()
        };
        let mut common = PpoCommon {
            name,
            actor,
            critic,
            trunk,
            gen: RefCell::new(Generator::new(config.seed)),
            config,
            keys,
            in_keys: Vec::new(),
            value_estimator: None,
            reads_dist_params,
            reads_sample_log_prob,
            advantage_norm: None,
            target_critic: None,
        };
        common.in_keys = common.compute_in_keys(&common.keys);
        common
    }

    fn bad(&self, message: impl Into<String>) -> Error {
        Error::invalid(self.name, message.into())
    }

    /// Takes a (validated) config; a new seed reseeds the generator.
    pub(crate) fn set_config(&mut self, config: PpoConfig) {
        if config.seed != self.config.seed {
            self.gen = RefCell::new(Generator::new(config.seed));
        }
        self.config = config;
    }

    pub(crate) fn reseed(&mut self, seed: u64) {
        self.config.seed = seed;
        self.gen = RefCell::new(Generator::new(seed));
    }

    pub(crate) fn debug_fields(&self, d: &mut fmt::DebugStruct<'_, '_>) {
        d.field("actor", &self.actor)
            .field("critic", &self.critic.as_ref().map(|c| c.out_keys()))
            .field("trunk", &self.trunk.as_ref().map(|c| c.out_keys()))
            .field("config", &self.config)
            .field("keys", &self.keys)
            .field(
                "value_estimator",
                &self.value_estimator.as_ref().map(|e| e.name()),
            )
            .field(
                "advantage_norm",
                &self.advantage_norm.as_ref().map(|n| n.borrow().name()),
            );
    }

    /// Runs the shared trunk (if any) on `td`.
    pub(crate) fn run_trunk(&self, td: TensorDict) -> Result<TensorDict> {
        match &self.trunk {
            Some(t) => t.forward(td),
            None => Ok(td),
        }
    }

    pub(crate) fn has_critic(&self) -> bool {
        self.critic.is_some() && self.config.critic_coeff > 0.0
    }

    /// `k`, then the `out_keys` every PPO loss shares (entropy, critic, value clipping).
    pub fn out_keys(&self, mut k: Vec<&'static str>) -> Vec<&'static str> {
        if self.config.entropy_bonus {
            k.extend(["entropy", "loss_entropy"]);
        }
        if self.has_critic() {
            k.push("loss_critic");
        }
        if self.config.clip_value.is_some() {
            k.push("value_clip_fraction");
        }
        k
    }

    pub(crate) fn forward_keys(keys: &PpoKeys, estimator: &mut dyn ValueEstimator) -> Result<()> {
        forward_value_estimator_keys(keys, estimator)?;
        if estimator.accepts_key("sample_log_prob") {
            estimator.set_keys(&[("sample_log_prob", Some(keys.sample_log_prob.clone()))])?;
        }
        Ok(())
    }

    pub(crate) fn make_value_estimator(
        &mut self,
        mut estimator: Box<dyn ValueEstimator + Send>,
    ) -> Result<()> {
        Self::forward_keys(&self.keys, estimator.as_mut())?;
        self.value_estimator = Some(estimator);
        Ok(())
    }

    pub(crate) fn set_tensor_keys(&mut self, keys: PpoKeys) -> Result<()> {
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

    /// TorchRL's `_set_in_keys` (first occurrence order, no duplicates); with a shared trunk,
    /// the trunk's in keys stand for the keys it writes.
    fn compute_in_keys(&self, keys: &PpoKeys) -> Vec<NestedKey> {
        let mut out: Vec<NestedKey> = Vec::new();
        let mut push = |k: NestedKey| {
            if !out.contains(&k) {
                out.push(k);
            }
        };
        let mut modules: Vec<&dyn TensorDictModule> = Vec::new();
        modules.extend(self.trunk.as_deref());
        modules.push(&self.actor);
        let actor_in = chain_in_keys(modules.iter().copied());
        for k in &actor_in {
            push(k.clone());
        }
        for k in &actor_in {
            push(k.prefixed("next"));
        }
        if let Some(c) = &self.critic {
            let mut modules: Vec<&dyn TensorDictModule> = Vec::new();
            modules.extend(self.trunk.as_deref());
            modules.push(c.as_ref());
            for k in chain_in_keys(modules) {
                push(k);
            }
        }
        push(keys.action.clone());
        if self.reads_sample_log_prob {
            push(keys.sample_log_prob.clone());
        }
        push(keys.reward.prefixed("next"));
        push(keys.done.prefixed("next"));
        push(keys.terminated.prefixed("next"));
        if self.reads_dist_params {
            for k in self.actor.dist_keys() {
                push(k);
            }
        }
        out
    }

    pub(crate) fn entry<'a>(&self, td: &'a TensorDict, key: &NestedKey) -> Result<&'a Tensor> {
        td.get(key).ok_or_else(|| {
            let available = td
                .keys(crate::tensordict::KeysOptions::nested_leaves())
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

    /// Computes the advantage with the value estimator on `td` (modified in place); the
    /// trunk, if any, runs on the root unless `trunk` says it has, and on `"next"`.
    pub(crate) fn estimate_advantage(
        &self,
        td: &mut TensorDict,
        trunk: TrunkDone,
    ) -> Result<Tensor> {
        let Some(critic) = &self.critic else {
            return Err(self.bad(format!(
                "the advantage ({}) is missing and there is no critic network to compute it",
                self.keys.advantage
            )));
        };
        {
            // TorchRL runs the estimator with detached critic parameters.
            let _guard = tch::no_grad_guard();
            let root = match trunk {
                TrunkDone::Yes => td.clone(),
                TrunkDone::No => self.run_trunk(td.clone())?,
            };
            let v = self.critic_value(critic.as_ref(), &root)?.f_detach()?;
            let next = td.get_dict("next").ok_or_else(|| {
                self.bad(format!(
                    "the advantage ({}) is missing and the \"next\" sub-tensordict the value \
                     estimator needs is absent",
                    self.keys.advantage
                ))
            })?;
            let next = self.run_trunk(next.clone())?;
            let next_critic = match &self.target_critic {
                Some((target, _)) => target.as_ref(),
                None => critic.as_ref(),
            };
            let nv = self.critic_value(next_critic, &next)?.f_detach()?;
            td.set(&self.keys.value, v)?;
            td.set(self.keys.value.prefixed("next"), nv)?;
        }
        match &self.value_estimator {
            Some(est) => est.forward(td)?,
            None => {
                let mut gae = GAE::new(0.99, 0.95)?;
                Self::forward_keys(&self.keys, &mut gae)?;
                gae.forward(td)?;
            }
        }
        Ok(self.entry(td, &self.keys.advantage)?.shallow_clone())
    }

    /// The advantage read from `td`, or estimated on it (then `true`: the estimator has
    /// written the value target). The trunk has run on the root already.
    fn read_or_estimate_advantage(&self, td: &mut TensorDict) -> Result<(Tensor, bool)> {
        let (advantage, estimated) = match td.get(&self.keys.advantage) {
            Some(a) => (a.shallow_clone(), false),
            None => (self.estimate_advantage(td, TrunkDone::Yes)?, true),
        };
        if self.config.check_finite {
            ensure_finite(self.name, &self.keys.advantage, &advantage)?;
        }
        Ok((advantage, estimated))
    }

    /// TorchRL's `_scale_advantage`: with an `advantage_norm`, the advantage divided by its
    /// scale, after folding the value target into it when the loss estimated the advantage
    /// (`update`; rows that a validity mask — `("collector", "mask")`, `"shifted_valid"` —
    /// marks invalid are left out). Without one, the advantage unchanged.
    pub(crate) fn scale_advantage(
        &self,
        advantage: Tensor,
        td: &TensorDict,
        update: bool,
    ) -> Result<Tensor> {
        let Some(norm) = &self.advantage_norm else {
            return Ok(advantage);
        };
        if update {
            let target = td.get(&self.keys.value_target).ok_or_else(|| {
                self.bad(format!(
                    "advantage_norm needs the value target ({}) to update its statistics; the \
                     value estimator writes it",
                    self.keys.value_target
                ))
            })?;
            let target = valid_rows(target, td)?;
            norm.borrow_mut()
                .update(&target)
                .map_err(|e| e.context(format!("{}: updating advantage_norm", self.name)))?;
        }
        let scale = norm.borrow().scale()?;
        Ok(advantage.f_div(&scale.f_to_kind(advantage.kind())?)?)
    }

    /// The advantage (read, or estimated on `td`), rescaled by `advantage_norm` or
    /// standardised with `normalize_advantage`.
    fn advantage(&self, td: &mut TensorDict) -> Result<Tensor> {
        let (advantage, estimated) = self.read_or_estimate_advantage(td)?;
        if self.advantage_norm.is_some() {
            if self.config.normalize_advantage {
                return Err(Error::config(
                    self.name,
                    "normalize_advantage",
                    "false with an advantage_norm (TorchRL: the two are mutually exclusive)",
                    true,
                ));
            }
            return self.scale_advantage(advantage, td, estimated);
        }
        if self.config.normalize_advantage && advantage.numel() > 1 {
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
        let prev_log_prob = self.entry(td, &self.keys.sample_log_prob).map_err(|e| {
            e.context(format!(
                "{}: the behaviour policy's log-prob {} is missing; collect with an actor that \
                 writes it (ProbabilisticActor::with_return_log_prob(true)), or point the loss \
                 at the right key (set_keys sample_log_prob)",
                self.name, self.keys.sample_log_prob
            ))
        })?;
        if self.config.check_finite {
            ensure_finite(self.name, &self.keys.sample_log_prob, prev_log_prob)?;
        }
        if prev_log_prob.requires_grad() {
            return Err(Error::value(
                self.name,
                &self.keys.sample_log_prob,
                "the behaviour policy's stored log-prob, detached",
                "a tensor that requires grad (tensordict stored it with its graph)",
            ));
        }
        let dist = self.actor.get_dist(td)?;
        let action = self.entry(td, &self.keys.action)?;
        let log_prob = dist.log_prob(action)?;
        if prev_log_prob.size() != log_prob.size() {
            // a [*B] log-prob against a [*B, 1] one would broadcast into [*B, *B]
            return Err(Error::ShapeMismatch {
                op: self.name,
                key: format!(
                    "{} (the stored log-prob, against the actor's log-prob of {})",
                    self.keys.sample_log_prob, self.keys.action
                ),
                expected: log_prob.size(),
                actual: prev_log_prob.size(),
            });
        }
        let log_weight = log_prob.f_sub(prev_log_prob)?.f_unsqueeze(-1)?;
        let kl_approx = prev_log_prob.f_sub(&log_prob)?.f_unsqueeze(-1)?;
        Ok((log_weight, dist, kl_approx))
    }

    /// What every PPO forward starts with: a shallow copy of the input (the estimator may
    /// write to it), the advantage, and the log-weight with the current distribution.
    pub(crate) fn prepare(&self, td: &TensorDict) -> Result<Prepared> {
        // the shared trunk, if any, runs once here for the actor, the critic and the estimator
        if self.config.check_finite {
            self.check_inputs_finite(td)?;
        }
        let mut td = self.run_trunk(td.clone())?;
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

    /// What the on-policy objectives (A2C, REINFORCE) start with: a shallow copy of the input,
    /// the advantage (broadcast to the log-prob) and the current policy's log-prob of the
    /// stored action, `[*B, 1]` (or `[*B, A, 1]`), with its distribution. The advantage is
    /// never standardised here (TorchRL's A2C and REINFORCE have no `normalize_advantage`);
    /// A2C's `advantage_norm` rescales it.
    pub(crate) fn prepare_log_prob(&self, td: &TensorDict) -> Result<OnPolicyPrepared> {
        if self.config.check_finite {
            self.check_inputs_finite(td)?;
        }
        let mut td = self.run_trunk(td.clone())?;
        let (advantage, estimated) = self.read_or_estimate_advantage(&mut td)?;
        let advantage = self.scale_advantage(advantage, &td, estimated)?;
        let action = self.entry(&td, &self.keys.action)?;
        if action.requires_grad() {
            return Err(Error::value(
                self.name,
                &self.keys.action,
                "a stored action, detached",
                "a tensor that requires grad (tensordict stored it with its graph)",
            ));
        }
        let dist = self.actor.get_dist(&td)?;
        let log_prob = dist.log_prob(action)?.f_unsqueeze(-1)?;
        let advantage = self.broadcast_advantage(&advantage, &log_prob)?;
        Ok(OnPolicyPrepared {
            td,
            advantage,
            log_prob,
            dist,
        })
    }

    /// The advantage broadcast to the log-weight's shape (see [`broadcast_advantage`]), with
    /// the outer-product guard.
    fn broadcast_advantage(&self, advantage: &Tensor, log_weight: &Tensor) -> Result<Tensor> {
        let advantage = broadcast_advantage(advantage, log_weight)?;
        self.check_advantage_broadcast(&advantage, log_weight)?;
        self.check_advantage_shape(&advantage, log_weight)?;
        Ok(advantage)
    }

    /// The advantage must fit the log-weight (`[*B, 1]`, or the actor's event shape + 1):
    /// an advantage `[80, 3]` for a batch `[80]` would otherwise broadcast the log-weight
    /// `[80, 1]` into `[80, 3]` silently.
    fn check_advantage_shape(&self, advantage: &Tensor, log_weight: &Tensor) -> Result<()> {
        let (a, l) = (advantage.size(), log_weight.size());
        let fits = a.len() <= l.len()
            && a.iter()
                .rev()
                .zip(l.iter().rev())
                .all(|(x, y)| x == y || *x == 1);
        if fits {
            return Ok(());
        }
        Err(Error::ShapeMismatch {
            op: self.name,
            key: format!(
                "{} (the advantage must be the batch shape + [1], or broadcast to the \
                 log-weight's shape)",
                self.keys.advantage
            ),
            expected: l,
            actual: a,
        })
    }

    /// `check_finite`: the float inputs the loss reads, before anything runs.
    fn check_inputs_finite(&self, td: &TensorDict) -> Result<()> {
        let keys = [
            self.keys.advantage.clone(),
            self.keys.value_target.clone(),
            self.keys.sample_log_prob.clone(),
            self.keys.value.clone(),
            self.keys.reward.prefixed("next"),
            self.keys.value.prefixed("next"),
        ];
        for k in &keys {
            if let Some(t) = td.get(k) {
                ensure_finite(self.name, k, t)?;
            }
        }
        Ok(())
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

    /// The entropy of `dist`, `[*batch]`: analytic when available and finite, else the
    /// Monte-Carlo estimate `-mean_k log π(x_k)`.
    fn entropy(&self, dist: &dyn Distribution, gen: &mut Generator) -> Result<Tensor> {
        if let Ok(h) = dist.entropy() {
            let finite = h.f_isfinite()?.f_all()?.int64_value(&[]) != 0;
            if finite {
                return Ok(h);
            }
        }
        let n = [self.config.samples_mc_entropy];
        let x = if dist.has_rsample() {
            dist.rsample(gen, &n)?
        } else {
            dist.sample(gen, &n)?
        };
        Ok(dist
            .log_prob(&x)?
            .f_mean_dim([0i64].as_slice(), false, None::<Kind>)?
            .f_neg()?)
    }

    /// Reduces a `loss_*` term, then squeezes its trailing singleton dim.
    pub(crate) fn reduce(&self, t: &Tensor) -> Result<Tensor> {
        let r = self.config.reduction.apply(t)?;
        if r.dim() > 0 {
            Ok(r.f_squeeze_dim(-1)?)
        } else {
            Ok(r)
        }
    }

    /// `(loss_entropy, entropy)`, both `None` without the entropy bonus.
    pub(crate) fn entropy_terms(
        &self,
        dist: &dyn Distribution,
        gen: &mut Generator,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        if !self.config.entropy_bonus {
            return Ok((None, None));
        }
        let h = self.entropy(dist, gen)?.f_unsqueeze(-1)?;
        let mean_h = h.f_detach()?.f_mean(None)?;
        let loss = self.reduce(&h.f_mul_scalar(-self.config.entropy_coeff)?)?;
        Ok((Some(loss), Some(mean_h)))
    }

    /// `(loss_critic, value_clip_fraction, explained_variance)`; all `None` without a critic
    /// loss.
    pub(crate) fn critic_terms(&self, td: &TensorDict) -> Result<CriticTerms> {
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
        let old_value = match self.config.clip_value {
            Some(_) => Some(self.entry(td, &self.keys.value)?.shallow_clone()),
            None => None,
        };
        let value = self.critic_value(critic, td)?;
        if target.size() != value.size() {
            // e.g. a [*B] target against a [*B, 1] value would broadcast to [*B, *B]
            return Err(Error::ShapeMismatch {
                op: self.name,
                key: format!(
                    "{} (the value target, against the critic's {})",
                    self.keys.value_target, self.keys.value
                ),
                expected: value.size(),
                actual: target.size(),
            });
        }
        if self.config.check_finite {
            ensure_finite(self.name, &self.keys.value_target, target)?;
        }
        let distance =
            |t: &Tensor, v: &Tensor| self.config.loss_critic_type.distance(self.name, t, v);
        let mut loss = distance(target, &value)?;
        let mut clip_fraction = None;
        if let (Some(c), Some(old)) = (self.config.clip_value, &old_value) {
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
            loss.f_mul_scalar(self.config.critic_coeff)?,
            clip_fraction,
            explained_variance,
        ))
    }
}

/// The inputs of a PPO objective (see `PpoCommon::prepare`).
pub(crate) struct Prepared {
    pub(crate) td: TensorDict,
    pub(crate) advantage: Tensor,
    pub(crate) log_weight: Tensor,
    pub(crate) dist: Box<dyn Distribution>,
    pub(crate) kl_approx: Tensor,
}

/// The inputs of an on-policy objective (see `PpoCommon::prepare_log_prob`).
pub(crate) struct OnPolicyPrepared {
    pub(crate) td: TensorDict,
    pub(crate) advantage: Tensor,
    pub(crate) log_prob: Tensor,
    pub(crate) dist: Box<dyn Distribution>,
}

/// `(loss_critic, value_clip_fraction, explained_variance)`.
pub(crate) type CriticTerms = (Option<Tensor>, Option<Tensor>, Option<Tensor>);

/// The mean of a boolean mask as `kind`, without gradient.
pub(crate) fn detached_fraction(mask: &Tensor, kind: Kind) -> Result<Tensor> {
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

/// TorchRL's `_valid_value_target_rows`: the rows of `value_target` that every validity mask
/// present in `td` (`("collector", "mask")`, `"shifted_valid"`; trailing singleton dims
/// dropped) marks valid; all of them when no mask is present.
fn valid_rows(value_target: &Tensor, td: &TensorDict) -> Result<Tensor> {
    let mut mask: Option<Tensor> = None;
    let keys = [
        NestedKey::from(["collector", "mask"]),
        NestedKey::from("shifted_valid"),
    ];
    for key in &keys {
        let Some(entry) = td.get(key) else { continue };
        let mut entry = entry.f_to_kind(Kind::Bool)?;
        while entry.dim() >= value_target.dim() && entry.size().last() == Some(&1) {
            entry = entry.f_squeeze_dim(-1)?;
        }
        mask = Some(match mask {
            Some(m) => m.f_logical_and(&entry)?,
            None => entry,
        });
    }
    match mask {
        None => Ok(value_target.shallow_clone()),
        Some(m) => {
            let size = value_target.size();
            let lead = size.get(..m.dim()).unwrap_or(size.as_slice());
            if m.size().as_slice() != lead {
                return Err(Error::ShapeMismatch {
                    op: "advantage_norm",
                    key: "the validity mask, against the value target's leading dims".into(),
                    expected: lead.to_vec(),
                    actual: m.size(),
                });
            }
            Ok(value_target.f_index(&[Some(m)])?)
        }
    }
}
