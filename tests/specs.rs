//! Behaviour tests of the TensorSpec family through the public API.
//!
//! Expected values are derived by hand (in the comments) from TorchRL 0.14.1's documented
//! semantics; property tests (rand is always in the spec, project always lands in it, same seed
//! gives the same samples) loop over many seeds.

use tch::{Device, Kind, Tensor};
use torchrl::specs::{
    stack_specs, Binary, Bounded, Categorical, Composite, MultiCategorical, MultiOneHot, NonTensor,
    OneHot, Recurse, TensorSpec, Unbounded,
};
use torchrl::tensordict::KeysOptions;
use torchrl::{BatchIndex, Entry, Error, Generator, NestedKey, TensorDict};

const CPU: Device = Device::Cpu;

fn f64s(t: &Tensor) -> Vec<f64> {
    Vec::<f64>::try_from(&t.reshape([-1])).expect("values")
}

fn i64s(t: &Tensor) -> Vec<i64> {
    Vec::<i64>::try_from(&t.reshape([-1])).expect("values")
}

fn bools(t: &Tensor) -> Vec<bool> {
    Vec::<bool>::try_from(&t.reshape([-1])).expect("values")
}

fn tensor(e: Entry) -> Tensor {
    match e {
        Entry::Tensor(t) => t,
        Entry::Dict(_) => panic!("expected a tensor"),
    }
}

fn keys(c: &Composite, nested: bool, leaves: bool) -> Vec<String> {
    c.keys(KeysOptions {
        nested,
        leaves_only: leaves,
    })
    .iter()
    .map(|k| k.to_string())
    .collect()
}

/// One spec of every leaf class, in several configurations.
fn leaf_specs() -> Vec<TensorSpec> {
    let mask = Tensor::from_slice(&[true, false, true, false]);
    vec![
        Unbounded::new().into(),
        Unbounded::new().with_shape([2, 3]).unwrap().into(),
        Unbounded::new().with_dtype(Kind::Int64).unwrap().into(),
        Unbounded::new().with_dtype(Kind::Uint8).unwrap().into(),
        Unbounded::new().with_dtype(Kind::Bool).unwrap().into(),
        Unbounded::new().with_dtype(Kind::Double).unwrap().into(),
        Bounded::new(-1.0, 1.0, [3]).unwrap().into(),
        Bounded::new(0.1, 0.2, [2, 2]).unwrap().into(),
        Bounded::new(2.0, 5.0, [3])
            .unwrap()
            .with_dtype(Kind::Int64)
            .unwrap()
            .into(),
        Bounded::new(-3.0, 3.0, [2])
            .unwrap()
            .with_dtype(Kind::Int8)
            .unwrap()
            .into(),
        Bounded::from_tensors(
            Tensor::from_slice(&[0.0f32, -10.0, 5.0]),
            Tensor::from_slice(&[0.0f32, 10.0, 6.0]),
        )
        .unwrap()
        .into(),
        Categorical::new(3).unwrap().into(),
        Categorical::new(5).unwrap().with_shape([2]).unwrap().into(),
        Categorical::new(4)
            .unwrap()
            .with_shape([3])
            .unwrap()
            .with_mask(mask.shallow_clone())
            .unwrap()
            .into(),
        Categorical::new(3)
            .unwrap()
            .with_dtype(Kind::Float)
            .unwrap()
            .into(),
        OneHot::new(4).unwrap().into(),
        OneHot::new(4)
            .unwrap()
            .with_shape([2, 4])
            .unwrap()
            .with_mask(mask)
            .unwrap()
            .into(),
        OneHot::new(3)
            .unwrap()
            .with_dtype(Kind::Int64)
            .unwrap()
            .into(),
        Binary::new(3).unwrap().into(),
        Binary::new(2)
            .unwrap()
            .with_dtype(Kind::Bool)
            .unwrap()
            .into(),
        MultiCategorical::new(vec![3, 4]).unwrap().into(),
        MultiCategorical::new(vec![2, 5, 1])
            .unwrap()
            .with_shape([2, 3])
            .unwrap()
            .into(),
        MultiOneHot::new(vec![2, 3]).unwrap().into(),
        NonTensor::new().into(),
    ]
}

fn nested_composite() -> Composite {
    // shape [5]; a: Bounded [5, 10]; b: Categorical(3) [5]; n: Composite [5] { x: OneHot(4) [5, 4] }
    Composite::new([5])
        .unwrap()
        .with("a", Bounded::new(0.0, 1.0, [5, 10]).unwrap())
        .unwrap()
        .with("b", Categorical::new(3).unwrap().with_shape([5]).unwrap())
        .unwrap()
        .with(
            ("n", "x"),
            OneHot::new(4).unwrap().with_shape([5, 4]).unwrap(),
        )
        .unwrap()
}

// ------------------------------------------------------------------ constructors

/// TorchRL 0.14's `Binary` is a `Categorical` built with `n=2` (`torchrl/data/tensor_specs.py`):
/// `Binary(3).n == 2` whatever the length, and the length is `shape[-1]`.
#[test]
fn binary_n_is_torchrl_cardinality_and_length_is_the_last_dim() {
    for len in [0i64, 1, 3, 7] {
        let b = Binary::new(len).unwrap();
        assert_eq!(b.n(), 2, "Binary::new({len}).n()");
        assert_eq!(b.length(), len);
        let shaped = b.with_shape([4, len]).unwrap();
        assert_eq!((shaped.n(), shaped.length()), (2, len));
    }
    // with_shape checks the last dim against the length, not against n = 2.
    assert!(Binary::new(3).unwrap().with_shape([2, 2]).is_err());
    assert!(Binary::new(3).unwrap().with_shape([2, 3]).is_ok());
}

#[test]
fn default_shapes_and_dtypes() {
    let u = Unbounded::new();
    assert_eq!((u.shape(), u.dtype()), (&[1i64][..], Kind::Float));
    let c = Categorical::new(3).unwrap();
    assert_eq!((c.shape(), c.dtype(), c.n()), (&[][..], Kind::Int64, 3));
    let o = OneHot::new(4).unwrap();
    assert_eq!((o.shape(), o.dtype()), (&[4i64][..], Kind::Bool));
    let b = Binary::new(3).unwrap();
    assert_eq!(
        (b.shape(), b.dtype(), b.length()),
        (&[3i64][..], Kind::Int8, 3)
    );
    // nvec [3, 4] → shape [2]; [2, 3] → shape [5]
    assert_eq!(MultiCategorical::new(vec![3, 4]).unwrap().shape(), &[2]);
    assert_eq!(MultiOneHot::new(vec![2, 3]).unwrap().shape(), &[5]);
    assert_eq!(NonTensor::new().shape(), &[1]);
    // Bounded(-1, 1, [2]): low and high broadcast to [2]
    let bd = Bounded::new(-1.0, 1.0, [2]).unwrap();
    assert_eq!(f64s(bd.low()), vec![-1.0, -1.0]);
    assert_eq!(f64s(bd.high()), vec![1.0, 1.0]);
    assert!(!bd.is_discrete());
    assert!(Bounded::new(0.0, 5.0, [3])
        .unwrap()
        .with_dtype(Kind::Int64)
        .unwrap()
        .is_discrete());
}

