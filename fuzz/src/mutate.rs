//! The case generator: a seeded PRNG and the mutations (bytes, JSON values, TOML through JSON,
//! safetensors headers). Everything is a function of the case's seed, so a case re-runs alone
//! from its number.

use serde_json::{Map, Number, Value, json};

/// SplitMix64: small, fast, and every seed (0 included) gives a full-period stream.
pub struct Rng(u64);

impl Rng {
    /// The stream of case `index` of `target` under the campaign `seed`.
    pub fn for_case(seed: u64, target: &str, index: u64) -> Self {
        let mut h = 0xcbf2_9ce4_8422_2325u64; // FNV-1a of the target name
        for b in target.bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        let mut r = Rng(seed ^ h.rotate_left(17) ^ index.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        r.next();
        r
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64 * 1.0 < p
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// Integers at the edges of the types sizes are read into.
pub const EDGE_INTS: &[i64] = &[
    i64::MIN,
    i64::MIN + 1,
    -(1 << 40),
    -(1 << 31),
    -65536,
    -2,
    -1,
    0,
    1,
    2,
    3,
    7,
    8,
    63,
    64,
    255,
    256,
    1023,
    1024,
    65535,
    1 << 20,
    1 << 24,
    (1 << 24) + 1,
    1 << 26,
    i32::MAX as i64,
    1 << 31,
    1 << 32,
    1 << 40,
    1 << 53,
    (1 << 53) + 1,
    1 << 62,
    i64::MAX - 1,
    i64::MAX,
];

/// Floats at the edges.
pub const EDGE_FLOATS: &[f64] = &[
    0.0,
    -0.0,
    5e-324,
    1e-300,
    1e-45,
    1e-8,
    0.5,
    0.999_999_999,
    1.0,
    1.000_000_001,
    -1.0,
    -0.5,
    2.0,
    3.4e38,
    3.5e38,
    1e300,
    f64::MAX,
    -f64::MAX,
    9.007_199_254_740_993e15,
];

/// A value of any JSON type at an edge.
pub fn extreme_value(rng: &mut Rng) -> Value {
    match rng.below(12) {
        0..=3 => json!(*rng.pick(EDGE_INTS)),
        4 => json!(u64::MAX),
        5..=6 => Number::from_f64(*rng.pick(EDGE_FLOATS)).map_or(Value::Null, Value::Number),
        7 => Value::Null,
        8 => json!(rng.chance(0.5)),
        9 => Value::String(
            rng.pick(&[
                "",
                "x",
                "NaN",
                "inf",
                "-1",
                "1e400",
                "\u{0}",
                "é漢🙂",
                "gpt2",
                "llama",
                "qwen3",
                "linear",
                "dynamic",
                "yarn",
                "llama3",
                "float16",
                "bfloat16",
                "gelu_new",
                "silu",
                "BPE",
                "Unigram",
                "WordPiece",
                "ByteLevel",
            ])
            .to_string(),
        ),
        10 => {
            let n = *rng.pick(&[0usize, 1, 2, 5, 300, 5000]);
            Value::String("a".repeat(n))
        }
        _ => {
            if rng.chance(0.5) {
                let n = rng.below(4);
                Value::Array((0..n).map(|_| json!(*rng.pick(EDGE_INTS))).collect())
            } else {
                let mut m = Map::new();
                m.insert(
                    "rope_type".into(),
                    json!(*rng.pick(&["linear", "dynamic", "yarn", "llama3", "x"])),
                );
                m.insert("factor".into(), extreme_number(rng));
                Value::Object(m)
            }
        }
    }
}

fn extreme_number(rng: &mut Rng) -> Value {
    if rng.chance(0.5) {
        json!(*rng.pick(EDGE_INTS))
    } else {
        Number::from_f64(*rng.pick(EDGE_FLOATS)).map_or(Value::Null, Value::Number)
    }
}

/// Every path to a node of `v` (the root included).
fn paths(v: &Value, prefix: &mut Vec<PathSeg>, out: &mut Vec<Vec<PathSeg>>) {
    out.push(prefix.clone());
    if out.len() > 20_000 {
        return;
    }
    match v {
        Value::Object(m) => {
            for (k, c) in m {
                prefix.push(PathSeg::Key(k.clone()));
                paths(c, prefix, out);
                prefix.pop();
            }
        }
        Value::Array(a) => {
            for (i, c) in a.iter().enumerate() {
                prefix.push(PathSeg::Index(i));
                paths(c, prefix, out);
                prefix.pop();
            }
        }
        _ => {}
    }
}

#[derive(Clone)]
enum PathSeg {
    Key(String),
    Index(usize),
}

fn node_mut<'a>(v: &'a mut Value, path: &[PathSeg]) -> Option<&'a mut Value> {
    let mut cur = v;
    for seg in path {
        cur = match (seg, cur) {
            (PathSeg::Key(k), Value::Object(m)) => m.get_mut(k)?,
            (PathSeg::Index(i), Value::Array(a)) => a.get_mut(*i)?,
            _ => return None,
        };
    }
    Some(cur)
}

fn node<'a>(v: &'a Value, path: &[PathSeg]) -> Option<&'a Value> {
    let mut cur = v;
    for seg in path {
        cur = match (seg, cur) {
            (PathSeg::Key(k), Value::Object(m)) => m.get(k)?,
            (PathSeg::Index(i), Value::Array(a)) => a.get(*i)?,
            _ => return None,
        };
    }
    Some(cur)
}

