//! The layer kit (`modules::llm::nn`), each layer on its own: hand-derived values, and the
//! identities each layer must keep (grouped-query attention equals multi-head attention with
//! repeated key-value heads, rotary scores depend only on relative positions, a cached decode
//! equals the full forward on a Llama-shaped decoder, a copied top equals the original).

use tch::nn::{Init, Path, VarStore};
use tch::{Device, Kind, Tensor};
use torchrl::modules::llm::nn::{
    Activation, Attention, AttentionShape, BlockContext, Decoder, DecoderBlock, FeedForward,
    GatedMlp, KvCache, LayerNorm, Linear, QkvProjection, RmsNorm, RopeScaling, RotaryEmbedding,
    WeightLayout,
};
use torchrl::modules::llm::{
    generate, CachedTrunk, CausalLm, CausalLmWithHydraValueHead, GenerationConfig, HydraReference,
    LmFacts, LmInput, ScoreRequest, ScoreTokens, TokenScores,
};

const CPU: Device = Device::Cpu;

fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
    (a - b).abs().max().double_value(&[])
}

fn set(t: &Tensor, values: &Tensor) {
    tch::no_grad(|| t.shallow_clone().copy_(values));
}

fn linear(p: &Path<'_>, name: &str, n_in: i64, n_out: i64) -> Linear {
    Linear::new(p, name, n_in, n_out, false, WeightLayout::OutIn, 0.3).unwrap()
}

#[test]
fn attention_on_identity_projections_matches_the_hand_derivation() {
    // one head of width 2, q = k = v = x, o = identity; scores divided by sqrt(2)
    let vs = VarStore::new(CPU);
    let p = vs.root();
    let eye = Tensor::eye(2, (Kind::Float, CPU));
    let (q, k, v, o) = (
        linear(&p, "q", 2, 2),
        linear(&p, "k", 2, 2),
        linear(&p, "v", 2, 2),
        linear(&p, "o", 2, 2),
    );
    for l in [&q, &k, &v, &o] {
        set(l.weight(), &eye);
    }
    let shape = AttentionShape {
        n_head: 1,
        n_kv_head: 1,
        head_dim: 2,
        score_divisor: 2f64.sqrt(),
    };
    let attn = Attention::new(QkvProjection::Separate { q, k, v }, o, shape).unwrap();
    let x = Tensor::from_slice(&[1.0f32, 0.0, 0.0, 1.0]).view([1, 2, 2]);
    let blocked = torchrl::modules::llm::nn::attention_mask(None, 0, 2, CPU).unwrap();
    let ctx = BlockContext {
        blocked,
        rope: None,
    };
    let y = attn.forward(&x, &ctx, None).unwrap();
    // token 0 sees itself only; token 1 weighs [1, 0] and [0, 1] by softmax([0, 1/√2])
    let e = (1.0 / 2f64.sqrt()).exp();
    let (p0, p1) = (1.0 / (1.0 + e), e / (1.0 + e));
    let got = Vec::<f32>::try_from(y.view([-1])).unwrap();
    let want = [1.0, 0.0, p0, p1];
    for (g, w) in got.iter().zip(want) {
        assert!((f64::from(*g) - w).abs() < 1e-6, "{got:?} vs {want:?}");
    }
}

