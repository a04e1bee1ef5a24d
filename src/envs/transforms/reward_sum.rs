//! `RewardSum`: tracks the cumulative reward of the running episode.
//!
//! For every reward key `k` (by default every reward key of the parent env, discovered when the
//! transform joins it), the transform writes `episode_<k>` (same prefix, last segment renamed):
//! at reset it is zero (or kept, for batch elements whose `"_reset"` mask is false), and every
//! step adds the step's reward to the value it had at time `t`. The episode spec is a clone of
//! the reward leaf's spec when it is Unbounded, and an Unbounded spec of the same shape and dtype
//! otherwise (TorchRL clones a Bounded reward spec too, but a sum leaves the bounds); it is
//! registered in the observation spec (or in the reward spec with
//! [`RewardSum::with_reward_spec`]) and always in the state spec, as in TorchRL.
//!
//! Each reward key is paired with the done group that owns it (the deepest done group whose
//! prefix is a prefix of the reward key), whose `"_reset"` mask drives partial resets. TorchRL
//! pairs them by position; pairing by prefix gives the same result wherever TorchRL's check
//! accepts the pairing. Pass [`RewardSum::with_reset_keys`] to choose them yourself.
//!
//! **Offline data.** [`Transform::forward`] writes the cumulative sum of each reward along a time
//! dim. TorchRL finds that dim through the dim name `"time"`; tensordicts here have no dim names,
//! so give it with [`RewardSum::with_time_dim`] (an error names the fix when it is missing). Like
//! TorchRL, the sum does not restart at episode boundaries. (TorchRL 0.14.1 also subtracts one
//! from the named dim's index before summing, which sums along the wrong dim; we sum along the
//! dim given.)
//!
//! ```
//! use torchrl::envs::builtin::CountingEnv;
//! use torchrl::envs::transforms::{RewardSum, TransformedEnv};
//! use torchrl::envs::{EnvBase, RolloutConfig};
//! # fn main() -> torchrl::Result<()> {
//! // The counter terminates every 3 steps; the episode reward restarts after each reset.
//! let mut env = TransformedEnv::new(CountingEnv::new(3, &[])?)?.with(RewardSum::new())?;
//! assert!(env.specs().observation.contains("episode_reward"));
//! assert!(env.specs().state.contains("episode_reward"));
//! let traj = env.rollout(8, None, &RolloutConfig::no_break())?;
//! let sums = Vec::<f32>::try_from(traj.get_or_err(("next", "episode_reward"))?.reshape([-1]))?;
//! assert_eq!(sums, vec![1.0, 2.0, 3.0, 1.0, 2.0, 3.0, 1.0, 2.0]);
//! # Ok(()) }
//! ```

use tch::{Kind, Tensor};

use super::{attached, refuse_taken_key, Transform, OUTPUT_GROUPS};
use crate::data::specs::{Composite, TensorSpec, Unbounded};
use crate::envs::EnvSpecs;
use crate::error::{Error, Result, ShapeFmt};
use crate::macros::setters;
use crate::tensordict::{fmt_key_list, norm_dim, Entry, NestedKey, TensorDict};

// ------------------------------------------------------------------ helpers shared by the
// reward & episode transforms (step_counter, init_tracker, tensordict_primer)

/// The key without its last segment (`[]` for a one-segment key).
pub(super) fn parent_of(key: &NestedKey) -> NestedKey {
    key.parts()
        .take(key.len().saturating_sub(1))
        .collect::<Vec<_>>()
        .into()
}

/// The key with its last segment replaced by `leaf`.
pub(super) fn replace_last(key: &NestedKey, leaf: &str) -> NestedKey {
    parent_of(key).join(leaf)
}

/// The in-place rewrite of [`refuse_state_keys`]: `(expected, why)`.
pub(super) const IN_PLACE: (&str, &str) = (
    "an out key other than a state key (write to another out key)",
    "it cannot be rewritten in place",
);

/// Errors when a transform would rewrite an output entry that is also a state key
/// (StepCounter's counts, RewardSum's sums) in place, rename it or delete it: the env reads
/// state keys back at the next step, so the rewritten (or missing) value would feed the next
/// step. `keys` are the keys the transform would touch; the error ([`Error::InvalidValue`] on
/// the key) says what `who` needs instead and why not, `(expected, why)` (e.g. [`IN_PLACE`]).
pub(super) fn refuse_state_keys<'a>(
    op: &'static str,
    who: &str,
    specs: &EnvSpecs,
    keys: impl IntoIterator<Item = &'a NestedKey>,
    (expected, why): (&str, &str),
) -> Result<()> {
    let state = specs.state_keys();
    for k in keys {
        let hit: Vec<NestedKey> = state.iter().filter(|s| s.starts_with(k)).cloned().collect();
        if !hit.is_empty() {
            return Err(Error::value(
                op,
                k,
                format!("{who}: {expected}"),
                format!(
                    "a key that is (or holds) the state key(s) {}, which the env reads back at \
                     the next step; {why}",
                    fmt_key_list(&hit)
                ),
            ));
        }
    }
    Ok(())
}

