//! Property-based campaign on `TensorDict` (the reliability issue: no panic on any input, every
//! failure a `torchrl::Error` naming what is involved, invariants after every operation).
//!
//! A case is a random batch size and a random sequence of operations (sets at nested keys of
//! depth 1–3 with random shapes and dtypes, in-place sets, lookups, indexing with every kind of
//! index, stack/cat of compatible and broken copies, unbind/split, renames, select/exclude,
//! apply/apply2, every shape op with valid and invalid arguments, dtype casts, save/load,
//! update, set_at). Every operation runs under `catch_unwind`; after each one:
//!
//! - no panic;
//! - an `Err` has a non-empty message, and for key operations it names the key;
//! - the tensordict's invariants hold (every level's batch size is a prefix of its leaves'
//!   shapes and extends its parent's);
//! - a mutation that errors (`set`, `set_`, `update`, `rename_key`, `set_at`, `pop`,
//!   `set_batch_size`) leaves the tensordict unchanged (structure and values);
//! - shape operations keep every leaf's feature dims;
//! - `stack(unbind(x, d), d) == x`, and save-then-load gives an equal tensordict (values, key
//!   order, batch sizes at every level, dtypes).
//!
//! CI runs `PROPTEST_CASES` cases per property (default below). Long campaign:
//! `PROPTEST_CASES=20000 cargo test --release --test prop_tensordict --test prop_specs --test prop_envs`.
//! Every input is generated; the bugs the campaign found are fixed and pinned by the
//! regression tests at the end of this file.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError};
use tch::{Device, Kind, Tensor};
use torchrl::tensordict::{IfExists, KeysOptions, Strict};
use torchrl::{cat, stack, BatchIndex, Entry, Error, NestedKey, TensorDict};

const CPU: Device = Device::Cpu;

/// Cases per property when `PROPTEST_CASES` is not set (keeps CI bounded in debug builds).
const DEFAULT_CASES: u32 = 1024;

fn config() -> Config {
    let mut c = Config {
        failure_persistence: None,
        ..Config::default()
    };
    if std::env::var("PROPTEST_CASES").is_err() {
        c.cases = DEFAULT_CASES;
    }
    c
}

// ------------------------------------------------------------------ generated arguments

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum K {
    Float,
    Double,
    Int64,
    Int,
    Bool,
    Uint8,
}

impl K {
    fn kind(self) -> Kind {
        match self {
            K::Float => Kind::Float,
            K::Double => Kind::Double,
            K::Int64 => Kind::Int64,
            K::Int => Kind::Int,
            K::Bool => Kind::Bool,
            K::Uint8 => Kind::Uint8,
        }
    }
}

fn kind_s() -> impl Strategy<Value = K> {
    prop_oneof![
        Just(K::Float),
        Just(K::Double),
        Just(K::Int64),
        Just(K::Int),
        Just(K::Bool),
        Just(K::Uint8),
    ]
}

/// A key of depth 1–3 over a small alphabet (so that keys collide with existing ones).
fn key_s() -> impl Strategy<Value = Vec<String>> {
    prop_oneof![
        30 => prop::collection::vec(
            prop_oneof![
                10 => prop_oneof![Just("a"), Just("b"), Just("next"), Just("obs")],
                1 => prop_oneof![Just(""), Just("x.y"), Just("é")],
            ]
            .prop_map(String::from),
            1..=3,
        ),
        // An empty key (no segment): every operation must refuse it with an error.
        1 => Just(vec![]),
    ]
}

fn dims_s(max_len: usize) -> impl Strategy<Value = Vec<i64>> {
    prop::collection::vec(0i64..4, 0..=max_len)
}

/// A value's shape: `Fit(extra)` is the receiving level's batch size followed by `extra`;
/// `Raw` is any shape (usually not starting with the batch size).
#[derive(Clone, Debug)]
enum ShapeArg {
    Fit(Vec<i64>),
    /// Like `Fit`, but the value is a stride-0 expanded view (writes into it are refused by
    /// libtorch when they would hit one memory location twice).
    FitExpanded(Vec<i64>),
    Raw(Vec<i64>),
}

fn shape_arg_s() -> impl Strategy<Value = ShapeArg> {
    prop_oneof![
        6 => dims_s(2).prop_map(ShapeArg::Fit),
        1 => dims_s(2).prop_map(ShapeArg::FitExpanded),
        1 => dims_s(4).prop_map(ShapeArg::Raw),
    ]
}

#[derive(Clone, Debug)]
enum IdxArg {
    Int(i64),
    Slice(Option<i64>, Option<i64>, i64),
    Ellipsis,
    NewAxis,
    /// A bool mask over the next `dims` batch dims, with the right shape.
    MaskFit {
        dims: usize,
        seed: u64,
    },
    /// A mask of an arbitrary shape and dtype.
    MaskRaw {
        shape: Vec<i64>,
        kind: K,
    },
    /// An index tensor (values possibly out of range), of the given dtype, 1-d or 2-d.
    IndexT {
        values: Vec<i64>,
        two_d: bool,
        kind: K,
    },
}

fn idx_s() -> impl Strategy<Value = IdxArg> {
    prop_oneof![
        4 => (-5i64..5).prop_map(IdxArg::Int),
        3 => (
            prop::option::of(-5i64..6),
            prop::option::of(-5i64..6),
            prop_oneof![4 => 1i64..4, 1 => -1i64..1, 1 => Just(i64::MAX)]
        )
            .prop_map(|(a, b, s)| IdxArg::Slice(a, b, s)),
        1 => Just(IdxArg::Ellipsis),
        1 => Just(IdxArg::NewAxis),
        2 => (0usize..3, any::<u64>()).prop_map(|(dims, seed)| IdxArg::MaskFit { dims, seed }),
        1 => (dims_s(3), kind_s()).prop_map(|(shape, kind)| IdxArg::MaskRaw { shape, kind }),
        2 => (prop::collection::vec(-5i64..5, 0..5), any::<bool>(), prop_oneof![
            4 => Just(K::Int64), 1 => Just(K::Int), 1 => Just(K::Uint8), 1 => Just(K::Float), 1 => Just(K::Bool)
        ])
            .prop_map(|(values, two_d, kind)| IdxArg::IndexT { values, two_d, kind }),
    ]
}

fn index_s() -> impl Strategy<Value = Vec<IdxArg>> {
    prop::collection::vec(idx_s(), 0..4)
}

/// How the tensordicts given to stack/cat are made to differ from the first one.
#[derive(Clone, Debug)]
enum Break {
    None,
    /// One copy gets an extra leaf.
    ExtraKey(Vec<String>),
    /// One copy loses its first leaf.
    MissingKey,
    /// One copy's first leaf gets a different feature shape.
    LeafShape,
    /// One copy's first leaf gets another dtype.
    LeafKind(K),
    /// One copy gets another batch size.
    BatchSize,
    /// One copy's first leaf becomes a nested level.
    LeafToLevel,
}

fn break_s() -> impl Strategy<Value = Break> {
    prop_oneof![
        3 => Just(Break::None),
        1 => key_s().prop_map(Break::ExtraKey),
        1 => Just(Break::MissingKey),
        1 => Just(Break::LeafShape),
        1 => kind_s().prop_map(Break::LeafKind),
        1 => Just(Break::BatchSize),
        1 => Just(Break::LeafToLevel),
    ]
}

#[derive(Clone, Copy, Debug)]
enum ApplyFn {
    Identity,
    Double,
    /// Drops leaves with an odd number of dims.
    DropOdd,
    /// Returns a tensor that loses the batch dims (`reshape(-1)` plus a dim).
    BadShape,
    /// Returns an error.
    Fail,
}

