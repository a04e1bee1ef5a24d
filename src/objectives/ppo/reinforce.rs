//! The REINFORCE loss with a learned baseline: [`ReinforceLoss`] (TorchRL's `ReinforceLoss`,
//! 0.14.1).

use tch::Tensor;

use crate::error::{Error, Result};
use crate::modules::module::TensorDictModule;
use crate::objectives::common::LossOutput;
use crate::objectives::target::TargetParams;
use crate::rng::Generator;
use crate::tensordict::TensorDict;

use super::common::{OnPolicyPrepared, PpoCommon};
use super::{named_some, PpoConfig, PpoLoss, PpoObjective};

/// The output of [`ReinforceLoss`] (TorchRL's output tensordict, typed).
///
/// # Shapes
/// With [`Reduction::Mean`](crate::objectives::Reduction::Mean) /
/// [`Reduction::Sum`](crate::objectives::Reduction::Sum) both losses are `[]`; with
/// [`Reduction::None`](crate::objectives::Reduction::None) they keep the per-sample shape with
/// the trailing singleton squeezed.
#[derive(Debug)]
pub struct ReinforceLossOutput {
    /// `-log π(a|s) · A` with the advantage detached, reduced.
    pub loss_actor: Tensor,
    /// `distance(value_target, V(s))`, reduced; `None` for a loss built
    /// [`without_critic`](PpoLoss::without_critic) (TorchRL requires a critic).
    pub loss_value: Option<Tensor>,
    /// The fraction of values clipped by `clip_value` (detached); `None` without it.
    pub value_clip_fraction: Option<Tensor>,
}

impl LossOutput for ReinforceLossOutput {
    fn loss_terms(&self) -> Vec<(&'static str, &Tensor)> {
        named_some(
            vec![("loss_actor", &self.loss_actor)],
            [("loss_value", &self.loss_value)],
        )
    }

    fn metrics(&self) -> Vec<(&'static str, &Tensor)> {
        named_some(
            Vec::new(),
            [("value_clip_fraction", &self.value_clip_fraction)],
        )
    }
}

/// REINFORCE's objective, `-log π(a|s) · stop_gradient(A)`: no entropy bonus, no critic
/// coefficient, no behaviour log-prob.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reinforce;

/// TorchRL's `ReinforceLoss`: the actor loss `-log π(a|s) · A` (advantage detached) and the
/// baseline's loss `d(value_target, V(s))`, on [`PpoLoss`]'s keys, value estimator and
/// reductions.
///
/// What [`forward`](crate::objectives::LossModule::forward) does: reads the advantage, or runs
/// the value estimator (default GAE, γ = 0.99, λ = 0.95, as TorchRL's
/// `ReinforceLoss.default_value_estimator`) on a copy of the input; takes `log π(a|s)` of the
/// stored action, `[*B, 1]`; then `loss_actor` and `loss_value`, each reduced and its
/// trailing singleton squeezed.
///
/// Settings as TorchRL's constructor: `loss_critic_type` (smooth L1), `clip_value`,
/// `reduction`. The settings TorchRL's REINFORCE does not have are refused (named errors):
/// an entropy bonus, a critic coefficient other than 1, `normalize_advantage`,
/// `advantage_norm`. TorchRL's `delay_value` (a target critic that gives the estimator the
/// next state's value, default off) is [`with_target_critic`](PpoLoss::with_target_critic).
/// `out_keys`: `loss_actor`, `loss_value` (and `value_clip_fraction` with `clip_value`).
///
/// ```
/// use tch::Tensor;
/// use torchrl::modules::{from_fn, DistributionBuilder, ProbabilisticActor};
/// use torchrl::objectives::{LossModule, ReinforceLoss};
/// use torchrl::TensorDict;
/// # fn main() -> torchrl::Result<()> {
/// let net = from_fn(["observation"], ["loc", "scale"], |x: &[&Tensor]| {
///     Ok(vec![x[0].f_zeros_like()?, x[0].f_ones_like()?])
/// })?;
/// let actor = ProbabilisticActor::new(net, DistributionBuilder::normal("loc", "scale")?);
/// let critic = from_fn(["observation"], ["state_value"], |x: &[&Tensor]| {
///     Ok(vec![x[0].f_zeros_like()?])
/// })?;
/// let loss = ReinforceLoss::new(actor, critic);
/// let td = TensorDict::new([1])?
///     .with("observation", Tensor::from_slice(&[0.3f64]).view([1, 1]))?
///     .with("action", Tensor::from_slice(&[0.0f64]).view([1, 1]))?
///     .with("advantage", Tensor::from_slice(&[2.0f64]).view([1, 1]))?
///     .with("value_target", Tensor::from_slice(&[3.0f64]).view([1, 1]))?;
/// let out = loss.forward(&td)?;
/// // log N(0; 0, 1) = -½ ln 2π; the actor loss is its negative times A = 2
/// let expected = (2.0 * std::f64::consts::PI).ln();
/// assert!((out.loss_actor.double_value(&[]) - expected).abs() < 1e-12);
/// // smooth L1 of 3 against 0: 3 - ½
/// assert!((out.loss_value.expect("a critic").double_value(&[]) - 2.5).abs() < 1e-12);
/// // an entropy bonus is not REINFORCE's: refused, naming the field
/// let loss = loss.with_entropy_bonus(true);
/// assert!(loss.forward(&td).unwrap_err().to_string().contains("entropy_bonus"));
/// # Ok(()) }
/// ```
pub type ReinforceLoss = PpoLoss<Reinforce>;

