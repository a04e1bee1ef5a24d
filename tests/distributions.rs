//! Distributions (`torchrl::modules::distributions`).
//!
//! 1. Replays `specs/distribution_cases.json` (recorded by `specs/record_distributions.py` from
//!    torch 2.13 / TorchRL 0.14.1; Python is never run): batch and event shapes, `log_prob` of
//!    the recorded values, `entropy`, `mean`, `mode` (values within 1e-5), and the gradients of
//!    each output's `sum()` w.r.t. the float parameters (within 1e-4), through `backward()`.
//!    A `null` entropy / mean / mode is one the port returns as an `Err` (see the file's
//!    `"notes"`). Tolerances are absolute below 1 and relative above.
//! 2. Properties that need no reference: sampling statistics of 20k seeded samples, supports
//!    (TanhNormal strictly inside `(low, high)`), seeding, masks, rsample gradients, Monte-Carlo
//!    estimates against quadrature, and constructor / argument errors.

use serde_json::Value;
use tch::{Device, Kind, Tensor};
use torchrl::modules::distributions::{
    Categorical, Delta, Distribution, Normal, OneHotCategorical, TanhBounds, TanhNormal,
};
use torchrl::{Error, Generator};

const VALUE_TOL: f64 = 1e-5;
const GRAD_TOL: f64 = 1e-4;

// ------------------------------------------------------------------ decoding

fn load_cases() -> Vec<Value> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/specs/distribution_cases.json");
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {path}: {e}"));
    let root: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"));
    root["cases"]
        .as_array()
        .unwrap_or_else(|| panic!("{path} has no cases"))
        .clone()
}

fn number(v: &Value) -> Result<f64, String> {
    match v {
        Value::Number(n) => n.as_f64().ok_or_else(|| format!("bad number {n}")),
        Value::String(s) if s == "inf" => Ok(f64::INFINITY),
        Value::String(s) if s == "-inf" => Ok(f64::NEG_INFINITY),
        Value::String(s) if s == "nan" => Ok(f64::NAN),
        Value::Bool(b) => Ok(f64::from(u8::from(*b))),
        other => Err(format!("bad tensor element {other}")),
    }
}

fn shape_of(v: &Value) -> Result<Vec<i64>, String> {
    v.as_array()
        .and_then(|a| a.iter().map(Value::as_i64).collect::<Option<Vec<_>>>())
        .ok_or_else(|| format!("bad shape {v}"))
}

/// Decodes `{"shape", "dtype", "data"}` into a CPU tensor.
fn decode(v: &Value) -> Result<Tensor, String> {
    let shape = shape_of(&v["shape"])?;
    let data = v["data"].as_array().ok_or("data is not a list")?;
    let t = match v["dtype"].as_str().ok_or("dtype is not a string")? {
        "float32" => {
            let d: Vec<f32> = data
                .iter()
                .map(|x| number(x).map(|f| f as f32))
                .collect::<Result<_, _>>()?;
            Tensor::from_slice(&d)
        }
        "float64" => {
            let d: Vec<f64> = data.iter().map(number).collect::<Result<_, _>>()?;
            Tensor::from_slice(&d)
        }
        "int64" => {
            let d: Vec<i64> = data
                .iter()
                .map(|x| x.as_i64().ok_or_else(|| format!("bad int {x}")))
                .collect::<Result<_, _>>()?;
            Tensor::from_slice(&d)
        }
        "bool" => {
            let d: Vec<bool> = data
                .iter()
                .map(|x| x.as_bool().ok_or_else(|| format!("bad bool {x}")))
                .collect::<Result<_, _>>()?;
            Tensor::from_slice(&d)
        }
        other => return Err(format!("unknown dtype {other}")),
    };
    t.f_reshape(shape.as_slice()).map_err(|e| e.to_string())
}

fn dtype_name(kind: Kind) -> &'static str {
    match kind {
        Kind::Float => "float32",
        Kind::Double => "float64",
        Kind::Int64 => "int64",
        Kind::Bool => "bool",
        _ => "other",
    }
}

/// Compares `actual` with an encoded tensor: dtype, shape, and values within `tol` (absolute
/// below 1, relative above; infinities and NaNs must match exactly).
fn compare(actual: &Tensor, expected: &Value, tol: f64, what: &str) -> Result<(), String> {
    let exp = decode(expected)?;
    if dtype_name(actual.kind()) != expected["dtype"].as_str().unwrap_or("") {
        return Err(format!(
            "{what}: dtype {:?}, expected {}",
            actual.kind(),
            expected["dtype"]
        ));
    }
    if actual.size() != exp.size() {
        return Err(format!(
            "{what}: shape {:?}, expected {:?}",
            actual.size(),
            exp.size()
        ));
    }
    let a = Vec::<f64>::try_from(&actual.to_kind(Kind::Double).reshape([-1]))
        .map_err(|e| e.to_string())?;
    let e = Vec::<f64>::try_from(&exp.to_kind(Kind::Double).reshape([-1]))
        .map_err(|e| e.to_string())?;
    for (i, (x, y)) in a.iter().zip(&e).enumerate() {
        let ok = if y.is_nan() {
            x.is_nan()
        } else if y.is_infinite() {
            x == y
        } else {
            (x - y).abs() <= tol * y.abs().max(1.0)
        };
        if !ok {
            return Err(format!(
                "{what}: element {i} is {x}, expected {y} (tol {tol})"
            ));
        }
    }
    Ok(())
}

// ------------------------------------------------------------------ building

/// A distribution built from a case's args, with its leaf parameters.
struct Built {
    dist: Box<dyn Distribution>,
    params: Vec<(String, Tensor)>,
}

