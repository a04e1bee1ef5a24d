//! Replays every case of `specs/tensordict_cases.json` (recorded from Python tensordict 0.14.3,
//! see `specs/README.md`) through the public Rust API and checks the recorded outcome: values
//! (exact for integers and bools, within 1e-6 for floats), dtypes, shapes, batch sizes and key
//! order; for error cases, that Rust returns an `Err` whose message holds every recorded fact.
//!
//! Python is never run. Each op family has its own `#[test]`; each collects every failure and
//! asserts once, with the list. No case is skipped: `every_case_belongs_to_a_family` checks that
//! the families cover the file, and each family checks that it replayed all of its cases.
//!
//! # How each op maps onto the Rust API
//!
//! | op | Rust |
//! |---|---|
//! | `construct` | `TensorDict::new(batch_size)` then `set` of each entry in order (nested first) |
//! | `get` | [`py_get`]: `get_entry`; when absent, `get_or_err`'s error tells "missing" (`None`, like Python) from "walks through a leaf" (an error, like Python) |
//! | `set` / `set_` / `pop` / `update` | `set` / `set_` / `pop` / `update` |
//! | `del` | `pop` (the `Result` form; `remove` is the `Option` form) |
//! | `select` / `exclude` / `rename_key` / `keys` / `is_empty` / `flatten_keys` | same names (`rename_key` is Python's `rename_key_`) |
//! | `index` | `index(&[BatchIndex])` |
//! | `setitem_index` | `set_at(&[BatchIndex], &value)` (Python's `td[idx] = value`) |
//! | `expand` / `reshape` / `view` / `unsqueeze` / `squeeze` / `permute` / `unbind` | same names |
//! | `split` | a list of sizes: `split(&sizes, dim)`; one int: `chunk_by(size, dim)` |
//! | `stack` / `cat` | `torchrl::stack` / `torchrl::cat` |
//! | `eq` | `eq` |
//! | `apply_add` | `td.apply(\|t\| Ok(Some(t + scalar)))` (libtorch's promotion, as Python's `td + scalar`) |
//! | `zero_` | `zero_` |
//!
//! Deliberate differences from Python are listed in [`DEVIATIONS`] (the case is still run, and
//! Rust's documented behaviour is asserted instead); error facts that only make sense for
//! Python's wording or checking order are listed in [`FACT_NOTES`] with the Rust facts checked
//! in their place.

mod common;

use std::collections::BTreeMap;

use common::*;
use tch::{Kind, Tensor};
use torchrl::tensordict::{IfExists, KeysOptions, Strict};
use torchrl::{cat, stack, BatchIndex, Entry, Error, NestedKey, TensorDict};

const CASES_FILE: &str = "tensordict_cases.json";

/// The op families, one `#[test]` each. Together they must cover every op in the file.
const FAMILIES: &[(&str, &[&str])] = &[
    (
        "construct_get_set",
        &["construct", "get", "set", "set_", "pop", "del", "update"],
    ),
    (
        "keys",
        &[
            "select",
            "exclude",
            "rename_key",
            "keys",
            "is_empty",
            "flatten_keys",
        ],
    ),
    ("index", &["index", "setitem_index"]),
    (
        "shape",
        &[
            "expand",
            "reshape",
            "view",
            "unsqueeze",
            "squeeze",
            "permute",
            "unbind",
            "split",
        ],
    ),
    ("stack_cat", &["stack", "cat"]),
    ("leafwise", &["eq", "apply_add", "zero_"]),
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
        case: "index_past_batch_dims_into_features",
        reason: "TensorDict indexing is over the batch dims only; Python lets the extra items \
                 fall through into every leaf's feature dims, which silently means different \
                 things for leaves of different ranks",
        rust_does:
            "`index` returns Error::IndexOutOfRange (\"too many indices\", naming the batch \
                    size); indexing the batch dims and then each leaf's feature dims gives the \
                    Python result",
        check: deviation_index_past_batch_dims,
    },
    Deviation {
        case: "setitem_index_new_key_added",
        reason: "`set_at` (td[idx] = other) writes into existing leaves only; Python adds the \
                 missing key, zero-filled outside the index, which hides typos in keys",
        rust_does: "`set_at` returns Error::KeySetMismatch naming the new key and leaves the \
                    tensordict unchanged; creating the key first (zeros of the destination's \
                    batch size) and then calling `set_at` gives the Python result",
        check: deviation_setitem_new_key,
    },
];

