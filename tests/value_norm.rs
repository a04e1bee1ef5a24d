//! The value normalisers (`torchrl::modules::value_norm`) replayed against TorchRL 0.14.1
//! (`specs/record_value_norm.py` → `specs/value_norm_cases.json`): for every case, four
//! updates (inputs with leading dims `[6]`, `[2, 3]`, none, `[4]`), and after each the buffers,
//! `normalize`, `denormalize` and `scale`; the shape errors TorchRL raises (the state is
//! unchanged after them); and the constructor arguments TorchRL refuses.

use serde_json::Value;
use tch::{Kind, Tensor};
use torchrl::modules::{PercentileValueNorm, PopArtValueNorm, RunningValueNorm, ValueNorm};

type R<T> = std::result::Result<T, String>;
const TOL: f64 = 1e-10;

fn tensor(v: &Value) -> R<Tensor> {
    let shape: Vec<i64> = v["shape"]
        .as_array()
        .ok_or("shape")?
        .iter()
        .map(|x| x.as_i64().ok_or("dim"))
        .collect::<Result<_, _>>()?;
    let data: Vec<f64> = v["data"]
        .as_array()
        .ok_or("data")?
        .iter()
        .map(|x| x.as_f64().unwrap_or(f64::NAN))
        .collect();
    Ok(Tensor::from_slice(&data).view(shape.as_slice()))
}

fn close(actual: &Tensor, expected: &Value, what: &str) -> R<()> {
    let e = tensor(expected)?;
    if actual.size() != e.size() {
        return Err(format!(
            "{what}: shape {:?}, recorded {:?}",
            actual.size(),
            e.size()
        ));
    }
    let a = actual.to_kind(Kind::Double);
    let worst = (&a - &e).abs().max().double_value(&[]);
    if worst.is_nan() || worst > TOL * (1.0 + e.abs().max().double_value(&[])) {
        return Err(format!("{what}: {a:?} vs {e:?} (worst {worst})"));
    }
    Ok(())
}

fn shape_of(kw: &Value) -> Option<Vec<i64>> {
    match kw.get("shape")? {
        Value::Number(n) => Some(vec![n.as_i64()?]),
        Value::Array(a) => a.iter().map(Value::as_i64).collect(),
        _ => None,
    }
}

/// The case's normaliser (float64 statistics, as recorded), built from TorchRL's kwargs.
fn build(class: &str, kw: &Value) -> torchrl::Result<Box<dyn ValueNorm>> {
    let f = |k: &str| kw.get(k).and_then(Value::as_f64);
    Ok(match class {
        "PopArtValueNorm" => {
            let mut n = PopArtValueNorm::new().with_kind(Kind::Double)?;
            if let Some(s) = shape_of(kw) {
                n = n.with_shape(&s)?;
            }
            if let Some(b) = f("beta") {
                n = n.with_beta(b)?;
            }
            if let Some(e) = f("epsilon") {
                n = n.with_epsilon(e)?;
            }
            Box::new(n)
        }
        "RunningValueNorm" => {
            let mut n = RunningValueNorm::new().with_kind(Kind::Double)?;
            if let Some(s) = shape_of(kw) {
                n = n.with_shape(&s)?;
            }
            if let Some(e) = f("epsilon") {
                n = n.with_epsilon(e)?;
            }
            Box::new(n)
        }
        "PercentileValueNorm" => {
            let mut n = PercentileValueNorm::new().with_kind(Kind::Double)?;
            if let Some(s) = shape_of(kw) {
                n = n.with_shape(&s)?;
            }
            if let Some(q) = kw.get("quantiles").and_then(Value::as_array) {
                let q: Vec<f64> = q.iter().filter_map(Value::as_f64).collect();
                n = n.with_quantiles(q[0], q[1])?;
            }
            if let Some(r) = f("rate") {
                n = n.with_rate(r)?;
            }
            if let Some(m) = f("min_scale") {
                n = n.with_min_scale(m)?;
            }
            if let Some(c) = kw.get("center").and_then(Value::as_bool) {
                n = n.with_center(c);
            }
            if let Some(e) = f("epsilon") {
                n = n.with_epsilon(e)?;
            }
            Box::new(n)
        }
        other => panic!("unknown class {other}"),
    })
}