#[test]
fn invalid_constructors_error() {
    assert!(Bounded::new(1.0, -1.0, [2]).is_err(), "low > high");
    assert!(Bounded::new(f64::NAN, 1.0, [2]).is_err());
    assert!(Bounded::new(0.0, 1.0, [-2]).is_err());
    // low [2] vs high [3] do not broadcast
    assert!(Bounded::from_tensors(
        Tensor::from_slice(&[0.0f32, 0.0]),
        Tensor::from_slice(&[1.0f32, 1.0, 1.0])
    )
    .is_err());
    // low > high at position 1
    let err = Bounded::from_tensors(
        Tensor::from_slice(&[0.0f32, 2.0]),
        Tensor::from_slice(&[1.0f32, 1.0]),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("[1]"), "{err}");
    // shapes inferred by broadcasting: low [2, 1] and high [3] → [2, 3]
    let b = Bounded::from_tensors(
        Tensor::from_slice(&[0.0f32, 1.0]).reshape([2, 1]),
        Tensor::from_slice(&[5.0f32, 6.0, 7.0]),
    )
    .unwrap();
    assert_eq!(b.shape(), &[2, 3]);
    assert_eq!(f64s(b.low()), vec![0.0, 0.0, 0.0, 1.0, 1.0, 1.0]);
    assert!(Categorical::new(0).is_err());
    let err = OneHot::new(4)
        .unwrap()
        .with_shape([3])
        .unwrap_err()
        .to_string();
    assert!(err.contains("n=4") && err.contains("[3]"), "{err}");
    let err = Binary::new(3)
        .unwrap()
        .with_shape([4])
        .unwrap_err()
        .to_string();
    assert!(err.contains("n=3") && err.contains("[4]"), "{err}");
    assert!(MultiCategorical::new(vec![]).is_err());
    assert!(MultiOneHot::new(vec![2, 0]).is_err());
    assert!(Unbounded::new().with_dtype(Kind::ComplexFloat).is_err());
    // a mask that does not broadcast to [*shape, n] = [3]
    assert!(Categorical::new(3)
        .unwrap()
        .with_mask(Tensor::from_slice(&[true, false]))
        .is_err());
    // a non-bool mask
    assert!(Categorical::new(3)
        .unwrap()
        .with_mask(Tensor::from_slice(&[1i64, 0, 1]))
        .is_err());
}

// ------------------------------------------------------------------ is_in / check

#[test]
fn is_in_shape_dtype_and_values() {
    let b = Bounded::new(-1.0, 1.0, [2]).unwrap();
    assert!(b.is_in(&Tensor::from_slice(&[-1.0f32, 0.5])).unwrap());
    assert!(!b.is_in(&Tensor::from_slice(&[-1.0f32, 1.5])).unwrap());
    // wrong dtype → Ok(false)
    assert!(!b.is_in(&Tensor::from_slice(&[0.0f64, 0.0])).unwrap());
    // extra leading batch dims are allowed
    assert!(b.is_in(&Tensor::zeros([4, 2], (Kind::Float, CPU))).unwrap());
    // Unbounded [1] accepts [3] (broadcast), [2] does not accept [3]
    let u1 = Unbounded::new();
    assert!(u1.is_in(&Tensor::zeros([3], (Kind::Float, CPU))).unwrap());
    let u2 = Unbounded::new().with_shape([2]).unwrap();
    assert!(!u2.is_in(&Tensor::zeros([3], (Kind::Float, CPU))).unwrap());
    assert!(!u2.is_in(&Tensor::zeros([2], (Kind::Double, CPU))).unwrap());

    let c = Categorical::new(3).unwrap();
    assert!(c.is_in(&Tensor::from(2i64)).unwrap());
    assert!(!c.is_in(&Tensor::from(3i64)).unwrap());
    assert!(!c.is_in(&Tensor::from(-1i64)).unwrap());
    assert!(!c.is_in(&Tensor::from(1i32)).unwrap(), "int32 is not int64");

    let o = OneHot::new(3).unwrap();
    assert!(o.is_in(&Tensor::from_slice(&[false, true, false])).unwrap());
    assert!(!o.is_in(&Tensor::from_slice(&[true, true, false])).unwrap());
    assert!(!o
        .is_in(&Tensor::from_slice(&[false, false, false]))
        .unwrap());
    let bin = Binary::new(3).unwrap();
    assert!(!bin.is_in(&Tensor::from_slice(&[0i8, 1, 2])).unwrap());
    let mc = MultiCategorical::new(vec![3, 4]).unwrap();
    assert!(mc.is_in(&Tensor::from_slice(&[2i64, 3])).unwrap());
    assert!(!mc.is_in(&Tensor::from_slice(&[3i64, 3])).unwrap());
    let moh = MultiOneHot::new(vec![2, 3]).unwrap();
    assert!(!moh
        .is_in(&Tensor::from_slice(&[true, true, false, true, false]))
        .unwrap());
    assert!(moh
        .is_in(&Tensor::from_slice(&[false, true, false, false, true]))
        .unwrap());
}

#[test]
fn check_explains_why() {
    let b = Bounded::new(-1.0, 1.0, [2]).unwrap();
    // values [[-3, 0.5], [0, 2]]: 2 of 4 out, min -3, max 2, first at [0, 0]
    let v = Tensor::from_slice(&[-3.0f32, 0.5, 0.0, 2.0]).reshape([2, 2]);
    let err = b.check(&v, ("next", "obs")).unwrap_err();
    assert!(matches!(err, Error::NotInSpec { .. }));
    let msg = err.to_string();
    for fact in [
        r#"("next", "obs")"#,
        "Bounded(shape=[2], dtype=Float, low=-1, high=1)",
        "2 of 4",
        "min=-3",
        "max=2",
        "[0, 0]",
    ] {
        assert!(msg.contains(fact), "missing {fact:?} in {msg}");
    }
    let msg = b
        .check(&Tensor::zeros([2], (Kind::Double, CPU)), "obs")
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("dtype") && msg.contains("Double") && msg.contains("Float"),
        "{msg}"
    );
    let msg = b
        .check(&Tensor::zeros([3], (Kind::Float, CPU)), "obs")
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("shape") && msg.contains("[3]") && msg.contains("[2]"),
        "{msg}"
    );
    assert!(b
        .check(&Tensor::zeros([2], (Kind::Float, CPU)), "obs")
        .is_ok());

    let c = Categorical::new(3).unwrap().with_shape([3]).unwrap();
    let msg = c
        .check(&Tensor::from_slice(&[0i64, 5, 1]), "action")
        .unwrap_err()
        .to_string();
    assert!(msg.contains("max=5") && msg.contains("[0, 2]"), "{msg}");
}

#[test]
fn tensor_spec_entry_dispatch() {
    let spec: TensorSpec = Bounded::new(0.0, 1.0, [2]).unwrap().into();
    let td = TensorDict::new([]).unwrap();
    // a tensordict for a leaf is not in it; check says why
    assert!(!spec.is_in(&Entry::Dict(td.clone())).unwrap());
    let msg = spec.check(&Entry::Dict(td), "x").unwrap_err().to_string();
    assert!(msg.contains("expected a tensor"), "{msg}");
    let comp: TensorSpec = Composite::new([]).unwrap().into();
    assert!(!comp
        .is_in(&Entry::Tensor(Tensor::zeros([1], (Kind::Float, CPU))))
        .unwrap());
    assert_eq!(comp.dtype(), None);
    assert_eq!(comp.device(), None);
    assert_eq!(spec.device(), Some(CPU));
    assert_eq!(spec.class_name(), "Bounded");
    assert!(comp.encode(&[1.0]).is_err());
}

