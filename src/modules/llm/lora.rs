//! LoRA adapters on any [`CausalLm`], as PEFT makes, saves and loads them.
//!
//! - [`LoraConfig`]: PEFT's `LoraConfig` fields (`r`, `lora_alpha`, `lora_dropout`,
//!   `target_modules` by module name or `"all-linear"`, `use_rslora`, `modules_to_save`), read
//!   from and written to `adapter_config.json`;
//! - [`inject_adapter`]: adds an adapter to every targeted linear layer of the blocks (PEFT's
//!   `inject_adapter_in_model`) and freezes the base model (except `modules_to_save`): only
//!   adapters, the heads put on top and `modules_to_save` train;
//! - [`save_adapter`] / [`load_adapter`]: `adapter_config.json` + `adapter_model.safetensors`
//!   with PEFT's tensor names (`base_model.model.<module>.lora_A.weight`), so an adapter trained
//!   here loads in PEFT and one from PEFT loads here;
//! - [`merge_and_unload`]: folds every adapter into its base weight, leaving a plain model whose
//!   [`CausalLm::save_pretrained`] writes a Hugging Face checkpoint;
//! - [`lora_switch`]: the model's [`LoraSwitch`]: adapters off gives the base model (the
//!   reference of TRL's PEFT path; see
//!   [`CausalLmWithHydraValueHead::with_adapters_off_reference`](crate::modules::llm::CausalLmWithHydraValueHead::with_adapters_off_reference)).
//!
//! Matching follows PEFT: a name in `target_modules` matches a module whose full name is that
//! name or ends with `.` + name; a single string other than `"all-linear"` is a regular
//! expression that must match the whole module name; `"all-linear"` is every linear layer of the
//! blocks (the LM head is never targeted). With no `target_modules`, PEFT's default for the
//! architecture applies (`q_proj` / `v_proj`; GPT-2's `c_attn`). A target that matches no layer
//! is an error that lists the layers there are.
//!
//! ```
//! use tch::{nn::VarStore, Device, Tensor};
//! use torchrl::modules::llm::lora::{inject_adapter, lora_switch, LoraConfig};
//! use torchrl::modules::llm::{CausalLm, CausalLmConfig, Gpt2Config, LmInput};
//! # fn main() -> torchrl::Result<()> {
//! tch::manual_seed(0);
//! let vs = VarStore::new(Device::Cpu);
//! let cfg = Gpt2Config::new(32).with_n_layer(2).with_n_embd(16).with_n_head(2).with_n_positions(16);
//! let mut model = cfg.build(&vs.root())?;
//! let ids = Tensor::from_slice(&[1i64, 5, 7]).view([1, 3]);
//! let before = model.forward(&LmInput::new(&ids), None)?.logits()?;
//! let lora = LoraConfig::new(4).with_lora_alpha(8.0).with_all_linear();
//! inject_adapter(model.as_mut(), &(vs.root() / "lora"), &lora)?;
//! // 2 blocks × 4 layers (c_attn, attn.c_proj, c_fc, mlp.c_proj), each with A and B
//! let adapters = model.adapter_parameters();
//! assert_eq!(adapters.len(), 16);
//! assert_eq!(adapters[0].0, "transformer.h.0.attn.c_attn.lora_A.weight");
//! // the base is frozen, the adapters train
//! assert!(model.named_parameters().iter().all(|(_, p)| !p.requires_grad()));
//! assert!(adapters.iter().all(|(_, p)| p.requires_grad()));
//! // B starts at zero: the logits are unchanged until it trains
//! let after = model.forward(&LmInput::new(&ids), None)?.logits()?;
//! assert!((after - &before).abs().max().double_value(&[]) < 1e-6);
//! assert!(lora_switch(model.as_ref()).is_some());
//! // a module the model does not have is named
//! let bad = LoraConfig::new(4).with_target_modules(&["q_proj"]);
//! let mut other = cfg.build(&(vs.root() / "other"))?;
//! let err = inject_adapter(other.as_mut(), &(vs.root() / "lora2"), &bad).unwrap_err();
//! assert!(err.to_string().contains("q_proj"), "{err}");
//! # Ok(()) }
//! ```

use std::collections::BTreeMap;
use std::path::Path as FsPath;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use tch::nn::Path;
use tch::Tensor;

use super::causal_lm::CausalLm;
use super::nn::LoraSwitch;
use super::weights;
use crate::error::{Error, Result};
use crate::macros::setters;

