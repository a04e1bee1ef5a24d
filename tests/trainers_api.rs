//! The trainer foundation: `TrlConfig` (trlX's shape and defaults), `AdamW` +
//! `CosineAnnealingLr` replayed against `torch.optim` (specs/trainers_cases.json, recorded by
//! specs/record_trainers.py), atomic checkpoints with crash cases, and the `RlTrainer` API
//! exercised by a toy linear-regression trainer.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};
use tch::{Device, Kind, Tensor};
use torchrl::trainers::api::{names, take_component, EvalReport, Intervals};
use torchrl::trainers::checkpoint::SaveStage;
use torchrl::trainers::config::{
    AdamWKwargs, CosineKwargs, GenKwargs, OptimizerName, PpoMethodConfig, ScaleReward,
    SchedulerName, Side, TrainConfig,
};
use torchrl::trainers::{
    AdamW, Callbacks, Checkpoint, CheckpointStore, Component, CosineAnnealingLr, RlTrainer, Stats,
    TrlConfig,
};
use torchrl::{Error, TensorDict};

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("torchrl-trainers-{name}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    dir
}

fn f32s(t: &Tensor) -> Vec<f32> {
    Vec::<f32>::try_from(t.reshape([-1])).unwrap()
}

// ---------------------------------------------------------------------------------------------
// Config
// ---------------------------------------------------------------------------------------------

#[test]
fn default_config_is_trlx_head_default_ppo_config() {
    // Values from trlx/data/default_configs.py::default_ppo_config (HEAD 3340c2f) and the
    // dataclass defaults in trlx/data/configs.py.
    let c = TrlConfig::default();
    let t = &c.train;
    assert_eq!(
        (t.seq_length, t.epochs, t.total_steps, t.batch_size),
        (1024, 100, 10000, 32)
    );
    assert_eq!((t.checkpoint_interval, t.eval_interval), (10000, 100));
    assert_eq!(t.log_interval, 1);
    assert_eq!(t.minibatch_size, None);
    assert_eq!(t.checkpoint_dir, "ckpts");
    assert_eq!(t.seed, 1000);
    assert_eq!(
        (t.pipeline.as_str(), t.trainer.as_str()),
        ("PromptPipeline", "AcceleratePPOTrainer")
    );
    assert!(t.save_best && t.save_optimizer);
    assert_eq!(c.model.model_path, "lvwerra/gpt2-imdb");
    assert_eq!(c.model.num_layers_unfrozen, 2);
    assert_eq!(c.tokenizer.tokenizer_path, "gpt2");
    assert_eq!(
        (c.tokenizer.padding_side, c.tokenizer.truncation_side),
        (Side::Left, Side::Right)
    );
    assert_eq!(c.optimizer.name, OptimizerName::AdamW);
    assert_eq!(
        c.optimizer.kwargs,
        AdamWKwargs {
            lr: 3e-5,
            betas: [0.9, 0.95],
            eps: 1e-8,
            weight_decay: 1e-6,
            fused: false,
        }
    );
    assert_eq!(c.scheduler.name, SchedulerName::CosineAnnealing);
    assert_eq!(
        c.scheduler.kwargs,
        CosineKwargs {
            t_max: 1e12,
            eta_min: 3e-5
        }
    );
    let m = &c.method;
    assert_eq!(m.name, "PPOConfig");
    assert_eq!((m.num_rollouts, m.chunk_size, m.ppo_epochs), (128, 128, 4));
    assert_eq!((m.init_kl_coef, m.target, m.horizon), (0.001, None, 10000));
    assert_eq!((m.gamma, m.lam), (1.0, 0.95));
    assert_eq!((m.cliprange, m.cliprange_value, m.vf_coef), (0.2, 0.2, 1.0));
    assert_eq!(m.scale_reward, ScaleReward::Ignored);
    assert_eq!(
        (m.ref_mean, m.ref_std, m.cliprange_reward),
        (None, None, 10.0)
    );
    assert_eq!(
        m.gen_kwargs,
        GenKwargs {
            max_new_tokens: 40,
            top_k: 0,
            top_p: 1.0,
            do_sample: true,
            temperature: 1.0
        }
    );
    assert_eq!(m.gen_experience_kwargs, None);
    assert_eq!(m.num_value_layers_unfrozen, 0);
    c.validate().unwrap();
}

#[test]
fn config_reads_trlx_json_layout_and_partial_toml() {
    // trlX's to_dict() layout (trimmed to the fields we keep), as examples/hh/ppo_hh.py sets them.
    let json = r#"{
        "train": {"seq_length": 512, "batch_size": 4, "epochs": 10000, "total_steps": 10000,
                  "checkpoint_interval": 10000, "eval_interval": 500, "minibatch_size": 2},
        "model": {"model_path": "EleutherAI/gpt-j-6B", "num_layers_unfrozen": 2},
        "optimizer": {"name": "adamw", "kwargs": {"lr": 8e-6, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 1e-6}},
        "scheduler": {"name": "cosine_annealing", "kwargs": {"T_max": 10000, "eta_min": 8e-6}},
        "method": {"name": "PPOConfig", "num_rollouts": 64, "chunk_size": 16, "init_kl_coef": 0.05,
                   "target": 6, "scale_reward": "running", "ref_mean": null, "ref_std": null,
                   "gen_kwargs": {"max_new_tokens": 128, "top_k": 0, "top_p": 1.0, "do_sample": true}}
    }"#;
    let c = TrlConfig::from_json_str(json).unwrap();
    assert_eq!((c.train.seq_length, c.train.minibatch_size), (512, Some(2)));
    assert_eq!(c.optimizer.kwargs.lr, 8e-6);
    assert_eq!(c.scheduler.kwargs.t_max, 10000.0);
    assert_eq!(c.method.target, Some(6.0));
    assert_eq!(c.method.scale_reward, ScaleReward::Running);
    assert_eq!(c.method.gen_kwargs.max_new_tokens, 128);
    assert_eq!(c.method.gen_kwargs.temperature, 1.0); // not in the file: default
    assert_eq!(c.method.horizon, 10000); // not in the file: default
    assert_eq!(c.tokenizer, Default::default());

    let toml = "[method.gen_experience_kwargs]\nmax_new_tokens = 8\ntemperature = 0.7\n";
    let c = TrlConfig::from_toml_str(toml).unwrap();
    let g = c.method.experience_gen_kwargs();
    assert_eq!((g.max_new_tokens, g.temperature, g.top_p), (8, 0.7, 1.0));
    assert_eq!(c.method.gen_kwargs.max_new_tokens, 40);
}