fn apply_fn_s() -> impl Strategy<Value = ApplyFn> {
    prop_oneof![
        Just(ApplyFn::Identity),
        Just(ApplyFn::Double),
        Just(ApplyFn::DropOdd),
        Just(ApplyFn::BadShape),
        Just(ApplyFn::Fail),
    ]
}

/// The second operand of `apply2` / `update`.
#[derive(Clone, Debug)]
enum Other {
    /// A deep copy of the tensordict, values changed.
    Copy,
    /// A copy without its first leaf.
    MissingLeaf,
    /// A fresh tensordict with these sets applied.
    Fresh(Vec<i64>, Vec<(Vec<String>, ShapeArg, K)>),
}

fn other_s() -> impl Strategy<Value = Other> {
    prop_oneof![
        2 => Just(Other::Copy),
        1 => Just(Other::MissingLeaf),
        2 => (
            dims_s(2),
            prop::collection::vec((key_s(), shape_arg_s(), kind_s()), 0..4)
        )
            .prop_map(|(bs, sets)| Other::Fresh(bs, sets)),
    ]
}

/// The value written by `set_at`.
#[derive(Clone, Debug)]
enum AtValue {
    /// `td[idx] + 1` (right keys and shapes).
    Indexed,
    /// `td[idx]` with one leaf (chosen by the index, modulo the leaf count) cast to another
    /// dtype.
    IndexedKind(K, usize),
    /// `td[idx]` with an extra leaf.
    IndexedExtra(Vec<String>),
    /// An unrelated tensordict.
    Fresh(Vec<i64>, Vec<(Vec<String>, ShapeArg, K)>),
}

fn at_value_s() -> impl Strategy<Value = AtValue> {
    prop_oneof![
        3 => Just(AtValue::Indexed),
        1 => (kind_s(), 0usize..8).prop_map(|(k, i)| AtValue::IndexedKind(k, i)),
        1 => key_s().prop_map(AtValue::IndexedExtra),
        1 => (
            dims_s(2),
            prop::collection::vec((key_s(), shape_arg_s(), kind_s()), 0..3)
        )
            .prop_map(|(bs, sets)| AtValue::Fresh(bs, sets)),
    ]
}

// `FitShapeOp` names the operation that fits a shape, not a nested `Op`.
#[allow(clippy::enum_variant_names)]
#[derive(Clone, Debug)]
enum Op {
    Set {
        key: Vec<String>,
        shape: ShapeArg,
        kind: K,
    },
    /// Sets a nested tensordict whose batch size is the receiving level's plus `extra` (or
    /// `raw`), holding one leaf.
    SetDict {
        key: Vec<String>,
        extra: Vec<i64>,
        raw: Option<Vec<i64>>,
    },
    /// `set_` with the existing leaf's shape (`None`) or another one.
    SetInplace {
        key: Vec<String>,
        shape: Option<Vec<i64>>,
        kind: K,
    },
    Get {
        key: Vec<String>,
    },
    Pop {
        key: Vec<String>,
    },
    Index {
        idx: Vec<IdxArg>,
        keep: bool,
    },
    Stack {
        n: usize,
        dim: i64,
        brk: Break,
        keep: bool,
    },
    Cat {
        n: usize,
        dim: i64,
        brk: Break,
        keep: bool,
    },
    Unbind {
        dim: i64,
    },
    Split {
        sizes: Vec<i64>,
        dim: i64,
    },
    Rename {
        old: Vec<String>,
        new: Vec<String>,
        safe: bool,
    },
    Exclude {
        keys: Vec<Vec<String>>,
    },
    Select {
        keys: Vec<Vec<String>>,
        strict: bool,
    },
    Apply {
        f: ApplyFn,
        keep: bool,
    },
    Apply2 {
        other: Other,
    },
    Expand {
        shape: Vec<i64>,
        keep: bool,
    },
    Reshape {
        shape: Vec<i64>,
        view: bool,
        keep: bool,
    },
    Unsqueeze {
        dim: i64,
        keep: bool,
    },
    Squeeze {
        dim: Option<i64>,
        keep: bool,
    },
    Permute {
        dims: Vec<i64>,
        keep: bool,
    },
    /// Shape ops with arguments derived from the current batch size, so that they usually
    /// succeed: a permutation ordered by `seed`, an expand that prepends `extra` (and widens
    /// size-1 dims), a reshape to a same-numel shape chosen by `seed`.
    FitShapeOp {
        which: u8,
        seed: u64,
        extra: Vec<i64>,
        keep: bool,
    },
    ToKind {
        kind: K,
        keep: bool,
    },
    SaveLoad,
    Update {
        other: Other,
    },
    SetAt {
        idx: Vec<IdxArg>,
        value: AtValue,
    },
    SetBatchSize {
        bs: Vec<i64>,
    },
    New {
        bs: Vec<i64>,
    },
}

fn set_op_s() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (key_s(), shape_arg_s(), kind_s()).prop_map(|(key, shape, kind)| Op::Set { key, shape, kind }),
        1 => (key_s(), dims_s(2), prop::option::weighted(0.2, dims_s(3)))
            .prop_map(|(key, extra, raw)| Op::SetDict { key, extra, raw }),
    ]
}

fn op_s() -> impl Strategy<Value = Op> {
    let small_dim = -4i64..4;
    prop_oneof![
        6 => set_op_s(),
        2 => (key_s(), prop::option::weighted(0.2, dims_s(3)), kind_s())
            .prop_map(|(key, shape, kind)| Op::SetInplace { key, shape, kind }),
        2 => key_s().prop_map(|key| Op::Get { key }),
        1 => key_s().prop_map(|key| Op::Pop { key }),
        4 => (index_s(), any::<bool>()).prop_map(|(idx, keep)| Op::Index { idx, keep }),
        2 => (1usize..4, small_dim.clone(), break_s(), any::<bool>())
            .prop_map(|(n, dim, brk, keep)| Op::Stack { n, dim, brk, keep }),
        2 => (1usize..4, small_dim.clone(), break_s(), any::<bool>())
            .prop_map(|(n, dim, brk, keep)| Op::Cat { n, dim, brk, keep }),
        2 => small_dim.clone().prop_map(|dim| Op::Unbind { dim }),
        1 => (prop::collection::vec(prop_oneof![8 => -1i64..4, 1 => Just(i64::MAX)], 0..4), small_dim.clone())
            .prop_map(|(sizes, dim)| Op::Split { sizes, dim }),
        3 => (key_s(), key_s(), any::<bool>()).prop_map(|(old, new, safe)| Op::Rename { old, new, safe }),
        1 => prop::collection::vec(key_s(), 0..3).prop_map(|keys| Op::Exclude { keys }),
        1 => (prop::collection::vec(key_s(), 0..3), any::<bool>())
            .prop_map(|(keys, strict)| Op::Select { keys, strict }),
        2 => (apply_fn_s(), any::<bool>()).prop_map(|(f, keep)| Op::Apply { f, keep }),
        1 => other_s().prop_map(|other| Op::Apply2 { other }),
        2 => (prop::collection::vec(-2i64..5, 0..5), any::<bool>())
            .prop_map(|(shape, keep)| Op::Expand { shape, keep }),
        2 => (prop::collection::vec(prop_oneof![12 => -2i64..7, 1 => Just(i64::MAX), 1 => Just(1i64 << 40)], 0..4), any::<bool>(), any::<bool>())
            .prop_map(|(shape, view, keep)| Op::Reshape { shape, view, keep }),
        1 => (small_dim.clone(), any::<bool>()).prop_map(|(dim, keep)| Op::Unsqueeze { dim, keep }),
        1 => (prop::option::of(small_dim.clone()), any::<bool>())
            .prop_map(|(dim, keep)| Op::Squeeze { dim, keep }),
        1 => (prop::collection::vec(-3i64..4, 0..4), any::<bool>())
            .prop_map(|(dims, keep)| Op::Permute { dims, keep }),
        3 => (0u8..4, any::<u64>(), dims_s(2), any::<bool>())
            .prop_map(|(which, seed, extra, keep)| Op::FitShapeOp { which, seed, extra, keep }),
        1 => (kind_s(), any::<bool>()).prop_map(|(kind, keep)| Op::ToKind { kind, keep }),
        1 => Just(Op::SaveLoad),
        2 => other_s().prop_map(|other| Op::Update { other }),
        3 => (index_s(), at_value_s()).prop_map(|(idx, value)| Op::SetAt { idx, value }),
        1 => prop::collection::vec(-1i64..4, 0..4).prop_map(|bs| Op::SetBatchSize { bs }),
        1 => prop::collection::vec(-2i64..4, 0..4).prop_map(|bs| Op::New { bs }),
    ]
}

