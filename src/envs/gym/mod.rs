//! [`GymEnv`] (cargo feature `gym`): any [gymnasium](https://gymnasium.farama.org) environment
//! as an [`EnvBase`], through an embedded Python interpreter (pyo3), TorchRL's `GymEnv`.
//!
//! - **Specs from spaces**, as TorchRL builds them: `Box` → `Bounded` (`Unbounded` when a bound
//!   is infinite) with the space's shape and dtype; `Discrete(n)` → `Categorical(n)` for an
//!   observation, `OneHot(n)` for an action (TorchRL's default; `Categorical` with
//!   [`GymEnv::with_categorical_action_encoding`]); `MultiDiscrete(nvec)` →
//!   `MultiCategorical(nvec)`; `MultiBinary(n)` → `Binary(n)`; a `Dict` observation space →
//!   one entry per key (nested dicts nest), any other → `"observation"`. The reward is
//!   `Unbounded` float32 `[*B, 1]`; `done`, `terminated` and `truncated` are bool `[*B, 1]`, and
//!   `terminated` / `truncated` come from gymnasium apart (`done` is their or).
//! - **Seeds**: [`EnvBase::set_seed`] makes the next full reset `reset(seed=…)` (a vector env
//!   seeds its sub-envs `seed, seed + 1, …`, gymnasium's rule); later resets continue the
//!   env's own generator.
//! - **Batched**: [`GymEnv::vector`] wraps gymnasium's `SyncVectorEnv` of `num_envs` copies
//!   (batch `[num_envs]`) with autoreset disabled: a partial reset (`"_reset"` mask) becomes
//!   `reset(options={"reset_mask": mask})`, so the other sub-envs keep their state.
//!
//! The interpreter is the one the crate was built against (`PYO3_PYTHON`, else `python3`); its
//! site-packages are added to `sys.path`, so a virtual environment's `gymnasium` is found.
//!
//! ```no_run
//! use torchrl::envs::gym::GymEnv;
//! use torchrl::envs::{check_env_specs, EnvBase, RolloutConfig};
//! # fn main() -> torchrl::Result<()> {
//! let mut env = GymEnv::vector("Pendulum-v1", 4)?;
//! check_env_specs(&mut env, Some(0))?;
//! let traj = env.rollout(200, None, &RolloutConfig::default())?;
//! assert_eq!(traj.batch_size()[0], 4);
//! # Ok(()) }
//! ```

use std::ffi::CString;

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyModule;
use serde_json::Value;
use tch::{Device, Kind, Tensor};

use super::{read_action, EnvBase, EnvCore, EnvSpecs};
use crate::data::specs::{
    Binary, Bounded, Categorical, MultiCategorical, OneHot, TensorSpec, Unbounded,
};
use crate::error::{Error, Result};
use crate::tensordict::{AsKey, NestedKey, TensorDict};

const HELPER: &str = include_str!("helper.py");

/// A Python error as a crate error under `op`.
fn py_err(op: &'static str, e: PyErr) -> Error {
    Error::invalid(op, format!("gymnasium (Python): {e}"))
}

/// Adds the build interpreter's site-packages to `sys.path`, once (retried if it failed).
///
/// A `PyOnceLock`, not a `std::sync::Once`: `site.addsitedir` runs Python code (the `.pth`
/// files), during which the interpreter may hand the GIL to another thread; that thread would
/// then block on a `Once` while holding the GIL, and the first could never finish (the gym
/// tests hung this way on a loaded machine). `PyOnceLock` releases the GIL while it waits.
fn init_paths(py: Python<'_>) -> PyResult<()> {
    static PATHS: PyOnceLock<()> = PyOnceLock::new();
    PATHS
        .get_or_try_init(py, || -> PyResult<()> {
            let site = py.import("site")?;
            for p in option_env!("TORCHRL_GYM_SITE")
                .unwrap_or("")
                .split(':')
                .filter(|p| !p.is_empty())
            {
                site.call_method1("addsitedir", (p,))?;
            }
            Ok(())
        })
        .map(|_| ())
}

