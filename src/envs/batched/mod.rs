//! Batched environments: [`SerialEnv`] steps N copies of an env one after the other in the
//! calling thread; [`ParallelEnv`] gives each copy a worker thread. Both have batch size
//! `[N, *sub_batch]` and every spec gets a leading `N`; with the same seeds they give the same
//! rollouts as the single envs.
//!
//! ```
//! use torchrl::envs::batched::{ParallelEnv, SerialEnv};
//! use torchrl::envs::builtin::CountingEnv;
//! use torchrl::envs::{EnvBase, RolloutConfig};
//! # fn main() -> torchrl::Result<()> {
//! let mut serial = SerialEnv::new((0..3).map(|_| CountingEnv::new(5, &[])).collect::<Result<_, _>>()?)?;
//! let a = serial.rollout(7, None, &RolloutConfig::no_break())?;
//! assert_eq!(a.batch_size(), &[3, 7]);
//! let mut parallel = ParallelEnv::new((0..3).map(|_| CountingEnv::new(5, &[])).collect::<Result<_, _>>()?)?;
//! let b = parallel.rollout(7, None, &RolloutConfig::no_break())?;
//! assert!(a.get_or_err("observation")?.equal(b.get_or_err("observation")?));
//! # Ok(()) }
//! ```

mod parallel;
mod serial;

pub use parallel::ParallelEnv;
pub use serial::SerialEnv;

use tch::Kind;

use super::{EnvBase, EnvSpecs};
use crate::error::{Error, Result};
use crate::tensordict::{stack, TensorDict};

/// The specs of N copies of `sub`: every group gets a leading dim `n`.
pub(crate) fn batched_specs(sub: &EnvSpecs, n: usize) -> Result<EnvSpecs> {
    let mut shape = vec![n as i64];
    shape.extend_from_slice(sub.batch_size());
    let mut out = EnvSpecs::new(&shape)?.with_device(sub.device())?;
    let expand = |c: &crate::data::specs::Composite| -> Result<crate::data::specs::Composite> {
        let mut e = c.unsqueeze(0)?.expand(&shape)?;
        e.unlock();
        Ok(e)
    };
    out.observation = expand(&sub.observation)?;
    out.reward = expand(&sub.reward)?;
    out.done = expand(&sub.done)?;
    out.action = expand(&sub.action)?;
    out.state = expand(&sub.state)?;
    Ok(out)
}

/// Checks that every sub-env has the same specs; returns them.
pub(crate) fn common_specs<E: EnvBase>(envs: &[E]) -> Result<EnvSpecs> {
    let first = envs.first().ok_or_else(|| {
        Error::argument(
            "SerialEnv::new",
            "envs",
            "at least one env (a batched env needs at least one env)",
            "none",
        )
    })?;
    let specs = first.specs().clone();
    if let Some((i, _)) = envs.iter().enumerate().find(|(_, e)| e.specs() != &specs) {
        return Err(Error::InvalidValue {
            op: "SerialEnv::new",
            what: "env",
            key: i.to_string(),
            expected: "the specs of env 0 (batched envs need identical sub-envs)".to_string(),
            got: format!("env {i} has specs that differ from env 0's"),
        });
    }
    Ok(specs)
}

/// Per-worker slices of a batched tensordict (views along dim 0).
pub(crate) fn split_workers(td: &TensorDict) -> Result<Vec<TensorDict>> {
    td.unbind(0)
}

/// Which workers a reset touches: those whose slice of the root `"_reset"` mask has a true
/// entry (all of them when there is no mask).
pub(crate) fn workers_to_reset(td: Option<&TensorDict>, n: usize) -> Result<Vec<bool>> {
    let Some(mask) = td.and_then(|t| t.get("_reset")) else {
        return Ok(vec![true; n]);
    };
    let m = mask
        .f_to_kind(Kind::Bool)?
        .f_reshape([n as i64, -1])?
        .f_any_dim(1, false)?;
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        out.push(m.f_get(i as i64)?.int64_value(&[]) != 0);
    }
    Ok(out)
}

/// Stacks per-worker reset outputs; workers that were not reset get zeros shaped like a reset
/// output (the provided `reset` keeps their previous values through the mask).
pub(crate) fn stack_resets(outs: Vec<Option<TensorDict>>) -> Result<TensorDict> {
    let template = outs
        .iter()
        .flatten()
        .next()
        .ok_or_else(|| Error::invalid("reset", "no worker was reset"))?
        .apply(|t| Ok(Some(t.f_zeros_like()?)))?;
    let filled: Vec<TensorDict> = outs
        .into_iter()
        .map(|o| o.unwrap_or_else(|| template.clone()))
        .collect();
    stack(&filled, 0)
}
