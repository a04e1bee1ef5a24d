"""The Python side of the off-policy side-by-side benchmark: TorchRL 0.14.1 running W24..W27,
which benches/offpolicy.rs mirrors in Rust on the same machine, in the same run.

Needs: torch==2.13.0 torchrl==0.14.1 tensordict gymnasium (all from PyPI), and g++ for W26 (see
segment_trees below).  Eager mode, CPU, float32, torch.set_num_threads(1); W24..W26 report the
best of 3 timed repetitions after one untimed warm-up repetition.  Prints one line per workload:
name<TAB>operations-per-second[<TAB># comment]; progress and W27's details go to stderr.
Run a subset with e.g. `python offpolicy_baseline.py W24 W27` (default: all).

W24_sac_update: one SAC update, 200 per repetition; unit updates/s.  Pendulum sizes (obs 3, action
  1 in [-2, 2]).  Actor: MLP 3->256->256->2 (torchrl.modules.MLP, Tanh) -> NormalParamExtractor
  (biased softplus scale) -> ProbabilisticActor(TanhNormal(low=-2, high=2), in_keys loc/scale,
  return_log_prob=False, spec Bounded(-2, 2, (1,)) so target entropy "auto" = -1).  Critic:
  ValueOperator(MLP 4->256->256->1) over ["observation", "action"] -> "state_action_value".
  SACLoss defaults: 2 Q nets, loss_function "smooth_l1", alpha learned from alpha_init 1.0,
  target_entropy "auto", target Q params (delay_qvalue=True), no target actor;
  make_value_estimator(gamma=0.99) = TD(0).  Fixed batch of 256 made once: observation,
  ("next", "observation") ~ N(0, 1) [256, 3]; action ~ U(-2, 2) [256, 1]; ("next", "reward")
  ~ N(0, 1) [256, 1]; ("next", "terminated") = ("next", "done") bool [256, 1], each True with
  probability 0.05.  One update: out = loss(td); (loss_actor + loss_qvalue + loss_alpha)
  .backward() after zero_grad; one Adam(loss.parameters(), lr=3e-4) step; SoftUpdate(tau=0.005).
  (SACLoss writes loc, scale and td_error into the batch on every call, as TorchRL does.)
W25_dqn_update: one DQN update, 500 per repetition; unit updates/s.  CartPole sizes (obs 4, two
  actions).  QValueActor(MLP 4->256->256->2, Tanh; spec OneHot(2)); DQNLoss(action_space="one-hot",
  delay_value=True, double_dqn=False, loss_function default "l2"); make_value_estimator(gamma=0.99)
  = TD(0).  Fixed batch of 256: observation, ("next", "observation") ~ N(0, 1) [256, 4]; action
  one-hot bool [256, 2] (OneHot(2).rand); reward ~ N(0, 1), done = terminated as in W24.  One
  update: loss(td)["loss"].backward() after zero_grad; Adam lr 3e-4 step; SoftUpdate(tau=0.005).
W26_prioritized_replay_1m: TensorDictPrioritizedReplayBuffer(alpha=0.7, beta=0.5,
  storage=LazyTensorStorage(1_000_000), batch_size=256, priority_key="td_error") holding Pendulum
  transitions (observation [3], action [1], ("next", observation [3], reward [1], done [1] bool,
  terminated [1] bool); float32, random as in W24).  The buffer is first filled to 1,000,000 by
  100 extends of 10,000 (the 100 chunks are generated beforehand, untimed); the time of those
  extends alone is printed as W26_fill_1m (entries/s, one fill, no repetition).  Timed op, 1,000
  per repetition, unit ops/s: extend a fixed pre-made batch of 256 transitions (overwriting the
  ring), sample 256, set a fresh torch.rand(256) "td_error" in the sample,
  rb.update_tensordict_priority(sample).
W27_sac_pendulum_to_m200: end-to-end SAC on gymnasium's Pendulum-v1 until the deterministic
  policy's mean return reaches -200; value 1/seconds, comment with seconds and frames (failure:
  value 0 after 30,000 frames).  Config as examples/sac_pendulum.rs: 4 envs, 200-step episodes,
  StepCounter(max_steps=200) + RewardSum; a Collector with frames_per_batch 64 (16 steps x 4
  envs) exploring with the actor's samples (ExplorationType.RANDOM); ReplayBuffer(
  LazyTensorStorage(100_000), RandomSampler, batch 128); no updates until the buffer holds 1,000
  frames, then 64 updates per collected batch; actor 3->64->64->2, critics 4->64->64->1 (as W24
  otherwise, TanhNormal bounds from the env's action spec); SACLoss defaults, TD(0) gamma 0.99,
  one Adam(loss.parameters(), lr=3e-3), SoftUpdate(tau=0.02).  Evaluation once the collected
  frames reach 2,000, 3,000, ... (every 1,000 frames after the 1,000-frame warm-up; at the end
  of the first batch at or past each mark, after its updates): the deterministic policy
  (ExplorationType.DETERMINISTIC) for 200 steps on 4 envs re-seeded with 1000 each time (the
  same episodes every time), mean of the 4 episode returns.  Seeds: torch.manual_seed(0),
  env.set_seed(0).  Wall time covers everything from building the env to the successful
  evaluation.  Env wrapper: GymWrapper over one in-process gymnasium SyncVectorEnv of 4
  Pendulum-v1 with autoreset_mode=DISABLED (TorchRL's preferred mode; TorchRL resets the done
  sub-envs).  Measured on a random policy (StepCounter + RewardSum) it steps about 2-2.5x as fast
  as SerialEnv(4, GymEnv) and about 4x as fast as GymEnv(num_envs=4) (a subprocess
  AsyncVectorEnv); ParallelEnv(4, GymEnv) was slower still on a two-core machine.
"""
import os, subprocess, sys, sysconfig, time, warnings
warnings.filterwarnings("ignore")
os.environ.setdefault("RL_WARNINGS", "0")
os.environ.setdefault("TORCHRL_CONSOLE_STREAM", "stderr")  # TorchRL's INFO log is on stdout by default
import torch
torch.set_num_threads(1)
import gymnasium as gym
import torchrl
from tensordict import TensorDict
from tensordict.nn import NormalParamExtractor, TensorDictModule
from torchrl.collectors import Collector
from torchrl.data import (Bounded, LazyTensorStorage, OneHot, ReplayBuffer, RandomSampler,
                          TensorDictPrioritizedReplayBuffer)
