//! `stack` along a dim after the first, for CPU tensors, as copies on the host into one
//! consolidated allocation.
//!
//! libtorch stacks along dim `d > 0` with `cat`'s serial kernel: for each of the `outer`
//! positions before `d` it copies one small block from each input (`outer × n` `memcpy` calls
//! of a few bytes; a rollout of 1024 batched envs stacks 200 steps of `[1024, k]` leaves
//! along dim 1). Here the same copy writes the output front to back, with the row width known
//! at compile time for the common widths.
//!
//! **One allocation.** All the leaves a stack computes here are views into one byte buffer
//! (each leaf contiguous, 64-byte aligned, with its own dtype and shape), like tensordict's
//! `consolidate()`. A rollout's outputs are megabytes: allocated leaf by leaf, each is a
//! separate `mmap` (or a piece of a heap top that glibc trims when it is freed), and every
//! rollout pays a page fault per 4 KiB of fresh memory. One buffer of the whole size is one `mmap`; when it is freed, glibc
//! raises its mmap and trim thresholds to that size and keeps later buffers of that size in
//! its heap, so the rollouts after the first two reuse warm pages. The cost for users: the
//! buffer lives until the last of its leaves is dropped.
//!
//! Only plain data is handled: CPU, contiguous, one dtype without quantization, no autograd,
//! no conjugate or negative views; everything else (and an empty result) is left to the caller
//! (`Tensor::stack`). What each of these choices measured: `docs/performance.md` (W2).

use tch::{Device, Kind, Tensor};

use super::pages::{fresh_buffer, reserve_slack};
use super::Elements;
use crate::error::{Error, Result};

/// Alignment of each leaf in the consolidated buffer (libtorch's own CPU alignment).
const ALIGN: usize = 64;

/// The byte layout of a stacked leaf: `outer` rows, each of `n` blocks of `inner` bytes (one
/// block per input), and its dtype and shape.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Layout {
    outer: usize,
    inner: usize,
    n: usize,
    kind: Kind,
    shape: Vec<i64>,
}

impl Layout {
    fn bytes(&self) -> usize {
        self.outer * self.n * self.inner
    }
}

/// What a leaf of a consolidated stack is computed from.
pub(crate) enum Source<'a> {
    /// The stack of these inputs.
    Stack(&'a [&'a Tensor]),
    /// A copy of the job with this index (same layout).
    Copy(usize),
    /// The job with this index shifted by one along the stack dim (same layout): this tensor
    /// (an input-shaped plain tensor) first, then that job's blocks but the last.
    Shift(usize, &'a Tensor),
}

/// The kinds the consolidated buffer can hold (plain element types: a byte buffer viewed as
/// any of them).
fn plain_kind(kind: Kind) -> bool {
    use Kind::*;
    matches!(
        kind,
        Uint8
            | Int8
            | Int16
            | Int
            | Int64
            | Half
            | Float
            | Double
            | ComplexHalf
            | ComplexFloat
            | ComplexDouble
            | Bool
            | BFloat16
    )
}

/// Whether `t` is plain CPU data of `kind` and `shape`.
pub(crate) fn is_plain(t: &Tensor, kind: Kind, shape: &[i64]) -> bool {
    t.device() == Device::Cpu
        && t.kind() == kind
        && t.size() == shape
        && t.is_contiguous()
        && !t.requires_grad()
        && !t.is_conj()
        && !t.is_neg()
}

/// The layout of `Tensor::stack(inputs, dim)` for `dim ≥ 1`, or `None` when the inputs are not
/// plain contiguous CPU data of one dtype and shape, or the result would be empty.
pub(crate) fn layout(inputs: &[&Tensor], dim: usize) -> Option<Layout> {
    let first = inputs.first()?;
    let shape = first.size();
    let kind = first.kind();
    if dim == 0 || dim > shape.len() || !plain_kind(kind) {
        return None;
    }
    if !inputs.iter().all(|t| is_plain(t, kind, &shape)) {
        return None;
    }
    let dims: Vec<usize> = shape
        .iter()
        .map(|d| usize::try_from(*d).ok())
        .collect::<Option<_>>()?;
    let (before, after) = dims.split_at(dim);
    let outer = before.iter().try_fold(1usize, |a, d| a.checked_mul(*d))?;
    let inner = after
        .iter()
        .try_fold(kind.elt_size_in_bytes(), |a, d| a.checked_mul(*d))?;
    let n = inputs.len();
    let total = outer.checked_mul(inner)?.checked_mul(n)?;
    if total == 0 || total > isize::MAX as usize / 2 {
        return None;
    }
    let mut out_shape = shape;
    out_shape.insert(dim, i64::try_from(n).ok()?);
    Some(Layout {
        outer,
        inner,
        n,
        kind,
        shape: out_shape,
    })
}

