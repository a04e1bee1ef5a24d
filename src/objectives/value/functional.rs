//! Functional value estimators: TorchRL's `torchrl.objectives.value.functional`.
//!
//! Each function takes plain tensors of one shape `[*B, T, *F]` (time at `time_dim`; TorchRL's
//! default is `-2`, i.e. one trailing feature dim such as a `[*B, T, 1]` reward) and returns
//! tensors of that shape. `done` and `terminated` may be `bool` or numeric (non-zero = set).
//!
//! - `terminated` ends the episode: nothing is bootstrapped from the next state.
//! - `done` without `terminated` (a truncation) cuts the recursion but **does** bootstrap from
//!   the next state's value.
//!
//! Both recursions, `x_t = b_t + c_t · x_{t+1}`, are solved for all `t` at once by a
//! log-depth doubling scan over time (about `4·⌈log₂(T+1)⌉` tensor ops, `O(T)` memory,
//! differentiable), not by a per-step loop.
//!
//! ```
//! use tch::Tensor;
//! use torchrl::objectives::value::functional::generalized_advantage_estimate;
//! # fn main() -> torchrl::Result<()> {
//! // TorchRL's reference numbers: γ=0.9, λ=0.8, V=[1,2,3], V'=[2,3,4], r=1, ends at t=2.
//! let v = Tensor::from_slice(&[1.0f64, 2.0, 3.0]).view([3, 1]);
//! let nv = Tensor::from_slice(&[2.0f64, 3.0, 4.0]).view([3, 1]);
//! let r = Tensor::ones([3, 1], (tch::Kind::Double, tch::Device::Cpu));
//! let done = Tensor::from_slice(&[false, false, true]).view([3, 1]);
//! // terminated: no bootstrap at the end
//! let (adv, target) = generalized_advantage_estimate(0.9, 0.8, &v, &nv, &r, &done, None, -2)?;
//! assert!((adv.double_value(&[0, 0]) - 1.9872).abs() < 1e-12);
//! assert!((target.double_value(&[2, 0]) - 1.0).abs() < 1e-12);
//! // truncated (done, not terminated): bootstraps from V'
//! let term = Tensor::from_slice(&[false, false, false]).view([3, 1]);
//! let (adv, _) = generalized_advantage_estimate(0.9, 0.8, &v, &nv, &r, &done, Some(&term), -2)?;
//! assert!((adv.double_value(&[0, 0]) - 3.85344).abs() < 1e-12);
//! # Ok(()) }
//! ```

use crate::kind::is_float;
use tch::{Kind, Tensor};

use crate::error::{Error, Result, ShapeFmt};
use crate::tensordict::norm_dim;

/// The discount: one `γ` for every step, or a per-step tensor (e.g. `γ^steps_to_next_obs`).
pub(crate) enum Gamma<'a> {
    /// The same discount everywhere.
    Scalar(f64),
    /// A per-element discount, same shape as the other inputs.
    PerStep(&'a Tensor),
}

impl Gamma<'_> {
    pub(crate) fn mul(&self, t: &Tensor) -> Result<Tensor> {
        Ok(match self {
            Gamma::Scalar(g) => t.f_mul_scalar(*g)?,
            Gamma::PerStep(g) => t.f_mul(g)?,
        })
    }
}

/// Solves `x_t = b_t + c_t · x_{t+1}` along the last dim for every `t`, with
/// `x_T = boundary` (zero when `None`).
///
/// Doubling scan: position `t` holds the affine map `x_t = b_t + c_t · x_{t+s}`; composing it
/// with the map at `t+s` doubles `s`. The appended element `T` (`b = boundary`, `c = 0`)
/// absorbs every chain that reaches the end, so after `⌈log₂(T+1)⌉` rounds every `c_t` is
/// zero and `b_t = x_t`. Products of `c` are formed exactly as a sequential loop forms them;
/// only the order of the additions differs.
pub(crate) fn reverse_scan(b: &Tensor, c: &Tensor, boundary: Option<&Tensor>) -> Result<Tensor> {
    let size = b.size();
    let t_len = size.last().copied().unwrap_or(0);
    if t_len == 0 {
        return Ok(b.shallow_clone());
    }
    let end = match boundary {
        Some(x) => x.f_unsqueeze(-1)?,
        None => b.f_narrow(-1, 0, 1)?.f_zeros_like()?,
    };
    let c = c.f_expand_as(b)?;
    let mut bb = Tensor::f_cat(&[b, &end], -1)?;
    let mut cc = Tensor::f_cat(&[&c, &end.f_zeros_like()?], -1)?;
    let n = t_len + 1;
    let mut s = 1;
    while s < n {
        let b_next = shift_left(&bb, s, n)?;
        bb = bb.f_add(&cc.f_mul(&b_next)?)?;
        if s.saturating_mul(2) < n {
            let c_next = shift_left(&cc, s, n)?;
            cc = cc.f_mul(&c_next)?;
        }
        s = s.saturating_mul(2);
    }
    Ok(bb.f_narrow(-1, 0, t_len)?.f_contiguous()?)
}

