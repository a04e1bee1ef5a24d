//! [`ProbabilisticActor`]: TorchRL's `ProbabilisticActor`, a policy that computes distribution
//! parameters, builds a distribution and writes an action (and its log-probability).
//!
//! The pipeline is: an optional parameter module (any [`TensorDictModule`], e.g. a
//! [`TdModule`](super::module::TdModule) around an [`MLP`](super::models::MLP) followed by a
//! [`NormalParamExtractor`]) → a [`DistributionBuilder`] (reads the parameter keys, e.g.
//! `"loc"` and `"scale"`, and returns a `Box<dyn Distribution>`; ready-made builders exist for
//! [`Normal`], [`TanhNormal`] (bounds given or read from an action spec), [`Categorical`] and
//! [`OneHotCategorical`] (optionally masked) and [`Delta`]) → an action taken according to the
//! [`ExplorationType`] → written under the action key (default `"action"`), and with
//! `return_log_prob` its `dist.log_prob(action)` under the log-prob key (default: the action
//! key's last segment with `"_log_prob"` appended, so `"action_log_prob"`, as in TorchRL 0.14
//! where `composite_lp_aggregate` is off).
//!
//! **Exploration** (TorchRL's `InteractionType`; the actor's own type is TorchRL's
//! `default_interaction_type`, [`ExplorationType::Deterministic`]; a type set on the thread
//! with [`set_exploration_type`](super::set_exploration_type) overrides it in `forward`, and
//! the [`Collector`](crate::collectors::Collector) sets `Random` while it collects, as
//! TorchRL's collectors do; [`ProbabilisticActor::forward_with`] takes one per call):
//! - `Random`: a sample, reparameterised (`rsample`, so the action carries gradients) for the
//!   continuous builders, as in TorchRL, and drawn with `sample` for the categorical ones
//!   (integer actions; see [`DistributionBuilder::with_rsample`]); the noise comes from the
//!   actor's own [`Generator`] ([`ProbabilisticActor::with_seed`]) or from one passed to
//!   [`ProbabilisticActor::forward_with`], never from libtorch's global RNG;
//! - `Deterministic`: `dist.deterministic_sample()` (TanhNormal: `c + h·tanh(loc)`; Normal: the
//!   mean; categorical: the most likely class);
//! - `Mode`: `dist.mode()`;
//! - `Mean`: `dist.mean()`; where it has no closed form (TanhNormal) and the distribution has
//!   `rsample` (and the builder uses it), the mean of `n_empirical_estimate` (default 1000)
//!   reparameterised samples, as TorchRL does;
//!   otherwise the distribution's error.
//!
//! **Gradients**: `forward` keeps the autograd graph (losses need it);
//! [`TensorDictModule::as_policy`] runs it under `no_grad`, as TorchRL's collectors do.
//! [`ProbabilisticActor::get_dist`] runs the parameter module and builds the distribution for
//! a loss; [`ProbabilisticActor::log_prob`] scores the actions already in a tensordict.
//!
//! Not ported: the actor's `spec`/`safe` projection (a [`TanhNormal`] built from the action
//! spec stays strictly inside its bounds), composite distributions, `cache_dist`.
//!
//! A TanhNormal policy on Pendulum, used in a rollout:
//!
//! ```
//! use tch::{nn, Device, Kind};
//! use torchrl::envs::builtin::PendulumEnv;
//! use torchrl::envs::{EnvBase, RolloutConfig, SpecGroup};
//! use torchrl::modules::actors::{
//!     DistributionBuilder, ExplorationType, NormalParamExtractor, ProbabilisticActor,
//! };
//! use torchrl::modules::models::{MlpConfig, MLP};
//! use torchrl::modules::module::{TdModule, TensorDictModule};
//! use torchrl::modules::sequential::TensorDictSequential;
//! # fn main() -> torchrl::Result<()> {
//! let mut env = PendulumEnv::new(&[4], Device::Cpu)?;
//! env.set_seed(0)?;
//! let vs = nn::VarStore::new(Device::Cpu);
//! let mlp = MLP::new(&vs.root(), &MlpConfig::new(3, 2).with_depth(2).with_num_cells(32))?;
//! let net = TensorDictSequential::new()
//!     .with(TdModule::new(mlp, ["observation"], ["param"])?) // [*B, 2]
//!     .with(NormalParamExtractor::new());                   // "param" -> "loc", "scale"
//! // bounds from the env's action spec (its first dim is the env's batch dim)
//! let spec = env.specs().group(SpecGroup::Action).get_or_err("action")?;
//! let dist = DistributionBuilder::tanh_normal_from_spec("loc", "scale", spec, env.batch_size().len())?;
//! let actor = ProbabilisticActor::new(net, dist)
//!     .with_exploration_type(ExplorationType::Random)
//!     .with_return_log_prob(true)
//!     .with_seed(0);
//! assert_eq!(actor.in_keys(), ["observation"]);
//!
//! let mut policy = actor.as_policy(); // forward under no_grad
//! let traj = env.rollout(50, Some(&mut policy), &RolloutConfig::default())?;
//! let action = traj.get_or_err("action")?;
//! assert_eq!(action.size(), vec![4, 50, 1]);
//! assert!(action.abs().max().double_value(&[]) < 2.0); // strictly inside Bounded(-2, 2)
//! let lp = traj.get_or_err("action_log_prob")?;
//! assert_eq!(lp.size(), vec![4, 50]);
//! assert!(!lp.requires_grad());
//!
//! // for a loss: the distribution of the stored observations, with gradients to the MLP
//! let new_lp = actor.log_prob(&traj)?;
//! assert!(new_lp.requires_grad());
//! assert!(new_lp.f_sub(lp)?.abs().max().double_value(&[]) < 1e-4); // same weights, same log-probs
//! # Ok(()) }
//! ```

