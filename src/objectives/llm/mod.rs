//! RLHF losses and their statistics on token-level data: the trlX-shaped PPO-RLHF loss with
//! masked GAE and whitening, the KL controllers and running moments.

pub mod dpo;
pub mod grpo;
pub mod ilql;
pub mod kl_controller;
pub mod moments;
pub mod ppo;

pub use grpo::{
    group_advantages, grpo_loss, grpo_loss_with_entropy, token_entropy, GroupScale,
    GrpoAggregation, GrpoConfig, GrpoKeys, GrpoLoss, GrpoLossOutput, MC_ADVANTAGE_STD_MIN,
    TRL_STD_EPS,
};
pub use ilql::{
    expectile_loss, ilql_loss, IlqlConfig, IlqlInputs, IlqlKeys, IlqlLoss, IlqlLossOutput,
};
pub use moments::{BatchMoments, RunningMoments};

/// Re-exported from [`crate::modules::llm`], where the scoring maths lives.
pub use crate::modules::llm::align_values_to_tokens;
pub use dpo::{
    dpo_loss, sequence_log_probs, DpoConfig, DpoKeys, DpoLoss, DpoLossOutput, DpoLossType,
};
pub use kl_controller::{
    mean_sequence_kl, AdaptiveKLController, FixedKLController, KlController, KlEstimator,
};
pub use ppo::{
    compute_ppo_rlhf_advantages, gae_advantages_and_returns, masked_mean, masked_var,
    masked_whiten, ppo_rlhf_loss, whiten, PpoRlhfConfig, PpoRlhfInputs, PpoRlhfKeys, PpoRlhfLoss,
    PpoRlhfLossOutput,
};
