//! Dynamic (`-1`, "any length") spec dims: TorchRL 0.14's recorded behaviour
//! (`specs/specs_dynamic_cases.json`, written by `specs/record_specs_dynamic.py`) replayed on
//! every leaf, hand-derived cases (bounds and masks along dynamic dims, indexing, resolving,
//! Composite), `check_env_specs` on an env whose lengths change per step, and
//! `KLRewardTransform`'s LLM reward shape.

use serde_json::Value;
use tch::nn;
use tch::{Device, Kind, Tensor};
use torchrl::envs::transforms::{KLRewardTransform, Transform};
use torchrl::envs::{check_env_specs, EnvBase, EnvCore, EnvSpecs, RolloutConfig};
use torchrl::modules::actors::{
    DistributionBuilder, ExplorationType, NormalParamExtractor, ProbabilisticActor,
};
use torchrl::modules::models::{MlpConfig, MLP};
use torchrl::modules::module::TdModule;
use torchrl::modules::sequential::TensorDictSequential;
use torchrl::specs::{
    stack_specs, Binary, Bounded, Categorical, Composite, MultiCategorical, MultiOneHot, NonTensor,
    OneHot, TensorSpec, Unbounded,
};
use torchrl::{BatchIndex, Entry, Error, Generator, TensorDict};

const CPU: Device = Device::Cpu;

// ------------------------------------------------------------------ recorded cases

fn cases() -> Vec<Value> {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/specs/specs_dynamic_cases.json"
    ))
    .expect("specs/specs_dynamic_cases.json (run specs/record_specs_dynamic.py)");
    let doc: Value = serde_json::from_str(&text).expect("json");
    assert_eq!(doc["torchrl"].as_str(), Some("0.14.1"));
    doc["cases"].as_array().expect("cases").clone()
}

fn ints(v: &Value) -> Vec<i64> {
    v.as_array()
        .unwrap_or_else(|| panic!("not a list: {v}"))
        .iter()
        .map(|x| x.as_i64().expect("int"))
        .collect()
}

fn safe(shape: &[i64]) -> Vec<i64> {
    shape.iter().map(|d| if *d < 0 { 1 } else { *d }).collect()
}

/// The spec a case describes, built at its concrete shape and then made dynamic.
fn build(desc: &Value) -> TensorSpec {
    let shape = ints(&desc["shape"]);
    let class = desc["class"].as_str().expect("class");
    let n = || desc["n"].as_i64().expect("n");
    let nvec = || ints(&desc["nvec"]);
    let r: torchrl::Result<TensorSpec> = (|| {
        Ok(match class {
            "Unbounded" => Unbounded::new().with_dynamic_shape(&shape)?.into(),
            "Bounded" => {
                let (lo, hi) = (
                    desc["low"].as_f64().unwrap(),
                    desc["high"].as_f64().unwrap(),
                );
                Bounded::new(lo, hi, safe(&shape))?
                    .with_dynamic_shape(&shape)?
                    .into()
            }
            "Categorical" => Categorical::new(n())?.with_dynamic_shape(&shape)?.into(),
            "OneHot" => OneHot::new(n())?.with_dynamic_shape(&shape)?.into(),
            "Binary" => Binary::new(*shape.last().unwrap())?
                .with_dynamic_shape(&shape)?
                .into(),
            "MultiCategorical" => MultiCategorical::new(nvec())?
                .with_dynamic_shape(&shape)?
                .into(),
            "MultiOneHot" => MultiOneHot::new(nvec())?.with_dynamic_shape(&shape)?.into(),
            "NonTensor" => NonTensor::new().with_dynamic_shape(&shape)?.into(),
            other => panic!("unknown class {other}"),
        })
    })();
    let spec = r.unwrap_or_else(|e| panic!("{desc}: {e}"));
    assert_eq!(spec.shape(), shape.as_slice(), "{desc}");
    assert!(spec.is_dynamic(), "{desc}");
    spec
}

