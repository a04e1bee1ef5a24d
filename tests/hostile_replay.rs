//! A disk replay storage (`LazyMemmapStorage`, `ReplayBuffer::with_memmap`) reopened from a
//! folder it did not write, or one a crash left behind (issue 29): `meta.json` is checked
//! whole before any file is opened, and a reopened storage's files must be intact. Before
//! this, a `meta.json` could make the buffer create or resize a file outside its folder
//! (`"file": "../x"`), silently zero-extend a truncated leaf file, panic on a shape whose size
//! overflows, and clamp an out-of-range length or cursor into a wrong buffer.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};
use tch::{Device, Kind, Tensor};
use torchrl::data::replay::{RandomSampler, ReplayBuffer};
use torchrl::{Error, TensorDict};

fn tempdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("torchrl-hostile-rb-{name}-{}", std::process::id()));
    std::fs::remove_dir_all(&d).ok();
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A storage of capacity 4 in `dir/rb` holding 3 items of `obs` `[2]` float and `act` int64.
fn written(dir: &Path) -> PathBuf {
    let rb_dir = dir.join("rb");
    let mut rb = ReplayBuffer::with_memmap(4, RandomSampler::new(0), &rb_dir).unwrap();
    let batch = TensorDict::new([3])
        .unwrap()
        .with(
            "obs",
            Tensor::arange(6, (Kind::Float, Device::Cpu)).view([3, 2]),
        )
        .unwrap()
        .with("act", Tensor::from_slice(&[7i64, 8, 9]))
        .unwrap();
    rb.extend(&batch).unwrap();
    rb_dir
}

fn meta(rb_dir: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(rb_dir.join("meta.json")).unwrap()).unwrap()
}

/// Every file of `dir` (recursively) with its bytes.
fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push((p.clone(), std::fs::read(&p).unwrap()));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn a_reopened_storage_is_unchanged_and_usable() {
    let dir = tempdir("ok");
    let rb_dir = written(&dir);
    let rb = ReplayBuffer::with_memmap(4, RandomSampler::new(0), &rb_dir).unwrap();
    assert_eq!(rb.len(), 3);
    let td = rb.storage().unwrap().unwrap();
    assert_eq!(
        Vec::<i64>::try_from(td.get("act").unwrap()).unwrap(),
        vec![7, 8, 9]
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// One edit of a `meta.json`.
type Edit = Box<dyn Fn(&mut Value)>;

#[test]
fn a_hostile_meta_json_is_refused_naming_it_and_touches_no_file() {
    let dir = tempdir("meta");
    let rb_dir = written(&dir);
    let original = meta(&rb_dir);
    let edits: Vec<(&str, Edit)> = vec![
        (
            "file outside the folder",
            Box::new(|m| m["leaves"][0]["file"] = json!("../outside.bin")),
        ),
        (
            "absolute file",
            Box::new(|m| m["leaves"][0]["file"] = json!("/tmp/torchrl-abs.bin")),
        ),
        (
            "hidden file",
            Box::new(|m| m["leaves"][0]["file"] = json!(".x")),
        ),
        (
            "file named twice",
            Box::new(|m| {
                let f = m["leaves"][0]["file"].clone();
                m["leaves"][1]["file"] = f;
            }),
        ),
        (
            "overflowing shape",
            Box::new(|m| m["leaves"][0]["shape"] = json!([i64::MAX, 4])),
        ),
        (
            "negative shape",
            Box::new(|m| m["leaves"][0]["shape"] = json!([-2])),
        ),
        (
            "huge item",
            Box::new(|m| m["leaves"][0]["shape"] = json!([1i64 << 40, 1 << 10])),
        ),
        ("len past capacity", Box::new(|m| m["len"] = json!(9))),
        ("negative len", Box::new(|m| m["len"] = json!(-1))),
        ("cursor past capacity", Box::new(|m| m["cursor"] = json!(4))),
        ("empty key", Box::new(|m| m["leaves"][0]["key"] = json!([]))),
        (
            "duplicate key",
            Box::new(|m| {
                let k = m["leaves"][0]["key"].clone();
                m["leaves"][1]["key"] = k;
            }),
        ),
        (
            "key inside another",
            Box::new(|m| {
                let mut k = m["leaves"][0]["key"].clone();
                k.as_array_mut().unwrap().push(json!("sub"));
                m["leaves"][1]["key"] = k;
            }),
        ),
        (
            "unknown dtype",
            Box::new(|m| m["leaves"][0]["dtype"] = json!("complex64")),
        ),
        (
            "item batch not a prefix",
            Box::new(|m| m["item_batch"] = json!([5])),
        ),
        ("version", Box::new(|m| m["version"] = json!(2))),
        ("not a layout", Box::new(|m| *m = json!({"leaves": 3}))),
        // fuzz replay-storage, seed 2030, case 1725: items without leaves reopened, then
        // every sample failed
        (
            "items without leaves",
            Box::new(|m| m["leaves"] = json!([])),
        ),
    ];
    for (what, edit) in edits {
        let mut m = original.clone();
        edit(&mut m);
        std::fs::write(rb_dir.join("meta.json"), m.to_string()).unwrap();
        let before = snapshot(&dir);
        let err = ReplayBuffer::with_memmap(4, RandomSampler::new(0), &rb_dir)
            .map(|_| ())
            .unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("meta.json"), "{what}: {msg}");
        assert!(
            matches!(err.root(), Error::InvalidFile { .. }),
            "{what}: {msg}"
        );
        assert_eq!(
            snapshot(&dir),
            before,
            "{what}: a file was created or changed"
        );
        assert!(!Path::new("/tmp/torchrl-abs.bin").exists(), "{what}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_truncated_or_missing_leaf_file_is_refused_not_zero_filled() {
    let dir = tempdir("leaf");
    let rb_dir = written(&dir);
    let m = meta(&rb_dir);
    let leaf = rb_dir.join(m["leaves"][0]["file"].as_str().unwrap());
    let bytes = std::fs::read(&leaf).unwrap();
    // truncated by a crash
    std::fs::write(&leaf, &bytes[..bytes.len() - 3]).unwrap();
    let err = ReplayBuffer::with_memmap(4, RandomSampler::new(0), &rb_dir)
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(&leaf.display().to_string()) && err.contains("bytes"),
        "{err}"
    );
    assert_eq!(
        std::fs::read(&leaf).unwrap().len(),
        bytes.len() - 3,
        "resized"
    );
    // missing
    std::fs::remove_file(&leaf).unwrap();
    let err = ReplayBuffer::with_memmap(4, RandomSampler::new(0), &rb_dir)
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(err.contains(&leaf.display().to_string()), "{err}");
    assert!(!leaf.exists(), "a missing leaf file was created");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_capacity_below_one_or_a_first_batch_too_large_is_an_error() {
    let dir = tempdir("cap");
    for cap in [0, -3] {
        assert!(torchrl::data::replay::LazyMemmapStorage::new(dir.join("a"), cap).is_err());
    }
    // a first batch whose items times the capacity pass the limit: refused before any file
    let big = dir.join("big");
    let mut rb = ReplayBuffer::with_memmap(1 << 40, RandomSampler::new(0), &big).unwrap();
    let batch = TensorDict::new([1])
        .unwrap()
        .with("x", Tensor::zeros([1, 1 << 10], (Kind::Float, Device::Cpu)))
        .unwrap();
    let err = rb.extend(&batch).unwrap_err().to_string();
    assert!(err.contains("exceed"), "{err}");
    assert!(snapshot(&big).is_empty(), "a file was made");
    std::fs::remove_dir_all(&dir).ok();
}
