//! `RunningMoments`: trlX's running mean and standard deviation of per-sample scores (HEAD
//! `trlx/utils/modeling.py`; TRL ≤ 0.11 had the same class), the statistic behind
//! `scale_reward = "running"` (see `envs::llm::ScoreScaling`, which uses it).
//!
//! The state is four `f64`s, initialised as trlX does: `mean = 0`, `var = 1`, `std = 1` and
//! `count = 1e-24` (a count that is not exactly zero, so the first update needs no special
//! case). [`RunningMoments::update`] merges a batch with trlX's formula:
//!
//! ```text
//! xs_var, xs_mean = var_mean(xs, unbiased=False); n = xs.numel()
//! delta = xs_mean - mean; tot = count + n
//! old_sum = var*count + delta²*count*n/tot
//! mean += delta*n/tot
//! var = (old_sum + xs_var*n)/tot           # population variance of everything seen
//! std = sqrt(var * tot/(tot-1))            # unbiased running std
//! count = tot
//! return xs_mean, sqrt(xs_var*n/(n-1))     # batch mean and unbiased batch std
//! ```
//!
//! **Distributed.** trlX's `get_global_statistics` all-reduces the sum and the count, then the
//! sum of squared deviations from the global mean. [`BatchMoments`] is that triple (count,
//! mean, sum of squared deviations `m2`): compute one per process with [`BatchMoments::of`],
//! combine them with [`BatchMoments::merge`] (Chan et al.'s pairwise formula, which gives the
//! same count, mean and `m2` as the two all-reduces), and feed the global one to
//! [`RunningMoments::update_with`].
//!
//! ```
//! use tch::Tensor;
//! use torchrl::envs::llm::moments::RunningMoments;
//! # fn main() -> torchrl::Result<()> {
//! let mut m = RunningMoments::new();
//! let (batch_mean, batch_std) = m.update(&Tensor::from_slice(&[1.0f64, 2.0, 3.0, 4.0]))?;
//! assert_eq!(batch_mean, 2.5);
//! assert!((batch_std - 1.2909944487).abs() < 1e-9);
//! m.update(&Tensor::from_slice(&[5.0f64, 6.0]))?;
//! assert!((m.mean() - 3.5).abs() < 1e-12);
//! assert!((m.std() - 1.8708286934).abs() < 1e-9);
//! assert_eq!(m.count(), 6.0);
//! # Ok(()) }
//! ```

use tch::{Kind, Tensor};

use crate::error::{Error, Result};

/// The count, mean and sum of squared deviations from the mean (`m2`) of a batch of values:
/// what a distributed all-reduce of running moments exchanges. The population variance is
/// `m2 / count`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BatchMoments {
    count: f64,
    mean: f64,
    m2: f64,
}

impl BatchMoments {
    /// From its parts. Errors when `count` is not a positive finite number, when `mean` is
    /// not finite, or when `m2` is negative or not finite.
    pub fn new(count: f64, mean: f64, m2: f64) -> Result<Self> {
        let op = "BatchMoments::new";
        if !(count.is_finite() && count > 0.0) {
            return Err(Error::argument(
                op,
                "count",
                "a finite number > 0",
                count.to_string(),
            ));
        }
        if !mean.is_finite() {
            return Err(Error::argument(
                op,
                "mean",
                "a finite number",
                mean.to_string(),
            ));
        }
        if !(m2.is_finite() && m2 >= 0.0) {
            return Err(Error::argument(
                op,
                "m2",
                "a finite number >= 0 (a sum of squared deviations)",
                m2.to_string(),
            ));
        }
        Ok(BatchMoments { count, mean, m2 })
    }

