//! `check_env_specs`: proves that an environment keeps the contract its specs promise.
//!
//! It runs a short rollout (3 steps, with and without stopping on done) and compares it with
//! [`EnvBase::fake_tensordict`]: first the key sets (listing what is in one but not the other),
//! then shapes and dtypes leaf by leaf, then that the last step's values are contained in the
//! specs (actions, states, done flags and observations at the root; rewards, done flags and
//! observations under `"next"`). Each error names the key, the spec and the value. Any NaN in
//! a floating entry of the rollout (an observation, a reward, …) is reported first, naming the
//! key and how many values are NaN and infinite; ±Inf alone is judged by the containment
//! check (an Unbounded spec admits it, a Bounded one does not).
//!
//! **Partial resets.** Last, [`check_partial_reset`] proves that a reset under a `"_reset"`
//! mask leaves the unselected elements' state and observations untouched (envs with two or more
//! batch elements).
//!
//! **Dynamic specs.** When a spec has a dynamic (`-1`) dim (see [`crate::data::specs`]), successive
//! steps may carry different lengths there, and a rollout cannot stack them (TorchRL lazily
//! stacks them instead, with `return_contiguous=False`). `check_env_specs` then steps the env by
//! hand (reset, then 3 random-action steps, stopping on done or auto-resetting, as the two
//! rollouts do) and checks **each step on its own**: the same key sets, then every leaf's dtype
//! and shape against its spec (a dynamic dim takes any size, the others must equal the spec's),
//! then every value's containment. Padding the steps to one length was not chosen: the padding
//! would be values no spec describes. Specs without dynamic dims keep the rollout check above.
//!
//! ```
//! use tch::{Kind, Tensor};
//! use torchrl::envs::{check_env_specs, EnvBase, EnvCore, EnvSpecs};
//! use torchrl::specs::{Categorical, Unbounded};
//! use torchrl::TensorDict;
//!
//! /// Emits one more token per step: observation `"tokens"` of shape `[t]`.
//! struct Grow { core: EnvCore, t: i64 }
//!
//! impl EnvBase for Grow {
//!     fn core(&self) -> &EnvCore { &self.core }
//!     fn core_mut(&mut self) -> &mut EnvCore { &mut self.core }
//!     fn reset_impl(&mut self, _td: Option<&TensorDict>) -> torchrl::Result<TensorDict> {
//!         self.t = 1;
//!         TensorDict::new([])?.with("tokens", Tensor::zeros([1], (Kind::Int64, tch::Device::Cpu)))
//!     }
//!     fn step_impl(&mut self, _td: &TensorDict) -> torchrl::Result<TensorDict> {
//!         self.t += 1;
//!         TensorDict::new([])?
//!             .with("tokens", Tensor::zeros([self.t], (Kind::Int64, tch::Device::Cpu)))?
//!             .with("reward", Tensor::from_slice(&[1.0f32]))?
//!             .with("done", Tensor::from_slice(&[false]))
//!     }
//! }
//!
//! # fn main() -> torchrl::Result<()> {
//! let tokens = Unbounded::new().with_dtype(Kind::Int64)?.with_dynamic_shape([-1])?;
//! let specs = EnvSpecs::new([])?
//!     .with_observation("tokens", tokens)?
//!     .with_action("action", Categorical::new(2)?)?
//!     .with_reward("reward", Unbounded::new())?;
//! let mut env = Grow { core: EnvCore::new(specs)?, t: 0 };
//! check_env_specs(&mut env, Some(0))?; // lengths 1, 2, 3, 4: each step checked on its own
//! # Ok(()) }
//! ```

use super::EnvBase;
use super::RolloutConfig;
use crate::data::specs::{Composite, TensorSpec};
use crate::error::{Error, Result, ShapeFmt};
use crate::tensordict::{fmt_key_list, KeysOptions, NestedKey, TensorDict};

fn spec_err(key: String, spec: String, reason: String) -> Error {
    Error::NotInSpec {
        op: "check_env_specs",
        key,
        spec,
        reason,
    }
}

