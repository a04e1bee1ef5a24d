//! Data description and storage: tensor specs (and, later, replay buffers).

pub mod specs;
