//! `ObservationNorm`: an affine map of observations, `obs * scale + loc` (or, with
//! `standard_normal`, `(obs - loc) / scale`), with statistics given or computed from rollouts.
//!
//! - **Keys.** `in_keys` are required (observation keys of the parent); the results go to
//!   `out_keys` (default: the in keys). Optional inverse keys map actions / states back on their
//!   way into the parent: `in_keys_inv` are the parent-side names, `out_keys_inv` the policy-side
//!   ones (default: the same), as in TorchRL.
//! - **Specs.** A `Bounded` spec's `low`/`high` go through the same map (so `(loc=1, scale=2)` on
//!   `Bounded(0, 1)` gives `Bounded(1, 3)`); other specs are kept. Inverse keys' action / state
//!   specs are mapped forward too (the policy sees the normalised space). Keys must have a
//!   floating dtype; a key missing from its spec group is an error naming it.
//! - **Data.** `step` maps `next[in_key]`; `reset` maps the reset observations (so the first root
//!   observation is normalised too). `loc` and `scale` are cast to each value's dtype and device,
//!   so a float32 observation stays float32 whatever the statistics' dtype.
//! - **Statistics.** Give them to [`ObservationNorm::new`] (scalars) or
//!   [`ObservationNorm::from_tensors`], or build the transform with
//!   [`ObservationNorm::uninitialized`] and compute them from rollouts, either way:
//!   - TorchRL's way: append it, then call [`ObservationNorm::init_stats_at`] with the env and
//!     its index there; the rollouts run on the env *up to* the transform (the base env and the
//!     transforms before it), as TorchRL's `env.transform[i].init_stats(...)` does;
//!   - or call [`ObservationNorm::init_stats`] with the env it will be appended to, then append
//!     it.
//!
//!   Until it has statistics, an appended `ObservationNorm` leaves the specs as they are (only
//!   the dtypes are checked; a `Bounded` spec gets its mapped bounds once the statistics are
//!   known) and its data hooks error, so the env cannot be reset or stepped.
//!
//! **Differences from TorchRL**, on purpose:
//! - a non-positive (or non-finite) `scale` passed by the user is an error; TorchRL silently
//!   clamps it to `eps`, which turns a sign mistake into a wrong but running normalisation. User
//!   scales are used as given; `eps` only floors the standard deviations computed by
//!   [`ObservationNorm::init_stats`] (a constant feature gets scale `1/eps`, or `eps` with
//!   `standard_normal`, exactly as in TorchRL);
//! - `init_stats` takes the parent env as an argument, and `init_stats_at` the env and the
//!   transform's index: TorchRL reaches the parent through the transform's `parent`, which a
//!   boxed transform here does not have. `init_stats_at` raises TorchRL's "initialized in the
//!   right order" error when an `ObservationNorm` before the index has no statistics yet;
//! - TorchRL's "mixed initialized and uninitialized loc and scale" error cannot happen: the
//!   constructors take both statistics or none.
//!
//! ```
//! use torchrl::envs::builtin::CountingEnv;
//! use torchrl::envs::transforms::{InitStats, ObservationNorm, TransformedEnv};
//! use torchrl::{EnvBase, RolloutConfig};
//! # fn main() -> torchrl::Result<()> {
//! let base = CountingEnv::new(100, &[])?;
//! let mut env = TransformedEnv::new(base)?
//!     .with(ObservationNorm::new(1.0, 2.0, ["observation"])?)?;
//! let traj = env.rollout(3, None, &RolloutConfig::default())?;
//! // next observations 1, 2, 3 become 3, 5, 7; the first root observation 0 becomes 1
//! assert_eq!(traj.get_or_err(("next", "observation"))?.double_value(&[2, 0]), 7.0);
//! assert_eq!(traj.get_or_err("observation")?.double_value(&[0, 0]), 1.0);
//!
//! // TorchRL's way: append, then compute the statistics from 10 frames of the env up to it
//! let mut env = TransformedEnv::new(CountingEnv::new(100, &[])?)?
//!     .with(ObservationNorm::uninitialized(["observation"])?)?;
//! ObservationNorm::init_stats_at(&mut env, 0, &InitStats::new(10))?;
//! let norm = env.transform().get_as::<ObservationNorm>(0);
//! let scale = norm.and_then(|n| n.scale()).map(|s| s.double_value(&[])).unwrap_or(0.0);
//! assert!((scale - 0.3303).abs() < 1e-4); // 1 / std(0..9)
//!
//! // or compute them from the env the transform is about to join, then append it
//! let mut env = TransformedEnv::new(CountingEnv::new(100, &[])?)?;
//! let mut norm = ObservationNorm::uninitialized(["observation"])?;
//! norm.init_stats(&mut env, 10)?;
//! env.append(norm)?;
//! # Ok(()) }
//! ```