use std::fmt;
use std::sync::Mutex;

use tch::{Kind, Tensor};

use super::distributions::{
    Categorical, Delta, Distribution, Normal, OneHotCategorical, TanhBounds, TanhNormal,
};
use super::module::{describe, module_error, read_input, to_keys, write_outputs, TensorDictModule};
pub use super::probabilistic::ExplorationType;
use super::probabilistic::ProbabilisticTensorDictModule;
use crate::data::specs::TensorSpec;
use crate::error::{Error, Result, ShapeFmt};
use crate::macros::setters;
use crate::rng::Generator;
use crate::tensordict::{fmt_key_list, AsKey, NestedKey, TensorDict};

// ------------------------------------------------------------------ distribution builders

/// What a [`DistributionBuilder`] runs.
pub type BuildFn = dyn Fn(&TensorDict) -> Result<Box<dyn Distribution>> + Send;

/// Builds a distribution from entries of a tensordict (TorchRL's `distribution_class` +
/// `distribution_kwargs` + the actor's `in_keys`).
///
/// The ready-made builders read their keys with a [`Error::KeyNotFound`] that names the key
/// and the keys present; [`DistributionBuilder::custom`] takes any closure.
pub struct DistributionBuilder {
    name: String,
    in_keys: Vec<NestedKey>,
    build: Box<BuildFn>,
    rsample: bool,
}

impl fmt::Debug for DistributionBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}(in_keys={})", self.name, fmt_key_list(&self.in_keys))
    }
}

const GET_DIST: &str = "ProbabilisticActor::get_dist";

/// Reads `key` of `td` for a distribution parameter.
fn param<'a>(td: &'a TensorDict, key: &NestedKey) -> Result<&'a Tensor> {
    read_input(GET_DIST, td, key)
}

impl DistributionBuilder {
    /// A builder from a closure: `name` is shown in `Debug`, `in_keys` are the keys it reads
    /// (an actor reports them as its in keys when its module does not produce them).
    pub fn custom<K, F>(
        name: impl Into<String>,
        in_keys: impl IntoIterator<Item = K>,
        build: F,
    ) -> Result<Self>
    where
        K: AsKey,
        F: Fn(&TensorDict) -> Result<Box<dyn Distribution>> + Send + 'static,
    {
        Ok(DistributionBuilder {
            name: name.into(),
            in_keys: to_keys("DistributionBuilder::custom", in_keys)?,
            build: Box::new(build),
            rsample: true,
        })
    }

    /// Whether [`ExplorationType::Random`] draws with `rsample` (when the distribution has
    /// one) rather than `sample`. On by default and for the continuous builders (Normal,
    /// TanhNormal, Delta: the action carries gradients, as in TorchRL); off for the categorical
    /// ones, whose actions are integer classes or integer one-hot vectors (TorchRL's
    /// `OneHotCategorical` reports `has_rsample = False`; its straight-through `rsample`
    /// stays available on the distribution).
    pub fn with_rsample(mut self, rsample: bool) -> Self {
        self.rsample = rsample;
        self
    }

    /// See [`DistributionBuilder::with_rsample`].
    pub fn uses_rsample(&self) -> bool {
        self.rsample
    }

