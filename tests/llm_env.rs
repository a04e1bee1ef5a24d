//! The token-level LLM environment (`torchrl::envs::llm`): TorchRL's tensordict layout (left-
//! padded prompts, right-padded responses, full = cat(prompt, response), masks), the reward at
//! the last real response token, done / terminated / truncated, what scorers see, the reward
//! model scorer, the prompt order, the errors, and the specs with a generating policy.
//!
//! Expected values are derived by hand in the comments next to them.

use std::sync::{Arc, Mutex};

use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};
use torchrl::envs::llm::{
    BatchScorer, GenerationPolicy, RewardModelScorer, ScoreInput, Scorer, TextScorer, TokenEnv,
    TokenEnvConfig, TokenScorer,
};
use torchrl::envs::{check_env_specs, EnvBase, RolloutConfig};
use torchrl::modules::llm::nn::with_init_seed;
use torchrl::modules::llm::{
    token_log_probs, ByteTokenizer, CausalLm, CausalLmWithScoreHead, GenerationConfig, Gpt2Config,
    Gpt2Model, LmInput,
};
use torchrl::{Error, TensorDict};

const VOCAB: i64 = 20;
const EOS: i64 = 19;
const PAD: i64 = 18;

fn model_cfg() -> Gpt2Config {
    Gpt2Config::new(VOCAB)
        .with_n_layer(2)
        .with_n_embd(16)
        .with_n_head(2)
        .with_n_positions(16)
}

fn env_cfg(batch: i64) -> TokenEnvConfig {
    TokenEnvConfig::new(VOCAB, 16)
        .with_batch_size(batch)
        .with_max_new_tokens(4)
        .with_eos_token_id(EOS)
        .with_pad_token_id(PAD)
}

fn ints(t: &Tensor) -> Vec<i64> {
    Vec::<i64>::try_from(t.reshape([-1]).to_kind(Kind::Int64)).unwrap()
}

fn floats(t: &Tensor) -> Vec<f32> {
    Vec::<f32>::try_from(t.reshape([-1]).to_kind(Kind::Float)).unwrap()
}

fn bools(t: &Tensor) -> Vec<bool> {
    Vec::<bool>::try_from(t.reshape([-1])).unwrap()
}

fn zero_scorer() -> Box<dyn Scorer> {
    Box::new(TokenScorer::new(|_: &[i64], _: &[i64]| 0.0))
}

/// Four prompts of widths 3, 1, 2, 1: padded width 3.
fn four_prompts() -> Vec<Vec<i64>> {
    vec![vec![1, 2, 3], vec![4], vec![5, 6], vec![7]]
}

fn response(rows: &[[i64; 4]]) -> Tensor {
    let flat: Vec<i64> = rows.iter().flatten().copied().collect();
    Tensor::from_slice(&flat).view([rows.len() as i64, 4])
}

#[test]
fn reset_left_pads_the_prompts_and_writes_their_mask() {
    let mut env = TokenEnv::new(env_cfg(4), four_prompts(), zero_scorer()).unwrap();
    assert_eq!(
        env.prompt_width(),
        None,
        "no fixed width: each reset pads to its longest"
    );
    let td = env.reset(None).unwrap();
    assert_eq!(td.batch_size(), &[4]);
    let prompt = td.get(("tokens", "prompt")).unwrap();
    let mask = td.get(("masks", "prompt_attention_mask")).unwrap();
    assert_eq!(prompt.size(), vec![4, 3]);
    assert_eq!((prompt.kind(), mask.kind()), (Kind::Int64, Kind::Int64));
    // pad 18 on the left of the short prompts
    assert_eq!(
        ints(prompt),
        vec![1, 2, 3, PAD, PAD, 4, PAD, 5, 6, PAD, PAD, 7]
    );
    assert_eq!(ints(mask), vec![1, 1, 1, 0, 0, 1, 0, 1, 1, 0, 0, 1]);
    assert_eq!(floats(td.get("score").unwrap()), vec![0.0; 4]);
    assert_eq!(bools(td.get("done").unwrap()), vec![false; 4]);
}

/// Scores `100 · prompt length + sum(response)`, and records what it was given.
type Seen = Arc<Mutex<Vec<(Vec<i64>, Vec<i64>)>>>;

fn recording_scorer(seen: Seen) -> Box<dyn Scorer> {
    Box::new(TokenScorer::new(move |p: &[i64], r: &[i64]| {
        seen.lock().unwrap().push((p.to_vec(), r.to_vec()));
        100.0 * p.len() as f64 + r.iter().sum::<i64>() as f64
    }))
}

#[test]
fn step_puts_the_score_at_the_last_real_response_token() {
    let seen: Seen = Arc::default();
    let mut env =
        TokenEnv::new(env_cfg(4), four_prompts(), recording_scorer(seen.clone())).unwrap();
    let td = env.reset(None).unwrap();
    let resp = response(&[
        [7, EOS, PAD, PAD],  // EOS at 1: length 2, terminated
        [8, 9, 10, 11],      // no EOS, full width: length 4, truncated
        [12, PAD, PAD, PAD], // no EOS, trailing pads: length 1, truncated
        [13, EOS, 14, 15],   // tokens after the first EOS are padding: length 2
    ]);
    let td = env
        .step(td.with(("tokens", "response"), resp).unwrap())
        .unwrap();
    let reward = td.get(("next", "reward")).unwrap();
    assert_eq!(reward.size(), vec![4, 7, 1]);
    assert_eq!(reward.kind(), Kind::Float);
    // index = P + L - 1 with P = 3: rows at 4, 6, 3, 4; scores
    // 300 + 7 = 307, 100 + 38 = 138, 200 + 12 = 212, 100 + 13 = 113
    let mut expected = vec![0.0f32; 28];
    expected[4] = 307.0;
    expected[7 + 6] = 138.0;
    expected[14 + 3] = 212.0;
    expected[21 + 4] = 113.0;
    assert_eq!(floats(reward), expected);
    assert_eq!(
        floats(td.get(("next", "score")).unwrap()),
        vec![307.0, 138.0, 212.0, 113.0]
    );
    assert_eq!(bools(td.get(("next", "done")).unwrap()), vec![true; 4]);
    assert_eq!(
        bools(td.get(("next", "terminated")).unwrap()),
        vec![true, false, false, true]
    );
    assert_eq!(
        bools(td.get(("next", "truncated")).unwrap()),
        vec![false, true, true, false]
    );
    for k in ["done", "terminated", "truncated"] {
        let t = td.get(("next", k)).unwrap();
        assert_eq!((t.size(), t.kind()), (vec![4, 1], Kind::Bool), "{k}");
    }
    // the scorer saw the unpadded prompts and the responses without pad and EOS
    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        seen,
        vec![
            (vec![1, 2, 3], vec![7]),
            (vec![4], vec![8, 9, 10, 11]),
            (vec![5, 6], vec![12]),
            (vec![7], vec![13]),
        ]
    );
}

