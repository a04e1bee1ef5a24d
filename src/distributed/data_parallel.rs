//! Data-parallel helpers over a [`ProcessGroup`]: DDP's start-up broadcast of the parameters,
//! its bucketed gradient all-reduce (mean over ranks), and the global statistics trlX computes
//! across processes (running moments of scores, whitening).
//!
//! Parameters are given as `(name, tensor)` pairs (what `VarStore::variables()` yields, in any
//! order): the helpers sort them by name, so every rank walks them in the same order even
//! though a `HashMap`'s order differs between processes, and they check first (one small
//! all-gather) that every rank holds the same names, shapes and dtypes, so a mismatch is an
//! error naming the ranks instead of silently mixed values.

use std::collections::BTreeMap;
use std::ffi::{c_int, c_void};
use std::ptr::NonNull;

use tch::{Device, Kind, Tensor};

use super::ffi;
use super::process_group::{check_tensor, ProcessGroup, ReduceOp, ERR_LEN};
use crate::envs::llm::moments::BatchMoments;
use crate::error::{Error, Result};

/// DDP's default gradient bucket size: 25 MiB.
pub const DEFAULT_BUCKET_BYTES: usize = 25 * 1024 * 1024;

/// Copies rank `src`'s parameters into every rank's, in place and under `no_grad` (DDP does
/// this once at construction so that every rank starts from the same weights).
///
/// Every rank must pass the same names, shapes and dtypes (any order; the list is sorted by
/// name); otherwise every rank gets an [`Error::Distributed`] saying which ranks differ, and
/// nothing is copied. Tensors are sent in buckets of up to [`DEFAULT_BUCKET_BYTES`].
///
/// ```
/// use tch::{nn, Device};
/// use torchrl::distributed::{broadcast_parameters, InitOptions, ProcessGroup};
/// # fn main() -> torchrl::Result<()> {
/// let pg = ProcessGroup::new(InitOptions::single_process())?;
/// let vs = nn::VarStore::new(Device::Cpu);
/// let _lin = nn::linear(vs.root() / "lin", 3, 2, Default::default());
/// let params: Vec<(String, tch::Tensor)> = vs.variables().into_iter().collect();
/// let before = vs.variables()["lin.weight"].copy();
/// broadcast_parameters(&pg, &params, 0)?; // a world of one: nothing changes
/// assert!(vs.variables()["lin.weight"].equal(&before));
/// # Ok(()) }
/// ```
pub fn broadcast_parameters(
    pg: &ProcessGroup,
    params: &[(String, Tensor)],
    src: usize,
) -> Result<()> {
    let op = "broadcast_parameters";
    if src >= pg.world_size() {
        return Err(Error::argument(
            op,
            "src",
            format!("a rank below the world size {}", pg.world_size()),
            src.to_string(),
        ));
    }
    let entries = sorted_entries(
        op,
        params.iter().map(|(n, t)| (n.as_str(), t.shallow_clone())),
        pg.device(),
    )?;
    check_same_layout(pg, op, &entries)?;
    let _guard = tch::no_grad_guard();
    for bucket in plan_buckets(&layout(&entries)?, DEFAULT_BUCKET_BYTES) {
        let tensors: Vec<&Tensor> = bucket
            .iter()
            .filter_map(|&i| entries.get(i).map(|e| &e.1))
            .collect();
        with_flat(&tensors, |flat| pg.broadcast(flat, src))?;
    }
    Ok(())
}

