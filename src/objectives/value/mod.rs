//! Value estimators: [`GAE`] (generalized advantage estimation), [`TDLambdaEstimator`]
//! (TD(λ) value targets), [`TD0Estimator`] (one-step targets) and [`TD1Estimator`] (returns), behind the [`ValueEstimator`] trait, plus their
//! [`functional`] forms (TorchRL's `torchrl.objectives.value`).
//!
//! An estimator reads a `[*B, T]` tensordict laid out as a collector or a batched env's
//! [`EnvBase::rollout`] produces it (time is the last batch dim unless set otherwise), and
//! writes `advantage` and `value_target` into it.
//!
//! **The time dim must be explicit** (except for [`TD0Estimator`], which reads none). TorchRL takes the last batch dim (or the dim named
//! `"time"`) as time, so a flat minibatch of 80 transitions runs as one 80-step trajectory.
//! Here a tensordict needs at least two batch dims (`[*B, T]`, time last), or, for a single
//! trajectory with batch size `[T]` (an unbatched env's rollout), the time dim set explicitly
//! with `with_time_dim(0)` (or `-1`); a one-dim batch without it is an error that says so. A
//! tensordict without batch dims is refused either way.
//!
//!
//! | read | from |
//! |---|---|
//! | `V(s_t)`, `V(s_{t+1})` | the [`ValueNetwork`] run on `td` and on `td["next"]` (the results are also written under `value` and `("next", value)`), or, without a network, precomputed `value` and `("next", value)` entries |
//! | reward, done, terminated | `("next", reward)`, `("next", done)`, `("next", terminated)` (terminated defaults to done) |
//! | `steps_to_next_obs` (optional) | the root; when present the discount is `γ^steps` |
//!
//! A step that is done but not terminated (a truncation) bootstraps from the next state's value;
//! a terminated step does not. Key names are settable ([`ValueEstimator::set_keys`]) with
//! TorchRL's estimator rules: an unknown name and a `None` value are both errors.
//!
//! The estimate runs under `no_grad` unless the estimator is made `differentiable`, and the
//! next-state value from a network is always detached (TorchRL's defaults).
//!
//! [`EnvBase::rollout`]: crate::EnvBase::rollout
//!
//! ```
//! use tch::{Kind, Tensor};
//! use torchrl::objectives::value::{GAE, ValueEstimator};
//! use torchrl::TensorDict;
//! # fn main() -> torchrl::Result<()> {
//! let f = (Kind::Float, tch::Device::Cpu);
//! // one trajectory of 3 steps; the episode terminates at the last step
//! let mut td = TensorDict::new([1, 3])?
//!     .with("state_value", Tensor::from_slice(&[1.0f32, 2.0, 3.0]).view([1, 3, 1]))?
//!     .with(("next", "state_value"), Tensor::from_slice(&[2.0f32, 3.0, 4.0]).view([1, 3, 1]))?
//!     .with(("next", "reward"), Tensor::ones([1, 3, 1], f))?
//!     .with(("next", "done"), Tensor::from_slice(&[false, false, true]).view([1, 3, 1]))?;
//! let gae = GAE::new(0.9, 0.8)?;
//! gae.forward(&mut td)?;
//! let adv = td.get_or_err("advantage")?;
//! assert!((adv.double_value(&[0, 0, 0]) - 1.9872).abs() < 1e-5);
//! assert!((adv.double_value(&[0, 2, 0]) + 2.0).abs() < 1e-6);
//! assert!(td.contains("value_target"));
//! # Ok(()) }
//! ```

pub mod functional;
mod gae;
mod td0;
mod td1;
mod td_lambda;

use std::fmt;

use tch::Tensor;

use crate::error::{Error, Result, ShapeFmt};
use crate::modules::module::{pick_out_key, read_input};
use crate::modules::TensorDictModule;
use crate::tensordict::{fmt_key_list, AsKey, NestedKey, TensorDict};

use super::keys::{set_estimator_keys, AcceptedKeys};
use functional::{check_same_shape, resolve_dim, Gamma};

#[allow(deprecated)]
pub use gae::Gae;
pub use gae::GAE;
pub use td0::TD0Estimator;
pub use td1::TD1Estimator;
pub use td_lambda::TDLambdaEstimator;
#[allow(deprecated)]
pub use td_lambda::TdLambdaEstimator;

