//! Chat templates: the Jinja template of a Hugging Face model folder rendered in pure Rust
//! (through `minijinja`) as `transformers`' `tokenizer.apply_chat_template` renders it, and
//! the assistant-token masks SFT trains on.
//!
//! [`ChatTemplate`] compiles a template in an environment configured like the one
//! `transformers` builds in `chat_template_utils.py`: `trim_blocks` and `lstrip_blocks` on,
//! loop controls (`{% break %}`, `{% continue %}`), the `raise_exception(msg)` and
//! `strftime_now(fmt)` globals, a `tojson` filter that writes what Python's `json.dumps`
//! writes (`ensure_ascii=False` by default, `indent`, `separators`, `sort_keys`), the
//! `{% generation %}…{% endgeneration %}` tag, and Python's string / dict methods
//! (`.strip()`, `.startswith()`, `.split()`, `.items()`, `.get()`, … from
//! `minijinja-contrib`'s `pycompat`). The template sees `messages`, `add_generation_prompt`,
//! `tools` and `documents` (both `none`), and the named special tokens (`bos_token`,
//! `eos_token`, …) that are set, as `transformers` passes them.
//!
//! ```
//! use torchrl::data::llm::{ChatTemplate, Message};
//! # fn main() -> torchrl::Result<()> {
//! let source = "{% for m in messages %}<|{{ m.role }}|>{{ m.content | trim }}{{ eos_token }}\n{% endfor %}\
//! {% if add_generation_prompt %}<|assistant|>{% endif %}";
//! let chat = ChatTemplate::new(source, None, Some("</s>"))?;
//! let messages = [Message::new("user", "  Hi!  ")];
//! assert_eq!(chat.render(&messages, false)?, "<|user|>Hi!</s>\n");
//! assert_eq!(chat.render(&messages, true)?, "<|user|>Hi!</s>\n<|assistant|>");
//! # Ok(()) }
//! ```
//!
//! A template comes from the Hub, so it is treated as hostile input: rendering runs under a
//! fuel budget ([`MAX_FUEL`] instructions), a recursion limit ([`MAX_RECURSION`]) and an
//! output cap ([`MAX_OUTPUT_BYTES`]); any of them ends the render with an error, never a hang
//! or an abort.
//!
//! Differences from `transformers` that remain:
//! - messages are [`Message`]s (`role`, `content` strings): no `tool_calls`, content lists or
//!   `tools=` / `documents=` values (both are `none`);
//! - `strftime_now` formats the current time in UTC (Python uses the local time zone);
//! - Python features `minijinja` lacks are errors (`%` string formatting, most list methods),
//!   and a list or dict printed as such uses `minijinja`'s quoting (`["a"]`, Python `['a']`);
//! - `{% generation %}` tags are found in the source text (as `transformers` looks for them),
//!   so one inside a string literal is rewritten too; a generation block whose output the
//!   template transforms afterwards (`{% filter trim %}` around it) is refused for masks;
//! - fuel bounds the work but not the memory: a template can still build a huge string by
//!   repeated concatenation (`minijinja` has no allocation limit).

use std::path::Path;

use minijinja::value::{Value, ValueKind};
use minijinja::{Environment, ErrorKind, State, UndefinedBehavior};

use super::Message;
use crate::error::{Error, Result};
use crate::modules::llm::TextTokenizer;

mod strftime;
mod tojson;

use strftime::strftime_now;
use tojson::tojson_filter;

/// The most template instructions one render may execute (`minijinja`'s fuel): a template
/// that loops without end (`range` nested in `range`) stops with an error. A ChatML render
/// spends a few dozen per message.
pub const MAX_FUEL: u64 = 10_000_000;

/// The deepest nesting of macro calls and includes a render may reach.
pub const MAX_RECURSION: usize = 100;

/// The longest text a render may produce, in bytes.
pub const MAX_OUTPUT_BYTES: usize = 64 << 20;

/// The named special tokens `transformers` passes to a template when they are set
/// (`special_tokens_map`).
pub const SPECIAL_TOKEN_NAMES: [&str; 7] = [
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
];

/// Marks the start of a `{% generation %}` block's output in a tracked render.
const GEN_OPEN: char = '\u{10FFFC}';
/// Marks its end.
const GEN_CLOSE: char = '\u{10FFFD}';

