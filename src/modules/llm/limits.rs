//! The limits a model config is checked against before any tensor is made (see
//! `docs/reliability.md`). A `config.json` comes from anywhere: every size in it is checked
//! here with checked arithmetic, so that an absurd value is a named
//! [`Error::InvalidConfig`] instead of an overflow, a process abort or a machine's memory
//! spent on blocks that no weight file will fill.
//!
//! The limits are far above any published model (Llama 3.1 405B: 126 layers, width 16,384,
//! vocabulary 128,256, MLP 53,248; the longest contexts ~10M positions):
//!
//! | what                                  | limit          |
//! |---------------------------------------|----------------|
//! | blocks (`n_layer`, `num_hidden_layers`) | [`MAX_LAYERS`] = 1,024 |
//! | one width / head count / head size / vocabulary | [`MAX_DIM`] = 2^24 |
//! | context length                        | [`MAX_POSITIONS`] = 2^26 |
//! | parameters in all                     | [`MAX_PARAMETERS`] = 2^40 |
//!
//! ```
//! use torchrl::modules::llm::Gpt2Config;
//! // 2^20 blocks are refused before any is built, naming the field
//! let err = Gpt2Config::new(50).with_n_layer(1 << 20).validate().unwrap_err();
//! assert!(err.to_string().contains("n_layer"), "{err}");
//! // 4 * n_embd overflowing i64 is an error, not a panic
//! let err = Gpt2Config::new(50).with_n_embd(i64::MAX / 2).with_n_head(1).validate().unwrap_err();
//! assert!(err.to_string().contains("n_embd"), "{err}");
//! ```

use crate::error::{Error, Result};

/// The most blocks a config may ask for.
pub const MAX_LAYERS: i64 = 1024;
/// The largest width, head count, head size, MLP width or vocabulary.
pub const MAX_DIM: i64 = 1 << 24;
/// The longest context.
pub const MAX_POSITIONS: i64 = 1 << 26;
/// The most parameters a config may describe.
pub const MAX_PARAMETERS: i64 = 1 << 40;

/// `Ok` when `1 <= value <= max`, else the error naming `field`.
pub(crate) fn size(op: &'static str, field: &'static str, value: i64, max: i64) -> Result<()> {
    if (1..=max).contains(&value) {
        Ok(())
    } else {
        Err(Error::config(
            op,
            field,
            format!("a positive size of at most {max}"),
            value,
        ))
    }
}

/// `a * b`, or the error naming `field` (what the product is) when it overflows `i64` or
/// passes `max`.
pub(crate) fn product(
    op: &'static str,
    field: &'static str,
    a: i64,
    b: i64,
    max: i64,
) -> Result<i64> {
    match a.checked_mul(b) {
        Some(p) if p <= max => Ok(p),
        _ => Err(Error::config(
            op,
            field,
            format!("a product of at most {max}"),
            format!("{a} * {b}"),
        )),
    }
}

/// The number of elements of every shape in `shapes`, summed, or the error naming
/// `field` when it overflows or passes [`MAX_PARAMETERS`].
pub(crate) fn parameter_count<'a>(
    op: &'static str,
    field: &'static str,
    shapes: impl IntoIterator<Item = &'a Vec<i64>>,
) -> Result<i64> {
    let too_many = || {
        Error::config(
            op,
            field,
            format!("a model of at most {MAX_PARAMETERS} parameters"),
            "more",
        )
    };
    let mut total: i64 = 0;
    for shape in shapes {
        let mut n: i64 = 1;
        for &d in shape {
            n = n.checked_mul(d).ok_or_else(too_many)?;
        }
        total = total.checked_add(n).ok_or_else(too_many)?;
    }
    if total > MAX_PARAMETERS {
        return Err(too_many());
    }
    Ok(total)
}
