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
        .keys(torchrl::tensordict::KeysOptions::top_level())
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

// ------------------------------------------------------------------ specs
//
// Used by tests/reference_specs.rs (`specs/spec_cases.json`): decoding encoded specs and
// constructor calls into `TensorSpec`s through the public API, comparing a `TensorSpec` with
// its encoding, and the fact helpers specific to spec errors.

use torchrl::specs::{
    Binary, Bounded, Categorical, Composite, MultiCategorical, MultiOneHot, OneHot, TensorSpec,
    Unbounded,
};
use torchrl::tensordict::KeysOptions;

/// The spec classes of the case files (TorchRL's names, which are also
/// [`TensorSpec::class_name`]).
pub const SPEC_CLASSES: &[&str] = &[
    "Unbounded",
    "Bounded",
    "Categorical",
    "OneHot",
    "Binary",
    "MultiCategorical",
    "MultiOneHot",
    "Composite",
];

/// True for an encoded spec (an object with a `class`).
pub fn is_spec_json(v: &Value) -> bool {
    v.get("class").and_then(Value::as_str).is_some()
}

fn spec_field<'a>(v: &'a Value, class: &str, name: &str) -> Result<&'a Value, String> {
    v.get(name)
        .ok_or_else(|| format!("encoded {class} has no {name:?}"))
}

fn spec_int(v: &Value, class: &str, name: &str) -> Result<i64, String> {
    spec_field(v, class, name)?
        .as_i64()
        .ok_or_else(|| format!("{class}.{name} is not an integer"))
}

fn spec_kind(v: &Value, class: &str) -> Result<Kind, String> {
    kind_from_name(
        spec_field(v, class, "dtype")?
            .as_str()
            .ok_or_else(|| format!("{class}.dtype is not a string"))?,
    )
}

/// A `nvec`: a flat list, or (MultiCategorical after expand / batching) a nested list whose
/// innermost rows must all be equal (Rust's `nvec` is one row shared by every batch position).
/// Returns the row and the nested list's shape.
pub fn nvec_from_json(v: &Value) -> Result<(Vec<i64>, Vec<i64>), String> {
    fn walk(
        v: &Value,
        depth: usize,
        shape: &mut Vec<i64>,
        rows: &mut Vec<Vec<i64>>,
    ) -> Result<(), String> {
        let items = v
            .as_array()
            .ok_or_else(|| format!("nvec: expected a list, got {v}"))?;
        if shape.len() == depth {
            shape.push(items.len() as i64);
        } else if shape[depth] != items.len() as i64 {
            return Err(format!("nvec: ragged nested list at depth {depth}"));
        }
        if items.iter().all(|x| x.as_i64().is_some()) {
            rows.push(items.iter().filter_map(Value::as_i64).collect());
            return Ok(());
        }
        items
            .iter()
            .try_for_each(|x| walk(x, depth + 1, shape, rows))
    }
    let (mut shape, mut rows) = (Vec::new(), Vec::new());
    walk(v, 0, &mut shape, &mut rows)?;
    let first = rows.first().cloned().ok_or("nvec: empty")?;
    if let Some(other) = rows.iter().find(|r| **r != first) {
        return Err(format!(
            "nvec rows differ ({first:?} and {other:?}): Rust's MultiCategorical shares one nvec \
             across batch positions"
        ));
    }
    Ok((first, shape))
}

fn mask_from_json(v: &Value, class: &str) -> Result<Option<Tensor>, String> {
    match v.get("mask") {
        None | Some(Json::Null) => Ok(None),
        Some(m) => tensor_from_json(m)
            .map(Some)
            .map_err(|e| format!("{class}.mask: {e}")),
    }
}

fn no_mask(v: &Value, class: &str) -> Result<(), String> {
    match mask_from_json(v, class)? {
        None => Ok(()),
        Some(_) => Err(format!("Rust's {class} has no mask")),
    }
}

