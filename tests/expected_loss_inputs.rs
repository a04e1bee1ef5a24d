//! Loss and estimator inputs are validated (issue 26, item 5): shapes against the batch, GAE
//! refuses a batch without a time dim, a missing log-prob hints at `with_return_log_prob`, an
//! opt-in finite check in the PPO losses, and a NaN report in `check_env_specs`.

use tch::{Device, Kind, Tensor};
use torchrl::envs::{check_env_specs, EnvBase, EnvCore, EnvSpecs};
use torchrl::modules::{from_fn, DistributionBuilder, ProbabilisticActor};
use torchrl::objectives::value::{TDLambdaEstimator, ValueEstimator, GAE};
use torchrl::objectives::{ClipPPOLoss, KLPENPPOLoss, LossModule, LossOutput};
use torchrl::specs::{Bounded, Unbounded};
use torchrl::{Error, TensorDict};

type R = torchrl::Result<()>;
const F: (Kind, Device) = (Kind::Double, Device::Cpu);

/// A Gaussian policy over scalar actions: `[*B]` actions and log-probs, so the log-weight is
/// `[*B, 1]` (as with a TanhNormal, whose log-prob sums over the action dim).
fn actor() -> torchrl::Result<ProbabilisticActor> {
    let net = from_fn(["observation"], ["loc", "scale"], |x: &[&Tensor]| {
        let loc = x[0].f_squeeze_dim(-1)?.f_mul_scalar(0.5)?;
        Ok(vec![loc.f_ones_like()?.f_mul(&loc)?, loc.f_ones_like()?])
    })?;
    Ok(ProbabilisticActor::new(
        net,
        DistributionBuilder::normal("loc", "scale")?,
    ))
}

fn critic() -> torchrl::Result<impl torchrl::modules::TensorDictModule> {
    from_fn(["observation"], ["state_value"], |x: &[&Tensor]| {
        Ok(vec![x[0].f_mul_scalar(2.0)?])
    })
}

/// A well-formed PPO minibatch of `n` transitions (advantage and value target included).
fn minibatch(n: i64) -> torchrl::Result<TensorDict> {
    let obs = Tensor::f_randn([n, 1], F)?;
    let action = Tensor::f_randn([n], F)?;
    let td = TensorDict::new([n])?
        .with("observation", obs)?
        .with("action", action)?;
    let lp = actor()?.log_prob(&td)?.detach();
    td.with("action_log_prob", lp)?
        .with("advantage", Tensor::f_randn([n, 1], F)?)?
        .with("value_target", Tensor::f_randn([n, 1], F)?)
}

#[test]
fn well_formed_minibatch_passes() -> R {
    let loss = ClipPPOLoss::new(actor()?, critic()?).with_check_finite(true);
    let out = loss.forward(&minibatch(80)?)?;
    assert!(out.total_loss()?.double_value(&[]).is_finite());
    Ok(())
}

#[test]
fn advantage_80x3_for_batch_80_is_refused() -> R {
    let loss = ClipPPOLoss::new(actor()?, critic()?);
    let td = minibatch(80)?.with("advantage", Tensor::f_randn([80, 3], F)?)?;
    let err = loss.forward(&td).unwrap_err();
    match &err {
        Error::ShapeMismatch {
            key,
            expected,
            actual,
            ..
        } => {
            assert!(key.contains("advantage"), "{err}");
            assert_eq!(expected, &[80, 1]);
            assert_eq!(actual, &[80, 3]);
        }
        other => panic!("expected a shape mismatch on the advantage, got {other}"),
    }
    // the KL-penalty loss shares the check
    let kl = KLPENPPOLoss::new(actor()?, critic()?);
    let td = actor()?.get_dist_params(td)?; // the behaviour policy's loc / scale
    let err = kl.forward(&td).unwrap_err();
    assert!(matches!(err, Error::ShapeMismatch { .. }), "{err}");
    Ok(())
}

