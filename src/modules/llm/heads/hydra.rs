//! [`CausalLmWithHydraValueHead`]: trlX's hydra policy (a value head and a frozen reference
//! that shares the policy's lower trunk), and [`ModelBranch`], the frozen top blocks, on any
//! causal LM.

use std::fmt;

use tch::nn::{Path, VarStore};
use tch::Tensor;

use super::value::CausalLmWithValueHead;
use super::{freeze, parameter_bytes, read_tokens};
use crate::error::{Error, Result};
use crate::modules::llm::causal_lm::{
    run_from_block, CausalLm, CausalLmConfig, ForwardOptions, LmInput, ModelBox,
};
use crate::modules::llm::keys::LlmKeys;
use crate::modules::llm::lora::lora_switch;
use crate::modules::llm::nn::LoraSwitch;
use crate::modules::llm::nn::{copy_var, Decoder};
use crate::modules::llm::scoring::{
    head_start, hidden_from, lm_head_from, scores_from_head, scores_from_hidden, token_log_probs,
    ScoreRequest, TRUNK_ONLY,
};
use crate::modules::TensorDictModule;
use crate::tensordict::{NestedKey, TensorDict};

/// trlX's `ModelBranch`: frozen copies of the top `k` blocks, the final norm and the LM head,
/// taken when the branch is built. It computes reference logits from the hidden state entering
/// block `L − k`.
///
/// When the model's LM head weight is already frozen (GPT-2's is the token embedding, which a
/// hydra policy freezes) the branch shares it instead of copying it: it cannot change, and on
/// GPT-2 small that saves 154 MB (trlX deep-copies it).
pub struct ModelBranch {
    decoder: Decoder,
    hidden_size: i64,
    lm_head: Tensor,
    shares_lm_head: bool,
    start: usize,
}

impl fmt::Debug for ModelBranch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (start, n) = (self.start, self.decoder.blocks().len());
        write!(f, "ModelBranch(start_block={start}, blocks={n})")
    }
}

impl ModelBranch {
    /// Copies the top `k` blocks, the final norm and the LM head of `model` (any architecture)
    /// under `path` (not frozen: freeze the store it lives in).
    ///
    /// # Errors
    /// `k` is 0 or more than the model's block count.
    pub fn new(path: &Path<'_>, model: &dyn CausalLm, k: usize) -> Result<Self> {
        let n = model.n_layer();
        let decoder = model.decoder().copy_top(path, k)?;
        let head = model.lm_head_weight();
        let shares_lm_head = !head.requires_grad();
        let lm_head = if shares_lm_head {
            head.shallow_clone()
        } else {
            copy_var(&(path / "lm_head"), "weight", head)?
        };
        Ok(ModelBranch {
            decoder,
            hidden_size: model.facts().hidden_size,
            lm_head,
            shares_lm_head,
            start: n - k,
        })
    }

    /// The index of the first policy block the branch replaces (`L − k`).
    pub fn start_block(&self) -> usize {
        self.start
    }

    /// Reference logits `[B, T, vocab]` from `hidden` `[B, T, hidden]`, the hidden state that
    /// enters block [`ModelBranch::start_block`] (mask as in the policy's forward, without a
    /// cache).
    pub fn forward(&self, hidden: &Tensor, attention_mask: Option<&Tensor>) -> Result<Tensor> {
        self.forward_from(hidden, attention_mask, 0)
    }

    /// [`ModelBranch::forward`] with the LM head on positions `start..` only.
    fn forward_from(
        &self,
        hidden: &Tensor,
        attention_mask: Option<&Tensor>,
        start: i64,
    ) -> Result<Tensor> {
        let h = run_from_block(self.hidden_size, &self.decoder, hidden, 0, attention_mask)?;
        Ok(hidden_from(&h, start)?.f_matmul(&self.lm_head.f_transpose(0, 1)?)?)
    }

    /// Whether the LM head is the model's (frozen) LM head weight rather than a copy.
    pub fn shares_lm_head(&self) -> bool {
        self.shares_lm_head
    }

