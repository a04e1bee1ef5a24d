//! The frozen trunk's output taken from the generation instead of recomputed.
//!
//! [`GenerateOptions::capture_block_input`] keeps the hidden state entering a block at every
//! position of the decode (prompt pass, each step, and one extra step for the last token).
//! On GPT-2 and a Qwen3-shaped model (rotary, grouped-query heads), greedy and sampled, with
//! left padding, prompt groups and finished rows compacted (EOS chosen so that a quarter of the
//! rows end early) or kept:
//! - the tokens, masks and log-probs are those of the decode without it;
//! - the kept states equal a forward over the finished sequences
//!   ([`CausalLm::forward_to_block`]) to 1e-5 at every position the decode fed (the attention
//!   mask keeps it and the next one: a row's last token is never fed), and the last position
//!   holds zeros.
//!
//! The RLHF rollouts hand it to the hydra model's scoring pass
//! ([`OnPolicyTrainer::with_trunk_from_generation`], on by default). GRPO (the reference's side
//! only) and PPO (the policy's upper blocks and values too) store the same rollout as with
//! the trunk recomputed: tokens and masks identical, reference log-probs, policy log-probs,
//! values and the cached trunk to 1e-5. Two GRPO iterations train alike to 1e-5.
//!
//! [`OnPolicyTrainer::with_trunk_from_generation`]: torchrl::trainers::on_policy::OnPolicyTrainer::with_trunk_from_generation

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};

use torchrl::modules::llm::models::llama::LlamaConfig;
use torchrl::modules::llm::nn::with_init_seed;
use torchrl::modules::llm::{
    generate_greedy, generate_with, ilql_generate_with, ByteTokenizer, CausalLm, CausalLmConfig,
    CausalLmWithHydraValueHead, CausalLmWithIlqlHeads, GenerateOptions, GenerationConfig,
    Gpt2Config, IlqlGenerationConfig, LmInput,
};
use torchrl::trainers::api::Callbacks;
use torchrl::trainers::grpo::GrpoTrainer;
use torchrl::trainers::ppo::PpoRlhfTrainer;
use torchrl::{Generator, TensorDict};

#[path = "common/llm.rs"]
mod llm_fixtures;
use llm_fixtures::{
    build_model, byte_gpt2, byte_qwen3, grouped_prompts, grpo_config, lowercase_env, max_diff,
    scratch, seeded_hydra, tiny_ppo_config, tiny_qwen3, CountingLm,
};

const VOCAB: i64 = 29;
const PAD: i64 = 0;
const G: i64 = 3;

fn gpt2() -> Gpt2Config {
    Gpt2Config::new(VOCAB)
        .with_n_layer(3)
        .with_n_embd(16)
        .with_n_head(2)
        .with_n_positions(24)
}

fn qwen3() -> LlamaConfig {
    tiny_qwen3(VOCAB, 3, 24, 0.3)
}

/// `max |a − b|` over the positions `mask` `[B, T]` keeps (`a`, `b` `[B, T, H]`).
fn masked_diff(a: &Tensor, b: &Tensor, mask: &Tensor) -> f64 {
    assert_eq!(a.size(), b.size());
    let keep = mask.to_kind(Kind::Double).unsqueeze(-1);
    ((a.to_kind(Kind::Double) - b.to_kind(Kind::Double)) * keep)
        .abs()
        .max()
        .double_value(&[])
}

/// The positions a decode fed under `mask` `[B, T]`: kept by the mask and followed by a kept
/// one (a row's last token is never fed).
fn fed(mask: &Tensor) -> Tensor {
    let t = mask.size()[1];
    let next = Tensor::cat(
        &[
            &mask.narrow(1, 1, t - 1),
            &mask.narrow(1, 0, 1).zeros_like(),
        ],
        1,
    );
    mask * next
}

/// The most frequent token of a plain greedy decode's third step: as EOS, it ends a good share
/// of the rows early.
fn frequent_token(model: &dyn CausalLm, ids: &Tensor, mask: &Tensor, steps: i64) -> i64 {
    let probe = generate_greedy(
        model,
        ids,
        Some(mask),
        &GenerationConfig::new(steps).with_pad_token_id(PAD),
        &GenerateOptions::default(),
    )
    .unwrap();
    probe
        .response
        .select(1, 2)
        .bincount::<Tensor>(None, VOCAB)
        .argmax(0, false)
        .int64_value(&[])
}

