//! [`CommandReward`]: scores from an external program reading JSON lines on stdin.

use std::io::{Read, Write};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::error::{Error, Result};

use super::*;
/// How many bytes of a failed command's stderr its error quotes (the end).
pub(super) const STDERR_TAIL: usize = 2000;

/// An external program as a reward: spawned once per batch with `argv`, it reads one JSON
/// object per sample on stdin — `{"prompt": …, "completion": …, "completion_ids": […],
/// …fields}` (the row's fields never replace those three) — and writes one line per sample on
/// stdout, in order: a bare number (`0.5`, `-1`, `1e-3`), or a JSON object with a number
/// under `"score"` (or, without `"score"`, `"reward"`). `null` (bare or as that number) means
/// "does not apply" (TRL's `None`, NaN here). A final newline is optional; nothing else may
/// follow the last score.
///
/// Errors, each naming the command: it ran past the timeout (it is killed, on Linux with its
/// whole process group so that a `sleep` it started goes too, and waited for); it exited non-zero or by a signal (with the status and the tail of
/// its stderr); an output line is not a score, is NaN or infinite (naming the line number and
/// text), or the number of lines is not the number of samples. It never leaves a zombie:
/// every child is waited for. Stdin is written from a thread and stdout / stderr are read by
/// threads, so large batches do not deadlock.
///
/// A process per batch (and not one kept alive) keeps batches independent: a scorer that
/// crashed, hung or printed garbage leaves nothing behind for the next batch, there is no
/// framing to resync and no state leaks between batches; starting even a Python interpreter (~50 ms) is small next
/// to generating the batch. It inherits the working directory and environment.
///
/// ```
/// use std::time::Duration;
/// use serde_json::{json, Map};
/// use torchrl::envs::llm::rewards::{CommandReward, RewardFunction, RewardSample};
/// # fn main() -> torchrl::Result<()> {
/// // a scorer in sh: 1 when the completion line says "yes", else 0
/// let script = r#"while IFS= read -r l; do case "$l" in *'"completion":"yes"'*) echo 1;; *) echo '{"score": 0}';; esac; done"#;
/// let mut f = CommandReward::new(["sh", "-c", script], Duration::from_secs(5))?;
/// let mut fields = Map::new();
/// fields.insert("answer".into(), json!("yes"));
/// let s = |completion| RewardSample { prompt: "Q?", completion, completion_ids: &[], fields: &fields };
/// assert_eq!(f.score(&[s("yes"), s("no")])?, vec![1.0, 0.0]);
/// let mut failing = CommandReward::new(["sh", "-c", "echo oops >&2; exit 3"], Duration::from_secs(5))?;
/// let err = failing.score(&[s("yes")]).unwrap_err().to_string();
/// assert!(err.contains("exit status: 3") && err.contains("oops"));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct CommandReward {
    name: String,
    argv: Vec<String>,
    timeout: Duration,
}

impl CommandReward {
    /// Runs `argv` (program first) with `timeout` per batch; named `"command"`. Errors on an
    /// empty `argv` or a zero timeout.
    pub fn new<S: Into<String>>(
        argv: impl IntoIterator<Item = S>,
        timeout: Duration,
    ) -> Result<Self> {
        const OP: &str = "CommandReward::new";
        let argv: Vec<String> = argv.into_iter().map(Into::into).collect();
        if argv.first().is_none_or(|p| p.is_empty()) {
            return Err(Error::config(
                OP,
                "command",
                "a program and its arguments (a non-empty program)",
                format!("{argv:?}"),
            ));
        }
        if timeout.is_zero() {
            return Err(Error::config(OP, "timeout", "> 0", "0 s"));
        }
        Ok(CommandReward {
            name: "command".into(),
            argv,
            timeout,
        })
    }

    /// Renames it.
    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// The program and its arguments.
    pub fn argv(&self) -> &[String] {
        &self.argv
    }

