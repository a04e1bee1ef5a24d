//! Hostile model files and arguments (issue 29): sizes that overflow, configs that disagree
//! with their weights, truncated weight files, extreme generation and cache arguments. Each
//! test failed (a panic, an abort, a runaway build or an error that named one file) before
//! its fix.

use std::path::{Path, PathBuf};

use tch::nn::VarStore;
use tch::{Device, Tensor};
use torchrl::modules::llm::models::{self, llama::LlamaConfig, llama::LlamaModel};
use torchrl::modules::llm::{
    generate, CausalLm, GenerationConfig, Gpt2Config, Gpt2Model, KvCache, LmInput,
};
use torchrl::Generator;

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("torchrl-hostile-{name}-{}", std::process::id()));
    std::fs::remove_dir_all(&d).ok();
    d
}

fn tiny_gpt2() -> Gpt2Config {
    Gpt2Config::new(20)
        .with_n_layer(2)
        .with_n_embd(8)
        .with_n_head(2)
        .with_n_positions(16)
}

/// A saved tiny GPT-2 folder.
fn saved_gpt2(name: &str) -> PathBuf {
    let d = dir(name);
    let vs = VarStore::new(Device::Cpu);
    Gpt2Model::new(&vs.root(), &tiny_gpt2())
        .unwrap()
        .save_pretrained(&d)
        .unwrap();
    d
}

/// Rewrites one field of `dir/config.json`.
fn set_config(dir: &Path, field: &str, value: serde_json::Value) {
    let path = dir.join("config.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    v[field] = value;
    std::fs::write(&path, serde_json::to_string(&v).unwrap()).unwrap();
}

fn no_cpp_frames(msg: &str) {
    assert!(
        !msg.contains("frame #") && !msg.contains("Exception raised from"),
        "{msg}"
    );
}

#[test]
fn gpt2_widths_that_overflow_are_named_not_panics() {
    // 4 * n_embd overflowed i64 (a debug panic, a wrapped width in release)
    for n_embd in [i64::MAX, i64::MAX / 4 + 1, 1 << 62] {
        let err = Gpt2Config::new(50)
            .with_n_embd(n_embd)
            .with_n_head(1)
            .validate()
            .unwrap_err();
        assert!(err.to_string().contains("n_embd"), "{err}");
    }
    let err = Gpt2Config::new(50)
        .with_n_inner(i64::MAX)
        .validate()
        .unwrap_err();
    assert!(err.to_string().contains("n_inner"), "{err}");
    // vocab * width past the parameter limit, each within its own limit
    let err = Gpt2Config::new(1 << 24)
        .with_n_embd(1 << 22)
        .with_n_head(1)
        .with_n_layer(1)
        .validate()
        .unwrap_err();
    assert!(err.to_string().contains("parameters"), "{err}");
}

#[test]
fn a_huge_layer_count_is_refused_before_any_block_is_built() {
    let d = saved_gpt2("layers");
    set_config(&d, "n_layer", serde_json::json!(1u64 << 20));
    let vs = VarStore::new(Device::Cpu);
    let start = std::time::Instant::now();
    let err = models::from_pretrained(&vs.root(), &d)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("n_layer") && err.contains("config.json"),
        "{err}"
    );
    assert!(start.elapsed().as_secs() < 5);
    assert!(vs.variables().is_empty(), "nothing built");
    let err = Gpt2Config::new(50)
        .with_n_layer(i64::MAX)
        .validate()
        .unwrap_err();
    assert!(err.to_string().contains("n_layer"), "{err}");
}

#[test]
fn a_config_that_disagrees_with_its_weights_names_both_files_before_building() {
    // within every limit, but not the weights' shape: 3 blocks over a 2-block file, a wider
    // MLP, a larger vocabulary
    for (field, value, tensor) in [
        ("n_layer", serde_json::json!(3), "transformer.h.2."),
        ("n_inner", serde_json::json!(64), "mlp.c_fc.weight"),
        (
            "vocab_size",
            serde_json::json!(21),
            "transformer.wte.weight",
        ),
    ] {
        let d = saved_gpt2(&format!("disagree-{field}"));
        set_config(&d, field, value);
        for via in ["auto", "gpt2"] {
            let vs = VarStore::new(Device::Cpu);
            let err = match via {
                "auto" => models::from_pretrained(&vs.root(), &d).map(|_| ()),
                _ => Gpt2Model::from_pretrained(&vs.root(), &d).map(|_| ()),
            }
            .unwrap_err()
            .to_string();
            assert!(err.contains("config.json"), "{err}");
            assert!(err.contains("model.safetensors"), "{err}");
            assert!(err.contains(tensor), "{err}");
            assert!(
                vs.variables().is_empty(),
                "{via}: nothing built before the check"
            );
        }
        std::fs::remove_dir_all(&d).ok();
    }
}

