//! RLHF losses and their statistics on token-level data: the trlX-shaped PPO-RLHF loss with
//! masked GAE and whitening, the KL controllers and running moments.

pub mod kl_controller;
pub mod moments;
pub mod ppo;
