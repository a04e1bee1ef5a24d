//! The KL-to-reference transforms of TorchRL's LLM stack (`torchrl/envs/llm/transforms/kl.py`)
//! on token data:
//!
//! - [`RetrieveLogProb`]: the reference model's per-token log-probs of `("tokens", "full")`,
//!   written at `("next", "ref_log_probs", "full")` `[B, T]`; either by running a
//!   [`ScoreTokens`] ([`RetrieveLogProb::new`]) or by reading what a hydra policy computed in
//!   its own trunk pass ([`RetrieveLogProb::precomputed`]);
//! - [`KLComputation`]: `kl_penalty = (lp − ref)` on the response tokens (k1), written at
//!   `("next", "kl_penalty")` `[B, T]`, and `reward −= coeff · kl_penalty.unsqueeze(-1)`;
//! - [`RetrieveKL`]: the two composed (TorchRL's `RetrieveKL`);
//! - [`KLRewardTransform`]: TorchRL's `torchrl.envs.llm.KLRewardTransform` (marked legacy
//!   upstream), built from an existing frozen reference model; distinct from the classic
//!   actor-based [`envs::transforms::KLRewardTransform`](crate::envs::transforms::KLRewardTransform).
//!
//! # Data layout
//! The step hook reads the root tensordict `td` (batch `[B]`) and writes the next one:
//!
//! | key | where | shape | meaning |
//! |---|---|---|---|
//! | `("tokens", "full")` | root | `[B, T]` int64 | prompt + response |
//! | `("masks", "all_attention_mask")` | root | `[B, T]` | 1 on real tokens |
//! | `("masks", "all_assistant_mask")` | root | `[B, T]` | 1 on response tokens |
//! | `("log_probs", "full")` | root | `[B, T]` | the generating policy's log-probs |
//! | `("ref_log_probs", "full")` | next | `[B, T]` | the reference's (written here) |
//! | `"kl_penalty"` | next | `[B, T]` | the per-token KL estimate (written here) |
//! | `"reward"` | next | `[B, T, 1]` | the score; the KL term is subtracted here |
//!
//! Log-probs are aligned with the tokens ([`token_log_probs`](crate::modules::llm::token_log_probs)).
//! The generating log-probs are looked up in the root tensordict first, then in the next one
//! (where a `RetrieveLogProb` of the generating model would put them, as TorchRL's
//! `RetrieveKL` does); the reference log-probs in the next one first, then the root.
//!
//! # KL estimators
//! With `r = ref − lp` the log-ratio on tokens sampled from the policy π
//! (Schulman, <http://joschu.net/blog/kl-approx.html>), [`KlEstimator`] offers
//! - **k1** `= lp − ref = −r`: unbiased for KL(π‖ref), what trlX, TRL (default
//!   `kl_estimator="k1"`) and TorchRL's `KLComputation` put in the reward; the default;
//! - **k2** `= ½ r²`: biased, low variance;
//! - **k3** `= exp(r) − 1 − r = exp(ref − lp) − 1 − (ref − lp)`: unbiased for KL(π‖ref),
//!   always ≥ 0, lower variance; TRL's `kl_estimator="k3"` and TorchRL's loss-side KL.
//!   [`KLComputation::with_k3_key`] writes it next to the reward's k1 for logging.
//!
//! trlX (HEAD `make_experience`) logs and feeds its adaptive controller
//! `exp(lp − ref) − 1 − (lp − ref)`: the *inverted* form, i.e. k3 with `r = lp − ref`, which is
//! unbiased for KL(ref‖π) only on samples from ref, not on the policy's samples it is given.
//! It is not an estimator option here; [`trlx_logged_kl`] reproduces it for comparing logs
//! with trlX runs. With lp `[-1, -2, -0.5]` and ref `[-1.2, -1.5, -0.7]` (rlhf.md §5.3) k3 is
//! `[0.01873075, 0.14872127, 0.01873075]` and trlX's statistic `[0.02140276, 0.10653066,
//! 0.02140276]`.
//!
//! # Specs
//! As TorchRL, with "any length" (`-1`) sequence dims (see the [specs' dynamic
//! dims](crate::data::specs)): the reward spec becomes `Unbounded` `(*batch, -1, 1)` (in the parent
//! reward's dtype), and `kl_penalty` / `ref_log_probs.full` are `Unbounded` float32
//! observations `(*batch, -1)`: the sequence length `T` may change from one step to the next.
//!
//! ```
//! use tch::{Kind, Tensor};
//! use torchrl::envs::llm::KLComputation;
//! use torchrl::envs::transforms::Transform;
//! use torchrl::TensorDict;
//! # fn main() -> torchrl::Result<()> {
//! // one sequence: a prompt token, then three response tokens (rlhf.md §5.3)
//! let mut td = TensorDict::new([1])?;
//! td.set(("log_probs", "full"), Tensor::from_slice(&[0.0f32, -1.0, -2.0, -0.5]).view([1, 4]))?;
//! td.set(("masks", "all_assistant_mask"), Tensor::from_slice(&[false, true, true, true]).view([1, 4]))?;
//! let mut next = TensorDict::new([1])?;
//! next.set(("ref_log_probs", "full"), Tensor::from_slice(&[-3.0f32, -1.2, -1.5, -0.7]).view([1, 4]))?;
//! next.set("reward", Tensor::from_slice(&[0.0f32, 0.0, 0.0, 2.0]).view([1, 4, 1]))?;
//! let mut kl = KLComputation::new().with_coeff(0.1);
//! let next = kl.step(&td, next)?;
//! let r = Vec::<f32>::try_from(next.get_or_err("reward")?.view([-1]))?;
//! let want = [0.0f32, -0.02, 0.05, 1.98]; // the prompt position is masked out
//! assert!(r.iter().zip(want).all(|(a, b)| (a - b).abs() < 1e-6));
//! # Ok(()) }
//! ```

