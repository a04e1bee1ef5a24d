//! Data-parallel training without `#[cfg]` in trainer code: the [`Collective`] trait is what a
//! trainer needs from a group of cooperating processes (rank, world size, a sum all-reduce, a
//! broadcast, a barrier, and helpers built on them), implemented by [`SingleProcess`] (a world
//! of one, the default: every call is a no-op) and, with the cargo feature `distributed`, by
//! [`crate::distributed::ProcessGroup`] (c10d Gloo). Trainers hold a [`SharedCollective`]
//! (a cloneable handle), so the same trainer code runs in one process and in N.
//!
//! # What a data-parallel trainer does with it
//! - at attach time, **broadcasts** rank 0's parameters ([`Collective::broadcast_parameters`]);
//! - per optimizer step, **sums** every rank's gradients after each rank divided its local
//!   masked sums by the **global** token count (so the sum is the gradient of the mean over all
//!   ranks' tokens, exactly as one process on the concatenated batch), then clips the global
//!   norm and steps: the gradients are identical on every rank, so are the steps. The sums run
//!   during backward where the group offers a [`GradientSync`] ([`Collective::gradient_sync`]:
//!   c10d's DDP reducer for `ProcessGroup`), else after it
//!   ([`Collective::all_reduce_sum_gradients`]);
//! - computes **global statistics** where trlX does ([`Collective::all_reduce_moments`] for the
//!   running moments of scores, sums of `(Σx, n)` and `Σ(x − mean)²` for whitening,
//!   [`Collective::mean_over_ranks`] for the KL controller's mean KL);
//! - writes checkpoints and runs logging callbacks on the main rank only, with
//!   [`Collective::check_all_ok`] as the barrier after them.
//!
//! The rules are c10d's: every rank makes every call, in the same order, with tensors of the
//! same shape and dtype.
//!
//! ```
//! use tch::Tensor;
//! use torchrl::objectives::llm::moments::BatchMoments;
//! use torchrl::trainers::parallel::{Collective, SharedCollective, SingleProcess};
//! # fn main() -> torchrl::Result<()> {
//! let c = SharedCollective::new(SingleProcess);
//! assert_eq!((c.rank(), c.world_size(), c.is_main()), (0, 1, true));
//! let mut g = Tensor::from_slice(&[1.0f64, 2.0]);
//! c.all_reduce_sum(&mut g)?; // one rank: unchanged
//! assert_eq!(Vec::<f64>::try_from(&g).unwrap(), vec![1.0, 2.0]);
//! let local = BatchMoments::of(&Tensor::from_slice(&[1.0f64, 3.0]))?;
//! assert_eq!(c.all_reduce_moments(&local)?, local);
//! assert_eq!(c.mean_over_ranks(&Tensor::from_slice(&[1.0f64, 2.0, 6.0]))?, 3.0);
//! assert_eq!(c.sum_scalars(&[4.0, 0.5])?, vec![4.0, 0.5]);
//! c.check_all_ok("save", true)?;
//! # Ok(()) }
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex};

#[cfg(feature = "distributed")]
use tch::Device;
use tch::{Kind, Tensor};

use super::config::TrainConfig;
use super::optim::AdamW;
use crate::envs::llm::moments::BatchMoments;
use crate::error::{Error, Result};

pub use super::optim::GradientSync;

/// What a data-parallel trainer needs from a group of processes. See the [module docs](self).
///
/// Required: [`rank`](Self::rank), [`world_size`](Self::world_size),
/// [`all_reduce_sum`](Self::all_reduce_sum), [`broadcast`](Self::broadcast),
/// [`barrier`](Self::barrier). The rest are provided in terms of those (an implementation may
/// override them with bucketed or gathered versions, as `ProcessGroup` does).
///
/// Every method is a collective: every rank must call it, in the same order.
pub trait Collective: Send {
    /// This process's rank, in `0..world_size`.
    fn rank(&self) -> usize;

    /// The number of processes.
    fn world_size(&self) -> usize;

