//! The GRPO and DPO trainers end to end on a tiny GPT-2: TRL's defaults, the rollout's groups
//! and advantages against a hand computation from its scores, the first step's ratio of 1
//! and its DAPO loss by hand, learning, checkpoints and resume, DPO's ln 2 at init, the
//! precomputed reference, and the errors.

use tch::nn::VarStore;
use tch::{Kind, Tensor};
use torchrl::envs::llm::TokenEnv;
use torchrl::modules::llm::{
    token_log_probs, ByteTokenizer, CausalLmWithHydraValueHead, LmInput, TextTokenizer,
};
use torchrl::objectives::llm::DpoLossType;
use torchrl::trainers::api::{Callbacks, Evaluation, RlTrainer, Stats};
use torchrl::trainers::dpo::{DpoPair, DpoTrainer, DpoTrlConfig};
use torchrl::trainers::grpo::{GrpoLossType, GrpoTrainer, GrpoTrlConfig, ScaleRewards};
use torchrl::Error;

#[path = "common/llm.rs"]
mod llm_fixtures;
use llm_fixtures::{
    byte_gpt2, constant_lr, grpo_config, lowercase_env, policy_params, seeded_hydra, short_run,
};

const NEW: i64 = 4;

/// A fresh folder under the temp dir, removed when dropped.
struct Scratch(std::path::PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        let dir =
            std::env::temp_dir().join(format!("torchrl-grpo-dpo-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        Scratch(dir)
    }

    fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn model(seed: u64) -> (VarStore, CausalLmWithHydraValueHead) {
    seeded_hydra(&byte_gpt2(), seed, -1)
}

fn max_diff(a: &[(String, Tensor)], b: &[(String, Tensor)]) -> f64 {
    a.iter()
        .zip(b)
        .map(|((na, ta), (nb, tb))| {
            assert_eq!(na, nb);
            (ta - tb).abs().max().double_value(&[])
        })
        .fold(0.0, f64::max)
}

// ------------------------------------------------------------------------------ GRPO

/// The GRPO config of these tests: 8 rollouts per iteration, a constant rate of 3e-3.
fn grpo_config_in(dir: &std::path::Path) -> GrpoTrlConfig {
    grpo_config(dir, 3e-3, 8)
}

fn grpo_env(g: i64) -> TokenEnv {
    lowercase_env(&byte_gpt2(), g)
}

fn grpo_trainer(c: GrpoTrlConfig, seed: u64) -> (VarStore, GrpoTrainer) {
    let (vs, m) = model(seed);
    let g = c.method.num_generations as i64;
    let t = GrpoTrainer::new(c, m, grpo_env(g), Box::new(ByteTokenizer::new())).unwrap();
    (vs, t)
}

#[test]
fn grpo_defaults_are_trl_grpo_config() {
    let c = GrpoTrlConfig::default();
    let m = &c.method;
    assert_eq!((m.num_generations, m.num_iterations), (8, 1));
    assert_eq!((m.beta, m.epsilon, m.epsilon_high), (0.0, 0.2, None));
    assert_eq!(m.loss_type, GrpoLossType::Dapo);
    assert_eq!(m.scale_rewards, ScaleRewards::Group);
    assert_eq!(m.gen_kwargs.max_new_tokens, 512);
    assert_eq!(m.gen_kwargs.temperature, 1.0);
    assert_eq!((c.train.batch_size, c.train.seed), (8, 42));
    assert_eq!(c.train.max_grad_norm, Some(1.0));
    assert_eq!(c.optimizer.kwargs.lr, 1e-6);
    assert_eq!(c.optimizer.kwargs.betas, [0.9, 0.999]);
    assert_eq!(c.optimizer.kwargs.weight_decay, 0.0);
    assert_eq!(c.model.num_layers_unfrozen, -1);
    // the loss: no KL term at beta 0, symmetric clip, dapo
    let loss = m.loss_config();
    assert_eq!(loss.kl_to_ref_coeff, None);
    assert_eq!(loss.entropy_coeff, None); // TRL has no entropy bonus by default
    assert_eq!((loss.clip_epsilon_low, loss.clip_epsilon_high), (0.2, 0.2));
    // a file names only what it changes
    let c = GrpoTrlConfig::from_toml_str(
        "[method]\nbeta = 0.04\nepsilon_high = 0.28\nloss_type = \"dr_grpo\"\nscale_rewards = \"none\"",
    )
    .unwrap();
    let loss = c.method.loss_config();
    assert_eq!(loss.kl_to_ref_coeff, Some(0.04));
    assert_eq!(loss.clip_epsilon_high, 0.28);
    assert_eq!(c.method.scale_rewards, ScaleRewards::None);
    assert_eq!(c.optimizer.kwargs.lr, 1e-6);
}

#[test]
fn grpo_config_errors_name_the_field() {
    let field = |toml: &str| match GrpoTrlConfig::from_toml_str(toml) {
        Err(Error::InvalidConfig { field, .. }) => field,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        field("[method]\nnum_generations = 1"),
        "method.num_generations"
    );
    assert_eq!(field("[method]\nchunk_size = 12"), "method.chunk_size");
    assert_eq!(field("[method]\nnum_rollouts = 4"), "method.num_rollouts");
    assert_eq!(field("[method]\nepsilon = 1.0"), "method.epsilon");
    assert_eq!(field("[method]\nbeta = -0.1"), "method.beta");
    assert!(GrpoTrlConfig::from_toml_str("[method]\nloss_type = \"ppo\"").is_err());
    assert!(GrpoTrlConfig::from_toml_str("[method]\nbetta = 0.1").is_err());
}

#[test]
fn grpo_trainer_rejects_an_env_that_does_not_fit() {
    let dir = Scratch::new("grpo_trainer_rejects_an_env_that_does_not_fit");
    let (_vs, m) = model(0);
    // the env serves groups of 2, the method wants 4
    let err = GrpoTrainer::new(
        grpo_config_in(dir.path()),
        m,
        grpo_env(2),
        Box::new(ByteTokenizer::new()),
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidConfig {
                field: "method.num_generations",
                ..
            }
        ),
        "{err}"
    );
    let (_vs, m) = model(0);
    let mut c = grpo_config_in(dir.path());
    c.method.gen_kwargs.max_new_tokens = 6;
    let err = GrpoTrainer::new(c, m, grpo_env(4), Box::new(ByteTokenizer::new())).unwrap_err();
    assert!(err.to_string().contains("max_new_tokens"), "{err}");
}

#[test]
fn grpo_rollout_groups_advantages_and_first_step_by_hand() {
    let dir = Scratch::new("grpo_rollout_groups_advantages_and_first_step_by_hand");
    let (_vs, mut t) = grpo_trainer(grpo_config_in(dir.path()), 1);
    let stats = t.make_experience().unwrap();
    let store = t.store().unwrap();
    // groups: rows 0-3 share a prompt, rows 4-7 share the next
    let prompt = store.get(("tokens", "prompt")).unwrap();
    for (a, b) in [(0, 1), (0, 3), (4, 7)] {
        assert!(prompt.get(a).equal(&prompt.get(b)));
    }
    assert!(!prompt.get(0).equal(&prompt.get(4)));
    // TRL's advantages by hand from the raw scores: (r − mean_g) / (std_g + 1e-4)
    let score =
        Vec::<f64>::try_from(store.get(("next", "score")).unwrap().to_kind(Kind::Double)).unwrap();
    let adv = Vec::<f32>::try_from(store.get("advantage").unwrap()).unwrap();
    for g in score.chunks(4).zip(adv.chunks(4)) {
        let (r, a) = g;
        let mean = r.iter().sum::<f64>() / 4.0;
        let std = (r.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / 3.0).sqrt();
        for (ri, ai) in r.iter().zip(a) {
            let want = (ri - mean) / (std + 1e-4);
            assert!((f64::from(*ai) - want).abs() < 1e-5, "{ai} vs {want}");
        }
    }
    assert!(
        (stats.score - score.iter().sum::<f64>() / 8.0).abs() < 1e-9,
        "{}",
        stats.score
    );
    // at init the policy is its reference: zero KL
    assert!(
        stats.kl.abs() < 1e-5 && stats.kl_k3.abs() < 1e-6,
        "{stats:?}"
    );
    // one iteration (its own rollout, then one step): the value head and the reference
    // stay put, the policy moves
    let before = policy_params(t.model());
    let ref_before = sorted(t.model().reference_store().variables());
    t.iteration(&mut Callbacks::new()).unwrap();
    let after = policy_params(t.model());
    assert!(max_diff(&before, &after) > 0.0);
    for ((n, a), (_, b)) in before.iter().zip(&after) {
        if n.starts_with("v_head") {
            assert!(a.equal(b), "{n} moved: GRPO trains no value head");
        }
    }
    let ref_after = sorted(t.model().reference_store().variables());
    assert!(!ref_before.is_empty());
    assert_eq!(max_diff(&ref_before, &ref_after), 0.0);
}

fn sorted(vars: std::collections::HashMap<String, Tensor>) -> Vec<(String, Tensor)> {
    let mut v: Vec<(String, Tensor)> = vars.into_iter().map(|(n, t)| (n, t.copy())).collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

#[test]
fn grpo_first_step_loss_is_dapo_of_the_advantages() {
    let dir = Scratch::new("grpo_first_step_loss_is_dapo_of_the_advantages");
    let (_vs, mut t) = grpo_trainer(grpo_config_in(dir.path()), 2);
    let mut logs: Vec<Stats> = Vec::new();
    {
        let mut cb = Callbacks::new().on_log(|_, s| {
            logs.push(s.clone());
            Ok(())
        });
        t.iteration(&mut cb).unwrap();
    }
    let store = t.store().unwrap();
    let adv = Vec::<f64>::try_from(store.get("advantage").unwrap().to_kind(Kind::Double)).unwrap();
    let len = Vec::<f64>::try_from(
        store
            .get(("masks", "all_assistant_mask"))
            .unwrap()
            .to_kind(Kind::Double)
            .sum_dim_intlist(1, false, Kind::Double),
    )
    .unwrap();
    // one minibatch = the whole rollout, so the permutation does not change the sums
    let want = -len.iter().zip(&adv).map(|(l, a)| l * a).sum::<f64>() / len.iter().sum::<f64>();
    let got = logs[0]["loss_objective"];
    assert!((got - want).abs() < 1e-5, "{got} vs {want}");
    assert_eq!(logs.len(), 1); // num_iterations = 1, one minibatch
}

#[test]
fn grpo_raises_the_hidden_score() {
    let dir = Scratch::new("grpo_raises_the_hidden_score");
    let mut c = grpo_config_in(dir.path());
    c.method.num_rollouts = 16;
    c.train.epochs = 40;
    c.method.epsilon_high = Some(0.28);
    c.optimizer.kwargs.lr = 1e-2;
    c.scheduler.kwargs.eta_min = 1e-2;
    let (_vs, mut t) = grpo_trainer(c, 4);
    let mut cb = Callbacks::new();
    let mut scores = Vec::new();
    for _ in 0..40 {
        scores.push(t.iteration(&mut cb).unwrap().score);
    }
    let first: f64 = scores[..5].iter().sum::<f64>() / 5.0;
    let last: f64 = scores[35..].iter().sum::<f64>() / 5.0;
    // out of 4 tokens: from about 0.4 lowercase letters to most of them
    assert!(last > first + 1.0, "{first} -> {last}: {scores:?}");
}

#[test]
fn grpo_with_beta_logs_the_kl_term_and_resumes_exactly() {
    let dir = Scratch::new("grpo_with_beta_logs_the_kl_term_and_resumes_exactly");
    let mut c = grpo_config_in(dir.path());
    c.method.beta = 0.05;
    c.train.batch_size = 4; // two minibatches per rollout
    let (_vs, mut a) = grpo_trainer(c.clone(), 6);
    let mut logs: Vec<Stats> = Vec::new();
    {
        let mut cb = Callbacks::new().on_log(|_, s| {
            logs.push(s.clone());
            Ok(())
        });
        a.iteration(&mut cb).unwrap();
    }
    assert_eq!(logs.len(), 2);
    // the first minibatch is at the reference: k3 = 0
    assert!(logs[0]["kl_to_ref"].abs() < 1e-6, "{:?}", logs[0]);
    // the second, after one step, has moved
    assert!(logs[1]["kl_to_ref"] > 0.0, "{:?}", logs[1]);
    let ckpt = a.save(&dir.path().join("resume")).unwrap();
    assert!(ckpt.exists());
    let mut cb = Callbacks::new();
    let next_a = a.iteration(&mut cb).unwrap();
    // a fresh trainer (other weights) loads the checkpoint and continues identically
    let (_vs2, mut b) = grpo_trainer(c, 7);
    b.load(&dir.path().join("resume")).unwrap();
    assert_eq!((b.iter_count(), b.epoch()), (2, 1));
    let next_b = b.iteration(&mut cb).unwrap();
    assert_eq!(next_a.score, next_b.score);
    assert!(max_diff(&policy_params(a.model()), &policy_params(b.model())) < 1e-6);
}

#[test]
fn grpo_sample_and_evaluate() {
    let dir = Scratch::new("grpo_sample_and_evaluate");
    let (_vs, t) = grpo_trainer(grpo_config_in(dir.path()), 8);
    let count_a = |s: &[String]| Ok(s.iter().map(|x| x.matches('a').count() as f64).collect());
    // (an evaluation reward of its own: the env's scorer is not used by evaluate)
    let mut t =
        t.with_evaluation(Evaluation::new(vec!["ab".into(), "cd".into()]).with_reward_fn(count_a));
    let report = t.evaluate().unwrap();
    assert_eq!(report.samples.len(), 2);
    let want = report
        .samples
        .iter()
        .map(|s| s.matches('a').count() as f64)
        .sum::<f64>()
        / 2.0;
    assert_eq!(report.mean_reward, Some(want));
    let samples = t.sample(&["ab".into()], 2, 3).unwrap();
    assert_eq!(samples.len(), 3);
    assert!(samples.iter().all(|s| s.len() <= 2 * 4)); // at most 2 tokens of ≤ 4 UTF-8 bytes
}

// ------------------------------------------------------------------------------ DPO

fn dpo_config(dir: &std::path::Path) -> DpoTrlConfig {
    let mut c = DpoTrlConfig::default();
    c.train.batch_size = 4;
    short_run(&mut c, dir, 50, 9);
    constant_lr(&mut c, 3e-3);
    c.method.gen_kwargs.max_new_tokens = NEW as usize;
    c
}

/// The hidden preference: completions with an 'a' beat those with a 'z'.
fn dpo_pairs() -> Vec<DpoPair> {
    let tok = ByteTokenizer::new();
    ["ab", "cd", "efg", "h", "ij", "k"]
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let prompt = tok.encode(p).unwrap();
            let c = if i % 2 == 0 { "aa" } else { "a" };
            DpoPair::new(prompt, tok.encode(c).unwrap(), tok.encode("zz").unwrap())
        })
        .collect()
}

