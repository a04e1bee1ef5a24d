//! Readers of the RLHF recorders' case files (`specs/*_cases.json` with `{"cases": [{"kind":
//! …}, …]}` and tensors as `{"shape", "data"}`), shared by the RLHF test files.

#![allow(dead_code)] // each test file uses a subset

use serde_json::Value;
use tch::Tensor;

/// The cases of `kind` in `specs/<file>`; panics naming the file's recorder when it is missing
/// or holds no such case.
pub fn cases(file: &str, recorder: &str, kind: &str) -> Vec<Value> {
    let path = format!("{}/specs/{file}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{path}: {e} (run specs/{recorder})"));
    let v: Value = serde_json::from_str(&text).expect("valid JSON");
    let out: Vec<Value> = v["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .filter(|c| c["kind"] == kind)
        .cloned()
        .collect();
    assert!(!out.is_empty(), "no {kind} case recorded in {file}");
    out
}

/// A float64 tensor from `{"shape": [...], "data": [...]}`.
pub fn tensor(v: &Value) -> Tensor {
    let shape: Vec<i64> = v["shape"]
        .as_array()
        .expect("shape")
        .iter()
        .map(|x| x.as_i64().expect("dim"))
        .collect();
    let data: Vec<f64> = v["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(|x| x.as_f64().expect("a number"))
        .collect();
    Tensor::from_slice(&data).view(shape.as_slice())
}

/// A number.
pub fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

/// The whole of `specs/<file>` (for its `versions` and other top-level fields); panics naming
/// the recorder when it is missing.
pub fn file(file: &str, recorder: &str) -> Value {
    let path = format!("{}/specs/{file}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{path}: {e} (run specs/{recorder})"));
    serde_json::from_str(&text).expect("valid JSON")
}

/// An int64 tensor from `{"shape", "data"}` whose data are integral numbers (token ids).
pub fn int_tensor(v: &Value) -> Tensor {
    let t = tensor(v);
    let rounded = t.round();
    assert!(t.equal(&rounded), "not integral: {v}");
    rounded.to_kind(tch::Kind::Int64)
}

/// A number, or `None` for JSON `null`.
pub fn opt_f(v: &Value) -> Option<f64> {
    if v.is_null() {
        None
    } else {
        Some(f(v))
    }
}
