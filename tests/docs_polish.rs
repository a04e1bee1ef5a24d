//! Issue 26, item 10: a first program needs only the prelude; integer spec bounds print as
//! integers; an unknown `set_keys` name is reported once; snippets and examples use no
//! identifier that edition 2024 reserves (`gen`).

use std::path::{Path, PathBuf};

use tch::{Device, Kind, Tensor};
use torchrl::prelude::*;

/// A first program with nothing but the prelude: a spec, a module (its trait methods), a loss
/// trait and a collector type resolve.
#[test]
fn prelude_holds_what_a_first_program_needs() {
    let spec = Bounded::new(-2.0, 2.0, [1]).unwrap();
    let policy = from_fn(
        ["observation"],
        ["action"],
        |x: &[&Tensor]| -> Result<Vec<Tensor>> { Ok(vec![x[0].narrow(-1, 0, 1).clamp(-2.0, 2.0)]) },
    )
    .unwrap();
    let td = TensorDict::new([4])
        .unwrap()
        .with(
            "observation",
            Tensor::ones([4, 3], (Kind::Float, Device::Cpu)) * 3.0,
        )
        .unwrap();
    let out = policy.forward(td).unwrap(); // TensorDictModule in scope
    assert!(spec.is_in(out.get("action").unwrap()).unwrap());
    // the traits and types a training loop names
    fn takes_loss<L: LossModule>(_: Option<&L>) {}
    fn takes_estimator<V: ValueEstimator>(_: Option<&V>) {}
    fn takes_output<O: LossOutput>(_: Option<&O>) {}
    takes_loss::<torchrl::objectives::ClipPPOLoss>(None);
    takes_estimator::<torchrl::objectives::value::GAE>(None);
    takes_output::<torchrl::objectives::PpoLossOutput>(None);
    let collector: Option<Collector<'static, torchrl::envs::builtin::PendulumEnv>> = None;
    assert!(collector.is_none());
    assert_ne!(ExplorationType::Random, ExplorationType::Deterministic);
}

/// Integer bounds print exactly: i64::MAX is 9223372036854775807 (the f64 nearest to it prints
/// as 9223372036854775808, and JavaScript-style printers write 9223372036854776000).
#[test]
fn integer_spec_bounds_print_as_integers() {
    let low = Tensor::from_slice(&[i64::MIN + 1]);
    let high = Tensor::from_slice(&[i64::MAX]);
    let spec = Bounded::from_tensors(low, high).unwrap();
    let shown = spec.to_string();
    assert!(shown.contains("high=9223372036854775807"), "{shown}");
    assert!(shown.contains("low=-9223372036854775807"), "{shown}");
    assert!(
        !shown.contains("9223372036854775808") && !shown.contains("e18"),
        "{shown}"
    );
    // in a composite and in a violation message too
    let c = Composite::new([]).unwrap().with("x", spec.clone()).unwrap();
    assert!(c.to_string().contains("9223372036854775807"), "{c}");
    let big = Bounded::from_tensors(
        Tensor::from_slice(&[0i64]),
        Tensor::from_slice(&[(1i64 << 53) + 1]),
    )
    .unwrap();
    let msg = big
        .check(&Tensor::from_slice(&[(1i64 << 53) + 3]), "obs")
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("9007199254740995") && msg.contains("9007199254740993"),
        "{msg}"
    );
    // floats keep their own precision
    let f = Bounded::new(-0.1, 0.1, [2]).unwrap();
    assert!(f.to_string().contains("low=-0.1, high=0.1"), "{f}");
}

/// The unknown-key message says each thing once: the name, whose keys, the accepted list.
#[test]
fn unknown_set_keys_name_reads_once() {
    let mut gae = torchrl::objectives::value::GAE::new(0.99, 0.95).unwrap();
    let msg = gae
        .set_keys(&[("nope", Some("x".into()))])
        .unwrap_err()
        .to_string();
    assert_eq!(msg.matches("nope").count(), 1, "{msg}");
    assert_eq!(msg.matches("accepted").count(), 1, "{msg}");
    assert_eq!(msg.matches("advantage,").count(), 1, "{msg}");
}

fn files(dir: &Path, ext: &str, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let p = entry.unwrap().path();
        if p.is_dir() {
            files(&p, ext, out);
        } else if p.extension().is_some_and(|e| e == ext) {
            out.push(p);
        }
    }
}

fn has_gen_ident(code: &str) -> bool {
    code.split(|c: char| !(c.is_alphanumeric() || c == '_' || c == '#'))
        .any(|tok| tok == "gen")
}

/// Edition 2024 reserves `gen`: no doc snippet (`///` / `//!` code, docs/*.md and README code
/// blocks) and no example uses it as an identifier, so each compiles in a `cargo new` crate.
#[test]
fn snippets_and_examples_avoid_the_gen_keyword() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut bad = Vec::new();
    // doc comments of the library: only their code (lines inside ``` fences)
    let mut rs = Vec::new();
    files(&root.join("src"), "rs", &mut rs);
    for f in &rs {
        let text = std::fs::read_to_string(f).unwrap();
        let mut fenced = false;
        for (i, line) in text.lines().enumerate() {
            let t = line.trim_start();
            let Some(doc) = t.strip_prefix("///").or_else(|| t.strip_prefix("//!")) else {
                continue;
            };
            if doc.trim_start().starts_with("```") {
                fenced = !fenced;
            } else if fenced && has_gen_ident(doc) {
                bad.push(format!("{}:{}: {line}", f.display(), i + 1));
            }
        }
    }
    // markdown code blocks
    let mut md = vec![root.join("README.md")];
    files(&root.join("docs"), "md", &mut md);
    for f in &md {
        let text = std::fs::read_to_string(f).unwrap();
        let mut fenced = false;
        for (i, line) in text.lines().enumerate() {
            if line.trim_start().starts_with("```") {
                fenced = !fenced;
            } else if fenced && has_gen_ident(line) {
                bad.push(format!("{}:{}: {line}", f.display(), i + 1));
            }
        }
    }
    // examples: all code
    let mut ex = Vec::new();
    files(&root.join("examples"), "rs", &mut ex);
    for f in &ex {
        let text = std::fs::read_to_string(f).unwrap();
        for (i, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            if has_gen_ident(code) {
                bad.push(format!("{}:{}: {line}", f.display(), i + 1));
            }
        }
    }
    assert!(bad.is_empty(), "`gen` identifiers:\n{}", bad.join("\n"));
}
