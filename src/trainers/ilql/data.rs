//! ILQL's offline data (trlX HEAD's `make_experience` / `tokenize_dialogue` /
//! `ILQLRolloutStorage`, rlhf.md §2.2): scored samples turned into per-sample token rows,
//! action and state positions, a continuation mask and per-action rewards, collated into
//! right-padded [`TensorDict`] batches that [`IlqlLoss`] reads.
//!
//! # Samples
//! - [`IlqlSample::Dialogue`]: text segments `[prompt, output, prompt, output, …]` (an even,
//!   non-zero number); the outputs are the model's actions.
//! - [`IlqlSample::Text`]: a bare string `s`, meaning the dialogue `(BOS, s)` as in trlX:
//!   its tokens are `BOS + s + EOS` (b623d1b's `bos + text + eos`), the actions are those of
//!   `s + EOS`.
//! - [`IlqlTokenSample`]: the same from token ids (a prompt and a response, or token
//!   segments), e.g. from rollouts; nothing is added to them.
//!
//! Each comes with a scalar return (its score).
//!
//! # Tokenisation ([`IlqlDataset::from_texts`])
//! Each segment is encoded on its own. With [`IlqlDataConfig::add_eos`] (default, trlX) the
//! EOS id is appended to the last segment unless it already ends with it; with
//! [`IlqlDataConfig::add_bos`] (default off, as trlX HEAD for dialogues) the BOS id is
//! prepended to the first prompt. The row is then truncated on the right to
//! [`IlqlDataConfig::seq_length`] tokens, segment by segment (trlX: `tokens[:max(L − c, 0)]`
//! with `c` the tokens before the segment), and segments left empty are dropped.
//!
//! # Positions, mask and rewards (per sample, `L` tokens)
//! - `actions_ixs`: for each output segment at absolute position `p` with `n` tokens,
//!   `p − 1, …, p + n − 2`: the positions whose **next** token is an action, so the action
//!   of entry `j` is `tokens[actions_ixs[j] + 1]`.
//! - `states_ixs = actions_ixs ++ [L − 1]` (`A + 1` entries).
//! - `continues = [1; A] ++ [0]`: trlX's `dones`, which despite its name is 1 where the
//!   sample goes on (a continuation mask); the loss takes `continues[:-1]` as its mask and
//!   `continues[1:]` to zero the value after the last action.
//! - `action_rewards`: `A` entries, all 0 but the last, the sample's return normalised over
//!   the dataset ([`normalize_returns`]).
//!
//! # Batch layout ([`IlqlDataset::batch`]; keys from [`IlqlKeys`], batch size `[B]`)
//! `T` = the longest row, `A` = the most actions of a row; every row is right-padded.
//!
//! | key (default) | shape, dtype | content | padding |
//! |---|---|---|---|
//! | `("tokens", "full")` | `[B, T]` int64 | the token ids | 0 |
//! | `("masks", "all_attention_mask")` | `[B, T]` int64 | 1 on real tokens (trlX: all ones before padding) | 0 |
//! | `"actions_ixs"` ([`LlmKeys`]'s) | `[B, A]` int64 | action positions | 0 |
//! | `"states_ixs"` ([`LlmKeys`]'s) | `[B, A + 1]` int64 | state positions | 0 |
//! | `"continues"` | `[B, A + 1]` int64 | continuation mask (trlX's `dones`) | 0 |
//! | `"action_rewards"` | `[B, A]` float32 | per-action rewards | 0 |
//!
//! A padded action has `continues = 0` at its column, so it drops out of every loss term,
//! exactly as trlX's `pad_sequence(…, padding_value=0)` collation does.
//!
//! [`IlqlLoss`]: crate::objectives::llm::IlqlLoss
//! [`LlmKeys`]: crate::modules::llm::LlmKeys
//!
//! ```
//! use torchrl::modules::llm::ByteTokenizer;
//! use torchrl::trainers::ilql::data::{IlqlDataConfig, IlqlDataset, IlqlSample};
//! # fn main() -> torchrl::Result<()> {
//! let samples = [IlqlSample::from("ab"), IlqlSample::dialogue(["Q", "x", "R", "yz"])];
//! let data = IlqlDataset::from_texts(&samples, &[1.0, 0.0], &ByteTokenizer::new(), &IlqlDataConfig::new())?;
//! let s = &data.elements()[0]; // BOS a b EOS: actions a, b, EOS
//! assert_eq!(s.input_ids, vec![ByteTokenizer::BOS, 97, 98, ByteTokenizer::EOS]);
//! assert_eq!((s.actions_ixs.clone(), s.states_ixs.clone()), (vec![0, 1, 2], vec![0, 1, 2, 3]));
//! let d = &data.elements()[1]; // Q x R y z EOS: two outputs, at 1 and 3
//! assert_eq!(d.actions_ixs, vec![0, 2, 3, 4]);
//! assert_eq!(d.continues, vec![1, 1, 1, 1, 0]);
//! // returns 1 and 0 normalise to ±1/√2 (unbiased std √½)
//! assert!((d.action_rewards[3] + 0.5f64.sqrt()).abs() < 1e-12);
//! let batch = data.batch(&[0, 1])?;
//! assert_eq!(batch.get_or_err("actions_ixs")?.size(), vec![2, 4]);
//! assert_eq!(batch.get_or_err(("tokens", "full"))?.size(), vec![2, 6]);
//! # Ok(()) }
//! ```

