//! [`KvCache`]: the keys and values of past tokens, per block, held outside the model (as
//! candle does), so that a `&self` model serves many generations at once, each with its own
//! cache.
//!
//! A cache starts empty, grows by the tokens of every forward it is passed to, and knows how
//! many rows (the batch) it holds. [`KvCache::index_select`] keeps some rows (drop finished
//! sequences, or reorder them).
//!
//! ```
//! use tch::{nn::VarStore, Device, Tensor};
//! use torchrl::modules::llm::{CausalLm, Gpt2Config, Gpt2Model, KvCache, LmInput};
//! # fn main() -> torchrl::Result<()> {
//! let vs = VarStore::new(Device::Cpu);
//! let cfg = Gpt2Config::new(20).with_n_layer(1).with_n_embd(8).with_n_head(2).with_n_positions(16);
//! let model = Gpt2Model::new(&vs.root(), &cfg)?;
//! let mut cache = model.new_cache();
//! assert!(cache.is_empty());
//! let ids = Tensor::from_slice(&[1i64, 2, 3, 4, 5, 6]).view([2, 3]);
//! model.forward(&LmInput::new(&ids), Some(&mut cache))?;
//! assert_eq!((cache.len(), cache.batch_size()), (3, Some(2)));
//! cache.index_select(&Tensor::from_slice(&[1i64]))?; // keep row 1 only
//! assert_eq!(cache.batch_size(), Some(1));
//! // a cache of 1 row refuses a batch of 2
//! assert!(model.forward(&LmInput::new(&ids.narrow(1, 0, 1)), Some(&mut cache)).is_err());
//! # Ok(()) }
//! ```

use tch::Tensor;

use crate::error::{Error, Result};

/// Per-block keys and values `[B, n_kv_head, P, head_dim]` of the `P` tokens seen so far.
#[derive(Debug)]
pub struct KvCache {
    /// The blocks filled so far (grown on first use, so that `new` allocates nothing).
    layers: Vec<Option<(Tensor, Tensor)>>,
    n_layer: usize,
    len: i64,
    rows: Option<i64>,
}

impl KvCache {
    /// An empty cache for `n_layer` blocks (a model's
    /// [`CausalLm::new_cache`](crate::modules::llm::CausalLm::new_cache) makes one of its
    /// depth). Nothing is allocated until a forward fills a block, so any `n_layer` is
    /// accepted.
    pub fn new(n_layer: usize) -> Self {
        KvCache {
            layers: Vec::new(),
            n_layer,
            len: 0,
            rows: None,
        }
    }

    /// The number of cached tokens `P`.
    pub fn len(&self) -> i64 {
        self.len
    }

    /// Whether no token is cached.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The number of rows held, once a forward filled the cache.
    pub fn batch_size(&self) -> Option<i64> {
        self.rows
    }

    /// The number of blocks the cache is for.
    pub fn n_layer(&self) -> usize {
        self.n_layer
    }

    /// Empties the cache (keeps its depth).
    pub fn clear(&mut self) {
        self.layers.iter_mut().for_each(|l| *l = None);
        self.len = 0;
        self.rows = None;
    }

    /// Keeps the rows at `index` (int64, 1-D), in that order.
    pub fn index_select(&mut self, index: &Tensor) -> Result<()> {
        let n = index.size();
        let [rows] = <[i64; 1]>::try_from(n.as_slice()).map_err(|_| {
            Error::value(
                "KvCache::index_select",
                "index",
                "1-D row indices",
                format!("{n:?}"),
            )
        })?;
        let mut new = Vec::with_capacity(self.layers.len());
        for l in &self.layers {
            new.push(match l {
                Some((k, v)) => Some((k.f_index_select(0, index)?, v.f_index_select(0, index)?)),
                None => None,
            });
        }
        self.layers = new;
        if self.rows.is_some() {
            self.rows = Some(rows);
        }
        Ok(())
    }

    pub(crate) fn slot(&mut self, layer: usize) -> Result<&mut Option<(Tensor, Tensor)>> {
        let n = self.n_layer;
        if layer >= n {
            return Err(Error::invalid(
                "KvCache",
                format!("block {layer} is past the cache's {n} layers"),
            ));
        }
        // blocks fill in order, so this grows by one block at a time
        if self.layers.len() <= layer {
            self.layers.resize_with(layer + 1, || None);
        }
        self.layers.get_mut(layer).ok_or_else(|| {
            Error::invalid(
                "KvCache",
                format!("block {layer} is past the cache's {n} layers"),
            )
        })
    }

    pub(crate) fn advance(&mut self, t: i64, rows: i64) {
        // the forward checked `len + t` against the context length; saturate regardless
        self.len = self.len.saturating_add(t);
        self.rows = Some(rows);
    }
}
