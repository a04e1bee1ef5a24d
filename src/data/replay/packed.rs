//! [`PackedStorage`]: the in-memory storage of a [`ReplayBuffer`](super::ReplayBuffer), one row
//! per item.
//!
//! The leaves of a stored item are kept side by side: the leaves of one dtype (and device) share
//! one 2-D tensor of shape `[capacity, width]`, `width` the sum of their flattened item sizes,
//! so that reading a sampled item touches one row (one cache miss) per dtype instead of one per
//! leaf. A transition of Pendulum (six leaves: four float32, two bool) is two rows, not six.
//!
//! The stored tensordict the rest of the buffer sees ([`PackedStorage::view`]) is the usual
//! `[capacity, *item_batch]` tensordict whose leaves are views into those rows (a leaf of item
//! shape `s` at columns `offset..offset + prod(s)` of its group, viewed as `[capacity, *s]`):
//! writes go through it unchanged (`TensorDict::set_at`, with its checks, casts and errors), and
//! so do samplers that read stored keys. [`PackedStorage::gather`] reads sampled items with one
//! `index_select` per group and splits the gathered rows back into contiguous leaves, giving
//! what indexing the stored tensordict with the indices gives (same keys, nesting, batch sizes,
//! shapes, dtypes, devices and values).

use tch::{Device, Kind, Tensor};

use crate::error::{Error, Result};
use crate::tensordict::{BatchIndex, TensorDict};

/// The most rows an `extend` writes through host row copies (below that, a libtorch op's
/// overhead is most of the write; above it, `cat` + `copy_` move memory faster).
const HOST_WRITE_ROWS: i64 = 2048;

/// The leaves of one dtype and device, `[capacity, width]`.
#[derive(Debug)]
struct Group {
    kind: Kind,
    device: Device,
    /// The item widths of the group's leaves, in leaf order (`split_with_sizes`' sizes).
    widths: Vec<i64>,
    data: Tensor,
}

impl Group {
    fn width(&self) -> i64 {
        self.widths.iter().sum()
    }
}

/// Where a leaf lives: its group, its position among the group's leaves and its item shape.
#[derive(Debug)]
struct Slot {
    /// The leaf's key segments.
    path: Vec<String>,
    group: usize,
    /// The leaf's place in its group's `widths`.
    part: usize,
    /// The leaf's shape after the storage's first dim.
    item_shape: Vec<i64>,
}

/// Row-packed storage of `capacity` items. See the module docs.
#[derive(Debug)]
pub(crate) struct PackedStorage {
    capacity: i64,
    groups: Vec<Group>,
    /// One per leaf, in the stored tensordict's leaf order.
    slots: Vec<Slot>,
    view: TensorDict,
}

impl PackedStorage {
    /// Zeros for `capacity` items shaped like `items`' (batch `[n, *item_batch]`, `n >= 1`):
    /// the structure (keys, nesting, item batch shape, leaf item shapes, dtypes and devices)
    /// of its first item.
    pub(crate) fn allocate(items: &TensorDict, capacity: i64) -> Result<PackedStorage> {
        let row = items.index(&[BatchIndex::slice(Some(0), Some(1), 1)])?;
        let mut groups: Vec<Group> = Vec::new();
        let mut slots: Vec<Slot> = Vec::new();
        row.for_each_leaf(&mut |path, t| {
            let (kind, device) = (t.f_kind()?, t.device());
            let item_shape = t.size().get(1..).map(<[i64]>::to_vec).unwrap_or_default();
            let width = item_shape
                .iter()
                .try_fold(1i64, |acc, d| acc.checked_mul(*d))
                .ok_or_else(|| {
                    Error::invalid(
                        "ReplayBuffer::extend",
                        format!("an item of shape {item_shape:?} has too many elements"),
                    )
                })?;
            let group = match groups
                .iter()
                .position(|g| g.kind == kind && g.device == device)
            {
                Some(g) => g,
                None => {
                    groups.push(Group {
                        kind,
                        device,
                        widths: Vec::new(),
                        data: Tensor::new(),
                    });
                    groups.len() - 1
                }
            };
            let part = match groups.get_mut(group) {
                Some(g) => {
                    g.widths.push(width);
                    g.widths.len() - 1
                }
                None => 0,
            };
            slots.push(Slot {
                path: path.iter().map(|p| (*p).to_owned()).collect(),
                group,
                part,
                item_shape,
            });
            Ok(())
        })?;
        for g in &mut groups {
            g.data = Tensor::f_zeros([capacity, g.width()], (g.kind, g.device))?;
        }
        let mut shape = items.batch_size().to_vec();
        if let Some(first) = shape.first_mut() {
            *first = capacity;
        }
        let mut leaf = 0usize;
        let view = row.map_batch(&shape, &mut |_| {
            let (slot, group) = slot_group(&slots, &groups, leaf)?;
            leaf += 1;
            let offset: i64 = group.widths.iter().take(slot.part).sum();
            let width = group.widths.get(slot.part).copied().unwrap_or(0);
            let mut dims = vec![capacity];
            dims.extend_from_slice(&slot.item_shape);
            Ok(group
                .data
                .f_narrow(1, offset, width)?
                .f_view(dims.as_slice())?)
        })?;
        Ok(PackedStorage {
            capacity,
            groups,
            slots,
            view,
        })
    }

