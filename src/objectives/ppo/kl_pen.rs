//! The KL-penalty PPO loss: [`KLPENPPOLoss`] (TorchRL's `KLPENPPOLoss`).

use std::cell::Cell;

use tch::{Kind, Tensor};

use crate::error::{Error, Result};
use crate::modules::distributions::{kl_divergence, Distribution};
use crate::modules::ProbabilisticTensorDictModule;
use crate::objectives::common::LossOutput;
use crate::rng::Generator;
use crate::tensordict::TensorDict;

use super::common::PpoCommon;
use super::{ppo_loss_terms, ppo_metrics, PpoConfig, PpoLoss, PpoObjective};

/// The output of [`KLPENPPOLoss`] (TorchRL's output tensordict, typed).
///
/// # Shapes
/// `loss_*` as in [`PpoLossOutput`](super::PpoLossOutput); `kl` unreduced, `[*B, 1]` (or `[*B, A, 1]`);
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
        ppo_loss_terms(&self.loss_objective, &self.loss_entropy, &self.loss_critic)
    }

    fn metrics(&self) -> Vec<(&'static str, &Tensor)> {
        let head = vec![("kl", &self.kl), ("kl_approx", &self.kl_approx)];
        ppo_metrics(
            head,
            [
                &self.entropy,
                &self.value_clip_fraction,
                &self.explained_variance,
            ],
        )
    }
}

/// The KL-penalty objective: `-(exp(lw)·A - β·KL(π_old ‖ π))`, with its adaptive `β` and
/// the settings of [`PpoConfig`] (`dtarg`, `beta`, `increment`, `decrement`, `samples_mc_kl`).
#[derive(Debug, Clone, PartialEq)]
pub struct KlPen {
    dtarg: f64,
    beta_init: f64,
    beta: Cell<f64>,
    increment: f64,
    decrement: f64,
    samples_mc_kl: i64,
}

impl KlPen {
    /// `β`'s update after a forward whose mean KL is `kl`.
    fn adapt_beta(&self, kl: f64) {
        let factor = if kl > self.dtarg * 1.5 {
            self.increment
        } else if kl < self.dtarg / 1.5 {
            self.decrement
        } else {
            return;
        };
        self.beta.set(self.beta.get() * factor);
    }

    /// `KL(previous ‖ current)`, `[*B]` (or `[*B, A]`): closed form or Monte-Carlo.
    fn kl(
        &self,
        previous: &dyn Distribution,
        current: &dyn Distribution,
        gen: &mut Generator,
    ) -> Result<Tensor> {
        if let Some(kl) = kl_divergence(previous, current)? {
            return Ok(kl);
        }
        let x = previous.sample(gen, &[self.samples_mc_kl])?;
        let previous_lp = previous.log_prob(&x)?;
        let current_lp = current.log_prob(&x)?;
        Ok(previous_lp
            .f_sub(&current_lp)?
            .f_mean_dim([0i64].as_slice(), false, None::<Kind>)?)
    }
}

