//! The Rust half of the side-by-side off-policy benchmarks, measured as
//! `benches/python/offpolicy_baseline.py` measures them (float32 CPU, single-threaded libtorch,
//! best of 3 repetitions after one warm-up repetition):
//!
//! - W24: one SAC update, 200 per repetition. Pendulum-sized: observation dim 3, action dim 1
//!   in `[-2, 2]`. Actor MLP 3→256→256→2 (tanh, TorchRL's default) → `NormalParamExtractor` →
//!   TanhNormal(-2, 2) `ProbabilisticActor`; two critics MLP 4→256→256→1 over (observation,
//!   action); `SACLoss` with TorchRL's defaults (learned α from 1, target entropy `-1`), TD(0)
//!   with γ = 0.99. A fixed batch of 256 random transitions (about 5% terminated). One update:
//!   loss forward, backward of actor + qvalue + alpha losses, Adam (lr 3e-4) over all
//!   parameters, `SoftUpdate` (τ = 0.005).
//! - W25: one DQN update, 500 per repetition: `QValueActor` over MLP 4→256→256→2 (one-hot
//!   actions), `DQNLoss` (target network, no double DQN, L2), TD(0) γ = 0.99, a fixed batch of
//!   256, backward, Adam lr 3e-4, `SoftUpdate` τ = 0.005.
//! - W26: a `ReplayBuffer` with a `PrioritizedSampler` (capacity 1,000,000, α 0.7, β 0.5) of
//!   Pendulum transitions: filled to 1M in chunks of 10,000 (`W26_fill_1m`, entries/s; the
//!   chunks are made before the clock starts), then 1,000 operations per repetition, each
//!   extend 256 new transitions + sample 256 + `update_priority` of the sampled indices with
//!   random priorities.
//!
//! W24 and W25 are printed next to a bare-`tch` floor (`*_floor`: the same graph written with
//! `tch` ops on `nn::Linear` layers, no tensordict, no loss module; its repetitions interleaved
//! with ours, so that machine noise hits both alike) and the ratio of the two times (ours /
//! floor) as a `#` comment line. W26 has no floor. Both sides of W24 / W25 step
//! `objectives::optim::FusedAdam` (PyTorch's `Adam(fused=True)`; `nn::Adam`, libtorch's
//! per-tensor C++ loop, before 2026-12-04); TorchRL steps `torch.optim.Adam`'s default, which on
//! the CPU is the per-tensor loop. Both sides' MLPs apply `modules::models::tanh` (the AVX2
//! kernel where the CPU has it; since 2026-12-05); `TORCHRL_TANH_KERNEL=0` puts libtorch's
//! `tanh` (MKL's `vsTanh`, TorchRL's) back on both.
//!
//! Run: `cargo bench --bench offpolicy` (all), or `cargo bench --bench offpolicy -- W26` (the
//! named workloads only).

mod common;
use common::{paired, print_floor, try_best_of, Repetition};

use std::hint::black_box;

use tch::nn::{self, Module};
use tch::{Device, Kind, Tensor};
use torchrl::data::replay::{PrioritizedSampler, ReplayBuffer};
use torchrl::modules::models::tanh;
use torchrl::modules::{
    ActionSpace, DistributionBuilder, MlpConfig, NormalParamExtractor, ProbabilisticActor,
    QValueActor, TdModule, TensorDictSequential, MLP,
};
use torchrl::objectives::optim::FusedAdam;
use torchrl::objectives::{
    DQNConfig, DQNLoss, LossModule, LossOutput, SACConfig, SACLoss, SoftUpdate, ValueEstimators,
};
use torchrl::{Result, TensorDict};

const F32: (Kind, Device) = (Kind::Float, Device::Cpu);
const BATCH: i64 = 256;
const HIDDEN: i64 = 256;
const LR: f64 = 3e-4;
const GAMMA: f64 = 0.99;
const TAU: f64 = 0.005;
const W24_UPDATES: usize = 200;
const W25_UPDATES: usize = 500;
const W26_CAPACITY: i64 = 1_000_000;
const W26_CHUNK: i64 = 10_000;
const W26_OPS: usize = 1_000;

