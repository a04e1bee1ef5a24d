//! What the rollout no longer recomputes (issue 27, item 2).
//!
//! Generation with [`GenerateOptions::prompt_groups`]: the prompt pass of `g` identical
//! consecutive rows runs once and its KV cache is repeated to the group. Greedy and sampled
//! tokens are identical to the ungrouped generation (same seed), with and without left
//! padding, on GPT-2 and on a Llama-family model (rotary, grouped-query heads); log-probs agree
//! to 1e-6; groups whose rows differ are an error. The token env's policy
//! ([`GenerationPolicy::with_prompt_groups`]) writes the same rollout either way, and the GRPO
//! trainer (which shares its groups' prompts by default) trains bitwise as without sharing.

use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};
use torchrl::envs::llm::{GenerationPolicy, TokenEnv, TokenEnvConfig, TokenScorer};
use torchrl::envs::EnvBase;
use torchrl::modules::llm::models::llama::LlamaConfig;
use torchrl::modules::llm::nn::with_init_seed;
use torchrl::modules::llm::{
    generate_greedy, generate_with, ilql_generate_with, ByteTokenizer, CausalLm, CausalLmConfig,
    CausalLmWithHydraValueHead, CausalLmWithIlqlHeads, GenerateOptions, GenerationConfig,
    GenerationOutput, Gpt2Config, IlqlGenerationConfig, TextTokenizer,
};
use torchrl::tensordict::KeysOptions;
use torchrl::trainers::api::{Callbacks, Stats};
use torchrl::trainers::config::GenKwargs;
use torchrl::trainers::grpo::{GrpoTrainer, GrpoTrlConfig};
use torchrl::{Error, Generator, TensorDict};

const VOCAB: i64 = 29;
const EOS: i64 = 3;
const PAD: i64 = 0;
const G: i64 = 3;

fn gpt2() -> Gpt2Config {
    Gpt2Config::new(VOCAB)
        .with_n_layer(2)
        .with_n_embd(16)
        .with_n_head(2)
        .with_n_positions(24)
}

fn qwen3() -> LlamaConfig {
    serde_json::from_value(serde_json::json!({
        "model_type": "qwen3", "vocab_size": VOCAB, "hidden_size": 16,
        "intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 8, "max_position_embeddings": 24,
        "initializer_range": 0.3,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}
    }))
    .unwrap()
}

fn build(cfg: &dyn CausalLmConfig, seed: u64) -> (VarStore, Box<dyn CausalLm>) {
    let vs = VarStore::new(Device::Cpu);
    let m = with_init_seed(seed, || cfg.build(&vs.root())).unwrap();
    (vs, m)
}

