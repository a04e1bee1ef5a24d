//! [`MLP`]: TorchRL's `MLP`, a stack of linear layers with an activation between them, its
//! parameters held in a [`tch::nn::VarStore`].
//!
//! The layer widths follow TorchRL's rules ([`MlpConfig`]): `depth` hidden layers of
//! `num_cells` units each (one width for every layer, or one width per layer), then a linear
//! layer to `out_features`; `depth = 0` (the default when neither is given) is a single linear
//! layer; `depth` without `num_cells` gives 32 units per layer. The activation follows every
//! hidden layer, and the last one too with `activate_last_layer`.
//!
//! **Parameters** are named as in TorchRL's `state_dict` (the indices of `nn.Sequential`,
//! where activations take one slot each): `"0.weight"`, `"0.bias"`, `"2.weight"`, … under the
//! given [`tch::nn::Path`], so a TorchRL `MLP`'s weights can be copied in by name. They are
//! initialised like PyTorch's `nn.Linear` (uniform in `±1/√in_features`, weights and biases;
//! tch's default initialisation differs), on the path's device and dtype.
//!
//! Not ported: lazy `in_features` (tch has no lazy layers: it is required), `out_features` as
//! a shape, normalisation and dropout layers, noisy layers.
//!
//! `MLP` is not a [`tch::nn::Module`] (whose `forward` cannot fail); [`MLP::forward`] returns a
//! `Result`, and [`TdModule`](crate::modules::module::TdModule) runs it through
//! [`TensorModule`]. Several inputs are concatenated along the last dim, as in TorchRL.
//!
//! ```
//! use tch::{nn, Device, Kind, Tensor};
//! use torchrl::modules::models::{Activation, MlpConfig, MLP};
//! # fn main() -> torchrl::Result<()> {
//! let vs = nn::VarStore::new(Device::Cpu);
//! let cfg = MlpConfig::new(3, 2).with_depth(2).with_num_cells(16).with_activation(Activation::ReLU);
//! let mlp = MLP::new(&vs.root().sub("actor"), &cfg)?;
//! let mut names: Vec<String> = vs.variables().into_keys().collect();
//! names.sort();
//! assert_eq!(names[0], "actor.0.bias");
//! assert_eq!(names.len(), 6); // three linear layers, weight and bias each
//! let y = mlp.forward(&Tensor::zeros([5, 3], (Kind::Float, Device::Cpu)))?;
//! assert_eq!(y.size(), vec![5, 2]);
//! // a wrong input width is an error, not a panic
//! assert!(mlp.forward(&Tensor::zeros([5, 4], (Kind::Float, Device::Cpu))).is_err());
//! # Ok(()) }
//! ```

use std::fmt;

use tch::nn::{Init, Path};
use tch::{Device, Kind, Tensor};

use crate::error::{Error, Result, ShapeFmt};
use crate::macros::setters;
use crate::modules::module::{cat_last, describe, dtype_name, module_error, TensorModule};

/// An activation function (the `activation_class` of TorchRL's `MLP`), with torch's default
/// arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Activation {
    /// `tanh` (TorchRL's default), through [`tanh`](super::tanh::tanh): a faster float32
    /// kernel on non-Intel CPUs with AVX2, within 1 ulp of the exact value.
    #[default]
    Tanh,
    /// `max(x, 0)`.
    ReLU,
    /// `nn.ELU()` (alpha 1).
    ELU,
    /// `nn.LeakyReLU()` (negative slope 0.01).
    LeakyReLU,
    /// `nn.GELU()` (exact, erf-based).
    GELU,
    /// `nn.SiLU()`: `x · sigmoid(x)`.
    SiLU,
    /// `sigmoid`.
    Sigmoid,
    /// `nn.Softplus()` (beta 1, threshold 20).
    Softplus,
    /// `nn.Mish()`: `x · tanh(softplus(x))`.
    Mish,
    /// `nn.SELU()`.
    SELU,
    /// No activation (`nn.Identity`).
    Identity,
}

