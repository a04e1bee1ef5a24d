//! [`ActorValueOperator`]: TorchRL's `ActorValueOperator`, an actor-critic whose policy head
//! and value head share a trunk (`common` → policy head, value head).
//!
//! As a [`TensorDictModule`] it runs the trunk once, then both heads on the trunk's output.
//! [`ActorValueOperator::forward_policy`] and [`ActorValueOperator::forward_value`] run the
//! trunk and one head (TorchRL's `get_policy_operator()` / `get_value_operator()`). A PPO loss
//! built with [`ClipPPOLoss::from_actor_value`](crate::objectives::ClipPPOLoss::from_actor_value)
//! runs the trunk once per forward for both its actor and its critic terms.
//!
//! ```
//! use std::sync::atomic::{AtomicUsize, Ordering};
//! use std::sync::Arc;
//! use tch::Tensor;
//! use torchrl::modules::{from_fn, ActorValueOperator, DistributionBuilder, ProbabilisticActor, TensorDictModule};
//! use torchrl::TensorDict;
//! # fn main() -> torchrl::Result<()> {
//! let calls = Arc::new(AtomicUsize::new(0));
//! let c = calls.clone();
//! // trunk: hidden = 2·obs (counting its calls)
//! let trunk = from_fn(["obs"], ["hidden"], move |x: &[&Tensor]| {
//!     c.fetch_add(1, Ordering::Relaxed);
//!     Ok(vec![x[0].f_mul_scalar(2.0)?])
//! })?;
//! let policy_net = from_fn(["hidden"], ["loc", "scale"], |x: &[&Tensor]| Ok(vec![x[0].shallow_clone(), x[0].f_ones_like()?]))?;
//! let policy = ProbabilisticActor::new(policy_net, DistributionBuilder::normal("loc", "scale")?);
//! let value = from_fn(["hidden"], ["state_value"], |x: &[&Tensor]| Ok(vec![x[0].f_add_scalar(1.0)?]))?;
//! let op = ActorValueOperator::new(trunk, policy, value);
//! assert_eq!(op.in_keys(), ["obs"]);
//!
//! let td = op.forward(TensorDict::new([2])?.with("obs", Tensor::from_slice(&[1.0f64, -1.0]))?)?;
//! assert_eq!(calls.load(Ordering::Relaxed), 1); // one trunk run for both heads
//! assert_eq!(Vec::<f64>::try_from(td.get_or_err("action")?)?, vec![2.0, -2.0]); // the mean
//! assert_eq!(Vec::<f64>::try_from(td.get_or_err("state_value")?)?, vec![3.0, -1.0]);
//! # Ok(()) }
//! ```

use std::fmt;

use super::actors::{ExplorationType, ProbabilisticActor};
use super::distributions::Distribution;
use super::module::TensorDictModule;
use super::probabilistic::ProbabilisticTensorDictModule;
use super::sequential::chain_in_keys;
use crate::error::Result;
use crate::rng::Generator;
use crate::tensordict::{fmt_key_list, NestedKey, TensorDict};

/// An actor-critic over a shared trunk (TorchRL's `ActorValueOperator`); see the
/// [module docs](self).
pub struct ActorValueOperator {
    common: Box<dyn TensorDictModule>,
    policy: ProbabilisticActor,
    value: Box<dyn TensorDictModule>,
}

impl fmt::Debug for ActorValueOperator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "ActorValueOperator(common: {} -> {}, policy: {:?}, value: {} -> {})",
            fmt_key_list(&self.common.in_keys()),
            fmt_key_list(&self.common.out_keys()),
            self.policy,
            fmt_key_list(&self.value.in_keys()),
            fmt_key_list(&self.value.out_keys())
        )
    }
}

