//! The clipped-surrogate PPO loss: [`ClipPPOLoss`] (TorchRL's `ClipPPOLoss`).

use tch::Tensor;

use crate::error::Result;
use crate::objectives::common::LossOutput;
use crate::rng::Generator;
use crate::tensordict::TensorDict;

use super::common::{detached_fraction, PpoCommon, Prepared};
use super::{ppo_loss_terms, ppo_metrics, PpoConfig, PpoLoss, PpoObjective};

/// The output of [`ClipPPOLoss`] (TorchRL's output tensordict, typed).
///
/// # Shapes
/// With [`Reduction::Mean`](crate::objectives::Reduction::Mean) / [`Reduction::Sum`](crate::objectives::Reduction::Sum) every `loss_*` is `[]`; with
/// [`Reduction::None`](crate::objectives::Reduction::None) they keep the per-sample shape with the trailing singleton squeezed
/// (`[*B]`, or `[*B, A]` for a per-dimension log-prob such as [`Normal`]'s). Metrics are `[]`
/// except `ess` (`log_weight.squeeze(-1)` reduced over dim 0: `[]` for a `[B, 1]` log-weight,
/// `[A]` for `[B, A, 1]`) and `explained_variance` (`[1]` for `[B, 1]` values).
///
/// [`Normal`]: crate::modules::distributions::Normal
#[derive(Debug)]
pub struct PpoLossOutput {
    /// The clipped surrogate, `-min(r·A, clip(r)·A)`, reduced.
    pub loss_objective: Tensor,
    /// `-entropy_coeff · entropy`, reduced; `None` without the entropy bonus.
    pub loss_entropy: Option<Tensor>,
    /// `critic_coeff · distance`, reduced; `None` without a critic (or with `critic_coeff = 0`).
    pub loss_critic: Option<Tensor>,
    /// The fraction of log-weights the clamp changed (detached).
    pub clip_fraction: Tensor,
    /// The mean entropy (detached); `None` without the entropy bonus.
    pub entropy: Option<Tensor>,
    /// The effective sample size of the importance weights divided by the batch size:
    /// `exp(2·lse(lw) - lse(2·lw)) / B` (detached).
    pub ess: Tensor,
    /// `mean(log π_old - log π)` (detached).
    pub kl_approx: Tensor,
    /// `max(exp(lw))` (detached).
    pub max_ratio: Tensor,
    /// `mean(exp(lw))` (detached).
    pub mean_ratio: Tensor,
    /// The fraction of values clipped by `clip_value` (detached); `None` without it.
    pub value_clip_fraction: Option<Tensor>,
    /// `1 - var(target - V) / (var(target) + eps)` over dim 0 (detached); `None` without a
    /// critic loss.
    pub explained_variance: Option<Tensor>,
}

impl LossOutput for PpoLossOutput {
    fn loss_terms(&self) -> Vec<(&'static str, &Tensor)> {
        ppo_loss_terms(&self.loss_objective, &self.loss_entropy, &self.loss_critic)
    }

    fn metrics(&self) -> Vec<(&'static str, &Tensor)> {
        let optional = [
            &self.entropy,
            &self.value_clip_fraction,
            &self.explained_variance,
        ];
        let mut m = ppo_metrics(vec![("clip_fraction", &self.clip_fraction)], optional);
        m.push(("ESS", &self.ess));
        m.push(("kl_approx", &self.kl_approx));
        m.push(("max_ratio", &self.max_ratio));
        m.push(("mean_ratio", &self.mean_ratio));
        m
    }
}

/// The clipped objective: `-min(r·A, clip(r, 1-ε, 1+ε)·A)`, with ε from
/// [`PpoConfig::clip_epsilon`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Clip {
    clip_epsilon: f64,
}