    /// The parameters the branch owns (the shared LM head is not counted).
    fn parameters(&self) -> Vec<&Tensor> {
        let mut out = self.decoder.block_parameters(self.decoder.blocks().len());
        out.extend(
            self.decoder
                .norm()
                .named_parameters()
                .into_iter()
                .map(|(_, p)| p),
        );
        if !self.shares_lm_head {
            out.push(&self.lm_head);
        }
        out
    }
}

/// The reference model of a [`CausalLmWithHydraValueHead`].
enum Reference {
    Branch(ModelBranch),
    Full(Box<dyn CausalLm>),
    /// The policy's own weights with its LoRA adapters off (TRL's PEFT path).
    AdaptersOff(LoraSwitch),
}

/// What a hydra forward returns: the policy's logits and values and the reference logits,
/// from one pass over the shared trunk.
#[derive(Debug)]
pub struct HydraOutput {
    /// Policy logits `[B, T, vocab]`.
    pub logits: Tensor,
    /// Values `[B, T]`.
    pub values: Tensor,
    /// Reference logits `[B, T, vocab]`, detached.
    pub ref_logits: Tensor,
    /// The frozen trunk's output `[B, T, hidden]` (the hidden state entering block
    /// [`CausalLmWithHydraValueHead::frozen_trunk_end`]), detached; `None` for a full-copy
    /// reference (nothing is frozen then).
    pub trunk: Option<Tensor>,
}

/// What [`CausalLmWithHydraValueHead::rollout_scores`] returns, `[B, T]` each.
#[derive(Debug)]
pub(crate) struct RolloutScores {
    /// The policy's log-probs, when asked for.
    pub(crate) log_probs: Option<Tensor>,
    /// The policy's values, aligned with the tokens, when the policy was asked for.
    pub(crate) values: Option<Tensor>,
    /// The reference's log-probs.
    pub(crate) ref_log_probs: Tensor,
    /// The frozen trunk's output (as [`HydraOutput::trunk`]).
    pub(crate) trunk: Option<Tensor>,
}

/// What [`CausalLmWithHydraValueHead::forward_reference`] returns: the reference's logits and
/// the frozen trunk's output, without the policy's upper blocks, LM head or values.
#[derive(Debug)]
pub struct ReferenceOutput {
    /// Reference logits `[B, T, vocab]`, detached (as [`HydraOutput::ref_logits`]).
    pub ref_logits: Tensor,
    /// The frozen trunk's output `[B, T, hidden]`, detached (as [`HydraOutput::trunk`]);
    /// `None` for a full-copy or adapters-off reference.
    pub trunk: Option<Tensor>,
}

/// trlX's `GPTHydraHeadWithValueModel(config, num_layers_unfrozen)`: a policy with a value
/// head and a frozen reference (see the [module docs](self) for the `num_layers_unfrozen`
/// rules). The reference's parameters live in a store of their own, frozen as a whole.
///
/// As a [`TensorDictModule`] it writes logits, log-probs, values and the reference log-probs
/// ([`LlmKeys::ref_log_probs`]).
pub struct CausalLmWithHydraValueHead {
    policy: CausalLmWithValueHead,
    reference: Reference,
    ref_store: VarStore,
    num_layers_unfrozen: i64,
}

impl fmt::Debug for CausalLmWithHydraValueHead {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CausalLmWithHydraValueHead")
            .field("policy", &self.policy)
            .field("num_layers_unfrozen", &self.num_layers_unfrozen)
            .field(
                "reference_parameter_bytes",
                &self.reference_parameter_bytes(),
            )
            .finish()
    }
}

impl CausalLmWithHydraValueHead {
    /// A random policy under `path` with its reference (see [`Self::from_model`]).
    pub fn new(
        path: &Path<'_>,
        config: &dyn CausalLmConfig,
        num_layers_unfrozen: i64,
    ) -> Result<Self> {
        let model = config.build(path)?;
        Self::from_model(path, model, num_layers_unfrozen)
    }

