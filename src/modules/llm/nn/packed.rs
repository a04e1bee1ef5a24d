//! Decoding with MKL's packed weights.
//!
//! A decode step multiplies a few rows (the batch) by every weight of the model. libtorch's
//! plain float32 product on the CPU re-packs the weight into MKL's blocked layout on every
//! call, which at batch 8 costs more than the product itself (38 % of a Qwen2.5-0.5B-shaped
//! decode's cycles by `perf`, docs/performance.md). The weights do not change during a
//! generation, so [`PackedScope::for_decode`] packs every linear weight of the model and its LM
//! head once (`mkl::_mkl_reorder_linear_weight`, the op PyTorch's CPU inference freezing uses),
//! and while the scope lives, [`Linear`](super::Linear) and
//! [`CausalLm::lm_head`](crate::modules::llm::CausalLm::lm_head) multiply through the packed
//! copy (`mkl::_mkl_linear`) when the input has exactly the packed number of rows (any other
//! count takes the plain product, inside the op). The results equal the plain products up to
//! the order of the float32 sums (about 1e-6 relative).
//!
//! Packing applies only where it is sound and pays: a CPU float32 model, a libtorch with MKL
//! (the op is looked up by name: a build without it decodes as before), no gradient (generation
//! runs under `no_grad`), a decode of at least [`MIN_STEPS`] steps (the packing costs about
//! one plain step), and weights of at least [`MIN_PACKED_ELEMENTS`] elements (a small model
//! decodes as before). It holds a packed copy of the weights for the generation's duration (as
//! many bytes again as the float32 weights); `TORCHRL_NO_PACKED_DECODE=1` turns it off.
//!
//! The packed weights live in a thread-local table that the scope fills and empties, keyed by
//! each weight's storage address, so nothing in the model changes and nothing outlives the
//! generation.
//!
//! **Frozen weights across generations.** A hydra policy's frozen trunk (and its tied
//! embedding head) is the same at every rollout, so re-packing it each time is wasted work
//! (0.48 s a rollout at the Qwen2.5-0.5B shape, docs/performance.md). A [`PackedWeightCache`]
//! handed to the scope keeps the packed copies of the weights that do not require grad, with a
//! strong reference to each weight (its address cannot be reused while held) and its version
//! counter (any in-place write, such as loading a checkpoint, makes the copy stale and it is
//! packed again). The next decode with the same row count reuses them; the trainable weights
//! are packed per decode as without a cache. The cache holds the copies (as many bytes as the
//! frozen float32 weights) until it is dropped or [cleared](PackedWeightCache::clear), and
//! drops the entries a decode did not use (another model's).

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

use tch::{Device, Kind, Tensor};

use super::Decoder;
use crate::error::Result;

/// The fewest decode steps for which packing is done.
pub const MIN_STEPS: i64 = 4;

/// The smallest weight (elements) that is packed: below it the plain product's own packing is
/// cheap and the call's overhead dominates (at 128 × 512 packing made a small model's decode
/// 11 % slower; from about 768 × 768 on it pays, docs/performance.md).
pub const MIN_PACKED_ELEMENTS: i64 = 1 << 19;

