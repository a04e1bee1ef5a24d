//! The Bradley-Terry reward-model loss for RLHF: [`reward_model_loss`] (the function) and
//! [`RewardModelLoss`] (the loss module), ported from TorchRL's `torchrl.objectives.llm.reward`
//! (pytorch/rl PR #3923).
//!
//! A reward model scores a (prompt, response) pair with one scalar. Trained on pairs in which
//! an annotator preferred the `chosen` response to the `rejected` one, it minimises
//! `-log σ(r_chosen - r_rejected)`: small when the chosen response scores higher.
//!
//! Besides TorchRL's behaviour, TRL's `RewardTrainer` options are available under names of
//! their own: the `(c + r)²` centring ([`RewardModelLoss::with_center_rewards_coefficient`],
//! see [`Centering`]), a per-pair margin ([`RewardModelLoss::with_margin_key`]), and the
//! logged `margin = mean(c − r)` ([`RewardModelLossOutput::margin`]).
//!
//! ```
//! use tch::{Kind, Tensor};
//! use torchrl::objectives::{LossModule, LossOutput, RewardModelLoss};
//! use torchrl::TensorDict;
//! # fn main() -> torchrl::Result<()> {
//! // Precomputed scores under "score" in each sub-tensordict (no score network).
//! let chosen = Tensor::from_slice(&[1.0f32, 0.5, -0.3]).set_requires_grad(true);
//! let rejected = Tensor::from_slice(&[0.0f32, 1.0, -0.3]).set_requires_grad(true);
//! let td = TensorDict::new([3])?
//!     .with(("chosen", "score"), chosen.shallow_clone())?
//!     .with(("rejected", "score"), rejected.shallow_clone())?;
//!
//! let loss_fn = RewardModelLoss::new().with_center_coeff(0.01)?;
//! let out = loss_fn.forward(&td)?;
//! // mean of -logsigmoid([1, -0.5, 0]) and 0.01 * mean(c² + r²)
//! assert!((out.loss_reward_model.double_value(&[]) - 0.6601619508).abs() < 1e-6);
//! assert!((out.loss_center.as_ref().map_or(0.0, |t| t.double_value(&[])) - 0.0081).abs() < 1e-7);
//! assert!((out.accuracy.double_value(&[]) - 1.0 / 3.0).abs() < 1e-7); // the tie counts as wrong
//! out.total_loss()?.backward();
//! assert_eq!(chosen.grad().size(), vec![3]);
//! # Ok(()) }
//! ```

use std::fmt;

use tch::{Kind, Tensor};

use crate::error::{Error, Result, ShapeFmt};
use crate::modules::module::pick_out_key;
use crate::modules::TensorDictModule;
use crate::tensordict::{fmt_key_list, AsKey, Entry, NestedKey, TensorDict};

const OP: &str = "RewardModelLoss";

use super::common::{LossModule, LossOutput, Reduction};

/// The Bradley-Terry pairwise reward-model loss, `-log σ(chosen_scores - rejected_scores)`.
///
/// Small when the reward model scores the chosen response above the rejected one, large
/// otherwise. Differentiable in both score tensors.
///
/// # Shapes
/// - `chosen_scores`, `rejected_scores`: `[B]` (any shape, as long as both are the same).
/// - output: `[]` for [`Reduction::Mean`] and [`Reduction::Sum`], the inputs' shape for
///   [`Reduction::None`].
///
/// # Errors
/// When the shapes differ. TorchRL refuses them rather than broadcast: `[B]` against `[B, 1]`
/// would silently become a `[B, B]` all-pairs loss. (An invalid reduction name is refused when
/// parsing a [`Reduction`].)
///
/// ```
/// use tch::Tensor;
/// use torchrl::objectives::{reward_model_loss, Reduction};
/// let c = Tensor::from_slice(&[2.0f64, 0.0]);
/// let r = Tensor::from_slice(&[1.0f64, 0.0]);
/// let per_pair = reward_model_loss(&c, &r, Reduction::None)?;
/// assert!((per_pair.double_value(&[0]) - 0.31326168751822286).abs() < 1e-12); // -ln σ(1)
/// assert!((per_pair.double_value(&[1]) - std::f64::consts::LN_2).abs() < 1e-12);
/// assert!(reward_model_loss(&c, &r.unsqueeze(-1), Reduction::Mean).is_err());
/// # Ok::<(), torchrl::Error>(())
/// ```
pub fn reward_model_loss(
    chosen_scores: &Tensor,
    rejected_scores: &Tensor,
    reduction: Reduction,
) -> Result<Tensor> {
    let margin = rejected_margin(chosen_scores, rejected_scores)?;
    bradley_terry(&margin, reduction)
}

