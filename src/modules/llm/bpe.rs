//! A lean encoder for byte-level BPE `tokenizer.json` files (GPT-2, Llama 3, Qwen2 / 2.5 / 3,
//! DeepSeek and most recent checkpoints), used by [`HfTokenizer`](super::HfTokenizer) in place of
//! the `tokenizers` crate's `encode` where the file's pipeline is one it reproduces exactly.
//!
//! Why it exists (measured, `docs/performance.md`, "Reading and templating data (W23)"): 93 % of
//! the time of tokenizing 100k chat conversations went to the crate's `encode`, 45 % of all
//! cycles to `malloc` / `free` inside it. The crate keeps, for every piece of every text, a
//! `NormalizedString` with per-byte alignments, an `Encoding` with offsets, type ids, words and
//! masks; ids are all we need there. This encoder runs the same steps on borrowed slices:
//!
//! 1. the added tokens whose `normalized` is false are split off the raw text (leftmost-longest,
//!    as the crate's Aho-Corasick matcher);
//! 2. each remaining segment is normalized (no normalizer, or NFC: text already in NFC, which
//!    NFC leaves as it is; other text goes to the crate) and the `normalized` added tokens are
//!    split off;
//! 3. the pre-tokenizer: `Split` steps with a regex (`Isolated`, not inverted) and the
//!    `ByteLevel` step (its optional prefix space and GPT-2's regex) cut each segment into
//!    pieces, with the same `fancy-regex` engine and patterns as the crate;
//! 4. each piece's bytes are merged by BPE rank (the lowest rank first, the leftmost on ties: the
//!    crate's priority queue), with `ignore_merges` honoured, and cached per worker.
//!
//! A file it does not reproduce (another model, normalizer or pre-tokenizer, dropout, byte
//! fallback, `lstrip` / `rstrip` / `single_word` added tokens, truncation or padding in the file)
//! is encoded by the crate alone. A loaded encoder is checked against the crate on a probe text
//! before it is used, and a regex error (a backtracking limit) on any text sends that text to
//! the crate: the ids are always the crate's.

use std::borrow::Cow;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};
use fancy_regex::Regex;
use rustc_hash::FxHashMap;
use serde_json::Value;
use unicode_normalization_alignments::is_nfc;

use super::pretokenize::{Scanner, GPT2};

/// A pre-tokenizer split: a hand-written scanner for the known patterns, else the regex.
#[derive(Debug)]
enum Splitter {
    Scan(Scanner),
    Regex(Regex),
}

impl Splitter {
    fn new(pattern: &str) -> Result<Self, String> {
        Ok(match Scanner::for_pattern(pattern) {
            Some(scanner) => Splitter::Scan(scanner),
            None => Splitter::Regex(
                Regex::new(pattern).map_err(|e| format!("the pattern does not compile: {e}"))?,
            ),
        })
    }

    /// Calls `piece` with the matches of `text` and the gaps between them, in order.
    fn split<'t>(
        &self,
        text: &'t str,
        mut piece: impl FnMut(&'t str) -> Result<(), Unsupported>,
    ) -> Result<(), Unsupported> {
        match self {
            Splitter::Scan(scanner) => scanner.split(text, piece),
            Splitter::Regex(re) => {
                let mut prev = 0;
                for m in re.find_iter(text) {
                    let m = m.map_err(|_| Unsupported)?;
                    if let Some(gap) = text.get(prev..m.start()).filter(|g| !g.is_empty()) {
                        piece(gap)?;
                    }
                    piece(m.as_str())?;
                    prev = m.end();
                }
                if let Some(tail) = text.get(prev..).filter(|t| !t.is_empty()) {
                    piece(tail)?;
                }
                Ok(())
            }
        }
    }
}

/// Pieces up to this many bytes are merged by scanning all pairs (faster than a heap for a
/// word); longer ones through a priority queue.
const SCAN_MERGE_MAX: usize = 48;

/// Cached pieces per worker, and the longest piece cached, in bytes.
const CACHE_ENTRIES: usize = 1 << 17;
const CACHE_PIECE_MAX: usize = 64;