/// An error fact that does not apply to Rust, and what is checked instead.
struct FactNote {
    case: &'static str,
    /// The recorded facts not checked.
    python_facts: &'static [&'static str],
    /// Why they do not apply.
    reason: &'static str,
    /// Checked in their place (same rules as recorded facts: key names must appear quoted).
    rust_facts: &'static [&'static str],
}

const FACT_NOTES: &[FactNote] = &[
    FactNote {
        case: "construct_error_child_incompatible",
        python_facts: &["x"],
        reason: "Python checks each leaf of the nested tensordict and names the leaf `x`; Rust \
                 checks the nested level's batch size when the level is inserted and names the \
                 level `n` (with its batch size [3, 2] and the parent's [3, 4])",
        rust_facts: &["n"],
    },
    FactNote {
        case: "construct_error_child_batch_shorter",
        python_facts: &["x"],
        reason: "as construct_error_child_incompatible: the error names the level `n` (batch \
                 size [3]) rather than its leaf `x`",
        rust_facts: &["n"],
    },
    FactNote {
        case: "index_error_mask_shape",
        python_facts: &["[3, 4, 5]"],
        reason: "Python checks the mask against the first leaf's full shape; Rust checks it \
                 against the batch dims it covers, before touching any leaf",
        rust_facts: &["[3]"],
    },
    FactNote {
        case: "expand_error_too_few_dims",
        python_facts: &["(1)", "(2)"],
        reason: "Python wording (\"the number of sizes provided (1) ... dimensions in the \
                 TensorDict (2)\"); Rust names the shapes instead",
        rust_facts: &["[3]", "[3, 4]"],
    },
    FactNote {
        case: "view_error_numel",
        python_facts: &["60"],
        reason: "60 is leaf `a`'s element count in Python's per-leaf view error; Rust checks the \
                 new batch shape against the batch size first",
        rust_facts: &["[5, 3]", "[3, 4]"],
    },
    FactNote {
        case: "stack_error_exclusive_keys",
        python_facts: &["keys"],
        reason: "Python wording (\"The sets of keys ... are exclusive\"); Rust lists the keys \
                 found in only one of the tensordicts",
        rust_facts: &["a", "b"],
    },
];

// ------------------------------------------------------------------ running one case

/// What an op returned.
enum Outcome {
    Td(TensorDict),
    Entry(Entry),
    Null,
    Bool(bool),
    Keys(Vec<NestedKey>),
    Tds(Vec<TensorDict>),
    Pop { value: Entry, td: TensorDict },
}

/// A tensordict argument. Decoding it must succeed: only `construct` records decoding errors.
fn td_arg(case: &Case, name: &str) -> Result<TensorDict, String> {
    td_from_json(case.arg(name)?).map_err(|e| format!("argument {name:?}: {e}"))
}