use crate::kind::is_float;
use tch::{Kind, Tensor};

use super::reward_sum::{refuse_state_keys, IN_PLACE};
use super::{
    added_keys, input_keys_available, map_input_specs, map_key_pairs, missing_key, KeyMap,
    Transform, TransformedEnv,
};
use crate::data::specs::{Bounded, TensorSpec};
use crate::envs::{EnvBase, EnvSpecs, RolloutConfig, SpecGroup};
use crate::error::{Error, Result, ShapeFmt};
use crate::macros::setters;
use crate::tensordict::{clamp_f64, Elements, NestedKey, TensorDict};
use crate::tensordict::{collect_keys, fmt_key_list};

const OP: &str = "ObservationNorm";

/// An affine normalisation of observations. See the module docs.
pub struct ObservationNorm {
    loc: Option<Tensor>,
    scale: Option<Tensor>,
    keys: KeyMap,
    keys_inv: KeyMap,
    standard_normal: bool,
    eps: f64,
}

/// The options of [`ObservationNorm::init_stats_with`] (TorchRL's `init_stats` arguments).
#[derive(Clone, Debug)]
pub struct InitStats {
    /// Frames to collect at least: rollouts of at most `num_iter` steps are run until their
    /// total number of frames (batch elements times steps) reaches it.
    pub num_iter: usize,
    /// Dims of the concatenated data to reduce over (default `[0]`). Dims are those of the
    /// rollout tensors: `[*batch, time, *feature]`.
    pub reduce_dim: Vec<i64>,
    /// Dim along which the rollouts are concatenated; must be one of `reduce_dim`. Default: the
    /// single `reduce_dim` (required when there are several).
    pub cat_dim: Option<i64>,
    /// Which entry to compute the statistics of (default: the only in key; required when there
    /// are several).
    pub key: Option<NestedKey>,
    /// Reduced dims to keep as size-1 dims in `loc` and `scale` (each must be in `reduce_dim`).
    pub keep_dims: Vec<i64>,
}

impl InitStats {
    /// `num_iter` frames, reduced over dim 0.
    pub fn new(num_iter: usize) -> Self {
        InitStats {
            num_iter,
            reduce_dim: vec![0],
            cat_dim: None,
            key: None,
            keep_dims: Vec::new(),
        }
    }
}

setters!(InitStats {
    /// Sets [`InitStats::reduce_dim`].
    with_reduce_dim(dims: impl Into<Vec<i64>>) => reduce_dim = dims.into();
    /// Sets [`InitStats::cat_dim`].
    with_cat_dim(dim: i64) => cat_dim = Some(dim);
    /// Sets [`InitStats::key`].
    with_key(key: impl Into<NestedKey>) => key = Some(key.into());
    /// Sets [`InitStats::keep_dims`].
    with_keep_dims(dims: impl Into<Vec<i64>>) => keep_dims = dims.into();
});

/// A short description of a tensor for messages: its values when there are few, else its shape.
fn describe(t: &Tensor) -> String {
    let vals = t
        .f_to_kind(Kind::Double)
        .and_then(|v| v.f_reshape([-1]))
        .ok()
        .and_then(|v| Vec::<f64>::try_from(&v).ok());
    match vals {
        Some(v) if v.len() <= 8 => format!("{v:?} (shape {})", ShapeFmt(&t.size())),
        _ => format!("a tensor of shape {}", ShapeFmt(&t.size())),
    }
}

/// The first value of a tensor (NaN if it cannot be read), for display.
fn first_value(t: &Tensor) -> f64 {
    t.f_reshape([-1])
        .and_then(|v| v.f_double_value(&[0]))
        .unwrap_or(f64::NAN)
}

