//! [`hydra_policy`]: the policy PPO-RLHF, GRPO and DPO train, built from a model and the
//! trainer config's `model` section: LoRA adapters when `peft_config` is set, and the
//! reference `reference` chooses (adapters off by default with LoRA, trlX's hydra branch
//! otherwise), and gradient checkpointing when `gradient_checkpointing` is on.
//!
//! ```
//! use tch::{nn::VarStore, Device};
//! use torchrl::modules::llm::{CausalLm, CausalLmConfig, Gpt2Config, LoraConfig};
//! use torchrl::trainers::config::{ModelConfig, ReferenceModel};
//! use torchrl::trainers::policy::hydra_policy;
//! # fn main() -> torchrl::Result<()> {
//! let cfg = Gpt2Config::new(32).with_n_layer(2).with_n_embd(16).with_n_head(2).with_n_positions(16);
//! // without peft_config: trlX's hydra (the top num_layers_unfrozen blocks train)
//! let vs = VarStore::new(Device::Cpu);
//! let mut model_cfg = ModelConfig::default();
//! model_cfg.num_layers_unfrozen = 1;
//! let hydra = hydra_policy(&vs.root(), cfg.build(&vs.root())?, &model_cfg)?;
//! assert!(!hydra.reference_is_adapters_off() && hydra.reference_parameter_bytes() > 0);
//! // with LoRA: the adapters train and the reference is the base model (no copy)
//! let vs = VarStore::new(Device::Cpu);
//! model_cfg.peft_config = Some(LoraConfig::new(4).with_all_linear());
//! let lora = hydra_policy(&vs.root(), cfg.build(&vs.root())?, &model_cfg)?;
//! assert!(lora.reference_is_adapters_off());
//! assert_eq!(lora.reference_parameter_bytes(), 0);
//! // trainable: 2 blocks × 4 layers × (A, B), and the value head's 4 tensors
//! assert_eq!(lora.trainable_parameters().len(), 16 + 4);
//! # let _ = ReferenceModel::Auto;
//! # Ok(()) }
//! ```

use tch::nn::Path;

use super::config::{ModelConfig, ReferenceModel};
use crate::error::{Error, Result};
use crate::modules::llm::lora::inject_adapter;
use crate::modules::llm::{CausalLmWithHydraValueHead, ModelBox};

/// A value head and a reference on `model` (variables under `path`; adapters under
/// `path / "lora"`), as `config` says. See the [module docs](self).
///
/// # Errors
/// An invalid `peft_config` (or a target the model lacks), `reference = "adapters_off"`
/// without `peft_config`, or a `num_layers_unfrozen` the model's depth refuses.
pub fn hydra_policy(
    path: &Path<'_>,
    model: impl Into<ModelBox>,
    config: &ModelConfig,
) -> Result<CausalLmWithHydraValueHead> {
    const OP: &str = "trainers::hydra_policy";
    let ModelBox(mut model) = model.into();
    if config.gradient_checkpointing {
        model.gradient_checkpointing_enable();
    }
    match (&config.peft_config, config.reference) {
        (None, ReferenceModel::AdaptersOff) => Err(Error::config(
            OP,
            "model.reference",
            "\"adapters_off\" only with a model.peft_config",
            "\"adapters_off\" without peft_config",
        )),
        (None, _) => CausalLmWithHydraValueHead::from_model(
            path,
            ModelBox(model),
            config.num_layers_unfrozen,
        ),
        (Some(peft), ReferenceModel::Auto | ReferenceModel::AdaptersOff) => {
            inject_adapter(model.as_mut(), &(path / "lora"), peft)?;
            CausalLmWithHydraValueHead::with_adapters_off_reference(path, ModelBox(model))
        }
        (Some(peft), ReferenceModel::Hydra) => {
            if config.num_layers_unfrozen != -1 {
                return Err(Error::config(
                    OP,
                    "model.num_layers_unfrozen",
                    "-1 with peft_config and reference = \"hydra\" (a full frozen copy)",
                    config.num_layers_unfrozen,
                ));
            }
            inject_adapter(model.as_mut(), &(path / "lora"), peft)?;
            CausalLmWithHydraValueHead::from_model(path, ModelBox(model), -1)
        }
    }
}