thread_local! {
    /// The packed weights of the generation running on this thread, by weight address.
    static PACKED: RefCell<Option<Table>> = const { RefCell::new(None) };
    /// Set by [`without_packing`] (tests: the plain products to compare with).
    static OFF: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` with packing off on this thread (the plain products; for comparisons).
pub fn without_packing<R>(f: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            OFF.with(|o| o.set(self.0));
        }
    }
    let _restore = Restore(OFF.with(|o| o.replace(true)));
    f()
}

struct Table {
    rows: i64,
    /// By the weight's address: its `[out, in]` size and its packed copy.
    weights: HashMap<usize, (Vec<i64>, Tensor)>,
}

/// While alive, the decode on this thread multiplies through packed weights (see the
/// [module docs](self)); dropping it frees them.
#[derive(Debug)]
pub struct PackedScope {
    _private: (),
}

impl Drop for PackedScope {
    fn drop(&mut self) {
        PACKED.with(|p| p.borrow_mut().take());
    }
}

impl PackedScope {
    /// Packs the linear weights of `decoder` and the LM head weight `lm_head` (a model's
    /// [`CausalLm::decoder`](crate::modules::llm::CausalLm::decoder) and
    /// [`CausalLm::lm_head_weight`](crate::modules::llm::CausalLm::lm_head_weight)) for products
    /// with `rows` rows, when packing applies ([module docs](self)); `None` when it does not
    /// (the plain products run).
    ///
    /// With `cache`, the frozen weights' packed copies come from it and stay in it
    /// ([`PackedWeightCache`]).
    ///
    /// # Errors
    /// When libtorch fails to pack a weight (the message names the op).
    pub fn for_decode(
        decoder: &Decoder,
        lm_head: &Tensor,
        rows: i64,
        steps: i64,
        cache: Option<&PackedWeightCache>,
    ) -> Result<Option<Self>> {
        if !applies(lm_head, rows, steps) {
            return Ok(None);
        }
        let mut cached = cache.map(PackedWeightCache::lock);
        let mut weights = HashMap::new();
        let mut add = |w: &Tensor| -> Result<()> {
            if w.numel() < MIN_PACKED_ELEMENTS as usize {
                return Ok(());
            }
            let key = w.data_ptr() as usize;
            if let std::collections::hash_map::Entry::Vacant(e) = weights.entry(key) {
                let packed = match cached.as_mut() {
                    Some(c) => c.get_or_pack(key, w, rows)?,
                    None => ffi::pack(w, rows)?,
                };
                e.insert((w.size(), packed));
            }
            Ok(())
        };
        for block in decoder.blocks() {
            for lin in block.linears() {
                add(&lin.out_in_weight())?;
            }
        }
        add(lm_head)?;
        if let Some(c) = cached.as_mut() {
            c.keep_only(&weights.keys().copied().collect());
        }
        if weights.is_empty() {
            return Ok(None);
        }
        PACKED.with(|p| *p.borrow_mut() = Some(Table { rows, weights }));
        Ok(Some(PackedScope { _private: () }))
    }
}

/// Packed copies of a model's frozen weights kept across decodes (see the
/// [module docs](self)): a cheap handle (clones share the copies) that a trainer keeps for the
/// model's life and hands to every generation
/// ([`GenerateOptions::packed_weights`](crate::modules::llm::GenerateOptions::packed_weights)).
///
/// ```
/// use tch::{nn::VarStore, Device, Tensor};
/// use torchrl::modules::llm::nn::packed::PackedWeightCache;
/// use torchrl::modules::llm::{generate_with, GenerateOptions, GenerationConfig, Gpt2Config, Gpt2Model};
/// use torchrl::Generator;
/// # fn main() -> torchrl::Result<()> {
/// let mut vs = VarStore::new(Device::Cpu);
/// let cfg = Gpt2Config::new(1100).with_n_layer(1).with_n_embd(512).with_n_head(8).with_n_positions(32);
/// let model = Gpt2Model::new(&vs.root(), &cfg)?;
/// vs.freeze(); // frozen weights: what the cache keeps
/// let cache = PackedWeightCache::new();
/// let opts = GenerateOptions::default().with_packed_weights(&cache);
/// let prompt = Tensor::from_slice(&[1i64, 2, 3, 4]).view([4, 1]);
/// let gen_cfg = GenerationConfig::rlhf_sampling(6).with_pad_token_id(0);
/// let a = generate_with(&model, &prompt, None, &gen_cfg, &opts, &mut Generator::new(0))?;
/// let packs = cache.packs();
/// let b = generate_with(&model, &prompt, None, &gen_cfg, &opts, &mut Generator::new(0))?;
/// assert_eq!(cache.packs(), packs); // the second decode packed nothing again
/// assert!(a.sequences.equal(&b.sequences));
/// # Ok(()) }
/// ```
#[derive(Clone, Default)]
pub struct PackedWeightCache {
    inner: Arc<Mutex<CacheTable>>,
}

#[derive(Default)]
struct CacheTable {
    /// By the weight's address.
    entries: HashMap<usize, CachedPack>,
    /// How many weights were packed into the cache (reuses are not counted).
    packs: usize,
}

struct CachedPack {
    /// Held, never read: a strong reference keeps the address this weight's while the entry
    /// lives.
    _weight: Tensor,
    size: Vec<i64>,
    version: i64,
    rows: i64,
    packed: Tensor,
}

impl fmt::Debug for PackedWeightCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PackedWeightCache")
            .field("weights", &self.len())
            .field("packs", &self.packs())
            .finish()
    }
}

