//! Replays `specs/offpolicy_cases.json` (recorded from TorchRL 0.14.1 by
//! `specs/record_offpolicy.py`): every output term of DQNLoss (plain / double, one-hot /
//! categorical), DDPGLoss, TD3Loss (no smoothing noise), SACLoss (auto / fixed α, the actor's
//! noise replayed), DiscreteSACLoss; SoftUpdate / HardUpdate after n steps; TD(0) / TD(1).

mod common;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use common::Value;
use common::{load_cases, td_from_json, tensor_from_json, Case};
use tch::nn;
use tch::{Device, Kind, Tensor};
use torchrl::modules::distributions::Distribution;
use torchrl::modules::{
    ActionSpace, DistributionBuilder, ExplorationType, NormalParamExtractor, ProbabilisticActor,
    ProbabilisticTensorDictModule, QValueActor, TdModule, TensorDictModule, TensorDictSequential,
};
use torchrl::objectives::target::TargetParams;
use torchrl::objectives::value::{TD0Estimator, TD1Estimator, ValueEstimator};
use torchrl::objectives::{
    CriticLossType, DDPGConfig, DDPGLoss, DQNConfig, DQNLoss, DiscreteSACConfig, DiscreteSACLoss,
    HardUpdate, LossModule, LossOutput, SACConfig, SACLoss, SoftUpdate, TD3Config, TD3Loss,
    TargetNetworks, ValueEstimators,
};
use torchrl::{Generator, NestedKey, Result, TensorDict};

const TOL: f64 = 1e-5;
const H: i64 = 4;

fn cases(op: &str) -> Vec<Case> {
    let all = load_cases("offpolicy_cases.json").cases;
    let v: Vec<Case> = all.into_iter().filter(|c| c.op == op).collect();
    assert!(!v.is_empty(), "no {op} case");
    v
}

fn t(v: &Value) -> Tensor {
    tensor_from_json(v).unwrap_or_else(|e| panic!("{e}"))
}

fn td(v: &Value) -> TensorDict {
    td_from_json(v).unwrap_or_else(|e| panic!("{e}"))
}

fn close(name: &str, got: &Tensor, want: &Value) {
    let want = t(want);
    let got = got.to_kind(Kind::Double);
    assert_eq!(got.size(), want.size(), "{name}: shape");
    let diff = (&got - &want).abs().max().double_value(&[]);
    let scale = want.abs().max().double_value(&[]).max(1.0);
    assert!(
        diff <= TOL * scale,
        "{name}: max |diff| = {diff:e}\n got {got}\nwant {want}"
    );
}

/// `Linear(n_in, 4) -> Tanh -> Linear(4, n_out)`, named `l0` / `l1` under `p`.
fn mlp(p: &nn::Path, n_in: i64, n_out: i64) -> nn::Sequential {
    nn::seq()
        .add(nn::linear(p / "l0", n_in, H, Default::default()))
        .add_fn(|x| x.tanh())
        .add(nn::linear(p / "l1", H, n_out, Default::default()))
}

fn store() -> nn::VarStore {
    let mut vs = nn::VarStore::new(Device::Cpu);
    vs.set_kind(Kind::Double);
    vs
}

/// Writes every recorded weight into the var store's variable of the same name (and
/// `log_alpha = ln(log_alpha)` when given); every variable must be covered.
fn load_with(vs: &nn::VarStore, weights: &Value, log_alpha: Option<f64>) {
    let vars = vs.variables();
    let obj = weights.as_object().expect("weights");
    for (name, v) in obj {
        let var = vars
            .get(name)
            .unwrap_or_else(|| panic!("no variable {name}; have {:?}", vars.keys()));
        tch::no_grad(|| var.shallow_clone().copy_(&t(v)));
    }
    let mut n = obj.len();
    if let Some(la) = log_alpha {
        let var = vars.get("log_alpha").expect("log_alpha variable");
        tch::no_grad(|| {
            let _ = var.shallow_clone().fill_(la);
        });
        n += 1;
    }
    assert_eq!(n, vars.len(), "every variable recorded");
}

