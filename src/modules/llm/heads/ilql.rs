//! trlX's ILQL heads ([`IlqlHeads`]: V, twin Q and Polyak-averaged target Q) and
//! [`CausalLmWithIlqlHeads`], the heads on any causal LM.

use std::fmt;

use tch::nn::{Path, VarStore};
use tch::{Kind, Tensor};

use super::mlp_head::MlpHead;
use super::{read_tokens, trunk_wrapper};
use crate::error::{Error, Result};
use crate::modules::llm::causal_lm::{dims2, CausalLm, LmInput, ModelBox};
use crate::modules::llm::keys::LlmKeys;
use crate::modules::TensorDictModule;
use crate::tensordict::{NestedKey, TensorDict};

/// `hs` `[B, T, H]` gathered at `ixs` `[B, N]` → `[B, N, H]` (trlX's `batched_index_select`).
pub fn batched_index_select(hs: &Tensor, ixs: &Tensor) -> Result<Tensor> {
    let (b, t, h) = hs.size3()?;
    let expected = format!("[{b}, N] (positions < {t})");
    let [rows, _] = dims2("batched_index_select", "ixs", ixs, &expected)?;
    if rows != b {
        return Err(Error::value(
            "batched_index_select",
            "ixs",
            format!("shape {expected}"),
            format!("{rows} rows"),
        ));
    }
    let idx = ixs
        .f_to_kind(Kind::Int64)?
        .f_unsqueeze(-1)?
        .f_expand([-1, -1, h], false)?;
    Ok(hs.f_gather(1, &idx, false)?)
}

/// What [`IlqlHeads::forward`] returns.
#[derive(Debug)]
pub struct IlqlHeadsOutput {
    /// Q-logits per Q head at the action positions, `[B, A, vocab]` each.
    pub qs: Vec<Tensor>,
    /// The frozen target heads' Q-logits at the action positions (detached).
    pub target_qs: Vec<Tensor>,
    /// Values at the state positions, `[B, S, 1]`.
    pub vs: Tensor,
}

/// trlX's ILQL heads: `v_head = make_head(h, 1)`, `q_heads = make_head(h, vocab)` (two with
/// `two_qs`), and target Q heads that start as copies and follow by Polyak averaging
/// (`target = α·q + (1 − α)·target`, [`IlqlHeads::sync_target_q_heads`]). The target heads
/// live in a frozen store of their own.
pub struct IlqlHeads {
    v_head: MlpHead,
    q_heads: Vec<MlpHead>,
    target_q_heads: Vec<MlpHead>,
    target_store: VarStore,
    alpha: f64,
}

impl fmt::Debug for IlqlHeads {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IlqlHeads")
            .field("n_qs", &self.q_heads.len())
            .field("alpha", &self.alpha)
            .finish()
    }
}

impl IlqlHeads {
    /// Heads under `path` (`v_head.*`, `q_heads.{i}.*`) for a trunk of width `n_embd` over
    /// `vocab` tokens; `two_qs` gives two Q heads; `alpha` is the Polyak rate in `[0, 1]`.
    pub fn new(path: &Path<'_>, n_embd: i64, vocab: i64, two_qs: bool, alpha: f64) -> Result<Self> {
        if !(0.0..=1.0).contains(&alpha) {
            return Err(Error::config("IlqlHeads", "alpha", "in [0, 1]", alpha));
        }
        let n_qs = if two_qs { 2 } else { 1 };
        let v_head = MlpHead::new(&(path / "v_head"), n_embd, 1)?;
        let q_heads = (0..n_qs)
            .map(|i| MlpHead::new(&(path / "q_heads" / i), n_embd, vocab))
            .collect::<Result<Vec<_>>>()?;
        let mut target_store = VarStore::new(path.device());
        let target_q_heads = q_heads
            .iter()
            .enumerate()
            .map(|(i, q)| q.copy_to(&(target_store.root() / "target_q_heads" / i)))
            .collect::<Result<Vec<_>>>()?;
        target_store.freeze();
        Ok(IlqlHeads {
            v_head,
            q_heads,
            target_q_heads,
            target_store,
            alpha,
        })
    }

