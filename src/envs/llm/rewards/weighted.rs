//! Weighted sums of rewards ([`WeightedSum`], TRL's `reward_weights`) and the NaN-skipping
//! combination the scorer shares.

use crate::error::{Error, Result, ResultExt};

use super::*;
/// The weighted NaN-skipping sum of `columns` (one per part, `n` scores each) and each part's
/// NaN-skipping mean; see the module docs.
pub(super) fn combine(
    op: &'static str,
    names: &[&str],
    weights: &[f64],
    columns: &[Vec<f64>],
    n: usize,
) -> Result<(Vec<f64>, Vec<f64>)> {
    let mut total = vec![0.0; n];
    let mut seen = vec![false; n];
    let mut means = Vec::with_capacity(columns.len());
    for ((name, w), col) in names.iter().zip(weights).zip(columns) {
        if col.len() != n {
            return Err(Error::InvalidValue {
                op,
                what: "reward function",
                key: format!("{name:?}"),
                expected: format!("{n} scores (one per sample)"),
                got: format!("{} scores", col.len()),
            });
        }
        let (mut sum, mut count) = (0.0, 0usize);
        for (i, ((&v, t), s)) in col.iter().zip(&mut total).zip(&mut seen).enumerate() {
            if v.is_nan() {
                continue;
            }
            if v.is_infinite() {
                return Err(Error::InvalidValue {
                    op,
                    what: "reward function",
                    key: format!("{name:?}"),
                    expected: "finite scores (or NaN for \"does not apply\")".into(),
                    got: format!("{v} for sample {i}"),
                });
            }
            *t += w * v;
            *s = true;
            sum += v;
            count += 1;
        }
        means.push(if count == 0 {
            f64::NAN
        } else {
            sum / count as f64
        });
    }
    if let Some(i) = seen.iter().position(|s| !s) {
        return Err(Error::InvalidValue {
            op,
            what: "sample",
            key: i.to_string(),
            expected: "a score from at least one reward function".into(),
            got: format!("NaN (no score) from every one of {names:?}"),
        });
    }
    Ok((total, means))
}

/// Checks that `name` is not among `names` and `weight` is finite.
pub(super) fn check_part(op: &'static str, names: &[&str], name: &str, weight: f64) -> Result<()> {
    if let Some(j) = names.iter().position(|n| *n == name) {
        return Err(Error::invalid(
            op,
            format!(
                "reward name {name:?} is already used by part {j}; give one of them another \
                 name (`with_name`, or `name = \"…\"` in the config)"
            ),
        ));
    }
    if !weight.is_finite() {
        return Err(Error::argument(
            op,
            "weight",
            format!("a finite weight for {name:?}"),
            weight.to_string(),
        ));
    }
    Ok(())
}

/// Several named [`RewardFunction`]s with weights: the NaN-skipping weighted sum per sample
/// (TRL's `reward_funcs` with `reward_weights`), and each part's NaN-skipping mean over the
/// last batch for logging ([`WeightedSum::last_means`]). Names must be unique. Itself a
/// [`RewardFunction`] named `"weighted_sum"`.
///
/// ```
/// use serde_json::Map;
/// use torchrl::envs::llm::rewards::{FormatCheck, RewardFunction, RewardSample, WeightedSum};
/// # fn main() -> torchrl::Result<()> {
/// let fields = Map::new();
/// let s = |completion| RewardSample { prompt: "", completion, completion_ids: &[], fields: &fields };
/// let mut sum = WeightedSum::new()
///     .with(FormatCheck::new("a.*")?.with_name("starts_a"), 2.0)?
///     .with(FormatCheck::new(".*z")?.with_name("ends_z"), -0.5)?;
/// assert_eq!(sum.score(&[s("abz"), s("ab"), s("z")])?, vec![1.5, 2.0, -0.5]);
/// assert_eq!(sum.last_means(), vec![("starts_a", 2.0 / 3.0), ("ends_z", 2.0 / 3.0)]);
/// assert!(sum.with(FormatCheck::new("x")?.with_name("ends_z"), 1.0).is_err()); // name taken
/// # Ok(()) }
/// ```
#[derive(Debug, Default)]
pub struct WeightedSum {
    parts: Vec<(Box<dyn RewardFunction>, f64)>,
    last_means: Vec<f64>,
}

impl WeightedSum {
    /// No parts (scores 0… until some are added; an empty sum is an error when scoring).
    pub fn new() -> Self {
        WeightedSum::default()
    }

    /// Adds `f` with `weight`; errors on a name already used or a non-finite weight.
    pub fn with(self, f: impl RewardFunction + 'static, weight: f64) -> Result<Self> {
        self.with_boxed(Box::new(f), weight)
    }

    /// [`WeightedSum::with`] for a boxed function.
    pub fn with_boxed(mut self, f: Box<dyn RewardFunction>, weight: f64) -> Result<Self> {
        let names: Vec<&str> = self.parts.iter().map(|(p, _)| p.name()).collect();
        check_part("WeightedSum::with", &names, f.name(), weight)?;
        self.parts.push((f, weight));
        self.last_means.push(f64::NAN);
        Ok(self)
    }

    /// Each part's name and mean score (NaN samples skipped; NaN before the first batch or when
    /// it skipped every sample), in the order added.
    pub fn last_means(&self) -> Vec<(&str, f64)> {
        self.parts
            .iter()
            .map(|(p, _)| p.name())
            .zip(self.last_means.iter().copied())
            .collect()
    }

    /// The number of parts.
    pub fn len(&self) -> usize {
        self.parts.len()
    }

    /// Whether it has no parts.
    pub fn is_empty(&self) -> bool {
        self.parts.is_empty()
    }
}

impl RewardFunction for WeightedSum {
    fn name(&self) -> &str {
        "weighted_sum"
    }

    fn score(&mut self, samples: &[RewardSample<'_>]) -> Result<Vec<f64>> {
        const OP: &str = "WeightedSum::score";
        if self.parts.is_empty() {
            return Err(Error::invalid(OP, "no reward functions to sum"));
        }
        let mut columns = Vec::with_capacity(self.parts.len());
        for (f, _) in &mut self.parts {
            let name = f.name().to_string();
            columns.push(
                f.score(samples)
                    .with_context(|| format!("reward function {name:?}"))?,
            );
        }
        let names: Vec<&str> = self.parts.iter().map(|(p, _)| p.name()).collect();
        let weights: Vec<f64> = self.parts.iter().map(|(_, w)| *w).collect();
        let (total, means) = combine(OP, &names, &weights, &columns, samples.len())?;
        self.last_means = means;
        Ok(total)
    }
}