#[test]
fn value_target_and_log_prob_shapes_are_checked() -> R {
    let loss = ClipPPOLoss::new(actor()?, critic()?);
    let td = minibatch(80)?.with("value_target", Tensor::f_randn([80], F)?)?;
    let err = loss.forward(&td).unwrap_err();
    assert!(
        matches!(&err, Error::ShapeMismatch { key, .. } if key.contains("value_target")),
        "{err}"
    );
    let td = minibatch(80)?;
    let lp = td.get_or_err("action_log_prob")?.f_unsqueeze(-1)?;
    let td = td.with("action_log_prob", lp)?;
    let err = loss.forward(&td).unwrap_err();
    assert!(
        matches!(&err, Error::ShapeMismatch { key, .. } if key.contains("action_log_prob")),
        "{err}"
    );
    Ok(())
}

#[test]
fn missing_log_prob_hints_at_return_log_prob() -> R {
    let loss = ClipPPOLoss::new(actor()?, critic()?);
    let td = minibatch(8)?.exclude(&["action_log_prob"]);
    let err = loss.forward(&td).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("with_return_log_prob(true)"), "{msg}");
    assert!(matches!(err.root(), Error::KeyNotFound { .. }), "{msg}");
    Ok(())
}

#[test]
fn check_finite_names_the_non_finite_input() -> R {
    let adv = Tensor::f_randn([80, 1], F)?;
    let _ = adv.get(3).fill_(f64::NAN);
    let td = minibatch(80)?.with("advantage", adv)?;
    // off by default: the NaN reaches the loss
    let plain = ClipPPOLoss::new(actor()?, critic()?);
    assert!(plain
        .forward(&td)?
        .loss_objective
        .double_value(&[])
        .is_nan());
    let checked = ClipPPOLoss::new(actor()?, critic()?).with_check_finite(true);
    assert!(checked.config().check_finite);
    let err = checked.forward(&td).unwrap_err();
    let msg = err.to_string();
    assert!(
        matches!(&err, Error::InvalidValue { key, .. } if key.contains("advantage")),
        "{msg}"
    );
    assert!(msg.contains("1 NaN"), "{msg}");
    // an infinite value target
    let vt = Tensor::f_randn([80, 1], F)?;
    let _ = vt.get(0).fill_(f64::INFINITY);
    let td = minibatch(80)?.with("value_target", vt)?;
    let err = checked.forward(&td).unwrap_err();
    assert!(
        matches!(&err, Error::InvalidValue { key, .. } if key.contains("value_target")),
        "{err}"
    );
    Ok(())
}

/// A `[B, T]` batch with "next", no advantage: the loss computes it with GAE.
fn trajectories(b: i64, t: i64) -> torchrl::Result<TensorDict> {
    let obs = Tensor::f_randn([b, t, 1], F)?;
    let action = Tensor::f_randn([b, t], F)?;
    let next = TensorDict::new([b, t])?
        .with("observation", Tensor::f_randn([b, t, 1], F)?)?
        .with("reward", Tensor::f_ones([b, t, 1], F)?)?
        .with(
            "done",
            Tensor::f_zeros([b, t, 1], (Kind::Bool, Device::Cpu))?,
        )?
        .with(
            "terminated",
            Tensor::f_zeros([b, t, 1], (Kind::Bool, Device::Cpu))?,
        )?;
    let td = TensorDict::new([b, t])?
        .with("observation", obs)?
        .with("action", action)?
        .with("next", next)?;
    let lp = actor()?.log_prob(&td)?.detach();
    td.with("action_log_prob", lp)
}

#[test]
fn check_finite_catches_a_nan_reward_before_gae() -> R {
    let mut td = trajectories(2, 5)?;
    let r = Tensor::f_ones([2, 5, 1], F)?;
    let _ = r.get(1).get(2).fill_(f64::NAN);
    td.set(("next", "reward"), r)?;
    let checked = ClipPPOLoss::new(actor()?, critic()?).with_check_finite(true);
    let err = checked.forward(&td).unwrap_err();
    assert!(err.to_string().contains("reward"), "{err}");
    // without the check it ends in a NaN loss, as before
    let plain = ClipPPOLoss::new(actor()?, critic()?);
    assert!(plain.forward(&td)?.total_loss()?.double_value(&[]).is_nan());
    Ok(())
}

