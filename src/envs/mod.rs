//! Environments: the [`EnvBase`] trait, [`EnvSpecs`], rollouts, [`check_env_specs`], and
//! [`transforms`] with [`TransformedEnv`].
//!
//! See [`base`] for a complete custom environment.

pub mod base;
pub mod batched;
pub mod builtin;
mod check;
mod env_specs;
#[cfg(feature = "gym")]
pub mod gym;
mod keys;
pub mod llm;
pub mod transforms;
mod utils;

pub use base::{read_action, EnvBase, EnvCore, Policy, RolloutConfig};
pub use check::{check_env_specs, check_partial_reset};
pub use env_specs::{EnvSpecs, SpecGroup};
pub use keys::EnvKeys;
pub use transforms::{Compose, Transform, TransformedEnv};
pub use utils::{step_mdp, StepMdpOptions};