fn key_arg(case: &Case, name: &str) -> Result<NestedKey, String> {
    key_from_json(case.arg(name)?)
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

fn tds_arg(case: &Case) -> Result<Vec<TensorDict>, String> {
    case.arg("tds")?
        .as_array()
        .ok_or("argument \"tds\" is not a list")?
        .iter()
        .map(|t| td_from_json(t).map_err(text))
        .collect()
}

/// Python's `td.get(key)`: the entry, `None` when the key is missing, an error when the key
/// walks through a leaf. Built from `get_entry` and, when that finds nothing, the error of
/// `get_or_err`, which tells a missing key (`KeyNotFound`) from a bad path.
fn py_get(td: &TensorDict, key: &NestedKey) -> Result<Option<Entry>, Error> {
    if let Some(e) = td.get_entry(key) {
        return Ok(Some(e.clone()));
    }
    match td.get_or_err(key) {
        Ok(t) => Ok(Some(Entry::Tensor(t.shallow_clone()))),
        Err(Error::KeyNotFound { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

fn run(case: &Case) -> Result<Outcome, RunError> {
    let op = case.op.as_str();
    match op {
        "construct" => {
            return match td_from_json(case.arg("td")?) {
                Ok(td) => Ok(Outcome::Td(td)),
                Err(DecodeError::Lib(e)) => Err(RunError::Lib(e)),
                Err(DecodeError::Format(s)) => Err(RunError::Bad(s)),
            }
        }
        "stack" => return Ok(Outcome::Td(stack(&tds_arg(case)?, int_arg(case, "dim")?)?)),
        "cat" => return Ok(Outcome::Td(cat(&tds_arg(case)?, int_arg(case, "dim")?)?)),
        _ => {}
    }
    let mut td = td_arg(case, "td")?;
    Ok(match op {
        "get" => match py_get(&td, &key_arg(case, "key")?)? {
            Some(e) => Outcome::Entry(e),
            None => Outcome::Null,
        },
        "set" => {
            let value = entry_from_json(case.arg("value")?).map_err(text)?;
            td.set(key_arg(case, "key")?, value)?;
            Outcome::Td(td)
        }
        "set_" => {
            let value = tensor_from_json(case.arg("value")?)?;
            td.set_(key_arg(case, "key")?, &value)?;
            Outcome::Td(td)
        }
        "pop" => {
            let value = td.pop(key_arg(case, "key")?)?;
            Outcome::Pop { value, td }
        }
        "del" => {
            td.pop(key_arg(case, "key")?)?;
            Outcome::Td(td)
        }
        "update" => {
            td.update(&td_arg(case, "other")?)?;
            Outcome::Td(td)
        }
        "select" => {
            let keys = keys_from_json(case.arg("keys")?)?;
            Outcome::Td(td.select(
                &keys,
                if bool_arg(case, "strict")? {
                    Strict::Yes
                } else {
                    Strict::No
                },
            )?)
        }
        "exclude" => Outcome::Td(td.exclude(&keys_from_json(case.arg("keys")?)?)),
        "rename_key" => {
            td.rename_key(
                key_arg(case, "old")?,
                key_arg(case, "new")?,
                if bool_arg(case, "safe")? {
                    IfExists::Error
                } else {
                    IfExists::Overwrite
                },
            )?;
            Outcome::Td(td)
        }
        "keys" => Outcome::Keys(td.keys(KeysOptions {
            nested: bool_arg(case, "include_nested")?,
            leaves_only: bool_arg(case, "leaves_only")?,
        })),
        "is_empty" => Outcome::Bool(td.is_empty()),
        "flatten_keys" => {
            let sep = case.arg("sep")?.as_str().ok_or("sep is not a string")?;
            Outcome::Td(td.flatten_keys(sep)?)
        }
        "index" => Outcome::Td(td.index(&index_from_json(case.arg("index")?)?)?),
        "setitem_index" => {
            let idx = index_from_json(case.arg("index")?)?;
            td.set_at(&idx, &td_arg(case, "value")?)?;
            Outcome::Td(td)
        }
        "expand" => Outcome::Td(td.expand(shape_from_json(case.arg("shape")?)?)?),
        "reshape" => Outcome::Td(td.reshape(shape_from_json(case.arg("shape")?)?)?),
        "view" => Outcome::Td(td.view(shape_from_json(case.arg("shape")?)?)?),
        "unsqueeze" => Outcome::Td(td.unsqueeze(int_arg(case, "dim")?)?),
        "squeeze" => {
            let dim = case.arg("dim")?;
            let dim = if dim.is_null() {
                None
            } else {
                Some(dim.as_i64().ok_or("dim is not an integer or null")?)
            };
            Outcome::Td(td.squeeze(dim)?)
        }
        "permute" => Outcome::Td(td.permute(shape_from_json(case.arg("dims")?)?)?),
        "unbind" => Outcome::Tds(td.unbind(int_arg(case, "dim")?)?),
        "split" => {
            let sizes = case.arg("sizes")?;
            let dim = int_arg(case, "dim")?;
            match sizes.as_i64() {
                Some(size) => Outcome::Tds(td.chunk_by(size, dim)?),
                None => Outcome::Tds(td.split(&shape_from_json(sizes)?, dim)?),
            }
        }
        "eq" => Outcome::Td(td.eq(&td_arg(case, "other")?)?),
        "apply_add" => {
            let scalar = case.arg("scalar")?;
            let out = if scalar.is_i64() {
                let s = scalar.as_i64().ok_or("scalar out of range")?;
                td.apply(|t| Ok(Some(t + s)))?
            } else {
                let s = scalar.as_f64().ok_or("scalar is not a number")?;
                td.apply(|t| Ok(Some(t + s)))?
            };
            Outcome::Td(out)
        }
        "zero_" => {
            td.zero_()?;
            Outcome::Td(td)
        }
        other => return Err(RunError::Bad(format!("unknown op {other:?}"))),
    })
}

fn check_outcome(out: &Outcome, expect: &Value) -> Result<(), String> {
    match out {
        Outcome::Td(td) => check_td(td, expect, "td"),
        Outcome::Entry(e) => check_entry(e, expect, "value"),
        Outcome::Null if expect.is_null() => Ok(()),
        Outcome::Null => Err(format!("got None, expected {expect}")),
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
        Outcome::Tds(tds) => {
            let want = expect.as_array().ok_or("expected value is not a list")?;
            if tds.len() != want.len() {
                return Err(format!(
                    "{} tensordicts, expected {}",
                    tds.len(),
                    want.len()
                ));
            }
            tds.iter()
                .zip(want)
                .enumerate()
                .try_for_each(|(i, (td, w))| check_td(td, w, &format!("[{i}]")))
        }
        Outcome::Pop { value, td } => {
            check_entry(value, &expect["value"], "popped")?;
            check_td(td, &expect["td"], "td")
        }
    }
}

/// The facts to look for in the Rust message, after [`FACT_NOTES`]. Errs when a note is stale
/// (its Python fact is in fact present).
fn facts_for(case: &Case, recorded: &[String], msg: &str) -> Result<Vec<String>, String> {
    let Some(note) = FACT_NOTES.iter().find(|n| n.case == case.name) else {
        return Ok(recorded.to_vec());
    };
    let names = key_names(&case.args);
    for f in note.python_facts {
        if !recorded.iter().any(|r| r == f) {
            return Err(format!(
                "FACT_NOTES lists {f:?}, which is not a recorded fact"
            ));
        }
        if missing_facts(msg, &[f.to_string()], &names).is_empty() {
            return Err(format!(
                "FACT_NOTES lists {f:?} as not applying, but the Rust message has it: \
                 remove it from the note ({msg})"
            ));
        }
    }
    let mut facts: Vec<String> = recorded
        .iter()
        .filter(|f| !note.python_facts.contains(&f.as_str()))
        .cloned()
        .collect();
    facts.extend(note.rust_facts.iter().map(|f| f.to_string()));
    Ok(facts)
}

/// Replays one case against its recorded outcome.
fn replay(case: &Case) -> Result<(), String> {
    let expected_err = case.expected_error();
    match (expected_err, run(case)) {
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
            let missing = missing_facts(&msg, &facts, &key_names(&case.args));
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

fn deviation_index_past_batch_dims(case: &Case) -> Result<(), String> {
    let td = td_arg(case, "td")?;
    let idx = index_from_json(case.arg("index")?)?;
    match td.index(&idx) {
        Ok(got) => {
            return Err(format!(
                "Rust indexed past the batch dims (batch size {:?})",
                got.batch_size()
            ))
        }
        Err(e) => {
            let msg = e.to_string();
            let batch = format!("{:?}", td.batch_size());
            if !matches!(e, Error::IndexOutOfRange { .. })
                || !msg.contains("too many indices")
                || !msg.contains(&batch)
            {
                return Err(format!(
                    "expected IndexOutOfRange naming \"too many indices\" and {batch}, got: {msg}"
                ));
            }
        }
    }
    // What Rust does instead: index the batch dims, then each leaf's feature dims.
    let nb = td.batch_dims();
    let sub = td.index(&idx[..nb]).map_err(text)?;
    let feature: Vec<i64> = idx[nb..]
        .iter()
        .map(|i| match i {
            BatchIndex::Int(i) => Ok(*i),
            other => Err(format!("this check handles int items only, got {other:?}")),
        })
        .collect::<Result<_, _>>()?;
    let at = sub.batch_dims() as i64;
    let out = sub
        .apply(|t| {
            let mut r = t.shallow_clone();
            for i in &feature {
                r = r.f_select(at, *i)?;
            }
            Ok(Some(r))
        })
        .map_err(text)?;
    check_td(&out, &case.expect, "td")
}

fn deviation_setitem_new_key(case: &Case) -> Result<(), String> {
    let mut td = td_arg(case, "td")?;
    let idx = index_from_json(case.arg("index")?)?;
    let value = td_arg(case, "value")?;
    let before = td.deep_clone().map_err(text)?;
    let new_keys: Vec<NestedKey> = value
        .keys(KeysOptions::nested_leaves())
        .into_iter()
        .filter(|k| !td.contains(k))
        .collect();
    if new_keys.is_empty() {
        return Err("the value has no key the destination lacks".into());
    }
    match td.set_at(&idx, &value) {
        Ok(()) => return Err("set_at accepted a key the destination lacks".into()),
        Err(e) => {
            let msg = e.to_string();
            let unnamed: Vec<String> = new_keys
                .iter()
                .map(|k| k.to_string())
                .filter(|k| !msg.contains(k.as_str()))
                .collect();
            if !matches!(e, Error::KeySetMismatch { .. }) || !unnamed.is_empty() {
                return Err(format!(
                    "expected KeySetMismatch naming {new_keys:?}, got: {msg}"
                ));
            }
        }
    }
    // Nothing changed.
    if td.keys(KeysOptions::nested()) != before.keys(KeysOptions::nested())
        || !td.eq(&before).map_err(text)?.all().map_err(text)?
    {
        return Err("a failed set_at changed the tensordict".into());
    }
    // What Rust does instead: create the key first, then write through the index.
    for k in &new_keys {
        let src = value.get(k).ok_or("new key is not a leaf")?;
        let mut shape = td.batch_size().to_vec();
        shape.extend_from_slice(&src.size()[value.batch_dims()..]);
        td.set(k, Tensor::zeros(&shape, (src.kind(), src.device())))
            .map_err(text)?;
    }
    td.set_at(&idx, &value).map_err(text)?;
    check_td(&td, &case.expect, "td")
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
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            match DEVIATIONS.iter().find(|d| d.case == case.name) {
                Some(dev) => {
                    if replay(case).is_ok() {
                        return Err(format!(
                            "listed in DEVIATIONS but Rust now matches Python: remove the entry \
                             ({})",
                            dev.reason
                        ));
                    }
                    (dev.check)(case).map_err(|e| format!("deviation check: {e}"))
                }
                None => replay(case),
            }
        }));
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
fn replay_construct_get_set() {
    replay_family("construct_get_set");
}

#[test]
fn replay_keys() {
    replay_family("keys");
}

#[test]
fn replay_index() {
    replay_family("index");
}

#[test]
fn replay_shape() {
    replay_family("shape");
}

#[test]
fn replay_stack_cat() {
    replay_family("stack_cat");
}

#[test]
fn replay_leafwise() {
    replay_family("leafwise");
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
    let replayed: usize = FAMILIES
        .iter()
        .map(|(f, _)| family_cases(&file, f).len())
        .sum();
    assert_eq!(
        replayed,
        file.cases.len(),
        "the family tests replay {replayed} of the {} cases",
        file.cases.len()
    );
    for d in DEVIATIONS {
        assert!(
            names.contains(d.case),
            "DEVIATIONS names unknown case {}",
            d.case
        );
        assert!(!d.rust_does.is_empty() && !d.reason.is_empty());
    }
    for n in FACT_NOTES {
        assert!(
            names.contains(n.case),
            "FACT_NOTES names unknown case {}",
            n.case
        );
        assert!(!n.reason.is_empty());
    }
    eprintln!(
        "{CASES_FILE}: {} cases ({:?}), per op: {per_op:?}",
        file.cases.len(),
        file.versions.get("tensordict").map(|v| v.to_string())
    );
}

/// The deviation table, printed for reviewers (`cargo test -- --nocapture`).
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
    // The dtype decoding used by every case round-trips.
    for name in [
        "float32", "float64", "int64", "int32", "bool", "uint8", "int8",
    ] {
        let kind = kind_from_name(name).unwrap_or(Kind::ComplexFloat);
        assert_eq!(kind_name(kind), Some(name));
    }
}

/// The comparisons used above do catch differences (a replay that compares nothing would pass
/// vacuously).
#[test]
fn comparisons_detect_differences() {
    let enc = r#"{"batch_size":[2],"entries":{"b":{"shape":[2],"dtype":"int64","data":[1,2]},
                  "a":{"shape":[2,1],"dtype":"float32","data":[0.5,-1.0]}}}"#;
    let expect = Json::parse(enc).expect("literal");
    let td = td_from_json(&expect).expect("decodes");
    // Key order follows the file, not the alphabet.
    let keys: Vec<String> = td
        .keys(KeysOptions::top_level())
        .iter()
        .map(|k| k.to_string())
        .collect();
    assert_eq!(keys, [r#""b""#, r#""a""#]);
    assert_eq!(check_td(&td, &expect, "td"), Ok(()));

    let variant = |from: &str, to: &str| -> Json {
        assert!(enc.contains(from), "{from}");
        Json::parse(&enc.replacen(from, to, 1)).expect("literal")
    };
    for (what, bad) in [
        ("int value", variant("[1,2]", "[1,3]")),
        ("float value", variant("-1.0", "-1.00001")),
        ("dtype", variant("\"int64\"", "\"int32\"")),
        ("shape", variant("[2,1]", "[1,2]")),
        (
            "batch size",
            variant("\"batch_size\":[2]", "\"batch_size\":[]"),
        ),
        (
            "missing key",
            variant(r#""b":{"shape":[2],"dtype":"int64","data":[1,2]},"#, ""),
        ),
    ] {
        assert!(
            check_td(&td, &bad, "td").is_err(),
            "{what} difference not detected"
        );
    }
    // Order matters.
    let swapped = Json::parse(
        r#"{"batch_size":[2],"entries":{"a":{"shape":[2,1],"dtype":"float32","data":[0.5,-1.0]},
            "b":{"shape":[2],"dtype":"int64","data":[1,2]}}}"#,
    )
    .expect("literal");
    assert!(
        check_td(&td, &swapped, "td").is_err(),
        "key order not checked"
    );
    // Within tolerance is equal.
    assert_eq!(
        check_td(&td, &variant("-1.0", "-1.0000000001"), "td"),
        Ok(())
    );
    // Tensor-to-tensor comparison.
    let a = Tensor::from_slice(&[1.0f64, 2.0]);
    assert!(tensors_close(&a, &(&a + 1e-9), FLOAT_TOL).is_ok());
    assert!(tensors_close(&a, &(&a + 1e-3), FLOAT_TOL).is_err());
    assert!(tensors_close(&a, &a.to_kind(Kind::Float), FLOAT_TOL).is_err());
    // Key facts need the quoted key; other facts are verbatim.
    let names = key_names(&expect);
    assert!(names.contains("a") && names.contains("b"));
    let facts = vec!["a".to_string(), "'b'".to_string(), "[2, 1]".to_string()];
    assert!(missing_facts(r#"key "a" and "b": [2, 1]"#, &facts, &names).is_empty());
    assert_eq!(
        missing_facts("prefix a b [2, 1]", &facts, &names),
        vec!["a".to_string(), "'b'".to_string()]
    );
}