fn value(spec: &TensorSpec, desc: &Value, v: &Value) -> Tensor {
    let shape = ints(&v["shape"]);
    let kind = spec.dtype().unwrap_or(Kind::Float);
    if v["fill"].as_str() == Some("onehot") {
        let t = Tensor::zeros(shape.as_slice(), (Kind::Float, CPU));
        let starts: Vec<i64> = if desc["class"] == "MultiOneHot" {
            let mut off = 0;
            ints(&desc["nvec"])
                .iter()
                .map(|n| {
                    let s = off;
                    off += n;
                    s
                })
                .collect()
        } else {
            vec![0]
        };
        for s in starts {
            let _ = t.narrow(-1, s, 1).fill_(1.0);
        }
        return t.to_kind(kind);
    }
    Tensor::full(
        shape.as_slice(),
        v["fill"].as_f64().expect("fill"),
        (Kind::Double, CPU),
    )
    .to_kind(kind)
}

fn index_items(v: &Value) -> Vec<BatchIndex> {
    v.as_array()
        .expect("index")
        .iter()
        .map(|i| match i {
            Value::String(s) if s == "..." => BatchIndex::Ellipsis,
            Value::String(s) if s == "none" => BatchIndex::NewAxis,
            _ if i.get("int").is_some() => BatchIndex::Int(i["int"].as_i64().unwrap()),
            _ if i.get("slice").is_some() => {
                BatchIndex::slice(i["slice"][0].as_i64(), i["slice"][1].as_i64(), 1)
            }
            _ if i.get("tensor").is_some() => {
                BatchIndex::Tensor(Tensor::from_slice(&ints(&i["tensor"])))
            }
            other => panic!("index item {other}"),
        })
        .collect()
}

fn entry_shape(e: &Entry) -> Vec<i64> {
    match e {
        Entry::Tensor(t) => t.size(),
        Entry::Dict(d) => d.batch_size().to_vec(),
    }
}

#[test]
fn recorded_is_in() {
    let mut n = 0;
    for case in cases().iter().filter(|c| c["op"] == "is_in") {
        let spec = build(&case["spec"]);
        let x = value(&spec, &case["spec"], &case["value"]);
        let got = spec.is_in(&Entry::Tensor(x.shallow_clone())).unwrap();
        // TorchRL raises when the value's shape does not broadcast with the spec's; `is_in`
        // answers false then (the documented deviation of the specs module).
        let expected = case["expect"].as_bool().unwrap_or(false);
        assert_eq!(got, expected, "{case}");
        // `check` agrees with `is_in` and names the key on failure.
        let checked = spec.check(&Entry::Tensor(x), "obs");
        assert_eq!(checked.is_ok(), expected, "{case}");
        if let Err(e) = checked {
            assert!(e.to_string().contains("\"obs\""), "{e}");
        }
        n += 1;
    }
    assert!(n >= 30, "{n} is_in cases");
}

#[test]
fn recorded_rand_zero_one() {
    let all = cases();
    let mut n = 0;
    for case in all
        .iter()
        .filter(|c| ["rand", "zero", "one"].contains(&c["op"].as_str().unwrap()))
    {
        let spec = build(&case["spec"]);
        let batch = ints(&case["batch"]);
        let op = case["op"].as_str().unwrap();
        let expected = if case["expect"] == "error" {
            // TorchRL 0.14's OneHot / MultiOneHot `rand` raise on a dynamic dim (a bug: they
            // skip `_safe_shape`); their `zero` and every other spec's `rand` build size 1
            // there, which is what `rand` does here too: the recorded zero shape.
            assert_eq!(op, "rand", "{case}");
            let zero = all
                .iter()
                .find(|c| {
                    c["op"] == "zero" && c["spec"] == case["spec"] && c["batch"] == case["batch"]
                })
                .expect("the zero case of the same spec");
            ints(&zero["expect"])
        } else {
            ints(&case["expect"])
        };
        let mut gen = Generator::new(7);
        let out = match op {
            "rand" => spec.rand(&mut gen, &batch),
            "zero" => spec.zero(&batch),
            _ => spec.one(&batch),
        }
        .unwrap_or_else(|e| panic!("{case}: {e}"));
        assert_eq!(entry_shape(&out), expected, "{case}");
        if op == "rand" {
            assert!(spec.is_in(&out).unwrap(), "{case}: rand is in the spec");
        }
        n += 1;
    }
    assert!(n >= 50, "{n} sampling cases");
}

