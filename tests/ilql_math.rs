//! ILQL: the offline data of `torchrl::trainers::ilql::data` and the loss of
//! `torchrl::objectives::llm::ilql`.
//!
//! 1. rlhf.md §5.9 and §5.10 literally (both `two_qs`), on the functional core.
//! 2. Replays `specs/ilql_cases.json` (recorded by `specs/record_ilql.py`; Python is never
//!    run): the loss hand-derived from trlX's `ILQLConfig.loss` formula (rlhf.md §2.3) on
//!    seeded random heads over padded batches, and the data hand-derived from trlX HEAD's
//!    `tokenize_dialogue` + `make_experience` (both cross-checked by the recorder against
//!    trlX's own code when its snapshot is present).
//! 3. The data builder by hand: a dialogue with two outputs, a bare string, truncation, the
//!    normalisation, the collation, the minibatches and the errors.
//! 4. `IlqlLoss` on a tiny random-init `CausalLmWithIlqlHeads`: equal to the functional core
//!    on the model's own outputs; `set_keys` renames.

mod recorded;

use recorded::{f, tensor};

use serde_json::Value;
use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};
use torchrl::modules::llm::{
    ByteTokenizer, CausalLmWithIlqlHeads, Gpt2Config, Gpt2Model, LmInput, SpecialTokens,
    TextTokenizer,
};
use torchrl::objectives::llm::{
    expectile_loss, ilql_loss, IlqlConfig, IlqlInputs, IlqlKeys, IlqlLoss, IlqlLossOutput,
};
use torchrl::objectives::{AcceptedKeys, LossModule, LossOutput};
use torchrl::trainers::ilql::data::{
    normalize_returns, IlqlDataConfig, IlqlDataset, IlqlElement, IlqlSample, IlqlTokenSample,
};
use torchrl::{Error, Generator, NestedKey, TensorDict};

const TOL: f64 = 1e-10;

// ------------------------------------------------------------------ helpers

fn cases(kind: &str) -> Vec<Value> {
    recorded::cases("ilql_cases.json", "record_ilql.py", kind)
}

fn ints(v: &Value) -> Vec<i64> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_i64().expect("int"))
        .collect()
}

fn floats(v: &Value) -> Vec<f64> {
    v.as_array().expect("array").iter().map(f).collect()
}

fn vec64(t: &Tensor) -> Vec<f64> {
    Vec::<f64>::try_from(t.to_kind(Kind::Double).view([-1])).expect("f64 vector")
}

fn vec_i64(t: &Tensor) -> Vec<i64> {
    Vec::<i64>::try_from(t.to_kind(Kind::Int64).view([-1])).expect("i64 vector")
}

fn assert_scalar(got: &Tensor, want: f64, tol: f64, what: &str) {
    let g = got.double_value(&[]);
    assert!(
        (g - want).abs() <= tol * want.abs().max(1.0),
        "{what}: {g} vs {want}"
    );
}

fn mat(v: &[f64], r: i64, c: i64) -> Tensor {
    Tensor::from_slice(v).view([1, r, c])
}

fn ids(v: &[i64]) -> Tensor {
    Tensor::from_slice(v).view([1, v.len() as i64])
}

/// rlhf.md §5.10's inputs: (logits, q1, q2, vs, input_ids, actions_ixs, dones, rewards).
struct Section510 {
    logits: Tensor,
    q1: Tensor,
    q2: Tensor,
    vs: Tensor,
    input_ids: Tensor,
    actions_ixs: Tensor,
    dones: Tensor,
    rewards: Tensor,
}

fn section_5_10() -> Section510 {
    Section510 {
        logits: mat(&[1., 0., -1., 0.5, 0.5, 0., 0., 1., 0., 0.2, 0.1, 0.], 4, 3),
        q1: mat(&[0.1, 0.2, 0.3, 0., 0.4, 0.1, 0.3, 0.2, 0.9], 3, 3),
        q2: mat(&[0.2, 0.1, 0.5, 0.1, 0.3, 0., 0.2, 0.4, 0.8], 3, 3),
        vs: Tensor::from_slice(&[0.2f64, 0.35, 0.6, 0.0]).view([1, 4, 1]),
        input_ids: ids(&[0, 2, 1, 0]),
        actions_ixs: ids(&[0, 1, 2]),
        dones: ids(&[1, 1, 1, 0]),
        rewards: Tensor::from_slice(&[0.0f64, 0.0, 1.0]).view([1, 3]),
    }
}

fn run_5_10(two_qs: bool) -> IlqlLossOutput {
    let s = section_5_10();
    let (qs, tqs) = if two_qs {
        (
            vec![s.q1.shallow_clone(), s.q2.shallow_clone()],
            vec![
                s.q1.f_add_scalar(0.05).unwrap(),
                s.q2.f_sub_scalar(0.05).unwrap(),
            ],
        )
    } else {
        (
            vec![s.q1.shallow_clone()],
            vec![s.q1.f_add_scalar(0.05).unwrap()],
        )
    };
    ilql_loss(
        &IlqlInputs {
            logits: &s.logits,
            qs: &qs,
            target_qs: &tqs,
            vs: &s.vs,
            input_ids: &s.input_ids,
            actions_ixs: &s.actions_ixs,
            continues: &s.dones,
            rewards: &s.rewards,
        },
        &IlqlConfig::new().with_two_qs(two_qs),
    )
    .unwrap()
}