impl PackedWeightCache {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, CacheTable> {
        // a panic elsewhere while holding it leaves a table that is still consistent
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The number of weights whose packed copies it holds.
    pub fn len(&self) -> usize {
        self.lock().entries.len()
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How many times a weight was packed into it (a reused copy is not counted).
    pub fn packs(&self) -> usize {
        self.lock().packs
    }

    /// Frees every packed copy (the weights' references too).
    pub fn clear(&self) {
        self.lock().entries.clear();
    }
}

impl CacheTable {
    /// The packed copy of `w` (at address `key`) for `rows` rows: the cached one when `w` is
    /// frozen and unchanged since, else packed now (and cached when frozen).
    fn get_or_pack(&mut self, key: usize, w: &Tensor, rows: i64) -> Result<Tensor> {
        let version = if w.requires_grad() {
            -1
        } else {
            ffi::version(w)
        };
        if version < 0 {
            // trainable (or without a version counter): changes between decodes
            self.entries.remove(&key);
            return ffi::pack(w, rows);
        }
        if let Some(e) = self.entries.get(&key) {
            if e.version == version && e.rows == rows && e.size == w.size() {
                return Ok(e.packed.shallow_clone());
            }
        }
        let packed = ffi::pack(w, rows)?;
        self.packs += 1;
        self.entries.insert(
            key,
            CachedPack {
                _weight: w.shallow_clone(),
                size: w.size(),
                version,
                rows,
                packed: packed.shallow_clone(),
            },
        );
        Ok(packed)
    }

    /// Drops the entries whose address is not in `used`.
    fn keep_only(&mut self, used: &HashSet<usize>) {
        self.entries.retain(|k, _| used.contains(k));
    }
}

/// Whether a decode of `rows` rows and `steps` steps packs, for a model whose LM head weight is
/// `lm_head` (its device and dtype are the model's).
fn applies(lm_head: &Tensor, rows: i64, steps: i64) -> bool {
    rows > 0
        && steps >= MIN_STEPS
        && !OFF.with(|o| o.get())
        && lm_head.device() == Device::Cpu
        && lm_head.kind() == Kind::Float
        && std::env::var_os("TORCHRL_NO_PACKED_DECODE").is_none()
        && ffi::available()
}

/// `x · weightᵀ (+ bias)` through the packed copy of `weight` (`[out, in]`), when a scope packed
/// it; `None`: not packed here, the caller runs the plain product.
pub(crate) fn linear(x: &Tensor, weight: &Tensor, bias: Option<&Tensor>) -> Result<Option<Tensor>> {
    PACKED.with(|p| {
        let table = p.borrow();
        let Some(table) = table.as_ref() else {
            return Ok(None);
        };
        match table.weights.get(&(weight.data_ptr() as usize)) {
            // the same storage and the same shape: the weight that was packed
            Some((size, packed)) if x.kind() == Kind::Float && *size == weight.size() => {
                ffi::linear(x, packed, weight, bias, table.rows).map(Some)
            }
            _ => Ok(None),
        }
    })
}

/// Whether a packing scope is active on this thread (for tests).
pub fn active() -> bool {
    PACKED.with(|p| p.borrow().is_some())
}

#[cfg(torchrl_shims)]
mod ffi {
    use std::ffi::{c_char, c_int, c_void, CStr};

    use tch::Tensor;

    use crate::error::{Error, Result};

    extern "C" {
        fn trl_mkl_packed_available() -> c_int;
        fn trl_tensor_version(t: *mut c_void) -> i64;
        fn trl_mkl_pack(
            weight: *mut c_void,
            batch: i64,
            out: *mut *mut c_void,
            err: *mut c_char,
            len: usize,
        ) -> c_int;
        fn trl_mkl_linear(
            x: *mut c_void,
            packed: *mut c_void,
            weight: *mut c_void,
            bias: *mut c_void,
            batch: i64,
            out: *mut *mut c_void,
            err: *mut c_char,
            len: usize,
        ) -> c_int;
    }