use std::fmt;

use tch::{Kind, Tensor};

use crate::data::specs::{TensorSpec, Unbounded};
use crate::envs::transforms::Transform;
use crate::envs::EnvSpecs;
use crate::error::{Error, Result};
use crate::macros::setters;
use crate::modules::llm::keys::{
    ASSISTANT_MASK_KEY, ATTENTION_MASK_KEY, FULL_KEY, FULL_LOG_PROBS_KEY, REF_LOG_PROBS_KEY,
};
use crate::modules::llm::ScoreTokens;
use crate::tensordict::{Entry, NestedKey, TensorDict};

// ------------------------------------------------------------------ estimators

pub use super::kl_estimator::KlEstimator;

/// trlX's logged (and controller-fed) KL statistic, `exp(lp − ref) − 1 − (lp − ref)`: the
/// inverted k3 (see the [module docs](self) for why it is not offered as an estimator).
/// For comparing logs with trlX runs.
///
/// ```
/// use tch::Tensor;
/// use torchrl::envs::llm::trlx_logged_kl;
/// let lp = Tensor::from_slice(&[-1.0f64, -2.0, -0.5]);
/// let rf = Tensor::from_slice(&[-1.2f64, -1.5, -0.7]);
/// let v = Vec::<f64>::try_from(trlx_logged_kl(&lp, &rf)?)?;
/// assert!((v[1] - 0.10653066).abs() < 1e-8); // rlhf.md §5.3
/// # Ok::<(), torchrl::Error>(())
/// ```
pub fn trlx_logged_kl(log_probs: &Tensor, ref_log_probs: &Tensor) -> Result<Tensor> {
    let lr = log_probs.f_sub(ref_log_probs)?;
    Ok(lr.f_exp()?.f_sub_scalar(1.0)?.f_sub(&lr)?)
}

// ------------------------------------------------------------------ shared helpers

/// Runs a step hook on offline data: on `td["next"]` when there is one (written back), else
/// on `td` itself (TorchRL's `forward` of these transforms).
pub(super) fn forward_via_step(
    op: &'static str,
    mut td: TensorDict,
    step: impl FnOnce(&TensorDict, TensorDict) -> Result<TensorDict>,
) -> Result<TensorDict> {
    match td.pop("next") {
        Ok(Entry::Dict(next)) => {
            let next = step(&td, next)?;
            td.set("next", next)?;
            Ok(td)
        }
        Ok(Entry::Tensor(_)) => Err(Error::WrongEntryKind {
            op,
            key: "\"next\"".into(),
            expected: "a tensordict",
            found: "a tensor",
        }),
        Err(_) => {
            let root = td.clone();
            step(&root, td)
        }
    }
}

/// The tensor at `key` in `first`, else in `second`; a [`Error::KeyNotFound`] naming both
/// places (`what` says which entry it is) when neither has it.
fn lookup<'a>(
    op: &'static str,
    key: &NestedKey,
    what: &str,
    first: (&'a TensorDict, &str),
    second: (&'a TensorDict, &str),
) -> Result<&'a Tensor> {
    if let Some(t) = first.0.get(key) {
        return Ok(t);
    }
    if let Some(t) = second.0.get(key) {
        return Ok(t);
    }
    Err(Error::KeyNotFound {
        op,
        key: format!(
            "{key} ({what}; looked up in the {} tensordict, then the {})",
            first.1, second.1
        ),
        available: first
            .0
            .keys(crate::tensordict::KeysOptions::nested_leaves())
            .into_iter()
            .map(|k| format!("{}: {k}", first.1))
            .chain(
                second
                    .0
                    .keys(crate::tensordict::KeysOptions::nested_leaves())
                    .into_iter()
                    .map(|k| format!("{}: {k}", second.1)),
            )
            .collect(),
    })
}