fn load(vs: &nn::VarStore, weights: &Value) {
    load_with(vs, weights, None)
}

/// Writes the recorded target weights (`prefix + name`) into a target copy.
fn load_target(params: Option<&TargetParams>, prefix: &str, target: &Value) {
    let params = params.expect("a target copy");
    for (name, _, tgt) in params.pairs() {
        let key = format!("{prefix}{name}");
        let v = target
            .get(&key)
            .unwrap_or_else(|| panic!("no target weight {key}"));
        tch::no_grad(|| tgt.shallow_clone().copy_(&t(v)));
    }
}

fn check_outputs(case: &Case, got: &[(&str, &Tensor)]) {
    let expect = case.expect.as_object().expect("expect");
    for (name, want) in expect {
        let g = got
            .iter()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("{}: no output {name}", case.name));
        close(&format!("{}: {name}", case.name), g.1, want);
    }
}

// ------------------------------------------------------------------------------ DQN

#[test]
fn dqn_matches_torchrl() -> Result<()> {
    for case in cases("dqn") {
        let a = &case.args;
        let space = if a["space"].as_str() == Some("one_hot") {
            ActionSpace::OneHot
        } else {
            ActionSpace::Categorical
        };
        let loss_fn: CriticLossType = a["loss_function"].as_str().expect("str").parse()?;
        let vs = store();
        let build = |p: &nn::Path| {
            QValueActor::new(
                TdModule::new(mlp(p, 3, 2), ["observation"], ["action_value"])?,
                space,
            )
        };
        let config = DQNConfig::new(space)
            .with_double_dqn(a["double_dqn"].as_bool().expect("bool"))
            .with_loss_function(loss_fn);
        let mut loss = DQNLoss::new(&vs.root(), build, config)?;
        loss.make_value_estimator(ValueEstimators::TD0, a["gamma"].as_f64().expect("gamma"))?;
        load(&vs, &a["weights"]);
        load_target(
            loss.value_network().target_params(),
            "",
            &a["target_weights"],
        );
        let out = loss.forward(&td(&a["td"]))?;
        check_outputs(&case, &[("loss", &out.loss), ("td_error", &out.td_error)]);
    }
    Ok(())
}

// --------------------------------------------------------------------------- DDPG / TD3

fn det_actor(p: &nn::Path) -> Result<TdModule<nn::Sequential>> {
    let net = mlp(p, 3, 1).add_fn(|x| x.tanh());
    TdModule::new(net, ["observation"], ["action"])
}

fn critic(p: &nn::Path) -> Result<TdModule<nn::Sequential>> {
    TdModule::new(
        mlp(p, 4, 1),
        ["observation", "action"],
        ["state_action_value"],
    )
}

#[test]
fn ddpg_matches_torchrl() -> Result<()> {
    for case in cases("ddpg") {
        let a = &case.args;
        let vs = store();
        let config = DDPGConfig::new().with_delay_actor(true);
        let mut loss = DDPGLoss::new(&vs.root(), det_actor, critic, config)?;
        loss.make_value_estimator(ValueEstimators::TD0, a["gamma"].as_f64().expect("gamma"))?;
        load(&vs, &a["weights"]);
        load_target(loss.actor().target_params(), "actor.", &a["target_weights"]);
        load_target(
            loss.value_network().target_params(),
            "value.",
            &a["target_weights"],
        );
        let out = loss.forward(&td(&a["td"]))?;
        let mut got = out.loss_terms();
        got.extend(out.metrics());
        got.extend([
            ("pred_value", &out.pred_value),
            ("target_value", &out.target_value),
            ("td_error", &out.td_error),
        ]);
        check_outputs(&case, &got);
    }
    Ok(())
}