// ------------------------------------------------------------------ building values

/// Deterministic values of `kind` (no NaN, so that `eq` is reflexive).
fn values(shape: &[i64], kind: Kind, seed: i64) -> Tensor {
    let n: i64 = shape.iter().product();
    let t = Tensor::arange(n, (Kind::Int64, CPU));
    let t = (t * 7 + seed).remainder(11);
    let t = if kind == Kind::Bool {
        t.remainder(2)
    } else {
        t
    };
    t.to_kind(kind).reshape(shape)
}

/// The value for a `ShapeArg` resolved to `shape`: an expanded view for `FitExpanded`.
fn value_for(arg: &ShapeArg, shape: &[i64], kind: Kind, seed: i64) -> Tensor {
    match (arg, shape.split_first()) {
        (ShapeArg::FitExpanded(_), Some((_, rest))) => {
            values(&[&[1], rest].concat(), kind, seed).expand(shape, false)
        }
        _ => values(shape, kind, seed),
    }
}

fn segs(key: &[String]) -> Vec<&str> {
    key.iter().map(String::as_str).collect()
}

fn key_display(key: &[String]) -> String {
    NestedKey::from(segs(key)).to_string()
}

/// The batch size of the level that receives `key` (the deepest existing level on its path).
fn receiving_batch(td: &TensorDict, key: &[String]) -> Vec<i64> {
    let mut cur = td;
    for seg in &key[..key.len().saturating_sub(1)] {
        match cur.get_dict(seg.as_str()) {
            Some(d) => cur = d,
            None => break,
        }
    }
    cur.batch_size().to_vec()
}

fn shape_for(td: &TensorDict, key: &[String], shape: &ShapeArg) -> Vec<i64> {
    match shape {
        ShapeArg::Fit(extra) | ShapeArg::FitExpanded(extra) => {
            [receiving_batch(td, key), extra.clone()].concat()
        }
        ShapeArg::Raw(s) => s.clone(),
    }
}

fn fresh_td(bs: &[i64], sets: &[(Vec<String>, ShapeArg, K)]) -> TensorDict {
    let mut td = match TensorDict::new(bs) {
        Ok(td) => td,
        Err(_) => return empty(),
    };
    for (i, (key, shape, kind)) in sets.iter().enumerate() {
        let s = shape_for(&td, key, shape);
        let _ = td.set(&segs(key)[..], value_for(shape, &s, kind.kind(), i as i64));
    }
    td
}

fn empty() -> TensorDict {
    TensorDict::new([0i64; 0]).unwrap_or_else(|_| unreachable!())
}

fn build_index(td_batch: &[i64], idx: &[IdxArg]) -> Vec<BatchIndex> {
    // Masks that "fit" follow the batch dims they would consume.
    let mut src = 0usize;
    let mut out = Vec::with_capacity(idx.len());
    for item in idx {
        out.push(match item {
            IdxArg::Int(i) => {
                src += 1;
                BatchIndex::Int(*i)
            }
            IdxArg::Slice(a, b, s) => {
                src += 1;
                BatchIndex::slice(*a, *b, *s)
            }
            IdxArg::Ellipsis => BatchIndex::Ellipsis,
            IdxArg::NewAxis => BatchIndex::NewAxis,
            IdxArg::MaskFit { dims, seed } => {
                let start = src.min(td_batch.len());
                let end = (src + dims).min(td_batch.len());
                src += dims;
                let shape = &td_batch[start..end];
                let n: i64 = shape.iter().product();
                let bits: Vec<bool> = (0..n)
                    .map(|i| (seed.rotate_left(i as u32 % 64) & 1) == 1)
                    .collect();
                BatchIndex::Mask(Tensor::from_slice(&bits).reshape(shape))
            }
            IdxArg::MaskRaw { shape, kind } => {
                src += shape.len();
                BatchIndex::Mask(values(shape, kind.kind(), 1))
            }
            IdxArg::IndexT {
                values: v,
                two_d,
                kind,
            } => {
                src += 1;
                let t = Tensor::from_slice(v);
                let t = if *two_d && v.len() % 2 == 0 {
                    t.reshape([2, -1])
                } else {
                    t
                };
                let t = if *kind == K::Int64 {
                    t
                } else {
                    // Negative values wrap for Uint8, as a cast does.
                    t.to_kind(kind.kind())
                };
                BatchIndex::tensor(t)
            }
        });
    }
    out
}

// ------------------------------------------------------------------ checks

type Check = Result<(), String>;

/// Every level's batch size is a prefix of its leaves' shapes and extends its parent's; no dim
/// is negative.
fn invariants(td: &TensorDict) -> Check {
    fn rec(td: &TensorDict, path: &str) -> Check {
        let bs = td.batch_size();
        if bs.iter().any(|d| *d < 0) {
            return Err(format!("level {path} has a negative batch dim: {bs:?}"));
        }
        for (k, e) in td.items(KeysOptions::top_level()) {
            let p = format!("{path}/{k}");
            match e {
                Entry::Tensor(t) => {
                    let s = t.size();
                    if s.len() < bs.len() || s[..bs.len()] != *bs {
                        return Err(format!(
                            "leaf {p} of shape {s:?} does not start with its level's batch size {bs:?}"
                        ));
                    }
                }
                Entry::Dict(d) => {
                    let dbs = d.batch_size();
                    if dbs.len() < bs.len() || dbs[..bs.len()] != *bs {
                        return Err(format!(
                            "level {p} has batch size {dbs:?}, which does not extend its parent's {bs:?}"
                        ));
                    }
                    rec(d, &p)?;
                }
            }
        }
        Ok(())
    }
    rec(td, "")
}

/// Structure (keys in order, level batch sizes, leaf shapes and dtypes) plus a deep copy of the
/// values, to compare a tensordict before and after a failed mutation.
struct Snapshot {
    structure: Vec<String>,
    values: Vec<Tensor>,
}

fn structure(td: &TensorDict) -> Vec<String> {
    let mut out = vec![format!("root {:?}", td.batch_size())];
    for (k, e) in td.items(KeysOptions::nested()) {
        out.push(match e {
            Entry::Tensor(t) => format!("{k}: tensor {:?} {:?}", t.size(), t.kind()),
            Entry::Dict(d) => format!("{k}: level {:?}", d.batch_size()),
        });
    }
    out
}

fn snapshot(td: &TensorDict) -> Snapshot {
    Snapshot {
        structure: structure(td),
        values: td.values().iter().map(|t| t.copy()).collect(),
    }
}

fn unchanged(before: &Snapshot, td: &TensorDict, what: &str) -> Check {
    let now = structure(td);
    if now != before.structure {
        return Err(format!(
            "{what} failed but changed the structure:\nbefore {:?}\nafter  {now:?}",
            before.structure
        ));
    }
    for ((k, t), old) in td.leaves().iter().zip(&before.values) {
        if !t.equal(old) {
            return Err(format!("{what} failed but changed the values of {k}"));
        }
    }
    Ok(())
}

