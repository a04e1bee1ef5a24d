//! Hugging Face checkpoints (any [`CausalLm`](super::CausalLm); GPT-2 in the example): a folder with `config.json` and `model.safetensors`, as
//! `transformers`' `save_pretrained` writes it, read and written by `transformers`' parameter
//! names.
//!
//! Loading checks the whole file before changing any parameter: a missing, extra or
//! mis-shaped tensor is an [`Error::InvalidFile`] that names every one of them. Names with or
//! without the `transformer.` prefix (`GPT2LMHeadModel` / `GPT2Model`) are accepted; the
//! attention buffers older `transformers` saved (`attn.bias`, `attn.masked_bias`) are skipped,
//! and `lm_head.weight`, tied to the token embedding, is checked for shape and skipped. Values
//! are cast to the model's dtype and device. Saving writes to temporary files and renames them,
//! so a crash never leaves half a checkpoint.
//!
//! ```
//! use tch::{nn::VarStore, Device, Tensor};
//! use torchrl::modules::llm::{CausalLm, Gpt2Config, Gpt2Model, LmInput};
//! # fn main() -> torchrl::Result<()> {
//! let dir = std::env::temp_dir().join(format!("torchrl-doc-gpt2-{}", std::process::id()));
//! let cfg = Gpt2Config::new(30).with_n_layer(1).with_n_embd(8).with_n_head(2).with_n_positions(8);
//! let vs = VarStore::new(Device::Cpu);
//! let model = Gpt2Model::new(&vs.root(), &cfg)?;
//! model.save_pretrained(&dir)?;
//! let vs2 = VarStore::new(Device::Cpu);
//! let loaded = Gpt2Model::from_pretrained(&vs2.root(), &dir)?;
//! let ids = Tensor::from_slice(&[3i64, 4, 5]).view([1, 3]);
//! let a = model.forward(&LmInput::new(&ids), None)?.logits()?;
//! let b = loaded.forward(&LmInput::new(&ids), None)?.logits()?;
//! assert!(a.equal(&b));
//! // a checkpoint of another shape is refused, naming the tensors
//! let small = Gpt2Config::new(30).with_n_layer(1).with_n_embd(4).with_n_head(2).with_n_positions(8);
//! let vs3 = VarStore::new(Device::Cpu);
//! let err = Gpt2Model::new(&vs3.root(), &small)?
//!     .load_safetensors(&dir.join("model.safetensors")).unwrap_err();
//! let msg = err.to_string();
//! assert!(msg.contains("mis-shaped tensors") && msg.contains("(16 in all)"), "{msg}");
//! assert!(msg.contains("transformer.h.0.ln_1.weight (expected [4], got [8])"), "{msg}");
//! std::fs::remove_dir_all(&dir).ok();
//! # Ok(()) }
//! ```

use std::collections::BTreeMap;
use std::path::Path as FsPath;

use tch::{Device, Tensor};

use crate::error::{Error, Result, ShapeFmt};

/// The checkpoint's file names inside a model folder.
pub const CONFIG_FILE: &str = "config.json";
/// The weights' file name inside a model folder.
pub const WEIGHTS_FILE: &str = "model.safetensors";
/// The index of a sharded checkpoint (`weight_map`: tensor name → shard file).
pub const WEIGHTS_INDEX_FILE: &str = "model.safetensors.index.json";
/// The generation defaults `transformers` saves beside the config.
pub const GENERATION_CONFIG_FILE: &str = "generation_config.json";

/// `name` as a `GPT2LMHeadModel` parameter name.
fn canonical(name: &str) -> String {
    const TRUNK: [&str; 4] = ["wte.", "wpe.", "h.", "ln_f."];
    if TRUNK.iter().any(|p| name.starts_with(p)) {
        format!("transformer.{name}")
    } else {
        name.to_string()
    }
}

