//! [`CausalLmWithValueHead`]: trlX's policy with a value head, on any causal LM.

use std::fmt;

use tch::nn::Path;
use tch::Tensor;

use super::mlp_head::MlpHead;
use super::{read_tokens, trunk_wrapper};
use crate::error::{Error, Result};
use crate::modules::llm::causal_lm::{CausalLm, CausalLmConfig, LmInput, LmOutput, ModelBox};
use crate::modules::llm::keys::LlmKeys;
use crate::modules::llm::scoring::token_log_probs;
use crate::modules::TensorDictModule;
use crate::tensordict::{NestedKey, TensorDict};

/// What a policy-with-value forward returns.
#[derive(Debug)]
pub struct ValueOutput {
    /// `[B, T, vocab]`.
    pub logits: Tensor,
    /// One value per position, `[B, T]` (trlX's `v_head(h).squeeze(-1)`).
    pub values: Tensor,
    /// The final norm's output, `[B, T, hidden]`.
    pub last_hidden: Tensor,
}

/// trlX's `GPTHeadWithValueModel`: a causal LM (any [`CausalLm`]) and an [`MlpHead`] value head on its last
/// hidden state, both from one trunk pass. As a [`TensorDictModule`] it reads
/// [`LlmKeys::input_ids`] and [`LlmKeys::attention_mask`] and writes logits, log-probs and
/// values.
pub struct CausalLmWithValueHead {
    model: ModelBox,
    v_head: MlpHead,
    pub(super) keys: LlmKeys,
}

impl CausalLmWithValueHead {
    /// A value head under `path` (`v_head.*`) on an existing model of any architecture (e.g.
    /// loaded with [`models::from_pretrained`](crate::modules::llm::models::from_pretrained)
    /// under the same path).
    pub fn from_model(path: &Path<'_>, model: impl Into<ModelBox>) -> Result<Self> {
        let model = model.into();
        let v_head = MlpHead::new(&(path / "v_head"), model.0.facts().hidden_size, 1)?;
        Ok(CausalLmWithValueHead {
            model,
            v_head,
            keys: LlmKeys::default(),
        })
    }

    /// The value head.
    pub fn v_head(&self) -> &MlpHead {
        &self.v_head
    }

    /// The trunk's parameters by `transformers` name, its LoRA adapters' if it has any
    /// ([`CausalLm::adapter_parameters`]), then the value head's as trlX names them
    /// (`v_head.0.weight`, `v_head.0.bias`, `v_head.2.weight`, `v_head.2.bias`: its
    /// `Sequential(Linear, ReLU, Linear)`).
    pub fn named_parameters(&self) -> Vec<(String, &Tensor)> {
        let mut out = self.model.0.named_parameters();
        out.extend(self.model.0.adapter_parameters());
        let names = [
            "v_head.0.weight",
            "v_head.0.bias",
            "v_head.2.weight",
            "v_head.2.bias",
        ];
        out.extend(
            names
                .iter()
                .map(|n| n.to_string())
                .zip(self.v_head.parameters()),
        );
        out
    }

    /// Logits and values from one trunk pass.
    pub fn forward(&self, input: &LmInput<'_>) -> Result<ValueOutput> {
        let out = self.model.0.forward(input, None)?;
        self.finish(out)
    }

    /// [`CausalLmWithValueHead::forward`] from the hidden state entering block `start`
    /// ([`CausalLm::forward_from_block`]), the value head on its final hidden state.
    ///
    /// # Errors
    /// As [`CausalLm::forward_from_block`].
    pub fn forward_from_block(
        &self,
        hidden: &Tensor,
        start: usize,
        attention_mask: Option<&Tensor>,
    ) -> Result<ValueOutput> {
        let out = self
            .model
            .0
            .forward_from_block(hidden, start, attention_mask)?;
        self.finish(out)
    }

    /// The value head on a final hidden state `[B, T, hidden]`: values `[B, T]`.
    pub(crate) fn values_from_hidden(&self, last_hidden: &Tensor) -> Result<Tensor> {
        Ok(self.v_head.forward(last_hidden)?.f_squeeze_dim(-1)?)
    }

    pub(crate) fn finish(&self, out: LmOutput) -> Result<ValueOutput> {
        let values = self.values_from_hidden(&out.last_hidden)?;
        Ok(ValueOutput {
            logits: out
                .logits
                .ok_or_else(|| Error::invalid("CausalLmWithValueHead", "no logits"))?,
            values,
            last_hidden: out.last_hidden,
        })
    }
}

impl TensorDictModule for CausalLmWithValueHead {
    fn in_keys(&self) -> Vec<NestedKey> {
        self.keys.token_inputs()
    }

    fn out_keys(&self) -> Vec<NestedKey> {
        vec![
            self.keys.logits.clone(),
            self.keys.log_probs.clone(),
            self.keys.values.clone(),
        ]
    }

    fn forward(&self, mut td: TensorDict) -> Result<TensorDict> {
        let (ids, mask) = read_tokens(&td, &self.keys)?;
        let out =
            CausalLmWithValueHead::forward(self, &LmInput::new(ids).with_attention_mask(mask))?;
        let lp = token_log_probs(&out.logits, ids, Some(mask))?;
        td.set(&self.keys.logits, out.logits)?;
        td.set(&self.keys.log_probs, lp)?;
        td.set(&self.keys.values, out.values)?;
        Ok(td)
    }
}

trunk_wrapper!(
    CausalLmWithValueHead,
    new: "A random model (of the config's architecture) and value head under `path` \
          (`transformer.*` for GPT-2, `v_head.*`)."
);