/// Runs `f` once (warm-up), then returns the best of 3 timed runs, in seconds.
fn warm_best_of_3(mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    f()?;
    try_best_of(f, 3)
}

/// A batch of `n` random transitions: observation `[n, obs]`, action `action`, next
/// observation, next reward `[n, 1]`, next done = next terminated (bool `[n, 1]`, ~5% set).
fn transitions(n: i64, obs: i64, action: Tensor) -> Result<TensorDict> {
    let done = Tensor::f_rand([n, 1], F32)?.f_lt(0.05)?;
    let next = TensorDict::new([n])?
        .with("observation", Tensor::f_randn([n, obs], F32)?)?
        .with("reward", Tensor::f_randn([n, 1], F32)?)?
        .with("done", done.copy())?
        .with("terminated", done)?;
    TensorDict::new([n])?
        .with("observation", Tensor::f_randn([n, obs], F32)?)?
        .with("action", action)?
        .with("next", next)
}

/// Pendulum-sized transitions: actions uniform in `[-2, 2]`.
fn pendulum_transitions(n: i64) -> Result<TensorDict> {
    let action = Tensor::f_rand([n, 1], F32)?
        .f_mul_scalar(4.0)?
        .f_sub_scalar(2.0)?;
    transitions(n, 3, action)
}

fn mlp_config(inputs: i64, outputs: i64) -> MlpConfig {
    MlpConfig::new(inputs, outputs)
        .with_depth(2)
        .with_num_cells(HIDDEN)
}

// ------------------------------------------------------------------------------------ W24

/// W24 (ours): `SACLoss` forward, backward of the three losses, Adam, `SoftUpdate`.
fn w24(data: &TensorDict) -> Result<Repetition<'_>> {
    let vs = nn::VarStore::new(Device::Cpu);
    let mlp = MLP::new(&vs.root().sub("actor"), &mlp_config(3, 2))?;
    let net = TensorDictSequential::new()
        .with(TdModule::new(mlp, ["observation"], ["param"])?)
        .with(NormalParamExtractor::new());
    let actor = ProbabilisticActor::new(
        net,
        DistributionBuilder::tanh_normal("loc", "scale", -2.0, 2.0)?,
    );
    let critic = |p: &nn::Path| {
        TdModule::new(
            MLP::new(p, &mlp_config(4, 1))?,
            ["observation", "action"],
            ["state_action_value"],
        )
    };
    let mut loss = SACLoss::new(
        &vs.root(),
        actor,
        critic,
        SACConfig::new().with_action_dims(1),
    )?;
    loss.make_value_estimator(ValueEstimators::TD0, GAMMA)?;
    let mut updater = SoftUpdate::new(&loss, None, Some(TAU))?;
    let mut opt = FusedAdam::new(&vs, LR)?;
    Ok(Box::new(move || {
        for _ in 0..W24_UPDATES {
            let out = loss.forward(data)?;
            opt.zero_grad()?;
            out.total_loss()?.f_backward()?;
            opt.step()?;
            updater.step()?;
        }
        Ok(())
    }))
}

/// An MLP of `nn::Linear` layers with tanh between them (the floor's networks; the same tanh as
/// the `MLP`'s, `modules::models::tanh`).
struct Net {
    layers: Vec<nn::Linear>,
}

impl Net {
    fn new(p: &nn::Path, inputs: i64, outputs: i64) -> Self {
        let c = nn::LinearConfig::default();
        Net {
            layers: vec![
                nn::linear(p / "0", inputs, HIDDEN, c),
                nn::linear(p / "1", HIDDEN, HIDDEN, c),
                nn::linear(p / "2", HIDDEN, outputs, c),
            ],
        }
    }

    fn forward(&self, x: &Tensor) -> Tensor {
        let last = self.layers.len() - 1;
        let mut h = x.shallow_clone();
        for (i, l) in self.layers.iter().enumerate() {
            h = l.forward(&h);
            if i < last {
                h = tanh(&h).expect("tanh of a float tensor");
            }
        }
        h
    }

