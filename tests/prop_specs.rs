//! Property-based campaign on the `TensorSpec`s (the reliability issue: constructors and
//! operations never panic, every failure is a `torchrl::Error` with a message, sampled and
//! projected values are in the spec).
//!
//! - every leaf spec is built from random arguments, valid and invalid (negative or huge `n`,
//!   empty or negative `nvec`, `low > high`, NaN and infinite bounds, mismatched shapes,
//!   unsupported dtypes, masks of the wrong shape or dtype): a constructor returns `Ok` or
//!   `Err`, never panics;
//! - for a valid spec: `rand` (seeded [`Generator`]) is always `is_in`; `project(x)` is always
//!   `is_in` (or an error) for random `x` of the right shape, any dtype and values including
//!   NaN, ±inf and out-of-range numbers; `zero`, `one`, `encode`, `expand`, `index`, `squeeze`,
//!   `unsqueeze` never panic, and a derived spec samples into itself;
//! - `Composite` with random nested keys: `rand` is `is_in`, `zero` is `is_in` exactly when zero
//!   is in every leaf, `is_in` on a tensordict missing a key errors naming it, `project` of a
//!   perturbed sample is `is_in`.
//!
//! CI runs `PROPTEST_CASES` cases per property (default below). Long campaign:
//! `PROPTEST_CASES=20000 cargo test --release --test prop_tensordict --test prop_specs --test prop_envs`.

use std::panic::{catch_unwind, AssertUnwindSafe};

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError};
use tch::{Device, Kind, Tensor};
use torchrl::specs::{
    Binary, Bounded, Categorical, Composite, MultiCategorical, MultiOneHot, NonTensor, OneHot,
    TensorSpec, Unbounded,
};
use torchrl::tensordict::KeysOptions;
use torchrl::{BatchIndex, Entry, Error, Generator, NestedKey, TensorDict};

const CPU: Device = Device::Cpu;

/// Cases per property when `PROPTEST_CASES` is not set (keeps CI bounded in debug builds).
const DEFAULT_CASES: u32 = 2048;

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

/// Every dtype a spec may be asked for, including ones specs refuse.
fn kind_s() -> impl Strategy<Value = Kind> {
    prop_oneof![
        3 => Just(Kind::Float),
        2 => Just(Kind::Double),
        3 => Just(Kind::Int64),
        1 => Just(Kind::Int),
        1 => Just(Kind::Int16),
        1 => Just(Kind::Int8),
        1 => Just(Kind::Uint8),
        2 => Just(Kind::Bool),
        1 => Just(Kind::Half),
        1 => Just(Kind::BFloat16),
        1 => Just(Kind::ComplexFloat),
    ]
}

/// A bound: mostly ordinary numbers, sometimes NaN, ±inf, huge or tiny.
fn bound_s() -> impl Strategy<Value = f64> {
    prop_oneof![
        6 => -4.0f64..4.0,
        2 => (-5i64..6).prop_map(|v| v as f64),
        1 => Just(f64::NAN),
        1 => Just(f64::INFINITY),
        1 => Just(f64::NEG_INFINITY),
        1 => prop_oneof![Just(1e39), Just(-1e39), Just(1e300), Just(-1e300), Just(70000.0), Just(-70000.0)],
        1 => prop_oneof![Just(0.3), Just(0.30000001), Just(0.1), Just(1e-30)],
    ]
}

/// A class count: mostly small, sometimes invalid or huge.
fn n_s() -> impl Strategy<Value = i64> {
    prop_oneof![
        8 => 1i64..7,
        1 => -3i64..1,
        1 => prop_oneof![Just(127), Just(128), Just(200), Just(256), Just(257), Just(4100), Just(1i64 << 40), Just(i64::MAX)],
    ]
}

fn lead_s() -> impl Strategy<Value = Vec<i64>> {
    prop::collection::vec(prop_oneof![6 => 0i64..4, 1 => Just(1i64)], 0..3)
}

/// A raw shape, possibly with negative dims.
fn raw_shape_s() -> impl Strategy<Value = Vec<i64>> {
    prop::collection::vec(-2i64..5, 0..4)
}

/// How a leaf's shape is given: its leading dims (the spec adds the protected last dim where
/// there is one), or an explicit shape that may not fit.
#[derive(Clone, Debug)]
enum ShapeArg {
    Lead(Vec<i64>),
    Raw(Vec<i64>),
}

fn shape_arg_s() -> impl Strategy<Value = ShapeArg> {
    prop_oneof![
        5 => lead_s().prop_map(ShapeArg::Lead),
        1 => raw_shape_s().prop_map(ShapeArg::Raw),
    ]
}

/// A mask of allowed classes: right shape (`[n]`), or a random shape, or another dtype.
#[derive(Clone, Debug)]
enum MaskArg {
    Classes(u64),
    Raw(Vec<i64>, bool),
    WrongKind,
}

fn mask_s() -> impl Strategy<Value = Option<MaskArg>> {
    prop::option::weighted(
        0.3,
        prop_oneof![
            4 => any::<u64>().prop_map(MaskArg::Classes),
            1 => (raw_shape_s(), any::<bool>()).prop_map(|(s, v)| MaskArg::Raw(s, v)),
            1 => Just(MaskArg::WrongKind),
        ],
    )
}

#[derive(Clone, Debug)]
enum LeafArgs {
    Unbounded {
        shape: ShapeArg,
        kind: Option<Kind>,
    },
    Bounded {
        low: f64,
        high: f64,
        shape: ShapeArg,
        kind: Option<Kind>,
    },
    /// `Bounded::from_tensors` with per-element bounds `lows`/`highs` (cycled to the shapes).
    BoundedT {
        lows: Vec<f64>,
        highs: Vec<f64>,
        low_shape: Vec<i64>,
        high_shape: Vec<i64>,
        kind: Kind,
        high_kind: Option<Kind>,
    },
    Categorical {
        n: i64,
        shape: ShapeArg,
        kind: Option<Kind>,
        mask: Option<MaskArg>,
    },
    OneHot {
        n: i64,
        shape: ShapeArg,
        kind: Option<Kind>,
        mask: Option<MaskArg>,
    },
    Binary {
        n: i64,
        shape: ShapeArg,
        kind: Option<Kind>,
    },
    MultiCategorical {
        nvec: Vec<i64>,
        shape: ShapeArg,
        kind: Option<Kind>,
    },
    MultiOneHot {
        nvec: Vec<i64>,
        shape: ShapeArg,
        kind: Option<Kind>,
    },
    NonTensor {
        shape: ShapeArg,
        kind: Option<Kind>,
    },
}

