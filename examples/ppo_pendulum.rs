//! PPO on Pendulum, end to end: a transformed env, a TanhNormal actor and a critic, a
//! [`Collector`] (which explores: `ExplorationType::Random` while collecting), GAE,
//! [`ClipPPOLoss`], a replay buffer sampled without replacement for the minibatches, and Adam
//! with global-norm gradient clipping. At the end, the trained policy (deterministic actions)
//! is compared with a random policy and with the untrained policy, all
//! evaluated on the same seeded episodes.
//!
//! Run: `cargo run --release --example ppo_pendulum` (about a minute on two CPU cores);
//! options: `--frames N` (total training frames, default 102400), `--seed S` (default 0),
//! `--envs N` (parallel pendulums, default 16), `--quiet` (no progress bar).
//! A smoke run: `cargo run --release --example ppo_pendulum -- --frames 3200`.
//!
//! The example exits with an error when the trained policy is not better than the random one
//! (checked only for runs of at least 50k frames, which is enough for PPO here).

use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};
use tch::nn::{self, OptimizerConfig};
use tch::{Device, Kind, Tensor};
use torchrl::collectors::Collector;
use torchrl::data::replay::{LastBatch, ReplayBuffer, SamplerWithoutReplacement};
use torchrl::envs::builtin::PendulumEnv;
use torchrl::envs::transforms::{
    InitStats, ObservationNorm, RewardScaling, RewardSum, StepCounter,
};
use torchrl::envs::SpecGroup;
use torchrl::modules::{
    DistributionBuilder, ExplorationType, MlpConfig, NormalParamExtractor, ProbabilisticActor,
    TdModule, TensorDictModule, TensorDictSequential, ValueOperator, MLP,
};
use torchrl::objectives::optim::step_with_grad_norm;
use torchrl::objectives::value::GAE;
use torchrl::objectives::{ClipPPOLoss, CriticLossType, LossModule, LossOutput};
use torchrl::{EnvBase, Error, Generator, Result, RolloutConfig, TensorDict, TransformedEnv};

/// Gymnasium's `TimeLimit` for Pendulum-v1.
const EPISODE_STEPS: i64 = 200;

/// The run's settings (hyper-parameters are fixed below; these are the CLI knobs).
#[derive(Debug, Clone)]
pub struct Config {
    /// Total training frames (rounded up to whole batches).
    pub frames: i64,
    pub seed: u64,
    /// Pendulums stepped in parallel (one batched env).
    pub envs: i64,
    pub quiet: bool,
}

impl Config {
    pub fn from_args() -> Result<Self> {
        let mut cfg = Config {
            frames: 102_400,
            seed: 0,
            envs: 16,
            quiet: false,
        };
        let mut args = std::env::args().skip(1);
        while let Some(arg) = args.next() {
            let mut value = |name: &str| {
                args.next()
                    .ok_or_else(|| fail(format!("{name} needs a value")))
            };
            let bad = |name: &str, e: std::num::ParseIntError| fail(format!("{name}: {e}"));
            match arg.as_str() {
                "--frames" => {
                    cfg.frames = value("--frames")?.parse().map_err(|e| bad("--frames", e))?
                }
                "--seed" => cfg.seed = value("--seed")?.parse().map_err(|e| bad("--seed", e))?,
                "--envs" => cfg.envs = value("--envs")?.parse().map_err(|e| bad("--envs", e))?,
                "--quiet" => cfg.quiet = true,
                "-h" | "--help" => {
                    println!("usage: ppo_pendulum [--frames N] [--seed S] [--envs N] [--quiet]");
                    std::process::exit(0);
                }
                other => return Err(fail(format!("unknown argument {other:?} (try --help)"))),
            }
        }
        if cfg.frames < 1 || cfg.envs < 1 {
            return Err(fail("--frames and --envs must be positive"));
        }
        Ok(cfg)
    }
}

/// An error of this example (a bad argument, a failed check).
fn fail(message: impl Into<String>) -> Error {
    Error::InvalidArgument {
        op: "ppo_pendulum",
        message: message.into(),
    }
}

// ------------------------------------------------------------------ hyper-parameters

