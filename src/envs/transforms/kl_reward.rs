//! `KLRewardTransform`: TorchRL's classic (actor-based) KL correction of the reward,
//! `reward - coef * (log π(a) - log π_ref(a))`, which keeps a fine-tuned policy close to its
//! original configuration (RLHF).
//!
//! **Reference policy.** At construction the transform builds a second copy of the actor on its
//! own [`tch::nn::VarStore`] (the same builder closure, called on the new store's root, so the
//! variable names match), copies the actor's parameter values into it and freezes it (TorchRL's
//! `frozen_params`). Training the actor afterwards does not move the reference. With
//! [`KLRewardTransform::with_requires_grad`] the copies are differentiable clones instead
//! (`requires_grad = true`, still independent of the actor), see
//! [`KLRewardTransform::reference_varstore`].
//!
//! **Step.** The current log-probability is read from the data at `t` under the log-prob key
//! (default: the actor's own log-prob key, TorchRL 0.14's `"action_log_prob"`); the reference
//! log-probability is `π_ref.get_dist(td).log_prob(td[action])`. Both are unsqueezed once at the
//! end (`[*B] -> [*B, 1]`, the reward's ndim), must have the same shape, and the reward must have
//! the same ndim, or an error names the keys and shapes. `kl = curr - ref` is the usual
//! unbiased single-sample estimate; `next[out] = next[in] - coef * kl`.
//!
//! **Keys.** Exactly one in key and one out key (default `"reward"`; the out key defaults to the
//! in key). The action key is discovered from the parent env in [`Transform::attach`] (an error
//! when there are several or none) unless given with [`KLRewardTransform::with_action_key`]
//! (needed for [`Transform::forward`] without an env). A missing action at a step is an error.
//!
//! **Reset.** No KL is computed at reset (there is no action); when the out key differs from the
//! in key, a zero of the out key's spec is written (TorchRL writes `reward_spec.zero()`), so the
//! out key is present from the first tensordict on.
//!
//! **Specs** ([`Transform::transform_output_spec`], TorchRL v0.10's three cases, the last
//! release of this classic class; `S` is the shape of the spec read, and the LLM shape
//! `L(S) = (*S[:-2], -1, 1)` has a dynamic dim, see [`crate::data::specs`]):
//! - in = out = `"reward"`: the reward spec becomes `Composite{reward_key: Unbounded(S')}` with
//!   `reward_key` the single reward key (or `"reward"` when there are several and it is among
//!   them; otherwise an error) and `S' = L(S)` when `len(S) > 2`, else `S`. As in TorchRL, other
//!   reward keys are dropped;
//! - in = `"reward"`, out ≠ `"reward"`: the observation spec gets `out` with a clone of the
//!   reward leaf's spec at `S'` (the reward spec is unchanged);
//! - in ≠ `"reward"`: the observation spec gets `out` with a clone of the in key's spec (looked
//!   up in the observation spec, then in the reward spec) at `L(S)`, whatever `len(S)`. For
//!   `len(S) <= 2` in a batched env this puts `-1` on a batch dim, which a Composite refuses
//!   (TorchRL raises as well): an error names the key and both shapes.
//!
//! A per-step reward `[*B, 1]` is kept as is; an LLM reward `[*B, T, 1]` becomes
//! `[*B, -1, 1]`, so responses of any length `T` fit. The Unbounded spec keeps the reward's
//! floating dtype (`Float` otherwise). A clone changes shape only where it can: an Unbounded
//! spec takes any shape; another spec only gets dims made dynamic (its bounds or mask must be
//! the same along them, see `make_neg_dim`), else an error. TorchRL 0.14 has only the LLM-based
//! `KLRewardTransform`, which writes `(*batch, -1, 1)` in every case (so also for a `[*B, 1]`
//! reward); for `[*B, T, 1]` rewards both agree.
//!
//! ```
//! use tch::{nn, Device};
//! use torchrl::envs::builtin::PendulumEnv;
//! use torchrl::envs::transforms::{KLRewardTransform, RewardScaling, TransformedEnv};
//! use torchrl::envs::{EnvBase, RolloutConfig};
//! use torchrl::modules::actors::{DistributionBuilder, NormalParamExtractor, ProbabilisticActor};
//! use torchrl::modules::models::{MlpConfig, MLP};
//! use torchrl::modules::module::{TdModule, TensorDictModule};
//! use torchrl::modules::sequential::TensorDictSequential;
//! # fn main() -> torchrl::Result<()> {
//! let make_actor = |p: &nn::Path| -> torchrl::Result<ProbabilisticActor> {
//!     let mlp = MLP::new(p, &MlpConfig::new(3, 2).with_depth(1).with_num_cells(16))?;
//!     let net = TensorDictSequential::new()
//!         .with(TdModule::new(mlp, ["observation"], ["param"])?)
//!         .with(NormalParamExtractor::new());
//!     let dist = DistributionBuilder::tanh_normal("loc", "scale", -2.0, 2.0)?;
//!     Ok(ProbabilisticActor::new(net, dist).with_return_log_prob(true))
//! };
//! let vs = nn::VarStore::new(Device::Cpu);
//! let actor = make_actor(&vs.root())?;
//! let kl = KLRewardTransform::new(&vs, make_actor)?.with_out_keys(["reward_kl"])?;
//! let mut env = TransformedEnv::new(PendulumEnv::new(&[2], Device::Cpu)?)?
//!     .with(RewardScaling::new(0.0, 1.0)?)?
//!     .with(kl)?;
//! // move the actor away from the frozen reference
//! tch::no_grad(|| {
//!     for (_, mut v) in vs.variables() {
//!         let _ = v.f_add_scalar_(1.0);
//!     }
//! });
//! let mut policy = actor.as_policy();
//! let traj = env.rollout(3, Some(&mut policy), &RolloutConfig::default())?;
//! let r = traj.get_or_err(("next", "reward"))?;
//! let r_kl = traj.get_or_err(("next", "reward_kl"))?;
//! assert_eq!(r.size(), r_kl.size());
//! assert_eq!(r.ne_tensor(r_kl).all().int64_value(&[]), 1); // changed everywhere
//! # Ok(()) }
//! ```

