//! `transformers` loads what we save (cargo feature `python-refs`; issue 22): every supported
//! architecture (the configs of the recorded GPT-2, Llama, Llama-3 rope, Mistral, Qwen2 and
//! Qwen3 folders), the two sequence classifiers and a PEFT adapter are built here, every
//! parameter is moved off its initial value (so that biases, norms and q/k norms are checked
//! too), saved with our `save_pretrained` / `save_adapter`, and our logits or scores on a
//! left-padded batch are written beside them. `tests/python/transformers_loads.py` then loads
//! each folder with `AutoModelForCausalLM` / `AutoModelForSequenceClassification` / PEFT's
//! `PeftModel` (no missing, unexpected or mis-shaped tensor allowed) and compares its outputs
//! with ours to 1e-4 at every valid position.
//!
//! The Python is `TORCHRL_PYTHON`, else the cached environment's (`scripts/setup.sh` with
//! `TORCHRL_WITH_PYTHON_REFS=1` installs transformers; PEFT too).
#![cfg(feature = "python-refs")]

use std::path::{Path, PathBuf};

use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};
use torchrl::modules::llm::models;
use torchrl::modules::llm::nn::with_init_seed;
use torchrl::modules::llm::{lora, CausalLm, CausalLmWithScoreHead, LmInput, LoraConfig};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf()
}

fn python() -> PathBuf {
    if let Some(p) = std::env::var_os("TORCHRL_PYTHON") {
        return p.into();
    }
    let cache = std::env::var_os("TORCHRL_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/torchrl-rs")
        });
    cache.join("venv/bin/python")
}

/// Moves every tensor of `params` off its initial value by a deterministic pattern in
/// ±0.1 (different for each tensor), so that a tensor loaded under a wrong name or left at
/// its initial value shows in the outputs.
fn perturb(params: &[(String, &Tensor)]) {
    let _g = tch::no_grad_guard();
    for (i, (_, p)) in params.iter().enumerate() {
        let n = p.numel() as i64;
        let pattern = Tensor::arange(n, (Kind::Float, Device::Cpu))
            .f_mul_scalar(0.37 + 0.013 * i as f64)
            .unwrap()
            .sin()
            .f_mul_scalar(0.1)
            .unwrap()
            .view(p.size().as_slice())
            .to_kind(p.kind());
        let _ = p.shallow_clone().f_add_(&pattern).unwrap();
    }
}

/// A left-padded batch of 2 rows × 6 (row 0 with 2 pads), ids in `[3, vocab)`.
fn batch(vocab: i64) -> (Tensor, Tensor) {
    let mask = Tensor::from_slice(&[0i64, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]).view([2, 6]);
    let ids = Tensor::arange(12, (Kind::Int64, Device::Cpu))
        .f_mul_scalar(7)
        .unwrap()
        .remainder(vocab - 3)
        .f_add_scalar(3)
        .unwrap()
        .view([2, 6]);
    let ids = ids.where_self(&mask.ne(0), &Tensor::zeros_like(&ids));
    (ids, mask)
}

fn write_ours(file: &Path, ids: &Tensor, mask: &Tensor, name: &str, out: &Tensor) {
    Tensor::write_safetensors(
        &[
            ("input_ids", ids.shallow_clone()),
            ("attention_mask", mask.shallow_clone()),
            (name, out.detach().contiguous()),
        ],
        file,
    )
    .unwrap();
}

/// Our logits on [`batch`], written as `dir/ours.safetensors` (returned).
fn write_our_logits(model: &dyn CausalLm, dir: &Path) -> PathBuf {
    let (ids, mask) = batch(model.facts().vocab_size);
    let logits = tch::no_grad(|| {
        model
            .forward(&LmInput::new(&ids).with_attention_mask(&mask), None)
            .and_then(|o| o.logits())
    })
    .unwrap();
    let ours = dir.join("ours.safetensors");
    write_ours(&ours, &ids, &mask, "logits", &logits);
    ours
}

