//! Tensor models: [`MLP`] (TorchRL's multi-layer perceptron on a [`tch::nn::VarStore`]) and
//! [`ValueOperator`] (a model from observation(s) to a value, as a
//! [`TensorDictModule`](super::module::TensorDictModule)).
//!
//! ```
//! use tch::{nn, Device, Kind, Tensor};
//! use torchrl::modules::models::{Activation, MlpConfig, MLP};
//! # fn main() -> torchrl::Result<()> {
//! let vs = nn::VarStore::new(Device::Cpu);
//! // two hidden layers of 8 and 4 units, ELU in between
//! let cfg = MlpConfig::new(3, 1).with_num_cells([8, 4]).with_activation(Activation::ELU);
//! let mlp = MLP::new(&vs.root(), &cfg)?;
//! assert_eq!(mlp.depth(), 2);
//! let y = mlp.forward(&Tensor::ones([2, 7, 3], (Kind::Float, Device::Cpu)))?; // any leading dims
//! assert_eq!(y.size(), vec![2, 7, 1]);
//! # Ok(()) }
//! ```

pub mod mlp;
pub mod tanh;
pub mod value;

pub use mlp::{Activation, MlpConfig, NumCells, MLP};
pub use tanh::{tanh, tanh_kernel_available};
pub use value::ValueOperator;
