//! [`RotaryEmbedding`]: rotary position embeddings as `transformers` computes them for Llama,
//! Qwen and Mistral: inverse frequencies `θ^(−2i/d)` (scaled by [`RopeScaling`]), angles
//! `position · inv_freq`, and each query / key head rotated by `x·cos + rotate_half(x)·sin`
//! where `rotate_half([x₁, x₂]) = [−x₂, x₁]` (the two halves of the head, not interleaved
//! pairs).
//!
//! The table is computed in float32 (as `transformers` does) and cast to the activations'
//! dtype.
//!
//! # Shapes
//! `position_ids` `[B, T]` → `cos`, `sin` `[B, 1, T, head_dim]`; `apply` on `[B, H, T,
//! head_dim]`.
//!
//! ```
//! use tch::{Device, Kind, Tensor};
//! use torchrl::modules::llm::nn::{RopeScaling, RotaryEmbedding};
//! # fn main() -> torchrl::Result<()> {
//! // head_dim 2: one frequency, 1 (θ^0), so position p rotates (x, y) by p radians
//! let rope = RotaryEmbedding::new(2, 10_000.0, &RopeScaling::Default, Device::Cpu)?;
//! let (cos, sin) = rope.cos_sin(&Tensor::from_slice(&[0i64, 1]).view([1, 2]), Kind::Double)?;
//! let x = Tensor::from_slice(&[1.0f64, 0.0, 1.0, 0.0]).view([1, 1, 2, 2]);
//! let y = RotaryEmbedding::apply(&x, &cos, &sin)?;
//! assert_eq!(Vec::<f64>::try_from(y.get(0).get(0).get(0))?, vec![1.0, 0.0]); // position 0
//! let r = Vec::<f64>::try_from(y.get(0).get(0).get(1))?;                      // position 1
//! assert!((r[0] - 1f64.cos()).abs() < 1e-7 && (r[1] - 1f64.sin()).abs() < 1e-7);
//! # Ok(()) }
//! ```

use std::f64::consts::PI;

use tch::{Device, Kind, Tensor};

use crate::error::{Error, Result};

/// How the inverse frequencies are scaled (`rope_scaling` / `rope_parameters` in
/// `config.json`, by `rope_type`).
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    /// `"default"`: unscaled.
    Default,
    /// `"linear"`: every frequency divided by `factor` (positions interpolated).
    Linear {
        /// The divisor.
        factor: f64,
    },
    /// `"llama3"`: Llama 3.1's frequency-dependent scaling: long wavelengths divided by
    /// `factor`, short ones kept, the band between interpolated.
    Llama3 {
        /// The long-wavelength divisor.
        factor: f64,
        /// Wavelengths longer than `original_max_position_embeddings / low_freq_factor` are
        /// scaled.
        low_freq_factor: f64,
        /// Wavelengths shorter than `original_max_position_embeddings / high_freq_factor` are
        /// kept.
        high_freq_factor: f64,
        /// The context length the model was pre-trained with.
        original_max_position_embeddings: f64,
    },
}

impl RopeScaling {
    fn check(&self) -> Result<()> {
        let op = "RopeScaling";
        let positive = |field: &'static str, v: f64| {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                Err(Error::config(op, field, "a finite number > 0", v))
            }
        };
        match *self {
            RopeScaling::Default => Ok(()),
            RopeScaling::Linear { factor } => positive("factor", factor),
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => {
                positive("factor", factor)?;
                positive("low_freq_factor", low_freq_factor)?;
                positive("high_freq_factor", high_freq_factor)?;
                positive(
                    "original_max_position_embeddings",
                    original_max_position_embeddings,
                )?;
                if high_freq_factor <= low_freq_factor {
                    return Err(Error::config(
                        op,
                        "high_freq_factor",
                        format!("greater than low_freq_factor = {low_freq_factor}"),
                        high_freq_factor,
                    ));
                }
                Ok(())
            }
        }
    }

    /// Scales one inverse frequency.
    fn scale(&self, inv_freq: f64) -> f64 {
        match *self {
            RopeScaling::Default => inv_freq,
            RopeScaling::Linear { factor } => inv_freq / factor,
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings: old,
            } => {
                let wavelen = 2.0 * PI / inv_freq;
                if wavelen < old / high_freq_factor {
                    inv_freq
                } else if wavelen > old / low_freq_factor {
                    inv_freq / factor
                } else {
                    let smooth =
                        (old / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
                    (1.0 - smooth) * inv_freq / factor + smooth * inv_freq
                }
            }
        }
    }
}

/// The rotary table of one model. See the [module docs](self).
#[derive(Debug)]
pub struct RotaryEmbedding {
    inv_freq: Tensor,
    head_dim: i64,
}