fn build(op: &str, args: &Value) -> Result<Built, String> {
    let mut params = Vec::new();
    let mut get = |name: &str| -> Result<Option<Tensor>, String> {
        match args.get(name) {
            None => Ok(None),
            Some(v) => {
                let t = decode(v)?;
                let t = if t.is_floating_point() && name != "low" && name != "high" {
                    let t = t.set_requires_grad(true);
                    params.push((name.to_string(), t.shallow_clone()));
                    t
                } else {
                    t
                };
                Ok(Some(t))
            }
        }
    };
    let req = |t: Option<Tensor>, name: &str| t.ok_or_else(|| format!("missing arg {name}"));
    let e = |e: Error| e.to_string();
    let dist: Box<dyn Distribution> = match op {
        "Normal" => {
            let (loc, scale) = (req(get("loc")?, "loc")?, req(get("scale")?, "scale")?);
            Box::new(Normal::new(&loc, &scale).map_err(e)?)
        }
        "TanhNormal" => {
            let (loc, scale) = (req(get("loc")?, "loc")?, req(get("scale")?, "scale")?);
            let (low, high) = (req(get("low")?, "low")?, req(get("high")?, "high")?);
            Box::new(TanhNormal::new(&loc, &scale, &low, &high).map_err(e)?)
        }
        "Categorical" | "OneHotCategorical" => {
            let (logits, probs, mask) = (get("logits")?, get("probs")?, get("mask")?);
            let one_hot = op == "OneHotCategorical";
            match (logits, probs) {
                (Some(l), None) if one_hot => {
                    Box::new(OneHotCategorical::from_logits(&l, mask.as_ref()).map_err(e)?)
                }
                (None, Some(p)) if one_hot => {
                    Box::new(OneHotCategorical::from_probs(&p, mask.as_ref()).map_err(e)?)
                }
                (Some(l), None) => {
                    Box::new(Categorical::from_logits(&l, mask.as_ref()).map_err(e)?)
                }
                (None, Some(p)) => Box::new(Categorical::from_probs(&p, mask.as_ref()).map_err(e)?),
                _ => return Err("exactly one of logits / probs expected".into()),
            }
        }
        "Delta" => Box::new(Delta::new(&req(get("param")?, "param")?).map_err(e)?),
        other => return Err(format!("unknown distribution {other}")),
    };
    Ok(Built { dist, params })
}

/// Checks `out` against `expected.out` and, when recorded, the gradients of `out.sum()`.
fn check_output(built: &Built, out: &Tensor, expected: &Value, what: &str) -> Result<(), String> {
    compare(out, &expected["out"], VALUE_TOL, what)?;
    let Some(grads) = expected["grads"].as_object() else {
        return Ok(());
    };
    if !out.requires_grad() {
        return Err(format!(
            "{what}: output carries no gradient, gradients were recorded"
        ));
    }
    out.sum(out.kind()).backward();
    for (name, g) in grads {
        let p = built
            .params
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, t)| t)
            .ok_or_else(|| format!("{what}: no parameter {name}"))?;
        let grad = p.grad();
        let grad = if grad.defined() { grad } else { p.zeros_like() };
        compare(&grad, g, GRAD_TOL, &format!("{what}: grad of {name}"))?;
    }
    Ok(())
}

fn replay_case(case: &Value) -> Result<usize, String> {
    let op = case["op"].as_str().ok_or("no op")?;
    let args = &case["args"];
    let expect = &case["expect"];
    let mut checks = 0;
    let probe = build(op, args)?;
    if probe.dist.batch_shape() != shape_of(&expect["batch_shape"])?.as_slice() {
        return Err(format!(
            "batch_shape {:?}, expected {}",
            probe.dist.batch_shape(),
            expect["batch_shape"]
        ));
    }
    if probe.dist.event_shape() != shape_of(&expect["event_shape"])?.as_slice() {
        return Err(format!(
            "event_shape {:?}, expected {}",
            probe.dist.event_shape(),
            expect["event_shape"]
        ));
    }
    for (i, lp) in expect["log_prob"]
        .as_array()
        .ok_or("no log_prob list")?
        .iter()
        .enumerate()
    {
        let built = build(op, args)?;
        let value = decode(&lp["value"])?;
        let out = built
            .dist
            .log_prob(&value)
            .map_err(|e| format!("log_prob #{i}: {e}"))?;
        check_output(&built, &out, lp, &format!("log_prob #{i}"))?;
        checks += 1;
    }
    for what in ["entropy", "mean", "mode"] {
        let built = build(op, args)?;
        let d = &built.dist;
        let out = match what {
            "entropy" => d.entropy(),
            "mean" => d.mean(),
            _ => d.mode(),
        };
        match (&expect[what], out) {
            (Value::Null, Err(_)) => {}
            (Value::Null, Ok(t)) => return Err(format!("{what}: expected Err, got {t:?}")),
            (_, Err(e)) => return Err(format!("{what}: {e}")),
            (exp, Ok(t)) => check_output(&built, &t, exp, what)?,
        }
        checks += 1;
    }
    Ok(checks)
}

#[test]
fn reference_cases_replay() {
    let cases = load_cases();
    assert!(
        cases.len() >= 20,
        "expected the recorded cases, found {}",
        cases.len()
    );
    let mut failures = Vec::new();
    let mut checks = 0;
    let mut ops = std::collections::BTreeSet::new();
    for case in &cases {
        let name = case["name"].as_str().unwrap_or("?");
        ops.insert(case["op"].as_str().unwrap_or("?").to_string());
        match replay_case(case) {
            Ok(n) => checks += n,
            Err(e) => failures.push(format!("{name}: {e}")),
        }
    }
    assert!(
        failures.is_empty(),
        "{} failure(s):\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert_eq!(
        ops.into_iter().collect::<Vec<_>>(),
        [
            "Categorical",
            "Delta",
            "Normal",
            "OneHotCategorical",
            "TanhNormal"
        ]
    );
    assert!(checks > 100, "only {checks} checks");
}