impl Activation {
    /// Applies the activation.
    pub fn apply(&self, x: &Tensor) -> Result<Tensor> {
        Ok(match self {
            Activation::Tanh => super::tanh::tanh(x)?,
            Activation::ReLU => x.f_relu()?,
            Activation::ELU => x.f_elu()?,
            Activation::LeakyReLU => x.f_leaky_relu()?,
            Activation::GELU => x.f_gelu("none")?,
            Activation::SiLU => x.f_silu()?,
            Activation::Sigmoid => x.f_sigmoid()?,
            Activation::Softplus => x.f_softplus()?,
            Activation::Mish => x.f_mish()?,
            Activation::SELU => x.f_selu()?,
            Activation::Identity => x.shallow_clone(),
        })
    }

    /// The name of the matching `torch.nn` class (`"Tanh"`, `"ReLU"`, …).
    pub fn name(&self) -> &'static str {
        match self {
            Activation::Tanh => "Tanh",
            Activation::ReLU => "ReLU",
            Activation::ELU => "ELU",
            Activation::LeakyReLU => "LeakyReLU",
            Activation::GELU => "GELU",
            Activation::SiLU => "SiLU",
            Activation::Sigmoid => "Sigmoid",
            Activation::Softplus => "Softplus",
            Activation::Mish => "Mish",
            Activation::SELU => "SELU",
            Activation::Identity => "Identity",
        }
    }

    /// The activation named like its `torch.nn` class (`"Tanh"`, `"ReLU"`, …), if any.
    pub fn from_name(name: &str) -> Option<Activation> {
        [
            Activation::Tanh,
            Activation::ReLU,
            Activation::ELU,
            Activation::LeakyReLU,
            Activation::GELU,
            Activation::SiLU,
            Activation::Sigmoid,
            Activation::Softplus,
            Activation::Mish,
            Activation::SELU,
            Activation::Identity,
        ]
        .into_iter()
        .find(|a| a.name() == name)
    }
}

/// The hidden-layer widths of an [`MLP`]: one width for every layer (needs a depth) or one
/// per layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NumCells {
    /// The same width for every hidden layer.
    Width(i64),
    /// One width per hidden layer (the depth is their number).
    PerLayer(Vec<i64>),
}

impl From<i64> for NumCells {
    fn from(w: i64) -> Self {
        NumCells::Width(w)
    }
}

impl From<Vec<i64>> for NumCells {
    fn from(v: Vec<i64>) -> Self {
        NumCells::PerLayer(v)
    }
}

impl From<&[i64]> for NumCells {
    fn from(v: &[i64]) -> Self {
        NumCells::PerLayer(v.to_vec())
    }
}

impl<const N: usize> From<[i64; N]> for NumCells {
    fn from(v: [i64; N]) -> Self {
        NumCells::PerLayer(v.to_vec())
    }
}

/// The configuration of an [`MLP`] (TorchRL's `MLP` arguments).
#[derive(Debug, Clone, PartialEq)]
pub struct MlpConfig {
    /// Input features (required: tch has no lazy layers).
    pub in_features: i64,
    /// Output features.
    pub out_features: i64,
    /// The number of hidden layers (`None`: from `num_cells`, or 0).
    pub depth: Option<usize>,
    /// The hidden widths (`None`: 32 per layer when a depth is given).
    pub num_cells: Option<NumCells>,
    /// The activation (default [`Activation::Tanh`]).
    pub activation: Activation,
    /// Whether the output goes through the activation too (default `false`).
    pub activate_last_layer: bool,
    /// Whether the last linear layer has a bias (default `true`).
    pub bias_last_layer: bool,
}

impl MlpConfig {
    /// `in_features → out_features` with TorchRL's defaults: no hidden layer, tanh
    /// activation, last layer not activated and with a bias.
    pub fn new(in_features: i64, out_features: i64) -> Self {
        MlpConfig {
            in_features,
            out_features,
            depth: None,
            num_cells: None,
            activation: Activation::Tanh,
            activate_last_layer: false,
            bias_last_layer: true,
        }
    }

