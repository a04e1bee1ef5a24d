//! `stack` along a dim after the first, for CPU tensors, as a blocked copy on the host.
//!
//! libtorch stacks along dim `d > 0` with `cat`'s serial kernel: for each of the `outer`
//! positions before `d` it copies one small block from each input (`outer × n` `memcpy` calls
//! of a few bytes). A rollout of 1024 batched envs stacks 200 steps of `[1024, k]` leaves
//! along dim 1: 204,800 blocks of 4–16 bytes per leaf, ≈ 12–24 µs per step in all. Here the
//! same copy runs in blocks of rows that fit the L2 cache, with the row width known at
//! compile time for the common widths: about half of `cat`'s time for 1–4-byte rows (rewards,
//! actions, flags), ≈ 0.75× for 16-byte rows and on par for 12-byte rows (measured with
//! 200 inputs of `[1024, k]`).
//!
//! Only plain data is handled: CPU, contiguous, one dtype, no autograd, no conjugate or
//! negative views; everything else (and an empty result) returns `None` for the caller to use
//! `Tensor::stack`.

use tch::{Device, Tensor};

use crate::error::Result;

/// Output bytes per block of rows: small enough to stay in L2 while every input is read.
const BLOCK_BYTES: usize = 128 * 1024;

/// `Tensor::stack(inputs, dim)` for `dim ≥ 1`, or `None` when the inputs are not plain
/// contiguous CPU data of one dtype and shape (the caller then uses `Tensor::stack`).
pub(crate) fn stack_host(inputs: &[&Tensor], dim: usize) -> Result<Option<Tensor>> {
    let Some(first) = inputs.first() else {
        return Ok(None);
    };
    let shape = first.size();
    let kind = first.kind();
    if dim == 0 || dim > shape.len() || first.device() != Device::Cpu {
        return Ok(None);
    }
    let plain = |t: &Tensor| {
        t.device() == Device::Cpu
            && t.kind() == kind
            && t.size() == shape
            && t.is_contiguous()
            && !t.requires_grad()
            && !t.is_conj()
            && !t.is_neg()
    };
    if !inputs.iter().all(|t| plain(t)) {
        return Ok(None);
    }
    let dims: Vec<usize> = match shape.iter().map(|d| usize::try_from(*d).ok()).collect() {
        Some(d) => d,
        None => return Ok(None),
    };
    let (before, after) = dims.split_at(dim);
    let outer = before.iter().try_fold(1usize, |a, d| a.checked_mul(*d));
    let inner = after
        .iter()
        .try_fold(kind.elt_size_in_bytes(), |a, d| a.checked_mul(*d));
    let n = inputs.len();
    let (Some(outer), Some(inner)) = (outer, inner) else {
        return Ok(None);
    };
    let Some(total) = outer.checked_mul(inner).and_then(|b| b.checked_mul(n)) else {
        return Ok(None);
    };
    if total == 0 {
        return Ok(None);
    }
    let mut out_shape = shape.clone();
    out_shape.insert(dim, n as i64);
    let out = Tensor::f_empty(out_shape.as_slice(), (kind, Device::Cpu))?;
    // SAFETY: `out` is a fresh contiguous CPU tensor of `total` bytes that nothing else refers
    // to; each input is a contiguous CPU tensor of `outer * inner` bytes (checked above) that
    // is only read, and none of them is `out`. The slices do not outlive this call, during
    // which `out` and the inputs are borrowed (so not dropped or resized).
    let dst = unsafe { std::slice::from_raw_parts_mut(out.data_ptr() as *mut u8, total) };
    let srcs: Vec<&[u8]> = inputs
        .iter()
        .map(|t| unsafe { std::slice::from_raw_parts(t.data_ptr() as *const u8, outer * inner) })
        .collect();
    // Literal widths: `copy_blocks` is inlined at each arm with its width a constant, so the
    // common row sizes copy with a couple of moves instead of a `memcpy` call.
    match inner {
        1 => copy_blocks(dst, &srcs, 1),
        2 => copy_blocks(dst, &srcs, 2),
        4 => copy_blocks(dst, &srcs, 4),
        8 => copy_blocks(dst, &srcs, 8),
        12 => copy_blocks(dst, &srcs, 12),
        16 => copy_blocks(dst, &srcs, 16),
        24 => copy_blocks(dst, &srcs, 24),
        32 => copy_blocks(dst, &srcs, 32),
        width => copy_blocks(dst, &srcs, width),
    }
    Ok(Some(out))
}

/// `dst[(b·n + t)·w ..][..w] = srcs[t][b·w ..][..w]` for every row `b` and input `t` (`w` the
/// row width in bytes), a block of rows at a time.
#[inline(always)]
fn copy_blocks(dst: &mut [u8], srcs: &[&[u8]], width: usize) {
    let n = srcs.len();
    let rows = (BLOCK_BYTES / (width * n)).max(1);
    for (bi, dblock) in dst.chunks_mut(rows * n * width).enumerate() {
        for (t, src) in srcs.iter().enumerate() {
            let Some(sblock) = src.chunks(rows * width).nth(bi) else {
                continue;
            };
            let rows = dblock
                .chunks_exact_mut(n * width)
                .zip(sblock.chunks_exact(width));
            for (drow, srow) in rows {
                if let Some(d) = drow.chunks_exact_mut(width).nth(t) {
                    d.copy_from_slice(srow);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Kind;

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
                    let got = stack_host(&refs, dim).unwrap().expect("plain inputs");
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

    #[test]
    fn declines_what_it_does_not_handle() {
        let a = Tensor::ones([4, 2], (Kind::Float, Device::Cpu));
        let t = a.t_copy().transpose(0, 1); // not contiguous
        assert!(stack_host(&[&a, &a], 0).unwrap().is_none(), "dim 0");
        assert!(
            stack_host(&[&t, &t], 1).unwrap().is_none(),
            "non-contiguous"
        );
        let g = a.copy().set_requires_grad(true);
        assert!(stack_host(&[&g, &g], 1).unwrap().is_none(), "requires grad");
        let d = a.to_kind(Kind::Double);
        assert!(stack_host(&[&a, &d], 1).unwrap().is_none(), "mixed dtypes");
        let e = Tensor::ones([0, 2], (Kind::Float, Device::Cpu));
        assert!(stack_host(&[&e, &e], 1).unwrap().is_none(), "empty");
        assert!(stack_host(&[], 1).unwrap().is_none(), "no inputs");
    }
}
