//! `PendulumEnv`: gymnasium's `Pendulum-v1` (inverted pendulum swing-up), batched and
//! tensor-native.
//!
//! | key | spec | shape | dtype |
//! |-----|------|-------|-------|
//! | `"observation"` | `Bounded([-1, -1, -8], [1, 1, 8])`: `[cos θ, sin θ, θ̇]` | `[*B, 3]` | float32 |
//! | `"action"` | `Bounded(-2, 2)`: the torque | `[*B, 1]` | float32 |
//! | `"reward"` | `Unbounded`: `-(norm(θ)² + 0.1 θ̇² + 0.001 u²)` | `[*B, 1]` | float32 |
//! | `"done"`, `"terminated"` | always false (Pendulum never terminates) | `[*B, 1]` | bool |
//! | `"state"` (state spec) | `Unbounded`: `[θ, θ̇]` | `[*B, 2]` | float64 |
//!
//! Dynamics, constants (`g = 10`, `m = l = 1`, `dt = 0.05`, `|θ̇| ≤ 8`, `|u| ≤ 2`, out-of-range
//! torques are clipped) and the initial distribution (`θ ~ U[-π, π)`, `θ̇ ~ U[-1, 1)`, drawn
//! with [`EnvCore::generator`], so [`EnvBase::set_seed`] makes resets reproducible) are
//! gymnasium's. Gymnasium's `TimeLimit` (200 steps) is **not** part of the env: add a
//! `StepCounter` transform for it.
//!
//! **Actions** must have shape `[*B, 1]` and a float dtype (cast to float32, the dtype of
//! gymnasium's action space); another shape, an integer or bool dtype, or a missing
//! `"action"` is an error ([`Error::ShapeMismatch`](crate::Error::ShapeMismatch),
//! [`Error::DtypeMismatch`](crate::Error::DtypeMismatch), [`Error::KeyNotFound`](crate::Error::KeyNotFound)).
//!
//! **State.** The physical state `[θ, θ̇]` is kept in float64, as gymnasium keeps it: the
//! pendulum amplifies rounding errors (near the upright position they grow by e^3.9 per
//! second), and float32 dynamics drift from gymnasium's by more than 1e-4 within 50 steps.
//! Observations, actions and rewards are float32, as gymnasium's spaces and TorchRL's
//! `GymEnv` have them. The state is written as `"state"` by every reset and step (not part of
//! the observation spec: `check_env_specs` ignores `("next", "state")`), so the root of each
//! rollout step holds the state that step started from.
//!
//! **Resetting to a given state.** `reset` with a tensordict holding `"state"` (`[*B, 2]`, any
//! float dtype) starts from that state instead of sampling. A `"_reset"` mask selects the
//! elements to reset: they start from the given `"state"` (its other elements are not read),
//! or from fresh samples when the tensordict has no `"state"`; the other elements keep their
//! state. The non-stop rollout loop (`step_and_maybe_reset`) hands the env only the masks, so
//! done elements get fresh samples there; to re-sample some elements yourself, pass the mask
//! without a `"state"` (a root returned by `step_mdp` carries the current state, which would
//! otherwise be the state those elements are reset to).
//!
//! ```
//! use tch::{Device, Tensor};
//! use torchrl::envs::builtin::PendulumEnv;
//! use torchrl::envs::{check_env_specs, EnvBase, RolloutConfig};
//! use torchrl::TensorDict;
//! # fn main() -> torchrl::Result<()> {
//! let mut env = PendulumEnv::new(&[4], Device::Cpu)?;
//! env.set_seed(0)?;
//! let traj = env.rollout(10, None, &RolloutConfig::default())?;
//! assert_eq!(traj.batch_size(), &[4, 10]); // never terminates
//! assert_eq!(traj.get_or_err(("next", "observation"))?.size(), vec![4, 10, 3]);
//! check_env_specs(&mut env, Some(0))?;
//!
//! // Upright and at rest, with no torque: stays there, reward 0.
//! let mut single = PendulumEnv::new(&[], Device::Cpu)?;
//! let start = TensorDict::new([])?.with("state", Tensor::from_slice(&[0.0f64, 0.0]))?;
//! let td = single.reset(Some(start))?;
//! let td = single.step(td.with("action", Tensor::from_slice(&[0.0f32]))?)?;
//! assert_eq!(td.get_or_err(("next", "reward"))?.double_value(&[0]), 0.0);
//! assert_eq!(td.get_or_err(("next", "observation"))?.double_value(&[0]), 1.0); // cos θ
//! # Ok(()) }
//! ```

use crate::kind::is_float;
use std::f64::consts::PI;
use std::mem::MaybeUninit;

use tch::{Device, Kind, Tensor};

use crate::data::specs::{Bounded, Unbounded};
use crate::envs::{EnvBase, EnvCore, EnvSpecs};
use crate::error::{Error, Result};
use crate::rng::Generator;
use crate::tensordict::host::{HostBuf, HostOut};
use crate::tensordict::{NestedKey, TensorDict};

const MAX_SPEED: f64 = 8.0;
const MAX_TORQUE: f64 = 2.0;
const DT: f64 = 0.05;
const G: f64 = 10.0;
const M: f64 = 1.0;
const L: f64 = 1.0;

/// Gymnasium's `Pendulum-v1`, batched. See the module docs.
pub struct PendulumEnv {
    core: EnvCore,
    /// `[θ, θ̇]`: a tensor after a reset or a tensor step, host values after a host step.
    state: State,
    /// Buffers the host step reuses from one step to the next (no allocation per step).
    spare: Spare,
}

