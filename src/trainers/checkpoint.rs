//! Atomic checkpoints with resume.
//!
//! A [`Checkpoint`] is named groups of tensors (the model's weights, the optimizer's moments),
//! each stored as one `<group>.safetensors` file, and named JSON values (the config, the
//! optimizer's step counts, trainer state such as the KL coefficient or running moments),
//! each stored as `<name>.json`, plus a `manifest.json` listing every file with its size and
//! an FNV-1a 64 hash.
//!
//! A [`CheckpointStore`] keeps numbered folders `checkpoint_<step>` under one directory and a
//! `latest` file naming the newest. Saving writes everything into a temporary sibling folder
//! (`.tmp.checkpoint_<step>`), fsyncs each file and the folder, renames the folder into place,
//! and only then replaces `latest` (temporary file, fsync, rename, fsync of the directory). So
//! a crash at any point leaves the previous checkpoint as the latest, complete and unchanged;
//! a half-written temporary folder is ignored by loads and removed by the next save. Older
//! checkpoints beyond the last N ([`CheckpointStore::with_keep_last`]) are removed after a
//! save succeeds. One process saves into a store at a time.
//!
//! Loading checks the manifest, then every file's size and hash before parsing it: a missing,
//! truncated or corrupt file is an error naming its path, never a partial checkpoint.
//!
//! ```
//! use serde_json::json;
//! use tch::Tensor;
//! use torchrl::trainers::checkpoint::{Checkpoint, CheckpointStore};
//! # fn main() -> torchrl::Result<()> {
//! let dir = std::env::temp_dir().join(format!("ckpt-doc-{}", std::process::id()));
//! let store = CheckpointStore::new(&dir).with_keep_last(2);
//! for step in [10, 20, 30] {
//!     let ckpt = Checkpoint::new(step)
//!         .with_tensors("model", vec![("w".into(), Tensor::from_slice(&[step as f32; 3]))])
//!         .with_json("trainer_state", json!({ "kl_coef": 0.1, "iter_count": step }));
//!     store.save(&ckpt)?;
//! }
//! let back = store.load_latest()?.expect("a checkpoint was saved");
//! assert_eq!(back.step(), 30);
//! assert_eq!(back.json("trainer_state")?["iter_count"], 30);
//! let w = &back.tensors("model")?[0];
//! assert_eq!((w.0.as_str(), Vec::<f32>::try_from(&w.1)?), ("w", vec![30.0; 3]));
//! assert_eq!(store.steps()?, vec![20, 30]); // keep_last(2) removed step 10
//! std::fs::remove_dir_all(&dir).ok();
//! # Ok(()) }
//! ```

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};
use tch::{Device, Tensor};

use crate::error::{Error, Result};
use crate::files::{is_plain_file_name, PLAIN_FILE_NAME};

const MANIFEST: &str = "manifest.json";
const LATEST: &str = "latest";
const PREFIX: &str = "checkpoint_";
const TMP_PREFIX: &str = ".tmp.";
const FORMAT: &str = "torchrl.Checkpoint/1";

/// Named tensor groups and named JSON values saved together at one step.
#[derive(Debug, Default)]
pub struct Checkpoint {
    step: u64,
    tensors: BTreeMap<String, Vec<(String, Tensor)>>,
    json: BTreeMap<String, Value>,
}

impl Checkpoint {
    /// An empty checkpoint for optimizer step `step`.
    pub fn new(step: u64) -> Self {
        Checkpoint {
            step,
            ..Checkpoint::default()
        }
    }

    /// Adds (or replaces) a group of named tensors, stored as `<group>.safetensors`. Tensors
    /// are saved detached, on the CPU; loaded ones are on the CPU, sorted by name.
    pub fn with_tensors(
        mut self,
        group: impl Into<String>,
        tensors: Vec<(String, Tensor)>,
    ) -> Self {
        self.tensors.insert(group.into(), tensors);
        self
    }

