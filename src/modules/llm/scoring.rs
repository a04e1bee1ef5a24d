//! [`ScoreTokens`]: the one trait for "a causal LM scores tokens". Losses (PPO-RLHF, GRPO,
//! DPO), the KL transforms' reference and the trainers take it; generation reaches the model
//! behind it through [`ScoreTokens::generating_model`].
//!
//! A scorer gives, for `tokens` `[B, T]` (int64) under `attention_mask` `[B, T]` (1 = real
//! token), per-token log-probs aligned with the tokens ([`token_log_probs`]:
//! `lp[t] = log p(token[t] | tokens < t)`, 0 at `t = 0` and where the token or the one before
//! it is padding) and, when asked ([`ScoreRequest`]) and able, per-token values
//! ([`align_values_to_tokens`]: `V(state before token t)`) and the exact entropy of the
//! next-token distribution ([`token_entropy`]), all from one forward. Gradients flow as the
//! caller's grad mode says: a reference is scored under `tch::no_grad`, a policy in training
//! with gradient.
//!
//! Implemented for every model (each model file's type, e.g.
//! [`Gpt2Model`](super::Gpt2Model), and `dyn CausalLm`: log-probs and entropy), the
//! heads ([`CausalLmWithValueHead`], [`CausalLmWithHydraValueHead`]'s policy side: log-probs,
//! values, entropy), [`HydraReference`] (a hydra model's frozen reference, trlX's
//! `forward_hydra`), [`CachedTrunk`](super::CachedTrunk) and closures through [`ScoreFn`]; and
//! through `&T`, `Box<T>`, `Rc<T>`, `Arc<T>` and `Arc<Mutex<T>>` (what a transform holds: a
//! model shared with the trainer must be `Send + 'static`, and `tch::Tensor` is not `Sync`).
//!
//! ```
//! use std::sync::{Arc, Mutex};
//! use tch::{nn::VarStore, Device, Tensor};
//! use torchrl::modules::llm::{
//!     CausalLmWithHydraValueHead, Gpt2Config, HydraReference, ScoreRequest, ScoreTokens,
//! };
//! # fn main() -> torchrl::Result<()> {
//! let vs = VarStore::new(Device::Cpu);
//! let cfg = Gpt2Config::new(20).with_n_layer(2).with_n_embd(8).with_n_head(2).with_n_positions(8);
//! let hydra = Arc::new(Mutex::new(CausalLmWithHydraValueHead::new(&vs.root(), &cfg, 1)?));
//! let reference = HydraReference::new(Arc::clone(&hydra)); // no parameter is copied
//! let ids = Tensor::from_slice(&[1i64, 2, 3, 4]).view([1, 4]);
//! let mask = Tensor::ones([1, 4], (tch::Kind::Int64, Device::Cpu));
//! let ref_lp = tch::no_grad(|| reference.token_log_probs(&ids, &mask))?;
//! let policy = hydra.score_tokens(&ids, &mask, ScoreRequest::values_and_entropy())?;
//! assert_eq!(ref_lp.size(), vec![1, 4]);
//! assert!(ref_lp.equal(&policy.log_probs)); // at construction the reference is the policy
//! assert_eq!(policy.values.unwrap().size(), vec![1, 4]);
//! // a bare model has no value head: asking for values is an error naming it
//! assert!(reference.log_probs_and_values(&ids, &mask).is_err());
//! # Ok(()) }
//! ```

use std::fmt;
use std::rc::Rc;
use std::sync::{Arc, Mutex};

use tch::{Kind, Tensor};

use super::causal_lm::{CausalLm, ForwardOptions, LmInput};
use super::heads::{CausalLmWithHydraValueHead, CausalLmWithValueHead};
use crate::error::{Error, Result, ShapeFmt};

