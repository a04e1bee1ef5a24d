//! Tokenizers for the GPT policy: the [`TextTokenizer`] trait (encode, decode, special
//! tokens, batch encoding with left padding), a byte-level [`ByteTokenizer`] that needs no
//! files, and [`HfTokenizer`] for Hugging Face `tokenizer.json` files through the
//! `tokenizers` crate.
//!
//! ```
//! use torchrl::modules::llm::{BatchEncodeOptions, ByteTokenizer, SpecialTokens, TextTokenizer};
//! # fn main() -> torchrl::Result<()> {
//! let tok = ByteTokenizer::new();
//! assert_eq!(tok.vocab_size(), 259);
//! assert_eq!(tok.encode("hi")?, vec![104, 105]);
//! assert_eq!(tok.encode("hi<|endoftext|>")?, vec![104, 105, 256]);
//! // left-padded batch: pads first, mask 0 on them
//! let batch = tok.batch_encode(&["a", "abc"], &BatchEncodeOptions::default())?;
//! assert_eq!(Vec::<i64>::try_from(batch.input_ids.view([-1]))?, vec![257, 257, 97, 97, 98, 99]);
//! assert_eq!(Vec::<i64>::try_from(batch.attention_mask.view([-1]))?, vec![0, 0, 1, 1, 1, 1]);
//! let texts = tok.batch_decode(&batch.input_ids, Some(&batch.attention_mask), SpecialTokens::Skip)?;
//! assert_eq!(texts, vec!["a".to_string(), "abc".to_string()]);
//! // an id outside the vocabulary is an error
//! assert!(tok.decode(&[300], SpecialTokens::Keep).is_err());
//! # Ok(()) }
//! ```

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use tch::{Device, Kind, Tensor};

use super::bpe::{ByteLevelBpe, PieceCache};
use crate::error::{Error, Result};

/// Whether decoding writes special tokens out or drops them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SpecialTokens {
    /// Write them (`"<|endoftext|>"`).
    #[default]
    Keep,
    /// Drop them (`skip_special_tokens=True`).
    Skip,
}

/// Which side gets the padding of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PaddingSide {
    /// Pads before the tokens (what generation wants: trlX's and TorchRL's prompts).
    #[default]
    Left,
    /// Pads after the tokens.
    Right,
}

/// Options of [`TextTokenizer::batch_encode`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BatchEncodeOptions {
    /// Where the padding goes.
    pub padding_side: PaddingSide,
    /// Keep at most this many tokens per text (the last ones with left padding, the first
    /// ones with right padding); `None`: no truncation.
    pub max_length: Option<usize>,
    /// Prepend the BOS id (when the tokenizer has one).
    pub add_bos: bool,
    /// Append the EOS id (when the tokenizer has one).
    pub add_eos: bool,
}

/// A batch of encoded texts.
#[derive(Debug)]
pub struct Encoded {
    /// `[B, T]` int64, padded with the pad id.
    pub input_ids: Tensor,
    /// `[B, T]` int64, 1 on real tokens.
    pub attention_mask: Tensor,
}

/// Pads token rows of different lengths into one `[B, T]` batch (`T` = the longest row) on
/// the CPU: `input_ids` filled with `pad` and an `attention_mask` that is 1 on real tokens.
///
/// ```
/// use torchrl::modules::llm::{pad_rows, PaddingSide};
/// let rows = vec![vec![5i64, 6], vec![7]];
/// let left = pad_rows(&rows, 0, PaddingSide::Left)?;
/// assert_eq!(Vec::<i64>::try_from(left.input_ids.view([-1]))?, [5, 6, 0, 7]);
/// assert_eq!(Vec::<i64>::try_from(left.attention_mask.view([-1]))?, [1, 1, 0, 1]);
/// let right = pad_rows(&rows, 0, PaddingSide::Right)?;
/// assert_eq!(Vec::<i64>::try_from(right.input_ids.view([-1]))?, [5, 6, 7, 0]);
/// # Ok::<(), torchrl::Error>(())
/// ```
pub fn pad_rows(rows: &[Vec<i64>], pad: i64, side: PaddingSide) -> Result<Encoded> {
    let width = rows.iter().map(Vec::len).max().unwrap_or(0);
    // many short rows and one long one ask for rows * width ids: checked and reserved
    // fallibly (an allocation failure aborts the process; this is an error)
    let too_big = || {
        Error::argument(
            "pad_rows",
            "rows",
            "rows whose padded batch fits in memory",
            format!("{} rows padded to {width} tokens", rows.len()),
        )
    };
    let total = rows.len().checked_mul(width).ok_or_else(too_big)?;
    let mut ids = Vec::new();
    let mut mask = Vec::new();
    ids.try_reserve_exact(total).map_err(|_| too_big())?;
    mask.try_reserve_exact(total).map_err(|_| too_big())?;
    for row in rows {
        let n_pad = width - row.len();
        let pads = std::iter::repeat_n(pad, n_pad);
        let zeros = std::iter::repeat_n(0i64, n_pad);
        let ones = std::iter::repeat_n(1i64, row.len());
        match side {
            PaddingSide::Left => {
                ids.extend(pads.chain(row.iter().copied()));
                mask.extend(zeros.chain(ones));
            }
            PaddingSide::Right => {
                ids.extend(row.iter().copied().chain(pads));
                mask.extend(ones.chain(zeros));
            }
        }
    }
    let shape = [rows.len() as i64, width as i64];
    Ok(Encoded {
        input_ids: Tensor::f_from_slice(&ids)?.f_view(shape)?,
        attention_mask: Tensor::f_from_slice(&mask)?.f_view(shape)?,
    })
}

