//! Saving and loading a [`TensorDict`] as one `.safetensors` file.
//!
//! Leaves are stored as safetensors tensors named `t0`, `t1`, …; the tree (nested keys in their
//! insertion order, every level's batch size, even empty levels) is stored as JSON in the header
//! metadata under `torchrl.layout`. Saving is atomic (temporary file, fsync, rename), so a crash mid-save
//! leaves the previous file intact. Loading validates the whole file before building anything:
//! a corrupt, truncated or foreign file gives [`Error::InvalidFile`], never a partial result.
//! Loaded leaves are on the CPU.
//!
//! ```
//! use tch::{Device, Kind, Tensor};
//! use torchrl::TensorDict;
//! # fn main() -> torchrl::Result<()> {
//! let td = TensorDict::new([2])?
//!     .with(("next", "reward"), Tensor::from_slice(&[1.5f32, -2.0]).view([2, 1]))?;
//! let path = std::env::temp_dir().join(format!("td-doc-{}.safetensors", std::process::id()));
//! td.save(&path)?;
//! let back = TensorDict::load(&path)?;
//! assert_eq!(back.batch_size(), &[2]);
//! assert!(back.eq(&td)?.all()?);
//! std::fs::remove_file(&path).ok();
//! # Ok(()) }
//! ```

use std::borrow::Cow;
use std::collections::HashMap;
use std::io::Write;
use std::path::Path;

use safetensors::tensor::{Dtype, SafeTensors, View};
use serde_json::{json, Value};
use tch::{Device, Kind, Tensor};

use super::{Elements, Entry, KeysOptions, NestedKey, TensorDict};
use crate::error::{Error, Result};

const LAYOUT_KEY: &str = "torchrl.layout";
const FORMAT: &str = "torchrl.TensorDict/1";

fn kind_to_dtype(kind: Kind) -> Option<Dtype> {
    Some(match kind {
        Kind::Float => Dtype::F32,
        Kind::Double => Dtype::F64,
        Kind::Half => Dtype::F16,
        Kind::BFloat16 => Dtype::BF16,
        Kind::Int64 => Dtype::I64,
        Kind::Int => Dtype::I32,
        Kind::Int16 => Dtype::I16,
        Kind::Int8 => Dtype::I8,
        Kind::Uint8 => Dtype::U8,
        Kind::Bool => Dtype::BOOL,
        _ => return None,
    })
}

fn dtype_to_kind(dtype: Dtype) -> Option<Kind> {
    Some(match dtype {
        Dtype::F32 => Kind::Float,
        Dtype::F64 => Kind::Double,
        Dtype::F16 => Kind::Half,
        Dtype::BF16 => Kind::BFloat16,
        Dtype::I64 => Kind::Int64,
        Dtype::I32 => Kind::Int,
        Dtype::I16 => Kind::Int16,
        Dtype::I8 => Kind::Int8,
        Dtype::U8 => Kind::Uint8,
        Dtype::BOOL => Kind::Bool,
        _ => return None,
    })
}

struct Leaf {
    dtype: Dtype,
    shape: Vec<usize>,
    bytes: Vec<u8>,
}

impl View for &Leaf {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.bytes)
    }
    fn data_len(&self) -> usize {
        self.bytes.len()
    }
}

fn key_json(k: &NestedKey) -> Value {
    Value::Array(k.parts().map(|s| Value::String(s.to_string())).collect())
}

fn io_err(op: &'static str, path: &Path, source: std::io::Error) -> Error {
    Error::Io {
        op,
        path: path.display().to_string(),
        source,
    }
}