#[test]
fn td3_matches_torchrl() -> Result<()> {
    for case in cases("td3") {
        let a = &case.args;
        let vs = store();
        let config = TD3Config::new(-1.0, 1.0).with_policy_noise(0.0);
        let mut loss = TD3Loss::new(&vs.root(), det_actor, critic, config)?;
        loss.make_value_estimator(ValueEstimators::TD0, a["gamma"].as_f64().expect("gamma"))?;
        load(&vs, &a["weights"]);
        load_target(loss.actor().target_params(), "actor.", &a["target_weights"]);
        for (i, q) in loss.qvalue_networks().iter().enumerate() {
            load_target(
                q.target_params(),
                &format!("qvalue.{i}."),
                &a["target_weights"],
            );
        }
        let out = loss.forward(&td(&a["td"]))?;
        let mut got = out.loss_terms();
        got.extend([
            ("state_action_value_actor", &out.state_action_value_actor),
            ("next_state_value", &out.next_state_value),
            ("pred_value", &out.pred_value),
            ("target_value", &out.target_value),
        ]);
        check_outputs(&case, &got);
    }
    Ok(())
}

// -------------------------------------------------------------------------------- SAC

/// A TanhNormal over `[-1, 1]` whose reparameterised samples use recorded noise.
struct FixedNoiseTanh {
    inner: Box<dyn Distribution>,
    loc: Tensor,
    scale: Tensor,
    noise: Arc<Mutex<VecDeque<Tensor>>>,
}

impl Distribution for FixedNoiseTanh {
    fn batch_shape(&self) -> &[i64] {
        self.inner.batch_shape()
    }
    fn event_shape(&self) -> &[i64] {
        self.inner.event_shape()
    }
    fn kind(&self) -> Kind {
        self.inner.kind()
    }
    fn device(&self) -> Device {
        self.inner.device()
    }
    fn log_prob(&self, value: &Tensor) -> Result<Tensor> {
        self.inner.log_prob(value)
    }
    fn sample(&self, gen: &mut Generator, s: &[i64]) -> Result<Tensor> {
        self.inner.sample(gen, s)
    }
    fn has_rsample(&self) -> bool {
        true
    }
    fn rsample(&self, gen: &mut Generator, s: &[i64]) -> Result<Tensor> {
        Ok(self.rsample_and_log_prob(gen, s)?.0)
    }
    fn entropy(&self) -> Result<Tensor> {
        self.inner.entropy()
    }
    fn mode(&self) -> Result<Tensor> {
        self.inner.mode()
    }
    fn mean(&self) -> Result<Tensor> {
        self.inner.mean()
    }
    /// `x = loc + scale·ε`, `a = tanh(x)`, `log p = Σ log N(x) - Σ 2(ln 2 - x - softplus(-2x))`.
    fn rsample_and_log_prob(&self, _gen: &mut Generator, _s: &[i64]) -> Result<(Tensor, Tensor)> {
        let eps = self
            .noise
            .lock()
            .expect("lock")
            .pop_front()
            .expect("recorded noise left");
        let x = &self.loc + &self.scale * eps;
        let a = x.tanh();
        let z = (&x - &self.loc) / &self.scale;
        let log_n = -(&z * &z) * 0.5 - self.scale.log() - 0.5 * (2.0 * std::f64::consts::PI).ln();
        let ladj = (-(&x) - (&x * -2.0).softplus() + std::f64::consts::LN_2) * 2.0;
        let lp = (log_n - ladj).sum_dim_intlist(-1, false, None::<Kind>);
        Ok((a, lp))
    }
}

/// A ProbabilisticActor whose distribution replays recorded noise.
struct FixedNoiseActor {
    inner: ProbabilisticActor,
    noise: Arc<Mutex<VecDeque<Tensor>>>,
}

impl TensorDictModule for FixedNoiseActor {
    fn in_keys(&self) -> Vec<NestedKey> {
        self.inner.in_keys()
    }
    fn out_keys(&self) -> Vec<NestedKey> {
        self.inner.out_keys()
    }
    fn forward(&self, td: TensorDict) -> Result<TensorDict> {
        TensorDictModule::forward(&self.inner, td)
    }
}