    /// Sets the number of hidden layers.
    pub fn with_depth(mut self, depth: usize) -> Self {
        self.depth = Some(depth);
        self
    }

    /// Sets the hidden widths: an `i64` (every layer; needs [`MlpConfig::with_depth`]) or a
    /// list (one per layer).
    pub fn with_num_cells(mut self, num_cells: impl Into<NumCells>) -> Self {
        self.num_cells = Some(num_cells.into());
        self
    }

    setters! {
        /// Sets the activation.
        with_activation(activation: Activation);
        /// Sets whether the output is activated too.
        with_activate_last_layer(activate_last_layer: bool);
        /// Sets whether the last linear layer has a bias.
        with_bias_last_layer(bias_last_layer: bool);
    }

    /// The hidden widths, resolved with TorchRL's rules; errors name the conflict.
    pub fn hidden_widths(&self) -> Result<Vec<i64>> {
        let op = "MlpConfig";
        // a depth is a count of layers to build: an absurd one is named, not allocated
        const MAX_DEPTH: usize = 1 << 16;
        if let Some(d) = self.depth.filter(|d| *d > MAX_DEPTH) {
            return Err(Error::config(
                op,
                "depth",
                format!("at most {MAX_DEPTH} hidden layers"),
                d,
            ));
        }
        let widths = match (&self.num_cells, self.depth) {
            (None, None) => Vec::new(),
            (None, Some(d)) => vec![32; d],
            (Some(NumCells::Width(w)), Some(d)) => vec![*w; d],
            (Some(NumCells::Width(w)), None) => {
                return Err(Error::config(
                    op,
                    "depth",
                    format!(
                        "a depth, since num_cells is one width ({w}) (or give one width per \
                         layer)"
                    ),
                    "no depth",
                ))
            }
            (Some(NumCells::PerLayer(v)), None) => v.clone(),
            (Some(NumCells::PerLayer(v)), Some(d)) => {
                if v.len() != d {
                    return Err(Error::config(
                        op,
                        "depth",
                        format!("{}, the number of per-layer widths {v:?}", v.len()),
                        format!("depth {d}"),
                    ));
                }
                v.clone()
            }
        };
        let dims = std::iter::once(("in_features", ">= 1", self.in_features))
            .chain(std::iter::once(("out_features", ">= 1", self.out_features)))
            .chain(
                widths
                    .iter()
                    .map(|w| ("num_cells", "every hidden width >= 1", *w)),
            );
        for (field, expected, d) in dims {
            if d < 1 {
                return Err(Error::config(op, field, expected, d));
            }
        }
        Ok(widths)
    }
}

/// One linear layer: `x Wᵀ + b`.
struct Linear {
    weight: Tensor,
    bias: Option<Tensor>,
}

/// TorchRL's `MLP` (see the [module docs](self)).
pub struct MLP {
    layers: Vec<Linear>,
    config: MlpConfig,
}

impl fmt::Debug for MLP {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MLP(")?;
        for (i, l) in self.layers.iter().enumerate() {
            if i > 0 {
                write!(f, ", ")?;
            }
            let s = l.weight.size();
            write!(
                f,
                "Linear({} -> {}{})",
                s.get(1).copied().unwrap_or(0),
                s.first().copied().unwrap_or(0),
                if l.bias.is_some() { "" } else { ", no bias" }
            )?;
            if i + 1 < self.layers.len() || self.config.activate_last_layer {
                write!(f, ", {}", self.config.activation.name())?;
            }
        }
        write!(f, ")")
    }
}