// ------------------------------------------------------------------ project

#[test]
fn project_hand_values() {
    // Bounded(-1, 1, [2]).project([-3, 2]) = [-1, 1]
    let b = Bounded::new(-1.0, 1.0, [2]).unwrap();
    let p = b.project(&Tensor::from_slice(&[-3.0f32, 2.0])).unwrap();
    assert_eq!(f64s(&p), vec![-1.0, 1.0]);
    // batched [[-3, 0.5], [2, 0.25]] → [[-1, 0.5], [1, 0.25]]
    let p = b
        .project(&Tensor::from_slice(&[-3.0f32, 0.5, 2.0, 0.25]).reshape([2, 2]))
        .unwrap();
    assert_eq!(f64s(&p), vec![-1.0, 0.5, 1.0, 0.25]);
    // NaN → low
    let p = b.project(&Tensor::from_slice(&[f32::NAN, 0.0])).unwrap();
    assert_eq!(f64s(&p), vec![-1.0, 0.0]);
    // per-element bounds low [0, -10], high [1, 10]: [5, -20] → [1, -10]
    let be = Bounded::from_tensors(
        Tensor::from_slice(&[0.0f32, -10.0]),
        Tensor::from_slice(&[1.0f32, 10.0]),
    )
    .unwrap();
    assert_eq!(
        f64s(&be.project(&Tensor::from_slice(&[5.0f32, -20.0])).unwrap()),
        vec![1.0, -10.0]
    );

    // Categorical(3).project(5) = 2; [5, -1, 1] → [2, 0, 1]
    let c = Categorical::new(3).unwrap();
    assert_eq!(i64s(&c.project(&Tensor::from(5i64)).unwrap()), vec![2]);
    let c3 = Categorical::new(3).unwrap().with_shape([3]).unwrap();
    let p = c3.project(&Tensor::from_slice(&[5i64, -1, 1])).unwrap();
    assert_eq!(i64s(&p), vec![2, 0, 1]);
    // float values into an int spec: round(1.6) = 2, clamp(5) = 2, cast to int64
    let c2 = Categorical::new(3).unwrap().with_shape([2]).unwrap();
    let p = c2.project(&Tensor::from_slice(&[1.6f32, 5.0])).unwrap();
    assert_eq!((i64s(&p), p.kind()), (vec![2, 2], Kind::Int64));
    // a float Categorical keeps 1.6: already in (0 <= 1.6 < 3)
    let cf = Categorical::new(3)
        .unwrap()
        .with_dtype(Kind::Float)
        .unwrap();
    let p = cf.project(&Tensor::from(1.6f32)).unwrap();
    assert!((f64s(&p)[0] - 1.6).abs() < 1e-6);
    // masked: class 1 forbidden → nearest allowed, ties to the lower (0)
    let cm = Categorical::new(4)
        .unwrap()
        .with_shape([2])
        .unwrap()
        .with_mask(Tensor::from_slice(&[true, false, true, false]))
        .unwrap();
    let p = cm.project(&Tensor::from_slice(&[1i64, 3])).unwrap();
    assert_eq!(i64s(&p), vec![0, 2]);

    // OneHot picks the argmax: scores [0.1, 0.7, 0.2] → [F, T, F]
    let o = OneHot::new(3).unwrap();
    let p = o.project(&Tensor::from_slice(&[0.1f32, 0.7, 0.2])).unwrap();
    assert_eq!(
        (bools(&p), p.kind()),
        (vec![false, true, false], Kind::Bool)
    );
    // masked OneHot: class 1 forbidden → the best allowed is class 2
    let om = OneHot::new(3)
        .unwrap()
        .with_mask(Tensor::from_slice(&[true, false, true]))
        .unwrap();
    let p = om
        .project(&Tensor::from_slice(&[0.1f32, 0.7, 0.2]))
        .unwrap();
    assert_eq!(bools(&p), vec![false, false, true]);

    // Binary: [0, 1, 2] → [0, 1, 1]; floats round: [0.4, 0.6, -3] → [0, 1, 0]
    let bin = Binary::new(3).unwrap();
    assert_eq!(
        i64s(&bin.project(&Tensor::from_slice(&[0i8, 1, 2])).unwrap()),
        vec![0, 1, 1]
    );
    assert_eq!(
        i64s(
            &bin.project(&Tensor::from_slice(&[0.4f32, 0.6, -3.0]))
                .unwrap()
        ),
        vec![0, 1, 0]
    );
    // MultiCategorical nvec [3, 4]: [5, 9] → [2, 3]; [-1, 2] → [0, 2]
    let mc = MultiCategorical::new(vec![3, 4]).unwrap();
    let p = mc
        .project(&Tensor::from_slice(&[5i64, 9, -1, 2]).reshape([2, 2]))
        .unwrap();
    assert_eq!(i64s(&p), vec![2, 3, 0, 2]);
    // MultiOneHot [2, 3]: scores [0.9, 0.1 | 0.2, 0.3, 0.5] → [T, F | F, F, T]
    let moh = MultiOneHot::new(vec![2, 3]).unwrap();
    let p = moh
        .project(&Tensor::from_slice(&[0.9f32, 0.1, 0.2, 0.3, 0.5]))
        .unwrap();
    assert_eq!(bools(&p), vec![true, false, false, false, true]);
    // a value already in the spec is returned unchanged (same storage)
    let x = Tensor::from_slice(&[0.5f32, -0.5]);
    let p = b.project(&x).unwrap();
    assert_eq!(p.data_ptr(), x.data_ptr());
    // projection never reshapes
    assert!(b.project(&Tensor::zeros([3], (Kind::Float, CPU))).is_err());
}

#[test]
fn project_always_lands_in_spec() {
    for (i, spec) in leaf_specs().iter().enumerate() {
        if matches!(spec, TensorSpec::NonTensor(_)) {
            continue;
        }
        for seed in 0..20u64 {
            let mut g = Generator::new(seed);
            let mut shape = vec![3];
            shape.extend_from_slice(spec.shape());
            // arbitrary real values, far out of most domains
            let raw = g.normal(&shape, 0.0, 10.0, Kind::Float, CPU).unwrap();
            let p = spec.project(&Entry::Tensor(raw)).unwrap();
            assert!(
                spec.is_in(&p).unwrap(),
                "spec #{i} {spec} seed {seed}: projection not in spec"
            );
        }
    }
}

#[test]
fn composite_project_only_leaves_not_in() {
    let spec = Composite::new([])
        .unwrap()
        .with("a", Bounded::new(0.0, 1.0, [2]).unwrap())
        .unwrap()
        .with("b", Bounded::new(0.0, 1.0, [2]).unwrap())
        .unwrap();
    let a = Tensor::from_slice(&[0.25f32, 0.75]);
    let td = TensorDict::new([])
        .unwrap()
        .with("a", a.shallow_clone())
        .unwrap()
        .with("b", Tensor::from_slice(&[-1.0f32, 3.0]))
        .unwrap();
    let out = spec.project(&td).unwrap();
    // a is in: same storage; b: clamp([-1, 3], 0, 1) = [0, 1]
    assert_eq!(out.get("a").unwrap().data_ptr(), a.data_ptr());
    assert_eq!(f64s(out.get("b").unwrap()), vec![0.0, 1.0]);
    assert!(spec.is_in(&out).unwrap());
    // the input is not modified
    assert_eq!(f64s(td.get("b").unwrap()), vec![-1.0, 3.0]);
}

