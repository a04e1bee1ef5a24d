//! The optimizer half of the training floors: AdamW and global gradient-norm clipping as the
//! bare `tch` ops our `trainers::optim::AdamW` issues (zero the gradients, backward, the
//! float64 global norm, scale when above the limit, then per parameter: decoupled decay, the
//! two moment updates, the bias-corrected step), without names, checks or master weights.

#![allow(dead_code)] // each bench uses some of these

use tch::{Kind, Tensor};

/// AdamW's state over a fixed list of parameters.
pub struct BareAdamW {
    params: Vec<Tensor>,
    m: Vec<Tensor>,
    v: Vec<Tensor>,
    tmp: Vec<Tensor>,
    denom: Vec<Tensor>,
    t: Vec<u64>,
    pub lr: f64,
    pub betas: (f64, f64),
    pub eps: f64,
    pub weight_decay: f64,
}

impl BareAdamW {
    /// AdamW over `params` with `lr`, betas (0.9, 0.999), eps 1e-8 and `weight_decay`
    /// (`trainers::optim::AdamW`'s defaults are set by the caller to match the bench).
    pub fn new(params: Vec<Tensor>, lr: f64, weight_decay: f64) -> Self {
        let zeros = |p: &Tensor| p.zeros_like();
        BareAdamW {
            m: params.iter().map(zeros).collect(),
            v: params.iter().map(zeros).collect(),
            tmp: params.iter().map(zeros).collect(),
            denom: params.iter().map(zeros).collect(),
            t: vec![0; params.len()],
            params,
            lr,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay,
        }
    }

    /// Zero the gradients, backward `loss`, clip the global norm to `max_norm` (when given),
    /// step.
    pub fn backward_step(&mut self, loss: &Tensor, max_norm: Option<f64>) {
        for p in &mut self.params {
            p.zero_grad();
        }
        loss.backward();
        let _guard = tch::no_grad_guard();
        if let Some(max) = max_norm {
            let mut grads: Vec<Tensor> = self
                .params
                .iter()
                .map(Tensor::grad)
                .filter(Tensor::defined)
                .collect();
            let norms: Vec<Tensor> = grads
                .iter()
                .map(|g| g.to_kind(Kind::Double).norm())
                .collect();
            let total = Tensor::stack(&norms, 0).norm().double_value(&[]);
            let coef = max / (total + 1e-6);
            if coef < 1.0 {
                for g in &mut grads {
                    let _ = g.g_mul_scalar_(coef);
                }
            }
        }
        self.step();
    }

    /// One AdamW update of every parameter with a gradient.
    pub fn step(&mut self) {
        let _guard = tch::no_grad_guard();
        let (b1, b2) = self.betas;
        let decay = 1.0 - self.lr * self.weight_decay;
        for i in 0..self.params.len() {
            let g = self.params[i].grad();
            if !g.defined() {
                continue;
            }
            self.t[i] += 1;
            let step = self.t[i] as f64;
            let w = &mut self.params[i];
            let _ = w.g_mul_scalar_(decay);
            let _ = self.m[i].lerp_(&g, 1.0 - b1);
            let _ = self.v[i].g_mul_scalar_(b2);
            let _ = g.mul_scalar_out(&self.tmp[i], 1.0 - b2);
            let _ = self.v[i].addcmul_(&self.tmp[i], &g);
            let step_size = self.lr / (1.0 - b1.powf(step));
            let mut denom = self.v[i].sqrt_out(&self.denom[i]);
            let _ = denom.g_div_scalar_((1.0 - b2.powf(step)).sqrt());
            let _ = denom.g_add_scalar_(self.eps);
            let _ = self.m[i].mul_scalar_out(&self.tmp[i], -step_size);
            let _ = w.addcdiv_(&self.tmp[i], &denom);
        }
    }
}
