//! Replays every case of `specs/spec_cases.json` (recorded from Python TorchRL 0.14.1, see
//! `specs/README.md`) through the public Rust API (`torchrl::specs::*`, `torchrl::Generator`)
//! and checks the recorded outcome: encoded specs (class, shape, dtype, `low`/`high`, `n`,
//! `nvec`, `mask`, Composite entries in key order), values (exact for integers and bools, within
//! 1e-6 for floats), bools and key lists (in order); for error cases, that Rust returns an `Err`
//! whose message holds every recorded fact.
//!
//! Python is never run. Each op family has its own `#[test]`; each collects every failure and
//! asserts once, with the list. No case is skipped: `every_case_belongs_to_a_family` checks that
//! the families cover the file exactly once, and each family checks that it replayed all of its
//! cases.
//!
//! # How each op maps onto the Rust API
//!
//! | op | Rust |
//! |---|---|
//! | `construct` | [`spec_from_ctor`] (tests/common): the builder calls standing for the Python constructor |
//! | `is_in` / `project` | `TensorSpec::is_in` / `TensorSpec::project` (an `Entry`: tensor or tensordict) |
//! | `zero` / `one` | `TensorSpec::zero` / `TensorSpec::one` |
//! | `expand` / `index` / `squeeze` / `unsqueeze` | same names on `TensorSpec` (`index` is Python's `spec[idx]`) |
//! | `encode` | `TensorSpec::encode(&[f64])` (the JSON number or list, flattened row-major) |
//! | `to_one_hot` | `Categorical::to_one_hot` / `MultiCategorical::to_one_hot` |
//! | `to_categorical` | `OneHot::to_categorical` / `MultiOneHot::to_categorical` |
//! | `eq` | `TensorSpec == TensorSpec` |
//! | `stack` | `stack_specs` |
//! | `keys` / `is_empty` | `Composite::keys` / `Composite::is_empty` |
//! | `rand_is_in` | `TensorSpec::rand(&mut Generator::new(0), shape)` then `is_in`; shapes and dtypes of the sample are checked, values are not (different generators) |
//!
//! Error facts: a fact naming a key of the case must appear as the quoted key (`"b"`); a Python
//! dtype name is looked for as Rust's `tch::Kind` name (`float32` → `Float`, see [`rust_fact`]);
//! any other fact verbatim. Deliberate differences from Python are listed in [`DEVIATIONS`]
//! (the case is still run, Python's recorded outcome is asserted *not* to be reproduced, and
//! Rust's documented behaviour is asserted instead); facts that only fit Python's wording are
//! listed in [`FACT_NOTES`].
//!
//! Items of the review checklist that turned out *not* to be deviations (Rust matches the
//! recording; see [`NOT_DEVIATIONS`], whose cases are replayed like any other):
//! protected last dims, `Binary.n`, nested `nvec`, `OneHot::one`, `Bounded::zero/one`.

mod common;

use std::collections::BTreeMap;

use common::*;
use tch::{Kind, Tensor};
use torchrl::specs::{stack_specs, Bounded, Recurse, TensorSpec};
use torchrl::tensordict::KeysOptions;
use torchrl::{Entry, Error, Generator, NestedKey};

const CASES_FILE: &str = "spec_cases.json";

/// The op families, one `#[test]` each. Together they must cover every op in the file.
const FAMILIES: &[(&str, &[&str])] = &[
    ("construct", &["construct"]),
    ("membership", &["is_in", "project", "rand_is_in"]),
    ("fill", &["zero", "one"]),
    ("shape", &["expand", "index", "squeeze", "unsqueeze"]),
    ("encoding", &["encode", "to_one_hot", "to_categorical"]),
    ("eq_stack", &["eq", "stack"]),
    ("composite_keys", &["keys", "is_empty"]),
];

// ------------------------------------------------------------------ deviations

/// A case whose recorded Python outcome Rust deliberately does not reproduce.
struct Deviation {
    case: &'static str,
    /// Why Rust differs.
    reason: &'static str,
    /// What Rust does instead (asserted by `check`).
    rust_does: &'static str,
    check: fn(&Case) -> Result<(), String>,
}