/// What a scorer is asked for besides the log-probs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ScoreRequest {
    /// Per-token values (a scorer without a value head gives none).
    pub values: bool,
    /// The exact per-token entropy (a scorer without logits, such as a closure, gives none).
    pub entropy: bool,
    /// The first position whose log-prob and entropy the caller reads (default 0: every
    /// position). A model scorer then runs its LM head only on the positions that predict
    /// those tokens (`scored_from - 1` on) and gives 0 before `scored_from`: for a prompt +
    /// response batch, the first response position skips the LM head and the log-softmax over
    /// the prompt, as TRL's `logits_to_keep` does. A scorer may ignore it (a closure) and give
    /// every position; values are always given at every position.
    pub scored_from: i64,
}

impl ScoreRequest {
    /// Log-probs only.
    pub fn log_probs() -> Self {
        ScoreRequest::default()
    }

    /// Log-probs and values.
    pub fn values() -> Self {
        ScoreRequest {
            values: true,
            entropy: false,
            scored_from: 0,
        }
    }

    /// Log-probs, values and entropy.
    pub fn values_and_entropy() -> Self {
        ScoreRequest {
            values: true,
            entropy: true,
            scored_from: 0,
        }
    }

    /// Sets [`ScoreRequest::scored_from`]: only positions `position..` are read.
    ///
    /// ```
    /// use tch::{nn::VarStore, Device, Tensor};
    /// use torchrl::modules::llm::{Gpt2Config, Gpt2Model, ScoreRequest, ScoreTokens};
    /// # fn main() -> torchrl::Result<()> {
    /// let vs = VarStore::new(Device::Cpu);
    /// let cfg = Gpt2Config::new(20).with_n_layer(1).with_n_embd(8).with_n_head(2).with_n_positions(8);
    /// let model = Gpt2Model::new(&vs.root(), &cfg)?;
    /// let ids = Tensor::from_slice(&[1i64, 2, 3, 4, 5, 6]).view([1, 6]);
    /// let mask = ids.ones_like();
    /// let all = model.score_tokens(&ids, &mask, ScoreRequest::log_probs())?.log_probs;
    /// let tail = model.score_tokens(&ids, &mask, ScoreRequest::log_probs().scored_from(4))?;
    /// // positions 4.. as a full forward gives them (the LM head ran on positions 3..), 0 before
    /// let diff = (tail.log_probs.narrow(1, 4, 2) - all.narrow(1, 4, 2)).abs().max();
    /// assert!(diff.double_value(&[]) < 1e-6);
    /// assert_eq!(tail.log_probs.narrow(1, 0, 4).abs().sum(tch::Kind::Float).double_value(&[]), 0.0);
    /// # Ok(()) }
    /// ```
    pub fn scored_from(mut self, position: i64) -> Self {
        self.scored_from = position;
        self
    }
}

/// The first position an LM head must run on for the log-probs of `scored_from..` (the one
/// before it), within `0..t`.
pub(crate) fn head_start(scored_from: i64, t: i64) -> i64 {
    (scored_from - 1).min(t - 1).max(0)
}

/// A hidden state `[B, T, hidden]` from position `start` on, contiguous (itself at 0): the
/// input of an LM head that runs on those positions only. Contiguous because a strided
/// `[B, T', hidden]` that needs its gradient makes `matmul` broadcast the `[vocab, hidden]`
/// head over the batch (a bmm, copying the head B times: 3.5x slower and 1.7 GiB more at the
/// Qwen2.5-0.5B shape) instead of one folded `[B·T', hidden]` mm.
pub(crate) fn hidden_from(hidden: &Tensor, start: i64) -> Result<Tensor> {
    if start == 0 {
        return Ok(hidden.shallow_clone());
    }
    let t = hidden.size().get(1).copied().unwrap_or(0);
    Ok(hidden.f_narrow(1, start, t - start)?.f_contiguous()?)
}

/// A model's LM head on `last_hidden` `[B, T, hidden]` from position `start` on.
pub(crate) fn lm_head_from(
    model: &dyn CausalLm,
    last_hidden: &Tensor,
    start: i64,
) -> Result<Tensor> {
    model.lm_head(&hidden_from(last_hidden, start)?)
}