    const ERR_LEN: usize = 1024;

    pub(super) fn available() -> bool {
        static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        // SAFETY: no arguments; the shim catches every C++ exception.
        *AVAILABLE.get_or_init(|| unsafe { trl_mkl_packed_available() } == 1)
    }

    /// `t`'s version counter, or -1 when it has none.
    pub(super) fn version(t: &Tensor) -> i64 {
        // SAFETY: `t` is a live tensor handle for the call; the shim catches every exception.
        unsafe { trl_tensor_version(ptr(t)) }
    }

    fn ptr(t: &Tensor) -> *mut c_void {
        t.as_ptr() as *mut c_void
    }

    fn finish(op: &'static str, status: c_int, out: *mut c_void, err: &[u8]) -> Result<Tensor> {
        if status != 0 || out.is_null() {
            let msg = CStr::from_bytes_until_nul(err)
                .map(|c| c.to_string_lossy().into_owned())
                .unwrap_or_default();
            return Err(Error::invalid(op, format!("libtorch: {msg}")));
        }
        // SAFETY: on success the shim wrote a new heap `at::Tensor*` that nothing else owns;
        // tch's Tensor takes ownership and frees it on drop.
        Ok(unsafe { Tensor::from_ptr(out as *mut torch_sys::C_tensor) })
    }

    pub(super) fn pack(weight: &Tensor, rows: i64) -> Result<Tensor> {
        let mut out: *mut c_void = std::ptr::null_mut();
        let mut err = vec![0u8; ERR_LEN];
        // SAFETY: `weight` is a live tensor handle for the call; `out` and `err` are valid for
        // writes of a pointer and ERR_LEN bytes.
        let status = unsafe {
            trl_mkl_pack(
                ptr(weight),
                rows,
                &mut out,
                err.as_mut_ptr() as *mut c_char,
                ERR_LEN,
            )
        };
        finish("mkl::_mkl_reorder_linear_weight", status, out, &err)
    }

    pub(super) fn linear(
        x: &Tensor,
        packed: &Tensor,
        weight: &Tensor,
        bias: Option<&Tensor>,
        rows: i64,
    ) -> Result<Tensor> {
        let mut out: *mut c_void = std::ptr::null_mut();
        let mut err = vec![0u8; ERR_LEN];
        let bias = bias.map_or(std::ptr::null_mut(), ptr);
        // SAFETY: every tensor handle is live for the call (`bias` may be null, which the shim
        // reads as no bias); `out` and `err` are valid for writes.
        let status = unsafe {
            trl_mkl_linear(
                ptr(x),
                ptr(packed),
                ptr(weight),
                bias,
                rows,
                &mut out,
                err.as_mut_ptr() as *mut c_char,
                ERR_LEN,
            )
        };
        finish("mkl::_mkl_linear", status, out, &err)
    }
}

#[cfg(not(torchrl_shims))]
mod ffi {
    use tch::Tensor;

    use crate::error::{Error, Result};

    pub(super) fn available() -> bool {
        false
    }

    pub(super) fn version(_: &Tensor) -> i64 {
        -1
    }

    pub(super) fn pack(_: &Tensor, _: i64) -> Result<Tensor> {
        Err(Error::invalid(
            "packed decode",
            "built without the MKL shim",
        ))
    }

