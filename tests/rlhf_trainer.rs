//! The RLHF trainers end to end on a tiny GPT-2: SFT's loss against a hand computation, the
//! reward-model trainer's statistics against the score model run by hand, and the PPO-RLHF
//! trainer (rollout layout, zero KL at init, ratio 1 on the first step, the KL controller's
//! schedule, evaluation, sampling, checkpoints and resume, and its errors).

use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};
use torchrl::envs::llm::{TokenEnv, TokenEnvConfig, TokenScorer};
use torchrl::modules::llm::nn::with_init_seed;
use torchrl::modules::llm::{
    ByteTokenizer, CausalLm, CausalLmWithHydraValueHead, CausalLmWithScoreHead, Gpt2Model, LmInput,
    TextTokenizer,
};
use torchrl::trainers::api::{Callbacks, Evaluation, RlTrainer, Stats};
use torchrl::trainers::config::{ScaleReward, TrlConfig};
use torchrl::trainers::ppo::PpoRlhfTrainer;
use torchrl::trainers::reward::{
    collate_preferences, PreferencePair, RewardModelTrainer, RewardTrainerConfig,
};
use torchrl::trainers::sft::causal_lm_loss;
use torchrl::Error;

#[path = "common/llm.rs"]
mod llm_fixtures;
use llm_fixtures::{byte_gpt2, gen_kwargs, seeded_hydra, short_run, sorted_policy_params};

const NEW: i64 = 4;

fn trl_config(dir: &std::path::Path, target: Option<f64>) -> TrlConfig {
    let mut c = TrlConfig::default();
    c.train.batch_size = 4;
    // 10 epochs: a budget the tests do not reach (every epoch ends with its KL update)
    short_run(&mut c, dir, 10, 5);
    c.train.log_interval = 1;
    c.optimizer.kwargs.lr = 1e-3;
    c.method.num_rollouts = 8;
    c.method.chunk_size = 8;
    c.method.ppo_epochs = 2;
    c.method.init_kl_coef = 0.1;
    c.method.target = target;
    c.method.horizon = 100;
    c.method.scale_reward = ScaleReward::Ignored;
    c.method.gen_kwargs = gen_kwargs(NEW as usize);
    c
}

/// A trainer whose hidden reward is the number of 'a' bytes in the response, on a model whose
/// initial weights are those of `seed`.
fn trainer(dir: &std::path::Path, target: Option<f64>, seed: u64) -> (VarStore, PpoRlhfTrainer) {
    let (vs, model) = seeded_hydra(&byte_gpt2(), seed, 1);
    let tok = ByteTokenizer::new();
    let env_cfg = TokenEnvConfig::for_model(&byte_gpt2().facts())
        .with_max_new_tokens(NEW)
        .with_batch_size(8)
        .with_prompt_width(3);
    let scorer =
        TokenScorer::new(|_p: &[i64], r: &[i64]| r.iter().filter(|&&t| t == 97).count() as f64);
    let prompts = ["ab", "cd", "efg", "h"];
    let env = TokenEnv::from_text(env_cfg, &tok, &prompts, Box::new(scorer)).unwrap();
    let t = PpoRlhfTrainer::new(trl_config(dir, target), model, env, Box::new(tok)).unwrap();
    (vs, t)
}

