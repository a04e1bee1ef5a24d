//! Hand-written scanners for the three pre-tokenizer patterns nearly every byte-level BPE
//! checkpoint uses (GPT-2's, Qwen2's and Llama 3's), giving the pieces `fancy-regex` finds with
//! those patterns (the engine the `tokenizers` crate runs them on) without its backtracking VM:
//! in the W23 profile that VM and its allocations were a third of the lean encoder's time.
//! The character classes `\p{L}`, `\p{N}` and `\s` are read from `regex-syntax`, the tables the
//! regex engines use. The unit tests check every scanner against `fancy-regex` on random text.

use std::sync::OnceLock;

use regex_syntax::hir::{Class, HirKind};

/// GPT-2's pattern: the `ByteLevel` pre-tokenizer's split when `use_regex` is true.
pub(crate) const GPT2: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
/// Qwen2's (and Qwen2.5's, Qwen3's) `Split` pattern.
pub(crate) const QWEN2: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Llama 3's `Split` pattern: Qwen2's with digits in groups of up to three.
pub(crate) const LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// A known pattern's scanner.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Scanner {
    Gpt2,
    /// Qwen2's family, with the longest digit group (1 for Qwen2, 3 for Llama 3).
    Qwen2 {
        digits: usize,
    },
}

impl Scanner {
    /// The scanner of `pattern`, where it is one of the known ones (byte for byte).
    pub(crate) fn for_pattern(pattern: &str) -> Option<Self> {
        match pattern {
            GPT2 => Some(Scanner::Gpt2),
            QWEN2 => Some(Scanner::Qwen2 { digits: 1 }),
            LLAMA3 => Some(Scanner::Qwen2 { digits: 3 }),
            _ => None,
        }
    }

    /// Calls `piece` with each piece of `text`, in order; the pieces cover `text`.
    pub(crate) fn split<'t, E>(
        self,
        text: &'t str,
        mut piece: impl FnMut(&'t str) -> Result<(), E>,
    ) -> Result<(), E> {
        let classes = classes();
        let mut at = 0;
        while at < text.len() {
            let end = match self {
                Scanner::Gpt2 => gpt2_end(classes, text, at),
                Scanner::Qwen2 { digits } => qwen2_end(classes, text, at, digits),
            };
            piece(&text[at..end])?;
            at = end;
        }
        Ok(())
    }
}

/// What a character is to these patterns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Letter,
    Number,
    Space,
    Other,
}

/// `\p{L}`, `\p{N}` and `\s` as sorted ranges, and a table for ASCII.
struct Classes {
    letter: Vec<(char, char)>,
    number: Vec<(char, char)>,
    space: Vec<(char, char)>,
    ascii: [Kind; 128],
}

fn ranges(pattern: &str) -> Vec<(char, char)> {
    let hir = regex_syntax::Parser::new().parse(pattern);
    match hir.as_ref().map(|h| h.kind()) {
        Ok(HirKind::Class(Class::Unicode(class))) => class
            .ranges()
            .iter()
            .map(|r| (r.start(), r.end()))
            .collect(),
        // the three classes always parse to Unicode classes; an empty table only sends every
        // non-ASCII character to `Other`, which the tests would catch
        _ => Vec::new(),
    }
}

fn classes() -> &'static Classes {
    static CLASSES: OnceLock<Classes> = OnceLock::new();
    CLASSES.get_or_init(|| {
        let mut c = Classes {
            letter: ranges(r"\p{L}"),
            number: ranges(r"\p{N}"),
            space: ranges(r"\s"),
            ascii: [Kind::Other; 128],
        };
        let mut ascii = [Kind::Other; 128];
        for (slot, b) in ascii.iter_mut().zip(0..128u8) {
            *slot = c.lookup(char::from(b));
        }
        c.ascii = ascii;
        c
    })
}

