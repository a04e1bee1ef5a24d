//! Faults in batched environments: a worker env (or a transform inside it) that returns an error
//! or panics, at reset, step or set_seed, on its first call or after several, in worker 0, the
//! last worker or two workers at once. A `ParallelEnv` reports `Error::Worker { index, .. }` with
//! the failing worker's index and the env's message; a `SerialEnv` returns the env's own error
//! (and lets a panic unwind to the caller). Nothing hangs: every scenario runs on its own thread
//! and fails the test if it does not finish within 20 s; after a worker panicked every later
//! call errors promptly, and dropping the env returns.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::{channel, RecvTimeoutError};
use std::sync::Once;
use std::thread;
use std::time::{Duration, Instant};

use tch::Tensor;
use torchrl::envs::batched::{ParallelEnv, SerialEnv};
use torchrl::envs::builtin::CountingEnv;
use torchrl::envs::transforms::{Transform, TransformedEnv};
use torchrl::envs::{EnvBase, EnvCore, RolloutConfig};
use torchrl::{Error, Result, TensorDict};

const TIMEOUT: Duration = Duration::from_secs(20);
/// Marker of every injected fault's message.
const MARK: &str = "injected fault";

// ------------------------------------------------------------------ harness

/// Silences the panic messages of injected faults (they are expected); other panics print as
/// usual.
fn quiet_injected_panics() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let payload = info
                .payload()
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| info.payload().downcast_ref::<&str>().copied())
                .unwrap_or("");
            if !payload.contains(MARK) {
                default(info);
            }
        }));
    });
}

/// Runs `f` on its own thread; fails if it does not finish within [`TIMEOUT`] (a hang), and
/// re-raises its panic (a failed assertion) otherwise.
fn within<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    quiet_injected_panics();
    let (tx, rx) = channel();
    let handle = thread::Builder::new()
        .name(format!("scenario {what}"))
        .spawn(move || {
            let out = f();
            let _ = tx.send(());
            out
        })
        .unwrap();
    match rx.recv_timeout(TIMEOUT) {
        Ok(()) | Err(RecvTimeoutError::Disconnected) => match handle.join() {
            Ok(v) => v,
            Err(p) => std::panic::resume_unwind(p),
        },
        Err(RecvTimeoutError::Timeout) => panic!("{what}: hung for more than {TIMEOUT:?}"),
    }
}

// ------------------------------------------------------------------ a faulty env

#[derive(Clone, Copy, Debug, PartialEq)]
enum Op {
    Reset,
    Step,
    Seed,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum How {
    Error,
    Panic,
}

#[derive(Clone, Copy, Debug)]
struct Fault {
    op: Op,
    /// Fails on this call (1-based) of `op`, and only on it.
    at: usize,
    how: How,
}

fn fault_message(id: usize, op: Op, call: usize) -> String {
    format!("{MARK} in {op:?} of env {id} (call {call})")
}

/// A CountingEnv (episodes of 100 steps) that fails as told.
struct FaultyEnv {
    inner: CountingEnv,
    id: usize,
    fault: Option<Fault>,
    calls: [usize; 3],
}

impl FaultyEnv {
    fn new(id: usize, fault: Option<Fault>) -> Self {
        FaultyEnv {
            inner: CountingEnv::new(100, &[]).unwrap(),
            id,
            fault,
            calls: [0; 3],
        }
    }