/// Each of `prompts` (left-padded to the longest, mask 0 on the padding) repeated in `g`
/// consecutive rows.
fn grouped(prompts: &[&[i64]], g: i64) -> (Tensor, Tensor) {
    let width = prompts.iter().map(|p| p.len()).max().unwrap_or(0);
    let (mut ids, mut mask) = (Vec::new(), Vec::new());
    for p in prompts {
        for _ in 0..g {
            ids.extend(std::iter::repeat_n(PAD, width - p.len()).chain(p.iter().copied()));
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

fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
    if a.numel() == 0 {
        return 0.0;
    }
    (a - b).abs().max().double_value(&[])
}

fn assert_same(shared: &GenerationOutput, plain: &GenerationOutput, what: &str) {
    assert!(
        shared.sequences.equal(&plain.sequences),
        "{what}: sequences"
    );
    assert!(shared.response.equal(&plain.response), "{what}: response");
    assert!(
        shared.response_mask.equal(&plain.response_mask),
        "{what}: response mask"
    );
    assert!(
        shared.attention_mask.equal(&plain.attention_mask),
        "{what}: attention mask"
    );
    let d = max_diff(&shared.log_probs, &plain.log_probs);
    assert!(d <= 1e-6, "{what}: log-probs differ by {d}");
}

/// Greedy and sampled generation (several seeds, EOS on) with and without prompt groups.
fn check_model(model: &dyn CausalLm, name: &str) {
    let unpadded: &[&[i64]] = &[&[5, 6, 7, 8], &[9, 10, 11, 12]];
    let padded: &[&[i64]] = &[&[5, 6], &[9, 10, 11, 12], &[13]];
    let sampled = GenerationConfig::rlhf_sampling(8)
        .with_eos_token_id(EOS)
        .with_pad_token_id(PAD);
    let warped = GenerationConfig::new(8)
        .with_do_sample(true)
        .with_temperature(0.7)
        .with_top_k(10)
        .with_top_p(0.9)
        .with_pad_token_id(PAD);
    let greedy = GenerationConfig::new(8)
        .with_eos_token_id(EOS)
        .with_pad_token_id(PAD);
    let plain = GenerateOptions::default();
    let shared = GenerateOptions::default().with_prompt_groups(G as usize);
    for (label, prompts) in [("unpadded", unpadded), ("padded", padded)] {
        let (ids, mask) = grouped(prompts, G);
        for m in [None, Some(&mask)] {
            let what = format!("{name}, {label}, mask {}", m.is_some());
            let a = generate_greedy(model, &ids, m, &greedy, &shared).unwrap();
            let b = generate_greedy(model, &ids, m, &greedy, &plain).unwrap();
            assert_same(&a, &b, &format!("{what}, greedy"));
            for seed in 0..6 {
                for (c, cfg) in [("sampled", &sampled), ("warped", &warped)] {
                    let a = generate_with(model, &ids, m, cfg, &shared, &mut Generator::new(seed))
                        .unwrap();
                    let b = generate_with(model, &ids, m, cfg, &plain, &mut Generator::new(seed))
                        .unwrap();
                    assert_same(&a, &b, &format!("{what}, {c}, seed {seed}"));
                }
            }
        }
    }
}

#[test]
fn gpt2_tokens_are_identical_with_shared_prompts() {
    let (_vs, model) = build(&gpt2(), 11);
    check_model(model.as_ref(), "gpt2");
}

#[test]
fn llama_tokens_are_identical_with_shared_prompts() {
    let (_vs, model) = build(&qwen3(), 12);
    check_model(model.as_ref(), "qwen3");
}

#[test]
fn the_samples_differ_within_a_group() {
    // the rows of a group share the prompt, not the draws: sampling still varies per row
    let (_vs, model) = build(&gpt2(), 11);
    let (ids, mask) = grouped(&[&[5, 6, 7, 8]], 4);
    let cfg = GenerationConfig::rlhf_sampling(8).with_pad_token_id(PAD);
    let shared = GenerateOptions::default().with_prompt_groups(4);
    let out = generate_with(
        model.as_ref(),
        &ids,
        Some(&mask),
        &cfg,
        &shared,
        &mut Generator::new(3),
    )
    .unwrap();
    let first = out.response.narrow(0, 0, 1);
    let all_alike = out.response.eq_tensor(&first).all().int64_value(&[]) != 0;
    assert!(!all_alike, "{}", out.response);
}

#[test]
fn groups_that_are_not_identical_are_errors() {
    let (_vs, model) = build(&gpt2(), 11);
    let m = model.as_ref();
    let cfg = GenerationConfig::new(4).with_pad_token_id(PAD);
    let shared = GenerateOptions::default().with_prompt_groups(G as usize);
    let (ids, mask) = grouped(&[&[5, 6], &[9, 10, 11]], G);
    // a token differs in row 4 (the second row of the second group)
    let bad_ids = ids.copy();
    let _ = bad_ids.get(4).get(2).fill_(20);
    let err = generate_greedy(m, &bad_ids, Some(&mask), &cfg, &shared).unwrap_err();
    match &err {
        Error::InvalidValue { key, expected, .. } => {
            assert_eq!(key, "prompt");
            assert!(expected.contains("prompt_groups = 3"), "{err}");
        }
        other => panic!("{other}"),
    }
    assert!(err.to_string().contains("row 4"), "{err}");
    // the ids agree but a mask differs (row 2: the last row of the first group)
    let bad_mask = mask.copy();
    let _ = bad_mask.get(2).get(0).fill_(1);
    let err = generate_greedy(m, &ids, Some(&bad_mask), &cfg, &shared).unwrap_err();
    assert!(
        matches!(&err, Error::InvalidValue { key, .. } if key == "prompt"),
        "{err}"
    );
    assert!(err.to_string().contains("row 2"), "{err}");
    // a batch that is not whole groups
    let err = generate_greedy(m, &ids.narrow(0, 0, 5), None, &cfg, &shared).unwrap_err();
    assert!(
        matches!(&err, Error::InvalidConfig { field, .. } if *field == "prompt_groups"),
        "{err}"
    );
    // sampling is checked the same way, before any draw
    let sampled = GenerationConfig::rlhf_sampling(4).with_pad_token_id(PAD);
    let rng = &mut Generator::new(0);
    assert!(generate_with(m, &bad_ids, Some(&mask), &sampled, &shared, rng).is_err());
    // groups of 1 (and 0, the default) ask nothing of the rows
    for g in [0, 1] {
        let opts = GenerateOptions::default().with_prompt_groups(g);
        generate_greedy(m, &bad_ids, Some(&bad_mask), &cfg, &opts).unwrap();
    }
}

#[test]
fn ilql_generation_shares_the_prompt_too() {
    let vs = VarStore::new(Device::Cpu);
    let model = with_init_seed(13, || {
        let trunk = gpt2().build(&vs.root())?;
        CausalLmWithIlqlHeads::from_model(&vs.root(), trunk, true, 0.01)
    })
    .unwrap();
    let (ids, mask) = grouped(&[&[5, 6], &[9, 10, 11, 12]], G);
    let cfg = IlqlGenerationConfig::new(6);
    let shared = GenerateOptions::default().with_prompt_groups(G as usize);
    for seed in 0..3 {
        let run = |opts: &GenerateOptions<'_>| {
            ilql_generate_with(
                &model,
                &ids,
                Some(&mask),
                &cfg,
                opts,
                &mut Generator::new(seed),
            )
            .unwrap()
        };
        let (a, b) = (run(&shared), run(&GenerateOptions::default()));
        assert!(a.sequences.equal(&b.sequences), "seed {seed}");
    }
}

#[test]
fn the_policy_writes_the_same_rollout_with_shared_prompts() {
    let cfg = gpt2();
    let (_vs, model) = build(&cfg, 14);
    let env_cfg = TokenEnvConfig::for_model(&cfg.facts())
        .with_batch_size(6)
        .with_num_generations(G)
        .with_max_new_tokens(6)
        .with_eos_token_id(EOS)
        .with_pad_token_id(PAD);
    let scorer = TokenScorer::new(|_p: &[i64], r: &[i64]| r.len() as f64);
    let prompts = vec![vec![5, 6], vec![9, 10, 11, 12]];
    let mut env = TokenEnv::new(env_cfg.clone(), prompts, Box::new(scorer)).unwrap();
    let td = env.reset(None).unwrap();
    let gen_cfg = env_cfg
        .generation_config()
        .with_do_sample(true)
        .with_top_k(0);
    let mut plain = GenerationPolicy::new(model.as_ref(), gen_cfg.clone(), 5).unwrap();
    let mut shared = GenerationPolicy::new(model.as_ref(), gen_cfg, 5)
        .unwrap()
        .with_prompt_groups(G as usize);
    let a = shared.call(td.clone()).unwrap();
    let b = plain.call(td).unwrap();
    for key in [
        ("tokens", "response"),
        ("tokens", "full"),
        ("masks", "all_attention_mask"),
        ("masks", "all_assistant_mask"),
    ] {
        let (x, y) = (a.get_or_err(key).unwrap(), b.get_or_err(key).unwrap());
        assert!(x.equal(y), "{key:?}");
    }
    for key in [("log_probs", "response"), ("log_probs", "full")] {
        let (x, y) = (a.get_or_err(key).unwrap(), b.get_or_err(key).unwrap());
        assert_eq!(x.kind(), Kind::Float);
        assert!(max_diff(x, y) <= 1e-6, "{key:?}");
    }
}

// ------------------------------------------------------------------------------ GRPO

/// The hidden reward: lowercase ASCII letters in the response.
fn lowercase(r: &[i64]) -> f64 {
    r.iter().filter(|t| (97..=122).contains(*t)).count() as f64
}

fn byte_gpt2() -> Gpt2Config {
    let tok = ByteTokenizer::new();
    Gpt2Config::new(tok.vocab_size())
        .with_n_positions(16)
        .with_n_embd(16)
        .with_n_layer(2)
        .with_n_head(2)
        .with_special_tokens(tok.bos_token_id(), tok.eos_token_id(), tok.pad_token_id())
}

fn byte_qwen3() -> LlamaConfig {
    let tok = ByteTokenizer::new();
    serde_json::from_value(serde_json::json!({
        "model_type": "qwen3", "vocab_size": tok.vocab_size(), "hidden_size": 16,
        "intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 8, "max_position_embeddings": 16,
        "initializer_range": 0.1,
        "bos_token_id": tok.bos_token_id(), "eos_token_id": tok.eos_token_id(),
        "pad_token_id": tok.pad_token_id(),
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}
    }))
    .unwrap()
}

