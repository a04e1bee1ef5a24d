//! Timing helpers shared by the Rust benches (each bench is its own crate and includes this
//! module): the best of `repeat` timed runs, as `benches/python/*.py` measure.

#![allow(dead_code)] // each bench uses one of the two forms

use std::time::Instant;

/// The shortest of `repeat` runs of `f`, in seconds.
pub fn best_of(mut f: impl FnMut(), repeat: usize) -> f64 {
    try_best_of(
        || {
            f();
            Ok(())
        },
        repeat,
    )
    .unwrap_or(f64::INFINITY)
}

/// The shortest of `repeat` runs of a fallible `f`, in seconds; the first error stops.
pub fn try_best_of(
    mut f: impl FnMut() -> torchrl::Result<()>,
    repeat: usize,
) -> torchrl::Result<f64> {
    let mut best = f64::INFINITY;
    for _ in 0..repeat {
        let t0 = Instant::now();
        f()?;
        best = best.min(t0.elapsed().as_secs_f64());
    }
    Ok(best)
}
