//! Data safety of `TensorDict::save` / `TensorDict::load`.
//!
//! - Saving is atomic: a save that fails (its temporary file cannot be created, the target
//!   cannot be replaced, the data cannot be serialised, or the process "dies" mid-write) leaves
//!   the previous file intact and loadable; leftover temporary files of interrupted saves break
//!   neither the next save nor a load.
//! - Loading validates: files truncated at 50 offsets (inside the length prefix, the JSON
//!   header, the layout metadata and the data), files with single bytes flipped at 50 offsets
//!   (two flip patterns), a corrupted header length field, an empty file, random bytes, foreign
//!   safetensors files and JSON-valid but inconsistent layouts each give
//!   `Err(Error::InvalidFile | Error::Io)`, or, where the damage leaves a structurally valid
//!   file (a flip inside tensor data), a complete tensordict with the original keys, shapes and
//!   dtypes. Never a panic, never a partial object.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use serde_json::Value;
use tch::{Device, Kind, Tensor};
use torchrl::tensordict::KeysOptions;
use torchrl::{Entry, Error, TensorDict};

const CPU: Device = Device::Cpu;

// ------------------------------------------------------------------ helpers

/// A fresh folder under the system temp dir, removed (best effort) on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        let p =
            std::env::temp_dir().join(format!("torchrl-data-safety-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }

    fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    /// Names of the entries in the folder, sorted.
    fn listing(&self) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(&self.0)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        set_writable(&self.0, true);
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(unix)]
fn set_writable(p: &Path, writable: bool) {
    use std::os::unix::fs::PermissionsExt;
    let mode = if writable { 0o755 } else { 0o555 };
    let _ = std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode));
}

#[cfg(not(unix))]
fn set_writable(p: &Path, writable: bool) {
    if let Ok(m) = std::fs::metadata(p) {
        let mut perms = m.permissions();
        perms.set_readonly(!writable);
        let _ = std::fs::set_permissions(p, perms);
    }
}

/// The temporary file `save` writes before renaming it over `path` (same folder, named after
/// the target and the process id).
/// A temporary-file name like the ones `save` uses (`.{name}.tmp-…`), for simulated leftovers
/// of an interrupted save. `save` makes its own names unique per call, so leftovers are never
/// reused: they are simply left alone.
fn temp_path_of(path: &Path) -> PathBuf {
    let name = path.file_name().unwrap().to_string_lossy();
    path.with_file_name(format!(".{name}.tmp-{}-interrupted", std::process::id()))
}

fn ar(shape: &[i64], kind: Kind) -> Tensor {
    let n: i64 = shape.iter().product();
    Tensor::arange(n, (Kind::Int64, CPU))
        .to_kind(kind)
        .reshape(shape)
}

/// A nested tensordict with several dtypes, an empty level, a level with a longer batch size.
fn sample_td(scale: f64) -> TensorDict {
    let deep = TensorDict::new([3, 2])
        .unwrap()
        .with("x", ar(&[3, 2, 2], Kind::Double) * scale)
        .unwrap()
        .with("e", TensorDict::new([3, 2]).unwrap())
        .unwrap();
    TensorDict::new([3])
        .unwrap()
        .with("observation", ar(&[3, 4], Kind::Float) * scale)
        .unwrap()
        .with(("next", "reward"), ar(&[3, 1], Kind::Float) * -scale)
        .unwrap()
        .with(
            ("next", "done"),
            Tensor::from_slice(&[true, false, true]).view([3, 1]),
        )
        .unwrap()
        .with("action", ar(&[3, 2], Kind::Int64))
        .unwrap()
        .with("deep", deep)
        .unwrap()
        .with("empty", TensorDict::new([3]).unwrap())
        .unwrap()
        .with("u8", ar(&[3], Kind::Uint8))
        .unwrap()
        .with("i16", ar(&[3, 1], Kind::Int16))
        .unwrap()
        .with("half", ar(&[3, 2], Kind::Half))
        .unwrap()
}

/// `Err(first difference)` unless identical: keys in order (levels included), batch sizes of
/// every level, dtypes, shapes and values of every leaf.
fn identical(a: &TensorDict, b: &TensorDict) -> Result<(), String> {
    structure_matches(a, b)?;
    for ((k, ea), (_, eb)) in a
        .items(KeysOptions::nested())
        .into_iter()
        .zip(b.items(KeysOptions::nested()))
    {
        if let (Entry::Tensor(x), Entry::Tensor(y)) = (ea, eb) {
            if !x.equal(y) {
                return Err(format!("leaf {k}: values differ"));
            }
        }
    }
    Ok(())
}

