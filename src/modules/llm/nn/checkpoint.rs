//! Gradient checkpointing per block (`transformers`' `gradient_checkpointing_enable()`): the
//! forward keeps only each block's input, and the backward recomputes one block at a time, so
//! a training step holds one block's activations instead of all of them.
//!
//! libtorch's C++ API has no custom autograd function reachable from `tch`, so the backward
//! runs in two phases. During the forward (with grad on and checkpointing enabled on the
//! [`Decoder`](super::Decoder)) the blocks run without recording a graph, and the last block's
//! output enters the rest of the model (final norm, LM head, value head, the loss) as a leaf
//! that requires grad; the forward leaves a *segment* (the blocks as shallow copies, their
//! inputs, the attention context) in a per-thread list. After `loss.backward()`,
//! [`backward_pending`] walks the segments: for each, from the last block down, it recomputes
//! the block on its saved input with grad on and backpropagates the gradient that reached the
//! block's output, which accumulates the block's parameter gradients and yields the gradient of
//! its input; the first block's gradient flows on into the embedding. The trainers' optimizer
//! step ([`AdamW::backward_step_with`](crate::trainers::optim::AdamW::backward_step_with))
//! calls it after every backward; a hand-written loop calls it after its own `backward()`.
//!
//! The gradients are those of the plain backward (recomputation runs the same kernels on the
//! same inputs; no dropout is involved), as `tests/gradient_checkpointing.rs` checks.
//!
//! ```
//! use tch::{nn::VarStore, Device, Kind, Tensor};
//! use torchrl::modules::llm::nn::checkpoint::backward_pending;
//! use torchrl::modules::llm::{CausalLm, CausalLmConfig, Gpt2Config, LmInput};
//! # fn main() -> torchrl::Result<()> {
//! tch::manual_seed(0);
//! let vs = VarStore::new(Device::Cpu);
//! let cfg = Gpt2Config::new(32).with_n_layer(3).with_n_embd(16).with_n_head(2).with_n_positions(16);
//! let mut model = cfg.build(&vs.root())?;
//! let ids = Tensor::from_slice(&[1i64, 5, 7, 2]).view([1, 4]);
//! let grads = |model: &dyn CausalLm| -> torchrl::Result<Vec<Tensor>> {
//!     let loss = model.forward(&LmInput::new(&ids), None)?.logits()?.pow_tensor_scalar(2).mean(Kind::Float);
//!     loss.backward();
//!     backward_pending()?; // nothing pending without checkpointing
//!     let out = model.named_parameters().iter().map(|(_, p)| p.grad().copy()).collect();
//!     for (_, p) in model.named_parameters() { let _ = p.grad().zero_(); }
//!     Ok(out)
//! };
//! let plain = grads(model.as_ref())?;
//! model.gradient_checkpointing_enable();
//! let recomputed = grads(model.as_ref())?;
//! for (a, b) in plain.iter().zip(&recomputed) {
//!     assert!((a - b).abs().max().double_value(&[]) < 1e-6);
//! }
//! # Ok(()) }
//! ```

use std::cell::RefCell;

use tch::{Kind, Tensor};

use super::attention::BlockContext;
use super::block::DecoderBlock;
use crate::error::Result;

/// One checkpointed run of consecutive blocks.
struct Segment {
    blocks: Vec<DecoderBlock>,
    ctx: BlockContext,
    /// The input of each block, detached.
    inputs: Vec<Tensor>,
    /// The last block's output as the rest of the graph sees it: a leaf that requires grad.
    leaf: Tensor,
    /// The first block's input as the graph before the blocks has it (the embedding's output):
    /// its gradient flows on from there.
    origin: Tensor,
}

thread_local! {
    static PENDING: RefCell<Vec<Segment>> = const { RefCell::new(Vec::new()) };
}

/// The context with its tensors shared.
fn shallow_ctx(ctx: &BlockContext) -> BlockContext {
    BlockContext {
        blocked: ctx.blocked.as_ref().map(Tensor::shallow_clone),
        rope: ctx
            .rope
            .as_ref()
            .map(|(c, s)| (c.shallow_clone(), s.shallow_clone())),
    }
}

/// Runs `blocks` on `x` without recording a graph and returns the last output as a leaf that
/// requires grad, leaving a segment for [`backward_pending`].
pub(crate) fn forward(blocks: &[DecoderBlock], x: Tensor, ctx: &BlockContext) -> Result<Tensor> {
    let mut inputs = Vec::with_capacity(blocks.len());
    let mut h = x.f_detach()?;
    {
        let _guard = tch::no_grad_guard();
        for b in blocks {
            inputs.push(h.shallow_clone());
            h = b.forward(&h, ctx, None)?;
        }
    }
    let leaf = h.f_detach()?.set_requires_grad(true);
    PENDING.with(|p| {
        p.borrow_mut().push(Segment {
            blocks: blocks.iter().map(DecoderBlock::shallow).collect(),
            ctx: shallow_ctx(ctx),
            inputs,
            leaf: leaf.shallow_clone(),
            origin: x,
        })
    });
    Ok(leaf)
}

/// The number of checkpointed forwards on this thread whose backward has not run yet.
pub fn pending() -> usize {
    PENDING.with(|p| p.borrow().len())
}

/// Drops this thread's pending segments (forwards whose loss will not be backpropagated).
pub fn clear_pending() {
    PENDING.with(|p| p.borrow_mut().clear());
}

/// Runs the second phase of the backward for every checkpointed forward on this thread
/// since the last call (see the [module docs](self)), newest first; a forward whose output
/// got no gradient is dropped. Returns the number of segments backpropagated.
///
/// # Errors
/// As the recomputation and the backward passes.
pub fn backward_pending() -> Result<usize> {
    let segments = PENDING.with(|p| std::mem::take(&mut *p.borrow_mut()));
    let mut done = 0;
    for seg in segments.into_iter().rev() {
        let mut grad = seg.leaf.grad();
        if !grad.defined() {
            continue;
        }
        for (block, input) in seg.blocks.iter().zip(&seg.inputs).rev() {
            let x = input.f_detach()?.set_requires_grad(true);
            let y = block.forward(&x, &seg.ctx, None)?;
            backward_with(&y, &grad)?;
            grad = x.grad();
            if !grad.defined() {
                break;
            }
        }
        if grad.defined() && seg.origin.requires_grad() {
            backward_with(&seg.origin, &grad)?;
        }
        done += 1;
    }
    Ok(done)
}

/// Backpropagates `grad` (of `y`'s shape) from `y`: `sum(y · grad)` has `grad` as its
/// gradient at `y`.
fn backward_with(y: &Tensor, grad: &Tensor) -> Result<()> {
    let g = grad.f_detach()?.f_to_kind(y.kind())?;
    y.f_mul(&g)?.f_sum(Kind::Float)?.f_backward()?;
    Ok(())
}
