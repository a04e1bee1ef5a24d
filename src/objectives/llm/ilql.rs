//! ILQL (implicit language Q-learning) on offline token data: trlX HEAD's `ILQLConfig.loss`
//! (rlhf.md §2.3) as a functional core ([`ilql_loss`]) with its settings ([`IlqlConfig`],
//! trlX HEAD's defaults) and typed output ([`IlqlLossOutput`]), and the same as a
//! [`LossModule`] ([`IlqlLoss`]) that runs a [`CausalLmWithIlqlHeads`] (through the small
//! [`CausalLmWithIlqlHeads`], owned or borrowed) on a batch of [`IlqlDataset`](crate::trainers::ilql::data::IlqlDataset).
//!
//! # Layout
//! One row per sample, `A` = the widest row's number of actions, `S = A + 1` states:
//!
//! | tensor | shape | meaning |
//! |---|---|---|
//! | `input_ids` | `[B, T]` int64 | the tokens (right-padded) |
//! | `actions_ixs` | `[B, A]` int64 | positions whose *next* token is an action: the action of column `j` is `input_ids[b, actions_ixs[b, j] + 1]` |
//! | `states_ixs` | `[B, S]` int64 | `actions_ixs ++ [L − 1]` (`L` the row's length) |
//! | `continues` | `[B, S]` | trlX's `dones`, which despite its name is 1 where the episode **continues** (every state but the last real one) and 0 on the last state and on padding |
//! | `rewards` | `[B, A]` | the reward of each action (trlX: 0 but the last, the normalised return) |
//! | `logits` | `[B, T, V]` | the LM logits at every position |
//! | `qs`, `target_qs` | `[B, A, V]` each, one per Q head | the Q-logits at the action positions |
//! | `vs` | `[B, S, 1]` or `[B, S]` | the values at the state positions |
//!
//! # The loss
//! With `m = continues[:, :-1]` (1 on the real actions), `n = max(1, Σ m)`,
//! `a = input_ids[:, 1:].gather(1, actions_ixs)`:
//!
//! ```text
//! Q_i     = q_i.gather(-1, a)                 targetQ = min_i target_q_i.gather(-1, a)   (detached)
//! V       = vs[:, :-1]                        Vnext   = vs[:, 1:] · continues[:, 1:]
//! Q̂       = rewards + γ · Vnext.detach()
//! loss_q   = Σ_i Σ ((Q_i − Q̂) · m)² / n
//! loss_v   = Σ |τ − 1[targetQ < V]| · (targetQ − V)² · m / n          (expectile τ)
//! cql      = Σ_i Σ CE(q_i, a) · m / n
//! awac     = Σ CE(logits[actions_ixs], a) · exp(β · (targetQ − V)).detach() · m / n
//! loss     = loss_q + loss_v + cql_scale · cql + awac_scale · awac
//! ```
//!
//! Masked-out entries take no part even when they are not finite (trlX multiplies by the
//! mask, so an `inf` AWAC weight on padding would turn the loss into NaN; here they are
//! zeroed with `where`). On finite inputs the two agree exactly. (trlX's expectile weights
//! `(targetQ >= V).int() * tau` are computed in torch's default dtype, float32, even for
//! float64 inputs; here they take the inputs' dtype.)
//!
//! **Reference note (trlX b623d1b's AWAC).** At b623d1b (`AccelerateILQLModel.loss`) the
//! AWAC term was plain language-model cross-entropy over **all** tokens,
//! `Σ CE(logits[:, :-1], input_ids[:, 1:]) · attn[:, 1:] / Σ attn[:, 1:]`, prompts included
//! and without the advantage weight. HEAD (what this module computes) restricts it to the
//! action positions and weights it by `exp(β·(targetQ − V))`; with HEAD's default `β = 0` the
//! weight is 1, i.e. behaviour cloning of the actions only.
//!
//! ```
//! use tch::Tensor;
//! use torchrl::objectives::llm::{expectile_loss, ilql_loss, IlqlConfig, IlqlInputs};
//! use torchrl::objectives::LossOutput;
//! # fn main() -> torchrl::Result<()> {
//! // rlhf.md §5.9: the expectile of targetQ [1, 0, 0.5] against V = 0.5, τ = 0.7
//! let e = expectile_loss(
//!     &Tensor::from_slice(&[1.0f64, 0.0, 0.5]),
//!     &Tensor::from_slice(&[0.5f64, 0.5, 0.5]),
//!     0.7,
//! )?;
//! let e = Vec::<f64>::try_from(e)?;
//! assert!((e[0] - 0.175).abs() < 1e-12 && (e[1] - 0.075).abs() < 1e-12 && e[2] == 0.0);
//!
//! // rlhf.md §5.10, two_qs = false
//! let m = |v: &[f64], r: i64, c: i64| Tensor::from_slice(v).view([1, r, c]);
//! let logits = m(&[1., 0., -1., 0.5, 0.5, 0., 0., 1., 0., 0.2, 0.1, 0.], 4, 3);
//! let q1 = m(&[0.1, 0.2, 0.3, 0., 0.4, 0.1, 0.3, 0.2, 0.9], 3, 3);
//! let out = ilql_loss(
//!     &IlqlInputs {
//!         logits: &logits,
//!         qs: &[q1.shallow_clone()],
//!         target_qs: &[q1.f_add_scalar(0.05)?],
//!         vs: &Tensor::from_slice(&[0.2f64, 0.35, 0.6, 0.0]).view([1, 4, 1]),
//!         input_ids: &Tensor::from_slice(&[0i64, 2, 1, 0]).view([1, 4]),
//!         actions_ixs: &Tensor::from_slice(&[0i64, 1, 2]).view([1, 3]),
//!         continues: &Tensor::from_slice(&[1i64, 1, 1, 0]).view([1, 4]),
//!         rewards: &Tensor::from_slice(&[0.0f64, 0.0, 1.0]).view([1, 3]),
//!     },
//!     &IlqlConfig::new().with_two_qs(false),
//! )?;
//! assert!((out.loss.double_value(&[]) - 1.9360441277).abs() < 1e-9);
//! assert!((out.total_loss()?.double_value(&[]) - 1.9360441277).abs() < 1e-9);
//! # Ok(()) }
//! ```

