//! `RenameTransform`: renames entries coming out of the env (`in_keys` → `out_keys`) and, with
//! inverse keys, entries going in (the policy writes `out_keys_inv`, the parent receives
//! `in_keys_inv`).
//!
//! - **Specs move with the keys**, within their group: a renamed reward stays a reward key, a
//!   renamed done flag a done key, a renamed observation an observation key; renamed inverse
//!   keys stay action (or state) keys. With [`RenameTransform::with_create_copy`] the entries
//!   are copied and the original keys stay (this is how to rename entries that something else
//!   still needs, e.g. `"reward"`).
//! - **Data.** `step`, `reset` (tolerating absent keys) and `forward` rename (or copy); the
//!   inverse renames the policy-side entries of the shallow copy the parent receives, so the
//!   caller's tensordict keeps its keys.
//! - **Errors.** In `new`: key lists of different lengths, a key listed twice, and a key that
//!   is both an in and an out key (the order would be unclear, as TorchRL says). When appended:
//!   an in key that is in no output spec (inverse: in neither the action nor the state spec), or
//!   an out key that already exists there. TorchRL ignores unknown keys in the specs and fails
//!   at the first step instead.
//!
//! A key may also name a nested level: the whole level is renamed, in every group that has
//! entries under it.
//!
//! ```
//! use torchrl::envs::builtin::CountingEnv;
//! use torchrl::envs::transforms::{RenameTransform, TransformedEnv};
//! use torchrl::{EnvBase, NestedKey, RolloutConfig};
//! # fn main() -> torchrl::Result<()> {
//! let mut env = TransformedEnv::new(CountingEnv::new(5, &[])?)?
//!     .with(RenameTransform::new(["observation", "reward"], ["stuff", "bonus"])?)?
//!     .with(RenameTransform::inverse(["action"], [("agent", "action")])?)?;
//! assert_eq!(env.reward_keys(), [NestedKey::from("bonus")]); // still a reward
//! assert_eq!(env.action_keys(), [NestedKey::from(("agent", "action"))]);
//! let traj = env.rollout(3, None, &RolloutConfig::default())?;
//! assert!(traj.contains(("next", "stuff")) && !traj.contains(("next", "observation")));
//! assert!(traj.contains(("agent", "action")) && !traj.contains("action"));
//! # Ok(()) }
//! ```

use super::reward_sum::{check_done_groups, refuse_state_keys};
use super::{input_keys_available, output_keys_available, Transform};
use crate::data::specs::Composite;
use crate::envs::{EnvSpecs, SpecGroup};
use crate::error::{Error, Result};
use crate::macros::setters;
use crate::tensordict::{collect_keys, fmt_key_list, Levels};
use crate::tensordict::{NestedKey, TensorDict};

const OP: &str = "RenameTransform";

/// Renames entries (and moves their specs). See the module docs.
pub struct RenameTransform {
    in_keys: Vec<NestedKey>,
    out_keys: Vec<NestedKey>,
    in_keys_inv: Vec<NestedKey>,
    out_keys_inv: Vec<NestedKey>,
    create_copy: bool,
}

/// The field of the out keys `check_lists` checks (`what` is `""` or `"inverse "`).
fn out_field(what: &str) -> &'static str {
    if what.is_empty() {
        "out_keys"
    } else {
        "out_keys_inv"
    }
}

/// Length, duplicate and overlap checks for one pair of key lists.
fn check_lists(ins: &[NestedKey], outs: &[NestedKey], what: &str) -> Result<()> {
    if ins.len() != outs.len() {
        return Err(Error::config(
            OP,
            out_field(what),
            format!(
                "as many {what}out_keys as {what}in_keys ({}: {}) (the number of {what}in_keys \
                 should match the number of {what}out_keys)",
                ins.len(),
                fmt_key_list(ins)
            ),
            format_args!("{}: {}", outs.len(), fmt_key_list(outs)),
        ));
    }
    for list in [ins, outs] {
        for (i, k) in list.iter().enumerate() {
            if list.iter().take(i).any(|x| x == k) {
                return Err(Error::value(
                    OP,
                    k,
                    "a key listed once",
                    format!("key {k} is listed twice in {}", fmt_key_list(list)),
                ));
            }
        }
    }
    let overlap: Vec<NestedKey> = outs.iter().filter(|k| ins.contains(k)).cloned().collect();
    if !overlap.is_empty() {
        return Err(Error::config(
            OP,
            out_field(what),
            format!(
                "{what}out keys distinct from the {what}in keys {} (cannot have matching \
                 {what}in and out keys because order is unclear; use separate transforms)",
                fmt_key_list(ins)
            ),
            format_args!(
                "out_keys {}, which also contain {}",
                fmt_key_list(outs),
                fmt_key_list(&overlap)
            ),
        ));
    }
    Ok(())
}

