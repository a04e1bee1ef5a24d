//! [`LazyMemmapStorage`]: a replay storage on disk, TorchRL's `LazyMemmapStorage`.
//!
//! Nothing is created until the first batch arrives: then one memory-mapped file per leaf is
//! made in the storage's folder, sized `capacity × item size` after that batch's keys, item
//! shapes and dtypes, and `meta.json` records the layout (keys, shapes, dtypes, file names)
//! with the buffer's length and write cursor, rewritten after every `extend`. A buffer made on
//! a folder that already holds a storage reopens it: the same items, length and cursor, so a
//! restarted program continues where it stopped (a sampler's own state, such as priorities, is
//! not on disk: a reopened prioritized buffer gives every item the default priority).
//!
//! Items are copied in and out of the mapped files row by row; a sample, and
//! [`ReplayBuffer::storage`](super::ReplayBuffer::storage), are ordinary tensors (copies), so the
//! buffer can hold more than memory: only the pages touched are resident.
//!
//! ```
//! use tch::{Device, Kind, Tensor};
//! use torchrl::data::replay::{RandomSampler, ReplayBuffer};
//! use torchrl::TensorDict;
//! # fn main() -> torchrl::Result<()> {
//! let dir = std::env::temp_dir().join(format!("rb_doc_{}", std::process::id()));
//! let batch = |s: i64| TensorDict::new([3])?.with("x", Tensor::arange_start(s, s + 3, (Kind::Int64, Device::Cpu)));
//! {
//!     let mut rb = ReplayBuffer::with_memmap(5, RandomSampler::new(0), &dir)?;
//!     rb.extend(&batch(0)?)?;
//!     rb.extend(&batch(3)?)?; // 6 items into 5 slots
//! } // dropped: the files stay
//! let rb = ReplayBuffer::with_memmap(5, RandomSampler::new(0), &dir)?; // reopened
//! assert_eq!(rb.len(), 5);
//! let x = rb.storage()?.map(|s| Vec::<i64>::try_from(s.get("x").unwrap()).unwrap());
//! assert_eq!(x, Some(vec![5, 1, 2, 3, 4]));
//! std::fs::remove_dir_all(&dir).ok();
//! # Ok(()) }
//! ```

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tch::{Device, Kind, Tensor};

use crate::error::{Error, Result};
use crate::files::{is_plain_file_name, PLAIN_FILE_NAME};
use crate::host::mmap::MappedFile;
use crate::tensordict::{AsKey, KeysOptions, NestedKey, TensorDict};

/// One leaf's file.
#[derive(Debug)]
struct Leaf {
    key: NestedKey,
    /// The item's shape for this leaf (the item batch dims, then the feature dims).
    shape: Vec<i64>,
    kind: Kind,
    row_bytes: usize,
    map: MappedFile,
}

/// What `meta.json` holds.
#[derive(Serialize, Deserialize)]
struct Meta {
    version: u32,
    capacity: i64,
    len: i64,
    cursor: i64,
    item_batch: Vec<i64>,
    leaves: Vec<MetaLeaf>,
}

#[derive(Serialize, Deserialize)]
struct MetaLeaf {
    key: Vec<String>,
    shape: Vec<i64>,
    dtype: String,
    file: String,
}

const KINDS: [(Kind, &str); 10] = [
    (Kind::Float, "float32"),
    (Kind::Double, "float64"),
    (Kind::Half, "float16"),
    (Kind::BFloat16, "bfloat16"),
    (Kind::Int64, "int64"),
    (Kind::Int, "int32"),
    (Kind::Int16, "int16"),
    (Kind::Int8, "int8"),
    (Kind::Uint8, "uint8"),
    (Kind::Bool, "bool"),
];

fn kind_name(kind: Kind) -> Result<&'static str> {
    KINDS
        .iter()
        .find(|(k, _)| *k == kind)
        .map(|(_, n)| *n)
        .ok_or_else(|| {
            Error::invalid(
                "LazyMemmapStorage",
                format!("dtype {kind:?} cannot be stored on disk"),
            )
        })
}

/// The most bytes one leaf file may span (capacity × item bytes): 2^44 (16 TiB), far above any
/// real buffer; a larger layout, from a `meta.json` or a first batch, is refused before any
/// file is touched.
pub const MAX_LEAF_BYTES: u64 = 1 << 44;

