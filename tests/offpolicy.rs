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

// ------------------------------------------------------------------------------ modules

use torchrl::data::specs::{Bounded, Categorical, OneHot, TensorSpec};
use torchrl::modules::{
    set_exploration_type, ActionSpace, AdditiveGaussianModule, EGreedyModule, ExplorationType,
    OrnsteinUhlenbeckProcessModule, QValueActor, QValueModule, TanhModule, TdModule,
    TensorDictModule,
};
use torchrl::objectives::{
    DQNConfig, DQNLoss, LossModule, LossOutput, SACConfig, SACLoss, TargetEntropy, ValueEstimators,
};

const I: (Kind, Device) = (Kind::Int64, Device::Cpu);

#[test]
fn qvalue_module_one_hot_ties_mask_and_chosen_value() -> Result<()> {
    let av = Tensor::from_slice(&[1.0f32, 3.0, 3.0, 5.0, 0.0, -1.0]).view([2, 3]);
    let td = TensorDict::new([2])?.with("action_value", av.shallow_clone())?;
    let out = QValueModule::new(ActionSpace::OneHot).forward(td.clone())?;
    // every maximal entry is set (TorchRL's `value == max`), and the chosen value sums them
    assert_eq!(
        Vec::<i64>::try_from(out.get_or_err("action")?.view([-1]))?,
        vec![0, 1, 1, 1, 0, 0]
    );
    assert_eq!(
        Vec::<f32>::try_from(out.get_or_err("chosen_action_value")?.view([-1]))?,
        vec![6.0, 5.0]
    );
    // a mask forbids action 0 of the second row
    let mask = Tensor::from_slice(&[true, true, true, false, true, true]).view([2, 3]);
    let td = td.with("mask", mask)?;
    let out = QValueModule::new(ActionSpace::Categorical)
        .with_action_mask_key("mask")
        .forward(td)?;
    assert_eq!(Vec::<i64>::try_from(out.get_or_err("action")?)?, vec![1, 1]);
    assert_eq!(out.get_or_err("chosen_action_value")?.size(), vec![2, 1]);
    Ok(())
}

#[test]
fn qvalue_actor_needs_the_action_value_key() -> Result<()> {
    let vs = nn::VarStore::new(Device::Cpu);
    let net = TdModule::new(
        nn::linear(vs.root(), 3, 2, Default::default()),
        ["observation"],
        ["q"],
    )?;
    let err = QValueActor::new(net, ActionSpace::Categorical).unwrap_err();
    assert!(err.to_string().contains("action_value"), "{err}");
    let net = TdModule::new(
        nn::linear(vs.root() / "b", 3, 2, Default::default()),
        ["observation"],
        ["action_value"],
    )?;
    let actor = QValueActor::new(net, ActionSpace::Categorical)?;
    let td = TensorDict::new([5])?.with("observation", Tensor::randn([5, 3], F))?;
    let out = actor.forward(td)?;
    let greedy = out.get_or_err("action_value")?.argmax(-1, false);
    assert!(out.get_or_err("action")?.equal(&greedy));
    Ok(())
}

