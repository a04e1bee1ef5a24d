//! The state of a batched decode, shared by [`generate`](super::generate) and
//! [`ilql_generate`](super::ilql_generate): the KV-cached model state ([`DecodeState`], with
//! the prompt pass once per group of identical prompts), the EOS / pad bookkeeping of the rows
//! ([`Rows`]) and the stacked result ([`Finished`]). Which rows a step runs is
//! [`compaction`](super::compaction)'s.

use tch::{Device, Kind, Tensor};

use super::causal_lm::{CausalLm, ForwardOptions, LmInput, LmOutput};
use super::compaction::ActiveRows;
use super::nn::KvCache;
use crate::error::{Error, Result};

/// The row indices of `b` rows in consecutive groups of `g`: the first row of each group
/// (`0, g, 2g, …`, `[b / g]`) and each row's group (`0, …, 0, 1, …`, `[b]`: what repeats a
/// per-group tensor to every row). `b` must be a multiple of `g`.
pub(crate) fn group_rows(b: i64, g: i64, device: Device) -> Result<(Tensor, Tensor)> {
    let first_rows = Tensor::f_arange_start_step(0, b, g, (Kind::Int64, device))?;
    let expand =
        Tensor::f_arange(b / g, (Kind::Int64, device))?.f_repeat_interleave_self_int(g, 0, b)?;
    Ok((first_rows, expand))
}

/// The KV-cached state of a batched decode: the prompt (on the model's device), its mask, the
/// growing mask, the next position ids and each row's last token.
pub(crate) struct DecodeState<'m> {
    model: &'m dyn CausalLm,
    cache: KvCache,
    pub(crate) prompt: Tensor,
    pub(crate) prompt_mask: Tensor,
    mask: Tensor,
    positions: Tensor,
    last_token: Tensor,
    padded: bool,
    ones: Tensor,
}

impl<'m> DecodeState<'m> {
    /// Runs the prompt `[B, P]` (left-padded by `attention_mask`; `None`: no padding) through
    /// `model` into a fresh cache; returns the decoder and the last position's hidden state
    /// `[B, n_embd]` (`transformers`' `logits_to_keep=1`: the LM head is left to the caller)
    /// and, with `capture`, the prompt's input to that block `[B, P, n_embd]`.
    /// With `groups > 1` ([`GenerateOptions::prompt_groups`]) the rows come in consecutive
    /// groups of that many identical prompts (checked): the pass runs on the first row of
    /// each group, and the cache and hidden state are repeated to the group's rows.
    pub(crate) fn start(
        model: &'m dyn CausalLm,
        prompt: &Tensor,
        attention_mask: Option<&Tensor>,
        [b, p]: [i64; 2],
        groups: usize,
        capture: Option<usize>,
    ) -> Result<(Self, Tensor, Option<Tensor>)> {
        let device = model.device();
        let prompt = prompt.f_to_device(device)?;
        let mask = match attention_mask {
            Some(m) => m.f_to_kind(Kind::Int64)?.f_to_device(device)?,
            None => Tensor::f_ones([b, p], (Kind::Int64, device))?,
        };
        let mut cache = model.new_cache();
        let hidden_only = ForwardOptions {
            logits: false,
            capture_block_input: capture,
        };
        let (last_hidden, block_input) = match PromptGroups::check(&prompt, &mask, [b, p], groups)?
        {
            None => {
                let first = model.forward_with(
                    &LmInput::new(&prompt).with_attention_mask(&mask),
                    Some(&mut cache),
                    hidden_only,
                )?;
                (first.last_hidden.f_select(1, p - 1)?, first.block_input)
            }
            Some(groups) => {
                let ids = prompt.f_index_select(0, &groups.first_rows)?;
                let group_mask = mask.f_index_select(0, &groups.first_rows)?;
                let first = model.forward_with(
                    &LmInput::new(&ids).with_attention_mask(&group_mask),
                    Some(&mut cache),
                    hidden_only,
                )?;
                cache.index_select(&groups.expand)?;
                let block_input = match first.block_input {
                    Some(h) => Some(h.f_index_select(0, &groups.expand)?),
                    None => None,
                };
                let last = first
                    .last_hidden
                    .f_select(1, p - 1)?
                    .f_index_select(0, &groups.expand)?;
                (last, block_input)
            }
        };
        let positions = super::causal_lm::position_ids_from_mask(&mask)?.f_narrow(1, p - 1, 1)?;
        let last_token = prompt.f_select(1, p - 1)?;
        // Without padding in the prompt, a one-token step attends every cached key: no mask
        // is needed (one host read here saves the mask's ops on every step).
        let padded = attention_mask.is_some() && !bool::try_from(mask.f_all()?)?;
        let decoder = DecodeState {
            model,
            cache,
            prompt_mask: mask.shallow_clone(),
            prompt,
            mask,
            positions,
            last_token,
            padded,
            ones: Tensor::f_ones([b, 1], (Kind::Int64, device))?,
        };
        Ok((decoder, last_hidden, block_input))
    }