// ------------------------------------------------------------------ 1. rlhf.md §5.9, §5.10

#[test]
fn section_5_9_expectile() {
    let e = expectile_loss(
        &Tensor::from_slice(&[1.0f64, 0.0, 0.5]),
        &Tensor::from_slice(&[0.5f64, 0.5, 0.5]),
        0.7,
    )
    .unwrap();
    let e = vec64(&e);
    for (g, w) in e.iter().zip([0.175, 0.075, 0.0]) {
        assert!((g - w).abs() < 1e-15, "{g} vs {w}");
    }
    assert!((e.iter().sum::<f64>() / 3.0 - 0.0833333333).abs() < 1e-10);
}

#[test]
fn section_5_10_two_qs() {
    let out = run_5_10(true);
    assert_scalar(&out.loss_q, 0.4265988333, 1e-9, "loss_q");
    assert_scalar(&out.loss_v, 0.0265, 1e-12, "loss_v");
    assert_scalar(&out.cql_loss, 2.1382265531, 1e-9, "loss_cql");
    assert_scalar(&out.awac_loss, 1.6390235888, 1e-9, "loss_awac");
    assert_scalar(&out.loss, 2.3059450774, 1e-9, "loss");
    // the scaled terms and the total
    assert_scalar(&out.loss_cql, 0.21382265531, 1e-9, "0.1 · loss_cql");
    assert_scalar(&out.loss_awac, 1.6390235888, 1e-9, "1 · loss_awac");
    assert_scalar(&out.total_loss().unwrap(), 2.3059450774, 1e-9, "total");
    // statistics: Q1 [.3,.4,.3], Q2 [.5,.3,.2], targetQ [.35,.25,.15], V [.2,.35,.6]
    assert_eq!(out.q_mean.len(), 2);
    assert_scalar(&out.q_mean[0], 1.0 / 3.0, 1e-12, "q1 mean");
    assert_scalar(&out.q_mean[1], 1.0 / 3.0, 1e-12, "q2 mean");
    assert_scalar(&out.target_q_mean, 0.25, 1e-12, "targetQ mean");
    assert_scalar(&out.v_mean, 1.15 / 3.0, 1e-12, "V mean");
    assert_scalar(
        &out.advantage_mean,
        0.25 - 1.15 / 3.0,
        1e-12,
        "advantage mean",
    );
    assert_scalar(&out.awac_weight_mean, 1.0, 1e-15, "awac weight (β = 0)");
    assert_scalar(&out.awac_weight_max, 1.0, 1e-15, "awac weight max");
    assert_scalar(&out.n_actions, 3.0, 0.0, "n");
    let names: Vec<&str> = out.metrics().iter().map(|(n, _)| *n).collect();
    assert!(names.contains(&"q2_mean") && names.contains(&"cql_loss"));
}

#[test]
fn section_5_10_one_q() {
    let out = run_5_10(false);
    assert_scalar(&out.loss_q, 0.1765994167, 1e-9, "loss_q");
    assert_scalar(&out.loss_v, 0.0138333333, 1e-9, "loss_v");
    assert_scalar(&out.cql_loss, 1.0658778891, 1e-9, "loss_cql");
    assert_scalar(&out.awac_loss, 1.6390235888, 1e-9, "loss_awac");
    assert_scalar(&out.loss, 1.9360441277, 1e-9, "loss");
    assert_eq!(out.q_mean.len(), 1);
    // targetQ = Q1 + 0.05 = [.35, .45, .35]
    assert_scalar(&out.target_q_mean, 1.15 / 3.0, 1e-12, "targetQ mean");
}

#[test]
fn gradients_flow_to_q_v_and_logits_but_not_targets() {
    let s = section_5_10();
    let logits = s.logits.set_requires_grad(true);
    let q1 = s.q1.set_requires_grad(true);
    let vs = s.vs.set_requires_grad(true);
    let tq =
        s.q1.detach()
            .f_add_scalar(0.05)
            .unwrap()
            .set_requires_grad(true);
    let out = ilql_loss(
        &IlqlInputs {
            logits: &logits,
            qs: &[q1.shallow_clone()],
            target_qs: &[tq.shallow_clone()],
            vs: &vs,
            input_ids: &s.input_ids,
            actions_ixs: &s.actions_ixs,
            continues: &s.dones,
            rewards: &s.rewards,
        },
        &IlqlConfig::new().with_two_qs(false).with_beta(1.0),
    )
    .unwrap();
    out.total_loss().unwrap().backward();
    assert!(logits.grad().defined() && q1.grad().defined() && vs.grad().defined());
    assert!(!tq.grad().defined(), "target Qs are constants");
    // the last state's value only enters through Vnext (detached) → no gradient
    assert_eq!(vs.grad().double_value(&[0, 3, 0]), 0.0);
    // the last logit row is no action position → no gradient
    assert!(vec64(&logits.grad().get(0).get(3))
        .iter()
        .all(|&g| g == 0.0));
}

// ------------------------------------------------------------------ 2. recorded cases