impl ProbabilisticTensorDictModule for FixedNoiseActor {
    fn get_dist_params(&self, td: TensorDict) -> Result<TensorDict> {
        ProbabilisticTensorDictModule::get_dist_params(&self.inner, td)
    }
    fn dist_keys(&self) -> Vec<NestedKey> {
        self.inner.dist_keys()
    }
    fn build_dist(&self, td: &TensorDict) -> Result<Box<dyn Distribution>> {
        Ok(Box::new(FixedNoiseTanh {
            inner: self.inner.build_dist(td)?,
            loc: td.get_or_err("loc")?.shallow_clone(),
            scale: td.get_or_err("scale")?.shallow_clone(),
            noise: self.noise.clone(),
        }))
    }
    fn action_key(&self) -> &NestedKey {
        ProbabilisticTensorDictModule::action_key(&self.inner)
    }
    fn log_prob_key(&self) -> NestedKey {
        ProbabilisticTensorDictModule::log_prob_key(&self.inner)
    }
    fn forward_with(
        &self,
        td: TensorDict,
        e: ExplorationType,
        gen: &mut Generator,
    ) -> Result<TensorDict> {
        self.inner.forward_with(td, e, gen)
    }
}

#[test]
fn sac_matches_torchrl() -> Result<()> {
    for case in cases("sac") {
        let a = &case.args;
        let vs = store();
        let net = TensorDictSequential::new()
            .with(TdModule::new(
                mlp(&vs.root(), 3, 2),
                ["observation"],
                ["param"],
            )?)
            .with(NormalParamExtractor::new());
        let inner = ProbabilisticActor::new(
            net,
            DistributionBuilder::tanh_normal("loc", "scale", -1.0, 1.0)?,
        );
        let noise: VecDeque<Tensor> = a["eps"].as_array().expect("eps").iter().map(t).collect();
        let actor = FixedNoiseActor {
            inner,
            noise: Arc::new(Mutex::new(noise)),
        };
        let config = SACConfig::new()
            .with_action_dims(1)
            .with_fixed_alpha(a["fixed_alpha"].as_bool().expect("bool"))
            .with_alpha_init(a["alpha_init"].as_f64().expect("alpha"));
        let mut loss = SACLoss::new(&vs.root(), actor, critic, config)?;
        assert_eq!(
            loss.target_entropy(),
            a["target_entropy"].as_f64().expect("te")
        );
        loss.make_value_estimator(ValueEstimators::TD0, a["gamma"].as_f64().expect("gamma"))?;
        let fixed = a["fixed_alpha"].as_bool().expect("bool");
        let la = (!fixed).then(|| a["alpha_init"].as_f64().expect("alpha").ln());
        load_with(&vs, &a["weights"], la);
        for (i, q) in loss.qvalue_networks().iter().enumerate() {
            load_target(
                q.target_params(),
                &format!("qvalue.{i}."),
                &a["target_weights"],
            );
        }
        let out = loss.forward(&td(&a["td"]))?;
        let mut got = out.loss_terms();
        got.extend(out.metrics());
        check_outputs(&case, &got);
    }
    Ok(())
}

