//! The trainers' optimizer and schedule: [`AdamW`] over named parameters (so its state can be
//! checkpointed by name) with PyTorch's `torch.optim.AdamW` arithmetic, and
//! [`CosineAnnealingLr`], PyTorch's `CosineAnnealingLR` in closed form, as trlX builds them
//! from the `optimizer` and `scheduler` config sections.
//!
//! ```
//! use tch::{Kind, Tensor};
//! use torchrl::trainers::optim::{AdamW, CosineAnnealingLr};
//! # fn main() -> torchrl::Result<()> {
//! let w = Tensor::from_slice(&[1.0f32, -1.0]).set_requires_grad(true);
//! let mut opt = AdamW::new(vec![("w".into(), w.shallow_clone())], 0.1)?.with_weight_decay(0.0);
//! let mut sched = CosineAnnealingLr::new(0.1, 10.0, 0.0)?;
//! (&w * &w).sum(Kind::Float).backward(); // grad = 2w = [2, -2]
//! opt.step()?;
//! opt.zero_grad();
//! opt.set_lr(sched.step());
//! // The first Adam step moves each weight by lr against the sign of its gradient.
//! let v = Vec::<f32>::try_from(&w)?;
//! assert!((v[0] - 0.9).abs() < 1e-6 && (v[1] + 0.9).abs() < 1e-6);
//! // lr(1) = 0.1 * (1 + cos(pi / 10)) / 2
//! assert!((opt.lr() - 0.05 * (1.0 + (std::f64::consts::PI / 10.0).cos())).abs() < 1e-15);
//! # Ok(()) }
//! ```

use std::collections::{BTreeMap, HashSet};

use serde_json::{json, Value};
use tch::{nn, Kind, Tensor};

use crate::error::{Error, Result};
use crate::macros::setters;
use crate::modules::llm::nn::checkpoint;
use crate::objectives::optim::clip_grad_norm_tensors;
use crate::trainers::config::AdamWKwargs;
pub use crate::trainers::config::{MAX_LR, MAX_STEPS};
pub use crate::trainers::schedule::CosineAnnealingLr;

/// Gradient summing overlapped with backward (see
/// [`Collective::gradient_sync`](super::parallel::Collective::gradient_sync)): once
/// [`prepare`](Self::prepare)d, the next backward pass leaves in every parameter's `.grad` the
/// sum of the ranks' gradients. `crate::distributed::GradientHooks` (c10d's DDP reducer) is
/// the implementation.
pub trait GradientSync: Send {
    /// Arms the sync for the next backward pass from `outputs` (the loss).
    ///
    /// # Errors
    /// When the group refuses.
    fn prepare(&self, outputs: &[&Tensor]) -> Result<()>;
}

#[cfg(feature = "distributed")]
impl GradientSync for crate::distributed::GradientHooks {
    fn prepare(&self, outputs: &[&Tensor]) -> Result<()> {
        crate::distributed::GradientHooks::prepare(self, outputs)
    }
}

/// `torch.optim.AdamW` (`amsgrad=False`, `maximize=False`) over a list of named parameters.
///
/// Per parameter with a gradient `g`, at its step `t` (counted per parameter, as PyTorch):
/// `p *= 1 - lr·wd`; `m = lerp(m, g, 1 - β1)`; `v = β2·v + (1 - β2)·g²`;
/// `p -= lr / (1 - β1^t) · m / (sqrt(v) / sqrt(1 - β2^t) + eps)`.
/// Parameters whose gradient is undefined (never computed) are skipped, their moments and
/// step untouched. [`AdamW::zero_grad`] zeroes gradients in place (PyTorch's
/// `set_to_none=False`; `tch` cannot unset a gradient), so a parameter that had a gradient
/// once is stepped (with a zero gradient) from then on.
///
/// The parameters are shallow clones: `step` updates the caller's tensors (a `VarStore`'s
/// variables) in place. The arithmetic follows PyTorch's single-tensor (`foreach=False`)
/// kernel call for call, so on the CPU results match `torch.optim.AdamW` bit for bit (the
/// recorded cases in `specs/trainers_cases.json`). `step` keeps two work buffers per dtype and
/// device, each as large as the largest parameter, instead of allocating temporaries.
pub struct AdamW {
    names: Vec<String>,
    params: Vec<Tensor>,
    exp_avg: Vec<Tensor>,
    exp_avg_sq: Vec<Tensor>,
    /// float32 master copies of the half-precision (bf16 / f16) parameters, which the update
    /// runs on (`None` for float32 / float64 parameters, updated in place).
    master: Vec<Option<Tensor>>,
    steps: Vec<u64>,
    lr: f64,
    betas: [f64; 2],
    eps: f64,
    weight_decay: f64,
    /// Two flat work buffers per (device, dtype), as long as the largest such parameter:
    /// `step` writes its temporaries into views of them instead of allocating.
    scratch: Vec<Scratch>,
    /// Gradient summing during backward in a data-parallel group
    /// ([`AdamW::set_gradient_sync`]).
    sync: Option<Box<dyn GradientSync>>,
    /// Step the parameters without a float32 master through one fused libtorch call per
    /// device and dtype ([`AdamW::with_fused`]).
    fused: bool,
}

