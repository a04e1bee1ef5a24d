//! Smoke runs of the training examples (`examples/ppo_pendulum.rs`, `examples/reward_model.rs`,
//! `examples/sac_pendulum.rs`, the flagship `examples/rlhf/`)
//! with tiny settings: their `run` functions are compiled in here, so the examples cannot rot
//! and their seeding stays deterministic. The full runs (`cargo run --release --example ...`)
//! check that learning happens; these only check that everything runs end to end.

#[allow(dead_code)]
#[path = "../examples/ppo_pendulum.rs"]
mod ppo_pendulum;

#[allow(dead_code)]
#[path = "../examples/reward_model.rs"]
mod reward_model;

#[allow(dead_code)]
#[path = "../examples/sac_pendulum.rs"]
mod sac_pendulum;

#[allow(dead_code)]
#[path = "../examples/rlhf/main.rs"]
mod rlhf;

use std::sync::Mutex;

/// The examples seed libtorch's global RNG (weight initialisation): run them one at a time.
static GLOBAL_RNG: Mutex<()> = Mutex::new(());

#[test]
fn ppo_pendulum_smoke_run_is_deterministic() -> torchrl::Result<()> {
    let _lock = GLOBAL_RNG.lock().unwrap_or_else(|e| e.into_inner());
    // 2 pendulums, 2 batches of one 200-step episode each: 60 gradient steps per batch.
    let cfg = ppo_pendulum::Config {
        frames: 800,
        seed: 3,
        envs: 2,
        quiet: true,
    };
    let a = ppo_pendulum::run(&cfg)?;
    assert_eq!(a.frames, 800);
    for r in [
        a.first_train_return,
        a.last_train_return,
        a.random_return,
        a.untrained_return,
        a.trained_return,
    ] {
        // Pendulum's reward is in [-16.3, 0] per step, 200 steps per episode.
        assert!(r.is_finite() && (-3300.0..=0.0).contains(&r), "{a:?}");
    }
    let b = ppo_pendulum::run(&cfg)?;
    assert_eq!(a, b, "same seed, same run");
    Ok(())
}

/// SAC on Pendulum learns (the replay buffer once stored `[envs, T]` collector batches as
/// `envs` trajectories, the example never left its warm-up, and "after" equalled "before"
/// without any test noticing): seed 0 reaches a mean deterministic return of -200 within
/// 4,000 frames (2,048 in release on this seed; the run is deterministic).
#[test]
fn sac_pendulum_smoke_run_reaches_minus_200() -> torchrl::Result<()> {
    let _lock = GLOBAL_RNG.lock().unwrap_or_else(|e| e.into_inner());
    let cfg = sac_pendulum::Config {
        frames: 4_000,
        seed: 0,
        quiet: true,
        target_return: Some(-200.0),
    };
    let s = sac_pendulum::run(&cfg)?;
    let (at, _) = s
        .reached
        .unwrap_or_else(|| panic!("-200 not reached: {s:?}"));
    assert!(at <= 4_000, "{s:?}");
    // the untrained policy is far below (the same evaluation episodes)
    assert!(s.before < -1_000.0 && s.after >= -200.0, "{s:?}");
    Ok(())
}

#[test]
fn reward_model_smoke_run_learns() -> torchrl::Result<()> {
    let _lock = GLOBAL_RNG.lock().unwrap_or_else(|e| e.into_inner());
    let cfg = reward_model::Config {
        epochs: 3,
        pairs: 1024,
        seed: 1,
        verbose: false,
    };
    let s = reward_model::run(&cfg)?;
    assert_eq!(s.epochs.len(), 3);
    assert!(
        s.test_accuracy > 0.7 && s.test_accuracy > s.initial_test_accuracy,
        "{s:?}"
    );
    assert!(s.test_loss < s.initial_test_loss, "{s:?}");
    Ok(())
}