fn require_float(op: &'static str, key: &NestedKey, t: &Tensor, what: &str) -> Result<()> {
    let k = t.kind();
    if matches!(k, Kind::Float | Kind::Double | Kind::Half | Kind::BFloat16) {
        return Ok(());
    }
    Err(Error::value(
        op,
        key,
        format!("floating-point {what}"),
        format!("dtype {k:?}"),
    ))
}

/// `b` must have `a`'s shape; the error names both keys.
fn same_shape(
    op: &'static str,
    a_key: &NestedKey,
    a: &Tensor,
    b_key: &NestedKey,
    b: &Tensor,
) -> Result<()> {
    if a.size() == b.size() {
        return Ok(());
    }
    Err(Error::ShapeMismatch {
        op,
        key: format!("{b_key} (must have the shape of {a_key})"),
        expected: a.size(),
        actual: b.size(),
    })
}

/// `x` masked to the response tokens: `mask` (any dtype; nonzero = response) must have `x`'s
/// shape.
fn mask_to_response(
    op: &'static str,
    x_key: &NestedKey,
    x: &Tensor,
    mask_key: &NestedKey,
    mask: &Tensor,
) -> Result<Tensor> {
    same_shape(op, x_key, x, mask_key, mask)?;
    let keep = mask.f_ne(0)?;
    Ok(x.f_where_self(&keep, &x.f_zeros_like()?)?)
}

// ------------------------------------------------------------------ specs

/// An "any length" spec dim (TorchRL's `-1`): the sequence dim of the specs written here.
const ANY: i64 = -1;

/// `batch` followed by `tail`.
fn with_batch(batch: &[i64], tail: &[i64]) -> Vec<i64> {
    batch.iter().chain(tail).copied().collect()
}

/// The LLM reward spec: `Unbounded` `(*batch, -1, 1)` in the parent reward's dtype (float32
/// without one).
fn llm_reward_spec(specs: &EnvSpecs, parent: Option<&TensorSpec>) -> Result<TensorSpec> {
    let kind = parent.and_then(TensorSpec::dtype).unwrap_or(Kind::Float);
    Ok(Unbounded::new()
        .with_dynamic_shape(with_batch(specs.batch_size(), &[ANY, 1]))?
        .with_dtype(kind)?
        .with_device(specs.device())?
        .into())
}

/// The `kl_penalty` spec: `Unbounded` float32 `(*batch, -1)`.
fn kl_penalty_spec(specs: &EnvSpecs) -> Result<TensorSpec> {
    Ok(Unbounded::new()
        .with_dynamic_shape(with_batch(specs.batch_size(), &[ANY]))?
        .with_device(specs.device())?
        .into())
}

/// The `ref_log_probs.full` spec: `Unbounded` float32 `(*batch, -1)`.
fn ref_log_probs_spec(specs: &EnvSpecs) -> Result<TensorSpec> {
    Ok(Unbounded::new()
        .with_dynamic_shape(with_batch(specs.batch_size(), &[ANY]))?
        .with_device(specs.device())?
        .into())
}

// ------------------------------------------------------------------ RetrieveLogProb

/// Where [`RetrieveLogProb`] gets the reference log-probs.
pub enum LogProbSource {
    /// Run this model on the tokens every step.
    Model(Box<dyn ScoreTokens + Send>),
    /// Do not run anything: read the log-probs already computed at this key of the root
    /// tensordict (where a hydra policy writes the reference log-probs of its own trunk pass,
    /// [`LlmKeys::ref_log_probs`](crate::modules::llm::LlmKeys::ref_log_probs)), or keep the
    /// ones already present at the out key of the next tensordict. Missing from both: an
    /// error.
    Precomputed(NestedKey),
}

impl fmt::Debug for LogProbSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LogProbSource::Model(_) => write!(f, "Model(..)"),
            LogProbSource::Precomputed(k) => write!(f, "Precomputed({k})"),
        }
    }
}

/// TorchRL's `RetrieveLogProb`: a reference model's per-token log-probs of the full sequence,
/// written at the out key of the next tensordict (default `("ref_log_probs", "full")`),
/// masked to the response tokens when `assistant_only` (default, as TorchRL).
///
/// # Shapes
/// Reads `tokens` `[B, T]` int64 and `attention_mask` `[B, T]` (and the assistant mask
/// `[B, T]`) from the root tensordict; writes `[B, T]` float32.
///
/// ```
/// use tch::{nn::VarStore, Device, Kind, Tensor};
/// use torchrl::envs::llm::RetrieveLogProb;
/// use torchrl::envs::transforms::Transform;
/// use torchrl::modules::llm::{Gpt2Config, Gpt2Model, ScoreTokens};
/// use torchrl::TensorDict;
/// # fn main() -> torchrl::Result<()> {
/// let vs = VarStore::new(Device::Cpu);
/// let cfg = Gpt2Config::new(20).with_n_layer(1).with_n_embd(8).with_n_head(2).with_n_positions(8);
/// let reference = Gpt2Model::new(&vs.root(), &cfg)?;
/// let ids = Tensor::from_slice(&[1i64, 2, 3, 4]).view([1, 4]);
/// let mask = Tensor::ones([1, 4], (Kind::Int64, Device::Cpu));
/// let want = reference.token_log_probs(&ids, &mask)?;
/// let mut td = TensorDict::new([1])?;
/// td.set(("tokens", "full"), ids)?;
/// td.set(("masks", "all_attention_mask"), mask)?;
/// let mut t = RetrieveLogProb::new(reference).with_assistant_only(false);
/// let next = t.step(&td, TensorDict::new([1])?)?;
/// assert!(next.get_or_err(("ref_log_probs", "full"))?.equal(&want));
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct RetrieveLogProb {
    source: LogProbSource,
    tokens_key: NestedKey,
    attention_mask_key: NestedKey,
    assistant_mask_key: NestedKey,
    assistant_only: bool,
    out_key: NestedKey,
}