from torchrl.envs import Compose, ExplorationType, RewardSum, StepCounter, TransformedEnv, set_exploration_type
from torchrl.envs.libs.gym import GymWrapper
from torchrl.modules import MLP, ProbabilisticActor, QValueActor, TanhNormal, ValueOperator
from torchrl.objectives import DQNLoss, SACLoss, SoftUpdate


def best_of(fn, repeat=3):
    fn()  # one untimed warm-up repetition
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter(); fn(); best = min(best, time.perf_counter() - t0)
    return best


def log(*args):
    print(*args, file=sys.stderr, flush=True)


def transitions(n, obs_dim, action):
    """n random transitions: observation, action, and next/{observation, reward, done, terminated}."""
    term = torch.rand(n, 1) < 0.05
    nxt = TensorDict(observation=torch.randn(n, obs_dim), reward=torch.randn(n, 1),
                     done=term.clone(), terminated=term, batch_size=[n])
    return TensorDict(observation=torch.randn(n, obs_dim), action=action, next=nxt, batch_size=[n])


def sac_modules(hidden, spec):
    """TanhNormal actor and Q-network as in TorchRL's sota-implementations/sac."""
    low, high = spec.space.low, spec.space.high
    net = torch.nn.Sequential(MLP(in_features=3, out_features=2, num_cells=[hidden, hidden]),
                              NormalParamExtractor())
    actor = ProbabilisticActor(TensorDictModule(net, in_keys=["observation"], out_keys=["loc", "scale"]),
                               in_keys=["loc", "scale"], spec=spec, distribution_class=TanhNormal,
                               distribution_kwargs={"low": low, "high": high}, return_log_prob=False)
    qvalue = ValueOperator(MLP(in_features=4, out_features=1, num_cells=[hidden, hidden]),
                           in_keys=["observation", "action"])
    return actor, qvalue


def sac_update(loss, opt, updater, td):
    out = loss(td)
    total = out["loss_actor"] + out["loss_qvalue"] + out["loss_alpha"]
    opt.zero_grad()
    total.backward()
    opt.step()
    updater.step()


