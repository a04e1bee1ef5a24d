//! `TensorDictPrimer`: declares extra entries (e.g. a recurrent policy's hidden state) that the
//! env carries from reset to reset.
//!
//! Each primer is a key with a leaf spec. The transform:
//! - registers every primer in the observation **and** state specs (as TorchRL does);
//! - at reset, writes the primer's initial value for the batch elements being reset (the
//!   `"_reset"` mask of the parent's reset group, or all of them without a mask): a constant
//!   (zeros by default, see [`TensorDictPrimer::with_default_value`]) or, with
//!   [`TensorDictPrimer::with_random`], a sample of the spec drawn from the transform's own
//!   [`Generator`], seeded with [`TensorDictPrimer::with_seed`] and re-seeded by
//!   [`Transform::set_seed`] (which `TransformedEnv::set_seed` calls, so seeding the env makes
//!   the primers reproducible too);
//! - at each step, copies the value from the input tensordict into `"next"` when nothing wrote
//!   it there. A value preset under the input's `"next"` (a policy that updates the entry) is
//!   already in `"next"` when the transforms run (the env keeps preset `"next"` entries the
//!   step did not produce, as TorchRL does), so it wins.
//!
//! **Shapes.** As everywhere in this crate, a spec leaf's shape is `[*batch, *feature]`: a primer
//! spec must start with the env's batch size, or the transform errors when it joins the env,
//! unless [`TensorDictPrimer::with_expand_specs`] is set, in which case primer specs are given
//! per env (feature shape only) and expanded to the batch (TorchRL's `expand_specs`).
//!
//! The default value is checked against each spec when the transform joins an env (an error names
//! the key, the value and the spec), so that `check_env_specs` cannot fail on it later. A primer
//! key the parent already declares is rejected.
//!
//! [`Transform::forward`] (offline data) sets every missing primer to its initial value, shaped
//! `[*td.batch_size, *feature]`; entries already present are kept (TorchRL overwrites them).
//!
//! ```
//! use torchrl::envs::builtin::CountingEnv;
//! use torchrl::envs::transforms::{TensorDictPrimer, TransformedEnv};
//! use torchrl::envs::{EnvBase, RolloutConfig};
//! use torchrl::specs::Unbounded;
//! # fn main() -> torchrl::Result<()> {
//! let primer = TensorDictPrimer::new()
//!     .with_primer("hidden", Unbounded::new().with_shape([4, 8])?)
//!     .with_expand_specs(true);
//! let mut env = TransformedEnv::new(CountingEnv::new(10, &[4])?)?.with(primer)?;
//! assert_eq!(env.specs().observation.get("hidden").map(|s| s.shape().to_vec()), Some(vec![4, 4, 8]));
//! assert!(env.specs().state.contains("hidden"));
//! let td = env.reset(None)?;
//! assert_eq!(td.get_or_err("hidden")?.size(), vec![4, 4, 8]);
//! let traj = env.rollout(2, None, &RolloutConfig::default())?;
//! assert_eq!(traj.get_or_err(("next", "hidden"))?.size(), vec![4, 2, 4, 8]);
//! # Ok(()) }
//! ```

use tch::{Device, Tensor};

use super::reward_sum::{expand_right, parent_of, reset_mask, reset_roots};
use super::{attached, refuse_taken_key, Transform};
use crate::data::specs::TensorSpec;
use crate::envs::{EnvSpecs, SpecGroup};
use crate::error::{Error, Result, ShapeFmt};
use crate::macros::setters;
use crate::rng::Generator;
use crate::tensordict::{fmt_key_list, full_f64, BatchIndex, Entry, NestedKey, TensorDict};

/// A primer resolved against an env: its spec with and without the batch dims.
#[derive(Clone, Debug)]
struct Resolved {
    key: NestedKey,
    full: TensorSpec,
    feature: TensorSpec,
}

/// Declares extra keys and writes their initial values at reset. See the module docs.
#[derive(Clone, Debug)]
pub struct TensorDictPrimer {
    primers: Vec<(NestedKey, TensorSpec)>,
    random: bool,
    default_value: f64,
    expand_specs: bool,
    reset_key: Option<NestedKey>,
    generator: Generator,
    resolved: Vec<Resolved>,
    root: NestedKey,
    device: Device,
}

impl Default for TensorDictPrimer {
    fn default() -> Self {
        TensorDictPrimer {
            primers: Vec::new(),
            random: false,
            default_value: 0.0,
            expand_specs: false,
            reset_key: None,
            generator: Generator::new(0),
            resolved: Vec::new(),
            root: NestedKey::default(),
            device: Device::Cpu,
        }
    }
}

impl TensorDictPrimer {
    /// A primer with no keys yet (add them with [`TensorDictPrimer::with_primer`]).
    pub fn new() -> Self {
        TensorDictPrimer::default()
    }

    /// Declares `key` with the leaf spec `spec` (`[*batch, *feature]`, or `[*feature]` with
    /// [`TensorDictPrimer::with_expand_specs`]).
    pub fn with_primer(mut self, key: impl Into<NestedKey>, spec: impl Into<TensorSpec>) -> Self {
        self.primers.push((key.into(), spec.into()));
        self
    }

