//! Scorers: what [`TokenEnv`](super::env::TokenEnv) calls to turn a batch of (prompt,
//! response) pairs into one score per sample (trlX's `reward_fn`, TorchRL's reward
//! transforms).
//!
//! A [`Scorer`] receives a [`ScoreInput`]: the unpadded prompt and response token lists (the
//! response **without** its EOS and without padding), whether each response ended with EOS,
//! the padded full tokens `[B, P + R]` with their attention mask, and the batch size. It
//! returns a float tensor of shape `[B]` (cast to float32 by the env). Four implementations:
//!
//! - [`TokenScorer`]: a per-sample closure over token ids, `FnMut(&[i64], &[i64]) -> f64`;
//! - [`TextScorer`]: a per-sample closure over the decoded prompt and response text, holding a
//!   [`TextTokenizer`] (special tokens skipped by default, as trlX's
//!   `batch_decode(skip_special_tokens=True)`);
//! - [`BatchScorer`]: a closure over the whole [`ScoreInput`];
//! - [`RewardModelScorer`]: a [`CausalLmWithScoreHead`] run under `no_grad` on the full tokens and
//!   mask (its score is read at each row's last real token), with optional clipping to
//!   `[-c, c]` (trlX's `cliprange_reward`).
//!
//! ```
//! use tch::{Device, Kind, Tensor};
//! use torchrl::envs::llm::scorer::{ScoreInput, Scorer, TokenScorer};
//! # fn main() -> torchrl::Result<()> {
//! // score = the response length
//! let mut scorer = TokenScorer::new(|_prompt: &[i64], response: &[i64]| response.len() as f64);
//! let tokens = Tensor::zeros([2, 4], (Kind::Int64, Device::Cpu));
//! let mask = Tensor::ones([2, 4], (Kind::Int64, Device::Cpu));
//! let input = ScoreInput {
//!     prompts: &[vec![1, 2], vec![3, 4]],
//!     responses: &[vec![5], vec![]],
//!     ended_with_eos: &[true, false],
//!     tokens: &tokens,
//!     attention_mask: &mask,
//!     batch_size: 2,
//! };
//! let score = scorer.score(&input)?;
//! assert_eq!(Vec::<f32>::try_from(&score)?, vec![1.0, 0.0]);
//! # Ok(()) }
//! ```

use std::fmt;

use tch::{Kind, Tensor};

use crate::error::{Error, Result};
use crate::modules::llm::{CausalLmWithScoreHead, LmInput, SpecialTokens, TextTokenizer};

/// What a [`Scorer`] sees of one batch.
///
/// # Shapes
/// `prompts`, `responses`, `ended_with_eos`: `B` entries; `tokens`, `attention_mask`:
/// `[B, P + R]` int64 (the left-padded prompt followed by the right-padded response; the mask
/// is 1 on real tokens, the response's EOS included).
#[derive(Debug)]
pub struct ScoreInput<'a> {
    /// Each prompt's real tokens (left padding removed).
    pub prompts: &'a [Vec<i64>],
    /// Each response's real tokens, **without** the EOS that ended it and without padding.
    pub responses: &'a [Vec<i64>],
    /// Whether each response ended with EOS (`false`: it hit the length limit).
    pub ended_with_eos: &'a [bool],
    /// The full padded tokens, `[B, P + R]`.
    pub tokens: &'a Tensor,
    /// The full attention mask, `[B, P + R]` (1 = real token, EOS included).
    pub attention_mask: &'a Tensor,
    /// The batch size `B`.
    pub batch_size: i64,
}

