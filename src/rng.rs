//! A seedable, deterministic pseudo-random generator for spec sampling.
//!
//! [`Generator`] is xoshiro256** (Blackman & Vigna) seeded through SplitMix64, implemented here
//! in plain Rust so that samples do not depend on libtorch's global RNG state, on the device, or
//! on the libtorch version: the same seed always gives bit-identical samples. Every sampler draws
//! its numbers on the CPU in row-major order and then builds the tensor and moves it to the
//! requested device.
//!
//! It is not a cryptographic generator.
//!
//! ```
//! use tch::{Device, Kind};
//! use torchrl::Generator;
//! # fn main() -> torchrl::Result<()> {
//! let mut a = Generator::new(7);
//! let mut b = Generator::new(7);
//! let x = a.uniform(&[2, 3], -1.0, 1.0, Kind::Float, Device::Cpu)?;
//! let y = b.uniform(&[2, 3], -1.0, 1.0, Kind::Float, Device::Cpu)?;
//! assert_eq!(x.size(), vec![2, 3]);
//! assert!(x.equal(&y), "same seed, same samples");
//! let k = a.randint(&[100], 0, 3, Kind::Int64, Device::Cpu)?;
//! assert!(k.min().int64_value(&[]) >= 0 && k.max().int64_value(&[]) < 3);
//! # Ok(()) }
//! ```

use crate::kind::is_float;
use tch::{kind::Element, Device, Kind, Tensor};

use crate::error::{Error, Result, ShapeFmt};
use crate::host::{Elements, HostOut};

/// A seedable, deterministic pseudo-random generator (xoshiro256**, seeded with SplitMix64).
///
/// `Clone` copies the state: the clone then produces the same sequence as the original.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Generator {
    s: [u64; 4],
}

fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Number of elements of `shape`, or an error for a negative dim or a count that overflows.
pub(crate) fn numel(op: &'static str, shape: &[i64]) -> Result<usize> {
    if shape.iter().any(|d| *d < 0) {
        return Err(Error::argument(
            op,
            "shape",
            "dims >= 0",
            format!("shape {} with a negative dimension", ShapeFmt(shape)),
        ));
    }
    shape
        .iter()
        .try_fold(1usize, |acc, d| acc.checked_mul(usize::try_from(*d).ok()?))
        .ok_or_else(|| {
            Error::argument(
                op,
                "shape",
                "a shape whose element count fits in usize",
                format!(
                    "shape {}, which has too many elements to sample",
                    ShapeFmt(shape)
                ),
            )
        })
}

/// Errors unless `kind` is a floating kind (the samplers of real values need one; `randint`
/// draws integers).
fn float_kind(op: &'static str, kind: Kind) -> Result<()> {
    if is_float(kind) {
        return Ok(());
    }
    Err(Error::argument(
        op,
        "kind",
        "a floating kind (use randint for integers)",
        format!("{kind:?}"),
    ))
}

/// Errors with [`Error::DtypeMismatch`] unless a class mask is bool.
pub(crate) fn bool_mask(op: &'static str, mask: &Tensor) -> Result<()> {
    if mask.kind() == Kind::Bool {
        return Ok(());
    }
    Err(Error::DtypeMismatch {
        op,
        key: "<mask>".into(),
        expected: Kind::Bool,
        actual: mask.kind(),
    })
}

/// An empty `Vec` with room for `n` values, or an error when that much memory cannot be had
/// (`Vec::with_capacity` would abort the process instead).
pub(crate) fn alloc<T>(op: &'static str, n: usize) -> Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|e| {
        Error::invalid(
            op,
            format!("cannot allocate room for {n} sampled values: {e}"),
        )
    })?;
    Ok(v)
}

/// Builds a tensor from row-major data, then casts and moves it.
pub(crate) fn build<T: Element>(
    data: &[T],
    shape: &[i64],
    kind: Kind,
    device: Device,
) -> Result<Tensor> {
    let t = Tensor::f_from_slice(data)?;
    // Skip the ops that would be no-ops (each costs a dispatcher round trip).
    let t = if t.size() == shape {
        t
    } else {
        t.f_reshape(shape)?
    };
    let t = if t.kind() == kind {
        t
    } else {
        t.f_to_kind(kind)?
    };
    Ok(if device == Device::Cpu {
        t
    } else {
        t.f_to_device(device)?
    })
}