    /// Adds (or replaces) a JSON value, stored as `<name>.json` (a tensor group may have the
    /// same name: `opt.safetensors` and `opt.json`).
    pub fn with_json(mut self, name: impl Into<String>, value: Value) -> Self {
        self.json.insert(name.into(), value);
        self
    }

    /// The optimizer step this checkpoint was taken at.
    pub fn step(&self) -> u64 {
        self.step
    }

    /// The tensor group `group`.
    ///
    /// # Errors
    /// [`Error::KeyNotFound`] listing the groups present.
    pub fn tensors(&self, group: &str) -> Result<&[(String, Tensor)]> {
        self.tensors
            .get(group)
            .map(Vec::as_slice)
            .ok_or_else(|| Error::KeyNotFound {
                op: "Checkpoint::tensors",
                key: format!("{group:?}"),
                available: self.tensors.keys().map(|k| format!("{k:?}")).collect(),
            })
    }

    /// The JSON value `name`.
    ///
    /// # Errors
    /// [`Error::KeyNotFound`] listing the values present.
    pub fn json(&self, name: &str) -> Result<&Value> {
        self.json.get(name).ok_or_else(|| Error::KeyNotFound {
            op: "Checkpoint::json",
            key: format!("{name:?}"),
            available: self.json.keys().map(|k| format!("{k:?}")).collect(),
        })
    }

    /// The tensor group names, sorted.
    pub fn tensor_groups(&self) -> Vec<&str> {
        self.tensors.keys().map(String::as_str).collect()
    }

    /// The JSON value names, sorted.
    pub fn json_names(&self) -> Vec<&str> {
        self.json.keys().map(String::as_str).collect()
    }

    /// Reads one checkpoint folder (as written by [`CheckpointStore::save`]), checking every
    /// file against the manifest first.
    ///
    /// # Errors
    /// [`Error::Io`] naming a missing file, [`Error::InvalidFile`] naming a file whose size,
    /// hash or content is wrong.
    pub fn load(dir: impl AsRef<Path>) -> Result<Self> {
        const OP: &str = "Checkpoint::load";
        let dir = dir.as_ref();
        let manifest_path = dir.join(MANIFEST);
        let manifest: Value = serde_json::from_slice(&read(OP, &manifest_path)?)
            .map_err(|e| invalid(OP, &manifest_path, format!("not JSON: {e}")))?;
        if manifest.get("format").and_then(Value::as_str) != Some(FORMAT) {
            return Err(invalid(
                OP,
                &manifest_path,
                format!("not a {FORMAT} manifest"),
            ));
        }
        let step = manifest
            .get("step")
            .and_then(Value::as_u64)
            .ok_or_else(|| invalid(OP, &manifest_path, "no step count"))?;
        let files = manifest
            .get("files")
            .and_then(Value::as_array)
            .ok_or_else(|| invalid(OP, &manifest_path, "no file list"))?;
        let mut ckpt = Checkpoint::new(step);
        for entry in files {
            let field = |k: &str| entry.get(k).and_then(Value::as_str);
            let (Some(name), Some(kind), Some(hash), Some(bytes)) = (
                field("name"),
                field("kind"),
                field("fnv1a64"),
                entry.get("bytes").and_then(Value::as_u64),
            ) else {
                return Err(invalid(
                    OP,
                    &manifest_path,
                    format!("bad file entry {entry}"),
                ));
            };
            // a manifest edited by hand (or by a crash) is the file at fault: name it
            if !is_plain_file_name(name) || name == "manifest" {
                return Err(invalid(
                    OP,
                    &manifest_path,
                    format!(
                        "file entry name {name:?}: expected {PLAIN_FILE_NAME}, not \"manifest\""
                    ),
                ));
            }
            let file = dir.join(file_name(name, kind));
            let data = read(OP, &file)?;
            if data.len() as u64 != bytes {
                return Err(invalid(
                    OP,
                    &file,
                    format!(
                        "truncated or resized: {} bytes, manifest says {bytes}",
                        data.len()
                    ),
                ));
            }
            if format!("{:016x}", fnv1a64(&data)) != hash {
                return Err(invalid(
                    OP,
                    &file,
                    "content does not match the manifest's hash",
                ));
            }
            match kind {
                "json" => {
                    let value = serde_json::from_slice(&data)
                        .map_err(|e| invalid(OP, &file, format!("not JSON: {e}")))?;
                    ckpt.json.insert(name.to_string(), value);
                }
                "safetensors" => {
                    // the header is checked first (offsets, sizes, dtypes), naming the
                    // tensor and byte offset; libtorch's text is cut to its first line
                    crate::modules::llm::weights::read_header(OP, &file)?;
                    let mut tensors = Tensor::read_safetensors(&file).map_err(|e| {
                        let first = e.to_string().lines().next().unwrap_or_default().to_string();
                        invalid(OP, &file, format!("not safetensors: {first}"))
                    })?;
                    tensors.sort_by(|a, b| a.0.cmp(&b.0));
                    ckpt.tensors.insert(name.to_string(), tensors);
                }
                other => {
                    return Err(invalid(
                        OP,
                        &manifest_path,
                        format!("unknown file kind {other:?}"),
                    ))
                }
            }
        }
        Ok(ckpt)
    }
}

