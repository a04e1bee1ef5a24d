//! [`SliceSampler`]: samples contiguous slices of trajectories from a buffer of transitions,
//! TorchRL's `SliceSampler` (with replacement).
//!
//! A batch of `batch_size` transitions is `num_slices` slices of `batch_size / num_slices`
//! steps (or slices of `slice_len` steps, `batch_size / slice_len` of them); the batch size must
//! divide evenly, as in TorchRL. Trajectories are found in the stored data, as TorchRL does when
//! no key is given: by `("collector", "traj_ids")` (what [`Collector`](crate::collectors::Collector)
//! writes) when the storage has it, else by `"episode"`, else by the end key `("next", "done")`
//! (a trajectory ends after a `true`). A trajectory is a run of consecutive storage positions
//! `0..len` with the same id. Each slice picks a trajectory uniformly among those at least as
//! long as the slice (`strict_length`, TorchRL's default; shorter ones are never sampled) and a
//! start uniformly within it. The sample is flat, `[batch_size]`, slice after slice (reshape it
//! to `[num_slices, slice_len]`).
//!
//! ```
//! use tch::{Device, Kind, Tensor};
//! use torchrl::data::replay::{ReplayBuffer, SliceSampler};
//! use torchrl::TensorDict;
//! # fn main() -> torchrl::Result<()> {
//! // two trajectories: ids 0 (6 steps) and 1 (3 steps)
//! let ids = Tensor::from_slice(&[0i64, 0, 0, 0, 0, 0, 1, 1, 1]);
//! let step = Tensor::from_slice(&[0i64, 1, 2, 3, 4, 5, 0, 1, 2]);
//! let td = TensorDict::new([9])?.with(("collector", "traj_ids"), ids)?.with("step", step)?;
//! let mut rb = ReplayBuffer::with_sampler(100, SliceSampler::with_slice_len(4)?.with_seed(1))?;
//! rb.extend(&td)?;
//! let s = rb.sample(8)?; // two slices of 4 steps
//! let steps = Vec::<i64>::try_from(s.get_or_err("step")?)?;
//! let ids = Vec::<i64>::try_from(s.get_or_err(("collector", "traj_ids"))?)?;
//! for k in 0..2 {
//!     // only trajectory 0 is long enough; each slice is 4 consecutive steps of it
//!     assert!(ids[4 * k..4 * k + 4].iter().all(|i| *i == 0));
//!     assert!((1..4).all(|j| steps[4 * k + j] == steps[4 * k] + j as i64));
//! }
//! # Ok(()) }
//! ```

use tch::Kind;

use super::samplers::{check_args, Sampled, Sampler};
use crate::error::{Error, Result};
use crate::rng::Generator;
use crate::tensordict::{AsKey, NestedKey, TensorDict};

/// Slices of trajectories. See the module docs.
#[derive(Clone, Debug)]
pub struct SliceSampler {
    num_slices: Option<i64>,
    slice_len: Option<i64>,
    traj_key: Option<NestedKey>,
    end_key: NestedKey,
    generator: Generator,
}

impl SliceSampler {
    fn new(num_slices: Option<i64>, slice_len: Option<i64>) -> Result<Self> {
        let (name, v) = match (num_slices, slice_len) {
            (Some(n), _) => ("num_slices", n),
            (_, Some(l)) => ("slice_len", l),
            _ => ("num_slices", 0),
        };
        if v < 1 {
            return Err(Error::argument(
                "SliceSampler::new",
                name,
                "at least 1",
                v.to_string(),
            ));
        }
        Ok(SliceSampler {
            num_slices,
            slice_len,
            traj_key: None,
            end_key: NestedKey::from(("next", "done")),
            generator: Generator::new(0),
        })
    }

    /// `num_slices` slices per batch (of `batch_size / num_slices` steps each).
    pub fn with_num_slices(num_slices: i64) -> Result<Self> {
        SliceSampler::new(Some(num_slices), None)
    }

    /// Slices of `slice_len` steps (`batch_size / slice_len` of them per batch).
    pub fn with_slice_len(slice_len: i64) -> Result<Self> {
        SliceSampler::new(None, Some(slice_len))
    }

    /// Builder: the key holding trajectory ids (default: `("collector", "traj_ids")`, else
    /// `"episode"`, whichever the storage has).
    pub fn with_traj_key(mut self, key: impl AsKey) -> Self {
        self.traj_key = Some(key.to_nested_key());
        self
    }

    /// Builder: the end-of-trajectory key used when there are no trajectory ids (default
    /// `("next", "done")`).
    pub fn with_end_key(mut self, key: impl AsKey) -> Self {
        self.end_key = key.to_nested_key();
        self
    }

