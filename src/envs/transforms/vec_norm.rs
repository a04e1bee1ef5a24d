//! `VecNorm`: normalizes observations and rewards with running statistics, TorchRL's `VecNorm`
//! (the 0.14 default, `new_api=False`).
//!
//! For each in key present in a step's (or a reset's) output, the statistics are updated
//! first, then the value is normalized with them:
//!
//! ```text
//! sum   ← decay · sum   + Σ_batch x        count ← decay · count + N   (N = batch numel, ≥ 1)
//! ssq   ← decay · ssq   + Σ_batch x²
//! mean  = sum / count     std = sqrt(max(ssq / count − mean², eps))
//! out   = (x − mean) / max(std, eps)
//! ```
//!
//! `sum` and `ssq` have the entry's feature shape (the value's shape without the env's batch
//! dims) and its dtype; `count` is a float32 `[1]`; `Σ_batch` sums over the batch dims, so the
//! statistics are shared by every element of a batched env. Defaults as TorchRL: in keys
//! `["observation", "reward"]`, `decay = 0.9999`, `eps = 1e-4`. Missing keys are skipped
//! (a reset has no reward). [`VecNorm::freeze`] stops the updates (the values are still
//! normalized).
//!
//! **Shared across envs.** [`VecNorm::shared`] returns a transform that updates the *same*
//! statistics (behind a mutex): give one to each env of a `SerialEnv` / `ParallelEnv` (or an
//! eval env), as TorchRL's `shared_td`.
//!
//! **Saved with the transform.** [`VecNorm::state_dict`] returns the statistics as a
//! tensordict with TorchRL's keys (`"observation_sum"`, `"observation_ssq"`,
//! `"observation_count"`, …); [`VecNorm::load_state_dict`] puts them back (also into a fresh
//! transform), and [`VecNorm::save`] / [`VecNorm::load`] write / read them as a safetensors
//! file.
//!
//! The out key's spec becomes `Unbounded` with the in key's shape, dtype and device (a
//! normalized value is not bound by the raw value's bounds; TorchRL leaves the spec as it is).
//!
//! ```
//! use torchrl::envs::builtin::PendulumEnv;
//! use torchrl::envs::transforms::{TransformedEnv, VecNorm};
//! use torchrl::envs::{EnvBase, RolloutConfig};
//! # fn main() -> torchrl::Result<()> {
//! let norm = VecNorm::new().with_decay(0.99)?;
//! let shared = norm.shared(); // updates the same statistics
//! let mut env = TransformedEnv::new(PendulumEnv::new(&[8], tch::Device::Cpu)?)?.with(norm)?;
//! env.rollout(20, None, &RolloutConfig::no_break())?;
//! let state = shared.state_dict()?;
//! let count = state.get_or_err("observation_count")?.double_value(&[0]);
//! // 21 updates of 8 elements (the reset and 20 steps), decayed by 0.99 per update
//! let expected: f64 = (0..21).map(|i| 8.0 * 0.99f64.powi(i)).sum();
//! assert!((count - expected).abs() < 1e-3, "{count} vs {expected}");
//! # Ok(()) }
//! ```

use std::path::Path;
use std::sync::{Arc, Mutex};

use tch::{Kind, Tensor};

use super::{added_keys, KeyMap, Transform};
use crate::data::specs::Unbounded;
use crate::envs::{EnvSpecs, SpecGroup};
use crate::error::{Error, Result};
use crate::macros::setters;
use crate::tensordict::{fmt_key_list, AsKey, NestedKey, TensorDict};

/// Running mean / variance normalization. See the module docs.
#[derive(Debug)]
pub struct VecNorm {
    keys: KeyMap,
    decay: f64,
    eps: f64,
    frozen: bool,
    /// `<key>_sum`, `<key>_ssq`, `<key>_count` (batch `[]`), shared by [`VecNorm::shared`].
    stats: Arc<Mutex<Option<TensorDict>>>,
}

impl Default for VecNorm {
    fn default() -> Self {
        Self::new()
    }
}

