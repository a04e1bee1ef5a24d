//! [`TensorDictModule`]: tensordict.nn's `TensorDictModule`, a computation that reads
//! `in_keys` from a [`TensorDict`] and writes `out_keys` into it.
//!
//! - [`TensorDictModule`] is the trait every policy piece implements (modules, sequences,
//!   actors, value operators); it is object safe, so pieces are composed as
//!   `Box<dyn TensorDictModule>`.
//! - [`from_fn`] wraps a closure `Fn(&[&Tensor]) -> Result<Vec<Tensor>>` with given in/out keys
//!   (one output per out key).
//! - [`TdModule`] wraps a tensor model: any [`tch::nn::Module`] or [`tch::nn::ModuleT`] (through
//!   the [`TensorModule`] trait, which they get for free), or this crate's
//!   [`MLP`](super::models::MLP). Several in keys are concatenated along the last dim (as
//!   TorchRL's `MLP` does); several out keys split the output's last dim (equal chunks, or given
//!   sizes).
//!
//! **Checks** (TorchRL's semantics, with errors that say what to fix): a missing in key is an
//! [`Error::KeyNotFound`] naming the module, the key and the keys that are there; an output
//! whose leading dims are not the tensordict's batch size is an [`Error::BatchSizeMismatch`]
//! naming the out key; a closure returning the wrong number of outputs is an
//! [`Error::InvalidArgument`] listing the out keys.
//!
//! **Gradients**: `forward` keeps the autograd graph (losses call it). A policy used in a
//! rollout should not build one: [`TensorDictModule::as_policy`] runs `forward` under
//! `tch::no_grad_guard()`, as TorchRL's collectors do.
//!
//! ```
//! use tch::{Kind, Tensor};
//! use torchrl::modules::module::{from_fn, TensorDictModule};
//! use torchrl::{Error, TensorDict};
//! # fn main() -> torchrl::Result<()> {
//! let add = from_fn(["a", "b"], ["sum", "diff"], |x: &[&Tensor]| {
//!     Ok(vec![x[0].f_add(x[1])?, x[0].f_sub(x[1])?])
//! })?;
//! assert_eq!(add.in_keys(), ["a", "b"]);
//! let td = TensorDict::new([2])?
//!     .with("a", Tensor::from_slice(&[1.0f32, 2.0]))?
//!     .with("b", Tensor::from_slice(&[0.5f32, 0.5]))?;
//! let td = add.forward(td)?;
//! assert_eq!(Vec::<f32>::try_from(td.get_or_err("sum")?)?, vec![1.5, 2.5]);
//! assert_eq!(Vec::<f32>::try_from(td.get_or_err("diff")?)?, vec![0.5, 1.5]);
//!
//! // a missing input names the key and what is there
//! let err = add.forward(TensorDict::new([2])?.with("a", Tensor::zeros([2], (Kind::Float, tch::Device::Cpu)))?)
//!     .unwrap_err();
//! assert!(matches!(err, Error::KeyNotFound { .. }));
//! assert!(err.to_string().contains("\"b\"") && err.to_string().contains("\"a\""), "{err}");
//! # Ok(()) }
//! ```

use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};

use tch::{Device, Kind, Tensor};

use crate::error::{Error, Result, ShapeFmt};
use crate::tensordict::{check_key, fmt_key_list, leading_dims_are, AsKey, NestedKey, TensorDict};

/// A computation that reads `in_keys` from a [`TensorDict`] and writes `out_keys` into it
/// (tensordict.nn's `TensorDictModuleBase`).
///
/// `forward` takes the tensordict by value and returns it with the outputs written (the
/// inputs stay). Implementations must be `Send` so that a policy can move to a worker thread.
pub trait TensorDictModule: Send {
    /// The keys read, in order.
    fn in_keys(&self) -> Vec<NestedKey>;

    /// The keys written, in order.
    fn out_keys(&self) -> Vec<NestedKey>;

    /// Reads the in keys of `td`, computes, and writes the out keys. Gradients are kept; see
    /// [`TensorDictModule::as_policy`] for rollouts.
    fn forward(&self, td: TensorDict) -> Result<TensorDict>;

    /// Switches training mode (PyTorch's `.train()` / `.eval()`): modules with a train flag
    /// (a [`TdModule`] around a [`tch::nn::ModuleT`]) pass it on; containers forward it to their
    /// children. The default does nothing.
    fn set_train(&mut self, _train: bool) {}