crate::accepted_keys! {
    /// The keys of a value estimator (TorchRL's `ValueEstimatorBase._AcceptedKeys`).
    pub struct ValueEstimatorKeys {
        /// Where the advantage is written. Defaults to `"advantage"`.
        advantage: "advantage",
        /// Where the value target (the return the critic regresses to) is written. Defaults
        /// to `"value_target"`.
        value_target: "value_target",
        /// Where the state value is read (or written, with a value network); the next state's
        /// value is under `("next", value)`. Defaults to `"state_value"`.
        value: "state_value",
        /// The reward, read under `"next"`. Defaults to `"reward"`.
        reward: "reward",
        /// The done flag (end of a trajectory, truncation included), read under `"next"`.
        /// Defaults to `"done"`.
        done: "done",
        /// The terminated flag (end of the episode, no bootstrap), read under `"next"`; when
        /// absent, `done` is used. Defaults to `"terminated"`.
        terminated: "terminated",
        /// The number of env steps to the next observation (multi-step returns), read at the
        /// root when present: the discount becomes `γ^steps`. Defaults to
        /// `"steps_to_next_obs"`.
        steps_to_next_obs: "steps_to_next_obs",
        /// The sampled action's log-probability. Not read by GAE or TD(λ); accepted so that
        /// key sets match TorchRL's (whose default, with `composite_lp_aggregate()` off, is
        /// `"action_log_prob"`).
        sample_log_prob: "action_log_prob",
    }
}

/// A value estimator: computes advantages and value targets over the time dim of a
/// tensordict, with settable keys (TorchRL's `ValueEstimatorBase`).
pub trait ValueEstimator {
    /// The estimator's name, used in error messages (`"GAE"`).
    fn name(&self) -> &'static str;

    /// The current keys.
    fn tensor_keys(&self) -> &ValueEstimatorKeys;

    /// Replaces every key at once.
    fn set_tensor_keys(&mut self, keys: ValueEstimatorKeys) -> Result<()>;

    /// Whether `name` is one of this estimator's keys (what a loss may forward to it).
    fn accepts_key(&self, name: &str) -> bool {
        ValueEstimatorKeys::NAMES.contains(&name)
    }

    /// Sets keys by name with TorchRL's estimator rules (see
    /// [`set_estimator_keys`]): an unknown name and a
    /// `None` value are errors. On error nothing changes.
    fn set_keys(&mut self, pairs: &[(&str, Option<NestedKey>)]) -> Result<()> {
        let mut keys = self.tensor_keys().clone();
        set_estimator_keys(&mut keys, pairs, self.name())?;
        self.set_tensor_keys(keys)
    }

    /// The entries [`forward`](ValueEstimator::forward) reads.
    fn in_keys(&self) -> Vec<NestedKey>;

    /// The entries [`forward`](ValueEstimator::forward) writes: `[advantage, value_target]`.
    fn out_keys(&self) -> Vec<NestedKey> {
        let k = self.tensor_keys();
        vec![k.advantage.clone(), k.value_target.clone()]
    }

    /// Computes the estimate and writes `advantage` and `value_target` into `td` (and, with a
    /// value network, `value` and `("next", value)`). On error `td` is unchanged.
    fn forward(&self, td: &mut TensorDict) -> Result<()>;

    /// The value target alone (nothing is written).
    fn value_estimate(&self, td: &TensorDict) -> Result<Tensor>;
}

/// The key names a loss forwards to its value estimator (TorchRL's
/// `_value_estimator_default_keys`).
pub const VALUE_ESTIMATOR_KEYS: [&str; 6] = [
    "advantage",
    "value_target",
    "value",
    "reward",
    "done",
    "terminated",
];