/// `Err(first difference)` unless `a` and `b` have the same keys (in order, levels included),
/// the same batch size at every level and the same dtype and shape for every leaf.
fn structure_matches(a: &TensorDict, b: &TensorDict) -> Result<(), String> {
    if a.batch_size() != b.batch_size() {
        return Err(format!(
            "batch size {:?} vs {:?}",
            a.batch_size(),
            b.batch_size()
        ));
    }
    let ka: Vec<String> = a
        .keys(KeysOptions::nested())
        .iter()
        .map(|k| k.to_string())
        .collect();
    let kb: Vec<String> = b
        .keys(KeysOptions::nested())
        .iter()
        .map(|k| k.to_string())
        .collect();
    if ka != kb {
        return Err(format!("keys differ:\n  {ka:?}\n  {kb:?}"));
    }
    for ((k, ea), (_, eb)) in a
        .items(KeysOptions::nested())
        .into_iter()
        .zip(b.items(KeysOptions::nested()))
    {
        match (ea, eb) {
            (Entry::Tensor(x), Entry::Tensor(y)) => {
                if x.kind() != y.kind() || x.size() != y.size() {
                    return Err(format!(
                        "leaf {k}: {:?} {:?} vs {:?} {:?}",
                        x.kind(),
                        x.size(),
                        y.kind(),
                        y.size()
                    ));
                }
            }
            (Entry::Dict(x), Entry::Dict(y)) => {
                if x.batch_size() != y.batch_size() {
                    return Err(format!(
                        "level {k}: batch size {:?} vs {:?}",
                        x.batch_size(),
                        y.batch_size()
                    ));
                }
            }
            _ => return Err(format!("{k}: a leaf in one, a level in the other")),
        }
    }
    Ok(())
}

#[track_caller]
fn assert_identical(a: &TensorDict, b: &TensorDict, ctx: &str) {
    if let Err(e) = identical(a, b) {
        panic!("{ctx}: {e}");
    }
}

/// What loading some bytes gave.
enum Outcome {
    Refused(String),
    Loaded(TensorDict),
}

/// Loads `bytes` from a file and from memory; both must agree. A panic or an error other than
/// `InvalidFile` / `Io` is a failure, reported as `Err`.
fn load_bytes(dir: &TempDir, bytes: &[u8]) -> Result<Outcome, String> {
    let path = dir.join("damaged.safetensors");
    std::fs::write(&path, bytes).unwrap();
    let from_file = catch_unwind(AssertUnwindSafe(|| TensorDict::load(&path)))
        .map_err(|_| "TensorDict::load panicked".to_string())?;
    let from_mem = catch_unwind(AssertUnwindSafe(|| {
        TensorDict::from_safetensors_bytes(bytes)
    }))
    .map_err(|_| "TensorDict::from_safetensors_bytes panicked".to_string())?;
    match (from_file, from_mem) {
        (Ok(a), Ok(b)) => {
            identical(&a, &b).map_err(|e| format!("file and memory loads differ: {e}"))?;
            Ok(Outcome::Loaded(a))
        }
        (
            Err(e @ (Error::InvalidFile { .. } | Error::Io { .. })),
            Err(Error::InvalidFile { .. }),
        ) => {
            let msg = e.to_string();
            if !msg.contains(&path.display().to_string()) {
                return Err(format!("the error does not name the file: {msg}"));
            }
            Ok(Outcome::Refused(msg))
        }
        (a, b) => Err(format!(
            "expected InvalidFile/Io (or a loaded tensordict) from both, got {:?} and {:?}",
            a.map(|_| "Ok"),
            b.map(|_| "Ok")
        )),
    }
}

/// safetensors layout: `[0, 8)` header length (u64 LE), `[8, 8 + n)` JSON header, then data.
fn header_len(bytes: &[u8]) -> usize {
    u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize
}

/// The byte range of the `torchrl.layout` metadata string inside the JSON header.
fn layout_range(bytes: &[u8]) -> (usize, usize) {
    let n = header_len(bytes);
    let header = &bytes[8..8 + n];
    let needle = b"torchrl.layout";
    let at = header
        .windows(needle.len())
        .position(|w| w == needle)
        .expect("the header holds the layout");
    // The value is the JSON string after `"torchrl.layout":"`; it ends at the next unescaped
    // quote.
    let start = at + needle.len() + 3;
    let mut i = start;
    while header[i] != b'"' || header[i - 1] == b'\\' {
        i += 1;
    }
    (8 + start, 8 + i)
}

/// `count` offsets spread over `[lo, hi)` (both ends included when possible).
fn spread(lo: usize, hi: usize, count: usize) -> Vec<usize> {
    if hi <= lo {
        return Vec::new();
    }
    let span = hi - lo;
    let mut v: Vec<usize> = (0..count)
        .map(|i| lo + i * (span - 1) / (count.max(2) - 1))
        .collect();
    v.dedup();
    v
}

