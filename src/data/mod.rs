//! Data description and storage: tensor specs and replay buffers.

pub mod replay;
pub mod specs;