impl std::fmt::Debug for AdamW {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdamW")
            .field("names", &self.names)
            .field("lr", &self.lr)
            .field("betas", &self.betas)
            .field("eps", &self.eps)
            .field("weight_decay", &self.weight_decay)
            .field("gradient_sync", &self.sync.is_some())
            .finish_non_exhaustive()
    }
}

#[derive(Debug)]
struct Scratch {
    device: tch::Device,
    kind: tch::Kind,
    a: Tensor,
    b: Tensor,
    /// The float32 copy of a low-precision gradient (masters only; empty until needed).
    c: Tensor,
}

/// The work buffers for `p`, shaped as `p`, from `pool` (grown or added as needed): two, and a
/// third when `with_grad` (the gradient converted to `p`'s dtype, for master weights: a fresh
/// conversion would map and zero new pages for every parameter on every step).
fn scratch_for(
    pool: &mut Vec<Scratch>,
    p: &Tensor,
    with_grad: bool,
) -> Result<(Tensor, Tensor, Option<Tensor>)> {
    let (device, kind, numel) = (p.device(), p.kind(), p.numel());
    let pos = pool
        .iter()
        .position(|s| s.device == device && s.kind == kind);
    let slot = match pos {
        Some(i) => pool.get_mut(i),
        None => {
            pool.push(Scratch {
                device,
                kind,
                a: Tensor::f_empty([0], (kind, device))?,
                b: Tensor::f_empty([0], (kind, device))?,
                c: Tensor::f_empty([0], (kind, device))?,
            });
            pool.last_mut()
        }
    };
    let Some(s) = slot else {
        return Err(Error::invalid("AdamW::step", "scratch pool is empty"));
    };
    // Element counts of real tensors fit in i64.
    let len = numel as i64;
    if s.a.numel() < numel {
        s.a = Tensor::f_empty([len], (kind, device))?;
        s.b = Tensor::f_empty([len], (kind, device))?;
    }
    if with_grad && s.c.numel() < numel {
        s.c = Tensor::f_empty([len], (kind, device))?;
    }
    let shape = p.size();
    let c = if with_grad {
        Some(s.c.f_narrow(0, 0, len)?.f_view(shape.as_slice())?)
    } else {
        None
    };
    Ok((
        s.a.f_narrow(0, 0, len)?.f_view(shape.as_slice())?,
        s.b.f_narrow(0, 0, len)?.f_view(shape.as_slice())?,
        c,
    ))
}

const OP_NEW: &str = "AdamW::new";

/// Whether parameters of `kind` train through a float32 master copy.
fn is_half(kind: Kind) -> bool {
    matches!(kind, Kind::BFloat16 | Kind::Half)
}

/// The one check of AdamW's hyper-parameters, shared by the constructor, `step` and
/// [`AdamW::load_state`]: a finite `lr >= 0`, betas in [0, 1), a finite `eps > 0` and a finite
/// weight decay >= 0.
fn check_hyper(
    op: &'static str,
    lr: f64,
    betas: [f64; 2],
    eps: f64,
    weight_decay: f64,
) -> Result<()> {
    if !(lr.is_finite() && lr >= 0.0) {
        return Err(Error::config(op, "lr", "a finite number >= 0", lr));
    }
    if !betas.iter().all(|b| (0.0..1.0).contains(b)) {
        return Err(Error::config(
            op,
            "betas",
            "two numbers in [0, 1)",
            format!("{betas:?}"),
        ));
    }
    if !(eps.is_finite() && eps > 0.0) {
        return Err(Error::config(op, "eps", "a finite number > 0", eps));
    }
    if !(weight_decay.is_finite() && weight_decay >= 0.0) {
        return Err(Error::config(
            op,
            "weight_decay",
            "a finite number >= 0",
            weight_decay,
        ));
    }
    Ok(())
}

