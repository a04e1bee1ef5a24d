//! GAE over tokens ([`gae_advantages_and_returns`], trlX's `get_advantages_and_returns`),
//! restricted to the response mask, in TorchRL's full-length layout (see
//! [`super::ppo`] for the layout and its alignment with trlX's indices).

use tch::Tensor;

use super::masked::{floating, same_shape, zero_out};
use crate::error::{Error, Result, ShapeFmt};

// ------------------------------------------------------------------------------ GAE

pub(crate) fn unit_interval(op: &'static str, name: &str, v: f64) -> Result<()> {
    if (0.0..=1.0).contains(&v) {
        Ok(())
    } else {
        Err(Error::argument(op, name, "in [0, 1]", v.to_string()))
    }
}

/// The first and last column any row's mask covers (`None` for an all-zero mask); one sync.
pub(crate) fn mask_span(keep: &Tensor) -> Result<Option<(i64, i64)>> {
    let cols = keep.f_any_dim(0, false)?.f_nonzero()?.f_view([-1])?;
    let cols = Vec::<i64>::try_from(&cols)?;
    Ok(cols.first().copied().zip(cols.last().copied()))
}

/// The first column any row of `mask` (nonzero = kept) covers, 0 for an all-zero mask: the
/// [`ScoreRequest::scored_from`](crate::modules::llm::ScoreRequest::scored_from) of a loss
/// that reads only the masked positions.
pub(crate) fn first_masked_column(mask: &Tensor) -> Result<i64> {
    Ok(mask_span(&mask.f_ne(0)?)?.map_or(0, |(first, _)| first))
}

/// GAE over tokens restricted to the response mask: trlX's `get_advantages_and_returns`
/// (rlhf.md §1.7) without its whitening, on full-length `[B, T]` rows.
///
/// Walking each row backwards over its masked positions only,
/// `δ_t = r_t + γ·V_next − V_t`, `A_t = δ_t + γλ·A_next`, where `V_next`/`A_next` are those of
/// the next *masked* position, 0 beyond the last real response token. Positions outside the
/// mask take no part (their rewards and values are ignored, even NaN) and get advantage 0 and
/// return 0. On an unpadded row this is trlX's loop exactly; a row with holes in its mask
/// (several assistant turns) is treated as the row with the holes removed. The returns are
/// `A + V` on masked positions.
///
/// Both outputs are detached (trlX detaches the advantages; its returns come from stored,
/// detached values). Whiten the advantages with [`masked_whiten`] (what
/// [`compute_ppo_rlhf_advantages`] does).
///
/// # Shapes
/// `values`, `rewards`, `mask`: `[B, T]`; outputs `[B, T]`, in the dtype of `values` (the rewards are converted to it).
///
/// # Errors
/// When the shapes differ or are not 2-D, `values`/`rewards` are not floating point, or
/// `gamma`/`lam` are outside `[0, 1]`.
///
/// ```
/// use tch::Tensor;
/// use torchrl::objectives::llm::gae_advantages_and_returns;
/// # fn main() -> torchrl::Result<()> {
/// // rlhf.md §5.2, γ = 0.99; the second row is the first with one padded column
/// let v = Tensor::from_slice(&[0.5f64, 0.6, 0.7, 0.5, 0.6, 0.7]).view([2, 3]);
/// let r = Tensor::from_slice(&[0.0f64, 0.0, 1.0, 0.0, 1.0, 5.0]).view([2, 3]);
/// let m = Tensor::from_slice(&[1i64, 1, 1, 1, 1, 0]).view([2, 3]);
/// let (a, ret) = gae_advantages_and_returns(&v, &r, &m, 0.99, 0.95)?;
/// assert!((a.double_value(&[0, 0]) - 0.446828575).abs() < 1e-12);
/// // row 2 ends at column 1: V_next = 0 there, and column 2 takes no part
/// assert!((a.double_value(&[1, 1]) - 0.4).abs() < 1e-12);
/// assert_eq!((a.double_value(&[1, 2]), ret.double_value(&[1, 2])), (0.0, 0.0));
/// # Ok(()) }
/// ```
pub fn gae_advantages_and_returns(
    values: &Tensor,
    rewards: &Tensor,
    mask: &Tensor,
    gamma: f64,
    lam: f64,
) -> Result<(Tensor, Tensor)> {
    const OP: &str = "gae_advantages_and_returns";
    let shape = same_shape(OP, "values, rewards, mask", &[values, rewards, mask])?;
    let [b, t] = shape.as_slice() else {
        return Err(Error::value(
            OP,
            "values",
            "a [B, T] tensor",
            ShapeFmt(&shape).to_string(),
        ));
    };
    let (b, t) = (*b, *t);
    floating(OP, "values", values)?;
    floating(OP, "rewards", rewards)?;
    unit_interval(OP, "gamma", gamma)?;
    unit_interval(OP, "lam", lam)?;
    let _guard = tch::no_grad_guard();
    let values = values.f_detach()?;
    let kind = values.kind();
    let rewards = rewards.f_detach()?.f_to_kind(kind)?;
    let keep = mask.f_ne(0)?;
    let zeros = |cols: i64| Tensor::f_zeros([b, cols], (kind, values.device()));
    let Some((lo, hi)) = mask_span(&keep)? else {
        return Ok((zeros(t)?, zeros(t)?));
    };
    let mut next_value = Tensor::f_zeros([b], (kind, values.device()))?;
    let mut last_gae = Tensor::f_zeros([b], (kind, values.device()))?;
    let mut reversed = Vec::with_capacity((hi - lo + 1) as usize);
    for col in (lo..=hi).rev() {
        let v = values.f_select(1, col)?;
        let k = keep.f_select(1, col)?;
        let delta = rewards
            .f_select(1, col)?
            .f_add(&next_value.f_mul_scalar(gamma)?)?
            .f_sub(&v)?;
        let gae = delta.f_add(&last_gae.f_mul_scalar(gamma * lam)?)?;
        reversed.push(zero_out(&gae, &k)?);
        last_gae = gae.f_where_self(&k, &last_gae)?;
        next_value = v.f_where_self(&k, &next_value)?;
    }
    reversed.reverse();
    let span = Tensor::f_stack(&reversed, 1)?;
    let advantages = Tensor::f_cat(&[zeros(lo)?, span, zeros(t - hi - 1)?], 1)?;
    let returns = zero_out(&advantages.f_add(&zero_out(&values, &keep)?)?, &keep)?;
    Ok((advantages, returns))
}