#[test]
fn config_typos_and_bad_enums_name_the_field() {
    for (text, field) in [
        ("[train]\nepochz = 1", "epochz"),
        ("[method.gen_kwargs]\nmax_new_tokns = 3", "max_new_tokns"),
        ("[optimizer.kwargs]\nmomentum = 0.9", "momentum"),
        ("[trian]\nepochs = 1", "trian"),
        ("[method]\nscale_reward = \"whiten\"", "whiten"),
        ("[optimizer]\nname = \"sgd\"", "sgd"),
    ] {
        let err = TrlConfig::from_toml_str(text).unwrap_err().to_string();
        assert!(err.contains(field), "{text:?}: {err}");
    }
    let err = TrlConfig::from_json_str(r#"{"model": {"num_layers": 2}}"#)
        .unwrap_err()
        .to_string();
    assert!(err.contains("num_layers"), "{err}");
}

#[test]
fn validate_names_each_bad_field() {
    type Edit = fn(&mut TrlConfig);
    let cases: Vec<(&str, Edit)> = vec![
        ("train.epochs", |c| c.train.epochs = 0),
        ("train.total_steps", |c| c.train.total_steps = 0),
        ("train.batch_size", |c| c.train.batch_size = 0),
        ("train.seq_length", |c| c.train.seq_length = 0),
        ("train.minibatch_size", |c| c.train.minibatch_size = Some(5)), // 32 % 5 != 0
        ("train.minibatch_size", |c| {
            c.train.minibatch_size = Some(64)
        }),
        ("train.checkpoint_interval", |c| {
            c.train.checkpoint_interval = 0
        }),
        ("train.eval_interval", |c| c.train.eval_interval = 0),
        ("train.log_interval", |c| c.train.log_interval = 0),
        ("train.checkpoint_dir", |c| c.train.checkpoint_dir.clear()),
        ("model.num_layers_unfrozen", |c| {
            c.model.num_layers_unfrozen = -2
        }),
        ("optimizer.kwargs.lr", |c| c.optimizer.kwargs.lr = 0.0),
        ("optimizer.kwargs.lr", |c| c.optimizer.kwargs.lr = f64::NAN),
        ("optimizer.kwargs.betas", |c| {
            c.optimizer.kwargs.betas = [1.0, 0.9]
        }),
        ("optimizer.kwargs.betas", |c| {
            c.optimizer.kwargs.betas = [0.9, -0.1]
        }),
        ("optimizer.kwargs.eps", |c| c.optimizer.kwargs.eps = 0.0),
        ("optimizer.kwargs.weight_decay", |c| {
            c.optimizer.kwargs.weight_decay = -1e-3
        }),
        ("scheduler.kwargs.T_max", |c| c.scheduler.kwargs.t_max = 0.0),
        ("scheduler.kwargs.eta_min", |c| {
            c.scheduler.kwargs.eta_min = -1.0
        }),
        ("method.ppo_epochs", |c| c.method.ppo_epochs = 0),
        ("method.num_rollouts", |c| c.method.num_rollouts = 0),
        ("method.chunk_size", |c| c.method.chunk_size = 0),
        ("method.init_kl_coef", |c| c.method.init_kl_coef = -0.1),
        ("method.target", |c| c.method.target = Some(0.0)),
        ("method.horizon", |c| c.method.horizon = 0),
        ("method.gamma", |c| c.method.gamma = 1.01),
        ("method.lam", |c| c.method.lam = -0.01),
        ("method.cliprange", |c| c.method.cliprange = 0.0),
        ("method.cliprange_value", |c| {
            c.method.cliprange_value = -0.2
        }),
        ("method.vf_coef", |c| c.method.vf_coef = -1.0),
        ("method.ref_std", |c| c.method.ref_std = Some(0.0)),
        ("method.cliprange_reward", |c| {
            c.method.cliprange_reward = 0.0
        }),
        ("method.gen_kwargs.max_new_tokens", |c| {
            c.method.gen_kwargs.max_new_tokens = 0
        }),
        ("method.gen_kwargs.top_p", |c| {
            c.method.gen_kwargs.top_p = 0.0
        }),
        ("method.gen_kwargs.temperature", |c| {
            c.method.gen_kwargs.temperature = 0.0
        }),
        ("method.gen_experience_kwargs.top_p", |c| {
            c.method.gen_experience_kwargs = Some(GenKwargs {
                top_p: 1.5,
                ..GenKwargs::default()
            })
        }),
        ("method.num_value_layers_unfrozen", |c| {
            c.method.num_value_layers_unfrozen = -1
        }),
    ];
    for (field, edit) in cases {
        let mut c = TrlConfig::default();
        edit(&mut c);
        match c.validate() {
            Err(Error::InvalidConfig { field: f, .. }) => assert_eq!(f, field),
            other => panic!("{field}: expected InvalidConfig, got {other:?}"),
        }
    }
    // Edges that are allowed.
    let mut c = TrlConfig::default();
    c.method.gamma = 0.0;
    c.method.lam = 1.0;
    c.optimizer.kwargs.betas = [0.0, 0.0];
    c.optimizer.kwargs.weight_decay = 0.0;
    c.model.num_layers_unfrozen = -1;
    c.train.minibatch_size = Some(8);
    c.validate().unwrap();
}

#[test]
fn config_files_round_trip_by_extension() {
    let dir = temp_dir("config-files");
    fs::create_dir_all(&dir).unwrap();
    let cfg = TrlConfig::default()
        .with_train(TrainConfig {
            minibatch_size: Some(16),
            run_name: Some("run-1".into()),
            ..TrainConfig::default()
        })
        .with_method(PpoMethodConfig {
            target: Some(6.0),
            ref_mean: Some(-0.5),
            gen_experience_kwargs: Some(GenKwargs::default()),
            ..PpoMethodConfig::default()
        });
    for ext in ["toml", "json", "TOML"] {
        let path = dir.join(format!("cfg.{ext}"));
        cfg.to_file(&path).unwrap();
        assert_eq!(TrlConfig::from_file(&path).unwrap(), cfg, "{ext}");
    }
    // The TOML uses trlX's names.
    let text = cfg.to_toml().unwrap();
    for key in [
        "[optimizer.kwargs]",
        "T_max = ",
        "scale_reward = \"ignored\"",
        "name = \"adamw\"",
    ] {
        assert!(text.contains(key), "{key} in\n{text}");
    }
    let bad_ext = dir.join("cfg.yaml");
    assert!(matches!(
        TrlConfig::from_file(&bad_ext),
        Err(Error::InvalidValue { .. })
    ));
    let missing = dir.join("absent.toml");
    match TrlConfig::from_file(&missing) {
        Err(Error::Io { path, .. }) => assert!(path.ends_with("absent.toml")),
        other => panic!("{other:?}"),
    }
    let broken = dir.join("broken.json");
    fs::write(&broken, r#"{"train": {"epochs": "many"}}"#).unwrap();
    match TrlConfig::from_file(&broken) {
        Err(Error::InvalidFile { path, reason, .. }) => {
            assert!(path.ends_with("broken.json"));
            assert!(reason.contains("invalid type"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    let out_of_range = dir.join("range.toml");
    fs::write(&out_of_range, "[method]\ncliprange = -1.0\n").unwrap();
    // the field is named by the root error, the file by its context
    let err = TrlConfig::from_file(&out_of_range).unwrap_err();
    assert!(matches!(
        err.root(),
        Error::InvalidConfig {
            field: "method.cliprange",
            ..
        }
    ));
    assert!(err.to_string().contains("range.toml"), "{err}");
    fs::remove_dir_all(&dir).ok();
}

#[test]
fn total_steps_is_trlx_min_rule() {
    let mut c = TrlConfig::default();
    c.train.epochs = 3;
    c.method.ppo_epochs = 2;
    c.method.num_rollouts = 10;
    c.train.batch_size = 4;
    // ceil(10 / 4) = 3 batches per rollout; 3 * 2 * 3 = 18 < 10000.
    assert_eq!(c.batches_per_rollout(), 3);
    assert_eq!(c.total_steps(c.batches_per_rollout()), 18);
    c.train.total_steps = 7;
    assert_eq!(c.total_steps(3), 7);
}

// ---------------------------------------------------------------------------------------------
// AdamW + CosineAnnealingLr against torch.optim
// ---------------------------------------------------------------------------------------------

fn tensor_from(v: &Value) -> Tensor {
    let shape: Vec<i64> = v["shape"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_i64().unwrap())
        .collect();
    let values = f32_list(&v["values"]);
    Tensor::from_slice(&values).reshape(shape)
}

fn f32_list(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

fn close(a: f64, b: f64, tol: f64) -> bool {
    (a - b).abs() <= tol * (1.0 + b.abs())
}

#[test]
fn adamw_and_cosine_replay_torch_optim() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/specs/trainers_cases.json");
    let cases: Value = serde_json::from_str(&fs::read_to_string(path).unwrap()).unwrap();
    let cases = cases["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 4);
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let lr = case["lr"].as_f64().unwrap();
        let init = case["init"].as_object().unwrap();
        let params: Vec<(String, Tensor)> = init
            .iter()
            .map(|(n, v)| (n.clone(), tensor_from(v).set_requires_grad(true)))
            .collect();
        let betas = f32_list(&case["betas"]);
        let mut opt = AdamW::new(
            params
                .iter()
                .map(|(n, t)| (n.clone(), t.shallow_clone()))
                .collect(),
            lr,
        )
        .unwrap()
        .with_betas([
            case["betas"][0].as_f64().unwrap(),
            case["betas"][1].as_f64().unwrap(),
        ])
        .with_eps(case["eps"].as_f64().unwrap())
        .with_weight_decay(case["weight_decay"].as_f64().unwrap());
        assert_eq!(betas.len(), 2);
        let mut sched = CosineAnnealingLr::new(
            lr,
            case["T_max"].as_f64().unwrap(),
            case["eta_min"].as_f64().unwrap(),
        )
        .unwrap();
        let by_name: BTreeMap<&str, &Tensor> =
            params.iter().map(|(n, t)| (n.as_str(), t)).collect();
        for (i, step) in case["steps"].as_array().unwrap().iter().enumerate() {
            let grads = step["grads"].as_object().unwrap();
            // d/dp sum(p * g) = g exactly; zeroed grads accumulate it unchanged.
            let terms: Vec<Tensor> = grads
                .iter()
                .map(|(n, g)| {
                    let p = by_name[n.as_str()];
                    let g = Tensor::from_slice(&f32_list(g)).reshape(p.size());
                    (p * g).sum(Kind::Float)
                })
                .collect();
            let loss = Tensor::stack(&terms, 0).sum(Kind::Float);
            loss.backward();
            opt.step().unwrap();
            opt.zero_grad();
            opt.set_lr(sched.step());
            let want_lr = step["lr"].as_f64().unwrap();
            assert!(
                close(opt.lr(), want_lr, 1e-12),
                "{name} step {i}: lr {} vs {want_lr}",
                opt.lr()
            );
            for (n, want) in step["params"].as_object().unwrap() {
                let got = f32s(by_name[n.as_str()]);
                for (k, (g, w)) in got.iter().zip(f32_list(want)).enumerate() {
                    assert!(
                        close(f64::from(*g), f64::from(w), 1e-6),
                        "{name} step {i} {n}[{k}]: {g} vs {w}"
                    );
                }
            }
        }
        if name == "param_without_grad" {
            // "frozen" never had a gradient: no step counted.
            let frozen = opt.names().iter().position(|n| n == "frozen").unwrap();
            assert_eq!(opt.steps()[frozen], 0);
        }
    }
}

#[test]
fn adamw_refuses_bad_params_and_states() {
    let p = || Tensor::zeros([2, 2], (Kind::Float, Device::Cpu)).set_requires_grad(true);
    let dup = AdamW::new(vec![("a".into(), p()), ("a".into(), p())], 0.1).unwrap_err();
    assert!(dup.to_string().contains("\"a\" twice"), "{dup}");
    let int = AdamW::new(
        vec![("i".into(), Tensor::zeros([2], (Kind::Int64, Device::Cpu)))],
        0.1,
    )
    .unwrap_err();
    assert!(int.to_string().contains("floating-point"), "{int}");
    assert!(matches!(
        AdamW::new(vec![], -1.0),
        Err(Error::InvalidConfig { field: "lr", .. })
    ));
    let mut bad = AdamW::new(vec![("a".into(), p())], 0.1)
        .unwrap()
        .with_betas([0.9, 1.0]);
    assert!(matches!(
        bad.step(),
        Err(Error::InvalidConfig { field: "betas", .. })
    ));

    let a = AdamW::new(vec![("a".into(), p())], 0.1).unwrap();
    let tensors = a.state_tensors();
    let names: Vec<&str> = tensors.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["exp_avg.a", "exp_avg_sq.a"]);
    // Mis-shaped moment.
    let mut b = AdamW::new(
        vec![("a".into(), Tensor::zeros([4], (Kind::Float, Device::Cpu)))],
        0.1,
    )
    .unwrap();
    match b.load_state(&tensors, &a.state_json()) {
        Err(Error::ShapeMismatch {
            key,
            expected,
            actual,
            ..
        }) => {
            assert_eq!(key, "exp_avg.a");
            assert_eq!((expected, actual), (vec![4], vec![2, 2]));
        }
        other => panic!("{other:?}"),
    }
    // Extra tensor, missing JSON field.
    let mut c = AdamW::new(vec![("a".into(), p())], 0.1).unwrap();
    let mut extra = a.state_tensors();
    extra.push(("exp_avg.z".into(), p()));
    let err = c.load_state(&extra, &a.state_json()).unwrap_err();
    assert!(err.to_string().contains("exp_avg.z"), "{err}");
    let mut state = a.state_json();
    state.as_object_mut().unwrap().remove("eps");
    let err = c.load_state(&tensors, &state).unwrap_err();
    assert!(err.to_string().contains("eps"), "{err}");
    assert_eq!(c.lr(), 0.1); // nothing changed
}

// ---------------------------------------------------------------------------------------------
// Checkpoints
// ---------------------------------------------------------------------------------------------

fn ckpt_at(step: u64) -> Checkpoint {
    let v = step as f32;
    Checkpoint::new(step)
        .with_tensors(
            "model",
            vec![
                (
                    "w".into(),
                    Tensor::from_slice(&[v, v + 1.0]).reshape([1, 2]),
                ),
                ("b".into(), Tensor::from_slice(&[-v])),
            ],
        )
        .with_tensors(
            "opt",
            vec![("exp_avg.w".into(), Tensor::from_slice(&[0.5f32, v]))],
        )
        .with_json("opt", json!({ "step": step, "lr": 0.1 }))
        .with_json(
            "trainer_state",
            json!({ "kl_coef": 0.05 * v as f64, "moments": [1.0, 2.0] }),
        )
}

fn assert_is_ckpt_at(ckpt: &Checkpoint, step: u64) {
    let v = step as f32;
    assert_eq!(ckpt.step(), step);
    assert_eq!(ckpt.tensor_groups(), ["model", "opt"]);
    assert_eq!(ckpt.json_names(), ["opt", "trainer_state"]);
    let model = ckpt.tensors("model").unwrap();
    assert_eq!(model[0].0, "b"); // sorted by name
    assert_eq!(f32s(&model[0].1), [-v]);
    assert_eq!(model[1].1.size(), [1, 2]);
    assert_eq!(f32s(&model[1].1), [v, v + 1.0]);
    assert_eq!(ckpt.json("opt").unwrap()["step"], step);
    assert_eq!(
        ckpt.json("trainer_state").unwrap()["kl_coef"],
        0.05 * f64::from(v)
    );
}

#[test]
fn checkpoint_round_trips_and_keeps_last_n() {
    let dir = temp_dir("ckpt-keep");
    let store = CheckpointStore::new(&dir).with_keep_last(2);
    assert!(store.load_latest().unwrap().is_none());
    for step in [1, 2, 3, 4] {
        let path = store.save(&ckpt_at(step)).unwrap();
        assert_eq!(path, store.path_of(step));
    }
    assert_eq!(store.steps().unwrap(), [3, 4]);
    assert_is_ckpt_at(&store.load_latest().unwrap().unwrap(), 4);
    assert_is_ckpt_at(&Checkpoint::load(store.path_of(3)).unwrap(), 3);
    assert_eq!(
        fs::read_to_string(dir.join("latest")).unwrap(),
        "checkpoint_0000000004"
    );
    // Missing groups name what is there.
    let ckpt = store.load_latest().unwrap().unwrap();
    let err = ckpt.tensors("critic").unwrap_err().to_string();
    assert!(
        err.contains("\"model\"") && err.contains("\"opt\""),
        "{err}"
    );
    // Bad names are refused before anything is written.
    let err = store
        .save(&Checkpoint::new(9).with_json("../escape", json!(1)))
        .unwrap_err();
    assert!(err.to_string().contains("../escape"), "{err}");
    assert!(!store.path_of(9).exists());
    fs::remove_dir_all(&dir).ok();
}

#[test]
fn crash_at_any_stage_of_a_save_keeps_the_last_good_checkpoint() {
    let stages = [
        SaveStage::Wrote("model.safetensors".into()),
        SaveStage::Wrote("opt.safetensors".into()),
        SaveStage::Wrote("opt.json".into()),
        SaveStage::Complete,
        SaveStage::Renamed,
    ];
    for crash_at in stages {
        let dir = temp_dir("ckpt-crash");
        let store = CheckpointStore::new(&dir);
        store.save(&ckpt_at(5)).unwrap();
        let mut seen = Vec::new();
        let result = store.save_with_hook(&ckpt_at(6), &mut |stage| {
            seen.push(stage.clone());
            if stage == crash_at {
                Err(Error::InvalidArgument {
                    op: "test",
                    message: "simulated crash".into(),
                })
            } else {
                Ok(())
            }
        });
        assert!(result.is_err(), "{crash_at:?}");
        assert_eq!(seen.last(), Some(&crash_at));
        // The last good checkpoint still loads, unchanged.
        let back = store.load_latest().unwrap().unwrap();
        assert_is_ckpt_at(&back, 5);
        // The next save succeeds and clears the leftovers.
        store.save(&ckpt_at(7)).unwrap();
        assert_is_ckpt_at(&store.load_latest().unwrap().unwrap(), 7);
        let leftovers: Vec<String> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with('.'))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
        fs::remove_dir_all(&dir).ok();
    }
}

#[test]
fn leftover_partial_temp_folder_is_ignored() {
    let dir = temp_dir("ckpt-partial");
    let store = CheckpointStore::new(&dir);
    store.save(&ckpt_at(3)).unwrap();
    // A process killed mid-save leaves a temporary folder with some files, no manifest.
    let tmp = dir.join(".tmp.checkpoint_0000000004");
    fs::create_dir_all(&tmp).unwrap();
    fs::write(tmp.join("model.safetensors"), b"\x10\x00\x00").unwrap();
    assert_eq!(store.steps().unwrap(), [3]);
    assert_is_ckpt_at(&store.load_latest().unwrap().unwrap(), 3);
    // A folder renamed into place whose pointer was never written is not the latest either.
    fs::rename(store.path_of(3), dir.join("keep")).unwrap();
    store.save(&ckpt_at(3)).unwrap();
    fs::remove_dir_all(dir.join("keep")).unwrap();
    fs::write(dir.join("latest"), "checkpoint_0000000003").unwrap();
    assert_is_ckpt_at(&store.load_latest().unwrap().unwrap(), 3);
    // Without a pointer, the highest complete folder is the latest.
    fs::remove_file(dir.join("latest")).unwrap();
    assert_is_ckpt_at(&store.load_latest().unwrap().unwrap(), 3);
    fs::remove_dir_all(&dir).ok();
}

#[test]
fn corrupt_or_missing_files_name_the_path() {
    let dir = temp_dir("ckpt-corrupt");
    let store = CheckpointStore::new(&dir);
    let folder = store.save(&ckpt_at(2)).unwrap();

    // Truncated weights.
    let weights = folder.join("model.safetensors");
    let bytes = fs::read(&weights).unwrap();
    fs::write(&weights, &bytes[..bytes.len() - 3]).unwrap();
    match store.load_latest() {
        Err(Error::InvalidFile { path, reason, .. }) => {
            assert_eq!(path, weights.display().to_string());
            assert!(reason.contains("truncated"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    // Same size, flipped byte.
    let mut flipped = bytes.clone();
    let last = flipped.len() - 1;
    flipped[last] ^= 0x40;
    fs::write(&weights, &flipped).unwrap();
    match store.load_latest() {
        Err(Error::InvalidFile { path, reason, .. }) => {
            assert_eq!(path, weights.display().to_string());
            assert!(reason.contains("hash"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    fs::write(&weights, &bytes).unwrap();
    assert_is_ckpt_at(&store.load_latest().unwrap().unwrap(), 2);

    // Missing JSON file.
    let state = folder.join("trainer_state.json");
    fs::remove_file(&state).unwrap();
    match store.load_latest() {
        Err(Error::Io { path, .. }) => assert_eq!(path, state.display().to_string()),
        other => panic!("{other:?}"),
    }
    // Missing manifest.
    fs::remove_file(folder.join("manifest.json")).unwrap();
    let err = store.load_latest().unwrap_err().to_string();
    assert!(err.contains("manifest.json"), "{err}");
    // A pointer that names something else.
    fs::write(dir.join("latest"), "../elsewhere").unwrap();
    let err = store.latest().unwrap_err().to_string();
    assert!(err.contains("latest") && err.contains("elsewhere"), "{err}");
    fs::remove_dir_all(&dir).ok();
}

// ---------------------------------------------------------------------------------------------
// The trainer API, on a toy linear-regression trainer
// ---------------------------------------------------------------------------------------------

/// Linear regression `y = x·w + b` on fixed data, one AdamW step per batch, trlX's
/// `opt.step(); opt.zero_grad(); scheduler.step()` order, plus a fake "KL coefficient" as
/// trainer state.
struct Toy {
    cfg: TrlConfig,
    w: Tensor,
    b: Tensor,
    opt: AdamW,
    sched: CosineAnnealingLr,
    iter_count: usize,
    kl_coef: f64,
    x: Tensor,
    y: Tensor,
    n_batches: usize,
    eval_x: Tensor,
}

impl Toy {
    fn new(cfg: TrlConfig) -> Toy {
        // fixed inputs, not libtorch's global generator: tests of this binary run in parallel
        // threads, and a resumed Toy must see exactly the data of the uninterrupted one
        let x = Tensor::arange(24, (Kind::Float, Device::Cpu))
            .view([8, 3])
            .sin();
        let y = x.matmul(&Tensor::from_slice(&[1.0f32, -2.0, 0.5]).view([3, 1])) + 0.3;
        let w = Tensor::zeros([3, 1], (Kind::Float, Device::Cpu)).set_requires_grad(true);
        let b = Tensor::zeros([1], (Kind::Float, Device::Cpu)).set_requires_grad(true);
        let opt = AdamW::from_kwargs(
            vec![
                ("w".into(), w.shallow_clone()),
                ("b".into(), b.shallow_clone()),
            ],
            &cfg.optimizer.kwargs,
        )
        .unwrap();
        let sched =
            CosineAnnealingLr::from_kwargs(cfg.optimizer.kwargs.lr, &cfg.scheduler.kwargs).unwrap();
        let eval_x = Tensor::from_slice(&[1.0f32, 0.0, 0.0, 0.0, 1.0, 1.0]).view([2, 3]);
        Toy {
            cfg,
            w,
            b,
            opt,
            sched,
            iter_count: 0,
            kl_coef: 0.1,
            x,
            y,
            n_batches: 2,
            eval_x,
        }
    }

    fn total_steps(&self) -> usize {
        // One update per batch (ILQL-style n_updates_per_batch = 1).
        (self.cfg.train.epochs * self.n_batches).min(self.cfg.train.total_steps)
    }

    fn params(&self) -> Vec<(String, Tensor)> {
        vec![
            ("b".into(), self.b.shallow_clone()),
            ("w".into(), self.w.shallow_clone()),
        ]
    }

    fn predict(&self, x: &Tensor) -> Tensor {
        x.matmul(&self.w) + &self.b
    }
}

impl RlTrainer for Toy {
    fn train_config(&self) -> &TrainConfig {
        &self.cfg.train
    }

    fn iter_count(&self) -> usize {
        self.iter_count
    }

    fn act(&mut self, data: &TensorDict) -> torchrl::Result<TensorDict> {
        let x = data.get_or_err("x")?;
        let pred = tch::no_grad(|| self.predict(x));
        data.clone().with("pred", pred)
    }

    fn sample(
        &mut self,
        prompts: &[String],
        length: usize,
        n_samples: usize,
    ) -> torchrl::Result<Vec<String>> {
        Ok(prompts
            .iter()
            .flat_map(|p| std::iter::repeat_n(format!("{p}{}", "x".repeat(length)), n_samples))
            .collect())
    }

    fn learn(&mut self, callbacks: &mut Callbacks<'_>) -> torchrl::Result<()> {
        let total = self.total_steps();
        let per_batch = 8 / self.n_batches as i64;
        while self.iter_count < total {
            let batch = (self.iter_count % self.n_batches) as i64;
            let xb = self.x.narrow(0, batch * per_batch, per_batch);
            let yb = self.y.narrow(0, batch * per_batch, per_batch);
            let loss = (self.predict(&xb) - yb).square().mean(Kind::Float);
            loss.backward();
            self.opt.step()?;
            self.opt.zero_grad();
            self.opt.set_lr(self.sched.step());
            self.kl_coef *= 1.01;
            let step = self.iter_count;
            self.iter_count += 1;
            let stats: Stats = [
                ("loss".to_string(), loss.double_value(&[])),
                ("lr".to_string(), self.opt.lr()),
            ]
            .into();
            self.after_step(step, &stats, self.iter_count == total, callbacks)?;
        }
        Ok(())
    }

    fn evaluate(&mut self) -> torchrl::Result<EvalReport> {
        let preds = tch::no_grad(|| self.predict(&self.eval_x));
        let samples: Vec<String> = Vec::<f32>::try_from(preds.reshape([-1]))?
            .iter()
            .map(|p| format!("{p:.3}"))
            .collect();
        let reward = |s: &[String]| -> torchrl::Result<Vec<f64>> {
            Ok(s.iter()
                .map(|x| x.parse::<f64>().unwrap_or(f64::NAN))
                .collect())
        };
        let above_2 = |s: &[String]| -> torchrl::Result<Vec<f64>> {
            Ok(s.iter()
                .map(|x| f64::from(u8::from(x.parse::<f64>().unwrap_or(0.0) > 2.0)))
                .collect())
        };
        EvalReport::from_samples(samples, Some(&reward), &[("above_2", &above_2)])
    }

    fn get_components(&self) -> Vec<(String, Component)> {
        vec![
            (names::MODEL.into(), Component::tensors(self.params())),
            (names::OPT.into(), Component::from_adamw(&self.opt)),
            (
                names::SCHEDULER.into(),
                Component::from_scheduler(&self.sched),
            ),
            (
                "trainer_state".into(),
                Component::json(json!({ "iter_count": self.iter_count, "kl_coef": self.kl_coef })),
            ),
        ]
    }

    fn set_components(&mut self, mut components: Vec<(String, Component)>) -> torchrl::Result<()> {
        let model = take_component(&mut components, names::MODEL)?;
        let opt = take_component(&mut components, names::OPT)?;
        let sched = take_component(&mut components, names::SCHEDULER)?;
        let state = take_component(&mut components, "trainer_state")?;
        model.copy_into(&self.params())?;
        self.opt.load_state(&opt.tensors, &opt.state)?;
        self.sched = CosineAnnealingLr::from_state_json(&sched.state)?;
        self.iter_count = state.state["iter_count"].as_u64().unwrap_or(0) as usize;
        self.kl_coef = state.state["kl_coef"].as_f64().unwrap_or(f64::NAN);
        Ok(())
    }
}

fn toy_config(dir: &Path, total_steps: usize) -> TrlConfig {
    let mut cfg = TrlConfig::default();
    cfg.train.epochs = 5;
    cfg.train.total_steps = total_steps;
    cfg.train.log_interval = 2;
    cfg.train.eval_interval = 3;
    cfg.train.checkpoint_interval = 4;
    cfg.train.checkpoint_dir = dir.display().to_string();
    cfg.optimizer.kwargs = AdamWKwargs {
        lr: 0.05,
        betas: [0.9, 0.95],
        eps: 1e-8,
        weight_decay: 1e-2,
        fused: false,
    };
    cfg.scheduler.kwargs = CosineKwargs {
        t_max: 8.0,
        eta_min: 0.005,
    };
    cfg.validate().unwrap();
    cfg
}

#[test]
fn learn_calls_callbacks_at_the_trlx_intervals() {
    let dir = temp_dir("toy-intervals");
    let mut toy = Toy::new(toy_config(&dir, 10_000));
    assert_eq!(toy.total_steps(), 10); // 5 epochs * 2 batches
    let (mut logs, mut evals, mut saves) = (Vec::new(), Vec::new(), Vec::new());
    let mut losses = Vec::new();
    {
        let mut cb = Callbacks::new()
            .on_log(|step, stats| {
                logs.push(step);
                losses.push(stats["loss"]);
                Ok(())
            })
            .on_eval(|step, report| {
                evals.push(step);
                assert_eq!(report.samples.len(), 2);
                Ok(())
            })
            .on_save(|step, path| {
                saves.push((step, path.to_path_buf()));
                Ok(())
            });
        toy.learn(&mut cb).unwrap();
    }
    // (step + 1) % 2 == 0 → 1, 3, 5, 7, 9.
    assert_eq!(logs, [1, 3, 5, 7, 9]);
    // (step + 1) % 3 == 0 → 2, 5, 8; plus the last step (9), as trlX HEAD evaluates at the end.
    assert_eq!(evals, [2, 5, 8, 9]);
    // (step + 1) % 4 == 0 → 3, 7; plus the last step (9). Checkpoints carry iter_count.
    let store = CheckpointStore::new(&dir);
    assert_eq!(
        saves,
        [
            (3, store.path_of(4)),
            (7, store.path_of(8)),
            (9, store.path_of(10))
        ]
    );
    assert_eq!(store.steps().unwrap(), [4, 8, 10]);
    assert!(
        losses.last().unwrap() < losses.first().unwrap(),
        "{losses:?}"
    );
    assert_eq!(
        toy.intervals(11),
        Intervals {
            do_log: true,
            do_eval: true,
            do_save: true
        }
    );

    // A callback error stops training at that step.
    let mut toy = Toy::new(toy_config(&temp_dir("toy-stop"), 10_000));
    let mut cb = Callbacks::new().on_log(|step, _| {
        if step == 3 {
            Err(Error::InvalidArgument {
                op: "log",
                message: "stop".into(),
            })
        } else {
            Ok(())
        }
    });
    assert!(toy.learn(&mut cb).is_err());
    assert_eq!(toy.iter_count(), 4);
    fs::remove_dir_all(&dir).ok();
    fs::remove_dir_all(temp_dir("toy-stop")).ok();
}

#[test]
fn evaluate_reports_reward_and_metrics() {
    let dir = temp_dir("toy-eval");
    let mut toy = Toy::new(toy_config(&dir, 10));
    tch::no_grad(|| {
        toy.w
            .copy_(&Tensor::from_slice(&[1.0f32, 2.0, 3.0]).view([3, 1]));
        toy.b.copy_(&Tensor::from_slice(&[0.5f32]));
    });
    // eval_x = [[1, 0, 0], [0, 1, 1]] → predictions 1 + 0.5 = 1.5 and 2 + 3 + 0.5 = 5.5.
    let report = toy.evaluate().unwrap();
    assert_eq!(report.samples, ["1.500", "5.500"]);
    assert_eq!(report.rewards, [1.5, 5.5]);
    assert_eq!(report.mean_reward, Some(3.5));
    assert_eq!(report.metrics["above_2"], 0.5);
    let stats = report.to_stats();
    assert_eq!(stats["mean_reward"], 3.5);
    assert_eq!(stats["metrics/above_2"], 0.5);

    // act and sample through a trait object.
    let trainer: &mut dyn RlTrainer = &mut toy;
    let td = TensorDict::new([1])
        .unwrap()
        .with("x", Tensor::from_slice(&[0.0f32, 0.0, 1.0]).view([1, 3]))
        .unwrap();
    let out = trainer.act(&td).unwrap();
    assert_eq!(f32s(out.get("pred").unwrap()), [3.5]);
    assert_eq!(
        trainer.sample(&["a".into(), "b".into()], 2, 2).unwrap(),
        ["axx", "axx", "bxx", "bxx"]
    );
    let names: Vec<String> = trainer
        .get_components()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(names, ["model", "opt", "scheduler", "trainer_state"]);

    // A reward function that returns the wrong count is an error naming it.
    let short = |_: &[String]| -> torchrl::Result<Vec<f64>> { Ok(vec![1.0]) };
    let err = EvalReport::from_samples(vec!["a".into(), "b".into()], Some(&short), &[])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("reward_fn") && err.contains("one value per sample (2)"),
        "{err}"
    );
}

fn assert_same_state(a: &Toy, b: &Toy) {
    assert!(a.w.equal(&b.w), "w: {:?} vs {:?}", f32s(&a.w), f32s(&b.w));
    assert!(a.b.equal(&b.b));
    for ((na, ta), (nb, tb)) in a
        .opt
        .state_tensors()
        .iter()
        .zip(b.opt.state_tensors().iter())
    {
        assert_eq!(na, nb);
        assert!(ta.equal(tb), "{na}");
    }
    assert_eq!(a.opt.steps(), b.opt.steps());
    assert_eq!(a.opt.lr().to_bits(), b.opt.lr().to_bits());
    assert_eq!(a.sched, b.sched);
    assert_eq!(a.iter_count, b.iter_count);
    assert_eq!(a.kl_coef.to_bits(), b.kl_coef.to_bits());
}

#[test]
fn resumed_training_equals_uninterrupted_training() {
    // Uninterrupted: 10 steps.
    let dir_a = temp_dir("toy-resume-a");
    let mut a = Toy::new(toy_config(&dir_a, 10));
    a.learn(&mut Callbacks::new()).unwrap();
    assert_eq!(a.iter_count(), 10);

    // Interrupted: 6 steps (the last one saves), then a fresh trainer loads and finishes.
    let dir_b = temp_dir("toy-resume-b");
    let mut first = Toy::new(toy_config(&dir_b, 6));
    first.learn(&mut Callbacks::new()).unwrap();
    assert_eq!(CheckpointStore::new(&dir_b).steps().unwrap(), [4, 6]);
    let mut b = Toy::new(toy_config(&dir_b, 10));
    b.load(&dir_b).unwrap();
    assert_same_state(&b, &first);
    b.learn(&mut Callbacks::new()).unwrap();
    assert_same_state(&a, &b);
    assert!(!a.w.equal(&first.w)); // the resumed run did train further

    // Loading where there is nothing is an error naming the folder.
    let empty = temp_dir("toy-resume-empty");
    let err = b.load(&empty).unwrap_err().to_string();
    assert!(err.contains("toy-resume-empty"), "{err}");
    for d in [dir_a, dir_b] {
        fs::remove_dir_all(d).ok();
    }
}

#[test]
fn trainer_crash_mid_save_resumes_from_the_last_good_checkpoint() {
    let dir = temp_dir("toy-crash");
    let mut toy = Toy::new(toy_config(&dir, 4));
    toy.learn(&mut Callbacks::new()).unwrap(); // saves at iter_count 4
    let mut good = Toy::new(toy_config(&dir, 4));
    good.load(&dir).unwrap();

    // Train further (its own saves go elsewhere), then "crash" halfway through writing its
    // checkpoint into the first store.
    let scratch = temp_dir("toy-crash-scratch");
    let mut more = Toy::new(toy_config(&scratch, 8));
    more.load(&dir).unwrap();
    more.learn(&mut Callbacks::new()).unwrap();
    assert_eq!(more.iter_count(), 8);
    let store = CheckpointStore::new(&dir);
    let crash = store.save_with_hook(&more.checkpoint(), &mut |stage| match stage {
        SaveStage::Wrote(f) if f == "opt.safetensors" => Err(Error::InvalidArgument {
            op: "test",
            message: "power cut".into(),
        }),
        _ => Ok(()),
    });
    assert!(crash.is_err());

    let mut resumed = Toy::new(toy_config(&dir, 8));
    resumed.load(&dir).unwrap();
    assert_same_state(&resumed, &good);
    assert_eq!(resumed.iter_count(), 4);
    assert_eq!(store.steps().unwrap(), [4]);
    fs::remove_dir_all(&dir).ok();
    fs::remove_dir_all(&scratch).ok();
}

#[test]
fn set_components_refuses_a_checkpoint_that_does_not_fit() {
    let dir = temp_dir("toy-misfit");
    let store = CheckpointStore::new(&dir);
    store
        .save(
            &Checkpoint::new(1)
                .with_tensors(
                    "model",
                    vec![(
                        "w".into(),
                        Tensor::zeros([2, 1], (Kind::Float, Device::Cpu)),
                    )],
                )
                .with_json("scheduler", json!({})),
        )
        .unwrap();
    let mut toy = Toy::new(toy_config(&dir, 10));
    let err = toy.load(&dir).unwrap_err().to_string();
    assert!(err.contains("\"opt\""), "{err}"); // the missing component is named
    let model = Component::tensors(vec![(
        "w".into(),
        Tensor::zeros([2, 1], (Kind::Float, Device::Cpu)),
    )]);
    match model.copy_into(&toy.params()) {
        Err(Error::KeyNotFound { key, .. }) => assert_eq!(key, "\"b\""),
        other => panic!("{other:?}"),
    }
    fs::remove_dir_all(&dir).ok();
}