/// Averages the gradients of `params` over all ranks, in place: afterwards every rank holds
/// the mean of the ranks' gradients, so identical optimizer steps keep the ranks' parameters
/// identical (DDP's all-reduce, without the overlap with backward).
///
/// Gradients are flattened into buckets of up to `bucket_bytes` bytes (consecutive tensors of
/// one dtype; a larger tensor travels alone; [`DEFAULT_BUCKET_BYTES`] is DDP's 25 MiB), each
/// bucket is all-reduced once and copied back. Parameters without a gradient (frozen, or
/// unused in this backward pass) are skipped.
///
/// **Requirement**: every rank must have gradients for the same parameters (same names,
/// shapes, dtypes; the list is sorted by name, so its order does not matter). This is checked
/// first with one small all-gather; a mismatch is an [`Error::Distributed`] on every rank
/// naming the ranks that differ, and no gradient is changed. Call it after `backward` and
/// before the optimizer step, on every rank.
///
/// ```
/// use tch::{nn, nn::Module, Device, Kind, Tensor};
/// use torchrl::distributed::{all_reduce_gradients, InitOptions, ProcessGroup, DEFAULT_BUCKET_BYTES};
/// # fn main() -> torchrl::Result<()> {
/// let pg = ProcessGroup::new(InitOptions::single_process())?;
/// let vs = nn::VarStore::new(Device::Cpu);
/// let lin = nn::linear(vs.root(), 3, 1, Default::default());
/// lin.forward(&Tensor::ones([4, 3], (Kind::Float, Device::Cpu))).sum(Kind::Float).backward();
/// let params: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
/// let grad_before = vs.variables()["bias"].grad().copy();
/// all_reduce_gradients(&pg, &params, DEFAULT_BUCKET_BYTES)?; // the mean over one rank
/// assert!(vs.variables()["bias"].grad().equal(&grad_before));
/// # Ok(()) }
/// ```
pub fn all_reduce_gradients(
    pg: &ProcessGroup,
    params: &[(String, Tensor)],
    bucket_bytes: usize,
) -> Result<()> {
    all_reduce_gradients_with(pg, params, bucket_bytes, ReduceOp::Mean)
}

/// [`all_reduce_gradients`] with another reduction: [`ReduceOp::Sum`] is what a trainer whose
/// ranks divide their losses by the **global** normaliser (the token count over all ranks)
/// needs, so that the summed gradient is the gradient of the global mean; `Mean` is DDP's
/// (each rank's loss a local mean over equal-sized shards). Same requirements and checks.
///
/// ```
/// use tch::{nn, nn::Module, Device, Kind, Tensor};
/// use torchrl::distributed::{all_reduce_gradients_with, InitOptions, ProcessGroup, ReduceOp};
/// # fn main() -> torchrl::Result<()> {
/// let pg = ProcessGroup::new(InitOptions::single_process())?;
/// let vs = nn::VarStore::new(Device::Cpu);
/// let lin = nn::linear(vs.root(), 3, 1, Default::default());
/// lin.forward(&Tensor::ones([4, 3], (Kind::Float, Device::Cpu))).sum(Kind::Float).backward();
/// let params: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
/// let grad_before = vs.variables()["bias"].grad().copy();
/// all_reduce_gradients_with(&pg, &params, 1 << 20, ReduceOp::Sum)?; // a sum over one rank
/// assert!(vs.variables()["bias"].grad().equal(&grad_before));
/// # Ok(()) }
/// ```
pub fn all_reduce_gradients_with(
    pg: &ProcessGroup,
    params: &[(String, Tensor)],
    bucket_bytes: usize,
    reduce: ReduceOp,
) -> Result<()> {
    let op = "all_reduce_gradients";
    if bucket_bytes == 0 {
        return Err(Error::argument(op, "bucket_bytes", "at least 1 byte", "0"));
    }
    let mut grads = Vec::with_capacity(params.len());
    for (name, p) in params {
        let g = p.f_grad()?;
        if g.defined() {
            grads.push((name.as_str(), g));
        }
    }
    let entries = sorted_entries(op, grads.into_iter(), pg.device())?;
    check_same_layout(pg, op, &entries)?;
    let _guard = tch::no_grad_guard();
    for bucket in plan_buckets(&layout(&entries)?, bucket_bytes) {
        let tensors: Vec<&Tensor> = bucket
            .iter()
            .filter_map(|&i| entries.get(i).map(|e| &e.1))
            .collect();
        with_flat(&tensors, |flat| pg.all_reduce(flat, reduce))?;
    }
    Ok(())
}

