//! [`FusedAdam`]: `torch.optim.Adam(params, lr, fused=True)`, one libtorch call per step.
//!
//! `tch`'s `nn::Adam` steps libtorch's C++ `torch::optim::Adam`, which runs about ten tensor
//! ops per parameter. On the small networks of off-policy RL (a SAC actor and two critics of
//! 64 units: 19 tensors), that loop is 12 % of a whole training run (docs/performance.md,
//! W27). `FusedAdam` makes one call of `aten::_fused_adam_` per step instead: the kernel behind
//! PyTorch's `fused=True`, which updates every parameter, its moments and its step count in
//! one pass (reached through the dispatcher by a small C++ file, `fused_adam.cpp`, as tch does
//! not bind tensor-list ops). It is PyTorch's Adam: the same defaults (betas 0.9 / 0.999, eps
//! 1e-8, no weight decay), L2 weight decay added to the gradient (not AdamW's decoupled
//! decay), bias-corrected moments, and parameters without a gradient skipped. The results
//! equal `nn::Adam`'s up to float rounding (1e-6 in the tests). A build without the C++ file
//! runs the same arithmetic per tensor.
//!
//! ```
//! use tch::nn::{self, Module, OptimizerConfig};
//! use tch::{Device, Kind, Tensor};
//! use torchrl::objectives::optim::FusedAdam;
//! # fn main() -> torchrl::Result<()> {
//! let vs = nn::VarStore::new(Device::Cpu);
//! let net = nn::linear(vs.root(), 3, 2, Default::default());
//! let mut opt = FusedAdam::new(&vs, 1e-2)?;
//! let x = Tensor::randn([8, 3], (Kind::Float, Device::Cpu));
//! let before = net.forward(&x).square().mean(Kind::Float).double_value(&[]);
//! for _ in 0..50 {
//!     opt.zero_grad()?;
//!     net.forward(&x).square().mean(Kind::Float).backward();
//!     opt.step()?;
//! }
//! let after = net.forward(&x).square().mean(Kind::Float).double_value(&[]);
//! assert!(after < before);
//! assert!(FusedAdam::new(&vs, -1.0).is_err()); // a negative learning rate
//! # Ok(()) }
//! ```

use tch::{nn, Device, Kind, Tensor};

use crate::error::{Error, Result};

/// PyTorch's Adam with `fused=True` (see the [module docs](self)).
#[derive(Debug)]
pub struct FusedAdam {
    params: Vec<Tensor>,
    exp_avg: Vec<Tensor>,
    exp_avg_sq: Vec<Tensor>,
    /// Each parameter's step count, a float32 scalar on its device (PyTorch's
    /// `state["step"]`).
    steps: Vec<Tensor>,
    lr: f64,
    betas: (f64, f64),
    eps: f64,
    weight_decay: f64,
}

fn check(op: &'static str, field: &'static str, ok: bool, expected: &str, got: f64) -> Result<()> {
    if ok {
        Ok(())
    } else {
        Err(Error::config(op, field, expected, got))
    }
}

impl FusedAdam {
    /// Adam over the trainable variables of `vs`, at learning rate `lr`, with PyTorch's other
    /// defaults.
    ///
    /// # Errors
    /// A negative or NaN `lr`; a trainable variable that is not a float tensor.
    pub fn new(vs: &nn::VarStore, lr: f64) -> Result<Self> {
        Self::from_params(vs.trainable_variables(), lr)
    }

    /// Adam over `params` (leaf tensors that require grad).
    ///
    /// # Errors
    /// As [`FusedAdam::new`].
    pub fn from_params(params: Vec<Tensor>, lr: f64) -> Result<Self> {
        let op = "FusedAdam";
        check(op, "lr", lr >= 0.0, "a learning rate >= 0", lr)?;
        let mut state = (Vec::new(), Vec::new(), Vec::new());
        for (i, p) in params.iter().enumerate() {
            if !p.is_floating_point() {
                return Err(Error::value(
                    op,
                    "params",
                    "floating-point parameters",
                    format!("parameter {i} of dtype {:?}", p.kind()),
                ));
            }
            state.0.push(p.f_zeros_like()?);
            state.1.push(p.f_zeros_like()?);
            state
                .2
                .push(Tensor::f_zeros([], (Kind::Float, p.device()))?);
        }
        Ok(FusedAdam {
            params,
            exp_avg: state.0,
            exp_avg_sq: state.1,
            steps: state.2,
            lr,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 0.0,
        })
    }