    fn tick(&mut self, op: Op) -> Result<()> {
        let slot = op as usize;
        self.calls[slot] += 1;
        let call = self.calls[slot];
        match self.fault {
            Some(f) if f.op == op && f.at == call => {
                let msg = fault_message(self.id, op, call);
                match f.how {
                    How::Error => Err(Error::InvalidArgument {
                        op: "FaultyEnv",
                        message: msg,
                    }),
                    How::Panic => panic!("{msg}"),
                }
            }
            _ => Ok(()),
        }
    }
}

impl EnvBase for FaultyEnv {
    fn core(&self) -> &EnvCore {
        self.inner.core()
    }
    fn core_mut(&mut self) -> &mut EnvCore {
        self.inner.core_mut()
    }
    fn reset_impl(&mut self, td: Option<&TensorDict>) -> Result<TensorDict> {
        self.tick(Op::Reset)?;
        self.inner.reset_impl(td)
    }
    fn step_impl(&mut self, td: &TensorDict) -> Result<TensorDict> {
        self.tick(Op::Step)?;
        self.inner.step_impl(td)
    }
    fn set_seed_impl(&mut self, seed: u64) -> Result<()> {
        self.tick(Op::Seed)?;
        self.inner.set_seed_impl(seed)
    }
}

const N: usize = 3;

fn faulty_envs(failing: &[usize], fault: Fault) -> Vec<FaultyEnv> {
    (0..N)
        .map(|i| FaultyEnv::new(i, failing.contains(&i).then_some(fault)))
        .collect()
}

/// One call of `op` on `env` (a step starts from random actions).
fn call(env: &mut dyn EnvBase, op: Op) -> Result<()> {
    match op {
        Op::Reset => env.reset(None).map(drop),
        Op::Step => {
            let td = TensorDict::new(env.batch_size())?;
            let td = env.rand_action(Some(td))?;
            env.step(td).map(drop)
        }
        Op::Seed => env.set_seed(17).map(drop),
    }
}

fn op_name(op: Op) -> &'static str {
    match op {
        Op::Reset => "reset",
        Op::Step => "step",
        Op::Seed => "set_seed",
    }
}

/// Every later call errors promptly with a worker error.
fn assert_dead(env: &mut dyn EnvBase, ctx: &str) {
    for (i, op) in [Op::Reset, Op::Step, Op::Seed, Op::Reset, Op::Step]
        .into_iter()
        .enumerate()
    {
        let t0 = Instant::now();
        let err = call(env, op).expect_err(&format!("{ctx}: later call {i} ({op:?}) succeeded"));
        assert!(
            matches!(err, Error::Worker { .. }),
            "{ctx}: later call {i} ({op:?}) gave {err}, expected a worker error"
        );
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "{ctx}: later call {i} took {:?}",
            t0.elapsed()
        );
    }
    let t0 = Instant::now();
    let err = env
        .rollout(5, None, &RolloutConfig::no_break())
        .expect_err(&format!("{ctx}: a later rollout succeeded"));
    assert!(matches!(err, Error::Worker { .. }), "{ctx}: {err}");
    assert!(t0.elapsed() < Duration::from_secs(5), "{ctx}: slow error");
}

/// The env works again: reset, a rollout, set_seed.
fn recovers(env: &mut dyn EnvBase, ctx: &str) {
    env.reset(None)
        .unwrap_or_else(|e| panic!("{ctx}: reset after an error: {e}"));
    let traj = env
        .rollout(4, None, &RolloutConfig::no_break())
        .unwrap_or_else(|e| panic!("{ctx}: rollout after an error: {e}"));
    let mut want = env.batch_size();
    want.push(4);
    assert_eq!(traj.batch_size(), want.as_slice(), "{ctx}");
    env.set_seed(3)
        .unwrap_or_else(|e| panic!("{ctx}: set_seed after an error: {e}"));
}

/// The scenario matrix: op × first call / after several × error / panic × which workers.
fn scenarios() -> Vec<(Op, usize, How, Vec<usize>)> {
    let mut out = Vec::new();
    for op in [Op::Reset, Op::Step, Op::Seed] {
        for at in [1, 4] {
            for how in [How::Error, How::Panic] {
                for workers in [vec![0], vec![N - 1], vec![0, N - 1], vec![1, N - 1]] {
                    out.push((op, at, how, workers));
                }
            }
        }
    }
    out
}

/// Makes the calls of `op` before the failing one (a step needs a reset first); they succeed.
fn warm_up(env: &mut dyn EnvBase, op: Op, at: usize, ctx: &str) {
    if op == Op::Step {
        env.reset(None)
            .unwrap_or_else(|e| panic!("{ctx}: reset: {e}"));
    }
    for i in 1..at {
        call(env, op).unwrap_or_else(|e| panic!("{ctx}: call {i} of {op:?} failed early: {e}"));
    }
}

// ------------------------------------------------------------------ ParallelEnv

