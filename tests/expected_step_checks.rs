//! `EnvBase::step` checks actions against the action spec (issue 26, item 3): shape
//! `[*batch, *action_shape]`, dtype and device, before the env sees them, with an error naming
//! the key, the expected and the given; `read_action` is the same check for custom envs.

use std::sync::atomic::{AtomicUsize, Ordering};

use tch::{Device, Kind, Tensor};
use torchrl::envs::builtin::{CountingEnv, PendulumEnv};
use torchrl::envs::{read_action, EnvBase, EnvCore, EnvSpecs, RolloutConfig};
use torchrl::specs::{Bounded, Unbounded};
use torchrl::{Error, TensorDict};

type R = torchrl::Result<()>;

static STEPS: AtomicUsize = AtomicUsize::new(0);

/// A custom env that does not check its actions: it adds the action to its state.
struct Adder {
    core: EnvCore,
    state: Tensor,
}

impl EnvBase for Adder {
    fn core(&self) -> &EnvCore {
        &self.core
    }
    fn core_mut(&mut self) -> &mut EnvCore {
        &mut self.core
    }
    fn reset_impl(&mut self, _td: Option<&TensorDict>) -> torchrl::Result<TensorDict> {
        self.state = Tensor::zeros([4, 1], (Kind::Float, Device::Cpu));
        TensorDict::new([4])?.with("observation", self.state.copy())
    }
    fn step_impl(&mut self, td: &TensorDict) -> torchrl::Result<TensorDict> {
        STEPS.fetch_add(1, Ordering::SeqCst);
        self.state = self.state.f_add(td.get_or_err("action")?)?;
        TensorDict::new([4])?
            .with("observation", self.state.copy())?
            .with("reward", Tensor::zeros([4, 1], (Kind::Float, Device::Cpu)))?
            .with("done", Tensor::zeros([4, 1], (Kind::Bool, Device::Cpu)))
    }
}

fn adder() -> torchrl::Result<Adder> {
    let specs = EnvSpecs::new([4])?
        .with_observation("observation", Unbounded::new().with_shape([4, 1])?)?
        .with_action("action", Bounded::new(-1.0, 1.0, [4, 1])?)?
        .with_reward("reward", Unbounded::new().with_shape([4, 1])?)?;
    Ok(Adder {
        core: EnvCore::new(specs)?,
        state: Tensor::zeros([4, 1], (Kind::Float, Device::Cpu)),
    })
}

#[test]
fn a_flat_action_for_a_4x1_spec_is_refused_before_the_env_runs() -> R {
    let mut env = adder()?;
    let td = env.reset(None)?;
    let before = STEPS.load(Ordering::SeqCst);
    let td = td.with("action", Tensor::zeros([4], (Kind::Float, Device::Cpu)))?;
    let err = env.step(td).unwrap_err();
    match &err {
        Error::ShapeMismatch {
            key,
            expected,
            actual,
            ..
        } => {
            assert!(key.contains("action"), "{key}");
            assert_eq!(expected, &[4, 1]);
            assert_eq!(actual, &[4]);
        }
        other => panic!("expected a shape mismatch on the action, got {other}"),
    }
    assert!(err.to_string().contains("action"), "{err}");
    // the env never saw it (it would have broadcast [4] + [4, 1] into [4, 4])
    assert_eq!(STEPS.load(Ordering::SeqCst), before);
    Ok(())
}

#[test]
fn a_float64_action_for_a_float32_spec_is_refused() -> R {
    let mut env = adder()?;
    let td = env
        .reset(None)?
        .with("action", Tensor::zeros([4, 1], (Kind::Double, Device::Cpu)))?;
    let err = env.step(td).unwrap_err();
    match &err {
        Error::DtypeMismatch {
            key,
            expected,
            actual,
            ..
        } => {
            assert!(key.contains("action"), "{key}");
            assert_eq!(*expected, Kind::Float);
            assert_eq!(*actual, Kind::Double);
        }
        other => panic!("expected a dtype mismatch on the action, got {other}"),
    }
    Ok(())
}

#[test]
fn builtin_envs_check_actions_in_step_and_rollout() -> R {
    let mut env = PendulumEnv::new(&[3], Device::Cpu)?;
    let td = env
        .reset(None)?
        .with("action", Tensor::zeros([3], (Kind::Float, Device::Cpu)))?;
    assert!(matches!(env.step(td), Err(Error::ShapeMismatch { .. })));
    // a policy writing float64 actions fails in the rollout, naming the action
    let mut policy = |mut td: TensorDict| {
        td.set("action", Tensor::zeros([3, 1], (Kind::Double, Device::Cpu)))?;
        Ok(td)
    };
    let err = env
        .rollout(5, Some(&mut policy), &RolloutConfig::default())
        .unwrap_err();
    assert!(matches!(err.root(), Error::DtypeMismatch { .. }), "{err}");
    // well-formed actions still step
    let mut env = CountingEnv::new(5, &[2])?;
    let td = env
        .reset(None)?
        .with("action", Tensor::zeros([2, 1], (Kind::Float, Device::Cpu)))?;
    env.step(td)?;
    Ok(())
}

#[test]
fn read_action_is_public_for_custom_envs() -> R {
    let env = adder()?;
    let td =
        TensorDict::new([4])?.with("action", Tensor::ones([4, 1], (Kind::Float, Device::Cpu)))?;
    assert_eq!(read_action(&td, "action", env.specs())?.size(), [4, 1]);
    let bad =
        TensorDict::new([4])?.with("action", Tensor::ones([4, 2], (Kind::Float, Device::Cpu)))?;
    assert!(matches!(
        read_action(&bad, "action", env.specs()),
        Err(Error::ShapeMismatch { .. })
    ));
    // an unknown key is named
    let err = read_action(&td, "torque", env.specs()).unwrap_err();
    assert!(err.to_string().contains("torque"), "{err}");
    Ok(())
}

#[test]
fn wrong_device_is_refused_when_cuda_is_available() -> R {
    if !tch::Cuda::is_available() {
        return Ok(());
    }
    let mut env = CountingEnv::new(5, &[2])?;
    let td = env.reset(None)?.with(
        "action",
        Tensor::zeros([2, 1], (Kind::Float, Device::Cuda(0))),
    )?;
    assert!(matches!(env.step(td), Err(Error::DeviceMismatch { .. })));
    Ok(())
}