    /// A value head under `path` on `model`, the reference taken from `model` as it is now,
    /// and the policy's frozen parts frozen: `k > 0` freezes the embeddings and blocks
    /// `0..L−k`, `k = 0` the embeddings and every block, `k = -1` nothing.
    pub fn from_model(
        path: &Path<'_>,
        model: impl Into<ModelBox>,
        num_layers_unfrozen: i64,
    ) -> Result<Self> {
        let ModelBox(model) = model.into();
        let n = model.n_layer() as i64;
        if !(-1..=n).contains(&num_layers_unfrozen) {
            return Err(Error::value(
                "CausalLmWithHydraValueHead::from_model",
                "num_layers_unfrozen",
                format!("-1 (train everything), 0 (freeze every block) or 1..={n}"),
                num_layers_unfrozen.to_string(),
            ));
        }
        match num_layers_unfrozen {
            -1 => {}
            0 => freeze(model.lower_trunk_parameters(model.n_layer()))?,
            k => freeze(model.lower_trunk_parameters(model.n_layer() - k as usize))?,
        }
        let mut ref_store = VarStore::new(model.device());
        // the branch / copy in the policy's dtype (a bf16 policy gets a bf16 reference)
        ref_store.set_kind(model.kind());
        let reference = match usize::try_from(num_layers_unfrozen) {
            Ok(k) if k > 0 => {
                Reference::Branch(ModelBranch::new(&ref_store.root(), model.as_ref(), k)?)
            }
            _ => Reference::Full(model.copy_to(&ref_store.root())?),
        };
        ref_store.freeze();
        Ok(CausalLmWithHydraValueHead {
            policy: CausalLmWithValueHead::from_model(path, ModelBox(model))?,
            reference,
            ref_store,
            num_layers_unfrozen,
        })
    }

    /// A value head under `path` on a `model` that carries LoRA adapters
    /// ([`lora::inject_adapter`](crate::modules::llm::lora::inject_adapter) or
    /// [`lora::load_adapter`](crate::modules::llm::lora::load_adapter)), whose reference is the
    /// same weights with the adapters off: TRL's and trlX's PEFT path, where no reference copy
    /// exists ([`Self::reference_parameter_bytes`] is 0). What trains is what the adapter
    /// injection left trainable (adapters, `modules_to_save`) and the value head;
    /// [`Self::num_layers_unfrozen`] reports -1.
    ///
    /// ```
    /// use tch::{nn::VarStore, Device, Tensor};
    /// use torchrl::modules::llm::lora::{inject_adapter, LoraConfig};
    /// use torchrl::modules::llm::{CausalLm, CausalLmConfig, CausalLmWithHydraValueHead, Gpt2Config, LmInput};
    /// # fn main() -> torchrl::Result<()> {
    /// tch::manual_seed(0);
    /// let vs = VarStore::new(Device::Cpu);
    /// let cfg = Gpt2Config::new(32).with_n_layer(2).with_n_embd(16).with_n_head(2).with_n_positions(16);
    /// let mut model = cfg.build(&vs.root())?;
    /// inject_adapter(model.as_mut(), &(vs.root() / "lora"), &LoraConfig::new(2))?;
    /// let hydra = CausalLmWithHydraValueHead::with_adapters_off_reference(&vs.root(), model)?;
    /// assert_eq!(hydra.reference_parameter_bytes(), 0);
    /// // move the adapters: the policy moves, the reference stays the base model
    /// for (_, b) in hydra.policy().model().adapter_parameters().into_iter().filter(|(n, _)| n.ends_with("lora_B.weight")) {
    ///     tch::no_grad(|| { let _ = b.shallow_clone().fill_(0.3); });
    /// }
    /// let ids = Tensor::from_slice(&[1i64, 5, 7]).view([1, 3]);
    /// let out = hydra.forward(&LmInput::new(&ids))?;
    /// assert!((&out.logits - &out.ref_logits).abs().max().double_value(&[]) > 1e-3);
    /// // the adapters are on again after the reference pass
    /// let again = hydra.policy().model().forward(&LmInput::new(&ids), None)?.logits()?;
    /// assert!((again - &out.logits).abs().max().double_value(&[]) < 1e-6);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// A model without adapters.
    pub fn with_adapters_off_reference(
        path: &Path<'_>,
        model: impl Into<ModelBox>,
    ) -> Result<Self> {
        let ModelBox(model) = model.into();
        let switch = lora_switch(model.as_ref()).ok_or_else(|| {
            Error::invalid(
                "CausalLmWithHydraValueHead::with_adapters_off_reference",
                "the model has no LoRA adapters (inject or load them first)",
            )
        })?;
        Ok(CausalLmWithHydraValueHead {
            policy: CausalLmWithValueHead::from_model(path, ModelBox(model))?,
            reference: Reference::AdaptersOff(switch),
            ref_store: VarStore::new(tch::Device::Cpu),
            num_layers_unfrozen: -1,
        })
    }