    /// A [`Normal`] from `loc` and `scale` (scalar events: `log_prob` has the shape of `loc`).
    pub fn normal(loc: impl AsKey, scale: impl AsKey) -> Result<Self> {
        let (l, s) = (loc.to_nested_key(), scale.to_nested_key());
        DistributionBuilder::custom("Normal", [l.clone(), s.clone()], move |td| {
            Ok(Box::new(Normal::new(param(td, &l)?, param(td, &s)?)?))
        })
    }

    /// A [`TanhNormal`] from `loc` and `scale` over `(low, high)` in every dim.
    pub fn tanh_normal(loc: impl AsKey, scale: impl AsKey, low: f64, high: f64) -> Result<Self> {
        let opts = (Kind::Double, tch::Device::Cpu);
        DistributionBuilder::tanh_normal_with_bounds(
            loc,
            scale,
            &Tensor::f_full([], low, opts)?,
            &Tensor::f_full([], high, opts)?,
        )
    }

    /// A [`TanhNormal`] from `loc` and `scale` over per-dim bounds (`low` and `high`
    /// broadcast with `loc`: give them the action's feature shape, e.g. `[action_dim]`).
    /// Errors when the bounds are not finite with `high > low`.
    pub fn tanh_normal_with_bounds(
        loc: impl AsKey,
        scale: impl AsKey,
        low: &Tensor,
        high: &Tensor,
    ) -> Result<Self> {
        let op = "DistributionBuilder::tanh_normal";
        let (low, high) = (low.f_detach()?, high.f_detach()?);
        let ok = {
            let _guard = tch::no_grad_guard();
            let (l, h) = (low.f_to_kind(Kind::Double)?, high.f_to_kind(Kind::Double)?);
            h.f_gt_tensor(&l)?
                .f_logical_and(&l.f_isfinite()?)?
                .f_logical_and(&h.f_isfinite()?)?
                .f_all()?
                .f_int64_value(&[])?
                == 1
        };
        if !ok {
            return Err(Error::InvalidValue {
                op,
                what: "argument",
                key: "low, high".into(),
                expected: "finite bounds with high > low everywhere".into(),
                got: format!(
                    "bounds that are not (low of shape {}, high of shape {})",
                    ShapeFmt(&low.size()),
                    ShapeFmt(&high.size())
                ),
            });
        }
        // checked and derived once, not at every call (TanhBounds)
        let bounds = TanhBounds::new(&low, &high)?;
        let (l, s) = (loc.to_nested_key(), scale.to_nested_key());
        DistributionBuilder::custom("TanhNormal", [l.clone(), s.clone()], move |td| {
            Ok(Box::new(TanhNormal::with_bounds(
                param(td, &l)?,
                param(td, &s)?,
                &bounds,
            )?))
        })
    }

    /// A [`TanhNormal`] over the bounds of a `Bounded` action spec (TorchRL's
    /// `distribution_kwargs={"low": spec.space.low, "high": spec.space.high}`).
    ///
    /// Env specs have the env's batch dims in front (`[*batch, *feature]`); `batch_dims` says
    /// how many to drop, so that the bounds broadcast with actions of any batch shape (a
    /// rollout's `[*batch, time]` included). Errors when the spec is not `Bounded`, has fewer
    /// dims, or its bounds differ across the dropped dims.
    pub fn tanh_normal_from_spec(
        loc: impl AsKey,
        scale: impl AsKey,
        spec: &TensorSpec,
        batch_dims: usize,
    ) -> Result<Self> {
        let op = "DistributionBuilder::tanh_normal_from_spec";
        let TensorSpec::Bounded(b) = spec else {
            return Err(Error::InvalidValue {
                op,
                what: "argument",
                key: "spec".into(),
                expected: "a Bounded spec (a TanhNormal needs bounds)".into(),
                got: format!("{} of shape {}", spec.class_name(), ShapeFmt(spec.shape())),
            });
        };
        let shape = b.shape();
        let Some(feature) = shape.get(batch_dims..) else {
            return Err(Error::argument(
                op,
                "batch_dims",
                format!(
                    "at most the {} dims of the spec of shape {}",
                    shape.len(),
                    ShapeFmt(shape)
                ),
                format!("{batch_dims} (cannot drop {batch_dims} batch dims)"),
            ));
        };
        let strip = |t: &Tensor| -> Result<Tensor> {
            let full = t.f_broadcast_to(shape)?;
            let mut rows_shape = vec![-1i64];
            rows_shape.extend_from_slice(feature);
            let rows = full.f_reshape(rows_shape.as_slice())?;
            if rows.size().first() == Some(&0) {
                return Err(Error::argument(
                    op,
                    "spec",
                    "a spec with at least one element",
                    format!("a spec of shape {}, which has no element", ShapeFmt(shape)),
                ));
            }
            let first = rows.f_select(0, 0)?;
            let same = rows
                .f_eq_tensor(&first.f_unsqueeze(0)?)?
                .f_all()?
                .f_int64_value(&[])?
                == 1;
            if !same {
                return Err(Error::argument(
                    op,
                    "spec",
                    format!(
                        "bounds equal across the first {batch_dims} dim(s) (or give per-element \
                         bounds with tanh_normal_with_bounds)"
                    ),
                    format!(
                        "a spec of shape {} whose bounds differ across its first {batch_dims} \
                         dim(s)",
                        ShapeFmt(shape)
                    ),
                ));
            }
            Ok(first)
        };
        let (low, high) = (strip(b.low())?, strip(b.high())?);
        DistributionBuilder::tanh_normal_with_bounds(loc, scale, &low, &high)
    }