#[test]
fn egreedy_anneals_and_explores_only_under_random() -> Result<()> {
    let spec = TensorSpec::from(Categorical::new(4)?);
    let mut m = EGreedyModule::new(spec, 1.0, 0.1, 10)?.with_seed(3);
    m.step(5);
    // 1 - 5·(0.9 / 10)
    assert!((m.eps() - 0.55).abs() < 1e-6);
    m.step(100);
    assert!((m.eps() - 0.1).abs() < 1e-6);
    assert!(EGreedyModule::new(TensorSpec::from(Categorical::new(4)?), 0.1, 0.5, 10).is_err());

    let mut m =
        EGreedyModule::new(TensorSpec::from(Categorical::new(4)?), 0.5, 0.5, 10)?.with_seed(1);
    m.step(1);
    let n = 8000;
    let td = TensorDict::new([n])?.with("action", Tensor::zeros([n], I))?;
    let out = m.forward(td.clone())?;
    let a = out.get_or_err("action")?;
    // replaced with probability ε = 0.5 by a uniform draw of 4 actions: 3/8 change
    let changed = a
        .ne(0)
        .to_kind(Kind::Double)
        .mean(Kind::Double)
        .double_value(&[]);
    assert!((changed - 0.375).abs() < 0.03, "{changed}");
    assert!(a.ge(0).all().int64_value(&[]) == 1 && a.lt(4).all().int64_value(&[]) == 1);
    for e in [
        ExplorationType::Deterministic,
        ExplorationType::Mode,
        ExplorationType::Mean,
    ] {
        let out = set_exploration_type(e, || m.forward(td.clone()))?;
        assert!(out.get_or_err("action")?.eq(0).all().int64_value(&[]) == 1);
    }
    // one-hot actions stay one-hot
    let m = EGreedyModule::new(TensorSpec::from(OneHot::new(3)?), 1.0, 1.0, 1)?;
    let td = TensorDict::new([50])?.with(
        "action",
        Tensor::zeros([50, 3], I)
            .narrow(1, 0, 1)
            .ones_like()
            .pad([0, 2], "constant", None),
    )?;
    let a = m.forward(td)?.get_or_err("action")?.shallow_clone();
    assert!(
        a.sum_dim_intlist(-1, false, Kind::Int64)
            .eq(1)
            .all()
            .int64_value(&[])
            == 1
    );
    Ok(())
}

#[test]
fn additive_gaussian_scales_noise_by_sigma_and_projects() -> Result<()> {
    let spec = TensorSpec::from(Bounded::new(-1.0, 1.0, [1])?);
    let mut m = AdditiveGaussianModule::new(spec, 1.0, 0.1, 100)?.with_seed(0);
    m.step(50);
    assert!((m.sigma() - 0.55).abs() < 1e-6);
    let n = 20000;
    let td = TensorDict::new([n])?.with("action", Tensor::zeros([n, 1], F))?;
    let a = m.forward(td.clone())?.get_or_err("action")?.shallow_clone();
    // inside the bounds after the projection; the std of the clipped noise is below σ
    assert!(a.abs().le(1.0).all().int64_value(&[]) == 1);
    let small = a
        .abs()
        .lt(0.5)
        .to_kind(Kind::Double)
        .mean(Kind::Double)
        .double_value(&[]);
    // P(|N(0, 0.55)| < 0.5) = erf(0.5 / (0.55·√2)) ≈ 0.6367
    assert!((small - 0.6367).abs() < 0.02, "{small}");
    let eval = set_exploration_type(ExplorationType::Deterministic, || m.forward(td))?;
    assert!(eval.get_or_err("action")?.eq(0.0).all().int64_value(&[]) == 1);
    Ok(())
}

#[test]
fn ornstein_uhlenbeck_follows_the_recursion_and_resets_on_is_init() -> Result<()> {
    // σ = 0: the process is deterministic, n_{k+1} = n_k + θ(μ - n_k)dt
    let spec = TensorSpec::from(Bounded::new(-10.0, 10.0, [1])?);
    let m = OrnsteinUhlenbeckProcessModule::new(spec, 1.0, 0.1, 100)?
        .with_sigma(0.0)
        .with_mu(1.0)
        .with_theta(0.5)
        .with_dt(0.1);
    let td = TensorDict::new([2])?.with("action", Tensor::zeros([2, 1], F))?;
    let td = m.forward(td)?;
    let n1 = 0.5 * 1.0 * 0.1;
    assert!((td.get_or_err("action")?.double_value(&[0, 0]) - n1).abs() < 1e-6);
    let mut td = td.with("action", Tensor::zeros([2, 1], F))?;
    td.set("is_init", Tensor::from_slice(&[true, false]).view([2, 1]))?;
    let td = m.forward(td)?;
    let n2 = n1 + 0.5 * (1.0 - n1) * 0.1;
    let a = Vec::<f32>::try_from(td.get_or_err("action")?.view([-1]))?;
    assert!(
        (f64::from(a[0]) - n1).abs() < 1e-6,
        "element 0 restarted: {a:?}"
    );
    assert!(
        (f64::from(a[1]) - n2).abs() < 1e-6,
        "element 1 continued: {a:?}"
    );
    assert_eq!(
        Vec::<i64>::try_from(td.get_or_err("_ou_steps")?)?,
        vec![1, 2]
    );
    Ok(())
}