    /// Whether this is rank 0 (the one that writes checkpoints and logs).
    fn is_main(&self) -> bool {
        self.rank() == 0
    }

    /// Sums `tensor` over the ranks, in place (any device; the result is on every rank).
    ///
    /// # Errors
    /// When a peer failed or did not arrive within the timeout, or the tensor is refused.
    fn all_reduce_sum(&self, tensor: &mut Tensor) -> Result<()>;

    /// Copies rank `src`'s `tensor` into every rank's, in place.
    ///
    /// # Errors
    /// As [`Self::all_reduce_sum`]; when `src` is not below the world size.
    fn broadcast(&self, tensor: &mut Tensor, src: usize) -> Result<()>;

    /// Waits until every rank arrives.
    ///
    /// # Errors
    /// As [`Self::all_reduce_sum`].
    fn barrier(&self) -> Result<()>;

    /// The moments of every rank's values together (trlX's `get_global_statistics`: the sum
    /// and the count are summed, then the squared deviations from the global mean), identical
    /// on every rank. The provided version makes two sum all-reduces; a world of one returns
    /// `local` unchanged.
    ///
    /// # Errors
    /// As [`Self::all_reduce_sum`]; when the global moments are invalid (not finite).
    fn all_reduce_moments(&self, local: &BatchMoments) -> Result<BatchMoments> {
        if self.world_size() == 1 {
            return Ok(*local);
        }
        let mut s = Tensor::from_slice(&[local.count(), local.count() * local.mean()]);
        self.all_reduce_sum(&mut s)?;
        let v = Vec::<f64>::try_from(&s)?;
        let (n, sum) = (
            v.first().copied().unwrap_or(0.0),
            v.get(1).copied().unwrap_or(0.0),
        );
        let mean = sum / n;
        let d = local.mean() - mean;
        let mut m2 = Tensor::from_slice(&[local.m2() + local.count() * d * d]);
        self.all_reduce_sum(&mut m2)?;
        BatchMoments::new(n, mean, m2.f_double_value(&[0])?)
    }

    /// The mean of every rank's `values` together (all elements, computed in `f64`): with one
    /// rank `values.mean()`, else `Σ_r Σ values_r / Σ_r numel_r` (one all-reduce).
    ///
    /// # Errors
    /// As [`Self::all_reduce_sum`]; when no rank has a value.
    fn mean_over_ranks(&self, values: &Tensor) -> Result<f64> {
        if self.world_size() == 1 {
            return Ok(values.f_mean(Kind::Double)?.f_double_value(&[])?);
        }
        let local = [
            values.f_sum(Kind::Double)?.f_double_value(&[])?,
            values.numel() as f64,
        ];
        let v = self.sum_scalars(&local)?;
        match v.as_slice() {
            [s, n] if *n > 0.0 => Ok(s / n),
            _ => Err(Error::argument(
                "Collective::mean_over_ranks",
                "values",
                "at least one value on some rank",
                "no value on any rank",
            )),
        }
    }

    /// Sums a few `f64` scalars over the ranks (one all-reduce) and returns them.
    ///
    /// # Errors
    /// As [`Self::all_reduce_sum`].
    fn sum_scalars(&self, values: &[f64]) -> Result<Vec<f64>> {
        if self.world_size() == 1 {
            return Ok(values.to_vec());
        }
        let mut t = Tensor::from_slice(values);
        self.all_reduce_sum(&mut t)?;
        Ok(Vec::<f64>::try_from(&t)?)
    }