    /// The stored tensordict, `[capacity, *item_batch]`: its leaves are views of the rows
    /// (writing into them writes the storage).
    pub(crate) fn view(&self) -> &TensorDict {
        &self.view
    }

    /// The stored tensordict, mutably (for writes through `set_at`).
    pub(crate) fn view_mut(&mut self) -> &mut TensorDict {
        &mut self.view
    }

    /// Writes the `keep` items of `src` at rows `start, start + 1, …` modulo the capacity (one
    /// or two ranges) with one copy per group and range, when `src` has the stored layout
    /// exactly: the same leaves in the same order, of the stored item shapes, dtypes and
    /// devices, batch `[keep, *item_batch]`, none sharing memory with the storage. Returns
    /// `false`, having written nothing, otherwise (the caller then writes through
    /// `TensorDict::set_at`, whose checks, casts and errors apply).
    pub(crate) fn write_rows(&mut self, src: &TensorDict, start: i64, keep: i64) -> Result<bool> {
        let batch = src.batch_size();
        if batch.first() != Some(&keep) || batch.get(1..) != self.view.batch_size().get(1..) {
            return Ok(false);
        }
        let mut pieces: Vec<Vec<Tensor>> = self.groups.iter().map(|_| Vec::new()).collect();
        let mut leaf = 0usize;
        let mut fits = true;
        src.for_each_leaf(&mut |path, t| {
            let slot = match self.slots.get(leaf) {
                Some(s) if fits => s,
                _ => {
                    fits = false;
                    return Ok(());
                }
            };
            leaf += 1;
            let size = t.size();
            let group = self.groups.get(slot.group);
            fits = group.is_some_and(|g| {
                g.kind == t.kind() && g.device == t.device() && !shares_memory(&g.data, t)
            }) && size.first() == Some(&keep)
                && size.get(1..) == Some(slot.item_shape.as_slice())
                && path.len() == slot.path.len()
                && path.iter().zip(&slot.path).all(|(a, b)| *a == b.as_str());
            if fits {
                let width = group
                    .and_then(|g| g.widths.get(slot.part))
                    .copied()
                    .unwrap_or(0);
                if let Some(p) = pieces.get_mut(slot.group) {
                    p.push(if size.as_slice() == [keep, width] {
                        t.shallow_clone()
                    } else {
                        t.f_reshape([keep, width])?
                    });
                }
            }
            Ok(())
        })?;
        if !fits || leaf != self.slots.len() {
            return Ok(false);
        }
        let _guard = tch::no_grad_guard();
        let first = keep.min(self.capacity - start);
        for (g, p) in self.groups.iter().zip(&pieces) {
            // on the CPU, a small batch (a collector's, an environment step's) is one pass of
            // row copies straight from the leaves; a large one (filling the buffer) is copied
            // faster by libtorch's `cat` and `copy_`, which move whole columns at once
            if keep <= HOST_WRITE_ROWS && crate::host::out::scatter_row_blocks(&g.data, start, p)? {
                continue;
            }
            let rows = match p.as_slice() {
                [one] => one.shallow_clone(),
                _ => Tensor::f_cat(p, 1)?,
            };
            if first == keep {
                g.data.f_narrow(0, start, keep)?.f_copy_(&rows)?;
            } else {
                g.data
                    .f_narrow(0, start, first)?
                    .f_copy_(&rows.f_narrow(0, 0, first)?)?;
                g.data
                    .f_narrow(0, 0, keep - first)?
                    .f_copy_(&rows.f_narrow(0, first, keep - first)?)?;
            }
        }
        Ok(true)
    }