/// Decodes an encoded spec (`{"class", "shape", "dtype", ...}`, see specs/README.md) through
/// the public builders: `Unbounded::new().with_shape().with_dtype()`, `Bounded::from_tensors`
/// (then `with_dtype` when the dtype differs), `Categorical::new(n).with_shape().with_dtype()
/// .with_mask()`, and so on; a Composite is `Composite::new(shape)` then `with` / `with_none`
/// for each entry, in order.
pub fn spec_from_json(v: &Value) -> Result<TensorSpec, DecodeError> {
    let class = v
        .get("class")
        .and_then(Value::as_str)
        .ok_or_else(|| format!("not an encoded spec: {v}"))?;
    let shape = shape_from_json(spec_field(v, class, "shape")?)?;
    Ok(match class {
        "Composite" => {
            let entries = spec_field(v, class, "entries")?
                .as_object()
                .ok_or("Composite.entries is not an object")?;
            let mut c = Composite::new(&shape)?;
            for (name, e) in entries {
                c = if e.is_null() {
                    c.with_none(name.as_str())?
                } else {
                    c.with(name.as_str(), spec_from_json(e)?)?
                };
            }
            c.into()
        }
        "Unbounded" => Unbounded::new()
            .with_shape(&shape)?
            .with_dtype(spec_kind(v, class)?)?
            .into(),
        "Bounded" => {
            let low = tensor_from_json(spec_field(v, class, "low")?)?;
            let high = tensor_from_json(spec_field(v, class, "high")?)?;
            let mut b = Bounded::from_tensors(low, high)?;
            if b.shape() != shape.as_slice() {
                b = b.expand(&shape)?;
            }
            let kind = spec_kind(v, class)?;
            if b.dtype() != kind {
                b = b.with_dtype(kind)?;
            }
            b.into()
        }
        "Categorical" => {
            let mut c = Categorical::new(spec_int(v, class, "n")?)?
                .with_shape(&shape)?
                .with_dtype(spec_kind(v, class)?)?;
            if let Some(m) = mask_from_json(v, class)? {
                c = c.with_mask(m)?;
            }
            c.into()
        }
        "OneHot" => {
            let mut o = OneHot::new(spec_int(v, class, "n")?)?
                .with_shape(&shape)?
                .with_dtype(spec_kind(v, class)?)?;
            if let Some(m) = mask_from_json(v, class)? {
                o = o.with_mask(m)?;
            }
            o.into()
        }
        "Binary" => {
            no_mask(v, class)?;
            Binary::new(spec_int(v, class, "n")?)?
                .with_shape(&shape)?
                .with_dtype(spec_kind(v, class)?)?
                .into()
        }
        "MultiCategorical" => {
            no_mask(v, class)?;
            let (nvec, _) = nvec_from_json(spec_field(v, class, "nvec")?)?;
            MultiCategorical::new(nvec)?
                .with_shape(&shape)?
                .with_dtype(spec_kind(v, class)?)?
                .into()
        }
        "MultiOneHot" => {
            no_mask(v, class)?;
            let (nvec, nshape) = nvec_from_json(spec_field(v, class, "nvec")?)?;
            if nshape.len() != 1 {
                return Err(DecodeError::Format(format!(
                    "MultiOneHot.nvec must be flat, got shape {nshape:?}"
                )));
            }
            MultiOneHot::new(nvec)?
                .with_shape(&shape)?
                .with_dtype(spec_kind(v, class)?)?
                .into()
        }
        other => return Err(DecodeError::Format(format!("unknown spec class {other:?}"))),
    })
}

/// A ctor number or tensor as a tensor (numbers become float32 0-d tensors, like Python's
/// default dtype).
fn bound_tensor(v: &Value, like: Option<Kind>) -> Result<Tensor, String> {
    if is_tensor_json(v) {
        return tensor_from_json(v);
    }
    let x = v
        .as_f64()
        .ok_or_else(|| format!("a bound is a number or a tensor, got {v}"))?;
    Tensor::f_from_slice(&[x as f32])
        .and_then(|t| t.f_reshape([] as [i64; 0]))
        .and_then(|t| t.f_to_kind(like.unwrap_or(Kind::Float)))
        .map_err(|e| e.to_string())
}

