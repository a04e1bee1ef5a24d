//! The Rust half of the side-by-side environment benchmarks W1 and W2, measured exactly as
//! `benches/python/torchrl_baseline.py` measures them (best of 3, single-threaded libtorch),
//! plus `W1_bare_tch_loop`: the same W1 math as a bare `tch` loop with no TensorDict, no specs
//! and no transforms objects — the floor for a libtorch-based step.
//!
//! Run: `cargo bench --bench envs`, or `scripts/bench.sh` for the side-by-side table.

mod common;
use common::best_of;

use std::hint::black_box;

use tch::{Device, Kind, Tensor};
use torchrl::envs::builtin::PendulumEnv;
use torchrl::envs::transforms::{RewardScaling, RewardSum, StepCounter};
use torchrl::envs::{EnvBase, RolloutConfig, TransformedEnv};
use torchrl::Generator;

/// W1's math without the library: Pendulum-v1 dynamics on `[1]` tensors, a uniform random
/// torque, reward scaling, a step counter and an episode sum, and the per-step outputs kept and
/// stacked at the end (as a rollout does).
fn bare_loop(steps: usize, gen: &mut Generator) -> tch::Result<Tensor> {
    let opts = (Kind::Float, Device::Cpu);
    let (g, m, l, dt, max_speed) = (10.0, 1.0, 1.0, 0.05, 8.0);
    let mut th = Tensor::f_zeros([1], opts)?;
    let mut thdot = Tensor::f_zeros([1], opts)?;
    let mut count = Tensor::f_zeros([1], (Kind::Int64, Device::Cpu))?;
    let mut sum = Tensor::f_zeros([1], opts)?;
    let mut rewards = Vec::with_capacity(steps);
    for _ in 0..steps {
        let u = gen
            .uniform(&[1], -2.0, 2.0, Kind::Float, Device::Cpu)
            .map_err(|e| tch::TchError::Torch(e.to_string()))?;
        let norm = (&th + std::f64::consts::PI).remainder(2.0 * std::f64::consts::PI)
            - std::f64::consts::PI;
        let cost = norm.square() + thdot.square() * 0.1 + u.square() * 0.001;
        let newthdot = (&thdot
            + (th.sin() * (3.0 * g / (2.0 * l)) + &u * (3.0 / (m * l * l))) * dt)
            .clamp(-max_speed, max_speed);
        th = &th + &newthdot * dt;
        thdot = newthdot;
        let obs = Tensor::cat(&[th.cos(), th.sin(), thdot.shallow_clone()], -1);
        let r = -cost * 0.1;
        sum = &sum + &r;
        count = &count + 1;
        rewards.push(Tensor::cat(&[obs, r, sum.shallow_clone()], -1));
    }
    black_box(&count);
    Ok(Tensor::stack(&rewards, 0))
}

fn main() -> torchrl::Result<()> {
    tch::set_num_threads(1);

    // W1: one Pendulum + RewardScaling(0, 0.1), StepCounter, RewardSum; 1000 random steps.
    let mut env = TransformedEnv::new(PendulumEnv::new(&[], Device::Cpu)?)?
        .with(RewardScaling::new(0.0, 0.1)?)?
        .with(StepCounter::new())?
        .with(RewardSum::new())?;
    env.set_seed(0)?;
    let cfg = RolloutConfig::no_break();
    let w1 = best_of(|| drop(black_box(env.rollout(1000, None, &cfg))), 3);
    println!("W1_pendulum_b1_3tf_steps\t{:.1}", 1000.0 / w1);

    let mut gen = Generator::new(0);
    let bare = best_of(|| drop(black_box(bare_loop(1000, &mut gen))), 3);
    println!("W1_bare_tch_loop_steps\t{:.1}", 1000.0 / bare);

    // W2: 1024 batched Pendulums + RewardScaling, 200 steps from a given reset, no auto reset.
    let (b, t) = (1024usize, 200usize);
    let mut env = TransformedEnv::new(PendulumEnv::new(&[b as i64], Device::Cpu)?)?
        .with(RewardScaling::new(0.0, 0.1)?)?;
    env.set_seed(0)?;
    let w2 = best_of(
        || {
            let start = env.reset(None).ok();
            let cfg = RolloutConfig {
                auto_reset: Some(false),
                break_when_any_done: Some(false),
                tensordict: start,
                ..Default::default()
            };
            drop(black_box(env.rollout(t, None, &cfg)));
        },
        3,
    );
    println!("W2_pendulum_b1024_1tf_steps\t{:.1}", (b * t) as f64 / w2);
    Ok(())
}