    /// Whether the reference is the policy with its adapters off.
    pub fn reference_is_adapters_off(&self) -> bool {
        matches!(self.reference, Reference::AdaptersOff(_))
    }

    /// Replaces the tensordict keys.
    pub fn with_keys(mut self, keys: LlmKeys) -> Self {
        self.policy.keys = keys;
        self
    }

    /// The policy (trunk and value head).
    pub fn policy(&self) -> &CausalLmWithValueHead {
        &self.policy
    }

    /// `num_layers_unfrozen` as given.
    pub fn num_layers_unfrozen(&self) -> i64 {
        self.num_layers_unfrozen
    }

    /// The store holding the reference's (frozen) parameters.
    pub fn reference_store(&self) -> &VarStore {
        &self.ref_store
    }

    /// Bytes of parameters the reference holds of its own (a branch: `k` blocks and `ln_f`,
    /// its LM head being the policy's frozen embedding; a full copy: the whole model).
    pub fn reference_parameter_bytes(&self) -> i64 {
        match &self.reference {
            Reference::Branch(b) => parameter_bytes(b.parameters()),
            Reference::Full(m) => parameter_bytes(m.named_parameters().into_iter().map(|(_, p)| p)),
            Reference::AdaptersOff(_) => 0,
        }
    }

    /// Bytes of parameters a full reference copy of the trunk holds (for comparison).
    pub fn full_copy_parameter_bytes(&self) -> i64 {
        parameter_bytes(
            self.policy
                .model()
                .named_parameters()
                .into_iter()
                .map(|(_, p)| p),
        )
    }

    /// The policy parameters that train (`requires_grad`): what an optimizer should step.
    pub fn trainable_parameters(&self) -> Vec<Tensor> {
        let mut out: Vec<Tensor> = self
            .policy
            .model()
            .named_parameters()
            .into_iter()
            .chain(self.policy.model().adapter_parameters())
            .map(|(_, p)| p)
            .chain(self.policy.v_head().parameters())
            .filter(|p| p.requires_grad())
            .map(|p| p.shallow_clone())
            .collect();
        out.shrink_to_fit();
        out
    }

    /// Policy logits, values and reference logits; the shared trunk runs once.
    pub fn forward(&self, input: &LmInput<'_>) -> Result<HydraOutput> {
        let model = self.policy.model();
        let capture = match &self.reference {
            Reference::Branch(b) => Some(b.start_block()),
            Reference::Full(_) | Reference::AdaptersOff(_) => None,
        };
        let out = model.forward_with(
            input,
            None,
            ForwardOptions {
                logits: true,
                capture_block_input: capture,
            },
        )?;
        let branch_input = out.block_input.as_ref().map(|h| h.shallow_clone());
        let trunk = match &branch_input {
            Some(h) => Some(h.f_detach()?),
            None => None,
        };
        let ref_logits = self.reference_logits(input, branch_input, 0)?;
        let policy = self.policy.finish(out)?;
        Ok(HydraOutput {
            logits: policy.logits,
            values: policy.values,
            ref_logits,
            trunk,
        })
    }

