//! Rewards without Python (`torchrl::envs::llm::rewards`): TRL's pure-Python rewards replayed
//! from `specs/rewards_cases.json` (recorded by `specs/record_rewards.py` from trl 1.16's
//! `think_format_reward`, `get_soft_overlong_punishment`, `get_repetition_penalty_reward`),
//! and hand-derived cases for the extractions, the answer match, the weighted sums, the
//! external command (success and every failure mode), the scorer adapter through a real
//! `ScoreInput`, and the TOML form.
//!
//! Expected values are derived by hand in the comments next to them.

mod recorded;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{json, Map, Value};
use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};
use torchrl::envs::llm::rewards::{
    build_parts, parse_number, AnswerMatch, CommandReward, Compare, Extraction, FormatCheck,
    RepetitionPenalty, RewardEntry, RewardFunction, RewardPart, RewardSample, RewardScorer,
    RewardSource, RewardsConfig, SoftOverlongPunishment, WeightedSum, THINK_FORMAT,
};
use torchrl::envs::llm::{RewardModelScorer, ScoreInput, Scorer};
use torchrl::modules::llm::{ByteTokenizer, CausalLmWithScoreHead, TextTokenizer};
use torchrl::Error;

const FILE: &str = "rewards_cases.json";
const RECORDER: &str = "record_rewards.py";

fn sample<'a>(completion: &'a str, fields: &'a Map<String, Value>) -> RewardSample<'a> {
    RewardSample {
        prompt: "p",
        completion,
        completion_ids: &[],
        fields,
    }
}

fn row(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        other => panic!("not an object: {other}"),
    }
}

// ------------------------------------------------------------------ recorded (TRL 1.16)

#[test]
fn the_file_records_trl_1_16() {
    let v = recorded::file(FILE, RECORDER);
    assert_eq!(v["generator"], "specs/record_rewards.py");
    assert_eq!(v["versions"]["trl"], "1.16.0");
}

#[test]
fn replay_trl_think_format_reward() {
    let mut f = FormatCheck::think().unwrap();
    assert_eq!(f.name(), "think_format_reward");
    assert_eq!(f.pattern(), THINK_FORMAT);
    let empty = Map::new();
    let cases = recorded::cases(FILE, RECORDER, "think_format");
    assert!(cases.len() >= 15);
    let texts: Vec<&str> = cases
        .iter()
        .map(|c| c["completion"].as_str().unwrap())
        .collect();
    let samples: Vec<RewardSample<'_>> = texts.iter().map(|t| sample(t, &empty)).collect();
    let got = f.score(&samples).unwrap();
    for (c, g) in cases.iter().zip(&got) {
        assert_eq!(*g, recorded::f(&c["score"]), "{:?}", c["completion"]);
    }
    // both outcomes are recorded
    assert!(got.contains(&1.0) && got.contains(&0.0));
}

#[test]
fn replay_trl_soft_overlong_punishment() {
    let empty = Map::new();
    let ids = vec![1_i64; 200];
    for c in recorded::cases(FILE, RECORDER, "soft_overlong") {
        let max = c["max_completion_len"].as_u64().unwrap() as usize;
        let cache = c["soft_punish_cache"].as_u64().unwrap() as usize;
        let mut f = SoftOverlongPunishment::new(max, cache).unwrap();
        assert_eq!(f.name(), "soft_overlong_punishment_reward");
        let lengths: Vec<usize> = c["lengths"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l.as_u64().unwrap() as usize)
            .collect();
        let samples: Vec<RewardSample<'_>> = lengths
            .iter()
            .map(|&n| RewardSample {
                completion_ids: &ids[..n],
                ..sample("", &empty)
            })
            .collect();
        let got = f.score(&samples).unwrap();
        let want: Vec<f64> = c["scores"]
            .as_array()
            .unwrap()
            .iter()
            .map(recorded::f)
            .collect();
        // bit for bit: the same int → float division as Python's
        assert_eq!(got, want, "max {max}, cache {cache}");
    }
}

#[test]
fn replay_trl_repetition_penalty() {
    let empty = Map::new();
    for c in recorded::cases(FILE, RECORDER, "repetition_penalty") {
        let n = c["ngram_size"].as_u64().unwrap() as usize;
        let p = recorded::f(&c["max_penalty"]);
        let mut f = RepetitionPenalty::new(n, p).unwrap();
        let ids: Vec<Vec<i64>> = c["completion_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| {
                l.as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_i64().unwrap())
                    .collect()
            })
            .collect();
        let samples: Vec<RewardSample<'_>> = ids
            .iter()
            .map(|i| RewardSample {
                completion_ids: i,
                ..sample("", &empty)
            })
            .collect();
        let want: Vec<f64> = c["scores"]
            .as_array()
            .unwrap()
            .iter()
            .map(recorded::f)
            .collect();
        assert_eq!(f.score(&samples).unwrap(), want, "n {n}, penalty {p}");
    }
}

#[test]
fn length_rewards_refuse_what_trl_would_misuse() {
    assert!(SoftOverlongPunishment::new(10, 11).is_err());
    assert!(SoftOverlongPunishment::new(0, 0).is_ok());
    assert!(RepetitionPenalty::new(0, -1.0).is_err());
    assert!(RepetitionPenalty::new(2, 0.5).is_err());
    assert!(RepetitionPenalty::new(2, f64::NAN).is_err());
}

// ------------------------------------------------------------------ extraction

fn ex(e: &Extraction, text: &str) -> Option<String> {
    e.extract(text).unwrap()
}