/// A GRPO trainer on `model_cfg` (a fresh model from `seed`, `unfrozen` top layers trained),
/// groups of 4, two minibatches per rollout, β > 0 (the reference's log-probs are read).
fn grpo(model_cfg: &dyn CausalLmConfig, unfrozen: i64, seed: u64) -> (VarStore, GrpoTrainer) {
    let vs = VarStore::new(Device::Cpu);
    let model = with_init_seed(seed, || {
        CausalLmWithHydraValueHead::new(&vs.root(), model_cfg, unfrozen)
    })
    .unwrap();
    let mut c = GrpoTrlConfig::default();
    c.train.batch_size = 4;
    c.train.epochs = 100;
    c.train.eval_interval = 1000;
    c.train.checkpoint_interval = 1000;
    c.train.checkpoint_dir = std::env::temp_dir()
        .join(format!("torchrl-rollout-reuse-{}", std::process::id()))
        .display()
        .to_string();
    c.train.seed = 3;
    c.optimizer.kwargs.lr = 3e-3;
    c.scheduler.kwargs.eta_min = 3e-3;
    c.method.beta = 0.05;
    c.method.num_generations = 4;
    c.method.num_rollouts = 8;
    c.method.chunk_size = 8;
    c.method.gen_kwargs = GenKwargs {
        max_new_tokens: 4,
        ..GenKwargs::default()
    };
    let tok = ByteTokenizer::new();
    let env_cfg = TokenEnvConfig::for_model(&model_cfg.facts())
        .with_max_new_tokens(4)
        .with_batch_size(8)
        .with_num_generations(4);
    let scorer = TokenScorer::new(|_p: &[i64], r: &[i64]| lowercase(r));
    // prompts of different lengths: the env left-pads them
    let env = TokenEnv::from_text(env_cfg, &tok, &["ab", "cde", "f"], Box::new(scorer)).unwrap();
    let t = GrpoTrainer::new(c, model, env, Box::new(tok)).unwrap();
    (vs, t)
}

