//! Hostile optimizer, schedule, trainer-config and spec values (issue 29): state loaded from a
//! file obeys the constructors' rules, counters are range-checked, no schedule yields a
//! non-finite rate, configs round-trip, overflowing shapes are refused. Each test failed (a
//! value accepted, then a panic or a NaN) before its fix.

use serde_json::json;
use tch::{Kind, Tensor};
use torchrl::data::specs::{Categorical, Unbounded};
use torchrl::trainers::config::TrlConfig;
use torchrl::trainers::optim::{AdamW, CosineAnnealingLr, MAX_STEPS};
use torchrl::Error;

fn param() -> Tensor {
    Tensor::from_slice(&[1.0f32, -2.0]).set_requires_grad(true)
}

/// An optimizer that took one step, and its saved state.
fn stepped() -> (AdamW, Tensor, Vec<(String, Tensor)>, serde_json::Value) {
    let p = param();
    let mut opt = AdamW::new(vec![("p".into(), p.shallow_clone())], 0.1).unwrap();
    (&p * &p).sum(Kind::Float).backward();
    opt.step().unwrap();
    let tensors = opt
        .state_tensors()
        .into_iter()
        .map(|(n, t)| (n, t.copy()))
        .collect();
    let state = opt.state_json();
    (opt, p, tensors, state)
}

fn snapshot(opt: &AdamW) -> (Vec<Vec<f32>>, serde_json::Value) {
    let t = opt
        .state_tensors()
        .iter()
        .map(|(_, t)| Vec::<f32>::try_from(t).unwrap())
        .collect();
    (t, opt.state_json())
}

#[test]
fn adamw_load_state_refuses_what_the_constructor_refuses_and_changes_nothing() {
    let (_, _, tensors, state) = stepped();
    let bad_values = [
        ("betas", json!([1.5, 0.9])),
        ("betas", json!([0.9, -0.1])),
        ("betas", json!([0.9, 1.0])),
        ("eps", json!(-1e-8)),
        ("eps", json!(0.0)),
        ("weight_decay", json!(-0.5)),
        ("lr", json!(-1.0)),
    ];
    let fresh = param();
    let mut target = AdamW::new(vec![("p".into(), fresh)], 0.5).unwrap();
    let before = snapshot(&target);
    for (field, value) in bad_values {
        let mut s = state.clone();
        s[field] = value.clone();
        let err = target.load_state(&tensors, &s).unwrap_err();
        assert!(err.to_string().contains(field), "{field} = {value}: {err}");
        assert_eq!(snapshot(&target), before, "{field} = {value}: unchanged");
    }
    // NaN cannot be written in JSON, but a number that is not one is refused too
    let mut s = state.clone();
    s["eps"] = json!("nan");
    assert!(target.load_state(&tensors, &s).is_err());
    // the saved state itself loads
    target.load_state(&tensors, &state).unwrap();
    assert_eq!(target.steps(), [1]);
}

#[test]
fn adamw_step_counts_past_the_limit_are_refused() {
    // before: u64::MAX loaded, and the next step overflowed (a panic)
    let (_, _, tensors, state) = stepped();
    let p = param();
    let mut target = AdamW::new(vec![("p".into(), p.shallow_clone())], 0.5).unwrap();
    for steps in [u64::MAX, MAX_STEPS + 1] {
        let mut s = state.clone();
        s["step"]["p"] = json!(steps);
        let err = target.load_state(&tensors, &s).unwrap_err();
        assert!(err.to_string().contains("step.p"), "{err}");
    }
    let mut s = state.clone();
    s["step"]["p"] = json!(MAX_STEPS);
    target.load_state(&tensors, &s).unwrap();
    (&p * &p).sum(Kind::Float).backward();
    target.step().unwrap();
    assert_eq!(target.steps(), [MAX_STEPS + 1]);
    assert!(bool::try_from(p.isfinite().all()).unwrap());
}

#[test]
fn adamw_moments_that_are_not_finite_are_refused() {
    let (_, _, tensors, state) = stepped();
    let mut target = AdamW::new(vec![("p".into(), param())], 0.5).unwrap();
    let before = snapshot(&target);
    for (key, value) in [
        ("exp_avg.p", f32::NAN),
        ("exp_avg_sq.p", f32::INFINITY),
        ("exp_avg_sq.p", -1.0),
    ] {
        let bad: Vec<(String, Tensor)> = tensors
            .iter()
            .map(|(n, t)| {
                let t = if n == key {
                    Tensor::from_slice(&[value, 0.0])
                } else {
                    t.copy()
                };
                (n.clone(), t)
            })
            .collect();
        let err = target.load_state(&bad, &state).unwrap_err();
        assert!(err.to_string().contains(key), "{key}: {err}");
        assert_eq!(snapshot(&target), before);
    }
}