/// The adapter's config file in a PEFT folder.
pub const ADAPTER_CONFIG_FILE: &str = "adapter_config.json";
/// The adapter's weights file in a PEFT folder.
pub const ADAPTER_WEIGHTS_FILE: &str = "adapter_model.safetensors";
/// The prefix PEFT puts before a module's name in its tensor names (`PeftModel.base_model`
/// = `LoraModel`, whose `model` is the causal LM).
pub const PEFT_PREFIX: &str = "base_model.model.";

/// PEFT's `target_modules`: module names (matched as names or name suffixes) or one string
/// (`"all-linear"`, or a regular expression matched against whole module names).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum TargetModules {
    /// Names: a module matches when its full name is one of them or ends with `.` + one.
    Names(Vec<String>),
    /// `"all-linear"`, or a regular expression.
    Pattern(String),
}

/// PEFT's `LoraConfig`. See the [module docs](self).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoraConfig {
    /// Always `"LORA"`.
    #[serde(default = "lora_type")]
    pub peft_type: String,
    /// The rank (PEFT's default 8).
    #[serde(default = "default_r")]
    pub r: i64,
    /// The scale numerator: scaling = `lora_alpha / r` (`/ √r` with rsLoRA); PEFT's default 8.
    #[serde(default = "default_alpha")]
    pub lora_alpha: f64,
    /// Dropout on the adapter's input while training (PEFT's default 0).
    #[serde(default)]
    pub lora_dropout: f64,
    /// Which layers get adapters; `None`: PEFT's default for the architecture.
    #[serde(default)]
    pub target_modules: Option<TargetModules>,
    /// rsLoRA: scaling `lora_alpha / √r`.
    #[serde(default)]
    pub use_rslora: bool,
    /// Modules of the base model that train in full and are saved with the adapter
    /// (`"lm_head"`, `"embed_tokens"`, …, matched as `target_modules` names).
    #[serde(default)]
    pub modules_to_save: Option<Vec<String>>,
    /// Whether the base weights are stored `[in, out]` (GPT-2's `Conv1D`): written as PEFT
    /// sets it; the layers know their layout, so it is not read.
    #[serde(default)]
    pub fan_in_fan_out: bool,
    /// Only `"none"` (no bias trains).
    #[serde(default = "default_bias")]
    pub bias: String,
    /// PEFT's `task_type` (`"CAUSAL_LM"`, `"SEQ_CLS"`, …), kept as given.
    #[serde(default)]
    pub task_type: Option<String>,
    /// Where the base model came from, kept as given.
    #[serde(default)]
    pub base_model_name_or_path: Option<String>,
    /// PEFT's init switch: only `true` (A Kaiming-uniform, B zero) is implemented for new
    /// adapters; a loaded adapter's values replace the init whatever it says.
    #[serde(default = "default_init")]
    pub init_lora_weights: Value,
    /// Every other field of the file. Fields we do not implement are refused when set to
    /// anything but their default (see [`LoraConfig::validate`]).
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

fn lora_type() -> String {
    "LORA".into()
}
fn default_r() -> i64 {
    8
}
fn default_alpha() -> f64 {
    8.0
}
fn default_bias() -> String {
    "none".into()
}
fn default_init() -> Value {
    Value::Bool(true)
}

/// Fields of PEFT's `LoraConfig` that change what the adapter computes and are not
/// implemented here, with the values that mean "off".
const UNSUPPORTED: &[(&str, &str)] = &[
    ("use_dora", "false"),
    ("rank_pattern", "{}"),
    ("alpha_pattern", "{}"),
    ("layers_to_transform", "null"),
    ("layers_pattern", "null"),
    ("lora_bias", "false"),
    ("exclude_modules", "null"),
    ("layer_replication", "null"),
    ("target_parameters", "null"),
    ("trainable_token_indices", "null"),
    ("megatron_config", "null"),
    ("loftq_config", "{}"),
    ("eva_config", "null"),
    ("corda_config", "null"),
    ("use_qalora", "false"),
    ("alora_invocation_tokens", "null"),
    ("arrow_config", "null"),
    ("use_bdlora", "null"),
    ("kasa_config", "null"),
    ("velora_config", "null"),
    ("monteclora_config", "null"),
    ("lora_ga_config", "null"),
];