/// Runs Python source in the embedded interpreter (its `__main__` namespace), e.g. to define and
/// register a gymnasium environment before [`GymEnv::new`] makes it.
pub fn run_python(code: &str) -> Result<()> {
    let op = "gym::run_python";
    let code = CString::new(code).map_err(|e| Error::invalid(op, e.to_string()))?;
    Python::attach(|py| -> PyResult<()> {
        init_paths(py)?;
        py.run(&code, None, None)
    })
    .map_err(|e| py_err(op, e))
}

/// numpy dtype name → libtorch kind.
fn kind_of(op: &'static str, dtype: &str) -> Result<Kind> {
    Ok(match dtype {
        "float32" => Kind::Float,
        "float64" => Kind::Double,
        "float16" => Kind::Half,
        "int64" => Kind::Int64,
        "int32" => Kind::Int,
        "int16" => Kind::Int16,
        "int8" => Kind::Int8,
        "uint8" => Kind::Uint8,
        "bool" => Kind::Bool,
        other => {
            return Err(Error::invalid(
                op,
                format!("unsupported numpy dtype {other}"),
            ))
        }
    })
}

/// How actions go to gymnasium.
#[derive(Clone, Debug)]
enum ActionSpace {
    Box {
        dtype: String,
    },
    Discrete {
        start: i64,
        one_hot: bool,
        dtype: String,
    },
    MultiDiscrete {
        start: Vec<i64>,
        dtype: String,
    },
    MultiBinary {
        dtype: String,
    },
}

/// One observation leaf: gymnasium's key path, our key, its dtype and the values to subtract
/// (a discrete space's `start`).
#[derive(Clone, Debug)]
struct ObsLeaf {
    path: Vec<String>,
    key: NestedKey,
    kind: Kind,
    start: Option<Vec<i64>>,
}

/// A gymnasium environment. See the module docs.
pub struct GymEnv {
    core: EnvCore,
    handle: Py<PyAny>,
    vector: bool,
    action: ActionSpace,
    obs: Vec<ObsLeaf>,
    pending_seed: Option<u64>,
}

impl std::fmt::Debug for GymEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GymEnv")
            .field("specs", self.core.specs())
            .finish()
    }
}

fn field<'a>(v: &'a Value, k: &str, op: &'static str) -> Result<&'a Value> {
    v.get(k)
        .ok_or_else(|| Error::invalid(op, format!("space description without {k:?}: {v}")))
}

fn ints(v: &Value) -> Vec<i64> {
    v.as_array()
        .map(|a| a.iter().filter_map(Value::as_i64).collect())
        .unwrap_or_default()
}

fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .map(|a| a.iter().map(|x| x.as_f64().unwrap_or(f64::NAN)).collect())
        .unwrap_or_default()
}

/// The spec of a non-Dict space for a leaf of batch `batch`; `action` picks the action
/// encoding of `Discrete`.
fn leaf_spec(
    space: &Value,
    batch: &[i64],
    action: Option<bool>,
) -> Result<(TensorSpec, Kind, Option<Vec<i64>>)> {
    let op = "GymEnv (spaces to specs)";
    let ty = field(space, "type", op)?.as_str().unwrap_or("");
    let kind = kind_of(op, field(space, "dtype", op)?.as_str().unwrap_or(""))?;
    Ok(match ty {
        "Box" => {
            let shape = ints(field(space, "shape", op)?);
            let full: Vec<i64> = [batch, &shape].concat();
            let (low, high) = (
                floats(field(space, "low", op)?),
                floats(field(space, "high", op)?),
            );
            let finite = low.iter().chain(&high).all(|x| x.is_finite());
            let spec: TensorSpec = if finite {
                let t = |v: &[f64]| -> Result<Tensor> {
                    Ok(Tensor::f_from_slice(v)?
                        .f_to_kind(kind)?
                        .f_reshape(&shape)?
                        .f_expand(&full, false)?
                        .f_contiguous()?)
                };
                Bounded::from_tensors(t(&low)?, t(&high)?)?.into()
            } else {
                Unbounded::new().with_shape(&full)?.with_dtype(kind)?.into()
            };
            (spec, kind, None)
        }
        "Discrete" => {
            let n = field(space, "n", op)?.as_i64().unwrap_or(0);
            let start = field(space, "start", op)?.as_i64().unwrap_or(0);
            match action {
                Some(true) => {
                    let s = OneHot::new(n)?.with_shape([batch, &[n]].concat())?;
                    (s.into(), Kind::Int64, Some(vec![start]))
                }
                _ => {
                    let s = Categorical::new(n)?.with_shape(batch)?;
                    (s.into(), Kind::Int64, Some(vec![start]))
                }
            }
        }
        "MultiDiscrete" => {
            let nvec = ints(field(space, "nvec", op)?);
            let start = ints(field(space, "start", op)?);
            let len = nvec.len() as i64;
            let s = MultiCategorical::new(nvec)?.with_shape([batch, &[len]].concat())?;
            (s.into(), Kind::Int64, Some(start))
        }
        "MultiBinary" => {
            let shape = ints(field(space, "shape", op)?);
            let n: i64 = shape.iter().product();
            let s = Binary::new(n)?
                .with_shape([batch, &shape].concat())?
                .with_dtype(kind)?;
            (s.into(), kind, None)
        }
        other => {
            return Err(Error::invalid(
                op,
                format!("unsupported space type {other}"),
            ))
        }
    })
}