/// Deliberate differences from Python. Each case is still replayed: the test asserts that the
/// Python outcome is indeed not reproduced (else the entry is stale) and that Rust does what
/// `rust_does` says.
const DEVIATIONS: &[Deviation] = &[
    Deviation {
        case: "construct_error_bounded_no_shape",
        reason: "Python's Bounded cannot tell scalar bounds meant to broadcast from a scalar \
                 spec, so scalar bounds without a shape raise. In Rust the scalar-bounds \
                 constructor `Bounded::new(low, high, shape)` takes the shape as a required \
                 argument (the Python runtime error is a compile-time one), and the only \
                 shape-less constructor, `Bounded::from_tensors`, documents that the shape is the \
                 broadcast of the bound tensors' shapes",
        rust_does: "`Bounded::from_tensors` of 0-d float32 bounds -1 and 1 returns Ok: a scalar \
                    spec (shape [], dtype Float), equal to `Bounded::new(-1.0, 1.0, [])`",
        check: deviation_bounded_no_shape,
    },
    Deviation {
        case: "construct_error_bounded_maximum_removed",
        reason: "`maximum` is a removed Python keyword that TorchRL still intercepts to raise a \
                 TypeError; Rust never had it, so there is no call that could pass it (it would \
                 not compile)",
        rust_does: "the ctor decoder refuses `maximum` as an argument Rust's Bounded does not \
                    have; the rest of the call, `Bounded::new(-1.0, 1.0, [1])`, builds \
                    Bounded(shape=[1], low=-1, high=1)",
        check: deviation_bounded_maximum,
    },
    Deviation {
        case: "is_in_error_unbounded_not_broadcastable",
        reason: "`is_in` answers a yes/no question; TorchRL 0.14.1's Unbounded.is_in lets the \
                 broadcast error escape for a shape that does not fit, while every other leaf \
                 returns False. Rust applies one shape rule to every spec (module docs of \
                 torchrl::specs) and keeps errors for misuse (a missing Composite key)",
        rust_does: "`is_in` returns Ok(false); `check` returns Error::NotInSpec whose reason \
                    names the value shape [3] and the spec shape [2]",
        check: deviation_is_in_not_broadcastable,
    },
    Deviation {
        case: "project_categorical_float_value_into_int_spec",
        reason: "Python's Categorical.project rounds and clamps but keeps the value's dtype, so \
                 the projection of a float32 value into an int64 spec is still not in the spec; \
                 Rust's project casts to the spec's dtype so that `is_in(project(x))` always \
                 holds (module docs of torchrl::specs)",
        rust_does: "`project` returns int64 [2, 2] (1.6 rounds to 2, 5.0 clamps to 2), and \
                    `is_in` of it is true",
        check: deviation_project_casts,
    },
    Deviation {
        case: "is_empty_nested_empty_recursive",
        reason: "TorchRL documents `is_empty(recurse=True)` as true when no leaf spec exists at \
                 any depth, but 0.14.1 falls through to `len(self._specs) == 0` for a composite \
                 holding an empty composite; Rust follows the documented intent",
        rust_does: "`is_empty(Recurse::Yes)` is true (and `is_empty(Recurse::No)` is false: there is one entry)",
        check: deviation_is_empty_recursive,
    },
    Deviation {
        case: "is_empty_only_none_recursive",
        reason: "as is_empty_nested_empty_recursive: a composite whose only entry is None has \
                 no leaf spec, which TorchRL's docs call empty with recurse=True; 0.14.1 returns \
                 False",
        rust_does: "`is_empty(Recurse::Yes)` is true (and `is_empty(Recurse::No)` is false: there is one entry)",
        check: deviation_is_empty_recursive,
    },
];

/// Checklist items reviewed against the recordings that need no [`DEVIATIONS`] entry because
/// Rust reproduces the recorded outcome: `(topic, cases, why)`. The cases are replayed like any
/// other (and must pass); this table only records the review.
const NOT_DEVIATIONS: &[(&str, &[&str], &str)] = &[
    (
        "protected last dims (OneHot / Binary / MultiCategorical / MultiOneHot)",
        &[
            "index_onehot_keeps_last_dim",
            "index_error_onehot_last_dim",
            "index_error_onehot_unbatched",
            "index_multicategorical_row",
            "unsqueeze_front",
            "unsqueeze_error_onehot_last",
            "expand_onehot",
        ],
        "Python also refuses to index, unsqueeze or change the last dim of these specs; Rust \
         errors where Python errors and gives the same shapes elsewhere",
    ),
    (
        "Binary.n",
        &[
            "construct_binary_n",
            "construct_binary_shape_only",
            "is_in_binary_value_2_false",
        ],
        "the recorder stores the constructor's n (shape[-1]), which is Rust's Binary::length(); \
         Binary::n() is 2 as Python's Binary.n attribute (checked by check_spec)",
    ),
    (
        "nested MultiCategorical nvec",
        &["index_multicategorical_row"],
        "Rust's nvec is one flat row shared by every batch position; the decoder and check_spec \
         accept Python's nested nvec when all its rows are that row (and its shape is the spec's)",
    ),
    (
        "OneHot one()",
        &["one_onehot_is_all_true"],
        "Rust's OneHot::one is all-true like Python's (documented as not one-hot, as TorchRL); \
         it is a placeholder like zero(), not a sample",
    ),
    (
        "Bounded zero() / one() ignore the bounds",
        &["zero_bounded_ignores_bounds", "one_bounded_int"],
        "Rust's Bounded::zero / one are documented to ignore the bounds, as TorchRL",
    ),
];

