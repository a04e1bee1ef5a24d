//! Data description and storage: tensor specs, replay buffers, and the LLM trainers' text data.

pub mod llm;
pub mod replay;
pub mod specs;