    /// Builder: seeds the sampling.
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.generator = Generator::new(seed);
        self
    }

    /// `(slice length, number of slices)` for a batch (TorchRL's `_adjusted_batch_size`).
    fn shape(&self, batch_size: i64) -> Result<(i64, i64)> {
        let op = "SliceSampler::sample";
        match (self.num_slices, self.slice_len) {
            (Some(n), _) if batch_size % n == 0 => Ok((batch_size / n, n)),
            (Some(n), _) => Err(Error::argument(
                op,
                "batch_size",
                format!("a multiple of num_slices ({n}): the batch-size must be divisible by the number of slices"),
                batch_size.to_string(),
            )),
            (None, Some(l)) if batch_size % l == 0 => Ok((l, batch_size / l)),
            (None, Some(l)) => Err(Error::argument(
                op,
                "batch_size",
                format!("a multiple of slice_len ({l}): the batch-size must be divisible by the slice length"),
                batch_size.to_string(),
            )),
            (None, None) => Err(Error::invalid(op, "neither num_slices nor slice_len is set")),
        }
    }

    /// `(start, length)` of every trajectory in storage positions `0..len`.
    fn trajectories(&self, storage: &TensorDict, len: i64) -> Result<Vec<(i64, i64)>> {
        let op = "SliceSampler::sample";
        if storage.batch_size().len() != 1 {
            return Err(Error::invalid(
                op,
                format!(
                    "a SliceSampler reads a storage of transitions (one batch dim); this buffer's \
                     items have batch shape {:?}: extend it with data.reshape([-1])",
                    storage.batch_size().get(1..).unwrap_or(&[])
                ),
            ));
        }
        let per_item = |t: &tch::Tensor| -> Result<Vec<i64>> {
            let mut t = t.f_narrow(0, 0, len)?;
            while t.dim() > 1 {
                t = t.f_select(-1, 0)?;
            }
            Ok(Vec::<i64>::try_from(
                t.f_to_kind(Kind::Int64)?.f_contiguous()?,
            )?)
        };
        let keys: Vec<NestedKey> = match &self.traj_key {
            Some(k) => vec![k.clone()],
            None => vec![
                ("collector", "traj_ids").to_nested_key(),
                "episode".to_nested_key(),
            ],
        };
        let mut bounds = Vec::new();
        if let Some(ids) = keys.iter().find_map(|k| storage.get(k)) {
            let ids = per_item(ids)?;
            let mut start = 0usize;
            for i in 1..=ids.len() {
                if i == ids.len() || ids.get(i) != ids.get(start) {
                    bounds.push((start as i64, (i - start) as i64));
                    start = i;
                }
            }
            return Ok(bounds);
        }
        let Some(done) = storage.get(&self.end_key) else {
            let mut tried: Vec<String> = keys.iter().map(ToString::to_string).collect();
            tried.push(self.end_key.to_string());
            return Err(Error::KeyNotFound {
                op,
                key: format!("one of {} (trajectory ids or end flags)", tried.join(", ")),
                available: storage
                    .keys(crate::tensordict::KeysOptions::nested_leaves())
                    .iter()
                    .map(ToString::to_string)
                    .collect(),
            });
        };
        let done = per_item(done)?;
        let mut start = 0usize;
        for (i, d) in done.iter().enumerate() {
            if *d != 0 || i + 1 == done.len() {
                bounds.push((start as i64, (i + 1 - start) as i64));
                start = i + 1;
            }
        }
        Ok(bounds)
    }
}

impl Sampler for SliceSampler {
    fn sample_indices(&mut self, _len: i64, _batch_size: i64) -> Result<Vec<i64>> {
        Err(Error::invalid(
            "SliceSampler::sample",
            "a SliceSampler reads the stored trajectories: sample through a ReplayBuffer",
        ))
    }

    fn storage_keys(&self) -> Option<Vec<NestedKey>> {
        let mut keys = match &self.traj_key {
            Some(k) => vec![k.clone()],
            None => vec![
                ("collector", "traj_ids").to_nested_key(),
                "episode".to_nested_key(),
            ],
        };
        keys.push(self.end_key.clone());
        Some(keys)
    }

    fn sample_from(&mut self, storage: &TensorDict, len: i64, batch_size: i64) -> Result<Sampled> {
        let op = "SliceSampler::sample";
        check_args(op, len, batch_size)?;
        let (seq, num) = self.shape(batch_size)?;
        let trajs: Vec<(i64, i64)> = self
            .trajectories(storage, len)?
            .into_iter()
            .filter(|(_, l)| *l >= seq)
            .collect();
        if trajs.is_empty() {
            return Err(Error::invalid(
                op,
                format!(
                    "no stored trajectory has {seq} steps or more (strict_length): collect longer \
                     trajectories or ask for shorter slices"
                ),
            ));
        }
        let mut indices = Vec::with_capacity(batch_size.unsigned_abs() as usize);
        for _ in 0..num {
            let k = self.generator.below(trajs.len() as u64) as usize;
            let Some((start, l)) = trajs.get(k).copied() else {
                continue;
            };
            let offset = self.generator.below((l - seq + 1).unsigned_abs()) as i64;
            indices.extend((0..seq).map(|j| start + offset + j));
        }
        Ok(Sampled {
            indices,
            weights: None,
        })
    }
}