fn config_of(c: &Value) -> IlqlConfig {
    let k = &c["config"];
    IlqlConfig::new()
        .with_tau(f(&k["tau"]))
        .with_gamma(f(&k["gamma"]))
        .with_cql_scale(f(&k["cql_scale"]))
        .with_awac_scale(f(&k["awac_scale"]))
        .with_beta(f(&k["beta"]))
        .with_two_qs(k["two_qs"].as_bool().expect("two_qs"))
}

#[test]
fn replay_recorded_loss_cases() {
    for c in cases("loss") {
        let name = c["name"].as_str().expect("name");
        assert!(c["source"]
            .as_str()
            .unwrap()
            .contains("hand-derived from trlX's ILQLConfig.loss formula (rlhf.md §2.3)"));
        let qs: Vec<Tensor> = c["qs"].as_array().unwrap().iter().map(tensor).collect();
        let tqs: Vec<Tensor> = c["target_qs"]
            .as_array()
            .unwrap()
            .iter()
            .map(tensor)
            .collect();
        let input_ids = tensor(&c["input_ids"]).to_kind(Kind::Int64);
        let actions_ixs = tensor(&c["actions_ixs"]).to_kind(Kind::Int64);
        let dones = tensor(&c["dones"]).to_kind(Kind::Int64);
        let out = ilql_loss(
            &IlqlInputs {
                logits: &tensor(&c["logits"]),
                qs: &qs,
                target_qs: &tqs,
                vs: &tensor(&c["vs"]),
                input_ids: &input_ids,
                actions_ixs: &actions_ixs,
                continues: &dones,
                rewards: &tensor(&c["rewards"]),
            },
            &config_of(&c),
        )
        .unwrap();
        let e = &c["expect"];
        for (what, got) in [
            ("loss", &out.loss),
            ("loss_q", &out.loss_q),
            ("loss_v", &out.loss_v),
            ("loss_cql", &out.loss_cql),
            ("loss_awac", &out.loss_awac),
            ("cql_loss", &out.cql_loss),
            ("awac_loss", &out.awac_loss),
            ("target_q_mean", &out.target_q_mean),
            ("v_mean", &out.v_mean),
            ("advantage_mean", &out.advantage_mean),
            ("awac_weight_mean", &out.awac_weight_mean),
            ("awac_weight_max", &out.awac_weight_max),
            ("n_actions", &out.n_actions),
        ] {
            assert_scalar(got, f(&e[what]), TOL, &format!("{name}: {what}"));
        }
        for (i, (got, want)) in out.q_mean.iter().zip(floats(&e["q_mean"])).enumerate() {
            assert_scalar(got, want, TOL, &format!("{name}: q_mean[{i}]"));
        }
        assert_eq!(out.q_mean.len(), qs.len());
    }
}

fn sample_of(v: &Value) -> IlqlSample {
    match (v.get("text"), v.get("dialogue")) {
        (Some(t), _) => IlqlSample::from(t.as_str().expect("text")),
        (_, Some(d)) => IlqlSample::dialogue(
            d.as_array()
                .expect("segments")
                .iter()
                .map(|s| s.as_str().expect("segment").to_string()),
        ),
        _ => panic!("unknown sample {v}"),
    }
}

#[test]
fn replay_recorded_data_cases() {
    for c in cases("data") {
        let name = c["name"].as_str().unwrap();
        let samples: Vec<IlqlSample> = c["samples"]
            .as_array()
            .unwrap()
            .iter()
            .map(sample_of)
            .collect();
        let returns = floats(&c["returns"]);
        let cfg = IlqlDataConfig::new().with_seq_length(c["seq_length"].as_u64().unwrap() as usize);
        let data =
            IlqlDataset::from_texts(&samples, &returns, &ByteTokenizer::new(), &cfg).unwrap();
        let expect = c["expect"].as_array().unwrap();
        assert_eq!(data.len(), expect.len(), "{name}");
        for (i, (e, w)) in data.elements().iter().zip(expect).enumerate() {
            assert_eq!(e.input_ids, ints(&w["input_ids"]), "{name}[{i}] input_ids");
            assert_eq!(
                e.actions_ixs,
                ints(&w["actions_ixs"]),
                "{name}[{i}] actions_ixs"
            );
            assert_eq!(
                e.states_ixs,
                ints(&w["states_ixs"]),
                "{name}[{i}] states_ixs"
            );
            assert_eq!(
                e.continues,
                ints(&w["dones"]),
                "{name}[{i}] continues = trlX's dones"
            );
            assert_eq!(e.action_rewards.len(), e.actions_ixs.len());
            for (g, r) in e.action_rewards.iter().zip(floats(&w["rewards"])) {
                assert!((g - r).abs() < 1e-12, "{name}[{i}] rewards: {g} vs {r}");
            }
            assert_eq!(e.ret, returns[i]);
        }
        // the collation: right-padded with 0 everywhere
        let all: Vec<usize> = (0..data.len()).collect();
        let batch = data.batch(&all).unwrap();
        check_collation(&batch, data.elements(), &IlqlKeys::default());
    }
}