/// [`reward_model_loss`] and the pairwise accuracy `mean(chosen > rejected)` (`float32`, a tie
/// counts as wrong; no gradient), from one shared difference: what a training step computes,
/// with the fewest libtorch calls (for batch-256 scores, libtorch's per-call overhead is most
/// of the cost).
///
/// Both come from `m = rejected - chosen`: the loss is `softplus(m)` (`= -log σ(chosen -
/// rejected)`) reduced, the accuracy `mean(m < 0)`.
///
/// # Shapes
/// As [`reward_model_loss`]; the accuracy is `[]`.
///
/// # Errors
/// When the shapes differ.
///
/// ```
/// use tch::Tensor;
/// use torchrl::objectives::{reward_model_loss_with_accuracy, Reduction};
/// let c = Tensor::from_slice(&[2.0f32, 0.0, -1.0]).set_requires_grad(true);
/// let r = Tensor::from_slice(&[1.0f32, 0.0, 1.0]);
/// let (loss, acc) = reward_model_loss_with_accuracy(&c, &r, Reduction::Mean)?;
/// // mean(-ln σ([1, 0, -2]))
/// let expected = (0.31326168751822286 + std::f64::consts::LN_2 + 2.1269280110429727) / 3.0;
/// assert!((loss.double_value(&[]) - expected).abs() < 1e-6);
/// assert!((acc.double_value(&[]) - 1.0 / 3.0).abs() < 1e-7); // the tie counts as wrong
/// assert!(!acc.requires_grad());
/// loss.backward();
/// assert_eq!(c.grad().size(), vec![3]);
/// # Ok::<(), torchrl::Error>(())
/// ```
pub fn reward_model_loss_with_accuracy(
    chosen_scores: &Tensor,
    rejected_scores: &Tensor,
    reduction: Reduction,
) -> Result<(Tensor, Tensor)> {
    let margin = rejected_margin(chosen_scores, rejected_scores)?;
    let loss = bradley_terry(&margin, reduction)?;
    // a comparison has no gradient, so neither does the accuracy: no no-grad guard needed
    let accuracy = margin.f_lt(0.0)?.f_mean(Kind::Float)?;
    Ok((loss, accuracy))
}

/// `rejected - chosen`, after checking the shapes match.
fn rejected_margin(chosen_scores: &Tensor, rejected_scores: &Tensor) -> Result<Tensor> {
    let (cs, rs) = (chosen_scores.size(), rejected_scores.size());
    if cs != rs {
        return Err(Error::InvalidValue {
            op: "reward_model_loss",
            what: "arguments",
            key: "chosen_scores, rejected_scores".to_string(),
            expected:
                "the same shape (chosen_scores and rejected_scores must have the same shape: \
                       mismatched shapes, e.g. [B] vs [B, 1], would broadcast to an all-pairs loss)"
                    .to_string(),
            got: format!("{} vs {}", ShapeFmt(&cs), ShapeFmt(&rs)),
        });
    }
    Ok(rejected_scores.f_sub(chosen_scores)?)
}

/// `reduce(softplus(margin))`: `-log σ(-margin)` in one libtorch call (and one autograd node)
/// instead of `log_sigmoid` then `neg`.
fn bradley_terry(margin: &Tensor, reduction: Reduction) -> Result<Tensor> {
    reduction.apply(&margin.f_softplus()?)
}

