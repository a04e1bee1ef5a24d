//! `RewardClipping`: clamps rewards into `[clamp_min, clamp_max]`.
//!
//! In keys default to `["reward"]` and out keys to the in keys. The out key's reward spec becomes
//! `Bounded(clamp_min, clamp_max)` with the in key's shape, dtype and device (the bounds are built
//! in the reward's dtype, so a clamped value is always inside its spec). As in TorchRL, only
//! `Unbounded` reward specs are accepted (an error names the key and the spec otherwise); the
//! reward must also have a floating dtype here. Nothing happens at reset.
//!
//! [`Transform::forward`] clamps the in keys of an offline tensordict.
//!
//! ```
//! use torchrl::envs::builtin::CountingEnv;
//! use torchrl::envs::transforms::{RewardClipping, TransformedEnv};
//! use torchrl::envs::{EnvBase, RolloutConfig};
//! use torchrl::specs::TensorSpec;
//! # fn main() -> torchrl::Result<()> {
//! let mut env = TransformedEnv::new(CountingEnv::new(10, &[])?)?
//!     .with(RewardClipping::new(-0.25, 0.75)?)?;
//! assert!(matches!(env.specs().reward.get("reward"), Some(TensorSpec::Bounded(_))));
//! let traj = env.rollout(3, None, &RolloutConfig::default())?;
//! let r = Vec::<f32>::try_from(traj.get_or_err(("next", "reward"))?.reshape([-1]))?;
//! assert_eq!(r, vec![0.75, 0.75, 0.75]);
//! # Ok(()) }
//! ```

use super::{added_keys, map_reward_specs, map_rewards, KeyMap, Transform};
use crate::data::specs::{Bounded, Composite};
use crate::error::{Error, Result};
use crate::macros::setters;
use crate::tensordict::{clamp_f64, fmt_key_list, full_f64, NestedKey, TensorDict};

/// Clamps rewards into `[clamp_min, clamp_max]`. See the module docs.
#[derive(Clone, Debug)]
pub struct RewardClipping {
    clamp_min: f64,
    clamp_max: f64,
    keys: KeyMap,
}

impl RewardClipping {
    /// Clamps `"reward"` into `[clamp_min, clamp_max]`. Errors when a bound is NaN or
    /// `clamp_min > clamp_max`.
    pub fn new(clamp_min: f64, clamp_max: f64) -> Result<Self> {
        if clamp_min.is_nan() || clamp_max.is_nan() || clamp_min > clamp_max {
            return Err(Error::argument(
                "RewardClipping::new",
                "clamp_min, clamp_max",
                "clamp_min <= clamp_max (no NaN)",
                format!("clamp_min={clamp_min}, clamp_max={clamp_max}"),
            ));
        }
        Ok(RewardClipping {
            clamp_min,
            clamp_max,
            keys: KeyMap::new(vec![NestedKey::from("reward")]),
        })
    }

    /// `(clamp_min, clamp_max)`.
    pub fn bounds(&self) -> (f64, f64) {
        (self.clamp_min, self.clamp_max)
    }

    fn pairs(&self) -> Result<Vec<(NestedKey, NestedKey)>> {
        self.keys.pairs("RewardClipping", self, "")
    }

    fn apply_td(&self, td: TensorDict, op: &'static str) -> Result<TensorDict> {
        map_rewards(op, self, self.pairs()?, td, |input, r| {
            // f64 bounds beyond the reward's dtype are brought into its range (tch's
            // `f_clamp` panics on them).
            clamp_f64(op, r, Some(self.clamp_min), Some(self.clamp_max)).map_err(|e| {
                Error::invalid(
                    op,
                    format!("{}: cannot clip the reward {input}: {e}", self.name()),
                )
            })
        })
    }
}

setters!(RewardClipping {
    /// The reward keys to read (default `["reward"]`).
    with_in_keys(keys) => keys.ins;
    /// The keys to write, one per in key (default: the in keys).
    with_out_keys(keys) => keys.outs [Some];
});

impl Transform for RewardClipping {
    fn name(&self) -> String {
        format!(
            "RewardClipping(clamp_min={:.4}, clamp_max={:.4}, keys={})",
            self.clamp_min,
            self.clamp_max,
            fmt_key_list(&self.keys.ins)
        )
    }

    fn new_output_keys(&self) -> Vec<NestedKey> {
        self.pairs().map(|p| added_keys(&p)).unwrap_or_default()
    }

    fn transform_reward_spec(&self, spec: Composite) -> Result<Composite> {
        let op = "RewardClipping::transform_reward_spec";
        let only = "it only clips Unbounded rewards";
        map_reward_specs(
            op,
            "RewardClipping",
            only,
            self.pairs()?,
            spec,
            |_, _, u| {
                let (kind, device) = (u.dtype(), u.device());
                let bounded = Bounded::from_tensors(
                    full_f64(op, u.shape(), self.clamp_min, kind, device)?,
                    full_f64(op, u.shape(), self.clamp_max, kind, device)?,
                )?;
                Ok(Some(bounded.into()))
            },
        )
    }

    fn step(&mut self, _td: &TensorDict, next: TensorDict) -> Result<TensorDict> {
        self.apply_td(next, "RewardClipping::step")
    }

    fn forward(&mut self, td: TensorDict) -> Result<TensorDict> {
        self.apply_td(td, "RewardClipping::forward")
    }
}
