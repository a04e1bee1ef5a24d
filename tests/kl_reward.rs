//! KLRewardTransform (TorchRL's classic, actor-based transform): specs, KL values, errors, and
//! the independence of the frozen reference copy.

use tch::nn::{self, OptimizerConfig};
use tch::{Device, Kind, Tensor};
use torchrl::envs::builtin::PendulumEnv;
use torchrl::envs::transforms::{
    KLRewardTransform, RewardScaling, TensorDictPrimer, Transform, TransformedEnv,
};
use torchrl::envs::{check_env_specs, EnvBase, EnvSpecs, RolloutConfig};
use torchrl::modules::actors::{
    DistributionBuilder, ExplorationType, NormalParamExtractor, ProbabilisticActor,
};
use torchrl::modules::models::{MlpConfig, MLP};
use torchrl::modules::module::{TdModule, TensorDictModule};
use torchrl::modules::sequential::TensorDictSequential;
use torchrl::specs::Unbounded;
use torchrl::{NestedKey, TensorDict};

const B: i64 = 4;

fn make_actor(p: &nn::Path) -> torchrl::Result<ProbabilisticActor> {
    let mlp = MLP::new(p, &MlpConfig::new(3, 2).with_depth(1).with_num_cells(16))?;
    let net = TensorDictSequential::new()
        .with(TdModule::new(mlp, ["observation"], ["param"])?)
        .with(NormalParamExtractor::new());
    let dist = DistributionBuilder::tanh_normal("loc", "scale", -2.0, 2.0)?;
    Ok(ProbabilisticActor::new(net, dist)
        .with_return_log_prob(true)
        .with_exploration_type(ExplorationType::Random)
        .with_seed(0))
}

fn actor() -> (nn::VarStore, ProbabilisticActor) {
    let vs = nn::VarStore::new(Device::Cpu);
    let a = make_actor(&vs.root()).unwrap();
    (vs, a)
}

fn primer() -> TensorDictPrimer {
    TensorDictPrimer::new()
        .with_primer("action_log_prob", Unbounded::new().with_shape([]).unwrap())
        .with_expand_specs(true)
}

fn env_with(kl: KLRewardTransform) -> TransformedEnv<PendulumEnv> {
    TransformedEnv::new(PendulumEnv::new(&[B], Device::Cpu).unwrap())
        .unwrap()
        .with(primer())
        .unwrap()
        .with(kl)
        .unwrap()
}

fn perturb(vs: &nn::VarStore) {
    tch::no_grad(|| {
        for (_, mut v) in vs.variables() {
            let _ = v.f_add_scalar_(1.0).unwrap();
        }
    });
}

fn max_abs_diff(a: &Tensor, b: &Tensor) -> f64 {
    (a - b).abs().max().double_value(&[])
}

#[test]
fn check_env_specs_passes_for_reward_and_other_out_keys() {
    for out in [None, Some("some_stuff")] {
        let (vs, _a) = actor();
        let mut kl = KLRewardTransform::new(&vs, make_actor).unwrap();
        if let Some(o) = out {
            kl = kl.with_out_keys([o]).unwrap();
        }
        let base_before: EnvSpecs = PendulumEnv::new(&[B], Device::Cpu).unwrap().specs().clone();
        let mut env = env_with(kl);
        check_env_specs(&mut env, Some(0)).unwrap_or_else(|e| panic!("out={out:?}: {e}"));
        // The transform never alters its base env's specs.
        assert!(
            env.base().specs() == &base_before,
            "out={out:?}: base specs changed"
        );
        match out {
            None => {
                let leaf = env.specs().reward.get("reward").unwrap();
                assert_eq!(leaf.class_name(), "Unbounded");
                assert_eq!(leaf.shape(), &[B, 1]);
            }
            Some(o) => {
                let leaf = env.specs().observation.get(o).unwrap();
                assert_eq!(leaf.shape(), &[B, 1]);
                // the reward spec itself is unchanged
                assert!(env.specs().reward.get("reward").is_some());
                assert!(env.specs().reward.get(o).is_none());
            }
        }
        // the transform found the action key
        let t = env.transform().get_as::<KLRewardTransform>(1).unwrap();
        assert_eq!(t.action_key(), Some(&NestedKey::from("action")));
        assert_eq!(t.log_prob_key(), &NestedKey::from("action_log_prob"));
    }
}