    /// A rollout policy: `forward` under `tch::no_grad_guard()` (no autograd graph is built,
    /// as in TorchRL's collectors), in the shape [`EnvBase::rollout`](crate::EnvBase::rollout)
    /// takes (`Some(&mut policy)`).
    fn as_policy(&self) -> impl FnMut(TensorDict) -> Result<TensorDict> + '_
    where
        Self: Sized,
    {
        move |td| {
            let _guard = tch::no_grad_guard();
            self.forward(td)
        }
    }
}

impl<M: TensorDictModule + ?Sized> TensorDictModule for Box<M> {
    fn in_keys(&self) -> Vec<NestedKey> {
        (**self).in_keys()
    }

    fn out_keys(&self) -> Vec<NestedKey> {
        (**self).out_keys()
    }

    fn forward(&self, td: TensorDict) -> Result<TensorDict> {
        (**self).forward(td)
    }

    fn set_train(&mut self, train: bool) {
        (**self).set_train(train)
    }
}

// ------------------------------------------------------------------ shared helpers

/// Owned keys from any list of keys; an empty key (no segment) is an error.
pub(crate) fn to_keys<K: AsKey>(
    op: &'static str,
    keys: impl IntoIterator<Item = K>,
) -> Result<Vec<NestedKey>> {
    keys.into_iter()
        .map(|k| {
            check_key(op, &k.segments())?;
            Ok(k.to_nested_key())
        })
        .collect()
}

/// The leaf at `key`, or the lookup error of `td` (naming the key and the available keys)
/// under `op`.
pub(crate) fn read_input<'a>(
    op: &'static str,
    td: &'a TensorDict,
    key: &NestedKey,
) -> Result<&'a Tensor> {
    let segs = key.segments();
    td.get(&segs[..]).ok_or_else(|| td.lookup_error(op, &segs))
}

/// The leaves at `keys`, in order.
pub(crate) fn read_inputs<'a>(
    op: &'static str,
    td: &'a TensorDict,
    keys: &[NestedKey],
) -> Result<Vec<&'a Tensor>> {
    keys.iter().map(|k| read_input(op, td, k)).collect()
}

/// Which of a module's `out_keys` holds the output a caller wants: the first of `preferred`
/// that the module declares, else its only out key, else `None`.
pub(crate) fn pick_out_key(out_keys: &[NestedKey], preferred: &[&NestedKey]) -> Option<NestedKey> {
    if let Some(k) = preferred.iter().find(|k| out_keys.contains(k)) {
        return Some((*k).clone());
    }
    match out_keys {
        [only] => Some(only.clone()),
        _ => None,
    }
}

/// Checks that `value`'s leading dims are `td`'s batch size, naming `key` otherwise.
pub(crate) fn check_output(
    op: &'static str,
    td: &TensorDict,
    key: &NestedKey,
    value: &Tensor,
) -> Result<()> {
    if leading_dims_are(value, td.batch_size()) {
        Ok(())
    } else {
        Err(Error::BatchSizeMismatch {
            op,
            key: key.to_string(),
            batch_size: td.batch_size().to_vec(),
            shape: value.size(),
        })
    }
}

/// Checks every output (count and batch dims) before writing any, then writes them.
pub(crate) fn write_outputs(
    op: &'static str,
    td: &mut TensorDict,
    keys: &[NestedKey],
    outputs: Vec<Tensor>,
) -> Result<()> {
    if outputs.len() != keys.len() {
        return Err(Error::InvalidValue {
            op,
            what: "outputs for out keys",
            key: fmt_key_list(keys),
            expected: format!("{} output(s), one per out key", keys.len()),
            got: format!(
                "the module returned {} output(s) for {} out key(s) {}",
                outputs.len(),
                keys.len(),
                fmt_key_list(keys)
            ),
        });
    }
    for (k, v) in keys.iter().zip(&outputs) {
        check_output(op, td, k, v)?;
    }
    for (k, v) in keys.iter().zip(outputs) {
        td.set(k, v)?;
    }
    Ok(())
}

// ------------------------------------------------------------------ closures

/// A [`TensorDictModule`] around a closure (see [`from_fn`]).
pub struct FnModule<F> {
    f: F,
    in_keys: Vec<NestedKey>,
    out_keys: Vec<NestedKey>,
}

