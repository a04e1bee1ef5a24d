//! [`CachedTrunk`]: a hydra policy continued from its frozen trunk's cached output.

use tch::Tensor;

use super::value::CausalLmWithValueHead;
use crate::error::{Error, Result, ShapeFmt};
use crate::modules::llm::causal_lm::{run_from_block, CausalLm};
use crate::modules::llm::scoring::{scores_from_hidden, ScoreRequest, ScoreTokens, TokenScores};

/// A hydra policy whose frozen trunk was already run: the trunk's output `hidden`
/// `[B, T, n_embd]` for exactly the rows being scored (what [`HydraOutput::trunk`] gave at the
/// rollout, kept under [`CachedTrunk::KEY`] in the trainers' stores), and the block it
/// enters. The trunk is frozen, so its output is the same at every update of the rollout;
/// starting the forward there skips the frozen blocks (for GPT-2 small with 2 unfrozen
/// blocks, 10 of 12 in every update forward) and gives the same log-probs and values up to
/// rounding. The update's gradient never reached the frozen blocks anyway.
///
/// [`HydraOutput::trunk`]: super::HydraOutput::trunk
///
/// ```
/// use tch::nn::VarStore;
/// use tch::Tensor;
/// use torchrl::modules::llm::{CachedTrunk, CausalLmWithHydraValueHead, Gpt2Config, LmInput, ScoreTokens};
/// # fn main() -> torchrl::Result<()> {
/// let cfg = Gpt2Config::new(20).with_n_layer(3).with_n_embd(8).with_n_head(2).with_n_positions(8);
/// let vs = VarStore::new(tch::Device::Cpu);
/// let model = CausalLmWithHydraValueHead::new(&vs.root(), &cfg, 1)?;
/// let ids = Tensor::from_slice(&[3i64, 4, 5, 6]).view([2, 2]);
/// let mask = ids.ones_like();
/// let out = model.forward(&LmInput::new(&ids).with_attention_mask(&mask))?;
/// let cached = CachedTrunk::new(model.policy(), out.trunk.unwrap(), model.frozen_trunk_end().unwrap());
/// let (lp, v) = cached.log_probs_and_values(&ids, &mask)?;
/// let (lp_full, v_full) = model.log_probs_and_values(&ids, &mask)?;
/// assert!((lp - lp_full).abs().max().double_value(&[]) < 1e-6);
/// assert!((v - v_full).abs().max().double_value(&[]) < 1e-6);
/// assert!(cached.log_probs_and_values(&ids.narrow(0, 0, 1), &mask.narrow(0, 0, 1)).is_err());
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct CachedTrunk<'a> {
    policy: &'a CausalLmWithValueHead,
    hidden: Tensor,
    start: usize,
}

impl<'a> CachedTrunk<'a> {
    /// Where the trainers keep the rollout's trunk output: `("hydra", "trunk")`.
    pub const KEY: (&'static str, &'static str) = ("hydra", "trunk");

    /// `policy` continued from `hidden`, the output of its frozen blocks `0..start`.
    pub fn new(policy: &'a CausalLmWithValueHead, hidden: Tensor, start: usize) -> Self {
        CachedTrunk {
            policy,
            hidden,
            start,
        }
    }

    /// The policy's final hidden state from the cached trunk output.
    fn last_hidden(&self, tokens: &Tensor, attention_mask: &Tensor) -> Result<Tensor> {
        let size = tokens.size();
        if self.hidden.size().get(..2) != Some(size.as_slice()) {
            return Err(Error::value(
                "CachedTrunk",
                "tokens",
                format!(
                    "the rows of the cached trunk output, [B, T] of {}",
                    ShapeFmt(&self.hidden.size())
                ),
                ShapeFmt(&size).to_string(),
            ));
        }
        let model = self.policy.model();
        run_from_block(
            model.facts().hidden_size,
            model.decoder(),
            &self.hidden,
            self.start,
            Some(attention_mask),
        )
    }
}

impl ScoreTokens for CachedTrunk<'_> {
    /// The policy's scores from the cached trunk; the LM head runs from
    /// [`ScoreRequest::scored_from`] on, the value head only when values are asked for.
    fn score_tokens(&self, t: &Tensor, m: &Tensor, r: ScoreRequest) -> Result<TokenScores> {
        let last_hidden = self.last_hidden(t, m)?;
        let values = if r.values {
            Some(self.policy.values_from_hidden(&last_hidden)?)
        } else {
            None
        };
        scores_from_hidden(self.policy.model(), &last_hidden, values.as_ref(), t, m, r)
    }

    fn generating_model(&self) -> Option<&dyn CausalLm> {
        Some(self.policy.model())
    }
}
