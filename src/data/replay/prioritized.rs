//! [`PrioritizedSampler`]: prioritized experience replay (Schaul et al. 2015) as TorchRL's
//! `PrioritizedSampler` / `TensorDictPrioritizedReplayBuffer` compute it.
//!
//! Each stored item `i` has a priority `p_i`; the trees hold `(p_i + eps)^alpha` in float32
//! (TorchRL's default `dtype=torch.float`), a sum tree to sample index `i` with probability
//! `(p_i + eps)^alpha / Σ_j (p_j + eps)^alpha` and a min tree for the importance weights
//!
//! ```text
//! w_i = ( tree_i / min_j tree_j )^(−beta)        (min over the stored items)
//! ```
//!
//! so the rarest item weighs 1 and every other item less (no `1/N` factor, as TorchRL). Items
//! written by `extend` get the *default priority*: the largest raw priority given so far through
//! [`PrioritizedSampler::update_priority`] (1.0 before any), as TorchRL's `mark_update`.
//! A sample through [`ReplayBuffer`](super::ReplayBuffer) carries `"index"` (int64, the storage
//! indices, to update priorities with) and `"priority_weight"` (float32, `w_i`): TorchRL 0.14's
//! key names (older TorchRL wrote `"_weight"`).
//!
//! ```
//! use tch::{Device, Kind, Tensor};
//! use torchrl::data::replay::{PrioritizedSampler, ReplayBuffer};
//! use torchrl::TensorDict;
//! # fn main() -> torchrl::Result<()> {
//! let mut rb = ReplayBuffer::with_sampler(8, PrioritizedSampler::new(8, 1.0, 1.0)?.with_seed(0))?;
//! let td = TensorDict::new([4])?.with("x", Tensor::arange(4, (Kind::Float, Device::Cpu)))?;
//! rb.extend(&td)?;
//! rb.update_priority(&[0, 1, 2, 3], &[1.0, 1.0, 1.0, 4.0])?;
//! let s = rb.sample(64)?;
//! let idx = Vec::<i64>::try_from(s.get_or_err("index")?)?;
//! let w = Vec::<f32>::try_from(s.get_or_err("priority_weight")?)?;
//! for (i, w) in idx.iter().zip(&w) {
//!     // alpha = beta = 1: w = (p_i / min p)^-1
//!     let want = if *i == 3 { 0.25 } else { 1.0 };
//!     assert!((w - want).abs() < 1e-6);
//! }
//! // item 3 is drawn with probability 4/7
//! let threes = idx.iter().filter(|i| **i == 3).count();
//! assert!((20..=52).contains(&threes), "{threes}");
//! # Ok(()) }
//! ```

use super::samplers::{check_args, Sampled, Sampler};
use crate::error::{Error, Result};
use crate::rng::Generator;
use crate::tensordict::TensorDict;

/// A segment tree over `size` float32 leaves with a binary operation (TorchRL's
/// `csrc/segment_tree.h`: `capacity` is the smallest power of two above `size`).
#[derive(Clone, Debug)]
struct SegmentTree {
    size: usize,
    capacity: usize,
    values: Vec<f32>,
    identity: f32,
    op: fn(f32, f32) -> f32,
}

impl SegmentTree {
    fn new(size: usize, identity: f32, op: fn(f32, f32) -> f32) -> Self {
        let mut capacity = 1usize;
        while capacity <= size {
            capacity <<= 1;
        }
        SegmentTree {
            size,
            capacity,
            values: vec![identity; 2 * capacity],
            identity,
            op,
        }
    }

    fn sum(size: usize) -> Self {
        SegmentTree::new(size, 0.0, |a, b| a + b)
    }

    fn min(size: usize) -> Self {
        SegmentTree::new(size, f32::MAX, f32::min)
    }

    fn at(&self, index: usize) -> f32 {
        self.values
            .get(index | self.capacity)
            .copied()
            .unwrap_or(self.identity)
    }

