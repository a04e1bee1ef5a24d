//! [`ValueOperator`]: TorchRL's `ValueOperator`, a tensor model (by default an
//! [`MLP`]) from observation(s) to a value, as a [`TensorDictModule`].
//!
//! Default keys are TorchRL's: it reads `"observation"` and writes `"state_value"`, or
//! `"state_action_value"` when `"action"` is one of the in keys (a Q-function). Several in keys
//! are concatenated along the last dim, in order.
//!
//! ```
//! use tch::{nn, Device, Kind, Tensor};
//! use torchrl::modules::models::{MlpConfig, ValueOperator, MLP};
//! use torchrl::modules::module::TensorDictModule;
//! use torchrl::TensorDict;
//! # fn main() -> torchrl::Result<()> {
//! let vs = nn::VarStore::new(Device::Cpu);
//! let critic = ValueOperator::new(MLP::new(&vs.root(), &MlpConfig::new(3, 1).with_depth(2))?);
//! assert_eq!(critic.out_keys(), ["state_value"]);
//! let td = TensorDict::new([4])?.with("observation", Tensor::zeros([4, 3], (Kind::Float, Device::Cpu)))?;
//! let td = critic.forward(td)?;
//! assert_eq!(td.get_or_err("state_value")?.size(), vec![4, 1]);
//!
//! // a Q-function: observation and action in, "state_action_value" out
//! let q = ValueOperator::new(MLP::new(&vs.root().sub("q"), &MlpConfig::new(4, 1))?)
//!     .with_in_keys(["observation", "action"])?;
//! assert_eq!(q.out_keys(), ["state_action_value"]);
//! # Ok(()) }
//! ```

use std::fmt;

use super::mlp::MLP;
use crate::error::{Error, Result};
use crate::modules::module::{to_keys, TdModule, TensorDictModule, TensorModule};
use crate::tensordict::{fmt_key_list, AsKey, NestedKey, TensorDict};

/// TorchRL's `ValueOperator` (see the [module docs](self)).
pub struct ValueOperator<M = MLP> {
    inner: TdModule<M>,
    /// Whether the out key was set explicitly (otherwise it follows the in keys).
    explicit_out: bool,
}

impl<M> fmt::Debug for ValueOperator<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ValueOperator({:?})", self.inner)
    }
}

/// TorchRL's default out key for these in keys.
fn default_out_key(in_keys: &[NestedKey]) -> NestedKey {
    if in_keys.iter().any(|k| *k == "action") {
        NestedKey::from("state_action_value")
    } else {
        NestedKey::from("state_value")
    }
}

impl<M: TensorModule> ValueOperator<M> {
    /// Wraps `model` with the default keys: `"observation"` → `"state_value"`.
    pub fn new(model: M) -> Self {
        // Infallible: both keys are literals with one segment each.
        let inner = TdModule {
            module: model,
            in_keys: vec![NestedKey::from("observation")],
            out_keys: vec![NestedKey::from("state_value")],
            split_sizes: None,
            train: true,
        };
        ValueOperator {
            inner,
            explicit_out: false,
        }
    }

    /// Sets the in keys (at least one, concatenated in order). Unless an out key was set, the
    /// out key becomes TorchRL's default for them.
    pub fn with_in_keys<K: AsKey>(self, keys: impl IntoIterator<Item = K>) -> Result<Self> {
        let op = "ValueOperator::with_in_keys";
        let in_keys = to_keys(op, keys)?;
        if in_keys.is_empty() {
            return Err(Error::config(
                op,
                "in_keys",
                "at least one in key (a ValueOperator reads something)",
                "[]",
            ));
        }
        let out = if self.explicit_out {
            self.inner.out_keys.clone()
        } else {
            vec![default_out_key(&in_keys)]
        };
        let explicit = self.explicit_out;
        self.rebuilt(in_keys, out, explicit)
    }

    /// Sets the out key.
    pub fn with_out_key(self, key: impl AsKey) -> Result<Self> {
        let out = to_keys("ValueOperator::with_out_key", [key])?;
        let in_keys = self.inner.in_keys.clone();
        self.rebuilt(in_keys, out, true)
    }

    fn rebuilt(
        self,
        in_keys: Vec<NestedKey>,
        out_keys: Vec<NestedKey>,
        explicit_out: bool,
    ) -> Result<Self> {
        let train = self.inner.train;
        let inner = TdModule::new(self.inner.into_module(), in_keys, out_keys)?.with_train(train);
        Ok(ValueOperator {
            inner,
            explicit_out,
        })
    }

    /// The wrapped model.
    pub fn module(&self) -> &M {
        self.inner.module()
    }

    /// The out key.
    pub fn out_key(&self) -> Result<&NestedKey> {
        self.inner.out_keys.first().ok_or_else(|| {
            Error::invalid(
                "ValueOperator::out_key",
                format!(
                    "no out key (out_keys = {})",
                    fmt_key_list(&self.inner.out_keys)
                ),
            )
        })
    }
}

impl<M: TensorModule> TensorDictModule for ValueOperator<M> {
    fn in_keys(&self) -> Vec<NestedKey> {
        self.inner.in_keys()
    }

    fn out_keys(&self) -> Vec<NestedKey> {
        self.inner.out_keys()
    }

    fn forward(&self, td: TensorDict) -> Result<TensorDict> {
        self.inner.forward(td)
    }

    fn set_train(&mut self, train: bool) {
        self.inner.set_train(train)
    }
}
