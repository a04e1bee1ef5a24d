//! All-or-nothing trainer loads (issue 29): for each trainer kind (PPO, GRPO, DPO, ILQL), a
//! trained trainer's checkpoint is saved, each part of it is corrupted in turn (a tensor
//! dropped, mis-shaped or added, a group missing, a JSON field missing or of the wrong type,
//! counters past their range, optimizer and schedule values the constructors refuse) and
//! saved as a well-formed checkpoint (valid hashes), and a fresh trainer loads it: the load
//! must fail, and the fresh trainer's parameters, optimizer state, schedule, counters and
//! generators must be bitwise what they were. Before the fix, the loads wrote the model,
//! reference and optimizer before reading the later parts.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};
use tch::nn::VarStore;
use tch::{Device, Tensor};
use torchrl::envs::llm::{TokenEnv, TokenEnvConfig, TokenScorer};
use torchrl::modules::llm::nn::with_init_seed;
use torchrl::modules::llm::{
    ByteTokenizer, CausalLmWithHydraValueHead, CausalLmWithIlqlHeads, Gpt2Config, Gpt2Model,
    TextTokenizer,
};
use torchrl::trainers::api::{Callbacks, RlTrainer};
use torchrl::trainers::checkpoint::{Checkpoint, CheckpointStore};
use torchrl::trainers::config::{ScaleReward, TrlConfig};
use torchrl::trainers::dpo::{DpoPair, DpoTrainer, DpoTrlConfig};
use torchrl::trainers::grpo::{GrpoTrainer, GrpoTrlConfig};
use torchrl::trainers::ilql::IlqlTrainer;
use torchrl::trainers::ppo::PpoRlhfTrainer;

#[path = "common/llm.rs"]
mod llm_fixtures;
use llm_fixtures::{
    byte_gpt2_sized, constant_lr, gen_kwargs, ilql_config, ilql_data, lowercase, scratch,
    seeded_hydra, short_run,
};

const NEW: i64 = 3;

fn tempdir(name: &str) -> PathBuf {
    scratch("hostile-trainer", name)
}

/// GPT-2 on the byte tokenizer, 8 wide, with `n_layer` blocks.
fn cfg(n_layer: i64) -> Gpt2Config {
    byte_gpt2_sized(8, n_layer)
}

fn hydra(seed: u64, unfrozen: i64) -> (VarStore, CausalLmWithHydraValueHead) {
    seeded_hydra(&cfg(2), seed, unfrozen)
}

fn env(batch: i64, generations: i64) -> TokenEnv {
    let tok = ByteTokenizer::new();
    let env_cfg = TokenEnvConfig::for_model(&cfg(2).facts())
        .with_max_new_tokens(NEW)
        .with_batch_size(batch)
        .with_num_generations(generations)
        .with_prompt_width(3);
    let scorer = TokenScorer::new(|_p: &[i64], r: &[i64]| lowercase(r));
    TokenEnv::from_text(env_cfg, &tok, &["ab", "cd", "efg", "h"], Box::new(scorer)).unwrap()
}

fn ppo(dir: &Path, seed: u64) -> (VarStore, PpoRlhfTrainer) {
    let mut c = TrlConfig::default();
    c.train.batch_size = 4;
    short_run(&mut c, dir, 10, 5);
    c.optimizer.kwargs.lr = 1e-3;
    c.method.num_rollouts = 4;
    c.method.chunk_size = 4;
    c.method.ppo_epochs = 1;
    c.method.target = Some(0.5);
    c.method.scale_reward = ScaleReward::Running;
    c.method.gen_kwargs = gen_kwargs(NEW as usize);
    let (vs, m) = hydra(seed, 1);
    let t = PpoRlhfTrainer::new(c, m, env(4, 1), Box::new(ByteTokenizer::new())).unwrap();
    (vs, t)
}

fn grpo(dir: &Path, seed: u64) -> (VarStore, GrpoTrainer) {
    let mut c = GrpoTrlConfig::default();
    c.train.batch_size = 4;
    short_run(&mut c, dir, 100, 3);
    constant_lr(&mut c, 3e-3);
    c.method.num_generations = 2;
    c.method.num_rollouts = 4;
    c.method.chunk_size = 4;
    c.method.gen_kwargs = gen_kwargs(NEW as usize);
    let (vs, m) = hydra(seed, -1);
    let t = GrpoTrainer::new(c, m, env(4, 2), Box::new(ByteTokenizer::new())).unwrap();
    (vs, t)
}

fn dpo(dir: &Path, seed: u64) -> (VarStore, DpoTrainer) {
    dpo_with(dir, seed, false)
}

