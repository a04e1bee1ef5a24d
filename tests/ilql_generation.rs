//! β-shaped generation for the ILQL heads (trlX's `generate`, rlhf.md §2.4): the one-step
//! scores of §5.11, agreement with our plain `generate` at β = 0, the KV cache against a full
//! recompute, the logit mask, EOS / pad after a row finished, the sampling distribution, and
//! errors.

use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};
use torchrl::modules::llm::{
    generate, ilql_generate, ilql_generate_with, ilql_scores, CausalLmWithIlqlHeads,
    GenerateOptions, GenerationConfig, Gpt2Config, Gpt2Model, IlqlGenerationConfig, LmInput,
    LogitMask,
};
use torchrl::{Error, Generator};

const VOCAB: i64 = 23;
const CTX: i64 = 24;

fn model(two_qs: bool, seed: i64) -> (VarStore, CausalLmWithIlqlHeads) {
    tch::manual_seed(seed);
    let vs = VarStore::new(Device::Cpu);
    let cfg = Gpt2Config::new(VOCAB)
        .with_n_layer(2)
        .with_n_embd(16)
        .with_n_head(2)
        .with_n_positions(CTX);
    let trunk = Gpt2Model::new(&vs.root(), &cfg).unwrap();
    let m = CausalLmWithIlqlHeads::from_model(&vs.root(), trunk, two_qs, 0.01).unwrap();
    (vs, m)
}

/// Two left-padded prompts of 4 (row 0 has one pad) and their mask.
fn prompt() -> (Tensor, Tensor) {
    let ids = Tensor::from_slice(&[0i64, 5, 6, 7, 9, 10, 11, 12]).view([2, 4]);
    let mask = Tensor::from_slice(&[0i64, 1, 1, 1, 1, 1, 1, 1]).view([2, 4]);
    (ids, mask)
}

fn f32s(t: &Tensor) -> Vec<f32> {
    Vec::<f32>::try_from(t.to_kind(Kind::Float).view([-1])).unwrap()
}

fn i64s(t: &Tensor) -> Vec<i64> {
    Vec::<i64>::try_from(t.to_kind(Kind::Int64).view([-1])).unwrap()
}

fn assert_close(got: &[f32], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{got:?} vs {want:?}");
    for (g, w) in got.iter().zip(want) {
        if w.is_infinite() {
            assert_eq!(f64::from(*g), *w, "{got:?} vs {want:?}");
        } else {
            assert!((f64::from(*g) - w).abs() <= tol, "{got:?} vs {want:?}");
        }
    }
}

/// "after token i only (i + 1) mod vocab": a `[vocab, vocab]` forbidden-next-token table.
fn chain_mask() -> LogitMask {
    let allowed = (Tensor::arange(VOCAB, (Kind::Int64, Device::Cpu)) + 1).remainder(VOCAB);
    let table = Tensor::ones([VOCAB, VOCAB], (Kind::Bool, Device::Cpu)).scatter_value(
        1,
        &allowed.view([VOCAB, 1]),
        0,
    );
    LogitMask::new(table).unwrap()
}

#[test]
fn one_step_scores_are_rlhf_5_11() {
    // rlhf.md §5.11: logits [2,1,0,-1], target_q1 [.5,.1,.9,0], target_q2 [.4,.3,1,2],
    // v 0.3, β 1, top_k 2, T 1
    let logits = Tensor::from_slice(&[2.0f32, 1.0, 0.0, -1.0]).view([1, 4]);
    let q1 = Tensor::from_slice(&[0.5f32, 0.1, 0.9, 0.0]).view([1, 4]);
    let q2 = Tensor::from_slice(&[0.4f32, 0.3, 1.0, 2.0]).view([1, 4]);
    let v = Tensor::from_slice(&[0.3f32]).view([1, 1]);
    let s = ilql_scores(&logits, &[q1.copy(), q2.copy()], &v, 1.0, 2).unwrap();
    assert_close(&f32s(&s.advantages), &[0.1, -0.2, 0.6, -0.3], 1e-6);
    let scores = [-0.3401897, -1.6401897, -1.8401897, -3.7401897];
    assert_close(&f32s(&s.scores), &scores, 1e-6);
    let ninf = f64::NEG_INFINITY;
    assert_close(
        &f32s(&s.filtered),
        &[scores[0], scores[1], ninf, ninf],
        1e-6,
    );
    let pi = [0.78583498, 0.21416502, 0.0, 0.0];
    assert_close(&f32s(&s.probs(1.0).unwrap()), &pi, 1e-6);
    assert_close(&f32s(&s.probs(0.0).unwrap()), &[1.0, 0.0, 0.0, 0.0], 0.0);
    // T = 2 on the two kept scores: softmax([-0.34, -1.64] / 2) = sigmoid(0.65)
    let p0 = 1.0 / (1.0 + (-0.65f64).exp());
    assert_close(
        &f32s(&s.probs(2.0).unwrap()),
        &[p0, 1.0 - p0, 0.0, 0.0],
        1e-6,
    );
    // top_k 0 and top_k >= vocab keep every token; v as [B] is accepted
    for k in [0, 4, 9] {
        let s = ilql_scores(&logits, &[q1.copy(), q2.copy()], &v.view([1]), 1.0, k).unwrap();
        assert_close(&f32s(&s.filtered), &scores, 1e-6);
    }
    // one Q head: adv = q1 - v; β scales it: log_softmax(logits) + 2·adv
    let s = ilql_scores(&logits, &[q1], &v, 2.0, 0).unwrap();
    let lsm = [-0.4401897, -1.4401897, -2.4401897, -3.4401897];
    let adv = [0.2, -0.2, 0.6, -0.3];
    assert_close(&f32s(&s.advantages), &adv, 1e-6);
    let want: Vec<f64> = lsm.iter().zip(adv).map(|(l, a)| l + 2.0 * a).collect();
    assert_close(&f32s(&s.scores), &want, 1e-6);
}