    /// Sets the moments' decay rates (PyTorch's `betas`, default `(0.9, 0.999)`).
    ///
    /// # Errors
    /// A beta outside `[0, 1)`.
    pub fn with_betas(mut self, beta1: f64, beta2: f64) -> Result<Self> {
        let within = |b: f64| (0.0..1.0).contains(&b);
        check("FusedAdam", "beta1", within(beta1), "in [0, 1)", beta1)?;
        check("FusedAdam", "beta2", within(beta2), "in [0, 1)", beta2)?;
        self.betas = (beta1, beta2);
        Ok(self)
    }

    /// Sets the denominator's `eps` (default 1e-8).
    ///
    /// # Errors
    /// A negative or NaN `eps`.
    pub fn with_eps(mut self, eps: f64) -> Result<Self> {
        check("FusedAdam", "eps", eps >= 0.0, ">= 0", eps)?;
        self.eps = eps;
        Ok(self)
    }

    /// Sets the L2 weight decay added to each gradient (PyTorch's `weight_decay`, default 0).
    ///
    /// # Errors
    /// A negative or NaN value.
    pub fn with_weight_decay(mut self, weight_decay: f64) -> Result<Self> {
        let ok = weight_decay >= 0.0;
        check("FusedAdam", "weight_decay", ok, ">= 0", weight_decay)?;
        self.weight_decay = weight_decay;
        Ok(self)
    }

    /// The learning rate.
    pub fn lr(&self) -> f64 {
        self.lr
    }

    /// Sets the learning rate (for a schedule).
    pub fn set_lr(&mut self, lr: f64) {
        self.lr = lr;
    }

    /// The parameters it steps.
    pub fn params(&self) -> &[Tensor] {
        &self.params
    }

    /// Zeroes every defined gradient (one call).
    ///
    /// # Errors
    /// A libtorch error.
    pub fn zero_grad(&mut self) -> Result<()> {
        let grads: Vec<Tensor> = self
            .params
            .iter()
            .map(Tensor::grad)
            .filter(Tensor::defined)
            .collect();
        if grads.is_empty() {
            return Ok(());
        }
        let _guard = tch::no_grad_guard();
        ffi::zero(&grads)
    }

    /// One Adam step on every parameter that has a gradient, in one fused call per device and
    /// dtype.
    ///
    /// # Errors
    /// A libtorch error (a sparse gradient, for one).
    pub fn step(&mut self) -> Result<()> {
        let _guard = tch::no_grad_guard();
        let groups = fused_groups(&self.params, |_| true);
        for (_, idx) in groups {
            let pick = |v: &[Tensor]| picked(v, &idx);
            let params = pick(&self.params);
            let grads: Vec<Tensor> = params.iter().map(Tensor::grad).collect();
            let group = Group {
                params: &params,
                grads: &grads,
                exp_avg: &pick(&self.exp_avg),
                exp_avg_sq: &pick(&self.exp_avg_sq),
                steps: &pick(&self.steps),
            };
            ffi::adam(&group, self.hyper())?;
        }
        Ok(())
    }

    fn hyper(&self) -> Hyper {
        Hyper {
            lr: self.lr,
            beta1: self.betas.0,
            beta2: self.betas.1,
            weight_decay: self.weight_decay,
            eps: self.eps,
        }
    }
}

/// The parameters a fused step takes (those with a gradient, and `keep(i)`), grouped by
/// device and dtype (one fused call each): `((device, dtype), indices)`.
pub(crate) fn fused_groups(
    params: &[Tensor],
    keep: impl Fn(usize) -> bool,
) -> Vec<((Device, Kind), Vec<usize>)> {
    let mut groups: Vec<((Device, Kind), Vec<usize>)> = Vec::new();
    for (i, p) in params.iter().enumerate() {
        if !keep(i) || !p.grad().defined() {
            continue;
        }
        let key = (p.device(), p.kind());
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, idx)) => idx.push(i),
            None => groups.push((key, vec![i])),
        }
    }
    groups
}

