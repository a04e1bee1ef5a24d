//! # torchrl
//!
//! TorchRL's design in Rust, on libtorch through the [`tch`] crate.
//!
//! - [`TensorDict`]: a nested, keyed container of tensors sharing leading batch dims.
//! - [`data::specs`]: `TensorSpec`s (`Unbounded`, `Bounded`, `Categorical`, `OneHot`, …, and
//!   `Composite`) that describe what an environment reads and writes.
//! - [`envs`]: the [`EnvBase`] trait, [`check_env_specs`], built-in environments
//!   ([`envs::builtin`]), batched environments ([`envs::batched`]) and transforms
//!   ([`envs::transforms`]) composed in a [`TransformedEnv`].
//! - `distributed` (cargo feature `distributed`): c10d process groups (Gloo) and data-parallel
//!   helpers; `docs/distributed.md`.
//! - [`Error`] / [`Result`]: every fallible operation returns a `Result` whose error names the
//!   key, shapes, dtypes and what was expected.
//!
//! ```
//! use tch::{Device, Kind, Tensor};
//! use torchrl::TensorDict;
//! # fn main() -> torchrl::Result<()> {
//! let mut td = TensorDict::new([64])?
//!     .with("obs", Tensor::zeros([64, 3], (Kind::Float, Device::Cpu)))?
//!     .with(("next", "reward"), Tensor::zeros([64, 1], (Kind::Float, Device::Cpu)))?;
//! let r = td.get_or_err(("next", "reward"))?.shallow_clone();
//! td.set(("next", "reward"), r + 1.0)?;
//! assert_eq!(td.get(("next", "reward")).map(|t| t.double_value(&[0, 0])), Some(1.0));
//! # Ok(()) }
//! ```
#![warn(missing_docs)]
// Every `unsafe` block says why it is sound (the speed-only code lives in `host`).
#![deny(clippy::undocumented_unsafe_blocks)]
// The lint gate (docs/reliability.md): no unwrap, expect, panic or panicking index in library
// code. Unit tests (`cfg(test)`) may use them.
#![cfg_attr(
    not(test),
    deny(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing
    )
)]

pub mod cli;
pub mod collectors;
pub mod data;
#[cfg(feature = "distributed")]
pub mod distributed;
pub mod envs;
pub mod error;
mod files;
mod host;
pub mod kind;
mod macros;
pub mod memory;
pub mod modules;
pub mod objectives;
pub mod rng;
pub mod tensordict;
pub mod trainers;

pub use data::specs;
pub use envs::{check_env_specs, EnvBase, RolloutConfig, TransformedEnv};
pub use error::{Error, Result};
pub use rng::Generator;
pub use tch;
pub use tensordict::{cat, stack, AsKey, BatchIndex, Entry, NestedKey, TensorDict};

/// The README's example, compiled and run as a doc test so that it stays true.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

/// The RLHF chapter's code, compiled as a doc test so that it stays true to the API.
#[doc = include_str!("../docs/rlhf.md")]
#[cfg(doctest)]
pub struct RlhfDocDoctests;

/// What a first program needs, for `use torchrl::prelude::*`: the tensordict, the specs, the
/// env and transform traits, the module traits (and the wrappers that make a network one), the
/// loss and value-estimator traits, and the collector. Traits are here so that their methods
/// (`forward`, `rollout`, `compute_advantage`, …) resolve without further imports; a
/// distribution or a particular loss is imported from its module (`modules::distributions`,
/// `objectives`), whose names would otherwise collide with the specs'
/// (`distributions::Categorical`).
///
/// ```
/// use torchrl::prelude::*;
/// # fn main() -> torchrl::Result<()> {
/// let spec = Bounded::new(-1.0, 1.0, [2])?;
/// let double = from_fn(["obs"], ["action"], |x: &[&tch::Tensor]| -> Result<Vec<tch::Tensor>> {
///     Ok(x.iter().map(|t| *t * 2.0).collect())
/// })?;
/// let td = TensorDict::new([])?.with("obs", tch::Tensor::from_slice(&[1.0f32, 2.0]))?;
/// let td = double.forward(td)?; // TensorDictModule's method, from the prelude
/// assert!(!spec.is_in(td.get_or_err("action")?)?); // 4.0 is out of [-1, 1]
/// assert_eq!(double.in_keys(), vec![NestedKey::from("obs")]);
/// # Ok(()) }
/// ```
pub mod prelude {
    pub use crate::collectors::Collector;
    pub use crate::data::specs::*;
    pub use crate::envs::transforms::{Compose, Transform, TransformedEnv};
    pub use crate::envs::{
        check_env_specs, step_mdp, EnvBase, EnvCore, EnvSpecs, Policy, RolloutConfig, SpecGroup,
    };
    pub use crate::error::{Error, Result};
    pub use crate::modules::{
        from_fn, ExplorationType, ProbabilisticTensorDictModule, TdModule, TensorDictModule,
        TensorDictSequential,
    };
    pub use crate::objectives::{LossModule, LossOutput, ValueEstimator};
    pub use crate::rng::Generator;
    pub use crate::tensordict::{
        cat, stack, AsKey, BatchIndex, Entry, IfExists, KeysOptions, NestedKey, Strict, TensorDict,
    };
}