/// GPT-2's byte ↔ character map of the `ByteLevel` step: printable bytes stand for themselves,
/// the others are shifted to code points from 256 up.
fn byte_chars() -> [char; 256] {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut out = ['\0'; 256];
    let mut shifted = 0u32;
    for (slot, b) in out.iter_mut().zip(0..=255u8) {
        *slot = if printable(b) {
            char::from(b)
        } else {
            shifted += 1;
            char::from_u32(255 + shifted).unwrap_or('\0')
        };
    }
    out
}

/// One pre-tokenizer step the encoder reproduces.
#[derive(Debug)]
enum Step {
    /// `Split` with a regex, behaviour `Isolated`, not inverted: matches and the gaps between
    /// them become pieces.
    Split(Splitter),
    /// `ByteLevel`: a space before each piece that does not start with one (when
    /// `add_prefix_space`), then GPT-2's split (when `use_regex`).
    ByteLevel {
        prefix_space: bool,
        split: Option<Splitter>,
    },
}

/// Added tokens matched leftmost-longest, with their ids.
#[derive(Debug)]
struct AddedSet {
    matcher: AhoCorasick,
    ids: Vec<u32>,
}

impl AddedSet {
    fn new(tokens: Vec<(String, u32)>) -> Result<Option<Self>, String> {
        if tokens.is_empty() {
            return Ok(None);
        }
        let (contents, ids): (Vec<String>, Vec<u32>) = tokens.into_iter().unzip();
        let matcher = AhoCorasickBuilder::new()
            .match_kind(MatchKind::LeftmostLongest)
            .build(&contents)
            .map_err(|e| format!("the added tokens do not build a matcher: {e}"))?;
        Ok(Some(AddedSet { matcher, ids }))
    }
}

/// Why a text must go to the `tokenizers` crate instead.
#[derive(Debug)]
pub(crate) struct Unsupported;

/// The byte-level BPE encoder of one `tokenizer.json` (see the module docs).
#[derive(Debug)]
pub(crate) struct ByteLevelBpe {
    /// The id of each byte's one-character token.
    byte_ids: [u32; 256],
    /// `(left id, right id)` → `(rank, merged id)`.
    merges: FxHashMap<(u32, u32), (u32, u32)>,
    /// With `ignore_merges`: the vocabulary by the bytes its tokens stand for.
    whole: Option<FxHashMap<Vec<u8>, u32>>,
    raw_added: Option<AddedSet>,
    normalized_added: Option<AddedSet>,
    nfc: bool,
    steps: Vec<Step>,
}

/// A worker's cache of merged pieces: bytes → a range of `ids`.
#[derive(Default)]
pub(crate) struct PieceCache {
    map: FxHashMap<Box<[u8]>, (u32, u32)>,
    ids: Vec<u32>,
}

fn field<'a>(v: &'a Value, key: &str) -> &'a Value {
    v.get(key).unwrap_or(&Value::Null)
}

fn flag(v: &Value, key: &str, default: bool) -> Result<bool, String> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(other) => Err(format!("{key} is {other}, not a boolean")),
    }
}

/// A string field that must be absent, null or empty.
fn unset(v: &Value, key: &str) -> Result<(), String> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(()),
        Some(Value::String(s)) if s.is_empty() => Ok(()),
        Some(other) => Err(format!("model.{key} is {other}")),
    }
}

fn step(v: &Value) -> Result<Step, String> {
    match field(v, "type").as_str() {
        Some("ByteLevel") => Ok(Step::ByteLevel {
            prefix_space: flag(v, "add_prefix_space", true)?,
            split: if flag(v, "use_regex", true)? {
                Some(Splitter::new(GPT2)?)
            } else {
                None
            },
        }),
        Some("Split") => {
            let pattern = field(field(v, "pattern"), "Regex")
                .as_str()
                .ok_or("a Split pre-tokenizer without a Regex pattern")?;
            if field(v, "behavior").as_str() != Some("Isolated") || flag(v, "invert", false)? {
                return Err("a Split pre-tokenizer other than Isolated, not inverted".into());
            }
            Ok(Step::Split(Splitter::new(pattern)?))
        }
        other => Err(format!("the pre-tokenizer {other:?}")),
    }
}