/// `key` with `suffix` appended to its last segment (TorchRL's `_append_last`).
fn append_last(key: &NestedKey, suffix: &str) -> NestedKey {
    let mut parts: Vec<String> = key.parts().map(str::to_string).collect();
    if let Some(last) = parts.last_mut() {
        last.push_str(suffix);
    }
    let refs: Vec<&str> = parts.iter().map(String::as_str).collect();
    refs[..].to_nested_key()
}

setters!(VecNorm {
    /// The keys to normalize (default `["observation", "reward"]`).
    with_in_keys(keys) => keys.ins;
    /// The keys to write, one per in key (default: the in keys).
    with_out_keys(keys) => keys.outs [Some];
});

impl VecNorm {
    /// TorchRL's defaults: in keys `["observation", "reward"]`, decay 0.9999, eps 1e-4.
    pub fn new() -> Self {
        VecNorm {
            keys: KeyMap::new(vec![
                NestedKey::from("observation"),
                NestedKey::from("reward"),
            ]),
            decay: 0.9999,
            eps: 1e-4,
            frozen: false,
            stats: Arc::new(Mutex::new(None)),
        }
    }

    /// The decay of the running sums (in `[0, 1]`).
    pub fn with_decay(mut self, decay: f64) -> Result<Self> {
        if !(0.0..=1.0).contains(&decay) {
            return Err(Error::argument(
                "VecNorm::with_decay",
                "decay",
                "a value in [0, 1]",
                decay.to_string(),
            ));
        }
        self.decay = decay;
        Ok(self)
    }

    /// The lower bound of the running standard deviation (positive).
    pub fn with_eps(mut self, eps: f64) -> Result<Self> {
        if eps.is_nan() || eps <= 0.0 {
            return Err(Error::argument(
                "VecNorm::with_eps",
                "eps",
                "a positive value",
                eps.to_string(),
            ));
        }
        self.eps = eps;
        Ok(self)
    }

    /// A transform with the same keys and options that reads and updates the same statistics.
    pub fn shared(&self) -> VecNorm {
        VecNorm {
            keys: self.keys.clone(),
            decay: self.decay,
            eps: self.eps,
            frozen: self.frozen,
            stats: Arc::clone(&self.stats),
        }
    }

    /// Stops updating the statistics (values are still normalized).
    pub fn freeze(&mut self) {
        self.frozen = true;
    }

    /// Resumes updating the statistics.
    pub fn unfreeze(&mut self) {
        self.frozen = false;
    }

    /// A copy that keeps its own (copied) statistics and does not update them (TorchRL's
    /// `frozen_copy`).
    pub fn frozen_copy(&self) -> Result<VecNorm> {
        let mut copy = self.shared();
        copy.stats = Arc::new(Mutex::new(Some(self.state_dict()?)));
        copy.frozen = true;
        Ok(copy)
    }

    fn lock(&self, op: &'static str) -> Result<std::sync::MutexGuard<'_, Option<TensorDict>>> {
        self.stats.lock().map_err(|_| {
            Error::invalid(
                op,
                "the statistics' lock is poisoned (an env sharing them panicked)",
            )
        })
    }

    /// A deep copy of the statistics (TorchRL's keys: `"<key>_sum"`, `"<key>_ssq"`,
    /// `"<key>_count"`); empty before the first update.
    pub fn state_dict(&self) -> Result<TensorDict> {
        match self.lock("VecNorm::state_dict")?.as_ref() {
            Some(stats) => stats.deep_clone(),
            None => TensorDict::new(Vec::<i64>::new()),
        }
    }

    /// Replaces the statistics with `state` (as [`VecNorm::state_dict`] returns them), for
    /// every transform sharing them, after checking them as the updates keep them: for each
    /// in key, `_sum` and `_ssq` floating point of one shape, `_ssq` ≥ 0, `_count` one
    /// floating-point element > 0, every value finite. Nothing changes on error.
    ///
    /// # Errors
    /// An in key lacking one of its three entries, or statistics that break those rules
    /// (named by key), which no sequence of updates produces and which would normalize to NaN
    /// or to wrong values.
    pub fn load_state_dict(&self, state: &TensorDict) -> Result<()> {
        let op = "VecNorm::load_state_dict";
        for k in &self.keys.ins {
            let mut got = Vec::with_capacity(3);
            for s in ["_sum", "_ssq", "_count"] {
                let key = append_last(k, s);
                let Some(t) = state.get(&key) else {
                    return Err(super::missing_key(op, state, &key));
                };
                got.push((key, t));
            }
            check_stats(op, &got)?;
        }
        *self.lock(op)? = Some(state.deep_clone()?);
        Ok(())
    }

    /// Writes [`VecNorm::state_dict`] to a safetensors file.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        self.state_dict()?.save(path)
    }