/// The output of [`RewardModelLoss`]: TorchRL's `RewardModelLossOutput`.
///
/// The differentiable total is the sum of the `loss_*` fields
/// ([`LossOutput::total_loss`]); `accuracy` is a detached diagnostic.
///
/// # Shapes
/// Every field is `[]` under [`Reduction::Mean`] / [`Reduction::Sum`]; under
/// [`Reduction::None`] the `loss_*` fields are `[B]` (the squeezed score shape) and `accuracy`
/// and `margin` stay `[]`.
#[derive(Debug)]
pub struct RewardModelLossOutput {
    /// The Bradley-Terry pairwise loss.
    pub loss_reward_model: Tensor,
    /// `center_coeff * reduce(chosen² + rejected²)`; `None` unless a centring coefficient is
    /// set on the loss (a coefficient of `0.0` gives a zero term, not `None`).
    pub loss_center: Option<Tensor>,
    /// The fraction of pairs whose chosen score is strictly above the rejected one (a tie
    /// counts as wrong); `float32`, detached. (TorchRL's field is optional, but its `forward`
    /// always sets it, so here it is always present.)
    pub accuracy: Tensor,
    /// `mean(chosen − rejected)`, detached, in the scores' dtype: TRL's logged `margin` metric
    /// (the per-pair margin input, when set, does not enter it).
    pub margin: Tensor,
}

impl LossOutput for RewardModelLossOutput {
    fn loss_terms(&self) -> Vec<(&'static str, &Tensor)> {
        let mut terms = vec![("loss_reward_model", &self.loss_reward_model)];
        if let Some(c) = &self.loss_center {
            terms.push(("loss_center", c));
        }
        terms
    }

    fn metrics(&self) -> Vec<(&'static str, &Tensor)> {
        vec![("accuracy", &self.accuracy), ("margin", &self.margin)]
    }
}

crate::accepted_keys! {
    /// The keys of [`RewardModelLoss`] (TorchRL's `RewardModelLoss._AcceptedKeys`).
    pub struct RewardModelKeys {
        /// The input key of the chosen response's sub-tensordict. Defaults to `"chosen"`.
        chosen: "chosen",
        /// The input key of the rejected response's sub-tensordict. Defaults to `"rejected"`.
        rejected: "rejected",
        /// The key, inside each sub-tensordict, of the per-sequence scalar score: read directly
        /// when there is no score network; with a score network, the network's output key is
        /// chosen by the rule in [`RewardModelLoss`]. Defaults to `"score"`.
        score: "score",
    }
}

/// A closure as a score [`TensorDictModule`]: it reads what it needs from a (chosen or
/// rejected) sub-tensordict and writes its declared `out_keys` into it. The closure → module
/// bridge for [`RewardModelLoss::with_score_network`], which takes any [`TensorDictModule`]
/// (a [`TdModule`](crate::modules::TdModule) around an [`MLP`](crate::modules::MLP), say).
///
/// It declares no in keys (the closure reads whatever it reads).
///
/// ```
/// use torchrl::modules::TensorDictModule;
/// use torchrl::objectives::ScoreFn;
/// use torchrl::TensorDict;
/// use tch::{Kind, Tensor};
/// // score = the mean of the features
/// let net = ScoreFn::new(["score"], |td: &mut TensorDict| {
///     let s = td.get_or_err("features")?.f_mean_dim(-1, false, None::<Kind>)?;
///     td.set("score", s)
/// });
/// let td = TensorDict::new([2])?.with("features", Tensor::ones([2, 4], (Kind::Float, tch::Device::Cpu)))?;
/// let td = net.forward(td)?;
/// assert_eq!(td.get_or_err("score")?.size(), vec![2]);
/// assert_eq!(net.out_keys(), ["score"]);
/// # Ok::<(), torchrl::Error>(())
/// ```
pub struct ScoreFn<F> {
    out_keys: Vec<NestedKey>,
    f: F,
}

impl<F> ScoreFn<F>
where
    F: Fn(&mut TensorDict) -> Result<()> + Send,
{
    /// A score network that runs `f` and declares `out_keys` as what it writes.
    pub fn new<K: Into<NestedKey>>(out_keys: impl IntoIterator<Item = K>, f: F) -> Self {
        ScoreFn {
            out_keys: out_keys.into_iter().map(Into::into).collect(),
            f,
        }
    }
}