impl Reinforce {
    fn check(config: &PpoConfig) -> Result<()> {
        let op = Self::NAME;
        if config.entropy_bonus {
            return Err(Error::config(
                op,
                "entropy_bonus",
                "false (TorchRL's ReinforceLoss has no entropy bonus)",
                true,
            ));
        }
        if config.critic_coeff != 1.0 {
            return Err(Error::config(
                op,
                "critic_coeff",
                "1.0 (TorchRL's ReinforceLoss does not scale its value loss)",
                config.critic_coeff,
            ));
        }
        if config.normalize_advantage {
            return Err(Error::config(
                op,
                "normalize_advantage",
                "false (TorchRL's ReinforceLoss has no normalize_advantage)",
                true,
            ));
        }
        Ok(())
    }
}

impl PpoObjective for Reinforce {
    type Output = ReinforceLossOutput;
    const NAME: &'static str = "ReinforceLoss";
    const READS_DIST_PARAMS: bool = false;
    const READS_SAMPLE_LOG_PROB: bool = false;
    const TAKES_ADVANTAGE_NORM: bool = false;

    fn default_config() -> PpoConfig {
        PpoConfig {
            entropy_bonus: false,
            ..PpoConfig::default()
        }
    }

    fn from_config(_config: &PpoConfig) -> Self {
        Reinforce
    }

    fn validate(config: &PpoConfig) -> Result<()> {
        config.validate_shared(Self::NAME)?;
        Self::check(config)
    }

    fn out_keys(&self, common: &PpoCommon) -> Vec<&'static str> {
        let mut k = vec!["loss_actor"];
        if common.has_critic() {
            k.push("loss_value");
        }
        if common.config.clip_value.is_some() {
            k.push("value_clip_fraction");
        }
        k
    }

    fn forward(
        &self,
        b: &PpoCommon,
        td: &TensorDict,
        _gen: &mut Generator,
    ) -> Result<ReinforceLossOutput> {
        // the infallible builders (`with_entropy_bonus`, …) do not validate: check here
        Self::check(&b.config)?;
        let OnPolicyPrepared {
            td,
            advantage,
            log_prob,
            ..
        } = b.prepare_log_prob(td)?;
        let loss_actor = b.reduce(&log_prob.f_mul(&advantage.f_detach()?)?.f_neg()?)?;
        let (loss_value, value_clip_fraction, _) = b.critic_terms(&td)?;
        Ok(ReinforceLossOutput {
            loss_actor,
            loss_value,
            value_clip_fraction,
        })
    }
}