#[test]
fn beta_zero_top_k_zero_samples_the_tokens_of_plain_generate() {
    let (_vs, m) = model(true, 3);
    let (ids, mask) = prompt();
    for (seed, t) in [(0u64, 1.0), (1, 0.7), (2, 1.6)] {
        let plain_cfg = GenerationConfig::new(10)
            .with_do_sample(true)
            .with_top_k(0)
            .with_temperature(t);
        let plain = generate(
            m.model(),
            &ids,
            Some(&mask),
            &plain_cfg,
            &mut Generator::new(seed),
        );
        let cfg = IlqlGenerationConfig::new(10)
            .with_beta(0.0)
            .with_top_k(0)
            .with_temperature(t);
        let ilql = ilql_generate(&m, &ids, Some(&mask), &cfg, &mut Generator::new(seed)).unwrap();
        let plain = plain.unwrap();
        assert_eq!(
            i64s(&ilql.sequences),
            i64s(&plain.sequences),
            "seed {seed}, T {t}"
        );
        assert!(ilql.attention_mask.equal(&plain.attention_mask));
        assert!(ilql.response_mask.equal(&plain.response_mask));
    }
    // and greedy: temperature 0 is plain greedy decoding
    let plain = generate(
        m.model(),
        &ids,
        Some(&mask),
        &GenerationConfig::new(10),
        &mut Generator::new(0),
    )
    .unwrap();
    let cfg = IlqlGenerationConfig::new(10)
        .with_beta(0.0)
        .with_temperature(0.0);
    let ilql = ilql_generate(&m, &ids, Some(&mask), &cfg, &mut Generator::new(0)).unwrap();
    assert_eq!(i64s(&ilql.sequences), i64s(&plain.sequences));
}

#[test]
fn greedy_is_deterministic_and_ignores_the_rng() {
    let (_vs, m) = model(true, 4);
    let (ids, mask) = prompt();
    let cfg = IlqlGenerationConfig::new(8)
        .with_beta(3.0)
        .with_temperature(0.0);
    let a = ilql_generate(&m, &ids, Some(&mask), &cfg, &mut Generator::new(0)).unwrap();
    let b = ilql_generate(&m, &ids, Some(&mask), &cfg, &mut Generator::new(99)).unwrap();
    assert!(a.sequences.equal(&b.sequences));
    assert_eq!(a.sequences.size(), vec![2, 12]);
    assert!(a.advantages.is_none());
    // sampling: the same seed gives the same tokens
    let cfg = cfg.with_temperature(1.0);
    let a = ilql_generate(&m, &ids, Some(&mask), &cfg, &mut Generator::new(5)).unwrap();
    let b = ilql_generate(&m, &ids, Some(&mask), &cfg, &mut Generator::new(5)).unwrap();
    assert!(a.sequences.equal(&b.sequences));
}