#[test]
fn rlhf_flagship_smoke_run_writes_its_outputs_and_resumes() -> torchrl::Result<()> {
    let _lock = GLOBAL_RNG.lock().unwrap_or_else(|e| e.into_inner());
    let out = std::env::temp_dir().join(format!("torchrl-rlhf-smoke-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let cfg = rlhf::Config {
        out: out.clone(),
        quiet: true,
        sft_steps: 20,
        corpus: 256,
        rm_steps: 20,
        pairs: 256,
        test_pairs: 64,
        iterations: 2,
        rollouts: 16,
        eval_prompts: 16,
        batch: 8,
        ilql_samples: 32,
        ilql_epochs: 1,
        dpo_epochs: 1,
        ..rlhf::Config::default()
    };
    let s = rlhf::run(&cfg)?;
    assert_eq!(s.rows.len(), 2);
    // the comparison table: SFT, PPO, GRPO, DPO, ILQL, each scored on the held-out prompts
    let names: Vec<&str> = s.methods.iter().map(|m| m.method.as_str()).collect();
    assert_eq!(names.len(), 5, "{names:?}");
    assert!(names[1].starts_with("PPO") && names[2] == "GRPO" && names[3] == "DPO");
    assert!(names[4].starts_with("ILQL"), "{names:?}");
    assert_eq!(s.methods[0].score, s.score_before);
    assert_eq!(s.methods[1].score, s.score_after);
    for m in &s.methods {
        assert!((0.0..=1.0).contains(&m.score), "{m:?}");
        // an exact KL is never negative (float noise aside)
        assert!(m.kl.is_finite() && m.kl > -1e-4, "{m:?}");
    }
    assert!((0.0..=1.0).contains(&s.dpo_test_accuracy), "{s:?}");
    assert!(s.sft_loss_last < s.sft_loss_first, "{s:?}");
    assert!((0.0..=1.0).contains(&s.rm_test_accuracy), "{s:?}");
    // the first iteration's KL to the (identical) reference is exactly zero
    assert_eq!(s.rows[0].kl, 0.0);
    for r in &s.rows {
        assert!(
            (0.0..=1.0).contains(&r.true_score) && r.loss.is_finite(),
            "{r:?}"
        );
    }
    for f in [
        "rlhf_log.csv",
        "rlhf_curves.png",
        "sft/config.json",
        "reward_model/model.safetensors",
    ] {
        assert!(out.join(f).exists(), "{f}");
    }
    let csv = std::fs::read_to_string(out.join("rlhf_log.csv")).unwrap();
    assert_eq!(csv.lines().count(), 3, "{csv}");
    // --resume: two more iterations from the last checkpoint, reusing the SFT and reward model;
    // the log keeps the first run's rows
    let resumed = rlhf::run(&rlhf::Config {
        resume: true,
        iterations: 4,
        ..cfg
    })?;
    assert_eq!(resumed.rows.len(), 4);
    assert_eq!(resumed.rows[..2], s.rows[..]);
    assert_eq!(resumed.rows[2].iteration, 2);
    let _ = std::fs::remove_dir_all(&out);
    Ok(())
}

/// A summary without its wall times (what a resumed run must reproduce exactly).
fn timeless(s: &rlhf::Summary) -> rlhf::Summary {
    let mut s = s.clone();
    s.seconds = 0.0;
    for r in &mut s.rows {
        r.seconds = 0.0;
    }
    for m in &mut s.methods {
        m.seconds = 0.0;
    }
    s
}

#[test]
fn rlhf_flagship_killed_anywhere_and_resumed_reports_what_an_uninterrupted_run_does(
) -> torchrl::Result<()> {
    let _lock = GLOBAL_RNG.lock().unwrap_or_else(|e| e.into_inner());
    let root = std::env::temp_dir().join(format!("torchrl-rlhf-resume-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let tiny = |out: &str| rlhf::Config {
        iterations: 4,
        checkpoint_every: 2,
        ..tiny_flagship(root.join(out))
    };
    let whole = rlhf::run(&tiny("whole"))?;
    let csv = |out: &str| -> Vec<Vec<String>> {
        let text = std::fs::read_to_string(root.join(out).join("rlhf_log.csv")).unwrap();
        // every column but the wall time
        text.lines()
            .map(|l| l.split(',').take(8).map(str::to_string).collect())
            .collect()
    };
    assert_eq!(csv("whole").len(), 5);
    for (name, at) in [
        ("sft", rlhf::FailAt::SftStep(5)),
        ("ppo", rlhf::FailAt::PpoIteration(3)),
        ("grpo", rlhf::FailAt::Grpo),
    ] {
        let killed = rlhf::Config {
            fail_at: Some(at),
            ..tiny(name)
        };
        let err = rlhf::run(&killed)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("fail_at"), "{name}: {err}");
        let resumed = rlhf::run(&rlhf::Config {
            resume: true,
            ..tiny(name)
        })?;
        assert_eq!(timeless(&resumed), timeless(&whole), "killed at {at:?}");
        assert_eq!(csv(name), csv("whole"), "killed at {at:?}");
    }
    let _ = std::fs::remove_dir_all(&root);
    Ok(())
}

/// The flagship's tiny settings (every stage runs, a few steps each).
fn tiny_flagship(out: std::path::PathBuf) -> rlhf::Config {
    rlhf::Config {
        out,
        quiet: true,
        sft_steps: 10,
        corpus: 128,
        rm_steps: 10,
        pairs: 128,
        test_pairs: 32,
        iterations: 1,
        rollouts: 16,
        eval_prompts: 16,
        batch: 8,
        ilql_samples: 16,
        ilql_epochs: 1,
        dpo_epochs: 1,
        ..rlhf::Config::default()
    }
}

#[test]
fn rlhf_flagship_runs_from_a_hugging_face_folder_and_on_the_embedded_llama() -> torchrl::Result<()>
{
    use tch::nn::VarStore;
    use torchrl::modules::llm::models::{self, llama::LlamaConfig};
    use torchrl::modules::llm::CausalLm;
    let _lock = GLOBAL_RNG.lock().unwrap_or_else(|e| e.into_inner());
    let root = std::env::temp_dir().join(format!("torchrl-rlhf-folder-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    // a Qwen2-shaped folder (q/k/v biases, 2 kv heads) with the recorded byte-level BPE
    // tokenizer (320 ids: `<|endoftext|>` 0, `<pad>` 1); the config names EOS 0 and pad 1
    let model_dir = root.join("qwen2");
    let config: LlamaConfig = serde_json::from_value(serde_json::json!({
        "model_type": "qwen2", "vocab_size": 320, "hidden_size": 32,
        "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "max_position_embeddings": 64, "tie_word_embeddings": true,
        "rope_theta": 10000.0, "eos_token_id": 0, "pad_token_id": 1
    }))
    .unwrap();
    let vs = VarStore::new(tch::Device::Cpu);
    torchrl::modules::llm::models::llama::LlamaModel::new(&vs.root(), &config)?
        .save_pretrained(&model_dir)?;
    let tokenizer = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/specs/tokenizer/tokenizer.json"
    );
    std::fs::copy(tokenizer, model_dir.join("tokenizer.json")).unwrap();

    let cfg = rlhf::Config {
        model: Some(model_dir.clone()),
        ..tiny_flagship(root.join("out"))
    };
    let tok = cfg.tokenizer()?;
    assert_eq!((tok.eos_token_id(), tok.pad_token_id()), (Some(0), Some(1)));
    // BPE, not bytes: "kqz:" is not four ids of the byte tokenizer's
    assert_ne!(tok.encode("kqz:")?, vec![107, 113, 122, 58]);
    let s = rlhf::run(&cfg)?;
    assert_eq!(s.methods.len(), 5);
    assert!(s.sft_loss_last < s.sft_loss_first, "{s:?}");
    for m in &s.methods {
        assert!((0.0..=1.0).contains(&m.score), "{m:?}");
    }
    // the SFT and reward-model folders are Qwen2 folders with the tokenizer beside them
    for stage in ["sft", "reward_model"] {
        let dir = root.join("out").join(stage);
        assert!(dir.join("tokenizer.json").exists(), "{stage}");
        let facts = models::config_from_file(&dir.join("config.json"))?.facts();
        assert_eq!(
            (facts.model_type.as_str(), facts.vocab_size),
            ("qwen2", 320)
        );
    }
    let vs = VarStore::new(tch::Device::Cpu);
    let sft = models::from_pretrained(&vs.root(), root.join("out/sft"))?;
    assert_eq!(sft.facts().hidden_size, 32);

    // a config whose EOS id the tokenizer lacks is refused by name
    let mut json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(model_dir.join("config.json")).unwrap())
            .unwrap();
    json["eos_token_id"] = serde_json::json!(999);
    json["vocab_size"] = serde_json::json!(1000);
    std::fs::write(model_dir.join("config.json"), json.to_string()).unwrap();
    let err = cfg
        .tokenizer()
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        err.contains("999") && err.contains("tokenizer.json"),
        "{err}"
    );

    // the embedded Llama runs every stage too, PPO / GRPO / DPO with LoRA (`--lora 4`)
    let s = rlhf::run(&rlhf::Config {
        arch: rlhf::Arch::Llama,
        lora: Some(4),
        ..tiny_flagship(root.join("llama"))
    })?;
    assert_eq!(s.methods.len(), 5);
    let facts = models::config_from_file(&root.join("llama/sft/config.json"))?.facts();
    assert_eq!((facts.model_type.as_str(), facts.n_layer), ("llama", 2));
    let _ = std::fs::remove_dir_all(&root);
    Ok(())
}