fn dpo_trainer(c: DpoTrlConfig, seed: u64) -> (VarStore, DpoTrainer) {
    let (vs, m) = model(seed);
    let t = DpoTrainer::new(c, m, dpo_pairs(), Box::new(ByteTokenizer::new())).unwrap();
    (vs, t)
}

#[test]
fn dpo_defaults_are_trl_dpo_config() {
    let c = DpoTrlConfig::default();
    assert_eq!(c.method.beta, 0.1);
    assert_eq!(c.method.loss_type, DpoLossType::Sigmoid);
    assert_eq!(c.method.label_smoothing, 0.0);
    assert!(!c.method.precompute_ref_log_probs);
    assert_eq!(
        (c.train.epochs, c.train.batch_size, c.train.seed),
        (3, 8, 42)
    );
    assert_eq!(c.optimizer.kwargs.lr, 1e-6);
    assert_eq!(c.optimizer.kwargs.betas, [0.9, 0.999]);
    assert_eq!(c.train.max_grad_norm, Some(1.0));
    let err = DpoTrlConfig::from_toml_str("[method]\nbeta = 0.0").unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidConfig {
                field: "method.beta",
                ..
            }
        ),
        "{err}"
    );
    let err =
        DpoTrlConfig::from_toml_str("[method]\nloss_type = \"robust\"\nlabel_smoothing = 0.5")
            .unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidConfig {
                field: "method.label_smoothing",
                ..
            }
        ),
        "{err}"
    );
    let c = DpoTrlConfig::from_toml_str("[method]\nloss_type = \"hinge\"").unwrap();
    assert_eq!(c.method.loss_type, DpoLossType::Hinge);
    assert!(c.to_toml().unwrap().contains("loss_type = \"hinge\""));
}

