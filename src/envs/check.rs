//! `check_env_specs`: proves that an environment keeps the contract its specs promise.
//!
//! It runs a short rollout (3 steps, with and without stopping on done) and compares it with
//! [`EnvBase::fake_tensordict`]: first the key sets (listing what is in one but not the other),
//! then shapes and dtypes leaf by leaf, then that the last step's values are contained in the
//! specs (actions, states, done flags and observations at the root; rewards, done flags and
//! observations under `"next"`). Each error names the key, the spec and the value.

use super::EnvBase;
use super::RolloutConfig;
use crate::data::specs::Composite;
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
/// reproducible). See the module docs for what is compared.
pub fn check_env_specs<E: EnvBase + ?Sized>(env: &mut E, seed: Option<u64>) -> Result<()> {
    if let Some(s) = seed {
        env.set_seed(s)?;
    }
    for break_when_any_done in [true, false] {
        let cfg = RolloutConfig {
            break_when_any_done: Some(break_when_any_done),
            ..Default::default()
        };
        let real = env.rollout(3, None, &cfg)?;
        check_against_fake(env, &real)?;
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
    // ("next", state key) entries are not part of the contract (TorchRL #3260).
    let state_next: Vec<NestedKey> = specs
        .state_keys()
        .iter()
        .map(|k| k.prefixed("next"))
        .collect();
    let full = real;
    let real = full.exclude(&state_next);
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
    let root_groups: [(&str, &Composite); 4] = [
        ("action", &specs.action),
        ("state", &specs.state),
        ("done", &specs.done),
        ("observation", &specs.observation),
    ];
    for (name, spec) in root_groups {
        check_group(name, spec, &last, None)?;
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
