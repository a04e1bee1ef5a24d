//! `torchrl::distributed` on loopback: each multi-process test starts two processes of this test
//! binary (`--exact worker_… --ignored`) with torchrun's variables and a free port, and asserts
//! on the values they computed (the workers assert and exit non-zero on a mismatch). The
//! failure tests kill or silence one rank and check that the other gets an error naming the
//! operation and its rank within the timeout, not a hang. Input validation runs in-process on a
//! world of one.
#![cfg(feature = "distributed")]

use std::fs::File;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use tch::nn::{self, Module};
use tch::{Device, Kind, Tensor};
use torchrl::distributed::{
    all_reduce_gradients, all_reduce_moments, all_reduce_scalars, broadcast_parameters,
    gradient_hooks, Backend, InitOptions, ProcessGroup, ReduceOp, DEFAULT_BUCKET_BYTES,
};
use torchrl::objectives::llm::moments::BatchMoments;
use torchrl::Error;

/// Set in the workers' environment; a worker test without it returns at once.
const WORKER_ENV: &str = "TORCHRL_DIST_TEST_WORKER";
/// The timeout of rendezvous and of the collectives that must succeed (a loaded 2-core machine).
const SLOW: Duration = Duration::from_secs(120);
/// The timeout of the collectives that must fail.
const FAIL_TIMEOUT: Duration = Duration::from_secs(5);
/// Generous slack on top of the timeout for "no hang" bounds.
const SLACK: Duration = Duration::from_secs(25);
/// How long a parent waits for its workers before killing them and failing.
const DEADLINE: Duration = Duration::from_secs(300);

// ---------------------------------------------------------------------------------------------
// The parent side: spawn, wait with a deadline, never leave a process behind.
// ---------------------------------------------------------------------------------------------

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

struct Worker {
    rank: usize,
    child: Child,
    log: PathBuf,
    status: Option<ExitStatus>,
}

/// Workers that are killed when dropped (a failing assertion in the parent leaves nothing
/// running).
struct Workers(Vec<Worker>);

impl Drop for Workers {
    fn drop(&mut self) {
        for w in &mut self.0 {
            if w.status.is_none() {
                let _ = w.child.kill();
                let _ = w.child.wait();
            }
            let _ = std::fs::remove_file(&w.log);
        }
    }
}

fn log_path(name: &str, rank: usize) -> PathBuf {
    std::env::temp_dir().join(format!(
        "torchrl-dist-{}-{name}-{rank}.log",
        std::process::id()
    ))
}