/// Fields PEFT writes that do not change the computation.
const INERT: &[&str] = &[
    "auto_mapping",
    "revision",
    "peft_version",
    "inference_mode",
    "megatron_core",
    "qalora_group_size",
    "ensure_weight_tying",
];

/// Whether `v` is a value that leaves a feature off (`null`, `false`, `{}`, `[]`).
fn is_off(v: &Value) -> bool {
    match v {
        Value::Null | Value::Bool(false) => true,
        Value::Object(m) => m.is_empty(),
        Value::Array(a) => a.is_empty(),
        _ => false,
    }
}

impl LoraConfig {
    /// Rank `r`, PEFT's defaults otherwise (`lora_alpha` 8, no dropout, the architecture's
    /// default targets).
    pub fn new(r: i64) -> Self {
        LoraConfig {
            peft_type: lora_type(),
            r,
            lora_alpha: default_alpha(),
            lora_dropout: 0.0,
            target_modules: None,
            use_rslora: false,
            modules_to_save: None,
            fan_in_fan_out: false,
            bias: default_bias(),
            task_type: None,
            base_model_name_or_path: None,
            init_lora_weights: default_init(),
            extra: Map::new(),
        }
    }

    setters! {
        /// Sets `lora_alpha`.
        with_lora_alpha(lora_alpha: f64);
        /// Sets `lora_dropout`.
        with_lora_dropout(lora_dropout: f64);
        /// Sets `use_rslora`.
        with_use_rslora(use_rslora: bool);
    }

    /// Targets these module names.
    pub fn with_target_modules(mut self, names: &[&str]) -> Self {
        self.target_modules = Some(TargetModules::Names(
            names.iter().map(|s| s.to_string()).collect(),
        ));
        self
    }

    /// Targets every linear layer of the blocks (`"all-linear"`).
    pub fn with_all_linear(mut self) -> Self {
        self.target_modules = Some(TargetModules::Pattern("all-linear".into()));
        self
    }

    /// Trains and saves these base modules in full.
    pub fn with_modules_to_save(mut self, names: &[&str]) -> Self {
        self.modules_to_save = Some(names.iter().map(|s| s.to_string()).collect());
        self
    }

    /// The factor on `B A x`: `lora_alpha / r`, or `lora_alpha / √r` with rsLoRA.
    pub fn scaling(&self) -> f64 {
        let r = self.r.max(1) as f64;
        if self.use_rslora {
            self.lora_alpha / r.sqrt()
        } else {
            self.lora_alpha / r
        }
    }

    /// Checks the config: `peft_type` LORA, `r` ≥ 1, a finite `lora_alpha`, dropout in
    /// `[0, 1)`, `bias = "none"`, and every field we do not implement off.
    ///
    /// # Errors
    /// The first field that is not accepted, by name.
    pub fn validate(&self) -> Result<()> {
        let op = "LoraConfig::validate";
        if self.peft_type != "LORA" {
            return Err(Error::config(
                op,
                "peft_type",
                "\"LORA\" (the only PEFT method implemented)",
                format!("{:?}", self.peft_type),
            ));
        }
        super::nn::lora::check_hyper(self.r, self.scaling(), self.lora_dropout)?;
        if self.bias != "none" {
            return Err(Error::config(
                op,
                "bias",
                "\"none\" (training biases with LoRA is not implemented)",
                format!("{:?}", self.bias),
            ));
        }
        if let Some(TargetModules::Names(n)) = &self.target_modules {
            if n.is_empty() {
                return Err(Error::config(
                    op,
                    "target_modules",
                    "at least one module name",
                    "[]",
                ));
            }
        }
        for (field, off) in UNSUPPORTED {
            if let Some(v) = self.extra.get(*field) {
                if !is_off(v) {
                    return Err(Error::value(
                        op,
                        field,
                        format!("{off} ({field} is not implemented)"),
                        v.to_string(),
                    ));
                }
            }
        }
        for (field, v) in &self.extra {
            let known =
                INERT.contains(&field.as_str()) || UNSUPPORTED.iter().any(|(f, _)| f == field);
            if !known && !is_off(v) {
                return Err(Error::value(
                    op,
                    field,
                    "a field this LoRA implementation knows (or one that is null / false / empty)",
                    v.to_string(),
                ));
            }
        }
        Ok(())
    }