/// The global moments of values spread over the ranks: each rank passes the
/// [`BatchMoments`] (count, mean, sum of squared deviations) of its own values, and every rank
/// gets those of all ranks' values together, equal to [`BatchMoments::of`] on the concatenated
/// data (up to rounding), and bitwise identical on every rank (the triples are all-gathered and
/// merged in rank order with [`BatchMoments::merge`]). This is what trlX's
/// `get_global_statistics` gives for running moments of scores and for whitening.
///
/// Feed the result to `RunningMoments::update_with` or use its mean and variance to whiten.
/// From raw sums, a rank's triple is `BatchMoments::new(n, sum / n, sum_sq - sum * sum / n)`.
///
/// ```
/// use tch::Tensor;
/// use torchrl::distributed::{all_reduce_moments, InitOptions, ProcessGroup};
/// use torchrl::objectives::llm::moments::BatchMoments;
/// # fn main() -> torchrl::Result<()> {
/// let pg = ProcessGroup::new(InitOptions::single_process())?;
/// let local = BatchMoments::of(&Tensor::from_slice(&[1.0f64, 2.0, 3.0, 4.0]))?;
/// let global = all_reduce_moments(&pg, &local)?;
/// assert_eq!((global.count(), global.mean(), global.var()), (4.0, 2.5, 1.25));
/// # Ok(()) }
/// ```
pub fn all_reduce_moments(pg: &ProcessGroup, local: &BatchMoments) -> Result<BatchMoments> {
    let t =
        Tensor::from_slice(&[local.count(), local.mean(), local.m2()]).f_to_device(pg.device())?;
    let all = pg.all_gather(&t)?;
    let mut merged: Option<BatchMoments> = None;
    for (r, t) in all.iter().enumerate() {
        let v = Vec::<f64>::try_from(t.f_to_device(Device::Cpu)?)?;
        let (count, mean, m2) = match v.as_slice() {
            [c, m, s] => (*c, *m, *s),
            _ => {
                return Err(Error::Distributed {
                    op: "all_reduce_moments",
                    rank: pg.rank(),
                    world_size: pg.world_size(),
                    message: format!("rank {r} sent {} values instead of 3", v.len()),
                })
            }
        };
        let b = BatchMoments::new(count, mean, m2).map_err(|e| Error::Distributed {
            op: "all_reduce_moments",
            rank: pg.rank(),
            world_size: pg.world_size(),
            message: format!("rank {r} sent invalid moments: {e}"),
        })?;
        merged = Some(match merged {
            None => b,
            Some(m) => m.merge(&b),
        });
    }
    // The group has at least one rank, so `all` is not empty; the fallback is never taken.
    Ok(merged.unwrap_or(*local))
}

/// All-reduces a few `f64` scalars (a mean KL, a token count, a loss for logging) in one call
/// and returns the reduced values, identical on every rank.
///
/// ```
/// use torchrl::distributed::{all_reduce_scalars, InitOptions, ProcessGroup, ReduceOp};
/// # fn main() -> torchrl::Result<()> {
/// let pg = ProcessGroup::new(InitOptions::single_process())?;
/// assert_eq!(all_reduce_scalars(&pg, &[0.5, 2.0], ReduceOp::Mean)?, vec![0.5, 2.0]);
/// # Ok(()) }
/// ```
pub fn all_reduce_scalars(pg: &ProcessGroup, values: &[f64], op: ReduceOp) -> Result<Vec<f64>> {
    let mut t = Tensor::from_slice(values).f_to_device(pg.device())?;
    pg.all_reduce(&mut t, op)?;
    Ok(Vec::<f64>::try_from(t.f_to_device(Device::Cpu)?)?)
}

/// Gradient all-reduce overlapped with backward: c10d's own DDP reducer (`c10d::Reducer`,
/// what PyTorch's `DistributedDataParallel` runs) hooked on every parameter's gradient
/// accumulator. After [`GradientHooks::prepare`] the next backward pass sums each bucket of
/// gradients over the ranks (on the backend's worker threads) as soon as backward has produced
/// all of its gradients, while backward goes on with the rest; when `backward` returns, every
/// `.grad` holds the **sum** over the ranks (not DDP's mean: data-parallel trainers here scale
/// each rank's loss by its share of the global batch). Parameters that get no gradient in a
/// pass keep none (DDP's `find_unused_parameters`). A backward pass without `prepare` touches
/// nothing (DDP's `no_sync`).
///
/// Created by [`gradient_hooks`]; dropping it removes the hooks.
///
/// ```
/// use tch::{nn, nn::Module, Device, Kind, Tensor};
/// use torchrl::distributed::{gradient_hooks, InitOptions, ProcessGroup, DEFAULT_BUCKET_BYTES};
/// # fn main() -> torchrl::Result<()> {
/// let pg = ProcessGroup::new(InitOptions::single_process())?;
/// let vs = nn::VarStore::new(Device::Cpu);
/// let lin = nn::linear(vs.root() / "lin", 3, 2, Default::default());
/// let params: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
/// let hooks = gradient_hooks(&pg, &params, DEFAULT_BUCKET_BYTES)?;
/// let loss = lin.forward(&Tensor::ones([4, 3], (Kind::Float, Device::Cpu))).sum(Kind::Float);
/// hooks.prepare(&[&loss])?;
/// loss.backward(); // one rank: the sums are the local gradients
/// let w = &vs.variables()["lin.weight"];
/// assert!((w.grad() - Tensor::ones([2, 3], (Kind::Float, Device::Cpu)) * 4.0).abs().max().double_value(&[]) < 1e-6);
/// # Ok(()) }
/// ```
pub struct GradientHooks {
    raw: NonNull<c_void>,
    rank: usize,
    world_size: usize,
}