/// One item's bytes and the file's (`capacity` items) for a leaf of item shape `shape`, with
/// checked arithmetic; the reason when a size is negative, overflows or passes
/// [`MAX_LEAF_BYTES`].
fn leaf_bytes(
    shape: &[i64],
    kind: Kind,
    capacity: i64,
) -> std::result::Result<(usize, u64), String> {
    let mut numel: u64 = 1;
    for &d in shape {
        let d = u64::try_from(d).map_err(|_| format!("shape {shape:?} has a negative size"))?;
        numel = numel
            .checked_mul(d)
            .ok_or_else(|| format!("shape {shape:?} overflows"))?;
    }
    let row = numel
        .checked_mul(kind.elt_size_in_bytes() as u64)
        .filter(|r| *r <= MAX_LEAF_BYTES)
        .ok_or_else(|| format!("an item of shape {shape:?} exceeds {MAX_LEAF_BYTES} bytes"))?;
    let total = row
        .checked_mul(u64::try_from(capacity).unwrap_or(0))
        .filter(|t| *t <= MAX_LEAF_BYTES)
        .ok_or_else(|| {
            format!(
                "{capacity} items of shape {shape:?} ({row} bytes each) exceed {MAX_LEAF_BYTES} bytes"
            )
        })?;
    let row = usize::try_from(row)
        .map_err(|_| format!("an item of shape {shape:?} does not fit in memory"))?;
    Ok((row, total))
}

/// A disk-backed storage of `capacity` items in a folder. See the module docs.
#[derive(Debug)]
pub struct LazyMemmapStorage {
    dir: PathBuf,
    capacity: i64,
    item_batch: Vec<i64>,
    /// Empty until the first write (or a reopened layout).
    leaves: Vec<Leaf>,
    /// `(len, cursor)` read from `meta.json` when the folder held a storage.
    reopened: Option<(i64, i64)>,
}

impl LazyMemmapStorage {
    /// A storage of `capacity` items in `dir` (created if missing). When `dir` holds a storage
    /// (`meta.json`), it is reopened.
    ///
    /// # Errors
    /// A `capacity` below 1; a folder that cannot be created; a storage on disk of another
    /// capacity, or whose `meta.json` or files fail the checks of a reopen (named, nothing on
    /// disk changed): a layout out of range, a file name outside the folder, a leaf file
    /// missing or of another size than the layout needs.
    pub fn new(dir: impl AsRef<Path>, capacity: i64) -> Result<Self> {
        let op = "LazyMemmapStorage::new";
        if capacity < 1 {
            return Err(Error::argument(
                op,
                "capacity",
                "at least 1",
                capacity.to_string(),
            ));
        }
        let dir = dir.as_ref().to_path_buf();
        std::fs::create_dir_all(&dir)
            .map_err(|e| Error::invalid(op, format!("{}: {e}", dir.display())))?;
        let mut s = LazyMemmapStorage {
            dir,
            capacity,
            item_batch: Vec::new(),
            leaves: Vec::new(),
            reopened: None,
        };
        let meta_path = s.dir.join("meta.json");
        if meta_path.exists() {
            s.reopen(&meta_path)?;
        }
        Ok(s)
    }

    /// The folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `(len, cursor)` of a storage reopened from disk.
    pub(crate) fn reopened(&self) -> Option<(i64, i64)> {
        self.reopened
    }

    /// The stored leaf keys (empty before the first write).
    pub fn keys(&self) -> Vec<NestedKey> {
        self.leaves.iter().map(|l| l.key.clone()).collect()
    }

    /// Whether the files exist (after the first write, or reopened).
    pub fn is_initialized(&self) -> bool {
        !self.leaves.is_empty()
    }