/// Full tokens, full mask, ended-with-EOS flags and batch size, as a batch scorer saw them.
type BatchSeen = (Vec<i64>, Vec<i64>, Vec<bool>, i64);

#[test]
fn with_pad_equal_to_eos_the_first_eos_ends_the_response() {
    // trlX's default setup: no pad id, so pad = EOS
    let cfg = TokenEnvConfig::new(VOCAB, 16)
        .with_batch_size(2)
        .with_max_new_tokens(4)
        .with_eos_token_id(EOS);
    assert_eq!(cfg.pad_id(), EOS);
    let seen: Seen = Arc::default();
    let mut env = TokenEnv::new(
        cfg,
        vec![vec![1, 2], vec![3]],
        recording_scorer(seen.clone()),
    )
    .unwrap();
    let td = env.reset(None).unwrap();
    assert_eq!(
        ints(td.get(("tokens", "prompt")).unwrap()),
        vec![1, 2, EOS, 3]
    );
    let resp = response(&[[7, EOS, EOS, EOS], [8, 9, 10, 11]]);
    let td = env
        .step(td.with(("tokens", "response"), resp).unwrap())
        .unwrap();
    // lengths 2 and 4: scores 200 + 7 at 2 + 2 - 1 = 3, and 100 + 38 at 2 + 4 - 1 = 5
    assert_eq!(
        floats(td.get(("next", "reward")).unwrap()),
        vec![0.0, 0.0, 0.0, 207.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 138.0]
    );
    assert_eq!(
        bools(td.get(("next", "terminated")).unwrap()),
        vec![true, false]
    );
    assert_eq!(
        seen.lock().unwrap().clone(),
        vec![(vec![1, 2], vec![7]), (vec![3], vec![8, 9, 10, 11])]
    );
}

#[test]
fn config_reads_from_json_with_defaults() {
    let cfg: TokenEnvConfig =
        serde_json::from_str(r#"{"vocab_size": 20, "n_positions": 16, "eos_token_id": 19}"#)
            .unwrap();
    assert_eq!(cfg, TokenEnvConfig::new(20, 16).with_eos_token_id(19));
    let g = env_cfg(1).generation_config();
    assert_eq!(
        (g.max_new_tokens, g.eos_token_id, g.pad_token_id),
        (4, Some(EOS), Some(PAD))
    );
    assert!(g.do_sample);
}

#[test]
fn batch_scorer_sees_the_full_tokens_and_mask() {
    let seen: Arc<Mutex<Option<BatchSeen>>> = Arc::default();
    let s2 = seen.clone();
    let scorer = BatchScorer::new(move |input: &ScoreInput<'_>| {
        *s2.lock().unwrap() = Some((
            ints(input.tokens),
            ints(input.attention_mask),
            input.ended_with_eos.to_vec(),
            input.batch_size,
        ));
        Ok(Tensor::from_slice(&[1.5f64, -2.0]))
    });
    let mut env = TokenEnv::new(env_cfg(2), vec![vec![1, 2], vec![3]], Box::new(scorer)).unwrap();
    let td = env.reset(None).unwrap();
    let resp = response(&[[4, EOS, PAD, PAD], [5, 6, 7, 8]]);
    let td = env
        .step(td.with(("tokens", "response"), resp).unwrap())
        .unwrap();
    let (tokens, mask, ended, b) = seen.lock().unwrap().clone().unwrap();
    // full = cat(prompt, response), mask = cat(prompt mask, response mask)
    assert_eq!(tokens, vec![1, 2, 4, EOS, PAD, PAD, PAD, 3, 5, 6, 7, 8]);
    assert_eq!(mask, vec![1, 1, 1, 1, 0, 0, 0, 1, 1, 1, 1, 1]);
    assert_eq!(ended, vec![true, false]);
    assert_eq!(b, 2);
    // a float64 score is cast to float32; positions 2 + 2 - 1 = 3 and 2 + 4 - 1 = 5
    let reward = td.get(("next", "reward")).unwrap();
    assert_eq!(
        floats(reward),
        vec![0.0, 0.0, 0.0, 1.5, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -2.0]
    );
}

#[test]
fn text_scorer_gets_the_decoded_prompt_and_response() {
    let tok = ByteTokenizer::new();
    let seen: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
    let s2 = seen.clone();
    let scorer = TextScorer::new(ByteTokenizer::new(), move |p: &str, r: &str| {
        s2.lock().unwrap().push((p.to_string(), r.to_string()));
        r.len() as f64
    });
    // ByteTokenizer: 259 ids, EOS 256, PAD 257
    let cfg = TokenEnvConfig::new(259, 32)
        .with_batch_size(2)
        .with_max_new_tokens(4)
        .with_eos_token_id(256)
        .with_pad_token_id(257);
    let mut env = TokenEnv::from_text(cfg, &tok, &["hi", "abc"], Box::new(scorer)).unwrap();
    let td = env.reset(None).unwrap();
    assert_eq!(
        ints(td.get(("tokens", "prompt")).unwrap()),
        vec![257, 104, 105, 97, 98, 99]
    );
    // "yo" + EOS + PAD, and "xyz!" (no EOS)
    let resp = Tensor::from_slice(&[121i64, 111, 256, 257, 120, 121, 122, 33]).view([2, 4]);
    let td = env
        .step(td.with(("tokens", "response"), resp).unwrap())
        .unwrap();
    assert_eq!(
        seen.lock().unwrap().clone(),
        vec![
            ("hi".to_string(), "yo".to_string()),
            ("abc".to_string(), "xyz!".to_string())
        ]
    );
    assert_eq!(floats(td.get(("next", "score")).unwrap()), vec![2.0, 4.0]);
}

/// A score model whose initial weights are those of `seed` (the same weights for the same
/// seed, whatever the tests beside it draw).
fn score_model(seed: u64) -> (VarStore, CausalLmWithScoreHead) {
    let vs = VarStore::new(Device::Cpu);
    let m = with_init_seed(seed, || {
        CausalLmWithScoreHead::new(&vs.root(), &model_cfg())
    });
    (vs, m.unwrap())
}

