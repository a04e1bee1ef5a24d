//! Bare-`tch` floor pieces of the ilql benches (see `bare_gpt2.rs`): trlX's ILQL heads
//! (`Linear → ReLU → Linear`, V / two Q / two target Q) on [`BareGpt2`], β-shaped generation
//! ([`BareIlql::generate`], `ilql_generate`'s math) and the ILQL loss ([`BareIlql::loss`],
//! `IlqlLoss`'s math with `ilql_loss`'s terms), as bare ops on the model's own parameter
//! tensors.
//!
//! What the loss leaves out of ours (work that does not reach the parameters): the LM logits
//! at every position (only the action positions enter the AWAC term: the LM head runs on the
//! gathered hidden states), the target Q heads' full output layer (only the taken action's
//! target Q-value is used: its row of the output weight is gathered instead), the statistics
//! (`q_mean`, `v_mean`, advantage and AWAC-weight means / max) and the input checks' host
//! reads.

#![allow(dead_code)] // each bench uses some of these

use tch::{Kind, Tensor};
use torchrl::modules::llm::{CausalLmWithIlqlHeads, MlpHead};
use torchrl::objectives::llm::IlqlConfig;
use torchrl::objectives::llm::IlqlKeys;
use torchrl::tensordict::TensorDict;

use super::bare_gpt2::{
    causal_blocked, padded_blocked, positions_from_mask, sample_rows, BareGpt2,
};

/// One `MlpHead`'s parameters (`Linear(h, 2h) → ReLU → Linear(2h, out)`, `[out, in]`
/// weights), shared with the head.
pub struct BareHead {
    pub w1: Tensor,
    pub b1: Tensor,
    pub w2: Tensor,
    pub b2: Tensor,
}

impl BareHead {
    /// The parameters of `head` (shallow clones).
    pub fn from_head(head: &MlpHead) -> Self {
        let [w1, b1, w2, b2] = head.parameters().map(Tensor::shallow_clone);
        BareHead { w1, b1, w2, b2 }
    }

    /// The hidden layer, `relu(x·w1ᵀ + b1)`.
    pub fn hidden(&self, x: &Tensor) -> Tensor {
        x.linear(&self.w1, Some(&self.b1)).relu()
    }

    /// `[.., n_embd]` → `[.., out]`.
    pub fn forward(&self, x: &Tensor) -> Tensor {
        self.hidden(x).linear(&self.w2, Some(&self.b2))
    }

    /// Output `idx` of each row only: `x` `[.., n_embd]`, `idx` `[..]` (int64) → `[..]` (the
    /// rows of the output layer gathered, not the full output).
    pub fn forward_at(&self, x: &Tensor, idx: &Tensor) -> Tensor {
        let w = Tensor::embedding(&self.w2, idx, -1, false, false);
        let b = Tensor::embedding(&self.b2.unsqueeze(-1), idx, -1, false, false).squeeze_dim(-1);
        (self.hidden(x) * w).sum_dim_intlist(-1, false, Kind::Float) + b
    }
}

/// A [`CausalLmWithIlqlHeads`]'s trunk and heads as bare tensors (shared with the model).
pub struct BareIlql {
    pub gpt: BareGpt2,
    pub v: BareHead,
    pub q: Vec<BareHead>,
    pub target_q: Vec<BareHead>,
}

/// One ILQL batch's tensors (`IlqlDataset::batch`'s layout, see `objectives::llm::ilql`).
pub struct BareIlqlBatch {
    pub ids: Tensor,
    pub mask: Tensor,
    pub actions_ixs: Tensor,
    pub states_ixs: Tensor,
    pub continues: Tensor,
    pub rewards: Tensor,
}