    /// Reads `meta.json` and maps the files it lists, checking everything before any file is
    /// opened: the version, the capacity, `len` and `cursor` in range (and no items without
    /// leaves), every leaf's key
    /// (non-empty, unique, none inside another), dtype, shape (the item batch first, sizes
    /// without overflow, at most [`MAX_LEAF_BYTES`] a file) and file name (a plain name in the
    /// folder); then every file must exist with exactly the size the layout needs. A storage
    /// that fails any check is an error naming `meta.json` or the file, and no file is created,
    /// resized or written.
    fn reopen(&mut self, meta_path: &Path) -> Result<()> {
        let op = "LazyMemmapStorage::new";
        let bad = |reason: String| Error::InvalidFile {
            op,
            path: meta_path.display().to_string(),
            reason,
        };
        let text = std::fs::read_to_string(meta_path).map_err(|e| Error::Io {
            op,
            path: meta_path.display().to_string(),
            source: e,
        })?;
        let meta: Meta =
            serde_json::from_str(&text).map_err(|e| bad(format!("not a storage layout: {e}")))?;
        if meta.version != 1 {
            return Err(bad(format!("version {}, expected 1", meta.version)));
        }
        let capacity = self.capacity;
        if meta.capacity != capacity {
            return Err(Error::value(
                op,
                meta_path.display(),
                format!("a storage of capacity {capacity} (the buffer's)"),
                format!("a storage of capacity {} on disk", meta.capacity),
            ));
        }
        if !(0..=capacity).contains(&meta.len) {
            return Err(bad(format!("len {} outside [0, {capacity}]", meta.len)));
        }
        if !(0..capacity).contains(&meta.cursor) {
            return Err(bad(format!(
                "cursor {} outside [0, {capacity})",
                meta.cursor
            )));
        }
        if meta.leaves.is_empty() && meta.len > 0 {
            return Err(bad(format!(
                "len {} but no leaves to hold the items",
                meta.len
            )));
        }
        if meta.item_batch.iter().any(|&d| d < 0) {
            return Err(bad(format!(
                "item_batch {:?} has a negative size",
                meta.item_batch
            )));
        }
        let mut plan = Vec::with_capacity(meta.leaves.len());
        let mut keys: Vec<&[String]> = Vec::with_capacity(meta.leaves.len());
        let mut files: Vec<&str> = Vec::with_capacity(meta.leaves.len());
        for (i, l) in meta.leaves.iter().enumerate() {
            let at = |what: String| bad(format!("leaves[{i}] (key {:?}): {what}", l.key));
            if l.key.is_empty() {
                return Err(at("an empty key".into()));
            }
            if let Some(other) = keys.iter().find(|k| {
                let n = k.len().min(l.key.len());
                k.get(..n) == l.key.get(..n)
            }) {
                return Err(at(format!("collides with the key {other:?}")));
            }
            keys.push(&l.key);
            let kind = KINDS
                .iter()
                .find(|(_, n)| *n == l.dtype)
                .map(|(k, _)| *k)
                .ok_or_else(|| at(format!("unknown dtype {:?}", l.dtype)))?;
            if !l.shape.starts_with(&meta.item_batch) {
                return Err(at(format!(
                    "shape {:?} does not start with the item batch {:?}",
                    l.shape, meta.item_batch
                )));
            }
            if !is_plain_file_name(&l.file) || l.file == "meta.json" {
                return Err(at(format!(
                    "file {:?}: expected {PLAIN_FILE_NAME} in the storage's folder, not meta.json",
                    l.file
                )));
            }
            if files.contains(&l.file.as_str()) {
                return Err(at(format!("file {:?} is listed twice", l.file)));
            }
            files.push(&l.file);
            let (row_bytes, total) = leaf_bytes(&l.shape, kind, capacity).map_err(at)?;
            let parts: Vec<&str> = l.key.iter().map(String::as_str).collect();
            plan.push((
                parts[..].to_nested_key(),
                l.shape.clone(),
                kind,
                row_bytes,
                total,
                &l.file,
            ));
        }
        let mut leaves = Vec::with_capacity(plan.len());
        for (key, shape, kind, row_bytes, total, file) in plan {
            let map = MappedFile::existing(&self.dir.join(file), total)?;
            leaves.push(Leaf {
                key,
                shape,
                kind,
                row_bytes,
                map,
            });
        }
        self.leaves = leaves;
        self.item_batch = meta.item_batch;
        self.reopened = Some((meta.len, meta.cursor));
        Ok(())
    }

    /// Maps a new leaf file (a first write's layout).
    fn add_leaf(&mut self, key: NestedKey, shape: Vec<i64>, kind: Kind, file: &str) -> Result<()> {
        let (row_bytes, total) = leaf_bytes(&shape, kind, self.capacity).map_err(|reason| {
            Error::invalid("LazyMemmapStorage::extend", format!("leaf {key}: {reason}"))
        })?;
        let map = MappedFile::create(&self.dir.join(file), total)?;
        self.leaves.push(Leaf {
            key,
            shape,
            kind,
            row_bytes,
            map,
        });
        Ok(())
    }

    /// Creates the files after the layout of `items` (batch `[n, *item_batch]`).
    fn init(&mut self, items: &TensorDict) -> Result<()> {
        self.item_batch = items
            .batch_size()
            .get(1..)
            .map(<[i64]>::to_vec)
            .unwrap_or_default();
        for (i, (key, t)) in items.leaves().into_iter().enumerate() {
            kind_name(t.kind())?;
            let shape = t.size().get(1..).map(<[i64]>::to_vec).unwrap_or_default();
            self.add_leaf(key, shape, t.kind(), &format!("leaf_{i}.bin"))?;
        }
        Ok(())
    }

