//! What the rollout no longer recomputes (issue 27, item 2).
//!
//! Generation with [`GenerateOptions::prompt_groups`]: the prompt pass of `g` identical
//! consecutive rows runs once and its KV cache is repeated to the group. Greedy and sampled
//! tokens are identical to the ungrouped generation (same seed), with and without left
//! padding, on GPT-2 and on a Llama-family model (rotary, grouped-query heads); log-probs agree
//! to 1e-6; groups whose rows differ are an error. The token env's policy
//! ([`GenerationPolicy::with_prompt_groups`]) writes the same rollout either way, and the GRPO
//! trainer (which shares its groups' prompts by default) trains bitwise as without sharing.
//!
//! The rollout's policy log-probs taken from the sampler when they are the model's
//! ([`GenerationConfig::log_probs_are_the_models`]): the hydra model's reference side alone
//! ([`CausalLmWithHydraValueHead::forward_reference`]) equals what `forward` gives of it; the
//! GRPO rollout's stored log-probs equal the recomputed ones to 1e-5 on every response token,
//! masked alike, 0 on the prompt; a training run agrees with the recomputing one to 1e-5; a
//! tempered sampler falls back to the recomputation.
//!
//! Finished rows compacted out of the decode (the default) give what decoding every row to the
//! end gives ([`GenerateOptions::keep_finished_rows`]): the same tokens and masks, log-probs to
//! 1e-5, on GPT-2 and the Llama family. The reward model runs a group's shared prefix once
//! ([`CausalLmWithScoreHead::forward_grouped`], what [`RewardModelScorer`] does with grouped
//! prompts): the same scores to 1e-5, with the trunk's embedded tokens counted to show the prefix
//! ran once per group and stopped where the rows differ or a score is read.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};

use torchrl::envs::llm::scorer::{ScoreInput, Scorer};
use torchrl::envs::llm::{
    GenerationPolicy, RewardModelScorer, TokenEnv, TokenEnvConfig, TokenScorer,
};
use torchrl::envs::EnvBase;
use torchrl::modules::llm::lora::inject_adapter;
use torchrl::modules::llm::models::llama::LlamaConfig;
use torchrl::modules::llm::nn::with_init_seed;
use torchrl::modules::llm::{
    generate_greedy, generate_with, ilql_generate_with, ByteTokenizer, CausalLm, CausalLmConfig,
    CausalLmWithHydraValueHead, CausalLmWithIlqlHeads, CausalLmWithScoreHead, GenerateOptions,
    GenerationConfig, GenerationOutput, Gpt2Config, IlqlGenerationConfig, LmInput, LoraConfig,
};
use torchrl::tensordict::KeysOptions;
use torchrl::trainers::api::{Callbacks, Stats};
use torchrl::trainers::grpo::{GrpoTrainer, GrpoTrlConfig};
use torchrl::{Error, Generator, TensorDict};

#[path = "common/llm.rs"]
mod llm_fixtures;
use llm_fixtures::{
    build_model, byte_gpt2, byte_qwen3, grouped_prompts, grpo_config, lowercase, max_diff,
    seeded_hydra, tiny_qwen3, CountingLm,
};

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

/// The tiny Qwen3-shaped model on [`VOCAB`] tokens: 2 blocks, 24 positions, initializer range
/// 0.3.
fn qwen3() -> LlamaConfig {
    tiny_qwen3(VOCAB, 2, 24, 0.3)
}

fn build(cfg: &dyn CausalLmConfig, seed: u64) -> (VarStore, Box<dyn CausalLm>) {
    build_model(cfg, seed)
}

