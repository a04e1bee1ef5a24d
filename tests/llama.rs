//! The Llama family (`modules::llm::models::llama`: Llama, Mistral, Qwen2, Qwen3) against
//! `transformers`: tiny random-init checkpoints saved by `save_pretrained` and their logits,
//! recorded by `specs/record_llama.py` into `specs/llama/` and `specs/llama_cases.json`.

mod recorded;

use recorded::{file, int_tensor, tensor};
use serde_json::Value;
use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};
use torchrl::modules::llm::models::llama::{LlamaConfig, LlamaModel};
use torchrl::modules::llm::{
    models, CausalLm, CausalLmWithHydraValueHead, CausalLmWithScoreHead, LmInput,
};

const RECORDER: &str = "record_llama.py";
const NAMES: [&str; 5] = [
    "llama_gqa_llama3",
    "llama_bias_linear_v4",
    "qwen2_mqa",
    "qwen3_head_dim",
    "mistral_window",
];

fn dir(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("specs")
        .join("llama")
        .join(name)
}

fn case(name: &str, which: &str) -> Value {
    let all = file("llama_cases.json", RECORDER);
    all["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .find(|c| c["name"] == format!("{name}/{which}"))
        .unwrap_or_else(|| panic!("no case {name}/{which}"))
        .clone()
}

/// The largest difference over the positions whose mask is 1.
fn max_masked_diff(ours: &Tensor, theirs: &Tensor, mask: Option<&Tensor>) -> f64 {
    let d = (ours.to_kind(Kind::Double) - theirs).abs();
    let d = match mask {
        Some(m) => d * m.to_kind(Kind::Double).unsqueeze(-1),
        None => d,
    };
    d.max().double_value(&[])
}

#[test]
fn every_family_member_matches_transformers_logits() {
    for name in NAMES {
        let vs = VarStore::new(Device::Cpu);
        // the Auto entry point dispatches on model_type
        let model = models::from_pretrained(&vs.root(), dir(name)).unwrap();
        for which in ["logits_plain", "logits_left_pad"] {
            let c = case(name, which);
            let ids = int_tensor(&c["args"]["input_ids"]);
            let mask = (!c["args"]["attention_mask"].is_null())
                .then(|| int_tensor(&c["args"]["attention_mask"]));
            let mut input = LmInput::new(&ids);
            if let Some(m) = &mask {
                input = input.with_attention_mask(m);
            }
            let logits = model.forward(&input, None).unwrap().logits().unwrap();
            let want = tensor(&c["expect"]["logits"]);
            let d = max_masked_diff(&logits, &want, mask.as_ref());
            eprintln!("{name}/{which}: max abs diff {d:.2e}");
            assert!(d < 1e-4, "{name}/{which}: {d}");
        }
    }
}

#[test]
fn both_config_forms_and_the_eos_list_are_read() {
    // 4.x: rope_theta + rope_scaling {"type": "linear"}; 5.x: rope_parameters
    let v4 = LlamaConfig::from_json_file(dir("llama_bias_linear_v4").join("config.json")).unwrap();
    let v5 = LlamaConfig::from_json_file(dir("llama_gqa_llama3").join("config.json")).unwrap();
    let (theta4, s4) = v4.rope().unwrap();
    assert_eq!(theta4, 10_000.0);
    assert!(
        matches!(s4, torchrl::modules::llm::nn::RopeScaling::Linear { factor } if factor == 2.0)
    );
    let (theta5, s5) = v5.rope().unwrap();
    assert_eq!(theta5, 500_000.0);
    assert!(matches!(
        s5,
        torchrl::modules::llm::nn::RopeScaling::Llama3 { factor, .. } if factor == 8.0
    ));
    // Llama 3's list of EOS ids: the first is the facts' EOS
    assert_eq!(v5.facts().eos_token_id, Some(2));
    assert_eq!(v5.facts().pad_token_id, Some(0));
    // a window shorter than the context is refused by name; Qwen's is off unless switched on
    let mut short: LlamaConfig = serde_json::from_str(
        r#"{"model_type": "mistral", "vocab_size": 10, "sliding_window": 16,
            "max_position_embeddings": 64}"#,
    )
    .unwrap();
    assert!(short
        .validate()
        .unwrap_err()
        .to_string()
        .contains("sliding_window"));
    short.model_type = "qwen2".into();
    assert!(short.validate().is_ok());
    short.use_sliding_window = Some(true);
    assert!(short.validate().is_err());
    // unknown types are named
    let e: LlamaConfig =
        serde_json::from_str(r#"{"model_type": "gemma", "vocab_size": 10}"#).unwrap();
    assert!(e.validate().unwrap_err().to_string().contains("gemma"));
}

#[test]
fn a_saved_folder_loads_back_and_heads_run_on_it() {
    let tmp = std::env::temp_dir().join(format!("torchrl-llama-{}", std::process::id()));
    for name in ["qwen3_head_dim", "llama_bias_linear_v4"] {
        let vs = VarStore::new(Device::Cpu);
        let model = LlamaModel::from_pretrained(&vs.root(), dir(name)).unwrap();
        model.save_pretrained(&tmp).unwrap();
        // what transformers reads back: no nulls (Qwen2 fails on "head_dim": null), the
        // resolved head layout, the architecture
        let written: Value =
            serde_json::from_str(&std::fs::read_to_string(tmp.join("config.json")).unwrap())
                .unwrap();
        let obj = written.as_object().unwrap();
        assert!(obj.values().all(|v| !v.is_null()), "{written}");
        assert_eq!(written["head_dim"], model.config().head_dim());
        assert_eq!(written["num_key_value_heads"], model.config().kv_heads());
        assert!(written["architectures"][0]
            .as_str()
            .unwrap()
            .ends_with("ForCausalLM"));
        let vs2 = VarStore::new(Device::Cpu);
        let again = models::from_pretrained(&vs2.root(), &tmp).unwrap();
        let ids = Tensor::from_slice(&[3i64, 4, 5, 6]).view([1, 4]);
        let a = model
            .forward(&LmInput::new(&ids), None)
            .unwrap()
            .logits()
            .unwrap();
        let b = again
            .forward(&LmInput::new(&ids), None)
            .unwrap()
            .logits()
            .unwrap();
        assert!(a.equal(&b), "{name}");
        // the tied model saves no lm_head.weight, as transformers does
        let names: Vec<String> = model
            .named_parameters()
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        assert_eq!(
            names.contains(&"lm_head.weight".to_string()),
            !model.config().tie_word_embeddings
        );
        // hydra (one unfrozen block) and a score head on it
        let vs3 = VarStore::new(Device::Cpu);
        let hydra = CausalLmWithHydraValueHead::from_model(
            &vs3.root(),
            LlamaModel::from_pretrained(&vs3.root(), dir(name)).unwrap(),
            1,
        )
        .unwrap();
        let out = hydra.forward(&LmInput::new(&ids)).unwrap();
        assert!((out.logits - out.ref_logits).abs().max().double_value(&[]) < 1e-5);
        let vs4 = VarStore::new(Device::Cpu);
        let score = CausalLmWithScoreHead::from_model(
            &vs4.root(),
            LlamaModel::from_pretrained(&vs4.root(), dir(name)).unwrap(),
        )
        .unwrap();
        assert_eq!(score.forward(&LmInput::new(&ids)).unwrap().size(), vec![1]);
    }
    let _ = std::fs::remove_dir_all(&tmp);
}

#[test]
fn greedy_tokens_and_incremental_decoding_match() {
    use torchrl::modules::llm::{generate, GenerationConfig};
    for name in NAMES {
        let vs = VarStore::new(Device::Cpu);
        let model = models::from_pretrained(&vs.root(), dir(name)).unwrap();
        let c = case(name, "greedy");
        let prompt = int_tensor(&c["args"]["input_ids"]);
        let mask = int_tensor(&c["args"]["attention_mask"]);
        // recorded with `eos_token_id=None`, which overrides the checkpoint's EOS
        let cfg = GenerationConfig::new(8)
            .with_pad_token_id(0)
            .with_model_defaults(false);
        let out = generate(
            model.as_ref(),
            &prompt,
            Some(&mask),
            &cfg,
            &mut torchrl::Generator::new(0),
        )
        .unwrap();
        let want = int_tensor(&c["expect"]["sequences"]);
        assert!(out.sequences.equal(&want), "{name}: {:?}", out.sequences);
        // one token at a time through the cache = the full forward, at every real position
        let full_mask = Tensor::cat(
            &[&mask, &Tensor::ones([3, 8], (Kind::Int64, Device::Cpu))],
            1,
        );
        let full = model
            .forward(&LmInput::new(&want).with_attention_mask(&full_mask), None)
            .unwrap()
            .logits()
            .unwrap();
        let mut cache = model.new_cache();
        for t in 0..13 {
            let step =
                model
                    .forward(
                        &LmInput::new(&want.narrow(1, t, 1))
                            .with_attention_mask(&full_mask.narrow(1, 0, t + 1)),
                        Some(&mut cache),
                    )
                    .unwrap()
                    .logits()
                    .unwrap();
            let d = max_masked_diff(
                &step.squeeze_dim(1),
                &full.select(1, t).to_kind(Kind::Double),
                Some(&full_mask.select(1, t)),
            );
            assert!(d < 1e-4, "{name} step {t}: {d}");
        }
    }
}

#[test]
fn a_qwen2_sequence_classifier_scores_as_transformers() {
    let vs = VarStore::new(Device::Cpu);
    let rm = CausalLmWithScoreHead::from_pretrained(&vs.root(), dir("qwen2_score")).unwrap();
    for which in ["score_left_pad", "score_right_pad"] {
        let c = case("qwen2_score", which);
        let ids = int_tensor(&c["args"]["input_ids"]);
        let mask = int_tensor(&c["args"]["attention_mask"]);
        let score = rm
            .forward(&LmInput::new(&ids).with_attention_mask(&mask))
            .unwrap();
        let want = tensor(&c["expect"]["score"]);
        let d = (score.to_kind(Kind::Double) - want)
            .abs()
            .max()
            .double_value(&[]);
        assert!(d < 1e-4, "{which}: {d}");
    }
    // no LM head in a sequence classifier's names
    assert!(rm
        .named_parameters()
        .iter()
        .all(|(n, _)| n != "lm_head.weight"));
    // saved as `transformers` saves a one-label classifier (tests/transformers_loads.rs loads
    // it with AutoModelForSequenceClassification): without `id2label` it built two labels and
    // refused `score.weight`
    let tmp = std::env::temp_dir().join(format!("torchrl-qwen2-score-{}", std::process::id()));
    rm.save_pretrained(&tmp).unwrap();
    let saved: Value =
        serde_json::from_slice(&std::fs::read(tmp.join("config.json")).unwrap()).unwrap();
    let recorded: Value =
        serde_json::from_slice(&std::fs::read(dir("qwen2_score").join("config.json")).unwrap())
            .unwrap();
    for field in ["architectures", "id2label", "label2id", "model_type"] {
        assert_eq!(saved[field], recorded[field], "{field}");
    }
    let vs2 = VarStore::new(Device::Cpu);
    let back = CausalLmWithScoreHead::from_pretrained(&vs2.root(), &tmp).unwrap();
    let ids = Tensor::from_slice(&[3i64, 4, 5]).view([1, 3]);
    let (a, b) = (
        rm.forward(&LmInput::new(&ids)).unwrap(),
        back.forward(&LmInput::new(&ids)).unwrap(),
    );
    assert!(a.equal(&b));
    std::fs::remove_dir_all(&tmp).ok();
}

/// A copy of a recorded folder in a fresh temporary directory.
fn copy_folder(name: &str, tag: &str) -> std::path::PathBuf {
    let to = std::env::temp_dir().join(format!("torchrl-llama-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&to);
    std::fs::create_dir_all(&to).unwrap();
    for f in ["config.json", "generation_config.json", "model.safetensors"] {
        std::fs::copy(dir(name).join(f), to.join(f)).unwrap();
    }
    to
}

#[test]
fn sharded_checkpoints_load_and_bad_shards_are_named() {
    let name = "llama_gqa_llama3";
    let folder = copy_folder(name, "shards");
    // split model.safetensors into two shards with an index, as transformers writes them
    let tensors = Tensor::read_safetensors(folder.join("model.safetensors")).unwrap();
    std::fs::remove_file(folder.join("model.safetensors")).unwrap();
    let (a, b): (Vec<_>, Vec<_>) = tensors
        .into_iter()
        .enumerate()
        .partition(|(i, _)| i % 2 == 0);
    let shard = |part: Vec<(usize, (String, Tensor))>, file: &str| {
        let named: Vec<(String, Tensor)> = part.into_iter().map(|(_, nt)| nt).collect();
        Tensor::write_safetensors(&named, folder.join(file)).unwrap();
        named.into_iter().map(|(n, _)| n).collect::<Vec<_>>()
    };
    let names_a = shard(a, "model-00001-of-00002.safetensors");
    let names_b = shard(b, "model-00002-of-00002.safetensors");
    let mut map = serde_json::Map::new();
    for n in names_a {
        map.insert(n, "model-00001-of-00002.safetensors".into());
    }
    for n in names_b {
        map.insert(n, "model-00002-of-00002.safetensors".into());
    }
    let index = serde_json::json!({"metadata": {}, "weight_map": map});
    std::fs::write(
        folder.join("model.safetensors.index.json"),
        index.to_string(),
    )
    .unwrap();
    let vs = VarStore::new(Device::Cpu);
    let model = models::from_pretrained(&vs.root(), &folder).unwrap();
    let c = case(name, "logits_plain");
    let ids = int_tensor(&c["args"]["input_ids"]);
    let logits = model
        .forward(&LmInput::new(&ids), None)
        .unwrap()
        .logits()
        .unwrap();
    let d = max_masked_diff(&logits, &tensor(&c["expect"]["logits"]), None);
    assert!(d < 1e-4, "{d}");
    // generation_config.json's EOS list gives the facts' EOS (its first id)
    assert_eq!(model.facts().eos_token_id, Some(2));
    // a missing shard is named, and nothing is half-loaded
    let before: Vec<Tensor> = model
        .named_parameters()
        .into_iter()
        .map(|(_, t)| t.copy())
        .collect();
    std::fs::rename(
        folder.join("model-00002-of-00002.safetensors"),
        folder.join("gone.safetensors"),
    )
    .unwrap();
    let err = model.load_folder(&folder).unwrap_err().to_string();
    assert!(err.contains("model-00002-of-00002"), "{err}");
    // a truncated shard is refused by name
    let bytes = std::fs::read(folder.join("gone.safetensors")).unwrap();
    std::fs::write(
        folder.join("model-00002-of-00002.safetensors"),
        &bytes[..bytes.len() / 2],
    )
    .unwrap();
    let err = model.load_folder(&folder).unwrap_err().to_string();
    assert!(err.contains("model-00002-of-00002"), "{err}");
    for ((_, now), was) in model.named_parameters().into_iter().zip(&before) {
        assert!(now.equal(was));
    }
    let _ = std::fs::remove_dir_all(&folder);
}

#[test]
fn generation_config_ids_are_the_defaults() {
    let folder = copy_folder("qwen2_mqa", "genconf");
    std::fs::write(
        folder.join("generation_config.json"),
        r#"{"bos_token_id": 4, "eos_token_id": [7, 8], "pad_token_id": 9}"#,
    )
    .unwrap();
    let vs = VarStore::new(Device::Cpu);
    let model = models::from_pretrained(&vs.root(), &folder).unwrap();
    let f = model.facts();
    assert_eq!(
        (f.bos_token_id, f.eos_token_id, f.pad_token_id),
        (Some(4), Some(7), Some(9))
    );
    // without the file, config.json's ids
    std::fs::remove_file(folder.join("generation_config.json")).unwrap();
    let vs2 = VarStore::new(Device::Cpu);
    let model = models::from_pretrained(&vs2.root(), &folder).unwrap();
    assert_eq!(model.facts().eos_token_id, Some(2));
    let _ = std::fs::remove_dir_all(&folder);
}

#[test]
fn bf16_checkpoints_load_into_the_dtype_asked_for() {
    // a bfloat16 copy of a recorded folder
    let folder = copy_folder("qwen3_head_dim", "bf16");
    let tensors = Tensor::read_safetensors(folder.join("model.safetensors")).unwrap();
    let bf16: Vec<(String, Tensor)> = tensors
        .into_iter()
        .map(|(n, t)| (n, t.to_kind(Kind::BFloat16)))
        .collect();
    Tensor::write_safetensors(&bf16, folder.join("model.safetensors")).unwrap();
    let ids = Tensor::from_slice(&[3i64, 4, 5, 6, 7]).view([1, 5]);
    // into float32 parameters: the bf16 values, exactly
    let vs = VarStore::new(Device::Cpu);
    let f32_model = models::from_pretrained(&vs.root(), &folder).unwrap();
    assert_eq!(f32_model.kind(), Kind::Float);
    let (name, want) = &bf16[0];
    let got = f32_model
        .named_parameters()
        .into_iter()
        .find(|(n, _)| n == name)
        .unwrap()
        .1
        .shallow_clone();
    assert!(got.equal(&want.to_kind(Kind::Float)));
    // into bfloat16 parameters (the store converted after loading): the same model in bf16
    let mut vs16 = VarStore::new(Device::Cpu);
    let bf16_model = models::from_pretrained(&vs16.root(), &folder).unwrap();
    vs16.bfloat16();
    assert_eq!(bf16_model.kind(), Kind::BFloat16);
    let a = f32_model
        .forward(&LmInput::new(&ids), None)
        .unwrap()
        .logits()
        .unwrap();
    let b = bf16_model
        .forward(&LmInput::new(&ids), None)
        .unwrap()
        .logits()
        .unwrap();
    assert_eq!(b.kind(), Kind::BFloat16);
    let d = (a - b.to_kind(Kind::Float)).abs().max().double_value(&[]);
    assert!(d < 0.1, "bf16 vs f32 logits: {d}");
    let _ = std::fs::remove_dir_all(&folder);
}