const PLAIN: &str = "chat";
const TRACKED: &str = "chat_tracked";
const GEN_FILTER_PLAIN: &str = "__torchrl_generation_plain";
const GEN_FILTER_TRACKED: &str = "__torchrl_generation_tracked";

/// A compiled chat template and the special tokens it is rendered with.
///
/// Build it from a template string with [`ChatTemplate::new`] or from a model folder with
/// [`ChatTemplate::from_model_dir`]; [`ChatTemplate::render`] gives the text,
/// [`ChatTemplate::encode`] the ids and [`ChatTemplate::encode_with_assistant_mask`] the ids
/// with a mask that is true on the tokens of the assistant turns.
///
/// ```
/// use torchrl::data::llm::{ChatTemplate, Message};
/// use torchrl::modules::llm::ByteTokenizer;
/// # fn main() -> torchrl::Result<()> {
/// let chat = ChatTemplate::new(
///     "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}",
///     None,
///     None,
/// )?;
/// let messages = [Message::new("user", "hi"), Message::new("assistant", "yo")];
/// let (ids, mask) = chat.encode_with_assistant_mask(&ByteTokenizer::new(), &messages)?;
/// assert_eq!(ids.len(), "user: hi\nassistant: yo\n".len());
/// // the assistant turn runs from where its prompt ends to the end of its render
/// let masked: Vec<u8> = ids.iter().zip(&mask).filter(|(_, m)| **m).map(|(i, _)| *i as u8).collect();
/// assert_eq!(masked, b"assistant: yo\n");
/// # Ok(()) }
/// ```
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    origin: String,
    special: Vec<(String, String)>,
    has_generation: bool,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("origin", &self.origin)
            .field("special", &self.special)
            .field("has_generation", &self.has_generation)
            .field("source_bytes", &self.source.len())
            .finish()
    }
}

/// What `raise_exception` attaches to the error it returns, so that the render can report
/// the template's own message.
#[derive(Debug)]
struct Raised {
    message: String,
    at: Option<String>,
}

impl std::fmt::Display for Raised {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Raised {}

/// An `io::Write` that refuses to grow past [`MAX_OUTPUT_BYTES`].
struct CappedWriter {
    buf: Vec<u8>,
}

impl std::io::Write for CappedWriter {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        if self.buf.len().saturating_add(data.len()) > MAX_OUTPUT_BYTES {
            return Err(std::io::Error::other(format!(
                "the rendered text exceeds {MAX_OUTPUT_BYTES} bytes"
            )));
        }
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Rewrites `{% generation %}` / `{% endgeneration %}` (with their whitespace controls) into a
/// `{% filter %}` block of the filter `filter`, keeping the line structure; the number of tags
/// rewritten.
fn rewrite_generation(source: &str, filter: &str) -> (String, usize) {
    // the patterns are constant and valid
    let (Ok(open), Ok(close)) = (
        regex::Regex::new(r"\{%([-+]?)(\s*)generation(\s*)([-+]?)%\}"),
        regex::Regex::new(r"\{%([-+]?)(\s*)endgeneration(\s*)([-+]?)%\}"),
    ) else {
        return (source.to_string(), 0);
    };
    let count = open.find_iter(source).count();
    let with_open = open.replace_all(source, |c: &regex::Captures<'_>| {
        format!(
            "{{%{} {}filter {filter}{} {}%}}",
            &c[1], &c[2], &c[3], &c[4]
        )
    });
    let out = close.replace_all(&with_open, |c: &regex::Captures<'_>| {
        format!("{{%{} {}endfilter{} {}%}}", &c[1], &c[2], &c[3], &c[4])
    });
    (out.into_owned(), count)
}