use std::borrow::Borrow;
use std::fmt;

use tch::{Kind, Tensor};

use super::masked::floating;
use crate::error::{Error, Result, ShapeFmt};
use crate::macros::setters;
use crate::modules::llm::keys::{ATTENTION_MASK_KEY, FULL_KEY};
use crate::modules::llm::{batched_index_select, CausalLmWithIlqlHeads};
use crate::objectives::common::{LossModule, LossOutput};
use crate::tensordict::{NestedKey, TensorDict};

// ------------------------------------------------------------------------------ config

/// The settings of the ILQL loss, with trlX HEAD's defaults (`default_ilql_config()`,
/// rlhf.md §2.5). The Polyak rate and the sync interval belong to the heads and the trainer.
///
/// The setters do not check; [`ilql_loss`] and [`IlqlLoss::with_config`] call
/// [`validate`](Self::validate).
///
/// ```
/// use torchrl::objectives::llm::IlqlConfig;
/// let cfg = IlqlConfig::new();
/// assert_eq!((cfg.tau, cfg.gamma, cfg.cql_scale, cfg.awac_scale, cfg.beta), (0.7, 0.99, 0.1, 1.0, 0.0));
/// assert!(cfg.two_qs && cfg.validate().is_ok());
/// let err = IlqlConfig::new().with_tau(1.5).validate().unwrap_err();
/// assert!(matches!(err, torchrl::Error::InvalidConfig { field: "tau", .. }));
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct IlqlConfig {
    /// The expectile of the V regression; in `(0, 1)` (0.5 is the mean squared error, → 1 a
    /// maximum over the Q estimates). Default 0.7.
    pub tau: f64,
    /// The discount γ; in `[0, 1]`. Default 0.99.
    pub gamma: f64,
    /// The weight of the CQL term; finite, `>= 0`. Default 0.1.
    pub cql_scale: f64,
    /// The weight of the AWAC term; finite, `>= 0`. Default 1.
    pub awac_scale: f64,
    /// The AWAC weight's temperature: `exp(β · (targetQ − V))`; finite, `>= 0`. Default 0
    /// (weight 1: behaviour cloning).
    pub beta: f64,
    /// Two Q heads (the targets take their minimum) or one. Default `true`.
    pub two_qs: bool,
}

