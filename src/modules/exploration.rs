//! Exploration modules (TorchRL's `torchrl.modules.tensordict_module.exploration`), placed
//! after a policy in a [`TensorDictSequential`](super::TensorDictSequential):
//! [`EGreedyModule`] (random actions from the spec with an annealed probability ε),
//! [`AdditiveGaussianModule`] (annealed Gaussian noise) and
//! [`OrnsteinUhlenbeckProcessModule`] (annealed temporally-correlated noise, reset where
//! `"is_init"` is set).
//!
//! Each acts only when this thread's [`exploration_type`](super::exploration_type) is
//! `Random` or unset (TorchRL: `RANDOM` or `None`); under `Deterministic`, `Mode` or `Mean`
//! it passes the tensordict through unchanged (evaluation). Annealing is explicit:
//! [`step(frames)`](EGreedyModule::step) moves the factor `frames` times by
//! `(init - end) / annealing_num_steps`, never below `end`. Noise comes from a seedable
//! [`Generator`] held by the module.
//!
//! ```
//! use tch::{Kind, Tensor};
//! use torchrl::data::specs::{Categorical, TensorSpec};
//! use torchrl::modules::{set_exploration_type, EGreedyModule, ExplorationType, TensorDictModule};
//! use torchrl::TensorDict;
//! # fn main() -> torchrl::Result<()> {
//! let spec = TensorSpec::from(Categorical::new(4)?);
//! let mut greedy = EGreedyModule::new(spec, 1.0, 0.0, 10)?.with_seed(0);
//! let td = TensorDict::new([64])?.with("action", Tensor::zeros([64], (Kind::Int64, tch::Device::Cpu)))?;
//! // ε = 1: every action is random (in [0, 4)); deterministic evaluation leaves them alone
//! let out = greedy.forward(td.clone())?;
//! assert!(out.get_or_err("action")?.ne(0).any().int64_value(&[]) == 1);
//! let eval = set_exploration_type(ExplorationType::Deterministic, || greedy.forward(td.clone()))?;
//! assert!(eval.get_or_err("action")?.eq(0).all().int64_value(&[]) == 1);
//! greedy.step(10); // annealed to ε_end = 0: the greedy action is kept
//! assert_eq!(greedy.eps(), 0.0);
//! assert!(greedy.forward(td)?.get_or_err("action")?.eq(0).all().int64_value(&[]) == 1);
//! # Ok(()) }
//! ```

use std::sync::Mutex;

use tch::{Kind, Tensor};

use super::module::{read_input, TensorDictModule};
use super::probabilistic::{exploration_type, ExplorationType};
use crate::data::specs::TensorSpec;
use crate::error::{Error, Result, ShapeFmt};
use crate::rng::Generator;
use crate::tensordict::{Entry, NestedKey, TensorDict};

/// Whether the exploration modules act now: `Random` or no type set (TorchRL's rule).
fn exploring() -> bool {
    matches!(exploration_type(), None | Some(ExplorationType::Random))
}

/// A factor annealed linearly from `init` to `end` over `num_steps` steps (float32
/// arithmetic, as TorchRL's buffers).
#[derive(Clone, Copy, Debug)]
struct Anneal {
    init: f32,
    end: f32,
    current: f32,
    num_steps: u64,
}

impl Anneal {
    fn new(
        op: &'static str,
        field: &'static str,
        init: f64,
        end: f64,
        num_steps: u64,
    ) -> Result<Self> {
        if !(init.is_finite() && end.is_finite()) || end > init {
            return Err(Error::config(
                op,
                field,
                "finite values with end <= init (the factor decreases over time or is constant)",
                format!("init = {init}, end = {end}"),
            ));
        }
        if num_steps == 0 {
            return Err(Error::config(
                op,
                "annealing_num_steps",
                "a positive number of steps",
                0,
            ));
        }
        Ok(Anneal {
            init: init as f32,
            end: end as f32,
            current: init as f32,
            num_steps,
        })
    }

    fn step(&mut self, frames: u64) {
        let delta = (self.init - self.end) / self.num_steps as f32;
        for _ in 0..frames {
            self.current = (self.current - delta).max(self.end);
            if self.current == self.end {
                break;
            }
        }
    }
}