/// Token ids and each token's byte range `(start, end)` in the encoded text
/// ([`TextTokenizer::encode_with_offsets`]).
pub type IdsWithOffsets = (Vec<i64>, Vec<(usize, usize)>);

/// Text ↔ token ids.
pub trait TextTokenizer: Send {
    /// The ids of `text` (special-token strings inside it are recognised).
    fn encode(&self, text: &str) -> Result<Vec<i64>>;
    /// The text of `ids`.
    fn decode(&self, ids: &[i64], special: SpecialTokens) -> Result<String>;
    /// The number of ids.
    fn vocab_size(&self) -> i64;
    /// The end-of-sequence id, if any.
    fn eos_token_id(&self) -> Option<i64>;
    /// The padding id, if any.
    fn pad_token_id(&self) -> Option<i64>;
    /// The beginning-of-sequence id, if any.
    fn bos_token_id(&self) -> Option<i64>;

    /// The ids of `text`, as [`TextTokenizer::encode`] gives them, with each token's byte
    /// range `(start, end)` in `text` (what the `tokenizers` crate's `Encoding::get_offsets`
    /// reports); chat templates map assistant spans to tokens with them
    /// (`torchrl::data::llm::ChatTemplate::encode_with_assistant_mask`). The default is an
    /// error: a tokenizer that cannot tell where its tokens come from has no offsets.
    ///
    /// ```
    /// use torchrl::modules::llm::{ByteTokenizer, TextTokenizer};
    /// let (ids, offsets) = ByteTokenizer::new().encode_with_offsets("aé<|endoftext|>").unwrap();
    /// assert_eq!(ids, vec![97, 0xc3, 0xa9, ByteTokenizer::EOS]);
    /// // both bytes of "é" point at the whole character
    /// assert_eq!(offsets, vec![(0, 1), (1, 3), (1, 3), (3, 16)]);
    /// ```
    fn encode_with_offsets(&self, text: &str) -> Result<IdsWithOffsets> {
        let _ = text;
        Err(Error::invalid(
            "TextTokenizer::encode_with_offsets",
            "this tokenizer does not report token offsets",
        ))
    }

    /// The ids of each of `texts`, as [`TextTokenizer::encode`] gives them; a tokenizer may
    /// encode them in parallel ([`HfTokenizer`] does, on the `tokenizers` crate's thread pool).
    ///
    /// ```
    /// use torchrl::modules::llm::{ByteTokenizer, TextTokenizer};
    /// let tok = ByteTokenizer::new();
    /// assert_eq!(tok.encode_many(&["a", "bc"]).unwrap(), vec![vec![97], vec![98, 99]]);
    /// ```
    fn encode_many(&self, texts: &[&str]) -> Result<Vec<Vec<i64>>> {
        texts.iter().map(|t| self.encode(t)).collect()
    }

    /// Encodes `texts` into one padded batch on the CPU (pad id: the tokenizer's, else its
    /// EOS, else 0).
    fn batch_encode(&self, texts: &[&str], options: &BatchEncodeOptions) -> Result<Encoded> {
        let pad = self.pad_token_id().or(self.eos_token_id()).unwrap_or(0);
        let mut rows = Vec::with_capacity(texts.len());
        for text in texts {
            let mut ids = Vec::new();
            if options.add_bos {
                ids.extend(self.bos_token_id());
            }
            ids.extend(self.encode(text)?);
            if options.add_eos {
                ids.extend(self.eos_token_id());
            }
            if let Some(max) = options.max_length {
                if ids.len() > max {
                    ids = match options.padding_side {
                        PaddingSide::Left => ids.split_off(ids.len() - max),
                        PaddingSide::Right => {
                            ids.truncate(max);
                            ids
                        }
                    };
                }
            }
            rows.push(ids);
        }
        pad_rows(&rows, pad, options.padding_side)
    }