    /// The items at `indices` (negative ones count from the end of the storage), `[len,
    /// *item_batch]`, each leaf a fresh contiguous tensor: `self.view().index(&[indices])`,
    /// with the same error for an index out of `-capacity..capacity`.
    pub(crate) fn gather(&self, indices: &[i64]) -> Result<TensorDict> {
        let cap = self.capacity;
        if let (Some(lo), Some(hi)) = (indices.iter().min(), indices.iter().max()) {
            for v in [*lo, *hi] {
                if v < -cap || v >= cap {
                    return Err(Error::IndexOutOfRange {
                        op: "index",
                        index: v,
                        what: "batch dim 0".into(),
                        size: cap,
                    });
                }
            }
        }
        let wrapped: Vec<i64> = indices.iter().map(|v| v.rem_euclid(cap.max(1))).collect();
        let n = i64::try_from(wrapped.len()).unwrap_or(i64::MAX);
        // one gather per group, split into its leaves (contiguous copies)
        let mut parts: Vec<Vec<Tensor>> = Vec::with_capacity(self.groups.len());
        for g in &self.groups {
            // on the CPU, one pass of row copies straight into the leaves
            if let Some(leaves) = crate::host::out::gather_row_blocks(&g.data, &wrapped, &g.widths)?
            {
                parts.push(leaves);
                continue;
            }
            let index = Tensor::f_from_slice(&wrapped)?;
            let rows = if g.device == Device::Cpu {
                g.data.f_index_select(0, &index)?
            } else {
                g.data.f_index_select(0, &index.f_to_device(g.device)?)?
            };
            parts.push(if g.widths.len() == 1 {
                vec![rows]
            } else {
                rows.f_split_with_sizes_copy(g.widths.as_slice(), 1)?
            });
        }
        let mut batch = self.view.batch_size().to_vec();
        if let Some(first) = batch.first_mut() {
            *first = n;
        }
        let mut leaf = 0usize;
        self.view.map_batch(&batch, &mut |_| {
            let slot = self.slots.get(leaf).ok_or_else(internal)?;
            leaf += 1;
            let part = parts
                .get(slot.group)
                .and_then(|p| p.get(slot.part))
                .ok_or_else(internal)?;
            if slot.item_shape.len() == 1 {
                return Ok(part.shallow_clone()); // `[n, width]` already
            }
            let mut dims = vec![n];
            dims.extend_from_slice(&slot.item_shape);
            Ok(part.f_view(dims.as_slice())?)
        })
    }
}

/// Whether `t`'s memory may overlap `data`'s (a leaf of the storage written back into it):
/// the byte ranges their first and last elements span intersect.
fn shares_memory(data: &Tensor, t: &Tensor) -> bool {
    let span = |x: &Tensor| -> (usize, usize) {
        let es = x.kind().elt_size_in_bytes();
        let reach: i64 = x
            .size()
            .iter()
            .zip(x.stride())
            .map(|(n, s)| (n - 1).max(0) * s.abs())
            .sum();
        let lo = (x.data_ptr() as usize).saturating_sub(usize::try_from(reach).unwrap_or(0) * es);
        let hi = (x.data_ptr() as usize)
            .saturating_add((usize::try_from(reach).unwrap_or(usize::MAX / 2) + 1) * es);
        (lo, hi)
    };
    if data.device() != t.device() {
        return false;
    }
    let ((a0, a1), (b0, b1)) = (span(data), span(t));
    a0 < b1 && b0 < a1
}