fn values(td: TensorDict) -> torchrl::Result<TensorDict> {
    let n = td.batch_size().to_vec();
    let shape: Vec<i64> = [n.as_slice(), &[1]].concat();
    td.with("state_value", Tensor::f_zeros(&shape, F)?)?
        .with(("next", "state_value"), Tensor::f_zeros(&shape, F)?)
}

#[test]
fn gae_refuses_a_flat_batch_without_an_explicit_time_dim() -> R {
    let flat = values(trajectories(1, 80)?.reshape([80])?)?;
    for est in [
        Box::new(GAE::new(0.99, 0.95)?) as Box<dyn ValueEstimator>,
        Box::new(TDLambdaEstimator::new(0.99, 0.95)?),
    ] {
        let mut td = flat.clone();
        let err = est.forward(&mut td).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("with_time_dim(0)"), "{msg}");
        assert!(msg.contains("[80]"), "{msg}");
        assert!(!td.contains("advantage"));
    }
    // opting in: one trajectory of 80 steps
    let mut td = flat.clone();
    GAE::new(0.99, 0.95)?.with_time_dim(0).forward(&mut td)?;
    assert_eq!(td.get_or_err("advantage")?.size(), [80, 1]);
    // [B, T] needs nothing
    let mut td = values(trajectories(4, 20)?)?;
    GAE::new(0.99, 0.95)?.forward(&mut td)?;
    assert_eq!(td.get_or_err("advantage")?.size(), [4, 20, 1]);
    Ok(())
}

#[test]
fn ppo_on_a_flat_minibatch_without_advantage_is_refused() -> R {
    let loss = ClipPPOLoss::new(actor()?, critic()?);
    let td = trajectories(1, 80)?.reshape([80])?;
    let err = loss.forward(&td).unwrap_err();
    assert!(err.to_string().contains("compute_advantage"), "{err}");
    // computing it on the [B, T] batch first works
    let mut batch = trajectories(4, 20)?;
    loss.compute_advantage(&mut batch)?;
    let mb = batch.reshape([80])?;
    loss.forward(&mb)?;
    Ok(())
}

/// An env whose reward is NaN at its second step.
struct NanReward {
    core: EnvCore,
    t: i64,
}

impl EnvBase for NanReward {
    fn core(&self) -> &EnvCore {
        &self.core
    }
    fn core_mut(&mut self) -> &mut EnvCore {
        &mut self.core
    }
    fn reset_impl(&mut self, _td: Option<&TensorDict>) -> torchrl::Result<TensorDict> {
        self.t = 0;
        TensorDict::new([])?.with("observation", Tensor::from_slice(&[0.0f32]))
    }
    fn step_impl(&mut self, _td: &TensorDict) -> torchrl::Result<TensorDict> {
        self.t += 1;
        let r = if self.t == 2 { f32::NAN } else { 1.0 };
        TensorDict::new([])?
            .with("observation", Tensor::from_slice(&[self.t as f32]))?
            .with("reward", Tensor::from_slice(&[r]))?
            .with("done", Tensor::from_slice(&[false]))
    }
}

#[test]
fn check_env_specs_reports_nan_rewards() -> R {
    let specs = EnvSpecs::new([])?
        .with_observation("observation", Unbounded::new().with_shape([1])?)?
        .with_action("action", Bounded::new(-1.0, 1.0, [1])?)?
        .with_reward("reward", Unbounded::new().with_shape([1])?)?;
    let mut env = NanReward {
        core: EnvCore::new(specs)?,
        t: 0,
    };
    let err = check_env_specs(&mut env, Some(0)).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("reward") && msg.contains("NaN"), "{msg}");
    Ok(())
}
