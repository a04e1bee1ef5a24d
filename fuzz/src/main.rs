//! torchrl's mutation campaign (issue 29, part 5; `docs/reliability.md`, "Fuzz campaign").
//!
//! Every kind of file torchrl reads is mutated (safetensors model weights and tensordicts,
//! `config.json` in the GPT-2 and Llama / Mistral / Qwen2 / Qwen3 forms,
//! `generation_config.json`, `tokenizer.json`, trainer checkpoints, TOML / JSON trainer
//! configs, sharded-weight indexes, PEFT adapters) and public constructors are called with extreme arguments.
//! Each case is a function of `(seed, target, index)`, so any case re-runs alone from its
//! number. The mutator is ours (`mutate.rs`: a SplitMix64 stream, byte edits, structural JSON /
//! TOML edits, safetensors headers re-encoded): `cargo fuzz` needs nightly; `proptest` /
//! `arbitrary` / `bolero` generate values from strategies and shrink, while what we need is
//! structure-aware mutation of seed files and a case number that maps to one input, run in a
//! child process, with no dependency beyond those torchrl already has.
//!
//! Cases run in batches, each batch in a child process (this binary, `child`), which reports
//! `S <i>` before case `i` and `E <i> <class> <detail>` after it; the parent pins an abort
//! (the child died) or a hang (no report for `--timeout` seconds) to the case that had started,
//! records it, and starts a new child at the next case. Outcome classes: `ok`, `err` (a
//! named error) and `ok-nonfinite` (accepted finite-but-extreme values, after which the use
//! stopped with a named error saying its numbers went non-finite) are passes; `panic`, `abort`, `hang`, `unnamed-err` (a load error that does not
//! name its file), `raw-libtorch` (libtorch's C++ frames reach the caller), `half-written` (an
//! `Err` that changed its target), `unusable` (an `Ok` whose result fails its use) are defects.
//!
//! ```text
//! torchrl-fuzz run [--seed S] [--cases N] [--targets a,b] [--jobs J] [--batch B]
//!                  [--timeout SECS] [--seconds SECS] [--report FILE]
//!                  [--plan target=N,target=N]   # per-target counts
//! torchrl-fuzz case <target> <seed> <index>     # one case, in this process
//! torchrl-fuzz list
//! ```

mod mutate;
mod targets;

use std::collections::{BTreeMap, VecDeque};
use std::io::{BufRead, BufReader, Write};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::process::{Command, Stdio};
use std::sync::mpsc::{RecvTimeoutError, channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mutate::Rng;
use targets::{Outcome, State, TARGETS};

/// The classes that count as passes.
const PASSES: &[&str] = &["ok", "ok-nonfinite", "err"];
/// Every class, in the report's column order.
const CLASSES: &[&str] = &[
    "ok",
    "ok-nonfinite",
    "err",
    "panic",
    "abort",
    "hang",
    "unnamed-err",
    "raw-libtorch",
    "half-written",
    "unusable",
];

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let code = match args.first().map(String::as_str) {
        Some("run") => run(&args[1..]),
        Some("child") => child(&args[1..]),
        Some("case") => case(&args[1..]),
        Some("list") => {
            for (name, _) in TARGETS {
                println!("{name}");
            }
            0
        }
        _ => {
            eprintln!("usage: torchrl-fuzz run|case|list (see the crate docs)");
            2
        }
    };
    std::process::exit(code);
}

fn target_fn(name: &str) -> Option<targets::CaseFn> {
    TARGETS.iter().find(|(n, _)| *n == name).map(|(_, f)| *f)
}

/// The last panic message (the hook stores it; the case reports it).
static PANIC: Mutex<String> = Mutex::new(String::new());

fn quiet_panics() {
    std::panic::set_hook(Box::new(|info| {
        let msg = match info.payload().downcast_ref::<&str>() {
            Some(s) => s.to_string(),
            None => info
                .payload()
                .downcast_ref::<String>()
                .cloned()
                .unwrap_or_default(),
        };
        let at = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        // FUZZ_BACKTRACE=1: the torchrl frames that led there (for `case` re-runs)
        let frames = if std::env::var_os("FUZZ_BACKTRACE").is_some() {
            let bt = std::backtrace::Backtrace::force_capture().to_string();
            let lines: Vec<&str> = bt
                .lines()
                .filter(|l| l.contains("torchrl") || l.contains("tch::"))
                .take(16)
                .collect();
            format!(" | {}", lines.join(" | "))
        } else {
            String::new()
        };
        *PANIC.lock().unwrap_or_else(|e| e.into_inner()) = format!(
            "{frames} || {}{at}",
            msg.chars().take(300).collect::<String>()
        );
    }));
}

