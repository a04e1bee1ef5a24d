//! `ActionClamp`: clamps actions into the bounds of the action spec before they reach the env.
//!
//! The transform works in the inverse hook: on their way into the parent env, the actions at its
//! keys (by default every `Bounded` leaf of the parent's action spec) are clamped elementwise into
//! `[low, high]` of their spec, so the parent always receives in-bounds actions whatever the
//! policy produced. The specs are unchanged, and so is the caller's tensordict (the inverse hook
//! works on a copy): the rollout records the policy's raw action. An action key missing from the
//! input is skipped (the parent decides whether it needs it).
//!
//! **NaN.** A NaN action has no meaningful clamp (`clamp` keeps NaN). By default
//! ([`NanPolicy::Error`]) a NaN action is an error naming the key and the number of NaN values:
//! a NaN almost always means a broken policy, and replacing it silently would hide that. With
//! [`NanPolicy::Low`] NaNs are replaced by the lower bound instead (what
//! [`Bounded::project`](crate::data::specs::Bounded::project) does); this needs no device sync, so it
//! is also the fast choice. The error check reads one bool back from the device per step.
//!
//! ```
//! use tch::Tensor;
//! use torchrl::envs::builtin::CountingEnv;
//! use torchrl::envs::transforms::{ActionClamp, Transform, TransformedEnv};
//! use torchrl::envs::EnvBase;
//! # fn main() -> torchrl::Result<()> {
//! let mut env = TransformedEnv::new(CountingEnv::new(10, &[])?)?.with(ActionClamp::new())?;
//! let td = env.reset(None)?.with("action", Tensor::from_slice(&[3.0f32]))?;
//! // what the base env receives:
//! let inner = env.transform_mut().inv(td.clone())?;
//! assert_eq!(inner.get_or_err("action")?.double_value(&[0]), 1.0);
//! let out = env.step(td)?;
//! assert_eq!(out.get_or_err("action")?.double_value(&[0]), 3.0); // caller's data untouched
//! # Ok(()) }
//! ```

use crate::kind::is_float;
use tch::{Kind, Tensor};

use super::{attached, Transform};
use crate::data::specs::TensorSpec;
use crate::envs::EnvSpecs;
use crate::error::{Error, Result};
use crate::macros::setters;
use crate::tensordict::{fmt_key_list, Elements, NestedKey, TensorDict};

/// What [`ActionClamp`] does with NaN actions.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum NanPolicy {
    /// Error, naming the key and the number of NaN values (default).
    #[default]
    Error,
    /// Replace NaN by the lower bound of the spec.
    Low,
}

/// Clamps actions into their spec's bounds on their way into the env. See the module docs.
#[derive(Debug, Default)]
pub struct ActionClamp {
    keys: Option<Vec<NestedKey>>,
    nan: NanPolicy,
    /// (key, low, high), bounds of the spec's full shape, resolved when joining an env.
    bounds: Vec<(NestedKey, Tensor, Tensor)>,
}

impl ActionClamp {
    /// Clamps every `Bounded` action leaf of the parent env.
    pub fn new() -> Self {
        ActionClamp::default()
    }

    /// Clamps only these action keys (each must be a `Bounded` leaf of the action spec).
    pub fn with_keys<K: Into<NestedKey>>(mut self, keys: impl IntoIterator<Item = K>) -> Self {
        self.keys = Some(keys.into_iter().map(Into::into).collect());
        self
    }

    /// The clamped keys (empty until the transform joins an env with default keys).
    pub fn keys(&self) -> Vec<NestedKey> {
        match &self.keys {
            Some(k) => k.clone(),
            None => self.bounds.iter().map(|(k, _, _)| k.clone()).collect(),
        }
    }
}

setters!(ActionClamp {
    /// What to do with NaN actions (default [`NanPolicy::Error`]).
    with_nan_policy(nan: NanPolicy);
});