/// Observation leaves of `space` (nested for Dict spaces) under `prefix`.
fn obs_leaves(
    space: &Value,
    prefix: Vec<String>,
    batch: &[i64],
    out: &mut Vec<(ObsLeaf, TensorSpec)>,
) -> Result<()> {
    let op = "GymEnv (observation space)";
    if field(space, "type", op)?.as_str() == Some("Dict") {
        let spaces = field(space, "spaces", op)?
            .as_object()
            .ok_or_else(|| Error::invalid(op, "Dict space without a mapping"))?;
        for (k, s) in spaces {
            let mut p = prefix.clone();
            p.push(k.clone());
            obs_leaves(s, p, batch, out)?;
        }
        return Ok(());
    }
    let (spec, kind, start) = leaf_spec(space, batch, None)?;
    let key = if prefix.is_empty() {
        NestedKey::from("observation")
    } else {
        let parts: Vec<&str> = prefix.iter().map(String::as_str).collect();
        parts[..].to_nested_key()
    };
    out.push((
        ObsLeaf {
            path: prefix,
            key,
            kind,
            start,
        },
        spec,
    ));
    Ok(())
}

/// What gymnasium returns for one leaf: key path, values, shape, numpy dtype.
type Leaf = (Vec<String>, Vec<f64>, Vec<i64>, String);

impl GymEnv {
    /// `gymnasium.make(env_id)`, batch `[]`.
    pub fn new(env_id: &str) -> Result<Self> {
        GymEnv::build(env_id, None, "{}", false)
    }

    /// `num_envs` copies of `env_id` in gymnasium's `SyncVectorEnv`, batch `[num_envs]`.
    pub fn vector(env_id: &str, num_envs: usize) -> Result<Self> {
        GymEnv::build(env_id, Some(num_envs), "{}", false)
    }

    /// Like [`GymEnv::new`] / [`GymEnv::vector`] with keyword arguments for `gymnasium.make`
    /// (a JSON object, e.g. `{"max_episode_steps": 50}`).
    pub fn with_kwargs(env_id: &str, num_envs: Option<usize>, kwargs_json: &str) -> Result<Self> {
        GymEnv::build(env_id, num_envs, kwargs_json, false)
    }

    /// Rebuilds the specs with a `Categorical` action for a `Discrete` action space (TorchRL's
    /// `categorical_action_encoding=True`) instead of `OneHot`.
    pub fn with_categorical_action_encoding(self, categorical: bool) -> Result<Self> {
        let GymEnv { handle, vector, .. } = self;
        GymEnv::from_handle(handle, vector, categorical)
    }

    fn build(
        env_id: &str,
        num_envs: Option<usize>,
        kwargs_json: &str,
        categorical: bool,
    ) -> Result<Self> {
        let op = "GymEnv::new";
        if num_envs == Some(0) {
            return Err(Error::argument(op, "num_envs", "at least 1", "0"));
        }
        let code = CString::new(HELPER).map_err(|e| Error::invalid(op, e.to_string()))?;
        let handle = Python::attach(|py| -> PyResult<Py<PyAny>> {
            init_paths(py)?;
            let module =
                PyModule::from_code(py, &code, c"torchrl_gym_helper.py", c"torchrl_gym_helper")?;
            let h = module
                .getattr("Handle")?
                .call1((env_id, num_envs, kwargs_json))?;
            Ok(h.unbind())
        })
        .map_err(|e| py_err(op, e))?;
        GymEnv::from_handle(handle, num_envs.is_some(), categorical)
    }

