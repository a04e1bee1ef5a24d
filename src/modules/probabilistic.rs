//! [`ProbabilisticTensorDictModule`]: tensordict.nn's `ProbabilisticTensorDictModule`, a
//! [`TensorDictModule`] that produces distribution parameters, builds a distribution from them,
//! and samples from it, scores actions (log-probabilities) and gives its entropy.
//!
//! It is the one trait through which losses ([`ClipPPOLoss`](crate::objectives::ClipPPOLoss),
//! [`KLPENPPOLoss`](crate::objectives::KLPENPPOLoss)) and transforms
//! ([`KLRewardTransform`](crate::envs::transforms::KLRewardTransform)) use a policy. It is
//! object safe (`Box<dyn ProbabilisticTensorDictModule>`). [`ProbabilisticActor`](super::ProbabilisticActor) implements
//! it; [`ActorValueOperator`](super::ActorValueOperator) pairs one with a value head over a
//! shared trunk.
//!
//! ```
//! use tch::Tensor;
//! use torchrl::modules::{from_fn, DistributionBuilder, ProbabilisticActor, ProbabilisticTensorDictModule};
//! use torchrl::TensorDict;
//! # fn main() -> torchrl::Result<()> {
//! // loc = obs, scale = 1
//! let net = from_fn(["obs"], ["loc", "scale"], |x: &[&Tensor]| Ok(vec![x[0].shallow_clone(), x[0].f_ones_like()?]))?;
//! let actor = ProbabilisticActor::new(net, DistributionBuilder::normal("loc", "scale")?);
//! let policy: &dyn ProbabilisticTensorDictModule = &actor;
//! assert_eq!(policy.dist_keys(), ["loc", "scale"]);
//! let td = TensorDict::new([2])?
//!     .with("obs", Tensor::from_slice(&[0.0f64, 1.0]))?
//!     .with("action", Tensor::from_slice(&[0.0f64, 1.0]))?;
//! // the actions sit at the means: log N(0; 0, 1) = -½ ln 2π
//! let lp = policy.log_prob(&td)?;
//! assert!((lp.double_value(&[1]) + 0.5 * (2.0 * std::f64::consts::PI).ln()).abs() < 1e-12);
//! let h = policy.entropy(&td)?; // ½ ln(2πe)
//! assert!((h.double_value(&[0]) - 0.5 * (2.0 * std::f64::consts::PI * std::f64::consts::E).ln()).abs() < 1e-12);
//! # Ok(()) }
//! ```

use tch::Tensor;

use super::distributions::Distribution;
use super::module::{read_input, TensorDictModule};
use crate::error::Result;
use crate::rng::Generator;
use crate::tensordict::{NestedKey, TensorDict};

/// How an actor turns a distribution into an action (TorchRL's `ExplorationType` /
/// `InteractionType`); see the [actor docs](super::actors).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ExplorationType {
    /// A (reparameterised when possible) sample.
    Random,
    /// `deterministic_sample()` (TorchRL's default for a `ProbabilisticActor`).
    #[default]
    Deterministic,
    /// `mode()`.
    Mode,
    /// `mean()`, or a Monte-Carlo mean where it has no closed form.
    Mean,
}

thread_local! {
    /// The exploration type set by [`set_exploration_type`] on this thread (TorchRL's global
    /// `_INTERACTION_TYPE`); `None` outside any.
    static EXPLORATION: std::cell::Cell<Option<ExplorationType>> = const { std::cell::Cell::new(None) };
}

/// The exploration type set on this thread by [`set_exploration_type`] or an
/// [`ExplorationGuard`] (TorchRL's `exploration_type()`); `None` when none is set, and actors
/// then use their own ([`ProbabilisticActor::with_exploration_type`](super::ProbabilisticActor::with_exploration_type),
/// TorchRL's `default_interaction_type`).
pub fn exploration_type() -> Option<ExplorationType> {
    EXPLORATION.with(|c| c.get())
}