    /// The time a batch may take.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The input lines for `samples`.
    fn input(samples: &[RewardSample<'_>]) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        for s in samples {
            let mut obj = s.fields.clone();
            obj.insert("prompt".into(), Value::String(s.prompt.to_string()));
            obj.insert("completion".into(), Value::String(s.completion.to_string()));
            obj.insert(
                "completion_ids".into(),
                Value::Array(s.completion_ids.iter().map(|&i| Value::from(i)).collect()),
            );
            serde_json::to_writer(&mut out, &Value::Object(obj)).map_err(|e| {
                Error::invalid("CommandReward::score", format!("JSON encoding: {e}"))
            })?;
            out.push(b'\n');
        }
        Ok(out)
    }

    fn describe(&self) -> String {
        format!("{:?}", self.argv)
    }

    /// Kills the child's process group (and the child), then waits for it.
    fn kill(child: &mut Child) {
        #[cfg(target_os = "linux")]
        if let Ok(pid) = i32::try_from(child.id()) {
            // SAFETY: kill(2) with a negative pid signals the process group whose id is the
            // child's pid (the child was started as its own group leader with
            // `process_group(0)`, and is not yet waited for, so the id is not reused); it
            // touches no memory of ours.
            unsafe {
                libc::kill(-pid, libc::SIGKILL);
            }
        }
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Runs the command on `input`: its stdout, or the error.
    fn run(&self, input: Vec<u8>) -> Result<Vec<u8>> {
        const OP: &str = "CommandReward::score";
        let (program, args) = self
            .argv
            .split_first()
            .ok_or_else(|| Error::invalid(OP, "empty command"))?;
        let mut cmd = Command::new(program);
        cmd.args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        #[cfg(unix)]
        {
            use std::os::unix::process::CommandExt;
            cmd.process_group(0);
        }
        let mut child = cmd.spawn().map_err(|e| {
            Error::invalid(
                OP,
                format!("could not start command {}: {e}", self.describe()),
            )
        })?;
        let deadline = Instant::now() + self.timeout;
        let (stdin, stdout, stderr) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take());
        // stdin from a thread (a child that exits early gives EPIPE: ignored, its status says
        // what happened); stdout / stderr read to EOF by threads, so no pipe fills up
        if let Some(mut stdin) = stdin {
            std::thread::spawn(move || {
                let _ = stdin.write_all(&input);
            });
        }
        let reader = |pipe: Option<Box<dyn Read + Send>>| {
            let (tx, rx) = mpsc::channel();
            if let Some(mut pipe) = pipe {
                std::thread::spawn(move || {
                    let mut buf = Vec::new();
                    let r = pipe.read_to_end(&mut buf).map(|_| buf);
                    let _ = tx.send(r);
                });
            }
            rx
        };
        let out_rx = reader(stdout.map(|p| Box::new(p) as Box<dyn Read + Send>));
        let err_rx = reader(stderr.map(|p| Box::new(p) as Box<dyn Read + Send>));
        let timed_out = |child: &mut Child| {
            Self::kill(child);
            Error::invalid(
                OP,
                format!(
                    "command {} did not finish within the timeout of {:?}; killed",
                    self.describe(),
                    self.timeout
                ),
            )
        };
        let left = |d: Instant| d.saturating_duration_since(Instant::now());
        // stdout to EOF, then the exit status, then stderr, all before the deadline
        let stdout = match out_rx.recv_timeout(left(deadline)) {
            Ok(Ok(buf)) => buf,
            Ok(Err(e)) => {
                Self::kill(&mut child);
                return Err(Error::invalid(
                    OP,
                    format!("reading the stdout of command {}: {e}", self.describe()),
                ));
            }
            Err(mpsc::RecvTimeoutError::Timeout) => return Err(timed_out(&mut child)),
            Err(mpsc::RecvTimeoutError::Disconnected) => Vec::new(),
        };
        let status: ExitStatus = loop {
            match child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if Instant::now() >= deadline => return Err(timed_out(&mut child)),
                Ok(None) => std::thread::sleep(Duration::from_millis(2)),
                Err(e) => {
                    Self::kill(&mut child);
                    return Err(Error::invalid(
                        OP,
                        format!("waiting for command {}: {e}", self.describe()),
                    ));
                }
            }
        };
        // the child is reaped; a leftover grandchild may still hold stderr open: wait for it
        // until the deadline (at least a moment), then go without
        let grace = left(deadline).max(Duration::from_millis(50));
        let stderr = match err_rx.recv_timeout(grace) {
            Ok(Ok(buf)) => buf,
            _ => Vec::new(),
        };
        if !status.success() {
            let text = String::from_utf8_lossy(&stderr);
            let text = text.trim_end();
            let mut start = text.len().saturating_sub(STDERR_TAIL);
            while !text.is_char_boundary(start) {
                start += 1;
            }
            let tail = text.get(start..).unwrap_or_default();
            return Err(Error::invalid(
                OP,
                format!(
                    "command {} failed ({status}); the end of its stderr:\n{}{tail}",
                    self.describe(),
                    if start > 0 { "…" } else { "" }
                ),
            ));
        }
        Ok(stdout)
    }

    /// The scores in `stdout`, `n` of them.
    fn parse(&self, stdout: &[u8], n: usize) -> Result<Vec<f64>> {
        const OP: &str = "CommandReward::score";
        let text = std::str::from_utf8(stdout).map_err(|e| {
            Error::invalid(
                OP,
                format!(
                    "the output of command {} is not UTF-8: {e}",
                    self.describe()
                ),
            )
        })?;
        let text = text.strip_suffix('\n').unwrap_or(text);
        let lines: Vec<&str> = if text.is_empty() {
            Vec::new()
        } else {
            text.split('\n').collect()
        };
        let mut scores = Vec::with_capacity(n);
        for (i, raw) in lines.iter().enumerate() {
            let line = raw.strip_suffix('\r').unwrap_or(raw);
            let bad = |why: &str| {
                let shown: String = line.chars().take(200).collect();
                Error::invalid(
                    OP,
                    format!(
                        "command {}: output line {} {shown:?} {why}",
                        self.describe(),
                        i + 1
                    ),
                )
            };
            match parse_score(line) {
                Ok(v) if v.is_infinite() => return Err(bad("is infinite")),
                Ok(v) => scores.push(v),
                Err(why) => return Err(bad(why)),
            }
        }
        if scores.len() != n {
            return Err(Error::invalid(
                OP,
                format!(
                    "command {} printed {} score lines for {n} samples{}",
                    self.describe(),
                    scores.len(),
                    lines
                        .last()
                        .map(|l| format!(
                            " (last line {:?})",
                            l.chars().take(200).collect::<String>()
                        ))
                        .unwrap_or_default()
                ),
            ));
        }
        Ok(scores)
    }
}

/// One output line of a [`CommandReward`]: its score (NaN for `null`), or why it is not one.
pub(super) fn parse_score(line: &str) -> std::result::Result<f64, &'static str> {
    const NOT: &str = "is not a score (a number, null, or an object with a \"score\" / \
                       \"reward\" number)";
    let t = line.trim();
    let value: Value = serde_json::from_str(t).map_err(|_| NOT)?;
    let v = match &value {
        Value::Object(o) => o.get("score").or_else(|| o.get("reward")).ok_or(NOT)?,
        v => v,
    };
    match v {
        Value::Null => Ok(f64::NAN),
        Value::Number(n) => n.as_f64().ok_or(NOT),
        _ => Err(NOT),
    }
}

impl RewardFunction for CommandReward {
    fn name(&self) -> &str {
        &self.name
    }

    fn score(&mut self, samples: &[RewardSample<'_>]) -> Result<Vec<f64>> {
        if samples.is_empty() {
            return Ok(Vec::new());
        }
        let stdout = self.run(Self::input(samples)?)?;
        self.parse(&stdout, samples.len())
    }
}
