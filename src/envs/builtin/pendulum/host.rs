//! The Pendulum step on host values (CPU batches up to `HOST_PATH_MAX`): the env's side of
//! the fast path (reusable vectors, the host copy of the state, the trigonometry); the loops
//! themselves are in `crate::host::pendulum`.

use tch::{Device, Kind, Tensor};

use super::super::common::env_output;
use super::{PendulumEnv, State};
use crate::error::{Error, Result};
use crate::host::pendulum::{host_kernels, DynamicsIo};
use crate::host::{HostBuf, HostOut};
use crate::tensordict::TensorDict;

/// The host step's reusable vectors (states, sines, cosines), taken with [`Spare::take`] and
/// given back with [`Spare::put`]. Filled when the env is built (for batches on the host path)
/// and kept across resets, so that rollouts allocate none of them: long-lived vectors allocated
/// in the middle of a rollout would split the free memory that the next rollout's steps and
/// stack reuse, and the stack would then take fresh pages (a page fault per 4 KiB).
#[derive(Default)]
pub(super) struct Spare {
    pool: Vec<Vec<f64>>,
    /// The torques read from the actions.
    u: Vec<f32>,
    /// The scratch tensors of the libtorch `sin` / `cos` (batches above [`LIBM_TRIG_MAX`]).
    trig: Option<Trig>,
}

impl Spare {
    /// Vectors for two host states of `n` pendulums (the current one and the next) and the
    /// cosines.
    pub(super) fn for_batch(n: usize) -> Self {
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
    pub(super) fn recycle(&mut self, old: State) {
        if let State::Host(h) = old {
            self.put(h.state);
            self.put(h.sin_th);
        }
    }
}

impl PendulumEnv {
    /// The step on host values (CPU batches up to [`HOST_PATH_MAX`]): the same arithmetic as
    /// the tensor path (float64 dynamics, gymnasium's float32 rounding points) on plain `f64`s.
    /// One read of the actions and five tensor constructions replace ~25 libtorch ops, whose
    /// fixed cost per op dominates a step up to thousands of pendulums (timings in
    /// `docs/performance.md`).
    ///
    /// The trigonometry is one [`sin_cos`] of the new angles (the observation needs both; the
    /// sines are kept in [`HostState`] for the next step's `sin θ`) and the angle
    /// normalisation avoids `fmod` ([`rem_tau`](crate::host::pendulum::rem_tau)).
    pub(super) fn step_host(&mut self, action: &Tensor) -> Result<TensorDict> {
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
        })?;
        let mut sin = self.spare.take(n);
        let mut cos = self.spare.take(n);
        sin_cos(&state, &mut sin, &mut cos, &mut self.spare.trig)?;
        let mut obs = HostOut::<f32>::new(&b3)?;
        kernels.observe(&cos, &sin, &state, obs.slots())?;
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
        let (obs, state_out) = (obs.into_tensor(), state_out.into_tensor());
        env_output(&batch, obs, state_out, done, Some(reward.into_tensor()))
    }
}

/// The host step's copy of the state and of `sin θ`. Valid while it mirrors
/// [`PendulumEnv`]'s `state` tensor: the host step replaces both, and everything else that sets
/// the state (resets, the tensor step) drops it.
pub(super) struct HostState {
    /// `[θ₀, θ̇₀, θ₁, θ̇₁, …]`: the values of the state tensor.
    state: Vec<f64>,
    /// `sin θᵢ`, from the step that produced `θᵢ` (it computed `sin_cos(θᵢ)` for the
    /// observation), so a step costs one `sin_cos` per pendulum instead of a `sin` and a
    /// `sin_cos`.
    sin_th: Vec<f64>,
}

impl HostState {
    /// The state as a fresh `[*B, 2]` float64 CPU tensor.
    pub(super) fn tensor(&self, batch: &[i64]) -> Result<Tensor> {
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
/// the tensor step's results bit for bit there), libm up to 64. For large batches libm is the
/// slower of the two (its range reduction branches defeat the branch predictor on a
/// rollout's spread of angles; `docs/performance.md`).
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

/// The native-endian bytes of `values`, for `Tensor::f_from_data_size` (shape and dtype in the
/// same call, no `reshape` op), written with fixed-size stores.
fn f64_bytes(values: &[f64]) -> Vec<u8> {
    let mut out = vec![0u8; 8 * values.len()];
    for (chunk, v) in out.chunks_exact_mut(8).zip(values) {
        chunk.copy_from_slice(&v.to_ne_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::pendulum::{dynamics_kernel, observe_any, rem_tau, HostKernels, TAU};
    use crate::rng::Generator;
    use std::f64::consts::PI;

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
            Some(k) => k.dynamics(io).unwrap(),
            None => dynamics_kernel(io, rem_tau),
        }
        let (mut sin, mut cos) = (vec![0.0; n], vec![0.0; n]);
        sin_cos(&state, &mut sin, &mut cos, &mut None).unwrap();
        let mut obs = HostOut::<f32>::new(&[n as i64, 3]).unwrap();
        match how {
            Some(k) => k.observe(&cos, &sin, &state, obs.slots()).unwrap(),
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
}