fn spawn_workers(worker: &str, world: usize) -> Workers {
    let exe = std::env::current_exe().unwrap();
    let port = free_port();
    let mut workers = Workers(Vec::new());
    for rank in 0..world {
        let log = log_path(worker, rank);
        let out = File::create(&log).unwrap();
        let err = out.try_clone().unwrap();
        let child = Command::new(&exe)
            .args([
                "--exact",
                worker,
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(WORKER_ENV, "1")
            .env("RANK", rank.to_string())
            .env("LOCAL_RANK", rank.to_string())
            .env("WORLD_SIZE", world.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string())
            .env("OMP_NUM_THREADS", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .spawn()
            .unwrap();
        workers.0.push(Worker {
            rank,
            child,
            log,
            status: None,
        });
    }
    workers
}

impl Workers {
    /// Waits for every worker (killing all of them and panicking after `DEADLINE`).
    fn wait(&mut self) {
        let start = Instant::now();
        while self.0.iter().any(|w| w.status.is_none()) {
            for w in &mut self.0 {
                if w.status.is_none() {
                    w.status = w.child.try_wait().unwrap();
                }
            }
            if start.elapsed() > DEADLINE {
                let logs = self.logs();
                for w in &mut self.0 {
                    if w.status.is_none() {
                        let _ = w.child.kill();
                        w.status = w.child.wait().ok();
                    }
                }
                panic!("workers still running after {DEADLINE:?} (a hang):\n{logs}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn logs(&self) -> String {
        self.0
            .iter()
            .map(|w| {
                format!(
                    "--- rank {} ({:?}) ---\n{}",
                    w.rank,
                    w.status,
                    std::fs::read_to_string(&w.log).unwrap_or_default()
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn status(&self, rank: usize) -> ExitStatus {
        self.0[rank].status.unwrap()
    }

    fn log(&self, rank: usize) -> String {
        std::fs::read_to_string(&self.0[rank].log).unwrap_or_default()
    }
}

/// Runs `worker` on two ranks and asserts that both succeed.
fn run_two(worker: &str) -> Workers {
    let mut w = spawn_workers(worker, 2);
    w.wait();
    for rank in 0..2 {
        assert!(
            w.status(rank).success(),
            "rank {rank} of {worker} failed:\n{}",
            w.logs()
        );
    }
    // The worker really ran its body (not just returned early).
    for rank in 0..2 {
        assert!(
            w.log(rank).contains(&format!("{worker} rank {rank} done")),
            "{}",
            w.logs()
        );
    }
    w
}

// ---------------------------------------------------------------------------------------------
// The worker side.
// ---------------------------------------------------------------------------------------------

/// Joins the group from torchrun's variables, or `None` outside a worker process.
fn join() -> Option<ProcessGroup> {
    std::env::var_os(WORKER_ENV)?;
    tch::set_num_threads(1);
    let opts = InitOptions::from_env().unwrap().with_timeout(SLOW);
    Some(ProcessGroup::new(opts).unwrap())
}

fn done(name: &str, pg: &ProcessGroup) {
    println!("{name} rank {} done", pg.rank());
}

fn f32s(t: &Tensor) -> Vec<f32> {
    Vec::<f32>::try_from(t.reshape([-1])).unwrap()
}

fn f64s(t: &Tensor) -> Vec<f64> {
    Vec::<f64>::try_from(t.reshape([-1])).unwrap()
}

fn i64s(t: &Tensor) -> Vec<i64> {
    Vec::<i64>::try_from(t.reshape([-1])).unwrap()
}

// ---------------------------------------------------------------------------------------------
// Collectives: all_reduce (f32, f64, i64), broadcast from rank 1, all_gather, barriers.
// ---------------------------------------------------------------------------------------------

#[test]
fn collectives_on_two_ranks() {
    run_two("worker_collectives");
}

#[test]
#[ignore = "a worker process of collectives_on_two_ranks"]
fn worker_collectives() {
    let Some(pg) = join() else { return };
    let r = pg.rank() as f32;
    assert_eq!(pg.world_size(), 2);
    assert_eq!(pg.local_rank(), pg.rank());

    // float32: rank 0 holds [1, 2, 0], rank 1 holds [2, 4, -1].
    let x = || Tensor::from_slice(&[r + 1.0, 2.0 * (r + 1.0), -r]);
    let cases: [(ReduceOp, [f32; 3]); 5] = [
        (ReduceOp::Sum, [3.0, 6.0, -1.0]),
        (ReduceOp::Mean, [1.5, 3.0, -0.5]),
        (ReduceOp::Max, [2.0, 4.0, 0.0]),
        (ReduceOp::Min, [1.0, 2.0, -1.0]),
        (ReduceOp::Product, [2.0, 8.0, 0.0]),
    ];
    for (op, want) in cases {
        let mut t = x();
        pg.all_reduce(&mut t, op).unwrap();
        assert_eq!(t.kind(), Kind::Float);
        assert_eq!(f32s(&t), want.to_vec(), "{op:?}");
    }

    // float64, 2-D: rank r holds [[0.25 + r, -r], [r / 4, 3]].
    let rd = pg.rank() as f64;
    let y = || Tensor::from_slice(&[0.25 + rd, -rd, rd / 4.0, 3.0]).view([2, 2]);
    let mut t = y();
    pg.all_reduce(&mut t, ReduceOp::Sum).unwrap();
    assert_eq!(t.size(), vec![2, 2]);
    assert_eq!(f64s(&t), vec![1.5, -1.0, 0.25, 6.0]);
    let mut t = y();
    pg.all_reduce(&mut t, ReduceOp::Mean).unwrap();
    assert_eq!(f64s(&t), vec![0.75, -0.5, 0.125, 3.0]);
    let mut t = y();
    pg.all_reduce(&mut t, ReduceOp::Max).unwrap();
    assert_eq!(f64s(&t), vec![1.25, 0.0, 0.25, 3.0]);

    // int64: rank r holds [10 r + 1, -r, 7].
    let ri = pg.rank() as i64;
    let z = || Tensor::from_slice(&[10 * ri + 1, -ri, 7]);
    for (op, want) in [
        (ReduceOp::Sum, [12i64, -1, 14]),
        (ReduceOp::Max, [11, 0, 7]),
        (ReduceOp::Min, [1, -1, 7]),
    ] {
        let mut t = z();
        pg.all_reduce(&mut t, op).unwrap();
        assert_eq!(t.kind(), Kind::Int64);
        assert_eq!(i64s(&t), want.to_vec(), "{op:?}");
    }
    // Mean of integers is refused before any communication; the group stays usable.
    let err = pg.all_reduce(&mut z(), ReduceOp::Mean).unwrap_err();
    assert!(err.to_string().contains("floating-point"), "{err}");

    // A leaf that requires grad is reduced in place (no autograd complaint).
    let mut w = Tensor::from_slice(&[r + 1.0]).set_requires_grad(true);
    pg.all_reduce(&mut w, ReduceOp::Mean).unwrap();
    assert_eq!(f32s(&w.detach()), vec![1.5]);

    // broadcast from rank 1, float and int.
    let mut b = if pg.rank() == 1 {
        Tensor::from_slice(&[10.0f32, 20.0, 30.0])
    } else {
        Tensor::zeros([3], (Kind::Float, Device::Cpu))
    };
    pg.broadcast(&mut b, 1).unwrap();
    assert_eq!(f32s(&b), vec![10.0, 20.0, 30.0]);
    let mut bi = Tensor::from_slice(&[ri * 100 + 5, ri]).view([1, 2]);
    pg.broadcast(&mut bi, 1).unwrap();
    assert_eq!(i64s(&bi), vec![105, 1]);
    assert_eq!(bi.size(), vec![1, 2]);
    let err = pg.broadcast(&mut b, 2).unwrap_err();
    assert!(err.to_string().contains("src"), "{err}");

    // all_gather: result[q] is rank q's tensor, same shape and dtype.
    let g = Tensor::from_slice(&[rd, rd * 10.0, -1.0]).view([3, 1]);
    let all = pg.all_gather(&g).unwrap();
    assert_eq!(all.len(), 2);
    for (q, t) in all.iter().enumerate() {
        let q = q as f64;
        assert_eq!(t.size(), vec![3, 1]);
        assert_eq!(t.kind(), Kind::Double);
        assert_eq!(f64s(t), vec![q, q * 10.0, -1.0]);
    }
    // A non-contiguous input is gathered too (copied first).
    let m = Tensor::from_slice(&[ri, ri + 1, ri + 2, ri + 3])
        .view([2, 2])
        .tr();
    let all = pg.all_gather(&m).unwrap();
    assert_eq!(i64s(&all[1]), vec![1, 3, 2, 4]);
    assert_eq!(i64s(&all[0]), vec![0, 2, 1, 3]);

    pg.barrier().unwrap();
    pg.monitored_barrier(true).unwrap();
    pg.barrier().unwrap();
    done("worker_collectives", &pg);
}

// ---------------------------------------------------------------------------------------------
// Data parallel: broadcast_parameters, all_reduce_gradients, all_reduce_moments.
// ---------------------------------------------------------------------------------------------

#[test]
fn gradients_are_the_mean_of_the_ranks_gradients() {
    run_two("worker_gradients");
}

/// A two-layer model (`lin` 3→4, `out` 4→1) plus a frozen vector that never has a gradient.
fn model(seed: i64) -> (nn::VarStore, impl Module) {
    tch::manual_seed(seed);
    let vs = nn::VarStore::new(Device::Cpu);
    let root = vs.root();
    let lin = nn::linear(&root / "lin", 3, 4, Default::default());
    let out = nn::linear(&root / "out", 4, 1, Default::default());
    let _frozen = root.zeros_no_train("frozen", &[2]);
    let net = nn::seq().add(lin).add_fn(|x| x.tanh()).add(out);
    (vs, net)
}

/// Rank `r`'s batch: 5 inputs and targets drawn from seed 100 + r.
fn batch(r: usize) -> (Tensor, Tensor) {
    tch::manual_seed(100 + r as i64);
    let x = Tensor::randn([5, 3], (Kind::Float, Device::Cpu));
    let y = Tensor::randn([5, 1], (Kind::Float, Device::Cpu));
    (x, y)
}

fn zero_grads(vs: &nn::VarStore) {
    for (_, v) in vs.variables() {
        let mut g = v.grad();
        if g.defined() {
            let _ = g.zero_();
        }
    }
}

fn backward_on(vs: &nn::VarStore, net: &impl Module, r: usize) {
    zero_grads(vs);
    let (x, y) = batch(r);
    let loss = (net.forward(&x) - y).square().mean(Kind::Float);
    loss.backward();
}

fn grads(vs: &nn::VarStore) -> Vec<(String, Tensor)> {
    let mut out: Vec<(String, Tensor)> = vs
        .variables()
        .into_iter()
        .filter(|(_, v)| v.grad().defined())
        .map(|(k, v)| (k, v.grad().copy()))
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

#[test]
#[ignore = "a worker process of gradients_are_the_mean_of_the_ranks_gradients"]
fn worker_gradients() {
    let Some(pg) = join() else { return };
    let rank = pg.rank();

    // Each rank initialises differently; broadcasting rank 0's parameters makes them equal to a
    // model built from seed 0.
    let (vs, net) = model(rank as i64 + 7);
    let mut params: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
    params.sort_by(|a, b| a.0.cmp(&b.0));
    if rank == 1 {
        params.reverse(); // the helpers sort by name: the order given does not matter
    }
    let (vs0, _) = model(7);
    broadcast_parameters(&pg, &params, 0).unwrap();
    let v0 = vs0.variables();
    for (name, v) in vs.variables() {
        assert!(
            v.equal(&v0[&name]),
            "{name} differs from rank 0's after the broadcast"
        );
        assert!(v.requires_grad() == v0[&name].requires_grad());
    }

    // The single-process gradients of each rank's batch, computed locally for both ranks.
    backward_on(&vs, &net, 0);
    let g0 = grads(&vs);
    backward_on(&vs, &net, 1);
    let g1 = grads(&vs);
    assert_eq!(
        g0.len(),
        4,
        "lin.weight, lin.bias, out.weight, out.bias; frozen has none"
    );

    for bucket_bytes in [16, DEFAULT_BUCKET_BYTES] {
        backward_on(&vs, &net, rank);
        all_reduce_gradients(&pg, &params, bucket_bytes).unwrap();
        let got = grads(&vs);
        for ((name, g), ((_, a), (_, b))) in got.iter().zip(g0.iter().zip(g1.iter())) {
            let want = (a + b) / 2.0;
            let diff = (g - &want).abs().max().double_value(&[]);
            assert!(
                diff < 1e-6,
                "{name}, bucket {bucket_bytes} B: max |diff| = {diff}"
            );
        }
    }

    // Overlapped with backward (c10d's DDP reducer): after `prepare`, backward itself leaves
    // the SUM of the ranks' gradients (the frozen vector, which needs no grad, is left out);
    // 16-byte buckets, so several all-reduces run while backward goes on. A pass without
    // `prepare` stays local.
    let trainable: Vec<(String, Tensor)> = params
        .iter()
        .filter(|(_, t)| t.requires_grad())
        .map(|(n, t)| (n.clone(), t.shallow_clone()))
        .collect();
    let hooks = gradient_hooks(&pg, &trainable, 16).unwrap();
    for pass in 0..2 {
        zero_grads(&vs);
        let (x, y) = batch(rank);
        let loss = (net.forward(&x) - y).square().mean(Kind::Float);
        hooks.prepare(&[&loss]).unwrap();
        loss.backward();
        for ((name, g), ((_, a), (_, b))) in grads(&vs).iter().zip(g0.iter().zip(g1.iter())) {
            let diff = (g - (a + b)).abs().max().double_value(&[]);
            assert!(
                diff < 1e-6,
                "hooks pass {pass}, {name}: max |diff| = {diff}"
            );
        }
    }
    backward_on(&vs, &net, rank);
    let local = grads(&vs);
    let mine = if rank == 0 { &g0 } else { &g1 };
    for ((name, g), (_, m)) in local.iter().zip(mine.iter()) {
        assert!(g.equal(m), "{name}: a pass without prepare was reduced");
    }
    let frozen = params
        .iter()
        .find(|(n, _)| n == "frozen")
        .map(|(_, t)| t.shallow_clone());
    let err = gradient_hooks(&pg, &[("frozen".to_string(), frozen.unwrap())], 16).unwrap_err();
    assert!(err.to_string().contains("requires grad"), "{err}");
    drop(hooks);

    // Ranks with different gradient sets: every rank gets an error naming the ranks, and no
    // gradient changes; the group stays usable.
    backward_on(&vs, &net, rank);
    let before = grads(&vs);
    let mut uneven = params.clone_handles();
    if rank == 1 {
        let extra = Tensor::ones([2], (Kind::Float, Device::Cpu)).set_requires_grad(true);
        extra.sum(Kind::Float).backward();
        uneven.push(("extra".to_string(), extra));
    }
    let err = all_reduce_gradients(&pg, &uneven, DEFAULT_BUCKET_BYTES).unwrap_err();
    let msg = err.to_string();
    assert!(
        matches!(
            err,
            Error::Distributed {
                op: "all_reduce_gradients",
                ..
            }
        ),
        "{msg}"
    );
    assert!(
        msg.contains("rank 0: 4 tensors") && msg.contains("rank 1: 5 tensors"),
        "{msg}"
    );
    for ((_, a), (_, b)) in grads(&vs).iter().zip(before.iter()) {
        assert!(a.equal(b));
    }
    pg.barrier().unwrap();
    done("worker_gradients", &pg);
}

trait CloneHandles {
    fn clone_handles(&self) -> Vec<(String, Tensor)>;
}

impl CloneHandles for Vec<(String, Tensor)> {
    fn clone_handles(&self) -> Vec<(String, Tensor)> {
        self.iter()
            .map(|(k, v)| (k.clone(), v.shallow_clone()))
            .collect()
    }
}

#[test]
fn global_moments_equal_single_process_moments() {
    run_two("worker_moments");
}

#[test]
#[ignore = "a worker process of global_moments_equal_single_process_moments"]
fn worker_moments() {
    let Some(pg) = join() else { return };
    let data = [
        Tensor::from_slice(&[1.5f64, -2.0, 3.25, 0.0, 10.0]),
        Tensor::from_slice(&[4.0f64, 4.5, -7.0]),
    ];
    let local = BatchMoments::of(&data[pg.rank()]).unwrap();
    let global = all_reduce_moments(&pg, &local).unwrap();
    let all = BatchMoments::of(&Tensor::cat(&data, 0)).unwrap();
    assert_eq!(global.count(), 8.0);
    assert!(
        (global.mean() - all.mean()).abs() < 1e-12,
        "{global:?} vs {all:?}"
    );
    assert!(
        (global.m2() - all.m2()).abs() < 1e-9,
        "{global:?} vs {all:?}"
    );
    assert!((global.var() - all.var()).abs() < 1e-12);
    // Bitwise the same on both ranks.
    let mine = Tensor::from_slice(&[global.count(), global.mean(), global.m2()]);
    let both = pg.all_gather(&mine).unwrap();
    assert!(both[0].equal(&both[1]));

    let s = all_reduce_scalars(&pg, &[pg.rank() as f64, 2.0], ReduceOp::Mean).unwrap();
    assert_eq!(s, vec![0.5, 2.0]);
    let s = all_reduce_scalars(&pg, &[pg.rank() as f64 + 1.0], ReduceOp::Sum).unwrap();
    assert_eq!(s, vec![3.0]);
    done("worker_moments", &pg);
}

// ---------------------------------------------------------------------------------------------
// Failures: a vanished or silent peer gives an error within the timeout, never a hang.
// ---------------------------------------------------------------------------------------------

/// Asserts that `err` is an `Error::Distributed` for `op` on `rank` of 2, and returns its text.
fn assert_dist_error(err: &Error, op: &str, rank: usize) -> String {
    let msg = err.to_string();
    match err {
        Error::Distributed {
            op: o,
            rank: r,
            world_size,
            ..
        } => {
            assert_eq!((*o, *r, *world_size), (op, rank, 2), "{msg}");
        }
        other => panic!("expected Error::Distributed, got {other}"),
    }
    assert!(
        msg.contains(op) && msg.contains(&format!("rank {rank} of world size 2")),
        "{msg}"
    );
    msg
}

#[test]
fn an_exited_peer_gives_an_error_not_a_hang() {
    let mut w = spawn_workers("worker_peer_exits", 2);
    w.wait();
    println!("{}", w.logs()); // shown with --nocapture
    assert!(w.status(0).success(), "{}", w.logs());
    assert_eq!(w.status(1).code(), Some(17), "{}", w.logs());
    assert!(
        w.log(0).contains("worker_peer_exits rank 0 done"),
        "{}",
        w.logs()
    );
}

#[test]
#[ignore = "a worker process of an_exited_peer_gives_an_error_not_a_hang"]
fn worker_peer_exits() {
    let Some(mut pg) = join() else { return };
    pg.set_timeout(FAIL_TIMEOUT).unwrap();
    let mut t = Tensor::from_slice(&[1.0f32, 2.0]);
    pg.all_reduce(&mut t, ReduceOp::Sum).unwrap();
    assert_eq!(f32s(&t), vec![2.0, 4.0]);
    if pg.rank() == 1 {
        // Mid-protocol: gone without dropping the group.
        std::mem::forget(pg);
        std::process::exit(17);
    }
    let start = Instant::now();
    let mut err = None;
    // The peer's exit is noticed by the first collective, or at the latest within a few.
    for _ in 0..3 {
        if let Err(e) = pg.all_reduce(&mut t, ReduceOp::Sum) {
            err = Some(e);
            break;
        }
    }
    let elapsed = start.elapsed();
    let err = err.expect("all_reduce with a vanished peer succeeded");
    let msg = assert_dist_error(&err, "all_reduce", 0);
    assert!(elapsed < FAIL_TIMEOUT + SLACK, "took {elapsed:?}: {msg}");
    println!("error after {elapsed:?}: {msg}");
    // The group now refuses at once, naming the first failure.
    let again = pg.barrier().unwrap_err();
    let again = assert_dist_error(&again, "barrier", 0);
    assert!(again.contains("earlier failure of all_reduce"), "{again}");
    let start = Instant::now();
    drop(pg);
    assert!(start.elapsed() < FAIL_TIMEOUT + SLACK);
    println!("worker_peer_exits rank 0 done");
}

#[test]
fn a_killed_rank_zero_gives_an_error_on_rank_one() {
    let mut w = spawn_workers("worker_rank0_killed", 2);
    w.wait();
    println!("{}", w.logs()); // shown with --nocapture
    assert!(w.status(1).success(), "{}", w.logs());
    assert!(!w.status(0).success(), "{}", w.logs());
    assert!(
        w.log(1).contains("worker_rank0_killed rank 1 done"),
        "{}",
        w.logs()
    );
}

#[test]
#[ignore = "a worker process of a_killed_rank_zero_gives_an_error_on_rank_one"]
fn worker_rank0_killed() {
    let Some(mut pg) = join() else { return };
    pg.set_timeout(FAIL_TIMEOUT).unwrap();
    pg.barrier().unwrap();
    if pg.rank() == 0 {
        // SIGKILL: no destructor, no exit handler; the store server dies with it.
        let _ = Command::new("kill")
            .args(["-9", &std::process::id().to_string()])
            .status();
        std::thread::sleep(Duration::from_secs(60));
        std::process::exit(3); // not reached
    }
    let start = Instant::now();
    let mut t = Tensor::from_slice(&[1.0f64]);
    let mut err = None;
    for _ in 0..3 {
        if let Err(e) = pg.all_reduce(&mut t, ReduceOp::Max) {
            err = Some(e);
            break;
        }
    }
    let elapsed = start.elapsed();
    let err = err.expect("all_reduce with a killed rank 0 succeeded");
    let msg = assert_dist_error(&err, "all_reduce", 1);
    assert!(elapsed < FAIL_TIMEOUT + SLACK, "took {elapsed:?}: {msg}");
    println!("error after {elapsed:?}: {msg}");
    drop(pg);
    println!("worker_rank0_killed rank 1 done");
}

#[test]
fn a_silent_peer_times_out() {
    let w = run_two("worker_silent_peer");
    println!("{}", w.logs()); // shown with --nocapture
    assert!(w.log(0).contains("timed out"), "{}", w.logs());
}

#[test]
#[ignore = "a worker process of a_silent_peer_times_out"]
fn worker_silent_peer() {
    let Some(mut pg) = join() else { return };
    pg.set_timeout(FAIL_TIMEOUT).unwrap();
    pg.barrier().unwrap();
    if pg.rank() == 1 {
        // Alive, connected, but never joins the next collective.
        std::thread::sleep(FAIL_TIMEOUT + Duration::from_secs(3));
        drop(pg);
        println!("worker_silent_peer rank 1 done");
        return;
    }
    let start = Instant::now();
    let mut t = Tensor::from_slice(&[1.0f32]);
    let err = pg.all_reduce(&mut t, ReduceOp::Sum).unwrap_err();
    let elapsed = start.elapsed();
    let msg = assert_dist_error(&err, "all_reduce", 0);
    assert!(elapsed < FAIL_TIMEOUT + SLACK, "took {elapsed:?}: {msg}");
    assert!(
        elapsed >= FAIL_TIMEOUT.mul_f64(0.5),
        "failed after {elapsed:?}, before the peer could have been waited for: {msg}"
    );
    println!("timed out after {elapsed:?}: {msg}");
    drop(pg);
    println!("worker_silent_peer rank 0 done");
}

#[test]
fn rendezvous_without_the_peers_times_out() {
    // Rank 0 of 2 alone: the store waits for a second rank that never comes.
    let opts =
        InitOptions::new(0, 2, "127.0.0.1", free_port()).with_timeout(Duration::from_secs(3));
    let start = Instant::now();
    let err = ProcessGroup::new(opts).unwrap_err();
    let elapsed = start.elapsed();
    let msg = assert_dist_error(&err, "init", 0);
    assert!(
        elapsed < Duration::from_secs(3) + SLACK,
        "took {elapsed:?}: {msg}"
    );
    println!("after {elapsed:?}: {msg}");
}

#[test]
fn a_port_in_use_is_an_init_error() {
    let first = ProcessGroup::new(InitOptions::single_process().with_timeout(SLOW)).unwrap();
    let taken = first.master_port();
    let opts = InitOptions::new(0, 1, "127.0.0.1", taken).with_timeout(Duration::from_secs(5));
    let err = ProcessGroup::new(opts).unwrap_err();
    let msg = err.to_string();
    assert!(
        matches!(
            err,
            Error::Distributed {
                op: "init",
                rank: 0,
                world_size: 1,
                ..
            }
        ),
        "{msg}"
    );
    assert!(msg.contains(&taken.to_string()), "{msg}");
    println!("{msg}");
}

// ---------------------------------------------------------------------------------------------
// Validation (no second process needed).
// ---------------------------------------------------------------------------------------------

fn torchrun_env(k: &str) -> Option<String> {
    match k {
        "RANK" => Some("1".into()),
        "LOCAL_RANK" => Some("0".into()),
        "WORLD_SIZE" => Some("4".into()),
        "MASTER_ADDR" => Some(" node0 ".into()),
        "MASTER_PORT" => Some("29511".into()),
        _ => None,
    }
}

#[test]
fn init_options_read_torchrun_variables() {
    let o = InitOptions::from_env_with(torchrun_env).unwrap();
    assert_eq!(
        (o.rank, o.world_size, o.local_rank(), o.master_port),
        (1, 4, 0, 29511)
    );
    assert_eq!(o.master_addr, "node0");
    assert_eq!(o.backend, Backend::Gloo);
    assert_eq!(o.interface, None);
    let with_if = InitOptions::from_env_with(|k| {
        if k == "GLOO_SOCKET_IFNAME" {
            Some("eth1".into())
        } else {
            torchrun_env(k)
        }
    })
    .unwrap();
    assert_eq!(with_if.interface.as_deref(), Some("eth1"));
    // LOCAL_RANK defaults to RANK.
    let o = InitOptions::from_env_with(|k| {
        if k == "LOCAL_RANK" {
            None
        } else {
            torchrun_env(k)
        }
    })
    .unwrap();
    assert_eq!(o.local_rank(), 1);
}

#[test]
fn missing_or_bad_variables_are_named() {
    for (var, value, expect_got) in [
        ("RANK", None, "unset"),
        ("WORLD_SIZE", Some("two"), "\"two\""),
        ("MASTER_ADDR", None, "unset"),
        ("MASTER_PORT", Some("70000"), "\"70000\""),
        ("MASTER_PORT", None, "unset"),
        ("LOCAL_RANK", Some("-1"), "\"-1\""),
        ("RANK", Some(""), "\"\""),
    ] {
        let err = InitOptions::from_env_with(|k| {
            if k == var {
                value.map(str::to_string)
            } else {
                torchrun_env(k)
            }
        })
        .unwrap_err();
        let msg = err.to_string();
        assert!(
            matches!(&err, Error::InvalidValue { key, .. } if key == var),
            "{var}: {msg}"
        );
        assert!(
            msg.contains(var) && msg.contains(expect_got),
            "{var}: {msg}"
        );
    }
    // Parsable but inconsistent: rank >= world size.
    let err = InitOptions::from_env_with(|k| {
        if k == "RANK" {
            Some("4".into())
        } else {
            torchrun_env(k)
        }
    })
    .unwrap_err();
    assert!(
        matches!(err, Error::InvalidConfig { field: "rank", .. }),
        "{err}"
    );
}

#[test]
fn invalid_options_are_refused_before_any_connection() {
    let field = |o: InitOptions| match ProcessGroup::new(o).unwrap_err() {
        Error::InvalidConfig { field, .. } => field,
        other => panic!("expected InvalidConfig, got {other}"),
    };
    assert_eq!(field(InitOptions::new(2, 2, "127.0.0.1", 29500)), "rank");
    assert_eq!(
        field(InitOptions::new(0, 0, "127.0.0.1", 29500)),
        "world_size"
    );
    assert_eq!(field(InitOptions::new(0, 2, "127.0.0.1", 0)), "master_port");
    assert_eq!(field(InitOptions::new(0, 1, "  ", 1)), "master_addr");
    assert_eq!(
        field(InitOptions::single_process().with_timeout(Duration::ZERO)),
        "timeout"
    );
}

// ---------------------------------------------------------------------------------------------
// NCCL: without the feature a clear refusal; with it, on a machine without a CUDA device, a
// clear refusal naming the device count; on a GPU (scripts/nccl_smoke.sh), a group of one that
// reduces, broadcasts, gathers and trains on the GPU.
// ---------------------------------------------------------------------------------------------

#[test]
fn nccl_is_refused_clearly_or_works_on_a_gpu() {
    let nccl = || {
        InitOptions::single_process()
            .with_backend(Backend::Nccl)
            .with_timeout(SLOW)
    };
    assert_eq!(torchrl::distributed::nccl_built(), cfg!(feature = "nccl"));
    if !cfg!(feature = "nccl") {
        let err = ProcessGroup::new(nccl()).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, Error::InvalidConfig { .. }), "{msg}");
        assert!(
            msg.contains("NCCL not built") && msg.contains("`nccl`"),
            "{msg}"
        );
        return;
    }
    if !tch::Cuda::is_available() {
        let err = ProcessGroup::new(nccl()).unwrap_err();
        let msg = err.to_string();
        assert!(
            matches!(
                err,
                Error::Distributed {
                    op: "init",
                    rank: 0,
                    world_size: 1,
                    ..
                }
            ),
            "{msg}"
        );
        assert!(msg.contains("NCCL needs a CUDA device"), "{msg}");
        assert!(msg.contains("device_count() = 0"), "{msg}");
        println!("{msg}");
        return;
    }
    nccl_one_gpu_smoke(ProcessGroup::new(nccl()).unwrap());
}

/// The one-GPU NCCL smoke check: every collective on a CUDA tensor of a group of one, a CPU
/// tensor refused (naming the device), and one data-parallel SFT step on the GPU through the
/// `Collective` seam equal to a single-process step.
fn nccl_one_gpu_smoke(pg: ProcessGroup) {
    use torchrl::modules::llm::{Gpt2Config, Gpt2Model};
    use torchrl::trainers::parallel::{Collective, SharedCollective};
    use torchrl::trainers::sft::{SftConfig, SftTrainer};
    let gpu = Device::Cuda(0);
    assert_eq!(pg.backend(), Backend::Nccl);
    assert_eq!(pg.device(), gpu);
    let mut t = Tensor::from_slice(&[1.5f32, -2.0]).to_device(gpu);
    for op in [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max] {
        pg.all_reduce(&mut t, op).unwrap();
        assert_eq!(f32s(&t.to_device(Device::Cpu)), vec![1.5, -2.0], "{op:?}");
    }
    let mut b = Tensor::from_slice(&[7i64, 8]).to_device(gpu);
    pg.broadcast(&mut b, 0).unwrap();
    assert_eq!(i64s(&b.to_device(Device::Cpu)), vec![7, 8]);
    let all = pg.all_gather(&t).unwrap();
    assert_eq!(all.len(), 1);
    assert_eq!(all[0].device(), gpu);
    pg.barrier().unwrap();
    let mut cpu = Tensor::from_slice(&[1.0f32]);
    let err = pg.all_reduce(&mut cpu, ReduceOp::Sum).unwrap_err();
    assert!(matches!(err, Error::DeviceMismatch { .. }), "{err}");
    // through the Collective seam a CPU tensor travels to the GPU and back
    let shared = SharedCollective::new(pg);
    let mut x = Tensor::from_slice(&[2.0f64, 3.0]);
    shared.all_reduce_sum(&mut x).unwrap();
    assert_eq!(f64s(&x), vec![2.0, 3.0]);
    // one SFT step on the GPU with the NCCL group = one without a group
    let config = Gpt2Config::new(16)
        .with_n_positions(8)
        .with_n_embd(16)
        .with_n_layer(1)
        .with_n_head(2);
    let rows = vec![vec![1i64, 2, 3, 4], vec![5, 6, 7]];
    let step = |group: Option<&SharedCollective>| {
        tch::manual_seed(0);
        let vs = nn::VarStore::new(gpu);
        let model = Gpt2Model::new(&vs.root(), &config).unwrap();
        let mut sft = SftTrainer::new(&model, SftConfig::default()).unwrap();
        if let Some(g) = group {
            sft = sft.with_collective(g.clone()).unwrap();
        }
        let loss = sft.step(&model, &rows).unwrap();
        let mut p: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
        p.sort_by(|a, b| a.0.cmp(&b.0));
        (loss, p)
    };
    let (l1, p1) = step(Some(&shared));
    let (l0, p0) = step(None);
    assert!((l1 - l0).abs() < 1e-6, "{l1} vs {l0}");
    for ((n, a), (_, b)) in p1.iter().zip(&p0) {
        assert_eq!(a.device(), gpu, "{n}");
        let d = (a - b).abs().max().double_value(&[]);
        assert!(d < 1e-6, "{n}: {d}");
    }
    println!("NCCL one-GPU smoke check passed on {gpu:?}");
}

#[test]
fn a_world_of_one_is_a_working_group() {
    let mut pg = ProcessGroup::new(InitOptions::single_process().with_timeout(SLOW)).unwrap();
    assert_eq!(
        (pg.rank(), pg.world_size(), pg.local_rank(), pg.is_main()),
        (0, 1, 0, true)
    );
    assert_ne!(pg.master_port(), 0, "the port the OS chose");
    for op in [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min] {
        let mut t = Tensor::from_slice(&[1.5f32, -2.0]);
        pg.all_reduce(&mut t, op).unwrap();
        assert_eq!(f32s(&t), vec![1.5, -2.0]);
    }
    let mut t = Tensor::from_slice(&[3i64]);
    pg.broadcast(&mut t, 0).unwrap();
    assert_eq!(i64s(&t), vec![3]);
    let all = pg.all_gather(&t).unwrap();
    assert_eq!(all.len(), 1);
    assert_eq!(i64s(&all[0]), vec![3]);
    pg.barrier().unwrap();
    pg.set_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(pg.timeout(), Duration::from_secs(10));
    assert!(pg.set_timeout(Duration::ZERO).is_err());
}

#[test]
fn bad_tensors_are_refused_and_leave_the_group_usable() {
    let pg = ProcessGroup::new(InitOptions::single_process().with_timeout(SLOW)).unwrap();
    let err = pg
        .all_reduce(&mut Tensor::new(), ReduceOp::Sum)
        .unwrap_err();
    assert!(err.to_string().contains("undefined"), "{err}");
    let mut nc = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0])
        .view([2, 2])
        .tr();
    let err = pg.all_reduce(&mut nc, ReduceOp::Sum).unwrap_err();
    assert!(err.to_string().contains("contiguous"), "{err}");
    let err = pg.broadcast(&mut nc, 0).unwrap_err();
    assert!(err.to_string().contains("contiguous"), "{err}");
    let err = pg
        .all_reduce(&mut Tensor::from_slice(&[1i64]), ReduceOp::Mean)
        .unwrap_err();
    assert!(err.to_string().contains("floating-point"), "{err}");
    let err = pg
        .broadcast(&mut Tensor::from_slice(&[1.0f32]), 1)
        .unwrap_err();
    assert!(err.to_string().contains("src"), "{err}");
    let err = all_reduce_gradients(&pg, &[], 0).unwrap_err();
    assert!(err.to_string().contains("bucket_bytes"), "{err}");
    let err = broadcast_parameters(&pg, &[], 1).unwrap_err();
    assert!(err.to_string().contains("src"), "{err}");
    // None of these reached c10d: the group still works.
    let mut t = Tensor::from_slice(&[2.0f32]);
    pg.all_reduce(&mut t, ReduceOp::Sum).unwrap();
    assert_eq!(f32s(&t), vec![2.0]);
}

// ---------------------------------------------------------------------------------------------
// The launcher.
// ---------------------------------------------------------------------------------------------

const LAUNCHER: &str = env!("CARGO_BIN_EXE_torchrl-launch");

/// Runs the launcher with `args`, killing it after `DEADLINE`; returns its status and stderr.
fn launch(args: &[&str]) -> (ExitStatus, String) {
    let log = log_path("launcher", args.len());
    let log = log.with_extension(format!("{}.log", free_port()));
    let out = File::create(&log).unwrap();
    let mut child = Command::new(LAUNCHER)
        .args(args)
        .env(WORKER_ENV, "1")
        .env("OMP_NUM_THREADS", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::from(out.try_clone().unwrap()))
        .stderr(Stdio::from(out))
        .spawn()
        .unwrap();
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > DEADLINE {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "launcher hung: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_file(&log);
    (status, text)
}

#[test]
fn the_launcher_starts_every_rank_with_torchrun_variables() {
    let exe = std::env::current_exe().unwrap();
    let exe = exe.to_str().unwrap();
    let (status, out) = launch(&[
        "--nproc-per-node",
        "2",
        "--",
        exe,
        "--exact",
        "worker_launched",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ]);
    assert!(status.success(), "{out}");
    assert!(out.contains("worker_launched rank 0 done"), "{out}");
    assert!(out.contains("worker_launched rank 1 done"), "{out}");
}

#[test]
#[ignore = "a worker process of the_launcher_starts_every_rank_with_torchrun_variables"]
fn worker_launched() {
    if std::env::var_os(WORKER_ENV).is_none() {
        return;
    }
    for var in [
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
    ] {
        assert!(std::env::var(var).is_ok(), "{var} is not set");
    }
    assert_eq!(std::env::var("LOCAL_WORLD_SIZE").unwrap(), "2");
    let pg = ProcessGroup::init_from_env().unwrap();
    assert_eq!(pg.world_size(), 2);
    assert_eq!(pg.local_rank(), pg.rank());
    let mut t = Tensor::from_slice(&[pg.rank() as i64 + 1]);
    pg.all_reduce(&mut t, ReduceOp::Sum).unwrap();
    assert_eq!(i64s(&t), vec![3]);
    done("worker_launched", &pg);
}

#[test]
fn the_launcher_stops_the_others_when_a_rank_fails() {
    let start = Instant::now();
    let (status, out) = launch(&[
        "--nproc-per-node",
        "3",
        "--",
        "sh",
        "-c",
        // Rank 1 fails at once; the others would run for two minutes (exec: no grandchild).
        "if [ \"$RANK\" = 1 ]; then exit 3; fi; exec sleep 120",
    ]);
    assert!(!status.success(), "{out}");
    assert!(out.contains("rank 1 failed with exit code 3"), "{out}");
    assert!(out.contains("stopped the 2 other running rank(s)"), "{out}");
    assert!(
        start.elapsed() < Duration::from_secs(60),
        "took {:?}",
        start.elapsed()
    );
}

#[test]
fn the_launcher_refuses_bad_arguments() {
    for args in [
        &["--", "true"][..],
        &["--nproc-per-node", "0", "--", "true"],
        &["--nproc-per-node", "2"],
        &["--nproc-per-node", "two", "--", "true"],
        &["--nproc-per-node", "1", "--bogus", "--", "true"],
        &["--nproc-per-node", "1", "--master-port", "0", "--", "true"],
        &[
            "--nproc-per-node",
            "1",
            "--nnodes",
            "2",
            "--node-rank",
            "2",
            "--",
            "true",
        ],
    ] {
        let (status, out) = launch(args);
        assert!(!status.success(), "{args:?}: {out}");
        assert!(out.contains("torchrl-launch:"), "{args:?}: {out}");
    }
    let (status, out) = launch(&["--nproc_per_node=2", "--", "true"]);
    assert!(status.success(), "torchrun's spelling: {out}");
}
