//! Policy building blocks: probability distributions over actions ([`distributions`]).
//!
//! ```
//! use tch::{Kind, Tensor};
//! use torchrl::modules::distributions::{Distribution, Normal};
//! use torchrl::Generator;
//! # fn main() -> torchrl::Result<()> {
//! let dist = Normal::new(&Tensor::zeros([2], (Kind::Float, tch::Device::Cpu)),
//!                        &Tensor::ones([2], (Kind::Float, tch::Device::Cpu)))?;
//! let action = dist.sample(&mut Generator::new(0), &[])?;
//! assert_eq!(action.size(), vec![2]);
//! assert_eq!(dist.log_prob(&action)?.size(), vec![2]);
//! # Ok(()) }
//! ```

pub mod distributions;
