//! The Rust half of the side-by-side objectives benchmark W6, measured exactly as
//! `benches/python/torchrl_baseline.py` measures it (best of 3, single-threaded libtorch):
//! the Bradley-Terry reward-model loss (mean) and its accuracy, forward + backward, on
//! precomputed chosen/rejected scores of batch 256 read from a tensordict, 1000 times.
//!
//! Run: `cargo bench --bench objectives`, or `scripts/bench.sh` for the side-by-side table.

use std::hint::black_box;
use std::time::Instant;

use tch::{Device, Kind, Tensor};
use torchrl::objectives::{reward_model_loss, Reduction};
use torchrl::TensorDict;

fn best_of(mut f: impl FnMut() -> torchrl::Result<()>, repeat: usize) -> torchrl::Result<f64> {
    let mut best = f64::INFINITY;
    for _ in 0..repeat {
        let t0 = Instant::now();
        f()?;
        best = best.min(t0.elapsed().as_secs_f64());
    }
    Ok(best)
}

fn main() -> torchrl::Result<()> {
    tch::set_num_threads(1);
    tch::manual_seed(0);

    // W6: Bradley-Terry loss + accuracy, forward + backward, batch 256, 1000 iterations.
    let b = 256i64;
    let c = Tensor::f_randn([b], (Kind::Float, Device::Cpu))?.set_requires_grad(true);
    let r = Tensor::f_randn([b], (Kind::Float, Device::Cpu))?.set_requires_grad(true);
    let data = TensorDict::new([b])?
        .with(
            "chosen",
            TensorDict::new([b])?.with("score", c.shallow_clone())?,
        )?
        .with(
            "rejected",
            TensorDict::new([b])?.with("score", r.shallow_clone())?,
        )?;
    let w6 = best_of(
        || {
            for _ in 0..1000 {
                let cs = data.get_or_err(("chosen", "score"))?;
                let rs = data.get_or_err(("rejected", "score"))?;
                let loss = reward_model_loss(cs, rs, Reduction::Mean)?;
                let acc = {
                    let _guard = tch::no_grad_guard();
                    cs.f_gt_tensor(rs)?
                        .f_to_kind(Kind::Float)?
                        .f_mean(Kind::Float)?
                };
                black_box(&acc);
                loss.f_backward()?;
            }
            Ok(())
        },
        3,
    )?;
    println!("W6_reward_model_loss_fwd_bwd\t{:.1}", 1000.0 / w6);
    Ok(())
}