/// Wraps a closure as a [`TensorDictModule`]: it receives the in keys' tensors in order and
/// returns one tensor per out key (tensordict.nn's `TensorDictModule(lambda ..., in_keys,
/// out_keys)`). Errors when a key is empty.
pub fn from_fn<F, I, O>(
    in_keys: impl IntoIterator<Item = I>,
    out_keys: impl IntoIterator<Item = O>,
    f: F,
) -> Result<FnModule<F>>
where
    F: Fn(&[&Tensor]) -> Result<Vec<Tensor>> + Send,
    I: AsKey,
    O: AsKey,
{
    Ok(FnModule {
        f,
        in_keys: to_keys("from_fn", in_keys)?,
        out_keys: to_keys("from_fn", out_keys)?,
    })
}

impl<F> fmt::Debug for FnModule<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "FnModule(in_keys={}, out_keys={})",
            fmt_key_list(&self.in_keys),
            fmt_key_list(&self.out_keys)
        )
    }
}

impl<F> TensorDictModule for FnModule<F>
where
    F: Fn(&[&Tensor]) -> Result<Vec<Tensor>> + Send,
{
    fn in_keys(&self) -> Vec<NestedKey> {
        self.in_keys.clone()
    }

    fn out_keys(&self) -> Vec<NestedKey> {
        self.out_keys.clone()
    }

    fn forward(&self, mut td: TensorDict) -> Result<TensorDict> {
        let op = "FnModule::forward";
        let outputs = {
            let inputs = read_inputs(op, &td, &self.in_keys)?;
            (self.f)(&inputs)?
        };
        write_outputs(op, &mut td, &self.out_keys, outputs)?;
        Ok(td)
    }
}

// ------------------------------------------------------------------ tensor models

/// A model from tensors to one tensor, fallible: what a [`TdModule`] runs.
///
/// Every [`tch::nn::ModuleT`] (hence every [`tch::nn::Module`]) implements it: several inputs
/// are concatenated along the last dim, and a panic inside the tch module (tch's infallible
/// ops panic on bad shapes) is caught and returned as an [`Error::InvalidArgument`] (the
/// default panic hook still prints it). [`MLP`](super::models::MLP) implements it without
/// panicking.
pub trait TensorModule: Send {
    /// Runs the model on `inputs` (in in-key order); `train` is the training-mode flag.
    fn forward_many(&self, inputs: &[&Tensor], train: bool) -> Result<Tensor>;

    /// The model's name in error messages (`"MLP"`). Default: `"tch module"`.
    fn module_name(&self) -> &'static str {
        "tch module"
    }

    /// The dtype and device the model's parameters need their inputs in, when it has any:
    /// a [`TdModule`] checks every input against them before running the model, so a float64
    /// observation into a float32 model is an error naming the key. Default: `None` (no
    /// check).
    fn input_dtype_device(&self) -> Option<(Kind, Device)> {
        None
    }
}

/// A dtype as PyTorch prints it (`float32`, `int64`).
pub(crate) fn dtype_name(kind: Kind) -> String {
    match kind {
        Kind::Float => "float32".into(),
        Kind::Double => "float64".into(),
        Kind::Half => "float16".into(),
        Kind::BFloat16 => "bfloat16".into(),
        Kind::Int64 => "int64".into(),
        Kind::Int => "int32".into(),
        Kind::Int16 => "int16".into(),
        Kind::Int8 => "int8".into(),
        Kind::Uint8 => "uint8".into(),
        Kind::Bool => "bool".into(),
        other => format!("{other:?}"),
    }
}

/// `dtype shape` of a tensor, as errors print it (`float64 [5, 3]`).
pub(crate) fn describe(t: &Tensor) -> String {
    format!("{} {}", dtype_name(t.kind()), ShapeFmt(&t.size()))
}

/// libtorch's message without its C++ frames: the first line (what went wrong), not the
/// "Exception raised from …" / "frame #0" lines that follow. A panic message from tch's
/// infallible ops holds the error Debug-printed (`Torch("…\nException raised from …")`), its
/// newlines escaped: it is cut at the first escaped newline too.
pub(crate) fn first_line(message: &str) -> &str {
    let line = message.lines().next().unwrap_or("");
    line.split("\\n").next().unwrap_or(line).trim_end()
}