#[test]
fn grouped_query_attention_equals_multi_head_with_repeated_kv_heads() {
    tch::manual_seed(0);
    let (hidden, h, kv, d) = (8, 4, 2, 2);
    let vs = VarStore::new(CPU);
    let p = vs.root();
    let gqa = Attention::new(
        QkvProjection::Separate {
            q: linear(&p, "g.q", hidden, h * d),
            k: linear(&p, "g.k", hidden, kv * d),
            v: linear(&p, "g.v", hidden, kv * d),
        },
        linear(&p, "g.o", h * d, hidden),
        AttentionShape {
            n_head: h,
            n_kv_head: kv,
            head_dim: d,
            score_divisor: (d as f64).sqrt(),
        },
    )
    .unwrap();
    let (mq, mk, mv, mo) = (
        linear(&p, "m.q", hidden, h * d),
        linear(&p, "m.k", hidden, h * d),
        linear(&p, "m.v", hidden, h * d),
        linear(&p, "m.o", h * d, hidden),
    );
    let named: std::collections::HashMap<String, Tensor> = gqa
        .named_parameters()
        .into_iter()
        .map(|(n, t)| (n, t.shallow_clone()))
        .collect();
    // each key-value head serves h / kv = 2 consecutive query heads: repeat its rows
    let repeat = |w: &Tensor| {
        w.view([kv, 1, d, hidden])
            .expand([kv, h / kv, d, hidden], false)
            .reshape([h * d, hidden])
    };
    set(mq.weight(), &named["g.q.weight"]);
    set(mk.weight(), &repeat(&named["g.k.weight"]));
    set(mv.weight(), &repeat(&named["g.v.weight"]));
    set(mo.weight(), &named["g.o.weight"]);
    let mha = Attention::new(
        QkvProjection::Separate {
            q: mq,
            k: mk,
            v: mv,
        },
        mo,
        AttentionShape {
            n_head: h,
            n_kv_head: h,
            head_dim: d,
            score_divisor: (d as f64).sqrt(),
        },
    )
    .unwrap();
    let x = Tensor::randn([2, 5, hidden], (Kind::Float, CPU));
    let blocked = torchrl::modules::llm::nn::attention_mask(None, 0, 5, CPU).unwrap();
    let ctx = BlockContext {
        blocked,
        rope: None,
    };
    let a = gqa.forward(&x, &ctx, None).unwrap();
    let b = mha.forward(&x, &ctx, None).unwrap();
    assert!(max_diff(&a, &b) < 1e-6, "{}", max_diff(&a, &b));
    // head counts that do not divide are refused by name
    let err = Attention::new(
        QkvProjection::Separate {
            q: linear(&p, "x.q", hidden, 3 * d),
            k: linear(&p, "x.k", hidden, 2 * d),
            v: linear(&p, "x.v", hidden, 2 * d),
        },
        linear(&p, "x.o", 3 * d, hidden),
        AttentionShape {
            n_head: 3,
            n_kv_head: 2,
            head_dim: d,
            score_divisor: 1.0,
        },
    )
    .unwrap_err();
    assert!(err.to_string().contains("num_key_value_heads"), "{err}");
}

#[test]
fn rotary_scores_depend_only_on_relative_positions() {
    tch::manual_seed(1);
    let rope = RotaryEmbedding::new(8, 10_000.0, &RopeScaling::Default, CPU).unwrap();
    let q = Tensor::randn([1, 1, 1, 8], (Kind::Double, CPU));
    let k = Tensor::randn([1, 1, 1, 8], (Kind::Double, CPU));
    let score = |pq: i64, pk: i64| {
        let (cq, sq) = rope
            .cos_sin(&Tensor::from_slice(&[pq]).view([1, 1]), Kind::Double)
            .unwrap();
        let (ck, sk) = rope
            .cos_sin(&Tensor::from_slice(&[pk]).view([1, 1]), Kind::Double)
            .unwrap();
        let rq = RotaryEmbedding::apply(&q, &cq, &sq).unwrap();
        let rk = RotaryEmbedding::apply(&k, &ck, &sk).unwrap();
        (rq * rk).sum(Kind::Double).double_value(&[])
    };
    let base = score(5, 2);
    // (the table is float32, as transformers computes it)
    for shift in [1, 7, 40] {
        assert!((score(5 + shift, 2 + shift) - base).abs() < 1e-5);
    }
    // and rotation keeps norms
    let (c, s) = rope
        .cos_sin(&Tensor::from_slice(&[13i64]).view([1, 1]), Kind::Double)
        .unwrap();
    let r = RotaryEmbedding::apply(&q, &c, &s).unwrap();
    assert!((r.norm().double_value(&[]) - q.norm().double_value(&[])).abs() < 1e-6);
    // linear scaling by 4 at position 8 is the unscaled table at position 2
    let lin = RotaryEmbedding::new(8, 10_000.0, &RopeScaling::Linear { factor: 4.0 }, CPU).unwrap();
    let (c8, _) = lin
        .cos_sin(&Tensor::from_slice(&[8i64]).view([1, 1]), Kind::Double)
        .unwrap();
    let (c2, _) = rope
        .cos_sin(&Tensor::from_slice(&[2i64]).view([1, 1]), Kind::Double)
        .unwrap();
    assert!(max_diff(&c8, &c2) < 1e-6);
}