fn dpo_with(dir: &Path, seed: u64, precompute: bool) -> (VarStore, DpoTrainer) {
    let mut c = DpoTrlConfig::default();
    c.method.precompute_ref_log_probs = precompute;
    c.train.batch_size = 2;
    short_run(&mut c, dir, 50, 9);
    constant_lr(&mut c, 3e-3);
    c.method.gen_kwargs.max_new_tokens = NEW as usize;
    let tok = ByteTokenizer::new();
    let pairs = ["ab", "cd", "efg", "h"]
        .iter()
        .map(|p| {
            let prompt = tok.encode(p).unwrap();
            DpoPair::new(prompt, tok.encode("a").unwrap(), tok.encode("zz").unwrap())
        })
        .collect();
    let (vs, m) = hydra(seed, -1);
    let t = DpoTrainer::new(c, m, pairs, Box::new(ByteTokenizer::new())).unwrap();
    (vs, t)
}

fn ilql(dir: &Path, seed: u64) -> IlqlTrainer {
    let mut c = ilql_config(dir);
    c.method.steps_for_target_q_sync = 1;
    let data = ilql_data(4);
    let vs = VarStore::new(Device::Cpu);
    let model = with_init_seed(seed, || {
        CausalLmWithIlqlHeads::from_model(
            &vs.root(),
            Gpt2Model::new(&vs.root(), &cfg(1))?,
            true,
            0.5,
        )
    })
    .unwrap();
    IlqlTrainer::new(c, vs, model, data, Box::new(ByteTokenizer::new())).unwrap()
}

/// A deep copy of everything a trainer checkpoints.
type Snapshot = Vec<(String, Vec<(String, Tensor)>, Value)>;

fn snapshot(t: &dyn RlTrainer) -> Snapshot {
    t.get_components()
        .into_iter()
        .map(|(name, c)| {
            let tensors = c
                .tensors
                .iter()
                .map(|(n, t)| (n.clone(), t.detach().copy()))
                .collect();
            (name, tensors, c.state)
        })
        .collect()
}

/// Bitwise equality of two snapshots (the first difference, if any).
fn difference(a: &Snapshot, b: &Snapshot) -> Option<String> {
    if a.len() != b.len() {
        return Some("component count".into());
    }
    for ((na, ta, sa), (nb, tb, sb)) in a.iter().zip(b) {
        if na != nb || sa != sb || ta.len() != tb.len() {
            return Some(format!("component {na}: state or tensor list"));
        }
        for ((xa, va), (xb, vb)) in ta.iter().zip(tb) {
            let same = xa == xb
                && va.size() == vb.size()
                && va.kind() == vb.kind()
                && va.view_as_real_or_self().equal(&vb.view_as_real_or_self());
            if !same {
                return Some(format!("component {na}: tensor {xa}"));
            }
        }
    }
    None
}

trait AsReal {
    fn view_as_real_or_self(&self) -> Tensor;
}

impl AsReal for Tensor {
    /// The bits of a float tensor as integers, so that equality is bitwise (NaN included).
    fn view_as_real_or_self(&self) -> Tensor {
        match self.kind() {
            tch::Kind::Float => self.view_dtype(tch::Kind::Int),
            tch::Kind::Double => self.view_dtype(tch::Kind::Int64),
            _ => self.shallow_clone(),
        }
    }
}

type Named = Vec<(String, Tensor)>;

/// A checkpoint rebuilt from `ckpt` with `edit` applied to its parts.
fn rebuild(
    ckpt: &Checkpoint,
    tensors: &dyn Fn(&str, Named) -> Option<Named>,
    jsons: &dyn Fn(&str, Value) -> Option<Value>,
) -> Checkpoint {
    let mut out = Checkpoint::new(ckpt.step());
    for g in ckpt.tensor_groups() {
        let ts = ckpt
            .tensors(g)
            .unwrap()
            .iter()
            .map(|(n, t)| (n.clone(), t.shallow_clone()))
            .collect();
        if let Some(ts) = tensors(g, ts) {
            out = out.with_tensors(g, ts);
        }
    }
    for j in ckpt.json_names() {
        if let Some(v) = jsons(j, ckpt.json(j).unwrap().clone()) {
            out = out.with_json(j, v);
        }
    }
    out
}

type Corruption = (String, Checkpoint);