fn okind() -> impl Strategy<Value = Option<Kind>> {
    prop::option::weighted(0.6, kind_s())
}

fn nvec_s() -> impl Strategy<Value = Vec<i64>> {
    prop_oneof![
        8 => prop::collection::vec(1i64..5, 1..4),
        1 => prop::collection::vec(n_s(), 0..3),
    ]
}

fn leaf_args_s() -> impl Strategy<Value = LeafArgs> {
    prop_oneof![
        2 => (shape_arg_s(), okind()).prop_map(|(shape, kind)| LeafArgs::Unbounded { shape, kind }),
        3 => (bound_s(), bound_s(), shape_arg_s(), okind())
            .prop_map(|(low, high, shape, kind)| LeafArgs::Bounded { low, high, shape, kind }),
        2 => (
            prop::collection::vec(bound_s(), 1..4),
            prop::collection::vec(bound_s(), 1..4),
            lead_s(),
            prop_oneof![4 => lead_s(), 1 => raw_shape_s()],
            kind_s(),
            prop::option::weighted(0.2, kind_s()),
        )
            .prop_map(|(lows, highs, low_shape, high_shape, kind, high_kind)| LeafArgs::BoundedT {
                lows, highs, low_shape, high_shape, kind, high_kind,
            }),
        2 => (n_s(), shape_arg_s(), okind(), mask_s())
            .prop_map(|(n, shape, kind, mask)| LeafArgs::Categorical { n, shape, kind, mask }),
        2 => (n_s(), shape_arg_s(), okind(), mask_s())
            .prop_map(|(n, shape, kind, mask)| LeafArgs::OneHot { n, shape, kind, mask }),
        1 => (n_s(), shape_arg_s(), okind()).prop_map(|(n, shape, kind)| LeafArgs::Binary { n, shape, kind }),
        1 => (nvec_s(), shape_arg_s(), okind())
            .prop_map(|(nvec, shape, kind)| LeafArgs::MultiCategorical { nvec, shape, kind }),
        1 => (nvec_s(), shape_arg_s(), okind())
            .prop_map(|(nvec, shape, kind)| LeafArgs::MultiOneHot { nvec, shape, kind }),
        1 => (shape_arg_s(), okind()).prop_map(|(shape, kind)| LeafArgs::NonTensor { shape, kind }),
    ]
}

// ------------------------------------------------------------------ building

fn cycled(values: &[f64], shape: &[i64]) -> Tensor {
    let n: i64 = shape.iter().product();
    let data: Vec<f64> = (0..n.max(0) as usize)
        .map(|i| values[i % values.len().max(1)])
        .collect();
    Tensor::from_slice(&data).reshape(shape)
}

/// A `[*lead, n]`-broadcastable mask for `n` classes.
fn make_mask(m: &MaskArg, n: i64) -> Tensor {
    match m {
        MaskArg::Classes(seed) => {
            let n = n.clamp(0, 64);
            let bits: Vec<bool> = (0..n).map(|i| (seed >> (i % 64)) & 1 == 1).collect();
            Tensor::from_slice(&bits)
        }
        MaskArg::Raw(shape, v) => {
            let s: Vec<i64> = shape.iter().map(|d| (*d).clamp(0, 4)).collect();
            Tensor::full(s.as_slice(), i64::from(*v), (Kind::Bool, CPU))
        }
        MaskArg::WrongKind => Tensor::ones([n.clamp(0, 64)], (Kind::Float, CPU)),
    }
}

fn with_kind<T>(
    spec: T,
    kind: Option<Kind>,
    f: impl FnOnce(T, Kind) -> torchrl::Result<T>,
) -> torchrl::Result<T> {
    match kind {
        Some(k) => f(spec, k),
        None => Ok(spec),
    }
}

/// Builds a leaf from its arguments; `Err` for invalid arguments.
fn build_leaf(a: &LeafArgs) -> torchrl::Result<TensorSpec> {
    let full = |shape: &ShapeArg, last: Option<i64>| -> Vec<i64> {
        match (shape, last) {
            (ShapeArg::Lead(l), Some(n)) => [l.clone(), vec![n]].concat(),
            (ShapeArg::Lead(l), None) => l.clone(),
            (ShapeArg::Raw(r), _) => r.clone(),
        }
    };
    Ok(match a {
        LeafArgs::Unbounded { shape, kind } => {
            let s = Unbounded::new().with_shape(full(shape, None))?;
            with_kind(s, *kind, |s, k| s.with_dtype(k))?.into()
        }
        LeafArgs::Bounded {
            low,
            high,
            shape,
            kind,
        } => {
            let s = Bounded::new(*low, *high, full(shape, None))?;
            with_kind(s, *kind, |s, k| s.with_dtype(k))?.into()
        }
        LeafArgs::BoundedT {
            lows,
            highs,
            low_shape,
            high_shape,
            kind,
            high_kind,
        } => {
            let l = cycled(lows, low_shape).to_kind(*kind);
            let h = cycled(
                highs,
                &high_shape.iter().map(|d| (*d).max(0)).collect::<Vec<_>>(),
            )
            .to_kind(high_kind.unwrap_or(*kind));
            Bounded::from_tensors(l, h)?.into()
        }
        LeafArgs::Categorical {
            n,
            shape,
            kind,
            mask,
        } => {
            let mut s = Categorical::new(*n)?.with_shape(full(shape, None))?;
            if let Some(m) = mask {
                s = s.with_mask(make_mask(m, *n))?;
            }
            with_kind(s, *kind, |s, k| s.with_dtype(k))?.into()
        }
        LeafArgs::OneHot {
            n,
            shape,
            kind,
            mask,
        } => {
            let mut s = OneHot::new(*n)?.with_shape(full(shape, Some(*n)))?;
            if let Some(m) = mask {
                s = s.with_mask(make_mask(m, *n))?;
            }
            with_kind(s, *kind, |s, k| s.with_dtype(k))?.into()
        }
        LeafArgs::Binary { n, shape, kind } => {
            let s = Binary::new(*n)?.with_shape(full(shape, Some(*n)))?;
            with_kind(s, *kind, |s, k| s.with_dtype(k))?.into()
        }
        LeafArgs::MultiCategorical { nvec, shape, kind } => {
            let s = MultiCategorical::new(nvec.clone())?
                .with_shape(full(shape, Some(nvec.len() as i64)))?;
            with_kind(s, *kind, |s, k| s.with_dtype(k))?.into()
        }
        LeafArgs::MultiOneHot { nvec, shape, kind } => {
            let total = nvec.iter().fold(0i64, |a, b| a.saturating_add(*b));
            let s = MultiOneHot::new(nvec.clone())?.with_shape(full(shape, Some(total)))?;
            with_kind(s, *kind, |s, k| s.with_dtype(k))?.into()
        }
        LeafArgs::NonTensor { shape, kind } => {
            let s = NonTensor::new().with_shape(full(shape, None))?;
            with_kind(s, *kind, |s, k| s.with_dtype(k))?.into()
        }
    })
}