#[test]
fn truncated_or_corrupt_weights_name_the_file_and_offset() {
    let d = saved_gpt2("truncated");
    let file = d.join("model.safetensors");
    let bytes = std::fs::read(&file).unwrap();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("truncated data", bytes[..bytes.len() - 7].to_vec()),
        ("truncated header", bytes[..20].to_vec()),
        ("short", bytes[..5].to_vec()),
        ("huge header length", {
            let mut b = bytes.clone();
            b[..8].copy_from_slice(&u64::MAX.to_le_bytes());
            b
        }),
        ("padded", {
            let mut b = bytes.clone();
            b.extend([0u8; 4]);
            b
        }),
    ];
    for (what, content) in cases {
        std::fs::write(&file, &content).unwrap();
        let vs = VarStore::new(Device::Cpu);
        let err = models::from_pretrained(&vs.root(), &d)
            .unwrap_err()
            .to_string();
        assert!(err.contains("model.safetensors"), "{what}: {err}");
        no_cpp_frames(&err);
        let vs = VarStore::new(Device::Cpu);
        let model = Gpt2Model::new(&vs.root(), &tiny_gpt2()).unwrap();
        let err = model.load_safetensors(&file).unwrap_err().to_string();
        assert!(err.contains("model.safetensors"), "{what}: {err}");
        no_cpp_frames(&err);
    }
    // a header whose shape disagrees with its byte range is refused, naming the tensor
    let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header = std::str::from_utf8(&bytes[8..8 + header_len]).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(header).unwrap();
    v["transformer.ln_f.bias"]["shape"] = serde_json::json!([9]);
    let mut text = serde_json::to_string(&v).unwrap();
    while text.len() < header_len {
        text.push(' ');
    }
    if text.len() == header_len {
        let mut b = bytes[..8].to_vec();
        b.extend(text.as_bytes());
        b.extend(&bytes[8 + header_len..]);
        std::fs::write(&file, b).unwrap();
        let vs = VarStore::new(Device::Cpu);
        let err = models::from_pretrained(&vs.root(), &d)
            .unwrap_err()
            .to_string();
        assert!(err.contains("transformer.ln_f.bias"), "{err}");
    }
    std::fs::remove_dir_all(&d).ok();
}

fn llama(json: serde_json::Value) -> LlamaConfig {
    let mut base = serde_json::json!({"model_type": "llama", "vocab_size": 30,
        "hidden_size": 16, "intermediate_size": 24, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 32});
    for (k, v) in json.as_object().unwrap() {
        base[k] = v.clone();
    }
    serde_json::from_value(base).unwrap()
}

#[test]
fn llama_sizes_that_overflow_are_named_not_panics() {
    for (field, json) in [
        (
            "head_dim",
            serde_json::json!({"num_attention_heads": 1i64 << 20, "num_key_value_heads": 1,
            "head_dim": 1i64 << 22}),
        ),
        ("head_dim", serde_json::json!({"head_dim": i64::MAX - 1})),
        (
            "intermediate_size",
            serde_json::json!({"intermediate_size": i64::MAX}),
        ),
        (
            "num_hidden_layers",
            serde_json::json!({"num_hidden_layers": 1i64 << 40}),
        ),
        ("vocab_size", serde_json::json!({"vocab_size": i64::MAX})),
        (
            "max_position_embeddings",
            serde_json::json!({"max_position_embeddings": i64::MAX}),
        ),
    ] {
        let cfg = llama(json);
        let vs = VarStore::new(Device::Cpu);
        let err = LlamaModel::new(&vs.root(), &cfg).unwrap_err().to_string();
        assert!(err.contains(field), "{field}: {err}");
    }
}

