//! The Rust half of the side-by-side TensorDict benchmarks W3–W5, measured exactly as
//! `benches/python/torchrl_baseline.py` measures them (best of 3 timed repetitions,
//! single-threaded libtorch). Prints one `name<TAB>ops-per-second` line per workload.
//!
//! Run: `cargo bench --bench tensordict`, or `scripts/bench.sh` for the side-by-side table.

mod common;
use common::best_of;

use std::hint::black_box;

use tch::{Device, Kind, Tensor};
use torchrl::{stack, TensorDict};

fn sample_td() -> torchrl::Result<TensorDict> {
    let z = |s: &[i64]| Tensor::zeros(s, (Kind::Float, Device::Cpu));
    TensorDict::new([64])?
        .with("obs", z(&[64, 3]))?
        .with(("next", "obs"), z(&[64, 3]))?
        .with(("next", "reward"), z(&[64, 1]))
}

fn main() -> torchrl::Result<()> {
    tch::set_num_threads(1);
    let mut td = sample_td()?;

    // W3: nested get + set of ("next", "reward"), 10k times. Unit: pairs/s.
    let w3 = best_of(
        || {
            for _ in 0..10_000 {
                let r = td
                    .get(("next", "reward"))
                    .map(Tensor::shallow_clone)
                    .unwrap_or_else(|| Tensor::zeros([64, 1], (Kind::Float, Device::Cpu)));
                td.set(("next", "reward"), r).ok();
            }
        },
        3,
    );
    println!("W3_td_nested_get_set\t{:.1}", 10_000.0 / w3);

    // W4: stack 100 deep clones along a new dim 0, 100 times. Unit: stacks/s.
    let tds: Vec<TensorDict> = (0..100)
        .map(|_| td.deep_clone())
        .collect::<Result<_, _>>()?;
    let w4 = best_of(
        || {
            for _ in 0..100 {
                black_box(stack(&tds, 0).ok());
            }
        },
        3,
    );
    println!("W4_td_stack100\t{:.1}", 100.0 / w4);

    // W5: deep clone, 10k times. Unit: clones/s.
    let w5 = best_of(
        || {
            for _ in 0..10_000 {
                black_box(td.deep_clone().ok());
            }
        },
        3,
    );
    println!("W5_td_deep_clone\t{:.1}", 10_000.0 / w5);
    Ok(())
}