/// One to three structural edits of `v`: a node replaced by an extreme value, a number nudged
/// (±1, ×2, negated, as a float), a key removed or added, an array element removed or
/// repeated, a node swapped with another's value.
pub fn mutate_json(rng: &mut Rng, v: &Value) -> Value {
    let mut out = v.clone();
    for _ in 0..1 + rng.below(3) {
        let mut all = Vec::new();
        paths(&out, &mut Vec::new(), &mut all);
        // leaves are where the interesting values are: prefer them
        let path = if rng.chance(0.8) {
            let leaves: Vec<&Vec<PathSeg>> = all
                .iter()
                .filter(|p| node(&out, p).is_some_and(|n| !n.is_object() && !n.is_array()))
                .collect();
            if leaves.is_empty() {
                rng.pick(&all).clone()
            } else {
                (*rng.pick(&leaves)).clone()
            }
        } else {
            rng.pick(&all).clone()
        };
        let donor_path: &Vec<PathSeg> = rng.pick(&all);
        let donor = node(&out, donor_path).cloned().unwrap_or(Value::Null);
        let op = rng.below(9);
        let Some(target) = node_mut(&mut out, &path) else {
            continue;
        };
        match op {
            0..=2 => *target = extreme_value(rng),
            3 => {
                if let Some(i) = target.as_i64() {
                    let choices = [
                        i.wrapping_add(1),
                        i.wrapping_sub(1),
                        i.wrapping_mul(2),
                        i.wrapping_neg(),
                        i.wrapping_mul(1 << 20),
                        0,
                    ];
                    *target = json!(*rng.pick(&choices));
                } else if let Some(f) = target.as_f64() {
                    let choices = [f * 2.0, -f, f / 3.0, f * 1e300, 0.0, f + 1.0];
                    *target =
                        Number::from_f64(*rng.pick(&choices)).map_or(Value::Null, Value::Number);
                } else {
                    *target = extreme_value(rng);
                }
            }
            4 => {
                // remove from the parent
                if let Some((last, parent)) = path.split_last() {
                    if let Some(p) = node_mut(&mut out, parent) {
                        match (last, p) {
                            (PathSeg::Key(k), Value::Object(m)) => {
                                m.remove(k);
                            }
                            (PathSeg::Index(i), Value::Array(a)) if *i < a.len() => {
                                a.remove(*i);
                            }
                            _ => {}
                        }
                    }
                }
            }
            5 => match target {
                Value::Object(m) => {
                    let key = rng
                        .pick(&[
                            "extra",
                            "n_layer",
                            "num_hidden_layers",
                            "vocab_size",
                            "model_type",
                            "rope_scaling",
                            "head_dim",
                            "eos_token_id",
                            "pad_token_id",
                            "dtype",
                            "shape",
                            "data_offsets",
                            "__metadata__",
                            "type",
                            "unk_token",
                            "byte_fallback",
                        ])
                        .to_string();
                    m.insert(key, extreme_value(rng));
                }
                Value::Array(a) if !a.is_empty() => {
                    let i = rng.below(a.len());
                    let item = a[i].clone();
                    let times = *rng.pick(&[1usize, 2, 50, 2000]);
                    for _ in 0..times {
                        a.push(item.clone());
                    }
                }
                _ => *target = extreme_value(rng),
            },
            6 => *target = donor,
            7 => {
                let inner = target.clone();
                *target = if rng.chance(0.5) {
                    Value::Array(vec![inner])
                } else {
                    json!({ "x": inner })
                };
            }
            _ => {
                if let Value::String(s) = target {
                    let n = *rng.pick(&[0usize, 1, 64, 1025, 70_000]);
                    *s = match rng.below(3) {
                        0 => s.repeat(n.min(64).max(1)),
                        1 => "(".repeat(n.min(200)),
                        _ => "a".repeat(n),
                    };
                } else {
                    *target = extreme_value(rng);
                }
            }
        }
    }
    out
}