/// Small enough to sample and project (no spec with millions of elements or classes).
fn small(spec: &TensorSpec) -> bool {
    let numel = spec
        .shape()
        .iter()
        .try_fold(1i64, |a, d| a.checked_mul(*d))
        .unwrap_or(i64::MAX);
    numel <= 4096 && spec.shape().iter().all(|d| *d <= 4096)
}

/// A leaf that `rand` can sample (finite bounds, masks allowing a class in every row).
fn sampleable(spec: &TensorSpec) -> bool {
    finite_bounds(spec) && spec.rand(&mut Generator::new(0), &[]).is_ok()
}

// ------------------------------------------------------------------ checks

type Check = Result<(), String>;

fn catch<T>(what: &str, f: impl FnOnce() -> T) -> Result<T, String> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|p| {
        let msg = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        format!("{what} panicked: {msg}")
    })
}

fn err_ok(e: &Error, what: &str) -> Check {
    if e.to_string().trim().is_empty() {
        return Err(format!("{what}: empty error message"));
    }
    Ok(())
}

/// True when every float bound of a Bounded spec is finite (rand errors otherwise, documented).
fn finite_bounds(spec: &TensorSpec) -> bool {
    match spec {
        TensorSpec::Bounded(b) => {
            let fin = |t: &Tensor| {
                t.numel() == 0 || t.to_kind(Kind::Double).isfinite().all().int64_value(&[]) != 0
            };
            fin(b.low()) && fin(b.high())
        }
        _ => true,
    }
}

/// `rand` is `is_in` (an error only for infinite float bounds, or a mask row allowing nothing).
fn check_rand(spec: &TensorSpec, seed: u64, batch: &[i64], what: &str) -> Check {
    let mut gen = Generator::new(seed);
    let x = catch(&format!("{what} rand"), || spec.rand(&mut gen, batch))?;
    match x {
        Ok(x) => {
            let expected = [batch, spec.shape()].concat();
            if let Entry::Tensor(t) = &x {
                if t.size() != expected {
                    return Err(format!(
                        "{what}: rand({batch:?}) has shape {:?}, expected {expected:?}",
                        t.size()
                    ));
                }
                if Some(t.kind()) != spec.dtype() && !matches!(spec, TensorSpec::NonTensor(_)) {
                    return Err(format!("{what}: rand has dtype {:?}", t.kind()));
                }
            }
            match catch(&format!("{what} is_in"), || spec.is_in(&x))? {
                Ok(true) => Ok(()),
                Ok(false) => {
                    let reason = match &x {
                        Entry::Tensor(t) => spec
                            .check(&Entry::Tensor(t.shallow_clone()), "x")
                            .err()
                            .map(|e| e.to_string())
                            .unwrap_or_default(),
                        Entry::Dict(_) => String::new(),
                    };
                    Err(format!(
                        "{what}: rand({batch:?}) is not in {spec}: {reason}"
                    ))
                }
                Err(e) => Err(format!("{what}: is_in(rand) failed: {e}")),
            }
        }
        Err(e) => {
            err_ok(&e, "rand")?;
            let masked = matches!(spec, TensorSpec::Categorical(c) if c.mask().is_some())
                || matches!(spec, TensorSpec::OneHot(c) if c.mask().is_some());
            // An empty Bounded spec derived from one with infinite bounds keeps its (infinite)
            // constant bounds without elements to show them.
            let empty_bounded = matches!(spec, TensorSpec::Bounded(b) if b.low().numel() == 0);
            if finite_bounds(spec) && !masked && !empty_bounded {
                return Err(format!("{what}: rand({batch:?}) of {spec} failed: {e}"));
            }
            Ok(())
        }
    }
}

/// Values for `project`: ordinary numbers, out-of-range ones, NaN and ±inf.
fn value_pool() -> Vec<f64> {
    vec![
        0.0,
        1.0,
        -1.0,
        0.5,
        2.7,
        -3.2,
        1e10,
        -1e10,
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        3.0,
        5.0,
        255.0,
        256.0,
        -0.4,
    ]
}

/// A value of the spec's full shape (with batch dims), of `kind`, from the pool.
fn random_value(spec: &TensorSpec, batch: &[i64], kind: Kind, picks: &[usize]) -> Tensor {
    let pool = value_pool();
    let shape = [batch, spec.shape()].concat();
    let n: i64 = shape.iter().product();
    let data: Vec<f64> = (0..n as usize)
        .map(|i| pool[picks[i % picks.len().max(1)] % pool.len()])
        .collect();
    Tensor::from_slice(&data).reshape(shape).to_kind(kind)
}

/// `project(x)` is in the spec, or an error (never an out-of-spec value, never a panic).
fn check_project(spec: &TensorSpec, x: Tensor, what: &str) -> Check {
    let desc = format!("{:?} {:?}", x.kind(), x.size());
    let res = catch(&format!("{what} project"), || {
        spec.project(&Entry::Tensor(x.shallow_clone()))
    })?;
    if let Ok(Entry::Tensor(p)) = &res {
        if p.size() != x.size() {
            return Err(format!(
                "{what}: project changed the shape {:?} -> {:?}",
                x.size(),
                p.size()
            ));
        }
    }
    match res {
        Ok(p) => match catch(&format!("{what} is_in(project)"), || spec.is_in(&p))? {
            Ok(true) => Ok(()),
            Ok(false) => {
                let reason = spec
                    .check(&p, "p")
                    .err()
                    .map(|e| e.to_string())
                    .unwrap_or_default();
                Err(format!(
                    "{what}: project(x) of {spec} is not in the spec (x: {desc}, values {:?}): {reason}",
                    first_values(&x)
                ))
            }
            Err(e) => Err(format!("{what}: is_in(project(x)) failed: {e}")),
        },
        Err(e) => {
            err_ok(&e, "project")?;
            // Only a NonTensor spec (which cannot project) and a mask allowing no class in some
            // row may refuse a value of the right shape.
            if matches!(spec, TensorSpec::NonTensor(_)) || !sampleable(spec) {
                return Ok(());
            }
            Err(format!(
                "{what}: project(x) of {spec} failed (x: {desc}, values {:?}): {e}",
                first_values(&x)
            ))
        }
    }
}

