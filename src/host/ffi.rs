//! Direct calls into libtorch's C API (`torch_sys`), where tch's safe wrapper costs an
//! allocation on a hot path.

use tch::Tensor;

/// True when `t`'s leading dims equal `prefix`, without allocating (this check runs on every
/// `TensorDict::set`, and `Tensor::size` allocates a `Vec`).
#[inline]
pub(crate) fn leading_dims_are(t: &Tensor, prefix: &[i64]) -> bool {
    let dim = t.dim();
    if dim < prefix.len() {
        return false;
    }
    if prefix.is_empty() {
        return true;
    }
    let mut buf = [0i64; 8];
    if dim > buf.len() {
        // The slow path: more dims than the stack buffer holds.
        return t.size().starts_with(prefix);
    }
    // SAFETY: `t` is a live, defined tensor (`dim()` above succeeded on it), and `at_shape`
    // writes exactly `dim` <= 8 values into `buf`.
    unsafe { torch_sys::at_shape(t.as_ptr() as *mut torch_sys::C_tensor, buf.as_mut_ptr()) };
    buf.get(..prefix.len()) == Some(prefix)
}

/// Whether autograd records operations now (libtorch's `GradMode::is_enabled`; false inside
/// `tch::no_grad`). tch has no getter: the setter returns the previous state, which is put
/// back at once.
pub(crate) fn grad_enabled() -> bool {
    // SAFETY: `at_grad_set_enabled` only flips libtorch's thread-local grad mode and returns
    // the previous value; the second call restores that value before anything else runs on
    // this thread.
    unsafe {
        let before = torch_sys::at_grad_set_enabled(1);
        torch_sys::at_grad_set_enabled(before);
        before != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Device, Kind};

    #[test]
    fn leading_dims_match_size() {
        let t = Tensor::zeros([2, 3, 4], (Kind::Float, Device::Cpu));
        assert!(leading_dims_are(&t, &[]));
        assert!(leading_dims_are(&t, &[2, 3]));
        assert!(!leading_dims_are(&t, &[3]));
        assert!(!leading_dims_are(&t, &[2, 3, 4, 1]));
        let big = Tensor::zeros([1; 9], (Kind::Float, Device::Cpu));
        assert!(leading_dims_are(&big, &[1; 9]));
    }

    #[test]
    fn grad_mode_is_read_and_left_as_it_was() {
        assert!(grad_enabled());
        tch::no_grad(|| assert!(!grad_enabled()));
        assert!(grad_enabled());
    }
}