impl Default for IlqlConfig {
    fn default() -> Self {
        IlqlConfig {
            tau: 0.7,
            gamma: 0.99,
            cql_scale: 0.1,
            awac_scale: 1.0,
            beta: 0.0,
            two_qs: true,
        }
    }
}

impl IlqlConfig {
    /// The defaults.
    pub fn new() -> Self {
        Self::default()
    }

    setters! {
        /// Sets [`tau`](Self::tau).
        with_tau(tau: f64);
        /// Sets [`gamma`](Self::gamma).
        with_gamma(gamma: f64);
        /// Sets [`cql_scale`](Self::cql_scale).
        with_cql_scale(cql_scale: f64);
        /// Sets [`awac_scale`](Self::awac_scale).
        with_awac_scale(awac_scale: f64);
        /// Sets [`beta`](Self::beta).
        with_beta(beta: f64);
        /// Sets [`two_qs`](Self::two_qs).
        with_two_qs(two_qs: bool);
    }

    /// The number of Q heads the loss expects (2 with [`two_qs`](Self::two_qs), else 1).
    pub fn n_qs(&self) -> usize {
        if self.two_qs {
            2
        } else {
            1
        }
    }

    /// Checks every field.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the first field out of range.
    pub fn validate(&self) -> Result<()> {
        const OP: &str = "IlqlConfig";
        if !(self.tau > 0.0 && self.tau < 1.0) {
            return Err(Error::config(OP, "tau", "in (0, 1)", self.tau));
        }
        if !(0.0..=1.0).contains(&self.gamma) {
            return Err(Error::config(OP, "gamma", "in [0, 1]", self.gamma));
        }
        for (field, v) in [
            ("cql_scale", self.cql_scale),
            ("awac_scale", self.awac_scale),
            ("beta", self.beta),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(Error::config(OP, field, "finite and >= 0", v));
            }
        }
        Ok(())
    }
}

// ------------------------------------------------------------------------------ expectile

/// The expectile loss of `target` against `value`, element-wise:
/// `|τ − 1[target < value]| · (target − value)²` (trlX's `loss_v` before masking).
///
/// # Shapes
/// `target` and `value` the same shape; the output has it too.
///
/// # Errors
/// When the shapes differ, or `tau` is outside `(0, 1)`.
///
/// ```
/// use tch::Tensor;
/// use torchrl::objectives::llm::expectile_loss;
/// // a positive error weighs τ, a negative one 1 − τ
/// let e = expectile_loss(&Tensor::from_slice(&[2.0f64, -2.0]), &Tensor::from_slice(&[0.0f64, 0.0]), 0.9)?;
/// let e = Vec::<f64>::try_from(e)?;
/// assert!((e[0] - 3.6).abs() < 1e-12 && (e[1] - 0.4).abs() < 1e-12);
/// # Ok::<(), torchrl::Error>(())
/// ```
pub fn expectile_loss(target: &Tensor, value: &Tensor, tau: f64) -> Result<Tensor> {
    const OP: &str = "expectile_loss";
    if target.size() != value.size() {
        return Err(Error::ShapeMismatch {
            op: OP,
            key: "value".into(),
            expected: target.size(),
            actual: value.size(),
        });
    }
    if !(tau > 0.0 && tau < 1.0) {
        return Err(Error::argument(OP, "tau", "in (0, 1)", tau.to_string()));
    }
    let diff = target.f_sub(value)?;
    let below = target.f_lt_tensor(value)?;
    let weight =
        Tensor::f_full_like(&diff, tau)?.f_where_scalarother(&below.f_logical_not()?, 1.0 - tau)?;
    Ok(weight.f_mul(&diff.f_square()?)?)
}

// ------------------------------------------------------------------------------ loss

/// The inputs of [`ilql_loss`]: the model's outputs and the batch, laid out as in the
/// [module docs](self).
#[derive(Debug, Clone, Copy)]
pub struct IlqlInputs<'a> {
    /// LM logits at every position, `[B, T, V]` (differentiable).
    pub logits: &'a Tensor,
    /// Q-logits at the action positions, one `[B, A, V]` tensor per Q head (differentiable).
    pub qs: &'a [Tensor],
    /// The target heads' Q-logits, as `qs` (treated as constants).
    pub target_qs: &'a [Tensor],
    /// Values at the state positions, `[B, S, 1]` or `[B, S]`, `S = A + 1`
    /// (differentiable).
    pub vs: &'a Tensor,
    /// Token ids `[B, T]` (int64).
    pub input_ids: &'a Tensor,
    /// Action positions `[B, A]` (int64, each in `[0, T − 2]`).
    pub actions_ixs: &'a Tensor,
    /// The continuation mask `[B, S]` (trlX's `dones`; any dtype, non-zero = continues).
    pub continues: &'a Tensor,
    /// Per-action rewards `[B, A]`.
    pub rewards: &'a Tensor,
}

