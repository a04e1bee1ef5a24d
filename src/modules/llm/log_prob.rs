//! [`LogProbModel`]: a model that gives the per-token log-probs of given tokens, the one thing
//! the LLM KL transforms (`envs::llm::RetrieveLogProb`) need from a
//! reference (or generating) model.
//!
//! The log-probs are aligned with the tokens as [`token_log_probs`] aligns them:
//! `lp[t] = log p(token[t] | tokens < t)`, 0 at `t = 0` and where the token or the one before
//! it is padding. Every implementation here runs under `no_grad` (a reference is frozen; a
//! rollout's log-probs are data).
//!
//! Implemented for [`Gpt2Model`], [`CausalLmWithValueHead`] and [`CausalLmWithHydraValueHead`]
//! (the *policy*'s log-probs), and for [`HydraReference`], a view of a hydra model's frozen
//! reference (trlX's `forward_hydra`). Sharing without copying any parameters:
//!
//! - a borrow (`&M`, `HydraReference<&M>`) for direct calls;
//! - `Arc<Mutex<M>>` (and `HydraReference<Arc<Mutex<_>>>`) where the model must live in a
//!   transform, which must be `Send + 'static`: `tch::Tensor` is `Send` but not `Sync`, so a
//!   model cannot sit behind a plain `Arc` across threads; a `Mutex` makes the handle `Send`
//!   (and `Sync`), and each call locks it for the forward only. The trainer keeps a clone of
//!   the `Arc` and locks it to train the policy between rollouts.
//!
//! ```
//! use std::sync::{Arc, Mutex};
//! use tch::{nn::VarStore, Device, Tensor};
//! use torchrl::modules::llm::{
//!     CausalLmWithHydraValueHead, Gpt2Config, HydraReference, LogProbModel,
//! };
//! # fn main() -> torchrl::Result<()> {
//! let vs = VarStore::new(Device::Cpu);
//! let cfg = Gpt2Config::new(20).with_n_layer(2).with_n_embd(8).with_n_head(2).with_n_positions(8);
//! let hydra = Arc::new(Mutex::new(CausalLmWithHydraValueHead::new(&vs.root(), &cfg, 1)?));
//! let reference = HydraReference::new(Arc::clone(&hydra)); // no parameter is copied
//! let ids = Tensor::from_slice(&[1i64, 2, 3, 4]).view([1, 4]);
//! let mask = Tensor::ones([1, 4], (tch::Kind::Int64, Device::Cpu));
//! let ref_lp = reference.token_log_probs(&ids, &mask)?;
//! let policy_lp = hydra.token_log_probs(&ids, &mask)?;
//! assert_eq!(ref_lp.size(), vec![1, 4]);
//! assert!(ref_lp.equal(&policy_lp)); // at construction the reference is the policy
//! # Ok(()) }
//! ```

use std::sync::{Arc, Mutex};

use tch::Tensor;

use super::gpt2::{Gpt2Input, Gpt2Model};
use super::heads::{token_log_probs, CausalLmWithHydraValueHead, CausalLmWithValueHead};
use crate::error::{Error, Result};

