//! Tiny language-model fixtures shared by the trainer integration tests: GPT-2 and Qwen3-shaped
//! configs on the byte tokenizer's vocabulary, the hidden "lowercase letters" reward and its
//! token env, seeded hydra policies, and the trainer-config settings the short test runs share.
//!
//! A test file includes it with `#[path = "common/llm.rs"] mod llm_fixtures;` (each file under
//! `tests/` is its own crate, and each uses a subset, hence `dead_code` is allowed). The tests
//! assert seeded and recorded values that depend on these exact sizes, seeds and ids: change a
//! value here only together with every test that uses it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use serde_json::{json, Value};
use tch::nn::VarStore;
use tch::{Device, Tensor};
use torchrl::envs::llm::{TokenEnv, TokenEnvConfig, TokenScorer};
use torchrl::modules::llm::models::llama::LlamaConfig;
use torchrl::modules::llm::nn::{with_init_seed, Decoder};
use torchrl::modules::llm::{
    ByteTokenizer, CausalLm, CausalLmConfig, CausalLmWithHydraValueHead, Gpt2Config, LmFacts,
    TextTokenizer,
};
use torchrl::trainers::config::{GenKwargs, TrlConfig, TrlConfigOf};
use torchrl::trainers::dpo::{DpoPair, DpoTrlConfig};
use torchrl::trainers::grpo::GrpoTrlConfig;
use torchrl::trainers::ilql::data::{IlqlDataConfig, IlqlDataset, IlqlTokenSample};
use torchrl::trainers::ilql::IlqlTrlConfig;

// ------------------------------------------------------------------------------ models

/// GPT-2 on the byte tokenizer (its vocabulary and BOS / EOS / PAD ids): 16 positions, 16 wide,
/// 2 blocks of 2 heads. The tiny policy of the rlhf_trainer, grpo_dpo_trainers, rollout_reuse,
/// init_seed and distributed_trainers tests.
pub fn byte_gpt2() -> Gpt2Config {
    byte_gpt2_sized(16, 2)
}

/// [`byte_gpt2`] `n_embd` wide with `n_layer` blocks (2 heads, 16 positions): 8 wide for
/// hostile_trainers (2 blocks for its policies, 1 for its ILQL model).
pub fn byte_gpt2_sized(n_embd: i64, n_layer: i64) -> Gpt2Config {
    let tok = ByteTokenizer::new();
    Gpt2Config::new(tok.vocab_size())
        .with_n_positions(16)
        .with_n_embd(n_embd)
        .with_n_layer(n_layer)
        .with_n_head(2)
        .with_special_tokens(tok.bos_token_id(), tok.eos_token_id(), tok.pad_token_id())
}

/// The Hugging Face `config.json` of a tiny Qwen3-shaped model (rotary, grouped-query heads,
/// q/k norms, untied head): 16 wide (4 heads of 8, 2 key-value heads), MLP 32 wide, no special
/// token ids.
fn qwen3_json(vocab_size: i64, n_layer: i64, n_positions: i64, initializer_range: f64) -> Value {
    json!({
        "model_type": "qwen3", "vocab_size": vocab_size, "hidden_size": 16,
        "intermediate_size": 32, "num_hidden_layers": n_layer, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 8, "max_position_embeddings": n_positions,
        "initializer_range": initializer_range,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}
    })
}

/// A tiny Qwen3-shaped model (16 wide, 4 heads of 8, 2 key-value heads, MLP 32 wide) of
/// `vocab_size` tokens and `n_layer` blocks, `n_positions` long, without special token ids;
/// rollout_reuse's (29 tokens, 2 blocks, 24 positions, initializer range 0.3).
pub fn tiny_qwen3(
    vocab_size: i64,
    n_layer: i64,
    n_positions: i64,
    initializer_range: f64,
) -> LlamaConfig {
    serde_json::from_value(qwen3_json(
        vocab_size,
        n_layer,
        n_positions,
        initializer_range,
    ))
    .unwrap()
}

/// The tiny Qwen3-shaped model on the byte tokenizer (its vocabulary and BOS / EOS / PAD ids):
/// 16 wide, 2 blocks, 16 positions, initializer range 0.1. The Llama-family policy of the
/// llama_trainers, lora_trainers, bf16, init_seed and rollout_reuse tests.
pub fn byte_qwen3() -> LlamaConfig {
    byte_qwen3_with(2, 0.1)
}

