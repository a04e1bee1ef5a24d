//! [`CausalLmWithScoreHead`]: a sequence-score reward model (`*ForSequenceClassification`
//! with one label) on any causal LM, and [`last_token_index`].

use std::fmt;

use tch::nn::Path;
use tch::{Kind, Tensor};

use super::ilql::batched_index_select;
use super::{read_tokens, trunk_wrapper};
use crate::error::{Error, Result};
use crate::modules::llm::causal_lm::{
    position_ids_from_mask, CausalLm, CausalLmConfig, ForwardOptions, LmInput, ModelBox,
};
use crate::modules::llm::decode::group_rows;
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

    /// Writes `config.json` and `model.safetensors` (the trunk's and `score.weight`) as
    /// `transformers` writes a `*ForSequenceClassification` with one label: the trunk's config
    /// with `architectures` naming the classifier and `id2label` / `label2id` of one label, so
    /// that `AutoModelForSequenceClassification` builds a one-label head that takes
    /// `score.weight` (without them it builds two labels and refuses the `[1, hidden]` weight).
    pub fn save_pretrained(&self, dir: impl AsRef<std::path::Path>) -> Result<()> {
        let op = "CausalLmWithScoreHead::save_pretrained";
        let config = classifier_config(op, &self.model.0.config_json()?)?;
        weights::save_folder(op, dir.as_ref(), &config, &self.named_parameters())
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

    /// [`forward`](Self::forward) for rows that come in consecutive groups of `g` sharing a
    /// prefix (GRPO's `num_generations` completions of one prompt): the trunk runs the longest
    /// prefix on which every group's rows agree (ids and mask, and before every row's last real
    /// token) once per group, repeats its KV cache to the group's rows and runs only the rest
    /// on every row. The scores equal [`forward`](Self::forward)'s up to the rounding of the
    /// smaller matrix products. Rows that share nothing (or `g ≤ 1`, or a batch that is not
    /// whole groups) take the plain forward: sharing is an optimisation found in the data, never
    /// an error.
    ///
    /// ```
    /// use tch::{nn::VarStore, Device, Tensor};
    /// use torchrl::modules::llm::{CausalLmWithScoreHead, Gpt2Config, Gpt2Model, LmInput};
    /// # fn main() -> torchrl::Result<()> {
    /// tch::manual_seed(0);
    /// let vs = VarStore::new(Device::Cpu);
    /// let cfg = Gpt2Config::new(30).with_n_layer(2).with_n_embd(16).with_n_head(2).with_n_positions(32);
    /// let rm = CausalLmWithScoreHead::from_model(&vs.root(), Gpt2Model::new(&vs.root(), &cfg)?)?;
    /// // one prompt [4, 5, 6], two completions of different lengths (right-padded with 0)
    /// let ids = Tensor::from_slice(&[4i64, 5, 6, 7, 8, 9, 4, 5, 6, 10, 0, 0]).view([2, 6]);
    /// let mask = Tensor::from_slice(&[1i64, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0]).view([2, 6]);
    /// let input = LmInput::new(&ids).with_attention_mask(&mask);
    /// let shared = rm.forward_grouped(&input, 2)?;
    /// let plain = rm.forward(&input)?;
    /// assert!(shared.allclose(&plain, 1e-5, 1e-5, false));
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`forward`](Self::forward).
    pub fn forward_grouped(&self, input: &LmInput<'_>, g: usize) -> Result<Tensor> {
        let (ids, mask) = match input.attention_mask {
            Some(m) if g > 1 && input.position_ids.is_none() => (input.input_ids, m),
            _ => return self.forward(input),
        };
        let [b, t] = <[i64; 2]>::try_from(ids.size().as_slice()).unwrap_or([0, 0]);
        let g = i64::try_from(g).unwrap_or(i64::MAX);
        if b < 2 || b % g != 0 || mask.size() != ids.size() {
            return self.forward(input);
        }
        let mask = mask.f_to_kind(Kind::Int64)?;
        let (first_rows, group) = group_rows(b, g, ids.device())?;
        let heads = first_rows.f_index_select(0, &group)?;
        // the columns where every row agrees with the first row of its group, ids and mask
        let agrees =
            |x: &Tensor| -> Result<Tensor> { Ok(x.f_eq_tensor(&x.f_index_select(0, &heads)?)?) };
        let same = agrees(ids)?
            .f_logical_and(&agrees(&mask)?)?
            .f_all_dim(0, false)?;
        let common = same
            .f_to_kind(Kind::Int64)?
            .f_cumprod(0, Kind::Int64)?
            .f_sum(Kind::Int64)?;
        let last = last_token_index(&mask)?;
        // one host read: the shared prefix stops before every row's last real token
        let bounds = Vec::<i64>::try_from(&Tensor::f_stack(&[common, last.f_min()?], 0)?)?;
        let shared = bounds.iter().copied().min().unwrap_or(0);
        if shared < 1 {
            return self.forward(input);
        }
        let hidden_only = ForwardOptions {
            logits: false,
            capture_block_input: None,
        };
        let model = &self.model.0;
        let mut cache = model.new_cache();
        let prefix_ids = ids.f_index_select(0, &first_rows)?.f_narrow(1, 0, shared)?;
        let prefix_mask = mask
            .f_index_select(0, &first_rows)?
            .f_narrow(1, 0, shared)?;
        model.forward_with(
            &LmInput::new(&prefix_ids).with_attention_mask(&prefix_mask),
            Some(&mut cache),
            hidden_only,
        )?;
        cache.index_select(&group)?;
        let rest = ids.f_narrow(1, shared, t - shared)?;
        let positions = position_ids_from_mask(&mask)?.f_narrow(1, shared, t - shared)?;
        let out = model.forward_with(
            &LmInput::new(&rest)
                .with_attention_mask(&mask)
                .with_position_ids(&positions),
            Some(&mut cache),
            hidden_only,
        )?;
        let at = last.f_sub_scalar(shared)?.f_unsqueeze(1)?;
        let h = batched_index_select(&out.last_hidden, &at)?.f_squeeze_dim(1)?;
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

/// A causal LM's `config.json` text turned into its one-label sequence classifier's:
/// `architectures` renamed (`GPT2LMHeadModel` → `GPT2ForSequenceClassification`,
/// `*ForCausalLM` → `*ForSequenceClassification`), `id2label` / `label2id` of one label.
fn classifier_config(op: &'static str, causal: &str) -> Result<String> {
    let mut value: serde_json::Value = serde_json::from_str(causal)
        .map_err(|e| Error::invalid(op, format!("the trunk's config.json is not JSON: {e}")))?;
    let Some(map) = value.as_object_mut() else {
        return Err(Error::invalid(
            op,
            "the trunk's config.json is not a JSON object",
        ));
    };
    if let Some(archs) = map.get_mut("architectures").and_then(|a| a.as_array_mut()) {
        for arch in archs.iter_mut() {
            if let Some(name) = arch.as_str() {
                let base = name
                    .strip_suffix("LMHeadModel")
                    .or_else(|| name.strip_suffix("ForCausalLM"))
                    .unwrap_or(name);
                *arch = serde_json::Value::String(format!("{base}ForSequenceClassification"));
            }
        }
    }
    map.insert("id2label".into(), serde_json::json!({ "0": "LABEL_0" }));
    map.insert("label2id".into(), serde_json::json!({ "LABEL_0": 0 }));
    serde_json::to_string_pretty(&value)
        .map_err(|e| Error::invalid(op, format!("writing config.json: {e}")))
}