/// SAC version 1 (`with_value_network`; `specs/record_sac_v1.py`): every output term, and the
/// gradient of each term alone with respect to every weight (zero where TorchRL's term does
/// not reach: the critics, the value network and `log α` are held out where TorchRL detaches
/// them). The recorded actor noise is drawn in TorchRL's order (the value loss's, then the
/// actor loss's).
#[test]
fn sac_v1_matches_torchrl() -> Result<()> {
    let cases: Vec<Case> = load_cases("sac_v1_cases.json")
        .cases
        .into_iter()
        .filter(|c| c.args["delay_actor"].as_bool() == Some(false))
        .collect();
    assert_eq!(cases.len(), 4);
    for case in cases {
        let a = &case.args;
        let vs = store();
        let net = TensorDictSequential::new()
            .with(TdModule::new(
                mlp(&vs.root(), 3, 2),
                ["observation"],
                ["param"],
            )?)
            .with(NormalParamExtractor::new());
        let inner = ProbabilisticActor::new(
            net,
            DistributionBuilder::tanh_normal("loc", "scale", -1.0, 1.0)?,
        );
        let noise: VecDeque<Tensor> = a["eps"].as_array().expect("eps").iter().map(t).collect();
        let actor = FixedNoiseActor {
            inner,
            noise: Arc::new(Mutex::new(noise)),
        };
        let fixed = a["fixed_alpha"].as_bool().expect("bool");
        let delay_value = a["delay_value"].as_bool().expect("bool");
        let config = SACConfig::new()
            .with_action_dims(1)
            .with_fixed_alpha(fixed)
            .with_alpha_init(a["alpha_init"].as_f64().expect("alpha"))
            .with_delay_value(delay_value);
        // built at `root / "value"`: its weights are `value.l0.weight`, … as recorded
        let mut loss = SACLoss::new(&vs.root(), actor, critic, config)?
            .with_value_network(&vs.root(), |p: &nn::Path| {
                TdModule::new(mlp(p, 3, 1), ["observation"], ["state_value"])
            })?;
        loss.make_value_estimator(ValueEstimators::TD0, a["gamma"].as_f64().expect("gamma"))?;
        let la = (!fixed).then(|| a["alpha_init"].as_f64().expect("alpha").ln());
        load_with(&vs, &a["weights"], la);
        for (i, q) in loss.qvalue_networks().iter().enumerate() {
            load_target(
                q.target_params(),
                &format!("qvalue.{i}."),
                &a["target_weights"],
            );
        }
        let v = loss.value_network().expect("a value network");
        assert_eq!(v.has_target(), delay_value);
        if delay_value {
            load_target(v.target_params(), "value.", &a["target_weights"]);
        }
        let out = loss.forward(&td(&a["td"]))?;
        let mut got = out.loss_terms();
        got.extend(out.metrics());
        got.push(("td_error", &out.td_error));
        for (name, want) in case.expect.as_object().expect("expect") {
            if name == "grads" || name == "reached" {
                continue;
            }
            let g = got
                .iter()
                .find(|(n, _)| n == name)
                .unwrap_or_else(|| panic!("{}: no output {name}", case.name));
            close(&format!("{}: {name}", case.name), g.1, want);
        }
        // each term's gradients, by the recorded names
        let vars = vs.variables();
        let mut names: Vec<&String> = vars.keys().collect();
        names.sort();
        let leaves: Vec<Tensor> = names.iter().map(|n| vars[*n].shallow_clone()).collect();
        for (term, grads) in case.expect["grads"].as_object().expect("grads") {
            let (_, value) = out
                .loss_terms()
                .into_iter()
                .find(|(n, _)| n == term)
                .unwrap_or_else(|| panic!("{}: no term {term}", case.name));
            let wants_grad: Vec<bool> = leaves.iter().map(Tensor::requires_grad).collect();
            let reach: Vec<Tensor> = leaves
                .iter()
                .zip(&wants_grad)
                .filter(|(_, w)| **w)
                .map(|(l, _)| l.shallow_clone())
                .collect();
            let got = if value.requires_grad() {
                Tensor::run_backward(&[value.sum(Kind::Double)], &reach, true, true)
            } else {
                reach.iter().map(Tensor::zeros_like).collect()
            };
            let mut k = 0;
            for (name, w) in names.iter().zip(&wants_grad) {
                let want = grads.get(name.as_str()).unwrap_or_else(|| {
                    panic!("{}: no recorded grad of {term} for {name}", case.name)
                });
                if !*w {
                    continue;
                }
                let g = &got[k];
                k += 1;
                let g = if g.defined() {
                    g.shallow_clone()
                } else {
                    Tensor::zeros_like(&reach[k - 1])
                };
                close(&format!("{}: d {term} / d {name}", case.name), &g, want);
            }
        }
    }
    Ok(())
}