fn is_buffer(name: &str) -> bool {
    name.ends_with(".attn.bias")
        || name.ends_with(".attn.masked_bias")
        || name.ends_with("rotary_emb.inv_freq")
}

fn list(names: &[String]) -> String {
    const SHOWN: usize = 6;
    let mut s = names
        .iter()
        .take(SHOWN)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if names.len() > SHOWN {
        s.push_str(&format!(", … ({} in all)", names.len()));
    }
    s
}

/// Checks `given` against `expected` (name → shape) and returns the reasons it does not fit.
pub(crate) fn fit_report(
    expected: &BTreeMap<String, Vec<i64>>,
    given: &BTreeMap<String, Vec<i64>>,
) -> Vec<String> {
    let mut missing = Vec::new();
    let mut misshaped = Vec::new();
    for (name, shape) in expected {
        match given.get(name) {
            None => missing.push(name.clone()),
            Some(s) if s != shape => misshaped.push(format!(
                "{name} (expected {}, got {})",
                ShapeFmt(shape),
                ShapeFmt(s)
            )),
            Some(_) => {}
        }
    }
    let extra: Vec<String> = given
        .keys()
        .filter(|k| !expected.contains_key(*k))
        .cloned()
        .collect();
    let mut reasons = Vec::new();
    if !missing.is_empty() {
        reasons.push(format!("missing tensors: {}", list(&missing)));
    }
    if !extra.is_empty() {
        reasons.push(format!("unexpected tensors: {}", list(&extra)));
    }
    if !misshaped.is_empty() {
        reasons.push(format!("mis-shaped tensors: {}", list(&misshaped)));
    }
    reasons
}

/// The files of a model folder's weights: `model.safetensors` alone, or the shards that
/// `model.safetensors.index.json` names, each with the tensor names the index maps to it.
/// Returns the path errors about the weights as a whole should name, and the files.
type ShardPlan = (std::path::PathBuf, Vec<(std::path::PathBuf, Vec<String>)>);

fn folder_plan(op: &'static str, dir: &FsPath) -> Result<ShardPlan> {
    let single = dir.join(WEIGHTS_FILE);
    let index = dir.join(WEIGHTS_INDEX_FILE);
    if single.exists() || !index.exists() {
        return Ok((single.clone(), vec![(single, Vec::new())]));
    }
    let bad = |reason: String| Error::InvalidFile {
        op,
        path: index.display().to_string(),
        reason,
    };
    let text = std::fs::read_to_string(&index).map_err(|source| Error::Io {
        op,
        path: index.display().to_string(),
        source,
    })?;
    let value: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| bad(format!("not JSON: {e}")))?;
    let map = value
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| bad("no \"weight_map\" object".into()))?;
    let mut shards: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (name, file) in map {
        let file = file
            .as_str()
            .filter(|f| !f.contains('/') && !f.contains('\\') && f.ends_with(".safetensors"))
            .ok_or_else(|| bad(format!("weight_map[{name:?}] is not a shard file name")))?;
        shards
            .entry(file.to_string())
            .or_default()
            .push(name.clone());
    }
    let files = shards
        .into_iter()
        .map(|(file, names)| (dir.join(file), names))
        .collect();
    Ok((index, files))
}

/// The error for a shard that lacks a tensor the index maps to it.
fn shard_lacks(op: &'static str, path: &FsPath, missing: &str) -> Error {
    Error::InvalidFile {
        op,
        path: path.display().to_string(),
        reason: format!("the index maps {missing} to this shard, which does not hold it"),
    }
}

