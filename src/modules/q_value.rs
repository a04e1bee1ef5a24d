//! Actions from Q-values: [`QValueModule`] (TorchRL's `QValueModule`) and [`QValueActor`] (a
//! network that writes `"action_value"` followed by a `QValueModule`).
//!
//! The action is the argmax of the Q-values over the last dim, written one-hot (`Int64`
//! zeros and ones: every maximal entry is 1, as TorchRL's `value == max`) or as a categorical
//! index (`Int64`), per the [`ActionSpace`]. The module also writes the Q-values under
//! `"action_value"` and the value of the chosen action under `"chosen_action_value"`
//! (`[*B, 1]`).
//!
//! ```
//! use tch::Tensor;
//! use torchrl::modules::{ActionSpace, QValueModule, TensorDictModule};
//! use torchrl::TensorDict;
//! # fn main() -> torchrl::Result<()> {
//! let td = TensorDict::new([2])?
//!     .with("action_value", Tensor::from_slice(&[1.0f32, 3.0, 2.0, 0.0, -1.0, 5.0]).view([2, 3]))?;
//! let td = QValueModule::new(ActionSpace::Categorical).forward(td)?;
//! assert_eq!(Vec::<i64>::try_from(td.get_or_err("action")?)?, vec![1, 2]);
//! assert_eq!(Vec::<f32>::try_from(td.get_or_err("chosen_action_value")?.view([-1]))?, vec![3.0, 5.0]);
//! let td = QValueModule::new(ActionSpace::OneHot).forward(td)?;
//! assert_eq!(Vec::<i64>::try_from(td.get_or_err("action")?.view([-1]))?, vec![0, 1, 0, 0, 0, 1]);
//! # Ok(()) }
//! ```

use std::fmt;
use std::str::FromStr;

use tch::{Kind, Tensor};

use super::module::{read_input, TensorDictModule};
use crate::data::specs::TensorSpec;
use crate::error::{Error, Result};
use crate::tensordict::{NestedKey, TensorDict};

/// How a discrete action is written (TorchRL's `action_space` strings).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ActionSpace {
    /// A one-hot vector over the last dim (`"one_hot"` / `"one-hot"`; TorchRL's default).
    #[default]
    OneHot,
    /// An index (`"categorical"`).
    Categorical,
}

impl ActionSpace {
    /// The action space of an action spec: `OneHot` for a [`OneHot`](TensorSpec::OneHot)
    /// spec, `Categorical` for a [`Categorical`](TensorSpec::Categorical) one; an error for
    /// any other spec.
    pub fn from_spec(spec: &TensorSpec) -> Result<Self> {
        match spec {
            TensorSpec::OneHot(_) => Ok(ActionSpace::OneHot),
            TensorSpec::Categorical(_) => Ok(ActionSpace::Categorical),
            other => Err(Error::argument(
                "ActionSpace::from_spec",
                "spec",
                "a OneHot or Categorical action spec",
                format!("a {} spec", other.class_name()),
            )),
        }
    }

    /// The argmax of `values` over the last dim, written in this space.
    pub fn argmax(self, values: &Tensor) -> Result<Tensor> {
        Ok(match self {
            ActionSpace::OneHot => {
                let (max, _) = values.f_max_dim(-1, true)?;
                values.f_eq_tensor(&max)?.f_to_kind(Kind::Int64)?
            }
            ActionSpace::Categorical => values.f_argmax(-1, false)?,
        })
    }

    /// The value of `action` in `values` (`[*B, n]`), keeping a trailing dim of 1: a gather
    /// for a categorical action (`[*B]` or `[*B, 1]`), `Σ action·values` for a one-hot one.
    pub fn chosen_value(self, values: &Tensor, action: &Tensor) -> Result<Tensor> {
        match self {
            ActionSpace::Categorical => {
                let idx = if action.dim() == values.dim() {
                    action.shallow_clone()
                } else {
                    action.f_unsqueeze(-1)?
                };
                Ok(values.f_gather(-1, &idx.f_to_kind(Kind::Int64)?, false)?)
            }
            ActionSpace::OneHot => Ok(values
                .f_mul(&action.f_to_kind(values.kind())?)?
                .f_sum_dim_intlist(-1, true, None::<Kind>)?),
        }
    }
}

impl FromStr for ActionSpace {
    type Err = Error;

    /// `"one_hot"`, `"one-hot"` or `"categorical"`.
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "one_hot" | "one-hot" => Ok(ActionSpace::OneHot),
            "categorical" => Ok(ActionSpace::Categorical),
            other => Err(Error::argument(
                "ActionSpace",
                "action_space",
                "one of \"one_hot\", \"one-hot\", \"categorical\"",
                other,
            )),
        }
    }
}

/// Writes the greedy action of the Q-values it reads (TorchRL's `QValueModule`); see the
/// [module docs](self).
///
/// # Shapes
/// - `action_value`: `[*B, n]`;
/// - `action`: `[*B, n]` (one-hot) or `[*B]` (categorical), `Int64`;
/// - `chosen_action_value`: `[*B, 1]`.
#[derive(Clone, Debug)]
pub struct QValueModule {
    action_space: ActionSpace,
    action_value_key: NestedKey,
    action_key: NestedKey,
    chosen_action_value_key: NestedKey,
    action_mask_key: Option<NestedKey>,
}