    /// Decodes each row of `ids` `[B, T]`, keeping only the tokens where `mask` is 1.
    fn batch_decode(
        &self,
        ids: &Tensor,
        mask: Option<&Tensor>,
        special: SpecialTokens,
    ) -> Result<Vec<String>> {
        super::causal_lm::dims2("batch_decode", "ids", ids, "[batch, time]")?;
        let size = ids.size();
        let rows: Vec<Vec<i64>> =
            Vec::<Vec<i64>>::try_from(&ids.f_to_kind(Kind::Int64)?.f_to_device(Device::Cpu)?)?;
        let masks: Option<Vec<Vec<i64>>> = match mask {
            Some(m) => {
                if m.size() != size {
                    return Err(Error::ShapeMismatch {
                        op: "batch_decode",
                        key: "mask".into(),
                        expected: size,
                        actual: m.size(),
                    });
                }
                Some(Vec::<Vec<i64>>::try_from(
                    &m.f_to_kind(Kind::Int64)?.f_to_device(Device::Cpu)?,
                )?)
            }
            None => None,
        };
        rows.iter()
            .enumerate()
            .map(|(i, row)| {
                let kept: Vec<i64> = match masks.as_ref().and_then(|m| m.get(i)) {
                    Some(m) => row
                        .iter()
                        .zip(m)
                        .filter(|(_, &k)| k != 0)
                        .map(|(&t, _)| t)
                        .collect(),
                    None => row.clone(),
                };
                self.decode(&kept, special)
            })
            .collect()
    }
}

fn check_ids(op: &'static str, ids: &[i64], vocab: i64) -> Result<()> {
    match ids.iter().find(|&&id| !(0..vocab).contains(&id)) {
        Some(bad) => Err(Error::value(
            op,
            "ids",
            format!("token ids in [0, {vocab})"),
            format!("id {bad}"),
        )),
        None => Ok(()),
    }
}

/// Errors unless every id of `tokenizer` is a row of a model's `model_vocab`-row embedding.
/// A smaller tokenizer is accepted: Hugging Face checkpoints pad the embedding past the
/// tokenizer (Qwen2.5: 151,936 rows, 151,665 tokens), and those rows are never encoded.
pub fn check_tokenizer_fits(
    op: &'static str,
    tokenizer: &dyn TextTokenizer,
    model_vocab: i64,
) -> Result<()> {
    if tokenizer.vocab_size() > model_vocab {
        return Err(Error::argument(
            op,
            "tokenizer",
            format!("a tokenizer whose ids fit the model's vocabulary size {model_vocab}"),
            format!("vocabulary size {}", tokenizer.vocab_size()),
        ));
    }
    Ok(())
}

// ------------------------------------------------------------------ bytes

/// One token per byte (ids 0–255) plus three special tokens: `<|endoftext|>` (256, EOS),
/// `<|pad|>` (257, padding) and `<|bos|>` (258). Vocabulary 259. Decoding turns the bytes
/// back into text (invalid UTF-8 becomes U+FFFD).
#[derive(Debug, Clone, Copy, Default)]
pub struct ByteTokenizer;

impl ByteTokenizer {
    /// The EOS id.
    pub const EOS: i64 = 256;
    /// The pad id.
    pub const PAD: i64 = 257;
    /// The BOS id.
    pub const BOS: i64 = 258;
    const SPECIALS: [(&'static str, i64); 3] = [
        ("<|endoftext|>", Self::EOS),
        ("<|pad|>", Self::PAD),
        ("<|bos|>", Self::BOS),
    ];

    /// The tokenizer.
    pub fn new() -> Self {
        ByteTokenizer
    }
}

impl TextTokenizer for ByteTokenizer {
    fn encode(&self, text: &str) -> Result<Vec<i64>> {
        let mut out = Vec::with_capacity(text.len());
        let mut rest = text;
        'outer: while !rest.is_empty() {
            for (s, id) in Self::SPECIALS {
                if let Some(after) = rest.strip_prefix(s) {
                    out.push(id);
                    rest = after;
                    continue 'outer;
                }
            }
            let mut chars = rest.chars();
            if let Some(c) = chars.next() {
                let mut buf = [0u8; 4];
                out.extend(c.encode_utf8(&mut buf).bytes().map(i64::from));
            }
            rest = chars.as_str();
        }
        Ok(out)
    }

