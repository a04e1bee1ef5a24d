//! Writing CPU tensors from host values in place, for the hot paths of environments and
//! samplers where a `Vec`, a copy into a new tensor, or an extra op (a `reshape`, a `to_kind`)
//! costs about as much as the arithmetic.

use std::marker::PhantomData;
use std::mem::MaybeUninit;

use tch::{Device, Kind, Tensor};

use super::Elements;
use crate::error::Result;

/// A host scalar type with a matching libtorch dtype of the same size and layout.
pub(crate) trait HostScalar: Copy {
    /// The libtorch dtype.
    const KIND: Kind;
}

impl HostScalar for f32 {
    const KIND: Kind = Kind::Float;
}

impl HostScalar for f64 {
    const KIND: Kind = Kind::Double;
}

/// A fresh CPU tensor whose elements are written on the host, in place: no intermediate
/// `Vec`, no copy. [`HostOut::slots`] hands out the (uninitialised) elements; the caller writes
/// every one of them before taking the tensor with [`HostOut::into_tensor`].
pub(crate) struct HostOut<T: HostScalar> {
    tensor: Tensor,
    len: usize,
    _elem: PhantomData<T>,
}

impl<T: HostScalar> HostOut<T> {
    /// An uninitialised contiguous CPU tensor of `shape` and dtype `T::KIND`.
    pub(crate) fn new(shape: &[i64]) -> Result<Self> {
        let tensor = Tensor::f_empty(shape, (T::KIND, Device::Cpu))?;
        let len = tensor.elements();
        Ok(HostOut {
            tensor,
            len,
            _elem: PhantomData,
        })
    }

    /// The tensor's elements in row-major order, to be written.
    pub(crate) fn slots(&mut self) -> &mut [MaybeUninit<T>] {
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: `tensor` is a contiguous CPU tensor of `len` elements of `T::KIND`, whose
        // layout is `T`'s (`HostScalar`), allocated by `new` and owned by `self` alone (never
        // handed out before `into_tensor` consumes `self`), so nothing else reads or writes it
        // while this borrow of `self` lives; `MaybeUninit` makes no claim about the contents.
        unsafe {
            std::slice::from_raw_parts_mut(self.tensor.data_ptr() as *mut MaybeUninit<T>, self.len)
        }
    }

    /// The tensor, once every slot is written.
    pub(crate) fn into_tensor(self) -> Tensor {
        self.tensor
    }
}

/// A CPU scratch tensor owned by one Rust value and never handed out: the target of libtorch
/// `out=` ops ([`HostBuf::out`]) and read or written on the host in place. Created zeroed, and
/// only ever written with values of `T` (by the host or by libtorch ops of dtype `T::KIND`),
/// so its elements are always initialised.
pub(crate) struct HostBuf<T: HostScalar> {
    tensor: Tensor,
    len: usize,
    _elem: PhantomData<T>,
}

impl<T: HostScalar> HostBuf<T> {
    /// A zeroed contiguous CPU tensor of `len` elements.
    pub(crate) fn zeros(len: usize) -> Result<Self> {
        let size = i64::try_from(len).unwrap_or(i64::MAX);
        let tensor = Tensor::f_zeros([size], (T::KIND, Device::Cpu))?;
        Ok(HostBuf {
            len: tensor.elements(),
            tensor,
            _elem: PhantomData,
        })
    }

    /// The number of elements.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The elements.
    pub(crate) fn as_slice(&self) -> &[T] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: `tensor` is a contiguous CPU tensor of `len` initialised elements of
        // `T::KIND` (zeroed, then only written with `T` values), with `T`'s layout; it is
        // written only through `as_mut_slice` and `out`, which take `&mut self`, so not while
        // this shared borrow lives.
        unsafe { std::slice::from_raw_parts(self.tensor.data_ptr() as *const T, self.len) }
    }

    /// The elements, to be written.
    pub(crate) fn as_mut_slice(&mut self) -> &mut [T] {
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: as in `as_slice`; `&mut self` makes this the only access.
        unsafe { std::slice::from_raw_parts_mut(self.tensor.data_ptr() as *mut T, self.len) }
    }

    /// The tensor as an input of libtorch ops (read only: never pass it as an `out` argument;
    /// use [`HostBuf::out`]).
    pub(crate) fn tensor(&self) -> &Tensor {
        &self.tensor
    }

    /// The tensor as the `out` argument of a libtorch op of dtype `T::KIND` and the same
    /// number of elements (`&mut self`: no slice of it is alive while libtorch writes it).
    pub(crate) fn out(&mut self) -> &Tensor {
        &self.tensor
    }
}

