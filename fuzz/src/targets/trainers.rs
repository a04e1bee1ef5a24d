//! Trainer checkpoints (PPO, DPO): a trained trainer's checkpoint is mutated (a JSON part
//! edited structurally, a tensor dropped / renamed / reshaped / recast / filled with an edge
//! value, saved again as a well-formed checkpoint with valid hashes; or a saved file's bytes
//! edited, which the manifest's hashes must catch) and loaded into another trainer: an `Err`
//! must name the checkpoint folder and leave the trainer bitwise unchanged; an `Ok` must be
//! followed by a working training step.

use std::path::Path;

use serde_json::Value;
use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};
use torchrl::envs::llm::{TokenEnv, TokenEnvConfig, TokenScorer};
use torchrl::modules::llm::{ByteTokenizer, CausalLmWithHydraValueHead, Gpt2Config, TextTokenizer};
use torchrl::tch;
use torchrl::trainers::api::{Callbacks, RlTrainer};
use torchrl::trainers::checkpoint::{Checkpoint, CheckpointStore};
use torchrl::trainers::config::{GenKwargs, ScaleReward, TrlConfig};
use torchrl::trainers::dpo::{DpoPair, DpoTrainer, DpoTrlConfig};
use torchrl::trainers::ppo::PpoRlhfTrainer;

use super::{Outcome, State, bits, named_err};
use crate::mutate::{EDGE_FLOATS, Rng, mutate_bytes, mutate_json};

const NEW: i64 = 3;

pub struct TrainerSeeds {
    ppo_ckpt: Checkpoint,
    ppo: (VarStore, PpoRlhfTrainer),
    dpo_ckpt: Checkpoint,
    dpo: (VarStore, DpoTrainer),
    pairs: Vec<DpoPair>,
}

fn cfg(n_layer: i64) -> Gpt2Config {
    let tok = ByteTokenizer::new();
    Gpt2Config::new(tok.vocab_size())
        .with_n_positions(16)
        .with_n_embd(8)
        .with_n_layer(n_layer)
        .with_n_head(2)
        .with_special_tokens(tok.bos_token_id(), tok.eos_token_id(), tok.pad_token_id())
}

fn hydra(seed: i64, unfrozen: i64) -> (VarStore, CausalLmWithHydraValueHead) {
    tch::manual_seed(seed);
    let vs = VarStore::new(Device::Cpu);
    let m = CausalLmWithHydraValueHead::new(&vs.root(), &cfg(2), unfrozen).expect("model");
    (vs, m)
}

fn env() -> TokenEnv {
    let tok = ByteTokenizer::new();
    let env_cfg = TokenEnvConfig::for_model(&cfg(2).facts())
        .with_max_new_tokens(NEW)
        .with_batch_size(4)
        .with_prompt_width(3);
    let scorer = TokenScorer::new(|_p: &[i64], r: &[i64]| {
        r.iter().filter(|t| (97..=122).contains(*t)).count() as f64
    });
    TokenEnv::from_text(env_cfg, &tok, &["ab", "cd", "efg", "h"], Box::new(scorer)).expect("env")
}

fn ppo(dir: &Path, seed: i64) -> (VarStore, PpoRlhfTrainer) {
    let mut c = TrlConfig::default();
    c.train.batch_size = 4;
    c.train.epochs = 1000;
    c.train.eval_interval = 100_000;
    c.train.checkpoint_interval = 100_000;
    c.train.checkpoint_dir = dir.display().to_string();
    c.train.seed = 5;
    c.optimizer.kwargs.lr = 1e-3;
    c.method.num_rollouts = 4;
    c.method.chunk_size = 4;
    c.method.ppo_epochs = 1;
    c.method.target = Some(0.5);
    c.method.scale_reward = ScaleReward::Running;
    c.method.gen_kwargs = GenKwargs {
        max_new_tokens: NEW as usize,
        top_k: 0,
        top_p: 1.0,
        do_sample: true,
        temperature: 1.0,
    };
    let (vs, m) = hydra(seed, 1);
    let t = PpoRlhfTrainer::new(c, m, env(), Box::new(ByteTokenizer::new())).expect("ppo trainer");
    (vs, t)
}

fn dpo(dir: &Path, seed: i64, pairs: Vec<DpoPair>) -> (VarStore, DpoTrainer) {
    let mut c = DpoTrlConfig::default();
    c.train.batch_size = 2;
    c.train.eval_interval = 100_000;
    c.train.checkpoint_interval = 100_000;
    c.train.checkpoint_dir = dir.display().to_string();
    c.train.epochs = 100_000;
    c.train.seed = 9;
    c.optimizer.kwargs.lr = 3e-3;
    c.scheduler.kwargs.eta_min = 3e-3;
    c.method.gen_kwargs.max_new_tokens = NEW as usize;
    let (vs, m) = hydra(seed, -1);
    let t = DpoTrainer::new(c, m, pairs, Box::new(ByteTokenizer::new())).expect("dpo trainer");
    (vs, t)
}