/// TorchRL's `ClipPPOLoss` (see the [module docs](super)).
///
/// What [`forward`](crate::objectives::LossModule::forward) does:
/// 1. Reads the advantage, or runs the value estimator on a copy of the input (see
///    [`PpoLoss::make_value_estimator`]).
/// 2. With `normalize_advantage` (and more than one element):
///    `A ← (A - mean(A)) / max(std(A), 1e-6)` (unbiased std, every element).
/// 3. `lw = (actor.get_dist(td).log_prob(td[action]) - td[sample_log_prob]).unsqueeze(-1)`;
///    a `[*B, 1]` advantage is expanded over extra per-token dims of `lw`, and a broadcast
///    that would form an outer product (a `[B]` advantage against `[B, 1]`) is an error.
/// 4. The clipped surrogate, the entropy bonus, the critic loss and the diagnostics; each
///    `loss_*` is reduced with the reduction, then its trailing singleton dim squeezed.
///
/// # Shapes
/// - input: a tensordict of batch size `[*B]` with the actor's and critic's inputs, `action`,
///   `sample_log_prob` (`[*B]`, or `[*B, A]` for a per-dimension log-prob), `advantage` and
///   `value_target` (`[*B, 1]`), and with `clip_value` the old `value` (`[*B, 1]`).
/// - output: see [`PpoLossOutput`].
///
/// # Errors
/// A missing entry (the error names the key), a stored log-prob that requires grad, a critic
/// that does not write `value`, value/target shape mismatch, or an outer-product broadcast.
pub type ClipPPOLoss = PpoLoss<Clip>;

impl PpoLoss<Clip> {
    /// The clip ε: log-weights are clamped to `[ln(1-ε), ln(1+ε)]`. Errors
    /// ([`Error::InvalidConfig`](crate::Error::InvalidConfig)) unless `0 < ε < 1` (ε ≥ 1 makes
    /// the lower bound `ln(≤0)`, NaN in TorchRL).
    pub fn with_clip_epsilon(self, clip_epsilon: f64) -> Result<Self> {
        self.edit(|c| c.clip_epsilon = clip_epsilon)
    }

    /// The clip ε.
    pub fn clip_epsilon(&self) -> f64 {
        self.objective.clip_epsilon
    }
}

impl PpoObjective for Clip {
    type Output = PpoLossOutput;
    const NAME: &'static str = "ClipPPOLoss";
    const READS_DIST_PARAMS: bool = false;

    fn from_config(config: &PpoConfig) -> Self {
        Clip {
            clip_epsilon: config.clip_epsilon,
        }
    }

    fn validate(config: &PpoConfig) -> Result<()> {
        config.validate_clip(Self::NAME)
    }

    fn out_keys(&self, common: &PpoCommon) -> Vec<&'static str> {
        let mut k = common.out_keys(vec!["loss_objective", "clip_fraction"]);
        k.extend(["ESS", "kl_approx", "max_ratio", "mean_ratio"]);
        k
    }

    fn forward(
        &self,
        b: &PpoCommon,
        td: &TensorDict,
        gen: &mut Generator,
    ) -> Result<PpoLossOutput> {
        let Prepared {
            td,
            advantage,
            log_weight,
            dist,
            kl_approx,
        } = b.prepare(td)?;

        let (ess, max_ratio, mean_ratio, kl) = {
            let _guard = tch::no_grad_guard();
            let lw = log_weight.f_detach()?.f_squeeze_dim(-1)?;
            let dim0 = [0i64];
            let ess = lw
                .f_logsumexp(dim0.as_slice(), false)?
                .f_mul_scalar(2.0)?
                .f_sub(&lw.f_mul_scalar(2.0)?.f_logsumexp(dim0.as_slice(), false)?)?
                .f_exp()?;
            let batch = log_weight.size().first().copied().unwrap_or(1);
            let ratio = log_weight.f_detach()?.f_exp()?;
            (
                ess.f_div_scalar(batch as f64)?,
                ratio.f_max()?,
                ratio.f_mean(None)?,
                kl_approx.f_detach()?.f_mean(None)?,
            )
        };

        let gain1 = log_weight.f_exp()?.f_mul(&advantage)?;
        let lo = (-self.clip_epsilon).ln_1p();
        let hi = self.clip_epsilon.ln_1p();
        let log_weight_clip = log_weight.f_clamp(lo, hi)?;
        let clip_fraction = detached_fraction(
            &log_weight_clip.f_ne_tensor(&log_weight)?,
            log_weight.kind(),
        )?;
        let gain2 = log_weight_clip.f_exp()?.f_mul(&advantage)?;
        let (gain, _) = Tensor::f_stack(&[gain1, gain2], -1)?.f_min_dim(-1, false)?;
        let loss_objective = b.reduce(&gain.f_neg()?)?;

        let (loss_entropy, entropy) = b.entropy_terms(dist.as_ref(), gen)?;
        let (loss_critic, value_clip_fraction, explained_variance) = b.critic_terms(&td)?;

        Ok(PpoLossOutput {
            loss_objective,
            loss_entropy,
            loss_critic,
            clip_fraction,
            entropy,
            ess,
            kl_approx: kl,
            max_ratio,
            mean_ratio,
            value_clip_fraction,
            explained_variance,
        })
    }
}