/// Rows `rows` of the contiguous CPU matrix `src` (`[capacity, width]`, any dtype), split into
/// column blocks of `widths` elements: one fresh contiguous `[rows.len(), w]` tensor per block,
/// what `index_select(0, rows)` then `split_with_sizes_copy(widths, 1)` give, as one pass of
/// row copies (a sampled replay item's leaves are adjacent columns of its row). `None` (nothing
/// done) when `src` is not such a matrix, a row is out of range, or the widths do not add up to
/// its width: the caller then takes the libtorch ops.
pub(crate) fn gather_row_blocks(
    src: &Tensor,
    rows: &[i64],
    widths: &[i64],
) -> Result<Option<Vec<Tensor>>> {
    let size = src.size();
    let (&[capacity, width], Device::Cpu) = (size.as_slice(), src.device()) else {
        return Ok(None);
    };
    let fits = src.is_contiguous()
        && widths.iter().all(|w| *w >= 0)
        && widths.iter().sum::<i64>() == width
        && rows.iter().all(|r| (0..capacity).contains(r));
    if !fits {
        return Ok(None);
    }
    let kind = src.kind();
    let es = kind.elt_size_in_bytes();
    let n = i64::try_from(rows.len()).unwrap_or(i64::MAX);
    let row_bytes = usize::try_from(width).unwrap_or(0) * es;
    let outs = widths
        .iter()
        .map(|w| Tensor::f_empty([n, *w], (kind, Device::Cpu)))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let base = src.data_ptr() as *const u8;
    let mut offset = 0usize;
    for (out, w) in outs.iter().zip(widths) {
        let w_bytes = usize::try_from(*w).unwrap_or(0) * es;
        if w_bytes > 0 && !rows.is_empty() {
            let dst = out.data_ptr() as *mut u8;
            for (i, r) in rows.iter().enumerate() {
                let r = usize::try_from(*r).unwrap_or(0);
                // SAFETY: `src` is a contiguous CPU tensor of `capacity` rows of `row_bytes`
                // bytes (checked above), so row `r < capacity` spans bytes `r * row_bytes ..
                // (r + 1) * row_bytes` of its live allocation, and `offset + w_bytes <=
                // row_bytes` (the widths add up to the row). `out` is a fresh contiguous CPU
                // tensor of `rows.len()` rows of `w_bytes` bytes, made above and not yet shared,
                // so row `i` is in bounds and nothing else accesses it; the two do not overlap.
                // The bytes of any dtype are valid bytes of the same dtype.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        base.add(r * row_bytes + offset),
                        dst.add(i * w_bytes),
                        w_bytes,
                    );
                }
            }
        }
        offset += w_bytes;
    }
    Ok(Some(outs))
}