fn first_values(t: &Tensor) -> Vec<f64> {
    let flat = t.to_kind(Kind::Double).reshape([-1]);
    let n = flat.numel().min(6) as i64;
    (0..n).map(|i| flat.double_value(&[i])).collect()
}

#[derive(Clone, Debug)]
enum SpecOp {
    Expand(Vec<i64>),
    /// Expand by prepending dims to the current shape.
    ExpandFit(Vec<i64>),
    Index(Vec<IdxArg>),
    Squeeze(Option<i64>),
    Unsqueeze(i64),
}

#[derive(Clone, Debug)]
enum IdxArg {
    Int(i64),
    Slice(Option<i64>, Option<i64>, i64),
    Ellipsis,
    NewAxis,
    Mask(Vec<i64>, u64),
    Index(Vec<i64>),
}

fn idx_s() -> impl Strategy<Value = IdxArg> {
    prop_oneof![
        3 => (-4i64..4).prop_map(IdxArg::Int),
        2 => (prop::option::of(-4i64..5), prop::option::of(-4i64..5), prop_oneof![4 => 1i64..3, 1 => -1i64..1])
            .prop_map(|(a, b, s)| IdxArg::Slice(a, b, s)),
        1 => Just(IdxArg::Ellipsis),
        1 => Just(IdxArg::NewAxis),
        1 => (prop::collection::vec(0i64..4, 0..3), any::<u64>()).prop_map(|(s, b)| IdxArg::Mask(s, b)),
        1 => prop::collection::vec(-4i64..4, 0..4).prop_map(IdxArg::Index),
    ]
}

fn spec_op_s() -> impl Strategy<Value = SpecOp> {
    prop_oneof![
        1 => prop::collection::vec(-1i64..4, 0..5).prop_map(SpecOp::Expand),
        2 => prop::collection::vec(0i64..3, 0..3).prop_map(SpecOp::ExpandFit),
        3 => prop::collection::vec(idx_s(), 0..4).prop_map(SpecOp::Index),
        1 => prop::option::of(-4i64..4).prop_map(SpecOp::Squeeze),
        1 => (-4i64..4).prop_map(SpecOp::Unsqueeze),
    ]
}

fn build_index(idx: &[IdxArg]) -> Vec<BatchIndex> {
    idx.iter()
        .map(|i| match i {
            IdxArg::Int(v) => BatchIndex::Int(*v),
            IdxArg::Slice(a, b, s) => BatchIndex::slice(*a, *b, *s),
            IdxArg::Ellipsis => BatchIndex::Ellipsis,
            IdxArg::NewAxis => BatchIndex::NewAxis,
            IdxArg::Mask(shape, bits) => {
                let n: i64 = shape.iter().product();
                let v: Vec<bool> = (0..n).map(|i| (bits >> (i % 64)) & 1 == 1).collect();
                BatchIndex::Mask(Tensor::from_slice(&v).reshape(shape.as_slice()))
            }
            IdxArg::Index(v) => BatchIndex::Tensor(Tensor::from_slice(v)),
        })
        .collect()
}

fn apply_op(spec: &TensorSpec, op: &SpecOp) -> torchrl::Result<TensorSpec> {
    match op {
        SpecOp::Expand(shape) => spec.expand(shape),
        SpecOp::ExpandFit(extra) => spec.expand(&[extra.as_slice(), spec.shape()].concat()),
        SpecOp::Index(idx) => spec.index(&build_index(idx)),
        SpecOp::Squeeze(d) => spec.squeeze(*d),
        SpecOp::Unsqueeze(d) => spec.unsqueeze(*d),
    }
}

/// Everything about one leaf built from `args`.
fn leaf_case(
    args: &LeafArgs,
    seed: u64,
    batch: &[i64],
    kinds: &[Kind],
    picks: &[usize],
    ops: &[SpecOp],
) -> Check {
    let built = catch("constructor", || build_leaf(args))?;
    let spec = match built {
        Ok(s) => s,
        Err(e) => return err_ok(&e, "constructor"),
    };
    let what = format!("{spec}");
    if what.is_empty() {
        return Err("empty Display".into());
    }
    if !small(&spec) {
        // Huge specs: only cheap operations.
        let _ = catch("zero of a huge spec", || spec.shape().len())?;
        return Ok(());
    }
    check_rand(&spec, seed, batch, &what)?;
    check_rand(&spec, seed ^ 1, &[], &what)?;
    for one in [false, true] {
        let filled = || {
            if one {
                spec.one(batch)
            } else {
                spec.zero(batch)
            }
        };
        match catch("zero/one", filled)? {
            Ok(Entry::Tensor(t)) => {
                if t.size() != [batch, spec.shape()].concat() {
                    return Err(format!("{what}: zero/one has shape {:?}", t.size()));
                }
            }
            Ok(Entry::Dict(_)) => return Err("a leaf's zero is a tensordict".into()),
            Err(e) => err_ok(&e, "zero/one")?,
        }
    }
    for kind in kinds {
        let x = random_value(&spec, batch, *kind, picks);
        check_project(&spec, x, &what)?;
    }
    // A wrong shape: an extra trailing dim (project must not reshape: an error, not a panic).
    let bad = Tensor::zeros([spec.shape(), &[3]].concat().as_slice(), (Kind::Float, CPU));
    let _ = catch("project(bad shape)", || spec.project(&Entry::Tensor(bad)))?;
    let values: Vec<f64> = picks.iter().map(|p| value_pool()[p % 16]).collect();
    if let Ok(Err(e)) = catch("encode", || spec.encode(&values)) {
        err_ok(&e, "encode")?;
    }
    // Derived specs: no panic, and they sample into themselves.
    let mut cur = spec.clone();
    for op in ops {
        match catch(&format!("{what} {op:?}"), || apply_op(&cur, op))? {
            Ok(s) => {
                if small(&s) {
                    check_rand(&s, seed, &[], &format!("{what} after {op:?}: {s}"))?;
                    cur = s;
                }
            }
            Err(e) => err_ok(&e, &format!("{op:?}"))?,
        }
    }
    Ok(())
}

