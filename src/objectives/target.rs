//! Target networks: [`WithTarget`] (a network and its target copy, built twice from one
//! builder), the [`TargetParams`] that pair their parameters, the [`TargetNetworks`] trait by
//! which a loss declares them, and TorchRL's updaters [`SoftUpdate`] and [`HardUpdate`].
//!
//! TorchRL's losses hold functional parameters and create `target_*_params` copies of them;
//! its updaters find those by name. Here a network with a target copy is a [`WithTarget`]:
//! the online network is built under the caller's [`nn::Path`] (so the caller's optimizer
//! trains it), the target under a [`VarStore`] the `WithTarget` owns, starting as a copy of
//! the online parameters and never trained (its `requires_grad` is off). A loss lists its
//! pairs through [`TargetNetworks::target_params`], and an updater takes shallow copies of
//! those tensors when it is made, so it needs no borrow of the loss afterwards.
//!
//! | updater | `step()` | TorchRL |
//! |---|---|---|
//! | [`SoftUpdate`] | `θ' ← ε·θ' + (1-ε)·θ` (`τ = 1 - ε`) | `SoftUpdate(loss, eps=…)` / `tau=…` |
//! | [`HardUpdate`] | `θ' ← θ` on every `interval + 1`-th call | `HardUpdate(loss, value_network_update_interval=…)` |
//!
//! ```
//! use tch::{nn, Device};
//! use torchrl::objectives::{SoftUpdate, WithTarget};
//! # fn main() -> torchrl::Result<()> {
//! let vs = nn::VarStore::new(Device::Cpu);
//! let net = WithTarget::new(&vs.root(), true, |p: &nn::Path| Ok(nn::linear(p, 2, 1, Default::default())))?;
//! let w0 = net.target().map(|t| t.ws.copy()).expect("a target was made");
//! // a loss lists its pairs through `TargetNetworks`; a `WithTarget` is one already
//! let mut updater = SoftUpdate::new(&net, None, Some(0.1))?;
//! tch::no_grad(|| { let _ = net.online().ws.shallow_clone().fill_(1.0); });
//! updater.step()?;
//! // θ' = 0.9·θ'_0 + 0.1·1
//! let expected = w0.f_mul_scalar(0.9)?.f_add_scalar(0.1)?;
//! let got = net.target().map(|t| t.ws.copy()).expect("a target was made");
//! assert!(got.allclose(&expected, 1e-6, 1e-7, false));
//! # Ok(()) }
//! ```

use std::fmt;

use tch::nn::{self, VarStore};
use tch::Tensor;

use crate::error::{Error, Result, ShapeFmt};

/// The parameters of a network paired with those of its target copy, by name:
/// `(name, online, target)` triples. The tensors are shallow copies sharing storage with the
/// networks', so an update written here is seen by both.
pub struct TargetParams {
    pairs: Vec<(String, Tensor, Tensor)>,
}