#[test]
fn reward_model_scorer_equals_the_score_model_run_by_hand() {
    let resp = response(&[[4, 5, EOS, PAD], [6, 7, 8, 9]]);
    // by hand: full = cat(prompt, response) with the left-padded prompt [PAD, 3]
    let full = Tensor::from_slice(&[1i64, 2, 4, 5, EOS, PAD, PAD, 3, 6, 7, 8, 9]).view([2, 6]);
    let mask = Tensor::from_slice(&[1i64, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 1]).view([2, 6]);
    let (_vs, by_hand) = score_model(3);
    let expected = tch::no_grad(|| {
        by_hand
            .forward(&LmInput::new(&full).with_attention_mask(&mask))
            .unwrap()
    });
    let e = floats(&expected);

    // the same weights: the same seed builds them (with_init_seed: whatever the tests beside
    // this one draw meanwhile)
    let (_vs2, model) = score_model(3);
    let scorer = RewardModelScorer::new(model);
    let mut env = TokenEnv::new(env_cfg(2), vec![vec![1, 2], vec![3]], Box::new(scorer)).unwrap();
    let td = env.reset(None).unwrap();
    let td = env
        .step(
            td.with(("tokens", "response"), resp.shallow_clone())
                .unwrap(),
        )
        .unwrap();
    let got = floats(td.get(("next", "score")).unwrap());
    for (g, x) in got.iter().zip(&e) {
        assert!((g - x).abs() < 1e-6, "{got:?} vs {e:?}");
    }
    // the reward holds it at 2 + 3 - 1 = 4 (row 0) and 2 + 4 - 1 = 5 (row 1)
    let reward = floats(td.get(("next", "reward")).unwrap());
    assert_eq!(reward[4], got[0]);
    assert_eq!(reward[6 + 5], got[1]);
    assert!(!td.get(("next", "score")).unwrap().requires_grad());

    // clipped to [-c, c] with c below both magnitudes: ±c with the signs of the raw scores
    let c = e.iter().map(|x| x.abs()).fold(f32::INFINITY, f32::min) as f64 / 2.0;
    let (_vs3, model) = score_model(3);
    let scorer = RewardModelScorer::new(model).with_clip(c).unwrap();
    let mut env = TokenEnv::new(env_cfg(2), vec![vec![1, 2], vec![3]], Box::new(scorer)).unwrap();
    let td = env.reset(None).unwrap();
    let td = env
        .step(td.with(("tokens", "response"), resp).unwrap())
        .unwrap();
    let clipped = floats(td.get(("next", "score")).unwrap());
    for (g, x) in clipped.iter().zip(&e) {
        assert!((g - (c as f32) * x.signum()).abs() < 1e-6, "{clipped:?}");
    }
    let (_vs4, model) = score_model(3);
    assert!(RewardModelScorer::new(model).with_clip(0.0).is_err());
}

fn first_tokens(env: &mut TokenEnv, resets: usize) -> Vec<Vec<i64>> {
    (0..resets)
        .map(|_| {
            let td = env.reset(None).unwrap();
            ints(td.get(("tokens", "prompt")).unwrap())
        })
        .collect()
}

#[test]
fn prompts_are_served_in_order_and_cycle() {
    let prompts: Vec<Vec<i64>> = (1..=5).map(|i| vec![i]).collect();
    // width 2 (the source's longest is 1) leaves room for the explicit prompts below
    let cfg = env_cfg(2).with_prompt_width(2);
    let mut env = TokenEnv::new(cfg, prompts, zero_scorer()).unwrap();
    // 5 prompts, 2 per reset: [1,2], [3,4], [5,1], [2,3]
    assert_eq!(
        first_tokens(&mut env, 4),
        vec![
            vec![PAD, 1, PAD, 2],
            vec![PAD, 3, PAD, 4],
            vec![PAD, 5, PAD, 1],
            vec![PAD, 2, PAD, 3]
        ]
    );
    // explicit prompts do not advance the source
    let td = env.reset_with_prompts(&[vec![9, 9], vec![8]]).unwrap();
    assert_eq!(
        ints(td.get(("tokens", "prompt")).unwrap()),
        vec![9, 9, PAD, 8]
    );
    assert_eq!(first_tokens(&mut env, 1), vec![vec![PAD, 4, PAD, 5]]);
}

#[test]
fn num_generations_serves_each_prompt_in_consecutive_rows() {
    let prompts: Vec<Vec<i64>> = (1..=3).map(|i| vec![i]).collect();
    let cfg = env_cfg(4).with_num_generations(2).with_prompt_width(2);
    assert_eq!(cfg.prompts_per_reset(), 2);
    let mut env = TokenEnv::new(cfg, prompts, zero_scorer()).unwrap();
    // 3 prompts, 2 distinct per reset, each twice: [1,1,2,2], [3,3,1,1]
    assert_eq!(
        first_tokens(&mut env, 2),
        vec![
            vec![PAD, 1, PAD, 1, PAD, 2, PAD, 2],
            vec![PAD, 3, PAD, 3, PAD, 1, PAD, 1]
        ]
    );
    // explicit prompts: batch / G of them, each repeated
    let td = env.reset_with_prompts(&[vec![9, 9], vec![8]]).unwrap();
    assert_eq!(
        ints(td.get(("tokens", "prompt")).unwrap()),
        vec![9, 9, 9, 9, PAD, 8, PAD, 8]
    );
    let err = env
        .reset_with_prompts(&vec![vec![9]; 4])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("2 prompts") && err.contains("num_generations 2"),
        "{err}"
    );
    // G must divide the batch
    let err = TokenEnv::new(
        env_cfg(4).with_num_generations(3),
        vec![vec![1]],
        zero_scorer(),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("num_generations"), "{err}");
    // a config file may omit it (default 1)
    let cfg: TokenEnvConfig =
        serde_json::from_str(r#"{"vocab_size": 10, "n_positions": 8}"#).unwrap();
    assert_eq!(cfg.num_generations, 1);
}

#[test]
fn prompt_state_round_trips_and_a_bad_one_changes_nothing() {
    let prompts: Vec<Vec<i64>> = (1..=5).map(|i| vec![i]).collect();
    let cfg = env_cfg(2).with_shuffle(true).with_seed(3);
    let mut a = TokenEnv::new(cfg.clone(), prompts.clone(), zero_scorer()).unwrap();
    first_tokens(&mut a, 3); // mid-pass, second permutation drawn
    let saved = a.prompt_state();
    let json = serde_json::to_string(&saved).unwrap();
    let want = first_tokens(&mut a, 4);
    let mut b = TokenEnv::new(cfg, prompts, zero_scorer()).unwrap();
    b.set_prompt_state(serde_json::from_str(&json).unwrap())
        .unwrap();
    assert_eq!(first_tokens(&mut b, 4), want);
    let before = b.prompt_state();
    let mut bad = before.clone();
    bad.order = vec![0, 0, 1, 2, 3];
    let err = b.set_prompt_state(bad).unwrap_err().to_string();
    assert!(err.contains("5 prompts"), "{err}");
    assert_eq!(b.prompt_state(), before);
}