    /// A [`Categorical`] from `logits` (the last dim indexes the classes).
    pub fn categorical(logits: impl AsKey) -> Result<Self> {
        DistributionBuilder::discrete(
            "Categorical",
            logits,
            None::<NestedKey>,
            Categorical::from_logits,
        )
    }

    /// A masked [`Categorical`] (TorchRL's `MaskedCategorical`): classes whose `mask` entry is
    /// false are never drawn and have probability 0.
    pub fn masked_categorical(logits: impl AsKey, mask: impl AsKey) -> Result<Self> {
        DistributionBuilder::discrete(
            "MaskedCategorical",
            logits,
            Some(mask),
            Categorical::from_logits,
        )
    }

    /// A [`OneHotCategorical`] from `logits`: actions are one-hot vectors.
    pub fn one_hot_categorical(logits: impl AsKey) -> Result<Self> {
        DistributionBuilder::discrete(
            "OneHotCategorical",
            logits,
            None::<NestedKey>,
            OneHotCategorical::from_logits,
        )
    }

    /// A masked [`OneHotCategorical`].
    pub fn masked_one_hot_categorical(logits: impl AsKey, mask: impl AsKey) -> Result<Self> {
        DistributionBuilder::discrete(
            "MaskedOneHotCategorical",
            logits,
            Some(mask),
            OneHotCategorical::from_logits,
        )
    }

    /// A builder of the categorical family: `make(logits, mask)` on the parameters read under
    /// `logits` and, when given, `mask`; `sample` (not `rsample`) under random exploration.
    fn discrete<D: Distribution + 'static>(
        name: &str,
        logits: impl AsKey,
        mask: Option<impl AsKey>,
        make: fn(&Tensor, Option<&Tensor>) -> Result<D>,
    ) -> Result<Self> {
        let logits = logits.to_nested_key();
        let mask = mask.map(|m| m.to_nested_key());
        let mut keys = vec![logits.clone()];
        keys.extend(mask.clone());
        DistributionBuilder::custom(name, keys, move |td| {
            let m = match &mask {
                Some(k) => Some(param(td, k)?),
                None => None,
            };
            Ok(Box::new(make(param(td, &logits)?, m)?) as Box<dyn Distribution>)
        })
        .map(|b| b.with_rsample(false))
    }

    /// A [`Delta`] at `param` (a deterministic policy, e.g. DDPG's).
    pub fn delta(param_key: impl AsKey) -> Result<Self> {
        let p = param_key.to_nested_key();
        DistributionBuilder::custom("Delta", [p.clone()], move |td| {
            Ok(Box::new(Delta::new(param(td, &p)?)?))
        })
    }

    /// The keys the builder reads.
    pub fn in_keys(&self) -> &[NestedKey] {
        &self.in_keys
    }

    /// The builder's name (`"TanhNormal"`, …, or the custom name).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Builds the distribution from `td`.
    pub fn build(&self, td: &TensorDict) -> Result<Box<dyn Distribution>> {
        (self.build)(td)
    }
}

// ------------------------------------------------------------------ NormalParamExtractor