#[test]
fn last_number_extraction() {
    let e = Extraction::LastNumber;
    for (text, want) in [
        ("The answer is 1,234.", Some("1234")),
        ("It is -3.5 degrees", Some("-3.5")),
        ("(-2)", Some("-2")),
        ("5-3", Some("3")),     // a minus between operands is no sign
        ("x-2", Some("2")),     // nor after a letter
        ("a = -7", Some("-7")), // after a space it is a sign
        ("1,234,567.89 total", Some("1234567.89")),
        ("12,34", Some("34")),    // not a thousands grouping: two numbers
        ("1,2345", Some("2345")), // idem
        ("3 apples and 4 pears", Some("4")),
        ("v2", Some("2")),
        ("72.", Some("72")),
        ("0.50", Some("0.50")),
        ("no digits here", None),
        ("", None),
    ] {
        assert_eq!(ex(&e, text).as_deref(), want, "{text:?}");
    }
}

#[test]
fn boxed_extraction() {
    let e = Extraction::Boxed;
    for (text, want) in [
        (r"so \boxed{42}.", Some("42")),
        (r"\boxed{\frac{1}{\sqrt{2}}}", Some(r"\frac{1}{\sqrt{2}}")),
        (r"\boxed{1} then \boxed{ 2 }", Some("2")), // the last, trimmed
        (r"\boxed{1} then \boxed{2", Some("1")),    // the last is unbalanced: the one before
        (r"\boxed{}", None),
        (r"\boxed{{}", None),
        ("no box", None),
        (r"\boxed{é{漢}}", Some("é{漢}")),
    ] {
        assert_eq!(ex(&e, text).as_deref(), want, "{text:?}");
    }
}

#[test]
fn marker_and_trimmed_extraction() {
    let gsm = Extraction::After("####".into());
    assert_eq!(ex(&gsm, "48/2 = 24\n#### 72").as_deref(), Some("72"));
    assert_eq!(ex(&gsm, "#### 1 #### 2 ").as_deref(), Some("2")); // the last marker
    assert_eq!(ex(&gsm, "ends with ####   "), None);
    assert_eq!(ex(&gsm, "no marker"), None);
    assert_eq!(
        ex(&Extraction::Trimmed, "  Paris \n").as_deref(),
        Some("Paris")
    );
    assert_eq!(ex(&Extraction::Trimmed, " \n\t"), None);
}

#[test]
fn regex_extraction() {
    let e = Extraction::regex(r"answer: (\w+)").unwrap();
    assert_eq!(ex(&e, "answer: a, answer: b").as_deref(), Some("b")); // the last match
    assert_eq!(ex(&e, "no answer"), None);
    // group 1 that did not take part in the last match: the last match where it did
    let e = Extraction::regex(r"x=(\d)|y").unwrap();
    assert_eq!(ex(&e, "x=1 y").as_deref(), Some("1"));
    assert_eq!(ex(&e, "y y"), None);
    // look-around works (fancy-regex)
    let e = Extraction::regex(r"(\d+)(?= apples)").unwrap();
    assert_eq!(ex(&e, "3 pears, 5 apples").as_deref(), Some("5"));
    // no group, bad pattern
    let err = Extraction::regex(r"\d+").unwrap_err().to_string();
    assert!(err.contains("capture group"), "{err}");
    let err = Extraction::regex("(").unwrap_err().to_string();
    assert!(err.contains("pattern") && err.contains("\"(\""), "{err}");
}

#[test]
fn extraction_strings_round_trip() {
    for s in [
        "trimmed",
        "last_number",
        "boxed",
        "after:####",
        r"regex:is (\d+)",
    ] {
        let e: Extraction = s.parse().unwrap();
        assert_eq!(e.to_string(), s);
    }
    for bad in ["", "last-number", "after:", "regex:", "regex:(", "Boxed"] {
        assert!(bad.parse::<Extraction>().is_err(), "{bad:?}");
    }
}

#[test]
fn numbers_as_answers_write_them() {
    for (text, want) in [
        ("72", Some(72.0)),
        (" -1,234.5 ", Some(-1234.5)),
        ("+3", Some(3.0)),
        (".5", Some(0.5)),
        ("1e3", Some(1000.0)),
        ("2.5E-1", Some(0.25)),
        ("1,23", None),
        ("12,345,67", None),
        ("5.", None),
        ("1/2", None),
        ("inf", None),
        ("NaN", None),
        ("1e999", None),
        ("", None),
        ("-", None),
        ("$5", None),
    ] {
        assert_eq!(parse_number(text), want, "{text:?}");
    }
}

// ------------------------------------------------------------------ answer match

#[test]
fn answer_match_numeric_tolerance() {
    let fields = row(json!({"answer": "3.14159"}));
    let mut f = AnswerMatch::new(
        "answer",
        Extraction::LastNumber,
        Compare::numeric(1e-3).unwrap(),
    );
    // |3.1416 - 3.14159| = 1e-5 <= 1e-3; |3.15 - 3.14159| = 8.4e-3 > 1e-3
    let got = f
        .score(&[
            sample("pi is 3.1416", &fields),
            sample("pi is 3.15", &fields),
            sample("pi is about three", &fields),
        ])
        .unwrap();
    assert_eq!(got, vec![1.0, 0.0, 0.0]);
    // the boundary is inclusive: |10.5 - 10| = 0.5 exactly
    let fields = row(json!({"answer": 10}));
    let mut f = AnswerMatch::new(
        "answer",
        Extraction::LastNumber,
        Compare::numeric(0.5).unwrap(),
    );
    let got = f
        .score(&[
            sample("10.5", &fields),
            sample("10.6", &fields),
            sample("9.5", &fields),
        ])
        .unwrap();
    assert_eq!(got, vec![1.0, 0.0, 1.0]);
    assert!(Compare::numeric(f64::INFINITY).is_err());
}