    /// Where the frozen trunk ends: the first trainable policy block (`n_layer −
    /// num_layers_unfrozen`), whose input [`HydraOutput::trunk`] is; `None` for a full-copy
    /// reference.
    pub fn frozen_trunk_end(&self) -> Option<usize> {
        match &self.reference {
            Reference::Branch(b) => Some(b.start_block()),
            Reference::Full(_) | Reference::AdaptersOff(_) => None,
        }
    }

    /// The reference logits only (trlX's `forward_hydra`), as
    /// [`forward_reference`](Self::forward_reference) computes them.
    pub fn forward_hydra(&self, input: &LmInput<'_>) -> Result<Tensor> {
        Ok(self.forward_reference(input)?.ref_logits)
    }

    /// What [`forward`](Self::forward) gives of the reference, without the policy's own
    /// output: the reference logits and the frozen trunk's output, equal to `forward`'s
    /// (the same kernels on the same inputs), computed without gradient. A hydra branch runs the shared trunk up to
    /// [`frozen_trunk_end`](Self::frozen_trunk_end) ([`CausalLm::forward_to_block`]) and its
    /// own copy of the top blocks, skipping the policy's upper blocks, LM head and value head;
    /// a full-copy or adapters-off reference runs the reference alone. For a caller that has
    /// the policy's log-probs already (a rollout's sampler, when they are the model's:
    /// [`GenerationConfig::log_probs_are_the_models`](crate::modules::llm::GenerationConfig::log_probs_are_the_models))
    /// and needs no values.
    ///
    /// ```
    /// use tch::{nn::VarStore, Device, Tensor};
    /// use torchrl::modules::llm::{CausalLmWithHydraValueHead, Gpt2Config, LmInput};
    /// # fn main() -> torchrl::Result<()> {
    /// tch::manual_seed(0);
    /// let vs = VarStore::new(Device::Cpu);
    /// let cfg = Gpt2Config::new(32).with_n_layer(3).with_n_embd(16).with_n_head(2).with_n_positions(16);
    /// let hydra = CausalLmWithHydraValueHead::new(&vs.root(), &cfg, 1)?;
    /// let ids = Tensor::from_slice(&[1i64, 5, 7, 2]).view([1, 4]);
    /// let input = LmInput::new(&ids);
    /// let (full, reference) = (hydra.forward(&input)?, hydra.forward_reference(&input)?);
    /// assert!(reference.ref_logits.equal(&full.ref_logits));
    /// assert!(reference.trunk.unwrap().equal(&full.trunk.unwrap()));
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`forward`](Self::forward).
    pub fn forward_reference(&self, input: &LmInput<'_>) -> Result<ReferenceOutput> {
        self.forward_reference_from(input, 0, None)
    }

    /// [`forward_reference`](Self::forward_reference) with the reference's LM head on
    /// positions `start..` only (`ref_logits` `[B, T − start, vocab]`).
    /// `trunk`: the branch's input when already computed (else the trunk runs here).
    fn forward_reference_from(
        &self,
        input: &LmInput<'_>,
        start: i64,
        trunk: Option<Tensor>,
    ) -> Result<ReferenceOutput> {
        // every output is detached: record no graph
        let _guard = tch::no_grad_guard();
        match &self.reference {
            Reference::Branch(b) => {
                let h = match trunk {
                    Some(h) => h,
                    None => self
                        .policy
                        .model()
                        .forward_to_block(input, b.start_block())?,
                };
                let trunk = h.f_detach()?;
                let ref_logits = self.reference_logits(input, Some(h), start)?;
                Ok(ReferenceOutput {
                    ref_logits,
                    trunk: Some(trunk),
                })
            }
            Reference::Full(_) | Reference::AdaptersOff(_) => Ok(ReferenceOutput {
                ref_logits: self.reference_logits(input, None, start)?,
                trunk: None,
            }),
        }
    }

    /// The scores a rollout stores, from one pass (no gradient): the reference's log-probs
    /// and, with `policy`, the policy's log-probs and values (`align_values_to_tokens`'
    /// layout), as [`ScoreTokens`](crate::modules::llm::ScoreTokens) lays them out, with
    /// every LM head run only from [`ScoreRequest::scored_from`] = `scored_from` on (the
    /// log-probs before it are 0; the values cover every position); the frozen trunk's output
    /// as [`forward`](Self::forward) gives it.
    ///
    /// `trunk`: the frozen trunk's output over `tokens` already computed (the rollout's
    /// generation kept it: [`GenerateOptions::capture_block_input`](crate::modules::llm::GenerateOptions::capture_block_input)
    /// at [`frozen_trunk_end`](Self::frozen_trunk_end)); the pass then starts above it, and
    /// it is the returned trunk. Ignored without a hydra branch.
    pub(crate) fn rollout_scores(
        &self,
        tokens: &Tensor,
        mask: &Tensor,
        scored_from: i64,
        policy: bool,
        trunk: Option<&Tensor>,
    ) -> Result<RolloutScores> {
        let _guard = tch::no_grad_guard();
        let input = LmInput::new(tokens).with_attention_mask(mask);
        let start = head_start(scored_from, tokens.size().get(1).copied().unwrap_or(0));
        let log_probs = |logits: &Tensor, values: Option<&Tensor>, request: ScoreRequest| {
            scores_from_head(logits, start, values, tokens, mask, request)
        };
        let trunk = match (trunk, self.frozen_trunk_end()) {
            (Some(h), Some(end)) => {
                let device = self.policy.model().device();
                Some((h.f_detach()?.f_to_device(device)?, end))
            }
            _ => None,
        };
        if !policy {
            let given = trunk.map(|(h, _)| h);
            let out = self.forward_reference_from(&input, start, given)?;
            return Ok(RolloutScores {
                log_probs: None,
                values: None,
                ref_log_probs: log_probs(&out.ref_logits, None, ScoreRequest::log_probs())?
                    .log_probs,
                trunk: out.trunk,
            });
        }
        let model = self.policy.model();
        let (last_hidden, block_input) = match trunk {
            Some((h, end)) => {
                let hidden_size = model.facts().hidden_size;
                let last = run_from_block(hidden_size, model.decoder(), &h, end, Some(mask))?;
                (last, Some(h))
            }
            None => {
                let out = model.forward_with(
                    &input,
                    None,
                    ForwardOptions {
                        logits: false,
                        capture_block_input: self.frozen_trunk_end(),
                    },
                )?;
                (out.last_hidden, out.block_input)
            }
        };
        let trunk = match &block_input {
            Some(h) => Some(h.f_detach()?),
            None => None,
        };
        let ref_logits = self.reference_logits(&input, block_input, start)?;
        let values = self.policy.values_from_hidden(&last_hidden)?;
        let scores = scores_from_hidden(
            model,
            &last_hidden,
            Some(&values),
            tokens,
            mask,
            ScoreRequest::values().scored_from(scored_from),
        )?;
        Ok(RolloutScores {
            log_probs: Some(scores.log_probs),
            values: scores.values,
            ref_log_probs: log_probs(&ref_logits, None, ScoreRequest::log_probs())?.log_probs,
            trunk,
        })
    }

    /// The reference's logits, its LM head on positions `start..` (0: all).
    fn reference_logits(
        &self,
        input: &LmInput<'_>,
        branch_input: Option<Tensor>,
        start: i64,
    ) -> Result<Tensor> {
        let _guard = tch::no_grad_guard();
        let logits = match (&self.reference, branch_input) {
            (Reference::Branch(b), Some(h)) => {
                b.forward_from(&h.f_detach()?, input.attention_mask, start)?
            }
            (Reference::Full(m), _) if start > 0 => {
                let h = m.forward_with(input, None, TRUNK_ONLY)?.last_hidden;
                lm_head_from(m.as_ref(), &h, start)?
            }
            (Reference::Full(m), _) => m.forward(input, None)?.logits()?,
            // the LM head inside the switch too: an adapter may sit on it
            (Reference::AdaptersOff(switch), _) if start > 0 => switch.disabled(|| {
                let model = self.policy.model();
                let h = model.forward_with(input, None, TRUNK_ONLY)?.last_hidden;
                lm_head_from(model, &h, start)
            })?,
            (Reference::AdaptersOff(switch), _) => switch
                .disabled(|| self.policy.model().forward(input, None))?
                .logits()?,
            (Reference::Branch(_), None) => {
                return Err(Error::invalid(
                    "CausalLmWithHydraValueHead",
                    "the trunk did not return the branch's input",
                ))
            }
        };
        Ok(logits)
    }
}

