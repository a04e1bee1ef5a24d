//! Tensor specs.