    pub(super) fn linear(
        _: &Tensor,
        _: &Tensor,
        _: &Tensor,
        _: Option<&Tensor>,
        _: i64,
    ) -> Result<Tensor> {
        Err(Error::invalid(
            "packed decode",
            "built without the MKL shim",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::modules::llm::generation::{generate_impl, GenerateOptions, GenerationConfig};
    use crate::modules::llm::nn::with_init_seed;
    use crate::modules::llm::{CausalLm, Gpt2Config, Gpt2Model, LmInput};
    use crate::rng::Generator;
    use tch::nn::VarStore;

    /// One block 512 wide over 1,100 tokens: `c_attn` (512 × 1,536), `c_fc` / `c_proj` of the
    /// MLP (512 × 2,048) and the tied head (1,100 × 512) are packed, the attention's output
    /// projection (512 × 512) is not.
    fn gpt2(vs: &VarStore) -> Gpt2Model {
        let cfg = Gpt2Config::new(1100)
            .with_n_layer(1)
            .with_n_embd(512)
            .with_n_head(8)
            .with_n_positions(32);
        with_init_seed(3, || Gpt2Model::new(&vs.root(), &cfg)).unwrap()
    }

    fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
        (a - b).abs().max().double_value(&[])
    }

    #[test]
    fn packed_products_are_the_plain_ones_and_the_scope_cleans_up() -> Result<()> {
        if !ffi::available() {
            eprintln!("this libtorch has no MKL packed linear: nothing to compare");
            return Ok(());
        }
        let vs = VarStore::new(Device::Cpu);
        let model = gpt2(&vs);
        let _guard = tch::no_grad_guard();
        let ids = Tensor::from_slice(&[3i64, 7, 9, 11, 2, 5, 8, 1]).view([8, 1]);
        let plain = model.forward(&LmInput::new(&ids), None)?.logits()?;
        assert!(!active());
        {
            let scope = PackedScope::for_decode(
                model.decoder(),
                model.lm_head_weight(),
                8,
                MIN_STEPS,
                None,
            )?;
            assert!(scope.is_some() && active());
            // GPT-2's Conv1D weights ([in, out]) and its tied head are both packed
            let block = &model.decoder().blocks()[0];
            let lin = &block.linears()[0];
            let x = Tensor::randn([8, 512], (Kind::Float, Device::Cpu));
            let via = linear(&x, &lin.out_in_weight(), lin.bias())?.expect("packed");
            let plain_lin = without_packing(|| lin.forward(&x))?;
            assert!(max_diff(&via, &plain_lin) <= 1e-4);
            // the output projection is under MIN_PACKED_ELEMENTS: not packed
            let proj = block.linears()[1];
            assert_eq!(proj.out_in_weight().numel(), 512 * 512);
            assert!(linear(&x, &proj.out_in_weight(), proj.bias())?.is_none());
            // a view of a packed weight's storage with another shape is not taken for it
            let rows = lin.out_in_weight().narrow(0, 0, 100);
            assert!(linear(&x, &rows, None)?.is_none());
            let packed = model.forward(&LmInput::new(&ids), None)?.logits()?;
            let d = max_diff(&packed, &plain);
            assert!(d <= 1e-4, "packed logits differ by {d}");
            // another row count takes the plain product inside the op: exactly the plain
            // product of those rows (not of the eight: a GEMM's blocking, and so its rounding,
            // may depend on the row count, as on AVX-512 machines without AMX)
            let five = ids.narrow(0, 0, 5);
            let a = model.forward(&LmInput::new(&five), None)?.logits()?;
            let plain_five =
                without_packing(|| model.forward(&LmInput::new(&five), None))?.logits()?;
            assert!(a.equal(&plain_five));
        }
        assert!(!active(), "the scope's drop empties the table");
        // too short a decode, another dtype, or switched off: no packing
        assert!(PackedScope::for_decode(
            model.decoder(),
            model.lm_head_weight(),
            8,
            MIN_STEPS - 1,
            None
        )?
        .is_none());
        assert!(without_packing(|| PackedScope::for_decode(
            model.decoder(),
            model.lm_head_weight(),
            8,
            8,
            None
        ))?
        .is_none());
        Ok(())
    }

    #[test]
    fn a_cache_keeps_the_frozen_weights_and_repacks_what_changed() -> Result<()> {
        if !ffi::available() {
            return Ok(());
        }
        let mut vs = VarStore::new(Device::Cpu);
        let model = gpt2(&vs);
        vs.freeze();
        // c_attn stays trainable: packed per decode, never cached
        let block = &model.decoder().blocks()[0];
        for (name, v) in vs.variables() {
            if name.ends_with("c_attn.weight") {
                let _ = v.set_requires_grad(true);
            }
        }
        let trainable = block.linears()[0].out_in_weight();
        assert!(trainable.requires_grad());
        let mlp_in = block.linears()[2].out_in_weight();
        assert_eq!(mlp_in.numel(), 512 * 2048);
        let x = Tensor::randn([8, 512], (Kind::Float, Device::Cpu));
        let plain = |w: &Tensor| without_packing(|| x.matmul(&w.tr()));
        let cache = PackedWeightCache::new();
        let _guard = tch::no_grad_guard();
        let decode = |rows: i64| {
            PackedScope::for_decode(
                model.decoder(),
                model.lm_head_weight(),
                rows,
                MIN_STEPS,
                Some(&cache),
            )
        };
        {
            let _scope = decode(8)?;
            // the MLP's two weights and the tied head: frozen, packed into the cache
            assert_eq!((cache.len(), cache.packs()), (3, 3));
            assert!(
                linear(&x, &trainable, None)?.is_some(),
                "c_attn still packed"
            );
        }
        {
            // a second decode reuses them, and multiplies through them
            let _scope = decode(8)?;
            assert_eq!((cache.len(), cache.packs()), (3, 3));
            let via = linear(&x, &mlp_in, None)?.expect("packed");
            assert!(max_diff(&via, &plain(&mlp_in)) <= 1e-4);
        }
        // an in-place write (a loaded checkpoint) makes the copy stale: packed again, and the
        // product is the new weight's
        let _ = mlp_in.shallow_clone().f_mul_scalar_(0.5)?;
        {
            let _scope = decode(8)?;
            assert_eq!(cache.packs(), 4);
            let via = linear(&x, &mlp_in, None)?.expect("packed");
            assert!(max_diff(&via, &plain(&mlp_in)) <= 1e-4);
        }
        // another row count packs every frozen weight again
        {
            let _scope = decode(4)?;
            assert_eq!((cache.len(), cache.packs()), (3, 7));
        }
        // a decode of another model (every weight frozen) drops this one's copies
        let other_vs = VarStore::new(Device::Cpu);
        let other = gpt2(&other_vs);
        other_vs.variables().values().for_each(|v| {
            let _ = v.shallow_clone().set_requires_grad(false);
        });
        {
            let _scope = PackedScope::for_decode(
                other.decoder(),
                other.lm_head_weight(),
                4,
                MIN_STEPS,
                Some(&cache),
            )?;
            assert_eq!((cache.len(), cache.packs()), (4, 11));
        }
        {
            let _scope = decode(4)?;
            assert_eq!(cache.packs(), 14, "this model's copies were dropped");
            assert_eq!(cache.len(), 3);
        }
        cache.clear();
        assert!(cache.is_empty());
        Ok(())
    }

    #[test]
    fn libtorchs_refusals_come_back_as_errors_naming_the_op() {
        if !ffi::available() {
            return;
        }
        // a 1-D "weight": libtorch throws, the shim returns its message
        let bad = Tensor::zeros([3], (Kind::Float, Device::Cpu));
        let err = ffi::pack(&bad, 8).unwrap_err().to_string();
        assert!(err.contains("mkl::_mkl_reorder_linear_weight"), "{err}");
        assert!(err.contains("libtorch: "), "{err}");
    }

    #[test]
    fn a_packed_decode_draws_the_plain_decodes_tokens() -> Result<()> {
        let vs = VarStore::new(Device::Cpu);
        let model = gpt2(&vs);
        let prompt = Tensor::from_slice(&[0i64, 4, 6, 7, 8, 9, 0, 0, 3, 1, 2, 5]).view([4, 3]);
        let mask = prompt.ne(0).to_kind(Kind::Int64);
        let cfg = GenerationConfig::rlhf_sampling(12)
            .with_eos_token_id(2)
            .with_pad_token_id(0);
        let opts = GenerateOptions::default();
        // the decode below packs (where this libtorch can)
        assert_eq!(
            PackedScope::for_decode(model.decoder(), model.lm_head_weight(), 4, 12, None)?
                .is_some(),
            ffi::available()
        );
        for seed in 0..4u64 {
            let run = |rng: &mut Generator| {
                generate_impl(&model, &prompt, Some(&mask), &cfg, &opts, Some(rng))
            };
            let (packed, _) = run(&mut Generator::new(seed))?;
            let (plain, _) = without_packing(|| run(&mut Generator::new(seed)))?;
            assert!(packed.sequences.equal(&plain.sequences), "seed {seed}");
            assert!(
                max_diff(&packed.log_probs, &plain.log_probs) <= 1e-5,
                "seed {seed}"
            );
        }
        Ok(())
    }
}