    /// Sets the leaves `(index, value)` (in order: a later value for the same index wins) and
    /// recomputes their ancestors. The ancestors are recomputed level by level for all the
    /// leaves at once, so that the reads of the different paths (cache misses in a large tree)
    /// overlap; the tree is the same as after one leaf-to-root pass per leaf, since every
    /// node is the operation of its two children either way.
    fn update_many(&mut self, items: &[(usize, f32)]) {
        let mut nodes: Vec<usize> = Vec::with_capacity(items.len());
        for &(index, value) in items {
            let i = index | self.capacity;
            if let Some(v) = self.values.get_mut(i) {
                *v = value;
                nodes.push(i);
            }
        }
        let mut level = self.capacity;
        while level > 1 {
            for i in nodes.iter_mut() {
                let a = self.values.get(*i).copied().unwrap_or(self.identity);
                let b = self.values.get(*i ^ 1).copied().unwrap_or(self.identity);
                *i >>= 1;
                if let Some(p) = self.values.get_mut(*i) {
                    *p = (self.op)(a, b);
                }
            }
            level >>= 1;
        }
    }

    /// The reduction over `[l, r)`.
    fn query(&self, l: usize, r: usize) -> f32 {
        if l == 0 && r >= self.size {
            return self.values.get(1).copied().unwrap_or(self.identity);
        }
        let mut ret = self.identity;
        let (mut l, mut r) = (l | self.capacity, r | self.capacity);
        while l < r {
            if l & 1 == 1 {
                ret = (self.op)(ret, self.values.get(l).copied().unwrap_or(self.identity));
                l += 1;
            }
            if r & 1 == 1 {
                r -= 1;
                ret = (self.op)(ret, self.values.get(r).copied().unwrap_or(self.identity));
            }
            l >>= 1;
            r >>= 1;
        }
        ret
    }

    /// For each of `values`, the smallest index whose prefix sum reaches it (sum trees only;
    /// `size` for a value above the total). The descents run level by level for all the values
    /// at once, so that their reads (cache misses in a large tree) overlap; each result is the
    /// one a descent of its own would give.
    fn scan_lower_bounds(&self, values: &[f32]) -> Vec<usize> {
        let total = self.values.get(1).copied().unwrap_or(0.0);
        let mut nodes = vec![1usize; values.len()];
        let mut rest = values.to_vec();
        let mut level = 1usize;
        while level < self.capacity {
            for (node, current) in nodes.iter_mut().zip(rest.iter_mut()) {
                *node <<= 1;
                let left = self.values.get(*node).copied().unwrap_or(0.0);
                if *current > left {
                    *current -= left;
                    *node |= 1;
                }
            }
            level <<= 1;
        }
        values
            .iter()
            .zip(nodes)
            .map(|(v, node)| {
                if *v > total {
                    self.size
                } else {
                    node ^ self.capacity
                }
            })
            .collect()
    }
}

/// Prioritized sampling with importance weights. See the module docs.
#[derive(Clone, Debug)]
pub struct PrioritizedSampler {
    max_capacity: usize,
    alpha: f64,
    beta: f64,
    eps: f64,
    sum_tree: SegmentTree,
    min_tree: SegmentTree,
    /// The largest raw priority given so far (TorchRL's `_max_priority`, tracked since the
    /// sampler was made).
    max_priority: Option<f32>,
    generator: Generator,
}

impl PrioritizedSampler {
    /// A sampler for a buffer of `max_capacity` items with priority exponent `alpha` and
    /// importance exponent `beta` (`eps` 1e-8, seed 0). Errors when `max_capacity < 1` or
    /// `alpha` / `beta` is negative (TorchRL: "must be greater or equal than 0").
    pub fn new(max_capacity: i64, alpha: f64, beta: f64) -> Result<Self> {
        let op = "PrioritizedSampler::new";
        let cap = usize::try_from(max_capacity)
            .ok()
            .filter(|c| *c >= 1)
            .ok_or_else(|| {
                Error::argument(op, "max_capacity", "at least 1", max_capacity.to_string())
            })?;
        for (name, v) in [("alpha", alpha), ("beta", beta)] {
            if v.is_nan() || v < 0.0 {
                return Err(Error::argument(
                    op,
                    name,
                    "a value greater or equal than 0",
                    v.to_string(),
                ));
            }
        }
        Ok(PrioritizedSampler {
            max_capacity: cap,
            alpha,
            beta,
            eps: 1e-8,
            sum_tree: SegmentTree::sum(cap),
            min_tree: SegmentTree::min(cap),
            max_priority: None,
            generator: Generator::new(0),
        })
    }

    /// Builder: the constant added to every priority (default 1e-8).
    pub fn with_eps(mut self, eps: f64) -> Self {
        self.eps = eps;
        self
    }