    /// Reads a file written by [`VecNorm::save`] into the statistics (checked as
    /// [`VecNorm::load_state_dict`] checks them; an error names the file).
    pub fn load(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        self.load_state_dict(&TensorDict::load(path)?)
            .map_err(|e| e.context(format!("VecNorm::load({})", path.display())))
    }

    /// `(loc, scale)` of `key` (an in key): the running mean and standard deviation, as
    /// TorchRL's `loc` / `scale`. Errors before the first update.
    pub fn loc_scale(&self, key: impl AsKey) -> Result<(Tensor, Tensor)> {
        let op = "VecNorm::loc_scale";
        let guard = self.lock(op)?;
        let key = key.to_nested_key();
        let empty = TensorDict::new(Vec::<i64>::new())?;
        let stats = guard.as_ref().unwrap_or(&empty);
        let (mean, std) = mean_std(stats, &key, self.eps, op)?;
        Ok((mean, std))
    }

    fn call(&self, td: TensorDict, op: &'static str) -> Result<TensorDict> {
        let mut td = td;
        let pairs = self.keys.pairs(op, self, "")?;
        let n = (td.batch_size().iter().product::<i64>()).max(1);
        let nb = td.batch_size().len();
        let mut guard = self.lock(op)?;
        if guard.is_none() {
            *guard = Some(TensorDict::new(Vec::<i64>::new())?);
        }
        let Some(stats) = guard.as_mut() else {
            return Err(Error::invalid(op, "no statistics"));
        };
        for (key, out) in pairs {
            let Some(value) = td.get(&key) else { continue };
            let value = value.shallow_clone();
            let (ks, kq, kc) = (
                append_last(&key, "_sum"),
                append_last(&key, "_ssq"),
                append_last(&key, "_count"),
            );
            if !stats.contains(&ks) {
                let feat: Vec<i64> = value
                    .size()
                    .get(nb..)
                    .map(<[i64]>::to_vec)
                    .unwrap_or_default();
                let zeros = Tensor::f_zeros(&feat, (value.kind(), value.device()))?;
                stats.set(&ks, zeros.f_zeros_like()?)?;
                stats.set(&kq, zeros)?;
                stats.set(&kc, Tensor::f_zeros([1], (Kind::Float, value.device()))?)?;
            }
            if !self.frozen {
                let sum = stats.get_or_err(&ks)?;
                let ssq = stats.get_or_err(&kq)?;
                let count = stats.get_or_err(&kc)?;
                let new_sum = sum
                    .f_mul_scalar(self.decay)?
                    .f_add(&sum_left(&value, sum.dim())?)?;
                let new_ssq = ssq
                    .f_mul_scalar(self.decay)?
                    .f_add(&sum_left(&value.f_square()?, ssq.dim())?)?;
                let new_count = count.f_mul_scalar(self.decay)?.f_add_scalar(n)?;
                stats.set(&ks, new_sum)?;
                stats.set(&kq, new_ssq)?;
                stats.set(&kc, new_count)?;
            }
            let (mean, std) = mean_std(stats, &key, self.eps, op)?;
            let normed = value.f_sub(&mean)?.f_div(&std.f_clamp_min(self.eps)?)?;
            td.set(&out, normed)?;
        }
        Ok(td)
    }
}

