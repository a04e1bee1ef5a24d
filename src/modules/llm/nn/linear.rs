//! [`Linear`]: `y = x Wᵀ + b` with `transformers`' weight layouts: `nn.Linear`'s `[out, in]`
//! ([`WeightLayout::OutIn`]) or GPT-2's `Conv1D`, `[in, out]` ([`WeightLayout::InOut`], the
//! same map read as a transposed weight). The bias is optional (Llama has none, Qwen2 has
//! q/k/v biases). The layer keeps its name relative to the block or model that holds it, so
//! its parameters are listed and copied under `transformers`' names.
//!
//! # Shapes
//! `x` `[.., in]` → `[.., out]`.
//!
//! ```
//! use tch::{nn::VarStore, Device, Tensor};
//! use torchrl::modules::llm::nn::{Linear, WeightLayout};
//! # fn main() -> torchrl::Result<()> {
//! let vs = VarStore::new(Device::Cpu);
//! let a = Linear::new(&vs.root(), "a", 3, 2, true, WeightLayout::OutIn, 0.5)?;
//! let b = Linear::new(&vs.root(), "b", 3, 2, true, WeightLayout::InOut, 0.5)?;
//! // the same map in the two layouts: b's weight is a's transposed
//! tch::no_grad(|| b.weight().shallow_clone().copy_(&a.weight().tr()));
//! tch::no_grad(|| b.bias().unwrap().shallow_clone().copy_(&Tensor::from_slice(&[1.0f32, -1.0])));
//! tch::no_grad(|| a.bias().unwrap().shallow_clone().copy_(&Tensor::from_slice(&[1.0f32, -1.0])));
//! let x = Tensor::from_slice(&[1.0f32, 2.0, 3.0]).view([1, 3]);
//! assert!((a.forward(&x)? - b.forward(&x)?).abs().max().double_value(&[]) < 1e-6);
//! assert_eq!((a.in_features(), a.out_features()), (3, 2));
//! # Ok(()) }
//! ```

use std::fmt;

use tch::nn::{Init, Path};
use tch::Tensor;

use super::lora::{adapter_path, LoraAdapter, LoraSwitch};
use super::{copy_var, sub_path};
use crate::error::{Error, Result};

/// How a [`Linear`]'s weight is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightLayout {
    /// `[out, in]`: PyTorch's `nn.Linear` (Llama, Qwen, Mistral, the heads).
    OutIn,
    /// `[in, out]`: GPT-2's `Conv1D` (`y = x W + b`).
    InOut,
}

/// A linear layer. See the [module docs](self).
pub struct Linear {
    name: String,
    weight: Tensor,
    bias: Option<Tensor>,
    layout: WeightLayout,
    lora: Option<LoraAdapter>,
}

impl fmt::Debug for Linear {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Linear({}: {} -> {}, bias: {}, {:?}{})",
            self.name,
            self.in_features(),
            self.out_features(),
            self.bias.is_some(),
            self.layout,
            match &self.lora {
                Some(a) => format!(", {a:?}"),
                None => String::new(),
            }
        )
    }
}

impl Linear {
    /// A layer named `name` (dot-separated, relative to `path`'s owner) with a normal(0,
    /// `std`) weight and a zero bias (`transformers`' init for the projections).
    ///
    /// # Errors
    /// A size that is not positive, or a negative / non-finite `std`.
    pub fn new(
        path: &Path<'_>,
        name: &str,
        n_in: i64,
        n_out: i64,
        bias: bool,
        layout: WeightLayout,
        std: f64,
    ) -> Result<Self> {
        if n_in <= 0 || n_out <= 0 {
            return Err(Error::value(
                "Linear::new",
                name,
                "positive in / out sizes",
                format!("in {n_in}, out {n_out}"),
            ));
        }
        if !(std.is_finite() && std >= 0.0) {
            return Err(Error::value(
                "Linear::new",
                name,
                "a finite init std >= 0",
                std.to_string(),
            ));
        }
        let p = sub_path(path, name);
        let shape = match layout {
            WeightLayout::OutIn => [n_out, n_in],
            WeightLayout::InOut => [n_in, n_out],
        };
        let weight = super::randn_var(&p, "weight", &shape, 0.0, std)?;
        let bias = if bias {
            Some(p.f_var("bias", &[n_out], Init::Const(0.0))?)
        } else {
            None
        };
        Ok(Linear {
            name: name.to_string(),
            weight,
            bias,
            layout,
            lora: None,
        })
    }