use std::fmt;

use tch::nn::{Path, VarStore};
use tch::{Kind, Tensor};

use super::Transform;
use crate::data::specs::{Composite, TensorSpec, Unbounded};
use crate::envs::EnvSpecs;
use crate::error::{Error, Result, ShapeFmt};
use crate::modules::ProbabilisticTensorDictModule;
use crate::tensordict::{fmt_key_list, AsKey, Entry, KeysOptions, NestedKey, TensorDict};

/// What [`KLRewardTransform`] needs from a policy: the crate's probabilistic module trait,
/// under its former name. Implemented by [`ProbabilisticActor`](crate::modules::ProbabilisticActor) and
/// [`ActorValueOperator`](crate::modules::ActorValueOperator); implement it for any other
/// module built on a [`tch::nn::VarStore`].
pub use crate::modules::ProbabilisticTensorDictModule as DistributionSource;

/// TorchRL 0.14's default log-prob key (`composite_lp_aggregate` off).
pub const DEFAULT_LOG_PROB_KEY: &str = "action_log_prob";

/// `reward - coef * (log π(a) - log π_ref(a))` with a frozen reference copy of the actor. See
/// the module docs.
pub struct KLRewardTransform {
    reference: Box<dyn ProbabilisticTensorDictModule>,
    ref_vs: VarStore,
    coef: f64,
    in_key: NestedKey,
    out_key: Option<NestedKey>,
    requires_grad: bool,
    log_prob_key: NestedKey,
    action_key: Option<NestedKey>,
    explicit_action_key: bool,
    /// The spec of the out key's zero at reset (set by `attach` when out ≠ in).
    reset_spec: Option<TensorSpec>,
}

impl fmt::Debug for KLRewardTransform {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.name())
    }
}

const OP: &str = "KLRewardTransform";

/// What `attach` expects of the parent's action keys.
const ONE_ACTION_KEY: &str =
    "exactly one action key in the parent env (or pass it with KLRewardTransform::with_action_key)";