#[test]
fn no_cosine_schedule_yields_a_non_finite_rate() {
    // before: T_max = 5e-324 was accepted and the first step gave NaN
    for t_max in [5e-324, 1e-300, f64::MIN_POSITIVE] {
        let err = CosineAnnealingLr::new(1e-3, t_max, 0.0).unwrap_err();
        assert!(err.to_string().contains("T_max"), "{err}");
    }
    let err = CosineAnnealingLr::new(1e308, 10.0, 0.0).unwrap_err();
    assert!(err.to_string().contains("base_lr"), "{err}");
    // the smallest accepted T_max and the largest rates stay finite at every step count
    let s = CosineAnnealingLr::new(1e300, 1e-275, 1e300).unwrap();
    for e in [0, 1, 2, 1 << 20, MAX_STEPS, u64::MAX] {
        assert!(s.lr_at(e).is_finite(), "step {e}");
    }
    // TrlConfig::validate refuses the same values, naming the field
    let mut cfg = TrlConfig::default();
    cfg.scheduler.kwargs.t_max = 5e-324;
    let err = cfg.validate().unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidConfig {
                field: "scheduler.kwargs.T_max",
                ..
            }
        ),
        "{err}"
    );
    let text = "[scheduler.kwargs]\nT_max = 5e-324\n";
    let err = TrlConfig::from_toml_str(text).unwrap_err();
    assert!(err.to_string().contains("scheduler.kwargs.T_max"), "{err}");
}

#[test]
fn a_schedule_counter_past_the_limit_is_refused() {
    // before: last_epoch = u64::MAX loaded, and step() overflowed (a panic)
    let mut s = CosineAnnealingLr::new(1.0, 4.0, 0.0).unwrap();
    s.step();
    let mut state = s.state_json();
    state["last_epoch"] = json!(u64::MAX);
    let err = CosineAnnealingLr::from_state_json(&state).unwrap_err();
    assert!(err.to_string().contains("last_epoch"), "{err}");
    state["T_max"] = json!(1e-320);
    state["last_epoch"] = json!(1);
    assert!(CosineAnnealingLr::from_state_json(&state).is_err());
    // a counter at the limit still steps
    let mut at_limit = CosineAnnealingLr::new(1.0, 4.0, 0.0).unwrap();
    at_limit.last_epoch = u64::MAX;
    assert!(at_limit.step().is_finite());
}