/// Decodes a constructor call (`"ctor"` of `construct` cases: `{"class", kwarg: value, ...}`)
/// into the Rust call that stands for it:
///
/// | Python | Rust |
/// |---|---|
/// | `Unbounded(shape=, dtype=)` | `Unbounded::new()` `.with_shape()` `.with_dtype()` (an int shape is `[n]`) |
/// | `Bounded(low=x, high=y, shape=s)`, numbers | `Bounded::new(x, y, s)` |
/// | `Bounded(low=x, high=y)`, numbers, no shape | `Bounded::from_tensors` of 0-d float32 tensors (Rust's only shape-less constructor) |
/// | `Bounded(low=t, high=u[, shape=s])`, tensors | `Bounded::from_tensors(t, u)` (then `expand(s)` when `s` differs) |
/// | `dtype=` (Bounded) | `.with_dtype()` |
/// | `Categorical(n, shape=, dtype=, mask=)` / `OneHot(...)` | `new(n)` `.with_shape()` `.with_dtype()` `.with_mask()` |
/// | `Binary(n=, shape=)` | `Binary::new(n or shape[-1])` `.with_shape(shape)` |
/// | `MultiCategorical(nvec)` / `MultiOneHot(nvec)` | `new(nvec)` (then the same builders) |
/// | `Composite(shape=, **entries)` | `Composite::new(shape or [])` then `with` / `with_none` in order |
///
/// A keyword Rust has no counterpart for is a [`DecodeError::Format`] naming it.
pub fn spec_from_ctor(v: &Value) -> Result<TensorSpec, DecodeError> {
    let obj = v
        .as_object()
        .ok_or_else(|| format!("a ctor is an object, got {v}"))?;
    let class = v
        .get("class")
        .and_then(Value::as_str)
        .ok_or("a ctor has a \"class\"")?;
    let allowed: &[&str] = match class {
        "Unbounded" => &["shape", "dtype"],
        "Bounded" => &["low", "high", "shape", "dtype"],
        "Categorical" | "OneHot" => &["n", "shape", "dtype", "mask"],
        "Binary" => &["n", "shape", "dtype"],
        "MultiCategorical" | "MultiOneHot" => &["nvec", "shape", "dtype"],
        "Composite" => &["shape", "entries"],
        other => return Err(DecodeError::Format(format!("unknown ctor class {other:?}"))),
    };
    if let Some((k, _)) = obj
        .iter()
        .find(|(k, _)| k != "class" && !allowed.contains(&k.as_str()))
    {
        return Err(DecodeError::Format(format!(
            "Rust's {class} has no argument {k:?} (its arguments: {allowed:?})"
        )));
    }
    let shape = match v.get("shape") {
        None => None,
        Some(s) => Some(match s.as_i64() {
            Some(n) => vec![n],
            None => shape_from_json(s)?,
        }),
    };
    let dtype = match v.get("dtype") {
        None => None,
        Some(d) => Some(kind_from_name(d.as_str().ok_or("dtype is not a string")?)?),
    };
    let int = |name: &str| -> Result<Option<i64>, String> {
        match v.get(name) {
            None => Ok(None),
            Some(x) => x
                .as_i64()
                .map(Some)
                .ok_or_else(|| format!("{class}.{name} is not an integer")),
        }
    };
    let mask = match v.get("mask") {
        None | Some(Json::Null) => None,
        Some(m) => Some(tensor_from_json(m)?),
    };
    Ok(match class {
        "Unbounded" => {
            let mut u = Unbounded::new();
            if let Some(s) = &shape {
                u = u.with_shape(s)?;
            }
            if let Some(k) = dtype {
                u = u.with_dtype(k)?;
            }
            u.into()
        }
        "Bounded" => {
            let low = v.get("low").ok_or("Bounded ctor without low")?;
            let high = v.get("high").ok_or("Bounded ctor without high")?;
            let mut b = match (low.as_f64(), high.as_f64(), &shape) {
                (Some(l), Some(h), Some(s)) if !is_tensor_json(low) && !is_tensor_json(high) => {
                    Bounded::new(l, h, s)?
                }
                _ => {
                    let lt = if is_tensor_json(low) {
                        Some(tensor_from_json(low)?)
                    } else {
                        None
                    };
                    let ht = if is_tensor_json(high) {
                        Some(tensor_from_json(high)?)
                    } else {
                        None
                    };
                    let like = lt.as_ref().or(ht.as_ref()).map(Tensor::kind);
                    let lt = match lt {
                        Some(t) => t,
                        None => bound_tensor(low, like)?,
                    };
                    let ht = match ht {
                        Some(t) => t,
                        None => bound_tensor(high, like)?,
                    };
                    let b = Bounded::from_tensors(lt, ht)?;
                    match &shape {
                        Some(s) if b.shape() != s.as_slice() => b.expand(s)?,
                        _ => b,
                    }
                }
            };
            if let Some(k) = dtype {
                b = b.with_dtype(k)?;
            }
            b.into()
        }
        "Categorical" => {
            let mut c = Categorical::new(int("n")?.ok_or("Categorical ctor without n")?)?;
            if let Some(s) = &shape {
                c = c.with_shape(s)?;
            }
            if let Some(k) = dtype {
                c = c.with_dtype(k)?;
            }
            if let Some(m) = mask {
                c = c.with_mask(m)?;
            }
            c.into()
        }
        "OneHot" => {
            let mut o = OneHot::new(int("n")?.ok_or("OneHot ctor without n")?)?;
            if let Some(s) = &shape {
                o = o.with_shape(s)?;
            }
            if let Some(k) = dtype {
                o = o.with_dtype(k)?;
            }
            if let Some(m) = mask {
                o = o.with_mask(m)?;
            }
            o.into()
        }
        "Binary" => {
            let n = match (int("n")?, &shape) {
                (Some(n), _) => n,
                (None, Some(s)) => *s.last().ok_or("Binary ctor with an empty shape and no n")?,
                (None, None) => {
                    return Err(DecodeError::Format("Binary ctor without n or shape".into()))
                }
            };
            let mut b = Binary::new(n)?;
            if let Some(s) = &shape {
                b = b.with_shape(s)?;
            }
            if let Some(k) = dtype {
                b = b.with_dtype(k)?;
            }
            b.into()
        }
        "MultiCategorical" | "MultiOneHot" => {
            let (nvec, nshape) = nvec_from_json(v.get("nvec").ok_or("ctor without nvec")?)?;
            if nshape.len() != 1 {
                return Err(DecodeError::Format(format!(
                    "{class} ctor: nvec must be a flat list, got shape {nshape:?}"
                )));
            }
            if class == "MultiCategorical" {
                let mut m = MultiCategorical::new(nvec)?;
                if let Some(sh) = &shape {
                    m = m.with_shape(sh)?;
                }
                if let Some(k) = dtype {
                    m = m.with_dtype(k)?;
                }
                m.into()
            } else {
                let mut m = MultiOneHot::new(nvec)?;
                if let Some(sh) = &shape {
                    m = m.with_shape(sh)?;
                }
                if let Some(k) = dtype {
                    m = m.with_dtype(k)?;
                }
                m.into()
            }
        }
        "Composite" => {
            let mut c = Composite::new(shape.unwrap_or_default())?;
            if let Some(entries) = v.get("entries") {
                let entries = entries
                    .as_object()
                    .ok_or("Composite ctor: entries is not an object")?;
                for (name, e) in entries {
                    c = if e.is_null() {
                        c.with_none(name.as_str())?
                    } else {
                        c.with(name.as_str(), spec_from_json(e)?)?
                    };
                }
            }
            c.into()
        }
        other => return Err(DecodeError::Format(format!("unknown ctor class {other:?}"))),
    })
}