use tch::{Device, Kind, Tensor};

use crate::error::{Error, Result};
use crate::macros::setters;
use crate::modules::llm::{pad_rows, PaddingSide, TextTokenizer};
use crate::objectives::llm::IlqlKeys;
use crate::rng::Generator;
use crate::tensordict::TensorDict;

// ------------------------------------------------------------------ samples

/// A scored text sample of the offline dataset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IlqlSample {
    /// A bare string `s`: the dialogue `(BOS, s)` (trlX's `[bos_token, s]`).
    Text(String),
    /// Segments `[prompt, output, prompt, output, …]`.
    Dialogue(Vec<String>),
}

impl IlqlSample {
    /// A dialogue from its segments.
    pub fn dialogue<S: Into<String>>(segments: impl IntoIterator<Item = S>) -> Self {
        IlqlSample::Dialogue(segments.into_iter().map(Into::into).collect())
    }
}

impl From<&str> for IlqlSample {
    fn from(s: &str) -> Self {
        IlqlSample::Text(s.to_string())
    }
}

impl From<String> for IlqlSample {
    fn from(s: String) -> Self {
        IlqlSample::Text(s)
    }
}

impl From<Vec<String>> for IlqlSample {
    fn from(segments: Vec<String>) -> Self {
        IlqlSample::Dialogue(segments)
    }
}

/// A scored sample given as token ids: segments `[prompt, output, prompt, output, …]` and
/// its return. Nothing is added to the ids (no BOS, no EOS); they are only truncated to
/// [`IlqlDataConfig::seq_length`].
#[derive(Debug, Clone, PartialEq)]
pub struct IlqlTokenSample {
    /// The segments, alternately prompt and output.
    pub segments: Vec<Vec<i64>>,
    /// The sample's return (its score).
    pub ret: f64,
}

impl IlqlTokenSample {
    /// One prompt and one response (e.g. a rollout) with its return.
    pub fn new(prompt: Vec<i64>, response: Vec<i64>, ret: f64) -> Self {
        IlqlTokenSample {
            segments: vec![prompt, response],
            ret,
        }
    }

    /// Token segments `[prompt, output, …]` with a return.
    pub fn dialogue(segments: Vec<Vec<i64>>, ret: f64) -> Self {
        IlqlTokenSample { segments, ret }
    }
}

// ------------------------------------------------------------------ config

