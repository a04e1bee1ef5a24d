//! What the off-policy losses ([`DQNLoss`](super::DQNLoss), [`DDPGLoss`](super::DDPGLoss),
//! [`TD3Loss`](super::TD3Loss), [`SACLoss`](super::SACLoss),
//! [`DiscreteSACLoss`](super::DiscreteSACLoss)) share: the choice of value estimator
//! ([`ValueEstimators`], TorchRL's enum of the same name), the entropy coefficient of the SAC
//! losses ([`TargetEntropy`]), prioritized-replay weights and the weighted reduction.
//!
//! ```
//! use torchrl::objectives::ValueEstimators;
//! use torchrl::objectives::value::ValueEstimator;
//! let est = ValueEstimators::TD0.build(0.9)?;
//! assert_eq!(est.name(), "TD0Estimator");
//! assert_eq!(ValueEstimators::TDLambda(0.95).build(0.99)?.name(), "TDLambdaEstimator");
//! # Ok::<(), torchrl::Error>(())
//! ```

use tch::nn;
use tch::{Kind, Tensor};

use super::common::Reduction;
use super::value::{TD0Estimator, TD1Estimator, TDLambdaEstimator, ValueEstimator, GAE};
use crate::error::{Error, Result, ShapeFmt};
use crate::modules::TensorDictModule;
use crate::tensordict::{NestedKey, TensorDict};

/// A value estimator a loss owns (any [`ValueEstimator`] that can move between threads).
pub type BoxedEstimator = Box<dyn ValueEstimator + Send>;

/// Which value estimator a loss builds in `make_value_estimator` (TorchRL's
/// `ValueEstimators`). The off-policy losses default to `TD0` with `γ = 0.99`.
#[derive(Clone, Copy, Debug, PartialEq)]
#[allow(clippy::upper_case_acronyms)]
pub enum ValueEstimators {
    /// [`TD0Estimator`]: one-step bootstrapped targets (no time dim needed).
    TD0,
    /// [`TD1Estimator`]: discounted returns to the end of each trajectory (needs `[*B, T]`
    /// data).
    TD1,
    /// [`TDLambdaEstimator`] with this λ (needs `[*B, T]` data).
    TDLambda(f64),
    /// [`GAE`] with this λ (needs `[*B, T]` data and `V(s_t)`).
    GAE(f64),
}

impl ValueEstimators {
    /// The estimator with discount `gamma` (TorchRL's default hyper-parameters otherwise).
    pub fn build(self, gamma: f64) -> Result<BoxedEstimator> {
        Ok(match self {
            ValueEstimators::TD0 => Box::new(TD0Estimator::new(gamma)?),
            ValueEstimators::TD1 => Box::new(TD1Estimator::new(gamma)?),
            ValueEstimators::TDLambda(l) => Box::new(TDLambdaEstimator::new(gamma, l)?),
            ValueEstimators::GAE(l) => Box::new(GAE::new(gamma, l)?),
        })
    }
}

/// The default discount of `make_value_estimator` (TorchRL's `default_value_kwargs`).
pub const DEFAULT_GAMMA: f64 = 0.99;

/// The target entropy of the SAC losses.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum TargetEntropy {
    /// TorchRL's `"auto"`: `-prod(action shape)` for [`SACLoss`](super::SACLoss) (the
    /// action's feature dims, from the action spec), `-0.98·log(1/n)` (times
    /// `target_entropy_weight`) for [`DiscreteSACLoss`](super::DiscreteSACLoss).
    #[default]
    Auto,
    /// A given value.
    Value(f64),
}

/// A network builder boxed as a [`TensorDictModule`] (what the losses store).
pub(crate) type DynModule = Box<dyn TensorDictModule>;

