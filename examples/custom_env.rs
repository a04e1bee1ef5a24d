//! Write an environment, check that it keeps its specs' promises, and roll it out.
//!
//! `PointMass`: a batch of particles on a line. The action is a force in [-1, 1]; the
//! observation is `[position, velocity]`; the reward is `-position²`; an episode terminates
//! when a particle leaves [-2, 2]. Run: `cargo run --example custom_env`.

use tch::{Device, Kind, Tensor};
use torchrl::envs::{check_env_specs, read_action, EnvBase, EnvCore, EnvSpecs, RolloutConfig};
use torchrl::specs::{Bounded, Unbounded};
use torchrl::{Result, TensorDict};

struct PointMass {
    core: EnvCore,
    /// `[*batch, 2]`: position, velocity.
    state: Tensor,
}

impl PointMass {
    fn new(batch: &[i64]) -> Result<Self> {
        let shape = |feat: i64| [batch, &[feat]].concat();
        // Leaf shapes are `[*batch, *feature]`, as in TorchRL.
        let specs = EnvSpecs::new(batch)?
            .with_observation("observation", Unbounded::new().with_shape(shape(2))?)?
            .with_action("action", Bounded::new(-1.0, 1.0, shape(1))?)?
            .with_reward("reward", Unbounded::new().with_shape(shape(1))?)?;
        Ok(PointMass {
            core: EnvCore::new(specs)?, // completes done/terminated specs, validates, locks
            state: Tensor::f_zeros(shape(2), (Kind::Float, Device::Cpu))?,
        })
    }

    fn batch(&self) -> Vec<i64> {
        self.core.specs().batch_size().to_vec()
    }
}

impl EnvBase for PointMass {
    fn core(&self) -> &EnvCore {
        &self.core
    }
    fn core_mut(&mut self) -> &mut EnvCore {
        &mut self.core
    }

    /// A fresh tensordict. Without a `"_reset"` mask every particle restarts (position uniform in
    /// [-1, 1] from the env's seeded generator, velocity 0); with one (bool, the done leaf's shape
    /// `[*batch, 1]`: true = reset this element), only the selected particles restart and the
    /// others keep their state, so the next step continues from the state they last observed.
    fn reset_impl(&mut self, td: Option<&TensorDict>) -> Result<TensorDict> {
        let batch = self.batch();
        let pos_shape = [batch.as_slice(), &[1]].concat();
        // The whole batch is drawn either way, so the generator's stream does not depend on
        // the mask.
        let pos = self
            .core
            .generator
            .uniform(&pos_shape, -1.0, 1.0, Kind::Float, Device::Cpu)?;
        let fresh = Tensor::f_cat(
            &[
                pos,
                Tensor::f_zeros(&pos_shape, (Kind::Float, Device::Cpu))?,
            ],
            -1,
        )?;
        self.state = match td.and_then(|t| t.get("_reset")) {
            Some(mask) => {
                // [*batch, 1] (a [*batch] mask is accepted too), broadcast over the state's
                // feature dim: reset where true, keep the current state elsewhere.
                let mask = mask
                    .f_to_kind(Kind::Bool)?
                    .f_reshape([batch.as_slice(), &[-1]].concat())?
                    .f_any_dim(-1, true)?;
                fresh.f_where_self(&mask, &self.state)?
            }
            None => fresh,
        };
        TensorDict::new(batch)?.with("observation", self.state.copy())
    }

    /// The *next* tensordict: observation, reward, terminated (done is completed for us).
    fn step_impl(&mut self, td: &TensorDict) -> Result<TensorDict> {
        // the action as its spec declares it ([*batch, 1], float32, on the env's device): `step`
        // has checked it already; read_action checks it again for callers of step_impl
        let force = read_action(td, "action", self.core.specs())?.f_clamp(-1.0, 1.0)?;
        let dt = 0.1;
        let pos = self.state.f_narrow(-1, 0, 1)?;
        let vel = self.state.f_narrow(-1, 1, 1)?;
        let vel = vel.f_add(&force.f_mul_scalar(dt)?)?;
        let pos = pos.f_add(&vel.f_mul_scalar(dt)?)?;
        self.state = Tensor::f_cat(&[&pos, &vel], -1)?;
        let reward = pos.f_square()?.f_neg()?;
        let terminated = pos.f_abs()?.f_gt(2.0)?;
        TensorDict::new(self.batch())?
            .with("observation", self.state.copy())?
            .with("reward", reward)?
            .with("terminated", terminated)
    }
}

fn main() -> Result<()> {
    let mut env = PointMass::new(&[4])?;
    println!("{:?}", env.specs());
    // Prove the env keeps its word: key sets, shapes, dtypes and bounds of a short rollout, and
    // partial resets that leave the unselected particles alone (check_partial_reset).
    check_env_specs(&mut env, Some(0))?;
    println!("check_env_specs: ok");
    env.set_seed(42)?;
    let traj = env.rollout(50, None, &RolloutConfig::default())?;
    println!("rollout of random actions:\n{traj}");
    let ret =
        traj.get_or_err(("next", "reward"))?
            .f_sum_dim_intlist(&[1i64][..], false, Kind::Float)?;
    println!(
        "returns per particle: {:?}",
        Vec::<f32>::try_from(ret.f_view([-1])?)?
    );
    Ok(())
}