/// Checks `env` against its specs; with `seed`, the env is seeded first (so the check is
/// reproducible). See the module docs for what is compared. An env with two or more batch
/// elements (and static specs) is then put through [`check_partial_reset`] (seeded with `seed`,
/// or 0), which reseeds it.
pub fn check_env_specs<E: EnvBase + ?Sized>(env: &mut E, seed: Option<u64>) -> Result<()> {
    if let Some(s) = seed {
        env.set_seed(s)?;
    }
    if has_dynamic_specs(env.specs()) {
        for break_when_any_done in [true, false] {
            check_steps(env, break_when_any_done)?;
        }
        return Ok(());
    }
    for break_when_any_done in [true, false] {
        let cfg = RolloutConfig {
            break_when_any_done: Some(break_when_any_done),
            ..Default::default()
        };
        let real = env.rollout(3, None, &cfg)?;
        check_nan_leaves(&real)?;
        check_against_fake(env, &real)?;
    }
    check_partial_reset(env, seed.unwrap_or(0))
}

/// Refuses NaN anywhere in the env's output (no spec contains NaN, but a leaf check passes it
/// through, and a NaN reward would otherwise pass the rollout, GAE and the loss): the error
/// names the key and counts the NaN (and infinite) values. ±Inf alone is left to the specs'
/// containment check: an Unbounded spec admits it, a Bounded one refuses it.
fn check_nan_leaves(td: &TensorDict) -> Result<()> {
    for (k, t) in td.leaves() {
        if !crate::kind::is_float(t.kind()) || t.numel() == 0 {
            continue;
        }
        if t.f_isnan()?.f_any()?.f_int64_value(&[])? != 0 {
            return crate::objectives::ensure_finite(
                "check_env_specs (NaN in the env's output)",
                &k,
                t,
            );
        }
    }
    Ok(())
}

/// True when a spec of the env has a dynamic (`-1`) dim (TorchRL's `_has_dynamic_specs`).
fn has_dynamic_specs(specs: &super::EnvSpecs) -> bool {
    [
        &specs.observation,
        &specs.reward,
        &specs.done,
        &specs.action,
        &specs.state,
    ]
    .iter()
    .any(|c| c.is_dynamic())
}

/// The dynamic-spec check: 3 random-action steps, each checked on its own (see the module docs).
fn check_steps<E: EnvBase + ?Sized>(env: &mut E, break_when_any_done: bool) -> Result<()> {
    let stop_keys = env.core().keys().stop.clone();
    let mut td = env.reset(None)?;
    for _ in 0..3 {
        td = env.rand_action(Some(td))?;
        let (stepped, root) = if break_when_any_done {
            let stepped = env.step(td)?;
            let root = env.step_mdp(&stepped)?;
            (stepped, root)
        } else {
            env.step_and_maybe_reset(td)?
        };
        check_nan_leaves(&stepped)?;
        check_step(env, &stepped)?;
        if break_when_any_done {
            let next = stepped.get_dict("next").cloned().unwrap_or(stepped.empty());
            if super::utils::any_of(&next, &stop_keys)? {
                break;
            }
        }
        td = root;
    }
    Ok(())
}

/// One step `td` (with `"next"`) against the specs: key sets, dtypes and shapes (a dynamic spec
/// dim takes any size), then containment.
fn check_step<E: EnvBase + ?Sized>(env: &mut E, td: &TensorDict) -> Result<()> {
    let specs = env.specs().clone();
    let fake = env.fake_tensordict()?;
    let (real, fake) = compare_keys(&specs, td, &fake)?;
    for (k, r) in real.leaves() {
        let f = fake.get_or_err(&k)?;
        let spec = leaf_spec(&specs, &k);
        let expected = match spec {
            Some(s) => s.shape().to_vec(),
            None => f.size(),
        };
        let rs = r.size();
        let fits =
            rs.len() == expected.len() && expected.iter().zip(&rs).all(|(e, a)| *e == -1 || e == a);
        if !fits {
            return Err(Error::ShapeMismatch {
                op: "check_env_specs (step leaf vs spec; -1 dims take any size)",
                key: k.to_string(),
                expected,
                actual: rs,
            });
        }
        if r.kind() != f.kind() {
            return Err(Error::DtypeMismatch {
                op: "check_env_specs (step leaf vs spec)",
                key: k.to_string(),
                expected: f.kind(),
                actual: r.kind(),
            });
        }
    }
    check_containment(&specs, td)
}