/// Discount: Pendulum's reward is dense, a short horizon learns much faster.
const GAMMA: f64 = 0.9;
const LMBDA: f64 = 0.95;
const EPOCHS: usize = 10;
const MINIBATCH: i64 = 64;
const LR: f64 = 1e-3;
const MAX_GRAD_NORM: f64 = 1.0;
const CLIP_EPSILON: f64 = 0.2;
const HIDDEN: i64 = 64;
/// TanhNormal has no closed-form entropy: the loss uses a one-sample Monte-Carlo estimate.
const ENTROPY_COEFF: f64 = 1e-3;
/// Rewards are in `[-16.3, 0]`; the scaled reward feeds the losses, the episode return
/// ([`RewardSum`], placed before the scaling) stays in the env's units.
const REWARD_SCALE: f64 = 0.1;

// ------------------------------------------------------------------ env

/// Pendulum with standardised observations, gymnasium's 200-step time limit, an episode
/// return, and a scaled reward for the losses.
///
/// No `DoubleToFloat`: Pendulum's observations, actions and rewards are float32 already (only
/// its physical state is float64, and casting that would lose precision on the way back in).
fn make_env(
    batch: i64,
    seed: u64,
    norm: Option<(Tensor, Tensor)>,
) -> Result<TransformedEnv<PendulumEnv>> {
    let mut base = PendulumEnv::new(&[batch], Device::Cpu)?;
    base.set_seed(seed)?;
    let norm = match norm {
        Some((loc, scale)) => ObservationNorm::from_tensors(loc, scale, ["observation"])?,
        None => ObservationNorm::uninitialized(["observation"])?,
    }
    .with_standard_normal(true);
    let stats_needed = !norm.is_initialized();
    let mut env = TransformedEnv::new(base)?
        .with(norm)?
        .with(StepCounter::new().with_max_steps(EPISODE_STEPS)?)?
        .with(RewardSum::new())?
        .with(RewardScaling::new(0.0, REWARD_SCALE)?)?;
    if stats_needed {
        // Mean and std of the observation over random-action rollouts: reduce over the env
        // batch dim and the time dim, concatenating rollouts along time.
        let frames = (batch * EPISODE_STEPS) as usize;
        let stats = InitStats::new(frames)
            .with_reduce_dim([0, 1])
            .with_cat_dim(1);
        ObservationNorm::init_stats_at(&mut env, 0, &stats)?;
    }
    Ok(env)
}

/// The statistics of the env's `ObservationNorm` (to build an eval env that normalises alike).
fn norm_stats(env: &TransformedEnv<PendulumEnv>) -> Result<(Tensor, Tensor)> {
    let norm = env
        .transform()
        .get_as::<ObservationNorm>(0)
        .ok_or_else(|| fail("transform 0 is not an ObservationNorm"))?;
    match (norm.loc(), norm.scale()) {
        (Some(l), Some(s)) => Ok((l.copy(), s.copy())),
        _ => Err(fail("ObservationNorm without statistics")),
    }
}

// ------------------------------------------------------------------ models

/// `observation → MLP → (loc, scale) → TanhNormal over the action bounds`.
fn make_actor(
    vs: &nn::Path<'_>,
    env: &TransformedEnv<PendulumEnv>,
    seed: u64,
) -> Result<ProbabilisticActor> {
    let obs_dim = env
        .specs()
        .group(SpecGroup::Observation)
        .get_or_err("observation")?
        .shape()
        .last()
        .copied()
        .unwrap_or(3);
    let spec = env.specs().group(SpecGroup::Action).get_or_err("action")?;
    let act_dim = spec.shape().last().copied().unwrap_or(1);
    let mlp = MLP::new(
        vs,
        &MlpConfig::new(obs_dim, 2 * act_dim)
            .with_depth(2)
            .with_num_cells(HIDDEN),
    )?;
    let net = TensorDictSequential::new()
        .with(TdModule::new(mlp, ["observation"], ["param"])?)
        .with(NormalParamExtractor::new());
    let dist =
        DistributionBuilder::tanh_normal_from_spec("loc", "scale", spec, env.batch_size().len())?;
    // No exploration type here: the collector runs the actor with `Random` (its default, as
    // in TorchRL), the evaluation asks for `Deterministic` per call.
    Ok(ProbabilisticActor::new(net, dist)
        .with_return_log_prob(true) // PPO needs the behaviour policy's log-prob
        .with_seed(seed))
}