impl Transform for ActionClamp {
    fn name(&self) -> String {
        format!(
            "ActionClamp(keys={}, nan={:?})",
            fmt_key_list(&self.keys()),
            self.nan
        )
    }

    fn attach(&mut self, parent: &EnvSpecs) -> Result<()> {
        let op = "ActionClamp::attach";
        let keys = match &self.keys {
            Some(k) => k.clone(),
            None => {
                let found: Vec<NestedKey> = parent
                    .action
                    .leaves()
                    .into_iter()
                    .filter(|(_, s)| matches!(s, TensorSpec::Bounded(_)))
                    .map(|(k, _)| k)
                    .collect();
                if found.is_empty() {
                    return Err(Error::InvalidValue {
                        op,
                        what: "spec",
                        key: "action".to_string(),
                        expected: "a Bounded leaf to clamp".to_string(),
                        got: format!(
                            "the parent's action spec has no Bounded leaf to clamp (action keys: {})",
                            fmt_key_list(&parent.action_keys())
                        ),
                    });
                }
                found
            }
        };
        let mut bounds = Vec::with_capacity(keys.len());
        for key in keys {
            match parent.action.get(&key) {
                Some(TensorSpec::Bounded(b)) => {
                    bounds.push((key, b.low().shallow_clone(), b.high().shallow_clone()))
                }
                Some(other) => {
                    return Err(Error::value(
                        op,
                        key,
                        "a Bounded action spec (ActionClamp clamps to its bounds)",
                        format!("a {} spec ({other})", other.class_name()),
                    ))
                }
                None => {
                    return Err(Error::value(
                        op,
                        key,
                        "a key of the action spec",
                        format!(
                            "a key that is not in it (action keys: {})",
                            fmt_key_list(&parent.action_keys())
                        ),
                    ))
                }
            }
        }
        self.bounds = bounds;
        Ok(())
    }

    fn inv(&mut self, mut td: TensorDict) -> Result<TensorDict> {
        let op = "ActionClamp::inv";
        for (key, low, high) in attached(op, self, &self.bounds)? {
            let Some(a) = td.get(key) else { continue };
            let (kind, device) = (a.kind(), a.device());
            // Bounds cast to another float dtype stay ordered; to or from an integer dtype
            // they could wrap (-2 as uint8 is 254): such an action is refused, naming the key.
            if kind != low.kind() && !(is_float(kind) && is_float(low.kind())) {
                return Err(Error::DtypeMismatch {
                    op,
                    key: key.to_string(),
                    expected: low.kind(),
                    actual: kind,
                });
            }
            // The bounds broadcast to the action's shape, never the reverse (clamping would
            // otherwise silently grow the action).
            let shape = a.size();
            let fit = |t: &Tensor| -> Result<Tensor> {
                t.f_to_device(device)?
                    .f_to_kind(kind)?
                    .f_broadcast_to(shape.as_slice())
                    .map_err(|_| Error::ShapeMismatch {
                        op,
                        key: key.to_string(),
                        expected: low.size(),
                        actual: shape.clone(),
                    })
            };
            let (low, high) = (fit(low)?, fit(high)?);
            let mut a = a.shallow_clone();
            if is_float(kind) {
                let nan = a.f_isnan()?;
                match self.nan {
                    NanPolicy::Error => {
                        let n = nan.f_sum(Kind::Int64)?.int64_value(&[]);
                        if n > 0 {
                            return Err(Error::value(
                                op,
                                key,
                                "an action without NaN: a NaN action cannot be clamped into its \
                                 bounds (fix the policy, or use NanPolicy::Low to replace NaN by \
                                 the lower bound)",
                                format!("{n} NaN value(s) (of {})", a.elements()),
                            ));
                        }
                    }
                    NanPolicy::Low => {
                        a = low.f_where_self(&nan, &a)?;
                    }
                }
            }
            let clamped = a.f_clamp_tensor(Some(&low), Some(&high))?;
            td.set(key, clamped)?;
        }
        Ok(td)
    }
}
