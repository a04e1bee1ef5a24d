//! GPT-2 fidelity: checkpoints written by `transformers` (`specs/record_gpt2.py`) load by
//! name, their logits match the recorded ones to 1e-4 (plain and left-padded batches), and
//! greedy generation reproduces `transformers`' tokens exactly (with and without EOS, with
//! `min_new_tokens`). Plus the model's own invariants: incremental decoding equals a full
//! forward, left padding does not change a row's logits, bad checkpoints and inputs are errors.

mod common;

use std::path::PathBuf;

use common::{load_cases, tensor_from_json, Value};
use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};
use torchrl::modules::llm::{
    generate, generate_with, CausalLm, GenerateOptions, GenerationConfig, Gpt2Model, LmInput,
    LogitMask,
};
use torchrl::{Error, Generator};

fn model_dir(name: &str) -> PathBuf {
    [env!("CARGO_MANIFEST_DIR"), "specs", "gpt2", name]
        .iter()
        .collect()
}

fn load(name: &str) -> (VarStore, Gpt2Model) {
    let vs = VarStore::new(Device::Cpu);
    let model = Gpt2Model::from_pretrained(&vs.root(), model_dir(name)).unwrap();
    (vs, model)
}

fn opt_tensor(v: &Value) -> Option<Tensor> {
    if v.is_null() {
        None
    } else {
        Some(tensor_from_json(v).unwrap())
    }
}

fn max_abs_diff(a: &Tensor, b: &Tensor) -> f64 {
    (a - b).abs().max().double_value(&[])
}

/// The recorded cases of one op, each with its model (named by the case's prefix) and its
/// `input_ids`.
fn cases_of(op: &str) -> Vec<(common::Case, VarStore, Gpt2Model, Tensor)> {
    let file = load_cases("gpt2_cases.json");
    file.cases
        .into_iter()
        .filter(|c| c.op == op)
        .map(|case| {
            let (vs, model) = load(case.name.split('/').next().unwrap());
            let ids = tensor_from_json(case.arg("input_ids").unwrap()).unwrap();
            (case, vs, model, ids)
        })
        .collect()
}

#[test]
fn recorded_logits_match_transformers() {
    let mut n = 0;
    for (case, _vs, model, ids) in cases_of("logits") {
        let mask = opt_tensor(case.arg("attention_mask").unwrap());
        let pos = opt_tensor(case.arg("position_ids").unwrap());
        let expected = tensor_from_json(case.expect.get("logits").unwrap()).unwrap();
        let mut input = LmInput::new(&ids);
        if let Some(m) = &mask {
            input = input.with_attention_mask(m);
        }
        if let Some(p) = &pos {
            input = input.with_position_ids(p);
        }
        let got = model.forward(&input, None).unwrap().logits().unwrap();
        assert_eq!(got.size(), expected.size(), "{}", case.name);
        // only real (unmasked) positions are meaningful
        let keep = match &mask {
            Some(m) => m.to_kind(Kind::Bool).unsqueeze(-1).expand_as(&got),
            None => Tensor::ones(got.size(), (Kind::Bool, Device::Cpu)),
        };
        let diff = (got - &expected)
            .abs()
            .masked_select(&keep)
            .max()
            .double_value(&[]);
        assert!(diff < 1e-4, "{}: max |diff| {diff}", case.name);
        // the same logits when the model computes the position ids from the mask
        if let (Some(m), Some(_)) = (&mask, &pos) {
            let got2 = model
                .forward(&LmInput::new(&ids).with_attention_mask(m), None)
                .unwrap()
                .logits()
                .unwrap();
            let diff = (got2 - &expected)
                .abs()
                .masked_select(&keep)
                .max()
                .double_value(&[]);
            assert!(diff < 1e-4, "{} (default positions): {diff}", case.name);
        }
        n += 1;
    }
    assert_eq!(n, 4);
}