    fn encode_with_offsets(&self, text: &str) -> Result<IdsWithOffsets> {
        // every byte of a character maps to that character's range, as the tokenizers crate
        // reports the pieces of a character split by a byte-level model
        let mut ids = Vec::with_capacity(text.len());
        let mut offsets = Vec::with_capacity(text.len());
        let mut at = 0;
        'outer: while at < text.len() {
            let rest = text.get(at..).unwrap_or_default();
            for (s, id) in Self::SPECIALS {
                if rest.starts_with(s) {
                    ids.push(id);
                    offsets.push((at, at + s.len()));
                    at += s.len();
                    continue 'outer;
                }
            }
            let Some(c) = rest.chars().next() else { break };
            let mut buf = [0u8; 4];
            for b in c.encode_utf8(&mut buf).bytes() {
                ids.push(i64::from(b));
                offsets.push((at, at + c.len_utf8()));
            }
            at += c.len_utf8();
        }
        Ok((ids, offsets))
    }

    fn decode(&self, ids: &[i64], special: SpecialTokens) -> Result<String> {
        check_ids("ByteTokenizer::decode", ids, 259)?;
        let mut text = String::new();
        let mut bytes = Vec::new();
        for &id in ids {
            match u8::try_from(id) {
                Ok(b) => bytes.push(b),
                Err(_) => {
                    text.push_str(&String::from_utf8_lossy(&bytes));
                    bytes.clear();
                    if special == SpecialTokens::Keep {
                        if let Some((s, _)) = Self::SPECIALS.iter().find(|(_, i)| *i == id) {
                            text.push_str(s);
                        }
                    }
                }
            }
        }
        text.push_str(&String::from_utf8_lossy(&bytes));
        Ok(text)
    }

    fn vocab_size(&self) -> i64 {
        259
    }
    fn eos_token_id(&self) -> Option<i64> {
        Some(Self::EOS)
    }
    fn pad_token_id(&self) -> Option<i64> {
        Some(Self::PAD)
    }
    fn bos_token_id(&self) -> Option<i64> {
        Some(Self::BOS)
    }
}

// ------------------------------------------------------------------ Hugging Face

/// A Hugging Face `tokenizer.json` (BPE, byte-level, WordPiece, …) through the `tokenizers`
/// crate. The EOS id defaults to the token `<|endoftext|>` and the pad id to `<pad>` (then
/// `<|pad|>`, then none) when the file has them; set others with [`HfTokenizer::with_eos_token`]
/// and [`HfTokenizer::with_pad_token`].
///
/// A `tokenizer.json` comes from anywhere, so [`HfTokenizer::from_file`] checks it for what
/// the `tokenizers` crate is known to abort or misbehave on before handing it over (see
/// [`MAX_PIECE_BYTES`], [`MAX_PAD_LENGTH`], [`MAX_PATTERN_BYTES`]; an unknown token the
/// vocabulary lacks), and every call into the crate runs behind `catch_unwind`: its panics
/// are errors naming the operation. The vocabulary size is the highest id + 1; an id inside
/// it that the file does not define (a gap) is an error naming the id.
#[derive(Clone)]
pub struct HfTokenizer {
    inner: tokenizers::Tokenizer,
    /// The lean byte-level BPE encoder, where it reproduces the file ([`super::bpe`]).
    fast: Option<Arc<ByteLevelBpe>>,
    /// Whether `fast` is used ([`HfTokenizer::with_fast_encoder`]).
    fast_on: bool,
    eos: Option<i64>,
    pad: Option<i64>,
    bos: Option<i64>,
    vocab_size: i64,
}

/// The longest vocabulary piece or added token accepted, in bytes: the `tokenizers` crate keeps
/// Unigram pieces in a byte trie that it drops (and clones) recursively, one stack frame per
/// byte, so a piece of a few hundred thousand bytes overflows the stack and aborts the
/// process; an added token of 70,000 bytes made every encode take seconds. Real pieces are a
/// few dozen bytes.
pub const MAX_PIECE_BYTES: usize = 1024;

/// The longest padding a `tokenizer.json` may ask for (`padding.strategy.Fixed`,
/// `padding.pad_to_multiple_of`), in tokens: beyond it the crate's padding allocates (or
/// overflows) without bound on every encode.
pub const MAX_PAD_LENGTH: u64 = 1 << 20;

/// The longest regex pattern (normalizers, pre-tokenizers) accepted, in bytes, and its deepest
/// group nesting: the regex parser recurses on nested groups.
pub const MAX_PATTERN_BYTES: usize = 1 << 16;
const MAX_PATTERN_DEPTH: usize = 64;

/// Runs a call into the `tokenizers` crate, turning its panics into errors under `op`.
fn guarded<T>(op: &'static str, f: impl FnOnce() -> T) -> Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|payload| {
        let msg = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "no message".into());
        Error::invalid(op, format!("the tokenizers crate panicked: {msg}"))
    })
}

/// The text a loaded lean encoder must encode as the crate does before it is used: words,
/// contractions, digits, punctuation, runs of spaces, tabs and newlines, non-ASCII letters and
/// symbols, a leading space, and common special tokens (added tokens where the file has them).
const PROBE: &str =
    " Hello, world! It's 2024: naïve café déjà-vu, 東京 \u{1F600} x=1.5e-3\t\tend  \n\n\
                     I'll we've THEY'RE don't   12345678 ...?! (a|b) <tag> \r\n<|endoftext|><|im_start|>x<s></s>[INST]  trailing   ";