impl KLRewardTransform {
    /// Builds the reference copy: `build` is called on the root of a new `VarStore` on
    /// `actor_vs`'s device, the values of `actor_vs` are copied into it, and it is frozen.
    /// `build` must create the same variables as the actor's (same names and shapes), or an
    /// error lists the differences. `build` returns any
    /// [`ProbabilisticTensorDictModule`] (a [`ProbabilisticActor`](crate::modules::ProbabilisticActor),
    /// an [`ActorValueOperator`](crate::modules::ActorValueOperator), ...). Defaults: `coef = 1`,
    /// in and out key `"reward"`, the log-prob key of the built policy.
    pub fn new<A, F>(actor_vs: &VarStore, build: F) -> Result<Self>
    where
        A: ProbabilisticTensorDictModule + 'static,
        F: FnOnce(&Path) -> Result<A>,
    {
        let op = "KLRewardTransform::new";
        let mut ref_vs = VarStore::new(actor_vs.device());
        let reference = build(&ref_vs.root())?;
        let src = actor_vs.variables();
        let dst = ref_vs.variables();
        let mut only_src: Vec<&String> = src.keys().filter(|k| !dst.contains_key(*k)).collect();
        let mut only_dst: Vec<&String> = dst.keys().filter(|k| !src.contains_key(*k)).collect();
        only_src.sort();
        only_dst.sort();
        if !only_src.is_empty() || !only_dst.is_empty() {
            return Err(Error::argument(
                op,
                "build",
                "a closure that builds a reference policy with the actor's variables (build the \
                 reference with the same closure as the actor)",
                format!(
                    "a reference policy whose variables differ: only in the actor: {only_src:?}, \
                     only in the reference: {only_dst:?}"
                ),
            ));
        }
        for (name, d) in &dst {
            if let Some(s) = src.get(name) {
                if s.size() != d.size() {
                    return Err(Error::InvalidValue {
                        op,
                        what: "variable",
                        key: name.clone(),
                        expected: format!("shape {} (as in the actor)", ShapeFmt(&s.size())),
                        got: format!("shape {} in the reference", ShapeFmt(&d.size())),
                    });
                }
            }
        }
        ref_vs.copy(actor_vs)?;
        ref_vs.freeze();
        let log_prob_key = reference.log_prob_key();
        Ok(KLRewardTransform {
            reference: Box::new(reference),
            ref_vs,
            coef: 1.0,
            in_key: NestedKey::from("reward"),
            out_key: None,
            requires_grad: false,
            log_prob_key,
            action_key: None,
            explicit_action_key: false,
            reset_spec: None,
        })
    }

    /// The KL coefficient (default 1). Errors when it is not finite.
    pub fn with_coef(mut self, coef: f64) -> Result<Self> {
        if !coef.is_finite() {
            return Err(Error::config(
                "KLRewardTransform::with_coef",
                "coef",
                "finite",
                coef,
            ));
        }
        self.coef = coef;
        Ok(self)
    }

    /// The reward key to read (default `["reward"]`). Exactly one key is allowed.
    pub fn with_in_keys<K: AsKey>(mut self, keys: impl IntoIterator<Item = K>) -> Result<Self> {
        self.in_key = one_key("in_keys", keys)?;
        Ok(self)
    }

    /// The key to write (default: the in key). Exactly one key is allowed.
    pub fn with_out_keys<K: AsKey>(mut self, keys: impl IntoIterator<Item = K>) -> Result<Self> {
        self.out_key = Some(one_key("out_keys", keys)?);
        Ok(self)
    }

    /// With `true`, the reference parameters are differentiable clones (`requires_grad`),
    /// still independent of the actor's; with `false` (default) they are frozen.
    pub fn with_requires_grad(mut self, requires_grad: bool) -> Self {
        if requires_grad {
            self.ref_vs.unfreeze();
        } else {
            self.ref_vs.freeze();
        }
        self.requires_grad = requires_grad;
        self
    }

    /// The key of the current log-probability in the data at `t` (default: the policy's own,
    /// else `"action_log_prob"`).
    pub fn with_log_prob_key(mut self, key: impl AsKey) -> Self {
        self.log_prob_key = key.to_nested_key();
        self
    }

    /// The action key, instead of discovering it from the parent env.
    pub fn with_action_key(mut self, key: impl AsKey) -> Self {
        self.action_key = Some(key.to_nested_key());
        self.explicit_action_key = true;
        self
    }

    /// The KL coefficient.
    pub fn coef(&self) -> f64 {
        self.coef
    }

    /// The reward key read.
    pub fn in_key(&self) -> &NestedKey {
        &self.in_key
    }

    /// The key written.
    pub fn out_key(&self) -> &NestedKey {
        self.out_key.as_ref().unwrap_or(&self.in_key)
    }

    /// Every key read: the reward key, then the policy's in keys (TorchRL extends `in_keys`
    /// with `actor.in_keys`).
    pub fn in_keys(&self) -> Vec<NestedKey> {
        let mut keys = vec![self.in_key.clone()];
        keys.extend(self.reference.in_keys());
        keys
    }