    /// The Polyak rate.
    pub fn alpha(&self) -> f64 {
        self.alpha
    }

    /// The number of Q heads (1 or 2).
    pub fn n_qs(&self) -> usize {
        self.q_heads.len()
    }

    /// The store of the (frozen) target heads.
    pub fn target_store(&self) -> &VarStore {
        &self.target_store
    }

    /// The V head.
    pub fn v_head(&self) -> &MlpHead {
        &self.v_head
    }

    /// The Q heads.
    pub fn q_heads(&self) -> &[MlpHead] {
        &self.q_heads
    }

    /// The target Q heads.
    pub fn target_q_heads(&self) -> &[MlpHead] {
        &self.target_q_heads
    }

    /// Q, target-Q and V from the last hidden state `hs` `[B, T, H]`, gathered at the action
    /// and state positions (all positions where `None`).
    pub fn forward(
        &self,
        hs: &Tensor,
        states_ixs: Option<&Tensor>,
        actions_ixs: Option<&Tensor>,
    ) -> Result<IlqlHeadsOutput> {
        let actions_hs = match actions_ixs {
            Some(ix) => batched_index_select(hs, ix)?,
            None => hs.shallow_clone(),
        };
        let states_hs = match states_ixs {
            Some(ix) => batched_index_select(hs, ix)?,
            None => hs.shallow_clone(),
        };
        let qs = self
            .q_heads
            .iter()
            .map(|q| q.forward(&actions_hs))
            .collect::<Result<Vec<_>>>()?;
        self.follow_q_heads()?;
        let target_qs = {
            let _guard = tch::no_grad_guard();
            let detached = actions_hs.f_detach()?;
            self.target_q_heads
                .iter()
                .map(|q| q.forward(&detached))
                .collect::<Result<Vec<_>>>()?
        };
        Ok(IlqlHeadsOutput {
            qs,
            target_qs,
            vs: self.v_head.forward(&states_hs)?,
        })
    }

    /// Moves the target heads to their Q heads' dtype and device when those changed (the
    /// model's store converted with `set_kind` or moved with `to_device` after the heads were
    /// built: the target heads live in a store of their own, which such a call cannot see).
    fn follow_q_heads(&self) -> Result<()> {
        let _guard = tch::no_grad_guard();
        for (t, q) in self.target_q_heads.iter().zip(&self.q_heads) {
            for (t, q) in t.parameters().into_iter().zip(q.parameters()) {
                if t.kind() != q.kind() || t.device() != q.device() {
                    let moved = t.f_to_device(q.device())?.f_to_kind(q.kind())?;
                    t.shallow_clone().f_set_data(&moved)?;
                }
            }
        }
        Ok(())
    }

    /// One Polyak step of every target head towards its Q head (in the Q heads' dtype and
    /// device, which the target heads follow).
    pub fn sync_target_q_heads(&self) -> Result<()> {
        self.follow_q_heads()?;
        for (t, q) in self.target_q_heads.iter().zip(&self.q_heads) {
            t.polyak_from(q, self.alpha)?;
        }
        Ok(())
    }
}

/// What [`CausalLmWithIlqlHeads::forward`] returns (trlX's `(logits, qs, target_qs, vs)`).
#[derive(Debug)]
pub struct IlqlOutput {
    /// LM logits over **all** positions, `[B, T, vocab]`.
    pub logits: Tensor,
    /// The heads' outputs.
    pub heads: IlqlHeadsOutput,
}