/// Every corruption of `ckpt` the loads must refuse: per tensor group, a tensor dropped,
/// mis-shaped, added, a non-finite optimizer moment, the group missing; per JSON part (but
/// `config`, which loads do not read), the part missing, each field missing or a string;
/// targeted values out of range.
fn corruptions(ckpt: &Checkpoint) -> Vec<Corruption> {
    let keep_t = |_: &str, t: Vec<(String, Tensor)>| Some(t);
    let keep_j = |_: &str, v: Value| Some(v);
    let mut out: Vec<Corruption> = Vec::new();
    for g in ckpt.tensor_groups() {
        let g = g.to_string();
        let n = ckpt.tensors(&g).unwrap().len();
        for i in [0, n / 2, n - 1] {
            let gg = g.clone();
            out.push((
                format!("{g}: tensor {i} dropped"),
                rebuild(
                    ckpt,
                    &move |name, mut t| {
                        if name == gg {
                            let _ = t.remove(i);
                        }
                        Some(t)
                    },
                    &keep_j,
                ),
            ));
            let gg = g.clone();
            out.push((
                format!("{g}: tensor {i} mis-shaped"),
                rebuild(
                    ckpt,
                    &move |name, mut t| {
                        if name == gg {
                            let numel = t[i].1.numel() as i64;
                            t[i].1 = Tensor::zeros([numel + 1], (t[i].1.kind(), Device::Cpu));
                        }
                        Some(t)
                    },
                    &keep_j,
                ),
            ));
            if g == "opt" {
                let gg = g.clone();
                out.push((
                    format!("{g}: tensor {i} not finite"),
                    rebuild(
                        ckpt,
                        &move |name, mut t| {
                            if name == gg {
                                t[i].1 = t[i].1.full_like(f64::NAN);
                            }
                            Some(t)
                        },
                        &keep_j,
                    ),
                ));
            }
        }
        let gg = g.clone();
        out.push((
            format!("{g}: an extra tensor"),
            rebuild(
                ckpt,
                &move |name, mut t| {
                    if name == gg {
                        t.push((
                            "not.a.parameter".into(),
                            Tensor::zeros([2], tch::kind::FLOAT_CPU),
                        ));
                    }
                    Some(t)
                },
                &keep_j,
            ),
        ));
        let gg = g.clone();
        out.push((
            format!("{g}: group missing"),
            rebuild(ckpt, &move |name, t| (name != gg).then_some(t), &keep_j),
        ));
    }
    for j in ckpt.json_names() {
        if j == "config" {
            continue;
        }
        let j = j.to_string();
        let jj = j.clone();
        out.push((
            format!("{j}: part missing"),
            rebuild(ckpt, &keep_t, &move |name, v| (name != jj).then_some(v)),
        ));
        let keys: Vec<String> = ckpt
            .json(&j)
            .unwrap()
            .as_object()
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default();
        for k in keys {
            // an absent prompt position is an older checkpoint's, accepted by design
            if k != "prompts" {
                let (jj, kk) = (j.clone(), k.clone());
                out.push((
                    format!("{j}.{k} missing"),
                    rebuild(ckpt, &keep_t, &move |name, mut v| {
                        if name == jj {
                            v.as_object_mut().unwrap().remove(&kk);
                        }
                        Some(v)
                    }),
                ));
            }
            let (jj, kk) = (j.clone(), k.clone());
            out.push((
                format!("{j}.{k} a string"),
                rebuild(ckpt, &keep_t, &move |name, mut v| {
                    if name == jj {
                        v[&kk] = json!("bogus");
                    }
                    Some(v)
                }),
            ));
        }
    }
    // values the constructors refuse, and counters past their range
    let targeted: Vec<(&str, &str, Value)> = vec![
        ("trainer", "iter_count", json!(u64::MAX)),
        ("trainer", "epoch", json!(u64::MAX)),
        ("trainer", "rng", json!(["1", "2", "3"])),
        ("trainer", "rng", json!(["1", "2", "x", "3", "4"])),
        ("trainer", "kl_coef", json!(-1.0)),
        ("trainer", "ref_stats", json!([0.0, -1.0])),
        (
            "trainer",
            "prompts",
            json!({"order": [0, 0, 0, 0], "cursor": 0, "rng": [1, 2, 3, 4]}),
        ),
        ("scheduler", "last_epoch", json!(u64::MAX)),
        ("scheduler", "T_max", json!(5e-324)),
        ("scheduler", "base_lr", json!(-1.0)),
        ("opt", "betas", json!([1.5, 0.9])),
        ("opt", "eps", json!(-1e-8)),
        ("opt", "weight_decay", json!(-0.1)),
        ("opt", "lr", json!(-1.0)),
    ];
    for (j, k, value) in targeted {
        let present = ckpt.json(j).map(|v| v.get(k).is_some()).unwrap_or(false);
        if !present {
            continue;
        }
        out.push((
            format!("{j}.{k} = {value}"),
            rebuild(ckpt, &keep_t, &move |name, mut v| {
                if name == j {
                    v[k] = value.clone();
                }
                Some(v)
            }),
        ));
    }
    // a step count past the limit, and a running variance below 0
    if let Ok(opt) = ckpt.json("opt") {
        if let Some(first) = opt["step"]
            .as_object()
            .and_then(|m| m.keys().next().cloned())
        {
            out.push((
                format!("opt.step.{first} = u64::MAX"),
                rebuild(ckpt, &keep_t, &move |name, mut v| {
                    if name == "opt" {
                        v["step"][&first] = json!(u64::MAX);
                    }
                    Some(v)
                }),
            ));
        }
    }
    if ckpt
        .json("trainer")
        .is_ok_and(|t| t["running_moments"].is_object())
    {
        out.push((
            "trainer.running_moments.var = -1".into(),
            rebuild(ckpt, &keep_t, &|name, mut v| {
                if name == "trainer" {
                    v["running_moments"]["var"] = json!(-1.0);
                }
                Some(v)
            }),
        ));
    }
    out
}