impl ByteLevelBpe {
    /// The encoder of a parsed `tokenizer.json`, or why it cannot reproduce the file's pipeline.
    /// `added_id` gives the id the crate assigned to an added token's content.
    pub(crate) fn from_json(
        json: &Value,
        added_id: impl Fn(&str) -> Option<u32>,
    ) -> Result<Self, String> {
        for key in ["truncation", "padding"] {
            if !field(json, key).is_null() {
                return Err(format!("{key} is set"));
            }
        }
        let nfc = match field(json, "normalizer") {
            Value::Null => false,
            n if field(n, "type").as_str() == Some("NFC") => true,
            n => return Err(format!("the normalizer {}", field(n, "type"))),
        };
        let pre = field(json, "pre_tokenizer");
        let steps = match field(pre, "type").as_str() {
            Some("Sequence") => field(pre, "pretokenizers")
                .as_array()
                .ok_or("a Sequence pre-tokenizer without pretokenizers")?
                .iter()
                .map(step)
                .collect::<Result<Vec<_>, _>>()?,
            _ => vec![step(pre)?],
        };
        // the bytes must become byte-level characters, once, at the end
        match steps
            .iter()
            .position(|s| matches!(s, Step::ByteLevel { .. }))
        {
            Some(i) if i + 1 == steps.len() => {}
            _ => return Err("the pre-tokenizer does not end with its one ByteLevel step".into()),
        }
        let model = field(json, "model");
        if field(model, "type").as_str() != Some("BPE") {
            return Err(format!("the model {}", field(model, "type")));
        }
        if !matches!(field(model, "dropout"), Value::Null) {
            return Err("BPE dropout".into());
        }
        if flag(model, "byte_fallback", false)? {
            return Err("byte_fallback".into());
        }
        unset(model, "continuing_subword_prefix")?;
        unset(model, "end_of_word_suffix")?;
        let ignore_merges = flag(model, "ignore_merges", false)?;
        let vocab: FxHashMap<&str, u32> = field(model, "vocab")
            .as_object()
            .ok_or("model.vocab is not an object")?
            .iter()
            .map(|(k, v)| {
                let id = v.as_u64().and_then(|i| u32::try_from(i).ok());
                id.map(|id| (k.as_str(), id))
                    .ok_or_else(|| format!("model.vocab[{k:?}] is not an id"))
            })
            .collect::<Result<_, String>>()?;
        let chars = byte_chars();
        let mut byte_ids = [0u32; 256];
        for (b, (c, slot)) in chars.iter().zip(byte_ids.iter_mut()).enumerate() {
            let mut buf = [0u8; 4];
            *slot = *vocab
                .get(&*c.encode_utf8(&mut buf))
                .ok_or_else(|| format!("the byte {b:#04x} ({c:?}) has no token"))?;
        }
        let mut merges = FxHashMap::default();
        let list = field(model, "merges")
            .as_array()
            .ok_or("model.merges is not a list")?;
        for (rank, m) in list.iter().enumerate() {
            let (a, b) = match m {
                Value::String(s) => {
                    let mut parts = s.split(' ');
                    match (parts.next(), parts.next(), parts.next()) {
                        (Some(a), Some(b), None) => (a, b),
                        _ => return Err(format!("model.merges[{rank}] is {s:?}")),
                    }
                }
                Value::Array(pair) => match (pair.first(), pair.get(1), pair.len()) {
                    (Some(Value::String(a)), Some(Value::String(b)), 2) => (a.as_str(), b.as_str()),
                    _ => return Err(format!("model.merges[{rank}] is not a pair")),
                },
                _ => return Err(format!("model.merges[{rank}] is not a merge")),
            };
            let id = |t: &str| {
                vocab
                    .get(t)
                    .copied()
                    .ok_or_else(|| format!("model.merges[{rank}]: {t:?} is not in the vocabulary"))
            };
            let merged = id(&format!("{a}{b}"))?;
            let rank = u32::try_from(rank).map_err(|_| "too many merges")?;
            // a repeated pair keeps its last rank, as the crate's map does
            merges.insert((id(a)?, id(b)?), (rank, merged));
        }
        let whole = ignore_merges.then(|| {
            let mut back = FxHashMap::default();
            for (b, c) in chars.iter().enumerate() {
                back.insert(*c, b as u8);
            }
            vocab
                .iter()
                .filter_map(|(t, &id)| {
                    let bytes: Option<Vec<u8>> = t.chars().map(|c| back.get(&c).copied()).collect();
                    bytes.map(|b| (b, id))
                })
                .collect()
        });
        let (raw_added, normalized_added) = Self::added(json, nfc, added_id)?;
        Ok(ByteLevelBpe {
            byte_ids,
            merges,
            whole,
            raw_added,
            normalized_added,
            nfc,
            steps,
        })
    }