/// Two iterations' step logs, the final parameters and the last store.
fn run(mut t: GrpoTrainer) -> (Vec<Stats>, Vec<Tensor>, TensorDict) {
    let mut logs: Vec<Stats> = Vec::new();
    {
        let mut cb = Callbacks::new().on_log(|_, s| {
            logs.push(s.clone());
            Ok(())
        });
        for _ in 0..2 {
            t.iteration(&mut cb).unwrap();
        }
    }
    let params = t
        .model()
        .policy()
        .named_parameters()
        .into_iter()
        .map(|(_, p)| p.detach().copy())
        .collect();
    (logs, params, t.store().unwrap().clone())
}

fn without_times(s: &Stats) -> Vec<(String, f64)> {
    s.iter()
        .filter(|(k, _)| !k.ends_with("_s") && !k.contains("time"))
        .map(|(k, v)| (k.clone(), *v))
        .collect()
}

#[test]
fn grpo_trains_bitwise_alike_with_shared_prompts() {
    for (name, cfg, unfrozen) in [
        (
            "gpt2, full reference",
            &byte_gpt2() as &dyn CausalLmConfig,
            -1,
        ),
        ("gpt2, hydra branch", &byte_gpt2(), 1),
        ("qwen3, hydra branch", &byte_qwen3(), 1),
    ] {
        let (_va, a) = grpo(cfg, unfrozen, 21);
        let (_vb, b) = grpo(cfg, unfrozen, 21);
        let (logs_a, params_a, store_a) = run(a);
        let (logs_b, params_b, store_b) = run(b.with_shared_prompts(false));
        assert_eq!(logs_a.len(), 4, "{name}");
        let logs_a: Vec<_> = logs_a.iter().map(without_times).collect();
        let logs_b: Vec<_> = logs_b.iter().map(without_times).collect();
        assert_eq!(logs_a, logs_b, "{name}");
        for (x, y) in params_a.iter().zip(&params_b) {
            assert!(x.equal(y), "{name}");
        }
        let keys = store_a.keys(KeysOptions::nested_leaves());
        assert_eq!(keys, store_b.keys(KeysOptions::nested_leaves()));
        for key in keys {
            let (x, y) = (
                store_a.get(key.clone()).unwrap(),
                store_b.get(key.clone()).unwrap(),
            );
            assert!(x.equal(y), "{name}: {key:?}");
        }
    }
}