    /// A barrier that also says whether every rank succeeded at `op` (one all-reduce of the
    /// failure count): `Ok` when every rank passed `ok = true`; an [`Error::Distributed`]
    /// naming `op` when another rank failed. A rank that failed itself (`ok = false`) gets
    /// `Ok` here and reports its own error. Used after rank-0-only work (a checkpoint save, an
    /// evaluation) so that no rank races ahead of it and a failure there stops every rank.
    ///
    /// # Errors
    /// As [`Self::all_reduce_sum`]; when another rank passed `ok = false`.
    fn check_all_ok(&self, op: &'static str, ok: bool) -> Result<()> {
        if self.world_size() == 1 {
            return Ok(());
        }
        let mine = if ok { 0.0 } else { 1.0 };
        let failed = self.sum_scalars(&[mine])?.first().copied().unwrap_or(0.0);
        if failed > mine {
            return Err(Error::Distributed {
                op,
                rank: self.rank(),
                world_size: self.world_size(),
                message: format!(
                    "{} other rank(s) failed at {op} (see their errors)",
                    (failed - mine).round()
                ),
            });
        }
        Ok(())
    }

    /// Copies rank `src`'s parameters into every rank's, in place under `no_grad` (sorted by
    /// name, so the order of `params` does not matter). The provided version broadcasts one
    /// tensor at a time.
    ///
    /// # Errors
    /// As [`Self::broadcast`]; on a repeated name.
    fn broadcast_parameters(&self, params: &[(String, Tensor)], src: usize) -> Result<()> {
        if self.world_size() == 1 {
            return check_src("Collective::broadcast_parameters", src, 1);
        }
        let _guard = tch::no_grad_guard();
        for (_, t) in sorted("Collective::broadcast_parameters", params)? {
            let mut h = t.shallow_clone();
            self.broadcast(&mut h, src)?;
        }
        Ok(())
    }

    /// Sums the gradients of `params` over the ranks, in place (parameters without a gradient
    /// are skipped; every rank must have gradients for the same parameters). The provided
    /// version reduces one gradient at a time.
    ///
    /// # Errors
    /// As [`Self::all_reduce_sum`]; on a repeated name.
    fn all_reduce_sum_gradients(&self, params: &[(String, Tensor)]) -> Result<()> {
        if self.world_size() == 1 {
            return Ok(());
        }
        let _guard = tch::no_grad_guard();
        for (_, p) in sorted("Collective::all_reduce_sum_gradients", params)? {
            let mut g = p.f_grad()?;
            if g.defined() {
                self.all_reduce_sum(&mut g)?;
            }
        }
        Ok(())
    }

    /// A [`GradientSync`] for `params` that sums their gradients over the ranks **during**
    /// backward (overlapping the communication with the rest of the pass), or `None` when this
    /// group has none; the optimizer then calls [`Self::all_reduce_sum_gradients`] after
    /// backward instead ([`AdamW::set_gradient_sync`](super::optim::AdamW::set_gradient_sync)).
    /// The provided version returns `None`; `ProcessGroup` returns c10d's DDP reducer. It is a
    /// collective (the ranks' parameter layouts are checked).
    ///
    /// # Errors
    /// When the parameters cannot be hooked, or the ranks disagree on them.
    fn gradient_sync(&self, params: &[(String, Tensor)]) -> Result<Option<Box<dyn GradientSync>>> {
        let _ = params;
        Ok(None)
    }
}

fn check_src(op: &'static str, src: usize, world_size: usize) -> Result<()> {
    if src < world_size {
        return Ok(());
    }
    Err(Error::argument(
        op,
        "src",
        format!("a rank below the world size {world_size}"),
        src.to_string(),
    ))
}

/// `params` sorted by name; a repeated name is an error.
fn sorted<'a>(
    op: &'static str,
    params: &'a [(String, Tensor)],
) -> Result<Vec<(&'a str, &'a Tensor)>> {
    let mut map = BTreeMap::new();
    for (name, t) in params {
        if map.insert(name.as_str(), t).is_some() {
            return Err(Error::KeyExists {
                op,
                key: name.clone(),
            });
        }
    }
    Ok(map.into_iter().collect())
}