/// Shallow clones of `v`'s entries at `idx`.
pub(crate) fn picked(v: &[Tensor], idx: &[usize]) -> Vec<Tensor> {
    idx.iter()
        .filter_map(|&i| v.get(i))
        .map(Tensor::shallow_clone)
        .collect()
}

/// One AdamW step (decoupled weight decay) of `params` through `aten::_fused_adamw_`, with
/// `steps` already holding this step's counts (float32 scalars) and `hyper` = `[lr, beta1,
/// beta2, weight_decay, eps]`: the trainers' `AdamW` with `fused`. `Ok(false)` in a build
/// without the C++ shim (nothing done: the caller steps per tensor).
pub(crate) fn fused_adamw_step(
    params: &[Tensor],
    grads: &[Tensor],
    exp_avg: &[Tensor],
    exp_avg_sq: &[Tensor],
    steps: &[Tensor],
    hyper: [f64; 5],
) -> Result<bool> {
    let [lr, beta1, beta2, weight_decay, eps] = hyper;
    let group = Group {
        params,
        grads,
        exp_avg,
        exp_avg_sq,
        steps,
    };
    let h = Hyper {
        lr,
        beta1,
        beta2,
        weight_decay,
        eps,
    };
    #[cfg(torchrl_shims)]
    {
        let _guard = tch::no_grad_guard();
        ffi::fused(&group, h, true, false)?;
        Ok(true)
    }
    #[cfg(not(torchrl_shims))]
    {
        let _ = (group, h);
        Ok(false)
    }
}

/// The tensors of one fused call: parameters of one device and dtype.
struct Group<'a> {
    params: &'a [Tensor],
    grads: &'a [Tensor],
    exp_avg: &'a [Tensor],
    exp_avg_sq: &'a [Tensor],
    steps: &'a [Tensor],
}

#[derive(Debug, Clone, Copy)]
struct Hyper {
    lr: f64,
    beta1: f64,
    beta2: f64,
    weight_decay: f64,
    eps: f64,
}

/// PyTorch's single-tensor Adam on one group (the step counts incremented first): what a
/// build without the C++ file runs, and what the tests compare the fused call with.
#[cfg(any(test, not(torchrl_shims)))]
fn adam_per_tensor(g: &Group<'_>, h: Hyper) -> Result<()> {
    for (i, p) in g.params.iter().enumerate() {
        let (Some(grad), Some(m), Some(v), Some(step)) = (
            g.grads.get(i),
            g.exp_avg.get(i),
            g.exp_avg_sq.get(i),
            g.steps.get(i),
        ) else {
            continue;
        };
        let _ = step.shallow_clone().f_add_scalar_(1.0)?;
        let t = step.f_double_value(&[])?;
        let grad = if h.weight_decay != 0.0 {
            grad.f_add(&p.f_mul_scalar(h.weight_decay)?)?
        } else {
            grad.shallow_clone()
        };
        let _ = m.shallow_clone().f_lerp_(&grad, 1.0 - h.beta1)?;
        let _ = v
            .shallow_clone()
            .f_mul_scalar_(h.beta2)?
            .f_addcmul_(&grad, &grad.f_mul_scalar(1.0 - h.beta2)?)?;
        let bias1 = 1.0 - h.beta1.powf(t);
        let bias2 = 1.0 - h.beta2.powf(t);
        let denom = v
            .f_sqrt()?
            .f_div_scalar(bias2.sqrt())?
            .f_add_scalar(h.eps)?;
        let _ = p
            .shallow_clone()
            .f_addcdiv_(&m.f_mul_scalar(-h.lr / bias1)?, &denom)?;
    }
    Ok(())
}

#[cfg(torchrl_shims)]
mod ffi {
    use std::ffi::{c_char, c_int, c_void, CStr};

    use tch::Tensor;

    use super::{Group, Hyper};
    use crate::error::{Error, Result};

    extern "C" {
        fn trl_fused_adam(
            params: *mut *mut c_void,
            grads: *mut *mut c_void,
            exp_avgs: *mut *mut c_void,
            exp_avg_sqs: *mut *mut c_void,
            steps: *mut *mut c_void,
            n: usize,
            lr: f64,
            beta1: f64,
            beta2: f64,
            weight_decay: f64,
            eps: f64,
            decoupled: c_int,
            increment: c_int,
            err: *mut c_char,
            len: usize,
        ) -> c_int;
        fn trl_foreach_zero(ts: *mut *mut c_void, n: usize, err: *mut c_char, len: usize) -> c_int;
    }

