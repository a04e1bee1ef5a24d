//! [`MlpHead`]: trlX's `make_head`, the value / Q / V heads' network.

use std::fmt;

use tch::nn::Path;
use tch::Tensor;

use crate::error::{Error, Result};
use crate::modules::llm::nn::{copy_var, uniform_var};

/// trlX's `make_head(n_embd, out)`: `Linear(n_embd, 2·n_embd) → ReLU → Linear(2·n_embd, out)`,
/// parameters named `0.weight`, `0.bias`, `2.weight`, `2.bias` (PyTorch's `nn.Sequential`
/// indices), initialised like `nn.Linear` (uniform in `±1/√fan_in`).
pub struct MlpHead {
    w1: Tensor,
    b1: Tensor,
    w2: Tensor,
    b2: Tensor,
}

impl fmt::Debug for MlpHead {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MlpHead({:?} -> {:?})", self.w1.size(), self.w2.size())
    }
}

impl MlpHead {
    /// A freshly initialised head under `path`.
    pub fn new(path: &Path<'_>, n_embd: i64, out: i64) -> Result<Self> {
        if n_embd <= 0 || out <= 0 {
            return Err(Error::value(
                "MlpHead::new",
                "sizes",
                "positive n_embd and out",
                format!("n_embd {n_embd}, out {out}"),
            ));
        }
        // checked: an n_embd past i64::MAX / 2 is an error, not an overflow
        let hidden = n_embd.checked_mul(2).ok_or_else(|| {
            Error::value(
                "MlpHead::new",
                "n_embd",
                "a width whose double fits in i64",
                n_embd.to_string(),
            )
        })?;
        let uniform = |p: &Path<'_>, name: &str, shape: &[i64], fan_in: i64| {
            let bound = 1.0 / (fan_in as f64).sqrt();
            uniform_var(p, name, shape, -bound, bound)
        };
        let l0 = path / "0";
        let l2 = path / "2";
        Ok(MlpHead {
            w1: uniform(&l0, "weight", &[hidden, n_embd], n_embd)?,
            b1: uniform(&l0, "bias", &[hidden], n_embd)?,
            w2: uniform(&l2, "weight", &[out, hidden], hidden)?,
            b2: uniform(&l2, "bias", &[out], hidden)?,
        })
    }

    /// A copy of this head's parameters as new variables under `path`.
    pub fn copy_to(&self, path: &Path<'_>) -> Result<Self> {
        let l0 = path / "0";
        let l2 = path / "2";
        Ok(MlpHead {
            w1: copy_var(&l0, "weight", &self.w1)?,
            b1: copy_var(&l0, "bias", &self.b1)?,
            w2: copy_var(&l2, "weight", &self.w2)?,
            b2: copy_var(&l2, "bias", &self.b2)?,
        })
    }

    /// `[.., n_embd]` → `[.., out]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        // a head kept in float32 on a half-precision trunk reads its hidden state in float32
        let cast;
        let x = if x.kind() != self.w1.kind() {
            cast = x.f_to_kind(self.w1.kind())?;
            &cast
        } else {
            x
        };
        let h = x.f_linear(&self.w1, Some(&self.b1))?.f_relu()?;
        Ok(h.f_linear(&self.w2, Some(&self.b2))?)
    }

    /// The parameters, in `0.weight, 0.bias, 2.weight, 2.bias` order.
    pub fn parameters(&self) -> [&Tensor; 4] {
        [&self.w1, &self.b1, &self.w2, &self.b2]
    }

    /// Polyak update of `self` towards `source`: `self = α·source + (1 − α)·self`, without
    /// gradients.
    pub fn polyak_from(&self, source: &MlpHead, alpha: f64) -> Result<()> {
        let _guard = tch::no_grad_guard();
        for (t, s) in self.parameters().into_iter().zip(source.parameters()) {
            let mut t = t.shallow_clone();
            let _ = t.f_mul_scalar_(1.0 - alpha)?;
            let _ = t.f_add_(&s.f_mul_scalar(alpha)?)?;
        }
        Ok(())
    }
}