    /// The log-prob key.
    pub fn log_prob_key(&self) -> &NestedKey {
        &self.log_prob_key
    }

    /// The action key: given, or discovered when the transform joined an env.
    pub fn action_key(&self) -> Option<&NestedKey> {
        self.action_key.as_ref()
    }

    /// Whether the reference parameters require gradients.
    pub fn requires_grad(&self) -> bool {
        self.requires_grad
    }

    /// The store of the reference parameters (frozen unless
    /// [`KLRewardTransform::with_requires_grad`]); give it to an optimizer to train them.
    pub fn reference_varstore(&self) -> &VarStore {
        &self.ref_vs
    }

    /// The reference policy.
    pub fn reference(&self) -> &dyn ProbabilisticTensorDictModule {
        self.reference.as_ref()
    }

    /// `log π_ref(td[action])`.
    pub fn reference_log_prob(&self, td: &TensorDict) -> Result<Tensor> {
        let action_key = self.require_action_key()?;
        let action = td
            .get(action_key)
            .ok_or_else(|| missing(td, action_key, "action"))?;
        self.reference.get_dist(td)?.log_prob(action)
    }

    fn require_action_key(&self) -> Result<&NestedKey> {
        self.action_key.as_ref().ok_or_else(|| {
            Error::config(
                OP,
                "action_key",
                "a known action key: add the transform to an env (it is discovered from the \
                 env's action keys) or set it with KLRewardTransform::with_action_key",
                "none (the action key is unknown)",
            )
        })
    }

    fn kl_step(&self, td: &TensorDict, mut next: TensorDict) -> Result<TensorDict> {
        let action_key = self.require_action_key()?;
        if !td.contains(action_key) {
            return Err(missing(td, action_key, "action"));
        }
        let log_prob = self.reference_log_prob(td)?;
        let curr = td
            .get(&self.log_prob_key)
            .ok_or_else(|| missing(td, &self.log_prob_key, "log-prob"))?;
        let reward = next
            .get(&self.in_key)
            .ok_or_else(|| missing(&next, &self.in_key, "reward"))?;
        let curr = curr.f_unsqueeze(-1)?;
        let log_prob = log_prob.f_to_device(curr.device())?.f_unsqueeze(-1)?;
        if log_prob.size() != curr.size() {
            return Err(Error::value(
                OP,
                &self.log_prob_key,
                format!(
                    "the shape of the reference log-prob of {action_key}, {} (unsqueezed; the \
                     log-probability tensor shapes must match)",
                    ShapeFmt(&log_prob.size())
                ),
                format!("shape {} (unsqueezed)", ShapeFmt(&curr.size())),
            ));
        }
        if reward.dim() != curr.dim() {
            return Err(Error::value(
                OP,
                &self.in_key,
                format!(
                    "the number of dimensions of the KL term from {} (shape {} after unsqueeze, \
                     ndim={})",
                    self.log_prob_key,
                    ShapeFmt(&curr.size()),
                    curr.dim()
                ),
                format!(
                    "a reward of shape {}, ndim={}",
                    ShapeFmt(&reward.size()),
                    reward.dim()
                ),
            ));
        }
        let kl = curr.f_sub(&log_prob)?;
        let out = reward.f_sub(&kl.f_mul_scalar(self.coef)?)?;
        next.set(self.out_key(), out)?;
        Ok(next)
    }

    /// The spec the out key gets (cases b and c), or `None` for case a.
    fn out_leaf_spec(&self, specs: &EnvSpecs) -> Result<Option<TensorSpec>> {
        let op = "KLRewardTransform::transform_output_spec";
        let reward = NestedKey::from("reward");
        if self.in_key == reward && *self.out_key() == reward {
            return Ok(None);
        }
        if self.in_key == reward {
            let key = reward_key(specs)?;
            return specs.reward.get(&key).cloned().map(Some).ok_or_else(|| {
                Error::invalid(
                    op,
                    format!("the reward key {key} is not in the reward spec"),
                )
            });
        }
        specs
            .observation
            .get(&self.in_key)
            .or_else(|| specs.reward.get(&self.in_key))
            .cloned()
            .map(Some)
            .ok_or_else(|| {
                Error::config(
                    op,
                    "in_key",
                    format!(
                        "a key of the observation spec (keys: {}) or of the reward spec (keys: \
                         {})",
                        fmt_key_list(&specs.observation.keys(KeysOptions::nested_leaves())),
                        fmt_key_list(&specs.reward.keys(KeysOptions::nested_leaves()))
                    ),
                    format!("{}, which is in neither", self.in_key),
                )
            })
    }
}

