//! Defects the fuzz campaign (`fuzz/`, docs/reliability.md "Fuzz campaign") found in the
//! library, one test each; every test failed before its fix.

use tch::Kind;
use torchrl::specs::Unbounded;

/// Held by the tests that seed and draw from libtorch's global generator (`tch::manual_seed`,
/// `Tensor::randn`, a model built outside `with_init_seed`), so that no other test's draws land
/// between one's seed and its draws. Today that is only
/// `the_fallible_init_draws_the_same_weights`, which compares the unseeded init with
/// `Tensor::randn` on purpose; the other tests seed their models with `with_init_seed` and
/// take no lock.
static GLOBAL_RNG: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// `constructors` (seed 1, case 30): a spec of 2^43 float32 elements is valid, but zeroing it
/// cannot allocate; the error carried libtorch's whole text, C++ frames included. Now only
/// libtorch's first line is shown, inside our error.
#[test]
fn an_allocation_failure_reads_without_cpp_frames() {
    let spec = Unbounded::new().with_shape([1i64 << 43]).unwrap();
    assert_eq!(spec.dtype(), Kind::Float);
    let msg = spec.zero(&[]).unwrap_err().to_string();
    assert!(msg.contains("can't allocate memory"), "{msg}");
    assert!(
        !msg.contains("frame #") && !msg.contains("Exception raised from"),
        "{msg}"
    );
    assert_eq!(msg.lines().count(), 1, "{msg}");
}