impl BareIlqlBatch {
    /// The tensors of `td` under the default [`IlqlKeys`].
    ///
    /// # Panics
    /// When a key is missing (bench code: the batch is built right there).
    pub fn from_td(td: &TensorDict) -> Self {
        let k = IlqlKeys::default();
        let get = |key| {
            td.get_or_err(key)
                .expect("an IlqlDataset batch")
                .shallow_clone()
        };
        BareIlqlBatch {
            ids: get(&k.tokens),
            mask: get(&k.attention_mask),
            actions_ixs: get(&k.actions_ixs),
            states_ixs: get(&k.states_ixs),
            continues: get(&k.continues),
            rewards: get(&k.action_rewards),
        }
    }
}

/// `hs` `[B, T, H]` at `ixs` `[B, N]` → `[B, N, H]` (`batched_index_select`).
pub fn gather_rows(hs: &Tensor, ixs: &Tensor) -> Tensor {
    let h = *hs.size().last().expect("[B, T, H]");
    hs.gather(1, &ixs.unsqueeze(-1).expand([-1, -1, h], false), false)
}

impl BareIlql {
    /// The trunk (`n_head` heads) and heads of `model`.
    pub fn from_model(model: &CausalLmWithIlqlHeads, n_head: i64) -> Self {
        let heads = model.heads();
        BareIlql {
            gpt: BareGpt2::from_model(model.model(), n_head),
            v: BareHead::from_head(heads.v_head()),
            q: heads.q_heads().iter().map(BareHead::from_head).collect(),
            target_q: heads
                .target_q_heads()
                .iter()
                .map(BareHead::from_head)
                .collect(),
        }
    }

    /// One step's scores from the last hidden state `h` `[B, E]`:
    /// `log_softmax(h·wteᵀ) + β·(min_i targetQ_i(h) − V(h))`, then top-k (`-inf` below the
    /// k-th largest; none when `k = 0` or `k ≥ vocab`).
    pub fn scores(&self, h: &Tensor, beta: f64, top_k: i64) -> Tensor {
        let logits = self.gpt.logits(h);
        let vocab = *logits.size().last().expect("vocab");
        let q_min = self
            .target_q
            .iter()
            .map(|q| q.forward(h))
            .reduce(|a, b| a.minimum(&b))
            .expect("a target Q head");
        let adv = q_min - self.v.forward(h);
        let logp = logits.log_softmax(-1, Kind::Float);
        let scores = if beta == 1.0 {
            logp + adv
        } else {
            logp + adv * beta
        };
        if top_k == 0 || top_k >= vocab {
            return scores;
        }
        let kth = scores
            .topk(top_k, -1, true, true)
            .0
            .narrow(-1, top_k - 1, 1);
        scores.masked_fill(&scores.lt_tensor(&kth), f64::NEG_INFINITY)
    }

    /// `steps` β-shaped tokens after the unpadded prompt `[B, P]` with the uniforms `u`
    /// `[steps, B]` (float64) at `temperature` (> 0), no EOS, KV cache: the tokens
    /// `[B, steps]`. `ilql_generate`'s math on an unpadded prompt, bare.
    pub fn generate(
        &self,
        prompt: &Tensor,
        steps: i64,
        u: &Tensor,
        beta: f64,
        top_k: i64,
        temperature: f64,
    ) -> Tensor {
        let _guard = tch::no_grad_guard();
        let gpt = &self.gpt;
        let (b, p) = prompt.size2().expect("[B, P]");
        let mut cache = gpt.new_cache();
        let positions = Tensor::arange(p, (Kind::Int64, prompt.device())).expand([b, p], false);
        let causal = causal_blocked(p, prompt.device());
        let mut h = gpt
            .hidden(prompt, &positions, Some(&mut cache), Some(&causal))
            .select(1, p - 1);
        let mut tokens = Vec::with_capacity(steps as usize);
        for step in 0..steps {
            let scores = self.scores(&h, beta, top_k);
            let scores = if temperature == 1.0 {
                scores
            } else {
                scores / temperature
            };
            let next = sample_rows(&scores, &u.select(0, step));
            tokens.push(next.shallow_clone());
            if step + 1 == steps {
                break;
            }
            let pos = Tensor::full([b, 1], p + step, (Kind::Int64, prompt.device()));
            h = gpt
                .hidden(&next.unsqueeze(1), &pos, Some(&mut cache), None)
                .select(1, 0);
        }
        Tensor::stack(&tokens, 1)
    }