/// Reads a model folder's weights: `model.safetensors`, or the shards that
/// `model.safetensors.index.json` names (each read once; a tensor the index maps to a shard
/// that does not hold it, or a missing or unreadable shard, is an error naming the file).
/// Returns the path errors about the weights should name, and the tensors.
pub(crate) fn read_folder(
    op: &'static str,
    dir: &FsPath,
) -> Result<(std::path::PathBuf, Vec<(String, Tensor)>)> {
    let (path, files) = folder_plan(op, dir)?;
    let mut out = Vec::new();
    for (file, names) in files {
        let tensors = read_tensors(op, &file)?;
        let held: std::collections::BTreeSet<&str> =
            tensors.iter().map(|(n, _)| n.as_str()).collect();
        if let Some(missing) = names.iter().find(|n| !held.contains(n.as_str())) {
            return Err(shard_lacks(op, &file, missing));
        }
        out.extend(tensors);
    }
    Ok((path, out))
}

/// The special ids of a folder's `generation_config.json` (`bos`, `eos`, `pad`; a list of EOS
/// ids gives its first), `None` each where absent; `Ok(None)` without the file.
pub(crate) fn generation_ids(dir: &FsPath) -> Result<Option<[Option<i64>; 3]>> {
    let op = "weights::generation_ids";
    let file = dir.join(GENERATION_CONFIG_FILE);
    if !file.exists() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(&file).map_err(|source| Error::Io {
        op,
        path: file.display().to_string(),
        source,
    })?;
    let value: serde_json::Value = serde_json::from_str(&text).map_err(|e| Error::InvalidFile {
        op,
        path: file.display().to_string(),
        reason: format!("not JSON: {e}"),
    })?;
    let id = |key: &str| -> Option<i64> {
        match value.get(key)? {
            serde_json::Value::Array(v) => v.first().and_then(|x| x.as_i64()),
            v => v.as_i64(),
        }
    };
    Ok(Some([
        id("bos_token_id"),
        id("eos_token_id"),
        id("pad_token_id"),
    ]))
}

/// Reads a safetensors file into `(name, tensor)` pairs, errors naming the file.
pub(crate) fn read_tensors(op: &'static str, file: &FsPath) -> Result<Vec<(String, Tensor)>> {
    if !file.exists() {
        return Err(Error::Io {
            op,
            path: file.display().to_string(),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such file"),
        });
    }
    // the header is checked first (offsets, sizes, dtypes), so that what reaches libtorch is
    // a well-formed file and its errors never stand for ours
    read_header(op, file)?;
    Tensor::read_safetensors(file).map_err(|e| Error::InvalidFile {
        op,
        path: file.display().to_string(),
        reason: format!(
            "not a safetensors file: {}",
            e.to_string().lines().next().unwrap_or_default()
        ),
    })
}

/// Copies `tensors` into `params` by name after checking that names and shapes match exactly.
pub(crate) fn load_into(
    op: &'static str,
    file: &FsPath,
    params: &[(String, &Tensor)],
    tensors: Vec<(String, Tensor)>,
    tied: Option<(&str, &Tensor)>,
) -> Result<()> {
    let expected: BTreeMap<String, Vec<i64>> =
        params.iter().map(|(n, p)| (n.clone(), p.size())).collect();
    let mut given = BTreeMap::new();
    let mut values = BTreeMap::new();
    let mut tied_shape_error = None;
    for (name, t) in tensors {
        let name = canonical(&name);
        if is_buffer(&name) {
            continue;
        }
        if let Some((tied_name, tied_to)) = tied {
            if name == tied_name {
                if t.size() != tied_to.size() {
                    tied_shape_error = Some(format!(
                        "{name} (tied to the token embedding: expected {}, got {})",
                        ShapeFmt(&tied_to.size()),
                        ShapeFmt(&t.size())
                    ));
                }
                continue;
            }
        }
        given.insert(name.clone(), t.size());
        values.insert(name, t);
    }
    let mut reasons = fit_report(&expected, &given);
    reasons.extend(tied_shape_error);
    if !reasons.is_empty() {
        return Err(Error::InvalidFile {
            op,
            path: file.display().to_string(),
            reason: format!("does not fit the model: {}", reasons.join("; ")),
        });
    }
    let _guard = tch::no_grad_guard();
    for (name, p) in params {
        if let Some(src) = values.get(name) {
            let mut dst = p.shallow_clone();
            dst.f_copy_(&src.f_to_kind(p.kind())?.f_to_device(p.device())?)?;
        }
    }
    Ok(())
}