fn lock(gen: &Mutex<Generator>) -> Result<std::sync::MutexGuard<'_, Generator>> {
    gen.lock()
        .map_err(|_| Error::invalid("exploration", "the module's generator lock is poisoned"))
}

/// The leading dims of `action` in front of `spec`'s shape (the shape to draw `spec.rand`
/// with), or an error when the action's trailing dims are not the spec's.
fn prefix_shape(
    op: &'static str,
    key: &NestedKey,
    spec: &TensorSpec,
    action: &Tensor,
) -> Result<Vec<i64>> {
    let a = action.size();
    let s = spec.shape();
    let split = a.len().checked_sub(s.len());
    match split.map(|k| a.split_at(k)) {
        Some((prefix, tail)) if tail == s => Ok(prefix.to_vec()),
        _ => Err(Error::value(
            op,
            key,
            format!(
                "an action whose trailing dims match the action spec's shape {}",
                ShapeFmt(s)
            ),
            format!("shape {}", ShapeFmt(&a)),
        )),
    }
}

fn project(spec: &TensorSpec, t: &Tensor) -> Result<Tensor> {
    match spec.project(&Entry::Tensor(t.shallow_clone()))? {
        Entry::Tensor(p) => Ok(p),
        Entry::Dict(_) => Err(Error::invalid("project", "the action spec is a Composite")),
    }
}

// ------------------------------------------------------------------------------- ε-greedy

/// ε-greedy exploration (TorchRL's `EGreedyModule`): with probability ε per batch element,
/// the action is replaced by a random one drawn from the action spec; ε is annealed from
/// `eps_init` to `eps_end` over `annealing_num_steps` calls of [`step`](Self::step).
///
/// Reads and writes `"action"` (and reads an optional action mask, TorchRL's
/// `action_mask_key`, whose `false` entries are never drawn).
#[derive(Debug)]
pub struct EGreedyModule {
    spec: TensorSpec,
    eps: Anneal,
    action_key: NestedKey,
    action_mask_key: Option<NestedKey>,
    gen: Mutex<Generator>,
}

impl EGreedyModule {
    /// TorchRL's defaults are `eps_init = 1.0`, `eps_end = 0.1`, `annealing_num_steps = 1000`.
    /// `spec` is the action's leaf spec (with or without the env's batch dims).
    ///
    /// Errors when `eps_end > eps_init`, a value is not finite, or `annealing_num_steps` is 0.
    pub fn new(
        spec: TensorSpec,
        eps_init: f64,
        eps_end: f64,
        annealing_num_steps: u64,
    ) -> Result<Self> {
        Ok(EGreedyModule {
            spec,
            eps: Anneal::new(
                "EGreedyModule",
                "eps_init",
                eps_init,
                eps_end,
                annealing_num_steps,
            )?,
            action_key: "action".into(),
            action_mask_key: None,
            gen: Mutex::new(Generator::new(0)),
        })
    }

    crate::macros::setters! {
        /// Where the action is read and written (default `"action"`).
        with_action_key(key: impl Into<NestedKey>) => action_key = key.into();
        /// A boolean mask of allowed actions, read at this key.
        with_action_mask_key(key: impl Into<NestedKey>) => action_mask_key = Some(key.into());
        /// Seeds the module's generator (default seed 0).
        with_seed(seed: u64) => gen = Mutex::new(Generator::new(seed));
    }

    /// The current ε.
    pub fn eps(&self) -> f64 {
        f64::from(self.eps.current)
    }

    /// Anneals ε `frames` times (TorchRL's `step(frames)`).
    pub fn step(&mut self, frames: u64) {
        self.eps.step(frames);
    }

    /// The action spec.
    pub fn spec(&self) -> &TensorSpec {
        &self.spec
    }
}

impl TensorDictModule for EGreedyModule {
    fn in_keys(&self) -> Vec<NestedKey> {
        let mut k = vec![self.action_key.clone()];
        k.extend(self.action_mask_key.iter().cloned());
        k
    }

    fn out_keys(&self) -> Vec<NestedKey> {
        vec![self.action_key.clone()]
    }