// ------------------------------------------------------------------ Composite

fn key_s() -> impl Strategy<Value = Vec<String>> {
    prop::collection::vec(
        prop_oneof![
            6 => prop_oneof![Just("a"), Just("b"), Just("next"), Just("obs")].prop_map(String::from),
            1 => Just("shape".to_string()),
        ],
        1..=3,
    )
}

/// Whether zero is in a leaf (by construction of each spec, independently of `is_in`).
fn zero_in(spec: &TensorSpec) -> bool {
    match spec {
        TensorSpec::Unbounded(_)
        | TensorSpec::Binary(_)
        | TensorSpec::MultiCategorical(_)
        | TensorSpec::NonTensor(_) => true,
        TensorSpec::Bounded(b) => {
            let z = b.low().zeros_like();
            b.low().numel() == 0
                || (b.low().le_tensor(&z).all().int64_value(&[]) != 0
                    && b.high().ge_tensor(&z).all().int64_value(&[]) != 0)
        }
        TensorSpec::Categorical(c) => match c.mask() {
            None => true,
            Some(m) => m.numel() == 0 || m.select(-1, 0).all().int64_value(&[]) != 0,
        },
        // All-zero rows are not one-hot (unless there are no rows).
        TensorSpec::OneHot(_) | TensorSpec::MultiOneHot(_) => {
            spec.shape().iter().product::<i64>() == 0
        }
        TensorSpec::Composite(_) => true,
    }
}

fn composite_case(
    shape: &[i64],
    leaves: &[(Vec<String>, LeafArgs)],
    seed: u64,
    batch: &[i64],
    drop: usize,
) -> Check {
    let mut comp = Composite::new(shape).map_err(|e| format!("Composite::new: {e}"))?;
    for (key, args) in leaves {
        // Leaves get the composite's shape as leading dims.
        let args = with_lead(args, shape);
        let leaf = match catch("constructor", || build_leaf(&args))? {
            // Infinite float bounds cannot be sampled (documented): not part of this property.
            Ok(l) if small(&l) && sampleable(&l) => l,
            _ => continue,
        };
        let k: Vec<&str> = key.iter().map(String::as_str).collect();
        match catch("Composite::set", || comp.set(&k[..], leaf))? {
            Ok(()) => {}
            Err(e) => {
                err_ok(&e, "Composite::set")?;
                let msg = e.to_string();
                let named = key.iter().any(|s| msg.contains(s.as_str()));
                if !named {
                    return Err(format!(
                        "Composite::set({key:?}) error does not name the key: {msg}"
                    ));
                }
            }
        }
    }
    let mut gen = Generator::new(seed);
    let td = match catch("Composite::rand", || comp.rand(&mut gen, batch))? {
        Ok(td) => td,
        Err(e) => return Err(format!("Composite::rand failed: {e}\n{comp}")),
    };
    if td.batch_size() != [batch, shape].concat().as_slice() {
        return Err(format!("rand batch size {:?}", td.batch_size()));
    }
    match catch("Composite::is_in", || comp.is_in(&td))? {
        Ok(true) => {}
        Ok(false) => {
            let r = comp
                .check(&td)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            return Err(format!("Composite rand is not in the spec: {r}\n{comp}"));
        }
        Err(e) => return Err(format!("Composite::is_in(rand) failed: {e}")),
    }
    // zero is in the composite exactly when zero is in every leaf.
    let zero = comp
        .zero(batch)
        .map_err(|e| format!("Composite::zero failed: {e}"))?;
    let expect = comp
        .leaves()
        .iter()
        .all(|(_, s)| zero_in(s) || batch.iter().chain(s.shape()).product::<i64>() == 0);
    match comp.is_in(&zero) {
        Ok(v) if v == expect => {}
        Ok(v) => {
            return Err(format!(
                "Composite::is_in(zero) = {v}, expected {expect} (every leaf contains zero: {expect})\n{comp}"
            ))
        }
        Err(e) => return Err(format!("Composite::is_in(zero) failed: {e}")),
    }
    // A missing leaf is an error naming it.
    let leaf_keys: Vec<NestedKey> = comp.keys(KeysOptions::nested_leaves());
    if !leaf_keys.is_empty() {
        let k = &leaf_keys[drop % leaf_keys.len()];
        let mut missing = td.clone();
        let _ = missing.remove(k);
        match catch("Composite::is_in(missing)", || comp.is_in(&missing))? {
            Err(e) => {
                let msg = e.to_string();
                if !matches!(e, Error::KeyNotFound { .. }) || !msg.contains(&k.to_string()) {
                    return Err(format!(
                        "is_in without {k}: the error does not name it: {msg}"
                    ));
                }
            }
            Ok(v) => {
                // A leaf of an empty sub-composite or a `None` entry is skipped.
                if comp.get(k).is_some() {
                    return Err(format!("is_in without {k} gave Ok({v})"));
                }
            }
        }
        // project of a perturbed sample is in the spec.
        let perturbed = td
            .apply(|t| {
                Ok(Some(if t.kind() == Kind::Bool {
                    t.logical_not()
                } else {
                    (t.to_kind(Kind::Double) * 3.0 - 1.5).to_kind(t.kind())
                }))
            })
            .map_err(|e| format!("perturb: {e}"))?;
        match catch("Composite::project", || comp.project(&perturbed))? {
            Ok(p) => match comp.is_in(&p) {
                Ok(true) => {}
                other => {
                    let r = comp
                        .check(&p)
                        .err()
                        .map(|e| e.to_string())
                        .unwrap_or_default();
                    return Err(format!("Composite::project gave {other:?}: {r}\n{comp}"));
                }
            },
            Err(e) => err_ok(&e, "Composite::project")?,
        }
    }
    // shape ops on the composite never panic
    for op in [
        SpecOp::Unsqueeze(0),
        SpecOp::Squeeze(None),
        SpecOp::ExpandFit(vec![2]),
        SpecOp::Index(vec![IdxArg::Int(0)]),
    ] {
        let c = TensorSpec::Composite(comp.clone());
        if let Ok(s) = catch(&format!("Composite {op:?}"), || apply_op(&c, &op))? {
            if small(&s) {
                let mut g = Generator::new(seed);
                if let Ok(Entry::Dict(td)) = s.rand(&mut g, &[]) {
                    if let TensorSpec::Composite(cs) = &s {
                        if !matches!(cs.is_in(&td), Ok(true)) {
                            return Err(format!("Composite after {op:?}: rand not in spec"));
                        }
                    }
                }
            }
        }
    }
    let _ = TensorDict::new([0i64; 0]);
    Ok(())
}