/// How samples become rows.
///
/// ```
/// use torchrl::trainers::ilql::data::IlqlDataConfig;
/// let cfg = IlqlDataConfig::new().with_seq_length(128);
/// assert_eq!((cfg.seq_length, cfg.add_bos, cfg.add_eos, cfg.normalize_returns), (128, false, true, true));
/// assert!(IlqlDataConfig::new().with_seq_length(1).validate().is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IlqlDataConfig {
    /// The longest row, in tokens (trlX's `train.seq_length`); at least 2. Default 64
    /// (rlhf.md §2.5).
    pub seq_length: usize,
    /// Prepend the tokenizer's BOS to a dialogue's first prompt (bare strings always start
    /// with BOS). Default `false` (trlX HEAD).
    pub add_bos: bool,
    /// Append the tokenizer's EOS to the last segment unless it ends with it. Default `true`
    /// (trlX).
    pub add_eos: bool,
    /// Normalise the returns over the dataset ([`normalize_returns`]); off, the raw returns
    /// are the final rewards. Default `true` (trlX).
    pub normalize_returns: bool,
}

impl Default for IlqlDataConfig {
    fn default() -> Self {
        IlqlDataConfig {
            seq_length: 64,
            add_bos: false,
            add_eos: true,
            normalize_returns: true,
        }
    }
}

impl IlqlDataConfig {
    /// The defaults.
    pub fn new() -> Self {
        Self::default()
    }

    setters! {
        /// Sets [`seq_length`](Self::seq_length).
        with_seq_length(seq_length: usize);
        /// Sets [`add_bos`](Self::add_bos).
        with_add_bos(add_bos: bool);
        /// Sets [`add_eos`](Self::add_eos).
        with_add_eos(add_eos: bool);
        /// Sets [`normalize_returns`](Self::normalize_returns).
        with_normalize_returns(normalize_returns: bool);
    }

    /// Checks the fields.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] when `seq_length < 2` (one prompt token and one action).
    pub fn validate(&self) -> Result<()> {
        if self.seq_length < 2 {
            return Err(Error::config(
                "IlqlDataConfig",
                "seq_length",
                ">= 2 (a prompt token and an action)",
                self.seq_length,
            ));
        }
        Ok(())
    }
}

// ------------------------------------------------------------------ returns

/// trlX HEAD's return normalisation: `(R − mean) / (std + ε)` with `std` the **unbiased**
/// standard deviation (`torch.std`'s default, Bessel's `n − 1`) and `ε = f64::EPSILON`
/// (`torch.finfo(float64).eps`, the returns being float64). With one return `std` is NaN and
/// trlX skips the division: the result is `R − mean = 0`. (b623d1b used `ε = 1e-30` and
/// divided regardless.)
///
/// ```
/// use torchrl::trainers::ilql::data::normalize_returns;
/// let r = normalize_returns(&[1.0, 2.0, 3.0]);
/// assert!((r[0] + 1.0).abs() < 1e-12 && r[1] == 0.0 && (r[2] - 1.0).abs() < 1e-12);
/// assert_eq!(normalize_returns(&[5.0]), vec![0.0]);
/// assert_eq!(normalize_returns(&[2.0, 2.0]), vec![0.0, 0.0]);
/// ```
pub fn normalize_returns(returns: &[f64]) -> Vec<f64> {
    let n = returns.len() as f64;
    if returns.is_empty() {
        return Vec::new();
    }
    let mean = returns.iter().sum::<f64>() / n;
    let centered: Vec<f64> = returns.iter().map(|r| r - mean).collect();
    if returns.len() < 2 {
        return centered;
    }
    let var = centered.iter().map(|c| c * c).sum::<f64>() / (n - 1.0);
    let std = var.sqrt();
    centered.iter().map(|c| c / (std + f64::EPSILON)).collect()
}

// ------------------------------------------------------------------ elements

/// One processed sample (unpadded), as in the [module docs](self).
#[derive(Debug, Clone, PartialEq)]
pub struct IlqlElement {
    /// The token ids, `L` of them (`L <= seq_length`).
    pub input_ids: Vec<i64>,
    /// The `A` action positions.
    pub actions_ixs: Vec<i64>,
    /// `actions_ixs ++ [L − 1]`.
    pub states_ixs: Vec<i64>,
    /// `[1; A] ++ [0]` (trlX's `dones`).
    pub continues: Vec<i64>,
    /// `A` rewards: 0 but the last, the normalised return.
    pub action_rewards: Vec<f64>,
    /// The sample's raw return.
    pub ret: f64,
}