/// An optimizer state read and checked by [`AdamW::prepare_state`], not yet applied: the
/// moments already in the parameters' dtypes and devices, so that
/// [`AdamW::commit_state`] only copies.
pub(crate) struct PreparedAdamW {
    moments: Vec<(Tensor, Tensor)>,
    masters: Vec<Option<Tensor>>,
    steps: Vec<u64>,
    lr: f64,
    betas: [f64; 2],
    eps: f64,
    weight_decay: f64,
}

impl AdamW {
    /// An optimizer over `params` (name, tensor) with learning rate `lr` and PyTorch's other
    /// defaults (betas (0.9, 0.999), eps 1e-8, weight decay 0.01); change them with the
    /// `with_*` methods or build from trlX's arguments with [`AdamW::from_kwargs`].
    ///
    /// # Errors
    /// When a name repeats, a parameter is not floating point, or `lr` is negative (0 is
    /// allowed, as in PyTorch: a cosine schedule with `eta_min = 0` reaches it).
    pub fn new(params: Vec<(String, Tensor)>, lr: f64) -> Result<Self> {
        if !(lr.is_finite() && lr >= 0.0) {
            return Err(Error::config(OP_NEW, "lr", "a finite number >= 0", lr));
        }
        let mut seen = HashSet::new();
        let mut names = Vec::with_capacity(params.len());
        let mut tensors = Vec::with_capacity(params.len());
        let mut exp_avg = Vec::with_capacity(params.len());
        let mut exp_avg_sq = Vec::with_capacity(params.len());
        let mut master = Vec::with_capacity(params.len());
        for (name, p) in params {
            if !seen.insert(name.clone()) {
                return Err(Error::argument(
                    OP_NEW,
                    "params",
                    "distinct parameter names",
                    format!("{name:?} twice"),
                ));
            }
            if !p.is_floating_point() {
                return Err(Error::value(
                    OP_NEW,
                    &name,
                    "a floating-point parameter",
                    format!("{:?}", p.kind()),
                ));
            }
            let _guard = tch::no_grad_guard();
            // half-precision parameters train through a float32 master copy, with float32
            // moments: an update below the parameter's resolution (bf16 keeps 8 bits) would
            // otherwise be rounded away
            let w = if is_half(p.kind()) {
                Some(p.f_detach()?.f_to_kind(Kind::Float)?)
            } else {
                None
            };
            let like = w.as_ref().unwrap_or(&p);
            exp_avg.push(like.f_zeros_like()?);
            exp_avg_sq.push(like.f_zeros_like()?);
            master.push(w);
            names.push(name);
            tensors.push(p);
        }
        let steps = vec![0; names.len()];
        Ok(AdamW {
            names,
            params: tensors,
            exp_avg,
            exp_avg_sq,
            master,
            steps,
            lr,
            betas: [0.9, 0.999],
            eps: 1e-8,
            weight_decay: 0.01,
            scratch: Vec::new(),
            sync: None,
            fused: false,
        })
    }

    /// An optimizer with trlX's `optimizer.kwargs` (lr, betas, eps, weight_decay).
    ///
    /// ```
    /// use tch::Tensor;
    /// use torchrl::trainers::{config::AdamWKwargs, optim::AdamW};
    /// let p = Tensor::zeros([3], (tch::Kind::Float, tch::Device::Cpu)).set_requires_grad(true);
    /// let opt = AdamW::from_kwargs(vec![("p".into(), p)], &AdamWKwargs::default()).unwrap();
    /// assert_eq!(opt.lr(), 3e-5);
    /// assert_eq!(opt.betas(), [0.9, 0.95]);
    /// ```
    ///
    /// # Errors
    /// As [`AdamW::new`], and when betas are outside [0, 1), eps is not > 0 or the weight
    /// decay is negative.
    pub fn from_kwargs(params: Vec<(String, Tensor)>, kwargs: &AdamWKwargs) -> Result<Self> {
        let opt = AdamW::new(params, kwargs.lr)?
            .with_betas(kwargs.betas)
            .with_eps(kwargs.eps)
            .with_weight_decay(kwargs.weight_decay)
            .with_fused(kwargs.fused);
        opt.check_hyper(OP_NEW)?;
        Ok(opt)
    }

