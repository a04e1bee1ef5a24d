//! The Rust half of the side-by-side objectives benchmarks, measured exactly as
//! `benches/python/torchrl_baseline.py` measures them (best of 3, single-threaded libtorch):
//!
//! - W6: the Bradley-Terry reward-model loss (mean) and its accuracy, forward + backward, on
//!   precomputed chosen/rejected scores of batch 256 read from a tensordict, 1000 times:
//!   `RewardModelLoss::forward` + `total_loss().backward()`, printed next to the bare-`tch`
//!   floor (the same graph written with `tch` ops on the two leaves) and the ratio of the two
//!   times (target: ours within 1.15x of the floor); also the function form
//!   (`reward_model_loss_with_accuracy`).
//! - W7: one PPO update, 100 times: `ClipPPOLoss` forward (Normal actor MLP 3→64→64→2 with a
//!   `NormalParamExtractor`, critic MLP 3→64→64→1, smooth-L1 critic loss, entropy bonus) on a
//!   fixed batch of 256 Pendulum-sized transitions with GAE advantages precomputed, backward of
//!   the summed losses, one Adam step (lr 3e-4).
//!
//! Run: `cargo bench --bench objectives`, or `scripts/bench.sh` for the side-by-side table.

mod common;
use common::try_best_of;

use std::hint::black_box;

use tch::nn::{self, OptimizerConfig};
use tch::{Device, Kind, Tensor};
use torchrl::modules::{
    from_fn, DistributionBuilder, MlpConfig, NormalParamExtractor, ProbabilisticActor,
    TensorDictSequential, MLP,
};
use torchrl::objectives::value::functional::generalized_advantage_estimate;
use torchrl::objectives::{
    reward_model_loss_with_accuracy, ClipPPOLoss, LossModule, LossOutput, Reduction,
    RewardModelLoss,
};
use torchrl::TensorDict;

/// W6 inputs: precomputed chosen/rejected scores of batch 256, in a tensordict.
fn w6_data() -> torchrl::Result<(Tensor, Tensor, TensorDict)> {
    let b = 256i64;
    let c = Tensor::f_randn([b], (Kind::Float, Device::Cpu))?.set_requires_grad(true);
    let r = Tensor::f_randn([b], (Kind::Float, Device::Cpu))?.set_requires_grad(true);
    let data = TensorDict::new([b])?
        .with(
            "chosen",
            TensorDict::new([b])?.with("score", c.shallow_clone())?,
        )?
        .with(
            "rejected",
            TensorDict::new([b])?.with("score", r.shallow_clone())?,
        )?;
    Ok((c, r, data))
}

/// W6 (ours): `RewardModelLoss::forward` (loss + accuracy) on the tensordict, then backward
/// of `total_loss()`, 1000 iterations.
fn w6() -> torchrl::Result<f64> {
    let (_c, _r, data) = w6_data()?;
    let loss = RewardModelLoss::new();
    let secs = try_best_of(
        || {
            for _ in 0..1000 {
                let out = loss.forward(&data)?;
                black_box(&out.accuracy);
                out.total_loss()?.f_backward()?;
            }
            Ok(())
        },
        3,
    )?;
    Ok(1000.0 / secs)
}

/// W6 through the function form, [`reward_model_loss_with_accuracy`] on the two scores read
/// from the tensordict (what W6 measured before it measured the loss module).
fn w6_function() -> torchrl::Result<f64> {
    let (_c, _r, data) = w6_data()?;
    let secs = try_best_of(
        || {
            for _ in 0..1000 {
                let cs = data.get_or_err(("chosen", "score"))?;
                let rs = data.get_or_err(("rejected", "score"))?;
                let (loss, acc) = reward_model_loss_with_accuracy(cs, rs, Reduction::Mean)?;
                black_box(&acc);
                loss.f_backward()?;
            }
            Ok(())
        },
        3,
    )?;
    Ok(1000.0 / secs)
}