#[test]
fn parallel_env_worker_faults_surface_with_the_worker_index() {
    for (op, at, how, workers) in scenarios() {
        let ctx = format!("ParallelEnv: {how:?} in {op:?} call {at} of workers {workers:?}");
        let c = ctx.clone();
        within(&ctx, move || {
            let fault = Fault { op, at, how };
            let mut env = ParallelEnv::new(faulty_envs(&workers, fault)).unwrap();
            warm_up(&mut env, op, at, &c);
            let err = call(&mut env, op).expect_err(&format!("{c}: the faulty call succeeded"));
            // The first failing worker in index order is reported (set_seed seeds the workers
            // one after the other, so a later failing worker is never reached).
            let first = workers[0];
            match &err {
                Error::Worker {
                    op: o,
                    index,
                    message,
                } => {
                    assert_eq!(*index, first, "{c}: wrong worker index in {err}");
                    assert_eq!(*o, op_name(op), "{c}: wrong op in {err}");
                    assert!(
                        message.contains(&fault_message(first, op, at)),
                        "{c}: the env's message is missing from {err}"
                    );
                    if how == How::Panic {
                        assert!(message.contains("panicked"), "{c}: {err}");
                    }
                }
                other => panic!("{c}: expected Error::Worker, got {other}"),
            }
            match how {
                How::Error => {
                    // The workers are alive. A fault fires once per env, so the only later
                    // failures are those of failing workers that a call did not reach:
                    // set_seed seeds the workers in turn and stops at the first error.
                    if op == Op::Seed {
                        for &w in &workers[1..] {
                            let err = call(&mut env, op).expect_err(&c);
                            assert!(
                                matches!(&err, Error::Worker { index, message, .. }
                                    if *index == w && message.contains(&fault_message(w, op, at))),
                                "{c}: the next set_seed should report worker {w}: {err}"
                            );
                        }
                    }
                    recovers(&mut env, &c);
                }
                How::Panic => assert_dead(&mut env, &c),
            }
            drop(env); // must not hang with dead workers
        });
    }
}

/// A ParallelEnv of 3 whose last worker panicked at its second step, after `extra` more failed
/// steps (each sends the step to the live workers before finding the dead one).
fn env_with_dead_last_worker(extra: usize) -> ParallelEnv {
    let fault = Fault {
        op: Op::Step,
        at: 2,
        how: How::Panic,
    };
    let mut env = ParallelEnv::new(faulty_envs(&[N - 1], fault)).unwrap();
    env.reset(None).unwrap();
    call(&mut env, Op::Step).unwrap();
    let err = call(&mut env, Op::Step).unwrap_err();
    assert!(matches!(err, Error::Worker { index: 2, .. }), "{err}");
    // Let the dead worker's thread finish exiting so that sends to it fail.
    thread::sleep(Duration::from_millis(200));
    for _ in 0..extra {
        let err = call(&mut env, Op::Step).unwrap_err();
        assert!(matches!(err, Error::Worker { index: 2, .. }), "{err}");
    }
    env
}

/// After a worker panicked, every later error names *that* worker.
///
/// Regression (fixed): `ParallelEnv::roundtrip` (src/envs/batched/parallel.rs) returns as soon as a send to a
/// dead worker fails, after it has already sent the command to the live workers before it, and
/// never collects their replies. Those replies stay queued and are read as the answers to later
/// commands: here `set_seed` (which talks to worker 0 first) reads a stale step reply and
/// reports `worker 0 failed: unexpected reply` instead of worker 2.
#[test]
fn parallel_env_later_errors_name_the_dead_worker() {
    within("later errors name the dead worker", || {
        let mut env = env_with_dead_last_worker(2);
        let err = call(&mut env, Op::Seed).unwrap_err();
        assert!(
            matches!(err, Error::Worker { index: 2, .. }),
            "set_seed after worker 2 died: {err}"
        );
    });
}

/// A reset that skips the dead worker (a `"_reset"` mask selecting live workers only) returns
/// the live workers' fresh reset data, or errors; never a reply left over from an earlier call.
///
/// Bug (same cause as above): worker 0's queued replies to the failed steps are read as its
/// reset output, so `reset` returns `Ok` with worker 0's observation at 3 (a stale step result)
/// instead of 0: silently wrong data.
#[test]
fn parallel_env_partial_reset_after_a_worker_died_is_not_stale() {
    within("partial reset after a dead worker", || {
        let mut env = env_with_dead_last_worker(1);
        let col = |v: [f32; 3]| Tensor::from_slice(&v).reshape([3, 1]);
        let flags = |v: [bool; 3]| Tensor::from_slice(&v).reshape([3, 1]);
        let td = TensorDict::new([N as i64])
            .unwrap()
            .with("_reset", flags([true, false, false]))
            .unwrap()
            .with("observation", col([7.0; 3]))
            .unwrap()
            .with("done", flags([false; 3]))
            .unwrap()
            .with("terminated", flags([false; 3]))
            .unwrap();
        match env.reset(Some(td)) {
            Err(e) => assert!(matches!(e, Error::Worker { .. }), "{e}"),
            Ok(out) => {
                let obs = out.get_or_err("observation").unwrap();
                assert_eq!(
                    obs.double_value(&[0, 0]),
                    0.0,
                    "worker 0 was reset but reset returned observation {} (a stale reply)",
                    obs.double_value(&[0, 0])
                );
            }
        }
    });
}