    /// Reads and validates an `adapter_config.json`.
    ///
    /// # Errors
    /// An unreadable file, JSON that is not a LoRA config (the field named), or a config
    /// [`LoraConfig::validate`] refuses; every error names the file.
    pub fn from_json_file(path: impl AsRef<FsPath>) -> Result<Self> {
        let (op, path) = ("LoraConfig::from_json_file", path.as_ref());
        let cfg: LoraConfig = weights::read_config(op, path, "PEFT adapter")?;
        cfg.validate().map_err(|e| Error::InvalidFile {
            op,
            path: path.display().to_string(),
            reason: e.to_string(),
        })?;
        Ok(cfg)
    }

    /// The config as PEFT writes `adapter_config.json` (pretty JSON).
    ///
    /// # Errors
    /// When it cannot be serialised.
    pub fn to_json(&self) -> Result<String> {
        let mut value = serde_json::to_value(self)
            .map_err(|e| Error::invalid("LoraConfig::to_json", format!("serialisation: {e}")))?;
        if let Value::Object(map) = &mut value {
            // PEFT types lora_alpha as an int: an integral value is written as one
            if self.lora_alpha.fract() == 0.0 && self.lora_alpha.abs() < 1e15 {
                map.insert("lora_alpha".into(), Value::from(self.lora_alpha as i64));
            }
            // the fields PEFT reads without a default, off
            for (field, off) in UNSUPPORTED.iter().take(5) {
                map.entry(field.to_string())
                    .or_insert_with(|| serde_json::from_str(off).unwrap_or(Value::Null));
            }
        }
        serde_json::to_string_pretty(&value)
            .map_err(|e| Error::invalid("LoraConfig::to_json", format!("serialisation: {e}")))
    }
}

/// PEFT's default targets for a `model_type` (`TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING`).
fn default_targets(model_type: &str) -> Option<Vec<String>> {
    let names: &[&str] = match model_type {
        "llama" | "mistral" | "qwen2" | "qwen3" => &["q_proj", "v_proj"],
        "gpt2" => &["c_attn"],
        _ => return None,
    };
    Some(names.iter().map(|s| s.to_string()).collect())
}

/// How a module name is matched.
enum Matcher {
    All,
    Names(Vec<String>),
    Regex(regex::Regex, String),
}

impl Matcher {
    fn new(
        op: &'static str,
        model: &dyn CausalLm,
        targets: &Option<TargetModules>,
    ) -> Result<Self> {
        match targets {
            None => {
                let model_type = &model.facts().model_type;
                default_targets(model_type)
                    .map(Matcher::Names)
                    .ok_or_else(|| {
                        Error::config(
                            op,
                            "target_modules",
                            "module names (no PEFT default is known for this model_type)",
                            model_type,
                        )
                    })
            }
            Some(TargetModules::Names(n)) => Ok(Matcher::Names(n.clone())),
            Some(TargetModules::Pattern(p)) if p == "all-linear" => Ok(Matcher::All),
            Some(TargetModules::Pattern(p)) => {
                let re = regex::Regex::new(&format!("^(?:{p})$")).map_err(|e| {
                    Error::config(op, "target_modules", "a valid regular expression", e)
                })?;
                Ok(Matcher::Regex(re, p.clone()))
            }
        }
    }

    fn matches(&self, module: &str) -> bool {
        match self {
            Matcher::All => true,
            Matcher::Names(n) => n.iter().any(|t| name_matches(module, t)),
            Matcher::Regex(re, _) => re.is_match(module),
        }
    }

    /// The names (or the pattern) that matched none of `modules`.
    fn unmatched(&self, modules: &[String]) -> Vec<String> {
        match self {
            Matcher::All => Vec::new(),
            Matcher::Names(n) => n
                .iter()
                .filter(|t| !modules.iter().any(|m| name_matches(m, t)))
                .cloned()
                .collect(),
            Matcher::Regex(re, p) => {
                if modules.iter().any(|m| re.is_match(m)) {
                    Vec::new()
                } else {
                    vec![p.clone()]
                }
            }
        }
    }
}

/// PEFT's rule for a name in a list: the module's full name, or a suffix after a dot.
fn name_matches(module: &str, target: &str) -> bool {
    module == target
        || module
            .strip_suffix(target)
            .is_some_and(|rest| rest.ends_with('.'))
}

/// Every linear layer of the blocks: `(block, index in DecoderBlock::linears, full name)`.
fn block_linears(model: &dyn CausalLm) -> Vec<(usize, usize, String)> {
    let mut out = Vec::new();
    for (b, block) in model.decoder().blocks().iter().enumerate() {
        let prefix = model.block_name(b);
        for (i, lin) in block.linears().into_iter().enumerate() {
            out.push((b, i, format!("{prefix}.{}", lin.name())));
        }
    }
    out
}