    /// An optimizer over the trainable variables of `vs`, named as in the store, in name order.
    ///
    /// ```
    /// use tch::{nn, Device};
    /// use torchrl::trainers::optim::AdamW;
    /// let vs = nn::VarStore::new(Device::Cpu);
    /// let _lin = nn::linear(vs.root() / "lin", 3, 2, Default::default());
    /// let opt = AdamW::from_var_store(&vs, 1e-3).unwrap();
    /// assert_eq!(opt.names(), ["lin.bias", "lin.weight"]);
    /// ```
    ///
    /// # Errors
    /// As [`AdamW::new`].
    pub fn from_var_store(vs: &nn::VarStore, lr: f64) -> Result<Self> {
        let vars: BTreeMap<String, Tensor> = vs
            .variables()
            .into_iter()
            .filter(|(_, t)| t.requires_grad())
            .collect();
        AdamW::new(vars.into_iter().collect(), lr)
    }

    setters! {
        /// Sets the moment decay rates (β1, β2), each in [0, 1) (checked by `step`).
        with_betas(betas: [f64; 2]);
        /// Sets eps, added outside the square root, > 0 (checked by `step`).
        with_eps(eps: f64);
        /// Sets the decoupled weight decay, ≥ 0 (checked by `step`).
        with_weight_decay(weight_decay: f64);
        /// Sets `fused` (`torch.optim.AdamW(fused=True)`, default `false`): `step` updates
        /// the parameters that have no float32 master through one `aten::_fused_adamw_` call
        /// per device and dtype. That is one pass over each parameter, its gradient and
        /// moments, instead of about ten element-wise ops per parameter. On the CPU the
        /// results are the per-tensor step's bit for bit in `tests/fused_adamw.rs` (30 steps,
        /// float32 and float64; libtorch does not promise it, the test allows 1e-6).
        /// Half-precision parameters keep the per-tensor step through their masters, as do
        /// builds without the C++ shim.
        with_fused(fused: bool);
    }

    fn check_hyper(&self, op: &'static str) -> Result<()> {
        check_hyper(op, self.lr, self.betas, self.eps, self.weight_decay)
    }

    /// The parameter names, in order.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The parameters (shallow clones of the caller's), in the order of [`AdamW::names`].
    pub fn params(&self) -> &[Tensor] {
        &self.params
    }

    /// The current learning rate.
    pub fn lr(&self) -> f64 {
        self.lr
    }

    /// Sets the learning rate (what a schedule does after each step).
    pub fn set_lr(&mut self, lr: f64) {
        self.lr = lr;
    }

    /// (β1, β2).
    pub fn betas(&self) -> [f64; 2] {
        self.betas
    }

    /// eps.
    pub fn eps(&self) -> f64 {
        self.eps
    }

    /// The weight decay.
    pub fn weight_decay(&self) -> f64 {
        self.weight_decay
    }

    /// Steps taken by each parameter (0 for a parameter that never had a gradient).
    pub fn steps(&self) -> &[u64] {
        &self.steps
    }

    /// One AdamW update of every parameter that has a gradient, under `no_grad`.
    ///
    /// # Errors
    /// When a hyper-parameter is out of range (set through a `with_*` method or
    /// [`AdamW::set_lr`]), or on a libtorch error.
    pub fn step(&mut self) -> Result<()> {
        self.check_hyper("AdamW::step")?;
        let _guard = tch::no_grad_guard();
        let [beta1, beta2] = self.betas;
        let decay = 1.0 - self.lr * self.weight_decay;
        let done = if self.fused {
            self.step_fused()?
        } else {
            Vec::new()
        };
        let items = self
            .params
            .iter_mut()
            .zip(self.exp_avg.iter_mut())
            .zip(self.exp_avg_sq.iter_mut())
            .zip(self.master.iter_mut())
            .zip(self.steps.iter_mut());
        for (i, ((((p, m), v), master), t)) in items.enumerate() {
            let g = p.grad();
            if !g.defined() || done.contains(&i) {
                continue;
            }
            // Loaded counts are at most MAX_STEPS = 2^53, so the conversion is exact.
            *t = t.saturating_add(1);
            let step = *t as f64;
            let w = match master {
                Some(w) => w.shallow_clone(),
                None => p.shallow_clone(),
            };
            let (tmp, denom, g32) = scratch_for(&mut self.scratch, &w, master.is_some())?;
            let g = match g32 {
                // the gradient in the master's float32, converted into the work buffer
                Some(mut g32) => {
                    g32.f_copy_(&g)?;
                    g32
                }
                None => g,
            };
            let mut w = w;
            let _ = w.f_mul_scalar_(decay)?;
            let _ = m.f_lerp_(&g, 1.0 - beta1)?;
            let _ = v.f_mul_scalar_(beta2)?;
            // v += ((1 - β2)·g)·g, as `addcmul_(g, g, value=1 - β2)`.
            let _ = g.f_mul_scalar_out(&tmp, 1.0 - beta2)?;
            let _ = v.f_addcmul_(&tmp, &g)?;
            let bias_correction1 = 1.0 - beta1.powf(step);
            let bias_correction2_sqrt = (1.0 - beta2.powf(step)).sqrt();
            let step_size = self.lr / bias_correction1;
            let mut denom = v.f_sqrt_out(&denom)?;
            let _ = denom.f_div_scalar_(bias_correction2_sqrt)?;
            let _ = denom.f_add_scalar_(self.eps)?;
            // w += (-step_size·m) / denom, as `addcdiv_(m, denom, value=-step_size)`.
            let _ = m.f_mul_scalar_out(&tmp, -step_size)?;
            let _ = w.f_addcdiv_(&tmp, &denom)?;
            if master.is_some() {
                // the parameter is the master rounded to its dtype
                p.f_copy_(&w)?;
            }
        }
        Ok(())
    }