fn all_true(t: &Tensor) -> Result<bool> {
    Ok(t.elements() == 0 || t.f_all()?.f_int64_value(&[])? != 0)
}

/// `finfo(kind).eps` for floating kinds, TorchRL's default `eps` for tensor scales.
fn finfo_eps(kind: Kind) -> f64 {
    match kind {
        Kind::Double => f64::EPSILON,
        Kind::Half => 0.000_976_562_5,
        Kind::BFloat16 => 0.007_812_5,
        _ => f32::EPSILON as f64,
    }
}

/// Checks user-given statistics: floating, finite, `scale > 0` everywhere.
fn check_stats(loc: &Tensor, scale: &Tensor) -> Result<()> {
    for (name, t) in [("loc", loc), ("scale", scale)] {
        if !is_float(t.kind()) {
            return Err(Error::argument(
                OP,
                name,
                "a floating dtype",
                format!("{:?}", t.kind()),
            ));
        }
        if !all_true(&t.f_isfinite()?)? {
            return Err(Error::argument(
                OP,
                name,
                "finite values",
                format!("non-finite values: {}", describe(t)),
            ));
        }
    }
    if !all_true(&scale.f_gt(0.0)?)? {
        let min = scale.f_min()?.f_double_value(&[])?;
        return Err(Error::argument(
            OP,
            "scale",
            "scale must be > 0 everywhere (TorchRL would silently clamp it to eps, this port \
             refuses it; to flip the sign of an observation, negate it explicitly)",
            format!("a minimum of {min}"),
        ));
    }
    Ok(())
}

impl ObservationNorm {
    fn build(
        in_keys: Vec<NestedKey>,
        loc: Option<Tensor>,
        scale: Option<Tensor>,
        eps: f64,
    ) -> Result<Self> {
        if in_keys.is_empty() {
            return Err(Error::config(
                OP,
                "in_keys",
                "the observation keys to normalise (required; TorchRL dropped its default keys \
                 for the same reason)",
                "none",
            ));
        }
        Ok(ObservationNorm {
            loc,
            scale,
            keys: KeyMap::new(in_keys),
            keys_inv: KeyMap::default(),
            standard_normal: false,
            eps,
        })
    }

    /// Scalar statistics (float32, as TorchRL's default dtype). Errors when `in_keys` is empty,
    /// `scale <= 0`, or a value is not finite.
    pub fn new<K: Into<NestedKey>>(
        loc: f64,
        scale: f64,
        in_keys: impl IntoIterator<Item = K>,
    ) -> Result<Self> {
        let loc = Tensor::from(loc as f32);
        let scale = Tensor::from(scale as f32);
        check_stats(&loc, &scale)?;
        Self::build(collect_keys(in_keys), Some(loc), Some(scale), 1e-6)
    }

    /// Tensor statistics (broadcast against each value's feature dims; any floating dtype).
    /// `eps` defaults to the machine epsilon of `scale`'s dtype, as in TorchRL. Errors as
    /// [`ObservationNorm::new`].
    pub fn from_tensors<K: Into<NestedKey>>(
        loc: Tensor,
        scale: Tensor,
        in_keys: impl IntoIterator<Item = K>,
    ) -> Result<Self> {
        check_stats(&loc, &scale)?;
        let eps = finfo_eps(scale.kind());
        Self::build(collect_keys(in_keys), Some(loc), Some(scale), eps)
    }

    /// No statistics yet: append the transform and call [`ObservationNorm::init_stats_at`], or
    /// call [`ObservationNorm::init_stats`] before appending it.
    pub fn uninitialized<K: Into<NestedKey>>(in_keys: impl IntoIterator<Item = K>) -> Result<Self> {
        Self::build(collect_keys(in_keys), None, None, 1e-6)
    }

    /// The location, once known.
    pub fn loc(&self) -> Option<&Tensor> {
        self.loc.as_ref()
    }

    /// The scale, once known.
    pub fn scale(&self) -> Option<&Tensor> {
        self.scale.as_ref()
    }

    /// True once `loc` and `scale` are set.
    pub fn is_initialized(&self) -> bool {
        self.loc.is_some() && self.scale.is_some()
    }

