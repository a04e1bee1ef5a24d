//! The ILQL trainer on a tiny GPT-2: the target Q-heads take a Polyak step every
//! `steps_for_target_q_sync` optimizer steps (checked by hand), the step budget, the β sweep
//! report, checkpoints, and bad configs.

use tch::nn::VarStore;
use tch::Device;
use torchrl::modules::llm::nn::with_init_seed;
use torchrl::modules::llm::{
    ByteTokenizer, CausalLmWithIlqlHeads, Gpt2Config, Gpt2Model, TextTokenizer,
};
use torchrl::trainers::api::{Callbacks, Evaluation, RlTrainer};
use torchrl::trainers::ilql::data::IlqlDataset;
use torchrl::trainers::ilql::{BetaSweep, IlqlTrainer, IlqlTrlConfig};
use torchrl::Error;

#[path = "common/llm.rs"]
mod llm_fixtures;
use llm_fixtures::{ilql_config, ilql_data};

fn cfg() -> Gpt2Config {
    Gpt2Config::new(ByteTokenizer::new().vocab_size())
        .with_n_layer(1)
        .with_n_embd(16)
        .with_n_head(2)
        .with_n_positions(16)
}

fn data() -> IlqlDataset {
    ilql_data(8)
}

fn config(name: &str, sync: usize) -> IlqlTrlConfig {
    let mut c = ilql_config(&tempdir(name));
    c.train.log_interval = 1;
    c.method.steps_for_target_q_sync = sync;
    c.method.gen_kwargs.beta = BetaSweep::Many(vec![0.0, 2.0]);
    c
}

/// A trainer on a model whose initial weights are those of `seed`.
fn trainer(name: &str, sync: usize, alpha: f64, seed: u64) -> IlqlTrainer {
    let vs = VarStore::new(Device::Cpu);
    let model = with_init_seed(seed, || {
        CausalLmWithIlqlHeads::from_model(
            &vs.root(),
            Gpt2Model::new(&vs.root(), &cfg())?,
            true,
            alpha,
        )
    })
    .unwrap();
    IlqlTrainer::new(
        config(name, sync),
        vs,
        model,
        data(),
        Box::new(ByteTokenizer::new()),
    )
    .unwrap()
}

fn tempdir(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("torchrl-ilql-{name}-{}", std::process::id()))
}

#[test]
fn targets_follow_the_q_heads_by_polyak_every_sync_interval() {
    let mut t = trainer("polyak", 2, 0.5, 0);
    let (q, target) = {
        let heads = t.model().heads();
        (
            heads.q_heads()[0].parameters()[0].shallow_clone(),
            heads.target_q_heads()[0].parameters()[0].shallow_clone(),
        )
    };
    assert!(q.equal(&target), "targets start as copies");
    let batch = data().batch(&[0, 1, 2, 3]).unwrap();
    // step 1: no sync (interval 2), the Q head moves away from its target
    let before = target.copy();
    t.train_step(&batch).unwrap();
    assert!(target.equal(&before));
    assert!(!q.equal(&target));
    // step 2: sync, target = 0.5·q + 0.5·target (the values at that moment)
    t.train_step(&batch).unwrap();
    let expected = q.copy() * 0.5 + before * 0.5;
    assert!((target.copy() - expected).abs().max().double_value(&[]) < 1e-6);
    assert_eq!(t.iter_count(), 2);
}

#[test]
fn learn_spends_the_budget_and_evaluates_every_beta() {
    let hidden = |s: &[String]| Ok(s.iter().map(|x| x.matches('a').count() as f64).collect());
    let mut t = trainer("learn", 1, 0.5, 1)
        .with_evaluation(Evaluation::new(vec!["b:".into(), "c:".into()]).with_reward_fn(hidden));
    assert_eq!(t.total_steps(), 6); // 3 epochs of 2 minibatches
    let mut logged = Vec::new();
    {
        let mut cb = Callbacks::new().on_log(|step, s| {
            assert!(s["loss"].is_finite());
            logged.push(step);
            Ok(())
        });
        t.learn(&mut cb).unwrap();
    }
    assert_eq!(logged, [0, 1, 2, 3, 4, 5]);
    assert_eq!(t.epoch(), 3);
    let sweep = t.evaluate_sweep().unwrap();
    assert_eq!(sweep.iter().map(|s| s.0).collect::<Vec<_>>(), [0.0, 2.0]);
    for (_, r) in &sweep {
        assert_eq!(r.samples.len(), 2);
        let by_hand = r
            .samples
            .iter()
            .map(|s| s.matches('a').count() as f64)
            .sum::<f64>()
            / 2.0;
        assert_eq!(r.mean_reward, Some(by_hand));
    }
    let report = t.evaluate().unwrap();
    assert!(
        report.metrics.contains_key("reward@beta=0")
            && report.metrics.contains_key("reward@beta=2")
    );
    // the last step saved a checkpoint; a fresh trainer loads it exactly
    let dir = tempdir("learn");
    let mut u = trainer("learn", 1, 0.5, 9);
    u.load(&dir).unwrap();
    assert_eq!(u.iter_count(), 6);
    // the frozen target heads (their own store) are saved and restored too
    let model = &u.get_components()[0].1;
    assert!(
        model
            .tensors
            .iter()
            .any(|(n, _)| n.starts_with("target_q_heads.")),
        "{:?}",
        model.tensors.iter().map(|(n, _)| n).collect::<Vec<_>>()
    );
    for ((na, a), (nb, b)) in t.get_components().iter().zip(&u.get_components()) {
        assert_eq!(na, nb);
        for ((x, va), (y, vb)) in a.tensors.iter().zip(&b.tensors) {
            assert_eq!(x, y);
            assert!(va.equal(vb), "{na}/{x}");
        }
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_model_that_does_not_fit_the_config_is_refused() {
    let build = |two_qs: bool, alpha: f64, c: IlqlTrlConfig| {
        let vs = VarStore::new(Device::Cpu);
        let model = with_init_seed(2, || {
            CausalLmWithIlqlHeads::from_model(
                &vs.root(),
                Gpt2Model::new(&vs.root(), &cfg())?,
                two_qs,
                alpha,
            )
        })
        .unwrap();
        IlqlTrainer::new(c, vs, model, data(), Box::new(ByteTokenizer::new())).map(|_| ())
    };
    assert!(build(true, 0.5, config("e", 1)).is_ok());
    let err = build(false, 0.5, config("e", 1)).unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidConfig {
                field: "method.two_qs",
                ..
            }
        ),
        "{err}"
    );
    let err = build(true, 0.1, config("e", 1)).unwrap_err();
    assert!(err.to_string().contains("method.alpha"), "{err}");
    let mut bad = config("e", 1);
    bad.method.tau = 1.0;
    assert!(matches!(
        build(true, 0.5, bad),
        Err(Error::InvalidConfig {
            field: "method.tau",
            ..
        })
    ));
}