/// [`byte_qwen3`] with `n_layer` blocks and `initializer_range`: 3 blocks for
/// gradient_checkpointing, `transformers`' default range 0.02 for distributed_trainers.
pub fn byte_qwen3_with(n_layer: i64, initializer_range: f64) -> LlamaConfig {
    let tok = ByteTokenizer::new();
    let mut config = qwen3_json(tok.vocab_size(), n_layer, 16, initializer_range);
    config["bos_token_id"] = json!(tok.bos_token_id());
    config["eos_token_id"] = json!(tok.eos_token_id());
    config["pad_token_id"] = json!(tok.pad_token_id());
    serde_json::from_value(config).unwrap()
}

/// A fresh `cfg` model drawn under `with_init_seed(seed)`, with its store.
pub fn build_model(cfg: &dyn CausalLmConfig, seed: u64) -> (VarStore, Box<dyn CausalLm>) {
    let vs = VarStore::new(Device::Cpu);
    let m = with_init_seed(seed, || cfg.build(&vs.root())).unwrap();
    (vs, m)
}

/// Each of `prompts` left-padded with `pad` to the longest (mask 0 on the padding) and repeated
/// in `g` consecutive rows: ids and mask `[prompts × g, longest]`.
pub fn grouped_prompts(prompts: &[&[i64]], g: i64, pad: i64) -> (Tensor, Tensor) {
    let width = prompts.iter().map(|p| p.len()).max().unwrap_or(0);
    let (mut ids, mut mask) = (Vec::new(), Vec::new());
    for p in prompts {
        for _ in 0..g {
            ids.extend(std::iter::repeat_n(pad, width - p.len()).chain(p.iter().copied()));
            mask.extend(std::iter::repeat_n(0i64, width - p.len()));
            mask.extend(std::iter::repeat_n(1i64, p.len()));
        }
    }
    let rows = prompts.len() as i64 * g;
    (
        Tensor::from_slice(&ids).view([rows, width as i64]),
        Tensor::from_slice(&mask).view([rows, width as i64]),
    )
}

/// A causal LM that counts the tokens its trunk embeds (every forward embeds its input ids
/// once): what shows that a scorer ran the shared prefix once per group (rollout_reuse) and that a
/// rollout's scoring pass did not run the trunk again (trunk_capture).
#[derive(Debug)]
pub struct CountingLm {
    pub inner: Box<dyn CausalLm>,
    pub tokens: Arc<AtomicI64>,
}

impl CausalLm for CountingLm {
    fn facts(&self) -> &LmFacts {
        self.inner.facts()
    }
    fn decoder(&self) -> &Decoder {
        self.inner.decoder()
    }
    fn decoder_mut(&mut self) -> &mut Decoder {
        self.inner.decoder_mut()
    }
    fn block_name(&self, index: usize) -> String {
        self.inner.block_name(index)
    }
    fn embed(&self, input_ids: &Tensor, position_ids: &Tensor) -> torchrl::Result<Tensor> {
        self.tokens
            .fetch_add(input_ids.numel() as i64, Ordering::Relaxed);
        self.inner.embed(input_ids, position_ids)
    }
    fn lm_head_weight(&self) -> &Tensor {
        self.inner.lm_head_weight()
    }
    fn embedding_parameters(&self) -> Vec<&Tensor> {
        self.inner.embedding_parameters()
    }
    fn named_parameters(&self) -> Vec<(String, &Tensor)> {
        self.inner.named_parameters()
    }
    fn copy_to(&self, path: &tch::nn::Path<'_>) -> torchrl::Result<Box<dyn CausalLm>> {
        self.inner.copy_to(path)
    }
    fn config_json(&self) -> torchrl::Result<String> {
        self.inner.config_json()
    }
}

/// A hydra policy with a value head on a fresh `config` model drawn under
/// `with_init_seed(seed)`, its top `unfrozen` blocks trained (-1: all, with a full reference
/// copy). The policy builder of rlhf_trainer, grpo_dpo_trainers, llama_trainers,
/// hostile_trainers and rollout_reuse.
pub fn seeded_hydra(
    config: &dyn CausalLmConfig,
    seed: u64,
    unfrozen: i64,
) -> (VarStore, CausalLmWithHydraValueHead) {
    let vs = VarStore::new(Device::Cpu);
    let m = with_init_seed(seed, || {
        CausalLmWithHydraValueHead::new(&vs.root(), config, unfrozen)
    });
    (vs, m.unwrap())
}