/// A model's scores from its final hidden state `last_hidden` (the trunk already run): the LM
/// head from the position before [`ScoreRequest::scored_from`] on ([`lm_head_from`]), then
/// [`scores_from_head`] with `head_values` (a value head's output over every position).
pub(crate) fn scores_from_hidden(
    model: &dyn CausalLm,
    last_hidden: &Tensor,
    head_values: Option<&Tensor>,
    tokens: &Tensor,
    attention_mask: &Tensor,
    request: ScoreRequest,
) -> Result<TokenScores> {
    let start = head_start(
        request.scored_from,
        tokens.size().get(1).copied().unwrap_or(0),
    );
    let logits = lm_head_from(model, last_hidden, start)?;
    scores_from_head(&logits, start, head_values, tokens, attention_mask, request)
}

/// Scores from an LM head run on positions `start..T` ([`lm_head_from`]); the log-probs and
/// entropy of positions `..=start` are 0, `head_values` (when given) cover every position.
pub(crate) fn scores_from_head(
    logits: &Tensor,
    start: i64,
    head_values: Option<&Tensor>,
    tokens: &Tensor,
    attention_mask: &Tensor,
    request: ScoreRequest,
) -> Result<TokenScores> {
    if start == 0 {
        return scores_from_logits(logits, head_values, tokens, attention_mask, request);
    }
    let [b, t] = match tokens.size().as_slice() {
        [b, t] => [*b, *t],
        _ => return Err(Error::invalid("score_tokens", "tokens must be [B, T]")),
    };
    let keep = t - start;
    let tail = scores_from_logits(
        logits,
        None,
        &tokens.f_narrow(1, start, keep)?,
        &attention_mask.f_narrow(1, start, keep)?,
        request,
    )?;
    let pad = |x: Tensor| -> Result<Tensor> {
        let zeros = Tensor::f_zeros([b, start], (x.kind(), x.device()))?;
        Ok(Tensor::f_cat(&[&zeros, &x], 1)?)
    };
    let values = match head_values {
        Some(v) if request.values => Some(align_values_to_tokens(v)?),
        _ => None,
    };
    Ok(TokenScores {
        log_probs: pad(tail.log_probs)?,
        values,
        entropy: tail.entropy.map(pad).transpose()?,
    })
}

/// What a scorer returns: `[B, T]` each, aligned with the tokens (see the [module docs](self)).
#[derive(Debug)]
pub struct TokenScores {
    /// Per-token log-probs, float32 (float64 for a float64 model).
    pub log_probs: Tensor,
    /// Per-token values, when asked for and available.
    pub values: Option<Tensor>,
    /// Per-token entropy, when asked for and available (in the log-probs' dtype).
    pub entropy: Option<Tensor>,
}

/// A causal LM that scores tokens. See the [module docs](self).
pub trait ScoreTokens {
    /// Scores `tokens` `[B, T]` under `attention_mask` `[B, T]`, giving what `request` asks
    /// for when the scorer can (the fields it cannot give are `None`).
    ///
    /// # Errors
    /// As the model's forward (shapes, dtypes, ids outside the vocabulary).
    fn score_tokens(
        &self,
        tokens: &Tensor,
        attention_mask: &Tensor,
        request: ScoreRequest,
    ) -> Result<TokenScores>;

    /// The model that generates for this scorer (the policy's, never a frozen reference's);
    /// `None` for a scorer that is not a model (a closure).
    fn generating_model(&self) -> Option<&dyn CausalLm> {
        None
    }

    /// The per-token log-probs alone.
    ///
    /// # Errors
    /// As [`score_tokens`](Self::score_tokens).
    fn token_log_probs(&self, tokens: &Tensor, attention_mask: &Tensor) -> Result<Tensor> {
        Ok(self
            .score_tokens(tokens, attention_mask, ScoreRequest::log_probs())?
            .log_probs)
    }