/// The host step's reusable vectors (states, sines, cosines), taken with [`Spare::take`] and
/// given back with [`Spare::put`]. Filled when the env is built (for batches on the host path)
/// and kept across resets, so that rollouts allocate none of them: long-lived vectors allocated
/// in the middle of a rollout would split the free memory that the next rollout's steps and
/// stack reuse, and the stack would then take fresh pages (a page fault per 4 KiB).
#[derive(Default)]
struct Spare {
    pool: Vec<Vec<f64>>,
    /// The torques read from the actions.
    u: Vec<f32>,
    /// The scratch tensors of the libtorch `sin` / `cos` (batches above [`LIBM_TRIG_MAX`]).
    trig: Option<Trig>,
}

impl Spare {
    /// Vectors for two host states of `n` pendulums (the current one and the next) and the
    /// cosines.
    fn for_batch(n: usize) -> Self {
        let sizes = [2 * n, 2 * n, n, n, n];
        Spare {
            pool: sizes.iter().map(|&len| vec![0.0; len]).collect(),
            u: vec![0.0; n],
            trig: None,
        }
    }

    /// A vector of `len` values (their contents unspecified): the smallest pooled one that
    /// holds them, or a new one.
    fn take(&mut self, len: usize) -> Vec<f64> {
        let best = self
            .pool
            .iter()
            .enumerate()
            .filter(|(_, v)| v.capacity() >= len)
            .min_by_key(|(_, v)| v.capacity())
            .map(|(i, _)| i);
        let mut v = best.map(|i| self.pool.swap_remove(i)).unwrap_or_default();
        v.resize(len, 0.0);
        v
    }

    /// Gives a vector back (at most 8 are kept).
    fn put(&mut self, v: Vec<f64>) {
        if self.pool.len() < 8 {
            self.pool.push(v);
        }
    }

    /// Keeps the vectors of a replaced host state.
    fn recycle(&mut self, old: State) {
        if let State::Host(h) = old {
            self.put(h.state);
            self.put(h.sin_th);
        }
    }
}

/// Where the current state `[θ, θ̇]` lives. The host step keeps it as host values only (a
/// state tensor per step that nothing reads would cost a tensor construction); a tensor is
/// built from them when something needs one ([`PendulumEnv::state_tensor`]).
enum State {
    /// `[*B, 2]` float64. Never written in place (each step and reset sets a new tensor).
    Tensor(Tensor),
    /// The host step's state.
    Host(HostState),
}

impl PendulumEnv {
    /// A pendulum env with batch size `batch_size` (`&[]` for a single pendulum) on `device`.
    /// The state starts as a sample of the initial distribution; call
    /// [`EnvBase::reset`] (after [`EnvBase::set_seed`]) before stepping.
    pub fn new(batch_size: &[i64], device: Device) -> Result<Self> {
        let b1: Vec<i64> = [batch_size, &[1]].concat();
        let b2: Vec<i64> = [batch_size, &[2]].concat();
        let b3: Vec<i64> = [batch_size, &[3]].concat();
        let high = Tensor::f_from_slice(&[1.0f32, 1.0, MAX_SPEED as f32])?
            .f_expand(b3.as_slice(), false)?
            .f_contiguous()?;
        let low = high.f_neg()?;
        let specs = EnvSpecs::new(batch_size)?
            .with_observation("observation", Bounded::from_tensors(low, high)?)?
            .with_action("action", Bounded::new(-MAX_TORQUE, MAX_TORQUE, &b1)?)?
            .with_reward("reward", Unbounded::new().with_shape(&b1)?)?
            .with_state(
                STATE_KEY,
                Unbounded::new().with_shape(&b2)?.with_dtype(Kind::Double)?,
            )?
            .with_device(device)?;
        let core = EnvCore::new(specs)?;
        let state = Self::sample(&mut core.generator.clone(), batch_size, device)?;
        let n = batch_size.iter().product::<i64>().max(0) as usize;
        Ok(PendulumEnv {
            core,
            state: State::Tensor(state),
            spare: if device == Device::Cpu && n <= HOST_PATH_MAX {
                Spare::for_batch(n)
            } else {
                Spare::default()
            },
        })
    }

    /// The current state `[θ, θ̇]` (`[*B, 2]`, float64), a copy.
    pub fn state(&self) -> Result<Tensor> {
        match &self.state {
            State::Tensor(t) => Ok(t.f_detach_copy()?),
            State::Host(h) => h.tensor(self.core.specs().batch_size()),
        }
    }

    /// The current state as a tensor (`[*B, 2]` float64, shared with the env: not to be written
    /// in place), built from the host values after a host step.
    fn state_tensor(&self) -> Result<Tensor> {
        match &self.state {
            State::Tensor(t) => Ok(t.shallow_clone()),
            State::Host(h) => h.tensor(self.core.specs().batch_size()),
        }
    }

    /// Gymnasium's initial distribution: `θ ~ U[-π, π)`, `θ̇ ~ U[-1, 1)`.
    fn sample(gen: &mut Generator, batch: &[i64], device: Device) -> Result<Tensor> {
        let shape: Vec<i64> = [batch, &[2]].concat();
        let high = Tensor::f_from_slice(&[PI, 1.0])?.f_expand(shape.as_slice(), false)?;
        let low = high.f_neg()?;
        Ok(gen.uniform_tensor(&low, &high)?.f_to_device(device)?)
    }

    fn output(&self, reward: Option<Tensor>) -> Result<TensorDict> {
        let state = self.state_tensor()?;
        let th = state.f_narrow(-1, 0, 1)?;
        let thdot = state.f_narrow(-1, 1, 1)?;
        let obs = Tensor::f_cat(&[th.f_cos()?, th.f_sin()?, thdot], -1)?.f_to_kind(Kind::Float)?;
        let done = Tensor::f_zeros(th.size(), (Kind::Bool, th.device()))?;
        let mut td = TensorDict::new(self.core.specs().batch_size())?
            .with("observation", obs)?
            .with(STATE_KEY, state.f_detach_copy()?)?
            .with("done", done.shallow_clone())?
            .with("terminated", done)?;
        if let Some(r) = reward {
            td.set("reward", r)?;
        }
        Ok(td)
    }
}