#[test]
fn answer_match_gsm8k_reference() {
    // GSM8K's answer column: a worked solution ending in "#### N", with thousands separators
    let fields = row(json!({"answer": "She earns 12 * 100 = 1,200 dollars.\n#### 1,200"}));
    let mut f = AnswerMatch::new(
        "answer",
        Extraction::LastNumber,
        Compare::numeric(0.0).unwrap(),
    )
    .with_reference_extraction(Extraction::After("####".into()));
    let got = f
        .score(&[
            sample("So 1200.", &fields),
            sample("So $1,200 in total.", &fields),
            sample("So 120.", &fields),
            sample("I don't know", &fields),
        ])
        .unwrap();
    assert_eq!(got, vec![1.0, 1.0, 0.0, 0.0]);
}

#[test]
fn answer_match_exact_text() {
    let fields = row(json!({"city": " Paris "}));
    let mut f = AnswerMatch::new(
        "city",
        Extraction::regex(r"(?m)^Answer: (.*)$").unwrap(),
        Compare::Exact,
    )
    .with_name("city_match");
    assert_eq!(f.name(), "city_match");
    assert_eq!(f.field(), "city");
    let got = f
        .score(&[
            sample("Thinking...\nAnswer: Paris  ", &fields),
            sample("Answer: paris", &fields),
            sample("Paris", &fields), // no "Answer:" line: 0
        ])
        .unwrap();
    assert_eq!(got, vec![1.0, 0.0, 0.0]);
    // a JSON number is compared as its text
    let fields = row(json!({"answer": 72}));
    let mut f = AnswerMatch::new("answer", Extraction::Trimmed, Compare::Exact);
    assert_eq!(
        f.score(&[sample(" 72 ", &fields), sample("72.0", &fields)])
            .unwrap(),
        vec![1.0, 0.0]
    );
}

#[test]
fn answer_match_errors_name_the_field_and_the_sample() {
    let good = row(json!({"answer": "1"}));
    let other = row(json!({"solution": "1"}));
    let mut f = AnswerMatch::new(
        "answer",
        Extraction::LastNumber,
        Compare::numeric(0.0).unwrap(),
    );
    let err = f
        .score(&[sample("1", &good), sample("1", &other)])
        .unwrap_err();
    assert!(matches!(err, Error::InvalidValue { .. }), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("\"answer\" of sample 1") && msg.contains("solution"),
        "{msg}"
    );
    // neither a string nor a number
    let weird = row(json!({"answer": [1]}));
    let msg = f.score(&[sample("1", &weird)]).unwrap_err().to_string();
    assert!(
        msg.contains("a string or a number") && msg.contains("sample 0"),
        "{msg}"
    );
    // numeric compare on a reference that is no number
    let words = row(json!({"answer": "seven"}));
    let msg = f.score(&[sample("7", &words)]).unwrap_err().to_string();
    assert!(msg.contains("numeric") && msg.contains("seven"), "{msg}");
    // a reference extraction that finds nothing
    let mut g = AnswerMatch::new("answer", Extraction::Trimmed, Compare::Exact)
        .with_reference_extraction(Extraction::After("####".into()));
    let msg = g.score(&[sample("1", &good)]).unwrap_err().to_string();
    assert!(msg.contains("after:####"), "{msg}");
}

// ------------------------------------------------------------------ format

#[test]
fn format_check_matches_in_full() {
    let empty = Map::new();
    let mut f = FormatCheck::new(r"<answer>\d+</answer>").unwrap();
    assert_eq!(f.name(), "format");
    let got = f
        .score(&[
            sample("<answer>12</answer>", &empty),
            sample("x<answer>12</answer>", &empty), // not at the start
            sample("<answer>12</answer>\n", &empty), // not to the end
            sample("<answer></answer>", &empty),
        ])
        .unwrap();
    assert_eq!(got, vec![1.0, 0.0, 0.0, 0.0]);
    // an alternation is matched in full too, not "a prefix or a suffix"
    let mut alt = FormatCheck::new("a|b").unwrap();
    assert_eq!(
        alt.score(&[sample("ab", &empty), sample("b", &empty)])
            .unwrap(),
        vec![0.0, 1.0]
    );
    for bad in ["(", "a)|(b", "[z-a]"] {
        let err = FormatCheck::new(bad).unwrap_err().to_string();
        assert!(err.contains("pattern"), "{bad}: {err}");
    }
}

// ------------------------------------------------------------------ weighted sums