/// An error fact that does not apply to Rust, and what is checked instead.
#[allow(dead_code)] // constructed only when FACT_NOTES is non-empty
struct FactNote {
    case: &'static str,
    /// The recorded facts not checked.
    python_facts: &'static [&'static str],
    /// Why they do not apply.
    reason: &'static str,
    /// Checked in their place (same rules as recorded facts).
    rust_facts: &'static [&'static str],
}

/// Recorded facts that only fit Python's wording, with the Rust facts checked in their place.
/// Empty for TorchRL 0.14.1: every recorded fact is in the Rust message, once Python dtype
/// names are mapped to Rust's by [`rust_fact`] (`stack_error_dtypes_differ`: `float32` /
/// `float64` are looked for as `Float` / `Double`). The machinery stays so that a re-recording
/// with Python-only wording gets a reviewed note rather than a silently weakened check.
const FACT_NOTES: &[FactNote] = &[];

// ------------------------------------------------------------------ running one case

/// What an op returned.
enum Outcome {
    Spec(TensorSpec),
    Entry(Entry),
    Bool(bool),
    Keys(Vec<NestedKey>),
    RandIsIn { is_in: bool, sample: Entry },
}

/// A spec argument. Decoding it must succeed: only `construct` records constructor errors.
fn spec_arg(case: &Case, name: &str) -> Result<TensorSpec, String> {
    spec_from_json(case.arg(name)?).map_err(|e| format!("argument {name:?}: {e}"))
}

fn entry_arg(case: &Case, name: &str) -> Result<Entry, String> {
    entry_from_json(case.arg(name)?).map_err(|e| format!("argument {name:?}: {e}"))
}

fn tensor_arg(case: &Case, name: &str) -> Result<Tensor, String> {
    tensor_from_json(case.arg(name)?).map_err(|e| format!("argument {name:?}: {e}"))
}

fn int_arg(case: &Case, name: &str) -> Result<i64, String> {
    case.arg(name)?
        .as_i64()
        .ok_or_else(|| format!("argument {name:?} is not an integer"))
}

fn bool_arg(case: &Case, name: &str) -> Result<bool, String> {
    case.arg(name)?
        .as_bool()
        .ok_or_else(|| format!("argument {name:?} is not a bool"))
}

fn shape_arg(case: &Case, name: &str) -> Result<Vec<i64>, String> {
    shape_from_json(case.arg(name)?)
}

fn composite<'a>(spec: &'a TensorSpec, op: &str) -> Result<&'a torchrl::specs::Composite, String> {
    spec.as_composite()
        .ok_or_else(|| format!("{op} needs a Composite, got {}", spec.class_name()))
}

fn run(case: &Case) -> Result<Outcome, RunError> {
    let op = case.op.as_str();
    match op {
        "construct" => {
            return match spec_from_ctor(case.arg("ctor")?) {
                Ok(s) => Ok(Outcome::Spec(s)),
                Err(DecodeError::Lib(e)) => Err(RunError::Lib(e)),
                Err(DecodeError::Format(s)) => Err(RunError::Bad(s)),
            }
        }
        "stack" => {
            let specs = case
                .arg("specs")?
                .as_array()
                .ok_or("argument \"specs\" is not a list")?
                .iter()
                .map(|s| spec_from_json(s).map_err(text))
                .collect::<Result<Vec<_>, _>>()?;
            return Ok(Outcome::Spec(stack_specs(&specs, int_arg(case, "dim")?)?));
        }
        _ => {}
    }
    let spec = spec_arg(case, "spec")?;
    Ok(match op {
        "is_in" => Outcome::Bool(spec.is_in(&entry_arg(case, "value")?)?),
        "project" => Outcome::Entry(spec.project(&entry_arg(case, "value")?)?),
        "zero" => Outcome::Entry(spec.zero(&shape_arg(case, "shape")?)?),
        "one" => Outcome::Entry(spec.one(&shape_arg(case, "shape")?)?),
        "expand" => Outcome::Spec(spec.expand(&shape_arg(case, "shape")?)?),
        "index" => Outcome::Spec(spec.index(&index_from_json(case.arg("index")?)?)?),
        "squeeze" => {
            let dim = case.arg("dim")?;
            let dim = if dim.is_null() {
                None
            } else {
                Some(dim.as_i64().ok_or("dim is not an integer or null")?)
            };
            Outcome::Spec(spec.squeeze(dim)?)
        }
        "unsqueeze" => Outcome::Spec(spec.unsqueeze(int_arg(case, "dim")?)?),
        "encode" => {
            let values = numbers_from_json(case.arg("value")?)?;
            Outcome::Entry(Entry::Tensor(spec.encode(&values)?))
        }
        "to_one_hot" => {
            let value = tensor_arg(case, "value")?;
            Outcome::Entry(Entry::Tensor(match &spec {
                TensorSpec::Categorical(c) => c.to_one_hot(&value)?,
                TensorSpec::MultiCategorical(m) => m.to_one_hot(&value)?,
                other => return Err(format!("to_one_hot on {}", other.class_name()).into()),
            }))
        }
        "to_categorical" => {
            let value = tensor_arg(case, "value")?;
            Outcome::Entry(Entry::Tensor(match &spec {
                TensorSpec::OneHot(o) => o.to_categorical(&value)?,
                TensorSpec::MultiOneHot(m) => m.to_categorical(&value)?,
                other => return Err(format!("to_categorical on {}", other.class_name()).into()),
            }))
        }
        "eq" => Outcome::Bool(spec == spec_arg(case, "other")?),
        "keys" => Outcome::Keys(composite(&spec, op)?.keys(KeysOptions {
            nested: bool_arg(case, "include_nested")?,
            leaves_only: bool_arg(case, "leaves_only")?,
        })),
        "is_empty" => Outcome::Bool(composite(&spec, op)?.is_empty(
            if bool_arg(case, "recurse")? {
                Recurse::Yes
            } else {
                Recurse::No
            },
        )),
        "rand_is_in" => {
            let sample = spec.rand(&mut Generator::new(0), &shape_arg(case, "shape")?)?;
            let is_in = spec.is_in(&sample)?;
            Outcome::RandIsIn { is_in, sample }
        }
        other => return Err(RunError::Bad(format!("unknown op {other:?}"))),
    })
}