/// A segment after tokenisation.
struct Segment {
    output: bool,
    tokens: Vec<i64>,
}

fn sample_key(i: usize) -> String {
    format!("samples[{i}]")
}

/// Truncates and indexes one sample's segments (the rewards are set later, by `finish`).
fn build_element(
    op: &'static str,
    i: usize,
    segments: Vec<Segment>,
    seq_length: usize,
    ret: f64,
) -> Result<IlqlElement> {
    let key = sample_key(i);
    if segments.first().is_none_or(|s| s.tokens.is_empty()) {
        return Err(Error::value(
            op,
            key,
            "a non-empty first prompt (the first action needs a state before it; use add_bos)",
            "an empty first prompt",
        ));
    }
    let mut input_ids = Vec::new();
    let mut actions_ixs = Vec::new();
    let mut first_output_at = None;
    let mut untruncated = 0;
    for seg in segments {
        let start = input_ids.len();
        let keep = seg.tokens.len().min(seq_length.saturating_sub(start));
        if seg.output && first_output_at.is_none() {
            first_output_at = Some(untruncated);
        }
        untruncated += seg.tokens.len();
        if seg.output && keep > 0 {
            // start >= 1: the first prompt is non-empty and kept (seq_length >= 2)
            actions_ixs.extend((start as i64 - 1)..(start + keep) as i64 - 1);
        }
        input_ids.extend(seg.tokens.into_iter().take(keep));
    }
    if actions_ixs.is_empty() {
        return Err(Error::value(
            op,
            key,
            format!("at least one output token within seq_length {seq_length}"),
            format!(
                "every output falls past it after truncation (the first output starts at token {})",
                first_output_at.unwrap_or(0)
            ),
        ));
    }
    let a = actions_ixs.len();
    let mut states_ixs = actions_ixs.clone();
    states_ixs.push(input_ids.len() as i64 - 1);
    let mut continues = vec![1i64; a];
    continues.push(0);
    Ok(IlqlElement {
        input_ids,
        actions_ixs,
        states_ixs,
        continues,
        action_rewards: vec![0.0; a],
        ret,
    })
}

fn check_segments(op: &'static str, i: usize, n: usize) -> Result<()> {
    if n == 0 || !n.is_multiple_of(2) {
        return Err(Error::value(
            op,
            sample_key(i),
            "an even, non-zero number of segments (prompt, output, prompt, output, …)",
            format!("{n} segments"),
        ));
    }
    Ok(())
}

fn check_outputs(op: &'static str, i: usize, segments: &[Segment]) -> Result<()> {
    for (j, s) in segments.iter().enumerate() {
        if s.output && s.tokens.is_empty() {
            return Err(Error::value(
                op,
                sample_key(i),
                "non-empty outputs",
                format!("output segment {j} has no tokens"),
            ));
        }
    }
    Ok(())
}

fn check_returns(op: &'static str, returns: &[f64], n: usize) -> Result<()> {
    if returns.len() != n {
        return Err(Error::argument(
            op,
            "returns",
            format!("one return per sample ({n})"),
            format!("{} returns", returns.len()),
        ));
    }
    match returns.iter().position(|r| !r.is_finite()) {
        Some(i) => Err(Error::value(
            op,
            sample_key(i),
            "a finite return",
            returns.get(i).map(|r| r.to_string()).unwrap_or_default(),
        )),
        None => Ok(()),
    }
}

fn special(op: &'static str, id: Option<i64>, which: &str, why: &str) -> Result<i64> {
    id.ok_or_else(|| {
        Error::argument(
            op,
            "tokenizer",
            format!("a tokenizer with a {which} token ({why})"),
            format!("a tokenizer without {which}"),
        )
    })
}

// ------------------------------------------------------------------ dataset

/// The offline ILQL dataset: processed samples ([`IlqlElement`]) and their collation into
/// batches (layout in the [module docs](self)).
#[derive(Debug, Clone)]
pub struct IlqlDataset {
    elements: Vec<IlqlElement>,
    keys: IlqlKeys,
    device: Device,
}