/// The policy's sequence log-probs of `prompt ++ completion`, summed over the completion, by
/// hand from a full forward of each row alone (no padding).
fn seq_logp(m: &CausalLmWithHydraValueHead, prompt: &[i64], completion: &[i64]) -> f64 {
    let row: Vec<i64> = [prompt, completion].concat();
    let tokens = Tensor::from_slice(&row).view([1, -1]);
    let mask = tokens.ones_like();
    let out = m
        .policy()
        .forward(&LmInput::new(&tokens).with_attention_mask(&mask))
        .unwrap();
    let lp = token_log_probs(&out.logits, &tokens, Some(&mask)).unwrap();
    let n = row.len() as i64;
    (n - completion.len() as i64..n)
        .map(|i| lp.double_value(&[0, i]))
        .sum()
}

#[test]
fn dpo_first_step_is_ln2_with_zero_rewards_and_the_policy_log_probs() {
    let dir = Scratch::new("dpo_first_step_is_ln2_with_zero_rewards_and_the_policy_log_probs");
    let (_vs, mut t) = dpo_trainer(dpo_config(dir.path()), 1);
    let pairs = dpo_pairs();
    let want_c: f64 = pairs[..4]
        .iter()
        .map(|p| seq_logp(t.model(), &p.prompt, &p.chosen))
        .sum::<f64>()
        / 4.0;
    let want_r: f64 = pairs[..4]
        .iter()
        .map(|p| seq_logp(t.model(), &p.prompt, &p.rejected))
        .sum::<f64>()
        / 4.0;
    let s = t.step(&pairs[..4]).unwrap();
    // the policy is its reference: Δ = 0, loss = −log σ(0) = ln 2, rewards 0, a tie is wrong
    assert!((s["loss"] - std::f64::consts::LN_2).abs() < 1e-6, "{s:?}");
    assert!(s["rewards/chosen"].abs() < 1e-6 && s["rewards/margins"].abs() < 1e-6);
    assert!(s["rewards/accuracies"] <= 0.25, "{s:?}"); // ties (float noise may break one)
                                                       // left padding does not change a row's log-probs
    assert!(
        (s["logps/chosen"] - want_c).abs() < 1e-4,
        "{} vs {want_c}",
        s["logps/chosen"]
    );
    assert!((s["logps/rejected"] - want_r).abs() < 1e-4);
    // the step moved the policy: now the chosen side gains on held-out-style evaluation
    let e = t.evaluate_pairs(&pairs[..4]).unwrap();
    assert!(e["rewards/margins"] > 0.0, "{e:?}");
    assert!(e["loss"] < std::f64::consts::LN_2);
}