impl<C: Collective + ?Sized> Collective for Box<C> {
    fn rank(&self) -> usize {
        (**self).rank()
    }
    fn world_size(&self) -> usize {
        (**self).world_size()
    }
    fn is_main(&self) -> bool {
        (**self).is_main()
    }
    fn all_reduce_sum(&self, tensor: &mut Tensor) -> Result<()> {
        (**self).all_reduce_sum(tensor)
    }
    fn broadcast(&self, tensor: &mut Tensor, src: usize) -> Result<()> {
        (**self).broadcast(tensor, src)
    }
    fn barrier(&self) -> Result<()> {
        (**self).barrier()
    }
    fn all_reduce_moments(&self, local: &BatchMoments) -> Result<BatchMoments> {
        (**self).all_reduce_moments(local)
    }
    fn mean_over_ranks(&self, values: &Tensor) -> Result<f64> {
        (**self).mean_over_ranks(values)
    }
    fn sum_scalars(&self, values: &[f64]) -> Result<Vec<f64>> {
        (**self).sum_scalars(values)
    }
    fn check_all_ok(&self, op: &'static str, ok: bool) -> Result<()> {
        (**self).check_all_ok(op, ok)
    }
    fn broadcast_parameters(&self, params: &[(String, Tensor)], src: usize) -> Result<()> {
        (**self).broadcast_parameters(params, src)
    }
    fn all_reduce_sum_gradients(&self, params: &[(String, Tensor)]) -> Result<()> {
        (**self).all_reduce_sum_gradients(params)
    }
    fn gradient_sync(&self, params: &[(String, Tensor)]) -> Result<Option<Box<dyn GradientSync>>> {
        (**self).gradient_sync(params)
    }
}

/// A world of one process: rank 0 of 1, every collective a no-op (the default of every
/// trainer, so results are exactly those of the single-process code).
///
/// ```
/// use tch::Tensor;
/// use torchrl::trainers::parallel::{Collective, SingleProcess};
/// # fn main() -> torchrl::Result<()> {
/// let mut t = Tensor::from_slice(&[3.0f32]);
/// SingleProcess.broadcast(&mut t, 0)?;
/// assert_eq!(t.double_value(&[0]), 3.0);
/// assert!(SingleProcess.broadcast(&mut t, 1).is_err()); // no rank 1
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SingleProcess;

impl Collective for SingleProcess {
    fn rank(&self) -> usize {
        0
    }
    fn world_size(&self) -> usize {
        1
    }
    fn all_reduce_sum(&self, _tensor: &mut Tensor) -> Result<()> {
        Ok(())
    }
    fn broadcast(&self, _tensor: &mut Tensor, src: usize) -> Result<()> {
        check_src("SingleProcess::broadcast", src, 1)
    }
    fn barrier(&self) -> Result<()> {
        Ok(())
    }
}

/// A cloneable, thread-safe handle on one [`Collective`] (an `Arc<Mutex<Box<dyn
/// Collective>>>`), itself a `Collective`. A trainer holds one and hands clones to the parts
/// of its env that need global statistics (the score scaling's running moments), since c10d's
/// group is `Send` but not `Sync`. Rank and world size are cached, so they never lock.
///
/// ```
/// use torchrl::trainers::parallel::{Collective, SharedCollective, SingleProcess};
/// let c = SharedCollective::default();
/// let d = c.clone();
/// assert_eq!((d.rank(), d.world_size()), (0, 1));
/// assert_eq!(format!("{c:?}"), "SharedCollective { rank: 0, world_size: 1 }");
/// # let _ = SharedCollective::new(SingleProcess);
/// ```
#[derive(Clone)]
pub struct SharedCollective {
    inner: Arc<Mutex<Box<dyn Collective>>>,
    rank: usize,
    world_size: usize,
}

impl fmt::Debug for SharedCollective {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedCollective")
            .field("rank", &self.rank)
            .field("world_size", &self.world_size)
            .finish()
    }
}

impl Default for SharedCollective {
    /// A [`SingleProcess`].
    fn default() -> Self {
        SharedCollective::new(SingleProcess)
    }
}