// ------------------------------------------------------------------ helpers

fn f32s(v: &[f32]) -> Tensor {
    Tensor::from_slice(v)
}

fn vals(t: &Tensor) -> Vec<f64> {
    Vec::<f64>::try_from(&t.to_kind(Kind::Double).reshape([-1])).expect("read tensor")
}

fn all_true(t: &Tensor) -> bool {
    t.all().int64_value(&[]) == 1
}

/// ∫ f(z) φ(z) dz over z in [-10, 10] (trapezoid, 20001 points): an expectation under N(0, 1).
fn gauss_expect(f: impl Fn(f64) -> f64) -> f64 {
    let n = 20_000;
    let (a, b) = (-10.0f64, 10.0f64);
    let h = (b - a) / n as f64;
    let mut s = 0.0;
    for i in 0..=n {
        let z = a + h * i as f64;
        let w = if i == 0 || i == n { 0.5 } else { 1.0 };
        s += w * f(z) * (-0.5 * z * z).exp() / (2.0 * std::f64::consts::PI).sqrt();
    }
    s * h
}

// ------------------------------------------------------------------ sampling statistics

#[test]
fn normal_sample_statistics() {
    let d = Normal::new(&f32s(&[1.0, -2.0]), &f32s(&[0.5, 3.0])).unwrap();
    let n = 20_000;
    let x = d.sample(&mut Generator::new(0), &[n]).unwrap();
    assert_eq!(x.size(), vec![n, 2]);
    assert!(!x.requires_grad());
    let mean = vals(&x.mean_dim(0, false, Kind::Double));
    let std = vals(&x.to_kind(Kind::Double).std_dim(0, true, false));
    for (i, (m, s)) in [(1.0, 0.5), (-2.0, 3.0)].iter().enumerate() {
        let se = s / (n as f64).sqrt();
        assert!((mean[i] - m).abs() < 4.0 * se, "mean[{i}] = {}", mean[i]);
        assert!(
            (std[i] - s).abs() < 4.0 * s / (2.0 * n as f64).sqrt(),
            "std[{i}] = {}",
            std[i]
        );
    }
}

#[test]
fn tanh_normal_sample_statistics_and_estimates() {
    let (locs, scales) = ([0.3f64, -1.0, 2.0], [0.8f64, 0.5, 1.5]);
    let (low, high) = (-2.0, 3.0);
    let (c, h) = ((high + low) / 2.0, (high - low) / 2.0);
    let d = TanhNormal::from_scalar_bounds(
        &Tensor::from_slice(&locs).to_kind(Kind::Float),
        &Tensor::from_slice(&scales).to_kind(Kind::Float),
        low,
        high,
    )
    .unwrap()
    .with_event_dims(0)
    .unwrap();
    assert_eq!((d.batch_shape(), d.event_shape()), (&[3i64][..], &[][..]));
    let n = 20_000;
    let x = d.sample(&mut Generator::new(1), &[n]).unwrap();
    let mean = vals(&x.mean_dim(0, false, Kind::Double));
    let est = vals(&d.mean_estimate(&mut Generator::new(2), n).unwrap());
    let ent = vals(&d.entropy_estimate(&mut Generator::new(3), n).unwrap());
    for i in 0..3 {
        let (l, s) = (locs[i], scales[i]);
        let m = gauss_expect(|z| c + h * (l + s * z).tanh());
        let var = gauss_expect(|z| (c + h * (l + s * z).tanh() - m).powi(2));
        let se = (var / n as f64).sqrt();
        assert!(
            (mean[i] - m).abs() < 4.0 * se,
            "mean[{i}] = {} vs {m}",
            mean[i]
        );
        assert!(
            (est[i] - m).abs() < 4.0 * se,
            "mean_estimate[{i}] = {} vs {m}",
            est[i]
        );
        // H(Y) = H(X) + E[ln h + ln(1 - tanh²(x))]
        let hx = 0.5 + 0.5 * (2.0 * std::f64::consts::PI).ln() + s.ln();
        let hy = hx + gauss_expect(|z| h.ln() + (1.0 - (l + s * z).tanh().powi(2)).ln());
        assert!(
            (ent[i] - hy).abs() < 0.03,
            "entropy_estimate[{i}] = {} vs {hy}",
            ent[i]
        );
    }
}

#[test]
fn categorical_frequencies_match_probs() {
    let probs = Tensor::from_slice(&[0.1f32, 0.2, 0.3, 0.4, 0.7, 0.0, 0.2, 0.1]).reshape([2, 4]);
    let d = Categorical::from_probs(&probs, None).unwrap();
    let n = 20_000;
    let x = d.sample(&mut Generator::new(4), &[n]).unwrap();
    assert_eq!((x.size(), x.kind()), (vec![n, 2], Kind::Int64));
    let expected = vals(&probs);
    for row in 0..2i64 {
        let col = x.select(1, row);
        for k in 0..4i64 {
            let freq = col
                .eq(k)
                .to_kind(Kind::Double)
                .mean(Kind::Double)
                .double_value(&[]);
            let p = expected[(row * 4 + k) as usize];
            assert!(
                (freq - p).abs() < 0.015,
                "row {row} class {k}: {freq} vs {p}"
            );
            if p == 0.0 {
                assert_eq!(freq, 0.0, "a zero-probability class was drawn");
            }
        }
    }
    // one-hot: same frequencies, one-hot rows
    let oh = OneHotCategorical::from_probs(&probs, None).unwrap();
    let y = oh.sample(&mut Generator::new(5), &[n]).unwrap();
    assert_eq!((y.size(), y.kind()), (vec![n, 2, 4], Kind::Int64));
    assert!(all_true(&y.sum_dim_intlist(-1, false, Kind::Int64).eq(1)));
    let freq = vals(&y.to_kind(Kind::Double).mean_dim(0, false, Kind::Double));
    for (f, p) in freq.iter().zip(&expected) {
        assert!((f - p).abs() < 0.015, "one-hot frequency {f} vs {p}");
    }
}

