//! Building small CPU tensors from host values in one libtorch call (shape included), for the
//! hot paths of small environments where each extra op (a `reshape`, a `to_kind`) costs about
//! as much as the arithmetic.

use tch::{Kind, Tensor};

use crate::error::Result;

/// A host scalar type with a matching libtorch dtype.
pub(crate) trait HostScalar: Copy {
    /// The libtorch dtype.
    const KIND: Kind;
    /// Appends the native-endian bytes of `self`.
    fn put(self, out: &mut Vec<u8>);
}

impl HostScalar for f32 {
    const KIND: Kind = Kind::Float;
    fn put(self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_ne_bytes());
    }
}

impl HostScalar for f64 {
    const KIND: Kind = Kind::Double;
    fn put(self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_ne_bytes());
    }
}

impl HostScalar for bool {
    const KIND: Kind = Kind::Bool;
    fn put(self, out: &mut Vec<u8>) {
        out.push(u8::from(self));
    }
}

impl HostScalar for i64 {
    const KIND: Kind = Kind::Int64;
    fn put(self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_ne_bytes());
    }
}

/// A CPU tensor of `shape` holding `values` (row-major); errors when the counts differ.
pub(crate) fn host_tensor<T: HostScalar>(values: &[T], shape: &[i64]) -> Result<Tensor> {
    let mut bytes = Vec::with_capacity(values.len() * T::KIND.elt_size_in_bytes());
    for v in values {
        v.put(&mut bytes);
    }
    Ok(Tensor::f_from_data_size(&bytes, shape, T::KIND)?)
}