/// Same keys in the same order, same batch sizes at every level, same leaf shapes, dtypes and
/// values.
fn same_td(a: &TensorDict, b: &TensorDict, what: &str) -> Check {
    let (sa, sb) = (structure(a), structure(b));
    if sa != sb {
        return Err(format!("{what}: structures differ:\n{sa:?}\n{sb:?}"));
    }
    match a.eq(b).and_then(|e| e.all()) {
        Ok(true) => Ok(()),
        Ok(false) => Err(format!("{what}: values differ")),
        Err(e) => Err(format!("{what}: eq failed: {e}")),
    }
}

/// After a batch-dim operation `old -> new` the leaves (same keys, same order) keep their
/// feature dims (the dims after the root batch dims).
fn features_kept(old: &TensorDict, new: &TensorDict, what: &str) -> Check {
    let (ol, nl) = (old.leaves(), new.leaves());
    let ok: Vec<String> = ol.iter().map(|(k, _)| k.to_string()).collect();
    let nk: Vec<String> = nl.iter().map(|(k, _)| k.to_string()).collect();
    if ok != nk {
        return Err(format!("{what}: leaf keys changed: {ok:?} -> {nk:?}"));
    }
    let (on, nn) = (old.batch_dims(), new.batch_dims());
    for ((k, a), (_, b)) in ol.iter().zip(&nl) {
        let (sa, sb) = (a.size(), b.size());
        if sa[on..] != sb[nn..] {
            return Err(format!(
                "{what}: leaf {k} changed its feature dims: {sa:?} (batch {:?}) -> {sb:?} (batch {:?})",
                old.batch_size(),
                new.batch_size()
            ));
        }
        if a.kind() != b.kind() {
            return Err(format!("{what}: leaf {k} changed dtype"));
        }
    }
    Ok(())
}

/// An error's message is non-empty and, when `keys` is not empty and the error is about a key,
/// names one of them.
fn err_ok(e: &Error, keys: &[String], what: &str) -> Check {
    let msg = e.to_string();
    if msg.trim().is_empty() {
        return Err(format!("{what}: empty error message ({e:?})"));
    }
    if keys.is_empty() {
        return Ok(());
    }
    let keyed = matches!(
        e,
        Error::KeyNotFound { .. }
            | Error::KeyExists { .. }
            | Error::NotALevel { .. }
            | Error::WrongEntryKind { .. }
            | Error::BatchSizeMismatch { .. }
            | Error::ShapeMismatch { .. }
            | Error::DtypeMismatch { .. }
            | Error::Torch(_)
            | Error::InvalidArgument { .. }
    );
    if keyed && !keys.iter().any(|k| msg.contains(k.as_str())) {
        return Err(format!(
            "{what}: the error does not name the key (one of {keys:?}): {msg}"
        ));
    }
    Ok(())
}

fn tmp_path() -> PathBuf {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    std::env::temp_dir().join(format!(
        "torchrl-prop-{}-{}.safetensors",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ))
}

/// `save` then `load` gives an equal tensordict.
fn roundtrip(td: &TensorDict) -> Check {
    let path = tmp_path();
    let res = (|| -> Check {
        td.save(&path).map_err(|e| format!("save failed: {e}"))?;
        let back = TensorDict::load(&path).map_err(|e| format!("load failed: {e}"))?;
        same_td(td, &back, "save/load")
    })();
    let _ = std::fs::remove_file(&path);
    res
}

/// `stack(unbind(x, d), d) == x` for every batch dim `d` with a non-zero size.
fn unbind_stack(td: &TensorDict) -> Check {
    for d in 0..td.batch_dims() as i64 {
        let parts = td
            .unbind(d)
            .map_err(|e| format!("unbind({d}) failed: {e}"))?;
        if parts.len() as i64 != td.batch_size()[d as usize] {
            return Err(format!("unbind({d}) gave {} parts", parts.len()));
        }
        for p in &parts {
            invariants(p)?;
        }
        if parts.is_empty() {
            continue;
        }
        let back = stack(&parts, d).map_err(|e| format!("stack(unbind({d})) failed: {e}"))?;
        same_td(td, &back, &format!("stack(unbind(x, {d}), {d})"))?;
    }
    Ok(())
}

// ------------------------------------------------------------------ running one operation

fn first_leaf(td: &TensorDict) -> Option<NestedKey> {
    td.leaves().first().map(|(k, _)| k.clone())
}

fn make_other(td: &TensorDict, other: &Other) -> TensorDict {
    match other {
        Other::Copy => td
            .apply(|t| Ok(Some(t.copy())))
            .unwrap_or_else(|_| td.clone()),
        Other::MissingLeaf => {
            let mut c = td.clone();
            if let Some(k) = first_leaf(td) {
                let _ = c.remove(&k);
            }
            c
        }
        Other::Fresh(bs, sets) => fresh_td(bs, sets),
    }
}

/// A copy of `td` broken as `brk` says.
fn broken(td: &TensorDict, brk: &Break) -> TensorDict {
    let mut c = td.clone();
    let first = first_leaf(td);
    match brk {
        Break::None => {}
        Break::ExtraKey(key) => {
            let s = shape_for(&c, key, &ShapeArg::Fit(vec![]));
            let _ = c.set(&segs(key)[..], values(&s, Kind::Float, 3));
        }
        Break::MissingKey => {
            if let Some(k) = first {
                let _ = c.remove(&k);
            }
        }
        Break::LeafShape => {
            if let Some(k) = first {
                if let Some(t) = td.get(&k) {
                    let t = t.unsqueeze(-1);
                    let _ = c.set(&k, t);
                }
            }
        }
        Break::LeafKind(kind) => {
            if let Some(k) = first {
                if let Some(t) = td.get(&k) {
                    let _ = c.set(&k, t.to_kind(kind.kind()));
                }
            }
        }
        Break::BatchSize => {
            if let Ok(u) = td.unsqueeze(0) {
                c = u;
            }
        }
        Break::LeafToLevel => {
            if let Some(k) = first {
                let level = c
                    .get_dict(&k.parts().collect::<Vec<_>>()[..k.len() - 1])
                    .map(|l| l.empty());
                let level = level.unwrap_or_else(|| td.empty());
                let _ = c.set(&k, level);
            }
        }
    }
    c
}