#[test]
fn recorded_shape_ops() {
    let mut n = 0;
    for case in cases().iter() {
        let op = case["op"].as_str().unwrap();
        if !["expand", "index", "unsqueeze", "squeeze", "stack"].contains(&op) {
            continue;
        }
        let spec = build(&case["spec"]);
        let got = match op {
            "expand" => spec.expand(&ints(&case["target"])),
            "index" => spec.index(&index_items(&case["index"])),
            "unsqueeze" => spec.unsqueeze(case["dim"].as_i64().unwrap()),
            "squeeze" => spec.squeeze(case["dim"].as_i64()),
            _ => stack_specs(&[spec.clone(), spec.clone()], case["dim"].as_i64().unwrap()),
        };
        if case["expect"] == "error" {
            let e = got.expect_err(&format!("{case}: TorchRL raises"));
            assert!(!e.to_string().is_empty());
        } else {
            let s = got.unwrap_or_else(|e| panic!("{case}: {e}"));
            assert_eq!(s.shape(), ints(&case["expect"]).as_slice(), "{case}");
        }
        n += 1;
    }
    assert!(n >= 50, "{n} shape-op cases");
}

// ------------------------------------------------------------------ hand-derived

fn zeros(shape: &[i64], kind: Kind) -> Tensor {
    Tensor::zeros(shape, (kind, CPU))
}

#[test]
fn constructors_keep_refusing_negative_dims_and_opt_in_is_explicit() {
    // `with_shape` / `Bounded::new` / `expand` refuse -1 as before; dynamic dims are asked for.
    assert!(Unbounded::new().with_shape([2, -1]).is_err());
    assert!(Bounded::new(0.0, 1.0, [-1]).is_err());
    assert!(Unbounded::new()
        .with_shape([1])
        .unwrap()
        .expand(&[-1])
        .is_err());
    let e = Unbounded::new()
        .with_dynamic_shape([2, -2])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("-1 for a dynamic dim") && e.contains("[2, -2]"),
        "{e}"
    );
    // the categories dim cannot be dynamic
    let e = OneHot::new(1)
        .unwrap()
        .with_dynamic_shape([2, -1])
        .unwrap_err()
        .to_string();
    assert!(e.contains("Final dimension of OneHot"), "{e}");
    let c = Composite::new([2]).unwrap();
    assert!(
        Composite::new([-1]).is_err(),
        "a Composite's dims stay fixed"
    );
    let e = TensorSpec::from(c).make_neg_dim(0).unwrap_err().to_string();
    assert!(e.contains("Composite"), "{e}");
    // make_neg_dim: TorchRL's name, a new spec; the original is unchanged
    let u = Unbounded::new().with_shape([2, 4]).unwrap();
    let d = u.make_neg_dim(-1).unwrap();
    assert_eq!((u.shape(), d.shape()), (&[2i64, 4][..], &[2i64, -1][..]));
    assert!(!u.is_dynamic() && d.is_dynamic());
    assert_eq!(d.make_neg_dim(1).unwrap(), d, "already dynamic: unchanged");
    assert_ne!(d, Unbounded::new().with_shape([2, 1]).unwrap());
    assert_eq!(d.to_string(), "Unbounded(shape=[2, -1], dtype=Float)");
}

#[test]
fn check_reason_names_the_dynamic_rule() {
    let spec = Unbounded::new().with_dynamic_shape([2, -1]).unwrap();
    let e = spec
        .check(&zeros(&[3, 4], Kind::Float), "tokens")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("\"tokens\"") && e.contains("[3, 4]") && e.contains("[2, -1]"),
        "{e}"
    );
    assert!(e.contains("dynamic -1 dims take any size"), "{e}");
    // a fixed spec keeps its message
    let fixed = Unbounded::new().with_shape([2, 1]).unwrap();
    let e = fixed
        .check(&zeros(&[3, 4], Kind::Float), "x")
        .unwrap_err()
        .to_string();
    assert!(!e.contains("dynamic"), "{e}");
}