    /// The added tokens, split into those matched on the raw text and those matched after
    /// normalization.
    fn added(
        json: &Value,
        nfc: bool,
        added_id: impl Fn(&str) -> Option<u32>,
    ) -> Result<(Option<AddedSet>, Option<AddedSet>), String> {
        let mut raw = Vec::new();
        let mut normalized = Vec::new();
        let mut seen = std::collections::HashSet::new();
        let list = field(json, "added_tokens").as_array().map(Vec::as_slice);
        for (i, t) in list.unwrap_or(&[]).iter().enumerate() {
            let content = field(t, "content")
                .as_str()
                .ok_or_else(|| format!("added_tokens[{i}] has no content"))?;
            for key in ["single_word", "lstrip", "rstrip"] {
                if flag(t, key, false)? {
                    return Err(format!("added_tokens[{i}].{key}"));
                }
            }
            if content.is_empty() || !seen.insert(content.to_string()) {
                return Err(format!("added_tokens[{i}] is empty or repeated"));
            }
            let id = added_id(content)
                .ok_or_else(|| format!("added_tokens[{i}] has no id in the tokenizer"))?;
            if flag(t, "normalized", true)? {
                if nfc && !is_nfc(content) {
                    return Err(format!("added_tokens[{i}] is normalized and not in NFC"));
                }
                normalized.push((content.to_string(), id));
            } else {
                raw.push((content.to_string(), id));
            }
        }
        Ok((AddedSet::new(raw)?, AddedSet::new(normalized)?))
    }

