//! The Pendulum step with tensor ops: other devices, and CPU batches above the host path's
//! limit. Same arithmetic as the host step (`host.rs`), op by op.

use std::f64::consts::PI;

use tch::{Kind, Tensor};

use super::super::common::env_output;
use super::{PendulumEnv, State};
use crate::error::Result;
use crate::host::pendulum::{DT, G, L, M, MAX_SPEED, MAX_TORQUE};
use crate::tensordict::TensorDict;

impl PendulumEnv {
    /// The step with tensor ops (other devices, and CPU batches above [`HOST_PATH_MAX`]).
    ///
    /// Written for few ops (at 1024 pendulums on the CPU each op's fixed cost is more than its
    /// arithmetic): in-place ops on fresh buffers, the float32 → float64 casts left to type
    /// promotion (exact, as the explicit casts were), the negated cost built from negated
    /// terms (IEEE negation is exact, so `-(0.1 θ̇²) - norm²` is `-(norm² + 0.1 θ̇²)` bit for
    /// bit) and written to the float32 reward by its last op, and the new state and
    /// observation columns written in place by `out=` ops instead of `cat`s.
    pub(super) fn step_tensor(&mut self, a: &Tensor) -> Result<TensorDict> {
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
        let obs = obs.f_to_kind(Kind::Float)?;
        let td = env_output(batch, obs, state.f_detach_copy()?, done, Some(reward))?;
        let old = std::mem::replace(&mut self.state, State::Tensor(state));
        self.spare.recycle(old);
        Ok(td)
    }
}