/// `y_t = x_{t+s}` along the last dim (length `n`), zero past the end.
fn shift_left(x: &Tensor, s: i64, n: i64) -> Result<Tensor> {
    let head = x.f_narrow(-1, s, n - s)?;
    let pad = x.f_narrow(-1, 0, s)?.f_zeros_like()?;
    Ok(Tensor::f_cat(&[&head, &pad], -1)?)
}

/// `1.0` where `flag` is set (true / non-zero), `0.0` elsewhere, in `kind`.
pub(crate) fn flag01(flag: &Tensor, kind: Kind) -> Result<Tensor> {
    Ok(flag.f_ne(0)?.f_to_kind(kind)?)
}

/// Checks that every named tensor has the shape of the first one and that the first is a
/// floating-point tensor; returns that shape.
pub(crate) fn check_same_shape(op: &'static str, tensors: &[(&str, &Tensor)]) -> Result<Vec<i64>> {
    let Some((first_name, first)) = tensors.first() else {
        return Ok(Vec::new());
    };
    let shape = first.size();
    if !is_float(first.kind()) {
        return Err(Error::argument(
            op,
            first_name,
            "a floating-point tensor",
            format!("{:?}", first.kind()),
        ));
    }
    for (name, t) in tensors.iter().skip(1) {
        let s = t.size();
        if s != shape {
            return Err(Error::argument(
                op,
                name,
                format!(
                    "the shape of {first_name}, {} (all input tensors (value, reward and done \
                     states) must share one shape)",
                    ShapeFmt(&shape)
                ),
                format!("shape {}", ShapeFmt(&s)),
            ));
        }
    }
    Ok(shape)
}

/// Resolves `time_dim` (negative counts from the end) against `ndim`.
pub(crate) fn resolve_dim(op: &'static str, time_dim: i64, ndim: usize) -> Result<i64> {
    let d = norm_dim(op, time_dim, ndim, || {
        "the dims of the inputs (time_dim)".into()
    })?;
    // `d < ndim`, which is a tensor's dim count: it fits an i64.
    Ok(d as i64)
}

/// GAE with the time dim last: returns `(advantage, value_target)`.
pub(crate) fn gae_time_last(
    gamma: &Gamma<'_>,
    lmbda: f64,
    value: &Tensor,
    next_value: &Tensor,
    reward: &Tensor,
    done: &Tensor,
    terminated: &Tensor,
) -> Result<(Tensor, Tensor)> {
    let kind = value.kind();
    let not_terminated = flag01(terminated, kind)?.f_rsub_scalar(1.0)?;
    let not_done = flag01(done, kind)?.f_rsub_scalar(1.0)?;
    // delta = r + γ·(1 - terminated)·V' - V
    let delta = reward
        .f_add(&gamma.mul(&not_terminated)?.f_mul(next_value)?)?
        .f_sub(value)?;
    // A_t = delta_t + γλ·(1 - done_t)·A_{t+1}
    let coef = gamma.mul(&not_done)?.f_mul_scalar(lmbda)?;
    let advantage = reverse_scan(&delta, &coef, None)?;
    let value_target = advantage.f_add(value)?;
    Ok((advantage, value_target))
}