// ------------------------------------------------------------------ rand

#[test]
fn rand_is_always_in_spec() {
    for (i, spec) in leaf_specs().iter().enumerate() {
        for seed in 0..50u64 {
            let mut g = Generator::new(seed);
            for batch in [&[][..], &[4][..], &[2, 3][..]] {
                let x = tensor(spec.rand(&mut g, batch).unwrap());
                let mut expected = batch.to_vec();
                expected.extend_from_slice(spec.shape());
                assert_eq!(x.size(), expected, "spec #{i} {spec}");
                if let Some(k) = spec.dtype() {
                    assert_eq!(x.kind(), k, "spec #{i} {spec}");
                }
                assert!(
                    spec.is_in(&Entry::Tensor(x)).unwrap(),
                    "spec #{i} {spec} seed {seed} batch {batch:?}"
                );
            }
        }
    }
    let comp = nested_composite();
    for seed in 0..50u64 {
        let td = comp.rand(&mut Generator::new(seed), &[2]).unwrap();
        assert_eq!(td.batch_size(), &[2, 5]);
        assert_eq!(td.get(("n", "x")).unwrap().size(), vec![2, 5, 4]);
        assert!(comp.is_in(&td).unwrap());
        assert!(comp.check(&td).is_ok());
    }
}

#[test]
fn rand_covers_the_domain() {
    // Bounded int [2, 5] over 3 entries × 200 draws: every value 2..=5 appears, nothing else
    let b = Bounded::new(2.0, 5.0, [3])
        .unwrap()
        .with_dtype(Kind::Int64)
        .unwrap();
    let x = b.rand(&mut Generator::new(0), &[200]).unwrap();
    let v = i64s(&x);
    for k in 2..=5 {
        assert!(v.contains(&k), "value {k} never drawn");
    }
    assert!(v.iter().all(|x| (2..=5).contains(x)));
    // masked Categorical never draws 1 or 3
    let c = Categorical::new(4)
        .unwrap()
        .with_mask(Tensor::from_slice(&[true, false, true, false]))
        .unwrap();
    let v = i64s(&c.rand(&mut Generator::new(1), &[300]).unwrap());
    assert!(v.iter().all(|x| *x == 0 || *x == 2));
    assert!(v.contains(&0) && v.contains(&2));
    // clearing the mask restores every class
    let mut c = c;
    c.update_mask(None).unwrap();
    let v = i64s(&c.rand(&mut Generator::new(1), &[300]).unwrap());
    assert!((0..4).all(|k| v.contains(&k)));
    // a mask with an all-false row cannot be sampled
    let dead = Categorical::new(2)
        .unwrap()
        .with_mask(Tensor::from_slice(&[false, false]))
        .unwrap();
    assert!(dead.rand(&mut Generator::new(0), &[]).is_err());
}

#[test]
fn same_seed_same_samples() {
    let comp = nested_composite()
        .with("u", Unbounded::new().with_shape([5, 2]).unwrap())
        .unwrap()
        .with(
            "m",
            MultiOneHot::new(vec![2, 2])
                .unwrap()
                .with_shape([5, 4])
                .unwrap(),
        )
        .unwrap();
    let a = comp.rand(&mut Generator::new(42), &[3]).unwrap();
    let b = comp.rand(&mut Generator::new(42), &[3]).unwrap();
    let c = comp.rand(&mut Generator::new(43), &[3]).unwrap();
    let mut differs = false;
    for ((ka, ta), (kb, tb)) in a.leaves().iter().zip(b.leaves().iter()) {
        assert_eq!(ka, kb);
        assert!(ta.equal(tb), "{ka} differs for the same seed");
        let tc = c.get(ka).unwrap();
        differs |= !ta.equal(tc);
    }
    assert!(differs, "another seed gives other samples");
    // a cloned generator continues identically
    let mut g = Generator::new(5);
    let _ = g.next_u64();
    let mut h = g.clone();
    assert_eq!(g.next_u64(), h.next_u64());
}

// ------------------------------------------------------------------ zero / one / encode

#[test]
fn zero_one_and_encode() {
    // zero ignores the bounds [2, 3]
    let b = Bounded::new(2.0, 3.0, [2]).unwrap();
    assert_eq!(f64s(&b.zero(&[]).unwrap()), vec![0.0, 0.0]);
    let bi = Bounded::new(2.0, 5.0, [2])
        .unwrap()
        .with_dtype(Kind::Int64)
        .unwrap();
    assert_eq!(i64s(&bi.one(&[]).unwrap()), vec![1, 1]);
    let c = Categorical::new(3).unwrap();
    let one = c.one(&[2]).unwrap();
    assert_eq!((i64s(&one), one.kind()), (vec![1, 1], Kind::Int64));
    // OneHot one is all true, zero all false
    let o = OneHot::new(3).unwrap();
    assert_eq!(bools(&o.one(&[]).unwrap()), vec![true; 3]);
    assert_eq!(o.zero(&[2]).unwrap().size(), vec![2, 3]);
    assert_eq!(
        i64s(&Binary::new(3).unwrap().one(&[]).unwrap()),
        vec![1, 1, 1]
    );
    let u = Unbounded::new().with_shape([2]).unwrap();
    assert_eq!(u.zero(&[3]).unwrap().size(), vec![3, 2]);

    // OneHot(3).encode(2) = [F, F, T]; shape [2, 3] with [2, 0] → [[F, F, T], [T, F, F]]
    assert_eq!(bools(&o.encode(&[2.0]).unwrap()), vec![false, false, true]);
    let o2 = OneHot::new(3).unwrap().with_shape([2, 3]).unwrap();
    assert_eq!(
        bools(&o2.encode(&[2.0, 0.0]).unwrap()),
        vec![false, false, true, true, false, false]
    );
    assert!(o.encode(&[3.0]).is_err(), "3 is not a class of n=3");
    assert!(o.encode(&[1.5]).is_err());
    // Categorical encode 2 → scalar int64 2; a list of 2 values does not fit shape []
    let e = c.encode(&[2.0]).unwrap();
    assert_eq!((e.size(), i64s(&e)), (vec![], vec![2]));
    let msg = c.encode(&[1.0, 2.0]).unwrap_err().to_string();
    assert!(msg.contains("[2]") && msg.contains("[]"), "{msg}");
    // Bounded encode does not check the range
    let bb = Bounded::new(-1.0, 1.0, [2]).unwrap();
    assert_eq!(f64s(&bb.encode(&[3.0, 0.0]).unwrap()), vec![3.0, 0.0]);
    assert!(NonTensor::new().encode(&[1.0]).is_err());
}

