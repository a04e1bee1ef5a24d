//! Causal LMs for RLHF: one model interface ([`CausalLm`]), the layer kit models are built
//! from ([`nn`]: linear, norms, rotary embeddings, grouped-query attention, MLPs, the KV cache),
//! one file per architecture ([`models`]: GPT-2 today, [`models::from_pretrained`] dispatching
//! on `model_type`), Hugging Face checkpoints by parameter name ([`weights`]), fast batched
//! generation ([`generate`]), the heads trlX puts on a model ([`heads`]: value, hydra reference
//! branch, ILQL, sequence score) and tokenizers ([`tokenizer`]). Everything above the model
//! takes `&dyn CausalLm` (or a head holding one), so it runs on any architecture.
//!
//! See `docs/gpt.md` for a tour.
//!
//! ```
//! use tch::{nn::VarStore, Device, Tensor};
//! use torchrl::modules::llm::{CausalLm, Gpt2Config, Gpt2Model, LmInput};
//! # fn main() -> torchrl::Result<()> {
//! let vs = VarStore::new(Device::Cpu);
//! let cfg = Gpt2Config::new(40).with_n_layer(1).with_n_embd(8).with_n_head(2).with_n_positions(16);
//! let model = Gpt2Model::new(&vs.root(), &cfg)?;
//! let ids = Tensor::from_slice(&[1i64, 2, 3]).view([1, 3]);
//! assert_eq!(model.forward(&LmInput::new(&ids), None)?.logits()?.size(), vec![1, 3, 40]);
//! # Ok(()) }
//! ```

mod bpe;
pub mod causal_lm;
pub(crate) mod compaction;
pub(crate) mod decode;
pub mod generation;
pub mod heads;
pub mod ilql_generation;
pub mod keys;
pub mod limits;
pub mod lora;
pub mod models;
pub mod nn;
mod pretokenize;
pub mod scoring;
pub mod tokenizer;
pub mod weights;

pub use causal_lm::{
    position_ids_from_mask, CausalLm, CausalLmConfig, ForwardOptions, LmFacts, LmInput, LmOutput,
    ModelBox,
};
pub use generation::{
    generate, generate_greedy, generate_with, GenerateOptions, GenerationConfig, GenerationOutput,
    LogitMask,
};
pub use heads::{
    batched_index_select, last_token_index, CachedTrunk, CausalLmWithHydraValueHead,
    CausalLmWithIlqlHeads, CausalLmWithScoreHead, CausalLmWithValueHead, HydraOutput, IlqlHeads,
    IlqlHeadsOutput, IlqlOutput, MlpHead, ModelBranch, ReferenceOutput, ValueOutput,
};
pub use ilql_generation::{
    ilql_generate, ilql_generate_with, ilql_scores, IlqlGenerationConfig, IlqlGenerationOutput,
    IlqlScores,
};
pub use keys::LlmKeys;
pub use lora::{LoraConfig, TargetModules};
pub use models::gpt2::{Gpt2Config, Gpt2Model};
pub use nn::{KvCache, LoraSwitch};
pub use scoring::{
    align_values_to_tokens, token_entropy, token_log_probs, HydraReference, ScoreFn, ScoreRequest,
    ScoreTokens, TokenScores,
};
pub use tokenizer::{
    check_tokenizer_fits, pad_rows, BatchEncodeOptions, ByteTokenizer, Encoded, HfTokenizer,
    IdsWithOffsets, PaddingSide, SpecialTokens, TextTokenizer,
};