#[test]
fn shuffled_prompts_are_seeded_permutations_per_pass() {
    let prompts: Vec<Vec<i64>> = (1..=5).map(|i| vec![i]).collect();
    let make = |seed: u64| {
        let cfg = env_cfg(5).with_shuffle(true).with_seed(seed);
        TokenEnv::new(cfg, prompts.clone(), zero_scorer()).unwrap()
    };
    let a = first_tokens(&mut make(7), 6);
    let b = first_tokens(&mut make(7), 6);
    assert_eq!(a, b, "same seed, same order");
    for pass in &a {
        let mut sorted = pass.clone();
        sorted.sort();
        assert_eq!(
            sorted,
            vec![1, 2, 3, 4, 5],
            "each pass serves every prompt once"
        );
    }
    assert!(
        a.iter().any(|p| p != &vec![1, 2, 3, 4, 5]),
        "six passes in the identity order (1/120^6 for a shuffle)"
    );
    let c = first_tokens(&mut make(8), 6);
    assert_ne!(a, c, "another seed, another order");
    // set_seed restarts the order of that seed
    let mut env = make(8);
    env.set_seed(7).unwrap();
    assert_eq!(first_tokens(&mut env, 6), a);
}

fn tiny_model(seed: u64) -> (VarStore, Gpt2Model) {
    let vs = VarStore::new(Device::Cpu);
    let m = with_init_seed(seed, || Gpt2Model::new(&vs.root(), &model_cfg()));
    (vs, m.unwrap())
}

#[test]
fn generation_policy_writes_the_llm_layout() {
    let (_vs, model) = tiny_model(5);
    let cfg = env_cfg(4);
    let mut policy = GenerationPolicy::new(&model, cfg.generation_config(), 11).unwrap();
    let mut env = TokenEnv::new(cfg, four_prompts(), zero_scorer()).unwrap();
    let td = policy.call(env.reset(None).unwrap()).unwrap();
    let prompt = td.get(("tokens", "prompt")).unwrap();
    let pmask = td.get(("masks", "prompt_attention_mask")).unwrap();
    let resp = td.get(("tokens", "response")).unwrap();
    let full = td.get(("tokens", "full")).unwrap();
    let att = td.get(("masks", "all_attention_mask")).unwrap();
    let asst = td.get(("masks", "all_assistant_mask")).unwrap();
    let lp_full = td.get(("log_probs", "full")).unwrap();
    let lp_resp = td.get(("log_probs", "response")).unwrap();
    assert_eq!(resp.size(), vec![4, 4], "padded to max_new_tokens");
    for t in [full, att, asst, lp_full] {
        assert_eq!(t.size(), vec![4, 7]);
    }
    for t in [resp, full, att, asst] {
        assert_eq!(t.kind(), Kind::Int64);
    }
    assert_eq!((lp_full.kind(), lp_resp.kind()), (Kind::Float, Kind::Float));
    assert!(full.equal(&Tensor::cat(&[prompt, resp], 1)));
    let rmask = asst.narrow(1, 3, 4);
    assert!(att.equal(&Tensor::cat(&[pmask, &rmask], 1)));
    assert_eq!(ints(&asst.narrow(1, 0, 3)), vec![0; 12]);
    // right padding: the response mask is a prefix of ones, the rest is pad
    let (r, m) = (ints(resp), ints(&rmask));
    for row in 0..4 {
        let mrow = &m[row * 4..row * 4 + 4];
        let len = mrow.iter().sum::<i64>() as usize;
        assert!(mrow[..len].iter().all(|x| *x == 1), "{mrow:?}");
        assert!(r[row * 4 + len..row * 4 + 4].iter().all(|t| *t == PAD));
        // the mask ends at the first EOS (included), or runs the full width
        let first_eos = r[row * 4..row * 4 + 4].iter().position(|t| *t == EOS);
        assert_eq!(len, first_eos.map_or(4, |e| e + 1));
    }
    // log-probs: the response's, aligned with the full tokens, 0 off the assistant mask
    assert!(lp_full.narrow(1, 3, 4).equal(lp_resp));
    assert_eq!(floats(&lp_full.narrow(1, 0, 3)), vec![0.0; 12]);
    // and they are the model's: a full forward's token_log_probs on the assistant tokens
    let logits = tch::no_grad(|| {
        model
            .forward(&LmInput::new(full).with_attention_mask(att), None)
            .unwrap()
            .logits()
            .unwrap()
    });
    let by_hand = token_log_probs(&logits, full, Some(att)).unwrap() * asst.to_kind(Kind::Float);
    let diff = (&by_hand - lp_full).abs().max().double_value(&[]);
    assert!(diff < 1e-4, "max diff {diff}");

    // stepping the policy's output: its full tokens and masks pass the env's checks
    let td = env.step(td).unwrap();
    assert_eq!(td.get(("next", "reward")).unwrap().size(), vec![4, 7, 1]);
}

#[test]
fn reward_index_follows_the_policy_response_length() {
    // 8 rows of up to 12 tokens (3 + 12 <= 16 positions): with this seed some rows end with
    // EOS and some hit the limit, both asserted below
    let (b, r, t) = (8usize, 12usize, 15usize);
    let (_vs, model) = tiny_model(5);
    let cfg = env_cfg(b as i64).with_max_new_tokens(r as i64);
    let mut policy = GenerationPolicy::new(&model, cfg.generation_config(), 11).unwrap();
    // score 1 + response length, never 0, so the reward's one nonzero slot is visible
    let scorer = TokenScorer::new(|_: &[i64], r: &[i64]| 1.0 + r.len() as f64);
    let mut env = TokenEnv::new(cfg, four_prompts(), Box::new(scorer)).unwrap();
    let td = policy.call(env.reset(None).unwrap()).unwrap();
    let td = env.step(td).unwrap();
    let asst = ints(td.get(("masks", "all_assistant_mask")).unwrap());
    let resp = ints(td.get(("tokens", "response")).unwrap());
    let reward = floats(td.get(("next", "reward")).unwrap());
    let term = bools(td.get(("next", "terminated")).unwrap());
    let trunc = bools(td.get(("next", "truncated")).unwrap());
    assert!(
        term.iter().any(|x| *x) && trunc.iter().any(|x| *x),
        "{term:?}"
    );
    for row in 0..b {
        let len = asst[row * t..(row + 1) * t].iter().sum::<i64>() as usize;
        let has_eos = resp[row * r..row * r + len].contains(&EOS);
        assert_eq!(term[row], has_eos);
        assert_eq!(trunc[row], !has_eos);
        // without EOS the response ran to the limit
        assert!(has_eos || len == r);
        // score: 1 + (len - 1 if EOS else len); at index 3 + len - 1
        let score = 1.0 + (len - usize::from(has_eos)) as f32;
        let mut expected = vec![0.0f32; t];
        expected[3 + len - 1] = score;
        assert_eq!(
            &reward[row * t..(row + 1) * t],
            expected.as_slice(),
            "row {row}"
        );
    }
}

