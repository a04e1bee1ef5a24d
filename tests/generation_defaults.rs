//! Generation takes the checkpoint's EOS / pad ids unless the config sets them (as
//! `transformers`' `generate` does), and greedy decoding needs no generator (issue 26, item 9).

use tch::{nn::VarStore, Device, Kind, Tensor};
use torchrl::modules::llm::{
    generate, generate_greedy, models, CausalLm, GenerateOptions, GenerationConfig, Gpt2Config,
    Gpt2Model,
};
use torchrl::Generator;

fn folder(tag: &str) -> std::path::PathBuf {
    let dir =
        std::env::temp_dir().join(format!("torchrl-gen-defaults-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn tiny(vs: &VarStore) -> Gpt2Model {
    let cfg = Gpt2Config::new(40)
        .with_n_layer(1)
        .with_n_embd(16)
        .with_n_head(2)
        .with_n_positions(32);
    Gpt2Model::new(&vs.root(), &cfg).unwrap()
}

/// The first greedy token of `prompt` under `model`, read from a generation that stops nowhere.
fn first_greedy_token(model: &dyn CausalLm, prompt: &Tensor) -> i64 {
    let cfg = GenerationConfig::new(1).with_model_defaults(false);
    let out = generate_greedy(model, prompt, None, &cfg, &GenerateOptions::default()).unwrap();
    out.response.int64_value(&[0, 0])
}

/// A checkpoint whose generation_config.json names as EOS the token greedy decoding emits
/// first: generation with a default config stops after that one token (it ran all 6 steps
/// before, with no EOS), and pads with the EOS id (the checkpoint names no pad id).
#[test]
fn checkpoint_eos_stops_greedy_generation_unless_overridden() {
    tch::manual_seed(3);
    let dir = folder("eos");
    let vs = VarStore::new(Device::Cpu);
    let model = tiny(&vs);
    let prompt = Tensor::from_slice(&[4i64, 9, 2]).view([1, 3]);
    let eos = first_greedy_token(&model, &prompt);
    model.save_pretrained(&dir).unwrap();
    std::fs::write(
        dir.join("generation_config.json"),
        format!(r#"{{"eos_token_id": {eos}}}"#),
    )
    .unwrap();
    let vs2 = VarStore::new(Device::Cpu);
    let loaded = models::from_pretrained(&vs2.root(), &dir).unwrap();
    assert_eq!(loaded.facts().eos_token_id, Some(eos));

    let cfg = GenerationConfig::new(6);
    let out = generate_greedy(
        loaded.as_ref(),
        &prompt,
        None,
        &cfg,
        &GenerateOptions::default(),
    )
    .unwrap();
    assert_eq!(
        out.response.size(),
        vec![1, 1],
        "stopped at the checkpoint's EOS"
    );
    assert_eq!(out.response.int64_value(&[0, 0]), eos);
    let resolved = cfg.resolved(loaded.facts());
    assert_eq!((resolved.eos_token_id, resolved.pad_id()), (Some(eos), eos));

    // an id the config sets wins over the checkpoint's; model_defaults(false) ignores it
    let other = (eos + 1) % 40;
    let own = generate_greedy(
        loaded.as_ref(),
        &prompt,
        None,
        &cfg.clone().with_eos_token_id(other),
        &GenerateOptions::default(),
    )
    .unwrap();
    let ignore = generate_greedy(
        loaded.as_ref(),
        &prompt,
        None,
        &cfg.clone().with_model_defaults(false),
        &GenerateOptions::default(),
    )
    .unwrap();
    assert_eq!(ignore.response.size(), vec![1, 6]);
    assert!(ignore.response_mask.all().int64_value(&[]) == 1);
    // with the other EOS the first token is not EOS, so the row runs past it
    assert!(own.response.size()[1] > 1);
    std::fs::remove_dir_all(&dir).ok();
}

/// A row that finished at the checkpoint's EOS is padded with the checkpoint's pad id.
#[test]
fn checkpoint_pad_id_pads_finished_rows() {
    tch::manual_seed(5);
    let dir = folder("pad");
    let vs = VarStore::new(Device::Cpu);
    let model = tiny(&vs);
    let a = Tensor::from_slice(&[4i64, 9, 2]).view([1, 3]);
    let eos = first_greedy_token(&model, &a);
    // a second row whose first greedy token is not EOS
    let mut b_row = None;
    for start in 0..40i64 {
        let p = Tensor::from_slice(&[start, start, start]).view([1, 3]);
        if first_greedy_token(&model, &p) != eos {
            b_row = Some(p);
            break;
        }
    }
    let b_row = b_row.expect("some prompt starts with another token");
    let pad = (eos + 7) % 40;
    model.save_pretrained(&dir).unwrap();
    std::fs::write(
        dir.join("generation_config.json"),
        format!(r#"{{"eos_token_id": [{eos}], "pad_token_id": {pad}}}"#),
    )
    .unwrap();
    let vs2 = VarStore::new(Device::Cpu);
    let loaded = models::from_pretrained(&vs2.root(), &dir).unwrap();
    let prompt = Tensor::cat(&[a, b_row], 0);
    let out = generate_greedy(
        loaded.as_ref(),
        &prompt,
        None,
        &GenerationConfig::new(4),
        &GenerateOptions::default(),
    )
    .unwrap();
    let g = out.response.size()[1];
    assert!(g >= 2, "row 1 runs on");
    assert_eq!(out.response.int64_value(&[0, 0]), eos);
    for j in 1..g {
        assert_eq!(
            out.response.int64_value(&[0, j]),
            pad,
            "finished row padded at {j}"
        );
        assert_eq!(out.response_mask.int64_value(&[0, j]), 0);
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// Greedy decoding takes `None` for the generator and gives what it gives with one; sampling
/// without one is an error naming the cause.
#[test]
fn greedy_generation_needs_no_generator() {
    tch::manual_seed(0);
    let vs = VarStore::new(Device::Cpu);
    let model = tiny(&vs);
    let prompt = Tensor::from_slice(&[1i64, 2, 3, 4, 5, 6]).view([2, 3]);
    let mask = Tensor::ones([2, 3], (Kind::Int64, Device::Cpu));
    let cfg = GenerationConfig::new(5);
    let without = generate_greedy(
        &model,
        &prompt,
        Some(&mask),
        &cfg,
        &GenerateOptions::default(),
    )
    .unwrap();
    let mut rng = Generator::new(9);
    let with = generate(&model, &prompt, Some(&mask), &cfg, &mut rng).unwrap();
    assert!(without.sequences.equal(&with.sequences));
    assert!(without.log_probs.equal(&with.log_probs));
    // greedy drew nothing from the generator: it is where a fresh one is
    assert_eq!(rng.next_u64(), Generator::new(9).next_u64());
    let err = generate_greedy(
        &model,
        &prompt,
        None,
        &cfg.with_do_sample(true),
        &GenerateOptions::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("do_sample") && err.contains("Generator"),
        "{err}"
    );
}