fn check_mask(actual: Option<&Tensor>, expected: &Value, path: &str) -> Result<(), String> {
    match (actual, expected) {
        (None, Json::Null) => Ok(()),
        (Some(_), Json::Null) => Err(format!("{path}: a mask, expected none")),
        (None, _) => Err(format!("{path}: no mask, expected {}", describe(expected))),
        (Some(a), e) => {
            // Rust stores the mask expanded to the spec's full mask shape; Python keeps the
            // tensor it was given. Compare after broadcasting the recorded one.
            let e = tensor_from_json(e)?;
            let e = e
                .f_broadcast_to(a.size().as_slice())
                .map_err(|err| format!("{path}: recorded mask does not broadcast: {err}"))?;
            tensors_close(a, &e, 0.0).map_err(|err| format!("{path}: {err}"))
        }
    }
}

fn check_int_field(actual: i64, expected: &Value, path: &str) -> Result<(), String> {
    match expected.as_i64() {
        Some(e) if e == actual => Ok(()),
        _ => Err(format!("{path}: {actual}, expected {expected}")),
    }
}

/// Checks a `MultiCategorical` / `MultiOneHot` `nvec` (flat in Rust) against its recording: a
/// flat list must be equal; a nested list (Python's per-position `nvec` after expand / batching)
/// must have the spec's shape and every row must equal Rust's `nvec`.
pub fn check_nvec(
    actual: &[i64],
    spec_shape: &[i64],
    expected: &Value,
    path: &str,
) -> Result<(), String> {
    let (row, nshape) = nvec_from_json(expected).map_err(|e| format!("{path}: {e}"))?;
    if nshape.len() > 1 && nshape != spec_shape {
        return Err(format!(
            "{path}: recorded nested nvec has shape {nshape:?}, the spec has shape {spec_shape:?}"
        ));
    }
    if row != actual {
        return Err(format!("{path}: {actual:?}, expected rows of {row:?}"));
    }
    Ok(())
}