/// [`build`] for float64 host values: a float32 or float64 result is made in one libtorch call
/// (shape and dtype included) from host-converted bytes, instead of a float64 tensor, a
/// `reshape` and a `to_kind` (each a dispatcher round trip and, for the cast, an extra
/// buffer). The cast to float32 rounds to nearest-even, as libtorch's does, so the values are
/// the same bit for bit.
pub(crate) fn build_f64(data: &[f64], shape: &[i64], kind: Kind, device: Device) -> Result<Tensor> {
    let bytes: Vec<u8> = match kind {
        Kind::Float => data
            .iter()
            .flat_map(|v| (*v as f32).to_ne_bytes())
            .collect(),
        Kind::Double => data.iter().flat_map(|v| v.to_ne_bytes()).collect(),
        _ => return build(data, shape, kind, device),
    };
    let t = Tensor::f_from_data_size(&bytes, shape, kind)?;
    Ok(if device == Device::Cpu {
        t
    } else {
        t.f_to_device(device)?
    })
}

/// Reads a tensor's values (any device) into a row-major `Vec`.
///
/// The buffer is reserved fallibly: an expanded tensor may have far more elements than memory
/// (tch's `Vec::try_from` would abort the process on the failed allocation).
pub(crate) fn read<T: Element + Copy + Default>(t: &Tensor) -> Result<Vec<T>> {
    let flat = t
        .f_to_device(Device::Cpu)?
        .f_to_kind(T::KIND)?
        .f_reshape([-1])?
        .f_contiguous()?;
    let n = flat.elements();
    let mut v: Vec<T> = alloc("read", n)?;
    v.resize(n, T::default());
    flat.f_copy_data(&mut v, n)?;
    Ok(v)
}

impl Generator {
    /// A generator seeded with `seed`. Every seed (including 0) gives a valid, distinct stream.
    pub fn new(seed: u64) -> Self {
        let mut sm = seed;
        let s = [
            splitmix64(&mut sm),
            splitmix64(&mut sm),
            splitmix64(&mut sm),
            splitmix64(&mut sm),
        ];
        Generator { s }
    }

    /// The generator's whole state (four words), to checkpoint a stream and resume it
    /// exactly with [`Generator::from_state`].
    ///
    /// ```
    /// use torchrl::Generator;
    /// let mut a = Generator::new(7);
    /// a.next_u64();
    /// let mut b = Generator::from_state(a.state());
    /// assert_eq!(a.next_u64(), b.next_u64());
    /// ```
    pub fn state(&self) -> [u64; 4] {
        self.s
    }

    /// A generator that continues from `state` (one saved by [`Generator::state`]). An
    /// all-zero state, which xoshiro cannot leave, is replaced by the state of seed 0.
    pub fn from_state(state: [u64; 4]) -> Self {
        if state == [0; 4] {
            return Generator::new(0);
        }
        Generator { s: state }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let result = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        result
    }