#[test]
fn greedy_generation_matches_transformers() {
    let mut n = 0;
    for (case, _vs, model, prompt) in cases_of("generate") {
        let mask = tensor_from_json(case.arg("attention_mask").unwrap()).unwrap();
        let max_new = case.arg("max_new_tokens").unwrap().as_i64().unwrap();
        let min_new = case.arg("min_new_tokens").unwrap().as_i64().unwrap();
        let pad = case.arg("pad_token_id").unwrap().as_i64().unwrap();
        let mut cfg = GenerationConfig::new(max_new)
            .with_min_new_tokens(min_new)
            .with_pad_token_id(pad);
        // transformers' `eos_token_id=None` overrides the checkpoint's EOS: no EOS at all
        cfg = match case.arg("eos_token_id").unwrap().as_i64() {
            Some(eos) => cfg.with_eos_token_id(eos),
            None => cfg.with_model_defaults(false),
        };
        let out = generate(&model, &prompt, Some(&mask), &cfg, &mut Generator::new(0)).unwrap();
        let expected = tensor_from_json(case.expect.get("sequences").unwrap()).unwrap();
        assert_eq!(
            Vec::<i64>::try_from(out.sequences.view([-1])).unwrap(),
            Vec::<i64>::try_from(expected.view([-1])).unwrap(),
            "{}",
            case.name
        );
        // the response mask is true up to and including EOS, false after
        let p = prompt.size()[1];
        let response = expected.narrow(1, p, expected.size()[1] - p);
        assert!(out.response.equal(&response), "{}", case.name);
        if let Some(eos) = cfg.eos_token_id {
            let resp: Vec<Vec<i64>> = Vec::<Vec<i64>>::try_from(&response).unwrap();
            let rm: Vec<Vec<bool>> = Vec::<Vec<bool>>::try_from(&out.response_mask).unwrap();
            for (row, mrow) in resp.iter().zip(&rm) {
                let end = row
                    .iter()
                    .position(|&t| t == eos)
                    .map_or(row.len(), |i| i + 1);
                let want: Vec<bool> = (0..row.len()).map(|i| i < end).collect();
                assert_eq!(mrow, &want, "{}", case.name);
            }
        }
        n += 1;
    }
    assert_eq!(n, 6);
}

#[test]
fn generation_log_probs_are_the_models() {
    // Independent check: a full forward over the generated sequences gives the same log-probs.
    let (_vs, model) = load("tiny_v101");
    let prompt = Tensor::from_slice(&[0i64, 5, 6, 7, 8, 9, 10, 11]).view([2, 4]);
    let mask = Tensor::from_slice(&[0i64, 1, 1, 1, 1, 1, 1, 1]).view([2, 4]);
    let cfg = GenerationConfig::rlhf_sampling(6).with_pad_token_id(0);
    let out = generate(&model, &prompt, Some(&mask), &cfg, &mut Generator::new(3)).unwrap();
    let logits = model
        .forward(
            &LmInput::new(&out.sequences).with_attention_mask(&out.attention_mask),
            None,
        )
        .unwrap()
        .logits()
        .unwrap();
    let lp = logits.log_softmax(-1, Kind::Float);
    let g = out.response.size()[1];
    let pred = lp.narrow(1, 3, g); // position t predicts token t + 1
    let want = pred
        .gather(-1, &out.response.unsqueeze(-1), false)
        .squeeze_dim(-1);
    assert!(max_abs_diff(&want, &out.log_probs) < 1e-4);
}