    /// Log-probs and values (the PPO learner's pair).
    ///
    /// # Errors
    /// As [`score_tokens`](Self::score_tokens), or a scorer without values.
    fn log_probs_and_values(
        &self,
        tokens: &Tensor,
        attention_mask: &Tensor,
    ) -> Result<(Tensor, Tensor)> {
        let s = self.score_tokens(tokens, attention_mask, ScoreRequest::values())?;
        Ok((s.log_probs, require_values(s.values)?))
    }
}

/// The values of a score, or the error saying the scorer has no value head.
pub(crate) fn require_values(values: Option<Tensor>) -> Result<Tensor> {
    values.ok_or_else(|| {
        Error::invalid(
            "ScoreTokens",
            "this scorer gives no values (a bare model or a reference has no value head; \
             use a CausalLmWithValueHead or a hydra policy)",
        )
    })
}

/// Checks the two inputs' shapes agree (`[B, T]` each).
fn check_inputs(op: &'static str, tokens: &Tensor, mask: &Tensor) -> Result<()> {
    if tokens.dim() != 2 || mask.size() != tokens.size() {
        return Err(Error::ShapeMismatch {
            op,
            key: "attention_mask (and tokens, which must be [B, T] and share its shape)".into(),
            expected: tokens.size(),
            actual: mask.size(),
        });
    }
    Ok(())
}

/// Scores from a forward's logits (and a value head's per-position output, when there is one).
pub(crate) fn scores_from_logits(
    logits: &Tensor,
    head_values: Option<&Tensor>,
    tokens: &Tensor,
    attention_mask: &Tensor,
    request: ScoreRequest,
) -> Result<TokenScores> {
    let log_probs = token_log_probs(logits, tokens, Some(attention_mask))?;
    let entropy = if request.entropy {
        Some(token_entropy(logits, Some(attention_mask))?.f_to_kind(log_probs.kind())?)
    } else {
        None
    };
    let values = match head_values {
        Some(v) if request.values => Some(align_values_to_tokens(v)?),
        _ => None,
    };
    Ok(TokenScores {
        log_probs,
        values,
        entropy,
    })
}

/// A model's scores (no values: a bare model has no value head): what every model file's
/// `ScoreTokens` impl runs.
pub(crate) fn score_model(
    model: &dyn CausalLm,
    tokens: &Tensor,
    attention_mask: &Tensor,
    request: ScoreRequest,
) -> Result<TokenScores> {
    check_inputs("CausalLm::score_tokens", tokens, attention_mask)?;
    let input = LmInput::new(tokens).with_attention_mask(attention_mask);
    let out = model.forward_with(&input, None, TRUNK_ONLY)?;
    scores_from_hidden(
        model,
        &out.last_hidden,
        None,
        tokens,
        attention_mask,
        request,
    )
}

/// A forward without the LM head (the scorers run it on the positions they need).
pub(crate) const TRUNK_ONLY: ForwardOptions = ForwardOptions {
    logits: false,
    capture_block_input: None,
};

impl ScoreTokens for dyn CausalLm + '_ {
    fn score_tokens(&self, t: &Tensor, m: &Tensor, r: ScoreRequest) -> Result<TokenScores> {
        score_model(self, t, m, r)
    }

    fn generating_model(&self) -> Option<&dyn CausalLm> {
        Some(self)
    }
}

impl ScoreTokens for CausalLmWithValueHead {
    /// One trunk pass. The value head runs only when values are asked for.
    fn score_tokens(&self, t: &Tensor, m: &Tensor, r: ScoreRequest) -> Result<TokenScores> {
        if !r.values {
            return score_model(self.model(), t, m, r);
        }
        check_inputs("CausalLmWithValueHead::score_tokens", t, m)?;
        let model = self.model();
        let out = model.forward_with(&LmInput::new(t).with_attention_mask(m), None, TRUNK_ONLY)?;
        let values = self.values_from_hidden(&out.last_hidden)?;
        scores_from_hidden(model, &out.last_hidden, Some(&values), t, m, r)
    }

    fn generating_model(&self) -> Option<&dyn CausalLm> {
        Some(self.model())
    }
}