// SAFETY: the shim's reducer (a c10d::Reducer and the ProcessGroup wrapper it reduces over)
// guards its state with its own mutex and has no thread affinity; its hooks run on whatever
// thread runs backward. The handle is not `Sync`: two threads preparing it at once would race
// on which backward it arms.
unsafe impl Send for GradientHooks {}

impl std::fmt::Debug for GradientHooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GradientHooks")
            .field("rank", &self.rank)
            .field("world_size", &self.world_size)
            .finish_non_exhaustive()
    }
}

impl GradientHooks {
    /// Arms the hooks for the next backward pass from `outputs` (the loss; the reducer walks
    /// its graph to find the parameters that will get no gradient). Every rank must prepare
    /// and then run backward, in the same order as its other collectives.
    ///
    /// # Errors
    /// [`Error::Distributed`] when c10d refuses (for instance a previous pass never finished).
    pub fn prepare(&self, outputs: &[&Tensor]) -> Result<()> {
        let ptrs: Vec<*mut c_void> = outputs.iter().map(|t| t.as_ptr() as *mut c_void).collect();
        let n = c_int::try_from(ptrs.len()).unwrap_or(c_int::MAX);
        let mut err = vec![0u8; ERR_LEN];
        // SAFETY: `raw` is this handle's live reducer; the pointers are `at::Tensor*` of
        // tensors borrowed for the call (the shim copies the handles); `err` holds its length.
        let status = unsafe {
            ffi::trl_reducer_prepare(
                self.raw.as_ptr(),
                ptrs.as_ptr(),
                n,
                err.as_mut_ptr().cast(),
                err.len(),
            )
        };
        if status == ffi::OK {
            return Ok(());
        }
        let end = err.iter().position(|&b| b == 0).unwrap_or(err.len());
        Err(Error::Distributed {
            op: "GradientHooks::prepare",
            rank: self.rank,
            world_size: self.world_size,
            message: String::from_utf8_lossy(err.get(..end).unwrap_or_default()).into_owned(),
        })
    }
}

impl Drop for GradientHooks {
    fn drop(&mut self) {
        // SAFETY: `raw` was created by `trl_reducer_new` and is freed exactly once, here.
        unsafe { ffi::trl_reducer_free(self.raw.as_ptr()) }
    }
}