/// The spec of a leaf of a step tensordict: root keys in the state, action, observation and done
/// specs; `("next", k)` in the observation, reward and done specs.
fn leaf_spec<'a>(specs: &'a super::EnvSpecs, key: &NestedKey) -> Option<&'a TensorSpec> {
    let parts: Vec<&str> = key.parts().collect();
    match parts.split_first() {
        Some((&"next", rest)) if !rest.is_empty() => {
            [&specs.observation, &specs.reward, &specs.done]
                .into_iter()
                .find_map(|c| c.get(rest))
        }
        _ => [&specs.state, &specs.action, &specs.observation, &specs.done]
            .into_iter()
            .find_map(|c| c.get(parts.as_slice())),
    }
}

/// The key-set comparison of the data with the fake tensordict (both without the
/// `("next", state key)` entries, TorchRL #3260); returns both filtered.
fn compare_keys(
    specs: &super::EnvSpecs,
    real: &TensorDict,
    fake: &TensorDict,
) -> Result<(TensorDict, TensorDict)> {
    // ("next", state key) entries are not part of the contract (TorchRL #3260).
    let state_next: Vec<NestedKey> = specs
        .state_keys()
        .iter()
        .map(|k| k.prefixed("next"))
        .collect();
    let real = real.exclude(&state_next);
    let fake = fake.exclude(&state_next);
    let rk = real.keys(KeysOptions::nested_leaves());
    let fk = fake.keys(KeysOptions::nested_leaves());
    let only_real: Vec<NestedKey> = rk.iter().filter(|k| !fk.contains(k)).cloned().collect();
    let only_fake: Vec<NestedKey> = fk.iter().filter(|k| !rk.contains(k)).cloned().collect();
    if !only_real.is_empty() || !only_fake.is_empty() {
        return Err(Error::invalid(
            "check_env_specs",
            format!(
                "the keys of the specs and the data do not match:\n- in the rollout but in no spec: {}\n\
                 - in the specs but not in the rollout: {}",
                fmt_key_list(&only_real),
                fmt_key_list(&only_fake)
            ),
        ));
    }
    Ok((real, fake))
}

/// Every group's leaves are in their specs on the step `last` (root groups at the root; reward,
/// done and observation under `"next"`).
fn check_containment(specs: &super::EnvSpecs, last: &TensorDict) -> Result<()> {
    let root_groups: [(&str, &Composite); 4] = [
        ("action", &specs.action),
        ("state", &specs.state),
        ("done", &specs.done),
        ("observation", &specs.observation),
    ];
    for (name, spec) in root_groups {
        check_group(name, spec, last, None)?;
    }
    let next = last.get_dict("next").cloned().unwrap_or(last.empty());
    for (name, spec) in [
        ("reward", &specs.reward),
        ("done", &specs.done),
        ("observation", &specs.observation),
    ] {
        check_group(name, spec, &next, Some("next"))?;
    }
    Ok(())
}