/// Copies of the policy's named parameters, in the model's order (grpo_dpo_trainers,
/// distributed_trainers).
pub fn policy_params(m: &CausalLmWithHydraValueHead) -> Vec<(String, Tensor)> {
    m.policy()
        .named_parameters()
        .into_iter()
        .map(|(n, t)| (n, t.detach().copy()))
        .collect()
}

/// [`policy_params`] sorted by name (rlhf_trainer, distributed_trainers).
pub fn sorted_policy_params(m: &CausalLmWithHydraValueHead) -> Vec<(String, Tensor)> {
    let mut p = policy_params(m);
    p.sort_by(|a, b| a.0.cmp(&b.0));
    p
}

// ------------------------------------------------------------------------------ data, rewards, envs

/// DPO pairs on the prompts "ab", "cd", "efg" and "h", each preferring "aa" to "zz" (byte
/// ids): the preference of llama_trainers' and lora_trainers' DPO runs.
pub fn aa_over_zz_pairs() -> Vec<DpoPair> {
    let tok = ByteTokenizer::new();
    ["ab", "cd", "efg", "h"]
        .iter()
        .map(|p| {
            DpoPair::new(
                tok.encode(p).unwrap(),
                tok.encode("aa").unwrap(),
                tok.encode("zz").unwrap(),
            )
        })
        .collect()
}

/// `n` ILQL samples on byte ids, rows of 16 tokens: the prompt "b:", a response of one of
/// "a" / "b" / "c" (cycling), then "a" and EOS (256), rewarded 0, 1, 2 (cycling). 8 for
/// ilql_trainer and llama_trainers, 4 for hostile_trainers.
pub fn ilql_data(n: i64) -> IlqlDataset {
    let samples: Vec<IlqlTokenSample> = (0..n)
        .map(|i| IlqlTokenSample::new(vec![98, 58], vec![97 + (i % 3), 97, 256], (i % 3) as f64))
        .collect();
    IlqlDataset::from_token_rows(&samples, &IlqlDataConfig::new().with_seq_length(16)).unwrap()
}

/// The hidden reward of the trainer tests: the number of lowercase ASCII letters (bytes 97 to
/// 122) in the response, about 1 token in 10 at init. Scores [`lowercase_env_on`]'s envs and
/// hostile_trainers' and rollout_reuse's own.
pub fn lowercase(response: &[i64]) -> f64 {
    response.iter().filter(|t| (97..=122).contains(*t)).count() as f64
}

/// [`lowercase_env_on`] the prompts "ab", "cd" and "efg": the GRPO / PPO env of the
/// grpo_dpo_trainers, llama_trainers, lora_trainers and bf16 tests.
pub fn lowercase_env(config: &dyn CausalLmConfig, generations: i64) -> TokenEnv {
    lowercase_env_on(config, generations, &["ab", "cd", "efg"])
}

/// A byte-tokenizer env for `config`'s model scored by [`lowercase`]: 4 response tokens,
/// 8 rollouts per batch in groups of `generations`, prompts left-padded to 3 tokens
/// (gradient_checkpointing's on "ab" and "cd").
pub fn lowercase_env_on(
    config: &dyn CausalLmConfig,
    generations: i64,
    prompts: &[&str],
) -> TokenEnv {
    let tok = ByteTokenizer::new();
    let env_cfg = TokenEnvConfig::for_model(&config.facts())
        .with_max_new_tokens(4)
        .with_batch_size(8)
        .with_num_generations(generations)
        .with_prompt_width(3);
    let scorer = TokenScorer::new(|_p: &[i64], r: &[i64]| lowercase(r));
    TokenEnv::from_text(env_cfg, &tok, prompts, Box::new(scorer)).unwrap()
}

// ------------------------------------------------------------------------------ trainer configs

/// Sampling `max_new_tokens` tokens at temperature 1, no top-k / top-p filtering (TRL's
/// generation defaults but the length): the `gen_kwargs` of most trainer configs here.
pub fn gen_kwargs(max_new_tokens: usize) -> GenKwargs {
    GenKwargs {
        max_new_tokens,
        ..GenKwargs::default()
    }
}

/// The run settings the short trainer tests share, on any trainer's config: `epochs` epochs,
/// evaluation and checkpoints never due within a test (every 1000 steps), checkpoints under
/// `dir`, and the trainer's `seed`. Used by the config builders here and by rlhf_trainer,
/// grpo_dpo_trainers, hostile_trainers and distributed_trainers.
pub fn short_run<M>(c: &mut TrlConfigOf<M>, dir: &Path, epochs: usize, seed: u64) {
    c.train.epochs = epochs;
    c.train.eval_interval = 1000;
    c.train.checkpoint_interval = 1000;
    c.train.checkpoint_dir = dir.display().to_string();
    c.train.seed = seed;
}

