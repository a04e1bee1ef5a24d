//! Shared helpers for the tests that replay reference cases recorded from Python
//! (`specs/*.json`, format in `specs/README.md`).
//!
//! - loading a case file: [`load_cases`];
//! - decoding: [`tensor_from_json`], [`td_from_json`], [`entry_from_json`], [`key_from_json`],
//!   [`keys_from_json`], [`index_from_json`], [`shape_from_json`];
//! - comparing: [`check_tensor`] / [`check_td`] / [`check_entry`] (actual value against its
//!   JSON encoding), [`tensors_close`] (two tensors), exact for integers and bools and within
//!   [`FLOAT_TOL`] for floats;
//! - error facts: [`key_names`] and [`missing_facts`];
//! - [`Failures`]: collects every failure of a replay loop and asserts once at the end.
//!
//! Malformed case files are reported as `Err(String)` (or [`DecodeError::Format`]), never as a
//! panic, so one bad case does not hide the others.
//!
//! The files are parsed into [`Json`], not `serde_json::Value`: key order is part of the
//! recorded outcome (a tensordict's insertion order), and `serde_json::Value` sorts object keys
//! unless serde_json's `preserve_order` feature is enabled, which this crate does not do.
#![allow(dead_code)]

use std::collections::BTreeSet;
use std::fmt;
use std::path::PathBuf;

use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use tch::{Device, Kind, Tensor};
use torchrl::{BatchIndex, Entry, NestedKey, TensorDict};

/// The JSON values of the case files are [`Json`]s.
pub type Value = Json;

// ------------------------------------------------------------------ order-preserving JSON

/// A JSON value whose objects keep the order of the source text.
#[derive(Debug, Clone, PartialEq)]
pub enum Json {
    /// `null`.
    Null,
    /// `true` / `false`.
    Bool(bool),
    /// A number (integers and floats stay distinct).
    Number(serde_json::Number),
    /// A string.
    String(String),
    /// A list.
    Array(Vec<Json>),
    /// An object, in source order.
    Object(Vec<(String, Json)>),
}

static NULL: Json = Json::Null;

impl Json {
    /// Parses JSON text.
    pub fn parse(text: &str) -> Result<Json, String> {
        serde_json::from_str(text).map_err(|e| e.to_string())
    }

    /// The member `key` of an object.
    pub fn get(&self, key: &str) -> Option<&Json> {
        self.as_object()?
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v)
    }

    /// The members of an object, in source order.
    pub fn as_object(&self) -> Option<&[(String, Json)]> {
        match self {
            Json::Object(o) => Some(o),
            _ => None,
        }
    }

    /// The items of a list.
    pub fn as_array(&self) -> Option<&[Json]> {
        match self {
            Json::Array(a) => Some(a),
            _ => None,
        }
    }

    /// A string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Json::String(s) => Some(s),
            _ => None,
        }
    }

    /// An integer that fits in an `i64` (not a float).
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Json::Number(n) => n.as_i64(),
            _ => None,
        }
    }

    /// Any number, as an `f64`.
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Json::Number(n) => n.as_f64(),
            _ => None,
        }
    }

    /// True for an integer number (`1`, not `1.0`).
    pub fn is_i64(&self) -> bool {
        matches!(self, Json::Number(n) if n.is_i64() || n.is_u64())
    }

    /// A bool.
    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Json::Bool(b) => Some(*b),
            _ => None,
        }
    }

    /// True for `null`.
    pub fn is_null(&self) -> bool {
        matches!(self, Json::Null)
    }

    /// The same value as a `serde_json::Value` (object order may be lost: display only).
    pub fn to_serde(&self) -> serde_json::Value {
        match self {
            Json::Null => serde_json::Value::Null,
            Json::Bool(b) => serde_json::Value::Bool(*b),
            Json::Number(n) => serde_json::Value::Number(n.clone()),
            Json::String(s) => serde_json::Value::String(s.clone()),
            Json::Array(a) => serde_json::Value::Array(a.iter().map(Json::to_serde).collect()),
            Json::Object(o) => serde_json::Value::Object(
                o.iter().map(|(k, v)| (k.clone(), v.to_serde())).collect(),
            ),
        }
    }
}