#[test]
fn sampling_follows_the_filtered_distribution() {
    // Empirical first-token frequencies over 4000 rows of one prompt vs the distribution
    // derived directly from the logits (temperature, then top-k, then top-p).
    let (_vs, model) = load("small_v64_gelu");
    let rows = 4000;
    let prompt = Tensor::from_slice(&[3i64, 9, 17])
        .view([1, 3])
        .repeat([rows, 1]);
    let logits = model
        .forward(&LmInput::new(&prompt.narrow(0, 0, 1)), None)
        .unwrap()
        .logits()
        .unwrap()
        .select(1, 2)
        .squeeze_dim(0);
    for (temperature, top_k, top_p) in [(1.0, 0, 1.0), (0.7, 5, 1.0), (1.3, 0, 0.6)] {
        let cfg = GenerationConfig::new(1)
            .with_do_sample(true)
            .with_temperature(temperature)
            .with_top_k(top_k)
            .with_top_p(top_p);
        let out = generate(&model, &prompt, None, &cfg, &mut Generator::new(11)).unwrap();
        let counts = out
            .response
            .view([-1])
            .bincount(None::<Tensor>, 64)
            .to_kind(Kind::Double)
            / rows as f64;
        // expected distribution, by hand
        let scaled: Vec<f64> =
            Vec::<f64>::try_from((&logits / temperature).to_kind(Kind::Double)).unwrap();
        let mut order: Vec<usize> = (0..scaled.len()).collect();
        order.sort_by(|&a, &b| scaled[b].partial_cmp(&scaled[a]).unwrap());
        let mut keep = vec![true; scaled.len()];
        if top_k > 0 {
            for &i in &order[top_k as usize..] {
                keep[i] = false;
            }
        }
        let probs = |keep: &[bool]| {
            let z: f64 = (0..scaled.len())
                .filter(|&i| keep[i])
                .map(|i| scaled[i].exp())
                .sum();
            (0..scaled.len())
                .map(|i| if keep[i] { scaled[i].exp() / z } else { 0.0 })
                .collect::<Vec<f64>>()
        };
        if top_p < 1.0 {
            let p = probs(&keep);
            let mut cum = 0.0;
            let mut kept = vec![false; scaled.len()];
            for &i in &order {
                if keep[i] && cum < top_p {
                    kept[i] = true;
                }
                cum += p[i];
            }
            keep = kept;
        }
        let want = probs(&keep);
        let got: Vec<f64> = Vec::<f64>::try_from(counts).unwrap();
        for i in 0..want.len() {
            if want[i] == 0.0 {
                assert_eq!(got[i], 0.0, "token {i} has probability 0 but was drawn");
            } else {
                let sd = (want[i] * (1.0 - want[i]) / rows as f64).sqrt();
                assert!(
                    (got[i] - want[i]).abs() < 5.0 * sd + 1e-3,
                    "T={temperature} k={top_k} p={top_p} token {i}: {} vs {}",
                    got[i],
                    want[i]
                );
            }
        }
    }
}

#[test]
fn incremental_decoding_equals_full_forward_with_left_padding() {
    let (_vs, model) = load("small_v64_gelu");
    let ids = Tensor::from_slice(&[0i64, 0, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14]).view([2, 6]);
    let mask = Tensor::from_slice(&[0i64, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]).view([2, 6]);
    let full = model
        .forward(&LmInput::new(&ids).with_attention_mask(&mask), None)
        .unwrap()
        .logits()
        .unwrap();
    // prefill 3 tokens, then one at a time
    let mut cache = model.new_cache();
    let first = model
        .forward(
            &LmInput::new(&ids.narrow(1, 0, 3)).with_attention_mask(&mask.narrow(1, 0, 3)),
            Some(&mut cache),
        )
        .unwrap()
        .logits()
        .unwrap();
    let mut steps = vec![first];
    for t in 3..6 {
        let step = model
            .forward(
                &LmInput::new(&ids.narrow(1, t, 1)).with_attention_mask(&mask.narrow(1, 0, t + 1)),
                Some(&mut cache),
            )
            .unwrap()
            .logits()
            .unwrap();
        steps.push(step);
    }
    let inc = Tensor::cat(&steps, 1);
    let keep = mask.to_kind(Kind::Bool).unsqueeze(-1).expand_as(&full);
    let diff = (inc - &full)
        .abs()
        .masked_select(&keep)
        .max()
        .double_value(&[]);
    assert!(diff < 1e-5, "{diff}");
    // left padding does not change a row's logits: row 0 alone, unpadded
    let alone = model
        .forward(&LmInput::new(&ids.narrow(0, 0, 1).narrow(1, 2, 4)), None)
        .unwrap()
        .logits()
        .unwrap();
    let diff = max_abs_diff(&alone, &full.narrow(0, 0, 1).narrow(1, 2, 4));
    assert!(diff < 1e-5, "{diff}");
}