/// A map from reals to positive reals for the scale of a Normal (tensordict's `mappings`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ScaleMapping {
    /// `softplus(x + b) + min_val` with `b = ln(expm1(bias - min_val))`, so that `x = 0` maps
    /// to `bias` (tensordict's `biased_softplus_{bias}[_{min_val}]`; `min_val` defaults to
    /// 0.01).
    BiasedSoftplus {
        /// The value at 0.
        bias: f64,
        /// The infimum.
        min_val: f64,
    },
    /// `softplus(x)`.
    Softplus,
    /// `exp(x)`.
    Exp,
    /// `relu(x)` (zero for negative inputs; the lower bound then applies).
    ReLU,
}

impl Default for ScaleMapping {
    /// `BiasedSoftplus { bias: 1.0, min_val: 0.01 }` (tensordict's `"biased_softplus_1.0"`).
    fn default() -> Self {
        ScaleMapping::BiasedSoftplus {
            bias: 1.0,
            min_val: 0.01,
        }
    }
}

impl ScaleMapping {
    /// `BiasedSoftplus` with tensordict's default `min_val` (0.01).
    pub fn biased_softplus(bias: f64) -> Self {
        ScaleMapping::BiasedSoftplus {
            bias,
            min_val: 0.01,
        }
    }

    /// Applies the mapping.
    pub fn apply(&self, x: &Tensor) -> Result<Tensor> {
        Ok(match self {
            ScaleMapping::BiasedSoftplus { bias, min_val } => {
                // tensordict's inv_softplus runs in float32 (`torch.tensor(bias - min_val)`).
                let b = (*bias - *min_val) as f32;
                let shift = f64::from(b.exp_m1().max(1e-6).ln());
                x.f_add_scalar(shift)?
                    .f_softplus()?
                    .f_add_scalar(*min_val)?
            }
            ScaleMapping::Softplus => x.f_softplus()?,
            ScaleMapping::Exp => x.f_exp()?,
            ScaleMapping::ReLU => x.f_relu()?,
        })
    }
}

/// Splits the last dim of a tensor into a location and a positive scale (tensordict's
/// `NormalParamExtractor`): `loc, s = x.chunk(2, -1)`, `scale = mapping(s).clamp_min(lb)`.
///
/// As a [`TensorDictModule`] it reads `"param"` and writes `"loc"` and `"scale"` (change with
/// [`NormalParamExtractor::with_keys`]); [`NormalParamExtractor::extract`] works on tensors.
///
/// ```
/// use tch::Tensor;
/// use torchrl::modules::actors::NormalParamExtractor;
/// # fn main() -> torchrl::Result<()> {
/// let (loc, scale) = NormalParamExtractor::new().extract(&Tensor::from_slice(&[0.5f32, 0.0]))?;
/// assert_eq!(loc.double_value(&[0]), 0.5);
/// assert!((scale.double_value(&[0]) - 1.0).abs() < 1e-6); // biased softplus: 0 -> 1
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct NormalParamExtractor {
    in_key: NestedKey,
    loc_key: NestedKey,
    scale_key: NestedKey,
    mapping: ScaleMapping,
    scale_lb: f64,
}

impl Default for NormalParamExtractor {
    fn default() -> Self {
        NormalParamExtractor::new()
    }
}

impl NormalParamExtractor {
    /// tensordict's defaults: `"biased_softplus_1.0"`, `scale_lb = 1e-4`; keys `"param"` →
    /// `"loc"`, `"scale"`.
    pub fn new() -> Self {
        NormalParamExtractor {
            in_key: NestedKey::from("param"),
            loc_key: NestedKey::from("loc"),
            scale_key: NestedKey::from("scale"),
            mapping: ScaleMapping::default(),
            scale_lb: 1e-4,
        }
    }

    /// Sets the key read and the two keys written.
    pub fn with_keys(
        mut self,
        in_key: impl AsKey,
        loc_key: impl AsKey,
        scale_key: impl AsKey,
    ) -> Result<Self> {
        let op = "NormalParamExtractor::with_keys";
        let one = |k: NestedKey| -> Result<NestedKey> {
            to_keys(op, [k])?
                .pop()
                .ok_or_else(|| Error::invalid(op, "empty key"))
        };
        let (i, l, sc) = (
            one(in_key.to_nested_key())?,
            one(loc_key.to_nested_key())?,
            one(scale_key.to_nested_key())?,
        );
        if l == sc {
            return Err(Error::value(
                op,
                &l,
                "the loc and scale keys to differ",
                format!("{l} for both"),
            ));
        }
        self.in_key = i;
        self.loc_key = l;
        self.scale_key = sc;
        Ok(self)
    }