    /// Whether the transform standardises.
    pub fn standard_normal(&self) -> bool {
        self.standard_normal
    }

    /// The in keys.
    pub fn in_keys(&self) -> &[NestedKey] {
        &self.keys.ins
    }

    fn pairs(&self) -> Result<Vec<(NestedKey, NestedKey)>> {
        self.keys.pairs(OP, self, "")
    }

    fn pairs_inv(&self) -> Result<Vec<(NestedKey, NestedKey)>> {
        self.keys_inv.pairs(OP, self, "inverse ")
    }

    fn stats(&self) -> Result<(&Tensor, &Tensor)> {
        match (&self.loc, &self.scale) {
            (Some(l), Some(s)) => Ok((l, s)),
            _ => Err(Error::config(
                OP,
                "loc/scale",
                "initialized statistics: pass them to the constructor or call init_stats \
                 (ObservationNorm::init_stats_at for a transform already in an env)",
                format_args!(
                    "none: ObservationNorm on {}: loc/scale have not been initialized",
                    fmt_key_list(&self.keys.ins)
                ),
            )),
        }
    }

    /// The map (`inverse`: its inverse) on `x`, in `x`'s dtype and device and shape.
    fn apply(&self, x: &Tensor, inverse: bool, key: &NestedKey) -> Result<Tensor> {
        let (loc, scale) = self.stats()?;
        if !is_float(x.kind()) {
            return Err(Error::value(
                OP,
                key,
                format!(
                    "a floating dtype for {} (cast it first, e.g. with DTypeCast)",
                    self.name()
                ),
                format!("dtype {:?}", x.kind()),
            ));
        }
        let loc = loc.f_to_kind(x.kind())?.f_to_device(x.device())?;
        let scale = scale.f_to_kind(x.kind())?.f_to_device(x.device())?;
        let multiply = self.standard_normal == inverse;
        let y = if multiply {
            x.f_mul(&scale)?.f_add(&loc)?
        } else {
            x.f_sub(&loc)?.f_div(&scale)?
        };
        if y.size() != x.size() {
            return Err(Error::ShapeMismatch {
                op: "ObservationNorm (loc/scale do not broadcast to the value's shape)",
                key: format!(
                    "{key} (loc {}, scale {})",
                    ShapeFmt(&loc.size()),
                    ShapeFmt(&scale.size())
                ),
                expected: x.size(),
                actual: y.size(),
            });
        }
        Ok(y)
    }

    /// The spec with its bounds mapped forward (non-Bounded specs are kept).
    fn map_spec(&self, key: &NestedKey, spec: &TensorSpec, group: SpecGroup) -> Result<TensorSpec> {
        match spec.dtype() {
            Some(k) if is_float(k) => {}
            other => {
                return Err(Error::value(
                    OP,
                    key,
                    format!(
                        "a floating dtype in the {group} spec for {} (cast it first, e.g. with \
                         DTypeCast)",
                        self.name()
                    ),
                    format!("dtype {other:?}"),
                ))
            }
        }
        if !self.is_initialized() {
            // Appended before its statistics: the spec is mapped once they are known.
            return Ok(spec.clone());
        }
        match spec {
            TensorSpec::Bounded(b) => {
                let low = self.apply(b.low(), false, key)?;
                let high = self.apply(b.high(), false, key)?;
                Ok(Bounded::from_tensors(low, high)?.into())
            }
            other => Ok(other.clone()),
        }
    }

    /// Maps `pairs` in `td`: reads `src`, writes `dst`.
    fn map_pairs(
        &self,
        td: &mut TensorDict,
        pairs: &[(NestedKey, NestedKey)],
        inverse: bool,
        tolerant: bool,
        op: &'static str,
    ) -> Result<()> {
        map_key_pairs(td, pairs, inverse, tolerant, op, |v, src| {
            self.apply(v, inverse, src)
        })
    }

    /// Computes `loc` and `scale` from rollouts of `parent`, the env this transform is about to
    /// be appended to, with the defaults of [`InitStats::new`] (reduce over dim 0, the time dim
    /// of an unbatched env). See [`ObservationNorm::init_stats_with`].
    pub fn init_stats<E: EnvBase + ?Sized>(
        &mut self,
        parent: &mut E,
        num_iter: usize,
    ) -> Result<()> {
        self.init_stats_with(parent, &InitStats::new(num_iter))
    }