impl fmt::Debug for TargetParams {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TargetParams")
            .field(
                "names",
                &self.pairs.iter().map(|(n, _, _)| n).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl TargetParams {
    /// Pairs `(name, online, target)` given by hand. Checks that each pair has one shape,
    /// dtype and device, turns off the target's `requires_grad` and copies the online values
    /// into the target.
    pub fn new(pairs: Vec<(String, Tensor, Tensor)>) -> Result<Self> {
        for (name, online, target) in &pairs {
            if online.size() != target.size()
                || online.kind() != target.kind()
                || online.device() != target.device()
            {
                return Err(Error::value(
                    "TargetParams",
                    name,
                    format!(
                        "a target of the online parameter's shape {}, dtype {:?} and device {:?}",
                        ShapeFmt(&online.size()),
                        online.kind(),
                        online.device()
                    ),
                    format!(
                        "shape {}, dtype {:?}, device {:?}",
                        ShapeFmt(&target.size()),
                        target.kind(),
                        target.device()
                    ),
                ));
            }
        }
        let params = TargetParams { pairs };
        for (_, _, target) in &params.pairs {
            let _ = target.shallow_clone().set_requires_grad(false);
        }
        params.hard_update()?;
        Ok(params)
    }

    /// Pairs every variable of `target` with the variable of the same name under `online`
    /// (a path of another var store); errors naming the first variable `online` lacks.
    pub fn from_path(online: &nn::Path<'_>, target: &VarStore) -> Result<Self> {
        let mut vars: Vec<(String, Tensor)> = target.variables().into_iter().collect();
        vars.sort_by(|a, b| a.0.cmp(&b.0));
        let mut pairs = Vec::with_capacity(vars.len());
        for (name, t) in vars {
            let o = lookup(online, &name).ok_or_else(|| {
                Error::value(
                    "TargetParams",
                    &name,
                    "a variable of this name under the online network's path (build both with the same builder)",
                    format!(
                        "no such variable under path {:?}",
                        online.components().collect::<Vec<_>>().join(".")
                    ),
                )
            })?;
            pairs.push((name, o, t));
        }
        Self::new(pairs)
    }

    /// The `(name, online, target)` triples, sorted by name.
    pub fn pairs(&self) -> &[(String, Tensor, Tensor)] {
        &self.pairs
    }

    /// The number of paired parameters.
    pub fn len(&self) -> usize {
        self.pairs.len()
    }

    /// Whether no parameter is paired.
    pub fn is_empty(&self) -> bool {
        self.pairs.is_empty()
    }

    /// Copies every online parameter into its target (`θ' ← θ`).
    pub fn hard_update(&self) -> Result<()> {
        let _guard = tch::no_grad_guard();
        for (_, online, target) in &self.pairs {
            target.shallow_clone().f_copy_(online)?;
        }
        Ok(())
    }

    /// `θ' ← θ' + τ·(θ - θ')` for every pair (a lerp, as TorchRL's `SoftUpdate`).
    pub fn soft_update(&self, tau: f64) -> Result<()> {
        let _guard = tch::no_grad_guard();
        for (_, online, target) in &self.pairs {
            let _ = target.shallow_clone().f_lerp_(online, tau)?;
        }
        Ok(())
    }

    fn shallow(&self) -> Vec<(Tensor, Tensor)> {
        self.pairs
            .iter()
            .map(|(_, o, t)| (o.shallow_clone(), t.shallow_clone()))
            .collect()
    }
}

/// The variable `name` (dot-separated, as [`VarStore::variables`] names them) under `path`.
fn lookup(path: &nn::Path<'_>, name: &str) -> Option<Tensor> {
    let mut segments: Vec<&str> = name.split('.').collect();
    let last = segments.pop()?;
    let mut p = path.set_group(0);
    for s in segments {
        if s.is_empty() {
            return None;
        }
        p = p.sub(s);
    }
    if last.is_empty() {
        return None;
    }
    p.get(last)
}

/// What a loss implements to declare the parameters that have target copies (TorchRL's
/// `target_*_params`); the updaters read it once, when they are made.
pub trait TargetNetworks {
    /// Every [`TargetParams`] of the loss (one per network with a target copy); empty when
    /// the loss was built without target networks.
    fn target_params(&self) -> Vec<&TargetParams>;
}

/// A network and, optionally, its target copy: TorchRL's `convert_to_functional(...,
/// create_target_params=True)`.
///
/// The builder runs once under the caller's path (the online network, trained by the
/// caller's optimizer) and, with a target, once more under a [`VarStore`] owned here (same
/// device and dtype), whose values then start as a copy of the online ones.
pub struct WithTarget<M> {
    online: M,
    /// The online network's parameters (shallow copies), for [`WithTarget::frozen`].
    online_params: Vec<Tensor>,
    target: Option<(M, VarStore, TargetParams)>,
}

impl<M> fmt::Debug for WithTarget<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WithTarget")
            .field("target", &self.target.as_ref().map(|(_, _, p)| p))
            .finish_non_exhaustive()
    }
}

