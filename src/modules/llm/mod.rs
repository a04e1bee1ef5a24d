//! The GPT policy for RLHF: GPT-2 in `tch` ([`Gpt2Model`]) with an external KV cache
//! ([`KvCache`]), Hugging Face checkpoints by parameter name ([`weights`]), fast batched
//! generation ([`generate`]), the heads trlX puts on it ([`heads`]: value, hydra reference
//! branch, ILQL, sequence score) and tokenizers ([`tokenizer`]).
//!
//! See `docs/gpt.md` for a tour.
//!
//! ```
//! use tch::{nn::VarStore, Device, Tensor};
//! use torchrl::modules::llm::{Gpt2Config, Gpt2Input, Gpt2Model};
//! # fn main() -> torchrl::Result<()> {
//! let vs = VarStore::new(Device::Cpu);
//! let cfg = Gpt2Config::new(40).with_n_layer(1).with_n_embd(8).with_n_head(2).with_n_positions(16);
//! let model = Gpt2Model::new(&vs.root(), &cfg)?;
//! let ids = Tensor::from_slice(&[1i64, 2, 3]).view([1, 3]);
//! assert_eq!(model.forward(&Gpt2Input::new(&ids), None)?.logits()?.size(), vec![1, 3, 40]);
//! # Ok(()) }
//! ```

pub mod cache;
pub mod config;
pub mod generation;
pub mod gpt2;
pub mod heads;
pub mod ilql_generation;
pub mod log_prob;
pub mod tokenizer;
pub mod weights;

pub use cache::KvCache;
pub use config::{Gpt2Activation, Gpt2Config};
pub use generation::{
    generate, generate_with, GenerateOptions, GenerationConfig, GenerationOutput, LogitMask,
};
pub use gpt2::{position_ids_from_mask, ForwardOptions, Gpt2Input, Gpt2Model, Gpt2Output};
pub use heads::{
    batched_index_select, last_token_index, token_entropy, token_log_probs,
    CausalLmWithHydraValueHead, CausalLmWithIlqlHeads, CausalLmWithValueHead, Gpt2ScoreModel,
    HydraOutput, IlqlHeads, IlqlHeadsOutput, IlqlOutput, LlmKeys, MlpHead, ModelBranch,
    ValueOutput,
};
pub use ilql_generation::{
    ilql_generate, ilql_generate_with, ilql_scores, IlqlGenerationConfig, IlqlGenerationOutput,
    IlqlScores,
};
pub use log_prob::{HydraReference, LogProbModel};
pub use tokenizer::{
    pad_rows, BatchEncodeOptions, ByteTokenizer, Encoded, HfTokenizer, PaddingSide, SpecialTokens,
    TextTokenizer,
};
