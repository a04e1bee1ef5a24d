//! The trainers' `AdamW` with `fused` (`torch.optim.AdamW(fused=True)`; trlX's
//! `optimizer.kwargs.fused`): one `aten::_fused_adamw_` call per device and dtype.
//!
//! Against the per-tensor step (which matches PyTorch's default bit for bit, the recorded cases
//! in `specs/trainers_cases.json`), from the same weights and gradients over 30 steps with
//! weight decay: float32 and float64 parameters equal to 1e-6 of their scale (bit for bit on
//! the CPU with torch 2.13, printed), the step counts equal, and a bfloat16 parameter (trained through its float32 master, which the fused call
//! does not take) bitwise equal. The config field parses from TOML.

use tch::{Device, Kind, Tensor};
use torchrl::trainers::config::TrlConfig;
use torchrl::trainers::optim::AdamW;

/// Named parameters of three dtypes, the same values on every call.
fn params() -> Vec<(String, Tensor)> {
    tch::manual_seed(7);
    let mk = |shape: &[i64], kind: Kind| {
        Tensor::randn(shape, (Kind::Float, Device::Cpu))
            .to_kind(kind)
            .set_requires_grad(true)
    };
    vec![
        ("a.weight".into(), mk(&[16, 8], Kind::Float)),
        ("a.bias".into(), mk(&[16], Kind::Float)),
        ("b.weight".into(), mk(&[4, 16], Kind::Double)),
        ("c.weight".into(), mk(&[8, 8], Kind::BFloat16)),
    ]
}

/// A loss whose gradients differ per element and per step.
fn loss(ps: &[(String, Tensor)], step: i64) -> Tensor {
    let mut total = Tensor::zeros([], (Kind::Float, Device::Cpu));
    for (i, (_, p)) in ps.iter().enumerate() {
        let w = Tensor::arange(p.numel() as i64, (Kind::Float, Device::Cpu))
            .sin()
            .view(p.size().as_slice())
            * (1.0 + 0.1 * (step + i as i64) as f64);
        let x = p.to_kind(Kind::Float);
        total = total + (&x * &w).sum(Kind::Float) + x.square().sum(Kind::Float) * 0.01;
    }
    total
}

fn run(fused: bool) -> (Vec<Tensor>, Vec<u64>) {
    let ps = params();
    let shared = ps
        .iter()
        .map(|(n, p)| (n.clone(), p.shallow_clone()))
        .collect();
    let mut opt = AdamW::new(shared, 1e-2)
        .unwrap()
        .with_weight_decay(0.1)
        .with_betas([0.9, 0.95])
        .with_fused(fused);
    for step in 0..30 {
        opt.zero_grad();
        loss(&ps, step).backward();
        opt.step().unwrap();
    }
    let out = ps.iter().map(|(_, p)| p.detach().copy()).collect();
    (out, opt.steps().to_vec())
}

#[test]
fn fused_adamw_steps_as_the_per_tensor_adamw() {
    let (fused, fused_steps) = run(true);
    let (plain, plain_steps) = run(false);
    assert_eq!(fused_steps, plain_steps);
    assert_eq!(plain_steps, vec![30; 4]);
    for (i, (a, b)) in fused.iter().zip(&plain).enumerate() {
        assert_eq!(a.kind(), b.kind(), "parameter {i}");
        let (a, b) = (a.to_kind(Kind::Double), b.to_kind(Kind::Double));
        let scale = b.abs().max().double_value(&[]).max(1.0);
        let d = (&a - &b).abs().max().double_value(&[]);
        if i == 3 {
            // bfloat16: stepped through its master by the same per-tensor code either way
            assert_eq!(d, 0.0, "the bf16 parameter");
        } else {
            assert!(d <= 1e-6 * scale, "parameter {i} differs by {d}");
            eprintln!("parameter {i}: fused against per-tensor {d:e}");
        }
    }
    // and the parameters moved
    let start = params();
    let moved = (&fused[0] - start[0].1.detach())
        .abs()
        .max()
        .double_value(&[]);
    assert!(moved > 0.1, "{moved}");
}

#[test]
fn fused_is_an_optimizer_kwarg() {
    let cfg = TrlConfig::from_toml_str(
        "[optimizer]\nname = \"adamw\"\n[optimizer.kwargs]\nlr = 1e-4\nfused = true\n",
    )
    .unwrap();
    assert!(cfg.optimizer.kwargs.fused);
    assert!(!TrlConfig::default().optimizer.kwargs.fused);
}