/// Where a save is, passed to the hook of [`CheckpointStore::save_with_hook`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SaveStage {
    /// A data file (`model.safetensors`, `config.json`, …) is written and synced in the
    /// temporary folder.
    Wrote(String),
    /// The manifest is written: the temporary folder is complete.
    Complete,
    /// The folder has been renamed into place; `latest` is about to be replaced.
    Renamed,
}

/// A directory of numbered checkpoints with a `latest` pointer (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointStore {
    dir: PathBuf,
    keep_last: Option<usize>,
}

impl CheckpointStore {
    /// A store in `dir` (created on the first save) keeping the last 3 checkpoints.
    pub fn new(dir: impl AsRef<Path>) -> Self {
        CheckpointStore {
            dir: dir.as_ref().to_path_buf(),
            keep_last: Some(3),
        }
    }

    /// Keeps only the newest `n` (≥ 1) checkpoints after each save.
    pub fn with_keep_last(mut self, n: usize) -> Self {
        self.keep_last = Some(n);
        self
    }

    /// Keeps every checkpoint.
    pub fn keep_all(mut self) -> Self {
        self.keep_last = None;
        self
    }

    /// The store's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The folder of the checkpoint at `step`.
    pub fn path_of(&self, step: u64) -> PathBuf {
        self.dir.join(format!("{PREFIX}{step:010}"))
    }

    /// Saves `ckpt` atomically as the new latest checkpoint and returns its folder (see the
    /// module docs). Saving a step that already exists replaces it.
    ///
    /// # Errors
    /// When a group or value name is not a plain file name (`[A-Za-z0-9_.-]`, not `manifest`),
    /// `keep_last` is 0, or on an I/O error (naming the path).
    pub fn save(&self, ckpt: &Checkpoint) -> Result<PathBuf> {
        self.save_with_hook(ckpt, &mut |_| Ok(()))
    }

