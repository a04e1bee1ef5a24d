//! The stack plan: how each leaf of a `TensorDict` stack is computed. A leaf whose inputs
//! are, input by input, views of another leaf's inputs (in a rollout, each step's root
//! observation is the previous step's `("next", "observation")`) is a copy or a shift of that
//! leaf's stack instead of a stack of its own; the plain CPU leaves are computed on the host
//! into one consolidated buffer ([`stack`](super::stack)); everything else is
//! `Tensor::stack`. The values are those of `Tensor::stack` of every leaf.

use rustc_hash::FxHashMap;
use tch::{Device, Kind, Tensor};

use super::stack::{self, Layout, Reserve, Source};
use crate::error::{Error, Result};

/// The stack of every leaf along dim `d`, in order, as `Tensor::stack(&leaf.inputs, d)` would
/// give it (see the module docs for how). Every leaf has the same number of inputs, all of
/// the leaf's `shape`; the plain CPU leaves take their buffer from `reserve` when it is big
/// enough.
pub(crate) fn stack_leaves(
    leaves: &[Leaf<'_>],
    d: usize,
    reserve: Option<Reserve>,
) -> Result<Vec<Tensor>> {
    let plans = plan_leaves(leaves)?;
    let dim = d as i64;
    let n = leaves.first().map_or(0, |l| l.inputs.len()) as i64;
    let mut outputs: Vec<Option<Tensor>> = consolidated_leaves(leaves, &plans, d, reserve)?;
    for (leaf, (plan, out)) in leaves.iter().zip(plans.iter().zip(outputs.iter_mut())) {
        if out.is_none() && *plan == LeafPlan::Stack {
            *out = Some(Tensor::f_stack(&leaf.inputs, dim)?);
        }
    }
    let internal = || Error::invalid("stack", "internal: a leaf derived from an unstacked one");
    for (j, (leaf, plan)) in leaves.iter().zip(&plans).enumerate() {
        if outputs.get(j).is_some_and(Option::is_some) {
            continue;
        }
        let source = |k: usize| outputs.get(k).and_then(Option::as_ref).ok_or_else(internal);
        let derived = match *plan {
            LeafPlan::Stack => return Err(internal()),
            LeafPlan::Copy(k) => source(k)?.f_detach_copy()?,
            LeafPlan::Shift(k) => {
                let src = source(k)?;
                let first = leaf.inputs.first().ok_or_else(internal)?;
                let out = src.f_empty_like()?;
                out.f_select(dim, 0)?.f_copy_(first)?;
                out.f_narrow(dim, 1, n - 1)?
                    .f_copy_(&src.f_narrow(dim, 0, n - 1)?)?;
                out
            }
        };
        if let Some(o) = outputs.get_mut(j) {
            *o = Some(derived);
        }
    }
    outputs
        .into_iter()
        .map(|o| o.ok_or_else(internal))
        .collect()
}

/// The leaves that [`stack`](super::stack) computes, in one consolidated buffer
/// (`None` for the others): the stacked leaves whose inputs are plain CPU data (along a dim
/// after the first), and the copies and shifts of those whose first input is plain too.
fn consolidated_leaves(
    leaves: &[Leaf<'_>],
    plans: &[LeafPlan],
    d: usize,
    reserve: Option<Reserve>,
) -> Result<Vec<Option<Tensor>>> {
    let layouts: Vec<Option<Layout>> = leaves
        .iter()
        .zip(plans)
        .map(|(leaf, plan)| match plan {
            LeafPlan::Stack => stack::layout(&leaf.inputs, d),
            _ => None,
        })
        .collect();
    let mut jobs = Vec::new();
    let mut job_of = vec![None; leaves.len()];
    for (j, ((leaf, plan), l)) in leaves.iter().zip(plans).zip(&layouts).enumerate() {
        let job = match (plan, l) {
            (LeafPlan::Stack, Some(l)) => Some((l.clone(), Source::Stack(&leaf.inputs[..]))),
            (LeafPlan::Copy(k) | LeafPlan::Shift(k), _) => {
                let (Some(Some(l)), Some(first)) = (layouts.get(*k), leaf.inputs.first()) else {
                    continue;
                };
                match plan {
                    LeafPlan::Copy(_) => Some((l.clone(), Source::Copy(*k))),
                    _ if stack::is_plain(first, first.kind(), &leaf.shape) => {
                        Some((l.clone(), Source::Shift(*k, first)))
                    }
                    _ => None,
                }
            }
            _ => None,
        };
        if let (Some(job), Some(slot)) = (job, job_of.get_mut(j)) {
            *slot = Some(jobs.len());
            jobs.push(job);
        }
    }
    let mut out: Vec<Option<Tensor>> = (0..leaves.len()).map(|_| None).collect();
    if jobs.is_empty() {
        return Ok(out);
    }
    // Sources name leaves; the host stack names jobs.
    let remap = |k: usize| job_of.get(k).copied().flatten();
    for (_, src) in jobs.iter_mut() {
        match src {
            Source::Copy(k) | Source::Shift(k, _) => {
                *k = remap(*k).ok_or_else(|| {
                    Error::invalid("stack", "internal: a leaf derived from an unstacked one")
                })?
            }
            Source::Stack(_) => {}
        }
    }
    let mut tensors = stack::stack_consolidated(&jobs, reserve)?.into_iter();
    for (slot, job) in out.iter_mut().zip(&job_of) {
        if job.is_some() {
            *slot = tensors.next();
        }
    }
    Ok(out)
}

/// One leaf of a stack: its tensor in every input, and its shape (the same in all).
pub(crate) struct Leaf<'a> {
    /// The leaf's tensor in each input, in order.
    pub(crate) inputs: Vec<&'a Tensor>,
    /// The shape of every one of them.
    pub(crate) shape: Vec<i64>,
}

/// How a leaf of a stack is computed.
///
/// `Tensor::stack` along a dim after the batch dims copies one small block per (row, input);
/// copying an already stacked leaf is one bulk copy. So a leaf whose inputs are, input by input, views of another leaf's inputs
/// is copied from that leaf's stack. In a rollout, each step's root `observation`, `state`,
/// `done` and `terminated` are the previous step's `"next"` tensors (moved there by
/// `step_mdp`), and `terminated` is often the very tensor of `done`: 5 of a Pendulum
/// rollout's 10 leaves (timings in `docs/performance.md`). The values are those of the stack:
/// the same memory viewed the same way, at the time of the stack.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LeafPlan {
    /// `Tensor::stack` of its inputs.
    Stack,
    /// In every input, the same view as leaf `k`: a copy of leaf `k`'s stack.
    Copy(usize),
    /// In every input but the first, the same view as leaf `k` in the previous input: its
    /// first input, then leaf `k`'s stack without its last entry.
    Shift(usize),
}

