//! The advantage actor-critic loss: [`A2CLoss`] (TorchRL's `A2CLoss`, 0.14.1).

use tch::Tensor;

use crate::error::{Error, Result};
use crate::objectives::common::LossOutput;
use crate::rng::Generator;
use crate::tensordict::TensorDict;

use super::common::{OnPolicyPrepared, PpoCommon};
use super::{named_some, PpoConfig, PpoLoss, PpoObjective};

/// The output of [`A2CLoss`] (TorchRL's output tensordict, typed).
///
/// # Shapes
/// With [`Reduction::Mean`](crate::objectives::Reduction::Mean) /
/// [`Reduction::Sum`](crate::objectives::Reduction::Sum) every `loss_*` and `entropy` is `[]`;
/// with [`Reduction::None`](crate::objectives::Reduction::None) the `loss_*` terms keep the
/// per-sample shape with the trailing singleton squeezed.
#[derive(Debug)]
pub struct A2CLossOutput {
    /// `-log π(a|s) · A`, reduced (the advantage is not detached: TorchRL's A2C reads it as
    /// stored, which the value estimator writes without gradient).
    pub loss_objective: Tensor,
    /// `critic_coeff · distance(value_target, V(s))`, reduced; `None` without a critic (or
    /// with `critic_coeff = 0`).
    pub loss_critic: Option<Tensor>,
    /// The mean entropy (detached); `None` without the entropy bonus.
    pub entropy: Option<Tensor>,
    /// `-entropy_coeff · entropy`, reduced; `None` without the entropy bonus.
    pub loss_entropy: Option<Tensor>,
    /// The fraction of values clipped by `clip_value` (detached); `None` without it.
    pub value_clip_fraction: Option<Tensor>,
}

impl LossOutput for A2CLossOutput {
    fn loss_terms(&self) -> Vec<(&'static str, &Tensor)> {
        named_some(
            vec![("loss_objective", &self.loss_objective)],
            [
                ("loss_critic", &self.loss_critic),
                ("loss_entropy", &self.loss_entropy),
            ],
        )
    }

    fn metrics(&self) -> Vec<(&'static str, &Tensor)> {
        named_some(
            Vec::new(),
            [
                ("entropy", &self.entropy),
                ("value_clip_fraction", &self.value_clip_fraction),
            ],
        )
    }
}

/// A2C's objective, `-log π(a|s) · A`: no importance weight (the data is on-policy), so no
/// behaviour log-prob is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct A2c;