fn check_against_fake<E: EnvBase + ?Sized>(env: &mut E, real: &TensorDict) -> Result<()> {
    let specs = env.specs().clone();
    let nb = specs.batch_size().len();
    let t = real.batch_size().get(nb).copied().unwrap_or(1);
    let fake = env.fake_tensordict()?.unsqueeze(nb as i64)?;
    let mut shape = specs.batch_size().to_vec();
    shape.push(t);
    let fake = fake.expand(&shape)?;
    let full = real;
    let (real, fake) = compare_keys(&specs, full, &fake)?;
    for (k, f) in fake.leaves() {
        let r = real.get_or_err(&k)?;
        if r.size() != f.size() {
            return Err(Error::ShapeMismatch {
                op: "check_env_specs (rollout leaf vs spec)",
                key: k.to_string(),
                expected: f.size(),
                actual: r.size(),
            });
        }
        if r.kind() != f.kind() {
            return Err(Error::DtypeMismatch {
                op: "check_env_specs (rollout leaf vs spec)",
                key: k.to_string(),
                expected: f.kind(),
                actual: r.kind(),
            });
        }
    }
    // Last step: containment.
    let mut idx: Vec<crate::tensordict::BatchIndex> = (0..nb)
        .map(|_| crate::tensordict::BatchIndex::full())
        .collect();
    idx.push(crate::tensordict::BatchIndex::Int(-1));
    // Containment is checked on the unfiltered last step (a key may be both an observation and
    // a state, e.g. an episode sum; its ("next", key) entry was only left out of the key-set
    // comparison).
    let last = full.index(&idx)?;
    let last = env.rand_action(Some(last))?;
    check_containment(&specs, &last)
}

fn check_group(name: &str, spec: &Composite, td: &TensorDict, prefix: Option<&str>) -> Result<()> {
    for (k, leaf) in spec.leaves() {
        let full = match prefix {
            Some(p) => k.prefixed(p),
            None => k.clone(),
        };
        let Some(v) = td.get(&k) else {
            return Err(spec_err(
                full.to_string(),
                leaf.to_string(),
                format!("the {name} spec declares it but the last step has no such entry"),
            ));
        };
        if let Err(e) = leaf.check(&crate::tensordict::Entry::Tensor(v.shallow_clone()), &k) {
            let reason = match e {
                Error::NotInSpec { reason, .. } => reason,
                other => other.to_string(),
            };
            return Err(spec_err(
                full.to_string(),
                leaf.to_string(),
                format!(
                    "{name} spec check failed on the last step (value shape {}, dtype {:?}): {reason}",
                    ShapeFmt(&v.size()),
                    v.kind()
                ),
            ));
        }
    }
    Ok(())
}

/// Checks that a partial reset leaves the elements it does not select untouched: their
/// observations, and the env's hidden state behind them.
///
/// Runs the env twice from `seed`: reset, two random-action steps (`step_and_maybe_reset`),
/// then, in the first run only, a partial reset through [`EnvBase::maybe_reset`] whose
/// `"_reset"` masks select the elements of even flat index (every group's mask has its done
/// leaf's shape, `[*batch, 1]` by default), then one more random-action step. The elements of
/// odd flat index were not selected, so both runs must agree on them bit for bit: at the root
/// right after the reset, and in everything the next step writes under `"next"`
/// (observations, rewards, done flags). An env that re-samples every element's state in
/// `reset_impl` fails here even though the provided `reset` keeps the old *observations* of the
/// unselected elements: the next step starts from a state other than the one observed.
///
/// The env's generator ([`EnvCore::generator`](super::EnvCore)) is restored after the reset, so
/// the random actions and any noise a step draws from it are the same in both runs; an env with
/// other randomness in its step should be checked with deterministic dynamics. Envs with fewer
/// than two batch elements, with dynamic (`-1`) specs, or without done keys (so without a
/// `"_reset"` mask), or whose elements' outputs depend on each other
/// ([`EnvBase::couples_batch_elements`], e.g. under an updating `VecNorm`) have nothing to
/// check (`Ok`).
/// [`check_env_specs`] runs this check too.
///
/// ```
/// use torchrl::envs::builtin::PendulumEnv;
/// use torchrl::envs::check_partial_reset;
/// # fn main() -> torchrl::Result<()> {
/// let mut env = PendulumEnv::new(&[4], tch::Device::Cpu)?;
/// check_partial_reset(&mut env, 0)?; // the built-in envs reset only the masked elements
/// # Ok(()) }
/// ```
///
/// # Errors
/// [`Error::InvalidValue`] naming the first leaf (and how many unselected elements) that
/// differs between the two runs; any error of the env itself.
pub fn check_partial_reset<E: EnvBase + ?Sized>(env: &mut E, seed: u64) -> Result<()> {
    let specs = env.specs().clone();
    let batch = specs.batch_size().to_vec();
    let numel: i64 = batch.iter().product();
    // without a done group there is no "_reset" mask: a partial reset cannot be asked for
    let has_masks = env
        .core()
        .keys()
        .groups
        .iter()
        .any(|g| specs.done.contains(&g.done) || specs.done.contains(&g.terminated));
    if numel < 2 || has_dynamic_specs(&specs) || !has_masks || env.couples_batch_elements() {
        return Ok(());
    }
    // true where an element is NOT reset (odd flat index)
    let keep = tch::Tensor::f_arange(numel, (tch::Kind::Int64, tch::Device::Cpu))?
        .f_remainder(2)?
        .f_eq(1)?
        .f_reshape(&batch)?;
    let (root_a, next_a) = partial_reset_run(env, seed, Some(&keep))?;
    let (root_b, next_b) = partial_reset_run(env, seed, None)?;
    compare_kept("right after the partial reset", &root_a, &root_b, &keep)?;
    compare_kept(
        "in the step after the partial reset (\"next\")",
        &next_a,
        &next_b,
        &keep,
    )
}