#[test]
fn check_env_specs_passes_and_a_policy_rollout_stays_in_the_specs() {
    let mut env = TokenEnv::new(env_cfg(4), four_prompts(), zero_scorer()).unwrap();
    check_env_specs(&mut env, Some(0)).unwrap();

    let (_vs, model) = tiny_model(6);
    let cfg = env_cfg(4);
    let mut policy = GenerationPolicy::new(&model, cfg.generation_config(), 1).unwrap();
    let traj = env
        .rollout(
            3,
            Some(&mut |td| policy.call(td)),
            &RolloutConfig::no_break(),
        )
        .unwrap();
    assert_eq!(traj.batch_size(), &[4, 3]);
    let specs = env.specs().clone();
    for t in 0..3 {
        let step = traj
            .index(&[torchrl::BatchIndex::full(), torchrl::BatchIndex::Int(t)])
            .unwrap();
        specs.observation.check(&step).unwrap();
        specs.action.check(&step).unwrap();
        let next = step.get_dict("next").unwrap();
        specs.reward.check(next).unwrap();
        specs.done.check(next).unwrap();
        specs.observation.check(next).unwrap();
    }
    // one episode per step: the three steps took prompts 0-3, then 0-3 again (4 prompts)
    let prompts = traj.get(("tokens", "prompt")).unwrap();
    assert!(prompts.select(1, 0).equal(&prompts.select(1, 1)));
}

/// Records the full width `P + R` of every batch it scores.
fn width_scorer(widths: Arc<Mutex<Vec<i64>>>) -> Box<dyn Scorer> {
    Box::new(BatchScorer::new(move |input: &ScoreInput<'_>| {
        widths.lock().unwrap().push(input.tokens.size()[1]);
        Ok(Tensor::zeros(
            [input.batch_size],
            (Kind::Float, Device::Cpu),
        ))
    }))
}

/// Prompts of lengths 1, 1, then 3, 1, then 2, 2 (batch 2): padded widths 1, 3, 2.
fn uneven_prompts() -> Vec<Vec<i64>> {
    vec![
        vec![1],
        vec![2],
        vec![3, 4, 5],
        vec![6],
        vec![7, 8],
        vec![9, 10],
    ]
}

#[test]
fn specs_are_any_length_as_torchrl() {
    let env = TokenEnv::new(env_cfg(4), four_prompts(), zero_scorer()).unwrap();
    let specs = env.specs();
    let shape = |s: Option<&torchrl::specs::TensorSpec>| s.unwrap().shape().to_vec();
    assert_eq!(
        shape(specs.observation.get(("tokens", "prompt"))),
        vec![4, -1]
    );
    assert_eq!(
        shape(specs.observation.get(("masks", "prompt_attention_mask"))),
        vec![4, -1]
    );
    assert_eq!(shape(specs.action.get(("tokens", "response"))), vec![4, -1]);
    assert_eq!(shape(specs.reward.get("reward")), vec![4, -1, 1]);
    assert_eq!(shape(specs.observation.get("score")), vec![4]);
    assert_eq!(shape(specs.done.get("done")), vec![4, 1]);
    assert!(specs.reward.get("reward").unwrap().is_dynamic());
    // a fixed prompt width changes the data, not the specs (TorchRL's -1 either way)
    let fixed = TokenEnv::new(
        env_cfg(4).with_prompt_width(5),
        four_prompts(),
        zero_scorer(),
    )
    .unwrap();
    assert_eq!(fixed.prompt_width(), Some(5));
    assert_eq!(fixed.specs(), env.specs());
}

#[test]
fn each_reset_pads_to_its_own_longest_prompt() {
    let widths = Arc::default();
    let mut env = TokenEnv::new(
        env_cfg(2),
        uneven_prompts(),
        width_scorer(Arc::clone(&widths)),
    )
    .unwrap();
    let specs = env.specs().clone();
    let mut seen = Vec::new();
    for (p, r) in [(1, 4), (3, 2), (2, 1)] {
        let td = env.reset(None).unwrap();
        let prompt = td.get(("tokens", "prompt")).unwrap().shallow_clone();
        assert_eq!(prompt.size(), vec![2, p]);
        specs.observation.check(&td).unwrap();
        let resp = Tensor::full([2, r], 11, (Kind::Int64, Device::Cpu));
        let td = env
            .step(td.with(("tokens", "response"), resp).unwrap())
            .unwrap();
        assert_eq!(
            td.get(("next", "reward")).unwrap().size(),
            vec![2, p + r, 1]
        );
        specs.reward.check(td.get_dict("next").unwrap()).unwrap();
        specs.action.check(&td).unwrap();
        seen.push(ints(&prompt));
    }
    // left-padded per batch: [1], [2] / [3, 4, 5], [PAD, PAD, 6] / [7, 8], [9, 10]
    assert_eq!(
        seen,
        vec![vec![1, 2], vec![3, 4, 5, PAD, PAD, 6], vec![7, 8, 9, 10]]
    );
    assert_eq!(widths.lock().unwrap().clone(), vec![5, 5, 3]);
}

#[test]
fn a_partial_reset_pads_to_the_kept_rows_width() {
    // batches [1, 2] / [3] (width 2), then [4] / [5] (width 1), then [6, 7, 8] / [9]
    let prompts = vec![
        vec![1, 2],
        vec![3],
        vec![4],
        vec![5],
        vec![6, 7, 8],
        vec![9],
    ];
    let mut env = TokenEnv::new(env_cfg(2), prompts, zero_scorer()).unwrap();
    let td = env.reset(None).unwrap();
    let td = td
        .with("_reset", Tensor::from_slice(&[false, true]).view([2, 1]))
        .unwrap();
    let td = env.reset(Some(td)).unwrap();
    // row 0 kept, row 1 is the new batch's row 1 padded to width 2
    assert_eq!(
        ints(td.get(("tokens", "prompt")).unwrap()),
        vec![1, 2, PAD, 5]
    );
    assert_eq!(
        ints(td.get(("masks", "prompt_attention_mask")).unwrap()),
        vec![1, 1, 0, 1]
    );
    // the next batch has a 3-token prompt: it cannot fit the kept width 2
    let td = td
        .with("_reset", Tensor::from_slice(&[true, false]).view([2, 1]))
        .unwrap();
    expect_err(
        env.reset(Some(td)),
        &["partial reset", "width 2", "prompt_width", "3 tokens"],
    );
}