    /// The moments of every element of `xs` (any shape, any real dtype; computed in `f64`).
    /// Errors on an empty tensor.
    ///
    /// ```
    /// use tch::Tensor;
    /// use torchrl::envs::llm::moments::BatchMoments;
    /// let b = BatchMoments::of(&Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0]))?;
    /// assert_eq!((b.count(), b.mean(), b.m2()), (4.0, 2.5, 5.0));
    /// assert_eq!(b.var(), 1.25);
    /// # Ok::<(), torchrl::Error>(())
    /// ```
    pub fn of(xs: &Tensor) -> Result<Self> {
        let n = xs.numel();
        if n == 0 {
            return Err(Error::argument(
                "BatchMoments::of",
                "xs",
                "at least one value",
                format!("an empty tensor of shape {:?}", xs.size()),
            ));
        }
        let x = xs.f_to_kind(Kind::Double)?.f_reshape([-1])?;
        let mean = x.f_mean(Kind::Double)?;
        let m2 = x.f_sub(&mean)?.f_square()?.f_sum(Kind::Double)?;
        Ok(BatchMoments {
            count: n as f64,
            mean: mean.f_double_value(&[])?,
            m2: m2.f_double_value(&[])?,
        })
    }

    /// The moments of the union of two batches (Chan et al.): `count = na + nb`,
    /// `mean = ma + δ·nb/n`, `m2 = m2a + m2b + δ²·na·nb/n` with `δ = mb − ma`.
    ///
    /// ```
    /// use tch::Tensor;
    /// use torchrl::envs::llm::moments::BatchMoments;
    /// let a = BatchMoments::of(&Tensor::from_slice(&[1.0f64, 2.0, 3.0, 4.0]))?;
    /// let b = BatchMoments::of(&Tensor::from_slice(&[5.0f64, 6.0]))?;
    /// let all = BatchMoments::of(&Tensor::from_slice(&[1.0f64, 2.0, 3.0, 4.0, 5.0, 6.0]))?;
    /// let merged = a.merge(&b);
    /// assert_eq!(merged.count(), 6.0);
    /// assert!((merged.mean() - all.mean()).abs() < 1e-12);
    /// assert!((merged.m2() - all.m2()).abs() < 1e-12);
    /// # Ok::<(), torchrl::Error>(())
    /// ```
    pub fn merge(&self, other: &BatchMoments) -> BatchMoments {
        let n = self.count + other.count;
        let delta = other.mean - self.mean;
        BatchMoments {
            count: n,
            mean: self.mean + delta * other.count / n,
            m2: self.m2 + other.m2 + delta * delta * self.count * other.count / n,
        }
    }

    /// The number of values.
    pub fn count(&self) -> f64 {
        self.count
    }

    /// Their mean.
    pub fn mean(&self) -> f64 {
        self.mean
    }

    /// The sum of squared deviations from [`Self::mean`].
    pub fn m2(&self) -> f64 {
        self.m2
    }

    /// The population variance `m2 / count` (torch's `var(unbiased=False)`).
    pub fn var(&self) -> f64 {
        self.m2 / self.count
    }

    /// The unbiased standard deviation `sqrt(m2 / (count − 1))`: NaN for a single value, as
    /// torch's `std()` gives.
    pub fn unbiased_std(&self) -> f64 {
        if self.count <= 1.0 {
            return f64::NAN;
        }
        (self.m2 / (self.count - 1.0)).sqrt()
    }
}

/// How a process's [`BatchMoments`] become the global ones of a data-parallel group: a shared
/// function, e.g. `move |b| collective.all_reduce_moments(b)` over a
/// [`SharedCollective`](crate::trainers::parallel::SharedCollective) (what
/// `PpoRlhfTrainer::with_collective` installs in its `ScoreScaling`). Cloning shares the
/// function.
///
/// ```
/// use tch::Tensor;
/// use torchrl::envs::llm::moments::{BatchMoments, MomentsReduce};
/// # fn main() -> torchrl::Result<()> {
/// // a stand-in for a group whose other rank saw [5, 6]
/// let other = BatchMoments::of(&Tensor::from_slice(&[5.0f64, 6.0]))?;
/// let reduce = MomentsReduce::new(move |b: &BatchMoments| Ok(b.merge(&other)));
/// let mine = BatchMoments::of(&Tensor::from_slice(&[1.0f64, 2.0, 3.0, 4.0]))?;
/// let global = reduce.apply(&mine)?;
/// assert_eq!((global.count(), global.mean()), (6.0, 3.5));
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct MomentsReduce(ReduceFn);