impl PendulumEnv {
    /// The step on host values (CPU batches up to [`HOST_PATH_MAX`]): the same arithmetic as
    /// the tensor path (float64 dynamics, gymnasium's float32 rounding points) on plain `f64`s.
    /// One read of the actions and five tensor constructions replace ~25 libtorch ops, whose
    /// fixed cost (1–2 µs each) dominates a step up to thousands of pendulums: at 1024
    /// pendulums this step takes ~25 µs, the tensor step ~45 µs.
    ///
    /// The trigonometry is one [`sin_cos`] of the new angles (the observation needs both; the
    /// sines are kept in [`HostState`] for the next step's `sin θ`) and the angle
    /// normalisation avoids `fmod` ([`rem_tau`]).
    fn step_host(&mut self, action: &Tensor) -> Result<TensorDict> {
        let batch = self.core.specs().batch_size().to_vec();
        let n = action.numel();
        let mut u = std::mem::take(&mut self.spare.u);
        u.resize(n, 0.0);
        action.f_copy_data(&mut u, n)?;
        let mut read = None;
        let prev = match &self.state {
            State::Host(h) => h,
            State::Tensor(t) => &*read.insert(HostState::read(t, &mut self.spare)?),
        };
        if prev.state.len() != 2 * n || prev.sin_th.len() != n {
            return Err(Error::invalid(
                "PendulumEnv::step",
                format!(
                    "internal: {n} actions for a state of {} values",
                    prev.state.len()
                ),
            ));
        }
        let b1: Vec<i64> = [batch.as_slice(), &[1]].concat();
        let b2: Vec<i64> = [batch.as_slice(), &[2]].concat();
        let b3: Vec<i64> = [batch.as_slice(), &[3]].concat();
        // Every output below has exactly `n` rows (the lengths were checked above), so each
        // loop writes every slot of its `HostOut`.
        let mut state = self.spare.take(2 * n);
        let mut reward = HostOut::<f32>::new(&b1)?;
        let mut state_out = HostOut::<f64>::new(&b2)?;
        let kernels = host_kernels();
        kernels.dynamics(DynamicsIo {
            u: &u,
            prev: &prev.state,
            sin_th: &prev.sin_th,
            state: &mut state,
            out: state_out.slots(),
            reward: reward.slots(),
        });
        let mut sin = self.spare.take(n);
        let mut cos = self.spare.take(n);
        sin_cos(&state, &mut sin, &mut cos, &mut self.spare.trig)?;
        let mut obs = HostOut::<f32>::new(&b3)?;
        kernels.observe(&cos, &sin, &state, obs.slots());
        self.spare.put(cos);
        self.spare.u = u;
        let old = std::mem::replace(
            &mut self.state,
            State::Host(HostState { state, sin_th: sin }),
        );
        self.spare.recycle(old);
        if let Some(r) = read {
            self.spare.recycle(State::Host(r));
        }
        let done = Tensor::f_zeros(b1.as_slice(), (Kind::Bool, Device::Cpu))?;
        TensorDict::new(&batch)?
            .with("observation", obs.into_tensor())?
            .with(STATE_KEY, state_out.into_tensor())?
            .with("done", done.shallow_clone())?
            .with("terminated", done)?
            .with("reward", reward.into_tensor())
    }

    /// The step with tensor ops (other devices, and CPU batches above [`HOST_PATH_MAX`]).
    ///
    /// Written for few ops (each costs 1–2 µs at 1024 pendulums on the CPU, more than its
    /// arithmetic): in-place ops on fresh buffers, the float32 → float64 casts left to type
    /// promotion (exact, as the explicit casts were), the negated cost built from negated
    /// terms (IEEE negation is exact, so `-(0.1 θ̇²) - norm²` is `-(norm² + 0.1 θ̇²)` bit for
    /// bit) and written to the float32 reward by its last op, and the new state and
    /// observation columns written in place by `out=` ops instead of `cat`s.
    fn step_tensor(&mut self, a: &Tensor) -> Result<TensorDict> {
        let specs = self.core.specs();
        let batch = specs.batch_size();
        let dev = specs.device();
        let b1: Vec<i64> = [batch, &[1]].concat();
        let b2: Vec<i64> = [batch, &[2]].concat();
        let b3: Vec<i64> = [batch, &[3]].concat();
        // gymnasium: u = clip(u, -2, 2) is float32, and so are 3.0 * u and 0.001 * u**2.
        let u = a.f_clamp(-MAX_TORQUE, MAX_TORQUE)?;
        let torque_term = u.f_mul_scalar(3.0 / (M * L * L))?;
        let torque_cost = u.f_square()?.f_mul_scalar_(0.001)?;
        let current = self.state_tensor()?;
        let th = current.f_narrow(-1, 0, 1)?;
        let thdot = current.f_narrow(-1, 1, 1)?;
        // angle_normalize(th) = ((th + pi) % (2 pi)) - pi
        let norm = th
            .f_add_scalar(PI)?
            .f_remainder_(2.0 * PI)?
            .f_sub_scalar_(PI)?;
        // reward = -(norm² + 0.1 θ̇² + 0.001 u²) = (-(0.1 θ̇²) - norm²) - 0.001 u², in float64
        // and rounded once to float32 by the `sub_out` into the float32 buffer.
        let reward = thdot
            .f_square()?
            .f_mul_scalar_(-0.1)?
            .f_sub_(&norm.f_square()?)?
            .f_sub_out(
                &Tensor::f_empty(b1.as_slice(), (Kind::Float, dev))?,
                &torque_cost,
            )?;
        // new θ̇ = clip(θ̇ + (15 sin θ + 3u) dt, -8, 8), written into the new state's column.
        let state = Tensor::f_empty(b2.as_slice(), (Kind::Double, dev))?;
        let new_thdot = th
            .f_sin()?
            .f_mul_scalar_(3.0 * G / (2.0 * L))?
            .f_add_(&torque_term)?
            .f_mul_scalar_(DT)?
            .f_add_(&thdot)?
            .f_clamp_out(&state.f_narrow(-1, 1, 1)?, -MAX_SPEED, MAX_SPEED)?;
        let new_th = th.f_add_out(&state.f_narrow(-1, 0, 1)?, &new_thdot.f_mul_scalar(DT)?)?;
        // observation = [cos θ, sin θ, θ̇] in float64, then one cast to float32.
        let obs = Tensor::f_empty(b3.as_slice(), (Kind::Double, dev))?;
        let _ = new_th.f_cos_out(&obs.f_narrow(-1, 0, 1)?)?;
        let _ = new_th.f_sin_out(&obs.f_narrow(-1, 1, 1)?)?;
        obs.f_narrow(-1, 2, 1)?.f_copy_(&new_thdot)?;
        let done = Tensor::f_zeros(b1.as_slice(), (Kind::Bool, dev))?;
        let td = TensorDict::new(batch)?
            .with("observation", obs.f_to_kind(Kind::Float)?)?
            .with(STATE_KEY, state.f_detach_copy()?)?
            .with("done", done.shallow_clone())?
            .with("terminated", done)?
            .with("reward", reward)?;
        let old = std::mem::replace(&mut self.state, State::Tensor(state));
        self.spare.recycle(old);
        Ok(td)
    }
}