/// The output of [`ilql_loss`] / [`IlqlLoss`]: trlX's `ILQLConfig.loss` value and statistics.
///
/// The differentiable terms are `loss_q`, `loss_v`, `loss_cql` and `loss_awac` (the last two
/// scaled, as they enter the loss; [`LossOutput::total_loss`] is `loss`); the rest are
/// detached 0-dim statistics, every mean over the `n = max(1, Σ m)` real actions (trlX's
/// `get_tensor_stats`).
///
/// # Shapes
/// Every field is `[]` (`q_mean` holds one per Q head).
#[derive(Debug)]
pub struct IlqlLossOutput {
    /// `loss_q + loss_v + loss_cql + loss_awac` (trlX's `loss`).
    pub loss: Tensor,
    /// The Q regression `Σ_i Σ ((Q_i − Q̂)·m)² / n`, summed over heads (trlX's `loss_q`).
    pub loss_q: Tensor,
    /// The expectile V regression against the target Q (trlX's `loss_v`).
    pub loss_v: Tensor,
    /// `cql_scale · cql_loss`, the CQL term as it enters the loss.
    pub loss_cql: Tensor,
    /// `awac_scale · awac_loss`, the AWAC term as it enters the loss.
    pub loss_awac: Tensor,
    /// trlX's unscaled `loss_cql` (`Σ_i Σ CE(q_i, a)·m / n`), detached.
    pub cql_loss: Tensor,
    /// trlX's unscaled `loss_awac` (`Σ CE(logits, a)·w·m / n`), detached.
    pub awac_loss: Tensor,
    /// The mean of each head's `Q_i(s, a)` (trlX's `qvalues/{i}/mean`).
    pub q_mean: Vec<Tensor>,
    /// The mean of `targetQ = min_i target_Q_i(s, a)`.
    pub target_q_mean: Tensor,
    /// The mean of `V(s)` (trlX's `values/mean`).
    pub v_mean: Tensor,
    /// The mean advantage `targetQ − V`.
    pub advantage_mean: Tensor,
    /// The mean AWAC weight `exp(β·(targetQ − V))` (trlX's `awac_weight/mean`).
    pub awac_weight_mean: Tensor,
    /// The largest AWAC weight over the real actions (trlX's `awac_weight/max`; 0 when
    /// there is none).
    pub awac_weight_max: Tensor,
    /// `n = max(1, Σ m)`, the number of real actions (float).
    pub n_actions: Tensor,
}

impl LossOutput for IlqlLossOutput {
    fn loss_terms(&self) -> Vec<(&'static str, &Tensor)> {
        vec![
            ("loss_q", &self.loss_q),
            ("loss_v", &self.loss_v),
            ("loss_cql", &self.loss_cql),
            ("loss_awac", &self.loss_awac),
        ]
    }

    fn metrics(&self) -> Vec<(&'static str, &Tensor)> {
        const Q_NAMES: [&str; 2] = ["q1_mean", "q2_mean"];
        let mut out = vec![("cql_loss", &self.cql_loss), ("awac_loss", &self.awac_loss)];
        out.extend(Q_NAMES.iter().copied().zip(self.q_mean.iter()));
        out.extend([
            ("target_q_mean", &self.target_q_mean),
            ("v_mean", &self.v_mean),
            ("advantage_mean", &self.advantage_mean),
            ("awac_weight_mean", &self.awac_weight_mean),
            ("awac_weight_max", &self.awac_weight_max),
            ("n_actions", &self.n_actions),
        ]);
        out
    }
}

fn shape_err(op: &'static str, key: &str, expected: String, t: &Tensor) -> Error {
    Error::value(op, key, expected, ShapeFmt(&t.size()).to_string())
}

fn expect_shape(op: &'static str, key: &str, t: &Tensor, shape: &[i64]) -> Result<()> {
    if t.size() == shape {
        Ok(())
    } else {
        Err(shape_err(op, key, format!("shape {}", ShapeFmt(shape)), t))
    }
}

