//! `EnvKeys`: an environment's key lists, computed once from its specs (TorchRL caches them
//! too), so that stepping never re-derives them.

use super::EnvSpecs;
use crate::data::specs::TensorSpec;
use crate::tensordict::NestedKey;

/// One done group: the `done`/`terminated`/`truncated` leaves under one prefix.
#[derive(Clone, Debug)]
pub(crate) struct DoneGroup {
    pub done: NestedKey,
    pub terminated: NestedKey,
    pub truncated: NestedKey,
    pub reset: NestedKey,
    pub has_done: bool,
    pub has_terminated: bool,
}

/// The key lists of an environment, TorchRL-ordered (by depth, then name).
#[derive(Clone, Debug, Default)]
pub struct EnvKeys {
    /// Action leaf keys.
    pub action: Vec<NestedKey>,
    /// Reward leaf keys.
    pub reward: Vec<NestedKey>,
    /// Done leaf keys.
    pub done: Vec<NestedKey>,
    /// Observation leaf keys.
    pub observation: Vec<NestedKey>,
    /// State leaf keys.
    pub state: Vec<NestedKey>,
    /// One `(*prefix, "_reset")` key per done group.
    pub reset: Vec<NestedKey>,
    pub(crate) groups: Vec<DoneGroup>,
    /// Reward keys with their spec shapes: step outputs are reshaped to a fixed shape, and
    /// checked against one with dynamic (`-1`) dims.
    pub(crate) reward_shapes: Vec<(NestedKey, Vec<i64>)>,
    /// Reward keys that `step_mdp` drops (those that are not also state keys).
    pub(crate) mdp_rewards: Vec<NestedKey>,
    /// Done leaves with their specs (missing ones are filled with zeros).
    pub(crate) done_specs: Vec<(NestedKey, TensorSpec)>,
    /// `done` and `truncated` leaves: the ones that end an episode in a rollout.
    pub(crate) stop: Vec<NestedKey>,
    /// Action leaves with a dtype, with their spec: what `step` checks the actions against.
    pub(crate) action_specs: Vec<(NestedKey, TensorSpec)>,
}

impl EnvKeys {
    /// Derives every key list from `specs`.
    pub fn from_specs(specs: &EnvSpecs) -> Self {
        let state = specs.state_keys();
        let reward = specs.reward_keys();
        let done = specs.done_keys();
        let groups = specs
            .done_group_prefixes()
            .into_iter()
            .map(|p| {
                let (d, t) = (p.join("done"), p.join("terminated"));
                DoneGroup {
                    has_done: specs.done.contains(&d),
                    has_terminated: specs.done.contains(&t),
                    done: d,
                    terminated: t,
                    truncated: p.join("truncated"),
                    reset: p.join("_reset"),
                }
            })
            .collect();
        EnvKeys {
            action_specs: specs
                .action
                .leaves()
                .into_iter()
                .filter(|(_, s)| s.dtype().is_some())
                .map(|(k, s)| (k, s.clone()))
                .collect(),
            action: specs.action_keys(),
            observation: specs.observation_keys(),
            reset: specs.reset_keys(),
            groups,
            reward_shapes: reward
                .iter()
                .filter_map(|k| specs.reward.get(k).map(|s| (k.clone(), s.shape().to_vec())))
                .collect(),
            mdp_rewards: reward
                .iter()
                .filter(|k| !state.contains(k))
                .cloned()
                .collect(),
            done_specs: specs
                .done
                .leaves()
                .into_iter()
                .map(|(k, s)| (k, s.clone()))
                .collect(),
            stop: done
                .iter()
                .filter(|k| matches!(k.last(), Some("done") | Some("truncated")))
                .cloned()
                .collect(),
            reward,
            done,
            state,
        }
    }
}