#[test]
fn discrete_sac_matches_torchrl() -> Result<()> {
    for case in cases("discrete_sac") {
        let a = &case.args;
        let one_hot = a["space"].as_str() == Some("one_hot");
        let space = if one_hot {
            ActionSpace::OneHot
        } else {
            ActionSpace::Categorical
        };
        let vs = store();
        let net = TdModule::new(mlp(&vs.root(), 3, 2), ["observation"], ["logits"])?;
        let builder = if one_hot {
            DistributionBuilder::one_hot_categorical("logits")?
        } else {
            DistributionBuilder::categorical("logits")?
        };
        let actor = ProbabilisticActor::new(net, builder);
        let qnet = |p: &nn::Path| TdModule::new(mlp(p, 3, 2), ["observation"], ["action_value"]);
        let mut loss =
            DiscreteSACLoss::new(&vs.root(), actor, qnet, DiscreteSACConfig::new(space, 2))?;
        assert!((loss.target_entropy() - a["target_entropy"].as_f64().expect("te")).abs() < 1e-12);
        loss.make_value_estimator(ValueEstimators::TD0, a["gamma"].as_f64().expect("gamma"))?;
        load_with(&vs, &a["weights"], Some(0.0));
        for (i, q) in loss.qvalue_networks().iter().enumerate() {
            load_target(
                q.target_params(),
                &format!("qvalue.{i}."),
                &a["target_weights"],
            );
        }
        let out = loss.forward(&td(&a["td"]))?;
        let mut got = out.loss_terms();
        got.extend(out.metrics());
        check_outputs(&case, &got);
    }
    Ok(())
}

// --------------------------------------------------------------------------- updaters

fn updater_case(case: &Case, soft: bool) -> Result<()> {
    let a = &case.args;
    let vs = store();
    let build = |p: &nn::Path| {
        QValueActor::new(
            TdModule::new(mlp(p, 3, 2), ["observation"], ["action_value"])?,
            ActionSpace::OneHot,
        )
    };
    let loss = DQNLoss::new(&vs.root(), build, DQNConfig::new(ActionSpace::OneHot))?;
    load(&vs, &a["weights"]);
    let param = a["param"].as_f64().expect("param");
    let mut soft_up = None;
    let mut hard_up = None;
    if soft {
        soft_up = Some(SoftUpdate::new(&loss, None, Some(param))?);
    } else {
        hard_up = Some(HardUpdate::new(&loss, param as u64)?);
    }
    let params = loss.target_params();
    for (i, step) in a["steps"].as_array().expect("steps").iter().enumerate() {
        load(&vs, &step["online"]);
        if let Some(u) = soft_up.as_mut() {
            u.step()?;
        }
        if let Some(u) = hard_up.as_mut() {
            u.step()?;
        }
        for (name, _, tgt) in params[0].pairs() {
            let want = step["target"]
                .get(name)
                .unwrap_or_else(|| panic!("no {name}"));
            close(&format!("{} step {i}: {name}", case.name), tgt, want);
        }
    }
    Ok(())
}

#[test]
fn soft_update_matches_torchrl() -> Result<()> {
    for case in cases("soft_update") {
        updater_case(&case, true)?;
    }
    Ok(())
}

#[test]
fn hard_update_matches_torchrl() -> Result<()> {
    for case in cases("hard_update") {
        updater_case(&case, false)?;
    }
    Ok(())
}

// ------------------------------------------------------------------------ TD0 / TD1

#[test]
fn td0_td1_match_torchrl() -> Result<()> {
    for op in ["td0", "td1"] {
        for case in cases(op) {
            let a = &case.args;
            let gamma = a["gamma"].as_f64().expect("gamma");
            let est: Box<dyn ValueEstimator> = if op == "td0" {
                Box::new(TD0Estimator::new(gamma)?)
            } else {
                Box::new(TD1Estimator::new(gamma)?)
            };
            let mut data = td(&a["td"]);
            let vt = est.value_estimate(&data)?;
            est.forward(&mut data)?;
            close(
                &format!("{}: advantage", case.name),
                data.get_or_err("advantage")?,
                &case.expect["advantage"],
            );
            close(
                &format!("{}: value_target", case.name),
                data.get_or_err("value_target")?,
                &case.expect["value_target"],
            );
            close(
                &format!("{}: value_estimate", case.name),
                &vt,
                &case.expect["value_estimate"],
            );
        }
    }
    Ok(())
}