impl RetrieveLogProb {
    /// Runs `model` on `("tokens", "full")` every step (held by value: pass a borrow-free
    /// handle such as `Arc<Mutex<M>>` or a [`HydraReference`](crate::modules::llm::HydraReference)
    /// over one to share a model without copying it).
    pub fn new(model: impl ScoreTokens + Send + 'static) -> Self {
        Self::from_source(LogProbSource::Model(Box::new(model)))
    }

    /// Runs nothing: reads the reference log-probs a hydra policy wrote at
    /// `("ref_log_probs", "full")` of the root tensordict (see [`LogProbSource::Precomputed`];
    /// another key with [`Self::from_source`]).
    pub fn precomputed() -> Self {
        Self::from_source(LogProbSource::Precomputed(REF_LOG_PROBS_KEY.into()))
    }

    /// From an explicit source, with the default keys.
    pub fn from_source(source: LogProbSource) -> Self {
        RetrieveLogProb {
            source,
            tokens_key: FULL_KEY.into(),
            attention_mask_key: ATTENTION_MASK_KEY.into(),
            assistant_mask_key: ASSISTANT_MASK_KEY.into(),
            assistant_only: true,
            out_key: REF_LOG_PROBS_KEY.into(),
        }
    }

    /// The source.
    pub fn source(&self) -> &LogProbSource {
        &self.source
    }

    /// The key written in the next tensordict.
    pub fn out_key(&self) -> &NestedKey {
        &self.out_key
    }

    /// The log-probs for this step (`td` the root, `next` the next tensordict).
    fn log_probs(&self, td: &TensorDict, next: &TensorDict) -> Result<Tensor> {
        let op = "RetrieveLogProb::step";
        let tokens = td.get_or_err(&self.tokens_key)?;
        let lp = match &self.source {
            LogProbSource::Model(m) => {
                let mask = td.get_or_err(&self.attention_mask_key)?;
                same_shape(op, &self.tokens_key, tokens, &self.attention_mask_key, mask)?;
                // a reference's log-probs are data: never differentiated
                let _guard = tch::no_grad_guard();
                m.token_log_probs(tokens, mask)?
            }
            LogProbSource::Precomputed(key) => {
                let t = match (td.get(key), next.get(&self.out_key)) {
                    (Some(t), _) | (None, Some(t)) => t,
                    (None, None) => {
                        return Err(Error::KeyNotFound {
                            op,
                            key: format!(
                                "{key} (the precomputed reference log-probs: not in the root \
                                 tensordict, nor at {} of the next one)",
                                self.out_key
                            ),
                            available: td
                                .keys(crate::tensordict::KeysOptions::nested_leaves())
                                .iter()
                                .map(ToString::to_string)
                                .collect(),
                        })
                    }
                };
                require_float(op, key, t, "reference log-probs")?;
                t.shallow_clone()
            }
        };
        same_shape(op, &self.tokens_key, tokens, &self.out_key, &lp)?;
        if self.assistant_only {
            let mask = td.get_or_err(&self.assistant_mask_key)?;
            mask_to_response(op, &self.out_key, &lp, &self.assistant_mask_key, mask)
        } else {
            Ok(lp)
        }
    }
}

setters!(RetrieveLogProb {
    /// The token ids in the root tensordict (default `("tokens", "full")`).
    with_tokens_key(key: impl Into<NestedKey>) => tokens_key = key.into();
    /// The attention mask in the root tensordict (default `("masks", "all_attention_mask")`).
    with_attention_mask_key(key: impl Into<NestedKey>) => attention_mask_key = key.into();
    /// The response-token mask in the root tensordict (default
    /// `("masks", "all_assistant_mask")`).
    with_assistant_mask_key(key: impl Into<NestedKey>) => assistant_mask_key = key.into();
    /// Zero the log-probs outside the response tokens (default `true`, TorchRL's
    /// `assistant_only`).
    with_assistant_only(assistant_only: bool);
    /// The key written in the next tensordict (default `("ref_log_probs", "full")`; TorchRL's
    /// `log_probs_full_key`).
    with_out_key(key: impl Into<NestedKey>) => out_key = key.into();
});