/// TD(λ) returns with the time dim last.
pub(crate) fn td_lambda_time_last(
    gamma: &Gamma<'_>,
    lmbda: f64,
    next_value: &Tensor,
    reward: &Tensor,
    done: &Tensor,
    terminated: &Tensor,
) -> Result<Tensor> {
    let kind = next_value.kind();
    let done01 = flag01(done, kind)?;
    let not_done = done01.f_rsub_scalar(1.0)?;
    // No bootstrap through a termination.
    let nv = next_value.f_mul(&flag01(terminated, kind)?.f_rsub_scalar(1.0)?)?;
    // G_t = r_t + γ[(1-λ)·nv_t + λ·(done_t ? nv_t : G_{t+1})]
    //     = (r_t + γ(1-λ)·nv_t + γλ·done_t·nv_t) + γλ·(1-done_t)·G_{t+1},  G_T = nv_{T-1}
    let b = reward
        .f_add(&gamma.mul(&nv)?.f_mul_scalar(1.0 - lmbda)?)?
        .f_add(&gamma.mul(&done01.f_mul(&nv)?)?.f_mul_scalar(lmbda)?)?;
    let coef = gamma.mul(&not_done)?.f_mul_scalar(lmbda)?;
    let t_len = nv.size().last().copied().unwrap_or(0);
    if t_len == 0 {
        return Ok(b);
    }
    let boundary = nv.f_select(-1, t_len - 1)?;
    reverse_scan(&b, &coef, Some(&boundary))
}

/// `(x - mean) / max(std, 1e-4)` over every element (unbiased std): TorchRL's
/// `average_gae` / `average_rewards` standardisation.
pub(crate) fn standardize(x: &Tensor) -> Result<Tensor> {
    let loc = x.f_mean(None)?;
    let scale = x.f_std(true)?.f_clamp_min(1e-4)?;
    Ok(x.f_sub(&loc)?.f_div(&scale)?)
}

/// Checks that `tensors` share one shape (the first floating-point), resolves `time_dim`
/// against it, and moves that dim last in each: `(time_dim, tensors)`.
fn time_last<const N: usize>(
    op: &'static str,
    time_dim: i64,
    tensors: [(&str, &Tensor); N],
) -> Result<(i64, [Tensor; N])> {
    let shape = check_same_shape(op, &tensors)?;
    let d = resolve_dim(op, time_dim, shape.len())?;
    let moved = tensors
        .iter()
        .map(|(_, t)| Ok(t.f_movedim_int(d, -1)?))
        .collect::<Result<Vec<Tensor>>>()?;
    let moved = <[Tensor; N]>::try_from(moved)
        .map_err(|_| Error::invalid(op, "an input was lost while moving the time dim"))?;
    Ok((d, moved))
}

fn from_last(t: &Tensor, dim: i64) -> Result<Tensor> {
    Ok(t.f_movedim_int(-1, dim)?.f_contiguous()?)
}

/// Generalized advantage estimate of a trajectory (Schulman et al. 2016), TorchRL's
/// `generalized_advantage_estimate`. Returns `(advantage, value_target)`.
///
/// - `delta_t = r_t + γ·(1 - terminated_t)·V'_t - V_t`
/// - `A_t = delta_t + γλ·(1 - done_t)·A_{t+1}`
/// - `value_target = A + V`
///
/// `terminated` defaults to `done`.
///
/// # Shapes
/// Every input is `[*B, T, *F]` with time at `time_dim` (negative counts from the end; TorchRL's
/// default is `-2`); both outputs have that shape.
///
/// # Errors
/// When shapes differ, `state_value` is not floating-point, or `time_dim` is out of range.
#[allow(clippy::too_many_arguments)]
pub fn generalized_advantage_estimate(
    gamma: f64,
    lmbda: f64,
    state_value: &Tensor,
    next_state_value: &Tensor,
    reward: &Tensor,
    done: &Tensor,
    terminated: Option<&Tensor>,
    time_dim: i64,
) -> Result<(Tensor, Tensor)> {
    const OP: &str = "generalized_advantage_estimate";
    let terminated = terminated.unwrap_or(done);
    let (d, [v, nv, r, dn, t]) = time_last(
        OP,
        time_dim,
        [
            ("state_value", state_value),
            ("next_state_value", next_state_value),
            ("reward", reward),
            ("done", done),
            ("terminated", terminated),
        ],
    )?;
    let (adv, target) = gae_time_last(&Gamma::Scalar(gamma), lmbda, &v, &nv, &r, &dn, &t)?;
    Ok((from_last(&adv, d)?, from_last(&target, d)?))
}