/// Moves (or copies) the entry `from` of `c` to `to`.
fn move_spec(c: &mut Composite, from: &NestedKey, to: &NestedKey, copy: bool) -> Result<()> {
    let entry = c.get(from).cloned();
    match entry {
        Some(spec) => c.set(to, spec)?,
        None => c.set_none(to)?,
    }
    if !copy {
        c.remove(from)?;
    }
    Ok(())
}

impl RenameTransform {
    /// Renames the output entries `in_keys` to `out_keys` (pairwise). Errors when the lists
    /// differ in length, repeat a key, or share a key.
    pub fn new<K1: Into<NestedKey>, K2: Into<NestedKey>>(
        in_keys: impl IntoIterator<Item = K1>,
        out_keys: impl IntoIterator<Item = K2>,
    ) -> Result<Self> {
        let (in_keys, out_keys) = (collect_keys(in_keys), collect_keys(out_keys));
        check_lists(&in_keys, &out_keys, "")?;
        Ok(RenameTransform {
            in_keys,
            out_keys,
            in_keys_inv: Vec::new(),
            out_keys_inv: Vec::new(),
            create_copy: false,
        })
    }

    /// Only inverse renames: the policy writes `out_keys_inv`, the parent receives
    /// `in_keys_inv` (TorchRL's `RenameTransform([], [], in_keys_inv, out_keys_inv)`).
    pub fn inverse<K1: Into<NestedKey>, K2: Into<NestedKey>>(
        in_keys_inv: impl IntoIterator<Item = K1>,
        out_keys_inv: impl IntoIterator<Item = K2>,
    ) -> Result<Self> {
        RenameTransform::new(Vec::<NestedKey>::new(), Vec::<NestedKey>::new())?
            .with_inverse(in_keys_inv, out_keys_inv)
    }

    /// Adds inverse renames (parent-side `in_keys_inv`, policy-side `out_keys_inv`); errors as
    /// [`RenameTransform::new`].
    pub fn with_inverse<K1: Into<NestedKey>, K2: Into<NestedKey>>(
        mut self,
        in_keys_inv: impl IntoIterator<Item = K1>,
        out_keys_inv: impl IntoIterator<Item = K2>,
    ) -> Result<Self> {
        let (ins, outs) = (collect_keys(in_keys_inv), collect_keys(out_keys_inv));
        check_lists(&ins, &outs, "inverse ")?;
        self.in_keys_inv = ins;
        self.out_keys_inv = outs;
        Ok(self)
    }

    /// The forward in keys.
    pub fn in_keys(&self) -> &[NestedKey] {
        &self.in_keys
    }

    /// The forward out keys.
    pub fn out_keys(&self) -> &[NestedKey] {
        &self.out_keys
    }

    /// Renames (or copies) `from` → `to` for each pair in `td`.
    fn rename<'a>(
        &self,
        td: &mut TensorDict,
        pairs: impl Iterator<Item = (&'a NestedKey, &'a NestedKey)>,
        tolerant: bool,
        op: &'static str,
    ) -> Result<()> {
        for (from, to) in pairs {
            let Some(entry) = td.get_entry(from).cloned() else {
                if tolerant {
                    continue;
                }
                return Err(td.key_not_found(op, from.to_string(), NestedKey::default()));
            };
            if self.create_copy {
                td.set(to, entry)?;
            } else {
                td.rename_key(from, to, crate::tensordict::IfExists::Overwrite)?;
            }
        }
        Ok(())
    }

    fn forward_pairs(&self) -> impl Iterator<Item = (&NestedKey, &NestedKey)> {
        self.in_keys.iter().zip(self.out_keys.iter())
    }

    /// Moves (or copies) the specs of each `from` key to its `to` key within `side`'s groups:
    /// refuses a `to` that exists, a `from` that does not, and renaming a state key away.
    fn rename_specs(
        &self,
        mut specs: EnvSpecs,
        pairs: &[(&NestedKey, &NestedKey)],
        side: &Side,
    ) -> Result<EnvSpecs> {
        for &(from, to) in pairs {
            if let Some(g) = side.groups.iter().find(|g| specs.group(**g).contains(to)) {
                return Err(Error::value(
                    OP,
                    to,
                    format!("a {} that is new ({})", side.out_key, side.on_collision),
                    format!(
                        "{}: {} {to} already exists in the {g} spec",
                        self.name(),
                        side.out_key
                    ),
                ));
            }
            let holders: Vec<SpecGroup> = side
                .groups
                .iter()
                .copied()
                .filter(|g| specs.group(*g).contains(from))
                .collect();
            if holders.is_empty() {
                return Err(Error::KeyNotFound {
                    op: side.lookup,
                    key: from.to_string(),
                    available: (side.available)(&specs),
                });
            }
            // A state key (StepCounter's count, RewardSum's sum) is read back by the env at the
            // next step under its name: renaming it away would break that step.
            if !self.create_copy {
                refuse_state_keys(
                    OP,
                    &self.name(),
                    &specs,
                    [from],
                    (
                        "a key other than a state key",
                        "copy it instead (with_create_copy(true))",
                    ),
                )?;
            }
            for g in holders {
                move_spec(specs.group_mut(g), from, to, self.create_copy)?;
            }
        }
        check_done_groups(OP, &self.name(), &specs)?;
        Ok(specs)
    }
}