impl Transform for RetrieveLogProb {
    fn name(&self) -> String {
        format!("RetrieveLogProb({:?} -> {})", self.source, self.out_key)
    }

    fn new_output_keys(&self) -> Vec<NestedKey> {
        vec![self.out_key.clone()]
    }

    fn transform_output_spec(&self, mut specs: EnvSpecs) -> Result<EnvSpecs> {
        let spec = ref_log_probs_spec(&specs)?;
        specs.observation.set(&self.out_key, spec)?;
        Ok(specs)
    }

    fn step(&mut self, td: &TensorDict, mut next: TensorDict) -> Result<TensorDict> {
        let lp = self.log_probs(td, &next)?;
        next.set(&self.out_key, lp)?;
        Ok(next)
    }

    fn forward(&mut self, td: TensorDict) -> Result<TensorDict> {
        forward_via_step("RetrieveLogProb::forward", td, |root, next| {
            self.step(root, next)
        })
    }
}

// ------------------------------------------------------------------ KLComputation

/// TorchRL's `KLComputation`: the per-token KL estimate between the generating and the
/// reference log-probs on the response tokens, written at `"kl_penalty"` of the next
/// tensordict, and (`add_to_reward`, default) `reward −= coeff · kl.unsqueeze(-1)`. See the
/// [module docs](self) for the keys and estimators.
///
/// The coefficient can change between steps ([`Self::set_coeff`]) for an adaptive KL
/// controller: reach the transform with `Compose::get_as_mut`.
///
/// # Shapes
/// Log-probs `[B, T]` (floating, one dtype), assistant mask `[B, T]`, reward `[B, T, 1]`;
/// writes `kl_penalty` `[B, T]`.
#[derive(Clone, Debug)]
pub struct KLComputation {
    gen_log_probs_key: NestedKey,
    ref_log_probs_key: NestedKey,
    assistant_mask_key: NestedKey,
    assistant_only: bool,
    kl_key: NestedKey,
    k3_key: Option<NestedKey>,
    reward_key: NestedKey,
    add_to_reward: bool,
    coeff: f64,
    estimator: KlEstimator,
}

impl Default for KLComputation {
    fn default() -> Self {
        Self::new()
    }
}

impl KLComputation {
    /// k1 into `"kl_penalty"` and the reward, `coeff = 1`, on the response tokens, with
    /// TorchRL's keys.
    pub fn new() -> Self {
        KLComputation {
            gen_log_probs_key: FULL_LOG_PROBS_KEY.into(),
            ref_log_probs_key: REF_LOG_PROBS_KEY.into(),
            assistant_mask_key: ASSISTANT_MASK_KEY.into(),
            assistant_only: true,
            kl_key: "kl_penalty".into(),
            k3_key: None,
            reward_key: "reward".into(),
            add_to_reward: true,
            coeff: 1.0,
            estimator: KlEstimator::K1,
        }
    }

    /// The KL coefficient.
    pub fn coeff(&self) -> f64 {
        self.coeff
    }

    /// Changes the KL coefficient (e.g. from an adaptive KL controller).
    pub fn set_coeff(&mut self, coeff: f64) {
        self.coeff = coeff;
    }

    /// The estimator written at the KL key and used in the reward.
    pub fn estimator(&self) -> KlEstimator {
        self.estimator
    }

    /// The reference log-probs key (next tensordict first).
    pub fn ref_log_probs_key(&self) -> &NestedKey {
        &self.ref_log_probs_key
    }

    /// Also writes k3 (`exp(ref − lp) − 1 − (ref − lp)`, masked) at `key` of the next
    /// tensordict, for logging (default: not written).
    pub fn with_k3_key(mut self, key: impl Into<NestedKey>) -> Self {
        self.k3_key = Some(key.into());
        self
    }