/// Greedy KV-cached generation against a loop that reruns the whole sequence every step and
/// scores by hand: `argmax(log_softmax(logits) + β·(min_i targetQ_i − V))` at the last position.
#[test]
fn kv_cache_generation_equals_a_full_recompute() {
    for two_qs in [true, false] {
        let (_vs, m) = model(two_qs, 7);
        // make the target heads differ from the Q heads, so that which heads are read matters
        for (i, (t, q)) in m
            .heads()
            .target_q_heads()
            .iter()
            .zip(m.heads().q_heads())
            .enumerate()
        {
            tch::manual_seed(100 + i as i64);
            tch::no_grad(|| {
                for p in t.parameters() {
                    let mut p = p.shallow_clone();
                    let _ = p.normal_(0.0, 0.3);
                }
                for p in q.parameters() {
                    let mut p = p.shallow_clone();
                    let _ = p.fill_(0.0);
                }
            });
        }
        let (ids, mask) = prompt();
        let beta = 1.5;
        let n = 9;
        let cfg = IlqlGenerationConfig::new(n)
            .with_beta(beta)
            .with_top_k(5)
            .with_temperature(0.0)
            .with_log_advantages(true);
        let out = ilql_generate(&m, &ids, Some(&mask), &cfg, &mut Generator::new(0)).unwrap();

        let mut seq = ids.copy();
        let mut seq_mask = mask.copy();
        let mut advs = Vec::new();
        for _ in 0..n {
            let o = tch::no_grad(|| {
                m.forward(
                    &LmInput::new(&seq).with_attention_mask(&seq_mask),
                    None,
                    None,
                )
            })
            .unwrap();
            let t = seq.size()[1];
            let last = |x: &Tensor| x.select(1, t - 1);
            let mut q = last(&o.heads.target_qs[0]);
            if two_qs {
                q = q.minimum(&last(&o.heads.target_qs[1]));
            }
            let adv = q - last(&o.heads.vs);
            let scores = last(&o.logits).log_softmax(-1, Kind::Float) + &adv * beta;
            let next = scores.argmax(-1, true);
            advs.push(adv.gather(1, &next, false));
            seq = Tensor::cat(&[&seq, &next], 1);
            seq_mask = Tensor::cat(&[&seq_mask, &next.ones_like()], 1);
        }
        assert_eq!(i64s(&out.sequences), i64s(&seq), "two_qs {two_qs}");
        assert!(out.attention_mask.equal(&seq_mask));
        let want: Vec<f64> = f32s(&Tensor::cat(&advs, 1))
            .into_iter()
            .map(f64::from)
            .collect();
        assert_close(&f32s(out.advantages.as_ref().unwrap()), &want, 1e-5);
    }
}

#[test]
fn the_logit_mask_is_honoured() {
    let (_vs, m) = model(true, 5);
    let (ids, mask) = prompt();
    let table = chain_mask();
    let opts = GenerateOptions::default().with_logit_mask(&table);
    for t in [0.0, 1.0, 2.5] {
        let cfg = IlqlGenerationConfig::new(15)
            .with_beta(4.0)
            .with_temperature(t);
        let out =
            ilql_generate_with(&m, &ids, Some(&mask), &cfg, &opts, &mut Generator::new(1)).unwrap();
        // row 0 ends in 7, row 1 in 12: 8, 9, ... and 13, 14, ... wrapping at 23
        let row = |start: i64| (0..15).map(move |i| (start + i) % VOCAB);
        let want: Vec<i64> = row(8).chain(row(13)).collect();
        assert_eq!(i64s(&out.response), want, "T {t}");
    }
}

#[test]
fn finished_rows_get_pad_and_generation_stops_when_all_finished() {
    let (_vs, m) = model(false, 6);
    let table = chain_mask();
    let opts = GenerateOptions::default().with_logit_mask(&table);
    let eos = 5;
    // row 0 ends in 3 (4, EOS, pad, pad), row 1 in 10 (never reaches EOS in 4 steps)
    let ids = Tensor::from_slice(&[1i64, 2, 3, 8, 9, 10]).view([2, 3]);
    let cfg = IlqlGenerationConfig::new(4)
        .with_eos_token_id(eos)
        .with_pad_token_id(0)
        .with_log_advantages(true);
    let out = ilql_generate_with(&m, &ids, None, &cfg, &opts, &mut Generator::new(2)).unwrap();
    assert_eq!(i64s(&out.response), vec![4, 5, 0, 0, 11, 12, 13, 14]);
    assert_eq!(i64s(&out.response_mask), vec![1, 1, 0, 0, 1, 1, 1, 1]);
    assert_eq!(
        i64s(&out.attention_mask),
        vec![1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 1, 1, 1]
    );
    let adv = f32s(out.advantages.as_ref().unwrap());
    assert_eq!(&adv[2..4], &[0.0, 0.0]);
    assert!(adv[4..].iter().all(|a| *a != 0.0));
    // both rows reach EOS (row 1 ends in 2: 3, 4, EOS): stops after 3 of 8 steps; pad
    // defaults to the EOS id
    let ids = Tensor::from_slice(&[1i64, 2, 3, 0, 1, 2]).view([2, 3]);
    let cfg = IlqlGenerationConfig::new(8).with_eos_token_id(eos);
    let out = ilql_generate_with(&m, &ids, None, &cfg, &opts, &mut Generator::new(2)).unwrap();
    assert_eq!(i64s(&out.response), vec![4, 5, 5, 3, 4, 5]);
    assert_eq!(i64s(&out.response_mask), vec![1, 1, 0, 1, 1, 1]);
    assert_eq!(out.sequences.size(), vec![2, 6]);
}