/// The W6 floor: the same three-node graph (`sub`, `softplus`, `mean`) and the accuracy
/// (`lt`, `mean`) written directly with `tch` ops on the two leaf tensors, then `backward`.
fn w6_floor() -> torchrl::Result<f64> {
    let (c, r, _data) = w6_data()?;
    let secs = try_best_of(
        || {
            for _ in 0..1000 {
                let margin = r.f_sub(&c)?;
                let loss = margin.f_softplus()?.f_mean(None)?;
                let acc = margin.f_lt(0.0)?.f_mean(Kind::Float)?;
                black_box(&acc);
                loss.f_backward()?;
            }
            Ok(())
        },
        3,
    )?;
    Ok(1000.0 / secs)
}

/// W7: ClipPPOLoss forward + backward + Adam step on a fixed batch of 256, 100 updates.
fn w7() -> torchrl::Result<f64> {
    let (b, updates) = (256i64, 100);
    let f = (Kind::Float, Device::Cpu);
    let vs = nn::VarStore::new(Device::Cpu);
    let cfg = |out| MlpConfig::new(3, out).with_depth(2).with_num_cells(64);
    let actor_mlp = MLP::new(&(vs.root() / "actor"), &cfg(2))?;
    let critic_mlp = MLP::new(&(vs.root() / "critic"), &cfg(1))?;
    let net = from_fn(["observation"], ["param"], move |x: &[&Tensor]| {
        Ok(vec![actor_mlp.forward(x[0])?])
    })?;
    let module = TensorDictSequential::new()
        .with(net)
        .with(NormalParamExtractor::new());
    let actor = ProbabilisticActor::new(module, DistributionBuilder::normal("loc", "scale")?);
    let critic = from_fn(["observation"], ["state_value"], move |x: &[&Tensor]| {
        Ok(vec![critic_mlp.forward(x[0])?])
    })?;
    let loss = ClipPPOLoss::new(actor, critic);
    let mut opt = nn::Adam::default().build(&vs, 3e-4)?;

    // a fixed batch: one 256-step trajectory, old log-probs from the initial policy (shifted),
    // GAE(0.99, 0.95) advantages from random values and rewards, precomputed
    let obs = Tensor::f_randn([b, 3], f)?;
    let action = Tensor::f_randn([b, 1], f)?.f_clamp(-2.0, 2.0)?;
    let td = TensorDict::new([b])?
        .with("observation", obs)?
        .with("action", action)?;
    let old_lp = {
        let _guard = tch::no_grad_guard();
        loss.actor().log_prob(&td)?
    };
    let old_lp = old_lp.f_add(&Tensor::f_randn(old_lp.size(), f)?.f_mul_scalar(0.1)?)?;
    let value = Tensor::f_randn([b, 1], f)?;
    let next_value = Tensor::f_randn([b, 1], f)?;
    let reward = Tensor::f_randn([b, 1], f)?;
    let done = Tensor::f_zeros([b, 1], (Kind::Bool, Device::Cpu))?;
    let (advantage, value_target) =
        generalized_advantage_estimate(0.99, 0.95, &value, &next_value, &reward, &done, None, -2)?;
    let td = td
        .with("action_log_prob", old_lp)?
        .with("advantage", advantage)?
        .with("value_target", value_target)?;

    let secs = try_best_of(
        || {
            for _ in 0..updates {
                let out = loss.forward(&td)?;
                opt.zero_grad();
                out.total_loss()?.f_backward()?;
                opt.step();
            }
            Ok(())
        },
        3,
    )?;
    Ok(f64::from(updates) / secs)
}

fn main() -> torchrl::Result<()> {
    tch::set_num_threads(1);
    tch::manual_seed(0);
    // interleaved, so that machine noise hits both sides alike
    let floor = w6_floor()?;
    let ours = w6()?;
    let function = w6_function()?;
    let floor = floor.max(w6_floor()?);
    let ours = ours.max(w6()?);
    println!("W6_reward_model_loss_fwd_bwd\t{ours:.1}");
    println!("W6_bare_tch_floor\t{floor:.1}");
    println!("W6_function_form\t{function:.1}");
    println!(
        "W6 ours (RewardModelLoss) vs bare-tch floor: {:.3}x the floor's time (target <= 1.15x)",
        floor / ours
    );
    println!("W7_ppo_update\t{:.1}", w7()?);
    Ok(())
}
