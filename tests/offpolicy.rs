//! Off-policy building blocks through the public API: target networks and their updaters,
//! TD(0) / TD(1), exploration modules and the off-policy losses (hand-derived values; the
//! recorded TorchRL cases are replayed in `reference_offpolicy.rs`).

use tch::{nn, Device, Kind, Tensor};
use torchrl::objectives::value::{TD0Estimator, TD1Estimator, ValueEstimator};
use torchrl::objectives::{HardUpdate, SoftUpdate, TargetNetworks, WithTarget};
use torchrl::{Result, TensorDict};

const F: (Kind, Device) = (Kind::Float, Device::Cpu);

fn linear_with_target(vs: &nn::VarStore) -> Result<WithTarget<nn::Linear>> {
    WithTarget::new(&vs.root().sub("q"), true, |p: &nn::Path| {
        Ok(nn::linear(p, 3, 2, Default::default()))
    })
}

fn set_online(net: &WithTarget<nn::Linear>, v: f64) {
    tch::no_grad(|| {
        let _ = net.online().ws.shallow_clone().fill_(v);
        if let Some(b) = &net.online().bs {
            let _ = b.shallow_clone().fill_(v);
        }
    });
}

fn target_w(net: &WithTarget<nn::Linear>) -> Tensor {
    net.target()
        .map(|t| t.ws.copy())
        .unwrap_or_else(|| Tensor::zeros([1], F))
}

#[test]
fn with_target_starts_as_a_frozen_copy() -> Result<()> {
    let vs = nn::VarStore::new(Device::Cpu);
    let net = linear_with_target(&vs)?;
    let t = net
        .target()
        .map(|t| t.ws.shallow_clone())
        .expect("a target");
    assert!(t.equal(&net.online().ws));
    assert!(!t.requires_grad());
    assert!(net.online().ws.requires_grad());
    // online (2 tensors) paired by name with the target's
    let params = net.target_params().map(|p| p.len());
    assert_eq!(params, Some(2));
    // the caller's var store holds only the online network
    assert_eq!(vs.variables().len(), 2);
    Ok(())
}

#[test]
fn soft_update_after_n_steps() -> Result<()> {
    let vs = nn::VarStore::new(Device::Cpu);
    let net = linear_with_target(&vs)?;
    let w0 = target_w(&net);
    let mut up = SoftUpdate::new(&net, None, Some(0.25))?;
    assert!((up.eps() - 0.75).abs() < 1e-12);
    set_online(&net, 2.0);
    for _ in 0..3 {
        up.step()?;
    }
    // θ'_n = ε^n·θ'_0 + (1 - ε^n)·θ, θ = 2
    let e3 = 0.75f64.powi(3);
    let expected = w0.f_mul_scalar(e3)?.f_add_scalar((1.0 - e3) * 2.0)?;
    assert!(target_w(&net).allclose(&expected, 1e-6, 1e-6, false));
    Ok(())
}

#[test]
fn soft_update_rejects_bad_arguments() -> Result<()> {
    let vs = nn::VarStore::new(Device::Cpu);
    let net = linear_with_target(&vs)?;
    assert!(SoftUpdate::new(&net, None, None).is_err());
    assert!(SoftUpdate::new(&net, Some(0.9), Some(0.1)).is_err());
    assert!(SoftUpdate::new(&net, Some(1.5), None).is_err());
    let no_target = WithTarget::new(&vs.root().sub("v"), false, |p: &nn::Path| {
        Ok(nn::linear(p, 3, 2, Default::default()))
    })?;
    assert!(no_target.target_params().is_none());
    assert!(TargetNetworks::target_params(&no_target).is_empty());
    let err = SoftUpdate::new(&no_target, Some(0.9), None).unwrap_err();
    assert!(err.to_string().contains("target parameters"), "{err}");
    Ok(())
}

#[test]
fn hard_update_copies_on_the_interval_plus_one_th_step() -> Result<()> {
    let vs = nn::VarStore::new(Device::Cpu);
    let net = linear_with_target(&vs)?;
    let mut up = HardUpdate::new(&net, 2)?;
    let w0 = target_w(&net);
    set_online(&net, 5.0);
    up.step()?; // counter 0 -> 1
    up.step()?; // 1 -> 2
    assert!(target_w(&net).equal(&w0));
    assert_eq!(up.counter(), 2);
    up.step()?; // counter == interval: copy, reset
    assert_eq!(up.counter(), 0);
    assert!(target_w(&net).equal(&Tensor::full([2, 3], 5.0, F)));
    Ok(())
}

