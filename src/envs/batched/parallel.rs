//! `ParallelEnv`: N copies of an env, each owned by a worker thread.
//!
//! Tensordicts move to and from the workers over channels (`tch::Tensor` is `Send` but not
//! `Sync`: data moves, it is never shared). A worker whose env returns an error or panics
//! reports [`Error::Worker`] with its index on the call that failed; a worker that is gone
//! reports it on the next call. Nothing blocks forever: a dead worker's channel closes.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::thread::JoinHandle;

use super::{batched_specs, common_specs, split_workers, stack_resets, workers_to_reset};
use crate::envs::{EnvBase, EnvCore};
use crate::error::{Error, Result};
use crate::tensordict::{stack, TensorDict};

enum Cmd {
    Reset(Option<TensorDict>),
    Step(TensorDict),
    Seed(u64),
}

enum Reply {
    Td(TensorDict),
    Seed(u64),
}

struct Worker {
    tx: Option<Sender<Cmd>>,
    rx: Receiver<std::result::Result<Reply, String>>,
    handle: Option<JoinHandle<()>>,
}

/// N identical envs, one per worker thread, behind one batched env of batch size
/// `[N, *sub_batch]`.
pub struct ParallelEnv {
    workers: Vec<Worker>,
    core: EnvCore,
    /// Whether a worker's env couples its batch elements (asked before the envs move).
    couples: bool,
}

fn panic_message(p: Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        format!("panicked: {s}")
    } else if let Some(s) = p.downcast_ref::<String>() {
        format!("panicked: {s}")
    } else {
        "panicked".to_string()
    }
}

fn serve<E: EnvBase>(
    mut env: E,
    rx: Receiver<Cmd>,
    tx: Sender<std::result::Result<Reply, String>>,
) {
    while let Ok(cmd) = rx.recv() {
        let out = catch_unwind(AssertUnwindSafe(|| match cmd {
            Cmd::Reset(td) => env.reset_next(td.as_ref()).map(Reply::Td),
            Cmd::Step(td) => env.step_next(&td).map(Reply::Td),
            Cmd::Seed(s) => env.set_seed(s).map(Reply::Seed),
        }));
        let msg = match out {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(e)) => Err(e.to_string()),
            Err(p) => {
                // The env may be in a broken state after a panic: report and stop serving.
                let _ = tx.send(Err(panic_message(p)));
                return;
            }
        };
        if tx.send(msg).is_err() {
            return;
        }
    }
}

impl ParallelEnv {
    /// Moves each env into its own worker thread. The envs must have identical specs.
    pub fn new<E: EnvBase + 'static>(envs: Vec<E>) -> Result<Self> {
        let sub = common_specs(&envs)?;
        let specs = batched_specs(&sub, envs.len())?;
        let couples = envs.iter().any(|e| e.couples_batch_elements());
        let mut workers = Vec::with_capacity(envs.len());
        for (i, env) in envs.into_iter().enumerate() {
            let (tx, wrx) = channel::<Cmd>();
            let (wtx, rx) = channel();
            let handle = std::thread::Builder::new()
                .name(format!("torchrl-env-worker-{i}"))
                .spawn(move || {
                    // One intra-op thread per worker: the workers are the parallelism.
                    tch::set_num_threads(1);
                    serve(env, wrx, wtx)
                })
                .map_err(|e| Error::Worker {
                    op: "ParallelEnv::new",
                    index: i,
                    message: format!("could not spawn the worker thread: {e}"),
                })?;
            workers.push(Worker {
                tx: Some(tx),
                rx,
                handle: Some(handle),
            });
        }
        Ok(ParallelEnv {
            workers,
            core: EnvCore::from_transformed(specs)?,
            couples,
        })
    }

    /// Number of workers.
    pub fn num_workers(&self) -> usize {
        self.workers.len()
    }

    /// Sends one command per selected worker, then collects the replies (so the workers run
    /// concurrently). Errors name the first failing worker.
    fn roundtrip(
        &mut self,
        op: &'static str,
        cmds: Vec<Option<Cmd>>,
    ) -> Result<Vec<Option<Reply>>> {
        // Send to every selected worker first, remembering failures: every command that went out
        // must have its reply read below, or later calls would read stale replies.
        let mut sent = Vec::with_capacity(cmds.len());
        let mut first_err: Option<Error> = None;
        for (i, (w, cmd)) in self.workers.iter_mut().zip(cmds).enumerate() {
            let Some(cmd) = cmd else {
                sent.push(false);
                continue;
            };
            let ok = w.tx.as_ref().is_some_and(|tx| tx.send(cmd).is_ok());
            if !ok {
                first_err.get_or_insert(Error::Worker {
                    op,
                    index: i,
                    message: "the worker is gone (its env panicked or it was shut down earlier)"
                        .into(),
                });
            }
            sent.push(ok);
        }
        let mut out = Vec::with_capacity(sent.len());
        for (i, (w, was_sent)) in self.workers.iter().zip(sent).enumerate() {
            if !was_sent {
                out.push(None);
                continue;
            }
            // Always drain every reply so the channels stay in step, then report the first error.
            match w.rx.recv() {
                Ok(Ok(r)) => out.push(Some(r)),
                Ok(Err(message)) => {
                    first_err.get_or_insert(Error::Worker {
                        op,
                        index: i,
                        message,
                    });
                    out.push(None);
                }
                Err(_) => {
                    first_err.get_or_insert(Error::Worker {
                        op,
                        index: i,
                        message: "the worker exited without replying".into(),
                    });
                    out.push(None);
                }
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(out),
        }
    }
}