/// The layers `config` targets on `model`: `(block, linear index, full name)`.
fn resolve_targets(
    op: &'static str,
    model: &dyn CausalLm,
    config: &LoraConfig,
) -> Result<Vec<(usize, usize, String)>> {
    let matcher = Matcher::new(op, model, &config.target_modules)?;
    let all = block_linears(model);
    let names: Vec<String> = all.iter().map(|(_, _, n)| n.clone()).collect();
    let unmatched = matcher.unmatched(&names);
    if !unmatched.is_empty() {
        let mut short: Vec<&str> = names.iter().filter_map(|n| n.rsplit('.').next()).collect();
        short.sort_unstable();
        short.dedup();
        return Err(Error::value(
            op,
            "target_modules",
            format!(
                "names of the model's linear layers in its blocks ({}), or \"all-linear\"",
                short.join(", ")
            ),
            format!("{unmatched:?}, which match no layer"),
        ));
    }
    Ok(all
        .into_iter()
        .filter(|(_, _, n)| matcher.matches(n))
        .collect())
}

/// The base parameters `modules_to_save` names (full parameter names), checked to exist.
fn modules_to_save<'m>(
    op: &'static str,
    model: &'m dyn CausalLm,
    config: &LoraConfig,
) -> Result<Vec<(String, &'m Tensor)>> {
    let Some(names) = &config.modules_to_save else {
        return Ok(Vec::new());
    };
    let params = model.named_parameters();
    let mut out = Vec::new();
    for target in names {
        let hits: Vec<(String, &Tensor)> = params
            .iter()
            .filter(|(n, _)| {
                n.rsplit_once('.')
                    .is_some_and(|(module, _)| name_matches(module, target))
            })
            .map(|(n, p)| (n.clone(), *p))
            .collect();
        if hits.is_empty() {
            return Err(Error::value(
                op,
                "modules_to_save",
                "names of modules of the base model (lm_head, embed_tokens, norm, …)",
                format!("{target:?}, which matches no parameter"),
            ));
        }
        out.extend(hits);
    }
    Ok(out)
}

/// Adds a LoRA adapter (PEFT's init: the model's output is unchanged) to every layer `config`
/// targets, with variables under `path`, and freezes every base parameter except
/// `modules_to_save`. Returns the switch all the new adapters follow. See the
/// [module docs](self).
///
/// # Errors
/// An invalid config, a target that matches no layer, a model that already has adapters, or
/// `init_lora_weights` other than `true`; nothing changes on error.
pub fn inject_adapter(
    model: &mut dyn CausalLm,
    path: &Path<'_>,
    config: &LoraConfig,
) -> Result<LoraSwitch> {
    let op = "lora::inject_adapter";
    config.validate()?;
    if config.init_lora_weights != Value::Bool(true) {
        return Err(Error::config(
            op,
            "init_lora_weights",
            "true (A Kaiming-uniform, B zero); other inits are not implemented",
            &config.init_lora_weights,
        ));
    }
    let switch = attach(op, model, path, config)?;
    let keep: Vec<String> = modules_to_save(op, model, config)?
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    for (name, p) in model.named_parameters() {
        let _ = p.shallow_clone().set_requires_grad(keep.contains(&name));
    }
    Ok(switch)
}

/// Attaches fresh adapters to the targeted layers (after every check).
fn attach(
    op: &'static str,
    model: &mut dyn CausalLm,
    path: &Path<'_>,
    config: &LoraConfig,
) -> Result<LoraSwitch> {
    if lora_switch(model).is_some() {
        return Err(Error::invalid(
            op,
            "the model already has LoRA adapters (one adapter per model is supported)",
        ));
    }
    let targets = resolve_targets(op, model, config)?;
    // everything that can fail on the config has been checked: from here only variable
    // creation can, which does not fail on a valid path
    modules_to_save(op, model, config)?;
    let switch = LoraSwitch::new();
    let scaling = config.scaling();
    let names: Vec<String> = (0..model.n_layer()).map(|b| model.block_name(b)).collect();
    let blocks = model.decoder_mut().blocks_mut();
    for (b, i, _) in &targets {
        let prefix = names.get(*b).map(String::as_str).unwrap_or_default();
        let block = blocks
            .get_mut(*b)
            .ok_or_else(|| Error::invalid(op, "block index out of range"))?;
        let mut linears = block.linears_mut();
        let lin = linears
            .get_mut(*i)
            .ok_or_else(|| Error::invalid(op, "linear index out of range"))?;
        lin.attach_lora(
            &super::nn::sub_path(path, prefix),
            config.r,
            scaling,
            config.lora_dropout,
            &switch,
        )?;
    }
    Ok(switch)
}