#[test]
fn composite_zero_skips_none() {
    // shape [2]: a Bounded [2, 3], skip None, n.x OneHot(4) [2, 4]; zero([5]) → batch [5, 2]
    let spec = Composite::new([2])
        .unwrap()
        .with("a", Bounded::new(0.0, 1.0, [2, 3]).unwrap())
        .unwrap()
        .with_none("skip")
        .unwrap()
        .with(
            ("n", "x"),
            OneHot::new(4).unwrap().with_shape([2, 4]).unwrap(),
        )
        .unwrap();
    let td = spec.zero(&[5]).unwrap();
    assert_eq!(td.batch_size(), &[5, 2]);
    assert!(!td.contains("skip"));
    assert_eq!(td.get("a").unwrap().size(), vec![5, 2, 3]);
    assert_eq!(td.get_dict("n").unwrap().batch_size(), &[5, 2]);
    assert_eq!(td.get(("n", "x")).unwrap().size(), vec![5, 2, 4]);
    let ones = spec.one(&[]).unwrap();
    assert_eq!(bools(ones.get(("n", "x")).unwrap()), vec![true; 8]);
}

// ------------------------------------------------------------------ shape ops

#[test]
fn expand_rules() {
    let u = Unbounded::new().with_shape([2]).unwrap();
    let msg = u.expand(&[3, 4]).unwrap_err().to_string();
    assert!(msg.contains("(3, 4)") && msg.contains("[2]"), "{msg}");
    assert_eq!(u.expand(&[3, 2]).unwrap().shape(), &[3, 2]);
    // Bounded [1, 2] → [3, 2]: the singleton expands, bounds follow
    let b = Bounded::new(0.0, 1.0, [1, 2]).unwrap();
    let e = b.expand(&[3, 2]).unwrap();
    assert_eq!((e.shape(), e.low().size()), (&[3i64, 2][..], vec![3, 2]));
    let o = OneHot::new(4).unwrap().with_shape([3, 4]).unwrap();
    assert_eq!(o.expand(&[2, 3, 4]).unwrap().shape(), &[2, 3, 4]);
    // a masked Categorical expands its mask to [*shape, n]
    let c = Categorical::new(3)
        .unwrap()
        .with_mask(Tensor::from_slice(&[true, true, false]))
        .unwrap()
        .expand(&[4])
        .unwrap();
    assert_eq!(c.mask().unwrap().size(), vec![4, 3]);
}

#[test]
fn composite_expand() {
    // [5] with a [5, 10], b [5], n.x [5, 4] expanded to [4, 5] → [4, 5, 10], [4, 5], [4, 5, 4]
    let e = nested_composite().expand(&[4, 5]).unwrap();
    assert_eq!(e.shape(), &[4, 5]);
    assert_eq!(e.get("a").unwrap().shape(), &[4, 5, 10]);
    assert_eq!(e.get("b").unwrap().shape(), &[4, 5]);
    assert_eq!(e.get("n").unwrap().shape(), &[4, 5]);
    assert_eq!(e.get(("n", "x")).unwrap().shape(), &[4, 5, 4]);
    let msg = nested_composite().expand(&[4, 6]).unwrap_err().to_string();
    assert!(msg.contains("(4, 6)"), "{msg}");
}

#[test]
fn index_specs() {
    let c = nested_composite();
    let i0 = c.index(&[BatchIndex::Int(0)]).unwrap();
    assert_eq!(i0.shape(), &[] as &[i64]);
    assert_eq!(i0.get("a").unwrap().shape(), &[10]);
    assert_eq!(i0.get("b").unwrap().shape(), &[] as &[i64]);
    assert_eq!(i0.get(("n", "x")).unwrap().shape(), &[4]);
    let s = c.index(&[(1..3).into()]).unwrap();
    assert_eq!(s.shape(), &[2]);
    assert_eq!(s.get("a").unwrap().shape(), &[2, 10]);
    assert_eq!(s.get(("n", "x")).unwrap().shape(), &[2, 4]);
    // `...` in a composite index covers its batch dims, not the leaves' feature dims
    let e = c
        .index(&[BatchIndex::Ellipsis, BatchIndex::NewAxis])
        .unwrap();
    assert_eq!(e.shape(), &[5, 1]);
    assert_eq!(e.get("a").unwrap().shape(), &[5, 1, 10]);

    // OneHot [5, 4][0] → [4]; indexing its last dim is an error
    let o = OneHot::new(4).unwrap().with_shape([5, 4]).unwrap();
    assert_eq!(o.index(&[BatchIndex::Int(0)]).unwrap().shape(), &[4]);
    assert!(o.index(&[0.into(), 1.into()]).is_err());
    assert!(OneHot::new(4).unwrap().index(&[0.into()]).is_err());
    assert!(Binary::new(3).unwrap().index(&[0.into()]).is_err());
    // Bounded [2, 3] with low 0..6, high 10..16: [1] → low [3, 4, 5], high [13, 14, 15]
    let b = Bounded::from_tensors(
        Tensor::arange(6, (Kind::Float, CPU)).reshape([2, 3]),
        Tensor::arange(6, (Kind::Float, CPU)).reshape([2, 3]) + 10.0,
    )
    .unwrap();
    let b1 = b.index(&[1.into()]).unwrap();
    assert_eq!(b1.shape(), &[3]);
    assert_eq!(f64s(b1.low()), vec![3.0, 4.0, 5.0]);
    assert_eq!(f64s(b1.high()), vec![13.0, 14.0, 15.0]);
    // Categorical [5]: tensor index [0, 2] → [2]; mask [T, F, T, F, T] → [3]; None → [1, 5]
    let cat = Categorical::new(3).unwrap().with_shape([5]).unwrap();
    let t = cat
        .index(&[BatchIndex::tensor(Tensor::from_slice(&[0i64, 2]))])
        .unwrap();
    assert_eq!(t.shape(), &[2]);
    let m = cat
        .index(&[BatchIndex::tensor(Tensor::from_slice(&[
            true, false, true, false, true,
        ]))])
        .unwrap();
    assert_eq!(m.shape(), &[3]);
    assert_eq!(cat.index(&[BatchIndex::NewAxis]).unwrap().shape(), &[1, 5]);
    // MultiCategorical [5, 2][0] → [2]
    let mc = MultiCategorical::new(vec![3, 4])
        .unwrap()
        .with_shape([5, 2])
        .unwrap();
    assert_eq!(mc.index(&[0.into()]).unwrap().shape(), &[2]);
}

#[test]
fn squeeze_unsqueeze() {
    let b = Bounded::new(0.0, 1.0, [2, 1]).unwrap();
    let s = b.squeeze(None).unwrap();
    assert_eq!((s.shape(), s.low().size()), (&[2i64][..], vec![2]));
    // [1, 2, 1] squeeze(-1) → [1, 2]; squeeze(0) of [2, 1] is a no-op
    let b3 = Bounded::new(0.0, 1.0, [1, 2, 1]).unwrap();
    assert_eq!(b3.squeeze(Some(-1)).unwrap().shape(), &[1, 2]);
    assert_eq!(b.squeeze(Some(0)).unwrap().shape(), &[2, 1]);
    // like TorchRL, squeeze(None) of a 1-d [1] spec is a no-op
    assert_eq!(Unbounded::new().squeeze(None).unwrap().shape(), &[1]);
    let o = OneHot::new(4).unwrap();
    assert_eq!(o.unsqueeze(0).unwrap().shape(), &[1, 4]);
    let msg = o.unsqueeze(-1).unwrap_err().to_string();
    assert!(msg.contains("OneHot"), "{msg}");
    let c = Categorical::new(3).unwrap().with_shape([2]).unwrap();
    assert_eq!(c.unsqueeze(-1).unwrap().shape(), &[2, 1]);
    // composite [5] unsqueeze(-1) → [5, 1], children [5, 1, 10], [5, 1], [5, 1, 4]
    let u = nested_composite().unsqueeze(-1).unwrap();
    assert_eq!(u.shape(), &[5, 1]);
    assert_eq!(u.get("a").unwrap().shape(), &[5, 1, 10]);
    assert_eq!(u.get("b").unwrap().shape(), &[5, 1]);
    assert_eq!(u.get(("n", "x")).unwrap().shape(), &[5, 1, 4]);
    let back = u.squeeze(None).unwrap();
    assert_eq!(back, nested_composite());
}