    /// The fused part of [`AdamW::step`]: the parameters with a gradient and no master,
    /// grouped by device and dtype, each group in one `aten::_fused_adamw_` call after their
    /// step counts are incremented. Returns the indices it stepped (none in a build without
    /// the C++ shim: the per-tensor loop steps them).
    fn step_fused(&mut self) -> Result<Vec<usize>> {
        let masters = &self.master;
        let groups = crate::objectives::fused_groups(&self.params, |i| {
            masters.get(i).is_some_and(Option::is_none)
        });
        let mut done = Vec::new();
        for ((device, _), idx) in groups {
            let pick = |v: &[Tensor]| crate::objectives::picked(v, &idx);
            let params = pick(&self.params);
            let grads: Vec<Tensor> = params.iter().map(Tensor::grad).collect();
            // this step's counts (exact in float32 up to 2^24 steps, as torch.optim's)
            let mut steps = Vec::with_capacity(idx.len());
            for &i in &idx {
                let t = self.steps.get(i).copied().unwrap_or(0).saturating_add(1);
                steps.push(Tensor::f_full([], t as f64, (tch::Kind::Float, device))?);
            }
            let stepped = crate::objectives::fused_adamw_step(
                &params,
                &grads,
                &pick(&self.exp_avg),
                &pick(&self.exp_avg_sq),
                &steps,
                [
                    self.lr,
                    self.betas[0],
                    self.betas[1],
                    self.weight_decay,
                    self.eps,
                ],
            )?;
            if !stepped {
                return Ok(Vec::new());
            }
            for &i in &idx {
                if let Some(t) = self.steps.get_mut(i) {
                    *t = t.saturating_add(1);
                }
            }
            done.extend(idx);
        }
        Ok(done)
    }

    /// One training step on `loss`: zero the gradients, backward, clip the global gradient
    /// norm to `max_grad_norm` (when given), step. Returns the norm before clipping (`None`
    /// without clipping).
    ///
    /// ```
    /// use tch::{Kind, Tensor};
    /// use torchrl::trainers::optim::AdamW;
    /// # fn main() -> torchrl::Result<()> {
    /// let w = Tensor::from_slice(&[3.0f32, 4.0]).set_requires_grad(true);
    /// let mut opt = AdamW::new(vec![("w".into(), w.shallow_clone())], 0.1)?;
    /// let loss = (&w * &w).sum(Kind::Float) * 0.5; // gradient = w = (3, 4), norm 5
    /// let norm = opt.backward_step(&loss, Some(1.0))?;
    /// assert!((norm.unwrap() - 5.0).abs() < 1e-6);
    /// assert!(w.double_value(&[0]) < 3.0);
    /// # Ok(()) }
    /// ```
    pub fn backward_step(
        &mut self,
        loss: &Tensor,
        max_grad_norm: Option<f64>,
    ) -> Result<Option<f64>> {
        self.backward_step_with(loss, max_grad_norm, |_| Ok(()))
    }