/// The same leaf arguments with `lead` prepended to its leading dims.
fn with_lead(a: &LeafArgs, lead: &[i64]) -> LeafArgs {
    let fix = |s: &ShapeArg| match s {
        ShapeArg::Lead(l) => ShapeArg::Lead([lead, l.as_slice()].concat()),
        ShapeArg::Raw(r) => ShapeArg::Raw(r.clone()),
    };
    let mut a = a.clone();
    match &mut a {
        LeafArgs::Unbounded { shape, .. }
        | LeafArgs::Bounded { shape, .. }
        | LeafArgs::Categorical { shape, .. }
        | LeafArgs::OneHot { shape, .. }
        | LeafArgs::Binary { shape, .. }
        | LeafArgs::MultiCategorical { shape, .. }
        | LeafArgs::MultiOneHot { shape, .. }
        | LeafArgs::NonTensor { shape, .. } => *shape = fix(shape),
        LeafArgs::BoundedT {
            low_shape,
            high_shape,
            ..
        } => {
            *low_shape = [lead, low_shape.as_slice()].concat();
            *high_shape = [lead, high_shape.as_slice()].concat();
        }
    }
    a
}

/// A huge dim: leaf specs accept any non-negative shape, but nothing of that size can be
/// allocated (terabytes and more; a merely large shape would be built, slowly).
fn huge_dim_s() -> impl Strategy<Value = i64> {
    prop_oneof![
        Just(1i64 << 40),
        Just(1i64 << 50),
        Just(i64::MAX / 2),
        Just(i64::MAX),
        1i64..3,
    ]
}

/// Specs with huge shapes or class counts: every operation returns (an error, mostly) without
/// panicking or aborting on an impossible allocation.
fn huge_case(args: &LeafArgs, dims: &[i64], seed: u64) -> Check {
    // Per-element bounds would have to be built at the huge shape: use scalar bounds instead.
    let huge = |a: &LeafArgs| -> LeafArgs {
        match a {
            LeafArgs::BoundedT { kind, .. } => LeafArgs::Bounded {
                low: 0.0,
                high: 1.0,
                shape: ShapeArg::Lead(dims.to_vec()),
                kind: Some(*kind),
            },
            _ => with_lead(a, dims),
        }
    };
    let spec = match catch("constructor", || build_leaf(&huge(args)))? {
        Ok(s) => s,
        Err(e) => return err_ok(&e, "constructor"),
    };
    let mut gen = Generator::new(seed);
    if let Err(e) = catch("rand", || spec.rand(&mut gen, &[]))? {
        err_ok(&e, "rand")?;
    }
    if let Err(e) = catch("rand batch", || spec.rand(&mut gen, &[1 << 40]))? {
        err_ok(&e, "rand")?;
    }
    if let Err(e) = catch("zero", || spec.zero(&[]))? {
        err_ok(&e, "zero")?;
    }
    if let Err(e) = catch("encode", || spec.encode(&[0.0, 1.0]))? {
        err_ok(&e, "encode")?;
    }
    let small = Tensor::zeros([2], (Kind::Float, CPU));
    if let Err(e) = catch("is_in", || {
        spec.is_in(&Entry::Tensor(small.shallow_clone()))
    })? {
        err_ok(&e, "is_in")?;
    }
    if let Err(e) = catch("project", || spec.project(&Entry::Tensor(small)))? {
        err_ok(&e, "project")?;
    }
    for op in [
        SpecOp::Squeeze(None),
        SpecOp::Unsqueeze(0),
        SpecOp::ExpandFit(vec![3]),
        SpecOp::Index(vec![IdxArg::Int(-1)]),
        SpecOp::Index(vec![IdxArg::Slice(Some(1), None, 2)]),
    ] {
        if let Err(e) = catch(&format!("{op:?}"), || apply_op(&spec, &op))? {
            err_ok(&e, "shape op")?;
        }
    }
    let _ = format!("{spec}");
    Ok(())
}

fn to_case(r: Check) -> Result<(), TestCaseError> {
    r.map_err(TestCaseError::fail)
}

proptest! {
    #![proptest_config(config())]

    /// Leaf specs from random arguments: constructors never panic; valid specs sample into
    /// themselves, project into themselves, and survive random shape operations.
    #[test]
    fn leaf_specs(
        args in leaf_args_s(),
        seed in any::<u64>(),
        batch in prop::collection::vec(0i64..3, 0..3),
        kinds in prop::collection::vec(kind_s().prop_filter("real kinds", |k| *k != Kind::ComplexFloat), 1..4),
        picks in prop::collection::vec(0usize..16, 1..12),
        ops in prop::collection::vec(spec_op_s(), 0..4),
    ) {
        to_case(leaf_case(&args, seed, &batch, &kinds, &picks, &ops))?;
    }

    /// Leaf specs with huge dims or class counts: no panic, no abort.
    #[test]
    fn huge_leaf_specs(
        args in leaf_args_s(),
        dims in prop::collection::vec(huge_dim_s(), 1..3),
        seed in any::<u64>(),
    ) {
        to_case(huge_case(&args, &dims, seed))?;
    }

    /// Composites with random nested keys.
    #[test]
    fn composite_specs(
        shape in prop::collection::vec(0i64..3, 0..3),
        leaves in prop::collection::vec((key_s(), leaf_args_s()), 0..6),
        seed in any::<u64>(),
        batch in prop::collection::vec(0i64..3, 0..2),
        drop in any::<usize>(),
    ) {
        to_case(composite_case(&shape, &leaves, seed, &batch, drop))?;
    }
}