/// Forwards a loss's estimator-related keys to its value estimator (TorchRL's
/// `_forward_value_estimator_keys`).
///
/// Only names in [`VALUE_ESTIMATOR_KEYS`] that the loss's keys define *and* the estimator
/// accepts are forwarded (TorchRL issue #4371: forwarding a name the estimator does not accept
/// broke `set_keys`). The loss's current values are sent, so a key the loss just reset to its
/// default reaches the estimator as that default.
pub fn forward_value_estimator_keys<K: AcceptedKeys>(
    keys: &K,
    estimator: &mut dyn ValueEstimator,
) -> Result<()> {
    let pairs: Vec<(&str, Option<NestedKey>)> = VALUE_ESTIMATOR_KEYS
        .iter()
        .filter(|name| estimator.accepts_key(name))
        .filter_map(|name| keys.key(name).map(|k| (*name, Some(k.clone()))))
        .collect();
    if pairs.is_empty() {
        return Ok(());
    }
    estimator.set_keys(&pairs)
}

/// A closure as a state-value [`TensorDictModule`]: a function from a `[*B, T]` tensordict to
/// the values `[*B, T, *F]` (usually `[*B, T, 1]`), with the keys it reads, written under its
/// out key (default `"state_value"`). The closure → module bridge for value estimators; any
/// other [`TensorDictModule`] (a [`ValueOperator`](crate::modules::ValueOperator), a
/// [`TdModule`](crate::modules::TdModule)) works as well.
///
/// An estimator runs it twice per estimate, on the tensordict and on its `"next"`
/// sub-tensordict, and reads the value under its own `value` key when the network declares
/// that key, else under the network's only out key.
///
/// ```
/// use torchrl::modules::TensorDictModule;
/// use torchrl::objectives::value::ValueNetwork;
/// use torchrl::TensorDict;
/// use tch::Tensor;
/// // V(s) = the sum of the observation's features
/// let net = ValueNetwork::new(["observation"], |td: &TensorDict| {
///     Ok(td.get_or_err("observation")?.f_sum_dim_intlist(-1, true, None::<tch::Kind>)?)
/// });
/// assert_eq!(net.in_keys(), &[torchrl::NestedKey::from("observation")]);
/// let td = TensorDict::new([2])?.with("observation", Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0]).view([2, 2]))?;
/// let td = net.forward(td)?;
/// assert_eq!(Vec::<f32>::try_from(td.get_or_err("state_value")?.view([-1]))?, vec![3.0, 7.0]);
/// # Ok::<(), torchrl::Error>(())
/// ```
pub struct ValueNetwork {
    in_keys: Vec<NestedKey>,
    out_key: NestedKey,
    f: Box<ValueFn>,
}

/// The function inside a [`ValueNetwork`].
type ValueFn = dyn Fn(&TensorDict) -> Result<Tensor> + Send;

impl ValueNetwork {
    /// A value network that runs `f`, reads `in_keys` and writes `"state_value"`.
    pub fn new<K, F>(in_keys: impl IntoIterator<Item = K>, f: F) -> Self
    where
        K: Into<NestedKey>,
        F: Fn(&TensorDict) -> Result<Tensor> + Send + 'static,
    {
        ValueNetwork {
            in_keys: in_keys.into_iter().map(Into::into).collect(),
            out_key: NestedKey::from("state_value"),
            f: Box::new(f),
        }
    }

    /// Sets the key the value is written under (default `"state_value"`).
    pub fn with_out_key(mut self, key: impl Into<NestedKey>) -> Self {
        self.out_key = key.into();
        self
    }

    /// The keys the network reads.
    pub fn in_keys(&self) -> &[NestedKey] {
        &self.in_keys
    }

    /// Runs the network on `td` and returns the value (nothing is written).
    pub fn call(&self, td: &TensorDict) -> Result<Tensor> {
        (self.f)(td)
    }
}

impl TensorDictModule for ValueNetwork {
    fn in_keys(&self) -> Vec<NestedKey> {
        self.in_keys.clone()
    }

    fn out_keys(&self) -> Vec<NestedKey> {
        vec![self.out_key.clone()]
    }

    fn forward(&self, mut td: TensorDict) -> Result<TensorDict> {
        let value = (self.f)(&td)?;
        td.set(&self.out_key, value)?;
        Ok(td)
    }
}

impl fmt::Debug for ValueNetwork {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ValueNetwork")
            .field("in_keys", &self.in_keys)
            .field("out_key", &self.out_key)
            .finish_non_exhaustive()
    }
}

