//! [`ReplayBuffer`]: a fixed-capacity tensordict storage (TorchRL's `LazyTensorStorage` with a
//! round-robin writer) and a [`Sampler`].
//!
//! The storage is allocated on the first `extend`, shaped `[capacity, *feature_dims]` per leaf
//! after the first data's structure. Writes go round-robin: once full, the oldest transitions
//! are overwritten first (FIFO).
//!
//! ```
//! use tch::{Device, Kind, Tensor};
//! use torchrl::data::replay::ReplayBuffer;
//! use torchrl::TensorDict;
//! # fn main() -> torchrl::Result<()> {
//! let mut rb = ReplayBuffer::new(4)?; // RandomSampler seeded with 0
//! let td = |start: i64, n: i64| {
//!     TensorDict::new([n])?.with("x", Tensor::arange_start(start, start + n, (Kind::Int64, Device::Cpu)))
//! };
//! rb.extend(&td(0, 3)?)?;
//! rb.extend(&td(3, 3)?)?; // 6 items into 4 slots: 0 and 1 are overwritten
//! assert_eq!(rb.len(), 4);
//! let stored = rb.storage()?.ok_or(torchrl::Error::InvalidArgument { op: "doc", message: "empty".into() })?;
//! assert_eq!(Vec::<i64>::try_from(stored.get_or_err("x")?)?, vec![4, 5, 2, 3]);
//! let s = rb.sample(8)?;
//! assert_eq!(s.batch_size(), &[8]);
//! assert!(Vec::<i64>::try_from(s.get_or_err("x")?)?.iter().all(|v| (2..6).contains(v)));
//! rb.clear();
//! assert!(rb.is_empty() && rb.sample(1).is_err());
//! # Ok(()) }
//! ```

use tch::{Device, Kind, Tensor};

use super::samplers::{RandomSampler, Sampler};
use crate::error::{Error, Result};
use crate::tensordict::{BatchIndex, TensorDict};

/// A replay buffer over a tensordict storage. See the module docs.
#[derive(Debug)]
pub struct ReplayBuffer<S: Sampler = RandomSampler> {
    storage: Option<TensorDict>,
    capacity: i64,
    len: i64,
    cursor: i64,
    sampler: S,
}

impl ReplayBuffer<RandomSampler> {
    /// A buffer of `capacity` transitions sampled uniformly with replacement
    /// ([`RandomSampler`] seeded with 0).
    pub fn new(capacity: i64) -> Result<Self> {
        ReplayBuffer::with_sampler(capacity, RandomSampler::new(0))
    }
}

impl<S: Sampler> ReplayBuffer<S> {
    /// A buffer of `capacity` transitions with the given sampler.
    ///
    /// # Errors
    /// When `capacity` is not positive.
    pub fn with_sampler(capacity: i64, sampler: S) -> Result<Self> {
        if capacity < 1 {
            return Err(Error::config(
                "ReplayBuffer::new",
                "capacity",
                "at least 1",
                capacity,
            ));
        }
        Ok(ReplayBuffer {
            storage: None,
            capacity,
            len: 0,
            cursor: 0,
            sampler,
        })
    }

    /// The number of transitions stored.
    pub fn len(&self) -> i64 {
        self.len
    }

    /// Whether nothing is stored.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The maximum number of transitions kept.
    pub fn capacity(&self) -> i64 {
        self.capacity
    }

    /// The sampler.
    pub fn sampler(&self) -> &S {
        &self.sampler
    }

    /// The sampler, mutably.
    pub fn sampler_mut(&mut self) -> &mut S {
        &mut self.sampler
    }

    /// Empties the buffer (the allocated storage is kept for reuse) and resets the sampler.
    pub fn clear(&mut self) {
        self.len = 0;
        self.cursor = 0;
        self.sampler.reset();
    }

    /// The stored transitions in storage order, `[len]` (views of the storage), or `None` when
    /// empty.
    pub fn storage(&self) -> Result<Option<TensorDict>> {
        match &self.storage {
            Some(s) if self.len > 0 => Ok(Some(s.index(&[BatchIndex::slice(
                Some(0),
                Some(self.len),
                1,
            )])?)),
            _ => Ok(None),
        }
    }