/// 50 offsets: the whole length prefix, the JSON header (tensor entries and the layout
/// metadata) and the data.
fn sample_offsets(bytes: &[u8]) -> Vec<usize> {
    let n = header_len(bytes);
    let (ls, le) = layout_range(bytes);
    let mut v: Vec<usize> = (0..8).collect();
    v.extend(spread(8, ls, 10)); // JSON header outside the layout
    v.extend(spread(ls, le, 12)); // the layout metadata
    v.extend(spread(le, 8 + n, 4)); // the header after the layout
    v.extend(spread(8 + n, bytes.len(), 16)); // tensor data
    v.sort_unstable();
    v.dedup();
    v
}

/// A tiny deterministic PRNG (xorshift64*) for random files.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| (self.next() >> 24) as u8).collect()
    }
}

// ------------------------------------------------------------------ atomic save

#[test]
fn save_round_trip_is_exact() {
    let dir = TempDir::new("round-trip");
    let path = dir.join("td.safetensors");
    let td = sample_td(1.0);
    td.save(&path).unwrap();
    assert_identical(&td, &TensorDict::load(&path).unwrap(), "round trip");
    assert_eq!(dir.listing(), ["td.safetensors"], "no temporary file left");
}

#[test]
fn a_save_into_a_read_only_folder_leaves_the_previous_file_intact() {
    let dir = TempDir::new("read-only");
    let path = dir.join("td.safetensors");
    let old = sample_td(1.0);
    old.save(&path).unwrap();
    let before = std::fs::read(&path).unwrap();
    set_writable(&dir.0, false);
    // Permissions do not bind a privileged user: then this case cannot be simulated this way
    // (the temp-file case above covers the same path).
    let probe = dir.join("probe");
    let enforced = std::fs::write(&probe, b"x").is_err();
    let _ = std::fs::remove_file(&probe);
    if enforced {
        match sample_td(2.0).save(&path) {
            Err(Error::Io { path: p, .. }) => assert!(p.contains("td.safetensors"), "{p}"),
            other => panic!("expected Io, got {other:?}"),
        }
        assert_eq!(std::fs::read(&path).unwrap(), before);
        assert_identical(&old, &TensorDict::load(&path).unwrap(), "previous file");
    } else {
        eprintln!("read-only folders are writable for this user; case skipped");
    }
    set_writable(&dir.0, true);
    assert_eq!(dir.listing(), ["td.safetensors"]);
}

#[test]
fn failed_saves_leave_no_partial_files() {
    let dir = TempDir::new("failures");
    let path = dir.join("td.safetensors");
    let old = sample_td(1.0);
    old.save(&path).unwrap();

    // A leaf whose dtype cannot be saved: refused before anything is written.
    let complex = TensorDict::new([2])
        .unwrap()
        .with("ok", ar(&[2], Kind::Float))
        .unwrap()
        .with("z", Tensor::zeros([2], (Kind::ComplexFloat, CPU)))
        .unwrap();
    match complex.save(&path) {
        Err(Error::InvalidValue { key, .. }) => assert!(key.contains("z"), "{key}"),
        other => panic!("expected InvalidValue, got {other:?}"),
    }
    assert_identical(
        &old,
        &TensorDict::load(&path).unwrap(),
        "after a refused dtype",
    );

    // The target is a folder: the rename fails; the temporary file is removed.
    let folder = dir.join("a-folder");
    std::fs::create_dir(&folder).unwrap();
    std::fs::write(folder.join("inside"), b"keep").unwrap();
    match old.save(&folder) {
        Err(Error::Io { .. }) => {}
        other => panic!("expected Io, got {other:?}"),
    }
    assert_eq!(std::fs::read(folder.join("inside")).unwrap(), b"keep");

    // The folder does not exist.
    match old.save(dir.join("missing").join("td.safetensors")) {
        Err(Error::Io { .. }) => {}
        other => panic!("expected Io, got {other:?}"),
    }

    assert_eq!(dir.listing(), ["a-folder", "td.safetensors"]);
    assert_identical(&old, &TensorDict::load(&path).unwrap(), "previous file");
}

