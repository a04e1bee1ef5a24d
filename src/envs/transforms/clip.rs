//! `ClipTransform`: clamps observations and rewards (its in keys) into `[low, high]`, and
//! actions / states (its inverse in keys) on their way into the env, TorchRL's
//! `ClipTransform`.
//!
//! One of `low` / `high` may be left out (`None`: no bound on that side), not both. As in
//! TorchRL the bounds are float32 scalars (a bound is rounded to float32 first), and the spec of
//! each out key (observation or reward) becomes a `Bounded` spec with the in key's shape, dtype
//! and device whose bounds are `low - ε` and `high + ε`, where ε is float32's resolution
//! (`1e-6`) and the arithmetic is float32's; a missing bound becomes `∓f32::MAX`. Inverse keys
//! (actions, states) are clamped on their way in; their specs are left alone (TorchRL: "the
//! outside world won't see the difference"). Reset outputs are clamped too (missing keys
//! skipped); at a step a missing in key is an error. [`Transform::forward`] clamps offline data.
//!
//! ```
//! use torchrl::envs::builtin::PendulumEnv;
//! use torchrl::envs::transforms::{ClipTransform, TransformedEnv};
//! use torchrl::envs::{EnvBase, RolloutConfig};
//! use torchrl::specs::TensorSpec;
//! # fn main() -> torchrl::Result<()> {
//! let clip = ClipTransform::new(Some(-0.5), Some(0.5))?.with_in_keys(["observation", "reward"]);
//! let mut env = TransformedEnv::new(PendulumEnv::new(&[2], tch::Device::Cpu)?)?.with(clip)?;
//! assert!(matches!(env.specs().observation.get("observation"), Some(TensorSpec::Bounded(_))));
//! let traj = env.rollout(5, None, &RolloutConfig::default())?;
//! let obs = traj.get_or_err(("next", "observation"))?;
//! assert!(obs.abs().max().double_value(&[]) <= 0.5);
//! assert!(traj.get_or_err(("next", "reward"))?.min().double_value(&[]) >= -0.5);
//! # Ok(()) }
//! ```

use super::{added_keys, map_key_pairs, KeyMap, Transform};
use crate::data::specs::{Bounded, TensorSpec};
use crate::envs::{EnvSpecs, SpecGroup};
use crate::error::{Error, Result};
use crate::macros::setters;
use crate::tensordict::{clamp_f64, fmt_key_list, full_f64, NestedKey, TensorDict};

/// Clamps observations / rewards and inverse actions / states. See the module docs.
#[derive(Clone, Debug)]
pub struct ClipTransform {
    low: Option<f64>,
    high: Option<f64>,
    keys: KeyMap,
    keys_inv: KeyMap,
}

/// float32's resolution (`torch.finfo(torch.float32).resolution`).
const F32_RESOLUTION: f32 = 1e-6;

impl ClipTransform {
    /// Clamps into `[low, high]` (either may be `None`, not both), with no keys yet (set them
    /// with [`ClipTransform::with_in_keys`] / [`ClipTransform::with_in_keys_inv`]). Errors
    /// when both are `None`, a bound is NaN, or `low >= high` (TorchRL: "`low` must be strictly
    /// lower than `high`").
    pub fn new(low: Option<f64>, high: Option<f64>) -> Result<Self> {
        let op = "ClipTransform::new";
        if low.is_none() && high.is_none() {
            return Err(Error::argument(
                op,
                "low, high",
                "at least one of low and high",
                "both None",
            ));
        }
        // float32 scalars, as TorchRL's buffers
        let round = |v: Option<f64>| v.map(|x| x as f32 as f64);
        let (low, high) = (round(low), round(high));
        if low.is_some_and(f64::is_nan) || high.is_some_and(f64::is_nan) {
            return Err(Error::argument(
                op,
                "low, high",
                "bounds that are not NaN",
                format!("low={low:?}, high={high:?}"),
            ));
        }
        if let (Some(l), Some(h)) = (low, high) {
            if l >= h {
                return Err(Error::argument(
                    op,
                    "low, high",
                    "low strictly lower than high",
                    format!("low={l}, high={h}"),
                ));
            }
        }
        Ok(ClipTransform {
            low,
            high,
            keys: KeyMap::default(),
            keys_inv: KeyMap::default(),
        })
    }

    /// The bounds, rounded to float32.
    pub fn bounds(&self) -> (Option<f64>, Option<f64>) {
        (self.low, self.high)
    }

    /// The bounds of the specs this transform writes: `(low - ε, high + ε)` in float32
    /// arithmetic, `∓f32::MAX` for a missing bound.
    pub fn spec_bounds(&self) -> (f64, f64) {
        let lo = match self.low {
            Some(l) => (l as f32 - F32_RESOLUTION) as f64,
            None => -(f32::MAX as f64),
        };
        let hi = match self.high {
            Some(h) => (h as f32 + F32_RESOLUTION) as f64,
            None => f32::MAX as f64,
        };
        (lo, hi)
    }