/// Where a `raise_exception` happened: the message being rendered, found from the loop
/// variable the template uses (`message`, `msg`, …) and `loop.index0`.
fn locate(state: &State<'_, '_>) -> Option<String> {
    let messages = state.lookup("messages")?;
    let n = messages.len()?;
    let current = ["message", "msg", "m", "turn", "item"]
        .iter()
        .filter_map(|name| state.lookup(name))
        .find(|v| v.kind() == ValueKind::Map)?;
    let candidates: Vec<usize> = (0..n)
        .filter(|&j| messages.get_item_by_index(j).is_ok_and(|m| m == current))
        .collect();
    // the loop may run over a slice of the messages (`messages[1:]`): guess the offset
    let guess = state.lookup("loop").and_then(|l| {
        let i = l.get_attr("index0").ok()?.as_usize()?;
        let len = l.get_attr("length").ok()?.as_usize()?;
        Some(i + n.saturating_sub(len))
    });
    let index = match guess {
        Some(g) => candidates.iter().copied().min_by_key(|&j| j.abs_diff(g))?,
        None => *candidates.first()?,
    };
    let role = current
        .get_attr("role")
        .ok()
        .and_then(|r| r.as_str().map(str::to_string));
    Some(match role {
        Some(role) => format!("message {index} (role {role:?})"),
        None => format!("message {index}"),
    })
}

/// The environment a chat template renders in (see the module docs).
fn build_env(source: &str, origin: &str, has_generation: bool) -> Result<Environment<'static>> {
    let mut env = Environment::new();
    let syntax = minijinja::syntax::SyntaxConfig::builder()
        .trim_blocks(true)
        .lstrip_blocks(true)
        .keep_trailing_newline(false)
        .build()
        .map_err(|e| {
            Error::invalid(
                "ChatTemplate::new",
                format!("template syntax settings: {e}"),
            )
        })?;
    env.set_syntax(syntax);
    env.set_undefined_behavior(UndefinedBehavior::Lenient);
    env.set_fuel(Some(MAX_FUEL));
    env.set_recursion_limit(MAX_RECURSION);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    // Python prints None / True / False
    env.set_formatter(|out, state, value| match value.kind() {
        ValueKind::None => out.write_str("None").map_err(minijinja::Error::from),
        ValueKind::Bool => out
            .write_str(if value.is_true() { "True" } else { "False" })
            .map_err(minijinja::Error::from),
        _ => minijinja::escape_formatter(out, state, value),
    });
    env.add_filter("tojson", tojson_filter);
    env.add_function(
        "raise_exception",
        |state: &State<'_, '_>,
         message: Option<Value>|
         -> std::result::Result<Value, minijinja::Error> {
            let message = message.map(|m| m.to_string()).unwrap_or_default();
            let raised = Raised {
                message: message.clone(),
                at: locate(state),
            };
            Err(minijinja::Error::new(ErrorKind::InvalidOperation, message).with_source(raised))
        },
    );
    env.add_function("strftime_now", |fmt: String| strftime_now(&fmt));
    env.add_filter(GEN_FILTER_PLAIN, |body: String| body);
    env.add_filter(GEN_FILTER_TRACKED, |body: String| {
        format!("{GEN_OPEN}{body}{GEN_CLOSE}")
    });
    let syntax = |e: minijinja::Error| Error::InvalidFile {
        op: "ChatTemplate::new",
        path: origin.to_string(),
        reason: match e.line() {
            Some(line) => format!(
                "the chat template does not compile: line {line}: {}",
                e.detail().unwrap_or(&e.kind().to_string())
            ),
            None => format!("the chat template does not compile: {e}"),
        },
    };
    if has_generation {
        let (plain, _) = rewrite_generation(source, GEN_FILTER_PLAIN);
        let (tracked, _) = rewrite_generation(source, GEN_FILTER_TRACKED);
        env.add_template_owned(PLAIN, plain).map_err(syntax)?;
        env.add_template_owned(TRACKED, tracked).map_err(syntax)?;
    } else {
        env.add_template_owned(PLAIN, source.to_string())
            .map_err(syntax)?;
    }
    Ok(env)
}

/// A tokenizer_config.json token field: a string or an AddedToken object `{"content": …}`.
fn token_field(v: &serde_json::Value) -> Option<String> {
    match v {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Object(o) => o.get("content")?.as_str().map(str::to_string),
        _ => None,
    }
}