impl<F> TensorDictModule for ScoreFn<F>
where
    F: Fn(&mut TensorDict) -> Result<()> + Send,
{
    fn in_keys(&self) -> Vec<NestedKey> {
        Vec::new()
    }

    fn out_keys(&self) -> Vec<NestedKey> {
        self.out_keys.clone()
    }

    fn forward(&self, mut td: TensorDict) -> Result<TensorDict> {
        (self.f)(&mut td)?;
        Ok(td)
    }
}

impl<F> fmt::Debug for ScoreFn<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScoreFn")
            .field("out_keys", &self.out_keys)
            .finish_non_exhaustive()
    }
}

/// What the centring term of [`RewardModelLoss`] penalises.
///
/// ```
/// use tch::Tensor;
/// use torchrl::objectives::{Centering, LossModule, RewardModelLoss};
/// use torchrl::TensorDict;
/// # fn main() -> torchrl::Result<()> {
/// let td = TensorDict::new([3])?
///     .with(("chosen", "score"), Tensor::from_slice(&[1.0f64, 0.5, -0.3]))?
///     .with(("rejected", "score"), Tensor::from_slice(&[0.0f64, 1.0, -0.3]))?;
/// // rlhf.md §5.6: TorchRL 0.01·mean(c² + r²) = 0.0081, TRL 0.01·mean((c + r)²) = 0.0120333…
/// let torchrl = RewardModelLoss::new().with_center_coeff(0.01)?.forward(&td)?;
/// let trl = RewardModelLoss::new().with_center_rewards_coefficient(0.01)?.forward(&td)?;
/// let get = |t: &Option<Tensor>| t.as_ref().map_or(f64::NAN, |t| t.double_value(&[]));
/// assert!((get(&torchrl.loss_center) - 0.0081).abs() < 1e-12);
/// assert!((get(&trl.loss_center) - 0.0120333333333).abs() < 1e-12);
/// assert_eq!(RewardModelLoss::new().with_center_rewards_coefficient(0.01)?.centering(), Centering::SquaredSum);
/// # Ok(()) }
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Centering {
    /// `chosen² + rejected²`: TorchRL PR #3923's `center_coeff` (the default).
    #[default]
    SumOfSquares,
    /// `(chosen + rejected)²`: TRL's `RewardConfig.center_rewards_coefficient` (Eisenstein et
    /// al. 2023, Eq. 2), which only pins the pair's mean to 0.
    SquaredSum,
}

/// The score network of a [`RewardModelLoss`], with its out keys read once.
struct ScoreNet {
    module: Box<dyn TensorDictModule>,
    out_keys: Vec<NestedKey>,
}