/// Checks one in key's `[(sum key, sum), (ssq key, ssq), (count key, count)]` as the updates
/// keep them (see [`VecNorm::load_state_dict`]).
fn check_stats(op: &'static str, got: &[(NestedKey, &Tensor)]) -> Result<()> {
    let [(ks, sum), (kq, ssq), (kc, count)] = got else {
        return Err(Error::invalid(op, "three statistics per in key"));
    };
    for (k, t) in [(ks, sum), (kq, ssq), (kc, count)] {
        if !t.is_floating_point() {
            return Err(Error::value(
                op,
                k,
                "floating-point statistics",
                format!("dtype {:?}", t.kind()),
            ));
        }
        let finite = t.f_isfinite()?.f_all()?.f_int64_value(&[])? == 1;
        if !finite {
            return Err(Error::value(op, k, "finite values", "NaN or infinity"));
        }
    }
    if sum.size() != ssq.size() {
        return Err(Error::ShapeMismatch {
            op,
            key: kq.to_string(),
            expected: sum.size(),
            actual: ssq.size(),
        });
    }
    if ssq.numel() > 0 && ssq.f_min()?.f_to_kind(Kind::Double)?.f_double_value(&[])? < 0.0 {
        return Err(Error::value(
            op,
            kq,
            "sums of squares ≥ 0",
            "a negative value",
        ));
    }
    let n = count.numel();
    let value = count.f_sum(Kind::Double)?.f_double_value(&[])?;
    if n != 1 || value <= 0.0 {
        return Err(Error::value(
            op,
            kc,
            "one count > 0 (the decayed number of values seen)",
            format!("{n} element(s) summing to {value}"),
        ));
    }
    Ok(())
}

/// Sums `v` over its leading dims until it has `dim` dims (TorchRL's `_sum_left`).
fn sum_left(v: &Tensor, dim: usize) -> Result<Tensor> {
    let mut v = v.shallow_clone();
    while v.dim() > dim {
        v = v.f_sum_dim_intlist(&[0i64][..], false, None::<Kind>)?;
    }
    Ok(v)
}

/// The running mean and standard deviation of `key` (before the `eps` clamp of the divisor).
fn mean_std(
    stats: &TensorDict,
    key: &NestedKey,
    eps: f64,
    op: &'static str,
) -> Result<(Tensor, Tensor)> {
    let get = |s: &str| {
        let k = append_last(key, s);
        stats.get(&k).ok_or_else(|| {
            Error::value(
                op,
                &k,
                "statistics of an in key (none yet: the transform has seen no data for it)",
                "no entry",
            )
        })
    };
    let (sum, ssq, count) = (get("_sum")?, get("_ssq")?, get("_count")?);
    let mean = sum.f_div(count)?;
    let var = ssq.f_div(count)?.f_sub(&mean.f_square()?)?;
    let std = var.f_clamp_min(eps)?.f_sqrt()?;
    Ok((mean, std))
}

impl Transform for VecNorm {
    fn name(&self) -> String {
        format!(
            "VecNorm(decay={:.4}, eps={:.4}, in_keys={})",
            self.decay,
            self.eps,
            fmt_key_list(&self.keys.ins)
        )
    }

    fn new_output_keys(&self) -> Vec<NestedKey> {
        self.keys
            .pairs("VecNorm", self, "")
            .map(|p| added_keys(&p))
            .unwrap_or_default()
    }

    fn transform_output_spec(&self, specs: EnvSpecs) -> Result<EnvSpecs> {
        let op = "VecNorm::transform_output_spec";
        let mut specs = specs;
        for (input, output) in self.keys.pairs(op, self, "")? {
            let group = match specs.output_group_of(&input) {
                Some(g @ (SpecGroup::Observation | SpecGroup::Reward)) => g,
                // TorchRL skips keys the data lacks; a key in no spec is left alone here too
                _ => continue,
            };
            let spec = specs.group(group).get_or_err(&input)?;
            let mut u = Unbounded::new().with_shape(spec.shape())?;
            if let Some(kind) = spec.dtype() {
                u = u.with_dtype(kind)?;
            }
            if let Some(device) = spec.device() {
                u = u.with_device(device)?;
            }
            specs.group_mut(group).set(&output, u)?;
        }
        Ok(specs)
    }

    fn couples_batch_elements(&self) -> bool {
        // the statistics are updated by every element; frozen, they are constants
        !self.frozen
    }

    fn step(&mut self, _td: &TensorDict, next: TensorDict) -> Result<TensorDict> {
        self.call(next, "VecNorm::step")
    }

    fn reset(&mut self, _td: &TensorDict, reset: TensorDict) -> Result<TensorDict> {
        self.call(reset, "VecNorm::reset")
    }

    fn forward(&mut self, td: TensorDict) -> Result<TensorDict> {
        self.call(td, "VecNorm::forward")
    }
}