    fn compute(&self, td: &TensorDict, mut next: TensorDict) -> Result<TensorDict> {
        let op = "KLComputation::step";
        let (gk, rk) = (&self.gen_log_probs_key, &self.ref_log_probs_key);
        let lp = lookup(
            op,
            gk,
            "the generating log-probs",
            (td, "root"),
            (&next, "next"),
        )?;
        let rf = lookup(
            op,
            rk,
            "the reference log-probs",
            (&next, "next"),
            (td, "root"),
        )?;
        require_float(op, gk, lp, "log-probs")?;
        require_float(op, rk, rf, "log-probs")?;
        if lp.kind() != rf.kind() {
            return Err(Error::DtypeMismatch {
                op,
                key: format!("{rk} (must have the dtype of {gk})"),
                expected: lp.kind(),
                actual: rf.kind(),
            });
        }
        same_shape(op, gk, lp, rk, rf)?;
        let mask = if self.assistant_only {
            let m = td.get_or_err(&self.assistant_mask_key)?;
            same_shape(op, gk, lp, &self.assistant_mask_key, m)?;
            Some(m.f_ne(0)?)
        } else {
            None
        };
        let masked = |x: Tensor| -> Result<Tensor> {
            match &mask {
                Some(m) => Ok(x.f_where_self(m, &x.f_zeros_like()?)?),
                None => Ok(x),
            }
        };
        let kl = masked(self.estimator.estimate(lp, rf)?)?;
        let k3 = match &self.k3_key {
            Some(_) => Some(masked(KlEstimator::K3.estimate(lp, rf)?)?),
            None => None,
        };
        if self.add_to_reward {
            let reward = next.get_or_err(&self.reward_key)?;
            let mut want = kl.size();
            want.push(1);
            if reward.size() != want {
                return Err(Error::ShapeMismatch {
                    op,
                    key: format!(
                        "{} (the reward: one more dim than {} {:?}, the KL of {gk} and {rk})",
                        self.reward_key,
                        self.kl_key,
                        kl.size()
                    ),
                    expected: want,
                    actual: reward.size(),
                });
            }
            require_float(op, &self.reward_key, reward, "rewards")?;
            let new = reward.f_sub(&kl.f_unsqueeze(-1)?.f_mul_scalar(self.coeff)?)?;
            next.set(&self.reward_key, new)?;
        }
        next.set(&self.kl_key, kl)?;
        if let (Some(key), Some(k3)) = (&self.k3_key, k3) {
            next.set(key, k3)?;
        }
        Ok(next)
    }
}

setters!(KLComputation {
    /// The generating log-probs (root tensordict first; default `("log_probs", "full")`).
    with_gen_log_probs_key(key: impl Into<NestedKey>) => gen_log_probs_key = key.into();
    /// The reference log-probs (next tensordict first; default `("ref_log_probs", "full")`).
    with_ref_log_probs_key(key: impl Into<NestedKey>) => ref_log_probs_key = key.into();
    /// The response-token mask in the root tensordict (default
    /// `("masks", "all_assistant_mask")`).
    with_assistant_mask_key(key: impl Into<NestedKey>) => assistant_mask_key = key.into();
    /// Zero the KL outside the response tokens (default `true`; `false` keeps every position,
    /// for log-probs already masked).
    with_assistant_only(assistant_only: bool);
    /// The KL key written in the next tensordict (default `"kl_penalty"`).
    with_kl_key(key: impl Into<NestedKey>) => kl_key = key.into();
    /// The reward in the next tensordict (default `"reward"`).
    with_reward_key(key: impl Into<NestedKey>) => reward_key = key.into();
    /// Subtract `coeff · kl` from the reward (default `true`).
    with_add_to_reward(add_to_reward: bool);
    /// The KL coefficient (default 1; trlX's `init_kl_coef`, TRL's `kl_coef`).
    with_coeff(coeff: f64);
    /// What goes at the KL key and into the reward (default [`KlEstimator::K1`]; TRL's
    /// `kl_estimator`).
    with_estimator(estimator: KlEstimator);
});

impl Transform for KLComputation {
    fn name(&self) -> String {
        format!(
            "KLComputation({}, coeff={}, add_to_reward={})",
            self.estimator.name(),
            self.coeff,
            self.add_to_reward
        )
    }

    fn new_output_keys(&self) -> Vec<NestedKey> {
        let mut keys = vec![self.kl_key.clone()];
        keys.extend(self.k3_key.clone());
        keys
    }

    fn transform_output_spec(&self, mut specs: EnvSpecs) -> Result<EnvSpecs> {
        let kl = kl_penalty_spec(&specs)?;
        if let Some(k) = &self.k3_key {
            specs.observation.set(k, kl.clone())?;
        }
        specs.observation.set(&self.kl_key, kl)?;
        if self.add_to_reward {
            let reward = llm_reward_spec(&specs, specs.reward.get(&self.reward_key))?;
            specs.reward.set(&self.reward_key, reward)?;
        }
        Ok(specs)
    }

    fn step(&mut self, td: &TensorDict, next: TensorDict) -> Result<TensorDict> {
        self.compute(td, next)
    }

    fn forward(&mut self, td: TensorDict) -> Result<TensorDict> {
        forward_via_step("KLComputation::forward", td, |root, next| {
            self.compute(root, next)
        })
    }
}

// ------------------------------------------------------------------ RetrieveKL