/// What GAE and TD(λ) share: hyper-parameters, keys, the optional value network, and the
/// reading of a tensordict into time-last tensors.
pub(crate) struct EstimatorCore {
    pub(crate) name: &'static str,
    pub(crate) gamma: f64,
    pub(crate) lmbda: f64,
    pub(crate) keys: ValueEstimatorKeys,
    pub(crate) value_network: Option<Box<dyn TensorDictModule>>,
    pub(crate) differentiable: bool,
    pub(crate) time_dim: Option<i64>,
    /// Whether the estimate runs along a time dim (false for TD(0)).
    pub(crate) needs_time: bool,
}

impl fmt::Debug for EstimatorCore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct(self.name)
            .field("gamma", &self.gamma)
            .field("lmbda", &self.lmbda)
            .field("keys", &self.keys)
            .field(
                "value_network",
                &self
                    .value_network
                    .as_ref()
                    .map(|n| fmt_key_list(&n.in_keys())),
            )
            .field("differentiable", &self.differentiable)
            .field("time_dim", &self.time_dim)
            .finish()
    }
}

/// An estimate, time dims in place, plus the value entries to write back.
pub(crate) struct Estimate {
    pub(crate) advantage: Tensor,
    pub(crate) value_target: Tensor,
    /// `(value, V(s_t))` and `(("next", value), V(s_{t+1}))` when a network produced them.
    pub(crate) writes: Vec<(NestedKey, Tensor)>,
}

impl Estimate {
    /// Writes the value entries, `advantage` and `value_target` into `td`, all at once.
    pub(crate) fn write_into(self, td: &mut TensorDict, keys: &ValueEstimatorKeys) -> Result<()> {
        let mut staged = td.clone();
        for (k, v) in self.writes {
            staged.set(&k, v)?;
        }
        staged.set(&keys.advantage, self.advantage)?;
        staged.set(&keys.value_target, self.value_target)?;
        *td = staged;
        Ok(())
    }
}

/// The inputs of an estimate, with the time dim moved last.
pub(crate) struct Inputs {
    /// `V(s_t)` as given (time not moved), to write back.
    pub(crate) value_raw: Tensor,
    /// `V(s_{t+1})` as given (time not moved), to write back.
    pub(crate) next_value_raw: Tensor,
    pub(crate) value: Tensor,
    pub(crate) next_value: Tensor,
    pub(crate) reward: Tensor,
    pub(crate) done: Tensor,
    pub(crate) terminated: Tensor,
    /// `γ^steps_to_next_obs`, time last, when that entry is present.
    pub(crate) gamma_steps: Option<Tensor>,
    /// The time dim in the tensors' dims.
    pub(crate) time_dim: i64,
}

impl Inputs {
    pub(crate) fn gamma(&self, gamma: f64) -> Gamma<'_> {
        match &self.gamma_steps {
            Some(g) => Gamma::PerStep(g),
            None => Gamma::Scalar(gamma),
        }
    }

    /// Moves the time dim of an output back in place.
    pub(crate) fn restore(&self, t: &Tensor) -> Result<Tensor> {
        Ok(t.f_movedim_int(-1, self.time_dim)?.f_contiguous()?)
    }
}

impl EstimatorCore {
    pub(crate) fn new(name: &'static str, gamma: f64, lmbda: f64) -> Result<Self> {
        if !gamma.is_finite() {
            return Err(Error::config(name, "gamma", "finite", gamma));
        }
        if !lmbda.is_finite() {
            return Err(Error::config(name, "lmbda", "finite", lmbda));
        }
        Ok(EstimatorCore {
            name,
            gamma,
            lmbda,
            keys: ValueEstimatorKeys::default(),
            value_network: None,
            differentiable: false,
            time_dim: None,
            needs_time: true,
        })
    }

    /// TorchRL's estimator `in_keys`: the network's keys at the root, the next reward, done
    /// and terminated, and the network's keys under `"next"`. Without a network, the
    /// precomputed value entries stand in for the network's keys.
    pub(crate) fn in_keys(&self) -> Vec<NestedKey> {
        let net_keys: Vec<NestedKey> = match &self.value_network {
            Some(net) => net.in_keys(),
            None => vec![self.keys.value.clone()],
        };
        let mut keys = net_keys.clone();
        for k in [&self.keys.reward, &self.keys.done, &self.keys.terminated] {
            keys.push(k.prefixed("next"));
        }
        keys.extend(net_keys.iter().map(|k| k.prefixed("next")));
        keys
    }