#[test]
fn masked_classes_are_never_sampled() {
    // the masked classes carry almost all the mass
    let logits =
        Tensor::from_slice(&[10.0f32, 0.0, 10.0, 0.0, 0.0, 20.0, 0.0, 0.0]).reshape([2, 4]);
    let mask =
        Tensor::from_slice(&[false, true, false, true, true, false, true, true]).reshape([2, 4]);
    for d in [
        Categorical::from_logits(&logits, Some(&mask)).unwrap(),
        Categorical::from_probs(&logits.exp(), Some(&mask)).unwrap(),
    ] {
        let x = d.sample(&mut Generator::new(6), &[20_000]).unwrap();
        let allowed =
            mask.unsqueeze(0)
                .expand([20_000, 2, 4], false)
                .gather(-1, &x.unsqueeze(-1), false);
        assert!(all_true(&allowed), "a masked class was sampled");
        // every allowed class shows up
        for (row, classes) in [(0i64, [1i64, 3]), (1, [0, 2])] {
            for k in classes {
                assert!(
                    x.select(1, row).eq(k).any().int64_value(&[]) == 1,
                    "row {row} never drew {k}"
                );
            }
        }
        assert!(all_true(
            &d.probs().masked_select(&mask.logical_not()).eq(0.0)
        ));
        let lp = d.log_prob(&Tensor::from_slice(&[0i64, 2])).unwrap();
        assert_eq!(vals(&lp)[0], f64::NEG_INFINITY);
        assert!(vals(&lp)[1].is_finite());
        // the mode is an allowed class
        assert_eq!(vals(&d.mode().unwrap()), vec![1.0, 0.0]);
    }
    let oh = OneHotCategorical::from_logits(&logits, Some(&mask)).unwrap();
    let y = oh.sample(&mut Generator::new(7), &[2000]).unwrap();
    assert!(all_true(&y.logical_and(&mask.logical_not()).logical_not()));
}

// ------------------------------------------------------------------ supports and seeding

#[test]
fn tanh_normal_samples_strictly_inside_bounds() {
    let cases: Vec<(Vec<f32>, Vec<f32>, f64, f64)> = vec![
        (vec![0.0, 20.0, -20.0], vec![1.0, 0.1, 0.1], -1.0, 1.0),
        (vec![0.0, 50.0, -50.0], vec![3.0, 1.0, 1.0], 100.0, 101.0),
        (vec![0.0, 30.0, -30.0], vec![5.0, 0.5, 0.5], 0.0, 1e-3),
        (vec![0.5, 9.0, -9.0], vec![10.0, 10.0, 10.0], -1e4, 1e4),
    ];
    for (loc, scale, low, high) in cases {
        for kind in [Kind::Float, Kind::Double] {
            let loc = f32s(&loc).to_kind(kind).set_requires_grad(true);
            let scale = f32s(&scale).to_kind(kind);
            let d = TanhNormal::from_scalar_bounds(&loc, &scale, low, high).unwrap();
            let mut gen = Generator::new(8);
            let samples = [
                d.sample(&mut gen, &[5000]).unwrap(),
                d.rsample(&mut gen, &[5000]).unwrap(),
                d.sample_and_log_prob(&mut gen, &[5000]).unwrap().0,
                d.rsample_and_log_prob(&mut gen, &[5000]).unwrap().0,
                d.mode().unwrap(),
            ];
            for y in &samples {
                assert_eq!(y.kind(), kind);
                assert!(
                    all_true(&y.gt_tensor(d.low())),
                    "{low}..{high} {kind:?}: a sample <= low"
                );
                assert!(
                    all_true(&y.lt_tensor(d.high())),
                    "{low}..{high} {kind:?}: a sample >= high"
                );
                let lp = d.log_prob(y).unwrap();
                assert!(
                    all_true(&lp.isfinite()),
                    "{low}..{high} {kind:?}: non-finite log_prob"
                );
            }
        }
    }
}