/// Checks the shapes of every input; returns `(B, T, V, A)`.
fn check_inputs(op: &'static str, x: &IlqlInputs<'_>, n_qs: usize) -> Result<(i64, i64, i64, i64)> {
    let (b, t, v) = x
        .logits
        .size3()
        .map_err(|_| shape_err(op, "logits", "shape [B, T, V]".into(), x.logits))?;
    floating(op, "logits", x.logits)?;
    expect_shape(op, "input_ids", x.input_ids, &[b, t])?;
    let size = x.actions_ixs.size();
    let a = match size.as_slice() {
        [rows, a] if *rows == b => *a,
        _ => {
            return Err(shape_err(
                op,
                "actions_ixs",
                format!("shape [{b}, A]"),
                x.actions_ixs,
            ))
        }
    };
    for (what, heads) in [("qs", x.qs), ("target_qs", x.target_qs)] {
        if heads.len() != n_qs {
            return Err(Error::value(
                op,
                what,
                format!(
                    "{n_qs} Q head{} (IlqlConfig::two_qs = {})",
                    if n_qs == 1 { "" } else { "s" },
                    n_qs == 2
                ),
                format!("{} tensors", heads.len()),
            ));
        }
        for (i, q) in heads.iter().enumerate() {
            expect_shape(op, &format!("{what}[{i}]"), q, &[b, a, v])?;
            floating(op, &format!("{what}[{i}]"), q)?;
        }
    }
    let vs_ok = match x.vs.size().as_slice() {
        [rows, s] => *rows == b && *s == a + 1,
        [rows, s, 1] => *rows == b && *s == a + 1,
        _ => false,
    };
    if !vs_ok {
        return Err(shape_err(
            op,
            "vs",
            format!("shape [{b}, {}, 1] or [{b}, {}] (S = A + 1)", a + 1, a + 1),
            x.vs,
        ));
    }
    floating(op, "vs", x.vs)?;
    expect_shape(op, "continues", x.continues, &[b, a + 1])?;
    expect_shape(op, "rewards", x.rewards, &[b, a])?;
    if a > 0 {
        let ixs = x.actions_ixs.f_to_kind(Kind::Int64)?;
        let (lo, hi) = (ixs.f_min()?.int64_value(&[]), ixs.f_max()?.int64_value(&[]));
        if lo < 0 || hi > t - 2 {
            return Err(Error::value(
                op,
                "actions_ixs",
                format!(
                    "positions in [0, {}] (T = {t}: the action is the next token)",
                    t - 2
                ),
                format!("positions in [{lo}, {hi}]"),
            ));
        }
    }
    Ok((b, t, v, a))
}