/// Checks a batch against its elements, padding by hand.
fn check_collation(batch: &TensorDict, rows: &[IlqlElement], k: &IlqlKeys) {
    let t = rows.iter().map(|e| e.input_ids.len()).max().unwrap();
    let a = rows.iter().map(|e| e.actions_ixs.len()).max().unwrap();
    let pad = |r: &[i64], w: usize| {
        let mut r = r.to_vec();
        r.resize(w, 0);
        r
    };
    let b = rows.len() as i64;
    let want = |f: &dyn Fn(&IlqlElement) -> Vec<i64>| rows.iter().flat_map(f).collect::<Vec<_>>();
    let g = |key: &NestedKey| batch.get_or_err(key).unwrap();
    assert_eq!(batch.batch_size(), &[b]);
    assert_eq!(g(&k.tokens).size(), vec![b, t as i64]);
    assert_eq!(g(&k.tokens).kind(), Kind::Int64);
    assert_eq!(vec_i64(g(&k.tokens)), want(&|e| pad(&e.input_ids, t)));
    assert_eq!(
        vec_i64(g(&k.attention_mask)),
        want(&|e| pad(&vec![1; e.input_ids.len()], t))
    );
    assert_eq!(g(&k.actions_ixs).size(), vec![b, a as i64]);
    assert_eq!(
        vec_i64(g(&k.actions_ixs)),
        want(&|e| pad(&e.actions_ixs, a))
    );
    assert_eq!(g(&k.states_ixs).size(), vec![b, a as i64 + 1]);
    assert_eq!(
        vec_i64(g(&k.states_ixs)),
        want(&|e| pad(&e.states_ixs, a + 1))
    );
    assert_eq!(
        vec_i64(g(&k.continues)),
        want(&|e| pad(&e.continues, a + 1))
    );
    let rewards = g(&k.action_rewards);
    assert_eq!(
        (rewards.size(), rewards.kind()),
        (vec![b, a as i64], Kind::Float)
    );
    let want_r: Vec<f64> = rows
        .iter()
        .flat_map(|e| {
            let mut r = e.action_rewards.clone();
            r.resize(a, 0.0);
            r
        })
        .collect();
    for (g, w) in vec64(rewards).iter().zip(want_r) {
        assert!((g - w).abs() < 1e-6, "{g} vs {w}");
    }
}

// ------------------------------------------------------------------ 3. the data by hand

const E: i64 = ByteTokenizer::EOS;
const B: i64 = ByteTokenizer::BOS;

#[test]
fn dialogue_with_two_outputs() {
    // "P" "ab" "QR" "c": P a b Q R c EOS, outputs at 1 (2 tokens) and 5 (2 tokens with EOS)
    let s = IlqlSample::dialogue(["P", "ab", "QR", "c"]);
    let data = IlqlDataset::from_texts(
        &[s, IlqlSample::from("z")],
        &[2.0, 0.0],
        &ByteTokenizer::new(),
        &IlqlDataConfig::new(),
    )
    .unwrap();
    let e = &data.elements()[0];
    assert_eq!(e.input_ids, vec![80, 97, 98, 81, 82, 99, E]);
    assert_eq!(e.actions_ixs, vec![0, 1, 4, 5]);
    assert_eq!(e.states_ixs, vec![0, 1, 4, 5, 6]);
    assert_eq!(e.continues, vec![1, 1, 1, 1, 0]);
    // the actions are the output tokens
    let actions: Vec<i64> = e
        .actions_ixs
        .iter()
        .map(|&p| e.input_ids[p as usize + 1])
        .collect();
    assert_eq!(actions, vec![97, 98, 99, E]);
    // returns 2, 0: mean 1, unbiased std √2 → ±1/√2
    let r = 1.0 / 2f64.sqrt();
    assert_eq!(&e.action_rewards[..3], &[0.0, 0.0, 0.0]);
    assert!((e.action_rewards[3] - r / (1.0 + f64::EPSILON / 2f64.sqrt())).abs() < 1e-15);
    // with add_bos the first prompt gets BOS and every position moves by one
    let data = IlqlDataset::from_texts(
        &[IlqlSample::dialogue(["P", "ab", "QR", "c"])],
        &[1.0],
        &ByteTokenizer::new(),
        &IlqlDataConfig::new().with_add_bos(true),
    )
    .unwrap();
    let e = &data.elements()[0];
    assert_eq!(e.input_ids[0], B);
    assert_eq!(e.actions_ixs, vec![1, 2, 5, 6]);
    // an output that already ends with EOS gets no second one
    let data = IlqlDataset::from_texts(
        &[IlqlSample::dialogue(["P", "a<|endoftext|>"])],
        &[1.0],
        &ByteTokenizer::new(),
        &IlqlDataConfig::new(),
    )
    .unwrap();
    assert_eq!(data.elements()[0].input_ids, vec![80, 97, E]);
}

#[test]
fn bare_string_is_bos_then_the_output() {
    let data = IlqlDataset::from_texts(
        &[IlqlSample::from("hi")],
        &[3.0],
        &ByteTokenizer::new(),
        &IlqlDataConfig::new(),
    )
    .unwrap();
    let e = &data.elements()[0];
    assert_eq!(e.input_ids, vec![B, 104, 105, E]);
    assert_eq!(e.actions_ixs, vec![0, 1, 2]);
    assert_eq!(e.states_ixs, vec![0, 1, 2, 3]);
    assert_eq!(e.continues, vec![1, 1, 1, 0]);
    // one sample: std is NaN, trlX skips the division: R − mean = 0
    assert_eq!(e.action_rewards, vec![0.0, 0.0, 0.0]);
    // without EOS
    let data = IlqlDataset::from_texts(
        &[IlqlSample::from("hi")],
        &[3.0],
        &ByteTokenizer::new(),
        &IlqlDataConfig::new()
            .with_add_eos(false)
            .with_normalize_returns(false),
    )
    .unwrap();
    let e = &data.elements()[0];
    assert_eq!(e.input_ids, vec![B, 104, 105]);
    assert_eq!(e.action_rewards, vec![0.0, 3.0]);
}