#[test]
fn dpo_learns_the_preference_and_precomputed_reference_agrees() {
    let dir = Scratch::new("dpo_learns_the_preference_and_precomputed_reference_agrees");
    let mut c = dpo_config(dir.path());
    c.train.epochs = 15;
    let (_vs, mut a) = dpo_trainer(c.clone(), 2);
    let mut cb = Callbacks::new();
    a.learn(&mut cb).unwrap();
    assert_eq!(a.iter_count(), 15 * 2); // 6 pairs in batches of 4: 2 steps per epoch
    let e = a.evaluate_pairs(&dpo_pairs()).unwrap();
    assert_eq!(e["rewards/accuracies"], 1.0, "{e:?}");
    assert!(e["loss"] < 0.5, "{e:?}");
    // the policy now prefers an unseen prompt's 'a' completion too
    let tok = ByteTokenizer::new();
    let p = tok.encode("xy").unwrap();
    let m = a.model();
    assert!(
        seq_logp(m, &p, &tok.encode("aa").unwrap()) > seq_logp(m, &p, &tok.encode("zz").unwrap())
    );
    // the same run with the reference precomputed takes the same steps
    c.method.precompute_ref_log_probs = true;
    let (_vs2, mut b) = dpo_trainer(c, 2);
    b.learn(&mut cb).unwrap();
    assert!(max_diff(&policy_params(a.model()), &policy_params(b.model())) < 1e-5);
    assert_eq!(a.history().len(), 15);
    assert!(a.history()[14]["loss"] < a.history()[0]["loss"]);
}