    /// The forward with detached parameters (the critics held out of the actor's graph).
    fn forward_detached(&self, x: &Tensor) -> Tensor {
        let last = self.layers.len() - 1;
        let mut h = x.shallow_clone();
        for (i, l) in self.layers.iter().enumerate() {
            let b = l.bs.as_ref().map(Tensor::detach);
            h = h.linear(&l.ws.detach(), b.as_ref());
            if i < last {
                h = tanh(&h).expect("tanh of a float tensor");
            }
        }
        h
    }
}

/// `θ' ← θ' + τ (θ - θ')` for every variable of `target` (paired by name with `online`).
fn soft_update(pairs: &[(Tensor, Tensor)]) {
    let _guard = tch::no_grad_guard();
    for (online, target) in pairs {
        let _ = target.shallow_clone().lerp_(online, TAU);
    }
}

/// The `(online, target)` variable pairs of two var stores built alike.
fn pairs(online: &nn::VarStore, target: &nn::VarStore) -> Vec<(Tensor, Tensor)> {
    let online = online.variables();
    target
        .variables()
        .into_iter()
        .filter_map(|(name, t)| online.get(&name).map(|o| (o.shallow_clone(), t)))
        .collect()
}

/// A reparameterised TanhNormal(-2, 2) action and its log-probability (summed over the
/// action dim), from the actor's `[B, 2]` output: `loc, s = chunk(2)`,
/// `scale = softplus(s + ln(expm1(0.99))) + 0.01` clamped at 1e-4 (tensordict's
/// `biased_softplus_1.0`).
fn tanh_normal_rsample(param: &Tensor) -> (Tensor, Tensor) {
    let parts = param.chunk(2, -1);
    let (loc, s) = (&parts[0], &parts[1]);
    let shift = (0.99f32.exp_m1().ln()) as f64;
    let scale = ((s + shift).softplus() + 0.01).clamp_min(1e-4);
    let x = loc + &scale * Tensor::randn(loc.size(), F32);
    let action = x.tanh() * 2.0;
    // Normal log-density minus log|d action / d x| = 2 (ln 2 - x - softplus(-2x)) + ln 2
    let z = (&x - loc) / &scale;
    let log_normal = (&z * &z) * -0.5 - scale.log() - 0.5 * (2.0 * std::f64::consts::PI).ln();
    let ladj =
        ((-&x - (&x * -2.0).softplus()) + std::f64::consts::LN_2) * 2.0 + std::f64::consts::LN_2;
    let log_prob = (log_normal - ladj).sum_dim_intlist(-1, false, Kind::Float);
    (action, log_prob)
}