    setters! {
        /// Sets the scale mapping.
        with_scale_mapping(mapping: ScaleMapping);
        /// Sets the scale's lower bound.
        with_scale_lb(scale_lb: f64);
    }

    /// Splits `x` (`[*, 2d]`) into `loc` and `scale` (`[*, d]` each). Errors when the last dim
    /// is missing or odd.
    pub fn extract(&self, x: &Tensor) -> Result<(Tensor, Tensor)> {
        let size = x.size();
        match size.last() {
            Some(n) if n % 2 == 0 => {}
            _ => {
                return Err(Error::value(
                    "NormalParamExtractor::extract",
                    &self.in_key,
                    "an even last dim (loc and scale halves)",
                    format!("shape {}", ShapeFmt(&size)),
                ))
            }
        }
        let parts = x.f_chunk(2, -1)?;
        let [loc, s] = parts.as_slice() else {
            return Err(Error::invalid(
                "NormalParamExtractor::extract",
                format!("cannot split the input of shape {} in two", ShapeFmt(&size)),
            ));
        };
        let scale = self.mapping.apply(s)?.f_clamp_min(self.scale_lb)?;
        Ok((loc.shallow_clone(), scale))
    }
}

impl TensorDictModule for NormalParamExtractor {
    fn in_keys(&self) -> Vec<NestedKey> {
        vec![self.in_key.clone()]
    }

    fn out_keys(&self) -> Vec<NestedKey> {
        vec![self.loc_key.clone(), self.scale_key.clone()]
    }

    fn forward(&self, mut td: TensorDict) -> Result<TensorDict> {
        let op = "NormalParamExtractor::forward";
        let (loc, scale) = self.extract(read_input(op, &td, &self.in_key)?)?;
        write_outputs(op, &mut td, &self.out_keys(), vec![loc, scale])?;
        Ok(td)
    }
}

// ------------------------------------------------------------------ the actor

/// TorchRL's `_add_suffix`: `"_log_prob"` appended to the last segment.
fn log_prob_key_for(action_key: &NestedKey) -> NestedKey {
    let mut parts: Vec<String> = action_key.parts().map(str::to_string).collect();
    if let Some(last) = parts.last_mut() {
        last.push_str("_log_prob");
    }
    NestedKey::from(parts)
}

/// TorchRL's `ProbabilisticActor` (see the [module docs](self)).
pub struct ProbabilisticActor {
    module: Option<Box<dyn TensorDictModule>>,
    builder: DistributionBuilder,
    action_key: NestedKey,
    log_prob_key: Option<NestedKey>,
    return_log_prob: bool,
    exploration: ExplorationType,
    n_empirical_estimate: i64,
    gen: Mutex<Generator>,
}

impl fmt::Debug for ProbabilisticActor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "ProbabilisticActor(in_keys={}, out_keys={}, distribution={:?}, exploration={:?})",
            fmt_key_list(&self.in_keys()),
            fmt_key_list(&self.out_keys()),
            self.builder,
            self.exploration
        )
    }
}

impl ProbabilisticActor {
    /// An actor whose `module` writes the parameters that `builder` reads. Defaults (TorchRL's):
    /// action key `"action"`, no log-prob, [`ExplorationType::Deterministic`]; its generator is
    /// seeded with 0 (see [`ProbabilisticActor::with_seed`]).
    pub fn new(module: impl TensorDictModule + 'static, builder: DistributionBuilder) -> Self {
        ProbabilisticActor::build(Some(Box::new(module)), builder)
    }

    /// An actor without a parameter module: the parameters are read from the tensordict
    /// (tensordict.nn's `ProbabilisticTensorDictModule`).
    pub fn from_params(builder: DistributionBuilder) -> Self {
        ProbabilisticActor::build(None, builder)
    }

    fn build(module: Option<Box<dyn TensorDictModule>>, builder: DistributionBuilder) -> Self {
        ProbabilisticActor {
            module,
            builder,
            action_key: NestedKey::from("action"),
            log_prob_key: None,
            return_log_prob: false,
            exploration: ExplorationType::Deterministic,
            n_empirical_estimate: 1000,
            gen: Mutex::new(Generator::new(0)),
        }
    }

    /// Sets the key the action is written to. Unless set explicitly, the log-prob key follows
    /// it (`("agent", "action")` → `("agent", "action_log_prob")`).
    pub fn with_action_key(mut self, key: impl AsKey) -> Result<Self> {
        self.action_key = to_keys("ProbabilisticActor::with_action_key", [key])?
            .pop()
            .ok_or_else(|| Error::invalid("ProbabilisticActor::with_action_key", "no key"))?;
        Ok(self)
    }