#[test]
fn causal_lm_loss_is_the_mean_nll_of_predicted_real_tokens() {
    let vs = VarStore::new(Device::Cpu);
    let model = with_init_seed(0, || Gpt2Model::new(&vs.root(), &byte_gpt2())).unwrap();
    // row 0: 3 real tokens then padding; row 1: 4 real tokens
    let tokens = Tensor::from_slice(&[5i64, 6, 7, 257, 8, 9, 10, 11]).view([2, 4]);
    let mask = Tensor::from_slice(&[1i64, 1, 1, 0, 1, 1, 1, 1]).view([2, 4]);
    let loss = causal_lm_loss(&model, &tokens, &mask)
        .unwrap()
        .double_value(&[]);
    // by hand: row 0 predicts tokens 1..2 from a right-padded forward, row 1 predicts 1..3
    let logits = model
        .forward(&LmInput::new(&tokens).with_attention_mask(&mask), None)
        .unwrap()
        .logits()
        .unwrap()
        .log_softmax(-1, Kind::Double);
    let mut nll = 0.0;
    let mut n = 0.0;
    for (b, last) in [(0i64, 2i64), (1, 3)] {
        for t in 1..=last {
            let tok = tokens.int64_value(&[b, t]);
            nll -= logits.double_value(&[b, t - 1, tok]);
            n += 1.0;
        }
    }
    assert!((loss - nll / n).abs() < 1e-5, "{loss} vs {}", nll / n);
    // no predicted token at all is an error
    let one = Tensor::from_slice(&[5i64, 257]).view([1, 2]);
    let m = Tensor::from_slice(&[1i64, 0]).view([1, 2]);
    assert!(matches!(
        causal_lm_loss(&model, &one, &m),
        Err(Error::InvalidValue { .. })
    ));
}

#[test]
fn reward_trainer_statistics_are_the_score_model_run_by_hand() {
    let vs = VarStore::new(Device::Cpu);
    let rm = with_init_seed(1, || {
        CausalLmWithScoreHead::from_model(&vs.root(), Gpt2Model::new(&vs.root(), &byte_gpt2())?)
    })
    .unwrap();
    let pairs = vec![
        PreferencePair::new(vec![1, 2, 3], vec![1, 2]),
        PreferencePair::new(vec![4, 5], vec![6, 7, 8, 9]),
        PreferencePair::new(vec![10], vec![11]),
    ];
    let td = collate_preferences(&pairs, 257, Device::Cpu).unwrap();
    let score = |side: &str| {
        let ids = td.get((side, "tokens", "full")).unwrap();
        let mask = td.get((side, "masks", "all_attention_mask")).unwrap();
        rm.forward(&LmInput::new(ids).with_attention_mask(mask))
            .unwrap()
    };
    let (c, r) = tch::no_grad(|| (score("chosen"), score("rejected")));
    let margin = (&c - &r).mean(Kind::Double).double_value(&[]);
    let accuracy = (&c - &r)
        .gt(0.0)
        .to_kind(Kind::Double)
        .mean(Kind::Double)
        .double_value(&[]);
    // -log σ(c − r), mean, plus TorchRL's centring 0.01 · mean(c² + r²)
    let bt = (&c - &r)
        .neg()
        .softplus()
        .mean(Kind::Double)
        .double_value(&[]);
    let center = 0.01
        * (c.square() + r.square())
            .mean(Kind::Double)
            .double_value(&[]);
    let trainer = RewardModelTrainer::new(
        rm,
        RewardTrainerConfig::default()
            .with_center_coeff(0.01)
            .with_pad_token_id(257),
    )
    .unwrap();
    let stats = trainer.evaluate(&pairs).unwrap();
    assert!((stats.margin - margin).abs() < 1e-6);
    assert!((stats.accuracy - accuracy).abs() < 1e-6); // the loss reports it in float32
    assert!(
        (stats.loss - (bt + center)).abs() < 1e-5,
        "{} vs {}",
        stats.loss,
        bt + center
    );
    assert!(collate_preferences(&[], 257, Device::Cpu).is_err());
    assert!(
        collate_preferences(&[PreferencePair::new(vec![], vec![1])], 257, Device::Cpu).is_err()
    );
}