impl ScoreTokens for CausalLmWithHydraValueHead {
    /// The *policy*'s scores; the reference's are [`HydraReference`]'s.
    fn score_tokens(&self, t: &Tensor, m: &Tensor, r: ScoreRequest) -> Result<TokenScores> {
        self.policy().score_tokens(t, m, r)
    }

    fn generating_model(&self) -> Option<&dyn CausalLm> {
        Some(self.policy().model())
    }
}

impl<S: ScoreTokens + ?Sized> ScoreTokens for &S {
    fn score_tokens(&self, t: &Tensor, m: &Tensor, r: ScoreRequest) -> Result<TokenScores> {
        (**self).score_tokens(t, m, r)
    }

    fn generating_model(&self) -> Option<&dyn CausalLm> {
        (**self).generating_model()
    }
}

impl<S: ScoreTokens + ?Sized> ScoreTokens for Box<S> {
    fn score_tokens(&self, t: &Tensor, m: &Tensor, r: ScoreRequest) -> Result<TokenScores> {
        (**self).score_tokens(t, m, r)
    }

    fn generating_model(&self) -> Option<&dyn CausalLm> {
        (**self).generating_model()
    }
}

impl<S: ScoreTokens + ?Sized> ScoreTokens for Rc<S> {
    fn score_tokens(&self, t: &Tensor, m: &Tensor, r: ScoreRequest) -> Result<TokenScores> {
        (**self).score_tokens(t, m, r)
    }

    fn generating_model(&self) -> Option<&dyn CausalLm> {
        (**self).generating_model()
    }
}

impl<S: ScoreTokens + ?Sized> ScoreTokens for Arc<S> {
    fn score_tokens(&self, t: &Tensor, m: &Tensor, r: ScoreRequest) -> Result<TokenScores> {
        (**self).score_tokens(t, m, r)
    }

    fn generating_model(&self) -> Option<&dyn CausalLm> {
        (**self).generating_model()
    }
}

/// Locks `m` for one call; a poisoned lock (a thread panicked while holding it) is an error.
pub(crate) fn with_locked<M: ?Sized, R>(
    op: &'static str,
    m: &Mutex<M>,
    f: impl FnOnce(&M) -> Result<R>,
) -> Result<R> {
    let guard = m.lock().map_err(|_| {
        Error::invalid(
            op,
            "the model's mutex is poisoned (a thread panicked while holding it)",
        )
    })?;
    f(&guard)
}

/// A model shared with a transform: each call locks it for the forward only. (No
/// `generating_model`: the lock cannot outlive the call; generate through the trainer's own
/// handle.)
impl<S: ScoreTokens + ?Sized> ScoreTokens for Arc<Mutex<S>> {
    fn score_tokens(&self, t: &Tensor, m: &Tensor, r: ScoreRequest) -> Result<TokenScores> {
        with_locked("Arc<Mutex<_>>::score_tokens", self, |s| {
            s.score_tokens(t, m, r)
        })
    }
}

/// The frozen reference of a [`CausalLmWithHydraValueHead`] as a scorer: its reference logits
/// ([`CausalLmWithHydraValueHead::forward_hydra`]: the shared trunk up to the branch, then the
/// frozen branch) turned into token log-probs (no values). `H` is how the hydra model is held:
/// a borrow `&CausalLmWithHydraValueHead` or a shared `Arc<Mutex<_>>` (for a transform).
/// Nothing is copied.
///
/// Within a rollout a hydra policy computes the reference log-probs in the same trunk pass as
/// its own (its [`TensorDictModule`](crate::modules::TensorDictModule) output writes them);
/// `envs::llm::RetrieveLogProb::precomputed` reads those instead of running this view.
#[derive(Debug, Clone)]
pub struct HydraReference<H> {
    hydra: H,
}

impl<H> HydraReference<H> {
    /// The reference of the hydra model held by `hydra`.
    pub fn new(hydra: H) -> Self {
        HydraReference { hydra }
    }

    /// The handle it was built from.
    pub fn hydra(&self) -> &H {
        &self.hydra
    }
}