/// Checks the shape / dtype skeleton of a sample (`rand_is_in`'s record): tensors by shape and
/// dtype, tensordicts by batch size and keys in order, recursively.
fn check_skeleton(actual: &Entry, expected: &Value, path: &str) -> Result<(), String> {
    match actual {
        Entry::Tensor(t) => {
            let shape = shape_from_json(&expected["shape"]).map_err(|e| format!("{path}: {e}"))?;
            let dtype = kind_from_name(expected["dtype"].as_str().ok_or("dtype is not a string")?)?;
            if t.size() != shape || t.kind() != dtype {
                return Err(format!(
                    "{path}: sample {:?} {:?}, expected {shape:?} {dtype:?}",
                    t.size(),
                    t.kind()
                ));
            }
            Ok(())
        }
        Entry::Dict(td) => {
            let batch =
                shape_from_json(&expected["batch_size"]).map_err(|e| format!("{path}: {e}"))?;
            if td.batch_size() != batch.as_slice() {
                return Err(format!(
                    "{path}: batch size {:?}, expected {batch:?}",
                    td.batch_size()
                ));
            }
            let entries = expected["entries"]
                .as_object()
                .ok_or_else(|| format!("{path}: entries is not an object"))?;
            let got: Vec<String> = td
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
                let sub = format!("{path}.{name}");
                let e = td
                    .get_entry(name.as_str())
                    .ok_or_else(|| format!("{sub}: missing"))?;
                check_skeleton(e, ev, &sub)?;
            }
            Ok(())
        }
    }
}

fn check_outcome(out: &Outcome, expect: &Value) -> Result<(), String> {
    match out {
        Outcome::Spec(s) => check_spec(s, expect, "spec"),
        Outcome::Entry(e) => check_entry(e, expect, "value"),
        Outcome::Bool(b) if expect.as_bool() == Some(*b) => Ok(()),
        Outcome::Bool(b) => Err(format!("got {b}, expected {expect}")),
        Outcome::Keys(keys) => {
            let got: Vec<Vec<&str>> = keys.iter().map(|k| k.parts().collect()).collect();
            let want: Vec<Vec<&str>> = expect
                .as_array()
                .ok_or("expected value is not a list of keys")?
                .iter()
                .map(|k| {
                    k.as_array()
                        .map(|p| p.iter().filter_map(Value::as_str).collect())
                        .unwrap_or_default()
                })
                .collect();
            if got == want {
                Ok(())
            } else {
                Err(format!("keys {got:?}, expected {want:?} (in this order)"))
            }
        }
        Outcome::RandIsIn { is_in, sample } => {
            if expect["is_in"].as_bool() != Some(*is_in) {
                return Err(format!(
                    "is_in(rand) = {is_in}, expected {}",
                    expect["is_in"]
                ));
            }
            check_skeleton(sample, expect, "sample")
        }
    }
}