impl std::ops::Index<&str> for Json {
    type Output = Json;
    /// The member `key`, or `null` when absent (like `serde_json::Value`).
    fn index(&self, key: &str) -> &Json {
        self.get(key).unwrap_or(&NULL)
    }
}

impl fmt::Display for Json {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Json::Object(o) => {
                write!(f, "{{")?;
                for (i, (k, v)) in o.iter().enumerate() {
                    if i > 0 {
                        write!(f, ",")?;
                    }
                    write!(f, "{}:{v}", serde_json::Value::String(k.clone()))?;
                }
                write!(f, "}}")
            }
            Json::Array(a) => {
                write!(f, "[")?;
                for (i, v) in a.iter().enumerate() {
                    if i > 0 {
                        write!(f, ",")?;
                    }
                    write!(f, "{v}")?;
                }
                write!(f, "]")
            }
            other => write!(f, "{}", other.to_serde()),
        }
    }
}

impl<'de> Deserialize<'de> for Json {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Json;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_unit<E>(self) -> Result<Json, E> {
                Ok(Json::Null)
            }
            fn visit_none<E>(self) -> Result<Json, E> {
                Ok(Json::Null)
            }
            fn visit_bool<E>(self, v: bool) -> Result<Json, E> {
                Ok(Json::Bool(v))
            }
            fn visit_i64<E>(self, v: i64) -> Result<Json, E> {
                Ok(Json::Number(v.into()))
            }
            fn visit_u64<E>(self, v: u64) -> Result<Json, E> {
                Ok(Json::Number(v.into()))
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Json, E> {
                serde_json::Number::from_f64(v)
                    .map(Json::Number)
                    .ok_or_else(|| E::custom(format!("non-finite number {v}")))
            }
            fn visit_str<E>(self, v: &str) -> Result<Json, E> {
                Ok(Json::String(v.to_string()))
            }
            fn visit_string<E>(self, v: String) -> Result<Json, E> {
                Ok(Json::String(v))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Json, A::Error> {
                let mut out = Vec::new();
                while let Some(x) = seq.next_element::<Json>()? {
                    out.push(x);
                }
                Ok(Json::Array(out))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Json, A::Error> {
                let mut out = Vec::new();
                while let Some((k, v)) = map.next_entry::<String, Json>()? {
                    out.push((k, v));
                }
                Ok(Json::Object(out))
            }
        }
        deserializer.deserialize_any(V)
    }
}

/// Tolerance for float comparisons (absolute, or relative for large values).
pub const FLOAT_TOL: f64 = 1e-6;

// ------------------------------------------------------------------ case files

/// One recorded case.
#[derive(Debug, Clone)]
pub struct Case {
    /// Unique snake_case name.
    pub name: String,
    /// The op (see specs/README.md).
    pub op: String,
    /// The encoded arguments.
    pub args: Value,
    /// The encoded result, or `{"error": {...}}`.
    pub expect: Value,
}

/// The error a case expects.
#[derive(Debug, Clone)]
pub struct ExpectedError {
    /// Python exception class (`KeyError`, `RuntimeError`, ...).
    pub class: String,
    /// The Python message.
    pub message: String,
    /// Substrings the Rust message must contain (see [`missing_facts`]).
    pub facts: Vec<String>,
}

impl Case {
    /// The argument `name`, or an error naming the case.
    pub fn arg(&self, name: &str) -> Result<&Value, String> {
        self.args
            .get(name)
            .ok_or_else(|| format!("case {}: missing argument {name:?}", self.name))
    }