/// Bradley-Terry reward-model training loss for RLHF (TorchRL's `RewardModelLoss`).
///
/// Trains a scalar reward model from pairwise preferences: for each prompt, a `chosen`
/// response (preferred by an annotator) and a `rejected` one; the model is pushed to score the
/// chosen one higher. The loss is model-agnostic: the optional score network (any
/// [`TensorDictModule`]; [`ScoreFn`] for a closure) maps a
/// sub-tensordict (e.g. `input_ids` / `attention_mask`) to one score per sequence, and the same
/// network (shared weights) scores both sides.
///
/// What [`forward`](LossModule::forward) does, step by step:
/// 1. For each side (`chosen`, then `rejected`, keys from [`RewardModelKeys`]): take the
///    sub-tensordict (an error names the missing key and the available ones). With a score
///    network, run it on a shallow copy (the input is not modified) and read the score under
///    - the configured `score` key if the network declares it among its `out_keys`, otherwise
///    - the default `"score"` if declared, otherwise
///    - the network's only output key if it has exactly one, otherwise an error.
///
///    Without a network, read the precomputed score under the `score` key. A trailing
///    singleton dim is squeezed (`[B, 1]` → `[B]`).
/// 2. `loss_reward_model = reward_model_loss(chosen, rejected, reduction)` (shapes must match).
///    With a margin key ([`with_margin_key`](Self::with_margin_key), TRL's `margin` column):
///    `reduce(-log σ(chosen − rejected − margin))`, the per-pair margin read from the
///    top-level tensordict.
/// 3. With a centring coefficient `c`: `loss_center = c * reduce(chosen² + rejected²)`
///    ([`with_center_coeff`](Self::with_center_coeff), TorchRL), or `c * reduce((chosen +
///    rejected)²)` ([`with_center_rewards_coefficient`](Self::with_center_rewards_coefficient),
///    TRL), which keeps the scores from drifting to large magnitudes.
/// 4. `accuracy = mean(chosen > rejected)`, detached, `float32`; `margin = mean(chosen −
///    rejected)`, detached (TRL's logged metric).
///
/// # Shapes
/// - input: a tensordict of batch size `[B]` with `chosen` and `rejected` sub-tensordicts
///   (batch size `[B]`), holding `score` (`[B]` or `[B, 1]`) or the network's inputs.
/// - output: see [`RewardModelLossOutput`].
///
/// # Keys
/// `chosen`, `rejected`, `score`, settable with [`LossModule::set_keys`] (nested keys
/// allowed); `in_keys()` is `[chosen, rejected]`, plus the margin key when one is set.
pub struct RewardModelLoss {
    score_network: Option<ScoreNet>,
    reduction: Reduction,
    center_coeff: Option<f64>,
    centering: Centering,
    margin_key: Option<NestedKey>,
    keys: RewardModelKeys,
    in_keys: Vec<NestedKey>,
}

impl Default for RewardModelLoss {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for RewardModelLoss {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RewardModelLoss")
            .field(
                "score_network",
                &self
                    .score_network
                    .as_ref()
                    .map(|n| fmt_key_list(&n.out_keys)),
            )
            .field("reduction", &self.reduction)
            .field("center_coeff", &self.center_coeff)
            .field("centering", &self.centering)
            .field("margin_key", &self.margin_key)
            .field("keys", &self.keys)
            .finish()
    }
}

impl RewardModelLoss {
    /// A loss with no score network (scores are read precomputed), [`Reduction::Mean`] and no
    /// centring term: TorchRL's `RewardModelLoss()` defaults.
    pub fn new() -> Self {
        let keys = RewardModelKeys::default();
        let in_keys = Self::compute_in_keys(&keys, None);
        RewardModelLoss {
            score_network: None,
            reduction: Reduction::Mean,
            center_coeff: None,
            centering: Centering::SumOfSquares,
            margin_key: None,
            keys,
            in_keys,
        }
    }

    /// Sets the score network applied to both sub-tensordicts: any [`TensorDictModule`] (its
    /// `out_keys()` are read once, here); [`ScoreFn`] wraps a closure.
    pub fn with_score_network(mut self, network: impl TensorDictModule + 'static) -> Self {
        let out_keys = network.out_keys();
        self.score_network = Some(ScoreNet {
            module: Box::new(network),
            out_keys,
        });
        self
    }

    /// Sets the reduction (default [`Reduction::Mean`]); parse a name with
    /// `"sum".parse::<Reduction>()`.
    pub fn with_reduction(mut self, reduction: Reduction) -> Self {
        self.reduction = reduction;
        self
    }

    /// Enables the centring term `center_coeff * reduce(chosen² + rejected²)`
    /// ([`Centering::SumOfSquares`], TorchRL). Replaces any centring set before.
    ///
    /// Errors when `center_coeff` is negative (or NaN): TorchRL's
    /// `ValueError("center_coeff must be non-negative.")`.
    pub fn with_center_coeff(mut self, center_coeff: f64) -> Result<Self> {
        if center_coeff.is_nan() || center_coeff < 0.0 {
            return Err(Error::config(
                OP,
                "center_coeff",
                "non-negative (center_coeff must be non-negative)",
                center_coeff,
            ));
        }
        self.center_coeff = Some(center_coeff);
        self.centering = Centering::SumOfSquares;
        Ok(self)
    }