impl ActorValueOperator {
    /// The trunk `common`, then `policy_head` (a [`ProbabilisticActor`] whose parameter module
    /// reads the trunk's output) and `value_head` (any module reading it, writing the value).
    pub fn new(
        common: impl TensorDictModule + 'static,
        policy_head: ProbabilisticActor,
        value_head: impl TensorDictModule + 'static,
    ) -> Self {
        ActorValueOperator {
            common: Box::new(common),
            policy: policy_head,
            value: Box::new(value_head),
        }
    }

    /// The shared trunk (TorchRL's `module[0]`).
    pub fn common(&self) -> &dyn TensorDictModule {
        self.common.as_ref()
    }

    /// The policy head (TorchRL's `get_policy_head()`).
    pub fn policy_head(&self) -> &ProbabilisticActor {
        &self.policy
    }

    /// The value head (TorchRL's `get_value_head()`).
    pub fn value_head(&self) -> &dyn TensorDictModule {
        self.value.as_ref()
    }

    /// The trunk, the policy head and the value head, consuming the operator.
    pub fn into_parts(
        self,
    ) -> (
        Box<dyn TensorDictModule>,
        ProbabilisticActor,
        Box<dyn TensorDictModule>,
    ) {
        (self.common, self.policy, self.value)
    }

    /// The trunk, then the policy head (TorchRL's `get_policy_operator()(td)`).
    pub fn forward_policy(&self, td: TensorDict) -> Result<TensorDict> {
        self.policy.forward(self.common.forward(td)?)
    }

    /// The trunk, then the value head (TorchRL's `get_value_operator()(td)`).
    pub fn forward_value(&self, td: TensorDict) -> Result<TensorDict> {
        self.value.forward(self.common.forward(td)?)
    }

    /// A rollout policy: [`forward_policy`](Self::forward_policy) under `no_grad` (the value
    /// head does not run).
    pub fn as_policy_operator(&self) -> impl FnMut(TensorDict) -> Result<TensorDict> + '_ {
        move |td| {
            let _guard = tch::no_grad_guard();
            self.forward_policy(td)
        }
    }
}

impl TensorDictModule for ActorValueOperator {
    /// The trunk's in keys, then the heads' in keys the trunk does not write.
    fn in_keys(&self) -> Vec<NestedKey> {
        chain_in_keys([
            self.common.as_ref(),
            &self.policy as &dyn TensorDictModule,
            self.value.as_ref(),
        ])
    }

    /// The trunk's, the policy head's and the value head's out keys.
    fn out_keys(&self) -> Vec<NestedKey> {
        let mut keys = self.common.out_keys();
        keys.extend(self.policy.out_keys());
        keys.extend(self.value.out_keys());
        keys
    }

    /// The trunk once, then the policy head and the value head on its output.
    fn forward(&self, td: TensorDict) -> Result<TensorDict> {
        let td = self.common.forward(td)?;
        let td = self.policy.forward(td)?;
        self.value.forward(td)
    }

    fn set_train(&mut self, train: bool) {
        self.common.set_train(train);
        self.policy.set_train(train);
        self.value.set_train(train);
    }
}

/// The policy side: the trunk, then the policy head.
impl ProbabilisticTensorDictModule for ActorValueOperator {
    fn get_dist_params(&self, td: TensorDict) -> Result<TensorDict> {
        self.policy.get_dist_params(self.common.forward(td)?)
    }

    fn dist_keys(&self) -> Vec<NestedKey> {
        ProbabilisticTensorDictModule::dist_keys(&self.policy)
    }

    fn build_dist(&self, td: &TensorDict) -> Result<Box<dyn Distribution>> {
        ProbabilisticTensorDictModule::build_dist(&self.policy, td)
    }

    fn action_key(&self) -> &NestedKey {
        self.policy.action_key()
    }

    fn log_prob_key(&self) -> NestedKey {
        self.policy.log_prob_key()
    }

    fn forward_with(
        &self,
        td: TensorDict,
        exploration: ExplorationType,
        gen: &mut Generator,
    ) -> Result<TensorDict> {
        self.policy
            .forward_with(self.common.forward(td)?, exploration, gen)
    }
}