impl SharedCollective {
    /// Wraps `collective` (a `ProcessGroup`, a [`SingleProcess`], a `Box<dyn Collective>`).
    pub fn new(collective: impl Collective + 'static) -> Self {
        let rank = collective.rank();
        let world_size = collective.world_size();
        SharedCollective {
            inner: Arc::new(Mutex::new(Box::new(collective))),
            rank,
            world_size,
        }
    }

    fn with<R>(&self, f: impl FnOnce(&dyn Collective) -> Result<R>) -> Result<R> {
        // A panic while the lock was held (in a collective) leaves the group in an unknown
        // state; the lock's data is still the group, and its next call reports what c10d says.
        let guard = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        f(guard.as_ref())
    }
}

impl Collective for SharedCollective {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world_size(&self) -> usize {
        self.world_size
    }
    fn all_reduce_sum(&self, tensor: &mut Tensor) -> Result<()> {
        self.with(|c| c.all_reduce_sum(tensor))
    }
    fn broadcast(&self, tensor: &mut Tensor, src: usize) -> Result<()> {
        self.with(|c| c.broadcast(tensor, src))
    }
    fn barrier(&self) -> Result<()> {
        self.with(|c| c.barrier())
    }
    fn all_reduce_moments(&self, local: &BatchMoments) -> Result<BatchMoments> {
        self.with(|c| c.all_reduce_moments(local))
    }
    fn mean_over_ranks(&self, values: &Tensor) -> Result<f64> {
        self.with(|c| c.mean_over_ranks(values))
    }
    fn sum_scalars(&self, values: &[f64]) -> Result<Vec<f64>> {
        self.with(|c| c.sum_scalars(values))
    }
    fn check_all_ok(&self, op: &'static str, ok: bool) -> Result<()> {
        self.with(|c| c.check_all_ok(op, ok))
    }
    fn broadcast_parameters(&self, params: &[(String, Tensor)], src: usize) -> Result<()> {
        self.with(|c| c.broadcast_parameters(params, src))
    }
    fn all_reduce_sum_gradients(&self, params: &[(String, Tensor)]) -> Result<()> {
        self.with(|c| c.all_reduce_sum_gradients(params))
    }
    fn gradient_sync(&self, params: &[(String, Tensor)]) -> Result<Option<Box<dyn GradientSync>>> {
        self.with(|c| c.gradient_sync(params))
    }
}

/// Every rank's `local` JSON value, in rank order, on every rank (an all-gather built from two
/// [`Collective::all_reduce_sum`]s over the values' UTF-8 bytes: their lengths, then the bytes,
/// each rank filling its own row). A collective call: every rank calls it once.
///
/// # Errors
/// When a collective fails, or a gathered row does not parse (a rank sent something else).
pub(crate) fn all_gather_json(
    c: &(impl Collective + ?Sized),
    local: &serde_json::Value,
) -> Result<Vec<serde_json::Value>> {
    let op = "all_gather_json";
    let bytes = serde_json::to_vec(local).map_err(|e| Error::invalid(op, e.to_string()))?;
    let (rank, world) = (c.rank(), c.world_size());
    let mut lens = Tensor::f_zeros([world as i64], (Kind::Int64, tch::Device::Cpu))?;
    let _ = lens.f_get(rank as i64)?.f_fill_(bytes.len() as i64)?;
    c.all_reduce_sum(&mut lens)?;
    let lens: Vec<i64> = Vec::<i64>::try_from(&lens)?;
    let width = lens.iter().copied().max().unwrap_or(0);
    let mut rows = Tensor::f_zeros([world as i64, width], (Kind::Int64, tch::Device::Cpu))?;
    let own: Vec<i64> = bytes.iter().map(|&b| i64::from(b)).collect();
    if !own.is_empty() {
        rows.f_get(rank as i64)?
            .f_narrow(0, 0, own.len() as i64)?
            .f_copy_(&Tensor::f_from_slice(&own)?)?;
    }
    c.all_reduce_sum(&mut rows)?;
    let mut out = Vec::with_capacity(world);
    for (r, &len) in lens.iter().enumerate() {
        let row: Vec<i64> = Vec::<i64>::try_from(&rows.f_get(r as i64)?.f_narrow(0, 0, len)?)?;
        let row: Vec<u8> = row.iter().map(|&b| b.clamp(0, 255) as u8).collect();
        out.push(serde_json::from_slice(&row).map_err(|e| {
            Error::invalid(
                op,
                format!("rank {r} sent a value that does not parse: {e}"),
            )
        })?);
    }
    Ok(out)
}

