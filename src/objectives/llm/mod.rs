//! RLHF losses and their statistics on token-level data: the trlX-shaped PPO-RLHF loss with
//! masked GAE and whitening, the KL controllers and running moments.

pub mod dpo;
pub mod gae;
pub mod grpo;
pub mod ilql;
pub mod kl_controller;
pub mod masked;
pub mod ppo;

/// Re-exported from [`crate::envs::llm`], where the score scaling that keeps them lives.
pub use crate::envs::llm::moments;
pub use crate::envs::llm::moments::{BatchMoments, RunningMoments};
pub use grpo::{
    group_advantages, grpo_loss, grpo_loss_with_entropy, token_entropy, GroupScale,
    GrpoAggregation, GrpoConfig, GrpoKeys, GrpoLoss, GrpoLossOutput, MC_ADVANTAGE_STD_MIN,
    TRL_STD_EPS,
};
pub use ilql::{
    expectile_loss, ilql_loss, IlqlConfig, IlqlInputs, IlqlKeys, IlqlLoss, IlqlLossOutput,
};

/// Re-exported from [`crate::modules::llm`], where the scoring maths lives.
pub use crate::modules::llm::align_values_to_tokens;
pub use dpo::{
    dpo_loss, sequence_log_probs, DpoConfig, DpoKeys, DpoLoss, DpoLossOutput, DpoLossType,
};
pub use gae::gae_advantages_and_returns;
pub use kl_controller::{
    mean_sequence_kl, AdaptiveKLController, FixedKLController, KlController, KlEstimator,
};
pub use masked::{
    masked_mean, masked_var, masked_whiten, masked_whiten_global, whiten, SumReduce, WHITEN_EPS,
};
pub use ppo::{
    compute_ppo_rlhf_advantages, compute_ppo_rlhf_advantages_with, ppo_rlhf_loss, PpoRlhfConfig,
    PpoRlhfInputs, PpoRlhfKeys, PpoRlhfLoss, PpoRlhfLossOutput,
};