#[test]
fn truncation_to_seq_length() {
    let cfg = IlqlDataConfig::new().with_seq_length(5);
    let data = IlqlDataset::from_texts(
        &[
            IlqlSample::from("abcdef"),                     // BOS a b c d | e f EOS
            IlqlSample::dialogue(["pq", "r", "stu", "vw"]), // p q r s t | u v w EOS
            IlqlSample::dialogue(["p", "ab"]),              // fits: p a b EOS
        ],
        &[1.0, 2.0, 3.0],
        &ByteTokenizer::new(),
        &cfg,
    )
    .unwrap();
    let [a, b, c] = data.elements() else {
        panic!("three elements")
    };
    assert_eq!(a.input_ids, vec![B, 97, 98, 99, 100]);
    assert_eq!(a.actions_ixs, vec![0, 1, 2, 3]);
    assert_eq!(a.states_ixs, vec![0, 1, 2, 3, 4]);
    // the second output is gone; the second prompt is cut; the last state is L − 1 = 4
    assert_eq!(b.input_ids, vec![112, 113, 114, 115, 116]);
    assert_eq!(b.actions_ixs, vec![1]);
    assert_eq!(b.states_ixs, vec![1, 4]);
    assert_eq!(b.continues, vec![1, 0]);
    assert_eq!(c.input_ids, vec![112, 97, 98, E]);
    // the same through token rows
    let rows = IlqlDataset::from_token_rows(
        &[IlqlTokenSample::dialogue(
            vec![
                vec![112, 113],
                vec![114],
                vec![115, 116, 117],
                vec![118, 119],
            ],
            2.0,
        )],
        &cfg,
    )
    .unwrap();
    assert_eq!(rows.elements()[0].input_ids, b.input_ids);
    assert_eq!(rows.elements()[0].states_ixs, b.states_ixs);
}

#[test]
fn normalisation_over_the_dataset() {
    // returns 1, 2, 6: mean 3, unbiased var (4 + 1 + 9) / 2 = 7
    let r = normalize_returns(&[1.0, 2.0, 6.0]);
    let s = 7f64.sqrt() + f64::EPSILON;
    for (g, w) in r.iter().zip([-2.0 / s, -1.0 / s, 3.0 / s]) {
        assert!((g - w).abs() < 1e-15, "{g} vs {w}");
    }
    let rows: Vec<_> = [1.0, 2.0, 6.0]
        .iter()
        .map(|&ret| IlqlTokenSample::new(vec![1], vec![2, 3], ret))
        .collect();
    let data = IlqlDataset::from_token_rows(&rows, &IlqlDataConfig::new()).unwrap();
    for (e, w) in data.elements().iter().zip(&r) {
        assert_eq!(e.action_rewards, vec![0.0, *w]);
    }
    // equal returns: std 0, (R − mean) / eps = 0
    assert_eq!(normalize_returns(&[4.0, 4.0, 4.0]), vec![0.0; 3]);
}

#[test]
fn batches_and_seeded_minibatches() {
    let rows: Vec<_> = (0..7)
        .map(|i| IlqlTokenSample::new(vec![1; 1 + i % 3], vec![2; 1 + i % 2], i as f64))
        .collect();
    let data = IlqlDataset::from_token_rows(&rows, &IlqlDataConfig::new()).unwrap();
    let batch = data.batch(&[3, 0, 3]).unwrap();
    let picked: Vec<IlqlElement> = [3, 0, 3]
        .iter()
        .map(|&i| data.elements()[i].clone())
        .collect();
    check_collation(&batch, &picked, &IlqlKeys::default());
    // padded actions have continues 0 at their column
    let cont = vec_i64(batch.get_or_err("continues").unwrap());
    assert_eq!(cont, vec![1, 1, 0, 1, 0, 0, 1, 1, 0]);

    let mut rng = Generator::new(3);
    let mbs: Vec<TensorDict> = data
        .minibatches(3, &mut rng)
        .unwrap()
        .collect::<torchrl::Result<_>>()
        .unwrap();
    assert_eq!(
        mbs.iter().map(|b| b.batch_size()[0]).collect::<Vec<_>>(),
        vec![3, 3, 1]
    );
    let a = data.shuffled_indices(3, &mut Generator::new(3)).unwrap();
    let b = data.shuffled_indices(3, &mut Generator::new(4)).unwrap();
    assert_ne!(a, b, "another seed, another order");
    let mut flat = a.concat();
    flat.sort();
    assert_eq!(flat, (0..7).collect::<Vec<_>>());
    // the minibatches are the batches of those indices
    for (mb, idx) in mbs.iter().zip(&a) {
        let want = data.batch(idx).unwrap();
        assert!(mb
            .get_or_err(("tokens", "full"))
            .unwrap()
            .equal(want.get_or_err(("tokens", "full")).unwrap()));
    }
    // keys of our own
    let keys = IlqlKeys {
        continues: "mask".into(),
        ..IlqlKeys::default()
    };
    let renamed = data.clone().with_keys(keys.clone()).batch(&[0]).unwrap();
    assert!(renamed.get_or_err("mask").is_ok() && renamed.get_or_err("continues").is_err());
}

