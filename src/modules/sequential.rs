//! [`TensorDictSequential`]: tensordict.nn's `TensorDictSequential`, modules run in order on
//! one tensordict.
//!
//! Key bookkeeping is TorchRL's:
//! - `in_keys`: every key a module reads that no earlier module produces (and that is not
//!   listed already), in order;
//! - `out_keys`: every key a module writes, in order, a key written several times listed once,
//!   at its **last** write;
//! - [`TensorDictSequential::select_out_keys`] keeps only some out keys in the result: the
//!   modules still write their intermediate keys while running, but the result holds the
//!   input's keys (with the values of any that a module overwrote) and the selected keys only.
//!
//! ```
//! use tch::Tensor;
//! use torchrl::modules::module::{from_fn, TensorDictModule};
//! use torchrl::modules::sequential::TensorDictSequential;
//! use torchrl::TensorDict;
//! # fn main() -> torchrl::Result<()> {
//! let seq = TensorDictSequential::new()
//!     .with(from_fn(["obs"], ["hidden"], |x: &[&Tensor]| Ok(vec![x[0].f_mul_scalar(2.0)?]))?)
//!     .with(from_fn(["hidden", "bias"], ["out"], |x: &[&Tensor]| Ok(vec![x[0].f_add(x[1])?]))?);
//! assert_eq!(seq.in_keys(), ["obs", "bias"]); // "hidden" is produced inside
//! assert_eq!(seq.out_keys(), ["hidden", "out"]);
//!
//! let td = TensorDict::new([2])?
//!     .with("obs", Tensor::from_slice(&[1.0f32, 2.0]))?
//!     .with("bias", Tensor::from_slice(&[0.5f32, 0.5]))?;
//! let seq = seq.select_out_keys(["out"])?; // drop the intermediate "hidden"
//! let out = seq.forward(td)?;
//! assert!(!out.contains("hidden"));
//! assert_eq!(Vec::<f32>::try_from(out.get_or_err("out")?)?, vec![2.5, 4.5]);
//! # Ok(()) }
//! ```

use std::collections::HashSet;
use std::fmt;

use super::module::{to_keys, TensorDictModule};
use crate::error::{Error, Result};
use crate::tensordict::{fmt_key_list, AsKey, NestedKey, TensorDict};

/// Modules run in order on one tensordict (see the [module docs](self)).
#[derive(Default)]
pub struct TensorDictSequential {
    modules: Vec<Box<dyn TensorDictModule>>,
    selected: Option<Vec<NestedKey>>,
}

impl fmt::Debug for TensorDictSequential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "TensorDictSequential({} modules, in_keys={}, out_keys={})",
            self.modules.len(),
            fmt_key_list(&self.in_keys()),
            fmt_key_list(&self.out_keys())
        )
    }
}

impl TensorDictSequential {
    /// An empty sequence (its `forward` returns the tensordict unchanged).
    pub fn new() -> Self {
        TensorDictSequential::default()
    }

    /// A sequence of already boxed modules.
    pub fn from_modules(modules: Vec<Box<dyn TensorDictModule>>) -> Self {
        TensorDictSequential {
            modules,
            selected: None,
        }
    }

    /// Appends a module (builder form of [`TensorDictSequential::push`]).
    pub fn with(mut self, module: impl TensorDictModule + 'static) -> Self {
        self.push(module);
        self
    }

    /// Appends a module. A selection made with [`TensorDictSequential::select_out_keys`] is
    /// kept.
    pub fn push(&mut self, module: impl TensorDictModule + 'static) {
        self.modules.push(Box::new(module));
    }

    /// The modules, in order.
    pub fn modules(&self) -> &[Box<dyn TensorDictModule>] {
        &self.modules
    }

    /// The modules, mutably.
    pub fn modules_mut(&mut self) -> &mut [Box<dyn TensorDictModule>] {
        &mut self.modules
    }

    /// The number of modules.
    pub fn len(&self) -> usize {
        self.modules.len()
    }

    /// True when there is no module.
    pub fn is_empty(&self) -> bool {
        self.modules.is_empty()
    }

    /// Every key written, in order, each listed once at its last write (TorchRL's
    /// `out_keys_source`), whatever the selection.
    pub fn all_out_keys(&self) -> Vec<NestedKey> {
        let written: Vec<NestedKey> = self.modules.iter().flat_map(|m| m.out_keys()).collect();
        written
            .iter()
            .enumerate()
            .filter(|(i, k)| !written.iter().skip(i + 1).any(|later| later == *k))
            .map(|(_, k)| k.clone())
            .collect()
    }

    /// Keeps only `keys` among the out keys in the result (TorchRL's `select_out_keys`).
    /// Errors, naming the key and the out keys, when a key is not an out key.
    pub fn select_out_keys<K: AsKey>(mut self, keys: impl IntoIterator<Item = K>) -> Result<Self> {
        let op = "TensorDictSequential::select_out_keys";
        let keys = to_keys(op, keys)?;
        let all = self.all_out_keys();
        if let Some(k) = keys.iter().find(|k| !all.contains(k)) {
            return Err(Error::KeyNotFound {
                op,
                key: k.to_string(),
                available: all.iter().map(ToString::to_string).collect(),
            });
        }
        self.selected = Some(keys);
        Ok(self)
    }

    /// Undoes [`TensorDictSequential::select_out_keys`]: every out key is returned again.
    pub fn reset_out_keys(&mut self) {
        self.selected = None;
    }
}

impl TensorDictModule for TensorDictSequential {
    fn in_keys(&self) -> Vec<NestedKey> {
        chain_in_keys(self.modules.iter().map(|m| m.as_ref()))
    }

    fn out_keys(&self) -> Vec<NestedKey> {
        match &self.selected {
            Some(s) => s.clone(),
            None => self.all_out_keys(),
        }
    }

    fn forward(&self, td: TensorDict) -> Result<TensorDict> {
        let Some(selected) = &self.selected else {
            return self.modules.iter().try_fold(td, |td, m| m.forward(td));
        };
        // Run on a shallow copy, then bring back the selected keys and the input's keys.
        let mut out = td.clone();
        let input_keys: HashSet<NestedKey> = td
            .keys(crate::tensordict::KeysOptions::nested_leaves())
            .into_iter()
            .collect();
        let result = self.modules.iter().try_fold(td, |td, m| m.forward(td))?;
        for (k, entry) in result.items(crate::tensordict::KeysOptions::nested_leaves()) {
            if input_keys.contains(&k) || selected.contains(&k) {
                out.set(&k, entry.clone())?;
            }
        }
        Ok(out)
    }

    fn set_train(&mut self, train: bool) {
        for m in &mut self.modules {
            m.set_train(train);
        }
    }
}

/// The in keys of modules run in order: each module's in keys that no earlier module writes,
/// once each, in first-read order.
pub(crate) fn chain_in_keys<'a>(
    modules: impl IntoIterator<Item = &'a dyn TensorDictModule>,
) -> Vec<NestedKey> {
    let mut in_keys: Vec<NestedKey> = Vec::new();
    let mut produced: Vec<NestedKey> = Vec::new();
    for m in modules {
        for k in m.in_keys() {
            if !produced.contains(&k) && !in_keys.contains(&k) {
                in_keys.push(k);
            }
        }
        produced.extend(m.out_keys());
    }
    in_keys
}