fn tempdir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("torchrl-fuzz-reg-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// `config` (seed 7, case 190): a Llama-family `config.json` with a negative
/// `initializer_range` passed `config_from_file`, and the model it describes then failed to
/// build. It is refused at validation now, naming the field and the file.
#[test]
fn a_negative_initializer_range_is_refused_with_the_file() {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("specs/llama/qwen3_head_dim");
    let dir = tempdir("init-range");
    let mut cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(src.join("config.json")).unwrap()).unwrap();
    cfg["initializer_range"] = serde_json::json!(-65536);
    let path = dir.join("config.json");
    std::fs::write(&path, cfg.to_string()).unwrap();
    let Err(err) = torchrl::modules::llm::models::config_from_file(&path) else {
        panic!("a negative initializer_range was accepted");
    };
    let err = err.to_string();
    assert!(
        err.contains("initializer_range") && err.contains(&path.display().to_string()),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// `trainer-config` (seed 7, cases 19, 47, 65, …): a trainer config file whose value is out of
/// range was refused by `validate` with the field but not the file. The file is named now.
#[test]
fn a_trainer_config_file_out_of_range_names_the_file() {
    use torchrl::trainers::config::TrlConfig;
    let dir = tempdir("trl");
    for (name, text) in [
        ("a.toml", "[optimizer.kwargs]\nbetas = [0.9, -2.0]\n"),
        ("b.json", r#"{"train": {"batch_size": 0}}"#),
    ] {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        let err = TrlConfig::from_file(&path).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains(&path.display().to_string()), "{msg}");
        assert!(
            matches!(err.root(), torchrl::Error::InvalidConfig { .. }),
            "{msg}"
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// `checkpoint` (seed 7, cases 105, 277): a trainer checkpoint whose model or reference holds a
/// NaN / inf parameter (or one its dtype overflows) loaded, and the next step failed on a NaN
/// KL. The load refuses it now, naming the component and the tensor, and changes nothing.
#[test]
fn a_trainer_checkpoint_with_non_finite_parameters_is_refused() {
    use tch::nn::VarStore;
    use tch::{Device, Tensor};
    use torchrl::modules::llm::nn::with_init_seed;
    use torchrl::modules::llm::{
        ByteTokenizer, CausalLmWithHydraValueHead, Gpt2Config, TextTokenizer,
    };
    use torchrl::trainers::api::{Callbacks, RlTrainer};
    use torchrl::trainers::checkpoint::{Checkpoint, CheckpointStore};
    use torchrl::trainers::dpo::{DpoPair, DpoTrainer, DpoTrlConfig};

    let dir = tempdir("nan-ckpt");
    let tok = ByteTokenizer::new();
    let model_cfg = Gpt2Config::new(tok.vocab_size())
        .with_n_positions(16)
        .with_n_embd(8)
        .with_n_layer(1)
        .with_n_head(2)
        .with_special_tokens(tok.bos_token_id(), tok.eos_token_id(), tok.pad_token_id());
    let pairs: Vec<DpoPair> = ["ab", "cd"]
        .iter()
        .map(|p| {
            DpoPair::new(
                tok.encode(p).unwrap(),
                tok.encode("a").unwrap(),
                tok.encode("zz").unwrap(),
            )
        })
        .collect();
    let trainer = |seed: u64| {
        let mut c = DpoTrlConfig::default();
        c.train.batch_size = 2;
        c.train.epochs = 10;
        c.train.checkpoint_dir = dir.join("run").display().to_string();
        c.method.gen_kwargs.max_new_tokens = 2;
        let vs = VarStore::new(Device::Cpu);
        let m = with_init_seed(seed, || {
            CausalLmWithHydraValueHead::new(&vs.root(), &model_cfg, -1)
        })
        .unwrap();
        (
            vs,
            DpoTrainer::new(c, m, pairs.clone(), Box::new(ByteTokenizer::new())).unwrap(),
        )
    };
    let (_va, mut a) = trainer(1);
    a.train_epoch(&mut Callbacks::new()).unwrap();
    a.save(&dir.join("clean")).unwrap();
    let ckpt = CheckpointStore::new(dir.join("clean"))
        .load_latest()
        .unwrap()
        .unwrap();
    let (_vb, mut b) = trainer(2);
    let before: Vec<Tensor> = b
        .get_components()
        .iter()
        .flat_map(|(_, c)| c.tensors.iter().map(|(_, t)| t.copy()))
        .collect();
    for (k, value) in [f64::NAN, f64::INFINITY, 1e300].into_iter().enumerate() {
        let mut bad = Checkpoint::new(ckpt.step());
        for g in ckpt.tensor_groups() {
            let mut ts: Vec<(String, Tensor)> = ckpt
                .tensors(g)
                .unwrap()
                .iter()
                .map(|(n, t)| (n.clone(), t.copy()))
                .collect();
            if g == "model" {
                // float64 in the file: 1e300 overflows the parameter's float32
                let t = &ts[0].1;
                ts[0].1 = Tensor::from_slice(&[value])
                    .expand(t.size(), false)
                    .contiguous();
            }
            bad = bad.with_tensors(g, ts);
        }
        for j in ckpt.json_names() {
            bad = bad.with_json(j, ckpt.json(j).unwrap().clone());
        }
        let store = dir.join(format!("bad-{k}"));
        CheckpointStore::new(&store).save(&bad).unwrap();
        let msg = b.load(&store).unwrap_err().to_string();
        assert!(msg.contains("\"model\"") && msg.contains("finite"), "{msg}");
        let after: Vec<Tensor> = b
            .get_components()
            .iter()
            .flat_map(|(_, c)| c.tensors.iter().map(|(_, t)| t.copy()))
            .collect();
        assert_eq!(before.len(), after.len());
        for (x, y) in before.iter().zip(&after) {
            assert!(x.equal(y), "a refused load changed the trainer");
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// `tokenizer` (seed 2026, case 3544): a `tokenizer.json` whose added token is 70,000 bytes
/// long loaded, and then every encode took seconds of CPU (the campaign's 60 s watchdog fired
/// on a loaded machine). Added tokens and vocabulary keys are held to `MAX_PIECE_BYTES` now,
/// like Unigram pieces; the error names the field and the file.
#[test]
fn a_tokenizer_with_a_huge_added_token_is_refused() {
    use torchrl::modules::llm::tokenizer::MAX_PIECE_BYTES;
    use torchrl::modules::llm::HfTokenizer;
    let dir = tempdir("long-added");
    let long = "a".repeat(70_000);
    let word_level = |added: &str, key: &str| {
        format!(
            r#"{{"version":"1.0","truncation":null,"padding":null,"added_tokens":[{{"id":0,"content":"{added}","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true}}],"normalizer":{{"type":"Lowercase"}},"pre_tokenizer":{{"type":"Whitespace"}},"post_processor":null,"decoder":null,"model":{{"type":"WordLevel","vocab":{{"{added}":0,"hello":1,"{key}":2}},"unk_token":"{added}"}}}}"#
        )
    };
    let path = dir.join("tokenizer.json");
    std::fs::write(&path, word_level("[UNK]", "world")).unwrap();
    assert!(HfTokenizer::from_file(&path).is_ok(), "the seed loads");
    for (text, field) in [
        (word_level(&long, "world"), "added_tokens[0]"),
        (
            word_level("[UNK]", &"b".repeat(MAX_PIECE_BYTES + 1)),
            "model.vocab",
        ),
    ] {
        std::fs::write(&path, text).unwrap();
        let Err(err) = HfTokenizer::from_file(&path) else {
            panic!("a {field} over the limit loaded");
        };
        let msg = err.to_string();
        assert!(
            msg.contains(field) && msg.contains(&path.display().to_string()),
            "{msg}"
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// `config` (seed 2026, case 2326): building a model whose weight fits in memory once but not
/// twice panicked inside tch (its normal init scales with a panicking `*`); it is an error
/// now. The build runs in a child process whose address space is capped to about what it has
/// plus 1.5 GiB, so that the first 1 GiB tensor fits and a second does not.
#[test]
fn a_model_too_large_for_memory_is_an_error_not_a_panic() {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let Some(base_kb) = status
        .lines()
        .find_map(|l| l.strip_prefix("VmSize:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
    else {
        return; // not Linux: nothing to cap
    };
    let limit_kb = base_kb + 1536 * 1024;
    let exe = std::env::current_exe().unwrap();
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -v {limit_kb} && exec \"$0\" --ignored --exact oom_child --test-threads 1"
        ))
        .arg(&exe)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("1 passed"), "{text}");
    eprintln!("{text}");
}

#[test]
#[ignore = "run by a_model_too_large_for_memory_is_an_error_not_a_panic, under a memory cap"]
fn oom_child() {
    use torchrl::modules::llm::{Gpt2Config, Gpt2Model};
    // a 1 GiB token embedding (2^18 x 1024 float32)
    let cfg = Gpt2Config::new(1 << 18)
        .with_n_embd(1024)
        .with_n_layer(1)
        .with_n_head(8)
        .with_n_positions(8);
    let vs = tch::nn::VarStore::new(tch::Device::Cpu);
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        Gpt2Model::new(&vs.root(), &cfg).map(|_| ())
    }));
    match result {
        Err(_) => panic!("building the model panicked"),
        Ok(Ok(())) => eprintln!("the cap left room for the model: nothing proven"),
        Ok(Err(e)) => assert!(e.to_string().contains("allocate"), "{e}"),
    }
}

/// The fallible normal init draws what tch's `Init::Randn` drew: seeded models are unchanged.
#[test]
fn the_fallible_init_draws_the_same_weights() {
    // libtorch's global generator, on purpose: the unseeded init against `Tensor::randn`
    let _g = GLOBAL_RNG.lock().unwrap_or_else(|e| e.into_inner());
    use torchrl::modules::llm::{CausalLm, Gpt2Config, Gpt2Model};
    let cfg = Gpt2Config::new(50)
        .with_n_embd(16)
        .with_n_layer(1)
        .with_n_head(2)
        .with_n_positions(8)
        .with_initializer_range(0.02);
    tch::manual_seed(7);
    let expected = tch::Tensor::randn([50, 16], (tch::Kind::Float, tch::Device::Cpu)) * 0.02 + 0.0;
    tch::manual_seed(7);
    let vs = tch::nn::VarStore::new(tch::Device::Cpu);
    let model = Gpt2Model::new(&vs.root(), &cfg).unwrap();
    let wte = model
        .named_parameters()
        .into_iter()
        .find(|(n, _)| n == "transformer.wte.weight")
        .map(|(_, t)| t.shallow_clone())
        .unwrap();
    assert!(wte.equal(&expected));
}

/// `checkpoint` (seed 2028, case 11243): a `manifest.json` whose file list names a component
/// `sche[uler` was refused by `Checkpoint::load` with an argument error naming the component but
/// not the checkpoint. The manifest is the file at fault, and the error names it now.
#[test]
fn a_manifest_with_a_bad_component_name_names_the_manifest() {
    use tch::Tensor;
    use torchrl::trainers::checkpoint::{Checkpoint, CheckpointStore};

    let dir = tempdir("manifest-name");
    let store = CheckpointStore::new(&dir);
    let ckpt = Checkpoint::new(3)
        .with_tensors(
            "scheduler",
            vec![("w".into(), Tensor::from_slice(&[1f32, 2.0]))],
        )
        .with_json("trainer_state", serde_json::json!({ "iter_count": 3 }));
    let folder = store.save(&ckpt).unwrap();
    let manifest = folder.join("manifest.json");
    let text = std::fs::read_to_string(&manifest).unwrap();
    assert!(text.contains("\"scheduler\""), "{text}");
    std::fs::write(&manifest, text.replace("\"scheduler\"", "\"sche[uler\"")).unwrap();
    let err = Checkpoint::load(&folder).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains(&manifest.display().to_string()) && msg.contains("sche[uler"),
        "{msg}"
    );
    assert!(
        matches!(err.root(), torchrl::Error::InvalidFile { .. }),
        "{msg}"
    );
    std::fs::remove_dir_all(&dir).ok();
}
