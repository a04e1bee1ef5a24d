//! Behaviour tests of `TensorDict` through the public API, for what the recorded Python cases
//! (`tests/reference_tensordict.rs`) do not cover: save/load and corrupt files, stack/unbind
//! round trips, clone semantics, dtype casts, detach, key flattening, atomicity of failed
//! mutations, writes through masks and index tensors, and the context in error messages.
//!
//! Every expected value is derived by hand in the comments next to it.

use std::path::PathBuf;

use tch::{Device, Kind, Tensor};
use torchrl::tensordict::{IfExists, KeysOptions};
use torchrl::{stack, BatchIndex, Entry, Error, TensorDict};

const CPU: Device = Device::Cpu;

/// `0, 1, 2, ...` of `kind`, shaped `shape`.
fn ar(shape: &[i64], kind: Kind) -> Tensor {
    let n: i64 = shape.iter().product();
    Tensor::arange(n, (Kind::Int64, CPU))
        .to_kind(kind)
        .reshape(shape)
}

fn f64s(t: &Tensor) -> Vec<f64> {
    Vec::<f64>::try_from(&t.reshape([-1])).expect("float values")
}

fn i64s(t: &Tensor) -> Vec<i64> {
    Vec::<i64>::try_from(&t.reshape([-1])).expect("int values")
}

fn key_strings(td: &TensorDict) -> Vec<String> {
    td.keys(KeysOptions::nested())
        .iter()
        .map(|k| k.to_string())
        .collect()
}

/// Same keys (in order), same batch sizes at every level, same dtypes and equal values.
fn assert_same(a: &TensorDict, b: &TensorDict) {
    assert_eq!(key_strings(a), key_strings(b), "keys");
    assert_eq!(a.batch_size(), b.batch_size(), "batch size");
    for (k, e) in a.items(KeysOptions::nested()) {
        match (e, b.get_entry(&k).expect("same keys")) {
            (Entry::Tensor(x), Entry::Tensor(y)) => {
                assert_eq!(x.kind(), y.kind(), "dtype of {k}");
                assert_eq!(x.size(), y.size(), "shape of {k}");
                assert!(x.equal(y), "values of {k}");
            }
            (Entry::Dict(x), Entry::Dict(y)) => {
                assert_eq!(x.batch_size(), y.batch_size(), "batch size of {k}")
            }
            _ => panic!("{k}: a leaf in one, a level in the other"),
        }
    }
}

/// A unique temporary path, removed on drop.
struct TempFile(PathBuf);