    /// The index of the time dim among `td`'s batch dims (and the leaves' dims).
    fn time_dim(&self, td: &TensorDict) -> Result<i64> {
        let nb = td.batch_dims();
        if nb == 0 {
            return Err(Error::argument(
                self.name,
                "td",
                "a tensordict with at least one batch dim (time)",
                "a tensordict of batch size []",
            ));
        }
        let nb_i = i64::try_from(nb).unwrap_or(i64::MAX);
        match self.time_dim {
            None if nb == 1 => Err(Error::argument(
                self.name,
                "td",
                format!(
                    "a [*B, T] tensordict (at least two batch dims, time last), or one \
                     trajectory with its time dim named (with_time_dim(0)): a flat batch of {n} \
                     may be {n} transitions (a minibatch) rather than one {n}-step trajectory. \
                     Compute the advantage on the collected [*B, T] batch before sampling \
                     minibatches (PpoLoss::compute_advantage), or unsqueeze a batch dim",
                    n = td.batch_size().first().copied().unwrap_or(0)
                ),
                format!("a tensordict of batch size {}", ShapeFmt(td.batch_size())),
            )),
            None => Ok(nb_i - 1),
            Some(d) => {
                let r = if d < 0 { d + nb_i } else { d };
                if r < 0 || r >= nb_i {
                    return Err(Error::IndexOutOfRange {
                        op: self.name,
                        index: d,
                        what: "the tensordict's batch dims (time_dim)".into(),
                        size: nb_i,
                    });
                }
                Ok(r)
            }
        }
    }