/// The slices of [`HostKernels::dynamics`], one row per pendulum: the torques `u`, the state
/// pairs `prev` `[θ, θ̇]` and their `sin θ` in; the new state pairs (kept in `state`, written
/// out to `out`) and the rewards out. Shorter slices stop the loop.
struct DynamicsIo<'a> {
    u: &'a [f32],
    prev: &'a [f64],
    sin_th: &'a [f64],
    state: &'a mut [f64],
    out: &'a mut [MaybeUninit<f64>],
    reward: &'a mut [MaybeUninit<f32>],
}

/// The host step's two loops, compiled for the CPU at hand (see [`host_kernels`]).
#[derive(Clone, Copy)]
enum HostKernels {
    /// Baseline x86-64 (or another architecture).
    Portable,
    /// x86-64 with AVX2 and FMA, detected at run time.
    #[cfg(target_arch = "x86_64")]
    Avx2Fma,
}

/// The host kernels for this CPU: on x86-64 CPUs with AVX2 and FMA, copies of the loops
/// compiled for those features, where the fused multiply-add of [`rem_tau`] is one instruction
/// (elsewhere a call into compiler-builtins' software-dispatched `fma`, which keeps the loop
/// scalar and spills) and the loops vectorize. The results are the same bit for bit: every
/// operation is IEEE-exact or correctly rounded in both, and truncation by `round` or by an
/// integer conversion agree where they are used (checked by the tests below).
fn host_kernels() -> HostKernels {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        return HostKernels::Avx2Fma;
    }
    HostKernels::Portable
}