/// A per-rank seed derived from a run's seed: `seed` itself on rank 0 (so rank 0 of a
/// data-parallel run draws what a single-process run draws), a well-mixed different value on
/// every other rank (so the ranks' generators, and the rollouts they sample, differ).
///
/// ```
/// use torchrl::trainers::parallel::rank_seed;
/// assert_eq!(rank_seed(5, 0), 5);
/// assert_ne!(rank_seed(5, 1), rank_seed(5, 2));
/// assert_ne!(rank_seed(5, 1), 6);
/// ```
pub fn rank_seed(seed: u64, rank: usize) -> u64 {
    if rank == 0 {
        return seed;
    }
    // splitmix64 of (seed, rank)
    let mut z = seed ^ (rank as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// At attach time: errors on every rank unless every rank's `fields` (config values that
/// must agree for the ranks to make the same collective calls: batch sizes, step budgets,
/// intervals, …) equal rank 0's (one broadcast, then [`Collective::check_all_ok`]). The error
/// names each field that differs, with this rank's and rank 0's values. A world of one passes.
pub(crate) fn check_same_schedule(
    c: &dyn Collective,
    op: &'static str,
    fields: &[(&str, f64)],
) -> Result<()> {
    if c.world_size() == 1 {
        return Ok(());
    }
    let mine: Vec<f64> = fields.iter().map(|f| f.1).collect();
    let mut main = Tensor::f_from_slice(&mine)?;
    c.broadcast(&mut main, 0)?;
    let main = Vec::<f64>::try_from(&main)?;
    let differ: Vec<String> = fields
        .iter()
        .zip(&main)
        .filter(|((_, v), m)| v.to_bits() != m.to_bits())
        .map(|((name, v), m)| format!("{name} = {v} here, {m} on rank 0"))
        .collect();
    let same = differ.is_empty();
    let agreed = c.check_all_ok(op, same);
    if !same {
        return Err(Error::Distributed {
            op,
            rank: c.rank(),
            world_size: c.world_size(),
            message: format!(
                "every rank needs rank 0's training schedule: {}",
                differ.join(", ")
            ),
        });
    }
    agreed
}

/// Rank 0's `order` (a shuffled list of sample indices) on every rank: one broadcast; a world
/// of one returns it unchanged. Offline trainers (DPO, ILQL) step every rank through one order.
pub(crate) fn rank0_order(c: &dyn Collective, order: Vec<usize>) -> Result<Vec<usize>> {
    if c.world_size() == 1 {
        return Ok(order);
    }
    let ids: Vec<i64> = order.iter().map(|&i| i as i64).collect();
    let mut t = Tensor::f_from_slice(&ids)?;
    c.broadcast(&mut t, 0)?;
    Ok(Vec::<i64>::try_from(&t)?
        .into_iter()
        .map(|i| i as usize)
        .collect())
}

/// Rank `rank`'s slice of a global step `step` (`per_rank` entries each) and how many of them
/// count. In a short last step a rank may have none: it then gets the step's first entry as a
/// stand-in, to forward with weight 0 so that it still joins the gradient sum.
pub(crate) fn rank_slice(step: &[usize], rank: usize, per_rank: usize) -> (&[usize], usize) {
    let lo = (rank * per_rank).min(step.len());
    let hi = ((rank + 1) * per_rank).min(step.len());
    let range = if hi > lo { lo..hi } else { 0..1 };
    (step.get(range).unwrap_or(step), hi - lo)
}

/// The [`TrainConfig`] fields that decide how many collectives a trainer makes (batch size,
/// step budget, intervals, clip), named for [`check_same_schedule`]; trainers append their
/// method's.
pub(crate) fn train_schedule_fields(t: &TrainConfig) -> Vec<(&'static str, f64)> {
    vec![
        ("train.batch_size", t.batch_size as f64),
        ("train.epochs", t.epochs as f64),
        ("train.total_steps", t.total_steps as f64),
        ("train.log_interval", t.log_interval as f64),
        ("train.eval_interval", t.eval_interval as f64),
        ("train.checkpoint_interval", t.checkpoint_interval as f64),
        ("train.max_grad_norm", t.max_grad_norm.unwrap_or(-1.0)),
    ]
}

/// What every trainer's `with_collective` does first: [`check_same_schedule`] on `fields`,
/// rank 0's values broadcast into each of `params` (e.g. the policy and the frozen reference),
/// and the group's [`GradientSync`] attached to `opt` (gradients summed during backward where
/// the group offers it).
pub(crate) fn join_group(
    c: &SharedCollective,
    op: &'static str,
    fields: &[(&str, f64)],
    params: &[&[(String, Tensor)]],
    opt: &mut AdamW,
) -> Result<()> {
    check_same_schedule(c, op, fields)?;
    for p in params {
        c.broadcast_parameters(p, 0)?;
    }
    opt.set_gradient_sync(c.gradient_sync(&opt.named_params())?);
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// ProcessGroup
// ---------------------------------------------------------------------------------------------

/// Runs `f` on a contiguous tensor on `device` (the group's: the CPU for Gloo, the rank's GPU
/// for NCCL) holding `tensor`'s values (`tensor` itself when it is one), then copies the
/// result back.
#[cfg(feature = "distributed")]
fn on_device(
    tensor: &mut Tensor,
    device: Device,
    f: impl FnOnce(&mut Tensor) -> Result<()>,
) -> Result<()> {
    if tensor.device() == device && tensor.is_contiguous() {
        return f(tensor);
    }
    let _guard = tch::no_grad_guard();
    let mut there = tensor.f_to_device(device)?.f_contiguous()?;
    f(&mut there)?;
    tensor.f_copy_(&there)?;
    Ok(())
}

#[cfg(feature = "distributed")]
fn all_on(params: &[(String, Tensor)], device: Device) -> bool {
    params.iter().all(|(_, t)| t.device() == device)
}

/// c10d's group (Gloo, or NCCL with the feature `nccl`) as a [`Collective`]: tensors on
/// another device than the group's ([`ProcessGroup::device`](crate::distributed::ProcessGroup::device))
/// travel through a copy there; parameters on the group's device use the bucketed helpers of
/// [`crate::distributed`]
/// ([`broadcast_parameters`](crate::distributed::broadcast_parameters) with its layout check,
/// [`all_reduce_gradients_with`](crate::distributed::all_reduce_gradients_with) and `Sum`), and
/// moments the gathered [`all_reduce_moments`](crate::distributed::all_reduce_moments).
#[cfg(feature = "distributed")]
impl Collective for crate::distributed::ProcessGroup {
    fn rank(&self) -> usize {
        crate::distributed::ProcessGroup::rank(self)
    }
    fn world_size(&self) -> usize {
        crate::distributed::ProcessGroup::world_size(self)
    }
    fn all_reduce_sum(&self, tensor: &mut Tensor) -> Result<()> {
        on_device(tensor, self.device(), |t| {
            self.all_reduce(t, crate::distributed::ReduceOp::Sum)
        })
    }
    fn broadcast(&self, tensor: &mut Tensor, src: usize) -> Result<()> {
        on_device(tensor, self.device(), |t| {
            crate::distributed::ProcessGroup::broadcast(self, t, src)
        })
    }
    fn barrier(&self) -> Result<()> {
        crate::distributed::ProcessGroup::barrier(self)
    }
    fn all_reduce_moments(&self, local: &BatchMoments) -> Result<BatchMoments> {
        crate::distributed::all_reduce_moments(self, local)
    }
    fn broadcast_parameters(&self, params: &[(String, Tensor)], src: usize) -> Result<()> {
        if all_on(params, self.device()) {
            return crate::distributed::broadcast_parameters(self, params, src);
        }
        let _guard = tch::no_grad_guard();
        for (_, t) in sorted("broadcast_parameters", params)? {
            let mut h = t.shallow_clone();
            Collective::broadcast(self, &mut h, src)?;
        }
        Ok(())
    }
    fn all_reduce_sum_gradients(&self, params: &[(String, Tensor)]) -> Result<()> {
        if all_on(params, self.device()) {
            return crate::distributed::all_reduce_gradients_with(
                self,
                params,
                crate::distributed::DEFAULT_BUCKET_BYTES,
                crate::distributed::ReduceOp::Sum,
            );
        }
        let _guard = tch::no_grad_guard();
        for (_, p) in sorted("all_reduce_gradients", params)? {
            let mut g = p.f_grad()?;
            if g.defined() {
                self.all_reduce_sum(&mut g)?;
            }
        }
        Ok(())
    }
    /// c10d's DDP reducer ([`GradientHooks`](crate::distributed::GradientHooks)) when every
    /// parameter is on the group's device, else `None` (the per-tensor path after backward).
    fn gradient_sync(&self, params: &[(String, Tensor)]) -> Result<Option<Box<dyn GradientSync>>> {
        if params.is_empty() || !all_on(params, self.device()) {
            return Ok(None);
        }
        let hooks = crate::distributed::gradient_hooks(
            self,
            params,
            crate::distributed::DEFAULT_BUCKET_BYTES,
        )?;
        Ok(Some(Box::new(hooks)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake two-rank group whose "other rank" holds a copy of this rank's values: sums
    /// double, broadcasts keep. Enough to check the provided methods' arithmetic.
    struct Mirror;

    impl Collective for Mirror {
        fn rank(&self) -> usize {
            0
        }
        fn world_size(&self) -> usize {
            2
        }
        fn all_reduce_sum(&self, tensor: &mut Tensor) -> Result<()> {
            let _ = tensor.f_mul_scalar_(2.0)?;
            Ok(())
        }
        fn broadcast(&self, _tensor: &mut Tensor, _src: usize) -> Result<()> {
            Ok(())
        }
        fn barrier(&self) -> Result<()> {
            Ok(())
        }
    }

    #[test]
    fn provided_methods_combine_two_equal_ranks() {
        let x = Tensor::from_slice(&[1.0f64, 2.0, 6.0]);
        let local = BatchMoments::of(&x).unwrap();
        let both = BatchMoments::of(&Tensor::cat(&[&x, &x], 0)).unwrap();
        let g = Mirror.all_reduce_moments(&local).unwrap();
        assert_eq!(g.count(), 6.0);
        assert!((g.mean() - both.mean()).abs() < 1e-12);
        assert!((g.m2() - both.m2()).abs() < 1e-12);
        assert_eq!(Mirror.mean_over_ranks(&x).unwrap(), 3.0);
        assert_eq!(Mirror.sum_scalars(&[1.5]).unwrap(), vec![3.0]);
        // the mirror failed too: "another rank failed"
        assert!(Mirror.check_all_ok("save", true).is_ok());
        let err = Mirror.check_all_ok("save", false);
        assert!(err.is_err(), "the mirrored rank failed as well");
    }

    #[test]
    fn repeated_parameter_names_are_refused() {
        let p = || ("a".to_string(), Tensor::from_slice(&[1.0f32]));
        let err = Mirror.broadcast_parameters(&[p(), p()], 0).unwrap_err();
        assert!(matches!(err, Error::KeyExists { .. }), "{err}");
        assert!(SingleProcess.broadcast_parameters(&[p()], 1).is_err());
    }
}