/// Writes `(name, tensor)` pairs to `file` through a temporary file and a rename.
pub(crate) fn write_tensors(
    op: &'static str,
    file: &FsPath,
    params: &[(String, &Tensor)],
) -> Result<()> {
    let cpu: Vec<(String, Tensor)> = params
        .iter()
        .map(|(n, p)| {
            Ok((
                n.clone(),
                p.f_detach()?.f_to_device(Device::Cpu)?.f_contiguous()?,
            ))
        })
        .collect::<Result<_>>()?;
    let tmp = file.with_extension("safetensors.tmp");
    Tensor::write_safetensors(&cpu, &tmp).map_err(|e| Error::InvalidFile {
        op,
        path: tmp.display().to_string(),
        reason: format!("could not write safetensors: {e}"),
    })?;
    std::fs::rename(&tmp, file).map_err(|source| Error::Io {
        op,
        path: file.display().to_string(),
        source,
    })
}

/// Writes a model folder: `config.json` and `model.safetensors` with `params`, atomically per
/// file, creating `dir` if needed.
pub(crate) fn save_folder(
    op: &'static str,
    dir: &FsPath,
    config_json: &str,
    params: &[(String, &Tensor)],
) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|source| Error::Io {
        op,
        path: dir.display().to_string(),
        source,
    })?;
    write_tensors(op, &dir.join(WEIGHTS_FILE), params)?;
    write_text(op, &dir.join(CONFIG_FILE), config_json)
}

/// Reads a `config.json` as `T`; errors name the file and, for JSON that is not a `what`
/// config, serde's reason.
pub(crate) fn read_config<T: serde::de::DeserializeOwned>(
    op: &'static str,
    path: &FsPath,
    what: &str,
) -> Result<T> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
        op,
        path: path.display().to_string(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|e| Error::InvalidFile {
        op,
        path: path.display().to_string(),
        reason: format!(
            "not a {what} config.json (at field {}): {e}",
            crate::error::json_path_at(&text, e.line(), e.column())
        ),
    })
}

/// `config` as `transformers` writes `config.json`: pretty JSON with `architectures` set to
/// `[architecture]` and the `extra` fields (resolved values) added.
pub(crate) fn config_json(
    op: &'static str,
    config: &impl serde::Serialize,
    architecture: &str,
    extra: &[(&str, serde_json::Value)],
) -> Result<String> {
    let mut value = serde_json::to_value(config)
        .map_err(|e| Error::invalid(op, format!("serialisation: {e}")))?;
    if let serde_json::Value::Object(map) = &mut value {
        map.insert(
            "architectures".into(),
            serde_json::Value::from(vec![architecture]),
        );
        for (k, v) in extra {
            map.insert((*k).into(), v.clone());
        }
    }
    serde_json::to_string_pretty(&value)
        .map_err(|e| Error::invalid(op, format!("serialisation: {e}")))
}

/// Writes `text` to `file` through a temporary file and a rename.
pub(crate) fn write_text(op: &'static str, file: &FsPath, text: &str) -> Result<()> {
    let tmp = file.with_extension("json.tmp");
    let io = |source| Error::Io {
        op,
        path: file.display().to_string(),
        source,
    };
    std::fs::write(&tmp, text).map_err(io)?;
    std::fs::rename(&tmp, file).map_err(io)
}

/// One tensor of a safetensors header: its dtype (safetensors' name) and shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HeaderEntry {
    /// `"F32"`, `"BF16"`, …
    pub(crate) dtype: String,
    /// The shape.
    pub(crate) shape: Vec<i64>,
}

/// The largest header read (safetensors' own limit).
const MAX_HEADER_BYTES: u64 = 100_000_000;