fn within(table: &[(char, char)], c: char) -> bool {
    table
        .binary_search_by(|&(lo, hi)| {
            if hi < c {
                std::cmp::Ordering::Less
            } else if lo > c {
                std::cmp::Ordering::Greater
            } else {
                std::cmp::Ordering::Equal
            }
        })
        .is_ok()
}

impl Classes {
    fn lookup(&self, c: char) -> Kind {
        if within(&self.letter, c) {
            Kind::Letter
        } else if within(&self.number, c) {
            Kind::Number
        } else if within(&self.space, c) {
            Kind::Space
        } else {
            Kind::Other
        }
    }

    #[inline]
    fn kind(&self, c: char) -> Kind {
        match self.ascii.get(c as usize) {
            Some(k) => *k,
            None => self.lookup(c),
        }
    }
}

/// The character at byte `at` of `text` (a char boundary below its length).
#[inline]
fn char_at(text: &str, at: usize) -> Option<char> {
    text[at..].chars().next()
}

/// The end of the run of characters of kind `kind` from `at`.
#[inline]
fn run_end(c: &Classes, text: &str, mut at: usize, kind: Kind) -> usize {
    for ch in text[at..].chars() {
        if c.kind(ch) != kind {
            break;
        }
        at += ch.len_utf8();
    }
    at
}

/// The end of the run of `\r` / `\n` from `at`.
fn newlines_end(text: &str, at: usize) -> usize {
    at + text
        .as_bytes()
        .get(at..)
        .unwrap_or(&[])
        .iter()
        .take_while(|b| matches!(b, b'\r' | b'\n'))
        .count()
}

/// `\s+(?!\S)|\s+` at a whitespace character: the whole run when it ends the text or is one
/// character, else the run without its last character.
fn spaces_end(c: &Classes, text: &str, at: usize) -> usize {
    let end = run_end(c, text, at, Kind::Space);
    if end == text.len() {
        return end;
    }
    let last = text[at..end].chars().next_back().map_or(0, char::len_utf8);
    if end - last > at {
        end - last
    } else {
        end
    }
}

/// GPT-2: `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`.
fn gpt2_end(c: &Classes, text: &str, at: usize) -> usize {
    let bytes = text.as_bytes();
    if bytes.get(at) == Some(&b'\'') {
        let rest = bytes.get(at + 1..).unwrap_or(&[]);
        for tail in [&b"s"[..], b"t", b"re", b"ve", b"m", b"ll", b"d"] {
            if rest.starts_with(tail) {
                return at + 1 + tail.len();
            }
        }
    }
    let Some(first) = char_at(text, at) else {
        return text.len();
    };
    let kind = c.kind(first);
    if first == ' ' {
        if let Some(next) = char_at(text, at + 1) {
            let next_kind = c.kind(next);
            if next_kind != Kind::Space {
                return run_end(c, text, at + 1, next_kind);
            }
        }
    }
    match kind {
        Kind::Space => spaces_end(c, text, at),
        _ => run_end(c, text, at, kind),
    }
}

/// Qwen2's `'s|'t|'re|'ve|'m|'ll|'d` without case: `s` also matches `ſ` (U+017F), as `(?i)`
/// folds it.
fn qwen2_contraction(text: &str, at: usize) -> Option<usize> {
    let mut chars = text[at..].chars();
    if chars.next() != Some('\'') {
        return None;
    }
    let fold = |ch: Option<char>| {
        ch.map(|c| {
            if c == 'ſ' {
                's'
            } else {
                c.to_ascii_lowercase()
            }
        })
    };
    let a = fold(chars.next())?;
    let one = |c: char| at + 1 + c.len_utf8();
    match a {
        's' | 't' | 'm' | 'd' => {
            let first = text[at + 1..].chars().next()?;
            Some(one(first))
        }
        'r' | 'v' | 'l' => {
            let want = if a == 'l' { 'l' } else { 'e' };
            let b = fold(chars.next())?;
            (b == want).then(|| at + 3)
        }
        _ => None,
    }
}