// ------------------------------------------------------------------ conversions, equality, display

#[test]
fn one_hot_categorical_conversions() {
    // Categorical [2] values [0, 2] → [[T, F, F], [F, F, T]]
    let c = Categorical::new(3).unwrap().with_shape([2]).unwrap();
    let oh = c.to_one_hot(&Tensor::from_slice(&[0i64, 2])).unwrap();
    assert_eq!(bools(&oh), vec![true, false, false, false, false, true]);
    assert!(c.to_one_hot(&Tensor::from_slice(&[0i64, 3])).is_err());
    let ohs = c.to_one_hot_spec();
    assert_eq!((ohs.shape(), ohs.n()), (&[2i64, 3][..], 3));
    assert!(ohs.is_in(&oh).unwrap());
    let back = ohs.to_categorical(&oh).unwrap();
    assert_eq!(i64s(&back), vec![0, 2]);
    assert_eq!(ohs.to_categorical_spec(), c);
    let mc = MultiCategorical::new(vec![2, 3]).unwrap();
    let moh = mc.to_one_hot(&Tensor::from_slice(&[1i64, 2])).unwrap();
    assert_eq!(bools(&moh), vec![false, true, false, false, true]);
    assert_eq!(mc.to_one_hot_spec(), MultiOneHot::new(vec![2, 3]).unwrap());
    assert_eq!(
        MultiOneHot::new(vec![2, 3]).unwrap().to_categorical_spec(),
        mc
    );
}

#[test]
fn equality() {
    let u2 = || Unbounded::new().with_shape([2]).unwrap();
    assert_eq!(u2(), u2());
    assert_ne!(u2(), u2().with_dtype(Kind::Double).unwrap());
    assert_ne!(u2(), Unbounded::new().with_shape([3]).unwrap());
    let a: TensorSpec = u2().into();
    let b: TensorSpec = Bounded::new(-1.0, 1.0, [2]).unwrap().into();
    assert_ne!(a, b);
    assert_ne!(
        Bounded::new(-1.0, 1.0, [2]).unwrap(),
        Bounded::new(-1.0, 2.0, [2]).unwrap()
    );
    assert_ne!(Categorical::new(3).unwrap(), Categorical::new(4).unwrap());
    assert_ne!(
        Categorical::new(3).unwrap(),
        Categorical::new(3)
            .unwrap()
            .with_mask(Tensor::from_slice(&[true, true, false]))
            .unwrap()
    );
    assert_ne!(u2(), u2().with_device(Device::Cuda(0)).unwrap());
    assert_eq!(nested_composite(), nested_composite());
    let c1 = Composite::new([])
        .unwrap()
        .with("a", Unbounded::new())
        .unwrap();
    let c2 = Composite::new([])
        .unwrap()
        .with("b", Unbounded::new())
        .unwrap();
    assert_ne!(c1, c2);
    // key order does not matter for equality (as TorchRL's set comparison)
    let ab = c1.clone().with("b", Unbounded::new()).unwrap();
    let ba = c2.clone().with("a", Unbounded::new()).unwrap();
    assert_eq!(ab, ba);
    let s3 = Composite::new([3])
        .unwrap()
        .with("a", Unbounded::new().with_shape([3, 2]).unwrap())
        .unwrap();
    let s0 = Composite::new([])
        .unwrap()
        .with("a", Unbounded::new().with_shape([3, 2]).unwrap())
        .unwrap();
    assert_ne!(s3, s0);
}

#[test]
fn display_strings() {
    assert_eq!(
        Bounded::new(-1.0, 1.0, [3]).unwrap().to_string(),
        "Bounded(shape=[3], dtype=Float, low=-1, high=1)"
    );
    assert_eq!(
        Bounded::new(0.1, 0.5, [2]).unwrap().to_string(),
        "Bounded(shape=[2], dtype=Float, low=0.1, high=0.5)"
    );
    assert_eq!(
        Unbounded::new().to_string(),
        "Unbounded(shape=[1], dtype=Float)"
    );
    assert_eq!(
        Categorical::new(3).unwrap().to_string(),
        "Categorical(shape=[], dtype=Int64, n=3)"
    );
    assert_eq!(
        OneHot::new(3).unwrap().to_string(),
        "OneHot(shape=[3], dtype=Bool, n=3)"
    );
    assert_eq!(
        Binary::new(2).unwrap().to_string(),
        "Binary(shape=[2], dtype=Int8)"
    );
    assert_eq!(
        MultiCategorical::new(vec![3, 4]).unwrap().to_string(),
        "MultiCategorical(shape=[2], dtype=Int64, nvec=[3, 4])"
    );
    let c = Composite::new([])
        .unwrap()
        .with("a", Unbounded::new())
        .unwrap()
        .with_none("b")
        .unwrap();
    assert_eq!(
        c.to_string(),
        "Composite(shape=[])\n    a: Unbounded(shape=[1], dtype=Float)\n    b: None"
    );
}

// ------------------------------------------------------------------ stack

#[test]
fn stack_dense_and_errors() {
    let b: TensorSpec = Bounded::new(-1.0, 1.0, [2]).unwrap().into();
    let s = stack_specs(&[b.clone(), b.clone()], 0).unwrap();
    assert_eq!(s.shape(), &[2, 2]);
    let s = stack_specs(&[b.clone(), b.clone(), b.clone()], -1).unwrap();
    assert_eq!(s.shape(), &[2, 3]);
    if let TensorSpec::Bounded(bb) = &s {
        assert_eq!(bb.low().size(), vec![2, 3]);
    } else {
        panic!("expected a Bounded spec");
    }
    let comp: TensorSpec = Composite::new([3])
        .unwrap()
        .with("a", Bounded::new(0.0, 1.0, [3]).unwrap())
        .unwrap()
        .with(
            "b",
            Categorical::new(2).unwrap().with_shape([3, 2]).unwrap(),
        )
        .unwrap()
        .into();
    let s = stack_specs(&[comp.clone(), comp.clone()], 0).unwrap();
    let sc = s.as_composite().unwrap();
    assert_eq!(sc.shape(), &[2, 3]);
    assert_eq!(sc.get("b").unwrap().shape(), &[2, 3, 2]);

    let f: TensorSpec = Unbounded::new().with_shape([2]).unwrap().into();
    let d: TensorSpec = Unbounded::new()
        .with_shape([2])
        .unwrap()
        .with_dtype(Kind::Double)
        .unwrap()
        .into();
    let msg = stack_specs(&[f.clone(), d], 0).unwrap_err().to_string();
    assert!(msg.to_lowercase().contains("dtypes differ"), "{msg}");
    assert!(msg.contains("Float") && msg.contains("Double"), "{msg}");
    let msg = stack_specs(&[f.clone(), b.clone()], 0)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("more than one type of specs"), "{msg}");
    let f23: TensorSpec = Unbounded::new().with_shape([2, 3]).unwrap().into();
    let msg = stack_specs(&[f.clone(), f23], 0).unwrap_err().to_string();
    assert!(msg.to_lowercase().contains("ndims differ"), "{msg}");
    let f3: TensorSpec = Unbounded::new().with_shape([3]).unwrap().into();
    assert!(stack_specs(&[f.clone(), f3], 0).is_err());
    let b2: TensorSpec = Bounded::new(-1.0, 2.0, [2]).unwrap().into();
    assert!(stack_specs(&[b, b2], 0).is_err(), "no lazy stack");
    assert!(stack_specs(&[], 0).is_err());
}