/// TorchRL's LLM reward shape `(*S[:-2], -1, 1)`.
fn llm_shape(s: &[i64]) -> Vec<i64> {
    let mut out: Vec<i64> = s.iter().take(s.len().saturating_sub(2)).copied().collect();
    out.extend([-1, 1]);
    out
}

/// [`llm_shape`] when `len(S) > 2`, else `S` (TorchRL v0.10's first two cases).
fn llm_shape_if_long(s: &[i64]) -> Vec<i64> {
    if s.len() > 2 {
        llm_shape(s)
    } else {
        s.to_vec()
    }
}

/// The shape of the spec of `key` in the observation spec, then the reward spec (for messages).
fn leaf_shape_of(specs: &EnvSpecs, key: &NestedKey) -> Vec<i64> {
    specs
        .observation
        .get(key)
        .or_else(|| specs.reward.get(key))
        .map(|s| s.shape().to_vec())
        .unwrap_or_default()
}

/// `leaf` (the spec of `key`) at `shape`, TorchRL's `spec.clone(); spec.shape = shape`: an
/// Unbounded spec takes any shape; another spec only has dims made dynamic (`-1` in `shape`
/// where it has a size), else an error.
fn reshaped(leaf: &TensorSpec, shape: &[i64], key: &NestedKey) -> Result<TensorSpec> {
    let old = leaf.shape();
    if old == shape {
        return Ok(leaf.clone());
    }
    if let TensorSpec::Unbounded(u) = leaf {
        return Ok(Unbounded::new()
            .with_dtype(u.dtype())?
            .with_device(u.device())?
            .with_dynamic_shape(shape)?
            .into());
    }
    let marks_only =
        old.len() == shape.len() && old.iter().zip(shape).all(|(o, n)| o == n || *n == -1);
    if !marks_only {
        return Err(Error::InvalidValue {
            op: "KLRewardTransform::transform_output_spec",
            what: "spec",
            key: key.to_string(),
            expected: format!(
                "an Unbounded spec, or a spec that only needs dynamic dims, to take TorchRL's LLM \
                 shape {}",
                ShapeFmt(shape)
            ),
            got: format!("{leaf} of shape {}", ShapeFmt(old)),
        });
    }
    let mut out = leaf.clone();
    for (d, _) in shape
        .iter()
        .enumerate()
        .filter(|(d, n)| **n == -1 && old.get(*d) != Some(&-1))
    {
        out = out.make_neg_dim(d as i64)?;
    }
    Ok(out)
}

/// The single key of `keys`, or an error naming them.
fn one_key<K: AsKey>(what: &'static str, keys: impl IntoIterator<Item = K>) -> Result<NestedKey> {
    let keys: Vec<NestedKey> = keys.into_iter().map(|k| k.to_nested_key()).collect();
    match keys.as_slice() {
        [k] => Ok(k.clone()),
        _ => Err(Error::config(
            OP,
            what,
            "exactly one key (Only one in_key/out_key is allowed)",
            format!("{} ({} keys)", fmt_key_list(&keys), keys.len()),
        )),
    }
}

/// The reward key: the single one, or `"reward"` when there are several and it is among them.
fn reward_key(specs: &EnvSpecs) -> Result<NestedKey> {
    let keys = specs.reward_keys();
    let reward = NestedKey::from("reward");
    match keys.as_slice() {
        [k] => Ok(k.clone()),
        _ if keys.contains(&reward) => Ok(reward),
        _ => Err(Error::InvalidValue {
            op: "KLRewardTransform::transform_output_spec",
            what: "spec",
            key: "reward".to_string(),
            expected: "one reward key or \"reward\" among them (couldn't find the reward key)"
                .to_string(),
            got: fmt_key_list(&keys),
        }),
    }
}

fn missing(td: &TensorDict, key: &NestedKey, what: &str) -> Error {
    Error::KeyNotFound {
        op: OP,
        key: format!("{key} (the {what} key)"),
        available: td
            .keys(crate::tensordict::KeysOptions::nested_leaves())
            .iter()
            .map(ToString::to_string)
            .collect(),
    }
}

