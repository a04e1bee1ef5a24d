//! All-or-nothing builds under a caller's [`Path`]: [`build_staged`] runs a build (a model's
//! constructor, then its weight load) against a private store, and hands the variables it
//! made to the caller's store only when the whole build succeeded. A build that fails at any
//! point, after some modules were made (an I/O error half-way through the weights, a file
//! changed between the header check and the read, an allocation that fails), leaves the
//! caller's [`VarStore`] exactly as it was: tch has no way to remove a variable once added.
//!
//! ```
//! use tch::nn::VarStore;
//! use tch::{Device, Kind};
//! use torchrl::modules::llm::nn::build_staged;
//! # fn main() -> torchrl::Result<()> {
//! let vs = VarStore::new(Device::Cpu);
//! // a build that makes two variables, then fails: the store is unchanged
//! let failed = build_staged(&vs.root().sub("model"), |p| {
//!     let _w = p.f_zeros("w", &[2, 3])?;
//!     let _b = p.f_zeros("b", &[3])?;
//!     Err::<(), _>(torchrl::Error::InvalidArgument { op: "load", message: "a late failure".into() })
//! });
//! assert!(failed.is_err());
//! assert!(vs.variables().is_empty());
//! // a build that succeeds: its variables land under the caller's path, trainable as made
//! let w = build_staged(&vs.root().sub("model"), |p| {
//!     let w = p.sub("layer").f_ones("weight", &[2, 3])?;
//!     let _buffer = p.f_zeros_no_train("buffer", &[4])?;
//!     Ok(w)
//! })?;
//! let names: std::collections::BTreeSet<String> = vs.variables().into_keys().collect();
//! assert_eq!(names, ["model.buffer", "model.layer.weight"].map(String::from).into());
//! assert_eq!(vs.trainable_variables().len(), 1);
//! assert_eq!(w.kind(), Kind::Float);
//! // the returned handle is the stored variable itself, not a copy
//! let _ = tch::no_grad(|| vs.variables()["model.layer.weight"].shallow_clone().fill_(5.0));
//! assert_eq!(w.sum(Kind::Float).double_value(&[]), 30.0);
//! # Ok(()) }
//! ```

use std::collections::{HashMap, HashSet};

use tch::nn::{Path, VarStore};
use tch::Tensor;

use crate::error::Result;

/// Runs `build` against a private [`VarStore`] on `path`'s device and with its default kind,
/// then, only if it returned `Ok`, adds every variable it made to `path` under the same
/// relative name (trainable ones as trainable, in the order they were made, then the others by
/// name). The tensors are not copied: what `build` returned holds the very variables the
/// caller's store now lists. On `Err` nothing is added, and the private store is dropped with
/// everything `build` made.
///
/// A name already taken in the caller's store gets tch's usual `__N` suffix, as building
/// straight into it would. Parameter groups are `path`'s.
///
/// # Errors
/// Whatever `build` returns.
pub fn build_staged<T>(path: &Path<'_>, build: impl FnOnce(&Path<'_>) -> Result<T>) -> Result<T> {
    let mut stage = VarStore::new(path.device());
    // no variable yet: this only sets the kind later variables get by default
    stage.set_kind(path.kind());
    let value = build(&stage.root())?;
    // the build returned: nothing else holds the lock, and a poisoned one holds whole data
    let variables = stage
        .variables_
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut names: Vec<(&String, &Tensor)> = variables.named_variables.iter().collect();
    names.sort_by(|a, b| a.0.cmp(b.0));
    // every non-empty variable is its own allocation: its data pointer names it
    let mut by_pointer: HashMap<usize, Vec<&String>> = HashMap::new();
    for (name, t) in &names {
        if t.numel() > 0 {
            by_pointer
                .entry(t.data_ptr() as usize)
                .or_default()
                .push(name);
        }
    }
    let mut placed: HashSet<&String> = HashSet::new();
    let mut order: Vec<(String, Tensor, bool)> = Vec::with_capacity(names.len());
    // the trainable ones in the order they were made
    for var in &variables.trainable_variables {
        let t = &var.tensor;
        let found = if t.numel() > 0 {
            by_pointer
                .get(&(t.data_ptr() as usize))
                .and_then(|c| {
                    c.iter().find(|n| {
                        !placed.contains(*n)
                            && variables
                                .named_variables
                                .get(n.as_str())
                                .is_some_and(|v| same_variable(v, t))
                    })
                })
                .copied()
        } else {
            names
                .iter()
                .find(|(n, v)| !placed.contains(*n) && same_variable(v, t))
                .map(|(n, _)| *n)
        };
        if let Some(name) = found {
            placed.insert(name);
            order.push((name.clone(), t.shallow_clone(), true));
        }
    }
    for (name, t) in &names {
        if !placed.contains(*name) {
            order.push(((*name).clone(), t.shallow_clone(), false));
        }
    }
    drop(variables);
    for (name, tensor, trainable) in order {
        let mut parts: Vec<&str> = name.split('.').collect();
        let leaf = parts.pop().unwrap_or_default();
        let mut sub = path.clone();
        for part in parts {
            sub = sub.sub(part);
        }
        let _ = sub.add(leaf, tensor, trainable);
    }
    Ok(value)
}

/// Whether two handles are the same variable: the same storage, offset, shape and strides
/// (a zero-element variable has no storage to tell it by: one of the same shape and dtype
/// stands for it, which no computation can tell apart).
fn same_variable(a: &Tensor, b: &Tensor) -> bool {
    a.size() == b.size()
        && a.stride() == b.stride()
        && a.kind() == b.kind()
        && (a.numel() == 0 || a.data_ptr() == b.data_ptr())
}