fn check_capture(model: &dyn CausalLm, name: &str) {
    let (ids, mask) = grouped_prompts(&[&[5, 6], &[9, 10, 11, 12], &[13], &[7, 8, 9]], G, PAD);
    let b = ids.size()[0];
    let steps = 10;
    let eos = frequent_token(model, &ids, &mask, steps);
    let n = model.n_layer();
    let hidden = model.facts().hidden_size;
    let configs = [
        (
            "greedy",
            GenerationConfig::new(steps).with_eos_token_id(eos),
        ),
        (
            "sampled",
            GenerationConfig::rlhf_sampling(steps).with_eos_token_id(eos),
        ),
        ("sampled, no EOS", GenerationConfig::rlhf_sampling(steps)),
    ];
    let mut early = 0;
    let mut worst = 0.0f64;
    for groups in [0, G as usize] {
        for keep_finished in [false, true] {
            let plain_opts = GenerateOptions::default()
                .with_prompt_groups(groups)
                .with_keep_finished_rows(keep_finished);
            for block in [0, 1, n] {
                let opts = plain_opts.with_capture_block_input(block);
                for (what, cfg) in &configs {
                    let cfg = cfg.clone().with_pad_token_id(PAD);
                    for seed in 0..2 {
                        let what = format!(
                            "{name}, {what}, groups {groups}, keep {keep_finished}, \
                             block {block}, seed {seed}"
                        );
                        let run = |o: &GenerateOptions<'_>| {
                            let mut rng = Generator::new(seed);
                            generate_with(model, &ids, Some(&mask), &cfg, o, &mut rng).unwrap()
                        };
                        let (plain, kept) = (run(&plain_opts), run(&opts));
                        assert!(plain.block_input.is_none(), "{what}");
                        assert!(kept.sequences.equal(&plain.sequences), "{what}: tokens");
                        assert!(
                            kept.attention_mask.equal(&plain.attention_mask),
                            "{what}: mask"
                        );
                        let d = max_diff(&kept.log_probs, &plain.log_probs);
                        assert!(d <= 1e-5, "{what}: log-probs differ by {d}");
                        let h = kept.block_input.expect("captured");
                        let t = kept.sequences.size()[1];
                        assert_eq!(h.size(), vec![b, t, hidden], "{what}");
                        let input =
                            LmInput::new(&kept.sequences).with_attention_mask(&kept.attention_mask);
                        let again = model.forward_to_block(&input, block).unwrap();
                        let d = masked_diff(&h, &again, &fed(&kept.attention_mask));
                        assert!(d <= 1e-5, "{what}: block input differs by {d}");
                        // the last position was never fed
                        let last = h.select(1, t - 1).abs().max().double_value(&[]);
                        assert_eq!(last, 0.0, "{what}");
                        worst = worst.max(d);
                        let done_early = kept
                            .response_mask
                            .narrow(1, 0, steps - 2)
                            .logical_not()
                            .any_dim(1, false);
                        early = early.max(done_early.sum(Kind::Int64).int64_value(&[]));
                    }
                }
            }
        }
    }
    eprintln!("{name}: captured against recomputed block inputs, at most {worst:e}");
    // a quarter of the rows done with two or more steps left: the decode compacted
    assert!(
        4 * early >= b,
        "{name}: only {early} of {b} rows finished early"
    );
}

#[test]
fn gpt2_generation_keeps_the_block_inputs_of_a_forward() {
    let (_vs, model) = build_model(&gpt2(), 21);
    check_capture(model.as_ref(), "gpt2");
}

#[test]
fn llama_generation_keeps_the_block_inputs_of_a_forward() {
    let (_vs, model) = build_model(&qwen3(), 22);
    check_capture(model.as_ref(), "qwen3");
}