#[test]
fn transformers_loads_every_folder_we_save() {
    let work = std::env::temp_dir().join(format!("torchrl-hf-loads-{}", std::process::id()));
    std::fs::remove_dir_all(&work).ok();
    std::fs::create_dir_all(&work).unwrap();
    let mut cases = Vec::new();

    // causal LMs, one per recorded architecture folder
    for folder in [
        "specs/gpt2/tiny_v101",
        "specs/llama/llama_bias_linear_v4",
        "specs/llama/llama_gqa_llama3",
        "specs/llama/mistral_window",
        "specs/llama/qwen2_mqa",
        "specs/llama/qwen3_head_dim",
    ] {
        let name = folder.rsplit('/').next().unwrap();
        let cfg = models::config_from_file(&root().join(folder).join("config.json")).unwrap();
        let vs = VarStore::new(Device::Cpu);
        let model = with_init_seed(11, || cfg.build(&vs.root())).unwrap();
        perturb(&model.named_parameters());
        let dir = work.join(name);
        model.save_pretrained(&dir).unwrap();
        let ours = write_our_logits(model.as_ref(), &dir);
        cases.push(serde_json::json!({
            "name": name, "kind": "causal", "dir": dir, "ours": ours,
        }));
    }

    // the sequence classifiers (GPT-2 and Qwen2 with `score.weight`)
    for folder in ["specs/gpt2/score_v90", "specs/llama/qwen2_score"] {
        let name = folder.rsplit('/').next().unwrap();
        let cfg = models::config_from_file(&root().join(folder).join("config.json")).unwrap();
        let vs = VarStore::new(Device::Cpu);
        let head = with_init_seed(12, || {
            let trunk = cfg.build(&vs.root())?;
            CausalLmWithScoreHead::from_model(&vs.root(), trunk)
        })
        .unwrap();
        perturb(&head.named_parameters());
        let dir = work.join(name);
        head.save_pretrained(&dir).unwrap();
        let (ids, mask) = batch(cfg.facts().vocab_size);
        let score =
            tch::no_grad(|| head.forward(&LmInput::new(&ids).with_attention_mask(&mask))).unwrap();
        let ours = dir.join("ours.safetensors");
        write_ours(&ours, &ids, &mask, "score", &score);
        cases.push(serde_json::json!({
            "name": name, "kind": "score", "dir": dir, "ours": ours,
        }));
    }

    // a PEFT adapter on q / v of a Qwen3 base (B moved off zero so that it counts)
    {
        let cfg = models::config_from_file(&root().join("specs/llama/qwen3_head_dim/config.json"))
            .unwrap();
        let vs = VarStore::new(Device::Cpu);
        let mut model = with_init_seed(13, || cfg.build(&vs.root())).unwrap();
        perturb(&model.named_parameters());
        let base = work.join("peft_base");
        model.save_pretrained(&base).unwrap();
        let config = LoraConfig::new(4).with_target_modules(&["q_proj", "v_proj"]);
        with_init_seed(14, || {
            lora::inject_adapter(model.as_mut(), &vs.root().sub("lora"), &config)
        })
        .unwrap();
        perturb(&model.adapter_parameters());
        let dir = work.join("peft_adapter");
        lora::save_adapter(model.as_ref(), &config, &dir).unwrap();
        let ours = write_our_logits(model.as_ref(), &dir);
        cases.push(serde_json::json!({
            "name": "qwen3_lora_qv", "kind": "peft", "dir": dir, "base": base, "ours": ours,
        }));
    }

    let manifest = work.join("manifest.json");
    std::fs::write(
        &manifest,
        serde_json::to_string_pretty(&serde_json::json!({ "cases": cases })).unwrap(),
    )
    .unwrap();
    let script = root().join("tests/python/transformers_loads.py");
    let out = std::process::Command::new(python())
        .arg(&script)
        .arg(&manifest)
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", python().display()));
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    eprintln!("{text}");
    assert!(
        out.status.success(),
        "transformers did not load what we saved:\n{text}"
    );
    assert!(
        text.contains(&format!("all {} cases loaded and matched", cases.len())),
        "{text}"
    );
    std::fs::remove_dir_all(&work).ok();
}