    /// The device of the model (and of every tensor here).
    pub(crate) fn device(&self) -> Device {
        self.model.device()
    }

    /// Each row's last token, `[B]`.
    pub(crate) fn last_token(&self) -> &Tensor {
        &self.last_token
    }

    /// Keeps the decoded rows at `keep` (int64 `[A']`, positions among the rows decoded now):
    /// the cache, the growing mask, the positions and the last tokens (see `compaction.rs`).
    /// The prompt and its mask stay whole.
    pub(crate) fn keep_rows(&mut self, keep: &Tensor) -> Result<()> {
        self.cache.index_select(keep)?;
        self.mask = self.mask.f_index_select(0, keep)?;
        self.positions = self.positions.f_index_select(0, keep)?;
        self.last_token = self.last_token.f_index_select(0, keep)?;
        self.ones = self.ones.f_narrow(0, 0, keep.size1()?)?;
        Ok(())
    }

    /// Feeds `next` `[A]` (one token per decoded row) at the next position; the output is over
    /// that one position.
    pub(crate) fn step(&mut self, next: Tensor, options: ForwardOptions) -> Result<LmOutput> {
        self.positions = self.positions.f_add_scalar(1)?;
        let ids = next.f_unsqueeze(1)?;
        let mut input = LmInput::new(&ids).with_position_ids(&self.positions);
        if self.padded {
            // transformers extends the mask with ones, finished rows included
            self.mask = Tensor::f_cat(&[&self.mask, &self.ones], 1)?;
            input = input.with_attention_mask(&self.mask);
        }
        let out = self
            .model
            .forward_unchecked(&input, Some(&mut self.cache), options)?;
        self.last_token = next;
        Ok(out)
    }
}

/// The row indices of [`GenerateOptions::prompt_groups`]: the first row of each group, and
/// each row's group (what repeats a per-group tensor to every row).
struct PromptGroups {
    /// `[B / g]`: `0, g, 2g, …`.
    first_rows: Tensor,
    /// `[B]`: `0, …, 0, 1, …, 1, …` (each group index `g` times).
    expand: Tensor,
}

impl PromptGroups {
    /// `None` when `groups ≤ 1`; else the indices, after checking that `B` is a multiple of
    /// `groups` and that the rows of each group have the same ids and mask (one comparison,
    /// one host read).
    fn check(
        prompt: &Tensor,
        mask: &Tensor,
        [b, p]: [i64; 2],
        groups: usize,
    ) -> Result<Option<Self>> {
        let op = "generate";
        if groups <= 1 {
            return Ok(None);
        }
        let g = i64::try_from(groups).unwrap_or(i64::MAX);
        if b % g != 0 {
            return Err(Error::config(
                op,
                "prompt_groups",
                format!("a divisor of the batch size {b} (whole groups of identical prompts)"),
                groups,
            ));
        }
        let n = b / g;
        // each row against the first row of its group, ids and mask at once
        let same = |t: &Tensor| -> Result<Tensor> {
            let t = t.f_reshape([n, g, p])?;
            Ok(t.f_eq_tensor(&t.f_narrow(1, 0, 1)?)?.f_all_dim(2, false)?)
        };
        let rows_same = same(prompt)?.f_logical_and(&same(mask)?)?;
        if !bool::try_from(rows_same.f_all()?)? {
            // the error path reads which row differs
            let differs = rows_same.f_reshape([b])?.f_logical_not()?;
            let first_bad = i64::try_from(differs.f_to_kind(Kind::Int64)?.f_argmax(0, false)?)?;
            let head = first_bad / g * g;
            return Err(Error::value(
                op,
                "prompt",
                format!(
                    "rows in consecutive groups of prompt_groups = {g} identical prompts \
                     (token ids and attention mask)"
                ),
                format!("row {first_bad} differs from row {head}, the first of its group"),
            ));
        }
        let (first_rows, expand) = group_rows(b, g, prompt.device())?;
        Ok(Some(PromptGroups { first_rows, expand }))
    }
}

