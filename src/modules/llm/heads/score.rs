//! [`CausalLmWithScoreHead`]: a sequence-score reward model (`*ForSequenceClassification`
//! with one label) on any causal LM, and [`last_token_index`].

use std::fmt;

use tch::nn::Path;
use tch::{Kind, Tensor};

use super::ilql::batched_index_select;
use super::{read_tokens, trunk_wrapper};
use crate::error::Result;
use crate::modules::llm::causal_lm::{CausalLm, CausalLmConfig, ForwardOptions, LmInput, ModelBox};
use crate::modules::llm::keys::LlmKeys;
use crate::modules::llm::nn::randn_var;
use crate::modules::llm::{models, weights};
use crate::modules::TensorDictModule;
use crate::tensordict::{NestedKey, TensorDict};

/// The index of each row's last real token, from a mask `[B, T]` (left or right padding):
/// `argmax(arange(T) · mask)`.
pub fn last_token_index(mask: &Tensor) -> Result<Tensor> {
    let t = mask.size().last().copied().unwrap_or(0);
    let pos = Tensor::f_arange(t, (Kind::Int64, mask.device()))?;
    Ok(pos
        .f_mul(&mask.f_to_kind(Kind::Int64)?)?
        .f_argmax(-1, false)?)
}

/// A reward model: a causal LM trunk (any [`CausalLm`]) and `transformers`'
/// `*ForSequenceClassification` score head with one label (`score.weight` `[1, hidden]`, no
/// bias), read at each row's last real token. As a [`TensorDictModule`] it reads the tokens and the mask and writes
/// [`LlmKeys::score`] `[B]`: plug it into
/// [`RewardModelLoss`](crate::objectives::RewardModelLoss) as the score network (it runs on
/// the `chosen` and `rejected` sub-tensordicts).
pub struct CausalLmWithScoreHead {
    model: ModelBox,
    score: Tensor,
    keys: LlmKeys,
}

impl CausalLmWithScoreHead {
    /// A score head under `path` on `model` (normal init with `initializer_range` std).
    pub fn from_model(path: &Path<'_>, model: impl Into<ModelBox>) -> Result<Self> {
        let model = model.into();
        let std = model.0.facts().initializer_range;
        let score = randn_var(
            &(path / "score"),
            "weight",
            &[1, model.0.facts().hidden_size],
            0.0,
            std,
        )?;
        Ok(CausalLmWithScoreHead {
            model,
            score,
            keys: LlmKeys::default(),
        })
    }

    /// Builds from a `transformers` `*ForSequenceClassification` folder (`config.json` and
    /// `model.safetensors` with the trunk's tensors and `score.weight`), by its `model_type`.
    pub fn from_pretrained(path: &Path<'_>, dir: impl AsRef<std::path::Path>) -> Result<Self> {
        let op = "CausalLmWithScoreHead::from_pretrained";
        let dir = dir.as_ref();
        let config_file = dir.join(weights::CONFIG_FILE);
        let config = models::AnyConfig::read(&config_file)?;
        // the headers first: a config that disagrees with its weights builds nothing
        let (mut shapes, _) = config.weight_shapes();
        shapes.remove("lm_head.weight");
        shapes.insert("score.weight".into(), vec![1, config.hidden_size()]);
        weights::check_folder_fits(op, dir, &config_file, &shapes, None)?;
        // built and loaded aside: a late failure adds nothing to the caller's store
        crate::modules::llm::nn::build_staged(path, |path| {
            let this = Self::from_model(path, config.build(path)?)?;
            let (file, tensors) = weights::read_folder(op, dir)?;
            weights::load_into(op, &file, &this.named_parameters(), tensors, None)?;
            Ok(this)
        })
    }

    /// Writes `config.json` and `model.safetensors` (the trunk's and `score.weight`).
    pub fn save_pretrained(&self, dir: impl AsRef<std::path::Path>) -> Result<()> {
        weights::save_folder(
            "CausalLmWithScoreHead::save_pretrained",
            dir.as_ref(),
            &self.model.0.config_json()?,
            &self.named_parameters(),
        )
    }

    /// The trunk's parameters and `score.weight`, by `transformers` name. A sequence
    /// classifier has no LM head: an untied trunk's `lm_head.weight` is not listed (nor saved,
    /// nor expected in a checkpoint), as `*ForSequenceClassification` has none.
    pub fn named_parameters(&self) -> Vec<(String, &Tensor)> {
        let mut out: Vec<(String, &Tensor)> = self
            .model
            .0
            .named_parameters()
            .into_iter()
            .filter(|(n, _)| n != "lm_head.weight")
            .collect();
        out.push(("score.weight".to_string(), &self.score));
        out
    }

    /// One score per row, `[B]`, read at the last token whose mask is 1.
    pub fn forward(&self, input: &LmInput<'_>) -> Result<Tensor> {
        let out = self.model.0.forward_with(
            input,
            None,
            ForwardOptions {
                logits: false,
                capture_block_input: None,
            },
        )?;
        let (b, t, _) = out.last_hidden.size3()?;
        let last = match input.attention_mask {
            Some(m) => last_token_index(m)?,
            None => Tensor::f_full([b], t - 1, (Kind::Int64, out.last_hidden.device()))?,
        };
        let h = batched_index_select(&out.last_hidden, &last.f_unsqueeze(1)?)?.f_squeeze_dim(1)?;
        Ok(h.f_linear(&self.score, None::<Tensor>)?.f_squeeze_dim(-1)?)
    }
}

impl TensorDictModule for CausalLmWithScoreHead {
    fn in_keys(&self) -> Vec<NestedKey> {
        self.keys.token_inputs()
    }

    fn out_keys(&self) -> Vec<NestedKey> {
        vec![self.keys.score.clone()]
    }

    fn forward(&self, mut td: TensorDict) -> Result<TensorDict> {
        let (ids, mask) = read_tokens(&td, &self.keys)?;
        let score =
            CausalLmWithScoreHead::forward(self, &LmInput::new(ids).with_attention_mask(mask))?;
        td.set(&self.keys.score, score)?;
        Ok(td)
    }
}

trunk_wrapper!(
    CausalLmWithScoreHead,
    new: "A random trunk (of the config's architecture) and score head under `path` \
          (`transformer.*` for GPT-2, `score.weight`)."
);