    fn leaf<'a>(&self, td: &'a TensorDict, key: impl AsKey) -> Result<&'a Tensor> {
        let segs = key.segments();
        td.get(&segs[..])
            .ok_or_else(|| td.lookup_error(self.name, &segs))
    }

    /// `(V(s_t), V(s_{t+1}))`: from the network (next detached) or precomputed entries.
    /// With `need_value == false` (a value estimate: only the target is wanted), `V(s_t)` is
    /// not read (zeros stand in for it).
    fn values(&self, td: &TensorDict, need_value: bool) -> Result<(Tensor, Tensor)> {
        match &self.value_network {
            Some(net) => {
                let next = td.get_dict("next").ok_or_else(|| Error::KeyNotFound {
                    op: self.name,
                    key: "\"next\" (the value network needs the \"next\" sub-tensordict)"
                        .to_string(),
                    available: available_keys(td),
                })?;
                let next_value = self.network_value(net.as_ref(), next)?.f_detach()?;
                let value = if need_value {
                    self.network_value(net.as_ref(), td)?
                } else {
                    next_value.f_zeros_like()?
                };
                Ok((value, next_value))
            }
            None if !need_value => {
                let next_key = self.keys.value.prefixed("next");
                let next_value = td.get(&next_key).ok_or_else(|| Error::KeyNotFound {
                    op: self.name,
                    key: format!("{next_key} (no value network was provided)"),
                    available: available_keys(td),
                })?;
                Ok((next_value.f_zeros_like()?, next_value.shallow_clone()))
            }
            None => {
                let value = td.get(&self.keys.value).ok_or_else(|| Error::KeyNotFound {
                    op: self.name,
                    key: format!("{} (no value network was provided)", self.keys.value),
                    available: available_keys(td),
                })?;
                let next_key = self.keys.value.prefixed("next");
                let next_value = td.get(&next_key).ok_or_else(|| Error::KeyNotFound {
                    op: self.name,
                    key: format!("{next_key} (no value network was provided)"),
                    available: available_keys(td),
                })?;
                Ok((value.shallow_clone(), next_value.shallow_clone()))
            }
        }
    }

    /// Runs the value network on a shallow copy of `td` and reads its value: under the
    /// estimator's `value` key when the network declares it, else under its only out key.
    fn network_value(&self, net: &dyn TensorDictModule, td: &TensorDict) -> Result<Tensor> {
        let out_keys = net.out_keys();
        let key = pick_out_key(&out_keys, &[&self.keys.value]).ok_or_else(|| {
            Error::value(
                self.name,
                &self.keys.value,
                "the value network to declare this key among its out keys, or exactly one out key",
                format!("out keys {}", fmt_key_list(&out_keys)),
            )
        })?;
        let out = net.forward(td.clone())?;
        Ok(read_input(self.name, &out, &key)?.shallow_clone())
    }

    /// The start of every estimate: the no-grad guard (unless differentiable) and the inputs.
    /// `need_value == false` for a value estimate (the target alone: `V(s_t)` is not read).
    pub(crate) fn start(
        &self,
        td: &TensorDict,
        need_value: bool,
    ) -> Result<(Option<tch::NoGradGuard>, Inputs)> {
        let guard = (!self.differentiable).then(tch::no_grad_guard);
        Ok((guard, self.inputs(td, need_value)?))
    }

    /// Reads everything an estimate needs, checks shapes, and moves time last.
    pub(crate) fn inputs(&self, td: &TensorDict, need_value: bool) -> Result<Inputs> {
        // TD(0) has no time dim: its estimate is per transition, any batch shape.
        let tdim = if self.needs_time {
            self.time_dim(td)?
        } else if td.batch_dims() == 0 {
            return Err(Error::argument(
                self.name,
                "td",
                "a tensordict with at least one batch dim",
                "a tensordict of batch size []",
            ));
        } else {
            0
        };
        let (value, next_value) = self.values(td, need_value)?;
        let reward = self.leaf(td, self.keys.reward.prefixed("next"))?;
        let done = self.leaf(td, self.keys.done.prefixed("next"))?;
        let terminated = td
            .get(self.keys.terminated.prefixed("next"))
            .unwrap_or(done);
        let shape = check_same_shape(
            self.name,
            &[
                ("value", &value),
                ("next value", &next_value),
                ("reward", reward),
                ("done", done),
                ("terminated", terminated),
            ],
        )?;
        let time_dim = resolve_dim(self.name, tdim, shape.len())?;
        let last = |t: &Tensor| -> Result<Tensor> { Ok(t.f_movedim_int(time_dim, -1)?) };
        let gamma_steps = match td.get(&self.keys.steps_to_next_obs) {
            Some(steps) => {
                let steps = steps.f_view_as(reward).map_err(|e| {
                    Error::value(
                        self.name,
                        &self.keys.steps_to_next_obs,
                        format!(
                            "as many elements as the reward (shape {})",
                            ShapeFmt(&reward.size())
                        ),
                        format!("shape {} ({e})", ShapeFmt(&steps.size())),
                    )
                })?;
                let g = Tensor::f_pow_scalar(self.gamma, &steps)?.f_to_kind(value.kind())?;
                Some(last(&g)?)
            }
            None => None,
        };
        Ok(Inputs {
            value: last(&value)?,
            next_value: last(&next_value)?,
            reward: last(reward)?,
            done: last(done)?,
            terminated: last(terminated)?,
            value_raw: value,
            next_value_raw: next_value,
            gamma_steps,
            time_dim,
        })
    }

    /// The value entries to write back (only when a network produced them).
    pub(crate) fn value_writes(&self, inputs: &Inputs) -> Vec<(NestedKey, Tensor)> {
        if self.value_network.is_none() {
            return Vec::new();
        }
        vec![
            (self.keys.value.clone(), inputs.value_raw.shallow_clone()),
            (
                self.keys.value.prefixed("next"),
                inputs.next_value_raw.shallow_clone(),
            ),
        ]
    }
}

fn available_keys(td: &TensorDict) -> Vec<String> {
    td.keys(crate::tensordict::KeysOptions::nested_leaves())
        .iter()
        .map(ToString::to_string)
        .collect()
}

