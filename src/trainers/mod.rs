//! Trainers in the shape of trlX's `BaseRLModel` / `AccelerateRLModel`: the trainer API,
//! configs, atomic checkpoints, the optimizer and schedule, and the RLHF trainers.

pub mod api;
pub mod checkpoint;
pub mod config;
pub mod dpo;
pub mod grpo;
pub mod ilql;
pub mod on_policy;
pub mod optim;
pub mod parallel;
pub mod policy;
pub mod ppo;
mod ppo_method;
pub mod reward;
mod rollout;
mod schedule;
pub mod sft;

pub use api::{Callbacks, Component, EvalReport, Intervals, RlTrainer, Stats, RANKS_COMPONENT};
pub use checkpoint::{Checkpoint, CheckpointStore};
pub use config::TrlConfig;
pub use optim::{AdamW, CosineAnnealingLr};
