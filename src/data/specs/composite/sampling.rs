//! A [`Composite`]'s values: sampling ([`Composite::rand`], [`Composite::zero`],
//! [`Composite::one`]) and checking a tensordict against it ([`Composite::is_in`],
//! [`Composite::check`], [`Composite::project`]).

use super::*;

impl Composite {
    fn materialize<F>(&self, shape: &[i64], f: &mut F) -> Result<TensorDict>
    where
        F: FnMut(&TensorSpec) -> Result<Entry>,
    {
        common::check_shape("rand", shape)?;
        let mut td = TensorDict::new(concat(shape, &self.shape))?;
        if let Some(d) = self.device {
            td = td.with_device(d)?;
        }
        for (k, v) in &self.specs {
            let entry = match v {
                None => continue,
                Some(TensorSpec::Composite(c)) => Entry::Dict(c.materialize(shape, f)?),
                Some(leaf) => f(leaf)?,
            };
            td.set(k.as_str(), entry)?;
        }
        Ok(td)
    }

    /// A random tensordict with batch size `[*shape, *self.shape]` (`None` entries skipped;
    /// nested Composites give nested tensordicts). Always `is_in` the spec.
    pub fn rand(&self, gen: &mut Generator, shape: &[i64]) -> Result<TensorDict> {
        self.materialize(shape, &mut |s| s.rand(gen, shape))
    }

    /// Zeros for every leaf, with the layout of [`Composite::rand`].
    pub fn zero(&self, shape: &[i64]) -> Result<TensorDict> {
        self.materialize(shape, &mut |s| s.zero(shape))
    }

    /// Ones for every leaf, with the layout of [`Composite::rand`].
    pub fn one(&self, shape: &[i64]) -> Result<TensorDict> {
        self.materialize(shape, &mut |s| s.one(shape))
    }

    // ------------------------------------------------------------------ checks

    /// The first failing key of `td` (as a `NotInSpec` error value); a missing key is an error.
    fn first_violation(
        &self,
        op: &'static str,
        td: &TensorDict,
        prefix: &NestedKey,
    ) -> Result<Option<Error>> {
        for (k, v) in &self.specs {
            let Some(spec) = v else { continue };
            if let TensorSpec::Composite(c) = spec {
                if c.is_empty(Recurse::No) {
                    continue;
                }
            }
            let key = prefix.join(k.as_str());
            let Some(entry) = td.get_entry(k.as_str()) else {
                return Err(td.key_not_found(op, key.to_string(), prefix));
            };
            let reason = match (spec, entry) {
                (TensorSpec::Composite(c), Entry::Dict(d)) => {
                    match c.first_violation(op, d, &key)? {
                        Some(e) => return Ok(Some(e)),
                        None => continue,
                    }
                }
                (_, Entry::Dict(d)) => Some(format!(
                    "expected a tensor, got a tensordict with batch size {}",
                    ShapeFmt(d.batch_size())
                )),
                (spec, Entry::Tensor(t)) => spec.violation(t)?,
            };
            if let Some(reason) = reason {
                return Ok(Some(Error::NotInSpec {
                    op,
                    key: key.to_string(),
                    spec: spec.to_string(),
                    reason,
                }));
            }
        }
        Ok(None)
    }

    /// True when every non-`None` child is in `td` at its key (empty sub-composites are
    /// skipped, extra keys in `td` ignored). A missing key is an [`Error::KeyNotFound`] naming
    /// it, not `false` (as TorchRL's `KeyError`).
    pub fn is_in(&self, td: &TensorDict) -> Result<bool> {
        Ok(self
            .first_violation("is_in", td, &NestedKey::default())?
            .is_none())
    }

    /// Like [`Composite::is_in`] but errors on the first failing key (in key order) with
    /// [`Error::NotInSpec`]: the full key, the leaf spec, and why (dtype, shape, or how many
    /// values are out of bounds with the value's min/max and the first offending element).
    pub fn check(&self, td: &TensorDict) -> Result<()> {
        self.check_at(td, &NestedKey::default())
    }

    pub(crate) fn check_at(&self, td: &TensorDict, prefix: &NestedKey) -> Result<()> {
        match self.first_violation("check", td, prefix)? {
            None => Ok(()),
            Some(e) => Err(e),
        }
    }

    /// A tensordict where every leaf that is not in its spec is projected (the others are
    /// shared unchanged). Missing keys are errors.
    pub fn project(&self, td: &TensorDict) -> Result<TensorDict> {
        let mut out = td.clone();
        self.project_into(&mut out, &NestedKey::default())?;
        Ok(out)
    }

    fn project_into(&self, td: &mut TensorDict, prefix: &NestedKey) -> Result<()> {
        for (k, v) in &self.specs {
            let Some(spec) = v else { continue };
            let key = prefix.join(k.as_str());
            let missing = |td: &TensorDict| td.key_not_found("project", key.to_string(), prefix);
            let wrong = |found: &str| Error::NotInSpec {
                op: "project",
                key: key.to_string(),
                spec: spec.to_string(),
                reason: format!("cannot project {found} onto this spec"),
            };
            match spec {
                TensorSpec::Composite(c) => {
                    if c.is_empty(Recurse::No) {
                        continue;
                    }
                    match td.get_entry(k.as_str()) {
                        None => return Err(missing(td)),
                        Some(Entry::Tensor(_)) => return Err(wrong("a tensor")),
                        Some(Entry::Dict(_)) => {}
                    }
                    if let Some(d) = td.get_dict_mut(k.as_str()) {
                        c.project_into(d, &key)?;
                    }
                }
                leaf => {
                    let projected = match td.get_entry(k.as_str()) {
                        None => return Err(missing(td)),
                        Some(Entry::Dict(_)) => return Err(wrong("a tensordict")),
                        Some(Entry::Tensor(t)) => {
                            if leaf.violation(t)?.is_none() {
                                continue;
                            }
                            leaf.project(&Entry::Tensor(t.shallow_clone()))
                                .map_err(|e| rekey(e, &key.to_string()))?
                        }
                    };
                    td.set(k.as_str(), projected)
                        .map_err(|e| rekey(e, &key.to_string()))?;
                }
            }
        }
        Ok(())
    }
}
