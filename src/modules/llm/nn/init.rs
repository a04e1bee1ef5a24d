//! Where the layer kit's random initial weights come from: libtorch's global generator (what
//! `tch::manual_seed` seeds, as `transformers`' `set_seed` does), or, inside
//! [`with_init_seed`], a seeded [`Generator`] of the calling thread alone.
//!
//! The scoped form lets code that builds several models at once (tests on parallel threads, a
//! server building one per request) seed each build without a lock around the process-wide
//! generator. The two sources draw different values for the same seed; each is reproducible.
//!
//! ```
//! use tch::nn::VarStore;
//! use tch::Device;
//! use torchrl::modules::llm::nn::with_init_seed;
//! use torchrl::modules::llm::{CausalLm, Gpt2Config, Gpt2Model};
//! # fn main() -> torchrl::Result<()> {
//! let cfg = Gpt2Config::new(32).with_n_positions(8).with_n_embd(8).with_n_layer(1).with_n_head(2);
//! let build = |seed| {
//!     let vs = VarStore::new(Device::Cpu);
//!     let model = with_init_seed(seed, || Gpt2Model::new(&vs.root(), &cfg))?;
//!     let w = model.named_parameters().into_iter().next().map(|(_, t)| t.copy());
//!     Ok::<_, torchrl::Error>(w.expect("a parameter"))
//! };
//! // the same seed gives the same weights, whatever other threads draw meanwhile
//! let other = std::thread::spawn(|| tch::Tensor::randn([1000], (tch::Kind::Float, Device::Cpu)));
//! assert!(build(7)?.equal(&build(7)?));
//! assert!(!build(7)?.equal(&build(8)?));
//! let _ = other.join();
//! # Ok(()) }
//! ```

use std::cell::RefCell;

use tch::nn::{Init, Path};
use tch::Tensor;

use crate::error::Result;
use crate::rng::Generator;

thread_local! {
    /// The seeded generator of an enclosing [`with_init_seed`], if any.
    static INIT_RNG: RefCell<Option<Generator>> = const { RefCell::new(None) };
}

/// Restores the previous scope's generator when a [`with_init_seed`] scope ends (also on
/// unwind).
struct Restore(Option<Generator>);

impl Drop for Restore {
    fn drop(&mut self) {
        let previous = self.0.take();
        INIT_RNG.with(|g| *g.borrow_mut() = previous);
    }
}

/// Runs `build` with every random initial weight the layer kit draws on this thread (the
/// models' embeddings and linear layers, value / score / ILQL heads, LoRA `A` matrices) taken
/// from a [`Generator`] seeded with `seed`, instead of libtorch's global generator. Scopes
/// nest (the inner one's generator is used, the outer one's continues after it) and end on
/// return or unwind. Only the initial weights: dropout during training still draws from
/// libtorch.
pub fn with_init_seed<R>(seed: u64, build: impl FnOnce() -> R) -> R {
    let previous = INIT_RNG.with(|g| g.borrow_mut().replace(Generator::new(seed)));
    let _restore = Restore(previous);
    build()
}

/// Whether a [`with_init_seed`] scope is active on this thread.
pub fn init_is_seeded() -> bool {
    INIT_RNG.with(|g| g.borrow().is_some())
}

/// Normal values of `shape` with `mean` and `stdev` in `kind` on `device`: from the scope's
/// generator, else libtorch's (`Init::Randn`'s draws: `randn · stdev + mean`).
fn normal(shape: &[i64], mean: f64, stdev: f64, like: &Tensor) -> Result<Tensor> {
    let seeded = INIT_RNG.with(|g| {
        g.borrow_mut()
            .as_mut()
            .map(|gen| gen.normal(shape, mean, stdev, like.kind(), like.device()))
    });
    if let Some(t) = seeded {
        return t;
    }
    let mut r = Tensor::f_randn(shape, (like.kind(), like.device()))?;
    if mean != 0.0 || (stdev - 1.0).abs() > f64::EPSILON {
        r = r.f_mul(&Tensor::from(stdev))?.f_add(&Tensor::from(mean))?;
    }
    Ok(r)
}

/// A new variable `name` of `shape` under `path`, normal with `mean` and `stdev` (see
/// [`normal`]), every step fallible. tch's init scales with a panicking operator, so a weight
/// too large for memory panicked instead of returning the allocation error (found by the fuzz
/// campaign).
pub(crate) fn randn_var(
    path: &Path<'_>,
    name: &str,
    shape: &[i64],
    mean: f64,
    stdev: f64,
) -> Result<Tensor> {
    let mut v = path.f_zeros(name, shape)?;
    let _guard = tch::no_grad_guard();
    let r = normal(shape, mean, stdev, &v)?;
    v.f_copy_(&r)?;
    Ok(v)
}

/// A new variable `name` of `shape` under `path`, uniform in `[lo, up)`: from the scope's
/// generator, else tch's `Init::Uniform` (libtorch's generator).
pub(crate) fn uniform_var(
    path: &Path<'_>,
    name: &str,
    shape: &[i64],
    lo: f64,
    up: f64,
) -> Result<Tensor> {
    let seeded = INIT_RNG.with(|g| {
        g.borrow_mut()
            .as_mut()
            .map(|gen| gen.uniform(shape, lo, up, path.kind(), path.device()))
    });
    match seeded {
        None => Ok(path.f_var(name, shape, Init::Uniform { lo, up })?),
        Some(values) => {
            let values = values?;
            let mut v = path.f_zeros(name, shape)?;
            let _guard = tch::no_grad_guard();
            v.f_copy_(&values)?;
            Ok(v)
        }
    }
}