/// One sampled step over many identical rows: the token frequencies follow
/// `softmax(top_k(log_softmax(logits) + β·(min Q − V)) / T)`, computed here by hand.
#[test]
fn sampling_follows_the_shaped_distribution() {
    let (_vs, m) = model(true, 8);
    let rows = 6000;
    let ids = Tensor::from_slice(&[3i64, 4, 5])
        .view([1, 3])
        .repeat([rows, 1]);
    let (beta, t, k) = (2.0, 1.5, 6);
    let cfg = IlqlGenerationConfig::new(1)
        .with_beta(beta)
        .with_top_k(k)
        .with_temperature(t);
    let out = ilql_generate(&m, &ids, None, &cfg, &mut Generator::new(11)).unwrap();
    let counts = out
        .response
        .view([-1])
        .bincount(None::<Tensor>, VOCAB)
        .to_kind(Kind::Double)
        / rows as f64;

    let o = tch::no_grad(|| m.forward(&LmInput::new(&ids.narrow(0, 0, 1)), None, None)).unwrap();
    let last = |x: &Tensor| x.select(1, 2).to_kind(Kind::Double);
    let q = last(&o.heads.target_qs[0]).minimum(&last(&o.heads.target_qs[1]));
    let scores = last(&o.logits).log_softmax(-1, Kind::Double) + (q - last(&o.heads.vs)) * beta;
    let (top, _) = scores.topk(k, -1, true, true);
    let kth = top.select(1, k - 1).double_value(&[0]);
    let kept = scores.ge(kth);
    let probs = (scores / t)
        .masked_fill(&kept.logical_not(), f64::NEG_INFINITY)
        .softmax(-1, Kind::Double);
    let want = Vec::<f64>::try_from(probs.view([-1])).unwrap();
    let got = Vec::<f64>::try_from(counts.view([-1])).unwrap();
    assert_eq!(want.iter().filter(|p| **p > 0.0).count(), k as usize);
    for (g, w) in got.iter().zip(&want) {
        if *w == 0.0 {
            assert_eq!(*g, 0.0, "{got:?} vs {want:?}");
        } else {
            // 4.5 standard deviations of a frequency over 6000 draws
            let sd = (w * (1.0 - w) / rows as f64).sqrt();
            assert!((g - w).abs() < 4.5 * sd + 1e-9, "{got:?} vs {want:?}");
        }
    }
}