/// An interrupted save (the process died while writing its temporary file) leaves a partial
/// temporary file behind: the target still loads, and the next save and load work.
#[test]
fn leftover_temp_files_do_not_break_the_next_save_or_load() {
    let dir = TempDir::new("leftovers");
    let path = dir.join("td.safetensors");
    let old = sample_td(1.0);
    let new = sample_td(3.0);
    old.save(&path).unwrap();
    let new_bytes = new.to_safetensors_bytes().unwrap();

    // Leftovers: this process's temp name holding half of the new file, another process's
    // temp name holding random bytes.
    let mine = temp_path_of(&path);
    std::fs::write(&mine, &new_bytes[..new_bytes.len() / 2]).unwrap();
    let theirs = dir.join(".td.safetensors.tmp-4000000");
    let junk = Rng(7).bytes(333);
    std::fs::write(&theirs, &junk).unwrap();

    assert_identical(
        &old,
        &TensorDict::load(&path).unwrap(),
        "target before the save",
    );
    assert!(matches!(
        TensorDict::load(&mine),
        Err(Error::InvalidFile { .. })
    ));
    new.save(&path).unwrap();
    assert_identical(
        &new,
        &TensorDict::load(&path).unwrap(),
        "target after the save",
    );
    // Leftovers are not touched (save writes to a fresh, unique temporary file).
    assert_eq!(
        std::fs::read(&mine).unwrap(),
        &new_bytes[..new_bytes.len() / 2]
    );
    assert_eq!(std::fs::read(&theirs).unwrap(), junk);
    // A leftover larger than the new file does not leave trailing bytes behind.
    std::fs::write(&mine, vec![0xAB; new_bytes.len() * 3]).unwrap();
    old.save(&path).unwrap();
    assert_identical(
        &old,
        &TensorDict::load(&path).unwrap(),
        "after a larger leftover",
    );
    assert_eq!(
        std::fs::read(&path).unwrap(),
        old.to_safetensors_bytes().unwrap(),
        "the file is exactly the serialised tensordict"
    );
}

/// Threads of one process saving to the same path: every save that returns `Ok` left a
/// complete file, and the file is always one complete version.
///
/// (Regression: temporary files were once named per process, so two threads saving to one path
/// shared and truncated one temporary file.)
#[test]
fn concurrent_saves_to_one_path_never_corrupt_it() {
    let dir = TempDir::new("concurrent");
    let path = dir.join("td.safetensors");
    // Versions of very different sizes, so that mixed bytes never parse.
    let versions: Vec<TensorDict> = (0..4)
        .map(|i| {
            TensorDict::new([])
                .unwrap()
                .with(
                    "v",
                    Tensor::full([1 + 40_000 * i], i as f64, (Kind::Float, CPU)),
                )
                .unwrap()
        })
        .collect();
    versions[0].save(&path).unwrap();
    let bytes: Vec<Vec<u8>> = versions
        .iter()
        .map(|v| v.to_safetensors_bytes().unwrap())
        .collect();
    let failures = std::sync::Mutex::new(Vec::<String>::new());
    std::thread::scope(|s| {
        for (i, b) in bytes.iter().enumerate() {
            let bytes = &bytes;
            let path = &path;
            let failures = &failures;
            let td = TensorDict::from_safetensors_bytes(b).unwrap();
            s.spawn(move || {
                for round in 0..60 {
                    if let Err(e) = td.save(path) {
                        failures
                            .lock()
                            .unwrap()
                            .push(format!("thread {i} round {round}: save failed: {e}"));
                    }
                    let now = std::fs::read(path).unwrap();
                    if !bytes.contains(&now) {
                        failures.lock().unwrap().push(format!(
                            "thread {i} round {round}: the file is not a complete version ({} bytes)",
                            now.len()
                        ));
                    }
                }
            });
        }
    });
    let failures = failures.into_inner().unwrap();
    assert!(
        failures.is_empty(),
        "{} failures, e.g. {:?}",
        failures.len(),
        &failures[..failures.len().min(5)]
    );
}

// ------------------------------------------------------------------ validated load