/// The slot of leaf `leaf` and its group.
fn slot_group<'a>(
    slots: &'a [Slot],
    groups: &'a [Group],
    leaf: usize,
) -> Result<(&'a Slot, &'a Group)> {
    let slot = slots.get(leaf).ok_or_else(internal)?;
    let group = groups.get(slot.group).ok_or_else(internal)?;
    Ok((slot, group))
}

/// The leaf walk and the slots disagree (a bug, not a user error).
fn internal() -> Error {
    Error::invalid(
        "ReplayBuffer",
        "internal: the packed storage's leaves differ from its layout",
    )
}

#[cfg(test)]
mod tests {
    use tch::{Device, Kind, Tensor};

    use super::PackedStorage;
    use crate::data::replay::{ReplayBuffer, Sampled, Sampler};
    use crate::tensordict::{cat, BatchIndex, Entry, KeysOptions, TensorDict};
    use crate::Result;

    /// `a` and `b` hold the same keys, nesting, batch sizes, and leaves of the same shapes,
    /// dtypes, devices and values, and every leaf of `a` is contiguous.
    fn assert_same(a: &TensorDict, b: &TensorDict) {
        assert_eq!(a.batch_size(), b.batch_size());
        let (ka, kb) = (
            a.items(KeysOptions::nested()),
            b.items(KeysOptions::nested()),
        );
        assert_eq!(
            ka.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>(),
            kb.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>()
        );
        for ((k, ea), (_, eb)) in ka.iter().zip(&kb) {
            match (ea, eb) {
                (Entry::Tensor(x), Entry::Tensor(y)) => {
                    assert_eq!(x.size(), y.size(), "{k}");
                    assert_eq!(x.kind(), y.kind(), "{k}");
                    assert_eq!(x.device(), y.device(), "{k}");
                    assert!(x.is_contiguous(), "{k}");
                    assert!(x.equal(y), "{k}: {x} vs {y}");
                }
                (Entry::Dict(x), Entry::Dict(y)) => assert_eq!(x.batch_size(), y.batch_size()),
                _ => panic!("{k}: a tensor on one side, a tensordict on the other"),
            }
        }
    }

    /// A contiguous copy of `td`'s leaves.
    fn contiguous(td: &TensorDict) -> Result<TensorDict> {
        td.apply(|t| Ok(Some(t.f_contiguous()?)))
    }

    /// `n` items with leaves of several dtypes (float32, float64, int64, bool, uint8 of zero
    /// width), multi-dim items, and a nested level with an extra batch dim; values from `start`.
    fn items(n: i64, start: i64) -> Result<TensorDict> {
        let ar = |k: Kind, shape: &[i64]| -> Result<Tensor> {
            let numel: i64 = shape.iter().product();
            Ok(Tensor::f_arange_start(
                start * 100,
                start * 100 + numel,
                (Kind::Int64, Device::Cpu),
            )?
            .f_reshape(shape)?
            .f_to_kind(k)?)
        };
        let next = TensorDict::new([n, 2])?
            .with("observation", ar(Kind::Float, &[n, 2, 3])?)?
            .with(
                "done",
                ar(Kind::Int64, &[n, 2, 1])?.f_remainder(3)?.f_eq(0)?,
            )?
            .with("count", ar(Kind::Int64, &[n, 2])?)?;
        TensorDict::new([n])?
            .with("observation", ar(Kind::Float, &[n, 3])?)?
            .with("pixels", ar(Kind::Double, &[n, 2, 2, 3])?)?
            .with("empty", ar(Kind::Uint8, &[n, 0, 4])?)?
            .with("step", ar(Kind::Int64, &[n])?)?
            .with(("next", "inner"), next)?
            .with(
                ("next", "flag"),
                ar(Kind::Int64, &[n, 1])?.f_remainder(2)?.f_eq(1)?,
            )
    }

