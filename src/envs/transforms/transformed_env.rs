//! `TransformedEnv`: an environment wrapped in a stack of transforms; itself an environment.
//!
//! Its specs are its base env's specs rewritten by each transform in turn; they are computed
//! when a transform is appended (the transform is attached to the specs before it) and never
//! alter the base env's specs. A step runs the inverse hooks (last to first) on a shallow copy
//! of the input, steps the base env, then runs the step hooks (first to last).
//!
//! ```
//! use tch::Tensor;
//! use torchrl::envs::transforms::{Transform, TransformedEnv};
//! use torchrl::envs::{EnvBase, EnvCore, EnvSpecs, RolloutConfig};
//! use torchrl::specs::{Bounded, Unbounded};
//! use torchrl::{Result, TensorDict};
//!
//! struct One { core: EnvCore }
//! impl EnvBase for One {
//!     fn core(&self) -> &EnvCore { &self.core }
//!     fn core_mut(&mut self) -> &mut EnvCore { &mut self.core }
//!     fn reset_impl(&mut self, _: Option<&TensorDict>) -> Result<TensorDict> {
//!         TensorDict::new([])?.with("observation", Tensor::from_slice(&[0.0f32]))
//!     }
//!     fn step_impl(&mut self, _: &TensorDict) -> Result<TensorDict> {
//!         TensorDict::new([])?
//!             .with("observation", Tensor::from_slice(&[0.0f32]))?
//!             .with("reward", Tensor::from_slice(&[1.0f32]))
//!     }
//! }
//! struct Double;
//! impl Transform for Double {
//!     fn name(&self) -> String { "Double".into() }
//!     fn step(&mut self, _td: &TensorDict, mut next: TensorDict) -> Result<TensorDict> {
//!         let r = next.get_or_err("reward")? * 2.0;
//!         next.set("reward", r)?;
//!         Ok(next)
//!     }
//! }
//! # fn main() -> Result<()> {
//! let specs = EnvSpecs::new([])?
//!     .with_observation("observation", Unbounded::new())?
//!     .with_action("action", Bounded::new(-1.0, 1.0, [1])?)?
//!     .with_reward("reward", Unbounded::new())?;
//! let mut env = TransformedEnv::new(One { core: EnvCore::new(specs)? })?.with(Double)?;
//! let traj = env.rollout(3, None, &RolloutConfig::default())?;
//! assert_eq!(traj.get_or_err(("next", "reward"))?.double_value(&[2, 0]), 2.0);
//! # Ok(()) }
//! ```

use std::fmt;
use std::marker::PhantomData;

use super::compose::attach_one;
use super::{Compose, ParentStep, Transform};
use crate::envs::{EnvBase, EnvCore, EnvSpecs};
use crate::error::Result;
use crate::tensordict::TensorDict;

/// A typed handle to a transform of a [`TransformedEnv`], returned by
/// [`TransformedEnv::append_with_handle`] / [`TransformedEnv::with_handle`]: code that later
/// needs that transform (a trainer adjusting its KL coefficient, saving its running moments)
/// reaches it by the handle, as its concrete type, never by a hard-coded position.
///
/// A handle names the slot the transform was appended at; inserting or popping a transform
/// before it moves the transform, after which the lookup gives `None` unless a transform of
/// the same type sits there.
///
/// ```
/// use torchrl::envs::builtin::PendulumEnv;
/// use torchrl::envs::transforms::{RewardScaling, StepCounter, TransformedEnv};
/// # fn main() -> torchrl::Result<()> {
/// let env = TransformedEnv::new(PendulumEnv::new(&[2], tch::Device::Cpu)?)?
///     .with(StepCounter::new())?;
/// let (mut env, scaling) = env.with_handle(RewardScaling::new(0.0, 0.5)?)?;
/// assert!(env.transform_by(&scaling).is_some());
/// assert!(env.transform_by_mut(&scaling).is_some());
/// # Ok(()) }
/// ```
pub struct TransformHandle<T> {
    index: usize,
    _kind: PhantomData<fn() -> T>,
}

impl<T> Clone for TransformHandle<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for TransformHandle<T> {}

impl<T> fmt::Debug for TransformHandle<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "TransformHandle<{}>({})",
            std::any::type_name::<T>(),
            self.index
        )
    }
}

impl<T> TransformHandle<T> {
    /// The transform's position in the stack.
    pub fn index(&self) -> usize {
        self.index
    }
}

/// A base env plus a [`Compose`] of transforms. Nests (a `TransformedEnv` can be the base of
/// another) and batches like any env.
pub struct TransformedEnv<E: EnvBase> {
    base: E,
    transform: Compose,
    core: EnvCore,
}

impl<E: EnvBase> TransformedEnv<E> {
    /// Wraps `base` with no transforms.
    pub fn new(base: E) -> Result<Self> {
        let core = EnvCore::from_transformed(base.specs().clone())?;
        Ok(TransformedEnv {
            base,
            transform: Compose::new(),
            core,
        })
    }

    /// Builder form of [`TransformedEnv::append`].
    pub fn with(mut self, t: impl Transform + 'static) -> Result<Self> {
        self.append(t)?;
        Ok(self)
    }

    /// Appends a transform: attaches it to the current specs and rewrites them. On error the
    /// env is unchanged.
    pub fn append(&mut self, t: impl Transform + 'static) -> Result<()> {
        self.append_boxed(Box::new(t))
    }