    fn from_handle(handle: Py<PyAny>, vector: bool, categorical: bool) -> Result<Self> {
        let op = "GymEnv::new";
        let (desc, num) = Python::attach(|py| -> PyResult<(String, Option<i64>)> {
            let h = handle.bind(py);
            let desc: String = h.call_method0("describe")?.extract()?;
            let num: Option<i64> = if vector {
                Some(h.getattr("env")?.getattr("num_envs")?.extract()?)
            } else {
                None
            };
            Ok((desc, num))
        })
        .map_err(|e| py_err(op, e))?;
        let desc: Value =
            serde_json::from_str(&desc).map_err(|e| Error::invalid(op, e.to_string()))?;
        let batch: Vec<i64> = num.into_iter().collect();
        let mut leaves = Vec::new();
        obs_leaves(
            field(&desc, "observation", op)?,
            Vec::new(),
            &batch,
            &mut leaves,
        )?;
        let aspace = field(&desc, "action", op)?;
        let (aspec, _, astart) = leaf_spec(aspace, &batch, Some(!categorical))?;
        let dtype = field(aspace, "dtype", op)?
            .as_str()
            .unwrap_or("float32")
            .to_string();
        let action = match field(aspace, "type", op)?.as_str().unwrap_or("") {
            "Box" => ActionSpace::Box { dtype },
            "Discrete" => ActionSpace::Discrete {
                start: astart.and_then(|s| s.first().copied()).unwrap_or(0),
                one_hot: !categorical,
                dtype,
            },
            "MultiDiscrete" => ActionSpace::MultiDiscrete {
                start: astart.unwrap_or_default(),
                dtype,
            },
            "MultiBinary" => ActionSpace::MultiBinary { dtype },
            other => {
                return Err(Error::invalid(
                    op,
                    format!(
                        "unsupported action space {other} (a Dict action space is not supported)"
                    ),
                ))
            }
        };
        let one: Vec<i64> = [batch.as_slice(), &[1]].concat();
        let flag = || -> Result<TensorSpec> {
            Ok(Categorical::new(2)?
                .with_shape(&one)?
                .with_dtype(Kind::Bool)?
                .into())
        };
        let mut specs = EnvSpecs::new(&batch)?
            .with_action("action", aspec)?
            .with_reward("reward", Unbounded::new().with_shape(&one)?)?
            .with_done("done", flag()?)?
            .with_done("terminated", flag()?)?
            .with_done("truncated", flag()?)?;
        let mut obs = Vec::new();
        for (leaf, spec) in leaves {
            specs = specs.with_observation(&leaf.key, spec)?;
            obs.push(leaf);
        }
        Ok(GymEnv {
            core: EnvCore::new(specs)?,
            handle,
            vector,
            action,
            obs,
            pending_seed: None,
        })
    }

    fn batch(&self) -> Vec<i64> {
        self.core.specs().batch_size().to_vec()
    }

    /// Our observation entries from gymnasium's leaves.
    fn observations(&self, leaves: Vec<Leaf>, td: &mut TensorDict) -> Result<()> {
        let op = "GymEnv (observations)";
        for (path, values, shape, _dtype) in leaves {
            let Some(leaf) = self.obs.iter().find(|l| l.path == path) else {
                return Err(Error::invalid(op, format!("gymnasium returned an observation at {path:?} that its space does not declare")));
            };
            let mut t = Tensor::f_from_slice(&values)?.f_reshape(&shape)?;
            if let Some(start) = &leaf.start {
                match start.as_slice() {
                    // a Discrete space (a scalar per element) or a 1-long MultiDiscrete
                    [s] => t = t.f_sub_scalar(*s)?,
                    s if s.iter().any(|x| *x != 0) => {
                        t = t.f_sub(&Tensor::f_from_slice(s)?.f_to_kind(Kind::Double)?)?;
                    }
                    _ => {}
                }
            }
            td.set(&leaf.key, t.f_to_kind(leaf.kind)?)?;
        }
        Ok(())
    }