/// TorchRL's `RetrieveKL`: [`RetrieveLogProb`] of the reference model, then
/// [`KLComputation`] against the generating log-probs the policy wrote with its action
/// (TorchRL's `gen_model="from_collector"` path: the rollout already holds them, so the
/// generating model is not run again).
///
/// ```
/// use std::sync::{Arc, Mutex};
/// use tch::{nn::VarStore, Device, Kind, Tensor};
/// use torchrl::envs::llm::RetrieveKL;
/// use torchrl::envs::transforms::Transform;
/// use torchrl::modules::llm::{CausalLmWithHydraValueHead, Gpt2Config, HydraReference, ScoreTokens};
/// use torchrl::TensorDict;
/// # fn main() -> torchrl::Result<()> {
/// let vs = VarStore::new(Device::Cpu);
/// let cfg = Gpt2Config::new(20).with_n_layer(2).with_n_embd(8).with_n_head(2).with_n_positions(8);
/// let hydra = Arc::new(Mutex::new(CausalLmWithHydraValueHead::new(&vs.root(), &cfg, 1)?));
/// let ids = Tensor::from_slice(&[1i64, 2, 3, 4]).view([1, 4]);
/// let mask = Tensor::ones([1, 4], (Kind::Int64, Device::Cpu));
/// let mut td = TensorDict::new([1])?;
/// td.set(("log_probs", "full"), hydra.token_log_probs(&ids, &mask)?)?;
/// td.set(("tokens", "full"), ids)?;
/// td.set(("masks", "all_attention_mask"), mask)?;
/// td.set(("masks", "all_assistant_mask"), Tensor::from_slice(&[0i64, 0, 1, 1]).view([1, 4]))?;
/// let mut next = TensorDict::new([1])?;
/// next.set("reward", Tensor::from_slice(&[0.0f32, 0.0, 0.0, 1.0]).view([1, 4, 1]))?;
/// let mut t = RetrieveKL::new(HydraReference::new(Arc::clone(&hydra))).with_coeff(0.1);
/// let next = t.step(&td, next)?;
/// // at construction the reference is the policy: KL 0, the reward is the score
/// assert_eq!(next.get_or_err("kl_penalty")?.abs().sum(Kind::Double).double_value(&[]), 0.0);
/// assert_eq!(next.get_or_err("reward")?.double_value(&[0, 3, 0]), 1.0);
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct RetrieveKL {
    retrieve: RetrieveLogProb,
    kl: KLComputation,
}

impl RetrieveKL {
    /// Runs `ref_model` and computes k1 with `coeff = 1` (see [`RetrieveLogProb::new`]).
    pub fn new(ref_model: impl ScoreTokens + Send + 'static) -> Self {
        RetrieveKL {
            retrieve: RetrieveLogProb::new(ref_model),
            kl: KLComputation::new(),
        }
    }

    /// Reads the reference log-probs a hydra policy computed (see
    /// [`RetrieveLogProb::precomputed`]).
    pub fn precomputed() -> Self {
        RetrieveKL {
            retrieve: RetrieveLogProb::precomputed(),
            kl: KLComputation::new(),
        }
    }

    /// From its two parts; errors when the KL does not read the key the retrieval writes.
    pub fn from_parts(retrieve: RetrieveLogProb, kl: KLComputation) -> Result<Self> {
        if retrieve.out_key() != kl.ref_log_probs_key() {
            return Err(Error::config(
                "RetrieveKL::from_parts",
                "ref_log_probs_key",
                format!("the key RetrieveLogProb writes, {}", retrieve.out_key()),
                kl.ref_log_probs_key(),
            ));
        }
        Ok(RetrieveKL { retrieve, kl })
    }

    /// Sets the KL coefficient.
    pub fn with_coeff(mut self, coeff: f64) -> Self {
        self.kl.coeff = coeff;
        self
    }

    /// Whether the KL term goes into the reward (default `true`).
    pub fn with_add_to_reward(mut self, add: bool) -> Self {
        self.kl.add_to_reward = add;
        self
    }

    /// Masks both log-probs to the response tokens (default `true`).
    pub fn with_assistant_only(mut self, assistant_only: bool) -> Self {
        self.kl.assistant_only = assistant_only;
        self.retrieve.assistant_only = assistant_only;
        self
    }

    /// The estimator (default k1).
    pub fn with_estimator(mut self, estimator: KlEstimator) -> Self {
        self.kl.estimator = estimator;
        self
    }

    /// The retrieval part.
    pub fn retrieve(&self) -> &RetrieveLogProb {
        &self.retrieve
    }

    /// The KL part.
    pub fn kl(&self) -> &KLComputation {
        &self.kl
    }

    /// The KL part, mutably (e.g. [`KLComputation::set_coeff`]).
    pub fn kl_mut(&mut self) -> &mut KLComputation {
        &mut self.kl
    }
}

impl Transform for RetrieveKL {
    fn name(&self) -> String {
        format!("RetrieveKL({}, {})", self.retrieve.name(), self.kl.name())
    }

    fn new_output_keys(&self) -> Vec<NestedKey> {
        let mut keys = self.retrieve.new_output_keys();
        keys.extend(self.kl.new_output_keys());
        keys
    }

    fn transform_output_spec(&self, specs: EnvSpecs) -> Result<EnvSpecs> {
        self.kl
            .transform_output_spec(self.retrieve.transform_output_spec(specs)?)
    }

    fn step(&mut self, td: &TensorDict, next: TensorDict) -> Result<TensorDict> {
        let next = self.retrieve.step(td, next)?;
        self.kl.step(td, next)
    }