// ------------------------------------------------------------------ regressions

fn in_spec(spec: &TensorSpec, t: &Tensor) -> bool {
    spec.is_in(&Entry::Tensor(t.shallow_clone())).unwrap()
}

fn projected(spec: &TensorSpec, t: Tensor) -> Tensor {
    match spec.project(&Entry::Tensor(t)).unwrap() {
        Entry::Tensor(p) => p,
        Entry::Dict(_) => unreachable!(),
    }
}

/// Fixed (multi_one_hot.rs): `MultiOneHot::new` summed `nvec` unchecked (a panic on overflow
/// in debug builds).
#[test]
fn regression_multi_one_hot_nvec_sum_overflow() {
    let err = MultiOneHot::new(vec![i64::MAX, 1]).unwrap_err();
    assert!(err.to_string().contains("overflow"), "{err}");
}

/// Fixed (bounded.rs, via `tensordict::full_f64`): `Bounded::new(0, 1e39)` panicked. tch's
/// fallible ops that take a `Scalar` (`f_full`, `f_clamp`, `f_fill_`, `f_masked_fill`, …)
/// panic instead of returning libtorch's error (the temporary `Scalar` is dropped before the
/// error is read, and its destructor unwraps it); libtorch refuses 1e39 as a float32. A bound
/// beyond float32 now rounds to ±inf, as a cast does.
#[test]
fn regression_bounded_huge_bounds() {
    let spec = Bounded::new(0.0, 1e39, [2]).unwrap();
    assert!(spec.high().double_value(&[0]).is_infinite());
    assert!(spec.is_in(&Tensor::from_slice(&[0.0f32, 3e38])).unwrap());
}

/// Fixed (categorical.rs): projecting NaN onto a Categorical gave i64::MIN (a NaN cast), which
/// is not in the spec; ±inf did the same. NaN now projects to class 0 (as Bounded projects NaN
/// to `low`), ±inf to the extreme classes.
#[test]
fn regression_categorical_project_nan_inf() {
    let spec: TensorSpec = Categorical::new(3).unwrap().with_shape([3]).unwrap().into();
    let p = projected(
        &spec,
        Tensor::from_slice(&[f32::NAN, f32::INFINITY, f32::NEG_INFINITY]),
    );
    assert_eq!(Vec::<i64>::try_from(&p).unwrap(), vec![0, 2, 0]);
    assert!(in_spec(&spec, &p));
    let masked: TensorSpec = Categorical::new(3)
        .unwrap()
        .with_mask(Tensor::from_slice(&[false, true, true]))
        .unwrap()
        .into();
    let p = projected(&masked, Tensor::from(f64::NAN));
    assert_eq!(p.int64_value(&[]), 1);
}

/// Fixed (categorical.rs): `is_in` compared the values with `n` in the value's dtype, where
/// libtorch casts the scalar: for an `Int8` spec of 128 classes, `76 < 128` compared with -128
/// and every sample was rejected.
#[test]
fn regression_categorical_int8_compares_with_n() {
    let spec = Categorical::new(128)
        .unwrap()
        .with_dtype(Kind::Int8)
        .unwrap();
    assert!(spec
        .is_in(&Tensor::from(76i64).to_kind(Kind::Int8))
        .unwrap());
    let x = spec.rand(&mut Generator::new(0), &[50]).unwrap();
    assert!(spec.is_in(&x).unwrap());
}

/// Fixed (categorical.rs, multi_categorical.rs): a dtype that cannot hold every class (200
/// classes as `Int8`, 3 as `Bool`, 4100 as `Half`) was accepted, and `rand`/`project` then
/// produced wrapped or rounded values outside the spec. `with_dtype` now refuses it.
#[test]
fn regression_classes_must_fit_dtype() {
    assert!(Categorical::new(200)
        .unwrap()
        .with_dtype(Kind::Int8)
        .is_err());
    assert!(Categorical::new(3).unwrap().with_dtype(Kind::Bool).is_err());
    assert!(Categorical::new(4100)
        .unwrap()
        .with_dtype(Kind::Half)
        .is_err());
    assert!(Categorical::new(2).unwrap().with_dtype(Kind::Bool).is_ok());
    assert!(Categorical::new(2049)
        .unwrap()
        .with_dtype(Kind::Half)
        .is_ok());
    assert!(MultiCategorical::new(vec![2, 300])
        .unwrap()
        .with_dtype(Kind::Uint8)
        .is_err());
}

/// Fixed (bounded.rs): `with_dtype` to an integer dtype wrapped bounds it cannot hold (`-1` as
/// `Uint8` is 255, giving `low > high`); non-finite bounds cast to garbage.
#[test]
fn regression_bounded_with_dtype_checks_range() {
    assert!(Bounded::new(-1.0, 1.0, [2])
        .unwrap()
        .with_dtype(Kind::Uint8)
        .is_err());
    assert!(Bounded::new(f64::NEG_INFINITY, 1.0, [2])
        .unwrap()
        .with_dtype(Kind::Int64)
        .is_err());
    let ok = Bounded::new(0.0, 200.0, [2])
        .unwrap()
        .with_dtype(Kind::Uint8)
        .unwrap();
    assert!(ok
        .is_in(&ok.rand(&mut Generator::new(1), &[10]).unwrap())
        .unwrap());
}

/// Fixed (bounded.rs): `with_dtype` to another float dtype kept the f64 bounds given to `new`
/// for sampling, while `is_in` compares with the bounds rounded to float32 and cast: with
/// `low = 0.3` (float32 0.30000001192…) cast to float64, samples in `[0.3, 0.3000000119)` were
/// outside the spec.
#[test]
fn regression_bounded_cast_bounds_sampling() {
    let spec = Bounded::new(0.3, 0.30000001, [64])
        .unwrap()
        .with_dtype(Kind::Double)
        .unwrap();
    let x = spec.rand(&mut Generator::new(0), &[]).unwrap();
    assert!(spec.is_in(&x).unwrap(), "{:?}", spec.check(&x, "x"));
}