type ReduceFn = std::sync::Arc<dyn Fn(&BatchMoments) -> Result<BatchMoments> + Send + Sync>;

impl std::fmt::Debug for MomentsReduce {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MomentsReduce(..)")
    }
}

impl MomentsReduce {
    /// Wraps `f` (local moments in, global moments out; the same on every rank).
    pub fn new(f: impl Fn(&BatchMoments) -> Result<BatchMoments> + Send + Sync + 'static) -> Self {
        MomentsReduce(std::sync::Arc::new(f))
    }

    /// The global moments of `local`.
    ///
    /// # Errors
    /// What the function returns (a failed collective).
    pub fn apply(&self, local: &BatchMoments) -> Result<BatchMoments> {
        (self.0)(local)
    }
}

/// trlX's `RunningMoments`: running mean, population variance and unbiased std of every value
/// seen, in `f64`. See the [module docs](self) for the formula.
///
/// It (de)serialises with serde as `{mean, std, var, count}` (for checkpoints).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RunningMoments {
    mean: f64,
    std: f64,
    var: f64,
    count: f64,
}

impl RunningMoments {
    /// Whether the moments could have come from data: all finite, `var`, `std` and `count`
    /// >= 0 (what a loaded checkpoint must hold).
    pub(crate) fn is_valid(&self) -> bool {
        let all = [self.mean, self.std, self.var, self.count];
        all.iter().all(|v| v.is_finite()) && self.std >= 0.0 && self.var >= 0.0 && self.count >= 0.0
    }
}

impl Default for RunningMoments {
    fn default() -> Self {
        Self::new()
    }
}

impl RunningMoments {
    /// trlX's initial state: `mean = 0`, `std = 1`, `var = 1`, `count = 1e-24`.
    pub fn new() -> Self {
        RunningMoments {
            mean: 0.0,
            std: 1.0,
            var: 1.0,
            count: 1e-24,
        }
    }

    /// Merges the values of `xs` (any shape; trlX passes the per-sample total scores `[B]`)
    /// and returns the batch's mean and unbiased std (for logging; NaN for a single value, as
    /// in trlX). Errors on an empty tensor.
    pub fn update(&mut self, xs: &Tensor) -> Result<(f64, f64)> {
        Ok(self.update_with(&BatchMoments::of(xs)?))
    }

    /// [`Self::update`] from a batch's moments (e.g. the global ones of a data-parallel
    /// group, merged with [`BatchMoments::merge`]).
    ///
    /// With a first batch of one value the running std is NaN, as in trlX (`tot − 1` is 0
    /// there, since `1e-24 + 1 == 1` in `f64`).
    pub fn update_with(&mut self, batch: &BatchMoments) -> (f64, f64) {
        let n = batch.count;
        let xs_mean = batch.mean;
        let xs_var = batch.var();
        let delta = xs_mean - self.mean;
        let tot = self.count + n;
        let old_sum = self.var * self.count + delta * delta * self.count * n / tot;
        self.mean += delta * n / tot;
        self.var = (old_sum + xs_var * n) / tot;
        self.std = if tot > 1.0 {
            (self.var * tot / (tot - 1.0)).sqrt()
        } else {
            f64::NAN
        };
        self.count = tot;
        (xs_mean, batch.unbiased_std())
    }

    /// The running mean.
    pub fn mean(&self) -> f64 {
        self.mean
    }

    /// The running unbiased standard deviation (what `scale_reward = "running"` divides by).
    pub fn std(&self) -> f64 {
        self.std
    }

    /// The running population variance.
    pub fn var(&self) -> f64 {
        self.var
    }

    /// The number of values seen (plus trlX's initial `1e-24`).
    pub fn count(&self) -> f64 {
        self.count
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_batches_are_refused() {
        let e = BatchMoments::of(&Tensor::zeros([0], (Kind::Float, tch::Device::Cpu)));
        assert!(e.is_err());
        assert!(BatchMoments::new(0.0, 0.0, 0.0).is_err());
        assert!(BatchMoments::new(1.0, 0.0, -1.0).is_err());
    }
}
