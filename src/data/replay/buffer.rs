//! [`ReplayBuffer`]: a fixed-capacity tensordict storage (TorchRL's `LazyTensorStorage` with a
//! round-robin writer) and a [`Sampler`].
//!
//! The storage is allocated on the first `extend`, shaped `[capacity, *item_shape]` per leaf
//! after the first data's structure (an item is one slice along the first batch dim). Writes
//! go round-robin: once full, the oldest transitions are overwritten first (FIFO). In memory,
//! an item's leaves are kept side by side, one row per dtype (see `packed.rs`), so that
//! sampling an item reads one row per dtype rather than one per leaf; what `storage` and
//! `sample` return is the same tensordict either way.
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

use super::memmap::{leaf_keys, LazyMemmapStorage};
use super::packed::PackedStorage;
use super::samplers::{RandomSampler, Sampled, Sampler};
use crate::error::{Error, Result};
use crate::tensordict::{fmt_key_list, BatchIndex, NestedKey, TensorDict};

/// A replay buffer over a tensordict storage. See the module docs.
#[derive(Debug)]
pub struct ReplayBuffer<S: Sampler = RandomSampler> {
    storage: Option<PackedStorage>,
    /// The disk-backed storage, when the buffer was made with [`ReplayBuffer::with_memmap`]
    /// (then `storage` stays `None`).
    disk: Option<LazyMemmapStorage>,
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
            disk: None,
            capacity,
            len: 0,
            cursor: 0,
            sampler,
        })
    }

    /// A buffer of `capacity` items kept in memory-mapped files in `dir` (TorchRL's
    /// `LazyMemmapStorage`, see [`LazyMemmapStorage`]): the files are made from the first
    /// batch; a folder that already holds a storage of this capacity is reopened (its items,
    /// length and write cursor; the sampler is told about the stored items as after an
    /// `extend`).
    ///
    /// # Errors
    /// When `capacity` is not positive, or the folder cannot be used (see
    /// [`LazyMemmapStorage::new`]).
    pub fn with_memmap(
        capacity: i64,
        sampler: S,
        dir: impl AsRef<std::path::Path>,
    ) -> Result<Self> {
        let mut rb = ReplayBuffer::with_sampler(capacity, sampler)?;
        let disk = LazyMemmapStorage::new(dir, capacity)?;
        if let Some((len, cursor)) = disk.reopened() {
            rb.len = len;
            rb.cursor = cursor;
            let idx: Vec<i64> = (0..len).collect();
            rb.sampler.extended(&idx)?;
        }
        rb.disk = Some(disk);
        Ok(rb)
    }

    /// The disk-backed storage, for a buffer made with [`ReplayBuffer::with_memmap`].
    pub fn memmap_storage(&self) -> Option<&LazyMemmapStorage> {
        self.disk.as_ref()
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
        if let Some(d) = &self.disk {
            // best effort: a stale meta.json only reopens the old items
            let _ = d.save_meta(0, 0);
        }
    }

    /// The stored transitions in storage order, `[len]` (views of the storage; copies for a
    /// disk-backed buffer), or `None` when empty. An in-memory buffer's leaves are views into
    /// its rows of packed leaves, so a leaf that shares its rows with others is not contiguous
    /// (its row stride is the row's width).
    pub fn storage(&self) -> Result<Option<TensorDict>> {
        if let Some(d) = &self.disk {
            if self.len == 0 || !d.is_initialized() {
                return Ok(None);
            }
            let idx: Vec<i64> = (0..self.len).collect();
            return d.read(&idx).map(Some);
        }
        match &self.storage {
            Some(s) if self.len > 0 => Ok(Some(s.view().index(&[BatchIndex::slice(
                Some(0),
                Some(self.len),
                1,
            )])?)),
            _ => Ok(None),
        }
    }

    /// Adds the items of `data`, split along its **first** batch dim only (TorchRL's storages,
    /// `ndim=1`): a `[B]` batch adds `B` transitions, a `[B, T]` batch adds `B` items of shape
    /// `[T]` (reshape it to `[-1]` first to store `B * T` transitions), a batch-less tensordict
    /// adds one item. Returns the storage indices written, in order. When the buffer is full the
    /// oldest items are overwritten; when `data` alone holds more than `capacity` items only its
    /// last `capacity` are kept. The sampler is told which indices were written (a prioritized
    /// sampler gives them its default priority).
    ///
    /// # Errors
    /// When `data`'s keys differ from the stored ones (the error lists both and suggests
    /// `select`), or its item shapes / dtypes differ; nothing is written then.
    pub fn extend(&mut self, data: &TensorDict) -> Result<Vec<i64>> {
        let op = "ReplayBuffer::extend";
        let items = if data.batch_size().is_empty() {
            data.unsqueeze(0)?
        } else {
            data.clone()
        };
        let n = items.batch_size().first().copied().unwrap_or(0);
        if n == 0 {
            return Ok(Vec::new());
        }
        if let Some(stored) = &self.storage {
            self.check_keys(op, leaf_keys(stored.view()), &items)?;
        }
        if let Some(d) = &self.disk {
            if d.is_initialized() {
                self.check_keys(op, d.key_list(), &items)?;
            }
        }
        // Only the last `capacity` items survive a write larger than the buffer.
        let keep = n.min(self.capacity);
        let src = if keep < n {
            items.index(&[BatchIndex::slice(Some(n - keep), None, 1)])?
        } else {
            items
        };
        let start = (self.cursor + (n - keep)) % self.capacity;
        let idx: Vec<i64> = (0..keep).map(|j| (start + j) % self.capacity).collect();
        if let Some(d) = self.disk.as_mut() {
            d.write(&src, &idx)?;
            self.cursor = (self.cursor + n) % self.capacity;
            self.len = (self.len + keep).min(self.capacity);
            d.save_meta(self.len, self.cursor)?;
            self.sampler.extended(&idx)?;
            return Ok(idx);
        }
        let mut storage = match self.storage.take() {
            Some(s) => s,
            None => PackedStorage::allocate(&src, self.capacity)?,
        };
        // one copy per dtype group when the batch has the stored layout; otherwise (other
        // dtypes to cast, other shapes to refuse) the per-leaf writes, with their checks
        let res = match storage.write_rows(&src, start, keep) {
            Ok(true) => Ok(()),
            Ok(false) => write_round_robin(storage.view_mut(), &src, start, keep, self.capacity),
            Err(e) => Err(e),
        };
        let item_shape = storage
            .view()
            .batch_size()
            .get(1..)
            .map(<[i64]>::to_vec)
            .unwrap_or_default();
        self.storage = Some(storage);
        res.map_err(|e| {
            e.context(format!(
                "{op}: the batch does not fit the buffer's items (capacity {}, item batch shape                  {item_shape:?}, set by the first extend)",
                self.capacity
            ))
        })?;
        self.cursor = (self.cursor + n) % self.capacity;
        self.len = (self.len + keep).min(self.capacity);
        self.sampler.extended(&idx)?;
        Ok(idx)
    }

    /// Refuses a batch whose leaf keys differ from the stored ones, listing both sides.
    fn check_keys(&self, op: &'static str, have: Vec<NestedKey>, items: &TensorDict) -> Result<()> {
        let got = leaf_keys(items);
        let only_batch: Vec<NestedKey> =
            got.iter().filter(|k| !have.contains(k)).cloned().collect();
        let only_buffer: Vec<NestedKey> =
            have.iter().filter(|k| !got.contains(k)).cloned().collect();
        if only_batch.is_empty() && only_buffer.is_empty() {
            return Ok(());
        }
        Err(Error::invalid(
            op,
            format!(
                "the batch's keys differ from the replay buffer's (ReplayBuffer of capacity {},                  holding {} items; its keys were set by the first extend):\n- only in the batch: \
                 {}\n- only in the buffer: {}\nextend with the buffer's keys: \
                 `data.select(&[...], Strict::No)` keeps the common ones (a collector's \
                 random-action batches, for instance, lack the policy's outputs)",
                self.capacity,
                self.len,
                fmt_key_list(&only_batch),
                fmt_key_list(&only_buffer)
            ),
        ))
    }

    /// Adds one item (`data` is the item: its whole batch shape is the item's).
    pub fn add(&mut self, data: &TensorDict) -> Result<Vec<i64>> {
        self.extend(&data.unsqueeze(0)?)
    }

    /// Samples `batch_size` items (indices from the sampler), `[batch_size, *item_shape]` (or
    /// fewer, for the short last batch of a
    /// [`SamplerWithoutReplacement`](super::SamplerWithoutReplacement) epoch without
    /// `drop_last`). A sampler that gives importance weights (a
    /// [`PrioritizedSampler`](super::PrioritizedSampler)) adds `"index"` (int64) and
    /// `"priority_weight"` (float32), expanded to the batch shape. The result is a copy.
    ///
    /// # Errors
    /// When the buffer is empty or `batch_size < 1`.
    pub fn sample(&mut self, batch_size: i64) -> Result<TensorDict> {
        Ok(self.sample_with_indices(batch_size)?.0)
    }

    /// Like [`ReplayBuffer::sample`], also returning the storage indices read.
    pub fn sample_with_indices(&mut self, batch_size: i64) -> Result<(TensorDict, Vec<i64>)> {
        if let Some(d) = &self.disk {
            if self.len == 0 || !d.is_initialized() {
                return Err(Error::invalid(
                    "ReplayBuffer::sample",
                    "cannot sample from an empty buffer",
                ));
            }
            // only the keys the sampler reads (none for most samplers) are loaded for it
            let all: Vec<i64> = (0..self.len).collect();
            let view = match self.sampler.storage_keys() {
                Some(keys) if keys.is_empty() => TensorDict::new([self.len])?,
                Some(keys) => d.read_keys(&all, Some(&keys))?,
                None => d.read(&all)?,
            };
            let sampled = self.sampler.sample_from(&view, self.len, batch_size)?;
            let mut out = d.read(&sampled.indices)?;
            add_weights(&mut out, &sampled, Device::Cpu)?;
            return Ok((out, sampled.indices));
        }
        let storage = match &self.storage {
            Some(s) if self.len > 0 => s,
            _ => {
                return Err(Error::invalid(
                    "ReplayBuffer::sample",
                    "cannot sample from an empty buffer",
                ))
            }
        };
        let sampled = self
            .sampler
            .sample_from(storage.view(), self.len, batch_size)?;
        let idx = sampled.indices.clone();
        let device = storage.view().device().unwrap_or(Device::Cpu);
        // one row gather per dtype group (the same items as `view().index(&[idx])`)
        let mut out = storage.gather(&idx)?;
        add_weights(&mut out, &sampled, device)?;
        Ok((out, idx))
    }
}