    /// The declared keys.
    pub fn keys(&self) -> Vec<NestedKey> {
        self.primers.iter().map(|(k, _)| k.clone()).collect()
    }

    /// The initial value of one primer for a leading `shape` (`[]` for the env's own batch,
    /// where `spec` is the full spec).
    fn initial(&mut self, spec: &TensorSpec, shape: &[i64], key: &NestedKey) -> Result<Tensor> {
        let op = "TensorDictPrimer";
        if self.random {
            return match spec.rand(&mut self.generator, shape)? {
                Entry::Tensor(t) => Ok(t),
                Entry::Dict(_) => Err(Error::value(op, key, "a leaf spec", "a Composite")),
            };
        }
        let kind = spec.dtype().ok_or_else(|| {
            Error::value(
                op,
                key,
                "a spec with a dtype (to build a constant value)",
                format!("{spec}, which has none"),
            )
        })?;
        let device = spec.device().unwrap_or(self.device);
        let full: Vec<i64> = [shape, spec.shape()].concat();
        // libtorch refuses a value the dtype cannot hold (and tch panics on that error).
        full_f64(op, &full, self.default_value, kind, device)
            .map_err(|e| e.context(format!("{op}: cannot build the default value of {key}")))
    }
}

setters!(TensorDictPrimer {
    /// Initial values are samples of the specs instead of a constant.
    with_random(random: bool);
    /// Seeds the generator used by [`TensorDictPrimer::with_random`] (default seed 0; seeding
    /// the env it joins re-seeds it, see [`Transform::set_seed`]).
    with_seed(seed: u64) => generator = Generator::new(seed);
    /// The constant initial value of every primer (default 0; `false`/`true` for bool specs).
    with_default_value(value: f64) => default_value = value;
    /// Primer specs are per-env (feature shape only) and get the env's batch dims prepended.
    with_expand_specs(expand: bool) => expand_specs = expand;
    /// The `"_reset"` key whose mask selects the batch elements to prime (default: the parent's
    /// only reset group; required when the parent has several).
    with_reset_key(key: impl Into<NestedKey>) => reset_key = Some(key.into());
});

impl TensorDictPrimer {
    /// The resolved primers as `(key, full spec)` pairs, owned (a hook then borrows `self`
    /// mutably while it writes them).
    fn primed(&self) -> Vec<(NestedKey, TensorSpec)> {
        self.resolved
            .iter()
            .map(|r| (r.key.clone(), r.full.clone()))
            .collect()
    }
}

impl Transform for TensorDictPrimer {
    fn name(&self) -> String {
        let value = if self.random {
            "random".to_string()
        } else {
            format!("default_value={}", self.default_value)
        };
        format!(
            "TensorDictPrimer(keys={}, {value})",
            fmt_key_list(&self.keys())
        )
    }