impl TrainerSeeds {
    fn new(work: &Path) -> Self {
        let tok = ByteTokenizer::new();
        let pairs: Vec<DpoPair> = ["ab", "cd", "efg", "h"]
            .iter()
            .map(|p| {
                DpoPair::new(
                    tok.encode(p).expect("enc"),
                    tok.encode("a").expect("enc"),
                    tok.encode("zz").expect("enc"),
                )
            })
            .collect();
        let dir = work.join("trainer-seeds");
        let (_va, mut a) = ppo(&dir.join("ppo-run"), 1);
        a.iteration(&mut Callbacks::new()).expect("a PPO iteration");
        a.save(&dir.join("ppo")).expect("save");
        let ppo_ckpt = CheckpointStore::new(dir.join("ppo"))
            .load_latest()
            .expect("load")
            .expect("a checkpoint");
        let (_vd, mut d) = dpo(&dir.join("dpo-run"), 1, pairs.clone());
        d.train_epoch(&mut Callbacks::new()).expect("a DPO epoch");
        d.save(&dir.join("dpo")).expect("save");
        let dpo_ckpt = CheckpointStore::new(dir.join("dpo"))
            .load_latest()
            .expect("load")
            .expect("a checkpoint");
        TrainerSeeds {
            ppo_ckpt,
            ppo: ppo(&dir.join("ppo-target"), 2),
            dpo_ckpt,
            dpo: dpo(&dir.join("dpo-target"), 2, pairs.clone()),
            pairs,
        }
    }
}

type Snapshot = Vec<(String, Vec<(String, Tensor)>, Value)>;

fn snapshot(t: &dyn RlTrainer) -> Snapshot {
    t.get_components()
        .into_iter()
        .map(|(name, c)| {
            (
                name,
                c.tensors
                    .iter()
                    .map(|(n, t)| (n.clone(), bits(t)))
                    .collect(),
                c.state,
            )
        })
        .collect()
}

fn difference(a: &Snapshot, b: &Snapshot) -> Option<String> {
    if a.len() != b.len() {
        return Some("component count".into());
    }
    for ((na, ta, sa), (nb, tb, sb)) in a.iter().zip(b) {
        if na != nb || sa != sb || ta.len() != tb.len() {
            return Some(format!("component {na}: state or tensor list"));
        }
        for ((xa, va), (xb, vb)) in ta.iter().zip(tb) {
            if xa != xb || va.size() != vb.size() || va.kind() != vb.kind() || !va.equal(vb) {
                return Some(format!("component {na}: tensor {xa}"));
            }
        }
    }
    None
}