    /// [`CheckpointStore::save`], calling `hook` at each [`SaveStage`]; an error from the hook
    /// stops the save there, leaving the disk as a crash at that point would (for
    /// fault-injection tests and progress reports).
    ///
    /// ```
    /// use serde_json::json;
    /// use torchrl::trainers::checkpoint::{Checkpoint, CheckpointStore, SaveStage};
    /// # fn main() -> torchrl::Result<()> {
    /// let dir = std::env::temp_dir().join(format!("ckpt-hook-doc-{}", std::process::id()));
    /// let store = CheckpointStore::new(&dir);
    /// store.save(&Checkpoint::new(1).with_json("state", json!({ "x": 1 })))?;
    /// let crash = store.save_with_hook(
    ///     &Checkpoint::new(2).with_json("state", json!({ "x": 2 })),
    ///     &mut |stage| match stage {
    ///         SaveStage::Complete => Err(torchrl::Error::InvalidArgument {
    ///             op: "test",
    ///             message: "simulated crash".into(),
    ///         }),
    ///         _ => Ok(()),
    ///     },
    /// );
    /// assert!(crash.is_err());
    /// let back = store.load_latest()?.expect("step 1 is still there");
    /// assert_eq!(back.json("state")?["x"], 1);
    /// std::fs::remove_dir_all(&dir).ok();
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`CheckpointStore::save`], and the hook's error.
    pub fn save_with_hook(
        &self,
        ckpt: &Checkpoint,
        hook: &mut dyn FnMut(SaveStage) -> Result<()>,
    ) -> Result<PathBuf> {
        const OP: &str = "CheckpointStore::save";
        if self.keep_last == Some(0) {
            return Err(Error::config(OP, "keep_last", ">= 1 (or keep_all())", 0));
        }
        for name in ckpt.tensors.keys().chain(ckpt.json.keys()) {
            check_name(OP, name)?;
        }
        fs::create_dir_all(&self.dir).map_err(|e| io(OP, &self.dir, e))?;
        let final_dir = self.path_of(ckpt.step);
        let folder = file_name_of(&final_dir);
        let tmp = self.dir.join(format!("{TMP_PREFIX}{folder}"));
        if tmp.exists() {
            fs::remove_dir_all(&tmp).map_err(|e| io(OP, &tmp, e))?;
        }
        fs::create_dir(&tmp).map_err(|e| io(OP, &tmp, e))?;

        let mut files = Vec::new();
        for (group, tensors) in &ckpt.tensors {
            let path = tmp.join(file_name(group, "safetensors"));
            let cpu: Vec<(String, Tensor)> = tensors
                .iter()
                .map(|(n, t)| {
                    Ok((
                        n.clone(),
                        t.f_detach()?.f_to_device(Device::Cpu)?.f_contiguous()?,
                    ))
                })
                .collect::<Result<_>>()?;
            Tensor::write_safetensors(&cpu, &path)
                .map_err(|e| invalid(OP, &path, format!("could not write safetensors: {e}")))?;
            let data = read(OP, &path)?;
            sync_file(OP, &path)?;
            files.push(file_entry(group, "safetensors", &data));
            hook(SaveStage::Wrote(file_name(group, "safetensors")))?;
        }
        for (name, value) in &ckpt.json {
            let path = tmp.join(file_name(name, "json"));
            let text = serde_json::to_vec_pretty(value)
                .map_err(|e| Error::invalid(OP, format!("JSON value {name:?}: {e}")))?;
            write_synced(OP, &path, &text)?;
            files.push(file_entry(name, "json", &text));
            hook(SaveStage::Wrote(file_name(name, "json")))?;
        }
        let manifest = json!({ "format": FORMAT, "step": ckpt.step, "files": files });
        let text = serde_json::to_vec_pretty(&manifest)
            .map_err(|e| Error::invalid(OP, format!("manifest: {e}")))?;
        write_synced(OP, &tmp.join(MANIFEST), &text)?;
        sync_dir(OP, &tmp)?;
        hook(SaveStage::Complete)?;

        if final_dir.exists() {
            // Re-saving a step: `latest` may name this folder; it is replaced by a complete one
            // right below, and a crash in between is covered by the scan in `latest()`.
            fs::remove_dir_all(&final_dir).map_err(|e| io(OP, &final_dir, e))?;
        }
        fs::rename(&tmp, &final_dir).map_err(|e| io(OP, &final_dir, e))?;
        sync_dir(OP, &self.dir)?;
        hook(SaveStage::Renamed)?;

        let pointer_tmp = self.dir.join(format!("{TMP_PREFIX}{LATEST}"));
        write_synced(OP, &pointer_tmp, folder.as_bytes())?;
        let pointer = self.dir.join(LATEST);
        fs::rename(&pointer_tmp, &pointer).map_err(|e| io(OP, &pointer, e))?;
        sync_dir(OP, &self.dir)?;

        self.prune(ckpt.step)?;
        Ok(final_dir)
    }

    /// Removes leftover temporary folders and the checkpoints beyond `keep_last`, never the
    /// one at `keep`.
    fn prune(&self, keep: u64) -> Result<()> {
        const OP: &str = "CheckpointStore::prune";
        for entry in fs::read_dir(&self.dir).map_err(|e| io(OP, &self.dir, e))? {
            let path = entry.map_err(|e| io(OP, &self.dir, e))?.path();
            if file_name_of(&path).starts_with(TMP_PREFIX) && path.is_dir() {
                fs::remove_dir_all(&path).map_err(|e| io(OP, &path, e))?;
            }
        }
        if let Some(n) = self.keep_last {
            let steps = self.steps()?;
            let excess = steps.len().saturating_sub(n);
            for step in steps.into_iter().take(excess).filter(|s| *s != keep) {
                let path = self.path_of(step);
                fs::remove_dir_all(&path).map_err(|e| io(OP, &path, e))?;
            }
        }
        Ok(())
    }

    /// The steps of the checkpoint folders present, ascending (temporary folders are not
    /// listed).
    ///
    /// # Errors
    /// On an I/O error reading the directory; an absent directory has no checkpoints.
    pub fn steps(&self) -> Result<Vec<u64>> {
        const OP: &str = "CheckpointStore::steps";
        if !self.dir.exists() {
            return Ok(Vec::new());
        }
        let mut steps = Vec::new();
        for entry in fs::read_dir(&self.dir).map_err(|e| io(OP, &self.dir, e))? {
            let path = entry.map_err(|e| io(OP, &self.dir, e))?.path();
            let name = file_name_of(&path);
            if let Some(step) = name
                .strip_prefix(PREFIX)
                .and_then(|s| s.parse::<u64>().ok())
            {
                if path.is_dir() {
                    steps.push(step);
                }
            }
        }
        steps.sort_unstable();
        Ok(steps)
    }

    /// The folder of the latest complete checkpoint: the one `latest` names, or, when there is
    /// no `latest` or it names a folder that is gone, the highest-numbered folder; `None` when
    /// the store holds none. A folder renamed into place just before a crash, with `latest`
    /// not yet replaced, is not the latest: the previous one is.
    ///
    /// # Errors
    /// When `latest` is unreadable or names something that is not a checkpoint folder here.
    pub fn latest(&self) -> Result<Option<PathBuf>> {
        const OP: &str = "CheckpointStore::latest";
        let pointer = self.dir.join(LATEST);
        let highest = self.steps()?.last().map(|s| self.path_of(*s));
        if !pointer.exists() {
            return Ok(highest);
        }
        let text = String::from_utf8(read(OP, &pointer)?)
            .map_err(|_| invalid(OP, &pointer, "not UTF-8"))?;
        let name = text.trim();
        let valid = name
            .strip_prefix(PREFIX)
            .is_some_and(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()));
        if !valid {
            return Err(invalid(
                OP,
                &pointer,
                format!("names {name:?}, not a {PREFIX}<step> folder"),
            ));
        }
        let named = self.dir.join(name);
        if named.is_dir() {
            Ok(Some(named))
        } else {
            // Only a crash while re-saving the step `latest` names leaves it dangling.
            Ok(highest)
        }
    }

    /// Loads the latest complete checkpoint, or `None` when the store holds none.
    ///
    /// # Errors
    /// As [`CheckpointStore::latest`] and [`Checkpoint::load`].
    pub fn load_latest(&self) -> Result<Option<Checkpoint>> {
        self.latest()?.map(Checkpoint::load).transpose()
    }
}