/// Runs `op` on `td` and checks the properties; `Err` is a property violation.
fn run(td: &mut TensorDict, op: &Op) -> Check {
    match op {
        Op::Set { key, shape, kind } => {
            let s = shape_for(td, key, shape);
            let v = value_for(shape, &s, kind.kind(), 5);
            let before = snapshot(td);
            match td.set(&segs(key)[..], v) {
                Ok(()) => {
                    let got = td
                        .get(&segs(key)[..])
                        .ok_or_else(|| format!("set {key:?} succeeded but get finds nothing"))?;
                    if got.size() != s || got.kind() != kind.kind() {
                        return Err(format!("set {key:?}: get gives another shape/dtype"));
                    }
                }
                Err(e) => {
                    err_ok(&e, &[key_display(key)], "set")?;
                    unchanged(&before, td, "set")?;
                }
            }
        }
        Op::SetDict { key, extra, raw } => {
            let bs = match raw {
                Some(r) => r.clone(),
                None => [receiving_batch(td, key), extra.clone()].concat(),
            };
            let sub = TensorDict::new(&bs)
                .and_then(|d| d.with("x", values(&[bs.clone(), vec![2]].concat(), Kind::Float, 1)))
                .map_err(|e| format!("building a nested td of batch {bs:?}: {e}"))?;
            let before = snapshot(td);
            if let Err(e) = td.set(&segs(key)[..], sub) {
                err_ok(&e, &[key_display(key)], "set (level)")?;
                unchanged(&before, td, "set (level)")?;
            }
        }
        Op::SetInplace { key, shape, kind } => {
            let s = match (shape, td.get(&segs(key)[..])) {
                (Some(s), _) => s.clone(),
                (None, Some(t)) => t.size(),
                (None, None) => vec![1],
            };
            let v = values(&s, kind.kind(), 9);
            let before = snapshot(td);
            match td.set_(&segs(key)[..], &v) {
                Ok(()) => {
                    let got = td.get(&segs(key)[..]).ok_or("set_ ok but key gone")?;
                    let expect = v.to_kind(got.kind());
                    if !got.equal(&expect) {
                        return Err(format!(
                            "set_ {key:?}: the leaf does not hold the new values"
                        ));
                    }
                }
                Err(e) => {
                    err_ok(&e, &[key_display(key)], "set_")?;
                    unchanged(&before, td, "set_")?;
                }
            }
        }
        Op::Get { key } => {
            let k = &segs(key)[..];
            match (td.get(k), td.get_or_err(k)) {
                (Some(a), Ok(b)) if a.equal(b) => {}
                (None, Err(e)) => err_ok(&e, &[key_display(key)], "get_or_err")?,
                (a, b) => {
                    return Err(format!(
                        "get and get_or_err disagree on {key:?}: {} vs {}",
                        a.is_some(),
                        b.is_ok()
                    ))
                }
            }
            if td.contains(k) != td.get_entry(k).is_some() {
                return Err("contains and get_entry disagree".into());
            }
        }
        Op::Pop { key } => {
            let before = snapshot(td);
            let had = td.contains(&segs(key)[..]);
            match td.pop(&segs(key)[..]) {
                Ok(_) => {
                    if !had || td.contains(&segs(key)[..]) {
                        return Err(format!(
                            "pop {key:?} succeeded but the key was absent or is still there"
                        ));
                    }
                }
                Err(e) => {
                    err_ok(&e, &[key_display(key)], "pop")?;
                    unchanged(&before, td, "pop")?;
                }
            }
        }
        Op::Index { idx, keep } => {
            let bidx = build_index(td.batch_size(), idx);
            match td.index(&bidx) {
                Ok(r) => {
                    invariants(&r)?;
                    features_kept(td, &r, "index")?;
                    if *keep {
                        *td = r;
                    }
                }
                Err(e) => err_ok(&e, &[], "index")?,
            }
        }
        Op::Stack { n, dim, brk, keep } | Op::Cat { n, dim, brk, keep } => {
            let is_stack = matches!(op, Op::Stack { .. });
            let mut tds = vec![td.clone(); *n];
            if let Some(last) = tds.last_mut() {
                *last = broken(td, brk);
            }
            let res = if is_stack {
                stack(&tds, *dim)
            } else {
                cat(&tds, *dim)
            };
            let what = if is_stack { "stack" } else { "cat" };
            match res {
                Ok(r) => {
                    invariants(&r)?;
                    if matches!(brk, Break::None) {
                        features_kept(td, &r, what)?;
                        let expect_nd = td.batch_dims() + usize::from(is_stack);
                        if r.batch_dims() != expect_nd {
                            return Err(format!(
                                "{what}: batch dims {} not {expect_nd}",
                                r.batch_dims()
                            ));
                        }
                    }
                    if *keep {
                        *td = r;
                    }
                }
                Err(e) => {
                    if matches!(brk, Break::None)
                        && (is_stack || td.batch_dims() > 0)
                        && *n > 0
                        && dim_ok(*dim, td.batch_dims() + usize::from(is_stack))
                    {
                        return Err(format!("{what} of identical copies failed: {e}"));
                    }
                    err_ok(&e, &[], what)?
                }
            }
        }
        Op::Unbind { dim } => match td.unbind(*dim) {
            Ok(parts) => {
                for p in &parts {
                    invariants(p)?;
                }
                unbind_stack(td)?;
            }
            Err(e) => err_ok(&e, &[], "unbind")?,
        },
        Op::Split { sizes, dim } => match td.split(sizes, *dim) {
            Ok(parts) => {
                if parts.len() != sizes.len() {
                    return Err("split: wrong number of parts".into());
                }
                for p in &parts {
                    invariants(p)?;
                    features_kept(td, p, "split")?;
                }
                if !parts.is_empty() {
                    let d = if *dim < 0 {
                        *dim + td.batch_dims() as i64
                    } else {
                        *dim
                    };
                    let back = cat(&parts, d).map_err(|e| format!("cat(split) failed: {e}"))?;
                    same_td(td, &back, "cat(split(x))")?;
                }
            }
            Err(e) => err_ok(&e, &[], "split")?,
        },
        Op::Rename { old, new, safe } => {
            let before = snapshot(td);
            let had = td.get_entry(&segs(old)[..]).map(|e| match e {
                Entry::Tensor(t) => format!("{:?}", t.size()),
                Entry::Dict(d) => format!("level {:?}", d.batch_size()),
            });
            match td.rename_key(
                &segs(old)[..],
                &segs(new)[..],
                if *safe {
                    IfExists::Error
                } else {
                    IfExists::Overwrite
                },
            ) {
                Ok(()) => {
                    invariants(td)?;
                    if !new.starts_with(old) && !old.starts_with(new) && td.contains(&segs(old)[..])
                    {
                        return Err(format!(
                            "rename {old:?} -> {new:?}: the old key is still there"
                        ));
                    }
                    if !td.contains(&segs(new)[..]) || had.is_none() {
                        return Err(format!("rename {old:?} -> {new:?}: the new key is missing"));
                    }
                }
                Err(e) => {
                    err_ok(&e, &[key_display(old), key_display(new)], "rename_key")?;
                    unchanged(&before, td, "rename_key")?;
                }
            }
        }
        Op::Exclude { keys } => {
            let ks: Vec<Vec<&str>> = keys.iter().map(|k| segs(k)).collect();
            let ks: Vec<&[&str]> = ks.iter().map(|k| &k[..]).collect();
            let r = td.exclude(&ks);
            invariants(&r)?;
            for k in &ks {
                if r.contains(*k) {
                    return Err(format!("exclude {k:?}: still there"));
                }
            }
        }
        Op::Select { keys, strict } => {
            let ks: Vec<Vec<&str>> = keys.iter().map(|k| segs(k)).collect();
            let ks: Vec<&[&str]> = ks.iter().map(|k| &k[..]).collect();
            match td.select(&ks, if *strict { Strict::Yes } else { Strict::No }) {
                Ok(r) => {
                    invariants(&r)?;
                    for k in &ks {
                        if td.contains(*k) != r.contains(*k) {
                            return Err(format!("select {k:?}: presence differs"));
                        }
                    }
                }
                Err(e) => {
                    let names: Vec<String> = keys.iter().map(|k| key_display(k)).collect();
                    err_ok(&e, &names, "select")?
                }
            }
        }
        Op::Apply { f, keep } => {
            let f = *f;
            let res = td.apply(|t| match f {
                ApplyFn::Identity => Ok(Some(t.shallow_clone())),
                ApplyFn::Double => Ok(Some(if t.kind() == Kind::Bool {
                    t.f_logical_not()?
                } else {
                    t.f_add(t)?
                })),
                ApplyFn::DropOdd => Ok((t.dim() % 2 == 0).then(|| t.shallow_clone())),
                ApplyFn::BadShape => Ok(Some(t.f_reshape([-1])?.f_unsqueeze(0)?)),
                ApplyFn::Fail => Err(Error::InvalidArgument {
                    op: "test",
                    message: "the closure failed".into(),
                }),
            });
            match res {
                Ok(r) => {
                    invariants(&r)?;
                    if matches!(f, ApplyFn::Identity) {
                        same_td(td, &r, "apply(identity)")?;
                    }
                    if *keep {
                        *td = r;
                    }
                }
                Err(e) => {
                    if matches!(f, ApplyFn::Identity | ApplyFn::Double) {
                        return Err(format!("apply({f:?}) failed: {e}"));
                    }
                    err_ok(&e, &[], "apply")?
                }
            }
        }
        Op::Apply2 { other } => {
            let o = make_other(td, other);
            match td.apply2(&o, |a, b| Ok(Some(a.f_eq_tensor(b)?))) {
                Ok(r) => invariants(&r)?,
                Err(e) => err_ok(&e, &[], "apply2")?,
            }
        }
        Op::Expand { shape, keep } => shape_op(td, *keep, "expand", |t| {
            let r = t.expand(shape)?;
            Ok(r)
        })
        .and_then(|r| match r {
            Some(r) if r.batch_size() != shape.as_slice() => Err(format!(
                "expand({shape:?}) gave batch size {:?}",
                r.batch_size()
            )),
            _ => Ok(()),
        })?,
        Op::Reshape { shape, view, keep } => {
            let numel = td.numel();
            let r = shape_op(td, *keep, if *view { "view" } else { "reshape" }, |t| {
                if *view {
                    t.view(shape)
                } else {
                    t.reshape(shape)
                }
            })?;
            if let Some(r) = r {
                if r.numel() != numel {
                    return Err(format!("reshape({shape:?}) changed numel"));
                }
            }
        }
        Op::Unsqueeze { dim, keep } => {
            shape_op(td, *keep, "unsqueeze", |t| t.unsqueeze(*dim))?;
        }
        Op::Squeeze { dim, keep } => {
            shape_op(td, *keep, "squeeze", |t| t.squeeze(*dim))?;
        }
        Op::Permute { dims, keep } => {
            shape_op(td, *keep, "permute", |t| t.permute(dims))?;
        }
        Op::FitShapeOp {
            which,
            seed,
            extra,
            keep,
        } => {
            let bs = td.batch_size().to_vec();
            let nd = bs.len();
            match which {
                0 => {
                    let mut order: Vec<(u64, i64)> = (0..nd as i64)
                        .map(|i| (seed.rotate_left(7 * i as u32) ^ (i as u64), i))
                        .collect();
                    order.sort_unstable();
                    let dims: Vec<i64> = order.into_iter().map(|(_, i)| i).collect();
                    shape_op(td, *keep, "permute", |t| t.permute(&dims))?;
                }
                1 => {
                    let widened: Vec<i64> = bs
                        .iter()
                        .map(|d| if *d == 1 { (seed % 3) as i64 } else { *d })
                        .collect();
                    let shape = [extra.clone(), widened].concat();
                    let r = shape_op(td, *keep, "expand", |t| t.expand(&shape))?;
                    if r.is_none() {
                        return Err(format!("expand({shape:?}) of batch {bs:?} failed"));
                    }
                }
                2 | 3 => {
                    let numel = td.numel();
                    let shape: Vec<i64> = match seed % 5 {
                        0 => vec![-1],
                        1 => vec![1, -1],
                        2 => bs.iter().rev().copied().collect(),
                        3 => [bs.clone(), vec![1]].concat(),
                        _ => vec![numel],
                    };
                    let view = *which == 3;
                    let r = shape_op(td, *keep, if view { "view" } else { "reshape" }, |t| {
                        if view {
                            t.view(&shape)
                        } else {
                            t.reshape(&shape)
                        }
                    })?;
                    if r.is_none() && !view && !(numel == 0 && shape.contains(&-1)) {
                        return Err(format!("reshape({shape:?}) of batch {bs:?} failed"));
                    }
                }
                _ => {}
            }
        }
        Op::ToKind { kind, keep } => match td.to_kind(kind.kind()) {
            Ok(r) => {
                invariants(&r)?;
                if r.values().iter().any(|t| t.kind() != kind.kind()) {
                    return Err("to_kind left a leaf of another dtype".into());
                }
                if *keep {
                    *td = r;
                }
            }
            Err(e) => return Err(format!("to_kind({kind:?}) failed: {e}")),
        },
        Op::SaveLoad => roundtrip(td)?,
        Op::Update { other } => {
            let o = make_other(td, other);
            let before = snapshot(td);
            match td.update(&o) {
                Ok(()) => {
                    invariants(td)?;
                    for (k, t) in o.leaves() {
                        match td.get(&k) {
                            Some(x) if x.size() == t.size() && x.kind() == t.kind() => {}
                            _ => return Err(format!("update: leaf {k} not taken over")),
                        }
                    }
                }
                Err(e) => {
                    let names: Vec<String> = o
                        .keys(KeysOptions::nested())
                        .iter()
                        .map(|k| k.to_string())
                        .collect();
                    err_ok(&e, &names, "update")?;
                    unchanged(&before, td, "update")?;
                }
            }
        }
        Op::SetAt { idx, value } => {
            let bidx = build_index(td.batch_size(), idx);
            let indexed = td.index(&bidx);
            let v = match (value, &indexed) {
                (AtValue::Indexed, Ok(r)) => r.apply(|t| {
                    Ok(Some(if t.kind() == Kind::Bool {
                        t.f_logical_not()?
                    } else {
                        t.f_add_scalar(1)?
                    }))
                }),
                (AtValue::IndexedKind(k, i), Ok(r)) => {
                    let mut r = r.apply(|t| Ok(Some(t.copy())));
                    let leaves = td.leaves();
                    let pick = leaves.get(i % leaves.len().max(1)).map(|(k, _)| k.clone());
                    if let (Ok(rr), Some(first)) = (&mut r, pick) {
                        if let Some(t) = rr.get(&first).map(|t| t.to_kind(k.kind())) {
                            let _ = rr.set(&first, t);
                        }
                    }
                    r
                }
                (AtValue::IndexedExtra(key), Ok(r)) => {
                    let mut r = r.clone();
                    let s = shape_for(&r, key, &ShapeArg::Fit(vec![]));
                    let _ = r.set(&segs(key)[..], values(&s, Kind::Float, 2));
                    Ok(r)
                }
                (AtValue::Fresh(bs, sets), _) => Ok(fresh_td(bs, sets)),
                (_, Err(_)) => Ok(empty()),
            };
            let v = v.map_err(|e| format!("building the set_at value: {e}"))?;
            let before = snapshot(td);
            match td.set_at(&bidx, &v) {
                Ok(()) => {
                    invariants(td)?;
                    if matches!(value, AtValue::Indexed) && !has_duplicates(idx) {
                        let back = td
                            .index(&bidx)
                            .map_err(|e| format!("index after set_at failed: {e}"))?;
                        for (k, t) in v.leaves() {
                            let b = back.get(&k).ok_or("set_at: key lost")?;
                            if !b.equal(t) {
                                return Err(format!("set_at: td[idx][{k}] != value[{k}]"));
                            }
                        }
                    }
                }
                Err(e) => {
                    err_ok(&e, &[], "set_at")?;
                    unchanged(&before, td, "set_at")?;
                }
            }
        }
        Op::SetBatchSize { bs } => {
            let before = snapshot(td);
            match td.set_batch_size(bs) {
                Ok(()) => invariants(td)?,
                Err(e) => {
                    err_ok(&e, &[], "set_batch_size")?;
                    unchanged(&before, td, "set_batch_size")?;
                }
            }
        }
        Op::New { bs } => match TensorDict::new(bs) {
            Ok(t) => {
                if bs.iter().any(|d| *d < 0) {
                    return Err(format!("TensorDict::new({bs:?}) accepted a negative dim"));
                }
                *td = t;
            }
            Err(e) => {
                err_ok(&e, &[], "new")?;
                if bs.iter().all(|d| *d >= 0) {
                    return Err(format!("TensorDict::new({bs:?}) failed: {e}"));
                }
            }
        },
    }
    invariants(td)
}