/// The threads [`TextTokenizer::encode_many`] of a lean encoder runs on for `n` texts: the
/// cores (one where `TOKENIZERS_PARALLELISM` is `false` or `0`, as the crate), at most one per
/// 32 texts.
fn encode_workers(n: usize) -> usize {
    let off = std::env::var("TOKENIZERS_PARALLELISM").is_ok_and(|v| {
        matches!(
            v.to_ascii_lowercase().as_str(),
            "false" | "0" | "off" | "no"
        )
    });
    if off {
        return 1;
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    cores.min(n / 32).max(1)
}

/// The stack the `tokenizers` crate parses a file on: its deserialisers need more than a
/// spawned thread's default 2 MiB in debug builds (a Unigram file overflowed it).
const PARSE_STACK_BYTES: usize = 64 << 20;

/// Parses `text` with the `tokenizers` crate on a thread of its own with a
/// [`PARSE_STACK_BYTES`] stack, so that the caller's stack size does not decide whether a
/// file loads; a panic there is an error under `op`.
fn parse_on_large_stack(
    op: &'static str,
    text: String,
) -> Result<tokenizers::Result<tokenizers::Tokenizer>> {
    let worker = std::thread::Builder::new()
        .name("torchrl-tokenizer-parse".into())
        .stack_size(PARSE_STACK_BYTES)
        .spawn(move || guarded(op, || text.parse::<tokenizers::Tokenizer>()))
        .map_err(|e| Error::invalid(op, format!("could not start the parsing thread: {e}")))?;
    worker
        .join()
        .map_err(|_| Error::invalid(op, "the parsing thread panicked"))?
}

/// Checks a parsed `tokenizer.json` for what the `tokenizers` crate aborts or misbehaves on;
/// the reason names the field.
fn precheck(json: &serde_json::Value) -> std::result::Result<(), String> {
    use serde_json::Value;
    let model = json.get("model").unwrap_or(&Value::Null);
    let kind = model.get("type").and_then(Value::as_str).unwrap_or("");
    let vocab = model.get("vocab");
    if kind == "Unigram" {
        let pieces = vocab
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        for (i, entry) in pieces.iter().enumerate() {
            let piece = entry.get(0).and_then(Value::as_str).unwrap_or("");
            if piece.len() > MAX_PIECE_BYTES {
                return Err(format!(
                    "model.vocab[{i}] is a piece of {} bytes (at most {MAX_PIECE_BYTES})",
                    piece.len()
                ));
            }
        }
        let byte_fallback = model.get("byte_fallback").and_then(Value::as_bool) == Some(true);
        match model.get("unk_id") {
            Some(Value::Number(n)) => {
                if n.as_u64().is_none_or(|id| id >= pieces.len() as u64) {
                    return Err(format!(
                        "model.unk_id {n} is not an index of the {} pieces",
                        pieces.len()
                    ));
                }
            }
            _ if byte_fallback => {}
            _ => {
                return Err("model.unk_id is missing: text with an unknown character \
                             could not be encoded (and byte_fallback is off)"
                    .into())
            }
        }
    } else if let Some(Value::String(unk)) = model.get("unk_token") {
        // BPE, WordPiece, WordLevel: the unknown token must be a piece of the vocabulary
        let known = vocab
            .and_then(Value::as_object)
            .is_some_and(|v| v.contains_key(unk));
        if !known {
            return Err(format!(
                "model.unk_token {unk:?} is not in model.vocab: text with an unknown piece \
                 could not be encoded"
            ));
        }
    }
    // added tokens and other models' vocabulary keys: the same bound as Unigram pieces (the
    // crate's added-token matching took seconds of CPU per encode on a 70,000-byte token)
    let added = json.get("added_tokens").and_then(Value::as_array);
    for (i, t) in added.map(Vec::as_slice).unwrap_or(&[]).iter().enumerate() {
        let content = t.get("content").and_then(Value::as_str).unwrap_or("");
        if content.len() > MAX_PIECE_BYTES {
            return Err(format!(
                "added_tokens[{i}].content is a token of {} bytes (at most {MAX_PIECE_BYTES})",
                content.len()
            ));
        }
    }
    if let Some(map) = vocab.and_then(Value::as_object) {
        if let Some(long) = map.keys().find(|k| k.len() > MAX_PIECE_BYTES) {
            return Err(format!(
                "model.vocab has a token of {} bytes (at most {MAX_PIECE_BYTES})",
                long.len()
            ));
        }
    }
    if let Some(padding) = json.get("padding").filter(|p| !p.is_null()) {
        let fixed = padding.get("strategy").and_then(|s| s.get("Fixed"));
        for (field, v) in [
            ("padding.strategy.Fixed", fixed),
            (
                "padding.pad_to_multiple_of",
                padding.get("pad_to_multiple_of"),
            ),
        ] {
            if let Some(n) = v.and_then(Value::as_u64).filter(|n| *n > MAX_PAD_LENGTH) {
                return Err(format!("{field} is {n} (at most {MAX_PAD_LENGTH})"));
            }
        }
    }
    check_patterns(json, "")
}

/// A `Precompiled` normalizer's charsmap (base64): its first 4 bytes are the byte length of
/// the trie that follows, which the crate reserves before reading it (a length past the blob
/// asked for up to 8 GiB, an allocation failure aborts the process). The length must fit in
/// the blob.
fn check_charsmap(blob: &str) -> std::result::Result<(), String> {
    let digit = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => u32::from(c - b'A'),
            b'a'..=b'z' => u32::from(c - b'a') + 26,
            b'0'..=b'9' => u32::from(c - b'0') + 52,
            b'+' | b'-' => 62,
            b'/' | b'_' => 63,
            _ => return None,
        })
    };
    let bytes = blob.trim_end_matches('=').as_bytes();
    // the first 8 base64 digits hold the first 6 bytes
    let mut head = Vec::with_capacity(6);
    for chunk in bytes.chunks(4).take(2) {
        let mut acc = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            let d = digit(c).ok_or("not base64")?;
            acc |= d << (18 - 6 * i);
        }
        head.extend(
            acc.to_be_bytes()
                .iter()
                .skip(1)
                .take(chunk.len().saturating_sub(1)),
        );
    }
    let len_bytes: [u8; 4] = head
        .get(..4)
        .and_then(|h| h.try_into().ok())
        .ok_or("shorter than its 4-byte trie length")?;
    let trie = u64::from(u32::from_le_bytes(len_bytes));
    let decoded = (bytes.len() as u64 * 3) / 4;
    if trie > decoded.saturating_sub(4) {
        return Err(format!(
            "a trie of {trie} bytes in a blob of {decoded} (it must fit)"
        ));
    }
    Ok(())
}