    fn forward(&self, mut td: TensorDict) -> Result<TensorDict> {
        if !exploring() {
            return Ok(td);
        }
        let op = "EGreedyModule";
        let action = read_input(op, &td, &self.action_key)?.shallow_clone();
        let prefix = prefix_shape(op, &self.action_key, &self.spec, &action)?;
        let mut gen = lock(&self.gen)?;
        let batch = td.batch_size().to_vec();
        let u = gen.uniform(&batch, 0.0, 1.0, Kind::Float, action.device())?;
        let mut cond = u.f_lt(f64::from(self.eps.current))?;
        while cond.dim() < action.dim() {
            cond = cond.f_unsqueeze(-1)?;
        }
        let random = match &self.action_mask_key {
            None => match self.spec.rand(&mut gen, &prefix)? {
                Entry::Tensor(t) => t,
                Entry::Dict(_) => return Err(Error::invalid(op, "the action spec is a Composite")),
            },
            Some(mask_key) => {
                // masked draws: uniform over the allowed entries of the last dim
                let mask = read_input(op, &td, mask_key)?.f_to_kind(Kind::Float)?;
                let noise = gen.uniform(&mask.size(), 0.0, 1.0, Kind::Float, action.device())?;
                let scores = noise.f_add(&mask.f_mul_scalar(2.0)?)?;
                let idx = scores.f_argmax(-1, false)?;
                match &self.spec {
                    TensorSpec::OneHot(_) => {
                        idx.f_one_hot(mask.size().last().copied().unwrap_or(1))?
                    }
                    _ => idx,
                }
            }
        };
        let random = random
            .f_to_kind(action.kind())?
            .f_to_device(action.device())?;
        let out = random.f_where_self(&cond, &action)?;
        td.set(&self.action_key, out)?;
        Ok(td)
    }
}

// ------------------------------------------------------------------------ additive gaussian

/// Additive Gaussian exploration (TorchRL's `AdditiveGaussianModule`):
/// `action ← project(action + σ·N(mean, std))`, σ annealed from `sigma_init` to `sigma_end`
/// over `annealing_num_steps` calls of [`step`](Self::step); the result is projected onto
/// the action spec (clamped to its bounds).
#[derive(Debug)]
pub struct AdditiveGaussianModule {
    spec: TensorSpec,
    sigma: Anneal,
    mean: f64,
    std: f64,
    action_key: NestedKey,
    gen: Mutex<Generator>,
}

impl AdditiveGaussianModule {
    /// TorchRL's defaults: `sigma_init = 1.0`, `sigma_end = 0.1`, `annealing_num_steps =
    /// 1000`, `mean = 0`, `std = 1` (see [`with_noise`](Self::with_noise)).
    pub fn new(
        spec: TensorSpec,
        sigma_init: f64,
        sigma_end: f64,
        annealing_num_steps: u64,
    ) -> Result<Self> {
        Ok(AdditiveGaussianModule {
            spec,
            sigma: Anneal::new(
                "AdditiveGaussianModule",
                "sigma_init",
                sigma_init,
                sigma_end,
                annealing_num_steps,
            )?,
            mean: 0.0,
            std: 1.0,
            action_key: "action".into(),
            gen: Mutex::new(Generator::new(0)),
        })
    }

    crate::macros::setters! {
        /// Where the action is read and written (default `"action"`).
        with_action_key(key: impl Into<NestedKey>) => action_key = key.into();
        /// Seeds the module's generator (default seed 0).
        with_seed(seed: u64) => gen = Mutex::new(Generator::new(seed));
    }

    /// The mean and std of the unscaled noise (default 0 and 1).
    pub fn with_noise(mut self, mean: f64, std: f64) -> Self {
        self.mean = mean;
        self.std = std;
        self
    }

    /// The current σ.
    pub fn sigma(&self) -> f64 {
        f64::from(self.sigma.current)
    }

    /// Anneals σ `frames` times.
    pub fn step(&mut self, frames: u64) {
        self.sigma.step(frames);
    }
}

impl TensorDictModule for AdditiveGaussianModule {
    fn in_keys(&self) -> Vec<NestedKey> {
        vec![self.action_key.clone()]
    }

    fn out_keys(&self) -> Vec<NestedKey> {
        vec![self.action_key.clone()]
    }