/// Caps the child's address space (`FUZZ_MEM_MIB`, default 8192): a runaway allocation then
/// fails inside the process (an error, or an abort the parent pins) instead of exhausting the
/// machine.
fn limit_memory() {
    let mib: u64 = std::env::var("FUZZ_MEM_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8192);
    let bytes = mib * 1024 * 1024;
    let lim = libc::rlimit {
        rlim_cur: bytes,
        rlim_max: bytes,
    };
    // SAFETY: setrlimit reads a valid rlimit struct; no memory is shared.
    unsafe {
        libc::setrlimit(libc::RLIMIT_AS, &lim);
    }
}

pub fn one_line(s: &str) -> String {
    let s: String = s
        .chars()
        .map(|c| if c == '\n' || c == '\r' { ' ' } else { c })
        .collect();
    s.chars().take(3000).collect()
}

/// Runs case `index` of `name` on `state` under `catch_unwind`: `(class, detail)`.
fn run_case(
    name: &str,
    f: targets::CaseFn,
    state: &mut Option<State>,
    seed: u64,
    index: u64,
) -> (String, String) {
    let mut rng = Rng::for_case(seed, name, index);
    let result = catch_unwind(AssertUnwindSafe(|| {
        let st = state.get_or_insert_with(State::new);
        f(st, &mut rng)
    }));
    match result {
        Ok(Outcome::Ok) => ("ok".into(), String::new()),
        Ok(Outcome::OkNonFinite) => ("ok-nonfinite".into(), String::new()),
        Ok(Outcome::Err(msg)) => ("err".into(), one_line(&msg)),
        Ok(Outcome::Defect(class, detail)) => (class.to_string(), one_line(&detail)),
        Err(_) => {
            // the state may be half-way through anything: start from a fresh one
            *state = None;
            let msg = PANIC.lock().unwrap_or_else(|e| e.into_inner()).clone();
            ("panic".into(), one_line(&msg))
        }
    }
}

fn child(args: &[String]) -> i32 {
    let (Some(name), Some(seed), Some(from), Some(to)) = (
        args.first(),
        args.get(1).and_then(|s| s.parse::<u64>().ok()),
        args.get(2).and_then(|s| s.parse::<u64>().ok()),
        args.get(3).and_then(|s| s.parse::<u64>().ok()),
    ) else {
        eprintln!("child <target> <seed> <from> <to>");
        return 2;
    };
    let Some(f) = target_fn(name) else {
        eprintln!("unknown target {name}");
        return 2;
    };
    limit_memory();
    quiet_panics();
    let mut state = None;
    let out = std::io::stdout();
    for i in from..to {
        {
            let mut o = out.lock();
            let _ = writeln!(o, "S {i}");
            let _ = o.flush();
        }
        let (class, detail) = run_case(name, f, &mut state, seed, i);
        let mut o = out.lock();
        let _ = writeln!(o, "E {i} {class} {detail}");
        let _ = o.flush();
    }
    0
}

fn case(args: &[String]) -> i32 {
    let (Some(name), Some(seed), Some(index)) = (
        args.first(),
        args.get(1).and_then(|s| s.parse::<u64>().ok()),
        args.get(2).and_then(|s| s.parse::<u64>().ok()),
    ) else {
        eprintln!("case <target> <seed> <index>");
        return 2;
    };
    let Some(f) = target_fn(name) else {
        eprintln!("unknown target {name}");
        return 2;
    };
    limit_memory();
    quiet_panics();
    let mut state = None;
    let t = Instant::now();
    let (class, detail) = run_case(name, f, &mut state, seed, index);
    println!(
        "{name} seed {seed} case {index}: {class} ({:.1} ms) {detail}",
        t.elapsed().as_secs_f64() * 1e3
    );
    i32::from(!PASSES.contains(&class.as_str()))
}

#[derive(Default, Clone)]
struct Counts {
    by_class: BTreeMap<String, u64>,
    seconds: f64,
}

struct Shared {
    counts: BTreeMap<String, Counts>,
    findings: Vec<String>,
}

struct Opts {
    seed: u64,
    cases: u64,
    targets: Vec<String>,
    jobs: usize,
    batch: u64,
    timeout: Duration,
    seconds: Option<f64>,
    report: Option<String>,
    /// Per-target case counts (`--plan target=N,...`), overriding `--cases` for those named.
    plan: BTreeMap<String, u64>,
}

fn parse_opts(args: &[String]) -> Result<Opts, String> {
    let mut o = Opts {
        seed: 1,
        cases: 200,
        targets: TARGETS.iter().map(|(n, _)| n.to_string()).collect(),
        jobs: 2,
        batch: 500,
        timeout: Duration::from_secs(30),
        seconds: None,
        report: None,
        plan: BTreeMap::new(),
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut val = || it.next().cloned().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--seed" => o.seed = val()?.parse().map_err(|e| format!("--seed: {e}"))?,
            "--cases" => o.cases = val()?.parse().map_err(|e| format!("--cases: {e}"))?,
            "--jobs" => o.jobs = val()?.parse().map_err(|e| format!("--jobs: {e}"))?,
            "--batch" => o.batch = val()?.parse().map_err(|e| format!("--batch: {e}"))?,
            "--timeout" => {
                o.timeout =
                    Duration::from_secs(val()?.parse().map_err(|e| format!("--timeout: {e}"))?)
            }
            "--seconds" => o.seconds = Some(val()?.parse().map_err(|e| format!("--seconds: {e}"))?),
            "--report" => o.report = Some(val()?),
            "--plan" => {
                for item in val()?.split(',') {
                    let (t, n) = item
                        .split_once('=')
                        .ok_or(format!("--plan: {item} is not target=N"))?;
                    if target_fn(t).is_none() {
                        return Err(format!("unknown target {t}"));
                    }
                    o.plan.insert(
                        t.to_string(),
                        n.parse().map_err(|e| format!("--plan {t}: {e}"))?,
                    );
                }
            }
            "--targets" => {
                o.targets = val()?.split(',').map(str::to_string).collect();
                for t in &o.targets {
                    if target_fn(t).is_none() {
                        return Err(format!("unknown target {t}"));
                    }
                }
            }
            other => return Err(format!("unknown option {other}")),
        }
    }
    o.batch = o.batch.max(1);
    o.jobs = o.jobs.max(1);
    Ok(o)
}