/// The W24 floor: the same SAC update written with `tch` ops on `nn::Linear` layers.
fn w24_floor(data: &TensorDict) -> Result<Repetition<'static>> {
    let obs = data.get_or_err("observation")?.shallow_clone();
    let act = data.get_or_err("action")?.shallow_clone();
    let next_obs = data.get_or_err(("next", "observation"))?.shallow_clone();
    let reward = data.get_or_err(("next", "reward"))?.shallow_clone();
    let not_term = data
        .get_or_err(("next", "terminated"))?
        .f_to_kind(Kind::Float)?
        .f_rsub_scalar(1.0)?;

    let vs = nn::VarStore::new(Device::Cpu);
    let root = vs.root();
    let actor = Net::new(&(&root / "actor"), 3, 2);
    let q = [
        Net::new(&(&root / "q0"), 4, 1),
        Net::new(&(&root / "q1"), 4, 1),
    ];
    let log_alpha = root.var("log_alpha", &[], nn::Init::Const(0.0));
    let mut tvs = nn::VarStore::new(Device::Cpu);
    let troot = tvs.root();
    let q_target = [
        Net::new(&(&troot / "q0"), 4, 1),
        Net::new(&(&troot / "q1"), 4, 1),
    ];
    tvs.copy(&vs)?;
    tvs.freeze();
    let target_pairs = pairs(&vs, &tvs);
    let target_entropy = -1.0;
    let mut opt = FusedAdam::new(&vs, LR)?;
    Ok(Box::new(move || {
        for _ in 0..W24_UPDATES {
            let alpha = log_alpha.exp().detach();
            // critics: V(s') = min_i Q'_i(s', a') - α log π(a'|s')
            let target = tch::no_grad(|| {
                let (a, lp) = tanh_normal_rsample(&actor.forward(&next_obs));
                let x = Tensor::cat(&[&next_obs, &a], -1);
                let qs = Tensor::stack(&[q_target[0].forward(&x), q_target[1].forward(&x)], 0)
                    .squeeze_dim(-1);
                let v = (qs - (&lp * &alpha)).min_dim(0, false).0;
                (&reward + &not_term * v.unsqueeze(-1) * GAMMA).squeeze_dim(-1)
            });
            let x = Tensor::cat(&[&obs, &act], -1);
            let pred = Tensor::stack(&[q[0].forward(&x), q[1].forward(&x)], 0).squeeze_dim(-1);
            let loss_q = pred
                .smooth_l1_loss(&target.expand_as(&pred), tch::Reduction::None, 1.0)
                .sum_dim_intlist(0, false, Kind::Float)
                .mean(Kind::Float);
            // actor and α
            let (a, lp) = tanh_normal_rsample(&actor.forward(&obs));
            let x = Tensor::cat(&[&obs, &a], -1);
            let q_pi = Tensor::stack(&[q[0].forward_detached(&x), q[1].forward_detached(&x)], 0)
                .squeeze_dim(-1);
            let min_q = q_pi.min_dim(0, false).0;
            let loss_actor = (&lp * &alpha - min_q).mean(Kind::Float);
            let loss_alpha = (-&log_alpha * (lp.detach() + target_entropy)).mean(Kind::Float);
            opt.zero_grad()?;
            (loss_q + loss_actor + loss_alpha).f_backward()?;
            opt.step()?;
            soft_update(&target_pairs);
        }
        Ok(())
    }))
}

// ------------------------------------------------------------------------------------ W25

/// W25 inputs: CartPole-sized transitions with one-hot actions (2 actions).
fn w25_data() -> Result<TensorDict> {
    let action = Tensor::f_randint(2, [BATCH], (Kind::Int64, Device::Cpu))?
        .f_one_hot(2)?
        .f_to_kind(Kind::Int64)?;
    transitions(BATCH, 4, action)
}

/// W25 (ours): `DQNLoss` forward, backward, Adam, `SoftUpdate`.
fn w25(data: &TensorDict) -> Result<Repetition<'_>> {
    let vs = nn::VarStore::new(Device::Cpu);
    let q = |p: &nn::Path| {
        QValueActor::new(
            TdModule::new(
                MLP::new(p, &mlp_config(4, 2))?,
                ["observation"],
                ["action_value"],
            )?,
            ActionSpace::OneHot,
        )
    };
    let mut loss = DQNLoss::new(&vs.root(), q, DQNConfig::new(ActionSpace::OneHot))?;
    loss.make_value_estimator(ValueEstimators::TD0, GAMMA)?;
    let mut updater = SoftUpdate::new(&loss, None, Some(TAU))?;
    let mut opt = FusedAdam::new(&vs, LR)?;
    Ok(Box::new(move || {
        for _ in 0..W25_UPDATES {
            let out = loss.forward(data)?;
            opt.zero_grad()?;
            out.total_loss()?.f_backward()?;
            opt.step()?;
            updater.step()?;
        }
        Ok(())
    }))
}