#[test]
fn check_env_specs_passes_with_prompt_widths_changing_across_resets() {
    let widths = Arc::new(Mutex::new(Vec::new()));
    let mut env = TokenEnv::new(
        env_cfg(2),
        uneven_prompts(),
        width_scorer(Arc::clone(&widths)),
    )
    .unwrap();
    check_env_specs(&mut env, Some(0)).unwrap();
    // the check's random responses are 1 wide (size 1 at a -1 dim), so each step's full width
    // is P + 1: the resets served prompts of widths 1, 3 and 2, all checked step by step
    let mut w = widths.lock().unwrap().clone();
    w.sort_unstable();
    w.dedup();
    assert_eq!(
        w,
        vec![2, 3, 4],
        "widths seen: {:?}",
        widths.lock().unwrap()
    );
    // a shuffled source too
    let mut env = TokenEnv::new(
        env_cfg(2).with_shuffle(true).with_seed(3),
        uneven_prompts(),
        zero_scorer(),
    )
    .unwrap();
    check_env_specs(&mut env, Some(1)).unwrap();
}

#[test]
fn a_response_narrower_than_max_new_tokens_steps_fine() {
    let seen: Seen = Arc::default();
    let mut env =
        TokenEnv::new(env_cfg(4), four_prompts(), recording_scorer(seen.clone())).unwrap();
    let td = env.reset(None).unwrap();
    // R = 2 < max_new_tokens = 4
    let resp = Tensor::from_slice(&[7i64, EOS, 8, 9, 12, PAD, EOS, PAD]).view([4, 2]);
    let td = env
        .step(td.with(("tokens", "response"), resp).unwrap())
        .unwrap();
    let reward = td.get(("next", "reward")).unwrap();
    assert_eq!(reward.size(), vec![4, 5, 1], "P + R = 3 + 2");
    // lengths 2 (EOS), 2 (no EOS, the full width), 1, 1 (EOS only: an empty scored response);
    // index P + L - 1 = 4, 4, 3, 3; scores 300 + 7, 100 + 17, 200 + 12, 100 + 0
    let mut expected = vec![0.0f32; 20];
    expected[4] = 307.0;
    expected[5 + 4] = 117.0;
    expected[10 + 3] = 212.0;
    expected[15 + 3] = 100.0;
    assert_eq!(floats(reward), expected);
    assert_eq!(
        bools(td.get(("next", "terminated")).unwrap()),
        vec![true, false, false, true]
    );
    assert_eq!(
        bools(td.get(("next", "truncated")).unwrap()),
        vec![false, true, true, false]
    );
    assert_eq!(
        seen.lock().unwrap().clone(),
        vec![
            (vec![1, 2, 3], vec![7]),
            (vec![4], vec![8, 9]),
            (vec![5, 6], vec![12]),
            (vec![7], vec![]),
        ]
    );
    // the step is in the specs
    let specs = env.specs().clone();
    specs.action.check(&td).unwrap();
    specs.reward.check(td.get_dict("next").unwrap()).unwrap();
    // a given full sequence / assistant mask must be P + R wide too
    let td = env.reset(None).unwrap();
    let resp = Tensor::from_slice(&[7i64, EOS, 8, 9, 12, PAD, EOS, PAD]).view([4, 2]);
    let wrong_asst = Tensor::zeros([4, 7], (Kind::Int64, Device::Cpu));
    let e = env
        .step(
            td.with(("tokens", "response"), resp)
                .unwrap()
                .with(("masks", "all_assistant_mask"), wrong_asst)
                .unwrap(),
        )
        .unwrap_err();
    assert!(
        matches!(e, Error::ShapeMismatch { ref expected, ref actual, .. } if expected == &[4, 5] && actual == &[4, 7]),
        "{e}"
    );
}

/// A fixed-spec env with a `[B]` reward and `[B, 1]` spec, or a dynamic-spec one whose reward
/// has the shape `reward` (spec `[B, -1, 1]`).
struct RewardShapeEnv {
    core: torchrl::envs::EnvCore,
    reward: Vec<i64>,
}

impl RewardShapeEnv {
    fn new(spec: &[i64], dynamic: bool, reward: &[i64]) -> Self {
        let r = torchrl::specs::Unbounded::new();
        let r = if dynamic {
            r.with_dynamic_shape(spec).unwrap()
        } else {
            r.with_shape(spec).unwrap()
        };
        let specs = torchrl::envs::EnvSpecs::new([2])
            .unwrap()
            .with_action(
                "action",
                torchrl::specs::Categorical::new(2)
                    .unwrap()
                    .with_shape([2])
                    .unwrap(),
            )
            .unwrap()
            .with_reward("reward", r)
            .unwrap();
        RewardShapeEnv {
            core: torchrl::envs::EnvCore::new(specs).unwrap(),
            reward: reward.to_vec(),
        }
    }
}

impl EnvBase for RewardShapeEnv {
    fn core(&self) -> &torchrl::envs::EnvCore {
        &self.core
    }
    fn core_mut(&mut self) -> &mut torchrl::envs::EnvCore {
        &mut self.core
    }
    fn reset_impl(&mut self, _td: Option<&TensorDict>) -> torchrl::Result<TensorDict> {
        TensorDict::new([2])
    }
    fn step_impl(&mut self, _td: &TensorDict) -> torchrl::Result<TensorDict> {
        let n: i64 = self.reward.iter().product();
        let r = Tensor::arange(n, (Kind::Float, Device::Cpu)).view(self.reward.as_slice());
        TensorDict::new([2])?.with("reward", r)
    }
}

fn reward_after_step(env: &mut RewardShapeEnv) -> torchrl::Result<Tensor> {
    let td = env.reset(None)?;
    let td = env.rand_action(Some(td))?;
    let td = env.step(td)?;
    Ok(td.get_or_err(("next", "reward"))?.shallow_clone())
}

