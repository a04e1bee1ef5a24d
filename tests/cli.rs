//! The `torchrl` command line end to end on the embedded arithmetic example
//! (`examples/arithmetic/`): SFT from a config-only folder, evaluation with a verifiable
//! reward, GRPO, DPO, the reward model, ILQL and generation; `--resume` continuing exactly;
//! `--help` for every subcommand; bad input refused before an output folder appears.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use tch::{nn, Device, Kind};
use torchrl::cli::{self, sft::TrainSettings};
use torchrl::modules::llm::models;

const EXAMPLE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/arithmetic");

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("torchrl-cli-{name}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    dir
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    fs::write(&p, text).unwrap();
    p
}

fn run(args: &[&str]) -> torchrl::Result<()> {
    let mut all = vec!["torchrl"];
    all.extend_from_slice(args);
    cli::main_with_args(all)
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The first `n` lines of a JSONL file of the example, as a new file.
fn head(dir: &Path, name: &str, n: usize) -> PathBuf {
    let text = fs::read_to_string(Path::new(EXAMPLE).join(name)).unwrap();
    let lines: Vec<&str> = text.lines().take(n).collect();
    write(dir, name, &(lines.join("\n") + "\n"))
}

fn weights(dir: &Path) -> Vec<(String, Vec<f32>)> {
    let vs = nn::VarStore::new(Device::Cpu);
    let model = models::from_pretrained(&vs.root(), dir).unwrap();
    let mut out: Vec<(String, Vec<f32>)> = model
        .named_parameters()
        .into_iter()
        .map(|(n, t)| {
            let v = Vec::<f32>::try_from(t.to_kind(Kind::Float).reshape([-1])).unwrap();
            (n, v)
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

#[test]
fn sft_eval_grpo_on_the_embedded_example() {
    let dir = tmp("pipeline");
    let model = Path::new(EXAMPLE).join("model");
    let sft_data = head(&dir, "sft.jsonl", 256);
    let grpo_data = head(&dir, "grpo.jsonl", 64);
    let test_data = head(&dir, "test.jsonl", 32);
    let sft_cfg = write(
        &dir,
        "sft.toml",
        "learning_rate = 3e-3\nmax_steps = 30\nper_device_train_batch_size = 32\n\
         logging_steps = 10\nsave_steps = 15\ntest_size = 0.125\nseed = 1\n",
    );
    let out = dir.join("sft");
    run(&[
        "sft",
        "--model",
        s(&model),
        "--data",
        s(&sft_data),
        "--config",
        s(&sft_cfg),
        "--output",
        s(&out),
        "--from-scratch",
        "--quiet",
    ])
    .unwrap();
    // the folder loads as a Hugging Face model, with the tokenizer beside it
    for f in ["config.json", "model.safetensors", "tokenizer.json"] {
        assert!(out.join("model").join(f).exists(), "{f}");
    }
    let log = fs::read_to_string(out.join("log.csv")).unwrap();
    let rows: Vec<&str> = log.lines().collect();
    assert_eq!(
        rows[0],
        "step,epoch,loss,accuracy,learning_rate,eval_loss,eval_accuracy"
    );
    assert_eq!(rows.len(), 4, "steps 10, 20, 30: {log}");
    let loss = |r: &str| r.split(',').nth(2).unwrap().parse::<f64>().unwrap();
    assert!(loss(rows[3]) < loss(rows[1]), "SFT learns: {log}");
    let eval_loss = rows[3].split(',').nth(5).unwrap().parse::<f64>().unwrap();
    assert!(eval_loss.is_finite(), "held-out loss logged: {log}");
    assert!(out.join("curves.png").exists());
    // the linear schedule: 3e-3 * (30 - 29) / 30 at the last step
    let lr = rows[3].split(',').nth(4).unwrap().parse::<f64>().unwrap();
    assert!((lr - 3e-3 / 30.0).abs() < 1e-12, "{lr}");

    // eval: greedy completions of the held-out questions, scored by the answer
    let eval_cfg = write(
        &dir,
        "eval.toml",
        "[generation]\nmax_new_tokens = 3\n\n[[reward]]\ntype = \"answer_match\"\n\
         field = \"answer\"\nextract = \"last_number\"\n",
    );
    let samples = dir.join("eval.jsonl");
    let sft_dir = out.join("model");
    run(&[
        "eval",
        "--model",
        s(&sft_dir),
        "--data",
        s(&test_data),
        "--config",
        s(&eval_cfg),
        "--output",
        s(&samples),
        "--quiet",
    ])
    .unwrap();
    let lines: Vec<serde_json::Value> = fs::read_to_string(&samples)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 32);
    for l in &lines {
        // the reward is the answer check, recomputed here from the text
        let completion = l["completion"].as_str().unwrap();
        let right = completion.trim() == l["answer"].as_str().unwrap();
        assert_eq!(
            l["reward"].as_f64().unwrap(),
            if right { 1.0 } else { 0.0 },
            "{l}"
        );
        assert!(l["prompt"].as_str().unwrap().ends_with('='));
    }

    // GRPO from the SFT folder, two iterations, the answer as the reward
    let grpo_cfg = write(
        &dir,
        "grpo.toml",
        "[train]\nepochs = 2\nbatch_size = 16\nseq_length = 16\nseed = 3\ncheckpoint_interval = 1\n\
         [method]\nnum_generations = 4\nnum_rollouts = 16\nchunk_size = 16\n\
         [method.gen_kwargs]\nmax_new_tokens = 3\n\
         [optimizer.kwargs]\nlr = 1e-3\n\
         [data]\ntest_size = 8\n\
         [generation]\nmax_new_tokens = 3\n\
         [[reward]]\ntype = \"answer_match\"\nfield = \"answer\"\nextract = \"last_number\"\n\
         [[reward]]\ntype = \"format\"\npattern = \"[0-9]+\"\nweight = 0.5\n",
    );
    let grpo_out = dir.join("grpo");
    run(&[
        "grpo",
        "--model",
        s(&sft_dir),
        "--data",
        s(&grpo_data),
        "--config",
        s(&grpo_cfg),
        "--output",
        s(&grpo_out),
        "--quiet",
        // the allocator keeps freed memory from here on (process-wide): the run trains as
        // without it
        "--keep-freed-memory",
    ])
    .unwrap();
    let log = fs::read_to_string(grpo_out.join("log.csv")).unwrap();
    assert_eq!(log.lines().count(), 3, "{log}");
    assert!(grpo_out.join("model").join("model.safetensors").exists());
    assert!(fs::read_dir(grpo_out.join("checkpoints")).unwrap().count() > 0);
    // the policy moved away from the SFT model (the hydra's top block trained: the format
    // reward differs between completions of a group, so advantages are not all zero)
    assert!(
        weights(&grpo_out.join("model")) != weights(&sft_dir),
        "GRPO changed no weight: {log}"
    );
    fs::remove_dir_all(&dir).ok();
}

#[test]
fn sft_resume_continues_bit_for_bit() {
    let dir = tmp("resume");
    let model = Path::new(EXAMPLE).join("model");
    let data = head(&dir, "sft.jsonl", 64);
    let cfg = |steps: usize| {
        write(
            &dir,
            &format!("sft{steps}.toml"),
            &format!(
                "learning_rate = 1e-3\nmax_steps = {steps}\nper_device_train_batch_size = 16\n\
                 lr_scheduler_type = \"constant\"\nlogging_steps = 1\nsave_steps = 3\n"
            ),
        )
    };
    let (c3, c6) = (cfg(3), cfg(6));
    let straight = dir.join("straight");
    run(&[
        "sft",
        "--model",
        s(&model),
        "--data",
        s(&data),
        "--config",
        s(&c6),
        "--output",
        s(&straight),
        "--from-scratch",
        "--quiet",
    ])
    .unwrap();
    // a run stopped after 3 steps, then resumed to 6
    let resumed = dir.join("resumed");
    run(&[
        "sft",
        "--model",
        s(&model),
        "--data",
        s(&data),
        "--config",
        s(&c3),
        "--output",
        s(&resumed),
        "--from-scratch",
        "--quiet",
    ])
    .unwrap();
    run(&[
        "sft",
        "--model",
        s(&model),
        "--data",
        s(&data),
        "--config",
        s(&c6),
        "--output",
        s(&resumed),
        "--from-scratch",
        "--quiet",
        "--resume",
    ])
    .unwrap();
    assert_eq!(
        weights(&straight.join("model")),
        weights(&resumed.join("model"))
    );
    assert_eq!(
        fs::read_to_string(straight.join("log.csv"))
            .unwrap()
            .lines()
            .map(|l| l.split(',').take(3).collect::<Vec<_>>().join(","))
            .collect::<Vec<_>>(),
        fs::read_to_string(resumed.join("log.csv"))
            .unwrap()
            .lines()
            .map(|l| l.split(',').take(3).collect::<Vec<_>>().join(","))
            .collect::<Vec<_>>(),
        "the same six rows (step, epoch, loss)"
    );
    fs::remove_dir_all(&dir).ok();
}

#[test]
fn reward_dpo_ilql_and_generate_run() {
    let dir = tmp("others");
    let model = Path::new(EXAMPLE).join("model");
    // preference pairs: the right sum is preferred to a wrong one
    let mut pairs = String::new();
    let mut scored = String::new();
    for (i, (a, b)) in [
        (1, 2),
        (3, 4),
        (10, 5),
        (7, 7),
        (20, 1),
        (2, 30),
        (9, 9),
        (12, 3),
    ]
    .iter()
    .enumerate()
    {
        let (right, wrong) = (a + b, a + b + 1 + i);
        pairs.push_str(&format!(
            "{{\"prompt\": \"{a}+{b}=\", \"chosen\": \"{right}\", \"rejected\": \"{wrong}\"}}\n"
        ));
        scored.push_str(&format!(
            "{{\"prompt\": \"{a}+{b}=\", \"completion\": \"{right}\", \"reward\": 1.0}}\n\
             {{\"prompt\": \"{a}+{b}=\", \"completion\": \"{wrong}\", \"reward\": 0.0}}\n"
        ));
    }
    let pairs = write(&dir, "pairs.jsonl", &pairs);
    let scored = write(&dir, "scored.jsonl", &scored);
    let rm_cfg = write(
        &dir,
        "rm.toml",
        "max_steps = 4\nper_device_train_batch_size = 4\nlogging_steps = 2\ntest_size = 2\n",
    );
    run(&[
        "reward",
        "--model",
        s(&model),
        "--data",
        s(&pairs),
        "--config",
        s(&rm_cfg),
        "--output",
        s(&dir.join("rm")),
        "--from-scratch",
        "--quiet",
    ])
    .unwrap();
    assert!(dir.join("rm/model/model.safetensors").exists());
    let log = fs::read_to_string(dir.join("rm/log.csv")).unwrap();
    let acc = log
        .lines()
        .last()
        .unwrap()
        .split(',')
        .nth(6)
        .unwrap()
        .parse::<f64>()
        .unwrap();
    assert!(
        [0.0, 0.5, 1.0].contains(&acc),
        "held-out accuracy of 2 pairs: {log}"
    );

    let dpo_cfg = write(
        &dir,
        "dpo.toml",
        "[train]\nepochs = 2\nbatch_size = 4\nseq_length = 16\n[data]\ntest_size = 2\n",
    );
    run(&[
        "dpo",
        "--model",
        s(&model),
        "--data",
        s(&pairs),
        "--config",
        s(&dpo_cfg),
        "--output",
        s(&dir.join("dpo")),
        "--from-scratch",
        "--quiet",
    ])
    .unwrap();
    assert_eq!(
        fs::read_to_string(dir.join("dpo/log.csv"))
            .unwrap()
            .lines()
            .count(),
        3
    );
    assert!(dir.join("dpo/model/model.safetensors").exists());

    let ilql_cfg = write(
        &dir,
        "ilql.toml",
        "[train]\nepochs = 2\nbatch_size = 8\nseq_length = 16\n",
    );
    run(&[
        "ilql",
        "--model",
        s(&model),
        "--data",
        s(&scored),
        "--config",
        s(&ilql_cfg),
        "--output",
        s(&dir.join("ilql")),
        "--from-scratch",
        "--quiet",
    ])
    .unwrap();
    assert!(dir.join("ilql/model/model.safetensors").exists());

    // generation from the DPO model: one line per prompt, with the example's columns
    let gen_cfg = write(
        &dir,
        "gen.toml",
        "[generation]\nmax_new_tokens = 3\ndo_sample = true\nseed = 5\n",
    );
    let out = dir.join("gen.jsonl");
    run(&[
        "generate",
        "--model",
        s(&dir.join("dpo/model")),
        "--data",
        s(&pairs),
        "--config",
        s(&gen_cfg),
        "--output",
        s(&out),
        "--limit",
        "5",
        "--quiet",
    ])
    .unwrap();
    let lines: Vec<serde_json::Value> = fs::read_to_string(&out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 5);
    assert_eq!(lines[0]["prompt"], "1+2=");
    assert_eq!(
        lines[0]["chosen"],
        serde_json::Value::Null,
        "chosen / rejected are read columns, not kept"
    );
    // the same seed samples the same completions
    let again = dir.join("gen2.jsonl");
    run(&[
        "generate",
        "--model",
        s(&dir.join("dpo/model")),
        "--data",
        s(&pairs),
        "--config",
        s(&gen_cfg),
        "--output",
        s(&again),
        "--limit",
        "5",
        "--quiet",
    ])
    .unwrap();
    assert_eq!(
        fs::read_to_string(&out).unwrap(),
        fs::read_to_string(&again).unwrap()
    );
    fs::remove_dir_all(&dir).ok();
}

#[test]
fn bad_input_is_named_and_leaves_no_output_folder() {
    let dir = tmp("bad");
    let model = Path::new(EXAMPLE).join("model");
    let good = head(&dir, "sft.jsonl", 8);
    let bad_json = write(&dir, "bad.jsonl", "{\"prompt\": \"1+1=\", \"completion\": \"2\"}\n{\"prompt\": \"2+2=\", \"completion\": 4}\n");
    let unknown = write(&dir, "unknown.toml", "learning_rat = 1e-3\n");
    let no_reward = write(&dir, "noreward.toml", "[train]\nepochs = 1\n");
    let bad_regex = write(
        &dir,
        "badre.toml",
        "[[reward]]\ntype = \"format\"\npattern = \"(\"\n",
    );
    let out = dir.join("out");
    let check = |args: Vec<&str>, needles: &[&str]| {
        let err = run(&args).unwrap_err().to_string();
        for n in needles {
            assert!(err.contains(n), "{args:?}: {err:?} lacks {n:?}");
        }
        assert!(!out.exists(), "{args:?} left {}", out.display());
    };
    check(
        vec![
            "sft",
            "--model",
            s(&model),
            "--data",
            s(&bad_json),
            "--output",
            s(&out),
            "--from-scratch",
        ],
        &["bad.jsonl", "line 2", "\"completion\""],
    );
    check(
        vec![
            "sft",
            "--model",
            s(&model),
            "--data",
            s(&good),
            "--config",
            s(&unknown),
            "--output",
            s(&out),
            "--from-scratch",
        ],
        &["unknown.toml", "learning_rat"],
    );
    check(
        vec![
            "grpo",
            "--model",
            s(&model),
            "--data",
            s(&good),
            "--config",
            s(&no_reward),
            "--output",
            s(&out),
            "--from-scratch",
        ],
        &["[[reward]]"],
    );
    check(
        vec![
            "grpo",
            "--model",
            s(&model),
            "--data",
            s(&good),
            "--config",
            s(&bad_regex),
            "--output",
            s(&out),
            "--from-scratch",
        ],
        &["reward[0]"],
    );
    check(
        vec![
            "dpo",
            "--model",
            s(&model),
            "--data",
            s(&good),
            "--output",
            s(&out),
            "--from-scratch",
        ],
        &["preference"],
    );
    check(
        vec![
            "sft",
            "--model",
            s(&dir),
            "--data",
            s(&good),
            "--output",
            s(&out),
        ],
        &["tokenizer.json"],
    );
    check(
        vec!["sft", "--data", s(&good), "--output", s(&out)],
        &["--model"],
    );
    // an example longer than the limit everywhere: nothing left
    let drop_all = write(&dir, "drop.toml", "drop_longer_than = 2\n");
    check(
        vec![
            "sft",
            "--model",
            s(&model),
            "--data",
            s(&good),
            "--config",
            s(&drop_all),
            "--output",
            s(&out),
            "--from-scratch",
        ],
        &["no example", "left"],
    );
    fs::remove_dir_all(&dir).ok();
}

#[test]
fn every_subcommand_has_help_and_the_binary_reports_errors() {
    let exe = env!("CARGO_BIN_EXE_torchrl");
    for sub in [
        "sft", "reward", "ppo", "grpo", "dpo", "ilql", "generate", "eval",
    ] {
        let out = Command::new(exe).args([sub, "--help"]).output().unwrap();
        assert!(out.status.success(), "{sub}");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains("--model") && text.contains("--data"),
            "{sub}: {text}"
        );
        let trains = !matches!(sub, "generate" | "eval");
        assert_eq!(
            text.contains("--keep-freed-memory"),
            trains,
            "{sub}: {text}"
        );
    }
    let out = Command::new(exe).arg("--help").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    for sub in [
        "sft", "reward", "ppo", "grpo", "dpo", "ilql", "generate", "eval",
    ] {
        assert!(text.contains(sub), "{text}");
    }
    let out = Command::new(exe)
        .args([
            "sft",
            "--model",
            "/nonexistent",
            "--data",
            "/nonexistent.jsonl",
            "--output",
            "/tmp/x",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/nonexistent.jsonl"), "{err}");
}

#[test]
fn train_settings_schedule_and_steps() {
    let s = TrainSettings::from_toml_str(
        "per_device_train_batch_size = 4\nnum_train_epochs = 1.5\nwarmup_ratio = 0.25\n",
    )
    .unwrap();
    // 10 examples: 3 steps an epoch, 1.5 epochs = 5 steps (rounded up)
    assert_eq!(s.total_steps(10), 5);
    // warm-up over ceil(0.25 * 8) = 2 steps, then linear decay to 0 over the other 6
    assert_eq!(s.lr_at(1.0, 0, 8), 0.5);
    assert_eq!(s.lr_at(1.0, 1, 8), 1.0);
    assert_eq!(s.lr_at(1.0, 2, 8), 1.0);
    assert_eq!(s.lr_at(1.0, 5, 8), 0.5);
    assert!(
        TrainSettings::from_toml_str("lr_scheduler_type = \"cosine\"\n")
            .unwrap_err()
            .to_string()
            .contains("lr_scheduler_type")
    );
    assert!(TrainSettings::from_toml_str("learning_rate = -1.0\n").is_err());
}

#[test]
fn lora_writes_the_adapter_and_the_merged_model() {
    let dir = tmp("lora");
    let model = Path::new(EXAMPLE).join("model");
    let data = head(&dir, "sft.jsonl", 32);
    // a base with weights: a few SFT steps from scratch
    let sft_cfg = write(
        &dir,
        "sft.toml",
        "max_steps = 3\nper_device_train_batch_size = 8\n",
    );
    let base = dir.join("base");
    run(&[
        "sft",
        "--model",
        s(&model),
        "--data",
        s(&data),
        "--config",
        s(&sft_cfg),
        "--output",
        s(&base),
        "--from-scratch",
        "--quiet",
    ])
    .unwrap();
    let base = base.join("model");
    let mut pairs = String::new();
    for (a, b) in [
        (1, 2),
        (3, 4),
        (10, 5),
        (7, 7),
        (20, 1),
        (2, 30),
        (9, 9),
        (12, 3),
    ] {
        pairs.push_str(&format!(
            "{{\"prompt\": \"{a}+{b}=\", \"chosen\": \"{}\", \"rejected\": \"{}\"}}\n",
            a + b,
            a + b + 2
        ));
    }
    let pairs = write(&dir, "pairs.jsonl", &pairs);
    let cfg = write(
        &dir,
        "dpo.toml",
        "[train]\nepochs = 2\nbatch_size = 4\nseq_length = 16\n[optimizer.kwargs]\nlr = 1e-2\n\
         [model.peft_config]\nr = 4\nlora_alpha = 8\ntarget_modules = \"all-linear\"\n",
    );
    let out = dir.join("dpo");
    run(&[
        "dpo",
        "--model",
        s(&base),
        "--data",
        s(&pairs),
        "--config",
        s(&cfg),
        "--output",
        s(&out),
        "--quiet",
    ])
    .unwrap();
    let adapter: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(out.join("adapter/adapter_config.json")).unwrap())
            .unwrap();
    assert_eq!(adapter["r"], 4);
    assert_eq!(adapter["peft_type"], "LORA");
    assert!(out.join("adapter/adapter_model.safetensors").exists());
    // the merged model has the base's names and shapes, and the trained adapters folded in:
    // the linear layers moved, the norms and embeddings (frozen, not targeted) did not
    let (merged, before) = (weights(&out.join("model")), weights(&base));
    assert_eq!(merged.len(), before.len());
    for ((name, m), (name_b, b)) in merged.iter().zip(&before) {
        assert_eq!(name, name_b);
        let moved = m != b;
        let linear = name.ends_with("proj.weight");
        assert_eq!(moved, linear, "{name}");
    }
    // LoRA on random weights is refused by name
    let err = run(&[
        "dpo",
        "--model",
        s(&model),
        "--data",
        s(&pairs),
        "--config",
        s(&cfg),
        "--output",
        s(&dir.join("x")),
        "--from-scratch",
    ])
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("peft_config") && err.contains("--from-scratch"),
        "{err}"
    );
    assert!(!dir.join("x").exists());
    fs::remove_dir_all(&dir).ok();
}

#[test]
fn dtype_bfloat16_trains_saves_and_generates_in_bf16() {
    let dir = tmp("dtype");
    let model = Path::new(EXAMPLE).join("model");
    let data = head(&dir, "sft.jsonl", 64);
    let cfg = write(
        &dir,
        "sft.toml",
        "learning_rate = 3e-3\nmax_steps = 8\nper_device_train_batch_size = 8\nlogging_steps = 4\n",
    );
    let out = dir.join("sft");
    run(&[
        "sft",
        "--model",
        s(&model),
        "--data",
        s(&data),
        "--config",
        s(&cfg),
        "--output",
        s(&out),
        "--from-scratch",
        "--dtype",
        "bfloat16",
        "--quiet",
    ])
    .unwrap();
    // every saved weight is bfloat16
    let saved = tch::Tensor::read_safetensors(out.join("model/model.safetensors")).unwrap();
    assert!(!saved.is_empty());
    for (name, t) in &saved {
        assert_eq!(t.kind(), Kind::BFloat16, "{name}");
    }
    // the loss is logged finite and goes down (float32 master weights take the small steps)
    let log = fs::read_to_string(out.join("log.csv")).unwrap();
    let losses: Vec<f64> = log
        .lines()
        .skip(1)
        .map(|r| r.split(',').nth(2).unwrap().parse().unwrap())
        .collect();
    assert_eq!(losses.len(), 2, "{log}");
    assert!(losses.iter().all(|l| l.is_finite()), "{log}");
    assert!(losses[1] < losses[0], "{log}");
    // the bf16 folder loads into a float32 model (weights converted on load) and generates
    let prompts = head(&dir, "test.jsonl", 4);
    let samples = dir.join("samples.jsonl");
    let gen_cfg = write(&dir, "gen.toml", "[generation]\nmax_new_tokens = 3\n");
    for dtype in ["float32", "bfloat16"] {
        run(&[
            "generate",
            "--model",
            s(&out.join("model")),
            "--data",
            s(&prompts),
            "--config",
            s(&gen_cfg),
            "--output",
            s(&samples),
            "--dtype",
            dtype,
            "--quiet",
        ])
        .unwrap();
        assert_eq!(fs::read_to_string(&samples).unwrap().lines().count(), 4);
    }
    // an unknown dtype is refused by clap, naming the values it takes
    let err = run(&[
        "sft",
        "--model",
        s(&model),
        "--data",
        s(&data),
        "--output",
        s(&dir.join("never")),
        "--dtype",
        "float64",
    ])
    .unwrap_err()
    .to_string();
    assert!(err.contains("float64") && err.contains("bfloat16"), "{err}");
    assert!(!dir.join("never").exists());
    let _ = fs::remove_dir_all(&dir);
}
