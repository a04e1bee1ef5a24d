//! [`tanh`]: `torch.tanh` for the [`MLP`](super::MLP)'s Tanh activation (TorchRL's default),
//! with a faster float32 kernel on non-Intel CPUs with AVX2 and FMA.
//!
//! libtorch's CPU `tanh` calls MKL's `vsTanh`, which on AMD CPUs (where MKL does not take its
//! Intel code paths) runs at 3.7–4.0 ns an element (a 2-core AMD EPYC, Zen 2): 13 % of the
//! SAC-on-Pendulum example's run. The kernel in `tanh.cpp` runs at about 1.05 ns an element
//! there. Its results are within 1 ulp of the correctly rounded tanh on every float32 input
//! (on 0.25 % of inputs they differ from it by that ulp, as MKL's may); its gradient is
//! libtorch's own `tanh_backward` of the output, as for `Tensor::tanh`.
//!
//! Where it runs: contiguous float32 CPU tensors, on a CPU with AVX2 and FMA that is not
//! Intel's. On Intel CPUs MKL takes its own optimized paths, which have not been measured
//! against this kernel, so they keep libtorch's `tanh` unless the environment variable
//! `TORCHRL_TANH_KERNEL` is `1`; with `0` every CPU keeps it (bitwise libtorch results, or to
//! compare the two). The variable is read once, at the first call. Everything else — other
//! dtypes, non-contiguous tensors, CUDA, a CPU without AVX2, a build without the C++ shims —
//! goes to `Tensor::tanh` unchanged.
//!
//! ```
//! use tch::{Device, Kind, Tensor};
//! use torchrl::modules::models::tanh;
//! # fn main() -> torchrl::Result<()> {
//! let x = Tensor::from_slice(&[-20.0f32, -1.0, 0.0, 0.5, 3.0]).set_requires_grad(true);
//! let y = tanh(&x)?;
//! for (i, v) in [-20.0f64, -1.0, 0.0, 0.5, 3.0].iter().enumerate() {
//!     // within one float32 ulp of the exact value
//!     assert!((y.double_value(&[i as i64]) - v.tanh()).abs() <= 1.2e-7);
//! }
//! // d tanh(x) / dx = 1 - tanh(x)^2
//! y.sum(Kind::Float).backward();
//! let g = x.grad().double_value(&[3]);
//! assert!((g - (1.0 - 0.5f64.tanh().powi(2))).abs() < 1e-6);
//! // other dtypes are libtorch's tanh
//! let d = Tensor::from_slice(&[0.5f64]);
//! assert_eq!(tanh(&d)?.double_value(&[0]), d.tanh().double_value(&[0]));
//! # Ok(()) }
//! ```

use tch::Tensor;

use crate::error::Result;

/// `tanh(x)`, differentiable: the AVX2 kernel for a contiguous float32 CPU tensor where
/// [`tanh_kernel_available`], [`Tensor::f_tanh`] otherwise (see the [module docs](self)).
pub fn tanh(x: &Tensor) -> Result<Tensor> {
    if ffi::available() {
        ffi::tanh(x, true)
    } else {
        Ok(x.f_tanh()?)
    }
}

/// Whether [`tanh`] runs its own kernel on this machine for contiguous float32 CPU tensors:
/// built with the C++ shims, on a CPU with AVX2 and FMA, not Intel's unless
/// `TORCHRL_TANH_KERNEL` is `1`, and `TORCHRL_TANH_KERNEL` not `0` (see the [module docs](self)).
pub fn tanh_kernel_available() -> bool {
    ffi::available()
}

#[cfg(torchrl_shims)]
mod ffi {
    use std::ffi::{c_char, c_int, c_void, CStr};

    use tch::Tensor;

    use crate::error::{Error, Result};

    extern "C" {
        fn trl_tanh_kernel_cpu() -> c_int;
        fn trl_tanh(
            x: *mut c_void,
            kernel: c_int,
            out: *mut *mut c_void,
            err: *mut c_char,
            len: usize,
        ) -> c_int;
    }

    const ERR_LEN: usize = 1024;