#[test]
fn unchanged_actor_gives_zero_kl_then_perturbed_actor_matches_hand_computation() {
    let coef = 0.5;
    let (vs, a) = actor();
    // a hand-made reference with the original weights
    let mut ref_vs = nn::VarStore::new(Device::Cpu);
    let reference = make_actor(&ref_vs.root()).unwrap();
    ref_vs.copy(&vs).unwrap();

    let kl = KLRewardTransform::new(&vs, make_actor)
        .unwrap()
        .with_coef(coef)
        .unwrap()
        .with_out_keys(["reward_kl"])
        .unwrap();
    let mut env = TransformedEnv::new(PendulumEnv::new(&[B], Device::Cpu).unwrap())
        .unwrap()
        .with(RewardScaling::new(0.0, 1.0).unwrap())
        .unwrap()
        .with(kl)
        .unwrap();
    env.set_seed(0).unwrap();
    let cfg = RolloutConfig::default();

    let mut policy = a.as_policy();
    let traj = env.rollout(5, Some(&mut policy), &cfg).unwrap();
    let r = traj.get_or_err(("next", "reward")).unwrap();
    let r_kl = traj.get_or_err(("next", "reward_kl")).unwrap();
    assert_eq!(r.size(), vec![B, 5, 1]);
    assert!(
        max_abs_diff(r, r_kl) < 1e-4,
        "unchanged actor: kl must be 0"
    );

    perturb(&vs);
    let traj = env.rollout(5, Some(&mut policy), &cfg).unwrap();
    let r = traj.get_or_err(("next", "reward")).unwrap();
    let r_kl = traj.get_or_err(("next", "reward_kl")).unwrap();
    assert_eq!(
        r.ne_tensor(r_kl).all().int64_value(&[]),
        1,
        "changed everywhere"
    );

    let _g = tch::no_grad_guard();
    let action = traj.get_or_err("action").unwrap();
    let curr = traj.get_or_err("action_log_prob").unwrap();
    let lp_ref = reference.get_dist(&traj).unwrap().log_prob(action).unwrap();
    let expected = r - (curr - lp_ref).unsqueeze(-1) * coef;
    assert!(max_abs_diff(r_kl, &expected) < 1e-4);
}

#[test]
fn forward_on_offline_data_and_shape_checks() {
    let (vs, a) = actor();
    let mut kl = KLRewardTransform::new(&vs, make_actor)
        .unwrap()
        .with_action_key("action");
    perturb(&vs);
    let obs = Tensor::randn([B, 3], (Kind::Float, Device::Cpu));
    let mut td = TensorDict::new([B]).unwrap();
    td.set("observation", obs).unwrap();
    let td = tch::no_grad(|| a.forward(td)).unwrap();
    let mut next = TensorDict::new([B]).unwrap();
    next.set("reward", Tensor::zeros([B, 1], (Kind::Float, Device::Cpu)))
        .unwrap();
    let mut full = td.clone();
    full.set("next", next).unwrap();
    let out = kl.forward(full).unwrap();
    let r = out.get_or_err(("next", "reward")).unwrap();
    assert_eq!(r.size(), vec![B, 1]);
    let mut ref_vs = nn::VarStore::new(Device::Cpu);
    let reference = make_actor(&ref_vs.root()).unwrap();
    ref_vs.copy(kl.reference_varstore()).unwrap();
    let lp_ref = tch::no_grad(|| {
        reference
            .get_dist(&td)
            .unwrap()
            .log_prob(td.get_or_err("action").unwrap())
            .unwrap()
    });
    let expected = -(td.get_or_err("action_log_prob").unwrap() - lp_ref).unsqueeze(-1);
    assert!(max_abs_diff(r, &expected) < 1e-4);
    assert_eq!(r.ne(0.0).all().int64_value(&[]), 1);

    // reward ndim mismatch: reward [B] vs kl [B, 1]
    let mut next = TensorDict::new([B]).unwrap();
    next.set("reward", Tensor::zeros([B], (Kind::Float, Device::Cpu)))
        .unwrap();
    let mut bad = td.clone();
    bad.set("next", next).unwrap();
    let e = kl.forward(bad).unwrap_err().to_string();
    assert!(e.contains("reward") && e.contains("action_log_prob"), "{e}");

    // missing action
    let mut next = TensorDict::new([B]).unwrap();
    next.set("reward", Tensor::zeros([B, 1], (Kind::Float, Device::Cpu)))
        .unwrap();
    let mut no_action = td.clone();
    no_action.remove("action");
    no_action.set("next", next).unwrap();
    let e = kl.forward(no_action).unwrap_err().to_string();
    assert!(e.contains("action"), "{e}");
}