fn file_name(name: &str, kind: &str) -> String {
    format!("{name}.{kind}")
}

fn file_name_of(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

fn check_name(op: &'static str, name: &str) -> Result<()> {
    if is_plain_file_name(name) && name != "manifest" {
        Ok(())
    } else {
        Err(Error::argument(
            op,
            "name",
            format!("{PLAIN_FILE_NAME}, not \"manifest\""),
            format!("{name:?}"),
        ))
    }
}

fn file_entry(name: &str, kind: &str, data: &[u8]) -> Value {
    json!({
        "name": name,
        "kind": kind,
        "bytes": data.len(),
        "fnv1a64": format!("{:016x}", fnv1a64(data)),
    })
}

/// FNV-1a, 64 bit: a fast non-cryptographic hash that catches truncation and bit rot.
fn fnv1a64(data: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in data {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

fn io(op: &'static str, path: &Path, source: std::io::Error) -> Error {
    Error::Io {
        op,
        path: path.display().to_string(),
        source,
    }
}

fn invalid(op: &'static str, path: &Path, reason: impl Into<String>) -> Error {
    Error::InvalidFile {
        op,
        path: path.display().to_string(),
        reason: reason.into(),
    }
}

fn read(op: &'static str, path: &Path) -> Result<Vec<u8>> {
    fs::read(path).map_err(|e| io(op, path, e))
}

fn write_synced(op: &'static str, path: &Path, data: &[u8]) -> Result<()> {
    let mut f = File::create(path).map_err(|e| io(op, path, e))?;
    f.write_all(data).map_err(|e| io(op, path, e))?;
    f.sync_all().map_err(|e| io(op, path, e))
}

fn sync_file(op: &'static str, path: &Path) -> Result<()> {
    File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(|e| io(op, path, e))
}

fn sync_dir(op: &'static str, dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|f| f.sync_all())
        .map_err(|e| io(op, dir, e))
}

/// A supervised trainer's checkpoint (SFT, reward model): the parameters as group `"model"`,
/// AdamW's moments and state as `"opt"`, and `{"steps": n}` as `"trainer"`.
pub(crate) fn supervised_checkpoint(
    steps: usize,
    params: &[(String, Tensor)],
    opt: &super::optim::AdamW,
) -> Checkpoint {
    let model = params
        .iter()
        .map(|(n, t)| (n.clone(), t.shallow_clone()))
        .collect();
    Checkpoint::new(steps as u64)
        .with_tensors(super::api::names::MODEL, model)
        .with_tensors(super::api::names::OPT, opt.state_tensors())
        .with_json(super::api::names::OPT, opt.state_json())
        .with_json("trainer", json!({ "steps": steps }))
}

/// Restores what [`supervised_checkpoint`] saved into `params` and `opt`, checking every part
/// first (names, shapes, finite values, the optimizer's state): on an error nothing changed.
/// Returns the step count.
pub(crate) fn restore_supervised(
    op: &'static str,
    ckpt: &Checkpoint,
    params: &[(String, Tensor)],
    opt: &mut super::optim::AdamW,
) -> Result<usize> {
    use super::api::{names, Component};
    let weights = Component::tensors(
        ckpt.tensors(names::MODEL)?
            .iter()
            .map(|(n, t)| (n.clone(), t.shallow_clone()))
            .collect(),
    );
    let staged = weights
        .stage_into(params)
        .map_err(|e| e.context(format!("{op}: component \"model\"")))?;
    let prepared = opt
        .prepare_state(ckpt.tensors(names::OPT)?, ckpt.json(names::OPT)?)
        .map_err(|e| e.context(format!("{op}: component \"opt\"")))?;
    let steps = super::api::counter_from_json(op, ckpt.json("trainer")?, "steps")?;
    staged.commit()?;
    opt.commit_state(prepared)?;
    Ok(steps)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a64_matches_the_reference_vectors() {
        // Published FNV-1a 64 test vectors.
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
    }
}