/// Checks a spec against its encoding: class, shape, dtype, then the class parameters
/// (`low`/`high` as tensors, `n`, `mask`, `nvec`) and, for a Composite, its entries in key
/// order (`None` entries included), recursively. `path` names the spec in the message.
///
/// Representation notes: `Binary.n` is recorded as `shape[-1]` and Rust's `Binary::n()` is
/// the vector length, so they are compared directly (Python's own `Binary.n` attribute, 2, is
/// never recorded); a nested `nvec` is compared row-wise ([`check_nvec`]); masks are compared
/// after broadcasting the recorded tensor to Rust's (expanded) mask shape.
pub fn check_spec(actual: &TensorSpec, expected: &Value, path: &str) -> Result<(), String> {
    if !is_spec_json(expected) {
        return Err(format!(
            "{path}: got a spec ({actual}), expected {}",
            describe(expected)
        ));
    }
    let class = expected["class"].as_str().unwrap_or("?");
    if actual.class_name() != class {
        return Err(format!(
            "{path}: class {}, expected {class}",
            actual.class_name()
        ));
    }
    let shape = shape_from_json(&expected["shape"])?;
    if actual.shape() != shape.as_slice() {
        return Err(format!(
            "{path}: shape {:?}, expected {shape:?}",
            actual.shape()
        ));
    }
    let want_dtype = match &expected["dtype"] {
        Json::Null => None,
        d => Some(kind_from_name(d.as_str().ok_or("dtype is not a string")?)?),
    };
    if actual.dtype() != want_dtype {
        return Err(format!(
            "{path}: dtype {:?}, expected {want_dtype:?}",
            actual.dtype()
        ));
    }
    let sub = |name: &str| format!("{path}.{name}");
    match actual {
        TensorSpec::Unbounded(_) | TensorSpec::NonTensor(_) => Ok(()),
        TensorSpec::Bounded(b) => {
            check_tensor(b.low(), &expected["low"], &sub("low"))?;
            check_tensor(b.high(), &expected["high"], &sub("high"))
        }
        TensorSpec::Categorical(c) => {
            check_int_field(c.n(), &expected["n"], &sub("n"))?;
            check_mask(c.mask(), &expected["mask"], &sub("mask"))
        }
        TensorSpec::OneHot(o) => {
            check_int_field(o.n(), &expected["n"], &sub("n"))?;
            check_mask(o.mask(), &expected["mask"], &sub("mask"))
        }
        TensorSpec::Binary(b) => {
            // The recording stores the constructor's `n` (the length); TorchRL's `Binary.n` is 2.
            check_int_field(b.length(), &expected["n"], &sub("n"))?;
            if b.n() != 2 {
                return Err(format!("{path}: Binary n {}, expected 2 (TorchRL)", b.n()));
            }
            check_mask(None, &expected["mask"], &sub("mask"))
        }
        TensorSpec::MultiCategorical(m) => {
            check_nvec(m.nvec(), m.shape(), &expected["nvec"], &sub("nvec"))?;
            check_mask(None, &expected["mask"], &sub("mask"))
        }
        TensorSpec::MultiOneHot(m) => {
            check_nvec(m.nvec(), m.shape(), &expected["nvec"], &sub("nvec"))?;
            check_mask(None, &expected["mask"], &sub("mask"))
        }
        TensorSpec::Composite(c) => check_composite(c, expected, path),
    }
}