/// Returns the given scores, whatever the samples.
struct Fixed(&'static str, Vec<f64>);

impl RewardFunction for Fixed {
    fn name(&self) -> &str {
        self.0
    }
    fn score(&mut self, _: &[RewardSample<'_>]) -> torchrl::Result<Vec<f64>> {
        Ok(self.1.clone())
    }
}

#[test]
fn weighted_sum_skips_nan_as_trl_nansum() {
    let empty = Map::new();
    let s = [
        sample("a", &empty),
        sample("b", &empty),
        sample("c", &empty),
    ];
    let nan = f64::NAN;
    let mut sum = WeightedSum::new()
        .with(Fixed("acc", vec![1.0, 0.0, nan]), 2.0)
        .unwrap()
        .with(Fixed("len", vec![-0.5, nan, -1.0]), 0.5)
        .unwrap();
    assert_eq!(sum.len(), 2);
    assert!(sum.last_means()[0].1.is_nan()); // before the first batch
                                             // row 0: 2·1 + 0.5·(−0.5) = 1.75; row 1: 2·0 = 0; row 2: 0.5·(−1) = −0.5
    assert_eq!(sum.score(&s).unwrap(), vec![1.75, 0.0, -0.5]);
    // means over the samples each applied to: (1 + 0) / 2, (−0.5 − 1) / 2
    assert_eq!(sum.last_means(), vec![("acc", 0.5), ("len", -0.75)]);
    assert_eq!(sum.name(), "weighted_sum");
}

#[test]
fn weighted_sum_errors() {
    let empty = Map::new();
    let s = [sample("a", &empty), sample("b", &empty)];
    let nan = f64::NAN;
    // a sample no part scored
    let mut sum = WeightedSum::new()
        .with(Fixed("a", vec![1.0, nan]), 1.0)
        .unwrap()
        .with(Fixed("b", vec![nan, nan]), 1.0)
        .unwrap();
    let msg = sum.score(&s).unwrap_err().to_string();
    assert!(
        msg.contains("sample 1") && msg.contains("\"a\", \"b\""),
        "{msg}"
    );
    // the wrong number of scores, an infinite score
    let mut sum = WeightedSum::new()
        .with(Fixed("short", vec![1.0]), 1.0)
        .unwrap();
    let msg = sum.score(&s).unwrap_err().to_string();
    assert!(
        msg.contains("\"short\"") && msg.contains("2 scores") && msg.contains("got 1"),
        "{msg}"
    );
    let mut sum = WeightedSum::new()
        .with(Fixed("inf", vec![1.0, f64::NEG_INFINITY]), 1.0)
        .unwrap();
    let msg = sum.score(&s).unwrap_err().to_string();
    assert!(msg.contains("\"inf\"") && msg.contains("sample 1"), "{msg}");
    // nothing to sum; a name twice; a weight that is no number
    assert!(WeightedSum::new().score(&s).is_err());
    let msg = WeightedSum::new()
        .with(Fixed("x", vec![]), 1.0)
        .unwrap()
        .with(Fixed("x", vec![]), 1.0)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("\"x\" is already used by part 0"), "{msg}");
    assert!(WeightedSum::new()
        .with(Fixed("x", vec![]), f64::NAN)
        .is_err());
    // an inner error says which function
    let fields = Map::new();
    let mut sum = WeightedSum::new()
        .with(
            AnswerMatch::new("answer", Extraction::Trimmed, Compare::Exact),
            1.0,
        )
        .unwrap();
    let msg = sum.score(&[sample("1", &fields)]).unwrap_err().to_string();
    assert!(
        msg.starts_with("reward function \"answer_match\": "),
        "{msg}"
    );
}

// ------------------------------------------------------------------ command

/// The command tests run one at a time (the zombie check looks at all of this process's
/// children).
static COMMANDS: Mutex<()> = Mutex::new(());
static DIRS: AtomicUsize = AtomicUsize::new(0);

fn temp_dir() -> PathBuf {
    let n = DIRS.fetch_add(1, Ordering::SeqCst);
    let dir = std::env::temp_dir().join(format!("torchrl-rewards-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn script(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.to_string_lossy().into_owned()
}

/// This process's children that are zombies (state `Z` with our pid as parent).
fn zombies() -> Vec<String> {
    let me = std::process::id().to_string();
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // pid (comm) state ppid …
        let Some(after) = stat.rfind(')').map(|i| &stat[i + 2..]) else {
            continue;
        };
        let mut it = after.split_whitespace();
        let (state, ppid) = (it.next(), it.next());
        if state == Some("Z") && ppid == Some(me.as_str()) {
            out.push(stat);
        }
    }
    out
}

fn command(argv: &[&str], timeout_s: f64) -> CommandReward {
    CommandReward::new(argv.iter().copied(), Duration::from_secs_f64(timeout_s)).unwrap()
}

const PY_SCORER: &str = r#"
import json, sys
for line in sys.stdin:
    s = json.loads(line)
    keys = sorted(s)
    if s["completion"] == "skip":
        print("null")
    elif s["completion"] == s.get("answer"):
        print(json.dumps({"score": 1.0, "keys": keys}))
    elif "reward" in s["completion"]:
        print(json.dumps({"reward": -0.25}))
    else:
        print(len(s["completion_ids"]) + len(s["prompt"]) / 10)
"#;

#[test]
fn command_reward_scores_json_lines() {
    let _lock = COMMANDS.lock().unwrap_or_else(|e| e.into_inner());
    let dir = temp_dir();
    let py = script(&dir, "score.py", PY_SCORER);
    let mut f = command(&["python3", &py], 30.0).with_name("py");
    assert_eq!(f.name(), "py");
    assert_eq!(f.argv()[0], "python3");
    let fields = row(json!({"answer": "yes", "prompt": "not the prompt"}));
    let s = |completion, ids: &'static [i64]| RewardSample {
        prompt: "Q?",
        completion,
        completion_ids: ids,
        fields: &fields,
    };
    let got = f
        .score(&[
            s("yes", &[]),
            s("no", &[1, 2, 3]),
            s("a reward", &[]),
            s("skip", &[]),
        ])
        .unwrap();
    // "yes" = the answer: 1; "no": 3 ids + len("Q?") / 10 = 3.2 (the row's "prompt" does not
    // replace the sample's); {"reward": -0.25}; null: NaN
    assert_eq!(&got[..3], &[1.0, 3.2, -0.25]);
    assert!(got[3].is_nan());
    assert_eq!(f.score(&[]).unwrap(), Vec::<f64>::new()); // no batch, no process
                                                          // a large batch: ~8 MB each way through the pipes
    let big = "x".repeat(4000);
    let fields = row(json!({"answer": big.clone()}));
    let samples: Vec<RewardSample<'_>> = (0..2000)
        .map(|_| RewardSample {
            prompt: "Q?",
            completion: &big,
            completion_ids: &[],
            fields: &fields,
        })
        .collect();
    let mut f = command(&["python3", &py], 60.0);
    assert_eq!(f.score(&samples).unwrap(), vec![1.0; 2000]);
    // a command that does not read its input (a large one) is fine
    let mut f = command(&["sh", "-c", "echo 0.5"], 30.0);
    assert_eq!(f.score(&samples[..1]).unwrap(), vec![0.5]);
    assert!(zombies().is_empty(), "{:?}", zombies());
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn command_reward_timeout_kills_the_process_group() {
    let _lock = COMMANDS.lock().unwrap_or_else(|e| e.into_inner());
    let dir = temp_dir();
    let pidfile = dir.join("sleep.pid");
    let sh = script(
        &dir,
        "hang.sh",
        &format!("sleep 30 &\necho $! > {}\nwait\n", pidfile.display()),
    );
    let fields = Map::new();
    let mut f = command(&["sh", &sh], 1.0);
    let start = Instant::now();
    let err = f.score(&[sample("x", &fields)]).unwrap_err();
    let took = start.elapsed();
    let msg = err.to_string();
    assert!(msg.contains(&sh) && msg.contains("timeout of 1s"), "{msg}");
    assert!(took < Duration::from_secs(5), "{took:?}");
    assert!(zombies().is_empty(), "{:?}", zombies());
    // the grandchild (`sleep 30`) went with its group
    let pid = std::fs::read_to_string(&pidfile).unwrap();
    let stat = PathBuf::from(format!("/proc/{}/stat", pid.trim()));
    let gone = (0..100).any(|_| {
        let dead = std::fs::read_to_string(&stat).map_or(true, |s| s.contains(") Z "));
        if !dead {
            std::thread::sleep(Duration::from_millis(20));
        }
        dead
    });
    assert!(gone, "sleep {pid} still runs");
    // a command that printed its scores but does not exit also times out
    let mut f = command(&["sh", "-c", "echo 1; exec sleep 30"], 1.0);
    let msg = f.score(&[sample("x", &fields)]).unwrap_err().to_string();
    assert!(msg.contains("timeout"), "{msg}");
    assert!(zombies().is_empty());
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn command_reward_failures_name_the_command() {
    let _lock = COMMANDS.lock().unwrap_or_else(|e| e.into_inner());
    let dir = temp_dir();
    let fields = Map::new();
    let three = [
        sample("a", &fields),
        sample("b", &fields),
        sample("c", &fields),
    ];
    let run =
        |argv: &[&str]| -> String { command(argv, 10.0).score(&three).unwrap_err().to_string() };
    // non-zero exit: the status and the end of stderr
    let sh = script(
        &dir,
        "fail.sh",
        "cat > /dev/null\necho 'bad input' >&2\nexit 3\n",
    );
    let msg = run(&["sh", &sh]);
    assert!(
        msg.contains(&sh) && msg.contains("exit status: 3") && msg.contains("bad input"),
        "{msg}"
    );
    // a long stderr: only its end
    let msg = run(&[
        "sh",
        "-c",
        "i=0; while [ $i -lt 3000 ]; do echo line$i >&2; i=$((i+1)); done; exit 1",
    ]);
    assert!(
        msg.contains("line2999") && !msg.contains("line0\n") && msg.len() < 2600,
        "{}",
        msg.len()
    );
    // killed by a signal
    let msg = run(&["sh", "-c", "kill -9 $$"]);
    assert!(msg.contains("signal: 9"), "{msg}");
    // garbage: not a number, NaN, a string score, an object without a score
    for (out, line, text) in [
        ("1\\nhello\\n1", 2, "hello"),
        ("1\\n2\\nNaN", 3, "NaN"),
        ("{\\\"score\\\": \\\"high\\\"}\\n1\\n1", 1, "high"),
        ("1\\n{\\\"value\\\": 1}\\n1", 2, "value"),
        ("1\\n\\n1\\n1", 2, ""),
        ("1\\n2\\n1e999", 3, "1e999"),
    ] {
        let msg = run(&["sh", "-c", &format!("printf '{out}'")]);
        assert!(
            msg.contains(&format!("output line {line} ")) && msg.contains(text),
            "{msg}"
        );
    }
    // too few, too many
    let msg = run(&["sh", "-c", "printf '1\\n2\\n'"]);
    assert!(msg.contains("printed 2 score lines for 3 samples"), "{msg}");
    let msg = run(&["sh", "-c", "printf '1\\n2\\n3\\n4\\n'"]);
    assert!(msg.contains("printed 4 score lines for 3 samples"), "{msg}");
    let msg = run(&["sh", "-c", "true"]);
    assert!(msg.contains("printed 0 score lines"), "{msg}");
    // three lines without a final newline, and with CRLF, are fine
    let mut f = command(
        &["sh", "-c", "printf '1\\r\\n-2\\r\\n{\"reward\": 3}'"],
        10.0,
    );
    assert_eq!(f.score(&three).unwrap(), vec![1.0, -2.0, 3.0]);
    // a program that does not exist
    let msg = run(&[dir.join("missing").to_str().unwrap()]);
    assert!(
        msg.contains("could not start") && msg.contains("missing"),
        "{msg}"
    );
    // construction
    assert!(CommandReward::new(Vec::<String>::new(), Duration::from_secs(1)).is_err());
    assert!(CommandReward::new([""], Duration::from_secs(1)).is_err());
    assert!(CommandReward::new(["true"], Duration::ZERO).is_err());
    assert!(zombies().is_empty(), "{:?}", zombies());
    let _ = std::fs::remove_dir_all(dir);
}

// ------------------------------------------------------------------ the scorer adapter

/// Records the fields and completion ids it was given; scores 0.
/// What [`Spy`] saw: each completion, its fields and its ids.
type Seen = Vec<(String, Map<String, Value>, Vec<i64>)>;

struct Spy(std::sync::Arc<Mutex<Seen>>);

impl RewardFunction for Spy {
    fn name(&self) -> &str {
        "spy"
    }
    fn score(&mut self, samples: &[RewardSample<'_>]) -> torchrl::Result<Vec<f64>> {
        let mut seen = self.0.lock().unwrap();
        for s in samples {
            seen.push((
                s.completion.to_string(),
                s.fields.clone(),
                s.completion_ids.to_vec(),
            ));
        }
        Ok(vec![0.0; samples.len()])
    }
}

struct Batch {
    prompts: Vec<Vec<i64>>,
    responses: Vec<Vec<i64>>,
    eos: Vec<bool>,
    tokens: Tensor,
    mask: Tensor,
}

impl Batch {
    fn new(tok: &ByteTokenizer, rows: &[(&str, &str, bool)]) -> Batch {
        let prompts: Vec<Vec<i64>> = rows.iter().map(|r| tok.encode(r.0).unwrap()).collect();
        let responses: Vec<Vec<i64>> = rows.iter().map(|r| tok.encode(r.1).unwrap()).collect();
        let eos = rows.iter().map(|r| r.2).collect();
        // the scorer adapter does not read the padded tensors unless a reward model is a part
        let tokens = Tensor::zeros([rows.len() as i64, 4], (Kind::Int64, Device::Cpu));
        let mask = tokens.ones_like();
        Batch {
            prompts,
            responses,
            eos,
            tokens,
            mask,
        }
    }

    fn input(&self) -> ScoreInput<'_> {
        ScoreInput {
            prompts: &self.prompts,
            responses: &self.responses,
            ended_with_eos: &self.eos,
            tokens: &self.tokens,
            attention_mask: &self.mask,
            batch_size: self.prompts.len() as i64,
        }
    }
}

#[test]
fn scorer_finds_each_prompts_row_by_token_ids() {
    let tok = ByteTokenizer::new();
    let seen = std::sync::Arc::new(Mutex::new(Vec::new()));
    let parts = vec![
        RewardPart::function(
            AnswerMatch::new(
                "answer",
                Extraction::LastNumber,
                Compare::numeric(1e-9).unwrap(),
            )
            .with_reference_extraction(Extraction::After("####".into())),
            1.0,
        )
        .unwrap(),
        RewardPart::function(FormatCheck::think().unwrap(), 0.5).unwrap(),
        RewardPart::function(SoftOverlongPunishment::new(6, 4).unwrap(), 1.0).unwrap(),
    ];
    let mut scorer = RewardScorer::new(tok, parts)
        .unwrap()
        .with_text_rows([
            ("1+1=", row(json!({"answer": "#### 2"}))),
            ("2*3=", row(json!({"answer": "so #### 6"}))),
            ("1+1=", row(json!({"answer": "#### 2"}))), // the same row again: fine
        ])
        .unwrap();
    assert!(scorer.fields(&tok.encode("2*3=").unwrap()).is_some());
    assert!(scorer.fields(&tok.encode("9-9=").unwrap()).is_none());
    // G = 2 completions per prompt, as GRPO's env serves them
    let batch = Batch::new(
        &tok,
        &[
            ("1+1=", "<think>1+1</think>2", true), // 1 + 0.5 + len 19 + EOS = 20 > 6: −1
            ("1+1=", "3", true),                   // 0 + 0 + len 2 <= 2: 0
            ("2*3=", "6", false),                  // 1 + 0 + len 1: 0
            ("2*3=", "<think></think>", true),     // 0 + 0.5 + len 16 > 6: −1
        ],
    );
    let score = scorer.score(&batch.input()).unwrap();
    assert_eq!(score.kind(), Kind::Float);
    assert_eq!(score.size(), vec![4]);
    assert_eq!(
        Vec::<f32>::try_from(&score).unwrap(),
        vec![0.5, 0.0, 1.0, -0.5]
    );
    assert_eq!(
        scorer.last_means(),
        vec![
            ("answer_match", 0.5),
            ("think_format_reward", 0.5),
            ("soft_overlong_punishment_reward", -0.5)
        ]
    );

    // what a function sees: the row's fields (empty for an unknown prompt) and the completion
    // ids with the EOS that ended them
    let spy = Spy(seen.clone());
    let mut scorer = RewardScorer::new(tok, vec![RewardPart::function(spy, 1.0).unwrap()])
        .unwrap()
        .with_rows([(tok.encode("1+1=").unwrap(), row(json!({"answer": 2})))])
        .unwrap();
    let batch = Batch::new(&tok, &[("1+1=", "2", true), ("9-9=", "0", false)]);
    let _ = scorer.score(&batch.input()).unwrap();
    let seen = seen.lock().unwrap();
    assert_eq!(
        seen[0],
        (
            "2".into(),
            row(json!({"answer": 2})),
            vec![50, ByteTokenizer::EOS]
        )
    );
    assert_eq!(seen[1], ("0".into(), Map::new(), vec![48]));
}

#[test]
fn scorer_refuses_conflicting_rows_and_bad_batches() {
    let tok = ByteTokenizer::new();
    let part = || RewardPart::function(FormatCheck::think().unwrap(), 1.0).unwrap();
    let msg = RewardScorer::new(tok, vec![part()])
        .unwrap()
        .with_text_rows([
            ("q1", row(json!({"answer": 1}))),
            ("q2", row(json!({"answer": 2}))),
            ("q1", row(json!({"answer": 3}))),
        ])
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("rows 0 and 2")
            && msg.contains("{\"answer\":1}")
            && msg.contains("{\"answer\":3}"),
        "{msg}"
    );
    // rows are numbered over every call
    let msg = RewardScorer::new(tok, vec![part()])
        .unwrap()
        .with_text_rows([("q1", row(json!({"a": 1})))])
        .unwrap()
        .with_text_rows([("q2", row(json!({"a": 2}))), ("q1", row(json!({"a": 9})))])
        .unwrap_err()
        .to_string();
    assert!(msg.contains("rows 0 and 2"), "{msg}");
    // no parts, two parts with one name
    assert!(RewardScorer::new(tok, vec![]).is_err());
    let msg = RewardScorer::new(tok, vec![part(), part()])
        .unwrap_err()
        .to_string();
    assert!(msg.contains("already used by part 0"), "{msg}");
    // a batch whose lists disagree with its size
    let mut scorer = RewardScorer::new(tok, vec![part()]).unwrap();
    let batch = Batch::new(&tok, &[("q", "a", true)]);
    let mut input = batch.input();
    input.batch_size = 2;
    assert!(scorer.score(&input).is_err());
    // an inner error names the part
    let mut scorer = RewardScorer::new(
        tok,
        vec![RewardPart::function(
            AnswerMatch::new("answer", Extraction::Trimmed, Compare::Exact),
            1.0,
        )
        .unwrap()],
    )
    .unwrap();
    let msg = scorer.score(&batch.input()).unwrap_err().to_string();
    assert!(
        msg.starts_with("reward part \"answer_match\": ") && msg.contains("sample 0"),
        "{msg}"
    );
}

fn score_dir() -> PathBuf {
    [env!("CARGO_MANIFEST_DIR"), "specs", "gpt2", "score_v90"]
        .iter()
        .collect()
}

#[test]
fn reward_model_part_from_the_config() {
    // ByteTokenizer ids of "0".."9" and "A".."Y" are inside the model's vocabulary (90)
    let tok = ByteTokenizer::new();
    let batch = {
        let mut b = Batch::new(&tok, &[("AB", "C1", true), ("AB", "D22", false)]);
        // the full tokens: left-padded prompt then right-padded response (padding = 0, masked)
        let rows: [[i64; 5]; 2] = [[65, 66, 67, 49, 0], [65, 66, 68, 50, 50]];
        b.tokens = Tensor::from_slice2(&rows);
        b.mask = Tensor::from_slice2(&[[1_i64, 1, 1, 1, 0], [1, 1, 1, 1, 1]]);
        b
    };
    let toml = format!(
        "[[reward]]\ntype = \"reward_model\"\npath = {:?}\nweight = 2.0\n\n\
         [[reward]]\ntype = \"format\"\nname = \"has_two\"\npattern = \".*2.*\"\nweight = 0.5\n",
        score_dir().display().to_string()
    );
    let parts = RewardsConfig::from_toml_str(&toml)
        .unwrap()
        .build(Device::Cpu)
        .unwrap();
    assert_eq!(parts[0].name(), "score_v90"); // the folder's name
    let mut scorer = RewardScorer::new(tok, parts).unwrap();
    let got =
        Vec::<f64>::try_from(&scorer.score(&batch.input()).unwrap().to_kind(Kind::Double)).unwrap();
    // the reference: the reward model alone
    let vs = VarStore::new(Device::Cpu);
    let mut rm = RewardModelScorer::new(
        CausalLmWithScoreHead::from_pretrained(&vs.root(), score_dir()).unwrap(),
    );
    let want =
        Vec::<f64>::try_from(&rm.score(&batch.input()).unwrap().to_kind(Kind::Double)).unwrap();
    assert!(want[0] != want[1]);
    // 2·rm + 0.5·[0, 1], in f32
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        let expected = 2.0 * w + if i == 1 { 0.5 } else { 0.0 };
        assert!((g - expected).abs() < 1e-5, "row {i}: {g} vs {expected}");
    }
    let means = scorer.last_means();
    assert!((means[0].1 - (want[0] + want[1]) / 2.0).abs() < 1e-6);
    assert_eq!(means[1], ("has_two", 0.5));
}

// ------------------------------------------------------------------ config

const FULL: &str = r#"
[[reward]]
type = "answer_match"
field = "answer"
extract = "last_number"
reference_extract = "after:####"
compare = "numeric"
tolerance = 0.01
weight = 1.0

[[reward]]
type = "format"
pattern = '(?s)<think>.*</think>.*'
weight = 0.25

[[reward]]
type = "think_format"
name = "think"

[[reward]]
type = "soft_overlong"
max_completion_len = 512
soft_punish_cache = 64

[[reward]]
type = "repetition_penalty"
ngram_size = 3
max_penalty = -1.0
weight = 0.1

[[reward]]
type = "command"
command = ["python3", "score.py"]
timeout_s = 5.5
weight = 2.0
"#;

#[test]
fn the_toml_form_builds_every_type() {
    let cfg = RewardsConfig::from_toml_str(FULL).unwrap();
    assert_eq!(cfg.reward.len(), 6);
    assert_eq!(
        cfg.reward[5],
        RewardEntry::Command {
            name: None,
            command: vec!["python3".into(), "score.py".into()],
            timeout_s: 5.5,
            weight: 2.0
        }
    );
    let parts = cfg.build(Device::Cpu).unwrap();
    let names: Vec<(&str, f64)> = parts.iter().map(|p| (p.name(), p.weight())).collect();
    assert_eq!(
        names,
        vec![
            ("answer_match", 1.0),
            ("format", 0.25),
            ("think", 1.0),
            ("soft_overlong_punishment_reward", 1.0),
            ("repetition_penalty_reward", 0.1),
            ("command", 2.0),
        ]
    );
    // written back and read again: the same config
    let text = toml::to_string(&cfg).unwrap();
    assert_eq!(RewardsConfig::from_toml_str(&text).unwrap(), cfg);
    // no [[reward]]: no parts
    assert!(RewardsConfig::from_toml_str("").unwrap().reward.is_empty());
    // the built parts score: the answer match with its tolerance
    let mut parts = parts;
    let fields = row(json!({"answer": "#### 3.14"}));
    let s = [sample("about 3.145", &fields)];
    let mut first = parts.remove(0);
    let RewardSource::Function(f) = first.source_mut() else {
        panic!("a function")
    };
    assert_eq!(f.score(&s).unwrap(), vec![1.0]);
}

#[test]
fn toml_errors_name_the_entry_and_the_field() {
    let cases = [
        // unknown field
        ("[[reward]]\ntype = \"think_format\"\n\n[[reward]]\ntype = \"format\"\npatern = \"x\"\n", "reward[1].patern: unknown field", ""),
        // unknown type
        ("[[reward]]\ntype = \"accuracy\"\nfield = \"a\"\n", "reward[0].type", "accuracy"),
        // no type
        ("[[reward]]\nfield = \"a\"\n", "reward[0].type", "missing field `type`"),
        // a missing field
        ("[[reward]]\ntype = \"soft_overlong\"\nmax_completion_len = 5\n", "reward[0]: missing field `soft_punish_cache`", ""),
        // a wrong type
        ("[[reward]]\ntype = \"command\"\ncommand = \"python3 score.py\"\n", "reward[0].command", "sequence"),
        // a negative length
        ("[[reward]]\ntype = \"soft_overlong\"\nmax_completion_len = -5\nsoft_punish_cache = 1\n", "reward[0].max_completion_len", ""),
        // a top-level key that is not [[reward]]
        ("rewards = 1\n", "RewardsConfig", "rewards"),
    ];
    for (text, place, what) in cases {
        let msg = RewardsConfig::from_toml_str(text).unwrap_err().to_string();
        assert!(msg.contains(place) && msg.contains(what), "{text:?}: {msg}");
    }
}

#[test]
fn build_errors_name_the_entry_and_the_field() {
    let cases = [
        (
            "[[reward]]\ntype = \"think_format\"\n\n[[reward]]\ntype = \"format\"\npattern = \"(\"\n",
            "reward[1] (format)",
            "field pattern",
        ),
        ("[[reward]]\ntype = \"answer_match\"\nfield = \"a\"\nextract = \"last\"\n", "reward[0] (answer_match)", "field extract"),
        (
            "[[reward]]\ntype = \"answer_match\"\nfield = \"a\"\nreference_extract = \"regex:\\\\d\"\n",
            "reward[0] (answer_match)",
            "field reference_extract",
        ),
        ("[[reward]]\ntype = \"answer_match\"\nfield = \"a\"\ntolerance = 0.1\n", "reward[0] (answer_match)", "field tolerance"),
        (
            "[[reward]]\ntype = \"answer_match\"\nfield = \"a\"\ncompare = \"numeric\"\ntolerance = -1.0\n",
            "reward[0] (answer_match)",
            "field tolerance",
        ),
        ("[[reward]]\ntype = \"answer_match\"\nfield = \"a\"\ncompare = \"fuzzy\"\n", "reward[0] (answer_match)", "field compare"),
        ("[[reward]]\ntype = \"answer_match\"\nfield = \"\"\n", "reward[0] (answer_match)", "field field"),
        ("[[reward]]\ntype = \"soft_overlong\"\nmax_completion_len = 4\nsoft_punish_cache = 5\n", "reward[0] (soft_overlong)", "field soft_punish_cache"),
        ("[[reward]]\ntype = \"repetition_penalty\"\nngram_size = 0\nmax_penalty = -1.0\n", "reward[0] (repetition_penalty)", "field ngram_size"),
        ("[[reward]]\ntype = \"command\"\ncommand = []\n", "reward[0] (command)", "field command"),
        ("[[reward]]\ntype = \"command\"\ncommand = [\"x\"]\ntimeout_s = 0.0\n", "reward[0] (command)", "field timeout_s"),
        ("[[reward]]\ntype = \"think_format\"\nweight = nan\n", "reward[0] (think_format)", "field weight"),
        ("[[reward]]\ntype = \"think_format\"\nname = \"\"\n", "reward[0] (think_format)", "field name"),
        (
            "[[reward]]\ntype = \"think_format\"\n\n[[reward]]\ntype = \"think_format\"\n",
            "reward[1] (think_format)",
            "\"think_format_reward\" is already used by part 0",
        ),
        (
            "[[reward]]\ntype = \"reward_model\"\npath = \"/nonexistent/rm\"\n",
            "reward[0] (reward_model)",
            "/nonexistent/rm",
        ),
        (
            "[[reward]]\ntype = \"reward_model\"\npath = \"/nonexistent/rm\"\nclip = -1.0\n",
            "reward[0] (reward_model)",
            "path",
        ),
    ];
    for (text, entry, field) in cases {
        let cfg = RewardsConfig::from_toml_str(text).unwrap();
        let msg = build_parts(&cfg.reward, Device::Cpu)
            .unwrap_err()
            .to_string();
        assert!(
            msg.starts_with(entry) && msg.contains(field),
            "{text:?}: {msg}"
        );
    }
}

#[test]
fn the_docs_toml_example_parses_and_builds() {
    let path = format!("{}/docs/rlhf.md", env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(path).unwrap();
    let section = &doc[doc.find("## Rewards without Python").expect("the section")..];
    let start = section.find("```toml\n").expect("a toml block") + "```toml\n".len();
    let block = &section[start..start + section[start..].find("```").unwrap()];
    let cfg = RewardsConfig::from_toml_str(block).unwrap();
    let types: Vec<&str> = cfg.reward.iter().map(RewardEntry::type_name).collect();
    assert_eq!(
        types,
        [
            "answer_match",
            "think_format",
            "soft_overlong",
            "command",
            "reward_model"
        ]
    );
    // integers where floats go (timeout_s = 30) are fine; the reward model's folder is only
    // an example, so build the others
    let parts = build_parts(&cfg.reward[..4], Device::Cpu).unwrap();
    assert_eq!(parts[3].name(), "command");
    assert_eq!(parts[1].weight(), 0.2);
}