#[test]
fn layer_norm_and_rms_norm_match_their_formulas() {
    let vs = VarStore::new(CPU);
    let ln = LayerNorm::new(&vs.root(), "ln", 3, 1e-5).unwrap();
    let rms = RmsNorm::new(&vs.root(), "rms", 3, 1e-6).unwrap();
    set(
        &vs.variables()["rms.weight"],
        &Tensor::from_slice(&[1.0f64, 2.0, 0.5]).to_kind(Kind::Float),
    );
    let x = Tensor::from_slice(&[1.0f32, 2.0, 6.0]).view([1, 3]);
    // layer norm: mean 3, variance (4 + 1 + 9) / 3
    let sd = (14.0f64 / 3.0 + 1e-5).sqrt();
    let got = Vec::<f32>::try_from(ln.forward(&x).unwrap().view([-1])).unwrap();
    for (g, w) in got.iter().zip([-2.0 / sd, -1.0 / sd, 3.0 / sd]) {
        assert!((f64::from(*g) - w).abs() < 1e-5);
    }
    // rms norm: sqrt((1 + 4 + 36) / 3), times the weight
    let r = (41.0f64 / 3.0 + 1e-6).sqrt();
    let got = Vec::<f32>::try_from(rms.forward(&x).unwrap().view([-1])).unwrap();
    for (g, w) in got.iter().zip([1.0 / r, 4.0 / r, 3.0 / r]) {
        assert!((f64::from(*g) - w).abs() < 1e-5);
    }
    // bfloat16 in: the statistic in float32, the result within bfloat16's precision
    let y = rms.forward(&x.to_kind(Kind::BFloat16)).unwrap();
    let got = Vec::<f32>::try_from(y.to_kind(Kind::Float).view([-1])).unwrap();
    for (g, w) in got.iter().zip([1.0 / r, 4.0 / r, 3.0 / r]) {
        assert!((f64::from(*g) - w).abs() < 1e-2);
    }
    assert!(LayerNorm::new(&vs.root(), "bad", 0, 1e-5).is_err());
}

/// A Llama/Qwen3-shaped decoder built from the kit alone: RMS norms, SwiGLU, rotary, grouped
/// query heads, per-head q/k norms.
fn llama_like(p: &Path<'_>, n_layer: i64) -> Decoder {
    let (hidden, h, kv, d, inner) = (16, 4, 2, 4, 24);
    let blocks = (0..n_layer)
        .map(|i| {
            let b = p / "layers" / i;
            let attn = Attention::new(
                QkvProjection::Separate {
                    q: linear(&b, "self_attn.q_proj", hidden, h * d),
                    k: linear(&b, "self_attn.k_proj", hidden, kv * d),
                    v: linear(&b, "self_attn.v_proj", hidden, kv * d),
                },
                linear(&b, "self_attn.o_proj", h * d, hidden),
                AttentionShape {
                    n_head: h,
                    n_kv_head: kv,
                    head_dim: d,
                    score_divisor: (d as f64).sqrt(),
                },
            )
            .unwrap()
            .with_qk_norm(
                RmsNorm::new(&b, "self_attn.q_norm", d, 1e-6).unwrap(),
                RmsNorm::new(&b, "self_attn.k_norm", d, 1e-6).unwrap(),
            );
            let mlp = FeedForward::Gated(GatedMlp::new(
                linear(&b, "mlp.gate_proj", hidden, inner),
                linear(&b, "mlp.up_proj", hidden, inner),
                linear(&b, "mlp.down_proj", inner, hidden),
                Activation::Silu,
            ));
            DecoderBlock::new(
                RmsNorm::new(&b, "input_layernorm", hidden, 1e-6)
                    .unwrap()
                    .into(),
                attn,
                RmsNorm::new(&b, "post_attention_layernorm", hidden, 1e-6)
                    .unwrap()
                    .into(),
                mlp,
            )
        })
        .collect();
    let rope = RotaryEmbedding::new(d, 1e6, &RopeScaling::Default, p.device()).unwrap();
    Decoder::new(
        blocks,
        RmsNorm::new(p, "norm", hidden, 1e-6).unwrap().into(),
        Some(rope),
    )
}