    /// Computes `loc` and `scale` as TorchRL's `init_stats`: runs `parent.rollout(num_iter)`
    /// (random actions, stopping on done) until `num_iter` frames are collected, concatenates
    /// the root entries at `key` along `cat_dim`, and takes the mean and the unbiased standard
    /// deviation over `reduce_dim`. Without `standard_normal`, `scale = 1 / max(std, eps)` and
    /// `loc = -mean * scale`; with it, `loc = mean` and `scale = std`; finally
    /// `scale = max(scale, eps)`.
    ///
    /// Errors: statistics already set; several in keys and no `key`; several `reduce_dim` and
    /// no `cat_dim`; `cat_dim` not in `reduce_dim`; `keep_dims` not in `reduce_dim`;
    /// `num_iter == 0`; a non-floating entry; non-finite results (e.g. a single frame, whose
    /// unbiased standard deviation is NaN). On error the transform is unchanged.
    pub fn init_stats_with<E: EnvBase + ?Sized>(
        &mut self,
        parent: &mut E,
        cfg: &InitStats,
    ) -> Result<()> {
        let (cat_dim, key) = self.check_init(cfg)?;
        self.compute_stats(parent, cfg, cat_dim, &key)
    }

    /// TorchRL's `env.transform[index].init_stats(...)`: computes the statistics of the
    /// uninitialised `ObservationNorm` at `index` of `env` from rollouts of the env **up to**
    /// that transform (its base env and the transforms before `index`), as
    /// [`ObservationNorm::init_stats_with`] does, then recomputes the env's specs (a `Bounded`
    /// observation now gets its mapped bounds).
    ///
    /// How: the transforms from `index` on are taken out of the env and its specs recomputed,
    /// which leaves exactly the parent env TorchRL rolls out (for `index == 0`, the base env
    /// behind a transparent wrapper); the statistics are computed on it, then the transforms are
    /// put back in their places and the whole stack is attached again. The base env is stepped
    /// and the transforms before `index` see the rollouts, as in TorchRL.
    ///
    /// Errors (the env is then as before and the transform stays uninitialised): no
    /// `ObservationNorm` at `index`; an `ObservationNorm` before `index` without statistics
    /// (TorchRL's "initialized in the right order" error: initialise them first to last); the
    /// errors of [`ObservationNorm::init_stats_with`]; a later transform that cannot be attached
    /// to the normalised specs.
    ///
    /// ```
    /// use torchrl::envs::builtin::CountingEnv;
    /// use torchrl::envs::transforms::{InitStats, ObservationNorm, StepCounter, TransformedEnv};
    /// # fn main() -> torchrl::Result<()> {
    /// let mut env = TransformedEnv::new(CountingEnv::new(100, &[])?)?
    ///     .with(StepCounter::new())?
    ///     .with(ObservationNorm::uninitialized(["observation"])?)?;
    /// ObservationNorm::init_stats_at(&mut env, 1, &InitStats::new(10))?;
    /// assert!(env.transform().get_as::<ObservationNorm>(1).is_some_and(|n| n.is_initialized()));
    /// # Ok(()) }
    /// ```
    pub fn init_stats_at<E: EnvBase>(
        env: &mut TransformedEnv<E>,
        index: usize,
        cfg: &InitStats,
    ) -> Result<()> {
        let op = "ObservationNorm::init_stats_at";
        let len = env.transform().len();
        let Some(norm) = env.transform().get_as::<ObservationNorm>(index) else {
            return Err(match env.transform().get(index) {
                None => Error::IndexOutOfRange {
                    op,
                    index: index as i64,
                    what: "transforms of the env".into(),
                    size: len as i64,
                },
                Some(t) => Error::argument(
                    op,
                    "index",
                    "the index of an ObservationNorm in the env's transforms",
                    format!(
                        "{index}, where the transform is {}, not an ObservationNorm",
                        t.name()
                    ),
                ),
            });
        };
        let (cat_dim, key) = norm.check_init(cfg)?;
        if let Some(j) = (0..index).find(|j| {
            env.transform()
                .get_as::<ObservationNorm>(*j)
                .is_some_and(|n| !n.is_initialized())
        }) {
            return Err(Error::InvalidValue {
                op,
                what: "transform at index",
                key: j.to_string(),
                expected: "an initialized parent ObservationNorm (ObservationNorms need to be \
                           initialized in the right order)"
                    .to_string(),
                got: format!(
                    "an uninitialized one: trying to initialize the ObservationNorm at index \
                     {index} while the parent ObservationNorm at index {j} is still uninitialized"
                ),
            });
        }
        // Take out the transforms from `index` on; what is left is the parent env.
        let mut tail: Vec<Box<dyn Transform>> = Vec::with_capacity(len - index);
        for i in (index..len).rev() {
            match env.transform_mut().remove(i) {
                Ok(t) => tail.push(t),
                Err(_) => break,
            }
        }
        tail.reverse();
        let computed = env.refresh_specs().and_then(|()| {
            match tail
                .first_mut()
                .and_then(|t| (**t).as_any_mut().downcast_mut::<ObservationNorm>())
            {
                Some(norm) => norm.compute_stats(env, cfg, cat_dim, &key),
                None => Err(Error::invalid(op, "internal: the transform moved")),
            }
        });
        // Put them back, and attach the whole stack again.
        for t in tail {
            env.transform_mut().push_boxed(t);
        }
        if let Err(e) = computed {
            env.refresh_specs()?;
            return Err(e);
        }
        if let Err(e) = env.refresh_specs() {
            if let Some(norm) = env.transform_mut().get_as_mut::<ObservationNorm>(index) {
                norm.loc = None;
                norm.scale = None;
            }
            env.refresh_specs()?;
            return Err(e);
        }
        Ok(())
    }