/// A model that scores given tokens: per-token log-probs `[B, T]` (float32) of `tokens`
/// `[B, T]` (int64) under `attention_mask` `[B, T]` (1 = real token), aligned as
/// [`token_log_probs`] aligns them. See the [module docs](self).
pub trait LogProbModel {
    /// The log-probs of `tokens`, computed under `no_grad`.
    fn token_log_probs(&self, tokens: &Tensor, attention_mask: &Tensor) -> Result<Tensor>;
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

impl LogProbModel for Gpt2Model {
    fn token_log_probs(&self, tokens: &Tensor, attention_mask: &Tensor) -> Result<Tensor> {
        check_inputs("Gpt2Model::token_log_probs", tokens, attention_mask)?;
        let _guard = tch::no_grad_guard();
        let logits = self
            .forward(
                &Gpt2Input::new(tokens).with_attention_mask(attention_mask),
                None,
            )?
            .logits()?;
        token_log_probs(&logits, tokens, Some(attention_mask))
    }
}

impl LogProbModel for CausalLmWithValueHead {
    /// The policy's log-probs (the trunk's; the value head is not run).
    fn token_log_probs(&self, tokens: &Tensor, attention_mask: &Tensor) -> Result<Tensor> {
        self.model().token_log_probs(tokens, attention_mask)
    }
}

impl LogProbModel for CausalLmWithHydraValueHead {
    /// The *policy*'s log-probs; the reference's are [`HydraReference`]'s.
    fn token_log_probs(&self, tokens: &Tensor, attention_mask: &Tensor) -> Result<Tensor> {
        self.policy().token_log_probs(tokens, attention_mask)
    }
}

impl<M: LogProbModel + ?Sized> LogProbModel for &M {
    fn token_log_probs(&self, tokens: &Tensor, attention_mask: &Tensor) -> Result<Tensor> {
        (**self).token_log_probs(tokens, attention_mask)
    }
}

impl<M: LogProbModel + ?Sized> LogProbModel for Box<M> {
    fn token_log_probs(&self, tokens: &Tensor, attention_mask: &Tensor) -> Result<Tensor> {
        (**self).token_log_probs(tokens, attention_mask)
    }
}

/// Locks `m` for one call; a poisoned lock (a thread panicked while holding it) is an error.
fn with_locked<M: ?Sized, R>(
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

impl<M: LogProbModel + ?Sized> LogProbModel for Arc<Mutex<M>> {
    fn token_log_probs(&self, tokens: &Tensor, attention_mask: &Tensor) -> Result<Tensor> {
        with_locked("Arc<Mutex<_>>::token_log_probs", self, |m| {
            m.token_log_probs(tokens, attention_mask)
        })
    }
}

/// The frozen reference of a [`CausalLmWithHydraValueHead`] as a [`LogProbModel`]: its
/// reference logits ([`CausalLmWithHydraValueHead::forward_hydra`]: the shared trunk up to the
/// branch, then the frozen branch) turned into token log-probs. `H` is how the hydra model is
/// held: a borrow `&CausalLmWithHydraValueHead` or a shared `Arc<Mutex<_>>` (for a
/// transform). Nothing is copied.
///
/// Within a rollout a hydra policy computes the reference log-probs in the same trunk pass as
/// its own (its [`TensorDictModule`](crate::modules::TensorDictModule) output writes them);
/// `envs::llm::RetrieveLogProb::precomputed` reads
/// those instead of running this view.
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

fn hydra_ref_log_probs(
    hydra: &CausalLmWithHydraValueHead,
    tokens: &Tensor,
    attention_mask: &Tensor,
) -> Result<Tensor> {
    check_inputs("HydraReference::token_log_probs", tokens, attention_mask)?;
    let _guard = tch::no_grad_guard();
    let logits =
        hydra.forward_hydra(&Gpt2Input::new(tokens).with_attention_mask(attention_mask))?;
    token_log_probs(&logits, tokens, Some(attention_mask))
}

impl LogProbModel for HydraReference<&CausalLmWithHydraValueHead> {
    fn token_log_probs(&self, tokens: &Tensor, attention_mask: &Tensor) -> Result<Tensor> {
        hydra_ref_log_probs(self.hydra, tokens, attention_mask)
    }
}

impl LogProbModel for HydraReference<Arc<Mutex<CausalLmWithHydraValueHead>>> {
    fn token_log_probs(&self, tokens: &Tensor, attention_mask: &Tensor) -> Result<Tensor> {
        with_locked("HydraReference::token_log_probs", &self.hydra, |h| {
            hydra_ref_log_probs(h, tokens, attention_mask)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send<T: Send + 'static>() {}

    #[test]
    fn shared_handles_are_send() {
        assert_send::<Arc<Mutex<Gpt2Model>>>();
        assert_send::<HydraReference<Arc<Mutex<CausalLmWithHydraValueHead>>>>();
    }
}