impl ChatTemplate {
    /// Compiles the Jinja template `source`, rendered with `bos_token` / `eos_token` when
    /// given (a template that uses one that is not given sees it undefined, which prints
    /// empty, as `transformers` does for a tokenizer without it).
    ///
    /// A template that does not compile is an [`Error::InvalidFile`] on `"template"` naming
    /// the line.
    ///
    /// ```
    /// use torchrl::data::llm::{ChatTemplate, Message};
    /// # fn main() -> torchrl::Result<()> {
    /// let chat = ChatTemplate::new("{{ bos_token }}{{ messages[0].content }}", Some("<s>"), None)?;
    /// assert_eq!(chat.render(&[Message::new("user", "hi")], false)?, "<s>hi");
    /// let err = ChatTemplate::new("line one\n{% if %}", None, None).unwrap_err();
    /// assert!(err.to_string().contains("line 2"), "{err}");
    /// # Ok(()) }
    /// ```
    pub fn new(source: &str, bos_token: Option<&str>, eos_token: Option<&str>) -> Result<Self> {
        let mut special = Vec::new();
        if let Some(b) = bos_token {
            special.push(("bos_token".to_string(), b.to_string()));
        }
        if let Some(e) = eos_token {
            special.push(("eos_token".to_string(), e.to_string()));
        }
        Self::compile(source, "template".into(), special)
    }

    fn compile(source: &str, origin: String, special: Vec<(String, String)>) -> Result<Self> {
        let (_, tags) = rewrite_generation(source, GEN_FILTER_PLAIN);
        let has_generation = tags > 0;
        if has_generation && source.contains([GEN_OPEN, GEN_CLOSE]) {
            return Err(Error::InvalidFile {
                op: "ChatTemplate::new",
                path: origin,
                reason: format!(
                    "the chat template contains the characters U+{:X} / U+{:X}, which the \
                     generation-tag tracking reserves",
                    GEN_OPEN as u32, GEN_CLOSE as u32
                ),
            });
        }
        let env = build_env(source, &origin, has_generation)?;
        Ok(ChatTemplate {
            env,
            source: source.to_string(),
            origin,
            special,
            has_generation,
        })
    }