    /// Appends the ids of `text` to `out`; on [`Unsupported`] `out` is left as it was.
    pub(crate) fn encode(
        &self,
        text: &str,
        cache: &mut PieceCache,
        out: &mut Vec<u32>,
    ) -> Result<(), Unsupported> {
        let start = out.len();
        // a panic (none is known) sends the text to the crate like any other unsupported text
        let done = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.encode_raw(text, cache, out)
        }))
        .unwrap_or(Err(Unsupported));
        if done.is_err() {
            out.truncate(start);
        }
        done
    }

    fn encode_raw(
        &self,
        text: &str,
        cache: &mut PieceCache,
        out: &mut Vec<u32>,
    ) -> Result<(), Unsupported> {
        split_added(self.raw_added.as_ref(), text, out, |segment, out| {
            if self.nfc && !segment.is_ascii() && !is_nfc(segment) {
                // text NFC would change is normalized (and encoded) by the crate
                return Err(Unsupported);
            }
            split_added(
                self.normalized_added.as_ref(),
                segment,
                out,
                |segment, out| self.pre_tokenize(0, Cow::Borrowed(segment), cache, out),
            )
        })
    }

    /// Runs the pre-tokenizer steps from `at` on `piece`, then BPE on what they leave.
    fn pre_tokenize(
        &self,
        at: usize,
        piece: Cow<'_, str>,
        cache: &mut PieceCache,
        out: &mut Vec<u32>,
    ) -> Result<(), Unsupported> {
        if piece.is_empty() {
            return Ok(());
        }
        let Some(step) = self.steps.get(at) else {
            self.bpe(piece.as_bytes(), cache, out);
            return Ok(());
        };
        let (piece, split) = match step {
            Step::Split(re) => (piece, Some(re)),
            Step::ByteLevel {
                prefix_space,
                split,
            } => {
                let piece = if *prefix_space && !piece.starts_with(' ') {
                    Cow::Owned(format!(" {piece}"))
                } else {
                    piece
                };
                (piece, split.as_ref())
            }
        };
        let Some(split) = split else {
            return self.pre_tokenize(at + 1, piece, cache, out);
        };
        split.split(&piece, |p| {
            self.pre_tokenize(at + 1, Cow::Borrowed(p), cache, out)
        })
    }

    /// The id of a byte's one-character token.
    #[inline]
    fn byte_id(&self, b: u8) -> u32 {
        self.byte_ids.get(usize::from(b)).copied().unwrap_or(0)
    }

    /// The BPE ids of one piece's bytes.
    fn bpe(&self, piece: &[u8], cache: &mut PieceCache, out: &mut Vec<u32>) {
        if let [b] = piece {
            out.push(self.byte_id(*b));
            return;
        }
        if let Some(&(s, n)) = cache.map.get(piece) {
            if let Some(ids) = cache.ids.get(s as usize..(s + n) as usize) {
                out.extend_from_slice(ids);
                return;
            }
        }
        let start = out.len();
        match self.whole.as_ref().and_then(|w| w.get(piece)) {
            Some(&id) => out.push(id),
            None if piece.len() <= SCAN_MERGE_MAX => self.merge_scan(piece, out),
            None => self.merge_heap(piece, out),
        }
        if piece.len() <= CACHE_PIECE_MAX && cache.map.len() < CACHE_ENTRIES {
            let merged = out.get(start..).unwrap_or(&[]);
            let s = cache.ids.len() as u32;
            cache.ids.extend_from_slice(merged);
            cache.map.insert(piece.into(), (s, merged.len() as u32));
        }
    }

    /// BPE by scanning every adjacent pair for the lowest rank, leftmost first.
    fn merge_scan(&self, piece: &[u8], out: &mut Vec<u32>) {
        let mut symbols: Vec<u32> = piece.iter().map(|&b| self.byte_id(b)).collect();
        loop {
            let mut best: Option<(u32, usize, u32)> = None;
            for (i, pair) in symbols.windows(2).enumerate() {
                if let [a, b] = *pair {
                    if let Some(&(rank, id)) = self.merges.get(&(a, b)) {
                        if best.is_none_or(|(r, _, _)| rank < r) {
                            best = Some((rank, i, id));
                        }
                    }
                }
            }
            let Some((_, i, id)) = best else { break };
            if let Some(slot) = symbols.get_mut(i) {
                *slot = id;
            }
            symbols.remove(i + 1);
        }
        out.extend_from_slice(&symbols);
    }

    /// BPE through a priority queue of `(rank, position)`, as the crate merges: a popped
    /// entry whose pair no longer stands at its position is skipped.
    fn merge_heap(&self, piece: &[u8], out: &mut Vec<u32>) {
        /// A symbol of the word: its id and its live neighbours (`usize::MAX`: none).
        #[derive(Clone, Copy)]
        struct Sym {
            id: u32,
            prev: usize,
            next: usize,
            alive: bool,
        }
        let n = piece.len();
        let mut syms: Vec<Sym> = piece
            .iter()
            .enumerate()
            .map(|(i, &b)| Sym {
                id: self.byte_id(b),
                prev: i.wrapping_sub(1),
                next: if i + 1 < n { i + 1 } else { usize::MAX },
                alive: true,
            })
            .collect();
        let mut queue = BinaryHeap::new();
        let push = |queue: &mut BinaryHeap<_>, a: u32, b: u32, pos: usize| {
            if let Some(&(rank, merged)) = self.merges.get(&(a, b)) {
                queue.push(Reverse((rank, pos, merged)));
            }
        };
        for (i, pair) in syms.windows(2).enumerate() {
            if let [a, b] = pair {
                push(&mut queue, a.id, b.id, i);
            }
        }
        while let Some(Reverse((_, pos, merged))) = queue.pop() {
            let Some(&left) = syms.get(pos).filter(|s| s.alive) else {
                continue;
            };
            let Some(&right) = syms.get(left.next) else {
                continue;
            };
            if self.merges.get(&(left.id, right.id)).map(|m| m.1) != Some(merged) {
                continue;
            }
            if let Some(r) = syms.get_mut(left.next) {
                r.alive = false;
            }
            if let Some(l) = syms.get_mut(pos) {
                l.id = merged;
                l.next = right.next;
            }
            if let Some(after) = syms.get_mut(right.next) {
                after.prev = pos;
                let after_id = after.id;
                push(&mut queue, merged, after_id, pos);
            }
            if let Some(before) = syms.get(left.prev) {
                push(&mut queue, before.id, merged, left.prev);
            }
        }
        out.extend(syms.iter().filter(|s| s.alive).map(|s| s.id));
    }
}