/// The constructor, builder methods, getters and [`ValueEstimator`] impl GAE and TD(λ) share:
/// `estimator_builders!(Type, "Name", with_flag => flag)` for a
/// `Type { core: EstimatorCore, flag: bool }` (the standardisation flag, off by default, its
/// setter and getter); each type documents the flag and provides `estimate`.
macro_rules! estimator_builders {
    ($ty:ident, $name:literal, $setter:ident => $flag:ident) => {
        impl $ty {
            #[doc = concat!($name, " with discount `gamma` and trace decay `lmbda`, no value network")]
            /// (precomputed values are read), no standardisation, not differentiable.
            ///
            /// Errors when `gamma` or `lmbda` is not finite.
            pub fn new(gamma: f64, lmbda: f64) -> $crate::error::Result<Self> {
                Ok($ty {
                    core: $crate::objectives::value::EstimatorCore::new($name, gamma, lmbda)?,
                    $flag: false,
                })
            }

            /// The trace decay λ.
            pub fn lmbda(&self) -> f64 {
                self.core.lmbda
            }
        }
        $crate::objectives::value::estimator_builders!(@common $ty, $name, $setter => $flag);
    };
    ($ty:ident, $name:literal, $setter:ident => $flag:ident, gamma_only, needs_time = $nt:expr) => {
        impl $ty {
            #[doc = concat!($name, " with discount `gamma`, no value network")]
            /// (precomputed values are read), no standardisation, not differentiable.
            ///
            /// Errors when `gamma` is not finite.
            pub fn new(gamma: f64) -> $crate::error::Result<Self> {
                let mut core = $crate::objectives::value::EstimatorCore::new($name, gamma, 1.0)?;
                core.needs_time = $nt;
                Ok($ty { core, $flag: false })
            }
        }
        $crate::objectives::value::estimator_builders!(@common $ty, $name, $setter => $flag);
    };
    (@common $ty:ident, $name:literal, $setter:ident => $flag:ident) => {
        impl $ty {
            $crate::macros::setters! {
                #[doc = concat!("Sets TorchRL's `", stringify!($flag), "` (default `false`; see the type's docs).")]
                $setter($flag: bool);
            }

            #[doc = concat!("Whether `", stringify!($flag), "` standardisation is on.")]
            pub fn $flag(&self) -> bool {
                self.$flag
            }

            /// Sets the state-value network, called on the tensordict and on its `"next"`
            /// sub-tensordict; without one, precomputed `value` and `("next", value)` entries
            /// are read.
            pub fn with_value_network(
                mut self,
                network: impl $crate::modules::TensorDictModule + 'static,
            ) -> Self {
                self.core.value_network = Some(Box::new(network));
                self
            }

            $crate::macros::setters! {
                /// Whether gradients flow through the estimate (default `false`: it runs under
                /// `no_grad`). The next-state value from a network is detached either way.
                with_differentiable(differentiable: bool) => core.differentiable = differentiable;
                /// The time dim among the tensordict's batch dims (negative counts from the
                /// end); default: the last batch dim, when there are at least two (a one-dim
                /// batch `[T]` is accepted only with the time dim set here: see the
                /// [module docs](crate::objectives::value)).
                with_time_dim(time_dim: i64) => core.time_dim = Some(time_dim);
                /// Builder form of [`ValueEstimator::set_tensor_keys`](crate::objectives::value::ValueEstimator::set_tensor_keys).
                with_keys(keys: $crate::objectives::value::ValueEstimatorKeys) => core.keys = keys;
            }

            /// The discount γ.
            pub fn gamma(&self) -> f64 {
                self.core.gamma
            }

            /// The value network, if any.
            pub fn value_network(&self) -> Option<&dyn $crate::modules::TensorDictModule> {
                self.core.value_network.as_deref()
            }

            /// Whether gradients flow through the estimate.
            pub fn differentiable(&self) -> bool {
                self.core.differentiable
            }
        }

        impl $crate::objectives::value::ValueEstimator for $ty {
            fn name(&self) -> &'static str {
                self.core.name
            }

            fn tensor_keys(&self) -> &$crate::objectives::value::ValueEstimatorKeys {
                &self.core.keys
            }

            fn set_tensor_keys(
                &mut self,
                keys: $crate::objectives::value::ValueEstimatorKeys,
            ) -> $crate::error::Result<()> {
                self.core.keys = keys;
                Ok(())
            }

            fn in_keys(&self) -> Vec<$crate::tensordict::NestedKey> {
                self.core.in_keys()
            }

            fn forward(
                &self,
                td: &mut $crate::tensordict::TensorDict,
            ) -> $crate::error::Result<()> {
                self.estimate(td, true)?.write_into(td, &self.core.keys)
            }

            fn value_estimate(
                &self,
                td: &$crate::tensordict::TensorDict,
            ) -> $crate::error::Result<tch::Tensor> {
                Ok(self.estimate(td, false)?.value_target)
            }
        }
    };
}
pub(crate) use estimator_builders;