    fn forward(&mut self, td: TensorDict) -> Result<TensorDict> {
        forward_via_step("RetrieveKL::forward", td, |root, next| {
            let next = self.retrieve.step(root, next)?;
            self.kl.step(root, next)
        })
    }
}

// ------------------------------------------------------------------ KLRewardTransform

/// TorchRL's `torchrl.envs.llm.KLRewardTransform(ref_model, coef)` (legacy upstream, which
/// recommends `RetrieveKL`): the reward minus `coef` times the per-token k1 to a frozen
/// reference model, with `kl_penalty` and `ref_log_probs.full` written too. Built from an
/// existing reference (a [`ScoreTokens`]: a `Gpt2Model`, an `Arc<Mutex<_>>` of one, a
/// [`HydraReference`](crate::modules::llm::HydraReference)); no parameters are copied.
///
/// Unlike TorchRL's, which writes `[B, T, 1]` KL and reference log-probs under
/// `"ref_log_probs"`, this writes [`RetrieveKL`]'s layout (`[B, T]` at `"kl_penalty"` and
/// `("ref_log_probs", "full")`) so downstream code reads one layout.
///
/// ```
/// use tch::{nn::VarStore, Device, Kind, Tensor};
/// use torchrl::envs::llm::KLRewardTransform;
/// use torchrl::envs::transforms::Transform;
/// use torchrl::modules::llm::{Gpt2Config, Gpt2Model, ScoreTokens};
/// use torchrl::TensorDict;
/// # fn main() -> torchrl::Result<()> {
/// let cfg = Gpt2Config::new(20).with_n_layer(1).with_n_embd(8).with_n_head(2).with_n_positions(8);
/// let (vs_pi, vs_ref) = (VarStore::new(Device::Cpu), VarStore::new(Device::Cpu));
/// let (policy, reference) = (Gpt2Model::new(&vs_pi.root(), &cfg)?, Gpt2Model::new(&vs_ref.root(), &cfg)?);
/// let ids = Tensor::from_slice(&[1i64, 2, 3]).view([1, 3]);
/// let mask = Tensor::ones([1, 3], (Kind::Int64, Device::Cpu));
/// let (lp, rf) = (policy.token_log_probs(&ids, &mask)?, reference.token_log_probs(&ids, &mask)?);
/// let mut td = TensorDict::new([1])?;
/// td.set(("log_probs", "full"), lp.shallow_clone())?;
/// td.set(("tokens", "full"), ids)?;
/// td.set(("masks", "all_attention_mask"), mask)?;
/// let mut next = TensorDict::new([1])?;
/// next.set("reward", Tensor::zeros([1, 3, 1], (Kind::Float, Device::Cpu)))?;
/// let mut t = KLRewardTransform::new(reference, 0.5).with_assistant_only(false);
/// let next = t.step(&td, next)?;
/// let want = (rf - lp) * 0.5; // reward − 0.5·(lp − ref)
/// let got = next.get_or_err("reward")?.squeeze_dim(-1);
/// assert!((got - want).abs().max().double_value(&[]) < 1e-6);
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct KLRewardTransform {
    inner: RetrieveKL,
}

impl KLRewardTransform {
    /// `reward −= coef · (lp − ref)` on the response tokens, `ref` from `ref_model`.
    pub fn new(ref_model: impl ScoreTokens + Send + 'static, coef: f64) -> Self {
        KLRewardTransform {
            inner: RetrieveKL::new(ref_model).with_coeff(coef),
        }
    }

    /// Masks to the response tokens (default `true`, TorchRL's `assistant_only`).
    pub fn with_assistant_only(mut self, assistant_only: bool) -> Self {
        self.inner = self.inner.with_assistant_only(assistant_only);
        self
    }

    /// Whether the KL term goes into the reward (default `true`).
    pub fn with_add_to_reward(mut self, add: bool) -> Self {
        self.inner = self.inner.with_add_to_reward(add);
        self
    }

    /// The coefficient.
    pub fn coef(&self) -> f64 {
        self.inner.kl.coeff
    }

    /// Changes the coefficient.
    pub fn set_coef(&mut self, coef: f64) {
        self.inner.kl.coeff = coef;
    }
}

impl Transform for KLRewardTransform {
    fn name(&self) -> String {
        format!("llm::KLRewardTransform(coef={})", self.inner.kl.coeff)
    }

    fn new_output_keys(&self) -> Vec<NestedKey> {
        self.inner.new_output_keys()
    }

    fn transform_output_spec(&self, specs: EnvSpecs) -> Result<EnvSpecs> {
        self.inner.transform_output_spec(specs)
    }

    fn step(&mut self, td: &TensorDict, next: TensorDict) -> Result<TensorDict> {
        self.inner.step(td, next)
    }

    fn forward(&mut self, td: TensorDict) -> Result<TensorDict> {
        self.inner.forward(td)
    }
}
