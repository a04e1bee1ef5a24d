//! Small predicates on libtorch dtypes, shared by specs, transforms, distributions and envs.
//!
//! ```
//! use tch::Kind;
//! use torchrl::kind::{is_float, is_integral};
//! assert!(is_float(Kind::BFloat16) && !is_float(Kind::Int64));
//! assert!(is_integral(Kind::Uint8) && !is_integral(Kind::Bool));
//! ```

use tch::Kind;

/// Whether `kind` is a real floating-point dtype (`Half`, `BFloat16`, `Float`, `Double`).
pub fn is_float(kind: Kind) -> bool {
    matches!(
        kind,
        Kind::Half | Kind::BFloat16 | Kind::Float | Kind::Double
    )
}

/// Whether `kind` is an integer dtype (signed or unsigned; `Bool` is not).
pub fn is_integral(kind: Kind) -> bool {
    matches!(
        kind,
        Kind::Uint8 | Kind::Int8 | Kind::Int16 | Kind::Int | Kind::Int64
    )
}