/// Writes `blocks` (contiguous CPU `[n, w_k]` tensors of `dst`'s dtype) side by side into rows
/// `start, start + 1, …` (modulo its row count) of the contiguous CPU matrix `dst`
/// (`[capacity, Σ w_k]`, `n <= capacity`): what copying `cat(blocks, 1)` into those one or two
/// row ranges does, as one pass of row copies. Returns `false`, having written nothing, when
/// the shapes, dtypes or layouts are not those, or a block's memory overlaps `dst`'s: the
/// caller then takes the libtorch ops.
pub(crate) fn scatter_row_blocks(dst: &Tensor, start: i64, blocks: &[Tensor]) -> Result<bool> {
    let size = dst.size();
    let (&[capacity, width], Device::Cpu) = (size.as_slice(), dst.device()) else {
        return Ok(false);
    };
    let kind = dst.kind();
    let es = kind.elt_size_in_bytes();
    let n = blocks
        .first()
        .and_then(|b| b.size().first().copied())
        .unwrap_or(0);
    let span = |t: &Tensor| {
        let lo = t.data_ptr() as usize;
        (lo, lo + t.elements() * es)
    };
    let (d0, d1) = span(dst);
    let fits = dst.is_contiguous()
        && (0..capacity).contains(&start)
        && n <= capacity
        && blocks
            .iter()
            .map(|b| b.size().get(1).copied().unwrap_or(-1))
            .sum::<i64>()
            == width
        && blocks.iter().all(|b| {
            let (b0, b1) = span(b);
            b.dim() == 2
                && b.size().first() == Some(&n)
                && b.kind() == kind
                && b.device() == Device::Cpu
                && b.is_contiguous()
                && (b1 <= d0 || d1 <= b0)
        });
    if !fits {
        return Ok(false);
    }
    let row_bytes = usize::try_from(width).unwrap_or(0) * es;
    let (start, capacity) = (
        usize::try_from(start).unwrap_or(0),
        usize::try_from(capacity).unwrap_or(0),
    );
    let base = dst.data_ptr() as *mut u8;
    let mut offset = 0usize;
    for b in blocks {
        let w_bytes = usize::try_from(b.size().get(1).copied().unwrap_or(0)).unwrap_or(0) * es;
        if w_bytes > 0 {
            let src = b.data_ptr() as *const u8;
            for i in 0..usize::try_from(n).unwrap_or(0) {
                let row = (start + i) % capacity;
                // SAFETY: `dst` is a contiguous CPU tensor of `capacity` rows of `row_bytes`
                // bytes and `row < capacity`, `offset + w_bytes <= row_bytes` (the widths add up
                // to the row), so the target bytes lie in its allocation; `b` is a contiguous CPU
                // tensor of `n` rows of `w_bytes` bytes and `i < n`. The two allocations do not
                // overlap (checked above), and both dtypes are `kind`.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        src.add(i * w_bytes),
                        base.add(row * row_bytes + offset),
                        w_bytes,
                    );
                }
            }
        }
        offset += w_bytes;
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use tch::{Device, Kind, Tensor};

    use super::{gather_row_blocks, scatter_row_blocks};

    #[test]
    fn row_blocks_are_the_libtorch_gather_and_write() {
        for kind in [Kind::Float, Kind::Bool, Kind::Int64, Kind::Double] {
            let src = Tensor::randn([50, 7], (Kind::Float, Device::Cpu))
                .gt(0.0)
                .to_kind(Kind::Float)
                .g_mul_scalar(3.0)
                .to_kind(kind);
            let widths = [3i64, 0, 1, 3];
            let rows = [4i64, 49, 0, 4, 17];
            let got = gather_row_blocks(&src, &rows, &widths)
                .unwrap()
                .expect("fits");
            let want = src
                .index_select(0, &Tensor::from_slice(&rows))
                .split_with_sizes_copy(widths.as_slice(), 1);
            assert_eq!(got.len(), want.len());
            for (g, w) in got.iter().zip(&want) {
                assert!(
                    g.is_contiguous() && g.kind() == kind && g.equal(w),
                    "{kind:?}"
                );
            }
            // writing the blocks back at rows 48, 49, 0, 1, 2 (wrapping)
            let dst = Tensor::zeros([50, 7], (kind, Device::Cpu));
            assert!(scatter_row_blocks(&dst, 48, &got).unwrap());
            let rows_back = Tensor::cat(&got, 1);
            assert!(dst.narrow(0, 48, 2).equal(&rows_back.narrow(0, 0, 2)));
            assert!(dst.narrow(0, 0, 3).equal(&rows_back.narrow(0, 2, 3)));
            assert_eq!(
                dst.narrow(0, 3, 45)
                    .count_nonzero(None::<i64>)
                    .int64_value(&[]),
                0
            );
        }
    }

    #[test]
    fn what_does_not_fit_is_left_to_libtorch() {
        let src = Tensor::arange(56, (Kind::Float, Device::Cpu)).view([8, 7]);
        let gather = |t: &Tensor, rows: &[i64], widths: &[i64]| {
            gather_row_blocks(t, rows, widths).unwrap().is_none()
        };
        assert!(gather(&src.tr(), &[0], &[8])); // not contiguous
        assert!(gather(&src, &[0], &[3, 3])); // widths short of the row
        assert!(gather(&src, &[8], &[7])); // a row out of range
        assert!(gather(&src, &[-1], &[7]));
        assert!(gather(&src.view([56]), &[0], &[1])); // not a matrix
        let block = Tensor::ones([2, 7], (Kind::Float, Device::Cpu));
        let scatter = |dst: &Tensor, start: i64, blocks: &[Tensor]| {
            !scatter_row_blocks(dst, start, blocks).unwrap()
        };
        assert!(scatter(&src, 8, &[block.shallow_clone()])); // start out of range
        assert!(scatter(&src, 0, &[block.to_kind(Kind::Double)])); // another dtype
        assert!(scatter(&src, 0, &[block.narrow(1, 0, 3)])); // widths short of the row
        assert!(scatter(&src, 0, &[src.narrow(0, 2, 2)])); // the destination's own memory
        assert!(scatter(
            &src.tr().contiguous().tr(),
            0,
            &[block.shallow_clone()]
        ));
        // nothing was written by any refusal
        assert!(src.equal(&Tensor::arange(56, (Kind::Float, Device::Cpu)).view([8, 7])));
    }
}