fn make_critic(vs: &nn::Path<'_>, obs_dim: i64) -> Result<ValueOperator> {
    Ok(ValueOperator::new(MLP::new(
        vs,
        &MlpConfig::new(obs_dim, 1)
            .with_depth(2)
            .with_num_cells(HIDDEN),
    )?))
}

// ------------------------------------------------------------------ evaluation

/// Mean episode return (env units) of one full episode per env element, with `policy`
/// (random actions from the action spec when `None`).
fn evaluate(
    env: &mut TransformedEnv<PendulumEnv>,
    seed: u64,
    policy: Option<&mut dyn FnMut(TensorDict) -> Result<TensorDict>>,
) -> Result<f64> {
    env.set_seed(seed)?;
    let traj = env.rollout(EPISODE_STEPS as usize, policy, &RolloutConfig::default())?;
    let last = traj.batch_size()[1] - 1;
    Ok(traj
        .get_or_err(("next", "episode_reward"))?
        .f_select(1, last)?
        .f_mean(Kind::Double)?
        .f_double_value(&[])?)
}

/// The deterministic policy of `actor` (TanhNormal: `c + h·tanh(loc)`), without gradients.
fn deterministic(actor: &ProbabilisticActor) -> impl FnMut(TensorDict) -> Result<TensorDict> + '_ {
    let mut rng = Generator::new(0);
    move |td| {
        let _guard = tch::no_grad_guard();
        actor.forward_with(td, ExplorationType::Deterministic, &mut rng)
    }
}

// ------------------------------------------------------------------ progress bar

/// One tick per collected batch (hidden with `--quiet`).
fn progress_bar(iters: usize, quiet: bool) -> Result<ProgressBar> {
    if quiet {
        return Ok(ProgressBar::hidden());
    }
    let style = ProgressStyle::with_template("[{bar:24}] iter {pos:>3}/{len} | {msg} | {elapsed}")
        .map_err(|e| fail(e.to_string()))?
        .progress_chars("#.");
    Ok(ProgressBar::new(iters as u64).with_style(style))
}

// ------------------------------------------------------------------ training

/// What a run measured.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    /// Frames collected.
    pub frames: i64,
    /// Mean return of the episodes of the first and the last training batch (exploring).
    pub first_train_return: f64,
    pub last_train_return: f64,
    /// Mean eval return (same seeded episodes) of uniform random actions, of the untrained
    /// policy and of the trained policy (deterministic actions).
    pub random_return: f64,
    pub untrained_return: f64,
    pub trained_return: f64,
}