fn hydra_ref_scores(
    hydra: &CausalLmWithHydraValueHead,
    tokens: &Tensor,
    attention_mask: &Tensor,
    request: ScoreRequest,
) -> Result<TokenScores> {
    check_inputs("HydraReference::score_tokens", tokens, attention_mask)?;
    // a reference is never differentiated
    let _guard = tch::no_grad_guard();
    let logits = hydra.forward_hydra(&LmInput::new(tokens).with_attention_mask(attention_mask))?;
    scores_from_logits(&logits, None, tokens, attention_mask, request)
}

impl HydraReference<&CausalLmWithHydraValueHead> {
    /// The reference's token log-probs (as [`ScoreTokens::token_log_probs`]) and the frozen
    /// trunk's output they were computed from
    /// ([`CausalLmWithHydraValueHead::forward_reference`]; `None` without a branch
    /// reference), so that the policy's forward on the same rows can start there.
    ///
    /// # Errors
    /// As [`ScoreTokens::token_log_probs`].
    pub fn log_probs_and_trunk(
        &self,
        tokens: &Tensor,
        attention_mask: &Tensor,
    ) -> Result<(Tensor, Option<Tensor>)> {
        check_inputs("HydraReference::score_tokens", tokens, attention_mask)?;
        let _guard = tch::no_grad_guard();
        let input = LmInput::new(tokens).with_attention_mask(attention_mask);
        let out = self.hydra.forward_reference(&input)?;
        let scores = scores_from_logits(
            &out.ref_logits,
            None,
            tokens,
            attention_mask,
            ScoreRequest::log_probs(),
        )?;
        Ok((scores.log_probs, out.trunk))
    }
}

impl ScoreTokens for HydraReference<&CausalLmWithHydraValueHead> {
    fn score_tokens(&self, t: &Tensor, m: &Tensor, r: ScoreRequest) -> Result<TokenScores> {
        hydra_ref_scores(self.hydra, t, m, r)
    }
}

impl ScoreTokens for HydraReference<Arc<Mutex<CausalLmWithHydraValueHead>>> {
    fn score_tokens(&self, t: &Tensor, m: &Tensor, r: ScoreRequest) -> Result<TokenScores> {
        with_locked("HydraReference::score_tokens", &self.hydra, |h| {
            hydra_ref_scores(h, t, m, r)
        })
    }
}

/// A closure `(tokens, attention_mask) -> (log_probs, values)` as a scorer (no entropy, no
/// model to generate with); `values` may be `None` for a policy without values (DPO).
///
/// ```
/// use tch::{Kind, Tensor};
/// use torchrl::modules::llm::{ScoreFn, ScoreTokens};
/// let f = ScoreFn(|tokens: &Tensor, _mask: &Tensor| {
///     let z = tokens.zeros_like().to_kind(Kind::Float);
///     Ok((z.shallow_clone(), Some(z)))
/// });
/// let tokens = Tensor::from_slice(&[1i64, 2]).view([1, 2]);
/// let (lp, v) = f.log_probs_and_values(&tokens, &tokens.ones_like())?;
/// assert_eq!((lp.size(), v.size()), (vec![1, 2], vec![1, 2]));
/// assert!(f.generating_model().is_none());
/// # Ok::<(), torchrl::Error>(())
/// ```
pub struct ScoreFn<F>(pub F);

impl<F> fmt::Debug for ScoreFn<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ScoreFn(..)")
    }
}

impl<F> ScoreTokens for ScoreFn<F>
where
    F: Fn(&Tensor, &Tensor) -> Result<(Tensor, Option<Tensor>)>,
{
    fn score_tokens(&self, t: &Tensor, m: &Tensor, r: ScoreRequest) -> Result<TokenScores> {
        let (log_probs, values) = (self.0)(t, m)?;
        Ok(TokenScores {
            log_probs,
            values: if r.values { values } else { None },
            entropy: None,
        })
    }
}

// ------------------------------------------------------------------ token maths