/// A libtorch error raised inside a module: its message cut to the first line, wrapped with
/// `context` (the module, its keys and its inputs). The crate's own errors already name what
/// failed and are returned unchanged.
pub(crate) fn module_error(err: Error, context: impl FnOnce() -> String) -> Error {
    match err {
        Error::Torch(tch::TchError::Torch(msg)) => {
            Error::Torch(tch::TchError::Torch(first_line(&msg).to_string())).context(context())
        }
        Error::Torch(other) => Error::Torch(other).context(context()),
        other => other,
    }
}

/// Concatenates `inputs` along the last dim (one input is returned as is).
pub(crate) fn cat_last(op: &'static str, inputs: &[&Tensor]) -> Result<Tensor> {
    match inputs {
        [] => Err(Error::invalid(op, "the module has no input")),
        [one] => Ok(one.shallow_clone()),
        many => {
            if let Some(t) = many.iter().find(|t| t.dim() == 0) {
                return Err(Error::argument(
                    op,
                    "inputs",
                    "inputs with at least one dim, to concatenate along the last dim",
                    format!(
                        "an input of shape {} (cannot concatenate inputs along the last dim)",
                        ShapeFmt(&t.size())
                    ),
                ));
            }
            Ok(Tensor::f_cat(many, -1)?)
        }
    }
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_string()
    }
}

impl<M: tch::nn::ModuleT> TensorModule for M {
    fn forward_many(&self, inputs: &[&Tensor], train: bool) -> Result<Tensor> {
        let op = "TdModule::forward";
        let x = cat_last(op, inputs)?;
        catch_unwind(AssertUnwindSafe(|| self.forward_t(&x, train))).map_err(|payload| {
            let message = panic_message(payload.as_ref());
            // tch's infallible ops panic with `…unwrap()… Err value: Torch("<libtorch>")`
            let message = message.split("Torch(\"").nth(1).unwrap_or(&message);
            Error::invalid(
                op,
                format!(
                    "the tch module panicked on an input {}: {}",
                    describe(&x),
                    first_line(message)
                ),
            )
        })
    }
}

/// A [`TensorDictModule`] around a tensor model ([`TensorModule`]: a [`tch::nn::Module`], a
/// [`tch::nn::ModuleT`], an [`MLP`](super::models::MLP)): tensordict.nn's
/// `TensorDictModule(module, in_keys, out_keys)`.
///
/// Several in keys are concatenated along the last dim. With one out key the output is
/// written as is; with several, its last dim is split into equal chunks (or into the sizes of
/// [`TdModule::with_split_sizes`]), one per out key. The training flag (default `true`, like
/// a fresh PyTorch module) is passed to `ModuleT::forward_t`.
pub struct TdModule<M> {
    pub(crate) module: M,
    pub(crate) in_keys: Vec<NestedKey>,
    pub(crate) out_keys: Vec<NestedKey>,
    pub(crate) split_sizes: Option<Vec<i64>>,
    pub(crate) train: bool,
}

impl<M> fmt::Debug for TdModule<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "TdModule(in_keys={}, out_keys={}, train={})",
            fmt_key_list(&self.in_keys),
            fmt_key_list(&self.out_keys),
            self.train
        )
    }
}

impl<M: TensorModule> TdModule<M> {
    /// Wraps `module`, reading `in_keys` (at least one) and writing `out_keys` (at least one).
    pub fn new<I: AsKey, O: AsKey>(
        module: M,
        in_keys: impl IntoIterator<Item = I>,
        out_keys: impl IntoIterator<Item = O>,
    ) -> Result<Self> {
        let op = "TdModule::new";
        let in_keys = to_keys(op, in_keys)?;
        let out_keys = to_keys(op, out_keys)?;
        if in_keys.is_empty() || out_keys.is_empty() {
            return Err(Error::argument(
                op,
                if in_keys.is_empty() {
                    "in_keys"
                } else {
                    "out_keys"
                },
                "at least one key (a TdModule needs at least one in key and one out key)",
                format!(
                    "in_keys={} and out_keys={}",
                    fmt_key_list(&in_keys),
                    fmt_key_list(&out_keys)
                ),
            ));
        }
        Ok(TdModule {
            module,
            in_keys,
            out_keys,
            split_sizes: None,
            train: true,
        })
    }

