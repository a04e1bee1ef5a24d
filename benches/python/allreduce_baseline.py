"""W17 baseline: torch.distributed all_reduce(SUM) of a float32 tensor between 2 processes on
loopback with the Gloo backend, the Python half of the side-by-side with benches/allreduce.rs
(same sizes, repetitions and timing).

Run without RANK, the script starts 2 copies of itself (subprocess, torchrun's variables:
RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR=127.0.0.1, MASTER_PORT = a free port,
GLOO_SOCKET_IFNAME=lo so that Gloo binds to 127.0.0.1 as the Rust shim does for a loopback
master address) and waits for them. Each rank: init_process_group("gloo", env://), then per
size (4 KB, 1 MB, 16 MB) warm-up calls and timed repetitions; before each one the tensor is
refilled with ones and a barrier lines the ranks up; the time is that of the one
dist.all_reduce call. Rank 0 prints `W17_allreduce_<size>\t<ops/s of the best rep>\t# ...`.
Env: TORCHRL_BENCH_WORLD (processes, default 2).
"""

import os
import socket
import subprocess
import sys
import time
from datetime import timedelta

# (name, float32 elements, warm-up calls, timed repetitions): the same table as the Rust side.
SIZES = [
    ("4KB", 1024, 50, 1000),
    ("1MB", 262_144, 10, 200),
    ("16MB", 4_194_304, 3, 30),
]
DEADLINE_S = 600


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(world):
    port = free_port()
    procs = []
    for rank in range(world):
        env = dict(os.environ)
        env.update(
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(world),
            LOCAL_WORLD_SIZE=str(world),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
        )
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__)], env=env))
    start = time.monotonic()
    code = 0
    while True:
        states = [p.poll() for p in procs]
        failed = [r for r, s in enumerate(states) if s not in (None, 0)]
        if failed:
            print(f"allreduce baseline: rank {failed[0]} failed: {states[failed[0]]}", file=sys.stderr)
            code = 1
        elif all(s == 0 for s in states):
            break
        elif time.monotonic() - start > DEADLINE_S:
            print(f"allreduce baseline: ranks still running after {DEADLINE_S} s", file=sys.stderr)
            code = 1
        if code:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            break
        time.sleep(0.02)
    return code


def worker():
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=300))
    rank, world = dist.get_rank(), dist.get_world_size()
    for name, numel, warmup, reps in SIZES:
        t = torch.ones(numel, dtype=torch.float32)
        for i in range(warmup):
            t.fill_(1.0)
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
            if i == 0:
                lo, hi = t.min().item(), t.max().item()
                assert lo == world and hi == world, f"all_reduce of ones gave [{lo}, {hi}]"
        times = []
        for _ in range(reps):
            t.fill_(1.0)
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
            times.append(time.perf_counter() - t0)
        times.sort()
        n = len(times)
        best = times[0]
        med = times[n // 2] if n % 2 else 0.5 * (times[n // 2 - 1] + times[n // 2])
        if rank == 0:
            nbytes = numel * 4
            print(
                f"W17_allreduce_{name}\t{1.0 / best:.2f}\t# {nbytes / best / 1e9:.3f} GB/s best, "
                f"{nbytes / med / 1e9:.3f} GB/s median ({best * 1e6:.1f} us best, "
                f"{med * 1e6:.1f} us median over {reps} reps, {world} ranks, "
                f"torch {torch.__version__} torch.distributed/Gloo)",
                flush=True,
            )
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    if "RANK" not in os.environ:
        sys.exit(launch(int(os.environ.get("TORCHRL_BENCH_WORLD", "2"))))
    worker()