setters!(RenameTransform {
    /// Copy instead of rename: the original entries (and specs) stay.
    with_create_copy(create_copy: bool);
});

/// The spec groups one direction of a rename works on, and its wording in errors.
struct Side {
    groups: &'static [SpecGroup],
    /// What the `to` keys are called ("out key", "inverse out key").
    out_key: &'static str,
    /// The advice when a `to` key exists already.
    on_collision: &'static str,
    /// The `op` of the error for a missing `from` key (where it was looked up).
    lookup: &'static str,
    /// The keys to list when a `from` key is missing.
    available: fn(&EnvSpecs) -> Vec<String>,
}

impl Transform for RenameTransform {
    fn name(&self) -> String {
        let mut s = format!(
            "RenameTransform(in_keys={}, out_keys={}",
            fmt_key_list(&self.in_keys),
            fmt_key_list(&self.out_keys)
        );
        if !self.in_keys_inv.is_empty() {
            s += &format!(
                ", in_keys_inv={}, out_keys_inv={}",
                fmt_key_list(&self.in_keys_inv),
                fmt_key_list(&self.out_keys_inv)
            );
        }
        if self.create_copy {
            s += ", create_copy";
        }
        s + ")"
    }

    fn new_output_keys(&self) -> Vec<NestedKey> {
        self.out_keys.clone()
    }

    fn transform_output_spec(&self, specs: EnvSpecs) -> Result<EnvSpecs> {
        let side = Side {
            groups: &[SpecGroup::Done, SpecGroup::Reward, SpecGroup::Observation],
            out_key: "out key",
            on_collision: "rename it away first or choose another name",
            lookup:
                "RenameTransform (in keys are looked up in the done, reward and observation specs)",
            available: output_keys_available,
        };
        let pairs: Vec<(&NestedKey, &NestedKey)> = self.forward_pairs().collect();
        self.rename_specs(specs, &pairs, &side)
    }

    fn transform_input_spec(&self, specs: EnvSpecs) -> Result<EnvSpecs> {
        let side = Side {
            groups: &[SpecGroup::Action, SpecGroup::State],
            out_key: "inverse out key",
            on_collision: "choose another name",
            lookup: "RenameTransform (inverse in keys are looked up in the action and state specs)",
            available: input_keys_available,
        };
        let pairs: Vec<(&NestedKey, &NestedKey)> =
            self.in_keys_inv.iter().zip(&self.out_keys_inv).collect();
        self.rename_specs(specs, &pairs, &side)
    }

    fn step(&mut self, _td: &TensorDict, mut next: TensorDict) -> Result<TensorDict> {
        self.rename(
            &mut next,
            self.forward_pairs(),
            false,
            "RenameTransform (step)",
        )?;
        Ok(next)
    }

    fn reset(&mut self, _td: &TensorDict, mut reset: TensorDict) -> Result<TensorDict> {
        self.rename(
            &mut reset,
            self.forward_pairs(),
            true,
            "RenameTransform (reset)",
        )?;
        Ok(reset)
    }

    fn inv(&mut self, mut td: TensorDict) -> Result<TensorDict> {
        let pairs = self.out_keys_inv.iter().zip(self.in_keys_inv.iter());
        self.rename(&mut td, pairs, false, "RenameTransform (inverse)")?;
        Ok(td)
    }

    fn forward(&mut self, mut td: TensorDict) -> Result<TensorDict> {
        self.rename(
            &mut td,
            self.forward_pairs(),
            false,
            "RenameTransform (forward)",
        )?;
        Ok(td)
    }
}