#[test]
fn tanh_module_maps_into_the_spec_bounds() -> Result<()> {
    let spec = TensorSpec::from(Bounded::new(0.0, 4.0, [2])?);
    let m = TanhModule::new(["param"], ["action"])?.with_spec(&spec)?;
    let x = Tensor::from_slice(&[0.0f32, 100.0, -100.0, 0.5]).view([2, 2]);
    let td = TensorDict::new([2])?.with("param", x)?;
    let a = Vec::<f32>::try_from(m.forward(td)?.get_or_err("action")?.view([-1]))?;
    let want = [2.0, 4.0, 0.0, 2.0 + 2.0 * 0.5f32.tanh()];
    for (g, w) in a.iter().zip(want) {
        assert!((g - w).abs() < 1e-5, "{a:?}");
    }
    assert!(TanhModule::new(["a"], ["b", "c"]).is_err());
    Ok(())
}

// ------------------------------------------------------------------------------- losses

fn q_builder(p: &nn::Path) -> Result<QValueActor> {
    let lin = nn::linear(p / "q", 3, 2, Default::default());
    QValueActor::new(
        TdModule::new(lin, ["obs"], ["action_value"])?,
        ActionSpace::Categorical,
    )
}

fn dqn_batch(action_key: &str) -> Result<TensorDict> {
    TensorDict::new([4])?
        .with("obs", Tensor::randn([4, 3], F))?
        .with(action_key, Tensor::from_slice(&[0i64, 1, 1, 0]))?
        .with(("next", "obs"), Tensor::randn([4, 3], F))?
        .with(("next", "r"), Tensor::ones([4, 1], F))?
        .with(
            ("next", "done"),
            Tensor::zeros([4, 1], (Kind::Bool, Device::Cpu)),
        )?
        .with(
            ("next", "terminated"),
            Tensor::zeros([4, 1], (Kind::Bool, Device::Cpu)),
        )
}

#[test]
fn dqn_set_keys_renames_inputs_and_reaches_the_estimator() -> Result<()> {
    let vs = nn::VarStore::new(Device::Cpu);
    let mut loss = DQNLoss::new(
        &vs.root(),
        q_builder,
        DQNConfig::new(ActionSpace::Categorical),
    )?;
    loss.set_keys(&[("reward", Some("r".into())), ("action", Some("act".into()))])?;
    assert!(loss
        .in_keys()
        .contains(&torchrl::NestedKey::from(("next", "r"))));
    assert!(loss.in_keys().contains(&torchrl::NestedKey::from("act")));
    assert_eq!(
        loss.value_estimator().tensor_keys().reward,
        torchrl::NestedKey::from("r")
    );
    assert_eq!(
        loss.value_estimator().tensor_keys().value,
        torchrl::NestedKey::from("chosen_action_value")
    );
    // the keys survive a new estimator
    loss.make_value_estimator(ValueEstimators::TD0, 0.5)?;
    assert_eq!(
        loss.value_estimator().tensor_keys().reward,
        torchrl::NestedKey::from("r")
    );
    let out = loss.forward(&dqn_batch("act")?)?;
    assert_eq!(out.loss_terms()[0].0, "loss");
    assert!(loss.set_keys(&[("foo", None)]).is_err());
    // double DQN needs a target network
    let err = DQNLoss::new(
        &vs.root().sub("x"),
        q_builder,
        DQNConfig::new(ActionSpace::Categorical)
            .with_double_dqn(true)
            .with_delay_value(false),
    )
    .unwrap_err();
    assert!(err.to_string().contains("delay_value"), "{err}");
    Ok(())
}