def w24():
    torch.manual_seed(0)
    actor, qvalue = sac_modules(256, Bounded(-2.0, 2.0, shape=(1,)))
    loss = SACLoss(actor, qvalue)  # num_qvalue_nets=2, loss_function="smooth_l1", alpha_init=1.0
    loss.make_value_estimator(gamma=0.99)  # TD(0)
    opt = torch.optim.Adam(loss.parameters(), lr=3e-4)
    updater = SoftUpdate(loss, tau=0.005)
    td = transitions(256, 3, torch.rand(256, 1) * 4 - 2)
    return 200 / best_of(lambda: [sac_update(loss, opt, updater, td) for _ in range(200)])


def w25():
    torch.manual_seed(0)
    qnet = QValueActor(MLP(in_features=4, out_features=2, num_cells=[256, 256]),
                       in_keys=["observation"], spec=OneHot(2))
    loss = DQNLoss(qnet, action_space="one-hot", delay_value=True, double_dqn=False)  # "l2"
    loss.make_value_estimator(gamma=0.99)  # TD(0)
    opt = torch.optim.Adam(loss.parameters(), lr=3e-4)
    updater = SoftUpdate(loss, tau=0.005)
    td = transitions(256, 4, OneHot(2).rand((256,)))

    def update():
        out = loss(td)
        opt.zero_grad()
        out["loss"].backward()
        opt.step()
        updater.step()
    return 500 / best_of(lambda: [update() for _ in range(500)])


def segment_trees():
    """TorchRL's C++ segment trees for PrioritizedSampler.  The 0.14.1 wheel's torchrl._torchrl
    was built against another torch and does not load on torch 2.13 (undefined symbol
    torch::autograd::_wrap_outputs), so PrioritizedSampler refuses to start ("SumSegmentTreeFp32
    is not available").  The wheel ships its sources (torchrl/csrc), so compile segment_tree.h,
    unchanged, against the installed torch with -O3 (once; cached under ~/.cache/torchrl-rs), and
    hand its four classes to the sampler module: all of TorchRL's Python buffer code runs as is."""
    import importlib.util
    import torchrl.data.replay_buffers.samplers.prioritized as prio
    if prio.SumSegmentTreeFp32 is not None:
        return "TorchRL's own extension"
    from torch.utils import cpp_extension
    out = os.path.expanduser(f"~/.cache/torchrl-rs/segment_trees-torch{torch.__version__}-torchrl{torchrl.__version__}")
    so = os.path.join(out, "_torchrl_trees" + sysconfig.get_config_var("EXT_SUFFIX"))
    if not os.path.exists(so):
        os.makedirs(out, exist_ok=True)
        cpp = os.path.join(out, "trees.cpp")
        with open(cpp, "w") as f:  # pybind.cpp's tree part, without the CUDA trees and safetanh
            f.write('#include "segment_tree.h"\nPYBIND11_MODULE(_torchrl_trees, m) {\n'
                    '  torchrl::DefineSumSegmentTree<float>("Fp32", m);\n'
                    '  torchrl::DefineSumSegmentTree<double>("Fp64", m);\n'
                    '  torchrl::DefineMinSegmentTree<float>("Fp32", m);\n'
                    '  torchrl::DefineMinSegmentTree<double>("Fp64", m);\n}\n')
        libs = cpp_extension.library_paths()
        cmd = (["g++", "-O3", "-shared", "-fPIC", "-std=c++20", cpp,
                "-D_GLIBCXX_USE_CXX11_ABI=%d" % int(torch._C._GLIBCXX_USE_CXX11_ABI),
                "-I" + os.path.join(os.path.dirname(torchrl.__file__), "csrc"),
                "-I" + sysconfig.get_paths()["include"]]
               + ["-I" + p for p in cpp_extension.include_paths()] + ["-L" + p for p in libs]
               + ["-Wl,-rpath," + p for p in libs]
               + ["-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python", "-o", so + ".tmp"])
        log("W26: compiling TorchRL's segment_tree.h against torch", torch.__version__, "(about a minute)")
        built = subprocess.run(cmd, capture_output=True, text=True)
        if built.returncode != 0:
            log(built.stderr[-4000:])
            raise RuntimeError("W26: could not compile TorchRL's segment trees (needs g++)")
        os.replace(so + ".tmp", so)
    spec = importlib.util.spec_from_file_location("_torchrl_trees", so)
    ext = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ext)
    for name in ("SumSegmentTreeFp32", "MinSegmentTreeFp32", "SumSegmentTreeFp64", "MinSegmentTreeFp64"):
        setattr(prio, name, getattr(ext, name))
    return "TorchRL's segment_tree.h rebuilt for this torch"


