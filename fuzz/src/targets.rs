//! The targets: what each case feeds torchrl and the four properties it checks (no panic /
//! abort / hang, checked by the driver; `Ok` or a named `Err`; an `Err` leaves its target
//! unchanged; an `Ok` is usable).

use std::path::{Path, PathBuf};

use serde_json::Value;
use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};
use torchrl::envs::builtin::{CartPoleEnv, PendulumEnv};
use torchrl::modules::llm::lora;
use torchrl::modules::llm::{
    CausalLm, GenerateOptions, GenerationConfig, Gpt2Config, Gpt2Model, HfTokenizer, KvCache,
    LmInput, SpecialTokens, TextTokenizer, generate, generate_greedy, models,
};
use torchrl::specs::{
    Binary, Bounded, Categorical, Composite, MultiCategorical, MultiOneHot, OneHot, Unbounded,
};
use torchrl::tch;
use torchrl::trainers::config::{TrlConfig, TrlConfigOf};
use torchrl::trainers::dpo::DpoTrlConfig;
use torchrl::trainers::grpo::GrpoTrlConfig;
use torchrl::trainers::ilql::IlqlTrlConfig;
use torchrl::{EnvBase, Generator, TensorDict};

use crate::mutate::{
    EDGE_FLOATS, EDGE_INTS, Rng, mutate_bytes, mutate_json_text, mutate_safetensors_header,
    mutate_toml_text,
};

mod chat;
mod dataset;
mod replay;
mod trainers;

/// What a case found.
pub enum Outcome {
    /// Accepted, and usable.
    Ok,
    /// Accepted (finite but extreme values), and its use stopped with a named error saying
    /// the numbers went non-finite: a pass.
    OkNonFinite,
    /// Refused with a named error (the message).
    Err(String),
    /// A property broken: the class and what happened.
    Defect(&'static str, String),
}

pub type CaseFn = fn(&mut State, &mut Rng) -> Outcome;

/// The targets, by name.
pub const TARGETS: &[(&str, CaseFn)] = &[
    ("tensordict", tensordict_case),
    ("weights", weights_case),
    ("config", config_case),
    ("generation-config", generation_config_case),
    ("tokenizer", tokenizer_case),
    ("sharded", sharded_case),
    ("checkpoint", trainers::checkpoint_case),
    ("trainer-config", trainer_config_case),
    ("constructors", constructors_case),
    ("peft-adapter", adapter_case),
    ("chat-template", chat::chat_template_case),
    ("dataset", dataset::dataset_case),
    ("replay-storage", replay::replay_storage_case),
];

/// The repository's recorded folders (`specs/`).
fn specs_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("specs")
}

/// A model folder used as a seed, and a model of its shape whose weights the cases try to
/// overwrite (the all-or-nothing target).
pub struct ModelSeed {
    pub dir: PathBuf,
    pub files: Vec<(String, Vec<u8>)>,
    pub _vs: VarStore,
    pub model: Box<dyn CausalLm>,
}

/// Per-child state, built lazily (a panic drops it; the next case builds it again).
pub struct State {
    pub work: PathBuf,
    case_no: u64,
    models: Option<Vec<ModelSeed>>,
    sharded: Option<ModelSeed>,
    tds: Option<Vec<Vec<u8>>>,
    tokenizers: Option<Vec<Vec<u8>>>,
    gen_model: Option<(VarStore, Gpt2Model)>,
    pub trainers: Option<trainers::TrainerSeeds>,
}