    /// 0: the CPU cannot run the kernel; 1: it can (not Intel's); 2: it can (Intel's).
    pub(super) fn cpu() -> c_int {
        static CPU: std::sync::OnceLock<c_int> = std::sync::OnceLock::new();
        // SAFETY: no arguments; the function only reads the CPU's vendor and feature bits.
        *CPU.get_or_init(|| unsafe { trl_tanh_kernel_cpu() })
    }

    pub(super) fn available() -> bool {
        static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *AVAILABLE.get_or_init(|| {
            let choice = std::env::var("TORCHRL_TANH_KERNEL").ok();
            match choice.as_deref().map(str::trim) {
                Some("0") => false,
                Some("1") => cpu() != 0,
                _ => cpu() == 1,
            }
        })
    }

    /// tanh through the shim: the kernel where `kernel` and the tensor and CPU allow it.
    pub(super) fn tanh(x: &Tensor, kernel: bool) -> Result<Tensor> {
        let mut out: *mut c_void = std::ptr::null_mut();
        let mut err = vec![0u8; ERR_LEN];
        // SAFETY: `x` is a live tensor handle for the call; `out` and `err` are valid for
        // writes of a pointer and ERR_LEN bytes; the shim catches every C++ exception.
        let status = unsafe {
            trl_tanh(
                x.as_ptr() as *mut c_void,
                c_int::from(kernel),
                &mut out,
                err.as_mut_ptr() as *mut c_char,
                ERR_LEN,
            )
        };
        if status != 0 || out.is_null() {
            let msg = CStr::from_bytes_until_nul(&err)
                .map(|c| c.to_string_lossy().into_owned())
                .unwrap_or_default();
            return Err(Error::invalid("tanh", format!("libtorch: {msg}")));
        }
        // SAFETY: on success the shim wrote a new heap `at::Tensor*` that nothing else owns;
        // tch's Tensor takes ownership and frees it on drop.
        Ok(unsafe { Tensor::from_ptr(out as *mut torch_sys::C_tensor) })
    }
}

#[cfg(not(torchrl_shims))]
mod ffi {
    use tch::Tensor;

    use crate::error::Result;

    #[cfg(test)]
    pub(super) fn cpu() -> i32 {
        0
    }

    pub(super) fn available() -> bool {
        false
    }