/// Saves `trained`'s checkpoint, loads every corruption of it into `fresh` (each must fail
/// and leave `fresh` bitwise as it was), then the clean checkpoint (which must make `fresh`
/// bitwise `trained`).
fn check_all_or_nothing(name: &str, trained: &dyn RlTrainer, fresh: &mut dyn RlTrainer) {
    let dir = tempdir(name);
    trained.save(&dir.join("clean")).unwrap();
    let ckpt = CheckpointStore::new(dir.join("clean"))
        .load_latest()
        .unwrap()
        .unwrap();
    let before = snapshot(fresh);
    let wanted = snapshot(trained);
    assert!(
        difference(&before, &wanted).is_some(),
        "the fresh trainer must differ from the checkpoint"
    );
    let cases = corruptions(&ckpt);
    assert!(cases.len() > 20, "{}", cases.len());
    for (i, (what, bad)) in cases.iter().enumerate() {
        let case_dir = dir.join(format!("case{i}"));
        CheckpointStore::new(&case_dir).save(bad).unwrap();
        let result = fresh.load(&case_dir);
        assert!(result.is_err(), "{name}: {what}: loaded");
        let msg = result.as_ref().map_err(|e| e.to_string()).unwrap_err();
        if let Some(d) = difference(&before, &snapshot(fresh)) {
            panic!("{name}: {what}: the failed load ({msg}) changed {d}");
        }
        // the error says where: the checkpoint folder and the component
        let component = what.split([':', '.', ' ']).next().unwrap();
        assert!(
            msg.contains(&case_dir.display().to_string()),
            "{name}: {what}: {msg}"
        );
        assert!(
            msg.contains(&format!("{component:?}")),
            "{name}: {what}: {msg}"
        );
    }
    fresh.load(&dir.join("clean")).unwrap();
    assert_eq!(
        difference(&wanted, &snapshot(fresh)),
        None,
        "{name}: clean load"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn ppo_loads_are_all_or_nothing() {
    let dir = tempdir("ppo-run");
    let (_va, mut a) = ppo(&dir, 1);
    a.iteration(&mut Callbacks::new()).unwrap();
    let (_vb, mut b) = ppo(&dir, 2);
    check_all_or_nothing("ppo", &a, &mut b);
}

#[test]
fn grpo_loads_are_all_or_nothing() {
    let dir = tempdir("grpo-run");
    let (_va, mut a) = grpo(&dir, 1);
    a.iteration(&mut Callbacks::new()).unwrap();
    let (_vb, mut b) = grpo(&dir, 2);
    check_all_or_nothing("grpo", &a, &mut b);
}

#[test]
fn dpo_loads_are_all_or_nothing() {
    let dir = tempdir("dpo-run");
    let (_va, mut a) = dpo(&dir, 1);
    a.train_epoch(&mut Callbacks::new()).unwrap();
    let (_vb, mut b) = dpo(&dir, 2);
    check_all_or_nothing("dpo", &a, &mut b);
}

#[test]
fn ilql_loads_are_all_or_nothing() {
    let dir = tempdir("ilql-run");
    let mut a = ilql(&dir, 1);
    a.train_epoch(&mut Callbacks::new()).unwrap();
    let mut b = ilql(&dir, 2);
    check_all_or_nothing("ilql", &a, &mut b);
}

#[test]
fn a_dpo_load_replaces_the_precomputed_reference_log_probs() {
    // before: the cache computed from the fresh trainer's own reference survived the load,
    // so training went on with log-probs of a reference the checkpoint did not hold
    let dir = tempdir("dpo-precompute");
    let (_va, mut a) = dpo_with(&dir, 1, true);
    a.train_epoch(&mut Callbacks::new()).unwrap();
    a.save(&dir.join("ckpt")).unwrap();
    let (_vb, mut b) = dpo_with(&dir, 2, true);
    b.load(&dir.join("ckpt")).unwrap();
    let sa = a.train_epoch(&mut Callbacks::new()).unwrap();
    let sb = b.train_epoch(&mut Callbacks::new()).unwrap();
    assert_eq!(sa, sb);
    assert_eq!(difference(&snapshot(&a), &snapshot(&b)), None);
    let _ = std::fs::remove_dir_all(&dir);
}