impl TensorDictModule for CausalLmWithHydraValueHead {
    fn in_keys(&self) -> Vec<NestedKey> {
        self.policy.in_keys()
    }

    fn out_keys(&self) -> Vec<NestedKey> {
        let mut keys = self.policy.out_keys();
        keys.push(self.policy.keys.ref_log_probs.clone());
        keys
    }

    fn forward(&self, mut td: TensorDict) -> Result<TensorDict> {
        let keys = &self.policy.keys;
        let (ids, mask) = read_tokens(&td, keys)?;
        let out = CausalLmWithHydraValueHead::forward(
            self,
            &LmInput::new(ids).with_attention_mask(mask),
        )?;
        let lp = token_log_probs(&out.logits, ids, Some(mask))?;
        let ref_lp = token_log_probs(&out.ref_logits, ids, Some(mask))?;
        td.set(&keys.logits, out.logits)?;
        td.set(&keys.log_probs, lp)?;
        td.set(&keys.values, out.values)?;
        td.set(&keys.ref_log_probs, ref_lp)?;
        Ok(td)
    }
}

#[cfg(test)]
mod tests {
    use tch::nn::VarStore;
    use tch::{Device, Kind, Tensor};

    use super::CausalLmWithHydraValueHead;
    use crate::modules::llm::lora::inject_adapter;
    use crate::modules::llm::{
        align_values_to_tokens, token_log_probs, CausalLmConfig, Gpt2Config, LmInput, LoraConfig,
    };

    fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
        (a - b).abs().max().double_value(&[])
    }

    /// `narrow` equals `full` from `from` on (to 1e-6) and is 0 before.
    fn check(name: &str, narrow: &Tensor, full: &Tensor, from: i64) {
        let t = full.size()[1];
        assert_eq!(narrow.size(), full.size(), "{name}");
        let d = max_diff(
            &narrow.narrow(1, from, t - from),
            &full.narrow(1, from, t - from),
        );
        assert!(d <= 1e-6, "{name}: positions {from}.. differ by {d}");
        let head = narrow
            .narrow(1, 0, from)
            .abs()
            .sum(Kind::Double)
            .double_value(&[]);
        assert_eq!(head, 0.0, "{name}: the prompt's log-probs are not 0");
    }

    #[test]
    fn rollout_scores_equal_a_full_forward_on_the_response() {
        tch::manual_seed(4);
        let cfg = Gpt2Config::new(40)
            .with_n_layer(3)
            .with_n_embd(16)
            .with_n_head(2)
            .with_n_positions(16);
        let vs = VarStore::new(Device::Cpu);
        let branch = CausalLmWithHydraValueHead::new(&(vs.root() / "b"), &cfg, 1).unwrap();
        let full_copy = CausalLmWithHydraValueHead::new(&(vs.root() / "f"), &cfg, -1).unwrap();
        let mut model = cfg.build(&(vs.root() / "l")).unwrap();
        inject_adapter(model.as_mut(), &(vs.root() / "lora"), &LoraConfig::new(2)).unwrap();
        let adapters =
            CausalLmWithHydraValueHead::with_adapters_off_reference(&(vs.root() / "l"), model)
                .unwrap();
        // move every trained parameter, so that no policy is its reference
        tch::no_grad(|| {
            for p in vs.trainable_variables() {
                let _ = p.shallow_clone().g_add_(&(p.randn_like() * 0.2));
            }
        });
        // a left-padded prompt of 4, a response of 5 (the second row right-padded)
        let tokens = Tensor::from_slice(&[
            0i64, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 0,
        ])
        .view([2, 9]);
        let mask = Tensor::from_slice(&[0i64, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0])
            .view([2, 9]);
        let input = LmInput::new(&tokens).with_attention_mask(&mask);
        for (name, m) in [
            ("branch", &branch),
            ("full copy", &full_copy),
            ("adapters off", &adapters),
        ] {
            let full = tch::no_grad(|| m.forward(&input)).unwrap();
            let lp = token_log_probs(&full.logits, &tokens, Some(&mask)).unwrap();
            let ref_lp = token_log_probs(&full.ref_logits, &tokens, Some(&mask)).unwrap();
            assert!(
                max_diff(&lp, &ref_lp) > 1e-4,
                "{name}: the policy is its reference"
            );
            let s = m.rollout_scores(&tokens, &mask, 4, true, None).unwrap();
            check(
                &format!("{name}: policy"),
                s.log_probs.as_ref().unwrap(),
                &lp,
                4,
            );
            check(&format!("{name}: reference"), &s.ref_log_probs, &ref_lp, 4);
            let values = align_values_to_tokens(&full.values).unwrap();
            assert_eq!(max_diff(s.values.as_ref().unwrap(), &values), 0.0, "{name}");
            assert_eq!(s.trunk.is_some(), full.trunk.is_some(), "{name}: trunk");
            if let (Some(a), Some(b)) = (&s.trunk, &full.trunk) {
                assert_eq!(max_diff(a, b), 0.0, "{name}: trunk");
            }
            // the reference's side alone
            let r = m.rollout_scores(&tokens, &mask, 4, false, None).unwrap();
            assert!(r.log_probs.is_none() && r.values.is_none());
            check(
                &format!("{name}: reference alone"),
                &r.ref_log_probs,
                &ref_lp,
                4,
            );
            // from 0: every position, bitwise a full forward's
            let all = m.rollout_scores(&tokens, &mask, 0, true, None).unwrap();
            assert!(all.log_probs.unwrap().equal(&lp), "{name}");
            assert!(all.ref_log_probs.equal(&ref_lp), "{name}");
            // started from a trunk computed elsewhere: the same kernels above it, so bitwise
            // the same scores; a perturbed trunk moves them (the trunk is really read: not by
            // a constant, which GPT-2's layer norms remove);
            // without a branch the trunk is ignored
            if let Some(trunk) = &full.trunk {
                for policy in [true, false] {
                    let a = m.rollout_scores(&tokens, &mask, 4, policy, None).unwrap();
                    let b = m
                        .rollout_scores(&tokens, &mask, 4, policy, Some(trunk))
                        .unwrap();
                    assert!(a.ref_log_probs.equal(&b.ref_log_probs), "{name}");
                    assert_eq!(a.log_probs.is_some(), b.log_probs.is_some());
                    if let (Some(x), Some(y)) = (&a.log_probs, &b.log_probs) {
                        assert!(x.equal(y), "{name}: policy from the trunk");
                        let (v, w) = (a.values.as_ref().unwrap(), b.values.as_ref().unwrap());
                        assert!(v.equal(w), "{name}: values from the trunk");
                    }
                    let moved = trunk + trunk.randn_like() * 0.5;
                    let c = m
                        .rollout_scores(&tokens, &mask, 4, policy, Some(&moved))
                        .unwrap();
                    assert!(
                        max_diff(&c.ref_log_probs, &a.ref_log_probs) > 1e-4,
                        "{name}"
                    );
                    assert!(c.trunk.unwrap().equal(&moved), "{name}");
                }
            } else {
                let other = Tensor::zeros([2, 9, 16], (Kind::Float, Device::Cpu));
                let c = m
                    .rollout_scores(&tokens, &mask, 4, true, Some(&other))
                    .unwrap();
                check(
                    &format!("{name}: trunk ignored"),
                    &c.ref_log_probs,
                    &ref_lp,
                    4,
                );
            }
        }
    }
}