fn run(args: &[String]) -> i32 {
    let opts = match parse_opts(args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{e}");
            return 2;
        }
    };
    let exe = std::env::current_exe().expect("the running binary's path");
    // work items, interleaved across targets so that a time limit cuts every target alike
    let mut queue = VecDeque::new();
    let cases_of = |t: &String| opts.plan.get(t).copied().unwrap_or(opts.cases);
    // every target's batches, ordered by how far into its own count each one is, so that a
    // time limit cuts every target at about the same fraction
    let mut items = Vec::new();
    for t in &opts.targets {
        let n = cases_of(t);
        let count = n.div_ceil(opts.batch).max(1);
        for i in 0..count {
            let (from, to) = (i * opts.batch, ((i + 1) * opts.batch).min(n));
            if from < to {
                items.push(((i as f64 + 0.5) / count as f64, t.clone(), from, to));
            }
        }
    }
    items.sort_by(|a, b| a.0.total_cmp(&b.0));
    queue.extend(items.into_iter().map(|(_, t, from, to)| (t, from, to)));
    let queue = Arc::new(Mutex::new(queue));
    let shared = Arc::new(Mutex::new(Shared {
        counts: BTreeMap::new(),
        findings: Vec::new(),
    }));
    let start = Instant::now();
    let deadline = opts.seconds.map(|s| start + Duration::from_secs_f64(s));
    let mut workers = Vec::new();
    for _ in 0..opts.jobs {
        let (queue, shared, exe) = (queue.clone(), shared.clone(), exe.clone());
        let (seed, timeout) = (opts.seed, opts.timeout);
        workers.push(std::thread::spawn(move || {
            loop {
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    break;
                }
                let Some((t, from, to)) = queue.lock().unwrap().pop_front() else {
                    break;
                };
                let began = Instant::now();
                let results = run_batch(&exe, &t, seed, from, to, timeout, deadline);
                let mut guard = shared.lock().unwrap();
                let Shared { counts, findings } = &mut *guard;
                let c = counts.entry(t.clone()).or_default();
                c.seconds += began.elapsed().as_secs_f64();
                for (i, class, detail) in &results {
                    *c.by_class.entry(class.clone()).or_default() += 1;
                    if !PASSES.contains(&class.as_str()) {
                        let line = format!("{t} seed {seed} case {i}: {class}: {detail}");
                        eprintln!("FINDING {line}");
                        findings.push(line);
                    }
                }
            }
        }));
    }
    for w in workers {
        let _ = w.join();
    }
    let wall = start.elapsed().as_secs_f64();
    let sh = shared.lock().unwrap();
    let report = render(&sh, wall, &opts);
    print!("{report}");
    if let Some(path) = &opts.report {
        if let Err(e) = std::fs::write(path, &report) {
            eprintln!("writing {path}: {e}");
        }
    }
    i32::from(!sh.findings.is_empty())
}