#[test]
fn dynamic_reward_specs_are_checked_not_reshaped() {
    // fixed spec: today's reshape ([2] -> [2, 1]; also tests/envs.rs
    // step_validates_batch_size_and_reshapes_rewards and check.rs's doc example)
    let r = reward_after_step(&mut RewardShapeEnv::new(&[2, 1], false, &[2])).unwrap();
    assert_eq!((r.size(), floats(&r)), (vec![2, 1], vec![0.0, 1.0]));
    let e = reward_after_step(&mut RewardShapeEnv::new(&[2, 1], false, &[2, 3])).unwrap_err();
    assert!(e.to_string().contains("reward reshape"), "{e}");
    // dynamic spec: any length at -1, kept as returned
    for t in [1, 5] {
        let r = reward_after_step(&mut RewardShapeEnv::new(&[2, -1, 1], true, &[2, t, 1])).unwrap();
        assert_eq!(r.size(), vec![2, t, 1]);
    }
    // ...and no reshape: a [2, 5] reward (same elements as some [2, -1, 1]) is an error naming
    // the key and both shapes, as is a wrong fixed dim
    for bad in [vec![2, 5], vec![2, 5, 2], vec![2, 5, 1, 1]] {
        let e = reward_after_step(&mut RewardShapeEnv::new(&[2, -1, 1], true, &bad)).unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, Error::ShapeMismatch { .. }), "{msg}");
        for needle in [
            "reward",
            "[2, -1, 1]",
            &format!("{bad:?}"),
            "-1 dims take any size",
        ] {
            assert!(msg.contains(needle), "{msg:?} lacks {needle:?}");
        }
    }
}

fn expect_err<T: std::fmt::Debug>(r: torchrl::Result<T>, needles: &[&str]) -> Error {
    let e = r.unwrap_err();
    let msg = e.to_string();
    for n in needles {
        assert!(msg.contains(n), "{msg:?} lacks {n:?}");
    }
    e
}

#[test]
fn bad_prompts_and_configs_are_errors() {
    expect_err(
        TokenEnv::new(env_cfg(1), vec![], zero_scorer()),
        &["prompts", "at least one prompt"],
    );
    expect_err(
        TokenEnv::new(env_cfg(1), vec![vec![1], vec![]], zero_scorer()),
        &["prompts[1]", "empty prompt"],
    );
    // 13 tokens + 4 new > 16 positions
    expect_err(
        TokenEnv::new(env_cfg(1), vec![vec![1; 13]], zero_scorer()),
        &[
            "prompts[0]",
            "n_positions = 16",
            "13 tokens",
            "max_new_tokens 4",
        ],
    );
    expect_err(
        TokenEnv::new(env_cfg(1), vec![vec![1, VOCAB]], zero_scorer()),
        &["prompts[0]", "[0, vocab_size = 20)", "token id 20"],
    );
    expect_err(
        TokenEnv::new(env_cfg(1), vec![vec![-1]], zero_scorer()),
        &["prompts[0]", "token id -1"],
    );
    expect_err(
        TokenEnv::new(
            TokenEnvConfig::new(VOCAB, 16)
                .with_max_new_tokens(4)
                .with_eos_token_id(20),
            vec![vec![1]],
            zero_scorer(),
        ),
        &["eos_token_id", "[0, vocab_size = 20)"],
    );
    expect_err(
        TokenEnv::new(
            env_cfg(1).with_max_new_tokens(16),
            vec![vec![1]],
            zero_scorer(),
        ),
        &["max_new_tokens", "16"],
    );
    // the tokenizer's vocabulary (259) does not fit the model's (20)
    expect_err(
        TokenEnv::from_text(env_cfg(1), &ByteTokenizer::new(), &["hi"], zero_scorer()),
        &["tokenizer", "vocabulary size 20", "vocabulary size 259"],
    );
    // a model whose embedding is padded past the tokenizer (as Qwen2.5's is) takes it: the
    // byte tokenizer's EOS (256) and pad (257) ids, prompt "hi" = bytes 104, 105
    let padded = TokenEnvConfig::new(300, 16)
        .with_max_new_tokens(4)
        .with_eos_token_id(256)
        .with_pad_token_id(257);
    let mut env =
        TokenEnv::from_text(padded, &ByteTokenizer::new(), &["hi"], zero_scorer()).unwrap();
    assert_eq!(
        ints(env.reset(None).unwrap().get(("tokens", "prompt")).unwrap()),
        [104, 105]
    );
    // explicit prompts: count, ids; wider than the source's prompts is fine without a fixed
    // width (the reset pads to 3)
    let mut env = TokenEnv::new(env_cfg(2), vec![vec![1, 2], vec![3]], zero_scorer()).unwrap();
    expect_err(
        env.reset_with_prompts(&[vec![1]]),
        &["2 prompts", "1 prompts"],
    );
    let td = env.reset_with_prompts(&[vec![1], vec![1, 2, 3]]).unwrap();
    assert_eq!(td.get(("tokens", "prompt")).unwrap().size(), vec![2, 3]);
    expect_err(
        env.reset_with_prompts(&[vec![1], vec![20]]),
        &["token id 20"],
    );
    // a fixed width: wider prompts are refused, at construction and in explicit resets
    expect_err(
        TokenEnv::new(
            env_cfg(2).with_prompt_width(1),
            vec![vec![1, 2], vec![3]],
            zero_scorer(),
        ),
        &["prompts[0]", "fixed prompt width 1", "2 tokens"],
    );
    let mut env = TokenEnv::new(
        env_cfg(2).with_prompt_width(2),
        vec![vec![1, 2], vec![3]],
        zero_scorer(),
    )
    .unwrap();
    expect_err(
        env.reset_with_prompts(&[vec![1], vec![1, 2, 3]]),
        &["prompts[1]", "fixed prompt width 2", "3 tokens"],
    );
    // and a width that leaves no room for max_new_tokens is a config error
    expect_err(
        TokenEnv::new(
            env_cfg(2).with_prompt_width(13),
            vec![vec![1]],
            zero_scorer(),
        ),
        &["prompt_width", "16 - 4 = 12", "13"],
    );
}