#[test]
fn bounds_broadcast_along_dynamic_dims() {
    // per-feature bounds [0, -1, 2] .. [1, 1, 3], the same at every step of the dynamic dim 0
    let low = Tensor::from_slice(&[0.0f32, -1.0, 2.0]).reshape([1, 3]);
    let high = Tensor::from_slice(&[1.0f32, 1.0, 3.0]).reshape([1, 3]);
    let b = Bounded::from_tensors(low, high)
        .unwrap()
        .make_neg_dim(0)
        .unwrap();
    assert_eq!(b.shape(), &[-1, 3]);
    assert_eq!(
        b.low().size(),
        vec![1, 3],
        "held bounds: size 1 at the dynamic dim"
    );
    // 4 steps: [0.5, 0, 2.5] is inside at every step
    let x = Tensor::from_slice(&[0.5f32, 0.0, 2.5]).repeat([4, 1]);
    assert!(b.is_in(&x).unwrap());
    // project clamps elementwise at any length: [5, 5, 5] -> [1, 1, 3], [-5, -5, -5] -> [0, -1, 2]
    let y = Tensor::from_slice(&[5.0f32, 5.0, 5.0, -5.0, -5.0, -5.0]).reshape([2, 3]);
    let p = b.project(&y).unwrap();
    assert_eq!(
        Vec::<f32>::try_from(p.reshape([-1])).unwrap(),
        vec![1.0, 1.0, 3.0, 0.0, -1.0, 2.0]
    );
    // rand at a chosen length stays in the bounds
    let r = b.resolve_shape(&[6, 3]).unwrap();
    assert_eq!((r.shape(), r.low().size()), (&[6i64, 3][..], vec![6, 3]));
    let s = r.rand(&mut Generator::new(1), &[]).unwrap();
    assert_eq!(s.size(), vec![6, 3]);
    assert!(b.is_in(&s).unwrap());
    // bounds that differ along a dim cannot make it dynamic
    let low = Tensor::from_slice(&[0.0f32, 1.0]).reshape([2, 1]);
    let high = Tensor::from_slice(&[2.0f32, 2.0]).reshape([2, 1]);
    let b2 = Bounded::from_tensors(low, high).unwrap();
    let e = b2.make_neg_dim(0).unwrap_err().to_string();
    assert!(e.contains("bounds") && e.contains("differ"), "{e}");
    assert_eq!(b2.make_neg_dim(1).unwrap().shape(), &[2, -1]);
    // Bounded::with_dynamic_shape expands, then marks: [1] -> [4, -1]
    let b3 = Bounded::new(-1.0, 1.0, [1])
        .unwrap()
        .with_dynamic_shape([4, -1])
        .unwrap();
    assert_eq!((b3.shape(), b3.low().size()), (&[4i64, -1][..], vec![4, 1]));
}

#[test]
fn masks_broadcast_along_dynamic_dims() {
    // classes {0, 2, 3} allowed (1 masked out), any number of tokens
    let mask = Tensor::from_slice(&[true, false, true, true]);
    let c = Categorical::new(4)
        .unwrap()
        .with_mask(mask)
        .unwrap()
        .with_dynamic_shape([-1])
        .unwrap();
    assert_eq!(c.mask().map(|m| m.size()), Some(vec![1, 4]));
    assert!(c.is_in(&Tensor::from_slice(&[0i64, 2, 3, 3, 0])).unwrap());
    assert!(
        !c.is_in(&Tensor::from_slice(&[0i64, 1])).unwrap(),
        "class 1 is masked"
    );
    // project: 1 -> nearest allowed, the lower on ties: 0
    let p = c.project(&Tensor::from_slice(&[1i64, 1, 1])).unwrap();
    assert_eq!(Vec::<i64>::try_from(&p).unwrap(), vec![0, 0, 0]);
    let draws = c
        .resolve_dynamic(200)
        .unwrap()
        .rand(&mut Generator::new(3), &[])
        .unwrap();
    assert_eq!(draws.size(), vec![200]);
    assert_eq!(
        draws.eq(1).any().int64_value(&[]),
        0,
        "never the masked class"
    );
    // one-hot rows with a mask
    let oh = OneHot::new(3)
        .unwrap()
        .with_mask(Tensor::from_slice(&[false, true, true]))
        .unwrap()
        .with_dynamic_shape([-1, 3])
        .unwrap();
    let first = Tensor::from_slice(&[true, false, false]).repeat([5, 1]);
    assert!(!oh.is_in(&first).unwrap(), "class 0 is masked");
    let second = Tensor::from_slice(&[false, true, false]).repeat([5, 1]);
    assert!(oh.is_in(&second).unwrap());
}