/// The safetensors dtypes libtorch reads here (through `tch`).
const READABLE_DTYPES: &str = "BOOL, U8, I8, I16, I32, I64, F16, BF16, F32, F64";

/// The bytes per element of a safetensors dtype this library reads.
fn dtype_bytes(dtype: &str) -> Option<u64> {
    Some(match dtype {
        "BOOL" | "U8" | "I8" => 1,
        "I16" | "F16" | "BF16" => 2,
        "I32" | "F32" => 4,
        "I64" | "F64" => 8,
        _ => return None,
    })
}

/// Whether a safetensors dtype is a floating-point one (what model weights must be).
fn is_float_dtype(dtype: &str) -> bool {
    matches!(dtype, "F16" | "BF16" | "F32" | "F64")
}

/// Reads and checks a safetensors file's header without reading any tensor: the 8-byte
/// length, the JSON, and for every tensor a known dtype, a shape whose byte size does not
/// overflow, and data offsets that lie in the file and tile its data exactly (what the
/// `safetensors` crate checks on a full read). Errors name the file and the tensor or byte
/// offset.
pub(crate) fn read_header(
    op: &'static str,
    file: &FsPath,
) -> Result<BTreeMap<String, HeaderEntry>> {
    use std::io::Read;
    let path = file.display().to_string();
    let io = |source| Error::Io {
        op,
        path: path.clone(),
        source,
    };
    let bad = |reason: String| Error::InvalidFile {
        op,
        path: path.clone(),
        reason,
    };
    let mut f = std::fs::File::open(file).map_err(io)?;
    let file_len = f.metadata().map_err(io)?.len();
    let mut len_bytes = [0u8; 8];
    if file_len < 8 {
        return Err(bad(format!(
            "not a safetensors file: {file_len} bytes, shorter than the 8-byte header length"
        )));
    }
    f.read_exact(&mut len_bytes).map_err(io)?;
    let n = u64::from_le_bytes(len_bytes);
    let data_len = file_len - 8;
    if n > MAX_HEADER_BYTES || n > data_len {
        return Err(bad(format!(
            "not a safetensors file: header length {n} at byte 0 is past the file's \
             {data_len} bytes after it (or the limit {MAX_HEADER_BYTES})"
        )));
    }
    let data_len = data_len - n;
    let mut header = vec![0u8; usize::try_from(n).map_err(|_| bad("header too long".into()))?];
    f.read_exact(&mut header).map_err(io)?;
    let value: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(&header)
        .map_err(|e| {
            bad(format!(
                "not a safetensors file: the header (bytes 8..{}) is not a JSON object: {e}",
                8 + n
            ))
        })?;
    let mut out = BTreeMap::new();
    let mut spans = Vec::with_capacity(value.len());
    for (name, entry) in value {
        if name == "__metadata__" {
            continue;
        }
        let tensor = |what: &str| bad(format!("tensor {name}: {what}"));
        let dtype = entry
            .get("dtype")
            .and_then(|d| d.as_str())
            .ok_or_else(|| tensor("no string \"dtype\""))?;
        let size = dtype_bytes(dtype).ok_or_else(|| {
            tensor(&format!(
                "dtype {dtype:?} is not one this library reads ({READABLE_DTYPES})"
            ))
        })?;
        let dims = entry
            .get("shape")
            .and_then(|s| s.as_array())
            .ok_or_else(|| tensor("no \"shape\" list"))?;
        let mut shape = Vec::with_capacity(dims.len());
        let mut bytes = size;
        for d in dims {
            let d = d
                .as_u64()
                .filter(|&d| i64::try_from(d).is_ok())
                .ok_or_else(|| tensor(&format!("shape entry {d} is not a size")))?;
            bytes = bytes
                .checked_mul(d)
                .ok_or_else(|| tensor("its byte size overflows"))?;
            shape.push(d as i64);
        }
        let offsets = entry
            .get("data_offsets")
            .and_then(|o| o.as_array())
            .and_then(|o| match o.as_slice() {
                [b, e] => Some((b.as_u64()?, e.as_u64()?)),
                _ => None,
            })
            .ok_or_else(|| tensor("no \"data_offsets\" pair"))?;
        let (begin, end) = offsets;
        if begin > end || end > data_len || end - begin != bytes {
            return Err(tensor(&format!(
                "data_offsets [{begin}, {end}] do not hold its {bytes} bytes inside the \
                 {data_len} data bytes"
            )));
        }
        spans.push((begin, end, name.clone()));
        out.insert(
            name,
            HeaderEntry {
                dtype: dtype.to_string(),
                shape,
            },
        );
    }
    spans.sort();
    let mut at = 0u64;
    for (begin, end, name) in &spans {
        if *begin != at {
            return Err(bad(format!(
                "tensor {name}: data starts at byte {begin} of the data, expected {at} \
                 (tensors must tile the data)"
            )));
        }
        at = *end;
    }
    if at != data_len {
        return Err(bad(format!(
            "the tensors hold {at} data bytes, the file {data_len} (truncated or padded)"
        )));
    }
    Ok(out)
}