/// ByteTokenizer without one special token.
struct Without {
    bos: bool,
    eos: bool,
}

impl TextTokenizer for Without {
    fn encode(&self, text: &str) -> torchrl::Result<Vec<i64>> {
        ByteTokenizer::new().encode(text)
    }
    fn decode(&self, ids: &[i64], special: SpecialTokens) -> torchrl::Result<String> {
        ByteTokenizer::new().decode(ids, special)
    }
    fn vocab_size(&self) -> i64 {
        259
    }
    fn eos_token_id(&self) -> Option<i64> {
        self.eos.then_some(E)
    }
    fn pad_token_id(&self) -> Option<i64> {
        None
    }
    fn bos_token_id(&self) -> Option<i64> {
        self.bos.then_some(B)
    }
}

fn text_err(samples: &[IlqlSample], returns: &[f64], cfg: &IlqlDataConfig) -> String {
    IlqlDataset::from_texts(samples, returns, &ByteTokenizer::new(), cfg)
        .unwrap_err()
        .to_string()
}

#[test]
fn data_errors_are_clear() {
    let cfg = IlqlDataConfig::new();
    let ok = IlqlSample::dialogue(["p", "o"]);
    // an empty output
    let msg = text_err(
        &[ok.clone(), IlqlSample::dialogue(["p", "", "q", "o"])],
        &[0.0, 1.0],
        &cfg,
    );
    assert!(
        msg.contains("samples[1]") && msg.contains("output segment 1 has no tokens"),
        "{msg}"
    );
    // every action past seq_length
    let msg = text_err(
        &[ok.clone(), IlqlSample::dialogue(["a long prompt", "o"])],
        &[0.0, 1.0],
        &IlqlDataConfig::new().with_seq_length(4),
    );
    assert!(
        msg.contains("samples[1]") && msg.contains("seq_length 4"),
        "{msg}"
    );
    assert!(msg.contains("starts at token 13"), "{msg}");
    // NaN / infinite returns
    for bad in [f64::NAN, f64::INFINITY] {
        let msg = text_err(&[ok.clone(), ok.clone()], &[0.0, bad], &cfg);
        assert!(
            msg.contains("samples[1]") && msg.contains("finite return"),
            "{msg}"
        );
        let err =
            IlqlDataset::from_token_rows(&[IlqlTokenSample::new(vec![1], vec![2], bad)], &cfg)
                .unwrap_err();
        assert!(err.to_string().contains("samples[0]"), "{err}");
    }
    // an empty dataset
    let msg = text_err(&[], &[], &cfg);
    assert!(msg.contains("empty dataset"), "{msg}");
    assert!(IlqlDataset::from_token_rows(&[], &cfg).is_err());
    // a tokenizer without BOS for a bare string / add_bos, without EOS for add_eos
    let no_bos = Without {
        bos: false,
        eos: true,
    };
    let err = IlqlDataset::from_texts(&[IlqlSample::from("x")], &[0.0], &no_bos, &cfg).unwrap_err();
    assert!(err.to_string().contains("BOS"), "{err}");
    let err = IlqlDataset::from_texts(
        std::slice::from_ref(&ok),
        &[0.0],
        &no_bos,
        &cfg.clone().with_add_bos(true),
    )
    .unwrap_err();
    assert!(err.to_string().contains("BOS"), "{err}");
    assert!(IlqlDataset::from_texts(std::slice::from_ref(&ok), &[0.0], &no_bos, &cfg).is_ok());
    let no_eos = Without {
        bos: true,
        eos: false,
    };
    let err =
        IlqlDataset::from_texts(std::slice::from_ref(&ok), &[0.0], &no_eos, &cfg).unwrap_err();
    assert!(err.to_string().contains("EOS"), "{err}");
    assert!(IlqlDataset::from_texts(
        std::slice::from_ref(&ok),
        &[0.0],
        &no_eos,
        &cfg.clone().with_add_eos(false)
    )
    .is_ok());
    // odd dialogues, count mismatches, empty first prompt, negative ids, bad indices
    let msg = text_err(&[IlqlSample::dialogue(["p", "o", "q"])], &[0.0], &cfg);
    assert!(msg.contains("even") && msg.contains("3 segments"), "{msg}");
    let msg = text_err(std::slice::from_ref(&ok), &[0.0, 1.0], &cfg);
    assert!(
        msg.contains("returns") && msg.contains("2 returns"),
        "{msg}"
    );
    let err = IlqlDataset::from_token_rows(&[IlqlTokenSample::new(vec![], vec![2], 0.0)], &cfg)
        .unwrap_err();
    assert!(err.to_string().contains("empty first prompt"), "{err}");
    let err = IlqlDataset::from_token_rows(&[IlqlTokenSample::new(vec![1], vec![-2], 0.0)], &cfg)
        .unwrap_err();
    assert!(err.to_string().contains("id -2"), "{err}");
    let data =
        IlqlDataset::from_token_rows(&[IlqlTokenSample::new(vec![1], vec![2], 0.0)], &cfg).unwrap();
    assert!(matches!(
        data.batch(&[1]).unwrap_err(),
        Error::IndexOutOfRange {
            index: 1,
            size: 1,
            ..
        }
    ));
    assert!(data.batch(&[]).is_err());
    assert!(data.shuffled_indices(0, &mut Generator::new(0)).is_err());
    assert!(matches!(
        IlqlDataset::from_token_rows(&[], &cfg.with_seq_length(1)).unwrap_err(),
        Error::InvalidConfig {
            field: "seq_length",
            ..
        }
    ));
}