/// TD(λ) return estimate, TorchRL's `td_lambda_return_estimate` (with a scalar γ and λ).
///
/// `G_t = r_t + γ·[(1-λ)·V'_t + λ·G_{t+1}]`, where `G_{t+1}` is replaced by `V'_t` when
/// `done_t` (and after the last step), and `V'_t` is zeroed when `terminated_t`.
/// `terminated` defaults to `done`.
///
/// # Shapes
/// Every input is `[*B, T, *F]` with time at `time_dim`; the output has that shape.
///
/// # Errors
/// When shapes differ, `next_state_value` is not floating-point, or `time_dim` is out of range.
pub fn td_lambda_return_estimate(
    gamma: f64,
    lmbda: f64,
    next_state_value: &Tensor,
    reward: &Tensor,
    done: &Tensor,
    terminated: Option<&Tensor>,
    time_dim: i64,
) -> Result<Tensor> {
    const OP: &str = "td_lambda_return_estimate";
    let terminated = terminated.unwrap_or(done);
    let (d, [nv, r, dn, t]) = time_last(
        OP,
        time_dim,
        [
            ("next_state_value", next_state_value),
            ("reward", reward),
            ("done", done),
            ("terminated", terminated),
        ],
    )?;
    let ret = td_lambda_time_last(&Gamma::Scalar(gamma), lmbda, &nv, &r, &dn, &t)?;
    from_last(&ret, d)
}

/// TD(λ) advantage estimate: [`td_lambda_return_estimate`] minus `state_value` (TorchRL's
/// `td_lambda_advantage_estimate`).
///
/// # Shapes
/// Every input is `[*B, T, *F]` with time at `time_dim`; the output has that shape.
///
/// # Errors
/// As [`td_lambda_return_estimate`], and when `state_value`'s shape differs.
#[allow(clippy::too_many_arguments)]
pub fn td_lambda_advantage_estimate(
    gamma: f64,
    lmbda: f64,
    state_value: &Tensor,
    next_state_value: &Tensor,
    reward: &Tensor,
    done: &Tensor,
    terminated: Option<&Tensor>,
    time_dim: i64,
) -> Result<Tensor> {
    check_same_shape(
        "td_lambda_advantage_estimate",
        &[
            ("state_value", state_value),
            ("next_state_value", next_state_value),
        ],
    )?;
    let ret = td_lambda_return_estimate(
        gamma,
        lmbda,
        next_state_value,
        reward,
        done,
        terminated,
        time_dim,
    )?;
    Ok(ret.f_sub(state_value)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sequential recursion the scan replaces.
    fn sequential(b: &[f64], c: &[f64], boundary: f64) -> Vec<f64> {
        let mut out = vec![0.0; b.len()];
        let mut next = boundary;
        for t in (0..b.len()).rev() {
            next = b[t] + c[t] * next;
            out[t] = next;
        }
        out
    }

    #[test]
    fn scan_matches_the_sequential_recursion_for_every_length() -> Result<()> {
        for len in 0..40usize {
            let b: Vec<f64> = (0..len).map(|i| ((i * 7 % 5) as f64) - 1.5).collect();
            let c: Vec<f64> = (0..len)
                .map(|i| {
                    if i % 6 == 3 {
                        0.0
                    } else {
                        0.9 - 0.01 * i as f64
                    }
                })
                .collect();
            let want = sequential(&b, &c, 2.5);
            let bt = Tensor::from_slice(&b);
            let ct = Tensor::from_slice(&c);
            let got = reverse_scan(&bt, &ct, Some(&Tensor::from(2.5f64)))?;
            let got: Vec<f64> = Vec::<f64>::try_from(&got)?;
            assert_eq!(got.len(), len);
            for (g, w) in got.iter().zip(&want) {
                assert!((g - w).abs() < 1e-12, "len {len}: {got:?} vs {want:?}");
            }
        }
        Ok(())
    }

    #[test]
    fn scan_batches_over_leading_dims() -> Result<()> {
        let b = Tensor::from_slice(&[1.0f64, 2.0, 3.0, 4.0, 5.0, 6.0]).view([2, 3]);
        let c = Tensor::from_slice(&[0.5f64, 0.0, 0.5, 1.0, 1.0, 1.0]).view([2, 3]);
        let got = Vec::<f64>::try_from(&reverse_scan(&b, &c, None)?.view([-1]))?;
        assert_eq!(got, vec![1.0 + 0.5 * 2.0, 2.0, 3.0, 15.0, 11.0, 6.0]);
        Ok(())
    }
}
