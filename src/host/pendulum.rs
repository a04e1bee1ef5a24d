//! The Pendulum host step's loops (`PendulumEnv` in `envs::builtin`), compiled for the CPU
//! at hand: on x86-64 with AVX2 and FMA, `#[target_feature]` copies of the same Rust loops,
//! picked at run time ([`host_kernels`]). The results are the same bit for bit on every path
//! (checked by the tests here and in the env's `host` module). Why these loops are written the
//! way they are, and how fast they are: `docs/performance.md` (W2).

use std::f64::consts::PI;
use std::mem::MaybeUninit;

use crate::error::{Error, Result};

// Gymnasium's `Pendulum-v1` constants, shared with the env's tensor step.
/// The speed bound `|θ̇| ≤ 8`.
pub(crate) const MAX_SPEED: f64 = 8.0;
/// The torque bound `|u| ≤ 2`.
pub(crate) const MAX_TORQUE: f64 = 2.0;
/// The time step.
pub(crate) const DT: f64 = 0.05;
/// Gravity.
pub(crate) const G: f64 = 10.0;
/// The mass.
pub(crate) const M: f64 = 1.0;
/// The length.
pub(crate) const L: f64 = 1.0;

/// The slices of [`HostKernels::dynamics`], one row per pendulum: the torques `u`, the state
/// pairs `prev` `[θ, θ̇]` and their `sin θ` in; the new state pairs (kept in `state`, written
/// out to `out`) and the rewards out. [`HostKernels::dynamics`] refuses slices of other lengths.
pub(crate) struct DynamicsIo<'a> {
    pub(crate) u: &'a [f32],
    pub(crate) prev: &'a [f64],
    pub(crate) sin_th: &'a [f64],
    pub(crate) state: &'a mut [f64],
    pub(crate) out: &'a mut [MaybeUninit<f64>],
    pub(crate) reward: &'a mut [MaybeUninit<f32>],
}

/// The host step's two loops, compiled for the CPU at hand (see [`host_kernels`]).
#[derive(Clone, Copy)]
pub(crate) enum HostKernels {
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
#[inline]
pub(crate) fn host_kernels() -> HostKernels {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        return HostKernels::Avx2Fma;
    }
    HostKernels::Portable
}

/// The error for slices whose lengths do not describe the same pendulums (a bug of the
/// caller: the loops would otherwise stop at the shortest and leave rows unwritten).
fn rows_error(what: &str) -> Error {
    debug_assert!(false, "Pendulum host kernel: {what}");
    Error::invalid("PendulumEnv::step", format!("internal: {what}"))
}

impl HostKernels {
    /// The per-pendulum arithmetic of a host step (see [`DynamicsIo`]). Errors, writing
    /// nothing, when the slices are not `n` torques, `2n` state values in and out, `n` sines
    /// and `n` rewards.
    #[inline]
    pub(crate) fn dynamics(self, io: DynamicsIo<'_>) -> Result<()> {
        let n = io.u.len();
        let pairs = [io.prev.len(), io.state.len(), io.out.len()];
        if pairs.iter().any(|len| *len != 2 * n) || io.sin_th.len() != n || io.reward.len() != n {
            return Err(rows_error("dynamics slices of different lengths"));
        }
        match self {
            HostKernels::Portable => dynamics_any::<false>(io),
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Avx2Fma` is only built after detecting AVX2 and FMA (`host_kernels`).
            HostKernels::Avx2Fma => unsafe { dynamics_avx2_fma(io) },
        }
        Ok(())
    }

    /// Writes the observations `[cos θ, sin θ, θ̇]` as float32 rows, from the cosines, sines
    /// and state pairs. Errors, writing nothing, unless there are `n` cosines and sines, `2n`
    /// state values and `3n` observation slots.
    #[inline]
    pub(crate) fn observe(
        self,
        cos: &[f64],
        sin: &[f64],
        state: &[f64],
        obs: &mut [MaybeUninit<f32>],
    ) -> Result<()> {
        let n = cos.len();
        if sin.len() != n || state.len() != 2 * n || obs.len() != 3 * n {
            return Err(rows_error("observation slices of different lengths"));
        }
        match self {
            HostKernels::Portable => observe_any(cos, sin, state, obs),
            #[cfg(target_arch = "x86_64")]
            // SAFETY: as in `dynamics`.
            HostKernels::Avx2Fma => unsafe { observe_avx2(cos, sin, state, obs) },
        }
        Ok(())
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
pub(crate) fn dynamics_kernel(io: DynamicsIo<'_>, rem: impl Fn(f64) -> f64) {
    let rows =
        io.u.iter()
            .zip(io.prev.chunks_exact(2))
            .zip(io.sin_th)
            .zip(io.state.chunks_exact_mut(2))
            .zip(io.out.chunks_exact_mut(2))
            .zip(io.reward.iter_mut());
    for (((((ui, s), sin_th), st), o), r) in rows {
        let (&[th, thdot], [st_th, st_thdot], [o_th, o_thdot]) = (s, st, o) else {
            // Unreachable: `chunks_exact(2)` yields pairs.
            debug_assert!(false, "a state row that is not a pair");
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
pub(crate) fn observe_any(cos: &[f64], sin: &[f64], state: &[f64], obs: &mut [MaybeUninit<f32>]) {
    let rows = obs
        .chunks_exact_mut(3)
        .zip(cos.iter().zip(sin))
        .zip(state.chunks_exact(2));
    for ((o, (c, s)), st) in rows {
        if let ([oc, os, ot], [_, thdot]) = (o, st) {
            oc.write(*c as f32);
            os.write(*s as f32);
            ot.write(*thdot as f32);
        } else {
            // Unreachable: `chunks_exact` yields rows of 3 and pairs.
            debug_assert!(false, "an observation row that is not a triple");
        }
    }
}

/// `x.rem_euclid(2π)`, which is gymnasium's `x % (2 * pi)` and torch's `remainder`: the exact
/// `f = fmod(x, 2π)`, plus 2π (rounded) when `f < 0`. `%` on `f64` is compiler-builtins'
/// bit-by-bit software `fmod` (the largest cost of a host step after the trigonometry); this
/// is one division and one fused multiply-add, with the same result (up to the sign of a
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
pub(crate) fn rem_tau(x: f64) -> f64 {
    if x.abs() < REM_TAU_FAST_MAX {
        rem_tau_small::<false>(x)
    } else {
        x.rem_euclid(TAU)
    }
}

/// Below this magnitude [`rem_tau`] takes its division-and-`fma` path.
const REM_TAU_FAST_MAX: f64 = 1_099_511_627_776.0;

pub(crate) const TAU: f64 = 2.0 * PI;

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Generator;

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