#[test]
fn weight_shapes_match_the_built_models() {
    let check = |model: &dyn CausalLm, shapes: std::collections::BTreeMap<String, Vec<i64>>| {
        let built: std::collections::BTreeMap<String, Vec<i64>> = model
            .named_parameters()
            .into_iter()
            .map(|(n, p)| (n, p.size()))
            .collect();
        assert_eq!(built, shapes);
    };
    let vs = VarStore::new(Device::Cpu);
    let cfg = tiny_gpt2().with_n_inner(12);
    check(
        &Gpt2Model::new(&vs.root(), &cfg).unwrap(),
        cfg.weight_shapes(),
    );
    for json in [
        serde_json::json!({}),
        serde_json::json!({"tie_word_embeddings": true, "attention_bias": true, "mlp_bias": true}),
        serde_json::json!({"model_type": "qwen2"}),
        serde_json::json!({"model_type": "qwen3", "head_dim": 6, "attention_bias": true}),
        serde_json::json!({"model_type": "mistral"}),
    ] {
        let cfg = llama(json);
        let vs = VarStore::new(Device::Cpu);
        check(
            &LlamaModel::new(&vs.root(), &cfg).unwrap(),
            cfg.weight_shapes(),
        );
    }
}

#[test]
fn a_llama_config_that_disagrees_with_its_weights_names_both_files() {
    let d = dir("llama-disagree");
    let cfg = llama(serde_json::json!({}));
    let vs = VarStore::new(Device::Cpu);
    LlamaModel::new(&vs.root(), &cfg)
        .unwrap()
        .save_pretrained(&d)
        .unwrap();
    set_config(&d, "intermediate_size", serde_json::json!(1 << 20));
    let vs = VarStore::new(Device::Cpu);
    let err = LlamaModel::from_pretrained(&vs.root(), &d)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("config.json") && err.contains("model.safetensors"),
        "{err}"
    );
    assert!(err.contains("mlp.gate_proj.weight"), "{err}");
    assert!(vs.variables().is_empty());
    std::fs::remove_dir_all(&d).ok();
}

#[test]
fn generation_budgets_that_overflow_are_named_not_panics() {
    let vs = VarStore::new(Device::Cpu);
    let model = Gpt2Model::new(&vs.root(), &tiny_gpt2()).unwrap();
    let prompt = Tensor::from_slice(&[1i64, 2]).view([1, 2]);
    let mut rng = Generator::new(0);
    for max_new in [i64::MAX, i64::MAX - 1] {
        let err = generate(
            &model,
            &prompt,
            None,
            &GenerationConfig::new(max_new),
            &mut rng,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("max_new_tokens"), "{err}");
    }
}

#[test]
fn a_cache_of_absurd_depth_allocates_nothing_and_is_refused_by_the_model() {
    let mut cache = KvCache::new(usize::MAX);
    assert_eq!(cache.n_layer(), usize::MAX);
    assert!(cache.is_empty());
    let vs = VarStore::new(Device::Cpu);
    let model = Gpt2Model::new(&vs.root(), &tiny_gpt2()).unwrap();
    let ids = Tensor::from_slice(&[1i64, 2]).view([1, 2]);
    let err = model
        .forward(&LmInput::new(&ids), Some(&mut cache))
        .unwrap_err()
        .to_string();
    assert!(err.contains("cache"), "{err}");
    // a model's own cache still works, block by block
    let mut cache = model.new_cache();
    model
        .forward(&LmInput::new(&ids), Some(&mut cache))
        .unwrap();
    assert_eq!(cache.len(), 2);
}

#[test]
fn a_rope_table_that_would_be_nan_is_refused_before_building() {
    // before: theta = 1e-300 built a model whose every angle was NaN (an unusable Ok), and
    // a bad rope factor was found only after every block was built
    for (json, field) in [
        (serde_json::json!({"rope_theta": 1e-300}), "rope_theta"),
        (
            serde_json::json!({"rope_scaling": {"rope_type": "linear", "factor": -2.0}}),
            "factor",
        ),
    ] {
        let cfg = llama(json);
        let err = cfg.validate().unwrap_err().to_string();
        assert!(err.contains(field), "{err}");
        let vs = VarStore::new(Device::Cpu);
        assert!(LlamaModel::new(&vs.root(), &cfg).is_err());
        assert!(vs.variables().is_empty(), "nothing built");
    }
    // a tiny but sound theta still works
    let cfg = llama(serde_json::json!({"rope_theta": 0.5}));
    let vs = VarStore::new(Device::Cpu);
    let model = LlamaModel::new(&vs.root(), &cfg).unwrap();
    let ids = Tensor::from_slice(&[1i64, 2, 3]).view([1, 3]);
    let logits = model
        .forward(&LmInput::new(&ids), None)
        .unwrap()
        .logits()
        .unwrap();
    assert!(bool::try_from(logits.isfinite().all()).unwrap());
}