    fn forward(&self, mut td: TensorDict) -> Result<TensorDict> {
        if !exploring() {
            return Ok(td);
        }
        let op = "AdditiveGaussianModule";
        let action = read_input(op, &td, &self.action_key)?.shallow_clone();
        prefix_shape(op, &self.action_key, &self.spec, &action)?;
        let noise = lock(&self.gen)?.normal(
            &action.size(),
            self.mean,
            self.std,
            action.kind(),
            action.device(),
        )?;
        let noisy = action.f_add(&noise.f_mul_scalar(f64::from(self.sigma.current))?)?;
        td.set(&self.action_key, project(&self.spec, &noisy)?)?;
        Ok(td)
    }
}

// ---------------------------------------------------------------------- ornstein-uhlenbeck

/// Ornstein-Uhlenbeck exploration (TorchRL's `OrnsteinUhlenbeckProcessModule`).
///
/// The process state lives in the tensordict, under `"_ou_prev_noise"` (the noise, action
/// shaped) and `"_ou_steps"` (`Int64`, batch shaped), so that it travels with the data like
/// TorchRL's: where `"is_init"` (written by [`InitTracker`](crate::envs::transforms::InitTracker))
/// is set, or when no state is present yet, the noise and step count restart at 0. At each
/// call
///
/// - `n = prev + θ·(μ - prev)·dt + σ(steps)·√dt·N(0, 1)`, with
///   `σ(k) = max(σ_min, σ + k·(σ_min - σ)/n_steps_annealing)` (constant without `σ_min`);
/// - `action ← action + ε·n` (ε annealed from `eps_init` to `eps_end` by
///   [`step`](Self::step)), projected onto the spec (`safe`, TorchRL's default);
/// - the noise and `steps + 1` are written back.
#[derive(Debug)]
pub struct OrnsteinUhlenbeckProcessModule {
    spec: TensorSpec,
    eps: Anneal,
    theta: f64,
    mu: f64,
    sigma: f64,
    dt: f64,
    x0: f64,
    sigma_min: Option<f64>,
    n_steps_annealing: u64,
    safe: bool,
    action_key: NestedKey,
    is_init_key: NestedKey,
    gen: Mutex<Generator>,
}

impl OrnsteinUhlenbeckProcessModule {
    /// The key of the process's noise in the tensordict.
    pub const NOISE_KEY: &'static str = "_ou_prev_noise";
    /// The key of the process's step count in the tensordict.
    pub const STEPS_KEY: &'static str = "_ou_steps";

    /// TorchRL's defaults: `eps_init = 1`, `eps_end = 0.1`, `annealing_num_steps = 1000`,
    /// `θ = 0.15`, `μ = 0`, `σ = 0.2`, `dt = 0.01`, `x0 = 0`, no `σ_min`,
    /// `n_steps_annealing = 1000`, `safe = true`.
    pub fn new(
        spec: TensorSpec,
        eps_init: f64,
        eps_end: f64,
        annealing_num_steps: u64,
    ) -> Result<Self> {
        Ok(OrnsteinUhlenbeckProcessModule {
            spec,
            eps: Anneal::new(
                "OrnsteinUhlenbeckProcessModule",
                "eps_init",
                eps_init,
                eps_end,
                annealing_num_steps,
            )?,
            theta: 0.15,
            mu: 0.0,
            sigma: 0.2,
            dt: 1e-2,
            x0: 0.0,
            sigma_min: None,
            n_steps_annealing: 1000,
            safe: true,
            action_key: "action".into(),
            is_init_key: "is_init".into(),
            gen: Mutex::new(Generator::new(0)),
        })
    }

    crate::macros::setters! {
        /// θ, the pull towards μ (default 0.15).
        with_theta(theta: f64);
        /// μ, the long-run mean (default 0).
        with_mu(mu: f64);
        /// σ, the noise scale (default 0.2).
        with_sigma(sigma: f64);
        /// The time step (default 0.01).
        with_dt(dt: f64);
        /// The process's origin (default 0).
        with_x0(x0: f64);
        /// Anneals σ to `sigma_min` over `n_steps_annealing` process steps.
        with_sigma_min(sigma_min: f64) => sigma_min = Some(sigma_min);
        /// The process steps over which σ is annealed (default 1000).
        with_n_steps_annealing(n_steps_annealing: u64);
        /// Whether the action is projected onto the spec (default `true`).
        with_safe(safe: bool);
        /// Where the action is read and written (default `"action"`).
        with_action_key(key: impl Into<NestedKey>) => action_key = key.into();
        /// Where the reset flag is read (default `"is_init"`).
        with_is_init_key(key: impl Into<NestedKey>) => is_init_key = key.into();
        /// Seeds the module's generator (default seed 0).
        with_seed(seed: u64) => gen = Mutex::new(Generator::new(seed));
    }