/// The switch the model's adapters follow, or `None` when it has none.
pub fn lora_switch(model: &dyn CausalLm) -> Option<LoraSwitch> {
    model
        .decoder()
        .blocks()
        .iter()
        .flat_map(|b| b.linears())
        .find_map(|l| l.lora().map(|a| a.switch().clone()))
}

/// The adapter's tensors by PEFT's names (`base_model.model.<module>.lora_A.weight`, then
/// `lora_B`), in block order, followed by the `modules_to_save` parameters
/// (`base_model.model.<parameter>`): what [`save_adapter`] writes.
///
/// # Errors
/// A `modules_to_save` name that matches no parameter.
pub fn adapter_state_dict<'m>(
    model: &'m dyn CausalLm,
    config: &LoraConfig,
) -> Result<Vec<(String, &'m Tensor)>> {
    let mut out: Vec<(String, &Tensor)> = model
        .adapter_parameters()
        .into_iter()
        .map(|(n, t)| (format!("{PEFT_PREFIX}{n}"), t))
        .collect();
    out.extend(
        modules_to_save("lora::adapter_state_dict", model, config)?
            .into_iter()
            .map(|(n, t)| (format!("{PEFT_PREFIX}{n}"), t)),
    );
    Ok(out)
}

/// Writes `adapter_config.json` and `adapter_model.safetensors` into `dir` (created if
/// needed), each atomically, as PEFT's `save_pretrained` lays them out. `target_modules` is
/// written as the list of the adapted modules' full names when it was `"all-linear"` (as PEFT
/// does) and `fan_in_fan_out` as the layers' layout says.
///
/// # Errors
/// A model without adapters, or an I/O failure naming the file.
pub fn save_adapter(model: &dyn CausalLm, config: &LoraConfig, dir: &FsPath) -> Result<()> {
    let op = "lora::save_adapter";
    if lora_switch(model).is_none() {
        return Err(Error::invalid(op, "the model has no LoRA adapters"));
    }
    let tensors = adapter_state_dict(model, config)?;
    let mut cfg = config.clone();
    let adapted: Vec<String> = block_linears(model)
        .into_iter()
        .filter(|(b, i, _)| {
            model
                .decoder()
                .blocks()
                .get(*b)
                .and_then(|blk| blk.linears().get(*i).map(|l| l.lora().is_some()))
                .unwrap_or(false)
        })
        .map(|(_, _, n)| n)
        .collect();
    if matches!(&cfg.target_modules, Some(TargetModules::Pattern(p)) if p == "all-linear")
        || cfg.target_modules.is_none()
    {
        cfg.target_modules = Some(TargetModules::Names(adapted));
    }
    cfg.fan_in_fan_out = model
        .decoder()
        .blocks()
        .iter()
        .flat_map(|b| b.linears())
        .any(|l| l.lora().is_some() && l.layout() == super::nn::WeightLayout::InOut);
    if cfg.task_type.is_none() {
        cfg.task_type = Some("CAUSAL_LM".into());
    }
    std::fs::create_dir_all(dir).map_err(|source| Error::Io {
        op,
        path: dir.display().to_string(),
        source,
    })?;
    weights::write_tensors(op, &dir.join(ADAPTER_WEIGHTS_FILE), &tensors)?;
    weights::write_text(op, &dir.join(ADAPTER_CONFIG_FILE), &cfg.to_json()?)
}