#[test]
fn save_then_load_round_trips_and_bad_checkpoints_are_named() {
    let (_vs, model) = load("tiny_v101");
    let dir = std::env::temp_dir().join(format!("torchrl-gpt2-test-{}", std::process::id()));
    model.save_pretrained(&dir).unwrap();
    let (_vs2, again) = {
        let vs = VarStore::new(Device::Cpu);
        let m = Gpt2Model::from_pretrained(&vs.root(), &dir).unwrap();
        (vs, m)
    };
    for ((n1, a), (n2, b)) in model
        .named_parameters()
        .iter()
        .zip(again.named_parameters())
    {
        assert_eq!(n1, &n2);
        assert!(a.equal(b), "{n1}");
    }
    // extra and missing tensors are named
    let mut tensors: Vec<(String, Tensor)> = model
        .named_parameters()
        .into_iter()
        .filter(|(n, _)| n != "transformer.h.1.mlp.c_fc.bias")
        .map(|(n, t)| (n, t.copy()))
        .collect();
    tensors.push((
        "transformer.h.7.attn.c_attn.weight".into(),
        Tensor::zeros([2], (Kind::Float, Device::Cpu)),
    ));
    let bad = dir.join("bad.safetensors");
    Tensor::write_safetensors(&tensors, &bad).unwrap();
    let before = model.named_parameters()[0].1.copy();
    let err = model.load_safetensors(&bad).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, Error::InvalidFile { .. }), "{msg}");
    assert!(
        msg.contains("missing tensors: transformer.h.1.mlp.c_fc.bias"),
        "{msg}"
    );
    assert!(
        msg.contains("unexpected tensors: transformer.h.7.attn.c_attn.weight"),
        "{msg}"
    );
    assert!(
        model.named_parameters()[0].1.equal(&before),
        "nothing is written on error"
    );
    // a mis-shaped tensor names the expected and given shapes
    let mut tensors: Vec<(String, Tensor)> = model
        .named_parameters()
        .into_iter()
        .map(|(n, t)| (n, t.copy()))
        .collect();
    tensors[1].1 = Tensor::zeros([31, 32], (Kind::Float, Device::Cpu));
    Tensor::write_safetensors(&tensors, &bad).unwrap();
    let msg = model.load_safetensors(&bad).unwrap_err().to_string();
    assert!(
        msg.contains("transformer.wpe.weight (expected [32, 32], got [31, 32])"),
        "{msg}"
    );
    // a missing file and a file that is not safetensors
    assert!(matches!(
        model
            .load_safetensors(&dir.join("nope.safetensors"))
            .unwrap_err(),
        Error::Io { .. }
    ));
    std::fs::write(&bad, b"not a checkpoint").unwrap();
    assert!(matches!(
        model.load_safetensors(&bad).unwrap_err(),
        Error::InvalidFile { .. }
    ));
    // a config.json with a bad field
    std::fs::write(
        dir.join("config.json"),
        r#"{"vocab_size": 10, "n_embd": 30, "n_head": 4}"#,
    )
    .unwrap();
    let vs = VarStore::new(Device::Cpu);
    let msg = Gpt2Model::from_pretrained(&vs.root(), &dir)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("n_embd") && msg.contains("n_head"), "{msg}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn bad_inputs_are_errors() {
    let (_vs, model) = load("tiny_v101");
    let ids = Tensor::from_slice(&[1i64, 2, 3]).view([1, 3]);
    // out-of-vocabulary id, float ids, 1-D ids, wrong mask, too long
    let msg = model
        .forward(
            &LmInput::new(&Tensor::from_slice(&[1i64, 101]).view([1, 2])),
            None,
        )
        .unwrap_err()
        .to_string();
    assert!(msg.contains("[0, 101)") && msg.contains("101"), "{msg}");
    assert!(matches!(
        model
            .forward(&LmInput::new(&ids.to_kind(Kind::Float)), None)
            .unwrap_err(),
        Error::DtypeMismatch { .. }
    ));
    assert!(model.forward(&LmInput::new(&ids.view([-1])), None).is_err());
    let mask = Tensor::ones([1, 2], (Kind::Int64, Device::Cpu));
    assert!(matches!(
        model
            .forward(&LmInput::new(&ids).with_attention_mask(&mask), None)
            .unwrap_err(),
        Error::ShapeMismatch { .. }
    ));
    let long = Tensor::ones([1, 33], (Kind::Int64, Device::Cpu));
    assert!(model.forward(&LmInput::new(&long), None).is_err());
    // generation: context too short for max_new_tokens, bad sampling settings, bad logit mask
    let rng = &mut Generator::new(0);
    let msg = generate(&model, &ids, None, &GenerationConfig::new(30), rng)
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("max_new_tokens") && msg.contains("32"),
        "{msg}"
    );
    for cfg in [
        GenerationConfig::new(2)
            .with_do_sample(true)
            .with_temperature(0.0),
        GenerationConfig::new(2).with_top_p(0.0),
        GenerationConfig::new(2).with_top_k(-1),
        GenerationConfig::new(2).with_min_new_tokens(3),
        GenerationConfig::new(2).with_eos_token_id(101),
    ] {
        assert!(matches!(
            generate(&model, &ids, None, &cfg, rng).unwrap_err(),
            Error::InvalidConfig { .. }
        ));
    }
    let mask = LogitMask::new(Tensor::zeros([5, 5], (Kind::Bool, Device::Cpu))).unwrap();
    let opts = GenerateOptions::default().with_logit_mask(&mask);
    assert!(generate_with(&model, &ids, None, &GenerationConfig::new(2), &opts, rng).is_err());
    assert!(LogitMask::new(Tensor::zeros([5, 4], (Kind::Bool, Device::Cpu))).is_err());
}