/// Errors when a done group of `specs` holds `"done"` and `"truncated"` but no `"terminated"`
/// (what a transform leaves after renaming or removing `"terminated"` next to a truncation):
/// done completion refuses such data at every step, so the transform is refused when it joins.
pub(super) fn check_done_groups(op: &'static str, who: &str, specs: &EnvSpecs) -> Result<()> {
    for k in specs.done_keys() {
        if k.last() != Some("truncated") {
            continue;
        }
        let group = parent_of(&k);
        if specs.done.contains(group.join("done")) && !specs.done.contains(group.join("terminated"))
        {
            return Err(Error::InvalidValue {
                op,
                what: "spec",
                key: "done".to_string(),
                expected: "a \"terminated\" key in every done group that holds \"done\" and \
                           \"truncated\" (else terminations could no longer be told from \
                           truncations)"
                    .to_string(),
                got: format!(
                    "{who}: the done group of {k} would hold \"done\" and \"truncated\" but no \
                     \"terminated\" (done keys: {})",
                    fmt_key_list(&specs.done_keys())
                ),
            });
        }
    }
    Ok(())
}

/// The done groups that govern resets (TorchRL's `_filtered_reset_keys`), as prefixes: every
/// done-group prefix except those nested under another group's prefix.
pub(super) fn reset_roots(specs: &EnvSpecs) -> Vec<NestedKey> {
    let all = specs.done_group_prefixes();
    all.iter()
        .filter(|p| !all.iter().any(|q| q.len() < p.len() && p.starts_with(q)))
        .cloned()
        .collect()
}

/// The shape of the done leaves of the group at `prefix` (its `done` leaf, else any leaf of the
/// group).
/// The done groups (their `"_reset"` roots) of the parent, or an error naming what the
/// transform needs them for (`"to count steps for"`).
pub(super) fn required_reset_roots(
    specs: &EnvSpecs,
    op: &'static str,
    purpose: &str,
) -> Result<Vec<NestedKey>> {
    let roots = reset_roots(specs);
    if roots.is_empty() {
        return Err(Error::InvalidValue {
            op,
            what: "spec",
            key: "done".to_string(),
            expected: format!("a parent env with a done group {purpose}"),
            got: "a parent env with no done group".to_string(),
        });
    }
    Ok(roots)
}

pub(super) fn done_shape(
    specs: &EnvSpecs,
    prefix: &NestedKey,
    op: &'static str,
) -> Result<Vec<i64>> {
    if let Some(s) = specs.done.get(prefix.join("done")) {
        return Ok(s.shape().to_vec());
    }
    specs
        .done
        .leaves()
        .into_iter()
        .find(|(k, _)| k.len() == prefix.len() + 1 && k.starts_with(prefix))
        .map(|(_, s)| s.shape().to_vec())
        .ok_or_else(|| Error::InvalidValue {
            op,
            what: "done group",
            key: prefix.to_string(),
            expected: "a done spec with a leaf in the group".to_string(),
            got: format!(
                "no leaf in the group at prefix {prefix} (done keys: {})",
                fmt_key_list(&specs.done_keys())
            ),
        })
}

/// The `"_reset"` mask of the done group at `prefix` in `td`, as a bool tensor reduced to the
/// batch dims of the level that holds it (TorchRL's `_get_reset`); `None` when `td` has no mask
/// there, which means "reset everything".
pub(super) fn reset_mask(td: &TensorDict, prefix: &NestedKey) -> Result<Option<Tensor>> {
    let Some(m) = td.get(prefix.join("_reset")) else {
        return Ok(None);
    };
    let level_dims = if prefix.is_empty() {
        td.batch_dims()
    } else {
        td.get_dict(prefix)
            .map(TensorDict::batch_dims)
            .unwrap_or_else(|| td.batch_dims())
    };
    let mut m = m.f_to_kind(Kind::Bool)?;
    if m.dim() > level_dims {
        m = m.f_flatten(level_dims as i64, -1)?.f_any_dim(-1, false)?;
    }
    Ok(Some(m))
}