/// Scores a batch of (prompt, response) pairs: one float per sample, shape `[B]`.
pub trait Scorer: Send {
    /// The scores of `input`, a float tensor of shape `[B]` (any device; the env moves it).
    fn score(&mut self, input: &ScoreInput<'_>) -> Result<Tensor>;
}

/// Scores from one `f64` per sample, on the device of `input.tokens`.
pub(crate) fn from_values(values: &[f64], input: &ScoreInput<'_>) -> Result<Tensor> {
    Ok(Tensor::from_slice(values)
        .f_to_kind(Kind::Float)?
        .f_to_device(input.tokens.device())?)
}

/// Checks that the lists of `input` have `batch_size` entries.
pub(crate) fn check_lists(op: &'static str, input: &ScoreInput<'_>) -> Result<()> {
    let b = input.batch_size;
    for (name, n) in [
        ("prompts", input.prompts.len()),
        ("responses", input.responses.len()),
        ("ended_with_eos", input.ended_with_eos.len()),
    ] {
        if i64::try_from(n).ok() != Some(b) {
            return Err(Error::argument(
                op,
                name,
                format!("{b} entries (the batch size)"),
                format!("{n} entries"),
            ));
        }
    }
    Ok(())
}

// ------------------------------------------------------------------ token closure

/// A per-sample closure over the prompt's and the response's token ids (response without EOS).
pub struct TokenScorer<F> {
    f: F,
}

impl<F> fmt::Debug for TokenScorer<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TokenScorer")
    }
}

impl<F: FnMut(&[i64], &[i64]) -> f64 + Send> TokenScorer<F> {
    /// Wraps `f(prompt, response) -> score`.
    pub fn new(f: F) -> Self {
        TokenScorer { f }
    }
}

impl<F: FnMut(&[i64], &[i64]) -> f64 + Send> Scorer for TokenScorer<F> {
    fn score(&mut self, input: &ScoreInput<'_>) -> Result<Tensor> {
        check_lists("TokenScorer::score", input)?;
        let values: Vec<f64> = input
            .prompts
            .iter()
            .zip(input.responses)
            .map(|(p, r)| (self.f)(p, r))
            .collect();
        from_values(&values, input)
    }
}

// ------------------------------------------------------------------ text closure

/// A per-sample closure over the decoded prompt and response text (trlX's `reward_fn` on
/// `samples`/`prompts`/`outputs`). Special tokens are skipped when decoding unless
/// [`TextScorer::with_special_tokens`] says otherwise; the response's EOS is never part of
/// its text.
pub struct TextScorer<T, F> {
    tokenizer: T,
    f: F,
    special: SpecialTokens,
}

impl<T, F> fmt::Debug for TextScorer<T, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TextScorer")
            .field("special", &self.special)
            .finish_non_exhaustive()
    }
}

impl<T: TextTokenizer, F: FnMut(&str, &str) -> f64 + Send> TextScorer<T, F> {
    /// Wraps `f(prompt_text, response_text) -> score`, decoding with `tokenizer`.
    pub fn new(tokenizer: T, f: F) -> Self {
        TextScorer {
            tokenizer,
            f,
            special: SpecialTokens::Skip,
        }
    }

    /// Keeps (or skips, the default) special tokens in the decoded text.
    pub fn with_special_tokens(mut self, special: SpecialTokens) -> Self {
        self.special = special;
        self
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &T {
        &self.tokenizer
    }
}

impl<T: TextTokenizer, F: FnMut(&str, &str) -> f64 + Send> Scorer for TextScorer<T, F> {
    fn score(&mut self, input: &ScoreInput<'_>) -> Result<Tensor> {
        check_lists("TextScorer::score", input)?;
        let mut values = Vec::with_capacity(input.prompts.len());
        for (p, r) in input.prompts.iter().zip(input.responses) {
            let prompt = self.tokenizer.decode(p, self.special)?;
            let response = self.tokenizer.decode(r, self.special)?;
            values.push((self.f)(&prompt, &response));
        }
        from_values(&values, input)
    }
}

// ------------------------------------------------------------------ batch closure

/// A closure over the whole batch, returning the `[B]` scores itself.
pub struct BatchScorer<F> {
    f: F,
}

impl<F> fmt::Debug for BatchScorer<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("BatchScorer")
    }
}

impl<F: FnMut(&ScoreInput<'_>) -> Result<Tensor> + Send> BatchScorer<F> {
    /// Wraps `f(input) -> [B] scores`.
    pub fn new(f: F) -> Self {
        BatchScorer { f }
    }
}

impl<F: FnMut(&ScoreInput<'_>) -> Result<Tensor> + Send> Scorer for BatchScorer<F> {
    fn score(&mut self, input: &ScoreInput<'_>) -> Result<Tensor> {
        (self.f)(input)
    }
}

// ------------------------------------------------------------------ reward model

