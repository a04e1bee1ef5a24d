//! [`ScoreScaling`]: trlX's score clipping and `scale_reward` (HEAD `make_experience`,
//! rlhf.md §1.4/§1.6) as a transform on the `(B, T, 1)` reward of token data.
//!
//! Per step, on the reward at `"reward"` of the next tensordict (the sequence score, at the
//! last response token, 0 elsewhere):
//!
//! 1. **clip** (trlX `cliprange_reward`, default 10; TRL ≤ 0.11 `score_clip`): every element
//!    is clamped to `[-c, c]`;
//! 2. the per-sample total scores `s_b = Σ_t reward[b, t]` are computed; the first batch sets
//!    the reference statistics (trlX `ref_mean`, `ref_std` = mean and unbiased std of `s`)
//!    unless they were given, and every batch updates a [`RunningMoments`] of `s`;
//! 3. **scale** ([`ScaleReward`], trlX `scale_reward`): `Ignored` leaves the reward as it is,
//!    `Running` divides it by the running std of the totals and `Ref` by `ref_std`. There is
//!    **no mean subtraction**, as in trlX (TRL ≤ 0.11's `use_score_scaling` without
//!    `use_score_norm` is `Running`).
//!
//! **Order in a `Compose`.** It scales the score, so it must run *before* the KL term enters
//! the reward: `ScoreScaling` first, then [`KLComputation`](super::KLComputation) /
//! [`RetrieveKL`](super::RetrieveKL) (trlX adds `-kl_coef · k1` to the scaled scores).
//! After the KL transform it would scale the KL penalty too.
//!
//! The statistics are state: [`Transform::forward`] on offline data updates them as a step
//! does.
//!
//! **Data-parallel.** With [`ScoreScaling::with_moments_reduce`] the batch's moments are made
//! global before they are used (trlX's `get_global_statistics`): the reference statistics of
//! the first batch, the running moments and the logged batch statistics are then those of
//! every rank's scores together, identical on every rank, and each rank divides its own
//! scores by the same global running std. `PpoRlhfTrainer::with_collective` installs it. A divisor that is zero or not finite (a first batch of one sample has no std) is an
//! error rather than NaN rewards.
//!
//! ```
//! use tch::Tensor;
//! use torchrl::envs::llm::{ScaleReward, ScoreScaling};
//! use torchrl::envs::transforms::Transform;
//! use torchrl::TensorDict;
//! # fn main() -> torchrl::Result<()> {
//! let mut scaling = ScoreScaling::new(ScaleReward::Running);
//! let mut step = |scores: &[f32]| -> torchrl::Result<Vec<f32>> {
//!     let b = scores.len() as i64;
//!     // the score at the last of two positions
//!     let z = Tensor::zeros([b, 1, 1], (tch::Kind::Float, tch::Device::Cpu));
//!     let r = Tensor::cat(&[z, Tensor::from_slice(scores).view([b, 1, 1])], 1);
//!     let mut next = TensorDict::new([b])?;
//!     next.set("reward", r)?;
//!     let next = scaling.step(&TensorDict::new([b])?, next)?;
//!     Ok(Vec::<f32>::try_from(next.get_or_err("reward")?.select(1, 1).view([-1]))?)
//! };
//! step(&[1.0, 2.0, 3.0, 4.0])?;
//! let out = step(&[5.0, 6.0])?;
//! // divided by the running std of all six totals, 1.8708286934 (rlhf.md §5.5)
//! assert!((out[0] - 5.0 / 1.8708286934).abs() < 1e-6 && (out[1] - 6.0 / 1.8708286934).abs() < 1e-6);
//! assert!((scaling.running_moments().mean() - 3.5).abs() < 1e-12);
//! # Ok(()) }
//! ```

use std::fmt;

use tch::Kind;

use super::kl::forward_via_step;
use super::moments::{BatchMoments, MomentsReduce, RunningMoments};
use crate::envs::transforms::Transform;
use crate::error::{Error, Result};
use crate::macros::setters;
use crate::tensordict::{NestedKey, TensorDict};

/// trlX's `scale_reward`: what the (clipped) scores are divided by.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ScaleReward {
    /// `"ignored"` (trlX's default): no scaling.
    #[default]
    Ignored,
    /// `"running"`: divide by the running std of the per-sample total scores.
    Running,
    /// `"ref"`: divide by the std of the first batch's totals (or the given `ref_std`).
    Ref,
}

impl ScaleReward {
    /// trlX's name (`"ignored"`, `"running"`, `"ref"`).
    pub fn name(&self) -> &'static str {
        match self {
            ScaleReward::Ignored => "ignored",
            ScaleReward::Running => "running",
            ScaleReward::Ref => "ref",
        }
    }
}