#[test]
fn weights_of_an_integer_or_unreadable_dtype_are_named_before_building() {
    let d = saved_gpt2("dtype");
    let file = d.join("model.safetensors");
    let tensors = Tensor::read_safetensors(&file).unwrap();
    // a weight stored as int64: before, it was cast to float silently
    let edited: Vec<(String, Tensor)> = tensors
        .iter()
        .map(|(n, t)| {
            let t = if n.ends_with("ln_f.weight") {
                t.to_kind(tch::Kind::Int64)
            } else {
                t.shallow_clone()
            };
            (n.clone(), t)
        })
        .collect();
    Tensor::write_safetensors(&edited, &file).unwrap();
    let vs = VarStore::new(Device::Cpu);
    let err = models::from_pretrained(&vs.root(), &d)
        .unwrap_err()
        .to_string();
    assert!(err.contains("ln_f.weight (I64)"), "{err}");
    assert!(vs.variables().is_empty());
    // a dtype libtorch does not read here (F8) is named with the tensor, not libtorch's text
    let bytes = std::fs::read(&file).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header = std::str::from_utf8(&bytes[8..8 + n]).unwrap();
    let f8 = header.replacen("\"I64\"", "\"U64\"", 1);
    let mut b = bytes[..8].to_vec();
    b.extend(f8.as_bytes());
    b.extend(&bytes[8 + n..]);
    std::fs::write(&file, b).unwrap();
    let err = models::from_pretrained(&vs.root(), &d)
        .unwrap_err()
        .to_string();
    assert!(err.contains("U64") && err.contains("ln_f.weight"), "{err}");
    std::fs::remove_dir_all(&d).ok();
}

#[test]
fn head_widths_that_overflow_are_named_not_panics() {
    use torchrl::modules::llm::{IlqlHeads, MlpHead};
    // before: 2 * n_embd overflowed (a panic)
    let vs = VarStore::new(Device::Cpu);
    let err = MlpHead::new(&vs.root(), i64::MAX, 1).unwrap_err();
    assert!(err.to_string().contains("n_embd"), "{err}");
    assert!(IlqlHeads::new(&vs.root(), i64::MAX / 2 + 1, 5, true, 0.5).is_err());
    // a head too large for memory is libtorch's allocation error, not an abort
    assert!(MlpHead::new(&vs.root(), 1 << 20, 1 << 40).is_err());
}

#[test]
fn a_tensor_held_by_two_shards_is_named() {
    // before: the later shard's copy silently won
    let d = saved_gpt2("twice");
    let single = d.join("model.safetensors");
    let tensors = Tensor::read_safetensors(&single).unwrap();
    std::fs::remove_file(&single).unwrap();
    let (a, b): (Vec<_>, Vec<_>) = tensors.iter().enumerate().partition(|(i, _)| i % 2 == 0);
    let mut map = serde_json::Map::new();
    let mut write = |part: Vec<&(String, Tensor)>, file: &str| {
        let named: Vec<(String, Tensor)> = part
            .iter()
            .map(|(n, t)| (n.clone(), t.shallow_clone()))
            .collect();
        Tensor::write_safetensors(&named, d.join(file)).unwrap();
        for (n, _) in &named {
            map.entry(n.clone()).or_insert(serde_json::json!(file));
        }
    };
    let first = a.first().map(|(_, t)| t).unwrap();
    write(
        a.iter().map(|(_, t)| *t).collect(),
        "model-00001-of-00002.safetensors",
    );
    let mut b: Vec<&(String, Tensor)> = b.iter().map(|(_, t)| *t).collect();
    b.push(first);
    write(b, "model-00002-of-00002.safetensors");
    let index = serde_json::json!({"metadata": {}, "weight_map": map});
    std::fs::write(d.join("model.safetensors.index.json"), index.to_string()).unwrap();
    let vs = VarStore::new(Device::Cpu);
    let err = models::from_pretrained(&vs.root(), &d)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("held twice") && err.contains(&first.0),
        "{err}"
    );
    std::fs::remove_dir_all(&d).ok();
}