#[test]
fn same_seed_same_samples() {
    let loc = f32s(&[0.0, 1.0, -1.0]);
    let scale = f32s(&[1.0, 0.5, 2.0]);
    let dists: Vec<Box<dyn Distribution>> = vec![
        Box::new(Normal::new(&loc, &scale).unwrap()),
        Box::new(TanhNormal::from_scalar_bounds(&loc, &scale, -1.0, 1.0).unwrap()),
        Box::new(Categorical::from_logits(&loc, None).unwrap()),
        Box::new(OneHotCategorical::from_logits(&loc, None).unwrap()),
    ];
    for d in &dists {
        let a = d.sample(&mut Generator::new(42), &[64]).unwrap();
        let b = d.sample(&mut Generator::new(42), &[64]).unwrap();
        let c = d.sample(&mut Generator::new(43), &[64]).unwrap();
        assert_eq!(a.size(), d.extended_shape(&[64]));
        assert!(a.equal(&b), "same seed, different samples");
        assert!(!a.equal(&c), "different seeds, same samples");
        // a generator continues its stream: two draws differ
        let mut g = Generator::new(42);
        let first = d.sample(&mut g, &[64]).unwrap();
        let second = d.sample(&mut g, &[64]).unwrap();
        assert!(first.equal(&a) && !second.equal(&a));
        if d.has_rsample() {
            let r = d.rsample(&mut Generator::new(42), &[64]).unwrap();
            assert!(
                r.to_kind(a.kind()).equal(&a),
                "rsample and sample differ for one seed"
            );
        }
    }
    // the global libtorch seed plays no part
    tch::manual_seed(1);
    let a = dists[0].sample(&mut Generator::new(42), &[8]).unwrap();
    tch::manual_seed(2);
    let b = dists[0].sample(&mut Generator::new(42), &[8]).unwrap();
    assert!(a.equal(&b));
}

// ------------------------------------------------------------------ autograd

#[test]
fn rsample_gradients_exist() {
    let loc = f32s(&[0.2, -0.4, 20.0]).set_requires_grad(true);
    let scale = f32s(&[0.5, 1.0, 0.1]).set_requires_grad(true);

    let d = Normal::new(&loc, &scale).unwrap();
    assert!(d.has_rsample());
    d.rsample(&mut Generator::new(9), &[10])
        .unwrap()
        .sum(Kind::Float)
        .backward();
    assert_eq!(vals(&loc.grad()), vec![10.0; 3]);
    assert!(vals(&scale.grad())
        .iter()
        .all(|g| g.is_finite() && *g != 0.0));
    let _ = loc.grad().zero_();
    let _ = scale.grad().zero_();

    // TanhNormal: gradients reach loc and scale, even in the saturated third dim
    let d = TanhNormal::from_scalar_bounds(&loc, &scale, -1.0, 1.0).unwrap();
    let y = d.rsample(&mut Generator::new(9), &[10]).unwrap();
    assert!(y.requires_grad());
    y.sum(Kind::Float).backward();
    for g in [loc.grad(), scale.grad()] {
        let g = vals(&g);
        assert!(g.iter().all(|x| x.is_finite()), "{g:?}");
        assert!(g[0] != 0.0 && g[1] != 0.0 && g[2] != 0.0, "{g:?}");
    }
    let _ = loc.grad().zero_();
    let _ = scale.grad().zero_();
    let (y, lp) = d
        .rsample_and_log_prob(&mut Generator::new(9), &[10])
        .unwrap();
    (y.sum(Kind::Float) + lp.sum(Kind::Float)).backward();
    assert!(vals(&scale.grad())
        .iter()
        .all(|x| x.is_finite() && *x != 0.0));
    // sample_and_log_prob: no pathwise gradient on the sample, a score-function one on log_prob
    let (y, lp) = d
        .sample_and_log_prob(&mut Generator::new(9), &[10])
        .unwrap();
    assert!(!y.requires_grad() && lp.requires_grad());

    // Delta: the identity
    let p = f32s(&[1.0, 2.0]).set_requires_grad(true);
    let d = Delta::new(&p).unwrap();
    d.rsample(&mut Generator::new(0), &[4])
        .unwrap()
        .sum(Kind::Float)
        .backward();
    assert_eq!(vals(&p.grad()), vec![4.0, 4.0]);
    assert!(!d
        .sample(&mut Generator::new(0), &[4])
        .unwrap()
        .requires_grad());

    // OneHotCategorical: straight-through, exact one-hot values
    let logits = f32s(&[0.1, 0.2, 0.3]).set_requires_grad(true);
    let d = OneHotCategorical::from_logits(&logits, None).unwrap();
    let r = d.rsample(&mut Generator::new(0), &[5]).unwrap();
    assert!(all_true(&r.eq(0.0).logical_or(&r.eq(1.0))));
    (r * f32s(&[1.0, -2.0, 3.0])).sum(Kind::Float).backward();
    assert!(vals(&logits.grad()).iter().any(|g| *g != 0.0));

    // Categorical: no reparameterisation
    let d = Categorical::from_logits(&logits, None).unwrap();
    assert!(!d.has_rsample());
    let e = d.rsample(&mut Generator::new(0), &[]).unwrap_err();
    assert!(e.to_string().contains("rsample"), "{e}");
    assert!(!d
        .sample(&mut Generator::new(0), &[3])
        .unwrap()
        .requires_grad());
}

#[test]
fn entropy_and_mean_gradients() {
    let loc = f32s(&[0.5, -1.0]).set_requires_grad(true);
    let scale = f32s(&[2.0, 0.25]).set_requires_grad(true);
    let d = Normal::new(&loc, &scale).unwrap();
    d.entropy().unwrap().sum(Kind::Float).backward();
    assert_eq!(vals(&scale.grad()), vec![0.5, 4.0]); // d ln(scale) = 1 / scale
    d.mean().unwrap().sum(Kind::Float).backward();
    assert_eq!(vals(&loc.grad()), vec![1.0, 1.0]);
    // TanhNormal's Monte-Carlo entropy is differentiable too
    let d = TanhNormal::from_scalar_bounds(&loc, &scale, -1.0, 1.0).unwrap();
    d.entropy_estimate(&mut Generator::new(0), 256)
        .unwrap()
        .backward();
    assert!(vals(&scale.grad()).iter().all(|g| g.is_finite()));
}

