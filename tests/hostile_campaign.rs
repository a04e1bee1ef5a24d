//! A bounded mutation campaign over what issue 29's first parts cover (a smoke version of the
//! fuzz campaign still to come): extreme values in a model's `config.json`, random edits of a
//! `tokenizer.json`, extreme generation arguments. Properties: no panic (every call runs under
//! `catch_unwind`; an abort would end the test binary), `Ok` or an `Err`, and an `Ok` is
//! usable (a forward with finite logits, an encode / decode, a generation).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;

use proptest::prelude::*;
use serde_json::{json, Value};
use tch::nn::VarStore;
use tch::{Device, Tensor};
use torchrl::modules::llm::models::llama::LlamaModel;
use torchrl::modules::llm::{
    generate, models, CausalLm, GenerationConfig, Gpt2Config, Gpt2Model, HfTokenizer, LmInput,
    SpecialTokens, TextTokenizer,
};
use torchrl::Generator;

fn extreme() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(json!(i64::MIN)),
        Just(json!(-1)),
        Just(json!(0)),
        Just(json!(1)),
        Just(json!(2)),
        Just(json!(3)),
        Just(json!(7)),
        Just(json!(16)),
        Just(json!(1u64 << 31)),
        Just(json!(1u64 << 40)),
        Just(json!(i64::MAX)),
        Just(json!(u64::MAX)),
        Just(json!(1e-300)),
        Just(json!(1e300)),
        Just(json!(-0.5)),
        Just(json!(0.5)),
        Just(json!("x")),
        Just(Value::Null),
        Just(json!(true)),
        Just(json!([1, 2])),
        Just(json!({"rope_type": "linear", "factor": 0.0})),
    ]
}

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("torchrl-campaign-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// `Ok` models must run a forward with finite logits.
fn usable(model: &dyn CausalLm) -> Result<(), String> {
    let ids = Tensor::from_slice(&[0i64]).view([1, 1]);
    let logits = model
        .forward(&LmInput::new(&ids), None)
        .and_then(|o| o.logits())
        .map_err(|e| format!("forward of a loaded model: {e}"))?;
    if bool::try_from(logits.isfinite().all()).unwrap_or(false) {
        Ok(())
    } else {
        Err("non-finite logits from a loaded model".into())
    }
}

/// Mutates `field` of the saved folder's config.json and loads it three ways.
fn load_mutated(
    folder: &std::path::Path,
    field: &str,
    value: &Value,
    llama: bool,
) -> Result<(), String> {
    let work = folder.with_extension(format!("m{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).unwrap();
    for f in std::fs::read_dir(folder).unwrap() {
        let f = f.unwrap();
        std::fs::copy(f.path(), work.join(f.file_name())).unwrap();
    }
    let cfg_path = work.join("config.json");
    let mut cfg: Value =
        serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
    cfg[field] = value.clone();
    std::fs::write(&cfg_path, cfg.to_string()).unwrap();
    let outcome = catch_unwind(AssertUnwindSafe(|| -> Result<(), String> {
        let vs = VarStore::new(Device::Cpu);
        if let Ok(m) = models::from_pretrained(&vs.root(), &work) {
            usable(m.as_ref())?;
        }
        let vs = VarStore::new(Device::Cpu);
        let direct = if llama {
            LlamaModel::from_pretrained(&vs.root(), &work).map(|m| Box::new(m) as Box<dyn CausalLm>)
        } else {
            Gpt2Model::from_pretrained(&vs.root(), &work).map(|m| Box::new(m) as Box<dyn CausalLm>)
        };
        if let Ok(m) = direct {
            usable(m.as_ref())?;
        }
        Ok(())
    }));
    let _ = std::fs::remove_dir_all(&work);
    match outcome {
        Ok(r) => r,
        Err(_) => Err(format!("panic with {field} = {value}")),
    }
}

fn gpt2_folder() -> PathBuf {
    let d = dir("gpt2");
    if !d.join("config.json").exists() {
        let vs = VarStore::new(Device::Cpu);
        let cfg = Gpt2Config::new(20)
            .with_n_layer(1)
            .with_n_embd(8)
            .with_n_head(2)
            .with_n_positions(8);
        Gpt2Model::new(&vs.root(), &cfg)
            .unwrap()
            .save_pretrained(&d)
            .unwrap();
    }
    d
}

fn llama_folder() -> PathBuf {
    let d = dir("llama");
    if !d.join("config.json").exists() {
        let cfg = serde_json::from_value(json!({"model_type": "qwen3", "vocab_size": 20,
            "hidden_size": 8, "intermediate_size": 12, "num_hidden_layers": 1,
            "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 4,
            "max_position_embeddings": 8, "tie_word_embeddings": false}))
        .unwrap();
        let vs = VarStore::new(Device::Cpu);
        LlamaModel::new(&vs.root(), &cfg)
            .unwrap()
            .save_pretrained(&d)
            .unwrap();
    }
    d
}

const GPT2_FIELDS: &[&str] = &[
    "vocab_size",
    "n_positions",
    "n_embd",
    "n_layer",
    "n_head",
    "n_inner",
    "layer_norm_epsilon",
    "initializer_range",
    "activation_function",
    "scale_attn_weights",
    "scale_attn_by_inverse_layer_idx",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "tie_word_embeddings",
    "model_type",
];

const LLAMA_FIELDS: &[&str] = &[
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "max_position_embeddings",
    "rms_norm_eps",
    "rope_theta",
    "rope_scaling",
    "rope_parameters",
    "attention_bias",
    "mlp_bias",
    "tie_word_embeddings",
    "sliding_window",
    "use_sliding_window",
    "hidden_act",
    "eos_token_id",
];

/// Random edits of the spec's tokenizer.json: a value anywhere replaced.
fn edit_json(v: &mut Value, path: &[usize], new: Value) {
    let Some((&i, rest)) = path.split_first() else {
        *v = new;
        return;
    };
    let child = match v {
        Value::Object(m) if !m.is_empty() => {
            let n = m.len();
            m.values_mut().nth(i % n)
        }
        Value::Array(a) if !a.is_empty() => {
            let n = a.len();
            a.get_mut(i % n)
        }
        _ => None,
    };
    match child {
        Some(c) => edit_json(c, rest, new),
        None => *v = new,
    }
}

fn spec_tokenizer() -> Value {
    let path: PathBuf = [
        env!("CARGO_MANIFEST_DIR"),
        "specs",
        "tokenizer",
        "tokenizer.json",
    ]
    .iter()
    .collect();
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn mutated_model_configs_load_or_fail_cleanly(
        gpt2 in any::<bool>(), field in any::<prop::sample::Index>(), value in extreme()) {
        let (folder, fields) = if gpt2 {
            (gpt2_folder(), GPT2_FIELDS)
        } else {
            (llama_folder(), LLAMA_FIELDS)
        };
        let field = fields[field.index(fields.len())];
        load_mutated(&folder, field, &value, !gpt2).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn mutated_tokenizers_load_or_fail_cleanly(
        path in proptest::collection::vec(any::<usize>(), 1..6), value in extreme(),
        text in "\\PC{0,12}") {
        let mut v = spec_tokenizer();
        edit_json(&mut v, &path, value);
        let p = std::env::temp_dir().join(format!(
            "torchrl-campaign-tok-{}-{}.json", std::process::id(), path.len()));
        std::fs::write(&p, v.to_string()).unwrap();
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            if let Ok(tok) = HfTokenizer::from_file(&p) {
                if let Ok(ids) = tok.encode(&text) {
                    let _ = tok.decode(&ids, SpecialTokens::Keep);
                    let _ = tok.decode(&ids, SpecialTokens::Skip);
                }
                let n = tok.vocab_size();
                let _ = tok.decode(&[0, n / 2, n - 1], SpecialTokens::Keep);
            }
        }));
        std::fs::remove_file(&p).ok();
        prop_assert!(outcome.is_ok(), "panic");
    }

    #[test]
    fn extreme_generation_arguments_fail_cleanly(
        max_new in prop_oneof![Just(i64::MIN), Just(-1i64), 0i64..8, Just(i64::MAX)],
        min_new in prop_oneof![Just(i64::MIN), 0i64..8, Just(i64::MAX)],
        top_k in prop_oneof![Just(i64::MIN), 0i64..30, Just(i64::MAX)],
        top_p in prop_oneof![Just(-1.0f64), Just(1e-300), 0.0f64..1.0, Just(1.0), Just(2.0)],
        temperature in prop_oneof![Just(1e-300), Just(1e300), 0.01f64..10.0, Just(-1.0)],
        do_sample in any::<bool>(),
        eos in prop_oneof![Just(None), Just(Some(-1i64)), Just(Some(3i64)), Just(Some(i64::MAX))],
    ) {
        let vs = VarStore::new(Device::Cpu);
        let cfg = Gpt2Config::new(20).with_n_layer(1).with_n_embd(8).with_n_head(2)
            .with_n_positions(8);
        let model = Gpt2Model::new(&vs.root(), &cfg).unwrap();
        let gen = GenerationConfig {
            max_new_tokens: max_new,
            min_new_tokens: min_new,
            do_sample,
            temperature,
            top_k,
            top_p,
            eos_token_id: eos,
            pad_token_id: None,
            model_defaults: true,
        };
        let prompt = Tensor::from_slice(&[1i64, 2]).view([1, 2]);
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            generate(&model, &prompt, None, &gen, &mut Generator::new(0)).map(|o| o.sequences)
        }));
        match outcome {
            Err(_) => prop_assert!(false, "panic"),
            Ok(Ok(seq)) => {
                let ids = Vec::<i64>::try_from(seq.view([-1])).unwrap();
                prop_assert!(ids.iter().all(|&i| (0..20).contains(&i)), "{:?}", ids);
            }
            Ok(Err(_)) => {}
        }
    }
}