    /// Validates `cfg` against the transform (TorchRL's checks, in its order); returns the dim
    /// to concatenate along and the key to read.
    fn check_init(&self, cfg: &InitStats) -> Result<(i64, NestedKey)> {
        let cat_dim = match (cfg.cat_dim, cfg.reduce_dim.as_slice()) {
            (_, []) => {
                return Err(Error::config(
                    "ObservationNorm::init_stats",
                    "reduce_dim",
                    "at least one dim",
                    "[]",
                ))
            }
            (Some(c), _) => c,
            (None, [one]) => *one,
            (None, _) => {
                return Err(Error::config(
                    "ObservationNorm::init_stats",
                    "cat_dim",
                    format!(
                        "cat_dim must be specified if reduce_dim is not a single dim (reduce_dim \
                         {:?})",
                        cfg.reduce_dim
                    ),
                    "none",
                ))
            }
        };
        if !cfg.reduce_dim.contains(&cat_dim) {
            return Err(Error::config(
                "ObservationNorm::init_stats",
                "cat_dim",
                format!(
                    "cat_dim must be part of or equal to reduce_dim {:?}",
                    cfg.reduce_dim
                ),
                cat_dim,
            ));
        }
        if let (Some(l), Some(s)) = (&self.loc, &self.scale) {
            return Err(Error::config(
                "ObservationNorm::init_stats",
                "loc, scale",
                "uninitialized statistics (init_stats computes them once)",
                format!(
                    "statistics that are already initialized: ({}, {})",
                    describe(l),
                    describe(s)
                ),
            ));
        }
        if self.keys.ins.len() > 1 && cfg.key.is_none() {
            return Err(Error::config(
                "ObservationNorm::init_stats",
                "key",
                format!(
                    "a specific key (InitStats::with_key), since the transform has multiple \
                     in_keys {}",
                    fmt_key_list(&self.keys.ins)
                ),
                "none",
            ));
        }
        if cfg.num_iter == 0 {
            return Err(Error::config(
                "ObservationNorm::init_stats",
                "num_iter",
                "at least 1",
                0,
            ));
        }
        if !(self.eps > 0.0 && self.eps.is_finite()) {
            return Err(Error::config(
                "ObservationNorm::init_stats",
                "eps",
                "a positive finite number",
                self.eps,
            ));
        }
        let key = match (&cfg.key, self.keys.ins.first()) {
            (Some(k), _) => k.clone(),
            (None, Some(k)) => k.clone(),
            (None, None) => return Err(Error::invalid(OP, "init_stats: no key")),
        };
        Ok((cat_dim, key))
    }