impl fmt::Display for ScaleReward {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for ScaleReward {
    type Err = Error;

    /// trlX's names. trlX treats any other string as `"ignored"`; here it is an error.
    ///
    /// ```
    /// use torchrl::envs::llm::ScaleReward;
    /// assert_eq!("running".parse::<ScaleReward>().unwrap(), ScaleReward::Running);
    /// assert!("Running".parse::<ScaleReward>().is_err());
    /// ```
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "ignored" => Ok(ScaleReward::Ignored),
            "running" => Ok(ScaleReward::Running),
            "ref" => Ok(ScaleReward::Ref),
            other => Err(Error::argument(
                "ScaleReward::from_str",
                "scale_reward",
                "\"ignored\", \"running\" or \"ref\"",
                format!("{other:?}"),
            )),
        }
    }
}

/// trlX's score clipping and scaling on the reward of token data. See the
/// [module docs](self).
///
/// # Shapes
/// The reward at the reward key of the next tensordict, `[*batch, ...]` (`[B, T, 1]` for
/// token data); totals are summed over the non-batch dims.
#[derive(Clone, Debug)]
pub struct ScoreScaling {
    mode: ScaleReward,
    cliprange_reward: Option<f64>,
    reward_key: NestedKey,
    moments: RunningMoments,
    ref_stats: Option<(f64, f64)>,
    last_batch: Option<(f64, f64)>,
    reduce: Option<MomentsReduce>,
}

impl ScoreScaling {
    /// `mode` with trlX's default clipping (`cliprange_reward = 10`) on `"reward"`.
    pub fn new(mode: ScaleReward) -> Self {
        ScoreScaling {
            mode,
            cliprange_reward: Some(10.0),
            reward_key: "reward".into(),
            moments: RunningMoments::new(),
            ref_stats: None,
            last_batch: None,
            reduce: None,
        }
    }

    /// Makes every batch's moments global with `reduce` before they are used (data-parallel
    /// training; see the [module docs](self)). Every rank must then step the transform the
    /// same number of times (`reduce` is a collective).
    ///
    /// ```
    /// use tch::Tensor;
    /// use torchrl::envs::llm::{ScaleReward, ScoreScaling};
    /// use torchrl::envs::transforms::Transform;
    /// use torchrl::envs::llm::moments::{BatchMoments, MomentsReduce};
    /// use torchrl::TensorDict;
    /// # fn main() -> torchrl::Result<()> {
    /// // a stand-in for a second rank whose scores were [3, 4]
    /// let other = BatchMoments::of(&Tensor::from_slice(&[3.0f64, 4.0]))?;
    /// let mut scaling = ScoreScaling::new(ScaleReward::Running)
    ///     .with_moments_reduce(MomentsReduce::new(move |b: &BatchMoments| Ok(b.merge(&other))));
    /// let mut next = TensorDict::new([2])?;
    /// next.set("reward", Tensor::from_slice(&[1.0f64, 2.0]).view([2, 1]))?;
    /// let out = scaling.step(&TensorDict::new([2])?, next)?;
    /// // divided by the std of all four scores [1, 2, 3, 4]
    /// let std = (5.0f64 / 3.0).sqrt();
    /// assert!((out.get_or_err("reward")?.double_value(&[1, 0]) - 2.0 / std).abs() < 1e-12);
    /// assert!((scaling.running_moments().mean() - 2.5).abs() < 1e-12);
    /// # Ok(()) }
    /// ```
    pub fn with_moments_reduce(mut self, reduce: MomentsReduce) -> Self {
        self.reduce = Some(reduce);
        self
    }

    /// Sets or removes the reduction of [`Self::with_moments_reduce`].
    pub fn set_moments_reduce(&mut self, reduce: Option<MomentsReduce>) {
        self.reduce = reduce;
    }

    /// Whether batch moments are made global (see [`Self::with_moments_reduce`]).
    pub fn has_moments_reduce(&self) -> bool {
        self.reduce.is_some()
    }

    /// Clips scores to `[-c, c]` first (trlX `cliprange_reward`, TRL ≤ 0.11 `score_clip`);
    /// `None` does not clip. Errors unless `c` is a finite number > 0.
    pub fn with_cliprange_reward(mut self, c: Option<f64>) -> Result<Self> {
        if let Some(v) = c {
            if !(v.is_finite() && v > 0.0) {
                return Err(Error::argument(
                    "ScoreScaling::with_cliprange_reward",
                    "cliprange_reward",
                    "a finite number > 0 (or None: no clipping)",
                    v.to_string(),
                ));
            }
        }
        self.cliprange_reward = c;
        Ok(self)
    }