/// `mask` broadcast to `shape` by appending trailing singleton dims (TorchRL's
/// `expand_as_right`); errors naming `key` when it does not fit.
pub(super) fn expand_right(
    mask: &Tensor,
    shape: &[i64],
    op: &'static str,
    key: &NestedKey,
) -> Result<Tensor> {
    let ms = mask.size();
    let fits = ms.len() <= shape.len() && ms.iter().zip(shape).all(|(m, s)| *m == *s || *m == 1);
    if !fits {
        return Err(Error::value(
            op,
            key,
            format!(
                "a \"_reset\" mask whose dims match the leading dims of the entry's shape {}",
                ShapeFmt(shape)
            ),
            format!(
                "a mask of shape {}, which cannot be expanded to it",
                ShapeFmt(&ms)
            ),
        ));
    }
    let mut m = mask.shallow_clone();
    while (m.dim()) < shape.len() {
        m = m.f_unsqueeze(-1)?;
    }
    Ok(m.f_expand(shape, false)?)
}

/// The spec of an episode sum of rewards with spec `reward`: the reward spec itself when it is
/// Unbounded (TorchRL clones it), an Unbounded spec of the same shape, dtype and device
/// otherwise. A sum of bounded rewards leaves the bounds after a few steps (TorchRL's clone of
/// a Bounded reward spec describes values the sum does not keep).
fn episode_spec(reward: TensorSpec) -> Result<TensorSpec> {
    match reward {
        TensorSpec::Unbounded(_) | TensorSpec::Composite(_) | TensorSpec::NonTensor(_) => {
            Ok(reward)
        }
        other => {
            let dtype = other.dtype().unwrap_or(tch::Kind::Float);
            let mut u = Unbounded::new()
                .with_shape(other.shape())?
                .with_dtype(dtype)?;
            if let Some(d) = other.device() {
                u = u.with_device(d)?;
            }
            Ok(u.into())
        }
    }
}

/// Sets `spec` at `key` in `target`, creating the missing intermediate levels as empty copies of
/// the matching levels of `like` (so a nested level keeps its own shape, e.g. an agent dim), or
/// with the parent level's shape when `like` has none.
pub(super) fn set_like(
    target: &mut Composite,
    like: &Composite,
    key: &NestedKey,
    spec: TensorSpec,
) -> Result<()> {
    let parts: Vec<&str> = key.parts().collect();
    for depth in 1..parts.len() {
        let level: NestedKey = parts.iter().take(depth).copied().collect::<Vec<_>>().into();
        if target.contains(&level) {
            continue;
        }
        if let Some(TensorSpec::Composite(c)) = like.get(&level) {
            target.set(&level, c.empty())?;
        }
    }
    target.set(key, spec)
}

// ------------------------------------------------------------------ RewardSum

/// One reward key tracked by [`RewardSum`], resolved when the transform joins an env.
#[derive(Clone, Debug)]
struct Slot {
    input: NestedKey,
    output: NestedKey,
    /// Prefix of the done group whose `"_reset"` mask resets this sum.
    root: NestedKey,
    /// The reward leaf's spec (its zero is the sum at a first reset).
    spec: TensorSpec,
}

/// Sums rewards over the running episode into `episode_<reward>`. See the module docs.
#[derive(Clone, Debug, Default)]
pub struct RewardSum {
    in_keys: Option<Vec<NestedKey>>,
    out_keys: Option<Vec<NestedKey>>,
    reset_keys: Option<Vec<NestedKey>>,
    reward_spec: bool,
    time_dim: Option<i64>,
    slots: Vec<Slot>,
}

impl RewardSum {
    /// Sums every reward key of the parent env into `episode_<name>` entries of the observation
    /// (and state) spec.
    pub fn new() -> Self {
        RewardSum::default()
    }

    /// The (in, out) key pairs: resolved ones once attached, else from the configuration (in keys
    /// default to `["reward"]` without an env, as in TorchRL).
    fn pairs(&self) -> Result<Vec<(NestedKey, NestedKey)>> {
        if !self.slots.is_empty() {
            return Ok(self
                .slots
                .iter()
                .map(|s| (s.input.clone(), s.output.clone()))
                .collect());
        }
        let ins = self
            .in_keys
            .clone()
            .unwrap_or_else(|| vec![NestedKey::from("reward")]);
        let outs = self.out_keys_for(&ins)?;
        Ok(ins.into_iter().zip(outs).collect())
    }