/// trlX HEAD's ILQL loss (`ILQLConfig.loss`, rlhf.md §2.3), formulas in the
/// [module docs](self).
///
/// # Shapes
/// As [`IlqlInputs`]; every output `[]`.
///
/// # Errors
/// When a shape differs from the layout (the error names the tensor, the shape expected and
/// the one given), the number of Q heads is not the config's ([`IlqlConfig::n_qs`]), an
/// action position is outside `[0, T − 2]`, or the config is invalid.
///
/// ```
/// use tch::{Kind, Tensor};
/// use torchrl::objectives::llm::{ilql_loss, IlqlConfig, IlqlInputs};
/// # fn main() -> torchrl::Result<()> {
/// // uniform logits and Q-logits over 4 tokens: each cross-entropy is ln 4
/// let z = |s: &[i64]| Tensor::zeros(s, (Kind::Double, tch::Device::Cpu));
/// let (logits, q) = (z(&[1, 3, 4]), z(&[1, 2, 4]));
/// let out = ilql_loss(
///     &IlqlInputs {
///         logits: &logits,
///         qs: &[q.shallow_clone(), q.shallow_clone()],
///         target_qs: &[q.shallow_clone(), q.shallow_clone()],
///         vs: &z(&[1, 3, 1]),
///         input_ids: &Tensor::from_slice(&[0i64, 1, 2]).view([1, 3]),
///         actions_ixs: &Tensor::from_slice(&[0i64, 1]).view([1, 2]),
///         continues: &Tensor::from_slice(&[1i64, 1, 0]).view([1, 3]),
///         rewards: &Tensor::from_slice(&[0.0f64, 1.0]).view([1, 2]),
///     },
///     &IlqlConfig::new(),
/// )?;
/// let ln4 = 4f64.ln();
/// assert!((out.cql_loss.double_value(&[]) - 2.0 * ln4).abs() < 1e-12); // two heads
/// assert!((out.awac_loss.double_value(&[]) - ln4).abs() < 1e-12);
/// // Q = 0, targets: [0, 1] (the last action has no next state): 2 heads × (0 + 1) / 2
/// assert!((out.loss_q.double_value(&[]) - 1.0).abs() < 1e-12);
/// # Ok(()) }
/// ```
pub fn ilql_loss(inputs: &IlqlInputs<'_>, config: &IlqlConfig) -> Result<IlqlLossOutput> {
    const OP: &str = "ilql_loss";
    config.validate()?;
    let (b, _, _, a) = check_inputs(OP, inputs, config.n_qs())?;
    let kind = inputs.vs.kind();
    let vs = if inputs.vs.dim() == 3 {
        inputs.vs.f_squeeze_dim(-1)?
    } else {
        inputs.vs.shallow_clone()
    };
    let cont = inputs.continues.f_ne(0)?;
    let keep = cont.f_narrow(1, 0, a)?; // trlX's terminal_mask
    let m = keep.f_to_kind(kind)?;
    let n = m.f_sum(None::<Kind>)?.f_clamp_min(1.0)?;
    let masked_mean = |x: &Tensor| -> Result<Tensor> {
        Ok(x.f_where_scalarother(&keep, 0.0)?
            .f_sum(None::<Kind>)?
            .f_div(&n)?)
    };

    let ixs = inputs.actions_ixs.f_to_kind(Kind::Int64)?;
    let t = inputs.input_ids.size().get(1).copied().unwrap_or(0);
    let actions = inputs
        .input_ids
        .f_narrow(1, 1, t - 1)?
        .f_to_kind(Kind::Int64)?
        .f_gather(1, &ixs, false)?; // [B, A]
    let actions3 = actions.f_unsqueeze(-1)?;
    let pick =
        |q: &Tensor| -> Result<Tensor> { Ok(q.f_gather(-1, &actions3, false)?.f_squeeze_dim(-1)?) };

    let q_sa = inputs.qs.iter().map(pick).collect::<Result<Vec<_>>>()?;
    let target_q = {
        let _guard = tch::no_grad_guard();
        let mut picked = inputs
            .target_qs
            .iter()
            .map(|q| pick(&q.f_detach()?))
            .collect::<Result<Vec<_>>>()?
            .into_iter();
        let first = picked
            .next()
            .ok_or_else(|| Error::value(OP, "target_qs", "at least one head", "none"))?;
        picked.try_fold(first, |acc, q| acc.f_minimum(&q))?
    };

    let value = vs.f_narrow(1, 0, a)?;
    let next_value = vs
        .f_narrow(1, 1, a)?
        .f_where_scalarother(&cont.f_narrow(1, 1, a)?, 0.0)?
        .f_detach()?;
    let q_target = inputs
        .rewards
        .f_to_kind(kind)?
        .f_add(&next_value.f_mul_scalar(config.gamma)?)?;

    let mut loss_q = Tensor::f_zeros([], (kind, vs.device()))?;
    for q in &q_sa {
        loss_q = loss_q.f_add(&masked_mean(&q.f_sub(&q_target)?.f_square()?)?)?;
    }

    let loss_v = masked_mean(&expectile_loss(&target_q, &value, config.tau)?)?;

    let ce = |logits: &Tensor| -> Result<Tensor> {
        // cross-entropy of [B, A, V] logits against the actions, [B, A]
        Ok(logits
            .f_log_softmax(-1, logits.kind())?
            .f_gather(-1, &actions3, false)?
            .f_squeeze_dim(-1)?
            .f_neg()?
            .f_view([b, a])?)
    };
    let mut cql_loss = Tensor::f_zeros([], (kind, vs.device()))?;
    for q in inputs.qs {
        cql_loss = cql_loss.f_add(&masked_mean(&ce(q)?)?)?;
    }

    let action_logits = batched_index_select(inputs.logits, &ixs)?;
    let (advantage, awac_weight) = {
        let _guard = tch::no_grad_guard();
        let adv = target_q.f_sub(&value.f_detach()?)?;
        let w = adv.f_mul_scalar(config.beta)?.f_exp()?;
        (adv, w)
    };
    let awac_ce = ce(&action_logits)?.f_to_kind(kind)?;
    let awac_loss = masked_mean(&awac_ce.f_mul(&awac_weight)?)?;

    let loss_cql = cql_loss.f_mul_scalar(config.cql_scale)?;
    let loss_awac = awac_loss.f_mul_scalar(config.awac_scale)?;
    let loss = loss_q.f_add(&loss_v)?.f_add(&loss_cql)?.f_add(&loss_awac)?;

    let _guard = tch::no_grad_guard();
    let awac_weight_max = if a > 0 {
        awac_weight.f_where_scalarother(&keep, 0.0)?.f_max()?
    } else {
        Tensor::f_zeros([], (kind, vs.device()))?
    };
    Ok(IlqlLossOutput {
        cql_loss: cql_loss.f_detach()?,
        awac_loss: awac_loss.f_detach()?,
        q_mean: q_sa
            .iter()
            .map(|q| masked_mean(&q.f_detach()?))
            .collect::<Result<Vec<_>>>()?,
        target_q_mean: masked_mean(&target_q)?,
        v_mean: masked_mean(&value.f_detach()?)?,
        advantage_mean: masked_mean(&advantage)?,
        awac_weight_mean: masked_mean(&awac_weight)?,
        awac_weight_max,
        n_actions: n.f_detach()?,
        loss,
        loss_q,
        loss_v,
        loss_cql,
        loss_awac,
    })
}