impl IlqlDataset {
    /// Tokenises scored text samples (trlX's `make_experience(samples, rewards, tokenizer,
    /// seq_length)`), one return per sample.
    ///
    /// # Errors
    /// An empty dataset, a returns count that is not the samples', a NaN or infinite return,
    /// a dialogue with an odd number of segments, an output that encodes to no tokens, an
    /// empty first prompt, a sample none of whose actions fits in `seq_length` after
    /// truncation, a tokenizer without BOS (for bare strings or `add_bos`) or EOS (for
    /// `add_eos`), or an invalid config. Each names the sample (`samples[i]`).
    pub fn from_texts<T: TextTokenizer + ?Sized>(
        samples: &[IlqlSample],
        returns: &[f64],
        tokenizer: &T,
        config: &IlqlDataConfig,
    ) -> Result<Self> {
        const OP: &str = "IlqlDataset::from_texts";
        config.validate()?;
        Self::check_non_empty(OP, samples.len())?;
        check_returns(OP, returns, samples.len())?;
        let bare = samples.iter().any(|s| matches!(s, IlqlSample::Text(_)));
        let bos = if bare || config.add_bos {
            Some(special(
                OP,
                tokenizer.bos_token_id(),
                "BOS",
                "bare strings and add_bos start with it",
            )?)
        } else {
            None
        };
        let eos = if config.add_eos {
            Some(special(OP, tokenizer.eos_token_id(), "EOS", "add_eos")?)
        } else {
            None
        };
        let mut rows = Vec::with_capacity(samples.len());
        for (i, (sample, ret)) in samples.iter().zip(returns).enumerate() {
            let mut segments = match sample {
                IlqlSample::Text(s) => vec![
                    Segment {
                        output: false,
                        tokens: bos.into_iter().collect(),
                    },
                    Segment {
                        output: true,
                        tokens: tokenizer.encode(s)?,
                    },
                ],
                IlqlSample::Dialogue(d) => {
                    check_segments(OP, i, d.len())?;
                    let mut segs = d
                        .iter()
                        .enumerate()
                        .map(|(j, text)| {
                            Ok(Segment {
                                output: j % 2 == 1,
                                tokens: tokenizer.encode(text)?,
                            })
                        })
                        .collect::<Result<Vec<_>>>()?;
                    if let (Some(b), Some(first)) =
                        (bos.filter(|_| config.add_bos), segs.first_mut())
                    {
                        first.tokens.insert(0, b);
                    }
                    segs
                }
            };
            if let (Some(e), Some(last)) = (eos, segments.last_mut()) {
                if last.tokens.last() != Some(&e) {
                    last.tokens.push(e);
                }
            }
            check_outputs(OP, i, &segments)?;
            rows.push(build_element(OP, i, segments, config.seq_length, *ret)?);
        }
        Ok(Self::finish(rows, config))
    }

    /// Builds the dataset from token ids (prompt + response + return, or token dialogues),
    /// e.g. from rollouts: the trainer's path. Nothing is added to the ids; they are
    /// truncated to `seq_length`.
    ///
    /// # Errors
    /// As [`from_texts`](Self::from_texts) (no tokenizer errors), and a negative token id.
    ///
    /// ```
    /// use torchrl::trainers::ilql::data::{IlqlDataConfig, IlqlDataset, IlqlTokenSample};
    /// # fn main() -> torchrl::Result<()> {
    /// let rows = [IlqlTokenSample::new(vec![5, 6], vec![7, 8, 9], 2.0), IlqlTokenSample::new(vec![1], vec![2], 0.0)];
    /// let data = IlqlDataset::from_token_rows(&rows, &IlqlDataConfig::new().with_seq_length(4))?;
    /// let e = &data.elements()[0]; // truncated to 5 6 7 8: the actions 7 and 8 stay
    /// assert_eq!((e.input_ids.clone(), e.actions_ixs.clone()), (vec![5, 6, 7, 8], vec![1, 2]));
    /// assert_eq!(data.len(), 2);
    /// # Ok(()) }
    /// ```
    pub fn from_token_rows(samples: &[IlqlTokenSample], config: &IlqlDataConfig) -> Result<Self> {
        const OP: &str = "IlqlDataset::from_token_rows";
        config.validate()?;
        Self::check_non_empty(OP, samples.len())?;
        let returns: Vec<f64> = samples.iter().map(|s| s.ret).collect();
        check_returns(OP, &returns, samples.len())?;
        let mut rows = Vec::with_capacity(samples.len());
        for (i, s) in samples.iter().enumerate() {
            check_segments(OP, i, s.segments.len())?;
            if let Some(bad) = s.segments.iter().flatten().find(|&&t| t < 0) {
                return Err(Error::value(
                    OP,
                    sample_key(i),
                    "token ids >= 0",
                    format!("id {bad}"),
                ));
            }
            let segments: Vec<Segment> = s
                .segments
                .iter()
                .enumerate()
                .map(|(j, t)| Segment {
                    output: j % 2 == 1,
                    tokens: t.clone(),
                })
                .collect();
            check_outputs(OP, i, &segments)?;
            rows.push(build_element(OP, i, segments, config.seq_length, s.ret)?);
        }
        Ok(Self::finish(rows, config))
    }