#[test]
fn parallel_env_worker_panic_message_and_dropping_a_dead_env() {
    // Every worker panics at its first reset: the error names worker 0, the rest are gone too.
    within("all workers panic", || {
        let fault = Fault {
            op: Op::Reset,
            at: 1,
            how: How::Panic,
        };
        let mut env = ParallelEnv::new(faulty_envs(&[0, 1, 2], fault)).unwrap();
        let err = env.rollout(3, None, &RolloutConfig::default()).unwrap_err();
        match &err {
            Error::Worker { index, message, .. } => {
                assert_eq!(*index, 0, "{err}");
                assert!(message.contains(&fault_message(0, Op::Reset, 1)), "{err}");
            }
            other => panic!("expected a worker error, got {other}"),
        }
        assert_dead(&mut env, "all workers panicked");
    });
    // Dropping right after the panic (no later call), and dropping an env whose workers never
    // received a command.
    within("drop after a panic", || {
        let fault = Fault {
            op: Op::Step,
            at: 1,
            how: How::Panic,
        };
        let mut env = ParallelEnv::new(faulty_envs(&[1], fault)).unwrap();
        env.reset(None).unwrap();
        assert!(call(&mut env, Op::Step).is_err());
        drop(env);
        drop(ParallelEnv::new(faulty_envs(&[], fault)).unwrap());
    });
}

// ------------------------------------------------------------------ SerialEnv

#[test]
fn serial_env_faults_return_the_envs_own_error() {
    for (op, at, how, workers) in scenarios() {
        let ctx = format!("SerialEnv: {how:?} in {op:?} call {at} of envs {workers:?}");
        let c = ctx.clone();
        within(&ctx, move || {
            let fault = Fault { op, at, how };
            let mut env = SerialEnv::new(faulty_envs(&workers, fault)).unwrap();
            warm_up(&mut env, op, at, &c);
            // Envs run in turn in the calling thread: the first failing env stops the call.
            let first = workers[0];
            let want = fault_message(first, op, at);
            match how {
                How::Error => {
                    let err = call(&mut env, op).expect_err(&format!("{c}: no error"));
                    match &err {
                        Error::InvalidArgument { op: o, message } => {
                            assert_eq!(*o, "FaultyEnv", "{c}: {err}");
                            assert_eq!(message, &want, "{c}: {err}");
                        }
                        other => panic!("{c}: expected the env's own error, got {other}"),
                    }
                    // The envs after the failing one were not called: each later failing env
                    // fails on the next call, then the env works again.
                    for &w in &workers[1..] {
                        let err = call(&mut env, op).expect_err(&c);
                        assert!(
                            matches!(&err, Error::InvalidArgument { message, .. }
                                if *message == fault_message(w, op, at)),
                            "{c}: the next call should report env {w}: {err}"
                        );
                    }
                    recovers(&mut env, &c);
                }
                How::Panic => {
                    // No worker thread to catch it: the env's panic unwinds to the caller.
                    let p = catch_unwind(AssertUnwindSafe(|| call(&mut env, op)))
                        .expect_err(&format!("{c}: the panic did not reach the caller"));
                    let msg = p
                        .downcast_ref::<String>()
                        .cloned()
                        .unwrap_or_else(|| "<non-string payload>".into());
                    assert_eq!(msg, want, "{c}");
                }
            }
        });
    }
}

// ------------------------------------------------------------------ faulty transforms

#[derive(Clone, Copy, Debug, PartialEq)]
enum Hook {
    Reset,
    Step,
}

struct FaultyTransform {
    id: usize,
    hook: Hook,
    at: usize,
    how: How,
    fail: bool,
    calls: usize,
}