impl State {
    pub fn new() -> Self {
        let base = if Path::new("/dev/shm").is_dir() {
            PathBuf::from("/dev/shm")
        } else {
            std::env::temp_dir()
        };
        let work = base.join(format!("torchrl-fuzz-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&work);
        std::fs::create_dir_all(&work).expect("a work folder");
        State {
            work,
            case_no: 0,
            models: None,
            sharded: None,
            tds: None,
            tokenizers: None,
            gen_model: None,
            trainers: None,
        }
    }

    /// A fresh, empty folder for this case.
    pub fn case_dir(&mut self) -> PathBuf {
        self.case_no += 1;
        let d = self.work.join(format!("c{}", self.case_no % 4));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("a case folder");
        d
    }

    fn models(&mut self) -> &mut Vec<ModelSeed> {
        if self.models.is_none() {
            let mut seeds = Vec::new();
            let mut dirs = vec![specs_dir().join("gpt2").join("tiny_v101")];
            if let Ok(rd) = std::fs::read_dir(specs_dir().join("llama")) {
                let mut l: Vec<PathBuf> = rd.filter_map(|e| e.ok().map(|e| e.path())).collect();
                l.sort();
                dirs.extend(l);
            }
            for dir in dirs {
                if let Some(seed) = load_seed(&dir) {
                    seeds.push(seed);
                }
            }
            assert!(!seeds.is_empty(), "no loadable model folder under specs/");
            self.models = Some(seeds);
        }
        self.models.as_mut().expect("set above")
    }

    fn sharded(&mut self) -> &mut ModelSeed {
        if self.sharded.is_none() {
            let src = specs_dir().join("gpt2").join("tiny_v101");
            let dir = self.work.join("sharded-seed");
            let _ = std::fs::create_dir_all(&dir);
            for f in ["config.json", "generation_config.json"] {
                let _ = std::fs::copy(src.join(f), dir.join(f));
            }
            let named =
                Tensor::read_safetensors(src.join("model.safetensors")).expect("seed weights");
            let half = named.len() / 2;
            let mut map = serde_json::Map::new();
            for (k, part) in [&named[..half], &named[half..]].into_iter().enumerate() {
                let file = format!("model-0000{}-of-00002.safetensors", k + 1);
                let refs: Vec<(&str, Tensor)> = part
                    .iter()
                    .map(|(n, t)| (n.as_str(), t.shallow_clone()))
                    .collect();
                Tensor::write_safetensors(&refs, dir.join(&file)).expect("a shard");
                for (n, _) in part {
                    map.insert(n.clone(), Value::String(file.clone()));
                }
            }
            let index = serde_json::json!({"metadata": {"total_size": 0}, "weight_map": map});
            std::fs::write(dir.join("model.safetensors.index.json"), index.to_string())
                .expect("index");
            self.sharded = Some(load_seed(&dir).expect("the sharded seed loads"));
        }
        self.sharded.as_mut().expect("set above")
    }

    fn tds(&mut self) -> &Vec<Vec<u8>> {
        self.tds.get_or_insert_with(|| {
            let mut out = Vec::new();
            let a = TensorDict::new([3])
                .and_then(|t| {
                    t.with(
                        "obs",
                        Tensor::arange(6, (Kind::Float, Device::Cpu)).view([3, 2]),
                    )
                })
                .and_then(|t| {
                    t.with(
                        ("next", "reward"),
                        Tensor::ones([3, 1], (Kind::Double, Device::Cpu)),
                    )
                })
                .and_then(|t| {
                    t.with(
                        ("next", "done"),
                        Tensor::zeros([3, 1], (Kind::Bool, Device::Cpu)),
                    )
                })
                .and_then(|t| t.with("action", Tensor::from_slice(&[1i64, 2, 3])))
                .expect("seed tensordict");
            let b = TensorDict::new([2, 2])
                .and_then(|t| t.with("x", Tensor::zeros([2, 2, 3], (Kind::Int8, Device::Cpu))))
                .and_then(|t| {
                    t.with(
                        ("a", "b", "c"),
                        Tensor::ones([2, 2], (Kind::Half, Device::Cpu)),
                    )
                })
                .expect("seed tensordict");
            let c = TensorDict::new([0]).expect("seed tensordict");
            for td in [a, b, c] {
                out.push(td.to_safetensors_bytes().expect("seed bytes"));
            }
            out
        })
    }

    fn tokenizers(&mut self) -> &Vec<Vec<u8>> {
        self.tokenizers.get_or_insert_with(|| {
            let mut out = Vec::new();
            if let Ok(b) = std::fs::read(specs_dir().join("tokenizer").join("tokenizer.json")) {
                out.push(b);
            }
            out.extend(small_tokenizers().into_iter().map(String::into_bytes));
            out
        })
    }

    fn gen_model(&mut self) -> &Gpt2Model {
        &self
            .gen_model
            .get_or_insert_with(|| {
                tch::manual_seed(0);
                let vs = VarStore::new(Device::Cpu);
                let cfg = Gpt2Config::new(40)
                    .with_n_layer(1)
                    .with_n_embd(8)
                    .with_n_head(2)
                    .with_n_positions(64);
                let m = Gpt2Model::new(&vs.root(), &cfg).expect("tiny model");
                (vs, m)
            })
            .1
    }
}

impl Drop for State {
    fn drop(&mut self) {
        // FUZZ_KEEP=1 keeps the case files (for `case` re-runs)
        if std::env::var_os("FUZZ_KEEP").is_none() {
            let _ = std::fs::remove_dir_all(&self.work);
        } else {
            eprintln!("case files kept in {}", self.work.display());
        }
    }
}

fn load_seed(dir: &Path) -> Option<ModelSeed> {
    let vs = VarStore::new(Device::Cpu);
    let model = models::from_pretrained(&vs.root(), dir).ok()?;
    let mut files = Vec::new();
    for e in std::fs::read_dir(dir).ok()? {
        let p = e.ok()?.path();
        files.push((
            p.file_name()?.to_str()?.to_string(),
            std::fs::read(&p).ok()?,
        ));
    }
    files.sort();
    Some(ModelSeed {
        dir: dir.to_path_buf(),
        files,
        _vs: vs,
        model,
    })
}

/// A WordLevel and a Unigram `tokenizer.json` (small, hand-written seeds beside the recorded
/// byte-level BPE one).
fn small_tokenizers() -> Vec<String> {
    let word_level = r#"{"version":"1.0","truncation":null,"padding":null,"added_tokens":[{"id":0,"content":"[UNK]","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true}],"normalizer":{"type":"Lowercase"},"pre_tokenizer":{"type":"Whitespace"},"post_processor":null,"decoder":null,"model":{"type":"WordLevel","vocab":{"[UNK]":0,"hello":1,"world":2,"a":3,"b":4},"unk_token":"[UNK]"}}"#;
    let unigram = r#"{"version":"1.0","truncation":null,"padding":null,"added_tokens":[],"normalizer":null,"pre_tokenizer":{"type":"Metaspace","replacement":"▁","prepend_scheme":"always","split":true},"post_processor":null,"decoder":{"type":"Metaspace","replacement":"▁","prepend_scheme":"always","split":true},"model":{"type":"Unigram","unk_id":0,"vocab":[["<unk>",0.0],["▁",-1.0],["a",-2.0],["b",-2.5],["▁a",-1.5],["ab",-3.0]],"byte_fallback":false}}"#;
    vec![word_level.to_string(), unigram.to_string()]
}

// ------------------------------------------------------------------ checks shared by targets

/// libtorch's C++ text (frames, source locations) must not reach a caller.
fn raw_libtorch(msg: &str) -> bool {
    msg.contains("Exception raised from") || msg.contains("frame #") || msg.contains("c10::")
}

/// An error from loading files in `dir`: named (it names the folder or one of `files`), and
/// without libtorch's C++ text.
pub fn named_err(msg: String, dir: &Path, files: &[&str]) -> Outcome {
    if raw_libtorch(&msg) {
        return Outcome::Defect("raw-libtorch", msg);
    }
    let d = dir.display().to_string();
    if msg.contains(&d) || files.iter().any(|f| msg.contains(f)) {
        Outcome::Err(msg)
    } else {
        Outcome::Defect("unnamed-err", msg)
    }
}

/// The error of a `from_pretrained` into the fresh store `vs`: half-written when the store is
/// no longer empty (a failed load must add no variable), else named as [`named_err`] requires.
fn fresh_load_err(vs: &VarStore, msg: String, dir: &Path, files: &[&str]) -> Outcome {
    let left = vs.variables().len();
    if left > 0 {
        return Outcome::Defect(
            "half-written",
            format!("a failed from_pretrained left {left} variables in the store: {msg}"),
        );
    }
    named_err(msg, dir, files)
}

/// A plain error (no file involved): anything but libtorch's C++ text.
fn plain_err(msg: String) -> Outcome {
    if raw_libtorch(&msg) {
        Outcome::Defect("raw-libtorch", msg)
    } else {
        Outcome::Err(msg)
    }
}

/// The model's parameters, deep-copied, as bits.
pub fn params_snapshot(model: &dyn CausalLm) -> Vec<(String, Tensor)> {
    model
        .named_parameters()
        .into_iter()
        .map(|(n, t)| (n, bits(t)))
        .collect()
}

/// A tensor's bits (floats viewed as integers, so NaN == NaN), deep-copied.
pub fn bits(t: &Tensor) -> Tensor {
    let t = t.detach().copy();
    match t.kind() {
        Kind::Float => t.view_dtype(Kind::Int),
        Kind::Double => t.view_dtype(Kind::Int64),
        Kind::Half | Kind::BFloat16 => t.view_dtype(Kind::Int16),
        _ => t,
    }
}

pub fn same_snapshot(a: &[(String, Tensor)], b: &[(String, Tensor)]) -> Option<String> {
    if a.len() != b.len() {
        return Some("parameter count".into());
    }
    for ((na, ta), (nb, tb)) in a.iter().zip(b) {
        if na != nb || ta.size() != tb.size() || ta.kind() != tb.kind() || !ta.equal(tb) {
            return Some(format!("parameter {na}"));
        }
    }
    None
}

/// A loaded model must run a forward of one token (finite logits are not required: weights
/// may hold any float).
fn forward_ok(model: &dyn CausalLm) -> Result<(), String> {
    let f = model.facts();
    let last = (f.vocab_size - 1).clamp(0, 1);
    let ids: Vec<i64> = [0i64, last]
        .into_iter()
        .take(f.max_positions.clamp(1, 2) as usize)
        .collect();
    let ids = Tensor::from_slice(&ids).view([1, -1]);
    model
        .forward(&LmInput::new(&ids), None)
        .and_then(|o| o.logits())
        .map(|_| ())
        .map_err(|e| format!("forward of an accepted model: {e}"))
}

fn write_files(dir: &Path, files: &[(String, Vec<u8>)]) {
    for (name, bytes) in files {
        std::fs::write(dir.join(name), bytes).expect("writing a case file");
    }
}

/// Loads `dir` into the seed's existing model (all or nothing) and, one time in `fresh_every`,
/// into a fresh store; checks the properties.
fn load_checks(
    seed: &ModelSeed,
    dir: &Path,
    files: &[&str],
    fresh_every: usize,
    rng: &mut Rng,
) -> Outcome {
    let before = params_snapshot(seed.model.as_ref());
    match seed.model.load_folder(dir) {
        Ok(()) => {
            if let Err(e) = forward_ok(seed.model.as_ref()) {
                return Outcome::Defect("unusable", e);
            }
        }
        Err(e) => {
            if let Some(what) = same_snapshot(&before, &params_snapshot(seed.model.as_ref())) {
                return Outcome::Defect(
                    "half-written",
                    format!("{what} changed by a failed load_folder: {e}"),
                );
            }
            if let o @ Outcome::Defect(..) = named_err(e.to_string(), dir, files) {
                return o;
            }
        }
    }
    if rng.below(fresh_every) == 0 {
        let vs = VarStore::new(Device::Cpu);
        return match models::from_pretrained(&vs.root(), dir) {
            Ok(m) => match forward_ok(m.as_ref()) {
                Ok(()) => Outcome::Ok,
                Err(e) => Outcome::Defect("unusable", e),
            },
            Err(e) => fresh_load_err(&vs, e.to_string(), dir, files),
        };
    }
    // restore the seed's weights so that the next case starts from them
    let _ = seed.model.load_folder(&seed.dir);
    Outcome::Ok
}

// ------------------------------------------------------------------ targets

/// The PEFT adapters recorded by `specs/record_peft.py`, each on its base folder.
const ADAPTER_SEEDS: &[&str] = &["gpt2_attn_fc", "qwen2_qv_rslora", "qwen3_all_linear"];

/// A mutated PEFT adapter (`adapter_config.json` edited structurally, or
/// `adapter_model.safetensors`'s header or bytes) loaded onto a fresh copy of its base model:
/// an `Err` names the adapter's folder or file, attaches nothing and leaves every base
/// parameter bitwise unchanged; an `Ok` runs a forward with the adapters on and off.
fn adapter_case(st: &mut State, rng: &mut Rng) -> Outcome {
    let src = specs_dir().join("peft").join(rng.pick(ADAPTER_SEEDS));
    let config = std::fs::read(src.join("adapter_config.json")).expect("seed adapter config");
    let weights = std::fs::read(src.join("adapter_model.safetensors")).expect("seed adapter");
    let base_dir = serde_json::from_slice::<Value>(&config)
        .ok()
        .and_then(|v| v.get("base_model_name_or_path")?.as_str().map(String::from))
        .map(|rel| specs_dir().join(rel))
        .expect("the seed adapter names its base folder");
    let (config, weights) = match rng.below(3) {
        0 => (mutate_json_text(rng, &config), weights),
        1 => {
            let w = mutate_safetensors_header(rng, &weights)
                .unwrap_or_else(|| mutate_bytes(rng, &weights));
            (config, w)
        }
        _ => (config, mutate_bytes(rng, &weights)),
    };
    let dir = st.case_dir();
    write_files(
        &dir,
        &[
            ("adapter_config.json".into(), config),
            ("adapter_model.safetensors".into(), weights),
        ],
    );
    let vs = VarStore::new(Device::Cpu);
    let mut model = match models::from_pretrained(&(vs.root() / "base"), &base_dir) {
        Ok(m) => m,
        Err(e) => return Outcome::Defect("unusable", format!("the seed base: {e}")),
    };
    let before = params_snapshot(model.as_ref());
    match lora::load_adapter(model.as_mut(), &(vs.root() / "lora"), &dir) {
        Ok((_, switch)) => {
            if let Err(e) = forward_ok(model.as_ref()) {
                return Outcome::Defect("unusable", e);
            }
            match switch.disabled(|| forward_ok(model.as_ref())) {
                Ok(()) => Outcome::Ok,
                Err(e) => Outcome::Defect("unusable", format!("adapters off: {e}")),
            }
        }
        Err(e) => {
            if lora::lora_switch(model.as_ref()).is_some() {
                return Outcome::Defect(
                    "half-written",
                    format!("a failed load_adapter left adapters attached: {e}"),
                );
            }
            if let Some(what) = same_snapshot(&before, &params_snapshot(model.as_ref())) {
                return Outcome::Defect(
                    "half-written",
                    format!("{what} changed by a failed load_adapter: {e}"),
                );
            }
            named_err(
                e.to_string(),
                &dir,
                &["adapter_config.json", "adapter_model.safetensors"],
            )
        }
    }
}

/// `TensorDict::from_safetensors_bytes` and `TensorDict::load` on mutated tensordict files.
fn tensordict_case(st: &mut State, rng: &mut Rng) -> Outcome {
    let seeds = st.tds().clone();
    let seed = rng.pick(&seeds);
    let bytes = if rng.chance(0.5) {
        mutate_safetensors_header(rng, seed).unwrap_or_else(|| mutate_bytes(rng, seed))
    } else {
        mutate_bytes(rng, seed)
    };
    let dir = st.case_dir();
    let path = dir.join("td.safetensors");
    std::fs::write(&path, &bytes).expect("case file");
    let from_bytes = TensorDict::from_safetensors_bytes(&bytes);
    let loaded = TensorDict::load(&path);
    match (from_bytes, loaded) {
        (Ok(a), Ok(b)) => {
            // usable: it saves, and what it saves reads back the same
            let again = a
                .to_safetensors_bytes()
                .and_then(|x| TensorDict::from_safetensors_bytes(&x));
            match again {
                Ok(c) if c.batch_size() == a.batch_size() && b.batch_size() == a.batch_size() => {
                    match c.to_safetensors_bytes() {
                        Ok(x) if Some(&x) == a.to_safetensors_bytes().ok().as_ref() => Outcome::Ok,
                        _ => Outcome::Defect(
                            "unusable",
                            "a loaded tensordict does not round-trip".into(),
                        ),
                    }
                }
                Ok(_) => Outcome::Defect("unusable", "batch size changed by a round trip".into()),
                Err(e) => {
                    Outcome::Defect("unusable", format!("re-saving a loaded tensordict: {e}"))
                }
            }
        }
        (Err(e), Err(f)) => {
            if let o @ Outcome::Defect(..) = plain_err(e.to_string()) {
                return o;
            }
            named_err(f.to_string(), &dir, &["td.safetensors"])
        }
        (a, b) => Outcome::Defect(
            "unusable",
            format!(
                "bytes and file disagree: {:?} vs {:?}",
                a.err().map(|e| e.to_string()),
                b.err().map(|e| e.to_string())
            ),
        ),
    }
}

/// Mutated `model.safetensors` (bytes or header) loaded into an existing model and a fresh one.
fn weights_case(st: &mut State, rng: &mut Rng) -> Outcome {
    let dir = st.case_dir();
    let n = st.models().len();
    let k = rng.below(n);
    let seed = &st.models()[k];
    let mut files = seed.files.clone();
    for (name, bytes) in files.iter_mut() {
        if name == "model.safetensors" {
            *bytes = if rng.chance(0.5) {
                mutate_safetensors_header(rng, bytes).unwrap_or_else(|| mutate_bytes(rng, bytes))
            } else {
                mutate_bytes(rng, bytes)
            };
        }
    }
    write_files(&dir, &files);
    let seed = &st.models()[k];
    load_checks(seed, &dir, &["model.safetensors"], 4, rng)
}

/// Mutated `config.json` (GPT-2 and Llama-family forms) read alone (`AutoConfig`) and with the
/// seed's weights (`AutoModelForCausalLM`).
fn config_case(st: &mut State, rng: &mut Rng) -> Outcome {
    let dir = st.case_dir();
    let n = st.models().len();
    let k = rng.below(n);
    let seed = &st.models()[k];
    let mut files = seed.files.clone();
    for (name, bytes) in files.iter_mut() {
        if name == "config.json" {
            *bytes = mutate_json_text(rng, bytes);
        }
    }
    write_files(&dir, &files);
    let names = ["config.json", "model.safetensors", "generation_config.json"];
    match models::config_from_file(&dir.join("config.json")) {
        Ok(cfg) => {
            let f = cfg.facts();
            if f.vocab_size < 1 || f.hidden_size < 1 || f.max_positions < 1 {
                return Outcome::Defect("unusable", format!("accepted config with facts {f:?}"));
            }
            // build it when small (a config may ask for a big model legitimately): the
            // widest matrix any field describes, per block, plus the embeddings
            let text = std::fs::read(dir.join("config.json")).unwrap_or_default();
            let json: Value = serde_json::from_slice(&text).unwrap_or(Value::Null);
            let num = |k: &str| json.get(k).and_then(Value::as_f64).unwrap_or(0.0).max(0.0);
            let heads = num("num_attention_heads").max(num("n_head"));
            let widest = [
                f.hidden_size as f64,
                num("intermediate_size"),
                num("n_inner"),
                4.0 * num("n_embd"),
                heads * num("head_dim"),
                num("num_key_value_heads") * num("head_dim"),
            ]
            .into_iter()
            .fold(0.0, f64::max);
            let approx = (f.vocab_size as f64 + f.max_positions as f64) * f.hidden_size as f64
                + f.n_layer as f64 * 8.0 * widest * f.hidden_size as f64;
            if approx < 4e6 {
                let vs = VarStore::new(Device::Cpu);
                match cfg.build(&vs.root()) {
                    Ok(m) => {
                        if let Err(e) = forward_ok(m.as_ref()) {
                            return Outcome::Defect("unusable", format!("{e} (config {f:?})"));
                        }
                    }
                    Err(e) => {
                        return Outcome::Defect(
                            "unusable",
                            format!("an accepted config does not build: {e}"),
                        );
                    }
                }
            }
        }
        Err(e) => {
            if let o @ Outcome::Defect(..) = named_err(e.to_string(), &dir, &names) {
                return o;
            }
        }
    }
    let vs = VarStore::new(Device::Cpu);
    match models::from_pretrained(&vs.root(), &dir) {
        Ok(m) => match forward_ok(m.as_ref()) {
            Ok(()) => Outcome::Ok,
            Err(e) => Outcome::Defect("unusable", e),
        },
        Err(e) => fresh_load_err(&vs, e.to_string(), &dir, &names),
    }
}

/// Mutated `generation_config.json`: the model loads or the error names the file; a loaded
/// model generates greedily with a default config (the checkpoint's ids as defaults).
fn generation_config_case(st: &mut State, rng: &mut Rng) -> Outcome {
    let dir = st.case_dir();
    let n = st.models().len();
    let k = rng.below(n);
    let seed = &st.models()[k];
    let mut files = seed.files.clone();
    let base = serde_json::to_vec(
        &serde_json::json!({"bos_token_id": 1, "eos_token_id": [2, 3], "pad_token_id": 0}),
    )
    .expect("json");
    match files
        .iter_mut()
        .find(|(n, _)| n == "generation_config.json")
    {
        Some((_, bytes)) => *bytes = mutate_json_text(rng, bytes),
        None => files.push((
            "generation_config.json".into(),
            mutate_json_text(rng, &base),
        )),
    }
    write_files(&dir, &files);
    let names = ["generation_config.json", "config.json"];
    let vs = VarStore::new(Device::Cpu);
    match models::from_pretrained(&vs.root(), &dir) {
        Ok(m) => {
            let prompt = Tensor::from_slice(&[0i64, 1]).view([1, 2]);
            let vocab = m.facts().vocab_size;
            match generate_greedy(
                m.as_ref(),
                &prompt,
                None,
                &GenerationConfig::new(3),
                &GenerateOptions::default(),
            ) {
                Ok(out) => {
                    let max = out.sequences.max().int64_value(&[]);
                    let min = out.sequences.min().int64_value(&[]);
                    if min < 0 || max >= vocab {
                        Outcome::Defect(
                            "unusable",
                            format!("generated ids outside [0, {vocab}): {min}..{max}"),
                        )
                    } else {
                        Outcome::Ok
                    }
                }
                Err(e) => Outcome::Defect(
                    "unusable",
                    format!("default greedy generation of an accepted model: {e}"),
                ),
            }
        }
        Err(e) => fresh_load_err(&vs, e.to_string(), &dir, &names),
    }
}

/// Mutated `tokenizer.json` (BPE, WordLevel, Unigram seeds): loads or the error names the file;
/// a loaded tokenizer encodes, decodes its own ids, and batch-encodes.
fn tokenizer_case(st: &mut State, rng: &mut Rng) -> Outcome {
    let seeds = st.tokenizers().clone();
    let seed = rng.pick(&seeds);
    let bytes = mutate_json_text(rng, seed);
    let dir = st.case_dir();
    let path = dir.join("tokenizer.json");
    std::fs::write(&path, &bytes).expect("case file");
    let tok = match HfTokenizer::from_file(&path) {
        Ok(t) => t,
        Err(e) => return named_err(e.to_string(), &dir, &["tokenizer.json"]),
    };
    let vocab = tok.vocab_size();
    if vocab < 1 {
        return Outcome::Defect(
            "unusable",
            format!("accepted a tokenizer of vocabulary {vocab}"),
        );
    }
    for text in [
        "hello world",
        "",
        "ab a b é漢🙂 \u{0}",
        "<|endoftext|> the end",
    ] {
        match tok.encode(text) {
            Ok(ids) => {
                if let Some(bad) = ids.iter().find(|&&i| i < 0 || i >= vocab) {
                    return Outcome::Defect(
                        "unusable",
                        format!("encode gave id {bad} outside [0, {vocab})"),
                    );
                }
                if let Err(e) = tok.decode(&ids, SpecialTokens::Keep) {
                    return Outcome::Defect(
                        "unusable",
                        format!("decode of its own ids {ids:?}: {e}"),
                    );
                }
            }
            Err(e) => {
                if let o @ Outcome::Defect(..) = plain_err(e.to_string()) {
                    return o;
                }
            }
        }
    }
    // arbitrary ids in range: decoded or a named error
    let ids: Vec<i64> = (0..4).map(|_| (rng.next() % vocab as u64) as i64).collect();
    if let Err(e) = tok.decode(&ids, SpecialTokens::Skip) {
        if let o @ Outcome::Defect(..) = plain_err(e.to_string()) {
            return o;
        }
    }
    let opts = torchrl::modules::llm::BatchEncodeOptions::default();
    if let Err(e) = tok.batch_encode(&["a b", "hello"], &opts) {
        if let o @ Outcome::Defect(..) = plain_err(e.to_string()) {
            return o;
        }
    }
    Outcome::Ok
}

/// Mutated sharded folders: the index (`model.safetensors.index.json`) or a shard.
fn sharded_case(st: &mut State, rng: &mut Rng) -> Outcome {
    let dir = st.case_dir();
    let seed = st.sharded();
    let mut files = seed.files.clone();
    let which = rng.below(10);
    for (name, bytes) in files.iter_mut() {
        let is_index = name.ends_with("index.json");
        let is_shard = name.starts_with("model-0000");
        if which < 6 && is_index {
            *bytes = mutate_json_text(rng, bytes);
        } else if which >= 6 && is_shard && (name.contains("00001") == (which % 2 == 0)) {
            *bytes = if rng.chance(0.5) {
                mutate_safetensors_header(rng, bytes).unwrap_or_else(|| mutate_bytes(rng, bytes))
            } else {
                mutate_bytes(rng, bytes)
            };
        }
    }
    // sometimes a shard is missing or the index names one that is not there
    if rng.below(12) == 0 {
        files.retain(|(n, _)| !n.starts_with("model-00002"));
    }
    write_files(&dir, &files);
    let seed = st.sharded();
    load_checks(
        seed,
        &dir,
        &[
            "model.safetensors.index.json",
            "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors",
        ],
        4,
        rng,
    )
}

/// Mutated trainer configs (PPO, GRPO, DPO, ILQL; TOML and JSON): read from text and from a
/// file; an accepted config validates and round-trips exactly through both formats.
fn trainer_config_case(st: &mut State, rng: &mut Rng) -> Outcome {
    match rng.below(4) {
        0 => config_round::<torchrl::trainers::config::PpoMethodConfig>(
            st,
            rng,
            TrlConfig::default(),
        ),
        1 => config_round(st, rng, GrpoTrlConfig::default()),
        2 => config_round(st, rng, DpoTrlConfig::default()),
        _ => config_round(st, rng, IlqlTrlConfig::default()),
    }
}

fn config_round<M: torchrl::trainers::config::MethodConfig>(
    st: &mut State,
    rng: &mut Rng,
    base: TrlConfigOf<M>,
) -> Outcome {
    let toml = rng.chance(0.5);
    let text = if toml {
        mutate_toml_text(rng, &base.to_toml().expect("seed toml"))
    } else {
        mutate_json_text(rng, base.to_json().expect("seed json").as_bytes())
    };
    let dir = st.case_dir();
    let path = dir.join(if toml { "trl.toml" } else { "trl.json" });
    std::fs::write(&path, &text).expect("case file");
    let from_file = TrlConfigOf::<M>::from_file(&path);
    let s = String::from_utf8_lossy(&text);
    let from_text = if toml {
        TrlConfigOf::<M>::from_toml_str(&s)
    } else {
        TrlConfigOf::<M>::from_json_str(&s)
    };
    let cfg = match (from_file, from_text) {
        (Ok(a), Ok(b)) => {
            if a != b && std::str::from_utf8(&text).is_ok() {
                return Outcome::Defect("unusable", "file and text reads differ".into());
            }
            a
        }
        (Err(e), _) => return named_err(e.to_string(), &dir, &["trl.toml", "trl.json"]),
        (Ok(a), Err(_)) if std::str::from_utf8(&text).is_err() => a,
        (Ok(_), Err(e)) => {
            return Outcome::Defect("unusable", format!("file read accepted, text refused: {e}"));
        }
    };
    if let Err(e) = cfg.validate() {
        return Outcome::Defect(
            "unusable",
            format!("an accepted config does not validate: {e}"),
        );
    }
    let rt_toml = cfg
        .to_toml()
        .and_then(|t| TrlConfigOf::<M>::from_toml_str(&t));
    let rt_json = cfg
        .to_json()
        .and_then(|t| TrlConfigOf::<M>::from_json_str(&t));
    match (rt_toml, rt_json) {
        (Ok(a), Ok(b)) if a == cfg && b == cfg => Outcome::Ok,
        (Ok(_), Ok(_)) => {
            Outcome::Defect("unusable", "an accepted config does not round-trip".into())
        }
        (Err(e), _) | (_, Err(e)) => Outcome::Defect(
            "unusable",
            format!("an accepted config does not round-trip: {e}"),
        ),
    }
}

fn edge_i64(rng: &mut Rng) -> i64 {
    if rng.chance(0.7) {
        *rng.pick(EDGE_INTS)
    } else {
        (rng.next() % 9) as i64
    }
}

fn edge_shape(rng: &mut Rng) -> Vec<i64> {
    let n = rng.below(5);
    (0..n)
        .map(|_| {
            if rng.chance(0.4) {
                edge_i64(rng)
            } else {
                rng.below(4) as i64
            }
        })
        .collect()
}

/// The bytes a tensor of `shape` would take at 8 bytes an element (saturating).
fn bytes_of(shape: &[i64]) -> f64 {
    shape.iter().map(|&d| d.max(0) as f64).product::<f64>() * 8.0
}

/// Public constructors with extreme arguments: specs, tensordicts, envs, model configs and
/// models, KV caches, generation settings. `Ok` values must be usable (sampled, zeroed, reset,
/// run) unless what they describe is too big for memory (then an error is expected, not a
/// crash).
fn constructors_case(st: &mut State, rng: &mut Rng) -> Outcome {
    let small = |shape: &[i64]| bytes_of(shape) < 4e6;
    match rng.below(10) {
        0..=2 => {
            // a leaf spec
            let shape = edge_shape(rng);
            let n = edge_i64(rng);
            let spec: torchrl::Result<torchrl::specs::TensorSpec> = match rng.below(8) {
                0 => Bounded::new(
                    *rng.pick(EDGE_FLOATS) * if rng.chance(0.5) { -1.0 } else { 1.0 },
                    *rng.pick(EDGE_FLOATS),
                    &shape,
                )
                .and_then(|s| {
                    if rng.chance(0.3) {
                        s.with_dtype(*rng.pick(&[
                            Kind::Int64,
                            Kind::Uint8,
                            Kind::Int8,
                            Kind::Bool,
                            Kind::Half,
                            Kind::Double,
                        ]))
                    } else {
                        Ok(s)
                    }
                })
                .map(Into::into),
                1 => Categorical::new(n)
                    .and_then(|s| s.with_shape(&shape))
                    .map(Into::into),
                2 => OneHot::new(n)
                    .and_then(|s| {
                        let mut sh = shape.clone();
                        sh.push(n);
                        s.with_shape(sh)
                    })
                    .map(Into::into),
                3 => Binary::new(n)
                    .and_then(|s| {
                        let mut sh = shape.clone();
                        sh.push(n);
                        s.with_shape(sh)
                    })
                    .map(Into::into),
                4 => MultiCategorical::new((0..1 + rng.below(3)).map(|_| edge_i64(rng)).collect())
                    .map(Into::into),
                5 => MultiOneHot::new((0..1 + rng.below(3)).map(|_| edge_i64(rng)).collect())
                    .map(Into::into),
                6 => Unbounded::new().with_shape(&shape).map(Into::into),
                _ => Categorical::new(n)
                    .and_then(|s| {
                        s.with_dtype(*rng.pick(&[Kind::Uint8, Kind::Int8, Kind::Int16, Kind::Bool]))
                    })
                    .map(Into::into),
            };
            match spec {
                Ok(s) => {
                    let fits = small(s.shape()) && s.shape().iter().all(|&d| d >= 0);
                    if !fits {
                        // a legitimately huge spec: sampling it is the caller's memory to
                        // spend (tch 0.26 panics when libtorch fails to allocate inside an
                        // op that takes a Scalar: docs/reliability.md), not a file's doing
                        let _ = s.to_string();
                        return Outcome::Ok;
                    }
                    // uniform draws need finite bounds: rand of a Bounded spec with an infinite
                    // bound is a named error (documented), zero / is_in still work
                    let finite = |t: &Tensor| {
                        t.f_isfinite()
                            .and_then(|f| f.f_all())
                            .map(|a| bool::try_from(&a).unwrap_or(false))
                            .unwrap_or(false)
                    };
                    let infinite_bounds = matches!(&s, torchrl::specs::TensorSpec::Bounded(b) if !finite(b.low()) || !finite(b.high()));
                    let mut g = Generator::new(rng.next());
                    let z = s.zero(&[]);
                    let r = s.rand(&mut g, &[]);
                    let r = match r {
                        Err(e) if infinite_bounds => {
                            return match z {
                                Ok(_) => plain_err(e.to_string()),
                                Err(ze) => Outcome::Defect(
                                    "unusable",
                                    format!("zero of accepted spec {s}: {ze}"),
                                ),
                            };
                        }
                        r => r,
                    };
                    match (z, r) {
                        (Ok(_), Ok(torchrl::Entry::Tensor(x))) => {
                            match s.is_in(&torchrl::Entry::Tensor(x)) {
                                Ok(true) => Outcome::Ok,
                                other => Outcome::Defect(
                                    "unusable",
                                    format!("rand() of {s} not in it: {other:?}"),
                                ),
                            }
                        }
                        (Ok(_), Ok(_)) => Outcome::Ok,
                        (Err(e), _) | (_, Err(e)) if !fits => plain_err(e.to_string()),
                        (Err(e), _) | (_, Err(e)) => {
                            Outcome::Defect("unusable", format!("accepted spec {s}: {e}"))
                        }
                    }
                }
                Err(e) => plain_err(e.to_string()),
            }
        }
        3 => {
            let shape = edge_shape(rng);
            match Composite::new(&shape) {
                Ok(c) => {
                    let leaf = Unbounded::new().with_shape([shape.clone(), vec![2]].concat());
                    match leaf.and_then(|l| c.with("x", l)) {
                        Ok(c) if small(&shape) => match c.zero(&[]) {
                            Ok(_) => Outcome::Ok,
                            Err(e) => Outcome::Defect("unusable", format!("zero of {c}: {e}")),
                        },
                        Ok(_) => Outcome::Ok,
                        Err(e) => plain_err(e.to_string()),
                    }
                }
                Err(e) => plain_err(e.to_string()),
            }
        }
        4 => {
            let shape = edge_shape(rng);
            match TensorDict::new(&shape) {
                Ok(td) => {
                    let leaf_shape = [shape.clone(), vec![1]].concat();
                    if !small(&leaf_shape) {
                        return Outcome::Ok;
                    }
                    // fallible: a shape with no elements can still have strides libtorch
                    // cannot compute ([0, 2^62]); such a batch size holds no leaf
                    let Ok(t) = Tensor::f_zeros(leaf_shape.as_slice(), (Kind::Float, Device::Cpu))
                    else {
                        return Outcome::Ok;
                    };
                    match td.with("x", t).and_then(|t| t.to_safetensors_bytes()) {
                        Ok(_) => Outcome::Ok,
                        Err(e) => Outcome::Defect(
                            "unusable",
                            format!("a tensordict of batch {shape:?}: {e}"),
                        ),
                    }
                }
                Err(e) => plain_err(e.to_string()),
            }
        }
        5 => {
            let batch = edge_shape(rng);
            let env: torchrl::Result<Box<dyn EnvBase>> = if rng.chance(0.5) {
                PendulumEnv::new(&batch, Device::Cpu).map(|e| Box::new(e) as Box<dyn EnvBase>)
            } else {
                CartPoleEnv::new(&batch, Device::Cpu).map(|e| Box::new(e) as Box<dyn EnvBase>)
            };
            match env {
                Ok(mut e) => {
                    if !small(&[batch.clone(), vec![4]].concat()) {
                        return Outcome::Ok;
                    }
                    let r = e.reset(None).and_then(|td| {
                        let a = e.rand_action(Some(td))?;
                        e.step(a)
                    });
                    match r {
                        Ok(_) => Outcome::Ok,
                        Err(er) => {
                            Outcome::Defect("unusable", format!("env of batch {batch:?}: {er}"))
                        }
                    }
                }
                Err(er) => plain_err(er.to_string()),
            }
        }
        6 => {
            // a GPT-2 config with extreme sizes: validated; built and run when small
            let mut c = Gpt2Config::new(edge_i64(rng));
            for _ in 0..1 + rng.below(3) {
                let v = edge_i64(rng);
                c = match rng.below(5) {
                    0 => c.with_n_layer(v),
                    1 => c.with_n_embd(v),
                    2 => c.with_n_head(v),
                    3 => c.with_n_positions(v),
                    _ => c.with_n_inner(v),
                };
            }
            match c.validate() {
                Ok(()) => {
                    let f = c.facts();
                    let approx = (f.vocab_size as f64 + f.max_positions as f64)
                        * f.hidden_size as f64
                        + f.n_layer as f64 * 16.0 * (f.hidden_size as f64).powi(2);
                    if approx > 5e5 || f.max_positions < 2 {
                        return Outcome::Ok;
                    }
                    let vs = VarStore::new(Device::Cpu);
                    match Gpt2Model::new(&vs.root(), &c) {
                        Ok(m) => match forward_ok(&m) {
                            Ok(()) => Outcome::Ok,
                            Err(e) => Outcome::Defect("unusable", e),
                        },
                        Err(e) => Outcome::Defect(
                            "unusable",
                            format!("a validated config does not build: {e}"),
                        ),
                    }
                }
                Err(e) => plain_err(e.to_string()),
            }
        }
        7 => {
            // a KV cache of any depth, then used by a forward of a one-block model
            let depth = if rng.chance(0.5) {
                rng.next() as usize
            } else {
                rng.below(4)
            };
            let cache = KvCache::new(depth);
            let model = st.gen_model();
            let ids = Tensor::from_slice(&[1i64, 2]).view([1, 2]);
            let mut cache = cache;
            match model.forward(&LmInput::new(&ids), Some(&mut cache)) {
                Ok(_) | Err(_) => Outcome::Ok,
            }
        }
        _ => {
            // generation with extreme settings on a tiny model
            let mut c = GenerationConfig::new(edge_i64(rng));
            for _ in 0..1 + rng.below(4) {
                c = match rng.below(7) {
                    0 => c.with_min_new_tokens(edge_i64(rng)),
                    1 => c.with_do_sample(rng.chance(0.5)),
                    2 => c.with_temperature(*rng.pick(EDGE_FLOATS)),
                    3 => c.with_top_k(edge_i64(rng)),
                    4 => c.with_top_p(*rng.pick(EDGE_FLOATS)),
                    5 => c.with_eos_token_id(edge_i64(rng)),
                    _ => c.with_pad_token_id(edge_i64(rng)),
                };
            }
            let b = 1 + rng.below(3) as i64;
            let p = 1 + rng.below(3) as i64;
            let prompt = Tensor::randint(40, [b, p], (Kind::Int64, Device::Cpu));
            let model = st.gen_model();
            let mut g = Generator::new(rng.next());
            match generate(model, &prompt, None, &c, &mut g) {
                Ok(out) => {
                    let seq = out.sequences.size();
                    if seq.len() != 2 || seq[0] != b || seq[1] < p || seq[1] > p + c.max_new_tokens
                    {
                        Outcome::Defect("unusable", format!("sequences of shape {seq:?} for {c:?}"))
                    } else {
                        Outcome::Ok
                    }
                }
                Err(e) => plain_err(e.to_string()),
            }
        }
    }
}