#[test]
fn a_block_past_the_model_and_ilql_generation_are_refused() {
    let (vs, model) = build_model(&gpt2(), 23);
    let (ids, mask) = grouped_prompts(&[&[5, 6]], 1, PAD);
    let cfg = GenerationConfig::new(3);
    let opts = GenerateOptions::default().with_capture_block_input(4);
    let err = generate_greedy(model.as_ref(), &ids, Some(&mask), &cfg, &opts).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("capture_block_input") && msg.contains("n_layer = 3"),
        "{msg}"
    );
    let ilql = CausalLmWithIlqlHeads::from_model(&vs.root(), model, false, 0.01).unwrap();
    let opts = GenerateOptions::default().with_capture_block_input(1);
    let err = ilql_generate_with(
        &ilql,
        &ids,
        Some(&mask),
        &IlqlGenerationConfig::new(3),
        &opts,
        &mut Generator::new(0),
    )
    .unwrap_err();
    assert!(err.to_string().contains("capture_block_input"), "{err}");
}

// ------------------------------------------------------------------------------ rollouts

/// The stores of two rollouts alike but for the trunk's source (`a` from the generation, `b`
/// recomputed): tokens and masks identical; every float to 1e-5 (the trunk where the mask
/// keeps it). Returns the largest difference.
fn compare_stores(a: &TensorDict, b: &TensorDict, what: &str) -> f64 {
    let mask = a.get(("masks", "all_attention_mask")).unwrap();
    assert!(mask.equal(b.get(("masks", "all_attention_mask")).unwrap()));
    let mut worst = 0.0f64;
    let keys = a.keys(torchrl::tensordict::KeysOptions::nested_leaves());
    assert_eq!(
        keys,
        b.keys(torchrl::tensordict::KeysOptions::nested_leaves()),
        "{what}"
    );
    assert!(a.get(("hydra", "trunk")).is_some(), "{what}: no trunk kept");
    for key in keys {
        let (x, y) = (a.get(key.clone()).unwrap(), b.get(key.clone()).unwrap());
        if !x.is_floating_point() {
            assert!(x.equal(y), "{what}: {key:?}");
            continue;
        }
        // the states of positions the attention mask drops (left padding; after a row's EOS,
        // fed the pad id under a mask of ones while decoding) and of each row's last token
        // (never fed) differ, and nothing reads them; the values are aligned to the tokens
        // (`values[t]` from the state at `t − 1`)
        let d = match x.dim() {
            3 => masked_diff(x, y, &fed(mask)),
            2 if key == "values" => {
                let kept = mask.narrow(1, 0, 1).ones_like();
                let before = Tensor::cat(&[&kept, &mask.narrow(1, 0, mask.size()[1] - 1)], 1);
                masked_diff(&x.unsqueeze(-1), &y.unsqueeze(-1), &(mask * before))
            }
            _ => max_diff(x, y),
        };
        assert!(d <= 1e-5, "{what}: {key:?} differs by {d}");
        worst = worst.max(d);
    }
    worst
}

/// A hydra policy as [`seeded_hydra`] draws it (one unfrozen block), on a model that counts
/// the tokens its trunk embeds.
fn counting_hydra(
    cfg: &dyn CausalLmConfig,
    seed: u64,
) -> (VarStore, CausalLmWithHydraValueHead, Arc<AtomicI64>) {
    let vs = VarStore::new(Device::Cpu);
    let tokens = Arc::new(AtomicI64::new(0));
    let m = with_init_seed(seed, || {
        let inner = cfg.build(&vs.root())?;
        let counting: Box<dyn CausalLm> = Box::new(CountingLm {
            inner,
            tokens: tokens.clone(),
        });
        CausalLmWithHydraValueHead::from_model(&vs.root(), counting, 1)
    })
    .unwrap();
    (vs, m, tokens)
}

