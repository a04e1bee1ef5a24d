//! A [`Composite`]'s shape operations: [`Composite::expand`], dynamic dims,
//! [`Composite::index`], [`Composite::squeeze`] and [`Composite::unsqueeze`].

use super::*;

impl Composite {
    /// The composite expanded to `shape` (TorchRL's trailing-dims rule on its own shape); each
    /// child expands to `[*shape, *child.shape[self.ndim..]]`.
    ///
    /// The composite's own dims stay fixed: a `-1` in `shape` is an error (children keep their
    /// dynamic dims).
    pub fn expand(&self, shape: &[i64]) -> Result<Composite> {
        common::check_shape("Composite::expand", shape)?;
        common::check_expand("Composite", &self.shape, shape)?;
        let nd = self.shape.len();
        let mut out = self.empty();
        out.shape = shape.to_vec();
        for (k, v) in &self.specs {
            let nv = match v {
                None => None,
                Some(spec) => {
                    let tail = spec.shape().get(nd..).unwrap_or(&[]);
                    Some(
                        spec.expand(&concat(shape, tail))
                            .map_err(|e| rekey(e, &display_segments(&[k.as_str()])))?,
                    )
                }
            };
            out.specs.insert(k.clone(), nv);
        }
        Ok(out)
    }

    /// True when a leaf (at any depth) has a dynamic (`-1`) dim; the composite's own shape never
    /// has one.
    pub fn is_dynamic(&self) -> bool {
        self.specs.values().flatten().any(TensorSpec::is_dynamic)
    }

    /// The composite with every dynamic (`-1`) dim of every leaf set to `size` (`>= 0`), e.g.
    /// to draw a sample ([`Composite::rand`]) at a chosen length.
    pub fn resolve_dynamic(&self, size: i64) -> Result<Composite> {
        let mut out = self.empty();
        for (k, v) in &self.specs {
            let nv = match v {
                None => None,
                Some(spec) => Some(spec.resolve_dynamic(size).map_err(|e| {
                    e.context(format!(
                        "resolve_dynamic: at key {}",
                        display_segments(&[k.as_str()])
                    ))
                })?),
            };
            out.specs.insert(k.clone(), nv);
        }
        Ok(out)
    }

    /// Indexes the batch dims (the composite's shape) of every child; feature dims are kept,
    /// and the category dim of OneHot-like leaves is never indexed.
    pub fn index(&self, idx: &[BatchIndex]) -> Result<Composite> {
        let (shape, _) = common::index_lead(&self.shape, &[], idx)?;
        let nd = self.shape.len();
        let mut out = self.empty();
        out.shape = shape;
        for (k, v) in &self.specs {
            let nv = match v {
                None => None,
                Some(spec) => {
                    let extra = spec.ndim().saturating_sub(nd + protected_dims(spec));
                    let mut child_idx: Vec<BatchIndex> =
                        idx.iter().map(BatchIndex::shallow_clone).collect();
                    child_idx.extend((0..extra).map(|_| BatchIndex::full()));
                    Some(spec.index(&child_idx).map_err(|e| {
                        Error::invalid(
                            "index",
                            format!(
                                "cannot index the spec at key {}: {e}",
                                display_segments(&[k.as_str()])
                            ),
                        )
                    })?)
                }
            };
            out.specs.insert(k.clone(), nv);
        }
        Ok(out)
    }

    /// Removes batch dim `dim` if it has size 1 (`None`: every size-1 batch dim), in every
    /// child too.
    pub fn squeeze(&self, dim: Option<i64>) -> Result<Composite> {
        match dim {
            Some(dim) => {
                let d = common::norm_dim("squeeze", dim, self.shape.len())?;
                if self.shape.get(d) != Some(&1) {
                    return Ok(self.copy(false));
                }
                let mut out = self.empty();
                out.shape = self
                    .shape
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| *i != d)
                    .map(|(_, s)| *s)
                    .collect();
                for (k, v) in &self.specs {
                    let nv = match v {
                        None => None,
                        Some(spec) => Some(spec.squeeze(Some(d as i64))?),
                    };
                    out.specs.insert(k.clone(), nv);
                }
                Ok(out)
            }
            None => {
                let mut out = self.copy(false);
                while let Some(i) = out.shape.iter().position(|s| *s == 1) {
                    out = out.squeeze(Some(i as i64))?;
                }
                Ok(out)
            }
        }
    }

    /// Inserts a batch dim of size 1 at `dim` (counted within the batch dims; negative counts
    /// from `ndim + 1`), in every child too.
    pub fn unsqueeze(&self, dim: i64) -> Result<Composite> {
        let d = common::norm_dim("unsqueeze", dim, self.shape.len() + 1)?;
        let mut out = self.empty();
        out.shape = self.shape.clone();
        out.shape.insert(d, 1);
        for (k, v) in &self.specs {
            let nv = match v {
                None => None,
                Some(spec) => Some(spec.unsqueeze(d as i64)?),
            };
            out.specs.insert(k.clone(), nv);
        }
        Ok(out)
    }
}