    const ERR_LEN: usize = 1024;

    fn ptrs(ts: &[Tensor]) -> Vec<*mut c_void> {
        ts.iter().map(|t| t.as_ptr() as *mut c_void).collect()
    }

    fn finish(op: &'static str, status: c_int, err: &[u8]) -> Result<()> {
        if status == 0 {
            return Ok(());
        }
        let msg = CStr::from_bytes_until_nul(err)
            .map(|c| c.to_string_lossy().into_owned())
            .unwrap_or_default();
        Err(Error::invalid(op, format!("libtorch: {msg}")))
    }

    pub(super) fn adam(g: &Group<'_>, h: Hyper) -> Result<()> {
        fused(g, h, false, true)
    }

    /// The fused call: `decoupled` for AdamW's weight decay, `increment` to add 1 to the step
    /// counts first.
    pub(crate) fn fused(g: &Group<'_>, h: Hyper, decoupled: bool, increment: bool) -> Result<()> {
        let n = g.params.len();
        if [g.grads, g.exp_avg, g.exp_avg_sq, g.steps]
            .iter()
            .any(|v| v.len() != n)
        {
            return Err(Error::invalid(
                "aten::_fused_adam_",
                "lists of unequal lengths",
            ));
        }
        let (mut p, mut gr, mut m, mut v, mut s) = (
            ptrs(g.params),
            ptrs(g.grads),
            ptrs(g.exp_avg),
            ptrs(g.exp_avg_sq),
            ptrs(g.steps),
        );
        let mut err = vec![0u8; ERR_LEN];
        // SAFETY: every array holds `n` live tensor handles for the call; `err` is valid for
        // ERR_LEN bytes; the shim catches every C++ exception.
        let status = unsafe {
            trl_fused_adam(
                p.as_mut_ptr(),
                gr.as_mut_ptr(),
                m.as_mut_ptr(),
                v.as_mut_ptr(),
                s.as_mut_ptr(),
                n,
                h.lr,
                h.beta1,
                h.beta2,
                h.weight_decay,
                h.eps,
                c_int::from(decoupled),
                c_int::from(increment),
                err.as_mut_ptr() as *mut c_char,
                ERR_LEN,
            )
        };
        let op = if decoupled {
            "aten::_fused_adamw_"
        } else {
            "aten::_fused_adam_"
        };
        finish(op, status, &err)
    }

    pub(super) fn zero(ts: &[Tensor]) -> Result<()> {
        let mut p = ptrs(ts);
        let mut err = vec![0u8; ERR_LEN];
        // SAFETY: `p` holds `ts.len()` live tensor handles for the call; `err` is valid for
        // ERR_LEN bytes.
        let status = unsafe {
            trl_foreach_zero(
                p.as_mut_ptr(),
                p.len(),
                err.as_mut_ptr() as *mut c_char,
                ERR_LEN,
            )
        };
        finish("aten::_foreach_zero_", status, &err)
    }
}

#[cfg(not(torchrl_shims))]
mod ffi {
    use tch::Tensor;

    use super::{adam_per_tensor, Group, Hyper};
    use crate::error::Result;

    pub(super) fn adam(g: &Group<'_>, h: Hyper) -> Result<()> {
        adam_per_tensor(g, h)
    }