/// The EOS / pad bookkeeping of a batched decode: which rows are still live, the tokens and
/// live masks of every step, and when to stop.
pub(crate) struct Rows {
    pad: Tensor,
    eos: Option<i64>,
    unfinished: Tensor,
    tokens: Vec<Tensor>,
    live: Vec<Tensor>,
    check_every: i64,
    /// The live-row count read by this step's [`done`](Rows::done) (`None`: none read).
    live_count: Option<i64>,
    b: i64,
    device: Device,
}

impl Rows {
    /// `b` live rows, room for `steps` steps; finished rows receive `pad_id`.
    pub(crate) fn new(
        b: i64,
        steps: i64,
        pad_id: i64,
        eos: Option<i64>,
        device: Device,
    ) -> Result<Self> {
        let capacity = usize::try_from(steps).unwrap_or(0);
        Ok(Rows {
            pad: Tensor::f_full([b], pad_id, (Kind::Int64, device))?,
            eos,
            unfinished: Tensor::f_ones([b], (Kind::Bool, device))?,
            tokens: Vec::with_capacity(capacity),
            live: Vec::with_capacity(capacity),
            // the all-finished check reads the device: every step on the CPU, every 8 elsewhere
            check_every: if device == Device::Cpu { 1 } else { 8 },
            live_count: None,
            b,
            device,
        })
    }

    /// The steps there is room for.
    pub(crate) fn capacity(&self) -> usize {
        self.tokens.capacity()
    }

    /// `[B]` bool: the rows that have not produced EOS yet (before this step's token).
    pub(crate) fn unfinished(&self) -> &Tensor {
        &self.unfinished
    }

    /// `[B]`: the pad id of every row.
    pub(crate) fn pad(&self) -> &Tensor {
        &self.pad
    }

    /// Records this step's `next` `[B]` (the pad id on finished rows), which it returns.
    pub(crate) fn push(&mut self, next: Tensor) -> Result<Tensor> {
        let next = next.f_where_self(&self.unfinished, &self.pad)?;
        self.live.push(self.unfinished.shallow_clone());
        self.tokens.push(next.shallow_clone());
        if let Some(eos) = self.eos {
            self.unfinished = self.unfinished.f_logical_and(&next.f_ne(eos)?)?;
        }
        self.live_count = None;
        Ok(next)
    }

    /// Whether generation stops after step `step` of `steps`. Without an EOS id no row
    /// finishes early, and nothing is read from the device.
    pub(crate) fn done(&mut self, step: i64, steps: i64) -> Result<bool> {
        if step + 1 == steps {
            return Ok(true);
        }
        if self.eos.is_none() || (step + 1) % self.check_every != 0 {
            return Ok(false);
        }
        let live = i64::try_from(self.unfinished.f_sum(Kind::Int64)?)?;
        self.live_count = Some(live);
        Ok(live == 0)
    }

    /// The number of unfinished rows, when this step's [`done`](Rows::done) read it.
    pub(crate) fn live(&self) -> Option<i64> {
        self.live_count
    }

    /// Stacks the steps and trims those after every row finished (from the lazy all-finished
    /// check on accelerators).
    pub(crate) fn finish(self, prompt: Tensor, prompt_mask: Tensor) -> Result<Finished> {
        let (response, response_mask, steps) = if self.tokens.is_empty() {
            (
                Tensor::f_zeros([self.b, 0], (Kind::Int64, self.device))?,
                Tensor::f_zeros([self.b, 0], (Kind::Bool, self.device))?,
                0,
            )
        } else {
            let response_mask = Tensor::f_stack(&self.live, 1)?;
            // steps in which no row was live are trailing padding: drop them
            let any_live = response_mask.f_any_dim(0, false)?;
            let g = i64::try_from(any_live.f_sum(Kind::Int64)?)?.max(1);
            (
                Tensor::f_stack(&self.tokens, 1)?.f_narrow(1, 0, g)?,
                response_mask.f_narrow(1, 0, g)?,
                g,
            )
        };
        let sequences = Tensor::f_cat(&[&prompt, &response], 1)?;
        let attention_mask =
            Tensor::f_cat(&[&prompt_mask, &response_mask.f_to_kind(Kind::Int64)?], 1)?;
        Ok(Finished {
            sequences,
            response,
            response_mask,
            attention_mask,
            steps,
            b: self.b,
            device: self.device,
        })
    }
}

