//! The flagship's embedded task (used by `examples/rlhf/main.rs`): prompts are short "topics" of
//! three lowercase letters and a colon (`"kqz:"`); responses are lowercase words. The
//! *hidden rule* that the preference labels come from, and that the report measures, is the
//! fraction of vowels (`a e i o u`) in the response. The SFT corpus is rule-blind (letters
//! drawn uniformly), so a model fine-tuned on it scores about 5/26 ≈ 0.19; RLHF has to learn
//! the rule from preference pairs alone. The corpus draws from [`Generator`], not from
//! libtorch's RNG.

use torchrl::Generator;

/// A uniform integer in `[lo, hi)`.
fn range(rng: &mut Generator, lo: usize, hi: usize) -> usize {
    lo + rng.below((hi - lo) as u64) as usize
}

/// A uniform lowercase letter.
fn letter(rng: &mut Generator) -> char {
    (b'a' + range(rng, 0, 26) as u8) as char
}

/// The hidden rule: the fraction of vowels among the response's letters (0 for a response
/// without letters).
pub fn hidden_score(response: &str) -> f64 {
    let letters: Vec<char> = response.chars().filter(char::is_ascii_lowercase).collect();
    if letters.is_empty() {
        return 0.0;
    }
    let vowels = letters.iter().filter(|c| "aeiou".contains(**c)).count();
    vowels as f64 / letters.len() as f64
}

/// A prompt: three letters and a colon.
pub fn prompt(rng: &mut Generator) -> String {
    let mut s: String = (0..3).map(|_| letter(rng)).collect();
    s.push(':');
    s
}

/// A rule-blind response: a word of `min..=max` uniform letters.
pub fn response(rng: &mut Generator, min: usize, max: usize) -> String {
    let n = range(rng, min, max + 1);
    (0..n).map(|_| letter(rng)).collect()
}

/// `n` distinct-seeded prompts.
pub fn prompts(rng: &mut Generator, n: usize) -> Vec<String> {
    (0..n).map(|_| prompt(rng)).collect()
}

/// A preference pair of two rule-blind responses to one prompt, ordered by the hidden rule
/// (`(prompt, chosen, rejected)`); ties are redrawn.
pub fn preference(rng: &mut Generator, min: usize, max: usize) -> (String, String, String) {
    let p = prompt(rng);
    loop {
        let a = response(rng, min, max);
        let b = response(rng, min, max);
        let (sa, sb) = (hidden_score(&a), hidden_score(&b));
        if sa > sb {
            return (p, a, b);
        }
        if sb > sa {
            return (p, b, a);
        }
    }
}