#[test]
fn a_cached_decode_equals_the_full_forward_on_a_llama_shaped_decoder() {
    tch::manual_seed(2);
    let vs = VarStore::new(CPU);
    let decoder = llama_like(&vs.root(), 2);
    // the norms' weights away from 1 so that they matter
    for (name, t) in vs.variables() {
        if name.contains("norm") {
            tch::no_grad(|| t.shallow_clone().init(Init::Uniform { lo: 0.5, up: 1.5 }));
        }
    }
    let x = Tensor::randn([2, 6, 16], (Kind::Float, CPU));
    // left padding on row 1: two pads, positions start after them
    let mask = Tensor::from_slice(&[1i64, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1]).view([2, 6]);
    let pos = torchrl::modules::llm::position_ids_from_mask(&mask).unwrap();
    let ctx = decoder
        .context(Some(&mask), Some(&pos), 0, 6, CPU, Kind::Float)
        .unwrap();
    let full = decoder
        .forward(x.shallow_clone(), &ctx, None, None)
        .unwrap();
    let mut cache = KvCache::new(2);
    for t in 0..6 {
        let m = mask.narrow(1, 0, t + 1);
        let ctx = decoder
            .context(Some(&m), Some(&pos.narrow(1, t, 1)), t, 1, CPU, Kind::Float)
            .unwrap();
        let step = decoder
            .forward(x.narrow(1, t, 1), &ctx, Some(&mut cache), None)
            .unwrap();
        let want = full.last_hidden.narrow(1, t, 1);
        // padded query positions are meaningless: compare the real ones
        for row in 0..2 {
            if mask.int64_value(&[row, t]) == 1 {
                let d = max_diff(&step.last_hidden.get(row), &want.get(row));
                assert!(d < 1e-5, "t={t} row={row}: {d}");
            }
        }
    }
    // the names are transformers' Llama / Qwen3 names, relative to the block
    let names: Vec<String> = decoder.blocks()[0]
        .named_parameters()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    for n in [
        "input_layernorm.weight",
        "self_attn.q_proj.weight",
        "self_attn.k_norm.weight",
        "mlp.gate_proj.weight",
        "post_attention_layernorm.weight",
    ] {
        assert!(names.contains(&n.to_string()), "{n} not in {names:?}");
    }
}

#[test]
fn a_copied_top_runs_like_the_original_blocks() {
    tch::manual_seed(3);
    let vs = VarStore::new(CPU);
    let decoder = llama_like(&vs.root(), 3);
    let copy_store = VarStore::new(CPU);
    let top = decoder.copy_top(&copy_store.root(), 2).unwrap();
    assert_eq!(top.blocks().len(), 2);
    let hidden = Tensor::randn([1, 4, 16], (Kind::Float, CPU));
    let pos = Tensor::arange(4, (Kind::Int64, CPU)).view([1, 4]);
    let ctx = decoder
        .context(None, Some(&pos), 0, 4, CPU, Kind::Float)
        .unwrap();
    let a = decoder.forward_from(1, &hidden, &ctx).unwrap();
    let b = top.forward_from(0, &hidden, &ctx).unwrap();
    assert!(max_diff(&a, &b) < 1e-6);
    // the copy owns its parameters: changing the original leaves it as it was
    tch::no_grad(|| {
        for (_, t) in vs.variables() {
            let _ = t.shallow_clone().zero_();
        }
    });
    let b2 = top.forward_from(0, &hidden, &ctx).unwrap();
    assert!(b.equal(&b2));
    assert!(decoder.copy_top(&copy_store.root(), 4).is_err());
    assert!(decoder.forward_from(4, &hidden, &ctx).is_err());
}