/// `build` with its module boxed.
pub(crate) fn boxed<M, F>(build: F) -> impl Fn(&nn::Path<'_>) -> Result<DynModule>
where
    M: TensorDictModule + 'static,
    F: Fn(&nn::Path<'_>) -> Result<M>,
{
    move |p| Ok(Box::new(build(p)?) as DynModule)
}

/// The leaf at `key`, or the lookup error naming it and the available keys.
pub(crate) fn read(op: &'static str, td: &TensorDict, key: &NestedKey) -> Result<Tensor> {
    Ok(crate::modules::module::read_input(op, td, key)?.shallow_clone())
}

/// The `"next"` sub-tensordict (a shallow copy).
pub(crate) fn next_td(op: &'static str, td: &TensorDict) -> Result<TensorDict> {
    td.get_dict("next")
        .cloned()
        .ok_or_else(|| td.lookup_error(op, &["next"]))
}

/// TorchRL's prioritized-replay weights: the entry at `key` when present (`"auto"`).
pub(crate) fn priority_weights(td: &TensorDict, key: &NestedKey) -> Option<Tensor> {
    td.get(key).map(Tensor::shallow_clone)
}

/// TorchRL's `_reduce` with importance weights: `Σ l·w / Σ w` (mean), `Σ l·w` (sum), `l·w`
/// (none); without weights the plain reduction.
pub(crate) fn reduce(
    op: &'static str,
    reduction: Reduction,
    loss: &Tensor,
    weights: Option<&Tensor>,
) -> Result<Tensor> {
    let Some(w) = weights else {
        return reduction.apply(loss);
    };
    let w = if w.size() == loss.size() {
        w.shallow_clone()
    } else {
        w.f_view_as(loss).map_err(|_| {
            Error::value(
                op,
                "priority_weight",
                format!("weights of the loss's shape {}", ShapeFmt(&loss.size())),
                format!("shape {}", ShapeFmt(&w.size())),
            )
        })?
    };
    let w = w.f_to_kind(loss.kind())?;
    let lw = loss.f_mul(&w)?;
    Ok(match reduction {
        Reduction::Mean => lw.f_sum(None)?.f_div(&w.f_sum(None)?)?,
        Reduction::Sum => lw.f_sum(None)?,
        Reduction::None => lw,
    })
}

/// The value target of `td` with `next_value` written under `("next", value_key)` (on a
/// shallow copy): TorchRL's `value_estimator.value_estimate(td)` after the loss computed the
/// next value itself.
pub(crate) fn estimate_with_next(
    estimator: &dyn ValueEstimator,
    td: &TensorDict,
    next_value: Tensor,
) -> Result<Tensor> {
    let mut staged = td.clone();
    let key = estimator.tensor_keys().value.prefixed("next");
    staged.set(&key, next_value)?;
    let _guard = tch::no_grad_guard();
    estimator.value_estimate(&staged)
}

/// Forwards a loss's value / reward / done / terminated keys to its estimator.
pub(crate) fn forward_keys(
    estimator: &mut dyn ValueEstimator,
    value: &NestedKey,
    reward: &NestedKey,
    done: &NestedKey,
    terminated: &NestedKey,
) -> Result<()> {
    estimator.set_keys(&[
        ("value", Some(value.clone())),
        ("reward", Some(reward.clone())),
        ("done", Some(done.clone())),
        ("terminated", Some(terminated.clone())),
    ])
}

/// Pushes `k` when absent (in_keys without duplicates, in order).
pub(crate) fn push_unique(keys: &mut Vec<NestedKey>, k: NestedKey) {
    if !keys.contains(&k) {
        keys.push(k);
    }
}

/// Drops a trailing dim of 1 (`[*B, 1]` → `[*B]`).
pub(crate) fn squeeze_last(t: &Tensor) -> Result<Tensor> {
    if t.size().last() == Some(&1) && t.dim() > 0 {
        Ok(t.f_squeeze_dim(-1)?)
    } else {
        Ok(t.shallow_clone())
    }
}

/// The entropy coefficient α of the SAC losses: `log α`, trainable (a variable of the
/// caller's var store) unless fixed, clamped to `[log α_min, log α_max]` when read.
#[derive(Debug)]
pub(crate) struct Alpha {
    pub(crate) log_alpha: Tensor,
    min_log: Option<f64>,
    max_log: Option<f64>,
}

impl Alpha {
    pub(crate) fn new(
        op: &'static str,
        path: &nn::Path<'_>,
        alpha_init: f64,
        min_alpha: Option<f64>,
        max_alpha: Option<f64>,
        fixed: bool,
    ) -> Result<Self> {
        if !(alpha_init.is_finite() && alpha_init > 0.0) {
            return Err(Error::config(
                op,
                "alpha_init",
                "a positive finite value",
                alpha_init,
            ));
        }
        // TorchRL: one bound given → the other defaults to 0 / 1e9
        let (min_alpha, max_alpha) = match (min_alpha, max_alpha) {
            (Some(lo), None) => (Some(lo), Some(1e9)),
            (None, Some(hi)) => (Some(0.0), Some(hi)),
            other => other,
        };
        if max_alpha == Some(0.0) {
            return Err(Error::config(
                op,
                "max_alpha",
                "None or a value greater than 0",
                0.0,
            ));
        }
        let min_log = min_alpha.filter(|a| *a > 0.0).map(f64::ln);
        let max_log = max_alpha.filter(|a| *a > 0.0).map(f64::ln);
        let init = alpha_init.ln();
        let log_alpha = if fixed {
            Tensor::f_full(&[] as &[i64], init, (Kind::Float, path.device()))?
        } else {
            path.f_var("log_alpha", &[], nn::Init::Const(init))?
        };
        Ok(Alpha {
            log_alpha,
            min_log,
            max_log,
        })
    }

    /// α = exp(log α), detached (after the clamp, written into log α as TorchRL does).
    pub(crate) fn alpha(&self) -> Result<Tensor> {
        let _guard = tch::no_grad_guard();
        if self.min_log.is_some() || self.max_log.is_some() {
            let clamped = self.log_alpha.f_clamp(
                self.min_log.unwrap_or(f64::NEG_INFINITY),
                self.max_log.unwrap_or(f64::INFINITY),
            )?;
            self.log_alpha.shallow_clone().f_copy_(&clamped)?;
        }
        Ok(self.log_alpha.f_exp()?.f_detach()?)
    }

    /// `-log α · (log π + target_entropy)` (per element, not reduced).
    pub(crate) fn loss(&self, log_prob: &Tensor, target_entropy: f64) -> Result<Tensor> {
        Ok(self
            .log_alpha
            .f_neg()?
            .f_mul(&log_prob.f_detach()?.f_add_scalar(target_entropy)?)?)
    }
}