impl TensorDict {
    /// Serialises to safetensors bytes (see the module docs for the layout).
    pub fn to_safetensors_bytes(&self) -> Result<Vec<u8>> {
        let op = "save";
        let mut leaves = Vec::new();
        let mut leaf_meta = Vec::new();
        let mut levels = Vec::new();
        // `pos` is each entry's rank in `items(KeysOptions::nested())` (depth-first, a level after its
        // children), so that `load` restores the insertion order, leaves and levels interleaved.
        for (pos, (k, e)) in self.items(KeysOptions::nested()).into_iter().enumerate() {
            match e {
                Entry::Dict(d) => levels.push(
                    json!({"key": key_json(&k), "batch_size": d.batch_size.to_vec(), "pos": pos}),
                ),
                Entry::Tensor(t) => {
                    let dtype = kind_to_dtype(t.kind()).ok_or_else(|| {
                        Error::value(
                            op,
                            &k,
                            "a dtype that can be saved",
                            format!("dtype {:?}, which cannot be saved", t.kind()),
                        )
                    })?;
                    let c = t.f_to_device(Device::Cpu)?.f_contiguous()?;
                    let numel = c.elements();
                    let mut bytes = vec![0u8; numel * t.kind().elt_size_in_bytes()];
                    c.f_copy_data_u8(&mut bytes, numel)?;
                    let shape = c.size().iter().map(|d| *d as usize).collect();
                    let name = format!("t{}", leaves.len());
                    leaf_meta.push(json!({"name": name, "key": key_json(&k), "pos": pos}));
                    leaves.push((
                        name,
                        Leaf {
                            dtype,
                            shape,
                            bytes,
                        },
                    ));
                }
            }
        }
        let layout = json!({
            "format": FORMAT,
            "batch_size": self.batch_size.to_vec(),
            "levels": levels,
            "leaves": leaf_meta,
        });
        let meta: HashMap<String, String> = [(LAYOUT_KEY.to_string(), layout.to_string())].into();
        let views: Vec<(&str, &Leaf)> = leaves.iter().map(|(n, l)| (n.as_str(), l)).collect();
        safetensors::tensor::serialize(views, &Some(meta))
            .map_err(|e| Error::invalid(op, format!("safetensors serialisation failed: {e}")))
    }