    /// Reads the chat template of a Hugging Face model folder: `chat_template.jinja` when
    /// present, else the `chat_template` field of `tokenizer_config.json` (a string, or a
    /// list of `{"name", "template"}` of which the one named `"default"` is taken), with the
    /// named special tokens (`bos_token`, `eos_token`, `unk_token`, `sep_token`, `pad_token`,
    /// `cls_token`, `mask_token`; a string or an AddedToken object) of `tokenizer_config.json`.
    ///
    /// A folder without a template is an [`Error::InvalidFile`] naming the files looked at.
    ///
    /// ```
    /// use torchrl::data::llm::{ChatTemplate, Message};
    /// # fn main() -> torchrl::Result<()> {
    /// let dir = std::env::temp_dir().join(format!("torchrl-chat-doc-{}", std::process::id()));
    /// std::fs::create_dir_all(&dir).unwrap();
    /// std::fs::write(
    ///     dir.join("tokenizer_config.json"),
    ///     r#"{"eos_token": {"content": "</s>"}, "chat_template": "{{ messages[0].content }}{{ eos_token }}"}"#,
    /// ).unwrap();
    /// let chat = ChatTemplate::from_model_dir(&dir)?;
    /// assert_eq!(chat.render(&[Message::new("user", "hi")], false)?, "hi</s>");
    /// std::fs::remove_file(dir.join("tokenizer_config.json")).unwrap();
    /// let err = ChatTemplate::from_model_dir(&dir).unwrap_err();
    /// assert!(err.to_string().contains("chat_template.jinja"), "{err}");
    /// # std::fs::remove_dir_all(&dir).unwrap();
    /// # Ok(()) }
    /// ```
    pub fn from_model_dir(dir: impl AsRef<Path>) -> Result<Self> {
        let op = "ChatTemplate::from_model_dir";
        let dir = dir.as_ref();
        let jinja = dir.join("chat_template.jinja");
        let config_path = dir.join("tokenizer_config.json");
        let read = |path: &Path| {
            std::fs::read_to_string(path).map_err(|source| Error::Io {
                op,
                path: path.display().to_string(),
                source,
            })
        };
        let config: Option<serde_json::Value> = if config_path.is_file() {
            let text = read(&config_path)?;
            Some(serde_json::from_str(&text).map_err(|e| Error::InvalidFile {
                op,
                path: config_path.display().to_string(),
                reason: format!("not JSON: {e}"),
            })?)
        } else {
            None
        };
        let mut special = Vec::new();
        if let Some(cfg) = &config {
            for name in SPECIAL_TOKEN_NAMES {
                if let Some(tok) = cfg.get(name).and_then(token_field) {
                    special.push((name.to_string(), tok));
                }
            }
        }
        if jinja.is_file() {
            let source = read(&jinja)?;
            return Self::compile(&source, jinja.display().to_string(), special);
        }
        let field = config.as_ref().and_then(|c| c.get("chat_template"));
        let origin = format!("{} (chat_template)", config_path.display());
        let invalid = |reason: String| Error::InvalidFile {
            op,
            path: config_path.display().to_string(),
            reason,
        };
        let source = match field {
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(serde_json::Value::Array(list)) => {
                let named: Vec<(Option<&str>, Option<&str>)> = list
                    .iter()
                    .map(|t| {
                        (
                            t.get("name").and_then(serde_json::Value::as_str),
                            t.get("template").and_then(serde_json::Value::as_str),
                        )
                    })
                    .collect();
                match named.iter().find(|(n, _)| *n == Some("default")) {
                    Some((_, Some(t))) => t.to_string(),
                    Some((_, None)) => {
                        return Err(invalid(
                            "chat_template: the \"default\" entry has no string \"template\""
                                .into(),
                        ))
                    }
                    None => {
                        let names: Vec<&str> = named.iter().filter_map(|(n, _)| *n).collect();
                        return Err(invalid(format!(
                            "chat_template: a list of named templates without one named \"default\" \
                             (names: {names:?})"
                        )));
                    }
                }
            }
            Some(other) => {
                return Err(invalid(format!(
                "chat_template: expected a string or a list of {{\"name\", \"template\"}}, got {}",
                match other {
                    serde_json::Value::Null => "null",
                    serde_json::Value::Bool(_) => "a boolean",
                    serde_json::Value::Number(_) => "a number",
                    serde_json::Value::Object(_) => "an object",
                    _ => "another value",
                }
            )))
            }
            None => {
                return Err(Error::InvalidFile {
                    op,
                    path: dir.display().to_string(),
                    reason: format!(
                        "no chat template: looked for {} and the \"chat_template\" field of {}{}",
                        jinja.display(),
                        config_path.display(),
                        if config.is_none() { " (absent)" } else { "" }
                    ),
                })
            }
        };
        Self::compile(&source, origin, special)
    }

    /// Sets (or replaces) a named variable the template sees, such as `pad_token` or
    /// `unk_token`, as `transformers` passes its special tokens and `apply_chat_template`'s
    /// extra keyword arguments.
    ///
    /// ```
    /// use torchrl::data::llm::{ChatTemplate, Message};
    /// # fn main() -> torchrl::Result<()> {
    /// let chat = ChatTemplate::new("{{ pad_token }}", None, None)?.with_special_token("pad_token", "<pad>");
    /// assert_eq!(chat.render(&[], false)?, "<pad>");
    /// # Ok(()) }
    /// ```
    pub fn with_special_token(mut self, name: &str, value: &str) -> Self {
        self.special.retain(|(n, _)| n != name);
        self.special.push((name.to_string(), value.to_string()));
        self
    }