/// Computes every job (a layout from [`layout`] and its source) into one consolidated buffer and
/// returns one contiguous tensor per job, in order. `Copy` and `Shift` jobs must name a `Stack`
/// job of the same layout, and a `Shift`'s first tensor must be plain with the inputs' dtype
/// and shape.
pub(crate) fn stack_consolidated(
    jobs: &[(Layout, Source<'_>)],
    reserve: Option<Reserve>,
) -> Result<Vec<Tensor>> {
    let internal = |what: &str| Error::invalid("stack", format!("internal: {what}"));
    let mut offsets = Vec::with_capacity(jobs.len());
    let mut total = 0usize;
    for (l, _) in jobs {
        let start = total
            .checked_next_multiple_of(ALIGN)
            .ok_or_else(|| internal("buffer size overflow"))?;
        offsets.push(start);
        total = start
            .checked_add(l.bytes())
            .ok_or_else(|| internal("buffer size overflow"))?;
    }
    let size = i64::try_from(total).map_err(|_| internal("buffer size overflow"))?;
    let buf = match reserve {
        Some(Reserve(buf, len)) if len >= total => buf,
        _ => fresh_buffer(size)?,
    };
    if total > 0 {
        // SAFETY: `buf` is a fresh contiguous CPU buffer of at least `total` bytes that nothing
        // else refers to yet (a new one, or a `Reserve`, which only ever has one handle); the
        // views below are made after this slice's last use. The inputs are
        // plain contiguous CPU tensors (checked by `layout` / `is_plain`), only read, none of
        // them `buf`; they and `buf` are borrowed or owned for the whole call, so neither
        // dropped nor resized while the slices live.
        let dst = unsafe { std::slice::from_raw_parts_mut(buf.data_ptr() as *mut u8, total) };
        let regions = split_regions(dst, jobs, &offsets)?;
        let mut slots: Vec<Option<&mut [u8]>> = regions.into_iter().map(Some).collect();
        let taken = || Error::invalid("stack", "internal: a leaf derived twice or from a copy");
        for (j, (l, src)) in jobs.iter().enumerate() {
            let Source::Stack(inputs) = src else {
                continue;
            };
            let row = l.n * l.inner;
            let dst = slots.get_mut(j).and_then(Option::take).ok_or_else(taken)?;
            // The leaves copied or shifted from this one, written row by row right after
            // each of its rows (a `memcpy` from a row still in L1).
            let mut derived = Vec::new();
            for (k, (_, s)) in jobs.iter().enumerate() {
                let first = match s {
                    Source::Copy(x) if *x == j => None,
                    // SAFETY: as above; `first` is plain (checked by the caller).
                    Source::Shift(x, first) if *x == j => Some(unsafe { bytes_of(first) }),
                    _ => continue,
                };
                let region = slots.get_mut(k).and_then(Option::take).ok_or_else(taken)?;
                let block = l.outer * l.inner;
                if region.len() != dst.len() || first.is_some_and(|f| f.len() != block) {
                    return Err(internal("a derived leaf of another size"));
                }
                derived.push(Derived {
                    rows: region.chunks_exact_mut(row),
                    first: first.map(|f| f.chunks_exact(l.inner)),
                });
            }
            let srcs: Vec<&[u8]> = inputs
                .iter()
                // SAFETY: as above: every input is plain (checked by `layout`), only read,
                // and borrowed for the whole call.
                .map(|t| unsafe { bytes_of(t) })
                .collect();
            // The kernel below copies whole rows and blocks only: sizes it cannot handle are
            // reported here, not skipped there.
            let block = l.outer * l.inner;
            if dst.len() != l.bytes() || srcs.iter().any(|s| s.len() != block) {
                return Err(internal("an input of another size than its layout"));
            }
            copy_stack(dst, &srcs, l.inner, &mut derived);
        }
        if slots.iter().any(Option::is_some) {
            return Err(Error::invalid(
                "stack",
                "internal: a leaf derived from a leaf that is not stacked",
            ));
        }
    }
    let mut out = Vec::with_capacity(jobs.len());
    for ((l, _), &off) in jobs.iter().zip(&offsets) {
        let (off, bytes) = (off as i64, l.bytes() as i64);
        out.push(
            buf.f_narrow(0, off, bytes)?
                .f_view_dtype(l.kind)?
                .f_view(l.shape.as_slice())?,
        );
    }
    Ok(out)
}

/// Memory set aside for a consolidated stack: a fresh contiguous CPU byte buffer (and its
/// length) with a single handle, owned by whoever asked for it until it is handed to the stack.
pub(crate) struct Reserve(Tensor, usize);

/// A buffer big enough for stacking `n` tensordicts whose leaves are shaped like `leaves`
/// along a dim after the first, when some of those leaves are plain CPU data (`None` when
/// none is).
///
/// Why: a rollout's buffer is megabytes, and a buffer the heap cannot place in memory that an
/// earlier rollout used is fresh memory, a page fault per 4 KiB. A rollout reserves its buffer
/// at its first step, before the steps' tensors, and with a slack that makes it fit where the
/// previous one was ([`reserve_slack`]; measurements in `docs/performance.md`).
///
/// `leaves` visits each leaf with a callback (so that no list of them is allocated: the
/// allocations made before the buffer decide where the heap places it).
pub(crate) fn reserve(
    leaves: impl FnOnce(&mut dyn FnMut(&Tensor)) -> Result<()>,
    n: usize,
) -> Result<Option<Reserve>> {
    let mut total = Some(0usize);
    leaves(&mut |t: &Tensor| {
        let kind = t.kind();
        if plain_kind(kind) && is_plain(t, kind, &t.size()) {
            let bytes = t
                .elements()
                .checked_mul(kind.elt_size_in_bytes())
                .and_then(|b| b.checked_mul(n))
                .and_then(|b| b.checked_next_multiple_of(ALIGN));
            total = total.zip(bytes).and_then(|(a, b)| a.checked_add(b));
        }
    })?;
    let Some(total) = total.filter(|t| *t > 0) else {
        return Ok(None);
    };
    let Ok(size) = i64::try_from(total) else {
        return Ok(None);
    };
    // A little more than needed, and a little less each time (see `reserve_slack`).
    let padded = total.saturating_add(reserve_slack());
    let Ok(padded_size) = i64::try_from(padded) else {
        return Ok(Some(Reserve(fresh_buffer(size)?, total)));
    };
    Ok(Some(Reserve(fresh_buffer(padded_size)?, padded)))
}

/// The bytes of a plain contiguous CPU tensor.
///
/// # Safety
/// `t` must be contiguous CPU data; the slice must not outlive `t` nor overlap a live `&mut`.
unsafe fn bytes_of(t: &Tensor) -> &[u8] {
    let n = t
        .elements()
        .checked_mul(t.kind().elt_size_in_bytes())
        .unwrap_or(0);
    // SAFETY: the caller guarantees that `t` is contiguous CPU data, so its `n` bytes from
    // `data_ptr` are one live allocation for as long as `t` is borrowed, and not written
    // through a live `&mut` meanwhile.
    unsafe { std::slice::from_raw_parts(t.data_ptr() as *const u8, n) }
}

/// `dst`'s disjoint regions, one per job, at `offsets`.
fn split_regions<'b>(
    mut dst: &'b mut [u8],
    jobs: &[(Layout, Source<'_>)],
    offsets: &[usize],
) -> Result<Vec<&'b mut [u8]>> {
    let mut regions = Vec::with_capacity(jobs.len());
    let mut pos = 0;
    for ((l, _), &off) in jobs.iter().zip(offsets) {
        let rest = std::mem::take(&mut dst);
        let (_, rest) = rest
            .split_at_mut_checked(off - pos)
            .ok_or_else(|| Error::invalid("stack", "internal: buffer region"))?;
        let (region, rest) = rest
            .split_at_mut_checked(l.bytes())
            .ok_or_else(|| Error::invalid("stack", "internal: buffer region"))?;
        regions.push(region);
        dst = rest;
        pos = off + l.bytes();
    }
    Ok(regions)
}

/// A leaf computed from the rows of another leaf's stack: a copy (no `first`), or a shift by
/// one input: `first`'s block, then the row but its last block.
struct Derived<'a, 'b> {
    rows: std::slice::ChunksExactMut<'b, u8>,
    first: Option<std::slice::ChunksExact<'a, u8>>,
}

/// [`copy_blocks`] with the row width a literal for the common widths: inlined at each arm
/// with its width a constant, the copies are a couple of moves instead of `memcpy` calls.
fn copy_stack(dst: &mut [u8], srcs: &[&[u8]], width: usize, derived: &mut [Derived<'_, '_>]) {
    match width {
        1 => copy_blocks(dst, srcs, 1, derived),
        2 => copy_blocks(dst, srcs, 2, derived),
        4 => copy_blocks(dst, srcs, 4, derived),
        8 => copy_blocks(dst, srcs, 8, derived),
        12 => copy_blocks(dst, srcs, 12, derived),
        16 => copy_blocks(dst, srcs, 16, derived),
        24 => copy_blocks(dst, srcs, 24, derived),
        32 => copy_blocks(dst, srcs, 32, derived),
        width => copy_blocks(dst, srcs, width, derived),
    }
}

/// `dst[(b·n + t)·w ..][..w] = srcs[t][b·w ..][..w]` for every row `b` and input `t` (`w` the
/// row width in bytes), in the output's order: each output row is written whole, front to
/// back, from one block of each input, and the `derived` leaves' rows right after it. In a
/// rollout the inputs were written long before (out of L2) and the output is megabytes:
/// the output is written sequentially (full cache lines, prefetch-friendly) with scattered
/// reads of the inputs, and the copied and shifted leaves are derived from each row while it
/// is in L1 (`docs/performance.md`, W2, step 4).
#[inline(always)]
fn copy_blocks(dst: &mut [u8], srcs: &[&[u8]], width: usize, derived: &mut [Derived<'_, '_>]) {
    let n = srcs.len();
    let row = n * width;
    for (b, drow) in dst.chunks_exact_mut(row).enumerate() {
        let at = b * width..(b + 1) * width;
        for (d, src) in drow.chunks_exact_mut(width).zip(srcs) {
            // Sizes are checked by `stack_consolidated`: every input has every row.
            debug_assert!(src.len() >= at.end, "stack input shorter than its layout");
            if let Some(s) = src.get(at.clone()) {
                d.copy_from_slice(s);
            }
        }
        for der in derived.iter_mut() {
            let Some(out) = der.rows.next() else {
                debug_assert!(false, "derived leaf shorter than its source");
                continue;
            };
            match der.first.as_mut().map(Iterator::next) {
                None => out.copy_from_slice(drow),
                Some(first) => {
                    let parts = (
                        out.split_at_mut_checked(width),
                        first,
                        drow.get(..row - width),
                    );
                    if let (Some((head, tail)), Some(f), Some(body)) = parts {
                        head.copy_from_slice(f);
                        tail.copy_from_slice(body);
                    } else {
                        debug_assert!(false, "shifted leaf shorter than its source");
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stack(inputs: &[&Tensor], dim: usize) -> Tensor {
        let l = layout(inputs, dim).expect("plain inputs");
        let mut out = stack_consolidated(&[(l, Source::Stack(inputs))], None).unwrap();
        out.pop().unwrap()
    }

    /// Equal to `Tensor::stack` (values, shape, dtype, contiguity) over dims, dtypes and
    /// widths, including widths without a compile-time kernel and more rows than one block.
    #[test]
    fn matches_tensor_stack() {
        let cases: &[(&[i64], Kind)] = &[
            (&[1024, 1], Kind::Float),
            (&[1024, 3], Kind::Float),
            (&[1024, 2], Kind::Double),
            (&[1024, 1], Kind::Bool),
            (&[7, 5], Kind::Int64),
            (&[3, 4, 5], Kind::Float),
            (&[9, 3], Kind::Int8),
            (&[40_000, 1], Kind::Float),
            (&[2], Kind::Double),
        ];
        for (shape, kind) in cases {
            for n in [1usize, 2, 200] {
                let inputs: Vec<Tensor> = (0..n)
                    .map(|i| {
                        (Tensor::rand(*shape, (Kind::Float, Device::Cpu)) * 100.0 + i as f64)
                            .to_kind(*kind)
                    })
                    .collect();
                let refs: Vec<&Tensor> = inputs.iter().collect();
                for dim in 1..=shape.len() {
                    let got = stack(&refs, dim);
                    let want = Tensor::stack(&inputs, dim as i64);
                    assert_eq!(
                        got.size(),
                        want.size(),
                        "{shape:?} {kind:?} n={n} dim={dim}"
                    );
                    assert_eq!(got.kind(), want.kind());
                    assert!(got.is_contiguous());
                    assert!(got.equal(&want), "{shape:?} {kind:?} n={n} dim={dim}");
                }
            }
        }
    }

    /// Several leaves of different dtypes in one buffer, each aligned, plus a copy and a shift:
    /// equal to `Tensor::stack` of the same inputs, and writing one leaf leaves the others alone.
    #[test]
    fn consolidated_jobs_match_separate_stacks() {
        let n = 5;
        let obs: Vec<Tensor> = (0..n)
            .map(|i| Tensor::rand([6, 3], (Kind::Float, Device::Cpu)) + i as f64)
            .collect();
        let done: Vec<Tensor> = (0..n)
            .map(|i| Tensor::from_slice(&[i % 2 == 0, true, false]).view([3, 1]))
            .collect();
        let done6: Vec<Tensor> = done.iter().map(|d| d.repeat([2, 1])).collect();
        let first = Tensor::rand([6, 3], (Kind::Float, Device::Cpu));
        let o: Vec<&Tensor> = obs.iter().collect();
        let d: Vec<&Tensor> = done6.iter().collect();
        let lo = layout(&o, 1).unwrap();
        let ld = layout(&d, 1).unwrap();
        let jobs = vec![
            (ld.clone(), Source::Stack(&d)),
            (lo.clone(), Source::Shift(2, &first)),
            (lo.clone(), Source::Stack(&o)),
            (ld, Source::Copy(0)),
        ];
        let mut out = stack_consolidated(&jobs, None).unwrap();
        let want_o = Tensor::stack(&obs, 1);
        let want_d = Tensor::stack(&done6, 1);
        let mut shifted: Vec<Tensor> = vec![first.shallow_clone()];
        shifted.extend(obs.iter().take(n - 1).map(|t| t.shallow_clone()));
        let want_s = Tensor::stack(&shifted, 1);
        assert!(out[0].equal(&want_d));
        assert!(out[1].equal(&want_s));
        assert!(out[2].equal(&want_o));
        assert!(out[3].equal(&want_d));
        for t in &out {
            assert!(t.is_contiguous());
            assert_eq!(t.data_ptr() as usize % ALIGN, 0);
        }
        let _ = out[3].fill_(0);
        assert!(out[0].equal(&want_d), "a copy is its own memory");
        assert!(out[2].equal(&want_o));
    }

    #[test]
    fn declines_what_it_does_not_handle() {
        let a = Tensor::ones([4, 2], (Kind::Float, Device::Cpu));
        let t = a.t_copy().transpose(0, 1); // not contiguous
        assert!(layout(&[&a, &a], 0).is_none(), "dim 0");
        assert!(layout(&[&t, &t], 1).is_none(), "non-contiguous");
        let g = a.copy().set_requires_grad(true);
        assert!(layout(&[&g, &g], 1).is_none(), "requires grad");
        let d = a.to_kind(Kind::Double);
        assert!(layout(&[&a, &d], 1).is_none(), "mixed dtypes");
        let e = Tensor::ones([0, 2], (Kind::Float, Device::Cpu));
        assert!(layout(&[&e, &e], 1).is_none(), "empty");
        assert!(layout(&[], 1).is_none(), "no inputs");
    }
}
