//! Conversions between the index and the one-hot specs: [`Categorical`] ↔ [`OneHot`] and
//! [`MultiCategorical`] ↔ [`MultiOneHot`]. They live here so that neither spec of a pair
//! imports the other.
//!
//! ```
//! use torchrl::specs::{MultiCategorical, MultiOneHot};
//! # fn main() -> torchrl::Result<()> {
//! let spec = MultiCategorical::new(vec![2, 3])?.with_shape([4, 2])?;
//! let hot = spec.to_one_hot_spec();
//! assert_eq!(hot.shape(), &[4, 5]);
//! assert_eq!(hot.to_categorical_spec(), spec);
//! assert_eq!(MultiOneHot::new(vec![2, 3])?.to_categorical_spec().nvec(), &[2, 3]);
//! # Ok(()) }
//! ```

use tch::Kind;

use super::common::{concat, lead};
use super::{Categorical, MultiCategorical, MultiOneHot, OneHot};

impl Categorical {
    /// The matching [`OneHot`] spec: shape `[*shape, n]`, dtype `Bool`, the same mask.
    pub fn to_one_hot_spec(&self) -> OneHot {
        OneHot {
            n: self.n,
            shape: concat(&self.shape, &[self.n]),
            dtype: Kind::Bool,
            device: self.device,
            mask: self.mask.clone(),
        }
    }
}

impl OneHot {
    /// The matching [`Categorical`] spec: the shape without its last dim, dtype `Int64`, the
    /// same mask.
    pub fn to_categorical_spec(&self) -> Categorical {
        Categorical {
            n: self.n,
            shape: lead(&self.shape).to_vec(),
            dtype: Kind::Int64,
            device: self.device,
            mask: self.mask.clone(),
        }
    }
}

impl MultiCategorical {
    /// The matching [`MultiOneHot`] spec: last dim `sum(nvec)`, dtype `Bool`.
    pub fn to_one_hot_spec(&self) -> MultiOneHot {
        let total: i64 = self.nvec.iter().sum();
        MultiOneHot {
            nvec: self.nvec.clone(),
            shape: concat(lead(&self.shape), &[total]),
            dtype: Kind::Bool,
            device: self.device,
        }
    }
}

impl MultiOneHot {
    /// The matching [`MultiCategorical`] spec: last dim `len(nvec)`, dtype `Int64`.
    pub fn to_categorical_spec(&self) -> MultiCategorical {
        MultiCategorical {
            shape: concat(lead(&self.shape), &[self.nvec.len() as i64]),
            nvec: self.nvec.clone(),
            dtype: Kind::Int64,
            device: self.device,
        }
    }
}