impl Transform for FaultyTransform {
    fn name(&self) -> String {
        format!("FaultyTransform({})", self.id)
    }

    fn step(&mut self, _td: &TensorDict, next: TensorDict) -> Result<TensorDict> {
        self.maybe_fail(Hook::Step)?;
        Ok(next)
    }

    fn reset(&mut self, _td: &TensorDict, reset: TensorDict) -> Result<TensorDict> {
        self.maybe_fail(Hook::Reset)?;
        Ok(reset)
    }
}

impl FaultyTransform {
    fn message(id: usize, hook: Hook) -> String {
        format!("{MARK}: transform {id} in {hook:?}")
    }

    fn maybe_fail(&mut self, hook: Hook) -> Result<()> {
        if hook != self.hook {
            return Ok(());
        }
        self.calls += 1;
        if self.fail && self.calls == self.at {
            let msg = Self::message(self.id, hook);
            match self.how {
                How::Error => {
                    return Err(Error::InvalidArgument {
                        op: "FaultyTransform",
                        message: msg,
                    })
                }
                How::Panic => panic!("{msg}"),
            }
        }
        Ok(())
    }
}

#[test]
fn transform_faults_inside_parallel_workers_surface_with_the_worker_index() {
    for hook in [Hook::Reset, Hook::Step] {
        for how in [How::Error, How::Panic] {
            for at in [1, 3] {
                for failing in [0, N - 1] {
                    let ctx = format!("transform {how:?} in {hook:?} call {at}, worker {failing}");
                    let c = ctx.clone();
                    within(&ctx, move || {
                        let envs: Vec<_> = (0..N)
                            .map(|i| {
                                TransformedEnv::new(CountingEnv::new(100, &[2]).unwrap())
                                    .unwrap()
                                    .with(FaultyTransform {
                                        id: i,
                                        hook,
                                        at,
                                        how,
                                        fail: i == failing,
                                        calls: 0,
                                    })
                                    .unwrap()
                            })
                            .collect();
                        let mut env = ParallelEnv::new(envs).unwrap();
                        let op = match hook {
                            Hook::Reset => Op::Reset,
                            Hook::Step => Op::Step,
                        };
                        warm_up(&mut env, op, at, &c);
                        let err = call(&mut env, op).expect_err(&format!("{c}: no error"));
                        match &err {
                            Error::Worker { index, message, .. } => {
                                assert_eq!(*index, failing, "{c}: {err}");
                                assert!(
                                    message.contains(&FaultyTransform::message(failing, hook)),
                                    "{c}: {err}"
                                );
                            }
                            other => panic!("{c}: expected a worker error, got {other}"),
                        }
                        match how {
                            How::Error => {
                                let traj = env
                                    .rollout(3, None, &RolloutConfig::no_break())
                                    .unwrap_or_else(|e| panic!("{c}: rollout after: {e}"));
                                assert_eq!(traj.batch_size(), &[N as i64, 2, 3]);
                            }
                            How::Panic => assert_dead(&mut env, &c),
                        }
                        drop(env);
                    });
                }
            }
        }
    }
}

/// A transform that errors inside a TransformedEnv around a ParallelEnv: the transform's own
/// error comes back (not a worker error), and the workers are unaffected.
#[test]
fn transform_fault_around_a_parallel_env() {
    within("transform around ParallelEnv", || {
        let base = ParallelEnv::new(faulty_envs(
            &[],
            Fault {
                op: Op::Step,
                at: 0,
                how: How::Error,
            },
        ))
        .unwrap();
        let mut env = TransformedEnv::new(base)
            .unwrap()
            .with(FaultyTransform {
                id: 9,
                hook: Hook::Step,
                at: 2,
                how: How::Error,
                fail: true,
                calls: 0,
            })
            .unwrap();
        let err = env
            .rollout(5, None, &RolloutConfig::no_break())
            .unwrap_err();
        match err.root() {
            Error::InvalidArgument { message, .. } => {
                assert_eq!(message, &FaultyTransform::message(9, Hook::Step))
            }
            other => panic!("expected the transform's error, got {other}"),
        }
        let traj = env.rollout(5, None, &RolloutConfig::no_break()).unwrap();
        assert_eq!(traj.batch_size(), &[N as i64, 5]);
    });
}