#[test]
fn bad_inputs_are_errors() {
    let (_vs, m) = model(true, 9);
    let (ids, mask) = prompt();
    let rng = &mut Generator::new(0);
    let ok = IlqlGenerationConfig::new(2);
    // a prompt + max_new_tokens over the context names both
    let msg = ilql_generate(&m, &ids, None, &IlqlGenerationConfig::new(21), rng)
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("max_new_tokens") && msg.contains("24") && msg.contains('4'),
        "{msg}"
    );
    for (cfg, field) in [
        (ok.clone().with_beta(f64::NAN), "beta"),
        (ok.clone().with_beta(f64::INFINITY), "beta"),
        (ok.clone().with_temperature(-0.1), "temperature"),
        (ok.clone().with_temperature(f64::NAN), "temperature"),
        (ok.clone().with_top_k(-1), "top_k"),
        (ok.clone().with_eos_token_id(VOCAB), "eos_token_id"),
        (ok.clone().with_pad_token_id(-1), "pad_token_id"),
        (IlqlGenerationConfig::new(-1), "max_new_tokens"),
    ] {
        let err = ilql_generate(&m, &ids, Some(&mask), &cfg, rng).unwrap_err();
        assert!(matches!(err, Error::InvalidConfig { .. }), "{err}");
        assert!(err.to_string().contains(field), "{err}");
    }
    // prompt shape: 1-D, no tokens; ids outside the vocabulary
    assert!(ilql_generate(&m, &ids.view([-1]), None, &ok, rng)
        .unwrap_err()
        .to_string()
        .contains("prompt"));
    let empty = Tensor::zeros([2, 0], (Kind::Int64, Device::Cpu));
    assert!(ilql_generate(&m, &empty, None, &ok, rng)
        .unwrap_err()
        .to_string()
        .contains("prompt"));
    assert!(ilql_generate(&m, &(&ids + VOCAB), None, &ok, rng).is_err());
    // a mask of the wrong shape
    let bad_mask = Tensor::ones([2, 3], (Kind::Int64, Device::Cpu));
    assert!(ilql_generate(&m, &ids, Some(&bad_mask), &ok, rng).is_err());
    // a logit mask for another vocabulary
    let table = LogitMask::new(Tensor::zeros([5, 5], (Kind::Bool, Device::Cpu))).unwrap();
    let opts = GenerateOptions::default().with_logit_mask(&table);
    let err = ilql_generate_with(&m, &ids, None, &ok, &opts, rng).unwrap_err();
    assert!(matches!(err, Error::ShapeMismatch { .. }), "{err}");
    assert!(err.to_string().contains("logit_mask"), "{err}");
    // max_new_tokens 0 is an empty response
    let out = ilql_generate(&m, &ids, None, &IlqlGenerationConfig::new(0), rng).unwrap();
    assert_eq!(out.response.size(), vec![2, 0]);
    assert!(out.sequences.equal(&ids));

    // the scoring function
    let logits = Tensor::zeros([2, 4], (Kind::Float, Device::Cpu));
    let q = logits.copy();
    let v = Tensor::zeros([2], (Kind::Float, Device::Cpu));
    fn check<T: std::fmt::Debug>(r: torchrl::Result<T>, word: &str) {
        let msg = r.unwrap_err().to_string();
        assert!(msg.contains(word), "{msg}");
    }
    check(ilql_scores(&logits, &[], &v, 1.0, 0), "target_qs");
    check(
        ilql_scores(&logits, &[q.copy(), q.copy(), q.copy()], &v, 1.0, 0),
        "target_qs",
    );
    check(
        ilql_scores(&logits, &[q.narrow(1, 0, 3)], &v, 1.0, 0),
        "target_qs",
    );
    check(
        ilql_scores(&logits, &[q.copy()], &v.narrow(0, 0, 1), 1.0, 0),
        "v",
    );
    check(
        ilql_scores(&logits.view([-1]), &[q.copy()], &v, 1.0, 0),
        "logits",
    );
    check(ilql_scores(&logits, &[q.copy()], &v, f64::NAN, 0), "beta");
    check(ilql_scores(&logits, &[q.copy()], &v, 1.0, -2), "top_k");
    let s = ilql_scores(&logits, &[q], &v, 1.0, 0).unwrap();
    check(s.probs(-1.0), "temperature");
}

#[test]
fn target_heads_follow_the_model_store_to_float64() {
    // the model's store made float64 after the heads were built: the target heads (a store of
    // their own) follow, the forward runs in float64, and a Polyak step stays exact in it
    let (mut vs, m) = model(true, 7);
    vs.set_kind(Kind::Double);
    let (ids, mask) = prompt();
    let out = m
        .forward(&LmInput::new(&ids).with_attention_mask(&mask), None, None)
        .unwrap();
    assert_eq!(out.heads.target_qs[0].kind(), Kind::Double);
    // freshly built, the target heads equal the Q heads
    let diff = (&out.heads.target_qs[1] - &out.heads.qs[1]).abs().max();
    assert_eq!(diff.double_value(&[]), 0.0);
    let q = m.heads().q_heads()[0].parameters()[0].copy();
    let t = m.heads().target_q_heads()[0].parameters()[0].copy();
    // move the Q head, then one sync: target = α q' + (1 − α) t, computed in float64
    tch::no_grad(|| {
        let _ = m.heads().q_heads()[0].parameters()[0]
            .shallow_clone()
            .f_add_scalar_(1.0);
    });
    m.heads().sync_target_q_heads().unwrap();
    let t2 = m.heads().target_q_heads()[0].parameters()[0];
    assert_eq!(t2.kind(), Kind::Double);
    let want = (&q + 1.0) * 0.01 + &t * 0.99;
    let err = (t2 - want).abs().max().double_value(&[]);
    assert!(err < 1e-15, "{err}");
}
