//! Token-level LLM environments and their transforms (TorchRL's `torchrl.envs.llm`): the
//! token env that scores a policy's response, the per-token KL transforms and reward scaling
//! on `(B, T, 1)` rewards, and rewards without Python ([`rewards`]: answer checks, format
//! checks, length penalties, external scorer programs, weighted sums).

pub mod config;
pub mod env;
pub mod kl;
pub mod kl_estimator;
pub mod moments;
pub mod policy;
pub mod rewards;
pub mod scaling;
pub mod scorer;

pub use env::{PromptState, TokenEnv, TokenEnvConfig};
pub use kl::{
    trlx_logged_kl, KLComputation, KLRewardTransform, KlEstimator, LogProbSource, RetrieveKL,
    RetrieveLogProb,
};
pub use policy::GenerationPolicy;
pub use rewards::{
    AnswerMatch, CommandReward, Compare, Extraction, FormatCheck, RepetitionPenalty, RewardEntry,
    RewardFunction, RewardPart, RewardSample, RewardScorer, RewardsConfig, SoftOverlongPunishment,
    WeightedSum,
};
pub use scaling::{ScaleReward, ScoreScaling};
pub use scorer::{BatchScorer, RewardModelScorer, ScoreInput, Scorer, TextScorer, TokenScorer};