    /// [`AdamW::backward_step`] with `reduce_grads` run on the named parameters between the
    /// backward pass and the clipping: data-parallel training sums the gradients over the
    /// ranks there ([`Collective::all_reduce_sum_gradients`]), so the norm that is clipped is
    /// the global one and every rank clips and steps identically. With a gradient sync
    /// attached ([`AdamW::set_gradient_sync`]) the sums happen during backward instead, and
    /// `reduce_grads` is not called.
    ///
    /// [`Collective::all_reduce_sum_gradients`]: crate::trainers::parallel::Collective::all_reduce_sum_gradients
    ///
    /// ```
    /// use tch::{Kind, Tensor};
    /// use torchrl::trainers::optim::AdamW;
    /// # fn main() -> torchrl::Result<()> {
    /// let w = Tensor::from_slice(&[3.0f32, 4.0]).set_requires_grad(true);
    /// let mut opt = AdamW::new(vec![("w".into(), w.shallow_clone())], 0.1)?;
    /// let loss = (&w * &w).sum(Kind::Float) * 0.5;
    /// // a stand-in for a sum over two ranks with equal gradients: the norm doubles
    /// let norm = opt.backward_step_with(&loss, Some(1.0), |params| {
    ///     for (_, p) in params {
    ///         let _ = p.grad().f_mul_scalar_(2.0)?;
    ///     }
    ///     Ok(())
    /// })?;
    /// assert!((norm.unwrap() - 10.0).abs() < 1e-5);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`AdamW::step`]; what `reduce_grads` returns (nothing is stepped then).
    pub fn backward_step_with(
        &mut self,
        loss: &Tensor,
        max_grad_norm: Option<f64>,
        reduce_grads: impl FnOnce(&[(String, Tensor)]) -> Result<()>,
    ) -> Result<Option<f64>> {
        self.zero_grad();
        // a checkpointed forward finishes its backward after the loss's
        // (modules::llm::nn::checkpoint); the gradient sync's hooks see one backward pass, so
        // with checkpointing the gradients are summed afterwards instead
        let checkpointed = checkpoint::pending() > 0;
        match &self.sync {
            Some(sync) if !checkpointed => {
                sync.prepare(&[loss])?;
                loss.f_backward()?;
            }
            _ => {
                loss.f_backward()?;
                checkpoint::backward_pending()?;
                reduce_grads(&self.named_params())?;
            }
        }
        let norm = match max_grad_norm {
            Some(max) => Some(clip_grad_norm_tensors(&self.params, max)?),
            None => None,
        };
        self.step()?;
        Ok(norm)
    }

    /// Attaches (or, with `None`, detaches) a [`GradientSync`] that sums the gradients over a
    /// data-parallel group during each [`AdamW::backward_step_with`]'s backward pass
    /// (overlapping the communication with backward), in place of its `reduce_grads` call
    /// afterwards. The trainers' `with_collective` attach
    /// [`Collective::gradient_sync`](crate::trainers::parallel::Collective::gradient_sync)'s.
    pub fn set_gradient_sync(&mut self, sync: Option<Box<dyn GradientSync>>) {
        self.sync = sync;
    }

    /// Whether a [`GradientSync`] is attached.
    pub fn has_gradient_sync(&self) -> bool {
        self.sync.is_some()
    }

    /// The parameters with their names (shallow clones, in the optimizer's order).
    pub fn named_params(&self) -> Vec<(String, Tensor)> {
        self.names
            .iter()
            .zip(&self.params)
            .map(|(n, p)| (n.clone(), p.shallow_clone()))
            .collect()
    }

    /// Zeroes every parameter's gradient in place (see the type's docs).
    pub fn zero_grad(&mut self) {
        for p in &mut self.params {
            p.zero_grad();
        }
    }

    /// The moment tensors by name, `exp_avg.<param>` and `exp_avg_sq.<param>` for each
    /// parameter (shallow clones), for a safetensors checkpoint.
    pub fn state_tensors(&self) -> Vec<(String, Tensor)> {
        let mut out = Vec::with_capacity(2 * self.names.len());
        for ((name, m), v) in self.names.iter().zip(&self.exp_avg).zip(&self.exp_avg_sq) {
            out.push((format!("exp_avg.{name}"), m.shallow_clone()));
            out.push((format!("exp_avg_sq.{name}"), v.shallow_clone()));
        }
        for (name, w) in self.names.iter().zip(&self.master) {
            if let Some(w) = w {
                out.push((format!("master.{name}"), w.shallow_clone()));
            }
        }
        out
    }

