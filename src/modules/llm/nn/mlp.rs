//! Feed-forward layers: [`Mlp`] (GPT-2: `down(act(up(x)))`) and [`GatedMlp`] (Llama's SwiGLU:
//! `down(act(gate(x)) · up(x))`), as [`FeedForward`]; [`Activation`] by `transformers`'
//! `ACT2FN` names (`hidden_act` / `activation_function` in `config.json`).
//!
//! # Shapes
//! `x` `[.., hidden]` → `[.., hidden]`.
//!
//! ```
//! use tch::{nn::VarStore, Device, Kind, Tensor};
//! use torchrl::modules::llm::nn::{Activation, GatedMlp, Linear, WeightLayout};
//! # fn main() -> torchrl::Result<()> {
//! let vs = VarStore::new(Device::Cpu);
//! let p = vs.root();
//! let lin = |n: &str, i, o| Linear::new(&p, n, i, o, false, WeightLayout::OutIn, 0.0);
//! let mlp = GatedMlp::new(lin("gate_proj", 1, 1)?, lin("up_proj", 1, 1)?, lin("down_proj", 1, 1)?, Activation::Silu);
//! // weights 1: y = silu(x) · x
//! for w in [mlp.gate().weight(), mlp.up().weight(), mlp.down().weight()] {
//!     tch::no_grad(|| w.shallow_clone().fill_(1.0));
//! }
//! let y = mlp.forward(&Tensor::from_slice(&[2.0f32]).view([1, 1]))?.double_value(&[0, 0]);
//! let silu2 = 2.0 / (1.0 + (-2.0f64).exp());
//! assert!((y - silu2 * 2.0).abs() < 1e-5);
//! assert_eq!(Activation::from_name("swish"), Some(Activation::Silu));
//! # Ok(()) }
//! ```

use tch::nn::Path;
use tch::Tensor;

use super::linear::Linear;
use crate::error::Result;

/// An activation by its `transformers` name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// `"gelu_new"` / `"gelu_pytorch_tanh"` / `"gelu_fast"`: the tanh approximation of GELU
    /// (GPT-2's default).
    GeluNew,
    /// `"gelu"`: the exact, erf-based GELU.
    Gelu,
    /// `"relu"`.
    Relu,
    /// `"silu"` / `"swish"`: `x · sigmoid(x)` (Llama's, Qwen's, Mistral's).
    Silu,
    /// `"quick_gelu"`: `x · sigmoid(1.702 x)`.
    QuickGelu,
}

impl Activation {
    /// The names [`Activation::from_name`] accepts, for error messages.
    pub const NAMES: &'static str =
        "gelu_new, gelu_pytorch_tanh, gelu_fast, gelu, relu, silu, swish, quick_gelu";

    /// The activation for a `transformers` name, or `None` for a name not supported here.
    pub fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "gelu_new" | "gelu_pytorch_tanh" | "gelu_fast" => Activation::GeluNew,
            "gelu" => Activation::Gelu,
            "relu" => Activation::Relu,
            "silu" | "swish" => Activation::Silu,
            "quick_gelu" => Activation::QuickGelu,
            _ => return None,
        })
    }

    /// Applies the activation.
    pub fn forward(self, x: &Tensor) -> Result<Tensor> {
        Ok(match self {
            Activation::GeluNew => x.f_gelu("tanh")?,
            Activation::Gelu => x.f_gelu("none")?,
            Activation::Relu => x.f_relu()?,
            Activation::Silu => x.f_silu()?,
            Activation::QuickGelu => x.f_mul(&x.f_mul_scalar(1.702)?.f_sigmoid()?)?,
        })
    }
}

/// `down(act(up(x)))` (GPT-2's `c_fc` / `c_proj`).
#[derive(Debug)]
pub struct Mlp {
    up: Linear,
    down: Linear,
    activation: Activation,
}

impl Mlp {
    /// From its two projections.
    pub fn new(up: Linear, down: Linear, activation: Activation) -> Self {
        Mlp {
            up,
            down,
            activation,
        }
    }

    /// Runs the MLP.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.down
            .forward(&self.activation.forward(&self.up.forward(x)?)?)
    }
}

/// `down(act(gate(x)) · up(x))` (Llama's `gate_proj` / `up_proj` / `down_proj`).
#[derive(Debug)]
pub struct GatedMlp {
    gate: Linear,
    up: Linear,
    down: Linear,
    activation: Activation,
}

impl GatedMlp {
    /// From its three projections.
    pub fn new(gate: Linear, up: Linear, down: Linear, activation: Activation) -> Self {
        GatedMlp {
            gate,
            up,
            down,
            activation,
        }
    }

    /// The gate projection.
    pub fn gate(&self) -> &Linear {
        &self.gate
    }

    /// The up projection.
    pub fn up(&self) -> &Linear {
        &self.up
    }

    /// The down projection.
    pub fn down(&self) -> &Linear {
        &self.down
    }

    /// Runs the MLP.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let gated = self.activation.forward(&self.gate.forward(x)?)?;
        self.down.forward(&gated.f_mul(&self.up.forward(x)?)?)
    }
}

/// Either feed-forward layer.
#[derive(Debug)]
pub enum FeedForward {
    /// GPT-2's.
    Plain(Mlp),
    /// SwiGLU.
    Gated(GatedMlp),
}

impl FeedForward {
    /// Runs the layer.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            FeedForward::Plain(m) => m.forward(x),
            FeedForward::Gated(m) => m.forward(x),
        }
    }

    /// The projections, in `transformers`' order.
    pub fn linears(&self) -> Vec<&Linear> {
        match self {
            FeedForward::Plain(m) => vec![&m.up, &m.down],
            FeedForward::Gated(m) => vec![&m.gate, &m.up, &m.down],
        }
    }

    /// The projections, mutably (to attach adapters), in the order of
    /// [`FeedForward::linears`].
    pub fn linears_mut(&mut self) -> Vec<&mut Linear> {
        match self {
            FeedForward::Plain(m) => vec![&mut m.up, &mut m.down],
            FeedForward::Gated(m) => vec![&mut m.gate, &mut m.up, &mut m.down],
        }
    }

    /// The parameters by name.
    pub fn named_parameters(&self) -> Vec<(String, &Tensor)> {
        self.linears()
            .into_iter()
            .flat_map(Linear::named_parameters)
            .collect()
    }

    /// The same layer sharing its tensors.
    pub(crate) fn shallow(&self) -> Self {
        match self {
            FeedForward::Plain(m) => {
                FeedForward::Plain(Mlp::new(m.up.shallow(), m.down.shallow(), m.activation))
            }
            FeedForward::Gated(m) => FeedForward::Gated(GatedMlp::new(
                m.gate.shallow(),
                m.up.shallow(),
                m.down.shallow(),
                m.activation,
            )),
        }
    }

    /// A copy under `path`.
    pub fn copy_to(&self, path: &Path<'_>) -> Result<Self> {
        Ok(match self {
            FeedForward::Plain(m) => FeedForward::Plain(Mlp::new(
                m.up.copy_to(path)?,
                m.down.copy_to(path)?,
                m.activation,
            )),
            FeedForward::Gated(m) => FeedForward::Gated(GatedMlp::new(
                m.gate.copy_to(path)?,
                m.up.copy_to(path)?,
                m.down.copy_to(path)?,
                m.activation,
            )),
        })
    }
}
