//! A tour of the classic stack: build a nested TensorDict and a Composite spec that describes it, check the
//! data against the spec, catch a value that breaks the spec, project it back, sample from the
//! spec, save and reload the data, and print everything as trees.
//!
//! Run with `cargo run --release --example tour` (the flagship, `scripts/demo.sh`, is the RLHF
//! pipeline in `examples/rlhf/`).

use tch::{Device, Kind, Tensor};
use torchrl::envs::builtin::PendulumEnv;
use torchrl::envs::transforms::{RewardScaling, RewardSum, StepCounter};
use torchrl::envs::{check_env_specs, EnvBase, RolloutConfig, TransformedEnv};
use torchrl::specs::{Bounded, Categorical, Composite, Unbounded};
use torchrl::{Generator, TensorDict};

fn pendulum() -> torchrl::Result<()> {
    let mut env = TransformedEnv::new(PendulumEnv::new(&[], Device::Cpu)?)?
        .with(RewardScaling::new(0.0, 0.1)?)?
        .with(StepCounter::new().with_max_steps(200)?)?
        .with(RewardSum::new())?;
    println!(
        "== transformed Pendulum ==\n{}",
        env.transform()
            .iter()
            .map(|t| t.name())
            .collect::<Vec<_>>()
            .join("\n")
    );
    println!("done keys: {:?}", env.done_keys());
    check_env_specs(&mut env, Some(0))?;
    println!("check_env_specs: ok");

    env.set_seed(0)?;
    let traj = env.rollout(1000, None, &RolloutConfig::default())?;
    println!("== rollout of random torques (stops at the 200-step truncation) ==\n{traj}");
    let steps = traj.batch_size()[0];
    let ret = traj
        .get_or_err(("next", "episode_reward"))?
        .double_value(&[steps - 1, 0]);
    let count = traj
        .get_or_err(("next", "step_count"))?
        .int64_value(&[steps - 1, 0]);
    let truncated = traj
        .get_or_err(("next", "truncated"))?
        .int64_value(&[steps - 1, 0])
        != 0;
    println!("steps: {steps}, last step_count: {count}, truncated: {truncated}, episode return (scaled): {ret:.3}");
    Ok(())
}

fn main() -> torchrl::Result<()> {
    pendulum()?;
    specs_and_tensordicts()
}

fn specs_and_tensordicts() -> torchrl::Result<()> {
    let batch = [4];
    let f32s = (Kind::Float, Device::Cpu);

    // What a Pendulum-like env writes: an observation, an action, and a "next" level with the
    // next observation, the reward and the done flags.
    let spec = Composite::new(batch)?
        .with("observation", Bounded::new(-8.0, 8.0, [4, 3])?)?
        .with("action", Bounded::new(-2.0, 2.0, [4, 1])?)?
        .with(("next", "observation"), Bounded::new(-8.0, 8.0, [4, 3])?)?
        .with(("next", "reward"), Unbounded::new().with_shape([4, 1])?)?
        .with(
            ("next", "done"),
            Categorical::new(2)?
                .with_shape([4, 1])?
                .with_dtype(Kind::Bool)?,
        )?;

    let mut td = TensorDict::new(batch)?
        .with("observation", Tensor::rand([4, 3], f32s) * 2.0 - 1.0)?
        .with("action", Tensor::zeros([4, 1], f32s))?
        .with(("next", "observation"), Tensor::rand([4, 3], f32s))?
        .with(("next", "reward"), Tensor::full([4, 1], -0.5, f32s))?
        .with(
            ("next", "done"),
            Tensor::zeros([4, 1], (Kind::Bool, Device::Cpu)),
        )?;

    println!("== spec ==\n{spec}");
    println!("== data ==\n{td}");
    spec.check(&td)?;
    println!("data is in spec: {}", spec.is_in(&td)?);

    // An action outside [-2, 2] is caught, with the key and the offending values named.
    td.set("action", Tensor::full([4, 1], 3.5, f32s))?;
    match spec.check(&td) {
        Err(e) => println!("caught: {e}"),
        Ok(()) => println!("unexpected: out-of-bounds action accepted"),
    }
    // project() clamps only what is out of spec.
    let fixed = spec.project(&td)?;
    println!(
        "projected action[0] = {} (in spec: {})",
        fixed.get_or_err("action")?.double_value(&[0, 0]),
        spec.is_in(&fixed)?
    );

    // Seeded sampling: the same seed gives the same tensordict.
    let a = spec.rand(&mut Generator::new(7), &[])?;
    let b = spec.rand(&mut Generator::new(7), &[])?;
    println!(
        "two samples with seed 7 are identical: {}",
        a.eq(&b)?.all()?
    );

    // Save and reload (atomic write, validated read).
    let path = std::env::temp_dir().join("torchrl-tour.safetensors");
    fixed.save(&path)?;
    let back = TensorDict::load(&path)?;
    println!(
        "reloaded from {}: identical = {}",
        path.display(),
        back.eq(&fixed)?.all()?
    );
    std::fs::remove_file(&path).ok();
    Ok(())
}