    /// The rest of the state as JSON: `lr`, `betas`, `eps`, `weight_decay` and `step`, a map
    /// from parameter name to its step count.
    ///
    /// ```
    /// use tch::Tensor;
    /// use torchrl::trainers::optim::AdamW;
    /// let p = Tensor::zeros([2], (tch::Kind::Float, tch::Device::Cpu));
    /// let opt = AdamW::new(vec![("p".into(), p)], 0.5).unwrap();
    /// let s = opt.state_json();
    /// assert_eq!(s["lr"], 0.5);
    /// assert_eq!(s["step"]["p"], 0);
    /// ```
    pub fn state_json(&self) -> Value {
        let steps: serde_json::Map<String, Value> = self
            .names
            .iter()
            .zip(&self.steps)
            .map(|(n, s)| (n.clone(), json!(s)))
            .collect();
        json!({
            "lr": self.lr,
            "betas": self.betas,
            "eps": self.eps,
            "weight_decay": self.weight_decay,
            "step": steps,
        })
    }

    /// Restores what [`AdamW::state_tensors`] and [`AdamW::state_json`] returned (from the
    /// same parameter list): the moments are copied into this optimizer's tensors, the step
    /// counts and hyper-parameters replaced. Nothing changes unless everything fits.
    ///
    /// ```
    /// use tch::{Kind, Tensor};
    /// use torchrl::trainers::optim::AdamW;
    /// # fn main() -> torchrl::Result<()> {
    /// let p = Tensor::from_slice(&[1.0f32, 2.0]).set_requires_grad(true);
    /// let mut a = AdamW::new(vec![("p".into(), p.shallow_clone())], 0.1)?;
    /// (&p * &p).sum(Kind::Float).backward();
    /// a.step()?;
    /// let q = Tensor::zeros([2], (Kind::Float, tch::Device::Cpu)).set_requires_grad(true);
    /// let mut b = AdamW::new(vec![("p".into(), q)], 0.9)?;
    /// b.load_state(&a.state_tensors(), &a.state_json())?;
    /// assert_eq!(b.steps(), [1]);
    /// assert_eq!(b.lr(), 0.1);
    /// // A state for other parameters is refused, naming what is missing.
    /// let r = Tensor::zeros([3], (Kind::Float, tch::Device::Cpu));
    /// let mut c = AdamW::new(vec![("r".into(), r)], 0.1)?;
    /// let err = c.load_state(&a.state_tensors(), &a.state_json()).unwrap_err();
    /// assert!(err.to_string().contains("exp_avg.r"));
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidValue`] naming the first missing or mis-shaped moment tensor, an
    /// unexpected tensor, or a missing / ill-typed JSON field.
    pub fn load_state(&mut self, tensors: &[(String, Tensor)], state: &Value) -> Result<()> {
        let prepared = self.prepare_state(tensors, state)?;
        self.commit_state(prepared)
    }

    /// Reads and checks everything [`AdamW::load_state`] would apply, changing nothing: the
    /// moment tensors (names, shapes, finite values, `exp_avg_sq >= 0`), the step counts
    /// (at most [`MAX_STEPS`]) and the hyper-parameters (the constructor's check).
    pub(crate) fn prepare_state(
        &self,
        tensors: &[(String, Tensor)],
        state: &Value,
    ) -> Result<PreparedAdamW> {
        const OP: &str = "AdamW::load_state";
        let given: BTreeMap<&str, &Tensor> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
        let mut expected = HashSet::new();
        let mut moments = Vec::with_capacity(self.names.len());
        let mut masters = Vec::with_capacity(self.names.len());
        for ((name, p), own) in self.names.iter().zip(&self.params).zip(&self.exp_avg) {
            let mut pair = Vec::with_capacity(2);
            for prefix in ["exp_avg", "exp_avg_sq"] {
                let key = format!("{prefix}.{name}");
                let t = given.get(key.as_str()).ok_or_else(|| {
                    Error::value(OP, &key, "a moment tensor in the state", "none")
                })?;
                if t.size() != p.size() {
                    return Err(Error::ShapeMismatch {
                        op: OP,
                        key,
                        expected: p.size(),
                        actual: t.size(),
                    });
                }
                let t = {
                    let _guard = tch::no_grad_guard();
                    t.f_to_kind(own.kind())?
                        .f_to_device(p.device())?
                        .f_detach()?
                };
                let finite = t.numel() == 0
                    || bool::try_from(t.f_isfinite()?.f_all()?)?
                        && (prefix == "exp_avg" || !bool::try_from(t.f_lt(0.0)?.f_any()?)?);
                if !finite {
                    let want = if prefix == "exp_avg" {
                        "finite values"
                    } else {
                        "finite values >= 0"
                    };
                    return Err(Error::value(OP, &key, want, "other values"));
                }
                pair.push(t);
                expected.insert(key);
            }
            match <[Tensor; 2]>::try_from(pair) {
                Ok([m, v]) => moments.push((m, v)),
                Err(_) => return Err(Error::invalid(OP, "two moments per parameter")),
            }
            if is_half(p.kind()) {
                let key = format!("master.{name}");
                let t = given.get(key.as_str()).ok_or_else(|| {
                    Error::value(
                        OP,
                        &key,
                        "the float32 master copy of a half-precision parameter",
                        "none",
                    )
                })?;
                if t.size() != p.size() {
                    return Err(Error::ShapeMismatch {
                        op: OP,
                        key,
                        expected: p.size(),
                        actual: t.size(),
                    });
                }
                let t = {
                    let _guard = tch::no_grad_guard();
                    t.f_to_kind(Kind::Float)?
                        .f_to_device(p.device())?
                        .f_detach()?
                };
                if t.numel() > 0 && !bool::try_from(t.f_isfinite()?.f_all()?)? {
                    return Err(Error::value(OP, &key, "finite values", "other values"));
                }
                masters.push(Some(t));
                expected.insert(key);
            } else {
                masters.push(None);
            }
        }
        if let Some(extra) = given.keys().find(|k| !expected.contains(**k)) {
            return Err(Error::value(
                OP,
                extra,
                "only moments of this optimizer's parameters",
                "a tensor for another parameter",
            ));
        }
        let num = |field: &str| -> Result<f64> {
            state
                .get(field)
                .and_then(Value::as_f64)
                .ok_or_else(|| Error::value(OP, field, "a number in the state JSON", "none"))
        };
        let lr = num("lr")?;
        let eps = num("eps")?;
        let weight_decay = num("weight_decay")?;
        let betas = match state
            .get("betas")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
        {
            Some([b1, b2]) => match (b1.as_f64(), b2.as_f64()) {
                (Some(b1), Some(b2)) => [b1, b2],
                _ => return Err(Error::value(OP, "betas", "two numbers", "other values")),
            },
            _ => return Err(Error::value(OP, "betas", "two numbers", "none")),
        };
        check_hyper(OP, lr, betas, eps, weight_decay)?;
        let step_map = state
            .get("step")
            .and_then(Value::as_object)
            .ok_or_else(|| Error::value(OP, "step", "a map of step counts", "none"))?;
        let mut steps = Vec::with_capacity(self.names.len());
        for name in &self.names {
            let s = step_map
                .get(name)
                .and_then(Value::as_u64)
                .ok_or_else(|| Error::value(OP, format!("step.{name}"), "a step count", "none"))?;
            if s > MAX_STEPS {
                return Err(Error::value(
                    OP,
                    format!("step.{name}"),
                    format!("a step count of at most {MAX_STEPS}"),
                    s.to_string(),
                ));
            }
            steps.push(s);
        }
        Ok(PreparedAdamW {
            moments,
            masters,
            steps,
            lr,
            betas,
            eps,
            weight_decay,
        })
    }

    /// Applies a state [`AdamW::prepare_state`] checked. Only libtorch's copy of
    /// same-shaped, same-dtype, same-device tensors can fail here.
    pub(crate) fn commit_state(&mut self, prepared: PreparedAdamW) -> Result<()> {
        let _guard = tch::no_grad_guard();
        for ((m, v), (src_m, src_v)) in self
            .exp_avg
            .iter_mut()
            .zip(self.exp_avg_sq.iter_mut())
            .zip(&prepared.moments)
        {
            m.f_copy_(src_m)?;
            v.f_copy_(src_v)?;
        }
        for (w, src) in self.master.iter_mut().zip(&prepared.masters) {
            if let (Some(w), Some(src)) = (w, src) {
                w.f_copy_(src)?;
            }
        }
        self.steps = prepared.steps;
        self.lr = prepared.lr;
        self.betas = prepared.betas;
        self.eps = prepared.eps;
        self.weight_decay = prepared.weight_decay;
        Ok(())
    }
}

/// Shallow clones of named parameters (what [`AdamW::new`] and
/// [`Component::tensors`](super::api::Component::tensors) take from a model's
/// `named_parameters()`).
pub fn shallow_named(params: Vec<(String, &Tensor)>) -> Vec<(String, Tensor)> {
    params
        .into_iter()
        .map(|(n, p)| (n, p.shallow_clone()))
        .collect()
}