    /// trlX HEAD's ILQL loss on `batch` with `cfg`'s weights (`ilql_loss`'s terms; `m` the
    /// real actions, `n = max(1, Σ m)`):
    /// `Σ_i Σ (Q_i − r − γ·V'ᵈ)²·m/n + Σ |τ − 1[tQ < V]|·(tQ − V)²·m/n
    ///  + cql·Σ_i Σ CE(q_i, a)·m/n + awac·Σ CE(lm, a)·exp(β(tQ − V))ᵈ·m/n`.
    pub fn loss(&self, batch: &BareIlqlBatch, cfg: &IlqlConfig) -> Tensor {
        let gpt = &self.gpt;
        let ixs = &batch.actions_ixs;
        let (_, a) = ixs.size2().expect("[B, A]");
        let t = batch.ids.size()[1];
        // the trunk over the batch (right padding: causal OR padded keys)
        let positions = positions_from_mask(&batch.mask);
        let blocked = padded_blocked(&batch.mask);
        let hs = gpt.hidden(&batch.ids, &positions, None, Some(&blocked));
        let actions_hs = gather_rows(&hs, ixs);
        let states_hs = gather_rows(&hs, &batch.states_ixs);

        // masks, actions
        let cont = batch.continues.ne(0);
        let keep = cont.narrow(1, 0, a);
        let n = keep.to_kind(Kind::Float).sum(Kind::Float).clamp_min(1.0);
        let masked_mean = |x: &Tensor| x.where_scalarother(&keep, 0.0).sum(Kind::Float) / &n;
        let actions = batch.ids.narrow(1, 1, t - 1).gather(1, ixs, false);
        let actions3 = actions.unsqueeze(-1);
        let ce = |logits: &Tensor| {
            -logits
                .log_softmax(-1, Kind::Float)
                .gather(-1, &actions3, false)
                .squeeze_dim(-1)
        };

        // heads
        let qs: Vec<Tensor> = self.q.iter().map(|q| q.forward(&actions_hs)).collect();
        let target_q = tch::no_grad(|| {
            let detached = actions_hs.detach();
            self.target_q
                .iter()
                .map(|q| q.forward_at(&detached, &actions))
                .reduce(|x, y| x.minimum(&y))
                .expect("a target Q head")
        });
        let vs = self.v.forward(&states_hs).squeeze_dim(-1);
        let value = vs.narrow(1, 0, a);
        let next_value = vs
            .narrow(1, 1, a)
            .where_scalarother(&cont.narrow(1, 1, a), 0.0)
            .detach();
        let q_hat = &batch.rewards + next_value * cfg.gamma;

        // the four terms
        let pick = |q: &Tensor| q.gather(-1, &actions3, false).squeeze_dim(-1);
        let sum = |terms: Vec<Tensor>| terms.into_iter().reduce(|x, y| x + y).expect("a Q head");
        let loss_q = sum(qs
            .iter()
            .map(|q| masked_mean(&(pick(q) - &q_hat).square()))
            .collect());
        let cql = sum(qs.iter().map(|q| masked_mean(&ce(q))).collect());
        let diff = &target_q - &value;
        let weight = Tensor::where_scalar(&target_q.lt_tensor(&value), 1.0 - cfg.tau, cfg.tau);
        let loss_v = masked_mean(&(weight * diff.square()));
        let awac_weight = tch::no_grad(|| ((&target_q - value.detach()) * cfg.beta).exp());
        let awac = masked_mean(&(ce(&gpt.logits(&actions_hs)) * awac_weight));
        loss_q + loss_v + cql * cfg.cql_scale + awac * cfg.awac_scale
    }
}