#[test]
fn index_rules_on_dynamic_dims() {
    let spec: TensorSpec = Unbounded::new()
        .with_dynamic_shape([3, -1, 2])
        .unwrap()
        .into();
    let sh = |idx: Vec<BatchIndex>| spec.index(&idx).map(|s| s.shape().to_vec());
    // [0] removes the fixed dim; [:, 0] picks a position of the dynamic dim
    assert_eq!(sh(vec![BatchIndex::Int(0)]).unwrap(), vec![-1, 2]);
    assert_eq!(
        sh(vec![BatchIndex::full(), BatchIndex::Int(0)]).unwrap(),
        vec![3, 2]
    );
    // `...` keeps the dynamic dim where it is; None inserts before it
    assert_eq!(
        sh(vec![BatchIndex::Ellipsis, BatchIndex::Int(1)]).unwrap(),
        vec![3, -1]
    );
    assert_eq!(
        sh(vec![BatchIndex::full(), BatchIndex::NewAxis]).unwrap(),
        vec![3, 1, -1, 2]
    );
    // an index tensor over the dynamic dim: its shape replaces the dim
    let t = Tensor::from_slice(&[0i64, 4, 2]);
    assert_eq!(
        sh(vec![BatchIndex::full(), BatchIndex::Tensor(t)]).unwrap(),
        vec![3, 3, 2]
    );
    // a slice on a fixed dim before it is fine
    assert_eq!(
        sh(vec![BatchIndex::slice(Some(1), None, 1)]).unwrap(),
        vec![2, -1, 2]
    );
    // a partial slice or a mask over the dynamic dim: unknown extent
    let e = sh(vec![
        BatchIndex::full(),
        BatchIndex::slice(None, Some(2), 1),
    ])
    .unwrap_err();
    assert!(
        e.to_string().contains("extent of the dimension is unknown"),
        "{e}"
    );
    let m = Tensor::from_slice(&[true, false, true]).reshape([1, 3]);
    let e = sh(vec![BatchIndex::full(), BatchIndex::Mask(m)]).unwrap_err();
    assert!(e.to_string().contains("dynamic"), "{e}");
    // a mask over fixed dims only is fine: 2 of the 3 rows
    let m = Tensor::from_slice(&[true, false, true]);
    assert_eq!(sh(vec![BatchIndex::Mask(m)]).unwrap(), vec![2, -1, 2]);
    // bounds follow the index
    let b = Bounded::new(-2.0, 2.0, [3, 1, 2])
        .unwrap()
        .make_neg_dim(1)
        .unwrap();
    let i = b.index(&[BatchIndex::Int(2)]).unwrap();
    assert_eq!((i.shape(), i.low().size()), (&[-1i64, 2][..], vec![1, 2]));
}

#[test]
fn resolve_and_encode() {
    let spec = Unbounded::new().with_dynamic_shape([2, -1]).unwrap();
    assert_eq!(spec.resolve_shape(&[2, 9]).unwrap().shape(), &[2, 9]);
    assert_eq!(spec.resolve_dynamic(0).unwrap().shape(), &[2, 0]);
    let e = spec.resolve_shape(&[3, 9]).unwrap_err().to_string();
    assert!(e.contains("[2, -1]") && e.contains("[3, 9]"), "{e}");
    assert!(spec.resolve_shape(&[2]).is_err(), "ndim differs");
    assert!(spec.resolve_dynamic(-3).is_err());
    let e = spec.encode(&[1.0, 2.0]).unwrap_err().to_string();
    assert!(e.contains("dynamic") && e.contains("resolve"), "{e}");
    let enc = spec
        .resolve_dynamic(1)
        .unwrap()
        .encode(&[1.0, 2.0])
        .unwrap();
    assert_eq!(enc.size(), vec![2, 1]);
    // squeeze never drops a dynamic dim; None on [1, -1] drops the 1
    let s = Unbounded::new().with_dynamic_shape([1, -1]).unwrap();
    assert_eq!(s.squeeze(None).unwrap().shape(), &[-1]);
    let s3 = Unbounded::new().with_dynamic_shape([1, -1, 1]).unwrap();
    assert_eq!(s3.squeeze(None).unwrap().shape(), &[-1]);
    assert_eq!(s3.squeeze(Some(1)).unwrap().shape(), &[1, -1, 1]);
}