// ------------------------------------------------------------------ Composite

#[test]
fn composite_keys_and_lookup() {
    let c = nested_composite();
    assert_eq!(keys(&c, false, false), [r#""a""#, r#""b""#, r#""n""#]);
    assert_eq!(
        keys(&c, true, false),
        [r#""a""#, r#""b""#, r#"("n", "x")"#, r#""n""#]
    );
    assert_eq!(keys(&c, true, true), [r#""a""#, r#""b""#, r#"("n", "x")"#]);
    assert!(c.contains(("n", "x")));
    assert!(c.get(("n", "y")).is_none());
    let err = c.get_or_err(("n", "y")).unwrap_err();
    match &err {
        Error::KeyNotFound { key, available, .. } => {
            assert_eq!(key, r#"("n", "y")"#);
            assert_eq!(available, &vec![r#"("n", "x")"#.to_string()]);
        }
        other => panic!("unexpected {other}"),
    }
    assert!(matches!(
        c.get_or_err(("a", "z")),
        Err(Error::NotALevel { .. })
    ));
    assert_eq!(c.leaves().len(), 3);
    let items = c.items(KeysOptions::top_level());
    assert_eq!(items.len(), 3);
}

#[test]
fn composite_set_validation() {
    let mut c = Composite::new([3]).unwrap();
    // leading dims [2] are not the composite shape [3]
    let err = c
        .set("a", Unbounded::new().with_shape([2]).unwrap())
        .unwrap_err();
    assert!(matches!(err, Error::BatchSizeMismatch { .. }));
    let msg = err.to_string();
    assert!(
        msg.contains(r#""a""#) && msg.contains("[2]") && msg.contains("[3]"),
        "{msg}"
    );
    assert!(c.is_empty(Recurse::No));
    for bad in ["shape", "device", "dtype", "space"] {
        assert!(matches!(
            c.set(bad, Unbounded::new().with_shape([3]).unwrap()),
            Err(Error::InvalidKey { .. })
        ));
        assert!(matches!(
            c.set(("x", bad), Unbounded::new().with_shape([3]).unwrap()),
            Err(Error::InvalidKey { .. })
        ));
    }
    assert!(c.is_empty(Recurse::No), "nothing half-written");
    // nested set creates the level with the parent shape
    c.set(
        ("next", "reward"),
        Unbounded::new().with_shape([3, 1]).unwrap(),
    )
    .unwrap();
    assert_eq!(c.get("next").unwrap().shape(), &[3]);
    // a path through a leaf is an error
    assert!(matches!(
        c.set(
            ("next", "reward", "x"),
            Unbounded::new().with_shape([3]).unwrap()
        ),
        Err(Error::NotALevel { .. })
    ));
    // a child Composite whose shape is a prefix ([]) is reshaped to [3]
    let child = Composite::new([])
        .unwrap()
        .with("obs", Unbounded::new().with_shape([3, 2]).unwrap())
        .unwrap();
    c.set("sub", child).unwrap();
    assert_eq!(c.get("sub").unwrap().shape(), &[3]);
    // ... but not when its own leaves do not fit [3]
    let bad_child = Composite::new([])
        .unwrap()
        .with("obs", Unbounded::new().with_shape([2]).unwrap())
        .unwrap();
    assert!(matches!(
        c.set("bad", bad_child),
        Err(Error::BatchSizeMismatch { .. })
    ));
    // None entries
    c.set_none("nothing").unwrap();
    assert!(c.contains("nothing") && c.get("nothing").is_none());
    assert!(matches!(
        c.get_or_err("nothing"),
        Err(Error::WrongEntryKind { .. })
    ));
    // replacing keeps the position
    c.set("next", Composite::new([3]).unwrap()).unwrap();
    assert_eq!(keys(&c, false, false)[0], r#""next""#);
}

#[test]
fn composite_devices() {
    let mut c = Composite::new([]).unwrap().with_device(CPU).unwrap();
    let cuda_leaf = Unbounded::new().with_device(Device::Cuda(0)).unwrap();
    let err = c.set("a", cuda_leaf).unwrap_err();
    assert!(matches!(err, Error::DeviceMismatch { .. }), "{err}");
    // a device-less child composite takes the parent's device
    c.set("sub", Composite::new([]).unwrap()).unwrap();
    assert_eq!(c.get("sub").unwrap().device(), Some(CPU));
    // a device-less composite accepts leaves anywhere
    let mut free = Composite::new([]).unwrap();
    free.set("a", Unbounded::new().with_device(Device::Cuda(0)).unwrap())
        .unwrap();
    assert_eq!(free.get("a").unwrap().device(), Some(Device::Cuda(0)));
}

#[test]
fn composite_is_in_and_check() {
    let spec = Composite::new([3])
        .unwrap()
        .with("a", Bounded::new(0.0, 1.0, [3]).unwrap())
        .unwrap()
        .with(
            "b",
            Categorical::new(2).unwrap().with_shape([3, 2]).unwrap(),
        )
        .unwrap()
        .with_none("ignored")
        .unwrap()
        .with("empty", Composite::new([3]).unwrap())
        .unwrap();
    let a = Tensor::from_slice(&[0.0f32, 0.5, 1.0]);
    let td = TensorDict::new([3])
        .unwrap()
        .with("a", a)
        .unwrap()
        .with("b", Tensor::zeros([3, 2], (Kind::Int64, CPU)))
        .unwrap()
        .with("extra", Tensor::zeros([3], (Kind::Float, CPU)))
        .unwrap();
    // extra keys are ignored; None entries and empty composites are skipped
    assert!(spec.is_in(&td).unwrap());
    let mut bad = td.clone();
    bad.set("a", Tensor::from_slice(&[0.0f32, 0.5, 2.0]))
        .unwrap();
    assert!(!spec.is_in(&bad).unwrap());
    let err = spec.check(&bad).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, Error::NotInSpec { .. }));
    for fact in [
        r#""a""#,
        "Bounded(shape=[3]",
        "1 of 3",
        "max=2",
        "[2]",
        "> high 1",
    ] {
        assert!(msg.contains(fact), "missing {fact:?} in {msg}");
    }
    // a missing key is an error naming it, not false
    let missing = TensorDict::new([3])
        .unwrap()
        .with("a", Tensor::zeros([3], (Kind::Float, CPU)))
        .unwrap();
    match spec.is_in(&missing).unwrap_err() {
        Error::KeyNotFound { key, available, .. } => {
            assert_eq!(key, r#""b""#);
            assert_eq!(available, vec![r#""a""#.to_string()]);
        }
        other => panic!("unexpected {other}"),
    }
    // nested: the full key is named
    let nested = Composite::new([])
        .unwrap()
        .with(("next", "obs"), Unbounded::new())
        .unwrap();
    let td = TensorDict::new([])
        .unwrap()
        .with(("next", "other"), Tensor::zeros([1], (Kind::Float, CPU)))
        .unwrap();
    let msg = nested.check(&td).unwrap_err().to_string();
    assert!(msg.contains(r#"("next", "obs")"#), "{msg}");
    // the dtype of a nested leaf
    let td = TensorDict::new([])
        .unwrap()
        .with(("next", "obs"), Tensor::zeros([1], (Kind::Double, CPU)))
        .unwrap();
    let msg = nested.check(&td).unwrap_err().to_string();
    assert!(
        msg.contains(r#"("next", "obs")"#) && msg.contains("Double"),
        "{msg}"
    );
    // through TensorSpec / Entry
    let as_spec: TensorSpec = nested.into();
    assert!(as_spec.check(&Entry::Dict(td), "root").is_err());
}

#[test]
fn composite_lock() {
    let mut c = nested_composite();
    c.lock();
    assert!(c.is_locked());
    let before = c.clone();
    let leaf = || Unbounded::new().with_shape([5]).unwrap();
    let is_locked = |r: Result<(), Error>| matches!(r, Err(Error::Locked { .. }));
    assert!(is_locked(c.set("z", leaf())));
    assert!(is_locked(c.set(("n", "z"), leaf())));
    assert!(is_locked(c.set_none("a")));
    assert!(is_locked(c.pop("a").map(|_| ())));
    assert!(is_locked(c.remove(("n", "x")).map(|_| ())));
    let other = Composite::new([5]).unwrap().with("z", leaf()).unwrap();
    assert!(is_locked(c.update(&other)));
    let err = c.set("z", leaf()).unwrap_err().to_string();
    assert!(err.contains("locked") && err.contains(r#""z""#), "{err}");
    assert_eq!(c, before, "unchanged");
    assert_eq!(keys(&c, true, false), keys(&before, true, false));
    // nested composites are locked too; clones are unlocked
    assert!(c.get("n").unwrap().as_composite().unwrap().is_locked());
    assert!(!c.clone().is_locked());
    c.unlock();
    c.set("z", leaf()).unwrap();
    assert!(c.contains("z"));
}

#[test]
fn composite_pop_remove_update_empty() {
    let mut c = nested_composite();
    let popped = c.pop(("n", "x")).unwrap().unwrap();
    assert_eq!(popped.shape(), &[5, 4]);
    assert!(c.contains("n"), "the parent level stays");
    assert!(matches!(c.pop("zz"), Err(Error::KeyNotFound { .. })));
    assert!(c.remove("a").unwrap());
    assert!(!c.remove("a").unwrap());
    // is_empty: Composite(a=Composite()) is non-empty unless recurse
    let nest = Composite::new([])
        .unwrap()
        .with("a", Composite::new([]).unwrap())
        .unwrap();
    assert!(!nest.is_empty(Recurse::No));
    assert!(nest.is_empty(Recurse::Yes));
    assert!(Composite::new([]).unwrap().is_empty(Recurse::No));
    assert!(!nested_composite().is_empty(Recurse::Yes));
    // update merges nested composites and replaces leaves
    let mut c = nested_composite();
    let upd = Composite::new([5])
        .unwrap()
        .with(
            ("n", "y"),
            Binary::new(2).unwrap().with_shape([5, 2]).unwrap(),
        )
        .unwrap()
        .with("b", Categorical::new(7).unwrap().with_shape([5]).unwrap())
        .unwrap();
    c.update(&upd).unwrap();
    assert_eq!(
        keys(&c, true, true),
        [r#""a""#, r#""b""#, r#"("n", "x")"#, r#"("n", "y")"#]
    );
    match c.get("b").unwrap() {
        TensorSpec::Categorical(cat) => assert_eq!(cat.n(), 7),
        other => panic!("unexpected {other}"),
    }
    // a failing update changes nothing
    let before = c.clone();
    let bad = Composite::new([])
        .unwrap()
        .with("q", Unbounded::new())
        .unwrap();
    assert!(c.update(&bad).is_err(), "[1] does not start with [5]");
    assert_eq!(c, before);
    let e = c.empty();
    assert!(e.is_empty(Recurse::No) && e.shape() == [5]);
}

#[test]
fn composite_nested_key_forms() {
    let c = Composite::new([])
        .unwrap()
        .with(("a", ("b", "c")), Unbounded::new())
        .unwrap();
    let k: NestedKey = ("a", "b", "c").into();
    assert!(c.get(&k).is_some());
    assert!(c.get(["a", "b"]).unwrap().is_composite());
    assert_eq!(keys(&c, true, true), [r#"("a", "b", "c")"#]);
}

// ------------------------------------------------------------------ devices (GPU only)

/// Runs where CUDA is available (returns early otherwise): every leaf spec samples on the
/// device, samples equal the CPU ones for the same seed, and bounds/masks follow the spec.
#[test]
fn cuda_paths_when_available() {
    if !tch::Cuda::is_available() {
        return;
    }
    let dev = Device::Cuda(0);
    for (i, spec) in leaf_specs().iter().enumerate() {
        let on_dev = spec.to_device(dev).unwrap();
        assert_eq!(on_dev.device(), Some(dev));
        let x = tensor(on_dev.rand(&mut Generator::new(3), &[4]).unwrap());
        assert_eq!(x.device(), dev, "spec #{i} {spec}");
        assert!(on_dev.is_in(&Entry::Tensor(x.shallow_clone())).unwrap());
        // a CPU value against a CUDA spec (devices are not compared)
        assert!(on_dev.is_in(&Entry::Tensor(x.to_device(CPU))).unwrap());
        // same seed, same samples, whatever the device
        let y = tensor(spec.rand(&mut Generator::new(3), &[4]).unwrap());
        assert!(x.to_device(CPU).equal(&y), "spec #{i} {spec}");
        if !matches!(spec, TensorSpec::NonTensor(_)) {
            let mut shape = vec![2];
            shape.extend_from_slice(spec.shape());
            let raw = Generator::new(1)
                .normal(&shape, 0.0, 10.0, Kind::Float, dev)
                .unwrap();
            let p = tensor(on_dev.project(&Entry::Tensor(raw)).unwrap());
            assert_eq!(p.device(), dev);
            assert!(on_dev.is_in(&Entry::Tensor(p)).unwrap(), "spec #{i} {spec}");
        }
    }
    let comp = nested_composite().with_device(dev).unwrap();
    let td = comp.rand(&mut Generator::new(0), &[2]).unwrap();
    assert_eq!(td.device(), Some(dev));
    assert!(comp.is_in(&td).unwrap());
    let idx = comp
        .index(&[BatchIndex::tensor(
            Tensor::from_slice(&[0i64, 2]).to_device(dev),
        )])
        .unwrap();
    assert_eq!(idx.get("a").unwrap().shape(), &[2, 10]);
    let mut cpu_comp = Composite::new([]).unwrap().with_device(CPU).unwrap();
    assert!(matches!(
        cpu_comp.set("x", Unbounded::new().with_device(dev).unwrap()),
        Err(Error::DeviceMismatch { .. })
    ));
}
