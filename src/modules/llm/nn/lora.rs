//! [`LoraAdapter`]: PEFT's LoRA on one [`Linear`](super::Linear): `y = base(x) + s · B(A(drop(x)))`
//! with `A` `[r, in]`, `B` `[out, r]` and `s = lora_alpha / r` (`lora_alpha / √r` with rsLoRA),
//! and [`LoraSwitch`], the flag every adapter of a model shares: adapters on or off (the
//! reference model of TRL's PEFT path is the same weights with the adapters off) and
//! training (dropout on) or not.
//!
//! `A` and `B` have PEFT's shapes whatever the base layer's [`WeightLayout`](super::WeightLayout)
//! (GPT-2's `Conv1D` included), so their values are PEFT's `lora_A.weight` / `lora_B.weight` as
//! they are. The model-level API (targets by module name, saving and loading PEFT's files,
//! merging) is [`crate::modules::llm::lora`].
//!
//! # Shapes
//! `x` `[.., in]` → `[.., out]`.
//!
//! ```
//! use tch::{nn::VarStore, Device, Tensor};
//! use torchrl::modules::llm::nn::{Linear, LoraSwitch, WeightLayout};
//! # fn main() -> torchrl::Result<()> {
//! let vs = VarStore::new(Device::Cpu);
//! let mut lin = Linear::new(&vs.root(), "q_proj", 3, 2, false, WeightLayout::OutIn, 0.5)?;
//! let x = Tensor::from_slice(&[1.0f32, 2.0, 3.0]).view([1, 3]);
//! let base = lin.forward(&x)?;
//! let switch = LoraSwitch::new();
//! // r = 1, lora_alpha = 2: scaling 2
//! lin.attach_lora(&(vs.root() / "lora"), 1, 2.0, 0.0, &switch)?;
//! // PEFT's init: B = 0, so the adapter starts as the identity
//! assert!((lin.forward(&x)? - &base).abs().max().double_value(&[]) < 1e-7);
//! let adapter = lin.lora().unwrap();
//! tch::no_grad(|| adapter.a().shallow_clone().copy_(&Tensor::from_slice(&[1.0f32, 0.0, 0.0]).view([1, 3])));
//! tch::no_grad(|| adapter.b().shallow_clone().copy_(&Tensor::from_slice(&[1.0f32, -1.0]).view([2, 1])));
//! // delta = 2 · B A x = 2 · [1, -1] · x₀ = [2, -2]
//! // (the base output is random, so the difference is exact only to float32 rounding)
//! let delta = Vec::<f32>::try_from((lin.forward(&x)? - &base).view([-1]))?;
//! assert!((delta[0] - 2.0).abs() < 1e-5 && (delta[1] + 2.0).abs() < 1e-5, "{delta:?}");
//! // adapters off: the base layer again
//! let off = switch.disabled(|| lin.forward(&x))?;
//! assert!((off - &base).abs().max().double_value(&[]) < 1e-7);
//! # Ok(()) }
//! ```

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tch::nn::{Init, Path};
use tch::Tensor;

use super::{copy_var, sub_path};
use crate::error::{Error, Result};

/// The state every adapter of one model shares: whether the adapters apply, and whether
/// dropout is on. Clones share the state (an `Arc`).
#[derive(Clone)]
pub struct LoraSwitch {
    state: Arc<SwitchState>,
}

struct SwitchState {
    enabled: AtomicBool,
    training: AtomicBool,
}

impl fmt::Debug for LoraSwitch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "LoraSwitch(enabled: {}, training: {})",
            self.is_enabled(),
            self.is_training()
        )
    }
}

impl Default for LoraSwitch {
    fn default() -> Self {
        LoraSwitch::new()
    }
}

impl LoraSwitch {
    /// Adapters on, dropout off (evaluation).
    pub fn new() -> Self {
        LoraSwitch {
            state: Arc::new(SwitchState {
                enabled: AtomicBool::new(true),
                training: AtomicBool::new(false),
            }),
        }
    }

    /// Whether the adapters apply.
    pub fn is_enabled(&self) -> bool {
        self.state.enabled.load(Ordering::Relaxed)
    }

    /// Turns the adapters on or off.
    pub fn set_enabled(&self, enabled: bool) {
        self.state.enabled.store(enabled, Ordering::Relaxed);
    }

    /// Whether `lora_dropout` applies (training).
    pub fn is_training(&self) -> bool {
        self.state.training.load(Ordering::Relaxed)
    }

    /// Turns dropout on (training) or off (evaluation).
    pub fn set_training(&self, training: bool) {
        self.state.training.store(training, Ordering::Relaxed);
    }

    /// Runs `f` with the adapters off (PEFT's `disable_adapter()`), restoring the previous
    /// state afterwards, whatever `f` returns.
    pub fn disabled<T>(&self, f: impl FnOnce() -> T) -> T {
        let before = self.state.enabled.swap(false, Ordering::Relaxed);
        let out = f();
        self.set_enabled(before);
        out
    }

    /// Runs `f` with dropout on, restoring the previous state afterwards.
    pub fn training<T>(&self, f: impl FnOnce() -> T) -> T {
        let before = self.state.training.swap(true, Ordering::Relaxed);
        let out = f();
        self.set_training(before);
        out
    }

