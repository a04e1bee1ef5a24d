//! Compacting finished rows out of a batched decode.
//!
//! A row that produced EOS only receives the pad id from then on, but a plain batched decode
//! still runs it through every block at every later step. [`ActiveRows`] tracks which rows of
//! the batch the decode still runs: once at least a quarter of them are finished (and at least
//! two steps remain), the decoder keeps only the live rows (one `index_select` of the KV
//! cache, the mask and the positions) and every later step runs on those alone. The per-step
//! values the caller keeps are scattered back to the whole batch (the pad id, a log-prob of 0),
//! so the outputs have the same shapes and values as without compaction: the same tokens
//! (greedy, and sampled: the uniforms are drawn `[steps, B]` up front and each row reads its
//! own column) and the same log-probs up to the rounding of a smaller matrix product.
//!
//! The quarter is the "cheaper than padding" rule: the compaction copies the cache once (about
//! one step's attention reads of it), and every later step saves the finished rows' share of
//! its projections, MLPs and LM head, which outweighs that copy from a quarter on with two or
//! more steps left.

use tch::{Kind, Tensor};

use crate::error::Result;

/// The finished share of the decoded rows from which they are compacted away: `1 / 4`.
const COMPACT_NUMERATOR: i64 = 1;
const COMPACT_DENOMINATOR: i64 = 4;

/// Which rows of a batch of `B` a decode still runs.
#[derive(Debug)]
pub(crate) struct ActiveRows {
    /// `[A]` int64, ascending: the batch rows still decoded; `None` while all `B` are.
    index: Option<Tensor>,
    /// `A`.
    active: i64,
    enabled: bool,
    /// How many times the decode was compacted.
    pub(crate) compactions: usize,
    /// The sum over decoded steps of the rows they ran (`B × steps` without compaction).
    pub(crate) row_steps: i64,
}

impl ActiveRows {
    /// All `b` rows decoded; compaction only when `enabled`.
    pub(crate) fn new(b: i64, enabled: bool) -> Self {
        ActiveRows {
            index: None,
            active: b,
            enabled,
            compactions: 0,
            row_steps: 0,
        }
    }

    /// `A`, the number of rows decoded now.
    #[cfg(test)]
    pub(crate) fn active(&self) -> i64 {
        self.active
    }

    /// A whole-batch tensor `[B, …]` narrowed to the decoded rows `[A, …]` (itself while every
    /// row is decoded).
    pub(crate) fn select(&self, t: &Tensor) -> Result<Tensor> {
        Ok(match &self.index {
            None => t.shallow_clone(),
            Some(i) => t.f_index_select(0, i)?,
        })
    }

    /// Decoded-row values `[A]` written into the whole batch `[B]`, `fill` (`[B]`) elsewhere
    /// (`values` itself while every row is decoded).
    pub(crate) fn scatter(&self, values: &Tensor, fill: &Tensor) -> Result<Tensor> {
        Ok(match &self.index {
            None => values.shallow_clone(),
            Some(i) => fill.f_index_copy(0, i, &values.f_to_kind(fill.kind())?)?,
        })
    }

    /// Counts one decoded step.
    pub(crate) fn count_step(&mut self) {
        self.row_steps = self.row_steps.saturating_add(self.active);
    }