    fn out_keys_for(&self, ins: &[NestedKey]) -> Result<Vec<NestedKey>> {
        match &self.out_keys {
            Some(outs) => {
                if outs.len() != ins.len() {
                    return Err(Error::config(
                        "RewardSum",
                        "out_keys",
                        format!(
                            "one out key per in key {} (RewardSum expects the same number of \
                             input and output keys)",
                            fmt_key_list(ins)
                        ),
                        fmt_key_list(outs),
                    ));
                }
                Ok(outs.clone())
            }
            None => Ok(ins
                .iter()
                .map(|k| replace_last(k, &format!("episode_{}", k.last().unwrap_or("reward"))))
                .collect()),
        }
    }

    fn episode_specs(&self, specs: &EnvSpecs) -> Result<Vec<(NestedKey, TensorSpec)>> {
        self.slots
            .iter()
            .map(|s| {
                let spec = specs.reward.get(&s.input).cloned().ok_or_else(|| {
                    Error::value(
                        "RewardSum",
                        &s.input,
                        "an in key of the reward spec",
                        format!(
                            "a key that is not in the reward spec (reward keys: {})",
                            fmt_key_list(&specs.reward_keys())
                        ),
                    )
                })?;
                Ok((s.output.clone(), episode_spec(spec)?))
            })
            .collect()
    }
}

setters!(RewardSum {
    /// Registers the episode sums in the reward spec instead of the observation spec (TorchRL's
    /// `reward_spec=True`); they are then reward keys.
    with_reward_spec(reward_spec: bool);
    /// The batch dim of offline tensordicts that is time, for [`Transform::forward`] (negative
    /// values count from the last batch dim).
    with_time_dim(dim: i64) => time_dim = Some(dim);

    /// The reward keys to sum (default: every reward key of the parent env). Each must be a leaf
    /// of the parent's reward spec (checked when the transform joins an env).
    with_in_keys(keys) => in_keys [Some];
    /// The keys the sums are written to, one per in key (default: each in key with its last
    /// segment `name` replaced by `episode_<name>`).
    with_out_keys(keys) => out_keys [Some];
    /// The `"_reset"` keys (e.g. `"_reset"`, `("agents", "_reset")`) whose masks reset each sum:
    /// one for all in keys, or one per in key (default: the done group that owns each reward).
    with_reset_keys(keys) => reset_keys [Some];
});

impl Transform for RewardSum {
    fn name(&self) -> String {
        match self.pairs() {
            Ok(p) => {
                let (i, o): (Vec<NestedKey>, Vec<NestedKey>) = p.into_iter().unzip();
                format!(
                    "RewardSum(in_keys={}, out_keys={})",
                    fmt_key_list(&i),
                    fmt_key_list(&o)
                )
            }
            Err(_) => "RewardSum(<mismatched keys>)".into(),
        }
    }

    fn attach(&mut self, parent: &EnvSpecs) -> Result<()> {
        let op = "RewardSum::attach";
        let ins = match &self.in_keys {
            Some(k) => k.clone(),
            None => parent.reward_keys(),
        };
        if ins.is_empty() {
            return Err(Error::InvalidValue {
                op,
                what: "spec",
                key: "reward".to_string(),
                expected: "at least one reward key to sum".to_string(),
                got: "an empty reward spec (the parent env has no reward key to sum)".to_string(),
            });
        }
        let outs = self.out_keys_for(&ins)?;
        let roots = reset_roots(parent);
        let explicit_roots: Option<Vec<NestedKey>> = match &self.reset_keys {
            None => None,
            Some(keys) => {
                if keys.len() != 1 && keys.len() != ins.len() {
                    return Err(Error::config(
                        op,
                        "reset_keys",
                        format!(
                            "one reset key for all, or one per in key (in keys {})",
                            fmt_key_list(&ins)
                        ),
                        fmt_key_list(keys),
                    ));
                }
                let mut out = Vec::with_capacity(keys.len());
                for k in keys {
                    if k.last() != Some("_reset") {
                        return Err(Error::value(
                            op,
                            k,
                            "a reset key that ends with \"_reset\"",
                            "a key with another last segment",
                        ));
                    }
                    out.push(parent_of(k));
                }
                Some(out)
            }
        };
        let mut slots = Vec::with_capacity(ins.len());
        for (i, (input, output)) in ins.iter().zip(&outs).enumerate() {
            let spec = parent.reward.get(input).cloned().ok_or_else(|| {
                Error::value(
                    op,
                    input,
                    "an in key of the reward spec",
                    format!(
                        "a key that is not in the reward spec (reward keys: {})",
                        fmt_key_list(&parent.reward_keys())
                    ),
                )
            })?;
            if spec.is_composite() {
                return Err(Error::value(
                    op,
                    input,
                    "an in key naming a leaf of the reward spec",
                    "a nested level of the reward spec",
                ));
            }
            if output == input {
                return Err(Error::value(
                    op,
                    output,
                    "an out key other than the in key",
                    "the in key itself; choose another out key",
                ));
            }
            refuse_taken_key(
                op,
                parent,
                &OUTPUT_GROUPS,
                output,
                "an out key that is new to the parent's specs",
            )?;
            let root = match &explicit_roots {
                Some(r) => r.get(i).or_else(|| r.first()).cloned().unwrap_or_default(),
                None => roots
                    .iter()
                    .filter(|r| r.len() < input.len() && input.starts_with(r))
                    .max_by_key(|r| r.len())
                    .cloned()
                    .ok_or_else(|| {
                        Error::value(
                            op,
                            input,
                            format!(
                                "a reward key inside a done group (reset keys: {}), or reset keys \
                                 passed with RewardSum::with_reset_keys",
                                fmt_key_list(&parent.reset_keys())
                            ),
                            "a key that matches no done group (could not match the reward key \
                             with a done group)",
                        )
                    })?,
            };
            slots.push(Slot {
                input: input.clone(),
                output: output.clone(),
                root,
                spec,
            });
        }
        self.slots = slots;
        Ok(())
    }