/// [`GradientHooks`] for `params` (sorted by name, so every rank hooks them in the same order;
/// leaf tensors that require grad, on the group's device), in buckets of at most
/// `bucket_bytes`, the last parameters first (backward produces their gradients first).
/// Checks that every rank holds the same names, shapes and dtypes (one all-gather).
///
/// # Errors
/// On an empty list, a repeated name, a parameter that does not require grad or sits on
/// another device, a zero bucket size, ranks that disagree on the parameters, or c10d's refusal.
pub fn gradient_hooks(
    pg: &ProcessGroup,
    params: &[(String, Tensor)],
    bucket_bytes: usize,
) -> Result<GradientHooks> {
    let op = "gradient_hooks";
    if params.is_empty() {
        return Err(Error::argument(
            op,
            "params",
            "at least one parameter",
            "none",
        ));
    }
    if bucket_bytes == 0 {
        return Err(Error::argument(op, "bucket_bytes", "at least 1 byte", "0"));
    }
    let entries = sorted_entries(
        op,
        params.iter().map(|(n, t)| (n.as_str(), t.shallow_clone())),
        pg.device(),
    )?;
    if let Some((name, _)) = entries.iter().find(|(_, t)| !t.requires_grad()) {
        return Err(Error::argument(
            op,
            name,
            "a parameter that requires grad",
            "a tensor without requires_grad",
        ));
    }
    check_same_layout(pg, op, &entries)?;
    let ptrs: Vec<*mut c_void> = entries
        .iter()
        .map(|(_, t)| t.as_ptr() as *mut c_void)
        .collect();
    let n = c_int::try_from(ptrs.len()).map_err(|_| {
        Error::argument(
            op,
            "params",
            "at most i32::MAX parameters",
            ptrs.len().to_string(),
        )
    })?;
    let cap = i64::try_from(bucket_bytes).unwrap_or(i64::MAX);
    let mut raw: *mut c_void = std::ptr::null_mut();
    pg.call(op, |group, err| {
        // SAFETY: `group` is the live group handle `call` passes; the pointers are
        // `at::Tensor*` of tensors alive for the call (the shim copies the handles); `raw` is
        // a valid out pointer; `err` holds ERR_LEN bytes.
        unsafe { ffi::trl_reducer_new(group, ptrs.as_ptr(), n, cap, &mut raw, err, ERR_LEN) }
    })?;
    let raw = NonNull::new(raw).ok_or_else(|| Error::Distributed {
        op,
        rank: pg.rank(),
        world_size: pg.world_size(),
        message: "c10d returned no reducer".into(),
    })?;
    Ok(GradientHooks {
        raw,
        rank: pg.rank(),
        world_size: pg.world_size(),
    })
}

/// `(name, tensor)` pairs sorted by name; a repeated name is an error.
fn sorted_entries<'a>(
    op: &'static str,
    items: impl Iterator<Item = (&'a str, Tensor)>,
    device: Device,
) -> Result<Vec<(String, Tensor)>> {
    let mut map = BTreeMap::new();
    for (name, t) in items {
        check_tensor(op, name, &t, false, device)?;
        if map.insert(name.to_string(), t).is_some() {
            return Err(Error::KeyExists {
                op,
                key: name.to_string(),
            });
        }
    }
    Ok(map.into_iter().collect())
}

/// `(dtype, bytes)` of each entry, for bucketing.
fn layout(entries: &[(String, Tensor)]) -> Result<Vec<(Kind, usize)>> {
    entries
        .iter()
        .map(|(_, t)| {
            let kind = t.f_kind()?;
            Ok((kind, t.numel() * kind.elt_size_in_bytes()))
        })
        .collect()
}

/// Groups consecutive entries of one dtype into buckets of at most `bucket_bytes` bytes (an
/// entry larger than that is a bucket of its own). Returns the entries' indices per bucket.
pub(crate) fn plan_buckets(layout: &[(Kind, usize)], bucket_bytes: usize) -> Vec<Vec<usize>> {
    let mut buckets: Vec<Vec<usize>> = Vec::new();
    let mut current: Vec<usize> = Vec::new();
    let mut current_kind: Option<Kind> = None;
    let mut current_bytes = 0usize;
    for (i, &(kind, bytes)) in layout.iter().enumerate() {
        let fits = current_kind == Some(kind) && current_bytes + bytes <= bucket_bytes;
        if !current.is_empty() && !fits {
            buckets.push(std::mem::take(&mut current));
            current_bytes = 0;
        }
        current.push(i);
        current_kind = Some(kind);
        current_bytes += bytes;
    }
    if !current.is_empty() {
        buckets.push(current);
    }
    buckets
}

/// Runs `f` on one contiguous tensor holding `tensors` (the tensor itself when there is one
/// contiguous tensor, else a flattened concatenation), then copies the result back.
fn with_flat(tensors: &[&Tensor], f: impl FnOnce(&mut Tensor) -> Result<()>) -> Result<()> {
    if let [only] = tensors {
        if only.is_contiguous() {
            let mut handle = only.shallow_clone();
            return f(&mut handle);
        }
    }
    let flats = tensors
        .iter()
        .map(|t| t.f_reshape([-1]))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let mut flat = Tensor::f_cat(&flats, 0)?;
    f(&mut flat)?;
    let mut offset = 0i64;
    for t in tensors {
        let n = t.numel() as i64;
        let mut dst = t.shallow_clone();
        dst.f_copy_(&flat.f_narrow(0, offset, n)?.f_view(t.size().as_slice())?)?;
        offset += n;
    }
    Ok(())
}