#[test]
fn one_unpadded_new_token_needs_no_mask() {
    // one new token without padding needs no mask at all
    let vs = VarStore::new(CPU);
    let decoder = llama_like(&vs.root(), 1);
    let pos = Tensor::from_slice(&[3i64]).view([1, 1]);
    let ctx = decoder
        .context(None, Some(&pos), 3, 1, CPU, Kind::Float)
        .unwrap();
    assert!(ctx.blocked.is_none() && ctx.rope.is_some());
    // a rotary decoder without positions is an error, not a silent unrotated forward
    assert!(decoder.context(None, None, 3, 1, CPU, Kind::Float).is_err());
}

// ------------------------------------------------------------------ a second architecture

/// A Llama-shaped model written as a model file would be (the kit's decoder, a token
/// embedding, an untied LM head): everything above `CausalLm` must run on it unchanged.
#[derive(Debug)]
struct TinyLlama {
    facts: LmFacts,
    embed_tokens: Tensor,
    decoder: Decoder,
    lm_head: Tensor,
}

impl TinyLlama {
    fn new(p: &Path<'_>) -> TinyLlama {
        let facts = LmFacts {
            model_type: "tiny_llama".into(),
            vocab_size: 11,
            hidden_size: 16,
            n_layer: 3,
            max_positions: 64,
            tie_word_embeddings: false,
            initializer_range: 0.02,
            bos_token_id: None,
            eos_token_id: Some(10),
            pad_token_id: Some(0),
        };
        let normal = Init::Randn {
            mean: 0.0,
            stdev: 0.5,
        };
        TinyLlama {
            embed_tokens: (p / "model" / "embed_tokens").var("weight", &[11, 16], normal),
            decoder: llama_like(&(p / "model"), 3),
            lm_head: (p / "lm_head").var("weight", &[11, 16], normal),
            facts,
        }
    }
}

impl CausalLm for TinyLlama {
    fn facts(&self) -> &LmFacts {
        &self.facts
    }
    fn decoder(&self) -> &Decoder {
        &self.decoder
    }
    fn decoder_mut(&mut self) -> &mut Decoder {
        &mut self.decoder
    }
    fn block_name(&self, index: usize) -> String {
        format!("model.layers.{index}")
    }
    fn embed(&self, ids: &Tensor, _positions: &Tensor) -> torchrl::Result<Tensor> {
        Ok(Tensor::f_embedding(
            &self.embed_tokens,
            ids,
            -1,
            false,
            false,
        )?)
    }
    fn lm_head_weight(&self) -> &Tensor {
        &self.lm_head
    }
    fn embedding_parameters(&self) -> Vec<&Tensor> {
        vec![&self.embed_tokens]
    }
    fn named_parameters(&self) -> Vec<(String, &Tensor)> {
        let mut out = vec![("model.embed_tokens.weight".to_string(), &self.embed_tokens)];
        for (i, b) in self.decoder.blocks().iter().enumerate() {
            out.extend(
                b.named_parameters()
                    .into_iter()
                    .map(|(n, t)| (format!("model.layers.{i}.{n}"), t)),
            );
        }
        out.push(("lm_head.weight".to_string(), &self.lm_head));
        out
    }
    fn copy_to(&self, path: &Path<'_>) -> torchrl::Result<Box<dyn CausalLm>> {
        let copy = |p: Path<'_>, t: &Tensor| {
            let v = p.zeros("weight", &t.size());
            set(&v, t);
            v
        };
        Ok(Box::new(TinyLlama {
            facts: self.facts.clone(),
            embed_tokens: copy(path / "model" / "embed_tokens", &self.embed_tokens),
            decoder: self.decoder.copy_top(&(path / "model"), 3)?,
            lm_head: copy(path / "lm_head", &self.lm_head),
        }))
    }
    fn config_json(&self) -> torchrl::Result<String> {
        Ok(r#"{"model_type": "tiny_llama"}"#.into())
    }
}