impl MLP {
    /// Builds the MLP, creating its variables under `path` (see the [module docs](self) for
    /// names and initialisation). Errors on an inconsistent configuration.
    pub fn new(path: &Path<'_>, config: &MlpConfig) -> Result<Self> {
        let hidden = config.hidden_widths()?;
        let mut ins = vec![config.in_features];
        ins.extend_from_slice(&hidden);
        let mut outs = hidden;
        outs.push(config.out_features);
        let depth = outs.len() - 1;
        let mut layers = Vec::with_capacity(outs.len());
        for (i, (fan_in, fan_out)) in ins.into_iter().zip(outs).enumerate() {
            let p = path.sub((2 * i).to_string());
            let bound = 1.0 / (fan_in as f64).sqrt();
            let init = Init::Uniform {
                lo: -bound,
                up: bound,
            };
            let weight = p.f_var("weight", &[fan_out, fan_in], init)?;
            let bias = if i < depth || config.bias_last_layer {
                Some(p.f_var("bias", &[fan_out], init)?)
            } else {
                None
            };
            layers.push(Linear { weight, bias });
        }
        Ok(MLP {
            layers,
            config: config.clone(),
        })
    }

    /// The configuration it was built with.
    pub fn config(&self) -> &MlpConfig {
        &self.config
    }

    /// The input features.
    pub fn in_features(&self) -> i64 {
        self.config.in_features
    }

    /// The output features.
    pub fn out_features(&self) -> i64 {
        self.config.out_features
    }

    /// The number of hidden layers.
    pub fn depth(&self) -> usize {
        self.layers.len().saturating_sub(1)
    }

    /// The `(weight, bias)` of each linear layer, in order (the tensors of the `VarStore`:
    /// writing into them under `tch::no_grad_guard()` changes the MLP).
    pub fn layers(&self) -> Vec<(&Tensor, Option<&Tensor>)> {
        self.layers
            .iter()
            .map(|l| (&l.weight, l.bias.as_ref()))
            .collect()
    }

    /// Runs the MLP on `x` of shape `[*, in_features]`, giving `[*, out_features]`. Errors
    /// (naming both widths) when the last dim is not `in_features`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let size = x.size();
        if size.last() != Some(&self.config.in_features) {
            return Err(Error::argument(
                "MLP::forward",
                "x",
                format!(
                    "an input with in_features = {} features in its last dim",
                    self.config.in_features
                ),
                format!("an input of shape {}", ShapeFmt(&size)),
            ));
        }
        if let Some((kind, device)) = self.param_dtype_device() {
            if x.kind() != kind || x.device() != device {
                return Err(Error::argument(
                    "MLP::forward",
                    "x",
                    format!(
                        "MLP expects {} input on {device:?} (its parameters' dtype and device)",
                        dtype_name(kind)
                    ),
                    format!("{} on {:?}", describe(x), x.device()),
                ));
            }
        }
        let mut h = x.shallow_clone();
        let last = self.layers.len().saturating_sub(1);
        for (i, l) in self.layers.iter().enumerate() {
            h = h.f_linear(&l.weight, l.bias.as_ref()).map_err(|e| {
                module_error(e.into(), || {
                    format!(
                        "MLP layer {i} (weight {}) on an input {}",
                        describe(&l.weight),
                        describe(x)
                    )
                })
            })?;
            if i < last || self.config.activate_last_layer {
                h = self.config.activation.apply(&h)?;
            }
        }
        Ok(h)
    }

    /// The dtype and device of the MLP's parameters (its first layer's weight).
    fn param_dtype_device(&self) -> Option<(Kind, Device)> {
        self.layers
            .first()
            .map(|l| (l.weight.kind(), l.weight.device()))
    }

    /// Runs the MLP on several inputs concatenated along their last dim (TorchRL's
    /// `MLP(*inputs)`).
    pub fn forward_cat(&self, inputs: &[&Tensor]) -> Result<Tensor> {
        self.forward(&cat_last("MLP::forward", inputs)?)
    }
}

impl TensorModule for MLP {
    /// [`MLP::forward_cat`]; `train` is ignored (no dropout or normalisation layers).
    fn forward_many(&self, inputs: &[&Tensor], _train: bool) -> Result<Tensor> {
        self.forward_cat(inputs)
    }

    fn module_name(&self) -> &'static str {
        "MLP"
    }

    fn input_dtype_device(&self) -> Option<(Kind, Device)> {
        self.param_dtype_device()
    }
}