/// Trains PPO with `cfg` and evaluates it.
pub fn run(cfg: &Config) -> Result<Summary> {
    tch::manual_seed(cfg.seed as i64); // the weights' initialisation
                                       // Tiny matrices: libtorch's intra-op threads only add synchronisation (about 10x slower
                                       // on a busy two-core machine), so run single-threaded.
    tch::set_num_threads(1);

    let env = make_env(cfg.envs, cfg.seed, None)?;
    let stats = norm_stats(&env)?;
    let obs_dim = stats.0.size().last().copied().unwrap_or(3);

    let vs = nn::VarStore::new(Device::Cpu);
    let actor = make_actor(&vs.root().sub("actor"), &env, cfg.seed)?;
    let critic = make_critic(&vs.root().sub("critic"), obs_dim)?;
    let mut loss = ClipPPOLoss::new(actor, critic)
        .with_clip_epsilon(CLIP_EPSILON)?
        .with_entropy_coeff(ENTROPY_COEFF)?
        .with_critic_coeff(0.5)?
        .with_loss_critic_type(CriticLossType::L2)
        .with_normalize_advantage(true)
        .with_seed(cfg.seed);
    loss.make_value_estimator(Box::new(GAE::new(GAMMA, LMBDA)?))?;
    let mut opt = nn::Adam::default().build(&vs, LR)?;

    // An eval env with the same observation statistics; the baselines' scores.
    let eval_seed = cfg.seed + 1_000;
    let mut eval_env = make_env(cfg.envs, eval_seed, Some(stats))?;
    let random_return = evaluate(&mut eval_env, eval_seed, None)?;
    let untrained_return = {
        let mut policy = deterministic(loss.actor());
        evaluate(&mut eval_env, eval_seed, Some(&mut policy))?
    };

    // One batch = one whole episode per env (they all start together and are truncated at
    // 200 steps together).
    let frames_per_batch = cfg.envs * EPISODE_STEPS;
    let iters = usize::try_from((cfg.frames + frames_per_batch - 1) / frames_per_batch)
        .map_err(|e| fail(e.to_string()))?;
    // The collector runs the actor (Random exploration by default, with log-probs) under
    // no_grad. It borrows the loss's actor, whose weights the optimiser updates in place.
    let mut collector = Collector::new(
        env,
        loss.actor().as_policy(),
        frames_per_batch,
        Some(cfg.frames),
    )?;
    let mut buffer = ReplayBuffer::with_sampler(
        frames_per_batch,
        SamplerWithoutReplacement::new(cfg.seed, LastBatch::Drop),
    )?;

    if !cfg.quiet {
        println!(
            "PPO on Pendulum: {} envs, {frames_per_batch} frames per batch, {iters} iterations, \
             seed {}",
            cfg.envs, cfg.seed
        );
    }
    let bar = progress_bar(iters, cfg.quiet)?;
    let (mut first_train_return, mut last_train_return) = (f64::NAN, f64::NAN);
    let mut iter = 0;
    for batch in collector.by_ref() {
        let batch = batch?; // [envs, 200]
        iter += 1;

        // The returns of the episodes that ended in this batch, and the mean reward.
        let done = batch.get_or_err(("next", "done"))?;
        let episode_return = batch.get_or_err(("next", "episode_reward"))?;
        if done.f_any()?.f_int64_value(&[])? == 1 {
            last_train_return = episode_return
                .f_masked_select(done)?
                .f_mean(Kind::Double)?
                .f_double_value(&[])?;
            if first_train_return.is_nan() {
                first_train_return = last_train_return;
            }
        }
        let reward = batch
            .get_or_err(("next", "reward"))?
            .f_mean(Kind::Double)?
            .f_double_value(&[])?
            / REWARD_SCALE;

        // GAE over the whole batch (time is the last batch dim), with the loss's critic
        // under no_grad: writes "state_value" (root and "next"), "advantage", "value_target".
        let mut batch = batch;
        loss.compute_advantage(&mut batch)?;

        // Epochs of minibatches: the sampler hands out each transition once per epoch.
        buffer.clear();
        // [envs, time] → [envs * time] transitions (extend splits the first dim only)
        buffer.extend(&batch.reshape([-1])?)?;
        for _ in 0..EPOCHS {
            for _ in 0..frames_per_batch / MINIBATCH {
                let minibatch = buffer.sample(MINIBATCH)?;
                let out = loss.forward(&minibatch)?;
                step_with_grad_norm(&mut opt, &vs, &out.total_loss()?, MAX_GRAD_NORM)?;
            }
        }
        bar.set_message(format!(
            "frames {:>7} | episode return {last_train_return:>8.1} | reward/step {reward:>6.2}",
            iter as i64 * frames_per_batch
        ));
        bar.inc(1);
    }
    bar.finish();

    let mut policy = deterministic(loss.actor());
    let trained_return = evaluate(&mut eval_env, eval_seed, Some(&mut policy))?;
    Ok(Summary {
        frames: collector.frames(),
        first_train_return,
        last_train_return,
        random_return,
        untrained_return,
        trained_return,
    })
}

fn main() -> Result<()> {
    let cfg = Config::from_args()?;
    let start = Instant::now();
    let s = run(&cfg)?;
    let secs = start.elapsed().as_secs_f64();
    println!("== summary ({} frames, {secs:.1}s) ==", s.frames);
    println!(
        "training episodes (exploring): first batch {:.1}, last batch {:.1}",
        s.first_train_return, s.last_train_return
    );
    println!(
        "eval, mean return of {} episodes of {EPISODE_STEPS} steps (same seeds for each policy):",
        cfg.envs
    );
    println!("  random actions              {:>8.1}", s.random_return);
    println!("  untrained policy (determ.)  {:>8.1}", s.untrained_return);
    println!("  trained policy (determ.)    {:>8.1}", s.trained_return);
    println!(
        "  trained - random            {:>+8.1}",
        s.trained_return - s.random_return
    );
    if cfg.frames >= 50_000 && s.trained_return <= s.random_return {
        return Err(fail(format!(
            "no improvement: trained {:.1} vs random {:.1}",
            s.trained_return, s.random_return
        )));
    }
    Ok(())
}
