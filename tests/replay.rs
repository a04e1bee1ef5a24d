//! Replay (issue 25, item 5): the prioritized sampler against TorchRL 0.14.1's
//! `TensorDictPrioritizedReplayBuffer` (`specs/replay_cases.json`, recorded by
//! `specs/record_replay.py`: every stored index's importance weight and sampling probability
//! after extends and priority updates), `extend` splitting the first dim only, and the error
//! for a batch with other keys.

use serde_json::Value;
use tch::{Device, Kind, Tensor};
use torchrl::data::replay::{PrioritizedSampler, RandomSampler, ReplayBuffer};
use torchrl::tensordict::Strict;
use torchrl::TensorDict;

fn load() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/specs/replay_cases.json");
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path} is not JSON: {e}"))
}

fn xs(start: i64, n: i64) -> TensorDict {
    let x = Tensor::arange_start(start, start + n, (Kind::Float, Device::Cpu));
    TensorDict::new([n]).unwrap().with("x", x).unwrap()
}

fn replay(c: &Value) -> Result<(), String> {
    let f = |k: &str| c[k].as_f64().ok_or(k.to_string());
    let cap = c["capacity"].as_i64().ok_or("capacity")?;
    let sampler = PrioritizedSampler::new(cap, f("alpha")?, f("beta")?)
        .map_err(|e| e.to_string())?
        .with_eps(f("eps")?)
        .with_seed(3);
    let mut rb = ReplayBuffer::with_sampler(cap, sampler).map_err(|e| e.to_string())?;
    let mut counter = 0;
    for op in c["ops"].as_array().ok_or("ops")? {
        if let Some(n) = op["extend"].as_i64() {
            rb.extend(&xs(counter, n)).map_err(|e| e.to_string())?;
            counter += n;
        } else {
            let u = &op["update_priority"];
            let idx: Vec<i64> = u[0]
                .as_array()
                .ok_or("idx")?
                .iter()
                .filter_map(Value::as_i64)
                .collect();
            let p: Vec<f64> = u[1]
                .as_array()
                .ok_or("p")?
                .iter()
                .filter_map(Value::as_f64)
                .collect();
            rb.update_priority(&idx, &p).map_err(|e| e.to_string())?;
        }
    }
    let e = &c["expect"];
    let n = e["len"].as_i64().ok_or("len")?;
    if rb.len() != n {
        return Err(format!("len {} vs {n}", rb.len()));
    }
    let stored = rb.storage().map_err(|e| e.to_string())?.ok_or("empty")?;
    let got_x = Vec::<f32>::try_from(stored.get("x").ok_or("x")?).map_err(|e| e.to_string())?;
    let want_x: Vec<f32> = e["stored_x"]
        .as_array()
        .ok_or("x")?
        .iter()
        .filter_map(Value::as_f64)
        .map(|v| v as f32)
        .collect();
    if got_x != want_x {
        return Err(format!("stored {got_x:?} vs {want_x:?}"));
    }
    let dp = e["default_priority"].as_f64().ok_or("dp")?;
    if (rb.sampler().default_priority() - dp).abs() > 1e-6 {
        return Err(format!(
            "default priority {} vs {dp}",
            rb.sampler().default_priority()
        ));
    }
    let weights: Vec<f64> = e["weights"]
        .as_array()
        .ok_or("w")?
        .iter()
        .map(|w| w.as_f64().unwrap_or(f64::NAN))
        .collect();
    let probs: Vec<f64> = e["probs"]
        .as_array()
        .ok_or("p")?
        .iter()
        .filter_map(Value::as_f64)
        .collect();
    let draws = 20_000;
    let s = rb.sample(draws).map_err(|e| e.to_string())?;
    let index = s.get("index").ok_or("no index")?;
    let w = s.get("priority_weight").ok_or("no priority_weight")?;
    if index.kind() != Kind::Int64 || w.kind() != Kind::Float {
        return Err(format!("dtypes {:?} / {:?}", index.kind(), w.kind()));
    }
    let index = Vec::<i64>::try_from(index).map_err(|e| e.to_string())?;
    let w = Vec::<f32>::try_from(w).map_err(|e| e.to_string())?;
    let mut counts = vec![0usize; n as usize];
    for (i, wi) in index.iter().zip(&w) {
        let want = weights
            .get(*i as usize)
            .copied()
            .ok_or(format!("index {i} out of range"))?;
        if (f64::from(*wi) - want).abs() > 1e-6 * want.abs().max(1.0) {
            return Err(format!("index {i}: weight {wi}, TorchRL {want}"));
        }
        counts[*i as usize] += 1;
    }
    for (i, (cnt, p)) in counts.iter().zip(&probs).enumerate() {
        let freq = *cnt as f64 / draws as f64;
        // binomial standard deviation at 20k draws is below 0.0036: 5 sigma
        if (freq - p).abs() > 0.018 {
            return Err(format!(
                "index {i}: frequency {freq}, TorchRL probability {p}"
            ));
        }
    }
    Ok(())
}