impl<M> WithTarget<M> {
    /// Builds the online network under `path` and, when `with_target`, its target copy.
    ///
    /// Errors from the builder pass through; a target whose variables the online path lacks
    /// is an error naming the variable.
    pub fn new<F>(path: &nn::Path<'_>, with_target: bool, build: F) -> Result<Self>
    where
        F: Fn(&nn::Path<'_>) -> Result<M>,
    {
        let online = build(path)?;
        let mut store = VarStore::new(path.device());
        store.set_kind(path.kind());
        let net = build(&store.root())?;
        if with_target {
            let params = TargetParams::from_path(path, &store)?;
            store.freeze();
            let online_params = params
                .pairs()
                .iter()
                .map(|(_, o, _)| o.shallow_clone())
                .collect();
            Ok(WithTarget {
                online,
                online_params,
                target: Some((net, store, params)),
            })
        } else {
            // the copy only names the online parameters
            let mut online_params = Vec::new();
            let mut names: Vec<String> = store.variables().into_keys().collect();
            names.sort();
            for name in names {
                if let Some(t) = lookup(path, &name) {
                    online_params.push(t);
                }
            }
            Ok(WithTarget {
                online,
                online_params,
                target: None,
            })
        }
    }

    /// Runs `f` with the online parameters' `requires_grad` off (TorchRL's detached
    /// parameters: the actor's loss must not reach the critic), restoring each afterwards.
    pub fn frozen<R>(&self, f: impl FnOnce() -> R) -> R {
        let flags: Vec<bool> = self
            .online_params
            .iter()
            .map(Tensor::requires_grad)
            .collect();
        for p in &self.online_params {
            let _ = p.shallow_clone().set_requires_grad(false);
        }
        let out = f();
        for (p, flag) in self.online_params.iter().zip(flags) {
            let _ = p.shallow_clone().set_requires_grad(flag);
        }
        out
    }

    /// The online network's parameters (shallow copies sharing storage), sorted by name.
    pub fn online_params(&self) -> &[Tensor] {
        &self.online_params
    }

    /// The online network.
    pub fn online(&self) -> &M {
        &self.online
    }

    /// The online network, mutably.
    pub fn online_mut(&mut self) -> &mut M {
        &mut self.online
    }

    /// The target network, if one was made.
    pub fn target(&self) -> Option<&M> {
        self.target.as_ref().map(|(n, _, _)| n)
    }

    /// The target network, or the online one when there is none (TorchRL then evaluates the
    /// online network with detached parameters; callers run it under `no_grad`).
    pub fn target_or_online(&self) -> &M {
        self.target().unwrap_or(&self.online)
    }

    /// The target's var store, if a target was made.
    pub fn target_var_store(&self) -> Option<&VarStore> {
        self.target.as_ref().map(|(_, s, _)| s)
    }

    /// The paired parameters, if a target was made.
    pub fn target_params(&self) -> Option<&TargetParams> {
        self.target.as_ref().map(|(_, _, p)| p)
    }

    /// Whether a target copy exists.
    pub fn has_target(&self) -> bool {
        self.target.is_some()
    }
}

impl<M> TargetNetworks for WithTarget<M> {
    fn target_params(&self) -> Vec<&TargetParams> {
        WithTarget::target_params(self).into_iter().collect()
    }
}

/// The pairs an updater holds, taken from a loss once.
fn collect_pairs(
    loss: &(impl TargetNetworks + ?Sized),
    op: &'static str,
) -> Result<Vec<(Tensor, Tensor)>> {
    let pairs: Vec<(Tensor, Tensor)> = loss
        .target_params()
        .into_iter()
        .flat_map(TargetParams::shallow)
        .collect();
    if pairs.is_empty() {
        return Err(Error::invalid(
            op,
            "Did not find any target parameters in the loss module: build it with target \
             networks (delay_value / delay_actor / delay_qvalue = true)",
        ));
    }
    // TorchRL's `init_`: the targets start as copies of the sources.
    let _guard = tch::no_grad_guard();
    for (o, t) in &pairs {
        t.shallow_clone().f_copy_(o)?;
    }
    Ok(pairs)
}

/// Polyak averaging of the target parameters, TorchRL's `SoftUpdate`:
/// `θ' ← ε·θ' + (1-ε)·θ` at each [`step`](SoftUpdate::step), with `τ = 1 - ε`.
///
/// Made from a loss (any [`TargetNetworks`]); like TorchRL's `init_`, making it copies the
/// online parameters into the targets.
pub struct SoftUpdate {
    eps: f64,
    pairs: Vec<(Tensor, Tensor)>,
}

impl fmt::Debug for SoftUpdate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SoftUpdate")
            .field("eps", &self.eps)
            .field("params", &self.pairs.len())
            .finish()
    }
}