    /// Indexing each leaf of `td` with `idx` (`index_select` per leaf, negatives wrapped).
    fn per_leaf(td: &TensorDict, idx: &[i64]) -> Result<TensorDict> {
        let cap = td.batch_size().first().copied().unwrap_or(1);
        let wrapped: Vec<i64> = idx.iter().map(|i| i.rem_euclid(cap)).collect();
        let index = Tensor::f_from_slice(&wrapped)?;
        let mut shape = td.batch_size().to_vec();
        shape[0] = idx.len() as i64;
        td.map_batch(&shape, &mut |t| Ok(t.f_index_select(0, &index)?))
    }

    #[test]
    fn gather_is_the_per_leaf_gather() -> Result<()> {
        let src = items(6, 1)?;
        let mut storage = PackedStorage::allocate(&src, 6)?;
        storage
            .view_mut()
            .set_at(&[BatchIndex::slice(Some(0), Some(6), 1)], &src)?;
        // three dtype groups of the root and nested levels, plus a group of zero width
        assert_eq!(storage.groups.len(), 5);
        // the view is the stored data, with the stored structure
        assert_same(&contiguous(storage.view())?, &src);
        let idx = [5, 0, 0, -1, 3, -6, 2];
        let got = storage.gather(&idx)?;
        assert_same(&got, &per_leaf(&src, &idx)?);
        assert_same(
            &got,
            &storage
                .view()
                .index(&[BatchIndex::Tensor(Tensor::from_slice(&idx))])?,
        );
        assert_eq!(
            got.get_dict(("next", "inner"))
                .map(|d| d.batch_size().to_vec()),
            Some(vec![7, 2])
        );
        // no indices: an empty batch
        assert_eq!(storage.gather(&[])?.batch_size(), &[0]);
        // out of range: TensorDict::index's error
        for bad in [6i64, -7] {
            let want = storage
                .view()
                .index(&[BatchIndex::Tensor(Tensor::from_slice(&[0, bad]))])
                .map(|_| ())
                .err()
                .map(|e| e.to_string());
            let got = storage
                .gather(&[0, bad])
                .map(|_| ())
                .err()
                .map(|e| e.to_string());
            assert!(want.is_some());
            assert_eq!(got, want);
        }
        Ok(())
    }

    /// A sampler replaying fixed indices.
    #[derive(Debug)]
    struct Fixed(Vec<i64>);

    impl Sampler for Fixed {
        fn sample_indices(&mut self, _len: i64, _batch: i64) -> Result<Vec<i64>> {
            Ok(self.0.clone())
        }
        fn sample_from(&mut self, _s: &TensorDict, len: i64, batch: i64) -> Result<Sampled> {
            Ok(Sampled {
                indices: self.sample_indices(len, batch)?,
                weights: None,
            })
        }
        fn extended(&mut self, _indices: &[i64]) -> Result<()> {
            Ok(())
        }
        fn reset(&mut self) {}
    }

    #[test]
    fn buffer_wraps_and_samples_whole_rows() -> Result<()> {
        // 3 + 4 items into 5 slots: the last two overwrite slots 0 and 1
        let (a, b) = (items(3, 1)?, items(4, 2)?);
        let mut rb = ReplayBuffer::with_sampler(5, Fixed(vec![4, 1, 1, 0, 2, -1]))?;
        rb.extend(&a)?;
        assert_eq!(rb.extend(&b)?, vec![3, 4, 0, 1]);
        let all = cat(&[&a, &b], 0)?;
        let want = per_leaf(&all, &[5, 6, 2, 3, 4])?;
        assert_same(&contiguous(&rb.storage()?.expect("stored"))?, &want);
        let (s, idx) = rb.sample_with_indices(6)?;
        assert_eq!(idx, vec![4, 1, 1, 0, 2, -1]);
        assert_same(&s, &per_leaf(&want, &idx)?);
        // a write larger than the buffer keeps its last 5 items
        let c = items(7, 3)?;
        rb.extend(&c)?;
        let (s, _) = rb.sample_with_indices(6)?;
        let want = per_leaf(&c, &[2, 4, 4, 3, 5, 2])?; // slot k holds c[(k - 4) mod 5 + 2]
        assert_same(&s, &want);
        // clear keeps the storage; the next extend writes from slot 0
        rb.clear();
        rb.extend(&a)?;
        assert_same(&contiguous(&rb.storage()?.expect("stored"))?, &a);
        Ok(())
    }

