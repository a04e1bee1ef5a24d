//! `Compose`: a sequence of transforms that acts as one.
//!
//! Forward hooks (step, reset, forward, spec hooks) run first to last; the inverse hook runs
//! last to first, so the transform nearest the base env sees the action last.
//!
//! An error raised by a transform's data hook (`step`, `reset`, `inv`, `forward`) comes out
//! wrapped in [`Error::Context`](crate::Error::Context) naming the transform, its position and
//! the hook (`"b (transform 2 of 2) in forward: …"`); [`Error::root`](crate::Error::root) still
//! reaches the original error.
//!
//! ```
//! use torchrl::envs::transforms::{Compose, Transform};
//! use torchrl::{Error, Result, TensorDict};
//! struct Noop(&'static str);
//! impl Transform for Noop {
//!     fn name(&self) -> String { self.0.into() }
//!     fn forward(&mut self, td: TensorDict) -> Result<TensorDict> {
//!         td.get_or_err("obs")?;
//!         Ok(td)
//!     }
//! }
//! let mut c = Compose::new();
//! c.push(Noop("a"));
//! c.push(Noop("b"));
//! assert_eq!(c.len(), 2);
//! assert_eq!(c.name(), "Compose(a, b)");
//! let err = c.forward(TensorDict::new([2]).unwrap()).unwrap_err();
//! assert!(err.to_string().starts_with("a (transform 1 of 2) in forward: "), "{err}");
//! assert!(matches!(err.root(), Error::KeyNotFound { .. }));
//! ```

use super::{ParentStep, Transform};
use crate::envs::EnvSpecs;
use crate::error::{Error, Result};
use crate::tensordict::{NestedKey, TensorDict};

/// An ordered list of transforms, itself a [`Transform`].
#[derive(Default)]
pub struct Compose {
    transforms: Vec<Box<dyn Transform>>,
}

impl Compose {
    /// An empty compose.
    pub fn new() -> Self {
        Compose::default()
    }

    /// Number of transforms.
    pub fn len(&self) -> usize {
        self.transforms.len()
    }

    /// True when there are no transforms.
    pub fn is_empty(&self) -> bool {
        self.transforms.is_empty()
    }

    /// Appends a transform (no spec work: use [`TransformedEnv`](super::TransformedEnv) to
    /// attach transforms to an env).
    pub fn push(&mut self, t: impl Transform + 'static) {
        self.transforms.push(Box::new(t));
    }

    /// Appends a boxed transform.
    pub fn push_boxed(&mut self, t: Box<dyn Transform>) {
        self.transforms.push(t);
    }

    pub(crate) fn insert_boxed(&mut self, index: usize, t: Box<dyn Transform>) -> Result<()> {
        if index > self.transforms.len() {
            return Err(Error::IndexOutOfRange {
                op: "Compose::insert",
                index: index as i64,
                what: "transforms (insert position)".into(),
                size: self.transforms.len() as i64,
            });
        }
        self.transforms.insert(index, t);
        Ok(())
    }

    /// Removes and returns the transform at `index`.
    pub fn remove(&mut self, index: usize) -> Result<Box<dyn Transform>> {
        if index >= self.transforms.len() {
            return Err(Error::IndexOutOfRange {
                op: "Compose::remove",
                index: index as i64,
                what: "transforms".into(),
                size: self.transforms.len() as i64,
            });
        }
        Ok(self.transforms.remove(index))
    }

    /// The transform at `index`.
    pub fn get(&self, index: usize) -> Option<&dyn Transform> {
        self.transforms.get(index).map(|b| &**b)
    }

    /// The transform at `index`, mutably (call `TransformedEnv::refresh_specs` after changing
    /// anything that affects specs).
    pub fn get_mut(&mut self, index: usize) -> Option<&mut Box<dyn Transform>> {
        self.transforms.get_mut(index)
    }

    /// The transform at `index` as its concrete type, if it is a `T`.
    ///
    /// ```
    /// use torchrl::envs::transforms::{Compose, StepCounter};
    /// let mut c = Compose::new();
    /// c.push(StepCounter::new());
    /// assert!(c.get_as::<StepCounter>(0).is_some());
    /// ```
    pub fn get_as<T: Transform + 'static>(&self, index: usize) -> Option<&T> {
        self.transforms
            .get(index)
            .and_then(|b| (**b).as_any().downcast_ref::<T>())
    }

    /// The transform at `index` as its concrete type, mutably (call
    /// `TransformedEnv::refresh_specs` after changing anything that affects specs).
    pub fn get_as_mut<T: Transform + 'static>(&mut self, index: usize) -> Option<&mut T> {
        self.transforms
            .get_mut(index)
            .and_then(|b| (**b).as_any_mut().downcast_mut::<T>())
    }

    /// The transforms in order.
    pub fn iter(&self) -> impl Iterator<Item = &dyn Transform> {
        self.transforms.iter().map(|b| &**b)
    }

    /// Attaches every child in order, each seeing the specs transformed by the ones before it,
    /// and returns the final specs.
    /// Runs `hook` of every transform on `data` in turn (last to first when `reverse`), each
    /// on the previous one's output; an error comes out wrapped with the failing transform's
    /// name, position and `name` of the hook.
    #[inline]
    fn chain(
        &mut self,
        name: &'static str,
        reverse: bool,
        data: TensorDict,
        mut hook: impl FnMut(&mut dyn Transform, TensorDict) -> Result<TensorDict>,
    ) -> Result<TensorDict> {
        let n = self.transforms.len();
        let mut data = data;
        for k in 0..n {
            let i = if reverse { n - 1 - k } else { k };
            if let Some(t) = self.transforms.get_mut(i) {
                data = hook(t.as_mut(), data).map_err(|e| in_hook(e, t.as_ref(), i, n, name))?;
            }
        }
        Ok(data)
    }

    pub(crate) fn attach_all(&mut self, parent: &EnvSpecs) -> Result<EnvSpecs> {
        let mut specs = parent.clone();
        for t in &mut self.transforms {
            specs = attach_one(t.as_mut(), specs)?;
        }
        Ok(specs)
    }
}