fn render(sh: &Shared, wall: f64, opts: &Opts) -> String {
    let mut s = String::new();
    let total: u64 = sh
        .counts
        .values()
        .map(|c| c.by_class.values().sum::<u64>())
        .sum();
    s += &format!(
        "seed {}, {} cases in {:.0} s wall ({:.0} cases/s, {} jobs)\n\n",
        opts.seed,
        total,
        wall,
        total as f64 / wall.max(1e-9),
        opts.jobs
    );
    s += "| target | cases | cases/s (per job) |";
    for c in CLASSES {
        s += &format!(" {c} |");
    }
    s += "\n|---|---:|---:|";
    for _ in CLASSES {
        s += "---:|";
    }
    s += "\n";
    for (t, c) in &sh.counts {
        let n: u64 = c.by_class.values().sum();
        s += &format!("| {t} | {n} | {:.0} |", n as f64 / c.seconds.max(1e-9));
        for class in CLASSES {
            s += &format!(" {} |", c.by_class.get(*class).copied().unwrap_or(0));
        }
        s += "\n";
    }
    s += &format!("\nfindings: {}\n", sh.findings.len());
    for f in sh.findings.iter().take(200) {
        s += &format!("- {f}\n");
    }
    s
}

/// Runs cases `from..to` of `target` in child processes; returns `(index, class, detail)` for
/// each case run (an abort or a hang pinned to its case; the next child starts after it).
fn run_batch(
    exe: &std::path::Path,
    target: &str,
    seed: u64,
    from: u64,
    to: u64,
    timeout: Duration,
    deadline: Option<Instant>,
) -> Vec<(u64, String, String)> {
    let mut out = Vec::new();
    let mut next = from;
    while next < to {
        if deadline.is_some_and(|d| Instant::now() >= d) {
            break;
        }
        let mut proc = match Command::new(exe)
            .args([
                "child",
                target,
                &seed.to_string(),
                &next.to_string(),
                &to.to_string(),
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
        {
            Ok(p) => p,
            Err(e) => {
                eprintln!("cannot start a child: {e}");
                break;
            }
        };
        let (tx, rx) = channel::<String>();
        let stdout = proc.stdout.take().expect("piped stdout");
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let tail = Arc::new(Mutex::new(VecDeque::<String>::new()));
        let stderr = proc.stderr.take().expect("piped stderr");
        let tail2 = tail.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                let mut t = tail2.lock().unwrap();
                t.push_back(line);
                if t.len() > 6 {
                    t.pop_front();
                }
            }
        });
        let mut started: Option<u64> = None;
        loop {
            match rx.recv_timeout(timeout) {
                Ok(line) => {
                    let mut parts = line.splitn(4, ' ');
                    match (
                        parts.next(),
                        parts.next().and_then(|s| s.parse::<u64>().ok()),
                    ) {
                        (Some("S"), Some(i)) => started = Some(i),
                        (Some("E"), Some(i)) => {
                            let class = parts.next().unwrap_or("?").to_string();
                            let detail = parts.next().unwrap_or("").to_string();
                            out.push((i, class, detail));
                            started = None;
                            next = i + 1;
                        }
                        _ => {}
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    let _ = proc.kill();
                    let _ = proc.wait();
                    let i = started.unwrap_or(next);
                    out.push((
                        i,
                        "hang".into(),
                        format!("no report for {} s", timeout.as_secs()),
                    ));
                    next = i + 1;
                    break;
                }
                Err(RecvTimeoutError::Disconnected) => {
                    let status = proc.wait();
                    if let Some(i) = started.or((next < to).then_some(next)) {
                        std::thread::sleep(Duration::from_millis(50));
                        let tail: Vec<String> = tail.lock().unwrap().iter().cloned().collect();
                        out.push((
                            i,
                            "abort".into(),
                            one_line(&format!("{status:?}: {}", tail.join(" | "))),
                        ));
                        next = i + 1;
                    }
                    break;
                }
            }
        }
    }
    out
}