#[test]
fn composite_with_dynamic_leaves() {
    let tokens = Unbounded::new()
        .with_dtype(Kind::Int64)
        .unwrap()
        .with_dynamic_shape([2, -1])
        .unwrap();
    let reward = Unbounded::new().with_dynamic_shape([2, -1, 1]).unwrap();
    let c = Composite::new([2])
        .unwrap()
        .with(("tokens", "response"), tokens.clone())
        .unwrap()
        .with("reward", reward)
        .unwrap();
    assert!(c.is_dynamic());
    assert!(!Composite::new([2])
        .unwrap()
        .with("x", Unbounded::new().with_shape([2]).unwrap())
        .unwrap()
        .is_dynamic());
    // a leaf whose batch dim is dynamic cannot sit under a batched Composite
    let bad = Unbounded::new().with_dynamic_shape([-1, 1]).unwrap();
    assert!(Composite::new([2]).unwrap().with("x", bad).is_err());
    // data of any length is in
    for len in [1, 6] {
        let td = TensorDict::new([2])
            .unwrap()
            .with(("tokens", "response"), zeros(&[2, len], Kind::Int64))
            .unwrap()
            .with("reward", zeros(&[2, len, 1], Kind::Float))
            .unwrap();
        assert!(c.is_in(&td).unwrap(), "len {len}");
    }
    let wrong = TensorDict::new([2])
        .unwrap()
        .with(("tokens", "response"), zeros(&[2, 3], Kind::Int64))
        .unwrap()
        .with("reward", zeros(&[2, 3, 2], Kind::Float))
        .unwrap();
    // [2, -1, 1] broadcasts its size-1 last dim (TorchRL's rule, recorded): in
    assert!(c.is_in(&wrong).unwrap());
    let wrong = wrong.with("reward", zeros(&[2, 3], Kind::Float)).unwrap();
    let e = c.check(&wrong).unwrap_err().to_string();
    assert!(e.contains("reward") && e.contains("[2, 3]"), "{e}");
    // zero / rand: size 1 at the dynamic dims; resolve_dynamic draws at a length
    let z = c.zero(&[]).unwrap();
    assert_eq!(z.get(("tokens", "response")).unwrap().size(), vec![2, 1]);
    let r = c.resolve_dynamic(4).unwrap();
    assert!(!r.is_dynamic());
    let td = r.rand(&mut Generator::new(0), &[]).unwrap();
    assert_eq!(td.get("reward").unwrap().size(), vec![2, 4, 1]);
    assert!(c.is_in(&td).unwrap());
    // expand adds batch dims; children keep their dynamic dims; the composite's stay fixed
    let x = c.expand(&[3, 2]).unwrap();
    assert_eq!(x.get(("tokens", "response")).unwrap().shape(), &[3, 2, -1]);
    assert!(c.expand(&[-1, 2]).is_err());
    // index the batch dim
    let i = c.index(&[BatchIndex::Int(0)]).unwrap();
    assert_eq!(i.get("reward").unwrap().shape(), &[-1, 1]);
    // stack identical dynamic specs
    let t: TensorSpec = tokens.into();
    assert_eq!(
        stack_specs(&[t.clone(), t.clone(), t], 0).unwrap().shape(),
        &[3, 2, -1]
    );
}

// ------------------------------------------------------------------ check_env_specs

/// A token env with batch [2]: the observations `("tokens", "response")` `[2, t]` and `"feat"`
/// `[2, t, 3]` grow by one token per step; `mode` breaks one contract on purpose. (The reward is
/// `[2, 1]`: `EnvBase::step` views rewards to their spec's shape, which a dynamic reward spec
/// has not; see the report of this change.)
struct Tokens {
    core: EnvCore,
    t: i64,
    mode: &'static str,
}

fn token_specs() -> EnvSpecs {
    let tokens = Unbounded::new()
        .with_dtype(Kind::Int64)
        .unwrap()
        .with_dynamic_shape([2, -1])
        .unwrap();
    EnvSpecs::new([2])
        .unwrap()
        .with_observation(("tokens", "response"), tokens)
        .unwrap()
        .with_observation(
            "feat",
            Bounded::new(-1.0, 1.0, [2, 1, 3])
                .unwrap()
                .make_neg_dim(1)
                .unwrap(),
        )
        .unwrap()
        .with_action(
            "action",
            Categorical::new(5).unwrap().with_shape([2]).unwrap(),
        )
        .unwrap()
        .with_reward("reward", Unbounded::new().with_shape([2, 1]).unwrap())
        .unwrap()
}

impl Tokens {
    fn new(mode: &'static str) -> Tokens {
        Tokens {
            core: EnvCore::new(token_specs()).unwrap(),
            t: 0,
            mode,
        }
    }
}

