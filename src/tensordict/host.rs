//! Writing CPU tensors from host values in place, for the hot paths of environments and
//! samplers where a `Vec`, a copy into a new tensor, or an extra op (a `reshape`, a `to_kind`)
//! costs about as much as the arithmetic.

use std::marker::PhantomData;
use std::mem::MaybeUninit;

use tch::{Device, Kind, Tensor};

use crate::error::Result;
use crate::tensordict::Elements;

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