/// True when a tensor has a stride-0 dim of size > 1 (an expanded view: libtorch refuses to
/// write into it in place).
fn dim_ok(dim: i64, n: usize) -> bool {
    let n = n as i64;
    (-n..n).contains(&dim)
}

/// True when the index has an index tensor (which may repeat positions: then the value read
/// back after `set_at` is one of the written ones, not necessarily the matching one).
fn has_duplicates(idx: &[IdxArg]) -> bool {
    idx.iter().any(|i| matches!(i, IdxArg::IndexT { .. }))
}

/// Runs a shape op, checks invariants and feature dims on success, the message on failure.
fn shape_op<F>(
    td: &mut TensorDict,
    keep: bool,
    what: &str,
    f: F,
) -> Result<Option<TensorDict>, String>
where
    F: FnOnce(&TensorDict) -> torchrl::Result<TensorDict>,
{
    match f(td) {
        Ok(r) => {
            invariants(&r)?;
            features_kept(td, &r, what)?;
            let out = r.clone();
            if keep {
                *td = r;
            }
            Ok(Some(out))
        }
        Err(e) => {
            err_ok(&e, &[], what)?;
            Ok(None)
        }
    }
}

/// Too large to keep operating on cheaply (many elements, or a batch dim so large that unbind
/// would loop for ever even with no elements).
fn too_big(td: &TensorDict) -> bool {
    let elements: i64 = td.values().iter().map(|t| t.numel() as i64).sum();
    let big_dim = td.batch_size().iter().any(|x| *x > 64)
        || td
            .items(KeysOptions::nested())
            .iter()
            .any(|(_, e)| match e {
                Entry::Dict(d) => d.batch_size().iter().any(|x| *x > 64),
                Entry::Tensor(_) => false,
            });
    td.numel() > 4096 || elements > 100_000 || big_dim
}