/// TorchRL's `build_dist_from_params`: the behaviour policy from the stored parameters.
fn previous_dist(b: &PpoCommon, td: &TensorDict) -> Result<Box<dyn Distribution>> {
    let keys = b.actor.dist_keys();
    if let Some(missing) = keys.iter().find(|k| td.get(*k).is_none()) {
        return Err(Error::invalid(
            b.name,
            format!(
                "The parameters of the distribution were not found ({missing} is missing; the \
                 distribution reads [{}]). Make sure they are provided to KLPENPPOLoss.",
                keys.iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ));
    }
    b.actor.build_dist(td)
}

/// TorchRL's `KLPENPPOLoss`: PPO with an adaptive KL penalty instead of a clipped ratio (see
/// the [module docs](super)).
///
/// What [`forward`](crate::objectives::LossModule::forward) does:
/// 1. Builds the behaviour policy's distribution `π_old` from the parameters stored in the
///    input (the actor's distribution keys, e.g. `loc`/`scale`: TorchRL's
///    `build_dist_from_params`); an error names them when absent.
/// 2. Reads or estimates the advantage (optionally standardised) and computes
///    `lw = log π(a|s) - log π_old(a|s)` exactly as [`ClipPPOLoss`](super::ClipPPOLoss) does.
/// 3. `kl = KL(π_old ‖ π)` in closed form when the pair has one ([`kl_divergence`]: Normal,
///    TanhNormal, Categorical, OneHotCategorical), else the Monte-Carlo estimate
///    `mean_k (log π_old(x_k) - log π(x_k))` over `samples_mc_kl` draws `x_k ~ π_old`; then
///    `unsqueeze(-1)`.
/// 4. `loss_objective = reduce(-(exp(lw)·A - β·kl))` with the current `β`.
/// 5. Adapts `β` for the next call: `β ← β·increment` if `mean(kl) > 1.5·dtarg`,
///    `β ← β·decrement` if `mean(kl) < dtarg/1.5` (unchanged otherwise, or when the KL is NaN;
///    TorchRL sets no bounds on β).
/// 6. The entropy bonus and the critic loss as in [`ClipPPOLoss`](super::ClipPPOLoss).
///
/// `β` is plain state of the loss's [`KlPen`] objective (a `Cell`: `forward` takes `&self`, as
/// [`LossModule::forward`](crate::objectives::LossModule::forward) does); [`beta`](PpoLoss::beta)
/// reads it, [`set_beta`](PpoLoss::set_beta) sets it and [`reset`](PpoLoss::reset) restores the
/// initial value ([`PpoConfig::beta`]).
///
/// **Divergence from TorchRL 0.14.1** (deliberate): TorchRL updates its `beta` buffer in
/// place (`beta.data *= increment`) after the penalty `beta * kl` entered the autograd graph,
/// so its backward pass multiplies the KL gradient by the *updated* `β` while the reported
/// loss used the old one. Here the gradient is the gradient of the reported loss (old `β`);
/// values are identical.
///
/// # Shapes
/// As [`ClipPPOLoss`](super::ClipPPOLoss); `kl` is per sample, `[*B, 1]` (or `[*B, A, 1]` for a per-dimension
/// log-prob such as [`Normal`](crate::modules::distributions::Normal)'s), not reduced.
///
/// # Errors
/// Those of [`ClipPPOLoss`](super::ClipPPOLoss), plus missing distribution parameters.
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
pub type KLPENPPOLoss = PpoLoss<KlPen>;

impl PpoLoss<KlPen> {
    /// The target KL (TorchRL's `dtarg`, default 0.01). Errors when negative or not finite.
    pub fn with_dtarg(self, dtarg: f64) -> Result<Self> {
        self.edit(|c| c.dtarg = dtarg)
    }

    /// The initial KL coefficient β (default 1.0); also the value [`reset`](Self::reset)
    /// restores. Errors when negative or not finite.
    pub fn with_beta(self, beta: f64) -> Result<Self> {
        let loss = self.edit(|c| c.beta = beta)?;
        loss.objective.beta.set(beta);
        Ok(loss)
    }

    /// The factor β is multiplied by when the KL exceeds `1.5·dtarg` (default 2.0). Errors
    /// unless finite and `>= 1` (TorchRL: "increment should be >= 1.0").
    pub fn with_increment(self, increment: f64) -> Result<Self> {
        self.edit(|c| c.increment = increment)
    }

    /// The factor β is multiplied by when the KL is below `dtarg/1.5` (default 0.5). Errors
    /// unless in `[0, 1]` (TorchRL: "decrement should be <= 1.0").
    pub fn with_decrement(self, decrement: f64) -> Result<Self> {
        self.edit(|c| c.decrement = decrement)
    }

    /// The number of draws of the Monte-Carlo KL estimate, used when the distribution pair has
    /// no closed form (default 1). Errors when `< 1`.
    pub fn with_samples_mc_kl(self, n: i64) -> Result<Self> {
        self.edit(|c| c.samples_mc_kl = n)
    }

    /// The current KL coefficient β (the one the next forward uses).
    pub fn beta(&self) -> f64 {
        self.objective.beta.get()
    }

    /// Sets the current β (the initial value [`reset`](Self::reset) restores is unchanged).
    pub fn set_beta(&mut self, beta: f64) {
        self.objective.beta.set(beta);
    }

    /// Restores β to its initial value (TorchRL's `reset`).
    pub fn reset(&self) {
        self.objective.beta.set(self.objective.beta_init);
    }

    /// The target KL.
    pub fn dtarg(&self) -> f64 {
        self.objective.dtarg
    }
}

impl PpoObjective for KlPen {
    type Output = KlPenPpoLossOutput;
    const NAME: &'static str = "KLPENPPOLoss";
    const READS_DIST_PARAMS: bool = true;

    fn from_config(config: &PpoConfig) -> Self {
        KlPen {
            dtarg: config.dtarg,
            beta_init: config.beta,
            beta: Cell::new(config.beta),
            increment: config.increment,
            decrement: config.decrement,
            samples_mc_kl: config.samples_mc_kl,
        }
    }

    fn validate(config: &PpoConfig) -> Result<()> {
        config.validate_kl_pen(Self::NAME)
    }

    /// The adapted β survives a config change that keeps the initial β.
    fn keep_state(&mut self, previous: &Self) {
        if self.beta_init == previous.beta_init {
            self.beta.set(previous.beta.get());
        }
    }

    fn out_keys(&self, common: &PpoCommon) -> Vec<&'static str> {
        common.out_keys(vec!["loss_objective", "kl"])
    }

    fn forward(
        &self,
        b: &PpoCommon,
        td: &TensorDict,
        gen: &mut Generator,
    ) -> Result<KlPenPpoLossOutput> {
        let previous = previous_dist(b, td)?;
        let p = b.prepare(td)?;
        let (td, advantage, log_weight, dist) = (p.td, p.advantage, p.log_weight, p.dist);

        let kl = self
            .kl(previous.as_ref(), dist.as_ref(), gen)?
            .f_unsqueeze(-1)?;
        let beta = self.beta.get();
        let neg_loss = log_weight
            .f_exp()?
            .f_mul(&advantage)?
            .f_sub(&kl.f_mul_scalar(beta)?)?;
        let kl = kl.f_detach()?;
        self.adapt_beta(kl.f_mean(None)?.f_double_value(&[])?);
        let loss_objective = b.reduce(&neg_loss.f_neg()?)?;
        let kl_approx = p.kl_approx.f_detach()?.f_mean(None)?;

        let (loss_entropy, entropy) = b.entropy_terms(dist.as_ref(), gen)?;
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