    /// The template source as given (before the generation-tag rewrite).
    ///
    /// ```
    /// use torchrl::data::llm::ChatTemplate;
    /// assert_eq!(ChatTemplate::new("x", None, None).unwrap().source(), "x");
    /// ```
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The value of a special-token variable (`"bos_token"`, `"eos_token"`, …), if set.
    ///
    /// ```
    /// use torchrl::data::llm::ChatTemplate;
    /// let chat = ChatTemplate::new("x", Some("<s>"), None).unwrap();
    /// assert_eq!(chat.special_token("bos_token"), Some("<s>"));
    /// assert_eq!(chat.special_token("eos_token"), None);
    /// ```
    pub fn special_token(&self, name: &str) -> Option<&str> {
        self.special
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// Whether the template marks the assistant replies with `{% generation %}` blocks (then
    /// [`ChatTemplate::encode_with_assistant_mask`] follows them, as `transformers`'
    /// `return_assistant_tokens_mask`).
    ///
    /// ```
    /// use torchrl::data::llm::ChatTemplate;
    /// let chat = ChatTemplate::new("{% generation %}x{% endgeneration %}", None, None).unwrap();
    /// assert!(chat.has_generation_tags());
    /// ```
    pub fn has_generation_tags(&self) -> bool {
        self.has_generation
    }

    fn context(&self, messages: &[Message], add_generation_prompt: bool) -> Value {
        let msgs: Vec<Value> = messages
            .iter()
            .map(|m| {
                Value::from_pairs([
                    ("role", Value::from(m.role.as_str())),
                    ("content", Value::from(m.content.as_str())),
                ])
            })
            .collect();
        let mut pairs: Vec<(String, Value)> = self
            .special
            .iter()
            .map(|(k, v)| (k.clone(), Value::from(v.as_str())))
            .collect();
        pairs.push(("messages".into(), Value::from(msgs)));
        pairs.push(("tools".into(), Value::from(())));
        pairs.push(("documents".into(), Value::from(())));
        pairs.push((
            "add_generation_prompt".into(),
            Value::from(add_generation_prompt),
        ));
        Value::from_pairs(pairs)
    }

    fn render_named(
        &self,
        name: &str,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<String> {
        let op = "ChatTemplate::render";
        let tmpl = self
            .env
            .get_template(name)
            .map_err(|e| Error::invalid(op, format!("{} is not compiled: {e}", self.origin)))?;
        let mut writer = CappedWriter { buf: Vec::new() };
        let ctx = self.context(messages, add_generation_prompt);
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            tmpl.render_captured_to(ctx, &mut writer).map(|_| ())
        }));
        match result {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(self.render_error(&e)),
            Err(_) => {
                return Err(Error::invalid(
                    op,
                    format!("the template engine panicked rendering {}", self.origin),
                ))
            }
        }
        String::from_utf8(writer.buf)
            .map_err(|e| Error::invalid(op, format!("the rendered text is not UTF-8: {e}")))
    }

    fn render_error(&self, e: &minijinja::Error) -> Error {
        let op = "ChatTemplate::render";
        let line = e
            .line()
            .map(|l| format!(" (line {l} of {})", self.origin))
            .unwrap_or_else(|| format!(" ({})", self.origin));
        let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
        while let Some(s) = source {
            if let Some(raised) = s.downcast_ref::<Raised>() {
                let at = raised
                    .at
                    .as_ref()
                    .map(|a| format!(" at {a}"))
                    .unwrap_or_default();
                return Error::invalid(
                    op,
                    format!(
                        "the chat template raised an exception{at}: {}{line}",
                        raised.message
                    ),
                );
            }
            source = s.source();
        }
        let detail = match e.detail() {
            Some(d) => format!("{}: {d}", e.kind()),
            None => e.kind().to_string(),
        };
        Error::invalid(op, format!("the chat template failed: {detail}{line}"))
    }

    /// The text of `messages` (with the assistant prompt appended when
    /// `add_generation_prompt`), as `apply_chat_template(messages, tokenize=False,
    /// add_generation_prompt=…)` gives it.
    ///
    /// An exception the template raises (`raise_exception`) is an [`Error::InvalidArgument`]
    /// with the template's message and, when it can be told, the index and role of the
    /// message being rendered.
    ///
    /// ```
    /// use torchrl::data::llm::{ChatTemplate, Message};
    /// # fn main() -> torchrl::Result<()> {
    /// let chat = ChatTemplate::new(
    ///     "{% for message in messages %}{% if message.role == 'tool' %}\
    ///      {{ raise_exception('no tools here') }}{% endif %}{{ message.content }}{% endfor %}",
    ///     None,
    ///     None,
    /// )?;
    /// assert_eq!(chat.render(&[Message::new("user", "a")], false)?, "a");
    /// let err = chat.render(&[Message::new("user", "a"), Message::new("tool", "b")], false).unwrap_err();
    /// let text = err.to_string();
    /// assert!(text.contains("no tools here") && text.contains("message 1"), "{text}");
    /// # Ok(()) }
    /// ```
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        self.render_named(PLAIN, messages, add_generation_prompt)
    }

    /// The ids of the rendered text, tokenized as `transformers` does after rendering (no
    /// special tokens added: the template writes them); `apply_chat_template(messages,
    /// tokenize=True, add_generation_prompt=…)`.
    ///
    /// ```
    /// use torchrl::data::llm::{ChatTemplate, Message};
    /// use torchrl::modules::llm::ByteTokenizer;
    /// # fn main() -> torchrl::Result<()> {
    /// let chat = ChatTemplate::new("{{ messages[0].content }}{{ eos_token }}", None, Some("<|endoftext|>"))?;
    /// let ids = chat.encode(&ByteTokenizer::new(), &[Message::new("user", "hi")], false)?;
    /// assert_eq!(ids, vec![104, 105, ByteTokenizer::EOS]);
    /// # Ok(()) }
    /// ```
    pub fn encode(
        &self,
        tok: &dyn TextTokenizer,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<Vec<i64>> {
        tok.encode(&self.render(messages, add_generation_prompt)?)
    }

    /// The byte spans (in the rendered text, without generation prompt) of the assistant
    /// turns, and that text.
    ///
    /// With `{% generation %}` blocks: the spans of their output, as `transformers` records
    /// them. Without: for each assistant message `i`, from the end of the render of
    /// `messages[..i]` with the generation prompt to the end of the render of
    /// `messages[..=i]`; both must be prefixes of the full render (else an error saying the
    /// template is not prefix-stable).
    ///
    /// ```
    /// use torchrl::data::llm::{ChatTemplate, Message};
    /// # fn main() -> torchrl::Result<()> {
    /// let chat = ChatTemplate::new(
    ///     "{% for m in messages %}<{{ m.role }}>{{ m.content }}</s>{% endfor %}\
    ///      {% if add_generation_prompt %}<assistant>{% endif %}",
    ///     None,
    ///     None,
    /// )?;
    /// let msgs = [Message::new("user", "q"), Message::new("assistant", "a")];
    /// let (text, spans) = chat.assistant_spans(&msgs)?;
    /// assert_eq!(text, "<user>q</s><assistant>a</s>");
    /// assert_eq!(spans.iter().map(|s| &text[s.clone()]).collect::<Vec<_>>(), vec!["a</s>"]);
    /// # Ok(()) }
    /// ```
    pub fn assistant_spans(
        &self,
        messages: &[Message],
    ) -> Result<(String, Vec<std::ops::Range<usize>>)> {
        let op = "ChatTemplate::assistant_spans";
        if self.has_generation {
            for (i, m) in messages.iter().enumerate() {
                if m.role.contains([GEN_OPEN, GEN_CLOSE])
                    || m.content.contains([GEN_OPEN, GEN_CLOSE])
                {
                    return Err(Error::value(
                        op,
                        format!("messages[{i}]"),
                        format!(
                            "text without U+{:X} / U+{:X} (reserved for generation-tag tracking)",
                            GEN_OPEN as u32, GEN_CLOSE as u32
                        ),
                        "a message containing them",
                    ));
                }
            }
            if self
                .special
                .iter()
                .any(|(_, v)| v.contains([GEN_OPEN, GEN_CLOSE]))
            {
                return Err(Error::invalid(
                    op,
                    "a special token contains the characters reserved for generation-tag tracking",
                ));
            }
            let marked = self.render_named(TRACKED, messages, false)?;
            let mut text = String::with_capacity(marked.len());
            let mut spans = Vec::new();
            let mut open: Vec<usize> = Vec::new();
            for c in marked.chars() {
                match c {
                    GEN_OPEN => open.push(text.len()),
                    GEN_CLOSE => match open.pop() {
                        Some(start) => spans.push(start..text.len()),
                        None => {
                            return Err(Error::invalid(
                                op,
                                "unbalanced generation markers in the rendered text",
                            ))
                        }
                    },
                    c => text.push(c),
                }
            }
            if !open.is_empty() {
                return Err(Error::invalid(
                    op,
                    "unbalanced generation markers in the rendered text",
                ));
            }
            // a generation block whose output the template transforms afterwards (captured
            // in a `{% set %}` / `{% filter %}` block and trimmed, measured, …) renders
            // differently with the markers in it: refuse rather than mask the wrong text
            if text != self.render(messages, false)? {
                return Err(Error::invalid(
                    op,
                    format!(
                        "the {{% generation %}} blocks of the chat template ({}) cannot be tracked: \
                         their output is transformed after rendering (inside a set / filter \
                         block or a macro's return value)",
                        self.origin
                    ),
                ));
            }
            spans.sort_by_key(|s| (s.start, s.end));
            return Ok((text, spans));
        }
        let full = self.render(messages, false)?;
        let mut spans = Vec::new();
        for (i, m) in messages.iter().enumerate() {
            if m.role != "assistant" {
                continue;
            }
            let (before, through) = (
                messages.get(..i).unwrap_or_default(),
                messages.get(..=i).unwrap_or_default(),
            );
            let prompt = self.render(before, true).map_err(|e| {
                e.context(format!(
                    "{op}: rendering messages[..{i}] with the generation prompt"
                ))
            })?;
            let upto = self
                .render(through, false)
                .map_err(|e| e.context(format!("{op}: rendering messages[..={i}]")))?;
            if !full.starts_with(&upto) || !upto.starts_with(&prompt) {
                let which = if full.starts_with(&prompt) {
                    format!("the render of messages[..={i}]")
                } else {
                    format!("the render of messages[..{i}] with the generation prompt")
                };
                return Err(Error::invalid(
                    op,
                    format!(
                        "the chat template ({}) is not prefix-stable: {which} is not a prefix of the \
                         render of the whole conversation, so the tokens of assistant message {i} \
                         cannot be told apart; use a template with {{% generation %}} blocks",
                        self.origin
                    ),
                ));
            }
            spans.push(prompt.len()..upto.len());
        }
        Ok((full, spans))
    }

    /// The ids of the rendered conversation (no generation prompt) and a mask that is true on
    /// the tokens of the assistant turns, for SFT losses that train on the replies only.
    ///
    /// A token is in the mask when its offsets overlap an assistant span (see
    /// [`ChatTemplate::assistant_spans`]), as `transformers` builds `assistant_masks` from
    /// `return_assistant_tokens_mask=True`. Needs a tokenizer that reports offsets
    /// ([`TextTokenizer::encode_with_offsets`]).
    ///
    /// ```
    /// use torchrl::data::llm::{ChatTemplate, Message};
    /// use torchrl::modules::llm::ByteTokenizer;
    /// # fn main() -> torchrl::Result<()> {
    /// let chat = ChatTemplate::new(
    ///     "{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}{{ m.content }}\
    ///      {% endgeneration %}{% else %}{{ m.content }}{% endif %}{% endfor %}",
    ///     None,
    ///     None,
    /// )?;
    /// let msgs = [Message::new("user", "ab"), Message::new("assistant", "c")];
    /// let (ids, mask) = chat.encode_with_assistant_mask(&ByteTokenizer::new(), &msgs)?;
    /// assert_eq!(ids, vec![97, 98, 99]);
    /// assert_eq!(mask, vec![false, false, true]);
    /// # Ok(()) }
    /// ```
    pub fn encode_with_assistant_mask(
        &self,
        tok: &dyn TextTokenizer,
        messages: &[Message],
    ) -> Result<(Vec<i64>, Vec<bool>)> {
        let (text, spans) = self.assistant_spans(messages)?;
        let (ids, offsets) = tok.encode_with_offsets(&text)?;
        let mut mask = vec![false; ids.len()];
        let mut s = 0;
        for (slot, &(start, end)) in mask.iter_mut().zip(&offsets) {
            while spans.get(s).is_some_and(|span| start >= span.end) {
                s += 1;
            }
            let Some(span) = spans.get(s) else { break };
            if end > span.start {
                *slot = true;
            }
        }
        Ok((ids, mask))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generation_rewrite_keeps_lines() {
        let (out, n) = rewrite_generation("a{%- generation\n%}b{% endgeneration -%}", "f");
        assert_eq!(n, 1);
        assert_eq!(out.lines().count(), 2);
        assert!(out.contains("filter f") && out.contains("endfilter"));
    }
}