#[test]
fn key_errors_name_the_keys() {
    let (vs, _a) = actor();
    let e = KLRewardTransform::new(&vs, make_actor)
        .unwrap()
        .with_in_keys(["reward", "other_reward"])
        .unwrap_err()
        .to_string();
    assert!(e.contains("reward") && e.contains("other_reward"), "{e}");
    let e = KLRewardTransform::new(&vs, make_actor)
        .unwrap()
        .with_out_keys(["a", "b"])
        .unwrap_err()
        .to_string();
    assert!(e.contains("a") && e.contains("b"), "{e}");

    // no action key without an env
    let mut kl = KLRewardTransform::new(&vs, make_actor).unwrap();
    let e = kl
        .forward(TensorDict::new([]).unwrap())
        .unwrap_err()
        .to_string();
    assert!(e.contains("action key"), "{e}");

    // ambiguous / missing action keys in the parent
    let two = EnvSpecs::new([])
        .unwrap()
        .with_action("a1", Unbounded::new())
        .unwrap()
        .with_action("a2", Unbounded::new())
        .unwrap()
        .with_reward("reward", Unbounded::new())
        .unwrap();
    let e = kl.attach(&two).unwrap_err().to_string();
    assert!(e.contains("a1") && e.contains("a2"), "{e}");
    let none = EnvSpecs::new([])
        .unwrap()
        .with_reward("reward", Unbounded::new())
        .unwrap();
    let e = kl.attach(&none).unwrap_err().to_string();
    assert!(e.contains("action"), "{e}");
    // an explicit action key skips the discovery
    let mut kl = KLRewardTransform::new(&vs, make_actor)
        .unwrap()
        .with_action_key("a2");
    kl.attach(&two).unwrap();
    assert_eq!(kl.action_key(), Some(&NestedKey::from("a2")));

    // a reference that does not match the actor's variables
    let e = KLRewardTransform::new(&vs, |p: &nn::Path| {
        let _ = p.var("extra", &[1], nn::Init::Const(0.0));
        make_actor(p)
    })
    .unwrap_err()
    .to_string();
    assert!(e.contains("extra"), "{e}");
}

#[test]
fn frozen_copy_does_not_follow_training() {
    let (vs, a) = actor();
    let kl = KLRewardTransform::new(&vs, make_actor).unwrap();
    let snapshot = |s: &nn::VarStore| {
        let mut v: Vec<(String, Tensor)> = s
            .variables()
            .into_iter()
            .map(|(k, t)| (k, t.detach().copy()))
            .collect();
        v.sort_by(|x, y| x.0.cmp(&y.0));
        v
    };
    let ref_before = snapshot(kl.reference_varstore());
    let act_before = snapshot(&vs);
    for ((_, r), (_, x)) in ref_before.iter().zip(&act_before) {
        assert!(max_abs_diff(r, x) == 0.0);
    }
    for (_, t) in kl.reference_varstore().variables() {
        assert!(!t.requires_grad());
    }

    let mut opt = nn::Adam::default().build(&vs, 1e-2).unwrap();
    let mut td = TensorDict::new([B]).unwrap();
    td.set(
        "observation",
        Tensor::randn([B, 3], (Kind::Float, Device::Cpu)),
    )
    .unwrap();
    let td = tch::no_grad(|| a.forward(td)).unwrap();
    for _ in 0..3 {
        let loss = -a.log_prob(&td).unwrap().mean(None::<Kind>);
        opt.backward_step(&loss);
    }
    let changed = snapshot(&vs)
        .iter()
        .zip(&act_before)
        .any(|((_, n), (_, o))| max_abs_diff(n, o) > 0.0);
    assert!(changed, "the actor trained");
    for ((k, r), (_, now)) in ref_before.iter().zip(&snapshot(kl.reference_varstore())) {
        assert!(max_abs_diff(r, now) == 0.0, "reference {k} moved");
    }

    let kl = KLRewardTransform::new(&vs, make_actor)
        .unwrap()
        .with_requires_grad(true);
    assert!(kl.requires_grad());
    for (_, t) in kl.reference_varstore().variables() {
        assert!(t.requires_grad());
    }
}