#[test]
fn loss_errors_are_clear() {
    let s = section_5_10();
    let q = s.q1.shallow_clone();
    let inputs = |qs: &[Tensor], actions: &Tensor, vs: &Tensor| {
        ilql_loss(
            &IlqlInputs {
                logits: &s.logits,
                qs,
                target_qs: qs,
                vs,
                input_ids: &s.input_ids,
                actions_ixs: actions,
                continues: &s.dones,
                rewards: &s.rewards,
            },
            &IlqlConfig::new(),
        )
        .unwrap_err()
        .to_string()
    };
    let msg = inputs(&[q.shallow_clone()], &s.actions_ixs, &s.vs);
    assert!(
        msg.contains("2 Q heads") && msg.contains("1 tensors"),
        "{msg}"
    );
    let two = [q.shallow_clone(), q.shallow_clone()];
    let msg = inputs(&two, &ids(&[0, 1, 3]), &s.vs);
    assert!(
        msg.contains("actions_ixs") && msg.contains("[0, 2]") && msg.contains("[0, 3]"),
        "{msg}"
    );
    let msg = inputs(&two, &s.actions_ixs, &s.vs.narrow(1, 0, 3));
    assert!(
        msg.contains("vs") && msg.contains("[1, 4, 1]") && msg.contains("[1, 3, 1]"),
        "{msg}"
    );
    let err = IlqlConfig::new().with_gamma(1.5).validate().unwrap_err();
    assert!(matches!(err, Error::InvalidConfig { field: "gamma", .. }));
    assert!(IlqlConfig::new().with_beta(-1.0).validate().is_err());
    assert!(IlqlConfig::new().with_tau(0.0).validate().is_err());
}

#[test]
fn padding_junk_does_not_leak() {
    // §5.10 plus a padded fourth action whose heads, value and reward are not finite
    let s = section_5_10();
    let pad_row = |t: &Tensor, v: f64| {
        let junk = Tensor::full([1, 1, 3], v, (Kind::Double, Device::Cpu));
        Tensor::cat(&[t.shallow_clone(), junk], 1)
    };
    let q1 = pad_row(&s.q1, f64::NAN);
    let tq1 = pad_row(&s.q1.f_add_scalar(0.05).unwrap(), f64::INFINITY);
    let vs = Tensor::from_slice(&[0.2f64, 0.35, 0.6, 0.0, f64::INFINITY]).view([1, 5, 1]);
    let out = ilql_loss(
        &IlqlInputs {
            logits: &s.logits,
            qs: &[q1],
            target_qs: &[tq1],
            vs: &vs,
            input_ids: &s.input_ids,
            actions_ixs: &ids(&[0, 1, 2, 0]),
            continues: &ids(&[1, 1, 1, 0, 0]),
            rewards: &Tensor::from_slice(&[0.0f64, 0.0, 1.0, f64::NAN]).view([1, 4]),
        },
        &IlqlConfig::new().with_two_qs(false).with_beta(2.0),
    )
    .unwrap();
    let clean = {
        let t = section_5_10();
        ilql_loss(
            &IlqlInputs {
                logits: &t.logits,
                qs: &[t.q1.shallow_clone()],
                target_qs: &[t.q1.f_add_scalar(0.05).unwrap()],
                vs: &t.vs,
                input_ids: &t.input_ids,
                actions_ixs: &t.actions_ixs,
                continues: &t.dones,
                rewards: &t.rewards,
            },
            &IlqlConfig::new().with_two_qs(false).with_beta(2.0),
        )
        .unwrap()
    };
    for (name, got) in out.loss_terms().into_iter().chain(out.metrics()) {
        let want = clean
            .loss_terms()
            .into_iter()
            .chain(clean.metrics())
            .find(|(n, _)| *n == name)
            .unwrap()
            .1
            .double_value(&[]);
        assert_scalar(got, want, 1e-12, name);
    }
}

// ------------------------------------------------------------------ 4. the loss module

fn tiny_model(vs: &VarStore, two_qs: bool) -> CausalLmWithIlqlHeads {
    tch::manual_seed(7);
    let cfg = Gpt2Config::new(12)
        .with_n_layer(2)
        .with_n_embd(8)
        .with_n_head(2)
        .with_n_positions(16);
    let model = Gpt2Model::new(&vs.root(), &cfg).unwrap();
    CausalLmWithIlqlHeads::from_model(&vs.root(), model, two_qs, 0.001).unwrap()
}