    /// The expected error, when the case expects one.
    pub fn expected_error(&self) -> Option<ExpectedError> {
        let e = self.expect.as_object().and(self.expect.get("error"))?;
        Some(ExpectedError {
            class: e.get("class")?.as_str()?.to_string(),
            message: e.get("message")?.as_str()?.to_string(),
            facts: e
                .get("facts")?
                .as_array()?
                .iter()
                .filter_map(|f| f.as_str().map(str::to_string))
                .collect(),
        })
    }
}

/// A parsed case file.
#[derive(Debug)]
pub struct CaseFile {
    /// `versions` as recorded (torch, tensordict, ...).
    pub versions: Value,
    /// The cases, in file order.
    pub cases: Vec<Case>,
}

/// Loads `specs/<file_name>` from the crate root. Panics with a readable message when the file
/// is missing or not in the documented format (nothing can be replayed then).
pub fn load_cases(file_name: &str) -> CaseFile {
    let path: PathBuf = [env!("CARGO_MANIFEST_DIR"), "specs", file_name]
        .iter()
        .collect();
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let root = Json::parse(&text).unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()));
    let cases = root
        .get("cases")
        .and_then(Value::as_array)
        .unwrap_or_else(|| panic!("{} has no \"cases\" list", path.display()));
    let cases = cases
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let field = |k: &str| {
                c.get(k)
                    .cloned()
                    .unwrap_or_else(|| panic!("{}: case #{i} has no {k:?}", path.display()))
            };
            let text = |k: &str| {
                field(k).as_str().map(str::to_string).unwrap_or_else(|| {
                    panic!("{}: case #{i}: {k:?} is not a string", path.display())
                })
            };
            Case {
                name: text("name"),
                op: text("op"),
                args: field("args"),
                expect: field("expect"),
            }
        })
        .collect();
    CaseFile {
        versions: root.get("versions").cloned().unwrap_or(Value::Null),
        cases,
    }
}

// ------------------------------------------------------------------ dtypes

/// The dtype names used in the case files.
pub fn kind_from_name(name: &str) -> Result<Kind, String> {
    Ok(match name {
        "float32" => Kind::Float,
        "float64" => Kind::Double,
        "int64" => Kind::Int64,
        "int32" => Kind::Int,
        "bool" => Kind::Bool,
        "uint8" => Kind::Uint8,
        "int8" => Kind::Int8,
        other => return Err(format!("unknown dtype name {other:?}")),
    })
}

/// Inverse of [`kind_from_name`]; `None` for kinds the case files never use.
pub fn kind_name(kind: Kind) -> Option<&'static str> {
    Some(match kind {
        Kind::Float => "float32",
        Kind::Double => "float64",
        Kind::Int64 => "int64",
        Kind::Int => "int32",
        Kind::Bool => "bool",
        Kind::Uint8 => "uint8",
        Kind::Int8 => "int8",
        _ => return None,
    })
}

fn is_float(kind: Kind) -> bool {
    matches!(
        kind,
        Kind::Float | Kind::Double | Kind::Half | Kind::BFloat16
    )
}

// ------------------------------------------------------------------ decoding

/// True for an encoded tensor (`shape`, `dtype`, `data`).
pub fn is_tensor_json(v: &Value) -> bool {
    v.get("shape").is_some() && v.get("dtype").is_some() && v.get("data").is_some()
}

/// True for an encoded tensordict (`batch_size`, `entries`).
pub fn is_td_json(v: &Value) -> bool {
    v.get("batch_size").is_some() && v.get("entries").is_some()
}

/// A list of integers (a shape, a batch size, a list of dims).
pub fn shape_from_json(v: &Value) -> Result<Vec<i64>, String> {
    v.as_array()
        .and_then(|a| a.iter().map(Value::as_i64).collect::<Option<Vec<i64>>>())
        .ok_or_else(|| format!("expected a list of integers, got {v}"))
}

fn data_as<T>(data: &[Value], f: impl Fn(&Value) -> Option<T>) -> Result<Vec<T>, String> {
    data.iter()
        .map(|x| f(x).ok_or_else(|| format!("bad tensor element {x}")))
        .collect()
}