#[test]
fn tanh_normal_log_prob_of_own_samples_matches_pre_tanh_score() {
    let loc = f32s(&[0.1, -0.3, 0.7, 0.0]).reshape([2, 2]);
    let scale = f32s(&[0.4, 0.9, 0.3, 1.2]).reshape([2, 2]);
    let d = TanhNormal::new(&loc, &scale, &f32s(&[-2.0, 0.0]), &f32s(&[1.0, 5.0])).unwrap();
    assert_eq!(
        (d.batch_shape(), d.event_shape()),
        (&[2i64][..], &[2i64][..])
    );
    let (y, lp) = d
        .rsample_and_log_prob(&mut Generator::new(10), &[100])
        .unwrap();
    assert_eq!((y.size(), lp.size()), (vec![100, 2, 2], vec![100, 2]));
    let again = d.log_prob(&y).unwrap();
    let diff = (again - &lp).abs().max().double_value(&[]);
    assert!(
        diff < 1e-2,
        "log_prob(y) differs from the pre-tanh score by {diff}"
    );
    // event_dims: 0 keeps every element, 2 sums the whole [2, 2]
    let d0 = d.clone().with_event_dims(0).unwrap();
    assert_eq!(d0.log_prob(&y).unwrap().size(), vec![100, 2, 2]);
    let d2 = d.clone().with_event_dims(2).unwrap();
    assert_eq!(d2.batch_shape(), &[] as &[i64]);
    assert_eq!(d2.log_prob(&y).unwrap().size(), vec![100]);
    assert!(d.clone().with_event_dims(3).is_err());
}

// ------------------------------------------------------------------ errors

fn err_text<T: std::fmt::Debug>(r: torchrl::Result<T>) -> String {
    r.expect_err("expected an error").to_string()
}

#[test]
fn constructor_errors_name_the_argument() {
    let loc = f32s(&[0.0, 0.0, 0.0]);
    let e = err_text(Normal::new(&loc, &f32s(&[1.0, 0.0, 1.0])));
    assert!(
        e.contains("scale") && e.contains("[3]") && e.contains("> 0"),
        "{e}"
    );
    let e = err_text(Normal::new(&loc, &f32s(&[1.0, f32::NAN, 1.0])));
    assert!(e.contains("scale"), "{e}");
    let e = err_text(Normal::new(&f32s(&[0.0, f32::NAN]), &f32s(&[1.0])));
    assert!(e.contains("loc") && e.contains("NaN"), "{e}");
    let e = err_text(Normal::new(&loc, &f32s(&[1.0; 4])));
    assert!(
        e.contains("loc of shape [3]") && e.contains("scale of shape [4]"),
        "{e}"
    );
    let e = err_text(Normal::new(&loc, &Tensor::from_slice(&[1.0f64; 3])));
    assert!(e.contains("scale") && e.contains("Double"), "{e}");
    let e = err_text(Normal::new(&Tensor::from_slice(&[0i64]), &f32s(&[1.0])));
    assert!(e.contains("loc") && e.contains("floating"), "{e}");

    let e = err_text(TanhNormal::from_scalar_bounds(
        &loc,
        &f32s(&[1.0; 3]),
        1.0,
        1.0,
    ));
    assert!(e.contains("high > low"), "{e}");
    let e = err_text(TanhNormal::new(
        &loc,
        &f32s(&[1.0; 3]),
        &f32s(&[-1.0, -1.0]),
        &f32s(&[1.0]),
    ));
    assert!(e.contains("low of shape [2]"), "{e}");
    let e = err_text(TanhNormal::from_scalar_bounds(
        &loc,
        &f32s(&[-1.0; 3]),
        -1.0,
        1.0,
    ));
    assert!(e.contains("scale"), "{e}");
    let e = err_text(TanhNormal::from_scalar_bounds(
        &loc,
        &f32s(&[1.0; 3]),
        f64::NEG_INFINITY,
        1.0,
    ));
    assert!(e.contains("finite"), "{e}");

    let probs = f32s(&[0.5, -0.1, 0.6]);
    let e = err_text(Categorical::from_probs(&probs, None));
    assert!(e.contains("probs") && e.contains(">= 0"), "{e}");
    let e = err_text(Categorical::from_probs(&f32s(&[0.0, 0.0]), None));
    assert!(e.contains("sum"), "{e}");
    let logits = f32s(&[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]).reshape([2, 3]);
    let mask = Tensor::from_slice(&[true, false, true, false, false, false]).reshape([2, 3]);
    let e = err_text(Categorical::from_logits(&logits, Some(&mask)));
    assert!(e.contains("row 1") && e.contains("no class"), "{e}");
    let e = err_text(Categorical::from_probs(&logits.exp(), Some(&mask)));
    assert!(e.contains("row 1"), "{e}");
    let e = err_text(Categorical::from_logits(
        &logits,
        Some(&Tensor::from_slice(&[1i64, 0, 1])),
    ));
    assert!(e.contains("mask") && e.contains("Bool"), "{e}");
    let e = err_text(Categorical::from_logits(
        &logits,
        Some(&Tensor::from_slice(&[true, false])),
    ));
    assert!(e.contains("mask of shape [2]"), "{e}");
    let e = err_text(Categorical::from_logits(
        &f32s(&[f32::NEG_INFINITY; 2]),
        None,
    ));
    assert!(e.contains("-inf"), "{e}");
    let e = err_text(Categorical::from_logits(&f32s(&[0.0, f32::NAN]), None));
    assert!(e.contains("NaN"), "{e}");
    let e = err_text(Categorical::from_logits(
        &Tensor::from_slice(&[1i64, 2]),
        None,
    ));
    assert!(e.contains("logits") && e.contains("floating"), "{e}");
    let e = err_text(OneHotCategorical::from_probs(
        &Tensor::zeros([2, 0], (Kind::Float, Device::Cpu)),
        None,
    ));
    assert!(e.contains("class"), "{e}");

    let e = err_text(Delta::new(&Tensor::from_slice(&[1i64])));
    assert!(e.contains("param"), "{e}");
    assert!(Delta::new(&loc).unwrap().with_tolerance(-1.0, 0.0).is_err());
}