#[test]
fn prioritized_weights_and_probabilities_match_torchrl() {
    let root = load();
    let cases = root["cases"].as_array().expect("cases");
    assert!(cases.len() >= 6);
    let failures: Vec<String> = cases
        .iter()
        .filter_map(|c| replay(c).err().map(|e| format!("{}: {e}", c["name"])))
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn prioritized_refusals_and_tensordict_update() {
    assert!(PrioritizedSampler::new(0, 1.0, 1.0).is_err());
    assert!(PrioritizedSampler::new(4, -0.1, 1.0).is_err());
    assert!(PrioritizedSampler::new(4, 1.0, -1.0).is_err());
    let mut rb =
        ReplayBuffer::with_sampler(4, PrioritizedSampler::new(4, 1.0, 1.0).unwrap()).unwrap();
    rb.extend(&xs(0, 4)).unwrap();
    assert!(rb.update_priority(&[9], &[1.0]).is_err()); // beyond the capacity
    assert!(rb.update_priority(&[0, 1], &[1.0, 2.0, 3.0]).is_err()); // lengths differ
    assert!(rb.update_priority(&[0], &[f64::NAN]).is_err());
    // update from a sampled tensordict's "index" and "td_error": index 2 gets 8, the others 1
    let s = rb.sample(16).unwrap();
    let idx = Vec::<i64>::try_from(s.get("index").unwrap()).unwrap();
    let err: Vec<f32> = idx
        .iter()
        .map(|i| if *i == 2 { 8.0 } else { 1.0 })
        .collect();
    let mut td = s.clone();
    td.set("td_error", Tensor::from_slice(&err)).unwrap();
    rb.update_tensordict_priority(&td, "td_error").unwrap();
    // the sample may have missed index 2: set it directly as well; now it weighs (8/1)^-1
    rb.update_priority(&[2], &[8.0]).unwrap();
    let s = rb.sample(200).unwrap();
    let idx = Vec::<i64>::try_from(s.get("index").unwrap()).unwrap();
    let w = Vec::<f32>::try_from(s.get("priority_weight").unwrap()).unwrap();
    for (i, w) in idx.iter().zip(&w) {
        let want = if *i == 2 { 0.125 } else { 1.0 };
        assert!((w - want).abs() < 1e-6, "index {i}: {w}");
    }
    // a new item gets the default priority: the largest given, 8
    rb.extend(&xs(10, 1)).unwrap();
    assert_eq!(rb.sampler().default_priority(), 8.0);
    // clear forgets the priorities
    rb.clear();
    assert_eq!(rb.sampler().default_priority(), 1.0);
}

#[test]
fn prioritized_trajectory_items_carry_expanded_index_and_weight() {
    let mut rb =
        ReplayBuffer::with_sampler(3, PrioritizedSampler::new(3, 1.0, 1.0).unwrap()).unwrap();
    let td = TensorDict::new([2, 5])
        .unwrap()
        .with("obs", Tensor::zeros([2, 5, 3], (Kind::Float, Device::Cpu)))
        .unwrap();
    rb.extend(&td).unwrap(); // two items of [5]
    let s = rb.sample(4).unwrap();
    assert_eq!(s.batch_size(), &[4, 5]);
    assert_eq!(s.get("index").unwrap().size(), vec![4, 5]);
    assert_eq!(s.get("priority_weight").unwrap().size(), vec![4, 5]);
}

#[test]
fn extend_with_other_keys_is_refused_naming_both_sides() {
    let mut rb = ReplayBuffer::with_sampler(10, RandomSampler::new(0)).unwrap();
    let policy_batch = xs(0, 3)
        .with(
            "action_log_prob",
            Tensor::zeros([3], (Kind::Float, Device::Cpu)),
        )
        .unwrap();
    rb.extend(&policy_batch).unwrap();
    let random_batch = xs(3, 2);
    let err = rb.extend(&random_batch).unwrap_err().to_string();
    assert!(err.contains("ReplayBuffer"), "{err}");
    assert!(
        err.contains("only in the buffer: [\"action_log_prob\"]"),
        "{err}"
    );
    assert!(err.contains("select"), "{err}");
    assert_eq!(rb.len(), 3); // nothing written
                             // the other way round: the batch's extra keys are named; select fixes it
    let mut rb2 = ReplayBuffer::new(10).unwrap();
    rb2.extend(&random_batch).unwrap();
    let err = rb2.extend(&policy_batch).unwrap_err().to_string();
    assert!(
        err.contains("only in the batch: [\"action_log_prob\"]"),
        "{err}"
    );
    rb2.extend(&policy_batch.select(&["x"], Strict::No).unwrap())
        .unwrap();
    assert_eq!(rb2.len(), 5);
}

/// Transitions of trajectories with the given lengths: `traj` (the trajectory's number),
/// `step` (0.. within it), and `("next", "done")` set on each last step.
fn trajectories(lengths: &[i64], id_key: Option<&str>) -> TensorDict {
    let (mut traj, mut step, mut done) = (Vec::new(), Vec::new(), Vec::new());
    for (k, l) in lengths.iter().enumerate() {
        for j in 0..*l {
            traj.push(k as i64);
            step.push(j);
            done.push(j + 1 == *l);
        }
    }
    let n = traj.len() as i64;
    let mut td = TensorDict::new([n])
        .unwrap()
        .with("traj", Tensor::from_slice(&traj))
        .unwrap()
        .with("step", Tensor::from_slice(&step))
        .unwrap()
        .with(("next", "done"), Tensor::from_slice(&done).unsqueeze(-1))
        .unwrap();
    match id_key {
        Some("episode") => td.set("episode", Tensor::from_slice(&traj)).unwrap(),
        Some(_) => td
            .set(
                ("collector", "traj_ids"),
                Tensor::from_slice(&traj).unsqueeze(-1),
            )
            .unwrap(),
        None => {}
    }
    td
}

/// Checks that `s` is `num` slices of `len` consecutive steps of one trajectory each, none from
/// a trajectory shorter than `len`; returns the trajectories drawn.
fn check_slices(s: &TensorDict, num: usize, len: usize, lengths: &[i64]) -> Vec<i64> {
    let traj = Vec::<i64>::try_from(s.get("traj").unwrap()).unwrap();
    let step = Vec::<i64>::try_from(s.get("step").unwrap()).unwrap();
    assert_eq!(traj.len(), num * len);
    let mut drawn = Vec::new();
    for k in 0..num {
        let t = &traj[k * len..(k + 1) * len];
        let st = &step[k * len..(k + 1) * len];
        assert!(
            t.iter().all(|x| *x == t[0]),
            "slice {k} mixes trajectories: {t:?}"
        );
        assert!(
            lengths[t[0] as usize] >= len as i64,
            "trajectory {} is too short",
            t[0]
        );
        assert!(
            (1..len).all(|j| st[j] == st[0] + j as i64),
            "slice {k} not contiguous: {st:?}"
        );
        assert!(st[len - 1] < lengths[t[0] as usize]);
        drawn.push(t[0]);
    }
    drawn
}

#[test]
fn slice_sampler_by_traj_ids_episode_and_end_key() {
    use torchrl::data::replay::SliceSampler;
    let lengths = [7, 2, 5, 3, 9];
    for key in [Some("collector"), Some("episode"), None] {
        let mut rb =
            ReplayBuffer::with_sampler(100, SliceSampler::with_slice_len(4).unwrap().with_seed(5))
                .unwrap();
        rb.extend(&trajectories(&lengths, key)).unwrap();
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..30 {
            let s = rb.sample(12).unwrap(); // 3 slices of 4
            assert_eq!(s.batch_size(), &[12]);
            seen.extend(check_slices(&s, 3, 4, &lengths));
        }
        // the three trajectories of 4 steps or more are all drawn; 1 and 3 never
        assert_eq!(
            seen.into_iter().collect::<Vec<_>>(),
            vec![0, 2, 4],
            "{key:?}"
        );
    }
    // num_slices: 2 slices of batch/2 steps
    let mut rb =
        ReplayBuffer::with_sampler(100, SliceSampler::with_num_slices(2).unwrap()).unwrap();
    rb.extend(&trajectories(&lengths, Some("collector")))
        .unwrap();
    check_slices(&rb.sample(10).unwrap(), 2, 5, &lengths);
    // the batch must divide evenly, and some trajectory must be long enough
    assert!(rb
        .sample(7)
        .unwrap_err()
        .to_string()
        .contains("divisible by the number of slices"));
    assert!(rb
        .sample(20)
        .unwrap_err()
        .to_string()
        .contains("no stored trajectory has 10 steps"));
    assert!(SliceSampler::with_slice_len(0).is_err());
    // no trajectory information at all
    let mut rb = ReplayBuffer::with_sampler(10, SliceSampler::with_slice_len(2).unwrap()).unwrap();
    rb.extend(&xs(0, 4)).unwrap();
    let err = rb.sample(4).unwrap_err().to_string();
    assert!(err.contains("traj_ids") && err.contains("done"), "{err}");
}

fn mixed(start: i64, n: i64) -> TensorDict {
    let x = Tensor::arange_start(start, start + n, (Kind::Int64, Device::Cpu));
    TensorDict::new([n])
        .unwrap()
        .with("x", x.shallow_clone())
        .unwrap()
        .with(
            ("next", "obs"),
            x.to_kind(Kind::Float).unsqueeze(-1).repeat([1, 3]) * 0.5,
        )
        .unwrap()
        .with(("next", "done"), x.remainder(3).eq(0).unsqueeze(-1))
        .unwrap()
        .with("value", x.to_kind(Kind::Double) / 7.0)
        .unwrap()
}

fn temp_dir(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("torchrl_replay_{tag}_{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn same(a: &TensorDict, b: &TensorDict) {
    let mut ka = a.keys(torchrl::tensordict::KeysOptions::nested_leaves());
    let mut kb = b.keys(torchrl::tensordict::KeysOptions::nested_leaves());
    ka.sort();
    kb.sort();
    assert_eq!(ka, kb);
    assert_eq!(a.batch_size(), b.batch_size());
    for k in ka {
        let (x, y) = (a.get(&k).unwrap(), b.get(&k).unwrap());
        assert_eq!(x.kind(), y.kind(), "{k}");
        assert!(x.equal(y), "{k}: {x} vs {y}");
    }
}

#[test]
fn memmap_storage_matches_memory_and_survives_a_restart() {
    let dir = temp_dir("restart");
    let mut mem = ReplayBuffer::with_sampler(7, RandomSampler::new(4)).unwrap();
    {
        let mut disk = ReplayBuffer::with_memmap(7, RandomSampler::new(4), &dir).unwrap();
        // lazy: nothing but the folder before the first batch
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
        assert!(disk.storage().unwrap().is_none());
        for (s, n) in [(0, 4), (4, 5)] {
            assert_eq!(
                disk.extend(&mixed(s, n)).unwrap(),
                mem.extend(&mixed(s, n)).unwrap()
            );
        }
        assert!(dir.join("meta.json").exists());
        same(
            &disk.storage().unwrap().unwrap(),
            &mem.storage().unwrap().unwrap(),
        );
        // same seed, same indices: the same samples
        same(&disk.sample(10).unwrap(), &mem.sample(10).unwrap());
        // other keys are refused, naming the buffer
        let err = disk.extend(&xs(0, 2)).unwrap_err().to_string();
        assert!(
            err.contains("ReplayBuffer") && err.contains("select"),
            "{err}"
        );
        disk.memmap_storage().unwrap().flush().unwrap();
    }
    // reopened after a "restart": same items, length and cursor; writing continues in place
    let mut disk = ReplayBuffer::with_memmap(7, RandomSampler::new(9), &dir).unwrap();
    assert_eq!(disk.len(), 7);
    same(
        &disk.storage().unwrap().unwrap(),
        &mem.storage().unwrap().unwrap(),
    );
    assert_eq!(
        disk.extend(&mixed(100, 2)).unwrap(),
        mem.extend(&mixed(100, 2)).unwrap()
    );
    same(
        &disk.storage().unwrap().unwrap(),
        &mem.storage().unwrap().unwrap(),
    );
    let x = Vec::<i64>::try_from(disk.storage().unwrap().unwrap().get("x").unwrap()).unwrap();
    assert_eq!(x, vec![7, 8, 100, 101, 4, 5, 6]);
    // another capacity on the same folder is refused
    let err = ReplayBuffer::with_memmap(8, RandomSampler::new(0), &dir)
        .unwrap_err()
        .to_string();
    assert!(err.contains("capacity 7"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn memmap_storage_with_trajectory_items_slices_and_priorities() {
    use torchrl::data::replay::SliceSampler;
    // items of [5] steps (a [2, 5] batch is two items)
    let dir = temp_dir("items");
    let mut rb = ReplayBuffer::with_memmap(4, RandomSampler::new(0), &dir).unwrap();
    let td = TensorDict::new([2, 5])
        .unwrap()
        .with(
            "obs",
            Tensor::arange(30, (Kind::Float, Device::Cpu)).reshape([2, 5, 3]),
        )
        .unwrap();
    rb.extend(&td).unwrap();
    let s = rb.storage().unwrap().unwrap();
    assert_eq!(s.batch_size(), &[2, 5]);
    assert!(s.get("obs").unwrap().equal(td.get("obs").unwrap()));
    assert_eq!(rb.sample(3).unwrap().batch_size(), &[3, 5]);
    let _ = std::fs::remove_dir_all(&dir);
    // a slice sampler reads its trajectory keys from disk
    let dir = temp_dir("slices");
    let lengths = [7, 2, 5, 3, 9];
    let mut rb =
        ReplayBuffer::with_memmap(50, SliceSampler::with_slice_len(4).unwrap(), &dir).unwrap();
    rb.extend(&trajectories(&lengths, Some("collector")))
        .unwrap();
    for _ in 0..10 {
        check_slices(&rb.sample(8).unwrap(), 2, 4, &lengths);
    }
    let _ = std::fs::remove_dir_all(&dir);
    // a prioritized sampler over a disk storage carries index and weights
    let dir = temp_dir("prio");
    let mut rb =
        ReplayBuffer::with_memmap(8, PrioritizedSampler::new(8, 1.0, 1.0).unwrap(), &dir).unwrap();
    rb.extend(&xs(0, 4)).unwrap();
    rb.update_priority(&[0, 1, 2, 3], &[1.0, 1.0, 1.0, 4.0])
        .unwrap();
    let s = rb.sample(32).unwrap();
    let idx = Vec::<i64>::try_from(s.get("index").unwrap()).unwrap();
    let x = Vec::<f32>::try_from(s.get("x").unwrap()).unwrap();
    let w = Vec::<f32>::try_from(s.get("priority_weight").unwrap()).unwrap();
    for ((i, x), w) in idx.iter().zip(&x).zip(&w) {
        assert_eq!(*i as f32, *x); // item i holds x = i
        assert!((w - if *i == 3 { 0.25 } else { 1.0 }).abs() < 1e-6);
    }
    // reopened: the items are back with the default priority
    drop(rb);
    let rb =
        ReplayBuffer::with_memmap(8, PrioritizedSampler::new(8, 1.0, 1.0).unwrap(), &dir).unwrap();
    assert_eq!(rb.len(), 4);
    let _ = std::fs::remove_dir_all(&dir);
}
