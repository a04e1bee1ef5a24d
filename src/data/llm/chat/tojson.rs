//! The `tojson` filter of a chat template: what Python's `json.dumps` writes (`ensure_ascii`,
//! `indent`, `separators`, `sort_keys`; floats in Python's `repr`), as `transformers`' Jinja
//! environment installs it.

use std::fmt::Write as _;

use minijinja::value::{Kwargs, Rest, Value, ValueKind};
use minijinja::ErrorKind;

/// Python's `repr` of a float (what `json.dumps` writes): the shortest digits that read back,
/// in positional form for exponents -4..16, else `1e+16`, `1.5e-05`.
fn py_float(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    let sci = format!("{f:e}"); // shortest round-trip digits, e.g. "-1.5e-5"
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if (-4..16).contains(&exp) {
        let s = format!("{f:?}");
        // Debug gives "1e16"-style only beyond this range; positional here
        if s.contains('.') || s.contains('e') || s.contains("inf") {
            s
        } else {
            format!("{s}.0")
        }
    } else {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{mantissa}e{sign}{:02}", exp.unsigned_abs())
    }
}

/// Writes `s` as a JSON string the way Python's `json.dumps` does.
fn json_string(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (ensure_ascii && !(' '..='~').contains(&c)) => {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{u:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// The options of the `tojson` filter (Python's `json.dumps` arguments).
struct JsonOptions {
    ensure_ascii: bool,
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
}

const MAX_JSON_DEPTH: usize = 128;

fn json_key(key: &Value) -> std::result::Result<String, minijinja::Error> {
    match key.kind() {
        ValueKind::String => Ok(key.as_str().unwrap_or_default().to_string()),
        ValueKind::None => Ok("null".into()),
        ValueKind::Bool => Ok(if key.is_true() { "true" } else { "false" }.into()),
        ValueKind::Number if key.is_integer() => Ok(key.to_string()),
        ValueKind::Number => Ok(py_float(f64::try_from(key.clone()).unwrap_or(f64::NAN))),
        _ => Err(minijinja::Error::new(
            ErrorKind::InvalidOperation,
            format!(
                "tojson: keys must be str, int, float, bool or None, not {}",
                key.kind()
            ),
        )),
    }
}

fn json_value(
    out: &mut String,
    v: &Value,
    opts: &JsonOptions,
    depth: usize,
) -> std::result::Result<(), minijinja::Error> {
    let err = |msg: String| minijinja::Error::new(ErrorKind::InvalidOperation, msg);
    if depth > MAX_JSON_DEPTH {
        return Err(err(format!(
            "tojson: nested deeper than {MAX_JSON_DEPTH} levels"
        )));
    }
    let newline = |out: &mut String, level: usize| {
        if let Some(ind) = &opts.indent {
            out.push('\n');
            for _ in 0..level {
                out.push_str(ind);
            }
        }
    };
    match v.kind() {
        ValueKind::Undefined => {
            return Err(err(
                "tojson: an undefined value is not JSON serializable".into()
            ))
        }
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number if v.is_integer() => {
            let _ = write!(out, "{v}");
        }
        ValueKind::Number => out.push_str(&py_float(f64::try_from(v.clone()).unwrap_or(f64::NAN))),
        ValueKind::String => json_string(out, v.as_str().unwrap_or_default(), opts.ensure_ascii),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&opts.item_sep);
                }
                newline(out, depth + 1);
                json_value(out, item, opts, depth + 1)?;
            }
            newline(out, depth);
            out.push(']');
        }
        ValueKind::Map => {
            let mut pairs = Vec::new();
            for key in v.try_iter()? {
                let value = v.get_item(&key)?;
                pairs.push((json_key(&key)?, value));
            }
            if opts.sort_keys {
                pairs.sort_by(|a, b| a.0.cmp(&b.0));
            }
            if pairs.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            out.push('{');
            for (i, (key, value)) in pairs.iter().enumerate() {
                if i > 0 {
                    out.push_str(&opts.item_sep);
                }
                newline(out, depth + 1);
                json_string(out, key, opts.ensure_ascii);
                out.push_str(&opts.key_sep);
                json_value(out, value, opts, depth + 1)?;
            }
            newline(out, depth);
            out.push('}');
        }
        other => return Err(err(format!("tojson: a {other} is not JSON serializable"))),
    }
    Ok(())
}

/// The `tojson` filter: Python's `json.dumps(x, ensure_ascii=False, indent=None,
/// separators=None, sort_keys=False)`, arguments by position or by name.
pub(super) fn tojson_filter(
    value: Value,
    args: Rest<Value>,
    kwargs: Kwargs,
) -> std::result::Result<String, minijinja::Error> {
    if args.len() > 4 {
        return Err(minijinja::Error::new(
            ErrorKind::TooManyArguments,
            "tojson takes at most 4 arguments (ensure_ascii, indent, separators, sort_keys)",
        ));
    }
    let pick = |i: usize, name: &str| -> std::result::Result<Option<Value>, minijinja::Error> {
        match args.get(i) {
            Some(v) => Ok(Some(v.clone())),
            None => kwargs.get::<Option<Value>>(name),
        }
    };
    let ensure_ascii = pick(0, "ensure_ascii")?.is_some_and(|v| v.is_true());
    let indent = match pick(1, "indent")? {
        None => None,
        Some(v) if v.is_none() || v.is_undefined() => None,
        Some(v) if v.kind() == ValueKind::String => {
            Some(v.as_str().unwrap_or_default().to_string())
        }
        Some(v) => match v.as_i64() {
            Some(n) => Some(" ".repeat(usize::try_from(n.clamp(0, 1024)).unwrap_or(0))),
            None => {
                return Err(minijinja::Error::new(
                    ErrorKind::InvalidOperation,
                    format!(
                        "tojson: indent must be an int or a string, not {}",
                        v.kind()
                    ),
                ))
            }
        },
    };
    let (item_sep, key_sep) = match pick(2, "separators")? {
        Some(v) if !(v.is_none() || v.is_undefined()) => {
            let parts: Vec<Value> = v.try_iter()?.collect();
            match parts.as_slice() {
                [a, b] if a.as_str().is_some() && b.as_str().is_some() => (
                    a.as_str().unwrap_or_default().to_string(),
                    b.as_str().unwrap_or_default().to_string(),
                ),
                _ => {
                    return Err(minijinja::Error::new(
                        ErrorKind::InvalidOperation,
                        "tojson: separators must be two strings (item, key)",
                    ))
                }
            }
        }
        _ if indent.is_some() => (",".into(), ": ".into()),
        _ => (", ".into(), ": ".into()),
    };
    let sort_keys = pick(3, "sort_keys")?.is_some_and(|v| v.is_true());
    kwargs.assert_all_used()?;
    let opts = JsonOptions {
        ensure_ascii,
        indent,
        item_sep,
        key_sep,
        sort_keys,
    };
    let mut out = String::new();
    json_value(&mut out, &value, &opts, 0)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_float_repr() {
        assert_eq!(py_float(1.0), "1.0");
        assert_eq!(py_float(0.5), "0.5");
        assert_eq!(py_float(1e16), "1e+16");
        assert_eq!(py_float(1.5e-5), "1.5e-05");
        assert_eq!(py_float(0.0001), "0.0001");
        assert_eq!(py_float(-2.5), "-2.5");
        assert_eq!(py_float(123456789012345.0), "123456789012345.0");
    }
}