/// Every regex pattern (`{"Regex": …}`) anywhere in the file: at most [`MAX_PATTERN_BYTES`]
/// bytes and [`MAX_PATTERN_DEPTH`] nested groups.
fn check_patterns(v: &serde_json::Value, at: &str) -> std::result::Result<(), String> {
    use serde_json::Value;
    match v {
        Value::Object(map) => {
            if map.get("type").and_then(Value::as_str) == Some("Precompiled") {
                let blob = map.get("precompiled_charsmap").and_then(Value::as_str);
                check_charsmap(blob.unwrap_or(""))
                    .map_err(|r| format!("{at}.precompiled_charsmap: {r}"))?;
            }
            if let Some(Value::String(re)) = map.get("Regex") {
                let mut depth = 0usize;
                let mut deepest = 0usize;
                for c in re.chars() {
                    match c {
                        '(' => depth += 1,
                        ')' => depth = depth.saturating_sub(1),
                        _ => {}
                    }
                    deepest = deepest.max(depth);
                }
                if re.len() > MAX_PATTERN_BYTES || deepest > MAX_PATTERN_DEPTH {
                    return Err(format!(
                        "{at}.Regex is a pattern of {} bytes and {deepest} nested groups \
                         (at most {MAX_PATTERN_BYTES} and {MAX_PATTERN_DEPTH})",
                        re.len()
                    ));
                }
            }
            for (k, child) in map {
                check_patterns(child, &format!("{at}.{k}"))?;
            }
        }
        Value::Array(items) => {
            for (i, child) in items.iter().enumerate() {
                check_patterns(child, &format!("{at}[{i}]"))?;
            }
        }
        _ => {}
    }
    Ok(())
}

impl fmt::Debug for HfTokenizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HfTokenizer")
            .field("vocab_size", &self.vocab_size())
            .field("eos", &self.eos)
            .field("pad", &self.pad)
            .field("bos", &self.bos)
            .field("fast_encoder", &self.has_fast_encoder())
            .finish()
    }
}