/// The buffers, `normalize`, `denormalize` and `scale` equal the recorded state.
fn check_state(norm: &dyn ValueNorm, st: &Value, what: &str) -> R<()> {
    let state = norm.state();
    let recorded = st["buffers"].as_object().ok_or("buffers")?;
    if state.len() != recorded.len() {
        return Err(format!(
            "{what}: buffers {:?}, recorded {:?}",
            state.iter().map(|(n, _)| n).collect::<Vec<_>>(),
            recorded.keys().collect::<Vec<_>>()
        ));
    }
    for (name, t) in &state {
        let v = recorded
            .get(*name)
            .ok_or_else(|| format!("{what}: buffer {name} not recorded"))?;
        close(t, v, &format!("{what}.{name}"))?;
    }
    let e = |e: torchrl::Error| format!("{what}: {e}");
    let x = tensor(&st["normalize"]["input"])?;
    close(
        &norm.normalize(&x).map_err(e)?,
        &st["normalize"]["output"],
        &format!("{what}.normalize"),
    )?;
    let y = tensor(&st["denormalize"]["input"])?;
    close(
        &norm.denormalize(&y).map_err(e)?,
        &st["denormalize"]["output"],
        &format!("{what}.denormalize"),
    )?;
    close(
        &norm.scale().map_err(e)?,
        &st["scale"],
        &format!("{what}.scale"),
    )
}

fn replay_sequence(case: &Value) -> R<()> {
    let name = case["name"].as_str().ok_or("name")?;
    let class = case["class"].as_str().ok_or("class")?;
    let mut norm = build(class, &case["kwargs"]).map_err(|e| format!("{name}: {e}"))?;
    check_state(norm.as_ref(), &case["initial"], &format!("{name}[initial]"))?;
    for (i, step) in case["steps"].as_array().ok_or("steps")?.iter().enumerate() {
        let what = format!("{name}[step {i}]");
        norm.update(&tensor(&step["update"])?)
            .map_err(|e| format!("{what}: {e}"))?;
        check_state(norm.as_ref(), step, &what)?;
    }
    // a refused update names the shapes and leaves the statistics as they were
    let last = case["steps"]
        .as_array()
        .and_then(|s| s.last())
        .ok_or("steps")?;
    for bad in case["update_errors"].as_array().ok_or("update_errors")? {
        let input = tensor(&bad["input"])?;
        let err = match norm.update(&input) {
            Ok(()) => return Err(format!("{name}: update of {:?} accepted", input.size())),
            Err(e) => e.to_string(),
        };
        if !err.contains("trailing dims") || !err.contains("value_target") {
            return Err(format!("{name}: the shape error does not say what: {err}"));
        }
        check_state(
            norm.as_ref(),
            last,
            &format!("{name}[after a refused update]"),
        )?;
    }
    Ok(())
}

#[test]
fn normalisers_match_torchrl() {
    let path = format!("{}/specs/value_norm_cases.json", env!("CARGO_MANIFEST_DIR"));
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let cases = doc["cases"].as_array().unwrap();
    let sequences: Vec<&Value> = cases.iter().filter(|c| c["op"] == "sequence").collect();
    assert_eq!(sequences.len(), 15);
    let failures: Vec<String> = sequences
        .iter()
        .filter_map(|c| replay_sequence(c).err())
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // the arguments TorchRL refuses are refused, naming the field
    let errors: Vec<&Value> = cases.iter().filter(|c| c["op"] == "ctor_error").collect();
    assert_eq!(errors.len(), 6);
    for case in errors {
        let name = case["name"].as_str().unwrap();
        let err = build(case["class"].as_str().unwrap(), &case["kwargs"])
            .err()
            .unwrap_or_else(|| panic!("{name}: accepted"))
            .to_string();
        let field = ["quantiles", "rate", "min_scale"]
            .into_iter()
            .find(|f| case["kwargs"].get(*f).is_some())
            .unwrap();
        assert!(err.contains(field), "{name}: {err}");
    }
}

/// Hand-derived: the statistics follow the input's dtype conversions, refuse integer inputs and
/// bad settings by name, and an empty batch cannot give a quantile.
#[test]
fn normalisers_refuse_bad_input_by_name() {
    let mut running = RunningValueNorm::new();
    let ints = Tensor::from_slice(&[1i64, 2]).view([2, 1]);
    let err = running.update(&ints).unwrap_err().to_string();
    assert!(
        err.contains("floating-point") && err.contains("Int64"),
        "{err}"
    );
    // float64 input into float32 statistics: converted
    running
        .update(&Tensor::from_slice(&[1.0f64, 3.0]).view([2, 1]))
        .unwrap();
    assert_eq!(running.state()[0].1.kind(), Kind::Float);
    assert_eq!(running.state()[0].1.double_value(&[0]), 2.0);
    let err = PopArtValueNorm::new()
        .with_beta(1.0)
        .unwrap_err()
        .to_string();
    assert!(err.contains("beta"), "{err}");
    let err = RunningValueNorm::new()
        .with_shape(&[])
        .unwrap_err()
        .to_string();
    assert!(err.contains("shape"), "{err}");
    let err = RunningValueNorm::new()
        .with_kind(Kind::Int64)
        .unwrap_err()
        .to_string();
    assert!(err.contains("kind"), "{err}");
    let mut pct = PercentileValueNorm::new();
    let err = pct
        .update(&Tensor::zeros([0, 1], (Kind::Float, tch::Device::Cpu)))
        .unwrap_err()
        .to_string();
    assert!(err.contains("empty"), "{err}");
}