/// One to four byte-level edits: bit flips, interesting bytes, truncation, range deletes,
/// inserts and duplicates, an 8-byte little-endian edge integer, a digit run rewritten.
pub fn mutate_bytes(rng: &mut Rng, data: &[u8]) -> Vec<u8> {
    let mut out = data.to_vec();
    for _ in 0..1 + rng.below(4) {
        let n = out.len();
        match rng.below(9) {
            0 if n > 0 => {
                let i = rng.below(n);
                out[i] ^= 1 << rng.below(8);
            }
            1 if n > 0 => {
                let i = rng.below(n);
                out[i] = *rng.pick(&[
                    0u8, 0xff, 0x7f, 0x80, b'"', b'{', b'}', b'[', b'9', b'-', b',', b'\\',
                ]);
            }
            2 => {
                let keep = if rng.chance(0.5) {
                    rng.below(n + 1)
                } else {
                    n.saturating_sub(1 + rng.below(16))
                };
                out.truncate(keep);
            }
            3 if n > 0 => {
                let a = rng.below(n);
                let len = 1 + rng.below((n - a).min(64));
                out.drain(a..a + len);
            }
            4 => {
                let at = rng.below(n + 1);
                let len = 1 + rng.below(32);
                let bytes: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
                out.splice(at..at, bytes);
            }
            5 if n > 0 => {
                let a = rng.below(n);
                let len = 1 + rng.below((n - a).min(256));
                let chunk = out[a..a + len].to_vec();
                let at = rng.below(n + 1);
                out.splice(at..at, chunk);
            }
            6 if n >= 8 => {
                let at = rng.below(n - 7);
                let v = *rng.pick(EDGE_INTS) as u64;
                out[at..at + 8].copy_from_slice(&v.to_le_bytes());
            }
            7 => {
                // rewrite a run of ASCII digits (sizes, offsets, ids in JSON text)
                let starts: Vec<usize> = (0..n)
                    .filter(|&i| {
                        out[i].is_ascii_digit() && (i == 0 || !out[i - 1].is_ascii_digit())
                    })
                    .collect();
                if !starts.is_empty() {
                    let s = *rng.pick(&starts);
                    let e = (s..n).find(|&i| !out[i].is_ascii_digit()).unwrap_or(n);
                    let repl = rng
                        .pick(&[
                            "0",
                            "1",
                            "-1",
                            "9999999999",
                            "18446744073709551615",
                            "1e400",
                            "999999999999999999999",
                            "2",
                        ])
                        .as_bytes()
                        .to_vec();
                    out.splice(s..e, repl);
                }
            }
            _ => {
                if n >= 2 {
                    let a = rng.below(n);
                    let b = rng.below(n);
                    out.swap(a, b);
                }
            }
        }
    }
    out
}

/// A safetensors file with its JSON header mutated structurally (the length prefix rewritten
/// to fit, or left stale one time in eight); `None` when `data` has no readable header.
pub fn mutate_safetensors_header(rng: &mut Rng, data: &[u8]) -> Option<Vec<u8>> {
    let len = u64::from_le_bytes(data.get(..8)?.try_into().ok()?) as usize;
    let header: Value = serde_json::from_slice(data.get(8..8usize.checked_add(len)?)?).ok()?;
    let mutated = mutate_json(rng, &header);
    let text = serde_json::to_vec(&mutated).ok()?;
    let stale = rng.below(8) == 0;
    let new_len = if stale { len as u64 } else { text.len() as u64 };
    let mut out = new_len.to_le_bytes().to_vec();
    out.extend_from_slice(&text);
    out.extend_from_slice(&data[8 + len..]);
    Some(out)
}

/// A mutated JSON text of `text`: structural edits (three times in four) or byte edits.
pub fn mutate_json_text(rng: &mut Rng, text: &[u8]) -> Vec<u8> {
    if rng.below(4) != 0 {
        if let Ok(v) = serde_json::from_slice::<Value>(text) {
            let m = mutate_json(rng, &v);
            let mut out = serde_json::to_vec_pretty(&m).unwrap_or_default();
            if rng.below(10) == 0 {
                out = mutate_bytes(rng, &out);
            }
            return out;
        }
    }
    mutate_bytes(rng, text)
}

/// A mutated TOML text: the document as JSON, edited structurally and written back as TOML
/// (when TOML can hold the result), else byte edits.
pub fn mutate_toml_text(rng: &mut Rng, text: &str) -> Vec<u8> {
    if rng.below(4) != 0 {
        if let Ok(table) = toml::from_str::<toml::Table>(text) {
            if let Ok(v) = serde_json::to_value(&table) {
                let m = mutate_json(rng, &v);
                if let Ok(t) = toml::to_string(&m) {
                    return t.into_bytes();
                }
            }
        }
    }
    mutate_bytes(rng, text.as_bytes())
}