/// Qwen2: `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,digits}|
/// ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`.
fn qwen2_end(c: &Classes, text: &str, at: usize, digits: usize) -> usize {
    if let Some(end) = qwen2_contraction(text, at) {
        return end;
    }
    let Some(first) = char_at(text, at) else {
        return text.len();
    };
    let kind = c.kind(first);
    let after = at + first.len_utf8();
    let next = char_at(text, after);
    let next_kind = next.map(|n| c.kind(n));
    // [^\r\n\p{L}\p{N}]?\p{L}+
    if kind == Kind::Letter {
        return run_end(c, text, at, Kind::Letter);
    }
    if kind != Kind::Number && first != '\r' && first != '\n' && next_kind == Some(Kind::Letter) {
        return run_end(c, text, after, Kind::Letter);
    }
    // \p{N}{1,digits}
    if kind == Kind::Number {
        let mut end = at;
        for ch in text[at..].chars().take(digits) {
            if c.kind(ch) != Kind::Number {
                break;
            }
            end += ch.len_utf8();
        }
        return end;
    }
    // ' '?[^\s\p{L}\p{N}]+[\r\n]*
    let others_from = if kind == Kind::Other {
        Some(at)
    } else if first == ' ' && next_kind == Some(Kind::Other) {
        Some(after)
    } else {
        None
    };
    if let Some(from) = others_from {
        return newlines_end(text, run_end(c, text, from, Kind::Other));
    }
    // here `first` is whitespace: \s*[\r\n]+ up to the run's last \r or \n
    let end = run_end(c, text, at, Kind::Space);
    if let Some(last_newline) = text[at..end].rfind(['\r', '\n']) {
        return at + last_newline + 1;
    }
    spaces_end(c, text, at)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Generator;

    const PIECES: &[&str] = &[
        "a", "Z", "é", "東", "ж", "ſ", "K", "'", "s", "S", "t", "re", "RE", "Ve", "m", "ll", "LL",
        "d", "D", "1", "²", "٣", "Ⅻ", " ", " ", "  ", "\t", "\n", "\r", "\r\n", "\u{a0}",
        "\u{2028}", "\u{3000}", "\u{200b}", "\u{85}", "\u{b}", "\u{c}", ",", ".", "?", "!", "(",
        "😀", "\u{301}", "_", "-", "\u{0}", "ǅ", "ʰ", "ー",
    ];

    fn reference(re: &fancy_regex::Regex, text: &str) -> Vec<String> {
        let mut out = Vec::new();
        let mut prev = 0;
        for m in re.find_iter(text) {
            let m = m.expect("match");
            if prev < m.start() {
                out.push(text[prev..m.start()].to_string());
            }
            out.push(m.as_str().to_string());
            prev = m.end();
        }
        if prev < text.len() {
            out.push(text[prev..].to_string());
        }
        out
    }

    #[test]
    fn scanners_split_as_fancy_regex() {
        let mut rng = Generator::new(5);
        for (pattern, scanner) in [
            (GPT2, Scanner::Gpt2),
            (QWEN2, Scanner::Qwen2 { digits: 1 }),
            (LLAMA3, Scanner::Qwen2 { digits: 3 }),
        ] {
            assert_eq!(Scanner::for_pattern(pattern), Some(scanner));
            let re = fancy_regex::Regex::new(pattern).expect("pattern");
            for n in 0..3000 {
                let len = n % 24;
                let text: String = (0..len)
                    .map(|_| PIECES[rng.below(PIECES.len() as u64) as usize])
                    .collect();
                let mut ours = Vec::new();
                scanner
                    .split::<()>(&text, |p| {
                        ours.push(p.to_string());
                        Ok(())
                    })
                    .unwrap();
                assert_eq!(ours, reference(&re, &text), "{scanner:?} on {text:?}");
            }
        }
        assert_eq!(Scanner::for_pattern(r"\s+"), None);
    }
}