fn transitions() -> Result<TensorDict> {
    // 4 transitions: plain, truncated (done only), terminated, plain
    TensorDict::new([4])?
        .with(
            "state_value",
            Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0]).view([4, 1]),
        )?
        .with(
            ("next", "state_value"),
            Tensor::from_slice(&[2.0f32, 3.0, 4.0, 5.0]).view([4, 1]),
        )?
        .with(
            ("next", "reward"),
            Tensor::from_slice(&[1.0f32, -1.0, 0.5, 0.0]).view([4, 1]),
        )?
        .with(
            ("next", "done"),
            Tensor::from_slice(&[false, true, true, false]).view([4, 1]),
        )?
        .with(
            ("next", "terminated"),
            Tensor::from_slice(&[false, false, true, false]).view([4, 1]),
        )
}

#[test]
fn td0_targets_and_advantages() -> Result<()> {
    let mut td = transitions()?;
    let est = TD0Estimator::new(0.9)?;
    est.forward(&mut td)?;
    // r + 0.9·(1 - term)·V'
    let target = Vec::<f32>::try_from(td.get_or_err("value_target")?.view([-1]))?;
    let want = [1.0 + 0.9 * 2.0, -1.0 + 0.9 * 3.0, 0.5, 0.9 * 5.0];
    for (g, w) in target.iter().zip(want) {
        assert!((g - w).abs() < 1e-6, "{target:?}");
    }
    let adv = Vec::<f32>::try_from(td.get_or_err("advantage")?.view([-1]))?;
    for (i, (a, t)) in adv.iter().zip(&target).enumerate() {
        assert!((a - (t - (i as f32 + 1.0))).abs() < 1e-6);
    }
    // the value estimate alone needs no V(s_t)
    let td2 = transitions()?.exclude(&["state_value"]);
    let v = est.value_estimate(&td2)?;
    assert_eq!(Vec::<f32>::try_from(v.view([-1]))?, target);
    // steps_to_next_obs: γ^2 for the first transition
    let td3 = transitions()?.with(
        "steps_to_next_obs",
        Tensor::from_slice(&[2i64, 1, 1, 1]).view([4, 1]),
    )?;
    let v = est.value_estimate(&td3)?;
    assert!((v.double_value(&[0, 0]) - (1.0 + 0.81 * 2.0)).abs() < 1e-6);
    Ok(())
}

#[test]
fn td1_returns_stop_on_terminated_and_restart_on_done() -> Result<()> {
    // one trajectory [1, 4]: done at t=1 (truncated) and t=2 (terminated)
    let flat = transitions()?;
    let mut td = TensorDict::new([1, 4])?;
    for key in [
        vec!["state_value"],
        vec!["next", "state_value"],
        vec!["next", "reward"],
        vec!["next", "done"],
        vec!["next", "terminated"],
    ] {
        let t = flat.get_or_err(key.as_slice())?.f_unsqueeze(0)?;
        td.set(key.as_slice(), t)?;
    }
    TD1Estimator::new(0.5)?.forward(&mut td)?;
    let g = Vec::<f32>::try_from(td.get_or_err("value_target")?.view([-1]))?;
    // G_3 = 0 + 0.5·5 (end of data) = 2.5; G_2 = 0.5 (terminated); G_1 = -1 + 0.5·3 (truncated:
    // bootstrap from V'); G_0 = 1 + 0.5·G_1
    let g1 = -1.0 + 0.5 * 3.0;
    let want = [1.0 + 0.5 * g1, g1, 0.5, 2.5];
    for (a, b) in g.iter().zip(want) {
        assert!((a - b).abs() < 1e-6, "{g:?}");
    }
    // a flat batch has no time dim: TD(1) refuses it, TD(0) does not
    assert!(TD1Estimator::new(0.5)?
        .forward(&mut transitions()?)
        .is_err());
    Ok(())
}
