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

/// One node of the sum tree and the min tree: the sum and the min of the leaves below it.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Node {
    sum: f32,
    min: f32,
}

impl Node {
    /// A leaf no item has written: the identities of `+` and `min`.
    const EMPTY: Node = Node {
        sum: 0.0,
        min: f32::MAX,
    };

    fn leaf(value: f32) -> Node {
        Node {
            sum: value,
            min: value,
        }
    }

    fn join(a: Node, b: Node) -> Node {
        Node {
            sum: a.sum + b.sum,
            min: a.min.min(b.min),
        }
    }
}

/// TorchRL's sum tree and min tree over `size` float32 leaves (its `csrc/segment_tree.h`:
/// `capacity` is the smallest power of two above `size`, node `i`'s children are `2i` and
/// `2i + 1`, the leaves are `capacity..2 * capacity`), kept as one array of [`Node`]s so that
/// an update walks one path for both trees: at a million items most nodes are cache misses,
/// and the two trees side by side take one miss a node instead of two.
#[derive(Clone, Debug)]
struct PriorityTrees {
    size: usize,
    capacity: usize,
    nodes: Vec<Node>,
}

impl PriorityTrees {
    fn new(size: usize) -> Self {
        let mut capacity = 1usize;
        while capacity <= size {
            capacity <<= 1;
        }
        PriorityTrees {
            size,
            capacity,
            nodes: vec![Node::EMPTY; 2 * capacity],
        }
    }

    fn node(&self, i: usize) -> Node {
        self.nodes.get(i).copied().unwrap_or(Node::EMPTY)
    }

    /// The value stored for item `index` (0 for an item never written).
    fn at(&self, index: usize) -> f32 {
        self.node(index | self.capacity).sum
    }

    /// Writes `value` at each `index` (in order: the last write to an index wins), then
    /// recomputes each changed parent once, level by level: `(index, value)` pairs from one
    /// `extend` share most of their ancestors, and a batch's paths overlap near the root.
    fn update_many(&mut self, items: &[(usize, f32)]) {
        let mut changed: Vec<usize> = Vec::with_capacity(items.len());
        for &(index, value) in items {
            let i = index | self.capacity;
            if let Some(n) = self.nodes.get_mut(i) {
                *n = Node::leaf(value);
                changed.push(i);
            }
            // the first level of parents is written next: ask for their lines now
            if let Some(parent) = self.nodes.get(i >> 1) {
                crate::host::prefetch(parent);
            }
        }
        changed.sort_unstable();
        changed.dedup();
        // every entry is on the same level: the leaves, then their parents, ...
        while changed.first().is_some_and(|i| *i > 1) {
            let mut kept = 0;
            for k in 0..changed.len() {
                let parent = changed.get(k).copied().unwrap_or(0) >> 1;
                if kept > 0 && changed.get(kept - 1) == Some(&parent) {
                    continue;
                }
                let joined = Node::join(self.node(2 * parent), self.node(2 * parent + 1));
                if let Some(p) = self.nodes.get_mut(parent) {
                    *p = joined;
                }
                // written a level later
                if let Some(grandparent) = self.nodes.get(parent >> 1) {
                    crate::host::prefetch(grandparent);
                }
                if let Some(slot) = changed.get_mut(kept) {
                    *slot = parent;
                }
                kept += 1;
            }
            changed.truncate(kept);
        }
    }

    /// The sum and the min over items `l..r`.
    fn query(&self, l: usize, r: usize) -> Node {
        if l == 0 && r >= self.size {
            return self.node(1);
        }
        let mut ret = Node::EMPTY;
        let (mut l, mut r) = (l | self.capacity, r | self.capacity);
        while l < r {
            if l & 1 == 1 {
                ret = Node::join(ret, self.node(l));
                l += 1;
            }
            if r & 1 == 1 {
                r -= 1;
                ret = Node::join(ret, self.node(r));
            }
            l >>= 1;
            r >>= 1;
        }
        ret
    }