/// Fixed (bounded.rs): projecting +inf (or a huge float) onto an integer Bounded spec went
/// through a float-to-int cast (i64::MIN) and was clamped to `low`; it now clamps while still
/// floating, to `high`.
#[test]
fn regression_bounded_int_project_inf() {
    let spec = Bounded::new(-3.0, 5.0, [3])
        .unwrap()
        .with_dtype(Kind::Int64)
        .unwrap();
    let p = spec
        .project(&Tensor::from_slice(&[
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
        ]))
        .unwrap();
    assert_eq!(Vec::<i64>::try_from(&p).unwrap(), vec![5, -3, -3]);
}

/// Fixed (one_hot.rs): projecting onto a masked OneHot picked the argmax after setting the
/// forbidden classes to -inf, so a row whose allowed scores were -inf (or NaN) could pick a
/// forbidden class. Scores are now made finite first (NaN lowest).
#[test]
fn regression_one_hot_masked_project_inf_scores() {
    let spec = OneHot::new(2)
        .unwrap()
        .with_mask(Tensor::from_slice(&[false, true]))
        .unwrap();
    let p = spec
        .project(&Tensor::from_slice(&[f32::NEG_INFINITY, f32::NEG_INFINITY]))
        .unwrap();
    assert_eq!(Vec::<bool>::try_from(&p).unwrap(), vec![false, true]);
    let p = spec
        .project(&Tensor::from_slice(&[1.0f32, f32::NAN]))
        .unwrap();
    assert!(spec.is_in(&p).unwrap());
}

/// Fixed (multi_categorical.rs, binary.rs): NaN projected to an out-of-spec value (a NaN cast);
/// for a narrow dtype the per-entry maxima were built in the value's dtype and wrapped.
#[test]
fn regression_multi_categorical_and_binary_project_nan() {
    let spec = MultiCategorical::new(vec![3, 200]).unwrap();
    let p = spec
        .project(&Tensor::from_slice(&[f32::NAN, 1e10]))
        .unwrap();
    assert_eq!(Vec::<i64>::try_from(&p).unwrap(), vec![0, 199]);
    let p = spec.project(&Tensor::from_slice(&[5i8, 100])).unwrap();
    assert!(spec.is_in(&p).unwrap());
    let b = Binary::new(3).unwrap();
    let p = b
        .project(&Tensor::from_slice(&[f32::NAN, 7.0, -2.0]))
        .unwrap();
    assert_eq!(Vec::<i8>::try_from(&p).unwrap(), vec![0, 1, 0]);
}

/// Fixed (tensordict/ops.rs): `TensorDict::fill_` with a value the leaf's dtype cannot hold
/// (300 for `Uint8`) panicked (tch's `Scalar` hazard, see above); it is now an error naming
/// the key.
#[test]
fn regression_fill_out_of_range() {
    let td = TensorDict::new([2])
        .unwrap()
        .with(("a", "b"), Tensor::zeros([2], (Kind::Uint8, CPU)))
        .unwrap();
    let err = td.fill_(("a", "b"), 300i64).unwrap_err();
    assert!(err.to_string().contains(r#"("a", "b")"#), "{err}");
    td.fill_(("a", "b"), 7i64).unwrap();
    assert_eq!(td.get(("a", "b")).unwrap().int64_value(&[1]), 7);
}

/// Fixed (bounded.rs): projecting onto a `Bool` Bounded spec called libtorch's clamp, which
/// has no bool kernel (a raw libtorch error for any value not already in the spec).
#[test]
fn regression_bounded_bool_project() {
    let spec = Bounded::from_tensors(Tensor::from(false), Tensor::from(true)).unwrap();
    let p = spec
        .project(&Tensor::from_slice(&[0.0f32, 5.0, f32::NAN]))
        .unwrap();
    assert_eq!(p.kind(), Kind::Bool);
    assert!(spec.is_in(&p).unwrap());
    assert_eq!(Vec::<bool>::try_from(&p).unwrap(), vec![false, true, false]);
}

/// Fixed (rng.rs, unbounded.rs, multi_*.rs): sampling a spec with a huge shape overflowed the
/// element count (a panic in debug builds) or requested the buffer with `Vec::with_capacity` /
/// tch's `Vec::try_from`, which abort the process when the allocation fails. Counts are now
/// checked and buffers reserved fallibly: an error.
#[test]
fn regression_huge_specs_do_not_abort() {
    let mut gen = Generator::new(0);
    // issue 29: a shape whose element count overflows is now refused at construction
    assert!(Unbounded::new().with_shape([1i64 << 40, 1 << 40]).is_err());
    let u = Unbounded::new()
        .with_shape([1i64 << 29, 1 << 30])
        .unwrap()
        .with_dtype(Kind::Int64)
        .unwrap();
    assert!(u.rand(&mut gen, &[]).is_err());
    let b = Bounded::new(-3.0, 1.0, [1])
        .unwrap()
        .with_dtype(Kind::Int64)
        .unwrap();
    assert!(b.rand(&mut gen, &[1 << 40]).is_err());
    let m = MultiCategorical::new(vec![2, 3]).unwrap();
    assert!(m.rand(&mut gen, &[1 << 40, 1 << 40]).is_err());
    let h = MultiOneHot::new(vec![1 << 40]).unwrap();
    assert!(h.rand(&mut gen, &[]).is_err());
    let c = Categorical::new(3).unwrap();
    assert!(c.rand(&mut gen, &[i64::MAX, i64::MAX]).is_err());
}

/// Fixed (crate-wide `Elements::elements` instead of tch's `Tensor::numel`): tch multiplies the
/// dims in order, so a spec whose shape has no elements but a huge dim before the 0
/// (`[2, i64::MAX, 0]`) overflowed (a panic in debug builds) in `with_dtype`, `is_in`, `rand`
/// and `project`.
#[test]
fn regression_zero_element_spec_with_huge_dims() {
    // issue 29: [2, i64::MAX, 0] is now refused at construction (libtorch's strides
    // overflow); the largest extent accepted keeps exercising the zero-element paths
    assert!(Bounded::new(0.0, 1.0, [2, i64::MAX, 0]).is_err());
    let huge = i64::MAX / 16;
    let spec = Bounded::new(0.0, 1.0, [2, huge, 0])
        .unwrap()
        .with_dtype(Kind::Double)
        .unwrap();
    let mut gen = Generator::new(0);
    let _ = spec.rand(&mut gen, &[]);
    let cat = Categorical::new(3)
        .unwrap()
        .with_shape([2, huge, 0])
        .unwrap();
    let _ = cat.rand(&mut gen, &[]);
    let _ = format!("{spec} {cat}");
}