    /// `x W(ᵀ) + b` over the last dim, plus the LoRA adapter's `s · B A x` when one is attached
    /// and the adapters are on.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = self.forward_base(x)?;
        match &self.lora {
            Some(adapter) => match adapter.delta(x)? {
                Some(d) => Ok(y.f_add(&d)?),
                None => Ok(y),
            },
            None => Ok(y),
        }
    }

    /// The base layer alone (no adapter).
    fn forward_base(&self, x: &Tensor) -> Result<Tensor> {
        // a decode's packed copy of the weight (`packed`), when one is active
        if super::packed::active() {
            if let Some(y) = super::packed::linear(x, &self.out_in_weight(), self.bias.as_ref())? {
                return Ok(y);
            }
        }
        match self.layout {
            WeightLayout::OutIn => Ok(x.f_linear(&self.weight, self.bias.as_ref())?),
            WeightLayout::InOut => {
                // one addmm over the flattened rows, as GPT-2's Conv1D runs it
                let mut shape = x.size();
                let n_in = shape.last().copied().unwrap_or(0);
                if let Some(last) = shape.last_mut() {
                    *last = self.out_features();
                }
                let rows = x.f_reshape([-1, n_in])?;
                let y = match &self.bias {
                    Some(b) => b.f_addmm(&rows, &self.weight)?,
                    None => rows.f_matmul(&self.weight)?,
                };
                Ok(y.f_view(shape.as_slice())?)
            }
        }
    }

    /// The weight as `[out_features, in_features]` (a transposed view for
    /// [`WeightLayout::InOut`]).
    pub fn out_in_weight(&self) -> Tensor {
        match self.layout {
            WeightLayout::OutIn => self.weight.shallow_clone(),
            WeightLayout::InOut => self.weight.tr(),
        }
    }

    /// The weight as stored (see [`WeightLayout`]).
    pub fn weight(&self) -> &Tensor {
        &self.weight
    }

    /// The bias, if any.
    pub fn bias(&self) -> Option<&Tensor> {
        self.bias.as_ref()
    }

    /// The weight layout.
    pub fn layout(&self) -> WeightLayout {
        self.layout
    }

    /// Attaches a new LoRA adapter of rank `r` (PEFT's init: the layer's output is unchanged
    /// until `B` trains) with variables under `path / name`, following `switch`. See
    /// [`LoraAdapter`].
    ///
    /// # Errors
    /// A layer that already has an adapter, or invalid hyper-parameters.
    pub fn attach_lora(
        &mut self,
        path: &Path<'_>,
        r: i64,
        scaling: f64,
        dropout: f64,
        switch: &LoraSwitch,
    ) -> Result<()> {
        if self.lora.is_some() {
            return Err(Error::value(
                "Linear::attach_lora",
                &self.name,
                "a layer without an adapter",
                "a layer that has one",
            ));
        }
        let p = adapter_path(path, &self.name);
        let adapter = LoraAdapter::new(
            &p,
            self.in_features(),
            self.out_features(),
            r,
            scaling,
            dropout,
            switch,
        )?;
        self.lora = Some(adapter);
        Ok(())
    }

    /// The LoRA adapter, if one is attached.
    pub fn lora(&self) -> Option<&LoraAdapter> {
        self.lora.as_ref()
    }

    /// Adds the adapter's `s · B A` into the base weight and removes the adapter (PEFT's
    /// `merge_and_unload` for this layer); a layer without one is left as it is.
    ///
    /// # Errors
    /// As the tensor operations.
    pub fn merge_lora(&mut self) -> Result<()> {
        let Some(adapter) = self.lora.take() else {
            return Ok(());
        };
        let delta = adapter.delta_weight()?;
        let delta = match self.layout {
            WeightLayout::OutIn => delta,
            WeightLayout::InOut => delta.f_tr()?,
        };
        let _guard = tch::no_grad_guard();
        let mut w = self.weight.shallow_clone();
        let _ = w.f_add_(&delta.f_to_kind(w.kind())?)?;
        Ok(())
    }

    /// The name relative to the owner (`"attn.c_attn"`, `"self_attn.q_proj"`, …).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Input width.
    pub fn in_features(&self) -> i64 {
        let d = match self.layout {
            WeightLayout::OutIn => 1,
            WeightLayout::InOut => 0,
        };
        self.weight.size().get(d).copied().unwrap_or(0)
    }

    /// Output width.
    pub fn out_features(&self) -> i64 {
        let d = match self.layout {
            WeightLayout::OutIn => 0,
            WeightLayout::InOut => 1,
        };
        self.weight.size().get(d).copied().unwrap_or(0)
    }

    /// `("{name}.weight", w)` and `("{name}.bias", b)` when there is a bias.
    pub fn named_parameters(&self) -> Vec<(String, &Tensor)> {
        let mut out = vec![(format!("{}.weight", self.name), &self.weight)];
        if let Some(b) = &self.bias {
            out.push((format!("{}.bias", self.name), b));
        }
        out
    }

    /// The same layer sharing its tensors (and its adapter's): no copy, gradients reach the
    /// same variables. What gradient checkpointing keeps to recompute a block.
    pub(crate) fn shallow(&self) -> Self {
        Linear {
            name: self.name.clone(),
            weight: self.weight.shallow_clone(),
            bias: self.bias.as_ref().map(Tensor::shallow_clone),
            layout: self.layout,
            lora: self.lora.as_ref().map(LoraAdapter::shallow),
        }
    }

    /// A copy of the layer as new variables under `path` (same name, layout and values; an
    /// adapter is copied too, following the same switch).
    pub fn copy_to(&self, path: &Path<'_>) -> Result<Self> {
        let p = sub_path(path, &self.name);
        let lora = match &self.lora {
            Some(a) => Some(a.copy_to(&p, a.switch())?),
            None => None,
        };
        Ok(Linear {
            name: self.name.clone(),
            weight: copy_var(&p, "weight", &self.weight)?,
            bias: match &self.bias {
                Some(b) => Some(copy_var(&p, "bias", b)?),
                None => None,
            },
            layout: self.layout,
            lora,
        })
    }
}