impl EnvBase for Tokens {
    fn core(&self) -> &EnvCore {
        &self.core
    }
    fn core_mut(&mut self) -> &mut EnvCore {
        &mut self.core
    }
    fn reset_impl(&mut self, _td: Option<&TensorDict>) -> torchrl::Result<TensorDict> {
        self.t = 1;
        TensorDict::new([2])?
            .with(("tokens", "response"), zeros(&[2, 1], Kind::Int64))?
            .with("feat", zeros(&[2, 1, 3], Kind::Float))
    }
    fn step_impl(&mut self, _td: &TensorDict) -> torchrl::Result<TensorDict> {
        self.t += 1;
        let tokens = Tensor::arange(self.t, (Kind::Int64, CPU)).repeat([2, 1]);
        let tokens = if self.mode == "extra_dim" {
            tokens.unsqueeze(-1)
        } else {
            tokens
        };
        let width = if self.mode == "wide_feat" { 4 } else { 3 };
        let kind = if self.mode == "double_feat" && self.t == 3 {
            Kind::Double
        } else {
            Kind::Float
        };
        TensorDict::new([2])?
            .with(("tokens", "response"), tokens)?
            .with("feat", Tensor::full([2, self.t, width], 0.5, (kind, CPU)))?
            .with("reward", Tensor::ones([2, 1], (Kind::Float, CPU)))?
            .with("done", zeros(&[2, 1], Kind::Bool))
    }
}

#[test]
fn check_env_specs_checks_each_step_of_a_dynamic_env() {
    let mut env = Tokens::new("ok");
    // The lengths differ per step: a rollout cannot stack them...
    assert!(env.rollout(3, None, &RolloutConfig::default()).is_err());
    // ...so the check steps the env and checks every step on its own.
    check_env_specs(&mut env, Some(0)).unwrap();
    assert_eq!(env.t, 4, "reset then 3 steps (the second pass)");
}

#[test]
fn check_env_specs_dynamic_errors_name_key_and_shapes() {
    // a fixed dim of "feat" differs (4 instead of 3) at the first step
    let e = check_env_specs(&mut Tokens::new("wide_feat"), Some(0)).unwrap_err();
    let Error::ShapeMismatch {
        key,
        expected,
        actual,
        ..
    } = &e
    else {
        panic!("{e}")
    };
    assert!(key.contains("feat"), "{e}");
    assert_eq!(
        (expected.as_slice(), actual.as_slice()),
        (&[2i64, -1, 3][..], &[2i64, 2, 4][..])
    );
    // tokens of the wrong ndim
    let e = check_env_specs(&mut Tokens::new("extra_dim"), Some(0)).unwrap_err();
    let Error::ShapeMismatch {
        key,
        expected,
        actual,
        ..
    } = &e
    else {
        panic!("{e}")
    };
    assert!(key.contains("tokens") && key.contains("response"), "{e}");
    assert_eq!(
        (expected.as_slice(), actual.as_slice()),
        (&[2i64, -1][..], &[2i64, 2, 1][..])
    );
    // a dtype change at the second step (t = 3) is found at that step
    let e = check_env_specs(&mut Tokens::new("double_feat"), Some(0)).unwrap_err();
    assert!(
        matches!(
            &e,
            Error::DtypeMismatch {
                actual: Kind::Double,
                ..
            }
        ),
        "{e}"
    );
}

// ------------------------------------------------------------------ KLRewardTransform specs

fn make_actor(p: &nn::Path) -> torchrl::Result<ProbabilisticActor> {
    let mlp = MLP::new(p, &MlpConfig::new(3, 2).with_depth(1).with_num_cells(4))?;
    let net = TensorDictSequential::new()
        .with(TdModule::new(mlp, ["observation"], ["param"])?)
        .with(NormalParamExtractor::new());
    let dist = DistributionBuilder::tanh_normal("loc", "scale", -2.0, 2.0)?;
    Ok(ProbabilisticActor::new(net, dist)
        .with_return_log_prob(true)
        .with_exploration_type(ExplorationType::Random)
        .with_seed(0))
}

fn kl_specs(leaf: &[i64], in_key: &str) -> EnvSpecs {
    let mut s = EnvSpecs::new([2])
        .unwrap()
        .with_action("action", Unbounded::new().with_shape([2, 1]).unwrap())
        .unwrap()
        .with_reward("reward", Unbounded::new().with_shape(leaf).unwrap())
        .unwrap();
    if in_key != "reward" {
        s = s
            .with_observation(in_key, Unbounded::new().with_shape(leaf).unwrap())
            .unwrap();
    }
    s
}