/// 64-bit FNV-1a, for the layout fingerprint.
fn fnv1a(hash: &mut u64, bytes: &[u8]) {
    for b in bytes {
        *hash ^= u64::from(*b);
        *hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
}

/// Checks with one all-gather that every rank holds the same names, shapes and dtypes; the
/// same gathered data reaches every rank, so all ranks agree on the verdict.
fn check_same_layout(
    pg: &ProcessGroup,
    op: &'static str,
    entries: &[(String, Tensor)],
) -> Result<()> {
    let mut hash = 0xcbf2_9ce4_8422_2325u64;
    let mut numel = 0i64;
    for (name, t) in entries {
        fnv1a(&mut hash, name.as_bytes());
        fnv1a(&mut hash, &[0xff]);
        for d in t.size() {
            fnv1a(&mut hash, &d.to_le_bytes());
        }
        fnv1a(&mut hash, format!("{:?}", t.f_kind()?).as_bytes());
        numel += t.numel() as i64;
    }
    if pg.world_size() == 1 {
        return Ok(());
    }
    let mine =
        Tensor::from_slice(&[entries.len() as i64, numel, hash as i64]).f_to_device(pg.device())?;
    let all = pg.all_gather(&mine)?;
    let mut rows = Vec::with_capacity(all.len());
    for t in &all {
        rows.push(Vec::<i64>::try_from(t.f_to_device(Device::Cpu)?)?);
    }
    if rows.windows(2).all(|w| w.first() == w.get(1)) {
        return Ok(());
    }
    let described: Vec<String> = rows
        .iter()
        .enumerate()
        .map(|(r, v)| match v.as_slice() {
            [n, e, h] => format!(
                "rank {r}: {n} tensors, {e} elements, layout hash {:016x}",
                *h as u64
            ),
            _ => format!("rank {r}: {v:?}"),
        })
        .collect();
    Err(Error::Distributed {
        op,
        rank: pg.rank(),
        world_size: pg.world_size(),
        message: format!(
            "the ranks disagree on the tensors (names, shapes, dtypes) to combine: {}",
            described.join("; ")
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_group_consecutive_tensors_of_one_dtype_up_to_the_size() {
        let f = Kind::Float;
        let d = Kind::Double;
        let layout = [(f, 40), (f, 40), (f, 40), (d, 8), (d, 200), (f, 4)];
        assert_eq!(
            plan_buckets(&layout, 80),
            vec![vec![0, 1], vec![2], vec![3], vec![4], vec![5]]
        );
        assert_eq!(
            plan_buckets(&layout, 1 << 20),
            vec![vec![0, 1, 2], vec![3, 4], vec![5]]
        );
        assert_eq!(plan_buckets(&layout, 1).len(), 6);
        assert!(plan_buckets(&[], 10).is_empty());
    }

    #[test]
    fn with_flat_copies_back_into_every_tensor() {
        let a = Tensor::from_slice(&[1.0f32, 2.0]);
        let b = Tensor::from_slice(&[3.0f32, 4.0, 5.0, 6.0]).view([2, 2]);
        with_flat(&[&a, &b], |flat| {
            assert_eq!(flat.size(), vec![6]);
            let _ = flat.f_mul_scalar_(10.0)?;
            Ok(())
        })
        .unwrap();
        assert_eq!(Vec::<f32>::try_from(&a).unwrap(), vec![10.0, 20.0]);
        assert_eq!(
            Vec::<f32>::try_from(&b.view([-1])).unwrap(),
            vec![30.0, 40.0, 50.0, 60.0]
        );
    }

    #[test]
    fn repeated_names_are_refused() {
        let t = || Tensor::from_slice(&[1.0f32]);
        let err = sorted_entries(
            "test",
            vec![("a", t()), ("a", t())].into_iter(),
            Device::Cpu,
        )
        .unwrap_err();
        assert!(matches!(err, Error::KeyExists { .. }), "{err}");
        let ok = sorted_entries(
            "test",
            vec![("b", t()), ("a", t())].into_iter(),
            Device::Cpu,
        )
        .unwrap();
        assert_eq!(
            ok.iter().map(|e| e.0.as_str()).collect::<Vec<_>>(),
            vec!["a", "b"]
        );
    }
}