/// One run of [`check_partial_reset`]: the root after the (optional) partial reset and the
/// `"next"` tensordict of the step that follows it.
fn partial_reset_run<E: EnvBase + ?Sized>(
    env: &mut E,
    seed: u64,
    keep: Option<&tch::Tensor>,
) -> Result<(TensorDict, TensorDict)> {
    env.set_seed(seed)?;
    let mut td = env.reset(None)?;
    for _ in 0..2 {
        td = env.rand_action(Some(td))?;
        let (_, root) = env.step_and_maybe_reset(td)?;
        td = root;
    }
    if let Some(keep) = keep {
        let reset = keep.f_logical_not()?;
        let groups = env.core().keys().groups.clone();
        for g in &groups {
            let Some(spec) = env
                .specs()
                .done
                .get(&g.done)
                .or_else(|| env.specs().done.get(&g.terminated))
            else {
                continue;
            };
            let shape = spec.shape().to_vec();
            let mut m = reset.shallow_clone();
            while m.dim() < shape.len() {
                m = m.f_unsqueeze(-1)?;
            }
            let m = m
                .f_expand(&shape, false)?
                .f_to_device(env.device())?
                .f_contiguous()?;
            td.set(&g.reset, m)?;
        }
        let generator = env.core().generator.clone();
        td = env.maybe_reset(td)?;
        env.core_mut().generator = generator;
    }
    let root = td.clone();
    let td = env.rand_action(Some(td))?;
    let stepped = env.step(td)?;
    let next = stepped.get_dict("next").cloned().unwrap_or(stepped.empty());
    Ok((root, next))
}

/// Errors when a leaf present in both `a` and `b` differs on an element where `keep` is true.
fn compare_kept(when: &str, a: &TensorDict, b: &TensorDict, keep: &tch::Tensor) -> Result<()> {
    let nb = keep.dim();
    for (k, x) in a.leaves() {
        let Some(y) = b.get(&k) else { continue };
        if x.size() != y.size() || x.size().get(..nb) != Some(keep.size().as_slice()) {
            continue;
        }
        let mut diff = x.f_ne_tensor(&y.f_to_kind(x.kind())?)?;
        while diff.dim() > nb {
            diff = diff.f_any_dim(-1, false)?;
        }
        let bad = diff.f_to_device(tch::Device::Cpu)?.f_logical_and(keep)?;
        let count = bad.f_sum(tch::Kind::Int64)?.f_int64_value(&[])?;
        if count > 0 {
            let first = bad
                .f_flatten(0, -1)?
                .f_nonzero()?
                .f_view([-1])?
                .f_int64_value(&[0])?;
            return Err(Error::value(
                "check_partial_reset",
                &k,
                "the same values as a run without the reset on every element the \"_reset\" mask \
                 did not select (reset_impl must reset only the masked elements and leave the \
                 others' state untouched; docs/custom_env.md)",
                format!("{count} unselected element(s) differ {when} (first: flat index {first})"),
            ));
        }
    }
    Ok(())
}