fn kl(in_key: &str, out_key: &str) -> KLRewardTransform {
    let vs = nn::VarStore::new(CPU);
    let _actor = make_actor(&vs.root()).unwrap();
    KLRewardTransform::new(&vs, make_actor)
        .unwrap()
        .with_in_keys([in_key])
        .unwrap()
        .with_out_keys([out_key])
        .unwrap()
}

#[test]
fn kl_reward_llm_shape_recorded() {
    let mut n = 0;
    for case in cases().iter().filter(|c| c["op"] == "kl_output_spec") {
        let (in_key, out_key) = (
            case["in_key"].as_str().unwrap(),
            case["out_key"].as_str().unwrap(),
        );
        let leaf = ints(&case["leaf_shape"]);
        let specs = kl(in_key, out_key)
            .transform_output_spec(kl_specs(&leaf, in_key))
            .unwrap_or_else(|e| panic!("{case}: {e}"));
        let written = if in_key == "reward" && out_key == "reward" {
            specs.reward.get("reward")
        } else {
            specs.observation.get(out_key)
        }
        .unwrap_or_else(|| panic!("{case}: no spec written"));
        assert_eq!(written.shape(), ints(&case["expect"]).as_slice(), "{case}");
        assert!(written.is_dynamic());
        if in_key == "reward" && out_key != "reward" {
            assert_eq!(
                specs.reward.get("reward").unwrap().shape(),
                leaf.as_slice(),
                "unchanged"
            );
        }
        n += 1;
    }
    assert_eq!(n, 3);
}

#[test]
fn kl_reward_shape_rule_hand_derived() {
    // TorchRL v0.10 (the classic class): len(S) <= 2 keeps S in the first two cases...
    let specs = kl("reward", "reward")
        .transform_output_spec(kl_specs(&[2, 1], "reward"))
        .unwrap();
    assert_eq!(specs.reward.get("reward").unwrap().shape(), &[2, 1]);
    let specs = kl("reward", "r_kl")
        .transform_output_spec(kl_specs(&[2, 1], "reward"))
        .unwrap();
    assert_eq!(specs.observation.get("r_kl").unwrap().shape(), &[2, 1]);
    // ...and (*S[:-2], -1, 1) otherwise: [2, 7, 3] -> [2, -1, 1]
    let specs = kl("reward", "reward")
        .transform_output_spec(kl_specs(&[2, 7, 3], "reward"))
        .unwrap();
    assert_eq!(specs.reward.get("reward").unwrap().shape(), &[2, -1, 1]);
    // [2, 3, 4, 1] -> [2, 3, -1, 1]
    let specs = kl("reward", "r_kl")
        .transform_output_spec(kl_specs(&[2, 3, 4, 1], "reward"))
        .unwrap();
    assert_eq!(
        specs.observation.get("r_kl").unwrap().shape(),
        &[2, 3, -1, 1]
    );
    // in != "reward": every shape is rewritten, so a [2, 1] observation becomes [-1, 1], whose
    // -1 lands on the batch dim: refused (TorchRL's Composite raises as well)
    let e = kl("other", "other_kl")
        .transform_output_spec(kl_specs(&[2, 1], "other"))
        .unwrap_err();
    let msg = format!("{e}");
    assert!(
        msg.contains("other_kl") && msg.contains("[-1, 1]") && msg.contains("[2, 1]"),
        "{msg}"
    );
    // a Bounded reward keeps its bounds when only a dim becomes dynamic
    let bounded = Bounded::new(-1.0, 1.0, [2, 5, 1]).unwrap();
    let s = EnvSpecs::new([2])
        .unwrap()
        .with_action("action", Unbounded::new().with_shape([2, 1]).unwrap())
        .unwrap()
        .with_reward("reward", bounded)
        .unwrap();
    let out = kl("reward", "r_kl").transform_output_spec(s).unwrap();
    match out.observation.get("r_kl").unwrap() {
        TensorSpec::Bounded(b) => {
            assert_eq!(b.shape(), &[2, -1, 1]);
            assert_eq!(b.low().size(), vec![2, 1, 1]);
            assert!(b.is_in(&zeros(&[2, 9, 1], Kind::Float)).unwrap());
        }
        other => panic!("{other}"),
    }
}