    /// Builder: seeds the sampling.
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.generator = Generator::new(seed);
        self
    }

    /// The priority exponent.
    pub fn alpha(&self) -> f64 {
        self.alpha
    }

    /// The importance-weight exponent.
    pub fn beta(&self) -> f64 {
        self.beta
    }

    /// Sets `beta` (annealed towards 1 during training).
    pub fn set_beta(&mut self, beta: f64) {
        self.beta = beta;
    }

    /// The priority given to newly written items: the largest priority seen, 1.0 before any.
    pub fn default_priority(&self) -> f64 {
        self.max_priority.map_or(1.0, f64::from)
    }

    /// Sets the priorities of the items at `index` (one priority for all, or one per index).
    /// Negative indices are skipped (TorchRL's "invalid index" convention).
    ///
    /// # Errors
    /// When an index is beyond the capacity, a priority is NaN or negative, or the lengths
    /// differ (and `priority` is not a single value).
    pub fn update_priority(&mut self, index: &[i64], priority: &[f64]) -> Result<()> {
        let op = "PrioritizedSampler::update_priority";
        if priority.len() != 1 && priority.len() != index.len() {
            return Err(Error::invalid(
                op,
                format!(
                    "priority should be a number or an iterable of the same length as index: got \
                     {} priorities for {} indices",
                    priority.len(),
                    index.len()
                ),
            ));
        }
        if let Some(p) = priority.iter().find(|p| p.is_nan() || **p < 0.0) {
            return Err(Error::argument(
                op,
                "priority",
                "non-negative priorities",
                p.to_string(),
            ));
        }
        let pairs: Vec<(usize, f32)> = index
            .iter()
            .enumerate()
            .filter(|(_, i)| **i >= 0)
            .map(|(k, i)| {
                let p = if priority.len() == 1 {
                    priority.first()
                } else {
                    priority.get(k)
                };
                (*i, p.copied().unwrap_or(0.0) as f32)
            })
            .map(|(i, p)| {
                usize::try_from(i)
                    .ok()
                    .filter(|u| *u < self.max_capacity)
                    .map(|u| (u, p))
                    .ok_or_else(|| Error::IndexOutOfRange {
                        op,
                        index: i,
                        what: "prioritized sampler".into(),
                        size: self.max_capacity as i64,
                    })
            })
            .collect::<Result<_>>()?;
        if let Some(max) = pairs.iter().map(|(_, p)| *p).reduce(f32::max) {
            if self.max_priority.is_none_or(|m| max > m) {
                self.max_priority = Some(max);
            }
        }
        let (eps, alpha) = (self.eps as f32, self.alpha as f32);
        // torch.pow(priority + eps, alpha) in float32
        let leaves: Vec<(usize, f32)> = pairs
            .into_iter()
            .map(|(i, p)| (i, (p + eps).powf(alpha)))
            .collect();
        self.sum_tree.update_many(&leaves);
        self.min_tree.update_many(&leaves);
        Ok(())
    }

    /// Gives the items at `index` the default priority (TorchRL's `mark_update`).
    pub fn mark_update(&mut self, index: &[i64]) -> Result<()> {
        let p = self.default_priority();
        self.update_priority(index, &[p])
    }

    /// The importance weight of storage index `i` for a storage of `len` items.
    fn weight(&self, i: usize, p_min: f32) -> f32 {
        (self.sum_tree.at(i) / p_min).powf(-(self.beta as f32))
    }

    /// Samples `batch_size` indices of a storage of `len` items and their importance weights.
    ///
    /// # Errors
    /// When `len < 1`, `batch_size < 1`, or the stored priorities sum to zero.
    pub fn sample_weighted(&mut self, len: i64, batch_size: i64) -> Result<(Vec<i64>, Vec<f32>)> {
        let op = "PrioritizedSampler::sample";
        check_args(op, len, batch_size)?;
        let n = usize::try_from(len).unwrap_or(0).min(self.max_capacity);
        let p_sum = self.sum_tree.query(0, n);
        let p_min = self.min_tree.query(0, n);
        if p_sum <= 0.0 || p_min <= 0.0 || n == 0 {
            return Err(Error::invalid(
                op,
                format!(
                    "non-positive priorities (sum {p_sum}, min {p_min}) over the {n} stored items: \
                     every item needs a priority > 0 (eps > 0, or alpha = 0)"
                ),
            ));
        }
        let masses: Vec<f32> = (0..batch_size)
            .map(|_| (self.generator.next_f64() * f64::from(p_sum)) as f32)
            .collect();
        let found = self.sum_tree.scan_lower_bounds(&masses);
        let mut indices = Vec::with_capacity(found.len());
        let mut weights = Vec::with_capacity(found.len());
        for i in found {
            let mut i = i.min(n - 1);
            // a zero leaf is never the answer: step back (TorchRL)
            while self.sum_tree.at(i) == 0.0 && i > 0 {
                i -= 1;
            }
            indices.push(i as i64);
            weights.push(self.weight(i, p_min));
        }
        Ok((indices, weights))
    }
}