impl HostKernels {
    /// The per-pendulum arithmetic of a host step (see [`DynamicsIo`]).
    fn dynamics(self, io: DynamicsIo<'_>) {
        match self {
            HostKernels::Portable => dynamics_any::<false>(io),
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Avx2Fma` is only built after detecting AVX2 and FMA (`host_kernels`).
            HostKernels::Avx2Fma => unsafe { dynamics_avx2_fma(io) },
        }
    }

    /// Writes the observations `[cos θ, sin θ, θ̇]` as float32 rows, from the cosines, sines
    /// and state pairs.
    fn observe(self, cos: &[f64], sin: &[f64], state: &[f64], obs: &mut [MaybeUninit<f32>]) {
        match self {
            HostKernels::Portable => observe_any(cos, sin, state, obs),
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as in `dynamics`.
            HostKernels::Avx2Fma => unsafe { observe_avx2(cos, sin, state, obs) },
        }
    }
}

/// [`dynamics_any`] compiled with AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn dynamics_avx2_fma(io: DynamicsIo<'_>) {
    dynamics_any::<true>(io);
}

/// [`observe_any`] compiled with AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn observe_avx2(cos: &[f64], sin: &[f64], state: &[f64], obs: &mut [MaybeUninit<f32>]) {
    observe_any(cos, sin, state, obs);
}

/// The loop of [`HostKernels::dynamics`]: on `rem_tau`'s fast path when every angle allows it
/// (truncating with `f64::trunc` when `ROUND`, one instruction where SSE4.1 is enabled), else
/// with the general [`rem_tau`].
#[inline(always)]
fn dynamics_any<const ROUND: bool>(io: DynamicsIo<'_>) {
    // |θ + π| < 2^40 for every angle (false for NaN): rem_tau's fast path applies throughout.
    // Checked on the velocities too (bounded by 8 after a step) and with a fold, not `all`: a
    // contiguous loop without early exit vectorizes.
    let small = io
        .prev
        .iter()
        .fold(true, |ok, x| ok & (x.abs() < REM_TAU_FAST_MAX / 2.0));
    if small {
        dynamics_kernel(io, rem_tau_small::<ROUND>);
    } else {
        dynamics_kernel(io, rem_tau);
    }
}

/// The loop of [`HostKernels::dynamics`], with the angle remainder `rem`.
#[inline(always)]
fn dynamics_kernel(io: DynamicsIo<'_>, rem: impl Fn(f64) -> f64) {
    let rows =
        io.u.iter()
            .zip(io.prev.chunks_exact(2))
            .zip(io.sin_th)
            .zip(io.state.chunks_exact_mut(2))
            .zip(io.out.chunks_exact_mut(2))
            .zip(io.reward.iter_mut());
    for (((((ui, s), sin_th), st), o), r) in rows {
        let (&[th, thdot], [st_th, st_thdot], [o_th, o_thdot]) = (s, st, o) else {
            continue;
        };
        // gymnasium: u = clip(u, -2, 2) is float32, and so are 3.0 * u and 0.001 * u**2.
        let ui = ui.clamp(-MAX_TORQUE as f32, MAX_TORQUE as f32);
        let torque_term = f64::from(ui * (3.0 / (M * L * L)) as f32);
        let torque_cost = f64::from(ui * ui * 0.001f32);
        let norm = rem(th + PI) - PI;
        let cost = norm * norm + thdot * thdot * 0.1 + torque_cost;
        let accel = sin_th * (3.0 * G / (2.0 * L)) + torque_term;
        let thdot = (thdot + accel * DT).clamp(-MAX_SPEED, MAX_SPEED);
        let th = th + thdot * DT;
        *st_th = th;
        *st_thdot = thdot;
        o_th.write(th);
        o_thdot.write(thdot);
        r.write(-cost as f32);
    }
}

/// The loop of [`HostKernels::observe`].
#[inline(always)]
fn observe_any(cos: &[f64], sin: &[f64], state: &[f64], obs: &mut [MaybeUninit<f32>]) {
    let rows = obs
        .chunks_exact_mut(3)
        .zip(cos.iter().zip(sin))
        .zip(state.chunks_exact(2));
    for ((o, (c, s)), st) in rows {
        if let ([oc, os, ot], [_, thdot]) = (o, st) {
            oc.write(*c as f32);
            os.write(*s as f32);
            ot.write(*thdot as f32);
        }
    }
}

/// The host step's copy of the state and of `sin θ`. Valid while it mirrors
/// [`PendulumEnv`]'s `state` tensor: the host step replaces both, and everything else that sets
/// the state (resets, the tensor step) drops it.
struct HostState {
    /// `[θ₀, θ̇₀, θ₁, θ̇₁, …]`: the values of the state tensor.
    state: Vec<f64>,
    /// `sin θᵢ`, from the step that produced `θᵢ` (it computed `sin_cos(θᵢ)` for the
    /// observation), so a step costs one `sin_cos` per pendulum instead of a `sin` and a
    /// `sin_cos`.
    sin_th: Vec<f64>,
}

impl HostState {
    /// The state as a fresh `[*B, 2]` float64 CPU tensor.
    fn tensor(&self, batch: &[i64]) -> Result<Tensor> {
        let shape: Vec<i64> = [batch, &[2]].concat();
        Ok(Tensor::f_from_data_size(
            &f64_bytes(&self.state),
            &shape,
            Kind::Double,
        )?)
    }

    /// Reads a `[*B, 2]` float64 CPU state tensor (after a reset: once per episode).
    /// (Its vectors come from `spare`.)
    fn read(t: &Tensor, spare: &mut Spare) -> Result<Self> {
        let numel = t.numel();
        let n = numel / 2;
        let mut state = spare.take(numel);
        t.f_copy_data(&mut state, numel)?;
        let mut sin_th = spare.take(n);
        let mut cos = spare.take(n);
        sin_cos(&state, &mut sin_th, &mut cos, &mut spare.trig)?;
        spare.put(cos);
        Ok(HostState { state, sin_th })
    }
}

/// Batches of more than this many angles take their sines and cosines from libtorch's
/// vectorized `sin` and `cos` (MKL VML or SLEEF, ≤ 1 ulp), smaller ones from libm's `sin_cos`
/// (≤ 1 ulp). Each batch size thus keeps the trigonometry it had when only batches of up to 64
/// pendulums stepped on host values: the tensor step's kernels above 64 (so the host step gives
/// the tensor step's results bit for bit there), libm up to 64. At 1024 angles with the spread
/// of a rollout, libm costs ~12–25 ns per angle (its range reduction branches defeat the branch
/// predictor), the two tensor ops and the copies ~5 µs in all.
const LIBM_TRIG_MAX: usize = 64;

/// `sin θ` and `cos θ` of the angles of the state pairs `state` (`[θ₀, θ̇₀, θ₁, …]`), into
/// `sin` and `cos` (one per pendulum; see [`LIBM_TRIG_MAX`]).
fn sin_cos(state: &[f64], sin: &mut [f64], cos: &mut [f64], trig: &mut Option<Trig>) -> Result<()> {
    let n = sin.len();
    if n <= LIBM_TRIG_MAX {
        let rows = sin
            .iter_mut()
            .zip(cos.iter_mut())
            .zip(state.iter().step_by(2));
        for ((s, c), th) in rows {
            (*s, *c) = th.sin_cos();
        }
        return Ok(());
    }
    if state.len() != 2 * n || cos.len() != n {
        return Err(Error::invalid(
            "PendulumEnv::step",
            format!("internal: {} state values for {n} pendulums", state.len()),
        ));
    }
    let t = match trig {
        Some(t) if t.th.len() == n => t,
        _ => trig.insert(Trig {
            th: HostBuf::zeros(n)?,
            sin: HostBuf::zeros(n)?,
            cos: HostBuf::zeros(n)?,
        }),
    };
    for (o, pair) in t.th.as_mut_slice().iter_mut().zip(state.chunks_exact(2)) {
        if let [th, _] = pair {
            *o = *th;
        }
    }
    let _ = t.th.tensor().f_sin_out(t.sin.out())?;
    let _ = t.th.tensor().f_cos_out(t.cos.out())?;
    sin.copy_from_slice(t.sin.as_slice());
    cos.copy_from_slice(t.cos.as_slice());
    Ok(())
}

/// The scratch tensors of [`sin_cos`]'s libtorch path (angles in, sines and cosines out),
/// kept by the env from one step to the next.
struct Trig {
    th: HostBuf<f64>,
    sin: HostBuf<f64>,
    cos: HostBuf<f64>,
}

/// `x.rem_euclid(2π)`, which is gymnasium's `x % (2 * pi)` and torch's `remainder`: the exact
/// `f = fmod(x, 2π)`, plus 2π (rounded) when `f < 0`. `%` on `f64` is compiler-builtins'
/// bit-by-bit software `fmod` (~6 ns, the largest cost of a host step after the trigonometry);
/// this is one division and one fused multiply-add, with the same result (up to the sign of a
/// zero, which the caller's `- π` erases). Checked bit for bit by the tests below.
///
/// Why: `q = trunc(x / 2π)` from the rounded quotient is the true truncated quotient `q₀`, or
/// (rounding is monotonic and integers are representable) one more in magnitude when `x / 2π`
/// lies within half an ulp below the next integer, which puts `|f|` above π (for `|q| < 2^52`).
/// `r = fma(-q, 2π, x)` rounds the exact `x - q·2π` once. With `q₀` that is `f`, representable,
/// so `r = f`, and `r + 2π` when `r < 0` is `remainder`'s own rounded addition. With one more,
/// `f ∓ 2π` is representable (Sterbenz), so `r` is exact: for `x ≥ 0`, `r = f - 2π < 0` and
/// `r + 2π = f` exactly; for `x < 0`, `r = f + 2π > 0`, which is `remainder`'s result, exact.
/// So in every case: `r + 2π` if `r < 0`, else `r`. From `|x| ≥ 2^40` on (and for non-finite
/// `x`) it falls back to `rem_euclid`.
fn rem_tau(x: f64) -> f64 {
    if x.abs() < REM_TAU_FAST_MAX {
        rem_tau_small::<false>(x)
    } else {
        x.rem_euclid(TAU)
    }
}

/// Below this magnitude [`rem_tau`] takes its division-and-`fma` path.
const REM_TAU_FAST_MAX: f64 = 1_099_511_627_776.0;

const TAU: f64 = 2.0 * PI;

/// [`rem_tau`] for `|x| < REM_TAU_FAST_MAX`. The quotient is truncated by `f64::trunc` when
/// `ROUND` (one instruction where SSE4.1 is enabled) or by `as i64` (one instruction on
/// baseline x86-64, where `trunc` is a libm call); both are exact here (`|x / 2π| < 2^38`)
/// and give the same `r` (the sign of a zero quotient cannot reach the result: `fma(±0, 2π, x)`
/// is `x`, and for `x = ±0` both give `+0` after the final addition).
#[inline(always)]
fn rem_tau_small<const ROUND: bool>(x: f64) -> f64 {
    let q = if ROUND {
        (x / TAU).trunc()
    } else {
        (x / TAU) as i64 as f64
    };
    let r = (-q).mul_add(TAU, x);
    // A select, not a branch: the sign of `r` is random from one pendulum to the next, and
    // a mispredicted branch here cost ~3 µs per 1024 pendulums.
    r + if r < 0.0 { TAU } else { 0.0 }
}

/// The native-endian bytes of `values`, for `Tensor::f_from_data_size` (shape and dtype in the
/// same call, no `reshape` op), written with fixed-size stores.
fn f64_bytes(values: &[f64]) -> Vec<u8> {
    let mut out = vec![0u8; 8 * values.len()];
    for (chunk, v) in out.chunks_exact_mut(8).zip(values) {
        chunk.copy_from_slice(&v.to_ne_bytes());
    }
    out
}

/// CPU batches of at most this many pendulums step on host values (`PendulumEnv::step_host`);
/// larger batches and other devices step with tensor ops (`PendulumEnv::step_tensor`).
const HOST_PATH_MAX: usize = 32_768;

impl EnvBase for PendulumEnv {
    fn core(&self) -> &EnvCore {
        &self.core
    }

    fn core_mut(&mut self) -> &mut EnvCore {
        &mut self.core
    }

    fn reset_impl(&mut self, td: Option<&TensorDict>) -> Result<TensorDict> {
        let op = "PendulumEnv::reset";
        let batch = self.core.specs().batch_size().to_vec();
        let device = self.core.specs().device();
        let plan = reset_plan(op, td, &batch, 2, device)?;
        let current = self.state_tensor()?;
        let gen = &mut self.core.generator;
        let new = State::Tensor(plan.new_state(&current, || Self::sample(gen, &batch, device))?);
        let old = std::mem::replace(&mut self.state, new);
        self.spare.recycle(old);
        self.output(None)
    }

    fn step_impl(&mut self, td: &TensorDict) -> Result<TensorDict> {
        let op = "PendulumEnv::step";
        let specs = self.core.specs();
        let b1: Vec<i64> = [specs.batch_size(), &[1]].concat();
        let a = read_action(op, td, &b1, ActionKind::Continuous, specs.device())?;
        if specs.device() == Device::Cpu && a.numel() <= HOST_PATH_MAX {
            self.step_host(&a)
        } else {
            self.step_tensor(&a)
        }
    }
}

// ------------------------------------------------------------------ shared by the builtin envs

/// The state-spec key under which the classic-control envs read and write their state.
pub(super) const STATE_KEY: &str = "state";

/// What kind of action an env reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ActionKind {
    /// Any floating dtype, cast to float32.
    Continuous,
    /// Any integer or bool dtype, cast to int64.
    Discrete,
}

fn is_integral(kind: Kind) -> bool {
    matches!(
        kind,
        Kind::Uint8 | Kind::Int8 | Kind::Int16 | Kind::Int | Kind::Int64 | Kind::Bool
    )
}

/// Reads `td["action"]`, checks its shape (exactly `shape`) and dtype family, and returns it on
/// `device` as float32 (continuous) or int64 (discrete).
pub(super) fn read_action(
    op: &'static str,
    td: &TensorDict,
    shape: &[i64],
    kind: ActionKind,
    device: Device,
) -> Result<Tensor> {
    let a = td.get_or_err("action")?;
    let key = NestedKey::from("action").to_string();
    if a.size() != shape {
        return Err(Error::ShapeMismatch {
            op,
            key,
            expected: shape.to_vec(),
            actual: a.size(),
        });
    }
    let (ok, target) = match kind {
        ActionKind::Continuous => (is_float(a.kind()), Kind::Float),
        ActionKind::Discrete => (is_integral(a.kind()), Kind::Int64),
    };
    if !ok {
        return Err(Error::DtypeMismatch {
            op,
            key,
            expected: target,
            actual: a.kind(),
        });
    }
    Ok(a.f_to_device(device)?.f_to_kind(target)?)
}

/// How a reset sets the state: the elements it selects (those of the `"_reset"` mask, or all of
/// them without one) start from the given state when there is one, else from fresh samples;
/// the other elements keep their state.
pub(super) struct ResetPlan {
    /// `[*B, 1]` bool on the env's device; `None`: every element.
    pub(super) mask: Option<Tensor>,
    /// `[*B, n]` float64 on the env's device (a fresh copy); `None`: sample.
    pub(super) state: Option<Tensor>,
}

impl ResetPlan {
    /// The state after the reset: the given state (or a fresh one from `sample`, called only
    /// when no state was given) where the plan selects, `current` elsewhere.
    pub(super) fn new_state(
        &self,
        current: &Tensor,
        sample: impl FnOnce() -> Result<Tensor>,
    ) -> Result<Tensor> {
        let target = match &self.state {
            Some(s) => s.shallow_clone(),
            None => sample()?,
        };
        Ok(match &self.mask {
            Some(m) => target.f_where_self(m, current)?,
            None => target,
        })
    }
}

/// The outputs of an env whose observation is its float64 physical state cast to float32
/// (CartPole, MountainCarContinuous): observation, state (a copy), done = terminated, and the
/// reward when given (a step; a reset has none).
pub(super) fn state_output(
    batch: &[i64],
    state: &Tensor,
    terminated: Tensor,
    reward: Option<Tensor>,
) -> Result<TensorDict> {
    let mut td = TensorDict::new(batch)?
        .with("observation", state.f_to_kind(Kind::Float)?)?
        .with(STATE_KEY, state.f_detach_copy()?)?
        .with("done", terminated.shallow_clone())?
        .with("terminated", terminated)?;
    if let Some(r) = reward {
        td.set("reward", r)?;
    }
    Ok(td)
}

/// Decides how to reset from the tensordict given to `reset`. A `"_reset"` entry (shape `[*B]`
/// or `[*B, ...]`, reduced with `any` over the trailing dims) selects the elements to reset
/// (all of them without one); a `"state"` entry of shape `[*B, state_dim]` (any float dtype)
/// is the state those elements start from (its other elements are not read); without it they
/// are sampled. `step_and_maybe_reset` hands the env only the masks, so the current state it
/// carries is never mistaken for a state to reset to.
pub(super) fn reset_plan(
    op: &'static str,
    td: Option<&TensorDict>,
    batch: &[i64],
    state_dim: i64,
    device: Device,
) -> Result<ResetPlan> {
    let Some(td) = td else {
        return Ok(ResetPlan {
            mask: None,
            state: None,
        });
    };
    let mask = match td.get("_reset") {
        Some(m) => {
            let size = m.size();
            if size.get(..batch.len()) != Some(batch) {
                return Err(Error::ShapeMismatch {
                    op,
                    key: NestedKey::from("_reset").to_string(),
                    expected: batch.to_vec(),
                    actual: size,
                });
            }
            let mut m = m.f_to_device(device)?.f_to_kind(Kind::Bool)?;
            while m.dim() > batch.len() {
                m = m.f_any_dim(-1, false)?;
            }
            Some(m.f_unsqueeze(-1)?)
        }
        None => None,
    };
    let Some(s) = td.get(STATE_KEY) else {
        return Ok(ResetPlan { mask, state: None });
    };
    let key = NestedKey::from(STATE_KEY).to_string();
    let shape: Vec<i64> = [batch, &[state_dim]].concat();
    if s.size() != shape {
        return Err(Error::ShapeMismatch {
            op,
            key,
            expected: shape,
            actual: s.size(),
        });
    }
    if !is_float(s.kind()) {
        return Err(Error::DtypeMismatch {
            op,
            key,
            expected: Kind::Double,
            actual: s.kind(),
        });
    }
    let state = s
        .f_to_device(device)?
        .f_to_kind(Kind::Double)?
        .f_detach_copy()?;
    Ok(ResetPlan {
        mask,
        state: Some(state),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    type Outputs = (Vec<u64>, Vec<u64>, Vec<i64>, Vec<i64>);

    /// Runs a host step's loops the way `how` says on `(u, prev)`; returns the new state pairs
    /// (kept and written out), rewards and observations, as bits.
    fn run_host(u: &[f32], prev: &[f64], how: Option<HostKernels>) -> Outputs {
        let n = u.len();
        let sin_th: Vec<f64> = prev.iter().step_by(2).map(|th| th.sin()).collect();
        let mut state = vec![0.0; 2 * n];
        let mut out = HostOut::<f64>::new(&[n as i64, 2]).unwrap();
        let mut reward = HostOut::<f32>::new(&[n as i64]).unwrap();
        let io = DynamicsIo {
            u,
            prev,
            sin_th: &sin_th,
            state: &mut state,
            out: out.slots(),
            reward: reward.slots(),
        };
        match how {
            Some(k) => k.dynamics(io),
            None => dynamics_kernel(io, rem_tau),
        }
        let (mut sin, mut cos) = (vec![0.0; n], vec![0.0; n]);
        sin_cos(&state, &mut sin, &mut cos, &mut None).unwrap();
        let mut obs = HostOut::<f32>::new(&[n as i64, 3]).unwrap();
        match how {
            Some(k) => k.observe(&cos, &sin, &state, obs.slots()),
            None => observe_any(&cos, &sin, &state, obs.slots()),
        }
        let ints = |t: Tensor, kind: Kind| -> Vec<i64> {
            let t = t.view_dtype(kind).flatten(0, -1);
            (0..t.numel() as i64).map(|i| t.int64_value(&[i])).collect()
        };
        let out = ints(out.into_tensor(), Kind::Int64);
        assert_eq!(
            out,
            state.iter().map(|x| x.to_bits() as i64).collect::<Vec<_>>(),
            "the state written out is the state kept"
        );
        (
            state.iter().map(|x| x.to_bits()).collect(),
            out.iter().map(|x| *x as u64).collect(),
            ints(reward.into_tensor(), Kind::Int),
            ints(obs.into_tensor(), Kind::Int),
        )
    }

    /// The host step's loops give the same bits on every path: the AVX2/FMA copies (where the
    /// CPU has them), the portable loops with `rem_tau`'s fast path, and the general `rem_tau`;
    /// on rollout-like states, angles within ulps of multiples of 2π, tiny angles and
    /// out-of-range torques. A huge or NaN angle sends the whole batch to the general path,
    /// with the same results.
    #[test]
    fn host_kernels_agree_bit_for_bit() {
        let mut g = Generator::new(3);
        let n = 4099;
        let mut prev = Vec::with_capacity(2 * n);
        let mut u = Vec::with_capacity(n);
        for i in 0..n {
            let th = match i % 4 {
                0 => (g.next_f64() * 2.0 - 1.0) * 60.0,
                1 => {
                    let m = ((g.next_u64() % 41) as f64 - 20.0) * TAU - PI;
                    let mut x = m;
                    for _ in 0..(g.next_u64() % 5) {
                        x = if i % 8 == 1 {
                            x.next_up()
                        } else {
                            x.next_down()
                        };
                    }
                    x
                }
                2 => (g.next_f64() * 2.0 - 1.0) * 1e-300,
                _ => (g.next_f64() * 2.0 - 1.0) * 4.0,
            };
            prev.extend([th, (g.next_f64() * 2.0 - 1.0) * 9.0]);
            u.push(((g.next_f64() * 2.0 - 1.0) * 3.0) as f32);
        }
        let general = run_host(&u, &prev, None);
        assert_eq!(run_host(&u, &prev, Some(HostKernels::Portable)), general);
        assert_eq!(run_host(&u, &prev, Some(host_kernels())), general);
        let mut g2 = Generator::new(4);
        for odd in [1e15, f64::NAN] {
            let mut p = prev.clone();
            p[2 * (g2.next_u64() as usize % n)] = odd;
            let general = run_host(&u, &p, None);
            assert_eq!(
                run_host(&u, &p, Some(HostKernels::Portable)),
                general,
                "{odd}"
            );
            assert_eq!(run_host(&u, &p, Some(host_kernels())), general, "{odd}");
        }
    }

    /// `rem_tau` against `rem_euclid` (the exact `fmod` and the `remainder` rule), after the
    /// `- π` of `angle_normalize`, bit for bit: random angles, angles within a few ulps of
    /// multiples of 2π (where the rounded quotient is off by one), tiny and huge ones.
    #[test]
    fn rem_tau_is_rem_euclid() {
        let mut g = Generator::new(7);
        let mut xs = vec![
            0.0,
            -0.0,
            TAU,
            -TAU,
            PI,
            -PI,
            1e-300,
            -1e-300,
            f64::MIN_POSITIVE,
        ];
        xs.extend([1e12, -1e12, 1.0995e12, f64::MAX, f64::NAN, f64::INFINITY]);
        for _ in 0..200_000 {
            let scale = [1.0, 10.0, 100.0, 1e4, 1e8, 1e11][(g.next_u64() % 6) as usize];
            xs.push((g.next_f64() * 2.0 - 1.0) * scale);
        }
        for k in (-2_000_000i64..=2_000_000).step_by(997) {
            let m = k as f64 * TAU;
            let mut x = m;
            for _ in 0..4 {
                x = x.next_up();
                xs.push(x);
            }
            x = m;
            for _ in 0..4 {
                x = x.next_down();
                xs.push(x);
            }
            xs.push(m);
        }
        for x in xs {
            let (got, want) = (rem_tau(x) - PI, x.rem_euclid(TAU) - PI);
            assert!(
                got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                "rem_tau({x:e}) - π = {got:e}, rem_euclid gives {want:e}"
            );
        }
    }
}
