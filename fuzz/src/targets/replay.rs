//! A disk replay storage (`ReplayBuffer::with_memmap`, `LazyMemmapStorage`) reopened from a
//! mutated folder (or, one case in eight, an intact one, which must reopen): `meta.json` edited
//! structurally (valid JSON) or as text or bytes, a leaf file's bytes edited
//! (resized or not), a leaf file removed. An `Err` must name `meta.json`, a leaf file or the
//! folder, and leave every file of the case folder (the storage and its parent) as it was:
//! nothing created, resized or written, inside the folder or outside it. An `Ok` buffer is
//! usable: its length is in range, its storage reads, it samples when non-empty, and it takes
//! a batch of its own layout.

use std::path::{Path, PathBuf};

use torchrl::TensorDict;
use torchrl::data::replay::{RandomSampler, ReplayBuffer};
use torchrl::tch::{Device, Kind, Tensor};

use super::{Outcome, State, named_err, plain_err};
use crate::mutate::{Rng, mutate_bytes, mutate_json, mutate_json_text};

/// Every file below `dir`, with its bytes (sorted by path).
fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let bytes = std::fs::read(&p).unwrap_or_default();
                out.push((p, bytes));
            }
        }
    }
    out.sort();
    out
}

/// One of three layouts: flat float / int64 leaves, a nested key with a bool leaf, or items
/// with a batch dim of their own (`item_batch` `[2]`), `n` items.
fn batch(layout: usize, n: i64) -> TensorDict {
    let f = |shape: &[i64]| {
        let numel: i64 = shape.iter().product();
        Tensor::arange(numel, (Kind::Float, Device::Cpu)).view(shape)
    };
    let built = match layout {
        0 => TensorDict::new([n]).and_then(|td| {
            td.with("obs", f(&[n, 3]))?
                .with("act", Tensor::arange(n, (Kind::Int64, Device::Cpu)))
        }),
        1 => TensorDict::new([n]).and_then(|td| {
            td.with(("next", "obs"), f(&[n, 2]))?.with(
                ("next", "done"),
                Tensor::zeros([n, 1], (Kind::Bool, Device::Cpu)),
            )
        }),
        _ => TensorDict::new([n, 2]).and_then(|td| td.with("x", f(&[n, 2, 4]))),
    };
    built.expect("a seed batch")
}

pub fn replay_storage_case(st: &mut State, rng: &mut Rng) -> Outcome {
    let case = st.case_dir();
    let dir = case.join("rb");
    let capacity = [3i64, 4, 8][rng.below(3)];
    let layout = rng.below(3);
    {
        let mut rb = ReplayBuffer::with_memmap(capacity, RandomSampler::new(0), &dir)
            .expect("a fresh storage");
        let n = 1 + rng.below(2 * capacity as usize) as i64;
        rb.extend(&batch(layout, n)).expect("a seed extend");
    }
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n != "meta.json")
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    let meta = dir.join("meta.json");
    let text = std::fs::read(&meta).unwrap_or_default();
    let mut intact = false;
    match rng.below(8) {
        // structural edits that keep the JSON valid: the layout's checks are what is tried
        0..=2 => {
            let edited = serde_json::from_slice::<serde_json::Value>(&text)
                .map(|v| mutate_json(rng, &v).to_string().into_bytes())
                .unwrap_or_else(|_| mutate_bytes(rng, &text));
            std::fs::write(&meta, edited).expect("case file");
        }
        3 => std::fs::write(&meta, mutate_json_text(rng, &text)).expect("case file"),
        4 => std::fs::write(&meta, mutate_bytes(rng, &text)).expect("case file"),
        5 if !files.is_empty() => {
            let leaf = dir.join(rng.pick(&files));
            let bytes = std::fs::read(&leaf).unwrap_or_default();
            std::fs::write(&leaf, mutate_bytes(rng, &bytes)).expect("case file");
        }
        6 if !files.is_empty() => {
            let _ = std::fs::remove_file(dir.join(rng.pick(&files)));
        }
        // untouched: the reopen must succeed
        _ => intact = true,
    }
    let before = snapshot(&case);
    let mut names: Vec<&str> = vec!["meta.json"];
    names.extend(files.iter().map(String::as_str));
    match ReplayBuffer::with_memmap(capacity, RandomSampler::new(1), &dir) {
        Err(e) if intact => {
            Outcome::Defect("unusable", format!("an intact storage was refused: {e}"))
        }
        Err(e) => {
            if snapshot(&case) != before {
                return Outcome::Defect(
                    "half-written",
                    format!("a refused reopen changed the folder: {e}"),
                );
            }
            named_err(e.to_string(), &dir, &names)
        }
        Ok(mut rb) => {
            let len = rb.len();
            if !(0..=capacity).contains(&len) {
                return Outcome::Defect("unusable", format!("len {len} of capacity {capacity}"));
            }
            match rb.storage() {
                Ok(Some(td)) if td.batch_size().first() != Some(&len) => {
                    return Outcome::Defect(
                        "unusable",
                        format!("a storage of {len} items reads {:?}", td.batch_size()),
                    );
                }
                Ok(_) => {}
                Err(e) => return Outcome::Defect("unusable", format!("reading the storage: {e}")),
            }
            if len > 0 {
                if let Err(e) = rb.sample(2) {
                    return Outcome::Defect("unusable", format!("sampling: {e}"));
                }
            }
            // a batch of the seed's layout: taken, or refused with a plain error when the
            // accepted layout differs (a mutated key, dtype or shape that is still whole)
            match rb.extend(&batch(layout, 2)) {
                Ok(_) => Outcome::Ok,
                Err(e) => plain_err(e.to_string()),
            }
        }
    }
}