    pub(super) fn tanh(x: &Tensor, _kernel: bool) -> Result<Tensor> {
        Ok(x.f_tanh()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Device, Kind};

    /// The kernel wherever this CPU can run it, whatever the vendor and `TORCHRL_TANH_KERNEL`
    /// (what [`tanh`] runs by default on non-Intel CPUs); libtorch's tanh elsewhere.
    fn kernel_tanh(x: &Tensor) -> Tensor {
        ffi::tanh(x, ffi::cpu() != 0).unwrap()
    }

    /// Distance in float32 ulps (the values' bit patterns as ordered integers).
    fn ulps(a: f32, b: f32) -> i64 {
        let key = |v: f32| {
            let i = i64::from(v.to_bits() as i32);
            if i < 0 {
                i64::from(i32::MIN) - i
            } else {
                i
            }
        };
        (key(a) - key(b)).abs()
    }

    /// Every `step`-th positive float32 from 1e-30 to 12, both signs, and the special values,
    /// against the float64 tanh rounded to float32.
    #[test]
    fn within_one_ulp_of_the_rounded_float64_tanh() {
        let mut xs: Vec<f32> = Vec::new();
        let mut bits = 1e-30f32.to_bits();
        while bits < 12.0f32.to_bits() {
            let v = f32::from_bits(bits);
            xs.push(v);
            xs.push(-v);
            bits += 997;
        }
        xs.extend([
            0.0,
            -0.0,
            0.9,
            -0.9,
            10.0,
            1e30,
            f32::INFINITY,
            f32::NEG_INFINITY,
        ]);
        let x = Tensor::from_slice(&xs);
        let y: Vec<f32> = Vec::try_from(&kernel_tanh(&x)).unwrap();
        let mut off = 0usize;
        for (v, got) in xs.iter().zip(&y) {
            let want = f64::from(*v).tanh() as f32;
            let d = ulps(*got, want);
            assert!(d <= 1, "tanh({v:e}) = {got:e}, want {want:e} ({d} ulps)");
            off += usize::from(d == 1);
        }
        if ffi::cpu() != 0 {
            // the kernel is off by its ulp on a small share of inputs (0.25 % over all floats)
            assert!(off * 100 < xs.len(), "{off} of {} off by one ulp", xs.len());
        }
        assert_eq!(y[y.len() - 2], 1.0);
        assert_eq!(y[y.len() - 1], -1.0);
        assert!(0.0f32.eq(&y[xs.len() - 8]) && y[xs.len() - 7].is_sign_negative());
        let nan = kernel_tanh(&Tensor::from_slice(&[f32::NAN, 1.0]));
        assert!(nan.double_value(&[0]).is_nan());
    }

    /// Lengths around the kernel's blocks of 32 and 8 lanes (tails included), and a narrowed
    /// contiguous view (storage offset), agree with libtorch's tanh to an ulp.
    #[test]
    fn every_length_and_offset_matches_libtorch() {
        let base = Tensor::randn([200], (Kind::Float, Device::Cpu)) * 3.0;
        for n in [0i64, 1, 7, 8, 9, 31, 32, 33, 63, 100, 199] {
            for offset in [0i64, 1] {
                let x = base.narrow(0, offset, n);
                let got: Vec<f32> = Vec::try_from(&kernel_tanh(&x)).unwrap();
                let want: Vec<f32> = Vec::try_from(&x.tanh()).unwrap();
                assert_eq!(got.len(), n as usize);
                for (g, w) in got.iter().zip(&want) {
                    assert!(ulps(*g, *w) <= 2, "n {n}: {g} vs {w}");
                }
            }
        }
    }

    /// The gradient is `tanh_backward` of the output, as libtorch's; a second derivative goes
    /// through it too.
    #[test]
    fn gradients_match_libtorch() {
        let x0 = Tensor::linspace(-6.0, 6.0, 97, (Kind::Float, Device::Cpu));
        let w = Tensor::linspace(0.5, 1.5, 97, (Kind::Float, Device::Cpu));
        let ours = x0.copy().set_requires_grad(true);
        let theirs = x0.copy().set_requires_grad(true);
        let y = kernel_tanh(&ours);
        (&y * &w).sum(Kind::Float).backward();
        (theirs.tanh() * &w).sum(Kind::Float).backward();
        let diff = (ours.grad() - theirs.grad()).abs().max().double_value(&[]);
        assert!(diff < 1e-6, "max gradient difference {diff}");
        // hand derivation at one point: w (1 - tanh(x)^2)
        let i = 60;
        let xv = x0.double_value(&[i]);
        let want = w.double_value(&[i]) * (1.0 - xv.tanh().powi(2));
        assert!((ours.grad().double_value(&[i]) - want).abs() < 1e-6);

        let z = Tensor::from_slice(&[0.3f32]).set_requires_grad(true);
        let t = kernel_tanh(&z);
        let g = Tensor::run_backward(&[&t], &[&z], true, true);
        let gg = Tensor::run_backward(&[&g[0]], &[&z], false, false);
        // d²/dx² tanh = -2 tanh (1 - tanh²)
        let th = 0.3f64.tanh();
        assert!((gg[0].double_value(&[0]) + 2.0 * th * (1.0 - th * th)).abs() < 1e-6);
    }

    /// Tensors the kernel does not take are libtorch's tanh, bit for bit.
    #[test]
    fn other_tensors_are_libtorch_tanh() {
        let d = Tensor::randn([5, 3], (Kind::Double, Device::Cpu));
        assert!(kernel_tanh(&d).equal(&d.tanh()));
        let f = Tensor::randn([5, 3], (Kind::Float, Device::Cpu));
        let strided = f.tr();
        assert!(kernel_tanh(&strided).equal(&strided.tanh()));
        let h = f.to_kind(Kind::BFloat16);
        assert!(kernel_tanh(&h).equal(&h.tanh()));
    }
}
