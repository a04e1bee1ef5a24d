//! Samplers: which storage indices a [`ReplayBuffer`](super::ReplayBuffer) batch reads.
//!
//! ```
//! use torchrl::data::replay::{LastBatch, RandomSampler, Sampler, SamplerWithoutReplacement};
//! # fn main() -> torchrl::Result<()> {
//! let mut a = RandomSampler::new(3);
//! let mut b = RandomSampler::new(3);
//! let ia = a.sample_indices(10, 6)?;
//! assert_eq!(ia, b.sample_indices(10, 6)?); // seeded: reproducible
//! assert!(ia.iter().all(|i| (0..10).contains(i)));
//!
//! let mut s = SamplerWithoutReplacement::new(0, LastBatch::Keep);
//! let mut all: Vec<i64> = Vec::new();
//! all.extend(s.sample_indices(5, 2)?);
//! all.extend(s.sample_indices(5, 2)?);
//! let last = s.sample_indices(5, 2)?; // not drop_last: the short remainder
//! assert_eq!(last.len(), 1);
//! assert!(s.ran_out());
//! all.extend(last);
//! all.sort();
//! assert_eq!(all, vec![0, 1, 2, 3, 4]);
//! # Ok(()) }
//! ```

use crate::error::{Error, Result};
use crate::rng::Generator;
use crate::tensordict::TensorDict;

/// What a [`Sampler`] hands the buffer for one batch: storage indices and, for a prioritized
/// sampler, their importance weights.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Sampled {
    /// The storage indices to read, in batch order.
    pub indices: Vec<i64>,
    /// One importance weight per index (prioritized samplers); the buffer writes them under
    /// `"priority_weight"` and the indices under `"index"`.
    pub weights: Option<Vec<f32>>,
}

/// Chooses the storage indices of a sampled batch.
pub trait Sampler {
    /// `batch_size` indices into a storage holding `len` items (`len >= 1`, `batch_size >= 1`).
    fn sample_indices(&mut self, len: i64, batch_size: i64) -> Result<Vec<i64>>;

    /// The batch's indices (and weights) with the stored items at hand (`storage`: the first
    /// `len` items are valid), for samplers that read the data (trajectory slices). The default
    /// calls [`Sampler::sample_indices`].
    fn sample_from(&mut self, _storage: &TensorDict, len: i64, batch_size: i64) -> Result<Sampled> {
        Ok(Sampled {
            indices: self.sample_indices(len, batch_size)?,
            weights: None,
        })
    }

    /// The stored keys [`Sampler::sample_from`] reads (`None`: all of them): a disk-backed
    /// buffer loads only these for it. Default: none.
    fn storage_keys(&self) -> Option<Vec<crate::tensordict::NestedKey>> {
        Some(Vec::new())
    }

    /// Called after `extend` wrote the items at `indices` (TorchRL's `Sampler.extend`; a
    /// prioritized sampler gives them the default priority).
    fn extended(&mut self, _indices: &[i64]) -> Result<()> {
        Ok(())
    }

    /// Forgets any per-storage state (called when the buffer is cleared).
    fn reset(&mut self) {}
}

pub(crate) fn check_args(op: &'static str, len: i64, batch_size: i64) -> Result<()> {
    if len < 1 {
        return Err(Error::argument(
            op,
            "len",
            "a non-empty buffer (cannot sample from an empty buffer)",
            len.to_string(),
        ));
    }
    if batch_size < 1 {
        return Err(Error::InvalidValue {
            op,
            what: "argument",
            key: "batch_size".into(),
            expected: "at least 1".into(),
            got: batch_size.to_string(),
        });
    }
    Ok(())
}

/// Uniform sampling with replacement, from a seeded [`Generator`] (TorchRL's `RandomSampler`).
#[derive(Clone, Debug)]
pub struct RandomSampler {
    generator: Generator,
}

impl RandomSampler {
    /// A sampler seeded with `seed`: the same seed gives the same indices.
    pub fn new(seed: u64) -> Self {
        RandomSampler {
            generator: Generator::new(seed),
        }
    }
}

impl Default for RandomSampler {
    fn default() -> Self {
        RandomSampler::new(0)
    }
}

impl Sampler for RandomSampler {
    fn sample_indices(&mut self, len: i64, batch_size: i64) -> Result<Vec<i64>> {
        check_args("RandomSampler::sample", len, batch_size)?;
        let n = len.unsigned_abs();
        Ok((0..batch_size)
            .map(|_| self.generator.below(n) as i64)
            .collect())
    }
}