// ------------------------------------------------------------------------------ loss module

crate::accepted_keys! {
    /// The keys of [`IlqlLoss`], which are also where
    /// [`IlqlDataset`](crate::trainers::ilql::data::IlqlDataset) writes its batches (layout
    /// in the [module docs](self)).
    pub struct IlqlKeys {
        /// Token ids `[B, T]` (int64, right-padded with 0). Default `("tokens", "full")`.
        tokens: FULL_KEY,
        /// 1 on real tokens `[B, T]`. Default `("masks", "all_attention_mask")`.
        attention_mask: ATTENTION_MASK_KEY,
        /// Action positions `[B, A]` (int64). Default `"actions_ixs"` ([`LlmKeys`]'s).
        ///
        /// [`LlmKeys`]: crate::modules::llm::LlmKeys
        actions_ixs: "actions_ixs",
        /// State positions `[B, A + 1]` (int64). Default `"states_ixs"` ([`LlmKeys`]'s).
        ///
        /// [`LlmKeys`]: crate::modules::llm::LlmKeys
        states_ixs: "states_ixs",
        /// The continuation mask `[B, A + 1]` (trlX's `dones`: 1 = not done). Default
        /// `"continues"`.
        continues: "continues",
        /// Per-action rewards `[B, A]`. Default `"action_rewards"`.
        action_rewards: "action_rewards",
    }
}

/// The ILQL loss as a [`LossModule`]: reads a batch through [`IlqlKeys`], runs the model
/// ([`CausalLmWithIlqlHeads::ilql_forward`]) once on its tokens and positions, and returns [`ilql_loss`]'s
/// [`IlqlLossOutput`].
///
/// `M` is the model, owned or borrowed (`IlqlLoss::new(&model)`: the trainer keeps the model,
/// its optimizer and the target-head sync).
///
/// # Keys
/// `in_keys()` = `tokens`, `attention_mask`, `actions_ixs`, `states_ixs`, `continues`,
/// `action_rewards`; settable with [`LossModule::set_keys`].
///
/// ```
/// use tch::{nn::VarStore, Device};
/// use torchrl::modules::llm::{CausalLmWithIlqlHeads, Gpt2Config, Gpt2Model};
/// use torchrl::objectives::llm::{IlqlConfig, IlqlLoss};
/// use torchrl::objectives::{LossModule, LossOutput};
/// use torchrl::trainers::ilql::data::{IlqlDataConfig, IlqlDataset, IlqlTokenSample};
/// # fn main() -> torchrl::Result<()> {
/// let vs = VarStore::new(Device::Cpu);
/// let cfg = Gpt2Config::new(16).with_n_layer(1).with_n_embd(8).with_n_head(2).with_n_positions(16);
/// let model = CausalLmWithIlqlHeads::from_model(&vs.root(), Gpt2Model::new(&vs.root(), &cfg)?, true, 0.001)?;
/// let data = IlqlDataset::from_token_rows(
///     &[IlqlTokenSample::new(vec![1, 2], vec![3, 4, 5], 1.0), IlqlTokenSample::new(vec![6], vec![7], 0.0)],
///     &IlqlDataConfig::new(),
/// )?;
/// let mut loss = IlqlLoss::new(&model).with_config(IlqlConfig::new())?;
/// let out = loss.forward(&data.batch(&[0, 1])?)?;
/// assert_eq!(out.n_actions.double_value(&[]), 4.0); // 3 + 1 actions
/// out.total_loss()?.backward();
/// // keys are settable by name
/// loss.set_keys(&[("action_rewards", Some("r".into()))])?;
/// assert!(loss.forward(&data.batch(&[0])?).is_err()); // "r" is not in the batch
/// # Ok(()) }
/// ```
pub struct IlqlLoss<M> {
    model: M,
    config: IlqlConfig,
    keys: IlqlKeys,
    in_keys: Vec<NestedKey>,
}