/// trlX's `CausalLMWithValueHeads`: a causal LM (any [`CausalLm`]) with [`IlqlHeads`] on its last hidden
/// state. As a [`TensorDictModule`] it reads the tokens, the mask, `actions_ixs` and
/// `states_ixs`, and writes `logits`, `qs` / `target_qs` (`[B, A, n_qs, vocab]`) and `vs`
/// (`[B, S, 1]`).
pub struct CausalLmWithIlqlHeads {
    model: ModelBox,
    heads: IlqlHeads,
    keys: LlmKeys,
}

impl CausalLmWithIlqlHeads {
    /// ILQL heads under `path` (`ilql_heads.*`) on `model`.
    pub fn from_model(
        path: &Path<'_>,
        model: impl Into<ModelBox>,
        two_qs: bool,
        alpha: f64,
    ) -> Result<Self> {
        let model = model.into();
        let facts = model.0.facts();
        let heads = IlqlHeads::new(
            &(path / "ilql_heads"),
            facts.hidden_size,
            facts.vocab_size,
            two_qs,
            alpha,
        )?;
        Ok(CausalLmWithIlqlHeads {
            model,
            heads,
            keys: LlmKeys::default(),
        })
    }

    /// The heads.
    pub fn heads(&self) -> &IlqlHeads {
        &self.heads
    }

    /// Logits over all positions and the heads at the given positions, one trunk pass.
    pub fn forward(
        &self,
        input: &LmInput<'_>,
        states_ixs: Option<&Tensor>,
        actions_ixs: Option<&Tensor>,
    ) -> Result<IlqlOutput> {
        let out = self.model.0.forward(input, None)?;
        let heads = self
            .heads
            .forward(&out.last_hidden, states_ixs, actions_ixs)?;
        Ok(IlqlOutput {
            logits: out.logits()?,
            heads,
        })
    }
}

impl CausalLmWithIlqlHeads {
    /// [`CausalLmWithIlqlHeads::forward`] from the loss's inputs: logits `[B, T, V]`, Q /
    /// target-Q `[B, A, V]` per head and V `[B, S, 1]` at `actions_ixs` `[B, A]` and
    /// `states_ixs` `[B, S]`.
    ///
    /// # Errors
    /// As the model's forward.
    pub fn ilql_forward(
        &self,
        tokens: &Tensor,
        attention_mask: &Tensor,
        actions_ixs: &Tensor,
        states_ixs: &Tensor,
    ) -> Result<IlqlOutput> {
        self.forward(
            &LmInput::new(tokens).with_attention_mask(attention_mask),
            Some(states_ixs),
            Some(actions_ixs),
        )
    }
}

impl TensorDictModule for CausalLmWithIlqlHeads {
    fn in_keys(&self) -> Vec<NestedKey> {
        vec![
            self.keys.input_ids.clone(),
            self.keys.attention_mask.clone(),
            self.keys.actions_ixs.clone(),
            self.keys.states_ixs.clone(),
        ]
    }

    fn out_keys(&self) -> Vec<NestedKey> {
        vec![
            self.keys.logits.clone(),
            "qs".into(),
            "target_qs".into(),
            "vs".into(),
        ]
    }

    fn forward(&self, mut td: TensorDict) -> Result<TensorDict> {
        let (ids, mask) = read_tokens(&td, &self.keys)?;
        let actions = td.get_or_err(&self.keys.actions_ixs)?;
        let states = td.get_or_err(&self.keys.states_ixs)?;
        let out = CausalLmWithIlqlHeads::forward(
            self,
            &LmInput::new(ids).with_attention_mask(mask),
            Some(states),
            Some(actions),
        )?;
        let qs = Tensor::f_stack(&out.heads.qs, 2)?;
        let target_qs = Tensor::f_stack(&out.heads.target_qs, 2)?;
        td.set(&self.keys.logits, out.logits)?;
        td.set("qs", qs)?;
        td.set("target_qs", target_qs)?;
        td.set("vs", out.heads.vs)?;
        Ok(td)
    }
}

trunk_wrapper!(CausalLmWithIlqlHeads);