/// What [`SamplerWithoutReplacement`] does with the indices left at the end of an epoch, fewer
/// than a batch (TorchRL's `drop_last`). `true` converts to [`LastBatch::Drop`], `false` to
/// [`LastBatch::Keep`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LastBatch {
    /// They are dropped and a new epoch starts (`drop_last=True`).
    Drop,
    /// They are returned as a shorter last batch (`drop_last=False`).
    Keep,
}

impl From<bool> for LastBatch {
    /// `drop_last` as a flag.
    fn from(drop_last: bool) -> Self {
        if drop_last {
            LastBatch::Drop
        } else {
            LastBatch::Keep
        }
    }
}

/// Sampling without replacement, epoch by epoch (TorchRL's `SamplerWithoutReplacement`).
///
/// Each epoch is a fresh random permutation of the storage indices, consumed `batch_size` at a
/// time. At the end of an epoch, with `drop_last` the leftover indices (fewer than a batch) are
/// dropped and a new epoch starts; without it they are returned as a shorter last batch.
/// [`SamplerWithoutReplacement::ran_out`] tells when the last call finished an epoch. The epoch
/// restarts when the storage length changes.
#[derive(Clone, Debug)]
pub struct SamplerWithoutReplacement {
    generator: Generator,
    drop_last: bool,
    perm: Vec<i64>,
    pos: usize,
    len: i64,
    ran_out: bool,
}

impl SamplerWithoutReplacement {
    /// A seeded sampler; `last` says what happens to the final partial batch of each epoch
    /// ([`LastBatch::Drop`] or [`LastBatch::Keep`]; a `bool` is TorchRL's `drop_last`).
    pub fn new(seed: u64, last: impl Into<LastBatch>) -> Self {
        SamplerWithoutReplacement {
            generator: Generator::new(seed),
            drop_last: last.into() == LastBatch::Drop,
            perm: Vec::new(),
            pos: 0,
            len: 0,
            ran_out: false,
        }
    }

    /// Whether the last sample finished an epoch (every index of the epoch has been handed out,
    /// or the rest dropped).
    pub fn ran_out(&self) -> bool {
        self.ran_out
    }

    /// Whether the final partial batch of an epoch is dropped.
    pub fn drop_last(&self) -> bool {
        self.drop_last
    }

    fn new_epoch(&mut self, len: i64) {
        self.perm = (0..len).collect();
        // Fisher-Yates with the seeded generator.
        for i in (1..self.perm.len()).rev() {
            let j = self.generator.below(i as u64 + 1) as usize;
            self.perm.swap(i, j);
        }
        self.pos = 0;
        self.len = len;
    }
}

impl Default for SamplerWithoutReplacement {
    fn default() -> Self {
        SamplerWithoutReplacement::new(0, LastBatch::Keep)
    }
}

impl Sampler for SamplerWithoutReplacement {
    fn sample_indices(&mut self, len: i64, batch_size: i64) -> Result<Vec<i64>> {
        let op = "SamplerWithoutReplacement::sample";
        check_args(op, len, batch_size)?;
        if self.drop_last && batch_size > len {
            return Err(Error::argument(
                op,
                "batch_size",
                format!(
                    "at most the buffer's {len} items (drop_last is set: no full batch can be \
                     drawn from a smaller buffer)"
                ),
                format!("{batch_size}, which is larger than the buffer"),
            ));
        }
        let bs = usize::try_from(batch_size)
            .map_err(|e| Error::invalid(op, format!("batch_size: {e}")))?;
        let remaining = self.perm.len().saturating_sub(self.pos);
        if len != self.len || remaining == 0 || (self.drop_last && remaining < bs) {
            self.new_epoch(len);
        }
        let end = (self.pos + bs).min(self.perm.len());
        let out = self
            .perm
            .get(self.pos..end)
            .map(<[i64]>::to_vec)
            .unwrap_or_default();
        self.pos = end;
        let left = self.perm.len().saturating_sub(self.pos);
        self.ran_out = left == 0 || (self.drop_last && left < bs);
        Ok(out)
    }

    fn reset(&mut self) {
        self.perm.clear();
        self.pos = 0;
        self.len = 0;
        self.ran_out = false;
    }
}