/// Writes the `keep` items of `src` at slots `start, start + 1, …` modulo `capacity`: one or
/// two contiguous ranges, each a slice copy (a `memcpy` per leaf; an index tensor would take
/// libtorch's element-wise `index_put_`). Both ranges hold the same leaves and item shapes, so
/// if the first write passes `set_at`'s checks the second does too.
fn write_round_robin(
    storage: &mut TensorDict,
    src: &TensorDict,
    start: i64,
    keep: i64,
    capacity: i64,
) -> Result<()> {
    let first = keep.min(capacity - start);
    let slice = |from: i64, len: i64| BatchIndex::slice(Some(from), Some(from + len), 1);
    if first == keep {
        return storage.set_at(&[slice(start, keep)], src);
    }
    storage.set_at(&[slice(start, first)], &src.index(&[slice(0, first)])?)?;
    storage.set_at(
        &[slice(0, keep - first)],
        &src.index(&[slice(first, keep - first)])?,
    )
}

impl ReplayBuffer<super::PrioritizedSampler> {
    /// Sets the priorities of the items at `index` (one priority, or one per index): TorchRL's
    /// `update_priority`.
    pub fn update_priority(&mut self, index: &[i64], priority: &[f64]) -> Result<()> {
        self.sampler.update_priority(index, priority)
    }

