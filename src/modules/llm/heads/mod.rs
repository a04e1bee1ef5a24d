//! The heads trlX puts on a causal LM (any [`CausalLm`]), each a [`TensorDictModule`]
//! reading TorchRL's LLM layout ([`LlmKeys`]), one file per head:
//!
//! - [`MlpHead`]: trlX's `make_head(h, out)` (`Linear(h, 2h) → ReLU → Linear(2h, out)`,
//!   PyTorch's default init);
//! - [`CausalLmWithValueHead`] (trlX's `GPTHeadWithValueModel`): logits and one value per
//!   position from the same trunk pass;
//! - [`CausalLmWithHydraValueHead`] (trlX's `GPTHydraHeadWithValueModel(num_layers_unfrozen)`):
//!   the same plus the reference logits. With `k = num_layers_unfrozen > 0` the reference is a
//!   frozen [`ModelBranch`] (copies of the top `k` blocks and the final norm; its LM head is
//!   the policy's frozen token embedding) that starts from the policy's hidden state entering
//!   block `L − k`; the policy's lower trunk and embeddings are frozen, so the branch plus the
//!   shared trunk *is* the reference model, at about `k / L` of the blocks' parameter memory. With `k ≤ 0` the reference is a full
//!   frozen copy (`k = 0` freezes every block of the policy too, `k = -1` trains everything),
//!   as in trlX. The branch is frozen as a whole (trlX PR #140's bug is not repeated);
//! - [`IlqlHeads`] / [`CausalLmWithIlqlHeads`] (trlX's `CausalLMWithValueHeads`): V, Q1, Q2
//!   and frozen target-Q heads with Polyak sync, gathered at `states_ixs` / `actions_ixs`;
//! - [`CausalLmWithScoreHead`] (`transformers`' `*ForSequenceClassification` with one label,
//!   the weights load by its names): a scalar read at the last real token, the score network of
//!   [`RewardModelLoss`](crate::objectives::RewardModelLoss).
//!
//! - [`CachedTrunk`]: a hydra policy continued from its frozen trunk's cached output.
//!
//! **Log-probs** written under [`LlmKeys::log_probs`] follow TorchRL's layout: aligned with the
//! tokens, `log_probs[t] = log p(token[t] | tokens < t)`, 0 at `t = 0` and where the token or
//! the one before it is padding (trlX's `logprobs[i]` is this `log_probs[i + 1]`).
//!
//! ```
//! use tch::{nn::VarStore, Device, Tensor};
//! use torchrl::modules::llm::{CausalLmWithHydraValueHead, Gpt2Config, LmInput};
//! # fn main() -> torchrl::Result<()> {
//! let vs = VarStore::new(Device::Cpu);
//! let cfg = Gpt2Config::new(40).with_n_layer(4).with_n_embd(16).with_n_head(2).with_n_positions(16);
//! let policy = CausalLmWithHydraValueHead::new(&vs.root(), &cfg, 1)?; // hydra, 1 unfrozen block
//! let ids = Tensor::from_slice(&[1i64, 2, 3, 4]).view([1, 4]);
//! let out = policy.forward(&LmInput::new(&ids))?;
//! assert_eq!(out.values.size(), vec![1, 4]);
//! // at construction the reference equals the policy exactly
//! assert!(out.logits.equal(&out.ref_logits));
//! // and it holds a quarter of the blocks
//! assert!(policy.reference_parameter_bytes() < policy.full_copy_parameter_bytes() / 2);
//! # Ok(()) }
//! ```

pub mod cached_trunk;
pub mod hydra;
pub mod ilql;
pub mod mlp_head;
pub mod score;
pub mod value;

pub use cached_trunk::CachedTrunk;
pub use hydra::{CausalLmWithHydraValueHead, HydraOutput, ModelBranch, ReferenceOutput};
pub use ilql::{
    batched_index_select, CausalLmWithIlqlHeads, IlqlHeads, IlqlHeadsOutput, IlqlOutput,
};
pub use mlp_head::MlpHead;
pub use score::{last_token_index, CausalLmWithScoreHead};
pub use value::{CausalLmWithValueHead, ValueOutput};

use tch::Tensor;

use super::keys::LlmKeys;
use crate::error::Result;
use crate::tensordict::TensorDict;

#[allow(unused_imports)]
use super::CausalLm;
#[allow(unused_imports)]
use crate::modules::TensorDictModule;

/// The parts every trunk-plus-head wrapper shares: `Debug`, the key and trunk accessors, and
/// (with `new`) a random-init constructor that builds the trunk and calls `from_model`.
macro_rules! trunk_wrapper_impl {
    ($ty:ident) => {
        impl fmt::Debug for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_struct(stringify!($ty))
                    .field("model", &self.model)
                    .finish_non_exhaustive()
            }
        }

        impl $ty {
            /// Replaces the tensordict keys.
            pub fn with_keys(mut self, keys: LlmKeys) -> Self {
                self.keys = keys;
                self
            }

            /// The tensordict keys.
            pub fn keys(&self) -> &LlmKeys {
                &self.keys
            }

            /// The trunk.
            pub fn model(&self) -> &dyn CausalLm {
                self.model.0.as_ref()
            }
        }
    };
    ($ty:ident, new: $doc:literal) => {
        $crate::modules::llm::heads::trunk_wrapper!($ty);

        impl $ty {
            #[doc = $doc]
            pub fn new(path: &Path<'_>, config: &dyn CausalLmConfig) -> Result<Self> {
                let model = config.build(path)?;
                Self::from_model(path, model)
            }
        }
    };
}

pub(crate) use trunk_wrapper_impl as trunk_wrapper;

/// Bytes held by `params`.
pub(crate) fn parameter_bytes<'a>(params: impl IntoIterator<Item = &'a Tensor>) -> i64 {
    params
        .into_iter()
        .map(|p| p.numel() as i64 * p.kind().elt_size_in_bytes() as i64)
        .sum()
}

/// Turns gradients off for `params`.
pub(crate) fn freeze<'a>(params: impl IntoIterator<Item = &'a Tensor>) -> Result<()> {
    for p in params {
        let _ = p.f_set_requires_grad(false)?;
    }
    Ok(())
}

/// Reads the token ids and the mask from `td` under `keys`.
pub(crate) fn read_tokens<'a>(
    td: &'a TensorDict,
    keys: &LlmKeys,
) -> Result<(&'a Tensor, &'a Tensor)> {
    Ok((
        td.get_or_err(&keys.input_ids)?,
        td.get_or_err(&keys.attention_mask)?,
    ))
}