    /// Writes `meta.json` (atomically: a temporary file renamed over it).
    pub(crate) fn save_meta(&self, len: i64, cursor: i64) -> Result<()> {
        let op = "LazyMemmapStorage (meta.json)";
        let meta = Meta {
            version: 1,
            capacity: self.capacity,
            len,
            cursor,
            item_batch: self.item_batch.clone(),
            leaves: self
                .leaves
                .iter()
                .enumerate()
                .map(|(i, l)| {
                    Ok(MetaLeaf {
                        key: l.key.parts().map(str::to_string).collect(),
                        shape: l.shape.clone(),
                        dtype: kind_name(l.kind)?.to_string(),
                        file: format!("leaf_{i}.bin"),
                    })
                })
                .collect::<Result<_>>()?,
        };
        let text =
            serde_json::to_string_pretty(&meta).map_err(|e| Error::invalid(op, e.to_string()))?;
        let tmp = self.dir.join("meta.json.tmp");
        std::fs::write(&tmp, text)
            .map_err(|e| Error::invalid(op, format!("{}: {e}", tmp.display())))?;
        std::fs::rename(&tmp, self.dir.join("meta.json"))
            .map_err(|e| Error::invalid(op, format!("{}: {e}", self.dir.display())))
    }

    /// Writes item `j` of `items` (batch `[n, *item_batch]`) at storage index `idx[j]`.
    pub(crate) fn write(&mut self, items: &TensorDict, idx: &[i64]) -> Result<()> {
        let op = "LazyMemmapStorage::write";
        if self.leaves.is_empty() {
            self.init(items)?;
        }
        let n = idx.len();
        // check everything before writing anything
        let mut bytes = Vec::with_capacity(self.leaves.len());
        for l in &self.leaves {
            let t = items.get_or_err(&l.key)?;
            let want: Vec<i64> = [&[n as i64][..], &l.shape].concat();
            if t.size() != want {
                return Err(Error::ShapeMismatch {
                    op,
                    key: l.key.to_string(),
                    expected: want,
                    actual: t.size(),
                });
            }
            if t.kind() != l.kind {
                return Err(Error::DtypeMismatch {
                    op,
                    key: l.key.to_string(),
                    expected: l.kind,
                    actual: t.kind(),
                });
            }
            let t = t.f_to_device(Device::Cpu)?.f_contiguous()?;
            let mut buf = vec![0u8; n * l.row_bytes];
            t.f_copy_data_u8(&mut buf, t.numel())?;
            bytes.push(buf);
        }
        for (l, buf) in self.leaves.iter_mut().zip(bytes) {
            let dst = l.map.bytes_mut();
            for (j, i) in idx.iter().enumerate() {
                let at = usize::try_from(*i)
                    .unwrap_or(usize::MAX)
                    .saturating_mul(l.row_bytes);
                let (Some(d), Some(s)) = (
                    dst.get_mut(at..at.saturating_add(l.row_bytes)),
                    buf.get(j * l.row_bytes..(j + 1) * l.row_bytes),
                ) else {
                    return Err(Error::IndexOutOfRange {
                        op,
                        index: *i,
                        what: format!("storage rows of {}", l.key),
                        size: self.capacity,
                    });
                };
                d.copy_from_slice(s);
            }
        }
        Ok(())
    }

    /// The items at `idx`, `[idx.len(), *item_batch]` (copies).
    pub(crate) fn read(&self, idx: &[i64]) -> Result<TensorDict> {
        self.read_keys(idx, None)
    }

    /// [`LazyMemmapStorage::read`] restricted to `keys` (those stored; `None`: all).
    pub(crate) fn read_keys(&self, idx: &[i64], keys: Option<&[NestedKey]>) -> Result<TensorDict> {
        let op = "LazyMemmapStorage::read";
        let n = idx.len() as i64;
        let batch: Vec<i64> = [&[n][..], &self.item_batch].concat();
        let mut td = TensorDict::new(batch)?;
        for l in &self.leaves {
            if keys.is_some_and(|k| !k.contains(&l.key)) {
                continue;
            }
            let src = l.map.bytes();
            let mut buf = Vec::with_capacity(idx.len() * l.row_bytes);
            for i in idx {
                let at = usize::try_from(*i)
                    .unwrap_or(usize::MAX)
                    .saturating_mul(l.row_bytes);
                let row = src.get(at..at.saturating_add(l.row_bytes)).ok_or_else(|| {
                    Error::IndexOutOfRange {
                        op,
                        index: *i,
                        what: format!("storage rows of {}", l.key),
                        size: self.capacity,
                    }
                })?;
                buf.extend_from_slice(row);
            }
            let shape: Vec<i64> = [&[n][..], &l.shape].concat();
            td.set(&l.key, Tensor::f_from_data_size(&buf, &shape, l.kind)?)?;
        }
        Ok(td)
    }

    /// Writes the mapped pages back to their files (the OS does it eventually anyway).
    pub fn flush(&self) -> Result<()> {
        self.leaves.iter().try_for_each(|l| l.map.flush())
    }

    /// The stored keys as a list for error messages.
    pub(crate) fn key_list(&self) -> Vec<NestedKey> {
        self.keys()
    }
}

/// The leaf keys of `td` (for the key check shared with the in-memory storage).
pub(crate) fn leaf_keys(td: &TensorDict) -> Vec<NestedKey> {
    td.keys(KeysOptions::nested_leaves())
}