/// The stacked result of a decode (see [`GenerationOutput`] for the fields).
pub(crate) struct Finished {
    pub(crate) sequences: Tensor,
    pub(crate) response: Tensor,
    pub(crate) response_mask: Tensor,
    pub(crate) attention_mask: Tensor,
    steps: i64,
    b: i64,
    device: Device,
}

impl Finished {
    /// The number of decode steps kept, `G`.
    pub(crate) fn steps(&self) -> i64 {
        self.steps
    }

    /// Per-step float values `[B]` stacked to `[B, G]` and trimmed like the response.
    pub(crate) fn trim(&self, per_step: &[Tensor]) -> Result<Tensor> {
        if per_step.is_empty() || self.steps == 0 {
            return Ok(Tensor::f_zeros([self.b, 0], (Kind::Float, self.device))?);
        }
        Ok(Tensor::f_stack(per_step, 1)?.f_narrow(1, 0, self.steps)?)
    }
}

/// The input of one block at every position a decode feeds
/// ([`GenerateOptions::capture_block_input`](super::GenerateOptions::capture_block_input)):
/// the prompt pass's, then one position per step, written into the whole batch (zeros on the
/// rows a step did not run, and at the last token, which no step feeds).
pub(crate) struct BlockCapture {
    block: usize,
    prompt: Tensor,
    steps: Vec<Tensor>,
    /// `[B, n_embd]` zeros: the rows a compacted step did not run.
    zeros: Tensor,
}

impl BlockCapture {
    /// From the prompt pass's block input `[B, P, n_embd]` (`None` when `block` was not
    /// captured), with room for `steps` steps.
    pub(crate) fn new(block: usize, prompt: Option<Tensor>, steps: i64) -> Result<Self> {
        let prompt = prompt.ok_or_else(|| {
            Error::invalid(
                "generate",
                format!("the model returned no input of block {block} (capture_block_input)"),
            )
        })?;
        let (b, _, h) = prompt.size3()?;
        let zeros = Tensor::f_zeros([b, h], (prompt.kind(), prompt.device()))?;
        Ok(BlockCapture {
            block,
            prompt,
            steps: Vec::with_capacity(usize::try_from(steps).unwrap_or(0)),
            zeros,
        })
    }

    /// What a decode step computes: the hidden state only, and this block's input.
    pub(crate) fn options(&self) -> ForwardOptions {
        ForwardOptions {
            logits: false,
            capture_block_input: Some(self.block),
        }
    }

    /// Records a step's block input `[A, 1, n_embd]` on the decoded rows of `active`.
    pub(crate) fn push(&mut self, active: &ActiveRows, out: &LmOutput) -> Result<()> {
        let h = out.block_input.as_ref().ok_or_else(|| {
            Error::invalid(
                "generate",
                format!("a decode step returned no input of block {}", self.block),
            )
        })?;
        self.steps
            .push(active.scatter(&h.f_select(1, 0)?, &self.zeros)?);
        Ok(())
    }

    /// `[B, P + G, n_embd]`: the prompt's block inputs, then those of the tokens the first
    /// `g − 1` steps fed, then zeros (the last token, which no step feeds).
    pub(crate) fn finish(self, g: i64) -> Result<Tensor> {
        let g = usize::try_from(g).unwrap_or(0);
        if g == 0 {
            return Ok(self.prompt);
        }
        let mut columns: Vec<Tensor> = self.steps.into_iter().take(g).collect();
        columns.resize_with(g, || self.zeros.shallow_clone());
        let response = Tensor::f_stack(&columns, 1)?;
        Ok(Tensor::f_cat(&[&self.prompt, &response], 1)?)
    }
}