/// Checks that the weights of the folder `dir` (`model.safetensors`, or the shards of its
/// index) are what the config `config_file` describes (`expected`: name → shape, as
/// `transformers` names them) by reading their headers only, before any module is built: a
/// config that disagrees with its weights (a layer count, a width, a vocabulary) fails here,
/// naming both files, instead of allocating a model first. `tied`: the name of an LM head
/// tied to `tied_to` (checked for shape, not expected).
pub(crate) fn check_folder_fits(
    op: &'static str,
    dir: &FsPath,
    config_file: &FsPath,
    expected: &BTreeMap<String, Vec<i64>>,
    tied: Option<(&str, &str)>,
) -> Result<()> {
    let (path, files) = folder_plan(op, dir)?;
    let mut given = BTreeMap::new();
    let mut twice = Vec::new();
    for (file, names) in files {
        if !file.exists() {
            return Err(Error::Io {
                op,
                path: file.display().to_string(),
                source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such file"),
            });
        }
        let header = read_header(op, &file)?;
        if let Some(missing) = names.iter().find(|n| !header.contains_key(n.as_str())) {
            return Err(shard_lacks(op, &file, missing));
        }
        for (name, entry) in header {
            if given.insert(canonical(&name), entry).is_some() {
                twice.push(name);
            }
        }
    }
    given.retain(|name, _| !is_buffer(name));
    let mut reasons = Vec::new();
    if !twice.is_empty() {
        reasons.push(format!("tensors held twice: {}", list(&twice)));
    }
    let not_float: Vec<String> = given
        .iter()
        .filter(|(_, e)| !is_float_dtype(&e.dtype))
        .map(|(n, e)| format!("{n} ({})", e.dtype))
        .collect();
    if !not_float.is_empty() {
        reasons.push(format!(
            "tensors that are not floating point: {}",
            list(&not_float)
        ));
    }
    let mut given: BTreeMap<String, Vec<i64>> =
        given.into_iter().map(|(n, e)| (n, e.shape)).collect();
    if let Some((head, to)) = tied {
        if let Some(shape) = given.remove(head) {
            if let Some(want) = expected.get(to).filter(|w| **w != shape) {
                reasons.push(format!(
                    "{head} (tied to {to}: expected {}, got {})",
                    ShapeFmt(want),
                    ShapeFmt(&shape)
                ));
            }
        }
    }
    reasons.extend(fit_report(expected, &given));
    if reasons.is_empty() {
        return Ok(());
    }
    Err(Error::InvalidFile {
        op,
        path: config_file.display().to_string(),
        reason: format!(
            "does not describe the weights of {}: {}",
            path.display(),
            reasons.join("; ")
        ),
    })
}