    fn flags(&self, values: &[f64]) -> Result<Tensor> {
        let one: Vec<i64> = [self.batch().as_slice(), &[1]].concat();
        Ok(Tensor::f_from_slice(values)?.f_ne(0.0)?.f_reshape(&one)?)
    }
}

impl EnvBase for GymEnv {
    fn core(&self) -> &EnvCore {
        &self.core
    }

    fn core_mut(&mut self) -> &mut EnvCore {
        &mut self.core
    }

    fn reset_impl(&mut self, td: Option<&TensorDict>) -> Result<TensorDict> {
        let op = "GymEnv::reset";
        let batch = self.batch();
        // a partial reset of a vector env: only the masked sub-envs
        let mask: Option<Vec<bool>> = match td.and_then(|t| t.get("_reset")) {
            Some(m) if self.vector => {
                let m = m
                    .f_to_kind(Kind::Bool)?
                    .f_reshape([batch.as_slice(), &[-1]].concat())?
                    .f_any_dim(-1, false)?;
                let v = Vec::<bool>::try_from(m.f_to_device(Device::Cpu)?)?;
                if v.iter().all(|x| *x) {
                    None
                } else {
                    Some(v)
                }
            }
            _ => None,
        };
        let seed = if mask.is_none() {
            self.pending_seed.take()
        } else {
            None
        };
        let leaves = Python::attach(|py| -> PyResult<Vec<Leaf>> {
            self.handle
                .bind(py)
                .call_method1("reset", (seed, mask))?
                .extract()
        })
        .map_err(|e| py_err(op, e))?;
        let mut out = TensorDict::new(batch.as_slice())?;
        self.observations(leaves, &mut out)?;
        let one: Vec<i64> = [batch.as_slice(), &[1]].concat();
        for k in ["done", "terminated", "truncated"] {
            out.set(k, Tensor::f_zeros(&one, (Kind::Bool, Device::Cpu))?)?;
        }
        Ok(out)
    }

    fn step_impl(&mut self, td: &TensorDict) -> Result<TensorDict> {
        let op = "GymEnv::step";
        let a = read_action(td, "action", self.core.specs())?;
        let (a, dtype) = match &self.action {
            ActionSpace::Box { dtype } | ActionSpace::MultiBinary { dtype } => {
                (a.shallow_clone(), dtype.clone())
            }
            ActionSpace::Discrete {
                start,
                one_hot,
                dtype,
            } => {
                let idx = if *one_hot {
                    a.f_to_kind(Kind::Int64)?.f_argmax(-1, false)?
                } else {
                    a.shallow_clone()
                };
                (idx.f_add_scalar(*start)?, dtype.clone())
            }
            ActionSpace::MultiDiscrete { start, dtype } => {
                (a.f_add(&Tensor::f_from_slice(start)?)?, dtype.clone())
            }
        };
        let shape = a.size();
        let values = Vec::<f64>::try_from(
            a.f_to_kind(Kind::Double)?
                .f_to_device(Device::Cpu)?
                .f_reshape([-1])?,
        )?;
        type Out = (Vec<Leaf>, Vec<f64>, Vec<f64>, Vec<f64>);
        let (leaves, reward, terminated, truncated) = Python::attach(|py| -> PyResult<Out> {
            self.handle
                .bind(py)
                .call_method1("step", (values, shape, dtype))?
                .extract()
        })
        .map_err(|e| py_err(op, e))?;
        let batch = self.batch();
        let one: Vec<i64> = [batch.as_slice(), &[1]].concat();
        let mut out = TensorDict::new(batch.as_slice())?;
        self.observations(leaves, &mut out)?;
        out.set(
            "reward",
            Tensor::f_from_slice(&reward)?
                .f_to_kind(Kind::Float)?
                .f_reshape(&one)?,
        )?;
        out.set("terminated", self.flags(&terminated)?)?;
        out.set("truncated", self.flags(&truncated)?)?;
        Ok(out)
    }

    fn set_seed_impl(&mut self, seed: u64) -> Result<()> {
        self.pending_seed = Some(seed);
        Ok(())
    }
}
