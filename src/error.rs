//! The crate's error type.
//!
//! Every fallible public operation returns [`Result<T>`]. Variants are structs that carry the
//! context a user needs to fix the call: the key involved, the keys that were available, the
//! expected and actual shapes / dtypes / devices, and the operation that failed.
//!
//! ```
//! use torchrl::{Error, TensorDict};
//! let td = TensorDict::new(vec![3]).unwrap();
//! let err = td.get_or_err("obs").unwrap_err();
//! assert!(matches!(err, Error::KeyNotFound { .. }));
//! assert!(err.to_string().contains("\"obs\""));
//! ```

use std::fmt;

use tch::{Device, Kind};

/// Result alias used across the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Formats a shape the way this crate prints shapes everywhere: `[3, 4]`.
pub(crate) struct ShapeFmt<'a>(pub &'a [i64]);

impl fmt::Display for ShapeFmt<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[")?;
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                write!(f, ", ")?;
            }
            write!(f, "{d}")?;
        }
        write!(f, "]")
    }
}

/// Formats a list of keys as `["a", ("b", "c")]`.
pub(crate) fn fmt_keys(keys: &[String]) -> String {
    format!("[{}]", keys.join(", "))
}

/// Every error this crate returns.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    // === Keys ===
    /// A key was required but is absent.
    #[error("{op}: key {key} not found; available keys: {}", fmt_keys(available))]
    KeyNotFound {
        /// The operation that failed (`"get"`, `"set_"`, `"rename_key"`, …).
        op: &'static str,
        /// The missing key, displayed as a nested key.
        key: String,
        /// The keys that were present at the level where the lookup failed.
        available: Vec<String>,
    },
    /// A key that must be new already exists.
    #[error("{op}: key {key} already present")]
    KeyExists {
        /// The operation that failed.
        op: &'static str,
        /// The existing key.
        key: String,
    },
    /// A nested key walks through a leaf tensor (or a leaf spec) as if it were a level.
    #[error("{op}: key {key} walks through {at}, which is a leaf, not a nested level")]
    NotALevel {
        /// The operation that failed.
        op: &'static str,
        /// The full key requested.
        key: String,
        /// The prefix that is a leaf.
        at: String,
    },
    /// A key was expected to hold a leaf but holds a nested level (or the reverse).
    #[error("{op}: key {key} holds {found}, expected {expected}")]
    WrongEntryKind {
        /// The operation that failed.
        op: &'static str,
        /// The key.
        key: String,
        /// What was expected (`"a tensor"`, `"a tensordict"`).
        expected: &'static str,
        /// What was found.
        found: &'static str,
    },
    /// Two containers were combined but their key sets differ.
    #[error(
        "{op}: key sets differ; only in the first: {}, only in the second: {}",
        fmt_keys(only_first),
        fmt_keys(only_second)
    )]
    KeySetMismatch {
        /// The operation that failed.
        op: &'static str,
        /// Keys in the first operand and not the second.
        only_first: Vec<String>,
        /// Keys in the second operand and not the first.
        only_second: Vec<String>,
    },
    /// An empty key or a key segment that is not allowed.
    #[error("{op}: invalid key {key}: {reason}")]
    InvalidKey {
        /// The operation that failed.
        op: &'static str,
        /// The key.
        key: String,
        /// Why it is invalid.
        reason: String,
    },

    // === Shapes ===
    /// A value's leading dims do not match the container's batch size.
    #[error(
        "{op}: batch dimension mismatch for key {key}: batch size {} is not a prefix of shape {}",
        ShapeFmt(batch_size),
        ShapeFmt(shape)
    )]
    BatchSizeMismatch {
        /// The operation that failed.
        op: &'static str,
        /// The key of the offending value.
        key: String,
        /// The container's batch size.
        batch_size: Vec<i64>,
        /// The value's full shape.
        shape: Vec<i64>,
    },
    /// A shape differs from the one required.
    #[error(
        "{op}: shape mismatch for key {key}: expected {}, got {}",
        ShapeFmt(expected),
        ShapeFmt(actual)
    )]
    ShapeMismatch {
        /// The operation that failed.
        op: &'static str,
        /// The key involved (may be empty when no key applies).
        key: String,
        /// The shape that was required.
        expected: Vec<i64>,
        /// The shape that was given.
        actual: Vec<i64>,
    },
    /// A dtype differs from the one required.
    #[error("{op}: dtype mismatch for key {key}: expected {expected:?}, got {actual:?}")]
    DtypeMismatch {
        /// The operation that failed.
        op: &'static str,
        /// The key involved.
        key: String,
        /// The dtype that was required.
        expected: Kind,
        /// The dtype that was given.
        actual: Kind,
    },
    /// A device differs from the one required.
    #[error("{op}: device mismatch for key {key}: expected {expected:?}, got {actual:?}")]
    DeviceMismatch {
        /// The operation that failed.
        op: &'static str,
        /// The key involved.
        key: String,
        /// The required device.
        expected: Device,
        /// The device found.
        actual: Device,
    },
    /// A dimension or index is out of range.
    #[error("{op}: index {index} is out of range for {what} of size {size}")]
    IndexOutOfRange {
        /// The operation that failed.
        op: &'static str,
        /// The offending index or dim.
        index: i64,
        /// What was indexed (`"batch dim 0"`, `"batch dims"`, …).
        what: String,
        /// The size of what was indexed.
        size: i64,
    },

    // === Specs ===
    /// A value is not contained in a spec.
    #[error("{op}: value for key {key} is not in spec {spec}: {reason}")]
    NotInSpec {
        /// The operation that failed.
        op: &'static str,
        /// The key of the value.
        key: String,
        /// A short description of the spec.
        spec: String,
        /// Why the value is outside the spec.
        reason: String,
    },
    /// A container is locked and refuses mutation.
    #[error("{op}: cannot modify a locked {what} (key {key}); unlock it first")]
    Locked {
        /// The operation that failed.
        op: &'static str,
        /// What is locked (`"Composite"`, `"TensorDict"`).
        what: &'static str,
        /// The key that was about to change.
        key: String,
    },

    // === Arguments ===
    /// An argument is invalid for a reason the other variants do not cover.
    #[error("{op}: {message}")]
    InvalidArgument {
        /// The operation that failed.
        op: &'static str,
        /// What was wrong and what was expected.
        message: String,
    },

    // === I/O ===
    /// Reading or writing a file failed.
    #[error("{op}: I/O error on {path}: {source}")]
    Io {
        /// The operation that failed.
        op: &'static str,
        /// The file.
        path: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A file is not valid for the operation (a corrupt, truncated or foreign tensordict file;
    /// a checkpoint that does not fit the model).
    #[error("{op}: {path} is not valid here: {reason}")]
    InvalidFile {
        /// The operation that failed.
        op: &'static str,
        /// The file.
        path: String,
        /// What is wrong with it.
        reason: String,
    },

    // === Batched environments ===
    /// A worker of a batched environment failed (its env returned an error or panicked, or the
    /// worker thread is gone).
    #[error("{op}: worker {index} failed: {message}")]
    Worker {
        /// The operation that failed (`"reset"`, `"step"`, `"set_seed"`).
        op: &'static str,
        /// The index of the worker.
        index: usize,
        /// What the worker reported.
        message: String,
    },

    // === Distributed ===
    /// A collective of a `torchrl::distributed::ProcessGroup` (or its creation) failed: a peer
    /// vanished or did not arrive within the timeout, or c10d refused the call. `message` is
    /// what c10d said (it often names the peer's address).
    #[error("distributed {op} failed on rank {rank} of world size {world_size}: {message}")]
    Distributed {
        /// The operation (`"init"`, `"all_reduce"`, `"broadcast"`, `"all_gather"`, …).
        op: &'static str,
        /// This process's rank.
        rank: usize,
        /// The number of processes in the group.
        world_size: usize,
        /// What went wrong.
        message: String,
    },

    /// A value (a tensor at a key, a field of a call) is not what the operation requires.
    #[error("{op}: {what} {key}: expected {expected}, got {got}")]
    InvalidValue {
        /// The operation that failed.
        op: &'static str,
        /// What the key names (`"key"`, `"argument"`, `"field"`, `"token id"`).
        what: &'static str,
        /// The key, argument or field involved, as printed (`"reward"`, `("next", "obs")`).
        key: String,
        /// What was required.
        expected: String,
        /// What was given.
        got: String,
    },
    /// A configuration field is out of its range or inconsistent with another field; raised
    /// when a config is built or checked, before any computation.
    #[error("{op}: invalid config field {field}: expected {expected}, got {got}")]
    InvalidConfig {
        /// The config or builder that refused the value.
        op: &'static str,
        /// The field.
        field: &'static str,
        /// What is accepted.
        expected: String,
        /// What was given.
        got: String,
    },
    /// An inner error, with where it happened (which transform, which step, which stage).
    /// Built with [`Error::context`] or [`ResultExt::context`]; [`Error::root`] reaches the
    /// innermost error, [`Error::contexts`] lists the layers from the outermost.
    #[error("{context}: {source}")]
    Context {
        /// Where the inner error happened.
        context: String,
        /// The inner error.
        #[source]
        source: Box<Error>,
    },

    // === libtorch ===
    /// An error raised by libtorch through `tch`. Displayed with libtorch's first line only
    /// (its C++ frames and source locations stay in the wrapped [`tch::TchError`]).
    #[error("libtorch error: {}", torch_first_line(.0))]
    Torch(#[from] tch::TchError),
}

/// libtorch's message without its C++ backtrace: the first line, with a trailing
/// `(Exception raised from …)` location dropped.
fn torch_first_line(e: &tch::TchError) -> String {
    let text = e.to_string();
    let line = text.lines().next().unwrap_or_default();
    match line.find(" (Exception raised from") {
        Some(i) => line.get(..i).unwrap_or(line).to_string(),
        None => line.to_string(),
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl Error {
    /// Wraps this error with where it happened (candle's `Error::Context`): the message reads
    /// `"{context}: {inner message}"`, and [`Error::root`] still reaches the inner error.
    ///
    /// ```
    /// use torchrl::{Error, TensorDict};
    /// let td = TensorDict::new([2]).unwrap();
    /// let err = td.get_or_err("obs").unwrap_err().context("RewardScaling (transform 1)");
    /// assert!(err.to_string().starts_with("RewardScaling (transform 1): "));
    /// assert!(matches!(err.root(), Error::KeyNotFound { .. }));
    /// assert_eq!(err.contexts(), vec!["RewardScaling (transform 1)"]);
    /// ```
    pub fn context(self, context: impl Into<String>) -> Self {
        Error::Context {
            context: context.into(),
            source: Box::new(self),
        }
    }

    /// The innermost error under any [`Error::Context`] layers (the error itself when it has
    /// none).
    pub fn root(&self) -> &Error {
        let mut e = self;
        while let Error::Context { source, .. } = e {
            e = source;
        }
        e
    }

    /// The context layers, outermost first (empty when the error has none).
    pub fn contexts(&self) -> Vec<&str> {
        let mut out = Vec::new();
        let mut e = self;
        while let Error::Context { context, source } = e {
            out.push(context.as_str());
            e = source;
        }
        out
    }

    fn invalid_value(
        op: &'static str,
        what: &'static str,
        key: String,
        expected: String,
        got: String,
    ) -> Self {
        Error::InvalidValue {
            op,
            what,
            key,
            expected,
            got,
        }
    }

    /// Shorthand for [`Error::InvalidValue`] on a key.
    pub(crate) fn value(
        op: &'static str,
        key: impl fmt::Display,
        expected: impl Into<String>,
        got: impl Into<String>,
    ) -> Self {
        Self::invalid_value(op, "key", key.to_string(), expected.into(), got.into())
    }

    /// Shorthand for [`Error::InvalidConfig`].
    pub(crate) fn config(
        op: &'static str,
        field: &'static str,
        expected: impl Into<String>,
        got: impl fmt::Display,
    ) -> Self {
        Error::InvalidConfig {
            op,
            field,
            expected: expected.into(),
            got: got.to_string(),
        }
    }

    /// Shorthand for [`Error::InvalidValue`] on an argument of a call (`what: "argument"`).
    pub(crate) fn argument(
        op: &'static str,
        name: &str,
        expected: impl Into<String>,
        got: impl Into<String>,
    ) -> Self {
        Self::invalid_value(
            op,
            "argument",
            name.to_string(),
            expected.into(),
            got.into(),
        )
    }

    /// Shorthand for [`Error::InvalidArgument`].
    pub(crate) fn invalid(op: &'static str, message: impl Into<String>) -> Self {
        Error::InvalidArgument {
            op,
            message: message.into(),
        }
    }
}

/// `Ok` when `ok`, else the [`Error::InvalidConfig`] naming `field`, what is accepted and what
/// was given.
pub(crate) fn require(
    ok: bool,
    op: &'static str,
    field: &'static str,
    expected: impl Into<String>,
    got: impl std::fmt::Display,
) -> Result<()> {
    if ok {
        Ok(())
    } else {
        Err(Error::config(op, field, expected, got))
    }
}

/// `Ok(())` when `actual` is `expected`, else an [`Error::DtypeMismatch`] under `op` naming
/// `key` (allocated only on error).
#[inline]
pub(crate) fn ensure_kind(op: &'static str, key: &str, expected: Kind, actual: Kind) -> Result<()> {
    if actual == expected {
        return Ok(());
    }
    Err(Error::DtypeMismatch {
        op,
        key: key.to_string(),
        expected,
        actual,
    })
}

/// Returns early with an [`Error::InvalidArgument`] when the condition is false.
macro_rules! ensure {
    ($cond:expr, $op:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err($crate::Error::invalid($op, format!($($fmt)+)));
        }
    };
}
pub(crate) use ensure;

/// Adds context to the error of a [`Result`] on its way up (as candle's and anyhow's
/// `Context`): `env.step(td).context("step 17")?`.
///
/// ```
/// use torchrl::error::ResultExt;
/// use torchrl::{Error, TensorDict};
/// let td = TensorDict::new([2]).unwrap();
/// let err = td.get_or_err("obs").with_context(|| format!("step {}", 3)).unwrap_err();
/// assert!(err.to_string().starts_with("step 3: "));
/// assert!(matches!(err.root(), Error::KeyNotFound { .. }));
/// ```
pub trait ResultExt<T> {
    /// Wraps an error with `context`.
    fn context(self, context: impl Into<String>) -> Result<T>;
    /// Wraps an error with the context `f` returns (built only on error).
    fn with_context<S: Into<String>>(self, f: impl FnOnce() -> S) -> Result<T>;
}

impl<T, E: Into<Error>> ResultExt<T> for std::result::Result<T, E> {
    fn context(self, context: impl Into<String>) -> Result<T> {
        self.map_err(|e| e.into().context(context))
    }

    fn with_context<S: Into<String>>(self, f: impl FnOnce() -> S) -> Result<T> {
        self.map_err(|e| e.into().context(f()))
    }
}

/// The path (`train.batch_size`, `model.vocab[3]`) of the JSON value at 1-based `line` and
/// `column` of `text` (where `serde_json` reports an error), so that an error can name the
/// field and not only the type; `"<root>"` at the top level.
pub(crate) fn json_path_at(text: &str, line: usize, column: usize) -> String {
    enum Frame {
        Object(Option<String>),
        Array(usize),
    }
    // the byte offset of (line, column)
    let mut offset = 0;
    for (i, l) in text.split_inclusive('\n').enumerate() {
        if i + 1 == line {
            offset += column.min(l.len());
            break;
        }
        offset += l.len();
    }
    let mut stack: Vec<Frame> = Vec::new();
    let mut expect_key = false;
    let mut chars = text.char_indices().peekable();
    while let Some((at, c)) = chars.next() {
        if at >= offset {
            break;
        }
        match c {
            '{' => {
                stack.push(Frame::Object(None));
                expect_key = true;
            }
            '[' => stack.push(Frame::Array(0)),
            '}' | ']' => {
                stack.pop();
            }
            ',' => match stack.last_mut() {
                Some(Frame::Object(_)) => expect_key = true,
                Some(Frame::Array(i)) => *i += 1,
                None => {}
            },
            '"' => {
                let mut s = String::new();
                while let Some((_, c)) = chars.next() {
                    match c {
                        '\\' => {
                            chars.next();
                        }
                        '"' => break,
                        c => s.push(c),
                    }
                }
                if expect_key {
                    if let Some(Frame::Object(key)) = stack.last_mut() {
                        *key = Some(s);
                    }
                    expect_key = false;
                }
            }
            _ => {}
        }
    }
    let mut path = String::new();
    for frame in &stack {
        match frame {
            Frame::Object(Some(k)) => {
                if !path.is_empty() {
                    path.push('.');
                }
                path.push_str(k);
            }
            Frame::Object(None) => {}
            Frame::Array(i) => path.push_str(&format!("[{i}]")),
        }
    }
    if path.is_empty() {
        "<root>".into()
    } else {
        path
    }
}

/// The `section.key` of the TOML line holding byte `offset` of `text` (where a TOML error
/// points), or `None` when the line is not `key = value`.
pub(crate) fn toml_path_at(text: &str, offset: usize) -> Option<String> {
    let before = text.get(..offset.min(text.len()))?;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let line = text.get(line_start..)?.lines().next()?;
    let key = line.split_once('=')?.0.trim().trim_matches('"');
    let section = before
        .get(..line_start)?
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| l.starts_with('['))
        .map(|l| l.trim_matches(|c| c == '[' || c == ']').trim().to_string());
    Some(match section {
        Some(s) if !s.is_empty() => format!("{s}.{key}"),
        _ => key.to_string(),
    })
}