/// Runs every op under `catch_unwind`; a panic is a failure that names the op.
fn run_all(bs: &[i64], setup: &[Op], ops: &[Op]) -> Result<(), TestCaseError> {
    let mut td = TensorDict::new(bs).map_err(|e| TestCaseError::fail(format!("new: {e}")))?;
    for (i, op) in setup.iter().chain(ops).enumerate() {
        // Keep cases small: repeated cat/stack/expand could grow the batch without bound, and
        // a huge dim next to a 0-sized one (batch [2^40, 0]) makes unbind loop for ever.
        if too_big(&td) {
            td = TensorDict::new(bs).map_err(|e| TestCaseError::fail(format!("new: {e}")))?;
        }
        let res = catch_unwind(AssertUnwindSafe(|| run(&mut td, op)));
        match res {
            Ok(Ok(())) => {}
            Ok(Err(msg)) => {
                return Err(TestCaseError::fail(format!("op #{i} {op:?}: {msg}")));
            }
            Err(p) => {
                let msg = p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                return Err(TestCaseError::fail(format!(
                    "op #{i} {op:?} panicked: {msg}"
                )));
            }
        }
    }
    // Whole-state properties at the end of every case.
    let end = catch_unwind(AssertUnwindSafe(|| -> Check {
        invariants(&td)?;
        if too_big(&td) {
            return Ok(());
        }
        roundtrip(&td)?;
        unbind_stack(&td)
    }));
    match end {
        Ok(Ok(())) => Ok(()),
        Ok(Err(msg)) => Err(TestCaseError::fail(format!("final state: {msg}"))),
        Err(_) => Err(TestCaseError::fail("final checks panicked")),
    }
}

proptest! {
    #![proptest_config(config())]

    /// Random operation sequences: no panic, errors with context, invariants, atomic failures,
    /// shape ops keep feature dims.
    #[test]
    fn random_operation_sequences(
        bs in dims_s(3),
        setup in prop::collection::vec(set_op_s(), 0..8),
        ops in prop::collection::vec(op_s(), 1..24),
    ) {
        run_all(&bs, &setup, &ops)?;
    }

    /// Round trips on freshly built tensordicts (nested levels with extended batch sizes, every
    /// dtype, 0-sized dims): save/load and stack(unbind).
    #[test]
    fn roundtrips(
        bs in dims_s(3),
        setup in prop::collection::vec(set_op_s(), 0..10),
    ) {
        run_all(&bs, &setup, &[Op::SaveLoad])?;
    }
}

// ------------------------------------------------------------------ regressions

/// Fixed (src/tensordict/shape.rs): `expand` accepted negative sizes. On a tensordict without
/// leaves `expand([-1])` succeeded with batch size `[-1]`; with a size-1 batch dim
/// `[1].expand([-1])` succeeded with batch size `[-1]` while the leaves kept size 1 (libtorch
/// reads -1 as "keep"). A negative size is now an error naming the shape, as in
/// `TensorDict::new`.
#[test]
fn regression_expand_rejects_negative_sizes() {
    let td = TensorDict::new([0i64; 0]).unwrap();
    let err = td.expand([-1]).unwrap_err();
    assert!(err.to_string().contains("[-1]"), "{err}");
    assert_eq!(td.expand([2, 0]).unwrap().batch_size(), &[2, 0]);
    let td = TensorDict::new([1])
        .unwrap()
        .with("a", Tensor::zeros([1, 2], (Kind::Float, CPU)))
        .unwrap();
    match td.expand([-1]) {
        Err(_) => {}
        Ok(r) => panic!(
            "expand([-1]) gave batch size {:?} with leaf shape {:?}",
            r.batch_size(),
            r.get("a").map(|t| t.size())
        ),
    }
}

/// Fixed (src/tensordict/index.rs): a 0-d bool mask flattened every dim of the leaves, so that
/// `td[True]` on batch `[0]` gave batch size `[0, 0]` with a leaf of shape `[0]`. It now inserts
/// a dim of size 1 (true) or 0 (false), as in PyTorch.
#[test]
fn regression_zero_dim_mask() {
    let td = TensorDict::new([2])
        .unwrap()
        .with("a", Tensor::arange(6, (Kind::Float, CPU)).reshape([2, 3]))
        .unwrap();
    let t = td.index(&[BatchIndex::Mask(Tensor::from(true))]).unwrap();
    assert_eq!(t.batch_size(), &[1, 2]);
    assert_eq!(t.get("a").unwrap().size(), vec![1, 2, 3]);
    let f = td.index(&[BatchIndex::Mask(Tensor::from(false))]).unwrap();
    assert_eq!(f.batch_size(), &[0, 2]);
    assert_eq!(f.get("a").unwrap().size(), vec![0, 2, 3]);
    let e = TensorDict::new([0])
        .unwrap()
        .with("a", Tensor::zeros([0], (Kind::Float, CPU)))
        .unwrap();
    let r = e.index(&[BatchIndex::Mask(Tensor::from(true))]).unwrap();
    assert_eq!(r.batch_size(), &[1, 0]);
    assert_eq!(r.get("a").unwrap().size(), vec![1, 0]);
    // writes through a 0-d mask
    let mut w = td.deep_clone().unwrap();
    let v = w
        .index(&[BatchIndex::Mask(Tensor::from(true))])
        .unwrap()
        .apply(|t| Ok(Some(t.zeros_like())))
        .unwrap();
    w.set_at(&[BatchIndex::Mask(Tensor::from(true))], &v)
        .unwrap();
    assert_eq!(
        w.get("a").unwrap().abs().sum(Kind::Float).double_value(&[]),
        0.0
    );
}

/// Fixed (src/tensordict/index.rs): a slice step near `i64::MAX` overflowed computing the
/// slice length (a panic in debug builds).
#[test]
fn regression_huge_slice_step() {
    let td = TensorDict::new([5])
        .unwrap()
        .with("a", Tensor::arange(5, (Kind::Int64, CPU)))
        .unwrap();
    let r = td
        .index(&[BatchIndex::slice(Some(1), None, i64::MAX)])
        .unwrap();
    assert_eq!(r.batch_size(), &[1]);
    assert_eq!(r.get("a").unwrap().int64_value(&[0]), 1);
}