    /// A uniform `f64` in `[0, 1)` with 53 random bits.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// A uniform integer in `[0, n)`, without modulo bias (Lemire's method). Returns 0 for `n == 0`.
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        let mut m = u128::from(self.next_u64()) * u128::from(n);
        if (m as u64) < n {
            let threshold = n.wrapping_neg() % n;
            while (m as u64) < threshold {
                m = u128::from(self.next_u64()) * u128::from(n);
            }
        }
        (m >> 64) as u64
    }

    /// A uniform integer in the inclusive range `[low, high]` (requires `low <= high`).
    pub(crate) fn int_inclusive(&mut self, low: i64, high: i64) -> i64 {
        // The span fits in u64; a span of 2^64 (the full i64 range) takes raw bits.
        let span = (i128::from(high) - i128::from(low) + 1) as u128;
        let offset = if span > u128::from(u64::MAX) {
            self.next_u64()
        } else {
            self.below(span as u64)
        };
        (i128::from(low) + i128::from(offset)) as i64
    }

    /// A standard normal draw (Box-Muller; both values of a pair are used by [`Generator::normal`]).
    fn normal_pair(&mut self) -> (f64, f64) {
        // u1 in (0, 1] so that ln(u1) is finite.
        let u1 = 1.0 - self.next_f64();
        let u2 = self.next_f64();
        let r = (-2.0 * u1.ln()).sqrt();
        let theta = 2.0 * std::f64::consts::PI * u2;
        (r * theta.cos(), r * theta.sin())
    }

    /// Uniform samples in `[low, high)` (exactly `low` when `low == high`) of a floating `kind`.
    ///
    /// After rounding to a narrower float kind a value may equal `high`. Errors for non-float
    /// kinds (use [`Generator::randint`]), for non-finite bounds, or when `low > high`.
    pub fn uniform(
        &mut self,
        shape: &[i64],
        low: f64,
        high: f64,
        kind: Kind,
        device: Device,
    ) -> Result<Tensor> {
        let op = "Generator::uniform";
        let n = numel(op, shape)?;
        float_kind(op, kind)?;
        if !(low.is_finite() && high.is_finite() && low <= high) {
            return Err(Error::argument(
                op,
                "low, high",
                "finite bounds with low <= high",
                format!("low={low}, high={high}"),
            ));
        }
        let mut draw = || (low + self.next_f64() * (high - low)).min(high);
        // On the CPU, float32 and float64 samples are written straight into the tensor (the
        // same values as `build_f64`: the float32 cast rounds to nearest-even).
        match (device, kind) {
            (Device::Cpu, Kind::Float) => {
                let mut out = HostOut::<f32>::new(shape)?;
                for o in out.slots() {
                    o.write(draw() as f32);
                }
                return Ok(out.into_tensor());
            }
            (Device::Cpu, Kind::Double) => {
                let mut out = HostOut::<f64>::new(shape)?;
                for o in out.slots() {
                    o.write(draw());
                }
                return Ok(out.into_tensor());
            }
            _ => {}
        }
        let mut data: Vec<f64> = alloc(op, n)?;
        data.extend((0..n).map(|_| draw()));
        build_f64(&data, shape, kind, device)
    }

    /// Normal samples with the given `mean` and `std` (Box-Muller) of a floating `kind`.
    pub fn normal(
        &mut self,
        shape: &[i64],
        mean: f64,
        std: f64,
        kind: Kind,
        device: Device,
    ) -> Result<Tensor> {
        let op = "Generator::normal";
        let n = numel(op, shape)?;
        float_kind(op, kind)?;
        if !(mean.is_finite() && std.is_finite() && std >= 0.0) {
            return Err(Error::argument(
                op,
                "mean, std",
                "a finite mean and a finite std >= 0",
                format!("mean={mean}, std={std}"),
            ));
        }
        let mut data = alloc(op, n.saturating_add(1))?;
        while data.len() < n {
            let (a, b) = self.normal_pair();
            data.push(mean + std * a);
            data.push(mean + std * b);
        }
        data.truncate(n);
        build_f64(&data, shape, kind, device)
    }

    /// Uniform integers in `[low, high_exclusive)`, cast to `kind` (which may be a float or bool
    /// kind; values that the kind cannot represent wrap as a libtorch cast does).
    pub fn randint(
        &mut self,
        shape: &[i64],
        low: i64,
        high_exclusive: i64,
        kind: Kind,
        device: Device,
    ) -> Result<Tensor> {
        let op = "Generator::randint";
        let n = numel(op, shape)?;
        if low >= high_exclusive {
            return Err(Error::argument(
                op,
                "low, high",
                "a non-empty range, low < high",
                format!("low={low}, high={high_exclusive}"),
            ));
        }
        let mut data: Vec<i64> = alloc(op, n)?;
        data.extend((0..n).map(|_| self.int_inclusive(low, high_exclusive - 1)));
        build(&data, shape, kind, device)
    }

    /// Uniform samples with elementwise bounds: `low` and `high` must have the same shape (the
    /// result's shape), and the result has `low`'s kind and device.
    ///
    /// Floating kinds draw in `[low, high)` (see [`Generator::uniform`]); integer and bool kinds
    /// draw integers in the inclusive range `[low, high]`. Errors when `low > high` anywhere or
    /// a floating bound is not finite.
    pub fn uniform_tensor(&mut self, low: &Tensor, high: &Tensor) -> Result<Tensor> {
        let op = "Generator::uniform_tensor";
        let shape = low.size();
        if high.size() != shape {
            return Err(Error::ShapeMismatch {
                op,
                key: "<high>".into(),
                expected: shape,
                actual: high.size(),
            });
        }
        let (kind, device) = (low.kind(), low.device());
        if is_float(kind) {
            let lo = read::<f64>(low)?;
            let hi = read::<f64>(high)?;
            let mut data = Vec::with_capacity(lo.len());
            for (i, (l, h)) in lo.iter().zip(&hi).enumerate() {
                if !(l.is_finite() && h.is_finite() && l <= h) {
                    return Err(Error::argument(
                        op,
                        "low, high",
                        "finite bounds with low <= high",
                        format!("low={l}, high={h} at flat index {i}"),
                    ));
                }
                data.push((l + self.next_f64() * (h - l)).min(*h));
            }
            build(&data, &shape, kind, device)
        } else {
            let lo = read::<i64>(low)?;
            let hi = read::<i64>(high)?;
            let mut data = Vec::with_capacity(lo.len());
            for (i, (l, h)) in lo.iter().zip(&hi).enumerate() {
                if l > h {
                    return Err(Error::argument(
                        op,
                        "low, high",
                        "low <= high",
                        format!("low={l}, high={h} at flat index {i}"),
                    ));
                }
                data.push(self.int_inclusive(*l, *h));
            }
            build(&data, &shape, kind, device)
        }
    }

    /// Class indices (int64, shape `shape`) drawn uniformly among `n` classes, or among the
    /// allowed classes of `mask`.
    ///
    /// `mask` is a bool tensor whose shape broadcasts to `[*shape, n]`; `false` excludes a class.
    /// Masked-out classes are never drawn. A row with no allowed class is an error.
    pub fn sample_categorical(
        &mut self,
        shape: &[i64],
        n: i64,
        mask: Option<&Tensor>,
        device: Device,
    ) -> Result<Tensor> {
        let op = "Generator::sample_categorical";
        let rows = numel(op, shape)?;
        if n < 1 {
            return Err(Error::argument(op, "n", "n >= 1", n.to_string()));
        }
        let data: Vec<i64> = match mask {
            None => {
                let mut data = alloc(op, rows)?;
                data.extend((0..rows).map(|_| self.below(n as u64) as i64));
                data
            }
            Some(mask) => {
                bool_mask(op, mask)?;
                let mut full = shape.to_vec();
                full.push(n);
                let expanded = mask.f_broadcast_to(full.as_slice()).map_err(|_| {
                    Error::argument(
                        op,
                        "mask",
                        format!("a mask that broadcasts to {}", ShapeFmt(&full)),
                        format!("a mask of shape {}", ShapeFmt(&mask.size())),
                    )
                })?;
                let allowed = read::<bool>(&expanded)?;
                let mut out = alloc(op, rows)?;
                for (r, row) in allowed.chunks(n as usize).enumerate() {
                    let count = row.iter().filter(|b| **b).count() as u64;
                    if count == 0 {
                        return Err(Error::InvalidValue {
                            op,
                            what: "mask row",
                            key: r.to_string(),
                            expected: "a row that allows at least one class".to_string(),
                            got: format!(
                                "row {r} of the mask allows no class: every class is masked out"
                            ),
                        });
                    }
                    let k = self.below(count) as usize;
                    let idx = row
                        .iter()
                        .enumerate()
                        .filter(|(_, b)| **b)
                        .nth(k)
                        .map(|(i, _)| i as i64)
                        .unwrap_or(0);
                    out.push(idx);
                }
                out
            }
        };
        build(&data, shape, Kind::Int64, device)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// CPU float32/float64 samples (written in place) are the stream's `low + u (high - low)`,
    /// rounded to float32 at the end, in row-major order: the values the generic path gives.
    #[test]
    fn uniform_values_follow_the_stream() {
        for kind in [Kind::Float, Kind::Double, Kind::Half] {
            let mut g = Generator::new(17);
            let mut manual = g.clone();
            let t = g.uniform(&[4, 3], -2.0, 5.0, kind, Device::Cpu).unwrap();
            assert_eq!((t.size(), t.kind()), (vec![4, 3], kind));
            let want: Vec<f64> = (0..12)
                .map(|_| (-2.0 + manual.next_f64() * 7.0).min(5.0))
                .collect();
            let want = Tensor::from_slice(&want).view([4, 3]).to_kind(kind);
            assert!(t.equal(&want), "{kind:?}");
            assert_eq!(g.next_u64(), manual.next_u64(), "same draws consumed");
        }
    }

    #[test]
    fn xoshiro_reference_values() {
        // The first output for state [1, 2, 3, 4] is 11520 (reference implementation).
        let mut g = Generator { s: [1, 2, 3, 4] };
        assert_eq!(g.next_u64(), 11520);
        assert_eq!(g.next_u64(), 0);
        assert_eq!(g.next_u64(), 1509978240);
    }

    #[test]
    fn splitmix_reference_value() {
        // SplitMix64 from state 0: first output 0xE220A8397B1DCDAF.
        let mut s = 0u64;
        assert_eq!(splitmix64(&mut s), 0xE220_A839_7B1D_CDAF);
    }

    #[test]
    fn below_is_in_range_and_covers() {
        let mut g = Generator::new(1);
        let mut seen = [false; 5];
        for _ in 0..1000 {
            let v = g.below(5);
            assert!(v < 5);
            seen[v as usize] = true;
        }
        assert!(seen.iter().all(|s| *s));
        assert_eq!(g.below(0), 0);
    }

    #[test]
    fn int_inclusive_full_range() {
        let mut g = Generator::new(3);
        for _ in 0..100 {
            let v = g.int_inclusive(-2, 2);
            assert!((-2..=2).contains(&v));
        }
        // Full i64 span must not overflow.
        let _ = g.int_inclusive(i64::MIN, i64::MAX);
        assert_eq!(g.int_inclusive(5, 5), 5);
    }

    #[test]
    fn normal_moments() {
        let mut g = Generator::new(11);
        let t = g
            .normal(&[20000], 1.0, 2.0, Kind::Double, Device::Cpu)
            .unwrap();
        let v = read::<f64>(&t).unwrap();
        let mean = v.iter().sum::<f64>() / v.len() as f64;
        let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / v.len() as f64;
        assert!((mean - 1.0).abs() < 0.05, "mean {mean}");
        assert!((var.sqrt() - 2.0).abs() < 0.05, "std {}", var.sqrt());
    }

    #[test]
    fn masked_categorical_never_draws_masked() {
        let mut g = Generator::new(5);
        let mask = Tensor::from_slice(&[true, false, true]);
        let t = g
            .sample_categorical(&[500], 3, Some(&mask), Device::Cpu)
            .unwrap();
        let v = read::<i64>(&t).unwrap();
        assert!(v.iter().all(|x| *x == 0 || *x == 2));
        assert!(v.contains(&0) && v.contains(&2));
        let none = Tensor::from_slice(&[false, false, false]);
        assert!(g
            .sample_categorical(&[2], 3, Some(&none), Device::Cpu)
            .is_err());
    }

    #[test]
    fn uniform_tensor_int_inclusive_and_errors() {
        let mut g = Generator::new(9);
        let lo = Tensor::from_slice(&[0i64, 5])
            .f_expand([200, 2], false)
            .unwrap();
        let hi = Tensor::from_slice(&[1i64, 5])
            .f_expand([200, 2], false)
            .unwrap();
        let t = g.uniform_tensor(&lo, &hi).unwrap();
        assert_eq!(t.kind(), Kind::Int64);
        let v = read::<i64>(&t).unwrap();
        assert!(v.chunks(2).all(|r| (r[0] == 0 || r[0] == 1) && r[1] == 5));
        assert!(v.chunks(2).any(|r| r[0] == 1));
        let bad = Tensor::from_slice(&[2i64, 0]);
        let ok = Tensor::from_slice(&[1i64, 1]);
        assert!(g.uniform_tensor(&bad, &ok).is_err());
        assert!(g.uniform_tensor(&ok, &Tensor::from_slice(&[1i64])).is_err());
    }

    /// The one-call float32 path gives libtorch's float64 → float32 cast bit for bit, in the
    /// requested shape.
    #[test]
    fn float32_samples_equal_libtorch_cast() {
        for shape in [&[1024i64, 1][..], &[3, 5], &[]] {
            let (mut a, mut b) = (Generator::new(11), Generator::new(11));
            let f = a
                .uniform(shape, -2.0, 2.0, Kind::Float, Device::Cpu)
                .unwrap();
            let d = b
                .uniform(shape, -2.0, 2.0, Kind::Double, Device::Cpu)
                .unwrap();
            assert_eq!(f.size(), shape.to_vec());
            assert_eq!(f.kind(), Kind::Float);
            assert!(f.equal(&d.to_kind(Kind::Float)));
            let f = a.normal(shape, 0.5, 3.0, Kind::Float, Device::Cpu).unwrap();
            let d = b
                .normal(shape, 0.5, 3.0, Kind::Double, Device::Cpu)
                .unwrap();
            assert!(f.equal(&d.to_kind(Kind::Float)));
        }
    }
}