impl HfTokenizer {
    /// Reads a `tokenizer.json`.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let op = "HfTokenizer::from_file";
        let path = path.as_ref();
        if !path.exists() {
            return Err(Error::Io {
                op,
                path: path.display().to_string(),
                source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such file"),
            });
        }
        let invalid = |reason: String| Error::InvalidFile {
            op,
            path: path.display().to_string(),
            reason,
        };
        let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
            op,
            path: path.display().to_string(),
            source,
        })?;
        // checked before the crate sees it: some files make it abort, not fail
        let json: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| invalid(format!("not a tokenizer.json: not JSON: {e}")))?;
        precheck(&json).map_err(|r| invalid(format!("refused before loading: {r}")))?;
        let inner = parse_on_large_stack(op, text)
            .map_err(|e| invalid(e.to_string()))?
            .map_err(|e| invalid(format!("not a tokenizer.json: {e}")))?;
        let (vocab_size, eos, pad, bos) = guarded(op, || {
            // the highest id + 1, not the number of entries: ids may have gaps
            let top = inner.get_vocab(true).into_values().max();
            let id = |s: &str| inner.token_to_id(s).map(i64::from);
            (
                top.map_or(0, |t| i64::from(t) + 1),
                id("<|endoftext|>").or_else(|| id("</s>")),
                id("<pad>").or_else(|| id("<|pad|>")),
                id("<s>").or_else(|| id("<|bos|>")),
            )
        })
        .map_err(|e| invalid(e.to_string()))?;
        let fast = guarded(op, || {
            ByteLevelBpe::from_json(&json, |content| inner.token_to_id(content)).ok()
        })
        .ok()
        .flatten()
        .map(Arc::new);
        let mut tok = HfTokenizer {
            inner,
            fast,
            fast_on: true,
            eos,
            pad,
            bos,
            vocab_size,
        };
        // the lean encoder is used only where it gives the crate's ids on a probe text
        if tok.fast.is_some() && !tok.fast_encoder_agrees(PROBE) {
            tok.fast = None;
        }
        Ok(tok)
    }

    /// Whether [`TextTokenizer::encode`] and [`TextTokenizer::encode_many`] run the lean
    /// byte-level BPE encoder (the file is one it reproduces: byte-level BPE without dropout
    /// or byte fallback, no normalizer or NFC, `ByteLevel` / `Split` pre-tokenizers) rather
    /// than the `tokenizers` crate's `encode`. The ids are the crate's either way; the lean
    /// encoder is faster (`docs/performance.md`, W23).
    ///
    /// ```
    /// use torchrl::modules::llm::{HfTokenizer, TextTokenizer};
    /// # fn main() -> torchrl::Result<()> {
    /// let path = concat!(env!("CARGO_MANIFEST_DIR"), "/specs/chat/chatml_qwen/tokenizer.json");
    /// let tok = HfTokenizer::from_file(path)?;
    /// assert!(tok.has_fast_encoder());
    /// let crate_only = tok.clone().with_fast_encoder(false);
    /// assert!(!crate_only.has_fast_encoder());
    /// let text = "<|im_start|>user\nHow many r's in   strawberry? 123<|im_end|>";
    /// assert_eq!(tok.encode(text)?, crate_only.encode(text)?);
    /// # Ok(()) }
    /// ```
    pub fn has_fast_encoder(&self) -> bool {
        self.fast().is_some()
    }

    /// Turns the lean encoder off (`false`: every text through the `tokenizers` crate) or back
    /// on where the file allows it (`true`, the default).
    pub fn with_fast_encoder(mut self, on: bool) -> Self {
        self.fast_on = on;
        self
    }

    fn fast(&self) -> Option<&ByteLevelBpe> {
        self.fast.as_deref().filter(|_| self.fast_on)
    }

    /// Whether the lean encoder gives the crate's ids for `text` (true where it sends the text
    /// to the crate).
    fn fast_encoder_agrees(&self, text: &str) -> bool {
        let Some(fast) = self.fast() else {
            return true;
        };
        let mut ids = Vec::new();
        if fast
            .encode(text, &mut PieceCache::default(), &mut ids)
            .is_err()
        {
            return true;
        }
        let theirs = guarded("HfTokenizer::from_file", || self.inner.encode(text, false));
        matches!(theirs, Ok(Ok(enc)) if enc.get_ids() == ids.as_slice())
    }

    /// The crate's ids of `text`.
    fn crate_encode(&self, op: &'static str, text: &str) -> Result<Vec<i64>> {
        let enc = guarded(op, || self.inner.encode(text, false))?.map_err(|e| {
            Error::value(op, "text", "text the tokenizer can encode", e.to_string())
        })?;
        Ok(enc.get_ids().iter().map(|&i| i64::from(i)).collect())
    }

    fn token_id(&self, op: &'static str, token: &str) -> Result<i64> {
        let id = guarded(op, || self.inner.token_to_id(token))?;
        id.map(i64::from).ok_or_else(|| {
            Error::value(
                op,
                "token",
                "a token of the vocabulary",
                format!("{token:?}"),
            )
        })
    }

    /// Sets the EOS token by its string.
    pub fn with_eos_token(mut self, token: &str) -> Result<Self> {
        self.eos = Some(self.token_id("HfTokenizer::with_eos_token", token)?);
        Ok(self)
    }

    /// Sets the pad token by its string.
    pub fn with_pad_token(mut self, token: &str) -> Result<Self> {
        self.pad = Some(self.token_id("HfTokenizer::with_pad_token", token)?);
        Ok(self)
    }

    /// Sets the BOS token by its string.
    pub fn with_bos_token(mut self, token: &str) -> Result<Self> {
        self.bos = Some(self.token_id("HfTokenizer::with_bos_token", token)?);
        Ok(self)
    }

    /// The wrapped `tokenizers` tokenizer.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }
}