/// Runs `f` with `exploration` as this thread's exploration type (TorchRL's
/// `with set_exploration_type(...)`): inside it, every actor's `forward` acts under
/// `exploration` instead of its own type. The previous type is restored afterwards. The
/// [`Collector`](crate::collectors::Collector) runs its policy inside one (`Random` by default).
///
/// ```
/// use torchrl::modules::{exploration_type, set_exploration_type, ExplorationType};
/// assert_eq!(exploration_type(), None);
/// let inside = set_exploration_type(ExplorationType::Random, exploration_type);
/// assert_eq!(inside, Some(ExplorationType::Random));
/// assert_eq!(exploration_type(), None);
/// ```
pub fn set_exploration_type<R>(exploration: ExplorationType, f: impl FnOnce() -> R) -> R {
    let _guard = ExplorationGuard::new(exploration);
    f()
}

/// Sets this thread's exploration type until dropped (the RAII form of
/// [`set_exploration_type`]; bind it to `_guard`, not `_`). Restores the previous type on drop.
#[derive(Debug)]
#[must_use = "the exploration type is reset when the guard is dropped"]
pub struct ExplorationGuard {
    previous: Option<ExplorationType>,
}

impl ExplorationGuard {
    /// Sets `exploration` as this thread's exploration type.
    pub fn new(exploration: ExplorationType) -> Self {
        let previous = EXPLORATION.with(|c| c.replace(Some(exploration)));
        ExplorationGuard { previous }
    }
}

impl Drop for ExplorationGuard {
    fn drop(&mut self) {
        let previous = self.previous;
        EXPLORATION.with(|c| c.set(previous));
    }
}

/// A [`TensorDictModule`] that builds a distribution (tensordict.nn's
/// `ProbabilisticTensorDictModule`, with the parameter module in front as in TorchRL's
/// `ProbabilisticActor`); see the [module docs](self).
///
/// Required: [`get_dist_params`](Self::get_dist_params) (run the parameter module),
/// [`dist_keys`](Self::dist_keys) and [`build_dist`](Self::build_dist) (the distribution from
/// parameters already in a tensordict), the action and log-prob keys, and
/// [`forward_with`](Self::forward_with) (an action under an exploration type). The rest is
/// provided.
pub trait ProbabilisticTensorDictModule: TensorDictModule {
    /// Runs the parameter module (if any) on `td`: the tensordict with the distribution's
    /// parameters written.
    fn get_dist_params(&self, td: TensorDict) -> Result<TensorDict>;

    /// The keys the distribution reads (its parameters, e.g. `loc` and `scale`).
    fn dist_keys(&self) -> Vec<NestedKey>;

    /// The distribution of the parameters already in `td` (TorchRL's
    /// `build_dist_from_params`).
    fn build_dist(&self, td: &TensorDict) -> Result<Box<dyn Distribution>>;

    /// The key the action is read from and written to.
    fn action_key(&self) -> &NestedKey;

    /// The key the log-probability is written to.
    fn log_prob_key(&self) -> NestedKey;

    /// Computes the parameters, builds the distribution, and writes an action under
    /// `exploration` with noise from `gen` (and, when the module is configured to, its
    /// log-probability).
    fn forward_with(
        &self,
        td: TensorDict,
        exploration: ExplorationType,
        gen: &mut Generator,
    ) -> Result<TensorDict>;

    /// The distribution for `td`: the parameter module runs on a shallow copy (with
    /// gradients), then [`build_dist`](Self::build_dist). For losses.
    fn get_dist(&self, td: &TensorDict) -> Result<Box<dyn Distribution>> {
        let params = self.get_dist_params(td.clone())?;
        self.build_dist(&params)
    }

    /// The log-probability of the actions already in `td` (under
    /// [`action_key`](Self::action_key)) with the current parameters, with gradients.
    fn log_prob(&self, td: &TensorDict) -> Result<Tensor> {
        let dist = self.get_dist(td)?;
        dist.log_prob(read_input("log_prob", td, self.action_key())?)
    }

    /// The entropy of the distribution for `td` (an error where it has no closed form).
    fn entropy(&self, td: &TensorDict) -> Result<Tensor> {
        self.get_dist(td)?.entropy()
    }
}