#[test]
fn argument_errors() {
    let mut gen = Generator::new(0);
    let d = Normal::new(&f32s(&[0.0; 3]), &f32s(&[1.0; 3])).unwrap();
    let e = err_text(d.log_prob(&f32s(&[0.0; 4])));
    assert!(
        e.contains("value of shape [4]") && e.contains("batch_shape [3]"),
        "{e}"
    );
    assert!(d.sample(&mut gen, &[-1]).is_err());
    assert!(d.log_prob(&f32s(&[0.0; 3]).reshape([1, 3])).is_ok());

    let t = TanhNormal::from_scalar_bounds(&f32s(&[0.0; 3]), &f32s(&[1.0; 3]), -1.0, 1.0).unwrap();
    let e = err_text(t.log_prob(&f32s(&[0.0; 2])));
    assert!(e.contains("event_shape [3]"), "{e}");
    assert!(t.entropy().is_err() && t.mean().is_err());
    assert!(err_text(t.entropy()).contains("entropy_estimate"));
    assert!(t.entropy_estimate(&mut gen, 0).is_err());

    let c = Categorical::from_logits(&f32s(&[0.0; 3]), None).unwrap();
    let e = err_text(c.log_prob(&Tensor::from_slice(&[3i64])));
    assert!(e.contains("outside 0..3"), "{e}");
    assert!(c.log_prob(&Tensor::from_slice(&[-1i64])).is_err());
    let e = err_text(c.log_prob(&f32s(&[1.0])));
    assert!(e.contains("integer"), "{e}");
    assert!(c.mean().is_err());
    // int32 indices are accepted
    let lp = c.log_prob(&Tensor::from_slice(&[2i32, 0])).unwrap();
    assert_eq!(lp.size(), vec![2]);

    let o = OneHotCategorical::from_logits(&f32s(&[0.0; 3]), None).unwrap();
    let e = err_text(o.log_prob(&Tensor::from_slice(&[0i64, 1])));
    assert!(e.contains("event_shape [3]"), "{e}");

    let dl = Delta::new(&f32s(&[0.0; 3])).unwrap();
    assert!(dl.entropy().is_err());
    assert!(dl.log_prob(&f32s(&[0.0; 2])).is_err());
}

// ------------------------------------------------------------------ shapes and devices

#[test]
fn sample_shapes_and_kinds() {
    let mut gen = Generator::new(0);
    let loc = Tensor::zeros([4, 2], (Kind::Double, Device::Cpu));
    let scale = Tensor::ones([2], (Kind::Double, Device::Cpu));
    let n = Normal::new(&loc, &scale).unwrap();
    assert_eq!(
        n.sample(&mut gen, &[3, 5]).unwrap().size(),
        vec![3, 5, 4, 2]
    );
    assert_eq!(n.sample(&mut gen, &[]).unwrap().kind(), Kind::Double);
    assert_eq!(
        n.log_prob(&Tensor::zeros([7, 4, 2], (Kind::Double, Device::Cpu)))
            .unwrap()
            .size(),
        vec![7, 4, 2]
    );
    // an integer value is cast to the parameters' dtype
    assert_eq!(
        n.log_prob(&Tensor::zeros([2], (Kind::Int64, Device::Cpu)))
            .unwrap()
            .kind(),
        Kind::Double
    );

    let t = TanhNormal::from_scalar_bounds(&loc, &scale, -1.0, 1.0).unwrap();
    assert_eq!(
        (t.batch_shape(), t.event_shape()),
        (&[4i64][..], &[2i64][..])
    );
    assert_eq!(t.sample(&mut gen, &[3]).unwrap().size(), vec![3, 4, 2]);
    assert_eq!(
        t.log_prob(&t.sample(&mut gen, &[3]).unwrap())
            .unwrap()
            .size(),
        vec![3, 4]
    );
    let t0 = TanhNormal::from_scalar_bounds(
        &f32s(&[0.0]).reshape([]),
        &f32s(&[1.0]).reshape([]),
        0.0,
        1.0,
    )
    .unwrap();
    assert_eq!((t0.batch_shape(), t0.event_shape()), (&[][..], &[][..]));

    let c =
        Categorical::from_logits(&Tensor::zeros([4, 3], (Kind::Float, Device::Cpu)), None).unwrap();
    assert_eq!(c.sample(&mut gen, &[2]).unwrap().size(), vec![2, 4]);
    assert_eq!(c.entropy().unwrap().size(), vec![4]);
    assert!((vals(&c.entropy().unwrap())[0] - 3f64.ln()).abs() < 1e-6);
    let o =
        OneHotCategorical::from_logits(&Tensor::zeros([4, 3], (Kind::Float, Device::Cpu)), None)
            .unwrap();
    assert_eq!(o.sample(&mut gen, &[2]).unwrap().size(), vec![2, 4, 3]);
    assert_eq!(o.mean().unwrap().size(), vec![4, 3]);

    let d = Delta::new(&Tensor::zeros([4, 3], (Kind::Float, Device::Cpu))).unwrap();
    let s = d.sample(&mut gen, &[2]).unwrap();
    assert_eq!(s.size(), vec![2, 4, 3]);
    assert_eq!(d.log_prob(&s).unwrap().size(), vec![2, 4]);
    assert!(all_true(&d.log_prob(&s).unwrap().eq(f64::INFINITY)));
}

