//! Normalisation layers: [`LayerNorm`] (GPT-2) and [`RmsNorm`] (Llama, Qwen, Mistral; also
//! Qwen3's per-head q/k norms), and [`Norm`], either of them.
//!
//! `RmsNorm` computes as `transformers`' `LlamaRMSNorm`: the statistic in float32 whatever the
//! input dtype, `x · rsqrt(mean(x²) + eps)` cast back to the input dtype, then times the weight.
//!
//! # Shapes
//! `x` `[.., dim]` → `[.., dim]`.
//!
//! ```
//! use tch::{nn::VarStore, Device, Tensor};
//! use torchrl::modules::llm::nn::RmsNorm;
//! # fn main() -> torchrl::Result<()> {
//! let vs = VarStore::new(Device::Cpu);
//! let norm = RmsNorm::new(&vs.root(), "norm", 2, 0.0)?;
//! // [3, 4]: rms = sqrt((9 + 16) / 2) = 3.5355..
//! let y = norm.forward(&Tensor::from_slice(&[3.0f64, 4.0]).view([1, 2]))?;
//! let r = (12.5f64).sqrt();
//! assert!((y.double_value(&[0, 0]) - 3.0 / r).abs() < 1e-6);
//! assert!((y.double_value(&[0, 1]) - 4.0 / r).abs() < 1e-6);
//! # Ok(()) }
//! ```

use tch::nn::{Init, Path};
use tch::{Kind, Tensor};

use super::{copy_var, sub_path};
use crate::error::{Error, Result};

fn check(op: &'static str, name: &str, dim: i64, eps: f64) -> Result<()> {
    if dim <= 0 || !(eps.is_finite() && eps >= 0.0) {
        return Err(Error::value(
            op,
            name,
            "a positive dim and a finite eps >= 0",
            format!("dim {dim}, eps {eps}"),
        ));
    }
    Ok(())
}

/// A layer norm with affine weight and bias (`nn.LayerNorm`).
#[derive(Debug)]
pub struct LayerNorm {
    name: String,
    weight: Tensor,
    bias: Tensor,
    eps: f64,
}

impl LayerNorm {
    /// Unit weight, zero bias, named `name` under `path`.
    pub fn new(path: &Path<'_>, name: &str, dim: i64, eps: f64) -> Result<Self> {
        check("LayerNorm::new", name, dim, eps)?;
        let p = sub_path(path, name);
        Ok(LayerNorm {
            name: name.to_string(),
            weight: p.f_var("weight", &[dim], Init::Const(1.0))?,
            bias: p.f_var("bias", &[dim], Init::Const(0.0))?,
            eps,
        })
    }

    /// Normalises over the last dim.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let dim = self.weight.size();
        Ok(x.f_layer_norm(dim, Some(&self.weight), Some(&self.bias), self.eps, true)?)
    }

    /// `{name}.weight`, `{name}.bias`.
    pub fn named_parameters(&self) -> Vec<(String, &Tensor)> {
        vec![
            (format!("{}.weight", self.name), &self.weight),
            (format!("{}.bias", self.name), &self.bias),
        ]
    }

    /// The same layer sharing its tensors (no copy; gradients reach the same variables).
    pub(crate) fn shallow(&self) -> Self {
        LayerNorm {
            name: self.name.clone(),
            weight: self.weight.shallow_clone(),
            bias: self.bias.shallow_clone(),
            eps: self.eps,
        }
    }

    /// A copy under `path`.
    pub fn copy_to(&self, path: &Path<'_>) -> Result<Self> {
        let p = sub_path(path, &self.name);
        Ok(LayerNorm {
            name: self.name.clone(),
            weight: copy_var(&p, "weight", &self.weight)?,
            bias: copy_var(&p, "bias", &self.bias)?,
            eps: self.eps,
        })
    }
}

/// Root-mean-square norm with a weight and no bias (`LlamaRMSNorm`). See the
/// [module docs](self).
#[derive(Debug)]
pub struct RmsNorm {
    name: String,
    weight: Tensor,
    eps: f64,
}

impl RmsNorm {
    /// Unit weight, named `name` under `path`.
    pub fn new(path: &Path<'_>, name: &str, dim: i64, eps: f64) -> Result<Self> {
        check("RmsNorm::new", name, dim, eps)?;
        let p = sub_path(path, name);
        Ok(RmsNorm {
            name: name.to_string(),
            weight: p.f_var("weight", &[dim], Init::Const(1.0))?,
            eps,
        })
    }

    /// Normalises over the last dim (statistic in float32, or float64 for float64 inputs).
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let kind = x.kind();
        let stat_kind = if kind == Kind::Double {
            Kind::Double
        } else {
            Kind::Float
        };
        let xf = x.f_to_kind(stat_kind)?;
        let var = xf
            .f_square()?
            .f_mean_dim(-1, true, None::<Kind>)?
            .f_add_scalar(self.eps)?;
        let normed = xf.f_mul(&var.f_rsqrt()?)?.f_to_kind(kind)?;
        Ok(normed.f_mul(&self.weight)?)
    }

    /// `{name}.weight`.
    pub fn named_parameters(&self) -> Vec<(String, &Tensor)> {
        vec![(format!("{}.weight", self.name), &self.weight)]
    }

    /// The same layer sharing its tensors (no copy; gradients reach the same variables).
    pub(crate) fn shallow(&self) -> Self {
        RmsNorm {
            name: self.name.clone(),
            weight: self.weight.shallow_clone(),
            eps: self.eps,
        }
    }

    /// A copy under `path`.
    pub fn copy_to(&self, path: &Path<'_>) -> Result<Self> {
        let p = sub_path(path, &self.name);
        Ok(RmsNorm {
            name: self.name.clone(),
            weight: copy_var(&p, "weight", &self.weight)?,
            eps: self.eps,
        })
    }
}

/// Either norm: what a block or a decoder's final norm is.
#[derive(Debug)]
pub enum Norm {
    /// GPT-2's.
    Layer(LayerNorm),
    /// Llama's.
    Rms(RmsNorm),
}

impl Norm {
    /// Normalises over the last dim.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Norm::Layer(n) => n.forward(x),
            Norm::Rms(n) => n.forward(x),
        }
    }

    /// The parameters by name.
    pub fn named_parameters(&self) -> Vec<(String, &Tensor)> {
        match self {
            Norm::Layer(n) => n.named_parameters(),
            Norm::Rms(n) => n.named_parameters(),
        }
    }

    /// The same norm sharing its tensors.
    pub(crate) fn shallow(&self) -> Self {
        match self {
            Norm::Layer(n) => Norm::Layer(n.shallow()),
            Norm::Rms(n) => Norm::Rms(n.shallow()),
        }
    }

    /// A copy under `path`.
    pub fn copy_to(&self, path: &Path<'_>) -> Result<Self> {
        Ok(match self {
            Norm::Layer(n) => Norm::Layer(n.copy_to(path)?),
            Norm::Rms(n) => Norm::Rms(n.copy_to(path)?),
        })
    }
}

impl From<LayerNorm> for Norm {
    fn from(n: LayerNorm) -> Self {
        Norm::Layer(n)
    }
}

impl From<RmsNorm> for Norm {
    fn from(n: RmsNorm) -> Self {
        Norm::Rms(n)
    }
}