    /// Splits the output's last dim into these sizes (one per out key) instead of equal
    /// chunks. Errors when the count differs from the number of out keys or a size is < 1.
    pub fn with_split_sizes(mut self, sizes: impl Into<Vec<i64>>) -> Result<Self> {
        let sizes = sizes.into();
        if sizes.len() != self.out_keys.len() || sizes.iter().any(|s| *s < 1) {
            return Err(Error::config(
                "TdModule::with_split_sizes",
                "split_sizes",
                format!(
                    "one positive size per out key {}",
                    fmt_key_list(&self.out_keys)
                ),
                format!("{sizes:?}"),
            ));
        }
        self.split_sizes = Some(sizes);
        Ok(self)
    }

    /// Sets the training flag passed to the model (builder form of
    /// [`TensorDictModule::set_train`]).
    pub fn with_train(mut self, train: bool) -> Self {
        self.train = train;
        self
    }

    /// The training flag.
    pub fn train(&self) -> bool {
        self.train
    }

    /// The wrapped model.
    pub fn module(&self) -> &M {
        &self.module
    }

    /// The wrapped model, mutably.
    pub fn module_mut(&mut self) -> &mut M {
        &mut self.module
    }

    /// The wrapped model, consuming the wrapper.
    pub fn into_module(self) -> M {
        self.module
    }

    /// Splits `out` into one tensor per out key.
    fn split(&self, op: &'static str, out: Tensor) -> Result<Vec<Tensor>> {
        let n = self.out_keys.len();
        if n == 1 {
            return Ok(vec![out]);
        }
        let last = out.size().last().copied();
        let bad = |expected: String| Error::InvalidValue {
            op,
            what: "module output for out keys",
            key: fmt_key_list(&self.out_keys),
            expected,
            got: format!(
                "an output of shape {}, which cannot be split into them",
                ShapeFmt(&out.size())
            ),
        };
        let Some(last) = last else {
            return Err(bad("an output with at least one dim".into()));
        };
        let sizes = match &self.split_sizes {
            Some(s) => s.clone(),
            None => {
                if last % n as i64 != 0 {
                    return Err(bad(format!(
                        "a last dim that is a multiple of {n} (its last dim ({last}) is not)"
                    )));
                }
                vec![last / n as i64; n]
            }
        };
        if sizes.iter().sum::<i64>() != last {
            return Err(bad(format!(
                "a last dim equal to the sum of the split sizes {sizes:?} (they do not add up to \
                 its last dim ({last}))"
            )));
        }
        Ok(out.f_split_with_sizes(sizes.as_slice(), -1)?)
    }
}

impl<M: TensorModule> TensorDictModule for TdModule<M> {
    fn in_keys(&self) -> Vec<NestedKey> {
        self.in_keys.clone()
    }

    fn out_keys(&self) -> Vec<NestedKey> {
        self.out_keys.clone()
    }

    fn forward(&self, mut td: TensorDict) -> Result<TensorDict> {
        let op = "TdModule::forward";
        let out = {
            let inputs = read_inputs(op, &td, &self.in_keys)?;
            let name = self.module.module_name();
            if let Some((kind, device)) = self.module.input_dtype_device() {
                for (key, x) in self.in_keys.iter().zip(&inputs) {
                    if x.kind() != kind || x.device() != device {
                        return Err(Error::InvalidValue {
                            op,
                            what: "input at key",
                            key: key.to_string(),
                            expected: format!(
                                "{name} expects {} input on {device:?} (its parameters' dtype \
                                 and device)",
                                dtype_name(kind)
                            ),
                            got: format!("{} on {:?}", describe(x), x.device()),
                        });
                    }
                }
            }
            self.module.forward_many(&inputs, self.train).map_err(|e| {
                module_error(e, || {
                    let ins: Vec<String> = self
                        .in_keys
                        .iter()
                        .zip(&inputs)
                        .map(|(k, x)| format!("{k}: {}", describe(x)))
                        .collect();
                    format!("{name} in TdModule::forward (inputs {})", ins.join(", "))
                })
            })?
        };
        let outputs = self.split(op, out)?;
        write_outputs(op, &mut td, &self.out_keys, outputs)?;
        Ok(td)
    }

    fn set_train(&mut self, train: bool) {
        self.train = train;
    }
}