    /// Sets the key the log-probability is written to (when `return_log_prob`).
    pub fn with_log_prob_key(mut self, key: impl AsKey) -> Result<Self> {
        self.log_prob_key = to_keys("ProbabilisticActor::with_log_prob_key", [key])?.pop();
        Ok(self)
    }

    setters! {
        /// Whether `forward` also writes `dist.log_prob(action)`.
        with_return_log_prob(return_log_prob: bool);
        /// Sets the exploration type used by `forward`.
        with_exploration_type(exploration: ExplorationType);
    }

    /// Sets the exploration type used by `forward`.
    pub fn set_exploration_type(&mut self, exploration: ExplorationType) {
        self.exploration = exploration;
    }

    /// Sets the number of samples of the Monte-Carlo mean ([`ExplorationType::Mean`] where the
    /// mean has no closed form). Errors when `n < 1`.
    pub fn with_n_empirical_estimate(mut self, n: i64) -> Result<Self> {
        if n < 1 {
            return Err(Error::config(
                "ProbabilisticActor::with_n_empirical_estimate",
                "n_empirical_estimate",
                ">= 1",
                n,
            ));
        }
        self.n_empirical_estimate = n;
        Ok(self)
    }

    /// Reseeds the actor's own generator (builder form).
    pub fn with_seed(self, seed: u64) -> Self {
        self.with_generator(Generator::new(seed))
    }

    /// Replaces the actor's own generator (builder form).
    pub fn with_generator(mut self, gen: Generator) -> Self {
        self.gen = Mutex::new(gen);
        self
    }

    /// Reseeds the actor's own generator.
    pub fn set_seed(&mut self, seed: u64) {
        self.gen = Mutex::new(Generator::new(seed));
    }

    /// The exploration type used by `forward`.
    pub fn exploration_type(&self) -> ExplorationType {
        self.exploration
    }

    /// The action key.
    pub fn action_key(&self) -> &NestedKey {
        &self.action_key
    }

    /// The log-prob key (explicit, or derived from the action key).
    pub fn log_prob_key(&self) -> NestedKey {
        self.log_prob_key
            .clone()
            .unwrap_or_else(|| log_prob_key_for(&self.action_key))
    }

    /// Whether `forward` writes the log-probability.
    pub fn return_log_prob(&self) -> bool {
        self.return_log_prob
    }

    /// The parameter module, if any.
    pub fn module(&self) -> Option<&dyn TensorDictModule> {
        self.module.as_deref()
    }

    /// The distribution builder.
    pub fn builder(&self) -> &DistributionBuilder {
        &self.builder
    }

    /// Runs the parameter module (if any) on `td`: the tensordict with the distribution's
    /// parameters written.
    pub fn get_dist_params(&self, td: TensorDict) -> Result<TensorDict> {
        match &self.module {
            Some(m) => m.forward(td),
            None => Ok(td),
        }
    }

    /// The distribution for `td`: the parameter module runs on a shallow copy (with
    /// gradients), then the builder reads the parameters. For losses.
    pub fn get_dist(&self, td: &TensorDict) -> Result<Box<dyn Distribution>> {
        let params = self.get_dist_params(td.clone())?;
        self.builder.build(&params)
    }

    /// `get_dist(td).log_prob(td[action_key])`: the log-probability of the actions already in
    /// `td` under the current parameters (with gradients). For losses.
    pub fn log_prob(&self, td: &TensorDict) -> Result<Tensor> {
        let dist = self.get_dist(td)?;
        dist.log_prob(read_input(
            "ProbabilisticActor::log_prob",
            td,
            &self.action_key,
        )?)
    }

    /// "ProbabilisticActor (Normal distribution from loc: float32 [5, 1], …)": where a
    /// libtorch failure in the distribution happened.
    fn dist_context(&self, td: &TensorDict) -> String {
        let params: Vec<String> = self
            .builder
            .in_keys()
            .iter()
            .map(|k| match td.get(k) {
                Some(t) => format!("{k}: {}", describe(t)),
                None => format!("{k}: missing"),
            })
            .collect();
        format!(
            "ProbabilisticActor ({} distribution from {})",
            self.builder.name,
            params.join(", ")
        )
    }