    /// Runs the rollouts of `parent` and sets `loc` and `scale` (after [`Self::check_init`]).
    fn compute_stats<E: EnvBase + ?Sized>(
        &mut self,
        parent: &mut E,
        cfg: &InitStats,
        cat_dim: i64,
        key: &NestedKey,
    ) -> Result<()> {
        let mut collected = 0usize;
        let mut data: Vec<Tensor> = Vec::new();
        while collected < cfg.num_iter {
            let td = parent.rollout(cfg.num_iter, None, &RolloutConfig::default())?;
            collected += td.numel().max(0) as usize;
            let v = td
                .get(key)
                .ok_or_else(|| missing_key("ObservationNorm::init_stats", &td, key))?;
            if !is_float(v.kind()) {
                return Err(Error::value(
                    "ObservationNorm::init_stats",
                    key,
                    "a floating dtype (statistics need one)",
                    format!("dtype {:?}", v.kind()),
                ));
            }
            data.push(v.shallow_clone());
            if td.numel() == 0 {
                return Err(Error::value(
                    "ObservationNorm::init_stats",
                    key,
                    "non-empty rollouts",
                    "rollouts with no element (the rollouts are empty: a batch dim of size 0?)",
                ));
            }
        }
        let data = Tensor::f_cat(&data, cat_dim)?;
        let nd = data.dim() as i64;
        let to_neg = |d: i64| -> Result<i64> {
            let n = if d < 0 { d } else { d - nd };
            if n < -nd || n >= 0 {
                return Err(Error::IndexOutOfRange {
                    op: "ObservationNorm::init_stats",
                    index: d,
                    what: format!(
                        "dims of the collected {key} data (shape {})",
                        ShapeFmt(&data.size())
                    ),
                    size: nd,
                });
            }
            Ok(n)
        };
        let sorted = |dims: &[i64]| -> Result<Vec<i64>> {
            let mut out = dims
                .iter()
                .map(|d| to_neg(*d))
                .collect::<Result<Vec<_>>>()?;
            out.sort_unstable();
            Ok(out)
        };
        let mut reduce = sorted(&cfg.reduce_dim)?;
        reduce.dedup();
        let keep = sorted(&cfg.keep_dims)?;
        if let Some(k) = keep.iter().find(|k| !reduce.contains(k)) {
            return Err(Error::config(
                "ObservationNorm::init_stats",
                "keep_dims",
                "dims that are part of reduce_dim",
                format!("dim {k}, which is not"),
            ));
        }
        let mut loc = data.f_mean_dim(reduce.as_slice(), true, data.kind())?;
        let mut scale = data.f_std_dim(reduce.as_slice(), true, true)?;
        for r in &reduce {
            if !keep.contains(r) {
                loc = loc.f_squeeze_dim(*r)?;
                scale = scale.f_squeeze_dim(*r)?;
            }
        }
        if !self.standard_normal {
            scale = clamp_f64(OP, &scale, Some(self.eps), None)?.f_reciprocal()?;
            loc = loc.f_neg()?.f_mul(&scale)?;
        }
        for (name, t) in [("loc", &loc), ("scale", &scale)] {
            if !all_true(&t.f_isfinite()?)? {
                return Err(Error::value(
                    "ObservationNorm::init_stats",
                    key,
                    format!("finite statistics in {name} (collect more frames)"),
                    format!("non-finite values found in {name} ({})", describe(t)),
                ));
            }
        }
        self.scale = Some(clamp_f64(OP, &scale, Some(self.eps), None)?);
        self.loc = Some(loc);
        Ok(())
    }
}

setters!(ObservationNorm {
    /// Standardise, `(obs - loc) / scale`, instead of `obs * scale + loc`; `init_stats` then
    /// stores the mean and standard deviation as they are.
    with_standard_normal(standard_normal: bool);
    /// The floor of the standard deviations computed by `init_stats` (default `1e-6`, or the
    /// machine epsilon of a tensor scale's dtype).
    with_eps(eps: f64);

    /// Where the results are written (one per in key; default: the in keys).
    with_out_keys(keys) => keys.outs [Some];
    /// Parent-side names of the action / state entries mapped back on their way in.
    with_in_keys_inv(keys) => keys_inv.ins;
    /// Policy-side names of the inverse entries (one per inverse in key; default: the same).
    with_out_keys_inv(keys) => keys_inv.outs [Some];
});