    pub(super) fn zero(ts: &[Tensor]) -> Result<()> {
        for t in ts {
            let _ = t.shallow_clone().f_zero_()?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::nn::{Module, OptimizerConfig};

    /// A 3 → 16 → 2 MLP (4 tensors) on a fixed batch; its loss.
    fn net(vs: &nn::VarStore) -> impl Fn() -> Tensor {
        let l1 = nn::linear(vs.root() / "l1", 3, 16, Default::default());
        let l2 = nn::linear(vs.root() / "l2", 16, 2, Default::default());
        let x = Tensor::randn([32, 3], (Kind::Float, Device::Cpu));
        move || {
            l2.forward(&l1.forward(&x).relu())
                .square()
                .mean(Kind::Float)
        }
    }

    fn params(vs: &nn::VarStore) -> Vec<Tensor> {
        let mut v: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v.into_iter().map(|(_, t)| t.detach().copy()).collect()
    }

    fn max_diff(a: &[Tensor], b: &[Tensor]) -> f64 {
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs().max().double_value(&[]))
            .fold(0.0, f64::max)
    }

    /// 20 steps of ours and of tch's `nn::Adam` (libtorch's C++ Adam) from the same weights
    /// and batch: the same parameters to 1e-6, with and without weight decay.
    #[test]
    fn steps_as_libtorchs_adam() -> Result<()> {
        for wd in [0.0, 0.05] {
            tch::manual_seed(1);
            let (vs_a, vs_b) = (
                nn::VarStore::new(Device::Cpu),
                nn::VarStore::new(Device::Cpu),
            );
            let loss_a = net(&vs_a);
            tch::manual_seed(1);
            let loss_b = net(&vs_b);
            let mut ours = FusedAdam::new(&vs_a, 3e-2)?.with_weight_decay(wd)?;
            let mut theirs = nn::Adam {
                wd,
                ..Default::default()
            }
            .build(&vs_b, 3e-2)?;
            for _ in 0..20 {
                ours.zero_grad()?;
                loss_a().backward();
                ours.step()?;
                theirs.zero_grad();
                loss_b().backward();
                theirs.step();
            }
            let d = max_diff(&params(&vs_a), &params(&vs_b));
            assert!(d <= 1e-6, "weight decay {wd}: parameters differ by {d}");
            // and they moved
            tch::manual_seed(1);
            let fresh = nn::VarStore::new(Device::Cpu);
            let _ = net(&fresh);
            assert!(max_diff(&params(&vs_a), &params(&fresh)) > 1e-2);
        }
        Ok(())
    }

    /// The per-tensor arithmetic (a build without the C++ file) is the fused call's.
    #[test]
    fn the_per_tensor_fallback_is_the_fused_step() -> Result<()> {
        tch::manual_seed(2);
        let (vs_a, vs_b) = (
            nn::VarStore::new(Device::Cpu),
            nn::VarStore::new(Device::Cpu),
        );
        let loss_a = net(&vs_a);
        tch::manual_seed(2);
        let loss_b = net(&vs_b);
        let mut a = FusedAdam::new(&vs_a, 1e-2)?.with_weight_decay(0.01)?;
        let mut b = FusedAdam::new(&vs_b, 1e-2)?.with_weight_decay(0.01)?;
        for _ in 0..10 {
            a.zero_grad()?;
            loss_a().backward();
            a.step()?;
            b.zero_grad()?;
            loss_b().backward();
            let _guard = tch::no_grad_guard();
            let grads: Vec<Tensor> = b.params.iter().map(Tensor::grad).collect();
            let group = Group {
                params: &b.params,
                grads: &grads,
                exp_avg: &b.exp_avg,
                exp_avg_sq: &b.exp_avg_sq,
                steps: &b.steps,
            };
            adam_per_tensor(&group, b.hyper())?;
        }
        let d = max_diff(b.params(), a.params());
        assert!(d <= 1e-6, "parameters differ by {d}");
        assert_eq!(b.steps[0].double_value(&[]), 10.0);
        Ok(())
    }

    #[test]
    fn bad_settings_and_parameters_are_refused() {
        let vs = nn::VarStore::new(Device::Cpu);
        let _ = net(&vs);
        for r in [
            FusedAdam::new(&vs, f64::NAN).map(|_| ()),
            FusedAdam::new(&vs, 1e-3)
                .and_then(|o| o.with_betas(0.9, 1.0))
                .map(|_| ()),
            FusedAdam::new(&vs, 1e-3)
                .and_then(|o| o.with_eps(-1.0))
                .map(|_| ()),
            FusedAdam::new(&vs, 1e-3)
                .and_then(|o| o.with_weight_decay(-0.1))
                .map(|_| ()),
        ] {
            assert!(r.is_err());
        }
        let ints = vec![Tensor::from_slice(&[1i64, 2])];
        let e = FusedAdam::from_params(ints, 1e-3).unwrap_err().to_string();
        assert!(e.contains("parameter 0") && e.contains("Int64"), "{e}");
        // a parameter without a gradient is skipped, not an error
        let mut opt = FusedAdam::new(&vs, 1e-3).unwrap();
        assert!(opt.zero_grad().is_ok() && opt.step().is_ok());
    }
}