/// Decodes `{"shape", "dtype", "data"}` into a CPU tensor (float32 values are exact doubles of
/// float32 values, so the `as f32` cast is exact).
pub fn tensor_from_json(v: &Value) -> Result<Tensor, String> {
    if !is_tensor_json(v) {
        return Err(format!("not an encoded tensor: {v}"));
    }
    let shape = shape_from_json(&v["shape"])?;
    let kind = kind_from_name(v["dtype"].as_str().ok_or("dtype is not a string")?)?;
    let data = v["data"].as_array().ok_or("data is not a list")?;
    let numel: i64 = shape.iter().product();
    if numel != data.len() as i64 {
        return Err(format!(
            "shape {shape:?} needs {numel} values, data has {}",
            data.len()
        ));
    }
    let int = |x: &Value| x.as_i64();
    let flat = match kind {
        Kind::Float => Tensor::from_slice(&data_as(data, |x| x.as_f64().map(|f| f as f32))?),
        Kind::Double => Tensor::from_slice(&data_as(data, Value::as_f64)?),
        Kind::Int64 => Tensor::from_slice(&data_as(data, int)?),
        Kind::Int => Tensor::from_slice(&data_as(data, |x| {
            int(x).and_then(|i| i32::try_from(i).ok())
        })?),
        Kind::Uint8 => Tensor::from_slice(&data_as(data, |x| {
            int(x).and_then(|i| u8::try_from(i).ok())
        })?),
        Kind::Int8 => Tensor::from_slice(&data_as(data, |x| {
            int(x).and_then(|i| i8::try_from(i).ok())
        })?),
        Kind::Bool => Tensor::from_slice(&data_as(data, Value::as_bool)?),
        other => return Err(format!("cannot decode dtype {other:?}")),
    };
    flat.f_reshape(&shape).map_err(|e| e.to_string())
}

/// Why an encoded tensordict could not be built.
#[derive(Debug)]
pub enum DecodeError {
    /// The JSON is not in the documented format (a broken case file).
    Format(String),
    /// The library refused the value (e.g. a batch size mismatch): the outcome of `construct`.
    Lib(torchrl::Error),
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::Format(s) => write!(f, "malformed case: {s}"),
            DecodeError::Lib(e) => write!(f, "{e}"),
        }
    }
}

impl From<String> for DecodeError {
    fn from(value: String) -> Self {
        DecodeError::Format(value)
    }
}

impl From<torchrl::Error> for DecodeError {
    fn from(value: torchrl::Error) -> Self {
        DecodeError::Lib(value)
    }
}

/// Decodes `{"batch_size", "entries"}` through the public API: `TensorDict::new(batch_size)`,
/// then `set` of every entry in order (nested tensordicts decoded first).
pub fn td_from_json(v: &Value) -> Result<TensorDict, DecodeError> {
    if !is_td_json(v) {
        return Err(DecodeError::Format(format!(
            "not an encoded tensordict: {v}"
        )));
    }
    let batch = shape_from_json(&v["batch_size"])?;
    let entries = v["entries"]
        .as_object()
        .ok_or_else(|| "entries is not an object".to_string())?;
    let mut td = TensorDict::new(&batch)?;
    // In file order: the insertion order is part of the recorded outcome.
    for (name, value) in entries {
        td.set(name.as_str(), entry_from_json(value)?)?;
    }
    Ok(td)
}

/// A tensor or a tensordict.
pub fn entry_from_json(v: &Value) -> Result<Entry, DecodeError> {
    if is_td_json(v) {
        Ok(Entry::Dict(td_from_json(v)?))
    } else {
        Ok(Entry::Tensor(tensor_from_json(v)?))
    }
}

/// A nested key: always a non-empty list of strings.
pub fn key_from_json(v: &Value) -> Result<NestedKey, String> {
    let parts = v
        .as_array()
        .and_then(|a| a.iter().map(Value::as_str).collect::<Option<Vec<&str>>>())
        .filter(|p| !p.is_empty())
        .ok_or_else(|| format!("expected a key (non-empty list of strings), got {v}"))?;
    Ok(NestedKey::from(parts))
}