    /// Enables TRL's centring term `coefficient * reduce((chosen + rejected)²)`
    /// ([`Centering::SquaredSum`], TRL's `center_rewards_coefficient`; 0.01 is the value TRL
    /// recommends). Replaces any centring set before. Under [`Reduction::Mean`] this is TRL's
    /// `coefficient * mean((c + r)²)`.
    ///
    /// # Errors
    /// When `coefficient` is negative, NaN or infinite.
    pub fn with_center_rewards_coefficient(mut self, coefficient: f64) -> Result<Self> {
        if !(coefficient.is_finite() && coefficient >= 0.0) {
            return Err(Error::config(
                OP,
                "center_rewards_coefficient",
                "finite and non-negative",
                coefficient,
            ));
        }
        self.center_coeff = Some(coefficient);
        self.centering = Centering::SquaredSum;
        Ok(self)
    }

    /// Reads a per-pair margin `[B]` (or `[B, 1]`) under `key` of the top-level tensordict and
    /// trains on `-log σ(chosen − rejected − margin)` (TRL's `margin` column: a pair rated
    /// "much better" must win by more). The accuracy and the logged `margin` metric ignore it.
    pub fn with_margin_key(mut self, key: impl Into<NestedKey>) -> Self {
        self.margin_key = Some(key.into());
        self.in_keys = Self::compute_in_keys(&self.keys, self.margin_key.as_ref());
        self
    }

    /// Builder form of [`LossModule::set_tensor_keys`].
    pub fn with_keys(mut self, keys: RewardModelKeys) -> Self {
        self.in_keys = Self::compute_in_keys(&keys, self.margin_key.as_ref());
        self.keys = keys;
        self
    }

    /// The reduction.
    pub fn reduction(&self) -> Reduction {
        self.reduction
    }

    /// The centring coefficient, `None` when the centring term is disabled.
    pub fn center_coeff(&self) -> Option<f64> {
        self.center_coeff
    }

    /// What the centring term penalises (meaningful when [`center_coeff`](Self::center_coeff)
    /// is set).
    pub fn centering(&self) -> Centering {
        self.centering
    }

    /// The per-pair margin key, if any.
    pub fn margin_key(&self) -> Option<&NestedKey> {
        self.margin_key.as_ref()
    }

    /// The score network, if any.
    pub fn score_network(&self) -> Option<&dyn TensorDictModule> {
        self.score_network.as_ref().map(|n| n.module.as_ref())
    }

    fn compute_in_keys(keys: &RewardModelKeys, margin: Option<&NestedKey>) -> Vec<NestedKey> {
        let mut k = vec![keys.chosen.clone(), keys.rejected.clone()];
        k.extend(margin.cloned());
        k
    }

    /// The per-pair margin under the margin key, shaped as the scores.
    fn margin(&self, td: &TensorDict, shape: &[i64]) -> Result<Option<Tensor>> {
        let Some(key) = &self.margin_key else {
            return Ok(None);
        };
        let m = td.get_or_err(key)?;
        let m = if m.dim() > 1 && m.size().last() == Some(&1) {
            m.f_squeeze_dim(-1)?
        } else {
            m.shallow_clone()
        };
        if m.size() != shape || !m.is_floating_point() {
            return Err(Error::value(
                OP,
                key,
                format!(
                    "a floating-point margin of the scores' shape {}",
                    ShapeFmt(shape)
                ),
                format!("{:?} of shape {}", m.kind(), ShapeFmt(&m.size())),
            ));
        }
        Ok(Some(m.f_detach()?))
    }

    /// The key under which the score network's score is read (the seed's `_score` rule).
    fn network_score_key(&self, out_keys: &[NestedKey]) -> Result<NestedKey> {
        let default = RewardModelKeys::default().score;
        pick_out_key(out_keys, &[&self.keys.score, &default]).ok_or_else(|| {
            Error::config(
                OP,
                "score",
                format!(
                    "{} among the score_network's out keys (Could not identify the score_network \
                     output key)",
                    self.keys.score
                ),
                fmt_key_list(out_keys),
            )
        })
    }