#[test]
fn tolerances_and_defaults() {
    let d = Delta::new(&f32s(&[1.0]))
        .unwrap()
        .with_tolerance(0.5, 0.0)
        .unwrap();
    assert_eq!(
        vals(&d.log_prob(&f32s(&[1.4])).unwrap()),
        vec![f64::INFINITY]
    );
    assert_eq!(
        vals(&d.log_prob(&f32s(&[1.6])).unwrap()),
        vec![f64::NEG_INFINITY]
    );
    // deterministic_sample defaults to the mode
    let t = TanhNormal::from_scalar_bounds(&f32s(&[0.5]), &f32s(&[1.0]), -1.0, 1.0).unwrap();
    assert!(t.deterministic_sample().unwrap().equal(&t.mode().unwrap()));
    assert!((vals(&t.mode().unwrap())[0] - 0.5f64.tanh()).abs() < 1e-6);
}

/// Device-generic: the same seed gives the same samples on CUDA as on the CPU (noise is drawn
/// on the CPU), and every op runs there. Skipped without a GPU.
#[test]
fn cuda_matches_cpu_when_available() {
    if !tch::Cuda::is_available() {
        eprintln!("no CUDA device: skipped");
        return;
    }
    let dev = Device::Cuda(0);
    let loc = f32s(&[0.3, -0.2]);
    let scale = f32s(&[0.5, 1.5]);
    let cpu = TanhNormal::from_scalar_bounds(&loc, &scale, -2.0, 2.0).unwrap();
    let gpu = TanhNormal::from_scalar_bounds(&loc.to_device(dev), &scale.to_device(dev), -2.0, 2.0)
        .unwrap();
    let a = cpu.sample(&mut Generator::new(3), &[100]).unwrap();
    let b = gpu.sample(&mut Generator::new(3), &[100]).unwrap();
    assert_eq!(b.device(), dev);
    assert!((a - b.to_device(Device::Cpu)).abs().max().double_value(&[]) < 1e-5);
    let c = Categorical::from_logits(
        &loc.to_device(dev),
        Some(&Tensor::from_slice(&[false, true])),
    )
    .unwrap();
    let x = c.sample(&mut Generator::new(3), &[100]).unwrap();
    assert!(all_true(&x.eq(1)));
    assert_eq!(c.log_prob(&x).unwrap().device(), dev);
}

/// A TanhNormal over bounds checked once (`TanhBounds`, what an actor keeps) is the one `new`
/// builds: the same samples and log-probs bitwise, with bounds of the loc's dtype and of
/// another (cast, then checked again, as `new` does: float64 bounds 1e-12 apart collapse in
/// float32 and are refused).
#[test]
fn tanh_normal_with_checked_bounds_is_new() {
    let loc = f32s(&[0.3, -2.0, 5.0, 0.0]).reshape([2, 2]);
    let scale = f32s(&[0.5, 1.5, 0.2, 3.0]).reshape([2, 2]);
    let y = f32s(&[0.1, -0.5, 0.9, 0.0]).reshape([2, 2]);
    for (low, high) in [
        (f32s(&[-2.0, 0.0]), f32s(&[2.0, 1.0])),
        (
            Tensor::from_slice(&[-1.0f64, 100.0]),
            Tensor::from_slice(&[3.0f64, 101.0]),
        ),
    ] {
        let bounds = TanhBounds::new(&low, &high).unwrap();
        let a = TanhNormal::with_bounds(&loc, &scale, &bounds).unwrap();
        let b = TanhNormal::new(&loc, &scale, &low, &high).unwrap();
        let (sa, sb) = (
            a.sample(&mut Generator::new(3), &[5]).unwrap(),
            b.sample(&mut Generator::new(3), &[5]).unwrap(),
        );
        assert!(sa.equal(&sb), "{:?}", low.kind());
        assert!(a.log_prob(&y).unwrap().equal(&b.log_prob(&y).unwrap()));
        assert!(a.mode().unwrap().equal(&b.mode().unwrap()));
    }
    let (low, high) = (
        Tensor::from_slice(&[1.0f64]),
        Tensor::from_slice(&[1.0f64 + 1e-12]),
    );
    let bounds = TanhBounds::new(&low, &high).unwrap();
    let e = err_text(TanhNormal::with_bounds(
        &f32s(&[0.0]),
        &f32s(&[1.0]),
        &bounds,
    ));
    assert!(e.contains("high > low") && e.contains("with_bounds"), "{e}");
    let e = err_text(TanhBounds::new(&f32s(&[1.0, 0.0]), &f32s(&[2.0, 0.0])));
    assert!(e.contains("high > low"), "{e}");
    // the loc / scale checks read min(scale) and max(loc): an infinite loc is allowed, a
    // scale of -0.0 or NaN and a NaN loc are not
    let b = TanhBounds::new(&f32s(&[-1.0]), &f32s(&[1.0])).unwrap();
    assert!(TanhNormal::with_bounds(&f32s(&[f32::INFINITY]), &f32s(&[1.0]), &b).is_ok());
    for (l, s, what) in [
        (0.0, -0.0, "scale"),
        (0.0, f32::NAN, "scale"),
        (f32::NAN, 1.0, "loc"),
    ] {
        let e = err_text(TanhNormal::with_bounds(
            &f32s(&[0.5, l]),
            &f32s(&[1.0, s]),
            &b,
        ));
        assert!(e.contains(what), "{e}");
    }
}