/// A constant learning rate `lr`: AdamW's rate, and the cosine schedule's floor too (the
/// GRPO, DPO and ILQL runs of several files).
pub fn constant_lr<M>(c: &mut TrlConfigOf<M>, lr: f64) {
    c.optimizer.kwargs.lr = lr;
    c.scheduler.kwargs.eta_min = lr;
}

/// GRPO on a [`lowercase_env`]: [`short_run`] of 100 epochs with seed 3, the constant rate
/// `lr`, minibatches of 8, groups of 4, `rollouts` rollouts per iteration made in chunks of 8,
/// 4 response tokens. grpo_dpo_trainers' (3e-3, 8 rollouts) and, edited, llama_trainers',
/// lora_trainers' and rollout_reuse's.
pub fn grpo_config(dir: &Path, lr: f64, rollouts: usize) -> GrpoTrlConfig {
    let mut c = GrpoTrlConfig::default();
    short_run(&mut c, dir, 100, 3);
    constant_lr(&mut c, lr);
    c.train.batch_size = 8;
    c.method.num_generations = 4;
    c.method.num_rollouts = rollouts;
    c.method.chunk_size = 8;
    c.method.gen_kwargs = gen_kwargs(4);
    c
}

/// PPO-RLHF with TRL's defaults but 8 rollouts per iteration (one chunk), minibatches of 4,
/// 2 PPO epochs, 4 response tokens, checkpoints under `dir`: llama_trainers', lora_trainers' and
/// bf16's one-iteration runs.
pub fn tiny_ppo_config(dir: &Path) -> TrlConfig {
    let mut c = TrlConfig::default();
    c.method.num_rollouts = 8;
    c.method.chunk_size = 8;
    c.method.ppo_epochs = 2;
    c.train.batch_size = 4;
    c.train.checkpoint_dir = dir.display().to_string();
    c.method.gen_kwargs = gen_kwargs(4);
    c
}

/// DPO with TRL's defaults but minibatches of 2, 50 epochs, seed 9, 4 generated tokens,
/// checkpoints under `dir`: llama_trainers' and lora_trainers' runs on [`aa_over_zz_pairs`].
pub fn tiny_dpo_config(dir: &Path) -> DpoTrlConfig {
    let mut c = DpoTrlConfig::default();
    c.train.batch_size = 2;
    c.train.epochs = 50;
    c.train.seed = 9;
    c.train.checkpoint_dir = dir.display().to_string();
    c.method.gen_kwargs.max_new_tokens = 4;
    c
}

/// ILQL for [`ilql_data`]: 3 epochs of minibatches of 4, evaluation and checkpoints never due
/// within a test (every 1000 steps), checkpoints under `dir`, a rate of 1e-2, α = 0.5,
/// 3 generated tokens, TRL's default seed. ilql_trainer's, hostile_trainers' and
/// llama_trainers'.
pub fn ilql_config(dir: &Path) -> IlqlTrlConfig {
    let mut c = IlqlTrlConfig::default();
    let default_seed = c.train.seed;
    short_run(&mut c, dir, 3, default_seed);
    c.train.batch_size = 4;
    c.optimizer.kwargs.lr = 1e-2;
    c.method.alpha = 0.5;
    c.method.gen_kwargs.max_new_tokens = 3;
    c
}

// ------------------------------------------------------------------------------ helpers

/// An empty path `<temp>/torchrl-<prefix>-<name>-<pid>` (what was there removed): the
/// checkpoint folders of llama_trainers, lora_trainers and hostile_trainers.
pub fn scratch(prefix: &str, name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("torchrl-{prefix}-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// `max |a − b|` in float64 (0 for empty tensors): rollout_reuse's and trunk_capture's
/// comparisons.
pub fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
    if a.numel() == 0 {
        return 0.0;
    }
    (a.to_kind(tch::Kind::Double) - b.to_kind(tch::Kind::Double))
        .abs()
        .max()
        .double_value(&[])
}

/// The largest absolute difference between two equally long lists of tensors (0 for none):
/// llama_trainers' and lora_trainers' parameter comparisons.
pub fn max_abs_diff(a: &[Tensor], b: &[Tensor]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs().max().double_value(&[]))
        .fold(0.0, f64::max)
}
