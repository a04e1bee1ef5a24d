//! [`KlEstimator`]: the per-token KL estimators (k1, k2, k3) the KL transforms write and the
//! KL controllers and losses read.

use tch::Tensor;

use crate::error::{Error, Result};

/// Per-token estimators of KL(π‖ref) from samples of π (J. Schulman, "Approximating KL
/// divergence"), with `lr = log π(x) - log ref(x)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KlEstimator {
    /// `lr`: unbiased, can be negative per token; what the reward penalty uses (trlX, TRL's
    /// default `kl_estimator="k1"`, TorchRL's `KLRewardTransform`). The default.
    #[default]
    K1,
    /// `lr² / 2`: biased, low variance (TRL logs it as `approxkl`).
    K2,
    /// `exp(-lr) - 1 + lr`: unbiased and non-negative (TRL's `"k3"`, GRPO, TorchRL).
    K3,
}

impl KlEstimator {
    /// TRL's name for it (`"k1"`, `"k2"`, `"k3"`).
    pub fn name(&self) -> &'static str {
        match self {
            KlEstimator::K1 => "k1",
            KlEstimator::K2 => "k2",
            KlEstimator::K3 => "k3",
        }
    }

    /// The per-token estimate from `log_probs - ref_log_probs`.
    pub fn per_token(self, log_ratio: &Tensor) -> Result<Tensor> {
        Ok(match self {
            KlEstimator::K1 => log_ratio.shallow_clone(),
            KlEstimator::K2 => log_ratio.f_square()?.f_mul_scalar(0.5)?,
            KlEstimator::K3 => log_ratio
                .f_neg()?
                .f_exp()?
                .f_sub_scalar(1.0)?
                .f_add(log_ratio)?,
        })
    }

    /// The estimate per element of `log_probs` (the sampling policy's) and `ref_log_probs`
    /// (same shape; not checked here, broadcasting applies).
    ///
    /// ```
    /// use tch::Tensor;
    /// use torchrl::envs::llm::KlEstimator;
    /// let lp = Tensor::from_slice(&[-1.0f64, -2.0, -0.5]);
    /// let rf = Tensor::from_slice(&[-1.2f64, -1.5, -0.7]);
    /// let k3 = Vec::<f64>::try_from(KlEstimator::K3.estimate(&lp, &rf)?)?;
    /// assert!((k3[1] - 0.14872127).abs() < 1e-8); // rlhf.md §5.3
    /// # Ok::<(), torchrl::Error>(())
    /// ```
    pub fn estimate(self, log_probs: &Tensor, ref_log_probs: &Tensor) -> Result<Tensor> {
        self.per_token(&log_probs.f_sub(ref_log_probs)?)
    }
}

impl std::str::FromStr for KlEstimator {
    type Err = Error;

    /// TRL's names: `"k1"`, `"k2"`, `"k3"`.
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "k1" => Ok(KlEstimator::K1),
            "k2" => Ok(KlEstimator::K2),
            "k3" => Ok(KlEstimator::K3),
            other => Err(Error::argument(
                "KlEstimator::from_str",
                "kl_estimator",
                "\"k1\", \"k2\" or \"k3\"",
                format!("{other:?}"),
            )),
        }
    }
}