    /// Reads `"index"` and `priority_key` (TorchRL's default `"td_error"`) from a sampled
    /// tensordict and updates the priorities (an item with trailing dims takes the max over
    /// them, TorchRL's default reduction): TorchRL's `update_tensordict_priority`.
    pub fn update_tensordict_priority(
        &mut self,
        td: &TensorDict,
        priority_key: impl crate::tensordict::AsKey,
    ) -> Result<()> {
        let mut index = td.get_or_err("index")?.shallow_clone();
        while index.dim() > 1 {
            index = index.f_select(-1, 0)?;
        }
        let mut p = td
            .get_or_err(priority_key)?
            .f_detach()?
            .f_to_kind(Kind::Double)?;
        while p.dim() > 1 {
            p = p.f_amax(&[-1i64][..], false)?;
        }
        let index = Vec::<i64>::try_from(index.f_to_kind(Kind::Int64)?.f_reshape([-1])?)?;
        let p = Vec::<f64>::try_from(p.f_reshape([-1])?)?;
        self.sampler.update_priority(&index, &p)
    }
}

/// Adds `"index"` and `"priority_weight"` (expanded to the batch shape) when the sampler gave
/// weights.
fn add_weights(out: &mut TensorDict, sampled: &Sampled, device: Device) -> Result<()> {
    if let Some(w) = &sampled.weights {
        let shape = out.batch_size().to_vec();
        let on_device = |t: Tensor| -> Result<Tensor> {
            Ok(if device == Device::Cpu {
                t
            } else {
                t.f_to_device(device)?
            })
        };
        let idx = on_device(Tensor::f_from_slice(&sampled.indices)?)?;
        let w = on_device(Tensor::f_from_slice(w)?)?;
        out.set("index", expand_right(&idx, &shape)?)?;
        out.set("priority_weight", expand_right(&w, &shape)?)?;
    }
    Ok(())
}

/// `t` (`[B]`) viewed as `[B, 1, …]` and expanded to `shape` (`[B, …]`).
fn expand_right(t: &Tensor, shape: &[i64]) -> Result<Tensor> {
    if shape.len() == 1 {
        return Ok(t.shallow_clone()); // `[B]` already, and contiguous
    }
    let mut v = t.shallow_clone();
    while v.dim() < shape.len() {
        v = v.f_unsqueeze(-1)?;
    }
    Ok(v.f_expand(shape, false)?.f_contiguous()?)
}