impl PpoLoss<Reinforce> {
    /// TorchRL's `delay_value=True`: the value estimator takes the next state's value from
    /// `target`, a copy of the critic whose parameters `params` pairs with the online
    /// critic's (e.g. [`TargetParams::from_path`] over the online critic's path and the
    /// target's own var store); the online values are copied into the target here, and an
    /// updater ([`SoftUpdate`](crate::objectives::SoftUpdate) /
    /// [`HardUpdate`](crate::objectives::HardUpdate) over this loss) moves them later. The
    /// value at the current state and `loss_value` use the online critic. Errors on a loss
    /// with a shared trunk, or when `params` is empty.
    ///
    /// ```
    /// use tch::{nn, Device, Kind, Tensor};
    /// use torchrl::modules::{from_fn, DistributionBuilder, ProbabilisticActor, TdModule};
    /// use torchrl::objectives::{LossModule, ReinforceLoss, SoftUpdate, TargetParams, TargetNetworks};
    /// use torchrl::TensorDict;
    /// # fn main() -> torchrl::Result<()> {
    /// let net = from_fn(["observation"], ["loc", "scale"], |x: &[&Tensor]| {
    ///     Ok(vec![x[0].f_zeros_like()?, x[0].f_ones_like()?])
    /// })?;
    /// let actor = ProbabilisticActor::new(net, DistributionBuilder::normal("loc", "scale")?);
    /// let critic_of = |p: nn::Path| TdModule::new(nn::linear(p, 1, 1, Default::default()), ["observation"], ["state_value"]);
    /// let vs = nn::VarStore::new(Device::Cpu);
    /// let target_vs = nn::VarStore::new(Device::Cpu);
    /// let critic = critic_of(vs.root() / "critic")?;
    /// let target = critic_of(target_vs.root())?;
    /// let params = TargetParams::from_path(&(vs.root() / "critic"), &target_vs)?;
    /// let loss = ReinforceLoss::new(actor, critic).with_target_critic(target, params)?;
    /// assert_eq!(loss.target_params().len(), 1);
    /// let mut updater = SoftUpdate::new(&loss, None, Some(0.1))?;
    /// let f = (Kind::Float, Device::Cpu);
    /// // one 4-step trajectory ([*B, T] for the default GAE)
    /// let td = TensorDict::new([1, 4])?
    ///     .with("observation", Tensor::randn([1, 4, 1], f))?
    ///     .with("action", Tensor::randn([1, 4, 1], f))?
    ///     .with(("next", "observation"), Tensor::randn([1, 4, 1], f))?
    ///     .with(("next", "reward"), Tensor::ones([1, 4, 1], f))?
    ///     .with(("next", "done"), Tensor::zeros([1, 4, 1], (Kind::Bool, Device::Cpu)))?
    ///     .with(("next", "terminated"), Tensor::zeros([1, 4, 1], (Kind::Bool, Device::Cpu)))?;
    /// let out = loss.forward(&td)?;
    /// assert!(out.loss_value.is_some());
    /// updater.step()?;
    /// # Ok(()) }
    /// ```
    pub fn with_target_critic(
        mut self,
        target: impl TensorDictModule + 'static,
        params: TargetParams,
    ) -> Result<Self> {
        let op = Reinforce::NAME;
        if self.common.trunk.is_some() {
            return Err(Error::invalid(
                op,
                "a target critic with a shared trunk is not supported (TorchRL's \
                 ReinforceLoss has no shared trunk); build the loss with new(actor, critic)",
            ));
        }
        if self.common.critic.is_none() {
            return Err(Error::invalid(
                op,
                "a target critic needs an online critic (the loss was built without_critic)",
            ));
        }
        if params.is_empty() {
            return Err(Error::invalid(
                op,
                "the target critic's parameter pairs are empty: nothing would track the \
                 online critic",
            ));
        }
        self.common.target_critic = Some((Box::new(target), params));
        Ok(self)
    }
}