impl Sampler for PrioritizedSampler {
    fn sample_indices(&mut self, len: i64, batch_size: i64) -> Result<Vec<i64>> {
        Ok(self.sample_weighted(len, batch_size)?.0)
    }

    fn sample_from(&mut self, _storage: &TensorDict, len: i64, batch_size: i64) -> Result<Sampled> {
        let (indices, weights) = self.sample_weighted(len, batch_size)?;
        Ok(Sampled {
            indices,
            weights: Some(weights),
        })
    }

    fn extended(&mut self, indices: &[i64]) -> Result<()> {
        self.mark_update(indices)
    }

    fn reset(&mut self) {
        self.sum_tree = SegmentTree::sum(self.max_capacity);
        self.min_tree = SegmentTree::min(self.max_capacity);
        self.max_priority = None;
    }
}

#[cfg(test)]
mod tests {
    use super::SegmentTree;
    use crate::rng::Generator;

    /// The one-leaf-at-a-time update (a leaf, then its path to the root).
    fn update_one(tree: &mut SegmentTree, index: usize, value: f32) {
        let mut i = index | tree.capacity;
        if let Some(v) = tree.values.get_mut(i) {
            *v = value;
        }
        while i > 1 {
            let a = tree.values.get(i).copied().unwrap_or(tree.identity);
            let b = tree.values.get(i ^ 1).copied().unwrap_or(tree.identity);
            if let Some(p) = tree.values.get_mut(i >> 1) {
                *p = (tree.op)(a, b);
            }
            i >>= 1;
        }
    }

    /// The one-value-at-a-time descent.
    fn scan_one(tree: &SegmentTree, value: f32) -> usize {
        if value > tree.values.get(1).copied().unwrap_or(0.0) {
            return tree.size;
        }
        let mut index = 1usize;
        let mut current = value;
        while index < tree.capacity {
            index <<= 1;
            let left = tree.values.get(index).copied().unwrap_or(0.0);
            if current > left {
                current -= left;
                index |= 1;
            }
        }
        index ^ tree.capacity
    }

    #[test]
    fn batched_updates_and_descents_match_one_at_a_time() {
        let mut gen = Generator::new(3);
        for size in [1usize, 2, 5, 64, 1000] {
            let (mut sum, mut min) = (SegmentTree::sum(size), SegmentTree::min(size));
            let (mut sum1, mut min1) = (SegmentTree::sum(size), SegmentTree::min(size));
            for round in 0..20 {
                // repeated indices included: the last value written wins
                let items: Vec<(usize, f32)> = (0..(round % 7) * 5 + 1)
                    .map(|_| {
                        let i = (gen.next_f64() * size as f64) as usize % size;
                        let v = if gen.next_f64() < 0.1 {
                            0.0
                        } else {
                            gen.next_f64() as f32
                        };
                        (i, v)
                    })
                    .collect();
                sum.update_many(&items);
                min.update_many(&items);
                for &(i, v) in &items {
                    update_one(&mut sum1, i, v);
                    update_one(&mut min1, i, v);
                }
                assert_eq!(
                    sum.values, sum1.values,
                    "sum tree, size {size}, round {round}"
                );
                assert_eq!(
                    min.values, min1.values,
                    "min tree, size {size}, round {round}"
                );
                let total = f64::from(sum.query(0, size));
                // masses over [0, 1.1 * total]: some above the total (→ size)
                let masses: Vec<f32> = (0..33)
                    .map(|_| (gen.next_f64() * 1.1 * total) as f32)
                    .collect();
                let one: Vec<usize> = masses.iter().map(|m| scan_one(&sum1, *m)).collect();
                assert_eq!(sum.scan_lower_bounds(&masses), one, "size {size}");
            }
        }
    }
}