/// Reads a PEFT adapter folder (`adapter_config.json` + `adapter_model.safetensors`) and
/// attaches it to `model` (variables under `path`), freezing the base as [`inject_adapter`]
/// does. Every tensor is read and checked (names, shapes, finite values) against the model
/// before anything changes.
///
/// # Errors
/// An unreadable or invalid config (field named), a weights file that does not fit the model
/// (missing, extra or mis-shaped tensors, listed by name; NaN / Inf values), a model that
/// already has adapters; every error names the file, and the model is unchanged.
pub fn load_adapter(
    model: &mut dyn CausalLm,
    path: &Path<'_>,
    dir: &FsPath,
) -> Result<(LoraConfig, LoraSwitch)> {
    let op = "lora::load_adapter";
    let config = LoraConfig::from_json_file(dir.join(ADAPTER_CONFIG_FILE))?;
    let file = dir.join(ADAPTER_WEIGHTS_FILE);
    let in_file = |e: Error| Error::InvalidFile {
        op,
        path: file.display().to_string(),
        reason: e.to_string(),
    };
    if lora_switch(model).is_some() {
        return Err(Error::invalid(
            op,
            "the model already has LoRA adapters (one adapter per model is supported)",
        ));
    }
    let targets = resolve_targets(op, model, &config).map_err(in_file)?;
    let saved: Vec<(String, Vec<i64>)> = modules_to_save(op, model, &config)
        .map_err(in_file)?
        .into_iter()
        .map(|(n, p)| (n, p.size()))
        .collect();
    // the names and shapes the file must hold
    let mut expected: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    let blocks = model.decoder().blocks();
    for (b, i, name) in &targets {
        let lin = blocks
            .get(*b)
            .and_then(|blk| blk.linears().get(*i).copied())
            .ok_or_else(|| Error::invalid(op, "layer index out of range"))?;
        let (n_in, n_out) = (lin.in_features(), lin.out_features());
        expected.insert(
            format!("{PEFT_PREFIX}{name}.lora_A.weight"),
            vec![config.r, n_in],
        );
        expected.insert(
            format!("{PEFT_PREFIX}{name}.lora_B.weight"),
            vec![n_out, config.r],
        );
    }
    for (name, size) in &saved {
        expected.insert(format!("{PEFT_PREFIX}{name}"), size.clone());
    }
    let tensors = weights::read_tensors(op, &file)?;
    let mut given = BTreeMap::new();
    let mut values: BTreeMap<String, Tensor> = BTreeMap::new();
    for (name, t) in tensors {
        // PEFT accepts names with the adapter name ("…lora_A.default.weight") when loading
        let name = name.replace(".default.weight", ".weight");
        given.insert(name.clone(), t.size());
        values.insert(name, t);
    }
    let reasons = weights::fit_report(&expected, &given);
    if !reasons.is_empty() {
        return Err(Error::InvalidFile {
            op,
            path: file.display().to_string(),
            reason: format!("does not fit the model: {}", reasons.join("; ")),
        });
    }
    for (name, t) in &values {
        let finite = t
            .f_isfinite()
            .and_then(|f| f.f_all())
            .map(|a| a.int64_value(&[]) == 1)
            .unwrap_or(false);
        if !finite {
            return Err(Error::InvalidFile {
                op,
                path: file.display().to_string(),
                reason: format!("tensor {name} holds NaN or Inf values"),
            });
        }
    }
    // every check passed: attach, then copy the values in
    let switch = attach(op, model, path, &config)?;
    let keep: Vec<String> = saved.iter().map(|(n, _)| n.clone()).collect();
    let _guard = tch::no_grad_guard();
    for (name, p) in model.adapter_parameters() {
        if let Some(src) = values.get(&format!("{PEFT_PREFIX}{name}")) {
            let mut dst = p.shallow_clone();
            dst.f_copy_(&src.f_to_kind(p.kind())?.f_to_device(p.device())?)?;
        }
    }
    for (name, p) in model.named_parameters() {
        let mut dst = p.shallow_clone();
        if let Some(src) = values.get(&format!("{PEFT_PREFIX}{name}")) {
            dst.f_copy_(&src.f_to_kind(p.kind())?.f_to_device(p.device())?)?;
        }
        let _ = dst.set_requires_grad(keep.contains(&name));
    }
    Ok((config, switch))
}

/// Folds every adapter into its base weight (`W += s · B A`, transposed for `[in, out]`
/// weights) and removes the adapters: PEFT's `merge_and_unload`. The model is then a plain
/// model of its architecture ([`CausalLm::save_pretrained`] writes a Hugging Face checkpoint);
/// `requires_grad` on the base parameters is left as it was.
///
/// # Errors
/// As the tensor operations; a model without adapters is left as it is.
pub fn merge_and_unload(model: &mut dyn CausalLm) -> Result<()> {
    for block in model.decoder_mut().blocks_mut() {
        for lin in block.linears_mut() {
            lin.merge_lora()?;
        }
    }
    Ok(())
}