    /// For each mass `v`, the first item whose prefix sum reaches `v` (TorchRL's
    /// `scan_lower_bound`; `size` when `v` is above the total), every descent one level at a
    /// time so that the batch's cache misses overlap.
    fn scan_lower_bounds(&self, values: &[f32]) -> Vec<usize> {
        let total = self.node(1).sum;
        let mut nodes = vec![1usize; values.len()];
        let mut rest = values.to_vec();
        let mut level = 1usize;
        while level < self.capacity {
            for (node, current) in nodes.iter_mut().zip(rest.iter_mut()) {
                *node <<= 1;
                let left = self.nodes.get(*node).map_or(0.0, |n| n.sum);
                if *current > left {
                    *current -= left;
                    *node |= 1;
                }
                // the next level reads node 2 * node: ask for its line now, a whole pass over
                // the batch before it is read
                if let Some(next) = self.nodes.get(*node << 1) {
                    crate::host::prefetch(next);
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
    trees: PriorityTrees,
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
            trees: PriorityTrees::new(cap),
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
        // one priority for all (an `extend`'s default priority): one `powf`
        let shared = (priority.len() == 1)
            .then(|| priority.first().map(|p| (*p as f32 + eps).powf(alpha)))
            .flatten();
        let leaves: Vec<(usize, f32)> = pairs
            .into_iter()
            .map(|(i, p)| (i, shared.unwrap_or_else(|| (p + eps).powf(alpha))))
            .collect();
        self.trees.update_many(&leaves);
        Ok(())
    }

    /// Gives the items at `index` the default priority (TorchRL's `mark_update`).
    pub fn mark_update(&mut self, index: &[i64]) -> Result<()> {
        let p = self.default_priority();
        self.update_priority(index, &[p])
    }

    /// The importance weight of storage index `i` for a storage of `len` items.
    fn weight(&self, i: usize, p_min: f32) -> f32 {
        (self.trees.at(i) / p_min).powf(-(self.beta as f32))
    }

    /// Samples `batch_size` indices of a storage of `len` items and their importance weights.
    ///
    /// # Errors
    /// When `len < 1`, `batch_size < 1`, or the stored priorities sum to zero.
    pub fn sample_weighted(&mut self, len: i64, batch_size: i64) -> Result<(Vec<i64>, Vec<f32>)> {
        let op = "PrioritizedSampler::sample";
        check_args(op, len, batch_size)?;
        let n = usize::try_from(len).unwrap_or(0).min(self.max_capacity);
        let Node {
            sum: p_sum,
            min: p_min,
        } = self.trees.query(0, n);
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
        let found = self.trees.scan_lower_bounds(&masses);
        let mut indices = Vec::with_capacity(found.len());
        let mut weights = Vec::with_capacity(found.len());
        for i in found {
            let mut i = i.min(n - 1);
            // a zero leaf is never the answer: step back (TorchRL)
            while self.trees.at(i) == 0.0 && i > 0 {
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
        self.trees = PriorityTrees::new(self.max_capacity);
        self.max_priority = None;
    }
}

#[cfg(test)]
mod tests {
    use super::PriorityTrees;
    use crate::rng::Generator;

    /// The plain one-path-at-a-time segment tree of TorchRL's `segment_tree.h`, one per
    /// operation: what the batched, side-by-side trees must equal bit for bit.
    struct OneTree {
        capacity: usize,
        values: Vec<f32>,
        identity: f32,
        op: fn(f32, f32) -> f32,
    }

    impl OneTree {
        fn new(capacity: usize, identity: f32, op: fn(f32, f32) -> f32) -> Self {
            OneTree {
                capacity,
                values: vec![identity; 2 * capacity],
                identity,
                op,
            }
        }

        fn update(&mut self, index: usize, value: f32) {
            let mut i = index | self.capacity;
            self.values[i] = value;
            while i > 1 {
                let (a, b) = (self.values[i], self.values[i ^ 1]);
                self.values[i >> 1] = (self.op)(a, b);
                i >>= 1;
            }
        }

        fn scan(&self, value: f32, size: usize) -> usize {
            if value > self.values[1] {
                return size;
            }
            let mut index = 1usize;
            let mut current = value;
            while index < self.capacity {
                index <<= 1;
                let left = self.values[index];
                if current > left {
                    current -= left;
                    index |= 1;
                }
            }
            index ^ self.capacity
        }

        fn query(&self, l: usize, r: usize) -> f32 {
            (l..r)
                .map(|i| self.values[i | self.capacity])
                .fold(self.identity, self.op)
        }
    }

    #[test]
    fn batched_updates_and_descents_match_one_at_a_time() {
        let mut gen = Generator::new(3);
        for size in [1usize, 2, 5, 64, 1000] {
            let mut trees = PriorityTrees::new(size);
            let mut sum = OneTree::new(trees.capacity, 0.0, |a, b| a + b);
            let mut min = OneTree::new(trees.capacity, f32::MAX, f32::min);
            for round in 0..20 {
                // repeated indices included: the last value written wins; every third round
                // writes a contiguous run, as an `extend` does
                let n = (round % 7) * 5 + 1;
                let first = (gen.next_f64() * size as f64) as usize % size;
                let items: Vec<(usize, f32)> = (0..n)
                    .map(|k| {
                        let i = if round % 3 == 0 {
                            (first + k) % size
                        } else {
                            (gen.next_f64() * size as f64) as usize % size
                        };
                        let v = if gen.next_f64() < 0.1 {
                            0.0
                        } else {
                            gen.next_f64() as f32
                        };
                        (i, v)
                    })
                    .collect();
                trees.update_many(&items);
                for &(i, v) in &items {
                    sum.update(i, v);
                    min.update(i, v);
                }
                let sums: Vec<f32> = trees.nodes.iter().map(|n| n.sum).collect();
                let mins: Vec<f32> = trees.nodes.iter().map(|n| n.min).collect();
                assert_eq!(sums, sum.values, "sum tree, size {size}, round {round}");
                assert_eq!(mins, min.values, "min tree, size {size}, round {round}");
                let total = f64::from(trees.query(0, size).sum);
                // masses over [0, 1.1 * total]: some above the total (→ size)
                let masses: Vec<f32> = (0..33)
                    .map(|_| (gen.next_f64() * 1.1 * total) as f32)
                    .collect();
                // and masses on the tree's own boundaries: a left child's sum exactly, and
                // that plus its right sibling's left child's (ties go left)
                let mut masses = masses;
                for j in [2usize, 3, 4, 5, 8, 13] {
                    if let (Some(a), Some(b)) = (sum.values.get(j), sum.values.get(2 * j + 2)) {
                        masses.push(*a);
                        masses.push(*a + *b);
                    }
                }
                let one: Vec<usize> = masses.iter().map(|m| sum.scan(*m, size)).collect();
                assert_eq!(trees.scan_lower_bounds(&masses), one, "size {size}");
                // a range query is the fold over its leaves (min exactly; sums to rounding)
                let (l, r) = (first.min(size / 2), size);
                let q = trees.query(l, r);
                assert_eq!(q.min, min.query(l, r), "min over {l}..{r}");
                let want = sum.query(l, r);
                assert!(
                    (q.sum - want).abs() <= 1e-5 * want.abs().max(1.0),
                    "sum {l}..{r}"
                );
            }
        }
    }
}