#[test]
fn logit_mask_and_eos_stop() {
    let (_vs, model) = load("tiny_v101");
    let prompt = Tensor::from_slice(&[3i64, 4, 5, 6, 7, 8]).view([2, 3]);
    // forbid every token but 9 after any token: greedy must produce 9, 9, ...
    let table = Tensor::ones([101, 101], (Kind::Bool, Device::Cpu));
    let _ = table.narrow(1, 9, 1).fill_(0);
    let mask = LogitMask::new(table).unwrap();
    let opts = GenerateOptions::default().with_logit_mask(&mask);
    let cfg = GenerationConfig::new(4);
    let out = generate_with(&model, &prompt, None, &cfg, &opts, &mut Generator::new(0)).unwrap();
    assert_eq!(
        Vec::<i64>::try_from(out.response.view([-1])).unwrap(),
        vec![9; 8]
    );
    // with 9 as EOS every row finishes at the first step: one token, then generation stops
    let cfg = GenerationConfig::new(4)
        .with_eos_token_id(9)
        .with_pad_token_id(0);
    let out = generate_with(&model, &prompt, None, &cfg, &opts, &mut Generator::new(0)).unwrap();
    assert_eq!(out.response.size(), vec![2, 1]);
    assert_eq!(out.sequences.size(), vec![2, 4]);
    // sampling with the same mask also only draws 9
    let cfg = GenerationConfig::rlhf_sampling(3);
    let out = generate_with(&model, &prompt, None, &cfg, &opts, &mut Generator::new(5)).unwrap();
    assert_eq!(
        Vec::<i64>::try_from(out.response.view([-1])).unwrap(),
        vec![9; 6]
    );
}

#[test]
fn runs_in_half_precision_formats() {
    let (vs, model) = load("tiny_v101");
    let ids = Tensor::from_slice(&[1i64, 2, 3, 4]).view([1, 4]);
    let f32_logits = model
        .forward(&LmInput::new(&ids), None)
        .unwrap()
        .logits()
        .unwrap();
    let mut vs = vs;
    vs.bfloat16();
    let bf = model
        .forward(&LmInput::new(&ids), None)
        .unwrap()
        .logits()
        .unwrap();
    assert_eq!(bf.kind(), Kind::BFloat16);
    assert!(max_abs_diff(&bf.to_kind(Kind::Float), &f32_logits) < 0.1);
    vs.half();
    let h = model
        .forward(&LmInput::new(&ids), None)
        .unwrap()
        .logits()
        .unwrap();
    assert_eq!(h.kind(), Kind::Half);
    assert!(max_abs_diff(&h.to_kind(Kind::Float), &f32_logits) < 0.05);
    // greedy generation in half precision runs end to end; log-probs come out in float32
    let out = generate(
        &model,
        &ids,
        None,
        &GenerationConfig::new(3),
        &mut Generator::new(0),
    )
    .unwrap();
    assert_eq!(out.log_probs.kind(), Kind::Float);
    assert_eq!(out.sequences.size(), vec![1, 7]);
}