    /// Runs the score network (if any) on the sub-tensordict at `key` and returns its
    /// per-sequence score, with a trailing singleton dim squeezed.
    fn score(&self, td: &TensorDict, key: &NestedKey) -> Result<Tensor> {
        let sub = match td.get_entry(key) {
            Some(Entry::Dict(d)) => d,
            Some(Entry::Tensor(_)) => {
                return Err(Error::WrongEntryKind {
                    op: OP,
                    key: key.to_string(),
                    expected: "a sub-tensordict",
                    found: "a tensor",
                })
            }
            None => return Err(td.lookup_error(OP, &key.segments())),
        };
        let score = match &self.score_network {
            Some(net) => {
                // the network writes into a shallow copy: the input is not modified
                let scored = net.module.forward(sub.clone())?;
                let score_key = self.network_score_key(&net.out_keys)?;
                match scored.get(&score_key) {
                    Some(s) => s.shallow_clone(),
                    None => {
                        return Err(missing_score(
                            "RewardModelLoss (score network output)",
                            &scored,
                            key,
                            &score_key,
                        ))
                    }
                }
            }
            // no copy: the precomputed score is read in place
            None => match sub.get(&self.keys.score) {
                Some(s) => s.shallow_clone(),
                None => {
                    return Err(missing_score(
                        "RewardModelLoss (no score network: scores must be precomputed)",
                        sub,
                        key,
                        &self.keys.score,
                    ))
                }
            },
        };
        if score.dim() > 1 && score.size().last() == Some(&1) {
            Ok(score.f_squeeze_dim(-1)?)
        } else {
            Ok(score)
        }
    }
}

/// The missing-score error: the full key and the keys of the side's sub-tensordict.
fn missing_score(op: &'static str, sub: &TensorDict, side: &NestedKey, score: &NestedKey) -> Error {
    let available = sub
        .keys(crate::tensordict::KeysOptions::nested())
        .into_iter()
        .map(|k| k.prefixed(side).to_string())
        .collect();
    Error::KeyNotFound {
        op,
        key: side.join(score).to_string(),
        available,
    }
}

impl LossModule for RewardModelLoss {
    type Keys = RewardModelKeys;
    type Output = RewardModelLossOutput;

    fn name(&self) -> &'static str {
        "RewardModelLoss"
    }

    fn tensor_keys(&self) -> &RewardModelKeys {
        &self.keys
    }

    fn set_tensor_keys(&mut self, keys: RewardModelKeys) -> Result<()> {
        self.in_keys = Self::compute_in_keys(&keys, self.margin_key.as_ref());
        self.keys = keys;
        Ok(())
    }

    fn in_keys(&self) -> &[NestedKey] {
        &self.in_keys
    }

    fn forward(&self, td: &TensorDict) -> Result<RewardModelLossOutput> {
        let chosen = self.score(td, &self.keys.chosen)?;
        let rejected = self.score(td, &self.keys.rejected)?;
        let diff = rejected_margin(&chosen, &rejected)?; // rejected - chosen
        let loss_reward_model = match self.margin(td, &chosen.size())? {
            Some(m) => bradley_terry(&diff.f_add(&m)?, self.reduction)?,
            None => bradley_terry(&diff, self.reduction)?,
        };
        let loss_center = match self.center_coeff {
            Some(coeff) => {
                let center = match self.centering {
                    Centering::SumOfSquares => chosen
                        .f_pow_tensor_scalar(2)?
                        .f_add(&rejected.f_pow_tensor_scalar(2)?)?,
                    Centering::SquaredSum => chosen.f_add(&rejected)?.f_pow_tensor_scalar(2)?,
                };
                Some(self.reduction.apply(&center)?.f_mul_scalar(coeff)?)
            }
            None => None,
        };
        let (accuracy, margin) = {
            let _guard = tch::no_grad_guard();
            let d = diff.f_detach()?;
            (
                d.f_lt(0.0)?.f_mean(Kind::Float)?,
                d.f_mean(None::<Kind>)?.f_neg()?,
            )
        };
        Ok(RewardModelLossOutput {
            loss_reward_model,
            loss_center,
            accuracy,
            margin,
        })
    }
}