/// A learned reward model: [`CausalLmWithScoreHead::forward`] under `no_grad` on the full tokens and
/// attention mask (moved to the model's device; the scores come back on the tokens' device),
/// optionally clipped to `[-clip, clip]`.
///
/// When the batch's prompts come in consecutive groups of one size `g > 1` (GRPO's
/// `num_generations` completions of each prompt, as the [`TokenEnv`](super::TokenEnv) serves
/// them), the shared prefix runs once per group
/// ([`CausalLmWithScoreHead::forward_grouped`]); the scores are the same up to rounding.
/// [`with_shared_prompts(false)`](Self::with_shared_prompts) always runs every row whole.
pub struct RewardModelScorer {
    model: CausalLmWithScoreHead,
    clip: Option<f64>,
    shared_prompts: bool,
}

impl fmt::Debug for RewardModelScorer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RewardModelScorer")
            .field("clip", &self.clip)
            .field("shared_prompts", &self.shared_prompts)
            .finish_non_exhaustive()
    }
}

impl RewardModelScorer {
    /// Scores with `model`, unclipped.
    pub fn new(model: CausalLmWithScoreHead) -> Self {
        RewardModelScorer {
            model,
            clip: None,
            shared_prompts: true,
        }
    }

    /// Whether a batch whose prompts come in consecutive groups of one size runs their shared
    /// prefix once per group (`true`, the default) or every row whole (`false`).
    pub fn with_shared_prompts(mut self, shared: bool) -> Self {
        self.shared_prompts = shared;
        self
    }

    /// Clips the scores to `[-clip, clip]` (trlX's `cliprange_reward`). Errors unless `clip`
    /// is finite and > 0.
    pub fn with_clip(mut self, clip: f64) -> Result<Self> {
        if !(clip.is_finite() && clip > 0.0) {
            return Err(Error::config(
                "RewardModelScorer::with_clip",
                "clip",
                "a finite number > 0",
                clip,
            ));
        }
        self.clip = Some(clip);
        Ok(self)
    }

    /// The reward model.
    pub fn model(&self) -> &CausalLmWithScoreHead {
        &self.model
    }
}

impl Scorer for RewardModelScorer {
    fn score(&mut self, input: &ScoreInput<'_>) -> Result<Tensor> {
        let _guard = tch::no_grad_guard();
        let device = self.model.model().device();
        let ids = input.tokens.f_to_device(device)?;
        let mask = input
            .attention_mask
            .f_to_kind(Kind::Int64)?
            .f_to_device(device)?;
        let g = if self.shared_prompts {
            prompt_group_size(input.prompts)
        } else {
            1
        };
        let lm_input = LmInput::new(&ids).with_attention_mask(&mask);
        let s = self
            .model
            .forward_grouped(&lm_input, g)?
            .f_to_kind(Kind::Float)?;
        let s = match self.clip {
            Some(c) => s.f_clamp(-c, c)?,
            None => s,
        };
        Ok(s.f_to_device(input.tokens.device())?)
    }
}

/// The size `g` of the consecutive groups of identical prompts, when every group has that one
/// size and `g > 1`; else 1.
fn prompt_group_size(prompts: &[Vec<i64>]) -> usize {
    let Some(first) = prompts.first() else {
        return 1;
    };
    let g = prompts.iter().skip(1).take_while(|p| *p == first).count() + 1;
    let whole = g > 1
        && prompts.len().is_multiple_of(g)
        && prompts
            .chunks(g)
            .all(|c| c.iter().all(|p| Some(p) == c.first()));
    if whole {
        g
    } else {
        1
    }
}

#[cfg(test)]
mod tests {
    use super::prompt_group_size;

    #[test]
    fn group_sizes_from_the_prompts() {
        let p = |v: &[i64]| v.to_vec();
        assert_eq!(prompt_group_size(&[p(&[1]), p(&[1]), p(&[2]), p(&[2])]), 2);
        assert_eq!(prompt_group_size(&[p(&[1]), p(&[1]), p(&[1])]), 3);
        // uneven groups, or no repeats: every row its own
        assert_eq!(prompt_group_size(&[p(&[1]), p(&[1]), p(&[2])]), 1);
        assert_eq!(prompt_group_size(&[p(&[1]), p(&[1]), p(&[2]), p(&[3])]), 1);
        assert_eq!(prompt_group_size(&[p(&[1]), p(&[2])]), 1);
        assert_eq!(prompt_group_size(&[]), 1);
    }
}