#[test]
fn hf_tokenizer_matches_recorded_ids() {
    use torchrl::modules::llm::{
        BatchEncodeOptions, ByteTokenizer, HfTokenizer, PaddingSide, SpecialTokens, TextTokenizer,
    };
    let dir: PathBuf = [env!("CARGO_MANIFEST_DIR"), "specs"].iter().collect();
    let text = std::fs::read_to_string(dir.join("tokenizer_cases.json")).unwrap();
    let cases: serde_json::Value = serde_json::from_str(&text).unwrap();
    let tok = HfTokenizer::from_file(dir.join("tokenizer").join("tokenizer.json")).unwrap();
    assert_eq!(tok.vocab_size(), cases["vocab_size"].as_i64().unwrap());
    assert_eq!(tok.eos_token_id(), cases["eos"].as_i64());
    assert_eq!(tok.pad_token_id(), cases["pad"].as_i64());
    let mut rows = Vec::new();
    for c in cases["cases"].as_array().unwrap() {
        let text = c["text"].as_str().unwrap();
        let want: Vec<i64> = c["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_i64().unwrap())
            .collect();
        assert_eq!(tok.encode(text).unwrap(), want, "{text:?}");
        assert_eq!(
            tok.decode(&want, SpecialTokens::Keep).unwrap(),
            c["decoded"].as_str().unwrap()
        );
        rows.push((text, want));
    }
    // batch encode, left-padded with the pad id, and back
    let texts: Vec<&str> = rows.iter().map(|(t, _)| *t).collect();
    let batch = tok
        .batch_encode(&texts, &BatchEncodeOptions::default())
        .unwrap();
    let width = rows.iter().map(|(_, ids)| ids.len()).max().unwrap();
    assert_eq!(
        batch.input_ids.size(),
        vec![rows.len() as i64, width as i64]
    );
    for (i, (_, ids)) in rows.iter().enumerate() {
        let row = Vec::<i64>::try_from(batch.input_ids.get(i as i64)).unwrap();
        let pad = width - ids.len();
        assert!(row[..pad]
            .iter()
            .all(|&t| t == cases["pad"].as_i64().unwrap()));
        assert_eq!(&row[pad..], ids.as_slice());
    }
    let back = tok
        .batch_decode(
            &batch.input_ids,
            Some(&batch.attention_mask),
            SpecialTokens::Keep,
        )
        .unwrap();
    assert_eq!(back[0], "the cat sat");
    // right padding with truncation keeps the first tokens
    let opts = BatchEncodeOptions {
        padding_side: PaddingSide::Right,
        max_length: Some(2),
        ..Default::default()
    };
    let b = tok.batch_encode(&["the cat sat"], &opts).unwrap();
    assert_eq!(
        Vec::<i64>::try_from(b.input_ids.view([-1])).unwrap(),
        rows[0].1[..2].to_vec()
    );
    // errors: a missing file, a bad file, an unknown token, an id past the vocabulary
    assert!(HfTokenizer::from_file(dir.join("nope.json")).is_err());
    assert!(HfTokenizer::from_file(dir.join("gpt2_cases.json")).is_err());
    assert!(
        HfTokenizer::from_file(dir.join("tokenizer").join("tokenizer.json"))
            .unwrap()
            .with_eos_token("<nope>")
            .is_err()
    );
    assert!(tok.decode(&[320], SpecialTokens::Keep).is_err());
    // the byte tokenizer round-trips any UTF-8
    let bt = ByteTokenizer::new();
    let s = "héllo wörld 42 ✓";
    assert_eq!(
        bt.decode(&bt.encode(s).unwrap(), SpecialTokens::Skip)
            .unwrap(),
        s
    );
    assert_eq!(bt.encode("é").unwrap(), vec![0xc3, 0xa9]);
}

#[allow(dead_code)]
#[path = "../examples/generate.rs"]
mod generate_example;

#[test]
fn generate_example_runs_on_a_checkpoint_and_on_a_random_model() {
    // the recorded checkpoint, greedy: the continuation is transformers' greedy continuation
    let args = generate_example::Args {
        model: Some(model_dir("tiny_v101").display().to_string()),
        tokenizer: None,
        prompts: vec![],
        batch: 1,
        max_new_tokens: 4,
        greedy: true,
        ..Default::default()
    };
    // the byte tokenizer's ids (up to 258) exceed this model's vocabulary (101): a clear error
    let err = generate_example::run(&args)
        .err()
        .expect("out-of-vocabulary prompt");
    assert!(err.to_string().contains("[0, 101)"), "{err}");
    // a random model over the byte tokenizer
    let args = generate_example::Args {
        max_new_tokens: 5,
        batch: 2,
        ..Default::default()
    };
    let summary = generate_example::run(&args).unwrap();
    assert_eq!(summary.texts.len(), 4);
    assert!(summary.n_tokens > 0 && summary.n_tokens <= 20);
    assert!(summary.tokens_per_s > 0.0);
}