/// Attaches one transform to `parent` and returns the specs it produces, after checking that
/// every new output key is registered.
pub(crate) fn attach_one(t: &mut dyn Transform, parent: EnvSpecs) -> Result<EnvSpecs> {
    let mut parent = parent;
    parent.unlock();
    t.attach(&parent)?;
    let specs = t.transform_specs(parent)?;
    for k in t.new_output_keys() {
        if specs.output_group_of(&k).is_none() {
            return Err(Error::value(
                "TransformedEnv::append",
                &k,
                "a key registered in an output spec (observation, reward or done): every new \
                 entry must be declared in the specs",
                format!(
                    "{}: key {k} is written by the transform but registered in no output spec",
                    t.name()
                ),
            ));
        }
    }
    Ok(specs)
}

/// Wraps an error raised by the `hook` of transform `i` (of `n`) with where it happened:
/// `"RewardScaling(loc=…) (transform 2 of 3) in step: <the inner error>"`. Only called on the
/// error path, so the success path formats nothing.
#[cold]
fn in_hook(e: Error, t: &dyn Transform, i: usize, n: usize, hook: &str) -> Error {
    e.context(format!(
        "{} (transform {} of {n}) in {hook}",
        t.name(),
        i + 1
    ))
}

impl Transform for Compose {
    fn name(&self) -> String {
        let names: Vec<String> = self.transforms.iter().map(|t| t.name()).collect();
        format!("Compose({})", names.join(", "))
    }

    fn attach(&mut self, parent: &EnvSpecs) -> Result<()> {
        self.attach_all(parent).map(|_| ())
    }

    fn new_output_keys(&self) -> Vec<NestedKey> {
        self.transforms
            .iter()
            .flat_map(|t| t.new_output_keys())
            .collect()
    }

    fn transform_specs(&self, specs: EnvSpecs) -> Result<EnvSpecs> {
        self.transforms
            .iter()
            .try_fold(specs, |s, t| t.transform_specs(s))
    }

    fn transform_output_spec(&self, specs: EnvSpecs) -> Result<EnvSpecs> {
        self.transforms
            .iter()
            .try_fold(specs, |s, t| t.transform_output_spec(s))
    }

    fn transform_input_spec(&self, specs: EnvSpecs) -> Result<EnvSpecs> {
        self.transforms
            .iter()
            .try_fold(specs, |s, t| t.transform_input_spec(s))
    }

    fn step(&mut self, td: &TensorDict, next: TensorDict) -> Result<TensorDict> {
        self.chain("step", false, next, |t, next| t.step(td, next))
    }

    fn step_with_parent(
        &mut self,
        td: &TensorDict,
        next: TensorDict,
        parent: &mut dyn ParentStep,
    ) -> Result<TensorDict> {
        let n = self.transforms.len();
        let mut next = next;
        for i in 0..n {
            let (before, rest) = self.transforms.split_at_mut(i);
            let Some(t) = rest.first_mut() else { break };
            let mut p = Chain {
                base: &mut *parent,
                transforms: before,
            };
            next = t
                .step_with_parent(td, next, &mut p)
                .map_err(|e| in_hook(e, t.as_ref(), i, n, "step"))?;
        }
        Ok(next)
    }

    fn reset(&mut self, td: &TensorDict, reset: TensorDict) -> Result<TensorDict> {
        self.chain("reset", false, reset, |t, reset| t.reset(td, reset))
    }

    fn inv(&mut self, td: TensorDict) -> Result<TensorDict> {
        self.chain("inv", true, td, |t, td| t.inv(td))
    }

    fn forward(&mut self, td: TensorDict) -> Result<TensorDict> {
        self.chain("forward", false, td, |t, td| t.forward(td))
    }

    fn couples_batch_elements(&self) -> bool {
        self.transforms.iter().any(|t| t.couples_batch_elements())
    }

    fn set_seed(&mut self, seed: u64) -> Result<()> {
        // Each transform gets its own stream, derived from the seed and its position.
        for (i, t) in self.transforms.iter_mut().enumerate() {
            t.set_seed(seed.wrapping_add((i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)))?;
        }
        Ok(())
    }
}

/// The parent of a transform inside a [`Compose`]: the outer parent followed by the transforms
/// before it (each of which may drive its own parent in turn).
struct Chain<'a> {
    base: &'a mut dyn ParentStep,
    transforms: &'a mut [Box<dyn Transform>],
}

impl ParentStep for Chain<'_> {
    fn step(&mut self, td: &TensorDict) -> Result<TensorDict> {
        let n = self.transforms.len();
        match self.transforms.split_last_mut() {
            None => self.base.step(td),
            Some((last, init)) => {
                let mut p = Chain {
                    base: &mut *self.base,
                    transforms: init,
                };
                let next = p.step(td)?;
                last.step_with_parent(td, next, &mut p)
                    .map_err(|e| in_hook(e, last.as_ref(), n - 1, n, "step"))
            }
        }
    }
}
