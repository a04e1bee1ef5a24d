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