/// A list of nested keys.
pub fn keys_from_json(v: &Value) -> Result<Vec<NestedKey>, String> {
    v.as_array()
        .ok_or_else(|| format!("expected a list of keys, got {v}"))?
        .iter()
        .map(key_from_json)
        .collect()
}

/// An index: a list of `{"int"}`, `{"slice"}`, `{"ellipsis"}`, `{"none"}`, `{"mask"}`,
/// `{"tensor"}` items. (A one-item list is Python's bare `x[item]`; the batch index is the same
/// list either way for tensordicts.)
pub fn index_from_json(v: &Value) -> Result<Vec<BatchIndex>, String> {
    let items = v
        .as_array()
        .ok_or_else(|| format!("an index is a list of items, got {v}"))?;
    items
        .iter()
        .map(|it| {
            let obj = it
                .as_object()
                .filter(|o| o.len() == 1)
                .ok_or_else(|| format!("bad index item {it}"))?;
            let (kind, val) = obj.first().map(|(k, v)| (k, v)).ok_or("empty index item")?;
            Ok(match kind.as_str() {
                "int" => BatchIndex::Int(val.as_i64().ok_or("int index is not an integer")?),
                "slice" => {
                    let parts = val
                        .as_array()
                        .filter(|p| p.len() == 3)
                        .ok_or("a slice is [start, stop, step]")?;
                    let opt = |x: &Value| -> Result<Option<i64>, String> {
                        if x.is_null() {
                            Ok(None)
                        } else {
                            x.as_i64()
                                .map(Some)
                                .ok_or_else(|| format!("bad slice bound {x}"))
                        }
                    };
                    BatchIndex::slice(
                        opt(&parts[0])?,
                        opt(&parts[1])?,
                        opt(&parts[2])?.unwrap_or(1),
                    )
                }
                "ellipsis" => BatchIndex::Ellipsis,
                "none" => BatchIndex::NewAxis,
                "mask" => BatchIndex::Mask(tensor_from_json(val)?),
                "tensor" => BatchIndex::Tensor(tensor_from_json(val)?),
                other => return Err(format!("unknown index item kind {other:?}")),
            })
        })
        .collect()
}

// ------------------------------------------------------------------ comparing

/// The values of a tensor, flattened row-major, in a comparable form.
#[derive(Debug, Clone, PartialEq)]
pub enum Values {
    /// Float dtypes, widened to f64.
    Float(Vec<f64>),
    /// Integer dtypes (and bools as 0/1), widened to i64.
    Int(Vec<i64>),
}

/// Reads every value of `t` (any device) as [`Values`].
pub fn tensor_values(t: &Tensor) -> Result<Values, String> {
    let flat = t
        .f_to_device(Device::Cpu)
        .and_then(|c| c.f_contiguous())
        .and_then(|c| c.f_reshape([-1]))
        .map_err(|e| e.to_string())?;
    if is_float(t.kind()) {
        Vec::<f64>::try_from(&flat)
            .map(Values::Float)
            .map_err(|e| e.to_string())
    } else {
        Vec::<i64>::try_from(&flat)
            .map(Values::Int)
            .map_err(|e| e.to_string())
    }
}

fn close(a: f64, b: f64, tol: f64) -> bool {
    (a.is_nan() && b.is_nan()) || approx::relative_eq!(a, b, epsilon = tol, max_relative = tol)
}

fn compare_values(actual: &Values, expected: &Values, tol: f64, path: &str) -> Result<(), String> {
    let first_diff = match (actual, expected) {
        (Values::Float(a), Values::Float(e)) => a
            .iter()
            .zip(e)
            .position(|(x, y)| !close(*x, *y, tol))
            .map(|i| format!("element {i}: got {}, expected {}", a[i], e[i])),
        (Values::Int(a), Values::Int(e)) => a
            .iter()
            .zip(e)
            .position(|(x, y)| x != y)
            .map(|i| format!("element {i}: got {}, expected {}", a[i], e[i])),
        _ => Some("one is float and the other is not".to_string()),
    };
    match first_diff {
        None => Ok(()),
        Some(d) => Err(format!(
            "{path}: values differ ({d}); got {}, expected {}",
            preview(actual),
            preview(expected)
        )),
    }
}