/// The facts to look for in the Rust message: the recorded ones after [`FACT_NOTES`], with
/// Python dtype names mapped to Rust's ([`rust_fact`]). Errs when a note is stale (its Python
/// fact is in fact present).
fn facts_for(case: &Case, recorded: &[String], msg: &str) -> Result<Vec<String>, String> {
    let names = spec_key_names(&case.args);
    let mut facts = recorded.to_vec();
    if let Some(note) = FACT_NOTES.iter().find(|n| n.case == case.name) {
        for f in note.python_facts {
            if !recorded.iter().any(|r| r == f) {
                return Err(format!(
                    "FACT_NOTES lists {f:?}, which is not a recorded fact"
                ));
            }
            if missing_facts(msg, &[rust_fact(f)], &names).is_empty() {
                return Err(format!(
                    "FACT_NOTES lists {f:?} as not applying, but the Rust message has it: \
                     remove it from the note ({msg})"
                ));
            }
        }
        facts.retain(|f| !note.python_facts.contains(&f.as_str()));
        facts.extend(note.rust_facts.iter().map(|f| f.to_string()));
    }
    Ok(facts.iter().map(|f| rust_fact(f)).collect())
}

/// Replays one case against its recorded outcome.
fn replay(case: &Case) -> Result<(), String> {
    match (case.expected_error(), run(case)) {
        (_, Err(RunError::Bad(s))) => Err(format!("malformed case: {s}")),
        (None, Ok(out)) => check_outcome(&out, &case.expect),
        (None, Err(RunError::Lib(e))) => Err(format!("expected success, got error: {e}")),
        (Some(exp), Ok(_)) => Err(format!(
            "expected an error ({}: {:?}, facts {:?}), got Ok",
            exp.class, exp.message, exp.facts
        )),
        (Some(exp), Err(RunError::Lib(e))) => {
            let msg = e.to_string();
            let facts = facts_for(case, &exp.facts, &msg)?;
            let missing = missing_facts(&msg, &facts, &spec_key_names(&case.args));
            if missing.is_empty() {
                Ok(())
            } else {
                Err(format!(
                    "error message lacks facts {missing:?}\n     rust:   {msg}\n     python: {} {:?}",
                    exp.class, exp.message
                ))
            }
        }
    }
}

// ------------------------------------------------------------------ deviation checks

fn ctor_arg(case: &Case) -> Result<&Value, String> {
    case.arg("ctor")
}

fn deviation_bounded_no_shape(case: &Case) -> Result<(), String> {
    let ctor = ctor_arg(case)?;
    if ctor.get("shape").is_some() {
        return Err("the ctor has a shape: this deviation is about a missing one".into());
    }
    let got = spec_from_ctor(ctor).map_err(|e| format!("expected Ok, got {e}"))?;
    let expected: TensorSpec = Bounded::new(-1.0, 1.0, []).map_err(text)?.into();
    if got != expected || got.shape() != [] as [i64; 0] || got.dtype() != Some(Kind::Float) {
        return Err(format!("expected {expected}, got {got}"));
    }
    Ok(())
}

fn deviation_bounded_maximum(case: &Case) -> Result<(), String> {
    let ctor = ctor_arg(case)?;
    match spec_from_ctor(ctor) {
        Err(DecodeError::Format(m)) if m.contains("\"maximum\"") => {}
        Err(e) => {
            return Err(format!(
                "expected the decoder to refuse `maximum`, got: {e}"
            ))
        }
        Ok(s) => return Err(format!("`maximum` was accepted: {s}")),
    }
    // The rest of the call builds.
    let rest = match ctor {
        Json::Object(o) => {
            Json::Object(o.iter().filter(|(k, _)| k != "maximum").cloned().collect())
        }
        other => return Err(format!("ctor is not an object: {other}")),
    };
    let got = spec_from_ctor(&rest).map_err(|e| format!("without `maximum`: {e}"))?;
    let expected: TensorSpec = Bounded::new(-1.0, 1.0, [1]).map_err(text)?.into();
    if got != expected {
        return Err(format!("without `maximum`: expected {expected}, got {got}"));
    }
    Ok(())
}

fn deviation_is_in_not_broadcastable(case: &Case) -> Result<(), String> {
    let spec = spec_arg(case, "spec")?;
    let value = entry_arg(case, "value")?;
    match spec.is_in(&value) {
        Ok(false) => {}
        other => return Err(format!("expected Ok(false), got {other:?}")),
    }
    match spec.check(&value, "x") {
        Err(e @ Error::NotInSpec { .. }) => {
            let msg = e.to_string();
            if !msg.contains("[3]") || !msg.contains("[2]") {
                return Err(format!("check should name [3] and [2]: {msg}"));
            }
            Ok(())
        }
        other => Err(format!(
            "expected check to fail with NotInSpec, got {other:?}"
        )),
    }
}