impl QValueModule {
    /// Reads `"action_value"`, writes `"action"`, `"action_value"` and
    /// `"chosen_action_value"`.
    pub fn new(action_space: ActionSpace) -> Self {
        QValueModule {
            action_space,
            action_value_key: "action_value".into(),
            action_key: "action".into(),
            chosen_action_value_key: "chosen_action_value".into(),
            action_mask_key: None,
        }
    }

    crate::macros::setters! {
        /// Where the Q-values are read (default `"action_value"`).
        with_action_value_key(key: impl Into<NestedKey>) => action_value_key = key.into();
        /// Where the action is written (default `"action"`).
        with_action_key(key: impl Into<NestedKey>) => action_key = key.into();
        /// Where the chosen action's value is written (default `"chosen_action_value"`).
        with_chosen_action_value_key(key: impl Into<NestedKey>) => chosen_action_value_key = key.into();
        /// A boolean mask of allowed actions (`[*B, n]`): masked-out actions get the dtype's
        /// lowest value before the argmax (TorchRL's `action_mask_key`).
        with_action_mask_key(key: impl Into<NestedKey>) => action_mask_key = Some(key.into());
    }

    /// The action space.
    pub fn action_space(&self) -> ActionSpace {
        self.action_space
    }

    /// The key the action is written to.
    pub fn action_key(&self) -> &NestedKey {
        &self.action_key
    }

    /// The key the Q-values are read from.
    pub fn action_value_key(&self) -> &NestedKey {
        &self.action_value_key
    }

    /// The key the chosen action's value is written to.
    pub fn chosen_action_value_key(&self) -> &NestedKey {
        &self.chosen_action_value_key
    }
}

impl TensorDictModule for QValueModule {
    fn in_keys(&self) -> Vec<NestedKey> {
        let mut k = vec![self.action_value_key.clone()];
        k.extend(self.action_mask_key.iter().cloned());
        k
    }

    fn out_keys(&self) -> Vec<NestedKey> {
        vec![
            self.action_key.clone(),
            self.action_value_key.clone(),
            self.chosen_action_value_key.clone(),
        ]
    }

    fn forward(&self, mut td: TensorDict) -> Result<TensorDict> {
        let values = read_input("QValueModule", &td, &self.action_value_key)?.shallow_clone();
        if values.dim() == 0 {
            return Err(Error::value(
                "QValueModule",
                &self.action_value_key,
                "Q-values of shape [*B, n]",
                "a 0-dim tensor",
            ));
        }
        let masked = match &self.action_mask_key {
            Some(k) => {
                let mask = read_input("QValueModule", &td, k)?;
                let low = crate::modules::distributions::finfo_min(values.kind());
                values.f_where_scalarother(&mask.f_to_kind(Kind::Bool)?, low)?
            }
            None => values.shallow_clone(),
        };
        let action = self.action_space.argmax(&masked)?;
        let chosen = self.action_space.chosen_value(&masked, &action)?;
        let mut staged = td.clone();
        staged.set(&self.action_key, action)?;
        staged.set(&self.action_value_key, masked)?;
        staged.set(&self.chosen_action_value_key, chosen)?;
        td = staged;
        Ok(td)
    }
}

/// A Q-network followed by a [`QValueModule`] (TorchRL's `QValueActor`): the network writes
/// the Q-values (`"action_value"` unless set otherwise), the module the greedy action and
/// the chosen value.
pub struct QValueActor {
    network: Box<dyn TensorDictModule>,
    qvalue: QValueModule,
}

impl fmt::Debug for QValueActor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QValueActor")
            .field("network_in_keys", &self.network.in_keys())
            .field("qvalue", &self.qvalue)
            .finish()
    }
}

impl QValueActor {
    /// `network` must declare the Q-value key (`"action_value"`) among its out keys.
    pub fn new(
        network: impl TensorDictModule + 'static,
        action_space: ActionSpace,
    ) -> Result<Self> {
        Self::with_module(network, QValueModule::new(action_space))
    }

    /// A network and a configured [`QValueModule`] (custom keys, mask); the network must
    /// write the module's Q-value key.
    pub fn with_module(
        network: impl TensorDictModule + 'static,
        qvalue: QValueModule,
    ) -> Result<Self> {
        if !network.out_keys().contains(qvalue.action_value_key()) {
            return Err(Error::argument(
                "QValueActor",
                "network",
                format!(
                    "a network that writes {} (the Q-values)",
                    qvalue.action_value_key()
                ),
                format!(
                    "out keys {:?}",
                    network
                        .out_keys()
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                ),
            ));
        }
        Ok(QValueActor {
            network: Box::new(network),
            qvalue,
        })
    }

    /// The Q-value head.
    pub fn qvalue_module(&self) -> &QValueModule {
        &self.qvalue
    }

    /// The Q-network.
    pub fn network(&self) -> &dyn TensorDictModule {
        self.network.as_ref()
    }
}

impl TensorDictModule for QValueActor {
    fn in_keys(&self) -> Vec<NestedKey> {
        let mut k = self.network.in_keys();
        for extra in self.qvalue.in_keys().into_iter().skip(1) {
            if !k.contains(&extra) {
                k.push(extra);
            }
        }
        k
    }

    fn out_keys(&self) -> Vec<NestedKey> {
        self.qvalue.out_keys()
    }

    fn forward(&self, td: TensorDict) -> Result<TensorDict> {
        self.qvalue.forward(self.network.forward(td)?)
    }

    fn set_train(&mut self, train: bool) {
        self.network.set_train(train);
    }
}