    fn attach(&mut self, parent: &EnvSpecs) -> Result<()> {
        let op = "TensorDictPrimer::attach";
        if self.primers.is_empty() {
            return Err(Error::config(
                op,
                "primers",
                "at least one primer (add keys with TensorDictPrimer::with_primer)",
                "none",
            ));
        }
        let batch = parent.batch_size().to_vec();
        let nb = batch.len();
        let mut resolved = Vec::with_capacity(self.primers.len());
        for (key, spec) in &self.primers {
            if spec.is_composite() {
                return Err(Error::value(
                    op,
                    key,
                    "a leaf primer spec (declare each leaf with its nested key)",
                    "a Composite",
                ));
            }
            refuse_taken_key(
                op,
                parent,
                &[
                    SpecGroup::Observation,
                    SpecGroup::Reward,
                    SpecGroup::Done,
                    SpecGroup::Action,
                    SpecGroup::State,
                ],
                key,
                "a primer key that is new to the parent's specs",
            )?;
            let spec = spec.to_device(parent.device())?;
            let (full, feature) = if self.expand_specs {
                let shape: Vec<i64> = [batch.as_slice(), spec.shape()].concat();
                (spec.expand(&shape)?, spec.clone())
            } else {
                if spec.shape().len() < nb || spec.shape().get(..nb) != Some(batch.as_slice()) {
                    return Err(Error::ShapeMismatch {
                        op,
                        key: format!(
                            "{key} (a primer spec's shape must start with the env batch size; give \
                             the full shape or use TensorDictPrimer::with_expand_specs(true))"
                        ),
                        expected: [batch.as_slice(), spec.shape()].concat(),
                        actual: spec.shape().to_vec(),
                    });
                }
                let idx: Vec<BatchIndex> = (0..nb).map(|_| BatchIndex::Int(0)).collect();
                let feature = if nb == 0 {
                    spec.clone()
                } else {
                    spec.index(&idx)?
                };
                (spec, feature)
            };
            resolved.push(Resolved {
                key: key.clone(),
                full,
                feature,
            });
        }
        let roots = reset_roots(parent);
        let root = match &self.reset_key {
            Some(k) => {
                if k.last() != Some("_reset") {
                    return Err(Error::value(
                        op,
                        k,
                        "a reset key that ends with \"_reset\"",
                        "a key with another last segment",
                    ));
                }
                parent_of(k)
            }
            None => match roots.as_slice() {
                [one] => one.clone(),
                _ => {
                    return Err(Error::config(
                        op,
                        "reset_key",
                        "one reset group in the parent env, or one chosen with \
                         TensorDictPrimer::with_reset_key",
                        format_args!(
                            "none, and the parent env has {} reset groups ({})",
                            roots.len(),
                            fmt_key_list(&parent.reset_keys())
                        ),
                    ))
                }
            },
        };
        self.device = parent.device();
        self.resolved = resolved;
        self.root = root;
        if !self.random {
            let items = self.primed();
            for (key, spec) in items {
                let value = self.initial(&spec, &[], &key)?;
                if !spec.is_in(&Entry::Tensor(value))? {
                    return Err(Error::value(
                        op,
                        &key,
                        format!(
                            "a default value in its spec {spec} (choose one with \
                             TensorDictPrimer::with_default_value, or use \
                             TensorDictPrimer::with_random(true))"
                        ),
                        format!(
                            "the default value {}, which is not in its spec",
                            self.default_value
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    fn new_output_keys(&self) -> Vec<NestedKey> {
        self.resolved.iter().map(|r| r.key.clone()).collect()
    }

    fn transform_output_spec(&self, mut specs: EnvSpecs) -> Result<EnvSpecs> {
        for r in &self.resolved {
            specs.observation.set(&r.key, r.full.clone())?;
        }
        Ok(specs)
    }

    fn transform_input_spec(&self, mut specs: EnvSpecs) -> Result<EnvSpecs> {
        for r in &self.resolved {
            specs.state.set(&r.key, r.full.clone())?;
        }
        Ok(specs)
    }

    fn step(&mut self, td: &TensorDict, mut next: TensorDict) -> Result<TensorDict> {
        let op = "TensorDictPrimer::step";
        for r in attached(op, self, &self.resolved)? {
            if next.get_entry(&r.key).is_some() {
                continue;
            }
            // Not produced by the step nor preset under the input's "next" (the env merges those
            // before the transforms run): the value at time t is carried.
            let prev = td.get(&r.key).ok_or_else(|| {
                Error::value(
                    op,
                    &r.key,
                    "the primer in the input tensordict (step from the tensordict returned by \
                     reset or by the previous step)",
                    format!(
                        "nothing: it is missing (keys: {})",
                        fmt_key_list(&td.keys(crate::tensordict::KeysOptions::nested_leaves()))
                    ),
                )
            })?;
            next.set(&r.key, prev.shallow_clone())?;
        }
        Ok(next)
    }

    fn reset(&mut self, td: &TensorDict, mut reset: TensorDict) -> Result<TensorDict> {
        let op = "TensorDictPrimer::reset";
        attached(op, self, &self.resolved)?;
        let mask = reset_mask(td, &self.root)?;
        let items = self.primed();
        for (key, spec) in items {
            let fresh = self.initial(&spec, &[], &key)?;
            let value = match (&mask, td.get(&key)) {
                (Some(m), Some(prev)) if prev.size() == fresh.size() => {
                    let m = expand_right(m, &fresh.size(), op, &key)?;
                    fresh.f_where_self(&m, &prev.f_to_kind(fresh.kind())?)?
                }
                _ => fresh,
            };
            reset.set(&key, value)?;
        }
        Ok(reset)
    }

    fn set_seed(&mut self, seed: u64) -> Result<()> {
        self.generator = Generator::new(seed);
        Ok(())
    }

    fn forward(&mut self, mut td: TensorDict) -> Result<TensorDict> {
        let op = "TensorDictPrimer::forward";
        let batch = td.batch_size().to_vec();
        let items: Vec<(NestedKey, TensorSpec)> = if self.resolved.is_empty() {
            let mut v = Vec::with_capacity(self.primers.len());
            for (key, spec) in &self.primers {
                let feature = if self.expand_specs {
                    spec.clone()
                } else if spec.shape().get(..batch.len()) == Some(batch.as_slice()) {
                    let idx: Vec<BatchIndex> = batch.iter().map(|_| BatchIndex::Int(0)).collect();
                    if batch.is_empty() {
                        spec.clone()
                    } else {
                        spec.index(&idx)?
                    }
                } else {
                    return Err(Error::value(
                        op,
                        key,
                        format!(
                            "a spec whose shape starts with the tensordict's batch size {} (use \
                             with_expand_specs(true) for per-env specs)",
                            ShapeFmt(&batch)
                        ),
                        format!("a spec of shape {}", ShapeFmt(spec.shape())),
                    ));
                };
                v.push((key.clone(), feature));
            }
            v
        } else {
            self.resolved
                .iter()
                .map(|r| (r.key.clone(), r.feature.clone()))
                .collect()
        };
        for (key, feature) in items {
            if td.get_entry(&key).is_some() {
                continue;
            }
            let value = self.initial(&feature, &batch, &key)?;
            td.set(&key, value)?;
        }
        Ok(td)
    }
}