#[test]
fn bad_responses_are_errors() {
    let mut env = TokenEnv::new(env_cfg(2), vec![vec![1, 2], vec![3]], zero_scorer()).unwrap();
    let td = env.reset(None).unwrap();
    let step = |env: &mut TokenEnv, resp: Tensor| {
        env.step(td.clone().with(("tokens", "response"), resp).unwrap())
    };
    let ok = response(&[[4, EOS, PAD, PAD], [5, 6, 7, 8]]);
    // dtype
    let e = expect_err(
        step(&mut env, ok.to_kind(Kind::Int)),
        &["\"tokens\", \"response\""],
    );
    assert!(matches!(
        e,
        Error::DtypeMismatch {
            expected: Kind::Int64,
            actual: Kind::Int,
            ..
        }
    ));
    // width: wider than max_new_tokens 4, or empty
    let wide = Tensor::cat(&[&ok, &ok.narrow(1, 0, 1)], 1);
    expect_err(
        step(&mut env, wide),
        &[
            "\"tokens\", \"response\"",
            "1 <= R <= max_new_tokens = 4",
            "shape [2, 5]",
        ],
    );
    expect_err(
        step(&mut env, ok.narrow(1, 0, 0)),
        &["1 <= R <= max_new_tokens = 4", "shape [2, 0]"],
    );
    // 1-D, 3-D (another batch is refused by the tensordict itself)
    expect_err(step(&mut env, ok.select(1, 0)), &["[2, R]", "shape [2]"]);
    expect_err(
        step(&mut env, ok.unsqueeze(-1)),
        &["[2, R]", "shape [2, 4, 1]"],
    );
    // a prompt of another batch, or wider than the context allows, or not the fixed width
    let bad_prompt = |p: Tensor| {
        td.clone()
            .with(("tokens", "prompt"), p)
            .unwrap()
            .with(("tokens", "response"), ok.shallow_clone())
            .unwrap()
    };
    let int = (Kind::Int64, Device::Cpu);
    expect_err(
        env.step(bad_prompt(Tensor::zeros([2, 13], int))),
        &[
            "\"tokens\", \"prompt\"",
            "P <= n_positions - max_new_tokens = 12",
            "shape [2, 13]",
        ],
    );
    expect_err(
        env.step(bad_prompt(Tensor::zeros([2], int))),
        &["\"tokens\", \"prompt\"", "shape [2]"],
    );
    // a prompt mask of another width than the prompt
    let td_mask = td
        .clone()
        .with(
            ("masks", "prompt_attention_mask"),
            Tensor::ones([2, 3], int),
        )
        .unwrap()
        .with(("tokens", "response"), ok.shallow_clone())
        .unwrap();
    let e = expect_err(env.step(td_mask), &["prompt_attention_mask"]);
    assert!(
        matches!(e, Error::ShapeMismatch { ref expected, ref actual, .. } if expected == &[2, 2] && actual == &[2, 3])
    );
    let mut fixed = TokenEnv::new(
        env_cfg(2).with_prompt_width(3),
        vec![vec![1, 2], vec![3]],
        zero_scorer(),
    )
    .unwrap();
    let td_fixed = fixed.reset(None).unwrap();
    assert_eq!(
        td_fixed.get(("tokens", "prompt")).unwrap().size(),
        vec![2, 3]
    );
    expect_err(
        fixed.step(bad_prompt(Tensor::zeros([2, 2], int))),
        &[
            "[2, 3] (batch, TokenEnvConfig::prompt_width)",
            "shape [2, 2]",
        ],
    );
    // token id out of range
    expect_err(
        step(&mut env, ok.copy().fill_diagonal_(25, false)),
        &["token ids in [0, vocab_size = 20)", "25"],
    );
    // missing
    expect_err(
        env.step(td.clone()),
        &["\"tokens\", \"response\"", "no such entry"],
    );
    // a full sequence inconsistent with prompt + response
    let ok = response(&[[4, EOS, PAD, PAD], [5, 6, 7, 8]]);
    let bad_full = Tensor::zeros([2, 6], (Kind::Int64, Device::Cpu));
    let td2 = td
        .clone()
        .with(("tokens", "response"), ok.shallow_clone())
        .unwrap()
        .with(("tokens", "full"), bad_full)
        .unwrap();
    expect_err(
        env.step(td2),
        &[
            "\"tokens\", \"full\"",
            "built from the prompt and the response",
        ],
    );
    // an assistant mask that marks a prompt position
    let asst = Tensor::zeros([2, 6], (Kind::Int64, Device::Cpu));
    let _ = asst.get(0).get(0).fill_(1);
    let td3 = td
        .clone()
        .with(("tokens", "response"), ok.shallow_clone())
        .unwrap()
        .with(("masks", "all_assistant_mask"), asst)
        .unwrap();
    expect_err(
        env.step(td3),
        &["\"masks\", \"all_assistant_mask\"", "prompt position"],
    );
    // the env's batch: a tensordict of batch [3] is refused by the base env
    let big = TensorDict::new([3]).unwrap();
    assert!(env.step(big).is_err());
    // a scorer that returns the wrong shape
    let scorer =
        BatchScorer::new(|_: &ScoreInput<'_>| Ok(Tensor::zeros([3], (Kind::Float, Device::Cpu))));
    let mut env = TokenEnv::new(env_cfg(2), vec![vec![1, 2], vec![3]], Box::new(scorer)).unwrap();
    let td = env.reset(None).unwrap();
    expect_err(
        env.step(td.with(("tokens", "response"), ok).unwrap()),
        &["scorer output", "[2]", "[3]"],
    );
}

#[test]
fn generation_policy_errors_on_bad_prompts() {
    let (_vs, model) = tiny_model(5);
    let mut policy = GenerationPolicy::new(&model, GenerationConfig::new(2), 0).unwrap();
    let td = TensorDict::new([2]).unwrap();
    assert!(matches!(
        policy.call(td).unwrap_err(),
        Error::KeyNotFound { .. }
    ));
    let td = TensorDict::new([2])
        .unwrap()
        .with(
            ("tokens", "prompt"),
            Tensor::zeros([2, 3], (Kind::Float, Device::Cpu)),
        )
        .unwrap();
    expect_err(policy.call(td), &["\"tokens\", \"prompt\"", "int64"]);
    // a value-head wrapper generates with its trunk: the same tokens for the same seed
    let vs = VarStore::new(Device::Cpu);
    let with_head = with_init_seed(5, || {
        torchrl::modules::llm::CausalLmWithValueHead::new(&vs.root(), &model_cfg())
    })
    .unwrap();
    let prompt = TensorDict::new([1])
        .unwrap()
        .with(
            ("tokens", "prompt"),
            Tensor::from_slice(&[1i64, 2]).view([1, 2]),
        )
        .unwrap();
    let cfg = GenerationConfig::rlhf_sampling(3);
    let a = GenerationPolicy::new(&with_head, cfg.clone(), 4)
        .unwrap()
        .call(prompt.clone())
        .unwrap();
    let b = GenerationPolicy::new(with_head.model(), cfg, 4)
        .unwrap()
        .call(prompt)
        .unwrap();
    assert!(a
        .get(("tokens", "full"))
        .unwrap()
        .equal(b.get(("tokens", "full")).unwrap()));
    // a config whose EOS is outside the model's vocabulary
    assert!(
        GenerationPolicy::new(&model, GenerationConfig::new(2).with_eos_token_id(99), 0).is_err()
    );
}