fn expect_td(op: &'static str, i: usize, r: Option<Reply>) -> Result<TensorDict> {
    match r {
        Some(Reply::Td(td)) => Ok(td),
        _ => Err(Error::Worker {
            op,
            index: i,
            message: "unexpected reply".into(),
        }),
    }
}

impl EnvBase for ParallelEnv {
    crate::envs::base::env_core_field!();

    fn couples_batch_elements(&self) -> bool {
        self.couples
    }

    fn reset_impl(&mut self, td: Option<&TensorDict>) -> Result<TensorDict> {
        let n = self.workers.len();
        let which = workers_to_reset(td, n)?;
        let subs: Vec<Option<TensorDict>> = match td {
            Some(t) => split_workers(t)?.into_iter().map(Some).collect(),
            None => vec![None; n],
        };
        let mut cmds = Vec::with_capacity(n);
        for (s, w) in subs.into_iter().zip(&which) {
            cmds.push(match (w, s) {
                (false, _) => None,
                (true, Some(t)) => Some(Cmd::Reset(Some(t.deep_clone()?))),
                (true, None) => Some(Cmd::Reset(None)),
            });
        }
        let replies = self.roundtrip("reset", cmds)?;
        let mut outs = Vec::with_capacity(n);
        for (i, r) in replies.into_iter().enumerate() {
            outs.push(match r {
                None => None,
                some => Some(expect_td("reset", i, some)?),
            });
        }
        stack_resets(outs)
    }

    fn step_impl(&mut self, td: &TensorDict) -> Result<TensorDict> {
        // Deep copies: the workers must not share storage with the caller's tensors.
        let subs = split_workers(td)?;
        let mut cmds = Vec::with_capacity(subs.len());
        for s in subs {
            cmds.push(Some(Cmd::Step(s.deep_clone()?)));
        }
        let replies = self.roundtrip("step", cmds)?;
        let outs = replies
            .into_iter()
            .enumerate()
            .map(|(i, r)| expect_td("step", i, r))
            .collect::<Result<Vec<_>>>()?;
        stack(&outs, 0)
    }

    /// Seeds worker `i` with the seed returned by worker `i - 1` (worker 0 gets `seed`), exactly
    /// as [`SerialEnv`](super::SerialEnv) does, so both give the same rollouts.
    fn set_seed_impl(&mut self, seed: u64) -> Result<()> {
        let mut s = seed;
        for i in 0..self.workers.len() {
            let mut cmds: Vec<Option<Cmd>> = (0..self.workers.len()).map(|_| None).collect();
            if let Some(c) = cmds.get_mut(i) {
                *c = Some(Cmd::Seed(s));
            }
            let replies = self.roundtrip("set_seed", cmds)?;
            match replies.into_iter().nth(i).flatten() {
                Some(Reply::Seed(next)) => s = next,
                _ => {
                    return Err(Error::Worker {
                        op: "set_seed",
                        index: i,
                        message: "unexpected reply".into(),
                    })
                }
            }
        }
        Ok(())
    }
}

impl Drop for ParallelEnv {
    fn drop(&mut self) {
        for w in &mut self.workers {
            // Closing the command channel ends the worker's loop.
            w.tx.take();
        }
        for w in &mut self.workers {
            if let Some(h) = w.handle.take() {
                let _ = h.join();
            }
        }
    }
}