#[test]
fn ppo_iteration_layout_zero_kl_at_init_and_unit_ratio_on_the_first_step() {
    let dir = tempdir("layout");
    let (_vs, mut t) = trainer(&dir, None, 2);
    let mut logged: Vec<(usize, Stats)> = Vec::new();
    let stats = {
        let mut cb = Callbacks::new().on_log(|step, s| {
            logged.push((step, s.clone()));
            Ok(())
        });
        t.iteration(&mut cb).unwrap()
    };
    // 8 rollouts, minibatches of 4, 2 epochs: 4 optimizer steps, logged at steps 0..3
    assert_eq!(stats.iter_count, 4);
    assert_eq!(
        logged.iter().map(|(s, _)| *s).collect::<Vec<_>>(),
        [0, 1, 2, 3]
    );
    // the hydra reference equals the policy at init: the first rollout's KL is exactly 0
    assert_eq!(stats.kl, 0.0);
    assert_eq!(stats.kl_k3, 0.0);
    // on the first step the policy is the rollout policy: ratio 1, no approx KL, no clipping
    let first = &logged[0].1;
    assert!((first["ratio"] - 1.0).abs() < 1e-6, "{first:?}");
    assert!(first["approx_kl"].abs() < 1e-7, "{first:?}");
    assert_eq!(first["pg_clipfrac"], 0.0);
    // the store: TorchRL's layout, prompt width 3 + response width NEW
    let store = t.store().unwrap();
    assert_eq!(store.batch_size(), &[8]);
    assert_eq!(
        store.get(("tokens", "full")).unwrap().size(),
        vec![8, 3 + NEW]
    );
    assert_eq!(
        store.get(("next", "reward")).unwrap().size(),
        vec![8, 3 + NEW, 1]
    );
    // with zero KL the reward is the score at the last response token and 0 elsewhere
    let reward = store.get(("next", "reward")).unwrap().squeeze_dim(-1);
    let score = store.get(("next", "score")).unwrap();
    let summed = reward.sum_dim_intlist(1, false, Kind::Double);
    assert!(
        (summed - score.to_kind(Kind::Double))
            .abs()
            .max()
            .double_value(&[])
            < 1e-6
    );
    let assistant = store.get(("masks", "all_assistant_mask")).unwrap();
    let outside = reward.abs() * (assistant.ones_like() - assistant).to_kind(Kind::Float);
    assert_eq!(outside.sum(Kind::Double).double_value(&[]), 0.0);
    // values are aligned with the tokens: column 0 holds no value
    let values = store.get("values").unwrap();
    assert_eq!(
        values
            .narrow(1, 0, 1)
            .abs()
            .sum(Kind::Double)
            .double_value(&[]),
        0.0
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn adaptive_controller_follows_the_rollout_kl_once_per_epoch() {
    let dir = tempdir("adaptive");
    let (_vs, mut t) = trainer(&dir, Some(0.5), 3);
    let mut cb = Callbacks::new();
    let mut expected = 0.1;
    for _ in 0..3 {
        let s = t.iteration(&mut cb).unwrap();
        assert!((s.kl_coef - expected).abs() < 1e-12);
        // trlX's update, n_steps = batch_size = 4, horizon 100, once per PPO epoch (2)
        for _ in 0..2 {
            let e = (s.kl / 0.5 - 1.0).clamp(-0.2, 0.2);
            expected *= 1.0 + e * 4.0 / 100.0;
        }
    }
    assert!((t.kl_controller().value() - expected).abs() < 1e-12);
    assert!(expected < 0.1, "KL below target lowers the coefficient");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn evaluate_and_sample_decode_the_responses() {
    let dir = tempdir("eval");
    let (_vs, t) = trainer(&dir, None, 4);
    let lens = |s: &[String]| Ok(s.iter().map(|x| x.len() as f64).collect());
    let mut t =
        t.with_evaluation(Evaluation::new(vec!["ab".into(), "c".into()]).with_reward_fn(lens));
    let report = t.evaluate().unwrap();
    assert_eq!(report.samples.len(), 2);
    let mean = report.samples.iter().map(|s| s.len() as f64).sum::<f64>() / 2.0;
    assert_eq!(report.mean_reward, Some(mean));
    let samples = t.sample(&["ab".into(), "x".into()], 3, 2).unwrap();
    assert_eq!(samples.len(), 4);
    assert!(samples.iter().all(|s| s.len() <= 3 * 4)); // at most 3 tokens of ≤ 4 UTF-8 bytes
    let err = t.sample(&["".into()], 3, 1).unwrap_err();
    assert!(err.to_string().contains("prompt 0"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn checkpoint_resume_restores_weights_optimizer_schedule_and_controller() {
    let dir = tempdir("resume");
    let (_vs, mut a) = trainer(&dir, Some(0.5), 5);
    let mut cb = Callbacks::new();
    a.iteration(&mut cb).unwrap();
    a.iteration(&mut cb).unwrap();
    let saved = a.save(&dir).unwrap();
    assert!(saved.exists());
    // a different init (seed 99), overwritten by the load
    let (_vs2, mut b) = trainer(&dir, Some(0.5), 99);
    b.load(&dir).unwrap();
    assert_eq!(RlTrainer::iter_count(&b), RlTrainer::iter_count(&a));
    assert_eq!(b.kl_controller().value(), a.kl_controller().value());
    let (ca, cb_) = (a.get_components(), b.get_components());
    for ((na, xa), (nb, xb)) in ca.iter().zip(&cb_) {
        assert_eq!(na, nb);
        assert_eq!(xa.state, xb.state, "{na}");
        for ((ta, va), (tb, vb)) in xa.tensors.iter().zip(&xb.tensors) {
            assert_eq!(ta, tb);
            assert!(va.equal(vb), "{na}/{ta}");
        }
    }
    // training goes on from there
    b.iteration(&mut cb).unwrap();
    assert_eq!(RlTrainer::iter_count(&b), RlTrainer::iter_count(&a) + 4);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_configs_tokenizers_and_envs_are_refused() {
    let dir = tempdir("errors");
    let build = |config: TrlConfig, env_vocab: i64, tok_vocab_ok: bool| {
        let vs = VarStore::new(Device::Cpu);
        let model = with_init_seed(6, || {
            CausalLmWithHydraValueHead::new(&vs.root(), &byte_gpt2(), 1)
        })
        .unwrap();
        let env_cfg = TokenEnvConfig::new(env_vocab, 16)
            .with_max_new_tokens(NEW)
            .with_batch_size(2);
        // (2 prompts per reset: chunk_size 2, num_rollouts 2 in `good` below)
        let scorer = TokenScorer::new(|_p: &[i64], _r: &[i64]| 0.0);
        let env = TokenEnv::new(env_cfg, vec![vec![1, 2]], Box::new(scorer)).unwrap();
        let tok: Box<dyn TextTokenizer> = if tok_vocab_ok {
            Box::new(ByteTokenizer::new())
        } else {
            Box::new(LargeVocab)
        };
        PpoRlhfTrainer::new(config, model, env, tok).map(|_| ())
    };
    let mut good = trl_config(&dir, None);
    good.method.chunk_size = 2;
    good.method.num_rollouts = 2;
    assert!(build(good.clone(), 259, true).is_ok());
    // the tokenizer's ids do not fit the model's vocabulary
    let err = build(good.clone(), 259, false).unwrap_err();
    assert!(
        err.to_string().contains("vocabulary size 259") && err.to_string().contains("300"),
        "{err}"
    );
    // the env's vocabulary is not the model's
    let err = build(good.clone(), 300, true).unwrap_err();
    assert!(err.to_string().contains("env"), "{err}");
    // a bad PPO field names itself
    let mut bad = good.clone();
    bad.method.cliprange = 0.0;
    assert!(matches!(
        build(bad, 259, true),
        Err(Error::InvalidConfig { .. })
    ));
    // a chunk size other than the env's batch
    let mut chunk = good.clone();
    chunk.method.chunk_size = 4;
    let err = build(chunk, 259, true).unwrap_err();
    assert!(err.to_string().contains("chunk_size"), "{err}");
    // several chunks per rollout need one prompt width
    let mut many = good.clone();
    many.method.num_rollouts = 4;
    let err = build(many, 259, true).unwrap_err();
    assert!(err.to_string().contains("prompt_width"), "{err}");
    // generation wider than the env's responses
    let mut wide = good;
    wide.method.gen_kwargs.max_new_tokens = 9;
    let err = build(wide, 259, true).unwrap_err();
    assert!(err.to_string().contains("max_new_tokens"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A tokenizer of 300 ids, more than the model's 259 (a smaller one is accepted: checkpoints pad
/// the embedding past the tokenizer).
struct LargeVocab;

impl TextTokenizer for LargeVocab {
    fn encode(&self, text: &str) -> torchrl::Result<Vec<i64>> {
        Ok(text.bytes().map(i64::from).collect())
    }
    fn decode(
        &self,
        ids: &[i64],
        _special: torchrl::modules::llm::SpecialTokens,
    ) -> torchrl::Result<String> {
        Ok(ids.iter().map(|i| i.to_string()).collect())
    }
    fn vocab_size(&self) -> i64 {
        300
    }
    fn eos_token_id(&self) -> Option<i64> {
        None
    }
    fn pad_token_id(&self) -> Option<i64> {
        None
    }
    fn bos_token_id(&self) -> Option<i64> {
        None
    }
}

fn tempdir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "torchrl-rlhf-trainer-{name}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

// ---------------------------------------------------------------------------------------------
// The data-parallel seam in a world of one (tests/distributed_trainers.rs runs two processes).
// ---------------------------------------------------------------------------------------------

#[test]
fn single_process_collective_and_learn_on_replay_an_iteration_bit_for_bit() {
    use torchrl::trainers::parallel::{Collective, SingleProcess};
    let dir = tempdir("single-collective");
    let (_va, mut a) = trainer(&dir, Some(0.5), 11);
    let (_vb, b) = trainer(&dir, Some(0.5), 11);
    let mut b = b.with_collective(SingleProcess).unwrap();
    assert_eq!((b.collective().rank(), b.collective().world_size()), (0, 1));
    assert!(b.is_main_process());
    // A: one iteration. B: the same rollouts, then the update phase on them through learn_on.
    let sa = a.iteration(&mut Callbacks::new()).unwrap();
    b.make_experience().unwrap();
    let store = b.store().unwrap().clone();
    let sb = b.learn_on(store, &mut Callbacks::new()).unwrap();
    assert_eq!(sa.iter_count, 4);
    assert_eq!(sb.iter_count, 4);
    for ((na, pa), (nb, pb)) in sorted_policy_params(a.model())
        .iter()
        .zip(&sorted_policy_params(b.model()))
    {
        assert_eq!(na, nb);
        assert!(pa.equal(pb), "{na} differs");
    }
    assert_eq!(a.kl_controller().value(), b.kl_controller().value());
    assert_eq!((sa.kl, sa.score, sa.kl_k3), (sb.kl, sb.score, sb.kl_k3));
    assert_eq!(sa.update, sb.update);
    // an empty store is refused with the trainer's name
    let empty = b
        .store()
        .unwrap()
        .index(&[torchrl::tensordict::BatchIndex::slice(Some(0), Some(0), 1)]);
    if let Ok(empty) = empty {
        let err = b.learn_on(empty, &mut Callbacks::new()).unwrap_err();
        assert!(err.to_string().contains("learn_on"), "{err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn global_whitening_and_token_normalizer_reduce_to_the_local_ones_in_one_process() {
    use torchrl::objectives::llm::{
        compute_ppo_rlhf_advantages, masked_whiten, ppo_rlhf_loss, PpoRlhfConfig, PpoRlhfInputs,
        PpoRlhfKeys,
    };
    use torchrl::objectives::llm::{compute_ppo_rlhf_advantages_with, masked_whiten_global};
    use torchrl::TensorDict;
    // arbitrary inputs, from a seeded generator of this test (not libtorch's global one)
    let mut rng = torchrl::Generator::new(4);
    let mut randn = |shape: &[i64]| {
        rng.normal(shape, 0.0, 1.0, Kind::Float, Device::Cpu)
            .unwrap()
    };
    let x = randn(&[3, 5]);
    let mask = Tensor::from_slice(&[0i64, 1, 1, 1, 0, 0, 1, 1, 1, 1, 0, 0, 0, 1, 1]).view([3, 5]);
    let identity = |_: &mut Tensor| Ok(());
    // bitwise the local whitening
    let g = masked_whiten_global(&x, &mask, true, &identity).unwrap();
    assert!(g.equal(&masked_whiten(&x, &mask, true).unwrap()));
    let g = masked_whiten_global(&x, &mask, false, &identity).unwrap();
    assert!(g.equal(&masked_whiten(&x, &mask, false).unwrap()));
    // fewer than 2 response tokens over all processes is refused
    let one = Tensor::from_slice(&[0i64, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]).view([3, 5]);
    assert!(masked_whiten_global(&x, &one, true, &identity).is_err());
    let doubled = |t: &mut Tensor| -> torchrl::Result<()> {
        let _ = t.f_mul_scalar_(2.0)?;
        Ok(())
    };
    // one token here, one "elsewhere": 2 globally, enough to whiten
    assert!(masked_whiten_global(&x, &one, true, &doubled).is_ok());

    // compute_ppo_rlhf_advantages_with the identity: bitwise the local advantages
    let row = |v: &[f32]| Tensor::from_slice(v).view([1, 5]);
    let td = TensorDict::new([1])
        .unwrap()
        .with("values", row(&[0.0, 0.5, 0.6, 0.7, 0.1]))
        .unwrap()
        .with(("next", "reward"), row(&[0.0, 0.0, 0.0, 0.2, 1.0]))
        .unwrap()
        .with(
            ("masks", "all_assistant_mask"),
            row(&[0.0, 1.0, 1.0, 1.0, 1.0]),
        )
        .unwrap();
    let (mut l, mut d) = (td.clone(), td.clone());
    let cfg = PpoRlhfConfig::new();
    compute_ppo_rlhf_advantages(&mut l, &PpoRlhfKeys::default(), &cfg).unwrap();
    compute_ppo_rlhf_advantages_with(&mut d, &PpoRlhfKeys::default(), &cfg, &identity).unwrap();
    for key in ["advantage", "value_target"] {
        assert!(l.get_or_err(key).unwrap().equal(d.get_or_err(key).unwrap()));
    }

    // the loss: Some(n) is bitwise None; Some(2n) halves every term; Some(< n) is refused
    let lp = randn(&[2, 4]).set_requires_grad(true);
    let v = randn(&[2, 4]);
    let (olp, ov, adv, ret) = (
        randn(&[2, 4]),
        randn(&[2, 4]),
        randn(&[2, 4]),
        randn(&[2, 4]),
    );
    let m = Tensor::from_slice(&[1.0f32, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 1.0]).view([2, 4]);
    let inputs = PpoRlhfInputs {
        log_probs: &lp,
        values: &v,
        old_log_probs: &olp,
        old_values: &ov,
        advantages: &adv,
        returns: &ret,
        mask: &m,
    };
    let base = ppo_rlhf_loss(&inputs, &PpoRlhfConfig::new()).unwrap();
    let same = ppo_rlhf_loss(
        &inputs,
        &PpoRlhfConfig::new().with_token_normalizer(Some(6.0)),
    )
    .unwrap();
    assert!(base.loss.equal(&same.loss));
    assert!(base.approx_kl.equal(&same.approx_kl));
    let half = ppo_rlhf_loss(
        &inputs,
        &PpoRlhfConfig::new().with_token_normalizer(Some(12.0)),
    )
    .unwrap();
    let h = half.loss.double_value(&[]);
    let b = base.loss.double_value(&[]);
    assert!((2.0 * h - b).abs() < 1e-6 * (1.0 + b.abs()), "{h} vs {b}");
    assert!(
        (2.0 * half.ratio.double_value(&[]) - base.ratio.double_value(&[])).abs() < 1e-6,
        "the diagnostics use the given count too"
    );
    // padding_percentage stays this batch's
    assert!(half.padding_percentage.equal(&base.padding_percentage));
    let err = ppo_rlhf_loss(
        &inputs,
        &PpoRlhfConfig::new().with_token_normalizer(Some(5.0)),
    )
    .unwrap_err();
    assert!(err.to_string().contains("token_normalizer"), "{err}");
    for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        let err = PpoRlhfConfig::new()
            .with_token_normalizer(Some(bad))
            .validate()
            .unwrap_err();
        assert!(
            matches!(
                err,
                Error::InvalidConfig {
                    field: "token_normalizer",
                    ..
                }
            ),
            "{err}"
        );
    }
}
