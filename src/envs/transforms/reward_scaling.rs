//! `RewardScaling`: an affine map of the reward, `r * scale + loc`, or `(r - loc) / scale` with
//! [`RewardScaling::with_standard_normal`].
//!
//! In keys default to `["reward"]` and out keys to the in keys. A different out key is added to
//! the reward spec (a clone of the in key's spec), so it becomes a reward key; the in key stays.
//! Each in key must be an `Unbounded` leaf of the reward spec with a floating dtype: an affine
//! map of a `Bounded` reward would need new bounds, and TorchRL refuses it too (with
//! `NotImplementedError`); here the error names the key and the spec. Nothing happens at reset.
//!
//! **Scale.** TorchRL clamps the scale to at least `1e-6`, so a zero or negative scale silently
//! becomes `1e-6` (and flips no signs). A non-positive scale is almost always a bug (a sign error,
//! a statistic that collapsed to 0), so [`RewardScaling::new`] rejects `scale <= 0` (and non-finite
//! values) with an error instead.
//!
//! [`Transform::forward`] applies the same map to the in keys of an offline tensordict (give
//! nested keys such as `("next", "reward")` to reach rewards under `"next"`).
//!
//! ```
//! use torchrl::envs::builtin::CountingEnv;
//! use torchrl::envs::transforms::{RewardScaling, TransformedEnv};
//! use torchrl::envs::{EnvBase, RolloutConfig};
//! # fn main() -> torchrl::Result<()> {
//! let mut env = TransformedEnv::new(CountingEnv::new(10, &[])?)?
//!     .with(RewardScaling::new(0.5, 1.5)?)?;
//! let traj = env.rollout(3, None, &RolloutConfig::default())?;
//! let r = Vec::<f32>::try_from(traj.get_or_err(("next", "reward"))?.reshape([-1]))?;
//! assert_eq!(r, vec![2.0, 2.0, 2.0]); // 1 * 1.5 + 0.5
//! assert!(RewardScaling::new(0.0, 0.0).is_err()); // TorchRL would silently use 1e-6
//! # Ok(()) }
//! ```

use tch::Tensor;

use super::{added_keys, map_reward_specs, map_rewards, KeyMap, Transform};
use crate::data::specs::Composite;
use crate::error::{Error, Result};
use crate::macros::setters;
use crate::tensordict::{fmt_key_list, NestedKey, TensorDict};

/// `reward * scale + loc` (or `(reward - loc) / scale`). See the module docs.
#[derive(Clone, Debug)]
pub struct RewardScaling {
    loc: f64,
    scale: f64,
    standard_normal: bool,
    keys: KeyMap,
}

impl RewardScaling {
    /// `reward * scale + loc` on `"reward"`. Errors when `scale <= 0` or either value is not
    /// finite.
    pub fn new(loc: f64, scale: f64) -> Result<Self> {
        let op = "RewardScaling::new";
        if !loc.is_finite() {
            return Err(Error::argument(
                op,
                "loc",
                "a finite number",
                loc.to_string(),
            ));
        }
        if !scale.is_finite() || scale <= 0.0 {
            return Err(Error::invalid(
                op,
                format!(
                    "scale must be a finite number > 0, got {scale} (TorchRL silently clamps it to \
                     1e-6; a non-positive scale is rejected here)"
                ),
            ));
        }
        Ok(RewardScaling {
            loc,
            scale,
            standard_normal: false,
            keys: KeyMap::new(vec![NestedKey::from("reward")]),
        })
    }

    /// The location.
    pub fn loc(&self) -> f64 {
        self.loc
    }

    /// The scale (always > 0).
    pub fn scale(&self) -> f64 {
        self.scale
    }

    fn pairs(&self) -> Result<Vec<(NestedKey, NestedKey)>> {
        self.keys.pairs("RewardScaling", self, "")
    }

    fn apply(&self, r: &Tensor) -> Result<Tensor> {
        Ok(if self.standard_normal {
            r.f_sub_scalar(self.loc)?.f_div_scalar(self.scale)?
        } else {
            let scaled = r.f_mul_scalar(self.scale)?;
            if self.loc == 0.0 {
                scaled
            } else {
                scaled.f_add_scalar(self.loc)?
            }
        })
    }

    fn apply_td(&self, td: TensorDict, op: &'static str) -> Result<TensorDict> {
        map_rewards(op, self, self.pairs()?, td, |_, r| self.apply(r))
    }
}

setters!(RewardScaling {
    /// Standardizes instead: `(reward - loc) / scale`.
    with_standard_normal(standard_normal: bool);

    /// The reward keys to read (default `["reward"]`).
    with_in_keys(keys) => keys.ins;
    /// The keys to write, one per in key (default: the in keys).
    with_out_keys(keys) => keys.outs [Some];
});

impl Transform for RewardScaling {
    fn name(&self) -> String {
        format!(
            "RewardScaling(loc={:.4}, scale={:.4}, standard_normal={}, keys={})",
            self.loc,
            self.scale,
            self.standard_normal,
            fmt_key_list(&self.keys.ins)
        )
    }

    fn new_output_keys(&self) -> Vec<NestedKey> {
        self.pairs().map(|p| added_keys(&p)).unwrap_or_default()
    }

    fn transform_reward_spec(&self, spec: Composite) -> Result<Composite> {
        let op = "RewardScaling::transform_reward_spec";
        let only =
            "it only scales Unbounded rewards (an affine map of a bounded reward would need \
                    new bounds)";
        map_reward_specs(
            op,
            "RewardScaling",
            only,
            self.pairs()?,
            spec,
            |input, output, u| {
                // In the reward's dtype, loc and scale must stay finite and scale non-zero:
                // 1e39 is inf as a float32 and gives inf - inf or 0 * inf = NaN rewards.
                let kind = u.dtype();
                let cast = |v: f64| -> Result<f64> {
                    Ok(Tensor::f_from_slice(&[v])?
                        .f_to_kind(kind)?
                        .f_double_value(&[0])?)
                };
                let (loc, scale) = (cast(self.loc)?, cast(self.scale)?);
                if !loc.is_finite() || !scale.is_finite() || scale <= 0.0 {
                    return Err(Error::value(
                        op,
                        input,
                        format!(
                            "a reward dtype in which loc and scale are finite (and scale > 0) \
                             ({}: loc={} and scale={} must be finite (and scale > 0) in the \
                             reward's dtype)",
                            self.name(),
                            self.loc,
                            self.scale
                        ),
                        format!("dtype {kind:?}, in which they are {loc} and {scale}"),
                    ));
                }
                Ok((output != input).then(|| u.into()))
            },
        )
    }

    fn step(&mut self, _td: &TensorDict, next: TensorDict) -> Result<TensorDict> {
        self.apply_td(next, "RewardScaling::step")
    }

    fn forward(&mut self, td: TensorDict) -> Result<TensorDict> {
        self.apply_td(td, "RewardScaling::forward")
    }
}