    /// The current ε.
    pub fn eps(&self) -> f64 {
        f64::from(self.eps.current)
    }

    /// Anneals ε `frames` times.
    pub fn step(&mut self, frames: u64) {
        self.eps.step(frames);
    }

    fn current_sigma(&self, steps: &Tensor) -> Result<Tensor> {
        let (m, min) = match self.sigma_min {
            Some(min) => (
                -(self.sigma - min) / self.n_steps_annealing.max(1) as f64,
                min,
            ),
            None => (0.0, self.sigma),
        };
        Ok(steps
            .f_mul_scalar(m)?
            .f_add_scalar(self.sigma)?
            .f_clamp_min(min)?)
    }
}

/// Expands `t` (`[*B]`) with trailing singleton dims to `like`'s rank.
fn expand_right(t: &Tensor, like: &Tensor) -> Result<Tensor> {
    let mut t = t.shallow_clone();
    while t.dim() < like.dim() {
        t = t.f_unsqueeze(-1)?;
    }
    Ok(t)
}

impl TensorDictModule for OrnsteinUhlenbeckProcessModule {
    fn in_keys(&self) -> Vec<NestedKey> {
        vec![self.action_key.clone()]
    }

    fn out_keys(&self) -> Vec<NestedKey> {
        vec![
            self.action_key.clone(),
            NestedKey::from(Self::NOISE_KEY),
            NestedKey::from(Self::STEPS_KEY),
        ]
    }

    fn forward(&self, mut td: TensorDict) -> Result<TensorDict> {
        if !exploring() {
            return Ok(td);
        }
        let op = "OrnsteinUhlenbeckProcessModule";
        let action = read_input(op, &td, &self.action_key)?.shallow_clone();
        let batch = td.batch_size().to_vec();
        let (mut noise, mut steps) = match (td.get(Self::NOISE_KEY), td.get(Self::STEPS_KEY)) {
            (Some(n), Some(s)) => (n.copy(), s.copy()),
            _ => (
                action.f_zeros_like()?,
                Tensor::f_zeros(&batch, (Kind::Int64, action.device()))?,
            ),
        };
        if let Some(init) = td.get(&self.is_init_key) {
            let mut init = init.f_to_kind(Kind::Bool)?;
            if init.dim() > batch.len() {
                // `[*B, 1]` (the done spec's shape): any flag along the trailing dims
                let dims: Vec<i64> = (batch.len() as i64..init.dim() as i64).collect();
                init = init.f_any_dims(dims.as_slice(), false)?;
            }
            if init.size() != batch {
                return Err(Error::value(
                    op,
                    &self.is_init_key,
                    format!(
                        "a flag of the tensordict's batch shape {}",
                        ShapeFmt(&batch)
                    ),
                    format!("shape {}", ShapeFmt(&init.size())),
                ));
            }
            noise = noise.f_masked_fill(&expand_right(&init, &noise)?, 0.0)?;
            steps = steps.f_masked_fill(&init, 0)?;
        }
        let prev = noise.f_add_scalar(self.x0)?;
        let randn = lock(&self.gen)?.normal(&prev.size(), 0.0, 1.0, prev.kind(), prev.device())?;
        let sigma = expand_right(&self.current_sigma(&steps)?.f_to_kind(prev.kind())?, &prev)?;
        let next = prev
            .f_add(
                &prev
                    .f_rsub_scalar(self.mu)?
                    .f_mul_scalar(self.theta * self.dt)?,
            )?
            .f_add(&sigma.f_mul_scalar(self.dt.sqrt())?.f_mul(&randn)?)?;
        let mut new_action = action.f_add(&next.f_mul_scalar(f64::from(self.eps.current))?)?;
        if self.safe {
            new_action = project(&self.spec, &new_action)?;
        }
        let mut staged = td.clone();
        staged.set(Self::NOISE_KEY, next.f_sub_scalar(self.x0)?)?;
        staged.set(&self.action_key, new_action)?;
        staged.set(Self::STEPS_KEY, steps.f_add_scalar(1)?)?;
        td = staged;
        Ok(td)
    }
}