/// The W25 floor: `Q(s, a) = Σ Q(s)·a`, target `r + γ (1 - terminated) max Q'(s')`, L2.
fn w25_floor(data: &TensorDict) -> Result<Repetition<'static>> {
    let obs = data.get_or_err("observation")?.shallow_clone();
    let act = data.get_or_err("action")?.f_to_kind(Kind::Float)?;
    let next_obs = data.get_or_err(("next", "observation"))?.shallow_clone();
    let reward = data.get_or_err(("next", "reward"))?.f_squeeze_dim(-1)?;
    let not_term = data
        .get_or_err(("next", "terminated"))?
        .f_to_kind(Kind::Float)?
        .f_rsub_scalar(1.0)?
        .f_squeeze_dim(-1)?;
    let vs = nn::VarStore::new(Device::Cpu);
    let q = Net::new(&vs.root(), 4, 2);
    let mut tvs = nn::VarStore::new(Device::Cpu);
    let q_target = Net::new(&tvs.root(), 4, 2);
    tvs.copy(&vs)?;
    tvs.freeze();
    let target_pairs = pairs(&vs, &tvs);
    let mut opt = FusedAdam::new(&vs, LR)?;
    Ok(Box::new(move || {
        for _ in 0..W25_UPDATES {
            let pred = (q.forward(&obs) * &act).sum_dim_intlist(-1, false, Kind::Float);
            let target = tch::no_grad(|| {
                let next = q_target.forward(&next_obs).max_dim(-1, false).0;
                &reward + &not_term * next * GAMMA
            });
            let loss = pred.mse_loss(&target, tch::Reduction::Mean);
            opt.zero_grad()?;
            loss.f_backward()?;
            opt.step()?;
            soft_update(&target_pairs);
        }
        Ok(())
    }))
}

// ------------------------------------------------------------------------------------ W26

/// W26: the fill rate to 1M (entries/s) and the extend + sample + update_priority rate.
fn w26() -> Result<(f64, f64)> {
    let sampler = PrioritizedSampler::new(W26_CAPACITY, 0.7, 0.5)?.with_seed(0);
    let mut rb = ReplayBuffer::with_sampler(W26_CAPACITY, sampler)?;
    let chunk = pendulum_transitions(W26_CHUNK)?;
    let t0 = std::time::Instant::now();
    for _ in 0..W26_CAPACITY / W26_CHUNK {
        rb.extend(&chunk)?;
    }
    let fill = W26_CAPACITY as f64 / t0.elapsed().as_secs_f64();
    // new transitions and random priorities, made before the clock starts
    let news: Vec<TensorDict> = (0..8)
        .map(|_| pendulum_transitions(BATCH))
        .collect::<Result<_>>()?;
    let priorities = Vec::<f64>::try_from(Tensor::f_rand(
        [BATCH * W26_OPS as i64],
        (Kind::Double, Device::Cpu),
    )?)?;
    let batches: Vec<&[f64]> = priorities.chunks(BATCH as usize).collect();
    let secs = warm_best_of_3(|| {
        for (i, p) in batches.iter().enumerate() {
            let new = news
                .get(i % news.len())
                .ok_or(torchrl::Error::InvalidArgument {
                    op: "w26",
                    message: "no batch".into(),
                })?;
            rb.extend(new)?;
            let (sample, idx) = rb.sample_with_indices(BATCH)?;
            black_box(&sample);
            rb.update_priority(&idx, p)?;
        }
        Ok(())
    })?;
    Ok((fill, W26_OPS as f64 / secs))
}

fn main() -> Result<()> {
    tch::set_num_threads(1);
    tch::manual_seed(0);
    // `cargo bench --bench offpolicy -- W26` runs only the named workloads (all without names)
    let wanted: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a.starts_with('W'))
        .collect();
    let run = |w: &str| wanted.is_empty() || wanted.iter().any(|a| a == w);
    if run("W24") {
        let data = pendulum_transitions(BATCH)?;
        let (ours, floor) = paired(w24(&data)?, w24_floor(&data)?)?;
        let n = W24_UPDATES as f64;
        println!("W24_sac_update\t{:.1}", n / ours);
        print_floor("W24_sac_update", n, ours, floor);
    }
    if run("W25") {
        let data = w25_data()?;
        let (ours, floor) = paired(w25(&data)?, w25_floor(&data)?)?;
        let n = W25_UPDATES as f64;
        println!("W25_dqn_update\t{:.1}", n / ours);
        print_floor("W25_dqn_update", n, ours, floor);
    }
    if run("W26") {
        let (fill, ops) = w26()?;
        println!("W26_fill_1m\t{fill:.1}");
        println!("W26_prioritized_replay_1m\t{ops:.1}");
    }
    Ok(())
}
