//! What a TorchRL user expects of the collector (issue 26, item 2): it explores
//! (`ExplorationType::Random`) by default, the type is settable, it is called `Collector`
//! (the old name a deprecated alias), and it writes `("collector", "traj_ids")` as TorchRL's.

use tch::{Device, Kind, Tensor};
use torchrl::collectors::Collector;
use torchrl::envs::builtin::{CountingEnv, PendulumEnv};
use torchrl::modules::{
    exploration_type, from_fn, set_exploration_type, DistributionBuilder, ExplorationType,
    ProbabilisticActor, TensorDictModule,
};
use torchrl::TensorDict;

type R = torchrl::Result<()>;

/// A Normal(0.25, 1) actor with TorchRL's default (deterministic) exploration type.
fn normal_actor() -> torchrl::Result<ProbabilisticActor> {
    let net = from_fn(["observation"], ["loc", "scale"], |x: &[&Tensor]| {
        let zero = x[0]
            .f_sum_dim_intlist(-1, true, Kind::Float)?
            .f_mul_scalar(0.0)?;
        Ok(vec![zero.f_add_scalar(0.25)?, zero.f_add_scalar(1.0)?])
    })?;
    Ok(ProbabilisticActor::new(net, DistributionBuilder::normal("loc", "scale")?).with_seed(3))
}

fn floats(t: &Tensor) -> Vec<f64> {
    Vec::<f64>::try_from(t.to_kind(Kind::Double).reshape([-1])).unwrap()
}

fn ints(t: &Tensor) -> Vec<i64> {
    Vec::<i64>::try_from(t.reshape([-1])).unwrap()
}

#[test]
fn collector_explores_by_default() -> R {
    let actor = normal_actor()?.with_return_log_prob(true);
    assert_eq!(actor.exploration_type(), ExplorationType::Deterministic);
    let env = PendulumEnv::new(&[2], Device::Cpu)?;
    let mut c = Collector::new(env, actor.as_policy(), 20, Some(20))?;
    assert_eq!(c.exploration_type(), ExplorationType::Random);
    let batch = c.next().unwrap()?;
    let a = floats(batch.get_or_err("action")?);
    // samples, not the mean 0.25
    assert!(
        a.iter().filter(|v| (*v - 0.25).abs() > 1e-3).count() >= 15,
        "{a:?}"
    );
    // the log-prob belongs to the sampled action
    let lp = batch.get_or_err("action_log_prob")?;
    let want = actor.log_prob(&batch)?;
    assert!(lp.allclose(&want, 1e-5, 1e-6, false));
    // the thread's exploration type is restored after collecting
    assert_eq!(exploration_type(), None);
    Ok(())
}

#[test]
fn collector_exploration_type_is_settable() -> R {
    let actor = normal_actor()?.with_exploration_type(ExplorationType::Random);
    let env = PendulumEnv::new(&[2], Device::Cpu)?;
    let mut c = Collector::new(env, actor.as_policy(), 8, Some(8))?
        .with_exploration_type(ExplorationType::Deterministic);
    assert_eq!(c.exploration_type(), ExplorationType::Deterministic);
    let batch = c.next().unwrap()?;
    // the collector's type wins over the actor's own (TorchRL's set_exploration_type)
    assert!(floats(batch.get_or_err("action")?)
        .iter()
        .all(|v| (v - 0.25).abs() < 1e-6));
    Ok(())
}

#[test]
fn set_exploration_type_overrides_the_actor_and_restores() -> R {
    let actor = normal_actor()?;
    let td = TensorDict::new([4])?.with(
        "observation",
        Tensor::zeros([4, 3], (Kind::Float, Device::Cpu)),
    )?;
    let det = floats(actor.forward(td.clone())?.get_or_err("action")?);
    assert!(det.iter().all(|v| (v - 0.25).abs() < 1e-6));
    let sampled = set_exploration_type(ExplorationType::Random, || actor.forward(td.clone()))?;
    assert!(floats(sampled.get_or_err("action")?)
        .iter()
        .any(|v| (v - 0.25).abs() > 1e-3));
    assert_eq!(exploration_type(), None);
    Ok(())
}

#[test]
#[allow(deprecated)]
fn sync_data_collector_is_a_deprecated_alias() -> R {
    use torchrl::collectors::SyncDataCollector;
    let env = CountingEnv::new(5, &[])?;
    let policy = |mut td: TensorDict| {
        td.set("action", Tensor::zeros([1], (Kind::Float, Device::Cpu)))?;
        Ok(td)
    };
    let c: SyncDataCollector<'_, CountingEnv> = Collector::new(env, policy, 4, Some(4))?;
    assert_eq!(c.collect::<torchrl::Result<Vec<_>>>()?.len(), 1);
    Ok(())
}

/// TorchRL's numbering: envs start with `0..n`; an env whose step is done takes the next
/// unused id from its next step on; a running episode keeps its id across batches.
#[test]
fn traj_ids_follow_torchrl() -> R {
    // episodes of 3 steps on 2 envs, 4 steps per batch
    let env = CountingEnv::new(3, &[2])?;
    let policy = |mut td: TensorDict| {
        td.set("action", Tensor::zeros([2, 1], (Kind::Float, Device::Cpu)))?;
        Ok(td)
    };
    let mut c = Collector::new(env, policy, 8, Some(16))?;
    let b1 = c.next().unwrap()?;
    let b2 = c.next().unwrap()?;
    let ids1 = b1.get_or_err(("collector", "traj_ids"))?;
    assert_eq!(ids1.kind(), Kind::Int64);
    assert_eq!(ids1.size(), [2, 4]);
    // env 0: steps 0..2 are trajectory 0, step 3 starts a new one (id 2: env 1 ended at the
    // same step and takes id 3, in batch order)
    assert_eq!(ints(&ids1.get(0)), [0, 0, 0, 2]);
    assert_eq!(ints(&ids1.get(1)), [1, 1, 1, 3]);
    let ids2 = b2.get_or_err(("collector", "traj_ids"))?;
    assert_eq!(ints(&ids2.get(0)), [2, 2, 4, 4]);
    assert_eq!(ints(&ids2.get(1)), [3, 3, 5, 5]);
    // a reset starts new trajectories with ids never used before
    c.reset()?;
    let b3 = c.rollout()?;
    let ids3 = b3.get_or_err(("collector", "traj_ids"))?;
    assert_eq!(ints(&ids3.get(0))[0], 6);
    assert_eq!(ints(&ids3.get(1))[0], 7);
    Ok(())
}