/// TorchRL's `A2CLoss`: the policy-gradient objective `-log π(a|s) · A`, the entropy bonus
/// `-entropy_coeff · H(π(·|s))` and the critic loss `critic_coeff · d(value_target, V(s))`,
/// sharing the PPO losses' settings, keys and value estimator ([`PpoLoss`]).
///
/// What [`forward`](crate::objectives::LossModule::forward) does:
/// 1. Reads the advantage, or runs the value estimator (default GAE, γ = 0.99, λ = 0.95, as
///    TorchRL's `A2CLoss.default_value_estimator`) on a copy of the input.
/// 2. `log π(a|s)` of the stored action under the current actor, `[*B, 1]`; a stored action
///    that requires grad is refused (as TorchRL).
/// 3. The objective, the entropy bonus and the critic loss, each reduced and its trailing
///    singleton squeezed.
///
/// Settings as TorchRL's constructor: `entropy_bonus` (default on), `samples_mc_entropy`,
/// `entropy_coeff` (0.01), `critic_coeff` (1.0; 0 disables the critic loss, TorchRL's
/// `None`), `loss_critic_type` (smooth L1), `clip_value`, `reduction`, and `advantage_norm`
/// ([`with_advantage_norm`](PpoLoss::with_advantage_norm): a running normaliser whose scale
/// divides the advantage). TorchRL's A2C has no `normalize_advantage`: setting it is an error. `out_keys`: `loss_objective`, `loss_critic`, `entropy`,
/// `loss_entropy` (and `value_clip_fraction` with `clip_value`).
///
/// ```
/// use tch::{Kind, Tensor};
/// use torchrl::modules::{from_fn, DistributionBuilder, ProbabilisticActor};
/// use torchrl::objectives::{A2CLoss, LossModule};
/// use torchrl::TensorDict;
/// # fn main() -> torchrl::Result<()> {
/// // a unit Gaussian policy centred on `w · observation`, a critic `V(s) = 0`
/// let w = Tensor::from_slice(&[0.5f64]).set_requires_grad(true);
/// let wc = w.shallow_clone();
/// let net = from_fn(["observation"], ["loc", "scale"], move |x: &[&Tensor]| {
///     Ok(vec![x[0].f_mul(&wc)?, x[0].f_ones_like()?])
/// })?;
/// let actor = ProbabilisticActor::new(net, DistributionBuilder::normal("loc", "scale")?);
/// let critic = from_fn(["observation"], ["state_value"], |x: &[&Tensor]| {
///     Ok(vec![x[0].f_zeros_like()?])
/// })?;
/// let loss = A2CLoss::new(actor, critic).with_entropy_bonus(false);
/// let td = TensorDict::new([2])?
///     .with("observation", Tensor::from_slice(&[2.0f64, -2.0]).view([2, 1]))?
///     .with("action", Tensor::from_slice(&[1.0f64, -1.0]).view([2, 1]))?
///     .with("advantage", Tensor::from_slice(&[1.0f64, 3.0]).view([2, 1]))?
///     .with("value_target", Tensor::from_slice(&[1.0f64, 0.5]).view([2, 1]))?;
/// let out = loss.forward(&td)?;
/// // both actions sit on the mean: log π = -½ ln 2π, so the objective is ½ ln 2π · mean(A)
/// let half_ln_2pi = 0.5 * (2.0 * std::f64::consts::PI).ln();
/// assert!((out.loss_objective.double_value(&[]) - half_ln_2pi * 2.0).abs() < 1e-12);
/// // smooth L1 of (1, 0.5) against 0: mean(0.5, 0.125)
/// let critic = out.loss_critic.expect("a critic");
/// assert!((critic.double_value(&[]) - 0.3125).abs() < 1e-12);
/// # Ok(()) }
/// ```
pub type A2CLoss = PpoLoss<A2c>;

impl A2c {
    fn refuse_normalize_advantage(config: &PpoConfig) -> Result<()> {
        if config.normalize_advantage {
            return Err(Error::config(
                Self::NAME,
                "normalize_advantage",
                "false (TorchRL's A2CLoss has no normalize_advantage; standardise the \
                 advantage before the loss)",
                true,
            ));
        }
        Ok(())
    }
}

impl PpoObjective for A2c {
    type Output = A2CLossOutput;
    const NAME: &'static str = "A2CLoss";
    const READS_DIST_PARAMS: bool = false;
    const READS_SAMPLE_LOG_PROB: bool = false;

    fn from_config(_config: &PpoConfig) -> Self {
        A2c
    }

    fn validate(config: &PpoConfig) -> Result<()> {
        config.validate_shared(Self::NAME)?;
        Self::refuse_normalize_advantage(config)
    }

    fn out_keys(&self, common: &PpoCommon) -> Vec<&'static str> {
        let mut k = vec!["loss_objective"];
        if common.has_critic() {
            k.push("loss_critic");
        }
        if common.config.entropy_bonus {
            k.extend(["entropy", "loss_entropy"]);
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
        gen: &mut Generator,
    ) -> Result<A2CLossOutput> {
        // `with_normalize_advantage` does not validate: refuse it here
        Self::refuse_normalize_advantage(&b.config)?;
        let OnPolicyPrepared {
            td,
            advantage,
            log_prob,
            dist,
        } = b.prepare_log_prob(td)?;
        let loss_objective = b.reduce(&log_prob.f_mul(&advantage)?.f_neg()?)?;
        let (loss_entropy, entropy) = b.entropy_terms(dist.as_ref(), gen)?;
        let (loss_critic, value_clip_fraction, _) = b.critic_terms(&td)?;
        Ok(A2CLossOutput {
            loss_objective,
            loss_critic,
            entropy,
            loss_entropy,
            value_clip_fraction,
        })
    }
}