    /// After a step: `unfinished` `[B]` bool and `live` its count (read by the caller, `None`
    /// when this step read none). When compaction pays ([module docs](self)), the decoded set
    /// becomes the live rows and the returned `[A']` positions *within the current decoded
    /// rows* are what the decoder keeps; `None`: decode the same rows.
    pub(crate) fn compact(
        &mut self,
        unfinished: &Tensor,
        live: Option<i64>,
        steps_left: i64,
    ) -> Result<Option<Tensor>> {
        let Some(live) = live else { return Ok(None) };
        let finished = self.active - live;
        if !self.enabled
            || live <= 0
            || steps_left < 2
            || finished <= 0
            || finished * COMPACT_DENOMINATOR < self.active * COMPACT_NUMERATOR
        {
            return Ok(None);
        }
        // finished rows never come back, so the live rows are a subset of the decoded ones
        let keep = self
            .select(unfinished)?
            .f_nonzero()?
            .f_squeeze_dim(1)?
            .f_to_kind(Kind::Int64)?;
        let index = unfinished.f_nonzero()?.f_squeeze_dim(1)?;
        self.index = Some(index);
        self.active = live;
        self.compactions += 1;
        Ok(Some(keep))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Device;

    fn bools(v: &[bool]) -> Tensor {
        Tensor::from_slice(v)
    }

    #[test]
    fn compacts_from_a_quarter_finished_and_scatters_back() -> Result<()> {
        let mut rows = ActiveRows::new(8, true);
        // 1 of 8 finished: under a quarter, no compaction
        let u = bools(&[true, true, false, true, true, true, true, true]);
        assert!(rows.compact(&u, Some(7), 5)?.is_none());
        // 2 of 8: a quarter, compacted to the 6 live rows
        let u = bools(&[true, true, false, true, false, true, true, true]);
        let keep = rows.compact(&u, Some(6), 5)?.expect("compacts");
        assert_eq!(Vec::<i64>::try_from(&keep)?, vec![0, 1, 3, 5, 6, 7]);
        assert_eq!(rows.active(), 6);
        // a whole-batch tensor narrowed, and values scattered back with the fill elsewhere
        let whole = Tensor::arange(8, (Kind::Int64, Device::Cpu)) * 10;
        assert_eq!(
            Vec::<i64>::try_from(&rows.select(&whole)?)?,
            vec![0, 10, 30, 50, 60, 70]
        );
        let pad = Tensor::full([8], -1, (Kind::Int64, Device::Cpu));
        let vals = Tensor::from_slice(&[1i64, 2, 3, 4, 5, 6]);
        assert_eq!(
            Vec::<i64>::try_from(&rows.scatter(&vals, &pad)?)?,
            vec![1, 2, -1, 3, -1, 4, 5, 6]
        );
        // then rows 1 and 6 finish (2 of the 6 decoded): positions within the decoded rows
        let u = bools(&[true, false, false, true, false, true, false, true]);
        let keep = rows.compact(&u, Some(4), 3)?.expect("compacts");
        assert_eq!(Vec::<i64>::try_from(&keep)?, vec![0, 2, 3, 5]);
        assert_eq!(
            Vec::<i64>::try_from(&rows.select(&whole)?)?,
            vec![0, 30, 50, 70]
        );
        assert_eq!(rows.compactions, 2);
        Ok(())
    }

    #[test]
    fn does_not_compact_when_it_cannot_pay_or_is_off() -> Result<()> {
        let u = bools(&[true, false, false, true]);
        // one step left: the copy would not be repaid
        assert!(ActiveRows::new(4, true).compact(&u, Some(2), 1)?.is_none());
        // no count read this step (the lazy check on accelerators)
        assert!(ActiveRows::new(4, true).compact(&u, None, 5)?.is_none());
        // switched off
        assert!(ActiveRows::new(4, false).compact(&u, Some(2), 5)?.is_none());
        // every row finished: the decode stops instead
        let none = bools(&[false, false, false, false]);
        assert!(ActiveRows::new(4, true)
            .compact(&none, Some(0), 5)?
            .is_none());
        Ok(())
    }

    // ---------------------------------------------------------------- in a real decode

    use crate::modules::llm::generation::{generate_impl, GenerateOptions, GenerationConfig};
    use crate::modules::llm::ilql_generation::{ilql_generate_impl, IlqlGenerationConfig};
    use crate::modules::llm::nn::with_init_seed;
    use crate::modules::llm::{CausalLmWithIlqlHeads, Gpt2Config, Gpt2Model};
    use crate::rng::Generator;
    use tch::nn::VarStore;

    const VOCAB: i64 = 13;
    const PAD: i64 = 0;

    fn gpt2(vs: &VarStore) -> Gpt2Model {
        let cfg = Gpt2Config::new(VOCAB)
            .with_n_layer(2)
            .with_n_embd(16)
            .with_n_head(2)
            .with_n_positions(32);
        with_init_seed(5, || Gpt2Model::new(&vs.root(), &cfg)).unwrap()
    }

    /// 12 rows: 4 prompts (left-padded) of 3 rows each.
    fn prompts() -> (Tensor, Tensor) {
        let rows: [[i64; 3]; 4] = [[0, 5, 6], [7, 8, 9], [0, 0, 10], [11, 12, 4]];
        let (mut ids, mut mask) = (Vec::new(), Vec::new());
        for r in rows {
            for _ in 0..3 {
                ids.extend(r);
                mask.extend(r.map(|t| i64::from(t != 0)));
            }
        }
        (
            Tensor::from_slice(&ids).view([12, 3]),
            Tensor::from_slice(&mask).view([12, 3]),
        )
    }

    fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
        if a.numel() == 0 {
            return 0.0;
        }
        (a - b).abs().max().double_value(&[])
    }

