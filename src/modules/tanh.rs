//! [`TanhModule`]: squashes a network's output into a bounded action space (TorchRL's
//! `TanhModule`), for deterministic policies (DDPG, TD3).
//!
//! ```
//! use tch::Tensor;
//! use torchrl::modules::{TanhModule, TensorDictModule};
//! use torchrl::TensorDict;
//! # fn main() -> torchrl::Result<()> {
//! // low = -2, high = 2: out = low + (high - low)·(tanh(x) + 1)/2 = 2·tanh(x)
//! let m = TanhModule::new(["param"], ["action"])?.with_bounds(-2.0, 2.0)?;
//! let td = TensorDict::new([2])?.with("param", Tensor::from_slice(&[0.0f64, 1.0]).view([2, 1]))?;
//! let a = m.forward(td)?.get_or_err("action")?.view([-1]);
//! assert!((a.double_value(&[1]) - 2.0 * 1f64.tanh()).abs() < 1e-12);
//! assert_eq!(a.double_value(&[0]), 0.0);
//! # Ok(()) }
//! ```

use tch::Tensor;

use super::module::{read_input, TensorDictModule};
use crate::data::specs::TensorSpec;
use crate::error::{Error, Result};
use crate::tensordict::{collect_keys, NestedKey, TensorDict};

/// `out = low + (high - low)·(tanh(x) + 1) / 2` for each in key → out key (TorchRL's
/// `TanhModule`); with the default bounds `[-1, 1]`, `out = tanh(x)`. With `clamp`, `tanh(x)`
/// is first clamped to `[-1 + ε, 1 - ε]` (ε = the dtype's resolution).
#[derive(Debug)]
pub struct TanhModule {
    in_keys: Vec<NestedKey>,
    out_keys: Vec<NestedKey>,
    low: Tensor,
    high: Tensor,
    clamp: bool,
}

impl TanhModule {
    /// Errors when the key lists differ in length or are empty.
    pub fn new<I, O>(
        in_keys: impl IntoIterator<Item = I>,
        out_keys: impl IntoIterator<Item = O>,
    ) -> Result<Self>
    where
        I: Into<NestedKey>,
        O: Into<NestedKey>,
    {
        let in_keys = collect_keys(in_keys);
        let out_keys = collect_keys(out_keys);
        if in_keys.len() != out_keys.len() || in_keys.is_empty() {
            return Err(Error::argument(
                "TanhModule",
                "out_keys",
                format!(
                    "as many out keys as in keys ({}), at least one",
                    in_keys.len()
                ),
                format!("{} out keys", out_keys.len()),
            ));
        }
        Ok(TanhModule {
            in_keys,
            out_keys,
            low: Tensor::from(-1.0f64),
            high: Tensor::from(1.0f64),
            clamp: false,
        })
    }

    /// Scalar bounds; errors when `high < low`.
    pub fn with_bounds(self, low: f64, high: f64) -> Result<Self> {
        self.with_bound_tensors(Tensor::from(low), Tensor::from(high))
    }

    /// The bounds of a [`Bounded`](TensorSpec::Bounded) action spec (TorchRL's `spec=`).
    pub fn with_spec(self, spec: &TensorSpec) -> Result<Self> {
        match spec {
            TensorSpec::Bounded(b) => self.with_bound_tensors(b.low().copy(), b.high().copy()),
            other => Err(Error::argument(
                "TanhModule",
                "spec",
                "a Bounded spec",
                format!("a {} spec", other.class_name()),
            )),
        }
    }

    fn with_bound_tensors(mut self, low: Tensor, high: Tensor) -> Result<Self> {
        let bad = high.f_lt_tensor(&low)?.f_any()?.f_int64_value(&[])? != 0;
        if bad {
            return Err(Error::config(
                "TanhModule",
                "high",
                "high >= low everywhere",
                "high < low",
            ));
        }
        self.low = low;
        self.high = high;
        Ok(self)
    }

    crate::macros::setters! {
        /// Clamps `tanh(x)` away from ±1 by the dtype's resolution (default `false`).
        with_clamp(clamp: bool);
    }
}

impl TensorDictModule for TanhModule {
    fn in_keys(&self) -> Vec<NestedKey> {
        self.in_keys.clone()
    }

    fn out_keys(&self) -> Vec<NestedKey> {
        self.out_keys.clone()
    }

    fn forward(&self, mut td: TensorDict) -> Result<TensorDict> {
        let mut outs = Vec::with_capacity(self.in_keys.len());
        for k in &self.in_keys {
            let x = read_input("TanhModule", &td, k)?;
            let mut y = x.f_tanh()?;
            if self.clamp {
                let eps = crate::modules::distributions::resolution(y.kind());
                y = y.f_clamp(-1.0 + eps, 1.0 - eps)?;
            }
            let low = self.low.f_to_kind(y.kind())?.f_to_device(y.device())?;
            let high = self.high.f_to_kind(y.kind())?.f_to_device(y.device())?;
            let y = low.f_add(
                &high
                    .f_sub(&low)?
                    .f_mul(&y.f_add_scalar(1.0)?)?
                    .f_div_scalar(2.0)?,
            )?;
            outs.push(y);
        }
        for (k, y) in self.out_keys.iter().zip(outs) {
            td.set(k, y)?;
        }
        Ok(td)
    }
}