fn preview(v: &Values) -> String {
    const N: usize = 12;
    let (items, n): (Vec<String>, usize) = match v {
        Values::Float(x) => (x.iter().take(N).map(|f| f.to_string()).collect(), x.len()),
        Values::Int(x) => (x.iter().take(N).map(|i| i.to_string()).collect(), x.len()),
    };
    let more = if n > N { ", ..." } else { "" };
    format!("[{}{more}]", items.join(", "))
}

fn expected_values(v: &Value, kind: Kind) -> Result<Values, String> {
    let data = v["data"].as_array().ok_or("data is not a list")?;
    if is_float(kind) {
        data_as(data, Value::as_f64).map(Values::Float)
    } else if kind == Kind::Bool {
        data_as(data, |x| x.as_bool().map(i64::from)).map(Values::Int)
    } else {
        data_as(data, Value::as_i64).map(Values::Int)
    }
}

/// Checks a tensor against its JSON encoding: dtype, shape, then values (exact for integers
/// and bools, within [`FLOAT_TOL`] for floats). `path` names the value in the message.
pub fn check_tensor(actual: &Tensor, expected: &Value, path: &str) -> Result<(), String> {
    if !is_tensor_json(expected) {
        return Err(format!(
            "{path}: got a tensor, expected {}",
            describe(expected)
        ));
    }
    let kind = kind_from_name(expected["dtype"].as_str().ok_or("dtype is not a string")?)?;
    let shape = shape_from_json(&expected["shape"])?;
    if actual.kind() != kind {
        return Err(format!(
            "{path}: dtype {} ({:?}), expected {}",
            kind_name(actual.kind()).unwrap_or("?"),
            actual.kind(),
            kind_name(kind).unwrap_or("?")
        ));
    }
    if actual.size() != shape {
        return Err(format!(
            "{path}: shape {:?}, expected {shape:?}",
            actual.size()
        ));
    }
    compare_values(
        &tensor_values(actual)?,
        &expected_values(expected, kind)?,
        FLOAT_TOL,
        path,
    )
}

/// Checks a tensordict against its JSON encoding: batch size, key order, then every entry
/// recursively.
pub fn check_td(actual: &TensorDict, expected: &Value, path: &str) -> Result<(), String> {
    if !is_td_json(expected) {
        return Err(format!(
            "{path}: got a tensordict, expected {}",
            describe(expected)
        ));
    }
    let batch = shape_from_json(&expected["batch_size"])?;
    if actual.batch_size() != batch.as_slice() {
        return Err(format!(
            "{path}: batch size {:?}, expected {batch:?}",
            actual.batch_size()
        ));
    }
    let entries = expected["entries"]
        .as_object()
        .ok_or("entries is not an object")?;
    let got: Vec<String> = actual
        .keys(false, false)
        .iter()
        .map(|k| k.parts().collect::<Vec<_>>().join("."))
        .collect();
    let want: Vec<&String> = entries.iter().map(|(k, _)| k).collect();
    if got.iter().collect::<Vec<_>>() != want {
        return Err(format!(
            "{path}: keys {got:?}, expected {want:?} (in this order)"
        ));
    }
    for (name, ev) in entries {
        let sub = if path.is_empty() {
            name.clone()
        } else {
            format!("{path}.{name}")
        };
        let entry = actual
            .get_entry(name.as_str())
            .ok_or_else(|| format!("{sub}: missing"))?;
        check_entry(entry, ev, &sub)?;
    }
    Ok(())
}

/// [`check_tensor`] or [`check_td`], whichever the entry is.
pub fn check_entry(actual: &Entry, expected: &Value, path: &str) -> Result<(), String> {
    match actual {
        Entry::Tensor(t) => check_tensor(t, expected, path),
        Entry::Dict(d) => check_td(d, expected, path),
    }
}