    /// [`TransformedEnv::append`], returning a typed handle to the appended transform.
    pub fn append_with_handle<T: Transform + 'static>(
        &mut self,
        t: T,
    ) -> Result<TransformHandle<T>> {
        let index = self.transform.len();
        self.append(t)?;
        Ok(TransformHandle {
            index,
            _kind: PhantomData,
        })
    }

    /// Builder form of [`TransformedEnv::append_with_handle`].
    pub fn with_handle<T: Transform + 'static>(
        mut self,
        t: T,
    ) -> Result<(Self, TransformHandle<T>)> {
        let handle = self.append_with_handle(t)?;
        Ok((self, handle))
    }

    /// The transform `handle` names, as its concrete type.
    pub fn transform_by<T: Transform + 'static>(&self, handle: &TransformHandle<T>) -> Option<&T> {
        self.transform.get_as::<T>(handle.index)
    }

    /// The transform `handle` names, mutably (call [`TransformedEnv::refresh_specs`] after
    /// changing anything that affects specs).
    pub fn transform_by_mut<T: Transform + 'static>(
        &mut self,
        handle: &TransformHandle<T>,
    ) -> Option<&mut T> {
        self.transform.get_as_mut::<T>(handle.index)
    }

    /// Appends a boxed transform.
    pub fn append_boxed(&mut self, mut t: Box<dyn Transform>) -> Result<()> {
        let specs = attach_one(t.as_mut(), self.core.specs().clone())?;
        let mut core = self.core.clone();
        core.set_transformed_specs(specs)?;
        self.core = core;
        self.transform.push_boxed(t);
        Ok(())
    }

    /// Inserts a transform at `index` and recomputes the specs of the whole stack (every
    /// transform is attached again). On error the env is unchanged.
    pub fn insert(&mut self, index: usize, t: impl Transform + 'static) -> Result<()> {
        self.transform.insert_boxed(index, Box::new(t))?;
        if let Err(e) = self.refresh_specs() {
            // Roll back: remove what we inserted and restore the previous specs.
            let _ = self.transform.remove(index);
            let _ = self.refresh_specs();
            return Err(e);
        }
        Ok(())
    }

    /// Removes the transform at `index` and recomputes the specs.
    pub fn pop(&mut self, index: usize) -> Result<Box<dyn Transform>> {
        let t = self.transform.remove(index)?;
        if let Err(e) = self.refresh_specs() {
            let _ = self.transform.insert_boxed(index, t);
            let _ = self.refresh_specs();
            return Err(e);
        }
        Ok(t)
    }

    /// Recomputes the specs from the base env's through every transform (call after changing a
    /// transform's parameters through [`TransformedEnv::transform_mut`]).
    pub fn refresh_specs(&mut self) -> Result<()> {
        let specs = self.transform.attach_all(self.base.specs())?;
        self.core.set_transformed_specs(specs)
    }

    /// The transforms.
    pub fn transform(&self) -> &Compose {
        &self.transform
    }

    /// The transforms, mutably.
    pub fn transform_mut(&mut self) -> &mut Compose {
        &mut self.transform
    }

    /// The base env.
    pub fn base(&self) -> &E {
        &self.base
    }

    /// The base env, mutably.
    pub fn base_mut(&mut self) -> &mut E {
        &mut self.base
    }

    /// Unwraps into the base env and the transforms.
    pub fn into_parts(self) -> (E, Compose) {
        (self.base, self.transform)
    }
}

impl<E: EnvBase> EnvBase for TransformedEnv<E> {
    fn core(&self) -> &EnvCore {
        &self.core
    }

    fn core_mut(&mut self) -> &mut EnvCore {
        &mut self.core
    }

    fn reset_impl(&mut self, td: Option<&TensorDict>) -> Result<TensorDict> {
        let reset = self.base.reset_next(td)?;
        let input = match td {
            Some(t) => t.clone(),
            None => TensorDict::new(self.base.specs().batch_size())?,
        };
        self.transform.reset(&input, reset)
    }

    fn step_impl(&mut self, td: &TensorDict) -> Result<TensorDict> {
        let td_in = self.transform.inv(td.clone())?;
        let mut base = BaseStep {
            base: &mut self.base,
            preset: td.get_dict("next"),
        };
        let next = base.step(&td_in)?;
        self.transform.step_with_parent(&td_in, next, &mut base)
    }

    fn couples_batch_elements(&self) -> bool {
        self.base.couples_batch_elements() || self.transform.couples_batch_elements()
    }

    fn set_seed_impl(&mut self, seed: u64) -> Result<()> {
        self.base.set_seed(seed)?;
        self.transform.set_seed(seed)
    }
}

impl EnvCore {
    /// Core of a wrapper whose specs come from transforms: validated and locked, but done specs
    /// are not completed again (a transform may remove `terminated` on purpose).
    pub(crate) fn from_transformed(specs: EnvSpecs) -> Result<Self> {
        let mut core = EnvCore::new_unfinalized(specs);
        core.set_transformed_specs(core.specs().clone())?;
        Ok(core)
    }

    pub(crate) fn set_transformed_specs(&mut self, mut specs: EnvSpecs) -> Result<()> {
        specs.unlock();
        specs.validate()?;
        specs.lock();
        self.replace_specs(specs);
        Ok(())
    }
}

/// The base env's step as the first transform's parent ([`ParentStep`]).
struct BaseStep<'a, E: EnvBase> {
    base: &'a mut E,
    /// Entries preset under `"next"` in the input: those the base env does not produce reach
    /// the transforms.
    preset: Option<&'a TensorDict>,
}

impl<E: EnvBase> ParentStep for BaseStep<'_, E> {
    fn step(&mut self, td: &TensorDict) -> Result<TensorDict> {
        let mut next = self.base.step_next(td)?;
        if let Some(preset) = self.preset {
            crate::envs::base::merge_missing(&mut next, preset)?;
        }
        Ok(next)
    }
}