impl<M> fmt::Debug for IlqlLoss<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IlqlLoss")
            .field("config", &self.config)
            .field("keys", &self.keys)
            .finish_non_exhaustive()
    }
}

impl<M: Borrow<CausalLmWithIlqlHeads>> IlqlLoss<M> {
    /// A loss over `model` with the default [`IlqlConfig`] and keys.
    pub fn new(model: M) -> Self {
        let keys = IlqlKeys::default();
        IlqlLoss {
            model,
            config: IlqlConfig::default(),
            in_keys: Self::compute_in_keys(&keys),
            keys,
        }
    }

    /// Replaces the config, after [`IlqlConfig::validate`].
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the bad field.
    pub fn with_config(mut self, config: IlqlConfig) -> Result<Self> {
        config.validate()?;
        self.config = config;
        Ok(self)
    }

    /// Builder form of [`LossModule::set_tensor_keys`].
    pub fn with_keys(mut self, keys: IlqlKeys) -> Self {
        self.in_keys = Self::compute_in_keys(&keys);
        self.keys = keys;
        self
    }

    /// The config.
    pub fn config(&self) -> &IlqlConfig {
        &self.config
    }

    /// The model.
    pub fn model(&self) -> &M {
        &self.model
    }

    fn compute_in_keys(keys: &IlqlKeys) -> Vec<NestedKey> {
        vec![
            keys.tokens.clone(),
            keys.attention_mask.clone(),
            keys.actions_ixs.clone(),
            keys.states_ixs.clone(),
            keys.continues.clone(),
            keys.action_rewards.clone(),
        ]
    }
}

impl<M: Borrow<CausalLmWithIlqlHeads>> LossModule for IlqlLoss<M> {
    type Keys = IlqlKeys;
    type Output = IlqlLossOutput;

    fn name(&self) -> &'static str {
        "IlqlLoss"
    }

    fn tensor_keys(&self) -> &IlqlKeys {
        &self.keys
    }

    fn set_tensor_keys(&mut self, keys: IlqlKeys) -> Result<()> {
        self.in_keys = Self::compute_in_keys(&keys);
        self.keys = keys;
        Ok(())
    }

    fn in_keys(&self) -> &[NestedKey] {
        &self.in_keys
    }

    fn forward(&self, td: &TensorDict) -> Result<IlqlLossOutput> {
        let k = &self.keys;
        let tokens = td.get_or_err(&k.tokens)?;
        let attention_mask = td.get_or_err(&k.attention_mask)?;
        let actions_ixs = td.get_or_err(&k.actions_ixs)?;
        let states_ixs = td.get_or_err(&k.states_ixs)?;
        let continues = td.get_or_err(&k.continues)?;
        let rewards = td.get_or_err(&k.action_rewards)?;
        let out =
            self.model
                .borrow()
                .ilql_forward(tokens, attention_mask, actions_ixs, states_ixs)?;
        ilql_loss(
            &IlqlInputs {
                logits: &out.logits,
                qs: &out.heads.qs,
                target_qs: &out.heads.target_qs,
                vs: &out.heads.vs,
                input_ids: tokens,
                actions_ixs,
                continues,
                rewards,
            },
            &self.config,
        )
    }
}
