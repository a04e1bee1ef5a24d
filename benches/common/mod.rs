//! Timing helpers shared by the Rust benches (each bench is its own crate and includes this
//! module): the best of `repeat` timed runs, as `benches/python/*.py` measure; best and median
//! of a list of times; the peak RSS; an environment knob with a default.

#![allow(dead_code)] // each bench uses some of these

pub mod bare_gpt2;
pub mod bare_ilql;
pub mod bare_optim;
pub mod bare_ppo;
pub mod bare_rlhf;

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

/// One repetition of a workload, with its state.
pub type Repetition<'a> = Box<dyn FnMut() -> torchrl::Result<()> + 'a>;

/// The best of 3 timed repetitions of `ours` and of `floor` (in seconds), after one warm-up
/// repetition of each, the two interleaved so that machine noise hits both alike.
pub fn paired(mut ours: Repetition<'_>, mut floor: Repetition<'_>) -> torchrl::Result<(f64, f64)> {
    ours()?;
    floor()?;
    let (mut best_ours, mut best_floor) = (f64::INFINITY, f64::INFINITY);
    for _ in 0..3 {
        best_floor = best_floor.min(try_best_of(&mut floor, 1)?);
        best_ours = best_ours.min(try_best_of(&mut ours, 1)?);
    }
    Ok((best_ours, best_floor))
}

/// The largest absolute difference of two tensors (taken in float64), for the floors'
/// checks against ours.
pub fn max_diff(a: &tch::Tensor, b: &tch::Tensor) -> f64 {
    (a.to_kind(tch::Kind::Double) - b.to_kind(tch::Kind::Double))
        .abs()
        .max()
        .double_value(&[])
}

/// Prints the row `<name>_floor\t<ops/s>` (`ops` operations in `floor_s` seconds, to 4
/// significant digits: a slow workload's 0.1503 keeps its digits) that `scripts/bench.sh`
/// pairs with the row `name`, and a `#` line with ours / floor (times).
pub fn print_floor(name: &str, ops: f64, ours_s: f64, floor_s: f64) {
    println!("{name}_floor\t{}", significant(ops / floor_s, 4));
    println!(
        "# {name}: ours vs the bare-tch floor: {:.3}x the floor's time",
        ours_s / floor_s
    );
}

/// `x` in plain decimal notation with at least `digits` significant digits: the decimals
/// that gives, none past the point once the integer part has them (`0.1503`, `15.03`,
/// `1503`, `150312`); 0, NaN and the infinities as Rust prints them.
pub fn significant(x: f64, digits: i32) -> String {
    if !x.is_finite() || x == 0.0 {
        return format!("{x}");
    }
    let magnitude = x.abs().log10().floor() as i32;
    let decimals = (digits - 1 - magnitude).max(0) as usize;
    format!("{x:.decimals$}")
}