fn deviation_project_casts(case: &Case) -> Result<(), String> {
    let spec = spec_arg(case, "spec")?;
    let value = entry_arg(case, "value")?;
    let out = spec.project(&value).map_err(text)?;
    let t = out.as_tensor().ok_or("project returned a tensordict")?;
    tensors_close(t, &Tensor::from_slice(&[2i64, 2]), 0.0)?;
    if !spec.is_in(&out).map_err(text)? {
        return Err("is_in(project(x)) is false".into());
    }
    Ok(())
}

fn deviation_is_empty_recursive(case: &Case) -> Result<(), String> {
    let spec = spec_arg(case, "spec")?;
    let c = composite(&spec, "is_empty")?;
    if !bool_arg(case, "recurse")? {
        return Err("the case does not recurse".into());
    }
    match (c.is_empty(Recurse::Yes), c.is_empty(Recurse::No)) {
        (true, false) => Ok(()),
        (r, nr) => Err(format!(
            "expected is_empty(Recurse::Yes) = true and is_empty(Recurse::No) = false, got {r} and {nr}"
        )),
    }
}

// ------------------------------------------------------------------ the tests

fn family_ops(family: &str) -> &'static [&'static str] {
    FAMILIES
        .iter()
        .find(|(f, _)| *f == family)
        .map(|(_, ops)| *ops)
        .unwrap_or_else(|| panic!("unknown family {family}"))
}

/// The cases of the file whose op belongs to `family`.
fn family_cases<'a>(file: &'a CaseFile, family: &str) -> Vec<&'a Case> {
    let ops = family_ops(family);
    file.cases
        .iter()
        .filter(|c| ops.contains(&c.op.as_str()))
        .collect()
}

/// Replays one case, or its deviation check (after asserting the deviation is not stale).
fn replay_or_deviation(case: &Case) -> Result<(), String> {
    match DEVIATIONS.iter().find(|d| d.case == case.name) {
        Some(dev) => {
            if replay(case).is_ok() {
                return Err(format!(
                    "listed in DEVIATIONS but Rust now matches Python: remove the entry ({})",
                    dev.reason
                ));
            }
            (dev.check)(case).map_err(|e| format!("deviation check: {e}"))
        }
        None => replay(case),
    }
}

/// Replays every case of the family's ops; asserts that all were replayed and none failed.
fn replay_family(family: &str) {
    let file = load_cases(CASES_FILE);
    let mine = family_cases(&file, family);
    assert!(
        !mine.is_empty(),
        "family {family}: no cases in {CASES_FILE}"
    );
    let mut failures = Failures::default();
    let mut per_op: BTreeMap<&str, usize> = BTreeMap::new();
    let mut replayed = 0usize;
    for case in &mine {
        // tch panics are not expected; catch them anyway so one case cannot hide the others.
        let result =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| replay_or_deviation(case)));
        match result {
            Ok(r) => failures.check(&case.name, r),
            Err(_) => failures.push(&case.name, "panicked"),
        }
        replayed += 1;
        *per_op.entry(case.op.as_str()).or_default() += 1;
    }
    eprintln!("family {family}: replayed {replayed} case(s): {per_op:?}");
    failures.assert_none(&format!("family {family}"));
    assert_eq!(
        replayed,
        mine.len(),
        "family {family}: not every case replayed"
    );
}

#[test]
fn replay_construct() {
    replay_family("construct");
}

#[test]
fn replay_membership() {
    replay_family("membership");
}

#[test]
fn replay_fill() {
    replay_family("fill");
}

#[test]
fn replay_shape() {
    replay_family("shape");
}

#[test]
fn replay_encoding() {
    replay_family("encoding");
}

#[test]
fn replay_eq_stack() {
    replay_family("eq_stack");
}

#[test]
fn replay_composite_keys() {
    replay_family("composite_keys");
}