/// Splits `text` on `added` (leftmost-longest), pushing each added token's id and handing the
/// text between them to `rest`, in order.
fn split_added(
    added: Option<&AddedSet>,
    text: &str,
    out: &mut Vec<u32>,
    mut rest: impl FnMut(&str, &mut Vec<u32>) -> Result<(), Unsupported>,
) -> Result<(), Unsupported> {
    let Some(added) = added else {
        return rest(text, out);
    };
    let mut prev = 0;
    for m in added.matcher.find_iter(text) {
        if let Some(gap) = text.get(prev..m.start()).filter(|g| !g.is_empty()) {
            rest(gap, out)?;
        }
        out.push(*added.ids.get(m.pattern().as_usize()).ok_or(Unsupported)?);
        prev = m.end();
    }
    if let Some(tail) = text.get(prev..).filter(|t| !t.is_empty()) {
        rest(tail, out)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Generator;

    const PIECES: &[&str] = &[
        "the",
        " model",
        "I'm",
        "don't",
        "THEY'RE",
        "1",
        "2024",
        "3.14",
        " ",
        "  ",
        "\t",
        "\n",
        "\r\n",
        "é",
        "東京",
        "😀",
        "(",
        ")",
        "...",
        "<|im_start|>",
        "<|im_end|>",
        "<|im_",
        "ſ",
        "\u{a0}",
        "naïve",
        "straße",
    ];

    fn file(edit: impl Fn(&mut Value)) -> (Value, tokenizers::Tokenizer) {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/specs/tokenizer/qwen2_style/tokenizer.json"
        );
        let mut json: Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        json["normalizer"] = Value::Null;
        edit(&mut json);
        let tok: tokenizers::Tokenizer = json.to_string().parse().unwrap();
        (json, tok)
    }

    /// Every text through the lean path (none sent to the crate), with the crate's ids.
    fn check(edit: impl Fn(&mut Value), seed: u64) {
        let (json, tok) = file(edit);
        let fast = ByteLevelBpe::from_json(&json, |c| tok.token_to_id(c)).unwrap();
        let mut rng = Generator::new(seed);
        let mut cache = PieceCache::default();
        for n in 0..400 {
            let mut text: String = (0..n % 40)
                .map(|_| PIECES[rng.below(PIECES.len() as u64) as usize])
                .collect();
            if n % 50 == 7 {
                text.push_str(&"abcé".repeat(30));
            }
            let mut ours = Vec::new();
            fast.encode(&text, &mut cache, &mut ours)
                .expect("the lean path");
            let theirs = tok.encode(text.as_str(), false).unwrap();
            assert_eq!(ours, theirs.get_ids(), "{text:?}");
        }
    }

    #[test]
    fn lean_path_gives_the_crates_ids() {
        check(|_| {}, 1);
        // NFC: the texts are already in NFC, so none goes to the crate
        check(|j| j["normalizer"] = serde_json::json!({"type": "NFC"}), 5);
        check(|j| j["model"]["ignore_merges"] = Value::Bool(true), 2);
        check(
            |j| j["pre_tokenizer"] = serde_json::json!({"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true}),
            3,
        );
        // an unknown pattern runs on fancy-regex
        check(
            |j| {
                j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] =
                    Value::from(r"\s+|\w+|.")
            },
            4,
        );
    }

    #[test]
    fn heap_and_scan_merges_agree() {
        let (json, tok) = file(|_| {});
        let fast = ByteLevelBpe::from_json(&json, |c| tok.token_to_id(c)).unwrap();
        let mut rng = Generator::new(8);
        let letters = ["a", "b", "c", "é", " ", "th", "e", "in", "東"];
        for n in 2..200 {
            let word: String = (0..n).map(|_| letters[rng.below(9) as usize]).collect();
            let (mut scan, mut heap) = (Vec::new(), Vec::new());
            fast.merge_scan(word.as_bytes(), &mut scan);
            fast.merge_heap(word.as_bytes(), &mut heap);
            assert_eq!(scan, heap, "{word:?}");
        }
    }
}