/// Per-token log-probs aligned with `tokens` `[B, T]` from `logits` `[B, T, V]`, float32: 0 at
/// `t = 0` and, with a `mask`, wherever the token or the one before it is padding (the first
/// real token of a left-padded row has nothing real to be predicted from).
///
/// ```
/// use tch::{Kind, Tensor};
/// use torchrl::modules::llm::token_log_probs;
/// // uniform logits over 4 tokens: every log-prob is ln(1/4), except the first position
/// let logits = Tensor::zeros([1, 3, 4], (Kind::Float, tch::Device::Cpu));
/// let tokens = Tensor::from_slice(&[0i64, 1, 2]).view([1, 3]);
/// let lp = Vec::<f32>::try_from(token_log_probs(&logits, &tokens, None)?.view([-1]))?;
/// assert_eq!(lp[0], 0.0);
/// assert!((lp[1] - 0.25f32.ln()).abs() < 1e-6 && (lp[2] - 0.25f32.ln()).abs() < 1e-6);
/// # Ok::<(), torchrl::Error>(())
/// ```
pub fn token_log_probs(logits: &Tensor, tokens: &Tensor, mask: Option<&Tensor>) -> Result<Tensor> {
    let (b, t, _) = logits.size3()?;
    if tokens.size() != [b, t] {
        return Err(Error::ShapeMismatch {
            op: "token_log_probs",
            key: "tokens".into(),
            expected: vec![b, t],
            actual: tokens.size(),
        });
    }
    if t == 0 {
        return Ok(Tensor::f_zeros([b, 0], (Kind::Float, logits.device()))?);
    }
    let lp = logits
        .f_narrow(1, 0, t - 1)?
        .f_log_softmax(-1, Kind::Float)?
        .f_gather(-1, &tokens.f_narrow(1, 1, t - 1)?.f_unsqueeze(-1)?, false)?
        .f_squeeze_dim(-1)?;
    let first = Tensor::f_zeros([b, 1], (Kind::Float, logits.device()))?;
    let lp = Tensor::f_cat(&[&first, &lp], 1)?;
    match mask {
        Some(m) => {
            // a token counts when it and the token before it are real
            let m = m.f_to_kind(Kind::Float)?;
            let prev = Tensor::f_cat(&[&first, &m.f_narrow(1, 0, t - 1)?], 1)?;
            Ok(lp.f_mul(&m)?.f_mul(&prev)?)
        }
        None => Ok(lp),
    }
}