/// A load that fails after its header check (an I/O error half-way, a file replaced between the
/// check and the read) used to leave the new model's variables in the caller's store. Every
/// `from_pretrained` now builds and loads through `nn::build_staged`: here the late failure is
/// staged by hand, with the weights of another shape read where the checked ones were.
#[test]
fn a_load_that_fails_after_its_header_check_adds_nothing_to_the_store() {
    use torchrl::modules::llm::nn::build_staged;
    let good = saved_gpt2("late-good");
    let other = dir("late-other");
    let vs = VarStore::new(Device::Cpu);
    Gpt2Model::new(&vs.root(), &tiny_gpt2().with_n_embd(12))
        .unwrap()
        .save_pretrained(&other)
        .unwrap();
    // what `Gpt2Model::from_pretrained` does once the header check has passed, with the
    // weights swapped for the other model's
    let store = VarStore::new(Device::Cpu);
    let err = build_staged(&store.root().sub("policy"), |p| {
        let model = Gpt2Model::new(p, &tiny_gpt2())?;
        model.load_folder(&other)?;
        Ok(model)
    })
    .map(|_| ())
    .unwrap_err()
    .to_string();
    assert!(err.contains("does not fit the model"), "{err}");
    assert!(
        store.variables().is_empty(),
        "a failed load added variables"
    );
    assert!(store.trainable_variables().is_empty());
    // the same store then takes the good folder: every variable, none suffixed
    let model = Gpt2Model::from_pretrained(&store.root().sub("policy"), &good).unwrap();
    let names: std::collections::BTreeSet<String> = store.variables().into_keys().collect();
    assert!(
        names
            .iter()
            .all(|n| n.starts_with("policy.") && !n.contains("__")),
        "{names:?}"
    );
    assert_eq!(names.len(), model.named_parameters().len());
    std::fs::remove_dir_all(&good).ok();
    std::fs::remove_dir_all(&other).ok();
}

/// A staged build lists the same variables, with the same names, values and trainable order,
/// as a build straight into the store followed by the same load: optimizers and gradient
/// clipping (which walk `trainable_variables()`) see what they saw before.
#[test]
fn from_pretrained_through_a_staged_build_matches_a_direct_build_and_load() {
    for folder in [
        "specs/gpt2/tiny_v101",
        "specs/llama/qwen2_mqa",
        "specs/llama/qwen3_head_dim",
    ] {
        let d = Path::new(env!("CARGO_MANIFEST_DIR")).join(folder);
        let staged = VarStore::new(Device::Cpu);
        let _a = models::from_pretrained(&staged.root().sub("m"), &d).unwrap();
        let direct = VarStore::new(Device::Cpu);
        let b = models::from_config_file(&direct.root().sub("m"), &d.join("config.json")).unwrap();
        b.load_folder(&d).unwrap();
        let mut x: Vec<(String, Tensor)> = staged.variables().into_iter().collect();
        let mut y: Vec<(String, Tensor)> = direct.variables().into_iter().collect();
        x.sort_by(|p, q| p.0.cmp(&q.0));
        y.sort_by(|p, q| p.0.cmp(&q.0));
        assert_eq!(x.len(), y.len(), "{folder}");
        for ((nx, tx), (ny, ty)) in x.iter().zip(&y) {
            assert_eq!(nx, ny, "{folder}");
            assert!(tx.equal(ty), "{folder}: {nx}");
            assert_eq!(tx.requires_grad(), ty.requires_grad(), "{folder}: {nx}");
        }
        let tx = staged.trainable_variables();
        let ty = direct.trainable_variables();
        assert_eq!(tx.len(), ty.len(), "{folder}");
        for (a, b) in tx.iter().zip(&ty) {
            assert_eq!(a.size(), b.size(), "{folder}");
            assert!(a.equal(b), "{folder}: trainable order");
        }
    }
}