/// The reference can be any `ProbabilisticTensorDictModule`: here an `ActorValueOperator`
/// (trunk → policy head, value head) on a `VarStore`. Unchanged weights give a zero KL; after
/// the actor moves, the reward becomes `-(log π(a) - log π_ref(a))`, with the reference's
/// log-probability computed through its own trunk.
#[test]
fn an_actor_value_operator_is_a_reference_policy() {
    use torchrl::modules::{ActorValueOperator, ProbabilisticTensorDictModule};
    fn make_op(p: &nn::Path) -> torchrl::Result<ActorValueOperator> {
        let cfg = |i, o| MlpConfig::new(i, o).with_depth(0);
        let trunk = TdModule::new(
            MLP::new(&(p / "trunk"), &cfg(3, 8))?,
            ["observation"],
            ["hidden"],
        )?;
        let head = TensorDictSequential::new()
            .with(TdModule::new(
                MLP::new(&(p / "policy"), &cfg(8, 2))?,
                ["hidden"],
                ["param"],
            )?)
            .with(NormalParamExtractor::new());
        let dist = DistributionBuilder::tanh_normal("loc", "scale", -2.0, 2.0)?;
        let policy = ProbabilisticActor::new(head, dist)
            .with_return_log_prob(true)
            .with_exploration_type(ExplorationType::Random);
        let value = TdModule::new(
            MLP::new(&(p / "value"), &cfg(8, 1))?,
            ["hidden"],
            ["state_value"],
        )?;
        Ok(ActorValueOperator::new(trunk, policy, value))
    }
    let vs = nn::VarStore::new(Device::Cpu);
    let op = make_op(&vs.root()).unwrap();
    let mut kl = KLRewardTransform::new(&vs, make_op)
        .unwrap()
        .with_action_key("action");
    assert_eq!(
        kl.reference().dist_keys(),
        vec![NestedKey::from("loc"), NestedKey::from("scale")]
    );
    let obs = Tensor::randn([B, 3], (Kind::Float, Device::Cpu));
    let td = TensorDict::new([B])
        .unwrap()
        .with("observation", obs)
        .unwrap();
    let td = tch::no_grad(|| op.forward(td)).unwrap();
    let with_next = |td: &TensorDict| {
        let next = TensorDict::new([B])
            .unwrap()
            .with("reward", Tensor::zeros([B, 1], (Kind::Float, Device::Cpu)))
            .unwrap();
        td.clone().with("next", next).unwrap()
    };
    // the same weights: KL = 0 exactly
    let out = kl.forward(with_next(&td)).unwrap();
    assert_eq!(
        max_abs_diff(
            out.get_or_err(("next", "reward")).unwrap(),
            &Tensor::zeros([B, 1], (Kind::Float, Device::Cpu))
        ),
        0.0
    );
    // the actor moves; the stored log-prob is the moved actor's
    perturb(&vs);
    let td = tch::no_grad(|| {
        let lp = op.log_prob(&td).unwrap();
        td.clone().with("action_log_prob", lp).unwrap()
    });
    let out = kl.forward(with_next(&td)).unwrap();
    let lp_ref = tch::no_grad(|| kl.reference().log_prob(&td).unwrap());
    let expected = -(td.get_or_err("action_log_prob").unwrap() - lp_ref).unsqueeze(-1);
    let r = out.get_or_err(("next", "reward")).unwrap();
    assert!(max_abs_diff(r, &expected) < 1e-5, "{r:?} vs {expected:?}");
    assert_eq!(r.ne(0.0).all().int64_value(&[]), 1);
}