#[test]
fn max_grad_norm_none_survives_toml_and_json() {
    // before: to_toml left the field out and the reload clipped at the default 1.0
    let mut cfg = TrlConfig::default();
    cfg.train.max_grad_norm = None;
    let toml = cfg.to_toml().unwrap();
    assert_eq!(TrlConfig::from_toml_str(&toml).unwrap(), cfg, "{toml}");
    let js = cfg.to_json().unwrap();
    assert_eq!(TrlConfig::from_json_str(&js).unwrap(), cfg, "{js}");
    // null in JSON, and numbers, read as before
    let cfg2 = TrlConfig::from_json_str(r#"{"train": {"max_grad_norm": null}}"#).unwrap();
    assert_eq!(cfg2.train.max_grad_norm, None);
    let cfg3 = TrlConfig::from_toml_str("[train]\nmax_grad_norm = 0.5\n").unwrap();
    assert_eq!(cfg3.train.max_grad_norm, Some(0.5));
    let cfg4 = TrlConfig::from_toml_str("[train]\nmax_grad_norm = 2\n").unwrap();
    assert_eq!(cfg4.train.max_grad_norm, Some(2.0));
    assert!(TrlConfig::from_toml_str("[train]\nmax_grad_norm = true\n").is_err());
    let default = TrlConfig::default();
    let back = TrlConfig::from_toml_str(&default.to_toml().unwrap()).unwrap();
    assert_eq!(back, default);
}

#[test]
fn spec_shapes_whose_element_count_overflows_are_refused() {
    // before: accepted, and zero() failed in libtorch
    for shape in [
        vec![0, i64::MAX, 0],
        vec![i64::MAX, 2],
        vec![1 << 32, 1 << 32],
    ] {
        let err = Unbounded::new().with_shape(&shape).unwrap_err();
        assert!(err.to_string().contains("shape"), "{err}");
        assert!(Categorical::new(3).unwrap().with_shape(&shape).is_err());
    }
    // the largest accepted extent still makes a (empty) tensor
    let big = Unbounded::new()
        .with_shape([0, i64::MAX / 8, 0])
        .unwrap()
        .with_dtype(Kind::Double)
        .unwrap();
    assert_eq!(big.zero(&[]).unwrap().size(), vec![0, i64::MAX / 8, 0]);
}

#[test]
fn config_parse_errors_name_the_field_not_only_the_type() {
    // before: "invalid type: string "x", expected usize at line 1 column 28"
    let err = TrlConfig::from_json_str(r#"{"train": {"seed": 1, "batch_size": "x"}}"#)
        .unwrap_err()
        .to_string();
    assert!(err.contains("train.batch_size"), "{err}");
    let err = TrlConfig::from_json_str("{\"method\": {\"gen_kwargs\": {\"top_p\": [1]}}}")
        .unwrap_err()
        .to_string();
    assert!(err.contains("method.gen_kwargs.top_p"), "{err}");
    let err = TrlConfig::from_toml_str("[train]\nseed = 1\nbatch_size = \"x\"\n")
        .unwrap_err()
        .to_string();
    assert!(err.contains("train.batch_size"), "{err}");
    let path = std::env::temp_dir().join(format!("hostile-cfg-{}.json", std::process::id()));
    std::fs::write(
        &path,
        "{\n  \"optimizer\": {\"kwargs\": {\"betas\": [0.9, \"b\"]}}\n}",
    )
    .unwrap();
    let err = TrlConfig::from_file(&path).unwrap_err().to_string();
    assert!(err.contains("optimizer.kwargs.betas[1]"), "{err}");
    assert!(err.contains(&path.display().to_string()), "{err}");
    std::fs::remove_file(&path).ok();
    // a model config.json names the field and the file
    let dir = std::env::temp_dir().join(format!("hostile-cfg-model-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("config.json");
    std::fs::write(
        &file,
        r#"{"model_type": "gpt2", "vocab_size": 3, "n_layer": "x"}"#,
    )
    .unwrap();
    let err = torchrl::modules::llm::Gpt2Config::from_json_file(&file)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("n_layer") && err.contains("config.json"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

fn fnv1a64(data: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in data {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

#[test]
fn a_checkpoint_safetensors_file_with_a_hostile_header_is_named_even_with_a_valid_hash() {
    use torchrl::trainers::checkpoint::{Checkpoint, CheckpointStore};
    let dir = std::env::temp_dir().join(format!("hostile-ckpt-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let ckpt = Checkpoint::new(1).with_tensors(
        "model",
        vec![("w".into(), Tensor::from_slice(&[1.0f32, 2.0, 3.0]))],
    );
    let saved = CheckpointStore::new(&dir).save(&ckpt).unwrap();
    let file = saved.join("model.safetensors");
    let bytes = std::fs::read(&file).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header = std::str::from_utf8(&bytes[8..8 + n]).unwrap().to_string();
    // the shape says 4 elements where the offsets hold 3 (same header length)
    let hostile = header.replacen("[3]", "[4]", 1);
    assert_ne!(hostile, header);
    let mut edited = bytes[..8].to_vec();
    edited.extend(hostile.as_bytes());
    edited.extend(&bytes[8 + n..]);
    std::fs::write(&file, &edited).unwrap();
    // the manifest updated to match, as a hand-made checkpoint would be
    let manifest_path = saved.join("manifest.json");
    let mut manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&manifest_path).unwrap()).unwrap();
    for entry in manifest["files"].as_array_mut().unwrap() {
        if entry["name"] == "model" {
            entry["fnv1a64"] = json!(format!("{:016x}", fnv1a64(&edited)));
            entry["bytes"] = json!(edited.len());
        }
    }
    std::fs::write(&manifest_path, manifest.to_string()).unwrap();
    let err = Checkpoint::load(&saved).unwrap_err().to_string();
    assert!(err.contains("model.safetensors"), "{err}");
    assert!(err.contains("tensor w"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn an_env_batch_too_large_for_memory_is_refused_at_construction() {
    use torchrl::envs::llm::config::MAX_BATCH_TOKENS;
    use torchrl::envs::llm::{TokenEnv, TokenEnvConfig, TokenScorer};
    use torchrl::envs::EnvBase;
    use torchrl::modules::llm::ByteTokenizer;
    // before: accepted, and the first reset aborted the process on a 26 TB allocation
    for b in [1i64 << 40, 1 << 33, MAX_BATCH_TOKENS / 16 + 1] {
        let c = TokenEnvConfig::new(259, 16)
            .with_max_new_tokens(4)
            .with_batch_size(b);
        let scorer = TokenScorer::new(|_p: &[i64], _r: &[i64]| 0.0);
        let err = TokenEnv::from_text(c, &ByteTokenizer::new(), &["ab"], Box::new(scorer))
            .unwrap_err()
            .to_string();
        assert!(err.contains("batch_size"), "{err}");
    }
    let c = TokenEnvConfig::new(259, 16)
        .with_max_new_tokens(4)
        .with_batch_size(4);
    let scorer = TokenScorer::new(|_p: &[i64], _r: &[i64]| 0.0);
    let mut env = TokenEnv::from_text(c, &ByteTokenizer::new(), &["ab"], Box::new(scorer)).unwrap();
    assert!(env.reset(None).is_ok());
}

#[test]
fn a_rollout_with_a_huge_step_budget_stops_at_done_without_reserving_it() {
    use torchrl::envs::builtin::CartPoleEnv;
    use torchrl::envs::{EnvBase, RolloutConfig};
    // before: Vec::with_capacity(max_steps) asked for the whole budget up front (a capacity
    // overflow panic for usize::MAX, an allocation abort for 2^40)
    for n in [1usize << 40, usize::MAX] {
        let mut env = CartPoleEnv::new(&[2], tch::Device::Cpu).unwrap();
        env.set_seed(0).unwrap();
        let td = env.rollout(n, None, &RolloutConfig::default()).unwrap();
        assert_eq!(td.batch_size().first(), Some(&2));
    }
}

#[test]
fn an_mlp_depth_past_the_limit_is_named_not_allocated() {
    use torchrl::modules::models::MlpConfig;
    // before: vec![32; depth] overflowed its capacity (a panic) or aborted on the allocation
    for depth in [usize::MAX, 1 << 40] {
        let err = MlpConfig::new(3, 2)
            .with_depth(depth)
            .hidden_widths()
            .unwrap_err();
        assert!(err.to_string().contains("depth"), "{err}");
    }
    assert_eq!(
        MlpConfig::new(3, 2).with_depth(2).hidden_widths().unwrap(),
        vec![32, 32]
    );
}

/// `VecNorm::load` / `load_state_dict` took any statistics with the right keys: a negative or
/// zero count, a negative sum of squares, NaN, integer dtypes or mismatched shapes loaded and
/// the next forward normalized to NaN or to wrong values; and a file's errors did not name it.
/// Each is refused now, naming the key (and the file), and the statistics stay as they were.
#[test]
fn vecnorm_statistics_that_no_update_produces_are_refused() {
    use torchrl::envs::transforms::VecNorm;
    use torchrl::TensorDict;
    let good = || {
        TensorDict::new(Vec::<i64>::new())
            .unwrap()
            .with("observation_sum", Tensor::from_slice(&[2.0f32, 4.0]))
            .unwrap()
            .with("observation_ssq", Tensor::from_slice(&[3.0f32, 9.0]))
            .unwrap()
            .with("observation_count", Tensor::from_slice(&[2.0f32]))
            .unwrap()
    };
    let norm = VecNorm::new().with_in_keys(["observation"]);
    norm.load_state_dict(&good()).unwrap();
    let (loc, _) = norm.loc_scale("observation").unwrap();
    assert_eq!(Vec::<f32>::try_from(&loc).unwrap(), vec![1.0, 2.0]);
    let cases: Vec<(&str, &str, Tensor)> = vec![
        (
            "observation_count",
            "count > 0",
            Tensor::from_slice(&[0.0f32]),
        ),
        (
            "observation_count",
            "count > 0",
            Tensor::from_slice(&[-3.0f32]),
        ),
        (
            "observation_count",
            "count > 0",
            Tensor::from_slice(&[1.0f32, 1.0]),
        ),
        (
            "observation_ssq",
            "≥ 0",
            Tensor::from_slice(&[-1.0f32, 9.0]),
        ),
        (
            "observation_sum",
            "finite",
            Tensor::from_slice(&[f32::NAN, 4.0]),
        ),
        (
            "observation_ssq",
            "finite",
            Tensor::from_slice(&[f32::INFINITY, 9.0]),
        ),
        (
            "observation_sum",
            "floating",
            Tensor::from_slice(&[2i64, 4]),
        ),
        (
            "observation_ssq",
            "[2]",
            Tensor::from_slice(&[3.0f32, 9.0, 1.0]),
        ),
    ];
    for (key, says, value) in cases {
        let mut state = good();
        state.set(key, value).unwrap();
        let err = norm.load_state_dict(&state).unwrap_err().to_string();
        assert!(err.contains(key) && err.contains(says), "{key}: {err}");
        // unchanged
        let (after, _) = norm.loc_scale("observation").unwrap();
        assert_eq!(
            Vec::<f32>::try_from(&after).unwrap(),
            vec![1.0, 2.0],
            "{key}"
        );
    }
    // from a file: the error names it
    let dir = std::env::temp_dir().join(format!("torchrl-vecnorm-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("stats.safetensors");
    let mut state = good();
    state
        .set("observation_count", Tensor::from_slice(&[0.0f32]))
        .unwrap();
    state.save(&path).unwrap();
    let err = norm.load(&path).unwrap_err().to_string();
    assert!(err.contains(&path.display().to_string()), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}