fn tiny_data() -> IlqlDataset {
    IlqlDataset::from_token_rows(
        &[
            IlqlTokenSample::new(vec![1, 2, 3], vec![4, 5], 1.0),
            IlqlTokenSample::dialogue(vec![vec![6], vec![7, 8, 9], vec![10], vec![11]], -0.5),
            IlqlTokenSample::new(vec![3], vec![2], 0.25),
        ],
        &IlqlDataConfig::new(),
    )
    .unwrap()
}

#[test]
fn loss_module_equals_the_functional_core_on_its_forward() {
    for two_qs in [true, false] {
        let vs = VarStore::new(Device::Cpu);
        let model = tiny_model(&vs, two_qs);
        let data = tiny_data();
        let batch = data.batch(&[0, 1, 2]).unwrap();
        let cfg = IlqlConfig::new().with_two_qs(two_qs).with_beta(0.5);
        let loss = IlqlLoss::new(&model).with_config(cfg.clone()).unwrap();
        let out = loss.forward(&batch).unwrap();

        let k = IlqlKeys::default();
        let g = |key: &NestedKey| batch.get_or_err(key).unwrap();
        let fwd = model
            .forward(
                &LmInput::new(g(&k.tokens)).with_attention_mask(g(&k.attention_mask)),
                Some(g(&k.states_ixs)),
                Some(g(&k.actions_ixs)),
            )
            .unwrap();
        let core = ilql_loss(
            &IlqlInputs {
                logits: &fwd.logits,
                qs: &fwd.heads.qs,
                target_qs: &fwd.heads.target_qs,
                vs: &fwd.heads.vs,
                input_ids: g(&k.tokens),
                actions_ixs: g(&k.actions_ixs),
                continues: g(&k.continues),
                rewards: g(&k.action_rewards),
            },
            &cfg,
        )
        .unwrap();
        for ((n, a), (_, b)) in out
            .loss_terms()
            .into_iter()
            .chain(out.metrics())
            .zip(core.loss_terms().into_iter().chain(core.metrics()))
        {
            assert_eq!(
                a.double_value(&[]),
                b.double_value(&[]),
                "{n} (two_qs {two_qs})"
            );
        }
        // 2 + 4 + 1 real actions
        assert_eq!(out.n_actions.double_value(&[]), 7.0);
        assert!(out.loss.double_value(&[]).is_finite());
        // the trait seam agrees with the model's forward
        let boxed: Box<&CausalLmWithIlqlHeads> = Box::new(&model); // Box<T> and &T impls
        let seam = boxed
            .ilql_forward(
                g(&k.tokens),
                g(&k.attention_mask),
                g(&k.actions_ixs),
                g(&k.states_ixs),
            )
            .unwrap();
        assert!(seam.logits.equal(&fwd.logits));
        // backward reaches the trainable heads but not the frozen targets
        out.total_loss().unwrap().backward();
        let heads = model.heads();
        assert!(heads.q_heads()[0].parameters()[0].grad().defined());
        assert!(heads.v_head().parameters()[0].grad().defined());
        assert!(!heads.target_q_heads()[0].parameters()[0].grad().defined());
    }
}

#[test]
fn loss_module_keys_are_settable() {
    let vs = VarStore::new(Device::Cpu);
    let model = tiny_model(&vs, true);
    let data = tiny_data();
    let mut loss = IlqlLoss::new(&model);
    assert_eq!(loss.in_keys().len(), 6);
    assert_eq!(
        IlqlKeys::NAMES,
        &[
            "tokens",
            "attention_mask",
            "actions_ixs",
            "states_ixs",
            "continues",
            "action_rewards"
        ]
    );
    let base = loss.forward(&data.batch(&[0, 1]).unwrap()).unwrap();

    loss.set_keys(&[
        ("continues", Some("not_done".into())),
        ("action_rewards", Some(("ilql", "r").into())),
        ("tokens", Some("ids".into())),
    ])
    .unwrap();
    assert!(loss.in_keys().contains(&NestedKey::from(("ilql", "r"))));
    // the default batch no longer fits, and the error names the missing key
    let err = loss.forward(&data.batch(&[0, 1]).unwrap()).unwrap_err();
    assert!(err.to_string().contains("ids"), "{err}");
    // a dataset writing under the same keys does
    let renamed = data.clone().with_keys(loss.tensor_keys().clone());
    let out = loss.forward(&renamed.batch(&[0, 1]).unwrap()).unwrap();
    assert_eq!(out.loss.double_value(&[]), base.loss.double_value(&[]));
    // unknown names are refused; None resets
    assert!(loss.set_keys(&[("reward", None)]).is_err());
    loss.set_keys(&[
        ("continues", None),
        ("action_rewards", None),
        ("tokens", None),
    ])
    .unwrap();
    assert_eq!(loss.tensor_keys(), &IlqlKeys::default());
    // a config with the wrong number of heads is an error at forward
    let one = IlqlLoss::new(&model)
        .with_config(IlqlConfig::new().with_two_qs(false))
        .unwrap();
    let msg = one
        .forward(&data.batch(&[0]).unwrap())
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("1 Q head") && msg.contains("2 tensors"),
        "{msg}"
    );
    assert!(IlqlLoss::new(&model)
        .with_config(IlqlConfig::new().with_tau(2.0))
        .is_err());
}