/// The families cover every case of the file exactly once, and the tables only name real cases.
#[test]
fn every_case_belongs_to_a_family() {
    let file = load_cases(CASES_FILE);
    assert!(!file.cases.is_empty(), "{CASES_FILE} has no cases");
    let mut names = std::collections::BTreeSet::new();
    for c in &file.cases {
        assert!(names.insert(c.name.as_str()), "duplicate case {}", c.name);
    }
    let mut per_op: BTreeMap<&str, usize> = BTreeMap::new();
    for c in &file.cases {
        let n = FAMILIES
            .iter()
            .filter(|(_, ops)| ops.contains(&c.op.as_str()))
            .count();
        assert_eq!(n, 1, "case {} (op {}) is in {n} families", c.name, c.op);
        *per_op.entry(c.op.as_str()).or_default() += 1;
    }
    // The family tests together replay exactly the cases of the file.
    let per_family: Vec<(&str, usize)> = FAMILIES
        .iter()
        .map(|(f, _)| (*f, family_cases(&file, f).len()))
        .collect();
    let replayed: usize = per_family.iter().map(|(_, n)| n).sum();
    assert_eq!(
        replayed,
        file.cases.len(),
        "the family tests replay {replayed} of the {} cases",
        file.cases.len()
    );
    let mut seen = std::collections::BTreeSet::new();
    for d in DEVIATIONS {
        assert!(
            names.contains(d.case),
            "DEVIATIONS names unknown case {}",
            d.case
        );
        assert!(seen.insert(d.case), "DEVIATIONS lists {} twice", d.case);
        assert!(!d.rust_does.is_empty() && !d.reason.is_empty());
    }
    for n in FACT_NOTES {
        assert!(
            names.contains(n.case),
            "FACT_NOTES names unknown case {}",
            n.case
        );
        assert!(
            !DEVIATIONS.iter().any(|d| d.case == n.case),
            "{} is both a deviation and a fact note",
            n.case
        );
        assert!(!n.reason.is_empty());
    }
    for (topic, cases, why) in NOT_DEVIATIONS {
        assert!(!why.is_empty(), "{topic}");
        for c in *cases {
            assert!(
                names.contains(c),
                "NOT_DEVIATIONS ({topic}) names unknown case {c}"
            );
            assert!(
                !DEVIATIONS.iter().any(|d| d.case == *c),
                "{c} is listed both as a deviation and as not one"
            );
        }
    }
    eprintln!(
        "{CASES_FILE}: {} cases (torchrl {}), per family: {per_family:?}, per op: {per_op:?}",
        file.cases.len(),
        file.versions
            .get("torchrl")
            .map(|v| v.to_string())
            .unwrap_or_default()
    );
}

/// The deviation and fact-note tables, printed for reviewers (`cargo test -- --nocapture`).
#[test]
fn deviations_are_documented() {
    for d in DEVIATIONS {
        eprintln!(
            "DEVIATION {}\n  why: {}\n  rust: {}",
            d.case, d.reason, d.rust_does
        );
    }
    for n in FACT_NOTES {
        eprintln!(
            "FACT NOTE {}: {:?} -> {:?}\n  why: {}",
            n.case, n.python_facts, n.rust_facts, n.reason
        );
    }
    for (topic, cases, why) in NOT_DEVIATIONS {
        eprintln!("NOT A DEVIATION: {topic} {cases:?}\n  why: {why}");
    }
    // Python dtype names in facts map to the names Rust prints.
    assert_eq!(rust_fact("float32"), "Float");
    assert_eq!(rust_fact("float64"), "Double");
    assert_eq!(rust_fact("int64"), "Int64");
    assert_eq!(rust_fact("[2]"), "[2]");
}