impl TextTokenizer for HfTokenizer {
    fn encode(&self, text: &str) -> Result<Vec<i64>> {
        let op = "HfTokenizer::encode";
        if let Some(fast) = self.fast() {
            let mut ids = Vec::with_capacity(text.len() / 3 + 1);
            if fast
                .encode(text, &mut PieceCache::default(), &mut ids)
                .is_ok()
            {
                return Ok(ids.into_iter().map(i64::from).collect());
            }
        }
        self.crate_encode(op, text)
    }

    fn encode_many(&self, texts: &[&str]) -> Result<Vec<Vec<i64>>> {
        let op = "HfTokenizer::encode_many";
        let Some(fast) = self.fast() else {
            let encs =
                guarded(op, || self.inner.encode_batch(texts.to_vec(), false))?.map_err(|e| {
                    Error::value(op, "texts", "texts the tokenizer can encode", e.to_string())
                })?;
            return Ok(encs
                .iter()
                .map(|e| e.get_ids().iter().map(|&i| i64::from(i)).collect())
                .collect());
        };
        // contiguous shares over the cores, each worker with its own piece cache
        let workers = encode_workers(texts.len());
        let share = texts.len().div_ceil(workers.max(1)).max(1);
        let encode_share = |share: &[&str]| -> Result<Vec<Vec<i64>>> {
            let mut cache = PieceCache::default();
            let mut ids = Vec::new();
            share
                .iter()
                .map(|text| {
                    ids.clear();
                    match fast.encode(text, &mut cache, &mut ids) {
                        Ok(()) => Ok(ids.iter().map(|&i| i64::from(i)).collect()),
                        Err(_) => self.crate_encode(op, text),
                    }
                })
                .collect()
        };
        let shares: Vec<Result<Vec<Vec<i64>>>> = if workers <= 1 {
            vec![encode_share(texts)]
        } else {
            std::thread::scope(|scope| {
                let handles: Vec<_> = texts
                    .chunks(share)
                    .map(|chunk| scope.spawn(move || encode_share(chunk)))
                    .collect();
                handles
                    .into_iter()
                    .map(|h| {
                        h.join().unwrap_or_else(|_| {
                            Err(Error::invalid(op, "a tokenizing thread panicked"))
                        })
                    })
                    .collect()
            })
        };
        let mut out = Vec::with_capacity(texts.len());
        for share in shares {
            out.extend(share?);
        }
        Ok(out)
    }

    fn encode_with_offsets(&self, text: &str) -> Result<IdsWithOffsets> {
        let op = "HfTokenizer::encode_with_offsets";
        let enc = guarded(op, || self.inner.encode(text, false))?.map_err(|e| {
            Error::value(op, "text", "text the tokenizer can encode", e.to_string())
        })?;
        let ids = enc.get_ids().iter().map(|&i| i64::from(i)).collect();
        // byte offsets into `text`, clamped so that a tokenizer's odd offsets cannot index
        // outside it
        let offsets = enc
            .get_offsets()
            .iter()
            .map(|&(s, e)| (s.min(text.len()), e.min(text.len()).max(s.min(text.len()))))
            .collect();
        Ok((ids, offsets))
    }

    fn decode(&self, ids: &[i64], special: SpecialTokens) -> Result<String> {
        let op = "HfTokenizer::decode";
        check_ids(op, ids, self.vocab_size())?;
        let ids: Vec<u32> = ids.iter().filter_map(|&i| u32::try_from(i).ok()).collect();
        guarded(op, || {
            // an id below the vocabulary size that the file does not define (a gap)
            if let Some(gap) = ids.iter().find(|&&i| self.inner.id_to_token(i).is_none()) {
                return Err(Error::value(
                    op,
                    "ids",
                    "ids the tokenizer defines",
                    format!("id {gap}, which the vocabulary skips"),
                ));
            }
            self.inner
                .decode(&ids, special == SpecialTokens::Skip)
                .map_err(|e| Error::value(op, "ids", "ids the tokenizer can decode", e.to_string()))
        })?
    }

    fn vocab_size(&self) -> i64 {
        self.vocab_size
    }
    fn eos_token_id(&self) -> Option<i64> {
        self.eos
    }
    fn pad_token_id(&self) -> Option<i64> {
        self.pad
    }
    fn bos_token_id(&self) -> Option<i64> {
        self.bos
    }
}