    /// Adds the transitions of `data`: its batch dims are flattened into one (`[B, T]` gives
    /// `B * T` transitions; a batch-less tensordict is one transition). Returns the storage
    /// indices written, in order. When the buffer is full the oldest transitions are
    /// overwritten; when `data` alone holds more than `capacity` transitions only its last
    /// `capacity` are kept.
    ///
    /// # Errors
    /// When `data` does not have the structure (keys, feature shapes, dtypes) of the data
    /// already stored; nothing is written then.
    pub fn extend(&mut self, data: &TensorDict) -> Result<Vec<i64>> {
        let n = data.numel();
        if n == 0 {
            return Ok(Vec::new());
        }
        let flat = data.reshape([n])?;
        let storage = match self.storage.take() {
            Some(s) => s,
            None => allocate(&flat, self.capacity)?,
        };
        let mut storage = storage;
        // Only the last `capacity` items survive a write larger than the buffer.
        let keep = n.min(self.capacity);
        let src = if keep < n {
            flat.index(&[BatchIndex::slice(Some(n - keep), None, 1)])?
        } else {
            flat
        };
        let start = (self.cursor + (n - keep)) % self.capacity;
        let idx: Vec<i64> = (0..keep).map(|j| (start + j) % self.capacity).collect();
        let device = storage.device().unwrap_or(Device::Cpu);
        let idx_t = Tensor::f_from_slice(&idx)?
            .f_to_kind(Kind::Int64)?
            .f_to_device(device)?;
        let res = storage.set_at(&[BatchIndex::Tensor(idx_t)], &src);
        self.storage = Some(storage);
        res?;
        self.cursor = (self.cursor + n) % self.capacity;
        self.len = (self.len + keep).min(self.capacity);
        Ok(idx)
    }

    /// Adds one transition (a tensordict without batch dims, or with a batch numel of 1).
    pub fn add(&mut self, data: &TensorDict) -> Result<Vec<i64>> {
        if data.numel() != 1 {
            return Err(Error::invalid(
                "ReplayBuffer::add",
                format!(
                    "add takes one transition, got batch size {:?} (use extend)",
                    data.batch_size()
                ),
            ));
        }
        self.extend(data)
    }

    /// Samples `batch_size` transitions (indices from the sampler), `[batch_size]` (or fewer,
    /// for the short last batch of a [`SamplerWithoutReplacement`](super::SamplerWithoutReplacement)
    /// epoch without `drop_last`). The result is a copy.
    ///
    /// # Errors
    /// When the buffer is empty or `batch_size < 1`.
    pub fn sample(&mut self, batch_size: i64) -> Result<TensorDict> {
        Ok(self.sample_with_indices(batch_size)?.0)
    }

    /// Like [`ReplayBuffer::sample`], also returning the storage indices read.
    pub fn sample_with_indices(&mut self, batch_size: i64) -> Result<(TensorDict, Vec<i64>)> {
        let storage = match &self.storage {
            Some(s) if self.len > 0 => s,
            _ => {
                return Err(Error::invalid(
                    "ReplayBuffer::sample",
                    "cannot sample from an empty buffer",
                ))
            }
        };
        let idx = self.sampler.sample_indices(self.len, batch_size)?;
        let device = storage.device().unwrap_or(Device::Cpu);
        let idx_t = Tensor::f_from_slice(&idx)?
            .f_to_kind(Kind::Int64)?
            .f_to_device(device)?;
        let out = storage.index(&[BatchIndex::Tensor(idx_t)])?;
        Ok((out, idx))
    }
}

/// Zeros shaped `[capacity, *feature_dims]` with the structure of `flat` (batch `[n]`).
fn allocate(flat: &TensorDict, capacity: i64) -> Result<TensorDict> {
    let row = flat.index(&[BatchIndex::slice(Some(0), Some(1), 1)])?;
    let zeros = row.apply(|t| Ok(Some(t.f_zeros_like()?)))?;
    zeros
        .expand([capacity])?
        .apply(|t| Ok(Some(t.f_contiguous()?)))
}