impl RotaryEmbedding {
    /// The table for heads of width `head_dim` (even), base `theta`, scaled by `scaling`.
    ///
    /// # Errors
    /// An odd or non-positive `head_dim`, a non-positive `theta`, or scaling factors out of
    /// range, each named.
    pub fn new(head_dim: i64, theta: f64, scaling: &RopeScaling, device: Device) -> Result<Self> {
        let op = "RotaryEmbedding::new";
        if head_dim <= 0 || head_dim % 2 != 0 {
            return Err(Error::config(
                op,
                "head_dim",
                "a positive even width",
                head_dim,
            ));
        }
        let freqs = frequencies(op, head_dim, theta, scaling)?;
        let inv_freq = Tensor::from_slice(&freqs).f_to_device(device)?;
        Ok(RotaryEmbedding { inv_freq, head_dim })
    }

    /// Checks a table's parameters without building it (what a config's `validate` runs).
    ///
    /// # Errors
    /// As [`RotaryEmbedding::new`].
    pub fn check(head_dim: i64, theta: f64, scaling: &RopeScaling) -> Result<()> {
        if head_dim <= 0 || head_dim % 2 != 0 {
            return Err(Error::config(
                "RotaryEmbedding::check",
                "head_dim",
                "a positive even width",
                head_dim,
            ));
        }
        frequencies("RotaryEmbedding::check", head_dim, theta, scaling).map(|_| ())
    }

    /// The same table (the frequencies are shared, not copied).
    pub fn share(&self) -> Self {
        RotaryEmbedding {
            inv_freq: self.inv_freq.shallow_clone(),
            head_dim: self.head_dim,
        }
    }

    /// The width of a head.
    pub fn head_dim(&self) -> i64 {
        self.head_dim
    }

    /// The inverse frequencies, `[head_dim / 2]`, float32.
    pub fn inv_freq(&self) -> &Tensor {
        &self.inv_freq
    }

    /// `cos` and `sin` `[B, 1, T, head_dim]` in `kind` for `position_ids` `[B, T]`.
    pub fn cos_sin(&self, position_ids: &Tensor, kind: Kind) -> Result<(Tensor, Tensor)> {
        let angles = position_ids
            .f_to_kind(Kind::Float)?
            .f_unsqueeze(-1)?
            .f_mul(&self.inv_freq.f_to_device(position_ids.device())?)?;
        let emb = Tensor::f_cat(&[&angles, &angles], -1)?;
        let to = |t: Tensor| -> Result<Tensor> { Ok(t.f_to_kind(kind)?.f_unsqueeze(1)?) };
        Ok((to(emb.f_cos()?)?, to(emb.f_sin()?)?))
    }

    /// `x · cos + rotate_half(x) · sin` for `x` `[B, H, T, head_dim]`.
    pub fn apply(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
        let d = x.size().last().copied().unwrap_or(0);
        let half = d / 2;
        let x1 = x.f_narrow(-1, 0, half)?;
        let x2 = x.f_narrow(-1, half, d - half)?;
        let rotated = Tensor::f_cat(&[&x2.f_neg()?, &x1], -1)?;
        Ok(x.f_mul(cos)?.f_add(&rotated.f_mul(sin)?)?)
    }
}

/// The inverse frequencies of a table, each finite in `f32` (a rope theta so small that
/// `1 / theta^x` overflows would make every angle NaN), or the error naming the field.
fn frequencies(
    op: &'static str,
    head_dim: i64,
    theta: f64,
    scaling: &RopeScaling,
) -> Result<Vec<f32>> {
    if !(theta.is_finite() && theta > 0.0) {
        return Err(Error::config(
            op,
            "rope_theta",
            "a finite number > 0",
            theta,
        ));
    }
    scaling.check()?;
    let freqs: Vec<f32> = (0..head_dim / 2)
        .map(|i| {
            let base = 1.0 / theta.powf((2 * i) as f64 / head_dim as f64);
            scaling.scale(base) as f32
        })
        .collect();
    if freqs.iter().any(|f| !f.is_finite()) {
        return Err(Error::config(
            op,
            "rope_theta",
            "a base whose inverse frequencies are finite in float32",
            theta,
        ));
    }
    Ok(freqs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama3_scaling_keeps_short_waves_and_divides_long_ones() {
        let s = RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192.0,
        };
        // wavelength 2π < 8192 / 4: kept
        assert_eq!(s.scale(1.0), 1.0);
        // wavelength 2π / 1e-4 ≈ 62832 > 8192: divided by the factor
        assert!((s.scale(1e-4) - 1e-4 / 8.0).abs() < 1e-18);
        // wavelength 4096 (between 2048 and 8192): smooth = (8192/4096 - 1) / 3 = 1/3
        let f = 2.0 * PI / 4096.0;
        let expected = (2.0 / 3.0) * f / 8.0 + f / 3.0;
        assert!((s.scale(f) - expected).abs() < 1e-15);
    }

    #[test]
    fn bad_tables_are_refused_by_name() {
        let e = RotaryEmbedding::new(3, 1e4, &RopeScaling::Default, Device::Cpu).unwrap_err();
        assert!(e.to_string().contains("head_dim"), "{e}");
        let e = RotaryEmbedding::new(4, 1e4, &RopeScaling::Linear { factor: 0.0 }, Device::Cpu)
            .unwrap_err();
        assert!(e.to_string().contains("factor"), "{e}");
    }
}
