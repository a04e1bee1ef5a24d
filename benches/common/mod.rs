//! Timing helpers shared by the Rust benches (each bench is its own crate and includes this
//! module): the best of `repeat` timed runs, as `benches/python/*.py` measure; best and median
//! of a list of times; the peak RSS; an environment knob with a default.

#![allow(dead_code)] // each bench uses some of these

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

/// `name`'s value parsed, or `default` when unset or unparsable.
pub fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// This process's peak resident set (`VmHWM`), in MiB; NaN where `/proc` has none.
pub fn peak_rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

/// The best (smallest) and the median of `times`; NaN for none.
pub fn best_median(times: &[f64]) -> (f64, f64) {
    let mut sorted = times.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    let median = match n {
        0 => f64::NAN,
        _ if n % 2 == 1 => sorted[n / 2],
        _ => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    };
    (sorted.first().copied().unwrap_or(f64::NAN), median)
}
