//! Write a transform that rewrites both the specs and the step data, stack it with another,
//! and prove the result with `check_env_specs`.
//!
//! `DistanceToGoal` adds an observation `distance` = |observation - goal|, declared in the
//! observation spec as `Bounded(0, inf)`; its reset hook writes it too, so the root of every
//! step carries it. Run: `cargo run --example custom_transform`.

use tch::Kind;
use torchrl::envs::builtin::CountingEnv;
use torchrl::envs::transforms::{Transform, TransformedEnv};
use torchrl::envs::{check_env_specs, EnvBase, EnvSpecs, RolloutConfig};
use torchrl::specs::{Bounded, Composite};
use torchrl::{NestedKey, Result, TensorDict};

struct DistanceToGoal {
    goal: f64,
    /// Shape of the observation leaf, learned when the transform is attached to an env.
    shape: Vec<i64>,
}

impl DistanceToGoal {
    fn new(goal: f64) -> Self {
        DistanceToGoal {
            goal,
            shape: Vec::new(),
        }
    }

    fn write(&self, mut td: TensorDict) -> Result<TensorDict> {
        let d = td
            .get_or_err("observation")?
            .f_sub_scalar(self.goal)?
            .f_abs()?;
        td.set("distance", d)?;
        Ok(td)
    }
}

impl Transform for DistanceToGoal {
    fn name(&self) -> String {
        format!("DistanceToGoal(goal={})", self.goal)
    }

    /// Learn from the parent's specs (lazy key/shape discovery happens here).
    fn attach(&mut self, parent: &EnvSpecs) -> Result<()> {
        self.shape = parent
            .observation
            .get_or_err("observation")?
            .shape()
            .to_vec();
        Ok(())
    }

    /// Every key the transform writes must be declared: TransformedEnv checks it.
    fn new_output_keys(&self) -> Vec<NestedKey> {
        vec!["distance".into()]
    }

    /// Build new specs from the copy we receive; the parent's specs are never touched.
    fn transform_observation_spec(&self, mut spec: Composite) -> Result<Composite> {
        spec.set("distance", Bounded::new(0.0, f64::INFINITY, &self.shape)?)?;
        Ok(spec)
    }

    fn step(&mut self, _td: &TensorDict, next: TensorDict) -> Result<TensorDict> {
        self.write(next)
    }

    fn reset(&mut self, _td: &TensorDict, reset: TensorDict) -> Result<TensorDict> {
        self.write(reset)
    }
}

fn main() -> Result<()> {
    let base = CountingEnv::new(10, &[3])?;
    let base_specs = base.specs().clone();
    let mut env = TransformedEnv::new(base)?.with(DistanceToGoal::new(4.0))?;
    assert!(
        env.base().specs() == &base_specs,
        "the base env's specs are untouched"
    );
    println!("observation keys: {:?}", env.observation_keys());
    check_env_specs(&mut env, Some(0))?;
    println!("check_env_specs: ok");
    let traj = env.rollout(6, None, &RolloutConfig::default())?;
    let d = traj.get_or_err(("next", "distance"))?;
    println!(
        "next distance for env 0: {:?}",
        Vec::<f32>::try_from(d.get(0).f_view([-1])?.f_to_kind(Kind::Float)?)?
    );
    Ok(())
}