impl SoftUpdate {
    /// One and only one of `eps` and `tau` (`tau = 1 - eps`); `eps` must lie in `[0, 1]`.
    ///
    /// Errors (as TorchRL) when both or neither is given, when `eps` is out of range, and when
    /// the loss has no target parameters.
    pub fn new(
        loss: &(impl TargetNetworks + ?Sized),
        eps: Option<f64>,
        tau: Option<f64>,
    ) -> Result<Self> {
        let eps = match (eps, tau) {
            (Some(e), None) => e,
            (None, Some(t)) => 1.0 - t,
            (None, None) => {
                return Err(Error::config(
                    "SoftUpdate",
                    "eps",
                    "one of eps or tau",
                    "neither eps nor tau was provided",
                ))
            }
            (Some(e), Some(t)) => {
                return Err(Error::config(
                    "SoftUpdate",
                    "eps",
                    "one and only one argument (tau or eps)",
                    format!("eps = {e} and tau = {t}"),
                ))
            }
        };
        if !(0.0..=1.0).contains(&eps) {
            return Err(Error::config("SoftUpdate", "eps", "a value in [0, 1]", eps));
        }
        Ok(SoftUpdate {
            eps,
            pairs: collect_pairs(loss, "SoftUpdate")?,
        })
    }

    /// `ε` (the share of the old target kept at each step).
    pub fn eps(&self) -> f64 {
        self.eps
    }

    /// `τ = 1 - ε`.
    pub fn tau(&self) -> f64 {
        1.0 - self.eps
    }

    /// One update of every target parameter.
    pub fn step(&mut self) -> Result<()> {
        let _guard = tch::no_grad_guard();
        let w = 1.0 - self.eps;
        for (o, t) in &self.pairs {
            let _ = t.shallow_clone().f_lerp_(o, w)?;
        }
        Ok(())
    }
}

/// Periodic copies of the online parameters into the targets, TorchRL's `HardUpdate`.
///
/// A counter starts at 0; each [`step`](HardUpdate::step) copies when the counter equals
/// `value_network_update_interval` (then resets it to 0) and otherwise increments it, so the
/// first copy happens at the `interval + 1`-th step, as in TorchRL.
pub struct HardUpdate {
    interval: u64,
    counter: u64,
    pairs: Vec<(Tensor, Tensor)>,
}

impl fmt::Debug for HardUpdate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HardUpdate")
            .field("value_network_update_interval", &self.interval)
            .field("counter", &self.counter)
            .field("params", &self.pairs.len())
            .finish()
    }
}

impl HardUpdate {
    /// TorchRL's default `value_network_update_interval`.
    pub const DEFAULT_INTERVAL: u64 = 1000;

    /// An updater over `loss`'s target parameters (copied from the online ones now).
    /// Errors when the loss has none.
    pub fn new(
        loss: &(impl TargetNetworks + ?Sized),
        value_network_update_interval: u64,
    ) -> Result<Self> {
        Ok(HardUpdate {
            interval: value_network_update_interval,
            counter: 0,
            pairs: collect_pairs(loss, "HardUpdate")?,
        })
    }

    /// The update interval.
    pub fn value_network_update_interval(&self) -> u64 {
        self.interval
    }

    /// The counter (0 right after a copy).
    pub fn counter(&self) -> u64 {
        self.counter
    }

    /// Counts a step; copies when the counter has reached the interval.
    pub fn step(&mut self) -> Result<()> {
        if self.counter == self.interval {
            let _guard = tch::no_grad_guard();
            for (o, t) in &self.pairs {
                t.shallow_clone().f_copy_(o)?;
            }
            self.counter = 0;
        } else {
            self.counter += 1;
        }
        Ok(())
    }
}