#[test]
fn sac_actor_loss_leaves_the_critics_alone() -> Result<()> {
    use torchrl::modules::{
        DistributionBuilder, NormalParamExtractor, ProbabilisticActor, TensorDictSequential,
    };
    let vs = nn::VarStore::new(Device::Cpu);
    let net = TensorDictSequential::new()
        .with(TdModule::new(
            nn::linear(vs.root() / "pi", 3, 2, Default::default()),
            ["observation"],
            ["param"],
        )?)
        .with(NormalParamExtractor::new());
    let actor = ProbabilisticActor::new(
        net,
        DistributionBuilder::tanh_normal("loc", "scale", -1.0, 1.0)?,
    );
    let critic = |p: &nn::Path| {
        TdModule::new(
            nn::linear(p / "q", 4, 1, Default::default()),
            ["observation", "action"],
            ["state_action_value"],
        )
    };
    // "auto" needs the action's size
    assert!(SACLoss::new(
        &vs.root().sub("bad"),
        ProbabilisticActor::new(
            TdModule::new(
                nn::linear(vs.root() / "pi2", 3, 2, Default::default()),
                ["observation"],
                ["loc"]
            )?,
            DistributionBuilder::tanh_normal("loc", "loc", -1.0, 1.0)?
        ),
        critic,
        SACConfig::new()
    )
    .is_err());
    let loss = SACLoss::new(
        &vs.root(),
        actor,
        critic,
        SACConfig::new().with_target_entropy(TargetEntropy::Value(-0.5)),
    )?;
    assert_eq!(loss.target_entropy(), -0.5);
    let td = TensorDict::new([5])?
        .with("observation", Tensor::randn([5, 3], F))?
        .with("action", Tensor::rand([5, 1], F))?
        .with(("next", "observation"), Tensor::randn([5, 3], F))?
        .with(("next", "reward"), Tensor::ones([5, 1], F))?
        .with(
            ("next", "done"),
            Tensor::zeros([5, 1], (Kind::Bool, Device::Cpu)),
        )?
        .with(
            ("next", "terminated"),
            Tensor::zeros([5, 1], (Kind::Bool, Device::Cpu)),
        )?;
    let out = loss.forward(&td)?;
    out.loss_actor.backward();
    let vars = vs.variables();
    let grad_norm = |name: &str| {
        let g = vars[name].grad();
        if g.defined() {
            g.abs().sum(Kind::Double).double_value(&[])
        } else {
            0.0
        }
    };
    assert!(grad_norm("pi.weight") > 0.0);
    assert_eq!(grad_norm("qvalue.0.q.weight"), 0.0);
    assert_eq!(grad_norm("qvalue.1.q.weight"), 0.0);
    assert!(
        vars["qvalue.0.q.weight"].requires_grad(),
        "restored after the actor loss"
    );
    // the critics' loss does reach them
    out.loss_qvalue.backward();
    assert!(grad_norm("qvalue.0.q.weight") > 0.0);
    Ok(())
}

#[test]
fn losses_are_send_and_old_estimator_names_still_work() -> Result<()> {
    fn assert_send<T: Send>() {}
    assert_send::<DQNLoss>();
    assert_send::<SACLoss>();
    assert_send::<torchrl::objectives::DiscreteSACLoss>();
    assert_send::<torchrl::objectives::TD3Loss>();
    assert_send::<torchrl::objectives::DDPGLoss>();
    // a trainer can hold them type-erased
    let vs = nn::VarStore::new(Device::Cpu);
    let loss = DQNLoss::new(
        &vs.root(),
        q_builder,
        DQNConfig::new(ActionSpace::Categorical),
    )?;
    let boxed: Box<dyn torchrl::objectives::DynLossModule> = Box::new(loss);
    assert_eq!(boxed.loss_name(), "DQNLoss");
    // the former spellings are deprecated aliases of the TorchRL ones
    #[allow(deprecated)]
    {
        let g: torchrl::objectives::value::Gae = torchrl::objectives::value::GAE::new(0.9, 0.8)?;
        assert_eq!(g.lmbda(), 0.8);
        let t: torchrl::objectives::value::TdLambdaEstimator =
            torchrl::objectives::value::TDLambdaEstimator::new(0.9, 0.8)?;
        assert_eq!(t.gamma(), 0.9);
    }
    Ok(())
}