    fn new_output_keys(&self) -> Vec<NestedKey> {
        self.slots.iter().map(|s| s.output.clone()).collect()
    }

    fn transform_output_spec(&self, mut specs: EnvSpecs) -> Result<EnvSpecs> {
        let like = specs.reward.clone();
        for (key, spec) in self.episode_specs(&specs)? {
            if self.reward_spec {
                set_like(&mut specs.reward, &like, &key, spec)?;
            } else {
                set_like(&mut specs.observation, &like, &key, spec)?;
            }
        }
        Ok(specs)
    }

    fn transform_input_spec(&self, mut specs: EnvSpecs) -> Result<EnvSpecs> {
        let like = specs.reward.clone();
        for (key, spec) in self.episode_specs(&specs)? {
            set_like(&mut specs.state, &like, &key, spec)?;
        }
        Ok(specs)
    }

    fn step(&mut self, td: &TensorDict, mut next: TensorDict) -> Result<TensorDict> {
        for s in attached("RewardSum::step", self, &self.slots)? {
            let reward = next.get(&s.input).ok_or_else(|| {
                Error::value(
                    "RewardSum::step",
                    &s.input,
                    "a reward in the step's output",
                    format!(
                        "nothing: the reward is missing (keys: {})",
                        fmt_key_list(&next.keys(crate::tensordict::KeysOptions::nested_leaves()))
                    ),
                )
            })?;
            let sum = match td.get(&s.output) {
                Some(prev) => prev.f_add(reward)?,
                None => reward.copy(),
            };
            next.set(&s.output, sum)?;
        }
        Ok(next)
    }

    fn reset(&mut self, td: &TensorDict, mut reset: TensorDict) -> Result<TensorDict> {
        for s in attached("RewardSum::reset", self, &self.slots)? {
            let mask = reset_mask(td, &s.root)?;
            let value = match (td.get(&s.output), mask) {
                (Some(prev), Some(m)) => {
                    let m = expand_right(&m, &prev.size(), "RewardSum::reset", &s.output)?;
                    prev.f_masked_fill(&m, 0.0)?
                }
                (Some(prev), None) => prev.f_zeros_like()?,
                (None, _) => match s.spec.zero(&[])? {
                    Entry::Tensor(t) => t,
                    Entry::Dict(_) => {
                        return Err(Error::value(
                            "RewardSum::reset",
                            &s.input,
                            "a leaf spec",
                            "a Composite",
                        ))
                    }
                },
            };
            reset.set(&s.output, value)?;
        }
        Ok(reset)
    }

    fn forward(&mut self, mut td: TensorDict) -> Result<TensorDict> {
        let op = "RewardSum::forward";
        let Some(dim) = self.time_dim else {
            return Err(Error::config(
                op,
                "time_dim",
                "the time dim, which offline use needs: set it with \
                 RewardSum::with_time_dim(dim) (TorchRL looks for a dim named \"time\"; \
                 tensordicts here have no dim names)",
                "none",
            ));
        };
        let d = norm_dim(op, dim, td.batch_dims(), || {
            "batch dims (the time dim must be a batch dim)".into()
        })? as i64;
        for (input, output) in self.pairs()? {
            let r = td.get_or_err(&input)?;
            let kind = r.kind();
            let sum = r.f_cumsum(d, kind)?;
            td.set(&output, sum)?;
        }
        Ok(td)
    }
}
