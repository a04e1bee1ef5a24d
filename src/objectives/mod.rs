//! Losses and value estimators (TorchRL's `torchrl.objectives`).
//!
//! - [`common`]: the [`LossModule`] trait (and its type-erased form, [`DynLossModule`]),
//!   typed outputs ([`LossOutput`]) and [`Reduction`].
//! - [`keys`]: keys structs ([`AcceptedKeys`], [`accepted_keys!`](crate::accepted_keys))
//!   settable by name with TorchRL's `set_keys` rules (their forwarding to a value estimator
//!   is [`value::forward_value_estimator_keys`]).
//! - [`ppo`]: PPO's clipped-surrogate loss ([`ClipPPOLoss`]) and its KL-penalty variant
//!   ([`KLPENPPOLoss`]), one generic [`PpoLoss`] configured by a [`PpoConfig`]; the
//!   on-policy [`A2CLoss`] and [`ReinforceLoss`] share it.
//! - [`reward_model`]: the Bradley-Terry reward-model loss ([`RewardModelLoss`],
//!   [`reward_model_loss`]).
//! - [`target`]: target networks ([`WithTarget`], [`TargetNetworks`]) and their updaters
//!   ([`SoftUpdate`], [`HardUpdate`]).
//! - off-policy losses: [`DQNLoss`] ([`dqn`]), [`DDPGLoss`] ([`ddpg`]), [`TD3Loss`] ([`td3`]),
//!   [`SACLoss`] and [`DiscreteSACLoss`] ([`sac`]), sharing [`off_policy`]
//!   ([`ValueEstimators`], [`TargetEntropy`]).
//! - [`value`]: value estimators ([`value::GAE`], [`value::TDLambdaEstimator`]) and their
//!   functional forms.
//!
//! ```
//! use tch::Tensor;
//! use torchrl::objectives::{LossModule, RewardModelLoss};
//! use torchrl::{NestedKey, TensorDict};
//! # fn main() -> torchrl::Result<()> {
//! let mut loss = RewardModelLoss::new();
//! // a dataset that names the sides differently
//! loss.set_keys(&[("chosen", Some("chosen_data".into())), ("rejected", Some("rejected_data".into()))])?;
//! assert_eq!(loss.in_keys(), &[NestedKey::from("chosen_data"), NestedKey::from("rejected_data")]);
//! let td = TensorDict::new([2])?
//!     .with(("chosen_data", "score"), Tensor::from_slice(&[1.0f32, 2.0]))?
//!     .with(("rejected_data", "score"), Tensor::from_slice(&[0.0f32, 3.0]))?;
//! let out = loss.forward(&td)?;
//! assert_eq!(out.accuracy.double_value(&[]), 0.5);
//! assert!(loss.set_keys(&[("reward", None)]).is_err()); // not a key of this loss
//! # Ok(()) }
//! ```

pub mod common;
pub mod ddpg;
pub mod dqn;
mod fused_adam;
pub(crate) use fused_adam::{fused_adamw_step, fused_groups, picked};
pub mod keys;
pub mod llm;
pub mod off_policy;
pub mod optim;
pub mod ppo;
pub mod reward_model;
pub mod sac;
pub mod target;
pub mod td3;
pub mod value;

pub use common::{ensure_finite, DynLossModule, LossModule, LossOutput, Reduction};
pub use ddpg::{DDPGConfig, DDPGKeys, DDPGLoss, DDPGLossOutput};
pub use dqn::{DQNConfig, DQNKeys, DQNLoss, DQNLossOutput};
pub use keys::{set_estimator_keys, set_loss_keys, AcceptedKeys, KeyPairs};
pub use off_policy::{BoxedEstimator, TargetEntropy, ValueEstimators, DEFAULT_GAMMA};
pub use ppo::{
    A2CLoss, A2CLossOutput, A2c, Clip, ClipPPOLoss, CriticLossType, KLPENPPOLoss, KlPen,
    KlPenPpoLossOutput, PpoConfig, PpoKeys, PpoLoss, PpoLossOutput, PpoObjective, Reinforce,
    ReinforceLoss, ReinforceLossOutput,
};
pub use reward_model::{
    reward_model_loss, reward_model_loss_with_accuracy, Centering, RewardModelKeys,
    RewardModelLoss, RewardModelLossOutput, ScoreFn,
};
pub use sac::{
    DiscreteSACConfig, DiscreteSACKeys, DiscreteSACLoss, SACConfig, SACKeys, SACLoss, SACLossOutput,
};
pub use target::{HardUpdate, SoftUpdate, TargetNetworks, TargetParams, WithTarget};
pub use td3::{TD3Config, TD3Keys, TD3Loss, TD3LossOutput};
pub use value::{
    forward_value_estimator_keys, TD0Estimator, TD1Estimator, TDLambdaEstimator, ValueEstimator,
    ValueEstimatorKeys, ValueNetwork, GAE, VALUE_ESTIMATOR_KEYS,
};