impl Transform for ObservationNorm {
    fn name(&self) -> String {
        let keys = fmt_key_list(&self.keys.ins);
        match (&self.loc, &self.scale) {
            (Some(l), Some(s)) if l.elements() == 1 && s.elements() == 1 => format!(
                "ObservationNorm(loc={:.4}, scale={:.4}, keys={keys}{})",
                first_value(l),
                first_value(s),
                if self.standard_normal {
                    ", standard_normal"
                } else {
                    ""
                }
            ),
            (Some(l), Some(s)) => format!(
                "ObservationNorm(loc: {}, scale: {}, keys={keys}{})",
                ShapeFmt(&l.size()),
                ShapeFmt(&s.size()),
                if self.standard_normal {
                    ", standard_normal"
                } else {
                    ""
                }
            ),
            _ => format!("ObservationNorm(uninitialized, keys={keys})"),
        }
    }

    fn attach(&mut self, parent: &EnvSpecs) -> Result<()> {
        let pairs = self.pairs()?;
        refuse_state_keys(
            OP,
            &self.name(),
            parent,
            pairs.iter().filter(|(i, o)| i == o).map(|(i, _)| i),
            IN_PLACE,
        )?;
        for (k, _) in pairs {
            if !parent.observation.contains(&k) {
                return Err(Error::KeyNotFound {
                    op: "ObservationNorm (in keys are looked up in the observation spec)",
                    key: k.to_string(),
                    available: parent
                        .observation_keys()
                        .iter()
                        .map(|k| k.to_string())
                        .collect(),
                });
            }
        }
        for (k, _) in self.pairs_inv()? {
            if parent.input_group_of(&k).is_none() {
                return Err(Error::KeyNotFound {
                    op: "ObservationNorm (inverse in keys are looked up in the action, then the state spec)",
                    key: k.to_string(),
                    available: input_keys_available(parent),
                });
            }
        }
        Ok(())
    }

    fn new_output_keys(&self) -> Vec<NestedKey> {
        self.pairs().map(|p| added_keys(&p)).unwrap_or_default()
    }

    fn transform_observation_spec(
        &self,
        mut spec: crate::data::specs::Composite,
    ) -> Result<crate::data::specs::Composite> {
        for (in_key, out_key) in self.pairs()? {
            let leaf = spec.get_or_err(&in_key)?;
            let mapped = self.map_spec(&in_key, leaf, SpecGroup::Observation)?;
            spec.set(&out_key, mapped)?;
        }
        Ok(spec)
    }

    fn transform_input_spec(&self, specs: EnvSpecs) -> Result<EnvSpecs> {
        map_input_specs(
            "ObservationNorm (inverse in keys are looked up in the action, then the state spec)",
            specs,
            self.pairs_inv()?,
            |key, leaf, group| self.map_spec(key, leaf, group),
        )
    }

    fn step(&mut self, _td: &TensorDict, mut next: TensorDict) -> Result<TensorDict> {
        let pairs = self.pairs()?;
        self.map_pairs(&mut next, &pairs, false, false, "ObservationNorm (step)")?;
        Ok(next)
    }

    fn reset(&mut self, _td: &TensorDict, mut reset: TensorDict) -> Result<TensorDict> {
        let pairs = self.pairs()?;
        self.map_pairs(&mut reset, &pairs, false, true, "ObservationNorm (reset)")?;
        Ok(reset)
    }

    fn inv(&mut self, mut td: TensorDict) -> Result<TensorDict> {
        let pairs = self.pairs_inv()?;
        self.map_pairs(&mut td, &pairs, true, false, "ObservationNorm (inverse)")?;
        Ok(td)
    }

    fn forward(&mut self, mut td: TensorDict) -> Result<TensorDict> {
        let pairs = self.pairs()?;
        self.map_pairs(&mut td, &pairs, false, false, "ObservationNorm (forward)")?;
        Ok(td)
    }
}