    #[test]
    fn large_and_small_writes_interleave() -> Result<()> {
        // 2,500 items (above HOST_WRITE_ROWS: libtorch's cat + copy_), then 700 (host row
        // copies) that wrap: item j of the two goes to slot j mod 3,000, the last write wins
        let (a, b) = (items(2500, 1)?, items(700, 9)?);
        const { assert!(2500 > super::HOST_WRITE_ROWS && 700 <= super::HOST_WRITE_ROWS) };
        let mut rb = ReplayBuffer::new(3000)?;
        rb.extend(&a)?;
        rb.extend(&b)?;
        let all = cat(&[&a, &b], 0)?;
        let slots: Vec<i64> = (0..3000)
            .map(|s| if s < 200 { 3000 + s } else { s })
            .collect();
        let want = per_leaf(&all, &slots)?;
        assert_same(&contiguous(&rb.storage()?.expect("stored"))?, &want);
        let (s, idx) = rb.sample_with_indices(300)?;
        assert_same(&s, &per_leaf(&want, &idx)?);
        Ok(())
    }

    #[test]
    fn a_random_buffer_samples_what_was_written() -> Result<()> {
        let mut rb = ReplayBuffer::new(16)?;
        let mut written = Vec::new();
        for k in 0..9 {
            let batch = items(5, k)?;
            rb.extend(&batch)?;
            written.push(batch);
        }
        // 45 items into 16 slots: item j went to slot j mod 16, the last write wins
        let all = cat(&written, 0)?;
        let slots: Vec<i64> = (0..16)
            .map(|s| if 32 + s < 45 { 32 + s } else { 16 + s })
            .collect();
        let stored = per_leaf(&all, &slots)?;
        let (s, idx) = rb.sample_with_indices(32)?;
        assert_same(&s, &per_leaf(&stored, &idx)?);
        Ok(())
    }

    #[test]
    fn writes_off_the_packed_layout_take_the_checked_path() -> Result<()> {
        let mut rb = ReplayBuffer::with_sampler(4, Fixed(vec![0, 1, 2, 3]))?;
        let a = items(2, 1)?;
        rb.extend(&a)?;
        // a float64 observation is cast into the float32 storage, as `set_at` does
        let mut b = items(2, 2)?;
        let obs = b.get_or_err("observation")?.f_to_kind(Kind::Double)?;
        b.set("observation", obs.f_add_scalar(0.25)?)?;
        rb.extend(&b)?;
        // the buffer's own rows written back (they share its memory): a copy is stored
        let back =
            rb.storage()?
                .expect("stored")
                .index(&[BatchIndex::slice(Some(0), Some(2), 1)])?;
        let back_copy = back.apply(|t| Ok(Some(t.copy())))?;
        rb.extend(&back)?;
        let mut want_b = b.clone();
        let cast = b.get_or_err("observation")?.f_to_kind(Kind::Float)?;
        want_b.set("observation", cast)?;
        let want = cat(&[&back_copy, &want_b], 0)?;
        assert_same(&contiguous(&rb.storage()?.expect("stored"))?, &want);
        let (s, _) = rb.sample_with_indices(4)?;
        assert_same(&s, &want);
        // an item of another shape is refused, with nothing written
        let mut bad = items(1, 0)?;
        bad.set(
            "observation",
            Tensor::zeros([1, 5], (Kind::Float, Device::Cpu)),
        )?;
        assert!(rb.extend(&bad).is_err());
        assert_same(&contiguous(&rb.storage()?.expect("stored"))?, &want);
        Ok(())
    }
}