#[test]
fn dpo_resumes_exactly_from_a_checkpoint() {
    let dir = Scratch::new("dpo_resumes_exactly_from_a_checkpoint");
    let c = dpo_config(dir.path());
    let (_vs, mut a) = dpo_trainer(c.clone(), 3);
    let mut cb = Callbacks::new();
    a.train_epoch(&mut cb).unwrap();
    a.save(&dir.path().join("resume")).unwrap();
    let next_a = a.train_epoch(&mut cb).unwrap();
    let (_vs2, mut b) = dpo_trainer(c, 4);
    b.load(&dir.path().join("resume")).unwrap();
    assert_eq!((b.iter_count(), b.epoch()), (2, 1));
    let next_b = b.train_epoch(&mut cb).unwrap();
    assert_eq!(next_a["loss"], next_b["loss"]);
    assert!(max_diff(&policy_params(a.model()), &policy_params(b.model())) < 1e-6);
}

#[test]
fn dpo_rejects_bad_pairs_naming_them() {
    let dir = Scratch::new("dpo_rejects_bad_pairs_naming_them");
    let (_vs, m) = model(0);
    let tok = Box::new(ByteTokenizer::new());
    let err = DpoTrainer::new(dpo_config(dir.path()), m, vec![], tok.clone()).unwrap_err();
    assert!(err.to_string().contains("pairs"), "{err}");
    let (_vs, m) = model(0);
    let bad = vec![DpoPair::new(vec![1], vec![2], vec![9999])];
    let err = DpoTrainer::new(dpo_config(dir.path()), m, bad, tok.clone()).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("pairs[0].rejected") && msg.contains("9999"),
        "{msg}"
    );
    let (_vs, m) = model(0);
    let long = vec![DpoPair::new(vec![1; 10], vec![2; 7], vec![3])];
    let err = DpoTrainer::new(dpo_config(dir.path()), m, long, tok.clone()).unwrap_err();
    assert!(err.to_string().contains("n_positions = 16"), "{err}");
    let (_vs, mut t) = dpo_trainer(dpo_config(dir.path()), 0);
    let err = t
        .step(&[DpoPair::new(vec![], vec![2], vec![3])])
        .unwrap_err();
    assert!(err.to_string().contains("pairs[0].chosen"), "{err}");
}