impl Transform for KLRewardTransform {
    fn name(&self) -> String {
        format!(
            "KLRewardTransform(coef={}, in_key={}, out_key={}, log_prob_key={}, action_key={})",
            self.coef,
            self.in_key,
            self.out_key(),
            self.log_prob_key,
            self.action_key
                .as_ref()
                .map_or_else(|| "None".to_string(), |k| k.to_string())
        )
    }

    fn attach(&mut self, parent: &EnvSpecs) -> Result<()> {
        if !self.explicit_action_key {
            let keys = parent.action_keys();
            match keys.as_slice() {
                [k] => self.action_key = Some(k.clone()),
                [] => {
                    return Err(Error::InvalidValue {
                        op: "KLRewardTransform::attach",
                        what: "spec",
                        key: "action".to_string(),
                        expected: ONE_ACTION_KEY.to_string(),
                        got: "no action key in the parent env".to_string(),
                    })
                }
                _ => {
                    return Err(Error::InvalidValue {
                        op: "KLRewardTransform::attach",
                        what: "spec",
                        key: "action".to_string(),
                        expected: ONE_ACTION_KEY.to_string(),
                        got: format!("more than one action key found ({})", fmt_key_list(&keys)),
                    })
                }
            }
        }
        self.reset_spec = if *self.out_key() != self.in_key {
            self.out_leaf_spec(parent)?
        } else {
            None
        };
        Ok(())
    }

    fn new_output_keys(&self) -> Vec<NestedKey> {
        if *self.out_key() != self.in_key {
            vec![self.out_key().clone()]
        } else {
            Vec::new()
        }
    }

    fn transform_output_spec(&self, mut specs: EnvSpecs) -> Result<EnvSpecs> {
        match self.out_leaf_spec(&specs)? {
            None => {
                let key = reward_key(&specs)?;
                let leaf = specs.reward.get_or_err(&key)?;
                let dtype = match leaf.dtype() {
                    Some(k @ (Kind::Half | Kind::BFloat16 | Kind::Float | Kind::Double)) => k,
                    _ => Kind::Float,
                };
                let device = leaf.device().unwrap_or_else(|| specs.device());
                let unbounded = Unbounded::new()
                    .with_dynamic_shape(llm_shape_if_long(leaf.shape()))?
                    .with_dtype(dtype)?
                    .with_device(device)?;
                let reward = Composite::new(specs.reward.shape())?
                    .with(&key, unbounded)?
                    .with_device(device)?;
                specs.reward = reward;
            }
            Some(leaf) => {
                let reward = NestedKey::from("reward");
                let shape = if self.in_key == reward {
                    llm_shape_if_long(leaf.shape())
                } else {
                    llm_shape(leaf.shape())
                };
                let leaf = reshaped(&leaf, &shape, &self.in_key)?;
                let out = self.out_key().clone();
                specs.observation.set(&out, leaf).map_err(|e| {
                    e.context(format!(
                        "KLRewardTransform::transform_output_spec: the spec of {out} has TorchRL's \
                         LLM shape {} (*S[:-2], -1, 1) from the shape {} of {}",
                        ShapeFmt(&shape),
                        ShapeFmt(&leaf_shape_of(&specs, &self.in_key)),
                        self.in_key
                    ))
                })?
            }
        }
        Ok(specs)
    }

    fn step(&mut self, td: &TensorDict, next: TensorDict) -> Result<TensorDict> {
        self.kl_step(td, next)
    }

    fn reset(&mut self, _td: &TensorDict, mut reset: TensorDict) -> Result<TensorDict> {
        if let Some(spec) = &self.reset_spec {
            let out = self.out_key().clone();
            if !reset.contains(&out) {
                reset.set(&out, spec.zero(&[])?)?;
            }
        }
        Ok(reset)
    }

    fn forward(&mut self, mut td: TensorDict) -> Result<TensorDict> {
        self.require_action_key()?;
        let next = match td.pop("next") {
            Ok(Entry::Dict(d)) => d,
            Ok(Entry::Tensor(_)) => {
                return Err(Error::WrongEntryKind {
                    op: "KLRewardTransform::forward",
                    key: "\"next\"".to_string(),
                    expected: "a tensordict",
                    found: "a tensor",
                })
            }
            Err(e) => return Err(e),
        };
        let next = self.kl_step(&td, next)?;
        td.set("next", next)?;
        Ok(td)
    }
}