impl ScoreTokens for TinyLlama {
    fn score_tokens(
        &self,
        t: &Tensor,
        m: &Tensor,
        r: ScoreRequest,
    ) -> torchrl::Result<TokenScores> {
        (self as &dyn CausalLm).score_tokens(t, m, r)
    }
    fn generating_model(&self) -> Option<&dyn CausalLm> {
        Some(self)
    }
}

#[test]
fn heads_generation_and_scoring_run_on_a_rotary_gqa_model() {
    tch::manual_seed(5);
    let vs = VarStore::new(CPU);
    let model = TinyLlama::new(&vs.root());
    // left-padded rows; the cached decode through the model gives the full forward's logits
    let ids = Tensor::from_slice(&[0i64, 0, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6]).view([2, 6]);
    let mask = Tensor::from_slice(&[0i64, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]).view([2, 6]);
    let input = LmInput::new(&ids).with_attention_mask(&mask);
    let full = model.forward(&input, None).unwrap().logits().unwrap();
    let mut cache = model.new_cache();
    for t in 0..6 {
        let step = model
            .forward(
                &LmInput::new(&ids.narrow(1, t, 1)).with_attention_mask(&mask.narrow(1, 0, t + 1)),
                Some(&mut cache),
            )
            .unwrap()
            .logits()
            .unwrap();
        for row in 0..2 {
            if mask.int64_value(&[row, t]) == 1 {
                let d = max_diff(&step.get(row).get(0), &full.get(row).get(t));
                assert!(d < 1e-4, "t={t} row={row}: {d}");
            }
        }
    }
    // greedy generation on it
    let gen = GenerationConfig::new(4)
        .with_eos_token_id(10)
        .with_pad_token_id(0);
    let out = generate(
        &model,
        &ids,
        Some(&mask),
        &gen,
        &mut torchrl::Generator::new(0),
    )
    .unwrap();
    assert_eq!(out.sequences.size()[0], 2);
    // a hydra policy with one unfrozen block: the branch copies the top block and shares the
    // rotary table; at construction the reference is the policy
    let hydra = CausalLmWithHydraValueHead::from_model(&vs.root(), model, 1).unwrap();
    let h = hydra.forward(&input).unwrap();
    assert!(max_diff(&h.logits, &h.ref_logits) < 1e-5);
    let reference = HydraReference::new(&hydra);
    let ref_lp = tch::no_grad(|| reference.token_log_probs(&ids, &mask)).unwrap();
    let pol = hydra
        .score_tokens(&ids, &mask, ScoreRequest::values_and_entropy())
        .unwrap();
    assert!(max_diff(&ref_lp, &pol.log_probs) < 1e-5);
    // the update's cached trunk (rotary positions recomputed from the mask) gives the same
    let cached = CachedTrunk::new(
        hydra.policy(),
        h.trunk.unwrap(),
        hydra.frozen_trunk_end().unwrap(),
    );
    let (lp, v) = cached.log_probs_and_values(&ids, &mask).unwrap();
    assert!(max_diff(&lp, &pol.log_probs) < 1e-5);
    assert!(max_diff(&v, &pol.values.unwrap()) < 1e-5);
    // a full-copy reference (num_layers_unfrozen = 0) goes through copy_to
    let vs2 = VarStore::new(CPU);
    let full_copy =
        CausalLmWithHydraValueHead::from_model(&vs2.root(), TinyLlama::new(&vs2.root()), 0)
            .unwrap();
    let f = full_copy.forward(&input).unwrap();
    assert!(max_diff(&f.logits, &f.ref_logits) < 1e-5);
}