    /// The most frequent token of a no-EOS greedy decode at step 2: an EOS that finishes a
    /// good share of the rows early but not all of them.
    fn frequent_token_at_step_2(model: &Gpt2Model, ids: &Tensor, mask: &Tensor) -> i64 {
        let cfg = GenerationConfig::new(6).with_pad_token_id(PAD);
        let opts = GenerateOptions::default();
        let (out, _) = generate_impl(model, ids, Some(mask), &cfg, &opts, None).unwrap();
        let counts = out.response.select(1, 2).bincount::<Tensor>(None, VOCAB);
        counts.argmax(0, false).int64_value(&[])
    }

    #[test]
    fn a_decode_compacts_and_gives_what_the_whole_batch_gives() {
        let vs = VarStore::new(Device::Cpu);
        let model = gpt2(&vs);
        let (ids, mask) = prompts();
        let eos = frequent_token_at_step_2(&model, &ids, &mask);
        let greedy = GenerationConfig::new(10)
            .with_eos_token_id(eos)
            .with_pad_token_id(PAD);
        let sampled = GenerationConfig::rlhf_sampling(10)
            .with_eos_token_id(3)
            .with_pad_token_id(PAD);
        let compacting = GenerateOptions::default();
        let whole = GenerateOptions::default().with_keep_finished_rows(true);
        for (label, cfg) in [("greedy", &greedy), ("sampled", &sampled)] {
            for grouped in [1, 3] {
                for seed in 0..4u64 {
                    let run = |opts: GenerateOptions<'_>| {
                        let opts = opts.with_prompt_groups(grouped);
                        let mut rng = Generator::new(seed);
                        let rng = cfg.do_sample.then_some(&mut rng);
                        generate_impl(&model, &ids, Some(&mask), cfg, &opts, rng).unwrap()
                    };
                    let ((a, rows_a), (b, rows_b)) = (run(compacting), run(whole));
                    let what = format!("{label}, groups {grouped}, seed {seed}");
                    assert!(a.sequences.equal(&b.sequences), "{what}: tokens");
                    assert!(a.response_mask.equal(&b.response_mask), "{what}: mask");
                    assert!(a.attention_mask.equal(&b.attention_mask), "{what}");
                    let d = max_diff(&a.log_probs, &b.log_probs);
                    assert!(d <= 1e-5, "{what}: log-probs differ by {d}");
                    // the whole batch ran every row at every step; the compacted decode
                    // ran exactly the live rows from its first compaction on
                    let steps = a.response.size()[1];
                    assert_eq!(rows_b.compactions, 0, "{what}");
                    assert_eq!(rows_b.row_steps, 12 * steps, "{what}");
                    if label == "greedy" || seed == 0 {
                        assert!(rows_a.compactions >= 1, "{what}: no compaction");
                        assert!(rows_a.row_steps < rows_b.row_steps, "{what}");
                    }
                    // each row decoded at least while it was live
                    let live = a.response_mask.sum(Kind::Int64).int64_value(&[]);
                    assert!(rows_a.row_steps >= live, "{what}");
                }
            }
        }
    }

    #[test]
    fn ilql_decodes_compact_alike() {
        let vs = VarStore::new(Device::Cpu);
        let model = with_init_seed(6, || {
            let trunk = Gpt2Model::new(
                &vs.root(),
                &Gpt2Config::new(VOCAB)
                    .with_n_layer(2)
                    .with_n_embd(16)
                    .with_n_head(2)
                    .with_n_positions(32),
            )?;
            CausalLmWithIlqlHeads::from_model(&vs.root(), trunk, true, 0.01)
        })
        .unwrap();
        let (ids, mask) = prompts();
        let cfg = IlqlGenerationConfig::new(10)
            .with_top_k(0)
            .with_eos_token_id(3)
            .with_pad_token_id(PAD)
            .with_log_advantages(true);
        let mut compacted = 0;
        for seed in 0..4u64 {
            let run = |keep: bool| {
                let opts = GenerateOptions::default().with_keep_finished_rows(keep);
                let rng = &mut Generator::new(seed);
                ilql_generate_impl(&model, &ids, Some(&mask), &cfg, &opts, rng).unwrap()
            };
            let ((a, rows_a), (b, _)) = (run(false), run(true));
            assert!(a.sequences.equal(&b.sequences), "seed {seed}");
            assert!(a.response_mask.equal(&b.response_mask), "seed {seed}");
            let (adv_a, adv_b) = (a.advantages.unwrap(), b.advantages.unwrap());
            let d = max_diff(&adv_a, &adv_b);
            assert!(d <= 1e-5, "seed {seed}: advantages differ by {d}");
            compacted += rows_a.compactions;
        }
        assert!(compacted >= 1, "no ILQL decode compacted");
    }
}