    fn check_non_empty(op: &'static str, n: usize) -> Result<()> {
        if n == 0 {
            return Err(Error::argument(
                op,
                "samples",
                "at least one sample",
                "an empty dataset",
            ));
        }
        Ok(())
    }

    fn finish(mut elements: Vec<IlqlElement>, config: &IlqlDataConfig) -> Self {
        let raw: Vec<f64> = elements.iter().map(|e| e.ret).collect();
        let finals = if config.normalize_returns {
            normalize_returns(&raw)
        } else {
            raw
        };
        for (e, r) in elements.iter_mut().zip(finals) {
            if let Some(last) = e.action_rewards.last_mut() {
                *last = r;
            }
        }
        IlqlDataset {
            elements,
            keys: IlqlKeys::default(),
            device: Device::Cpu,
        }
    }

    setters! {
        /// The keys the batches are written under (default [`IlqlKeys::default`]).
        with_keys(keys: IlqlKeys);
        /// The device of the batches (default CPU).
        with_device(device: Device);
    }

    /// The number of samples.
    pub fn len(&self) -> usize {
        self.elements.len()
    }

    /// Whether there is no sample (never, for a built dataset).
    pub fn is_empty(&self) -> bool {
        self.elements.is_empty()
    }

    /// The processed samples.
    pub fn elements(&self) -> &[IlqlElement] {
        &self.elements
    }

    /// The keys of the batches.
    pub fn keys(&self) -> &IlqlKeys {
        &self.keys
    }

    /// The samples at `indices`, collated into one right-padded batch (layout in the
    /// [module docs](self)). Indices may repeat.
    ///
    /// # Errors
    /// No index, or an index past the end.
    pub fn batch(&self, indices: &[usize]) -> Result<TensorDict> {
        const OP: &str = "IlqlDataset::batch";
        if indices.is_empty() {
            return Err(Error::argument(OP, "indices", "at least one index", "none"));
        }
        let mut rows = Vec::with_capacity(indices.len());
        for &i in indices {
            let e = self.elements.get(i).ok_or(Error::IndexOutOfRange {
                op: OP,
                index: i as i64,
                what: "the dataset".into(),
                size: self.elements.len() as i64,
            })?;
            rows.push(e);
        }
        let b = rows.len() as i64;
        let tokens = pad_rows(
            &rows.iter().map(|e| e.input_ids.clone()).collect::<Vec<_>>(),
            0,
            PaddingSide::Right,
        )?;
        let a = rows.iter().map(|e| e.actions_ixs.len()).max().unwrap_or(0);
        let pad_i64 = |f: &dyn Fn(&IlqlElement) -> &[i64], width: usize| -> Result<Tensor> {
            let mut flat = Vec::with_capacity(rows.len() * width);
            for e in &rows {
                let r = f(e);
                flat.extend(
                    r.iter()
                        .copied()
                        .chain(std::iter::repeat_n(0, width - r.len())),
                );
            }
            Ok(Tensor::f_from_slice(&flat)?.f_view([b, width as i64])?)
        };
        let actions_ixs = pad_i64(&|e| &e.actions_ixs, a)?;
        let states_ixs = pad_i64(&|e| &e.states_ixs, a + 1)?;
        let continues = pad_i64(&|e| &e.continues, a + 1)?;
        let mut rewards = Vec::with_capacity(rows.len() * a);
        for e in &rows {
            let n = e.action_rewards.len();
            rewards.extend(
                e.action_rewards
                    .iter()
                    .map(|&r| r as f32)
                    .chain(std::iter::repeat_n(0.0, a - n)),
            );
        }
        let rewards = Tensor::f_from_slice(&rewards)?.f_view([b, a as i64])?;
        let d = self.device;
        let k = &self.keys;
        TensorDict::new([b])?
            .with(&k.tokens, tokens.input_ids.f_to_device(d)?)?
            .with(&k.attention_mask, tokens.attention_mask.f_to_device(d)?)?
            .with(&k.actions_ixs, actions_ixs.f_to_device(d)?)?
            .with(&k.states_ixs, states_ixs.f_to_device(d)?)?
            .with(&k.continues, continues.f_to_device(d)?)?
            .with(
                &k.action_rewards,
                rewards.f_to_kind(Kind::Float)?.f_to_device(d)?,
            )
    }