    /// Presets the reference statistics (trlX `ref_mean`, `ref_std`) instead of taking them
    /// from the first batch. Errors unless both are finite and `ref_std > 0`.
    pub fn with_ref_stats(mut self, ref_mean: f64, ref_std: f64) -> Result<Self> {
        if !(ref_mean.is_finite() && ref_std.is_finite() && ref_std > 0.0) {
            return Err(Error::argument(
                "ScoreScaling::with_ref_stats",
                "ref_std",
                "finite ref_mean and ref_std, ref_std > 0",
                format!("ref_mean={ref_mean}, ref_std={ref_std}"),
            ));
        }
        self.ref_stats = Some((ref_mean, ref_std));
        Ok(self)
    }

    /// Replaces the running moments (a checkpointed run resumes with its statistics).
    pub fn set_running_moments(&mut self, moments: RunningMoments) {
        self.moments = moments;
    }

    /// Replaces the reference statistics (`None`: taken from the next batch again).
    pub fn set_ref_stats(&mut self, ref_stats: Option<(f64, f64)>) {
        self.ref_stats = ref_stats;
    }

    /// The mode.
    pub fn mode(&self) -> ScaleReward {
        self.mode
    }

    /// The clip range.
    pub fn cliprange_reward(&self) -> Option<f64> {
        self.cliprange_reward
    }

    /// The running moments of the per-sample total scores.
    pub fn running_moments(&self) -> &RunningMoments {
        &self.moments
    }

    /// `(ref_mean, ref_std)`: given, or of the first batch; `None` before it.
    pub fn ref_stats(&self) -> Option<(f64, f64)> {
        self.ref_stats
    }

    /// The last batch's mean and unbiased std of the total scores (trlX logs them as
    /// `exp_scores/mean`, `exp_scores/std`).
    pub fn last_batch_stats(&self) -> Option<(f64, f64)> {
        self.last_batch
    }

    fn apply(&mut self, mut next: TensorDict) -> Result<TensorDict> {
        let op = "ScoreScaling::step";
        let key = &self.reward_key;
        let reward = next.get_or_err(key)?;
        if !matches!(
            reward.kind(),
            Kind::Float | Kind::Double | Kind::Half | Kind::BFloat16
        ) {
            return Err(Error::value(
                op,
                key,
                "a floating-point reward",
                format!("dtype {:?}", reward.kind()),
            ));
        }
        let nb = next.batch_size().len();
        let clipped = match self.cliprange_reward {
            Some(c) => reward.f_clamp(-c, c)?,
            None => reward.shallow_clone(),
        };
        let totals = if clipped.dim() > nb {
            clipped
                .f_flatten(nb as i64, -1)?
                .f_sum_dim_intlist(-1, false, Kind::Double)?
        } else {
            clipped.f_to_kind(Kind::Double)?
        };
        let batch = BatchMoments::of(&totals)?;
        let batch = match &self.reduce {
            Some(reduce) => reduce.apply(&batch)?,
            None => batch,
        };
        if self.ref_stats.is_none() {
            self.ref_stats = Some((batch.mean(), batch.unbiased_std()));
        }
        self.last_batch = Some(self.moments.update_with(&batch));
        let divisor = match self.mode {
            ScaleReward::Ignored => None,
            ScaleReward::Running => {
                Some(("the running std of the total scores", self.moments.std()))
            }
            ScaleReward::Ref => Some(("ref_std", self.ref_stats.map_or(f64::NAN, |(_, s)| s))),
        };
        let out = match divisor {
            None => clipped,
            Some((_, d)) if d.is_finite() && d > 0.0 => clipped.f_div_scalar(d)?,
            Some((what, d)) => {
                return Err(Error::value(
                    op,
                    key,
                    format!(
                        "a finite, positive {what} to divide by (scale_reward=\"{}\"; a first \
                         batch of one sample has no std)",
                        self.mode
                    ),
                    format!("{d} after {} samples", self.moments.count().round()),
                ))
            }
        };
        next.set(key, out)?;
        Ok(next)
    }
}

setters!(ScoreScaling {
    /// The reward key of the next tensordict (default `"reward"`).
    with_reward_key(key: impl Into<NestedKey>) => reward_key = key.into();
});

impl Transform for ScoreScaling {
    fn name(&self) -> String {
        format!(
            "ScoreScaling(scale_reward={}, cliprange_reward={:?})",
            self.mode, self.cliprange_reward
        )
    }

    fn step(&mut self, _td: &TensorDict, next: TensorDict) -> Result<TensorDict> {
        self.apply(next)
    }

    fn forward(&mut self, td: TensorDict) -> Result<TensorDict> {
        forward_via_step("ScoreScaling::forward", td, |_, next| self.apply(next))
    }
}