#[test]
fn dpo_with_a_branch_reference_continues_the_policy_from_the_shared_trunk() {
    // hydra with 1 unfrozen block: each side's frozen trunk runs once, for the reference
    // branch, and the policy's forward continues from it; with the reference log-probs
    // precomputed the policy runs whole. Both take the same steps.
    let dir = Scratch::new("dpo_with_a_branch_reference_continues_the_policy");
    let mut c = dpo_config(dir.path());
    c.train.epochs = 3;
    let branch = |c: DpoTrlConfig| {
        let (vs, m) = seeded_hydra(&byte_gpt2(), 5, 1);
        let t = DpoTrainer::new(c, m, dpo_pairs(), Box::new(ByteTokenizer::new()));
        (vs, t.unwrap())
    };
    let (_vs, mut shared) = branch(c.clone());
    let mut cb = Callbacks::new();
    shared.learn(&mut cb).unwrap();
    c.method.precompute_ref_log_probs = true;
    let (_vs2, mut whole) = branch(c);
    whole.learn(&mut cb).unwrap();
    assert_eq!(shared.iter_count(), 6);
    let (_vs0, start) = seeded_hydra(&byte_gpt2(), 5, 1);
    let moved = max_diff(&policy_params(shared.model()), &policy_params(&start));
    assert!(moved > 1e-3, "the policy trained: {moved}");
    let d = max_diff(
        &policy_params(shared.model()),
        &policy_params(whole.model()),
    );
    assert!(d < 1e-6, "{d}");
    for (a, b) in shared.history().iter().zip(whole.history()) {
        assert!((a["loss"] - b["loss"]).abs() < 1e-6, "{a:?} vs {b:?}");
    }
}