    /// Saves to `path` atomically (temporary file in the same folder, fsync, rename).
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let bytes = self.to_safetensors_bytes()?;
        let file_name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "tensordict".into());
        // Unique per call (process, thread, counter): concurrent saves to one path must not
        // share, and truncate, one temporary file.
        static SAVES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = SAVES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = path.with_file_name(format!(
            ".{file_name}.tmp-{}-{:?}-{n}",
            std::process::id(),
            std::thread::current().id()
        ));
        let write = || -> std::io::Result<()> {
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(&bytes)?;
            f.sync_all()?;
            std::fs::rename(&tmp, path)?;
            if let Some(dir) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
                // Persist the rename; not all platforms allow opening a folder, so best effort.
                if let Ok(d) = std::fs::File::open(dir) {
                    let _ = d.sync_all();
                }
            }
            Ok(())
        };
        write().map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            io_err("save", path, e)
        })
    }

    /// Loads a tensordict saved by [`TensorDict::save`]; every leaf is on the CPU.
    pub fn load(path: impl AsRef<Path>) -> Result<TensorDict> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|e| io_err("load", path, e))?;
        Self::from_safetensors_bytes(&bytes).map_err(|e| match e {
            Error::InvalidFile { op, reason, .. } => Error::InvalidFile {
                op,
                path: path.display().to_string(),
                reason,
            },
            other => other,
        })
    }

    /// Parses safetensors bytes produced by [`TensorDict::to_safetensors_bytes`].
    pub fn from_safetensors_bytes(bytes: &[u8]) -> Result<TensorDict> {
        let bad = |reason: String| Error::InvalidFile {
            op: "load",
            path: "<bytes>".into(),
            reason,
        };
        let (_, metadata) = SafeTensors::read_metadata(bytes)
            .map_err(|e| bad(format!("unreadable safetensors header: {e}")))?;
        let st = SafeTensors::deserialize(bytes)
            .map_err(|e| bad(format!("corrupt safetensors data: {e}")))?;
        let layout_str = metadata
            .metadata()
            .as_ref()
            .and_then(|m| m.get(LAYOUT_KEY))
            .ok_or_else(|| {
                bad(format!(
                    "no {LAYOUT_KEY:?} metadata (not written by torchrl)"
                ))
            })?;
        let layout: Value = serde_json::from_str(layout_str)
            .map_err(|e| bad(format!("layout metadata is not JSON: {e}")))?;
        if layout.get("format").and_then(Value::as_str) != Some(FORMAT) {
            return Err(bad(format!("unknown layout format, expected {FORMAT:?}")));
        }
        let dims = |v: Option<&Value>, what: &str| -> Result<Vec<i64>> {
            v.and_then(Value::as_array)
                .and_then(|a| a.iter().map(Value::as_i64).collect::<Option<Vec<i64>>>())
                .filter(|d| d.iter().all(|x| *x >= 0))
                .ok_or_else(|| bad(format!("{what}: expected a list of non-negative integers")))
        };
        let key = |v: Option<&Value>| -> Result<Vec<String>> {
            v.and_then(Value::as_array)
                .and_then(|a| {
                    a.iter()
                        .map(|s| s.as_str().map(str::to_string))
                        .collect::<Option<Vec<String>>>()
                })
                .filter(|k| !k.is_empty())
                .ok_or_else(|| bad("a key is not a non-empty list of strings".into()))
        };
        let mut td = TensorDict::new(dims(layout.get("batch_size"), "batch_size")?)?;
        let pos = |v: &Value| v.get("pos").and_then(Value::as_u64);
        // Every entry, levels and leaves, validated before anything is built.
        enum Item {
            Level(Vec<i64>),
            Leaf(Tensor),
        }
        let mut items: Vec<(Option<u64>, Vec<String>, Item)> = Vec::new();
        let levels = layout
            .get("levels")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        for l in &levels {
            let bs = dims(l.get("batch_size"), "level batch_size")?;
            items.push((pos(l), key(l.get("key"))?, Item::Level(bs)));
        }
        let leaves = layout
            .get("leaves")
            .and_then(Value::as_array)
            .ok_or_else(|| bad("no leaves list".into()))?;
        if leaves.len() != st.len() {
            return Err(bad(format!(
                "layout lists {} leaves but the file holds {} tensors",
                leaves.len(),
                st.len()
            )));
        }
        let mut names = std::collections::HashSet::new();
        for l in leaves {
            let k = key(l.get("key"))?;
            let name = l
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| bad("a leaf has no name".into()))?;
            // With as many leaves as tensors, unique names mean every tensor is used once.
            if !names.insert(name) {
                return Err(bad(format!("tensor {name:?} is named by two leaves")));
            }
            let view = st
                .tensor(name)
                .map_err(|e| bad(format!("leaf {name}: {e}")))?;
            let kind = dtype_to_kind(view.dtype())
                .ok_or_else(|| bad(format!("leaf {name}: unsupported dtype {:?}", view.dtype())))?;
            let shape: Vec<i64> = view.shape().iter().map(|d| *d as i64).collect();
            let t = Tensor::f_from_data_size(view.data(), &shape, kind)?;
            items.push((pos(l), k, Item::Leaf(t)));
        }
        if items.iter().all(|(p, _, _)| p.is_some()) {
            // The saved order (a level comes after its children; it is created, in its place
            // among its siblings, when its first child is).
            items.sort_by_key(|(p, _, _)| *p);
        } else {
            // Files without positions: levels parents-first, then the leaves.
            items.sort_by_key(|(_, k, item)| match item {
                Item::Level(_) => (0, k.len()),
                Item::Leaf(_) => (1, 0),
            });
        }
        let level_batch: HashMap<Vec<String>, Vec<i64>> = items
            .iter()
            .filter_map(|(_, k, item)| match item {
                Item::Level(bs) => Some((k.clone(), bs.clone())),
                Item::Leaf(_) => None,
            })
            .collect();
        // Every parent of an entry must be a declared level: a loader that invented levels
        // would accept layouts `save` never writes (e.g. a key renamed by a flipped byte).
        for (_, k, _) in &items {
            for parent in parents(k) {
                if !level_batch.contains_key(parent) {
                    return Err(bad(format!(
                        "{} sits under {}, which the layout does not declare as a level",
                        NestedKey::from(k.clone()),
                        NestedKey::from(parent.to_vec())
                    )));
                }
            }
        }
        for (_, k, item) in items {
            // Parent levels first, with their recorded batch sizes.
            for parent in parents(&k) {
                if let (false, Some(bs)) = (td.contains(parent), level_batch.get(parent)) {
                    td.set(parent, TensorDict::new(bs)?)
                        .map_err(|e| bad(format!("inconsistent level: {e}")))?;
                }
            }
            match item {
                Item::Level(bs) => match td.get_entry(&k) {
                    Some(Entry::Dict(_)) => {}
                    Some(Entry::Tensor(_)) => {
                        return Err(bad(format!(
                            "{} is both a level and a leaf",
                            NestedKey::from(k.clone())
                        )))
                    }
                    None => td
                        .set(&k, TensorDict::new(bs)?)
                        .map_err(|e| bad(format!("inconsistent level: {e}")))?,
                },
                Item::Leaf(t) => {
                    if td.contains(&k) {
                        return Err(bad(format!(
                            "{} is listed twice",
                            NestedKey::from(k.clone())
                        )));
                    }
                    td.set(&k, t)
                        .map_err(|e| bad(format!("inconsistent leaf: {e}")))?;
                }
            }
        }
        Ok(td)
    }
}

/// The proper prefixes of key `k` (its parent levels), shortest first.
fn parents(k: &[String]) -> impl Iterator<Item = &[String]> {
    (1..k.len()).filter_map(move |i| k.get(..i))
}