    fn clamp(&self, op: &'static str, t: &tch::Tensor) -> Result<tch::Tensor> {
        clamp_f64(op, t, self.low, self.high)
    }

    fn bounded_like(&self, op: &'static str, spec: &TensorSpec) -> Result<TensorSpec> {
        let (lo, hi) = self.spec_bounds();
        let kind = spec.dtype().unwrap_or(tch::Kind::Float);
        let device = spec.device().unwrap_or(tch::Device::Cpu);
        let shape = spec.shape();
        Ok(Bounded::from_tensors(
            full_f64(op, shape, lo, kind, device)?,
            full_f64(op, shape, hi, kind, device)?,
        )?
        .into())
    }

    fn apply(&self, td: TensorDict, tolerant: bool, op: &'static str) -> Result<TensorDict> {
        let mut td = td;
        let pairs = self.keys.pairs(op, self, "")?;
        map_key_pairs(&mut td, &pairs, false, tolerant, op, |t, _| {
            self.clamp(op, t)
        })?;
        Ok(td)
    }
}

setters!(ClipTransform {
    /// The observation / reward keys to clamp (default: none).
    with_in_keys(keys) => keys.ins;
    /// The keys to write, one per in key (default: the in keys).
    with_out_keys(keys) => keys.outs [Some];
    /// The action / state keys (parent side) to clamp on their way in (default: none).
    with_in_keys_inv(keys) => keys_inv.ins;
    /// The policy-side keys the inverse reads, one per inverse in key (default: the same).
    with_out_keys_inv(keys) => keys_inv.outs [Some];
});

impl Transform for ClipTransform {
    fn name(&self) -> String {
        format!(
            "ClipTransform(low={:?}, high={:?}, in_keys={}, in_keys_inv={})",
            self.low,
            self.high,
            fmt_key_list(&self.keys.ins),
            fmt_key_list(&self.keys_inv.ins)
        )
    }

    fn new_output_keys(&self) -> Vec<NestedKey> {
        self.keys
            .pairs("ClipTransform", self, "")
            .map(|p| added_keys(&p))
            .unwrap_or_default()
    }

    fn transform_output_spec(&self, specs: EnvSpecs) -> Result<EnvSpecs> {
        let op = "ClipTransform::transform_output_spec";
        let mut specs = specs;
        for (input, output) in self.keys.pairs(op, self, "")? {
            let group = match specs.output_group_of(&input) {
                Some(g @ (SpecGroup::Observation | SpecGroup::Reward)) => g,
                _ => {
                    return Err(Error::value(
                        op,
                        &input,
                        format!(
                            "an observation or reward key of the parent (observations: {}; rewards: {})",
                            fmt_key_list(&specs.observation_keys()),
                            fmt_key_list(&specs.reward_keys())
                        ),
                        "a key in neither spec",
                    ))
                }
            };
            let spec = self.bounded_like(op, specs.group(group).get_or_err(&input)?)?;
            specs.group_mut(group).set(&output, spec)?;
        }
        Ok(specs)
    }

    fn transform_input_spec(&self, specs: EnvSpecs) -> Result<EnvSpecs> {
        let op = "ClipTransform::transform_input_spec";
        for (input, output) in self.keys_inv.pairs(op, self, "inverse ")? {
            if specs.input_group_of(&input).is_none() {
                return Err(Error::KeyNotFound {
                    op,
                    key: input.to_string(),
                    available: super::input_keys_available(&specs),
                });
            }
            if input != output {
                return Err(Error::value(
                    op,
                    &output,
                    format!("the inverse in key {input} (renaming inverse keys is not supported)"),
                    "a different key",
                ));
            }
        }
        Ok(specs)
    }

    fn step(&mut self, _td: &TensorDict, next: TensorDict) -> Result<TensorDict> {
        self.apply(next, false, "ClipTransform::step")
    }

    fn reset(&mut self, _td: &TensorDict, reset: TensorDict) -> Result<TensorDict> {
        self.apply(reset, true, "ClipTransform::reset")
    }

    fn inv(&mut self, td: TensorDict) -> Result<TensorDict> {
        let op = "ClipTransform::inv";
        let mut td = td;
        let pairs = self.keys_inv.pairs(op, self, "inverse ")?;
        map_key_pairs(&mut td, &pairs, true, true, op, |t, _| self.clamp(op, t))?;
        Ok(td)
    }

    fn forward(&mut self, td: TensorDict) -> Result<TensorDict> {
        self.apply(td, false, "ClipTransform::forward")
    }
}