/// Fixed (src/tensordict/mod.rs): `set_batch_size` accepted negative dims on a tensordict
/// without leaves.
#[test]
fn regression_set_batch_size_rejects_negative_dims() {
    let mut td = TensorDict::new([0i64; 0]).unwrap();
    let err = td.set_batch_size([-1]).unwrap_err();
    assert!(err.to_string().contains("[-1]"), "{err}");
    assert_eq!(td.batch_size(), &[] as &[i64]);
}

/// Fixed (src/tensordict/shape.rs, index.rs): `set_at` checked keys and shapes, then wrote
/// leaf by leaf; when libtorch refused a write on a later leaf (here an expanded view, where
/// one memory location backs several elements) the earlier leaves were already written, so the
/// failed call left the tensordict half-written, and libtorch's error did not name the key.
/// `set_at` now checks every destination (no stride-0 dim of size > 1 in the written region)
/// and prepares every argument before writing anything, and the error names the key.
#[test]
fn regression_set_at_is_atomic() {
    let mut td = TensorDict::new([0i64; 0])
        .unwrap()
        .with("a", Tensor::zeros([1], (Kind::Float, CPU)))
        .unwrap()
        .with(
            "b",
            Tensor::zeros([1], (Kind::Float, CPU)).expand([2], false),
        )
        .unwrap();
    let v = td.apply(|t| Ok(Some(t.ones_like()))).unwrap();
    let err = td.set_at(&[], &v).unwrap_err();
    assert!(
        err.to_string().contains("\"b\""),
        "the error should name the key: {err}"
    );
    assert_eq!(
        td.get("a").unwrap().double_value(&[0]),
        0.0,
        "a failed set_at wrote \"a\""
    );
    // Through a mask too (libtorch's `index_put_` would write, with a warning, several values
    // into one memory location).
    let mut td = TensorDict::new([2])
        .unwrap()
        .with("a", Tensor::zeros([2], (Kind::Float, CPU)))
        .unwrap()
        .with(
            ("n", "b"),
            Tensor::zeros([1], (Kind::Float, CPU)).expand([2], false),
        )
        .unwrap();
    let mask = BatchIndex::Mask(Tensor::from_slice(&[true, true]));
    let v = td.apply(|t| Ok(Some(t.ones_like()))).unwrap();
    let err = td.set_at(&[mask], &v).unwrap_err();
    assert!(err.to_string().contains(r#"("n", "b")"#), "{err}");
    assert_eq!(
        td.get("a")
            .unwrap()
            .abs()
            .sum(Kind::Float)
            .double_value(&[]),
        0.0
    );
    // A value that shares memory with the destination is read before it is overwritten.
    let mut td = TensorDict::new([5])
        .unwrap()
        .with("a", Tensor::arange(5, (Kind::Int64, CPU)))
        .unwrap();
    let shifted = td.index(&[(0..4).into()]).unwrap();
    td.set_at(&[(1..5).into()], &shifted).unwrap();
    assert_eq!(
        Vec::<i64>::try_from(td.get("a").unwrap()).unwrap(),
        vec![0, 0, 1, 2, 3]
    );
    let idx = BatchIndex::Tensor(Tensor::from_slice(&[4i64, 3]));
    let first_two = td.index(&[(0..2).into()]).unwrap();
    td.set_at(&[idx], &first_two).unwrap();
    assert_eq!(
        Vec::<i64>::try_from(td.get("a").unwrap()).unwrap(),
        vec![0, 0, 1, 0, 0]
    );
}

/// Fixed (src/tensordict/index.rs): writing through a mask or an index tensor required the
/// value's dtype to equal the leaf's (libtorch's `index_put_`), while writing through ints and
/// slices casts (`copy_`); a dtype difference on a later leaf left `set_at` half-written. Both
/// paths now cast.
#[test]
fn regression_set_at_mask_casts_dtype() {
    let mut td = TensorDict::new([2])
        .unwrap()
        .with("a", Tensor::zeros([2], (Kind::Float, CPU)))
        .unwrap()
        .with("b", Tensor::zeros([2], (Kind::Int64, CPU)))
        .unwrap();
    let mask = Tensor::from_slice(&[true, false]);
    let v = TensorDict::new([1])
        .unwrap()
        .with("a", Tensor::ones([1], (Kind::Float, CPU)))
        .unwrap()
        .with("b", Tensor::ones([1], (Kind::Float, CPU)))
        .unwrap();
    td.set_at(&[BatchIndex::Mask(mask)], &v).unwrap();
    assert_eq!(td.get("a").unwrap().double_value(&[0]), 1.0);
    assert_eq!(td.get("b").unwrap().int64_value(&[0]), 1);
    assert_eq!(td.get("b").unwrap().kind(), Kind::Int64);
}

/// Fixed (src/tensordict/mod.rs): `set_` into a leaf libtorch cannot write in place (an
/// expanded view) returned libtorch's error without the key.
#[test]
fn regression_set_inplace_error_names_key() {
    let mut td = TensorDict::new([2])
        .unwrap()
        .with(
            ("a", "b"),
            Tensor::zeros([1, 3], (Kind::Float, CPU)).expand([2, 3], false),
        )
        .unwrap();
    let err = td
        .set_(("a", "b"), &Tensor::ones([2, 3], (Kind::Float, CPU)))
        .unwrap_err();
    assert!(err.to_string().contains(r#"("a", "b")"#), "{err}");
}

/// Fixed (src/tensordict/shape.rs): `reshape`/`view` multiplied the target sizes and `split`
/// added the split sizes without overflow checks, so huge arguments panicked in debug builds
/// ("attempt to multiply/add with overflow") instead of returning an error. They now use
/// checked arithmetic and report the shape; `cat` of tensordicts without leaves whose batch
/// dims sum past `i64::MAX` is an error too.
#[test]
fn regression_reshape_and_split_overflow() {
    let td = TensorDict::new([2])
        .unwrap()
        .with("a", Tensor::zeros([2, 3], (Kind::Float, CPU)))
        .unwrap();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        td.reshape([i64::MAX, 2]).is_err()
    }));
    assert_eq!(
        r.ok(),
        Some(true),
        "reshape([i64::MAX, 2]) must be an error, not a panic"
    );
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        td.split(&[i64::MAX, 1], 0).is_err()
    }));
    assert_eq!(
        r.ok(),
        Some(true),
        "split([i64::MAX, 1]) must be an error, not a panic"
    );
    let err = td.reshape([i64::MAX, 2]).unwrap_err();
    assert!(
        err.to_string().contains(&format!("[{}, 2]", i64::MAX)),
        "{err}"
    );
    assert!(td.view([i64::MAX, -1, 2]).is_err());
    assert_eq!(td.reshape([1, -1]).unwrap().batch_size(), &[1, 2]);
    let parts = td.split(&[1, 1], 0).unwrap();
    assert_eq!(parts.len(), 2);
    assert!(td.split(&[-1, 3], 0).is_err());
    // cat of tensordicts without leaves whose batch dims sum past i64::MAX.
    let big = TensorDict::new([i64::MAX]).unwrap();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        cat(&[big.clone(), big.clone()], 0).is_err()
    }));
    assert_eq!(r.ok(), Some(true), "cat overflowing i64 must be an error");
}

/// Fixed (src/tensordict/mod.rs): `numel` of a huge batch size (a tensordict without leaves)
/// overflowed (a panic in debug builds); it now saturates at `i64::MAX`.
#[test]
fn regression_numel_saturates() {
    let td = TensorDict::new([1i64 << 40, 1 << 40, 1 << 40]).unwrap();
    assert_eq!(td.numel(), i64::MAX);
}