impl TempFile {
    fn new(tag: &str) -> Self {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static N: AtomicUsize = AtomicUsize::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        TempFile(std::env::temp_dir().join(format!(
            "torchrl-td-test-{}-{tag}-{n}.safetensors",
            std::process::id()
        )))
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// batch [2]; every dtype the format knows that the library uses; a level with a longer batch
/// ([2, 4]) holding an empty level; an empty level at the top; keys in a non-alphabetical,
/// leaves-and-levels-interleaved order.
fn rich_td() -> TensorDict {
    let deep = TensorDict::new([2, 4])
        .unwrap()
        .with("x", ar(&[2, 4, 1], Kind::Double))
        .unwrap()
        .with("e", TensorDict::new([2, 4]).unwrap())
        .unwrap();
    TensorDict::new([2])
        .unwrap()
        .with("f32", ar(&[2, 3], Kind::Float) / 4.0)
        .unwrap()
        .with(
            ("next", "reward"),
            Tensor::from_slice(&[1.5f32, -2.25]).view([2, 1]),
        )
        .unwrap()
        .with("empty", TensorDict::new([2]).unwrap())
        .unwrap()
        .with("i64", Tensor::from_slice(&[i64::MIN, i64::MAX]))
        .unwrap()
        .with("deep", deep)
        .unwrap()
        .with("i32", Tensor::from_slice(&[-7i32, 7]))
        .unwrap()
        .with("u8", Tensor::from_slice(&[0u8, 255]).view([2, 1]))
        .unwrap()
        .with("i8", Tensor::from_slice(&[-128i8, 127]))
        .unwrap()
        .with("b", Tensor::from_slice(&[true, false]))
        .unwrap()
        .with("f64", Tensor::from_slice(&[0.1f64, -1e300]))
        .unwrap()
}

// ------------------------------------------------------------------ save / load

#[test]
fn save_load_round_trip() {
    let td = rich_td();
    let f = TempFile::new("round");
    td.save(&f.0).unwrap();
    let back = TensorDict::load(&f.0).unwrap();
    assert_same(&td, &back);
    // Hand-checked details: batch sizes of every level, empty levels kept, extreme values.
    assert_eq!(back.batch_size(), &[2]);
    assert_eq!(back.get_dict("deep").unwrap().batch_size(), &[2, 4]);
    assert_eq!(back.get_dict(("deep", "e")).unwrap().batch_size(), &[2, 4]);
    assert_eq!(back.get_dict("empty").unwrap().len(), 0);
    assert_eq!(back.get_dict("empty").unwrap().batch_size(), &[2]);
    assert_eq!(i64s(back.get("i64").unwrap()), vec![i64::MIN, i64::MAX]);
    assert_eq!(i64s(back.get("u8").unwrap()), vec![0, 255]);
    assert_eq!(i64s(back.get("i8").unwrap()), vec![-128, 127]);
    assert_eq!(f64s(back.get("f64").unwrap()), vec![0.1, -1e300]);
    // arange(6) / 4 = 0, .25, .5, .75, 1, 1.25
    assert_eq!(
        f64s(back.get("f32").unwrap()),
        vec![0.0, 0.25, 0.5, 0.75, 1.0, 1.25]
    );
    assert_eq!(back.get("b").unwrap().kind(), Kind::Bool);
    assert_eq!(i64s(back.get("b").unwrap()), vec![1, 0]);
    // The insertion order survives, leaves and levels interleaved, at every depth.
    assert_eq!(
        back.keys(KeysOptions::top_level())
            .iter()
            .map(|k| k.to_string())
            .collect::<Vec<_>>(),
        [
            "\"f32\"",
            "\"next\"",
            "\"empty\"",
            "\"i64\"",
            "\"deep\"",
            "\"i32\"",
            "\"u8\"",
            "\"i8\"",
            "\"b\"",
            "\"f64\""
        ]
    );
    // Saving over an existing file replaces it.
    let small = TensorDict::new([])
        .unwrap()
        .with("z", Tensor::from_slice(&[3i64]))
        .unwrap();
    small.save(&f.0).unwrap();
    assert_same(&small, &TensorDict::load(&f.0).unwrap());
}

#[test]
fn save_load_empty_and_scalar_batch() {
    let f = TempFile::new("empty");
    let empty = TensorDict::new([5, 0]).unwrap();
    empty.save(&f.0).unwrap();
    let back = TensorDict::load(&f.0).unwrap();
    assert_eq!(back.batch_size(), &[5, 0]);
    assert!(back.is_empty());
    assert_eq!(back.len(), 0);

    // Zero-element leaves and 0-d leaves.
    let td = TensorDict::new([])
        .unwrap()
        .with("none", Tensor::zeros([0, 3], (Kind::Float, CPU)))
        .unwrap()
        .with("s", Tensor::from(2.5f64))
        .unwrap();
    td.save(&f.0).unwrap();
    let back = TensorDict::load(&f.0).unwrap();
    assert_same(&td, &back);
    assert_eq!(back.get("none").unwrap().size(), vec![0, 3]);
    assert_eq!(back.get("s").unwrap().size(), Vec::<i64>::new());
    assert_eq!(back.get("s").unwrap().double_value(&[]), 2.5);
}

/// The file must be refused as a whole: `InvalidFile` (or `Io`), never a tensordict.
fn assert_refused(path: &std::path::Path, what: &str) {
    match TensorDict::load(path) {
        Ok(td) => panic!("{what}: loaded a tensordict from a bad file:\n{td}"),
        Err(e @ Error::InvalidFile { .. }) | Err(e @ Error::Io { .. }) => {
            let msg = e.to_string();
            eprintln!("{what}: {msg}");
            assert!(
                msg.contains(&path.display().to_string()),
                "{what}: the error names the file: {msg}"
            );
        }
        Err(other) => panic!("{what}: expected InvalidFile or Io, got {other:?}"),
    }
}

#[test]
fn corrupt_truncated_and_foreign_files_are_refused() {
    let good = TempFile::new("good");
    rich_td().save(&good.0).unwrap();
    let bytes = std::fs::read(&good.0).unwrap();
    // safetensors: 8-byte little-endian header length, then the JSON header, then the data.
    let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    assert!(header_len > 16 && 8 + header_len < bytes.len());

    let bad = TempFile::new("bad");
    let write = |b: &[u8]| std::fs::write(&bad.0, b).unwrap();

    // Truncated: in the data, in the header, inside the length prefix, empty.
    for cut in [bytes.len() - 1, bytes.len() / 2, 8 + header_len / 2, 4, 0] {
        write(&bytes[..cut]);
        assert_refused(&bad.0, &format!("truncated to {cut} bytes"));
    }
    // Flipped bytes at the start of the JSON header.
    let mut flipped = bytes.clone();
    for b in &mut flipped[8..16] {
        *b ^= 0xFF;
    }
    write(&flipped);
    assert_refused(&bad.0, "flipped header bytes");
    // Flipped byte in the middle of the header.
    let mut flipped = bytes.clone();
    flipped[8 + header_len / 2] ^= 0xFF;
    write(&flipped);
    assert_refused(&bad.0, "flipped byte mid-header");
    // A header length pointing past the end of the file.
    let mut long = bytes.clone();
    long[..8].copy_from_slice(&((bytes.len() as u64) * 2).to_le_bytes());
    write(&long);
    assert_refused(&bad.0, "header length too large");
    // A well-formed file whose layout lies: the root batch size [2] becomes [3] (same byte
    // length, so the header stays valid); the leaves of shape [2, ...] then contradict it.
    let needle = br#"batch_size\":[2]"#;
    let at = bytes
        .windows(needle.len())
        .position(|w| w == needle)
        .expect("the layout names the root batch size");
    let mut lying = bytes.clone();
    lying[at + needle.len() - 2] = b'3';
    write(&lying);
    assert_refused(&bad.0, "layout contradicts the leaves");

    // A foreign safetensors file (valid, but not written by TensorDict::save).
    let foreign = TempFile::new("foreign");
    Tensor::write_safetensors(
        &[
            ("weight", ar(&[2, 3], Kind::Float)),
            ("bias", ar(&[3], Kind::Float)),
        ],
        &foreign.0,
    )
    .unwrap();
    assert_refused(&foreign.0, "foreign safetensors file");

    // Not a file at all: an Io error naming the path.
    let missing = TempFile::new("missing");
    match TensorDict::load(&missing.0) {
        Err(Error::Io { path, .. }) => assert!(path.contains("missing")),
        other => panic!("expected Io, got {other:?}"),
    }

    // The good file still loads (nothing above touched it).
    assert_same(&rich_td(), &TensorDict::load(&good.0).unwrap());
}

// ------------------------------------------------------------------ shape round trips

#[test]
fn stack_of_unbind_is_identity() {
    // batch [3, 2]; a child with a longer batch [3, 2, 4]; several dtypes.
    let td = TensorDict::new([3, 2])
        .unwrap()
        .with("a", ar(&[3, 2, 5], Kind::Float))
        .unwrap()
        .with("m", ar(&[3, 2], Kind::Int))
        .unwrap()
        .with(
            "n",
            TensorDict::new([3, 2, 4])
                .unwrap()
                .with("x", ar(&[3, 2, 4], Kind::Bool))
                .unwrap(),
        )
        .unwrap();
    for dim in [0i64, 1, -1, -2] {
        let parts = td.unbind(dim).unwrap();
        // dim 0 (or -2) gives 3 parts of batch [2]; dim 1 (or -1) gives 2 parts of batch [3].
        let (n, batch) = if dim == 0 || dim == -2 {
            (3, vec![2])
        } else {
            (2, vec![3])
        };
        assert_eq!(parts.len(), n);
        assert!(parts.iter().all(|p| p.batch_size() == batch.as_slice()));
        let back = stack(&parts, dim).unwrap();
        assert_same(&td, &back);
        assert_eq!(back.get_dict("n").unwrap().batch_size(), &[3, 2, 4]);
    }
    // Hand check: unbind(1)[1]["m"] = column 1 of [[0, 1], [2, 3], [4, 5]] = [1, 3, 5].
    assert_eq!(
        i64s(td.unbind(1).unwrap()[1].get("m").unwrap()),
        vec![1, 3, 5]
    );
}

// ------------------------------------------------------------------ clones and casts

#[test]
fn clone_shares_storage_deep_clone_does_not() {
    let td = TensorDict::new([2])
        .unwrap()
        .with(("n", "x"), Tensor::from_slice(&[1.0f32, 2.0]))
        .unwrap();
    let shallow = td.clone();
    let deep = td.deep_clone().unwrap();
    let ptr = |t: &TensorDict| t.get(("n", "x")).unwrap().data_ptr();
    assert_eq!(ptr(&shallow), ptr(&td));
    assert_ne!(ptr(&deep), ptr(&td));
    // Writing through the original is seen by the shallow clone only.
    td.fill_(("n", "x"), 9.0).unwrap();
    assert_eq!(f64s(shallow.get(("n", "x")).unwrap()), vec![9.0, 9.0]);
    assert_eq!(f64s(deep.get(("n", "x")).unwrap()), vec![1.0, 2.0]);
    // But the key structure is copied: adding a key to the clone leaves the original alone.
    let mut shallow = shallow;
    shallow
        .set(("n", "y"), Tensor::zeros([2], (Kind::Float, CPU)))
        .unwrap();
    assert!(!td.contains(("n", "y")));
    // deep_clone keeps dtype, shape, batch sizes.
    assert_eq!(deep.get(("n", "x")).unwrap().kind(), Kind::Float);
    assert_eq!(deep.get_dict("n").unwrap().batch_size(), &[2]);
}

#[test]
fn to_kind_casts_every_leaf() {
    let td = TensorDict::new([2])
        .unwrap()
        .with("f", Tensor::from_slice(&[1.75f32, -2.5]))
        .unwrap()
        .with(("n", "i"), Tensor::from_slice(&[3i64, -4]))
        .unwrap()
        .with(("n", "b"), Tensor::from_slice(&[true, false]))
        .unwrap();
    let d = td.to_kind(Kind::Double).unwrap();
    assert_eq!(key_strings(&d), key_strings(&td));
    assert_eq!(d.get_dict("n").unwrap().batch_size(), &[2]);
    for (_, t) in d.leaves() {
        assert_eq!(t.kind(), Kind::Double);
    }
    assert_eq!(f64s(d.get("f").unwrap()), vec![1.75, -2.5]);
    assert_eq!(f64s(d.get(("n", "i")).unwrap()), vec![3.0, -4.0]);
    assert_eq!(f64s(d.get(("n", "b")).unwrap()), vec![1.0, 0.0]);
    // Float -> int truncates toward zero: 1.75 -> 1, -2.5 -> -2; bool -> 1 / 0.
    let i = td.to_kind(Kind::Int64).unwrap();
    assert_eq!(i64s(i.get("f").unwrap()), vec![1, -2]);
    assert_eq!(i64s(i.get(("n", "b")).unwrap()), vec![1, 0]);
    assert_eq!(i.get("f").unwrap().kind(), Kind::Int64);
    // The source is untouched.
    assert_eq!(td.get("f").unwrap().kind(), Kind::Float);
}

#[test]
fn detach_drops_grad_and_shares_storage() {
    let w = Tensor::from_slice(&[1.0f32, 2.0]).set_requires_grad(true);
    let y = &w * 3.0; // a non-leaf with a grad_fn
    let td = TensorDict::new([2])
        .unwrap()
        .with("w", w.shallow_clone())
        .unwrap()
        .with(("n", "y"), y)
        .unwrap();
    assert!(td.get(("n", "y")).unwrap().requires_grad());
    let d = td.detach().unwrap();
    for (k, t) in d.leaves() {
        assert!(!t.requires_grad(), "{k} still requires grad");
        assert_eq!(
            t.data_ptr(),
            td.get(&k).unwrap().data_ptr(),
            "{k} was copied"
        );
    }
    // 3 * [1, 2] = [3, 6]
    assert_eq!(f64s(d.get(("n", "y")).unwrap()), vec![3.0, 6.0]);
    assert!(
        td.get("w").unwrap().requires_grad(),
        "source keeps its grad"
    );
}

// ------------------------------------------------------------------ keys

#[test]
fn flatten_unflatten_round_trip() {
    let td = TensorDict::new([2])
        .unwrap()
        .with("a", ar(&[2], Kind::Float))
        .unwrap()
        .with(("n", "x"), ar(&[2, 3], Kind::Int64))
        .unwrap()
        .with(("n", "m", "y"), ar(&[2], Kind::Bool))
        .unwrap()
        .with("z", ar(&[2, 1], Kind::Double))
        .unwrap();
    let flat = td.flatten_keys(".").unwrap();
    // One level, leaves in depth-first order, joined with ".".
    assert_eq!(
        key_strings(&flat),
        ["\"a\"", "\"n.x\"", "\"n.m.y\"", "\"z\""]
    );
    assert_eq!(flat.batch_size(), &[2]);
    let back = flat.unflatten_keys(".").unwrap();
    assert_same(&td, &back);
    // Flattening shares storage.
    assert_eq!(
        flat.get("n.x").unwrap().data_ptr(),
        td.get(("n", "x")).unwrap().data_ptr()
    );
    // Another separator.
    let flat2 = td.flatten_keys("/").unwrap();
    assert!(flat2.contains("n/m/y"));
    assert_same(&td, &flat2.unflatten_keys("/").unwrap());

    // A collision after joining is an error naming the key.
    let clash = TensorDict::new([])
        .unwrap()
        .with("n.x", Tensor::from(1.0f32))
        .unwrap()
        .with(("n", "x"), Tensor::from(2.0f32))
        .unwrap();
    let e = clash.flatten_keys(".").unwrap_err();
    assert!(matches!(e, Error::KeyExists { .. }), "{e}");
    assert!(e.to_string().contains("\"n.x\""), "{e}");
    // An empty segment is refused by unflatten.
    let bad = TensorDict::new([])
        .unwrap()
        .with("a..b", Tensor::from(1.0f32))
        .unwrap();
    let e = bad.unflatten_keys(".").unwrap_err();
    assert!(
        matches!(e, Error::InvalidKey { .. }) && e.to_string().contains("a..b"),
        "{e}"
    );
}

#[test]
fn rename_key_safe_leaves_td_unchanged_on_error() {
    let mut td = TensorDict::new([2])
        .unwrap()
        .with("a", Tensor::from_slice(&[1i64, 2]))
        .unwrap()
        .with("b", Tensor::from_slice(&[3i64, 4]))
        .unwrap();
    let before = td.deep_clone().unwrap();
    // safe=true and the target exists.
    let e = td.rename_key("a", "b", IfExists::Error).unwrap_err();
    assert!(matches!(e, Error::KeyExists { .. }), "{e}");
    assert!(e.to_string().contains("\"b\""), "{e}");
    assert_same(&before, &td);
    // The target path walks through a leaf: the source must not be lost.
    let e = td.rename_key("a", ("b", "c"), IfExists::Error).unwrap_err();
    assert!(e.to_string().contains("\"b\""), "{e}");
    assert_same(&before, &td);
    let e = td
        .rename_key("a", ("b", "c"), IfExists::Overwrite)
        .unwrap_err();
    assert!(e.to_string().contains("\"b\""), "{e}");
    assert_same(&before, &td);
    // A missing source.
    let e = td.rename_key("zz", "q", IfExists::Error).unwrap_err();
    assert!(
        matches!(e, Error::KeyNotFound { .. }) && e.to_string().contains("\"zz\""),
        "{e}"
    );
    assert_same(&before, &td);
    // And it works when allowed: a moves to the end, into a new level.
    td.rename_key("a", ("n", "a"), IfExists::Error).unwrap();
    assert_eq!(key_strings(&td), ["\"b\"", "(\"n\", \"a\")", "\"n\""]);
    assert_eq!(i64s(td.get(("n", "a")).unwrap()), vec![1, 2]);
}

#[test]
fn update_is_atomic_on_error() {
    // self: a [3], n (batch [3, 2]) {x [3, 2]}
    let mut td = TensorDict::new([3])
        .unwrap()
        .with("a", Tensor::from_slice(&[1.0f32, 2.0, 3.0]))
        .unwrap()
        .with(
            "n",
            TensorDict::new([3, 2])
                .unwrap()
                .with("x", ar(&[3, 2], Kind::Int64))
                .unwrap(),
        )
        .unwrap();
    let before = td.deep_clone().unwrap();
    // other: a is valid (and comes first, so a non-atomic update would already have replaced
    // it); n (batch [3]) holds x, valid, and bad [3, 5], valid in other but not in self's n,
    // whose batch size is [3, 2].
    let other = TensorDict::new([3])
        .unwrap()
        .with("a", Tensor::from_slice(&[-1.0f32, -2.0, -3.0]))
        .unwrap()
        .with(
            "n",
            TensorDict::new([3])
                .unwrap()
                .with("x", ar(&[3, 2], Kind::Int64) * 10)
                .unwrap()
                .with("bad", ar(&[3, 5], Kind::Float))
                .unwrap(),
        )
        .unwrap()
        .with("new", Tensor::from_slice(&[true, true, false]))
        .unwrap();
    let e = td.update(&other).unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, Error::BatchSizeMismatch { .. }), "{msg}");
    assert!(msg.contains(r#"("n", "bad")"#), "names the full key: {msg}");
    assert!(
        msg.contains("[3, 2]") && msg.contains("[3, 5]"),
        "names the shapes: {msg}"
    );
    assert_same(&before, &td);
    assert!(!td.contains("new") && !td.contains(("n", "bad")));
    assert_eq!(f64s(td.get("a").unwrap()), vec![1.0, 2.0, 3.0]);

    // Without the bad leaf it merges: a replaced, n.x replaced, new added at the end.
    let mut other = other;
    other.remove(("n", "bad"));
    td.update(&other).unwrap();
    assert_eq!(
        key_strings(&td),
        ["\"a\"", "(\"n\", \"x\")", "\"n\"", "\"new\""]
    );
    assert_eq!(f64s(td.get("a").unwrap()), vec![-1.0, -2.0, -3.0]);
    assert_eq!(
        i64s(td.get(("n", "x")).unwrap()),
        vec![0, 10, 20, 30, 40, 50]
    );
    assert_eq!(
        td.get_dict("n").unwrap().batch_size(),
        &[3, 2],
        "n keeps its batch size"
    );
}

// ------------------------------------------------------------------ writes through an index

fn td4() -> TensorDict {
    // a = [[0, 1], [2, 3], [4, 5], [6, 7]], n.b = [0, 1, 2, 3]
    TensorDict::new([4])
        .unwrap()
        .with("a", ar(&[4, 2], Kind::Float))
        .unwrap()
        .with(("n", "b"), ar(&[4], Kind::Int64))
        .unwrap()
}

#[test]
fn set_at_with_mask() {
    let mut td = td4();
    let value = TensorDict::new([2])
        .unwrap()
        .with(
            "a",
            Tensor::from_slice(&[-1.0f32, -2.0, -3.0, -4.0]).view([2, 2]),
        )
        .unwrap()
        .with(("n", "b"), Tensor::from_slice(&[10i64, 20]))
        .unwrap();
    let mask = Tensor::from_slice(&[true, false, false, true]);
    td.set_at(&[BatchIndex::Mask(mask)], &value).unwrap();
    // Rows 0 and 3 are replaced, in order.
    assert_eq!(
        f64s(td.get("a").unwrap()),
        vec![-1.0, -2.0, 2.0, 3.0, 4.0, 5.0, -3.0, -4.0]
    );
    assert_eq!(i64s(td.get(("n", "b")).unwrap()), vec![10, 1, 2, 20]);

    // A 2-d mask over batch [2, 2]: true at (0, 1) and (1, 0), written in row-major order.
    let mut td = TensorDict::new([2, 2])
        .unwrap()
        .with("m", ar(&[2, 2], Kind::Int))
        .unwrap();
    let mask = Tensor::from_slice(&[false, true, true, false]).view([2, 2]);
    let value = TensorDict::new([2])
        .unwrap()
        .with("m", Tensor::from_slice(&[100i32, 200]))
        .unwrap();
    td.set_at(&[BatchIndex::Mask(mask)], &value).unwrap();
    assert_eq!(i64s(td.get("m").unwrap()), vec![0, 100, 200, 3]);

    // A mask with the wrong shape: an error naming both shapes, nothing written.
    let mut td = td4();
    let before = td.deep_clone().unwrap();
    let e = td
        .set_at(
            &[BatchIndex::Mask(Tensor::from_slice(&[true, false]))],
            &value,
        )
        .unwrap_err();
    assert!(
        e.to_string().contains("[4]") && e.to_string().contains("[2]"),
        "{e}"
    );
    assert_same(&before, &td);
}

#[test]
fn set_at_with_index_tensor() {
    let mut td = td4();
    let value = TensorDict::new([2])
        .unwrap()
        .with(
            "a",
            Tensor::from_slice(&[100.0f32, 101.0, 200.0, 201.0]).view([2, 2]),
        )
        .unwrap();
    // Rows 2 and 0 (in that order); n.b is absent from the value and stays as it is.
    td.set_at(
        &[BatchIndex::Tensor(Tensor::from_slice(&[2i64, 0]))],
        &value,
    )
    .unwrap();
    assert_eq!(
        f64s(td.get("a").unwrap()),
        vec![200.0, 201.0, 2.0, 3.0, 100.0, 101.0, 6.0, 7.0]
    );
    assert_eq!(i64s(td.get(("n", "b")).unwrap()), vec![0, 1, 2, 3]);
    // Negative indices count from the end: -1 is row 3.
    let one = TensorDict::new([1])
        .unwrap()
        .with(("n", "b"), Tensor::from_slice(&[-9i64]))
        .unwrap();
    td.set_at(&[BatchIndex::Tensor(Tensor::from_slice(&[-1i64]))], &one)
        .unwrap();
    assert_eq!(i64s(td.get(("n", "b")).unwrap()), vec![0, 1, 2, -9]);

    // A leaf of the wrong shape: nothing is written, not even the valid leaf before it.
    let before = td.deep_clone().unwrap();
    let bad = TensorDict::new([2])
        .unwrap()
        .with("a", Tensor::zeros([2, 2], (Kind::Float, CPU)))
        .unwrap()
        .with(("n", "b"), Tensor::zeros([2, 3], (Kind::Int64, CPU)))
        .unwrap();
    let e = td
        .set_at(&[BatchIndex::Tensor(Tensor::from_slice(&[0i64, 1]))], &bad)
        .unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains(r#"("n", "b")"#) && msg.contains("[2]") && msg.contains("[2, 3]"),
        "{msg}"
    );
    assert_same(&before, &td);
    // An index out of range: an error naming the index and the size.
    let e = td
        .set_at(
            &[BatchIndex::Tensor(Tensor::from_slice(&[4i64, 0]))],
            &value,
        )
        .unwrap_err();
    assert!(matches!(e, Error::IndexOutOfRange { .. }), "{e}");
    assert!(e.to_string().contains('4'), "{e}");
    assert_same(&before, &td);
}

// ------------------------------------------------------------------ error messages

#[test]
fn error_messages_name_keys_and_shapes() {
    let mut td = TensorDict::new([3])
        .unwrap()
        .with("obs", Tensor::zeros([3, 2], (Kind::Float, CPU)))
        .unwrap()
        .with(
            ("next", "reward"),
            Tensor::zeros([3, 1], (Kind::Float, CPU)),
        )
        .unwrap();
    let has = |e: &Error, parts: &[&str]| {
        let msg = e.to_string();
        for p in parts {
            assert!(msg.contains(p), "{p:?} missing from: {msg}");
        }
    };

    // set: wrong leading dims.
    let e = td
        .set(("next", "done"), Tensor::zeros([4, 1], (Kind::Bool, CPU)))
        .unwrap_err();
    assert!(matches!(e, Error::BatchSizeMismatch { .. }));
    has(&e, &[r#"("next", "done")"#, "[3]", "[4, 1]"]);
    // get_or_err: missing key, with the available keys.
    let e = td.get_or_err(("next", "rew")).unwrap_err();
    assert!(matches!(e, Error::KeyNotFound { .. }));
    has(&e, &[r#"("next", "rew")"#, r#"("next", "reward")"#]);
    // A path through a leaf.
    let e = td.get_or_err(("obs", "x")).unwrap_err();
    assert!(matches!(e, Error::NotALevel { .. }));
    has(&e, &[r#"("obs", "x")"#, r#""obs""#]);
    // set_: shape mismatch names both shapes.
    let e = td
        .set_("obs", &Tensor::zeros([3, 5], (Kind::Float, CPU)))
        .unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch { .. }));
    has(&e, &[r#""obs""#, "[3, 2]", "[3, 5]"]);
    // index out of range names the index and the size.
    let e = td.index(&[BatchIndex::Int(7)]).unwrap_err();
    has(&e, &["7", "3"]);
    // stack: leaf shapes differ.
    let other = td
        .clone()
        .with("obs", Tensor::zeros([3, 4], (Kind::Float, CPU)))
        .unwrap();
    let e = stack(&[td.clone(), other], 0).unwrap_err();
    has(&e, &[r#""obs""#, "[3, 2]", "[3, 4]"]);
    // Dims out of range name the batch size.
    let e = td.unsqueeze(5).unwrap_err();
    has(&e, &["5", "[3]"]);
    let e = td.permute([0, 0]).unwrap_err();
    has(&e, &["[0, 0]", "[0]", "[3]"]);
    // Nothing above changed the tensordict.
    assert_eq!(
        key_strings(&td),
        ["\"obs\"", r#"("next", "reward")"#, "\"next\""]
    );
    assert_eq!(td.get("obs").unwrap().size(), vec![3, 2]);
}