    /// The action `dist` gives under `exploration`.
    fn action(
        &self,
        dist: &dyn Distribution,
        exploration: ExplorationType,
        gen: &mut Generator,
    ) -> Result<Tensor> {
        match exploration {
            ExplorationType::Random if self.builder.rsample && dist.has_rsample() => {
                dist.rsample(gen, &[])
            }
            ExplorationType::Random => dist.sample(gen, &[]),
            ExplorationType::Deterministic => dist.deterministic_sample(),
            ExplorationType::Mode => dist.mode(),
            ExplorationType::Mean => match dist.mean() {
                Ok(m) => Ok(m),
                Err(_) if self.builder.rsample && dist.has_rsample() => Ok(dist
                    .rsample(gen, &[self.n_empirical_estimate])?
                    .f_mean_dim([0i64].as_slice(), false, None::<Kind>)?),
                Err(e) => Err(e),
            },
        }
    }

    /// `forward` with an explicit exploration type and generator (the actor's own generator
    /// is not used).
    pub fn forward_with(
        &self,
        td: TensorDict,
        exploration: ExplorationType,
        gen: &mut Generator,
    ) -> Result<TensorDict> {
        let op = "ProbabilisticActor::forward";
        let mut td = self.get_dist_params(td)?;
        let named = |e: Error| module_error(e, || self.dist_context(&td));
        let dist = self.builder.build(&td).map_err(named)?;
        let action = self
            .action(dist.as_ref(), exploration, gen)
            .map_err(named)?;
        if self.return_log_prob {
            let lp = dist.log_prob(&action).map_err(named)?;
            write_outputs(
                op,
                &mut td,
                &[self.action_key.clone(), self.log_prob_key()],
                vec![action, lp],
            )?;
        } else {
            write_outputs(
                op,
                &mut td,
                std::slice::from_ref(&self.action_key),
                vec![action],
            )?;
        }
        Ok(td)
    }
}

impl TensorDictModule for ProbabilisticActor {
    /// The module's in keys, then the builder's keys that the module does not produce.
    fn in_keys(&self) -> Vec<NestedKey> {
        let (mut keys, produced) = match &self.module {
            Some(m) => (m.in_keys(), m.out_keys()),
            None => (Vec::new(), Vec::new()),
        };
        for k in self.builder.in_keys() {
            if !produced.contains(k) && !keys.contains(k) {
                keys.push(k.clone());
            }
        }
        keys
    }

    /// The module's out keys, the action key, and the log-prob key when `return_log_prob`.
    fn out_keys(&self) -> Vec<NestedKey> {
        let mut keys = self
            .module
            .as_ref()
            .map(|m| m.out_keys())
            .unwrap_or_default();
        keys.push(self.action_key.clone());
        if self.return_log_prob {
            keys.push(self.log_prob_key());
        }
        keys
    }

    /// Computes the parameters, builds the distribution and writes the action under this
    /// thread's exploration type when one is set ([`set_exploration_type`](super::set_exploration_type),
    /// as a [`Collector`](crate::collectors::Collector) does), else the actor's own, drawing
    /// noise from the actor's own generator.
    fn forward(&self, td: TensorDict) -> Result<TensorDict> {
        let mut gen = self.gen.lock().map_err(|_| {
            Error::invalid(
                "ProbabilisticActor::forward",
                "the actor's generator lock is poisoned (a previous call panicked)",
            )
        })?;
        let exploration = super::probabilistic::exploration_type().unwrap_or(self.exploration);
        self.forward_with(td, exploration, &mut gen)
    }

    fn set_train(&mut self, train: bool) {
        if let Some(m) = &mut self.module {
            m.set_train(train);
        }
    }
}

impl ProbabilisticTensorDictModule for ProbabilisticActor {
    fn get_dist_params(&self, td: TensorDict) -> Result<TensorDict> {
        ProbabilisticActor::get_dist_params(self, td)
    }

    fn dist_keys(&self) -> Vec<NestedKey> {
        self.builder.in_keys().to_vec()
    }

    fn build_dist(&self, td: &TensorDict) -> Result<Box<dyn Distribution>> {
        self.builder.build(td)
    }

    fn action_key(&self) -> &NestedKey {
        &self.action_key
    }

    fn log_prob_key(&self) -> NestedKey {
        ProbabilisticActor::log_prob_key(self)
    }

    fn forward_with(
        &self,
        td: TensorDict,
        exploration: ExplorationType,
        gen: &mut Generator,
    ) -> Result<TensorDict> {
        ProbabilisticActor::forward_with(self, td, exploration, gen)
    }
}