/// The per-token entropy of a causal LM's next-token distribution, aligned with the tokens as
/// [`token_log_probs`] is: `H[t] = −Σ_v p_v·log p_v`
/// of `softmax(logits[t − 1])`, the distribution `token[t]` is drawn from; 0 at `t = 0` and,
/// with a `mask`, wherever the token or the one before it is padding. Differentiable in the
/// logits; float64 logits give float64, other floating kinds float32 (as `token_log_probs`).
///
/// This is what [`GrpoConfig::entropy_coeff`]'s bonus uses when the policy gives it
/// ([`ScoreRequest::entropy`]); TorchRL's `LLMMaskedCategorical.entropy` and TRL's fused LM
/// head compute the same quantity.
///
/// [`GrpoConfig::entropy_coeff`]: crate::objectives::llm::GrpoConfig::entropy_coeff
///
/// # Shapes
/// `logits` `[B, T, V]`, `mask` `[B, T]`; the output `[B, T]`.
///
/// # Errors
/// When `logits` is not a floating-point `[B, T, V]` tensor or `mask` is not `[B, T]`.
///
/// ```
/// use tch::{Kind, Tensor};
/// use torchrl::objectives::llm::token_entropy;
/// # fn main() -> torchrl::Result<()> {
/// // uniform logits over 4 tokens: log 4 everywhere but at t = 0; a one-hot row: 0
/// let logits = Tensor::zeros([1, 3, 4], (Kind::Double, tch::Device::Cpu));
/// let _ = logits.get(0).get(1).get(2).fill_(1e4);
/// let h = Vec::<f64>::try_from(token_entropy(&logits, None)?.view([-1]))?;
/// assert_eq!(h[0], 0.0);
/// assert!((h[1] - 4f64.ln()).abs() < 1e-12 && h[2].abs() < 1e-12);
/// # Ok(()) }
/// ```
pub fn token_entropy(logits: &Tensor, mask: Option<&Tensor>) -> Result<Tensor> {
    const OP: &str = "token_entropy";
    let size = logits.size();
    let (b, t) = match size.as_slice() {
        [b, t, _] if logits.is_floating_point() => (*b, *t),
        _ => {
            return Err(Error::value(
                OP,
                "logits",
                "a floating-point [B, T, V] tensor",
                format!("{:?} of shape {}", logits.kind(), ShapeFmt(&size)),
            ))
        }
    };
    if let Some(m) = mask {
        if m.size() != [b, t] {
            return Err(Error::ShapeMismatch {
                op: OP,
                key: "mask".into(),
                expected: vec![b, t],
                actual: m.size(),
            });
        }
    }
    let kind = if logits.kind() == Kind::Double {
        Kind::Double
    } else {
        Kind::Float
    };
    let first = Tensor::f_zeros([b, 1], (kind, logits.device()))?;
    if t == 0 {
        return Ok(Tensor::f_zeros([b, 0], (kind, logits.device()))?);
    }
    let floor = if kind == Kind::Double {
        f64::MIN
    } else {
        f64::from(f32::MIN)
    };
    // p·log p with log p floored, so a zero probability adds 0 rather than 0·(−∞)
    let logp = logits
        .f_narrow(1, 0, t - 1)?
        .f_log_softmax(-1, kind)?
        .f_clamp_min(floor)?;
    let h = logp
        .f_exp()?
        .f_mul(&logp)?
        .f_sum_dim_intlist(-1, false, None::<Kind>)?
        .f_neg()?;
    let h = Tensor::f_cat(&[&first, &h], 1)?;
    match mask {
        Some(m) => {
            let m = m.f_ne(0)?.f_to_kind(kind)?;
            let prev = Tensor::f_cat(&[&first, &m.f_narrow(1, 0, t - 1)?], 1)?;
            Ok(h.f_mul(&m)?.f_mul(&prev)?)
        }
        None => Ok(h),
    }
}

/// `values[:, t] = head[:, t − 1]`, `values[:, 0] = 0`: the value head's per-position output
/// (the value of the state after reading token `t − 1`) moved onto the token it acts for,
/// `V(state before token t)`. Use it on the rollout side and the learner side alike (see
/// [`crate::objectives::llm`]). Shifting both sides alike is what avoids b623d1b's rollout/learner
/// off-by-one (the module docs' "Reference bug").
///
/// # Shapes
/// `[B, T]` → `[B, T]`.
///
/// # Errors
/// When `head_values` is not 2-D.
///
/// ```
/// use tch::Tensor;
/// use torchrl::objectives::llm::align_values_to_tokens;
/// let head = Tensor::from_slice(&[1.0f32, 2.0, 3.0]).view([1, 3]);
/// let v = Vec::<f32>::try_from(align_values_to_tokens(&head)?.view([-1]))?;
/// assert_eq!(v, [0.0, 1.0, 2.0]);
/// # Ok::<(), torchrl::Error>(())
/// ```
pub fn align_values_to_tokens(head_values: &Tensor) -> Result<Tensor> {
    let size = head_values.size();
    let [b, t] = size.as_slice() else {
        return Err(Error::value(
            "align_values_to_tokens",
            "values",
            "a [B, T] tensor",
            ShapeFmt(&size).to_string(),
        ));
    };
    if *t == 0 {
        return Ok(head_values.shallow_clone());
    }
    let first = Tensor::f_zeros([*b, 1], (head_values.kind(), head_values.device()))?;
    Ok(Tensor::f_cat(
        &[&first, &head_values.f_narrow(1, 0, t - 1)?],
        1,
    )?)
}