/// After a rollout of `a` (trunk from the generation) and `b` (recomputed): the stores agree
/// ([`compare_stores`]) and `b` embedded one more pass over the sequences.
fn check_rollout(
    (a, ta): (&TensorDict, &AtomicI64),
    (b, tb): (&TensorDict, &AtomicI64),
    what: &str,
) {
    let d = compare_stores(a, b, what);
    eprintln!("{what}: at most {d:e}");
    let full = a.get(("tokens", "full")).unwrap().size();
    let (ea, eb) = (ta.swap(0, Ordering::Relaxed), tb.swap(0, Ordering::Relaxed));
    assert_eq!(
        eb - ea,
        full[0] * full[1],
        "{what}: embedded {ea} against {eb}"
    );
}

#[test]
fn grpo_and_ppo_rollouts_take_the_trunk_from_the_generation() {
    let cases: [(&str, &dyn CausalLmConfig); 2] =
        [("gpt2", &byte_gpt2()), ("qwen3", &byte_qwen3())];
    for (name, cfg) in cases {
        // GRPO: the sampler's log-probs, the reference's side alone above the trunk
        let dir = scratch("trunk-capture", &format!("grpo-{name}"));
        let mk = |from_generation: bool| {
            let (vs, m, count) = counting_hydra(cfg, 7);
            let c = grpo_config(&dir, 3e-3, 8);
            let t = GrpoTrainer::new(c, m, lowercase_env(cfg, 4), Box::new(ByteTokenizer::new()))
                .unwrap()
                .with_trunk_from_generation(from_generation);
            (vs, t, count)
        };
        let ((_va, mut a, ca), (_vb, mut b, cb)) = (mk(true), mk(false));
        for round in 0..2 {
            a.make_experience().unwrap();
            b.make_experience().unwrap();
            check_rollout(
                (a.store().unwrap(), &ca),
                (b.store().unwrap(), &cb),
                &format!("{name}, GRPO rollout {round}"),
            );
        }
        // PPO: the policy's upper blocks, LM head and value head above the trunk too
        let dir = scratch("trunk-capture", &format!("ppo-{name}"));
        let mk = |from_generation: bool| {
            let (vs, m, count) = counting_hydra(cfg, 8);
            let env = lowercase_env(cfg, 1);
            let t = PpoRlhfTrainer::new(
                tiny_ppo_config(&dir),
                m,
                env,
                Box::new(ByteTokenizer::new()),
            )
            .unwrap()
            .with_trunk_from_generation(from_generation);
            (vs, t, count)
        };
        let ((_va, mut a, ca), (_vb, mut b, cb)) = (mk(true), mk(false));
        a.make_experience().unwrap();
        b.make_experience().unwrap();
        let (sa, sb) = (a.store().unwrap(), b.store().unwrap());
        assert!(sa.get("values").is_some(), "{name}: PPO stores values");
        check_rollout((sa, &ca), (sb, &cb), &format!("{name}, PPO rollout"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn grpo_trains_alike_with_the_trunk_from_the_generation() {
    let dir = scratch("trunk-capture", "train");
    let mk = |from_generation: bool| {
        let (vs, m) = seeded_hydra(&byte_qwen3(), 9, 1);
        let t = GrpoTrainer::new(
            grpo_config(&dir, 1e-2, 8),
            m,
            lowercase_env(&byte_qwen3(), 4),
            Box::new(ByteTokenizer::new()),
        )
        .unwrap()
        .with_trunk_from_generation(from_generation);
        (vs, t)
    };
    let ((_va, mut a), (_vb, mut b)) = (mk(true), mk(false));
    let mut cb = Callbacks::new();
    for step in 0..2 {
        let (x, y) = (a.iteration(&mut cb).unwrap(), b.iteration(&mut cb).unwrap());
        assert!(
            (x.score - y.score).abs() <= 1e-5,
            "step {step}: {} vs {}",
            x.score,
            y.score
        );
        assert!(
            (x.kl - y.kl).abs() <= 1e-5,
            "step {step}: kl {} vs {}",
            x.kl,
            y.kl
        );
    }
    let params = |t: &GrpoTrainer| -> Vec<Tensor> {
        let m = t.model().policy().model();
        m.named_parameters()
            .into_iter()
            .map(|(_, p)| p.detach().copy())
            .collect()
    };
    for (x, y) in params(&a).iter().zip(&params(&b)) {
        let d = max_diff(x, y);
        assert!(d <= 1e-5, "parameters differ by {d}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