#[test]
fn truncated_files_are_refused_at_every_sampled_offset() {
    let dir = TempDir::new("truncated");
    let path = dir.join("td.safetensors");
    sample_td(1.0).save(&path).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let offsets = sample_offsets(&bytes);
    assert!(offsets.len() >= 45, "{} offsets", offsets.len());
    let mut failures = Vec::new();
    for &cut in offsets.iter().chain(&[bytes.len() - 1]) {
        match load_bytes(&dir, &bytes[..cut]) {
            Ok(Outcome::Refused(_)) => {}
            Ok(Outcome::Loaded(td)) => {
                failures.push(format!("truncated to {cut}: loaded {} keys", td.len()))
            }
            Err(e) => failures.push(format!("truncated to {cut}: {e}")),
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// `Err(first difference)` unless `b` holds every leaf of `a` with its dtype and shape, in the
/// same order, and the same root batch size (keys may differ: a flipped letter of a key name
/// leaves a valid file that no format without checksums can tell from the original).
fn leaves_match(a: &TensorDict, b: &TensorDict) -> Result<(), String> {
    if a.batch_size() != b.batch_size() {
        return Err(format!(
            "batch size {:?} vs {:?}",
            a.batch_size(),
            b.batch_size()
        ));
    }
    let (la, lb) = (a.leaves(), b.leaves());
    if la.len() != lb.len() {
        return Err(format!("{} leaves vs {}", la.len(), lb.len()));
    }
    for ((ka, x), (kb, y)) in la.iter().zip(&lb) {
        if x.kind() != y.kind() || x.size() != y.size() {
            return Err(format!(
                "leaf {ka}: {:?} {:?} vs leaf {kb}: {:?} {:?}",
                x.kind(),
                x.size(),
                y.kind(),
                y.size()
            ));
        }
    }
    Ok(())
}

#[test]
fn flipped_bytes_are_refused_or_load_completely() {
    let dir = TempDir::new("flipped");
    let original = sample_td(1.0);
    let bytes = original.to_safetensors_bytes().unwrap();
    let data_start = 8 + header_len(&bytes);
    let offsets = sample_offsets(&bytes);
    assert!(offsets.len() >= 45, "{} offsets", offsets.len());
    let mut failures = Vec::new();
    let mut tally: HashMap<&str, usize> = HashMap::new();
    // 0xFF makes any header byte non-ASCII (invalid UTF-8); 0x01 and 0x20 keep ASCII text
    // ASCII (digits, letters, case), the hard case for a parser.
    for mask in [0xFFu8, 0x01, 0x20] {
        for &at in &offsets {
            let mut damaged = bytes.clone();
            damaged[at] ^= mask;
            let ctx = format!("byte {at} ^ {mask:#04x}");
            let outcome = match load_bytes(&dir, &damaged) {
                Ok(o) => o,
                Err(e) => {
                    failures.push(format!("{ctx}: {e}"));
                    continue;
                }
            };
            match (outcome, at >= data_start) {
                (Outcome::Refused(msg), true) => failures.push(format!(
                    "{ctx}: a flip inside tensor data (a valid file) was refused: {msg}"
                )),
                (Outcome::Refused(_), false) => *tally.entry("header: refused").or_default() += 1,
                (Outcome::Loaded(td), true) => {
                    // The same keys (in order), batch sizes, shapes and dtypes; one leaf (the
                    // one holding the byte) differs at most.
                    if let Err(e) = structure_matches(&original, &td) {
                        failures.push(format!("{ctx}: loaded an altered tensordict: {e}"));
                        continue;
                    }
                    let differing = original
                        .leaves()
                        .iter()
                        .filter(|(k, t)| !t.equal(td.get(k).unwrap()))
                        .count();
                    if differing > 1 {
                        failures.push(format!("{ctx}: {differing} leaves changed"));
                    }
                    *tally.entry("data: loaded").or_default() += 1;
                }
                (Outcome::Loaded(td), false) => {
                    // A header flip that still parses must not lose or reshape anything.
                    if let Err(e) = leaves_match(&original, &td) {
                        failures.push(format!("{ctx}: loaded an incomplete tensordict: {e}"));
                    }
                    *tally.entry("header: loaded").or_default() += 1;
                }
            }
        }
    }
    eprintln!("flips: {tally:?}");
    assert!(failures.is_empty(), "{failures:#?}");
    assert!(tally.get("data: loaded").copied().unwrap_or(0) >= 3 * 16 - 3);
}

#[test]
fn corrupted_header_length_is_refused() {
    let dir = TempDir::new("header-length");
    let bytes = sample_td(1.0).to_safetensors_bytes().unwrap();
    let n = header_len(&bytes) as u64;
    let len = bytes.len() as u64;
    let mut failures = Vec::new();
    for value in [
        0,
        1,
        2,
        n - 1,
        n + 1,
        n + 8,
        len - 8,
        len - 7,
        len,
        1 << 32,
        100_000_001,
        u64::MAX / 2,
        u64::MAX - 7,
        u64::MAX,
    ] {
        let mut damaged = bytes.clone();
        damaged[..8].copy_from_slice(&value.to_le_bytes());
        match load_bytes(&dir, &damaged) {
            Ok(Outcome::Refused(_)) => {}
            Ok(Outcome::Loaded(_)) => failures.push(format!("length {value}: loaded")),
            Err(e) => failures.push(format!("length {value}: {e}")),
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn empty_random_and_missing_files_are_refused() {
    let dir = TempDir::new("random");
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut cases: Vec<(String, Vec<u8>)> = vec![
        ("empty".into(), Vec::new()),
        ("one byte".into(), vec![0]),
        ("seven bytes".into(), vec![0xFF; 7]),
        ("length only".into(), 0u64.to_le_bytes().to_vec()),
        (
            "length 2, `{}`".into(),
            [&2u64.to_le_bytes()[..], b"{}"].concat(),
        ),
        (
            "no tensors, no metadata, padded".into(),
            [&8u64.to_le_bytes()[..], b"{}      "].concat(),
        ),
        (
            "a JSON array header".into(),
            [&2u64.to_le_bytes()[..], b"[]"].concat(),
        ),
    ];
    for size in [8, 9, 64, 100, 1000, 4096] {
        cases.push((format!("{size} random bytes"), rng.bytes(size)));
    }
    for size in [16, 200, 3000] {
        // A plausible length prefix followed by random bytes.
        let mut b = ((size - 8) as u64).to_le_bytes().to_vec();
        b.extend(rng.bytes(size - 8));
        cases.push((format!("{size} random bytes after a valid length"), b));
        // A plausible length prefix, `{"` then random bytes.
        let mut b = ((size - 8) as u64).to_le_bytes().to_vec();
        b.extend(b"{\"");
        b.extend(rng.bytes(size - 10));
        cases.push((format!("{size} bytes of random JSON-ish header"), b));
    }
    let mut failures = Vec::new();
    for (what, b) in &cases {
        match load_bytes(&dir, b) {
            Ok(Outcome::Refused(_)) => {}
            Ok(Outcome::Loaded(_)) => failures.push(format!("{what}: loaded")),
            Err(e) => failures.push(format!("{what}: {e}")),
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");

    // Not a readable file: Io errors naming the path.
    for p in [dir.join("does-not-exist"), dir.0.clone()] {
        match TensorDict::load(&p) {
            Err(Error::Io { path, .. }) => assert_eq!(path, p.display().to_string()),
            other => panic!("{}: expected Io, got {other:?}", p.display()),
        }
    }
}

#[test]
fn foreign_safetensors_files_are_refused() {
    let dir = TempDir::new("foreign");
    let path = dir.join("foreign.safetensors");
    Tensor::write_safetensors(
        &[
            ("observation", ar(&[3, 4], Kind::Float)),
            ("t0", ar(&[3], Kind::Int64)),
        ],
        &path,
    )
    .unwrap();
    match TensorDict::load(&path) {
        Err(Error::InvalidFile { reason, .. }) => {
            assert!(reason.contains("torchrl.layout"), "{reason}")
        }
        other => panic!("expected InvalidFile, got {other:?}"),
    }
    // No tensors at all.
    let empty: [(&str, Tensor); 0] = [];
    Tensor::write_safetensors(&empty, &path).unwrap();
    assert!(matches!(
        TensorDict::load(&path),
        Err(Error::InvalidFile { .. })
    ));
    // Foreign metadata (a PyTorch-style file) without the layout.
    let mut bytes = sample_td(1.0).to_safetensors_bytes().unwrap();
    bytes = rewrite_header(&bytes, |h| {
        h["__metadata__"] = serde_json::json!({"format": "pt"});
    });
    let out = load_bytes(&dir, &bytes).unwrap();
    assert!(
        matches!(out, Outcome::Refused(_)),
        "foreign metadata loaded"
    );
}

// ------------------------------------------------------------------ inconsistent layouts

/// Re-serialises the file with its JSON header rewritten by `edit` (the data is unchanged).
fn rewrite_header(bytes: &[u8], edit: impl FnOnce(&mut Value)) -> Vec<u8> {
    let n = header_len(bytes);
    let mut header: Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    edit(&mut header);
    let text = serde_json::to_vec(&header).unwrap();
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend(text);
    out.extend_from_slice(&bytes[8 + n..]);
    out
}

/// Re-serialises the file with its layout metadata rewritten by `edit`.
fn rewrite_layout(bytes: &[u8], edit: impl FnOnce(&mut Value)) -> Vec<u8> {
    rewrite_header(bytes, |h| {
        let s = h["__metadata__"]["torchrl.layout"].as_str().unwrap();
        let mut layout: Value = serde_json::from_str(s).unwrap();
        edit(&mut layout);
        h["__metadata__"]["torchrl.layout"] = Value::String(layout.to_string());
    })
}

/// The index of the leaf (in the layout's `leaves` list) with this key.
fn leaf_index(layout: &Value, key: &[&str]) -> usize {
    layout["leaves"]
        .as_array()
        .unwrap()
        .iter()
        .position(|l| l["key"] == serde_json::json!(key))
        .unwrap()
}

type Edit = Box<dyn Fn(&mut Value)>;

fn layout_cases() -> Vec<(&'static str, Edit)> {
    vec![
        (
            "unknown format",
            Box::new(|l| l["format"] = "torchrl.TensorDict/99".into()),
        ),
        (
            "format missing",
            Box::new(|l| drop(l.as_object_mut().unwrap().remove("format"))),
        ),
        (
            "batch size not a list",
            Box::new(|l| l["batch_size"] = 3.into()),
        ),
        (
            "negative batch size",
            Box::new(|l| l["batch_size"] = serde_json::json!([-3])),
        ),
        (
            "fractional batch size",
            Box::new(|l| l["batch_size"] = serde_json::json!([1.5])),
        ),
        (
            "batch size beyond i64",
            Box::new(|l| l["batch_size"] = serde_json::json!([u64::MAX])),
        ),
        (
            "root batch size contradicts the leaves",
            Box::new(|l| l["batch_size"] = serde_json::json!([4])),
        ),
        (
            "root batch size longer than a leaf's shape",
            Box::new(|l| l["batch_size"] = serde_json::json!([3, 1, 1, 1])),
        ),
        (
            "leaves missing",
            Box::new(|l| drop(l.as_object_mut().unwrap().remove("leaves"))),
        ),
        (
            "leaves not a list",
            Box::new(|l| l["leaves"] = serde_json::json!({})),
        ),
        (
            "a leaf dropped from the list",
            Box::new(|l| drop(l["leaves"].as_array_mut().unwrap().pop())),
        ),
        (
            "a leaf listed twice",
            Box::new(|l| {
                let first = l["leaves"][0].clone();
                l["leaves"].as_array_mut().unwrap().push(first);
            }),
        ),
        (
            "a leaf naming a missing tensor",
            Box::new(|l| l["leaves"][0]["name"] = "t999".into()),
        ),
        (
            "a leaf without a name",
            Box::new(|l| drop(l["leaves"][0].as_object_mut().unwrap().remove("name"))),
        ),
        (
            "a leaf name that is not a string",
            Box::new(|l| l["leaves"][0]["name"] = 0.into()),
        ),
        (
            "an empty leaf key",
            Box::new(|l| l["leaves"][0]["key"] = serde_json::json!([])),
        ),
        (
            "a leaf key that is a string",
            Box::new(|l| l["leaves"][0]["key"] = "observation".into()),
        ),
        (
            "a leaf key with a number",
            Box::new(|l| l["leaves"][0]["key"] = serde_json::json!(["a", 1])),
        ),
        (
            "two leaves with one key",
            Box::new(|l| {
                let k = l["leaves"][0]["key"].clone();
                l["leaves"][1]["key"] = k;
            }),
        ),
        (
            "a leaf under a leaf",
            Box::new(|l| {
                let i = leaf_index(l, &["action"]);
                l["leaves"][i]["key"] = serde_json::json!(["observation", "action"]);
            }),
        ),
        (
            "a leaf where a level is",
            Box::new(|l| {
                let i = leaf_index(l, &["action"]);
                l["leaves"][i]["key"] = serde_json::json!(["next"]);
            }),
        ),
        (
            "a level where a leaf is",
            Box::new(|l| {
                l["levels"]
                    .as_array_mut()
                    .unwrap()
                    .push(serde_json::json!({"key": ["action"], "batch_size": [3], "pos": 100}));
            }),
        ),
        (
            "a level whose batch size contradicts its parent",
            Box::new(|l| {
                let levels = l["levels"].as_array_mut().unwrap();
                let next = levels
                    .iter_mut()
                    .find(|v| v["key"] == serde_json::json!(["next"]))
                    .unwrap();
                next["batch_size"] = serde_json::json!([4]);
            }),
        ),
        (
            "a level whose batch size contradicts its leaves",
            Box::new(|l| {
                let levels = l["levels"].as_array_mut().unwrap();
                let deep = levels
                    .iter_mut()
                    .find(|v| v["key"] == serde_json::json!(["deep"]))
                    .unwrap();
                deep["batch_size"] = serde_json::json!([3, 5]);
            }),
        ),
        (
            "a level with a negative batch size",
            Box::new(|l| l["levels"][0]["batch_size"] = serde_json::json!([-1])),
        ),
        (
            "a level without a key",
            Box::new(|l| drop(l["levels"][0].as_object_mut().unwrap().remove("key"))),
        ),
        (
            "a level with an empty key",
            Box::new(|l| l["levels"][0]["key"] = serde_json::json!([])),
        ),
        (
            "levels not objects",
            Box::new(|l| l["levels"] = serde_json::json!([1, 2, 3])),
        ),
        (
            "the layout is a list",
            Box::new(|l| *l = serde_json::json!([1, 2])),
        ),
        ("the layout is a string", Box::new(|l| *l = "layout".into())),
    ]
}

#[test]
fn inconsistent_layouts_are_refused() {
    let dir = TempDir::new("layouts");
    let bytes = sample_td(1.0).to_safetensors_bytes().unwrap();
    // The rewriting itself keeps a valid file valid.
    let same = rewrite_layout(&bytes, |_| {});
    assert!(matches!(load_bytes(&dir, &same), Ok(Outcome::Loaded(_))));
    let mut failures = Vec::new();
    for (what, edit) in layout_cases() {
        let damaged = rewrite_layout(&bytes, |l| edit(l));
        match load_bytes(&dir, &damaged) {
            Ok(Outcome::Refused(_)) => {}
            Ok(Outcome::Loaded(td)) => failures.push(format!("{what}: loaded\n{td}")),
            Err(e) => failures.push(format!("{what}: {e}")),
        }
    }
    // Broken metadata around the layout.
    let header_cases: Vec<(&str, Edit)> = vec![
        (
            "layout not JSON",
            Box::new(|h| h["__metadata__"]["torchrl.layout"] = "{not json".into()),
        ),
        (
            "layout missing",
            Box::new(|h| h["__metadata__"] = serde_json::json!({})),
        ),
        (
            "metadata missing",
            Box::new(|h| drop(h.as_object_mut().unwrap().remove("__metadata__"))),
        ),
        (
            "a tensor shape that contradicts the batch size (same byte count)",
            Box::new(|h| {
                let t = h
                    .as_object_mut()
                    .unwrap()
                    .values_mut()
                    .find(|v| v["shape"] == serde_json::json!([3, 4]))
                    .unwrap();
                t["shape"] = serde_json::json!([4, 3]);
            }),
        ),
        (
            "an extra tensor the layout does not list",
            Box::new(|h| {
                let t0 = h["t0"].clone();
                h["zz_extra"] = t0;
            }),
        ),
    ];
    for (what, edit) in header_cases {
        let damaged = rewrite_header(&bytes, |h| edit(h));
        match load_bytes(&dir, &damaged) {
            Ok(Outcome::Refused(_)) => {}
            Ok(Outcome::Loaded(td)) => failures.push(format!("{what}: loaded\n{td}")),
            Err(e) => failures.push(format!("{what}: {e}")),
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Two leaves naming the same tensor while another tensor is named by none: the file holds as
/// many tensors as the layout lists leaves, so the count check passes.
///
/// Regression (fixed): `TensorDict::from_safetensors_bytes` (src/tensordict/io.rs) checks that the layout
/// lists as many leaves as the file holds tensors, but not that each tensor is named exactly
/// once. Here leaf 1 (`("next", "reward")`, `[3, 1]`) names leaf 0's tensor `t0`: the load
/// succeeds with `("next", "reward")` holding the observation (`[3, 4]`) and tensor `t1` (the
/// real reward) silently dropped: a partial, wrong object instead of `InvalidFile`.
#[test]
fn a_layout_naming_one_tensor_twice_is_refused() {
    let dir = TempDir::new("name-twice");
    let bytes = sample_td(1.0).to_safetensors_bytes().unwrap();
    let damaged = rewrite_layout(&bytes, |l| {
        let name = l["leaves"][0]["name"].clone();
        l["leaves"][1]["name"] = name;
    });
    match load_bytes(&dir, &damaged) {
        Ok(Outcome::Refused(_)) => {}
        Ok(Outcome::Loaded(td)) => {
            panic!("loaded a tensordict with one tensor twice and one dropped:\n{td}")
        }
        Err(e) => panic!("{e}"),
    }
}

/// A nested key whose parent level the layout does not declare (every file `save` writes
/// declares every level, with its batch size).
///
/// Regression (fixed): `TensorDict::from_safetensors_bytes` (src/tensordict/io.rs) creates the missing parent
/// levels implicitly (through `TensorDict::set` on the nested key) instead of refusing the
/// file, so a layout that does not describe the tree it builds loads: renaming the level
/// `("deep", "e")` to `("other", "e")` (as one flipped byte can) loads with a level `"other"`
/// that the file never declared.
#[test]
fn a_layout_with_undeclared_parent_levels_is_refused() {
    let dir = TempDir::new("undeclared-parent");
    let bytes = sample_td(1.0).to_safetensors_bytes().unwrap();
    let cases: Vec<(&str, Edit)> = vec![
        (
            "a level under an undeclared level",
            Box::new(|l| {
                let levels = l["levels"].as_array_mut().unwrap();
                let e = levels
                    .iter_mut()
                    .find(|v| v["key"] == serde_json::json!(["deep", "e"]))
                    .unwrap();
                e["key"] = serde_json::json!(["other", "e"]);
            }),
        ),
        (
            "a leaf under an undeclared level",
            Box::new(|l| {
                let i = leaf_index(l, &["action"]);
                l["leaves"][i]["key"] = serde_json::json!(["other", "action"]);
            }),
        ),
    ];
    let mut failures = Vec::new();
    for (what, edit) in cases {
        let damaged = rewrite_layout(&bytes, |l| edit(l));
        match load_bytes(&dir, &damaged) {
            Ok(Outcome::Refused(_)) => {}
            Ok(Outcome::Loaded(td)) => failures.push(format!("{what}: loaded\n{td}")),
            Err(e) => failures.push(format!("{what}: {e}")),
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