    /// A seeded shuffle of the sample indices cut into minibatches of `batch_size` (the last
    /// one shorter when `batch_size` does not divide the length; trlX's
    /// `DataLoader(shuffle=True, drop_last=False)`). Fisher–Yates on `rng`.
    ///
    /// # Errors
    /// When `batch_size` is 0.
    ///
    /// ```
    /// use torchrl::trainers::ilql::data::{IlqlDataConfig, IlqlDataset, IlqlTokenSample};
    /// use torchrl::Generator;
    /// # fn main() -> torchrl::Result<()> {
    /// let rows: Vec<_> = (0..5).map(|i| IlqlTokenSample::new(vec![1], vec![2], i as f64)).collect();
    /// let data = IlqlDataset::from_token_rows(&rows, &IlqlDataConfig::new())?;
    /// let mbs = data.shuffled_indices(2, &mut Generator::new(0))?;
    /// assert_eq!(mbs.iter().map(Vec::len).collect::<Vec<_>>(), vec![2, 2, 1]);
    /// let mut all: Vec<usize> = mbs.concat();
    /// all.sort();
    /// assert_eq!(all, vec![0, 1, 2, 3, 4]);
    /// // the same seed gives the same minibatches
    /// assert_eq!(mbs, data.shuffled_indices(2, &mut Generator::new(0))?);
    /// # Ok(()) }
    /// ```
    pub fn shuffled_indices(
        &self,
        batch_size: usize,
        rng: &mut Generator,
    ) -> Result<Vec<Vec<usize>>> {
        if batch_size == 0 {
            return Err(Error::argument(
                "IlqlDataset::shuffled_indices",
                "batch_size",
                ">= 1",
                "0",
            ));
        }
        let mut order: Vec<usize> = (0..self.elements.len()).collect();
        for i in (1..order.len()).rev() {
            let j = usize::try_from(rng.below(i as u64 + 1)).unwrap_or(i);
            order.swap(i, j);
        }
        Ok(order.chunks(batch_size).map(<[usize]>::to_vec).collect())
    }

    /// One pass over the dataset in seeded shuffled minibatches ([`shuffled_indices`]),
    /// each collated with [`batch`](Self::batch).
    ///
    /// # Errors
    /// As [`shuffled_indices`]; each item as [`batch`](Self::batch).
    ///
    /// [`shuffled_indices`]: Self::shuffled_indices
    pub fn minibatches<'a>(
        &'a self,
        batch_size: usize,
        rng: &mut Generator,
    ) -> Result<impl Iterator<Item = Result<TensorDict>> + 'a> {
        let mbs = self.shuffled_indices(batch_size, rng)?;
        Ok(mbs.into_iter().map(move |idx| self.batch(&idx)))
    }
}