/// Each of `prompts` left-padded with [`PAD`] and repeated in `g` consecutive rows.
fn grouped(prompts: &[&[i64]], g: i64) -> (Tensor, Tensor) {
    grouped_prompts(prompts, g, PAD)
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

/// A GRPO trainer on `model_cfg` (a fresh model from `seed`, `unfrozen` top layers trained),
/// groups of 4, two minibatches per rollout, β > 0 (the reference's log-probs are read).
fn grpo(model_cfg: &dyn CausalLmConfig, unfrozen: i64, seed: u64) -> (VarStore, GrpoTrainer) {
    grpo_with(model_cfg, unfrozen, seed, |_| {})
}

/// [`grpo`] with the config changed by `edit`.
fn grpo_with(
    model_cfg: &dyn CausalLmConfig,
    unfrozen: i64,
    seed: u64,
    edit: impl FnOnce(&mut GrpoTrlConfig),
) -> (VarStore, GrpoTrainer) {
    let (vs, model) = seeded_hydra(model_cfg, seed, unfrozen);
    let dir = std::env::temp_dir().join(format!("torchrl-rollout-reuse-{}", std::process::id()));
    // 8 rollouts per iteration at a constant 3e-3, minibatches of 4, the KL term on
    let mut c = grpo_config(&dir, 3e-3, 8);
    c.train.batch_size = 4;
    c.method.beta = 0.05;
    edit(&mut c);
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

/// Whether two float tensors agree to `tol` relative to their scale (integer and bool tensors,
/// such as tokens and masks, must be equal).
fn close(x: &Tensor, y: &Tensor, tol: f64) -> bool {
    if x.size() != y.size() || x.kind() != y.kind() {
        return false;
    }
    if !x.is_floating_point() {
        return x.equal(y);
    }
    let (x, y) = (x.to_kind(Kind::Double), y.to_kind(Kind::Double));
    let scale = x.abs().max().double_value(&[]).max(1.0);
    (x - y).abs().max().double_value(&[]) <= tol * scale
}

/// GRPO with the prompt pass shared per group trains as without it. With one libtorch thread
/// the two runs are bitwise equal; with several, libtorch may split the prompt pass's matmuls
/// differently for one row per group and for every row (seen on a 2-core AMD EPYC: ESS
/// 1.0000003 against 1.0000001), so the tokens must be identical and every logged value,
/// parameter and stored float agree to 1e-5 of its scale.
#[test]
fn grpo_trains_alike_with_shared_prompts() {
    const TOL: f64 = 1e-5;
    let cases: [(&str, &dyn CausalLmConfig, i64, bool); 5] = [
        ("gpt2, full reference", &byte_gpt2(), -1, true),
        ("gpt2, hydra branch", &byte_gpt2(), 1, true),
        ("qwen3, hydra branch", &byte_qwen3(), 1, true),
        ("gpt2, recomputed log-probs", &byte_gpt2(), 1, false),
        ("qwen3, recomputed log-probs", &byte_qwen3(), -1, false),
    ];
    for (name, cfg, unfrozen, sampler) in cases {
        let (_va, a) = grpo(cfg, unfrozen, 21);
        let (_vb, b) = grpo(cfg, unfrozen, 21);
        let a = a.with_sampler_log_probs(sampler);
        let b = b.with_sampler_log_probs(sampler).with_shared_prompts(false);
        let (logs_a, params_a, store_a) = run(a);
        let (logs_b, params_b, store_b) = run(b);
        assert_eq!(logs_a.len(), 4, "{name}");
        for (la, lb) in logs_a.iter().zip(&logs_b) {
            let (la, lb) = (without_times(la), without_times(lb));
            assert_eq!(la.len(), lb.len(), "{name}");
            for ((ka, va), (kb, vb)) in la.iter().zip(&lb) {
                assert_eq!(ka, kb, "{name}");
                assert!(
                    (va - vb).abs() <= TOL * va.abs().max(1.0),
                    "{name}: {ka} {va} vs {vb}"
                );
            }
        }
        for (x, y) in params_a.iter().zip(&params_b) {
            assert!(close(x, y, TOL), "{name}");
        }
        let keys = store_a.keys(KeysOptions::nested_leaves());
        assert_eq!(keys, store_b.keys(KeysOptions::nested_leaves()));
        for key in keys {
            let (x, y) = (
                store_a.get(key.clone()).unwrap(),
                store_b.get(key.clone()).unwrap(),
            );
            assert!(close(x, y, TOL), "{name}: {key:?}");
        }
    }
}

// ------------------------------------------------------------------------------ sampler log-probs

/// A left-padded batch of byte tokens and its mask.
fn byte_batch() -> (Tensor, Tensor) {
    let ids = Tensor::from_slice(&[0i64, 0, 97, 98, 99, 100, 101, 102, 103, 104, 105, 106]);
    let mask = Tensor::from_slice(&[0i64, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]);
    (ids.view([2, 6]), mask.view([2, 6]))
}

fn check_reference_side(m: &CausalLmWithHydraValueHead, what: &str) {
    let (ids, mask) = byte_batch();
    let input = LmInput::new(&ids).with_attention_mask(&mask);
    let full = m.forward(&input).unwrap();
    let reference = m.forward_reference(&input).unwrap();
    assert!(reference.ref_logits.equal(&full.ref_logits), "{what}");
    match (&reference.trunk, &full.trunk) {
        (Some(a), Some(b)) => assert!(a.equal(b), "{what}"),
        (None, None) => {}
        _ => panic!("{what}: the trunk is not forward's"),
    }
    assert!(
        m.forward_hydra(&input).unwrap().equal(&full.ref_logits),
        "{what}"
    );
}

#[test]
fn forward_reference_is_what_forward_gives_of_the_reference() {
    let models: [(&str, &dyn CausalLmConfig); 2] =
        [("gpt2", &byte_gpt2()), ("qwen3", &byte_qwen3())];
    for (name, cfg) in models {
        for unfrozen in [-1, 0, 1, 2] {
            let vs = VarStore::new(Device::Cpu);
            let m = with_init_seed(5, || {
                CausalLmWithHydraValueHead::new(&vs.root(), cfg, unfrozen)
            })
            .unwrap();
            check_reference_side(&m, &format!("{name}, num_layers_unfrozen {unfrozen}"));
        }
        let vs = VarStore::new(Device::Cpu);
        let m = with_init_seed(5, || {
            let mut model = cfg.build(&vs.root())?;
            inject_adapter(model.as_mut(), &(vs.root() / "lora"), &LoraConfig::new(2))?;
            CausalLmWithHydraValueHead::with_adapters_off_reference(&vs.root(), model)
        })
        .unwrap();
        // move the adapters so that the policy is not its reference
        for (n, p) in m.policy().model().adapter_parameters() {
            if n.ends_with("lora_B.weight") {
                tch::no_grad(|| {
                    let _ = p.shallow_clone().fill_(0.3);
                });
            }
        }
        check_reference_side(&m, &format!("{name}, adapters off"));
    }
}

#[test]
fn the_sampler_log_probs_are_the_models_only_when_exact() {
    let cfg = byte_qwen3();
    let vs = VarStore::new(Device::Cpu);
    let mut model = with_init_seed(5, || cfg.build(&vs.root())).unwrap();
    let rlhf = GenerationConfig::rlhf_sampling(4);
    assert!(rlhf.log_probs_are_the_models(model.as_ref()));
    // greedy decoding ignores the temperature
    let greedy = GenerationConfig::new(4).with_temperature(0.5);
    assert!(greedy.log_probs_are_the_models(model.as_ref()));
    let hot = rlhf.clone().with_temperature(1.5);
    assert!(!hot.log_probs_are_the_models(model.as_ref()));
    // warpers act after the log-probs
    let warped = rlhf.clone().with_top_k(5).with_top_p(0.5);
    assert!(warped.log_probs_are_the_models(model.as_ref()));
    // LoRA dropout counts while the adapters train
    let lora = LoraConfig::new(2).with_lora_dropout(0.1);
    let switch = inject_adapter(model.as_mut(), &(vs.root() / "lora"), &lora).unwrap();
    assert!(rlhf.log_probs_are_the_models(model.as_ref()));
    switch.set_training(true);
    assert!(!rlhf.log_probs_are_the_models(model.as_ref()));
    switch.set_training(false);
    assert!(rlhf.log_probs_are_the_models(model.as_ref()));
}

/// The rollout stores of two trainers alike but for the sampler's log-probs (`a`) against
/// the recomputed ones (`b`): the same rollout, the log-probs equal on the response tokens
/// to `1e-5` and masked alike, 0 on the prompt, no values. Returns the largest difference.
fn compare_rollouts(a: &mut GrpoTrainer, b: &mut GrpoTrainer, what: &str) -> f64 {
    a.make_experience().unwrap();
    b.make_experience().unwrap();
    let (sa, sb) = (a.store().unwrap(), b.store().unwrap());
    for key in [
        ("tokens", "full"),
        ("masks", "all_attention_mask"),
        ("masks", "all_assistant_mask"),
        ("ref_log_probs", "full"),
    ] {
        let (x, y) = (sa.get(key).unwrap(), sb.get(key).unwrap());
        assert!(x.equal(y), "{what}: {key:?}");
    }
    assert!(sa
        .get("advantage")
        .unwrap()
        .equal(sb.get("advantage").unwrap()));
    match (sa.get(("hydra", "trunk")), sb.get(("hydra", "trunk"))) {
        (Some(x), Some(y)) => assert!(x.equal(y), "{what}: trunk"),
        (None, None) => {}
        _ => panic!("{what}: the trunk is kept on one path only"),
    }
    assert!(sa.get("values").is_none(), "{what}");
    assert!(sb.get("values").is_some(), "{what}");
    let (lpa, lpb) = (
        sa.get(("log_probs", "full")).unwrap(),
        sb.get(("log_probs", "full")).unwrap(),
    );
    assert_eq!(lpa.size(), lpb.size(), "{what}");
    assert_eq!(lpa.kind(), lpb.kind(), "{what}");
    let p = sa.get(("tokens", "prompt")).unwrap().size()[1];
    let t = lpa.size()[1];
    // the prompt: none from the sampler
    assert_eq!(
        lpa.narrow(1, 0, p).abs().max().double_value(&[]),
        0.0,
        "{what}"
    );
    // the response: the recomputed values to rounding, zero exactly where they are masked
    let (ra, rb) = (lpa.narrow(1, p, t - p), lpb.narrow(1, p, t - p));
    let d = max_diff(&ra, &rb);
    assert!(d <= 1e-5, "{what}: the log-probs differ by {d}");
    assert!(ra.eq(0.0).equal(&rb.eq(0.0)), "{what}: masked differently");
    let assistant = sa.get(("masks", "all_assistant_mask")).unwrap();
    let live = assistant.narrow(1, p, t - p).ne(0);
    assert!(
        live.equal(&rb.ne(0.0)),
        "{what}: a live token without a log-prob"
    );
    d
}

#[test]
fn the_rollout_takes_the_samplers_log_probs_to_rounding() {
    let cases: [(&str, &dyn CausalLmConfig, i64); 4] = [
        ("gpt2, full reference", &byte_gpt2(), -1),
        ("gpt2, hydra branch", &byte_gpt2(), 1),
        ("qwen3, hydra branch", &byte_qwen3(), 1),
        ("qwen3, full reference", &byte_qwen3(), -1),
    ];
    for (name, cfg, unfrozen) in cases {
        let (_va, mut a) = grpo(cfg, unfrozen, 31);
        let (_vb, b) = grpo(cfg, unfrozen, 31);
        let mut b = b.with_sampler_log_probs(false);
        for round in 0..2 {
            let d = compare_rollouts(&mut a, &mut b, &format!("{name}, rollout {round}"));
            eprintln!("{name}, rollout {round}: sampler vs recomputed log-probs {d:e}");
        }
    }
}

#[test]
fn grpo_trains_alike_with_the_samplers_log_probs() {
    let cases: [(&str, &dyn CausalLmConfig, i64); 2] = [
        ("gpt2, hydra branch", &byte_gpt2(), 1),
        ("qwen3, full reference", &byte_qwen3(), -1),
    ];
    for (name, cfg, unfrozen) in cases {
        let (_va, a) = grpo(cfg, unfrozen, 41);
        let (_vb, b) = grpo(cfg, unfrozen, 41);
        let (logs_a, params_a, _) = run(a);
        let (logs_b, params_b, _) = run(b.with_sampler_log_probs(false));
        assert_eq!(logs_a.len(), logs_b.len(), "{name}");
        for (step, (x, y)) in logs_a.iter().zip(&logs_b).enumerate() {
            let (x, y) = (without_times(x), without_times(y));
            assert_eq!(x.len(), y.len(), "{name}");
            for ((k, u), (k2, v)) in x.iter().zip(&y) {
                assert_eq!(k, k2);
                let tol = 1e-5 * v.abs().max(1.0);
                assert!((u - v).abs() <= tol, "{name}, step {step}: {k} {u} vs {v}");
            }
        }
        for (x, y) in params_a.iter().zip(&params_b) {
            let d = max_diff(x, y);
            assert!(d <= 1e-5, "{name}: parameters differ by {d}");
        }
    }
}

#[test]
fn the_rollout_recomputes_when_the_sampler_is_not_the_model() {
    // temperature 0.7: the sampler's log-probs are of the tempered distribution, so the
    // rollout recomputes them, as with the switch off (bitwise), and writes the values
    let hot = |c: &mut GrpoTrlConfig| c.method.gen_kwargs.temperature = 0.7;
    let (_va, mut a) = grpo_with(&byte_gpt2(), 1, 51, hot);
    let (_vb, b) = grpo_with(&byte_gpt2(), 1, 51, hot);
    let mut b = b.with_sampler_log_probs(false);
    a.make_experience().unwrap();
    b.make_experience().unwrap();
    let (sa, sb) = (a.store().unwrap(), b.store().unwrap());
    let keys = sa.keys(KeysOptions::nested_leaves());
    assert_eq!(keys, sb.keys(KeysOptions::nested_leaves()));
    assert!(sa.get("values").is_some());
    for key in keys {
        let (x, y) = (sa.get(key.clone()).unwrap(), sb.get(key.clone()).unwrap());
        assert!(x.equal(y), "{key:?}");
    }
}

/// Finished rows compacted away (the default) against every row decoded to the end
/// ([`GenerateOptions::keep_finished_rows`]): the same tokens, masks and log-probs, greedy and
/// sampled, padded, with and without prompt groups. The EOS is the most frequent token of a
/// plain decode's third step, so that at least a quarter of the rows finish with steps left
/// (the compaction rule; checked here from the response masks).
fn check_compaction(model: &dyn CausalLm, name: &str) {
    let (ids, mask) = grouped(&[&[5, 6], &[9, 10, 11, 12], &[13], &[7, 8, 9]], G);
    let b = ids.size()[0];
    let steps = 10;
    let probe = generate_greedy(
        model,
        &ids,
        Some(&mask),
        &GenerationConfig::new(steps).with_pad_token_id(PAD),
        &GenerateOptions::default(),
    )
    .unwrap();
    let eos = probe
        .response
        .select(1, 2)
        .bincount::<Tensor>(None, VOCAB)
        .argmax(0, false)
        .int64_value(&[]);
    let greedy = GenerationConfig::new(steps)
        .with_eos_token_id(eos)
        .with_pad_token_id(PAD);
    let sampled = GenerationConfig::rlhf_sampling(steps)
        .with_eos_token_id(eos)
        .with_pad_token_id(PAD);
    let mut early = 0;
    for groups in [0, G as usize] {
        let compacting = GenerateOptions::default().with_prompt_groups(groups);
        let whole = compacting.with_keep_finished_rows(true);
        let what = format!("{name}, groups {groups}");
        let a = generate_greedy(model, &ids, Some(&mask), &greedy, &compacting).unwrap();
        let c = generate_greedy(model, &ids, Some(&mask), &greedy, &whole).unwrap();
        assert_same_to(&a, &c, 1e-5, &format!("{what}, greedy"));
        // rows done before the last two steps: a quarter or more means the decode compacted
        let done_early = a
            .response_mask
            .narrow(1, 0, steps - 2)
            .logical_not()
            .any_dim(1, false);
        early = early.max(done_early.sum(Kind::Int64).int64_value(&[]));
        for seed in 0..4 {
            let rng = |s| Generator::new(s);
            let a = generate_with(
                model,
                &ids,
                Some(&mask),
                &sampled,
                &compacting,
                &mut rng(seed),
            );
            let c = generate_with(model, &ids, Some(&mask), &sampled, &whole, &mut rng(seed));
            assert_same_to(
                &a.unwrap(),
                &c.unwrap(),
                1e-5,
                &format!("{what}, seed {seed}"),
            );
        }
    }
    assert!(
        4 * early >= b,
        "{name}: only {early} of {b} rows finished early"
    );
}

fn assert_same_to(a: &GenerationOutput, c: &GenerationOutput, tol: f64, what: &str) {
    assert!(a.sequences.equal(&c.sequences), "{what}: sequences");
    assert!(a.response_mask.equal(&c.response_mask), "{what}: mask");
    assert!(a.attention_mask.equal(&c.attention_mask), "{what}");
    let d = max_diff(&a.log_probs, &c.log_probs);
    assert!(d <= tol, "{what}: log-probs differ by {d}");
}

#[test]
fn gpt2_decodes_alike_with_finished_rows_compacted() {
    let (_vs, model) = build(&gpt2(), 11);
    check_compaction(model.as_ref(), "gpt2");
}

#[test]
fn llama_decodes_alike_with_finished_rows_compacted() {
    let (_vs, model) = build(&qwen3(), 12);
    check_compaction(model.as_ref(), "qwen3");
}

// ------------------------------------------------------------------ the reward model's prefix

fn counting_rm(
    cfg: &dyn CausalLmConfig,
    seed: u64,
) -> (VarStore, CausalLmWithScoreHead, Arc<AtomicI64>) {
    let vs = VarStore::new(Device::Cpu);
    let tokens = Arc::new(AtomicI64::new(0));
    let rm = with_init_seed(seed, || {
        let inner = cfg.build(&vs.root())?;
        let counting: Box<dyn CausalLm> = Box::new(CountingLm {
            inner,
            tokens: tokens.clone(),
        });
        CausalLmWithScoreHead::from_model(&vs.root(), counting)
    })
    .unwrap();
    (vs, rm, tokens)
}

/// Grouped left-padded prompts (4 columns) followed by right-padded completions of different
/// lengths (4 columns): the first two completions of each group start alike, the third does
/// not; the last row's completion is one token.
fn scored_batch() -> (Tensor, Tensor, Vec<Vec<i64>>) {
    let (prompt, prompt_mask) = grouped(&[&[5, 6], &[9, 10, 11, 12], &[13]], G);
    let completions: [&[i64]; 9] = [
        &[14, 15, 16, 3],
        &[14, 15, 17],
        &[20, 3],
        &[14, 21, 22, 23],
        &[14, 21],
        &[8, 8, 8, 8],
        &[25, 3],
        &[25, 26, 27],
        &[4],
    ];
    let r = 4;
    let (mut ids, mut mask) = (Vec::new(), Vec::new());
    for c in completions {
        ids.extend(
            c.iter()
                .copied()
                .chain(std::iter::repeat_n(PAD, r - c.len())),
        );
        mask.extend(std::iter::repeat_n(1i64, c.len()));
        mask.extend(std::iter::repeat_n(0i64, r - c.len()));
    }
    let b = completions.len() as i64;
    let ids = Tensor::cat(
        &[
            prompt.shallow_clone(),
            Tensor::from_slice(&ids).view([b, r as i64]),
        ],
        1,
    );
    let mask = Tensor::cat(
        &[
            prompt_mask.shallow_clone(),
            Tensor::from_slice(&mask).view([b, r as i64]),
        ],
        1,
    );
    let prompts = (0..b)
        .map(|i| {
            let row = Vec::<i64>::try_from(prompt.get(i)).unwrap();
            let m = Vec::<i64>::try_from(prompt_mask.get(i)).unwrap();
            row.into_iter()
                .zip(m)
                .filter(|(_, m)| *m == 1)
                .map(|(t, _)| t)
                .collect()
        })
        .collect();
    (ids, mask, prompts)
}

fn check_reward_prefix(cfg: &dyn CausalLmConfig, name: &str) {
    let (_vs, rm, tokens) = counting_rm(cfg, 21);
    let (ids, mask, _) = scored_batch();
    let (b, t) = ids.size2().unwrap();
    let input = LmInput::new(&ids).with_attention_mask(&mask);
    let _guard = tch::no_grad_guard();
    let plain = rm.forward(&input).unwrap();
    assert_eq!(
        tokens.swap(0, Ordering::Relaxed),
        b * t,
        "{name}: the plain forward"
    );
    let shared = rm.forward_grouped(&input, G as usize).unwrap();
    let d = max_diff(&shared, &plain);
    assert!(d <= 1e-5, "{name}: scores differ by {d}");
    // the groups agree on the 4 prompt columns, and no further (rows 5 and 8 differ at once):
    // 3 rows × 4 columns once, then 9 rows × the 4 response columns
    let ran = tokens.swap(0, Ordering::Relaxed);
    assert_eq!(ran, 3 * 4 + b * (t - 4), "{name}: the shared forward");
    // every group's completions start alike: the prefix reaches into the responses, but not
    // past the last row's only response token (its score is read there)
    let alike = ids.copy();
    let _ = alike.get(2).get(4).fill_(14);
    let _ = alike.get(5).get(4).fill_(14);
    let _ = alike.get(8).get(4).fill_(25);
    let check = |ids: &Tensor, mask: &Tensor, prefix: i64, what: &str| {
        let input = LmInput::new(ids).with_attention_mask(mask);
        let plain = rm.forward(&input).unwrap();
        tokens.store(0, Ordering::Relaxed);
        let shared = rm.forward_grouped(&input, G as usize).unwrap();
        let d = max_diff(&shared, &plain);
        assert!(d <= 1e-5, "{name}, {what}: scores differ by {d}");
        let ran = tokens.load(Ordering::Relaxed);
        assert_eq!(ran, 3 * prefix + b * (t - prefix), "{name}, {what}");
    };
    check(&alike, &mask, 4, "capped by the shortest response");
    let longer = mask.copy();
    let _ = longer.get(8).get(5).fill_(1);
    let _ = alike.get(8).get(5).fill_(26);
    check(&alike, &longer, 5, "into the responses");
    // rows of a group that differ in the prompt: the prefix shrinks to where they agree
    let bad = ids.copy();
    let _ = bad.get(4).get(3).fill_(20);
    let input = LmInput::new(&bad).with_attention_mask(&mask);
    let plain = rm.forward(&input).unwrap();
    tokens.store(0, Ordering::Relaxed);
    let shared = rm.forward_grouped(&input, G as usize).unwrap();
    assert!(max_diff(&shared, &plain) <= 1e-5, "{name}: differing rows");
    assert_eq!(
        tokens.load(Ordering::Relaxed),
        3 * 3 + b * (t - 3),
        "{name}"
    );
    // a batch that is not whole groups, and groups of 1: the plain forward
    for (rows, g) in [(8, G as usize), (9, 1)] {
        let ids = ids.narrow(0, 0, rows);
        let mask = mask.narrow(0, 0, rows);
        let input = LmInput::new(&ids).with_attention_mask(&mask);
        tokens.store(0, Ordering::Relaxed);
        let shared = rm.forward_grouped(&input, g).unwrap();
        assert!(
            max_diff(&shared, &rm.forward(&input).unwrap()) <= 1e-6,
            "{name}"
        );
        assert_eq!(
            tokens.load(Ordering::Relaxed),
            2 * rows * t,
            "{name}: {rows} rows"
        );
    }
}

#[test]
fn gpt2_reward_model_runs_a_groups_prefix_once() {
    check_reward_prefix(&gpt2(), "gpt2");
}

#[test]
fn llama_reward_model_runs_a_groups_prefix_once() {
    check_reward_prefix(&qwen3(), "qwen3");
}

#[test]
fn the_reward_scorer_shares_the_prompts_it_is_given() {
    let (_vs, rm, tokens) = counting_rm(&gpt2(), 22);
    let (ids, mask, prompts) = scored_batch();
    let (b, t) = ids.size2().unwrap();
    let responses: Vec<Vec<i64>> = vec![vec![]; b as usize];
    let ended = vec![false; b as usize];
    let input = ScoreInput {
        prompts: &prompts,
        responses: &responses,
        ended_with_eos: &ended,
        tokens: &ids,
        attention_mask: &mask,
        batch_size: b,
    };
    let mut scorer = RewardModelScorer::new(rm);
    let shared = scorer.score(&input).unwrap();
    assert_eq!(tokens.swap(0, Ordering::Relaxed), 3 * 4 + b * (t - 4));
    let mut scorer = scorer.with_shared_prompts(false);
    let plain = scorer.score(&input).unwrap();
    assert_eq!(tokens.swap(0, Ordering::Relaxed), b * t);
    assert!(max_diff(&shared, &plain) <= 1e-5);
    // prompts that do not come in whole groups are scored row by row
    let mut uneven = prompts.clone();
    uneven[8] = vec![99];
    let mut scorer = scorer.with_shared_prompts(true);
    let input = ScoreInput {
        prompts: &uneven,
        ..input
    };
    let again = scorer.score(&input).unwrap();
    assert_eq!(tokens.swap(0, Ordering::Relaxed), b * t);
    assert!(max_diff(&again, &plain) <= 1e-6);
}