/// Compares two tensors: same dtype, same shape, values equal (integers, bools) or within
/// `tol` (floats, absolute or relative).
pub fn tensors_close(actual: &Tensor, expected: &Tensor, tol: f64) -> Result<(), String> {
    if actual.kind() != expected.kind() {
        return Err(format!(
            "dtype {:?}, expected {:?}",
            actual.kind(),
            expected.kind()
        ));
    }
    if actual.size() != expected.size() {
        return Err(format!(
            "shape {:?}, expected {:?}",
            actual.size(),
            expected.size()
        ));
    }
    compare_values(
        &tensor_values(actual)?,
        &tensor_values(expected)?,
        tol,
        "tensor",
    )
}

fn describe(v: &Value) -> String {
    if is_tensor_json(v) {
        format!("a tensor of shape {}", v["shape"])
    } else if is_td_json(v) {
        format!("a tensordict of batch size {}", v["batch_size"])
    } else {
        let s = v.to_string();
        if s.chars().count() > 80 {
            format!("{}...", s.chars().take(80).collect::<String>())
        } else {
            s
        }
    }
}

// ------------------------------------------------------------------ error facts

/// Every key name that appears in `args`: entry names of encoded tensordicts (at any depth)
/// and the strings of key lists. Used to tell key facts from wording facts.
pub fn key_names(args: &Value) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    collect_key_names(args, &mut out);
    out
}

fn collect_key_names(v: &Value, out: &mut BTreeSet<String>) {
    match v {
        Json::Object(_) if is_td_json(v) => {
            if let Some(entries) = v["entries"].as_object() {
                for (k, e) in entries {
                    out.insert(k.clone());
                    collect_key_names(e, out);
                }
            }
        }
        Json::Object(_) if is_tensor_json(v) => {}
        Json::Object(o) => o.iter().for_each(|(_, x)| collect_key_names(x, out)),
        Json::Array(a) => {
            for x in a {
                match x {
                    Json::String(s) => {
                        out.insert(s.clone());
                    }
                    other => collect_key_names(other, out),
                }
            }
        }
        _ => {}
    }
}

/// The facts absent from the Rust error message `msg`.
///
/// A fact that names a key of the case (`"x"` or Python's `"'x'"`) must appear as our quoted
/// key segment `"x"` (keys display as `"a"` or `("b", "c")`, so a quoted segment matches both
/// forms, and a bare letter cannot match by accident inside another word). Any other fact
/// (shapes like `[3, 4]`, numbers, wording) must appear verbatim.
pub fn missing_facts(msg: &str, facts: &[String], key_names: &BTreeSet<String>) -> Vec<String> {
    facts
        .iter()
        .filter(|f| {
            let bare = f.trim_matches('\'');
            if key_names.contains(bare) {
                !msg.contains(&format!("\"{bare}\""))
            } else {
                !msg.contains(f.as_str())
            }
        })
        .cloned()
        .collect()
}

// ------------------------------------------------------------------ collecting failures

/// Collects failures so that a replay loop reports all of them at once.
#[derive(Debug, Default)]
pub struct Failures {
    list: Vec<String>,
}

impl Failures {
    /// Records a failure for `case`.
    pub fn push(&mut self, case: &str, what: impl fmt::Display) {
        self.list.push(format!("{case}: {what}"));
    }

    /// Records the error of `r`, if any.
    pub fn check(&mut self, case: &str, r: Result<(), String>) {
        if let Err(e) = r {
            self.push(case, e);
        }
    }

    /// Number of failures so far.
    pub fn len(&self) -> usize {
        self.list.len()
    }

    /// True when nothing failed.
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Panics with the numbered list of failures, if any.
    pub fn assert_none(&self, what: &str) {
        if !self.list.is_empty() {
            let body: Vec<String> = self
                .list
                .iter()
                .enumerate()
                .map(|(i, f)| format!("  {}. {f}", i + 1))
                .collect();
            panic!(
                "{what}: {} failure(s):\n{}",
                self.list.len(),
                body.join("\n")
            );
        }
    }
}