def w26():
    source = segment_trees()
    torch.manual_seed(0)
    rb = TensorDictPrioritizedReplayBuffer(alpha=0.7, beta=0.5, storage=LazyTensorStorage(1_000_000),
                                           batch_size=256, priority_key="td_error")
    chunks = [transitions(10_000, 3, torch.rand(10_000, 1) * 4 - 2) for _ in range(100)]
    t0 = time.perf_counter()
    for chunk in chunks:
        rb.extend(chunk)
    fill = time.perf_counter() - t0
    assert len(rb) == 1_000_000
    del chunks
    new = transitions(256, 3, torch.rand(256, 1) * 4 - 2)

    def op():
        rb.extend(new)
        sample = rb.sample()
        sample.set("td_error", torch.rand(256))
        rb.update_tensordict_priority(sample)
    rate = 1000 / best_of(lambda: [op() for _ in range(1000)])
    return 1_000_000 / fill, rate, source


def pendulum_envs(seed):
    """4 gymnasium Pendulum-v1 in one in-process SyncVectorEnv (TorchRL resets done sub-envs)."""
    vec = gym.vector.SyncVectorEnv([lambda: gym.make("Pendulum-v1")] * 4,
                                   autoreset_mode=gym.vector.AutoresetMode.DISABLED)
    env = TransformedEnv(GymWrapper(vec), Compose(StepCounter(max_steps=200), RewardSum()))
    env.set_seed(seed)
    return env


def w27(max_frames=30_000):
    t0 = time.perf_counter()
    torch.manual_seed(0)
    env = pendulum_envs(0)
    eval_env = pendulum_envs(1000)
    actor, qvalue = sac_modules(64, env.action_spec_unbatched)
    loss = SACLoss(actor, qvalue)
    loss.make_value_estimator(gamma=0.99)
    opt = torch.optim.Adam(loss.parameters(), lr=3e-3)
    updater = SoftUpdate(loss, tau=0.02)
    rb = ReplayBuffer(storage=LazyTensorStorage(100_000), sampler=RandomSampler(), batch_size=128)
    collector = Collector(env, actor, frames_per_batch=64, total_frames=-1,
                          exploration_type=ExplorationType.RANDOM)

    def evaluate():
        eval_env.set_seed(1000)  # the same 4 episodes every time
        with set_exploration_type(ExplorationType.DETERMINISTIC), torch.no_grad():
            traj = eval_env.rollout(200, actor, break_when_any_done=False)
        return traj["next", "episode_reward"][:, -1].mean().item()

    frames, next_eval, ret = 0, 2_000, float("nan")
    for batch in collector:
        frames += batch.numel()
        rb.extend(batch.reshape(-1))
        if len(rb) >= 1_000:
            for _ in range(64):
                sac_update(loss, opt, updater, rb.sample())
        if frames >= next_eval:
            next_eval += 1_000
            ret = evaluate()
            log(f"W27: {frames} frames, {time.perf_counter() - t0:.1f} s, deterministic return {ret:.1f}")
            if ret >= -200:
                break
        if frames >= max_frames:
            break
    seconds = time.perf_counter() - t0
    collector.shutdown()
    return seconds, frames, ret, ret >= -200


if __name__ == "__main__":
    wanted = sys.argv[1:] or ["W24", "W25", "W26", "W27"]
    if "W24" in wanted:
        print(f"W24_sac_update\t{w24():.1f}", flush=True)
    if "W25" in wanted:
        print(f"W25_dqn_update\t{w25():.1f}", flush=True)
    if "W26" in wanted:
        fill, rate, source = w26()
        print(f"W26_fill_1m\t{fill:.1f}\t# 100 extends of 10,000", flush=True)
        print(f"W26_prioritized_replay_1m\t{rate:.1f}\t# {source}", flush=True)
    if "W27" in wanted:
        seconds, frames, ret, ok = w27()
        log(f"W27: {'reached' if ok else 'FAILED to reach'} -200: {seconds:.1f} s, {frames} frames, return {ret:.1f}")
        value = 1 / seconds if ok else 0.0
        status = "" if ok else "FAILED, "
        print(f"W27_sac_pendulum_to_m200\t{value:.4f}\t# {status}{seconds:.1f} s, {frames} frames, "
              f"return {ret:.1f}", flush=True)