/// Decides how each leaf is computed (see [`LeafPlan`]). Candidates come from the data
/// pointers of the first two inputs, and are taken only when every input matches (same data
/// pointer, strides and conj/neg bits, the shapes being equal), from a source leaf that has no
/// candidates itself (so it is stacked), with one dtype and device across both leaves' inputs
/// and no input that requires grad (a copy would not carry the stack's autograd graph).
fn plan_leaves(leaves: &[Leaf<'_>]) -> Result<Vec<LeafPlan>> {
    let count = leaves.len();
    let n = leaves.first().map_or(0, |l| l.inputs.len());
    if n == 0 || count < 2 {
        return Ok(vec![LeafPlan::Stack; count]);
    }
    // The data pointer of input `i` of a leaf (every leaf has `n` inputs).
    let ptr = |l: &Leaf<'_>, i: usize| l.inputs.get(i).map(|t| t.data_ptr() as usize);
    // Leaves by the data pointer of their first input: the candidate sources of leaf `j` share
    // it with `j`'s first input (a copy) or second input (a shift).
    let mut by_ptr: FxHashMap<usize, Vec<usize>> = FxHashMap::default();
    for (k, l) in leaves.iter().enumerate() {
        if let Some(p) = ptr(l, 0) {
            by_ptr.entry(p).or_default().push(k);
        }
    }
    let shape = |k: usize| leaves.get(k).map(|l| &l.shape);
    let by_ptr = &by_ptr;
    let with_ptr = move |p: Option<usize>, j: usize| {
        p.and_then(|p| by_ptr.get(&p))
            .into_iter()
            .flatten()
            .copied()
            .filter(move |k| *k != j && shape(*k) == shape(j))
    };
    let candidates: Vec<Vec<LeafPlan>> = leaves
        .iter()
        .enumerate()
        .map(|(j, l)| {
            let copies = with_ptr(ptr(l, 0), j)
                .filter(|k| *k < j)
                .map(LeafPlan::Copy);
            let mut c: Vec<LeafPlan> = copies.collect();
            if n > 1 {
                c.extend(with_ptr(ptr(l, 1), j).map(LeafPlan::Shift));
            }
            c
        })
        .collect();
    let mut uniform: Vec<Option<Option<(Kind, Device)>>> = vec![None; count];
    let mut plans = Vec::with_capacity(count);
    for (j, (leaf, cands)) in leaves.iter().zip(&candidates).enumerate() {
        let mut chosen = LeafPlan::Stack;
        for &plan in cands {
            let (k, shift) = match plan {
                LeafPlan::Copy(k) => (k, 0),
                LeafPlan::Shift(k) => (k, 1),
                LeafPlan::Stack => continue,
            };
            // The source must be stacked itself (no candidates of its own).
            let (Some(source), Some(true)) = (leaves.get(k), candidates.get(k).map(Vec::is_empty))
            else {
                continue;
            };
            let uj = uniform_kind(leaves, j, &mut uniform)?;
            if uj.is_none() || uj != uniform_kind(leaves, k, &mut uniform)? {
                continue;
            }
            // Input `i` of leaf `j` against input `i - shift` of the source, for `i` in
            // `shift..n`.
            let mut all = true;
            for (a, b) in leaf.inputs.iter().skip(shift).zip(&source.inputs) {
                if !same_view(a, b)? {
                    all = false;
                    break;
                }
            }
            if all {
                chosen = plan;
                break;
            }
        }
        plans.push(chosen);
    }
    Ok(plans)
}

/// The dtype and device shared by all inputs of leaf `j`, when they share one and none
/// requires grad (memoized in `memo`).
fn uniform_kind(
    leaves: &[Leaf<'_>],
    j: usize,
    memo: &mut [Option<Option<(Kind, Device)>>],
) -> Result<Option<(Kind, Device)>> {
    if let Some(Some(u)) = memo.get(j) {
        return Ok(*u);
    }
    let Some(first) = leaves.get(j).and_then(|l| l.inputs.first()) else {
        return Ok(None);
    };
    let first_kind = (first.f_kind()?, first.device());
    let mut u = Some(first_kind);
    for t in leaves.get(j).map_or(&[][..], |l| &l.inputs[..]) {
        if t.requires_grad() || (t.f_kind()?, t.device()) != first_kind {
            u = None;
            break;
        }
    }
    if let Some(m) = memo.get_mut(j) {
        *m = Some(u);
    }
    Ok(u)
}

/// Whether `a` and `b` view the same memory the same way (their shapes being equal).
fn same_view(a: &Tensor, b: &Tensor) -> Result<bool> {
    Ok(a.data_ptr() == b.data_ptr()
        && a.stride() == b.stride()
        && a.f_is_conj()? == b.f_is_conj()?
        && a.f_is_neg()? == b.f_is_neg()?)
}