/// The spec comparison does catch differences (a replay that compares nothing would pass
/// vacuously), and the decoders round-trip.
#[test]
fn spec_comparisons_detect_differences() {
    let enc = r#"{"class":"Composite","shape":[3],"dtype":null,"entries":{
        "b":{"class":"Bounded","shape":[3,2],"dtype":"float32",
             "low":{"shape":[3,2],"dtype":"float32","data":[-1.0,-1.0,-1.0,-1.0,-1.0,-1.0]},
             "high":{"shape":[3,2],"dtype":"float32","data":[1.0,1.0,1.0,1.0,1.0,1.0]}},
        "none":null,
        "c":{"class":"Categorical","shape":[3],"dtype":"int64","n":3,
             "mask":{"shape":[3],"dtype":"bool","data":[true,false,true]}},
        "m":{"class":"MultiCategorical","shape":[3,2],"dtype":"int64",
             "nvec":[[3,4],[3,4],[3,4]],"mask":null},
        "bin":{"class":"Binary","shape":[3,4],"dtype":"int8","n":4,"mask":null},
        "sub":{"class":"Composite","shape":[3],"dtype":null,"entries":{"o":
            {"class":"OneHot","shape":[3,4],"dtype":"bool","n":4,"mask":null}}}}}"#;
    let expect = Json::parse(enc).expect("literal");
    let spec = spec_from_json(&expect).expect("decodes");
    assert_eq!(check_spec(&spec, &expect, "spec"), Ok(()));
    // Key order follows the file.
    let keys: Vec<String> = spec
        .as_composite()
        .expect("composite")
        .keys(KeysOptions::top_level())
        .iter()
        .map(|k| k.to_string())
        .collect();
    assert_eq!(
        keys,
        [
            r#""b""#,
            r#""none""#,
            r#""c""#,
            r#""m""#,
            r#""bin""#,
            r#""sub""#
        ]
    );

    let variant = |from: &str, to: &str| -> Json {
        assert!(enc.contains(from), "{from}");
        Json::parse(&enc.replacen(from, to, 1)).expect("literal")
    };
    for (what, bad) in [
        (
            "class",
            variant(r#""class":"Bounded""#, r#""class":"Unbounded""#),
        ),
        (
            "bound value",
            variant("[1.0,1.0,1.0,1.0,1.0,1.0]", "[1.0,1.0,1.0,1.0,1.0,2.0]"),
        ),
        (
            "leaf shape",
            variant(
                r#""shape":[3],"dtype":"int64""#,
                r#""shape":[3,1],"dtype":"int64""#,
            ),
        ),
        (
            "composite shape",
            variant(
                r#""shape":[3],"dtype":null,"entries":{"o""#,
                r#""shape":[],"dtype":null,"entries":{"o""#,
            ),
        ),
        ("dtype", variant(r#""dtype":"int8""#, r#""dtype":"uint8""#)),
        ("n", variant(r#""n":3"#, r#""n":4"#)),
        ("mask", variant("[true,false,true]", "[true,true,true]")),
        (
            "mask vs none",
            variant(
                r#""mask":{"shape":[3],"dtype":"bool","data":[true,false,true]}"#,
                r#""mask":null"#,
            ),
        ),
        (
            "nvec",
            variant("[[3,4],[3,4],[3,4]]", "[[3,4],[3,5],[3,4]]"),
        ),
        (
            "binary n",
            variant(r#""n":4,"mask":null}"#, r#""n":3,"mask":null}"#),
        ),
        ("None entry", variant(r#""none":null,"#, "")),
        (
            "None vs spec",
            variant(
                r#""none":null"#,
                r#""none":{"class":"Unbounded","shape":[3],"dtype":"float32"}"#,
            ),
        ),
        (
            "nested leaf",
            variant(r#""dtype":"bool","n":4"#, r#""dtype":"uint8","n":4"#),
        ),
    ] {
        assert!(
            check_spec(&spec, &bad, "spec").is_err(),
            "{what} difference not detected"
        );
    }
    // Order matters.
    let swapped = variant(r#""none":null,"#, "").to_string().replacen(
        r#""entries":{"#,
        r#""entries":{"none":null,"#,
        1,
    );
    let swapped = Json::parse(&swapped).expect("literal");
    assert!(
        check_spec(&spec, &swapped, "spec").is_err(),
        "key order not checked"
    );
    // A nested nvec with different rows cannot be decoded (Rust shares one row).
    assert!(spec_from_json(&variant("[[3,4],[3,4],[3,4]]", "[[3,4],[3,5],[3,4]]")).is_err());
    // The ctor decoder refuses arguments Rust does not have.
    let ctor = Json::parse(r#"{"class":"OneHot","n":3,"bogus":1}"#).expect("literal");
    assert!(matches!(spec_from_ctor(&ctor), Err(DecodeError::Format(_))));
    // Key names of encoded composites count as keys for facts.
    let names = spec_key_names(&expect);
    assert!(names.contains("sub") && names.contains("o") && !names.contains("class"));
    assert_eq!(
        numbers_from_json(&Json::parse("[[1,2],[3.5,4]]").expect("literal")),
        Ok(vec![1.0, 2.0, 3.5, 4.0])
    );
}

/// The Composite `Display` is a tree: one line per entry, nested levels indented by 4 spaces,
/// leaves on one line, `None` entries as `key: None`.
#[test]
fn composite_display_is_a_tree() {
    let expect = Json::parse(
        r#"{"class":"Composite","shape":[3],"dtype":null,"entries":{
            "obs":{"class":"Unbounded","shape":[3,2],"dtype":"float32"},
            "none":null,
            "sub":{"class":"Composite","shape":[3],"dtype":null,"entries":{
                "act":{"class":"Categorical","shape":[3],"dtype":"int64","n":4,"mask":null},
                "deep":{"class":"Composite","shape":[3],"dtype":null,"entries":{}}}}}}"#,
    )
    .expect("literal");
    let spec = spec_from_json(&expect).expect("decodes");
    let shown = spec.to_string();
    let want = [
        "Composite(shape=[3])",
        "    obs: Unbounded(shape=[3, 2], dtype=Float)",
        "    none: None",
        "    sub: Composite(shape=[3])",
        "        act: Categorical(shape=[3], dtype=Int64, n=4)",
        "        deep: Composite(shape=[3])",
    ]
    .join("\n");
    assert_eq!(shown, want);
    // Leaves stay on one line.
    let leaf = spec
        .as_composite()
        .and_then(|c| c.get("obs"))
        .expect("leaf");
    assert!(!leaf.to_string().contains('\n'));
}