/// A checkpoint rebuilt from `ckpt` with one structural mutation.
fn mutated(ckpt: &Checkpoint, rng: &mut Rng) -> (Checkpoint, String) {
    let mut desc = String::new();
    let groups: Vec<String> = ckpt.tensor_groups().iter().map(|s| s.to_string()).collect();
    let jsons: Vec<String> = ckpt.json_names().iter().map(|s| s.to_string()).collect();
    let edit_json = rng.chance(0.55) && !jsons.is_empty();
    let target_json = if edit_json {
        Some(rng.pick(&jsons).clone())
    } else {
        None
    };
    let target_group = if !edit_json && !groups.is_empty() {
        Some(rng.pick(&groups).clone())
    } else {
        None
    };
    let drop_part = rng.below(20) == 0;
    let step = if rng.below(30) == 0 {
        rng.next()
    } else {
        ckpt.step()
    };
    let mut out = Checkpoint::new(step);
    for g in &groups {
        let mut ts: Vec<(String, Tensor)> = ckpt
            .tensors(g)
            .map(|t| t.iter().map(|(n, t)| (n.clone(), t.copy())).collect())
            .unwrap_or_default();
        if target_group.as_deref() == Some(g.as_str()) {
            if drop_part {
                desc = format!("group {g} dropped");
                continue;
            }
            if !ts.is_empty() {
                let i = rng.below(ts.len());
                let op = rng.below(8);
                desc = format!("group {g}, tensor {} ({}), edit {op}", ts[i].0, i);
                match op {
                    0 => {
                        let _ = ts.remove(i);
                    }
                    1 => ts[i].0.push_str(".x"),
                    2 => {
                        let n = ts[i].1.numel() as i64;
                        ts[i].1 = Tensor::zeros([n + 1], (ts[i].1.kind(), Device::Cpu));
                    }
                    3 => {
                        ts[i].1 = ts[i].1.to_kind(*rng.pick(&[
                            Kind::Double,
                            Kind::Half,
                            Kind::Int64,
                            Kind::Bool,
                        ]))
                    }
                    4 | 5 => {
                        let v = if op == 4 {
                            *rng.pick(&[f64::NAN, f64::INFINITY, -1.0, 1e30])
                        } else {
                            *rng.pick(EDGE_FLOATS)
                        };
                        desc += &format!(" = {v:e}");
                        // cast, not a Scalar fill: tch's scalar conversion panics on a value
                        // the dtype cannot hold (in this harness, not the library)
                        let size = ts[i].1.size();
                        let filled = Tensor::from_slice(&[v])
                            .f_to_kind(ts[i].1.kind())
                            .and_then(|t| t.f_expand(size.as_slice(), false))
                            .and_then(|t| t.f_contiguous());
                        if let Ok(t) = filled {
                            ts[i].1 = t;
                        }
                    }
                    6 => {
                        let t = ts[i].1.copy();
                        ts.push((format!("{}.dup", ts[i].0), t));
                    }
                    _ => ts[i].1 = ts[i].1.reshape([-1]),
                }
            }
        }
        out = out.with_tensors(g.clone(), ts);
    }
    for j in &jsons {
        let v = ckpt.json(j).cloned().unwrap_or(Value::Null);
        if target_json.as_deref() == Some(j.as_str()) {
            if drop_part {
                desc = format!("json {j} dropped");
                continue;
            }
            let m = mutate_json(rng, &v);
            desc = format!("json {j}: {}", crate::one_line(&m.to_string()));
            out = out.with_json(j.clone(), m);
        } else {
            out = out.with_json(j.clone(), v);
        }
    }
    if step != ckpt.step() {
        desc += &format!("; step {step}");
    }
    (out, desc)
}

pub fn checkpoint_case(st: &mut State, rng: &mut Rng) -> Outcome {
    if st.trainers.is_none() {
        st.trainers = Some(TrainerSeeds::new(&st.work));
    }
    let dir = st.case_dir();
    let store_dir = dir.join("store");
    let use_ppo = rng.chance(0.5);
    let seeds = st.trainers.as_mut().expect("set above");
    let ckpt = if use_ppo {
        &seeds.ppo_ckpt
    } else {
        &seeds.dpo_ckpt
    };
    let byte_edit = rng.below(5) == 0;
    let (bad, desc) = mutated(ckpt, rng);
    let to_save = if byte_edit { ckpt } else { &bad };
    let folder = match CheckpointStore::new(&store_dir).save(to_save) {
        Ok(f) => f,
        // a mutated checkpoint that cannot even be written (e.g. a tensor name the format
        // refuses) is refused with a named error on the writing side
        Err(e) => return named_err(e.to_string(), &store_dir, &[]),
    };
    if byte_edit {
        let mut files: Vec<_> = std::fs::read_dir(&folder)
            .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect())
            .unwrap_or_default();
        files.sort();
        if !files.is_empty() {
            let f = rng.pick(&files).clone();
            if let Ok(bytes) = std::fs::read(&f) {
                let _ = std::fs::write(&f, mutate_bytes(rng, &bytes));
            }
        }
    }
    let trainer: &mut dyn RlTrainer = if use_ppo {
        &mut seeds.ppo.1
    } else {
        &mut seeds.dpo.1
    };
    let before = snapshot(trainer);
    match trainer.load(&store_dir) {
        Err(e) => {
            if let Some(d) = difference(&before, &snapshot(trainer)) {
                return Outcome::Defect(
                    "half-written",
                    format!("{d} changed by a failed load ({desc}): {e}"),
                );
            }
            named_err(e.to_string(), &store_dir, &[])
        }
        Ok(()) => {
            // usable: a training step runs
            let step = if use_ppo {
                seeds.ppo.1.iteration(&mut Callbacks::new()).map(|_| ())
            } else {
                let pairs = seeds.pairs[..2].to_vec();
                seeds.dpo.1.step(&pairs).map(|_| ())
            };
            match step {
                Ok(()) => Outcome::Ok,
                // finite but absurd values (1e30 weights) are data a loader cannot refuse;
                // the step must then say that its numbers went non-finite, not crash
                Err(e) if e.to_string().contains("finite") => Outcome::OkNonFinite,
                Err(e) => Outcome::Defect(
                    "unusable",
                    format!("a step after an accepted load ({desc}): {e}"),
                ),
            }
        }
    }
}