    /// Whether `self` and `other` are the same switch.
    pub fn same_as(&self, other: &LoraSwitch) -> bool {
        Arc::ptr_eq(&self.state, &other.state)
    }
}

/// One layer's LoRA adapter. See the [module docs](self).
pub struct LoraAdapter {
    a: Tensor,
    b: Tensor,
    scaling: f64,
    dropout: f64,
    switch: LoraSwitch,
}

impl fmt::Debug for LoraAdapter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "LoraAdapter(r: {}, scaling: {}, dropout: {})",
            self.rank(),
            self.scaling,
            self.dropout
        )
    }
}

impl LoraAdapter {
    /// A new adapter under `path` (`lora_A.weight`, `lora_B.weight`) for a layer of `n_in` →
    /// `n_out`, with PEFT's init: `A` Kaiming-uniform (bound `1/√in`), `B` zero.
    ///
    /// # Errors
    /// A rank that is not positive, a non-finite scaling or a dropout outside `[0, 1)`.
    pub fn new(
        path: &Path<'_>,
        n_in: i64,
        n_out: i64,
        r: i64,
        scaling: f64,
        dropout: f64,
        switch: &LoraSwitch,
    ) -> Result<Self> {
        check_hyper(r, scaling, dropout)?;
        let bound = 1.0 / (n_in.max(1) as f64).sqrt();
        let a = super::uniform_var(&(path / "lora_A"), "weight", &[r, n_in], -bound, bound)?;
        let b = (path / "lora_B").f_var("weight", &[n_out, r], Init::Const(0.0))?;
        Ok(LoraAdapter {
            a,
            b,
            scaling,
            dropout,
            switch: switch.clone(),
        })
    }

    /// `A`, `[r, in]` (PEFT's `lora_A.weight`).
    pub fn a(&self) -> &Tensor {
        &self.a
    }

    /// `B`, `[out, r]` (PEFT's `lora_B.weight`).
    pub fn b(&self) -> &Tensor {
        &self.b
    }

    /// The rank `r`.
    pub fn rank(&self) -> i64 {
        self.a.size().first().copied().unwrap_or(0)
    }

    /// The factor on `B A x`.
    pub fn scaling(&self) -> f64 {
        self.scaling
    }

    /// The switch this adapter follows.
    pub fn switch(&self) -> &LoraSwitch {
        &self.switch
    }

    /// `s · B A drop(x)` for `x` `[.., in]`, or `None` while the adapters are off.
    pub fn delta(&self, x: &Tensor) -> Result<Option<Tensor>> {
        if !self.switch.is_enabled() {
            return Ok(None);
        }
        let x = if self.dropout > 0.0 && self.switch.is_training() {
            x.f_dropout(self.dropout, true)?
        } else {
            x.shallow_clone()
        };
        let a = self.a.f_to_kind(x.kind())?;
        let b = self.b.f_to_kind(x.kind())?;
        let h = x.f_matmul(&a.f_tr()?)?;
        Ok(Some(h.f_matmul(&b.f_tr()?)?.f_mul_scalar(self.scaling)?))
    }

    /// `s · B A`, `[out, in]`: what merging adds to an `[out, in]` weight.
    pub fn delta_weight(&self) -> Result<Tensor> {
        Ok(self.b.f_matmul(&self.a)?.f_mul_scalar(self.scaling)?)
    }

    /// The same adapter sharing its tensors and switch.
    pub(crate) fn shallow(&self) -> Self {
        LoraAdapter {
            a: self.a.shallow_clone(),
            b: self.b.shallow_clone(),
            scaling: self.scaling,
            dropout: self.dropout,
            switch: self.switch.clone(),
        }
    }

    /// A copy under `path` (same values, scaling and dropout) following `switch`.
    pub fn copy_to(&self, path: &Path<'_>, switch: &LoraSwitch) -> Result<Self> {
        Ok(LoraAdapter {
            a: copy_var(&(path / "lora_A"), "weight", &self.a)?,
            b: copy_var(&(path / "lora_B"), "weight", &self.b)?,
            scaling: self.scaling,
            dropout: self.dropout,
            switch: switch.clone(),
        })
    }
}

/// Checks an adapter's rank, scaling and dropout.
pub(crate) fn check_hyper(r: i64, scaling: f64, dropout: f64) -> Result<()> {
    let op = "LoraAdapter::new";
    if r <= 0 {
        return Err(Error::config(op, "r", "a rank >= 1", r.to_string()));
    }
    if !scaling.is_finite() {
        return Err(Error::config(
            op,
            "lora_alpha",
            "a finite lora_alpha (scaling = lora_alpha / r)",
            scaling.to_string(),
        ));
    }
    if !(0.0..1.0).contains(&dropout) {
        return Err(Error::config(
            op,
            "lora_dropout",
            "a probability in [0, 1)",
            dropout.to_string(),
        ));
    }
    Ok(())
}

/// The adapter path of a layer named `name` under `path` (`name.lora_A.weight`, …).
pub(crate) fn adapter_path<'a>(path: &Path<'a>, name: &str) -> Path<'a> {
    sub_path(path, name)
}