fn check_composite(actual: &Composite, expected: &Value, path: &str) -> Result<(), String> {
    let entries = expected["entries"]
        .as_object()
        .ok_or_else(|| format!("{path}: Composite.entries is not an object"))?;
    let items = actual.items(KeysOptions::top_level());
    let got: Vec<String> = items
        .iter()
        .map(|(k, _)| k.parts().collect::<Vec<_>>().join("."))
        .collect();
    let want: Vec<&String> = entries.iter().map(|(k, _)| k).collect();
    if got.iter().collect::<Vec<_>>() != want {
        return Err(format!(
            "{path}: keys {got:?}, expected {want:?} (in this order)"
        ));
    }
    for ((name, ev), (_, spec)) in entries.iter().zip(&items) {
        let p = format!("{path}.{name}");
        match (spec, ev) {
            (None, Json::Null) => {}
            (None, e) => return Err(format!("{p}: None, expected {}", describe(e))),
            (Some(s), Json::Null) => return Err(format!("{p}: {s}, expected None")),
            (Some(s), e) => check_spec(s, e, &p)?,
        }
    }
    Ok(())
}

/// [`key_names`] plus the entry names of every encoded Composite (and Composite ctor) in
/// `args`: the key names a spec error may mention.
pub fn spec_key_names(args: &Value) -> BTreeSet<String> {
    fn walk(v: &Value, out: &mut BTreeSet<String>) {
        match v {
            Json::Object(o) => {
                if v["class"].as_str() == Some("Composite") {
                    if let Some(entries) = v["entries"].as_object() {
                        out.extend(entries.iter().map(|(k, _)| k.clone()));
                    }
                }
                o.iter().for_each(|(_, x)| walk(x, out));
            }
            Json::Array(a) => a.iter().for_each(|x| walk(x, out)),
            _ => {}
        }
    }
    let mut out = key_names(args);
    walk(args, &mut out);
    out
}

/// A recorded fact as the Rust message spells it: Python dtype names (`float32`) become the
/// `tch::Kind` names Rust prints (`Float`); anything else is unchanged.
pub fn rust_fact(fact: &str) -> String {
    match kind_from_name(fact) {
        Ok(kind) => format!("{kind:?}"),
        Err(_) => fact.to_string(),
    }
}

/// The numbers of a JSON number or (nested) list of numbers, row-major (`encode`'s argument).
pub fn numbers_from_json(v: &Value) -> Result<Vec<f64>, String> {
    match v {
        Json::Number(_) => Ok(vec![v.as_f64().ok_or("bad number")?]),
        Json::Array(a) => {
            let mut out = Vec::new();
            for x in a {
                out.extend(numbers_from_json(x)?);
            }
            Ok(out)
        }
        other => Err(format!(
            "expected a number or a list of numbers, got {other}"
        )),
    }
}

impl From<&str> for DecodeError {
    fn from(value: &str) -> Self {
        DecodeError::Format(value.to_string())
    }
}

/// Why a reference case produced no outcome.
pub enum RunError {
    /// The case file is not in the documented format (or needs an argument Rust lacks).
    Bad(String),
    /// The library returned an error: the outcome of an error case.
    Lib(torchrl::Error),
}

impl From<torchrl::Error> for RunError {
    fn from(value: torchrl::Error) -> Self {
        RunError::Lib(value)
    }
}

impl From<String> for RunError {
    fn from(value: String) -> Self {
        RunError::Bad(value)
    }
}

impl From<&str> for RunError {
    fn from(value: &str) -> Self {
        RunError::Bad(value.to_string())
    }
}

/// `e` as text (for `map_err`).
pub fn text(e: impl std::fmt::Display) -> String {
    e.to_string()
}
