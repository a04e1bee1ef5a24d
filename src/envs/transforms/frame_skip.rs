//! `FrameSkipTransform`: repeats each action `frame_skip` times in the parent env and sums the
//! rewards, TorchRL's `FrameSkipTransform`.
//!
//! The parent (the base env and the transforms before this one) is stepped `frame_skip` times
//! with the same tensordict through [`Transform::step_with_parent`]; the next tensordict is the
//! last step's, with every reward key replaced by the sum of that key over the `frame_skip`
//! steps. As in TorchRL 0.14, the repetition does not stop when a done flag is set: an episode
//! that ends on an inner frame keeps stepping until the `frame_skip` frames are done, and the
//! reported done flags are the last frame's (put a frame skip only on envs that stay done once
//! done, or whose episodes end on a frame boundary, if that matters). `frame_skip = 1` is the
//! identity. Resets are untouched; [`Transform::forward`] on offline data is an error, as in
//! TorchRL (a frame skip needs an env).
//!
//! ```
//! use torchrl::envs::builtin::CountingEnv;
//! use torchrl::envs::transforms::{FrameSkipTransform, TransformedEnv};
//! use torchrl::envs::{EnvBase, RolloutConfig};
//! # fn main() -> torchrl::Result<()> {
//! // counts up by one per frame, reward 1 per frame
//! let mut env = TransformedEnv::new(CountingEnv::new(100, &[])?)?
//!     .with(FrameSkipTransform::new(3)?)?;
//! let traj = env.rollout(2, None, &RolloutConfig::default())?;
//! let count = Vec::<f32>::try_from(traj.get_or_err(("next", "observation"))?.reshape([-1]))?;
//! assert_eq!(count, vec![3.0, 6.0]); // three frames per step
//! let r = Vec::<f32>::try_from(traj.get_or_err(("next", "reward"))?.reshape([-1]))?;
//! assert_eq!(r, vec![3.0, 3.0]); // rewards summed over the frames
//! # Ok(()) }
//! ```

use super::{ParentStep, Transform};
use crate::envs::EnvSpecs;
use crate::error::{Error, Result};
use crate::tensordict::{NestedKey, TensorDict};

/// Repeats each action `frame_skip` times and sums the rewards. See the module docs.
#[derive(Clone, Debug)]
pub struct FrameSkipTransform {
    frame_skip: usize,
    reward_keys: Vec<NestedKey>,
}

impl FrameSkipTransform {
    /// Repeats each action `frame_skip` times. Errors when `frame_skip` is 0 (TorchRL: "should
    /// have a value greater or equal to one").
    pub fn new(frame_skip: usize) -> Result<Self> {
        if frame_skip < 1 {
            return Err(Error::argument(
                "FrameSkipTransform::new",
                "frame_skip",
                "a value greater than or equal to one",
                frame_skip.to_string(),
            ));
        }
        Ok(FrameSkipTransform {
            frame_skip,
            reward_keys: Vec::new(),
        })
    }

    /// The number of frames per step.
    pub fn frame_skip(&self) -> usize {
        self.frame_skip
    }
}

impl Transform for FrameSkipTransform {
    fn name(&self) -> String {
        format!("FrameSkipTransform(frame_skip={})", self.frame_skip)
    }

    fn attach(&mut self, parent: &EnvSpecs) -> Result<()> {
        self.reward_keys = parent.reward_keys();
        Ok(())
    }

    fn step(&mut self, _td: &TensorDict, _next: TensorDict) -> Result<TensorDict> {
        Err(Error::invalid(
            "FrameSkipTransform::step",
            "a frame skip steps its parent: it runs only inside a TransformedEnv (its \
             step_with_parent hook), not as a bare transform",
        ))
    }

    fn step_with_parent(
        &mut self,
        td: &TensorDict,
        next: TensorDict,
        parent: &mut dyn ParentStep,
    ) -> Result<TensorDict> {
        let mut next = next;
        let mut sums = Vec::with_capacity(self.reward_keys.len());
        for k in &self.reward_keys {
            sums.push(next.get_or_err(k)?.shallow_clone());
        }
        for _ in 1..self.frame_skip {
            next = parent.step(td)?;
            for (k, sum) in self.reward_keys.iter().zip(sums.iter_mut()) {
                *sum = sum.f_add(next.get_or_err(k)?)?;
            }
        }
        for (k, sum) in self.reward_keys.iter().zip(sums) {
            next.set(k, sum)?;
        }
        Ok(next)
    }

    fn forward(&mut self, _td: TensorDict) -> Result<TensorDict> {
        Err(Error::invalid(
            "FrameSkipTransform::forward",
            "FrameSkipTransform can only be used when appended to a transformed env (it steps \
             the env; there is nothing to do on offline data)",
        ))
    }
}
